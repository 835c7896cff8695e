/* The stage's common case in one pass over a record's MessagePack bytes: what `rollout_stream.codec.head.decode_head`
 * and `rollout_stream.core.validate.plainly_valid` decide together, without building a Python object per field.
 *
 * `plain_head(value, key, default_group_size, max_group_size, max_sibling_count)` returns a
 * `rollout_stream.core.structs.PlainHead` when the record decodes as a `Sample` (`rollout_stream.codec.decode_sample` takes it, with the
 * same values) and is plainly valid (a finite float reward, every size in range, weight version offsets
 * that fit the response, keyed by its group);
 * else None, and the caller takes the Python path, which says what is wrong or that it is valid after
 * all. It is a shortcut, never a second judge: anything it does not recognise exactly (an unknown field,
 * a field twice, an ext inside metadata, an integer beyond int64, a plain-list array, routing replay
 * arrays, a reward given as an int or a mapping, nesting deeper than 32) is declined, never guessed at.
 * tests/core/test_plain_scan.py compares it with `decode_sample` + `plainly_valid` on random and
 * corrupted records. core/plain_scan.py configures it from `Sample`'s own definitions.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static PyObject *head_type = NULL; /* rollout_stream.core.structs.PlainHead */
static uint8_t item_size[256];     /* by ext code (as an unsigned byte); 0: not a packed-array code */
static uint8_t float_size[256];    /* by ext code: 4 or 8 for a packed float array; 0: not one */
static int8_t int_size[256];       /* by ext code: a packed integer array's item size, negative if signed */
static long long max_schema_version = 0;

typedef struct {
    const uint8_t *p, *end;
} Cursor;

enum Kind { K_BAD = 0, K_NIL, K_BOOL, K_INT, K_FLOAT, K_STR, K_BIN, K_ARRAY, K_MAP, K_EXT };

typedef struct {
    enum Kind kind;
    long long i;        /* K_INT, K_BOOL */
    double f;           /* K_FLOAT */
    const uint8_t *s;   /* K_STR, K_BIN, K_EXT: the payload */
    Py_ssize_t n;       /* payload length, or K_ARRAY/K_MAP: the item count */
    int8_t code;        /* K_EXT */
} Item;

static inline uint64_t be(const uint8_t *p, int width) {
    uint64_t v = 0;
    for (int k = 0; k < width; k++) v = (v << 8) | p[k];
    return v;
}

/* One item's header; a str, bin or ext payload is stepped over (its bounds checked). */
static int next_item(Cursor *c, Item *it) {
    if (c->p >= c->end) return 0;
    uint8_t b = *c->p++;
    Py_ssize_t left = c->end - c->p;
    Py_ssize_t len = 0;
    int width = 0;
    if (b <= 0x7f) { it->kind = K_INT; it->i = b; return 1; }
    if (b >= 0xe0) { it->kind = K_INT; it->i = (int8_t)b; return 1; }
    if ((b & 0xf0) == 0x80) { it->kind = K_MAP; it->n = b & 0x0f; return 1; }
    if ((b & 0xf0) == 0x90) { it->kind = K_ARRAY; it->n = b & 0x0f; return 1; }
    if ((b & 0xe0) == 0xa0) { it->kind = K_STR; len = b & 0x1f; goto payload; }
    switch (b) {
    case 0xc0: it->kind = K_NIL; return 1;
    case 0xc2: it->kind = K_BOOL; it->i = 0; return 1;
    case 0xc3: it->kind = K_BOOL; it->i = 1; return 1;
    case 0xc4: case 0xc5: case 0xc6:
        width = 1 << (b - 0xc4);
        if (left < width) return 0;
        len = (Py_ssize_t)be(c->p, width); c->p += width; it->kind = K_BIN; goto payload;
    case 0xc7: case 0xc8: case 0xc9:
        width = 1 << (b - 0xc7);
        if (left < width + 1) return 0;
        len = (Py_ssize_t)be(c->p, width); c->p += width;
        it->code = (int8_t)*c->p++; it->kind = K_EXT; goto payload;
    case 0xca: {
        if (left < 4) return 0;
        uint32_t bits = (uint32_t)be(c->p, 4); float f; memcpy(&f, &bits, 4);
        c->p += 4; it->kind = K_FLOAT; it->f = (double)f; return 1;
    }
    case 0xcb: {
        if (left < 8) return 0;
        uint64_t bits = be(c->p, 8); double d; memcpy(&d, &bits, 8);
        c->p += 8; it->kind = K_FLOAT; it->f = d; return 1;
    }
    case 0xcc: case 0xcd: case 0xce: case 0xcf: {
        width = 1 << (b - 0xcc);
        if (left < width) return 0;
        uint64_t v = be(c->p, width); c->p += width;
        if (v > (uint64_t)INT64_MAX) return 0; /* a Python int beyond int64: declined */
        it->kind = K_INT; it->i = (long long)v; return 1;
    }
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: {
        width = 1 << (b - 0xd0);
        if (left < width) return 0;
        uint64_t v = be(c->p, width); c->p += width;
        int shift = 64 - 8 * width; /* sign-extend */
        it->kind = K_INT; it->i = shift ? (long long)(int64_t)(v << shift) >> shift : (long long)(int64_t)v;
        return 1;
    }
    case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8:
        if (left < 1) return 0;
        len = (Py_ssize_t)1 << (b - 0xd4); it->code = (int8_t)*c->p++; it->kind = K_EXT; goto payload;
    case 0xd9: case 0xda: case 0xdb:
        width = 1 << (b - 0xd9);
        if (left < width) return 0;
        len = (Py_ssize_t)be(c->p, width); c->p += width; it->kind = K_STR; goto payload;
    case 0xdc: case 0xdd:
        width = 2 << (b - 0xdc);
        if (left < width) return 0;
        it->n = (Py_ssize_t)be(c->p, width); c->p += width; it->kind = K_ARRAY; return 1;
    case 0xde: case 0xdf:
        width = 2 << (b - 0xde);
        if (left < width) return 0;
        it->n = (Py_ssize_t)be(c->p, width); c->p += width; it->kind = K_MAP; return 1;
    default: /* 0xc1: never used */
        return 0;
    }
payload:
    if (len < 0 || c->end - c->p < len) return 0;
    it->s = c->p; it->n = len; c->p += len;
    return 1;
}

/* Strict UTF-8, as Python's decoder takes it (no surrogates, no overlong forms, nothing past U+10FFFF). */
static int valid_utf8(const uint8_t *s, Py_ssize_t n) {
    const uint8_t *end = s + n;
    while (s < end) {
        if (end - s >= 8) {
            uint64_t w; memcpy(&w, s, 8);
            if (!(w & 0x8080808080808080ULL)) { s += 8; continue; }
        }
        uint8_t b = *s;
        if (b < 0x80) { s++; continue; }
        if (b >= 0xc2 && b <= 0xdf) {
            if (end - s < 2 || (s[1] & 0xc0) != 0x80) return 0;
            s += 2; continue;
        }
        if (b >= 0xe0 && b <= 0xef) {
            if (end - s < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80) return 0;
            if (b == 0xe0 && s[1] < 0xa0) return 0;
            if (b == 0xed && s[1] > 0x9f) return 0;
            s += 3; continue;
        }
        if (b >= 0xf0 && b <= 0xf4) {
            if (end - s < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
                return 0;
            if (b == 0xf0 && s[1] < 0x90) return 0;
            if (b == 0xf4 && s[1] > 0x8f) return 0;
            s += 4; continue;
        }
        return 0;
    }
    return 1;
}

static int next_str(Cursor *c, Item *it) {
    return next_item(c, it) && it->kind == K_STR && valid_utf8(it->s, it->n);
}

/* An `Any` value as msgspec decodes it without a type (metadata): nil, bool, int, float, str, bin, array,
 * and maps keyed by str. Exts are declined (the array hook would run on them). */
static int skip_any(Cursor *c, int depth) {
    Item it;
    if (depth > 32 || !next_item(c, &it)) return 0;
    switch (it.kind) {
    case K_NIL: case K_BOOL: case K_INT: case K_FLOAT: case K_BIN: return 1;
    case K_STR: return valid_utf8(it.s, it.n);
    case K_ARRAY:
        for (Py_ssize_t k = 0; k < it.n; k++) if (!skip_any(c, depth + 1)) return 0;
        return 1;
    case K_MAP:
        for (Py_ssize_t k = 0; k < it.n; k++) {
            Item key;
            if (!next_str(c, &key) || !skip_any(c, depth + 1)) return 0;
        }
        return 1;
    default:
        return 0;
    }
}

/* A `dict[str, Any]`. */
static int str_map(Cursor *c, const Item *it) {
    if (it->kind != K_MAP) return 0;
    for (Py_ssize_t k = 0; k < it->n; k++) {
        Item key;
        if (!next_str(c, &key) || !skip_any(c, 1)) return 0;
    }
    return 1;
}

/* A packed array's item count, or -1 for nil; -2: not a packed array this stage reads. */
static Py_ssize_t packed(const Item *it) {
    if (it->kind == K_NIL) return -1;
    if (it->kind != K_EXT) return -2;
    uint8_t size = item_size[(uint8_t)it->code];
    if (size == 0 || it->n % size) return -2;
    return it->n / size;
}

enum Field {
    F_TYPE, F_SCHEMA_VERSION, F_GROUP_INDEX, F_INDEX, F_ROLLOUT_ID, F_PROMPT, F_RESPONSE, F_LABEL, F_TOKENS,
    F_RESPONSE_LENGTH, F_REWARD, F_LOSS_MASK, F_ROLLOUT_LOG_PROBS, F_STATUS, F_REMOVE_SAMPLE,
    F_WEIGHT_VERSIONS, F_METADATA, F_GROUP_SIZE, F_SIBLING_COUNT, F_SIBLING_INDEX, F_RUN_ID,
    F_TEACHER_LOG_PROBS, F_OPD_REVERSE_KL, F_ROLLOUT_ROUTED_EXPERTS, F_ROLLOUT_INDEXER_TOPK,
    F_TRAIN_METADATA, F_ROLLOUT_SAMPLING_MASK_IDS, F_ROLLOUT_SAMPLING_MASK_OFFSETS, F_WEIGHT_VERSION_OFFSETS,
    F_COUNT
};

static const char *const FIELD_NAMES[F_COUNT] = {
    "type", "schema_version", "group_index", "index", "rollout_id", "prompt", "response", "label", "tokens",
    "response_length", "reward", "loss_mask", "rollout_log_probs", "status", "remove_sample",
    "weight_versions", "metadata", "group_size", "sibling_count", "sibling_index", "run_id",
    "teacher_log_probs", "opd_reverse_kl", "rollout_routed_experts", "rollout_indexer_topk",
    "train_metadata", "rollout_sampling_mask_ids", "rollout_sampling_mask_offsets", "weight_version_offsets",
};
static Py_ssize_t field_length[F_COUNT];
_Static_assert(F_COUNT <= 64, "read_fields keeps a bit per field in a uint64_t");

static inline int is_field(const Item *key, int f) {
    if (key->n != field_length[f]) return 0;
    const char *name = FIELD_NAMES[f];
    for (Py_ssize_t k = 0; k < key->n; k++) if (key->s[k] != (uint8_t)name[k]) return 0;
    return 1;
}

/* Producers write the fields in `Sample`'s order, the tag first: `expected` is right nearly always. */
static int field_of(const Item *key, int expected) {
    if (expected < F_COUNT && is_field(key, expected)) return expected;
    for (int f = 0; f < F_COUNT; f++) if (is_field(key, f)) return f;
    return -1;
}

static const char TAG[] = "rollout_sample";

typedef struct {
    long long schema_version, group_index, index, response_length, group_size, sibling_count, sibling_index;
    int has_group_index, has_index, has_group_size;
    double reward;
    int rollout_kind; /* 0: nil, 1: int, 2: str */
    long long rollout_int;
    Item rollout_str, run_id; /* run_id.kind K_NIL when absent */
    Py_ssize_t tokens, loss_mask, log_probs; /* -1: nil */
    Py_ssize_t versions;                     /* weight_versions' count */
    Item version_offsets;                    /* kind K_NIL when absent */
} Head;

/* Whether a packed float array holds only finite values (any other packed array: yes). The wire's floats
 * are little-endian; on another host the Python path judges. */
static int all_finite(const Item *it) {
    uint8_t size = float_size[(uint8_t)it->code];
    if (size == 0) return 1;
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    return 0;
#else
    if (size == 4) {
        for (Py_ssize_t k = 0; k + 4 <= it->n; k += 4) {
            float x;
            memcpy(&x, it->s + k, 4);
            if (!isfinite(x)) return 0;
        }
    } else {
        for (Py_ssize_t k = 0; k + 8 <= it->n; k += 8) {
            double x;
            memcpy(&x, it->s + k, 8);
            if (!isfinite(x)) return 0;
        }
    }
    return 1;
#endif
}

/* validate.version_offsets_problem is None: one offset per version, the first 0, none below the one before
 * it, none past the response. Items are read little-endian, as the wire writes them, on any host. */
static int version_offsets_fit(const Item *it, Py_ssize_t versions, long long length) {
    int8_t size = int_size[(uint8_t)it->code];
    int is_signed = size < 0, width = is_signed ? -size : size;
    if (it->n / width != versions) return 0;
    long long previous = 0;
    for (Py_ssize_t k = 0; k < versions; k++) {
        const uint8_t *p = it->s + k * width;
        uint64_t u = 0;
        for (int b = width - 1; b >= 0; b--) u = (u << 8) | p[b];
        if (!is_signed && u > (uint64_t)INT64_MAX) return 0; /* not a wire dtype today: never guessed at */
        int shift = 64 - 8 * width;
        long long offset = is_signed ? (shift ? (long long)(int64_t)(u << shift) >> shift : (long long)(int64_t)u)
                                     : (long long)u;
        if ((k == 0 && offset != 0) || offset < previous || offset > length) return 0;
        previous = offset;
    }
    return 1;
}

/* An int, or nil when `nullable`: 1 int, 2 nil, 0 neither. */
static int int_or_nil(const Item *it, int nullable) {
    if (it->kind == K_INT) return 1;
    return nullable && it->kind == K_NIL ? 2 : 0;
}

static int read_fields(Cursor *c, Head *h) {
    Item top, key, v;
    uint64_t seen = 0; /* a bit per field: room for 64 */
    int f = -1;
    if (!next_item(c, &top) || top.kind != K_MAP) return 0;
    for (Py_ssize_t k = 0; k < top.n; k++) {
        if (!next_item(c, &key) || key.kind != K_STR) return 0;
        f = field_of(&key, f + 1);
        if (f < 0 || (seen & (1ull << f))) return 0; /* an unknown field, or one given twice */
        seen |= 1ull << f;
        if (f == F_METADATA || f == F_TRAIN_METADATA) {
            if (!next_item(c, &v)) return 0;
            if (f == F_TRAIN_METADATA && v.kind == K_NIL) continue;
            if (!str_map(c, &v)) return 0;
            continue;
        }
        if (f == F_WEIGHT_VERSIONS) {
            if (!next_item(c, &v) || v.kind != K_ARRAY) return 0;
            for (Py_ssize_t j = 0; j < v.n; j++) if (!next_str(c, &key)) return 0;
            h->versions = v.n;
            continue;
        }
        if (!next_item(c, &v)) return 0;
        switch (f) {
        case F_TYPE:
            if (v.kind != K_STR || v.n != (Py_ssize_t)sizeof(TAG) - 1 || memcmp(v.s, TAG, sizeof(TAG) - 1))
                return 0;
            break;
        case F_SCHEMA_VERSION:
            if (v.kind != K_INT) return 0;
            h->schema_version = v.i;
            break;
        case F_GROUP_INDEX:
            if (!int_or_nil(&v, 1)) return 0;
            h->has_group_index = v.kind == K_INT; h->group_index = h->has_group_index ? v.i : 0;
            break;
        case F_INDEX:
            if (!int_or_nil(&v, 1)) return 0;
            h->has_index = v.kind == K_INT; h->index = h->has_index ? v.i : 0;
            break;
        case F_ROLLOUT_ID:
            if (v.kind == K_NIL) h->rollout_kind = 0;
            else if (v.kind == K_INT) { h->rollout_kind = 1; h->rollout_int = v.i; }
            else if (v.kind == K_STR && valid_utf8(v.s, v.n)) { h->rollout_kind = 2; h->rollout_str = v; }
            else return 0;
            break;
        case F_PROMPT: case F_RESPONSE: case F_STATUS:
            if (v.kind != K_STR || !valid_utf8(v.s, v.n)) return 0;
            break;
        case F_LABEL:
            if (v.kind == K_NIL) break;
            if (v.kind != K_STR || !valid_utf8(v.s, v.n)) return 0;
            break;
        case F_RUN_ID:
            if (v.kind == K_NIL) { h->run_id.kind = K_NIL; break; }
            if (v.kind != K_STR || !valid_utf8(v.s, v.n)) return 0;
            h->run_id = v;
            break;
        case F_TOKENS:
            if ((h->tokens = packed(&v)) == -2) return 0;
            break;
        case F_LOSS_MASK:
            if ((h->loss_mask = packed(&v)) == -2) return 0;
            break;
        case F_ROLLOUT_LOG_PROBS: /* a NaN or infinity may sit on a trainable token: the full check */
            if ((h->log_probs = packed(&v)) == -2 || (h->log_probs >= 0 && !all_finite(&v))) return 0;
            break;
        case F_TEACHER_LOG_PROBS: case F_OPD_REVERSE_KL:
            if (packed(&v) == -2) return 0;
            break;
        case F_WEIGHT_VERSION_OFFSETS: /* judged once the response length and the versions are read */
            if (v.kind != K_NIL && (packed(&v) == -2 || int_size[(uint8_t)v.code] == 0)) return 0;
            h->version_offsets = v;
            break;
        case F_ROLLOUT_ROUTED_EXPERTS: case F_ROLLOUT_INDEXER_TOPK: /* replay arrays: the whole decode */
        case F_ROLLOUT_SAMPLING_MASK_IDS: case F_ROLLOUT_SAMPLING_MASK_OFFSETS: /* validated whole */
            if (v.kind != K_NIL) return 0;
            break;
        case F_RESPONSE_LENGTH:
            if (v.kind != K_INT) return 0;
            h->response_length = v.i;
            break;
        case F_REWARD: /* plainly valid: a finite float (an int, a mapping or None take the full check) */
            if (v.kind != K_FLOAT || !isfinite(v.f)) return 0;
            h->reward = v.f;
            break;
        case F_REMOVE_SAMPLE:
            if (v.kind != K_BOOL) return 0;
            break;
        case F_GROUP_SIZE:
            if (!int_or_nil(&v, 1)) return 0;
            h->has_group_size = v.kind == K_INT; h->group_size = h->has_group_size ? v.i : 0;
            break;
        case F_SIBLING_COUNT:
            if (v.kind != K_INT) return 0;
            h->sibling_count = v.i;
            break;
        case F_SIBLING_INDEX:
            if (v.kind != K_INT) return 0;
            h->sibling_index = v.i;
            break;
        default:
            return 0;
        }
    }
    /* the tag and a reward are required here (a missing reward is None: the full check's case) */
    return c->p == c->end && (seen & (1ull << F_TYPE)) && (seen & (1ull << F_REWARD));
}

static PyObject *plain_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError,
                        "plain_head(value, key, default_group_size, max_group_size, max_sibling_count)");
        return NULL;
    }
    if (head_type == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "rollout_stream.core._plain_scan is not configured (core/plain_scan.py does it)");
        return NULL;
    }
    PyObject *value = args[0], *key = args[1];
    if (!PyBytes_CheckExact(value) || !PyBytes_CheckExact(key)) Py_RETURN_NONE;
    long long limits[3] = {-1, 0, 0}; /* default group size (-1: None), max group size, max sibling count */
    for (int k = 0; k < 3; k++) {
        if (k == 0 && args[2] == Py_None) continue;
        limits[k] = PyLong_AsLongLong(args[2 + k]);
        if (limits[k] == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
            PyErr_Clear(); /* a limit beyond int64: the Python path compares it */
            Py_RETURN_NONE;
        }
    }
    long long default_group_size = limits[0], max_group_size = limits[1], max_sibling_count = limits[2];

    Head h;
    memset(&h, 0, sizeof h);
    h.schema_version = 1; h.sibling_count = 1; h.run_id.kind = K_NIL; h.version_offsets.kind = K_NIL;
    h.tokens = h.loss_mask = h.log_probs = -1;
    Cursor c = {(const uint8_t *)PyBytes_AS_STRING(value),
                (const uint8_t *)PyBytes_AS_STRING(value) + PyBytes_GET_SIZE(value)};
    /* The parse reads a few bytes here and there, each where the previous length says: one cache miss
     * after another on a record not read yet. Asking for every line first overlaps the misses (and the
     * digest and the train record read the whole record next). */
    for (Py_ssize_t line = 0; line < PyBytes_GET_SIZE(value); line += 64) __builtin_prefetch(c.p + line);
    if (!read_fields(&c, &h)) Py_RETURN_NONE;

    /* rollout_stream.codec.wire's version check, then plainly_valid's checks in its order */
    if (h.schema_version < 1 || h.schema_version > max_schema_version || !h.has_group_index) Py_RETURN_NONE;
    long long group_size = h.has_group_size ? h.group_size : default_group_size;
    if (!h.has_group_size && default_group_size < 0) Py_RETURN_NONE;
    long long length = h.response_length;
    if (!(0 < group_size && group_size <= max_group_size && 0 < h.sibling_count &&
          h.sibling_count <= max_sibling_count && 0 <= h.sibling_index && h.sibling_index < h.sibling_count &&
          length >= 0))
        Py_RETURN_NONE;
    if ((h.loss_mask >= 0 && h.loss_mask != length) || (h.tokens >= 0 && length > h.tokens) ||
        (h.log_probs >= 0 && h.log_probs != length))
        Py_RETURN_NONE;
    if (h.version_offsets.kind != K_NIL && !version_offsets_fit(&h.version_offsets, h.versions, length))
        Py_RETURN_NONE;

    /* the record's key must be the group key: f"{run_id}/{group_index}" if run_id else str(group_index) */
    char digits_buffer[24];
    char *number = digits_buffer + sizeof digits_buffer;
    unsigned long long magnitude = h.group_index < 0 ? 0ULL - (unsigned long long)h.group_index
                                                     : (unsigned long long)h.group_index;
    do { *--number = (char)('0' + magnitude % 10); magnitude /= 10; } while (magnitude);
    if (h.group_index < 0) *--number = '-';
    int digits = (int)(digits_buffer + sizeof digits_buffer - number);
    Py_ssize_t prefix = h.run_id.kind == K_STR && h.run_id.n > 0 ? h.run_id.n + 1 : 0;
    const char *k = PyBytes_AS_STRING(key);
    if (PyBytes_GET_SIZE(key) != prefix + digits || memcmp(k + prefix, number, (size_t)digits) != 0 ||
        (prefix && (memcmp(k, h.run_id.s, (size_t)h.run_id.n) != 0 || k[prefix - 1] != '/')))
        Py_RETURN_NONE;

    PyObject *fields[7] = {NULL};
    PyObject *head = NULL;
    fields[0] = PyUnicode_DecodeUTF8(k, PyBytes_GET_SIZE(key), "strict");
    fields[1] = PyFloat_FromDouble(h.reward);
    if (h.rollout_kind == 1) fields[2] = PyLong_FromLongLong(h.rollout_int);
    else if (h.rollout_kind == 2)
        fields[2] = PyUnicode_DecodeUTF8((const char *)h.rollout_str.s, h.rollout_str.n, "strict");
    else fields[2] = Py_NewRef(Py_None);
    fields[3] = h.has_index ? PyLong_FromLongLong(h.index) : Py_NewRef(Py_None);
    fields[4] = h.has_group_size ? PyLong_FromLongLong(h.group_size) : Py_NewRef(Py_None);
    fields[5] = PyLong_FromLongLong(h.sibling_count);
    fields[6] = PyLong_FromLongLong(h.sibling_index);
    for (int f = 0; f < 7; f++) if (fields[f] == NULL) goto done;
    head = PyObject_Vectorcall(head_type, fields, 7, NULL);
done:
    for (int f = 0; f < 7; f++) Py_XDECREF(fields[f]);
    return head;
}

static PyObject *configure(PyObject *module, PyObject *args) {
    PyObject *type, *sizes, *floats = NULL, *ints = NULL;
    long long version;
    if (!PyArg_ParseTuple(args, "OO!L|O!O!", &type, &PyDict_Type, &sizes, &version, &PyDict_Type, &floats,
                          &PyDict_Type, &ints))
        return NULL;
    int8_t ints_table[256] = {0};
    PyObject *icode, *isize;
    Py_ssize_t ipos = 0;
    while (ints != NULL && PyDict_Next(ints, &ipos, &icode, &isize)) {
        long c = PyLong_AsLong(icode), s = PyLong_AsLong(isize);
        if (PyErr_Occurred()) return NULL;
        long width = s < 0 ? -s : s;
        if (c < -128 || c > 127 || (width != 1 && width != 2 && width != 4 && width != 8)) {
            PyErr_Format(PyExc_ValueError, "integer size %ld for ext code %ld is not 1, 2, 4 or 8", s, c);
            return NULL;
        }
        ints_table[(uint8_t)(int8_t)c] = (int8_t)s;
    }
    uint8_t floats_table[256] = {0};
    PyObject *fcode, *fsize;
    Py_ssize_t fpos = 0;
    while (floats != NULL && PyDict_Next(floats, &fpos, &fcode, &fsize)) {
        long c = PyLong_AsLong(fcode), s = PyLong_AsLong(fsize);
        if (PyErr_Occurred()) return NULL;
        if (c < -128 || c > 127 || (s != 4 && s != 8)) {
            PyErr_Format(PyExc_ValueError, "float size %ld for ext code %ld is not 4 or 8", s, c);
            return NULL;
        }
        floats_table[(uint8_t)(int8_t)c] = (uint8_t)s;
    }
    uint8_t table[256] = {0};
    PyObject *code, *size;
    Py_ssize_t pos = 0;
    while (PyDict_Next(sizes, &pos, &code, &size)) {
        long c = PyLong_AsLong(code), s = PyLong_AsLong(size);
        if (PyErr_Occurred()) return NULL;
        if (c < -128 || c > 127 || s < 1 || s > 255) {
            PyErr_Format(PyExc_ValueError, "item size %ld for ext code %ld is out of range", s, c);
            return NULL;
        }
        table[(uint8_t)(int8_t)c] = (uint8_t)s;
    }
    memcpy(item_size, table, sizeof table);
    memcpy(float_size, floats_table, sizeof floats_table);
    memcpy(int_size, ints_table, sizeof ints_table);
    max_schema_version = version;
    Py_XSETREF(head_type, Py_NewRef(type));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"plain_head", (PyCFunction)(void (*)(void))plain_head, METH_FASTCALL,
     "plain_head(value, key, default_group_size, max_group_size, max_sibling_count) -> PlainHead | None"},
    {"configure", configure, METH_VARARGS,
     "configure(head_type, item_sizes_by_ext_code, schema_version[, float_sizes_by_ext_code[, "
     "int_sizes_by_ext_code (negative: signed)]]): once, before plain_head"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "rollout_stream.core._plain_scan",
    "decode_head + plainly_valid of a rollout record in one pass over its bytes (core/_plain_scan.c)",
    -1, methods,
};

PyMODINIT_FUNC PyInit__plain_scan(void) {
    for (int f = 0; f < F_COUNT; f++) field_length[f] = (Py_ssize_t)strlen(FIELD_NAMES[f]);
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    PyObject *names = PyTuple_New(F_COUNT);
    if (names == NULL) { Py_DECREF(m); return NULL; }
    for (int f = 0; f < F_COUNT; f++) {
        PyObject *name = PyUnicode_FromString(FIELD_NAMES[f]);
        if (name == NULL) { Py_DECREF(names); Py_DECREF(m); return NULL; }
        PyTuple_SET_ITEM(names, f, name);
    }
    if (PyModule_AddObject(m, "FIELDS", names) < 0) { Py_DECREF(names); Py_DECREF(m); return NULL; }
    return m;
}
