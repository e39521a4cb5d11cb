"""Compiling CUDA candidates with the machine's nvcc, and rejecting those a GPU could not launch.

No GPU is needed: TVM generates CUDA C, nvcc compiles it to a cubin for the device's architecture, and two
checks run before any device sees the kernel. TVM's GPU verification (`verify_gpu_code`) runs on the exact
IR being compiled, just before it is split into host and device code (threads per block, shared memory,
vector width); then ptxas's resource report is held against the device's limits (registers x threads,
static shared memory). A candidate failing either is an `InvalidConfig`, so the tuner records it as invalid.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from typing import Any

from search_spaces import InvalidConfig

from .targets import Device, GpuSpec


@dataclass(frozen=True)
class KernelUsage:
    """What ptxas reports for one compiled kernel, plus its block size from `__launch_bounds__`."""

    name: str
    threads: int  # threads per block (0 if the kernel names no launch bound)
    registers: int
    shared_bytes: int  # static shared memory
    spill_bytes: int  # local-memory spill stores


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)


_PTXAS_FUNC = re.compile(r"Compiling entry function '(\w+)'")
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores")
_LAUNCH_BOUNDS = re.compile(r"__launch_bounds__\((\d+)\)\s+(\w+)\s*\(")


def parse_usage(ptxas_log: str, source: str) -> list[KernelUsage]:
    """Per-kernel resources from `ptxas -v` output and the launch bounds TVM writes into the source."""
    bounds = {name: int(n) for n, name in _LAUNCH_BOUNDS.findall(source)}
    out: list[KernelUsage] = []
    name, spill = None, 0
    for line in ptxas_log.splitlines():
        if m := _PTXAS_FUNC.search(line):
            name, spill = m.group(1), 0
        elif name and (m := _PTXAS_SPILL.search(line)):
            spill = int(m.group(1))
        elif name and (m := _PTXAS_USED.search(line)):
            out.append(KernelUsage(name, bounds.get(name, 0), int(m.group(1)), int(m.group(2) or 0), spill))
            name = None
    return out


def nvcc_compile(source: str, arch: str) -> tuple[bytes, list[KernelUsage]]:
    """CUDA C -> cubin for `arch` (e.g. "sm_90"), with each kernel's resource usage."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found: CUDA kernels need the CUDA toolkit to compile (PATH or /usr/local/cuda)")
    with tempfile.TemporaryDirectory(prefix="autotune-nvcc-") as tmp:
        src, cubin = os.path.join(tmp, "kernels.cu"), os.path.join(tmp, "kernels.cubin")
        with open(src, "w") as f:
            f.write(source)
        # IEEE arithmetic (no --use_fast_math): tuned kernels are compared with PyTorch's results
        cmd = [nvcc, "--cubin", "-O3", f"-arch={arch}", "-Xptxas=-v", "--expt-relaxed-constexpr",
               "-o", cubin, src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"nvcc failed: {proc.stderr.strip()[-2000:]}")
        with open(cubin, "rb") as f:
            return f.read(), parse_usage(proc.stderr, source)


class _Compiler:
    """TVM's `tvm_callback_cuda_compile`, replaced by ours: nvcc to a cubin, usage kept for the limit check."""

    def __init__(self) -> None:
        self.usage: list[KernelUsage] = []
        self.source = ""
        self.arch = ""  # set by compile_gpu: TVM calls us with no target in scope

    def __call__(self, code: str, *_: Any) -> bytes:
        if not self.arch:
            raise RuntimeError("CUDA compile requested outside autotune.cuda.compile_gpu: no architecture")
        binary, self.usage = nvcc_compile(code, self.arch)
        self.source = code
        return binary


_COMPILER: _Compiler | None = None

# The driver functions TVM's CUDA runtime library links against. On a machine without a GPU driver the
# library cannot load, and TVM then keeps kernels as CUDA source to be compiled wherever they run; with a stub
# driver it loads, builds cubins through our compiler above, and never calls the stub (modules load lazily).
_DRIVER_SYMBOLS = ("cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString",
                   "cuLaunchKernelEx", "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload",
                   "cuTensorMapEncodeTiled")
CUDA_ERROR_NO_DEVICE = 100


def _driver_loadable() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def driver_stub_dir() -> str:
    """A directory holding a stub `libcuda.so.1` whose every function fails with CUDA_ERROR_NO_DEVICE."""
    cache = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "autotune",
                         "cuda-driver-stub")
    lib = os.path.join(cache, "libcuda.so.1")
    if not os.path.exists(lib):
        os.makedirs(cache, exist_ok=True)
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            raise FileNotFoundError("building CUDA kernels without a GPU driver needs a C compiler (cc) for a stub")
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "stub.c")
            with open(src, "w") as f:
                f.writelines(f"int {name}() {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for name in _DRIVER_SYMBOLS)
            tmp_lib = os.path.join(tmp, "libcuda.so.1")
            subprocess.run([cc, "-shared", "-fPIC", "-o", tmp_lib, src], check=True, capture_output=True)
            shutil.move(tmp_lib, lib + f".{os.getpid()}")
            os.replace(lib + f".{os.getpid()}", lib)  # atomic: concurrent builders never see half a file
    return cache


def prepare_build_environment() -> None:
    """Make processes started from now on able to build CUDA modules (call before starting workers)."""
    if nvcc_path() is None:
        raise FileNotFoundError("nvcc not found: CUDA kernels need the CUDA toolkit to compile (PATH or /usr/local/cuda)")
    if _driver_loadable():
        return
    stub = driver_stub_dir()
    paths = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    if stub not in paths:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([stub] + [p for p in paths if p])


def _compiler() -> _Compiler:
    global _COMPILER
    if _COMPILER is None:
        import tvm_ffi

        _COMPILER = _Compiler()
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", _COMPILER, override=True)
    return _COMPILER


def constraints(spec: GpuSpec) -> dict[str, int]:
    """The limits `tvm.s_tir.analysis.verify_gpu_code` checks, for this device."""
    return {
        "max_threads_per_block": spec.max_threads_per_block,
        "max_shared_memory_per_block": spec.shared_memory_per_block,
        "max_local_memory_per_block": 64 * 1024,  # beyond this, a kernel is all spills: never the winner
        "max_thread_x": spec.max_threads_per_block, "max_thread_y": spec.max_threads_per_block,
        "max_thread_z": 64, "max_vthread": 8, "max_vector_bytes": 16, "max_kernels": 8,
    }


def _verifier(spec: GpuSpec) -> Any:
    import tvm

    @tvm.instrument.pass_instrument
    class VerifyBeforeSplit:
        """Runs TVM's GPU verification on the lowered IR right before host and device code are split."""

        def run_before_pass(self, mod: Any, info: Any) -> None:
            if info.name != "tirx.SplitHostDevice":
                return
            from tvm.s_tir.analysis import verify_gpu_code

            for gvar, func in mod.functions.items():
                if not isinstance(func, tvm.tirx.PrimFunc):
                    continue
                try:
                    ok = verify_gpu_code(func, constraints(spec))
                except Exception:  # TVM's verifier cannot size a grid from a runtime extent (a batch size):
                    continue  # such kernels are still held to ptxas's report in check_usage
                if not ok:
                    raise InvalidConfig(f"{gvar.name_hint} fails TVM's GPU verification for {spec.arch} "
                                        "(threads, shared memory, local memory or vector width over the limits)")

    return VerifyBeforeSplit()


def check_usage(usage: list[KernelUsage], spec: GpuSpec) -> None:
    """Reject kernels the device could not launch: registers x threads and static shared memory."""
    for k in usage:
        if k.threads > spec.max_threads_per_block:
            raise InvalidConfig(f"{k.name}: {k.threads} threads per block > {spec.max_threads_per_block}")
        if k.registers > spec.registers_per_thread:
            raise InvalidConfig(f"{k.name}: {k.registers} registers per thread > {spec.registers_per_thread}")
        if k.threads and k.registers * k.threads > spec.registers_per_block:
            raise InvalidConfig(f"{k.name}: {k.registers} registers x {k.threads} threads > "
                                f"{spec.registers_per_block} per block")
        if k.shared_bytes > spec.shared_memory_per_block:
            raise InvalidConfig(f"{k.name}: {k.shared_bytes} bytes of shared memory > "
                                f"{spec.shared_memory_per_block}")


def compile_gpu(mod: Any, device: Device) -> tuple[Any, list[KernelUsage]]:
    """Compile a scheduled IRModule for a GPU device: verified, built with nvcc, usage checked."""
    import tvm

    import tvm_ffi

    assert device.gpu is not None
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        raise RuntimeError("TVM's CUDA runtime is not loaded in this process: build GPU kernels in a Builder "
                           "worker (autotune.build.Builder), which starts with a usable driver or a stub")
    compiler = _compiler()
    compiler.arch, compiler.usage = device.gpu.arch, []
    with tvm.transform.PassContext(instruments=[_verifier(device.gpu)]):
        try:
            exe = tvm.compile(mod, target=device.target())
        except InvalidConfig:
            raise
        except Exception as err:  # the instrument's exception arrives wrapped by TVM's FFI
            if "fails TVM's GPU verification" in str(err):
                raise InvalidConfig(str(err).strip().splitlines()[-1]) from None
            raise
        finally:
            compiler.arch = ""
    check_usage(compiler.usage, device.gpu)
    return exe, compiler.usage
