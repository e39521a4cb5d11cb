"""The tuning side of one `tune_model` call: its tasks, their logs, one builder and one runner, and the package.

A `TuningSession` is what `autotune tune` is for one task, for all of a model's tasks at once: it owns the tasks
the graph rules asked for (`TaskReport`, keyed by `TaskKey`), the logs (`log_dir/<op>.jsonl`, appended to as it
tunes, and the shipped ones), one build pool and one runner shared by every task and the export (each a process
that imports TVM: started once, when first needed), and the package of the best kernels that the rewritten model
runs on. The runner is any `autotune tune --runner` takes: `local`, `rpc://HOST:PORT/KEY` (TVM's tracker) or
`offline:DIR`, or a `Runner` object.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import search_spaces
from search_spaces.template import GraphMatch

from .. import records
from ..records import Record, TaskKey
from ..tuning_log import TuningLog
from .report import TaskReport, shape_text
from .speed import ms

__all__ = ["BATCH", "FIRST", "TuningSession", "promise", "task_key"]


BATCH = 8  # configs per scheduled batch (two of the xgb strategy's): each the budget gives after the first
# a task's first batch under a budget: one of the xgb strategy's, the cost model's best guesses (warmed by other
# shapes' and CPU kinds' records); a model's dozen tasks at 8 each took 25-36 minutes on 2 cores where no record
# covered them, before the scheduler could put any trial where the model's time goes
FIRST = 4
# a task under SMALL_SHARE of the model's eager time (a 10-row table the contract split off a batched launch: 0.5%)
# gets at most SMALL_TRIALS configs, the cost model's best guesses, unless a budget gives it more: 8 trials cost it
# ~20 s to win at most a fraction of its half percent
SMALL_SHARE, SMALL_TRIALS = 0.01, 2
PRIOR = 0.2  # the gain a task's second batch is expected to bring over its first; PRIOR / n after n batches,
#              unless its last batch gained more


def promise(curve: Sequence[float]) -> float:
    """The share of its time a task's next batch is expected to save, from its best after each batch so far:
    the last batch's gain, or PRIOR / batches where that is less (a flat batch does not end a young task)."""
    last = (curve[-2] - curve[-1]) / curve[-2] if len(curve) > 1 and curve[-2] > 0 else 0.0
    return max(last, PRIOR / max(len(curve), 1))


def task_key(op: str, fields: dict[str, Any], device: str) -> TaskKey:
    """The TaskKey of a rule's task (an operator and its workload fields) on `device` (a device kind's name)."""
    return TaskKey(op, search_spaces.get(op).Workload(**fields).key(), device)


class _Logs:
    """Each log the session asks about, read once: the tasks' own (`log_dir/<op>.jsonl`, which `tune` appends
    to through the same object) and the shipped ones."""

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


class TuningSession:
    """The tasks of one model, tuned into `log_dir` for `device` (resuming), their best kernels exported to
    `log_dir/package` and loaded. Without a `budget`, each task gets `trials` configs (SMALL_TRIALS under
    SMALL_SHARE of the model's time); with one (seconds of tuning, all of the session's batches together), the
    scheduler (`_schedule`) fills each new task's log to a first batch (FIRST configs, or SMALL_TRIALS), then gives
    each next batch (BATCH) to the task whose tuning promises the model the most time per second, up to `trials`
    each; a call whose tasks' logs hold their first batches already tunes nothing (resume).
    A task that the shipped records of this CPU kind cover (the same workload and template version: measured
    already) is not tuned unless `retune`. `runner`: "local", "rpc://HOST:PORT/KEY", "offline:DIR" or a Runner
    (closed by its owner, not here); `builder`: a Builder (likewise), else one pool."""

    def __init__(self, device: str, log_dir: str | Path, trials: int, *, shipped: bool = True,
                 progress: bool = True, runner: Any = "local", builder: Any = None, budget: float | None = None,
                 retune: bool = False):
        from ..measure import runner_kind
        from ..targets import resolve

        self.local = runner_kind(runner) == "local" if isinstance(runner, str) else False  # checked before work
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0):
            raise ValueError(f"tune_model: budget must be a number of seconds > 0, got {budget!r}")
        self.device = resolve(device)
        self.log_dir = Path(log_dir)
        self.trials, self.shipped, self.progress, self.retune = trials, shipped, progress, retune
        self.budget = budget
        self.tasks: list[TaskReport] = []
        self.logs = _Logs(self.log_dir)
        self._curves: dict[TaskKey, list[float]] = {}  # each task's best after each batch of this session
        self._done: set[TaskKey] = set()  # tasks a batch could not add to
        self._made: dict[TaskKey, Any] = {}  # each task's Task, made once (`_task`)
        self.package: Path | None = None
        self.exported = False  # whether any call of `tune` wrote the package (else it held these kernels)
        self._runner_spec = runner
        self._builder, self._runner = builder, None if isinstance(runner, str) else runner
        self._own_builder, self._own_runner = builder is None, isinstance(runner, str)

    # ---- workers ------------------------------------------------------------------------------------------
    def builder(self) -> Any:
        if self._builder is None:
            from ..build import Builder

            self._builder = Builder()
        return self._builder

    def runner(self) -> Any:
        if self._runner is None:
            from ..measure import LocalRunner, make_runner

            self._runner = make_runner(self._runner_spec) or LocalRunner()
        return self._runner

    def close(self) -> None:
        if self._own_runner and self._runner is not None:
            self._runner.close()
        if self._own_builder and self._builder is not None:
            self._builder.close()
        self._runner = None if self._own_runner else self._runner
        self._builder = None if self._own_builder else self._builder

    def __enter__(self) -> "TuningSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- tasks --------------------------------------------------------------------------------------------
    def add(self, matches: Sequence[GraphMatch], times: dict[str, float]) -> list[TaskReport]:
        """The matches' tasks this session has not seen yet, added (each with its share of the eager time:
        `times`, node name -> seconds; a site's share is split among its distinct tasks)."""
        total = sum(times.values()) or 1.0
        have = {t.key for t in self.tasks}
        found: dict[TaskKey, TaskReport] = {}
        for m in matches:
            distinct = {task_key(op, f, self.device.name): f for op, f in m.tasks}
            share = sum(times.get(n.name, 0.0) for n in m.nodes) / total
            for key, f in distinct.items():
                t = found.setdefault(key, TaskReport(key=key, fields=dict(f)))
                t.share += share / len(distinct)
                t.sites += 1
        new = sorted((t for k, t in found.items() if k not in have), key=lambda t: -t.share)
        self.tasks += new
        return new

    def tune(self, new: Sequence[TaskReport]) -> None:
        """Tune `new` (resuming from the logs), let every task try its siblings' best configs, and export the
        best kernels to `log_dir/package` (loaded into this process)."""
        if not new:
            return
        from tqdm import tqdm

        if self.progress:
            for t in new:
                tqdm.write(f"tune_model task: {t.describe(tuned=False)}")
        bar = tqdm(new, desc="tune_model", unit="task", disable=not self.progress, dynamic_ncols=True)
        try:
            for t in bar:
                bar.set_postfix_str(t.op)
                first = self.trials if self.budget is None else min(FIRST, self.trials)
                self._tune_task(t, min(first, SMALL_TRIALS) if t.share < SMALL_SHARE else first)
        finally:
            bar.close()
        if self.budget is not None:
            self._schedule()
        self._share_bests(new)
        best = [t.record for t in self.tasks if t.record is not None]
        if best:
            self.package, exported = self._package(best, self.log_dir / "package")
            self.exported |= exported

    def ready(self) -> Callable[[GraphMatch], str | None]:
        """`ready(match)` for the rewrite: why a match cannot run on tuned kernels, or None."""
        by_key = {t.key: t for t in self.tasks}

        def ready(match: GraphMatch) -> str | None:
            for op, fields in match.tasks:
                t = by_key.get(task_key(op, fields, self.device.name))
                if t is None:
                    return (f"missing kernel: {op} {fields} was not tuned (the site appeared only after an "
                            "earlier rule's rewrite was refused)")
                if t.record is None:
                    return f"missing kernel: {op}: {t.why}"
            return None

        return ready

    def kernels(self, match: GraphMatch) -> tuple[tuple[Any, str | None], ...]:
        """The kernel each of the match's tasks runs now (its chosen record's config; None: none yet), for
        `speed.Timings`: a replacement timed on other kernels is timed again."""
        by_key = {t.key: t for t in self.tasks}
        out = []
        for op, fields in match.tasks:
            key = task_key(op, fields, self.device.name)
            t = by_key.get(key)
            out.append((key, t.record.config_key if t is not None and t.record is not None else None))
        return tuple(out)

    def _task(self, t: TaskReport) -> Any:
        """The task of `t`, made once per session: each batch, sibling share and pick reuses it, and with it what
        its space found once (a fused embedding space enumerates a code path of millions of combinations to
        sample it: tens of seconds each time a task was made anew)."""
        from ..task import make_task

        if t.key not in self._made:
            self._made[t.key] = make_task(t.op, self.device, **t.fields)
        return self._made[t.key]

    def _tune_task(self, t: TaskReport, upto: int) -> None:
        """Tune one task until its log holds `upto` configs (resuming: `trials`, or a batch of the scheduler's),
        then pick its best record. A task the shipped records cover is picked from them, not tuned (unless
        `retune`)."""
        from ..measure import require_local_device
        from ..tuner import tune

        task = self._task(t)
        log = self.logs.own(t.op)
        in_log = log.resumed(task)
        if t.batches == 0:
            t.resumed = in_log
            covered = self.logs.shipped(t.op, self.device.name) if self.shipped and not self.retune else None
            if covered is not None and covered.best(task) is not None:
                t.shipped = covered.resumed(task)
                self._pick(t, task)
                return
        more = task.space.size_up_to(min(upto, self.trials)) - in_log  # a space smaller than that caps it
        if more > 0:
            start = time.monotonic()
            try:
                if self.local:
                    require_local_device(task)  # before anything is built
                t.measured += tune(task, trials=more, log=log, progress=self.progress, builder=self.builder(),
                                   runner=self.runner(), confirm=3 if self.budget is None else 1,
                                   transfer=self.logs.transfer(t.op, task.device.name)).measured
            except Exception as err:  # noqa: BLE001 -- one task's failure keeps its sites, not the whole model
                warnings.warn(f"tune_model: tuning {t.op} {t.fields} failed: {type(err).__name__}: {err}",
                              stacklevel=4)
                t.why = f"tuning failed: {type(err).__name__}: {err}"
                return
            finally:
                t.tuning_s += time.monotonic() - start
                t.batches += 1
        self._pick(t, task)
        if more > 0 and t.best_s is not None:
            self._curves.setdefault(t.key, []).append(t.best_s)
            t.first_s = self._curves[t.key][0]

    def _schedule(self) -> None:
        """Spend what is left of the budget a batch at a time, each on the task whose next batch promises the
        model the most seconds per second of tuning (Ansor's task scheduler, in small): its share of the eager
        time times the gain its curve still promises (`promise`), over what a batch of it has cost. Stops when
        the session's tuning (every batch of every call, first batches included) has taken the budget's seconds,
        or no task promises anything (each at `trials`, its space measured, or failed)."""
        assert self.budget is not None
        while sum(t.tuning_s for t in self.tasks) < self.budget:
            rates = {t.key: self._rate(t) for t in self.tasks}
            best = max(self.tasks, key=lambda t: rates[t.key], default=None)
            if best is None or rates[best.key] <= 0.0:
                return
            before = best.measured
            self._tune_task(best, best.resumed + best.measured + BATCH)
            if best.measured == before:  # nothing left to measure, or it failed
                self._done.add(best.key)

    def _rate(self, t: TaskReport) -> float:
        """The model-time gain per second of tuning that `t`'s next batch promises (0: nothing left to try)."""
        if (t.key in self._done or t.shipped or t.why or t.key not in self._curves
                or t.resumed + t.measured >= self.trials):
            return 0.0
        return t.share * promise(self._curves[t.key]) / max(t.tuning_s / t.batches, 1e-3)

    def _share_bests(self, new: Sequence[TaskReport]) -> None:
        """Each task measures the best configs of this session's other tasks its space takes
        (`tuner.taken_configs`: its operator's, or qmatmul's for qmatmul_requant) where one of the two was just
        tuned (measured something in this round: resumed tasks have shared before), and takes the faster one.
        Tasks are tuned as the rewrites need them, so one tuned early never saw what a sibling tuned later
        found: with 8 trials, DLRM's fused kernel over int8 rows kept a SIMD config while the AMX config its
        fp16-row sibling found later runs it faster (benchmarks/WHOLE_MODEL.md)."""
        from tqdm import tqdm

        from ..tuner import taken_configs, try_configs

        fresh = {id(t) for t in new if t.measured}
        if not fresh:  # a round that tuned nothing: every pair shared before
            return
        found = [(t, t.record) for t in self.tasks]  # what each had found before this round
        for t in self.tasks:
            if t.why.startswith("tuning failed"):
                continue
            given = [rec for s, rec in found if s is not t and rec is not None and (id(t) in fresh or id(s) in fresh)]
            if not given:
                continue
            task = self._task(t)
            try:
                measured = try_configs(task, taken_configs(task, given), self.logs.own(t.op), self.builder(),
                                       self.runner())
            except Exception as err:  # noqa: BLE001 -- the task keeps the kernel it has
                warnings.warn(f"tune_model: measuring other tasks' best configs on {t.op} {t.fields} failed: "
                              f"{type(err).__name__}: {err}", stacklevel=4)
                continue
            if measured:
                t.measured += len(measured)
                before, had = t.best_s, t.record
                self._pick(t, task)
                if self.progress and t.record is not None and (had is None or t.record.config_key != had.config_key):
                    tqdm.write(f"tune_model: {t.op} {shape_text(t.fields)}: another task's best config runs it in "
                               f"{ms(t.best_s)}{f' ({ms(before)} before)' if before is not None else ''}")

    def _pick(self, t: TaskReport, task: Any) -> None:
        """The task's kernel: the best record of its log, or the shipped one where that is faster."""
        log = self.logs.own(t.op)
        rec = log.best(task)
        t.source = "tuned"
        if self.shipped:
            pre = self.logs.shipped(t.op, task.device.name).best(task)
            if pre is not None and (rec is None or pre.latency < rec.latency):
                rec, t.source = pre, "shipped record"
        if rec is None:
            t.why = f"tuning found no correct kernel in {t.resumed + t.measured} trials (see {log.paths[0]})"
            t.source = ""
            return
        t.record, t.best_s, t.why = rec, rec.latency, ""

    # ---- package ------------------------------------------------------------------------------------------
    def _package(self, best: list[Record], out: Path) -> tuple[Path, bool]:
        """Export the records to `out` unless it already holds exactly their kernels; load it. (path, exported)
        Exporting over a package this process loaded is safe: kernel files are named by what they hold
        (`package.export`), so a library the dynamic loader hands back again under a name is that same
        kernel."""
        from ..package import export, read_manifest
        from .registry import load

        def entry(op: str, workload_key: str, device: str, config: Any, version: str) -> tuple[str, ...]:
            return op, workload_key, device, json.dumps(config, sort_keys=True), version

        want = sorted(entry(r.op, r.workload_key, r.device, r.config, r.template_version) for r in best)
        try:
            entries = read_manifest(out).get("kernels", [])
            have = sorted(entry(e["op"], e["workload_key"], e["device"], e["config"], e.get("template_version", ""))
                          for e in entries)
            same = have == want and all((out / e["file"]).exists() for e in entries)
        except (FileNotFoundError, ValueError, KeyError):
            same = False
        if not same:
            export(best, out, builder=self.builder())
        load(out)
        return out, not same
