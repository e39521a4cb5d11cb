"""Runs summed up per contender (best after N trials, trials to within a margin, the mean curve, the picks), and
printed: markdown tables, JSON without infinities, a plot of the tuning curves."""

from __future__ import annotations

import math
import statistics
import textwrap
import warnings
from pathlib import Path
from typing import Any, Sequence

from benchmarks.lib.contenders import Contender
from benchmarks.lib.curves import (MARGINS, best_after, best_so_far, checkpoints, curve_mean, median_trials,
                                   trials_to_within)
from benchmarks.lib.remeasure import pick_key


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
def ms(x: float | None) -> str:
    return f"{x * 1e3:.3f}" if x is not None and math.isfinite(x) else "-"


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table, to paste into benchmarks/*.md as printed."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _per_seed(s: dict[str, Any]) -> str:
    return ", ".join("never" if t is None else str(t) for t in s["trials_to_margin"])


def _by_margin(s: dict[str, Any]) -> list[str]:
    by = s["median_trials_by_margin"]
    return [f"{by[f'{m:g}']:g}" if by else "-" for m in MARGINS]


def table(summary: dict[str, dict[str, Any]], trials: int, margin: float) -> str:
    cps = checkpoints(trials)
    head = ["contender", *(f"@{n} ms" for n in cps), f"trials to within {margin:.1%} (per seed)", "median",
            "vs random"]
    return markdown_table(head, [[label, *(ms(s["best_after"].get(str(n))) for n in cps), _per_seed(s),
                                  _num(s["median_trials_to_margin"], "g"), _num(s["vs_random"], ".2f")]
                                 for label, s in summary.items()])


def margin_free_table(summary: dict[str, dict[str, Any]]) -> str:
    """Median trials to within each of MARGINS, the mean tuning curve (median over seeds, its ratio to random's,
    and on how many seeds it is below random's on the same seed) and the picks re-measured (median, ratio)."""
    head = ["contender", *(f"within {m:.0%}" for m in MARGINS), "mean curve ms", "vs random", "seeds below random",
            "pick re-measured ms", "vs random"]
    rows = []
    for label, s in summary.items():
        below = s["seeds_below_random"]
        rows.append([label, *_by_margin(s), ms(s["median_curve_mean"]), _num(s["curve_vs_random"], ".3f"),
                     "-" if below is None or label == "random" else f"{below[0]} of {below[1]}",
                     ms(s["median_pick_s"]), _num(s["pick_vs_random"], ".2f")])
    return markdown_table(head, rows)


def rescored_table(summary: dict[str, dict[str, Any]], margin: float) -> str:
    head = ["contender", f"trials to within {margin:.1%} (per seed)", "median", "vs random",
            *(f"within {m:.0%}" for m in MARGINS)]
    return markdown_table(head, [[label, _per_seed(s), _num(s["median_trials_to_margin"], "g"),
                                  _num(s["vs_random"], ".2f"), *_by_margin(s)] for label, s in summary.items()])


def finite(x: Any) -> Any:
    """JSON has no infinity: a failed trial's latency is null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
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

