"""How an embedding bag appears in a captured graph, and the rule that runs it as `torch.ops.autotune.embedding_bag`.

After torch.export, nn.EmbeddingBag modules and F.embedding_bag calls look the same: `aten.embedding_bag` (the
`padding_idx` overload, or the default one) with a get_attr table and four outputs, of which a model uses the
first (the pooled bags). `parse_bag` reads one such node (batched_embedding_bag's rule groups them).
"""

from __future__ import annotations

import functools
import operator
import statistics
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .._graph import attr, insertion_point, is_call, scalar_arg, tensor_value, where, workload_error
from ..template import GraphMatch, GraphRule, Kept
from .workload import MODES, Workload, row_indices, tolerance

__all__ = ["Bag", "EMBEDDING_BAGS", "RULES", "parse_bag", "traffic", "zipf_exponent_of"]

aten = torch.ops.aten
EMBEDDING_BAGS = (aten.embedding_bag.default, aten.embedding_bag.padding_idx)
_ARGS = (("weight", None), ("indices", None), ("offsets", None), ("scale_grad_by_freq", False), ("mode", 0),
         ("sparse", False), ("per_sample_weights", None), ("include_last_offset", False), ("padding_idx", None))
_INDEX_DTYPES = {torch.int64: "int64", torch.int32: "int32"}


@dataclass(frozen=True)
class Bag:
    """One `aten.embedding_bag` node a kernel can run, with what its example values say about it."""

    node: Any
    out: Any  # the getitem 0 node: the pooled bags (B, dim)
    weight: Any  # get_attr node of the table
    indices: Any
    offsets: Any
    per_sample_weights: Any  # node or None
    mode: str
    include_last_offset: bool
    padding_idx: int | None
    sparse: bool
    rows: int
    dim: int
    batch: int
    pooling: tuple[int, int]  # (min, max) indices per bag on the example inputs
    index_dtype: str
    device: Any
    zipf_exponent: float | None = None  # the example indices' skew (`zipf_exponent_of`); None: uniform

    @property
    def covered(self) -> tuple[Any, ...]:
        """The bag node and its getitems: what a match of it claims."""
        return (self.node, *self.node.users)

    def fields(self) -> dict[str, Any]:
        """The embedding_bag workload of this call."""
        pad = self.padding_idx
        pad = pad + self.rows if pad is not None and pad < 0 else pad  # as the workload normalises it
        return dict(rows=self.rows, dim=self.dim, batch=self.batch, pooling=self.pooling, mode=self.mode,
                    index_dtype=self.index_dtype, include_last_offset=self.include_last_offset, padding_idx=pad,
                    per_sample_weights=self.per_sample_weights is not None, **traffic([self]))


# ---- the traffic a model's tables see ---------------------------------------------------------------------
SKEW_MIN_ROWS = 1000  # smaller tables stay in cache whatever their traffic: no evidence of it
SKEW_EXPONENTS = (0.0, 0.6, 0.7, 0.8, 0.9, 1.0, 1.05, 1.1, 1.2, 1.3, 1.5)  # 0.0: uniform


def zipf_exponent_of(indices: torch.Tensor, rows: int) -> float | None:
    """The Zipf exponent (of SKEW_EXPONENTS) under which as many of `indices` repeat an earlier row as do in
    the example, or None where they look uniform, the table is small or the sample too thin to tell. Click logs
    are skewed (a few rows take most lookups), and a kernel tuned on uniform rows (all misses) is not the one
    that wins where most rows hit in cache (benchmarks/WHOLE_MODEL.md); a workload's `dist=zipf:S` draws such
    rows. Repeats, not a fitted slope: with fewer lookups than rows a sample's rank-frequency curve is mostly
    noise, its repeats are not."""
    n = int(indices.numel())
    if rows < SKEW_MIN_ROWS or n < 256:
        return None
    idx = indices.to(torch.int64)
    if int(idx.min()) < 0 or int(idx.max()) >= rows:  # out of range: the kernel's checks say so, later
        return None
    repeats = 1.0 - int(torch.unique(idx).numel()) / n
    best = min(SKEW_EXPONENTS, key=lambda e: abs(_simulated_repeats(rows, n, e) - repeats))
    return best or None


@functools.lru_cache(maxsize=512)
def _simulated_repeats(rows: int, n: int, exponent: float) -> float:
    """The share of n lookups that repeat an earlier row, drawn (seeded) uniformly or Zipf(exponent)."""
    drawn = row_indices(rows, n, "zipf" if exponent else "uniform", exponent, np.random.default_rng(0))
    return 1.0 - len(np.unique(drawn)) / n


def traffic(bags: Sequence["Bag"]) -> dict[str, Any]:
    """The workload fields of the bags' traffic: `distribution="zipf"` with the median of the tables' exponents
    where most of the large tables are skewed, else nothing (uniform: the workloads' default)."""
    exps = [b.zipf_exponent or 0.0 for b in bags if b.rows >= SKEW_MIN_ROWS]
    if not exps or statistics.median(exps) == 0.0:
        return {}
    return {"distribution": "zipf", "zipf_exponent": float(statistics.median(e for e in exps if e))}


def bag_args(node: Any) -> dict[str, Any]:
    """The node's arguments by name (positional or keyword, defaults filled in)."""
    return {name: scalar_arg(node, i, name, default) for i, (name, default) in enumerate(_ARGS)}


def _outputs(node: Any) -> tuple[Any, str]:
    """(getitem 0 node or None, why not servable or "")."""
    out = None
    for user in node.users:
        if not (is_call(user, operator.getitem) and isinstance(user.args[1], int)):
            return None, f"its output tuple is used whole by {user.name}"
        if user.args[1] == 0:
            out = user
        elif user.users:
            return None, ("the model uses its offset2bag/bag_size/max_indices outputs "
                          f"(output {user.args[1]}), which the kernels do not produce")
    return out, ""


def pooling_of(offsets: Any, nnz: int, include_last_offset: bool) -> tuple[int, tuple[int, int]]:
    """(bags, (min, max) indices per bag) from example offsets."""
    bounds = offsets.to(torch.int64)
    if not include_last_offset:
        bounds = torch.cat([bounds, bounds.new_tensor([nnz])])
    if bounds.numel() < 2:
        return 0, (0, 0)
    sizes = bounds[1:] - bounds[:-1]
    return int(sizes.numel()), (int(sizes.min()), int(sizes.max()))


def parse_bag(gm: Any, values: dict[str, Any], node: Any) -> Bag | str | None:
    """The Bag of an embedding-bag node, a reason it cannot run on a kernel, or None (its result is unused)."""
    a = bag_args(node)
    out, why = _outputs(node)
    if why:
        return why
    if out is None or not out.users:
        return None
    weight = a["weight"]
    table = attr(gm, weight.target) if getattr(weight, "op", None) == "get_attr" else None
    if not isinstance(table, torch.Tensor):
        return "its table is computed in the graph (e.g. max_norm renormalises it), not a parameter or buffer"
    if table.dtype != torch.float32 or table.dim() != 2:
        return f"its table is {table.dtype} of shape {tuple(table.shape)}: kernels take 2-D float32 tables"
    if a["scale_grad_by_freq"]:
        return "scale_grad_by_freq: frequency-scaled gradients are PyTorch's own"
    if not isinstance(a["mode"], int) or not 0 <= a["mode"] < len(MODES):
        return f"mode {a['mode']!r} is not a constant sum/mean/max"
    indices, offsets = tensor_value(gm, values, a["indices"]), tensor_value(gm, values, a["offsets"])
    if not isinstance(indices, torch.Tensor) or not isinstance(offsets, torch.Tensor):
        return "no example values for its indices and offsets"
    if indices.dtype != offsets.dtype or indices.dtype not in _INDEX_DTYPES:
        return f"indices {indices.dtype} and offsets {offsets.dtype}: kernels take one dtype, int32 or int64"
    if indices.dim() != 1 or offsets.dim() != 1:
        return f"indices {tuple(indices.shape)} and offsets {tuple(offsets.shape)} must be 1-D"
    batch, pooling = pooling_of(offsets, indices.numel(), bool(a["include_last_offset"]))
    return Bag(node=node, out=out, weight=weight, indices=a["indices"], offsets=a["offsets"],
               per_sample_weights=a["per_sample_weights"], mode=MODES[a["mode"]],
               include_last_offset=bool(a["include_last_offset"]), padding_idx=a["padding_idx"],
               sparse=bool(a["sparse"]), rows=table.shape[0], dim=table.shape[1], batch=batch, pooling=pooling,
               index_dtype=_INDEX_DTYPES[indices.dtype], device=table.device,
               zipf_exponent=zipf_exponent_of(indices, table.shape[0]))


def bags(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[tuple[Any, Bag | str]]:
    """(node, Bag or why not) for every unclaimed embedding bag whose result is used, in graph order."""
    for node in list(gm.graph.nodes):
        if is_call(node, *EMBEDDING_BAGS) and node not in claimed:
            bag = parse_bag(gm, values, node)
            if bag is not None:
                yield node, bag


def _replace(bag: Bag) -> Any:
    """Insert `torch.ops.autotune.embedding_bag` on the bag node's current arguments."""

    def replace(gm: Any) -> tuple[Any, ...]:
        a = bag_args(bag.node)
        inputs = [a["weight"], a["indices"], a["offsets"], a["per_sample_weights"]]
        with gm.graph.inserting_before(insertion_point(gm, inputs, [bag.out])):
            new = gm.graph.call_function(torch.ops.autotune.embedding_bag.default, (
                *inputs, bag.mode, bag.include_last_offset, a["padding_idx"]))
        new.meta["nn_module_stack"] = bag.node.meta.get("nn_module_stack", {})
        return (new,)

    return replace


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """Every remaining embedding bag (the batched rule took those feeding one consumer together)."""
    for node, bag in bags(gm, values, claimed):
        if isinstance(bag, str):
            yield Kept("embedding_bag", where([node]), bag)
            continue
        fields = bag.fields()
        why = workload_error(Workload, fields)
        if why:
            yield Kept("embedding_bag", where([node]), why)
            continue
        note = " (sparse gradients become dense)" if bag.sparse else ""
        yield GraphMatch(
            rule="embedding_bag", nodes=bag.covered, outputs=(bag.out,), tasks=(("embedding_bag", fields),),
            replace=_replace(bag), tolerance=tolerance(Workload(**fields)), where=where([node]),
            what=f"embedding bag ({bag.rows} x {bag.dim}, {bag.mode}) -> embedding_bag{note}")


RULES = (GraphRule("embedding_bag", find),)
