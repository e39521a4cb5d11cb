"""How Linear (+ ReLU) layers appear in a captured graph, and the rule that runs chains of them in int8.

`aten.linear(x, w, b)` with w a float32 (N, K) parameter, and a following `aten.relu` when that is the linear's
only user, is a layer; layers where each one's output feeds only the next one's input form a chain (an MLP).
A chain of int8 layers becomes `q, s = torch.ops.autotune.quantize_rows(x, qmax)` (the first activations
quantized per row in a tuned kernel, not in eager ops), then per layer `torch.ops.autotune.qmatmul_requant`,
whose epilogue quantizes the layer's output for the next layer (the activations stay int8 between layers, and
no float32 output round-trips through memory to a separate quantize kernel), and `torch.ops.autotune.qmatmul`
for the last layer (float32 out). A head layer with too few inputs for int8 activations (DLRM's 13 dense
features) that feeds an int8 layer runs weight-only (float32 inputs x int8 weights) with the same quantizing
epilogue, instead of staying an fp32 Linear followed by a quantize. Weights are quantized per output channel
once, as `QuantLinear.from_float` does, and registered on the GraphModule. The quantizing epilogue is a CPU
kernel (a CPU task owns whole rows); on GPUs every layer quantizes its input with quantize_rows, as before.

Where an int8 layer's input columns differ in range by orders of magnitude (DLRM's interaction output: the
dense features beside dot products of pooled rows; the hidden layers after it), per-row scales leave the small
columns a few levels or none. Such a layer is smoothed, as SmoothQuant does (Xiao et al., 2023): its inputs are
divided column by column by s and its weight's columns multiplied by s, exact in real arithmetic, moving range
from the activations (quantized per row) to the weights (per channel). s is picked on the example inputs and kept
only where it lowers the layer's own int8 error there. Inside a chain the division is folded into the previous
layer's output channels (its weight rows and bias, exact under its ReLU and its per-channel weight scales): free
at run time; a chain's first layer has quantize_rows multiply its input by 1/s as it quantizes it (CPUs; on GPUs
a multiply before it).

A chain layer whose input is the previous layer's ReLU output takes it as uint8 rows in [0, 255] (qmatmul's
uint8 mode, the requant epilogue's out_qmax 255) on CPUs with VNNI: all 256 levels for values a ReLU leaves >= 0,
where symmetric int8 has 128, at no cost (VNNI multiplies u8 x s8; int8 activations pay a +128 offset there).

A chain whose last layer (no ReLU) is followed by DCNv2's cross tail, `x0 * (y + b) + x` (TorchRec's
LowRankCrossNet), ends with qmatmul_cross on CPUs: the tail is the last kernel's epilogue
(search_spaces/_cross_tail.py says what it matches). Two or more such layers in a row (one x0, each layer reading
the previous one's output) are one match, a cross network whose state is bfloat16 (`_Network`): an int8 cross
layer is bound by the memory its float32 state moves, not by its products.

Activations use 7 bits (qmax 63) on CPUs without AVX-512 VNNI, as FBGEMM's `reduce_range` does there: the AVX2
u8 x s8 instruction sums pairs in int16 and is exact only on 7-bit activations, and it does twice the products
per instruction of the exact 8-bit path. Elsewhere (VNNI, GPUs) they use all 8.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from .. import get as template
from .._cross_tail import CrossTail, cross_tail, tail_bias
from .._graph import (attr, has_op, host_cpu_flags, insertion_point, is_call, register, scalar_arg, sole_user,
                      tensor_value, where, workload_error)
from ..quantize_rows.workload import quantize_rows
from ..template import GraphMatch, GraphRule, Kept, Reduced
from .workload import UNSIGNED_QMAX, a_range, quantize_unsigned_rows

__all__ = ["MIN_IN_FEATURES", "MIN_OUT_FEATURES", "RULES", "simulated_linear"]

aten = torch.ops.aten
RULE = "qmatmul"
CROSS = "qmatmul_cross"
RELUS = (aten.relu.default, aten.relu_.default)
# Below these, int8 gains nothing: the layer is a few FLOPs per row (DLRM's 13-feature input layer, its 1-wide
# output layer) and per-row quantization plus a second kernel launch cost more than the fp32 GEMM saves; int8 on
# so few inputs (or outputs) also loses more accuracy relative to the work done. Such a layer alone stays fp32;
# at the head of an int8 chain it runs weight-only, quantizing its output for the next layer, which needs that
# quantization anyway.
MIN_IN_FEATURES = 32
MIN_OUT_FEATURES = 8
# int8 error, relative to the output's range (a chain's last output: the errors of its layers add up, each a
# fraction of the next one's range): each product carries rounding errors of up to 1/254 of its row's
# (activation) and its channel's (weight) max |value|; they are independent, so over K products they add up to
# about sqrt(K) / 254 of max|x| max|w|, a percent or so of max |y| for DLRM-sized layers. 5% of max |y| passes
# that and refuses a layer computed wrongly (another weight, a missing bias or ReLU moves outputs by far more).
# It asks only whether the kernels compute this chain's int8 arithmetic; whether that arithmetic is accurate
# enough for the model is tune_model's `tolerance`, judged on the model's outputs (layers that break it
# stay fp32, each a `Reduced` of its match).
RANGE_TOLERANCE = 0.05
# SmoothQuant's migration strengths tried per layer: s = max|x_col|^alpha / max|w_col|^(1 - alpha), the one with
# the smallest error on the example kept (the paper's grid search; 0.5 splits the range evenly between
# activations and weights; DLRM's first top-MLP layer does best at 0.6)
SMOOTH_ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
# smoothed only where it cuts the layer's own int8 error on the example to this fraction or less: a chain's first
# layer pays a pass over its input for it, and a smaller gain is within the batches' spread
SMOOTH_GAIN = 0.8


def _why_not(k: int, n: int) -> str:
    if k < MIN_IN_FEATURES:
        return f"in_features {k} < {MIN_IN_FEATURES}: too few products per output for int8 to pay off"
    if n < MIN_OUT_FEATURES:
        return f"out_features {n} < {MIN_OUT_FEATURES}: too few outputs for int8 to pay off"
    return ""


def _host_has_avx512_vnni() -> bool:
    """Whether this machine's CPU has AVX-512 VNNI."""
    flags = host_cpu_flags()
    return "avx512_vnni" in flags and "avx512bw" in flags


def activation_bits(device: torch.device) -> int:
    """The activation bits of int8 layers run on `device`: 7 on a CPU without VNNI (see the module doc), else 8."""
    return 7 if device.type == "cpu" and not _host_has_avx512_vnni() else 8


@dataclass(frozen=True)
class _Layer:
    """One Linear (+ ReLU) the rule can run: its nodes, its sizes, and why its activations may not be int8."""

    linear: Any
    relu: Any  # the fused ReLU node, or None
    m: int
    k: int
    n: int
    bias: bool
    a_bits: int
    small: str  # why int8 activations would not pay off here ("" when they would)
    on_cpu: bool = True  # CPUs quantize a smoothed input in the same pass (quantize_rows' `smooth`)
    # both settled once the layer's place in its chain is known (`_settled`):
    smooth: torch.Tensor | None = None  # the input columns' divisors (SmoothQuant), None where not smoothed
    unsigned: bool = False  # its input is the previous chain layer's ReLU output, as uint8 rows in [0, 255]

    @property
    def mode(self) -> str:
        """Its qmatmul mode: weight-only (float activations), uint8 (after a ReLU in its chain) or int8."""
        return "weight_only" if self.small else "uint8" if self.unsigned else "int8"

    @property
    def qmax(self) -> int:
        """Its activations' range end: 0 (float), 255 (uint8) or the int8 range's."""
        return 0 if self.small else UNSIGNED_QMAX if self.unsigned else a_range(self.a_bits)[1]

    @property
    def out(self) -> Any:
        return self.relu or self.linear

    @property
    def nodes(self) -> list[Any]:
        return [self.linear] + ([self.relu] if self.relu is not None else [])

    def fields(self, out_qmax: int = 0) -> dict[str, Any]:
        """The workload fields of its kernel: qmatmul's, or qmatmul_requant's with `out_qmax`."""
        f = dict(m=self.m, k=self.k, n=self.n, mode=self.mode, bias=self.bias, relu=self.relu is not None,
                 a_bits=self.a_bits if self.mode == "int8" else 8)
        return {**f, "out_qmax": out_qmax} if out_qmax else f

    def what(self) -> str:
        return f"Linear({self.k}, {self.n}){' + ReLU' if self.relu is not None else ''}"

    def precision(self) -> str:
        """What the report says of its numerics."""
        if self.small:
            return "int8 weights (float activations)"
        acts = "uint8 activations after its ReLU" if self.unsigned else f"{self.a_bits}-bit activations"
        return f"int8 ({acts}{', smoothed' if self.smooth is not None else ''})"


def smoothing(x: torch.Tensor, weight: torch.Tensor, qmax: int) -> torch.Tensor | None:
    """SmoothQuant's divisors s of a layer's input columns (x / s, weight * s) at the SMOOTH_ALPHAS strength with
    the smallest int8 error on `x` (an example batch; error: the output's max |error|), or None where none cuts it to
    SMOOTH_GAIN of the plain layer's. Columns `x` leaves at zero (or a zero weight column) keep s = 1 after s is
    normalised to a median of 1: dividing a column never seen non-zero by a tiny s could blow up on other inputs."""
    amax, wmax = x.detach().abs().amax(0), weight.detach().abs().amax(0)
    seen = (amax > 0) & (wmax > 0)
    if int(seen.sum()) < 2:
        return None
    want = aten.linear.default(x, weight)

    def error(s: torch.Tensor | None) -> float:
        return float((simulated_linear(qmax, s)(x, weight) - want).abs().max())

    def divisors(alpha: float) -> torch.Tensor:
        s = torch.ones_like(amax)
        s[seen] = amax[seen] ** alpha / wmax[seen] ** (1 - alpha)
        s[seen] /= s[seen].median()
        return s.contiguous()

    err, s = min(((error(s), s) for s in map(divisors, SMOOTH_ALPHAS)), key=lambda t: t[0])
    return s if err <= SMOOTH_GAIN * error(None) else None


def _layer(gm: Any, values: dict[str, Any], linear: Any, claimed: set[Any]) -> _Layer | str | None:
    """The layer at `linear`, why the rule cannot run it (by structure), or None (no layer of the model's own)."""
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
    xv = tensor_value(gm, values, x)
    if not isinstance(xv, torch.Tensor) or xv.dim() != 2 or xv.dtype != torch.float32:
        shape = tuple(xv.shape) if isinstance(xv, torch.Tensor) else "unknown"
        return f"its input is of shape {shape}: int8 layers take 2-D (batch, features) float32"
    if not xv.is_contiguous():
        return "its input is strided (not contiguous): the quantize kernel reads rows in place"
    relu = sole_user(linear, *RELUS)
    if relu is not None and relu in claimed:
        relu = None
    return _Layer(linear, relu, xv.shape[0], k, n, b is not None, activation_bits(xv.device), _why_not(k, n),
                  xv.device.type == "cpu")


def _feeds(layer: _Layer, nxt: _Layer) -> bool:
    """Whether `layer`'s output is `nxt`'s input and nothing else's (so it may leave `layer` quantized)."""
    users = list(layer.out.users)
    return users == [nxt.linear] and nxt.linear.args[0] is layer.out


def _chains(layers: list[_Layer], on_cpu: bool) -> list[list[_Layer]]:
    """Layers grouped into chains: runs of int8 layers each feeding the next, led by a too-narrow head layer
    (weight-only) where one feeds the run. The quantizing epilogue is CPU-only: on GPUs each layer is its own."""
    chains: list[list[_Layer]] = []
    for layer in layers:
        last = chains[-1][-1] if chains else None
        # a too-narrow layer only as a chain's head (a too-narrow output would make the next layer too narrow)
        if (on_cpu and last is not None and not layer.small and _feeds(last, layer)
                and (not last.small or len(chains[-1]) == 1)):
            chains[-1].append(layer)
        else:
            chains.append([layer])
    return [c for c in chains if not c[0].small or len(c) > 1]  # a lone too-narrow layer stays fp32


def _settled(gm: Any, values: dict[str, Any], chain: list[_Layer]) -> list[_Layer]:
    """The chain with each layer's activations settled, once it is known where the layer sits: a layer whose
    input is the previous layer's ReLU output takes it as uint8 rows in [0, 255] (twice the levels of
    symmetric int8 for values >= 0; VNNI multiplies u8 x s8 as they are; not on 7-bit hosts, whose AVX2 u8 path
    saturates on 8 unsigned bits), and each layer with integer activations is smoothed for its range where that
    pays (`smoothing`, on its example input)."""
    out: list[_Layer] = []
    for prev, layer in zip([None, *chain], chain):
        if layer.small:
            out.append(layer)
            continue
        unsigned = prev is not None and prev.relu is not None and layer.a_bits == 8
        settled = dataclasses.replace(layer, unsigned=unsigned)
        weight = attr(gm, layer.linear.args[1].target).detach()
        smooth = smoothing(tensor_value(gm, values, layer.linear.args[0]), weight, settled.qmax)
        out.append(dataclasses.replace(settled, smooth=smooth))
    return out


def _plan(chain: list[_Layer], tail: CrossTail | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(op, workload fields) per layer: qmatmul_requant quantizing for the next layer, qmatmul for the last
    (qmatmul_cross where a cross tail follows it: its bias is the layer's, the tail's or their sum)."""
    plan = []
    for layer, nxt in zip(chain, chain[1:]):
        plan.append(("qmatmul_requant",
                     layer.fields(UNSIGNED_QMAX if nxt.unsigned else a_range(nxt.a_bits)[1])))
    if tail is None:
        plan.append((RULE, chain[-1].fields()))
    else:
        plan.append((CROSS, {**chain[-1].fields(), "bias": chain[-1].bias or tail.bias is not None}))
    return plan


def _emit(gm: Any, chain: list[_Layer], plan: list[tuple[str, dict[str, Any]]], tail: CrossTail | None, x: Any,
          x0: Any = None, residual: Any = None) -> Any:
    """Insert one chain's kernels at the graph's insertion point, reading `x` (its first layer's input; bfloat16
    rows inside a cross network) and, where a cross tail ends it, `x0` and `residual` (the tail's x); returns the
    node of its output."""
    first = chain[0]
    biases = [scalar_arg(layer.linear, 2, "bias", None) for layer in chain]
    if first.small:  # weight-only head: float32 in, no a_scale
        a, a_scale = x, None
    else:
        smooth = None
        if first.smooth is not None:  # the head's smoothing: its input divided by s (times 1 / s)
            smooth = register(gm, "autotune_smooth", 1 / first.smooth)
            smooth.meta["nn_module_stack"] = first.linear.meta.get("nn_module_stack", {})
            if not first.on_cpu:  # on a GPU, a multiply before the quantize kernel
                x, smooth = gm.graph.call_function(aten.mul.Tensor, (x, smooth)), None
                x.meta["nn_module_stack"] = first.linear.meta.get("nn_module_stack", {})
        qs = gm.graph.call_function(torch.ops.autotune.quantize_rows.default, (x, a_range(first.a_bits)[1], smooth))
        a = gm.graph.call_function(operator.getitem, (qs, 0))
        a_scale = gm.graph.call_function(operator.getitem, (qs, 1))
        for node in (qs, a, a_scale):
            node.meta["nn_module_stack"] = first.linear.meta.get("nn_module_stack", {})
    for i, (layer, b, (op, fields)) in enumerate(zip(chain, biases, plan)):
        weight = attr(gm, layer.linear.args[1].target).detach().float()
        if layer.smooth is not None:
            weight = weight * layer.smooth
        nxt = chain[i + 1].smooth if i + 1 < len(chain) else None
        if nxt is not None:  # the next layer's smoothing, folded into this one's output channels
            weight = weight / nxt[:, None]
            if b is not None:
                b = register(gm, "autotune_smoothed_bias", attr(gm, b.target).detach() / nxt)
        wq, w_scale = quantize_rows(weight)  # once
        wq_node = register(gm, "autotune_qweight", wq.contiguous())
        scale_node = register(gm, "autotune_qweight_scale", w_scale.contiguous())
        args = (a, wq_node, a_scale, scale_node, b, fields["relu"], fields["a_bits"])
        stack = layer.linear.meta.get("nn_module_stack", {})
        if op == RULE:
            out = gm.graph.call_function(torch.ops.autotune.qmatmul.default, args)
            layer_new = [wq_node, scale_node, out]
        elif op == CROSS:
            out = gm.graph.call_function(torch.ops.autotune.qmatmul_cross.default,
                                         (a, wq_node, a_scale, scale_node, tail_bias(gm, b, tail), x0, residual,
                                          fields["a_bits"]))
            layer_new = [wq_node, scale_node, out]
        else:
            qs = gm.graph.call_function(torch.ops.autotune.qmatmul_requant.default, (*args, fields["out_qmax"]))
            a = gm.graph.call_function(operator.getitem, (qs, 0))
            a_scale = gm.graph.call_function(operator.getitem, (qs, 1))
            layer_new = [wq_node, scale_node, qs, a, a_scale]
        for node in layer_new:
            node.meta["nn_module_stack"] = stack
    return out


def _reads(chain: list[_Layer], tail: CrossTail | None) -> list[Any]:
    """The nodes a chain's kernels read (its input, its biases, its tail's): the replacement goes after them."""
    biases = [scalar_arg(layer.linear, 2, "bias", None) for layer in chain]
    reads = [chain[0].linear.args[0], *biases] + ([tail.bias, tail.x0, tail.x] if tail is not None else [])
    return [r for r in reads if r is not None]


def _replace(chain: list[_Layer], plan: list[tuple[str, dict[str, Any]]], tail: CrossTail | None = None) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        ends = [chain[-1].out] if tail is None else [tail.out]
        with gm.graph.inserting_before(insertion_point(gm, _reads(chain, tail), ends)):
            x0, x = (tail.x0, tail.x) if tail is not None else (None, None)
            return (_emit(gm, chain, plan, tail, chain[0].linear.args[0], x0, x),)

    return replace


def _replace_network(net: _Network) -> Any:
    """The network's kernels: x0 (and the first layer's input, where it is not x0) stored in bfloat16 once, each
    layer's chain reading the previous one's bfloat16 output, then the follower's chain on the last one (or the
    last one widened to float32)."""
    def replace(gm: Any) -> tuple[Any, ...]:
        first, sites = net.members[0], net.sites
        reads = [r for site in sites for r in _reads(site.chain, site.tail)]
        reads = [r for r in dict.fromkeys(reads) if r not in {site.out for site in sites}]
        with gm.graph.inserting_before(insertion_point(gm, reads, [sites[-1].out])):
            stored: dict[Any, Any] = {}

            def state(node: Any) -> Any:  # a float32 node stored in bfloat16, once
                if node not in stored:
                    stored[node] = _narrowed(gm, node, net.members)
                return stored[node]

            x0, x = state(first.tail.x0), state(first.input)
            residual = x if first.tail.x is first.input else state(first.tail.x)
            for site in net.members:
                x = residual = _emit(gm, site.chain, site.plan, site.tail, x, x0, residual)
            if net.follower is not None:
                return (_emit(gm, net.follower.chain, net.follower.plan, None, x),)
            return (gm.graph.call_function(aten._to_copy.default, (x,), {"dtype": torch.float32}),)

    return replace


_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _narrowed(gm: Any, node: Any, members: list[_Site]) -> Any:
    """`node` (float32) as a node of the state's dtype. A cat (or a view of one: TorchRec's (B, F, D) cat of the dense and
    pooled features, flattened) read only by the network writes that dtype itself (`cat_as`; its float32 result
    never exists), the views replayed on it; any other node is rounded by a copy."""
    inside = {n for site in members for n in site.nodes}
    views, src = [], node
    while is_call(src, *_VIEWS) and set(src.users) <= (inside | set(views)):
        views.append(src)
        src = src.args[0]
    if is_call(src, aten.cat.default) and set(src.users) <= (inside | set(views)):
        dim = src.args[1] if len(src.args) > 1 else src.kwargs.get("dim", 0)
        out = gm.graph.call_function(cat_as, (list(src.args[0]), dim, getattr(torch, STATE)))
        for view in reversed(views):
            out = gm.graph.call_function(view.target, (out, *view.args[1:]), dict(view.kwargs))
        return out
    return gm.graph.call_function(aten._to_copy.default, (node,), {"dtype": getattr(torch, STATE)})


def cat_as(tensors: list[torch.Tensor], dim: int, dtype: torch.dtype) -> torch.Tensor:
    """`torch.cat(tensors, dim).to(dtype)` in one pass: each tensor copied into its slice of a `dtype` output
    (each value rounded once, as the cast rounds it; `torch.cat(..., out=)` of another dtype takes a slower
    path). Where autograd records, the two steps."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return torch.cat(tensors, dim).to(dtype)
    first = tensors[0]
    dim %= first.dim()
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    out = first.new_empty(shape, dtype=dtype)
    at = 0
    for t in tensors:
        out.narrow(dim, at, t.shape[dim]).copy_(t)
        at += t.shape[dim]
    return out


def simulated_linear(qmax: int, smooth: torch.Tensor | None = None) -> Any:
    """`aten.linear`'s arguments -> its output with an int8 layer's numerics, in eager PyTorch: the weight
    quantized per output channel (as `_replace` quantizes it), the activations per row to [-qmax, qmax] (0:
    weight-only, float activations; UNSIGNED_QMAX: a ReLU's output to [0, 255]), both after smoothing by
    `smooth` (x / s, w * s) where given. The kernels accumulate the same products exactly in int32, so this
    differs from them only by float32 rounding: it measures a layer's share of a model's int8 error before any
    kernel is tuned."""

    def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        w = w.detach().float()
        if smooth is not None:
            x, w = x * (1 / smooth), w * smooth
        wq, w_scale = quantize_rows(w)
        if qmax:
            q, a_scale = (quantize_unsigned_rows if qmax == UNSIGNED_QMAX else quantize_rows)(x, qmax)
            x = q.float() * a_scale[:, None]
        return aten.linear.default(x, wq.float() * w_scale[:, None], b)

    return linear


def _reduced(chain: list[_Layer]) -> tuple[Reduced, ...]:
    """Each layer of a chain as one that may stay fp32 alone: its linear node, and its int8 numerics."""
    return tuple(Reduced(node=layer.linear.name, where=where(layer.nodes), what=f"{layer.what()}, {layer.precision()}",
                         simulate=simulated_linear(layer.qmax, layer.smooth))
                 for layer in chain)


@dataclass
class _Site:
    """One chain the rule can run (a lone layer is a chain of one): its layers, the cross tail that ends it (or
    None), its kernels' plan and tasks, the nodes it replaces and the range its tolerance is a share of."""

    chain: list[_Layer]
    tail: CrossTail | None
    plan: list[tuple[str, dict[str, Any]]]
    nodes: list[Any]
    scale: float

    @property
    def input(self) -> Any:
        return self.chain[0].linear.args[0]

    @property
    def out(self) -> Any:
        return self.tail.out if self.tail is not None else self.chain[-1].out

    def tasks(self, state: str = "float32") -> list[tuple[str, dict[str, Any]]]:
        """Its kernels' (op, fields): the head's quantize_rows (reading rows of `state`), then the plan's (a
        qmatmul_cross with that state)."""
        head = self.chain[0]
        quantize = [("quantize_rows", dict(rows=head.m, cols=head.k, qmax=a_range(head.a_bits)[1],
                                           **({"smooth": True} if head.smooth is not None and head.on_cpu else {}),
                                           **({"dtype": state} if state != "float32" else {})))]
        plan = [(op, {**fields, "state": state} if op == CROSS and state != "float32" else fields)
                for op, fields in self.plan]
        return (quantize if not head.small else []) + plan

    def what(self) -> str:
        chain, plan, tail = self.chain, self.plan, self.tail
        return (" -> ".join(layer.what() for layer in chain) + (" -> x0 * (. + b) + x" if tail else "") + " -> "
                + ("quantize_rows + " if not chain[0].small else "")
                + (f"int8 {plan[-1][0]}" if len(chain) == 1 else
                   f"{len(chain) - 1} qmatmul_requant (int8 out) + {plan[-1][0]}: int8 between layers"
                   + (" (uint8 after ReLUs)" if any(layer.unsigned for layer in chain) else "")
                   + (" (the head weight-only)" if chain[0].small else ""))
                + (" (7-bit activations)" if chain[-1].a_bits == 7 else "")
                + (f" ({sum(layer.smooth is not None for layer in chain)} smoothed)"
                   if any(layer.smooth is not None for layer in chain) else "")
                + (" (ReLU fused)" if any(layer.relu is not None for layer in chain) else "")
                + (" (DCN's cross tail in its epilogue)" if tail else ""))

    def match(self) -> GraphMatch:
        return GraphMatch(
            rule=RULE, nodes=tuple(self.nodes), outputs=(self.out,), tasks=tuple(self.tasks()),
            replace=_replace(self.chain, self.plan, self.tail), tolerance=(0.0, RANGE_TOLERANCE * self.scale + 1e-6),
            where=where(self.nodes), reduced=_reduced(self.chain), what=self.what())


def _sites(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[_Site | Kept]:
    """Every chain of Linear(+ReLU) layers on float32 parameters, in graph order, and the layers the rule
    cannot run (a lone layer too narrow for int8, a kernel not registered, a shape its workload refuses)."""
    layers = []
    for linear in [n for n in gm.graph.nodes if is_call(n, aten.linear.default) and n not in claimed]:
        layer = _layer(gm, values, linear, claimed)
        if isinstance(layer, str):
            yield Kept(RULE, where([linear]), layer)
        elif layer is not None:
            layers.append(layer)
    on_cpu = all(tensor_value(gm, values, layer.linear.args[0]).device.type == "cpu" for layer in layers)
    chains = _chains(layers, on_cpu)
    chained = {id(layer) for chain in chains for layer in chain}
    for layer in layers:
        if id(layer) not in chained:
            yield Kept(RULE, where(layer.nodes), layer.small)
    for chain in (_settled(gm, values, c) for c in chains):
        last = chain[-1]
        tail = (cross_tail(gm, values, last.out, (last.m, last.n))
                if on_cpu and last.relu is None and not last.small and has_op(CROSS) else None)
        nodes = [node for layer in chain for node in layer.nodes] + list(tail.nodes if tail else ())
        ops = ["quantize_rows"] * (not chain[0].small) + ["qmatmul_requant"] * (len(chain) > 1) + [RULE]
        missing = [op for op in ops if not has_op(op)]
        if missing:
            yield Kept(RULE, where(nodes), f"torch.ops.autotune.{missing[0]} is not registered (import autotune.torch)")
            continue
        plan = _plan(chain, tail)  # ops by name, as tasks name them (qmatmul_requant builds on qmatmul: never imported)
        why = next((f"{layer.what()}: {e}" for layer, (op, fields) in zip(chain, plan)
                    if (e := workload_error(template(op).Workload, fields))), "")
        if why:
            yield Kept(RULE, where(nodes), why)
            continue
        ref = tensor_value(gm, values, chain[-1].out)
        scale = float(ref.abs().max()) if isinstance(ref, torch.Tensor) and ref.numel() else 1.0
        if tail is not None:  # the tail multiplies the product's error by x0
            scale *= float(tensor_value(gm, values, tail.x0).abs().max())
        yield _Site(chain, tail, plan, nodes, scale)


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """Every chain of Linear(+ReLU) layers on float32 parameters (a lone layer is a chain of one), in graph
    order, a DCN cross network's chains as one match (`_networks`); a lone layer too narrow for int8 is kept,
    saying why."""
    sites: list[_Site] = []
    for found in _sites(gm, values, claimed):
        if isinstance(found, Kept):
            yield found
        else:
            sites.append(found)
    for group in _networks(sites):
        yield group.match()


# ---- a DCN cross network with 16-bit state --------------------------------------------------------------------
# Below this many cross layers a network keeps float32 state: converting x0 once (a float32 read, a 16-bit write)
# and its output back costs about what one layer's 16-bit state saves.
MIN_NETWORK_LAYERS = 2
STATE = "bfloat16"  # float32's range (a trained model's state has no fp16 overflow to fear), 8 bits of mantissa


@dataclass
class _Network:
    """Consecutive cross layers of one DCN (each chain's input and residual the previous layer's output, one x0),
    run with their state (x0, every x_l) in bfloat16: each layer reads x0 and x_l and writes x_{l+1}, a float32
    stream as large as the batch's features, which bounds an int8 cross layer by memory; in 16 bits each moves
    half. The chain after it (the top MLP) quantizes the last layer's bfloat16 output directly, where it is that
    output's only reader; else the output is widened back to float32 once."""

    members: list[_Site]
    follower: _Site | None = None

    @property
    def sites(self) -> list[_Site]:
        return self.members + ([self.follower] if self.follower is not None else [])

    def match(self) -> GraphMatch:
        sites, last = self.sites, self.sites[-1]
        nodes = [n for site in sites for n in site.nodes]
        tasks = [t for site in self.members for t in site.tasks(STATE)]
        tasks += self.follower.tasks(STATE) if self.follower is not None else []
        return GraphMatch(
            rule=RULE, nodes=tuple(nodes), outputs=(last.out,), tasks=tuple(tasks),
            replace=_replace_network(self), tolerance=(0.0, RANGE_TOLERANCE * last.scale + 1e-6), where=where(nodes),
            reduced=tuple(r for site in sites for r in _reduced(site.chain)),
            what=f"DCN cross network of {len(self.members)} layers, {STATE} state: "
                 + "; ".join(site.what() for site in sites))


def _networks(sites: list[_Site]) -> Iterator[_Site | _Network]:
    """The sites in graph order, runs of at least MIN_NETWORK_LAYERS consecutive cross layers grouped into a
    `_Network` with the chain after them where it alone reads their output (as its input: the top MLP)."""
    runs: list[list[_Site]] = []
    for site in sites:
        prev = runs[-1][-1] if runs else None
        if (site.tail is not None and not site.chain[0].small and prev is not None and prev.tail is not None
                and site.input is prev.out and site.tail.x is prev.out and site.tail.x0 is prev.tail.x0
                and set(prev.out.users) == {site.chain[0].linear, site.tail.out}):
            runs[-1].append(site)
        else:
            runs.append([site])
    follows = False  # whether the run's head follows the network before it (and is in it)
    for run, after in zip(runs, [*runs[1:], None]):
        if follows:
            run, follows = run[1:], False
        if len(run) < MIN_NETWORK_LAYERS or run[0].tail is None or run[0].chain[0].small:
            yield from run
            continue
        nxt = after[0] if after is not None else None
        follows = (nxt is not None and nxt.tail is None and not nxt.chain[0].small and nxt.input is run[-1].out
                   and set(run[-1].out.users) == {nxt.chain[0].linear})
        yield _Network(run, nxt if follows else None)


RULES = (GraphRule(RULE, find, quantizes=True),)
