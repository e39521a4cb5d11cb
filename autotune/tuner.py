"""The tuning loop: propose -> build -> measure -> record -> update the model, until the budget is spent."""

from __future__ import annotations

import functools
import inspect
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

import search_spaces
from cost_model import TRANSFER_AS, Ranker, TaskFeaturizer, TrainingSet
from cost_model.features import AUTO_FEATURES, resolve_feature_set, uses_program  # noqa: F401 (AUTO_FEATURES)
from search_spaces import Config, InvalidConfig

from . import records
from .build import Builder, Built
from .measure import LocalRunner, Measured, Runner, Timing, require_local_device
from .search import STRATEGIES, Strategy
from .task import Task
from .tuning_log import TuningLog


@dataclass
class TuneResult:
    best: records.Record | None
    measured: int  # candidates measured in this run
    resumed: int  # candidates already in the log for this task
    curve: list[float] = field(default_factory=list)  # best latency after each trial of this run
    trials: list[records.Record] = field(default_factory=list)  # this run's records, in measured order


def tune(task: Task, trials: int, log: str | Path | TuningLog, strategy: str = "xgb", seed: int = 0,
         batch_size: int | None = None, early_stopping: int | None = None, timing: Timing = Timing(),
         builder: Builder | None = None, runner: Runner | None = None, progress: bool = True,
         include_stale: bool = False, retry_errors: Iterable[str] = (), confirm: int = 3,
         transfer: Iterable[str | Path] | None = None, features: str = "auto", transfer_as: str = "pooled",
         options: dict[str, Any] | None = None) -> TuneResult:
    """Measure up to `trials` new configs of `task`, appending every outcome to `log` (a path, or a `TuningLog`
    already read, which the run keeps up to date).

    Configs already in the log for this task are never measured again (resume: `TuningLog.resume_set`), except
    those whose records failed with a kind in `retry_errors` and those only the harness failed on. `runner`
    measures (None: a `LocalRunner` with `timing`, closed at the end). Every other record of `log` and
    of the `transfer` logs (None: the shipped logs of this device kind, as TopHub; (): none) trains the cost
    model from the start, as `cost_model.training` decides: other shapes, other CPU models, other operators
    through program features. Records of another template version count for nothing unless `include_stale`.
    `transfer_as` says how they meet the task's own (`cost_model.ranker`: a `prior` the task's records correct,
    or one `pooled` model).
    `features` picks the model's feature set (`cost_model.FEATURE_SETS`, or "auto"); `options` go to the
    strategy (those its `search.Strategy` declares, e.g. {"epsilon": 0.2, "pool": 4}). Before it stops, a run
    that measured anything measures its `confirm` fastest configs once more (not counted as trials): the best
    is the config whose pooled measurements are fastest, not the luckiest single one.
    """
    declared = strategy_named(strategy)
    if trials < 1:
        raise ValueError("trials must be >= 1")
    batch_size = declared.default_batch if batch_size is None else batch_size
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    log = log if isinstance(log, TuningLog) else TuningLog(log)
    proposer = Proposer(task, log, strategy, seed, None, include_stale, retry_errors, transfer, features,
                        transfer_as, options)
    if runner is None:
        require_local_device(task)  # before anything is built
    own_builder, own_runner = builder is None, runner is None
    proposer.builder = builder = builder or Builder()
    runner = runner or LocalRunner(timing)
    bar = _progress(trials, task, progress)
    result = TuneResult(best=log.best(task, include_stale), measured=0,
                        resumed=log.resumed(task, proposer.retry, include_stale))
    since_improvement = 0
    try:
        while result.measured < trials:
            batch = proposer.ask(min(batch_size, trials - result.measured))
            if not batch:
                break  # the whole space is measured
            new = [_to_record(task, m) for m in runner.measure(task, builder.build(task, batch))]
            log.append(new)
            proposer.tell(new)
            result.trials += new
            for r in new:
                result.measured += 1
                if r.ok and (result.best is None or r.latency < result.best.latency):
                    result.best = r
                    since_improvement = 0
                else:
                    since_improvement += 1
                result.curve.append(result.best.latency if result.best else math.inf)
            bar.update(len(new))
            if result.best is not None:
                bar.set_postfix_str(f"best {result.best.latency * 1e3:.3f} ms")
            if early_stopping and since_improvement >= early_stopping:
                break
        if confirm and result.measured:
            again = proposer.leaders(confirm)
            confirmed = [_to_record(task, m) for m in runner.measure(task, builder.build(task, again))]
            log.append(confirmed)
            result.best = log.best(task, include_stale)
            if result.best is not None:
                bar.set_postfix_str(f"best {result.best.latency * 1e3:.3f} ms (confirmed)")
    finally:
        bar.close()
        if own_builder:
            builder.close()
        if own_runner:
            runner.close()
    return result


class Proposer:
    """What the tuner measures next, apart from measuring it (ask and tell): `ask(n)` gives the next configs,
    `tell(records)` what became of them. `tune` is this with a runner in a loop; where the tuner cannot reach
    the device (a GPU lent for minutes: `benchmarks/gpu_check.py prepare --guided`) the batch is asked for
    here, measured there, and its records told to the log (and the next proposer) later.

    The task's records in `log` are the resume set (never proposed again, except errors of a kind in
    `retry_errors` and those only the harness failed on); they, the rest of `log` and the `transfer` logs train
    the strategy's cost model (see `tune` for `include_stale`, `transfer`, `features`, `transfer_as`,
    `options`). A model-guided task with nothing measured opens with the best configs of its operator's other
    shapes and of operators whose space holds its own (`seeds`, `_neighbours_best`: a small budget otherwise
    spends itself learning what a neighbour already found). `builder` (or one set before the first `ask`)
    lowers the shortlist a program-feature model reranks."""

    def __init__(self, task: Task, log: TuningLog, strategy: str = "xgb", seed: int = 0,
                 builder: Builder | None = None, include_stale: bool = False, retry_errors: Iterable[str] = (),
                 transfer: Iterable[str | Path] | None = None, features: str = "auto",
                 transfer_as: str = "pooled", options: dict[str, Any] | None = None):
        declared = strategy_named(strategy)
        feature_set = resolve_feature_set(features)
        if transfer_as not in TRANSFER_AS:
            raise ValueError(f"transfer_as must be one of {', '.join(TRANSFER_AS)}, got {transfer_as!r}")
        self.task, self.space, self.retry = task, task.space, check_error_kinds(retry_errors)
        self._propose = declared.bind(options or {})
        self._rng = random.Random(seed)
        self.mine = log.resume_set(task, self.retry, include_stale)
        self.seen: set[Config] = set()
        for r in self.mine:
            try:
                self.seen.add(self.space.from_json(r.config))
            except InvalidConfig:
                pass
        transferred = records.load_many(_transfer_logs(task, transfer, log.paths))
        self.model = _Model(task, self.space, feature_set, include_stale, seed, transfer_as) \
            if declared.needs_model else None
        if self.model is not None:
            self.model.learn(log.records + transferred)
        # a task with nothing measured yet first measures what won on its operator's other shapes and on
        # operators whose space holds its own (the model, trained on other tasks, ranks a config they share by
        # its features, not by its having won there)
        self.seeds = _neighbours_best(task, log.records, transferred, include_stale) \
            if declared.needs_model and not any(r.ok for r in self.mine) else []  # emptied by the first ask
        # a code path the model knows nothing of (a new intrinsic, or one this machine is the first to have), or
        # one that won another shape here: the model's best config of it is measured once, in the first batches
        self.unexplored = _unexplored_paths(task, [*log.records, *transferred], include_stale) \
            if declared.needs_model else []
        self.builder = builder  # may be set later, before the first ask
        self._extra: dict[str, Any] | None = None

    def ask(self, n: int) -> list[Config]:
        """Up to `n` configs never proposed or measured before (fewer once the space runs out); the first batch
        of a model-guided run opens with the neighbours' best configs (`seeds`, a quarter of it at most)."""
        if n < 1:
            return []
        seeds = [c for c in self.seeds if c not in self.seen][:n // 4]
        self.seeds = []
        self.seen.update(seeds)
        n -= len(seeds)
        elites = [self.space.from_json(r.config)
                  for r in sorted((r for r in self.mine if r.ok), key=lambda r: r.latency)[:16]]
        score = self.model.score if self.model is not None and self.model.trained else None
        if score is not None and self._extra is None:
            self._extra = self.model.search_arguments(self.builder, self._propose)
        if seeds and self.unexplored:  # a seed measures its path in this batch
            seeded = {self.space.path_of(c) for c in seeds}
            self.unexplored = [p for p in self.unexplored if p not in seeded]
        explore = self._explore(score, max(1, n // 4)) if n > 1 else []
        self.seen.update(explore)
        n -= len(explore)
        batch = seeds + explore + self._propose(self.space, self.seen, n, self._rng, score, elites=elites,
                                                **(self._extra if score else {}))
        self.seen.update(batch)
        return batch

    def _explore(self, score: Any, most: int) -> list[Config]:
        """The model's best unmeasured config (without a trained model yet, a random one) of each of up to `most`
        unexplored paths, which are then explored: a first batch's spread design of a few configs need not
        reach every path."""
        out = []
        while self.unexplored and len(out) < most:
            path = self.unexplored.pop(0)
            # a sample of the path, not all of it (a fused embedding path: millions of combinations, seconds to
            # enumerate); drawn by its own generator, seeded by the path, so the proposals' stream stays as it was
            draw = random.Random(repr(path))
            try:
                drawn = [self.space.sample(draw, path=path) for _ in range(EXPLORE_POOL)]
            except ValueError:  # no valid config on that path (any more)
                drawn = []
            pool = [c for c in dict.fromkeys(drawn) if c not in self.seen]
            if pool:
                out.append(pool[int(np.argmax(score(pool)))] if score is not None else self._rng.choice(pool))
        return out

    def leaders(self, n: int) -> list[Config]:
        """The n measured configs whose pooled measurements are fastest: what a run confirms before it ends."""
        left, out = list(self.mine), []
        while len(out) < n:
            top = records.best(left, self.task.op, self.task.workload_key, self.task.device.name)
            if top is None:
                break
            out.append(self.space.from_json(top.config))
            left = [r for r in left if r.config_key != top.config_key]
        return out

    def tell(self, recs: Sequence[records.Record]) -> None:
        """Records of this task's measurements (the model learns from them)."""
        self.mine += recs
        if self.model is not None:
            self.model.learn(recs)


ENUMERATE_LIMIT = 200_000  # spaces up to this many knob combinations are scored whole, not annealed
EXPLORE_POOL = 256  # draws of an unexplored path the model picks its best of (repeats dropped: a path of a few
#                     dozen configs is drawn nearly whole, a larger one sampled)


class _Model:
    """A run's cost model: the transfer policy's training set, the task's featurizer and the ranker(s).

    With program features, candidates must be lowered to be featurized, so a knob model shortlists and the
    program model reranks the shortlist (lowered in the build workers, remembered per config)."""

    def __init__(self, task: Task, space: Any, feature_set: str, include_stale: bool, seed: int,
                 transfer_as: str = "pooled"):
        from cost_model.program import PROGRAM_FEATURES_VERSION

        self.task, self.space, self.feature_set = task, space, feature_set
        version = (lambda op, device: None) if include_stale else records.current_version
        target = task.device.to_json()

        def ranker(fs: str) -> Ranker:
            training = TrainingSet(task.op, task.device.name, fs, search_spaces.get, version,
                                   PROGRAM_FEATURES_VERSION, task.workload_key)
            return Ranker(training, TaskFeaturizer(task.op, task.workload, space, target, fs), seed=seed,
                          transfer_as=transfer_as)

        self.main = ranker(feature_set)
        self.shortlist = ranker("knobs") if uses_program(feature_set) else None
        self.task_key = task.key

    @property
    def trained(self) -> bool:
        return self.main.trained and (self.shortlist is None or self.shortlist.trained)

    def learn(self, recs: Sequence[records.Record]) -> None:
        """Take the records that can teach the task, then refit."""
        program = self.main.featurizer.program  # measured programs need no lowering when the reranker asks
        for r in recs:
            if r.features and r.task == self.task_key:
                try:
                    program[self.space.from_json(r.config)] = r.features
                except InvalidConfig:
                    pass
        for ranker in (self.main, self.shortlist):
            if ranker is not None:
                ranker.training.add(recs)
                ranker.fit()

    def score(self, cfgs: Sequence[Config]) -> np.ndarray:
        return (self.shortlist or self.main).score(cfgs)

    def search_arguments(self, builder: Any, propose: Any) -> dict[str, Any]:
        """What `model_search` takes beyond the scorer: the enumerated space, and the program reranker."""
        params = inspect.signature(propose).parameters
        out: dict[str, Any] = {}
        if "candidates" in params and self.space.raw_size <= ENUMERATE_LIMIT:
            out["candidates"] = list(self.space)
        if "rerank" in params and self.shortlist is not None:
            out["rerank"] = functools.partial(self._rerank, builder)
        return out

    def _rerank(self, builder: Any, cfgs: Sequence[Config]) -> np.ndarray:
        program = self.main.featurizer.program
        todo = [c for c in cfgs if c not in program]
        if todo and hasattr(builder, "featurize"):
            for cfg, feats in zip(todo, builder.featurize(self.task, todo)):
                program[cfg] = feats
        return self.main.score(cfgs)


def strategy_named(strategy: str) -> Strategy:
    """The declared strategy of that name (`search.STRATEGIES`), or a ValueError listing the known ones."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy]


def check_strategy_options(strategy: str, options: dict[str, Any], space: Any) -> None:
    """Raise ValueError now if `options` are not options of `strategy` or a value is bad (one cold proposal on
    `space`), not when a run that measured for minutes first proposes with them."""
    strategy_named(strategy).bind(options)(space, set(), 1, random.Random(0), None)


def __getattr__(name: str) -> Any:
    if name == "DEFAULT_BATCH":  # the old table, read from the declarations
        return {n: s.default_batch for n, s in STRATEGIES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _transfer_logs(task: Task, transfer: Iterable[str | Path] | None, own: Sequence[Path]) -> list[Path]:
    if transfer is None:  # shipped records of this device kind, every operator (program features are shared)
        paths = [p for op in search_spaces.names() for p in records.shipped_logs(op, task.device.name)]
    else:
        paths = [Path(p) for p in ([transfer] if isinstance(transfer, (str, Path)) else transfer)]
        missing = [str(p) for p in paths if not p.exists()]
        if missing:
            raise FileNotFoundError(f"transfer logs not found: {', '.join(missing)}")
    mine = {p.resolve() for p in own}
    return [p for p in paths if p.resolve() not in mine]


def _neighbours_best(task: Task, own: Sequence[records.Record], transfer: Sequence[records.Record],
                     include_stale: bool) -> list[Config]:
    """The task's own fastest config under older template code, if its log has one (a changed schedule is
    measured again, but seldom reorders what wins entirely), then the fastest config of each other task on
    `task`'s device kind whose knobs include its space's and whose values it takes (its operator's other shapes;
    operators whose space holds its own, as qmatmul's holds qmatmul_requant's, the extra knobs dropped): the
    log's own tasks first (the same machine; the latest tuned first), then the transfer logs' in their order."""
    kind = task.device.name.split(":")[0]
    mine = (task.op, task.workload_key, task.device.name)
    before = records.best(own, *mine)  # called while the task has no current success: an older code's, or none

    def bests(recs: Sequence[records.Record]) -> list[records.Record]:
        current = records.current(recs, include_stale)
        tasks = dict.fromkeys((r.op, r.workload_key, r.device) for r in current  # in the order they first appear
                              if r.ok and r.device.split(":")[0] == kind)
        tasks.pop(mine, None)
        return [r for r in (records.best(current, *key) for key in tasks) if r is not None]

    return taken_configs(task, [*([before] if before else []), *reversed(bests(own)), *bests(transfer)])


def taken_configs(task: Task, recs: Iterable[records.Record]) -> list[Config]:
    """The configs of `recs` that `task`'s space takes, in order, each once: records of its operator's other
    shapes, or of an operator whose knobs include its own (knobs this space lacks dropped: qmatmul's n_block,
    where qmatmul_requant's epilogue needs whole rows); values it refuses drop the record."""
    space = task.space
    names = {k.name for k in space.knobs}
    out: list[Config] = []
    for r in recs:
        if not names <= set(r.config):
            continue
        try:
            cfg = space.from_json({k: v for k, v in r.config.items() if k in names})
        except InvalidConfig:
            continue
        if cfg not in out:
            out.append(cfg)
    return out


def try_configs(task: Task, configs: Sequence[Config], log: TuningLog, builder: Builder, runner: Runner,
                include_stale: bool = False) -> list[records.Record]:
    """Measure those of `configs` that `task`'s log has not (e.g. what won its operator's other tasks, tuned
    after it: `taken_configs`), appending the outcomes to `log`. Where one beats the task's best, both are
    measured once more, so the best stays the config whose pooled measurements are fastest (as `tune`'s
    confirmation), not a single lucky run. Returns the new records."""
    done = {r.config_key for r in log.resume_set(task, include_stale=include_stale)}
    todo = list(dict.fromkeys(c for c in configs if c.key() not in done))
    if not todo:
        return []
    before = log.best(task, include_stale)
    new = [_to_record(task, m) for m in runner.measure(task, builder.build(task, todo))]
    log.append(new)
    won = [r for r in new if r.ok and (before is None or r.latency < before.latency)]
    if won and before is not None:
        leader = min(won, key=lambda r: r.latency)
        again = [task.space.from_json(leader.config), task.space.from_json(before.config)]
        confirmed = [_to_record(task, m) for m in runner.measure(task, builder.build(task, again))]
        log.append(confirmed)
        new += confirmed
    return new


def _unexplored_paths(task: Task, recs: Sequence[records.Record], include_stale: bool) -> list[tuple[Any, ...]]:
    """The code paths of the task's space (`Space.paths`) it has not measured that either no record of its
    operator (or of one whose knobs hold its own: qmatmul's for qmatmul_requant) on this kind of device took,
    so the model knows nothing of them, or that won another such task on this device: a path that wins here,
    which a model trained mostly on other machines may not rank first yet. The unknown ones first."""
    space = task.space
    if not space.paths:
        return []
    kind, device, names = task.device.name.split(":")[0], task.device.name, {k.name for k in space.knobs}
    mine = (task.op, task.workload_key, device)
    current = [r for r in records.current(recs, include_stale) if r.ok]

    def path(r: records.Record) -> tuple[Any, ...]:
        return tuple(r.config.get(p) for p in space.paths)

    tried = {path(r) for r in current if (r.op, r.workload_key, r.device) == mine}
    kin = [r for r in current if names <= set(r.config)]  # the operator's records, and those of operators whose
    #                                                        knobs hold its own (qmatmul's for qmatmul_requant)
    known = {path(r) for r in kin if r.device.split(":")[0] == kind}
    others = {(r.op, r.workload_key, r.device) for r in kin if r.device == device}
    winners = {path(b) for b in (records.best(current, *t) for t in others - {mine}) if b is not None}
    untried = [p for p in space.paths_present() if p not in tried]
    return [p for p in untried if p not in known] + [p for p in untried if p in known and p in winners]


def check_error_kinds(kinds: Iterable[str]) -> set[str]:
    """`kinds` as a set, after checking each is a record error kind (`--retry-errors crash,timeout`)."""
    kinds = {kinds} if isinstance(kinds, str) else set(kinds)
    unknown = sorted(kinds - set(records.ERROR_KINDS))
    if unknown:
        raise ValueError(f"unknown error kind {', '.join(map(repr, unknown))}; known: {', '.join(records.ERROR_KINDS)}")
    return kinds


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
    from cost_model.program import PROGRAM_FEATURES_VERSION

    cfg = m.built.config
    return task.record(cfg, costs=m.costs, error_kind=m.error_kind, error=m.error, build_s=m.built.build_s,
                       features=m.built.features or None,
                       features_version=PROGRAM_FEATURES_VERSION if m.built.features else "")


def _progress(total: int, task: Task, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{task.op} {task.device.name}", unit="trial", disable=not enabled,
                dynamic_ncols=True)
