"""Small helpers the operators' torch bindings (search_spaces/<op>/torch_op.py) write their input checks with.

A check runs on every validated call of a torch op, where a whole call's budget is ~10 us: it reads metadata
only (no pass over the data), and pays for a message only when it fails. The pattern the bindings follow:
one cheap expression of all the conditions, returning when it holds, else `_explain` with one `need` per
condition for the message (f-strings passed to `need` are built before it is called: never on the fast path).

Errors are search_spaces.template's classes: each is the Python exception that says what is wrong and a
RuntimeError, which PyTorch raises for the same inputs. Needs no torch import (tensors are duck-typed).
"""

from __future__ import annotations

from typing import Any, Callable

from .template import InvalidInput

__all__ = ["fits", "need", "same_device_contiguous"]


def need(cond: bool, op: str, msg: str | Callable[[], str], exc: type[Exception] = InvalidInput) -> None:
    """Raise `exc("autotune.<op>: msg")` unless `cond`; `msg` may be a function, called only then."""
    if not cond:
        raise exc(f"autotune.{op}: {msg() if callable(msg) else msg}")


def fits(*tensors: Any) -> bool:
    """Whether the given tensors (None: absent) are on one device and contiguous, as the kernels read them:
    the cheap test (about 0.2 us a tensor) that `same_device_contiguous` explains when it fails."""
    device = None
    for t in tensors:
        if t is None:
            continue
        if device is None:
            device = t.device
        elif t.device != device:
            return False
        if not t.is_contiguous():
            return False
    return True


def same_device_contiguous(op: str, **tensors: Any) -> None:
    """The given tensors (None: absent) are on one device and contiguous, as the kernels read them."""
    if fits(*tensors.values()):
        return
    present = {k: t for k, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    need(len(devices) == 1, op, lambda: "all tensors must be on one device, got "
         + ", ".join(f"{k} on {t.device}" for k, t in present.items()))
    for name, t in present.items():
        need(t.is_contiguous(), op, f"{name} must be contiguous (call .contiguous() on it)")
