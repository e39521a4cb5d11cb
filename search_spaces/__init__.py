"""Operator templates: what can be tuned. Each module here that defines `NAME` is a template."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from .space import Choice, Config, Constraint, InvalidConfig, Space, Split
from .template import Template, Traffic, Workload, WorkloadError

__all__ = ["Choice", "Config", "Constraint", "InvalidConfig", "Space", "Split", "Template", "Traffic",
           "Workload", "WorkloadError", "get", "names", "UnknownOperator"]

_NOT_TEMPLATES = {"space", "template", "intrinsics"}


class UnknownOperator(LookupError):
    pass


def names() -> list[str]:
    """Operators this installation can tune, discovered from the package's modules."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__)
                  if m.name not in _NOT_TEMPLATES and not m.name.startswith("_"))


def get(name: str) -> Template:
    """The template module for an operator name, or for a dotted module path (out-of-tree templates)."""
    if "." in name:
        module: ModuleType = importlib.import_module(name)
    elif name in names():
        module = importlib.import_module(f"{__name__}.{name}")
    else:
        raise UnknownOperator(f"unknown operator {name!r}; known: {', '.join(names())}")
    if not hasattr(module, "NAME"):
        raise UnknownOperator(f"module {name!r} is not an operator template (it defines no NAME)")
    return module  # type: ignore[return-value]
