"""Quantized matmul's workload and PyTorch semantics: `Y = epilogue(A @ W.T)`, W stored (N, K) like nn.Linear.

mode=int8: int8 activations x int8 weights -> exact int32 accumulation, then a fused epilogue:
    Y = relu?(acc * a_scale[m] * w_scale[n] + bias[n])   (per-row activation scale, per-channel weight scale)
mode=weight_only: fp32 activations x int8 weights with per-channel scales:
    Y = relu?((A @ W.T) * w_scale[n] + bias[n])
mode=uint8: the int8 mode's arithmetic on unsigned activations, A in [0, 255] (a ReLU's output: all 8 bits for
    values >= 0, twice the levels of symmetric int8); CPUs only (VNNI's u8 x s8 takes them as they are).
a_bits=7 (int8 mode): the same arithmetic on activations that use 7 bits, A in [-64, 63]. Callers that quantize
to that range (`quantize_rows` with qmax=63, as FBGEMM's `reduce_range`) let a CPU without VNNI use `vpmaddubsw`
(u8 x s8 pairs summed in int16: exact only while A + 64 stays below 128), twice the products per instruction.

Nothing here depends on a schedule: the device modules (cpu.py, cuda.py) say how far M, K and N are padded and
how the weight is laid out; this module pads to what they say. No tvm import: packages run without TVM.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..template import Traffic, Workload as _Workload, WorkloadError


@dataclass(frozen=True)
class Workload(_Workload):
    m: int
    k: int
    n: int
    mode: str = "int8"
    bias: bool = True
    relu: bool = False
    a_bits: int = 8  # bits the int8 activations use: 8 (any int8) or 7 (A in [-64, 63])

    def __post_init__(self) -> None:
        for name in ("m", "k", "n"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mode not in MODES:
            raise WorkloadError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.a_bits not in A_BITS or isinstance(self.a_bits, bool):
            raise WorkloadError(f"a_bits must be 7 or 8, got {self.a_bits!r}")
        if self.a_bits != 8 and self.mode != "int8":
            raise WorkloadError("a_bits applies to int8 activations only (mode=int8)")


A_BITS = (8, 7)
MODES = ("int8", "uint8", "weight_only")


UNSIGNED_QMAX = 255  # uint8 activations (a ReLU's output) use [0, 255]


def quantize_unsigned_rows(x: Any, qmax: int = UNSIGNED_QMAX) -> tuple[Any, Any]:
    """Rows of x >= 0 (a ReLU's output) as uint8 in [0, qmax] and a float32 scale per row, as quantize_rows does
    for signed rows: scale = max(max_c x, 1e-12) / qmax (an IEEE division), q = round half to even of x / scale."""
    import torch

    amax = x.abs().amax(dim=1).clamp_min(1e-12)
    scale = amax / torch.full_like(amax, float(qmax))  # divided by a tensor: see quantize_rows
    return torch.round(x / scale[:, None]).clamp_(0, qmax).to(torch.uint8), scale


def quantized(w: Workload) -> bool:
    """Whether the activations are integers with a scale per row (int8, uint8), not float32 (weight-only)."""
    return w.mode != "weight_only"


def a_limits(w: Workload) -> tuple[int, int]:
    """The values the activations take: [0, 255] for uint8, else `a_range(a_bits)`."""
    return (0, 255) if w.mode == "uint8" else a_range(w.a_bits)


def a_range(a_bits: int) -> tuple[int, int]:
    """The int8 values activations of `a_bits` bits take: (-128, 127) or (-64, 63)."""
    half = 1 << (a_bits - 1)
    return -half, half - 1


def round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def a_bytes(w: Workload) -> int:
    """Bytes of one activation element: int8/uint8 or fp32."""
    return 1 if quantized(w) else 4


# ---- data and reference ------------------------------------------------------------------------------------
def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(A, W, a_scale, w_scale[, bias]) for int8 and uint8; (A, W, w_scale[, bias]) for weight-only."""
    import torch

    g = torch.Generator().manual_seed(seed)
    wt = torch.randint(-128, 128, (w.n, w.k), generator=g, dtype=torch.int8)
    w_scale = torch.rand(w.n, generator=g) * 0.01 + 1e-3
    bias = [torch.randn(w.n, generator=g)] if w.bias else []
    if quantized(w):
        lo, hi = a_limits(w)
        a = torch.randint(lo, hi + 1, (w.m, w.k), generator=g, dtype=torch.uint8 if w.mode == "uint8" else torch.int8)
        a_scale = torch.rand(w.m, generator=g) * 0.05 + 1e-3
        return (a, wt, a_scale, w_scale, *bias)
    a = torch.randn(w.m, w.k, generator=g)
    return (a, wt, w_scale, *bias)


def accumulate(a: Any, weight: Any) -> Any:
    """A @ W.T exactly: int32 for int8 or uint8 A (through float64, exact below 2**53), fp32 for fp32 A."""
    import torch

    if a.dtype in (torch.int8, torch.uint8):
        return (a.double() @ weight.double().t()).to(torch.int32)
    return a @ weight.float().t()


def qmatmul_reference(a: Any, weight: Any, a_scale: Optional[Any], w_scale: Any, bias: Optional[Any] = None,
                      relu: bool = False) -> Any:
    """The op's semantics on its call arguments (int8 mode when `a_scale` is given, weight-only otherwise): the
    reference kernels are checked against and the torch op's PyTorch fallback."""
    import torch

    y = accumulate(a, weight)
    y = y.float() * a_scale[:, None] * w_scale[None, :] if a_scale is not None else y * w_scale[None, :]
    if bias is not None:
        y = y + bias
    return torch.relu(y) if relu else y


def reference(w: Workload, *tensors: Any) -> Any:
    if quantized(w):
        a, weight, a_scale, w_scale, *rest = tensors
    else:
        (a, weight, w_scale, *rest), a_scale = tensors, None
    return qmatmul_reference(a, weight, a_scale, w_scale, rest[0] if w.bias else None, w.relu)


def baselines(w: Workload, *tensors: Any) -> dict[str, Callable[[], Any]]:
    """PyTorch's fastest paths for the same arithmetic (fbgemm's on CPU only), prepared outside the timed call."""
    import torch

    out: dict[str, Callable[[], Any]] = {}
    if w.mode == "weight_only":
        a, weight, w_scale, *rest = tensors
        wf = weight.float() * w_scale[:, None]
        b = rest[0] if w.bias else None
        out["torch linear (fp32, dequantized weight)"] = lambda: (
            torch.relu(torch.nn.functional.linear(a, wf, b)) if w.relu else torch.nn.functional.linear(a, wf, b))
        return out
    a, weight, a_scale, w_scale, *rest = tensors
    b = rest[0] if w.bias else None
    wt = weight.t().contiguous()

    def int_mm() -> Any:
        y = torch._int_mm(a, wt).float() * a_scale[:, None] * w_scale[None, :]
        y = y + b if b is not None else y
        return torch.relu(y) if w.relu else y

    onednn = _onednn_linear(w, a, weight, a_scale, w_scale, b)
    if onednn is not None:
        out["onednn qlinear (PT2E's int8 kernel) + epilogue"] = onednn
    if w.mode == "uint8":  # neither _int_mm nor fbgemm's linear takes uint8 x int8 with a scale per row
        out["torch eager (float32 of the same integers)"] = lambda: reference(w, *tensors)
        return out
    if w.m > 16 and w.k % 8 == 0 and w.n % 8 == 0:
        out["torch._int_mm + epilogue"] = int_mm
    if a.device.type != "cpu":
        return out
    try:  # fbgemm's quantized linear: u8 activations (one scale), per-channel s8 weights, u8 output
        # Activations use 7 of the 8 bits (PyTorch's fbgemm qconfigs set reduce_range): without VNNI, fbgemm
        # sums u8 x s8 pairs into int16 (vpmaddubsw), which saturates on full-range activations.
        warnings.filterwarnings("ignore", message=".*quantize_per_.*deprecated", category=UserWarning)
        torch.backends.quantized.engine = "fbgemm"
        qw = torch.quantize_per_channel(weight.float() * w_scale[:, None], w_scale.double(),
                                        torch.zeros(w.n, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, b)
        a_real = a.float() * a_scale[:, None]
        qa = torch.quantize_per_tensor(a_real, float(a_real.abs().max()) / 63, 64, torch.quint8)
        y_max = float(qmatmul_reference(a, weight, a_scale, w_scale, b, w.relu).abs().max())  # output range
        out_scale, out_zero = 2 * y_max / 255, 128
        linear = torch.ops.quantized.linear_relu if w.relu else torch.ops.quantized.linear
        out["quantized.linear (fbgemm)"] = lambda: linear(qa, packed, out_scale, out_zero).dequantize()
    except (RuntimeError, AttributeError):
        pass
    return out


def _onednn_linear(w: Workload, a: Any, weight: Any, a_scale: Any, w_scale: Any, b: Any) -> Callable[[], Any] | None:
    """oneDNN's int8 linear, the kernel PT2E's X86InductorQuantizer models run (AMX or VNNI where the CPU has
    them): the same integers as u8 activations (int8 at zero point 128) with per-channel int8 weights, their
    scales applied in it, float32 out; its activations take one scale for the tensor, so the rows' scales, the
    bias and the ReLU follow in PyTorch, as `torch._int_mm`'s epilogue. None where this PyTorch lacks it."""
    import torch

    if a.device.type != "cpu" or not hasattr(torch.ops, "onednn"):
        return None
    try:
        x = a if w.mode == "uint8" else (a.to(torch.int16) + 128).to(torch.uint8)
        zero = 0 if w.mode == "uint8" else 128
        packed = torch.ops.onednn.qlinear_prepack(weight, [w.m, w.k])
        zeros = torch.zeros(w.n, dtype=torch.int64)

        def call() -> Any:
            y = torch.ops.onednn.qlinear_pointwise(x, 1.0, zero, packed, w_scale, zeros, None, 1.0, 0,
                                                   torch.float32, "none", [], "") * a_scale[:, None]
            y = y + b if b is not None else y
            return torch.relu(y) if w.relu else y
        call()
        return call
    except (RuntimeError, AttributeError):
        return None


# ---- padding to whole tiles (the tile sizes come from the config's device module) ------------------------------
def padded_weight(w: Workload, dims: tuple[int, int, int], weight: Any) -> Any:
    """The (N, K) weight zero-padded to (np_, kp) of the padded `dims` (mp, kp, np_), on the weight's device:
    what each device's `pack` lays out."""
    import torch

    _, kp, np_ = dims
    wp = torch.zeros(np_, kp, dtype=torch.int8, device=weight.device)
    wp[: w.n, : w.k] = weight
    return wp


def zero_padded(x: Any, widths: tuple[int, ...]) -> Any:
    """`x` zero-padded at the end of its dimensions by `widths` (F.pad's order: the last dimension first, (0,
    after) pairs), written once: the copy, then zeros in the padding alone (F.pad fills it all first: a second
    pass over a padded batch of float32 cross state). `x` itself where nothing is padded."""
    if not any(widths):
        return x
    if any(widths[0::2]):
        raise ValueError(f"zero_padded pads at the end only, got {widths}")
    after = [widths[2 * (x.dim() - 1 - d) + 1] if 2 * (x.dim() - 1 - d) + 1 < len(widths) else 0
             for d in range(x.dim())]
    out = x.new_empty([size + extra for size, extra in zip(x.shape, after)])
    out[tuple(slice(0, size) for size in x.shape)] = x
    for d, extra in enumerate(after):
        if extra:
            out[(slice(None),) * d + (slice(x.shape[d], None),)] = 0
    return out


def padded_inputs(w: Workload, dims: tuple[int, int, int], packed: Sequence[Any], *tensors: Any) -> list[Any]:
    """The kernel's input arguments from reference-order tensors with the weight already packed, for a kernel
    computing the padded `dims` (mp, kp, np_): (A, *packed, a_scale?, w_scale, bias?)."""
    pad = zero_padded  # copies only when the shape is not whole tiles
    mp, kp, np_ = dims
    a, _weight, *rest = tensors
    m = a.shape[0]  # the call's rows: the tuned M, or any M for kernels of any whole number of tasks
    a = pad(a, (0, kp - w.k, 0, mp - m))  # whole tiles and kb groups: zero-padded activations
    a_scale = [pad(rest.pop(0), (0, mp - m))] if quantized(w) else []
    per_channel = [pad(x, (0, np_ - w.n)) for x in rest]  # w_scale[, bias]
    return [a, *packed, *a_scale, *per_channel]


def padded_args(w: Workload, dims: tuple[int, int, int], packed: Sequence[Any], *tensors: Any
                ) -> tuple[list[Any], Any]:
    """`padded_inputs` and the output Y (mp, np_), and the (M, N) output the caller gets."""
    import torch

    mp, _, np_ = dims
    m = tensors[0].shape[0]
    args = padded_inputs(w, dims, packed, *tensors)
    out = torch.empty(mp, np_, dtype=torch.float32, device=args[0].device)
    # Padded rows and channels are computed and dropped: the caller gets an (M, N) view of the result.
    return [*args, out], out if (mp, np_) == (m, w.n) else out[:m, : w.n]


def traffic(w: Workload, *tensors: Any) -> Traffic:
    return Traffic(bytes=float(w.m * w.k * a_bytes(w) + w.n * w.k + w.m * w.n * 4), ops=2.0 * w.m * w.n * w.k,
                   unit="GOPS" if quantized(w) else "GFLOPS")


def tolerance(w: Workload) -> tuple[float, float]:
    return (1e-5, 1e-4) if quantized(w) else (1e-4, 1e-3)
