"""`optimize(model, package)`: swap a model's modules for tuned ones where the package has kernels for them.

The swaps are the operators' own (`TorchBinding.rules`, e.g. nn.EmbeddingBag -> EmbeddingBag sharing the weight
Parameter, nn.Linear(+ReLU) -> QuantLinear); a rule sees the module, the one after it in an nn.Sequential (a
ReLU it may fuse) and whether a loaded kernel of its operator on the module's device fits, so a swap never
trades PyTorch's code for a fallback. `extra={MyInteraction: DotInteraction.from_module}` maps other module
types (there is no standard PyTorch module for DLRM's interaction) and takes precedence; the module it makes is
kept only if the rules accept it. The report says what was swapped and why the rest was kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from torch import nn

from search_spaces.template import TorchBinding

from .ops import BINDINGS
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


def _device(m: nn.Module) -> str | None:
    for t in list(m.parameters(recurse=False)) + list(m.buffers(recurse=False)):
        return device_key(t.device)
    return None


class _Rules:
    """The rules of every bound operator, each with a `has_kernel` over the given kernels of its operator."""

    def __init__(self, bindings: Mapping[str, TorchBinding], kernels: list[LoadedKernel], quantize: bool):
        self.rules = [(name, r) for name, b in bindings.items() for r in b.rules if quantize or not r.quantizes]
        self.kernels = kernels
        self.dropins = tuple(v for b in bindings.values() for _, v in b.exports if isinstance(v, type))

    def apply(self, module: nn.Module, next_module: nn.Module | None, validate: bool) -> Any:
        """The first applicable rule's answer (see ModuleRule), or None; a reason a kernel was missing for
        names the device."""
        dev = _device(module)
        for name, rule in self.rules:
            missed: list[bool] = []
            out = rule.swap(module, next_module, self._has_kernel(name, dev, missed), validate)
            if out is not None:
                return f"{out} on {dev}" if isinstance(out, str) and missed and dev else out
        return None

    def _has_kernel(self, op: str, device: str | None, missed: list[bool]) -> Callable[[Callable[[Any], bool]], bool]:
        def has_kernel(match: Callable[[Any], bool]) -> bool:
            found = any(k.name == op and (device is None or (k.device.startswith("cpu") if device == "cpu"
                                                             else k.device == device)) and match(k.workload)
                        for k in self.kernels)
            missed.append(not found)
            return found

        return has_kernel


def optimize(model: nn.Module, package: Package | str | os.PathLike[str] | None = None, *, quantize: bool = True,
             extra: Mapping[type, Callable[[nn.Module], nn.Module]] | None = None,
             validate: bool = True) -> OptimizeReport:
    """Swap `model`'s modules in place for tuned ones that `package` (a loaded Package, a package directory,
    or None: every loaded package) has kernels for; returns what was swapped and what was kept, and why.

    `quantize=False` keeps the modules whose swap changes numerics (nn.Linear -> int8 QuantLinear).
    """
    rules = _Rules(BINDINGS, _kernels(package), quantize)
    report = OptimizeReport()
    extra = dict(extra or {})

    def visit(parent: nn.Module, prefix: str) -> None:
        names = list(parent._modules)
        for i, name in enumerate(names):
            child = parent._modules[name]
            if child is None or isinstance(child, rules.dropins):
                continue
            full = f"{prefix}{name}"
            nxt_name = names[i + 1] if i + 1 < len(names) and isinstance(parent, nn.Sequential) else None
            nxt = parent._modules[nxt_name] if nxt_name is not None else None
            out = _swap(child, nxt, rules, extra, validate)
            if isinstance(out, tuple):
                new, fuses_next = out
                parent._modules[name] = new
                report.swapped.append(Swap(full, _short(child), _short(new)))
                if fuses_next and nxt_name is not None:  # the next module's work is inside the new one now
                    parent._modules[nxt_name] = nn.Identity()
                    report.swapped.append(Swap(f"{prefix}{nxt_name}", type(nxt).__name__,
                                               f"Identity (fused into {full})"))
            elif isinstance(out, str):
                report.kept.append((full, out))
            else:
                visit(child, full + ".")

    visit(model, "")
    return report


def _swap(child: nn.Module, nxt: nn.Module | None, rules: _Rules, extra: dict[type, Callable[[nn.Module], nn.Module]],
          validate: bool) -> Any:
    """(new module, fuses_next), or why the module is kept, or None for a module to look inside."""
    for kind, factory in extra.items():
        if isinstance(child, kind):
            new = factory(child)
            out = rules.apply(new, None, validate)  # e.g. no kernel for the new module: keep the model's own
            return (new, False) if out is None else out
    return rules.apply(child, nxt, validate)


def _short(m: nn.Module) -> str:
    return f"{type(m).__module__.split('.')[0]}.{type(m).__name__}({m.extra_repr()})"
