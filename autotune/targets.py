"""Device names users type (`cpu`, `cpu:znver3`) -> TVM targets. The one place targets are built."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any


class UnknownDevice(ValueError):
    pass


@dataclass(frozen=True)
class Device:
    """A tuning target: the name records are keyed by, and the TVM target JSON it compiles for."""

    name: str  # canonical, e.g. "cpu:znver3": kernels tuned for one CPU model are not another's
    target_json: tuple[tuple[str, Any], ...]
    cores: int

    @property
    def kind(self) -> str:
        return dict(self.target_json)["kind"]

    def target(self) -> Any:
        import tvm

        return tvm.target.Target(dict(self.target_json))

    def to_json(self) -> dict[str, Any]:
        return dict(self.target_json)


@functools.lru_cache(maxsize=None)
def host_cpu() -> str:
    """LLVM's name for this machine's CPU. `"native"` would silently give SSE2 code, so we ask LLVM."""
    import tvm

    detected = tvm.target.Target.from_device(tvm.cpu(0))
    mcpu = detected.attrs.get("mcpu")
    if not mcpu or str(mcpu) in ("generic", "native"):
        raise UnknownDevice("could not detect the host CPU model; name it, e.g. --device cpu:znver3")
    return str(mcpu)


def _llvm_knows_cpu(mcpu: str) -> bool:
    from tvm.target import codegen

    return bool(codegen.llvm_is_valid_cpu(mcpu, codegen.llvm_get_system_triple()))


def resolve(name: str) -> Device:
    """`cpu` (this machine's CPU, detected) or `cpu:MCPU` (cross-tuning for a named CPU model)."""
    kind, _, arch = name.partition(":")
    if kind == "cpu":
        mcpu = arch or host_cpu()
        if arch and not _llvm_knows_cpu(arch):  # LLVM would silently compile for "generic" instead
            raise UnknownDevice(f"LLVM does not know the CPU {arch!r}; e.g. cpu:{host_cpu()} (this machine)")
        cores = int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)
        return Device(name=f"cpu:{mcpu}", target_json=(("kind", "llvm"), ("mcpu", mcpu), ("num-cores", cores)),
                      cores=cores)
    raise UnknownDevice(f"unknown device {name!r}; known: cpu, cpu:MCPU (GPU targets are not implemented yet)")
