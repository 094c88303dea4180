/*
 * strom.rpc._lookupwire: Fluss's Lookup messages (api key 1017) written and read without protobuf
 * objects.
 *
 * A point lookup is the request whose cost is all overhead: one key in, one value out. Through
 * protobuf's Python objects the server built an entry and a PbValue per key and the client walked them
 * back out, ~0.5 µs a key each side and several µs of a single lookup's ~95 µs. These functions write
 * and read the same bytes directly. strom/rpc/lookup_wire.py holds a protobuf reference of each; the
 * tests check both agree on every input, malformed ones included.
 *
 * Wire format (proto2): LookupRequest {1 table_id int64, 2 buckets_req {1 partition_id int64,
 * 2 bucket_id int32, 3 keys bytes*}}; LookupResponse {1 buckets_resp {1 partition_id int64,
 * 2 bucket_id int32, 3 error_code int32, 4 error_message string, 5 values {1 values bytes}*,
 * 6 original_partition_name string}}. Fields are written in field-number order, as protobuf does.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

/* ------------------------------------------------------------------------------------------ writing */

static size_t
varint_size(uint64_t value)
{
    size_t size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

static char *
put_varint(char *out, uint64_t value)
{
    while (value >= 0x80) {
        *out++ = (char)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    *out++ = (char)value;
    return out;
}

static char *
put_tag(char *out, int field, int wire_type)
{
    return put_varint(out, ((uint64_t)field << 3) | (uint64_t)wire_type);
}

/* An optional int64 argument: None, or a Python int that fits. Returns 0 on success, -1 with an
 * exception set. */
static int
optional_int64(PyObject *obj, int *present, int64_t *value)
{
    if (obj == Py_None) {
        *present = 0;
        return 0;
    }
    long long parsed = PyLong_AsLongLong(obj);
    if (parsed == -1 && PyErr_Occurred()) {
        return -1;
    }
    *present = 1;
    *value = (int64_t)parsed;
    return 0;
}

/* The fields a bucket's request and response entries both start with: 1 partition_id (when there is
 * one), 2 bucket_id. int32 fields are sign-extended to 64 bits on the wire, as protobuf writes them. */
typedef struct {
    int has_partition;
    uint64_t partition_wire;
    uint64_t bucket_wire;
} BucketFields;

/* Parses the partition id (None or an int) beside a bucket id; -1 with an exception set. */
static int
bucket_fields(PyObject *partition_arg, int bucket_id, BucketFields *fields)
{
    int64_t partition_id = 0;
    if (optional_int64(partition_arg, &fields->has_partition, &partition_id) < 0) {
        return -1;
    }
    fields->partition_wire = (uint64_t)partition_id;
    fields->bucket_wire = (uint64_t)(int64_t)bucket_id;
    return 0;
}

static size_t
bucket_fields_size(const BucketFields *fields)
{
    size_t size = 1 + varint_size(fields->bucket_wire);
    return fields->has_partition ? size + 1 + varint_size(fields->partition_wire) : size;
}

static char *
put_bucket_fields(char *out, const BucketFields *fields)
{
    if (fields->has_partition) {
        out = put_tag(out, 1, WIRE_VARINT);
        out = put_varint(out, fields->partition_wire);
    }
    out = put_tag(out, 2, WIRE_VARINT);
    return put_varint(out, fields->bucket_wire);
}

/* The size of a LookupRequest for one bucket's keys (all bytes: the caller checked), and of its one
 * buckets_req entry. */
static size_t
lookup_request_size(long long table_id, const BucketFields *fields, PyObject *const *keys, Py_ssize_t count,
                    size_t *entry_size)
{
    size_t size = bucket_fields_size(fields);
    for (Py_ssize_t i = 0; i < count; i++) {
        size_t key_size = (size_t)PyBytes_GET_SIZE(keys[i]);
        size += 1 + varint_size(key_size) + key_size;
    }
    *entry_size = size;
    return 1 + varint_size((uint64_t)table_id) + 1 + varint_size(size) + size;
}

static char *
put_lookup_request(char *out, long long table_id, const BucketFields *fields, PyObject *const *keys,
                   Py_ssize_t count, size_t entry_size)
{
    out = put_tag(out, 1, WIRE_VARINT);
    out = put_varint(out, (uint64_t)table_id);
    out = put_tag(out, 2, WIRE_LEN);
    out = put_varint(out, entry_size);
    out = put_bucket_fields(out, fields);
    for (Py_ssize_t i = 0; i < count; i++) {
        size_t key_size = (size_t)PyBytes_GET_SIZE(keys[i]);
        out = put_tag(out, 3, WIRE_LEN);
        out = put_varint(out, key_size);
        memcpy(out, PyBytes_AS_STRING(keys[i]), key_size);
        out += key_size;
    }
    return out;
}

static int
check_key(PyObject *key)
{
    if (!PyBytes_Check(key)) {
        PyErr_Format(PyExc_TypeError, "a lookup key must be bytes, not %.100s", Py_TYPE(key)->tp_name);
        return -1;
    }
    return 0;
}

/* lookup_request(table_id, partition_id, bucket_id, keys) -> bytes: a LookupRequest for one bucket. */
static PyObject *
lookup_request(PyObject *self, PyObject *args)
{
    long long table_id;
    int bucket_id;
    PyObject *partition_arg, *keys_arg;
    if (!PyArg_ParseTuple(args, "LOiO", &table_id, &partition_arg, &bucket_id, &keys_arg)) {
        return NULL;
    }
    BucketFields fields;
    if (bucket_fields(partition_arg, bucket_id, &fields) < 0) {
        return NULL;
    }
    PyObject *keys = PySequence_Tuple(keys_arg);
    if (keys == NULL) {
        return NULL;
    }
    PyObject *const *items = &PyTuple_GET_ITEM(keys, 0);
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (check_key(items[i]) < 0) {
            Py_DECREF(keys);
            return NULL;
        }
    }
    size_t entry_size;
    size_t total = lookup_request_size(table_id, &fields, items, count, &entry_size);
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result != NULL) {
        put_lookup_request(PyBytes_AS_STRING(result), table_id, &fields, items, count, entry_size);
    }
    Py_DECREF(keys);
    return result;
}

/* lookup_bucket_entry(bucket_id, partition_id, values) -> bytes: one buckets_resp entry of a
 * LookupResponse, its tag and length included (a response body is its entries one after another). A
 * None value is a PbValue without bytes: no row. */
static PyObject *
lookup_bucket_entry(PyObject *self, PyObject *args)
{
    int bucket_id;
    PyObject *partition_arg, *values_arg;
    if (!PyArg_ParseTuple(args, "iOO", &bucket_id, &partition_arg, &values_arg)) {
        return NULL;
    }
    BucketFields fields;
    if (bucket_fields(partition_arg, bucket_id, &fields) < 0) {
        return NULL;
    }
    PyObject *values = PySequence_Tuple(values_arg);
    if (values == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(values);
    size_t entry_size = bucket_fields_size(&fields);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i);
        if (value == Py_None) {
            entry_size += 2; /* tag, zero length */
            continue;
        }
        if (!PyBytes_Check(value)) {
            PyErr_Format(PyExc_TypeError, "a looked-up value must be bytes or None, not %.100s",
                         Py_TYPE(value)->tp_name);
            Py_DECREF(values);
            return NULL;
        }
        size_t value_size = (size_t)PyBytes_GET_SIZE(value);
        size_t inner = 1 + varint_size(value_size) + value_size;
        entry_size += 1 + varint_size(inner) + inner;
    }
    size_t total = 1 + varint_size(entry_size) + entry_size;
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(result);
    out = put_tag(out, 1, WIRE_LEN);
    out = put_varint(out, entry_size);
    out = put_bucket_fields(out, &fields);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i);
        out = put_tag(out, 5, WIRE_LEN);
        if (value == Py_None) {
            *out++ = 0;
            continue;
        }
        size_t value_size = (size_t)PyBytes_GET_SIZE(value);
        out = put_varint(out, 1 + varint_size(value_size) + value_size);
        out = put_tag(out, 1, WIRE_LEN);
        out = put_varint(out, value_size);
        memcpy(out, PyBytes_AS_STRING(value), value_size);
        out += value_size;
    }
    Py_DECREF(values);
    return result;
}

/* ------------------------------------------------------------------------------------------ reading */

typedef struct {
    const unsigned char *at;
    const unsigned char *end;
} Reader;

static int
malformed(const char *what)
{
    PyErr_Format(PyExc_ValueError, "malformed LookupResponse: %s", what);
    return -1;
}

static int
read_varint(Reader *reader, uint64_t *value)
{
    uint64_t result = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (reader->at >= reader->end) {
            return malformed("truncated varint");
        }
        unsigned char byte = *reader->at++;
        result |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80)) {
            *value = result;
            return 0;
        }
    }
    return malformed("varint longer than 10 bytes");
}

/* A length-delimited field's bytes: a sub-reader over them, the reader moved past. */
static int
read_length_delimited(Reader *reader, Reader *inner)
{
    uint64_t size;
    if (read_varint(reader, &size) < 0) {
        return -1;
    }
    if (size > (uint64_t)(reader->end - reader->at)) {
        return malformed("length past the end");
    }
    inner->at = reader->at;
    inner->end = reader->at + size;
    reader->at += size;
    return 0;
}

/* Skip a field this reader does not use (unknown, or a known number with another wire type, which
 * protobuf also keeps as unknown). Groups are rejected: Fluss's messages have none. */
static int
skip_field(Reader *reader, int wire_type)
{
    uint64_t ignored;
    Reader inner;
    switch (wire_type) {
    case WIRE_VARINT:
        return read_varint(reader, &ignored);
    case WIRE_FIXED64:
        if (reader->end - reader->at < 8) {
            return malformed("truncated fixed64");
        }
        reader->at += 8;
        return 0;
    case WIRE_LEN:
        return read_length_delimited(reader, &inner);
    case WIRE_FIXED32:
        if (reader->end - reader->at < 4) {
            return malformed("truncated fixed32");
        }
        reader->at += 4;
        return 0;
    default:
        return malformed("unsupported wire type");
    }
}

static int
read_tag(Reader *reader, int *field, int *wire_type)
{
    uint64_t tag;
    if (read_varint(reader, &tag) < 0) {
        return -1;
    }
    if ((tag >> 3) == 0 || (tag >> 3) > 0x1FFFFFFF) {
        return malformed("field number out of range");
    }
    *field = (int)(tag >> 3);
    *wire_type = (int)(tag & 7);
    return 0;
}

/* A PbValue's bytes: where they start and how many (0: absent or empty, which is no row: a stored value
 * always starts with its schema id). */
static int
value_slice(Reader *reader, const unsigned char **start, size_t *size)
{
    *start = NULL;
    *size = 0;
    while (reader->at < reader->end) {
        int field, wire_type;
        if (read_tag(reader, &field, &wire_type) < 0) {
            return -1;
        }
        if (field == 1 && wire_type == WIRE_LEN) {
            Reader inner;
            if (read_length_delimited(reader, &inner) < 0) {
                return -1;
            }
            *start = inner.at; /* the last occurrence wins, as in protobuf */
            *size = (size_t)(inner.end - inner.at);
        }
        else if (skip_field(reader, wire_type) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject *
value_or_none(const unsigned char *start, size_t size)
{
    if (size == 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)start, (Py_ssize_t)size);
}

/* What one buckets_resp entry holds; the values themselves go to a list when one is given, else only the
 * first is kept (a single lookup's answer). */
typedef struct {
    int64_t bucket_id, partition_id, error_code;
    int has_partition, has_error_code;
    const unsigned char *message_start; /* NULL: no error_message */
    size_t message_size;
    Py_ssize_t value_count;
    const unsigned char *first_value;
    size_t first_value_size;
} BucketEntry;

static int
scan_bucket_entry(Reader *reader, BucketEntry *entry, PyObject *values)
{
    int has_bucket = 0;
    memset(entry, 0, sizeof(*entry));
    while (reader->at < reader->end) {
        int field, wire_type;
        if (read_tag(reader, &field, &wire_type) < 0) {
            return -1;
        }
        uint64_t number;
        Reader inner;
        if (wire_type == WIRE_VARINT && field >= 1 && field <= 3) {
            if (read_varint(reader, &number) < 0) {
                return -1;
            }
            if (field == 1) {
                entry->partition_id = (int64_t)number;
                entry->has_partition = 1;
            }
            else if (field == 2) {
                entry->bucket_id = (int32_t)(uint32_t)number; /* int32: the low 32 bits, as protobuf reads them */
                has_bucket = 1;
            }
            else {
                entry->error_code = (int32_t)(uint32_t)number;
                entry->has_error_code = 1;
            }
        }
        else if (wire_type == WIRE_LEN && field == 4) {
            if (read_length_delimited(reader, &inner) < 0) {
                return -1;
            }
            entry->message_start = inner.at;
            entry->message_size = (size_t)(inner.end - inner.at);
        }
        else if (wire_type == WIRE_LEN && field == 5) {
            const unsigned char *start;
            size_t size;
            if (read_length_delimited(reader, &inner) < 0 || value_slice(&inner, &start, &size) < 0) {
                return -1;
            }
            if (entry->value_count++ == 0) {
                entry->first_value = start;
                entry->first_value_size = size;
            }
            if (values != NULL) {
                PyObject *value = value_or_none(start, size);
                if (value == NULL) {
                    return -1;
                }
                int failed = PyList_Append(values, value) < 0;
                Py_DECREF(value);
                if (failed) {
                    return -1;
                }
            }
        }
        else if (skip_field(reader, wire_type) < 0) {
            return -1;
        }
    }
    if (!has_bucket) {
        return malformed("a bucket entry without its bucket_id");
    }
    return 0;
}

/* An error_message's text: a new reference to a str, or to None when absent (start NULL); ValueError
 * when it is not UTF-8 (a corrupt answer, whichever message carries it). */
static PyObject *
message_text(const unsigned char *start, size_t size)
{
    if (start == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *message = PyUnicode_DecodeUTF8((const char *)start, (Py_ssize_t)size, NULL);
    if (message == NULL) {
        PyErr_Clear();
        malformed("error_message is not UTF-8");
    }
    return message;
}

/* The entry's error_message: a new reference to a str, or to None when absent. */
static PyObject *
entry_message(const BucketEntry *entry)
{
    return message_text(entry->message_start, entry->message_size);
}

/* One buckets_resp entry as (bucket_id, partition_id, error_code, error_message, values). */
static PyObject *
read_bucket_entry(Reader *reader)
{
    BucketEntry entry;
    PyObject *values = PyList_New(0);
    if (values == NULL) {
        return NULL;
    }
    if (scan_bucket_entry(reader, &entry, values) < 0) {
        Py_DECREF(values);
        return NULL;
    }
    PyObject *message = entry_message(&entry);
    if (message == NULL) {
        Py_DECREF(values);
        return NULL;
    }
    PyObject *partition = entry.has_partition ? PyLong_FromLongLong(entry.partition_id) : Py_NewRef(Py_None);
    PyObject *code = entry.has_error_code ? PyLong_FromLongLong(entry.error_code) : Py_NewRef(Py_None);
    if (partition == NULL || code == NULL) {
        Py_XDECREF(partition);
        Py_XDECREF(code);
        Py_DECREF(message);
        Py_DECREF(values);
        return NULL;
    }
    return Py_BuildValue("(LNNNN)", (long long)entry.bucket_id, partition, code, message, values);
}

/* Moves the reader to the next buckets_resp entry of a LookupResponse, skipping other fields: 1 with
 * *entry over its bytes, 0 at the end, -1 with ValueError set. */
static int
next_bucket_entry(Reader *reader, Reader *entry)
{
    while (reader->at < reader->end) {
        int field, wire_type;
        if (read_tag(reader, &field, &wire_type) < 0) {
            return -1;
        }
        if (field == 1 && wire_type == WIRE_LEN) {
            return read_length_delimited(reader, entry) < 0 ? -1 : 1;
        }
        if (skip_field(reader, wire_type) < 0) {
            return -1;
        }
    }
    return 0;
}

/* parse_lookup_response(body) -> [(bucket_id, partition_id, error_code, error_message, values)], one
 * tuple per buckets_resp entry, absent optional fields as None. */
static PyObject *
parse_lookup_response(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Reader reader = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    PyObject *entries = PyList_New(0);
    if (entries == NULL) {
        goto done;
    }
    Reader inner;
    int next;
    while ((next = next_bucket_entry(&reader, &inner)) > 0) {
        PyObject *entry = read_bucket_entry(&inner);
        if (entry == NULL) {
            goto error;
        }
        int failed = PyList_Append(entries, entry) < 0;
        Py_DECREF(entry);
        if (failed) {
            goto error;
        }
    }
    if (next < 0) {
        goto error;
    }
    goto done;
error:
    Py_CLEAR(entries);
done:
    PyBuffer_Release(&view);
    return entries;
}

/* ----------------------------------------------------------------------------- reading a request */

/* One buckets_req entry as (bucket_id, partition_id, [keys]); 1 when it is not a plain one (it names
 * original_partition_name, or lacks bucket_id): the caller then leaves the request to protobuf. */
static int
read_plain_bucket_request(Reader *reader, PyObject **entry)
{
    int64_t bucket_id = 0, partition_id = 0;
    int has_bucket = 0, has_partition = 0;
    PyObject *keys = PyList_New(0);
    if (keys == NULL) {
        return -1;
    }
    while (reader->at < reader->end) {
        int field, wire_type;
        uint64_t number;
        Reader inner;
        if (read_tag(reader, &field, &wire_type) < 0) {
            goto error;
        }
        if (wire_type == WIRE_VARINT && (field == 1 || field == 2)) {
            if (read_varint(reader, &number) < 0) {
                goto error;
            }
            if (field == 1) {
                partition_id = (int64_t)number;
                has_partition = 1;
            }
            else {
                bucket_id = (int32_t)(uint32_t)number;
                has_bucket = 1;
            }
        }
        else if (wire_type == WIRE_LEN && field == 3) {
            if (read_length_delimited(reader, &inner) < 0) {
                goto error;
            }
            PyObject *key = PyBytes_FromStringAndSize((const char *)inner.at, inner.end - inner.at);
            if (key == NULL) {
                goto error;
            }
            int failed = PyList_Append(keys, key) < 0;
            Py_DECREF(key);
            if (failed) {
                goto error;
            }
        }
        else if (wire_type == WIRE_LEN && field == 4) {
            Py_DECREF(keys); /* original_partition_name: a historical lookup */
            return 1;
        }
        else if (skip_field(reader, wire_type) < 0) {
            goto error;
        }
    }
    if (!has_bucket) {
        Py_DECREF(keys);
        return 1;
    }
    PyObject *partition = has_partition ? PyLong_FromLongLong(partition_id) : Py_NewRef(Py_None);
    if (partition == NULL) {
        goto error;
    }
    *entry = Py_BuildValue("(LNN)", (long long)bucket_id, partition, keys);
    return *entry == NULL ? -1 : 0;
error:
    Py_DECREF(keys);
    return -1;
}

/* plain_lookup_request(body) -> (table_id, [(bucket_id, partition_id, [keys])]) for a well-formed
 * LookupRequest that only reads (no insert_if_not_exists, no historical partition), else None: the
 * server's path without protobuf objects, which leaves every other request, malformed ones included, to
 * protobuf and its errors. */
static PyObject *
plain_lookup_request(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Reader reader = {(const unsigned char *)view.buf, (const unsigned char *)view.buf + view.len};
    int64_t table_id = 0;
    int has_table = 0, inserting = 0;
    PyObject *result = NULL;
    PyObject *buckets = PyList_New(0);
    if (buckets == NULL) {
        goto done;
    }
    while (reader.at < reader.end) {
        int field, wire_type;
        uint64_t number;
        Reader inner;
        if (read_tag(&reader, &field, &wire_type) < 0) {
            goto not_plain;
        }
        if (wire_type == WIRE_VARINT && (field == 1 || field == 3)) {
            if (read_varint(&reader, &number) < 0) {
                goto not_plain;
            }
            if (field == 1) {
                table_id = (int64_t)number;
                has_table = 1;
            }
            else {
                inserting = number != 0; /* the last occurrence wins */
            }
        }
        else if (wire_type == WIRE_LEN && field == 2) {
            PyObject *entry = NULL;
            if (read_length_delimited(&reader, &inner) < 0) {
                goto not_plain;
            }
            int read = read_plain_bucket_request(&inner, &entry);
            if (read != 0) {
                if (read < 0 && !PyErr_ExceptionMatches(PyExc_ValueError)) {
                    goto done; /* out of memory: raised */
                }
                goto not_plain;
            }
            int failed = PyList_Append(buckets, entry) < 0;
            Py_DECREF(entry);
            if (failed) {
                goto done;
            }
        }
        else if (skip_field(&reader, wire_type) < 0) {
            goto not_plain;
        }
    }
    if (has_table && !inserting) {
        result = Py_BuildValue("(LO)", (long long)table_id, buckets);
        goto done;
    }
not_plain:
    PyErr_Clear();
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(buckets);
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------- a blocking single lookup */

enum {
    REQUEST_PREFIX_BYTES = 12,  /* length i32, api_key i16, api_version i16, request_id i32 */
    RESPONSE_PREFIX_BYTES = 9,  /* length i32, type i8, request_id i32 */
    RESPONSE_SUCCESS = 0,
    RESPONSE_ERROR = 1,
    RECEIVE_BYTES = 16384,      /* the first read takes up to this much: a lookup's answer in one call */
};
static const int64_t RESPONSE_FRAME_BYTES_MAX = (int64_t)1 << 30;

static void
put_be32(char *out, uint32_t value)
{
    out[0] = (char)(value >> 24);
    out[1] = (char)(value >> 16);
    out[2] = (char)(value >> 8);
    out[3] = (char)value;
}

static uint32_t
be32(const unsigned char *in)
{
    return ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) | ((uint32_t)in[2] << 8) | (uint32_t)in[3];
}

/* 0 when the call may be retried after EINTR (no signal handler raised), -1 with the exception set. */
static int
interrupted(void)
{
    return PyErr_CheckSignals();
}

/* Sends all of data, the GIL released around each system call; -1 with OSError set. */
static int
send_all(int fd, const char *data, size_t size)
{
    while (size > 0) {
        ssize_t sent;
        Py_BEGIN_ALLOW_THREADS
        sent = send(fd, data, size, MSG_NOSIGNAL);
        Py_END_ALLOW_THREADS
        if (sent < 0) {
            if (errno == EINTR && interrupted() == 0) {
                continue;
            }
            if (!PyErr_Occurred()) {
                PyErr_SetFromErrno(PyExc_OSError);
            }
            return -1;
        }
        data += sent;
        size -= (size_t)sent;
    }
    return 0;
}

/* Receives up to size bytes (at least one), the GIL released; the count, or -1 with OSError set (a
 * closed connection is ConnectionResetError). */
static ssize_t
receive_some(int fd, char *into, size_t size)
{
    for (;;) {
        ssize_t got;
        Py_BEGIN_ALLOW_THREADS
        got = recv(fd, into, size, 0);
        Py_END_ALLOW_THREADS
        if (got > 0) {
            return got;
        }
        if (got == 0) {
            PyErr_SetString(PyExc_ConnectionResetError, "the server closed the connection");
            return -1;
        }
        if (errno == EINTR && interrupted() == 0) {
            continue;
        }
        if (!PyErr_Occurred()) {
            PyErr_SetFromErrno(PyExc_OSError);
        }
        return -1;
    }
}

/* An ErrorResponse {1 error_code int32 (required), 2 error_message string} as (error_code, message or
 * None); ValueError when malformed. */
static PyObject *
error_response(Reader reader)
{
    int64_t code = 0;
    int has_code = 0;
    const unsigned char *message_start = NULL;
    size_t message_size = 0;
    while (reader.at < reader.end) {
        int field, wire_type;
        uint64_t number;
        Reader inner;
        if (read_tag(&reader, &field, &wire_type) < 0) {
            return NULL;
        }
        if (field == 1 && wire_type == WIRE_VARINT) {
            if (read_varint(&reader, &number) < 0) {
                return NULL;
            }
            code = (int32_t)(uint32_t)number;
            has_code = 1;
        }
        else if (field == 2 && wire_type == WIRE_LEN) {
            if (read_length_delimited(&reader, &inner) < 0) {
                return NULL;
            }
            message_start = inner.at;
            message_size = (size_t)(inner.end - inner.at);
        }
        else if (skip_field(&reader, wire_type) < 0) {
            return NULL;
        }
    }
    if (!has_code) {
        PyErr_SetString(PyExc_ValueError, "malformed ErrorResponse: no error_code");
        return NULL;
    }
    PyObject *message = message_text(message_size == 0 ? NULL : message_start, message_size);  /* "": None */
    return message == NULL ? NULL : Py_BuildValue("(LN)", (long long)code, message);
}

/* A LookupResponse for one bucket's one key: the value (bytes, or None: no row), or (error_code,
 * error_message) of the bucket's error; ValueError when malformed or not an answer to one key. */
static PyObject *
one_key_answer(Reader reader)
{
    BucketEntry entry = {0}, later; /* the first entry is the answer; any later one is only checked */
    int entries = 0;
    Reader inner;
    int next;
    while ((next = next_bucket_entry(&reader, &inner)) > 0) {
        if (scan_bucket_entry(&inner, entries++ == 0 ? &entry : &later, NULL) < 0) {
            return NULL;
        }
    }
    if (next < 0) {
        return NULL;
    }
    if (entries != 1) {
        PyErr_Format(PyExc_ValueError, "a Lookup for one bucket was answered with %d bucket entries", entries);
        return NULL;
    }
    if (entry.error_code != 0) {
        PyObject *message = entry_message(&entry);
        return message == NULL ? NULL : Py_BuildValue("(LN)", (long long)entry.error_code, message);
    }
    if (entry.value_count != 1) {
        PyErr_Format(PyExc_ValueError, "a Lookup of 1 keys was answered with %zd values", entry.value_count);
        return NULL;
    }
    return value_or_none(entry.first_value, entry.first_value_size);
}

/* lookup_round_trip(fd, api_key, api_version, request_id, table_id, partition_id, bucket_id, key) -> bytes | None
 * | (error_code, error_message): one key of one bucket looked up over a blocking socket, one send and
 * (usually) one receive with the GIL released, no Python object built on the way but the answer. The
 * socket's own kernel timeouts bound both. OSError: the connection failed or carried a frame that does not
 * answer this request (the caller closes it); ValueError: an answer that is malformed or does not fit. */
static PyObject *
lookup_round_trip(PyObject *self, PyObject *args)
{
    int fd, api_key, api_version, bucket_id;
    long long request_id, table_id;
    PyObject *partition_arg, *key;
    if (!PyArg_ParseTuple(args, "iiiLLOiO", &fd, &api_key, &api_version, &request_id, &table_id, &partition_arg,
                          &bucket_id, &key)) {
        return NULL;
    }
    BucketFields fields;
    if (check_key(key) < 0 || bucket_fields(partition_arg, bucket_id, &fields) < 0) {
        return NULL;
    }

    char stack[RECEIVE_BYTES];
    size_t entry_size;
    size_t body_size = lookup_request_size(table_id, &fields, &key, 1, &entry_size);
    size_t frame_size = REQUEST_PREFIX_BYTES + body_size;
    char *request = frame_size <= sizeof(stack) ? stack : PyMem_Malloc(frame_size);
    if (request == NULL) {
        return PyErr_NoMemory();
    }
    put_be32(request, (uint32_t)(frame_size - 4));
    request[4] = (char)((unsigned)api_key >> 8);
    request[5] = (char)(api_key & 0xFF);
    request[6] = (char)((unsigned)api_version >> 8);
    request[7] = (char)(api_version & 0xFF);
    put_be32(request + 8, (uint32_t)request_id);
    put_lookup_request(request + REQUEST_PREFIX_BYTES, table_id, &fields, &key, 1, entry_size);
    int sent = send_all(fd, request, frame_size);
    if (request != stack) {
        PyMem_Free(request);
    }
    if (sent < 0) {
        return NULL;
    }

    /* The answer: one request is in flight, so anything past its frame is a protocol error. */
    char *frame = stack;
    size_t have = 0;
    while (have < 4) {
        ssize_t got = receive_some(fd, stack + have, sizeof(stack) - have);
        if (got < 0) {
            return NULL;
        }
        have += (size_t)got;
    }
    int64_t length = (int32_t)be32((const unsigned char *)stack);
    if (length < RESPONSE_PREFIX_BYTES - 4 || length > RESPONSE_FRAME_BYTES_MAX) {
        PyErr_Format(PyExc_ConnectionError, "malformed response frame of %lld bytes", (long long)length);
        return NULL;
    }
    size_t end = 4 + (size_t)length;
    if (have > end) {
        PyErr_Format(PyExc_ConnectionError, "the server sent %zu bytes no request asked for", have - end);
        return NULL;
    }
    if (end > sizeof(stack)) {
        frame = PyMem_Malloc(end);
        if (frame == NULL) {
            return PyErr_NoMemory();
        }
        memcpy(frame, stack, have);
    }
    PyObject *result = NULL;
    while (have < end) {
        ssize_t got = receive_some(fd, frame + have, end - have);
        if (got < 0) {
            goto done;
        }
        have += (size_t)got;
    }
    uint32_t answered = be32((const unsigned char *)frame + 5);
    if (answered != (uint32_t)request_id) {
        PyErr_Format(PyExc_ConnectionError, "the server answered request %u, expected %lld", answered, request_id);
        goto done;
    }
    Reader body = {(const unsigned char *)frame + RESPONSE_PREFIX_BYTES, (const unsigned char *)frame + end};
    if (frame[4] == RESPONSE_SUCCESS) {
        result = one_key_answer(body);
    }
    else if (frame[4] == RESPONSE_ERROR) {
        result = error_response(body);
    }
    else {
        PyErr_Format(PyExc_ValueError, "unknown response type %d", (int)frame[4]);
    }
done:
    if (frame != stack) {
        PyMem_Free(frame);
    }
    return result;
}

static PyMethodDef methods[] = {
    {"lookup_request", lookup_request, METH_VARARGS, "A LookupRequest for one bucket's keys."},
    {"lookup_bucket_entry", lookup_bucket_entry, METH_VARARGS, "One LookupResponse entry, tag included."},
    {"parse_lookup_response", parse_lookup_response, METH_O, "A LookupResponse's entries as tuples."},
    {"plain_lookup_request", plain_lookup_request, METH_O, "A reading LookupRequest's buckets, else None."},
    {"lookup_round_trip", lookup_round_trip, METH_VARARGS, "One key looked up over a blocking socket."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "strom.rpc._lookupwire",
    .m_doc = "Lookup messages as bytes; use strom.rpc.lookup_wire, not this module.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__lookupwire(void)
{
    return PyModule_Create(&module);
}
