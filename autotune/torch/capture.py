"""A model as torch.export captures it: an fx.GraphModule of ATen ops the graph rules read and rewrite.

Parameters become get_attr nodes sharing the model's tensors, and dim 0 of every input is dynamic (the batch, the
number of indices), so the rewritten GraphModule runs at any batch size, under torch.compile(fullgraph=True)
and inference_mode. Inputs may be pytrees of TorchRec's (a KeyedJaggedTensor): the rewritten model takes them as
the model does. What exporters emit around the operators and computes nothing is taken out (`simplify`), so
the rules see a TorchRec model's bags, interaction and Linears as they see a plain PyTorch model's.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import operator
from typing import Any, Iterator

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

__all__ = ["CaptureError", "as_args", "capture", "flat_inputs", "module_path", "simplify"]


class CaptureError(RuntimeError):
    """torch.export could not capture a model that runs eagerly on the example inputs."""


def as_args(example_inputs: Any) -> tuple[Any, ...]:
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def _dynamic(args: tuple[Any, ...]) -> Any:
    """Dim 0 of every tensor dynamic (batch, number of indices, offsets): the other dims are the model's sizes
    (a feature width, a table's dim), which the graph may bake in. Built-in containers keep their structure; a
    class registered with pytree (TorchRec's KeyedJaggedTensor, KeyedTensor, JaggedTensor) is given as the list
    of its flattened children, as torch.export matches it (a KJT's values, lengths and offsets each dynamic)."""
    from torch.export import Dim

    def spec(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return {0: Dim.AUTO} if v.dim() else None
        node = pytree.SUPPORTED_NODES.get(pytree._get_node_type(v))
        if node is None:
            return None
        children, context = node.flatten_fn(v)
        inner = [spec(c) for c in children]
        if pytree._get_node_type(v) in pytree.BUILTIN_TYPES:
            return node.unflatten_fn(inner, context)
        return inner

    return tuple(spec(a) for a in args)


def capture(model: torch.nn.Module, example_inputs: Any) -> fx.GraphModule:
    """The model as an fx.GraphModule of ATen ops (torch.export, then `ep.module()`), dim 0 of every input
    dynamic. The model runs eagerly first, so inputs it rejects raise the model's own error."""
    args = as_args(example_inputs)
    with torch.no_grad():
        model(*args)  # the model's own error for bad inputs, not an export trace of it
    try:
        with _quiet_about_kjt():
            ep = torch.export.export(model, args, dynamic_shapes=_dynamic(args))
    except Exception as err:  # noqa: BLE001 -- any export failure: say so, keep the cause
        raise CaptureError(f"torch.export could not capture {type(model).__name__}: {type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}") from err
    gm = ep.module()
    simplify(gm)
    return gm  # type: ignore[return-value]


_HOOKS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks", "_forward_hooks_with_kwargs",
          "_forward_hooks_always_called")


def copy_captured(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of a captured model to rewrite in place: its own graph and attributes, the model's tensors shared
    (not copied), and what `ep.module()` set beside the graph (its input checks, as forward hooks, and the
    attributes they read): milliseconds, where capturing again (torch.export) takes seconds."""
    memo: dict[int, Any] = {id(v): v for m in gm.modules()
                            for v in (*m._parameters.values(), *m._buffers.values(), *vars(m).values())
                            if isinstance(v, torch.Tensor)}
    out = copy.deepcopy(gm, memo)
    for name, value in gm.__dict__.items():
        out.__dict__.setdefault(name, value)
    for name in _HOOKS:
        setattr(out, name, copy.copy(getattr(gm, name)))
    return out


@contextlib.contextmanager
def _quiet_about_kjt() -> Iterator[None]:
    """TorchRec logs, on the root logger, that a KJT's `to_dict` is slow to export non-strict, once per feature
    lookup it traces: true of the capture, which runs a few times per tune_model call, and nothing a user of the
    rewritten model pays; so not said dozens of times."""
    quiet = _DropMessage("non-strict torch.export KJT to_dict")
    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


class _DropMessage(logging.Filter):
    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def simplify(gm: fx.GraphModule) -> None:
    """Take out, in place, what computes nothing: metadata asserts (`aten._assert_tensor_metadata`), casts to
    the dtype and device a tensor already has (`aten.to`, which then returns its input), and a split of a cat
    along the same dim at the cat's own sizes (TorchRec's KeyedTensor: the pooled embeddings cat'ed, then split
    again by key), slices of a whole dim, and a cat of a tensor's row blocks in their order (`cat([select(v, 1, k)
    for k in range(T)], 1)` of v (B, T, D): what the table-batched launch's per-table outputs become in TorchRec's
    KeyedTensor) by v reshaped to (B, T*D); the values are the model's, bit for bit. Run on every capture, and
    again after each rule that rewrote something (graph.rewrite)."""
    graph = gm.graph
    for n in list(graph.nodes):
        if n.op != "call_function":
            continue
        if n.target is torch.ops.aten._assert_tensor_metadata.default:
            graph.erase_node(n)
        elif _same_tensor_cast(n):
            n.replace_all_uses_with(n.args[0])
        elif _whole_slice(n):
            n.replace_all_uses_with(n.args[0])
        elif not _rejoined(n):  # (which replaces n itself where it applies)
            parts = _split_of_cat(n)
            if parts is not None:
                for user in list(n.users):
                    user.replace_all_uses_with(parts[user.args[1]])
    graph.eliminate_dead_code(is_impure_node=lambda n: n.op == "call_module" or n.is_impure())
    gm.recompile()


_CASTS = ("to.dtype", "to.dtype_layout", "to.device")


def _val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _same_tensor_cast(n: fx.Node) -> bool:
    """`aten.to` whose output has its input's dtype, device and shape (no copy asked): the input itself."""
    name = getattr(n.target, "_overloadpacket", None)
    if name is not torch.ops.aten.to or f"to.{n.target._overloadname}" not in _CASTS or n.kwargs.get("copy"):
        return False
    if any(a is True for a in n.args[2:]):  # a positional non_blocking/copy
        return False
    src, out = _val(n.args[0]), _val(n)
    return (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.dtype == out.dtype
            and src.device == out.device and n.kwargs.get("memory_format") in (None, torch.preserve_format))


def _split_of_cat(n: fx.Node) -> list[Any] | None:
    """The cat's inputs where `n` splits a cat along its dim into exactly those pieces, every user a getitem."""
    aten = torch.ops.aten
    if n.target not in (aten.split_with_sizes.default, aten.split.Tensor):
        return None
    src = n.args[0]
    if not isinstance(src, fx.Node) or src.target is not aten.cat.default:
        return None
    pieces, val = list(src.args[0]), _val(src)
    if not isinstance(val, torch.Tensor) or not all(isinstance(_val(p), torch.Tensor) for p in pieces):
        return None
    ndim = val.dim()
    cat_dim = (src.args[1] if len(src.args) > 1 else src.kwargs.get("dim", 0)) % ndim
    split_dim = (n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)) % ndim
    sizes = [p.meta["val"].shape[cat_dim] for p in pieces]
    if cat_dim != split_dim or not all(isinstance(s, int) for s in sizes):
        return None
    asked = n.args[1]
    if n.target is aten.split.Tensor:
        if not isinstance(asked, int) or asked <= 0:
            return None
        total = sum(sizes)
        asked = [min(asked, total - i) for i in range(0, total, asked)]
    if list(asked) != sizes:
        return None
    if not all(u.target is operator.getitem and isinstance(u.args[1], int) for u in n.users):
        return None
    return pieces


def _whole_slice(n: fx.Node) -> bool:
    """`aten.slice(x, dim, start, end, step)` of a whole dim, step 1 (`x[:, k]` exports one before its select):
    x itself."""
    if n.target is not torch.ops.aten.slice.Tensor or n.kwargs:
        return False
    src, dim, start, end, step = (*n.args, *(0, None, None, 1)[len(n.args) - 1:])  # defaults for those left out
    val = _val(src)
    if not isinstance(val, torch.Tensor) or not isinstance(dim, int) or start not in (0, None) or step != 1:
        return False
    size = val.shape[dim]
    return end is None or (isinstance(end, int) and (end >= 2 ** 62 or (isinstance(size, int) and end >= size)))


def _rejoined(n: fx.Node) -> bool:
    """Replace `n` by `reshape(v, [-1, T*D])` where it is `cat([select(v, 1, 0), ..., select(v, 1, T - 1)], 1)`
    over v = view(x, [..., T, D]): the blocks of v's rows put back in their order, the same values (a view where
    v's rows are contiguous, no copy). Reads the view's own shape argument: nodes a rule added carry no meta."""
    aten = torch.ops.aten
    if n.target is not aten.cat.default or (n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)) != 1:
        return False
    pieces = list(n.args[0])
    v = pieces[0].args[0] if pieces and isinstance(pieces[0], fx.Node) and pieces[0].args else None
    if not isinstance(v, fx.Node) or v.target is not aten.view.default or len(v.args) < 2:
        return False
    shape = list(v.args[1])
    if len(shape) != 3 or not all(isinstance(s, int) and not isinstance(s, bool) for s in shape[1:]):
        return False
    t, d = shape[1], shape[2]
    if t != len(pieces) or any(not (isinstance(p, fx.Node) and p.target is aten.select.int and p.args == (v, 1, k))
                               for k, p in enumerate(pieces)):
        return False
    with n.graph.inserting_before(n):
        whole = n.graph.call_function(aten.reshape.default, (v, [-1, t * d]))
    whole.meta.update({k: n.meta[k] for k in ("val", "nn_module_stack") if k in n.meta})
    n.replace_all_uses_with(whole)
    return True


def flat_inputs(gm: fx.GraphModule, example_inputs: Any) -> list[Any]:
    """The graph's placeholder values: the example inputs flattened as export's in_spec flattens them."""
    return pytree.tree_leaves((as_args(example_inputs), {}))


def module_path(node: fx.Node) -> str:
    """The model's module a node came from ("bottom.0"), "" for the top-level forward."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in reversed(list(stack.values())):
        path = str(path)
        if not path.startswith("_empty"):
            return path.removeprefix("L['self'].")
    return ""
