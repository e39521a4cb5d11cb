"""A runner from its text, as `--runner` and `autotune.tune(runner=...)` take it."""

from __future__ import annotations

from ..runtime import Timing
from .base import Runner


def make_runner(spec: str, timing: Timing = Timing()) -> Runner | None:
    """`local` (None: the tuner makes its own `LocalRunner`, after checking that this machine has the task's
    device), `offline:DIR` or `rpc://HOST:PORT/KEY`; the caller closes what it gets."""
    if spec == "local":
        return None
    kind, _, where = spec.partition(":")
    if kind == "offline" and where:
        from .offline import OfflineRunner

        return OfflineRunner(where, timing)
    if kind == "rpc":
        from .rpc import RPCRunner

        return RPCRunner(spec, timing)
    raise ValueError(f"unknown runner {spec!r}; expected local, offline:DIR or rpc://HOST:PORT/KEY")
