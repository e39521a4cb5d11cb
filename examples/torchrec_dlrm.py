"""TorchRec's own DLRM and DLRMv2 (DLRM_DCN, MLPerf's model) compiled whole by `tune_model`, as TorchRec builds them.

The models are `torchrec.models.dlrm.DLRM` and `DLRM_DCN` over an `EmbeddingBagCollection`, called with `(dense,
KeyedJaggedTensor)`: nothing in them names this project, and `tune_model` gets them as they are. Tables: MLPerf
DLRMv2's 26 row counts (Criteo 1TB) capped at --max-rows.
  dlrm  `DLRM`, dim 64, one-hot features, dense arch 512-256-64, over arch 512-256-1 (cap 200,000 by default)
  dcn   `DLRM_DCN` as MLPerf's DLRMv2: dim 128, multi-hot with MLPerf's per-feature pooling (214 ids a sample),
        dense arch 512-256-128, a 3-layer low-rank (512) DCNv2 cross net, over arch 1024-1024-512-256-1 (cap
        1,000,000 by default)
Contenders, timed in one process on a cycle of --fresh batches drawn like the example (interleaved rounds,
medians), each with max |out - eager| on test batches no decision saw (tune_model decides on --held-out
validation batches, as many again):
  eager; torch.compile (Inductor, freezing); TorchRec's own CPU int8 (its quantized EmbeddingBagCollection over
  FBGEMM's IntNBit TBE, `quantize_embeddings`, and dynamic int8 Linears, `quantize_dynamic`); PyTorch's int8
  as Intel's DLRMv2 reference runs it (the KJT unpacked to tensors, PT2E with X86InductorQuantizer, then
  torch.compile; needs torchao); ours fp32-exact and ours int8 (`tune_model`, logs in --log-dir/<model>).
It prints ms per batch, samples/s and, for dcn, user-item pairs/s per core (a vCPU counted as a core).

    python examples/torchrec_dlrm.py [--model dlrm dcn] [--batch 2048] [--trials 8] [--max-rows N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlrm import (PT2E, TORCHAO, Contender, Row, _built, add_run_options, allocator, check_run_options,  # noqa: E402
                  measure, ours, write_summary)  # (this folder's DLRM example)

# MLPerf DLRMv2's 26 categorical features (Criteo 1TB, as its reference trains them): rows per table, and ids
# per sample in its multi-hot data set.
MLPERF_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938,
               155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
MLPERF_POOLING = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)
DENSE = 13
MODELS = {
    "dlrm": dict(dim=64, pooling=(1,) * 26, cap=200_000, dense_arch=[512, 256, 64], over_arch=[512, 256, 1]),
    "dcn": dict(dim=128, pooling=MLPERF_POOLING, cap=1_000_000, dense_arch=[512, 256, 128],
                over_arch=[1024, 1024, 512, 256, 1], dcn_layers=3, dcn_rank=512),
}
TORCHREC_INT8 = "TorchRec int8 (IntNBit TBE + dynamic int8 Linear)"

Batch = tuple[torch.Tensor, Any]


def build(kind: str, max_rows: int | None) -> tuple[nn.Module, tuple[int, ...]]:
    """The TorchRec model `kind` ("dlrm" or "dcn") with MLPerf's tables capped at `max_rows` (its default cap)."""
    from torchrec.models.dlrm import DLRM, DLRM_DCN
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    spec = MODELS[kind]
    rows = tuple(min(r, max_rows or spec["cap"]) for r in MLPERF_ROWS)
    tables = [EmbeddingBagConfig(name=f"t_{i}", embedding_dim=spec["dim"], num_embeddings=r,
                                 feature_names=[f"cat_{i}"]) for i, r in enumerate(rows)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    kw = dict(embedding_bag_collection=ebc, dense_in_features=DENSE, dense_arch_layer_sizes=spec["dense_arch"],
              over_arch_layer_sizes=spec["over_arch"])
    if kind == "dcn":
        return DLRM_DCN(**kw, dcn_num_layers=spec["dcn_layers"], dcn_low_rank_dim=spec["dcn_rank"]).eval(), rows
    return DLRM(**kw).eval(), rows


def make_batch(rows: Sequence[int], pooling: Sequence[int], batch: int, seed: int) -> Batch:
    """Dense features and a KJT of each feature's fixed pooling of Zipf-popular ids (as click logs are)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    rng = np.random.default_rng(seed)
    dense = torch.from_numpy(rng.standard_normal((batch, DENSE)).astype(np.float32))
    values = []
    for n, p in zip(rows, pooling):
        hot = (rng.zipf(1.1, size=batch * p) - 1) % n
        values.append(np.random.default_rng(n).permutation(n)[hot])  # a table's popular rows stay popular
    lengths = np.repeat(np.asarray(pooling, dtype=np.int64), batch)
    kjt = KeyedJaggedTensor(keys=[f"cat_{i}" for i in range(len(rows))],
                            values=torch.from_numpy(np.concatenate(values)).long(),
                            lengths=torch.from_numpy(lengths))
    return dense, kjt


# ---- the peers ------------------------------------------------------------------------------------------------
def compiled(model: nn.Module, example: Batch) -> Contender:
    """torch.compile with Inductor's freezing, compiled by a first call in inference mode (a KJT's plumbing may
    break the graph, so not fullgraph)."""
    import torch._inductor.config as inductor

    def make() -> Callable[..., Any]:
        fn = torch.compile(model)
        with inductor.patch(freezing=True), torch.inference_mode():
            fn(*example)
        return fn

    return _built("torch.compile", make)


def torchrec_int8(model: nn.Module) -> Contender:
    """TorchRec's CPU inference int8: the EmbeddingBagCollection swapped for its quantized twin (int8 rows in
    FBGEMM's IntNBit TBE) and every Linear dynamically quantized (int8 weights, activations quantized per call)."""
    import copy

    def make() -> Callable[..., Any]:
        from torchrec.inference.modules import quantize_embeddings

        q = quantize_embeddings(copy.deepcopy(model), dtype=torch.qint8, inplace=True)
        return torch.ao.quantization.quantize_dynamic(q, {nn.Linear}, dtype=torch.qint8)

    return _built(TORCHREC_INT8, make)


class Unpacked(nn.Module):
    """TorchRec's DLRM forward with the KJT unpacked to per-feature ids and offsets, as Intel's DLRMv2 reference
    feeds its int8 model: the same modules (dense arch, the collection's tables, interaction, over arch), none of
    a KJT's data-dependent plumbing, which PT2E's export and Inductor cannot compile."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.bags = nn.ModuleList(model.sparse_arch.embedding_bag_collection.embedding_bags.values())

    def forward(self, dense: torch.Tensor, ids: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        m = self.model
        sparse = torch.stack([bag(i, o) for bag, i, o in zip(self.bags, ids, offsets)], dim=1)
        return m.over_arch(m.inter_arch(dense_features=m.dense_arch(dense), sparse_features=sparse))

    @staticmethod
    def split(kjt: Any, clone: bool = False) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The KJT's per-feature ids and offsets (each feature's offsets from 0, with the last); `clone`: copies
        (a KJT caches what it computed in an earlier call, in inference mode if that call was, which export's
        tracing then refuses)."""
        jts = kjt.to_dict()
        ids, offsets = [jt.values() for jt in jts.values()], [jt.offsets() for jt in jts.values()]
        return ([t.clone() for t in ids], [t.clone() for t in offsets]) if clone else (ids, offsets)


def pt2e_int8(model: nn.Module, example: Batch) -> Contender:
    """PT2E + X86InductorQuantizer (static int8 activations calibrated on the example, int8 weights per channel)
    over the unpacked model, then torch.compile with freezing; each call splits its KJT per feature first."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    except ImportError as err:
        return Contender(PT2E, skipped=f"torchao is not installed ({err}): pip install --no-deps {TORCHAO}")
    dense, kjt = example

    def make() -> Callable[..., Any]:
        import torch._inductor.config as inductor

        unpacked = Unpacked(model)
        flat = (dense.clone(), *Unpacked.split(kjt, clone=True))
        with torch.no_grad():
            torch.testing.assert_close(unpacked(*flat), model(dense, kjt), rtol=0, atol=0)
        quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(torch.export.export(unpacked, flat).module(), quantizer)
        with torch.no_grad():
            prepared(*flat)  # calibration
        fn = torch.compile(convert_pt2e(prepared))
        with inductor.patch(freezing=True), torch.inference_mode():
            fn(*flat)
        return lambda d, k: fn(d, *Unpacked.split(k))

    return _built(PT2E, make)


def contenders(model: nn.Module, example: Batch, held_out: Sequence[Batch], test: Sequence[Batch],
               args: argparse.Namespace, log_dir: str) -> list[Contender]:
    out = [Contender("eager", model)]
    out.append(compiled(model, example) if args.compile else Contender("torch.compile", skipped="--no-compile"))
    out.append(torchrec_int8(model))
    out.append(pt2e_int8(model, example) if args.pt2e else Contender(PT2E, skipped="--no-pt2e"))
    mine = argparse.Namespace(**{**vars(args), "log_dir": log_dir})
    if args.ours:
        out.append(ours("ours fp32-exact", model, example, held_out, False, mine, test))
        out.append(ours("ours int8", model, example, held_out, True, mine, test))
    return out


def table(title: str, rows: Sequence[Row], skipped: Sequence[Contender], batch: int, pairs: bool) -> str:
    """Markdown: ms, x eager, samples/s (and user-item pairs/s per core), held-out error, build time."""
    eager, cores = rows[0], torch.get_num_threads()
    columns = ["contender", "ms", "x eager", "samples/s", *(["pairs/s per core"] * pairs),
               "max \\|out - eager\\| (test batches)", "build s"]
    lines = [f"### {title}", "", "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    for r in rows:
        rate = batch / r.fresh_s
        lines.append(f"| {r.name + (f' ({r.note})' if r.note else '')} | {r.fresh_s * 1e3:.2f} | "
                     f"{eager.fresh_s / r.fresh_s:.2f} | {rate:,.0f} |" + (f" {rate / cores:,.0f} |" if pairs else "")
                     + f" {r.error:.1e} | {r.build_s:.0f} |")
    lines += [f"- {c.name}: {c.skipped}" for c in skipped]
    return "\n".join(lines)


def run(kind: str, args: argparse.Namespace) -> tuple[str, bool]:
    torch.manual_seed(0)
    model, rows = build(kind, args.max_rows)
    pooling = MODELS[kind]["pooling"]
    mib = sum(rows) * MODELS[kind]["dim"] * 4 / 2**20
    print(f"\n==== {type(model).__name__} ({kind}): {len(rows)} tables ({sum(rows):,} rows, {mib:,.0f} MiB), "
          f"{sum(pooling)} ids a sample, batch {args.batch}, threads: PyTorch {torch.get_num_threads()}")
    draw = lambda seed: make_batch(rows, pooling, args.batch, seed)  # noqa: E731
    example = draw(0)
    held_out = [draw(1 + i) for i in range(args.held_out)]  # validation: tune_model decides on them
    test = [draw(500 + i) for i in range(args.held_out)]  # the error column: no decision saw them
    fresh = [example] + [draw(1000 + i) for i in range(args.fresh - 1)]
    every = contenders(model, example, held_out, test, args, os.path.join(args.log_dir, kind))
    built = [c for c in every if c.model is not None]
    measured = measure(built, fresh, test, args.rounds, args.seconds)
    ok = all(r.error <= (1e-2 if "int8" in r.name else 1e-4) for r in measured if r.name.startswith("ours"))
    title = (f"TorchRec {type(model).__name__}, batch {args.batch}: a cycle of {len(fresh)} fresh batches, median "
             f"of {args.rounds} interleaved rounds")
    return table(title, measured, [c for c in every if c.model is None], args.batch, kind == "dcn"), ok


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", nargs="+", choices=sorted(MODELS), default=["dlrm", "dcn"])
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--max-rows", type=int, default=None,
                   help="cap on a table's rows (default: 200,000 for dlrm, 1,000,000 for dcn)")
    add_run_options(p, "logs/local/torchrec")
    p.add_argument("--seconds", type=float, default=0.5, help="timing per contender and round")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile")
    p.add_argument("--no-pt2e", dest="pt2e", action="store_false", help="skip PyTorch's PT2E int8")
    p.add_argument("--no-ours", dest="ours", action="store_false", help="time the peers only")
    args = p.parse_args(argv)
    if args.batch < 1 or (args.max_rows is not None and args.max_rows < 1):
        p.error("--batch and --max-rows take values >= 1")
    check_run_options(p, args)
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    try:
        import torchrec  # noqa: F401  (installed?)
    except ImportError as err:
        sys.exit(f"torchrec is not installed ({err}): `make tune EXAMPLE=torchrec` installs it, or pip install "
                 "--no-deps the pins of pyproject's `torchrec` extra")
    print(f"malloc: {allocator(args)}")
    t0 = time.perf_counter()
    tables, ok = [], True
    for kind in args.model:
        text, kept = run(kind, args)
        tables.append(text)
        ok &= kept
    print(f"\n== results ({time.perf_counter() - t0:.0f} s in all)\n")
    print("\n\n".join(tables))
    write_summary("\n\n".join(tables), args)
    if not ok:
        sys.exit("ours: outputs differ from eager beyond their bounds on the held-out batches")


if __name__ == "__main__":
    main()
