"""The tuning loop: propose -> build -> measure -> record -> update the model, until the budget is spent."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from cost_model import XGBCostModel, featurize
from search_spaces import Config, InvalidConfig

from . import records
from .build import Builder, Built
from .measure import LocalRunner, Measured, Timing, require_local_device
from .search import STRATEGIES
from .task import Task


@dataclass
class TuneResult:
    best: records.Record | None
    measured: int  # candidates measured in this run
    resumed: int  # candidates already in the log for this task
    curve: list[float] = field(default_factory=list)  # best latency after each trial of this run


class _Training:
    """Training data for the cost model: every record of this op and device, any workload, of the current
    template version (older code's timings rank the old code's configs, not ours) unless `include_stale`."""

    def __init__(self, task: Task, include_stale: bool = False):
        self.task = task
        self.version = None if include_stale else task.template_version
        self.rows: list[np.ndarray] = []
        self.latencies: list[float] = []
        self.groups: list[str] = []
        self._spaces: dict[str, Any] = {}

    def add(self, recs: list[records.Record]) -> None:
        for r in recs:
            if r.op != self.task.op or r.device != self.task.device.name or r.error_kind in ("invalid", "harness") \
                    or self.version not in (None, r.template_version):
                continue
            try:
                if r.workload_key not in self._spaces:
                    w = self.task.template.Workload.from_json(r.workload)
                    self._spaces[r.workload_key] = (w, self.task.template.space(w, self.task.device.target()))
                w, space = self._spaces[r.workload_key]
                row = featurize(w, space, [space.from_json(r.config)])[0]
            except (InvalidConfig, ValueError, TypeError):
                continue  # a record of an older space: not comparable, not fatal
            if self.rows and len(row) != len(self.rows[0]):
                continue
            self.rows.append(row)
            self.latencies.append(r.latency)
            self.groups.append(r.workload_key)


def tune(task: Task, trials: int, log: str | Path, strategy: str = "xgb", seed: int = 0,
         batch_size: int = 16, early_stopping: int | None = None, timing: Timing = Timing(),
         builder: Builder | None = None, runner: Any = None, progress: bool = True,
         include_stale: bool = False, retry_errors: Iterable[str] = (), confirm: int = 3) -> TuneResult:
    """Measure up to `trials` new configs of `task`, appending every outcome to `log`.

    Configs already in the log for this task are never measured again (resume), except those whose records
    failed with a kind in `retry_errors` and those only the harness failed on; records of other workloads of
    the same op and device train the cost model from the start. Records of another template version (older
    schedule code) count for nothing unless `include_stale`. Before it stops, a run that measured anything
    measures its `confirm` fastest configs once more (not counted as trials): the best is the config whose
    pooled measurements are fastest, not the luckiest single one.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    if trials < 1:
        raise ValueError("trials must be >= 1")
    retry = check_error_kinds(retry_errors)
    propose = STRATEGIES[strategy]
    space = task.space
    rng = random.Random(seed)

    history = list(records.load(log))
    # What resume counts as measured: this template version's records (unless include_stale), except failures
    # to retry and the harness's own failures, which say nothing about the candidate.
    mine = [r for r in records.current(records.for_task(history, task.op, task.workload_key, task.device.name),
                                       include_stale)
            if r.error_kind not in retry | {"harness"}]
    seen: set[Config] = set()
    for r in mine:
        try:
            seen.add(space.from_json(r.config))
        except InvalidConfig:
            pass
    best = records.best(mine, task.op, task.workload_key, task.device.name)

    model = XGBCostModel(seed=seed) if strategy == "xgb" else None
    training = _Training(task, include_stale)
    training.add(history)
    # Shipped records of this op and device (logs/<kind>/<op>.jsonl) warm the model up, as TopHub does.
    training.add(records.load_many(p for p in records.shipped_logs(task.op, task.device.name)
                                   if Path(p).resolve() != Path(log).resolve()))
    if model is not None and training.rows:
        model.update(np.stack(training.rows), training.latencies, training.groups)

    def score(cfgs: list[Config]) -> np.ndarray:
        assert model is not None
        return model.predict(featurize(task.workload, space, cfgs))

    if runner is None:
        require_local_device(task)  # before anything is built
    own_builder, own_runner = builder is None, runner is None
    builder = builder or Builder()
    runner = runner or LocalRunner(timing)
    bar = _progress(trials, task, progress)
    result = TuneResult(best=best, measured=0, resumed=len({r.config_key for r in mine}))
    since_improvement = 0
    try:
        while result.measured < trials:
            n = min(batch_size, trials - result.measured)
            elites = [space.from_json(r.config) for r in sorted((r for r in mine if r.ok),
                                                                 key=lambda r: r.latency)[:16]]
            use_model = model is not None and model.trained
            batch = propose(space, seen, n, rng, score if use_model else None, elites=elites)
            if not batch:
                break  # the whole space is measured
            seen.update(batch)
            measured = runner.measure(task, builder.build(task, batch))
            new = [_to_record(task, m) for m in measured]
            records.append(log, new)
            mine += new
            for r in new:
                result.measured += 1
                if r.ok and (result.best is None or r.latency < result.best.latency):
                    result.best = r
                    since_improvement = 0
                else:
                    since_improvement += 1
                result.curve.append(result.best.latency if result.best else math.inf)
            if model is not None:
                training.add(new)
            if model is not None and training.rows:  # a batch the harness failed on whole trains nothing
                model.update(np.stack(training.rows), training.latencies, training.groups)
            bar.update(len(new))
            if result.best is not None:
                bar.set_postfix_str(f"best {result.best.latency * 1e3:.3f} ms")
            if early_stopping and since_improvement >= early_stopping:
                break
        if confirm and result.measured:
            again = _leaders(mine, task, confirm)
            confirmed = [_to_record(task, m) for m in runner.measure(task, builder.build(task, again))]
            records.append(log, confirmed)
            mine += confirmed
            result.best = records.best(mine, task.op, task.workload_key, task.device.name)
            if result.best is not None:
                bar.set_postfix_str(f"best {result.best.latency * 1e3:.3f} ms (confirmed)")
    finally:
        bar.close()
        if own_builder:
            builder.close()
        if own_runner:
            runner.close()
    return result


def _leaders(recs: list[records.Record], task: Task, n: int) -> list[Config]:
    """The n configs whose pooled measurements are fastest."""
    left, out = list(recs), []
    while len(out) < n:
        top = records.best(left, task.op, task.workload_key, task.device.name)
        if top is None:
            break
        out.append(task.space.from_json(top.config))
        left = [r for r in left if r.config_key != top.config_key]
    return out


def check_error_kinds(kinds: Iterable[str]) -> set[str]:
    """`kinds` as a set, after checking each is a record error kind (`--retry-errors crash,timeout`)."""
    kinds = {kinds} if isinstance(kinds, str) else set(kinds)
    unknown = sorted(kinds - set(records.ERROR_KINDS))
    if unknown:
        raise ValueError(f"unknown error kind {', '.join(map(repr, unknown))}; known: {', '.join(records.ERROR_KINDS)}")
    return kinds


def make_runner(spec: str) -> Any:
    """A runner from its text: `local` (None: the tuner's own), `offline:DIR` or `rpc://HOST:PORT/KEY`."""
    if spec == "local":
        return None
    kind, _, where = spec.partition(":")
    if kind == "offline" and where:
        from .offline import OfflineRunner

        return OfflineRunner(where)
    if kind == "rpc":
        from .rpc import RPCRunner

        return RPCRunner(spec)
    raise ValueError(f"unknown runner {spec!r}; expected local, offline:DIR or rpc://HOST:PORT/KEY")


def dry_run(task: Task, trials: int, seed: int = 0, builder: Builder | None = None) -> list[Built]:
    """Build (but never run) the configs a tuning run would start with: the default, then random ones.

    Shows what would be measured and that it compiles within the device's limits, without a device.
    """
    space = task.space
    rng = random.Random(seed)
    batch = [space.default()]
    batch += STRATEGIES["random"](space, set(batch), trials - 1, rng, None, elites=[]) if trials > 1 else []
    own = builder is None
    builder = builder or Builder()
    try:
        return builder.build(task, batch)
    finally:
        if own:
            builder.close()


def _to_record(task: Task, m: Measured) -> records.Record:
    cfg = m.built.config
    return task.record(cfg, costs=m.costs, error_kind=m.error_kind, error=m.error, build_s=m.built.build_s)


def _progress(total: int, task: Task, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{task.op} {task.device.name}", unit="trial", disable=not enabled,
                dynamic_ncols=True)
