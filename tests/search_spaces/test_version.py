"""search_spaces.version: a template's version follows its kernel-generating code, not its comments."""

from __future__ import annotations

import importlib
import itertools
import shutil
from pathlib import Path

import pytest

import search_spaces
from search_spaces import version
from search_spaces.template import device_kinds
from search_spaces.version import sources, template_version

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
_PACKAGES = itertools.count()

CPU = '''\
"""The CPU schedule."""
from search_spaces.space import Choice
from .helper import TILE


def lower(w, cfg, target):
    """Docstring."""
    return w + TILE  # the kernel
'''
CUDA = "def lower(w, cfg, target):\n    return w * 2\n"
HELPER = "TILE = 4\n"


@pytest.fixture()
def package(tmp_path, monkeypatch):
    """A template package tpl<N>.op (op/__init__, cpu, cuda, helper) on sys.path; yields (module, op dir)."""
    name = f"tpl{next(_PACKAGES)}"
    op = tmp_path / name / "op"
    op.mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text("")
    (op / "__init__.py").write_text('NAME = "op"\n')
    (op / "cpu.py").write_text(CPU)
    (op / "cuda.py").write_text(CUDA)
    (op / "helper.py").write_text(HELPER)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module(f"{name}.op"), op
    version.clear_cache()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    version.clear_cache()


def test_a_code_change_in_cpu_py_changes_the_cpu_version_only(package):
    module, op = package
    cpu, cuda = template_version(module, "llvm"), template_version(module, "cuda")
    assert cpu != cuda and len(cpu) == 12
    _edit(op / "cpu.py", "w + TILE", "w - TILE")
    assert template_version(module, "cpu:znver3") != cpu
    assert template_version(module, "cuda:sm_90") == cuda


def test_comments_docstrings_and_formatting_do_not_change_it(package):
    module, op = package
    before = template_version(module, "llvm")
    _edit(op / "cpu.py", '"""Docstring."""', '"""Another docstring,\n    on two lines."""')
    _edit(op / "cpu.py", "# the kernel", "# a different comment")
    _edit(op / "cpu.py", "return w + TILE", "return (w +\n            TILE)")
    _edit(op / "cpu.py", '"""The CPU schedule."""', "# no module docstring any more")
    assert template_version(module, "llvm") == before


def test_imported_modules_count_transitively_and_lazily(package):
    module, op = package
    before = template_version(module, "llvm")
    _edit(op / "helper.py", "TILE = 4", "TILE = 8")
    changed = template_version(module, "llvm")
    assert changed != before
    # An import inside a function (a lazy import) is kernel-generating code too.
    (op / "extra.py").write_text("X = 1\n")
    _edit(op / "cpu.py", "    return w + TILE", "    from .extra import X\n    return w + TILE")
    with_extra = template_version(module, "llvm")
    _edit(op / "extra.py", "X = 1", "X = 2")
    assert len({before, changed, with_extra, template_version(module, "llvm")}) == 4
    assert [p.name for p in sources(module, "llvm")] == ["cpu.py", "helper.py", "extra.py"]


def test_infrastructure_and_the_torch_binding_are_not_hashed_but_shared_kernel_code_is(package):
    module, op = package
    (op / "torch_op.py").write_text("BINDING = None\n")
    _edit(op / "cpu.py", "from search_spaces.space import Choice",
          "from search_spaces.space import Choice\nfrom search_spaces import template, intrinsics\n"
          "def check():\n    from .torch_op import BINDING")
    hashed = [p.relative_to(Path(search_spaces.__file__).parent).as_posix()
              for p in sources(module, "llvm") if "search_spaces" in p.parts]
    assert hashed == ["intrinsics.py"]
    assert "torch_op.py" not in [p.name for p in sources(module, "llvm")]


def test_a_declared_version_stales_every_device(package):
    module, op = package
    before = {k: template_version(module, k) for k in ("llvm", "cuda")}
    module.VERSION = 2
    version.clear_cache()
    assert all(template_version(module, k) != v for k, v in before.items())


def test_versions_are_cached_per_template_and_device_kind(package):
    module, op = package
    before = template_version(module, "llvm")
    (op / "cpu.py").write_text(CPU.replace("w + TILE", "w * TILE"))
    assert template_version(module, "cpu:other") == before  # same kind: cached, no file is read
    version.clear_cache()
    assert template_version(module, "llvm") != before


def test_a_single_module_template_hashes_its_own_file(tmp_path, monkeypatch):
    pkg = tmp_path / "copied_templates"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    shutil.copy(TEMPLATES / "faulty.py", pkg / "faulty.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    copy = importlib.import_module("copied_templates.faulty")
    try:
        original = template_version("templates.faulty", "llvm")
        assert template_version(copy, "llvm") == original  # where the code lives does not matter
        assert sources(copy, "llvm") == [pkg / "faulty.py"]
        _edit(pkg / "faulty.py", "doc=\"which misbehaviour to inject\")",
              "doc=\"which misbehaviour to inject\")  # a comment")
        assert template_version(copy, "llvm") == original
        _edit(pkg / "faulty.py", "delta = 2.0 if", "delta = 3.0 if")
        assert template_version(copy, "llvm") != original
    finally:
        version.clear_cache()


@pytest.mark.parametrize("op", search_spaces.names())
def test_every_registered_template_has_a_version_per_device_kind(op):
    tpl = search_spaces.get(op)
    for kind in ("llvm", "cuda"):
        assert len(template_version(op, kind)) == 12
        files = sources(op, kind)
        if hasattr(tpl, "__path__") and (kind == "llvm" or "cuda" in device_kinds(tpl)):  # its device module first
            assert files[0] == Path(tpl.__path__[0]) / ("cuda.py" if kind == "cuda" else "cpu.py")
        elif hasattr(tpl, "__path__"):  # a CPU-only package: no cuda.py, the package's own module
            assert files[0] == Path(tpl.__path__[0]) / "__init__.py"
        else:
            assert files[0] == Path(tpl.__file__)
