"""The precision ladder: which layers of a rewritten model run in int8, 16 bits or fp32, held to the contract.

Each reduced-precision layer (`Reduced`, a quantizing rule's) starts at its rule's precision, or a rung up where
`accuracy.plan` (simulated, before anything is tuned) says the contract needs it. `hold` then rewrites the
model on its real kernels and, while the check batches break the contract, moves one more layer one step up
(int8 -> bf16 -> fp32): the cheapest whose share of the error covers the excess, else the largest share.
`finer_if_faster` then moves a rule's int8 layers up where the whole model runs faster so. `report` says each
layer's precision and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from search_spaces._graph import is_call
from search_spaces.template import PRECISIONS, GraphMatch, Kept, Reduced, finer

from . import accuracy
from .accuracy import AccuracyReport, Batch, BatchError, LayerPrecision, Tolerance
from .dense import RELUS
from .graph import Rewrite
from .speed import ms
from .whole_model import Rewriter, Verdicts

__all__ = ["Outcome", "PrecisionLadder", "reduced_layers"]


def reduced_layers(matches: Sequence[GraphMatch]) -> list[Reduced]:
    """Every layer the matches would run in reduced precision, in graph order."""
    return [layer for m in matches for layer in m.reduced]


@dataclass
class Outcome:
    """A rewritten model, its rewrite, its errors on the check batches and the floors it was rewritten with
    (node -> the coarsest precision it was allowed)."""

    model: Any
    done: Rewrite
    errors: list[BatchError]
    floors: dict[str, str]
    judged: bool = True  # False: a draft, without the whole-model and fusion checks (`Rewriter.rewritten`)
    verdicts: Verdicts | None = None  # what its rewrite decided (replayed by `finer_if_faster`'s tries)

    @property
    def holds(self) -> bool:
        return all(e.holds for e in self.errors)


class PrecisionLadder:
    """The layers `layers` of the captured `gm` on the ladder, judged by `contract` on `checks`, the model
    rewritten by `rw`."""

    def __init__(self, rw: Rewriter, gm: Any, checks: Sequence[Batch], contract: Tolerance,
                 layers: Sequence[Reduced]):
        self.rw, self.gm, self.checks, self.contract, self.layers = rw, gm, checks, contract, list(layers)
        self.shares = accuracy.layer_shares(gm, checks, self.layers, contract)
        self._known = {(layer.node, layer.precision): self.shares[layer.node] for layer in self.layers}
        self.costs = accuracy.layer_costs(self.layers, rw.times)
        self.planned = accuracy.plan(gm, checks, self.layers, contract, self.shares, self.costs)

    def share(self, layer: Reduced) -> float:
        """A layer's share of the error (`accuracy.layer_shares`) at the precision it runs in, simulated once per
        (node, precision): the bf16 rung's layers appear only once the contract moves them there."""
        key = (layer.node, layer.precision)
        if key not in self._known:
            self._known[key] = accuracy.layer_shares(self.gm, self.checks, [layer], self.contract)[layer.node]
        return self._known[key]

    def _outcome(self, floors: dict[str, str], judged: bool = True, replay: Verdicts | None = None) -> Outcome:
        model, done, verdicts = self.rw.rewritten(floors, judged, replay)
        return Outcome(model, done, accuracy.check(model, self.checks, self.contract), floors,
                       judged and replay is None, verdicts)

    def hold(self) -> Outcome:
        """The model with the planned layers one step up the ladder (bf16 where a rule runs it, else fp32), then,
        while its real kernels break the contract, one more layer one step up each time
        (`accuracy.next_to_fall_back` of the measured error, over each layer's share at its precision).

        The steps are drafts (`Rewriter.rewritten(judged=False)`: each replacement speed-checked, the model's
        whole-model and fusion checks left out); the first draft that holds is rewritten again, judged, and
        that model is the one that must hold (else the steps go on from it)."""
        floors = {name: finer(PRECISIONS[0]) for name in self.planned}
        drafts = self.rw.check is not None  # without speed checks a draft would be the model itself
        while True:
            now = self._outcome(floors, judged=not drafts)
            running = running_layers(now.done)
            if (now.holds or not running) and not now.judged:
                now = self._outcome(floors)
                running = running_layers(now.done)
            if now.holds or not running:
                return now
            ratio = max(e.ratio for e in now.errors)
            step = running[accuracy.next_to_fall_back(
                ratio, {node: self.share(layer) for node, layer in running.items()}, self.costs)]
            floors = {**floors, step.node: finer(step.precision)}

    def finer_if_faster(self, now: Outcome) -> Outcome:
        """A finer rung that runs faster than int8 is the better choice outright (on CPUs whose bf16 GEMMs run on
        AMX tiles, oneDNN's bf16 Linear beats a VNNI int8 kernel: benchmarks/WHOLE_MODEL.md). For each rule
        whose layers run in int8, in rule order, the model is rewritten with those layers one rung up and timed
        against the model as it stands; kept if faster by `check.margin` and within the contract. Then, one at a
        time, each int8 layer that feeds a layer the contract moved to bf16: one rung up, the two chain in bf16
        (dense.RULE_CHAIN: no float32 activation between them), which may pay where either alone does not. Each
        try replays the judged model's verdicts (`Rewriter.rewritten(replay=...)`: the same fusions and wired
        rules), so that the rung is what the timing compares. The report's whole-model lines say what each
        took."""
        rw = self.rw
        assert rw.check is not None
        verdicts, lines = list(rw.report.whole_model), []  # the model's own checks (`rewritten` starts afresh), ours
        tries = [(f"{rule.name}'s int8 layers", lambda d, rule=rule: _layers_of(d, rule.name)) for rule in rw.ruleset]
        tries += [(f"the int8 layer {running_layers(now.done)[node].where} (it feeds a bf16 layer)",
                   lambda d, node=node: [node]) for node in self._feeding_bf16(now)]
        for label, layers in tries:
            running = running_layers(now.done)
            nodes = [n for n in layers(now.done) if n in running and running[n].precision == PRECISIONS[0]]
            if not nodes:
                continue
            alt = self._outcome({**now.floors, **{node: finer(PRECISIONS[0]) for node in nodes}},
                                replay=now.verdicts)
            now_s, alt_s = rw.time_pair(now.model, alt.model)
            faster = alt.holds and alt_s <= now_s * (1.0 - rw.check.margin)
            lines.append(f"{label} one rung up: the model takes {ms(alt_s)} with them, {ms(now_s)} in int8: "
                         f"{'moved up' if faster else 'left in int8'}"
                         f"{'' if alt.holds else ' (it breaks the tolerance)'}")
            if faster:
                now = alt
            rw.report.whole_model[:] = [*verdicts, *lines]
        return now

    def _feeding_bf16(self, now: Outcome) -> list[str]:
        """The int8 layers (Linear nodes of the captured model) whose output, through a ReLU or not, is the
        input of a Linear whose floor is bf16."""
        int8 = {node for node, layer in running_layers(now.done).items() if layer.precision == PRECISIONS[0]}
        bf16 = {node for node, floor in now.floors.items() if floor == finer(PRECISIONS[0])}
        if not int8 or not bf16:
            return []
        found = []
        for n in self.gm.graph.nodes:
            if n.name not in int8:
                continue
            outs = [n, *(u for u in n.users if is_call(u, *RELUS))]
            if any(is_call(u, torch.ops.aten.linear.default) and u.name in bf16 and u.args[0] is o
                   for o in outs for u in o.users):
                found.append(n.name)
        return found

    def report(self, final: Outcome, for_speed: set[str] = frozenset()) -> AccuracyReport:
        """Each reduced-precision layer's final precision (and why it is finer than its rule's: the contract, or
        `for_speed`, the nodes moved up because the finer rung ran faster), and the measured errors."""
        quantizing = {r.name for r in self.rw.ruleset if r.quantizes}
        running = running_layers(final.done)
        out = AccuracyReport(self.contract, final.errors)
        unique: dict[str, Reduced] = {}  # a table is a layer of a fusion's match and of its alternatives alike
        for layer in self.layers:
            unique.setdefault(layer.node, layer)
        for layer in unique.values():
            run = running.get(layer.node)
            precision = run.precision if run is not None else "fp32"
            if layer.node in for_speed and precision != layer.precision:
                why = f"in {precision}: faster than {layer.precision} here"
            elif layer.node in final.floors and precision != layer.precision:
                why = f"{'kept ' * (precision == 'fp32')}in {precision} to hold the tolerance"
            elif precision == "fp32":
                why = why_kept(layer, final.done.kept, quantizing)
            else:
                why = ""
            out.layers.append(LayerPrecision(layer.where, run.what if run is not None else layer.what, precision,
                                             self.shares.get(layer.node, 0.0), why))
        return out


def _layers_of(done: Rewrite, rule: str) -> list[str]:
    return [layer.node for r in done.replaced if r.rule == rule for layer in r.reduced]


def running_layers(done: Rewrite) -> dict[str, Reduced]:
    """Each node a kept replacement runs in reduced precision -> its layer (and so its precision)."""
    return {layer.node: layer for r in done.replaced for layer in r.reduced}


def why_kept(layer: Reduced, kept: Sequence[Kept], quantizing: set[str]) -> str:
    """Why each reduced-precision rule that could hold `layer` left it (its modules among the kept match's),
    rule by rule: int8 may refuse a layer by its shape and bf16 then lose its speed check."""
    paths = set(layer.where.split(", "))
    whys = [f"{k.rule}: {k.why}" for k in kept if k.rule in quantizing and paths <= set(k.where.split(", "))]
    return "; ".join(dict.fromkeys(whys)) or "its site was not rewritten"
