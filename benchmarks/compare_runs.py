"""Are the models of two `make tune` runs equally fast? examples/dlrm.py's model through `tune_model` from each
run's log directory (its tasks resumed, so nothing is tuned again), every model timed in one process, interleaved
on fresh batches: runs made at different hours meet the VM in different phases, so their own tables' x eager
figures cannot be compared to a few percent.

Each run's int8 and fp32-exact models are built from its log directory (`--run NAME=DIR`); a run whose tasks the
shipped records served (a covered clone's) is named in `--shipped`, the others are built without shipped records
(whatever `logs/cpu/` holds here). tune_model decides again here, on the same example and held-out batches for
every run, so the comparison is of the kernels each run found. Prints each model's ms per batch, its x eager and
its ratio to the first run's. Usage (a quiet machine):

    python -m benchmarks.compare_runs --run unbounded=/tmp/unbounded --run budget=CLONE/logs/local/dlrm \\
        --run covered=CLONE2/logs/local/dlrm --shipped covered [--pooling 1 8]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch

from benchmarks.lib import example


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="append", required=True, metavar="NAME=DIR",
                   help="a run's log directory (examples/dlrm.py's --log-dir); the first is the reference")
    p.add_argument("--shipped", nargs="*", default=[], metavar="NAME",
                   help="runs whose tasks the shipped records (logs/cpu/) served")
    p.add_argument("--pooling", type=int, nargs="+", default=[1, 8], help="indices per bag")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--fresh", type=int, default=8, help="fresh batches timed in a cycle")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=1.0, help="per model per round")
    args = p.parse_args(argv)
    runs: dict[str, Path] = {}
    for spec in args.run:
        name, sep, folder = spec.partition("=")
        if not sep or not name or not folder:
            p.error(f"--run takes NAME=DIR, got {spec!r}")
        if not Path(folder).is_dir():
            p.error(f"--run {name}: {folder} is not a directory")
        runs[name] = Path(folder)
    unknown = set(args.shipped) - set(runs)
    if unknown:
        p.error(f"--shipped names no --run: {', '.join(sorted(unknown))}")
    args.runs = runs
    return args


def built(model: torch.nn.Module, example_batch: Any, held_out: list[Any], log_dir: Path, quantize: bool,
          shipped: bool) -> tuple[torch.nn.Module, str]:
    """tune_model's model from a copy of `log_dir` (the call writes its package there; 1 trial a task: a task the
    run left with records is not tuned), and the report's first line."""
    import autotune.torch as at

    with tempfile.TemporaryDirectory(prefix="compare-runs-") as tmp:
        copy = Path(tmp) / "logs"
        shutil.copytree(log_dir, copy, ignore=shutil.ignore_patterns("package", "summary.md"))
        opt, report = at.tune_model(model, example_batch, log_dir=copy, trials=1, quantize=quantize,
                                    check_inputs=held_out, shipped=shipped, progress=False, bench_rounds=0)
        return opt, str(report).splitlines()[0]  # the package stays loaded in this process


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    dlrm = example.dlrm()
    torch.manual_seed(0)
    model = dlrm.DLRM(tuple(min(r, 200_000) for r in dlrm.CRITEO_KAGGLE_ROWS)).eval()
    reference = next(iter(args.runs))
    for pooling in args.pooling:
        draw = lambda seed: dlrm.make_batch(model, args.batch, (pooling, pooling), seed)  # noqa: E731
        first, held_out = draw(0), [draw(1), draw(2)]  # as examples/dlrm.py draws them
        fresh = [draw(100 + i) for i in range(args.fresh)]
        models: dict[str, Any] = {"eager": model}
        for name, folder in args.runs.items():
            for quantize in (True, False):
                key = f"{name} {'int8' if quantize else 'fp32-exact'}"
                models[key], line = built(model, first, held_out, folder, quantize, name in args.shipped)
                print(f"{pooling} per bag, {key}: {line}", flush=True)
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            times = dlrm.interleaved({n: dlrm.cycled(m, fresh) for n, m in models.items()}, args.rounds,
                                     args.seconds)
        print(f"\n{pooling} per bag: a cycle of {args.fresh} fresh batches, medians of {args.rounds} interleaved "
              f"rounds")
        print("| model | ms | x eager | x the reference's time |\n|---|---|---|---|")
        for name, t in times.items():
            kind = name.split(" ", 1)[1] if " " in name else ""
            ref = times.get(f"{reference} {kind}") if kind else None
            print(f"| {name} | {t * 1e3:.2f} | {times['eager'] / t:.2f} | "
                  f"{f'{t / ref:.3f}' if ref else ''} |")


if __name__ == "__main__":
    main()
