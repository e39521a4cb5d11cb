"""The model rewritten as a whole, and judged as a whole: what a replacement's own speed check cannot see.

`Rewriter.rewritten(floors)` takes the captured model afresh (a copy of one capture), tunes the tasks its sites
need (through the session), runs the rules, then asks the whole model two questions by timing it: does a rule
whose replacements each lost their own check pay off across its neighbours (`whole_model_check`), and does each
group of fusing rules beat the rules it fuses (`fusion_check`)? The model tune_model would return must also beat
the model as given (`given_check`). A replacement is timed once per call
(`speed.Timings`), however many rewrites meet it. `measure` times eager against the result.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch.utils import _pytree as pytree

from search_spaces.template import GraphRule

from . import speed as _speed
from .capture import copy_captured
from .graph import Rewrite, capture, discover, rewrite
from .report import TuneModelReport
from .session import TuningSession
from .speed import SpeedCheck, ms

__all__ = ["Cycled", "Rewriter", "Verdicts", "fusion_check", "fusion_groups", "given_check", "max_diff",
           "measure", "whole_model_check"]


@dataclass(frozen=True)
class Verdicts:
    """What a judged rewrite decided: the rules it ran (a fusing group the fusion check left out is not among
    them) and those whose replacements the whole-model check wired in though each lost its own speed check.
    `Rewriter.rewritten(replay=...)` makes the same choices for a model a few layers' precision apart, without
    timing whole models again."""

    ruleset: tuple[GraphRule, ...]
    wired: frozenset[str] = frozenset()


@dataclass
class Rewriter:
    """What every rewrite of one tune_model call shares: the model, its inputs, the rules, the speed check (None:
    none), the tuning session and the report the verdicts go to."""

    model: torch.nn.Module
    args: tuple[Any, ...]
    timing: list[tuple[Any, ...]]  # the example first, then the batches every timing cycles through
    ruleset: list[GraphRule]
    check: SpeedCheck | None
    session: TuningSession
    times: dict[str, float]  # node name -> eager seconds on the example inputs (each task's share)
    report: TuneModelReport
    timings: _speed.Timings = dataclasses.field(default_factory=_speed.Timings)  # replacements timed so far
    captured: Any = None  # the model captured once, never rewritten (None: captured on first use)

    def fresh(self) -> Any:
        """The model as captured, to rewrite in place: a copy of the one capture (`capture.copy_captured`)."""
        if self.captured is None:
            self.captured = capture(self.model, self.args)
        return copy_captured(self.captured)

    def rewritten(self, floors: dict[str, str], judged: bool = True,
                  replay: Verdicts | None = None) -> tuple[Any, Rewrite, Verdicts]:
        """The model as captured (a fresh copy) and rewritten with each layer no coarser than its floor (those at
        "fp32" left to the fp32 rules): the tasks its sites need tuned (those this call has not tuned yet), the
        package exported and loaded, the rules run, and with speed checks (and `judged`) the whole-model and
        fusion checks. Unjudged, each replacement still passes its own speed check: a draft (the precision
        ladder's steps towards the contract) that costs a few seconds where the model's checks cost tens.
        `replay`: an earlier judged rewrite's verdicts, taken as they are (unjudged), for a model that differs
        from that one in a few layers' precision."""
        self.report.whole_model.clear()  # this rewrite's verdicts only
        rw = self if replay is None else dataclasses.replace(self, ruleset=list(replay.ruleset))
        gm = self.fresh()
        found = discover(gm, self.args, rw.ruleset, floors)
        self.session.tune(self.session.add([*found.matches, *found.alternatives], self.times))
        if replay is not None:
            return rw.rewrite(gm, floors, replay.wired, judged=False)
        return self.rewrite(gm, floors, judged=judged)

    def rewrite(self, gm: Any, floors: dict[str, str], wired: frozenset[str] = frozenset(),
                fusions: bool = True, judged: bool = True) -> tuple[Any, Rewrite, Verdicts]:
        """`gm` rewritten by this rewriter's rules on the kernels tuned so far, then (with speed checks, where
        `judged`) judged as a whole, and each group of fusing rules against the rules it fuses where `fusions`
        (`wired`: rules whose replacements go in unchecked, judged by the caller); and what was decided."""
        done = rewrite(gm, self.args, self.ruleset, self.session.ready(), self.check, wired, floors, self.timing[1:],
                       self.timings)
        verdicts = Verdicts(tuple(self.ruleset), wired)
        if self.check is not None and judged and not wired:
            gm, done, verdicts = whole_model_check(self, gm, done, floors)
            if fusions:
                gm, done, verdicts = fusion_check(self, gm, done, floors, verdicts)
        return gm, done, verdicts

    def time_pair(self, now: Any, alt: Any) -> tuple[float, float]:
        """Both models timed over the timing cycle (`check.model_rounds` interleaved rounds, medians)."""
        assert self.check is not None
        with torch.inference_mode():
            return _speed.time_pair(Cycled(now, self.timing), Cycled(alt, self.timing), self.check.for_models())


def whole_model_check(rw: Rewriter, gm: Any, done: Rewrite,
                      floors: dict[str, str]) -> tuple[Any, Rewrite, Verdicts]:
    """A second opinion, by the whole model, on each rule whose replacements lost their own speed check.

    A replacement is timed as its own subgraph, which misses what it does to its neighbours: the table-batched
    launch writes (B, T, D), which the interaction then reads in place, so wiring it in also removes the stack
    copy the interaction otherwise makes (on the Criteo-shaped DLRM the batched op alone can be slower than the
    26 bags, and the model faster with it: benchmarks/WHOLE_MODEL.md). For each such rule, in rule order, the
    model is rewritten again with that rule's replacements wired in unchecked, and the two rewritten models are
    timed; the faster by `check.margin` is kept, and the report says what each took."""
    assert rw.check is not None
    wired: frozenset[str] = frozenset()  # rules this check wired in so far
    for rule in rw.ruleset:
        if not any(k.slower and k.rule == rule.name for k in done.kept):
            continue
        alt_gm, alt, _ = rw.rewrite(rw.fresh(), floors, wired | {rule.name})
        now_s, alt_s = rw.time_pair(gm, alt_gm)
        faster = alt_s <= now_s * (1.0 - rw.check.margin)
        rw.report.whole_model.append(f"{rule.name}: the model takes {ms(alt_s)} with its replacements, "
                                     f"{ms(now_s)} without: {'wired in' if faster else 'kept out'}")
        if faster:
            gm, done, wired = alt_gm, alt, wired | {rule.name}
    return gm, done, Verdicts(tuple(rw.ruleset), wired)


def fusion_check(rw: Rewriter, gm: Any, done: Rewrite, floors: dict[str, str],
                 verdicts: Verdicts) -> tuple[Any, Rewrite, Verdicts]:
    """The whole model with each group of fusing rules' replacements (`GraphRule.fuses`, e.g. the embedding bags
    and the interaction as one kernel; rules that fuse a rule in common are one group) against the model
    rewritten without that group, where the other rules take its sites (with their own whole-model check):
    timed as `whole_model_check` times, the fused model is kept only if faster by `check.margin`, and the
    report says what each took. Groups are judged in rule order, each against the model the earlier left."""
    assert rw.check is not None
    for group in fusion_groups(rw.ruleset):
        fusing = [r for r in group if any(d.rule == r.name for d in done.replaced)]
        if not fusing:
            continue
        apart = dataclasses.replace(rw, ruleset=[r for r in rw.ruleset if r not in group])
        names = " and ".join(r.name for r in fusing)
        before = len(rw.report.whole_model)
        alt_gm, alt, alt_verdicts = apart.rewrite(rw.fresh(), floors, fusions=False)
        rw.report.whole_model[before:] = [f"without {names}, {v}" for v in rw.report.whole_model[before:]]
        fused_s, apart_s = rw.time_pair(gm, alt_gm)
        faster = fused_s <= apart_s * (1.0 - rw.check.margin)
        fused_rules = " + ".join(dict.fromkeys(f for r in fusing for f in r.fuses))
        rw.report.whole_model.append(f"{names}: the model takes {ms(fused_s)} with it, {ms(apart_s)} with "
                                     f"{fused_rules} apart: {'kept' if faster else 'left out'}")
        if not faster:
            gm, done, rw, verdicts = alt_gm, alt, apart, alt_verdicts
    return gm, done, verdicts


def given_check(rw: Rewriter, rewritten: Any) -> bool:
    """The last word: the rewritten model against the model as given (its own module, eager), timed as
    `whole_model_check` times; True where the rewritten one is faster by `check.margin`, and the report says what
    each took. Every replacement can win its own check and the whole rewrite still lose: on a small model the
    captured module's calling convention (flattening the inputs, checking them, unflattening the outputs) costs
    more than its kernels save, and a TorchRec DLRM at batch 64 came back at 0.6x of eager before this check."""
    assert rw.check is not None
    given_s, rewritten_s = rw.time_pair(rw.model, rewritten)
    faster = rewritten_s <= given_s * (1.0 - rw.check.margin)
    rw.report.whole_model.append(f"the rewritten model takes {ms(rewritten_s)}, the model as given {ms(given_s)}: "
                                 f"{'returned' if faster else 'the model as given is returned'}")
    return faster


def fusion_groups(rules: Sequence[GraphRule]) -> list[list[GraphRule]]:
    """The fusing rules in groups, in rule order: rules whose `fuses` share a name (the fused embedding stage's
    int8, fp16 and fp32 rules all fuse the interaction) are one alternative to the rules they fuse."""
    groups: list[list[GraphRule]] = []
    for rule in (r for r in rules if r.fuses):
        joined = [g for g in groups if any(set(rule.fuses) & set(o.fuses) for o in g)]
        groups = [g for g in groups if g not in joined]
        groups.append(sorted([rule, *(o for g in joined for o in g)], key=list(rules).index))
    return sorted(groups, key=lambda g: list(rules).index(g[0]))


class Cycled:
    """A call of `model` on the next of `batches` each time (cycling), for the timers; `model` says which model a
    timed side runs."""

    def __init__(self, model: Any, batches: Sequence[tuple[Any, ...]]):
        self.model = model
        self._batches = itertools.cycle(batches)

    def __call__(self) -> Any:
        return self.model(*next(self._batches))


def measure(report: TuneModelReport, model: torch.nn.Module, gm: torch.nn.Module,
            batches: Sequence[tuple[Any, ...]], rounds: int, seconds: float) -> None:
    """Max |optimized - eager| on the example inputs, and both latencies over the cycle of `batches`
    (interleaved rounds, medians)."""
    args = batches[0]
    with torch.inference_mode():
        ref, out = model(*args), gm(*args)
        report.max_abs_diff = max_diff(ref, out)
        if rounds < 1:
            return
        from ..bench import median_seconds

        times: dict[str, list[float]] = {"eager": [], "optimized": []}
        eager, optimized = Cycled(model, batches), Cycled(gm, batches)
        for _ in range(rounds):
            times["eager"].append(median_seconds(eager, seconds))
            times["optimized"].append(median_seconds(optimized, seconds))
    report.eager_s = statistics.median(times["eager"])
    report.optimized_s = statistics.median(times["optimized"])


def max_diff(ref: Any, out: Any) -> float:
    """Max |out - ref| over the leaves of two outputs (nan where their structure or shapes differ)."""
    a, b = pytree.tree_leaves(ref), pytree.tree_leaves(out)
    if len(a) != len(b):
        return math.nan
    worst = 0.0
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape:
                return math.nan
            if x.numel():
                worst = max(worst, float((x.double() - y.double()).abs().max()))
    return worst
