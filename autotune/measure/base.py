"""What every runner is: the `Runner` protocol and its result per candidate, `Measured`.

A runner takes the candidates the builder compiled for one task and says, for each, what running it cost or
how it failed. Where it runs them is its own business: a worker process here (`local`), a directory another
machine measures (`offline`), a farm behind a TVM RPC tracker (`rpc`), or a cache in front of another runner
(`cache`). The tuner knows only this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

from ..build import Built
from ..task import Task


@dataclass(frozen=True)
class Measured:
    """One candidate's outcome: the seconds of each timed call, or an error kind (`records.ERROR_KINDS`) and
    message. A candidate that did not build keeps its build error."""

    built: Built
    costs: tuple[float, ...] = ()
    error_kind: str | None = None
    error: str | None = None

    @classmethod
    def unbuilt(cls, built: Built) -> "Measured":
        """A candidate that did not build: nothing to run, its build error stands."""
        return cls(built, (), built.error_kind, built.error)


@runtime_checkable
class Runner(Protocol):
    """Measures built candidates of one task.

    `measure` returns one `Measured` per `Built`, in their order; a candidate's failure (wrong result, crash,
    hang) is its `Measured`'s error, never an exception, and the libraries handed over are consumed (measured
    and removed, or moved to where they are measured). An exception means the runner itself cannot go on (an
    unreachable farm). `close` stops whatever workers it started.
    """

    def measure(self, task: Task, built: Sequence[Built]) -> list[Measured]: ...

    def close(self) -> None: ...
