"""How tune_model finds split_linear in a captured graph: every float32 Linear (+ the ReLU that is its only user)
on a 2-D CPU input, on CPUs with AMX-BF16 (elsewhere its float32 FMAs do not beat oneDNN: not offered), of at
least a tile's 16 outputs and MIN_WORK multiply-adds on the example (below that the split and the tiles' setup
cost more than the products: DLRM's 256 -> 1 head took 0.13 ms against PyTorch's 0.05).

A Linear (no ReLU) followed by DCNv2's cross tail `x0 * (y + b) + x` (TorchRec's LowRankCrossNet, MLPerf's
DLRMv2; search_spaces/_cross_tail.py) runs as split_linear_cross, the tail in its epilogue.

The rule runs before `dense_linear` (oneDNN, autotune/torch/dense.py) and takes the same sites: it declares
them fused (`GraphRule.fuses`), so tune_model tunes it and keeps its replacements only where the whole model
runs faster with them than with oneDNN's at those sites.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from .._cross_tail import CrossTail, cross_tail, tail_bias
from .._graph import host_cpu_flags, insertion_point, is_call, scalar_arg, sole_user, tensor_value, where
from ..template import GraphMatch, GraphRule

__all__ = ["RULES"]

aten = torch.ops.aten
RULE = "split_linear"
CROSS = "split_linear_cross"
RELUS = (aten.relu.default, aten.relu_.default)
# float32 results of another summation order, as dense_linear's: a few ulps of the output's range per product
RTOL, RANGE_ATOL = 1e-4, 1e-5
MIN_OUTPUTS, MIN_WORK = 16, 1 << 22  # out_features; M x K x N on the example


def _replace(linear: Any, relu: Any) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        x, w, b = linear.args[0], linear.args[1], scalar_arg(linear, 2, "bias", None)
        with gm.graph.inserting_before(insertion_point(gm, [x, w, b], [relu or linear])):
            x = gm.graph.call_function(aten.contiguous.default, (x,))  # the kernels read rows; Linear took any x
            new = gm.graph.call_function(torch.ops.autotune.split_linear.default, (x, w, b, relu is not None))
        for node in (x, new):
            node.meta["nn_module_stack"] = linear.meta.get("nn_module_stack", {})
        return (new,)

    return replace


def _replace_cross(linear: Any, tail: CrossTail) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        x, w, b = linear.args[0], linear.args[1], scalar_arg(linear, 2, "bias", None)
        reads = [r for r in (x, w, b, tail.bias, tail.x0, tail.x) if r is not None]
        with gm.graph.inserting_before(insertion_point(gm, reads, [tail.out])):
            x = gm.graph.call_function(aten.contiguous.default, (x,))
            new = gm.graph.call_function(torch.ops.autotune.split_linear_cross.default,
                                         (x, w, tail_bias(gm, b, tail), tail.x0, tail.x))
        for node in (x, new):
            node.meta["nn_module_stack"] = linear.meta.get("nn_module_stack", {})
        return (new,)

    return replace


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch]:
    """Each float32 Linear (+ ReLU) on a 2-D CPU input that earlier rules left, in graph order; layers of other
    dtypes, devices or ranks are not this rule's to refuse: skipped without a word."""
    if "amx_bf16" not in host_cpu_flags():
        return
    for linear in [n for n in gm.graph.nodes if is_call(n, aten.linear.default) and n not in claimed]:
        x, w = linear.args[0], linear.args[1]
        b = scalar_arg(linear, 2, "bias", None)
        xv, weight, bias = (tensor_value(gm, values, n) for n in (x, w, b))
        if not (isinstance(xv, torch.Tensor) and isinstance(weight, torch.Tensor) and xv.dim() == 2
                and weight.dim() == 2 and xv.dtype == weight.dtype == torch.float32 and xv.is_cpu
                and weight.is_cpu and (b is None or (isinstance(bias, torch.Tensor)
                                                     and bias.dtype == torch.float32))):
            continue
        (n, k), m = weight.shape, xv.shape[0]
        if n < MIN_OUTPUTS or m * k * n < MIN_WORK:
            continue
        relu = sole_user(linear, *RELUS)
        relu = None if relu in claimed else relu
        tail = cross_tail(gm, values, linear, (m, n)) if relu is None else None
        if tail is not None and not any(node in claimed for node in tail.nodes):
            yield _cross_match(gm, values, linear, tail, {"m": m, "k": k, "n": n,
                                                          "bias": b is not None or tail.bias is not None})
            continue
        nodes = (linear,) if relu is None else (linear, relu)
        fields = {"m": m, "k": k, "n": n, "bias": b is not None, "relu": relu is not None}
        yield GraphMatch(
            rule=RULE, nodes=nodes, outputs=(relu or linear,), tasks=((RULE, fields),),
            replace=_replace(linear, relu), tolerance=_tolerance(gm, values, relu or linear), where=where(nodes),
            what=f"Linear({k}, {n}){' + ReLU' if relu is not None else ''} -> split_linear (float32 from bf16 "
                 "pieces on AMX tiles)")


def _tolerance(gm: Any, values: dict[str, Any], out: Any) -> tuple[float, float]:
    """(rtol, atol) of the check by numbers: atol a few ulps of the output's range on the example."""
    ref = tensor_value(gm, values, out)
    scale = float(ref.abs().max()) if isinstance(ref, torch.Tensor) and ref.numel() else 1.0
    return RTOL, RANGE_ATOL * scale + 1e-6


def _cross_match(gm: Any, values: dict[str, Any], linear: Any, tail: CrossTail, fields: dict[str, Any]) -> GraphMatch:
    """The Linear and the cross tail after it as one split_linear_cross."""
    nodes = (linear, *tail.nodes)
    return GraphMatch(
        rule=RULE, nodes=nodes, outputs=(tail.out,), tasks=((CROSS, fields),), replace=_replace_cross(linear, tail),
        tolerance=_tolerance(gm, values, tail.out), where=where(nodes),
        what=f"Linear({fields['k']}, {fields['n']}) + DCNv2's cross tail -> split_linear_cross (float32 from bf16 "
             "pieces on AMX tiles, the tail in its epilogue)")


RULES = (GraphRule(RULE, find, fuses=("dense_linear",)),)
