"""FBGEMM's table-batched embedding bag (TBE), as a peer of the embedding-bag kernels in benchmarks.

`IntNBitTableBatchedEmbeddingBagsCodegen` is FBGEMM's inference TBE, what TorchRec serves recommendation models
with on a CPU. It comes with `fbgemm-gpu-cpu`, an optional extra (`pip install --no-deps fbgemm-gpu-cpu==1.8.0`,
the release that pairs with torch 2.13): without it there is simply no such peer. It is built at the table's
precision (fp32, fp16 or int8 rows, not bf16; its int8 rows carry an fp16 scale and bias, filled from the fused
rows' float32 ones) and writes float32, as the kernels do. Modules are built once per table and reused by every
batch of a benchmark.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from .rows import FUSED_BYTES

__all__ = ["available", "tbe"]

_MODES = {"sum": "SUM", "mean": "MEAN"}
_TYPES = {"float32": "FP32", "float16": "FP16", "int8": "INT8"}  # (its inference TBE has no bf16 rows)


@functools.cache
def available() -> bool:
    """Whether FBGEMM's TBE can be imported here (fbgemm-gpu-cpu installed, for this torch)."""
    try:
        import fbgemm_gpu.split_table_batched_embeddings_ops_inference  # noqa: F401
    except Exception:  # an absent package, or one built for another torch, fails in many ways
        return False
    return True


_LAST: list[Any] = []  # [tables, key, module] of the last build: a benchmark's batches share their tables


def tbe(dtype: str, tables: Sequence[Any], mode: str) -> Callable[[Any, Any], Any] | None:
    """A call (indices, offsets) -> (batch, tables * dim) float32 of FBGEMM's TBE over `tables` (each a table of
    `dtype` rows, rows.py) in TBE's layout (table-major offsets of tables * batch + 1 entries, indices local to
    their table), or None where FBGEMM is absent or lacks the precision (bf16) or mode (max). Built once per tables."""
    if not available() or mode not in _MODES or dtype not in _TYPES:
        return None
    key = (dtype, mode, tuple(id(t) for t in tables))  # ids of tables _LAST keeps alive: not reused
    if not _LAST or _LAST[1] != key:
        _LAST[:] = [list(tables), key, _build(dtype, tables, mode)]
    module = _LAST[2]

    def call(indices: Any, offsets: Any) -> Any:
        return module(indices, offsets)

    return call


def _build(dtype: str, tables: Sequence[Any], mode: str) -> Any:
    import torch
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen

    sparse = getattr(SparseType, _TYPES[dtype])
    dims = [t.shape[1] - (FUSED_BYTES if dtype == "int8" else 0) for t in tables]
    module = IntNBitTableBatchedEmbeddingBagsCodegen(
        [(f"t{i}", t.shape[0], d, sparse, EmbeddingLocation.HOST) for i, (t, d) in enumerate(zip(tables, dims))],
        device="cpu", pooling_mode=getattr(PoolingMode, _MODES[mode]), output_dtype=SparseType.FP32)
    module.initialize_weights()
    with torch.no_grad():
        for t, d, (dest, scale_bias) in zip(tables, dims, module.split_embedding_weights()):
            if dtype == "int8":
                dest.copy_(t[:, :d])
                fused = t[:, d:].contiguous().view(torch.float32)  # (rows, 2): scale, bias
                scale_bias.view(torch.float16).copy_(fused.to(torch.float16))
            else:
                dest.view(t.dtype).copy_(t)
    return module

