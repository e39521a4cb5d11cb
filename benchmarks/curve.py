"""Best latency after N trials, per log, side by side: `python -m benchmarks.curve LOG [LOG...] --shape ...`.

Reads the trials of one task in log order (the order they were measured), so the figures are the tuning
curve of whichever strategy wrote each log. A log with fewer trials than a column shows nan there.
"""

from __future__ import annotations

import argparse
import math

from autotune.task import make_task
from benchmarks.lib.curves import best_so_far
from autotune.tuning_log import TuningLog


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("--op", default="embedding_bag")
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", required=True)
    p.add_argument("--at", default="32,64,128,256", help="the trial counts to print the best after")
    a = p.parse_args()
    task = make_task(a.op, a.device, shape=a.shape)
    cps = [int(x) for x in a.at.split(",")]
    print(f"{'log':50s} " + " ".join(f"{'@' + str(c):>10s}" for c in cps) + "   (best ms after N trials)")
    for log in a.logs:
        recs = TuningLog(log).of(task)
        curve = best_so_far([r.latency for r in recs])
        print(f"{log:50s} " + " ".join(f"{(curve[c - 1] if c <= len(curve) else math.nan) * 1e3:10.3f}"
                                       for c in cps))


if __name__ == "__main__":
    main()
