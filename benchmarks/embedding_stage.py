"""The embedding stage's figures in one run: per shape, tune the kernel, then `autotune bench` it several times and
print the medians side by side with PyTorch, FBGEMM's TBE at the same precision and the gather roof.

The shapes are the ones the embedding-stage work is judged on (fp32 uniform, one-hot, wide rows and the Zipf
make-tune shape; int8 and fp16 rows; the 26 Criteo tables, capped at 200,000 rows, as one table-batched call).
Each bench times fresh input sets, its rounds interleaving the contenders, PyTorch in a child process without
TVM (`autotune.bench`); a column's figure is the median over the benches, a ratio the median of the benches'
ratios. Run it alone on the machine (2 cores: any other busy process moves every figure):
    python -m benchmarks.embedding_stage --log-dir /tmp/stage [--trials 32] [--benches 3] [--only zipf,one_hot]
Logs accumulate in --log-dir (a rerun tunes --trials more; --trials 0 benches them as they are); `--json F` writes
every bench's figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.lib.example import dlrm
from benchmarks.lib.summary import markdown_table


@dataclass(frozen=True)
class Shape:
    """One benched shape: the op, its `--shape`, the ratios it is held to (a PyTorch path or FBGEMM's TBE, and
    how many times as fast the kernel must be), trials to tune (a share of --trials: the batched op's configs
    build slower) and PyTorch's fp32 path the table shows (the batched op's: per-table calls and a cat, as DLRM
    does)."""

    op: str
    shape: str
    targets: tuple[tuple[str, float], ...] = (("torch", 1.1),)
    trials_scale: float = 1.0
    torch: str = "torch"

    @property
    def dtype(self) -> str:
        fields = dict(f.split("=", 1) for f in self.shape.split(",") if "=" in f)
        return fields.get("dtype", "float32")


# examples/dlrm.py's 26 tables, capped as its model caps them, one-hot
CRITEO = "rows=" + "+".join(str(min(r, 200_000)) for r in dlrm().CRITEO_KAGGLE_ROWS) + ",dim=64,batch=2048,pooling=1"
SHAPES: dict[str, Shape] = {
    "uniform": Shape("embedding_bag", "rows=1000000,dim=64,batch=2048,pooling=32"),
    "one_hot": Shape("embedding_bag", "rows=200000,dim=64,batch=2048,pooling=1"),
    "wide": Shape("embedding_bag", "rows=1000000,dim=128,batch=2048,pooling=20-80"),
    "zipf": Shape("embedding_bag", "rows=1000000,dim=64,batch=2048,pooling=20-80,dist=zipf:1.05"),
    "uniform_int8": Shape("embedding_bag", "rows=1000000,dim=64,batch=2048,pooling=32,dtype=int8",
                          (("torch", 2.0),)),
    "uniform_fp16": Shape("embedding_bag", "rows=1000000,dim=64,batch=2048,pooling=32,dtype=float16",
                          (("torch", 1.5),)),
    "criteo": Shape("batched_embedding_bag", CRITEO, (("torch_per_table", 1.1), ("fbgemm_tbe_float32", 1.1)),
                    0.75, "torch_per_table"),
    "criteo_int8": Shape("batched_embedding_bag", CRITEO + ",dtype=int8", (("fbgemm_tbe_int8", 1.2),), 0.75,
                         "torch_per_table"),
}


def bench_shape(s: Shape, log: Path, trials: int, benches: int) -> list[dict[str, Any]]:
    """Tune `s` into `log` (`trials` more, scaled by the shape's share; 0: bench what `log` holds), then bench it
    `benches` times: each bench's JSON."""
    from autotune.bench import bench
    from autotune.task import make_task
    from autotune.tuner import tune

    task = make_task(s.op, "cpu", shape=s.shape)
    if trials > 0:
        tune(task, trials=max(1, round(trials * s.trials_scale)), log=log, progress=False)
    return [bench(task, [log]).to_json() for _ in range(benches)]


def median_ratio(runs: list[dict[str, Any]], path: str) -> float | None:
    """The median over the benches of (`path`'s isolated time / the tuned kernel's); None where a bench lacks
    the path (FBGEMM not installed)."""
    if not all(path in r["baselines_isolated"] for r in runs):
        return None
    return statistics.median(r["baselines_isolated"][path] / r["tuned_s"] for r in runs)


def summary_row(name: str, s: Shape, runs: list[dict[str, Any]]) -> list[str]:
    """The table's row: the benches' tuned times, medians of the contenders' and of the ratios, each target
    met or not, the roof shares' range."""
    def ms(path: str) -> str:
        vals = [r["baselines_isolated"][path] for r in runs if path in r["baselines_isolated"]]
        return f"{statistics.median(vals) * 1e3:.3f}" if vals else "-"

    def judged(path: str, target: float) -> str:
        ratio = median_ratio(runs, path)
        return (f"{path}: not timed (fbgemm-gpu-cpu not installed?)" if ratio is None
                else f"{path} {ratio:.2f}x (>= {target:g}: {'yes' if ratio >= target else 'no'})")

    shares = [r["roofline"]["share"] for r in runs if r.get("roofline")]
    return [name, f"`{s.shape}`" if len(s.shape) < 90 else f"`{s.shape[:36]}...,{s.shape.split(',', 1)[1]}`",
            " ".join(f"{r['tuned_s'] * 1e3:.3f}" for r in runs), ms(s.torch), ms(f"fbgemm_tbe_{s.dtype}"),
            "; ".join(judged(path, target) for path, target in s.targets),
            f"{min(shares):.0%}-{max(shares):.0%}" if shares else "-"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log-dir", required=True, help="where the tuning logs go (one per op; reruns resume)")
    p.add_argument("--trials", type=int, default=32,
                   help="trials per embedding_bag shape (batched: 3/4 of it); 0: bench the logs as they are")
    p.add_argument("--benches", type=int, default=3, help="`autotune bench` runs per shape (medians reported)")
    p.add_argument("--only", default=",".join(SHAPES), help=f"comma-separated shapes of {', '.join(SHAPES)}")
    p.add_argument("--json", help="write every bench's figures here")
    args = p.parse_args(argv)
    if args.trials < 0 or args.benches < 1:
        p.error(f"--trials must be >= 0 and --benches >= 1, got {args.trials} and {args.benches}")
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SHAPES]
    if unknown:
        p.error(f"unknown shape(s) {unknown}; choose from {', '.join(SHAPES)}")
    logs = Path(args.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    rows, everything = [], {}
    for name in names:
        s = SHAPES[name]
        runs = bench_shape(s, logs / f"{s.op}.jsonl", args.trials, args.benches)
        everything[name] = {"op": s.op, "shape": s.shape, "benches": runs}
        rows.append(summary_row(name, s, runs))
        print(" | ".join(rows[-1]), flush=True)
    print(markdown_table(["shape", "--shape", "tuned ms (each bench)", "PyTorch fp32 ms (median)",
                          "FBGEMM TBE ms, same precision (median)", "x contender (median of benches)",
                          "roof share (benches)"], rows))
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=1))


if __name__ == "__main__":
    main()
