"""examples/dlrm.py and examples/torchrec_dlrm.py as modules, for the benchmarks that measure their models (the
model, its batches, its contenders' timing and table): loaded from their files, as the examples are scripts, not
a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "dlrm.py"


def dlrm() -> Any:
    """examples/dlrm.py's module (loaded once per process)."""
    return _load("dlrm_example", EXAMPLE)


def torchrec_dlrm() -> Any:
    """examples/torchrec_dlrm.py's module (loaded once per process; its models need torchrec)."""
    return _load("torchrec_dlrm_example", EXAMPLES / "torchrec_dlrm.py")


def _load(name: str, path: Path) -> Any:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  (its dataclasses look themselves up there)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
