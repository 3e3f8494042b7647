/*
 * Linear layers in bfloat16 for the CPU engine: out = bf16(x) @ bf16(W), accumulated in float32.
 *
 * pack_bf16(w) -> packed
 *   w        float32 [K, N], C-contiguous: the weight, [in, out]
 *   packed   uint16 [num_tiles, K2, 2 * TILE_N], 64-byte aligned, where num_tiles = ceil(N / TILE_N) and
 *            K2 = ceil(K / 2). Row p of tile t holds, for each of the tile's TILE_N columns j, the pair
 *            (W[2p, t*TILE_N + j], W[2p+1, t*TILE_N + j]) of bf16 values: the operand layout of
 *            vdpbf16ps. Columns past N and the row past an odd K are zero.
 * linear_bf16(out, x, packed, K, N, accumulate=False, num_threads=0) -> None
 *   x        float32 [M, K], C-contiguous; rounded to bf16 (to nearest, ties to even) once per call
 *   out      float32 [M, N], C-contiguous: written (out = x @ W), or added to (out += x @ W) when
 *            accumulate is true; must not overlap x or packed
 *   num_threads  0: the team that should finish soonest (see team_size); else exactly that many
 *
 * The calling thread first converts x into bf16 pairs [M, K2] (a scratch buffer of its own). The product
 * is then split into work items, runs of whole tiles of N (x runs of rows of M when there are too few
 * tiles; e.g. N = 256 is 4 tiles), about four per thread, handed out dynamically. An item walks its
 * tiles one by one, each in K blocks of at most KC pairs (the block, <= 64 KiB, stays in L2 while it is
 * used), and under a block all of its rows, in near-equal groups of at most MR_MAX, through a
 * register-blocked microkernel of rows x TILE_N columns (MR_MAX x 4 float32 accumulators).
 *
 * Two microkernels: AVX-512 BF16 (vdpbf16ps, used when the compiler targets avx512bf16) and portable C
 * over the same layout. Both are always built; `linear_bf16_portable` runs the portable one for tests.
 * Where the compiler targets AMX-BF16 and the kernel lets this process use the tile registers
 * (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+), every row goes through AMX tiles instead, in blocks of
 * 16 (tdpbf16ps: a 16 x 16 float32 tile += 16 rows x 16 pairs . 16 pairs x 16 columns): the packed
 * layout is already AMX's B operand, a tile's K pair p being one 64-byte row per 16 columns, read with a
 * 256-byte stride. The last block of fewer than 16 rows goes through the tiles too (configured with that
 * many rows): AMX sums a row in another order than vdpbf16ps, and a row's result must not depend on its
 * batch (see below). `linear_bf16_vector` never uses AMX (for tests and
 * comparisons).
 * The hardware path treats bf16 denormals (|v| < 2^-126) as zero, as vdpbf16ps does; the portable one
 * keeps them.
 *
 * Threads: cpu_engine/linear.py sets OMP_WAIT_POLICY=PASSIVE before this module loads libgomp, as
 * cpu_engine/attention.py does for the attention kernel. Sleeping threads make every parallel region
 * start late (openmp_wake_us, measured at import: about 10 us in this VM), so small products run on
 * fewer threads, or one; GOMP_SPINCOUNT (threads spin that long before sleeping) removes the delay.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "npy_args.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define LB_HAVE_BF16 1
#else
#define LB_HAVE_BF16 0
#endif
#define AMX_ROWS 16 /* rows of x per AMX block: a tile's rows (also how the work is split under AMX) */
#if LB_HAVE_BF16 && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#define LB_HAVE_AMX 1
#else
#define LB_HAVE_AMX 0
#endif

#define TILE_N 64        /* columns of W per packed tile: four 16-lane vectors */
#define NV (TILE_N / 16) /* float32 vectors per microkernel row */
#define MR_MAX 6         /* rows per microkernel call: MR_MAX * NV = 24 accumulators of 32 registers */
#define KC 256           /* K pairs per block: a tile's block is at most KC * TILE_N * 4 = 64 KiB (L2) */
/* Multiply-adds per microsecond of one thread, for sizing the team (about 200 GFLOP/s on Zen 4, less for
 * few rows), and the cost of each extra thread beyond waking it (it also converts and splits work). */
#define MACS_PER_US 8e4
#define THREAD_COST_US 0.5
#define MAX_WAKE_US 20.0

#define ALWAYS_INLINE static inline __attribute__((always_inline))

typedef struct {
    uint32_t *a;       /* x as bf16 pairs, [M, K2]: written by the team, then read */
    const uint16_t *b; /* packed W */
    float *c;          /* out, [M, N] */
    npy_intp m, k2, n, num_tiles;
    int accumulate;
    int amx; /* every row through AMX tiles (LB_HAVE_AMX, and this process may use them) */
} lb_problem;

/* ------------------------------------------------------------------------------------------------ */
/* bf16 conversions.                                                                                */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow goes to infinity. */
static inline uint16_t bf16_round(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static inline float bf16_to_f32(uint32_t h) {
    uint32_t u = h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Row i of x into bf16 pairs: out[p] = (x[2p] low half, x[2p+1] high half), a zero past an odd K. */
static void convert_row_portable(const float *x, npy_intp k, uint32_t *out) {
    const npy_intp k2 = (k + 1) / 2;
    for (npy_intp p = 0; p < k / 2; ++p)
        out[p] = (uint32_t)bf16_round(x[2 * p]) | ((uint32_t)bf16_round(x[2 * p + 1]) << 16);
    if (k % 2) out[k2 - 1] = bf16_round(x[k - 1]);
}

#if LB_HAVE_BF16
/* vcvtne2ps2bf16: the same rounding (inputs that are denormal become zero). */
static void convert_row_bf16(const float *x, npy_intp k, uint32_t *out) {
    npy_intp i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i));
        _mm512_storeu_si512((void *)(out + i / 2), (__m512i)h);
    }
    if (i < k) {
        const npy_intp rest = k - i; /* 1..31 floats: 1..16 pairs */
        const __mmask16 lo = rest >= 16 ? 0xFFFF : (__mmask16)((1u << rest) - 1u);
        const __mmask16 hi = rest <= 16 ? 0 : (__mmask16)((1u << (rest - 16)) - 1u);
        __m512bh h =
            _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, x + i + 16), _mm512_maskz_loadu_ps(lo, x + i));
        const npy_intp pairs = (rest + 1) / 2;
        _mm512_mask_storeu_epi32(out + i / 2, (__mmask16)((1u << pairs) - 1u), (__m512i)h);
    }
}
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Microkernels: c[0:mr, 0:ncols] (=|+=) a[0:mr, 0:kc] . b[0:kc, 0:TILE_N], where a is mr rows of bf16
 * pairs lda apart, b a tile's K block (kc rows of TILE_N pairs), c rows ldc floats apart. accumulate:
 * add to c instead of overwriting it.                                                              */

typedef void (*kernel_fn)(const uint32_t *a, npy_intp lda, const uint16_t *b, npy_intp kc, float *c,
                          npy_intp ldc, int mr, int ncols, int accumulate);

static void kernel_portable(const uint32_t *a, npy_intp lda, const uint16_t *b, npy_intp kc, float *c,
                            npy_intp ldc, int mr, int ncols, int accumulate) {
    float acc[MR_MAX][TILE_N];
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < TILE_N; ++j) acc[r][j] = accumulate && j < ncols ? c[r * ldc + j] : 0.0f;
    float wlo[TILE_N], whi[TILE_N];
    for (npy_intp p = 0; p < kc; ++p) {
        const uint16_t *bp = b + p * 2 * TILE_N;
        for (int j = 0; j < TILE_N; ++j) {
            wlo[j] = bf16_to_f32(bp[2 * j]);
            whi[j] = bf16_to_f32(bp[2 * j + 1]);
        }
        for (int r = 0; r < mr; ++r) {
            const uint32_t pair = a[r * lda + p];
            const float xlo = bf16_to_f32(pair & 0xFFFFu), xhi = bf16_to_f32(pair >> 16);
#pragma omp simd
            for (int j = 0; j < TILE_N; ++j) acc[r][j] += xlo * wlo[j] + xhi * whi[j];
        }
    }
    for (int r = 0; r < mr; ++r)
        for (int j = 0; j < ncols; ++j) c[r * ldc + j] = acc[r][j];
}

#if LB_HAVE_BF16
ALWAYS_INLINE __mmask16 column_mask(int ncols, int v) {
    const int n = ncols - 16 * v;
    return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* MR rows (a compile-time constant after inlining): MR * NV accumulators live in registers. Each step
 * (a pair of K) loads NV vectors of W pairs, then per row broadcasts its x pair into NV vdpbf16ps. */
ALWAYS_INLINE void kernel_bf16_rows(const uint32_t *a, npy_intp lda, const uint16_t *b, npy_intp kc,
                                    float *c, npy_intp ldc, const int MR, int ncols, int accumulate) {
    __m512 acc[MR_MAX][NV];
    for (int r = 0; r < MR; ++r)
        for (int v = 0; v < NV; ++v)
            acc[r][v] = accumulate ? _mm512_maskz_loadu_ps(column_mask(ncols, v), c + r * ldc + 16 * v)
                                   : _mm512_setzero_ps();
    for (npy_intp p = 0; p < kc; ++p) {
        const uint16_t *bp = b + p * 2 * TILE_N;
        __m512bh w[NV];
        for (int v = 0; v < NV; ++v) w[v] = (__m512bh)_mm512_loadu_si512((const void *)(bp + 32 * v));
        for (int r = 0; r < MR; ++r) {
            const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)a[r * lda + p]);
            for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], xr, w[v]);
        }
    }
    if (ncols == TILE_N) {
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, acc[r][v]);
    } else {
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v)
                _mm512_mask_storeu_ps(c + r * ldc + 16 * v, column_mask(ncols, v), acc[r][v]);
    }
}

static void kernel_bf16(const uint32_t *a, npy_intp lda, const uint16_t *b, npy_intp kc, float *c,
                        npy_intp ldc, int mr, int ncols, int accumulate) {
    switch (mr) {
    case 6: kernel_bf16_rows(a, lda, b, kc, c, ldc, 6, ncols, accumulate); break;
    case 5: kernel_bf16_rows(a, lda, b, kc, c, ldc, 5, ncols, accumulate); break;
    case 4: kernel_bf16_rows(a, lda, b, kc, c, ldc, 4, ncols, accumulate); break;
    case 3: kernel_bf16_rows(a, lda, b, kc, c, ldc, 3, ncols, accumulate); break;
    case 2: kernel_bf16_rows(a, lda, b, kc, c, ldc, 2, ncols, accumulate); break;
    default: kernel_bf16_rows(a, lda, b, kc, c, ldc, 1, ncols, accumulate); break;
    }
}
#endif /* LB_HAVE_BF16 */

#if LB_HAVE_AMX
#define AMX_PAIRS 16 /* K pairs per tile step: 64 bytes of bf16 pairs a row */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Whether this process may use the tile registers: asked once, at import. */
static int amx_permitted;

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) amx_config;

/* tmm0-3: the rows x 64 float32 block of c; tmm4, tmm5: a and b over 16 pairs; tmm6, tmm7: a and b over
 * the last `rest` pairs of K (k2 % 16; configured as a whole tile when there are none). Each row of a
 * tile product depends on that row of a alone, so a block of fewer rows computes them the same way. */
static void amx_configure(npy_intp rest, int rows) {
    amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 6; ++t) {
        cfg.rows[t] = (uint8_t)(t == 5 ? AMX_PAIRS : rows);
        cfg.colsb[t] = 64;
    }
    cfg.rows[6] = (uint8_t)rows;
    cfg.colsb[6] = (uint16_t)(4 * (rest ? rest : AMX_PAIRS));
    cfg.rows[7] = (uint8_t)(rest ? rest : AMX_PAIRS);
    cfg.colsb[7] = 64;
    _tile_loadconfig(&cfg);
}

/* c[r0:r0+rows, tile t] (=|+=) a[r0:r0+rows] . tile t over all of K, under a configuration for `rows`;
 * `block` is 16 x TILE_N float32 scratch (the tile's last columns may lie past N, and c's rows are N
 * floats apart). */
static void amx_block(const lb_problem *pb, npy_intp t, npy_intp r0, int rows, float *block) {
    const npy_intp k2 = pb->k2, lda = k2 * 4, ldb = 2 * TILE_N * 2;
    const uint32_t *a = pb->a + r0 * k2;
    const uint16_t *b = pb->b + t * k2 * 2 * TILE_N;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    npy_intp p = 0;
    /* c's four column tiles (tmm0-3) += tile A (a, 16 or `rest` pairs) . tile B loaded with each 16
     * columns of b in turn; tile numbers are immediates, hence a macro. */
#define AMX_STEP(A, B)                                                                                     \
    do {                                                                                                   \
        const uint16_t *bp = b + p * 2 * TILE_N;                                                           \
        _tile_loadd(A, a + p, lda);                                                                        \
        _tile_loadd(B, bp, ldb);                                                                           \
        _tile_dpbf16ps(0, A, B);                                                                           \
        _tile_loadd(B, bp + 32, ldb);                                                                      \
        _tile_dpbf16ps(1, A, B);                                                                           \
        _tile_loadd(B, bp + 64, ldb);                                                                      \
        _tile_dpbf16ps(2, A, B);                                                                           \
        _tile_loadd(B, bp + 96, ldb);                                                                      \
        _tile_dpbf16ps(3, A, B);                                                                           \
    } while (0)
    for (; p + AMX_PAIRS <= k2; p += AMX_PAIRS) AMX_STEP(4, 5);
    if (p < k2) AMX_STEP(6, 7); /* the last k2 % 16 pairs */
#undef AMX_STEP
    _tile_stored(0, block, TILE_N * 4);
    _tile_stored(1, block + 16, TILE_N * 4);
    _tile_stored(2, block + 32, TILE_N * 4);
    _tile_stored(3, block + 48, TILE_N * 4);
    const npy_intp ncols = pb->n - t * TILE_N < TILE_N ? pb->n - t * TILE_N : TILE_N;
    const __mmask16 masks[NV] = {column_mask((int)ncols, 0), column_mask((int)ncols, 1),
                                 column_mask((int)ncols, 2), column_mask((int)ncols, 3)};
    for (int r = 0; r < rows; ++r) {
        float *c = pb->c + (r0 + r) * pb->n + t * TILE_N;
        for (int v = 0; v < NV; ++v) {
            __m512 sum = _mm512_load_ps(block + r * TILE_N + 16 * v);
            if (pb->accumulate) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(masks[v], c + 16 * v));
            _mm512_mask_storeu_ps(c + 16 * v, masks[v], sum);
        }
    }
}

/* Tiles [t0, t1) x rows [m0, m1): blocks of 16 rows, then the rest as one smaller block. */
static void amx_run(const lb_problem *pb, npy_intp t0, npy_intp t1, npy_intp m0, npy_intp m1) {
    const npy_intp end = m0 + (m1 - m0) / AMX_ROWS * AMX_ROWS;
    const npy_intp rest = pb->k2 % AMX_PAIRS;
    float block[AMX_ROWS * TILE_N] __attribute__((aligned(64)));
    if (end > m0) {
        amx_configure(rest, AMX_ROWS);
        for (npy_intp t = t0; t < t1; ++t)
            for (npy_intp r0 = m0; r0 < end; r0 += AMX_ROWS) amx_block(pb, t, r0, AMX_ROWS, block);
    }
    if (m1 > end) {
        amx_configure(rest, (int)(m1 - end));
        for (npy_intp t = t0; t < t1; ++t) amx_block(pb, t, end, (int)(m1 - end), block);
    }
    _tile_release();
}
#endif /* LB_HAVE_AMX */

/* ------------------------------------------------------------------------------------------------ */
/* Driver.                                                                                          */

/* Rows [m0, m1) split into near-equal blocks of at most MR_MAX: no small leftover block at the end. */
static void run_block(const lb_problem *pb, kernel_fn kernel, npy_intp t0, npy_intp t1, npy_intp m0,
                      npy_intp m1) {
#if LB_HAVE_AMX
    if (pb->amx) {
        if (m1 > m0) amx_run(pb, t0, t1, m0, m1);
        return;
    }
#endif
    const npy_intp rows = m1 - m0;
    if (rows <= 0) return;
    const npy_intp num_mblocks = (rows + MR_MAX - 1) / MR_MAX;
    const npy_intp num_kblocks = (pb->k2 + KC - 1) / KC;
    for (npy_intp t = t0; t < t1; ++t) {
        const int ncols = (int)(pb->n - t * TILE_N < TILE_N ? pb->n - t * TILE_N : TILE_N);
        const uint16_t *tile = pb->b + t * pb->k2 * 2 * TILE_N;
        for (npy_intp kb = 0; kb < num_kblocks; ++kb) {
            const npy_intp p0 = kb * pb->k2 / num_kblocks, p1 = (kb + 1) * pb->k2 / num_kblocks;
            for (npy_intp i = 0; i < num_mblocks; ++i) {
                const npy_intp r0 = m0 + i * rows / num_mblocks, r1 = m0 + (i + 1) * rows / num_mblocks;
                kernel(pb->a + r0 * pb->k2 + p0, pb->k2, tile + p0 * 2 * TILE_N, p1 - p0,
                       pb->c + r0 * pb->n + t * TILE_N, pb->n, (int)(r1 - r0), ncols,
                       pb->accumulate || kb > 0);
            }
        }
    }
}

/* Work items: the tiles in num_tile_chunks contiguous runs x the rows in num_row_chunks runs, about
 * four per thread, so that threads that start late (a sleeping thread takes 10-100 us to wake in this
 * VM) find less left to do rather than holding everyone up. Rows are split only when there are too few
 * tiles (each row run reads the tiles' weights again). */
static void plan_items(const lb_problem *pb, int num_threads, npy_intp *num_tile_chunks,
                       npy_intp *num_row_chunks) {
    const npy_intp target = num_threads > 1 ? 4 * (npy_intp)num_threads : 1;
    const npy_intp block_rows = pb->amx ? AMX_ROWS : MR_MAX;
    const npy_intp num_mblocks = (pb->m + block_rows - 1) / block_rows;
    *num_tile_chunks = pb->num_tiles < target ? pb->num_tiles : target;
    const npy_intp rows = (target + *num_tile_chunks - 1) / *num_tile_chunks;
    *num_row_chunks = rows < num_mblocks ? rows : num_mblocks;
}

/* Where row chunk `i` of `n` starts: near-equal runs, in whole blocks of AMX_ROWS under AMX (the last
 * run takes the rows past the last whole block). */
static npy_intp row_bound(const lb_problem *pb, npy_intp i, npy_intp n) {
    if (!pb->amx || i == n) return i * pb->m / n;
    return i * (pb->m / AMX_ROWS) / n * AMX_ROWS;
}

static void run_problem(const lb_problem *pb, const float *x, npy_intp k, kernel_fn kernel,
                        void (*convert_row)(const float *, npy_intp, uint32_t *), int num_threads) {
    /* NOTE: by the calling thread alone (a few us): a conversion shared by the team would need a barrier
     * before the products, where everyone would wait for the latest thread to wake. */
    for (npy_intp i = 0; i < pb->m; ++i) convert_row(x + i * k, k, pb->a + i * pb->k2);
    npy_intp num_tile_chunks, num_row_chunks;
    plan_items(pb, num_threads, &num_tile_chunks, &num_row_chunks);
    const npy_intp num_items = num_tile_chunks * num_row_chunks;
    if (num_threads > num_items) num_threads = (int)num_items;
    (void)num_threads; /* (unused without OpenMP) */
#pragma omp parallel for num_threads(num_threads) schedule(dynamic, 1)
    for (npy_intp item = 0; item < num_items; ++item) {
        const npy_intp tc = item / num_row_chunks, rc = item % num_row_chunks, nt = pb->num_tiles;
        run_block(pb, kernel, tc * nt / num_tile_chunks, (tc + 1) * nt / num_tile_chunks,
                  row_bound(pb, rc, num_row_chunks), row_bound(pb, rc + 1, num_row_chunks));
    }
}

/* ---- team size ---- */

/* What starting a parallel region costs the calling thread, in microseconds, measured once at import:
 * about 0.3 us while OpenMP's idle threads spin, but 10-40 us here (a VM) when they sleep
 * (OMP_WAIT_POLICY=PASSIVE), which is more than a whole small product takes on one thread. */
static double wake_us;

static void measure_wake(void) {
#ifdef _OPENMP
    const int n = omp_get_max_threads();
    if (n < 2) return;
    double t[9];
    volatile int sink = 0; /* (an empty region could be optimised away) */
#pragma omp parallel num_threads(n) /* starts the threads */
    sink = omp_get_thread_num();
    for (int i = 0; i < 9; ++i) {
        /* a gap, as between two layers, so that sleepy threads are asleep when the region starts */
        for (double gap = omp_get_wtime(); omp_get_wtime() - gap < 50e-6;) continue;
        const double t0 = omp_get_wtime();
#pragma omp parallel num_threads(n)
        sink = omp_get_thread_num();
        t[i] = omp_get_wtime() - t0;
    }
    (void)sink;
    for (int i = 1; i < 9; ++i) /* insertion sort */
        for (int j = i; j > 0 && t[j] < t[j - 1]; --j) {
            const double tmp = t[j];
            t[j] = t[j - 1];
            t[j - 1] = tmp;
        }
    /* NOTE: the third fastest of nine, capped: other processes' load (a descheduled thread) shows up as
     * outliers of milliseconds, and a one-off reading like that must not make every later product of
     * this process single-threaded. Sleeping threads cost 5-20 us; more than that is load. */
    wake_us = t[2] * 1e6 < MAX_WAKE_US ? t[2] * 1e6 : MAX_WAKE_US;
#endif
}

/* The team that finishes a product of `macs` multiply-adds soonest: time(T) = macs / (T * rate), plus,
 * for T > 1, the wake-up and THREAD_COST_US per thread. */
static int team_size(double macs) {
#ifdef _OPENMP
    const int max_threads = omp_get_max_threads();
    const double alone_us = macs / MACS_PER_US;
    int best = 1;
    double best_us = alone_us;
    for (int t = 2; t <= max_threads; ++t) {
        const double us = alone_us / t + wake_us + THREAD_COST_US * t;
        if (us < best_us) {
            best = t;
            best_us = us;
        }
    }
    return best;
#else
    (void)macs;
    return 1;
#endif
}

/* The scratch for x's bf16 pairs, one per calling thread (the GIL is released, so two Python threads
 * may be in the kernel at once), kept between calls: a fresh allocation of more than a few hundred KiB
 * would be mmapped and page-faulted in on every call. Freed when its thread exits. */
typedef struct {
    void *data;
    size_t num_bytes;
} lb_scratch;

static pthread_key_t scratch_key;

static void free_scratch(void *p) {
    lb_scratch *s = p;
    free(s->data);
    free(s);
}

static uint32_t *get_scratch(size_t num_bytes) {
    lb_scratch *s = pthread_getspecific(scratch_key);
    if (s == NULL) {
        if ((s = calloc(1, sizeof *s)) == NULL) return NULL;
        if (pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (num_bytes > s->num_bytes) {
        free(s->data);
        const size_t rounded = (num_bytes + 4095) / 4096 * 4096;
        s->data = aligned_alloc(64, rounded);
        s->num_bytes = s->data ? rounded : 0;
    }
    return s->data;
}

/* ---- argument checking ---- */

static PyArrayObject *as_array(PyObject *obj, const char *name, int typenum, int ndim, const char *shape) {
    PyArrayObject *arr = typed_array(obj, name, typenum, ndim, shape);
    if (arr == NULL) return NULL;
    if (!PyArray_IS_C_CONTIGUOUS(arr)) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous (use np.ascontiguousarray)", name);
        return NULL;
    }
    return arr;
}

/* ---- pack_bf16 ---- */

/* Pairs of rows of w (row 2p and 2p+1, a zero row past an odd K) into row p of every tile. */
static void pack_pair(const float *w, npy_intp k, npy_intp n, npy_intp p, uint16_t *data) {
    const npy_intp k2 = (k + 1) / 2, num_tiles = (n + TILE_N - 1) / TILE_N;
    const float *r0 = w + 2 * p * n, *r1 = 2 * p + 1 < k ? r0 + n : NULL;
    for (npy_intp t = 0; t < num_tiles; ++t) {
        uint16_t *row = data + (t * k2 + p) * 2 * TILE_N;
        const npy_intp cols = n - t * TILE_N < TILE_N ? n - t * TILE_N : TILE_N;
        for (npy_intp j = 0; j < cols; ++j) {
            row[2 * j] = bf16_round(r0[t * TILE_N + j]);
            row[2 * j + 1] = r1 ? bf16_round(r1[t * TILE_N + j]) : 0;
        }
        for (npy_intp j = cols; j < TILE_N; ++j) row[2 * j] = row[2 * j + 1] = 0;
    }
}

/* Row pairs in parallel; each reads two whole rows of w in order (a tile-major walk would read 64 floats
 * per row of a big weight and miss the TLB on every row: about 4x slower). */
static void pack_tiles(const float *w, npy_intp k, npy_intp n, uint16_t *data) {
    const npy_intp k2 = (k + 1) / 2;
#pragma omp parallel for schedule(static) if (k * n > 1 << 20)
    for (npy_intp p = 0; p < k2; ++p) pack_pair(w, k, n, p, data);
}

static void free_capsule(PyObject *capsule) { free(PyCapsule_GetPointer(capsule, NULL)); }

static PyObject *pack_bf16(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_w;
    if (!PyArg_ParseTuple(args, "O:pack_bf16", &o_w)) return NULL;
    PyArrayObject *w = as_array(o_w, "w", NPY_FLOAT32, 2, "[K, N]");
    if (w == NULL) return NULL;
    const npy_intp k = PyArray_DIM(w, 0), n = PyArray_DIM(w, 1);
    if (k < 1 || n < 1) {
        PyErr_Format(PyExc_ValueError, "w must have K >= 1 rows and N >= 1 columns, got [%zd, %zd]", k, n);
        return NULL;
    }
    const npy_intp k2 = (k + 1) / 2, num_tiles = (n + TILE_N - 1) / TILE_N;
    npy_intp dims[3] = {num_tiles, k2, 2 * TILE_N};
    const size_t bytes = (size_t)(num_tiles * k2 * 2 * TILE_N) * sizeof(uint16_t);
    /* NOTE: 64-byte aligned (numpy only promises 16), so each load of 32 pairs is one cache line. */
    uint16_t *data = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (data == NULL) return PyErr_NoMemory();
    PyObject *capsule = PyCapsule_New(data, NULL, free_capsule);
    if (capsule == NULL) {
        free(data);
        return NULL;
    }
    PyObject *packed = PyArray_SimpleNewFromData(3, dims, NPY_UINT16, data);
    if (packed == NULL || PyArray_SetBaseObject((PyArrayObject *)packed, capsule) < 0) {
        Py_XDECREF(packed);
        Py_DECREF(capsule);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pack_tiles(PyArray_DATA(w), k, n, data);
    Py_END_ALLOW_THREADS
    return packed;
}

/* ---- linear_bf16 ---- */

/* Which code a call may use: the best there is, the vector kernel without AMX, or portable C alone. */
enum lb_mode { LB_BEST, LB_VECTOR, LB_PORTABLE };

static PyObject *linear(PyObject *args, PyObject *kwargs, enum lb_mode mode) {
    static char *keywords[] = {"out", "x", "packed", "K", "N", "accumulate", "num_threads", NULL};
    PyObject *o_out, *o_x, *o_packed;
    Py_ssize_t k, n;
    int accumulate = 0, num_threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOnn|pi:linear_bf16", keywords, &o_out, &o_x, &o_packed,
                                     &k, &n, &accumulate, &num_threads))
        return NULL;
    PyArrayObject *out, *x, *packed;
    if (!(out = as_array(o_out, "out", NPY_FLOAT32, 2, "[M, N]")) ||
        !(x = as_array(o_x, "x", NPY_FLOAT32, 2, "[M, K]")) ||
        !(packed = as_array(o_packed, "packed", NPY_UINT16, 3, "[num_tiles, K2, 2 * TILE_N] (pack_bf16's)")))
        return NULL;
    if (k < 1 || n < 1) {
        PyErr_Format(PyExc_ValueError, "K and N must be >= 1, got K=%zd, N=%zd", k, n);
        return NULL;
    }
    const npy_intp m = PyArray_DIM(x, 0), k2 = (k + 1) / 2, num_tiles = (n + TILE_N - 1) / TILE_N;
    if (PyArray_DIM(packed, 0) != num_tiles || PyArray_DIM(packed, 1) != k2 ||
        PyArray_DIM(packed, 2) != 2 * TILE_N) {
        PyErr_Format(PyExc_ValueError,
                     "packed has shape [%zd, %zd, %zd], but pack_bf16 of a [%zd, %zd] weight has shape "
                     "[%zd, %zd, %d]",
                     PyArray_DIM(packed, 0), PyArray_DIM(packed, 1), PyArray_DIM(packed, 2), k, n, num_tiles,
                     k2, 2 * TILE_N);
        return NULL;
    }
    if (PyArray_DIM(x, 1) != k) {
        PyErr_Format(PyExc_ValueError, "x must have K = %zd columns, got shape [%zd, %zd]", k, m,
                     PyArray_DIM(x, 1));
        return NULL;
    }
    if (PyArray_DIM(out, 0) != m || PyArray_DIM(out, 1) != n) {
        PyErr_Format(PyExc_ValueError, "out must have shape [M, N] = [%zd, %zd], got [%zd, %zd]", m, n,
                     PyArray_DIM(out, 0), PyArray_DIM(out, 1));
        return NULL;
    }
    if (!PyArray_ISWRITEABLE(out)) {
        PyErr_SetString(PyExc_ValueError, "out must be writeable");
        return NULL;
    }
    if (overlaps(out, x) || overlaps(out, packed)) {
        PyErr_SetString(PyExc_ValueError, "out must not overlap x or packed");
        return NULL;
    }
    if (num_threads < 0) {
        PyErr_Format(PyExc_ValueError, "num_threads must be >= 0 (0: automatic), got %d", num_threads);
        return NULL;
    }
    if (m == 0) Py_RETURN_NONE;
    if (num_threads == 0) num_threads = team_size((double)m * (double)k * (double)n);
#ifndef _OPENMP
    num_threads = 1;
#endif
    uint32_t *a = get_scratch((size_t)(m * k2) * sizeof(uint32_t));
    if (a == NULL) return PyErr_NoMemory();
    lb_problem pb = {
        .a = a, .b = PyArray_DATA(packed), .c = PyArray_DATA(out), .m = m, .k2 = k2, .n = n,
        .num_tiles = num_tiles, .accumulate = accumulate, .amx = 0,
    };
    kernel_fn kernel = kernel_portable;
    void (*convert_row)(const float *, npy_intp, uint32_t *) = convert_row_portable;
#if LB_HAVE_BF16
    if (mode != LB_PORTABLE) {
        kernel = kernel_bf16;
        convert_row = convert_row_bf16;
    }
#endif
#if LB_HAVE_AMX
    pb.amx = mode == LB_BEST && amx_permitted;
#endif
    const float *xd = PyArray_DATA(x);
    Py_BEGIN_ALLOW_THREADS
    run_problem(&pb, xd, k, kernel, convert_row, num_threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *linear_bf16(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    return linear(args, kwargs, LB_BEST);
}

static PyObject *linear_bf16_vector(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    return linear(args, kwargs, LB_VECTOR);
}

static PyObject *linear_bf16_portable(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    return linear(args, kwargs, LB_PORTABLE);
}

#define SIGNATURE "(out, x, packed, K, N, accumulate=False, num_threads=0)"

static PyMethodDef methods[] = {
    {"pack_bf16", pack_bf16, METH_VARARGS,
     "pack_bf16(w, /) -> numpy.ndarray\n--\n\n"
     "A float32 [K, N] weight rounded to bf16 and laid out in tiles for linear_bf16."},
    {"linear_bf16", (PyCFunction)(void (*)(void))linear_bf16, METH_VARARGS | METH_KEYWORDS,
     "linear_bf16" SIGNATURE " -> None\n--\n\n"
     "out = bf16(x) @ W (or out += ... with accumulate), float32 accumulation, W from pack_bf16."},
    {"linear_bf16_vector", (PyCFunction)(void (*)(void))linear_bf16_vector, METH_VARARGS | METH_KEYWORDS,
     "linear_bf16_vector" SIGNATURE " -> None\n--\n\n"
     "The same, never through AMX tiles (the vector kernel); for tests and comparisons."},
    {"linear_bf16_portable", (PyCFunction)(void (*)(void))linear_bf16_portable, METH_VARARGS | METH_KEYWORDS,
     "linear_bf16_portable" SIGNATURE " -> None\n--\n\n"
     "The same, always through the portable (non-SIMD-intrinsics) code; for tests."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_linear",
    .m_doc = "bfloat16 linear layers (GEMM) for the CPU engine.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__linear(void) {
    import_array();
    if (pthread_key_create(&scratch_key, free_scratch) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "pthread_key_create failed");
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    measure_wake();
#if LB_HAVE_AMX
    amx_permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    const char *tiles = amx_permitted ? "amx_bf16" : "";
#else
    const char *tiles = "";
#endif
    if (PyModule_AddStringConstant(m, "simd", LB_HAVE_BF16 ? "avx512_bf16" : "portable") < 0 ||
        PyModule_AddStringConstant(m, "tiles", tiles) < 0 ||
        PyModule_AddIntConstant(m, "TILE_N", TILE_N) < 0 ||
        PyModule_AddObject(m, "openmp_wake_us", PyFloat_FromDouble(wake_us)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
