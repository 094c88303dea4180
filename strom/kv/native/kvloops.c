/*
 * strom.kv._kvloops: the per-key loops of a bucket's reads and writes, in C.
 *
 * A PutKv or Lookup batch of 10 000 keys asks the row cache for every key, writes every new value
 * through it, and reads the keys the cache lacks from RocksDB in key order. In Python each of those
 * steps is a bytecode loop over the keys; here each is one call per batch. Python
 * (strom/kv/row_cache.py, strom/kv/kv_tablet.py) keeps every decision and a pure-Python reference of
 * each loop; these functions return exactly what the reference returns.
 *
 * Memory safety: key sequences are snapshotted into tuples (no Python code can resize them under
 * us); borrowed dict values are held with a new reference before any call that could drop them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* len() of a key or value: bytes directly, anything else through the sequence protocol. */
static Py_ssize_t
object_size(PyObject *obj)
{
    if (PyBytes_CheckExact(obj)) {
        return PyBytes_GET_SIZE(obj);
    }
    return PyObject_Size(obj);
}

/* cache_get_many(young, old, keys, room, overhead) -> (values, missing, promoted) */
static PyObject *
cache_get_many(PyObject *self, PyObject *args)
{
    PyObject *young, *old, *keys_arg;
    Py_ssize_t room, overhead;
    if (!PyArg_ParseTuple(args, "O!O!Onn", &PyDict_Type, &young, &PyDict_Type, &old, &keys_arg, &room,
                          &overhead)) {
        return NULL;
    }
    PyObject *keys = PySequence_Tuple(keys_arg);
    if (keys == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    PyObject *values = PyList_New(count);
    PyObject *missing = PyList_New(0);
    Py_ssize_t promoted = 0;
    if (values == NULL || missing == NULL) {
        goto error;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        PyObject *value = PyDict_GetItemWithError(young, key);
        if (value == NULL) {
            if (PyErr_Occurred()) {
                goto error;
            }
            value = PyDict_GetItemWithError(old, key);
            if (value == NULL) {
                if (PyErr_Occurred()) {
                    goto error;
                }
                PyObject *position = PyLong_FromSsize_t(i);
                if (position == NULL || PyList_Append(missing, position) < 0) {
                    Py_XDECREF(position);
                    goto error;
                }
                Py_DECREF(position);
                value = Py_None;
            }
            else {  /* used in this generation: it moves to the young one while there is room */
                Py_ssize_t key_size = object_size(key), value_size = object_size(value);
                if (key_size < 0 || value_size < 0) {
                    goto error;
                }
                Py_ssize_t cost = key_size + value_size + overhead;
                if (promoted + cost <= room) {
                    Py_INCREF(value);
                    int failed = PyDict_SetItem(young, key, value) < 0;
                    Py_DECREF(value);
                    if (failed) {
                        goto error;
                    }
                    promoted += cost;
                }
            }
        }
        Py_INCREF(value);
        PyList_SET_ITEM(values, i, value);
    }
    Py_DECREF(keys);
    return Py_BuildValue("(NNn)", values, missing, promoted);
error:
    Py_DECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(missing);
    return NULL;
}

/* Remove key from dict if present; adds its entry cost to *removed. */
static int
pop_entry(PyObject *dict, PyObject *key, Py_ssize_t key_size, Py_ssize_t overhead, Py_ssize_t *removed)
{
    PyObject *gone = PyDict_GetItemWithError(dict, key);
    if (gone == NULL) {
        return PyErr_Occurred() ? -1 : 0;
    }
    Py_INCREF(gone);
    Py_ssize_t gone_size = object_size(gone);
    int status = (gone_size < 0 || PyDict_DelItem(dict, key) < 0) ? -1 : 0;
    Py_DECREF(gone);
    if (status == 0) {
        *removed += key_size + gone_size + overhead;
    }
    return status;
}

/* Snapshot two sequences as tuples (no Python code can resize them under us); 0, or -1 with an error. */
static int
two_tuples(PyObject *first_arg, PyObject *second_arg, PyObject **first, PyObject **second)
{
    *first = PySequence_Tuple(first_arg);
    if (*first == NULL) {
        return -1;
    }
    *second = PySequence_Tuple(second_arg);
    if (*second == NULL) {
        Py_CLEAR(*first);
        return -1;
    }
    return 0;
}

/* cache_put_many(young, old, keys, values, keep, overhead) -> (young_delta, old_delta) */
static PyObject *
cache_put_many(PyObject *self, PyObject *args)
{
    PyObject *young, *old, *keys_arg, *values_arg;
    int keep;
    Py_ssize_t overhead;
    if (!PyArg_ParseTuple(args, "O!O!OOpn", &PyDict_Type, &young, &PyDict_Type, &old, &keys_arg, &values_arg,
                          &keep, &overhead)) {
        return NULL;
    }
    PyObject *keys, *values;
    if (two_tuples(keys_arg, values_arg, &keys, &values) < 0) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    Py_ssize_t added = 0, removed_young = 0, removed_old = 0;
    if (PyTuple_GET_SIZE(values) != count) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        goto error;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        PyObject *value = PyTuple_GET_ITEM(values, i);
        Py_ssize_t key_size = object_size(key);
        if (key_size < 0) {
            goto error;
        }
        if (value == Py_None || !keep) {
            if (pop_entry(young, key, key_size, overhead, &removed_young) < 0
                || pop_entry(old, key, key_size, overhead, &removed_old) < 0) {
                goto error;
            }
        }
        else {  /* shadows an older value in the old generation */
            Py_ssize_t value_size = object_size(value);
            if (value_size < 0 || PyDict_SetItem(young, key, value) < 0) {
                goto error;
            }
            added += key_size + value_size + overhead;
        }
    }
    Py_DECREF(keys);
    Py_DECREF(values);
    return Py_BuildValue("(nn)", added - removed_young, -removed_old);
error:
    Py_DECREF(keys);
    Py_DECREF(values);
    return NULL;
}

/* entry_bytes(keys, values, overhead) -> int: what storing the batch would charge. */
static PyObject *
entry_bytes(PyObject *self, PyObject *args)
{
    PyObject *keys_arg, *values_arg;
    Py_ssize_t overhead;
    if (!PyArg_ParseTuple(args, "OOn", &keys_arg, &values_arg, &overhead)) {
        return NULL;
    }
    PyObject *keys, *values;
    if (two_tuples(keys_arg, values_arg, &keys, &values) < 0) {
        return NULL;
    }
    Py_ssize_t total = 0;
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t size = object_size(PyTuple_GET_ITEM(keys, i));
        if (size < 0) {
            goto error;
        }
        total += size + overhead;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(values); i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i);
        if (value == Py_None) {
            continue;
        }
        Py_ssize_t size = object_size(value);
        if (size < 0) {
            goto error;
        }
        total += size;
    }
    Py_DECREF(keys);
    Py_DECREF(values);
    return PyLong_FromSsize_t(total);
error:
    Py_DECREF(keys);
    Py_DECREF(values);
    return NULL;
}

/* overlay(values, keys, index) -> None: values[i] = index[keys[i]] wherever keys[i] is in index. */
static PyObject *
overlay(PyObject *self, PyObject *args)
{
    PyObject *values, *keys_arg, *index;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyList_Type, &values, &keys_arg, &PyDict_Type, &index)) {
        return NULL;
    }
    PyObject *keys = PySequence_Tuple(keys_arg);
    if (keys == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != count) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        goto error;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyDict_GetItemWithError(index, PyTuple_GET_ITEM(keys, i));
        if (value == NULL) {
            if (PyErr_Occurred()) {
                goto error;
            }
            continue;
        }
        Py_INCREF(value);
        if (PyList_SetItem(values, i, value) < 0) { /* checks i: a key's __eq__ may have shrunk the list */
            goto error;
        }
    }
    Py_DECREF(keys);
    Py_RETURN_NONE;
error:
    Py_DECREF(keys);
    return NULL;
}

/* index_update(index, keys, values) -> None: index[keys[i]] = values[i] in order (later ones win). */
static PyObject *
index_update(PyObject *self, PyObject *args)
{
    PyObject *index, *keys_arg, *values_arg;
    if (!PyArg_ParseTuple(args, "O!OO", &PyDict_Type, &index, &keys_arg, &values_arg)) {
        return NULL;
    }
    PyObject *keys, *values;
    if (two_tuples(keys_arg, values_arg, &keys, &values) < 0) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    int failed = 0;
    if (PyTuple_GET_SIZE(values) != count) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        failed = 1;
    }
    for (Py_ssize_t i = 0; !failed && i < count; i++) {
        failed = PyDict_SetItem(index, PyTuple_GET_ITEM(keys, i), PyTuple_GET_ITEM(values, i)) < 0;
    }
    Py_DECREF(keys);
    Py_DECREF(values);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}

typedef struct {
    uint64_t prefix; /* the first 8 bytes, big-endian, zero-padded: byte order as an integer */
    const char *data;
    Py_ssize_t size;
    Py_ssize_t position;
} KeyRef;

/* Byte order (a shorter key before its extensions), then position: a stable sort. */
static int
compare_keys(const void *left_arg, const void *right_arg)
{
    const KeyRef *left = left_arg, *right = right_arg;
    Py_ssize_t common = left->size < right->size ? left->size : right->size;
    int order = memcmp(left->data, right->data, (size_t)common);
    if (order != 0) {
        return order;
    }
    if (left->size != right->size) {
        return left->size < right->size ? -1 : 1;
    }
    return left->position < right->position ? -1 : (left->position > right->position ? 1 : 0);
}

/*
 * Sorts refs (positions ascending on entry) by key bytes, then position. A stable LSD radix sort on the
 * 8-byte prefix (one pass per byte, skipping bytes every key shares: a batch of 10 000 short keys takes a
 * few passes instead of ~130 000 indirect comparisons), then a comparison sort of each run of equal
 * prefixes (keys longer than 8 bytes that share them, or zero-padded ones), which tells them apart.
 */
static int
sort_key_refs(KeyRef *refs, Py_ssize_t count)
{
    if (count < 2) {
        return 0;
    }
    KeyRef *scratch = PyMem_Malloc(sizeof(KeyRef) * (size_t)count);
    if (scratch == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    KeyRef *from = refs, *to = scratch;
    for (int shift = 0; shift < 64; shift += 8) {
        Py_ssize_t counts[256] = {0};
        for (Py_ssize_t i = 0; i < count; i++) {
            counts[(from[i].prefix >> shift) & 0xFF]++;
        }
        if (counts[(from[0].prefix >> shift) & 0xFF] == count) {
            continue; /* every key has this byte: the pass would change nothing */
        }
        Py_ssize_t offset = 0;
        for (int digit = 0; digit < 256; digit++) {
            Py_ssize_t size = counts[digit];
            counts[digit] = offset;
            offset += size;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            to[counts[(from[i].prefix >> shift) & 0xFF]++] = from[i];
        }
        KeyRef *swap = from;
        from = to;
        to = swap;
    }
    if (from != refs) {
        memcpy(refs, from, sizeof(KeyRef) * (size_t)count);
    }
    PyMem_Free(scratch);
    for (Py_ssize_t start = 0; start < count;) {
        Py_ssize_t end = start + 1;
        while (end < count && refs[end].prefix == refs[start].prefix) {
            end++;
        }
        if (end - start > 1) {
            qsort(refs + start, (size_t)(end - start), sizeof(KeyRef), compare_keys);
        }
        start = end;
    }
    return 0;
}

/* key_order(keys) -> (sorted_keys, order): the keys in byte order (stable) and, packed as native
 * Py_ssize_t in a bytes object, the position each sorted key came from. Keys must be bytes. */
static PyObject *
key_order(PyObject *self, PyObject *keys_arg)
{
    PyObject *keys = PySequence_Tuple(keys_arg);
    if (keys == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    KeyRef *refs = PyMem_Malloc(sizeof(KeyRef) * (size_t)(count ? count : 1));
    PyObject *sorted = NULL, *order = NULL;
    if (refs == NULL) {
        PyErr_NoMemory();
        goto error;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(key)) {
            PyErr_Format(PyExc_TypeError, "keys must be bytes, not %.100s", Py_TYPE(key)->tp_name);
            goto error;
        }
        refs[i].data = PyBytes_AS_STRING(key);
        refs[i].size = PyBytes_GET_SIZE(key);
        refs[i].position = i;
        uint64_t prefix = 0;
        for (int b = 0; b < 8; b++) {
            prefix = (prefix << 8) | (b < refs[i].size ? (unsigned char)refs[i].data[b] : 0);
        }
        refs[i].prefix = prefix;
    }
    if (sort_key_refs(refs, count) < 0) {
        goto error;
    }
    sorted = PyList_New(count);
    order = PyBytes_FromStringAndSize(NULL, count * (Py_ssize_t)sizeof(Py_ssize_t));
    if (sorted == NULL || order == NULL) {
        goto error;
    }
    Py_ssize_t *positions = (Py_ssize_t *)PyBytes_AS_STRING(order);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, refs[i].position);
        Py_INCREF(key);
        PyList_SET_ITEM(sorted, i, key);
        positions[i] = refs[i].position;
    }
    PyMem_Free(refs);
    Py_DECREF(keys);
    return Py_BuildValue("(NN)", sorted, order);
error:
    PyMem_Free(refs);
    Py_XDECREF(sorted);
    Py_XDECREF(order);
    Py_DECREF(keys);
    return NULL;
}

static PyMethodDef kvloops_methods[] = {
    {"cache_get_many", cache_get_many, METH_VARARGS,
     "cache_get_many(young, old, keys, room, overhead) -> (values, missing, promoted)\n\n"
     "RowCache.get_many's loop over one bucket's generations (see row_cache.py)."},
    {"cache_put_many", cache_put_many, METH_VARARGS,
     "cache_put_many(young, old, keys, values, keep, overhead) -> (young_delta, old_delta)\n\n"
     "RowCache.put_many's loop over one bucket's generations (see row_cache.py)."},
    {"entry_bytes", entry_bytes, METH_VARARGS,
     "entry_bytes(keys, values, overhead) -> int: key and non-None value bytes plus overhead per key."},
    {"overlay", overlay, METH_VARARGS,
     "overlay(values, keys, index) -> None: values[i] = index[keys[i]] wherever the key is in index."},
    {"index_update", index_update, METH_VARARGS,
     "index_update(index, keys, values) -> None: index[keys[i]] = values[i], later positions winning."},
    {"key_order", key_order, METH_O,
     "key_order(keys) -> (sorted_keys, order): a stable byte-order sort and the original positions."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot kvloops_slots[] = {
    {0, NULL},
};

static struct PyModuleDef kvloops_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "strom.kv._kvloops",
    .m_doc = "Per-key loops of the row cache and of RocksDB reads; use strom.kv.row_cache and kv_tablet.",
    .m_size = 0,
    .m_methods = kvloops_methods,
    .m_slots = kvloops_slots,
};

PyMODINIT_FUNC
PyInit__kvloops(void)
{
    return PyModuleDef_Init(&kvloops_module);
}
