"""How DLRM's dot interaction appears in a captured graph, and the rule that runs it as
`torch.ops.autotune.interaction`.

The usual ways of writing it (facebookresearch/dlrm's, this repository's example) all export as
    t = features of x and the T embeddings, (B, F, D):   view(cat([x, e0, ...], 1), [B, -1, D])
                                                         | stack([x, e0, ...], 1)
                                                         | cat([x.unsqueeze(1) or x.view(B, 1, D), ly], 1)
                                                           (ly: stack(embs, 1) or view(cat(embs, 1), [B, T, D]))
    z = bmm(t, transpose(t, 1, 2) or permute(t, [0, 2, 1]))                                   (B, F, F)
    the lower triangle of z (offset -1; offset 0 with self-interaction), row-major or in any order:
        index(z or slice(z), [None, li, lj])              li, lj: tril_indices (+ unbind) or constant tensors
      | index_select(flatten(z), 1, li * F + lj)  or  index(flatten(z), [None, li * F + lj])
    out = cat([x, pairs], 1)
Pair indices are compared by value (`values`) with `tril_indices(F, F, offset)`: the pairs of the lower (or the
upper) triangle in another order (TorchRec's `triu_indices(offset=1)`) are served with the kernel's output
columns put in the model's order; a look-alike (pairs missing or repeated, bmm without the transpose, scaling
in between) is kept, and says why. When the T embeddings are
`select(v, 1, k)` of one (B, T, D) tensor (the batched embedding bag's output), `v` is passed as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from .._graph import (ancestors_include, insertion_point, is_call, register, scalar_arg, tensor_value, where,
                      workload_error)
from ..template import GraphMatch, GraphRule, Kept
from .workload import Workload, tolerance

__all__ = ["RULES", "features_of", "in_model_order", "pairs_of", "site_of"]

aten = torch.ops.aten
RULE = "interaction"
VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
BIG = 2**62  # a slice end at least this large is "to the end"


@dataclass
class Features:
    """The (B, F, D) features tensor `t` of an interaction: x first, then the embeddings as chunks."""

    t: Any
    x: Any
    chunks: list[tuple[str, Any, int]]  # ("emb", (B, D) node, 1) | ("block", (B, k, D) node, k) | ("flat", (B, k*D), k)
    covered: list[Any] = field(default_factory=list)
    batch: int = 0
    dim: int = 0

    @property
    def tables(self) -> int:
        return sum(k for _, _, k in self.chunks)


def _shape(gm: Any, values: dict[str, Any], node: Any) -> tuple[int, ...] | None:
    v = tensor_value(gm, values, node)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def _dim_arg(node: Any, index: int, ndim: int, default: int = 0) -> int:
    d = scalar_arg(node, index, "dim", default)
    return d % ndim if isinstance(d, int) else -1


def _as_row(gm: Any, values: dict[str, Any], node: Any, batch: int, dim: int) -> Any:
    """The 2-D (B, D) node that `node` (B, 1, D) is an unsqueeze(·, 1) or view of, or None."""
    if is_call(node, aten.unsqueeze.default) and _dim_arg(node, 1, 3) == 1:
        src = node.args[0]
    elif is_call(node, *VIEWS):
        src = node.args[0]
    else:
        return None
    return src if _shape(gm, values, src) == (batch, dim) else None


def _stacked(gm: Any, values: dict[str, Any], t: Any) -> Features | None:
    """stack([x, e0, ...], 1) of (B, D) tensors."""
    items = t.args[0]
    shapes = [_shape(gm, values, n) for n in items]
    if len(items) < 2 or len(set(shapes)) != 1 or shapes[0] is None or len(shapes[0]) != 2:
        return None
    if _dim_arg(t, 1, 3) != 1:
        return None
    batch, dim = shapes[0]
    return Features(t, items[0], [("emb", n, 1) for n in items[1:]], [t], batch, dim)


def _cat_viewed(gm: Any, values: dict[str, Any], t: Any, shape: tuple[int, ...]) -> Features | None:
    """view(cat([x, e0, ...], 1), [B, -1, D]) of 2-D pieces, each D or a multiple of D wide (a (B, k*D) block)."""
    c = t.args[0]
    target = t.args[1]
    batch, _, dim = shape
    if not is_call(c, aten.cat.default) or not isinstance(target, (list, tuple)) or target[-1] != dim:
        return None
    pieces = [_shape(gm, values, n) for n in c.args[0]]
    if any(s is None or len(s) != 2 or s[0] != batch or s[1] % dim for s in pieces) or _dim_arg(c, 1, 2) != 1:
        return None
    if pieces[0] != (batch, dim):
        return None
    chunks = [("emb", n, 1) if s[1] == dim else ("flat", n, s[1] // dim) for n, s in zip(c.args[0][1:], pieces[1:])]
    return Features(t, c.args[0][0], chunks, [t, c], batch, dim)


def _cat_3d(gm: Any, values: dict[str, Any], t: Any, shape: tuple[int, ...]) -> Features | None:
    """cat([x.unsqueeze(1), ly...], 1) of 3-D (B, k, D) pieces, the first made from the dense x."""
    batch, _, dim = shape
    items = t.args[0]
    if _dim_arg(t, 1, 3) != 1 or any(_shape(gm, values, n) is None for n in items):
        return None
    x = _as_row(gm, values, items[0], batch, dim)
    if x is None or _shape(gm, values, items[0]) != (batch, 1, dim):
        return None
    chunks: list[tuple[str, Any, int]] = []
    covered = [t, items[0]]
    for n in items[1:]:
        s = _shape(gm, values, n)
        if len(s) != 3 or s[0] != batch or s[2] != dim:
            return None
        row = _as_row(gm, values, n, batch, dim) if s[1] == 1 else None
        if row is not None:
            chunks.append(("emb", row, 1))
            covered.append(n)
        elif is_call(n, aten.stack.default) and len(n.users) == 1 and _stacked_rows(gm, values, n, batch, dim):
            chunks += [("emb", e, 1) for e in n.args[0]]
            covered.append(n)
        elif (rows := _viewed_rows(gm, values, n, batch, dim, s[1])) is not None:
            chunks += [("emb", e, 1) for e in rows]
            covered += [n, n.args[0]]
        else:
            chunks.append(("block", n, s[1]))
    return Features(t, x, chunks, covered, batch, dim)


def _viewed_rows(gm: Any, values: dict[str, Any], n: Any, batch: int, dim: int, k: int) -> list[Any] | None:
    """The k (B, D) rows that `n`, a (B, k, D) view of cat(rows, 1) used by `n` alone, is made of (TorchRec's
    SparseArch: its pooled embeddings cat'ed, then reshaped to (B, F, D)), or None."""
    c = n.args[0] if is_call(n, *VIEWS) else None
    if not is_call(c, aten.cat.default) or len(c.users) != 1 or _dim_arg(c, 1, 2) != 1 or len(c.args[0]) != k:
        return None
    rows = list(c.args[0])
    return rows if all(_shape(gm, values, e) == (batch, dim) for e in rows) else None


def _stacked_rows(gm: Any, values: dict[str, Any], n: Any, batch: int, dim: int) -> bool:
    return _dim_arg(n, 1, 3) == 1 and all(_shape(gm, values, e) == (batch, dim) for e in n.args[0])


def features_of(gm: Any, values: dict[str, Any], t: Any) -> Features | None:
    """The Features of the tensor a bmm multiplies, or None if it is not built from a dense x and embeddings."""
    shape = _shape(gm, values, t)
    if shape is None or len(shape) != 3:
        return None
    feats = None
    if is_call(t, aten.stack.default):
        feats = _stacked(gm, values, t)
    elif is_call(t, *VIEWS):
        feats = _cat_viewed(gm, values, t, shape)
    elif is_call(t, aten.cat.default):
        feats = _cat_3d(gm, values, t, shape)
    return feats if feats is not None and shape[1] == feats.tables + 1 else None


def _is_transpose(t: Any, b: Any) -> bool:
    if is_call(b, aten.transpose.int) and b.args[0] is t:
        return {b.args[1] % 3, b.args[2] % 3} == {1, 2}
    if is_call(b, aten.permute.default) and b.args[0] is t:
        return [d % 3 for d in b.args[1]] == [0, 2, 1]
    return False


def _full_slice(node: Any) -> bool:
    """slice(z, 0, 0, end >= B): z[:] (DLRM's `Z[:, li, lj]` exports one)."""
    if not is_call(node, aten.slice.Tensor):
        return False
    dim, start, end = (scalar_arg(node, 1, "dim", 0), scalar_arg(node, 2, "start", None),
                       scalar_arg(node, 3, "end", None))
    step = scalar_arg(node, 4, "step", 1)
    return dim == 0 and start in (0, None) and (end is None or (isinstance(end, int) and end >= BIG)) and step == 1


@dataclass
class Gather:
    node: Any  # (B, P): the pairs
    index: tuple[Any, ...]  # li, lj nodes, or the one flat index node
    covered: list[Any]


def _gather_at(node: Any, flat: bool) -> Gather | None:
    """A user of `node` ((B, F, F) or, `flat`, (B, F*F)) that gathers pairs by index tensors."""
    for g in node.users:
        idx = g.args[1] if is_call(g, aten.index.Tensor) else None
        if not flat and idx is not None and len(idx) == 3 and idx[0] is None and None not in idx[1:]:
            return Gather(g, (idx[1], idx[2]), [g])
        if flat and idx is not None and len(idx) == 2 and idx[0] is None and idx[1] is not None:
            return Gather(g, (idx[1],), [g])
        if flat and is_call(g, aten.index_select.default) and _dim_arg(g, 1, 2) == 1:
            return Gather(g, (g.args[2],), [g])
    return None


def _gather(gm: Any, values: dict[str, Any], z: Any, batch: int, f: int) -> Gather | str:
    """The node gathering z's pairs, through z[:] slices and a flatten to (B, F*F), or why there is none."""
    todo, seen = [(z, False, [z])], []
    while todo:
        node, flat, path = todo.pop(0)
        seen.append(node)
        found = _gather_at(node, flat)
        if found is not None:
            return Gather(found.node, found.index, path + found.covered)
        for user in node.users:
            if _full_slice(user):
                todo.append((user, flat, path + [user]))
            elif not flat and (is_call(user, *VIEWS) or is_call(user, aten.flatten.using_ints)) \
                    and _shape(gm, values, user) == (batch, f * f):
                todo.append((user, True, path + [user]))
    others = sorted({str(getattr(u.target, "__name__", u.target)) for n in seen for u in n.users} - {"slice.Tensor"})
    return f"Z = bmm(t, t^T) goes to {', '.join(others) or 'nothing'}, not a gather of its lower triangle"


def pairs_of(gm: Any, values: dict[str, Any], gather: Gather, f: int) -> tuple[list[tuple[int, int]], str]:
    """The (i, j) pairs the gather takes, in order, or why they cannot be read."""
    if any(ancestors_include(n) for n in gather.index):
        return [], "the pair indices are computed from the model's inputs, not constants"
    vals = [tensor_value(gm, values, n) for n in gather.index]
    if any(not isinstance(v, torch.Tensor) or v.dim() != 1 for v in vals):
        return [], "no 1-D example values for the pair indices"
    if len(vals) == 1:
        flat = vals[0].long() % (f * f)
        return list(zip((flat // f).tolist(), (flat % f).tolist())), ""
    li, lj = (v.long() % f for v in vals)
    if li.numel() != lj.numel():
        return [], "the two pair-index tensors differ in length"
    return list(zip(li.tolist(), lj.tolist())), ""


def self_interaction_of(pairs: list[tuple[int, int]], f: int) -> tuple[bool, list[int] | None] | str:
    """(self-interaction, order) where `pairs` are the lower triangle of Z without (False) or with (True) its
    diagonal, in any order and either orientation (Z is symmetric: (j, i) is the number (i, j) is): `order`
    None for DLRM's (tril_indices, row-major), else the position in that order of each pair the model gathers
    (TorchRec's triu_indices(offset=1) row by row, say), which the kernel's output is permuted by. Else why not."""
    for diagonal in (False, True):
        li, lj = torch.tril_indices(f, f, offset=0 if diagonal else -1).tolist()
        tril = list(zip(li, lj))
        if pairs == tril or pairs == [(j, i) for i, j in tril]:
            return diagonal, None
        where_in = {p: k for k, p in enumerate(tril)}
        order = [where_in.get((max(p), min(p)), -1) for p in pairs]
        if len(order) == len(tril) and sorted(order) == list(range(len(tril))):
            return diagonal, order
    return "the gathered pairs are not the lower triangle of Z (each pair once, in any order)"


@dataclass
class Site:
    feats: Features
    bmm: Any
    gather: Gather
    out: Any
    self_interaction: bool
    index_nodes: list[Any]
    order: list[int] | None = None  # the model's pairs' positions in DLRM's order (None: that order)


def _index_nodes(gather: Gather) -> list[Any]:
    """The constant subgraph computing the pair indices (tril_indices, unbind, getitems, lifted constants) that
    only this gather uses: the match covers it (a subgraph shared with other code stays theirs)."""
    ancestors: list[Any] = []
    todo = list(gather.index)
    while todo:
        n = todo.pop()
        if n in ancestors or getattr(n, "op", None) != "call_function":
            continue
        ancestors.append(n)
        todo.extend(n.all_input_nodes)
    mine = {gather.node}
    grew = True
    while grew:
        grew = False
        for n in ancestors:
            if n not in mine and all(u in mine for u in n.users):
                mine.add(n)
                grew = True
    return [n for n in ancestors if n in mine]


def _site(gm: Any, values: dict[str, Any], bmm: Any) -> Site | str | None:
    """The interaction rooted at this bmm, why its look-alike is refused, or None (not interaction-like)."""
    t, b = bmm.args[0], bmm.args[1]
    feats = features_of(gm, values, t)
    if feats is None:
        return None
    if not _is_transpose(t, b):
        return "bmm's second operand is not t.transpose(1, 2): it does not compute the features' dot products"
    f = feats.tables + 1
    gather = _gather(gm, values, bmm, feats.batch, f)
    if isinstance(gather, str):
        return gather
    pairs, why = pairs_of(gm, values, gather, f)
    if why:
        return why
    found = self_interaction_of(pairs, f)
    if isinstance(found, str):
        return found
    diagonal, order = found
    out = next((u for u in gather.node.users if is_call(u, aten.cat.default) and _dim_arg(u, 1, 2) == 1
                and list(u.args[0]) == [feats.x, gather.node]), None)
    if out is None:
        return "the gathered pairs are not concatenated after the dense vector as cat([x, pairs], 1)"
    x = tensor_value(gm, values, feats.x)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        return f"the features are {getattr(x, 'dtype', 'unknown')}: kernels take float32"
    return Site(feats, bmm, gather, out, diagonal, _index_nodes(gather), order)


def _select_source(gm: Any, values: dict[str, Any], embs: list[Any], feats: Features) -> Any:
    """v when embs are select(v, 1, k) for k = 0..T-1 of one contiguous (B, T, D) tensor v, else None."""
    if not all(is_call(e, aten.select.int) for e in embs):
        return None
    v = embs[0].args[0]
    if any(e.args[0] is not v or e.args[1] % 3 != 1 or e.args[2] != k for k, e in enumerate(embs)):
        return None
    val = tensor_value(gm, values, v)
    ok = isinstance(val, torch.Tensor) and tuple(val.shape) == (feats.batch, len(embs), feats.dim)
    return v if ok and val.is_contiguous() else None


def _ly_plan(gm: Any, values: dict[str, Any], feats: Features) -> tuple[str, Any]:
    """How to make ly (B, T, D) from the chunks: ("in place", v) | ("stack", embs) | ("view", (node, k)) |
    ("block", node) | ("cat", chunks)."""
    chunks = feats.chunks
    if all(kind == "emb" for kind, _, _ in chunks):
        embs = [n for _, n, _ in chunks]
        v = _select_source(gm, values, embs, feats)
        return ("in place", v) if v is not None else ("stack", embs)
    if len(chunks) == 1:
        kind, node, k = chunks[0]
        val = tensor_value(gm, values, node)
        if isinstance(val, torch.Tensor) and val.is_contiguous():
            return ("view", (node, k)) if kind == "flat" else ("block", node)
    return ("cat", chunks)


def _build_ly(gm: Any, plan: tuple[str, Any], dim: int) -> Any:
    kind, what = plan
    g = gm.graph
    if kind in ("in place", "block"):
        return what
    if kind == "stack":
        return g.call_function(aten.stack.default, (what, 1))
    if kind == "view":
        return g.call_function(aten.view.default, (what[0], [-1, what[1], dim]))
    pieces = [g.call_function(aten.unsqueeze.default, (n, 1)) if k_ == "emb" else
              g.call_function(aten.reshape.default, (n, [-1, k, dim])) if k_ == "flat" else n
              for k_, n, k in what]
    return g.call_function(aten.cat.default, (pieces, 1))


_ORDERED = "; its pairs put in the model's order (one column gather)"
_COPIES = {"in place": "reading the embeddings in place (no copy)", "stack": "one stack copy of the embeddings",
           "view": "reading the embeddings in place (a view, no copy)",
           "block": "reading the embeddings in place (no copy)", "cat": "one cat copy of the embeddings"}


def in_model_order(gm: Any, out: Any, order: list[int] | None, x: Any, dim: int) -> Any:
    """`out`, the kernel's [x (`dim` wide), pairs in DLRM's order] (inserted at the graph's insertion point), with
    its pair columns put in the model's `order` (one index_select over constant columns on x's device), or `out`
    itself for None."""
    if order is None:
        return out
    device = getattr(x.meta.get("val"), "device", None) or torch.device("cpu")
    cols = torch.tensor([*range(dim), *(dim + k for k in order)], dtype=torch.int64, device=device)
    return gm.graph.call_function(aten.index_select.default, (out, 1, register(gm, "autotune_pair_order", cols)))


def _replace(site: Site, plan: tuple[str, Any]) -> Any:
    def replace(gm: Any) -> tuple[Any, ...]:
        inputs = [site.feats.x] + [n for _, n, _ in site.feats.chunks]
        with gm.graph.inserting_before(insertion_point(gm, inputs, [site.out])):
            ly = _build_ly(gm, plan, site.feats.dim)
            new = gm.graph.call_function(torch.ops.autotune.interaction.default,
                                         (site.feats.x, ly, site.self_interaction))
            new = in_model_order(gm, new, site.order, site.feats.x, site.feats.dim)
        new.meta["nn_module_stack"] = site.bmm.meta.get("nn_module_stack", {})
        return (new,)

    return replace


def site_of(gm: Any, values: dict[str, Any], bmm: Any) -> Site | str | None:
    """The interaction rooted at this bmm (its features, gather, output and pair order), why its look-alike is
    refused, or None: for the rules that fuse this one."""
    return _site(gm, values, bmm)


def find(gm: Any, values: dict[str, Any], claimed: set[Any]) -> Iterator[GraphMatch | Kept]:
    """Every bmm of features built from a dense vector and embeddings: a match, or a look-alike kept."""
    for bmm in [n for n in gm.graph.nodes if is_call(n, aten.bmm.default) and n not in claimed]:
        site = _site(gm, values, bmm)
        if site is None:
            continue
        if isinstance(site, str):
            yield Kept(RULE, where([bmm]), site)
            continue
        feats = site.feats
        fields = dict(batch=feats.batch, tables=feats.tables, dim=feats.dim, self_interaction=site.self_interaction)
        why = workload_error(Workload, fields)
        if why:
            yield Kept(RULE, where([bmm]), why)
            continue
        plan = _ly_plan(gm, values, feats)
        nodes = [*feats.covered, site.feats.t, *site.bmm.args[1:2], bmm, *site.gather.covered, *site.index_nodes,
                 site.out]
        yield GraphMatch(
            rule=RULE, nodes=tuple(dict.fromkeys(nodes)), outputs=(site.out,), tasks=((RULE, fields),),
            replace=_replace(site, plan), tolerance=tolerance(Workload(**fields)), where=where([bmm]),
            what=(f"dot interaction ({feats.tables} tables, dim {feats.dim}"
                  f"{', self-interaction' if site.self_interaction else ''}) -> interaction, {_COPIES[plan[0]]}"
                  f"{_ORDERED if site.order is not None else ''}"))


RULES = (GraphRule(RULE, find),)
