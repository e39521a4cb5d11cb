"""Search strategies compared offline, over many seeds, on a surrogate of one task's measured latencies.

    python -m benchmarks.search_sim --op embedding_bag --shape rows=1000000,dim=64,batch=2048,pooling=32 \
        --cache CACHE.jsonl --seeds 40 --trials 64 [--contenders xgb=xgb random=random b8=xgb:batch=8] \
        [--margins 0.05 0.1] [--noise 0.03] [--ridge 30] [--transfer LOG] [--json out.json]

search_quality.py measures: five seeds of three contenders take an hour on a 2-core VM, and five seeds cannot
tell a 20% gain from luck. This fits a surrogate to the measurements a benchmark cache (or any log) already
holds for the task: ridge regression of log latency on one-hot knob values and their pairwise products, so that
no tree model (the kind being compared) shapes the landscape. It predicts every config of the space and runs
`tune` against those predictions, through a builder and a runner that only look them up (times lognormal noise
of `--noise`). Forty seeds of a contender take a minute or two (a warm one longer: a pooled model refits on
every transferred record). Contenders use knob features (program features need each candidate lowered).
`--transfer LOG` warms the `transfer=true` contenders and an added `xgb+transfer` by LOG's real records of other
shapes (less the task's own workload), as search_quality.py does: the warm model learns real measurements, the
run meets the surrogate. Trials to within a margin are judged against the surrogate's best, as
search_quality.py judges them (a seed that never gets there counts twice the budget).

What it can say: how a strategy behaves on a landscape shaped like the measured one, over enough seeds to tell.
What it cannot: how fast the machine is. A change it favours is then confirmed by search_quality.py.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from autotune import records
from autotune.build import Built
from autotune.measure import Measured
from autotune.task import Task, make_task
from autotune.tuner import tune
from benchmarks.lib.contenders import (DEFAULT_CONTENDERS, Contender, check_contenders, contender_help,
                                       parse_contenders, tune_kwargs, warm_contenders)
from benchmarks.lib.curves import best_so_far, median_trials, trials_to_within
from cost_model.features import AUTO, uses_program
from search_spaces import Config, InvalidConfig


def _design(space: Any, cfgs: Sequence[Config]) -> np.ndarray:
    """One-hot knob values and their pairwise products: every main effect and every two-knob interaction."""
    column = {(k.name, v): i for i, (k, v) in enumerate((k, v) for k in space.knobs for v in k.options)}
    x = np.zeros((len(cfgs), len(column)), dtype=np.float64)
    for r, cfg in enumerate(cfgs):
        for name, value in cfg.items:
            x[r, column[(name, value)]] = 1.0
    i, j = np.triu_indices(x.shape[1], 1)
    return np.concatenate([x, x[:, i] * x[:, j]], axis=1)


def _ridge(x: np.ndarray, y: np.ndarray, lam: float) -> tuple[np.ndarray, float]:
    mean = float(y.mean())
    w = np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ (y - mean))
    return w, mean


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def fit_surrogate(task: Task, recs: Sequence[records.Record], ridge: float = 30.0,
                  folds: int = 5) -> tuple[dict[Config, float], dict[str, Any]]:
    """Latency of every config of `task`'s space, predicted from `recs` (the task's successful records, any
    template version whose configs still parse), and how well it follows them: the rank correlation of
    held-out predictions with the measurements over `folds` folds."""
    space = task.space
    cfgs, lat = [], []
    for r in recs:
        if r.ok and r.op == task.op and r.workload_key == task.workload_key and r.device == task.device.name:
            try:
                cfgs.append(space.from_json(r.config))
            except InvalidConfig:
                continue
            lat.append(r.latency)
    if len(cfgs) < 2 * folds:
        raise ValueError(f"{len(cfgs)} usable records of {task.op} {task.workload_key} on {task.device.name}: "
                         f"too few to fit a surrogate (at least {2 * folds})")
    x, y = _design(space, cfgs), np.log(lat)
    used = x.any(axis=0)  # columns no record has say nothing: the ridge keeps their weight at 0 anyway
    x = x[:, used]
    held_out = np.zeros(len(y))
    order = np.random.default_rng(0).permutation(len(y))
    for f in range(folds):
        test = order[f::folds]
        train = np.setdiff1d(order, test)
        w, mean = _ridge(x[train], y[train], ridge)
        held_out[test] = x[test] @ w + mean
    w, mean = _ridge(x, y, ridge)
    every = list(space)
    predicted = np.exp(_design(space, every)[:, used] @ w + mean)
    truth = dict(zip(every, predicted.tolist()))
    stats = {"records": len(cfgs), "space": len(every), "ridge": ridge,
             "held_out_rank_correlation": _rank_correlation(held_out, y)}
    return truth, stats


class SurrogateBuilder:
    """A builder that builds nothing: the runner looks each config up."""

    def build(self, task: Task, cfgs: Sequence[Config]) -> list[Built]:
        return [Built(config=c, lib="<surrogate>", build_s=0.0) for c in cfgs]

    def close(self) -> None:
        pass


class SurrogateRunner:
    """Measures a config as its surrogate latency times exp(N(0, noise)): one draw per trial, as one figure."""

    def __init__(self, truth: dict[Config, float], noise: float, seed: int):
        self.truth, self.noise, self.rng = truth, noise, random.Random(seed)

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]:
        return [Measured(b, costs=(self.truth[b.config] * math.exp(self.rng.gauss(0.0, self.noise)),))
                for b in built]

    def close(self) -> None:
        pass


def simulate(task: Task, truth: dict[Config, float], c: Contender, seed: int, trials: int,
             noise: float) -> list[float]:
    """One run of contender `c` on the surrogate: the true latency of each config it measured, in order.
    `c.transfer`: the logs warming its model (real records; contenders.WARM until main names them)."""
    if any(not Path(log).exists() for log in c.transfer):
        raise ValueError(f"contender {c.label}: transfer=true needs --transfer LOG")
    features = c.features if c.features not in (None, AUTO) else "knobs"
    if uses_program(features):
        raise ValueError(f"contender {c.label}: program features need lowered candidates; use features=knobs")
    with tempfile.TemporaryDirectory() as tmp:
        result = tune(task, trials, Path(tmp) / "sim.jsonl", strategy=c.strategy, seed=seed, confirm=0,
                      progress=False, builder=SurrogateBuilder(), runner=SurrogateRunner(truth, noise, seed + 1000),
                      **{**tune_kwargs(c), "features": features})
    return [truth[task.space.from_json(r.config)] for r in result.trials]


def judge(latencies: Sequence[float], best: float, margin: float) -> int | None:
    """The first trial within `margin` of the surrogate's best, or None."""
    return trials_to_within(best_so_far(latencies), best * (1 + margin))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True)
    p.add_argument("--shape", required=True)
    p.add_argument("--device", default="cpu", help="the device the cache's records were measured on")
    p.add_argument("--cache", required=True, nargs="+", metavar="LOG", help="logs holding the task's records")
    p.add_argument("--seeds", type=int, default=40)
    p.add_argument("--trials", type=int, default=64)
    p.add_argument("--contenders", nargs="+", default=list(DEFAULT_CONTENDERS), metavar="SPEC",
                   help=contender_help())
    p.add_argument("--margins", type=float, nargs="+", default=[0.05, 0.10])
    p.add_argument("--noise", type=float, default=0.03, help="sigma of a measurement's log (0.03: about 4%% IQR)")
    p.add_argument("--ridge", type=float, default=30.0)
    p.add_argument("--transfer", metavar="LOG", help="add xgb+transfer, warmed by LOG less this workload")
    p.add_argument("--json", metavar="PATH")
    a = p.parse_args(argv)
    if a.seeds < 1 or a.trials < 1:
        p.error("--seeds and --trials must be >= 1")
    try:
        contenders = parse_contenders(a.contenders)
    except ValueError as err:
        p.error(str(err))
    if not a.transfer and any(c.transfer for c in contenders):
        p.error("a contender asks for transfer=true, but no --transfer LOG is given")
    if a.transfer and not Path(a.transfer).exists():
        p.error(f"transfer log {a.transfer} does not exist")
    task = make_task(a.op, a.device, shape=a.shape)
    try:
        check_contenders(contenders, task.space)
    except ValueError as err:
        p.error(str(err))
    with tempfile.TemporaryDirectory(prefix="search-sim-") as tmp:  # the filtered transfer log
        if a.transfer:
            contenders, _ = warm_contenders(contenders, a.transfer, task, Path(tmp))
        recs = [r for path in a.cache for r in records.load(path)]
        truth, stats = fit_surrogate(task, recs, a.ridge)
        best = min(truth.values())
        print(f"{task.op} {a.shape} on {task.device.name}: surrogate of {stats['records']} records over "
              f"{stats['space']} configs, held-out rank correlation {stats['held_out_rank_correlation']:.2f}, "
              f"best {best * 1e3:.3f} ms")
        stats["within"] = {str(m): sum(v <= best * (1 + m) for v in truth.values()) for m in a.margins}
        for m in a.margins:
            k = stats["within"][str(m)]  # random's median trials to one of k in n: about ln 2 * n / k
            print(f"  within {m:.0%} of the best: {k} configs ({k / len(truth):.2%}), random's median about "
                  f"{math.log(2) * len(truth) / k:.0f} trials")
        out: dict[str, Any] = {"op": task.op, "shape": a.shape, "device": task.device.name, "seeds": a.seeds,
                               "trials": a.trials, "noise": a.noise, "transfer": a.transfer, "surrogate": stats,
                               "contenders": {}}
        for c in contenders:
            t0 = time.perf_counter()
            runs = [simulate(task, truth, c, seed, a.trials, a.noise) for seed in range(a.seeds)]
            row: dict[str, Any] = {"wall_s": time.perf_counter() - t0}
            for m in a.margins:
                per_seed = [judge(r, best, m) for r in runs]
                counted = [2 * a.trials if t is None else t for t in per_seed]
                row[str(m)] = {"trials_to_margin": per_seed, "median": median_trials(per_seed, a.trials),
                               "mean": statistics.mean(counted)}
            out["contenders"][c.label] = row
            cells = "   ".join(f"{m:.0%}: median {row[str(m)]['median']:5.1f} mean {row[str(m)]['mean']:5.1f}"
                               for m in a.margins)
            print(f"{c.label:>16}  {cells}   ({row['wall_s']:.0f} s)", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
