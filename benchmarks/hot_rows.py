"""Does the frequency-aware hot-row layout pay? The embedding bag on skewed traffic, with the table's rows as
they are and with its hottest rows placed together at its front (counted on the example batch).

Each contender pools the same cycle of fresh batches (hot rows stay hot across them, as a model's do):
    torch             F.embedding_bag on the table as it is
    ours              the best logged kernel on the table as it is
    ours hot-first    the kernel on the reordered table, each batch's indices remapped on the way (one gather
                      of the remap table per index: the price a model would pay per batch)
    ours pre-mapped   the kernel on the reordered table with indices remapped upstream, for free (the layout's
                      best case: the remap done where the features are prepared)
Rounds interleave the contenders; medians of rounds are printed with ratios to `ours`. Usage (a quiet machine):
    python -m benchmarks.hot_rows --shape rows=1000000,dim=64,batch=2048,pooling=20-80,dist=zipf:1.05 \
        --log logs/local/embedding_bag.jsonl
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from autotune.kernel import load_kernel
from autotune.task import make_task
from benchmarks.lib.timing import interleaved


def hot_first(table: torch.Tensor, example_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the table with its rows by descending count in `example_indices`, ties in row order; remap: old row ->
    new row)."""
    counts = torch.bincount(example_indices, minlength=table.shape[0])
    order = torch.sort(counts, descending=True, stable=True).indices  # new row -> old row
    remap = torch.empty_like(order)
    remap[order] = torch.arange(order.numel())
    return table[order].contiguous(), remap


def time_cycle(fn: Callable[[Any, Any], Any], batches: list[tuple[Any, Any]], seconds: float) -> float:
    """Seconds per call over whole cycles of `batches`, for at least `seconds`."""
    calls, start = 0, time.perf_counter()
    while True:
        for idx, off in batches:
            fn(idx, off)
        calls += len(batches)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return elapsed / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", required=True, help="an embedding_bag shape with dist=zipf:...")
    p.add_argument("--log", required=True, help="a log holding a tuned record of the shape on this CPU")
    p.add_argument("--batches", type=int, default=8, help="fresh batches per cycle")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seconds", type=float, default=0.5, help="per contender per round")
    a = p.parse_args()
    task = make_task("embedding_bag", "cpu", shape=a.shape)
    w = task.workload
    if w.distribution != "zipf" or w.dtype != "float32" or w.per_sample_weights or w.padding_idx is not None:
        p.error("the hot-row layout is for plain float32 bags on skewed (dist=zipf) traffic")
    kernel = load_kernel(task, [a.log], validate=False)
    weight, idx, off = task.template.inputs(w, 0)[:3]
    sets = task.template.timed_inputs(w, 0, (weight, idx, off), 1 << 62)  # as many fresh sets as it allows
    batches = [(s[1], s[2]) for s in sets][: a.batches]
    reordered, remap = hot_first(weight, idx)
    mapped = [(remap[i], o) for i, o in batches]
    want = F.embedding_bag(batches[1][0], weight, batches[1][1], mode=w.mode)
    got = kernel(reordered, remap[batches[1][0]], batches[1][1])
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * w.pooling[1])
    hot = int((torch.bincount(idx, minlength=w.rows) > 0).sum())
    print(f"{a.shape}: {len(batches)} fresh batches a cycle; the example names {hot} distinct rows "
          f"({hot * weight.shape[1] * 4 / 2**20:.1f} MiB placed first)")
    contenders: dict[str, tuple[Callable[[Any, Any], Any], list[tuple[Any, Any]]]] = {
        "torch": (lambda i, o: F.embedding_bag(i, weight, o, mode=w.mode), batches),
        "ours": (lambda i, o: kernel(weight, i, o), batches),
        "ours hot-first": (lambda i, o: kernel(reordered, remap[i], o), batches),
        "ours pre-mapped": (lambda i, o: kernel(reordered, i, o), mapped),
    }
    times = interleaved(contenders, a.rounds, lambda c: time_cycle(*c, a.seconds))
    base = statistics.median(times["ours"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:16s} {med * 1e3:8.3f} ms  (rounds {min(ts) * 1e3:.3f}-{max(ts) * 1e3:.3f})  "
              f"ours / this {base / med:5.2f}x")


if __name__ == "__main__":
    main()
