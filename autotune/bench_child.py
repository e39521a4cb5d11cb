"""PyTorch's side of `autotune bench`, timed in a process that never imports TVM.

TVM's CPU thread pool keeps its workers spinning for a while after each kernel, so PyTorch timed in the
process that just ran a TVM kernel shares the cores with them and looks slower than it is. Here no TVM pool
exists: this file is run by path (`runpy`), not as `autotune.bench_child`, so `autotune/__init__` is never
imported, and it loads only `search_spaces` (templates import no TVM at module level) and the measurement core
`autotune/runtime.py` (which imports nothing of autotune) by its file path. Its report says whether `tvm` ended
up in `sys.modules` anyway.

Protocol (JSON lines): the parent writes one request {op, workload, seed, timing, torch_threads, sys_path};
the child makes the inputs, prepares the template's baselines and answers {"ready": [names], "tvm_imported"};
then for each line "round" it times every baseline once more and answers {"medians": {name: s},
"tvm_imported"}; at end of input it exits.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable


def load_runtime() -> ModuleType:
    """autotune/runtime.py as a standalone module (importing `autotune.runtime` would run autotune/__init__)."""
    name = "_autotune_runtime_standalone"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("runtime.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def torch_paths(template: Any, w: Any, inputs: tuple[Any, ...]) -> dict[str, Callable[[], Any]]:
    """The template's PyTorch paths for these inputs, prepared (the bench times each; the fastest is PyTorch)."""
    if hasattr(template, "baselines"):
        return template.baselines(w, *inputs)
    return {"torch": lambda: template.reference(w, *inputs)}


def cycled_paths(template: Any, w: Any, sets: tuple[tuple[Any, ...], ...], runtime: ModuleType
                 ) -> dict[str, Callable[[], Any]]:
    """The template's PyTorch paths, each cycling through the timed input sets as the kernels' timings do
    (`runtime.TaskData.calls`): PyTorch gathers new rows too."""
    per_set = [torch_paths(template, w, s) for s in sets]
    return {name: runtime.cycling([paths[name] for paths in per_set]) for name in per_set[0]}


def median_time(run: Callable[[], Any], timing: Any, runtime: ModuleType) -> float:
    """One round's figure for a contender: the median of the measurement core's repeats."""
    return statistics.median(runtime.time_cpu(run, timing))


def main() -> None:
    request = json.loads(sys.stdin.readline())
    sys.path[:0] = [p for p in request["sys_path"] if p not in sys.path]
    import torch

    import search_spaces

    runtime = load_runtime()
    torch.set_num_threads(int(request["torch_threads"]))
    template = search_spaces.get(request["op"])
    w = template.Workload.from_json(request["workload"])
    timing = runtime.Timing(**request["timing"])
    seed = int(request["seed"])
    inputs = template.inputs(w, seed)
    paths = cycled_paths(template, w, runtime.input_sets(template, w, seed, inputs, "cpu"), runtime)

    def reply(**fields: Any) -> None:
        print(json.dumps({**fields, "tvm_imported": "tvm" in sys.modules, "torch_threads": torch.get_num_threads()}),
              flush=True)

    reply(ready=list(paths))
    for line in sys.stdin:
        if line.strip() == "round":
            reply(medians={name: median_time(fn, timing, runtime) for name, fn in paths.items()})


if __name__ == "__main__":
    main()
