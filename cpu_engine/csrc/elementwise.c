/*
 * The model's per-layer elementwise work for the CPU engine: RMSNorm, SiLU-and-multiply and rotary
 * embeddings. Per call these are a few thousand floats (a decode step's rows), where numpy spends more
 * time in per-operation overhead (temporaries, dispatch) than in arithmetic: a step ran ~20 such calls,
 * each a handful of numpy operations. Plain C loops, vectorised by the compiler; single-threaded (a
 * parallel region would cost more than the work); the GIL is released around the loops.
 *
 * rms_norm(x, weight, eps, residual=None, out=None) -> out
 *   x         float32 [n, d], C-contiguous
 *   weight    float32 [d], C-contiguous
 *   residual  float32 [n, d], C-contiguous, or None: when given, x += residual first (in place, so x
 *             must be writeable): the residual stream's add fused with the norm that reads it
 *   out       float32 [n, d], C-contiguous, or None (a new array); may be x itself
 *   out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight, mean in float32, the scale in double
 *
 * silu_mul(gate_up, out=None) -> out
 *   gate_up   float32 [n, 2 * i], C-contiguous: gate in columns [0, i), up in [i, 2i)
 *   out       float32 [n, i], C-contiguous, or None (a new array); must not overlap gate_up
 *   out = gate / (1 + exp(-gate)) * up
 *
 * rope(x, positions, cos, sin, out=None) -> out
 *   x         float32 [num_tokens, num_heads, head_dim]; each token's row contiguous, rows at any stride
 *             (a column slice of the fused qkv output is fine)
 *   positions int32 [num_tokens], each in [0, max_positions)
 *   cos, sin  float32 [max_positions, head_dim / 2], C-contiguous (cpu_engine.rope.RotaryTable's)
 *   out       like x (same shape, rows contiguous), or None (a new C-contiguous array); may be x itself
 *   The Hugging Face "rotate half" layout: with c, s the row of positions[t] and h = head_dim / 2,
 *   out[..., :h] = x1 * c - x2 * s and out[..., h:] = x2 * c + x1 * s for x1 = x[..., :h], x2 = x[..., h:].
 *
 * set_num_threads(n) -> None / get_max_threads() -> int
 *   The OpenMP team the calling thread's next parallel regions may use (omp_set_num_threads,
 *   omp_get_max_threads): every kernel shares this module's libgomp (cpu_engine.native), and the setting
 *   is the calling thread's own, so the thread that steps the engine sizes its kernels' teams per step.
 *
 * NOTE: built with -ffast-math like the other kernels (the compiler may reorder the sums); the FP
 * environment (flush-to-zero) is not touched. expf is vectorised through glibc's libmvec.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include "npy_args.h"

#include <math.h>
#include <stdint.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------------------------------------ */
/* Loops.                                                                                           */

static void rms_norm_rows(float *x, const float *residual, const float *weight, float *out, npy_intp n,
                          npy_intp d, double eps) {
    for (npy_intp r = 0; r < n; ++r) {
        float *xr = x + r * d;
        float *o = out + r * d;
        if (residual != NULL) {
            const float *res = residual + r * d;
#pragma omp simd
            for (npy_intp j = 0; j < d; ++j) xr[j] += res[j];
        }
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (npy_intp j = 0; j < d; ++j) sum += xr[j] * xr[j];
        /* NOTE: the mean and eps in float32 as the reference (and transformers) do; the square root and
         * reciprocal in double, so -ffast-math's approximate rsqrt does not apply. */
        const float variance = sum / (float)d + (float)eps;
        const float scale = (float)(1.0 / sqrt((double)variance));
#pragma omp simd
        for (npy_intp j = 0; j < d; ++j) o[j] = xr[j] * scale * weight[j];
    }
}

static void silu_mul_rows(const float *gate_up, float *out, npy_intp n, npy_intp inter) {
    for (npy_intp r = 0; r < n; ++r) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
#pragma omp simd
        for (npy_intp j = 0; j < inter; ++j) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

static void rope_rows(const float *x, npy_intp x_stride, float *out, npy_intp out_stride,
                      const int32_t *positions, const float *cos_table, const float *sin_table,
                      npy_intp num_tokens, npy_intp num_heads, npy_intp half) {
    for (npy_intp t = 0; t < num_tokens; ++t) {
        const float *c = cos_table + (npy_intp)positions[t] * half;
        const float *s = sin_table + (npy_intp)positions[t] * half;
        for (npy_intp h = 0; h < num_heads; ++h) {
            const float *x1 = x + t * x_stride + h * 2 * half, *x2 = x1 + half;
            float *o1 = out + t * out_stride + h * 2 * half, *o2 = o1 + half;
            /* NOTE: o may be x (in place): each j reads x1[j] and x2[j] before writing either. */
#pragma omp simd
            for (npy_intp j = 0; j < half; ++j) {
                const float a = x1[j], b = x2[j];
                o1[j] = a * c[j] - b * s[j];
                o2[j] = b * c[j] + a * s[j];
            }
        }
    }
}

/* ------------------------------------------------------------------------------------------------ */
/* Argument checking.                                                                               */

/* A float32 / int32 array of ndim dimensions; C-contiguous unless rows_only (then only the last
 * ndim - 1 dimensions must be contiguous: each row, rows at any positive stride). */
static PyArrayObject *as_array(PyObject *obj, const char *name, int typenum, int ndim, const char *shape,
                               int rows_only) {
    PyArrayObject *arr = typed_array(obj, name, typenum, ndim, shape);
    if (arr == NULL) return NULL;
    if (rows_only) {
        const npy_intp *dims = PyArray_DIMS(arr), *strides = PyArray_STRIDES(arr);
        npy_intp expected = PyArray_ITEMSIZE(arr);
        int ok = PyArray_ISALIGNED(arr);
        for (int i = ndim - 1; i >= 1 && ok; --i) {
            ok = dims[i] == 1 || strides[i] == expected;
            expected *= dims[i];
        }
        ok = ok && (dims[0] <= 1 || strides[0] >= expected);
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "%s must have each row %s contiguous (rows at a positive stride)",
                         name, shape);
            return NULL;
        }
    } else if (!PyArray_IS_C_CONTIGUOUS(arr) || !PyArray_ISALIGNED(arr)) {
        PyErr_Format(PyExc_ValueError, "%s must be C-contiguous (use np.ascontiguousarray)", name);
        return NULL;
    }
    return arr;
}

static int same_shape(PyArrayObject *a, PyArrayObject *b) {
    return PyArray_NDIM(a) == PyArray_NDIM(b) &&
           PyArray_CompareLists(PyArray_DIMS(a), PyArray_DIMS(b), PyArray_NDIM(a));
}

/* Whether two arrays of one shape are the same elements (out given as x itself, or as another view of it). */
static int same_elements(PyArrayObject *a, PyArrayObject *b) {
    return PyArray_BYTES(a) == PyArray_BYTES(b) &&
           PyArray_CompareLists(PyArray_STRIDES(a), PyArray_STRIDES(b), PyArray_NDIM(a));
}

static int check_writeable(PyArrayObject *arr, const char *name) {
    if (!PyArray_ISWRITEABLE(arr)) {
        PyErr_Format(PyExc_ValueError, "%s must be writeable", name);
        return -1;
    }
    return 0;
}

/* out, checked to have the shape of like (a new C-contiguous array when o_out is None): a new
 * reference, or NULL with an exception set. */
static PyArrayObject *output(PyObject *o_out, int ndim, npy_intp *dims, const char *shape, int rows_only) {
    if (o_out == NULL || o_out == Py_None) return (PyArrayObject *)PyArray_SimpleNew(ndim, dims, NPY_FLOAT32);
    PyArrayObject *out = as_array(o_out, "out", NPY_FLOAT32, ndim, shape, rows_only);
    if (out == NULL || check_writeable(out, "out") < 0) return NULL;
    if (!PyArray_CompareLists(PyArray_DIMS(out), dims, ndim)) {
        PyObject *want = PyArray_IntTupleFromIntp(ndim, dims);
        PyObject *got = PyArray_IntTupleFromIntp(ndim, PyArray_DIMS(out));
        if (want && got) PyErr_Format(PyExc_ValueError, "out must have shape %S, got %S", want, got);
        Py_XDECREF(want);
        Py_XDECREF(got);
        return NULL;
    }
    Py_INCREF(out);
    return out;
}

/* ------------------------------------------------------------------------------------------------ */
/* Entry points.                                                                                    */

static PyObject *rms_norm(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *keywords[] = {"x", "weight", "eps", "residual", "out", NULL};
    PyObject *o_x, *o_weight, *o_residual = Py_None, *o_out = Py_None;
    double eps;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOd|OO:rms_norm", keywords, &o_x, &o_weight, &eps,
                                     &o_residual, &o_out))
        return NULL;
    PyArrayObject *x, *weight, *residual = NULL;
    if (!(x = as_array(o_x, "x", NPY_FLOAT32, 2, "[n, d]", 0)) ||
        !(weight = as_array(o_weight, "weight", NPY_FLOAT32, 1, "[d]", 0)))
        return NULL;
    const npy_intp n = PyArray_DIM(x, 0), d = PyArray_DIM(x, 1);
    if (PyArray_DIM(weight, 0) != d || d < 1) {
        PyErr_Format(PyExc_ValueError, "weight must have shape [d] = [%zd] (d >= 1), got [%zd]", d,
                     PyArray_DIM(weight, 0));
        return NULL;
    }
    if (!(eps >= 0.0)) {
        PyErr_SetString(PyExc_ValueError, "eps must be a number >= 0");
        return NULL;
    }
    if (o_residual != Py_None) {
        if (!(residual = as_array(o_residual, "residual", NPY_FLOAT32, 2, "[n, d]", 0))) return NULL;
        if (!same_shape(residual, x)) {
            PyErr_Format(PyExc_ValueError, "residual must have the shape of x, [%zd, %zd], got [%zd, %zd]", n,
                         d, PyArray_DIM(residual, 0), PyArray_DIM(residual, 1));
            return NULL;
        }
        if (check_writeable(x, "x (residual is added to it in place)") < 0) return NULL;
        if (overlaps(residual, x)) {
            PyErr_SetString(PyExc_ValueError, "residual must not overlap x");
            return NULL;
        }
    }
    PyArrayObject *out = output(o_out, 2, PyArray_DIMS(x), "[n, d]", 0);
    if (out == NULL) return NULL;
    if ((!same_elements(out, x) && overlaps(out, x)) || overlaps(out, weight) || (residual && overlaps(out, residual))) {
        PyErr_SetString(PyExc_ValueError, "out must be x itself or not overlap x, weight or residual");
        Py_DECREF(out);
        return NULL;
    }
    float *xd = PyArray_DATA(x), *od = PyArray_DATA(out);
    const float *wd = PyArray_DATA(weight), *rd = residual ? PyArray_DATA(residual) : NULL;
    Py_BEGIN_ALLOW_THREADS
    rms_norm_rows(xd, rd, wd, od, n, d, eps);
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *silu_mul(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *keywords[] = {"gate_up", "out", NULL};
    PyObject *o_gate_up, *o_out = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O:silu_mul", keywords, &o_gate_up, &o_out)) return NULL;
    PyArrayObject *gate_up = as_array(o_gate_up, "gate_up", NPY_FLOAT32, 2, "[n, 2 * i]", 0);
    if (gate_up == NULL) return NULL;
    const npy_intp n = PyArray_DIM(gate_up, 0), width = PyArray_DIM(gate_up, 1);
    if (width < 2 || width % 2) {
        PyErr_Format(PyExc_ValueError, "gate_up must have an even number (>= 2) of columns [gate | up], got %zd",
                     width);
        return NULL;
    }
    npy_intp dims[2] = {n, width / 2};
    PyArrayObject *out = output(o_out, 2, dims, "[n, i]", 0);
    if (out == NULL) return NULL;
    if (overlaps(out, gate_up)) {
        PyErr_SetString(PyExc_ValueError, "out must not overlap gate_up");
        Py_DECREF(out);
        return NULL;
    }
    const float *gd = PyArray_DATA(gate_up);
    float *od = PyArray_DATA(out);
    Py_BEGIN_ALLOW_THREADS
    silu_mul_rows(gd, od, n, width / 2);
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *rope(PyObject *self, PyObject *args, PyObject *kwargs) {
    (void)self;
    static char *keywords[] = {"x", "positions", "cos", "sin", "out", NULL};
    PyObject *o_x, *o_positions, *o_cos, *o_sin, *o_out = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|O:rope", keywords, &o_x, &o_positions, &o_cos, &o_sin,
                                     &o_out))
        return NULL;
    PyArrayObject *x, *positions, *cos_t, *sin_t;
    if (!(x = as_array(o_x, "x", NPY_FLOAT32, 3, "[num_tokens, num_heads, head_dim]", 1)) ||
        !(positions = as_array(o_positions, "positions", NPY_INT32, 1, "[num_tokens]", 0)) ||
        !(cos_t = as_array(o_cos, "cos", NPY_FLOAT32, 2, "[max_positions, head_dim / 2]", 0)) ||
        !(sin_t = as_array(o_sin, "sin", NPY_FLOAT32, 2, "[max_positions, head_dim / 2]", 0)))
        return NULL;
    const npy_intp num_tokens = PyArray_DIM(x, 0), num_heads = PyArray_DIM(x, 1), head_dim = PyArray_DIM(x, 2);
    const npy_intp max_positions = PyArray_DIM(cos_t, 0), half = PyArray_DIM(cos_t, 1);
    if (!same_shape(cos_t, sin_t)) {
        PyErr_Format(PyExc_ValueError, "cos and sin must have the same shape, got [%zd, %zd] and [%zd, %zd]",
                     max_positions, half, PyArray_DIM(sin_t, 0), PyArray_DIM(sin_t, 1));
        return NULL;
    }
    if (head_dim != 2 * half || half < 1) {
        PyErr_Format(PyExc_ValueError, "x's head_dim (%zd) must be twice the tables' columns (%zd), and >= 2",
                     head_dim, half);
        return NULL;
    }
    if (PyArray_DIM(positions, 0) != num_tokens) {
        PyErr_Format(PyExc_ValueError, "positions must have num_tokens = %zd entries, got %zd", num_tokens,
                     PyArray_DIM(positions, 0));
        return NULL;
    }
    const int32_t *pd = PyArray_DATA(positions);
    for (npy_intp t = 0; t < num_tokens; ++t)
        if (pd[t] < 0 || pd[t] >= max_positions) {
            PyErr_Format(PyExc_ValueError, "positions must lie in [0, %zd), got %d at index %zd",
                         max_positions, (int)pd[t], t);
            return NULL;
        }
    PyArrayObject *out = output(o_out, 3, PyArray_DIMS(x), "[num_tokens, num_heads, head_dim]", 1);
    if (out == NULL) return NULL;
    if ((!same_elements(out, x) && overlaps(out, x)) || overlaps(out, cos_t) || overlaps(out, sin_t)) {
        PyErr_SetString(PyExc_ValueError, "out must be x itself or not overlap x, cos or sin");
        Py_DECREF(out);
        return NULL;
    }
    const float *xd = PyArray_DATA(x), *cd = PyArray_DATA(cos_t), *sd = PyArray_DATA(sin_t);
    float *od = PyArray_DATA(out);
    const npy_intp x_stride = PyArray_STRIDE(x, 0) / (npy_intp)sizeof(float);
    const npy_intp out_stride = PyArray_STRIDE(out, 0) / (npy_intp)sizeof(float);
    Py_BEGIN_ALLOW_THREADS
    rope_rows(xd, x_stride, od, out_stride, pd, cd, sd, num_tokens, num_heads, half);
    Py_END_ALLOW_THREADS
    return (PyObject *)out;
}

static PyObject *set_num_threads(PyObject *self, PyObject *arg) {
    (void)self;
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 1 || n > 1024) {
        PyErr_Format(PyExc_ValueError, "num_threads must be in [1, 1024], got %ld", n);
        return NULL;
    }
#ifdef _OPENMP
    omp_set_num_threads((int)n);
#endif
    Py_RETURN_NONE;
}

static PyObject *get_max_threads(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#ifdef _OPENMP
    return PyLong_FromLong(omp_get_max_threads());
#else
    return PyLong_FromLong(1);
#endif
}

static PyMethodDef methods[] = {
    {"set_num_threads", set_num_threads, METH_O,
     "set_num_threads(n) -> None\n--\n\n"
     "The OpenMP team size of the calling thread's next parallel regions (omp_set_num_threads)."},
    {"get_max_threads", get_max_threads, METH_NOARGS,
     "get_max_threads() -> int\n--\n\n"
     "The OpenMP team size the calling thread's next parallel region may use (omp_get_max_threads)."},
    {"rms_norm", (PyCFunction)(void (*)(void))rms_norm, METH_VARARGS | METH_KEYWORDS,
     "rms_norm(x, weight, eps, residual=None, out=None) -> numpy.ndarray\n--\n\n"
     "x / sqrt(mean(x^2) + eps) * weight per row, after x += residual (in place) when residual is given."},
    {"silu_mul", (PyCFunction)(void (*)(void))silu_mul, METH_VARARGS | METH_KEYWORDS,
     "silu_mul(gate_up, out=None) -> numpy.ndarray\n--\n\n"
     "silu(gate) * up for gate_up = [gate | up] ([n, 2i] -> [n, i])."},
    {"rope", (PyCFunction)(void (*)(void))rope, METH_VARARGS | METH_KEYWORDS,
     "rope(x, positions, cos, sin, out=None) -> numpy.ndarray\n--\n\n"
     "Rotary embeddings (rotate-half layout) of x [num_tokens, num_heads, head_dim] at positions, from "
     "cos/sin tables [max_positions, head_dim / 2]; out may be x itself."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_elementwise",
    .m_doc = "RMSNorm, SiLU-and-multiply and rotary embeddings for the CPU engine.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__elementwise(void) {
    import_array();
    return PyModule_Create(&module);
}
