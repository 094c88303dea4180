/*
 * strom.records._rowcodec: the per-row hot loops of the CompactedRow codec, in C.
 *
 * Python (strom/records/row_batches.py (and the callers of the kv and bucket loops)) owns every decision about types and fallbacks; this module
 * only moves bytes. It is byte-for-byte equivalent to the pure-Python codecs in
 * strom/records/compacted.py, kv_batch.py and bucketing.py, and whenever a value cannot be handled
 * exactly as Python would (an integer overflow, invalid UTF-8, a null where none is allowed, a
 * malformed row) it raises ValueError and the Python wrapper reruns the pure-Python path, so error
 * messages stay those of the reference implementation.
 *
 * Memory safety rules followed throughout:
 *   - every read from caller-supplied bytes is bounds-checked against the buffer's length first;
 *   - every buffer obtained with PyObject_GetBuffer is released on every path;
 *   - sequences are snapshotted into tuples, so no Python code can resize them under us;
 *   - no global mutable state: all state lives on the C stack or in objects we create.
 *
 * Wire formats (see compacted.py): varints are unsigned LEB128 of the 32/64-bit two's-complement
 * pattern (no zigzag); fixed-width numbers are little-endian.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Field kinds shared with row_batches.py (exported as module constants of the same names). */
enum {
    KIND_BOOLEAN = 1,
    KIND_TINYINT = 2,
    KIND_SMALLINT = 3,
    KIND_INT = 4,       /* INTEGER and DATE: varint32 */
    KIND_BIGINT = 5,
    KIND_FLOAT = 6,
    KIND_DOUBLE = 7,
    KIND_STRING = 8,    /* STRING, CHAR: length-prefixed UTF-8 */
    KIND_BYTES = 9,
    KIND_BINARY = 10,   /* BINARY(n), param n: length-prefixed, Arrow fixed_size_binary(n) */
    KIND_DECIMAL = 11,  /* DECIMAL(p <= 18), param p: varint64 unscaled, Arrow decimal128 */
    KIND_TIME = 12,     /* TIME(p), param p: varint32 millis of day */
    KIND_TIMESTAMP = 13,/* TIMESTAMP[_LTZ](p), param p: varint64 millis [+ varint32 nanos] */
    KIND_OPAQUE = 14,   /* any length-prefixed value Python handles: ARRAY, MAP, ROW, DECIMAL(p > 18) */
    KIND_MAX = 14
};

/* Arrow time units, derived from a TIME/TIMESTAMP precision exactly as types.time_unit does. */
enum { UNIT_S, UNIT_MS, UNIT_US, UNIT_NS };

static int
unit_of(int precision)
{
    if (precision == 0) return UNIT_S;
    if (precision <= 3) return UNIT_MS;
    if (precision <= 6) return UNIT_US;
    return UNIT_NS;
}

#define VARINT32_SIZE_MAX 5
#define VARINT64_SIZE_MAX 10
#define DECIMAL_COMPACT_PRECISION_MAX 18

static const int64_t POW10[DECIMAL_COMPACT_PRECISION_MAX + 1] = {
    1LL, 10LL, 100LL, 1000LL, 10000LL, 100000LL, 1000000LL, 10000000LL, 100000000LL,
    1000000000LL, 10000000000LL, 100000000000LL, 1000000000000LL, 10000000000000LL,
    100000000000000LL, 1000000000000000LL, 10000000000000000LL, 100000000000000000LL,
    1000000000000000000LL,
};

/* ------------------------------------------------------------------------------------------ */
/* Little-endian loads and stores (byte-wise, so they are correct on any host and alignment). */
/* ------------------------------------------------------------------------------------------ */

static inline uint16_t
load_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t
load_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t
load_le64(const uint8_t *p)
{
    return (uint64_t)load_le32(p) | ((uint64_t)load_le32(p + 4) << 32);
}

static inline void
store_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void
store_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline void
store_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/*
 * Python reads a FLOAT by widening it to a double and Arrow narrows it back, which turns a
 * signalling NaN into a quiet one (the hardware sets the quiet bit, payload kept). Do the same
 * explicitly so both paths produce the same bits.
 */
static inline uint32_t
quiet_float32_nan(uint32_t bits)
{
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) bits |= 0x00400000u;
    return bits;
}

/* ------------------------------------------------------------------------------------------ */
/* Checked integer arithmetic (C11 has no overflow builtins; keep it portable).                */
/* ------------------------------------------------------------------------------------------ */

/* Python's floor division for a positive divisor. */
static inline int64_t
floor_div(int64_t a, int64_t b)
{
    int64_t q = a / b;
    if (a % b != 0 && a < 0) q--;
    return q;
}

/* Python's modulo for a positive divisor (in [0, b)); never multiplies, so never overflows. */
static inline int32_t
floor_mod(int64_t a, int32_t b)
{
    int64_t r = a % b;
    return (int32_t)(r < 0 ? r + b : r);
}

/* *out = a * b for a positive constant b; returns 0 on overflow. */
static inline int
mul_ok(int64_t a, int64_t b, int64_t *out)
{
    if (a > INT64_MAX / b || a < INT64_MIN / b) return 0;
    *out = a * b;
    return 1;
}

static inline int
add_ok(int64_t a, int64_t b, int64_t *out)
{
    if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) return 0;
    *out = a + b;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* LEB128 varints                                                                              */
/* ------------------------------------------------------------------------------------------ */

enum { VARINT_OK = 0, VARINT_TRUNCATED = -1, VARINT_TOO_LONG = -2 };

/*
 * Reads an unsigned LEB128 of at most size_max bytes from p[*pos..n). Bits beyond 64 are dropped,
 * and callers truncate to 32 bits for varint32, as compacted.read_varint32 masks them.
 */
static inline int
read_uvarint(const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, int size_max, uint64_t *out)
{
    Py_ssize_t i = *pos;
    uint64_t result = 0;
    for (int k = 0; k < size_max; k++) {
        if (i >= n) return VARINT_TRUNCATED;
        uint8_t b = p[i++];
        result |= (uint64_t)(b & 0x7F) << (7 * k); /* 7 * k <= 63 */
        if (b < 0x80) {
            *pos = i;
            *out = result;
            return VARINT_OK;
        }
    }
    return VARINT_TOO_LONG;
}

static inline int
read_varint32(const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, int32_t *out)
{
    uint64_t raw;
    int rc = read_uvarint(p, n, pos, VARINT32_SIZE_MAX, &raw);
    if (rc == VARINT_OK) *out = (int32_t)(uint32_t)raw;
    return rc;
}

static inline int
read_varint64(const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, int64_t *out)
{
    uint64_t raw;
    int rc = read_uvarint(p, n, pos, VARINT64_SIZE_MAX, &raw);
    if (rc == VARINT_OK) *out = (int64_t)raw;
    return rc;
}

/* Writes the LEB128 of v into out (at least 10 bytes free); returns the byte count. */
static inline int
write_uvarint(uint8_t *out, uint64_t v)
{
    int i = 0;
    while (v >= 0x80) {
        out[i++] = (uint8_t)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    out[i++] = (uint8_t)v;
    return i;
}

/* ------------------------------------------------------------------------------------------ */
/* UTF-8 validation, as strict as Python's decoder (no overlongs, surrogates or > U+10FFFF).   */
/* Decoding falls back to Python (which substitutes U+FFFD) and encoding to Python (which     */
/* raises) on anything this rejects.                                                           */
/* ------------------------------------------------------------------------------------------ */

static int
utf8_valid(const uint8_t *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    while (i < n) {
        if (n - i >= 8) { /* ASCII fast path: 8 bytes with no high bit set */
            uint64_t word;
            memcpy(&word, s + i, 8);
            if ((word & 0x8080808080808080ULL) == 0) {
                i += 8;
                continue;
            }
        }
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        int trail;
        uint8_t lo = 0x80, hi = 0xBF; /* allowed range of the first continuation byte */
        if (c >= 0xC2 && c <= 0xDF) {
            trail = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            trail = 2;
            if (c == 0xE0) lo = 0xA0;  /* overlong */
            if (c == 0xED) hi = 0x9F;  /* UTF-16 surrogates */
        } else if (c >= 0xF0 && c <= 0xF4) {
            trail = 3;
            if (c == 0xF0) lo = 0x90;  /* overlong */
            if (c == 0xF4) hi = 0x8F;  /* beyond U+10FFFF */
        } else {
            return 0;
        }
        if (n - i <= trail) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= trail; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        }
        i += 1 + trail;
    }
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* Fluss bucketing: Flink's MurmurHash3_32 variant, then MathUtils.murmurHash (bucketing.py).  */
/* ------------------------------------------------------------------------------------------ */

#define MURMUR_C1 0xCC9E2D51u
#define MURMUR_C2 0x1B873593u
#define MURMUR_N 0xE6546B64u
#define FLUSS_MURMUR_SEED 42u

static inline uint32_t
rotl32(uint32_t v, int bits)
{
    return (v << bits) | (v >> (32 - bits));
}

static inline uint32_t
mix_k(uint32_t k)
{
    return rotl32(k * MURMUR_C1, 15) * MURMUR_C2;
}

static inline uint32_t
mix_h(uint32_t h, uint32_t k)
{
    return rotl32(h ^ k, 13) * 5u + MURMUR_N;
}

static inline uint32_t
fmix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    return h ^ (h >> 16);
}

/* bucketing.fluss_hash_bytes: tail bytes are mixed one at a time, not as a partial block. */
static uint32_t
fluss_hash_bytes(const uint8_t *data, Py_ssize_t n)
{
    uint32_t h = FLUSS_MURMUR_SEED;
    Py_ssize_t i = 0;
    for (; n - i >= 4; i += 4) h = mix_h(h, mix_k(load_le32(data + i)));
    for (; i < n; i++) h = mix_h(h, mix_k(data[i]));
    return fmix32(h ^ (uint32_t)n);
}

/* Bucket counts the C code accepts; larger ones (never seen in practice) stay in Python. */
#define BUCKET_COUNT_MAX INT32_MAX

/*
 * bucketing.bucket_for_key for key bytes already checked non-empty and a count in
 * [1, BUCKET_COUNT_MAX]. Both operands of the modulo fit 32 bits, and a 32-bit division is
 * markedly cheaper than a 64-bit one in this per-row loop.
 */
static long
fluss_bucket(const uint8_t *key, Py_ssize_t n, long bucket_count)
{
    uint32_t h = mix_h(0, mix_k(fluss_hash_bytes(key, n)));
    int32_t rehashed = (int32_t)fmix32(h ^ 4u);
    uint32_t non_negative = rehashed == INT32_MIN ? 0u : (uint32_t)(rehashed < 0 ? -rehashed : rehashed);
    return (long)(non_negative % (uint32_t)bucket_count);
}

/* ------------------------------------------------------------------------------------------ */
/* Byte access to caller objects                                                              */
/* ------------------------------------------------------------------------------------------ */

/*
 * A read-only view of a bytes-like object. bytes are read in place (the common case, no buffer
 * export); anything else goes through the buffer protocol and must be released.
 */
typedef struct {
    const uint8_t *ptr;
    Py_ssize_t len;
    Py_buffer view; /* view.obj != NULL when a buffer export must be released */
} ByteView;

static int
byteview_get(PyObject *obj, ByteView *bv)
{
    bv->view.obj = NULL;
    if (PyBytes_CheckExact(obj)) {
        bv->ptr = (const uint8_t *)PyBytes_AS_STRING(obj);
        bv->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &bv->view, PyBUF_SIMPLE) < 0) return -1;
    bv->ptr = (const uint8_t *)bv->view.buf;
    bv->len = bv->view.len;
    return 0;
}

static void
byteview_release(ByteView *bv)
{
    if (bv->view.obj != NULL) PyBuffer_Release(&bv->view);
}

/* A growable scratch buffer on the C heap (used for one encoded row or key at a time). */
typedef struct {
    uint8_t *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Scratch;

static int
scratch_reserve(Scratch *s, Py_ssize_t extra)
{
    if (extra > PY_SSIZE_T_MAX - s->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = s->len + extra;
    if (need <= s->cap) return 0;
    Py_ssize_t cap = s->cap < 64 ? 64 : s->cap;
    while (cap < need) cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    uint8_t *grown = PyMem_Realloc(s->data, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->data = grown;
    s->cap = cap;
    return 0;
}

static int
scratch_append(Scratch *s, const uint8_t *bytes, Py_ssize_t n)
{
    if (scratch_reserve(s, n) < 0) return -1;
    if (n > 0) memcpy(s->data + s->len, bytes, (size_t)n);
    s->len += n;
    return 0;
}

/* Appends a varint; the caller has reserved VARINT64_SIZE_MAX bytes. */
static inline void
scratch_put_uvarint(Scratch *s, uint64_t v)
{
    s->len += write_uvarint(s->data + s->len, v);
}

/* A bytearray we fill in place and hand to pyarrow (zero copy via pa.py_buffer). */
static PyObject *
zeroed_bytearray(Py_ssize_t size)
{
    PyObject *ba = PyByteArray_FromStringAndSize(NULL, size);
    if (ba != NULL && size > 0) memset(PyByteArray_AS_STRING(ba), 0, (size_t)size);
    return ba;
}

static int
checked_mul_size(Py_ssize_t a, Py_ssize_t b, Py_ssize_t *out)
{
    if (a < 0 || b < 0 || (b != 0 && a > PY_SSIZE_T_MAX / b)) {
        PyErr_NoMemory();
        return -1;
    }
    *out = a * b;
    return 0;
}

/* Reads a small non-negative int from a Python object, with a range check. */
static int
int_in_range(PyObject *obj, long lo, long hi, const char *what, long *out)
{
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (v < lo || v > hi) {
        PyErr_Format(PyExc_ValueError, "%s %ld out of range [%ld, %ld]", what, v, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* ========================================================================================== */
/* 1. KvRecordBatch records (kv_batch._parse_records), same checks and messages.              */
/* ========================================================================================== */

static PyObject *
parse_kv_records(PyObject *module, PyObject *args)
{
    PyObject *buffer_obj;
    Py_ssize_t position, end, count;
    if (!PyArg_ParseTuple(args, "Onnn:parse_kv_records", &buffer_obj, &position, &end, &count)) return NULL;

    ByteView bv;
    if (byteview_get(buffer_obj, &bv) < 0) return NULL;
    PyObject *keys = NULL, *values = NULL, *result = NULL;
    if (position < 0 || end < position || end > bv.len) {
        PyErr_SetString(PyExc_ValueError, "kv records range lies outside the buffer");
        goto done;
    }
    /*
     * Every record takes at least 5 bytes (size + a key-length byte), so a count beyond that cannot
     * parse; cap the preallocation so a hostile count cannot make us allocate gigabytes.
     */
    Py_ssize_t capacity = count < (end - position) / 5 ? count : (end - position) / 5;
    if (capacity < 0) capacity = 0; /* a negative count parses no records, as range(count) does */
    keys = PyList_New(capacity);
    values = PyList_New(capacity);
    if (keys == NULL || values == NULL) goto done;
    const uint8_t *p = bv.ptr;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - position < 4) {
            PyErr_SetString(PyExc_ValueError, "truncated kv record size");
            goto done;
        }
        int32_t size = (int32_t)load_le32(p + position);
        Py_ssize_t record_start = position + 4;
        if (size < 1 || size > end - record_start) {
            PyErr_Format(PyExc_ValueError, "kv record of %d bytes overruns its batch", (int)size);
            goto done;
        }
        Py_ssize_t record_end = record_start + size;
        /* Unsigned varint key length of at most 5 bytes; like Python, bits are not masked. */
        uint64_t key_length = 0;
        Py_ssize_t cursor = record_start;
        for (int shift = 0;; shift += 7) {
            if (cursor >= record_end || shift > 28) {
                PyErr_SetString(PyExc_ValueError, "malformed kv record key length");
                goto done;
            }
            uint8_t b = p[cursor++];
            key_length |= (uint64_t)(b & 0x7F) << shift;
            if (b < 0x80) break;
        }
        if (key_length > (uint64_t)(record_end - cursor)) {
            PyErr_Format(PyExc_ValueError, "kv record key of %llu bytes overruns its record",
                         (unsigned long long)key_length);
            goto done;
        }
        if (i >= capacity) { /* unreachable by the size argument above; never write past the list */
            PyErr_SetString(PyExc_SystemError, "kv record count exceeds its bound");
            goto done;
        }
        Py_ssize_t key_end = cursor + (Py_ssize_t)key_length;
        PyObject *key = PyBytes_FromStringAndSize((const char *)p + cursor, key_end - cursor);
        if (key == NULL) goto done;
        PyList_SET_ITEM(keys, i, key);
        PyObject *value;
        if (key_end < record_end) {
            value = PyBytes_FromStringAndSize((const char *)p + key_end, record_end - key_end);
            if (value == NULL) goto done;
        } else {
            value = Py_NewRef(Py_None);
        }
        PyList_SET_ITEM(values, i, value);
        position = record_end;
    }
    if (position != end) {
        PyErr_Format(PyExc_ValueError, "kv batch has %zd trailing bytes after %zd records", end - position, count);
        goto done;
    }
    result = PyTuple_Pack(2, keys, values);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    byteview_release(&bv);
    return result;
}

/* build_kv_records(keys, values) -> bytes: the records of a KvRecordBatch body (kv_batch.py's
 * _kv_records_python): per record an int32 LE length, the key length as a varint, the key, and the
 * value unless it is None or empty (a delete). Keys and values must be bytes. */
static PyObject *
build_kv_records(PyObject *module, PyObject *args)
{
    PyObject *keys_arg, *values_arg;
    if (!PyArg_ParseTuple(args, "OO", &keys_arg, &values_arg)) return NULL;
    PyObject *keys = PySequence_Tuple(keys_arg);
    if (keys == NULL) return NULL;
    PyObject *values = PySequence_Tuple(values_arg);
    PyObject *result = NULL;
    if (values == NULL) goto done;
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    if (PyTuple_GET_SIZE(values) != count) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i), *value = PyTuple_GET_ITEM(values, i);
        if (!PyBytes_Check(key) || (value != Py_None && !PyBytes_Check(value))) {
            PyErr_SetString(PyExc_TypeError, "kv record keys and values must be bytes (a value may be None)");
            goto done;
        }
        Py_ssize_t size = 5 + PyBytes_GET_SIZE(key) + (value == Py_None ? 0 : PyBytes_GET_SIZE(value));
        if (size - 5 > INT32_MAX - 5 || total > PY_SSIZE_T_MAX - 4 - size) {
            PyErr_SetString(PyExc_ValueError, "a kv record is too large");
            goto done;
        }
        total += 4 + size;  /* an upper bound: the varint takes at most 5 bytes */
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    Py_ssize_t position = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i), *value = PyTuple_GET_ITEM(values, i);
        Py_ssize_t key_size = PyBytes_GET_SIZE(key);
        Py_ssize_t value_size = value == Py_None ? 0 : PyBytes_GET_SIZE(value);
        uint8_t prefix[10];
        int prefix_size = write_uvarint(prefix, (uint64_t)key_size);
        uint32_t length = (uint32_t)(prefix_size + key_size + value_size);
        out[position] = (uint8_t)length;
        out[position + 1] = (uint8_t)(length >> 8);
        out[position + 2] = (uint8_t)(length >> 16);
        out[position + 3] = (uint8_t)(length >> 24);
        position += 4;
        memcpy(out + position, prefix, (size_t)prefix_size);
        position += prefix_size;
        memcpy(out + position, PyBytes_AS_STRING(key), (size_t)key_size);
        position += key_size;
        if (value_size) {
            memcpy(out + position, PyBytes_AS_STRING(value), (size_t)value_size);
            position += value_size;
        }
    }
    if (_PyBytes_Resize(&result, position) < 0) result = NULL;  /* frees result on failure */
done:
    Py_DECREF(keys);
    Py_XDECREF(values);
    return result;
}

/* ========================================================================================== */
/* Field specs: (kind, param, nullable) tuples built by row_batches.py                           */
/* ========================================================================================== */

typedef struct {
    int kind;
    int param;    /* BINARY length, DECIMAL precision, TIME/TIMESTAMP precision, else 0 */
    int nullable; /* NOT NULL fields ignore their null bit when decoding, like compacted.py */
} FieldSpec;

static int
parse_spec(PyObject *item, FieldSpec *spec)
{
    PyObject *kind_obj, *param_obj, *nullable_obj;
    long kind, param;
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) < 3) {
        PyErr_SetString(PyExc_TypeError, "field spec must be a (kind, param, nullable, ...) tuple");
        return -1;
    }
    kind_obj = PyTuple_GET_ITEM(item, 0);
    param_obj = PyTuple_GET_ITEM(item, 1);
    nullable_obj = PyTuple_GET_ITEM(item, 2);
    if (int_in_range(kind_obj, 1, KIND_MAX, "field kind", &kind) < 0) return -1;
    if (int_in_range(param_obj, 0, INT32_MAX, "field parameter", &param) < 0) return -1;
    int nullable = PyObject_IsTrue(nullable_obj);
    if (nullable < 0) return -1;
    if ((kind == KIND_TIME || kind == KIND_TIMESTAMP) && param > 9) {
        PyErr_Format(PyExc_ValueError, "time precision %ld out of range", param);
        return -1;
    }
    if (kind == KIND_DECIMAL && (param < 1 || param > DECIMAL_COMPACT_PRECISION_MAX)) {
        PyErr_Format(PyExc_ValueError, "compact decimal precision %ld out of range", param);
        return -1;
    }
    if (kind == KIND_BINARY && param < 1) {
        PyErr_SetString(PyExc_ValueError, "BINARY length must be positive");
        return -1;
    }
    spec->kind = (int)kind;
    spec->param = (int)param;
    spec->nullable = nullable;
    return 0;
}

/* Bytes per value in the Arrow layout of a fixed-width kind (0 for the others). */
static Py_ssize_t
arrow_width(const FieldSpec *spec)
{
    switch (spec->kind) {
    case KIND_TINYINT: return 1;
    case KIND_SMALLINT: return 2;
    case KIND_INT: return 4;
    case KIND_BIGINT: return 8;
    case KIND_FLOAT: return 4;
    case KIND_DOUBLE: return 8;
    case KIND_BINARY: return spec->param;
    case KIND_DECIMAL: return 16;
    case KIND_TIME: return unit_of(spec->param) <= UNIT_MS ? 4 : 8; /* time32 or time64 */
    case KIND_TIMESTAMP: return 8;
    default: return 0;
    }
}

/* ========================================================================================== */
/* 2. Columnar decode: CompactedRows -> Arrow buffers, one set per field.                      */
/* ========================================================================================== */

typedef struct {
    FieldSpec spec;
    Py_ssize_t width;      /* fixed-width kinds: bytes per value */
    PyObject *validity;    /* bytearray bitmap for nullable fields, else NULL */
    PyObject *data;        /* bytearray: values, bitmap (BOOLEAN) or string bytes */
    Py_ssize_t data_len;   /* var-width kinds: bytes used in data (its size is the capacity) */
    PyObject *offsets;     /* bytearray of int32, var-width kinds */
    PyObject *positions;   /* list, KIND_OPAQUE: absolute position of each value, or None */
    Py_ssize_t null_count;
} DecodeColumn;

static int
is_var_width(int kind)
{
    return kind == KIND_STRING || kind == KIND_BYTES;
}

static void
decode_columns_free(DecodeColumn *cols, Py_ssize_t count)
{
    if (cols == NULL) return;
    for (Py_ssize_t f = 0; f < count; f++) {
        Py_XDECREF(cols[f].validity);
        Py_XDECREF(cols[f].data);
        Py_XDECREF(cols[f].offsets);
        Py_XDECREF(cols[f].positions);
    }
    PyMem_Free(cols);
}

/* Allocates the output buffers of one column for n rows. */
static int
decode_column_init(DecodeColumn *col, Py_ssize_t n)
{
    if (col->spec.nullable && (col->validity = zeroed_bytearray((n + 7) / 8)) == NULL) return -1;
    switch (col->spec.kind) {
    case KIND_OPAQUE:
        col->positions = PyList_New(n);
        return col->positions == NULL ? -1 : 0;
    case KIND_BOOLEAN:
        col->data = zeroed_bytearray((n + 7) / 8);
        return col->data == NULL ? -1 : 0;
    case KIND_STRING:
    case KIND_BYTES: {
        Py_ssize_t size;
        if (checked_mul_size(n + 1, 4, &size) < 0) return -1;
        if ((col->offsets = zeroed_bytearray(size)) == NULL) return -1;
        /* A guess of 16 bytes a value, at most 1 MiB up front; grows by doubling. */
        Py_ssize_t cap = n < (1 << 20) / 16 ? n * 16 : (1 << 20);
        col->data = zeroed_bytearray(cap < 64 ? 64 : cap);
        return col->data == NULL ? -1 : 0;
    }
    default: {
        Py_ssize_t size;
        col->width = arrow_width(&col->spec);
        if (checked_mul_size(n, col->width, &size) < 0) return -1;
        col->data = zeroed_bytearray(size);
        return col->data == NULL ? -1 : 0;
    }
    }
}

/* Makes room for extra more bytes of string data (doubling the bytearray). */
static int
decode_column_reserve(DecodeColumn *col, Py_ssize_t extra)
{
    Py_ssize_t cap = PyByteArray_GET_SIZE(col->data);
    if (extra <= cap - col->data_len) return 0;
    if (extra > PY_SSIZE_T_MAX / 2 - col->data_len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = col->data_len + extra;
    while (cap < need) cap *= 2;
    return PyByteArray_Resize(col->data, cap);
}

static inline void
set_bit(PyObject *bitmap, Py_ssize_t i)
{
    ((uint8_t *)PyByteArray_AS_STRING(bitmap))[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* Raises the ValueError that sends a batch back to the Python path; names the row and field. */
static int
decode_error(Py_ssize_t row, Py_ssize_t field, const char *what)
{
    PyErr_Format(PyExc_ValueError, "CompactedRow %zd, field %zd: %s", row, field, what);
    return -1;
}

static int
varint_error(int rc, Py_ssize_t row, Py_ssize_t field)
{
    return decode_error(row, field, rc == VARINT_TRUNCATED ? "truncated varint" : "varint too long");
}

/* A length-prefixed payload: sets *start and advances *pos past it, checking the row's end. */
static int
read_sized(const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, Py_ssize_t *start, Py_ssize_t row, Py_ssize_t field)
{
    int32_t size;
    int rc = read_varint32(p, n, pos, &size);
    if (rc != VARINT_OK) return varint_error(rc, row, field);
    if (size < 0) return decode_error(row, field, "negative length");
    if (size > n - *pos) return decode_error(row, field, "length overruns the row");
    *start = *pos;
    *pos += size;
    return 0;
}

/*
 * *out = millis * k + q exactly, or 0 if that leaves int64. The product alone may overflow when the
 * sum does not: the earliest microsecond, INT64_MIN, is millis * 1000 + 808 with millis * 1000 below
 * INT64_MIN. Moving one k from the product into q covers every q in [0, k], i.e. every valid
 * nano-of-milli; anything else that overflows goes back to Python.
 */
static int
scaled_add(int64_t millis, int64_t k, int64_t q, int64_t *out)
{
    int64_t scaled;
    if (mul_ok(millis, k, &scaled)) return add_ok(scaled, q, out);
    if (millis < 0 && q > 0 && mul_ok(millis + 1, k, &scaled)) return add_ok(scaled, q - k, out);
    return 0;
}

/* Millis (+ nano-of-milli) to the Arrow unit of the precision, as types.timestamp_from_parts. */
static int
timestamp_value(int64_t millis, int32_t nano_of_milli, int unit, int64_t *out)
{
    switch (unit) {
    case UNIT_S: *out = millis / 1000; return 1; /* truncates toward zero, like Fluss */
    case UNIT_MS: *out = millis; return 1;
    case UNIT_US: return scaled_add(millis, 1000, floor_div(nano_of_milli, 1000), out);
    default: return scaled_add(millis, 1000000, nano_of_milli, out);
    }
}

/*
 * Decodes one non-null field of row `row` at *pos into column col. `base` is the row's offset in
 * its buffer (the skipped schema-id prefix), so positions handed to Python are absolute.
 */
static int
decode_value(DecodeColumn *col, const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, Py_ssize_t row,
             Py_ssize_t field, Py_ssize_t base)
{
    uint8_t *out = col->data != NULL ? (uint8_t *)PyByteArray_AS_STRING(col->data) : NULL;
    int rc;
    switch (col->spec.kind) {
    case KIND_BOOLEAN:
        if (*pos >= n) return decode_error(row, field, "truncated BOOLEAN");
        if (p[(*pos)++] != 0) set_bit(col->data, row);
        return 0;
    case KIND_TINYINT:
        if (*pos >= n) return decode_error(row, field, "truncated TINYINT");
        out[row] = p[(*pos)++];
        return 0;
    case KIND_SMALLINT:
        if (n - *pos < 2) return decode_error(row, field, "truncated SMALLINT");
        store_le16(out + row * 2, load_le16(p + *pos));
        *pos += 2;
        return 0;
    case KIND_FLOAT:
        if (n - *pos < 4) return decode_error(row, field, "truncated FLOAT");
        store_le32(out + row * 4, quiet_float32_nan(load_le32(p + *pos)));
        *pos += 4;
        return 0;
    case KIND_DOUBLE:
        if (n - *pos < 8) return decode_error(row, field, "truncated DOUBLE");
        memcpy(out + row * 8, p + *pos, 8);
        *pos += 8;
        return 0;
    case KIND_INT: {
        int32_t v;
        if ((rc = read_varint32(p, n, pos, &v)) != VARINT_OK) return varint_error(rc, row, field);
        store_le32(out + row * 4, (uint32_t)v);
        return 0;
    }
    case KIND_BIGINT: {
        int64_t v;
        if ((rc = read_varint64(p, n, pos, &v)) != VARINT_OK) return varint_error(rc, row, field);
        store_le64(out + row * 8, (uint64_t)v);
        return 0;
    }
    case KIND_DECIMAL: {
        int64_t v;
        int64_t bound = POW10[col->spec.param];
        if ((rc = read_varint64(p, n, pos, &v)) != VARINT_OK) return varint_error(rc, row, field);
        if (v <= -bound || v >= bound) return decode_error(row, field, "unscaled DECIMAL exceeds its precision");
        store_le64(out + row * 16, (uint64_t)v);
        store_le64(out + row * 16 + 8, v < 0 ? UINT64_MAX : 0); /* sign extension to 128 bits */
        return 0;
    }
    case KIND_TIME: {
        int32_t millis;
        if ((rc = read_varint32(p, n, pos, &millis)) != VARINT_OK) return varint_error(rc, row, field);
        switch (unit_of(col->spec.param)) { /* types.time_from_millis */
        case UNIT_S: store_le32(out + row * 4, (uint32_t)(millis / 1000)); break;
        case UNIT_MS: store_le32(out + row * 4, (uint32_t)millis); break;
        case UNIT_US: store_le64(out + row * 8, (uint64_t)((int64_t)millis * 1000)); break;
        default: store_le64(out + row * 8, (uint64_t)((int64_t)millis * 1000000)); break;
        }
        return 0;
    }
    case KIND_TIMESTAMP: {
        int64_t millis, value;
        int32_t nano_of_milli = 0;
        if ((rc = read_varint64(p, n, pos, &millis)) != VARINT_OK) return varint_error(rc, row, field);
        if (col->spec.param > 3 && (rc = read_varint32(p, n, pos, &nano_of_milli)) != VARINT_OK)
            return varint_error(rc, row, field);
        if (!timestamp_value(millis, nano_of_milli, unit_of(col->spec.param), &value))
            return decode_error(row, field, "TIMESTAMP out of the 64-bit range of its unit");
        store_le64(out + row * 8, (uint64_t)value);
        return 0;
    }
    case KIND_BINARY: { /* fixed_size_binary(n): cut long values, zero-pad short ones */
        Py_ssize_t start;
        if (read_sized(p, n, pos, &start, row, field) < 0) return -1;
        Py_ssize_t len = *pos - start, width = col->width;
        memcpy(out + row * width, p + start, (size_t)(len < width ? len : width));
        return 0;
    }
    case KIND_STRING:
    case KIND_BYTES: {
        Py_ssize_t start;
        if (read_sized(p, n, pos, &start, row, field) < 0) return -1;
        Py_ssize_t len = *pos - start;
        if (col->spec.kind == KIND_STRING && !utf8_valid(p + start, len))
            return decode_error(row, field, "invalid UTF-8");
        if (len > INT32_MAX - col->data_len) return decode_error(row, field, "column exceeds 2 GiB of data");
        if (decode_column_reserve(col, len) < 0) return -1;
        memcpy(PyByteArray_AS_STRING(col->data) + col->data_len, p + start, (size_t)len);
        col->data_len += len;
        return 0;
    }
    case KIND_OPAQUE: {
        Py_ssize_t start;
        PyObject *position = PyLong_FromSsize_t(base + *pos);
        if (position == NULL) return -1;
        PyList_SET_ITEM(col->positions, row, position);
        return read_sized(p, n, pos, &start, row, field);
    }
    default:
        PyErr_SetString(PyExc_SystemError, "unknown field kind");
        return -1;
    }
}

/* Records a null in column col at row `row` (validity bits and data stay zero). */
static void
decode_null(DecodeColumn *col, Py_ssize_t row)
{
    col->null_count++;
    if (col->spec.kind == KIND_OPAQUE) PyList_SET_ITEM(col->positions, row, Py_NewRef(Py_None));
}

/* Decodes every field of one row (p[0..n) starts at its null bitset). */
static int
decode_row(DecodeColumn *cols, Py_ssize_t field_count, const uint8_t *p, Py_ssize_t n, Py_ssize_t row,
           Py_ssize_t base)
{
    Py_ssize_t pos = (field_count + 7) / 8;
    if (n < pos) return decode_error(row, 0, "row shorter than its null bitset");
    for (Py_ssize_t f = 0; f < field_count; f++) {
        DecodeColumn *col = &cols[f];
        if (col->spec.nullable && (p[f >> 3] >> (f & 7)) & 1) {
            decode_null(col, row);
        } else {
            if (col->validity != NULL) set_bit(col->validity, row);
            if (decode_value(col, p, n, &pos, row, f, base) < 0) return -1;
        }
        if (col->offsets != NULL)
            store_le32((uint8_t *)PyByteArray_AS_STRING(col->offsets) + (row + 1) * 4, (uint32_t)col->data_len);
    }
    return 0;
}

/* The Python result for one decoded column; see decode_columns' docstring. */
static PyObject *
decode_column_result(DecodeColumn *col)
{
    PyObject *validity = col->null_count > 0 ? col->validity : Py_None;
    if (col->spec.kind == KIND_OPAQUE) return Py_BuildValue("(OnO)", validity, col->null_count, col->positions);
    if (is_var_width(col->spec.kind)) {
        if (PyByteArray_Resize(col->data, col->data_len) < 0) return NULL;
        return Py_BuildValue("(OnOO)", validity, col->null_count, col->offsets, col->data);
    }
    return Py_BuildValue("(OnO)", validity, col->null_count, col->data);
}

static PyObject *
decode_columns(PyObject *module, PyObject *args)
{
    PyObject *rows_obj, *specs_obj;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "OnO!:decode_columns", &rows_obj, &offset, &PyTuple_Type, &specs_obj)) return NULL;
    if (offset < 0) {
        PyErr_SetString(PyExc_ValueError, "offset must be non-negative");
        return NULL;
    }
    PyObject *rows = PySequence_Tuple(rows_obj);
    if (rows == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(rows);
    Py_ssize_t field_count = PyTuple_GET_SIZE(specs_obj);
    PyObject *result = NULL;
    DecodeColumn *cols = PyMem_Calloc(field_count > 0 ? (size_t)field_count : 1, sizeof(DecodeColumn));
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t f = 0; f < field_count; f++) {
        if (parse_spec(PyTuple_GET_ITEM(specs_obj, f), &cols[f].spec) < 0) goto done;
        if (decode_column_init(&cols[f], n) < 0) goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        ByteView bv;
        if (byteview_get(PyTuple_GET_ITEM(rows, i), &bv) < 0) goto done;
        int rc;
        if (bv.len < offset) {
            rc = decode_error(i, 0, "row shorter than its prefix");
        } else {
            rc = decode_row(cols, field_count, bv.ptr + offset, bv.len - offset, i, offset);
        }
        byteview_release(&bv);
        if (rc < 0) goto done;
    }
    result = PyList_New(field_count);
    if (result == NULL) goto done;
    for (Py_ssize_t f = 0; f < field_count; f++) {
        PyObject *column = decode_column_result(&cols[f]);
        if (column == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, f, column);
    }
done:
    decode_columns_free(cols, field_count);
    Py_DECREF(rows);
    return result;
}

/* ========================================================================================== */
/* 3. Columnar encode: Arrow buffers -> CompactedRows, keys and buckets.                       */
/* ========================================================================================== */

typedef struct {
    FieldSpec spec;
    Py_ssize_t width;    /* fixed-width kinds: bytes per Arrow value */
    Py_ssize_t offset;   /* the Arrow array's offset, in values */
    ByteView validity;   /* ptr NULL when every value is valid */
    ByteView data;
    ByteView offsets;    /* int32, var-width kinds */
    PyObject *values;    /* KIND_OPAQUE: tuple of field encodings (bytes) or None */
} EncodeColumn;

static void
encode_columns_free(EncodeColumn *cols, Py_ssize_t count)
{
    if (cols == NULL) return;
    for (Py_ssize_t f = 0; f < count; f++) {
        byteview_release(&cols[f].validity);
        byteview_release(&cols[f].data);
        byteview_release(&cols[f].offsets);
        Py_XDECREF(cols[f].values);
    }
    PyMem_Free(cols);
}

/* Where an absent data buffer points, so that `ptr + 0` is never arithmetic on NULL. */
static const uint8_t EMPTY_BUFFER[1] = {0};

/* A byte view of an optional buffer; None gives ptr NULL and length 0. */
static int
optional_view(PyObject *obj, ByteView *bv)
{
    if (obj == Py_None) {
        bv->ptr = NULL;
        bv->len = 0;
        bv->view.obj = NULL;
        return 0;
    }
    return byteview_get(obj, bv);
}

static int
short_buffer(const char *what, Py_ssize_t field)
{
    PyErr_Format(PyExc_ValueError, "Arrow %s buffer of field %zd is too short for the array", what, field);
    return -1;
}

/*
 * Parses one column description (kind, param, nullable, validity, offset, data, offsets) and checks
 * that every buffer covers the values the array claims, so the row loop can index without checks
 * (string offsets are still checked per value: they are data, not layout).
 */
static int
encode_column_init(EncodeColumn *col, PyObject *item, Py_ssize_t n, Py_ssize_t field)
{
    if (parse_spec(item, &col->spec) < 0) return -1;
    if (PyTuple_GET_SIZE(item) != 7) {
        PyErr_SetString(PyExc_TypeError, "column must be (kind, param, nullable, validity, offset, data, offsets)");
        return -1;
    }
    col->offset = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 4));
    if (col->offset == -1 && PyErr_Occurred()) return -1;
    if (col->offset < 0 || col->offset > PY_SSIZE_T_MAX - n - 8) {
        PyErr_SetString(PyExc_ValueError, "bad Arrow array offset");
        return -1;
    }
    Py_ssize_t end = col->offset + n; /* one past the last value index */
    if (col->spec.kind == KIND_OPAQUE) {
        col->values = PySequence_Tuple(PyTuple_GET_ITEM(item, 5));
        if (col->values == NULL) return -1;
        if (PyTuple_GET_SIZE(col->values) != end) {
            PyErr_SetString(PyExc_ValueError, "opaque column length differs from the row count");
            return -1;
        }
        return 0;
    }
    if (optional_view(PyTuple_GET_ITEM(item, 3), &col->validity) < 0) return -1;
    if (col->validity.ptr != NULL && col->validity.len < (end + 7) / 8) return short_buffer("validity", field);
    if (optional_view(PyTuple_GET_ITEM(item, 5), &col->data) < 0) return -1;
    if (optional_view(PyTuple_GET_ITEM(item, 6), &col->offsets) < 0) return -1;
    if (col->data.ptr == NULL) col->data.ptr = EMPTY_BUFFER; /* e.g. an all-empty string array */
    Py_ssize_t needed;
    switch (col->spec.kind) {
    case KIND_BOOLEAN:
        needed = (end + 7) / 8;
        break;
    case KIND_STRING:
    case KIND_BYTES:
        if (checked_mul_size(end + 1, 4, &needed) < 0) return -1;
        if (col->offsets.len < needed) return short_buffer("offsets", field);
        return 0;
    default:
        col->width = arrow_width(&col->spec);
        if (checked_mul_size(end, col->width, &needed) < 0) return -1;
        break;
    }
    if (col->data.len < needed) return short_buffer("data", field);
    return 0;
}

static int
encode_error(Py_ssize_t row, Py_ssize_t field, const char *what)
{
    PyErr_Format(PyExc_ValueError, "row %zd, field %zd: %s", row, field, what);
    return -1;
}

/* Appends a length-prefixed payload. */
static int
put_sized(Scratch *s, const uint8_t *bytes, Py_ssize_t len, Py_ssize_t row, Py_ssize_t field)
{
    if (len > INT32_MAX) return encode_error(row, field, "value longer than 2 GiB");
    if (scratch_reserve(s, VARINT32_SIZE_MAX + len) < 0) return -1;
    scratch_put_uvarint(s, (uint32_t)len);
    if (len > 0) memcpy(s->data + s->len, bytes, (size_t)len);
    s->len += len;
    return 0;
}

/* Millis of day for a TIME value in its Arrow unit (types.time_to_millis), checked to fit i32. */
static int
time_millis(int64_t value, int unit, int32_t *out)
{
    int64_t millis;
    switch (unit) {
    case UNIT_S:
        if (!mul_ok(value, 1000, &millis)) return 0;
        break;
    case UNIT_MS: millis = value; break;
    case UNIT_US: millis = floor_div(value, 1000); break;
    default: millis = floor_div(value, 1000000); break;
    }
    if (millis < INT32_MIN || millis > INT32_MAX) return 0;
    *out = (int32_t)millis;
    return 1;
}

/* Appends the encoding of the non-null value at Arrow index j of column col. */
static int
encode_value(EncodeColumn *col, Scratch *s, Py_ssize_t j, Py_ssize_t row, Py_ssize_t field)
{
    const uint8_t *d = col->data.ptr;
    if (scratch_reserve(s, 16) < 0) return -1; /* room for any fixed-width encoding or varints */
    uint8_t *out = s->data + s->len;
    switch (col->spec.kind) {
    case KIND_BOOLEAN:
        out[0] = (d[j >> 3] >> (j & 7)) & 1;
        s->len += 1;
        return 0;
    case KIND_TINYINT:
        out[0] = d[j];
        s->len += 1;
        return 0;
    case KIND_SMALLINT:
        memcpy(out, d + j * 2, 2); /* Arrow buffers are little-endian on every supported host */
        s->len += 2;
        return 0;
    case KIND_FLOAT:
        store_le32(out, quiet_float32_nan(load_le32(d + j * 4)));
        s->len += 4;
        return 0;
    case KIND_DOUBLE:
        memcpy(out, d + j * 8, 8);
        s->len += 8;
        return 0;
    case KIND_INT:
        scratch_put_uvarint(s, load_le32(d + j * 4));
        return 0;
    case KIND_BIGINT:
        scratch_put_uvarint(s, load_le64(d + j * 8));
        return 0;
    case KIND_DECIMAL: {
        uint64_t low = load_le64(d + j * 16);
        uint64_t high = load_le64(d + j * 16 + 8);
        int64_t v = (int64_t)low;
        int64_t bound = POW10[col->spec.param];
        if (high != (v < 0 ? UINT64_MAX : 0) || v <= -bound || v >= bound)
            return encode_error(row, field, "DECIMAL does not fit its precision");
        scratch_put_uvarint(s, low);
        return 0;
    }
    case KIND_TIME: {
        int unit = unit_of(col->spec.param);
        int64_t value = unit <= UNIT_MS ? (int64_t)(int32_t)load_le32(d + j * 4) : (int64_t)load_le64(d + j * 8);
        int32_t millis;
        if (!time_millis(value, unit, &millis)) return encode_error(row, field, "TIME does not fit 32-bit millis");
        scratch_put_uvarint(s, (uint32_t)millis);
        return 0;
    }
    case KIND_TIMESTAMP: { /* types.timestamp_to_parts */
        int64_t value = (int64_t)load_le64(d + j * 8), millis;
        int32_t nano_of_milli = 0;
        switch (unit_of(col->spec.param)) {
        case UNIT_S:
            if (!mul_ok(value, 1000, &millis)) return encode_error(row, field, "TIMESTAMP overflows 64-bit millis");
            break;
        case UNIT_MS: millis = value; break;
        case UNIT_US:
            millis = floor_div(value, 1000);
            nano_of_milli = floor_mod(value, 1000) * 1000;
            break;
        default:
            millis = floor_div(value, 1000000);
            nano_of_milli = floor_mod(value, 1000000);
            break;
        }
        scratch_put_uvarint(s, (uint64_t)millis);
        if (col->spec.param > 3) scratch_put_uvarint(s, (uint32_t)nano_of_milli);
        return 0;
    }
    case KIND_BINARY:
        return put_sized(s, d + j * col->width, col->width, row, field);
    case KIND_STRING:
    case KIND_BYTES: {
        int32_t start = (int32_t)load_le32(col->offsets.ptr + j * 4);
        int32_t end = (int32_t)load_le32(col->offsets.ptr + (j + 1) * 4);
        if (start < 0 || end < start || end > col->data.len)
            return encode_error(row, field, "Arrow offsets outside the data buffer");
        if (col->spec.kind == KIND_STRING && !utf8_valid(d + start, end - start))
            return encode_error(row, field, "invalid UTF-8");
        return put_sized(s, d + start, end - start, row, field);
    }
    case KIND_OPAQUE: {
        PyObject *value = PyTuple_GET_ITEM(col->values, j);
        if (!PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "opaque field encodings must be bytes");
            return -1;
        }
        return scratch_append(s, (const uint8_t *)PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value));
    }
    default:
        PyErr_SetString(PyExc_SystemError, "unknown field kind");
        return -1;
    }
}

static int
encode_is_null(const EncodeColumn *col, Py_ssize_t j)
{
    if (col->spec.kind == KIND_OPAQUE) return PyTuple_GET_ITEM(col->values, j) == Py_None;
    return col->validity.ptr != NULL && !((col->validity.ptr[j >> 3] >> (j & 7)) & 1);
}

/* Field index lists (key and bucket-key columns), validated against the field count. */
typedef struct {
    Py_ssize_t *items;
    Py_ssize_t count;
} IndexList;

static int
index_list_init(PyObject *obj, Py_ssize_t field_count, IndexList *list)
{
    list->items = NULL;
    list->count = 0;
    if (obj == Py_None) return 0;
    if (!PyTuple_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "index list must be a tuple or None");
        return -1;
    }
    list->count = PyTuple_GET_SIZE(obj);
    list->items = PyMem_Calloc(list->count > 0 ? (size_t)list->count : 1, sizeof(Py_ssize_t));
    if (list->items == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = 0; k < list->count; k++) {
        long index;
        if (int_in_range(PyTuple_GET_ITEM(obj, k), 0, (long)field_count - 1, "field index", &index) < 0) return -1;
        list->items[k] = index;
    }
    return 0;
}

/* Concatenates the encodings of the listed fields of the row just encoded (CompactedKeyEncoder). */
static int
build_key(const IndexList *list, const Scratch *row, const Py_ssize_t *span_start, const Py_ssize_t *span_end,
          Scratch *key, Py_ssize_t row_index)
{
    key->len = 0;
    for (Py_ssize_t k = 0; k < list->count; k++) {
        Py_ssize_t f = list->items[k];
        if (span_start[f] < 0) return encode_error(row_index, f, "null key value");
        if (scratch_append(key, row->data + span_start[f], span_end[f] - span_start[f]) < 0) return -1;
    }
    return 0;
}

static PyObject *
encode_rows(PyObject *module, PyObject *args)
{
    Py_ssize_t n;
    PyObject *columns_obj, *key_obj, *bucket_key_obj;
    long bucket_count;
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "nO!OOly*:encode_rows", &n, &PyTuple_Type, &columns_obj, &key_obj, &bucket_key_obj,
                          &bucket_count, &prefix))
        return NULL;
    Py_ssize_t field_count = PyTuple_GET_SIZE(columns_obj);
    PyObject *rows = NULL, *keys = NULL, *buckets = NULL, *result = NULL;
    Scratch row = {NULL, 0, 0}, key = {NULL, 0, 0}, bucket_key = {NULL, 0, 0};
    IndexList key_list = {NULL, 0}, bucket_list = {NULL, 0};
    Py_ssize_t *spans = NULL;
    EncodeColumn *cols = PyMem_Calloc(field_count > 0 ? (size_t)field_count : 1, sizeof(EncodeColumn));
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "row count must be non-negative");
        goto done;
    }
    for (Py_ssize_t f = 0; f < field_count; f++) {
        if (encode_column_init(&cols[f], PyTuple_GET_ITEM(columns_obj, f), n, f) < 0) goto done;
    }
    if (index_list_init(key_obj, field_count, &key_list) < 0) goto done;
    if (index_list_init(bucket_key_obj, field_count, &bucket_list) < 0) goto done;
    int want_buckets = bucket_key_obj != Py_None;
    if (want_buckets && (bucket_count <= 0 || bucket_count > BUCKET_COUNT_MAX || bucket_list.count == 0)) {
        PyErr_SetString(PyExc_ValueError, "buckets need a positive bucket count and bucket-key columns");
        goto done;
    }
    /* The usual case: the bucket key is the primary key, so hash the key bytes already built. */
    int bucket_is_key = 0;
    if (key_obj != Py_None && want_buckets) {
        bucket_is_key = PyObject_RichCompareBool(key_obj, bucket_key_obj, Py_EQ);
        if (bucket_is_key < 0) goto done;
    }
    spans = PyMem_Calloc(2 * (size_t)(field_count > 0 ? field_count : 1), sizeof(Py_ssize_t));
    if (spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t *span_start = spans, *span_end = spans + field_count;
    rows = PyList_New(n);
    if (rows == NULL) goto done;
    if (key_obj != Py_None && (keys = PyList_New(n)) == NULL) goto done;
    if (want_buckets && (buckets = PyList_New(n)) == NULL) goto done;

    Py_ssize_t header = (field_count + 7) / 8;
    for (Py_ssize_t i = 0; i < n; i++) {
        row.len = 0;
        if (scratch_append(&row, prefix.buf, prefix.len) < 0 || scratch_reserve(&row, header) < 0) goto done;
        Py_ssize_t header_at = row.len;
        memset(row.data + header_at, 0, (size_t)header);
        row.len += header;
        for (Py_ssize_t f = 0; f < field_count; f++) {
            EncodeColumn *col = &cols[f];
            Py_ssize_t j = col->offset + i;
            if (encode_is_null(col, j)) {
                if (!col->spec.nullable) {
                    encode_error(i, f, "null in NOT NULL field");
                    goto done;
                }
                row.data[header_at + (f >> 3)] |= (uint8_t)(1u << (f & 7));
                span_start[f] = span_end[f] = -1;
                continue;
            }
            span_start[f] = row.len;
            if (encode_value(col, &row, j, i, f) < 0) goto done;
            span_end[f] = row.len;
        }
        PyObject *row_bytes = PyBytes_FromStringAndSize((const char *)row.data, row.len);
        if (row_bytes == NULL) goto done;
        PyList_SET_ITEM(rows, i, row_bytes);
        if (keys != NULL) {
            if (build_key(&key_list, &row, span_start, span_end, &key, i) < 0) goto done;
            PyObject *key_bytes = PyBytes_FromStringAndSize((const char *)key.data, key.len);
            if (key_bytes == NULL) goto done;
            PyList_SET_ITEM(keys, i, key_bytes);
        }
        if (buckets != NULL) {
            const Scratch *hashed = &key;
            if (!bucket_is_key) {
                if (build_key(&bucket_list, &row, span_start, span_end, &bucket_key, i) < 0) goto done;
                hashed = &bucket_key;
            }
            PyObject *bucket = PyLong_FromLong(fluss_bucket(hashed->data, hashed->len, bucket_count));
            if (bucket == NULL) goto done;
            PyList_SET_ITEM(buckets, i, bucket);
        }
    }
    result = PyTuple_Pack(3, rows, keys != NULL ? keys : Py_None, buckets != NULL ? buckets : Py_None);
done:
    Py_XDECREF(rows);
    Py_XDECREF(keys);
    Py_XDECREF(buckets);
    PyMem_Free(row.data);
    PyMem_Free(key.data);
    PyMem_Free(bucket_key.data);
    PyMem_Free(key_list.items);
    PyMem_Free(bucket_list.items);
    PyMem_Free(spans);
    encode_columns_free(cols, field_count);
    PyBuffer_Release(&prefix);
    return result;
}

/* ========================================================================================== */
/* 4. Buckets of ready-made key bytes (bucketing.bucket_for_key over a list).                  */
/* ========================================================================================== */

static PyObject *
bucket_ids(PyObject *module, PyObject *args)
{
    PyObject *keys_obj;
    long bucket_count;
    if (!PyArg_ParseTuple(args, "Ol:bucket_ids", &keys_obj, &bucket_count)) return NULL;
    if (bucket_count <= 0) {
        PyErr_Format(PyExc_ValueError, "bucket count must be positive, got %ld", bucket_count);
        return NULL;
    }
    if (bucket_count > BUCKET_COUNT_MAX) {
        PyErr_Format(PyExc_ValueError, "bucket count %ld exceeds %ld", bucket_count, (long)BUCKET_COUNT_MAX);
        return NULL;
    }
    PyObject *keys = PySequence_Tuple(keys_obj);
    if (keys == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    PyObject *result = PyList_New(n);
    if (result == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        ByteView bv;
        if (byteview_get(PyTuple_GET_ITEM(keys, i), &bv) < 0) goto fail;
        if (bv.len == 0) {
            byteview_release(&bv);
            PyErr_SetString(PyExc_ValueError, "bucket key bytes must not be empty");
            goto fail;
        }
        long bucket = fluss_bucket(bv.ptr, bv.len, bucket_count);
        byteview_release(&bv);
        PyObject *item = PyLong_FromLong(bucket);
        if (item == NULL) goto fail;
        PyList_SET_ITEM(result, i, item);
    }
    Py_DECREF(keys);
    return result;
fail:
    Py_XDECREF(result);
    Py_DECREF(keys);
    return NULL;
}

/* ========================================================================================== */
/* Module                                                                                      */
/* ========================================================================================== */

/* ---- PutKv planning -------------------------------------------------------------------------- */

/* 1 when two of the (bytes) keys are equal, 0 when none are, -1 with an exception set. An open-addressing
 * set of the keys' hashes (cached in each bytes object) and pointers: ~5x cheaper per key than a dict,
 * which plan_upserts then needs only for a batch that writes a key twice. */
static int
has_repeated_key(PyObject *keys)
{
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (n < 2) {
        return 0;
    }
    size_t size = 8;
    while (size < (size_t)n * 2) {
        size <<= 1;
    }
    struct seen { Py_hash_t hash; PyObject *key; } *slots = PyMem_Calloc(size, sizeof(struct seen));
    if (slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int repeated = 0;
    for (Py_ssize_t i = 0; i < n && !repeated; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_CheckExact(key)) {
            repeated = 1; /* not bytes: let the dict compare it */
            break;
        }
        Py_hash_t hash = PyObject_Hash(key);
        if (hash == -1) {
            repeated = -1;
            break;
        }
        size_t slot = (size_t)hash & (size - 1);
        while (slots[slot].key != NULL) {
            PyObject *other = slots[slot].key;
            if (slots[slot].hash == hash && PyBytes_GET_SIZE(other) == PyBytes_GET_SIZE(key)
                && memcmp(PyBytes_AS_STRING(other), PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key)) == 0) {
                repeated = 1;
                break;
            }
            slot = (slot + 1) & (size - 1);
        }
        slots[slot].hash = hash;
        slots[slot].key = key;
    }
    PyMem_Free(slots);
    return repeated;
}

/*
 * plan_upserts(keys, values, olds, prefix, ignore_deletes)
 *     -> (change_types: bytes, rows: list, new_keys: list, new_values: list)
 *
 * The changelog of one PutKv batch (full-row upserts and deletes; partial updates stay in Python).
 * olds[i] is the key's value before the batch (None: absent); a key written earlier in the same batch
 * sees that write instead. Per record: upsert of an absent key -> +I new; of a present key -> -U old,
 * +U new; delete of a present key -> -D old (skipped when ignore_deletes); delete of an absent key ->
 * nothing. new = prefix + value. rows holds the changelog images in order; new_keys/new_values the
 * writes to apply (None: delete).
 */
static PyObject *
plan_upserts(PyObject *self, PyObject *args)
{
    PyObject *keys_arg, *values_arg, *olds_arg, *prefix;
    int ignore_deletes;
    if (!PyArg_ParseTuple(args, "OOOSp", &keys_arg, &values_arg, &olds_arg, &prefix, &ignore_deletes)) {
        return NULL;
    }
    PyObject *keys = PySequence_Tuple(keys_arg);
    PyObject *values = keys ? PySequence_Tuple(values_arg) : NULL;
    PyObject *olds = values ? PySequence_Tuple(olds_arg) : NULL;
    PyObject *local = NULL; /* what the batch wrote so far: only when it writes a key twice */
    PyObject *change_types = NULL, *rows = NULL, *new_keys = NULL, *new_values = NULL, *result = NULL;
    char *types = NULL;
    Py_ssize_t type_count = 0;
    if (olds == NULL) goto done;
    int repeated = has_repeated_key(keys);
    if (repeated < 0 || (repeated && (local = PyDict_New()) == NULL)) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(keys);
    if (PyTuple_GET_SIZE(values) != n || PyTuple_GET_SIZE(olds) != n) {
        PyErr_SetString(PyExc_ValueError, "keys, values and olds must have the same length");
        goto done;
    }
    types = PyMem_Malloc((size_t)(2 * n + 1));
    rows = PyList_New(0);
    new_keys = PyList_New(0);
    new_values = PyList_New(0);
    if (types == NULL || rows == NULL || new_keys == NULL || new_values == NULL) {
        if (types == NULL) PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        PyObject *value = PyTuple_GET_ITEM(values, i);
        PyObject *old = local ? PyDict_GetItemWithError(local, key) : NULL; /* borrowed */
        if (old == NULL) {
            if (PyErr_Occurred()) goto done;
            old = PyTuple_GET_ITEM(olds, i);
        }
        if (value == Py_None) {
            if (old == Py_None || ignore_deletes) continue;
            types[type_count++] = 4; /* -D */
            if (PyList_Append(rows, old) < 0 || (local && PyDict_SetItem(local, key, Py_None) < 0) ||
                PyList_Append(new_keys, key) < 0 || PyList_Append(new_values, Py_None) < 0) {
                goto done;
            }
            continue;
        }
        if (!PyBytes_Check(value)) {
            PyErr_SetString(PyExc_TypeError, "values must be bytes or None");
            goto done;
        }
        Py_ssize_t prefix_size = PyBytes_GET_SIZE(prefix);
        Py_ssize_t value_size = PyBytes_GET_SIZE(value);
        PyObject *new_value = PyBytes_FromStringAndSize(NULL, prefix_size + value_size);
        if (new_value == NULL) goto done;
        memcpy(PyBytes_AS_STRING(new_value), PyBytes_AS_STRING(prefix), (size_t)prefix_size);
        memcpy(PyBytes_AS_STRING(new_value) + prefix_size, PyBytes_AS_STRING(value), (size_t)value_size);
        int failed;
        if (old == Py_None) {
            types[type_count++] = 1; /* +I */
            failed = PyList_Append(rows, new_value) < 0;
        } else {
            types[type_count++] = 2; /* -U */
            types[type_count++] = 3; /* +U */
            failed = PyList_Append(rows, old) < 0 || PyList_Append(rows, new_value) < 0;
        }
        failed = failed || (local && PyDict_SetItem(local, key, new_value) < 0) || PyList_Append(new_keys, key) < 0 ||
                 PyList_Append(new_values, new_value) < 0;
        Py_DECREF(new_value);
        if (failed) goto done;
    }
    change_types = PyBytes_FromStringAndSize(types, type_count);
    if (change_types == NULL) goto done;
    result = PyTuple_Pack(4, change_types, rows, new_keys, new_values);
done:
    PyMem_Free(types);
    Py_XDECREF(change_types);
    Py_XDECREF(rows);
    Py_XDECREF(new_keys);
    Py_XDECREF(new_values);
    Py_XDECREF(local);
    Py_XDECREF(olds);
    Py_XDECREF(values);
    Py_XDECREF(keys);
    return result;
}

/* ---- value record batches ------------------------------------------------------------------- */

/*
 * parse_value_records(buffer, position, end, count) -> list[bytes]
 *
 * The records of a value record batch body: count times (size i32 LE, size bytes). Raises ValueError
 * when a record overruns buffer[position:end] or the records do not end exactly at end.
 */
static PyObject *
parse_value_records(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t position, end, count;
    if (!PyArg_ParseTuple(args, "y*nnn", &view, &position, &end, &count)) {
        return NULL;
    }
    PyObject *values = NULL;
    if (position < 0 || end > view.len || position > end || count < 0) {
        PyErr_SetString(PyExc_ValueError, "value batch bounds are outside the buffer");
        goto done;
    }
    /*
     * Every record takes at least its 4-byte size, so a count beyond that fails before the list fills;
     * cap the preallocation so a hostile count cannot make us allocate gigabytes.
     */
    Py_ssize_t capacity = count < (end - position) / 4 ? count : (end - position) / 4;
    values = PyList_New(capacity);
    if (values == NULL) goto done;
    const unsigned char *data = (const unsigned char *)view.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - position < 4) {
            PyErr_Format(PyExc_ValueError, "value batch claims %zd records but ends after %zd", count, i);
            Py_CLEAR(values);
            goto done;
        }
        int32_t size = (int32_t)((uint32_t)data[position] | ((uint32_t)data[position + 1] << 8) |
                                 ((uint32_t)data[position + 2] << 16) | ((uint32_t)data[position + 3] << 24));
        position += 4;
        if (size < 0 || size > end - position) {
            PyErr_Format(PyExc_ValueError, "value record of %d bytes overruns its batch", size);
            Py_CLEAR(values);
            goto done;
        }
        PyObject *value = PyBytes_FromStringAndSize((const char *)data + position, size);
        if (value == NULL) {
            Py_CLEAR(values);
            goto done;
        }
        if (i >= capacity) { /* unreachable by the size argument above; never write past the list */
            Py_DECREF(value);
            PyErr_SetString(PyExc_SystemError, "value record count exceeds its bound");
            Py_CLEAR(values);
            goto done;
        }
        PyList_SET_ITEM(values, i, value);
        position += size;
    }
    if (position != end) {
        PyErr_SetString(PyExc_ValueError, "value batch length disagrees with its records");
        Py_CLEAR(values);
    }
done:
    PyBuffer_Release(&view);
    return values;
}

/*
 * fill_value_batch(iterator, lookahead, batch_size_bytes, limit) -> (records, count, lookahead)
 *
 * Build one value record batch (length i32 | magic i8 | count i32 | per record size i32 + bytes) from
 * an iterator of bytes values: `lookahead` (a value already pulled, or None) comes first; values are
 * pulled until the batch reaches batch_size_bytes (always at least one value), `limit` values were
 * taken (limit < 0: no limit) or the iterator ends. One more value is then pulled, if the limit allows,
 * and returned as the new lookahead: None means the scan is complete.
 */
static PyObject *
fill_value_batch(PyObject *self, PyObject *args)
{
    PyObject *iterator, *lookahead;
    Py_ssize_t batch_size_bytes, limit;
    if (!PyArg_ParseTuple(args, "OOnn", &iterator, &lookahead, &batch_size_bytes, &limit)) {
        return NULL;
    }
    if (!PyIter_Check(iterator)) {
        PyErr_SetString(PyExc_TypeError, "fill_value_batch needs an iterator");
        return NULL;
    }
    PyObject *values = PyList_New(0);
    if (values == NULL) return NULL;
    PyObject *pending = NULL; /* owned: the caller's lookahead, consumed first */
    PyObject *next = NULL;    /* owned: the first value of the next batch, returned as the new lookahead */
    if (lookahead != Py_None) {
        Py_INCREF(lookahead);
        pending = lookahead;
    }
    Py_ssize_t size = 9; /* length i32 + magic i8 + count i32 */
    Py_ssize_t taken = 0;
    for (;;) {
        if (limit >= 0 && taken >= limit) break; /* the limit completes the scan: no lookahead */
        PyObject *value = pending;
        pending = NULL;
        if (value == NULL) {
            value = PyIter_Next(iterator);
            if (value == NULL) {
                if (PyErr_Occurred()) goto fail;
                break; /* exhausted */
            }
        }
        if (!PyBytes_Check(value)) {
            Py_DECREF(value);
            PyErr_SetString(PyExc_TypeError, "scan values must be bytes");
            goto fail;
        }
        if (taken > 0 && size >= batch_size_bytes) {
            next = value; /* full: this value opens the next batch */
            break;
        }
        size += 4 + PyBytes_GET_SIZE(value);
        taken++;
        int failed = PyList_Append(values, value) < 0;
        Py_DECREF(value);
        if (failed) goto fail;
    }
    Py_CLEAR(pending);
    if (size > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "value batch exceeds 2 GiB");
        goto fail;
    }
    PyObject *records = PyBytes_FromStringAndSize(NULL, size);
    if (records == NULL) goto fail;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(records);
    uint32_t length = (uint32_t)(size - 4);
    uint32_t count = (uint32_t)taken;
    memcpy(out, (uint8_t[]){(uint8_t)length, (uint8_t)(length >> 8), (uint8_t)(length >> 16), (uint8_t)(length >> 24),
                            0, (uint8_t)count, (uint8_t)(count >> 8), (uint8_t)(count >> 16), (uint8_t)(count >> 24)},
           9);
    Py_ssize_t position = 9;
    for (Py_ssize_t i = 0; i < taken; i++) {
        PyObject *item = PyList_GET_ITEM(values, i);
        uint32_t item_size = (uint32_t)PyBytes_GET_SIZE(item);
        out[position] = (uint8_t)item_size;
        out[position + 1] = (uint8_t)(item_size >> 8);
        out[position + 2] = (uint8_t)(item_size >> 16);
        out[position + 3] = (uint8_t)(item_size >> 24);
        memcpy(out + position + 4, PyBytes_AS_STRING(item), item_size);
        position += 4 + (Py_ssize_t)item_size;
    }
    Py_DECREF(values);
    return Py_BuildValue("(NnN)", records, taken, next != NULL ? next : Py_NewRef(Py_None));
fail:
    Py_XDECREF(pending);
    Py_XDECREF(next);
    Py_DECREF(values);
    return NULL;
}

/* ========================================================================================== */
/* 8. One row or key of plain kinds as Python values (a single lookup's client side).          */
/* ========================================================================================== */

/* A field spec of a kind whose Python values are plain objects (bool, int, float, str, bytes), read and
 * written here; -1 with ValueError for any other. */
static int
parse_plain_spec(PyObject *item, FieldSpec *spec)
{
    if (parse_spec(item, spec) < 0) return -1;
    if (spec->kind < KIND_BOOLEAN || spec->kind > KIND_BYTES) {
        PyErr_SetString(PyExc_ValueError, "not a plain kind");
        return -1;
    }
    return 0;
}

/* One non-null value of a plain kind at *pos as a new Python object, as compacted.py reads it. */
static PyObject *
read_plain_value(int kind, const uint8_t *p, Py_ssize_t n, Py_ssize_t *pos, Py_ssize_t field)
{
    int rc;
    switch (kind) {
    case KIND_BOOLEAN:
        if (*pos >= n) break;
        return PyBool_FromLong(p[(*pos)++] != 0);
    case KIND_TINYINT:
        if (*pos >= n) break;
        return PyLong_FromLong((int8_t)p[(*pos)++]);
    case KIND_SMALLINT: {
        if (n - *pos < 2) break;
        int16_t v = (int16_t)load_le16(p + *pos);
        *pos += 2;
        return PyLong_FromLong(v);
    }
    case KIND_INT: {
        int32_t v;
        if ((rc = read_varint32(p, n, pos, &v)) != VARINT_OK) return varint_error(rc, 0, field), NULL;
        return PyLong_FromLong(v);
    }
    case KIND_BIGINT: {
        int64_t v;
        if ((rc = read_varint64(p, n, pos, &v)) != VARINT_OK) return varint_error(rc, 0, field), NULL;
        return PyLong_FromLongLong(v);
    }
    case KIND_FLOAT: {
        if (n - *pos < 4) break;
        uint32_t bits = load_le32(p + *pos);
        float v;
        memcpy(&v, &bits, 4);
        *pos += 4;
        return PyFloat_FromDouble((double)v);
    }
    case KIND_DOUBLE: {
        if (n - *pos < 8) break;
        uint64_t bits = load_le64(p + *pos);
        double v;
        memcpy(&v, &bits, 8);
        *pos += 8;
        return PyFloat_FromDouble(v);
    }
    case KIND_STRING:
    case KIND_BYTES: {
        Py_ssize_t start;
        if (read_sized(p, n, pos, &start, 0, field) < 0) return NULL;
        Py_ssize_t len = *pos - start;
        if (kind == KIND_BYTES) return PyBytes_FromStringAndSize((const char *)p + start, len);
        if (!utf8_valid(p + start, len)) return decode_error(0, field, "invalid UTF-8"), NULL;
        return PyUnicode_DecodeUTF8((const char *)p + start, len, "strict");
    }
    }
    decode_error(0, field, "truncated value");
    return NULL;
}

/* decode_plain_row(data, offset, specs) -> tuple: see the method table. */
static PyObject *
decode_plain_row(PyObject *module, PyObject *args)
{
    PyObject *data_obj, *specs_obj;
    Py_ssize_t offset;
    if (!PyArg_ParseTuple(args, "OnO!:decode_plain_row", &data_obj, &offset, &PyTuple_Type, &specs_obj)) return NULL;
    Py_ssize_t field_count = PyTuple_GET_SIZE(specs_obj);
    Py_buffer view;
    if (PyObject_GetBuffer(data_obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *values = NULL;
    if (offset < 0 || offset > view.len) {
        PyErr_SetString(PyExc_ValueError, "offset outside the row's buffer");
        goto done;
    }
    const uint8_t *p = (const uint8_t *)view.buf + offset;
    Py_ssize_t n = view.len - offset;
    Py_ssize_t pos = (field_count + 7) / 8;
    if (n < pos) {
        decode_error(0, 0, "row shorter than its null bitset");
        goto done;
    }
    if ((values = PyTuple_New(field_count)) == NULL) goto done;
    for (Py_ssize_t f = 0; f < field_count; f++) {
        FieldSpec spec;
        if (parse_plain_spec(PyTuple_GET_ITEM(specs_obj, f), &spec) < 0) goto fail;
        PyObject *value;
        if (spec.nullable && (p[f >> 3] >> (f & 7)) & 1) {
            value = Py_NewRef(Py_None);
        } else if ((value = read_plain_value(spec.kind, p, n, &pos, f)) == NULL) {
            goto fail;
        }
        PyTuple_SET_ITEM(values, f, value);
    }
    goto done;
fail:
    Py_CLEAR(values);
done:
    PyBuffer_Release(&view);
    return values;
}

/* Appends one key value of a plain kind to buf as compacted.py writes it; -1 with ValueError for a
 * value Python must handle (another type, out of range, unencodable text). */
static int
write_plain_value(Scratch *buf, int kind, PyObject *value, Py_ssize_t field)
{
    uint8_t fixed[8];
    switch (kind) {
    case KIND_BOOLEAN:
        if (!PyBool_Check(value)) break;
        fixed[0] = value == Py_True;
        return scratch_append(buf, fixed, 1);
    case KIND_TINYINT:
    case KIND_SMALLINT:
    case KIND_INT:
    case KIND_BIGINT: {
        if (!PyLong_CheckExact(value)) break;
        int overflow;
        long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            break;
        }
        if (kind == KIND_TINYINT) {
            if (v < INT8_MIN || v > INT8_MAX) break;
            fixed[0] = (uint8_t)(int8_t)v;
            return scratch_append(buf, fixed, 1);
        }
        if (kind == KIND_SMALLINT) {
            if (v < INT16_MIN || v > INT16_MAX) break;
            store_le16(fixed, (uint16_t)(int16_t)v);
            return scratch_append(buf, fixed, 2);
        }
        uint8_t varint[VARINT64_SIZE_MAX];
        if (kind == KIND_INT) {
            if (v < INT32_MIN || v > INT32_MAX) break;
            return scratch_append(buf, varint, write_uvarint(varint, (uint32_t)(int32_t)v));
        }
        return scratch_append(buf, varint, write_uvarint(varint, (uint64_t)v));
    }
    case KIND_FLOAT:
    case KIND_DOUBLE: {
        if (!PyFloat_CheckExact(value)) break;
        double v = PyFloat_AS_DOUBLE(value);
        if (kind == KIND_DOUBLE) {
            uint64_t bits;
            memcpy(&bits, &v, 8);
            store_le64(fixed, bits);
            return scratch_append(buf, fixed, 8);
        }
        float narrowed = (float)v;
        if (isinf(narrowed) && !isinf(v)) break; /* struct.pack("<f") raises OverflowError */
        uint32_t bits;
        memcpy(&bits, &narrowed, 4);
        store_le32(fixed, bits);
        return scratch_append(buf, fixed, 4);
    }
    case KIND_STRING:
    case KIND_BYTES: {
        const char *bytes;
        Py_ssize_t size;
        if (kind == KIND_STRING) {
            if (!PyUnicode_CheckExact(value)) break;
            if ((bytes = PyUnicode_AsUTF8AndSize(value, &size)) == NULL) {
                PyErr_Clear(); /* lone surrogates: Python's encode raises its own error */
                break;
            }
        } else {
            if (!PyBytes_CheckExact(value)) break;
            bytes = PyBytes_AS_STRING(value);
            size = PyBytes_GET_SIZE(value);
        }
        return put_sized(buf, (const uint8_t *)bytes, size, 0, field); /* ValueError past 2 GiB */
    }
    }
    PyErr_SetString(PyExc_ValueError, "a key value Python must encode");
    return -1;
}

/* encode_plain_key(values, specs) -> bytes: see the method table. */
static PyObject *
encode_plain_key(PyObject *module, PyObject *args)
{
    PyObject *values_obj, *specs_obj;
    if (!PyArg_ParseTuple(args, "OO!:encode_plain_key", &values_obj, &PyTuple_Type, &specs_obj)) return NULL;
    PyObject *values = PySequence_Tuple(values_obj);
    if (values == NULL) return NULL;
    PyObject *result = NULL;
    Scratch buf = {0};
    Py_ssize_t count = PyTuple_GET_SIZE(values);
    if (count != PyTuple_GET_SIZE(specs_obj)) {
        PyErr_SetString(PyExc_ValueError, "one key value per spec");
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        FieldSpec spec;
        if (parse_plain_spec(PyTuple_GET_ITEM(specs_obj, i), &spec) < 0) goto done;
        if (write_plain_value(&buf, spec.kind, PyTuple_GET_ITEM(values, i), i) < 0) goto done;
    }
    result = PyBytes_FromStringAndSize((const char *)buf.data, buf.len);
done:
    PyMem_Free(buf.data);
    Py_DECREF(values);
    return result;
}

/* The items of (items, order) rearranged by order's positions (native Py_ssize_t, as numpy's int64 arrays and kv's key_order pack them): gathered,
 * result[i] = items[order[i]] (take), or scattered, result[order[i]] = items[i] (unsort, a sort's
 * inverse; a position given twice keeps the later item and leaves a hole, answered as None). */
static PyObject *
reorder(PyObject *args, int scatter)
{
    PyObject *items_arg;
    Py_buffer order;
    if (!PyArg_ParseTuple(args, "Oy*", &items_arg, &order)) {
        return NULL;
    }
    PyObject *items = PySequence_Tuple(items_arg);
    PyObject *result = NULL;
    if (items == NULL) {
        goto done;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(items);
    if (order.len != count * (Py_ssize_t)sizeof(Py_ssize_t)) {
        PyErr_SetString(PyExc_ValueError, "items and order differ in length");
        goto done;
    }
    const Py_ssize_t *positions = order.buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (positions[i] < 0 || positions[i] >= count) {
            PyErr_SetString(PyExc_ValueError, "order holds a position out of range");
            goto done;
        }
    }
    result = PyList_New(count);
    if (result == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (!scatter) {
            PyObject *item = PyTuple_GET_ITEM(items, positions[i]);
            Py_INCREF(item);
            PyList_SET_ITEM(result, i, item);
            continue;
        }
        PyObject *item = PyTuple_GET_ITEM(items, i);
        PyObject *previous = PyList_GET_ITEM(result, positions[i]);
        Py_INCREF(item);
        PyList_SET_ITEM(result, positions[i], item);
        Py_XDECREF(previous);  /* only with a repeated position (not from a sort) */
    }
    for (Py_ssize_t i = 0; scatter && i < count; i++) {
        if (PyList_GET_ITEM(result, i) == NULL) {  /* a repeated position left a hole */
            Py_INCREF(Py_None);
            PyList_SET_ITEM(result, i, Py_None);
        }
    }
done:
    Py_XDECREF(items);
    PyBuffer_Release(&order);
    return result;
}

/* unsort(found, order) -> list: found[i] placed at position order[i] (a sort's inverse). */
static PyObject *
unsort(PyObject *self, PyObject *args)
{
    return reorder(args, 1);
}

/* take(items, order) -> list: items[order[0]], items[order[1]], ... — the items put in
 * order. */
static PyObject *
take(PyObject *self, PyObject *args)
{
    return reorder(args, 0);
}

/* present_rows(values, prefix) -> (rows, mismatch): the values that are not None, in order, and the
 * position in rows of the first that does not start with prefix (a stored value's schema id), or -1. */
static PyObject *
present_rows(PyObject *self, PyObject *args)
{
    PyObject *values_arg;
    Py_buffer prefix;
    if (!PyArg_ParseTuple(args, "Oy*", &values_arg, &prefix)) {
        return NULL;
    }
    PyObject *values = PySequence_Tuple(values_arg);
    PyObject *rows = NULL;
    PyObject *result = NULL;
    if (values == NULL) {
        goto done;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(values), present = 0, mismatch = -1;
    for (Py_ssize_t i = 0; i < count; i++) {
        present += PyTuple_GET_ITEM(values, i) != Py_None;
    }
    rows = PyList_New(present);
    if (rows == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0, at = 0; i < count; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i);
        if (value == Py_None) {
            continue;
        }
        if (!PyBytes_Check(value)) {
            PyErr_Format(PyExc_TypeError, "a stored value must be bytes or None, not %.100s", Py_TYPE(value)->tp_name);
            goto done;
        }
        if (mismatch < 0 && (PyBytes_GET_SIZE(value) < prefix.len
                             || memcmp(PyBytes_AS_STRING(value), prefix.buf, (size_t)prefix.len) != 0)) {
            mismatch = at;
        }
        Py_INCREF(value);
        PyList_SET_ITEM(rows, at++, value);
    }
    result = Py_BuildValue("(On)", rows, mismatch);
done:
    Py_XDECREF(rows);
    Py_XDECREF(values);
    PyBuffer_Release(&prefix);
    return result;
}

static PyMethodDef rowcodec_methods[] = {
    {"parse_kv_records", parse_kv_records, METH_VARARGS,
     "parse_kv_records(buffer, position, end, count) -> (keys, values)\n\n"
     "The records of one KvRecordBatch body buffer[position:end]; a value is None for a delete.\n"
     "Raises ValueError with kv_batch's messages."},
    {"build_kv_records", build_kv_records, METH_VARARGS,
     "build_kv_records(keys, values) -> bytes\n\n"
     "The records of a KvRecordBatch body; a None (or empty) value is a delete. Raises TypeError for a\n"
     "key or value that is not bytes."},
    {"decode_columns", decode_columns, METH_VARARGS,
     "decode_columns(rows, offset, specs) -> list\n\n"
     "Decode CompactedRows (bytes-like; each row starts `offset` bytes into its buffer) into one\n"
     "entry per field spec (kind, param, nullable): (validity, null_count, data) for fixed-width\n"
     "kinds, (validity, null_count, offsets, data) for STRING/BYTES, (None|validity, null_count,\n"
     "positions) for OPAQUE. Buffers are bytearrays in Arrow layout; validity is None without\n"
     "nulls. Raises ValueError for a malformed row or a value Python must handle."},
    {"encode_rows", encode_rows, METH_VARARGS,
     "encode_rows(n, columns, key_indexes, bucket_key_indexes, bucket_count, prefix)\n"
     "    -> (rows, keys | None, buckets | None)\n\n"
     "Encode n rows from Arrow buffers; each column is (kind, param, nullable, validity, offset,\n"
     "data, offsets), or for OPAQUE (kind, param, nullable, None, offset, encodings, None).\n"
     "Raises ValueError for any value Python must handle (nulls in keys, overflows, ...)."},
    {"plan_upserts", plan_upserts, METH_VARARGS,
     "plan_upserts(keys, values, olds, prefix, ignore_deletes)\n"
     "    -> (change_types, rows, new_keys, new_values)\n\n"
     "The changelog of one PutKv batch of full-row upserts and deletes (see the C comment)."},
    {"parse_value_records", parse_value_records, METH_VARARGS,
     "parse_value_records(buffer, position, end, count) -> list[bytes]: the records of a value batch."},
    {"fill_value_batch", fill_value_batch, METH_VARARGS,
     "fill_value_batch(iterator, lookahead, batch_size_bytes, limit) -> (records, count, lookahead)"},
    {"take", take, METH_VARARGS,
     "take(items, order) -> list: items[order[0]], items[order[1]], ... (order: native Py_ssize_t)."},
    {"unsort", unsort, METH_VARARGS,
     "unsort(found, order) -> list: found[i] placed at position order[i], take's inverse."},
    {"present_rows", present_rows, METH_VARARGS,
     "present_rows(values, prefix) -> (rows, mismatch): the non-None values, and the position of the\n"
     "first that does not start with prefix (-1: none)."},
    {"bucket_ids", bucket_ids, METH_VARARGS,
     "bucket_ids(keys, bucket_count) -> list[int]: bucketing.bucket_for_key for each key."},
    {"decode_plain_row", decode_plain_row, METH_VARARGS,
     "decode_plain_row(data, offset, specs) -> tuple\n\n"
     "The CompactedRow starting `offset` bytes into `data` as one Python value per field spec, as\n"
     "CompactedRowDecoder.decode returns them; every kind is BOOLEAN..BYTES. Raises ValueError for a\n"
     "malformed row or one Python must decode (invalid UTF-8)."},
    {"encode_plain_key", encode_plain_key, METH_VARARGS,
     "encode_plain_key(values, specs) -> bytes\n\n"
     "CompactedKeyEncoder.encode_key of one key's values (bool, int, float, str, bytes for kinds\n"
     "BOOLEAN..BYTES). Raises ValueError for any value Python must encode (another type, a value out\n"
     "of range)."},
    {NULL, NULL, 0, NULL},
};

static int
rowcodec_exec(PyObject *module)
{
    static const struct {
        const char *name;
        int value;
    } kinds[] = {
        {"KIND_BOOLEAN", KIND_BOOLEAN}, {"KIND_TINYINT", KIND_TINYINT}, {"KIND_SMALLINT", KIND_SMALLINT},
        {"KIND_INT", KIND_INT}, {"KIND_BIGINT", KIND_BIGINT}, {"KIND_FLOAT", KIND_FLOAT},
        {"KIND_DOUBLE", KIND_DOUBLE}, {"KIND_STRING", KIND_STRING}, {"KIND_BYTES", KIND_BYTES},
        {"KIND_BINARY", KIND_BINARY}, {"KIND_DECIMAL", KIND_DECIMAL}, {"KIND_TIME", KIND_TIME},
        {"KIND_TIMESTAMP", KIND_TIMESTAMP}, {"KIND_OPAQUE", KIND_OPAQUE},
    };
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (PyModule_AddIntConstant(module, kinds[i].name, kinds[i].value) < 0) return -1;
    }
    return 0;
}

static PyModuleDef_Slot rowcodec_slots[] = {
    {Py_mod_exec, rowcodec_exec},
    {0, NULL},
};

static struct PyModuleDef rowcodec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "strom.records._rowcodec",
    .m_doc = "Native CompactedRow codec hot loops; use strom.records.row_batches (and kv_batch, bucketing, kv.changelog), not this module.",
    .m_size = 0,
    .m_methods = rowcodec_methods,
    .m_slots = rowcodec_slots,
};

PyMODINIT_FUNC
PyInit__rowcodec(void)
{
    return PyModuleDef_Init(&rowcodec_module);
}
