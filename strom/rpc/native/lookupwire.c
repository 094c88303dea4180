/*
 * strom.rpc._lookupwire: Fluss's Lookup messages (api key 1016) written and read without protobuf
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

#include <stdint.h>
#include <string.h>

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
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    size_t entry_size = bucket_fields_size(&fields);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "a lookup key must be bytes, not %.100s", Py_TYPE(key)->tp_name);
            Py_DECREF(keys);
            return NULL;
        }
        size_t key_size = (size_t)PyBytes_GET_SIZE(key);
        entry_size += 1 + varint_size(key_size) + key_size;
    }
    size_t total = 1 + varint_size((uint64_t)table_id) + 1 + varint_size(entry_size) + entry_size;
    PyObject *result = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    if (result == NULL) {
        Py_DECREF(keys);
        return NULL;
    }
    char *out = PyBytes_AS_STRING(result);
    out = put_tag(out, 1, WIRE_VARINT);
    out = put_varint(out, (uint64_t)table_id);
    out = put_tag(out, 2, WIRE_LEN);
    out = put_varint(out, entry_size);
    out = put_bucket_fields(out, &fields);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        size_t key_size = (size_t)PyBytes_GET_SIZE(key);
        out = put_tag(out, 3, WIRE_LEN);
        out = put_varint(out, key_size);
        memcpy(out, PyBytes_AS_STRING(key), key_size);
        out += key_size;
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

/* A PbValue's bytes: a new reference to bytes, or to None when absent or empty (a stored value always
 * starts with its schema id, so empty bytes is no row). */
static PyObject *
read_value(Reader *reader)
{
    const unsigned char *start = NULL;
    size_t size = 0;
    while (reader->at < reader->end) {
        int field, wire_type;
        if (read_tag(reader, &field, &wire_type) < 0) {
            return NULL;
        }
        if (field == 1 && wire_type == WIRE_LEN) {
            Reader inner;
            if (read_length_delimited(reader, &inner) < 0) {
                return NULL;
            }
            start = inner.at; /* the last occurrence wins, as in protobuf */
            size = (size_t)(inner.end - inner.at);
        }
        else if (skip_field(reader, wire_type) < 0) {
            return NULL;
        }
    }
    if (start == NULL || size == 0) {
        Py_RETURN_NONE;
    }
    return PyBytes_FromStringAndSize((const char *)start, (Py_ssize_t)size);
}

/* One buckets_resp entry as (bucket_id, partition_id, error_code, error_message, values). */
static PyObject *
read_bucket_entry(Reader *reader)
{
    int64_t bucket_id = 0, partition_id = 0, error_code = 0;
    int has_partition = 0, has_error_code = 0, has_bucket = 0;
    const unsigned char *message_start = NULL;
    size_t message_size = 0;
    PyObject *values = PyList_New(0);
    if (values == NULL) {
        return NULL;
    }
    while (reader->at < reader->end) {
        int field, wire_type;
        if (read_tag(reader, &field, &wire_type) < 0) {
            goto error;
        }
        uint64_t number;
        Reader inner;
        if (wire_type == WIRE_VARINT && field >= 1 && field <= 3) {
            if (read_varint(reader, &number) < 0) {
                goto error;
            }
            if (field == 1) {
                partition_id = (int64_t)number;
                has_partition = 1;
            }
            else if (field == 2) {
                bucket_id = (int32_t)(uint32_t)number; /* int32: the low 32 bits, as protobuf reads them */
                has_bucket = 1;
            }
            else {
                error_code = (int32_t)(uint32_t)number;
                has_error_code = 1;
            }
        }
        else if (wire_type == WIRE_LEN && field == 4) {
            if (read_length_delimited(reader, &inner) < 0) {
                goto error;
            }
            message_start = inner.at;
            message_size = (size_t)(inner.end - inner.at);
        }
        else if (wire_type == WIRE_LEN && field == 5) {
            if (read_length_delimited(reader, &inner) < 0) {
                goto error;
            }
            PyObject *value = read_value(&inner);
            if (value == NULL) {
                goto error;
            }
            int failed = PyList_Append(values, value) < 0;
            Py_DECREF(value);
            if (failed) {
                goto error;
            }
        }
        else if (skip_field(reader, wire_type) < 0) {
            goto error;
        }
    }
    if (!has_bucket) {
        malformed("a bucket entry without its bucket_id");
        goto error;
    }
    PyObject *message;
    if (message_start != NULL) {
        message = PyUnicode_DecodeUTF8((const char *)message_start, (Py_ssize_t)message_size, NULL);
        if (message == NULL) {
            PyErr_Clear();
            malformed("error_message is not UTF-8");
            goto error;
        }
    }
    else {
        message = Py_NewRef(Py_None);
    }
    PyObject *partition = has_partition ? PyLong_FromLongLong(partition_id) : Py_NewRef(Py_None);
    PyObject *code = has_error_code ? PyLong_FromLongLong(error_code) : Py_NewRef(Py_None);
    if (partition == NULL || code == NULL) {
        Py_XDECREF(partition);
        Py_XDECREF(code);
        Py_DECREF(message);
        goto error;
    }
    return Py_BuildValue("(LNNNN)", (long long)bucket_id, partition, code, message, values);
error:
    Py_DECREF(values);
    return NULL;
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
    while (reader.at < reader.end) {
        int field, wire_type;
        if (read_tag(&reader, &field, &wire_type) < 0) {
            goto error;
        }
        if (field == 1 && wire_type == WIRE_LEN) {
            Reader inner;
            if (read_length_delimited(&reader, &inner) < 0) {
                goto error;
            }
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
        else if (skip_field(&reader, wire_type) < 0) {
            goto error;
        }
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

static PyMethodDef methods[] = {
    {"lookup_request", lookup_request, METH_VARARGS, "A LookupRequest for one bucket's keys."},
    {"lookup_bucket_entry", lookup_bucket_entry, METH_VARARGS, "One LookupResponse entry, tag included."},
    {"parse_lookup_response", parse_lookup_response, METH_O, "A LookupResponse's entries as tuples."},
    {"plain_lookup_request", plain_lookup_request, METH_O, "A reading LookupRequest's buckets, else None."},
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
