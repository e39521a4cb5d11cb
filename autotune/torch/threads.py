"""Thread-pool settings for tuned kernels running between PyTorch ops in one process.

TVM's CPU runtime starts its own thread pool (per calling thread) on the first parallel kernel and reads its
environment then: TVM_NUM_THREADS (else OMP_NUM_THREADS, else the core count), TVM_BIND_THREADS,
TVM_EXCLUDE_WORKER0 and TVM_THREAD_POOL_SPIN_COUNT. After each kernel its workers busy-wait (sched_yield) for
up to TVM_THREAD_POOL_SPIN_COUNT iterations, 300000 by default: on the cores PyTorch's OpenMP threads need for
the next op. A tuned op followed by a PyTorch op then cost 30x the two alone (benchmarks/thread_pools.py).
`apply()` runs when `autotune.torch` is imported, before any kernel of ours can start the pool, and sets
defaults with `os.environ.setdefault`: a variable the user set wins, and AUTOTUNE_THREAD_DEFAULTS=0 sets none.
PyTorch's own settings are left alone (libgomp reads OMP_WAIT_POLICY when `import torch` loads it, so they
could not be changed from here anyway).
"""

from __future__ import annotations

import os
from typing import MutableMapping

__all__ = ["DEFAULTS", "OFF", "VARIABLES", "applied", "apply", "settings"]

OFF = "AUTOTUNE_THREAD_DEFAULTS"  # "0": leave every thread variable as the environment has it
DEFAULTS: dict[str, str] = {
    "TVM_THREAD_POOL_SPIN_COUNT": "0",
}
VARIABLES = ("TVM_NUM_THREADS", "TVM_BIND_THREADS", "TVM_EXCLUDE_WORKER0", "TVM_THREAD_POOL_SPIN_COUNT",
             "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
_APPLIED: dict[str, str] = {}


def apply(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set each default the environment lacks (unless AUTOTUNE_THREAD_DEFAULTS=0); returns what it set."""
    env = os.environ if environ is None else environ
    if env.get(OFF, "").strip() == "0":
        return {}
    done = {name: value for name, value in DEFAULTS.items() if name not in env}
    env.update(done)
    if environ is None:
        _APPLIED.update(done)
    return done


def applied() -> dict[str, str]:
    """The variables `autotune.torch` set in this process (empty when the user's environment set them all)."""
    return dict(_APPLIED)


def settings() -> dict[str, str]:
    """The thread settings in effect, for reports: each variable that is set, marked where autotune set it,
    and PyTorch's thread count."""
    import torch

    out = {name: os.environ[name] + (" (autotune default)" if name in _APPLIED else "")
           for name in VARIABLES if name in os.environ}
    out["torch.get_num_threads()"] = str(torch.get_num_threads())
    return out


apply()  # at import of autotune.torch: before any kernel of ours starts TVM's pool
