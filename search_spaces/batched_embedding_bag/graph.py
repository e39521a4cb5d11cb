"""The rule that runs a model's embedding bags feeding one consumer as ONE table-batched launch.

DLRM looks up its T tables one `aten.embedding_bag` each, and the T results feed one node (the cat or stack
that builds the interaction's input). Those with one dim, mode, index dtype and options become one
`torch.ops.autotune.batched_embedding_bag` over one weight buffer registered on the GraphModule: the tables are
copied into it once and the model's Parameters are rebound as views of it (`p.data = fused[r0:r1]`), so one copy
of the tables stays in memory. Table k's output is `select(view(out, [-1, T, D]), 1, k)`: a view, no copy, which
the interaction rule recognises and reads as the (B, T, D) tensor itself.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from .._graph import attr, has_op, insertion_point, node_order, register, where, workload_error
from ..embedding_bag.graph import Bag, bags, traffic
from ..embedding_bag.rows import dequantize, quantize
from ..template import GraphMatch, GraphRule, Kept, Reduced
from .torch_op import concat_tables
from .workload import Workload, tolerance

__all__ = ["RULES", "groups", "table_nodes"]

aten = torch.ops.aten
RULE = "batched_embedding_bag"
RULE_INT8 = "batched_embedding_bag_int8"


def _key(bag: Bag, consumer: Any) -> tuple[Any, ...]:
    """Bags of one key can share one launch: one consumer, and what the TBE kernel compiles in or needs equal."""
    return (consumer, bag.dim, bag.mode, bag.index_dtype, bag.include_last_offset, bag.batch, bag.device)


def _position(consumer: Any, order: dict[Any, int]) -> Any:
    """Sort key of a bag: where its output sits among the consumer's (flattened) arguments, then graph order,
    so that table k is the consumer's k-th embedding (cat([x, e0, e1, ...]) reads the TBE output in order)."""
    flat: list[Any] = []
    for a in consumer.args:
        flat.extend(a if isinstance(a, (list, tuple)) else [a])

    def key(bag: Bag) -> tuple[int, int]:
        return (flat.index(bag.out) if bag.out in flat else len(flat), order[bag.node])

    return key


def groups(gm: Any, values: dict[str, Any], claimed: set[Any]) -> list[list[Bag]]:
    """Groups of >= 2 unclaimed plain bags (no per-sample weights, no padding_idx) with one key, each table
    in one group at most (a table looked up twice stays with the single-bag rule the second time)."""
    order = node_order(gm)
    by_key: dict[tuple[Any, ...], list[Bag]] = {}
    seen: set[int] = set()
    for _, bag in bags(gm, values, claimed):
        if isinstance(bag, str) or bag.per_sample_weights is not None or bag.padding_idx is not None:
            continue
        table = attr(gm, bag.weight.target)
        if id(table) in seen:
            continue
        seen.add(id(table))
        consumer = min(bag.out.users, key=order.__getitem__)
        by_key.setdefault(_key(bag, consumer), []).append(bag)
    out = []
    for key, group in by_key.items():
        if len(group) >= 2:
            out.append(sorted(group, key=_position(key[0], order)))
    return out


def fuse_tables(gm: Any, group: list[Bag]) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(fused weight, table_offsets, the Parameters): the tables copied into one (sum rows, D) tensor."""
    params = [attr(gm, bag.weight.target) for bag in group]
    fused = _already_fused(params)  # a model tune_model rewrote before: its tables are one buffer already
    if fused is None:
        with torch.no_grad():
            fused = concat_tables([p.detach() for p in params])
    rows = torch.tensor([0] + [p.shape[0] for p in params], dtype=torch.int64)
    return fused, rows.cumsum(0).to(fused.device), params


def _already_fused(params: list[torch.Tensor]) -> torch.Tensor | None:
    """The one (sum rows, D) tensor the tables are consecutive contiguous views of, or None (copy them)."""
    first = params[0]
    storage, start = first.untyped_storage(), first.storage_offset()
    at = start
    for p in params:
        if not p.is_contiguous() or p.untyped_storage().data_ptr() != storage.data_ptr() or p.storage_offset() != at:
            return None
        at += p.numel()
    rows = sum(p.shape[0] for p in params)
    return first.detach().new_empty(0).set_(storage, start, (rows, first.shape[1]))


def table_nodes(gm: Any, group: list[Bag], dtype: str = "float32") -> tuple[Any, Any]:
    """get_attr nodes of the group's tables as one weight and of their first rows, inserted at the graph's
    insertion point. float32: a Parameter where the tables took gradients, the model's own tables rebound as views
    of it (`p.data = fused[r0:r1]`: one copy of the tables); a reduced-precision `dtype` (int8): the tables
    converted once (rows.py), an inference buffer beside the model's own fp32 Parameters."""
    if dtype == "float32":
        fused, table_offsets, params = fuse_tables(gm, group)
        trainable = any(p.requires_grad for p in params)
    else:
        params = [attr(gm, bag.weight.target) for bag in group]
        fused = concat_tables([quantize(p, dtype) for p in params])
        table_offsets = torch.tensor([0] + [p.shape[0] for p in params], dtype=torch.int64).cumsum(0)
        table_offsets, trainable = table_offsets.to(fused.device), False
    weight = register(gm, "autotune_tables", fused, trainable=trainable)
    starts = register(gm, "autotune_table_offsets", table_offsets)
    if dtype == "float32":
        for p, r0, r1 in zip(params, table_offsets.tolist(), table_offsets.tolist()[1:]):
            p.data = fused[r0:r1]
    return weight, starts


def _replace(group: list[Bag], dtype: str = "float32") -> Any:
    """The rewrite of one group: one launch over the tables in one buffer (`table_nodes`, in `dtype` rows)."""

    def replace(gm: Any) -> tuple[Any, ...]:
        indices, offsets = [b.indices for b in group], [b.offsets for b in group]
        t_count, dim = len(group), group[0].dim
        point = insertion_point(gm, indices + offsets, [b.out for b in group])
        with gm.graph.inserting_before(point):
            weight, starts = table_nodes(gm, group, dtype)
            out = gm.graph.call_function(torch.ops.autotune.batched_embedding_bag.default, (
                weight, starts, indices, offsets, group[0].mode, group[0].include_last_offset))
            v = gm.graph.call_function(aten.view.default, (out, [-1, t_count, dim]))
            news = [gm.graph.call_function(aten.select.int, (v, 1, k)) for k in range(t_count)]
        for node in (weight, starts, out, v, *news):
            node.meta["nn_module_stack"] = group[0].node.meta.get("nn_module_stack", {})
        return tuple(news)

    return replace


def _fields(group: list[Bag]) -> dict[str, Any]:
    first, pooling = group[0], tuple(b.pooling for b in group)
    return dict(rows=tuple(b.rows for b in group), dim=first.dim, batch=first.batch,
                pooling=(min(p[0] for p in pooling), max(p[1] for p in pooling)),
                **({"table_pooling": pooling} if len(set(pooling)) > 1 else {}), mode=first.mode,
                index_dtype=first.index_dtype, **traffic(group))


def _matches(gm: Any, values: dict[str, Any], claimed: set[Any], rule: str,
             dtype: str) -> Iterator[tuple[list[Bag], dict[str, Any]] | Kept]:
    """(group, task fields) of each group the `dtype` kernels can serve, or Kept saying why not."""
    for group in groups(gm, values, claimed):
        nodes = [b.node for b in group]
        if not has_op(RULE):
            yield Kept(rule, where(nodes), "torch.ops.autotune.batched_embedding_bag is not registered "
                                           "(import autotune.torch)")
            continue
        fields = _fields(group) | ({"dtype": dtype} if dtype != "float32" else {})
        why = workload_error(Workload, fields)
        if why:
            yield Kept(rule, where(nodes), why)
            continue
        yield group, fields


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """One match per group of embedding bags feeding one consumer."""
    for found in _matches(gm, values, claimed, RULE, "float32"):
        if isinstance(found, Kept):
            yield found
            continue
        group, fields = found
        yield GraphMatch(
            rule=RULE, nodes=tuple(n for b in group for n in b.covered), outputs=tuple(b.out for b in group),
            tasks=((RULE, fields),), replace=_replace(group), tolerance=tolerance(Workload(**fields)),
            where=where([b.node for b in group]),
            what=(f"{len(group)} embedding bags -> one batched_embedding_bag ({len(group)} tables, dim "
                  f"{fields['dim']}, {fields['mode']}); the tables now live in one buffer, the modules' "
                  "weights are views of it"))


def simulated_bag(dtype: str) -> Any:
    """`aten.embedding_bag`'s arguments -> its outputs with the table in `dtype` rows (converted as `_replace`
    converts it, then read back as the kernels read it): a table's share of a model's error, before any kernel
    is tuned."""

    def bag(weight: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        table = dequantize(quantize(weight, dtype), dtype)
        return aten.embedding_bag(table, *args, **kwargs)  # the packet: default or padding_idx, as the node

    return bag


def _int8_tolerance(gm: Any, group: list[Bag], fields: dict[str, Any]) -> tuple[float, float]:
    """(rtol, atol) of the check by numbers: each fused int8 row is off by at most half its step, (max - min)
    / 255 / 2 per element, so a bag of up to max-pooling rows by that many steps, plus fp32 rounding."""
    step = 0.0
    with torch.no_grad():
        for b in group:
            t = attr(gm, b.weight.target).detach()
            step = max(step, float((t.amax(1) - t.amin(1)).max()) / 255)
    rtol, atol = tolerance(Workload(**fields))
    return rtol, atol + 0.5 * step * fields["pooling"][1] * (1 + 1e-3)


def find_int8(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """As `find`, with the tables converted once to FBGEMM's fused int8 rows (a quarter of the bytes per
    lookup); each table may stay fp32 alone to hold tune_model's accuracy contract (then the fp32 rule takes
    it)."""
    for found in _matches(gm, values, claimed, RULE_INT8, "int8"):
        if isinstance(found, Kept):
            yield found
            continue
        group, fields = found
        simulate = simulated_bag("int8")
        yield GraphMatch(
            rule=RULE_INT8, nodes=tuple(n for b in group for n in b.covered), outputs=tuple(b.out for b in group),
            tasks=((RULE, fields),), replace=_replace(group, "int8"), tolerance=_int8_tolerance(gm, group, fields),
            where=where([b.node for b in group]),
            reduced=tuple(Reduced(node=b.node.name, where=where([b.node]), simulate=simulate,
                                  what=f"EmbeddingBag({b.rows}, {b.dim}) table, int8 rows") for b in group),
            what=(f"{len(group)} embedding bags -> one batched_embedding_bag ({len(group)} tables, dim "
                  f"{fields['dim']}, {fields['mode']}) over int8 rows (FBGEMM's fused row-wise layout), "
                  "converted once into one inference buffer"))


RULES = (GraphRule(RULE_INT8, find_int8, quantizes=True), GraphRule(RULE, find))
