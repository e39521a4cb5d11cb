"""Small helpers the operators' torch bindings (search_spaces/<op>/torch_op.py) write their input checks with.

Errors are search_spaces.template's classes: each is the Python exception that says what is wrong and a
RuntimeError, which PyTorch raises for the same inputs. Needs no torch import (tensors are duck-typed).
"""

from __future__ import annotations

from typing import Any

from .template import InvalidInput

__all__ = ["need", "same_device_contiguous"]


def need(cond: bool, op: str, msg: str, exc: type[Exception] = InvalidInput) -> None:
    """Raise `exc("autotune.<op>: msg")` unless `cond`."""
    if not cond:
        raise exc(f"autotune.{op}: {msg}")


def same_device_contiguous(op: str, **tensors: Any) -> None:
    """The given tensors (None: absent) are on one device and contiguous, as the kernels read them."""
    present = {k: t for k, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    need(len(devices) == 1, op, "all tensors must be on one device, got "
         + ", ".join(f"{k} on {t.device}" for k, t in present.items()))
    for name, t in present.items():
        need(t.is_contiguous(), op, f"{name} must be contiguous (call .contiguous() on it)")
