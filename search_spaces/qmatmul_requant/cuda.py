"""qmatmul_requant on CUDA GPUs: qmatmul's kernel (qmatmul/cuda.py), then the row quantization as two small
kernels of the same module. Its knobs are qmatmul's."""

from __future__ import annotations

from typing import Any

from ..qmatmul import cuda as _qmatmul
from ..space import Config, Space
from .workload import Workload


def space(w: Workload, target: Any) -> Space:
    return _qmatmul.space(w, target)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    return _qmatmul.lower(w, cfg, target, out_qmax=w.out_qmax)
