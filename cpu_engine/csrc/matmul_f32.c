/*
 * float32 x @ W for few rows of x: the decode steps' linear layers on CPUs without bf16 instructions.
 *
 * matmul_f32(out, x, w, transposed=False) -> None
 *   x        float32 [M, K], C-contiguous
 *   w        float32 [K, N] (or [N, K] when transposed: out = x @ w.T), C-contiguous, used as it is
 *   out      float32 [M, N], C-contiguous, written; must not overlap x or w
 *
 * Why: a BLAS sgemm packs panels of W on every call. With the dev model's lm_head (K 256, N 8,192),
 * OpenBLAS took 0.43 ms for one row (a gemv: the 8 MB weight read once), 2.3 ms for 4 rows and 4.6 ms for
 * 8 on a Zen 1 core, so a decode step of 8 sequences cost about what 8 steps of one did. Here W is read
 * once per call, in column blocks of 16 that stay in L1 while every row of x passes over them, four rows
 * at a time against two 8-float vectors (eight accumulators, independent chains): a few rows cost about
 * what one does, until the multiply-adds rather than the weight bytes bound the call. A block's rows of W
 * lie N floats apart: for a wide W (the lm_head's 32 KB) every row is a new page, the hardware prefetchers
 * stop, and the call is no faster than the BLAS's (software prefetch made it slower). So a wide weight
 * is kept transposed ([N, K], `transposed`): each output column is a dot product over a contiguous row,
 * four rows of w at a time against each row of x, and w streams from memory once.
 *
 * Vectors are GCC/Clang vector types (vec8.h), which the compiler maps to the machine's registers (AVX2,
 * AVX-512, NEON). Column blocks are shared among OpenMP threads when the product is large enough to pay for
 * waking them. Sums are in a different order from a BLAS's: results agree to float32 rounding, not bits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "npy_args.h"
#include "vec8.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define ROWS 4             /* rows of x per pass over a column block */
#define COLS 16            /* columns of W per block: two 8-float vectors */
#define PARALLEL_MACS 1000000 /* products smaller than this run on the calling thread alone */

/* out[m0..m0+R, n0..n0+COLS) for R <= ROWS rows (a compile-time constant where inlined with one). */
static inline __attribute__((always_inline)) void block(const float *x, const float *w, float *out,
                                                        npy_intp K, npy_intp N, npy_intp m0, npy_intp n0,
                                                        const int R) {
    vf8 acc[ROWS][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = (vf8){0};
    const float *xr = x + m0 * K;
    for (npy_intp k = 0; k < K; ++k) {
        const vf8 w0 = load8(w + k * N + n0), w1 = load8(w + k * N + n0 + 8);
        for (int r = 0; r < R; ++r) {
            const float xk = xr[r * K + k];
            acc[r][0] += xk * w0;
            acc[r][1] += xk * w1;
        }
    }
    for (int r = 0; r < R; ++r) {
        store8(out + (m0 + r) * N + n0, acc[r][0]);
        store8(out + (m0 + r) * N + n0 + 8, acc[r][1]);
    }
}

/* Every row of x against the column block at n0. */
static void column_block(const float *x, const float *w, float *out, npy_intp M, npy_intp K, npy_intp N,
                         npy_intp n0) {
    npy_intp m0 = 0;
    for (; m0 + ROWS <= M; m0 += ROWS) block(x, w, out, K, N, m0, n0, ROWS);
    switch (M - m0) {
    case 3: block(x, w, out, K, N, m0, n0, 3); break;
    case 2: block(x, w, out, K, N, m0, n0, 2); break;
    case 1: block(x, w, out, K, N, m0, n0, 1); break;
    default: break;
    }
}

/* The columns past the last whole block, one at a time. */
static void tail_columns(const float *x, const float *w, float *out, npy_intp M, npy_intp K, npy_intp N,
                         npy_intp n0) {
    for (npy_intp m = 0; m < M; ++m)
        for (npy_intp n = n0; n < N; ++n) {
            float sum = 0.0f;
            for (npy_intp k = 0; k < K; ++k) sum += x[m * K + k] * w[k * N + n];
            out[m * N + n] = sum;
        }
}

/* Threads for a product of M x K x N over num_blocks blocks: one below PARALLEL_MACS, else as many as
 * OpenMP allows, at most one per block. */
static int team_size(npy_intp M, npy_intp K, npy_intp N, npy_intp num_blocks) {
    int num_threads = 1;
#ifdef _OPENMP
    if ((double)M * (double)K * (double)N >= PARALLEL_MACS) num_threads = omp_get_max_threads();
#endif
    return num_threads > num_blocks ? (num_blocks > 0 ? (int)num_blocks : 1) : num_threads;
}

static void matmul(const float *x, const float *w, float *out, npy_intp M, npy_intp K, npy_intp N) {
    const npy_intp num_blocks = N / COLS;
    const int num_threads = team_size(M, K, N, num_blocks);
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (npy_intp b = 0; b < num_blocks; ++b) column_block(x, w, out, M, K, N, b * COLS);
    if (num_blocks * COLS < N) tail_columns(x, w, out, M, K, N, num_blocks * COLS);
}

/* ---- x @ wt.T, wt [N, K]: each output column a dot product over a contiguous row of wt ---- */

/* out[m, n0..n0+4) for every row m, K a multiple of 8: the four rows of wt (4 K floats, in L1 after the
 * first row of x) against one row of x at a time. */
static void nt_block(const float *x, const float *wt, float *out, npy_intp M, npy_intp K, npy_intp N,
                     npy_intp n0) {
    const float *w0 = wt + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    for (npy_intp m = 0; m < M; ++m) {
        const float *xm = x + m * K;
        vf8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (npy_intp k = 0; k < K; k += 8) {
            const vf8 xk = load8(xm + k);
            a0 += xk * load8(w0 + k);
            a1 += xk * load8(w1 + k);
            a2 += xk * load8(w2 + k);
            a3 += xk * load8(w3 + k);
        }
        const vf4 sums = sum4(a0, a1, a2, a3);
        memcpy(out + m * N + n0, &sums, sizeof sums);
    }
}

static void matmul_nt(const float *x, const float *wt, float *out, npy_intp M, npy_intp K, npy_intp N) {
    const npy_intp num_blocks = K % 8 == 0 ? N / 4 : 0;
    const int num_threads = team_size(M, K, N, num_blocks);
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (npy_intp b = 0; b < num_blocks; ++b) nt_block(x, wt, out, M, K, N, b * 4);
    for (npy_intp m = 0; m < M; ++m) /* the columns no block covered, one dot product at a time */
        for (npy_intp n = num_blocks * 4; n < N; ++n) {
            float sum = 0.0f;
            for (npy_intp k = 0; k < K; ++k) sum += x[m * K + k] * wt[n * K + k];
            out[m * N + n] = sum;
        }
}

static PyObject *matmul_f32(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *o_out, *o_x, *o_w;
    int transposed = 0;
    if (!PyArg_ParseTuple(args, "OOO|p:matmul_f32", &o_out, &o_x, &o_w, &transposed)) return NULL;
    PyArrayObject *out, *x, *w;
    if (!(out = typed_array(o_out, "out", NPY_FLOAT32, 2, "[M, N]")) ||
        !(x = typed_array(o_x, "x", NPY_FLOAT32, 2, "[M, K]")) ||
        !(w = typed_array(o_w, "w", NPY_FLOAT32, 2, transposed ? "[N, K]" : "[K, N]")))
        return NULL;
    if (!PyArray_IS_C_CONTIGUOUS(out) || !PyArray_IS_C_CONTIGUOUS(x) || !PyArray_IS_C_CONTIGUOUS(w)) {
        PyErr_SetString(PyExc_ValueError, "out, x and w must be C-contiguous");
        return NULL;
    }
    const npy_intp M = PyArray_DIM(x, 0), K = PyArray_DIM(x, 1);
    const npy_intp N = PyArray_DIM(w, transposed ? 0 : 1), w_k = PyArray_DIM(w, transposed ? 1 : 0);
    if (w_k != K || PyArray_DIM(out, 0) != M || PyArray_DIM(out, 1) != N) {
        PyErr_Format(PyExc_ValueError, "shapes do not chain: x [%zd, %zd] @ %s [%zd, %zd] -> out [%zd, %zd]", M,
                     K, transposed ? "w.T, w" : "w", PyArray_DIM(w, 0), PyArray_DIM(w, 1), PyArray_DIM(out, 0),
                     PyArray_DIM(out, 1));
        return NULL;
    }
    if (!PyArray_ISWRITEABLE(out)) {
        PyErr_SetString(PyExc_ValueError, "out must be writeable");
        return NULL;
    }
    if (overlaps(out, x) || overlaps(out, w)) {
        PyErr_SetString(PyExc_ValueError, "out must not overlap x or w");
        return NULL;
    }
    const float *xp = PyArray_DATA(x), *wp = PyArray_DATA(w);
    float *op = PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS
    if (transposed)
        matmul_nt(xp, wp, op, M, K, N);
    else
        matmul(xp, wp, op, M, K, N);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"matmul_f32", matmul_f32, METH_VARARGS,
     "matmul_f32(out, x, w, transposed=False) -> None\n--\n\n"
     "out = x @ w (w [K, N]), or x @ w.T when transposed (w [N, K]), in float32, reading w once per\n"
     "call: for few rows of x (see the module's source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_matmul_f32",
    .m_doc = "float32 matmul for few rows (the CPU engine's decode steps without bf16 instructions).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__matmul_f32(void) {
    import_array();
    return PyModule_Create(&module);
}
