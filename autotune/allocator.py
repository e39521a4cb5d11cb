"""Freed memory kept in the process, so that a model's large activations are not page-faulted in every batch.

PyTorch's CPU tensors come from malloc and go back to it when freed. glibc serves a block above its mmap
threshold (128 KB, rising as such blocks are freed, to 32 MB at most) with a fresh mapping and unmaps it on free,
and gives the top of its heap back to the kernel past a trim threshold: a model that allocates the same large
activations for every batch faults their pages in again every time (a 2048 x 3456 float32 activation, one of
DLRMv2's cross layers, is 28 MB: 7,000 pages). Serving stacks preload jemalloc or tcmalloc for this (Intel's
MLPerf DLRMv2 runs do). `keep_freed_memory` asks glibc for the same: every block from its heap (M_MMAP_MAX 0)
and freed memory kept there (M_TRIM_THRESHOLD at its largest), so from the second batch on a model reuses pages
it has already touched. It acts on the whole process (every library's allocations, from then on): applications
and benchmarks call it before they build their models; `tune_model` does not (an application's allocator is its
own choice). Measured in benchmarks/WHOLE_MODEL.md (twenty-second session). Imports neither torch nor TVM.
"""

from __future__ import annotations

import ctypes
import os

__all__ = ["keep_freed_memory"]

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4
_LARGEST = 2**31 - 1  # mallopt takes an int
PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")


def keep_freed_memory() -> str:
    """Make glibc's malloc keep what is freed (see the module doc) and say what was done: nothing where another
    allocator is preloaded or the C library is not glibc."""
    preload = os.environ.get("LD_PRELOAD", "")
    other = next((name for name in PRELOADED if name in preload), None)
    if other is not None:
        return f"{other} (LD_PRELOAD): left as it is"
    try:
        libc = ctypes.CDLL(None)  # the process's own C library (no search for its file)
        version = libc.gnu_get_libc_version
    except (OSError, AttributeError):
        return "not glibc: malloc left as it is"
    version.restype = ctypes.c_char_p
    if libc.mallopt(M_MMAP_MAX, 0) != 1 or libc.mallopt(M_TRIM_THRESHOLD, _LARGEST) != 1:
        return f"glibc {version().decode()}: mallopt refused, malloc left as it is"
    return f"glibc {version().decode()}, every block from its heap and freed memory kept (autotune.allocator)"
