"""The workloads the op-level benchmarks time, and a package of kernels for them."""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from autotune.task import Task

# DLRM's one-hot embedding bag: one index per bag over a Criteo table capped at 200,000 rows.
ONE_HOT_BAG = dict(rows=200000, dim=64, batch=2048, pooling=(1, 1))
# A layer of DLRM's bottom MLP (batch, in, out): PyTorch runs it on MKL/oneDNN, on its OpenMP pool.
MLP_LINEAR = (2048, 512, 256)


def kernel_package(tasks: Sequence[Task], logs: Sequence[str] = (), prefix: str = "autotune-bench-") -> str:
    """Export a package with one kernel per task into a new temporary directory and return its path: the best
    config `logs` hold for the task, else the template's default (untuned) config."""
    # Imported on use: a process that needs only the shapes (thread_pools' children) does not load TVM for them.
    from autotune.package import export
    from autotune.tuning_log import TuningLog

    out = tempfile.mkdtemp(prefix=prefix)
    logged = TuningLog(logs)
    export([logged.best(t, include_stale=True) or t.record(t.space.default(), costs=(0.0,)) for t in tasks], out)
    return out
