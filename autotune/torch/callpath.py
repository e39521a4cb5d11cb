"""The compiled call path of `torch.ops.autotune.*` on the CPU: calls whose decisions can be replayed skip Python.

A Python kernel behind the dispatcher costs tens of microseconds a call before the TVM function runs (boxing
the arguments into Python objects, the checks, the routing, the output's allocation, the DLPack conversion):
more than a one-hot embedding bag's whole kernel. `callpath.cpp` is a C++ kernel at each op's CPU and Autograd
keys. The first call with given argument metadata goes to the Python dispatch (`record` below), which runs the
call as always and, where the op's binding says the call's validity rests on metadata alone
(`TorchBinding.replayable`: the kernel checks the data itself, as the embedding bags' error flag does), says
what it did: the TVM function, and each kernel argument as a view of an op argument, a packed weight (valid
while its weight is the same live tensor, version and address), a fresh output, the error flag or an integer
the metadata fixed (a CPU GEMM's number of tasks). Later calls with the same metadata are built and run in
C++. Anything else goes to the Python kernels as before, which also raise every error (a flagged call is handed
to them, and they find what was wrong).

The extension is compiled once per machine (`runtime.compile_cached`, ~20 s, against this process's torch and
tvm-ffi) by `make install` or on first use. Without a C++ compiler, or with AUTOTUNE_CALLPATH=python, the ops
keep their Python kernels (one warning where compiling failed).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig
import threading
import warnings
from typing import Any, Callable, Sequence

import torch

from .. import runtime

__all__ = ["ENV", "INPUT", "PACKED", "FRESH", "FLAG", "SCALAR", "capture", "enabled", "install", "invalidate", "load",
           "stats"]

ENV = "AUTOTUNE_CALLPATH"  # "compiled" (default) or "python"
INPUT, PACKED, FRESH, FLAG, SCALAR = 0, 1, 2, 3, 4  # the kinds of a kernel argument (callpath.cpp's Kind)
_INT64 = torch.empty(0, dtype=torch.int64)  # a SCALAR argument's dtype, as the spec gives it
_SOURCE = os.path.join(os.path.dirname(__file__), "callpath.cpp")
_MODULE: list[Any] = []  # [module] once loaded, [None] where it cannot be
_LOCK = threading.Lock()


def enabled() -> bool:
    """Whether AUTOTUNE_CALLPATH asks for the compiled path ("compiled", also when unset) or not ("python")."""
    value = os.environ.get(ENV, "").strip().lower() or "compiled"
    if value not in ("compiled", "python"):
        raise ValueError(f"{ENV} must be compiled or python, got {os.environ[ENV]!r}")
    return value == "compiled"


def _command() -> list[str]:
    import tvm_ffi
    from torch.utils import cpp_extension

    ffi = os.path.dirname(tvm_ffi.__file__)
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], os.path.join(ffi, "include")]
    libs = [*cpp_extension.library_paths(), os.path.join(ffi, "lib")]
    return [os.environ.get("CXX", "c++"), "-O2", "-std=c++20", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", "-DTORCH_EXTENSION_NAME=_callpath",
            *(f"-I{i}" for i in includes), *(f"-L{d}" for d in libs), *(f"-Wl,-rpath,{d}" for d in libs),
            # the version strings make a new torch or tvm-ffi build anew (the command is part of the cache key)
            f"-DAUTOTUNE_TORCH={torch.__version__}", f"-DAUTOTUNE_TVM_FFI={tvm_ffi.__version__}",
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python", "-ltvm_ffi"]


def load() -> Any | None:
    """The compiled extension (built on first use), or None where it is disabled or cannot be built."""
    if _MODULE:
        return _MODULE[0]
    with _LOCK:
        if _MODULE:
            return _MODULE[0]
        module = None
        if enabled():
            import subprocess

            try:
                with open(_SOURCE) as f:
                    source = f.read()
                path = runtime.compile_cached("callpath", source, _command(), suffix=".cpp", timeout=600)
                loader = importlib.machinery.ExtensionFileLoader("_callpath", path)
                spec = importlib.util.spec_from_file_location("_callpath", path, loader=loader)
                module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
                loader.exec_module(module)
            except (OSError, ImportError, subprocess.SubprocessError) as err:
                warnings.warn(f"autotune: the torch ops keep their Python call path (~30 us more a call): the "
                              f"compiled one could not be built: {err}; set {ENV}=python to silence this",
                              RuntimeWarning, stacklevel=3)
                module = None
        _MODULE.append(module)
        return module


def install(name: str, impl: Callable[..., Any], record: Callable[..., Any], autograd: Callable[..., Any]) -> bool:
    """Serve `torch.ops.autotune.<name>` at the CPU and Autograd keys with the compiled kernel, which falls back to
    `impl` (the Python dispatch), `record` (the same, saying what it did) and `autograd` (the Python kernel at the
    Autograd key); False where there is no compiled path (the caller registers the Python kernels)."""
    module = load()
    if module is None:
        return False
    module.install(name, impl, record, autograd)
    return True


def invalidate() -> None:
    """Forget every recorded call (kernels were loaded or unloaded: a decision may differ now)."""
    if _MODULE and _MODULE[0] is not None:
        _MODULE[0].invalidate()


def stats(name: str) -> dict[str, int]:
    """Op `name`'s counters: calls replayed in C++ (`replayed`), recorded by the Python dispatch (`recorded`), sent
    to it unrecorded (`python`) or to the Python autograd kernel (`autograd`); plans held (`plans`: replayable,
    `python_plans`: metadata the Python dispatch keeps)."""
    module = load()
    return dict(module.stats(name)) if module is not None else {}


# ---- recording what the Python dispatch did -------------------------------------------------------------
_RECORDING = threading.Lock()  # one recording at a time: it swaps a kernel's function for a recorder


class _Recorder:
    """Stands in for a kernel's TVM function during one recorded call: passes every call through, and keeps the
    arguments of the recording thread's call."""

    def __init__(self, func: Any):
        self.func, self.thread, self.args = func, threading.get_ident(), None

    def __call__(self, *args: Any) -> Any:
        if threading.get_ident() == self.thread:
            self.args = args
        return self.func(*args)


def capture(kernel: Any, run: Callable[[], Any], call: Sequence[Any]) -> tuple[Any, tuple[Any, ...] | None]:
    """Run `run()` (which calls `kernel`, a runtime.BoundKernel, once) and say how to replay it for op arguments
    `call`: (output, spec), spec None where some kernel argument or output is not one of the kinds above."""
    with _RECORDING:
        recorder = kernel.func = _Recorder(kernel.func)
        try:
            out = run()
        finally:
            kernel.func = recorder.func
    if recorder.args is None:
        return out, None
    return out, _spec(kernel, recorder.func, recorder.args, out, call)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes [first, end) a strided tensor's elements occupy."""
    lo = hi = 0
    for size, stride in zip(t.shape, t.stride()):
        if stride >= 0:
            hi += (size - 1) * stride
        else:
            lo += (size - 1) * stride
    return t.data_ptr() + lo * t.element_size(), t.data_ptr() + (hi + 1) * t.element_size()


def _view_of(a: torch.Tensor, call: Sequence[Any]) -> int | None:
    """The op argument `a` is a view of: the argument itself, else the one whose own bytes hold all of `a`'s (not
    merely its storage: two arguments may share one buffer in this call and not in the next of the same
    metadata, which the replay would then read through the wrong one)."""
    first, end = _span(a)
    for i, c in enumerate(call):
        if c is a:
            return i
    for i, c in enumerate(call):
        if isinstance(c, torch.Tensor) and c.device.type == "cpu" and c.numel() and _storage(c) == _storage(a):
            lo, hi = _span(c)
            if lo <= first and end <= hi:
                return i
    return None


def _spec(kernel: Any, func: Any, args: Sequence[Any], out: Any, call: Sequence[Any]) -> tuple[Any, ...] | None:
    if not callable(getattr(func, "__chandle__", None)):  # not a tvm-ffi function (a test's stand-in)
        return None
    packed: list[torch.Tensor] = []
    guards: list[tuple[int, torch.Tensor]] = []
    # packed tensor -> the weights it was packed from (a packing holds while all of them do)
    weights = {id(p): sources for sources, pack in kernel.packings() for p in pack}
    outs = out if isinstance(out, tuple) else (out,)
    if not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    out_storages = {_storage(o) for o in outs}
    flag_at = len(args) - 1 if kernel.flags_errors else -1  # template.py: the error flag is the last argument
    specs: list[tuple[Any, ...]] = []
    for k, a in enumerate(args):
        if isinstance(a, int) and not isinstance(a, bool) and -2**63 <= a < 2**63:  # fixed by the call's metadata
            specs.append((SCALAR, 0, a, [], [], _INT64))
            continue
        if not isinstance(a, torch.Tensor) or a.device.type != "cpu" or a.layout != torch.strided or not a.numel():
            return None
        like = a.new_empty(0)
        shape = (list(a.shape), list(a.stride()), like)
        if k == flag_at:
            specs.append((FLAG, 0, 0, *shape))
            continue
        if id(a) in weights:
            for weight in weights[id(a)]:
                at = next((i for i, c in enumerate(call) if c is weight), None)
                if at is None:  # packed from something the op was not given: not replayable from its arguments
                    return None
                guards.append((at, weight))
            packed.append(a)
            specs.append((PACKED, len(packed) - 1, 0, *shape))
            continue
        source = _view_of(a, call)
        if source is not None:
            specs.append((INPUT, source, a.data_ptr() - call[source].data_ptr(), *shape))
        elif _storage(a) in out_storages and a.storage_offset() == 0 and not any(
                isinstance(c, torch.Tensor) and c.numel() and _storage(c) == _storage(a) for c in call):
            specs.append((FRESH, 0, 0, *shape))
        else:
            return None
    out_specs = []
    for o in outs:
        k = next((k for k, s in enumerate(specs) if s[0] == FRESH and _storage(args[k]) == _storage(o)), None)
        if k is None:
            return None
        out_specs.append((k, o.storage_offset(), list(o.shape), list(o.stride())))
    return func.__chandle__(), specs, out_specs, packed, guards
