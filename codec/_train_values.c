/* The train records of one group from one template, in C (codec/wire.py, `encode_train_samples`).
 *
 * `train_values(pieces, samples, raw_rewards, rewards, offsets)` returns, per sample,
 *     head + sample + raw_key + float64(raw) + reward_key + float64(reward) + middle + uint(offset) + tail
 * where `pieces` is (head, raw_key, reward_key, middle, tail), cut by codec/wire.py from msgspec's own
 * encoding of the group's shared fields. A float is written as msgspec writes it (0xcb, big-endian
 * float64), an offset as msgspec writes a non-negative int (the smallest of fixint, uint8..uint64). For
 * anything else (an int reward, a negative or huge offset, a sample that is not bytes) it returns None and
 * the caller encodes one struct per sample. tests/codec/test_wire.py compares the bytes with msgspec's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static inline char *put_be(char *out, uint64_t value, int width) {
    for (int k = width - 1; k >= 0; k--) { out[k] = (char)(value & 0xff); value >>= 8; }
    return out + width;
}

static inline char *put_float(char *out, double value) {
    uint64_t bits;
    memcpy(&bits, &value, 8);
    *out++ = (char)0xcb;
    return put_be(out, bits, 8);
}

static inline char *put_uint(char *out, uint64_t value) {
    if (value <= 0x7f) { *out++ = (char)value; return out; }
    if (value <= 0xff) { *out++ = (char)0xcc; return put_be(out, value, 1); }
    if (value <= 0xffff) { *out++ = (char)0xcd; return put_be(out, value, 2); }
    if (value <= 0xffffffffULL) { *out++ = (char)0xce; return put_be(out, value, 4); }
    *out++ = (char)0xcf;
    return put_be(out, value, 8);
}

static inline Py_ssize_t uint_size(uint64_t value) {
    return value <= 0x7f ? 1 : value <= 0xff ? 2 : value <= 0xffff ? 3 : value <= 0xffffffffULL ? 5 : 9;
}

static inline char *put(char *out, PyObject *bytes) {
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    memcpy(out, PyBytes_AS_STRING(bytes), (size_t)n);
    return out + n;
}

static PyObject *train_values(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "train_values(pieces, samples, raw_rewards, rewards, offsets)");
        return NULL;
    }
    PyObject *pieces = args[0], *samples = args[1], *raws = args[2], *rewards = args[3], *offsets = args[4];
    if (!PyTuple_CheckExact(pieces) || PyTuple_GET_SIZE(pieces) != 5) {
        PyErr_SetString(PyExc_TypeError, "pieces: (head, raw_key, reward_key, middle, tail)");
        return NULL;
    }
    Py_ssize_t fixed = 0;
    for (int k = 0; k < 5; k++) {
        PyObject *piece = PyTuple_GET_ITEM(pieces, k);
        if (!PyBytes_CheckExact(piece)) {
            PyErr_SetString(PyExc_TypeError, "pieces must be bytes");
            return NULL;
        }
        fixed += PyBytes_GET_SIZE(piece);
    }
    if (!PyList_CheckExact(samples) || !PyList_CheckExact(raws) || !PyList_CheckExact(rewards) ||
        !PyList_CheckExact(offsets))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(samples);
    if (PyList_GET_SIZE(raws) != n || PyList_GET_SIZE(rewards) != n || PyList_GET_SIZE(offsets) != n) {
        PyErr_SetString(PyExc_ValueError, "samples, raw_rewards, rewards and offsets differ in length");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *offset = PyList_GET_ITEM(offsets, i);
        if (!PyBytes_CheckExact(PyList_GET_ITEM(samples, i)) || !PyFloat_CheckExact(PyList_GET_ITEM(raws, i)) ||
            !PyFloat_CheckExact(PyList_GET_ITEM(rewards, i)) || !PyLong_CheckExact(offset))
            Py_RETURN_NONE;
        long long value = PyLong_AsLongLong(offset);
        if (value < 0) {
            if (value == -1 && PyErr_Occurred()) PyErr_Clear();
            Py_RETURN_NONE; /* msgspec writes a negative int differently: the struct path */
        }
    }
    PyObject *head = PyTuple_GET_ITEM(pieces, 0), *raw_key = PyTuple_GET_ITEM(pieces, 1),
             *reward_key = PyTuple_GET_ITEM(pieces, 2), *middle = PyTuple_GET_ITEM(pieces, 3),
             *tail = PyTuple_GET_ITEM(pieces, 4);
    /* the lists are codec/wire.py's own copies: the allocations below cannot change them */
    PyObject *out = PyList_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *sample = PyList_GET_ITEM(samples, i);
        if (PyBytes_GET_SIZE(sample) > PY_SSIZE_T_MAX - fixed - 27) {
            Py_DECREF(out);
            return PyErr_NoMemory();
        }
        uint64_t offset = (uint64_t)PyLong_AsLongLong(PyList_GET_ITEM(offsets, i));
        PyObject *value = PyBytes_FromStringAndSize(NULL, fixed + PyBytes_GET_SIZE(sample) + 2 * 9 +
                                                           uint_size(offset));
        if (value == NULL) { Py_DECREF(out); return NULL; }
        char *at = PyBytes_AS_STRING(value);
        at = put(at, head);
        at = put(at, sample);
        at = put(at, raw_key);
        at = put_float(at, PyFloat_AS_DOUBLE(PyList_GET_ITEM(raws, i)));
        at = put(at, reward_key);
        at = put_float(at, PyFloat_AS_DOUBLE(PyList_GET_ITEM(rewards, i)));
        at = put(at, middle);
        at = put_uint(at, offset);
        put(at, tail);
        PyList_SET_ITEM(out, i, value);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"train_values", (PyCFunction)(void (*)(void))train_values, METH_FASTCALL,
     "train_values(pieces, samples, raw_rewards, rewards, offsets) -> list[bytes] | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "rollout_stream.codec._train_values",
    "the train records of one group from one template, in C (codec/_train_values.c)", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__train_values(void) { return PyModule_Create(&module_def); }
