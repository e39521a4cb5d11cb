/* What an int8 GEMM on AMX tiles reaches on this CPU when written by hand: the ceiling qmatmul's AMX path is
 * measured against (benchmarks/WHOLE_MODEL.md, twenty-first session). One thread; run it with nothing else busy.
 *
 *   gcc -O2 -mamx-tile -mamx-int8 benchmarks/amx_ceiling.c -o /tmp/amx_ceiling
 *   /tmp/amx_ceiling peak                          # tdpbssd back to back: the tile unit's own rate
 *   /tmp/amx_ceiling steady K NB                   # one k block's loop on resident data: A (32 x K) in L1,
 *                                                  #   B (NB x K) in L2, C tiles stored after each k block
 *   /tmp/amx_ceiling gemm M K N NB KB              # a whole GEMM: column panels of NB, 32 x 32 register blocks,
 *                                                  #   k blocks of KB (KB = K: the whole reduction in the tiles)
 *
 * A is (M/16, K/64, 16, 64) int8 and B (N/16, K/64, 16 k-quads x 16 columns x 4) int8: every tile load reads 1 KB
 * contiguously. C is int32 (M, N + 16): rows 4 KB apart would share one L1 set. Prints TOPS (2 ops a
 * multiply-add) for the best of 7 runs.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void *huge(size_t bytes, size_t skew) {
    /* 2 MB pages where the kernel gives them (no TLB misses in the way), the data `skew` bytes in: operands that
     * all start 2 MB-aligned would share cache sets tile for tile */
    size_t size = (bytes + skew + (1u << 21)) & ~(size_t)((1u << 21) - 1);
    char *p = aligned_alloc(1u << 21, size);
    madvise(p, size, MADV_HUGEPAGE);
    memset(p, 1, size);
    return p + skew;
}

static void tiles_16x64(void) {
    unsigned char cfg[64] = {0};
    cfg[0] = 1;
    for (int t = 0; t < 8; t++) {
        cfg[16 + 2 * t] = 64;
        cfg[48 + t] = 16;
    }
    _tile_loadconfig(cfg);
}

/* C[32 x 32] (+)= A[i0 .. i0+32, k0 .. k1] B[j0 .. j0+32, k0 .. k1]^T: 2 x 2 accumulator tiles */
static void block(const int8_t *A, const int8_t *B, int32_t *C, int K, int ldc, int i0, int j0, int k0, int k1) {
    int32_t *c = C + (size_t)i0 * ldc + j0;
    if (k0) {
        _tile_loadd(0, c, ldc * 4); _tile_loadd(1, c + 16, ldc * 4);
        _tile_loadd(2, c + 16 * ldc, ldc * 4); _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
    } else {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    }
    const int8_t *a0 = A + (size_t)(i0 / 16) * K * 16, *a1 = a0 + (size_t)K * 16;
    const int8_t *b0 = B + (size_t)(j0 / 16) * K * 16, *b1 = b0 + (size_t)K * 16;
    for (int k = k0; k < k1; k += 64) {
        _tile_loadd(4, a0 + k * 16, 64); _tile_loadd(5, a1 + k * 16, 64);
        _tile_loadd(6, b0 + k * 16, 64); _tile_loadd(7, b1 + k * 16, 64);
        _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, c, ldc * 4); _tile_stored(1, c + 16, ldc * 4);
    _tile_stored(2, c + 16 * ldc, ldc * 4); _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}

static double peak(void) {
    long steps = 2000000;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
    double t0 = now();
    for (long s = 0; s < steps; s++) {
        _tile_dpbssd(0, 4, 6); _tile_dpbssd(1, 4, 7); _tile_dpbssd(2, 5, 6); _tile_dpbssd(3, 5, 7);
    }
    return 2.0 * 16 * 16 * 64 * 4 * steps / (now() - t0);
}

static double steady(int K, int NB) {
    int8_t *A = huge((size_t)32 * K, 0), *B = huge((size_t)NB * K, 25 << 10);
    int32_t *C = huge((size_t)32 * (NB + 16) * 4, 50 << 10);
    long reps = 4000000000L / ((long)32 * K * NB) + 1;
    double t0 = now();
    for (long r = 0; r < reps; r++)
        for (int j = 0; j < NB; j += 32) block(A, B, C, K, NB + 16, 0, j, 0, K);
    return 2.0 * 32 * K * NB * reps / (now() - t0);
}

static double gemm(int M, int K, int N, int NB, int KB) {
    int8_t *A = huge((size_t)M * K, 0), *B = huge((size_t)N * K, 25 << 10);
    int ldc = N + 16;
    int32_t *C = huge((size_t)M * ldc * 4, 50 << 10);
    double best = 1e30;
    for (int rep = 0; rep < 7; rep++) {
        double t0 = now();
        for (int jb = 0; jb < N; jb += NB)          /* a column panel of B stays in L2 across all rows */
            for (int i = 0; i < M; i += 32)
                for (int k0 = 0; k0 < K; k0 += KB)  /* a k block of A's 32 rows stays in L1 across the panel */
                    for (int j = jb; j < jb + NB; j += 32)
                        block(A, B, C, K, ldc, i, j, k0, k0 + KB < K ? k0 + KB : K);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    return 2.0 * M * K * N / best;
}

int main(int argc, char **argv) {
    syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */);
    tiles_16x64();
    if (argc == 2 && !strcmp(argv[1], "peak")) {
        printf("peak: %.2f TOPS\n", peak() / 1e12);
    } else if (argc == 4 && !strcmp(argv[1], "steady")) {
        int K = atoi(argv[2]), NB = atoi(argv[3]);
        if (K < 64 || K % 64 || NB < 32 || NB % 32) return fprintf(stderr, "K: 64s, NB: 32s\n"), 2;
        printf("steady K=%d NB=%d: %.2f TOPS\n", K, NB, steady(K, NB) / 1e12);
    } else if (argc == 7 && !strcmp(argv[1], "gemm")) {
        int M = atoi(argv[2]), K = atoi(argv[3]), N = atoi(argv[4]), NB = atoi(argv[5]), KB = atoi(argv[6]);
        if (M < 32 || M % 32 || K < 64 || K % 64 || NB < 32 || NB % 32 || N % NB || KB < 64 || KB % 64)
            return fprintf(stderr, "M: 32s, K and KB: 64s, NB: 32s dividing N\n"), 2;
        printf("gemm M=%d K=%d N=%d NB=%d KB=%d: %.2f TOPS\n", M, K, N, NB, KB, gemm(M, K, N, NB, KB) / 1e12);
    } else {
        fprintf(stderr, "usage: %s peak | steady K NB | gemm M K N NB KB\n", argv[0]);
        return 2;
    }
    return 0;
}
