"""A model tuned at one batch size, served at others: eager against ours at each size, as a server sees them.

tune_model tunes at the example's batch, and the model it returns takes any batch; serving traffic brings
whatever a request holds. Here examples/torchrec_dlrm.py's model (TorchRec's DLRM or DLRMv2, KJT inputs) is
tuned once at --tune-batch (resuming from --log-dir), then timed at each of --sizes against eager: interleaved
rounds, each call on a batch it has not seen in that round (a cycle of --fresh batches per size), medians; the
error column is max |ours - eager| over those batches. `--float32-state` adds a third contender: the int8 model
with DLRMv2's cross network keeping float32 state (one int8 match per cross layer, as before the bfloat16
network: search_spaces/qmatmul/graph.py), tuned from the same logs and timed in the same rounds. `--against DIR`
adds the same model tuned from the logs in DIR (the A/B of a template change in the model: DIR holds the logs
without the change's records, or of the code before it), timed in the same rounds.

    python -m benchmarks.batch_sizes [--model dcn] [--sizes 64 256 1000 2048] [--log-dir logs/local/torchrec]
                                     [--float32-state] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Sequence

import torch

from benchmarks.lib.example import torchrec_dlrm
from benchmarks.lib.timing import interleaved


def per_call(model: Callable[..., Any], batches: Sequence[tuple[Any, ...]], seconds: float) -> float:
    """Median seconds of one call over the cycle of `batches`, called for about `seconds`."""
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while len(times) < len(batches) or time.perf_counter() < stop:
        batch = batches[len(times) % len(batches)]
        t0 = time.perf_counter()
        model(*batch)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("dlrm", "dcn"), default="dcn")
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1000, 2048])
    p.add_argument("--tune-batch", type=int, default=2048)
    p.add_argument("--max-rows", type=int, default=None, help="cap on a table's rows (default: the example's)")
    p.add_argument("--fp32", action="store_true", help="ours fp32-exact (quantize=False) instead of int8")
    p.add_argument("--trials", type=int, default=8)
    p.add_argument("--log-dir", default="logs/local/torchrec")
    p.add_argument("--fresh", type=int, default=4, help="batches per size, cycled")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=0.5, help="timing per contender, size and round")
    p.add_argument("--float32-state", action="store_true",
                   help="also time the int8 model whose cross network keeps float32 state (the A/B of bfloat16's)")
    p.add_argument("--against", metavar="DIR",
                   help="also time the model tuned from the logs in DIR/<model> (an A/B of two sets of logs)")
    args = p.parse_args(argv)
    if min(*args.sizes, args.tune_batch, args.trials, args.fresh, args.rounds) < 1 or (
            args.max_rows is not None and args.max_rows < 1):
        p.error("--sizes, --tune-batch, --max-rows, --trials, --fresh and --rounds take values >= 1")
    if args.float32_state and args.fp32:
        p.error("--float32-state compares int8 models: it takes no --fp32")
    if args.against and not os.path.isdir(os.path.join(args.against, args.model)):
        p.error(f"--against {args.against}: no {os.path.join(args.against, args.model)} (it holds the logs of "
                "<model>, as --log-dir does)")
    try:
        import torchrec  # noqa: F401  (the models are TorchRec's)
    except ImportError as err:
        p.exit(2, f"torchrec is not installed ({err}): `make .venv/.torchrec` installs the optional extra\n")
    import autotune.torch as at
    from autotune.allocator import keep_freed_memory

    keep_freed_memory()
    ex = torchrec_dlrm()
    torch.manual_seed(0)
    model, rows = ex.build(args.model, args.max_rows)
    pooling = ex.MODELS[args.model]["pooling"]
    draw = lambda batch, seed: ex.make_batch(rows, pooling, batch, seed)  # noqa: E731

    def tuned(log_dir: str = args.log_dir) -> Any:
        return at.tune_model(model, draw(args.tune_batch, 0), log_dir=os.path.join(log_dir, args.model),
                             trials=args.trials, quantize=not args.fp32,
                             check_inputs=[draw(args.tune_batch, 1 + i) for i in range(2)],
                             test_inputs=[draw(args.tune_batch, 500 + i) for i in range(2)])[0]

    name = "ours fp32-exact" if args.fp32 else "ours int8"
    # the A/B contenders first: the package tune_model leaves in --log-dir is then ours'
    ab = {"int8, float32 cross state": float32_state(tuned)} if args.float32_state else {}
    if args.against:
        ab[f"{name}, logs of {args.against}"] = tuned(args.against)
    contenders = {"eager": model, name: tuned(), **ab}
    print(f"\nTorchRec {type(model).__name__} tuned at batch {args.tune_batch}; {name} against eager, "
          f"{args.fresh} fresh batches per size, median of {args.rounds} interleaved rounds\n")
    others = [c for c in contenders if c != "eager"]
    print("| batch | eager ms | " + " | ".join(f"{c} ms | x eager | samples/s | max \\|out - eager\\|" for c in others)
          + " |")
    print("|---|---|" + "---|---|---|---|" * len(others))
    with torch.inference_mode():
        for size in args.sizes:
            batches = [draw(size, 1000 * size + i) for i in range(args.fresh)]
            times = interleaved(contenders, args.rounds, lambda f: per_call(f, batches, args.seconds))
            eager = statistics.median(times["eager"])
            wants = [model(*b) for b in batches]
            cells = []
            for c in others:
                mine = statistics.median(times[c])
                error = max(float((contenders[c](*b) - want).abs().max()) for b, want in zip(batches, wants))
                cells.append(f"{mine * 1e3:.2f} | {eager / mine:.2f} | {size / mine:,.0f} | {error:.1e}")
            print(f"| {size} | {eager * 1e3:.2f} | " + " | ".join(cells) + " |", flush=True)


def float32_state(tuned: Callable[[], Any]) -> Any:
    """`tuned()` with qmatmul's rule running each cross layer as its own match (float32 state)."""
    from search_spaces.qmatmul import graph

    keep = graph.MIN_NETWORK_LAYERS
    graph.MIN_NETWORK_LAYERS = sys.maxsize
    try:
        return tuned()
    finally:
        graph.MIN_NETWORK_LAYERS = keep


if __name__ == "__main__":
    main()
