"""This machine's measured limits: the roof a kernel's GB/s, GFLOPS or GOPS is a share of.

Three microbenchmarks in one small C program, compiled with the system's compiler (`cc -O3 -march=native
-fopenmp`, once per gathered row width) and run with as many threads as TVM's pool uses (TVM_NUM_THREADS):
- random-row gather: sum uniformly random rows of a (rows, dim) fp32 table in bags of 32, nothing else per
  row, into ROW_CHAINS independent register accumulators (so no add waits on the last row's: as many misses
  in flight as the out-of-order window and the prefetches allow), with software prefetch of the whole row or
  its first lines at several distances, the table in 2 MB pages where Linux gives them (as the embedding ops
  keep theirs: a page walk per lookup of a table in 4 KB pages caps the misses in flight); the best of them,
  timed as the kernels are (the median of 100 ms repeats), is the roof of an embedding bag (whose GB/s counts
  gathered rows the same way). Given the rows a workload gathers (a file of int64 indices), it gathers those,
  in their order: a Zipf stream's hot rows stay in cache for the roof as for the kernel;
- fp32 FMA peak: independent vector FMA chains per thread, enough of them to be throughput-bound;
- int8 peak: s8 x s8 -> s32 tile products (`tdpbssd`: four 16 x 16 accumulator tiles) where the CPU has AMX and
  Linux grants the tile data, else u8 x s8 -> s32 dot products, `vpdpbusd` where the CPU has AVX512-VNNI or
  AVX-VNNI, else AVX2's `pmaddubsw` + `pmaddwd` + add (what int8 GEMMs use there); 2 ops per multiply-add, as
  qmatmul counts.
The programs are compiled once into ~/.cache/autotune/; each roof is measured once per process, in the same run
as the kernels it is compared with (seconds).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

GATHER_INDICES = 1 << 21  # rows gathered per pass: enough that a pass lasts milliseconds, cache or not


class RooflineUnavailable(RuntimeError):
    """The microbenchmark cannot be built or run here (no C compiler, no OpenMP, a non-x86 CPU ...)."""


@dataclass(frozen=True)
class Roof:
    name: str  # what was measured, e.g. "random-gather bandwidth"
    value: float  # in `unit`
    unit: str  # "GB/s", "GFLOPS" or "GOPS": the Traffic unit of the kernels it bounds
    samples: tuple[float, ...] = ()  # each measurement, where `value` is the median of several (`median_of`)

    def share(self, rate: float) -> float:
        """The fraction of this roof that `rate` (same unit) reaches."""
        return rate / self.value

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "samples": list(self.samples)}


SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

/* Each thread: NACC independent chains; returns ops per second (2 per FMA lane). */
static double fma_peak(long iters) {
    double best = 0; volatile float seed = 1e-7f; float sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        #pragma omp parallel reduction(+:sink)
        {
#if defined(__AVX512F__)
#define NACC 16
            __m512 a = _mm512_set1_ps(seed), m = _mm512_set1_ps(0.9999f), acc[NACC];
            for (int j = 0; j < NACC; j++) acc[j] = _mm512_set1_ps((float)j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < NACC; j++) acc[j] = _mm512_fmadd_ps(acc[j], m, a);
            for (int j = 0; j < NACC; j++) sink += _mm512_reduce_add_ps(acc[j]);
#define LANES 16
#else
#define NACC 12
            __m256 a = _mm256_set1_ps(seed), m = _mm256_set1_ps(0.9999f), acc[NACC];
            for (int j = 0; j < NACC; j++) acc[j] = _mm256_set1_ps((float)j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < NACC; j++) acc[j] = _mm256_fmadd_ps(acc[j], m, a);
            float lanes[8];
            for (int j = 0; j < NACC; j++) {
                _mm256_storeu_ps(lanes, acc[j]);
                for (int l = 0; l < 8; l++) sink += lanes[l];
            }
#define LANES 8
#endif
        }
        double rate = 2.0 * LANES * NACC * (double)iters * omp_get_max_threads() / (now() - t0);
        if (rate > best) best = rate;
    }
    fprintf(stderr, "sink %g\n", sink);
    return best;
}
#undef NACC
#undef LANES

#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
/* s8 x s8 -> s32 tile multiply-adds per second, times 2: four accumulator tiles, each += a 16 x 64 tile times a
   16 x 64 (k-quads x 16 columns) tile per tdpbssd (16 x 16 x 64 products); 0 where Linux refuses the tiles. */
static double amx_peak(long iters) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */)) return 0;
    double best = 0;
    static int8_t src[16 * 64];
    for (int i = 0; i < 16 * 64; i++) src[i] = (int8_t)(i % 7 - 3);
    iters /= 4;  /* a tile product does 256 times a vpdpbusd's work in about 16 cycles */
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        #pragma omp parallel
        {
            unsigned char cfg[64] = {0};
            cfg[0] = 1;
            for (int t = 0; t < 8; t++) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
            _tile_loadconfig(cfg);
            _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
            _tile_loadd(4, src, 64); _tile_loadd(5, src, 64); _tile_loadd(6, src, 64); _tile_loadd(7, src, 64);
            for (long i = 0; i < iters; i++) {
                _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
            }
            int32_t out[16 * 16];
            _tile_stored(0, out, 64);
            if (out[0] == 12345) fprintf(stderr, "sink\n");
            _tile_release();
        }
        double rate = 2.0 * 16 * 16 * 64 * 4 * (double)iters * omp_get_max_threads() / (now() - t0);
        if (rate > best) best = rate;
    }
    return best;
}
#endif

/* u8 x s8 -> s32 multiply-adds per second, times 2 (AMX's tile products where it has them: amx_peak). */
static double int8_peak(long iters, const char **how) {
    double best = 0; volatile int seed = 3; long sink = 0;
#if defined(__AMX_INT8__) && defined(__AMX_TILE__) && defined(__linux__)
    best = amx_peak(iters);
    if (best > 0) { *how = "int8 AMX (tdpbssd) peak"; return best; }
#endif
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        #pragma omp parallel reduction(+:sink)
        {
#if defined(__AVX512VNNI__)
#define NACC 16
#define MACS 64
            *how = "int8 VNNI (vpdpbusd zmm) peak";
            __m512i a = _mm512_set1_epi8((char)seed), b = _mm512_set1_epi8(5), acc[NACC];
            for (int j = 0; j < NACC; j++) acc[j] = _mm512_set1_epi32(j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < NACC; j++) acc[j] = _mm512_dpbusd_epi32(acc[j], a, b);
            for (int j = 0; j < NACC; j++) sink += _mm512_reduce_add_epi32(acc[j]);
#elif defined(__AVXVNNI__)
#define NACC 12
#define MACS 32
            *how = "int8 AVX-VNNI (vpdpbusd ymm) peak";
            __m256i a = _mm256_set1_epi8((char)seed), b = _mm256_set1_epi8(5), acc[NACC];
            for (int j = 0; j < NACC; j++) acc[j] = _mm256_set1_epi32(j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < NACC; j++) acc[j] = _mm256_dpbusd_avx_epi32(acc[j], a, b);
            int lanes[8];
            for (int j = 0; j < NACC; j++) {
                _mm256_storeu_si256((__m256i *)lanes, acc[j]);
                for (int l = 0; l < 8; l++) sink += lanes[l];
            }
#else
#define NACC 8
#define MACS 32
            *how = "int8 AVX2 (pmaddubsw+pmaddwd) peak";
            __m256i a = _mm256_set1_epi8((char)seed), b = _mm256_set1_epi8(5), one = _mm256_set1_epi16(1), acc[NACC];
            for (int j = 0; j < NACC; j++) acc[j] = _mm256_set1_epi32(j);
            for (long i = 0; i < iters; i++)
                for (int j = 0; j < NACC; j++)
                    acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one));
            int lanes[8];
            for (int j = 0; j < NACC; j++) {
                _mm256_storeu_si256((__m256i *)lanes, acc[j]);
                for (int l = 0; l < 8; l++) sink += lanes[l];
            }
#endif
        }
        double rate = 2.0 * MACS * NACC * (double)iters * omp_get_max_threads() / (now() - t0);
        if (rate > best) best = rate;
    }
    fprintf(stderr, "sink %ld\n", sink);
    return best;
}

/* Bytes of gathered rows per second at several prefetch distances and lines, the best again as the kernels are timed;
   also a sequential read. The row width is the compile-time DIM (the program is built per width), so the loop
   holds a bag's sums in registers as a generated kernel does: bags of BAG rows, row i of a bag into chain
   i % ROW_CHAINS (consecutive rows' adds are independent), each bag's sums written once. A runtime width with
   sums in memory measured half as fast. */
#ifndef DIM
#define DIM 64
#endif
/* independent chains of a bag's sums: as many as half the vector registers hold (more spill: at DIM 128 four chains
   read slower than two; benchmarks/EMBEDDING_BAG.md) */
#define ROW_CHAINS (DIM > 128 ? 1 : DIM > 64 ? 2 : 4)
#define BAG 32
#define MAX_DIST 512  /* rows: small rows are pooled fast, and need misses issued far ahead */
#define STEADY_REPEATS 5
#define STEADY_MS 100
/* Row indices: uniformly random (`path` NULL), or the int64 rows in the file `path` (a workload's own stream,
   e.g. a Zipf one whose hot rows stay in cache), n set to their count; NULL where the file cannot be read. */
static int64_t *indices(long rows, long *n, const char *path) {
    int64_t *idx;
    if (path) {
        FILE *f = fopen(path, "rb");
        if (!f || fseek(f, 0, SEEK_END) || (*n = ftell(f) / (long)sizeof(int64_t)) < 1 || fseek(f, 0, SEEK_SET)) return NULL;
        idx = malloc((*n + MAX_DIST) * sizeof(int64_t));
        if ((long)fread(idx, sizeof(int64_t), *n, f) != *n) return NULL;
        fclose(f);
        for (long i = 0; i < *n; i++) if (idx[i] < 0 || idx[i] >= rows) return NULL;
    } else {
        idx = malloc((*n + MAX_DIST) * sizeof(int64_t));
        uint64_t s = 0x9E3779B97F4A7C15ull;
        for (long i = 0; i < *n; i++) { s ^= s << 13; s ^= s >> 7; s ^= s << 17; idx[i] = (int64_t)(s % (uint64_t)rows); }
    }
    for (long i = 0; i < MAX_DIST; i++) idx[*n + i] = idx[i % *n];  /* the tail repeats the head: prefetches need no bound */
    return idx;
}

/* One thread's share of a pass: rows lo..hi of `idx` (whole bags) at prefetch distance p (0: none), prefetching the
   first `lines` cache lines of each row (all of them: the row's last byte too, as rows of 72 bytes straddle a line
   more). Inlined with `lines` a constant: a prefetch loop of unknown trip count in the row loop reads slower. */
static inline __attribute__((always_inline)) void pool_rows(const float *w, const int64_t *idx, long lo, long hi,
                                                            float *o, int p, long lines) {
    const long row_bytes = DIM * (long)sizeof(float);
    for (long b = lo; b < hi; b += BAG) {
        float acc[ROW_CHAINS][DIM];
        memset(acc, 0, sizeof acc);
        for (long i0 = b; i0 < b + BAG; i0 += ROW_CHAINS)
            for (int c = 0; c < ROW_CHAINS; c++) {  /* unrolled: chain c's sums stay in registers */
                long i = i0 + c;
                if (p) {
                    const char *r = (const char *)(w + idx[i + p] * DIM);
                    for (long l = 0; l < lines; l++) __builtin_prefetch(r + 64 * l, 0, 3);
                    if (64 * lines >= row_bytes) __builtin_prefetch(r + row_bytes - 1, 0, 3);
                }
                const float *restrict row = w + idx[i] * DIM;
                for (int k = 0; k < DIM; k++) acc[c][k] += row[k];
            }
        for (int c = 0; c < ROW_CHAINS; c++)
            for (int k = 0; k < DIM; k++) o[k] += acc[c][k];
    }
}

/* One timed pass over the n rows of `idx` (each thread its share, in whole bags; `pool_rows`): seconds. */
static double gather_pass(const float *w, const int64_t *idx, long n, float *out, int p, long lines) {
    double t0 = now();
    #pragma omp parallel
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        long lo = n * t / nt, hi = n * (t + 1) / nt;
        hi = lo + (hi - lo) / BAG * BAG;  /* whole bags: no bound inside the unrolled rows */
        float *o = out + (long)t * DIM;
        switch (lines) {  /* in the parallel region: OpenMP outlines it before inlining would see a constant */
        case 1: pool_rows(w, idx, lo, hi, o, p, 1); break;
        case 2: pool_rows(w, idx, lo, hi, o, p, 2); break;
        case 4: pool_rows(w, idx, lo, hi, o, p, 4); break;
        default: pool_rows(w, idx, lo, hi, o, p, (DIM * (long)sizeof(float) + 63) / 64);
        }
    }
    return now() - t0;
}

static int gather(long rows, long n, int huge, const char *path) {
    int64_t *idx = indices(rows, &n, path);
    if (!idx) { fprintf(stderr, "cannot read row indices in [0, %ld) from %s\n", rows, path); return 2; }
    const size_t page = 2u << 20;  /* a 2 MB page; asked for before the table is first touched */
    size_t bytes_w = ((size_t)rows * DIM * sizeof(float) + page - 1) / page * page;
    float *w = aligned_alloc(page, bytes_w);
#ifdef MADV_HUGEPAGE
    madvise(w, bytes_w, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#endif
    float *out = calloc((size_t)omp_get_max_threads() * DIM, sizeof(float));
    #pragma omp parallel for
    for (long i = 0; i < rows * DIM; i++) w[i] = (float)(i & 1023);
    const long row_bytes = DIM * (long)sizeof(float);
    long whole = 0;  /* rows gathered: each thread's share, in whole bags */
    for (int t = 0, nt = omp_get_max_threads(); t < nt; t++) whole += (n * (t + 1) / nt - n * t / nt) / BAG * BAG;
    double bytes = (double)whole * row_bytes;
    /* every distance with the whole row prefetched, and with its first 4, 2 or 1 lines: the hardware's adjacent-line
       and stream prefetchers may bring the rest for fewer of the core's fill buffers (at DIM 128, 4 of 8 lines read
       faster than 8; benchmarks/EMBEDDING_BAG.md) */
    const int dists[] = {0, 8, 16, 32, 64, 128, 256, MAX_DIST};
    const long all = (row_bytes + 63) / 64, fewer[] = {4, 2, 1};
    int best_p = 0; long best_lines = all; double best_rate = 0;
    for (int f = -1; f < 3; f++) {
        long lines = f < 0 ? all : fewer[f];
        if (f >= 0 && lines >= all) continue;
        for (int d = 0; d < (int)(sizeof dists / sizeof *dists); d++) {
            int p = dists[d];
            if (p == 0 && f >= 0) continue;  /* no prefetch: once */
            double best = 1e30, spent = 0;
            for (int rep = 0; rep < 20 && (rep < 3 || spent < 0.1); rep++) {
                double dt = gather_pass(w, idx, n, out, p, lines);
                spent += dt;
                if (dt < best) best = dt;
            }
            printf("gather %d %ld %.6f\n", p, lines, bytes / best / 1e9);
            if (bytes / best > best_rate) { best_rate = bytes / best; best_p = p; best_lines = lines; }
        }
    }
    /* The best distance timed as the kernels are (autotune.bench's Timing): the median of STEADY_REPEATS repeats,
       each of whole passes lasting at least STEADY_MS. The sweep's best-of over passes of a few milliseconds
       catches the machine's quietest moment, which a kernel's median of 100 ms repeats never reports. */
    double reps[STEADY_REPEATS];
    for (int rep = 0; rep < STEADY_REPEATS; rep++) {
        double spent = 0; long passes = 0;
        for (; spent < STEADY_MS * 1e-3 || passes < 1; passes++) spent += gather_pass(w, idx, n, out, best_p, best_lines);
        reps[rep] = spent / passes;
    }
    for (int i = 1; i < STEADY_REPEATS; i++)  /* insertion sort: five values */
        for (int j = i; j > 0 && reps[j] < reps[j - 1]; j--) {
            double t = reps[j]; reps[j] = reps[j - 1]; reps[j - 1] = t;
        }
    printf("steady %d %ld %.6f\n", best_p, best_lines, bytes / reps[STEADY_REPEATS / 2] / 1e9);
    long seq = n < rows ? n : rows;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = now();
        #pragma omp parallel
        {
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
            float *acc = out + (long)t * DIM;
            for (long i = seq * t / nt; i < seq * (t + 1) / nt; i++)
                for (long k = 0; k < DIM; k++) acc[k] += w[i * DIM + k];
        }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    printf("sequential %.6f\n", (double)seq * row_bytes / best / 1e9);
    fprintf(stderr, "sink %g\n", out[0]);
    free(w); free(idx); free(out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "fma")) { printf("fma %.6f\n", fma_peak(atol(argv[2])) / 1e9); return 0; }
    if (argc >= 2 && !strcmp(argv[1], "int8")) {
        const char *how = "";
        double r = int8_peak(atol(argv[2]), &how);
        printf("int8 %.6f %s\n", r / 1e9, how);
        return 0;
    }
    if (argc >= 6 && !strcmp(argv[1], "gather")) {
        if (atol(argv[3]) != DIM) {
            fprintf(stderr, "this program gathers rows of %d floats, not %s\n", DIM, argv[3]);
            return 2;
        }
        return gather(atol(argv[2]), atol(argv[4]), !strcmp(argv[5], "huge"), argc >= 7 ? argv[6] : NULL);
    }
    fprintf(stderr, "usage: roofline fma ITERS | int8 ITERS | gather ROWS DIM N huge|small [INDEX_FILE] (DIM: the one it "
                    "was built for; the table in 2 MB or 4 KB pages; the file's int64 rows, N ignored, else N uniform ones)\n");
    return 2;
}
"""

PEAK_ITERS = 4_000_000  # per thread and repeat: ~0.1-0.3 s at a few GHz


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autotune"


def threads() -> int:
    """The thread count kernels run with: TVM's pool size (autotune sets TVM_NUM_THREADS to the cores)."""
    return int(os.environ.get("TVM_NUM_THREADS") or os.cpu_count() or 1)


def cpu_model() -> str:
    """The CPU's marketing name (the cache key: a measurement holds for every machine of one model)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def binary(dim: int = 64) -> Path:
    """The microbenchmark, its gather built for rows of `dim` floats, compiled on first use (keyed by its
    source, the width and the compiler)."""
    cc = os.environ.get("CC", "cc")
    path = shutil.which(cc)
    if path is None:
        raise RooflineUnavailable(f"no C compiler ({cc!r} not found; install gcc or set CC) to measure the roofline")
    digest = hashlib.sha256((SOURCE + path).encode()).hexdigest()[:16]
    exe = cache_dir() / f"roofline-{digest}-dim{dim}"
    if exe.exists():
        return exe
    exe.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "roofline.c"
        src.write_text(SOURCE)
        built = Path(tmp) / "roofline"
        proc = subprocess.run([path, "-O3", "-march=native", "-fopenmp", f"-DDIM={dim}", str(src), "-o", str(built)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
            raise RooflineUnavailable(f"cannot build the roofline microbenchmark with {cc}: {last}")
        os.replace(built, exe)  # atomic: a concurrent bench sees the whole binary or none
    return exe


def _run(*args: str, dim: int = 64) -> list[list[str]]:
    """The microbenchmark's output lines, split; run on `threads()` OpenMP threads."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads()), "OMP_PROC_BIND": "false"}
    proc = subprocess.run([str(binary(dim)), *args], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        raise RooflineUnavailable(f"the roofline microbenchmark failed: {proc.stderr.strip()[-300:]}")
    return [line.split() for line in proc.stdout.splitlines() if line.strip()]


_MEASURED: dict[str, Roof] = {}


def _cached(key: str, measure: Callable[[], Roof], fresh: bool = False) -> Roof:
    """The roof under `key`, measured once per process (again if `fresh`): a roof is compared with kernels
    timed in the same run (a figure measured on a busier or quieter moment, or another machine of the model,
    would flatter or shame them), so values are never stored across runs; only the compiled program is."""
    if fresh or key not in _MEASURED:
        _MEASURED[key] = measure()
    return _MEASURED[key]


def median_of(roofs: list[Roof]) -> Roof:
    """One roof from several measurements of it (e.g. one per benchmark round, beside the kernels timed in
    that round: a shared machine's memory bandwidth moves by 2x within the hour)."""
    values = sorted(r.value for r in roofs)
    return Roof(roofs[0].name, values[len(values) // 2], roofs[0].unit, tuple(r.value for r in roofs))


def _machine() -> str:
    return f"{cpu_model()}|threads={threads()}"


def fp32_peak(fresh: bool = False) -> Roof:
    """Measured fp32 FMA throughput of this CPU on threads() threads, in GFLOPS."""
    def measure() -> Roof:
        (line,) = _run("fma", str(PEAK_ITERS))
        return Roof("fp32 FMA peak", float(line[1]), "GFLOPS")

    return _cached(f"fma|{_machine()}", measure, fresh)


def int8_peak(fresh: bool = False) -> Roof:
    """Measured int8 multiply-add throughput (AMX, else VNNI where present, else AVX2), in GOPS."""
    def measure() -> Roof:
        (line,) = _run("int8", str(PEAK_ITERS))
        return Roof(" ".join(line[2:]), float(line[1]), "GOPS")

    return _cached(f"int8|{_machine()}", measure, fresh)


def gather_sweep(rows: int, dim: int, n: int = GATHER_INDICES, huge_pages: bool = True,
                 indices: Any = None) -> dict[str, float]:
    """GB/s of the row gather per prefetch distance and lines prefetched ("prefetch N, L lines": the best of short
    passes), at the best of them timed as the kernels are ("steady": the median of 5 repeats of >= 100 ms) and
    of a sequential read, the table in 2 MB pages (as the embedding ops keep theirs: search_spaces/embedding_bag/
    pages.py) or in 4 KB ones. The rows: `n` uniformly random ones, or `indices` (an integer array of rows in
    [0, rows)) in their order."""
    with tempfile.TemporaryDirectory() as tmp:
        stream: tuple[str, ...] = ()
        if indices is not None:
            import numpy as np

            idx = np.ascontiguousarray(indices, dtype=np.int64).reshape(-1)
            if idx.size == 0 or int(idx.min()) < 0 or int(idx.max()) >= rows:
                raise ValueError(f"a gather roof's indices must be a non-empty stream of rows in [0, {rows})")
            path = Path(tmp) / "rows.i64"
            idx.tofile(path)
            stream, n = (str(path),), idx.size
        out = {}
        for line in _run("gather", str(rows), str(dim), str(n), "huge" if huge_pages else "small", *stream, dim=dim):
            out[f"prefetch {line[1]}, {line[2]} lines" if line[0] == "gather" else line[0]] = float(line[-1])
    return out


def gather_bandwidth(rows: int, dim: int, fresh: bool = False, indices: Any = None) -> Roof:
    """Measured row-gather bandwidth over a (rows, dim) fp32 table, in GB/s (the best prefetch distance and lines,
    timed as the kernels are: `gather_sweep`'s "steady"): of uniformly random rows, or of the rows `indices` names
    (a workload's own stream: the limit of exactly its traffic, hot rows staying in cache as they do for the
    kernel)."""
    if rows < 1 or dim < 1:
        raise ValueError(f"a gather table needs rows >= 1 and dim >= 1, got ({rows}, {dim})")

    def measure() -> Roof:
        sweep = gather_sweep(rows, dim, indices=indices)
        name = "random-gather bandwidth" if indices is None else "gather bandwidth of the same rows"
        return Roof(name, sweep["steady"], "GB/s")

    if indices is None:
        key = f"gather|rows={rows}|dim={dim}|{_machine()}"
    else:
        import numpy as np

        digest = hashlib.blake2b(np.ascontiguousarray(indices, dtype=np.int64).tobytes(), digest_size=8).hexdigest()
        key = f"gather|rows={rows}|dim={dim}|stream={digest}|{_machine()}"
    return _cached(key, measure, fresh)


def for_unit(unit: str, table_shape: tuple[int, ...] = (), fresh: bool = False, indices: Any = None) -> Roof:
    """The roof of kernels whose figure of merit is `unit`; GB/s kernels give the (rows, dim...) of the table
    they gather from, and may give the rows they gather (`indices`: the roof then gathers the same ones).
    `fresh`: measured now, not the figure this process measured before."""
    if unit == "GB/s":
        if len(table_shape) < 2:
            raise ValueError(f"a GB/s roof needs the gathered table's shape, got {table_shape}")
        dim = 1
        for d in table_shape[1:]:
            dim *= int(d)
        return gather_bandwidth(int(table_shape[0]), dim, fresh, indices)
    if unit == "GFLOPS":
        return fp32_peak(fresh)
    if unit == "GOPS":
        return int8_peak(fresh)
    raise ValueError(f"no roofline for unit {unit!r}")
