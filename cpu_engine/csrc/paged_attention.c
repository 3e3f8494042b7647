/*
 * Paged attention for the CPU engine: one kernel for decode and chunked prefill.
 *
 * paged_attention(out, q, k_cache, v_cache, block_tables, seq_index, positions, scale) -> None
 *   q, out            float32 [num_tokens, num_heads, head_dim], C-contiguous (out written in place;
 *                     out may be q itself)
 *   k_cache, v_cache  [num_blocks, block_size, num_kv_heads, head_dim], C-contiguous, both float32 or both
 *                     uint16 holding bfloat16 bits (widened to float32 as they are loaded: all math
 *                     is float32 either way; bf16 halves the bytes read, which is what bounds decode)
 *   block_tables      int32 [num_seqs, max_blocks_per_seq], C-contiguous
 *   seq_index         int32 [num_tokens]: the block_tables row of each token
 *   positions         int32 [num_tokens]: token t attends to positions 0..positions[t] of its sequence
 *
 * Work is split over items, run in parallel with OpenMP (as many threads as OpenMP allows, at most one
 * per item; the GIL is released). An item is a tile of up to TILE neighbouring tokens of one sequence
 * (a prefill chunk's; a decode token is a tile of one) at one kv head: it handles every query head of
 * the GQA group for each of its tokens together, walking the context in chunks of 16 positions, so a
 * chunk's K and V rows are fetched once and stay in L1 while every row of the tile uses them (on the
 * AVX-512 path, MAXR rows share each load). Softmax is
 * the online (running max) form, updated once per chunk, in float32, in base 2 (log2(e) is folded into
 * the scale).
 *
 * Two implementations of an item: AVX-512 intrinsics (used when the compiler targets AVX-512, with a
 * prefetch ring for cold caches) and portable C with GCC/Clang vector types, which the compiler maps to
 * the machine's registers (AVX2 on an x86 without AVX-512, NEON on ARM). Both are always built;
 * `paged_attention_portable` exposes the portable one so the tests keep it honest.
 *
 * write_kv_bf16(cache, x, slot_mapping) -> None
 *   cache             uint16 [num_blocks, block_size, num_kv_heads, head_dim], C-contiguous (bf16 bits)
 *   x                 float32 [num_tokens, num_kv_heads, head_dim]; each token's row contiguous, rows at
 *                     any stride (a column slice of the fused qkv output is fine)
 *   slot_mapping      int64 [num_tokens]: token i goes to flat slot slot_mapping[i] of the cache
 * Rounds x to the nearest bf16 (ties to even; NaN stays NaN) and stores it: numpy takes ~10x as long for
 * a decode step's few thousand values, mostly in per-operation overhead.
 *
 * Threads: cpu_engine/attention.py sets OMP_WAIT_POLICY=PASSIVE before this module loads libgomp, so
 * idle OpenMP threads sleep instead of spinning against the OpenBLAS matmuls between calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "npy_args.h"
#include "vec8.h"

#include <float.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
/* NOTE: BW and VL too, for the 16 x uint16 masked loads of a bf16 cache (every AVX-512 CPU but Xeon Phi). */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define PA_HAVE_AVX512 1
#else
#define PA_HAVE_AVX512 0
#endif

#define CHUNK 16 /* positions per softmax update; one AVX-512 register of scores */
#define LOG2E 1.4426950408889634f
/* NOTE: -ffast-math assumes no infinities, so "minus infinity" is the most negative finite float. */
#define NEG_BIG (-FLT_MAX)

typedef struct {
    const float *q;
    const void *k_cache; /* float32, or uint16 bf16 bits when kv_bf16 */
    const void *v_cache;
    const int32_t *block_tables;
    const int32_t *seq_index;
    const int32_t *positions;
    float *out;
    npy_intp num_heads, num_kv_heads, head_dim, block_size, max_blocks;
    float scale_log2; /* scale * log2(e): scores come out in base 2 */
    int kv_bf16;      /* the caches hold bfloat16 bits (uint16) rather than float32 */
} pa_problem;

/* Offsets of positions p0..p0+n-1 (n <= CHUNK), walking blocks without a division per position. */
static inline void chunk_offsets(const pa_problem *pb, const int32_t *table, npy_intp p0, int n,
                                 npy_intp kv_offset, npy_intp *offsets) {
    npy_intp blk = p0 / pb->block_size, in_blk = p0 % pb->block_size;
    npy_intp row = pb->num_kv_heads * pb->head_dim;
    for (int j = 0; j < n; ++j) {
        offsets[j] = ((npy_intp)table[blk] * pb->block_size + in_blk) * row + kv_offset;
        if (++in_blk == pb->block_size) {
            in_blk = 0;
            ++blk;
        }
    }
}

/* A tile's tokens t0..t0+nt-1: each one's causal limit (the last position it sees) into limit[]; returns
 * the largest, the position the tile walks to. */
static inline npy_intp tile_limits(const pa_problem *pb, npy_intp t0, npy_intp nt, npy_intp *limit) {
    npy_intp last = 0;
    for (npy_intp i = 0; i < nt; ++i) {
        limit[i] = pb->positions[t0 + i];
        if (limit[i] > last) last = limit[i];
    }
    return last;
}

/* Where row r of a tile (token t0 + r / group, head r % group of kv head kvh's group) starts in q and out. */
static inline npy_intp tile_row(const pa_problem *pb, npy_intp t0, npy_intp kvh, npy_intp group, npy_intp r) {
    return ((t0 + r / group) * pb->num_heads + kvh * group + r % group) * pb->head_dim;
}

/* ------------------------------------------------------------------------------------------------ */
/* Portable implementation: plain C that the compiler vectorises for the machine it builds on (AVX2 on
 * an x86 without AVX-512, NEON on ARM). An item is a tile of up to TILE tokens of one sequence (a
 * prefill chunk's neighbours) and one kv head: each key and value row is read once for every query
 * head of the group and every token of the tile, TILE * group rows in all. The context is walked in
 * chunks of CHUNK positions with one online-softmax update per chunk and row, the exponentials
 * computed branch-free so the loop over the chunk vectorises. A row stops at its own token's position
 * (the causal limit); the tile walks to its last token's. */

#define TILE 4 /* tokens of one sequence per item */
#define MAXR 4 /* AVX-512: rows (token x head) sharing each load of a key or value row */

/* 2^x for x <= 0, exactly 0 below -126; branch-free (selects, not jumps) and without libm, so a loop of
 * it vectorises and the module has no link dependency. */
static inline float exp2_portable(float x) {
    const float xc = x < -126.0f ? -126.0f : x;
    const float n = (float)(int32_t)(xc - 0.5f); /* xc <= 0: truncation rounds to nearest */
    const float f = (xc - n) * 0.6931471805599453f; /* 2^(xc-n) = e^f, |f| <= ln2/2 */
    const float p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 +
                    f * (1.0f / 720 + f * (1.0f / 5040)))))));
    union { float f; int32_t i; } bits;
    bits.i = ((int32_t)n + 127) << 23;
    return x < -126.0f ? 0.0f : p * bits.f;
}

/* Scratch of a portable item, in floats: per row (token x head of the group) its scaled q and
 * accumulator (d each), running max and sum, and a chunk of scores; then a chunk of key and value rows
 * widened from bf16. */
static npy_intp portable_scratch_floats(const pa_problem *pb) {
    const npy_intp rows = TILE * (pb->num_heads / pb->num_kv_heads), d = pb->head_dim;
    return rows * (2 * d + 2 + CHUNK) + 2 * CHUNK * d + 16;
}

/* Rows of a cache chunk as floats: pointers into a float32 cache, or widened into `buf` (n rows of d). */
static inline void chunk_rows(const pa_problem *pb, const void *cache, const npy_intp *offsets, int n,
                              float *buf, const float **rows) {
    const npy_intp d = pb->head_dim;
    for (int j = 0; j < n; ++j) {
        if (!pb->kv_bf16) {
            rows[j] = (const float *)cache + offsets[j];
            continue;
        }
        const uint16_t *src = (const uint16_t *)cache + offsets[j];
        uint32_t *dst = (uint32_t *)(buf + j * d);
#pragma omp simd
        for (npy_intp i = 0; i < d; ++i) dst[i] = (uint32_t)src[i] << 16; /* that float exactly */
        rows[j] = buf + j * d;
    }
}

/* exp2_portable of eight lanes at once. */
static inline vf8 exp2_v8(vf8 x) {
    const vf8 zero = {0}, floor_exp = zero - 126.0f;
    const vi8 under = x < floor_exp; /* lanes of -1 where x < -126: those come out as 0 */
    const vf8 xc = (vf8)((under & (vi8)floor_exp) | (~under & (vi8)x));
    const vi8 ni = __builtin_convertvector(xc - 0.5f, vi8); /* xc <= 0: truncation rounds to nearest */
    const vf8 f = (xc - __builtin_convertvector(ni, vf8)) * 0.6931471805599453f;
    const vf8 p = 1.0f + f * (1.0f + f * (0.5f + f * (1.0f / 6 + f * (1.0f / 24 + f * (1.0f / 120 +
                  f * (1.0f / 720 + f * (1.0f / 5040)))))));
    return (vf8)((vi8)(p * (vf8)((ni + 127) << 23)) & ~under);
}

/* Scores s[0..nv) (base 2) become 2^(s - mx) in place, s[nv..CHUNK) zero; returns their sum. */
static inline float chunk_probabilities(float *s, int nv, float mx) {
    const vi8 lane = {0, 1, 2, 3, 4, 5, 6, 7};
    float sum = 0.0f;
    for (int j = 0; j < CHUNK; j += 8) {
        const vi8 valid = lane + j < nv;
        const vf8 e = (vf8)((vi8)exp2_v8(load8(s + j) - mx) & valid);
        store8(s + j, e);
        for (int i = 0; i < 8; ++i) sum += e[i];
    }
    return sum;
}

/* s[j] = q . k_j for the chunk's first nv keys. VEC (D a multiple of 32): four keys at a time in vector
 * registers, four independent sums; otherwise loops the compiler vectorises as it can. */
static inline __attribute__((always_inline)) void chunk_scores(const float *q, const float *const *k_rows,
                                                               int nv, float *s, const npy_intp D,
                                                               const int VEC) {
    int j = 0;
    if (VEC) {
        for (; j + 4 <= nv; j += 4) {
            const float *k0 = k_rows[j], *k1 = k_rows[j + 1], *k2 = k_rows[j + 2], *k3 = k_rows[j + 3];
            vf8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (npy_intp i = 0; i < D; i += 8) {
                const vf8 qi = load8(q + i);
                a0 += qi * load8(k0 + i);
                a1 += qi * load8(k1 + i);
                a2 += qi * load8(k2 + i);
                a3 += qi * load8(k3 + i);
            }
            const vf4 sums = sum4(a0, a1, a2, a3);
            memcpy(s + j, &sums, sizeof sums);
        }
    }
    for (; j < nv; ++j) {
        const float *k = k_rows[j];
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (npy_intp i = 0; i < D; ++i) sum += q[i] * k[i];
        s[j] = sum;
    }
}

/* acc = acc * corr + sum_j w[j] * v_j over the chunk's first nv values. VEC: 32 floats of acc at a time
 * stay in registers over all nv rows; otherwise one pass over acc per row. */
static inline __attribute__((always_inline)) void chunk_values(float *acc, float corr, const float *w,
                                                               const float *const *v_rows, int nv,
                                                               const npy_intp D, const int VEC) {
    if (VEC) {
        for (npy_intp i = 0; i < D; i += 32) {
            vf8 a0 = load8(acc + i) * corr, a1 = load8(acc + i + 8) * corr;
            vf8 a2 = load8(acc + i + 16) * corr, a3 = load8(acc + i + 24) * corr;
            for (int j = 0; j < nv; ++j) {
                const float *v = v_rows[j] + i;
                const float wj = w[j];
                a0 += wj * load8(v);
                a1 += wj * load8(v + 8);
                a2 += wj * load8(v + 16);
                a3 += wj * load8(v + 24);
            }
            store8(acc + i, a0);
            store8(acc + i + 8, a1);
            store8(acc + i + 16, a2);
            store8(acc + i + 24, a3);
        }
        return;
    }
#pragma omp simd
    for (npy_intp i = 0; i < D; ++i) acc[i] *= corr;
    for (int j = 0; j < nv; ++j) {
        const float wj = w[j], *v = v_rows[j];
#pragma omp simd
        for (npy_intp i = 0; i < D; ++i) acc[i] += wj * v[i];
    }
}

/* A tile's work with head_dim D (a compile-time constant where inlined with one, so the loops over it
 * unroll; VEC when it is a multiple of 32). */
static inline __attribute__((always_inline)) void tile_portable_body(const pa_problem *pb, npy_intp t0,
                                                                     npy_intp nt, npy_intp kvh,
                                                                     float *scratch, const npy_intp D,
                                                                     const int VEC) {
    const npy_intp group = pb->num_heads / pb->num_kv_heads, rows = nt * group;
    const int32_t *table = pb->block_tables + (npy_intp)pb->seq_index[t0] * pb->max_blocks;
    float *qs = scratch, *acc = qs + rows * D, *m = acc + rows * D, *l = m + rows, *p = l + rows;
    float *k_buf = p + rows * CHUNK, *v_buf = k_buf + CHUNK * D;
    npy_intp limit[TILE];
    const npy_intp last = tile_limits(pb, t0, nt, limit);
    for (npy_intp r = 0; r < rows; ++r) { /* row r: token r / group, head r % group of the kv head's group */
        const float *qr = pb->q + tile_row(pb, t0, kvh, group, r);
        for (npy_intp i = 0; i < D; ++i) {
            qs[r * D + i] = qr[i] * pb->scale_log2;
            acc[r * D + i] = 0.0f;
        }
        m[r] = NEG_BIG;
        l[r] = 0.0f;
    }
    npy_intp offsets[CHUNK];
    const float *k_rows[CHUNK], *v_rows[CHUNK];
    for (npy_intp p0 = 0; p0 <= last; p0 += CHUNK) {
        const int n = last + 1 - p0 < CHUNK ? (int)(last + 1 - p0) : CHUNK;
        chunk_offsets(pb, table, p0, n, kvh * D, offsets);
        chunk_rows(pb, pb->k_cache, offsets, n, k_buf, k_rows);
        chunk_rows(pb, pb->v_cache, offsets, n, v_buf, v_rows);
        for (npy_intp r = 0; r < rows; ++r) {
            const npy_intp reach = limit[r / group] + 1 - p0; /* positions of this chunk the row sees */
            if (reach <= 0) continue;
            const int nv = reach < n ? (int)reach : n;
            float *pr = p + r * CHUNK;
            chunk_scores(qs + r * D, k_rows, nv, pr, D, VEC);
            float mx = m[r];
            for (int j = 0; j < nv; ++j) mx = pr[j] > mx ? pr[j] : mx;
            const float sum = chunk_probabilities(pr, nv, mx);
            const float corr = exp2_portable(m[r] - mx);
            l[r] = l[r] * corr + sum;
            m[r] = mx;
            chunk_values(acc + r * D, corr, pr, v_rows, nv, D, VEC);
        }
    }
    for (npy_intp r = 0; r < rows; ++r) {
        float *out = pb->out + tile_row(pb, t0, kvh, group, r);
        const float inv = 1.0f / l[r];
        for (npy_intp i = 0; i < D; ++i) out[i] = acc[r * D + i] * inv;
    }
}

static void tile_portable(const pa_problem *pb, npy_intp t0, npy_intp nt, npy_intp kvh, float *scratch) {
    switch (pb->head_dim) {
    case 64: tile_portable_body(pb, t0, nt, kvh, scratch, 64, 1); break;
    case 128: tile_portable_body(pb, t0, nt, kvh, scratch, 128, 1); break;
    default: tile_portable_body(pb, t0, nt, kvh, scratch, pb->head_dim, 0); break;
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* AVX-512 implementation.                                                                          */
#if PA_HAVE_AVX512

/* Scratch of an AVX-512 item, in floats: per row (token x head of the group, TILE tokens at most) its
 * scaled q and accumulator (padded to whole 16-lane vectors), running max and sum; the probabilities of
 * one chunk for MAXR rows. */
static npy_intp avx512_scratch_floats(const pa_problem *pb) {
    npy_intp rows = TILE * (pb->num_heads / pb->num_kv_heads);
    npy_intp padded = (pb->head_dim + 15) / 16 * 16;
    return 2 * rows * padded + 2 * rows + MAXR * CHUNK;
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))
#define AHEAD 4 /* chunks prefetched ahead of the one being computed */

/* 2^x for x <= 0, 16 lanes: x = n + f with |f| <= 1/2, 2^f = e^(f ln2) by its Taylor series to degree 7
 * (relative error < 1e-8 before rounding), and scalef applies 2^n (underflowing cleanly to 0). */
ALWAYS_INLINE __m512 exp2_512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-150.0f));
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_mul_ps(_mm512_sub_ps(x, n), _mm512_set1_ps(0.6931471805599453f));
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* Sums of four vectors, folded within 128-bit lanes: lane group k holds partial sums [a, b, c, d]. */
ALWAYS_INLINE __m512 fold4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd));
    __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd));
    return _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
}

/* Finish fold4 over 16 vectors: lane j of the result is the full sum of vector j. */
ALWAYS_INLINE __m512 fold16(__m512 w0, __m512 w1, __m512 w2, __m512 w3) {
    __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xDD));
    __m512 z = _mm512_add_ps(_mm512_shuffle_f32x4(w2, w3, 0x88), _mm512_shuffle_f32x4(w2, w3, 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x, z, 0x88), _mm512_shuffle_f32x4(x, z, 0xDD));
}

ALWAYS_INLINE __mmask16 chunk_mask(npy_intp c, npy_intp nvec, __mmask16 tail) {
    return c == nvec - 1 ? tail : (__mmask16)0xFFFF;
}

ALWAYS_INLINE int chunk_len(npy_intp limit, npy_intp p0) {
    return limit + 1 - p0 < CHUNK ? (int)(limit + 1 - p0) : CHUNK;
}

/* 16 (masked) elements of a cache row from element `off`, as float32. BF16 is a compile-time constant:
 * bf16 bits are zero-extended to 32 and shifted into the high half, which is that float exactly. */
ALWAYS_INLINE __m512 load_kv(const void *cache, npy_intp off, __mmask16 mask, int BF16) {
    if (BF16) {
        __m256i bits = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)cache + off);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    }
    return _mm512_maskz_loadu_ps(mask, (const float *)cache + off);
}

/* Ask for the key and value rows of a chunk (each row: head_dim elements, i.e. a few cache lines). */
ALWAYS_INLINE void prefetch_chunk(const pa_problem *pb, const npy_intp *offsets, int n, npy_intp d,
                                  int BF16) {
    const npy_intp elem = BF16 ? (npy_intp)sizeof(uint16_t) : (npy_intp)sizeof(float);
    for (int j = 0; j < n; ++j) {
        const char *k = (const char *)pb->k_cache + offsets[j] * elem;
        const char *v = (const char *)pb->v_cache + offsets[j] * elem;
        for (npy_intp byte = 0; byte < d * elem; byte += 64) {
            _mm_prefetch(k + byte, _MM_HINT_T1);
            _mm_prefetch(v + byte, _MM_HINT_T1);
        }
    }
}

/* Scores of NR heads (qs rows, nvec vectors each) against n <= 16 key rows: lane j = q . k_j. */
ALWAYS_INLINE void qk_chunk(const float *qs, npy_intp padded, int NR, const void *k_cache,
                            const npy_intp *offsets, int n, npy_intp nvec, __mmask16 tail, __m512 *s,
                            int BF16) {
    __m512 w[MAXR][4];
    for (int jq = 0; jq < 4; ++jq) {
        __m512 v[MAXR][4];
        for (int jj = 0; jj < 4; ++jj) {
            for (int r = 0; r < NR; ++r) v[r][jj] = _mm512_setzero_ps();
            int j = jq * 4 + jj;
            if (j >= n) continue;
            for (npy_intp c = 0; c < nvec; ++c) {
                __m512 kc = load_kv(k_cache, offsets[j] + 16 * c, chunk_mask(c, nvec, tail), BF16);
                for (int r = 0; r < NR; ++r)
                    v[r][jj] = _mm512_fmadd_ps(_mm512_loadu_ps(qs + r * padded + 16 * c), kc, v[r][jj]);
            }
        }
        for (int r = 0; r < NR; ++r) w[r][jq] = fold4(v[r][0], v[r][1], v[r][2], v[r][3]);
    }
    for (int r = 0; r < NR; ++r) s[r] = fold16(w[r][0], w[r][1], w[r][2], w[r][3]);
}

/* acc[r] = acc[r] * corr[r] + sum_j p[r][j] * v_j for NR heads, four vectors of head_dim at a time. */
ALWAYS_INLINE void pv_chunk(float *acc, npy_intp padded, int NR, const float *p, const float *corr,
                            const void *v_cache, const npy_intp *offsets, int n, npy_intp nvec,
                            __mmask16 tail, int BF16) {
    for (npy_intp c0 = 0; c0 < nvec; c0 += 4) {
        const int nc = nvec - c0 < 4 ? (int)(nvec - c0) : 4;
        __m512 a[MAXR][4];
        for (int r = 0; r < NR; ++r) {
            __m512 cr = _mm512_set1_ps(corr[r]);
            for (int i = 0; i < nc; ++i)
                a[r][i] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * padded + 16 * (c0 + i)), cr);
        }
        for (int j = 0; j < n; ++j) {
            const npy_intp v = offsets[j] + 16 * c0;
            __m512 pj[MAXR];
            for (int r = 0; r < NR; ++r) pj[r] = _mm512_set1_ps(p[r * CHUNK + j]);
            for (int i = 0; i < nc; ++i) {
                __m512 vc = load_kv(v_cache, v + 16 * i, chunk_mask(c0 + i, nvec, tail), BF16);
                for (int r = 0; r < NR; ++r) a[r][i] = _mm512_fmadd_ps(pj[r], vc, a[r][i]);
            }
        }
        for (int r = 0; r < NR; ++r)
            for (int i = 0; i < nc; ++i) _mm512_storeu_ps(acc + r * padded + 16 * (c0 + i), a[r][i]);
    }
}

/* One chunk for NR (1 to MAXR) rows: scores, online-softmax update, accumulation of values. Row r sees
 * the chunk's first seen[r] <= n positions (its token's causal limit); each key and value row is loaded
 * once for all NR. */
ALWAYS_INLINE void heads_chunk(const pa_problem *pb, float *qs, float *acc, float *m, float *l, float *p,
                               npy_intp padded, int NR, const npy_intp *offsets, int n, const int *seen,
                               npy_intp nvec, __mmask16 tail, int BF16) {
    __m512 s[MAXR];
    float corr[MAXR];
    qk_chunk(qs, padded, NR, pb->k_cache, offsets, n, nvec, tail, s, BF16);
    for (int r = 0; r < NR; ++r) {
        const __mmask16 valid = (__mmask16)((1u << seen[r]) - 1u);
        float m_new = _mm512_mask_reduce_max_ps(valid, s[r]);
        if (m_new < m[r]) m_new = m[r];
        corr[r] = _mm512_cvtss_f32(exp2_512(_mm512_set1_ps(m[r] - m_new)));
        __m512 pr = _mm512_maskz_mov_ps(valid, exp2_512(_mm512_sub_ps(s[r], _mm512_set1_ps(m_new))));
        l[r] = l[r] * corr[r] + _mm512_reduce_add_ps(pr);
        m[r] = m_new;
        _mm512_storeu_ps(p + r * CHUNK, pr);
    }
    pv_chunk(acc, padded, NR, p, corr, pb->v_cache, offsets, n, nvec, tail, BF16);
}

/* Tokens t0..t0+nt-1 (nt <= TILE, one sequence) at kv head kvh: rows r = token r / group, head r % group
 * of the group. Each chunk's rows are fetched once for all of them; a token's rows stop at its own
 * position (the causal limit), the tile walks to its last token's. */
ALWAYS_INLINE void tile_avx512_body(const pa_problem *pb, npy_intp t0, npy_intp nt, npy_intp kvh,
                                    float *scratch, npy_intp d, int BF16) {
    const npy_intp group = pb->num_heads / pb->num_kv_heads, rows = nt * group;
    const npy_intp nvec = (d + 15) / 16, padded = nvec * 16;
    const __mmask16 tail = (__mmask16)(d % 16 ? (1u << (d % 16)) - 1u : 0xFFFFu);
    const int32_t *table = pb->block_tables + (npy_intp)pb->seq_index[t0] * pb->max_blocks;
    float *qs = scratch, *acc = qs + rows * padded, *m = acc + rows * padded, *l = m + rows;
    float *p = l + rows;
    npy_intp offsets[AHEAD + 1][CHUNK], limit[TILE];
    const npy_intp last = tile_limits(pb, t0, nt, limit);

    const __m512 scale = _mm512_set1_ps(pb->scale_log2);
    for (npy_intp r = 0; r < rows; ++r) {
        const float *qr = pb->q + tile_row(pb, t0, kvh, group, r);
        for (npy_intp c = 0; c < nvec; ++c) {
            __m512 x = _mm512_maskz_loadu_ps(chunk_mask(c, nvec, tail), qr + 16 * c);
            _mm512_storeu_ps(qs + r * padded + 16 * c, _mm512_mul_ps(x, scale));
            _mm512_storeu_ps(acc + r * padded + 16 * c, _mm512_setzero_ps());
        }
        m[r] = NEG_BIG;
        l[r] = 0.0f;
    }
    /* NOTE: chunk i is computed while the rows of chunks i+1..i+AHEAD are on their way in from memory
     * (a ring of offsets); without this the kernel waits on DRAM whenever the cache is cold. */
    for (int a = 0; a < AHEAD && a * CHUNK <= last; ++a) {
        chunk_offsets(pb, table, a * CHUNK, chunk_len(last, a * CHUNK), kvh * d, offsets[a]);
        prefetch_chunk(pb, offsets[a], chunk_len(last, a * CHUNK), d, BF16);
    }
    for (npy_intp i = 0; i * CHUNK <= last; ++i) {
        const npy_intp ahead = (i + AHEAD) * CHUNK, p0 = i * CHUNK;
        if (ahead <= last) {
            npy_intp *o = offsets[(i + AHEAD) % (AHEAD + 1)];
            chunk_offsets(pb, table, ahead, chunk_len(last, ahead), kvh * d, o);
            prefetch_chunk(pb, o, chunk_len(last, ahead), d, BF16);
        }
        const npy_intp *o = offsets[i % (AHEAD + 1)];
        /* Rows in blocks of MAXR (a token's rows are neighbours, then the next token's); a row sees the
         * chunk up to its token's position. */
        for (npy_intp r = 0; r < rows; r += MAXR) {
            const int nr = rows - r < MAXR ? (int)(rows - r) : MAXR;
            int seen[MAXR], n = 0;
            for (int k = 0; k < nr; ++k) {
                const npy_intp lim = limit[(r + k) / group];
                seen[k] = lim < p0 ? 0 : chunk_len(lim, p0);
                n = seen[k] > n ? seen[k] : n;
            }
            if (n == 0) continue;
            float *qr = qs + r * padded, *ar = acc + r * padded, *mr = m + r, *lr = l + r;
            switch (nr) { /* NR a compile-time constant in each, so the loops over rows unroll */
            case 4: heads_chunk(pb, qr, ar, mr, lr, p, padded, 4, o, n, seen, nvec, tail, BF16); break;
            case 3: heads_chunk(pb, qr, ar, mr, lr, p, padded, 3, o, n, seen, nvec, tail, BF16); break;
            case 2: heads_chunk(pb, qr, ar, mr, lr, p, padded, 2, o, n, seen, nvec, tail, BF16); break;
            default: heads_chunk(pb, qr, ar, mr, lr, p, padded, 1, o, n, seen, nvec, tail, BF16); break;
            }
        }
    }
    for (npy_intp r = 0; r < rows; ++r) {
        const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
        float *out = pb->out + tile_row(pb, t0, kvh, group, r);
        for (npy_intp c = 0; c < nvec; ++c)
            _mm512_mask_storeu_ps(out + 16 * c, chunk_mask(c, nvec, tail),
                                  _mm512_mul_ps(_mm512_loadu_ps(acc + r * padded + 16 * c), inv));
    }
}

/* head_dim for the common sizes, and the cache dtype, as compile-time constants, so the loops over
 * head_dim unroll and the loads carry no dtype branch. */
static void tile_avx512_f32(const pa_problem *pb, npy_intp t0, npy_intp nt, npy_intp kvh, float *scratch) {
    switch (pb->head_dim) {
    case 64: tile_avx512_body(pb, t0, nt, kvh, scratch, 64, 0); break;
    case 128: tile_avx512_body(pb, t0, nt, kvh, scratch, 128, 0); break;
    default: tile_avx512_body(pb, t0, nt, kvh, scratch, pb->head_dim, 0); break;
    }
}

static void tile_avx512_bf16(const pa_problem *pb, npy_intp t0, npy_intp nt, npy_intp kvh, float *scratch) {
    switch (pb->head_dim) {
    case 64: tile_avx512_body(pb, t0, nt, kvh, scratch, 64, 1); break;
    case 128: tile_avx512_body(pb, t0, nt, kvh, scratch, 128, 1); break;
    default: tile_avx512_body(pb, t0, nt, kvh, scratch, pb->head_dim, 1); break;
    }
}
#endif /* PA_HAVE_AVX512 */

/* ------------------------------------------------------------------------------------------------ */
/* Driver.                                                                                          */

/* An item: tokens t0..t0+nt-1 (all of one sequence) at kv head kvh, with a thread's scratch. */
typedef void (*tile_fn)(const pa_problem *, npy_intp t0, npy_intp nt, npy_intp kvh, float *scratch);

/* Splits the tokens into tiles of at most max_tile neighbours of one sequence: tile w is tokens
 * starts[w]..starts[w+1]-1. Returns the number of tiles (starts has num_tokens + 1 entries). */
static npy_intp split_tiles(const pa_problem *pb, npy_intp num_tokens, npy_intp max_tile, npy_intp *starts) {
    npy_intp num_tiles = 0;
    for (npy_intp t = 0; t < num_tokens; ++t) {
        const npy_intp t0 = num_tiles ? starts[num_tiles - 1] : 0;
        if (t == 0 || t - t0 == max_tile || pb->seq_index[t] != pb->seq_index[t - 1]) starts[num_tiles++] = t;
    }
    starts[num_tiles] = num_tokens;
    return num_tiles;
}

static void run_tiles(const pa_problem *pb, const npy_intp *starts, npy_intp num_tiles, tile_fn tile,
                      float *scratch, npy_intp stride, int num_threads) {
    const npy_intp num_items = num_tiles * pb->num_kv_heads;
#pragma omp parallel num_threads(num_threads)
    {
#ifdef _OPENMP
        float *mine = scratch + (npy_intp)omp_get_thread_num() * stride;
#else
        float *mine = scratch;
#endif
        /* Items differ in cost (each token has its own context length): hand them out dynamically. */
#pragma omp for schedule(dynamic, 1)
        for (npy_intp w = 0; w < num_items; ++w) {
            const npy_intp i = w / pb->num_kv_heads;
            tile(pb, starts[i], starts[i + 1] - starts[i], w % pb->num_kv_heads, mine);
        }
    }
}

/* ---- argument checking ---- */

#define KV_DTYPES (-1) /* as_array's typenum for a KV cache: float32 or uint16 (bfloat16 bits) */

static PyArrayObject *as_array(PyObject *obj, const char *name, int typenum, int ndim, const char *shape) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *a = (PyArrayObject *)obj;
    if (typenum == KV_DTYPES) {
        if ((PyArray_TYPE(a) != NPY_FLOAT32 && PyArray_TYPE(a) != NPY_UINT16) || PyArray_ISBYTESWAPPED(a)) {
            PyErr_Format(PyExc_TypeError, "%s must have dtype float32 or uint16 (bfloat16 bits), got %S",
                         name, (PyObject *)PyArray_DESCR(a));
            return NULL;
        }
    } else if (PyArray_TYPE(a) != typenum || PyArray_ISBYTESWAPPED(a)) {
        PyArray_Descr *want = PyArray_DescrFromType(typenum);
        PyErr_Format(PyExc_TypeError, "%s must have dtype %S, got %S", name, (PyObject *)want,
                     (PyObject *)PyArray_DESCR(a));
        Py_DECREF(want);
        return NULL;
    }
    if (PyArray_NDIM(a) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must have %d dimensions %s, got %d", name, ndim, shape,
                     PyArray_NDIM(a));
        return NULL;
    }
    if (!PyArray_IS_C_CONTIGUOUS(a)) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous (use np.ascontiguousarray)", name);
        return NULL;
    }
    return a;
}

/* Every token's sequence row and position, and every block id a token will read. */
static int check_tokens(const pa_problem *pb, npy_intp num_tokens, npy_intp num_seqs, npy_intp num_blocks) {
    const npy_intp capacity = pb->max_blocks * pb->block_size;
    npy_intp *blocks_needed = PyMem_Calloc(num_seqs > 0 ? num_seqs : 1, sizeof(npy_intp));
    if (blocks_needed == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int ok = 0;
    for (npy_intp t = 0; t < num_tokens; ++t) {
        const npy_intp s = pb->seq_index[t], pos = pb->positions[t];
        if (s < 0 || s >= num_seqs) {
            PyErr_Format(PyExc_ValueError, "seq_index[%zd] = %zd is outside block_tables' %zd rows", t, s,
                         num_seqs);
            goto done;
        }
        if (pos < 0 || pos >= capacity) {
            PyErr_Format(PyExc_ValueError,
                         "positions[%zd] = %zd is outside the block table (%zd blocks of %zd positions)", t,
                         pos, pb->max_blocks, pb->block_size);
            goto done;
        }
        if (pos / pb->block_size + 1 > blocks_needed[s]) blocks_needed[s] = pos / pb->block_size + 1;
    }
    for (npy_intp s = 0; s < num_seqs; ++s) {
        const int32_t *row = pb->block_tables + s * pb->max_blocks;
        for (npy_intp b = 0; b < blocks_needed[s]; ++b) {
            if (row[b] < 0 || row[b] >= num_blocks) {
                PyErr_Format(PyExc_ValueError,
                             "block_tables[%zd, %zd] = %d is not a block id in [0, %zd), and a token reads it",
                             s, b, (int)row[b], num_blocks);
                goto done;
            }
        }
    }
    ok = 1;
done:
    PyMem_Free(blocks_needed);
    return ok ? 0 : -1;
}

/* NOTE: not isfinite(): -ffast-math lets the compiler assume every double is finite. */
static int is_finite(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    return ((bits >> 52) & 0x7FF) != 0x7FF;
}

/* Checks every argument and fills *pb; returns the number of tokens, or -1 with an exception set. */
static npy_intp parse_problem(PyObject *args, pa_problem *pb) {
    PyObject *o_out, *o_q, *o_k, *o_v, *o_bt, *o_si, *o_pos;
    double scale;
    if (!PyArg_ParseTuple(args, "OOOOOOOd:paged_attention", &o_out, &o_q, &o_k, &o_v, &o_bt, &o_si, &o_pos,
                          &scale))
        return -1;
    PyArrayObject *out, *q, *k, *v, *bt, *si, *pos;
    if (!(q = as_array(o_q, "q", NPY_FLOAT32, 3, "[num_tokens, num_heads, head_dim]")) ||
        !(k = as_array(o_k, "k_cache", KV_DTYPES, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")) ||
        !(v = as_array(o_v, "v_cache", KV_DTYPES, 4, "[num_blocks, block_size, num_kv_heads, head_dim]")) ||
        !(bt = as_array(o_bt, "block_tables", NPY_INT32, 2, "[num_seqs, max_blocks_per_seq]")) ||
        !(si = as_array(o_si, "seq_index", NPY_INT32, 1, "[num_tokens]")) ||
        !(pos = as_array(o_pos, "positions", NPY_INT32, 1, "[num_tokens]")) ||
        !(out = as_array(o_out, "out", NPY_FLOAT32, 3, "[num_tokens, num_heads, head_dim]")))
        return -1;
    const npy_intp *qs = PyArray_DIMS(q), *ks = PyArray_DIMS(k);
    const npy_intp num_tokens = qs[0];
    if (PyArray_TYPE(k) != PyArray_TYPE(v)) {
        PyErr_Format(PyExc_TypeError, "k_cache and v_cache must have the same dtype, got %S and %S",
                     (PyObject *)PyArray_DESCR(k), (PyObject *)PyArray_DESCR(v));
        return -1;
    }
    if (!PyArray_SAMESHAPE(k, v)) {
        PyErr_SetString(PyExc_ValueError, "k_cache and v_cache must have the same shape");
        return -1;
    }
    if (ks[3] != qs[2]) {
        PyErr_Format(PyExc_ValueError, "head_dim differs: q has %zd, the KV cache has %zd", qs[2], ks[3]);
        return -1;
    }
    if (qs[2] < 1 || ks[1] < 1 || ks[2] < 1 || qs[1] % ks[2] != 0) {
        PyErr_Format(PyExc_ValueError,
                     "need head_dim >= 1, block_size >= 1 and num_heads (%zd) a positive multiple of "
                     "num_kv_heads (%zd)",
                     qs[1], ks[2]);
        return -1;
    }
    if (PyArray_DIM(si, 0) != num_tokens || PyArray_DIM(pos, 0) != num_tokens) {
        PyErr_Format(PyExc_ValueError, "seq_index and positions must have num_tokens = %zd entries, got %zd, %zd",
                     num_tokens, PyArray_DIM(si, 0), PyArray_DIM(pos, 0));
        return -1;
    }
    if (!PyArray_SAMESHAPE(out, q)) {
        PyErr_SetString(PyExc_ValueError, "out must have the shape of q");
        return -1;
    }
    if (!PyArray_ISWRITEABLE(out)) {
        PyErr_SetString(PyExc_ValueError, "out must be writeable");
        return -1;
    }
    /* NOTE: out may be q itself (an item reads its q rows before writing the same rows of out). */
    if ((overlaps(out, q) && PyArray_BYTES(out) != PyArray_BYTES(q)) || overlaps(out, k) || overlaps(out, v) ||
        overlaps(out, bt) || overlaps(out, si) || overlaps(out, pos)) {
        PyErr_SetString(PyExc_ValueError, "out must not overlap the other arrays (it may be q itself)");
        return -1;
    }
    if (!is_finite(scale)) {
        PyErr_SetString(PyExc_ValueError, "scale must be finite");
        return -1;
    }
    *pb = (pa_problem){
        .q = PyArray_DATA(q), .k_cache = PyArray_DATA(k), .v_cache = PyArray_DATA(v),
        .block_tables = PyArray_DATA(bt), .seq_index = PyArray_DATA(si), .positions = PyArray_DATA(pos),
        .out = PyArray_DATA(out), .num_heads = qs[1], .num_kv_heads = ks[2], .head_dim = qs[2],
        .block_size = ks[1], .max_blocks = PyArray_DIM(bt, 1), .scale_log2 = (float)(scale * LOG2E),
        .kv_bf16 = PyArray_TYPE(k) == NPY_UINT16,
    };
    if (check_tokens(pb, num_tokens, PyArray_DIM(bt, 0), ks[0]) < 0) return -1;
    return num_tokens;
}

static PyObject *run(PyObject *args, int portable) {
    pa_problem pb;
    const npy_intp num_tokens = parse_problem(args, &pb);
    if (num_tokens < 0) return NULL;
    tile_fn tile = tile_portable;
    npy_intp max_tile = TILE, stride = portable_scratch_floats(&pb);
#if PA_HAVE_AVX512
    if (!portable) {
        tile = pb.kv_bf16 ? tile_avx512_bf16 : tile_avx512_f32;
        stride = avx512_scratch_floats(&pb);
    }
#else
    (void)portable;
#endif
    if (num_tokens == 0 || pb.num_kv_heads == 0) Py_RETURN_NONE;
    npy_intp *starts = PyMem_Malloc((size_t)(num_tokens + 1) * sizeof(npy_intp));
    if (starts == NULL) return PyErr_NoMemory();
    const npy_intp num_tiles = split_tiles(&pb, num_tokens, max_tile, starts);
    const npy_intp num_items = num_tiles * pb.num_kv_heads;
#ifdef _OPENMP
    int num_threads = omp_get_max_threads();
#else
    int num_threads = 1;
#endif
    if (num_threads > num_items) num_threads = (int)num_items;
    stride = (stride + 15) / 16 * 16; /* each thread's scratch on its own cache lines */
    float *scratch = aligned_alloc(64, (size_t)(stride * num_threads) * sizeof(float));
    if (scratch == NULL) {
        PyMem_Free(starts);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    run_tiles(&pb, starts, num_tiles, tile, scratch, stride, num_threads);
    Py_END_ALLOW_THREADS
    PyMem_Free(starts);
    free(scratch);
    Py_RETURN_NONE;
}

/* ---- bf16 KV write ---- */

static inline uint16_t bf16_bits(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    /* NOTE: a NaN's rounding carry could reach the exponent and make it an infinity: keep a quiet bit. */
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((b >> 16) | 0x0040u);
    return (uint16_t)((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

static PyObject *write_kv_bf16(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_cache, *o_x, *o_slots;
    if (!PyArg_ParseTuple(args, "OOO:write_kv_bf16", &o_cache, &o_x, &o_slots)) return NULL;
    PyArrayObject *cache, *x, *slots;
    if (!(cache = as_array(o_cache, "cache", NPY_UINT16, 4,
                           "[num_blocks, block_size, num_kv_heads, head_dim]")) ||
        !(slots = as_array(o_slots, "slot_mapping", NPY_INT64, 1, "[num_tokens]")))
        return NULL;
    if (!PyArray_Check(o_x) || PyArray_TYPE((PyArrayObject *)o_x) != NPY_FLOAT32 ||
        PyArray_ISBYTESWAPPED((PyArrayObject *)o_x) || PyArray_NDIM((PyArrayObject *)o_x) != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "x must be a float32 numpy.ndarray [num_tokens, num_kv_heads, head_dim]");
        return NULL;
    }
    x = (PyArrayObject *)o_x;
    const npy_intp *cs = PyArray_DIMS(cache), *xs = PyArray_DIMS(x);
    const npy_intp n = xs[0], row = cs[2] * cs[3], num_slots = cs[0] * cs[1];
    if (xs[1] != cs[2] || xs[2] != cs[3] || PyArray_DIM(slots, 0) != n) {
        PyErr_Format(PyExc_ValueError,
                     "want x of shape [%zd, %zd, %zd] (slot_mapping's length and the cache's heads and "
                     "head_dim), got [%zd, %zd, %zd]",
                     PyArray_DIM(slots, 0), cs[2], cs[3], xs[0], xs[1], xs[2]);
        return NULL;
    }
    /* NOTE: numpy gives dimensions of length 1 any stride, so only longer ones are checked. */
    if ((xs[2] > 1 && PyArray_STRIDE(x, 2) != (npy_intp)sizeof(float)) ||
        (xs[1] > 1 && PyArray_STRIDE(x, 1) != cs[3] * (npy_intp)sizeof(float))) {
        PyErr_SetString(PyExc_ValueError, "each token's row of x must be contiguous");
        return NULL;
    }
    if (!PyArray_ISWRITEABLE(cache)) {
        PyErr_SetString(PyExc_ValueError, "cache must be writeable");
        return NULL;
    }
    if (n > 0 && row > 0) {
        /* The bytes x spans, whatever the sign of its token stride. */
        const char *first = PyArray_BYTES(x), *last = first + (n - 1) * PyArray_STRIDE(x, 0);
        const char *lo = first < last ? first : last;
        const char *hi = (first < last ? last : first) + row * sizeof(float);
        const char *c0 = PyArray_BYTES(cache), *c1 = c0 + PyArray_NBYTES(cache);
        if (overlaps(cache, slots) || (lo < c1 && c0 < hi)) {
            PyErr_SetString(PyExc_ValueError, "cache must not overlap x or slot_mapping");
            return NULL;
        }
    }
    const int64_t *slot = PyArray_DATA(slots);
    for (npy_intp i = 0; i < n; ++i) {
        if (slot[i] < 0 || slot[i] >= num_slots) {
            PyErr_Format(PyExc_ValueError, "slot_mapping[%zd] = %lld is outside the cache's %zd slots", i,
                         (long long)slot[i], num_slots);
            return NULL;
        }
    }
    uint16_t *dst = PyArray_DATA(cache);
    const char *src = PyArray_BYTES(x);
    const npy_intp x_stride = PyArray_STRIDE(x, 0);
    for (npy_intp i = 0; i < n; ++i) {
        const float *in = (const float *)(src + i * x_stride);
        uint16_t *out = dst + slot[i] * row;
        for (npy_intp j = 0; j < row; ++j) out[j] = bf16_bits(in[j]);
    }
    Py_RETURN_NONE;
}

static PyObject *paged_attention(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 0);
}

static PyObject *paged_attention_portable(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, 1);
}

#define SIGNATURE "(out, q, k_cache, v_cache, block_tables, seq_index, positions, scale)"

static PyMethodDef methods[] = {
    {"paged_attention", paged_attention, METH_VARARGS,
     "paged_attention" SIGNATURE " -> None\n--\n\n"
     "Causal attention of each token over its sequence's paged KV cache, written into out."},
    {"paged_attention_portable", paged_attention_portable, METH_VARARGS,
     "paged_attention_portable" SIGNATURE " -> None\n--\n\n"
     "The same, always through the portable (non-SIMD-intrinsics) code; for tests."},
    {"write_kv_bf16", write_kv_bf16, METH_VARARGS,
     "write_kv_bf16(cache, x, slot_mapping) -> None\n--\n\n"
     "Round x to bf16 (ties to even) and store token i's row at flat slot slot_mapping[i] of cache."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_paged_attention",
    .m_doc = "Paged attention kernel for the CPU engine.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__paged_attention(void) {
    import_array();
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "simd", PA_HAVE_AVX512 ? "avx512" : "portable") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
