"""examples/dlrm.py as a module, for the benchmarks that measure its model (the model, its batches, its
contenders' timing and table): loaded from its file, as the example is a script, not a package."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "dlrm.py"


def dlrm() -> Any:
    """The example's module (loaded once per process)."""
    if "dlrm_example" in sys.modules:
        return sys.modules["dlrm_example"]
    spec = importlib.util.spec_from_file_location("dlrm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  (its dataclasses look themselves up there)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module
