"""A model as torch.export captures it: an fx.GraphModule of ATen ops the graph rules read and rewrite.

Parameters become get_attr nodes sharing the model's tensors, and dim 0 of every input is dynamic (the batch, the
number of indices), so the rewritten GraphModule runs at any batch size, under torch.compile(fullgraph=True)
and inference_mode.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

__all__ = ["CaptureError", "as_args", "capture", "flat_inputs", "module_path"]


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
        ep = torch.export.export(model, args, dynamic_shapes=_dynamic(args))
    except Exception as err:  # noqa: BLE001 -- any export failure: say so, keep the cause
        raise CaptureError(f"torch.export could not capture {type(model).__name__}: {type(err).__name__}: "
                           f"{str(err).splitlines()[0] if str(err) else ''}") from err
    return ep.module()  # type: ignore[return-value]


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
