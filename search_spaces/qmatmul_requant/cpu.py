"""qmatmul_requant on CPUs: qmatmul's register-tiled kernel (qmatmul/cpu.py) with tasks of whole rows, each
quantizing the rows it computed before the next task's rows evict them. Its knobs are qmatmul's less n_block."""

from __future__ import annotations

from typing import Any

from ..qmatmul import cpu as _qmatmul
from ..space import Config, Space
from .workload import Workload


def space(w: Workload, target: Any) -> Space:
    return _qmatmul.space(w, target, whole_rows=True)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    return _qmatmul.lower(w, cfg, target, out_qmax=w.out_qmax)
