"""The fused embedding bags + dot interaction: fields and shape text, inputs, PyTorch's semantics (the table-
batched embedding bag, then DLRM's dot interaction), checks and kernel arguments. No TVM here.

It is two operators in one call, and says so: the bags are `batched_embedding_bag`'s (FBGEMM's TBE layout, sum
pooling; its inputs, checks and error flag), the interaction `interaction`'s (`dot_interaction`) on the dense
vector `x` and the T pooled rows of each sample. The fused kernel never writes the (B, T, D) pooled rows
between them; everything else is the two operators' meaning, taken from their workloads.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ..batched_embedding_bag import workload as batched
from ..embedding_bag.rows import RowFormat, dequantize
from ..embedding_bag.workload import check_monotone, error_flag, flag_error, flagged, needs
from ..interaction import workload as interaction
from ..interaction.workload import dot_interaction
from ..template import InvalidDtype, InvalidInput, IndexOutOfRange, Traffic, Workload as _Workload, WorkloadError

__all__ = ["BAG_FIELDS", "KernelArgs", "OP", "RENAMED", "Workload", "after_call", "bag_columns", "baselines",
           "check_inputs", "inputs", "kernel_args", "magnitude_args", "pack", "reference", "timed_inputs", "tolerance",
           "traffic"]

OP = "embedding_interaction"
# The kernel's `bags` argument, (BAG_FIELDS, tables) int64: for table t, the address of its indices and of its B
# offsets (where the caller holds them: no copy into one layout), the first index its bags may start at and the
# end of its indices (its last bag's end). A list of per-table tensors gives (data_ptr, data_ptr, 0, numel);
# FBGEMM's TBE layout (one index tensor, table-major offsets) gives the index tensor's address for every table,
# table t's B offsets, and its boundaries [offsets[t * B], offsets[(t + 1) * B]].
BAG_INDICES, BAG_OFFSETS, BAG_FIRST, BAG_END = range(4)
BAG_FIELDS = 4
DOT_DTYPES = ("float32", "bfloat16")
BF16_PRODUCT_RTOL = 2.0 ** -7  # two roundings to bf16 (8 significant bits) each move a product by <= 2^-8 of it


@dataclass(frozen=True)
class Workload(_Workload):
    """One call: T tables of `rows` (batched_embedding_bag's shape text: `rows=200000x4+1000x22`), each bag
    summing `pooling` = (min, max) rows of dimension `dim`, `batch` samples, and the dot interaction of each
    sample's dense vector with its T pooled rows (`self_interaction` keeps the diagonal). `dtype` is how the
    tables store their rows (embedding_bag's rows.py); `index_dtype`, `distribution` and `zipf_exponent` are the
    bags' (`dist=zipf:1.05`). `dot_dtype` is the coarsest rounding the dot products' inputs may take
    (`dot=bfloat16`): "bfloat16" lets a kernel multiply bf16 roundings of the features with fp32 sums (AMX's
    tile products), and widens the tolerance by what two roundings to bf16 move a product."""

    rows: tuple[int, ...]
    dim: int
    batch: int
    pooling: tuple[int, int]
    tables: int = 0  # 0: as many as `rows` lists
    self_interaction: bool = False
    index_dtype: str = "int64"
    distribution: str = "uniform"
    zipf_exponent: float = 1.05
    dtype: str = "float32"
    dot_dtype: str = "float32"

    SHAPE_ALIASES = {"index": "index_dtype", "dist": "distribution", "self": "self_interaction", "dot": "dot_dtype"}

    parse_rows = batched.Workload.parse_rows  # the bags' shape text: `rows=...` and `pooling=MIN-MAX`
    parse_pooling = batched.Workload.parse_pooling

    def __post_init__(self) -> None:
        b = self.bags  # validates and normalises the bag fields (rows, tables, pooling, distribution, dtype)
        for name in ("rows", "tables", "pooling", "distribution", "zipf_exponent"):
            object.__setattr__(self, name, getattr(b, name))
        _ = self.dots  # validates the interaction's fields (batch, tables, dim) as it does
        if self.dot_dtype not in DOT_DTYPES:
            raise WorkloadError(f"dot_dtype must be one of {', '.join(DOT_DTYPES)}, got {self.dot_dtype!r}")

    @functools.cached_property
    def bags(self) -> batched.Workload:
        """The table-batched embedding bag (sum pooling) this call's bags are (made once: kernel_args reads it)."""
        return batched.Workload(rows=self.rows, dim=self.dim, batch=self.batch, pooling=self.pooling,
                                tables=self.tables, mode="sum", index_dtype=self.index_dtype,
                                distribution=self.distribution, zipf_exponent=self.zipf_exponent, dtype=self.dtype)

    @functools.cached_property
    def dots(self) -> interaction.Workload:
        """The dot interaction this call computes on the pooled rows (made once)."""
        return interaction.Workload(batch=self.batch, tables=self.tables, dim=self.dim,
                                    self_interaction=bool(self.self_interaction))

    @property
    def rows_format(self) -> RowFormat:
        return RowFormat(self.dtype, self.dim)

    @property
    def out_dim(self) -> int:
        return self.dots.out_dim

    def numeric_features(self) -> dict[str, float]:
        return {**self.bags.numeric_features(), "self_interaction": float(self.self_interaction)}


# ---- inputs and semantics ---------------------------------------------------------------------------------
def inputs(w: Workload, seed: int = 0) -> tuple[Any, ...]:
    """(x, weight, table_offsets, indices, offsets): the dense vectors (B, D) float32, then the bags' tensors
    in FBGEMM's TBE layout (batched_embedding_bag's inputs)."""
    import torch

    x = torch.randn(w.batch, w.dim, generator=torch.Generator().manual_seed(seed + 7))
    return (x, *batched.inputs(w.bags, seed))


def timed_inputs(w: Workload, seed: int, tensors: tuple[Any, ...], cache_bytes: int) -> tuple[tuple[Any, ...], ...]:
    """The input sets timed calls cycle through: the bags' (new rows gathered each call), the same x."""
    x, *rest = tensors
    return tuple((x, *s) for s in batched.timed_inputs(w.bags, seed, tuple(rest), cache_bytes))


def reference(w: Workload, x: Any, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> Any:
    """The batched embedding bag, then DLRM's dot interaction: (B, D + pairs). Computed in the dtype of `x` (float64
    under the float64 rule; the pooled rows of a reduced-precision table are its float32 values, converted; int8
    rows given as floats, as `magnitude_args` gives them, are those values)."""
    bags = w.bags
    if w.dtype == "int8" and weight.is_floating_point():
        bags = dataclasses.replace(bags, dtype="float32")
    ly = batched.reference(bags, weight, table_offsets, indices, offsets)
    return dot_interaction(x, ly.view(ly.shape[0], w.tables, w.dim).to(x.dtype), w.self_interaction)


def magnitude_args(w: Workload, args: Sequence[Any]) -> Sequence[Any]:
    """The arguments (the reference's, or the torch op's: the table second in both) whose reference on absolute
    values is each output's sum of |terms| (template.py): a table of int8 rows as its float32 values."""
    if w.dtype != "int8":
        return args
    return (args[0], dequantize(args[1], "int8"), *args[2:])


def baselines(w: Workload, x: Any, weight: Any, table_offsets: Any, indices: Any, offsets: Any
              ) -> dict[str, Callable[[], Any]]:
    """PyTorch's unfused pairs, their inputs prepared outside the timing: each of the bags' PyTorch ways
    (batched_embedding_bag's baselines over the float32 tables), then the interaction's fastest PyTorch way
    (bmm + index_select on the stacked rows)."""
    import torch

    batch = x.shape[0]
    f = w.tables + 1
    li, lj = torch.tril_indices(f, f, offset=0 if w.self_interaction else -1)
    flat = li * f + lj

    def interact(ly: Any) -> Any:
        t = torch.cat([x.unsqueeze(1), ly.view(batch, w.tables, w.dim)], dim=1)
        return torch.cat([x, torch.bmm(t, t.transpose(1, 2)).flatten(1).index_select(1, flat)], dim=1)

    calls = batched.baselines(w.bags, weight, table_offsets, indices, offsets)
    return {f"{name} + bmm": (lambda bag=bag: interact(bag())) for name, bag in calls.items()}


def traffic(w: Workload, x: Any, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> Traffic:
    """The gathered rows, x read and the output written once; the ops are the dot products' flops (the gather's
    adds are few beside them)."""
    batch = x.shape[0]
    moved = batched.traffic(w.bags, weight, table_offsets, indices, offsets).bytes + 4.0 * batch * (w.dim + w.out_dim)
    return Traffic(bytes=moved, ops=2.0 * batch * w.dots.pairs * w.dim, unit="GFLOPS")


def tolerance(w: Workload) -> tuple[float, float]:
    """The interaction's (judged against float64, rtol relative to each output's sum of |terms|), its atol grown
    with the pooled rows' size: a bag of n rows rounds n times before its dot products."""
    rtol, atol = interaction.tolerance(w.dots)
    return rtol + (BF16_PRODUCT_RTOL if w.dot_dtype == "bfloat16" else 0.0), atol * max(1, w.pooling[1])


# ---- checks and the kernel's arguments ----------------------------------------------------------------------
_need = needs(OP)


def check_inputs(w: Workload, x: Any, weight: Any, table_offsets: Any, indices: Any, offsets: Any) -> None:
    """Raise a clear error for tensors the kernel cannot take: x a contiguous float32 (batch, dim) on the tables'
    device, the bags' tensors as batched_embedding_bag checks them (their messages name this operator)."""
    import torch

    _need(isinstance(x, torch.Tensor), f"x must be a torch.Tensor, got {type(x).__name__}", TypeError)
    _need(x.dtype == torch.float32, f"x must be float32, got {x.dtype}", InvalidDtype)
    _need(x.dim() == 2 and x.shape[1] == w.dim and x.is_contiguous(),
          f"x must be a contiguous (batch, {w.dim}) tensor, got shape {tuple(x.shape)}")
    with RENAMED:
        batched.check_inputs(w.bags, weight, table_offsets, indices, offsets)
    _need(x.device == weight.device, f"x is on {x.device} but the tables on {weight.device}: one device")
    _need(offsets.numel() - 1 == w.tables * x.shape[0],
          f"offsets must hold tables x batch + 1 = {w.tables} x {x.shape[0]} + 1 entries for x of batch "
          f"{x.shape[0]}, got {offsets.numel()}")


class _Renamed:
    """A context that re-raises the bag checks' errors (batched_embedding_bag's, whose messages name it) as this
    operator's: one instance (RENAMED) serves every call, so a check pays no allocation for it."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, err: Any, tb: Any) -> bool:
        if isinstance(err, (InvalidInput, InvalidDtype, IndexOutOfRange)):
            raise type(err)(str(err).replace("batched_embedding_bag", OP, 1)) from None
        return False


RENAMED = _Renamed()


def pack(w: Workload, cfg: Any, *weights: Any) -> tuple[Any, ...]:
    """Nothing to pack (WEIGHTS is empty): rows are gathered from the tables as they are."""
    return weights


class KernelArgs(list):
    """The kernel's arguments, with the bags' tensors (`bags`: indices, offsets) whose addresses its `bags`
    argument holds: alive as long as the list is, and what `after_call` checks again to explain a flagged call."""

    bags: tuple[Any, Any]


def bag_columns(w: Workload, batch: int, indices: Any, offsets: Any) -> tuple[Any, tuple[Any, Any]]:
    """The kernel's `bags` argument (see BAG_FIELDS) for per-table lists of index and offset tensors (the op's
    arguments: each table's tensors where they are, converted only where not contiguous in the kernel's index
    dtype) or for FBGEMM's TBE layout (the template's inputs); and the tensors it points into."""
    import numpy as np
    import torch

    if isinstance(indices, torch.Tensor):  # TBE: one index tensor, table t's bags at offsets[t * B:(t + 1) * B]
        edges = offsets[::batch].tolist()  # the T + 1 boundaries between tables (check_bags checks the rest)
        nnz, step = indices.numel(), batch * offsets.element_size()
        if edges[0] != 0 or any(b < a for a, b in zip(edges, edges[1:])) or edges[-1] > nnz:
            check_monotone(_need, "offsets", offsets, nnz, "indices")  # raises, saying where
        columns = [[indices.data_ptr()] * w.tables, [offsets.data_ptr() + t * step for t in range(w.tables)],
                   edges[:-1], edges[1:]]
    else:
        dtype = getattr(torch, w.index_dtype)
        indices = [i if i.dtype is dtype and i.is_contiguous() else i.to(dtype).contiguous() for i in indices]
        offsets = [o if o.dtype is dtype and o.is_contiguous() else o.to(dtype).contiguous() for o in offsets]
        columns = [[i.data_ptr() for i in indices], [o.data_ptr() for o in offsets], [0] * w.tables,
                   [i.numel() for i in indices]]
    return torch.from_numpy(np.array(columns, dtype=np.int64)), (indices, offsets)


def kernel_args(w: Workload, cfg: Any, packed: Sequence[Any], x: Any, weight: Any, table_offsets: Any, indices: Any,
                offsets: Any) -> tuple[Sequence[Any], Any]:
    """x, the tables, their offsets, the bags' columns (`bag_columns`: the bags in the TBE layout or as per-table
    lists), a new (B, D + pairs) output and the error flag (embedding_bag's error_flag)."""
    import torch

    bags, held = bag_columns(w, x.shape[0], indices, offsets)
    out = torch.empty(x.shape[0], w.out_dim, dtype=torch.float32, device=x.device)
    args = KernelArgs([x, weight, table_offsets, bags, out, error_flag(weight)])
    args.bags = held
    return args, out


def after_call(w: Workload, args: Sequence[Any], out: Any) -> None:
    """Raise what the kernel flagged (a bad index, bag or table boundary: it then gathered nothing and wrote
    zeros), the message found by checking the bags again: a pass over them, only once a call has failed."""
    code = flagged(args[-1])
    if code:
        from ..batched_embedding_bag.torch_op import _explain_bag_edges, layout  # torch: only on this path

        weight, table_offsets = args[1:3]
        indices, offsets = args.bags  # kernel_args' KernelArgs
        with RENAMED:
            if isinstance(indices, list):
                _explain_bag_edges(indices, offsets, False)
                indices, offsets = layout(indices, offsets)[:2]
            if offsets.numel() > 1 and (offsets.numel() - 1) % w.tables == 0:
                batched.check_data(w.bags, weight, table_offsets, indices, offsets)
        raise flag_error(code, OP)
