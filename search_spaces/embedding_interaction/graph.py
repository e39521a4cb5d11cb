"""The rule that runs a model's embedding bags and the dot interaction they feed as ONE fused kernel call.

It finds what the two rules it fuses find (`GraphRule.fuses`): a dot interaction (interaction's rule) whose
embeddings are exactly a group of bags that batched_embedding_bag's rule would run as one launch, in the
interaction's order, each read by the interaction alone. The match claims both and is replaced by
`torch.ops.autotune.embedding_interaction(x, tables, table_offsets, indices, offsets, self_interaction,
include_last_offset)` over the tables copied once into one buffer (the model's Parameters become views of it,
as batched_embedding_bag's rule does). It runs first (priority 5); tune_model keeps its replacement only where
the whole model is faster with it than with the batched bags and the interaction kernel apart.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from .._graph import has_op, insertion_point, is_call, tensor_value, where, workload_error
from ..batched_embedding_bag.graph import RULE as BAGS, groups, table_nodes
from ..embedding_bag.graph import Bag
from ..interaction.graph import RULE as INTERACTION, features_of, find as interactions
from ..template import GraphMatch, GraphRule, Kept
from .workload import OP, Workload, tolerance

__all__ = ["RULES"]

aten = torch.ops.aten


def _fields(group: list[Bag], self_interaction: bool) -> dict[str, Any]:
    first = group[0]
    return dict(rows=tuple(b.rows for b in group), dim=first.dim, batch=first.batch,
                pooling=(min(b.pooling[0] for b in group), max(b.pooling[1] for b in group)),
                self_interaction=self_interaction, index_dtype=first.index_dtype)


def _why_not(gm: Any, values: dict[str, Any], group: list[Bag], x: Any) -> str:
    """Why a site whose embeddings are this group's bags is not fused ("" if it is)."""
    if any(len(b.out.users) != 1 for b in group):
        return "an embedding is also read outside the interaction: its pooled rows must be written"
    if group[0].mode != "sum":
        return f"the bags pool by {group[0].mode}: the fused kernel sums"
    if group[0].device.type != "cpu":
        return "the fused kernel runs on CPUs only"
    value = tensor_value(gm, values, x)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.float32:
        return f"the dense features are {getattr(value, 'dtype', 'unknown')}: the fused kernel takes float32"
    return ""


def _replace(group: list[Bag], x: Any, outputs: tuple[Any, ...], self_interaction: bool) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        indices, offsets = [b.indices for b in group], [b.offsets for b in group]
        with gm.graph.inserting_before(insertion_point(gm, [x, *indices, *offsets], list(outputs))):
            weight, starts = table_nodes(gm, group)
            new = gm.graph.call_function(torch.ops.autotune.embedding_interaction.default, (
                x, weight, starts, indices, offsets, self_interaction, group[0].include_last_offset))
        for node in (weight, starts, new):
            node.meta["nn_module_stack"] = outputs[0].meta.get("nn_module_stack", {})
        return (new,)

    return replace


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """One match per dot interaction whose embeddings are one group of batchable bags."""
    by_outputs = {tuple(b.out for b in group): group for group in groups(gm, values, claimed)}
    if not by_outputs:
        return
    for site in interactions(gm, values, claimed):
        if not isinstance(site, GraphMatch):
            continue  # the interaction rule says why, where it runs
        bmm = next(n for n in site.nodes if is_call(n, aten.bmm.default))
        feats = features_of(gm, values, bmm.args[0])
        if feats is None or any(kind != "emb" for kind, _, _ in feats.chunks):
            continue
        group = by_outputs.get(tuple(n for _, n, _ in feats.chunks))
        if group is None:
            continue  # not one group of bags (other tables among them, a weighted bag): the two rules apart
        self_interaction = bool(site.tasks[0][1]["self_interaction"])
        fields = _fields(group, self_interaction)
        nodes = [b.node for b in group] + [bmm]
        why = _why_not(gm, values, group, feats.x) or workload_error(Workload, fields) or (
            "" if has_op(OP) else f"torch.ops.autotune.{OP} is not registered (import autotune.torch)")
        if why:
            yield Kept(OP, where(nodes), why)
            continue
        yield GraphMatch(
            rule=OP, nodes=tuple(dict.fromkeys([*(n for b in group for n in b.covered), *site.nodes])),
            outputs=site.outputs, tasks=((OP, fields),),
            replace=_replace(group, feats.x, site.outputs, self_interaction), tolerance=tolerance(Workload(**fields)),
            where=where(nodes),
            what=(f"{len(group)} embedding bags + dot interaction -> one embedding_interaction ({len(group)} tables, "
                  f"dim {fields['dim']}{', self-interaction' if self_interaction else ''}): the pooled rows are "
                  "never written; the tables now live in one buffer, the modules' weights are views of it"))


RULES = (GraphRule(OP, find, priority=5, fuses=(BAGS, INTERACTION)),)
