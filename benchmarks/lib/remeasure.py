"""Configs timed again, outside the tuning runs: in interleaved rounds, so that a slow phase of the machine falls
on all of them alike. The reference a run is judged against (`confirm`), each run's pick (`remeasure_picks`),
the rescoring of each run's fastest configs (`rescore`), and the scale of anchored timing a cache keeps."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import tempfile
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from autotune.runtime import Timing
from autotune.measure.cache import MeasurementCache
from autotune.task import Task


def remeasure(task: Task, builder: Any, runner: Any, cfg: Any, k: int) -> tuple[list[float], str | None]:
    """Build `cfg` once and time that library k times; returns the k latencies and the first error, if any."""
    return remeasure_interleaved(task, builder, runner, [cfg], k)[cfg]


def remeasure_interleaved(task: Task, builder: Any, runner: Any, cfgs: Sequence[Any], k: int,
                          seed: int = 0) -> dict[Any, tuple[list[float], str | None]]:
    """Build each config once and time each library k times, in k rounds over all of them (each round in a new
    random order), so that a slow phase of the machine falls on all of them alike; per config, its latencies and
    first error. Each timing goes through a copy of the library: the runner deletes what it measured."""
    built = builder.build(task, list(dict.fromkeys(cfgs)))
    out = {b.config: ([], None if b.lib else f"{b.error_kind}: {b.error}") for b in built}
    live = [b for b in built if b.lib is not None]
    rng = random.Random(seed)
    try:
        for _ in range(k):
            rng.shuffle(live)
            for b in live:
                fd, copy = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(b.lib))
                os.close(fd)
                shutil.copyfile(b.lib, copy)
                (m,) = runner.measure(task, [replace(b, lib=copy)])
                lat, error = out[b.config]
                if m.error_kind is None and m.costs:
                    lat.append(statistics.median(m.costs))
                elif error is None:
                    out[b.config] = (lat, f"{m.error_kind}: {m.error}")
    finally:
        for b in live:
            try:
                os.unlink(b.lib)
            except OSError:
                pass
    return out


def pick_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def remeasure_picks(task: Task, cache: MeasurementCache, runs: Sequence[dict[str, Any]], k: int,
                    seed: int = 0) -> dict[str, float]:
    """The median of k interleaved re-measurements (`remeasure_interleaved`) of every run's pick, by config key:
    what each contender's tuning would give its user, timed in one stretch instead of taken from a cache filled
    at many moments (on a machine whose speed swings, the cache's figure of a pick says when it was measured)."""
    picks = {pick_key(r["pick"]): task.space.from_json(r["pick"]) for r in runs if r.get("pick")}
    timed = remeasure_interleaved(task, cache.inner_builder, cache.inner_runner, list(picks.values()), k, seed)
    return {key: statistics.median(timed[cfg][0]) for key, cfg in picks.items() if timed[cfg][0]}


def confirm(task: Task, cache: MeasurementCache, mine: Sequence[Any], n: int, k: int,
            measured_best: dict[str, Any] | None, drift: int = 0, seed: int = 0) -> dict[str, Any]:
    """The reference latency of trials-to-margin: the least median of `k` re-measurements of the `n` configs with
    the best logged latencies: the benchmark's best single measurement is the luckiest of hundreds, a target no
    run could reach but by luck (benchmarks/SEARCH_QUALITY.md has the figures).

    Re-measured later than the cache's numbers, that median may be of a faster or slower moment of a shared
    machine. With `drift` > 0 that many
    other configs, drawn at random among those logged within 2x of the best (not chosen for a lucky draw), are
    re-measured too, and the reference is divided by the median ratio of their re-measured to logged latency:
    the reference of the moment the runs were measured in."""
    firsts: dict[str, Any] = {}
    for r in sorted(mine, key=lambda r: r.latency):
        firsts.setdefault(r.config_key, r)
    ordered = list(firsts.values())

    def again(r: Any) -> list[float]:
        return remeasure(task, cache.inner_builder, cache.inner_runner, task.space.from_json(r.config), k)[0]

    medians = []
    for i, r in enumerate(ordered[:n]):
        lat = measured_best["latencies"] if i == 0 and measured_best and measured_best.get("latencies") \
            else again(r)  # the best's own were already re-measured (--noise)
        if lat:
            medians.append((statistics.median(lat), r.config, r.latency))
    if not medians:
        return {"latency_s": None, "configs": 0}
    median, config, logged = min(medians, key=lambda m: m[0])
    near = [r for r in ordered[n:] if r.latency <= 2 * ordered[0].latency]
    ratios = [statistics.median(lat) / r.latency
              for r in random.Random(seed).sample(near, min(drift, len(near))) if (lat := again(r))]
    factor = statistics.median(ratios) if ratios else 1.0
    return {"latency_s": median / factor, "remeasured_s": median, "drift": factor, "drift_configs": len(ratios),
            "config": config, "logged_s": logged, "configs": len(medians), "k": k}


def run_fastest(runs: Sequence[dict[str, Any]], per_run: int) -> dict[str, int]:
    """The configs to rescore: each run's `per_run` fastest by its own logged latencies, by config key, with the
    best rank any run gave it (1 = a run's fastest). Cut per run, not over the whole cache, since a cache filled
    over hours holds figures of faster and slower moments: one cut over all of them would keep the configs of
    the runs measured in a fast hour and drop those of a slow one."""
    ranks: dict[str, int] = {}
    for r in runs:
        ok = sorted((x, key) for x, key in zip(r["latencies"], r["keys"]) if math.isfinite(x))
        for i, key in enumerate(list(dict.fromkeys(key for _, key in ok))[:per_run], 1):
            ranks[key] = min(ranks.get(key, i), i)
    return ranks


def rescore(task: Task, cache: MeasurementCache, configs: dict[str, dict[str, Any]], k: int,
            timing: Timing | None = None, seed: int = 0) -> dict[str, list[float]]:
    """Each of `configs` (config JSON by config key) re-measured k times in interleaved rounds
    (`remeasure_interleaved`, with `timing` instead of the runner's own), by config key.

    On a machine whose speed swings by a third within seconds, a config's one logged figure says mostly when it
    was measured (benchmarks/SEARCH_QUALITY.md: logged and rescored ranks uncorrelated on a shared VM). The
    median of k measurements spread over k rounds says how fast a config is, to within `split_half`; shorter
    measurements do not buy more of that."""
    cfgs = {task.space.from_json(raw): key for key, raw in configs.items()}
    runner = cache.inner_runner
    saved = runner.timing
    runner.timing = timing or saved
    try:
        timed = remeasure_interleaved(task, cache.inner_builder, runner, list(cfgs), k, seed)
    finally:
        runner.timing = saved
    return {cfgs[cfg]: lat for cfg, (lat, _) in timed.items() if lat}


def split_half(rescored: dict[str, list[float]]) -> float:
    """How far a rescored median can be trusted: per config, the relative difference of the medians of its odd
    and even rounds (two independent estimates, each of half the rounds), the median over configs. The median
    of all rounds is closer than that to the truth, so a margin this wide is one the rescoring can resolve."""
    diffs = [abs(a - b) / ((a + b) / 2) for lat in rescored.values() if len(lat) >= 4
             for a, b in [(statistics.median(lat[0::2]), statistics.median(lat[1::2]))]]
    return statistics.median(diffs) if diffs else math.nan


@dataclass(frozen=True)
class AnchorScale:
    """Anchored timing's nominal anchor latencies of a cache (`CACHE.anchor.json`): a rerun that adds to the cache
    times on the first run's scale, not on that of its own calibration, which may come at a slower moment."""

    path: Path

    def load(self) -> dict[str, float] | None:
        if not self.path.exists():
            return None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not all(isinstance(v, (int, float)) and v > 0 for v in data.values()):
                raise ValueError("not an object of positive latencies")
        except ValueError as err:
            raise SystemExit(f"{self.path}: unreadable anchor scale ({err}); delete it with its cache") from None
        return {str(k): float(v) for k, v in data.items()}

    def check(self, cache: MeasurementCache) -> None:
        if cache.entries and not self.path.exists():
            warnings.warn(f"{cache.path} holds records but no anchor scale ({self.path.name}): they were timed "
                          "plain or on another scale, and the new anchored ones will not compare with them")

    def save(self, nominal: dict[str, float]) -> None:
        if nominal:
            self.path.write_text(json.dumps(nominal, indent=1) + "\n", encoding="utf-8")


def anchor_scale(cache: str | None, timing: Timing) -> AnchorScale | None:
    return AnchorScale(Path(f"{cache}.anchor.json")) if cache and timing.anchor else None


def parse_timing(text: str) -> Timing:
    """`number=3,repeat=5,min_repeat_ms=50,anchor=1`: the runner's timing (default: the tuner's)."""
    fields: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("number", "repeat", "min_repeat_ms", "anchor") or \
                (key == "anchor" and value not in ("0", "1")):
            raise ValueError(f"--timing {text!r}: expected number=N,repeat=N,min_repeat_ms=MS,anchor=0|1")
        fields[key] = float(value) if key == "min_repeat_ms" else bool(int(value)) if key == "anchor" else int(value)
    return Timing(**fields)

