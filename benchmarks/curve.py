"""Best latency after N trials, per log, side by side: `python benchmarks/curve.py LOG [LOG...] --shape ...`.

Reads the trials of one task in log order (the order they were measured), so the figures are the tuning
curve of whichever strategy wrote each log.
"""

from __future__ import annotations

import argparse
import math

from autotune import records
from autotune.task import make_task
from autotune.tuning_log import TuningLog


def best_after(recs: list[records.Record], checkpoints: list[int]) -> list[float]:
    out, best = [], math.inf
    for i, r in enumerate(recs, 1):
        best = min(best, r.latency)
        if i in checkpoints:
            out.append(best)
    return out + [math.nan] * (len(checkpoints) - len(out))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("logs", nargs="+")
    p.add_argument("--op", default="embedding_bag")
    p.add_argument("--device", default="cpu")
    p.add_argument("--shape", required=True)
    p.add_argument("--at", default="32,64,128,256")
    a = p.parse_args()
    task = make_task(a.op, a.device, shape=a.shape)
    cps = [int(x) for x in a.at.split(",")]
    print(f"{'log':50s} " + " ".join(f"{'@' + str(c):>10s}" for c in cps) + "   (best ms after N trials)")
    for log in a.logs:
        recs = TuningLog(log).of(task)
        print(f"{log:50s} " + " ".join(f"{v * 1e3:10.3f}" for v in best_after(recs, cps)))


if __name__ == "__main__":
    main()
