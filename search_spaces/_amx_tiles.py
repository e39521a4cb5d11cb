"""AMX's tile configuration as a TVMScript macro, for kernels that write their tile instructions themselves
(embedding_interaction's Gram matrices, split_linear's products): each of the 8 tiles 16 rows of 64 bytes.

A thread's tiles keep the last configuration it loaded, which may be another kernel's: such a kernel loads this
one at each parallel task's start, before its first tile instruction. (qmatmul's tensor intrinsic,
`intrinsics.amx_block`, holds its own copy inside the intrinsic.) TVM is imported on first use only.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["ROWS", "tile_config"]

ROWS = 16  # rows of every tile (palette 1)


@functools.cache
def tile_config() -> Any:
    """The macro `load()`: the configuration in a 64-byte buffer, then `ldtilecfg`."""
    from tvm.script import tirx as T

    @T.macro
    def load():
        config = T.sblock_alloc_buffer((64,), "uint8")
        for byte in range(64):
            config[byte] = T.uint8(0)
        config[0] = T.uint8(1)  # palette 1
        for t in range(8):
            config[16 + 2 * t] = T.uint8(64)  # bytes per row (little-endian u16)
            config[48 + t] = T.uint8(ROWS)  # rows
        T.evaluate(T.call_llvm_intrin("void", "llvm.x86.ldtilecfg", T.address_of(config[0])))

    return load
