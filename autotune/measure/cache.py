"""Measure each config once and give every later asker the same number: the cache behind search-quality runs.

Comparing strategies means many tuning runs of one task; they propose many of the same configs (the fast
region, the default), and on a shared machine the same config measured twice differs by a few percent. If
each run measured for itself, a strategy could win by drawing a lucky sample of a config the other drew
unluckily. Through a `MeasurementCache` each (device, op, workload, template version, config) is built and
measured once; every run that proposes it afterwards gets those same costs, build error and program features
back, as if measured anew. So every contender sees the same number for the same config, as interleaving the
measurements would give them (both spread drift over all contenders alike), and a config two strategies find
costs one measurement, not two.

The cache is a tuning log (JSON lines of `records.Record`, append-only, damaged lines skipped on load), so a
rerun of a benchmark replays from it without measuring. Of several records of one key the first counts, so a
replay is stable. Harness failures (the machinery, not the candidate) are passed on but not cached. Records of
another template version never hit: that code's timings say nothing of ours.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from .. import records
from ..build import Built
from ..runtime import HARNESS
from ..task import Task
from .base import Measured, Runner
from .common import discard

Key = tuple[records.TaskKey, str, str]  # the task, template_version, config_key

_BUILT_FIELDS = {f.name for f in dataclasses.fields(Built)}
_RECORD_FIELDS = {f.name for f in dataclasses.fields(records.Record)}


def _key(task: Task, config_key: str, version: str | None = None) -> Key:
    return (task.key, task.template_version if version is None else version, config_key)


def _record_key(r: records.Record) -> Key:
    return (r.task, r.template_version, r.config_key)


class MeasurementCache:
    """An append-only measurement cache at `path` (None: in memory only) in front of a builder and a runner.

    `tune(..., builder=cache.builder, runner=cache.runner)` measures through it. The cache owns the inner
    builder and runner: `close()` closes them, and the facades' own `close()` does nothing, so a caller that
    closes what it was given cannot stop workers that the next run shares.
    """

    def __init__(self, path: str | os.PathLike[str] | None, builder: Any, runner: Runner):
        self.path = Path(path) if path is not None else None
        self.inner_builder, self.inner_runner = builder, runner
        self.entries: dict[Key, records.Record] = {}
        self.hits = 0  # measurements answered from the cache
        self.misses = 0  # measurements the inner runner made
        if self.path is not None:
            for r in records.load(self.path):
                self.entries.setdefault(_record_key(r), r)
        self.builder = _CachedBuilder(self)
        self.runner = _CachedRunner(self)

    def lookup(self, task: Task, config_key: str) -> records.Record | None:
        return self.entries.get(_key(task, config_key))

    def records_for(self, task: Task) -> list[records.Record]:
        """Every cached record of this task (current template version), in the order first measured."""
        want = _key(task, "")[:2]
        return [r for k, r in self.entries.items() if k[:2] == want]

    def store(self, task: Task, measured: Sequence[Measured]) -> None:
        new = []
        for m in measured:
            if m.error_kind == HARNESS:
                continue
            r = task.record(m.built.config, costs=m.costs, error_kind=m.error_kind, error=m.error,
                            build_s=m.built.build_s, **_feature_fields(m.built))
            if _record_key(r) not in self.entries:
                self.entries[_record_key(r)] = r
                new.append(r)
        if self.path is not None:
            records.append(self.path, new)

    def close(self) -> None:
        for inner in (self.inner_builder, self.inner_runner):
            close = getattr(inner, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> "MeasurementCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _CachedBuilder:
    """Builds only configs the cache has not measured; a hit becomes a library-less Built carrying the stored
    build time, build error and features (the runner facade answers it from the cache)."""

    def __init__(self, cache: MeasurementCache):
        self.cache = cache

    def build(self, task: Task, configs: Sequence[Any]) -> list[Built]:
        return _answer(self.cache, task, configs, lambda cfg: cfg, _built_from,
                       lambda todo: self.cache.inner_builder.build(task, todo))

    def close(self) -> None:
        pass  # the cache owns the inner builder


class _CachedRunner:
    """Answers cached configs from the cache; measures the rest with the inner runner, in one call, and stores
    them before returning."""

    def __init__(self, cache: MeasurementCache):
        self.cache = cache

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]:
        return _answer(self.cache, task, built, lambda b: b.config, self._hit, lambda todo: self._miss(task, todo))

    def _hit(self, b: Built, hit: records.Record) -> Measured:
        if b.lib is not None:  # built anew after all (the same config twice in one batch): not needed
            discard(b.lib)
        self.cache.hits += 1
        return Measured(b, hit.costs, hit.error_kind, hit.error)

    def _miss(self, task: Task, todo: list[Built]) -> list[Measured]:
        fresh = self.cache.inner_runner.measure(task, todo)
        self.cache.store(task, fresh)
        self.cache.misses += len(fresh)
        return fresh

    def close(self) -> None:
        pass  # the cache owns the inner runner


T = TypeVar("T")
R = TypeVar("R")


def _answer(cache: MeasurementCache, task: Task, items: Sequence[T], config: Callable[[T], Any],
            from_hit: Callable[[T, records.Record], R], compute: Callable[[list[T]], list[R]]) -> list[R]:
    """Per item, in order: `from_hit(item, record)` where the cache holds its config, else what one call of
    `compute` on all the others returns for it."""
    out: list[R | None] = [None] * len(items)
    todo = []
    for i, item in enumerate(items):
        hit = cache.lookup(task, config(item).key())
        if hit is None:
            todo.append(i)
        else:
            out[i] = from_hit(item, hit)
    if todo:
        for i, r in zip(todo, compute([items[i] for i in todo])):
            out[i] = r
    return [r for r in out if r is not None]


def _built_from(cfg: Any, r: records.Record) -> Built:
    extra = {}
    if "features" in _BUILT_FIELDS:  # program features (cost_model.program), where this Built carries them
        extra["features"] = dict(getattr(r, "features", None) or {})
    return Built(cfg, None, r.build_s, r.error_kind, r.error, **extra)


def _feature_fields(b: Built) -> dict[str, Any]:
    """The record fields for a built candidate's program features, where Record has them (as the tuner fills
    them: none when the build computed none)."""
    features = getattr(b, "features", None) or {}
    if not features or "features" not in _RECORD_FIELDS:
        return {}
    out: dict[str, Any] = {"features": dict(features)}
    if "features_version" in _RECORD_FIELDS:
        try:
            from cost_model.program import PROGRAM_FEATURES_VERSION
        except ImportError:
            pass
        else:
            out["features_version"] = PROGRAM_FEATURES_VERSION
    return out
