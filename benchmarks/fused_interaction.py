"""The embedding bags fused into the dot interaction (`embedding_interaction`) against the two kernels apart, in
examples/dlrm.py's Criteo-shaped DLRM (26 tables capped at --max-rows, dim 64), fp32-exact (--quantize: with
tune_model's int8 rules too, the int8 tables among them, under its default int8 accuracy contract).

For each --pooling, `tune_model` rewrites the model three ways (one log dir: each task is tuned once, then
resumed):
  apart   the rules without embedding_interaction: batched_embedding_bag's launch, then the interaction kernel
          reading its (B, T, D) output in place (the model before the fused kernel);
  fused   the rules without batched_embedding_bag and interaction: the fused kernel wherever it agrees;
  chosen  every rule: tune_model times the whole model fused against apart and keeps the faster by its margin
          (its report's "whole-model check" line says what each took);
then eager and the three are timed interleaved, medians of --rounds, over a cycle of --fresh batches and over
the example batch repeated; and (fp32-exact) the embedding + interaction section alone, on the same tables,
dense vectors and bags: the fused op against the batched op then the interaction op (both regimes). A missing
kernel fails the run (no silent PyTorch fallback is timed).

    python -m benchmarks.fused_interaction [--pooling 1 8] [--batch 2048] [--trials 16] [--fresh 8]
                                           [--rounds 5] [--seconds 0.5] [--quantize] [--log-dir logs/local/fused]
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any, Callable, Sequence

import torch

from benchmarks.lib import example

FUSED, BAGS, INTERACTION = "embedding_interaction", "batched_embedding_bag", "interaction"


def tuned(name: str, model: Any, example: Any, held_out: Sequence[Any], rules: list[Any] | None,
          args: argparse.Namespace, dlrm: Any) -> Any:
    """One tune_model call, its report printed; a Contender of examples/dlrm.py."""
    import time

    import autotune.torch as at

    t0 = time.perf_counter()
    optimized, report = at.tune_model(model, example, log_dir=args.log_dir, trials=args.trials,
                                      quantize=args.quantize,
                                      check_inputs=list(held_out), timing_batches=args.fresh, rules=rules,
                                      bench_rounds=0)
    print(f"\n== {name}: tune_model in {time.perf_counter() - t0:.0f} s\n{report}")
    return dlrm.Contender(name, optimized, time.perf_counter() - t0)


def rules_without(quantize: bool, *names: str) -> list[Any]:
    """tune_model's rules less those named (a table rule's int8 variant goes with it)."""
    from autotune.torch.rules import collect_rules

    return [r for r in collect_rules(quantize=quantize) if r.name not in names and r.name.removesuffix("_int8")
            not in names]


def section(fused_model: Any, model: Any, batches: Sequence[Any], rounds: int, seconds: float, dlrm: Any) -> str:
    """The embedding + interaction part alone: the fused op against the batched op then the interaction op, on
    the fused model's one table buffer, each batch's dense vectors (the bottom MLP's) and bags."""
    node = next((n for n in fused_model.graph.nodes if n.target is getattr(torch.ops.autotune, FUSED).default), None)
    if node is None:
        return "section: the fused model runs no embedding_interaction (see its report): nothing to compare"
    weight, table_offsets = (getattr(fused_model, n.target) for n in node.args[1:3])
    fused_op, bags_op = getattr(torch.ops.autotune, FUSED), getattr(torch.ops.autotune, BAGS)
    interaction_op = getattr(torch.ops.autotune, INTERACTION)
    with torch.inference_mode():
        calls = [(model.bottom(dense), indices, offsets) for dense, indices, offsets in batches]
    tables, dim = len(calls[0][1]), calls[0][0].shape[1]

    def fused(x: Any, indices: Any, offsets: Any) -> Any:
        return fused_op(x, weight, table_offsets, indices, offsets)

    def apart(x: Any, indices: Any, offsets: Any) -> Any:
        return interaction_op(x, bags_op(weight, table_offsets, indices, offsets).view(x.shape[0], tables, dim))

    fns: dict[str, Callable[[], Any]] = {}
    for name, fn in (("fused op", fused), ("batched op + interaction op", apart)):
        fns[f"fresh {name}"] = dlrm.cycled(fn, calls)
        fns[f"repeated {name}"] = dlrm.cycled(fn, calls[:1])
    with torch.inference_mode(), warnings.catch_warnings():
        import autotune.torch as at

        warnings.simplefilter("error", at.NoTunedKernelWarning)  # a fallback would time PyTorch: fail instead
        worst = max(float((fused(*c) - apart(*c)).abs().max()) for c in calls)
        times = dlrm.interleaved(fns, rounds, seconds)
    lines = ["| section | fresh ms | repeated ms |", "|---|---|---|"]
    for name in ("batched op + interaction op", "fused op"):
        lines.append(f"| {name} | {times[f'fresh {name}'] * 1e3:.3f} | {times[f'repeated {name}'] * 1e3:.3f} |")
    lines.append(f"- fused / apart: fresh {times['fresh fused op'] / times['fresh batched op + interaction op']:.2f}, "
                 f"repeated {times['repeated fused op'] / times['repeated batched op + interaction op']:.2f}; "
                 f"max |fused - apart| {worst:.2g}")
    return "\n".join(lines)


def run_pooling(model: Any, pooling: int, args: argparse.Namespace, dlrm: Any) -> str:
    draw = lambda seed: dlrm.make_batch(model, args.batch, (pooling, pooling), seed)  # noqa: E731
    example = draw(0)
    held_out = [draw(1)]
    fresh = [example] + [draw(1000 + i) for i in range(args.fresh - 1)]
    print(f"\n==== {pooling} {'index' if pooling == 1 else 'indices'} per bag")
    built = [dlrm.Contender("eager", model),
             tuned("apart (batched bags + interaction)", model, example, held_out, rules_without(args.quantize, FUSED),
                   args, dlrm),
             tuned("fused (embedding_interaction)", model, example, held_out,
                   rules_without(args.quantize, BAGS, INTERACTION), args, dlrm),
             tuned("chosen by tune_model", model, example, held_out, None, args, dlrm)]
    rows = dlrm.measure(built, fresh, held_out, args.rounds, args.seconds)
    title = (f"{pooling} {'index' if pooling == 1 else 'indices'} per bag, batch {args.batch}, "
             f"{'int8 rules on' if args.quantize else 'fp32-exact'}: fresh = "
             f"a cycle of {len(fresh)} batches, repeated = the example batch; median of {args.rounds} rounds")
    if args.quantize:  # the apart model's tables are int8 there: no fp32 batched kernel to set beside the fused op
        return dlrm.table(title, rows, [])
    return dlrm.table(title, rows, []) + "\n\n" + section(built[2].model, model, fresh, args.rounds, args.seconds,
                                                          dlrm)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pooling", type=int, nargs="+", default=[1, 8], help="indices per bag, one run per value")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--max-rows", type=int, default=200_000, help="cap on a table's rows")
    p.add_argument("--trials", type=int, default=16, help="tuning budget per task")
    p.add_argument("--fresh", type=int, default=8, help="batches in the fresh cycle")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--seconds", type=float, default=0.5, help="timing per contender, regime and round")
    p.add_argument("--quantize", action="store_true", help="tune_model's int8 rules too (default: fp32-exact)")
    p.add_argument("--log-dir", default="logs/local/fused")
    args = p.parse_args(argv)
    dlrm = example.dlrm()
    torch.manual_seed(0)
    rows = tuple(min(r, args.max_rows) for r in dlrm.CRITEO_KAGGLE_ROWS)
    model = dlrm.DLRM(rows).eval()
    print(f"DLRM: {len(rows)} tables ({sum(rows):,} rows x {dlrm.DIM}), batch {args.batch}, pooling {args.pooling}, "
          f"threads: PyTorch {torch.get_num_threads()}")
    tables = [run_pooling(model, pooling, args, dlrm) for pooling in args.pooling]
    print("\n== results (ms per batch; x eager: eager's time / the contender's, in the same regime)\n")
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
