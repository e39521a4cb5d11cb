"""qmatmul_requant on CUDA GPUs: qmatmul's kernel (qmatmul/cuda.py), then the row quantization as two small
kernels of the same module. Its knobs are qmatmul's."""

from __future__ import annotations

from typing import Any

from ..qmatmul import cuda as _qmatmul
from ..space import Config, InvalidConfig, Space
from .workload import UNSIGNED_QMAX, Workload


def space(w: Workload, target: Any) -> Space:
    if w.out_qmax == UNSIGNED_QMAX:
        raise InvalidConfig("uint8 output rows run on CPUs only (GPUs: int8 rows)")
    return _qmatmul.space(w, target)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    return _qmatmul.lower(w, cfg, target, out_qmax=w.out_qmax)
