"""A runner from its text, as `--runner`, `autotune.tune(runner=...)` and `tune_model(runner=...)` take it."""

from __future__ import annotations

from ..runtime import Timing
from .base import Runner

RUNNER_SPECS = "local, offline:DIR or rpc://HOST:PORT/KEY"


def runner_kind(spec: str) -> str:
    """"local", "offline" or "rpc": which runner `spec` names (ValueError for text that names none), so a caller
    can refuse a bad spec before it starts any work."""
    kind, _, where = spec.partition(":")
    if spec == "local" or (kind == "offline" and where) or kind == "rpc":
        return "local" if spec == "local" else kind
    raise ValueError(f"unknown runner {spec!r}; expected {RUNNER_SPECS}")


def make_runner(spec: str, timing: Timing = Timing()) -> Runner | None:
    """`local` (None: the tuner makes its own `LocalRunner`, after checking that this machine has the task's
    device), `offline:DIR` or `rpc://HOST:PORT/KEY`; the caller closes what it gets."""
    kind = runner_kind(spec)
    if kind == "offline":
        from .offline import OfflineRunner

        return OfflineRunner(spec.partition(":")[2], timing)
    if kind == "rpc":
        from .rpc import RPCRunner

        return RPCRunner(spec, timing)
    return None
