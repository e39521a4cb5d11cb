"""Float32 Linear (+ ReLU) layers on oneDNN: what tune_model runs the layers it does not quantize on, on CPUs.

PyTorch's CPU Linear is MKL's sgemm, then a separate pass for the ReLU. On AMD CPUs MKL takes a generic code
path; oneDNN, which PyTorch bundles as mkldnn, JIT-compiles its GEMM for the CPU's ISA and applies the ReLU as
it writes the result (a post-op), as IPEX's optimized Linear does. This is not a tuned kernel of ours but a
library's: the rule is kept at a site only where it reproduces the layer (fp32, to summation order) and beats
it there in tune_model's speed check, so where MKL is the faster it stays.

`torch.ops.autotune.dense_linear(x, weight, bias, relu)` wraps `torch.ops.mkldnn._linear_pointwise` (the op
inductor's CPU freezing passes emit) in a custom op with a fake implementation and a backward: inductor lowers
`_linear_pointwise` only on weights it packed itself, so the wrapper keeps `torch.compile` of a rewritten model
working, and the layer keeps training. Off the CPU, or without oneDNN, the op is F.linear (+ ReLU).

The bf16 rung of tune_model's precision ladder is here too: `dense_linear_bf16` runs a Linear (+ ReLU) on
oneDNN with bf16 inputs and weights (converted once), float32 accumulation and bias, a bf16 result read back
as float32: on CPUs with native bf16 dot products (AVX512-BF16, AMX) a layer that int8 cannot hold to the
accuracy contract keeps most of its speed. It is a quantizing rule (`precision="bf16"`): tune_model tries it
only on layers whose int8 breaks the contract, or that no int8 rule takes, and only where the CPU has the
instructions (elsewhere oneDNN would emulate them, slower than fp32).
"""

from __future__ import annotations

import functools
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from search_spaces._graph import (attr, host_cpu_flags, insertion_point, is_call, register, scalar_arg, sole_user,
                                  tensor_value, where)
from search_spaces._linear_grad import linear_grads, save_linear
from search_spaces.template import GraphMatch, GraphRule, Reduced

__all__ = ["RULES", "available", "dense_linear", "dense_linear_bf16", "native_bf16"]

aten = torch.ops.aten
RULE = "dense_linear"
RULE_BF16 = "dense_linear_bf16"
RULE_CHAIN = "dense_linear_bf16_chain"
RELUS = (aten.relu.default, aten.relu_.default)
# fp32 results of another summation order: within a few ulps of the output's range per product summed
RTOL, RANGE_ATOL = 1e-4, 1e-5


def available() -> bool:
    """Whether this PyTorch build has oneDNN's fused linear (CPU builds for x86 and Arm have)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@torch.library.custom_op("autotune::dense_linear", mutates_args=())
def dense_linear(x: Tensor, weight: Tensor, bias: Optional[Tensor], relu: bool) -> Tensor:
    """relu?(x @ weight.T + bias) for x of shape (..., K), weight (N, K): oneDNN's GEMM with the ReLU fused on
    CPU float32, F.linear (+ ReLU) otherwise."""
    if (x.is_cpu and x.dtype == weight.dtype == torch.float32 and x.dim() >= 2 and available()
            and (bias is None or bias.dtype == torch.float32)):
        lead = x.shape[:-1]
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.shape[-1]).contiguous(), _packed(weight), bias,
                                               "relu" if relu else "none", [], "")
        return y.reshape(*lead, weight.shape[0])
    y = F.linear(x, weight, bias)
    return torch.relu(y) if relu else y


def native_bf16() -> bool:
    """Whether oneDNN's linear is available and this CPU computes bf16 dot products natively."""
    return available() and bool({"avx512_bf16", "amx_bf16"} & host_cpu_flags())


@torch.library.custom_op("autotune::dense_linear_bf16", mutates_args=())
def dense_linear_bf16(x: Tensor, weight: Tensor, bias: Optional[Tensor], relu: bool, bf16_out: bool = False
                      ) -> Tensor:
    """relu?(x @ weight.T + bias) for x (..., K) and a bf16 weight (N, K): x rounded to bf16 (a bf16 x as it is),
    float32 accumulation and bias, the result rounded to bf16 and returned as float32, or as bf16 with `bf16_out`
    (the same values: what a next bf16 layer reads without the round trip; `RULE_CHAIN`). oneDNN on the CPU;
    elsewhere the same rounding steps in PyTorch."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1]).contiguous().to(torch.bfloat16)
    if x.is_cpu and _onednn_bf16():
        y = torch.ops.mkldnn._linear_pointwise(x2, _packed(weight), bias, "relu" if relu else "none", [], "")
    else:
        y = simulated_bf16(x2, weight, bias)
        y = torch.relu(y) if relu else y
    return y.to(torch.bfloat16 if bf16_out else torch.float32).reshape(*lead, weight.shape[0])


@functools.cache
def _onednn_bf16() -> bool:
    """Whether oneDNN's linear takes bf16 here (natively or emulated): asked once, not per call."""
    return available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@dense_linear_bf16.register_fake
def _(x: Tensor, weight: Tensor, bias: Optional[Tensor], relu: bool, bf16_out: bool = False) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0], dtype=torch.bfloat16 if bf16_out else torch.float32)


def simulated_bf16(x: Tensor, w: Tensor, b: Optional[Tensor] = None) -> Tensor:
    """`aten.linear`'s arguments -> its output with the bf16 rung's numerics (inputs and weight rounded to bf16,
    the result to bf16), in eager PyTorch: a layer's share of a model's bf16 error before anything runs."""
    y = F.linear(x.to(torch.bfloat16).float(), w.to(torch.bfloat16).float(), None if b is None else b.float())
    return y.to(torch.bfloat16).to(x.dtype)


_PACKED: dict[int, tuple[Any, ...]] = {}  # id(weight) -> (weak reference, version, address, shape, packed)


def _version(t: Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor has no version counter (and cannot change outside it)
        return -1


def _packed(weight: Tensor) -> Tensor:
    """oneDNN's blocked layout of `weight`, made once per weight tensor and valid while it is the same live tensor
    at the same version, address and shape (an optimizer's in-place step packs it anew). Unpacked, oneDNN
    reorders the weight on every call, a few percent of a layer's time (benchmarks/WHOLE_MODEL.md), with
    bit-identical results."""
    global _PACKED
    hit = _PACKED.get(id(weight))
    if (hit is not None and hit[0]() is weight and hit[1] == _version(weight) and hit[2] == weight.data_ptr()
            and hit[3] == weight.shape):
        return hit[4]
    import weakref

    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
    live = {k: v for k, v in _PACKED.items() if v[0]() is not None}
    live[id(weight)] = (weakref.ref(weight), _version(weight), weight.data_ptr(), weight.shape, packed)
    _PACKED = live  # replaced whole: a concurrent reader sees the old dict or the new one
    return packed


@dense_linear.register_fake
def _(x: Tensor, weight: Tensor, bias: Optional[Tensor], relu: bool) -> Tensor:
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, weight, bias, relu = inputs
    save_linear(ctx, x, weight, bias, relu, output)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    return (*linear_grads(ctx, grad), None)


dense_linear.register_autograd(_backward, setup_context=_setup_context)


# ---- the graph rules ---------------------------------------------------------------------------------------
# bf16 results: each output rounded to 8 significant bits, its inputs too: a few parts in 1e3 of the range
BF16_RANGE_ATOL = 2e-2


def _replace(linear: Any, relu: Any, bf16: bool = False) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        x, w, b = linear.args[0], linear.args[1], scalar_arg(linear, 2, "bias", None)
        out = relu or linear
        with gm.graph.inserting_before(insertion_point(gm, [x, w, b], [out])):
            if bf16:  # the weight converted once, an inference buffer beside the model's own
                w = register(gm, "autotune_bf16_weight", attr(gm, w.target).detach().to(torch.bfloat16).contiguous())
            op = torch.ops.autotune.dense_linear_bf16 if bf16 else torch.ops.autotune.dense_linear
            new = gm.graph.call_function(op.default, (x, w, b, relu is not None))
        for node in (w, new) if bf16 else (new,):
            node.meta["nn_module_stack"] = linear.meta.get("nn_module_stack", {})
        return (new,)

    return replace


def _layers(gm: Any, values: dict[str, Any], claimed: set[Any], weights: str) -> Iterator[tuple[Any, Any, float]]:
    """(linear, its ReLU or None, max |output|) of every float32 Linear on a CPU input that earlier rules left,
    in graph order, whose weight is `weights` ("any" node, or a "get_attr" parameter the rule may convert)."""
    for linear in [n for n in gm.graph.nodes if is_call(n, aten.linear.default) and n not in claimed]:
        x, w = linear.args[0], linear.args[1]
        weight, xv = tensor_value(gm, values, w), tensor_value(gm, values, x)
        b = scalar_arg(linear, 2, "bias", None)
        bias = attr(gm, b.target) if getattr(b, "op", None) == "get_attr" else tensor_value(gm, values, b)
        if not (isinstance(weight, Tensor) and isinstance(xv, Tensor) and weight.dim() == 2 and xv.dim() >= 2
                and weight.dtype == xv.dtype == torch.float32 and xv.is_cpu and weight.is_cpu
                and (b is None or (isinstance(bias, Tensor) and bias.dtype == torch.float32))
                and (weights == "any" or getattr(w, "op", None) == "get_attr")):
            continue
        relu = sole_user(linear, *RELUS)
        relu = None if relu in claimed else relu
        ref = tensor_value(gm, values, relu or linear)
        yield linear, relu, float(ref.abs().max()) if isinstance(ref, Tensor) and ref.numel() else 1.0


def _what(linear: Any, relu: Any, gm: Any, values: dict[str, Any]) -> str:
    n, k = tensor_value(gm, values, linear.args[1]).shape
    return f"Linear({k}, {n}){' + ReLU' if relu is not None else ''}"


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch]:
    """Every float32 Linear (+ the ReLU that is its only user) on a CPU input that earlier rules left, in graph
    order. Layers of other dtypes or devices are not this rule's to refuse: they are skipped without a word."""
    if not available():
        return
    for linear, relu, scale in _layers(gm, values, claimed, "any"):
        nodes = (linear,) if relu is None else (linear, relu)
        yield GraphMatch(
            rule=RULE, nodes=nodes, outputs=(relu or linear,), tasks=(), replace=_replace(linear, relu),
            tolerance=(RTOL, RANGE_ATOL * scale + 1e-6), where=where(nodes),
            what=f"{_what(linear, relu, gm, values)} -> oneDNN linear{' (ReLU fused)' if relu is not None else ''}")


def find_bf16(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch]:
    """As `find`, on oneDNN in bf16 (weights that are the model's parameters, converted once), on CPUs with
    native bf16 dot products only; each layer a `Reduced` of precision "bf16"."""
    if not native_bf16():
        return
    for linear, relu, scale in _layers(gm, values, claimed, "get_attr"):
        nodes = (linear,) if relu is None else (linear, relu)
        what = _what(linear, relu, gm, values)
        yield GraphMatch(
            rule=RULE_BF16, nodes=nodes, outputs=(relu or linear,), tasks=(), replace=_replace(linear, relu, True),
            tolerance=(0.0, BF16_RANGE_ATOL * scale + 1e-6), where=where(nodes),
            reduced=(Reduced(linear.name, where(nodes), f"{what}, bf16", simulated_bf16, precision="bf16"),),
            what=f"{what} -> oneDNN linear in bf16{' (ReLU fused)' if relu is not None else ''}")


def find_chains(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch]:
    """Every run of bf16 layers each of whose results only the next reads: rewritten so that all but the last
    return their bf16 results as they are and the next takes them (the same values, without the float32 round
    trip between layers: a write and a read of each activation at twice its size, and a conversion)."""
    layers = [n for n in gm.graph.nodes if is_call(n, BF16_OP) and n not in claimed]

    def next_of(n: Any) -> Any:
        m = sole_user(n, BF16_OP)
        return m if m is not None and m not in claimed and m.args[0] is n and not _bf16_out(n) else None

    followers = {next_of(n) for n in layers}
    for head in [n for n in layers if n not in followers]:
        chain = [head]
        while (m := next_of(chain[-1])) is not None:
            chain.append(m)
        if len(chain) > 1:
            yield GraphMatch(
                rule=RULE_CHAIN, nodes=tuple(chain), outputs=(chain[-1],), tasks=(), replace=_chained(chain),
                tolerance=(0.0, 0.0), where=where(chain),
                what=f"{len(chain)} bf16 layers pass their bf16 activations as they are")


def _bf16_out(node: Any) -> bool:
    return bool(node.kwargs.get("bf16_out", node.args[4] if len(node.args) > 4 else False))


def _chained(chain: list[Any]) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        x = chain[0].args[0]
        with gm.graph.inserting_before(chain[-1]):
            for old in chain[:-1]:
                x = gm.graph.call_function(BF16_OP, (x, *old.args[1:4]), {"bf16_out": True})
                x.meta["nn_module_stack"] = old.meta.get("nn_module_stack", {})
            last = gm.graph.call_function(BF16_OP, (x, *chain[-1].args[1:]), dict(chain[-1].kwargs))
        last.meta["nn_module_stack"] = chain[-1].meta.get("nn_module_stack", {})
        return (last,)

    return replace


BF16_OP = torch.ops.autotune.dense_linear_bf16.default
RULES = (GraphRule(RULE_BF16, find_bf16, quantizes=True, precision="bf16"),
         GraphRule(RULE_CHAIN, find_chains),
         GraphRule(RULE, find))
