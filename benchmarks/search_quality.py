"""Does the cost model earn its place? Tuning curves of xgb, random and variants from fresh logs, over seeds.

    python benchmarks/search_quality.py --op qmatmul --shape m=2048,k=512,n=256 --seeds 5 --trials 64 \
        [--contenders xgb=xgb random=random eps=xgb:epsilon=0.3,batch=8 warm=xgb:transfer=true,diversity=1 \
                      prior=xgb:transfer=true,transfer_as=prior] \
        [--transfer LOG] [--cache PATH] [--json out.json] [--png out.png] [--noise 10] [--margin 0.05] \
        [--confirm 5] [--drift 5]

Every run starts from an empty log and a cold model (tune's `transfer=()`); `--transfer LOG` adds the contender
`xgb+transfer`, warmed by LOG less the benchmarked workload's own records. Runs are interleaved seed by seed
(for each seed, each contender) so that drift of the machine over the benchmark hits all contenders alike, and
all of them measure through one `MeasurementCache` (autotune/measure/cache.py): a config is measured once and
every run that proposes it sees the same number, so no strategy wins by a lucky draw of the same config.

Figures: best-after-N medians over seeds, and per seed the first trial whose best-so-far is within the margin
of the reference (a run that never gets there counts as twice the budget in the median). Where the space has a
wide plateau a few percent above the best, where that one line falls on it decides those counts, so the
benchmark also prints them for margins of 2-20% and margin-free figures: each run's mean tuning curve,
the geometric mean of its best-so-far over its trials (`curve_mean`), and on how many seeds a contender's is
below random's; and each run's pick re-measured at the end, all contenders' interleaved (`--picks`).
The reference is the least median of repeated measurements of the configs logged fastest (`--confirm N`,
default 5), not the best single measurement, which is the luckiest draw of hundreds and may lie below what that
config runs at; it is divided by the machine's drift since the runs (`--drift K`, default 5: the median ratio
re-measured / logged of K other configs within 2x of the best), so that it is of the moment the runs were measured in.
`--timing anchor=1` measures every config anchored (`runtime.time_anchored`), for a machine whose speed swings.
`--rescore K` re-measures each run's fastest configs K times in interleaved rounds and judges every run again by
those medians (`rescore`), for a machine whose single figures say more of when than of what was measured.
`--noise K` times the default and the best config K times each (one build, K measurements of that library);
when the best config's interquartile spread (IQR/median) exceeds --margin, the margin used is that spread: a
smaller one would rank runs by noise.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from autotune import records
from autotune.build import Builder
from autotune.measure import LocalRunner, Timing, require_local_device
from autotune.measure.cache import MeasurementCache
from autotune.search import STRATEGIES
from autotune.task import Task, make_task
from autotune.tuner import check_strategy_options, strategy_named, tune
from autotune.tuning_log import TuningLog
from cost_model import TRANSFER_AS, TUNE_FEATURE_SETS
from cost_model.features import AUTO

CHECKPOINTS = (8, 16, 32, 64)
MARGINS = (0.02, 0.05, 0.10, 0.20)  # trials to within each, beside the requested margin: no one line decides
FEATURE_SETS = TUNE_FEATURE_SETS  # what tune(features=...) takes
DEFAULT_CONTENDERS = ("xgb=xgb", "random=random")
TRANSFER_LABEL = "xgb+transfer"
WARM = "<--transfer>"  # a contender's transfer log before --transfer names it


# ---- contenders ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Contender:
    """One way to tune: a strategy with tune's batch size, feature set and strategy options."""

    label: str
    strategy: str
    batch: int | None = None  # None: tune's default
    features: str | None = None  # None: tune's default
    options: dict[str, Any] = field(default_factory=dict)
    transfer: tuple[str, ...] = ()  # logs warming the model; () = cold
    transfer_as: str | None = None  # how the model combines them with the task's own (None: tune's default)


def _value(text: str) -> Any:
    """An option's value: int, float, bool (true/false) or the text itself."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_contender(spec: str) -> Contender:
    """`LABEL=STRATEGY[:key=value,...]`: keys `batch`, `features` and `transfer_as` are tune's, `transfer=true`
    warms the contender by --transfer's log; any other key is a strategy option."""
    label, eq, rest = spec.partition("=")
    label = label.strip()
    if not eq or not label or not re.fullmatch(r"[\w.+-]+", label):
        raise ValueError(f"contender {spec!r}: expected LABEL=STRATEGY[:key=value,...] with a label of letters, "
                         "digits and _.+-")
    strategy, colon, opts = rest.partition(":")
    try:
        strategy_named(strategy)
    except ValueError as err:
        raise ValueError(f"contender {spec!r}: {err}") from None
    batch, features, options, transfer, transfer_as = None, None, {}, (), None
    for item in filter(None, opts.split(",")):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key or not text:
            raise ValueError(f"contender {spec!r}: option {item!r} is not key=value")
        if key in options or (key == "batch" and batch is not None) or (key == "features" and features is not None) \
                or (key == "transfer" and transfer) or (key == "transfer_as" and transfer_as):
            raise ValueError(f"contender {spec!r}: {key!r} given twice")
        if key == "batch":
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"contender {spec!r}: batch must be a whole number >= 1, not {text!r}")
            batch = int(text)
        elif key == "features":
            if text not in FEATURE_SETS:
                raise ValueError(f"contender {spec!r}: features must be one of {', '.join(FEATURE_SETS)}, "
                                 f"not {text!r}")
            features = text
        elif key == "transfer":
            if text.lower() not in ("true", "false"):
                raise ValueError(f"contender {spec!r}: transfer must be true or false, not {text!r}")
            transfer = (WARM,) if text.lower() == "true" else ()
        elif key == "transfer_as":
            if text not in TRANSFER_AS:
                raise ValueError(f"contender {spec!r}: transfer_as must be one of {', '.join(TRANSFER_AS)}, "
                                 f"not {text!r}")
            transfer_as = text
        else:
            options[key] = _value(text)
    if colon and not opts.strip(","):
        raise ValueError(f"contender {spec!r}: nothing after ':'")
    return Contender(label, strategy, batch, features, options, transfer, transfer_as)


def contender_help() -> str:
    """--contenders' help, from the strategies' declarations (`autotune.search.STRATEGIES`)."""
    return ("LABEL=STRATEGY[:key=value,...]; keys batch, features (" + ", ".join(FEATURE_SETS) + "), transfer, "
            "transfer_as, or a strategy's option: " + "; ".join(
                f"{s.name}: {', '.join(s.options) or 'none'}" for s in STRATEGIES.values()))


def check_contenders(contenders: Sequence[Contender], space: Any) -> None:
    """Raise ValueError naming the contender if a strategy option is not declared or its value is bad, before
    anything is measured."""
    for c in contenders:
        try:
            check_strategy_options(c.strategy, c.options, space)
        except ValueError as err:
            raise ValueError(f"contender {c.label}: {err}") from None


def parse_contenders(specs: Sequence[str]) -> list[Contender]:
    out = [parse_contender(s) for s in specs]
    labels = [c.label for c in out]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise ValueError(f"contender label given twice: {', '.join(dup)}")
    return out


# ---- metrics ------------------------------------------------------------------------------------------------
def best_so_far(latencies: Sequence[float]) -> list[float]:
    """The tuning curve: best latency after each trial (infinity until the first correct one)."""
    out, best = [], math.inf
    for x in latencies:
        best = min(best, x)
        out.append(best)
    return out


def best_after(curve: Sequence[float], n: int) -> float:
    """Best after n trials; a run that stopped earlier (space exhausted) keeps its last best."""
    return curve[min(n, len(curve)) - 1] if curve else math.inf


def trials_to_within(curve: Sequence[float], target: float) -> int | None:
    """The first trial (1-based) whose best-so-far is <= target, or None if the run never got there."""
    return next((i for i, x in enumerate(curve, 1) if x <= target), None)


def median_trials(per_seed: Sequence[int | None], trials: int) -> float:
    """Median over seeds of trials-to-within-margin; a seed that never got there counts as 2 * trials."""
    if not per_seed:
        raise ValueError("no runs")
    return statistics.median(2 * trials if t is None else t for t in per_seed)


def curve_mean(curve: Sequence[float], worst: float) -> float:
    """The geometric mean of a run's best-so-far over its trials (the area under its tuning curve, on a log scale
    so that qmatmul's 35 ms first trials do not outweigh the rest). Margin-free: where trials-to-within-5% asks
    on which trial a run crossed one line, and on a plateau a few percent above the best that line's exact
    height decides it, this weighs how close the run was on every trial; the ratio of two runs' is how much
    lower one's curve lay, whatever the reference. Trials before the first correct one count as `worst`."""
    if not curve:
        return math.nan
    return math.exp(sum(math.log(x if math.isfinite(x) else worst) for x in curve) / len(curve))


def spread(values: Sequence[float]) -> dict[str, float]:
    """Spread of repeated measurements of one config: (max-min)/median and interquartile range/median."""
    if not values:
        return {"n": 0, "median_s": math.nan, "range_rel": math.nan, "iqr_rel": math.nan}
    import numpy as np

    med = statistics.median(values)
    q1, q3 = np.percentile(values, [25, 75])
    return {"n": len(values), "median_s": med, "range_rel": (max(values) - min(values)) / med,
            "iqr_rel": float(q3 - q1) / med}


def checkpoints(trials: int) -> list[int]:
    """The best-after-N columns: 8/16/32/64 up to the budget, and the budget itself."""
    return sorted({c for c in CHECKPOINTS if c <= trials} | {trials})


# ---- running ------------------------------------------------------------------------------------------------
def tune_kwargs(c: Contender) -> dict[str, Any]:
    """tune's keywords for one contender, less those this tune() does not take yet (warned about once)."""
    wanted: dict[str, Any] = {"transfer": list(c.transfer), "features": c.features or AUTO,
                              "options": dict(c.options) or None}
    if c.batch is not None:
        wanted["batch_size"] = c.batch
    if c.transfer_as is not None:
        wanted["transfer_as"] = c.transfer_as
    accepted = inspect.signature(tune).parameters
    for key in [k for k in wanted if k not in accepted]:
        value = wanted.pop(key)
        if key == "transfer":
            _warn_once("tune() takes no transfer= yet: every run is warmed by the shipped logs of this op, and "
                       "--transfer changes nothing")
        elif value not in (None, AUTO):
            _warn_once(f"tune() takes no {key}= yet: {c.label}'s {key} {value!r} is ignored")
    return wanted


_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, stacklevel=3)


def filter_transfer(src: str | Path, task: Task, out: Path) -> tuple[int, int, dict[str, int]]:
    """Write `src` less the records of `task`'s own workload (any device: the answer must not be in the
    warm-up) to `out`; returns (kept, dropped, kept count by 'op shape @ device')."""
    if not Path(src).exists():
        raise ValueError(f"transfer log {src} does not exist")
    kept, dropped, by = [], 0, {}
    for r in records.load(src):
        if r.op == task.op and r.workload_key == task.workload_key:
            dropped += 1
            continue
        kept.append(r)
        shape = ",".join(f"{k}={v}" for k, v in sorted(r.workload.items()))
        name = f"{r.op} {shape} @ {r.device}"
        by[name] = by.get(name, 0) + 1
    records.append(out, kept)
    return len(kept), dropped, by


def warm_contenders(contenders: Sequence[Contender], log: str | Path, task: Task,
                    tmp: Path) -> tuple[list[Contender], dict[str, Any]]:
    """`contenders` with those asking for `transfer=true` warmed by `log` less `task`'s own workload (written
    under `tmp`), plus the `xgb+transfer` contender; and what the warm-up kept, as printed."""
    warm = tmp / "transfer.jsonl"
    kept, dropped, by = filter_transfer(log, task, warm)
    print(f"transfer from {log}: {kept} records kept, {dropped} of this workload dropped")
    for where, n in sorted(by.items()):
        print(f"  {n:6d}  {where}")
    out = [replace(c, transfer=(str(warm),)) if c.transfer else c for c in contenders]
    out.append(Contender(TRANSFER_LABEL, "xgb", transfer=(str(warm),)))
    return out, {"log": str(log), "kept": kept, "dropped_own_workload": dropped, "by": by}


def _run(task: Task, c: Contender, seed: int, trials: int, log: Path, cache: MeasurementCache) -> dict[str, Any]:
    t0, misses = time.perf_counter(), cache.misses
    tune(task, trials, log, strategy=c.strategy, seed=seed, confirm=0, progress=False, builder=cache.builder,
         runner=cache.runner, **tune_kwargs(c))
    recs = TuningLog(log).of(task)[:trials]
    lat = [r.latency for r in recs]
    ok = [r for r in recs if r.ok]
    return {"contender": c.label, "seed": seed, "latencies": lat, "curve": best_so_far(lat),
            "keys": [r.config_key for r in recs],  # which config each trial measured (for --rescore)
            "pick": min(ok, key=lambda r: r.latency).config if ok else None,  # what tune would hand the user
            "measured_new": cache.misses - misses, "wall_s": time.perf_counter() - t0}


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
    the best logged latencies (the benchmark's best single measurement is the luckiest of hundreds: the embedding
    bag's logged 0.666 ms and re-measured 0.749-0.813 ms, a target no run could reach but by luck).

    Re-measured later than the cache's numbers, that median may be of a faster or slower moment of a shared
    machine (the embedding bag's best config: 0.635 ms, 25 minutes later 0.689 ms). With `drift` > 0 that many
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
    was measured: on a 2-vCPU znver4 VM, among the embedding bag's 64 configs logged fastest the rank
    correlation of logged and rescored latency was -0.06, and the rescored best had been logged 59th. The
    median of k measurements spread over k rounds says how fast a config is, to within `split_half`. Short
    measurements do not buy more of that: there, 8 rounds of the tuner's anchored timing disagreed by 5.6%
    between halves, 8 rounds of 3 plain 20 ms repeats by 13.7%."""
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


def rescored_curve(keys: Sequence[str], rescored: dict[str, float]) -> list[float]:
    """A run's tuning curve by rescored latencies: after each trial, the least rescored median among the
    configs it has measured; a config that was not rescored (among no run's fastest by its own figures) counts
    as within no margin."""
    return best_so_far([rescored.get(k, math.inf) for k in keys])


def summarize_rescored(runs: list[dict[str, Any]], contenders: Sequence[Contender], rescored: dict[str, float],
                       margin: float, trials: int) -> dict[str, dict[str, Any]]:
    """Per contender, trials to within `margin` (and each of MARGINS) of the best rescored median, per seed and
    the median over seeds, and its ratio to random's: whether a search *found* a good config, judged by
    measurements that all come from one stretch of time."""
    best = min(rescored.values())
    out: dict[str, dict[str, Any]] = {}
    for c in contenders:
        curves = [rescored_curve(r["keys"], rescored) for r in sorted(runs, key=lambda r: r["seed"])
                  if r["contender"] == c.label]
        per_seed = [trials_to_within(x, best * (1 + margin)) for x in curves]
        out[c.label] = {"trials_to_margin": per_seed,
                        "median_trials_to_margin": median_trials(per_seed, trials) if curves else None,
                        "median_trials_by_margin": {
                            f"{m:g}": median_trials([trials_to_within(x, best * (1 + m)) for x in curves], trials)
                            for m in MARGINS} if curves else {}}
    base = out.get("random", {}).get("median_trials_to_margin")
    for s in out.values():
        t = s["median_trials_to_margin"]
        s["vs_random"] = t / base if base and t else None
    return out


def rescored_table(summary: dict[str, dict[str, Any]], margin: float) -> str:
    head = (f"| contender | trials to within {margin:.1%} (per seed) | median | vs random | "
            + " | ".join(f"within {m:.0%}" for m in MARGINS) + " |")
    lines = [head, "|" + "---|" * (len(MARGINS) + 4)]
    for label, s in summary.items():
        seeds = ", ".join("never" if t is None else str(t) for t in s["trials_to_margin"])
        med, ratio, by = s["median_trials_to_margin"], s["vs_random"], s["median_trials_by_margin"]
        lines.append(f"| {label} | {seeds} | {'-' if med is None else f'{med:g}'} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} | "
                     + " | ".join(f"{by[f'{m:g}']:g}" if by else "-" for m in MARGINS) + " |")
    return "\n".join(lines)


def summarize(runs: list[dict[str, Any]], contenders: Sequence[Contender], best: float, margin: float,
              trials: int, picks: dict[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """Per contender: best-after-N medians over seeds, trials to within the margin per seed, their median and
    its ratio to random's; the median trials to within each of MARGINS; the mean tuning curve per seed
    (`curve_mean`), its median, its ratio to random's, and on how many seeds it is below random's; with
    `picks` (re-measured latency by `pick_key`), each seed's pick re-measured, their median and its ratio to
    random's."""
    target = best * (1 + margin)
    worst = max((x for r in runs for x in r["curve"] if math.isfinite(x)), default=best)
    out: dict[str, dict[str, Any]] = {}
    for c in contenders:
        mine = sorted((r for r in runs if r["contender"] == c.label), key=lambda r: r["seed"])
        per_seed = [trials_to_within(r["curve"], target) for r in mine]
        means = {r["seed"]: curve_mean(r["curve"], worst) for r in mine}
        out[c.label] = {
            "strategy": c.strategy, "batch": c.batch, "features": c.features, "options": c.options,
            "transfer": list(c.transfer),
            "best_after": {str(n): statistics.median(best_after(r["curve"], n) for r in mine)
                           for n in checkpoints(trials)} if mine else {},
            "trials_to_margin": per_seed,
            "median_trials_to_margin": median_trials(per_seed, trials) if mine else None,
            "median_trials_by_margin": {
                f"{m:g}": median_trials([trials_to_within(r["curve"], best * (1 + m)) for r in mine], trials)
                for m in MARGINS} if mine else {},
            "curve_mean": means,
            "median_curve_mean": statistics.median(means.values()) if mine else None,
        }
        picked = [picks.get(pick_key(r["pick"])) if picks and r.get("pick") else None for r in mine]
        timed = [x for x in picked if x is not None]
        out[c.label].update(pick_s=picked, median_pick_s=statistics.median(timed) if timed else None)
    base = out.get("random", {})
    for s in out.values():
        t, b = s["median_trials_to_margin"], base.get("median_trials_to_margin")
        s["vs_random"] = t / b if b and t else None
        e, b = s["median_curve_mean"], base.get("median_curve_mean")
        s["curve_vs_random"] = e / b if b and e is not None else None
        paired = [(x, base["curve_mean"][seed]) for seed, x in s["curve_mean"].items()
                  if seed in base.get("curve_mean", {})]
        s["seeds_below_random"] = [sum(x < y for x, y in paired), len(paired)] if base else None
        p, b = s["median_pick_s"], base.get("median_pick_s")
        s["pick_vs_random"] = p / b if b and p is not None else None
    return out


# ---- output -------------------------------------------------------------------------------------------------
def _ms(x: float | None) -> str:
    return f"{x * 1e3:.3f}" if x is not None and math.isfinite(x) else "-"


def table(summary: dict[str, dict[str, Any]], trials: int, margin: float) -> str:
    cps = checkpoints(trials)
    head = ("| contender | " + " | ".join(f"@{n} ms" for n in cps)
            + f" | trials to within {margin:.1%} (per seed) | median | vs random |")
    lines = [head, "|" + "---|" * (len(cps) + 4)]
    for label, s in summary.items():
        seeds = ", ".join("never" if t is None else str(t) for t in s["trials_to_margin"])
        ratio = f"{s['vs_random']:.2f}" if s["vs_random"] is not None else "-"
        med = s["median_trials_to_margin"]
        lines.append(f"| {label} | " + " | ".join(_ms(s["best_after"].get(str(n))) for n in cps)
                     + f" | {seeds} | {'-' if med is None else f'{med:g}'} | {ratio} |")
    return "\n".join(lines)


def margin_free_table(summary: dict[str, dict[str, Any]]) -> str:
    """Median trials to within each of MARGINS, the mean tuning curve (median over seeds, its ratio to random's,
    and on how many seeds it is below random's on the same seed) and the picks re-measured (median, ratio)."""
    head = ("| contender | " + " | ".join(f"within {m:.0%}" for m in MARGINS)
            + " | mean curve ms | vs random | seeds below random | pick re-measured ms | vs random |")
    lines = [head, "|" + "---|" * (len(MARGINS) + 6)]

    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for label, s in summary.items():
        by = s["median_trials_by_margin"]
        below = s["seeds_below_random"]
        lines.append(f"| {label} | " + " | ".join(f"{by[f'{m:g}']:g}" if by else "-" for m in MARGINS)
                     + f" | {_ms(s['median_curve_mean'])} | {num(s['curve_vs_random'], '.3f')}"
                     + f" | {'-' if below is None or label == 'random' else f'{below[0]} of {below[1]}'}"
                     + f" | {_ms(s['median_pick_s'])} | {num(s['pick_vs_random'], '.2f')} |")
    return "\n".join(lines)


def _finite(x: Any) -> Any:
    """JSON has no infinity: a failed trial's latency is null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def plot(path: str | Path, runs: list[dict[str, Any]], contenders: Sequence[Contender], trials: int,
         target: float, title: str) -> None:
    """Median best-so-far per contender over seeds, a min-max band, and the within-margin line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in contenders:
        curves = [r["curve"] for r in runs if r["contender"] == c.label and r["curve"]]
        if not curves:
            continue
        n = max(len(x) for x in curves)
        a = np.array([list(x) + [x[-1]] * (n - len(x)) for x in curves], dtype=float) * 1e3
        a[~np.isfinite(a)] = np.nan
        x = np.arange(1, n + 1)
        with warnings.catch_warnings():  # all-nan columns (no correct trial yet) are gaps, not errors
            warnings.simplefilter("ignore", RuntimeWarning)
            med, lo, hi = np.nanmedian(a, 0), np.nanmin(a, 0), np.nanmax(a, 0)
        (line,) = ax.plot(x, med, label=f"{c.label} (median of {len(curves)})")
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    if math.isfinite(target):
        ax.axhline(target * 1e3, color="gray", linestyle="--", linewidth=1, label="best x (1 + margin)")
    ax.set_yscale("log")
    ax.set_xlim(1, max(trials, 2))
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("best latency so far (ms)")
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=8)  # a workload key is long
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
            _warn_once(f"{cache.path} holds records but no anchor scale ({self.path.name}): they were timed "
                       "plain or on another scale, and the new anchored ones will not compare with them")

    def save(self, nominal: dict[str, float]) -> None:
        if nominal:
            self.path.write_text(json.dumps(nominal, indent=1) + "\n", encoding="utf-8")


def anchor_scale(cache: str | None, timing: Timing) -> AnchorScale | None:
    return AnchorScale(Path(f"{cache}.anchor.json")) if cache and timing.anchor else None


def _timing(text: str) -> Timing:
    """`number=3,repeat=5,min_repeat_ms=50,anchor=1`: the runner's timing (default: the tuner's)."""
    fields: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in ("number", "repeat", "min_repeat_ms", "anchor") or \
                (key == "anchor" and value not in ("0", "1")):
            raise ValueError(f"--timing {text!r}: expected number=N,repeat=N,min_repeat_ms=MS,anchor=0|1")
        fields[key] = float(value) if key == "min_repeat_ms" else bool(int(value)) if key == "anchor" else int(value)
    return Timing(**fields)


# ---- main ---------------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True)
    p.add_argument("--shape", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seeds", type=int, required=True)
    p.add_argument("--trials", type=int, required=True)
    p.add_argument("--contenders", nargs="+", default=list(DEFAULT_CONTENDERS), metavar="SPEC",
                   help=contender_help())
    p.add_argument("--transfer", metavar="LOG", help="add xgb+transfer, warmed by LOG less this workload")
    p.add_argument("--cache", metavar="PATH", help="measurement cache (a log); a rerun replays from it")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--png", metavar="PATH")
    p.add_argument("--noise", type=int, default=10, metavar="K", help="time the default and the best config K times")
    p.add_argument("--margin", type=float, default=0.05)
    p.add_argument("--confirm", type=int, default=5, metavar="N",
                   help="re-measure the N configs logged fastest; the least median is the reference (0: the "
                        "best single measurement)")
    p.add_argument("--picks", type=int, default=5, metavar="K",
                   help="re-measure every run's pick K times, interleaved, at the end (0: don't)")
    p.add_argument("--drift", type=int, default=5, metavar="K",
                   help="re-measure K other configs near the best to put the reference in the runs' moment "
                        "(0: take the re-measured reference as it is)")
    p.add_argument("--rescore", type=int, default=0, metavar="K",
                   help="re-measure each run's --rescore-top fastest configs K times each, interleaved, and judge "
                        "every run also by those medians (0: don't; for a machine whose speed swings)")
    p.add_argument("--rescore-top", type=int, default=16, metavar="N",
                   help="--rescore re-measures each run's N fastest configs (by its own figures)")
    p.add_argument("--rescore-timing", default="", help="the timing of one rescoring measurement, as --timing "
                   "(default: --timing's)")
    p.add_argument("--timing", default="", help="number=N,repeat=N,min_repeat_ms=MS,anchor=0|1 (default: the "
                   "tuner's; anchor=1 times every candidate beside the default config, runtime.time_anchored)")
    a = p.parse_args(argv)
    try:
        if a.seeds < 1 or a.trials < 1 or min(a.noise, a.confirm, a.drift, a.picks, a.rescore) < 0 \
                or a.rescore_top < 1 or not 0 <= a.margin < 1:
            raise ValueError("--seeds and --trials must be >= 1, --noise, --confirm, --drift and --picks >= 0 and "
                             "--margin in [0, 1), --rescore >= 0 and --rescore-top >= 1")
        contenders = parse_contenders(a.contenders)
        if a.transfer and TRANSFER_LABEL in {c.label for c in contenders}:
            raise ValueError(f"the label {TRANSFER_LABEL} is --transfer's")
        if not a.transfer and any(c.transfer for c in contenders):
            raise ValueError("a contender asks for transfer=true, but no --transfer LOG is given")
        if a.transfer and not Path(a.transfer).exists():
            raise ValueError(f"transfer log {a.transfer} does not exist")
        timing = _timing(a.timing)
        rescore_timing = _timing(a.rescore_timing) if a.rescore_timing else timing
        task = make_task(a.op, a.device, shape=a.shape)
        require_local_device(task)
        check_contenders(contenders, task.space)
    except (ValueError, LookupError) as err:
        p.error(str(err))

    name = f"{task.op} {a.shape} on {task.device.name}"
    with tempfile.TemporaryDirectory(prefix="search-quality-") as tmp:
        transfer_info = None
        if a.transfer:
            contenders, transfer_info = warm_contenders(contenders, a.transfer, task, Path(tmp))
        scale = anchor_scale(a.cache, timing)
        runner = LocalRunner(timing, anchor_nominal=scale.load() if scale else None)
        cache = MeasurementCache(a.cache, Builder(), runner)
        if scale:
            scale.check(cache)
        runs: list[dict[str, Any]] = []
        try:
            for seed in range(a.seeds):  # seed-major: drift of the machine hits every contender alike
                for c in contenders:
                    log = Path(tmp) / f"{c.label}-{seed}.jsonl"
                    run = _run(task, c, seed, a.trials, log, cache)
                    runs.append(run)
                    print(f"seed {seed} {c.label:14s} best {_ms(run['curve'][-1] if run['curve'] else None)} ms, "
                          f"{run['measured_new']} new measurements, {run['wall_s']:.0f} s", flush=True)
            mine = [r for r in cache.records_for(task) if r.ok]
            if not mine:
                raise SystemExit(f"{name}: no correct config measured")
            top = min(mine, key=lambda r: r.latency)
            best = top.latency
            noise: dict[str, Any] = {}
            if a.noise:
                default = task.space.default()
                for which, cfg in (("default", default), ("best", task.space.from_json(top.config))):
                    lat, err = remeasure(task, cache.inner_builder, cache.inner_runner, cfg, a.noise)
                    noise[which] = {"config": cfg.to_json(), "latencies": lat, "error": err, **spread(lat)}
            confirmed = confirm(task, cache, mine, a.confirm, max(a.noise, 5), noise.get("best"), a.drift)
            picks = remeasure_picks(task, cache, runs, a.picks) if a.picks else None
            ranks = run_fastest(runs, a.rescore_top) if a.rescore else {}
            raw = {r.config_key: r.config for r in mine}
            rescored_lat = rescore(task, cache, {key: raw[key] for key in ranks}, a.rescore, rescore_timing) \
                if a.rescore else {}
        finally:
            if scale:
                scale.save(runner.anchor_nominal)
            cache.close()

    # The interquartile spread is how far a typical re-measurement of one config moves; the full range is set
    # by the one run the machine descheduled, and would make every margin meaningless on a shared machine.
    best_iqr = noise.get("best", {}).get("iqr_rel", math.nan)
    if math.isfinite(best_iqr) and best_iqr > a.margin:
        margin, why = best_iqr, (f"the best config's interquartile spread over {a.noise} measurements "
                                 f"(IQR/median) exceeds the requested {a.margin:.1%}")
    else:
        margin = a.margin
        why = ("requested" + (f"; the best config's interquartile spread over {a.noise} measurements is "
                              f"{best_iqr:.1%}" if math.isfinite(best_iqr) else "; noise not measured"))
    reference = confirmed["latency_s"] if confirmed["latency_s"] is not None else best
    summary = summarize(runs, contenders, reference, margin, a.trials, picks)

    print(f"\n{name}: {a.seeds} seeds x {a.trials} trials, fresh logs; best {_ms(best)} ms ({top.config})")
    if confirmed["latency_s"] is not None:
        print(f"reference: {_ms(reference)} ms, the least median of {confirmed['k']} re-measurements of the "
              f"{confirmed['configs']} configs logged fastest ({confirmed['config']}, logged "
              f"{_ms(confirmed['logged_s'])} ms)" + (
                  f", {_ms(confirmed['remeasured_s'])} ms re-measured / {confirmed['drift']:.3f}: the machine's "
                  f"drift since the runs, the median ratio re-measured / logged of {confirmed['drift_configs']} "
                  f"other configs within 2x of the best" if confirmed["drift_configs"] else ""))
    for which, s in noise.items():
        print(f"noise, {which} config: median {_ms(s['median_s'])} ms, (max-min)/median {s['range_rel']:.1%}, "
              f"IQR/median {s['iqr_rel']:.1%} over {s['n']} measurements" + (f"; {s['error']}" if s["error"] else ""))
    d = noise.get("default", {}).get("median_s", math.nan)
    if math.isfinite(d) and d < best:
        print(f"note: the default config timed {_ms(d)} ms, faster than the best the runs measured")
    print(f"margin {margin:.1%}: {why}")
    print(f"cache: {cache.misses} measured, {cache.hits} answered from the cache"
          + (f" ({a.cache})" if a.cache else ""))
    print(table(summary, a.trials, margin))
    print(f"\nmargin-free (a seed that never gets within a margin counts as {2 * a.trials} trials)"
          + (f"; each run's pick re-measured {a.picks}x, interleaved, median over seeds:" if picks else ":"))
    print(margin_free_table(summary))

    rescored: dict[str, Any] | None = None
    if rescored_lat:
        medians = {k: statistics.median(v) for k, v in rescored_lat.items()}
        half = split_half(rescored_lat)
        r_margin = max(a.margin, half) if math.isfinite(half) else a.margin
        best_key = min(medians, key=medians.get)
        within = sorted(ranks[k] for k, v in medians.items() if v <= medians[best_key] * (1 + r_margin))
        rescored = {"k": a.rescore, "top": a.rescore_top, "configs": len(medians), "best_s": medians[best_key],
                    "best_config_key": best_key, "split_half": half, "margin": r_margin,
                    "run_ranks_within_margin": within,
                    "contenders": summarize_rescored(runs, contenders, medians, r_margin, a.trials),
                    "medians": medians}
        print(f"\nrescored: each run's {a.rescore_top} fastest configs by its own figures, {len(medians)} in all, "
              f"each re-measured {a.rescore}x in interleaved rounds; best median {_ms(medians[best_key])} ms "
              f"({best_key}); " + (f"two halves of the rounds disagree by {half:.1%} (median over configs)"
                                    if math.isfinite(half) else "too few rounds (< 4) to tell their noise")
              + f", so the margin is {r_margin:.1%}. {len(within)} configs are within it; the best rank a run "
              f"gave each: {', '.join(map(str, within))}" + (
                  " (some near the cut: a wider --rescore-top may find more)"
                  if within and within[-1] > 0.75 * a.rescore_top else "")
              + ". A run is within the margin once it has measured a config whose rescored median is:")
        print(rescored_table(rescored["contenders"], r_margin))

    out = {"op": task.op, "shape": a.shape, "device": task.device.name, "workload_key": task.workload_key,
           "seeds": a.seeds, "trials": a.trials, "checkpoints": checkpoints(a.trials),
           "best": {"latency_s": best, "config": top.config}, "reference": confirmed,
           "margin": {"requested": a.margin, "used": margin, "why": why}, "noise": noise,
           "cache": {"path": a.cache, "measured": cache.misses, "hits": cache.hits},
           "transfer": transfer_info, "picks": picks, "contenders": summary, "rescored": rescored, "runs": runs}
    if a.json:
        Path(a.json).write_text(json.dumps(_finite(out), indent=1) + "\n", encoding="utf-8")
    if a.png:
        plot(a.png, runs, contenders, a.trials, reference * (1 + margin),
             f"{name}: median and min-max over {a.seeds} seeds")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
