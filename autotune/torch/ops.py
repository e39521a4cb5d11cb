"""`torch.ops.autotune.<NAME>`: one PyTorch custom operator per template that declares a `TorchBinding`.

Nothing here knows an operator: each template's binding (search_spaces/<op>/torch_op.py) gives the op's
signature and PyTorch implementation, its fake (meta) implementation, its checks, how a call is routed to
kernels and how chunks of kernels run it, and its backward. This module turns that into a
`torch.library.custom_op`, so the op works in eager mode and as one opaque node under
`torch.compile(fullgraph=True)`, with one dispatch for all:

    validate -> binding.check; binding.route -> Route(signature, size) or why PyTorch must run;
    REGISTRY.plan(op, device, signature, size) (cached) -> binding.run(chunks, *args), or PyTorch's
    implementation with one `NoTunedKernelWarning` per (op, device, signature, reason).

Tensors reach the kernel through DLPack, without copies; on a GPU the kernel runs on PyTorch's current stream.
Errors are both the Python exception that says what is wrong (TypeError, ValueError, IndexError) and a
RuntimeError, which is what PyTorch raises for the same inputs (search_spaces.template's error classes).
"""

from __future__ import annotations

import inspect
import threading
import warnings
from typing import Any, Callable

import torch

import search_spaces
from search_spaces.template import IndexOutOfRange, InvalidDtype, InvalidInput, Route, TorchBinding

from .registry import REGISTRY, device_key, load_default

__all__ = ["BINDINGS", "IndexOutOfRange", "InvalidDtype", "InvalidInput", "NoTunedKernelWarning", "register"]


class NoTunedKernelWarning(UserWarning):
    """No loaded kernel fits a call; PyTorch's implementation runs instead (warned once per workload)."""


_WARNED: set[tuple[Any, ...]] = set()
_WARN_LOCK = threading.Lock()


def _fallback(op: str, device: str, signature: Any, why: str) -> None:
    key = (op, device, signature, why)
    if key in _WARNED:
        return
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(f"autotune.{op}: {why}; running PyTorch's implementation", NoTunedKernelWarning, stacklevel=4)


BINDINGS: dict[str, TorchBinding] = {}  # NAME -> binding of every registered op


def _dispatch(name: str, b: TorchBinding) -> Callable[..., Any]:
    """The custom op's implementation: everything per op is looked up here, once, not per call."""
    params = list(inspect.signature(b.op).parameters.values())
    if not params or params[-1].name != "validate":
        raise TypeError(f"{name}: a TorchBinding's op must end with `validate: bool = True`")
    defaults = tuple(p.default for p in params)
    arity = len(params)
    device_arg = next(i for i, p in enumerate(params) if "Tensor" in str(p.annotation))
    check, route, run, fallback, describe, plan = b.check, b.route, b.run, b.op, b.describe, REGISTRY.plan

    def impl(*args: Any) -> Any:
        if len(args) < arity:  # the dispatcher leaves trailing defaults out
            args = args + defaults[len(args):]
        if args[-1]:
            check(*args)
        r = route(*args)
        if r.__class__ is not Route:
            _fallback(name, device_key(args[device_arg].device), None, r)
            return fallback(*args)
        if r.size < 1:  # nothing for a kernel to do: not worth one (nor a warning)
            return fallback(*args)
        load_default()
        dev = device_key(args[device_arg].device)
        chunks = plan(name, dev, r.signature, r.size)
        if chunks is None:
            _fallback(name, dev, r.signature, f"no loaded kernel for {describe(r.signature)} on {dev}")
            return fallback(*args)
        return run(chunks, *args)

    impl.__doc__ = b.op.__doc__
    return impl


def register(template: Any) -> TorchBinding | None:
    """Make `torch.ops.autotune.<template.NAME>` from the template's binding (once; None if it has none).

    In-tree templates are registered on import; `autotune.torch.load` registers out-of-tree ones it meets."""
    name = template.NAME
    if name in BINDINGS:
        return BINDINGS[name]
    binding = getattr(template, "torch_binding", None)  # an out-of-tree template may have no torch op
    b = binding() if binding is not None else None
    if b is None:
        return None
    schema = torch.library.infer_schema(b.op, mutates_args=())
    op = torch.library.custom_op(f"autotune::{name}", _dispatch(name, b), mutates_args=(), schema=schema)
    op.register_fake(b.fake)
    if b.backward is not None:
        op.register_autograd(b.backward, setup_context=b.setup_context)
    BINDINGS[name] = b
    return b


for _name in search_spaces.names():
    register(search_spaces.get(_name))
