"""Running and timing compiled kernels with TVM's runtime alone: no TVM compiler, no `import tvm`.

Needs `apache-tvm-ffi`, PyTorch and TVM's runtime libraries (`libtvm_runtime.so`, and for GPUs
`libtvm_runtime_cuda.so`: a few MB, shipped inside kernel packages). This file imports nothing else of
`autotune`, so a kernel package carries a copy of it: on a GPU machine without the 260 MB compiler it runs
exported kernels and measures candidate batches built elsewhere (`autotune tune --runner offline:DIR`).
It is the one measurement core: the local, offline and RPC runners check and time a candidate with
`check_and_time` on a `BoundKernel`, the call path `autotune.kernel` and the torch ops run, so the latency
recorded for a config is the one a caller sees, and `bench` times kernels the same way.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import glob
import itertools
import math
import os
import statistics
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so")
HARNESS = "harness"  # the error kind of a failure of the measuring machinery, not of the candidate
_LOADED: set[str] = set()


class RuntimeUnavailable(RuntimeError):
    pass


def runtime_loaded() -> bool:
    import tvm_ffi

    return tvm_ffi.get_global_func("runtime.RPCTimeEvaluator", allow_missing=True) is not None


def load_runtime(lib_dir: str | None = None, cuda: bool = False) -> None:
    """Make TVM's runtime available: the one `import tvm` loaded if any, else the copy in `lib_dir`.

    Two copies of the runtime in one process would register everything twice, so a loaded one always wins.
    """
    import tvm_ffi  # loads libtvm_ffi.so, which the runtime libraries link against

    have_cuda = tvm_ffi.get_global_func("ffi.Module.load_from_bytes.cuda", allow_missing=True) is not None
    if runtime_loaded() and (have_cuda or not cuda):
        return
    if lib_dir is None:
        raise RuntimeUnavailable("TVM's runtime is not loaded; give the directory of libtvm_runtime.so")
    ffi_dir = os.path.join(os.path.dirname(tvm_ffi.__file__), "lib")
    ctypes.CDLL(os.path.join(ffi_dir, "libtvm_ffi.so"), ctypes.RTLD_GLOBAL)
    if cuda:  # the CUDA runtime the package carries, so the device's toolkit version does not matter
        for path in sorted(glob.glob(os.path.join(lib_dir, "libcudart.so.*"))):
            ctypes.CDLL(path, ctypes.RTLD_GLOBAL)
    for name in RUNTIME_LIBS[: 2 if cuda else 1]:
        path = os.path.join(lib_dir, name)
        if path in _LOADED or (name == RUNTIME_LIBS[0] and runtime_loaded()):
            continue
        if not os.path.exists(path):
            raise RuntimeUnavailable(f"{path} is missing: the package was exported without TVM's runtime")
        try:
            ctypes.CDLL(path, ctypes.RTLD_GLOBAL)
        except OSError as err:  # e.g. libcuda.so.1 or libcudart.so.13 not found
            raise RuntimeUnavailable(f"cannot load {name}: {err}") from None
        _LOADED.add(path)


@functools.lru_cache(maxsize=None)
def amx_allowed() -> bool:
    """Ask Linux, once per process, to let its threads use AMX tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)`): without it a kernel's first tile instruction faults. False where the CPU or the
    kernel has no AMX (the request fails) or this is not x86-64 Linux."""
    import platform
    import sys

    if sys.platform != "linux" or platform.machine() != "x86_64":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(158, 0x1023, 18) == 0  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    except (OSError, AttributeError):
        return False


def load_function(path: str, name: str = "main") -> Any:
    """The kernel entry of an exported library (a callable taking torch tensors through DLPack); its parallel
    loops run on PyTorch's OpenMP pool where one is loaded (`share_openmp_pool`). The process may use AMX
    tiles from here on where the CPU has them (`amx_allowed`): a kernel tuned on such a CPU may."""
    import tvm_ffi

    amx_allowed()
    func = tvm_ffi.load_module(path)[name]
    share_openmp_pool(path)
    return func


# ---- one thread pool: TVM's parallel loops on PyTorch's OpenMP workers ------------------------------------
# A CPU kernel's parallel loop calls `TVMBackendParallelLaunch` through a pointer the library exports
# (`__TVMBackendParallelLaunch`, set by the loader). TVM's own pool is a second set of worker threads beside
# PyTorch's OpenMP pool: after each PyTorch op libgomp's workers spin for a while, and a TVM kernel started
# then shares the cores with them, several times slower than alone (benchmarks/MEASUREMENT.md). Pointing
# the library at this launcher runs the loop on libgomp's (already awake) workers instead: one pool, as IPEX's
# kernels run on PyTorch's. Its thread count is PyTorch's (`torch.set_num_threads`); TVM_NUM_THREADS no longer
# applies. AUTOTUNE_PARALLEL=tvm keeps TVM's pool.
_OMP_BRIDGE_SOURCE = r"""
#include <omp.h>
#include <stddef.h>
typedef struct { void* sync_handle; int num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

int autotune_omp_parallel_launch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  int max = omp_get_max_threads(), failed = 0;
  int n = (num_task > 0 && num_task < max) ? num_task : max;
  if (n <= 1 || omp_in_parallel()) {  /* nested in an OpenMP region: run the tasks' work here, as one task */
    TVMParallelGroupEnv env = {NULL, 1};
    return flambda(0, &env, cdata);
  }
#pragma omp parallel num_threads(n) reduction(|: failed)
  {
    TVMParallelGroupEnv env = {NULL, omp_get_num_threads()};
    failed |= flambda(omp_get_thread_num(), &env, cdata) != 0;
  }
  return failed ? -1 : 0;
}

int autotune_omp_parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
#pragma omp barrier
  return 0;
}
"""
PARALLEL_ENV = "AUTOTUNE_PARALLEL"  # "openmp" (default) or "tvm"
_BRIDGE: list[Any] = []  # [(launch address, barrier address)] once built, [None] where it cannot be
_BRIDGE_LOCK = threading.Lock()


def _openmp_loaded() -> bool:
    """Whether libgomp (PyTorch's OpenMP runtime) is loaded in this process; never loads it."""
    try:
        ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
        return True
    except (OSError, AttributeError):  # not loaded, or no RTLD_NOLOAD (not Linux)
        return False


def cache_dir() -> str:
    """Where libraries compiled on this machine are kept ($AUTOTUNE_CACHE, else ~/.cache/autotune)."""
    return os.environ.get("AUTOTUNE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "autotune")


def compile_cached(name: str, source: str, command: Sequence[str], suffix: str = ".c", timeout: float = 300) -> str:
    """The shared library `source` compiles to with `command` (the compiler and its flags; the source file and
    `-o` output go right after the compiler), built once per machine into `cache_dir()` under a name that hashes
    the source and the command, so a changed source or toolchain builds anew. Written by an atomic rename: a
    concurrent process sees no half-written library. Raises OSError or subprocess.SubprocessError where it
    cannot be built."""
    import hashlib
    import subprocess
    import tempfile

    digest = hashlib.sha256("\0".join([source, *command]).encode()).hexdigest()[:16]
    cache = cache_dir()
    lib = os.path.join(cache, f"{name}-{digest}.so")
    if not os.path.exists(lib):
        os.makedirs(cache, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            src, out = os.path.join(tmp, name + suffix), os.path.join(tmp, name + ".so")
            with open(src, "w") as f:
                f.write(source)
            # the source before the flags: libraries named before it would be dropped by --as-needed linkers
            done = subprocess.run([command[0], src, "-o", out, *command[1:]], capture_output=True, text=True,
                                  timeout=timeout)
            if done.returncode:
                errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
                raise subprocess.SubprocessError(f"{command[0]} failed: " + "\n".join(errors[:5])[:2000])
            os.replace(out, lib)
    return lib


def _bridge() -> tuple[int, int] | None:
    """(launch, barrier) addresses of the OpenMP launcher, compiled once per machine into a cache directory
    (it links the libgomp already loaded, PyTorch's); None where no C compiler is available."""
    with _BRIDGE_LOCK:
        if _BRIDGE:
            return _BRIDGE[0]
        import subprocess
        import warnings

        try:
            lib = compile_cached("omp_bridge", _OMP_BRIDGE_SOURCE,
                                 [os.environ.get("CC", "cc"), "-O2", "-shared", "-fPIC", "-fopenmp"], timeout=120)
            handle = ctypes.CDLL(lib)
            _BRIDGE.append(tuple(ctypes.cast(getattr(handle, f"autotune_omp_parallel_{n}"), ctypes.c_void_p).value
                                 for n in ("launch", "barrier")))
        except (OSError, subprocess.SubprocessError) as err:
            warnings.warn(f"autotune: TVM kernels keep TVM's thread pool beside PyTorch's (no OpenMP launcher: "
                          f"{err}); set {PARALLEL_ENV}=tvm to silence this", RuntimeWarning, stacklevel=3)
            _BRIDGE.append(None)
        return _BRIDGE[0]


def parallel_pool() -> str:
    """The pool AUTOTUNE_PARALLEL asks for: "openmp" (also when unset) or "tvm"; anything else is an error."""
    value = os.environ.get(PARALLEL_ENV, "").strip().lower() or "openmp"
    if value not in ("openmp", "tvm"):
        raise ValueError(f"{PARALLEL_ENV} must be openmp or tvm, got {os.environ[PARALLEL_ENV]!r}")
    return value


def parallel_launcher(path: str) -> str | None:
    """Which pool the loaded CPU library `path` runs its parallel loops on: "openmp" (the launcher above),
    "tvm" (TVM's own), or None for a library without parallel loops."""
    try:
        slot = ctypes.c_void_p.in_dll(ctypes.CDLL(path), "__TVMBackendParallelLaunch").value
    except (OSError, ValueError):
        return None
    return "openmp" if _BRIDGE and _BRIDGE[0] is not None and slot == _BRIDGE[0][0] else "tvm"


def share_openmp_pool(path: str) -> bool:
    """Point the loaded CPU library `path` at the OpenMP launcher (see above); whether it now uses it. A library
    without parallel loops, a process without libgomp, or AUTOTUNE_PARALLEL=tvm: left as loaded."""
    if parallel_pool() == "tvm" or not _openmp_loaded():
        return False
    try:
        lib = ctypes.CDLL(path)  # the handle of the library tvm_ffi loaded (same path: not loaded twice)
        slot = ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelLaunch")
    except (OSError, ValueError):  # not a CPU library, or no parallel loop in it
        return False
    bridge = _bridge()
    if bridge is None:
        return False
    slot.value = bridge[0]
    try:
        ctypes.c_void_p.in_dll(lib, "__TVMBackendParallelBarrier").value = bridge[1]
    except ValueError:  # no barrier in this kernel
        pass
    return True


def call(func: Any, args: Sequence[Any], on_gpu: bool) -> None:
    """Run a kernel; on a GPU, on PyTorch's current stream (so it orders with PyTorch's own work)."""
    if on_gpu:
        import tvm_ffi

        with tvm_ffi.use_torch_stream():
            func(*args)
    else:
        func(*args)


@dataclass(frozen=True)
class Timing:
    """How to time a candidate: median of `repeat` measurements, each of >= `number` calls and >= min_repeat_ms,
    on the inputs made with `seed`."""

    number: int = 3
    repeat: int = 5
    min_repeat_ms: float = 50.0
    seed: int = 0
    flush_l2: bool = True  # GPU: overwrite a buffer twice the L2's size before each measured call
    # CPU, local runner: bracket every repeat by repeats of a fixed anchor kernel (the template's default config)
    # and scale it by how much slower than usual the anchor ran around it (`time_anchored`)
    anchor: bool = False


def _version(t: Any) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference-mode tensor has no version counter (and cannot change outside it)
        return -1


class BoundKernel:
    """A compiled kernel bound to its template, workload and config: `bound(*reference-order tensors) -> output`.

    This is the call path every user of a kernel takes (autotune.kernel, the torch ops) and the one the runners
    time, so a recorded latency is what a caller sees. Inputs are not validated here (callers that take user
    tensors check them first). Weights are packed once per weight tensor: found again by the tensor's identity,
    and valid while that tensor is alive (a weak reference) with the version counter, address, shape and dtype
    it was packed with, so an in-place update or a new tensor at a freed address is packed anew.

    A call is the template's `kernel_args` (outputs allocated), the kernel (tvm_ffi converts the torch tensors
    through DLPack's C exchange API, no copy, ~0.2 us each: cheaper than any cache of conversions keyed by
    tensor) and the optional `after_call`, with nothing else per call.
    """

    def __init__(self, template: Any, workload: Any, config: Any, func: Any, on_gpu: bool):
        self.template, self.workload, self.config, self.func, self.on_gpu = template, workload, config, func, on_gpu
        self._positions = tuple(template.WEIGHTS)
        self._kernel_args = template.kernel_args
        self._after = getattr(template, "after_call", None)  # raises what the kernel flagged (template.py)
        self._packs: dict[Any, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}  # id(s) -> (stamps, packed)
        self._lock = threading.Lock()
        if on_gpu:
            import torch

            self._torch = torch

    def pack(self, tensors: Sequence[Any]) -> tuple[Any, ...]:
        """The config's packed weights for these reference-order tensors (made on first sight of a weight)."""
        positions = self._positions
        if not positions:
            return ()
        if len(positions) == 1:  # the usual case, kept short: one weight, keyed by its id
            weights: tuple[Any, ...] = (tensors[positions[0]],)
            key: Any = id(weights[0])
            hit = self._packs.get(key)
            if hit is not None and _same(weights[0], hit[0][0]):
                return hit[1]
        else:
            weights = tuple(tensors[i] for i in positions)
            key = tuple(map(id, weights))
            hit = self._packs.get(key)
            if hit is not None and all(map(_same, weights, hit[0])):
                return hit[1]
        with self._lock:
            packed = tuple(self.template.pack(self.workload, self.config, *weights))
            live = {k: v for k, v in self._packs.items() if all(seen[0]() is not None for seen in v[0])}
            live[key] = (tuple(map(_stamp, weights)), packed)
            self._packs = live  # replaced whole: a concurrent reader sees the old dict or the new one
            return packed

    def packings(self) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
        """(weights, packed tensors) of each packing held; a weight that died since is None."""
        return [(tuple(s[0]() for s in stamps), packed) for stamps, packed in self._packs.values()]

    @property
    def flags_errors(self) -> bool:
        """Whether the kernel's last argument is an error flag that the template's `after_call` reads."""
        return self._after is not None

    def arguments(self, *tensors: Any) -> tuple[Sequence[Any], Any]:
        """The kernel's argument list (outputs allocated) and the output, as `__call__` passes them."""
        return self._kernel_args(self.workload, self.config, self.pack(tensors), *tensors)

    def __call__(self, *tensors: Any) -> Any:
        args, out = self._kernel_args(self.workload, self.config, self.pack(tensors) if self._positions else (),
                                      *tensors)
        if self.on_gpu:  # the outputs' GPU (the first, for a template returning several tensors)
            with self._torch.cuda.device((out[0] if isinstance(out, tuple) else out).device):
                call(self.func, args, on_gpu=True)
        else:
            self.func(*args)
        if self._after is not None:
            self._after(self.workload, args, out)
        return out


def _stamp(t: Any) -> tuple[Any, ...]:
    """What a packed weight must still be for its packing to hold: the same live tensor, version, address,
    shape and dtype."""
    return (weakref.ref(t), _version(t), t.data_ptr(), t.shape, t.dtype)


def _same(t: Any, seen: tuple[Any, ...]) -> bool:
    ref, version, ptr, shape, dtype = seen
    try:
        v = t._version
    except RuntimeError:  # an inference-mode tensor (see _version)
        v = -1
    return ref() is t and v == version and t.data_ptr() == ptr and t.dtype is dtype and t.shape == shape


def time_cpu(run: Callable[[], None], timing: Timing) -> list[float]:
    """Seconds per call, per repeat: each repeat grows its call count until it lasts min_repeat_ms.

    A warm-up as long as one repeat comes first: a kernel's first calls pay for page faults of fresh output
    buffers, the allocator's thresholds settling and clocks ramping up, which a caller's steady state does not
    (a one-call warm-up left a small kernel's first repeats reading twice its latency). It also sizes the
    repeats."""
    number = _warm_up(run, timing)
    costs = []
    for _ in range(timing.repeat):
        cost, number = _one_repeat(run, number, timing)
        costs.append(cost)
    return costs


def _warm_up(run: Callable[[], None], timing: Timing) -> int:
    """Call `run` for one repeat's time; the calls a repeat starts with."""
    warm, t0 = 0, time.perf_counter()
    while warm < 1 or (time.perf_counter() - t0) * 1e3 < timing.min_repeat_ms:
        run()
        warm += 1
    return max(timing.number, warm)


def _one_repeat(run: Callable[[], None], number: int, timing: Timing) -> tuple[float, int]:
    """(seconds per call, calls) of one repeat of >= number calls lasting >= min_repeat_ms."""
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            run()
        elapsed = time.perf_counter() - t0
        if elapsed * 1e3 >= timing.min_repeat_ms or number >= 1 << 20:
            return elapsed / number, number
        number = max(number * 2, int(number * timing.min_repeat_ms / max(elapsed * 1e3, 1e-3) * 1.1))


def time_anchored(run: Callable[[], None], anchor: "Anchor", timing: Timing) -> list[float]:
    """`time_cpu`'s repeats of `run`, each scaled by the anchor's nominal latency over the mean of the anchor
    repeats right before and after it: a shared machine's slow phases (another tenant's memory traffic, a
    descheduled vCPU) slow both kernels alike, so their ratio holds where either latency alone does not
    (benchmarks/MEASUREMENT.md has the spreads, plain and anchored). It costs twice the time: every candidate
    repeat has an anchor repeat beside it. It cannot correct what slows the two unlike (memory-bandwidth
    contention slows a prefetching, bandwidth-bound candidate more than a latency-bound one)."""
    number = _warm_up(run, timing)
    before = anchor.once(timing)
    costs = []
    for _ in range(timing.repeat):
        cost, number = _one_repeat(run, number, timing)
        after = anchor.once(timing)
        costs.append(cost * anchor.nominal / ((before + after) / 2))
        before = after
    return costs


@dataclass
class Anchor:
    """A fixed kernel timed beside every candidate (`time_anchored`) and its nominal latency: the median of
    a calibration's repeats, once per measure worker and task."""

    run: Callable[[], None]
    nominal: float = math.nan
    number: int = 1  # calls per repeat

    def once(self, timing: Timing) -> float:
        cost, self.number = _one_repeat(self.run, self.number, timing)
        return cost

    def calibrate(self, timing: Timing, repeats: int = 20, nominal: float | None = None) -> "Anchor":
        """Warm up and take the nominal latency: `nominal` if given (a restarted worker keeps its runner's
        scale), else the median of `repeats` repeats."""
        self.number = _warm_up(self.run, timing)
        self.nominal = nominal if nominal is not None else statistics.median(self.once(timing) for _ in range(repeats))
        return self


GRAPH_CALLS = (20, 200)  # calls captured in one cold graph: at least, at most (Timing.number within)


def time_cuda(run: Callable[[], None], timing: Timing, l2_bytes: int) -> list[float]:
    """Seconds per call, per repeat, on a GPU; L2 flushed before every call (cold-cache tables).

    The calls are captured in a CUDA graph (`time_cuda_graph`), so a kernel of a few microseconds is not timed
    with its launch; where `run` cannot be captured (it synchronizes, or copies from the host), each call is
    bracketed by events instead (`time_cuda_events`). Either way the flush's own time is excluded."""
    import torch

    flush = torch.empty(max(2 * l2_bytes, 1 << 20), dtype=torch.uint8, device="cuda") if timing.flush_l2 else None
    warm_up_cuda(run)
    calls = min(max(timing.number, GRAPH_CALLS[0]), GRAPH_CALLS[1])
    try:
        return time_cuda_graph(run, calls, timing.repeat, flush)
    except Exception:  # noqa: BLE001 -- not capturable: eager calls, if the failed capture left the context usable
        torch.cuda.synchronize()
        return time_cuda_events(run, timing, flush)


def warm_up_cuda(run: Callable[[], None], calls: int = 3) -> None:
    """A few calls on a side stream, as graph capture wants (module load, the driver's caches), then synced."""
    import torch

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(calls):
            run()
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()


def time_cuda_graph(run: Callable[[], None], calls: int, repeats: int, flush: Any = None) -> list[float]:
    """`calls` calls of `run` captured in one CUDA graph, each after `flush.zero_()` (if given) and bracketed by
    event nodes, so neither the launch nor the flush is timed; the graph replayed `repeats` times: per replay,
    the mean seconds per call. Raises where `run` cannot be captured (warm it up first)."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True, external=True) for _ in range(calls)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        for start, end in zip(starts, ends):
            if flush is not None:
                flush.zero_()
            start.record()
            run()
            end.record()
    costs = []
    for _ in range(repeats):
        graph.replay()
        torch.cuda.synchronize()
        costs.append(statistics.fmean(s.elapsed_time(e) for s, e in zip(starts, ends)) / 1e3)
    return costs


def time_cuda_events(run: Callable[[], None], timing: Timing, flush: Any = None) -> list[float]:
    """Seconds per call, per repeat, each eager call bracketed by CUDA events (its launch included), after
    `flush.zero_()` (if given); a repeat is at least `timing.number` calls and `timing.min_repeat_ms`."""
    import torch

    costs = []
    for _ in range(timing.repeat):
        events = []
        budget = time.perf_counter() + timing.min_repeat_ms / 1e3
        n = 0
        while n < timing.number or time.perf_counter() < budget:
            if flush is not None:
                flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            events.append((start, end))
            n += 1
            if n >= 10_000:
                break
        torch.cuda.synchronize()
        costs.append(statistics.fmean(s.elapsed_time(e) for s, e in events) / 1e3)
    return costs


# ---- judging a kernel's output: the one rule -------------------------------------------------------------
# Every place that judges a kernel (the runners' check before timing, `autotune check`, bench, the contract
# test) calls `judge` with what `expected` made. A template's REFERENCE_PRECISION says what it is judged against:
#   "native" (the default): PyTorch's output in its own dtype, by torch.isclose's rule
#       |out - ref| <= atol + rtol * |ref|. For exact and integer results (rows quantized bit for bit, int32
#       accumulations, one rounding step) and for any template that names no rule.
#   "float64": the reference run on the inputs cast to float64, within atol + rtol * magnitude, the magnitude
#       being the reference run on the inputs' absolute values. For a reference that sums products of its
#       floating-point inputs (integer inputs being indices or counts) that is each output's sum of |terms|,
#       which bounds the rounding of any summation order, also where the terms cancel and the output is near
#       zero: a bound relative to the output fails good kernels there. PyTorch's own output is judged by the
#       same bound (`Judgement.pytorch_ratio`), so a bound PyTorch breaks shows.
Tolerance = float | Sequence[float]  # one for every output, or one per output of an op returning several
NATIVE, FLOAT64 = "native", "float64"
PRECISIONS = (NATIVE, FLOAT64)


def nth_tolerance(tol: Tolerance, i: int) -> float:
    """Output `i`'s rtol or atol from a template's `tolerance`: the same for all outputs, or one each."""
    return float(tol) if isinstance(tol, (int, float)) else float(tol[i])


def reference_precision(template: Any) -> str:
    """The template's REFERENCE_PRECISION, "native" where it names none (a ValueError for an unknown one)."""
    precision = getattr(template, "REFERENCE_PRECISION", NATIVE)
    if precision not in PRECISIONS:
        raise ValueError(f"{getattr(template, 'NAME', template)}: REFERENCE_PRECISION must be one of "
                         f"{PRECISIONS}, got {precision!r}")
    return precision


@dataclass(frozen=True)
class Float64Reference:
    """An operator's result computed in float64 and the magnitude of the terms that make each output."""

    value: Any  # a tensor, or a tuple of them for an op returning several
    magnitude: Any  # the same structure, >= 0


def float64_reference(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Float64Reference:
    """`fn` run on its arguments with every floating-point tensor cast to float64 (the value), and on their
    absolute values (the magnitude: for a sum of products of those tensors, each output's sum of |terms|).
    Tensors in lists, tuples and dicts are cast too; integer tensors (indices, offsets) are passed as given."""
    return _float64_reference(fn, args, kwargs, args)


def _float64_reference(fn: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any],
                       magnitude_args: Sequence[Any]) -> Float64Reference:
    value = fn(*_floats(args, _to_float64), **_floats(kwargs, _to_float64))
    magnitude = fn(*_floats(magnitude_args, _abs_float64), **_floats(kwargs, _abs_float64))
    return Float64Reference(value, _map_tensors(magnitude, lambda t: t.abs()))


def _to_float64(t: Any) -> Any:
    return t.double()


def _abs_float64(t: Any) -> Any:
    return t.double().abs()


def _floats(x: Any, f: Callable[[Any], Any]) -> Any:
    """`x` with `f` applied to each floating-point tensor in it (through lists, tuples and dicts)."""
    return _map_tensors(x, lambda t: f(t) if t.is_floating_point() else t)


def _map_tensors(x: Any, f: Callable[[Any], Any]) -> Any:
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(v, f) for v in x)
    if isinstance(x, dict):
        return {k: _map_tensors(v, f) for k, v in x.items()}
    return f(x) if hasattr(x, "is_floating_point") else x


@dataclass(frozen=True)
class Expected:
    """What an output is judged against: PyTorch's output, the template's (rtol, atol) and, under the float64
    rule, the float64 reference (None under the native rule)."""

    pytorch: Any
    rtol: Tolerance
    atol: Tolerance
    float64: Float64Reference | None = None

    def nth(self, i: int) -> "Expected":
        """What output `i` of an op returning several tensors is judged against."""
        f64 = self.float64
        return Expected(self.pytorch[i], nth_tolerance(self.rtol, i), nth_tolerance(self.atol, i),
                        None if f64 is None else Float64Reference(f64.value[i], f64.magnitude[i]))


def expected(template: Any, workload: Any, *tensors: Any) -> Expected:
    """What a kernel of `workload` is judged against on these reference-order tensors (`expected_call` of the
    template's reference)."""
    return expected_call(template, workload, functools.partial(template.reference, workload), *tensors)


def expected_call(template: Any, workload: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Expected:
    """What a kernel computing `fn(*args, **kwargs)` is judged against: `fn` (the template's reference, or its
    torch op's PyTorch path) as PyTorch runs it, the template's tolerance for `workload` and, where the
    template's rule is float64, `fn` in float64 (`float64_reference`; its magnitude on the template's
    `magnitude_args` where it has them: values stored as integers, such as int8 rows, as floats)."""
    rtol, atol = template.tolerance(workload)
    f64 = None
    if reference_precision(template) == FLOAT64:
        as_floats = getattr(template, "magnitude_args", None)
        f64 = _float64_reference(fn, args, kwargs, args if as_floats is None else as_floats(workload, args))
    return Expected(fn(*args, **kwargs), rtol, atol, f64)


@dataclass(frozen=True)
class Judgement:
    """The verdict on one output: it passes where `ratio` <= 1 (then `why` is None)."""

    error: float  # largest |out - reference|: the float64 reference under the float64 rule, else PyTorch's
    ratio: float  # largest |out - reference| / bound over the elements
    why: str | None = None  # why it fails: where, the kernel's, float64 and PyTorch's values, and the bound
    pytorch_error: float = 0.0  # PyTorch's own largest error against float64 (0 under the native rule)
    pytorch_ratio: float = 0.0  # ... and its largest error / bound


def judge(out: Any, exp: Expected) -> Judgement:
    """`out` judged by the one rule (see above). An op returning several tensors: each output with its own
    tolerance; the largest error and ratios, and the first failure."""
    if isinstance(exp.pytorch, tuple):
        if not isinstance(out, tuple) or len(out) != len(exp.pytorch):
            return Judgement(0.0, 0.0, f"output is not a tuple of {len(exp.pytorch)} tensors like PyTorch's")
        each = [judge(o, exp.nth(i)) for i, o in enumerate(out)]
        why = next((f"output {i}: {j.why}" for i, j in enumerate(each) if j.why is not None), None)
        return Judgement(max(j.error for j in each), max(j.ratio for j in each), why,
                         max(j.pytorch_error for j in each), max(j.pytorch_ratio for j in each))
    ref = exp.pytorch
    if not hasattr(out, "shape") or tuple(out.shape) != tuple(ref.shape):
        shape = tuple(getattr(out, "shape", ()))
        return Judgement(0.0, 0.0, f"output shape {shape} != PyTorch's {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Judgement(0.0, 0.0, f"output dtype {out.dtype} != PyTorch's {ref.dtype}")
    if out.numel() == 0:
        return Judgement(0.0, 0.0)
    return _judge_values(out.detach(), ref.detach(), exp)


def _judge_values(out: Any, ref: Any, exp: Expected) -> Judgement:
    """`judge` of one non-empty output `out` and PyTorch's `ref`, of one shape and dtype. Computed in float64,
    or in float32 for a float32 (or narrower) output under the native rule, as torch.isclose does."""
    import torch

    rtol, atol, f64 = float(exp.rtol), float(exp.atol), exp.float64
    narrow = f64 is None and out.dtype in (torch.float32, torch.float16, torch.bfloat16)
    o, p = (t.to(torch.float32 if narrow else torch.float64) for t in (out, ref))
    target, scale = (p, p.abs()) if f64 is None else (_as_stored(f64.value, out.dtype), f64.magnitude.double())
    bound = (scale * rtol).add_(atol)
    diff, ratio = _errors(o, target, bound)
    judgement = Judgement(float(diff.max()), float(ratio.max()))
    if f64 is not None:
        pytorch_diff, pytorch_ratio = _errors(p, target, bound)
        judgement = dataclasses.replace(judgement, pytorch_error=float(pytorch_diff.max()),
                                        pytorch_ratio=float(pytorch_ratio.max()))
    if judgement.ratio <= 1.0:
        return judgement
    at = int(ratio.flatten().argmax())
    d, ov, tv, pv, b, m = (float(t.flatten()[at]) for t in (diff, o, target, p, bound, scale))
    values = f"kernel {ov:.6g}, " + ("" if f64 is None else f"float64 {tv:.6g}, ") + f"PyTorch {pv:.6g}"
    scaled = "|PyTorch|" if f64 is None else f"magnitude {m:.6g}"
    why = (f"error {d:.3g} at flat index {at} ({values}; bound {b:.3g} = atol {atol:g} + rtol {rtol:g} x {scaled})"
           f"; max abs error {judgement.error:.3g}")
    return dataclasses.replace(judgement, why=why)


def _as_stored(value: Any, dtype: Any) -> Any:
    """The float64 value as float64, except where it overflows `dtype`: there the infinity a correctly rounded
    output holds."""
    value = value.double()
    if not dtype.is_floating_point:
        return value
    rounded = value.to(dtype).double()
    return value.where(~(rounded.isinf() & value.isfinite()), rounded)


def _errors(o: Any, target: Any, bound: Any) -> tuple[Any, Any]:
    """(|o - target|, |o - target| / bound) elementwise: no error where they are equal (infinities too) or both
    NaN, an infinite one where only one is NaN, an infinite ratio where the bound is zero."""
    import torch

    diff = (o - target).abs_()
    ratio = diff / bound
    if bool(ratio.isfinite().all()):  # the usual case: no NaN, infinity or zero bound anywhere
        return diff, ratio
    inf = float("inf")
    diff = torch.where((o == target) | (o.isnan() & target.isnan()), 0.0, diff.nan_to_num_(nan=inf, posinf=inf))
    ratio = torch.where(diff == 0, 0.0, (diff / bound).nan_to_num_(nan=inf, posinf=inf))
    return diff, ratio


def mismatch(out: Any, exp: Expected) -> str | None:
    """Why `out` fails the rule (`judge`), or None where it passes."""
    return judge(out, exp).why


class TaskData:
    """A task's inputs, reference output and what a candidate's output is judged against (`expected`) on one
    device, made once (a 1M-row table takes a second), and the input sets its timed calls cycle through
    (`input_sets`)."""

    def __init__(self, template: Any, workload: Any, seed: int, device: str):
        import torch

        self.template, self.workload, self.device = template, workload, device
        inputs = template.inputs(workload, seed)
        self.inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else
                            [x.to(device) for x in t] if isinstance(t, (list, tuple)) else t for t in inputs)
        self.expected = expected(template, workload, *self.inputs)
        self.reference = self.expected.pytorch
        self.sets = input_sets(template, workload, seed, self.inputs, device)
        self.anchor: Anchor | None = None  # set by a runner that times anchored (Timing.anchor)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    def bind(self, config: Any, func: Any) -> BoundKernel:
        return BoundKernel(self.template, self.workload, config, func, self.on_gpu)

    def calls(self, fn: Callable[..., Any]) -> Callable[[], Any]:
        """`fn` on the next of the task's input sets at each call: what a timing loop runs."""
        return cycling([functools.partial(fn, *s) for s in self.sets])


def input_sets(template: Any, workload: Any, seed: int, inputs: tuple[Any, ...], device: str
               ) -> tuple[tuple[Any, ...], ...]:
    """The input sets timed calls cycle through: the template's `timed_inputs` on a CPU (its calls must not find
    the previous calls' data in cache where a model's would not), else `inputs` alone (a GPU's L2 is flushed
    before each timed call instead)."""
    make = getattr(template, "timed_inputs", None)
    if make is None or device.startswith("cuda"):
        return (tuple(inputs),)
    sets = tuple(tuple(s) for s in make(workload, seed, tuple(inputs), cpu_cache_bytes()))
    if not sets or len(sets[0]) != len(inputs) or any(a is not b for a, b in zip(sets[0], inputs)):
        raise ValueError(f"{template.__name__}.timed_inputs must return the inputs it was given as its first set")
    return sets


def cycling(calls: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    """One callable that runs the next of `calls` each time (the only one, with no overhead, if there is one)."""
    if len(calls) == 1:
        return calls[0]
    turn = itertools.cycle(calls)
    return lambda: next(turn)()


def cpu_cache_bytes(default: int = 32 << 20) -> int:
    """The size of this machine's largest CPU cache (Linux sysfs: the last level of cpu0), or `default`."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            text = open(path).read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=default)


_DATA: dict[tuple[str, str, int, str], TaskData] = {}


def task_data(template: Any, workload: Any, seed: int, device: str) -> TaskData:
    """TaskData kept in this process for the next candidate of the same task (one task at a time: tables are
    large)."""
    key = (template.__name__, workload.key(), seed, device)
    if key not in _DATA:
        _DATA.clear()
        _DATA[key] = TaskData(template, workload, seed, device)
    return _DATA[key]


def _error(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1][:400] if text else ''}"


def check_and_time(data: TaskData, bound: BoundKernel, timing: Timing,
                   l2_bytes: int = 0) -> tuple[tuple[float, ...], str | None, str | None]:
    """(costs, error_kind, error): call once, compare with the reference, and only then time the same call
    (`bound(*inputs)`, what a user's call runs) in a perf_counter loop on a CPU, in a CUDA graph on a GPU
    (`time_cuda`).

    On a CPU the timed calls cycle through the task's input sets (`TaskData.calls`, as `autotune bench` does):
    an embedding bag's calls gather new rows, not the rows the last call left in cache. On a GPU every call
    gets the same inputs, with L2 flushed before each."""
    on_gpu = data.on_gpu
    inputs = data.inputs
    try:
        out = bound(*inputs)  # packs the weights: not timed
        if on_gpu:
            import torch

            torch.cuda.synchronize()
    except Exception as err:  # the kernel's failure, recorded, not raised
        return (), "runtime", _error(err)
    why = mismatch(out, data.expected)
    if why is not None:
        return (), "wrong", why
    if on_gpu:
        costs = time_cuda(lambda: bound(*inputs), timing, l2_bytes)
    elif timing.anchor:
        if data.anchor is None:
            raise RuntimeError("anchored timing, but this process has no anchor kernel for the task")
        costs = time_anchored(data.calls(bound), data.anchor, timing)
    else:
        costs = time_cpu(data.calls(bound), timing)
    return tuple(float(c) for c in costs), None, None


def measure_file(data: TaskData, config: Any, path: str, timing: Timing,
                 l2_bytes: int = 0) -> tuple[tuple[float, ...], str | None, str | None]:
    """Load a candidate's library and check-then-time it: what every runner does with a built candidate, here,
    in the offline measure.py and on an `autotune rpc server`. A library that does not load is the candidate's
    error; failures outside the candidate (making the data) are the caller's to report."""
    try:
        func = load_function(path)
    except Exception as err:
        return (), "runtime", _error(err)
    return check_and_time(data, data.bind(config, func), timing, l2_bytes)


def l2_bytes_here(default: int = 0) -> int:
    """This process's GPU's L2 size (for the flush), or `default` when PyTorch does not say."""
    import torch

    return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 0)) or default
