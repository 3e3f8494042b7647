/* Argument checks shared by the engine's C extensions (include after numpy/arrayobject.h).
 *
 * typed_array: obj as an ndarray of typenum (native byte order) with ndim dimensions, or NULL with a
 * TypeError / ValueError naming the argument and the expected shape. Layout (contiguity, alignment) is
 * each kernel's own rule, checked by the caller.
 * overlaps: whether the bytes two (non-empty) arrays span overlap; an array's span runs from its first
 * row to the end of its last (rows at a positive stride leave gaps inside, which count as covered; for a
 * C-contiguous array the span is its bytes).
 */
#ifndef SLUICE_NPY_ARGS_H
#define SLUICE_NPY_ARGS_H

static inline PyArrayObject *typed_array(PyObject *obj, const char *name, int typenum, int ndim, const char *shape) {
    if (!PyArray_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, got %s", name, Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyArrayObject *arr = (PyArrayObject *)obj;
    if (PyArray_TYPE(arr) != typenum || PyArray_ISBYTESWAPPED(arr)) {
        PyArray_Descr *want = PyArray_DescrFromType(typenum);
        PyErr_Format(PyExc_TypeError, "%s must have dtype %S, got %S", name, (PyObject *)want,
                     (PyObject *)PyArray_DESCR(arr));
        Py_DECREF(want);
        return NULL;
    }
    if (PyArray_NDIM(arr) != ndim) {
        PyErr_Format(PyExc_ValueError, "%s must have %d dimensions %s, got %d", name, ndim, shape,
                     PyArray_NDIM(arr));
        return NULL;
    }
    return arr;
}

static inline npy_intp span_bytes(PyArrayObject *a) {
    const npy_intp rows = PyArray_NDIM(a) > 0 ? PyArray_DIM(a, 0) : 1;
    const npy_intp row_stride = PyArray_NDIM(a) > 0 ? PyArray_STRIDE(a, 0) : 0;
    return (rows - 1) * row_stride + PyArray_NBYTES(a) / rows;
}

static inline int overlaps(PyArrayObject *a, PyArrayObject *b) {
    if (PyArray_SIZE(a) == 0 || PyArray_SIZE(b) == 0) return 0;
    const char *a0 = PyArray_BYTES(a), *b0 = PyArray_BYTES(b);
    return a0 < b0 + span_bytes(b) && b0 < a0 + span_bytes(a);
}

#endif
