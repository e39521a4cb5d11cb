"""A Criteo-shaped DLRM compiled whole by `autotune.torch.tune_model`, against what PyTorch itself offers.

The model is plain PyTorch written as facebookresearch/dlrm writes it (nn.EmbeddingBag per sparse feature,
nn.Linear + nn.ReLU MLPs, and DLRM's own `interact_features`): nothing in it names this project. For each
`--pooling N` (indices per bag: 1 is Criteo's one-hot features, 8 a multi-hot model) the script
  1. builds the model: 26 tables with the Criteo Kaggle cardinalities capped at --max-rows, dim 64, bottom MLP
     13-512-256-64, top MLP 415-512-256-1, batch --batch;
  2. builds every contender: eager; torch.compile and torch.compile(mode="max-autotune") (Inductor, freezing);
     PyTorch's own int8, PT2E with torchao's X86InductorQuantizer (static int8 calibrated on the example
     batch) then torch.compile with freezing (needs the optional `torchao`: `pip install --no-deps
     torchao==0.18.0`; without it the row is skipped, saying so); ours fp32-exact and ours int8, each a
     `tune_model` call (logs in --log-dir: a second run resumes and tunes nothing already tuned) held to its
     default accuracy contract on --held-out batches drawn like the example;
  3. times them all in one process, interleaved rounds, medians, on a cycle of --fresh batches drawn like the
     example (as a model meets them: each batch gathers rows the last one did not); with --repeated also on the
     example batch repeated (its rows stay in cache, which no model's next batch finds);
  4. prints one table per pooling: ms, x eager, and max |out - eager| on the held-out batches.

    python examples/dlrm.py [--pooling 1 8] [--batch 2048] [--trials 8] [--log-dir logs/local/dlrm]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import nn

# The Criteo Kaggle (Display Advertising Challenge) cardinalities of the 26 categorical features, as DLRM's
# data loader counts them.
CRITEO_KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
                      5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
DENSE = 13
DIM = 64
TORCHAO = "torchao==0.18.0"  # the version this example was written against (torch 2.13)

Batch = tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]


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


def make_batch(model: DLRM, batch: int, pooling: tuple[int, int], seed: int = 0) -> Batch:
    """Dense features and, per table, Zipf-popular indices (as click logs are) in bags of `pooling` indices."""
    rng = np.random.default_rng(seed)
    dense = torch.from_numpy(rng.standard_normal((batch, DENSE)).astype(np.float32))
    indices, offsets = [], []
    for emb in model.embeddings:
        sizes = rng.integers(pooling[0], pooling[1] + 1, size=batch)
        offsets.append(torch.from_numpy(np.concatenate([[0], np.cumsum(sizes)[:-1]])).long())
        rows = emb.num_embeddings
        hot = (rng.zipf(1.1, size=int(sizes.sum())) - 1) % rows
        perm = np.random.default_rng(rows).permutation(rows)  # hot rows scattered over the table, the same
        indices.append(torch.from_numpy(perm[hot]).long())  # in every batch (a table's popular rows stay so)
    return dense, indices, offsets


# ---- contenders ---------------------------------------------------------------------------------------------
@dataclass
class Contender:
    """One way to run the model: built (with its build time), or skipped with the reason."""

    name: str
    model: Callable[..., Any] | None = None
    build_s: float = 0.0
    skipped: str = ""
    note: str = ""  # e.g. the layers tune_model's contract kept in bf16 or fp32


def _built(name: str, build: Callable[[], Callable[..., Any]]) -> Contender:
    """`build()`, timed; a failure skips the contender with its error."""
    t0 = time.perf_counter()
    try:
        model = build()
    except Exception as err:  # noqa: BLE001 -- a peer that fails to build is reported, not fatal
        return Contender(name, skipped=f"failed to build: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
    return Contender(name, model, time.perf_counter() - t0)


def frozen_compile(model: nn.Module, example: Batch, mode: str | None = None) -> Callable[..., Any]:
    """torch.compile with Inductor's freezing (weights folded in as constants: the inference setting), compiled
    by a first call on the example batch in inference mode, as it is then called (the batches keep its shapes,
    so nothing compiles again)."""
    import torch._inductor.config as inductor

    fn = torch.compile(model, mode=mode, fullgraph=True)
    with inductor.patch(freezing=True), torch.inference_mode():
        fn(*example)
    return fn


def compiled(name: str, model: nn.Module, example: Batch, mode: str | None = None) -> Contender:
    """torch.compile's contender (`frozen_compile`), or why it did not build."""
    return _built(name, lambda: frozen_compile(model, example, mode))


PT2E = "PyTorch int8 (PT2E + X86InductorQuantizer, torch.compile)"


def pt2e_int8(model: nn.Module, example: Batch) -> Contender:
    """PyTorch's own int8 for x86 CPUs: PT2E (torch.export, torchao's X86InductorQuantizer with its default
    config: static int8 activations calibrated on the example batch, int8 weights per channel), then
    torch.compile with freezing, which lowers the quantized patterns to oneDNN's int8 kernels. Skipped, saying
    how to install it, without torchao."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as xiq
    except ImportError as err:
        return Contender(PT2E, skipped=f"torchao is not installed ({err}): pip install --no-deps {TORCHAO}")

    def build() -> Callable[..., Any]:
        quantizer = xiq.X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(torch.export.export(model, example).module(), quantizer)
        with torch.no_grad():
            prepared(*example)  # calibration
        return frozen_compile(convert_pt2e(prepared), example)

    return _built(PT2E, build)


def ours(name: str, model: nn.Module, example: Batch, held_out: Sequence[Batch], quantize: bool,
         args: argparse.Namespace, test: Sequence[Batch] = ()) -> Contender:
    """tune_model's rewritten model, held to its default accuracy contract on the held-out (validation) batches;
    `test`: batches no decision sees, whose error its report gives."""
    import autotune.torch as at

    t0 = time.perf_counter()
    optimized, report = at.tune_model(model, example, log_dir=args.log_dir, trials=args.trials, quantize=quantize,
                                      check_inputs=list(held_out), test_inputs=list(test) or None,
                                      timing_batches=args.fresh,
                                      budget=args.budget, retune=args.retune)
    print(f"\n== {name}: tune_model(quantize={quantize}) in {time.perf_counter() - t0:.0f} s\n{report}")
    layers = report.accuracy.layers if report.accuracy else []
    return Contender(name, optimized, time.perf_counter() - t0, note=finer_than_int8(layers) if quantize else "")


def finer_than_int8(layers: Sequence[Any]) -> str:
    """The report's layers finer than int8, in brief: Linears by module, tables counted ("bf16: top.2, cross (x6);
    fp16 rows: 26 tables; fp32: top.4, 2 tables"). The 16-bit rung runs tables in fp16 rows, Linears in bf16."""
    parts: dict[str, list[str]] = {"bf16": [], "fp16 rows": [], "fp32": []}
    for precision in ("bf16", "fp32"):
        at = [layer for layer in layers if layer.precision == precision]
        tables = sum("table" in layer.what for layer in at)
        linears = [layer.where.split(",")[0] for layer in at if "table" not in layer.what]
        parts[precision] += [f"{name} (x{linears.count(name)})" if linears.count(name) > 1 else name
                             for name in dict.fromkeys(linears)]
        parts["fp16 rows" if precision == "bf16" else "fp32"] += [f"{tables} table{'s' * (tables > 1)}"] * bool(tables)
    return "; ".join(f"{label}: {', '.join(items)}" for label, items in parts.items() if items)


def contenders(model: nn.Module, example: Batch, held_out: Sequence[Batch], args: argparse.Namespace,
               test: Sequence[Batch] = ()) -> list[Contender]:
    """Every contender, in table order (skipped ones say why)."""
    out = [Contender("eager", model)]
    skip = "skipped (--no-compile)"
    out.append(compiled("torch.compile", model, example) if args.compile else Contender("torch.compile", skipped=skip))
    name = 'torch.compile(mode="max-autotune")'
    out.append(compiled(name, model, example, "max-autotune") if args.compile and args.max_autotune
               else Contender(name, skipped=skip if not args.compile else "skipped (--no-max-autotune)"))
    out.append(pt2e_int8(model, example) if args.pt2e else Contender(PT2E, skipped="skipped (--no-pt2e)"))
    out.append(ours("ours fp32-exact", model, example, held_out, False, args, test))
    out.append(ours("ours int8", model, example, held_out, True, args, test))
    return out


# ---- measurement --------------------------------------------------------------------------------------------
@dataclass
class Row:
    """A built contender's figures."""

    name: str
    fresh_s: float  # median seconds per call over the cycle of fresh batches
    repeated_s: float | None  # ... over the example batch repeated (None: not timed, `--repeated` not given)
    error: float  # max |out - eager| over the held-out batches
    build_s: float
    note: str = ""


def max_error(model: Callable[..., Any], batches: Sequence[Batch], eager: Sequence[torch.Tensor]) -> float:
    with torch.inference_mode():
        return max(float((model(*b) - ref).abs().max()) for b, ref in zip(batches, eager))


def cycled(model: Callable[..., Any], batches: Sequence[Batch]) -> Callable[[], Any]:
    """A call of `model` on the next of `batches` each time."""
    it = itertools.cycle(batches)
    return lambda: model(*next(it))


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, seconds: float) -> dict[str, float]:
    """Per contender, the median over rounds; contenders interleaved so a busy machine's drift hits all alike."""
    from autotune.bench import median_seconds

    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(median_seconds(fn, seconds))
    return {name: statistics.median(t) for name, t in times.items()}


def measure(built: Sequence[Contender], fresh: Sequence[Batch], held_out: Sequence[Batch],
            rounds: int, seconds: float, repeated: bool = False) -> list[Row]:
    """Each built contender's latency on the fresh cycle and, where `repeated`, on the first batch repeated (all
    interleaved in one loop), and its held-out error."""
    eager = built[0].model
    assert eager is not None
    with torch.inference_mode():
        refs = [eager(*b) for b in held_out]
    fns: dict[str, Callable[[], Any]] = {}
    for c in built:
        assert c.model is not None
        fns[f"fresh {c.name}"] = cycled(c.model, fresh)
        if repeated:
            fns[f"repeated {c.name}"] = cycled(c.model, fresh[:1])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a peer's first-call warnings were printed when it was built
        times = interleaved(fns, rounds, seconds)
    return [Row(c.name, times[f"fresh {c.name}"], times.get(f"repeated {c.name}"), max_error(c.model, held_out, refs),
                c.build_s, c.note) for c in built if c.model is not None]


def table(title: str, rows: Sequence[Row], skipped: Sequence[Contender]) -> str:
    """The markdown table of the rows (x eager against the first row, eager; the repeated regime's columns where
    it was timed), then a line per skipped peer."""
    eager = rows[0]
    repeated = eager.repeated_s is not None
    columns = ["fresh ms", "x eager", *(["repeated ms", "x eager"] * repeated),
               "max \\|out - eager\\| (test batches)", "build s"]
    lines = [f"### {title}", "", "| contender | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for r in rows:
        name = r.name + (f" ({r.note})" if r.note else "")
        again = (f" {r.repeated_s * 1e3:.2f} | {eager.repeated_s / r.repeated_s:.2f} |"
                 if repeated and r.repeated_s is not None and eager.repeated_s is not None else "")
        lines.append(f"| {name} | {r.fresh_s * 1e3:.2f} | {eager.fresh_s / r.fresh_s:.2f} |{again} {r.error:.1e} "
                     f"| {r.build_s:.0f} |")
    lines += [f"- {c.name}: {c.skipped}" for c in skipped]
    return "\n".join(lines)


def summary(tables: dict[int, tuple[Sequence[Row], Sequence[Contender]]]) -> str:
    """One markdown table over the poolings (the README's): each contender's fresh-batch ms and x eager per
    pooling, its max |out - eager| on the test batches per pooling, and notes (the contract's precision moves)."""
    names = list(dict.fromkeys(r.name for rows, _ in tables.values() for r in rows))
    by = {p: {r.name: r for r in rows} for p, (rows, _) in tables.items()}
    per = lambda p: f"{p} per bag"  # noqa: E731
    columns = ["contender", *(f"{per(p)}, ms | x eager" for p in tables),
               f"max \\|out - eager\\| test ({' / '.join(str(p) for p in tables)})"]
    lines = ["| " + " | ".join(columns) + " |", "|---" * (2 * len(tables) + 2) + "|"]
    for name in names:
        cells, notes = [], []
        for p, rows in by.items():
            r, eager = rows.get(name), next(iter(rows.values()))
            cells.append(f"{r.fresh_s * 1e3:.2f} | {eager.fresh_s / r.fresh_s:.2f}" if r else "- | -")
            if r and r.note:
                notes.append(f"{per(p)}: {r.note}" if len(tables) > 1 else r.note)
        errors = " / ".join(f"{by[p][name].error:.1e}" if name in by[p] else "-" for p in tables)
        label = name + (f" ({'; '.join(notes)})" if notes else "")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {errors} |")
    skipped = {c.name: c.skipped for _, skip in tables.values() for c in skip}
    lines += [""] * bool(skipped) + [f"- {n}: {why}" for n, why in skipped.items()]
    return "\n".join(lines)


# ---- per-stage breakdown (--stages) -------------------------------------------------------------------------
STAGES = ("embeddings", "interaction", "bottom", "top")


def by_stage(per_module: dict[str, float]) -> dict[str, float]:
    """Seconds per stage from `autotune.torch.profiling.profile`'s seconds per module path."""
    out = dict.fromkeys(STAGES, 0.0)
    out["other"] = 0.0
    for path, seconds in per_module.items():
        head = path.split(".")[0] if path else ""
        out[head if head in out else "other"] += seconds
    return out


def print_stages(model: nn.Module, built: Sequence[Contender], example: Batch) -> None:
    """Each node of eager and of ours timed alone on the example batch, summed per stage."""
    from autotune.torch.graph import capture
    from autotune.torch.profiling import profile

    mine = {c.name: c.model for c in built if c.name.startswith("ours") and c.model is not None}
    print("\n== per stage (ms; each node timed alone on the example batch, so the sums exceed the latencies)")
    with torch.inference_mode():
        stages = {"eager": by_stage(profile(capture(model, example), example))}
        stages.update({n: by_stage(profile(m, example)) for n, m in mine.items()})  # type: ignore[arg-type]
    print(f"  {'stage':<12s}" + "".join(f"{n:>18s}" for n in stages))
    for stage in (*STAGES, "other"):
        print(f"  {stage:<12s}" + "".join(f"{stages[n][stage] * 1e3:18.3f}" for n in stages))


# ---- main ---------------------------------------------------------------------------------------------------
def add_run_options(p: argparse.ArgumentParser, log_dir: str) -> None:
    """The options of tune_model's calls and of the timing, shared with examples/torchrec_dlrm.py."""
    p.add_argument("--trials", type=int, default=8, help="configs per task (with --budget: at most)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds of tuning per tune_model call, spent where the model's time goes (make tune's)")
    p.add_argument("--retune", action="store_true", help="tune tasks the shipped records cover, too")
    p.add_argument("--log-dir", default=log_dir)
    p.add_argument("--held-out", type=int, default=2,
                   help="validation batches (tune_model's contract decides on them) and as many test batches (the "
                        "error column: no decision saw them)")
    p.add_argument("--fresh", type=int, default=8, help="batches in the fresh cycle (tune_model's timing_batches)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    p.add_argument("--system-allocator", action="store_true",
                   help="leave malloc as the process has it (default: freed memory kept for every contender alike, "
                        "autotune.allocator)")


def allocator(args: argparse.Namespace) -> str:
    """Keep freed memory in the process (autotune.allocator: every contender's activations reuse pages already
    touched), unless --system-allocator; what was done, for the run's header. Before any model is built."""
    from autotune.allocator import keep_freed_memory

    return "as the process has it (--system-allocator)" if args.system_allocator else keep_freed_memory()


def check_run_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.held_out < 1 or args.fresh < 1 or args.trials < 1 or args.rounds < 1:
        p.error("--held-out, --fresh, --trials and --rounds take values >= 1")
    if args.budget is not None and not args.budget > 0:
        p.error("--budget takes seconds > 0")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pooling", type=int, nargs="+", default=[1, 8],
                   help="indices per bag, one table per value (1: Criteo's one-hot features)")
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--max-rows", type=int, default=200_000, help="cap on a table's rows (to fit this machine)")
    add_run_options(p, "logs/local/dlrm")
    p.add_argument("--seconds", type=float, default=0.5, help="timing per contender, regime and round")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip both torch.compile rows")
    p.add_argument("--no-max-autotune", dest="max_autotune", action="store_false",
                   help='skip torch.compile(mode="max-autotune") (it benchmarks GEMM choices while it builds)')
    p.add_argument("--no-pt2e", dest="pt2e", action="store_false", help="skip PyTorch's PT2E int8")
    p.add_argument("--stages", action="store_true", help="also print a per-stage breakdown of eager and ours")
    p.add_argument("--repeated", action="store_true",
                   help="also time each contender on the example batch repeated (its rows stay in cache)")
    args = p.parse_args(argv)
    if min(args.pooling) < 1:
        p.error("--pooling takes values >= 1")
    check_run_options(p, args)
    return args


def run_pooling(model: DLRM, pooling: int, args: argparse.Namespace
                ) -> tuple[str, list[Row], list[Contender], bool]:
    """One pooling's contenders built, measured and tabulated: (the table, its rows, the skipped contenders,
    whether ours kept their bounds)."""
    draw = lambda seed: make_batch(model, args.batch, (pooling, pooling), seed)  # noqa: E731
    example = draw(0)
    held_out = [draw(1 + i) for i in range(args.held_out)]  # validation: tune_model decides on them
    test = [draw(500 + i) for i in range(args.held_out)]  # the error column: no decision saw them
    fresh = [example] + [draw(1000 + i) for i in range(args.fresh - 1)]
    print(f"\n==== {pooling} {'index' if pooling == 1 else 'indices'} per bag")
    every = contenders(model, example, held_out, args, test)
    built = [c for c in every if c.model is not None]
    rows = measure(built, fresh, test, args.rounds, args.seconds, args.repeated)
    if args.stages:
        print_stages(model, built, example)
    ok = all(r.error <= (1e-2 if "int8" in r.name else 1e-4) for r in rows if r.name.startswith("ours"))
    title = (f"{pooling} {'index' if pooling == 1 else 'indices'} per bag, batch {args.batch}: fresh = a cycle of "
             f"{len(fresh)} batches{', repeated = the example batch' if args.repeated else ''}; median of "
             f"{args.rounds} interleaved rounds")
    skipped = [c for c in every if c.model is None]
    return table(title, rows, skipped), rows, skipped, ok


def write_summary(body: str, args: argparse.Namespace) -> None:
    """Print the run's summary stamped with its commit, CPU, date and command, and write it to
    `--log-dir`/summary.md (`python -m autotune.provenance` pastes it into the README)."""
    from autotune.provenance import stamp, stamped
    from autotune.targets import host_cpu

    text = stamped(stamp(f"cpu:{host_cpu()}"), body)
    os.makedirs(args.log_dir, exist_ok=True)
    path = os.path.join(args.log_dir, "summary.md")
    with open(path, "w") as f:
        f.write(text)
    print(f"\n== summary (fresh batches; written to {path})\n\n{text}")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    malloc = allocator(args)
    torch.manual_seed(0)
    rows = tuple(min(r, args.max_rows) for r in CRITEO_KAGGLE_ROWS)
    model = DLRM(rows).eval()
    print(f"DLRM: {len(rows)} tables ({sum(rows):,} rows x {DIM}, {sum(rows) * DIM * 4 / 2**20:.0f} MiB), "
          f"batch {args.batch}, pooling {args.pooling}, threads: PyTorch {torch.get_num_threads()}, malloc: {malloc}")
    tables, measured, ok = [], {}, True
    for pooling in args.pooling:
        text, rows, skipped, kept = run_pooling(model, pooling, args)
        tables.append(text)
        measured[pooling] = (rows, skipped)
        ok &= kept
    print("\n== results (ms per batch; x eager: eager's time / the contender's, in the same regime)\n")
    print("\n\n".join(tables))
    write_summary(summary(measured), args)
    if not ok:
        sys.exit("ours: outputs differ from eager beyond their bounds on the held-out batches")


if __name__ == "__main__":
    main()
