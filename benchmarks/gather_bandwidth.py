"""This machine's roofline figures, as `autotune bench` measures them (autotune/roofline.py), printed in full.

The random-row gather over a (rows, dim) fp32 table at each software-prefetch distance, prefetching whole rows or
their first lines (the best of them, timed again as kernels are, is the roof of an embedding bag), a sequential
read of up to as many rows for scale, the table in 2 MB pages (as the embedding ops keep theirs: the roof) and in
4 KB ones, and the fp32 FMA and int8 peaks. Runs on TVM_NUM_THREADS threads (default: all cores), as the kernels
do. Usage:
    python -m benchmarks.gather_bandwidth --rows 1000000 --dim 64
"""

from __future__ import annotations

import argparse

from autotune import roofline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, required=True, help="table rows")
    p.add_argument("--dim", type=int, required=True, help="fp32 values per row")
    p.add_argument("--indices", type=int, default=roofline.GATHER_INDICES, help="rows gathered per pass")
    a = p.parse_args()
    if a.rows < 1 or a.dim < 1 or a.indices < 1:
        p.error("--rows, --dim and --indices must be >= 1")
    print(f"{roofline.cpu_model()}, {roofline.threads()} threads")
    for huge, pages in ((True, "2 MB pages (the roof)"), (False, "4 KB pages")):
        print(f" the table in {pages}")
        for name, gbps in roofline.gather_sweep(a.rows, a.dim, a.indices, huge_pages=huge).items():
            label = ("sequential read (table's first rows)" if name == "sequential"
                     else "the best of them, median of repeats" if name == "steady"
                     else f"random-row gather, {name}")
            print(f"  {label:<44s} {gbps:8.2f} GB/s")
    for roof in (roofline.gather_bandwidth(a.rows, a.dim), roofline.fp32_peak(), roofline.int8_peak()):
        print(f"roof as bench takes it (measured again in every bench round): "
              f"{roof.name} {roof.value:.2f} {roof.unit}")


if __name__ == "__main__":
    try:
        main()
    except roofline.RooflineUnavailable as err:
        raise SystemExit(f"gather_bandwidth: {err}") from None
