"""Does smoothing the int8 layers pay? examples/dlrm.py's model through `tune_model(quantize=True)` twice in one
process: as it ships (SmoothQuant where it cuts a layer's error: `search_spaces.qmatmul.graph`) and with
smoothing off, each held to the default accuracy contract on the same held-out batches.

Prints, per variant, the layers the contract moved to a finer precision and the held-out error, then the
latency over a cycle of fresh batches (contenders interleaved, medians of rounds) with the ratio of the two.
Tuning resumes from `--log-dir` (both variants run the same kernels: smoothing changes weights, not shapes).
Usage (a quiet machine):
    python -m benchmarks.smoothing --pooling 8 --log-dir logs/local/dlrm
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

import torch

import search_spaces.qmatmul.graph as qgraph
from benchmarks.lib import example


def tuned(model: torch.nn.Module, batch: Any, held_out: list[Any], args: argparse.Namespace,
          smoothing: bool) -> tuple[Any, str]:
    """tune_model's int8 model with smoothing on or off, and what its contract made finer."""
    import autotune.torch as at

    default = qgraph.SMOOTH_GAIN
    qgraph.SMOOTH_GAIN = default if smoothing else 0.0  # 0: no layer is ever smoothed
    try:
        opt, report = at.tune_model(model, batch, log_dir=args.log_dir, trials=args.trials, quantize=True,
                                    check_inputs=held_out, timing_batches=args.fresh, progress=False)
    finally:
        qgraph.SMOOTH_GAIN = default
    layers = report.accuracy.layers if report.accuracy else []
    smoothed = sum(layer.what.endswith("smoothed)") for layer in layers)
    finer = ", ".join(f"{layer.where.split(',')[0]} {layer.precision}" for layer in layers
                      if layer.precision != "int8") or "none"
    return opt, f"{smoothed} layers smoothed; finer than int8: {finer}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pooling", type=int, default=8, help="indices per bag (default 8)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--trials", type=int, default=8, help="per task, resumed from --log-dir")
    p.add_argument("--log-dir", type=Path, default=Path("logs/local/dlrm"))
    p.add_argument("--fresh", type=int, default=8, help="fresh batches timed in a cycle")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=1.0, help="per contender per round")
    args = p.parse_args(argv)
    dlrm = example.dlrm()
    torch.manual_seed(0)
    model = dlrm.DLRM(tuple(min(r, 200_000) for r in dlrm.CRITEO_KAGGLE_ROWS)).eval()
    draw = lambda seed: dlrm.make_batch(model, args.batch, (args.pooling, args.pooling), seed)  # noqa: E731
    first, held_out = draw(0), [draw(1), draw(2)]
    fresh = [draw(100 + i) for i in range(args.fresh)]
    built: dict[str, Any] = {"eager": model}
    for name, on in (("smoothed", True), ("not smoothed", False)):
        built[name], what = tuned(model, first, held_out, args, on)
        print(f"{name}: {what}", flush=True)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        refs = [model(*b) for b in held_out]
        for name, m in built.items():
            print(f"{name}: max |out - eager| on the held-out batches "
                  f"{max(float((m(*b) - r).abs().max()) for b, r in zip(held_out, refs)):.2e}")
        times = dlrm.interleaved({n: dlrm.cycled(m, fresh) for n, m in built.items()}, args.rounds, args.seconds)
    for name, t in times.items():
        print(f"{name}: {t * 1e3:.3f} ms per batch ({times['eager'] / t:.2f}x eager)")
    print(f"smoothed / not smoothed: {times['smoothed'] / times['not smoothed']:.3f} of the time")


if __name__ == "__main__":
    main()
