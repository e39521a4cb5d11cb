"""Where one tune_model call on make tune's DLRM spends its time: cProfile of the call, cumulative.

Give it the log directory of an earlier run (`make tune` leaves logs/local/dlrm): the tasks its records cover
are not tuned, so what remains is tune_model's own work (captures, rewrites, speed checks, the precision ladder,
the export). The call's replaced/kept lines are printed too, so two commits' decisions can be compared.

    python -m benchmarks.tune_model_profile --log-dir COPY_OF_LOGS [--pooling 1] [--fp32] [--top 40] [--budget 90]

Tune into a copy of the logs: the call writes its package (and any task it tunes) there.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from typing import Sequence

import torch

from benchmarks.lib.example import dlrm


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log-dir", required=True)
    p.add_argument("--pooling", type=int, default=1, help="indices per bag (make tune's are 1 and 8)")
    p.add_argument("--fp32", action="store_true", help="the fp32-exact call (quantize=False) instead of int8")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--top", type=int, default=40, help="profile lines printed")
    p.add_argument("--budget", type=float, default=None, help="tune_model's budget (seconds), as make tune's")
    args = p.parse_args(argv)
    import autotune.torch as at

    ex = dlrm()
    torch.manual_seed(0)
    model = ex.DLRM(tuple(min(r, 200_000) for r in ex.CRITEO_KAGGLE_ROWS)).eval()
    draw = lambda seed: ex.make_batch(model, args.batch, (args.pooling, args.pooling), seed)  # noqa: E731
    example = draw(0)  # the batches examples/dlrm.py draws
    held_out, test = [draw(1 + i) for i in range(2)], [draw(500 + i) for i in range(2)]
    profile = cProfile.Profile()
    t0 = time.perf_counter()
    profile.enable()
    _, report = at.tune_model(model, example, log_dir=args.log_dir, trials=8, quantize=not args.fp32,
                              check_inputs=held_out, test_inputs=test, timing_batches=8, progress=False,
                              budget=args.budget)
    profile.disable()
    print(f"tune_model: {time.perf_counter() - t0:.1f} s\n{report}\n")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
