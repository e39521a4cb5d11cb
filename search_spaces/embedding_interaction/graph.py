"""The rule that runs a model's embedding bags and the dot interaction they feed as ONE fused kernel call.

It finds what the two rules it fuses find (`GraphRule.fuses`): a dot interaction (interaction's rule) whose
embeddings are exactly a group of bags that batched_embedding_bag's rule would run as one launch, in the
interaction's order, each read by the interaction alone. The match claims both and is replaced by
`torch.ops.autotune.embedding_interaction(x, tables, table_offsets, indices, offsets, self_interaction,
include_last_offset)` over the tables copied once into one buffer (the model's Parameters become views of it,
as batched_embedding_bag's rule does). It runs before the rules it fuses (autotune/torch/rules.py); tune_model
keeps its replacement only where the whole model is faster with it than with the batched bags and the
interaction kernel apart.

Its quantizing twin (`embedding_interaction_int8`, before it, under tune_model(quantize=True)) does the same
over the tables converted once to FBGEMM's fused int8 rows, as batched_embedding_bag's int8 rule does: a
quarter of the bytes per lookup and no pooled rows written. Each table is a `Reduced` layer of the accuracy
contract. Where the contract moves a table up from int8, the 16-bit rung's twin (`embedding_interaction_fp16`,
after it) takes the group in fp16 rows: as many cache lines per lookup as int8 rows of dim 64 (128 against 72
bytes, two lines each), about a twentieth of their error (int8 rows of a table of a few rows, which every
sample reads, move a model's outputs the most); a table held in fp32 breaks the group, and the rules apart
take the site. Both twins let the dot products multiply bf16 roundings of the features (`dot_dtype`: AMX's
tile products, where the CPU has them): the check's allowance includes what that moves the output by.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from .._graph import attr, has_op, insertion_point, is_call, tensor_value, where, workload_error
from ..batched_embedding_bag.graph import RULE as BAGS, RULE_INT8 as BAGS_INT8, groups, simulated_bag, table_nodes
from ..embedding_bag.graph import Bag, traffic
from ..embedding_bag.rows import dequantize, quantize
from ..interaction.graph import RULE as INTERACTION, features_of, find as interactions, in_model_order, site_of
from ..interaction.workload import dot_interaction
from ..template import GraphMatch, GraphRule, Kept, Reduced
from .workload import OP, Workload, tolerance

__all__ = ["RULES"]

aten = torch.ops.aten
RULE_INT8 = f"{OP}_int8"
RULE_FP16 = f"{OP}_fp16"


def _fields(group: list[Bag], self_interaction: bool) -> dict[str, Any]:
    first = group[0]
    return dict(rows=tuple(b.rows for b in group), dim=first.dim, batch=first.batch,
                pooling=(min(b.pooling[0] for b in group), max(b.pooling[1] for b in group)),
                self_interaction=self_interaction, index_dtype=first.index_dtype, **traffic(group))


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


def _replace(group: list[Bag], x: Any, outputs: tuple[Any, ...], self_interaction: bool, order: list[int] | None,
             dtype: str = "float32", dot_dtype: str = "float32") -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        indices, offsets = [b.indices for b in group], [b.offsets for b in group]
        with gm.graph.inserting_before(insertion_point(gm, [x, *indices, *offsets], list(outputs))):
            weight, starts = table_nodes(gm, group, dtype)
            new = gm.graph.call_function(torch.ops.autotune.embedding_interaction.default, (
                x, weight, starts, indices, offsets, self_interaction, group[0].include_last_offset, dot_dtype))
            new = in_model_order(gm, new, order, x, group[0].dim)
        for node in (weight, starts, new):
            node.meta["nn_module_stack"] = outputs[0].meta.get("nn_module_stack", {})
        return (new,)

    return replace


def _sites(gm: Any, values: dict[str, Any], claimed: set[Any], rule: str, dtype: str, dot_dtype: str = "float32"
           ) -> Iterator[Kept | tuple[list[Bag], Any, Any, dict[str, Any], list[Any], list[int] | None]]:
    """(group, interaction site, dense-features node, task fields, nodes, the model's pair order: `Site.order`)
    of each dot interaction whose embeddings are one group of batchable bags the `dtype` kernels (with
    `dot_dtype` products) can serve, or Kept saying why not."""
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
        fields = _fields(group, bool(site.tasks[0][1]["self_interaction"]))
        fields |= {k: v for k, v in (("dtype", dtype), ("dot_dtype", dot_dtype)) if v != "float32"}
        nodes = [b.node for b in group] + [bmm]
        why = _why_not(gm, values, group, feats.x) or workload_error(Workload, fields) or (
            "" if has_op(OP) else f"torch.ops.autotune.{OP} is not registered (import autotune.torch)")
        if why:
            yield Kept(rule, where(nodes), why)
            continue
        yield group, site, feats.x, fields, nodes, site_of(gm, values, bmm).order


def _match(rule: str, group: list[Bag], site: GraphMatch, x: Any, fields: dict[str, Any], nodes: list[Any],
           order: list[int] | None, tol: tuple[float, float], what: str, dtype: str = "float32",
           reduced: tuple[Reduced, ...] = ()) -> GraphMatch:
    self_interaction = fields["self_interaction"]
    return GraphMatch(
        rule=rule, nodes=tuple(dict.fromkeys([*(n for b in group for n in b.covered), *site.nodes])),
        outputs=site.outputs, tasks=((OP, fields),),
        replace=_replace(group, x, site.outputs, self_interaction, order, dtype, fields.get("dot_dtype", "float32")),
        tolerance=tol, where=where(nodes),
        reduced=reduced,
        what=(f"{len(group)} embedding bags + dot interaction -> one embedding_interaction ({len(group)} tables, "
              f"dim {fields['dim']}{', self-interaction' if self_interaction else ''}): the pooled rows are never "
              f"written; the tables now live in one buffer{what}"))


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """One match per dot interaction whose embeddings are one group of batchable bags."""
    for found in _sites(gm, values, claimed, OP, "float32"):
        if isinstance(found, Kept):
            yield found
            continue
        group, site, x, fields, nodes, order = found
        yield _match(OP, group, site, x, fields, nodes, order, tolerance(Workload(**fields)),
                     ", the modules' weights are views of it")


def _reduced_tolerance(gm: Any, values: dict[str, Any], group: list[Bag], x: Any, fields: dict[str, Any],
                       dtype: str) -> tuple[float, float]:
    """(rtol, atol) of the check by numbers against the fp32 model: the kernels' own rounding, plus what `dtype`
    rows and bf16 products (`dot_dtype`) themselves move the output by on the example inputs (the interaction of
    the converted tables' bags, on bf16 roundings, against the fp32 one's), which no bound by steps states as
    tightly (a dot product sums D products)."""
    rtol, atol = tolerance(Workload(**fields))
    with torch.no_grad():
        pooled, exact = [], []
        for b in group:
            table = attr(gm, b.weight.target).detach()
            args = (tensor_value(gm, values, b.indices), tensor_value(gm, values, b.offsets))
            pooled.append(torch.nn.functional.embedding_bag(
                args[0], dequantize(quantize(table, dtype), dtype), args[1], mode="sum",
                include_last_offset=b.include_last_offset, padding_idx=b.padding_idx))
            exact.append(tensor_value(gm, values, b.out))
        dense, rows = tensor_value(gm, values, x), torch.stack(pooled, 1)
        if fields.get("dot_dtype") == "bfloat16":  # the triangle of bf16 roundings; x is copied as it is
            rounded = dot_interaction(dense.bfloat16().float(), rows.bfloat16().float(), fields["self_interaction"])
            ours = torch.cat([dense, rounded[:, dense.shape[1]:]], dim=1)
        else:
            ours = dot_interaction(dense, rows, fields["self_interaction"])
        theirs = dot_interaction(dense, torch.stack(exact, 1), fields["self_interaction"])
        moved = float((ours - theirs).abs().max())
    return rtol, atol + moved * (1 + 1e-3)


def _finder(rule: str, dtype: str, precision: str, rows: str, layout: str = "") -> Any:
    """`find` over the tables converted once to `dtype` rows (`rows`: how the report names them, `layout` what
    the match adds); each table a `Reduced` layer of `precision`."""
    simulate = simulated_bag(dtype)

    def find_reduced(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
        for found in _sites(gm, values, claimed, rule, dtype, "bfloat16"):
            if isinstance(found, Kept):
                yield found
                continue
            group, site, x, fields, nodes, order = found
            reduced = tuple(Reduced(node=b.node.name, where=where([b.node]), simulate=simulate,
                                    what=f"EmbeddingBag({b.rows}, {b.dim}) table, {rows}", precision=precision)
                            for b in group)
            tol = _reduced_tolerance(gm, values, group, x, fields, dtype)
            yield _match(rule, group, site, x, fields, nodes, order, tol,
                         f" of {rows}{layout}, converted once; the dot "
                         "products may multiply bf16 roundings of the features (AMX tiles, where the CPU has them)",
                         dtype, reduced)

    return find_reduced


find_int8 = _finder(RULE_INT8, "int8", "int8", "int8 rows", " (FBGEMM's fused row-wise layout)")
find_fp16 = _finder(RULE_FP16, "float16", "bf16", "fp16 rows")

RULES = (GraphRule(RULE_INT8, find_int8, quantizes=True, fuses=(BAGS_INT8, INTERACTION)),
         GraphRule(RULE_FP16, find_fp16, quantizes=True, precision="bf16", fuses=(BAGS_INT8, INTERACTION)),
         GraphRule(OP, find, fuses=(BAGS, INTERACTION)))
