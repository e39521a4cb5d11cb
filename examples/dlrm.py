"""A small DLRM on tuned kernels: tune its operators for this machine, export, optimize the model, compare.

The model is plain PyTorch (nn.EmbeddingBag, nn.Linear, nn.ReLU and a 10-line dot interaction, as in
facebookresearch/dlrm). The script
  1. tunes each operator of the model for the local CPU with a small budget (logs under --workdir; a second run
     resumes from them and tunes nothing already tuned),
  2. exports the best kernel of each workload (a shipped pre-tuned record of the same workload and CPU competes,
     as TVM's TopHub) as a package and loads it (`autotune.torch.load`),
  3. swaps the model's modules for tuned ones (`autotune.torch.optimize`) and prints what was swapped,
  4. checks the optimized model against the eager model (int8 MLP layers: a loose tolerance) and against the same
     optimized model running PyTorch's implementations (same int8 arithmetic: a tight one),
  5. prints end-to-end inference latency at --batch: eager vs optimized vs torch.compile of the eager model.

    python examples/dlrm.py [--trials 8] [--batch 2048] [--workdir logs/local/dlrm-example] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import tvm_ffi
from torch import nn

import autotune
import autotune.torch as at
from autotune import records
from autotune.bench import median_seconds
from autotune.package import export
from autotune.targets import resolve
from autotune.task import make_task

DENSE = 13  # Criteo's dense features
DIM = 64
TABLE_ROWS = (100_000,) * 4 + (10_000,) * 8 + (1_000,) * 14  # 26 tables, ~137 MB of fp32 rows
POOLING = (1, 20)  # indices per bag (multi-hot)


class Interaction(nn.Module):
    """DLRM's interact_features (dot, without self-interaction), in plain PyTorch."""

    self_interaction = False

    def forward(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        t = torch.cat([x] + ly, dim=1).view(x.shape[0], -1, x.shape[1])
        z = torch.bmm(t, t.transpose(1, 2))
        li, lj = torch.tril_indices(t.shape[1], t.shape[1], offset=-1, device=x.device)
        return torch.cat([x, z[:, li, lj]], dim=1)


def mlp(sizes: list[int], last_relu: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (k, n) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(k, n))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """Bottom MLP on dense features, one embedding bag per sparse feature, dot interaction, top MLP, sigmoid."""

    def __init__(self, table_rows: tuple[int, ...] = TABLE_ROWS, dim: int = DIM, dense: int = DENSE,
                 bottom: tuple[int, ...] = (512, 256), top: tuple[int, ...] = (512, 256, 1)):
        super().__init__()
        tables = len(table_rows)
        self.bottom = mlp([dense, *bottom, dim], last_relu=True)
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for rows in table_rows)
        self.interaction = Interaction()
        self.top = mlp([dim + tables * (tables + 1) // 2, *top], last_relu=False)  # x and the pairs of T+1 rows
        with torch.no_grad():  # DLRM's initialisation: small embedding rows, Glorot-like MLP weights
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    m.weight.normal_(0, (2 / (m.in_features + m.out_features)) ** 0.5)
                    m.bias.normal_(0, (1 / m.out_features) ** 0.5)
                elif isinstance(m, nn.EmbeddingBag):
                    m.weight.uniform_(-(1 / m.num_embeddings) ** 0.5, (1 / m.num_embeddings) ** 0.5)

    def forward(self, dense: torch.Tensor, indices: list[torch.Tensor], offsets: list[torch.Tensor]) -> torch.Tensor:
        x = self.bottom(dense)
        ly = [emb(i, o) for emb, i, o in zip(self.embeddings, indices, offsets)]
        return torch.sigmoid(self.top(self.interaction(x, ly)))


def make_batch(model: DLRM, batch: int, pooling: tuple[int, int] = POOLING,
               seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Dense features and, per table, uniform random indices in bags of `pooling` (min, max) indices."""
    rng = np.random.default_rng(seed)
    dense = torch.from_numpy(rng.standard_normal((batch, model.bottom[0].in_features)).astype(np.float32))
    indices, offsets = [], []
    for emb in model.embeddings:
        sizes = rng.integers(pooling[0], pooling[1] + 1, size=batch)
        offsets.append(torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)[:-1]])).long())
        indices.append(torch.from_numpy(rng.integers(0, emb.num_embeddings, size=int(sizes.sum()))).long())
    return dense, indices, offsets


def workloads(model: DLRM, batch: int, pooling: tuple[int, int] = POOLING) -> list[tuple[str, dict]]:
    """What the model runs, as tuning workloads. One embedding-bag kernel serves every table (rows and batch are
    runtime values, the largest table is tuned); the int8 matmul is tuned for the wide MLP layers, with the ReLU
    that follows fused (the 13-feature input layer and the 1-wide output layer stay fp32 nn.Linear: nothing to
    gain from int8 there)."""
    first = model.embeddings[0]
    out: list[tuple[str, dict]] = [
        ("embedding_bag", dict(rows=max(e.num_embeddings for e in model.embeddings), dim=first.embedding_dim,
                               batch=batch, pooling=pooling, mode=first.mode)),
        ("interaction", dict(batch=batch, tables=len(model.embeddings), dim=first.embedding_dim)),
    ]
    for seq in (model.bottom, model.top):
        for i, layer in enumerate(seq):
            if isinstance(layer, nn.Linear) and layer.in_features >= 64 and layer.out_features >= 64:
                relu = i + 1 < len(seq) and isinstance(seq[i + 1], nn.ReLU)
                fields = dict(m=batch, k=layer.in_features, n=layer.out_features, bias=True, relu=relu)
                if ("qmatmul", fields) not in out:
                    out.append(("qmatmul", fields))
    return out


def tune_and_export(model: DLRM, workdir: Path, batch: int, trials: int, shipped: bool) -> Path:
    """Tune each workload (resuming from the logs under `workdir`) and export the best kernel of each; with
    `shipped`, the project's pre-tuned records of the same workload and CPU (logs/cpu/) compete too."""
    logs = workdir / "logs"
    best = []
    for op, fields in workloads(model, batch):
        task = make_task(op, "cpu", **fields)
        log = logs / f"{op}.jsonl"
        done = records.for_task(records.load(log), task.op, task.workload_key, task.device.name)
        if len(done) < trials:
            t0 = time.perf_counter()
            autotune.tune(op, "cpu", log=log, trials=trials - len(done), progress=False, **fields)
            print(f"  tuned {op} {fields}: {trials - len(done)} trials in {time.perf_counter() - t0:.0f} s")
        mine = records.best(records.load(log), task.op, task.workload_key, task.device.name)
        if mine is None:
            sys.exit(f"no correct {op} kernel among the trials; see {log}")
        pre = (records.best(records.load_many(records.shipped_logs(op, task.device.name)), task.op,
                            task.workload_key, task.device.name) if shipped else None)
        rec = pre if pre is not None and pre.latency < mine.latency else mine
        best.append(rec)
        print(f"  best {op} {fields}: {rec.latency * 1e3:.3f} ms" + (" (shipped record)" if rec is pre else ""))
    pkg = workdir / "kernels"
    export(best, pkg)
    return pkg


def latencies(fns: dict, rounds: int = 3, min_run_time: float = 1.0) -> dict[str, float]:
    """Per contender, the median over rounds of torch.utils.benchmark's blocked median; contenders interleaved
    in rounds, so that drift on a busy machine hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(median_seconds(fn, min_run_time))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=8, help="tuning budget per operator workload")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--workdir", default="logs/local/dlrm-example")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (it takes a minute here)")
    p.add_argument("--no-shipped", action="store_true",
                   help="export only what this run tuned (by default a shipped record of the same workload and "
                        "CPU in logs/cpu/ is exported when it is faster)")
    p.add_argument("--threads", type=int, help="threads for PyTorch and the TVM kernels when running the model "
                   "(default: every core; tuning always uses every core). On a machine other jobs share, one "
                   "thread each gives steadier figures: a parallel region waits for its slowest thread")
    args = p.parse_args()
    workdir = Path(args.workdir)
    torch.manual_seed(0)

    model = DLRM().eval()
    print(f"1. tuning for {resolve('cpu').name}, {args.trials} trials per workload")
    pkg_dir = tune_and_export(model, workdir, args.batch, args.trials, shipped=not args.no_shipped)
    pkg = at.load(pkg_dir)
    print(f"2. exported and loaded {pkg_dir}: {len(pkg.kernels)} kernels")

    optimized = copy.deepcopy(model)
    report = at.optimize(optimized, pkg, extra={Interaction: at.DotInteraction.from_module})
    print(f"3. {report}")

    if args.threads:  # before this process runs its first kernel: TVM's pool reads it when it starts
        os.environ["TVM_NUM_THREADS"] = str(args.threads)
        torch.set_num_threads(args.threads)
    dense, indices, offsets = make_batch(model, args.batch)
    with torch.inference_mode():
        ref = model(dense, indices, offsets)
        out = optimized(dense, indices, offsets)
        at.REGISTRY.clear()  # the same optimized model on PyTorch's implementations: same int8 arithmetic
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", at.NoTunedKernelWarning)
            same_math = optimized(dense, indices, offsets)
        at.REGISTRY.add(pkg)
    err_eager = float((out - ref).abs().max())
    err_same = float((out - same_math).abs().max())
    # int8 layers: weights and activations rounded to 8 bits, hence the loose tolerance against the fp32 model;
    # against the same int8 model on PyTorch's ops the only difference is fp32 summation order upstream, which
    # can move an activation across an int8 rounding boundary now and then.
    print(f"4. outputs (click probabilities): max |optimized - eager| = {err_eager:.2e} (tolerance 1e-2, int8 MLP "
          f"layers); max |optimized - same model on PyTorch's ops| = {err_same:.2e} (tolerance 1e-3)")
    if err_eager > 1e-2 or err_same > 1e-3:
        sys.exit("outputs differ beyond tolerance")

    tvm_threads = tvm_ffi.get_global_func("runtime.NumThreads")()
    print(f"5. end-to-end inference latency, batch {args.batch}, threads: PyTorch {torch.get_num_threads()}, "
          f"TVM {tvm_threads}")
    contenders = {"eager": model, "optimized": optimized}
    if not args.no_compile:
        for name, m in (("torch.compile(eager)", model), ("torch.compile(optimized)", optimized)):
            t0 = time.perf_counter()
            compiled = torch.compile(m, fullgraph=True)
            with torch.inference_mode():
                diff = float((compiled(dense, indices, offsets) - (ref if m is model else out)).abs().max())
            print(f"   ({name} took {time.perf_counter() - t0:.0f} s to compile; max |compiled - uncompiled| = "
                  f"{diff:.1e})")
            contenders[name] = compiled
    with torch.inference_mode():
        times = latencies({name: (lambda m=m: m(dense, indices, offsets)) for name, m in contenders.items()})
    for name, t in times.items():
        print(f"   {name:<26s} {t * 1e3:8.2f} ms   {times['eager'] / t:5.2f}x eager")


if __name__ == "__main__":
    main()
