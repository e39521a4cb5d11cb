"""How an embedding table stores its rows: the `dtype` field of the embedding-bag workloads.

Gathers of random rows are bound by the bytes each lookup moves, so tables are served at reduced precision
(as FBGEMM and TorchRec serve inference tables): fp16 and bf16 rows, and int8 rows in FBGEMM's fused 8-bit
row-wise layout, each row its `dim` uint8 values, then its float32 scale and bias (FBGEMM's
`FloatToFused8BitRowwiseQuantized`, written by PyTorch's `torch.ops.quantized.embedding_bag_byte_prepack`), so
that tables quantized that way load as they are: value = scale * q + bias. (TorchRec's inference TBE keeps an fp16
scale and bias before each row instead: such a table needs converting.) Every kernel accumulates and writes float32; the reference is the float32 pooling of
the dequantized table. No TVM at module level: a package of exported kernels runs without it.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

DTYPES = ("float32", "float16", "bfloat16", "int8")
FUSED_BYTES = 8  # an int8 row's float32 scale and bias, after its values
LINE_BYTES = 64  # a cache line: the CPU kernels' prefetch step

_STORAGE = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "int8": "uint8"}
_ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1}


@dataclass(frozen=True)
class RowFormat:
    """The storage of a table of `dim`-wide rows of `dtype` (one of DTYPES)."""

    dtype: str
    dim: int

    @property
    def storage(self) -> str:
        """The element dtype of the table's tensor (and of the kernel's table buffer)."""
        return _STORAGE[self.dtype]

    @property
    def fused(self) -> bool:
        """Whether each row carries its scale and bias (int8)."""
        return self.dtype == "int8"

    @property
    def width(self) -> int:
        """Elements of the storage dtype in a row: dim, and the fused scale and bias' bytes for int8."""
        return self.dim + (FUSED_BYTES if self.fused else 0)

    @property
    def row_bytes(self) -> int:
        """What gathering one row moves."""
        return self.width * self.item_bytes

    @property
    def item_bytes(self) -> int:
        return _ITEM_BYTES[self.storage]

    @property
    def line_elements(self) -> int:
        """Storage elements in a 64-byte cache line (the prefetch step)."""
        return LINE_BYTES // self.item_bytes

    @property
    def lines_touched(self) -> int:
        """The most 64-byte cache lines one row of a line-aligned table spans (72-byte int8 rows of dim 64: 2)."""
        offset = LINE_BYTES - math.gcd(self.row_bytes, LINE_BYTES)  # the latest a row can start in its line
        return -(-(offset + self.row_bytes) // LINE_BYTES)

    def aligned_vector(self, lanes: int) -> bool:
        """Whether `lanes` values of a row are one aligned vector access at every multiple of `lanes` in every
        row (GPU vector loads need it): they divide the dimension, and the row's bytes divide into them."""
        return self.dim % lanes == 0 and self.row_bytes % (lanes * self.item_bytes) == 0

    # ---- the kernels' side (TVMScript; called while a kernel is parsed) ---------------------------------
    def scales(self, W: Any) -> Any:
        """The float32 view of an int8 table's rows that its scales and biases are read through (declared in the
        kernel's signature, on W's data; rows of dim + 8 bytes are whole float32 words when dim % 4 == 0)."""
        from tvm.script import tirx as T

        return T.decl_buffer((W.shape[0], self.width // 4), "float32", data=W.data)

    def load(self, W: Any, S: Any, row: Any, d: Any, bias: bool = True) -> Any:
        """Element d of row `row` of table W as float32 (S: `scales(W)` for int8, unused otherwise); without the
        int8 row's `bias`, which a kernel may add once per row instead of once per element (`bias_of`)."""
        from tvm.script import tirx as T

        if self.dtype == "float32":
            return W[row, d]
        value = T.Cast("float32", W[row, d])
        if self.fused:
            scaled = value * S[row, self.dim // 4]
            return scaled + self.bias_of(S, row) if bias else scaled
        return value

    def bias_of(self, S: Any, row: Any) -> Any:
        """An int8 row's bias (S: `scales(W)`)."""
        return S[row, self.dim // 4 + 1]


def check_dtype(dtype: str, dim: int) -> str | None:
    """Why a table of `dtype` rows of `dim` cannot be served (None if it can)."""
    if dtype not in DTYPES:
        return f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}"
    if dtype == "int8" and dim % 4:
        return f"int8 rows need dim % 4 == 0 (their float32 scale and bias follow the values), got dim={dim}"
    return None


# ---- torch side ---------------------------------------------------------------------------------------------
def torch_storage(dtype: str) -> Any:
    """The torch dtype of a table of `dtype` rows (uint8 bytes for int8's fused rows)."""
    import torch

    return getattr(torch, _STORAGE[dtype])


def table_dtype(weight: Any) -> str | None:
    """The row dtype a tensor holds, by its element type (uint8: fused int8 rows), or None (e.g. float64)."""
    return _torch_dtypes().get(weight.dtype)


@functools.cache
def _torch_dtypes() -> dict[Any, str]:
    return {torch_storage(d): d for d in DTYPES}


def quantize(weight: Any, dtype: str) -> Any:
    """A float32 (rows, dim) table in `dtype`'s storage: a cast, or FBGEMM's fused int8 rows (PyTorch's
    `quantized::embedding_bag_byte_prepack`, which is FBGEMM's). Where the result is a kernel's table, its
    holder puts it in 2 MB pages (pages.py); the accuracy simulations that convert and read back do not."""
    import torch

    if dtype == "int8":
        return torch.ops.quantized.embedding_bag_byte_prepack(weight.detach().float().contiguous())
    return weight.detach().to(torch_storage(dtype)).contiguous()


def dequantize(table: Any, dtype: str) -> Any:
    """The float32 values of (some rows of) a table of `dtype` rows: what the kernels pool."""
    import torch

    if dtype != "int8":
        return table.float()
    dim = table.shape[-1] - FUSED_BYTES
    scale_bias = table[..., dim:].contiguous().view(torch.float32)
    return table[..., :dim].float() * scale_bias[..., :1] + scale_bias[..., 1:]
