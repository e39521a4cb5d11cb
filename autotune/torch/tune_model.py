"""`tune_model(model, example_inputs, log_dir=...)`: find the operators a model runs, tune them, rewrite the model.

    optimized, report = autotune.torch.tune_model(model, (dense, indices, offsets), log_dir="logs/local/m")
    print(report)  # tasks and their share of eager time, what was replaced and kept (why), eager vs optimized

Steps: capture the graph (torch.export: `graph.capture`); the operators' graph rules list the sites and the
tasks their kernels need; each node is timed on the example inputs, so each task shows its share of the eager
time; each task is tuned (`log_dir/<op>.jsonl`, resuming: a task with `trials` configs in its log tunes
nothing, and records of other shapes of the op warm the cost model); the best record of each task (a shipped
record of the same workload and CPU when faster) is exported to `log_dir/package` (kept as it is when it already
holds exactly those kernels) and loaded; the rules rewrite the graph, each replacement kept only if it
reproduces the model's values on the example inputs and (`require_speedup`) runs faster than the code it
replaces there, timed interleaved (`speed.py`: a tuned kernel can agree and still lose to PyTorch, as int8
Linears do on small CPUs); a rule that fuses others' sites (`GraphRule.fuses`: the embedding bags and the
interaction as one kernel) is kept only where the whole model runs faster with it than with the other rules'
replacements there (their tasks are tuned too); the rewritten model is held to the accuracy contract
(`tolerance`, on the example and held-out batches: `accuracy.py`), layers that break it moving up the precision
ladder (int8, bf16 where a rule runs it, fp32) one at a time: the cheapest whose share of the error covers the
excess, else the largest share; then, with speed checks, each rule's int8 layers one rung up where the whole
model runs faster so, and the result is returned only where it runs faster than the model as given (else the
model comes back unchanged); eager and optimized latency are measured interleaved. Every timing cycles through
the example batch and fresh ones drawn like it (`timing_batches`), as a model meets them: one batch repeated
keeps its rows in cache.
The kernels serve the returned model through `torch.ops.autotune.*` in this process (the package is loaded
into `autotune.torch.REGISTRY`); another process loads `log_dir/package` with `autotune.torch.load`.

Where each step lives: `graph.py` (capture, discover, rewrite), `profiling.py` (each node's eager time),
`rules.py` (the rules' one order), `session.py` (tasks, logs, builder and runner, the package), `whole_model.py`
(the whole-model, fusion and model-as-given checks), `ladder.py` (the precision ladder), `accuracy.py` (the
contract), `report.py` (what comes back).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from search_spaces.template import GraphRule

from . import accuracy
from .accuracy import Tolerance
from .capture import as_args, capture
from .graph import discover
from .ladder import PrecisionLadder, reduced_layers
from .profiling import node_times
from .report import TaskReport, TuneModelReport
from .rules import collect_rules
from .session import TuningSession
from .speed import SpeedCheck, Timings
from .whole_model import Rewriter, given_check, measure

__all__ = ["TaskReport", "Tolerance", "TuneModelReport", "tune_model"]


def tune_model(model: torch.nn.Module, example_inputs: Any, *, device: str = "cpu", log_dir: str | Path,
               trials: int = 64, quantize: bool = True, tolerance: Tolerance | float | None = None,
               check_inputs: Sequence[Any] | None = None, timing_batches: int = 8, progress: bool = True,
               shipped: bool = True, extra_rules: Iterable[GraphRule] = (), rules: Iterable[GraphRule] | None = None,
               bench_rounds: int = 3, bench_seconds: float = 0.3, require_speedup: bool = True,
               speed: SpeedCheck | None = None, runner: Any = "local", builder: Any = None,
               budget: float | None = None, retune: bool = False,
               test_inputs: Sequence[Any] | None = None) -> tuple[torch.nn.Module, TuneModelReport]:
    """Tune the operators `model` runs on `example_inputs` for `device` and return (the rewritten model, the
    report). See the module docstring.

    `trials`: configs per task, counting those already in `log_dir/<op>.jsonl`. `budget`: seconds of tuning
    for the whole call (the precision ladder's later tasks included): each task gets a first batch, then each
    next batch goes to the task whose next batch promises the model the most time per second (`session.py`),
    `trials` capping each; the report says each task's trials, seconds and gain. A task the shipped records of
    this CPU kind cover (same workload and template version) is taken from them, not tuned, unless `retune`.
    `quantize=False` keeps the rules that change numerics (int8 Linear layers) out. `tolerance`: the error
    allowed on each output of the model against eager, `Tolerance(atol, rtol)` (|optimized - eager| <=
    max(atol, rtol x max|eager|)) or a number (atol); default `accuracy.INT8` (max(1e-2, 1e-2 x max|eager|)) with `quantize`, else
    `accuracy.FP32_EXACT` (1e-4 likewise). It is checked on the example inputs and on `check_inputs` (a list of
    held-out batches, each given as `example_inputs` is; [] checks the example alone; default: one drawn like
    the example, see `accuracy.draw_like`): the validation batches every decision is taken on. While the model
    breaks the contract there, int8 layers move to a finer precision one at a time (the cheapest whose share of
    the error covers the excess, else the largest share: `accuracy.next_to_fall_back`), and a model that breaks
    it with none left comes back unchanged; with speed checks, a rule's int8 layers also move one rung up where
    the whole model runs faster so (`ladder.PrecisionLadder.finer_if_faster`). The report also gives the error
    on `test_inputs` (given as `check_inputs` is; default: one drawn with another seed), which no decision saw.
    `timing_batches`: every timing (speed checks, eager against optimized) cycles through this many batches,
    the example, the check batches, then fresh ones drawn like the example; 1 times the example batch alone (its
    rows stay in cache, which flatters gathers).
    `shipped`: a shipped record of the same workload and CPU competes with the tuned ones. `extra_rules` join
    the operators' graph rules (`rules` replaces them). `bench_rounds` interleaved rounds of `bench_seconds`
    per model time eager against optimized (0: no timing). `require_speedup`: a replacement that agrees is also
    timed against the code it replaces and kept out unless it is faster by `speed.margin` (default
    `SpeedCheck()`: 3%, 3 rounds of 0.1 s per side, 9 rounds for whole models, 2 where each clears the margin by
    5%), and the rewritten model is returned only where it is that much faster than `model` itself (timed as
    whole models are); False wires in every replacement that agrees (tests on tiny models, where kernels may
    lose). A model with nothing to replace comes back as it is; example inputs the model rejects raise its own
    error.
    `runner`: where candidates are measured, as `autotune tune --runner` takes it ("local", "rpc://HOST:PORT/KEY"
    through TVM's tracker, "offline:DIR") or a Runner; `builder`: a Builder to compile them (else one pool).
    """
    if speed is not None and not require_speedup:
        raise ValueError("tune_model: speed= sets how replacements are timed, but require_speedup=False times none")
    contract = accuracy.default_tolerance(tolerance, quantize)
    if isinstance(timing_batches, bool) or not isinstance(timing_batches, int) or timing_batches < 1:
        raise ValueError(f"tune_model: timing_batches must be an int >= 1 (1: the example batch alone), got "
                         f"{timing_batches!r}")
    session = TuningSession(device, log_dir, trials, shipped=shipped, progress=progress, runner=runner,
                            builder=builder, budget=budget, retune=retune)  # bad settings refused before any work
    args = as_args(example_inputs)
    gm = capture(model, args)  # never rewritten (copies are): discovery, node times, the simulated int8 layers
    checks = accuracy.check_batches(model, args, check_inputs)
    tests = accuracy.test_batches(model, args, test_inputs)
    timed = require_speedup or bench_rounds > 0
    timing = accuracy.timing_batches(model, checks, timing_batches if timed else 1)
    ruleset = collect_rules(quantize, extra_rules, rules)
    report = TuneModelReport(threads=_threads(), timing_batches=len(timing), budget_s=budget)
    found = discover(gm, args, ruleset)
    if not found.matches:
        report.kept = found.kept
        report.note = "nothing in this model is served by a tuned operator; the model comes back unchanged"
        return model, report
    rw = Rewriter(model, args, timing, ruleset, (speed or SpeedCheck()) if require_speedup else None, session,
                  node_times(gm, args), report, Timings(session.kernels), gm)
    # a fusion's alternatives may run layers in int8 too
    ladder = PrecisionLadder(rw, gm, checks, contract, reduced_layers([*found.matches, *found.alternatives]))
    with session:
        held = ladder.hold()
        final = ladder.finer_if_faster(held) if rw.check is not None and held.holds else held
    report.tasks, report.package, report.exported = session.tasks, session.package, session.exported
    report.replaced, report.kept = final.done.replaced, final.done.kept
    report.accuracy = ladder.report(final, {n for n in final.floors if final.floors[n] != held.floors.get(n)})
    if not report.accuracy.holds:
        report.note = (f"the rewritten model breaks the tolerance ({contract}) even with every int8 layer in "
                       "fp32; the model comes back unchanged")
        return model, report
    if not final.done.replaced:
        report.note = "no replacement was kept; the model comes back unchanged"
        return model, report
    if rw.check is not None and not given_check(rw, final.model):
        report.note = (f"the rewritten model is not {rw.check.margin:.0%} faster than the model as given; the model "
                       "comes back unchanged")
        return model, report
    report.accuracy.tests = accuracy.check(final.model, tests, contract)  # what the model returned is worth
    measure(report, model, final.model, timing, bench_rounds, bench_seconds)
    return final.model, report


def _threads() -> dict[str, str]:
    try:
        from . import threads
    except ImportError:
        return {}
    settings = getattr(threads, "settings", None)
    return dict(settings()) if callable(settings) else {}
