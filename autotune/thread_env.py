"""Thread-pool environment defaults, set when `autotune` is imported, before any TVM thread pool starts.

TVM reads TVM_THREAD_POOL_SPIN_COUNT when its pool starts (the first parallel kernel). By default its workers
yield 300000 times after each kernel, and next to PyTorch's spinning OpenMP workers that costs 20x on a tuned
op between PyTorch ops (autotune/torch/threads.py has the measurements). Setting it here, not only in
`autotune.torch`, gives the same default to the tuner's workers (they inherit the environment) and to
`autotune.kernel`. A variable the user set wins; AUTOTUNE_THREAD_DEFAULTS=0 sets none. This module imports
neither torch nor TVM, so `import autotune` stays light.
"""

from __future__ import annotations

import os
from typing import MutableMapping

__all__ = ["DEFAULTS", "OFF", "VARIABLES", "applied", "apply"]

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
    """The variables autotune set in this process's environment (empty when the user set them all)."""
    return dict(_APPLIED)
