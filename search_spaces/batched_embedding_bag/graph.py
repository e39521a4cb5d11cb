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
from ..embedding_bag.graph import Bag, bags
from ..template import GraphMatch, GraphRule, Kept
from .torch_op import concat_tables
from .workload import Workload, tolerance

__all__ = ["RULES", "groups", "table_nodes"]

aten = torch.ops.aten
RULE = "batched_embedding_bag"


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


def table_nodes(gm: Any, group: list[Bag]) -> tuple[Any, Any]:
    """get_attr nodes of the group's tables as one weight (a Parameter where the tables took gradients) and of
    their first rows, inserted at the graph's insertion point; the model's own tables become views of the one
    buffer (`p.data = fused[r0:r1]`): no second copy."""
    fused, table_offsets, params = fuse_tables(gm, group)
    weight = register(gm, "autotune_tables", fused, trainable=any(p.requires_grad for p in params))
    starts = register(gm, "autotune_table_offsets", table_offsets)
    for p, r0, r1 in zip(params, table_offsets.tolist(), table_offsets.tolist()[1:]):
        p.data = fused[r0:r1]
    return weight, starts


def _replace(group: list[Bag]) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        indices, offsets = [b.indices for b in group], [b.offsets for b in group]
        t_count, dim = len(group), group[0].dim
        point = insertion_point(gm, indices + offsets, [b.out for b in group])
        with gm.graph.inserting_before(point):
            weight, starts = table_nodes(gm, group)
            out = gm.graph.call_function(torch.ops.autotune.batched_embedding_bag.default, (
                weight, starts, indices, offsets, group[0].mode, group[0].include_last_offset))
            v = gm.graph.call_function(aten.view.default, (out, [-1, t_count, dim]))
            news = [gm.graph.call_function(aten.select.int, (v, 1, k)) for k in range(t_count)]
        for node in (weight, starts, out, v, *news):
            node.meta["nn_module_stack"] = group[0].node.meta.get("nn_module_stack", {})
        return tuple(news)

    return replace


def _fields(group: list[Bag]) -> dict[str, Any]:
    first = group[0]
    return dict(rows=tuple(b.rows for b in group), dim=first.dim, batch=first.batch,
                pooling=(min(b.pooling[0] for b in group), max(b.pooling[1] for b in group)), mode=first.mode,
                index_dtype=first.index_dtype)


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """One match per group of embedding bags feeding one consumer."""
    for group in groups(gm, values, claimed):
        nodes = [b.node for b in group]
        if not has_op(RULE):
            yield Kept(RULE, where(nodes), "torch.ops.autotune.batched_embedding_bag is not registered "
                                           "(import autotune.torch)")
            continue
        fields = _fields(group)
        why = workload_error(Workload, fields)
        if why:
            yield Kept(RULE, where(nodes), why)
            continue
        yield GraphMatch(
            rule=RULE, nodes=tuple(n for b in group for n in b.covered), outputs=tuple(b.out for b in group),
            tasks=((RULE, fields),), replace=_replace(group), tolerance=tolerance(Workload(**fields)),
            where=where(nodes),
            what=(f"{len(group)} embedding bags -> one batched_embedding_bag ({len(group)} tables, dim "
                  f"{fields['dim']}, {fields['mode']}); the tables now live in one buffer, the modules' "
                  "weights are views of it"))


RULES = (GraphRule(RULE, find, priority=10),)
