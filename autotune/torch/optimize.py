"""`optimize(model, package)`: swap a model's modules for tuned ones where the package has kernels for them.

Swapped in place: `nn.EmbeddingBag` -> `EmbeddingBag` (sharing the weight Parameter), `nn.Linear` ->
`QuantLinear` (int8; with a ReLU that follows it in an `nn.Sequential` fused when a relu kernel exists), and any
module type the caller maps to a factory (`extra={MyInteraction: DotInteraction.from_module}`: there is no
standard PyTorch module for DLRM's interaction). A module is swapped only when the package holds a kernel for
its compiled fields (dimension, mode, in/out features...) on its device, so a swap never trades PyTorch's code
for a fallback; the report says what was swapped and why the rest was kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from torch import nn

from .modules import DotInteraction, EmbeddingBag, QuantLinear
from .registry import REGISTRY, LoadedKernel, Package, device_key, load

__all__ = ["OptimizeReport", "Swap", "optimize"]


@dataclass(frozen=True)
class Swap:
    name: str
    before: str
    after: str


@dataclass
class OptimizeReport:
    swapped: list[Swap] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)  # (module name, why it was not swapped)

    def __str__(self) -> str:
        lines = [f"optimize: swapped {len(self.swapped)} modules, kept {len(self.kept)}"]
        lines += [f"  {s.name}: {s.before} -> {s.after}" for s in self.swapped]
        lines += [f"  kept {name}: {why}" for name, why in self.kept]
        return "\n".join(lines)


def _kernels(package: Package | str | os.PathLike[str] | None) -> list[LoadedKernel]:
    if package is None:
        return [k for p in REGISTRY.packages for k in p.kernels]
    if not isinstance(package, Package):
        package = load(Path(package))
    return package.kernels


def _has(kernels: list[LoadedKernel], op: str, device: str | None, match: Callable[[Any], bool]) -> bool:
    """Whether a kernel of `op` on `device` (None: a module without tensors, any device) satisfies `match`."""
    return any(k.op == op and (device is None or (k.device.startswith("cpu") if device == "cpu" else k.device == device))
               and match(k.workload) for k in kernels)


def optimize(model: nn.Module, package: Package | str | os.PathLike[str] | None = None, *, quantize: bool = True,
             extra: Mapping[type, Callable[[nn.Module], nn.Module]] | None = None,
             validate: bool = True) -> OptimizeReport:
    """Swap `model`'s modules in place for tuned ones that `package` (a loaded Package, a package directory,
    or None: every loaded package) has kernels for; returns what was swapped and what was kept, and why.

    `quantize=False` keeps every nn.Linear (QuantLinear changes numerics: int8 weights and activations).
    """
    kernels = _kernels(package)
    report = OptimizeReport()
    extra = dict(extra or {})

    def visit(parent: nn.Module, prefix: str) -> None:
        names = list(parent._modules)
        for i, name in enumerate(names):
            child = parent._modules[name]
            if child is None:
                continue
            full = f"{prefix}{name}"
            new, why = _swap(child, parent, names[i + 1] if i + 1 < len(names) else None, kernels, quantize,
                             extra, validate)
            if new is not None:
                parent._modules[name] = new
                report.swapped.append(Swap(full, _short(child), _short(new)))
                if isinstance(new, QuantLinear) and new.relu:  # the ReLU is inside it now
                    parent._modules[names[i + 1]] = nn.Identity()
                    report.swapped.append(Swap(f"{prefix}{names[i + 1]}", "ReLU", f"Identity (fused into {full})"))
            elif why is not None:
                report.kept.append((full, why))
            else:
                visit(child, full + ".")

    visit(model, "")
    return report


def _short(m: nn.Module) -> str:
    return f"{type(m).__module__.split('.')[0]}.{type(m).__name__}({m.extra_repr()})"


def _device(m: nn.Module) -> str | None:
    for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
        return device_key(t.device)
    return None


def _swap(child: nn.Module, parent: nn.Module, next_name: str | None, kernels: list[LoadedKernel], quantize: bool,
          extra: dict[type, Callable[[nn.Module], nn.Module]],
          validate: bool) -> tuple[nn.Module | None, str | None]:
    """(new module, None), or (None, why it was kept), or (None, None) for a module to look inside."""
    dev = _device(child)
    for kind, factory in extra.items():
        if isinstance(child, kind) and not isinstance(child, (EmbeddingBag, DotInteraction, QuantLinear)):
            new = factory(child)
            si = getattr(new, "self_interaction", None)
            if isinstance(new, DotInteraction) and not _has(kernels, "interaction", dev,
                                                            lambda w: w.self_interaction == si):
                return None, f"no interaction kernel with self_interaction={si}" + (f" on {dev}" if dev else "")
            if isinstance(new, (EmbeddingBag, DotInteraction, QuantLinear)):
                new.validate = validate
            return new, None
    if isinstance(child, nn.EmbeddingBag) and not isinstance(child, EmbeddingBag):
        if child.max_norm is not None:
            return None, "max_norm renormalises rows in place: PyTorch's path"
        match = (lambda w: w.dim == child.embedding_dim and w.mode == child.mode
                 and w.include_last_offset == child.include_last_offset and w.padding_idx == child.padding_idx)
        if not _has(kernels, "embedding_bag", dev, match):
            return None, (f"no embedding_bag kernel for dim={child.embedding_dim} mode={child.mode} "
                          f"padding_idx={child.padding_idx} include_last_offset={child.include_last_offset} on {dev}")
        return EmbeddingBag.from_module(child, validate=validate), None
    if type(child) is nn.Linear and quantize:
        bias = child.bias is not None
        nxt = parent._modules.get(next_name) if next_name is not None and isinstance(parent, nn.Sequential) else None
        fields = (child.in_features, child.out_features)
        for relu in ((True, False) if isinstance(nxt, nn.ReLU) else (False,)):
            if _has(kernels, "qmatmul", dev, lambda w: (w.k, w.n, w.mode, w.bias, w.relu) == (*fields, "int8", bias,
                                                                                              relu)):
                return QuantLinear.from_float(child, relu=relu, validate=validate), None
        return None, (f"no int8 qmatmul kernel for k={child.in_features} n={child.out_features} bias={bias} on {dev}")
    return None, None
