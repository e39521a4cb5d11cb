"""Does the cost model earn its place? Tuning curves of xgb, random and variants from fresh logs, over seeds.

    python -m benchmarks.search_quality --op qmatmul --shape m=2048,k=512,n=256 --seeds 5 --trials 64 \
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
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from autotune import records
from autotune.build import Builder
from autotune.measure import LocalRunner, require_local_device
from autotune.measure.cache import MeasurementCache
from autotune.task import Task, make_task
from autotune.tuner import tune
from autotune.tuning_log import TuningLog
from benchmarks.lib.contenders import (DEFAULT_CONTENDERS, TRANSFER_LABEL, Contender, check_contenders,
                                       contender_help, parse_contenders, tune_kwargs, warm_contenders)
from benchmarks.lib.curves import best_so_far, checkpoints, spread
from benchmarks.lib.remeasure import (anchor_scale, confirm, parse_timing, remeasure, remeasure_picks, rescore,
                                      run_fastest, split_half)
from benchmarks.lib.summary import (finite, margin_free_table, ms, plot, rescored_table, summarize,
                                    summarize_rescored, table)


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
        timing = parse_timing(a.timing)
        rescore_timing = parse_timing(a.rescore_timing) if a.rescore_timing else timing
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
                    print(f"seed {seed} {c.label:14s} best {ms(run['curve'][-1] if run['curve'] else None)} ms, "
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

    print(f"\n{name}: {a.seeds} seeds x {a.trials} trials, fresh logs; best {ms(best)} ms ({top.config})")
    if confirmed["latency_s"] is not None:
        print(f"reference: {ms(reference)} ms, the least median of {confirmed['k']} re-measurements of the "
              f"{confirmed['configs']} configs logged fastest ({confirmed['config']}, logged "
              f"{ms(confirmed['logged_s'])} ms)" + (
                  f", {ms(confirmed['remeasured_s'])} ms re-measured / {confirmed['drift']:.3f}: the machine's "
                  f"drift since the runs, the median ratio re-measured / logged of {confirmed['drift_configs']} "
                  f"other configs within 2x of the best" if confirmed["drift_configs"] else ""))
    for which, s in noise.items():
        print(f"noise, {which} config: median {ms(s['median_s'])} ms, (max-min)/median {s['range_rel']:.1%}, "
              f"IQR/median {s['iqr_rel']:.1%} over {s['n']} measurements" + (f"; {s['error']}" if s["error"] else ""))
    d = noise.get("default", {}).get("median_s", math.nan)
    if math.isfinite(d) and d < best:
        print(f"note: the default config timed {ms(d)} ms, faster than the best the runs measured")
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
              f"each re-measured {a.rescore}x in interleaved rounds; best median {ms(medians[best_key])} ms "
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
        Path(a.json).write_text(json.dumps(finite(out), indent=1) + "\n", encoding="utf-8")
    if a.png:
        plot(a.png, runs, contenders, a.trials, reference * (1 + margin),
             f"{name}: median and min-max over {a.seeds} seeds")
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
