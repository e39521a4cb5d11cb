"""The embedding-bag workload: its fields and shape text, realistic inputs, PyTorch's semantics, and the
checks that keep a kernel inside its tensors.

The pieces every embedding-bag operator has (pooling and index-distribution fields, Zipf-skewed rows, ragged
bag sizes, the tensor checks) are written here once; `batched_embedding_bag` builds on them. No TVM here:
a package of exported kernels runs without it.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .._timed_inputs import timed_set_count
from ..template import IndexOutOfRange, InvalidDtype, InvalidInput, Traffic, Workload as _Workload, WorkloadError
from .fbgemm import tbe
from . import pages
from .rows import RowFormat, check_dtype, dequantize, quantize, table_dtype

MODES = ("sum", "mean", "max")
# the bits of a kernel's error flag (its last argument: 1 int32, zero on entry): what it met, for after_call
INDEX_ERROR = 1  # an index outside its table: not read, nothing added for it
OFFSETS_ERROR = 2  # offsets not from 0, decreasing or past the indices: no bag read them (CPU: nothing was pooled)
TABLE_OFFSETS_ERROR = 4  # batched: table_offsets not from 0, decreasing or past the weight's rows: likewise
INDEX_DTYPES = ("int64", "int32")
DISTRIBUTIONS = ("uniform", "zipf")


# ---- fields shared by the embedding-bag workloads -------------------------------------------------------
def parse_pooling(raw: str) -> tuple[int, int]:
    """`20-80` -> (20, 80); `20` -> (20, 20): indices per bag."""
    lo, sep, hi = raw.partition("-")
    try:
        return (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError:
        raise WorkloadError(f"pooling={raw!r}: expected N or MIN-MAX indices per bag") from None


def normalise_bag_fields(w: Any, positive: Iterable[str]) -> None:
    """Validate (WorkloadError) and normalise, in place, the fields of a frozen embedding-bag workload:
    `positive` sizes >= 1, `pooling` (an int -> (n, n)), `mode`, `index_dtype`, the tables' `dtype` and
    `distribution` (`zipf:1.05` -> "zipf" with that exponent)."""
    if w.distribution.startswith("zipf:"):
        try:
            exponent = float(w.distribution.split(":", 1)[1])
        except ValueError:
            raise WorkloadError(f"dist={w.distribution!r}: expected zipf:EXPONENT") from None
        object.__setattr__(w, "distribution", "zipf")
        object.__setattr__(w, "zipf_exponent", exponent)
    if w.distribution not in DISTRIBUTIONS:
        raise WorkloadError(f"distribution must be uniform or zipf[:EXPONENT], got {w.distribution!r}")
    if w.distribution == "zipf" and w.zipf_exponent <= 0:
        raise WorkloadError(f"zipf exponent must be > 0, got {w.zipf_exponent}")
    pooling = (w.pooling, w.pooling) if isinstance(w.pooling, int) else tuple(w.pooling)
    object.__setattr__(w, "pooling", pooling)
    for name in positive:
        if getattr(w, name) < 1:
            raise WorkloadError(f"{name} must be >= 1, got {getattr(w, name)}")
    lo, hi = pooling
    if not 0 <= lo <= hi:
        raise WorkloadError(f"pooling must be 0 <= min <= max, got {lo}-{hi}")
    if w.mode not in MODES:
        raise WorkloadError(f"mode must be one of {MODES}, got {w.mode!r}")
    if w.index_dtype not in INDEX_DTYPES:
        raise WorkloadError(f"index dtype must be one of {INDEX_DTYPES}, got {w.index_dtype!r}")
    why = check_dtype(w.dtype, w.dim)
    if why:
        raise WorkloadError(why)


@dataclass(frozen=True)
class Workload(_Workload):
    """One embedding-bag call: table shape, batch, bag sizes, index distribution and options.

    `pooling` is the (min, max) number of indices per bag; bag sizes are drawn uniformly in that range.
    `distribution` is "uniform" or "zipf" (row popularity ~ 1/rank**zipf_exponent, hot rows scattered),
    because real recommendation traffic is skewed and cache behaviour depends on it. `dtype` is how the table
    stores its rows (rows.py: float32, float16, bfloat16, or int8 in FBGEMM's fused row-wise layout).
    """

    rows: int
    dim: int
    batch: int
    pooling: tuple[int, int]
    mode: str = "sum"
    index_dtype: str = "int64"
    per_sample_weights: bool = False
    padding_idx: int | None = None
    include_last_offset: bool = False
    distribution: str = "uniform"
    zipf_exponent: float = 1.05
    dtype: str = "float32"

    SHAPE_ALIASES = {"index": "index_dtype", "weighted": "per_sample_weights", "dist": "distribution"}
    KEY_DEFAULTS = {"dtype": "float32"}

    @property
    def rows_format(self) -> RowFormat:
        return RowFormat(self.dtype, self.dim)

    def numeric_features(self) -> dict[str, float]:
        return {**super().numeric_features(), "row_bytes": float(self.rows_format.row_bytes)}

    @classmethod
    def parse_pooling(cls, raw: str) -> tuple[int, int]:
        return parse_pooling(raw)

    def __post_init__(self) -> None:
        normalise_bag_fields(self, ("rows", "dim", "batch"))
        if self.per_sample_weights and self.mode != "sum":
            raise WorkloadError("per_sample_weights is only supported with mode=sum (as in PyTorch)")
        if self.padding_idx is not None:
            pad = self.padding_idx + self.rows if self.padding_idx < 0 else self.padding_idx
            if not 0 <= pad < self.rows:
                raise WorkloadError(f"padding_idx {self.padding_idx} is out of range for {self.rows} rows")
            object.__setattr__(self, "padding_idx", pad)
        if self.index_dtype == "int32" and self.rows * self.rows_format.width >= 2**31:
            raise WorkloadError("int32 indices address at most 2**31 table elements")


# ---- realistic data -----------------------------------------------------------------------------------
def row_indices(rows: int, n: int, distribution: str, zipf_exponent: float, rng: np.random.Generator,
                hot_seed: int | tuple[int, ...] | None = None) -> np.ndarray:
    """n row indices, uniform or Zipf over ranks 1..rows (inverse CDF), hot ranks scattered by a permutation:
    drawn from `hot_seed` when given (so calls drawn with other generators share their hot rows, as a model's
    batches do; remembered for the next call, see `forget_hot_rows`), else from `rng`."""
    if distribution == "uniform":
        return rng.integers(0, rows, size=n)
    if hot_seed is None:
        cdf = _zipf_cdf(rows, zipf_exponent)
        hot = np.searchsorted(cdf, rng.random(n), side="right")
        return rng.permutation(rows)[np.minimum(hot, rows - 1)]
    cdf, scatter = _hot_rows(rows, zipf_exponent, hot_seed)
    return scatter[np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), rows - 1)]


def _zipf_cdf(rows: int, zipf_exponent: float) -> np.ndarray:
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -zipf_exponent)
    return cdf / cdf[-1]


@functools.lru_cache(maxsize=2)
def _hot_rows(rows: int, zipf_exponent: float, hot_seed: int | tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    return _zipf_cdf(rows, zipf_exponent), np.random.default_rng(hot_seed).permutation(rows)


def forget_hot_rows() -> None:
    """Free the remembered Zipf tables (16 bytes a row) once a task's inputs are made."""
    _hot_rows.cache_clear()


def bag_offsets(pooling: tuple[int, int], bags: int | tuple[int, ...], rng: np.random.Generator
                ) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, offsets): ragged bag sizes drawn uniformly in `pooling` (an array of shape `bags`), and the
    len(sizes) + 1 bag boundaries of their concatenation (row-major), the end of the last bag included."""
    lo, hi = pooling
    sizes = rng.integers(lo, hi + 1, size=bags)
    return sizes, boundaries(sizes.reshape(-1))


def boundaries(counts: Any) -> np.ndarray:
    """[0, c0, c0 + c1, ...]: the int64 start of each of `counts`' runs, and the end of the last."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def table(rows: int, dim: int, dtype: str, seed: int) -> Any:
    """A random (rows, dim) table of standard normal values in `dtype`'s storage (rows.py), in 2 MB pages as the
    modules keep theirs (pages.py)."""
    import torch

    return pages.in_huge_pages(quantize(torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)), dtype))


def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(weight, indices, offsets[, per_sample_weights]) as torch CPU tensors, in the reference's order."""
    weight = table(w.rows, w.dim, w.dtype, seed)
    out = (weight, *_bags(w, seed, np.random.default_rng(seed)))
    forget_hot_rows()
    return out


def _bags(w: Workload, seed: int, rng: np.random.Generator) -> tuple[Any, ...]:
    """(indices, offsets[, per_sample_weights]) of one call: a batch of bags drawn by `rng`, hot rows by `seed`."""
    import torch

    _, offsets = bag_offsets(w.pooling, w.batch, rng)
    nnz = int(offsets[-1])
    if not w.include_last_offset:
        offsets = offsets[:-1]
    indices = row_indices(w.rows, nnz, w.distribution, w.zipf_exponent, rng, hot_seed=seed)
    if w.padding_idx is not None and nnz:
        indices[rng.random(nnz) < 0.1] = w.padding_idx  # some padding to exercise the exclusion
    tdt = getattr(torch, w.index_dtype)
    out = [torch.from_numpy(indices).to(tdt), torch.from_numpy(offsets).to(tdt)]
    if w.per_sample_weights:
        out.append(torch.from_numpy(rng.random(nnz, dtype=np.float32)))
    return tuple(out)


# ---- calls that gather new rows -----------------------------------------------------------------------------
def timed_inputs(w: Workload, seed: int, tensors: tuple[Any, ...], cache_bytes: int) -> tuple[tuple[Any, ...], ...]:
    """The input sets timed calls cycle through: `tensors`, then batches of new bags on the same table.

    A model's every batch gathers other rows. Timing one batch again and again keeps its rows in cache: on a
    2-vCPU EPYC VM (32 MB L3), 1M x 64 rows at 32 per bag gather 16 MB a call, 0.43 ms with the same indices,
    1.29 ms with fresh ones, and the first swung with whatever else used the shared L3 (IQR 9-33% of the median
    against 4-11%; README, on measurement). Hot rows stay hot across sets (the same Zipf scatter)."""
    count = timed_set_count(traffic(w, *tensors).bytes, cache_bytes)
    rng = np.random.default_rng([seed, 1])
    sets = (tuple(tensors),) + tuple((tensors[0], *_bags(w, seed, rng)) for _ in range(count - 1))
    forget_hot_rows()
    return sets


# ---- semantics ----------------------------------------------------------------------------------------
def reference(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> Any:
    """F.embedding_bag of the table's float32 values (rows.py: a reduced-precision table dequantized)."""
    return pool_dequantized(w.dtype, weight, indices, offsets, per_sample_weights, mode=w.mode,
                            include_last_offset=w.include_last_offset, padding_idx=w.padding_idx)


def pool_dequantized(dtype: str, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None,
                     **options: Any) -> Any:
    """F.embedding_bag (`options`: its keywords) over the float32 values of a `dtype` table, dequantizing only
    the rows the indices name (a whole table would cost a copy of it per call). Indices must be in range."""
    import torch

    F = torch.nn.functional
    if dtype == "float32":
        return F.embedding_bag(indices, weight, offsets, per_sample_weights=per_sample_weights, **options)
    used, local = torch.unique(indices, return_inverse=True)
    pad = options.pop("padding_idx", None)
    if pad is not None:
        pad = pad + weight.shape[0] if pad < 0 else pad
        hit = (used == pad).nonzero()
        pad = int(hit[0, 0]) if hit.numel() else None  # absent from the indices: nothing to exclude
    values = dequantize(weight[used], dtype)
    return F.embedding_bag(local.to(indices.dtype), values, offsets, per_sample_weights=per_sample_weights,
                           padding_idx=pad, **options)


def baselines(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None
              ) -> dict[str, Callable[[], Any]]:
    """PyTorch's way, F.embedding_bag itself (one call, its own fused kernel), over the float32 table (a
    reduced-precision one is dequantized once: PyTorch's fp32 model is what it is measured against), in the same
    2 MB pages as the kernels' table, and over a copy in memory PyTorch allocates ("torch_own_memory": 4 KB pages
    unless THP is `always`, the table of a PyTorch model); for int8 rows also PyTorch's own int8 embedding bag
    (FBGEMM's fused row-wise kernel); and FBGEMM's TBE at the table's precision where fbgemm-gpu-cpu is installed
    (fbgemm.py). Not PyTorch's fp16/bf16 bags: they write fp16/bf16."""
    import torch

    F, values = torch.nn.functional, float32_table(weight, w.dtype)
    own = own_memory_table(values)
    options = dict(mode=w.mode, per_sample_weights=per_sample_weights, include_last_offset=w.include_last_offset,
                   padding_idx=w.padding_idx)
    calls = {"torch": lambda: F.embedding_bag(indices, values, offsets, **options)}
    if own is not values:
        calls["torch_own_memory"] = lambda: F.embedding_bag(indices, own, offsets, **options)
    plain = w.padding_idx is None and per_sample_weights is None and w.mode != "max"
    if w.dtype == "int8" and plain:
        calls["torch_int8"] = lambda: torch.ops.quantized.embedding_bag_byte_rowwise_offsets(
            weight, indices, offsets, False, 0 if w.mode == "sum" else 1, False, None, None, w.include_last_offset)
    fbgemm_tbe = tbe(w.dtype, [weight], w.mode) if plain else None
    if fbgemm_tbe is not None:
        ends = offsets if w.include_last_offset else torch.cat([offsets, offsets.new_tensor([indices.numel()])])
        idx, ends = indices.int(), ends.int()
        calls[f"fbgemm_tbe_{w.dtype}"] = lambda: fbgemm_tbe(idx, ends)
    return calls


@functools.lru_cache(maxsize=1)
def float32_table(weight: Any, dtype: str) -> Any:
    """The float32 values of a whole table, once for the batches that share it (the baselines' PyTorch fp32), in
    2 MB pages as the table itself."""
    return weight if dtype == "float32" else pages.in_huge_pages(dequantize(weight, dtype))


@functools.lru_cache(maxsize=1)
def own_memory_table(values: Any) -> Any:
    """A copy of a float32 table in memory PyTorch allocates, once for the batches that share it (the baselines'
    "torch_own_memory"); `values` itself where it is too small to have been put in 2 MB pages."""
    import torch

    paged = values.is_cpu and values.numel() * values.element_size() >= pages.MIN_TABLE_BYTES
    return torch.empty_like(values).copy_(values) if paged else values


def gathered(nnz: int, dim: int, row_bytes: int | None = None) -> Traffic:
    """Gathered bytes: every pooled index reads one table row (`row_bytes`: fp32 unless given), the figure FBGEMM
    and papers report; `dim` adds per pooled index."""
    return Traffic(bytes=float(nnz * (dim * 4 if row_bytes is None else row_bytes)), ops=float(nnz * dim),
                   unit="GB/s")


def traffic(w: Workload, weight: Any, indices: Any, offsets: Any, per_sample_weights: Any = None) -> Traffic:
    return gathered(int(offsets[-1]) if w.include_last_offset else indices.numel(), w.dim, w.rows_format.row_bytes)


def tolerance(w: Any) -> tuple[float, float]:
    """fp32 sums of up to max-pooling rows: the absolute error grows with the bag."""
    return (1e-4, 1e-4 * max(1, w.pooling[1]))


# ---- input checks shared by the embedding-bag operators -------------------------------------------------
Need = Callable[..., None]  # need(cond, msg, exc=InvalidInput): raise exc("<op>: msg") unless cond


def needs(op: str) -> Need:
    """The checker of one operator: its messages start with its name."""
    def need(cond: bool, msg: str, exc: type[Exception] = InvalidInput) -> None:
        if not cond:
            raise exc(f"{op}: {msg}")
    return need


def check_tensors(need: Need, tensors: Mapping[str, Any]) -> None:
    """Each a contiguous torch.Tensor, all on one device (any: the kernel's, CPU or GPU)."""
    import torch

    for name, t in tensors.items():
        need(isinstance(t, torch.Tensor), f"{name} must be a torch.Tensor, got {type(t).__name__}", InvalidDtype)
        need(t.is_contiguous(), f"{name} must be contiguous")
    need(len({t.device for t in tensors.values()}) == 1, "all tensors must be on one device, got "
         + ", ".join(f"{name} on {t.device}" for name, t in tensors.items()))


def check_table(need: Need, weight: Any, fmt: RowFormat, rows: str) -> None:
    """A (rows, width) table in the kernel's row format (rows.py); 16-byte aligned on a GPU, whose kernels read
    rows with vector loads (a misaligned view would fault, and kill the context)."""
    from .rows import torch_storage

    held = table_dtype(weight)
    need(weight.dtype == torch_storage(fmt.dtype), f"weight must hold {fmt.dtype} rows "
         f"({torch_storage(fmt.dtype)}), got {weight.dtype}" + (f" ({held} rows)" if held else ""), InvalidDtype)
    layout = " (FBGEMM's fused rows: dim int8 values, then a float32 scale and bias)" if fmt.fused else ""
    need(weight.dim() == 2 and weight.shape[1] == fmt.width,
         f"weight must be ({rows}, {fmt.width}){layout}, got {tuple(weight.shape)}")
    need(weight.device.type != "cuda" or weight.data_ptr() % 16 == 0,
         "weight must start 16-byte aligned on the GPU (vector loads); pass a fresh tensor or a .clone()")


def check_index_tensors(need: Need, index_dtype: str, indices: Any, offsets: Any) -> None:
    """1-D indices and offsets of the compiled-in index dtype."""
    import torch

    idt = getattr(torch, index_dtype)
    need(indices.dtype == idt and offsets.dtype == idt,
         f"indices and offsets must be {index_dtype}, got {indices.dtype} and {offsets.dtype}", InvalidDtype)
    need(indices.dim() == 1 and offsets.dim() == 1, "indices and offsets must be 1-D")


def check_monotone(need: Need, name: str, t: Any, limit: int, what: str) -> None:
    """Boundaries from 0, non-decreasing, ending within `limit` (e.g. offsets into the indices)."""
    need(int(t[0]) == 0, f"{name}[0] must be 0, got {int(t[0])}")
    need(bool((t[1:] >= t[:-1]).all()), f"{name} must be non-decreasing")
    need(int(t[-1]) <= limit, f"{name}[-1] = {int(t[-1])} exceeds the {limit} {what}")


def first_out_of_range(indices: Any, rows: Any) -> int | None:
    """The position of the first index outside [0, rows) (`rows`: a count, or one per index), or None."""
    bad = (indices < 0) | (indices >= rows)
    return int(bad.nonzero()[0, 0]) if bool(bad.any()) else None


_need = needs("autotune.embedding_bag")  # the torch op's messages: check_data serves it (checks.py) too


def check_data(rows: int, indices: Any, offsets: Any) -> None:
    """F.embedding_bag's checks of the data: indices in [0, rows), offsets from 0, non-decreasing, within the
    indices. One pass over each tensor; where one fails, another finds the first culprit for the message. What
    the CPU kernels check themselves as they gather (`after_call` explains their flag with it)."""
    n = indices.numel()
    lo, hi, first, last, ordered = _index_facts(indices, offsets)
    if n and not (lo >= 0 and hi < rows):
        i = indices.detach().cpu().numpy()
        k = int(np.flatnonzero((i < 0) | (i >= rows))[0])
        _need(False, f"indices must be in [0, {rows}), got values in [{lo}, {hi}] (index {int(i[k])} at "
              f"position {k})", IndexOutOfRange)
    if offsets.numel():
        _need(first == 0, f"offsets[0] must be 0 (the first bag starts at the first index), got {first}")
        if not ordered:
            o = offsets.detach().cpu().numpy()
            k = int(np.flatnonzero(o[1:] < o[:-1])[0])
            _need(False, f"offsets must be non-decreasing, got offsets[{k + 1}] = {int(o[k + 1])} after "
                  f"offsets[{k}] = {int(o[k])}")
        _need(last <= n, f"offsets[-1] = {last} exceeds the number of indices ({n})")


def _index_facts(indices: Any, offsets: Any) -> tuple[int, int, int, int, bool]:
    """(min index, max index, offsets[0], offsets[-1], offsets non-decreasing): the data checks' inputs, read in
    one pass per tensor. On the CPU through NumPy views (a few small torch ops would cost several times more
    per call); on a GPU with one synchronisation."""
    n, b = indices.numel(), offsets.numel()
    if indices.device.type != "cpu":
        return _index_facts_device(indices, offsets)
    i, o = indices.detach().numpy(), offsets.detach().numpy()
    return (int(i.min()) if n else 0, int(i.max()) if n else 0, int(o[0]) if b else 0, int(o[-1]) if b else 0,
            bool((o[1:] >= o[:-1]).all()))


def _index_facts_device(indices: Any, offsets: Any) -> tuple[int, int, int, int, bool]:
    import torch

    n, b = indices.numel(), offsets.numel()
    zero = indices.new_zeros(())
    lo, hi = torch.aminmax(indices) if n else (zero, zero)
    ends = offsets[[0, -1]].to(indices.dtype) if b else zero.expand(2)
    ordered = (offsets[1:] >= offsets[:-1]).all().to(indices.dtype)
    lo, hi, first, last, ok = torch.stack([lo, hi, ends[0], ends[1], ordered]).tolist()
    return lo, hi, first, last, bool(ok)


def pack(w: Any, cfg: Any, *weights: Any) -> tuple[Any, ...]:
    """Nothing to pack (WEIGHTS is empty): the kernels gather rows from the tables as they are."""
    return weights


def kernel_args(w: Workload, cfg: Any, packed: Sequence[Any], weight: Any, indices: Any, offsets: Any,
                per_sample_weights: Any = None) -> tuple[Sequence[Any], Any]:
    """The table is read in place (no packed weights): arguments are the inputs plus a new output, allocated on
    the inputs' device, and the error flag (error_flag)."""
    import torch

    bags = offsets.numel() - (1 if w.include_last_offset else 0)
    out = torch.empty(bags, w.dim, dtype=torch.float32, device=weight.device)
    args = [weight, indices, offsets] + ([per_sample_weights] if w.per_sample_weights else []) + [out]
    args.append(error_flag(weight))
    return args, out


# ---- the kernels' error flag ----------------------------------------------------------------------------
_LOCAL = threading.local()  # .flag: this thread's CPU flag and its NumPy view
_DEVICE_FLAGS: dict[Any, Any] = {}  # device -> the flag every call on it shares (never read: see error_flag)


def error_flag(like: Any) -> Any:
    """The kernel's error flag (1 int32, zero on entry) for a call on the device of the tensor `like`.

    On the CPU each thread reuses its own, reset here through a NumPy view: 0.3 us against 3.8 us for a new
    torch.zeros (`like.is_cpu`: `device.type` alone costs 0.8 us), and the read after the call costs 0.4 us
    the same way. On a GPU the flag is not read (that would wait for the kernel: the torch op checks CUDA
    inputs on the host, and the kernels clamp what they read), so one per device serves every call and is
    never reset."""
    if like.is_cpu:
        cached = getattr(_LOCAL, "flag", None)
        if cached is None:
            import torch

            flag = torch.zeros(1, dtype=torch.int32)
            cached = _LOCAL.flag = (flag, flag.numpy())
        cached[1][0] = 0
        return cached[0]
    flag = _DEVICE_FLAGS.get(like.device)
    if flag is None:
        import torch

        flag = _DEVICE_FLAGS.setdefault(like.device, torch.zeros(1, dtype=torch.int32, device=like.device))
    return flag


def flagged(flag: Any) -> int:
    """What a CPU kernel's flag says after its call (0: nothing); 0 for a flag on another device (unread)."""
    cached = getattr(_LOCAL, "flag", None)
    if cached is not None and cached[0] is flag:
        return cached[1].item()
    return int(flag.numpy()[0]) if flag.is_cpu else 0


def flag_error(code: int, what: str) -> Exception:
    """The error of a flag (its bits) whose host-side re-check found nothing more precise to say."""
    if code & TABLE_OFFSETS_ERROR:
        return InvalidInput(f"{what}: malformed table_offsets: a table outside the weight's rows")
    if code & OFFSETS_ERROR:
        return InvalidInput(f"{what}: malformed offsets: a bag starts before 0 or after its end, or ends past the "
                            "indices, or offsets[0] is not 0")
    return IndexOutOfRange(f"{what}: an index is out of range for its table (the kernel read nothing for it)")


def after_call(w: Workload, args: Sequence[Any], out: Any) -> None:
    """Raise what the kernel flagged (CPU only; see error_flag), the message found by re-checking the inputs:
    that costs a pass over them, but only once a call has failed."""
    code = flagged(args[-1])
    if code:
        check_data(args[0].shape[0], args[1], args[2])
        raise flag_error(code, "embedding_bag")
