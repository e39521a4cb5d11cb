"""Running a prepared kernel without TVM: its cubin loaded by the CUDA driver and launched through ctypes exactly
as TVM's host code launches it, for a GPU machine where a TVM-built library will not load or run.

What "exactly as" means is recorded at prepare time (record_launches.py): TVM's host code is called under a stub
driver with stand-in tensors, and the stub writes down every launch, which becomes the candidate's `launch` spec:

    {"cubin": "c003.cubin", "source": "c003.cu",
     "workspaces": [bytes, ...],                       # device buffers TVM's host code allocated for the call
     "attributes": [{"kernel": name, "attribute": 8, "value": 65536}],        # cuFuncSetAttribute calls
     "kernels": [{"name": "main_kernel", "grid": [gx, gy, gz], "block": [bx, by, bz], "shared": bytes,
                  "params": [{"arg": 0}, {"arg": 2, "offset": 16}, {"workspace": 0}, {"value": 2048}]}]}

A parameter is an argument's device address (plus an offset), a workspace's, or a constant TVM's host code
computed from the shapes (a row count, say): the same on the device, whose inputs have the shapes the candidate's
`args` record (`[{"shape": [2048, 64], "dtype": "float32"}, {"value": 7}, ...]`, TVM's argument order;
`KernelFunction` refuses others). The driver used is the one PyTorch loaded (libcuda.so.1), in PyTorch's
context, on PyTorch's current stream, so launches order with PyTorch's work and CUDA graphs capture them.
Standard library only (torch where tensors are passed).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path
from typing import Any, Sequence

# cuModuleLoadData's errors that mean "this driver cannot load this cubin" (not "this kernel is broken"): the
# kernel's CUDA C, compiled again by the machine's own nvcc, may load
IMAGE_ERRORS = {200: "CUDA_ERROR_INVALID_IMAGE", 209: "CUDA_ERROR_NO_BINARY_FOR_GPU",
                218: "CUDA_ERROR_INVALID_PTX", 222: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"}
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
LOCAL_SUFFIX = ".local.cubin"  # a cubin compiled on the device from the candidate's .cu


class CudaError(RuntimeError):
    def __init__(self, code: int, name: str, what: str):
        super().__init__(f"{what}: {name} ({code})")
        self.code = code


class Driver:
    """The few driver calls a launch needs, through ctypes on libcuda.so.1 (PyTorch's, or the stub in tests)."""

    def __init__(self, lib: ctypes.CDLL | None = None):
        self.lib = lib if lib is not None else ctypes.CDLL("libcuda.so.1")
        c_uint, ptr = ctypes.c_uint, ctypes.c_void_p
        self.lib.cuLaunchKernel.argtypes = [ptr, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, ptr,
                                            ctypes.POINTER(ctypes.c_void_p), ptr]
        self.lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        self.lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ptr, ctypes.c_char_p]
        self.lib.cuFuncSetAttribute.argtypes = [ptr, ctypes.c_int, ctypes.c_int]
        self._context = False

    def check(self, code: int, what: str) -> None:
        if code:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(name))
            raise CudaError(code, (name.value or b"CUDA error").decode(), what)

    def ensure_context(self) -> None:
        """PyTorch's (primary) context current on this thread, as it is once PyTorch has used the GPU."""
        if self._context:
            return
        self.check(self.lib.cuInit(0), "cuInit")
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
            self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._context = True

    def load(self, image: bytes) -> int:
        self.ensure_context()
        module = ctypes.c_void_p()
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
        return int(module.value or 0)

    def function(self, module: int, name: str) -> int:
        fn = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), f"cuModuleGetFunction {name}")
        return int(fn.value or 0)

    def set_attribute(self, fn: int, attribute: int, value: int) -> None:
        self.check(self.lib.cuFuncSetAttribute(fn, attribute, value), "cuFuncSetAttribute")

    def launch(self, fn: int, grid: Sequence[int], block: Sequence[int], shared: int, stream: int,
               params: Any) -> None:
        self.check(self.lib.cuLaunchKernel(fn, *grid, *block, shared, stream, params, None), "cuLaunchKernel")


def param_value(param: dict[str, Any], pointers: Sequence[int], workspaces: Sequence[int]) -> int:
    """One kernel parameter's 8-byte value (constants narrower than 8 bytes are zero-extended: the driver reads
    as many bytes as the kernel's parameter has, from the start, little-endian)."""
    if "arg" in param:
        return pointers[param["arg"]] + param.get("offset", 0)
    if "workspace" in param:
        return workspaces[param["workspace"]]
    return param["value"]


class Launcher:
    """One candidate's kernels, loaded from its cubin: `launch(pointers, workspaces, stream)` runs them as TVM's
    host code does, given each argument's device address (0 for a number) and each workspace's."""

    def __init__(self, spec: dict[str, Any], image: bytes, driver: Driver):
        self.spec, self.driver = spec, driver
        module = driver.load(image)
        names = {k["name"] for k in spec["kernels"]}
        functions = {name: driver.function(module, name) for name in sorted(names)}
        for a in spec["attributes"]:
            driver.set_attribute(functions[a["kernel"]], a["attribute"], a["value"])
        for k in spec["kernels"]:  # more dynamic shared memory than the default 48 KiB needs the opt-in
            if k["shared"] > 48 * 1024 and not any(a["kernel"] == k["name"] and a["attribute"] ==
                                                   MAX_DYNAMIC_SHARED_SIZE_BYTES for a in spec["attributes"]):
                driver.set_attribute(functions[k["name"]], MAX_DYNAMIC_SHARED_SIZE_BYTES, k["shared"])
        self._kernels = [(functions[k["name"]], k) for k in spec["kernels"]]

    def launch(self, pointers: Sequence[int], workspaces: Sequence[int], stream: int) -> None:
        for fn, k in self._kernels:
            values = [ctypes.c_uint64(param_value(p, pointers, workspaces)) for p in k["params"]]
            params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
            self.driver.launch(fn, k["grid"], k["block"], k["shared"], stream, params)


class KernelFunction:
    """A candidate callable as TVM's `main` is, `f(*kernel_args)` (torch tensors and numbers in TVM's order),
    without TVM: it checks the arguments have the recorded shapes and dtypes, then launches on PyTorch's current
    stream. Workspaces are allocated once and reused (calls on one stream never overlap)."""

    def __init__(self, launcher: Launcher, args: Sequence[dict[str, Any]]):
        self.launcher = launcher
        self._workspaces: list[Any] = []
        self._expected = [(tuple(a["shape"]), a["dtype"]) if "shape" in a else a["value"] for a in args]

    def __call__(self, *args: Any) -> None:
        import torch

        if len(args) != len(self._expected):
            raise TypeError(f"the kernel takes {len(self._expected)} arguments, got {len(args)}")
        pointers = []
        for i, (a, want) in enumerate(zip(args, self._expected)):
            if not isinstance(want, tuple):  # a number: TVM's host code computed the kernels' constants from it
                if a != want:
                    raise ValueError(f"argument {i}: {a!r}, but the launch was recorded for {want!r}")
                pointers.append(0)
                continue
            got = (tuple(a.shape), str(a.dtype).removeprefix("torch."))
            if got != want or not a.is_cuda:
                raise ValueError(f"argument {i}: {got} on {a.device}, but the launch was recorded for {want} on a "
                                 "GPU (TVM's host code computed its grid and constants from those shapes)")
            pointers.append(a.data_ptr())
        if not self._workspaces:
            self._workspaces = [torch.empty(n, dtype=torch.uint8, device="cuda")
                                for n in self.launcher.spec["workspaces"]]
        self.launcher.launch(pointers, [w.data_ptr() for w in self._workspaces],
                             torch.cuda.current_stream().cuda_stream)


def cubin_path(kernels: Path, spec: dict[str, Any]) -> Path:
    """The cubin to load: one compiled on this machine (`compile_local`) where there is one, else the prepared
    one."""
    local = kernels / (spec["cubin"].removesuffix(".cubin") + LOCAL_SUFFIX)
    return local if local.exists() else kernels / spec["cubin"]


def load(kernels: Path, cand: dict[str, Any], driver: Driver) -> KernelFunction:
    """A candidate of batch.json (its `launch` spec and `args`) loaded from `kernels` (CudaError if the driver
    refuses its cubin), callable as TVM's `main`."""
    spec = cand["launch"]
    return KernelFunction(Launcher(spec, cubin_path(kernels, spec).read_bytes(), driver), cand["args"])


def compile_local(kernels: Path, spec: dict[str, Any], arch: str, nvcc: str = "nvcc", timeout: float = 120) -> Path:
    """The candidate's CUDA C compiled by this machine's nvcc for `arch` (e.g. "sm_90"), with the flags
    autotune.cuda compiles it with (the same toolkit makes the prepared cubin byte for byte), next to the
    prepared cubin: for a driver older than the toolkit that built the prepared one. Raises
    subprocess.CalledProcessError (or TimeoutExpired)."""
    source = kernels / spec["source"]
    out = kernels / (spec["cubin"].removesuffix(".cubin") + LOCAL_SUFFIX)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run([nvcc, "--cubin", "-O3", f"-arch={arch}", "-Xptxas=-v", "--expt-relaxed-constexpr", "-o",
                    str(tmp), str(source)], check=True, capture_output=True, text=True, timeout=timeout)
    os.replace(tmp, out)
    return out
