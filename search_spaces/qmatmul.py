"""Quantized matmul as DLRM's MLPs use it: `Y = epilogue(A @ W.T)` with W stored (N, K) like nn.Linear.

mode=int8: int8 activations x int8 weights -> exact int32 accumulation, then a fused epilogue:
    Y = relu?(acc * a_scale[m] * w_scale[n] + bias[n])   (per-row activation scale, per-channel weight scale)
mode=weight_only: fp32 activations x int8 weights with per-channel scales:
    Y = relu?((A @ W.T) * w_scale[n] + bias[n])

The weight is packed once into a tiled layout chosen by the config (`pack`), so the inner loop reads the
weight contiguously and, with an int8 intrinsic, in exactly the shape the instruction consumes. The VNNI path
multiplies unsigned activations (A + 128) by signed weights; the exact result is restored by subtracting
128 * sum_k W[n, k], a per-channel term computed at packing time, as FBGEMM does.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import intrinsics
from .space import Choice, Config, Constraint, InvalidConfig, Space
from .template import Traffic, Workload as _Workload, WorkloadError

NAME = "qmatmul"
DOC = "int8 x int8 -> int32 matmul with a fused dequant/bias/ReLU epilogue; or int8 weight-only"
EXAMPLE_SHAPE = "m=2048,k=1024,n=1024"
WEIGHTS = (1,)  # the weight (reference argument 1) is packed once, outside the timed call


@dataclass(frozen=True)
class Workload(_Workload):
    m: int
    k: int
    n: int
    mode: str = "int8"
    bias: bool = True
    relu: bool = False

    def __post_init__(self) -> None:
        for name in ("m", "k", "n"):
            if getattr(self, name) < 1:
                raise WorkloadError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mode not in ("int8", "weight_only"):
            raise WorkloadError(f"mode must be int8 or weight_only, got {self.mode!r}")


# ---- knobs ----------------------------------------------------------------------------------------------
INTRINSIC = Choice("intrinsic", ("none", "avx2", "vnni"), doc=(
    "The int8 inner product: LLVM's own vectorisation (widens to int32 and multiplies: slow), AVX2 "
    "sign-extension + pmaddwd (exact, 8 lanes x 2), or AVX-512 VNNI vpdpbusd (16 lanes x 4). Only the "
    "ones the target CPU has are offered."))
LAYOUT = Choice("layout", ("n16k4", "n8k2", "n16k1", "n8k1"), doc=(
    "Packed weight layout (N/nb, K/kb, nb, kb): nb output channels side by side for vector lanes, kb "
    "consecutive k per lane for multi-k dot instructions. Fixed by the intrinsic when one is used."))
M_TILE = Choice("m_tile", (4, 1, 2, 6, 8), doc=(
    "Rows of the register tile: each loaded weight vector is reused for this many rows."))
N_VECTORS = Choice("n_vectors", (2, 1, 4), doc=(
    "Weight vectors (of nb channels) per register tile: accumulators = m_tile x n_vectors registers."))
K_BLOCK = Choice("k_block", (0, 64, 128, 256, 512), doc=(
    "Cache blocking of the reduction (0 = none): a K block of weights stays in L1/L2 across the rows."))
M_BLOCK = Choice("m_block", (64, 16, 32, 128, 256), doc=(
    "Rows per parallel task (rounded down to whole register tiles): the task's activation rows stay in "
    "cache while it sweeps the weight columns."))
N_BLOCK = Choice("n_block", (64, 32, 128, 256), doc=(
    "Columns per parallel task (rounded down to whole register tiles): the task's packed weights stay in "
    "L2 while it sweeps its rows."))
UNROLL = Choice("unroll", (True, False), doc="Unroll the register tile so accumulators stay in registers.")
THREADING = Choice("threading", ("parallel", "serial"), doc="Spread (m_block x n_block) tasks over cores.")

_LAYOUT_SHAPE = {"n16k4": (16, 4), "n8k2": (8, 2), "n16k1": (16, 1), "n8k1": (8, 1)}
_INTRIN_LAYOUT = {"vnni": "n16k4", "avx2": "n8k2"}


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def space(w: Workload, target: Any) -> Space:
    if target.kind.name != "llvm":
        raise InvalidConfig(f"qmatmul has no schedule for target kind {target.kind.name!r} yet")
    intrins = ["none"]
    if w.mode == "int8":
        if intrinsics.cpu_has(target, "avx2"):
            intrins.append("avx2")
        if intrinsics.cpu_has(target, "avx512vnni", "avx512bw"):
            intrins.append("vnni")

    def layout_ok(c: Config) -> bool:
        if c[INTRINSIC] in _INTRIN_LAYOUT:
            return c[LAYOUT] == _INTRIN_LAYOUT[c[INTRINSIC]]
        return w.mode == "weight_only" or c[LAYOUT] in ("n16k1", "n8k1", "n16k4", "n8k2")

    layouts = LAYOUT.options if w.mode == "int8" else ("n16k1", "n8k1")
    return Space([INTRINSIC.only(intrins), LAYOUT.only(layouts), M_TILE, N_VECTORS, K_BLOCK, M_BLOCK,
                  N_BLOCK, UNROLL, THREADING],
                 [Constraint("the intrinsic fixes the layout", layout_ok),
                  Constraint("k_block below K only", lambda c: c[K_BLOCK] < _round_up(w.k, 4)),
                  Constraint("weight-only has no int8 intrinsic", lambda c: w.mode == "int8" or c[INTRINSIC] == "none")])


def padded(w: Workload, cfg: Config) -> tuple[int, int, int]:
    """(M, K, N) rounded up to whole register tiles (m_tile rows, n_vectors x nb columns) and kb groups.

    Whole tiles keep predicates out of the tensorized blocks (TVM cannot tensorize a guarded block); the
    padding holds zeros and its results are dropped."""
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    return _round_up(w.m, cfg[M_TILE]), _round_up(w.k, kb), _round_up(w.n, nb * cfg[N_VECTORS])


def _block(extent: int, want: int, tile: int) -> int:
    """The largest multiple of `tile` that divides `extent` (itself a multiple of tile) and is <= want."""
    size = max(tile, min(want, extent) // tile * tile)
    while extent % size:
        size -= tile
    return size


# ---- the computation -------------------------------------------------------------------------------------
def compute(w: Workload, cfg: Config) -> Any:
    """TE definition over the packed weight; argument order (A, Wp, [comp], a_scale?, w_scale, [bias], Y)."""
    import tvm
    from tvm import te

    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    mp, kp, np_ = padded(w, cfg)
    int8 = w.mode == "int8"
    vnni = cfg[INTRINSIC] == "vnni"
    A = te.placeholder((mp, kp), "int8" if int8 else "float32", name="A")
    Wp = te.placeholder((np_ // nb, kp // kb, nb, kb), "int8", name="Wp")
    w_scale = te.placeholder((np_,), "float32", name="w_scale")
    args = [A, Wp]
    k = te.reduce_axis((0, kp), name="k")
    if int8:
        if vnni:
            comp = te.placeholder((np_,), "int32", name="comp")
            args.append(comp)
            Au = te.compute((mp, kp), lambda i, j: (A[i, j].astype("int32") + 128).astype("uint8"), name="Au")
            src = Au
        else:
            src = A
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            src[i, k].astype("int32") * Wp[j // nb, k // kb, j % nb, k % kb].astype("int32"), axis=k), name="C")
        a_scale = te.placeholder((mp,), "float32", name="a_scale")
        args += [a_scale, w_scale]

        def value(i: Any, j: Any) -> Any:
            c = acc[i, j] - comp[j] if vnni else acc[i, j]
            return c.astype("float32") * a_scale[i] * w_scale[j]
    else:
        acc = te.compute((mp, np_), lambda i, j: te.sum(
            A[i, k] * Wp[j // nb, k // kb, j % nb, k % kb].astype("float32"), axis=k), name="C")
        args.append(w_scale)

        def value(i: Any, j: Any) -> Any:
            return acc[i, j] * w_scale[j]
    if w.bias:
        bias = te.placeholder((np_,), "float32", name="bias")
        args.append(bias)
    epilogue: Callable[[Any, Any], Any] = (lambda i, j: value(i, j) + bias[j]) if w.bias else value
    final = (lambda i, j: te.max(epilogue(i, j), tvm.tirx.const(0, "float32"))) if w.relu else epilogue
    Y = te.compute((mp, np_), final, name="Y")
    return tvm.IRModule({"main": te.create_prim_func(args + [Y])})


def schedule(sch: Any, w: Workload, cfg: Config, target: Any) -> None:
    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    mp, kp, np_ = padded(w, cfg)
    mt, nv = cfg[M_TILE], cfg[N_VECTORS]
    y, c = sch.get_sblock("Y"), sch.get_sblock("C")
    i, j = sch.get_loops(y)
    mb, nblk = _block(mp, cfg[M_BLOCK], mt), _block(np_, cfg[N_BLOCK], nb * nv)
    io, ii = sch.split(i, [None, mb])
    jo, ji = sch.split(j, [None, nblk])
    sch.reorder(io, jo, ii, ji)
    outer = sch.fuse(io, jo)
    if cfg[THREADING] == "parallel":
        sch.parallel(outer)
    iio, iii = sch.split(ii, [None, mt])
    jio, jii = sch.split(ji, [None, nb * nv])
    sch.reorder(iio, jio, iii, jii)
    sch.compute_at(c, jio, preserve_unit_loops=True)
    if cfg[INTRINSIC] == "vnni":  # A + 128 as u8 once for all column blocks, in its own parallel loop
        au_i, au_j = sch.get_loops(sch.get_sblock("Au"))
        sch.parallel(au_i)
        sch.vectorize(sch.split(au_j, [None, 64])[1] if kp % 64 == 0 else au_j)
    ci, cj, ck = sch.get_loops(c)[-3:]
    cjo, cji = sch.split(cj, [nv, nb])
    cko, cki = sch.split(ck, [None, kb])
    kblk = cfg[K_BLOCK]
    if kblk and kp % kblk == 0 and kblk < kp:
        ckoo, ckoi = sch.split(cko, [None, kblk // kb])
        sch.reorder(ckoo, ckoi, ci, cjo, cji, cki)
        first_k = ckoo
    else:
        sch.reorder(cko, ci, cjo, cji, cki)
        first_k = cko
    if cfg[UNROLL]:
        sch.unroll(ci)
        sch.unroll(cjo)
    intrin = cfg[INTRINSIC]
    if intrin == "none":  # vectorise before decomposing: the update block alone is not a reduction
        sch.reorder(cki, cji)  # lanes innermost: one vector multiply-add chain per k
        sch.unroll(cki)
        sch.vectorize(cji)
    init = sch.decompose_reduction(c, first_k)
    sch.vectorize(sch.get_loops(init)[-1])
    if intrin != "none":
        sch.tensorize(cji, intrinsics.ensure(intrinsics.VNNI_16x4 if intrin == "vnni" else intrinsics.AVX2_8x2))
    sch.vectorize(jii)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    from tvm.s_tir import Schedule

    sch = Schedule(compute(w, cfg))
    schedule(sch, w, cfg, target)
    return sch.mod


# ---- packing, data, reference ------------------------------------------------------------------------------
def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    """The weight (N, K) int8 in the config's layout (N/nb, K/kb, nb, kb), zero-padded; plus, for VNNI,
    the compensation 128 * sum_k W[n, k] (int32, per channel)."""
    import torch

    nb, kb = _LAYOUT_SHAPE[cfg[LAYOUT]]
    _, kp, np_ = padded(w, cfg)
    wp = torch.zeros(np_, kp, dtype=torch.int8)
    wp[: w.n, : w.k] = weight
    packed = wp.view(np_ // nb, nb, kp // kb, kb).permute(0, 2, 1, 3).contiguous()
    if cfg[INTRINSIC] == "vnni":
        return packed, (wp.to(torch.int32).sum(1) * 128).to(torch.int32)
    return (packed,)


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(A, W, a_scale, w_scale[, bias]) for int8; (A, W, w_scale[, bias]) for weight-only."""
    import torch

    g = torch.Generator().manual_seed(seed)
    wt = torch.randint(-128, 128, (w.n, w.k), generator=g, dtype=torch.int8)
    w_scale = torch.rand(w.n, generator=g) * 0.01 + 1e-3
    bias = [torch.randn(w.n, generator=g)] if w.bias else []
    if w.mode == "int8":
        a = torch.randint(-128, 128, (w.m, w.k), generator=g, dtype=torch.int8)
        a_scale = torch.rand(w.m, generator=g) * 0.05 + 1e-3
        return (a, wt, a_scale, w_scale, *bias)
    a = torch.randn(w.m, w.k, generator=g)
    return (a, wt, w_scale, *bias)


def accumulate(w: Workload, a: Any, weight: Any) -> Any:
    """A @ W.T exactly: int32 for int8 mode (through float64, exact below 2**53), fp32 otherwise."""
    if w.mode == "int8":
        return (a.double() @ weight.double().t()).to(__import__("torch").int32)
    return a @ weight.float().t()


def reference(w: Workload, *tensors: Any) -> Any:
    import torch

    if w.mode == "int8":
        a, weight, a_scale, w_scale, *rest = tensors
        y = accumulate(w, a, weight).float() * a_scale[:, None] * w_scale[None, :]
    else:
        a, weight, w_scale, *rest = tensors
        y = accumulate(w, a, weight) * w_scale[None, :]
    if w.bias:
        y = y + rest[0]
    return torch.relu(y) if w.relu else y


def baselines(w: Workload, *tensors: Any) -> dict[str, Callable[[], Any]]:
    """PyTorch's fastest CPU paths for the same arithmetic, prepared outside the timed call."""
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

    if w.m > 16 and w.k % 8 == 0 and w.n % 8 == 0:
        out["torch._int_mm + epilogue"] = int_mm
    try:  # fbgemm's quantized linear: u8 activations (one scale), per-channel s8 weights, u8 output
        warnings.filterwarnings("ignore", message=".*quantize_per_.*deprecated", category=UserWarning)
        torch.backends.quantized.engine = "fbgemm"
        qw = torch.quantize_per_channel(weight.float() * w_scale[:, None], w_scale.double(),
                                        torch.zeros(w.n, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, b)
        a_real = a.float() * a_scale[:, None]
        qa = torch.quantize_per_tensor(a_real, float(a_real.abs().max()) / 127, 128, torch.quint8)
        y_max = float(int_mm().abs().max()) if "torch._int_mm + epilogue" in out else 1e3
        out_scale, out_zero = 2 * y_max / 255, 128
        linear = torch.ops.quantized.linear_relu if w.relu else torch.ops.quantized.linear
        out["quantized.linear (fbgemm)"] = lambda: linear(qa, packed, out_scale, out_zero).dequantize()
    except (RuntimeError, AttributeError):
        pass
    return out


def check_inputs(w: Workload, *tensors: Any) -> None:
    import torch

    def need(cond: bool, msg: str, exc: type[Exception] = ValueError) -> None:
        if not cond:
            raise exc(f"qmatmul: {msg}")

    names = (["a", "weight", "a_scale", "w_scale"] if w.mode == "int8" else ["a", "weight", "w_scale"])
    names += ["bias"] if w.bias else []
    need(len(tensors) == len(names), f"expected ({', '.join(names)}), got {len(tensors)} tensors", TypeError)
    t = dict(zip(names, tensors))
    for name, x in t.items():
        need(isinstance(x, torch.Tensor), f"{name} must be a torch.Tensor", TypeError)
        need(x.device.type == "cpu", f"{name} is on {x.device}, this kernel runs on cpu")
        need(x.is_contiguous(), f"{name} must be contiguous")
    a_dtype = torch.int8 if w.mode == "int8" else torch.float32
    need(t["a"].dtype == a_dtype, f"a must be {a_dtype}, got {t['a'].dtype}", TypeError)
    need(tuple(t["a"].shape) == (w.m, w.k), f"a must be ({w.m}, {w.k}), got {tuple(t['a'].shape)}")
    need(t["weight"].dtype == torch.int8, f"weight must be int8, got {t['weight'].dtype}", TypeError)
    need(tuple(t["weight"].shape) == (w.n, w.k), f"weight must be ({w.n}, {w.k}), got {tuple(t['weight'].shape)}")
    for name, size in (("a_scale", w.m), ("w_scale", w.n), ("bias", w.n)):
        if name in t:
            need(t[name].dtype == torch.float32, f"{name} must be float32", TypeError)
            need(tuple(t[name].shape) == (size,), f"{name} must be ({size},), got {tuple(t[name].shape)}")


def kernel_args(w: Workload, cfg: Config, packed: Sequence[Any], *tensors: Any) -> tuple[list[Any], Any]:
    """Kernel arguments from reference-order tensors with the weight already packed by `pack`."""
    import torch

    def pad(x: Any, widths: tuple[int, ...]) -> Any:  # copies only when the shape is not whole tiles
        return torch.nn.functional.pad(x, widths) if any(widths) else x

    mp, kp, np_ = padded(w, cfg)
    a, _weight, *rest = tensors
    a = pad(a, (0, kp - w.k, 0, mp - w.m))  # whole tiles and kb groups: zero-padded activations
    a_scale = [pad(rest.pop(0), (0, mp - w.m))] if w.mode == "int8" else []
    per_channel = [pad(x, (0, np_ - w.n)) for x in rest]  # w_scale[, bias]
    out = torch.empty(mp, np_, dtype=torch.float32)
    # Padded rows and channels are computed and dropped: the caller gets an (M, N) view of the result.
    return [a, *packed, *a_scale, *per_channel, out], out if (mp, np_) == (w.m, w.n) else out[: w.m, : w.n]


def traffic(w: Workload, *tensors: Any) -> Traffic:
    elem = 1 if w.mode == "int8" else 4
    return Traffic(bytes=float(w.m * w.k * elem + w.n * w.k + w.m * w.n * 4), ops=2.0 * w.m * w.n * w.k,
                   unit="GOPS" if w.mode == "int8" else "GFLOPS")


def tolerance(w: Workload) -> tuple[float, float]:
    return (1e-5, 1e-4) if w.mode == "int8" else (1e-4, 1e-3)
