"""Which cache state a cross layer's kernel is timed in, and whether the tuner's ranking of its configs holds in
the model's.

DLRMv2's cross network runs `x_{l+1} = qmatmul_cross(a_l, x0, x_l)` (int8; `split_linear_cross` in float32) three
times per batch: each layer reads x0 (written once per batch) and the x_l the previous layer just wrote (28 MB each
at batch 2048), and its output is the next layer's x_l. For the best configs of a log, this times the kernel in
three states, interleaved in rounds (medians):
  repeated  one call's inputs again and again (what the tuner timed before the cross templates had
            `timed_inputs`): x0 and x stay in cache as far as it holds them
  fresh     a cycle of new x0 and x (the template's `timed_inputs`, what the tuner times now)
  chained   per batch a new x0, then three calls, each one's output the next one's x (the model's state)
and prints each config's ms and rank in each state. Usage:
    python -m benchmarks.cross_timing --log logs/local/dcn/qmatmul_cross.jsonl [--op split_linear_cross]
        [--shape m=2048,k=512,n=3456] [--top 6] [--config '{"m_block": 128, ...}'] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable, Sequence

from benchmarks.lib.timing import interleaved

OPS = ("qmatmul_cross", "split_linear_cross")  # operands (..., x0, x_l): the last two are the layer's state
DEFAULT_SHAPE = "m=2048,k=512,n=3456"  # DLRMv2's cross layer: the W product (rank 512) and the tail, 3456 wide
BATCHES = 4  # chained: batches per timing, each three calls
LAYERS = 3
STATES = ("repeated", "fresh", "chained")


def best_configs(task: Any, log: str, top: int) -> list[Any]:
    """The `top` fastest distinct correct configs of `task` in `log`, at the current template version."""
    from autotune.tuning_log import TuningLog

    records = sorted((r for r in TuningLog.existing([log]).current(task) if r.ok), key=lambda r: r.latency)
    out: list[Any] = []
    for r in records:
        cfg = task.space.from_json(r.config)
        if cfg not in out:
            out.append(cfg)
        if len(out) == top:
            break
    return out


def states(kernel: Callable[..., Any], tensors: Sequence[Any], sets: Sequence[Sequence[Any]]
           ) -> dict[str, Callable[[], float]]:
    """Seconds per call of `kernel` in each cache state (one timing each: a median over its calls)."""
    import torch

    operands = tensors[:-2]
    sources = [s[-2] for s in sets[:BATCHES]]

    def repeated() -> float:
        return _median_call(lambda: kernel(*tensors), LAYERS * BATCHES)

    def fresh() -> float:
        turn = iter(sets * (LAYERS * BATCHES // len(sets) + 1))
        return _median_call(lambda: kernel(*next(turn)), LAYERS * BATCHES)

    def chained() -> float:
        times = []
        for src in sources:
            first = torch.empty_like(src).copy_(src)  # the batch's x0, written as the model's cat writes it
            x = first
            for _ in range(LAYERS):
                t0 = time.perf_counter()
                x = kernel(*operands, first, x)
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return {"repeated": repeated, "fresh": fresh, "chained": chained}


def _median_call(call: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", help="a tuning log of the task: its --top fastest configs are timed")
    p.add_argument("--op", choices=OPS, default=OPS[0], help="the cross layer's operator (default: %(default)s)")
    p.add_argument("--shape", default=DEFAULT_SHAPE)
    p.add_argument("--top", type=int, default=6)
    p.add_argument("--config", action="append", default=[], help="a config as JSON (repeatable), besides the log's")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)

    from autotune.kernel import Kernel
    from autotune.runtime import cpu_cache_bytes, input_sets
    from autotune.task import make_task

    if args.top < 1 or args.rounds < 1:
        p.error("--top and --rounds take values >= 1")
    if not args.log and not args.config:
        p.error("give --log or --config")
    task = make_task(args.op, "cpu", shape=args.shape)
    try:
        given = [json.loads(c) for c in args.config]
        if not all(isinstance(c, dict) for c in given):
            p.error(f"--config takes a JSON object of knob values, got {args.config}")
        configs = [task.space.from_json(c) for c in given]
        logged = best_configs(task, args.log, args.top) if args.log else []
    except (ValueError, FileNotFoundError) as err:  # bad JSON, a config not of the space (InvalidConfig), no log
        p.error(str(err))
    if args.log and not logged:
        p.error(f"{args.log} holds no correct record of {args.op} {task.workload.key()} at the current "
                "template version")
    configs = logged + configs
    tpl, w = task.template, task.workload
    tensors = tpl.inputs(w, 0)
    sets = input_sets(tpl, w, 0, tensors, "cpu")
    timings = {f"{cfg} :: {state}": fn for cfg in configs
               for state, fn in states(Kernel(task, cfg, validate=False), tensors, sets).items()}
    times = {name: statistics.median(v) for name, v in interleaved(timings, args.rounds, lambda f: f()).items()}
    print(f"{args.op} {w.key()}: {len(sets)} fresh sets (a {cpu_cache_bytes() >> 20} MB cache), "
          f"median of {args.rounds} interleaved rounds, ms per call (rank)")
    print("| config | repeated | fresh | chained |\n|---|---|---|---|")
    rank = {state: sorted(configs, key=lambda c: times[f"{c} :: {state}"]) for state in STATES}
    for cfg in configs:
        cells = [f"{times[f'{cfg} :: {s}'] * 1e3:.2f} ({rank[s].index(cfg) + 1})" for s in STATES]
        print(f"| {cfg} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
