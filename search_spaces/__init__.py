"""Operator templates: what can be tuned. Each package here (search_spaces/<op>/) is one operator's template."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType

from .space import Choice, Config, Constraint, InvalidConfig, Space, Split
from .template import (IndexOutOfRange, InvalidDtype, InvalidInput, ModuleRule, Route, Template, TorchBinding,
                       Traffic, Workload, WorkloadError, is_gpu)

__all__ = ["Choice", "Config", "Constraint", "IndexOutOfRange", "InvalidConfig", "InvalidDtype", "InvalidInput",
           "ModuleRule", "Route", "Space", "Split", "Template", "TorchBinding", "Traffic", "Workload",
           "WorkloadError", "get", "is_gpu", "names", "UnknownOperator"]

_NOT_TEMPLATES = {"space", "template", "intrinsics", "version"}


class UnknownOperator(LookupError):
    pass


@functools.cache
def _names() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                        if m.name not in _NOT_TEMPLATES and not m.name.startswith("_")))


def names() -> list[str]:
    """Operators this installation can tune, discovered once from the packages of search_spaces."""
    return list(_names())


_LOADED: dict[str, Template] = {}


def get(name: str) -> Template:
    """The template for an operator name, or for a dotted module path (out-of-tree templates); cached, so the
    per-call paths that look a template up pay a dict lookup, not a directory scan."""
    try:
        return _LOADED[name]
    except KeyError:
        pass
    if "." in name:
        module: ModuleType = importlib.import_module(name)
    elif name in _names():
        module = importlib.import_module(f"{__name__}.{name}")
    else:
        raise UnknownOperator(f"unknown operator {name!r}; known: {', '.join(_names())}")
    if not hasattr(module, "NAME"):
        raise UnknownOperator(f"module {name!r} is not an operator template (it defines no NAME)")
    _LOADED[name] = module  # type: ignore[assignment]
    return module  # type: ignore[return-value]
