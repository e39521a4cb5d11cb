"""split_linear_cross on CPUs: split_linear's kernels (split_linear/cpu.py: knobs, space, packing; kernel.py: the
TVMScript) whose epilogue is the cross tail: each output leaves the register block as x0 * (acc + b) + x_l, so the
product never exists in memory."""

from __future__ import annotations

from typing import Any

from ..space import Config, Space
from ..split_linear import cpu as _split
from .workload import Workload

__all__ = ["lower", "pack", "space"]


def space(w: Workload, target: Any) -> Space:
    return _split.space(w, target)


def pack(w: Workload, cfg: Config, weight: Any) -> tuple[Any, ...]:
    return _split.pack(w, cfg, weight)


def lower(w: Workload, cfg: Config, target: Any) -> Any:
    return _split.lower(w, cfg, target, cross=True)
