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
model runs faster so;
eager and optimized latency are measured interleaved. Every timing cycles through the example batch and fresh
ones drawn like it (`timing_batches`), as a model meets them: one batch repeated keeps its rows in cache.
The kernels serve the returned model through `torch.ops.autotune.*` in this process (the package is loaded
into `autotune.torch.REGISTRY`); another process loads `log_dir/package` with `autotune.torch.load`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import statistics
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch.utils import _pytree as pytree

import search_spaces
from search_spaces._graph import is_call
from search_spaces.template import PRECISIONS, GraphMatch, GraphRule, Kept, Reduced, finer

from .. import records
from ..tuning_log import TuningLog
from . import accuracy
from .accuracy import AccuracyReport, Batch, LayerPrecision, Tolerance
from .dense import RELUS
from .graph import Replaced, Rewrite, _as_args, capture, collect_rules, discover, node_times, rewrite
from . import speed as _speed
from .speed import SpeedCheck, ms

__all__ = ["TaskReport", "Tolerance", "TuneModelReport", "tune_model"]


@dataclass
class TaskReport:
    """One kernel to tune: what it is, how much of the eager time its sites take, and how tuning went."""

    op: str
    fields: dict[str, Any]
    workload_key: str
    share: float = 0.0  # of the eager model's time on the example inputs (its sites' nodes)
    sites: int = 0
    measured: int = 0  # configs measured by this call
    resumed: int = 0  # configs already in the log
    best_s: float | None = None
    source: str = ""  # "tuned" or "shipped record"
    why: str = ""  # why there is no kernel
    record: Any = field(default=None, repr=False)

    def describe(self, tuned: bool = True) -> str:
        shape = ",".join(f"{k}={_text(v)}" for k, v in self.fields.items())
        head = f"{self.op} {shape}: {self.share:.1%} of eager, {self.sites} site(s)"
        if not tuned:
            return head
        best = (f"best {self.best_s * 1e3:.4f} ms" + (f" ({self.source})" if self.source == "shipped record"
                                                       else "")) if self.best_s is not None else self.why
        return f"{head}; {self.measured} trials measured, {self.resumed} resumed; {best}"

    def __str__(self) -> str:
        return self.describe()


def _text(v: Any) -> str:
    return "-".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


@dataclass
class TuneModelReport:
    """What tune_model found, tuned, replaced and kept, and what it measured."""

    tasks: list[TaskReport] = field(default_factory=list)
    replaced: list[Replaced] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    eager_s: float | None = None
    optimized_s: float | None = None
    max_abs_diff: float | None = None
    package: Path | None = None
    exported: bool = False  # False: the package already held exactly these kernels (or none were needed)
    threads: dict[str, str] = field(default_factory=dict)
    whole_model: list[str] = field(default_factory=list)  # the whole-model check's verdicts (_whole_model_check)
    accuracy: AccuracyReport | None = None  # the contract, each int8 layer's precision, the measured error
    timing_batches: int = 1  # batches every timing cycled through (the example and fresh ones)
    note: str = ""

    @property
    def measured(self) -> int:
        """Configs measured by this call, over all tasks (0 when everything resumed from the logs)."""
        return sum(t.measured for t in self.tasks)

    @property
    def speedup(self) -> float | None:
        return self.eager_s / self.optimized_s if self.eager_s and self.optimized_s else None

    def __str__(self) -> str:
        lines = [f"tune_model: {len(self.tasks)} tasks ({self.measured} trials measured), {len(self.replaced)} "
                 f"replaced, {len(self.kept)} kept" + (f": {self.note}" if self.note else "")]
        if self.tasks:
            lines.append("tasks (share of the eager time on the example inputs):")
            lines += [f"  {t}" for t in self.tasks]
        if self.package is not None:
            lines.append(f"package: {self.package} ({'exported' if self.exported else 'unchanged, not re-exported'})")
        lines += [f"replaced {r.where or '(model)'}: {r.what} (max |new - old| {r.max_error:.2g}"
                  + (f"; {ms(r.new_s)} vs PyTorch {ms(r.old_s)}" if r.old_s is not None and r.new_s is not None
                     else "") + ")"
                  for r in self.replaced]
        lines += [f"kept {k.where or '(model)'} [{k.rule}]: {k.why}" for k in self.kept]
        lines += [f"whole-model check, {line}" for line in self.whole_model]
        if self.accuracy is not None:
            lines += self.accuracy.lines()
        if self.eager_s is not None and self.optimized_s is not None:
            lines.append(f"latency, {_cycle(self.timing_batches)}: eager {self.eager_s * 1e3:.3f} ms, optimized "
                         f"{self.optimized_s * 1e3:.3f} ms: {self.speedup:.2f}x")
        if self.max_abs_diff is not None:
            lines.append(f"max |optimized - eager| on the example inputs: {self.max_abs_diff:.3g}")
        if self.threads:
            lines.append("threads: " + ", ".join(f"{k}={v}" for k, v in self.threads.items()))
        return "\n".join(lines)


def tune_model(model: torch.nn.Module, example_inputs: Any, *, device: str = "cpu", log_dir: str | Path,
               trials: int = 64, quantize: bool = True, tolerance: Tolerance | float | None = None,
               check_inputs: Sequence[Any] | None = None, timing_batches: int = 8, progress: bool = True,
               shipped: bool = True, extra_rules: Iterable[GraphRule] = (), rules: Iterable[GraphRule] | None = None,
               bench_rounds: int = 3, bench_seconds: float = 0.3, require_speedup: bool = True,
               speed: SpeedCheck | None = None) -> tuple[torch.nn.Module, TuneModelReport]:
    """Tune the operators `model` runs on `example_inputs` for `device` and return (the rewritten model, the
    report). See the module docstring.

    `trials`: configs per task, counting those already in `log_dir/<op>.jsonl`. `quantize=False` keeps the
    rules that change numerics (int8 Linear layers) out. `tolerance`: the error allowed on each output of the
    model against eager, `Tolerance(atol, rtol)` (|optimized - eager| <= max(atol, rtol x max|eager|)) or a
    number (atol); default `accuracy.INT8` (max(1e-2, 1e-2 x max|eager|)) with `quantize`, else
    `accuracy.FP32_EXACT` (1e-4 likewise). It is checked on the example inputs and on `check_inputs` (a list of
    held-out batches, each given as `example_inputs` is; [] checks the example alone; default: one drawn like
    the example, see `accuracy.draw_like`); int8 layers that break it move to a finer precision one at a time
    (the cheapest whose share of the error covers the excess, else the largest share:
    `accuracy.next_to_fall_back`), and a model that breaks it with none left comes back unchanged; with speed
    checks, a rule's int8 layers also move one rung up where the whole model runs faster so (`_finer_if_faster`).
    `timing_batches`: every timing (speed checks, eager against optimized) cycles through this many batches,
    the example, the check batches, then fresh ones drawn like the example; 1 times the example batch alone (its
    rows stay in cache, which flatters gathers).
    `shipped`: a shipped record of the same workload and CPU competes with the tuned ones. `extra_rules` join
    the operators' graph rules (`rules` replaces them). `bench_rounds` interleaved rounds of `bench_seconds`
    per model time eager against optimized (0: no timing). `require_speedup`: a replacement that agrees is also
    timed against the code it replaces and kept out unless it is faster by `speed.margin` (default
    `SpeedCheck()`: 3%, 3 rounds of 0.1 s per side, 9 rounds for whole models); False wires in every replacement
    that agrees (tests on tiny models, where kernels may lose). A model with nothing to replace comes back as it
    is; example inputs the model rejects raise its own error.
    """
    if speed is not None and not require_speedup:
        raise ValueError("tune_model: speed= sets how replacements are timed, but require_speedup=False times none")
    contract = accuracy.default_tolerance(tolerance, quantize)
    if isinstance(timing_batches, bool) or not isinstance(timing_batches, int) or timing_batches < 1:
        raise ValueError(f"tune_model: timing_batches must be an int >= 1 (1: the example batch alone), got "
                         f"{timing_batches!r}")
    args = _as_args(example_inputs)
    gm = capture(model, args)  # never rewritten: discovery, node times and the simulated int8 layers
    checks = accuracy.check_batches(model, args, check_inputs)
    timed = require_speedup or bench_rounds > 0
    timing = accuracy.timing_batches(model, checks, timing_batches if timed else 1)
    ruleset = collect_rules(quantize, extra_rules, rules)
    report = TuneModelReport(threads=_threads(), timing_batches=len(timing))
    found = discover(gm, args, ruleset)
    if not found.matches:
        report.kept = found.kept
        report.note = "nothing in this model is served by a tuned operator; the model comes back unchanged"
        return model, report
    job = _Job(model, args, timing, ruleset, (speed or SpeedCheck()) if require_speedup else None, device,
               Path(log_dir), trials, shipped, progress, node_times(gm, args), report)
    layers = _reduced([*found.matches, *found.alternatives])  # a fusion's alternatives may run layers in int8
    shares = accuracy.layer_shares(gm, checks, layers, contract)
    share = _Shares(gm, checks, contract, {(layer.node, layer.precision): shares[layer.node] for layer in layers})
    costs = accuracy.layer_costs(layers, job.times)
    with _Workers() as workers:
        opt, done, errors, floors = _hold(job, workers, checks, contract, share, costs,
                                          accuracy.plan(gm, checks, layers, contract, shares, costs))
        held = dict(floors)
        if job.check is not None and all(e.holds for e in errors):
            opt, done, errors, floors = _finer_if_faster(job, workers, checks, contract, opt, done, errors, floors)
    report.replaced, report.kept = done.replaced, done.kept
    report.accuracy = _accuracy_report(contract, errors, layers, shares, floors, done,
                                       {r.name for r in ruleset if r.quantizes},
                                       {n for n in floors if floors[n] != held.get(n)})
    if not report.accuracy.holds:
        report.note = (f"the rewritten model breaks the tolerance ({contract}) even with every int8 layer in "
                       "fp32; the model comes back unchanged")
        return model, report
    if not done.replaced:
        report.note = "no replacement was kept; the model comes back unchanged"
        return model, report
    _measure(report, model, opt, timing, bench_rounds, bench_seconds)
    return opt, report


def _cycle(batches: int) -> str:
    return "one batch repeated" if batches == 1 else f"a cycle of {batches} batches"


@dataclass
class _Job:
    """What every rewrite of one tune_model call shares: the model, its inputs, the rules and the settings."""

    model: torch.nn.Module
    args: tuple[Any, ...]
    timing: list[tuple[Any, ...]]  # the example first, then the batches every timing cycles through
    ruleset: list[GraphRule]
    check: SpeedCheck | None
    device: str
    log_dir: Path
    trials: int
    shipped: bool
    progress: bool
    times: dict[str, float]  # node name -> eager seconds on the example inputs (each task's share)
    report: TuneModelReport
    logs: "_Logs" = field(init=False)

    def __post_init__(self) -> None:
        self.logs = _Logs(self.log_dir)


def _reduced(matches: Sequence[GraphMatch]) -> list[Reduced]:
    """Every layer the matches would run in reduced precision, in graph order."""
    return [layer for m in matches for layer in m.reduced]


class _Shares:
    """A reduced-precision layer's share of the error (`accuracy.layer_shares`) at the precision it runs in,
    simulated once per (node, precision) on the captured graph: the bf16 rung's layers appear only once the
    contract moves them there."""

    def __init__(self, gm: Any, checks: Sequence[Batch], contract: Tolerance, known: dict[tuple[str, str], float]):
        self.gm, self.checks, self.contract, self.known = gm, checks, contract, dict(known)

    def __call__(self, layer: Reduced) -> float:
        key = (layer.node, layer.precision)
        if key not in self.known:
            self.known[key] = accuracy.layer_shares(self.gm, self.checks, [layer], self.contract)[layer.node]
        return self.known[key]


def _hold(job: _Job, workers: "_Workers", checks: Sequence[Batch], contract: Tolerance, share: _Shares,
          costs: dict[str, float] | None, planned: list[str]) -> tuple[Any, Rewrite, list[accuracy.BatchError],
                                                                     dict[str, str]]:
    """Rewrite the model with the `planned` layers one step up the precision ladder (bf16 where a rule runs it,
    else fp32), then, while its real kernels break `contract` on the check batches, move one more layer one
    step up each time: `accuracy.next_to_fall_back` of the measured error, over each layer's share of the error
    at the precision it runs in. Returns (the rewritten model, its rewrite, its errors on the check batches, the
    floors: node -> the coarsest precision it was allowed)."""
    floors = {name: finer(PRECISIONS[0]) for name in planned}
    while True:
        opt, done = _rewritten(job, workers, floors)
        errors = accuracy.check(opt, checks, contract)
        running = _running(done)
        if all(e.holds for e in errors) or not running:
            return opt, done, errors, floors
        ratio = max(e.ratio for e in errors)
        step = running[accuracy.next_to_fall_back(ratio, {node: share(layer) for node, layer in running.items()},
                                                  costs)]
        floors = {**floors, step.node: finer(step.precision)}


def _finer_if_faster(job: _Job, workers: "_Workers", checks: Sequence[Batch], contract: Tolerance, opt: Any,
                     done: Rewrite, errors: list[accuracy.BatchError], floors: dict[str, str]
                     ) -> tuple[Any, Rewrite, list[accuracy.BatchError], dict[str, str]]:
    """A finer rung that runs faster than int8 is the better choice outright (on CPUs whose bf16 GEMMs run on
    AMX tiles, oneDNN's bf16 Linear beats a VNNI int8 kernel: benchmarks/WHOLE_MODEL.md). For each rule whose
    layers run in int8, in rule order, the model is rewritten with those layers one rung up (bf16 where a rule
    runs it) and timed against the model as it stands (`check.model_rounds` interleaved rounds over the timing
    cycle); kept if faster by `check.margin` and within the contract. Then, one at a time, each int8 layer
    that feeds a layer the contract moved to bf16: one rung up, the two chain in bf16 (dense.RULE_CHAIN: no
    float32 activation between them), which may pay where either alone does not. The report says what each
    took."""
    assert job.check is not None
    verdicts, lines = list(job.report.whole_model), []  # the model's own checks (`_rewritten` starts afresh), ours
    tries = [(f"{rule.name}'s int8 layers", lambda d, rule=rule: _int8_layers(d, rule.name)) for rule in job.ruleset]
    tries += [(f"the int8 layer {_running(done)[node].where} (it feeds a bf16 layer)", lambda d, node=node: [node])
              for node in _feeding_bf16(job, done, floors)]
    for label, layers in tries:
        running = _running(done)
        nodes = [n for n in layers(done) if n in running and running[n].precision == PRECISIONS[0]]
        if not nodes:
            continue
        up = {**floors, **{node: finer(PRECISIONS[0]) for node in nodes}}
        alt, alt_done = _rewritten(job, workers, up)
        alt_verdicts, alt_errors = list(job.report.whole_model), accuracy.check(alt, checks, contract)
        with torch.inference_mode():
            now_s, alt_s = _speed.time_pair(_cycled(opt, job.timing), _cycled(alt, job.timing),
                                            job.check.for_models())
        holds = all(e.holds for e in alt_errors)
        faster = holds and alt_s <= now_s * (1.0 - job.check.margin)
        line = (f"{label} one rung up: the model takes {ms(alt_s)} with them, {ms(now_s)} in "
                f"int8: {'moved up' if faster else 'left in int8'}{'' if holds else ' (it breaks the tolerance)'}")
        if faster:
            opt, done, errors, floors = alt, alt_done, alt_errors, up
            verdicts = alt_verdicts
        lines.append(line)
        job.report.whole_model[:] = [*verdicts, *lines]
    return opt, done, errors, floors


def _int8_layers(done: Rewrite, rule: str) -> list[str]:
    return [layer.node for r in done.replaced if r.rule == rule for layer in r.reduced]


def _feeding_bf16(job: _Job, done: Rewrite, floors: dict[str, str]) -> list[str]:
    """The int8 layers (Linear nodes of the captured model) whose output, through a ReLU or not, is the input
    of a Linear whose floor is bf16."""
    int8 = {node for node, layer in _running(done).items() if layer.precision == PRECISIONS[0]}
    bf16 = {node for node, floor in floors.items() if floor == finer(PRECISIONS[0])}
    if not int8 or not bf16:
        return []
    gm = capture(job.model, job.args)
    found = []
    for n in gm.graph.nodes:
        if n.name not in int8:
            continue
        outs = [n, *(u for u in n.users if is_call(u, *RELUS))]
        if any(is_call(u, torch.ops.aten.linear.default) and u.name in bf16 and u.args[0] is o
               for o in outs for u in o.users):
            found.append(n.name)
    return found


def _running(done: Rewrite) -> dict[str, Reduced]:
    """Each node a kept replacement runs in reduced precision -> its layer (and so its precision)."""
    return {layer.node: layer for r in done.replaced for layer in r.reduced}


def _rewritten(job: _Job, workers: "_Workers", floors: dict[str, str]) -> tuple[Any, Rewrite]:
    """The model captured afresh and rewritten with each layer no coarser than its floor (those at "fp32" left
    to the fp32 rules): the tasks its sites need tuned (those not tuned yet by this call), the package exported
    and loaded, the rules run (and, with speed checks, the whole-model check)."""
    job.report.whole_model.clear()  # this rewrite's verdicts only
    gm = capture(job.model, job.args)
    found = discover(gm, job.args, job.ruleset, floors)
    new = _new_tasks(job.report, [*found.matches, *found.alternatives], job.times)
    if new:
        _tune_all(new, job.device, job.logs, job.trials, job.shipped, job.progress, workers)
        _share_bests(job.report.tasks, new, job.device, job.logs, job.shipped, job.progress, workers)
        best = [t.record for t in job.report.tasks if t.record is not None]
        if best:
            job.report.package, exported = _package(best, job.log_dir / "package", workers)
            job.report.exported |= exported
    ready = _ready(job.report.tasks)
    done = rewrite(gm, job.args, job.ruleset, ready, job.check, floors=floors, timing_inputs=job.timing[1:])
    if job.check is not None:
        gm, done = _whole_model_check(job, gm, done, ready, floors)
        gm, done = _fusion_check(job, gm, done, ready, floors)
    return gm, done


def _new_tasks(report: TuneModelReport, matches: Sequence[GraphMatch], times: dict[str, float]) -> list[TaskReport]:
    """The matches' tasks this call has not seen yet, added to the report (each with its share of eager time)."""
    have = {(t.op, t.workload_key) for t in report.tasks}
    new = [t for t in _tasks(matches, times) if (t.op, t.workload_key) not in have]
    report.tasks += new
    return new


def _accuracy_report(contract: Tolerance, errors: list[accuracy.BatchError], layers: Sequence[Reduced],
                     shares: dict[str, float], floors: dict[str, str], done: Rewrite,
                     quantizing: set[str], for_speed: set[str] = frozenset()) -> AccuracyReport:
    """Each reduced-precision layer's final precision (and why it is finer than its rule's: the contract, or
    `for_speed`, the nodes moved up because the finer rung ran faster), and the measured errors."""
    running = _running(done)
    out = AccuracyReport(contract, errors)
    unique: dict[str, Reduced] = {}  # a table is a layer of a fusion's match and of its alternatives alike
    for layer in layers:
        unique.setdefault(layer.node, layer)
    for layer in unique.values():
        run = running.get(layer.node)
        precision = run.precision if run is not None else "fp32"
        if layer.node in for_speed and precision != layer.precision:
            why = f"in {precision}: faster than {layer.precision} here"
        elif layer.node in floors and precision != layer.precision:
            why = f"{'kept ' * (precision == 'fp32')}in {precision} to hold the tolerance"
        elif precision == "fp32":
            why = _why_kept(layer, done.kept, quantizing)
        else:
            why = ""
        out.layers.append(LayerPrecision(layer.where, run.what if run is not None else layer.what, precision,
                                         shares.get(layer.node, 0.0), why))
    return out


def _why_kept(layer: Reduced, kept: Sequence[Kept], quantizing: set[str]) -> str:
    """Why each reduced-precision rule that could hold `layer` left it (its modules among the kept match's),
    rule by rule: int8 may refuse a layer by its shape and bf16 then lose its speed check."""
    paths = set(layer.where.split(", "))
    whys = [f"{k.rule}: {k.why}" for k in kept if k.rule in quantizing and paths <= set(k.where.split(", "))]
    return "; ".join(dict.fromkeys(whys)) or "its site was not rewritten"


# ---- tasks --------------------------------------------------------------------------------------------------
def _key(op: str, fields: dict[str, Any]) -> tuple[str, str]:
    return op, search_spaces.get(op).Workload(**fields).key()


def _tasks(matches: Sequence[GraphMatch], times: dict[str, float]) -> list[TaskReport]:
    """One task per distinct (op, workload); a site's share of the eager time is split among its tasks."""
    total = sum(times.values()) or 1.0
    out: dict[tuple[str, str], TaskReport] = {}
    for m in matches:
        distinct: dict[tuple[str, str], tuple[str, dict[str, Any]]] = {}
        for op, f in m.tasks:
            distinct.setdefault(_key(op, f), (op, f))
        share = sum(times.get(n.name, 0.0) for n in m.nodes) / total
        for key, (op, f) in distinct.items():
            t = out.setdefault(key, TaskReport(op=op, fields=dict(f), workload_key=key[1]))
            t.share += share / len(distinct)
            t.sites += 1
    return sorted(out.values(), key=lambda t: -t.share)


class _Workers:
    """One build pool and one measure worker for all of a call's tasks and its export, each started when first
    needed: every pool or worker is a process that imports TVM (about 5 s apiece on 2 cores), which `tune` and
    `export` would otherwise start afresh for each task. The measure worker holds one task's data at a time and
    makes the next task's when it comes (as for any run)."""

    def __init__(self) -> None:
        self._builder: Any = None
        self._runner: Any = None

    def builder(self) -> Any:
        if self._builder is None:
            from ..build import Builder

            self._builder = Builder()
        return self._builder

    def runner(self) -> Any:
        if self._runner is None:
            from ..measure import LocalRunner

            self._runner = LocalRunner()  # tune's own default timing
        return self._runner

    def __enter__(self) -> "_Workers":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._runner is not None:
            self._runner.close()
        if self._builder is not None:
            self._builder.close()


class _Logs:
    """Each log a call asks about, read once: the tasks' own (`log_dir/<op>.jsonl`, which `tune` appends to
    through the same object) and the shipped ones."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self._open: dict[Any, TuningLog] = {}

    def own(self, op: str) -> TuningLog:
        if op not in self._open:
            self._open[op] = TuningLog(self.log_dir / f"{op}.jsonl")
        return self._open[op]

    def transfer(self, op: str, device: str) -> list[Path]:
        """What tuning `op` learns from besides its own log: this call's other operators' logs (this machine,
        measured minutes ago; qmatmul_requant shares qmatmul's knobs) first, then every shipped log of the
        device kind (as `tune`'s default)."""
        mine = [p for p in sorted(self.log_dir.glob("*.jsonl")) if p.name != f"{op}.jsonl"]
        return mine + [p for o in search_spaces.names() for p in records.shipped_logs(o, device)]

    def shipped(self, op: str, device: str) -> TuningLog:
        if (op, device) not in self._open:
            self._open[op, device] = TuningLog.shipped(op, device)
        return self._open[op, device]


def _tune_all(tasks: list[TaskReport], device: str, logs: _Logs, trials: int, shipped: bool,
              progress: bool, workers: _Workers) -> None:
    from tqdm import tqdm

    if progress:
        for t in tasks:
            tqdm.write(f"tune_model task: {t.describe(tuned=False)}")
    bar = tqdm(tasks, desc="tune_model", unit="task", disable=not progress, dynamic_ncols=True)
    try:
        for t in bar:
            bar.set_postfix_str(t.op)
            _tune_task(t, device, logs, trials, shipped, progress, workers)
    finally:
        bar.close()


def _tune_task(t: TaskReport, device: str, logs: _Logs, trials: int, shipped: bool, progress: bool,
               workers: _Workers) -> None:
    """Tune one task up to `trials` configs in its log (resume), then pick its best record."""
    from ..measure import require_local_device
    from ..task import make_task
    from ..tuner import tune

    task = make_task(t.op, device, **t.fields)
    log = logs.own(t.op)
    t.resumed = log.resumed(task)
    if t.resumed < trials and t.resumed < len(task.space):
        try:
            require_local_device(task)  # before anything is built
            t.measured = tune(task, trials=trials - t.resumed, log=log, progress=progress,
                              builder=workers.builder(), runner=workers.runner(),
                              transfer=logs.transfer(t.op, task.device.name)).measured
        except Exception as err:  # noqa: BLE001 -- one task's failure keeps its sites, not the whole model
            warnings.warn(f"tune_model: tuning {t.op} {t.fields} failed: {type(err).__name__}: {err}",
                          stacklevel=3)
            t.why = f"tuning failed: {type(err).__name__}: {err}"
            return
    _pick_record(t, task, logs, shipped)


def _share_bests(tasks: list[TaskReport], new: list[TaskReport], device: str, logs: _Logs, shipped: bool,
                 progress: bool, workers: _Workers) -> None:
    """Each task measures the best configs of this call's other tasks its space takes (`tuner.taken_configs`:
    its operator's, or qmatmul's for qmatmul_requant) where one of the two was just tuned (measured something in
    this round: resumed tasks have shared before), and takes the faster one. Tasks are tuned as the rewrites need
    them, so one tuned early never saw what a sibling tuned later found: with 8 trials, DLRM's fused kernel over
    int8 rows kept a SIMD config (1.24-1.33 ms) while the AMX config its fp16-row sibling found later runs it at
    0.98-1.01 (benchmarks/WHOLE_MODEL.md)."""
    from tqdm import tqdm

    from ..task import make_task
    from ..tuner import taken_configs, try_configs

    fresh = {id(t) for t in new if t.measured}
    if not fresh:  # a round that tuned nothing: every pair shared before
        return
    found = [(t, t.record) for t in tasks]  # what each had found before this round
    for t in tasks:
        if t.why.startswith("tuning failed"):
            continue
        given = [rec for s, rec in found if s is not t and rec is not None and (id(t) in fresh or id(s) in fresh)]
        if not given:
            continue
        task = make_task(t.op, device, **t.fields)
        try:
            measured = try_configs(task, taken_configs(task, given), logs.own(t.op), workers.builder(),
                                   workers.runner())
        except Exception as err:  # noqa: BLE001 -- the task keeps the kernel it has
            warnings.warn(f"tune_model: measuring other tasks' best configs on {t.op} {t.fields} failed: "
                          f"{type(err).__name__}: {err}", stacklevel=3)
            continue
        if measured:
            t.measured += len(measured)
            before, had = t.best_s, t.record
            _pick_record(t, task, logs, shipped)
            if progress and t.record is not None and (had is None or t.record.config_key != had.config_key):
                tqdm.write(f"tune_model: {t.op} {','.join(f'{k}={_text(v)}' for k, v in t.fields.items())}: "
                           f"another task's best config runs it in {ms(t.best_s)}"
                           f"{f' ({ms(before)} before)' if before is not None else ''}")


def _pick_record(t: TaskReport, task: Any, logs: _Logs, shipped: bool) -> None:
    """The task's kernel: the best record of its log, or the shipped one where that is faster."""
    log = logs.own(t.op)
    rec = log.best(task)
    t.source = "tuned"
    if shipped:
        pre = logs.shipped(t.op, task.device.name).best(task)
        if pre is not None and (rec is None or pre.latency < rec.latency):
            rec, t.source = pre, "shipped record"
    if rec is None:
        t.why = f"tuning found no correct kernel in {t.resumed + t.measured} trials (see {log.paths[0]})"
        t.source = ""
        return
    t.record, t.best_s, t.why = rec, rec.latency, ""


def _ready(tasks: list[TaskReport]) -> Any:
    """`ready(match)` for the rewrite: why a match cannot run on tuned kernels, or None."""
    by_key = {(t.op, t.workload_key): t for t in tasks}

    def ready(match: GraphMatch) -> str | None:
        for op, fields in match.tasks:
            t = by_key.get(_key(op, fields))
            if t is None:
                return (f"missing kernel: {op} {fields} was not tuned (the site appeared only after an earlier "
                        f"rule's rewrite was refused)")
            if t.record is None:
                return f"missing kernel: {op}: {t.why}"
        return None

    return ready


# ---- package ------------------------------------------------------------------------------------------------
def _entry_key(op: str, workload_key: str, device: str, config: Any, version: str) -> tuple[str, ...]:
    return op, workload_key, device, json.dumps(config, sort_keys=True), version


def _package(best: list[Any], out: Path, workers: _Workers) -> tuple[Path, bool]:
    """Export the records to `out` unless it already holds exactly their kernels; load it. (path, exported)
    Exporting over a package this process loaded is safe: kernel files are named by what they hold
    (`package.export`), so a library the dynamic loader hands back again under a name is that same kernel."""
    from ..package import read_manifest
    from .registry import load

    want = sorted(_entry_key(r.op, r.workload_key, r.device, r.config, r.template_version) for r in best)
    try:
        entries = read_manifest(out).get("kernels", [])
        have = sorted(_entry_key(e["op"], e["workload_key"], e["device"], e["config"],
                                 e.get("template_version", "")) for e in entries)
        same = have == want and all((out / e["file"]).exists() for e in entries)
    except (FileNotFoundError, ValueError, KeyError):
        same = False
    if not same:
        from ..package import export

        export(best, out, builder=workers.builder())
    load(out)
    return out, not same


# ---- measurement --------------------------------------------------------------------------------------------
def _whole_model_check(job: _Job, gm: Any, done: Rewrite, ready: Any, floors: dict[str, str]) -> tuple[Any, Rewrite]:
    """A second opinion, by the whole model, on each rule whose replacements lost their own speed check.

    A replacement is timed as its own subgraph, which misses what it does to its neighbours: the table-batched
    launch writes (B, T, D), which the interaction then reads in place, so wiring it in also removes the stack
    copy the interaction otherwise makes (on the Criteo-shaped DLRM the batched op alone can be slower than the
    26 bags, and the model faster with it: benchmarks/WHOLE_MODEL.md). For each such rule, in rule order, the
    model is rewritten again with that rule's replacements wired in unchecked, and the two rewritten models are
    timed (`check.model_rounds` interleaved rounds, medians, over the timing cycle); the faster by `check.margin`
    is kept, and the report says what each took."""
    assert job.check is not None
    wired: frozenset[str] = frozenset()  # rules this check wired in so far
    for rule in job.ruleset:
        if not any(k.slower and k.rule == rule.name for k in done.kept):
            continue
        alt_gm = capture(job.model, job.args)
        alt = rewrite(alt_gm, job.args, job.ruleset, ready, job.check, wired | {rule.name}, floors, job.timing[1:])
        with torch.inference_mode():
            now_s, alt_s = _speed.time_pair(_cycled(gm, job.timing), _cycled(alt_gm, job.timing),
                                            job.check.for_models())
        faster = alt_s <= now_s * (1.0 - job.check.margin)
        job.report.whole_model.append(f"{rule.name}: the model takes {ms(alt_s)} with its replacements, "
                                      f"{ms(now_s)} without: {'wired in' if faster else 'kept out'}")
        if faster:
            gm, done, wired = alt_gm, alt, wired | {rule.name}
    return gm, done


def _fusion_check(job: _Job, gm: Any, done: Rewrite, ready: Any, floors: dict[str, str]) -> tuple[Any, Rewrite]:
    """The whole model with each group of fusing rules' replacements (`GraphRule.fuses`, e.g. the embedding bags
    and the interaction as one kernel; rules that fuse a rule in common are one group) against the model
    rewritten without that group, where the other rules take its sites (with their own whole-model check):
    timed as `_whole_model_check` times, the fused model is kept only if faster by `check.margin`, and the
    report says what each took. Groups are judged in rule order, each against the model the earlier left."""
    assert job.check is not None
    for group in _fusion_groups(job.ruleset):
        fusing = [r for r in group if any(d.rule == r.name for d in done.replaced)]
        if not fusing:
            continue
        apart = dataclasses.replace(job, ruleset=[r for r in job.ruleset if r not in group])
        alt_gm = capture(job.model, job.args)
        alt = rewrite(alt_gm, job.args, apart.ruleset, ready, job.check, floors=floors,
                      timing_inputs=job.timing[1:])
        names = " and ".join(r.name for r in fusing)
        before = len(job.report.whole_model)
        alt_gm, alt = _whole_model_check(apart, alt_gm, alt, ready, floors)
        job.report.whole_model[before:] = [f"without {names}, {v}" for v in job.report.whole_model[before:]]
        with torch.inference_mode():
            fused_s, apart_s = _speed.time_pair(_cycled(gm, job.timing), _cycled(alt_gm, job.timing),
                                                job.check.for_models())
        faster = fused_s <= apart_s * (1.0 - job.check.margin)
        fused_rules = " + ".join(dict.fromkeys(f for r in fusing for f in r.fuses))
        job.report.whole_model.append(f"{names}: the model takes {ms(fused_s)} with it, {ms(apart_s)} with "
                                      f"{fused_rules} apart: {'kept' if faster else 'left out'}")
        if not faster:
            gm, done, job = alt_gm, alt, apart
    return gm, done


def _fusion_groups(rules: Sequence[GraphRule]) -> list[list[GraphRule]]:
    """The fusing rules in groups, in rule order: rules whose `fuses` share a name (the fused embedding stage's
    int8, fp16 and fp32 rules all fuse the interaction) are one alternative to the rules they fuse."""
    groups: list[list[GraphRule]] = []
    for rule in (r for r in rules if r.fuses):
        joined = [g for g in groups if any(set(rule.fuses) & set(o.fuses) for o in g)]
        groups = [g for g in groups if g not in joined]
        groups.append(sorted([rule, *(o for g in joined for o in g)], key=list(rules).index))
    return sorted(groups, key=lambda g: list(rules).index(g[0]))


def _cycled(model: Any, batches: Sequence[tuple[Any, ...]]) -> Any:
    """A call of `model` on the next of `batches` each time (cycling), for the timers."""
    it = itertools.cycle(batches)
    return lambda: model(*next(it))


def _measure(report: TuneModelReport, model: torch.nn.Module, gm: torch.nn.Module,
             batches: Sequence[tuple[Any, ...]], rounds: int, seconds: float) -> None:
    """Max |optimized - eager| on the example inputs, and both latencies over the cycle of `batches`
    (interleaved rounds, medians)."""
    args = batches[0]
    with torch.inference_mode():
        ref, out = model(*args), gm(*args)
        report.max_abs_diff = _max_diff(ref, out)
        if rounds < 1:
            return
        from ..bench import median_seconds

        times: dict[str, list[float]] = {"eager": [], "optimized": []}
        eager, optimized = _cycled(model, batches), _cycled(gm, batches)
        for _ in range(rounds):
            times["eager"].append(median_seconds(eager, seconds))
            times["optimized"].append(median_seconds(optimized, seconds))
    report.eager_s = statistics.median(times["eager"])
    report.optimized_s = statistics.median(times["optimized"])


def _max_diff(ref: Any, out: Any) -> float:
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


def _threads() -> dict[str, str]:
    try:
        from . import threads
    except ImportError:
        return {}
    settings = getattr(threads, "settings", None)
    return dict(settings()) if callable(settings) else {}
