"""A Criteo-shaped DLRM, compiled whole by `autotune.torch.tune_model`, against eager PyTorch and torch.compile.

The model is plain PyTorch written as facebookresearch/dlrm writes it (nn.EmbeddingBag per sparse feature,
nn.Linear + nn.ReLU MLPs, and DLRM's own `interact_features`): nothing in it names this project. The script
  1. builds the model: 26 tables with the Criteo Kaggle cardinalities capped at --max-rows, dim 64, bottom MLP
     13-512-256-64, top MLP 415-512-256-1, one-hot (--hot one) or multi-hot bags (--hot multi);
  2. calls `tune_model` twice on it, fp32-exact (`quantize=False`) and int8 MLPs: each captures the model's graph,
     finds the operators we serve, tunes them (logs in --log-dir: a second run resumes and tunes nothing
     already tuned) and rewrites the graph, keeping each replacement only if it reproduces the model's numbers;
  3. prints, measured in this one run and interleaved: eager, torch.compile(eager), ours fp32, ours int8,
     torch.compile(ours int8), and a per-stage breakdown (embeddings, interaction, each MLP) against eager.

    python examples/dlrm.py [--batch 2048] [--hot one|multi] [--trials 24] [--log-dir logs/local/dlrm]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

# The Criteo Kaggle (Display Advertising Challenge) cardinalities of the 26 categorical features, as DLRM's
# data loader counts them.
CRITEO_KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
                      5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
DENSE = 13
DIM = 64


class Interaction(nn.Module):
    """facebookresearch/dlrm's `interact_features` (dot), as written there: index lists built per call."""

    def __init__(self, self_interaction: bool = False):
        super().__init__()
        self.self_interaction = self_interaction

    def forward(self, x: torch.Tensor, ly: list[torch.Tensor]) -> torch.Tensor:
        (batch_size, d) = x.shape
        T = torch.cat([x] + ly, dim=1).view((batch_size, -1, d))
        Z = torch.bmm(T, torch.transpose(T, 1, 2))
        _, ni, nj = Z.shape
        offset = 1 if self.self_interaction else 0
        li = torch.tensor([i for i in range(ni) for j in range(i + offset)])
        lj = torch.tensor([j for i in range(nj) for j in range(i + offset)])
        Zflat = Z[:, li, lj]
        return torch.cat([x] + [Zflat], dim=1)


def mlp(sizes: list[int], sigmoid_last: bool = False) -> nn.Sequential:
    """DLRM's create_mlp: Linear + ReLU per layer (the top MLP's last layer has no ReLU: a sigmoid follows)."""
    layers: list[nn.Module] = []
    for i, (k, n) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(k, n))
        if not (sigmoid_last and i == len(sizes) - 2):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    def __init__(self, table_rows: tuple[int, ...], dim: int = DIM, dense: int = DENSE,
                 bottom: tuple[int, ...] = (512, 256), top: tuple[int, ...] = (512, 256, 1)):
        super().__init__()
        tables = len(table_rows)
        self.bottom = mlp([dense, *bottom, dim])
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(rows, dim, mode="sum") for rows in table_rows)
        self.interaction = Interaction()
        self.top = mlp([dim + (tables + 1) * tables // 2, *top], sigmoid_last=True)
        with torch.no_grad():  # DLRM's initialisation
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


def make_batch(model: DLRM, batch: int, pooling: tuple[int, int], seed: int = 0
               ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Dense features and, per table, Zipf-popular indices (as click logs are) in bags of `pooling` indices."""
    rng = np.random.default_rng(seed)
    dense = torch.from_numpy(rng.standard_normal((batch, DENSE)).astype(np.float32))
    indices, offsets = [], []
    for emb in model.embeddings:
        sizes = rng.integers(pooling[0], pooling[1] + 1, size=batch)
        offsets.append(torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)[:-1]])).long())
        rows = emb.num_embeddings
        hot = (rng.zipf(1.1, size=int(sizes.sum())) - 1) % rows
        perm = rng.permutation(rows)  # hot rows scattered over the table, not its first lines
        indices.append(torch.from_numpy(perm[hot]).long())
    return dense, indices, offsets


def median_time(fn: Callable[[], Any], seconds: float) -> float:
    from autotune.bench import median_seconds

    return median_seconds(fn, seconds)


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, seconds: float) -> dict[str, float]:
    """Per contender, the median over rounds; contenders interleaved so a busy machine's drift hits all alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(median_time(fn, seconds))
    return {name: statistics.median(t) for name, t in times.items()}


STAGES = ("embeddings", "interaction", "bottom", "top")


def by_stage(per_module: dict[str, float]) -> dict[str, float]:
    """Seconds per stage from `autotune.torch.graph.profile`'s seconds per module path."""
    out = dict.fromkeys(STAGES, 0.0)
    out["other"] = 0.0
    for path, seconds in per_module.items():
        head = path.split(".")[0] if path else ""
        out[head if head in out else "other"] += seconds
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--hot", choices=("one", "multi"), default="one",
                   help="one index per bag (Criteo's one-hot features) or 1-20 per bag (multi-hot)")
    p.add_argument("--max-rows", type=int, default=200_000, help="cap on a table's rows (to fit this machine)")
    p.add_argument("--trials", type=int, default=24, help="tuning budget per task")
    p.add_argument("--log-dir", default="logs/local/dlrm")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (a minute or two here)")
    args = p.parse_args()

    import autotune.torch as at
    from autotune.torch.graph import capture, profile

    torch.manual_seed(0)
    rows = tuple(min(r, args.max_rows) for r in CRITEO_KAGGLE_ROWS)
    model = DLRM(rows).eval()
    pooling = (1, 1) if args.hot == "one" else (1, 20)
    inputs = make_batch(model, args.batch, pooling)
    print(f"DLRM: {len(rows)} tables ({sum(rows):,} rows x {DIM}, {sum(rows) * DIM * 4 / 2**20:.0f} MiB), "
          f"{args.hot}-hot, batch {args.batch}, threads: PyTorch {torch.get_num_threads()}")

    with torch.inference_mode():
        ref = model(*inputs)
    ours: dict[str, nn.Module] = {}
    for name, quantize in (("ours fp32-exact", False), ("ours int8", True)):
        t0 = time.perf_counter()
        ours[name], report = at.tune_model(model, inputs, log_dir=args.log_dir, trials=args.trials,
                                           quantize=quantize)
        print(f"\n== tune_model(quantize={quantize}) in {time.perf_counter() - t0:.0f} s\n{report}")

    contenders: dict[str, nn.Module] = {"eager": model}
    if not args.no_compile:
        contenders["torch.compile(eager)"] = torch.compile(model, fullgraph=True)
    contenders.update(ours)
    if not args.no_compile:
        contenders["torch.compile(ours int8)"] = torch.compile(ours["ours int8"], fullgraph=True)

    print("\n== outputs (click probabilities) against eager, on the example batch")
    failed = False
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore", at.NoTunedKernelWarning)
        for name, m in contenders.items():
            t0 = time.perf_counter()
            err = float((m(*inputs) - ref).abs().max())  # the first call of a compiled model compiles it
            bound = 1e-2 if "int8" in name else 1e-4
            failed |= err > bound
            print(f"  {name:<26s} max |diff| {err:.2e} (bound {bound:.0e})  first call {time.perf_counter() - t0:5.1f} s")

    print(f"\n== end-to-end latency, batch {args.batch}, median of {args.rounds} interleaved rounds")
    with torch.inference_mode():
        times = interleaved({n: (lambda m=m: m(*inputs)) for n, m in contenders.items()}, args.rounds, 1.0)
    for name, t in times.items():
        print(f"  {name:<26s} {t * 1e3:8.2f} ms   {times['eager'] / t:5.2f}x eager"
              + (f"   {times['torch.compile(eager)'] / t:5.2f}x torch.compile(eager)"
                 if "torch.compile(eager)" in times else ""))

    print("\n== per stage (ms; each node timed alone on the example batch, so the sums exceed the latencies above)")
    with torch.inference_mode():
        stages = {"eager": by_stage(profile(capture(model, inputs), inputs))}
        stages.update({n: by_stage(profile(ours[n], inputs)) for n in ours})
    print(f"  {'stage':<12s}" + "".join(f"{n:>18s}" for n in stages) + "".join(f"{'x ' + n[5:]:>14s}" for n in ours))
    for stage in (*STAGES, "other"):
        row = [stages[n][stage] for n in stages]
        gains = [stages["eager"][stage] / stages[n][stage] if stages[n][stage] else float("nan") for n in ours]
        print(f"  {stage:<12s}" + "".join(f"{v * 1e3:18.3f}" for v in row) + "".join(f"{g:14.2f}" for g in gains))
    if failed:
        sys.exit("outputs differ beyond their bounds")


if __name__ == "__main__":
    main()
