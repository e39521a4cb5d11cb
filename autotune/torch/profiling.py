"""Where a captured model's time goes: each node timed on the example inputs (`node_times`: a task's share of
the eager time), and the nodes' times summed by the module that ran them (`profile`, node.meta's
nn_module_stack: "bottom.0", or by top-level module with `depth=1`)."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any, Callable

import torch
import torch.fx as fx

from .capture import flat_inputs, module_path

__all__ = ["node_times", "profile"]


class _Timer(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, sync: Callable[[], None]):
        super().__init__(gm)
        self.sync = sync
        self.times: dict[str, list[float]] = defaultdict(list)

    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("placeholder", "get_attr", "output"):  # no computing of their own
            return super().run_node(n)
        t0 = time.perf_counter()
        out = super().run_node(n)
        self.sync()
        self.times[n.name].append(time.perf_counter() - t0)
        return out


def node_times(gm: fx.GraphModule, example_inputs: Any, runs: int = 5) -> dict[str, float]:
    """{node name: median seconds} of each computing node on the example inputs (inference mode, one warm-up)."""
    flat = flat_inputs(gm, example_inputs)
    on_gpu = any(isinstance(v, torch.Tensor) and v.is_cuda for v in flat)
    timer = _Timer(gm, torch.cuda.synchronize if on_gpu else (lambda: None))
    with torch.inference_mode():
        timer.run(*flat)
        timer.times.clear()
        for _ in range(max(1, runs)):
            timer.run(*flat)
    return {name: statistics.median(t) for name, t in timer.times.items()}


def profile(gm: fx.GraphModule, example_inputs: Any, runs: int = 5, depth: int | None = None) -> dict[str, float]:
    """{module path: median seconds its nodes take} on the example inputs, e.g. {"bottom.0": 1.2e-4, ...};
    `depth=1` groups by top-level module ("bottom", "embeddings", ...); "" is the model's own forward."""
    times = node_times(gm, example_inputs, runs)
    out: dict[str, float] = defaultdict(float)
    for n in gm.graph.nodes:
        if n.name in times:
            path = module_path(n)
            out[".".join(path.split(".")[:depth]) if depth else path] += times[n.name]
    return dict(out)
