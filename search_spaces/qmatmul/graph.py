"""How a Linear (+ ReLU) layer appears in a captured graph, and the rule that runs it in int8.

`aten.linear(x, w, b)` with w a float32 (N, K) parameter, and a following `aten.relu` when that is the linear's
only user, becomes `q, s = torch.ops.autotune.quantize_rows(x, qmax)` (activations quantized per row in a tuned
kernel, not in eager ops) then `torch.ops.autotune.qmatmul(q, wq, s, w_scale, b, relu, a_bits)`; wq and w_scale
are quantized per output channel once, as `QuantLinear.from_float` does, and registered on the GraphModule.

Activations use 7 bits (qmax 63) on CPUs without AVX-512 VNNI, as FBGEMM's `reduce_range` does there: the AVX2
u8 x s8 instruction sums pairs in int16 and is exact only on 7-bit activations, and it does twice the products
per instruction of the exact 8-bit path. Elsewhere (VNNI, GPUs) they use all 8.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, Iterator

import torch

from .._graph import (attr, has_op, insertion_point, is_call, register, scalar_arg, sole_user, tensor_value, where,
                      workload_error)
from ..template import GraphMatch, GraphRule, Kept
from .torch_op import quantize_rows
from .workload import Workload, a_range

__all__ = ["MIN_IN_FEATURES", "MIN_OUT_FEATURES", "RULES"]

aten = torch.ops.aten
RULE = "qmatmul"
RELUS = (aten.relu.default, aten.relu_.default)
# Below these, int8 gains nothing: the layer is a few FLOPs per row (DLRM's 13-feature input layer, its 1-wide
# output layer) and per-row quantization plus a second kernel launch cost more than the fp32 GEMM saves; int8 on
# so few inputs (or outputs) also loses more accuracy relative to the work done.
MIN_IN_FEATURES = 32
MIN_OUT_FEATURES = 8
# int8 error, relative to the output's range: each product carries rounding errors of up to 1/254 of its row's
# (activation) and its channel's (weight) max |value|; they are independent, so over K products they add up to
# about sqrt(K) / 254 of max|x| max|w|, a percent or so of max |y| for DLRM-sized layers. 5% of max |y| passes
# that and refuses a layer computed wrongly (another weight, a missing bias or ReLU moves outputs by far more).
RANGE_TOLERANCE = 0.05


def _why_not(k: int, n: int) -> str:
    if k < MIN_IN_FEATURES:
        return f"in_features {k} < {MIN_IN_FEATURES}: too few products per output for int8 to pay off; stays fp32"
    if n < MIN_OUT_FEATURES:
        return f"out_features {n} < {MIN_OUT_FEATURES}: too few outputs for int8 to pay off; stays fp32"
    return ""


@functools.cache
def _host_has_avx512_vnni() -> bool:
    """Whether this machine's CPU has AVX-512 VNNI (Linux's /proc/cpuinfo flags; False where unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return "avx512_vnni" in flags and "avx512bw" in flags


def activation_bits(device: torch.device) -> int:
    """The activation bits of int8 layers run on `device`: 7 on a CPU without VNNI (see the module doc), else 8."""
    return 7 if device.type == "cpu" and not _host_has_avx512_vnni() else 8


def _replace(linear: Any, relu: Any, out: Any, a_bits: int) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        x, w, b = linear.args[0], linear.args[1], scalar_arg(linear, 2, "bias", None)
        wq, w_scale = quantize_rows(attr(gm, w.target).detach().float())  # per output channel, once
        with gm.graph.inserting_before(insertion_point(gm, [x, b], [out])):
            wq_node = register(gm, "autotune_qweight", wq.contiguous())
            scale_node = register(gm, "autotune_qweight_scale", w_scale.contiguous())
            qs = gm.graph.call_function(torch.ops.autotune.quantize_rows.default, (x, a_range(a_bits)[1]))
            q = gm.graph.call_function(operator.getitem, (qs, 0))
            s = gm.graph.call_function(operator.getitem, (qs, 1))
            new = gm.graph.call_function(torch.ops.autotune.qmatmul.default,
                                         (q, wq_node, s, scale_node, b, relu is not None, a_bits))
        for node in (wq_node, scale_node, qs, q, s, new):
            node.meta["nn_module_stack"] = linear.meta.get("nn_module_stack", {})
        return (new,)

    return replace


def _site(gm: Any, values: dict[str, Any], linear: Any, claimed: set[Any]) -> tuple[Any, ...] | str | None:
    """(relu or None, output node, batch, k, n, bias) of a linear the rule can run, why not, or None."""
    x, w, b = linear.args[0], linear.args[1], scalar_arg(linear, 2, "bias", None)
    weight = attr(gm, w.target) if getattr(w, "op", None) == "get_attr" else None
    if not isinstance(weight, torch.Tensor):
        return None  # a weight computed in the graph: no layer of the model's parameters
    if weight.dtype != torch.float32 or weight.dim() != 2:
        return f"its weight is {weight.dtype} of shape {tuple(weight.shape)}: int8 layers quantize 2-D float32"
    bias = attr(gm, b.target) if getattr(b, "op", None) == "get_attr" else None
    if b is not None and not (isinstance(bias, torch.Tensor) and bias.dtype == torch.float32):
        return "its bias is not a float32 parameter"
    n, k = weight.shape
    why = _why_not(k, n)
    if why:
        return why
    xv = tensor_value(gm, values, x)
    if not isinstance(xv, torch.Tensor) or xv.dim() != 2 or xv.dtype != torch.float32:
        shape = tuple(xv.shape) if isinstance(xv, torch.Tensor) else "unknown"
        return f"its input is of shape {shape}: int8 layers take 2-D (batch, features) float32"
    if not xv.is_contiguous():
        return "its input is strided (not contiguous): the quantize kernel reads rows in place"
    relu = sole_user(linear, *RELUS)
    if relu is not None and relu in claimed:
        relu = None
    return relu, relu or linear, xv.shape[0], k, n, b is not None, activation_bits(xv.device)


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """Every Linear(+ReLU) on float32 parameters, in graph order."""
    for linear in [n for n in gm.graph.nodes if is_call(n, aten.linear.default) and n not in claimed]:
        site = _site(gm, values, linear, claimed)
        if site is None:
            continue
        nodes = [linear]
        if isinstance(site, str):
            yield Kept(RULE, where(nodes), site)
            continue
        relu, out, m, k, n, bias, a_bits = site
        nodes += [relu] if relu is not None else []
        missing = [op for op in ("quantize_rows", "qmatmul") if not has_op(op)]
        if missing:
            yield Kept(RULE, where(nodes), f"torch.ops.autotune.{missing[0]} is not registered (import autotune.torch)")
            continue
        fields = dict(m=m, k=k, n=n, mode="int8", bias=bias, relu=relu is not None, a_bits=a_bits)
        why = workload_error(Workload, fields)
        if why:
            yield Kept(RULE, where(nodes), why)
            continue
        ref = tensor_value(gm, values, out)
        scale = float(ref.abs().max()) if isinstance(ref, torch.Tensor) and ref.numel() else 1.0
        yield GraphMatch(
            rule=RULE, nodes=tuple(nodes), outputs=(out,),
            tasks=((RULE, fields), ("quantize_rows", dict(rows=m, cols=k, qmax=a_range(a_bits)[1]))),
            replace=_replace(linear, relu, out, a_bits), tolerance=(0.0, RANGE_TOLERANCE * scale + 1e-6),
            where=where(nodes),
            what=f"Linear({k}, {n}){' + ReLU' if relu is not None else ''} -> quantize_rows + int8 qmatmul"
                 f"{' (7-bit activations)' if a_bits == 7 else ''}"
                 f"{' (ReLU fused)' if relu is not None else ''}")


RULES = (GraphRule(RULE, find, priority=40, quantizes=True),)
