/* Argument checks shared by the engine's C extensions (include after numpy/arrayobject.h).
 *
 * typed_array: obj as an ndarray of typenum (native byte order) with ndim dimensions, or NULL with a
 * TypeError / ValueError naming the argument and the expected shape. Layout (contiguity, alignment) is
 * each kernel's own rule, checked by the caller.
 * overlaps: whether the bytes of two (non-empty) arrays overlap.
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

static inline int overlaps(PyArrayObject *a, PyArrayObject *b) {
    const char *a0 = PyArray_BYTES(a), *b0 = PyArray_BYTES(b);
    return PyArray_NBYTES(a) > 0 && PyArray_NBYTES(b) > 0 && a0 < b0 + PyArray_NBYTES(b) &&
           b0 < a0 + PyArray_NBYTES(a);
}

#endif
