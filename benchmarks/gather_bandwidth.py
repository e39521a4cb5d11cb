"""The machine's random-row gather bandwidth: the roof an embedding-bag kernel cannot beat.

Reads exactly the rows an `autotune bench` workload gathers (same table, same index stream) with the least
possible work per row: no bags, no offsets, one running sum per thread, software prefetch at several
distances. The best rate is the roof; `autotune bench`'s GB/s divided by it is the kernel's share. A
sequential read of as many bytes is printed for scale. Usage:
    python benchmarks/gather_bandwidth.py --shape rows=1000000,dim=64,batch=2048,pooling=20-80,dist=zipf:1.05
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from autotune.bench import median_seconds
from autotune.targets import resolve
from search_spaces import embedding_bag as eb


def gather_kernel(dim: int, threads: int, prefetch: int):  # -> tvm PrimFunc
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def gather(w: T.handle, ind: T.handle, out: T.handle):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        R, N = T.int64(), T.int64()
        W = T.match_buffer(w, (R, dim), "float32")
        I = T.match_buffer(ind, (N,), "int64")
        O = T.match_buffer(out, (threads, dim), "float32")
        for t in T.parallel(threads):
            acc = T.alloc_buffer((dim,), "float32", scope="local")
            for d in T.vectorized(dim):
                acc[d] = T.float32(0)
            for i in range((N + threads - 1) // threads):
                pos = T.min(t * ((N + threads - 1) // threads) + i, N - 1)
                if prefetch > 0:
                    T.evaluate(T.call_llvm_intrin("void", "llvm.prefetch.p0", T.address_of(
                        W[I[T.min(pos + prefetch, N - 1)], 0]), 0, 3, 1))
                for d in T.vectorized(dim):
                    acc[d] = acc[d] + W[I[pos], d]
            for d in T.vectorized(dim):
                O[t, d] = acc[d]

    return gather


def main() -> None:
    import tvm

    p = argparse.ArgumentParser()
    p.add_argument("--shape", required=True)
    a = p.parse_args()
    w = eb.Workload.from_shape(a.shape)
    weight, indices, *_ = eb.inputs(w, seed=0)
    idx = indices.long().contiguous()
    gathered = idx.numel() * w.dim * 4
    target = resolve("cpu").target()
    threads = torch.get_num_threads()
    best = 0.0
    for prefetch in (0, 8, 16, 32, 64):
        f = tvm.compile(tvm.IRModule({"main": gather_kernel(w.dim, threads, prefetch)}), target=target)["main"]
        out = torch.empty(threads, w.dim)
        t = median_seconds(lambda: f(weight, idx, out), 1.0)
        best = max(best, gathered / t / 1e9)
        print(f"random-row gather, prefetch {prefetch:2d} rows  {t * 1e3:8.3f} ms  {gathered / t / 1e9:7.2f} GB/s")
    t = median_seconds(lambda: weight[: idx.numel()].sum(), 1.0)
    print(f"sequential read of as many bytes   {t * 1e3:8.3f} ms  {gathered / t / 1e9:7.2f} GB/s")
    print(f"roof (best random-row gather): {best:.2f} GB/s on {threads} threads")


if __name__ == "__main__":
    main()
