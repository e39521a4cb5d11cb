"""`torch.ops.autotune.<NAME>`: one PyTorch operator per template that declares a `TorchBinding`.

Nothing here knows an operator: each template's binding (search_spaces/<op>/torch_op.py) gives the op's
signature and PyTorch implementation, its fake (meta) implementation, its checks, how a call is routed to
kernels and how chunks of kernels run it, and its backward. This module turns that into an operator of the
`autotune` library (`torch.library.Library`: schema inferred from the binding's `op`), so it works in eager
mode, in `torch.inference_mode` and as one opaque node under `torch.compile(fullgraph=True)`, with one dispatch
for all:

    validate -> binding.check; binding.route -> Route(signature, size) or why PyTorch must run;
    REGISTRY.plan(op, device, signature, size) (cached) -> binding.run(chunks, *args), or PyTorch's
    implementation with one `NoTunedKernelWarning` per (op, device, signature, reason).

Why not `torch.library.custom_op`: its Python layers cost more a call than a small kernel takes
(benchmarks/MEASUREMENT.md). Here a call crosses from the dispatcher into Python at most once:
  - the dispatch above is the kernel at the "CPU" and "CUDA" keys ("CompositeExplicitAutograd" serves other
    devices, which run PyTorch's implementation), and `torch.library.register_fake` gives the meta/fake one;
  - every op has a kernel at the "Autograd" key (`_autograd`): when no gradient is needed and the call holds
    plain CPU or CUDA tensors, it runs the dispatch itself, so grad mode costs what inference mode does; else
    (gradients, fake or functional tensors, dispatch modes) it takes the way `torch.library.register_autograd`
    takes, redispatching below autograd. An op whose binding has no backward raises on backward, as before;
  - on the CPU, where the compiled call path builds (`callpath`), a C++ kernel takes the CPU and Autograd keys:
    it replays the CPU dispatch's decision for calls of metadata seen before (no Python at all: a few us over
    the TVM function) and hands everything else to the two Python kernels above.

Tensors reach the kernel as they are: tvm_ffi converts torch tensors through DLPack's C exchange API, without
copies (about 0.2 us a tensor); on a GPU the kernel runs on PyTorch's current stream.
Errors are both the Python exception that says what is wrong (TypeError, ValueError, IndexError) and a
RuntimeError, which is what PyTorch raises for the same inputs (search_spaces.template's error classes).
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch._C import DispatchKey, DispatchKeySet
from torch._library.autograd import make_autograd_impl

import search_spaces
from search_spaces.template import IndexOutOfRange, InvalidDtype, InvalidInput, Route, TorchBinding

from . import callpath, registry
from .registry import REGISTRY, device_key, load_default

__all__ = ["BINDINGS", "IndexOutOfRange", "InvalidDtype", "InvalidInput", "LIBRARY", "NoTunedKernelWarning",
           "register"]

LIBRARY = torch.library.Library("autotune", "FRAGMENT")  # holds every registration: kept for the process


class NoTunedKernelWarning(UserWarning):
    """No loaded kernel fits a call; PyTorch's implementation runs instead (warned once per workload)."""


_WARNED: set[tuple[Any, ...]] = set()
_WARN_LOCK = threading.Lock()
_INTERNAL = (os.path.dirname(torch.__file__), os.path.dirname(__file__),  # frames a warning skips: torch, this
             os.path.dirname(search_spaces.__file__))  # package and the operators' modules (their forward)


def _caller_level() -> int:
    """`stacklevel` of the first frame outside torch, autotune.torch and search_spaces: the user's call of the op
    or of the module that calls it."""
    frame, level = sys._getframe(2), 2  # _fallback's caller (stacklevel 1 is _fallback)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level


def _fallback(op: str, device: str, signature: Any, why: str) -> None:
    key = (op, device, signature, why)
    if key in _WARNED:
        return
    with _WARN_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    warnings.warn(f"autotune.{op}: {why}; running PyTorch's implementation", NoTunedKernelWarning,
                  stacklevel=_caller_level())


BINDINGS: dict[str, TorchBinding] = {}  # NAME -> binding of every registered op
_AUTOGRAD: dict[str, Callable[..., Any]] = {}  # NAME -> its kernel at the Autograd key
PYTHON_DISPATCH: dict[str, Callable[..., Any]] = {}  # NAME -> its Python CPU dispatch (positional arguments), which
#   the compiled call path falls back to: benchmarks time it beside the op


def _dispatch(name: str, b: TorchBinding, device: str | None) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The op's implementation at one dispatch key, and its recording twin (`callpath`): everything per op is
    looked up here, once, not per call.

    `device` is the kernel device when the key names it ("cpu"); None reads it from the call's first tensor."""
    params = list(inspect.signature(b.op).parameters.values())
    if not params or params[-1].name != "validate":
        raise TypeError(f"{name}: a TorchBinding's op must end with `validate: bool = True`")
    defaults = tuple(p.default for p in params)
    arity = len(params)
    device_arg = next(i for i, p in enumerate(params) if "Tensor" in str(p.annotation))
    check, route, run, fallback, describe, plan = b.check, b.route, b.run, b.op, b.describe, REGISTRY.plan
    always = bool(b.replayable)
    replayable = b.replayable if callable(b.replayable) else (lambda *args: always)
    plans = REGISTRY.plans  # the registry's cache of plans, read without a call

    def select(args: tuple[Any, ...]) -> Any:
        """The chunks that run the call, or None where PyTorch's implementation must (warned once)."""
        if args[-1]:
            check(*args)
        r = route(*args)
        if r.__class__ is not Route:
            _fallback(name, device or device_key(args[device_arg].device), None, r)
            return None
        if r.size < 1:  # nothing for a kernel to do: not worth one (nor a warning)
            return None
        if not registry._DEFAULT_LOADED:
            load_default()
        dev = device or device_key(args[device_arg].device)
        chunks = plans.get((name, dev, r.signature, r.size), registry)  # (the registry: "not planned yet")
        if chunks is registry:
            chunks = plan(name, dev, r.signature, r.size)
        if chunks is None:
            _fallback(name, dev, r.signature, f"no loaded kernel for {describe(r.signature)} on {dev}")
        return chunks

    def impl(*args: Any) -> Any:
        if len(args) < arity:  # the dispatcher leaves trailing defaults out
            args = args + defaults[len(args):]
        chunks = select(args)
        return fallback(*args) if chunks is None else run(chunks, *args)

    def record(*args: Any) -> tuple[Any, Any]:
        """`impl`, and how the compiled call path may replay the call (None: it may not)."""
        if len(args) < arity:
            args = args + defaults[len(args):]
        chunks = select(args)
        if chunks is None:
            return fallback(*args), None
        if len(chunks) != 1 or not replayable(*args):
            return run(chunks, *args), None
        return callpath.capture(chunks[0].kernel, lambda: run(chunks, *args), args)

    impl.__doc__ = b.op.__doc__
    return impl, record


@dataclass
class _Backward:
    """What torch's autograd wrapper reads (`torch.library.register_autograd` keeps the same two fields)."""

    _backward_fn: Callable[..., Any] | None
    _setup_context_fn: Callable[..., Any] | None


_AFTER_AUTOGRAD = torch._C._after_autograd_keyset
_PLAIN = {DispatchKeySet(DispatchKey.CPU).raw_repr(): "cpu", DispatchKeySet(DispatchKey.CUDA).raw_repr(): "cuda"}


def _autograd(op: Any, b: TorchBinding, direct: dict[str, Callable[..., Any]]) -> Callable[..., Any]:
    """The op's kernel at the Autograd key: the dispatch itself (`direct[device]`) when no gradient is needed and
    nothing but the dense CPU or CUDA key lies below autograd; else torch's own autograd wrapper (an
    autograd.Function around the op redispatched below autograd), which raises on backward if `b` has none."""
    slow = make_autograd_impl(op, _Backward(b.backward, b.setup_context))
    plain: dict[int, Callable[..., Any] | None] = {}  # raw keyset -> the direct dispatch, or None
    grad_enabled, any_requires_grad = torch._C.is_grad_enabled, torch._C._any_requires_grad

    def kernel(keyset: Any, *args: Any) -> Any:
        raw = keyset.raw_repr()
        try:
            impl = plain[raw]
        except KeyError:
            impl = plain.setdefault(raw, direct.get(_PLAIN.get((keyset & _AFTER_AUTOGRAD).raw_repr(), "")))
        if impl is not None and not (grad_enabled() and any_requires_grad(*args)):
            return impl(*args)
        return slow(keyset, *args)

    kernel.plain = plain  # type: ignore[attr-defined]  (what it decided, per keyset: the tests read it)
    return kernel


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
    LIBRARY.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    (cpu, record), (any_device, _) = _dispatch(name, b, "cpu"), _dispatch(name, b, None)
    PYTHON_DISPATCH[name] = cpu
    direct = {"cpu": cpu, "cuda": any_device}
    LIBRARY.impl(name, any_device, "CUDA")
    LIBRARY.impl(name, any_device, "CompositeExplicitAutograd")  # other devices: PyTorch's
    torch.library.register_fake(f"autotune::{name}", b.fake, lib=LIBRARY)
    op = getattr(torch.ops.autotune, name).default
    _AUTOGRAD[name] = _autograd(op, b, direct)
    if not callpath.install(name, cpu, record, _AUTOGRAD[name]):  # else C++ serves the CPU and Autograd keys
        LIBRARY.impl(name, cpu, "CPU")
        LIBRARY.impl(name, _AUTOGRAD[name], "Autograd", with_keyset=True)
    BINDINGS[name] = b
    return b


registry.on_register(register)  # `load` registers the ops of a package's out-of-tree templates through it
for _name in search_spaces.names():
    register(search_spaces.get(_name))
