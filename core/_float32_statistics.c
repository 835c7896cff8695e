/* `rollout_stream.core.rewards._fast_statistics` for a group of plain float rewards, in C: the same operations on the same
 * doubles, in the same order, so the same bits, without the interpreter's cost per value.
 *
 * `statistics(shared, normalizes, divides_by_std)` returns `(normalized | None, mean, std, zero_variance)`
 * exactly as `_fast_statistics(shared, cfg)` would, or None where that function might do anything else:
 * a value that is not a float (an int is converted there), a float32 overflow, a NaN or an infinity, a
 * group whose sums are not exact (torch's kernels decide those) — the caller then runs the Python, which
 * stays the definition (core/rewards.py says why each step is bit-identical to torch's float32 ops).
 * Built with -ffp-contract=off: a fused multiply-add would round once where the Python rounds twice.
 * tests/core/test_rewards_fastpath.py holds normalize_group to the reference's torch ops with this in use.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>

#define SMALL 64
#define FLOAT32_EXPONENT_LIMIT 128 /* multiples of 2**104 below 2**128 are finite float32s */
#define EXACT_SUM 9007199254740992.0 /* 2**53: integer float64 sums below it are exact in any order */

/* `_round32`: a (float) cast, as struct's "f" packs; 0 where that raises OverflowError. */
static inline int round32(double x, double *out) {
    float y = (float)x;
    if (isinf(y) && !isinf(x)) return 0;
    *out = (double)y;
    return 1;
}

/* `_exact_moments`: 1 with mean and std when every sum is exact, else 0. */
static int exact_moments(const double *v, Py_ssize_t n, double *mean_out, double *std_out) {
    double abs_sum = 0.0; /* Python's sum() of floats from 0: 0.0 + v0 + v1 ... */
    for (Py_ssize_t i = 0; i < n; i++) abs_sum += fabs(v[i]);
    int exponent;
    frexp(abs_sum, &exponent);
    if (exponent > FLOAT32_EXPONENT_LIMIT) return 0;
    double scale = ldexp(1.0, 24 - exponent);
    for (Py_ssize_t i = 0; i < n; i++) {
        double scaled = v[i] * scale;
        if (!isfinite(scaled) || floor(scaled) != scaled) return 0; /* float.is_integer */
    }
    double total = 0.0;
    int all_negative_zero = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        total += v[i];
        if (!signbit(v[i])) all_negative_zero = 0;
    }
    if (total == 0.0 && all_negative_zero) return 0;
    double mean;
    if (!round32(total / (double)n, &mean)) return 0;
    if (n == 1) {
        *mean_out = mean;
        *std_out = 0.0;
        return 1;
    }
    int mean_exponent;
    frexp(mean, &mean_exponent);
    int grid = (exponent < mean_exponent ? exponent : mean_exponent) - 24;
    double units = ldexp(1.0, -grid);
    double squares = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double deviation = (v[i] - mean) * units;
        double square = deviation * deviation;
        squares += square;
    }
    if (squares >= EXACT_SUM) return 0;
    double variance = ldexp(squares, 2 * grid) / (double)(n - 1);
    double std;
    if (!round32(sqrt(variance), &std)) return 0;
    *mean_out = mean;
    *std_out = std;
    return 1;
}

static PyObject *statistics(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "statistics(shared, normalizes, divides_by_std)");
        return NULL;
    }
    /* `shared` is the caller's own list (normalize_group builds it): nothing else can change it while the
     * allocations below run the collector, so its items are read again after them. */
    PyObject *shared = args[0];
    int normalizes = PyObject_IsTrue(args[1]), divides_by_std = PyObject_IsTrue(args[2]);
    if (normalizes < 0 || divides_by_std < 0) return NULL;
    if (!PyList_CheckExact(shared) || PyList_GET_SIZE(shared) == 0) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(shared);
    double small[SMALL];
    double *v = n <= SMALL ? small : PyMem_New(double, (size_t)n);
    if (v == NULL) return PyErr_NoMemory();
    PyObject *result = NULL;
    /* `_float32_inputs`, for plain floats only */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(shared, i);
        if (!PyFloat_CheckExact(item) || !round32(PyFloat_AS_DOUBLE(item), &v[i]) || !isfinite(v[i])) {
            result = Py_NewRef(Py_None);
            goto done;
        }
    }
    double mean, std;
    if (!exact_moments(v, n, &mean, &std)) { /* the Python asks torch's reductions, or declines */
        result = Py_NewRef(Py_None);
        goto done;
    }
    PyObject *normalized = NULL;
    if (normalizes) {
        for (Py_ssize_t i = 0; i < n; i++) {
            if (!round32(v[i] - mean, &v[i])) { result = Py_NewRef(Py_None); goto done; }
        }
        /* std is 0.0 for one rollout, where torch has None */
        if (divides_by_std && std > 0.0) {
            double epsilon, divisor;
            round32(1e-6, &epsilon); /* torch casts the scalar of `std + 1e-6` to float32 first */
            if (!round32(std + epsilon, &divisor)) { result = Py_NewRef(Py_None); goto done; }
            for (Py_ssize_t i = 0; i < n; i++) {
                if (!round32(v[i] / divisor, &v[i])) { result = Py_NewRef(Py_None); goto done; }
            }
        }
        normalized = PyList_New(n);
        if (normalized == NULL) goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *value = PyFloat_FromDouble(v[i]);
            if (value == NULL) { Py_DECREF(normalized); goto done; }
            PyList_SET_ITEM(normalized, i, value);
        }
    } else {
        normalized = Py_NewRef(Py_None);
    }
    /* zero_variance: every rollout's float32 value equals the first (the values before normalizing) */
    Py_ssize_t same = 0;
    double first = PyFloat_AS_DOUBLE(PyList_GET_ITEM(shared, 0));
    round32(first, &first);
    for (Py_ssize_t i = 0; i < n; i++) {
        double value = 0.0; /* each was rounded without overflow above */
        round32(PyFloat_AS_DOUBLE(PyList_GET_ITEM(shared, i)), &value);
        same += value == first;
    }
    result = Py_BuildValue("(NddO)", normalized, mean, std, same == n ? Py_True : Py_False);
done:
    if (v != small) PyMem_Free(v);
    return result;
}

static PyMethodDef methods[] = {
    {"statistics", (PyCFunction)(void (*)(void))statistics, METH_FASTCALL,
     "statistics(shared, normalizes, divides_by_std) -> (normalized | None, mean, std, zero_variance) | None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "rollout_stream.core._float32_statistics",
    "rollout_stream.core.rewards._fast_statistics of plain float rewards, in C (core/_float32_statistics.c)", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__float32_statistics(void) { return PyModule_Create(&module_def); }
