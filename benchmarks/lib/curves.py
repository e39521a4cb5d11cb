"""A tuning run's figures: its curve (best latency after each trial) and what is read off it."""

from __future__ import annotations

import math
import statistics
from typing import Sequence

CHECKPOINTS = (8, 16, 32, 64)
MARGINS = (0.02, 0.05, 0.10, 0.20)  # trials to within each, beside the requested margin: no one line decides


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
