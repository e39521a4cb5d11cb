"""Device names users type (`cpu`, `cpu:znver3`, `cuda:sm_90`, `cuda`) -> TVM targets and device limits.

The one place TVM targets are built, but for `target_from_json` (a record's JSON), which the cost model needs
and so lives a layer below, in search_spaces.template (re-exported here). A GPU device carries its limits (what
a kernel may use: TVM's GPU verification and the templates' spaces read them from the target) and its roofline
(what the bench compares against). Published figures are dense, per card; `cuda` asks PyTorch about the local
GPU.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, replace
from typing import Any

from search_spaces.template import target_from_json  # noqa: F401  (re-exported)


class UnknownDevice(ValueError):
    pass


@dataclass(frozen=True)
class GpuSpec:
    """Limits a kernel must respect and the peaks it is measured against."""

    card: str  # the card the roofline figures are for
    arch: str  # "sm_90"
    sms: int
    max_threads_per_block: int = 1024
    shared_memory_per_block: int = 48 * 1024  # static shared memory: what TVM's `shared` scope may use
    shared_memory_optin: int = 48 * 1024  # per block with cudaFuncAttributeMaxDynamicSharedMemorySize
    registers_per_block: int = 65536
    registers_per_thread: int = 255
    warp_size: int = 32
    l2_bytes: int = 0
    bandwidth: float = 0.0  # DRAM bytes/s
    peak_fp32: float = 0.0  # FLOP/s, CUDA cores
    peak_int8_tc: float = 0.0  # OP/s, int8 tensor cores, dense
    peak_int8_dp4a: float = 0.0  # OP/s, dp4a on CUDA cores

    @property
    def compute_capability(self) -> tuple[int, int]:
        digits = self.arch.removeprefix("sm_").rstrip("a")
        return int(digits[:-1]), int(digits[-1])


# Datasheet figures. sm_90 is the H200 (H100 SXM: same limits, 50 MB L2, 3.35 TB/s); sm_89 the L40S.
GPUS: dict[str, GpuSpec] = {
    "sm_80": GpuSpec(card="A100-SXM4-80GB", arch="sm_80", sms=108, shared_memory_optin=163 * 1024,
                     l2_bytes=40 << 20, bandwidth=2.039e12, peak_fp32=19.5e12, peak_int8_tc=624e12,
                     peak_int8_dp4a=78e12),
    "sm_89": GpuSpec(card="L40S", arch="sm_89", sms=142, shared_memory_optin=99 * 1024, l2_bytes=96 << 20,
                     bandwidth=864e9, peak_fp32=91.6e12, peak_int8_tc=733e12, peak_int8_dp4a=366e12),
    "sm_90": GpuSpec(card="H200-SXM", arch="sm_90", sms=132, shared_memory_optin=227 * 1024,
                     l2_bytes=60 << 20, bandwidth=4.8e12, peak_fp32=67e12, peak_int8_tc=1979e12,
                     peak_int8_dp4a=134e12),
}


@dataclass(frozen=True)
class Device:
    """A tuning target: the name records are keyed by, and the TVM target JSON it compiles for."""

    name: str  # canonical, e.g. "cpu:znver3" or "cuda:sm_90": kernels tuned for one model are not another's
    target_json: tuple[tuple[str, Any], ...]
    cores: int = 0  # CPU threads the kernels use (CPU devices)
    gpu: GpuSpec | None = None

    @property
    def kind(self) -> str:
        return dict(self.target_json)["kind"]

    @property
    def is_gpu(self) -> bool:
        return self.gpu is not None

    def target(self) -> Any:
        return target_from_json(self.to_json())

    def to_json(self) -> dict[str, Any]:
        """The target as JSON holds it (lists, not the tuples a hashable Device keeps)."""
        return {k: json.loads(v) if k == "host" else list(v) if isinstance(v, tuple) else v
                for k, v in self.target_json}


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """LLVM's name for this machine's CPU. `"native"` would silently give SSE2 code, so we ask LLVM."""
    import tvm

    detected = tvm.target.Target.from_device(tvm.cpu(0))
    mcpu = detected.attrs.get("mcpu")
    if not mcpu or str(mcpu) in ("generic", "native"):
        raise UnknownDevice("could not detect the host CPU model; name it, e.g. --device cpu:znver3")
    return str(mcpu)


# Features a CPU may have beyond what LLVM's model of its name implies: a VM can show one CPU's model number and
# another's instruction sets (LLVM names such a Xeon with AMX "rocketlake", which has none). Linux flag -> LLVM.
_AMX_FEATURES = {"amx_tile": "+amx-tile", "amx_int8": "+amx-int8", "amx_bf16": "+amx-bf16"}
_EXTRA_FEATURES = {**_AMX_FEATURES, "avx512_bf16": "+avx512bf16"}


@functools.lru_cache(maxsize=None)
def host_extra_features(mcpu: str) -> tuple[str, ...]:
    """The LLVM `mattr` entries of features this machine's CPU has and LLVM's `mcpu` model lacks (AMX, which
    also needs Linux's permission: `runtime.amx_allowed`; AVX512-BF16's conversions), so kernels tuned here may
    use them."""
    from tvm.target import codegen

    from . import runtime

    flags = cpu_flags()
    if not ({"amx_tile", "amx_int8"} <= flags and runtime.amx_allowed()):
        flags -= set(_AMX_FEATURES)
    model = target_from_json({"kind": "llvm", "mcpu": mcpu})
    return tuple(attr for flag, attr in _EXTRA_FEATURES.items()
                 if flag in flags and not codegen.llvm_cpu_has_features([attr[1:]], model))


def cpu_flags() -> set[str]:
    """This machine's CPU flags as Linux names them (/proc/cpuinfo); empty where there is no such file."""
    try:
        with open("/proc/cpuinfo") as f:
            return set(next((line for line in f if line.startswith("flags")), "").partition(":")[2].split())
    except OSError:
        return set()


def _llvm_knows_cpu(mcpu: str) -> bool:
    from tvm.target import codegen

    return bool(codegen.llvm_is_valid_cpu(mcpu, codegen.llvm_get_system_triple()))


def local_gpu() -> GpuSpec:
    """The spec of the GPU PyTorch sees, its limits asked from the driver, its peaks from the table."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        raise UnknownDevice("`cuda` needs PyTorch to find the GPU; name one instead, e.g. cuda:sm_90") from None
    if not torch.cuda.is_available():
        raise UnknownDevice("PyTorch sees no CUDA GPU here; name an architecture to tune for, e.g. "
                            f"--device cuda:sm_90 (known: {', '.join(GPUS)})")
    p = torch.cuda.get_device_properties(0)
    arch = f"sm_{p.major}{p.minor}"
    base = GPUS.get(arch, GpuSpec(card=p.name, arch=arch, sms=p.multi_processor_count))
    return replace(base, card=p.name, sms=p.multi_processor_count,
                   shared_memory_optin=int(getattr(p, "shared_memory_per_block_optin", base.shared_memory_optin)),
                   l2_bytes=int(getattr(p, "L2_cache_size", base.l2_bytes)),
                   warp_size=int(getattr(p, "warp_size", base.warp_size)))


def gpu_device(spec: GpuSpec) -> Device:
    # Host code (argument unpacking, launches) is compiled for generic x86-64: it must run on whichever
    # machine hosts the GPU, and it does no work worth vectorising.
    target = {"kind": "cuda", "arch": spec.arch, "max_threads_per_block": spec.max_threads_per_block,
              "max_num_threads": spec.max_threads_per_block,
              "max_shared_memory_per_block": spec.shared_memory_per_block,
              "thread_warp_size": spec.warp_size, "registers_per_block": spec.registers_per_block,
              "l2_cache_size_bytes": spec.l2_bytes, "host": json.dumps({"kind": "llvm"})}
    return Device(name=f"cuda:{spec.arch}", target_json=tuple(target.items()), gpu=spec)


def resolve(name: str) -> Device:
    """`cpu` (this machine's CPU, detected), `cpu:MCPU`, `cuda:sm_XX` (an architecture), `cuda` (the local GPU)."""
    kind, _, arch = name.partition(":")
    if kind == "cpu":
        mcpu = arch or host_cpu()
        if arch and not _llvm_knows_cpu(arch):  # LLVM would silently compile for "generic" instead
            raise UnknownDevice(f"LLVM does not know the CPU {arch!r}; e.g. cpu:{host_cpu()} (this machine)")
        cores = int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)
        extra = host_extra_features(mcpu) if mcpu == host_cpu() else ()
        mattr = (("mattr", extra),) if extra else ()
        return Device(name=f"cpu:{mcpu}", target_json=(("kind", "llvm"), ("mcpu", mcpu), *mattr, ("num-cores", cores)),
                      cores=cores)
    if kind == "cuda":
        if not arch:
            return gpu_device(local_gpu())
        if arch not in GPUS:
            raise UnknownDevice(f"unknown GPU architecture {arch!r}; known: {', '.join(GPUS)} (or `cuda` for "
                                "the local GPU)")
        return gpu_device(GPUS[arch])
    raise UnknownDevice(f"unknown device {name!r}; known: cpu, cpu:MCPU, cuda, {', '.join('cuda:' + a for a in GPUS)}")
