"""Embedding tables in 2 MB pages.

A random row of a table larger than the TLB's reach (a few MB in 4 KB pages) costs a page walk before its cache
miss, and a core walks only a few pages at once: the walks, not the memory, cap the misses in flight. A table in
2 MB pages needs a TLB entry per 2 MB instead. Linux backs anonymous memory with them (transparent huge pages)
where it is asked to with `madvise(MADV_HUGEPAGE)` before the memory is first touched, which works in THP's
default `madvise` mode, where PyTorch's allocations get 4 KB pages. The tables the embedding modules make (a
conversion to int8 rows, the table-batched op's concatenation) and those the tuner measures on live there;
benchmarks/EMBEDDING_BAG.md has what it buys.
"""

from __future__ import annotations

import math
import mmap
import re
from typing import Any, Sequence

HUGE_PAGE_BYTES = 2 << 20
MIN_TABLE_BYTES = 4 * HUGE_PAGE_BYTES  # smaller tables' 4 KB pages fit the second-level TLB


def supported() -> bool:
    """Whether this platform can be asked for transparent huge pages (Linux' madvise)."""
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS")


def empty(shape: Sequence[int], dtype: Any) -> Any:
    """An uninitialised CPU tensor in fresh anonymous memory advised for 2 MB pages, 2 MB-aligned; a plain
    `torch.empty` where it is smaller than MIN_TABLE_BYTES or the platform cannot be asked (the kernel may still
    back it with 4 KB pages: THP disabled, or no free 2 MB frames). Its memory lives as long as it does."""
    import torch

    shape = tuple(int(s) for s in shape)
    nbytes = torch.empty(0, dtype=dtype).element_size() * math.prod(shape)
    if nbytes < MIN_TABLE_BYTES or not supported():
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without THP: ordinary memory
        pass
    raw = torch.frombuffer(region, dtype=torch.uint8)  # the tensor keeps `region` alive
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    return raw[start:start + nbytes].view(dtype).view(shape)


def in_huge_pages(t: Any) -> Any:
    """A contiguous copy of CPU tensor `t`'s values in `empty`'s memory (detached: for `param.data = ...`); `t`
    itself where it is not on the CPU or is smaller than MIN_TABLE_BYTES. A plain tensor: `copy_`, autograd and
    `load_state_dict` work on it."""
    import torch

    if not isinstance(t, torch.Tensor):
        raise TypeError(f"in_huge_pages takes a tensor, got {type(t).__name__}")
    if t.device.type != "cpu" or t.numel() * t.element_size() < MIN_TABLE_BYTES or not supported():
        return t
    out = empty(t.shape, t.dtype)
    with torch.no_grad():
        out.copy_(t)
    return out


def huge_page_bytes(t: Any) -> int:
    """How many bytes of the mapping that holds `t` the kernel backs with huge pages now (Linux'
    /proc/self/smaps; 0 where it cannot tell): what a test or a report checks."""
    start = t.data_ptr()
    try:
        with open("/proc/self/smaps") as f:
            text = f.read()
    except OSError:
        return 0
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text):
        lo, hi = (int(x, 16) for x in block.split(" ", 1)[0].split("-"))
        if lo <= start < hi:
            found = re.search(r"AnonHugePages:\s+(\d+) kB", block)
            return int(found.group(1)) << 10 if found else 0
    return 0
