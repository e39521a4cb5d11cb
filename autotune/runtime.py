"""Running and timing compiled kernels with TVM's runtime alone: no TVM compiler, no `import tvm`.

Needs `apache-tvm-ffi`, PyTorch and TVM's runtime libraries (`libtvm_runtime.so`, and for GPUs
`libtvm_runtime_cuda.so`: a few MB, shipped inside kernel packages). This file imports nothing else of
`autotune`, so a kernel package carries a copy of it: on a GPU machine without the 260 MB compiler it runs
exported kernels and measures candidate batches built elsewhere (`autotune tune --runner offline:DIR`).
The local runner uses the same code, so a candidate is checked and timed alike on either path.
"""

from __future__ import annotations

import ctypes
import glob
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

RUNTIME_LIBS = ("libtvm_runtime.so", "libtvm_runtime_cuda.so")
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


def load_function(path: str, name: str = "main") -> Any:
    """The kernel entry of an exported library (a callable taking torch tensors through DLPack)."""
    import tvm_ffi

    return tvm_ffi.load_module(path)[name]


def call(func: Any, args: Sequence[Any], on_gpu: bool) -> None:
    """Run a kernel; on a GPU, on PyTorch's current stream (so it orders with PyTorch's own work)."""
    if on_gpu:
        import tvm_ffi

        with tvm_ffi.use_torch_stream():
            func(*args)
    else:
        func(*args)


@dataclass(frozen=True)
class TimingSpec:
    """How to time: median of `repeat` measurements, each of >= `number` calls and >= min_repeat_ms."""

    number: int = 3
    repeat: int = 5
    min_repeat_ms: float = 50.0
    flush_l2: bool = True  # GPU: overwrite a buffer twice the L2's size before each measured call


def time_cpu(run: Callable[[], None], spec: TimingSpec) -> list[float]:
    """Seconds per call, per repeat: each repeat grows its call count until it lasts min_repeat_ms."""
    run()  # warm-up
    costs = []
    number = spec.number
    for _ in range(spec.repeat):
        while True:
            t0 = time.perf_counter()
            for _ in range(number):
                run()
            elapsed = time.perf_counter() - t0
            if elapsed * 1e3 >= spec.min_repeat_ms or number >= 1 << 20:
                break
            number = max(number * 2, int(number * spec.min_repeat_ms / max(elapsed * 1e3, 1e-3) * 1.1))
        costs.append(elapsed / number)
    return costs


def time_cuda(run: Callable[[], None], spec: TimingSpec, l2_bytes: int) -> list[float]:
    """Seconds per call, per repeat, by CUDA events; L2 flushed before every call (cold-cache tables).

    Each repeat is the mean of the calls within it, each call individually bracketed by events so that the
    flush's own time is excluded.
    """
    import torch

    flush = torch.empty(max(2 * l2_bytes, 1 << 20), dtype=torch.uint8, device="cuda") if spec.flush_l2 else None
    for _ in range(3):
        run()  # warm-up: module load, caches of the driver
    torch.cuda.synchronize()
    costs = []
    for _ in range(spec.repeat):
        events = []
        budget = time.perf_counter() + spec.min_repeat_ms / 1e3
        n = 0
        while n < spec.number or time.perf_counter() < budget:
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


# ---- checking a candidate against the reference -----------------------------------------------------------
def mismatch(out: Any, ref: Any, rtol: float, atol: float) -> str | None:
    """Why `out` is not `ref` within tolerance, or None if it is."""
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return f"output shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if torch.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True):
        return None
    diff = (out.double() - ref.double()).abs()
    where = int(diff.nan_to_num(float("inf")).argmax())
    return f"max abs error {float(diff.max()):.3g} at flat index {where} (rtol {rtol}, atol {atol})"


class TaskData:
    """A task's inputs and reference output on one device, made once (a 1M-row table takes a second)."""

    def __init__(self, template: Any, workload: Any, seed: int, device: str):
        import torch

        self.template, self.workload, self.device = template, workload, device
        inputs = template.inputs(workload, seed)
        self.inputs = tuple(t.to(device) if isinstance(t, torch.Tensor) else
                            [x.to(device) for x in t] if isinstance(t, (list, tuple)) else t for t in inputs)
        self.reference = template.reference(workload, *self.inputs)
        self.packed: dict[Any, tuple[Any, ...]] = {}

    def pack(self, cfg: Any) -> tuple[Any, ...]:
        """The config's packed weights (packing is not timed; configs of one layout share it)."""
        positions = self.template.WEIGHTS
        if not positions:
            return ()
        if cfg not in self.packed:
            self.packed = {cfg: tuple(self.template.pack(self.workload, cfg, *(self.inputs[i] for i in positions)))}
        return self.packed[cfg]


def check_and_time(data: TaskData, cfg: Any, func: Any, spec: TimingSpec,
                   l2_bytes: int = 0) -> tuple[tuple[float, ...], str | None, str | None]:
    """(costs, error_kind, error): run once, compare with the reference, and only then time."""
    on_gpu = data.device.startswith("cuda")
    try:
        args, out = data.template.kernel_args(data.workload, cfg, data.pack(cfg), *data.inputs)
        call(func, args, on_gpu)
        if on_gpu:
            import torch

            torch.cuda.synchronize()
    except Exception as err:  # the kernel's failure, recorded, not raised
        return (), "runtime", f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:400] if str(err).strip() else ''}"
    why = mismatch(out, data.reference, *data.template.tolerance(data.workload))
    if why is not None:
        return (), "wrong", why
    run = (lambda: call(func, args, True)) if on_gpu else (lambda: func(*args))
    costs = time_cuda(run, spec, l2_bytes) if on_gpu else time_cpu(run, spec)
    return tuple(float(c) for c in costs), None, None
