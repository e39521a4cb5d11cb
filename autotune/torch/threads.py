"""Thread-pool settings for tuned kernels running between PyTorch ops in one process.

TVM's CPU runtime starts its own thread pool (one per calling thread) on the first parallel kernel, and reads
its environment then: TVM_NUM_THREADS (else OMP_NUM_THREADS, else half the x86 hardware threads; `autotune`
makes it the core count), TVM_BIND_THREADS, TVM_EXCLUDE_WORKER0 and TVM_THREAD_POOL_SPIN_COUNT. After each
kernel its workers, pinned one per core, call sched_yield up to TVM_THREAD_POOL_SPIN_COUNT times (300000 by
default) before sleeping. PyTorch's OpenMP workers (libgomp; MKL and oneDNN run on them) busy-wait with `pause`
after their own regions. A yielding thread is never asleep, so it gets no wake-up preemption: when a libgomp
worker spins on its core, TVM's worker runs only at the next scheduler tick, and each pool waits for the
other's: a tuned op and a PyTorch op in a row cost many times the two alone, with 1000 spins as with 300000
(`python -m benchmarks.thread_pools`; benchmarks/MEASUREMENT.md). With 0 spins TVM's workers sleep after
each kernel; the next kernel wakes them, and the wake-up takes the core from a spinning libgomp thread at once.

The defaults are set by `autotune.thread_env.apply()` (re-exported here), which `import autotune` runs, before
any kernel of ours can start the pool (the tuner's workers and `autotune.kernel` get them too), with
`os.environ.setdefault` semantics: a variable the user set wins, and AUTOTUNE_THREAD_DEFAULTS=0 sets none.
This module adds `settings()` for reports, which needs torch. PyTorch's settings are left alone: libgomp reads
OMP_WAIT_POLICY when `import torch` loads it, so they cannot be changed from here.

All of this is the fallback now: kernels loaded from files run their parallel loops on PyTorch's OpenMP pool
instead of TVM's (`autotune.runtime.share_openmp_pool`; AUTOTUNE_PARALLEL=tvm opts out), so one pool serves
both and the TVM variables apply only to processes without libgomp and to AUTOTUNE_PARALLEL=tvm (kernels
compiled in-process are loaded from a library file too: `autotune.build.load_compiled`).
"""

from __future__ import annotations

import os

from ..runtime import PARALLEL_ENV, parallel_pool
from ..thread_env import DEFAULTS, OFF, VARIABLES, applied, apply

__all__ = ["DEFAULTS", "OFF", "VARIABLES", "applied", "apply", "settings"]


def settings() -> dict[str, str]:
    """The thread settings in effect, for reports: each variable that is set, marked where autotune set it,
    and PyTorch's thread count."""
    import torch

    ours = applied()
    out = {name: os.environ[name] + (" (autotune default)" if name in ours else "")
           for name in VARIABLES if name in os.environ}
    out["torch.get_num_threads()"] = str(torch.get_num_threads())
    out["kernels' parallel loops"] = (f"TVM's pool ({PARALLEL_ENV}=tvm)" if parallel_pool() == "tvm"
                                      else "PyTorch's OpenMP pool")
    return out

