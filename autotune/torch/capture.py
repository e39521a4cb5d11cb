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
    (a feature width, a table's dim), which the graph may bake in."""
    from torch.export import Dim

    return pytree.tree_map(lambda v: {0: Dim.AUTO} if isinstance(v, torch.Tensor) and v.dim() else None, args)


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
