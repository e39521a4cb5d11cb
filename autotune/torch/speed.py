"""Whether a replacement pays: its new nodes timed against the model's code they replace, on the example inputs.

A replacement can agree by numbers and still be slower: an int8 Linear (quantize_rows + qmatmul) can lose to
PyTorch's fp32 GEMM at an odd K, and wiring in such losers can make the whole model slower than eager
(benchmarks/WHOLE_MODEL.md). So the rewrite (`graph.rewrite(speed=SpeedCheck())`) times each agreeing match before it
commits it: the match's old nodes and its new nodes, each as a standalone GraphModule fed the example values of
its inputs (a fused match as its whole group: 26 embedding bags against the one batched launch and its views;
an interaction with its stack/cat against the op that reads the embeddings in place), in interleaved rounds so
that drift hits both alike, medians, by the measurement core's timer. The model keeps its code unless the
replacement takes at least `margin` less time.

Each side's calls cycle through the example batch and fresh ones (tune_model's `timing_batches`): timing one
batch over and over keeps the rows it gathers in cache, which a model's next batch does not find.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Sequence

import torch
import torch.fx as fx

__all__ = ["SpeedCheck", "Subgraph", "Timings", "ms", "slower", "subgraph", "time_pair"]

INPUTS = ("placeholder", "get_attr")  # nodes whose values a subgraph takes as inputs, not recomputes


@dataclass(frozen=True)
class SpeedCheck:
    """How a replacement is timed against the code it replaces, and by how much it must win."""

    margin: float = 0.03  # the replacement must take at least this fraction less time
    rounds: int = 3  # interleaved rounds (old, new, old, new, ...); the median of each side counts
    seconds: float = 0.1  # per side per round
    # rounds of tune_model's whole-model checks: a few verdicts between whole models (a fusion kept or not),
    # where a few percent of a model's time decides and a 3-round median moved by as much between two runs
    model_rounds: int = 9
    # a clear verdict needs no more rounds: once `early_rounds` rounds are done and in every one of them the new
    # side took at least `clear` less (or more) time than the margin asks, the timing stops there. A whole-model
    # check that wins or loses by 20-40% (a fusion against its parts) then takes 2 rounds, not 9, a replacement
    # at twice PyTorch's speed 2, not 3; a close verdict still takes them all
    early_rounds: int = 2
    clear: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 <= self.margin < 1.0:
            raise ValueError(f"SpeedCheck.margin must be in [0, 1), got {self.margin!r}")
        for name in ("rounds", "model_rounds", "early_rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"SpeedCheck.{name} must be at least 1, got {getattr(self, name)!r}")
        if not self.seconds > 0:
            raise ValueError(f"SpeedCheck.seconds must be positive, got {self.seconds!r}")
        if not self.clear >= 0:
            raise ValueError(f"SpeedCheck.clear must be >= 0, got {self.clear!r}")

    def decided(self, old: Sequence[float], new: Sequence[float]) -> bool:
        """Whether rounds so far (paired, interleaved) decide the verdict clearly enough to stop timing: at least
        `early_rounds` of them, every one's new/old ratio at least `clear` (relative) below the margin's line, or
        every one above it."""
        if len(old) < self.early_rounds:
            return False
        line = 1.0 - self.margin
        ratios = [n / o for o, n in zip(old, new) if o > 0]
        if len(ratios) < len(old):
            return False
        return all(r <= line * (1.0 - self.clear) for r in ratios) or all(r >= line * (1.0 + self.clear)
                                                                          for r in ratios)

    def for_models(self) -> "SpeedCheck":
        """This check as whole models are timed against each other: `model_rounds` rounds."""
        return dataclasses.replace(self, rounds=self.model_rounds)


class Subgraph:
    """Some of a graph's nodes as a standalone call: `module` (a GraphModule of just those nodes) applied to
    `values`, the example values of `inputs` (every node they read from outside); returns the chosen outputs'
    values. After `cycle_through`, successive calls take the values of successive batches in turn."""

    def __init__(self, module: fx.GraphModule, values: list[Any], inputs: Sequence[fx.Node] = ()):
        self.module = module
        self.values = values
        self.inputs = tuple(inputs)
        self.on_gpu = any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)
        self._cycle: list[list[Any]] = [values]
        self._next = 0

    def cycle_through(self, batches: Sequence[dict[fx.Node, Any]]) -> None:
        """Calls cycle through the example values and, from each of `batches` ({node: value} of one batch),
        the values of `inputs`."""
        self._cycle = [self.values] + [[batch[n] for n in self.inputs] for batch in batches]
        self._next = 0

    def __call__(self) -> tuple[Any, ...]:
        values = self._cycle[self._next]
        self._next = (self._next + 1) % len(self._cycle)
        out = self.module(*values)
        if self.on_gpu:
            torch.cuda.synchronize()  # a call's time is its kernels', not their launch
        return out


def subgraph(gm: fx.GraphModule, nodes: Iterable[fx.Node], outputs: Sequence[fx.Node],
             env: dict[fx.Node, Any]) -> Subgraph:
    """`nodes` (run in graph order) returning `outputs`' values; every other node they read, and their own
    placeholders and get_attrs, is an input holding its value from `env`."""
    inside = {n for n in nodes if n.op not in INPUTS}
    g = fx.Graph()
    copies: dict[fx.Node, fx.Node] = {}
    inputs: list[fx.Node] = []

    def value_of(n: fx.Node) -> fx.Node:
        if n not in copies:
            copies[n] = g.placeholder(f"input_{len(inputs)}")
            inputs.append(n)
        return copies[n]

    for n in gm.graph.nodes:
        if n in inside:
            copies[n] = g.node_copy(n, value_of)
    g.output(tuple(value_of(o) for o in outputs))
    # gm as root: a call_module among `nodes` finds its module
    return Subgraph(fx.GraphModule(gm, g), [env[n] for n in inputs], inputs)


class Timings:
    """The (old, new) seconds of each replacement timed so far in one tune_model call, by what decides them: the
    match (rule, sites, what it does), both sides' code and the dtypes and shapes they are fed, and the kernels
    its tasks run (`kernels(match)`: each task's chosen config). The precision ladder and the whole-model checks
    rewrite the model a dozen times, mostly into the same replacements: each is timed once, and its verdict
    stays the same in every rewrite instead of being drawn again from a noisy timer."""

    def __init__(self, kernels: Callable[[Any], Hashable] = lambda match: ()):
        self._kernels = kernels
        self._seen: dict[Hashable, tuple[float, float]] = {}

    def key(self, match: Any, old: Subgraph, new: Subgraph) -> Hashable:
        return (match.rule, match.what, match.where, tuple(n.name for n in match.nodes), self._kernels(match),
                signature(old), signature(new))

    def get(self, key: Hashable) -> tuple[float, float] | None:
        return self._seen.get(key)

    def put(self, key: Hashable, times: tuple[float, float]) -> None:
        self._seen[key] = times

    def __len__(self) -> int:
        return len(self._seen)


def signature(sub: Subgraph) -> Hashable:
    """A subgraph's code (node names aside: a rewrite's counters differ) and the dtypes and shapes of its inputs."""
    index: dict[fx.Node, int] = {}
    code = []
    for i, n in enumerate(sub.module.graph.nodes):
        index[n] = i
        args = fx.node.map_arg((n.args, n.kwargs), lambda a: f"%{index[a]}")
        code.append((n.op, "" if n.op == "placeholder" else str(n.target), repr(args)))
    return tuple(code), tuple(_meta(v) for v in sub.values)


def _meta(v: Any) -> Hashable:
    if isinstance(v, torch.Tensor):
        return ("tensor", str(v.dtype), tuple(v.shape), str(v.device))
    if isinstance(v, (list, tuple)):
        return tuple(_meta(x) for x in v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return type(v).__name__


def time_pair(old: Callable[[], Any], new: Callable[[], Any], check: SpeedCheck) -> tuple[float, float]:
    """(old, new) median seconds per call over `check.rounds` interleaved rounds of `check.seconds` each, fewer
    where the rounds done already decide clearly (`SpeedCheck.decided`)."""
    from ..bench import median_seconds

    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(check.rounds):
        times[0].append(median_seconds(old, check.seconds))
        times[1].append(median_seconds(new, check.seconds))
        if check.decided(*times):
            break
    return statistics.median(times[0]), statistics.median(times[1])


def slower(old_s: float, new_s: float, check: SpeedCheck) -> str:
    """Why the replacement does not pay ("" when it takes at least `check.margin` less time than the old code)."""
    if new_s <= old_s * (1.0 - check.margin):
        return ""
    return (f"not faster: {ms(new_s)} vs PyTorch {ms(old_s)} on the timed batches (a replacement must take at "
            f"least {check.margin:.0%} less time; tune_model(require_speedup=False) wires it in anyway)")


def ms(seconds: float) -> str:
    """Seconds as milliseconds with 3 significant digits: "11.9 ms", "0.0123 ms"."""
    return f"{seconds * 1e3:.3g} ms"
