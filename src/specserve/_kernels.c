/* Native kernels for the per-token work over a vocabulary row (or a row's candidates) that numpy does in
 * many passes or many small calls: issue 64's host time per step. Built by setuptools at install
 * (setup.py; optional: without a compiler, top_k.py and sampling.py do the same in numpy, and
 * top_k.NATIVE says which). Each gives what the numpy path gives (tests/test_sampling_fast.py runs
 * both): top_k and uniform53 bit for bit, exp_sum to float32's rounding.
 *
 * exp_sum(row, m): sum over a C-contiguous float32 row of exp(row[i] - m), in one pass. exp is
 * 2^(x log2 e) with the power of two split off and a degree-6 polynomial on [-1/2, 1/2] (relative
 * error under 2e-7 per term), summed in 16 float32 lanes over blocks of 1024 terms, the blocks' sums
 * in double. An argument below -126 log(2) counts as exp(-126 log 2) ~ 1e-38 (a -inf logit, masked by
 * a grammar, adds nothing measurable). Built for AVX-512, AVX2 and the baseline: the loader picks the
 * one the CPU has. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <math.h>
#include <string.h>

#define LANES 16
#define BLOCK 1024

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx512f", "avx2,fma", "default")))
#else
#define CLONES
#endif

CLONES static double exp_sum_f32(const float *x, Py_ssize_t n, float m) {
    const float log2e = 1.44269504088896341f;
    double total = 0.0;
    Py_ssize_t i = 0;
    while (i + LANES <= n) { /* blocks of up to BLOCK terms summed in float lanes, the blocks in double */
        float acc[LANES] = {0};
        Py_ssize_t end = i + BLOCK <= n ? i + BLOCK : n - (n - i) % LANES;
        for (; i < end; i += LANES) {
            for (int l = 0; l < LANES; l++) {
                float y = (x[i + l] - m) * log2e;
                y = y < -126.0f ? -126.0f : y;
                float r = __builtin_rintf(y);
                float f = y - r; /* [-1/2, 1/2] */
                float p = 1.5403530e-4f;
                p = p * f + 1.3333558e-3f;
                p = p * f + 9.6180273e-3f;
                p = p * f + 5.5504109e-2f;
                p = p * f + 2.4022651e-1f;
                p = p * f + 6.9314718e-1f;
                p = p * f + 1.0f;
                int32_t bits = ((int32_t)r + 127) << 23;
                float scale;
                memcpy(&scale, &bits, sizeof scale);
                acc[l] += p * scale;
            }
        }
        for (int l = 0; l < LANES; l++) total += acc[l];
    }
    for (; i < n; i++) {
        float y = (x[i] - m) * log2e;
        total += y < -126.0f ? 0x1p-126 : __builtin_exp2(y);
    }
    return total;
}

/* a C-contiguous float32 buffer of obj into view (released by the caller); -1 with TypeError else */
static int get_f32(PyObject *obj, Py_buffer *view) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    const char *fmt = view->format;
    if (fmt != NULL && (*fmt == '=' || *fmt == '@' || (*fmt == '<' && PY_LITTLE_ENDIAN))) fmt++; /* native order */
    if (view->itemsize != 4 || fmt == NULL || strcmp(fmt, "f") != 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_TypeError, "takes a C-contiguous float32 buffer");
        return -1;
    }
    return 0;
}

static PyObject *exp_sum(PyObject *self, PyObject *args) {
    PyObject *obj;
    float m;
    if (!PyArg_ParseTuple(args, "Of", &obj, &m)) return NULL;
    Py_buffer view;
    if (get_f32(obj, &view) < 0) return NULL;
    double total = exp_sum_f32((const float *)view.buf, view.len / 4, m);
    PyBuffer_Release(&view);
    return PyFloat_FromDouble(total);
}


/* top_k(row, k, out): the ids of the k largest entries of a C-contiguous float32 row, written to `out`
 * (a C-contiguous int64 buffer of k) in id order, the lowest ids winning among equal values at the
 * k-th place; returns the row's maximum. Returns None where it cannot answer cheaply or the row is
 * odd: at most 2 k groups, a NaN or an infinity (a grammar's mask is -inf), or more
 * than MAX_CAND entries to rank; the caller ranks those in numpy.
 *
 * As top_k.py's numpy does it: one pass takes the maximum of each of n / GROUP_K strided groups; the
 * k-th largest group maximum g is a lower bound of the k-th largest entry (the k largest group maxima
 * are k distinct entries), so the k largest lie among the entries >= g of the groups whose maximum
 * reaches g (usually k groups), and of the tail past the groups' n_groups * GROUP_K entries. */
#define GROUP_K 128
#define MAX_CAND 8192

typedef struct {
    float v;
    int64_t id;
} cand_t;

/* cand[*c] = (v, id) unless the MAX_CAND are taken (0 then) */
static inline int take(cand_t *cand, Py_ssize_t *c, float v, Py_ssize_t id) {
    if (*c == MAX_CAND) return 0;
    cand[*c].v = v;
    cand[(*c)++].id = id;
    return 1;
}

static int by_value_then_id(const void *a, const void *b) {
    const cand_t *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int by_id(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* the maximum of each strided group (group j: the entries j, j + n_groups, ..., GROUP_K of them) into out
 * [n_groups], as elementwise maxima of GROUP_K rows (so it vectorizes); whether they hold a NaN or an
 * infinity (x - x is NaN just there), which the caller leaves to numpy. chk: [n_groups] scratch. */
CLONES static int group_maxima(const float *restrict x, Py_ssize_t n_groups, float *restrict out,
                               float *restrict chk) {
    for (Py_ssize_t j = 0; j < n_groups; j++) {
        out[j] = x[j];
        chk[j] = 0.0f;
    }
    for (Py_ssize_t r = 0; r < GROUP_K; r++) {
        const float *restrict p = x + r * n_groups;
        for (Py_ssize_t j = 0; j < n_groups; j++) {
            out[j] = p[j] > out[j] ? p[j] : out[j];
            chk[j] += p[j] - p[j];
        }
    }
    float all = 0.0f;
    for (Py_ssize_t j = 0; j < n_groups; j++) all += chk[j];
    return all != all;
}

/* the k-th largest of v[0..n) (1 <= k <= n), reordering v: quickselect */
static float kth_largest(float *v, Py_ssize_t n, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = v[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i] = v[j];
                v[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return v[want];
    }
    return v[want];
}

static PyObject *top_k(PyObject *self, PyObject *args) {
    PyObject *row_obj, *out_obj;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OnO", &row_obj, &k, &out_obj)) return NULL;
    Py_buffer row, out;
    if (get_f32(row_obj, &row) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&row);
        return NULL;
    }
    PyObject *result = NULL;
    const float *x = row.buf;
    Py_ssize_t n = row.len / 4, n_groups = n / GROUP_K, full = n_groups * GROUP_K;
    float *gm;
    cand_t *cand;
    if (out.itemsize != 8 || out.len != 8 * k || k < 1) {
        PyErr_SetString(PyExc_ValueError, "top_k writes k int64 ids");
        goto done;
    }
    if (n_groups <= 2 * k) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* scratch kept between calls (the GIL is held throughout): a fresh 128 KiB each call costs page faults */
    static float *gm_buf = NULL, *sel_buf = NULL;
    static Py_ssize_t gm_cap = 0;
    static cand_t cand_buf[MAX_CAND];
    if (gm_cap < n_groups) {
        float *a = PyMem_Realloc(gm_buf, sizeof(float) * n_groups);
        if (a != NULL) gm_buf = a;
        float *b = a != NULL ? PyMem_Realloc(sel_buf, sizeof(float) * n_groups) : NULL;
        if (b != NULL) sel_buf = b;
        if (a == NULL || b == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        gm_cap = n_groups;
    }
    gm = gm_buf;
    cand = cand_buf;
    int nan = group_maxima(x, n_groups, gm, sel_buf);
    float m = gm[0];
    for (Py_ssize_t j = 1; j < n_groups; j++) m = gm[j] > m ? gm[j] : m;
    for (Py_ssize_t i = full; i < n; i++) {
        nan |= x[i] != x[i];
        m = x[i] > m ? x[i] : m;
    }
    if (nan) {  /* the caller's ranking says what a row with a NaN gets, and handles infinities */
        result = Py_NewRef(Py_None);
        goto done;
    }
    memcpy(sel_buf, gm, sizeof(float) * n_groups);
    float g = kth_largest(sel_buf, n_groups, k);
    if (!(g > -INFINITY)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    Py_ssize_t c = 0;
    for (Py_ssize_t j = 0; j < n_groups; j++)
        if (gm[j] >= g)
            for (Py_ssize_t i = j; i < full; i += n_groups)
                if (x[i] >= g && !take(cand, &c, x[i], i)) goto too_many;
    for (Py_ssize_t i = full; i < n; i++)
        if (x[i] >= g && !take(cand, &c, x[i], i)) goto too_many;
    qsort(cand, c, sizeof(cand_t), by_value_then_id);
    int64_t *ids = out.buf;
    for (Py_ssize_t i = 0; i < k; i++) ids[i] = cand[i].id;
    qsort(ids, k, sizeof(int64_t), by_id);
    result = PyFloat_FromDouble(m);
    goto done;
too_many:
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&out);
    PyBuffer_Release(&row);
    return result;
}

/* uniform53(ids, ka, kb, out): sampling.Noise's uniforms, out[r, j] = (A 2^21 + (B >> 11) + 1/2) 2^-53
 * with A, B the lowbias32 hashes of (uint32) ids[r, j] under row r's keys ka[r], kb[r]: bit for bit
 * what sampling._hash32 and its float64 arithmetic give (integers below 2^53 are exact in double).
 * ids: C-contiguous int64 [R, W]; ka, kb: uint32 [R]; out: float64 [R, W]. */
static inline uint32_t lowbias32(uint32_t id, uint32_t key) {
    uint32_t x = id * 0x9E3779B1u + key;
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

static PyObject *uniform53(PyObject *self, PyObject *args) {
    PyObject *o_ids, *o_ka, *o_kb, *o_out;
    if (!PyArg_ParseTuple(args, "OOOO", &o_ids, &o_ka, &o_kb, &o_out)) return NULL;
    Py_buffer ids, ka, kb, out;
    int got = 0;
    if (PyObject_GetBuffer(o_ids, &ids, PyBUF_C_CONTIGUOUS) < 0) goto fail;
    got = 1;
    if (PyObject_GetBuffer(o_ka, &ka, PyBUF_C_CONTIGUOUS) < 0) goto fail;
    got = 2;
    if (PyObject_GetBuffer(o_kb, &kb, PyBUF_C_CONTIGUOUS) < 0) goto fail;
    got = 3;
    if (PyObject_GetBuffer(o_out, &out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail;
    got = 4;
    Py_ssize_t rows = ka.len / 4, n = ids.len / 8;
    if (ids.itemsize != 8 || ka.itemsize != 4 || kb.itemsize != 4 || out.itemsize != 8 || kb.len != ka.len
        || out.len != ids.len || rows == 0 || n % rows != 0) {
        PyErr_SetString(PyExc_ValueError, "uniform53 takes int64 ids [R, W], uint32 keys [R] twice, float64 out [R, W]");
        goto fail;
    }
    Py_ssize_t w = n / rows;
    const int64_t *id = ids.buf;
    const uint32_t *a = ka.buf, *b = kb.buf;
    double *u = out.buf;
    for (Py_ssize_t r = 0; r < rows; r++)
        for (Py_ssize_t j = 0; j < w; j++) {
            uint32_t x = (uint32_t)id[r * w + j];
            u[r * w + j] = ((double)lowbias32(x, a[r]) * 0x1p21 + (double)(lowbias32(x, b[r]) >> 11) + 0.5) * 0x1p-53;
        }
    PyBuffer_Release(&out);
    PyBuffer_Release(&kb);
    PyBuffer_Release(&ka);
    PyBuffer_Release(&ids);
    Py_RETURN_NONE;
fail:
    if (got >= 4) PyBuffer_Release(&out);
    if (got >= 3) PyBuffer_Release(&kb);
    if (got >= 2) PyBuffer_Release(&ka);
    if (got >= 1) PyBuffer_Release(&ids);
    return NULL;
}

static PyMethodDef methods[] = {
    {"exp_sum", exp_sum, METH_VARARGS, "exp_sum(row, m): sum of exp(row - m) over a float32 row, one pass."},
    {"top_k", top_k, METH_VARARGS, "top_k(row, k, out): the k largest entries' ids into out (int64, id order); the row's max."},
    {"uniform53", uniform53, METH_VARARGS, "uniform53(ids, ka, kb, out): sampling.Noise's uniforms of the ids, into out."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
