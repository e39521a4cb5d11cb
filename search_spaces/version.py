"""A template's version: a short hash of the code that generates its kernels for one kind of device.

Records carry it, so a changed schedule never silently reuses timings of the old code. The hash covers the
device module (a package template's cpu.py or cuda.py; a single-module template's own file) and every module
it imports from `search_spaces` or from its own top-level package, transitively, each normalised (parsed,
docstrings removed, `ast.dump`: comments, docstrings and formatting do not count), plus a `VERSION` the
template may declare to stale its records by hand.

Not hashed: search_spaces/__init__.py (the registry), space.py and template.py. They say how knobs, configs and
workloads are named and parsed, not what code a config produces; a record stores its knob values and workload
fields by name, so a change there cannot make an old timing belong to different code (a renamed knob or field
makes old records unparseable, and they are skipped), while hashing them would stale every record of every
operator whenever the shared protocol gains a field. Nor an operator's torch_op.py (its TorchBinding: the torch
op's signature, input checks and module rules), where a hashed module imports it: it decides which calls reach
a kernel, not the kernel's code or timing. (The built-in operators' input checks, checks.py, import their
workload.py, never the other way: no hashed module imports them.)
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["clear_cache", "sources", "template_version"]

_ROOT = "search_spaces"
_INFRASTRUCTURE = {_ROOT, f"{_ROOT}.space", f"{_ROOT}.template"}
_TORCH_BINDING = "torch_op"  # <op>/torch_op.py, in the layout template.py describes


def template_version(template: ModuleType | str, target: Any) -> str:
    """12 hex digits naming the kernel-generating code of `template` (a module or registry name) for
    `target` (a tvm Target, or a kind/device name such as "llvm", "cuda", "cpu:znver3"); cached per
    (template, device kind)."""
    return _version(*_resolve(template, target))


def _resolve(template: ModuleType | str, target: Any) -> tuple[ModuleType, str]:
    from . import get, is_gpu

    return (get(template) if isinstance(template, str) else template), ("cuda" if is_gpu(target) else "cpu")


def sources(template: ModuleType | str, target: Any) -> list[Path]:
    """The files `template_version` hashes for `target`, in hashing order (to see what stales a record)."""
    module, kind = _resolve(template, target)
    return [path for path, _ in _closure(*_start(module, kind))]


def clear_cache() -> None:
    """Forget computed versions (after template code changed in this process, e.g. in tests)."""
    _CACHE.clear()


_CACHE: dict[tuple[str, str], str] = {}


def _version(module: ModuleType, kind: str) -> str:
    key = (module.__name__, kind)
    if key not in _CACHE:
        digest = hashlib.sha256(f"VERSION={getattr(module, 'VERSION', '')!r}\n".encode())
        for _, dump in _closure(*_start(module, kind)):
            digest.update(dump.encode())
            digest.update(b"\0")
        _CACHE[key] = digest.hexdigest()[:12]
    return _CACHE[key]


def _start(module: ModuleType, kind: str) -> tuple[str, dict[str, Path]]:
    """The device module to start from (a package's cpu/cuda, else the template module) and the import roots."""
    name = module.__name__
    roots = {_ROOT: Path(__file__).resolve().parent.parent, **_own_root(module)}
    return (f"{name}.{kind}" if _is_package(module) and _file(f"{name}.{kind}", roots) else name), roots


def _is_package(module: ModuleType) -> bool:
    return hasattr(module, "__path__")


def _own_root(module: ModuleType) -> dict[str, Path]:
    """{top-level package: the directory holding it} for an out-of-tree template, so its own imports count."""
    top = module.__name__.split(".")[0]
    if top == _ROOT or not getattr(module, "__file__", None):
        return {}
    path = Path(module.__file__).resolve()  # type: ignore[arg-type]
    for _ in range(module.__name__.count(".") + (2 if _is_package(module) else 1)):
        path = path.parent
    return {top: path}


def _file(name: str, roots: dict[str, Path]) -> Path | None:
    """The source file of module `name` under one of `roots`, found without importing it."""
    base = roots.get(name.split(".")[0])
    if base is None:
        return None
    stem = base.joinpath(*name.split("."))
    for path in (stem / "__init__.py", stem.with_suffix(".py")):  # a package shadows a module, as in imports
        if path.is_file():
            return path
    return None


def _closure(start: str, roots: dict[str, Path]) -> list[tuple[Path, str]]:
    """(file, normalised dump) of `start` and the modules it imports under `roots`, in discovery order."""
    order, seen, todo = [], {start}, [start]
    while todo:
        name = todo.pop(0)
        path = _file(name, roots)
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for dep in _imports(tree, name, path.name == "__init__.py", roots):
            if dep not in seen and dep not in _INFRASTRUCTURE and dep.rpartition(".")[2] != _TORCH_BINDING:
                seen.add(dep)
                todo.append(dep)
        order.append((path, ast.dump(_strip_docstrings(tree))))
    return order


def _imports(tree: ast.Module, name: str, is_package: bool, roots: dict[str, Path]) -> list[str]:
    """Modules (under `roots`) imported anywhere in `tree`, lazy imports inside functions included."""
    package = name if is_package else name.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{full}.{alias.name}"
                out.append(sub if _file(sub, roots) else full)
    return [m for m in out if _file(m, roots)]


def _strip_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:]
    return tree
