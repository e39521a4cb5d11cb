"""Thread-pool settings for tuned kernels running between PyTorch ops in one process.

TVM's CPU runtime starts its own thread pool (one per calling thread) on the first parallel kernel, and reads
its environment then: TVM_NUM_THREADS (else OMP_NUM_THREADS, else half the x86 hardware threads; `autotune`
makes it the core count), TVM_BIND_THREADS, TVM_EXCLUDE_WORKER0 and TVM_THREAD_POOL_SPIN_COUNT. After each
kernel its workers, pinned one per core, call sched_yield up to TVM_THREAD_POOL_SPIN_COUNT times (300000 by
default) before sleeping. PyTorch's OpenMP workers (libgomp; MKL and oneDNN run on them) busy-wait with `pause`
after their own regions. A yielding thread is never asleep, so it gets no wake-up preemption: when a libgomp
worker spins on its core, TVM's worker runs only at the next scheduler tick, and each pool waits for the
other's. A tuned one-hot embedding bag then F.embedding_bag cost 4.0 ms per pair against 0.2 ms for the two
alone, with 1000 spins as with 300000 (benchmarks/thread_pools.py). With 0 spins TVM's workers sleep after
each kernel; the next kernel wakes them, and the wake-up takes the core from a spinning libgomp thread at once.

`apply()` runs when `autotune.torch` is imported, before any kernel of ours can start the pool, and sets
defaults with `os.environ.setdefault` semantics: a variable the user set wins, and AUTOTUNE_THREAD_DEFAULTS=0
sets none. PyTorch's settings are left alone: libgomp reads OMP_WAIT_POLICY when `import torch` loads it, so
they cannot be changed from here (set OMP_WAIT_POLICY=PASSIVE before starting Python on a shared machine).
"""

from __future__ import annotations

import os
from typing import MutableMapping

__all__ = ["DEFAULTS", "OFF", "VARIABLES", "applied", "apply", "settings"]

OFF = "AUTOTUNE_THREAD_DEFAULTS"  # "0": leave every thread variable as the environment has it
DEFAULTS: dict[str, str] = {
    "TVM_THREAD_POOL_SPIN_COUNT": "0",  # workers sleep after each kernel: PyTorch's threads get the cores
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
