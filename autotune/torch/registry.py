"""Kernel packages loaded into this process, and which kernel serves a call of a given shape.

A kernel is compiled for some workload fields (its "signature": `TorchBinding.compiled`) and is valid either
for any size along one dimension (`any_size`: the batch is a runtime value of the kernel) or for exactly its
tuned size (`TorchBinding.size`). A call's signature selects the kernels that can run it; its size selects
among them: the exact bucket, else the nearest one, or for fixed-size kernels a plan of chunks, each padded up
to a bucket (and a size above the largest bucket split into chunks of it).

Only TVM's runtime is needed (`autotune.runtime`, tvm_ffi): loading a package never imports the TVM compiler,
except to name this machine's CPU when TVM happens to be installed (CPU kernels tuned for another CPU model are
not loaded: they may use instructions this one lacks).
"""

from __future__ import annotations

import importlib.util
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import search_spaces
from search_spaces.space import Config
from search_spaces.template import TorchBinding

from .. import runtime
from . import callpath
from ..package import read_manifest

__all__ = ["Chunk", "LoadedKernel", "Package", "Registry", "REGISTRY", "StalePackage", "device_key", "load",
           "load_default"]

DEFAULT_ENV = "AUTOTUNE_KERNELS"  # os.pathsep-separated package directories loaded on first use


class StalePackage(ValueError):
    """A package whose kernels were built by other template code than this installation's: their arguments
    and layouts may differ from what the torch ops pass, so they are refused at load, not at a call."""


def _stale(entries: Sequence[dict[str, Any]], bindings: dict[str, tuple[Any, TorchBinding]]) -> list[str]:
    """One line per (op, device kind, package version) whose template_version differs from this code's."""
    from search_spaces.template import is_gpu
    from search_spaces.version import template_version

    out: dict[tuple[str, str, str], str] = {}
    for e in entries:
        op, kind = str(e["op"]), "cuda" if is_gpu(str(e["device"])) else "cpu"
        old, current = str(e.get("template_version") or ""), template_version(bindings[op][0], kind)
        if old != current:
            shown = repr(old) if old else "none (exported before packages recorded it)"
            out.setdefault((op, kind, old), f"{op} on {kind}: package template_version {shown}, this code's "
                                            f"{current!r}")
    return list(out.values())


def _config(raw: dict[str, Any]) -> Config:
    return Config(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in raw.items()))


class LoadedKernel(runtime.BoundKernel):
    """One exported kernel, callable with the template's reference-order tensors for its workload (packing its
    weights once per weight tensor: `runtime.BoundKernel`), and what its operator's binding says it serves."""

    def __init__(self, entry: dict[str, Any], func: Any, package: Path, template: Any, binding: TorchBinding):
        self.op: str = entry["op"]  # as the package names it (a dotted path for an out-of-tree template)
        self.name: str = template.NAME  # the torch op's name: torch.ops.autotune.<name>
        self.device: str = entry["device"]
        super().__init__(template, template.Workload.from_json(entry["workload"]), _config(entry["config"]), func,
                         on_gpu=self.device.startswith("cuda"))
        self.latency_s: float | None = entry.get("latency_s")
        self.speedup_vs_torch: float | None = entry.get("speedup_vs_torch")
        self.file = package / entry["file"]
        self.signature = binding.compiled(self.workload)
        self.size = binding.size(self.workload)
        any_size = binding.any_size
        self.any_size: bool = any_size(self.device) if callable(any_size) else any_size

    def describe(self) -> str:
        speed = f", {self.speedup_vs_torch:.2f}x PyTorch" if self.speedup_vs_torch else ""
        lat = f"{self.latency_s * 1e3:.3f} ms" if self.latency_s else "untimed"
        return f"{self.op} on {self.device} {self.workload.key()} ({lat}{speed})"

    def __repr__(self) -> str:
        return f"LoadedKernel({self.describe()})"


@dataclass(frozen=True)
class Chunk:
    """Rows [start, stop) of a call run by `kernel` (zero-padded up to its tuned size when shorter)."""

    kernel: LoadedKernel
    start: int
    stop: int


@dataclass
class Package:
    """A kernel package loaded into this process: its kernels, and the entries that were not loaded (and why)."""

    path: Path
    manifest: dict[str, Any]
    kernels: list[LoadedKernel] = field(default_factory=list)
    skipped: list[tuple[dict[str, Any], str]] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"{self.path}: {len(self.kernels)} kernels loaded, {len(self.skipped)} skipped"]
        lines += [f"  {k.describe()}" for k in self.kernels]
        lines += [f"  skipped {e['op']} on {e['device']}: {why}" for e, why in self.skipped]
        return "\n".join(lines)


def device_key(device: Any) -> str:
    """The kernel device a tensor's device runs: "cpu", or "cuda:sm_XY" of that GPU."""
    if device.type == "cpu":
        return "cpu"
    if device.type == "cuda":
        return _cuda_key(device.index if device.index is not None else _current_cuda())
    return device.type


def _current_cuda() -> int:
    import torch

    return torch.cuda.current_device()


_CUDA_KEYS: dict[int, str] = {}


def _cuda_key(index: int) -> str:
    if index not in _CUDA_KEYS:
        import torch

        major, minor = torch.cuda.get_device_capability(index)
        _CUDA_KEYS[index] = f"cuda:sm_{major}{minor}"
    return _CUDA_KEYS[index]


def host_cpu() -> str | None:
    """`cpu:<LLVM name>` of this machine when TVM is installed to ask, else None (unknown: trust the package)."""
    if importlib.util.find_spec("tvm") is None:
        return None
    from ..targets import host_cpu as llvm_cpu

    try:
        return f"cpu:{llvm_cpu()}"
    except ImportError:  # a broken or partial TVM install: as if there were none
        return None


class Registry:
    """Every loaded kernel, indexed by (op, device, signature), with the plan for each call size cached."""

    def __init__(self) -> None:
        self.packages: list[Package] = []
        self._by_signature: dict[tuple[str, str, tuple[Any, ...]], list[LoadedKernel]] = {}
        self.plans: dict[tuple[Any, ...], list[Chunk] | None] = {}  # (op, device, signature, size) -> plan;
        #   cleared in place (never rebound): the torch ops read it directly
        self._lock = threading.Lock()

    def add(self, package: Package) -> None:
        with self._lock:
            self.packages.append(package)
            for k in package.kernels:
                dev = "cpu" if k.device.startswith("cpu") else k.device
                bucket = self._by_signature.setdefault((k.name, dev, k.signature), [])
                # a later package's kernel for the same size replaces the earlier one
                bucket[:] = [b for b in bucket if b.size != k.size] + [k]
                bucket.sort(key=lambda b: b.size)
            self.plans.clear()
            callpath.invalidate()  # the compiled call path's recorded calls may name other kernels now

    def clear(self) -> None:
        with self._lock:
            self.packages.clear()
            self._by_signature.clear()
            self.plans.clear()
            callpath.invalidate()

    def kernels(self, op: str, device: str, signature: tuple[Any, ...]) -> list[LoadedKernel]:
        return self._by_signature.get((op, device, signature), [])

    def plan(self, op: str, device: str, signature: tuple[Any, ...], size: int) -> list[Chunk] | None:
        """Chunks that run a call of `size` along the bucketed dimension, or None if no kernel fits."""
        key = (op, device, signature, size)
        try:
            return self.plans[key]
        except KeyError:
            pass
        with self._lock:
            if len(self.plans) > 4096:  # serving traffic brings many batch sizes: keep the cache bounded
                self.plans.clear()
            kernels = self.kernels(op, device, signature)
            self.plans[key] = plan = make_plan(kernels, size, kernels[0].any_size) if kernels else None
        return plan


def make_plan(kernels: Sequence[LoadedKernel], size: int, any_size: bool) -> list[Chunk] | None:
    """The exact bucket; else, for kernels valid at any size, the nearest bucket (ties: the larger); for
    fixed-size kernels, the smallest bucket that holds the call (padded), or chunks of the largest bucket with
    the rest padded up to the smallest bucket that holds it."""
    if not kernels or size < 1:
        return None
    by_size = sorted(kernels, key=lambda k: k.size)
    exact = [k for k in by_size if k.size == size]
    if exact:
        return [Chunk(exact[0], 0, size)]
    if any_size:
        nearest = min(reversed(by_size), key=lambda k: abs(k.size - size))
        return [Chunk(nearest, 0, size)]
    chunks = []
    largest = by_size[-1]
    start = 0
    while size - start > largest.size:
        chunks.append(Chunk(largest, start, start + largest.size))
        start += largest.size
    rest = next(k for k in by_size if k.size >= size - start)
    chunks.append(Chunk(rest, start, size))
    return chunks


REGISTRY = Registry()


def load(path: str | os.PathLike[str], cpu: str | None = None) -> Package:
    """Load a kernel package written by `autotune export` and make its kernels serve `torch.ops.autotune.*`.

    CPU kernels are loaded only if tuned for this machine's CPU model (`cpu` names another to accept, e.g.
    "cpu:sapphirerapids", or "any"); CUDA kernels only where PyTorch sees a GPU. Entries not loaded are listed
    in `Package.skipped`, with the reason. Kernels of a later package replace those of an earlier one for the
    same operator, signature and size. A package whose kernels (those that would load) were built by other
    template code than this installation's (manifest `template_version`) raises StalePackage, naming each op,
    both versions and what to do; nothing of it is loaded.
    """
    import torch

    path = Path(path)
    manifest = read_manifest(path)
    has_cpu = any(str(e.get("device", "")).startswith("cpu") for e in manifest.get("kernels", []))
    want_cpu = cpu if cpu is not None else host_cpu() if has_cpu else None
    cuda = torch.cuda.is_available()
    pkg = Package(path=path, manifest=manifest)
    usable = []
    bindings: dict[str, tuple[Any, TorchBinding]] = {}
    for entry in manifest.get("kernels", []):
        dev = entry.get("device", "")
        why = _bind(str(entry.get("op")), bindings)
        if why is not None:
            pkg.skipped.append((entry, why))
        elif dev.startswith("cpu") and want_cpu not in (None, "any", dev):
            pkg.skipped.append((entry, f"tuned for {dev}, this machine is {want_cpu}"))
        elif dev.startswith("cpu") and _uses_amx(entry) and not runtime.amx_allowed():
            pkg.skipped.append((entry, "compiled for AMX tiles, which this machine (or its Linux) does not offer"))
        elif dev.startswith("cuda") and not cuda:
            pkg.skipped.append((entry, "PyTorch sees no CUDA GPU"))
        elif not (dev.startswith("cpu") or dev.startswith("cuda")):
            pkg.skipped.append((entry, f"unknown device {dev!r}"))
        else:
            usable.append(entry)
    stale = _stale(usable, bindings)
    if stale:
        raise StalePackage(f"{path}: its kernels were built by other template code than this installation's, so "
                           f"they may take other arguments: {'; '.join(stale)}. Export the package again from "
                           f"records of the current code (`autotune export --log LOG --out DIR`; records of older "
                           f"code are stale: tune again with `autotune tune`, or rerun tune_model with the same "
                           f"log_dir), or load it with the autotune version that exported it")
    gpu = [e for e in usable if e["device"].startswith("cuda")]
    if gpu:
        try:
            runtime.load_runtime(str(path / "lib"), cuda=True)
        except runtime.RuntimeUnavailable as err:  # e.g. no libcuda: the CPU kernels still load
            pkg.skipped += [(e, f"TVM's CUDA runtime: {err}") for e in gpu]
            usable = [e for e in usable if e not in gpu]
    if usable:
        runtime.load_runtime(str(path / "lib"), cuda=False)
    for entry in usable:
        func = runtime.load_function(str(path / entry["file"]))
        pkg.kernels.append(LoadedKernel(entry, func, path, *bindings[entry["op"]]))
    if pkg.skipped:
        warnings.warn(f"autotune: {len(pkg.skipped)} of {len(manifest.get('kernels', []))} kernels in {path} not "
                      f"loaded: " + "; ".join(f"{e.get('op')} on {e.get('device')}: {why}" for e, why in pkg.skipped),
                      stacklevel=2)
    REGISTRY.add(pkg)
    return pkg


def _uses_amx(entry: dict[str, Any]) -> bool:
    """Whether a CPU kernel runs AMX tile instructions (its config's intrinsic: qmatmul's int8 tiles, the fused
    embedding_interaction's bf16 ones), which fault on a machine without them or a Linux that does not grant the
    tile data."""
    return (entry.get("config") or {}).get("intrinsic") == "amx"


_register_op: Callable[[Any], TorchBinding | None] | None = None  # ops.register, handed in by on_register


def on_register(register: Callable[[Any], TorchBinding | None]) -> None:
    """How `load` makes the torch op of a package's template: ops hands its `register` in on import, so that
    the ops import the registry and the registry never imports the ops."""
    global _register_op
    _register_op = register


def _bind(op: str, bindings: dict[str, tuple[Any, TorchBinding]]) -> str | None:
    """Register the torch op of a package entry's template (into `bindings`), or say why there is none."""
    if op in bindings:
        return None
    try:
        template = search_spaces.get(op)
    except (search_spaces.UnknownOperator, ImportError) as err:
        return f"unknown operator: {err}"
    assert _register_op is not None, "autotune.torch.ops is imported (by autotune.torch) before any load"
    binding = _register_op(template)
    if binding is None:
        return "no PyTorch operator for it"
    bindings[op] = (template, binding)
    return None


_DEFAULT_LOADED = False


def load_default() -> list[Package]:
    """Load the packages named by $AUTOTUNE_KERNELS (directories separated by os.pathsep), once per process.

    The operators call this before their first dispatch, so setting the variable is enough to use a package.
    """
    global _DEFAULT_LOADED
    if _DEFAULT_LOADED:
        return []
    _DEFAULT_LOADED = True
    return [load(p) for p in os.environ.get(DEFAULT_ENV, "").split(os.pathsep) if p.strip()]
