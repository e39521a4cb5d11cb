"""`torch.ops.autotune.qmatmul` and `QuantLinear`: how the quantized matmul appears in PyTorch.

Kernels are compiled for (k, n, mode, bias, relu). A CPU kernel runs any M (any whole number of its parallel
tasks, the call's rows padded up to one: qmatmul's `call_dims`); a GPU kernel exactly its tuned M: a call of
another M runs the smallest bucket that holds it, its rows zero-padded, or is split into chunks of the largest
(see `run`). The op takes int8 tensors and has no gradient.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..quantize_rows.workload import quantize_rows  # eager symmetric int8 per row: weights once, and the op's
#                                                     PyTorch implementation (torch.ops.autotune.quantize_rows)
from ..template import ModuleRule, Route, TorchBinding
from .checks import check, op_arguments
from .workload import A_BITS, Workload, a_limits, a_range, inputs, qmatmul_reference, quantized

__all__ = ["BINDING", "QuantLinear", "any_size_on", "cases", "qmatmul", "quantize_rows", "run_chunk"]


def qmatmul(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
            relu: bool = False, a_bits: int = 8, validate: bool = True) -> Tensor:
    """relu?((a @ weight.T) * a_scale[:, None] * w_scale + bias) with int8 a and weight (int32 accumulation),
    or with float32 a and no a_scale (weight-only). The weight is packed once per kernel and weight tensor.

    `a_bits=7` promises int8 activations in [-64, 63] (`quantize_rows(x, 63)` makes them): it selects kernels
    that rely on it (AVX2's u8 x s8 instruction); with `validate` the promise is checked."""
    return qmatmul_reference(a, weight, a_scale, w_scale, bias, relu)


def fake(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
         relu: bool = False, a_bits: int = 8, validate: bool = True) -> Tensor:
    return a.new_empty(a.shape[0], weight.shape[0], dtype=torch.float32)


def mode_of(a: Tensor) -> str:
    """The workload mode the activations' dtype selects: int8, uint8 (a ReLU's output, CPU kernels) or weight-only."""
    return {torch.int8: "int8", torch.uint8: "uint8"}.get(a.dtype, "weight_only")


def route(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor] = None,
          relu: bool = False, a_bits: int = 8, validate: bool = True) -> Route:
    n, k = weight.shape
    return Route((k, n, mode_of(a), bias is not None, relu, a_bits), a.shape[0])


def run_chunk(chunk: Any, a: Tensor, weight: Tensor, a_scale: Optional[Tensor], rest: list[Tensor]) -> Any:
    """Rows [start, stop) through a kernel tuned for `chunk.kernel.size` rows, zero-padded up to it unless it
    serves any M (CPU kernels): its output (or each of its outputs, for qmatmul_requant's kernels) for those
    rows."""
    rows = chunk.stop - chunk.start
    pad = 0 if chunk.kernel.any_size else chunk.kernel.size - rows  # any_size: the kernel pads what it needs
    if rows == a.shape[0]:  # the whole call: no views to make (each costs a dispatch)
        a_c, s_c = a, a_scale
    else:
        a_c = a[chunk.start:chunk.stop]
        s_c = None if a_scale is None else a_scale[chunk.start:chunk.stop]
    if pad:
        a_c = F.pad(a_c, (0, 0, 0, pad))
        s_c = None if s_c is None else F.pad(s_c, (0, pad))
    out = chunk.kernel(a_c, weight, *([] if s_c is None else [s_c]), *rest)
    if not pad:
        return out
    return tuple(o[:rows] for o in out) if isinstance(out, tuple) else out[:rows]


def run(chunks: Sequence[Any], a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor,
        bias: Optional[Tensor] = None, relu: bool = False, a_bits: int = 8, validate: bool = True) -> Tensor:
    rest = [w_scale] + ([] if bias is None else [bias])
    if len(chunks) == 1:
        return run_chunk(chunks[0], a, weight, a_scale, rest).contiguous()
    out = a.new_empty(a.shape[0], weight.shape[0], dtype=torch.float32)
    for chunk in chunks:
        out[chunk.start:chunk.stop] = run_chunk(chunk, a, weight, a_scale, rest)
    return out


def any_size_on(device: str) -> bool:
    """Whether this op's kernels on `device` serve any M: CPU kernels do (whole tasks), GPU kernels run their
    tuned M."""
    return not device.startswith("cuda")


def compiled(w: Workload) -> tuple[Any, ...]:
    return (w.k, w.n, w.mode, w.bias, w.relu, w.a_bits)


def describe(signature: tuple[Any, ...]) -> str:
    k, n, mode, bias, relu, a_bits = signature
    return f"k={k} n={n} mode={mode} bias={bias} relu={relu} a_bits={a_bits}"


def cases(w: Workload, seed: int, count: int) -> Iterable[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    """The tuned M, M of 1, one below and above it (not whole tiles: padded), above twice it (split on GPUs),
    zero and extreme int8 activations and weights, and `count` random M."""

    def call(name: str, m: int, s: int, fill: tuple[int, int] | None = None
             ) -> tuple[str, tuple[Any, ...], dict[str, Any]]:
        tensors = list(inputs(dataclasses.replace(w, m=m), s))
        if fill is not None:  # (activation value, weight value): all-equal extremes (or zeros)
            if quantized(w):
                tensors[0] = torch.full_like(tensors[0], fill[0])
            else:
                tensors[0] = torch.full_like(tensors[0], float(fill[0]))
            tensors[1] = torch.full_like(tensors[1], fill[1])
        args, kwargs = op_arguments(w, tensors)
        return name, args, kwargs

    sizes = dict.fromkeys([w.m, 1, max(1, w.m - 1), w.m + 1, 2 * w.m + 3])
    out = [call(f"m={m}" + (" (tuned)" if m == w.m else ""), m, seed + i) for i, m in enumerate(sizes)]
    lo, hi = a_limits(w)
    out += [call("zero activations", w.m, seed, (0, 1)), call("zero weights", w.m, seed, (1, 0)),
            call(f"activations {lo}, weights -128", w.m, seed, (lo, -128)),
            call(f"activations {hi}, weights -128", w.m, seed, (hi, -128))]
    rng = random.Random(seed)
    for i in range(count):
        m = rng.randint(1, 3 * w.m + 8)
        out.append(call(f"random m={m} (seed {seed + 10 + i})", m, seed + 10 + i))
    return out


class QuantLinear(nn.Module):
    """An int8 `nn.Linear` for inference on tuned qmatmul kernels, optionally with the following ReLU fused.

    Weights are quantized per output channel once (`from_float`); in int8 mode activations are quantized per row
    at run time (symmetric, max-abs; to `a_bits` bits), in weight-only mode they stay float32. Its tensors are
    buffers: it has no gradients. Inputs may have any leading dimensions, as nn.Linear's.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, relu: bool = False,
                 mode: str = "int8", device: Any = None, validate: bool = True, a_bits: int = 8):
        super().__init__()
        if mode not in ("int8", "weight_only"):
            raise ValueError(f"QuantLinear: mode must be int8 or weight_only, got {mode!r}")
        if a_bits not in A_BITS or (a_bits != 8 and mode != "int8"):
            raise ValueError(f"QuantLinear: a_bits must be 8, or 7 in int8 mode; got {a_bits!r} ({mode})")
        self.in_features, self.out_features = in_features, out_features
        self.relu, self.mode, self.validate, self.a_bits = relu, mode, validate, a_bits
        self.qmax = a_range(a_bits)[1]
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("w_scale", torch.ones(out_features, device=device))
        self.register_buffer("bias", torch.zeros(out_features, device=device) if bias else None)

    @classmethod
    def from_float(cls, linear: nn.Linear, relu: bool = False, mode: str = "int8",
                   validate: bool = True, a_bits: int = 8) -> "QuantLinear":
        """Quantize `linear`'s weight per output channel (symmetric, max-abs); the bias stays float32."""
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, relu=relu, mode=mode,
                  device=linear.weight.device, validate=validate, a_bits=a_bits)
        with torch.no_grad():
            q, scale = quantize_rows(linear.weight.detach().float())
            new.weight.copy_(q)
            new.w_scale.copy_(scale)
            if linear.bias is not None:
                new.bias.copy_(linear.bias.detach().float())
        return new

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        a = x.reshape(-1, self.in_features).float().contiguous()
        if self.mode == "int8":
            # tuned kernels where loaded
            q, scale = torch.ops.autotune.quantize_rows(a, self.qmax, validate=self.validate)
            y = torch.ops.autotune.qmatmul(q, self.weight, scale, self.w_scale, self.bias, self.relu, self.a_bits,
                                           self.validate)
        else:
            y = torch.ops.autotune.qmatmul(a, self.weight, None, self.w_scale, self.bias, self.relu, 8, self.validate)
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"relu={self.relu}, mode={self.mode}" + (f", a_bits={self.a_bits}" if self.a_bits != 8 else ""))


def _linear_to_quant(module: nn.Module, next_module: Any, has_kernel: Any, validate: bool) -> Any:
    """nn.Linear (exactly: subclasses may change forward) -> int8 QuantLinear, fusing a ReLU that follows it
    when a relu kernel exists."""
    if type(module) is not nn.Linear:
        return None
    fields = (module.in_features, module.out_features, "int8", module.bias is not None)
    for relu in ((True, False) if isinstance(next_module, nn.ReLU) else (False,)):
        for a_bits in A_BITS:  # full-range activations where a kernel takes them
            if has_kernel(lambda w: (w.k, w.n, w.mode, w.bias, w.relu, w.a_bits) == (*fields, relu, a_bits)):
                return QuantLinear.from_float(module, relu=relu, validate=validate, a_bits=a_bits), relu
    return f"no int8 qmatmul kernel for k={fields[0]} n={fields[1]} bias={fields[3]}"


def replayable(a: Tensor, weight: Tensor, a_scale: Optional[Tensor], w_scale: Tensor, bias: Optional[Tensor],
               relu: bool, a_bits: int, *rest: Any) -> bool:
    """Unless a validated call promises 7-bit activations: `check` then reads their range (its one data pass).
    qmatmul_requant's operands come first in the same order; `validate` is last for both."""
    return a_bits == 8 or not rest[-1]


BINDING = TorchBinding(
    op=qmatmul, fake=fake, check=check, route=route, run=run, compiled=compiled, size=lambda w: w.m,
    any_size=any_size_on, describe=describe, cases=cases, replayable=replayable,
    rules=(ModuleRule("nn.Linear(+ReLU) -> QuantLinear", _linear_to_quant, quantizes=True),),
    exports=(("QuantLinear", QuantLinear), ("quantize_rows", quantize_rows)))
