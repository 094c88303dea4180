/* strom's RocksDB binding (strom.kv._rocksdb): a bucket's database through RocksDB's C API.
 *
 * Why not rocksdict alone: its put and write hold the GIL for the whole call, so a write of a large batch
 * stops every other thread of the server (measured: a spinning thread paused 79-93 % of the call). Here every
 * call that can block (write, multi-get, iterator steps, flush, checkpoint, open, close) runs with the GIL
 * released; a point get first tries the memtables and the block cache with the GIL held (RocksDB's
 * kBlockCacheTier: it never does I/O) and releases the GIL only for the read that must go to a file.
 *
 * One Database holds the default column family (the rows) and "strom_meta" (the applied offset, the row
 * count, the instance id), opened with exactly the options of strom/kv/rocksdb.py, so data written through
 * rocksdict opens here and the other way round. A pthread rwlock keeps close() from running under a call
 * made without the GIL by another thread; close() destroys the iterators still open first (RocksDB requires
 * it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "rocksdb/c.h"

#define META_FAMILY "strom_meta"
#define BLOCK_CACHE_TIER 1 /* rocksdb::ReadTier::kBlockCacheTier */
#define COMPACTION_STYLE_NONE 3 /* rocksdb::kCompactionStyleNone (c.h names the other three only) */
#define HEADER_LEVEL 5 /* rocksdb::InfoLogLevel::HEADER_LEVEL, the highest */
#define RATE_LIMITER_REFILL_US 100000 /* RocksDB's defaults for a GenericRateLimiter */
#define RATE_LIMITER_FAIRNESS 10

static PyObject *RocksDbError;

/* The process's one rate limiter for flushes and compactions (kv.rocksdb.shared-rate-limiter.bytes-per-sec),
 * shared by every database opened with that rate; touched with the GIL held only. A database's options hold
 * their own reference to it (RocksDB's shared_ptr), so replacing it for another rate leaves open databases
 * on the one they were opened with. */
static rocksdb_ratelimiter_t *shared_rate_limiter;
static long long shared_rate_limiter_bytes_per_sec;

static rocksdb_ratelimiter_t *rate_limiter_for(long long bytes_per_sec) {
    if (shared_rate_limiter == NULL || shared_rate_limiter_bytes_per_sec != bytes_per_sec) {
        if (shared_rate_limiter != NULL) {
            rocksdb_ratelimiter_destroy(shared_rate_limiter);
        }
        shared_rate_limiter = rocksdb_ratelimiter_create(bytes_per_sec, RATE_LIMITER_REFILL_US, RATE_LIMITER_FAIRNESS);
        shared_rate_limiter_bytes_per_sec = bytes_per_sec;
    }
    return shared_rate_limiter;
}

/* The ints of a sequence (compression_per_level) in a PyMem buffer; NULL with an exception set. */
static int *int_array(PyObject *sequence, size_t *count) {
    PyObject *items = PySequence_Fast(sequence, "compression_per_level must be a sequence of ints");
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t length = PySequence_Fast_GET_SIZE(items);
    int *values = PyMem_Malloc(sizeof(int) * (size_t)(length > 0 ? length : 1));
    if (values == NULL) {
        Py_DECREF(items);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        long value = PyLong_AsLong(PySequence_Fast_GET_ITEM(items, i));
        if (value == -1 && PyErr_Occurred()) {
            PyMem_Free(values);
            Py_DECREF(items);
            return NULL;
        }
        values[i] = (int)value;
    }
    Py_DECREF(items);
    *count = (size_t)length;
    return values;
}

typedef struct IteratorObject IteratorObject;

typedef struct {
    PyObject_HEAD
    rocksdb_t *db;
    rocksdb_column_family_handle_t *families[2]; /* default, strom_meta */
    rocksdb_options_t *options;
    rocksdb_options_t *meta_options;
    rocksdb_block_based_table_options_t *table_options;
    rocksdb_cache_t *cache;
    rocksdb_filterpolicy_t *filter; /* owned by table_options once set */
    rocksdb_readoptions_t *read;
    rocksdb_readoptions_t *read_cached; /* never does I/O */
    rocksdb_writeoptions_t *write;
    pthread_rwlock_t lock; /* readers: every call; writer: close */
    IteratorObject *iterators; /* open iterators, destroyed by close */
    bool read_only;
} DatabaseObject;

struct IteratorObject {
    PyObject_HEAD
    DatabaseObject *owner; /* strong reference */
    rocksdb_iterator_t *iterator;
    IteratorObject *next_open;
    IteratorObject *previous_open;
};

static PyTypeObject DatabaseType;
static PyTypeObject IteratorType;

/* ------------------------------------------------------------------------------------------ helpers */

static PyObject *raise_rocksdb(char *error) {
    PyErr_SetString(RocksDbError, error);
    rocksdb_free(error);
    return NULL;
}

/* Take the shared lock without the GIL (close() may hold the exclusive one while it waits for nothing). */
static bool enter(DatabaseObject *self) {
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_rdlock(&self->lock);
    Py_END_ALLOW_THREADS
    if (self->db == NULL) {
        pthread_rwlock_unlock(&self->lock);
        PyErr_SetString(RocksDbError, "the database is closed");
        return false;
    }
    return true;
}

static void leave(DatabaseObject *self) { pthread_rwlock_unlock(&self->lock); }

/* A tuple of bytes objects (holding a reference to each, so their buffers outlive a GIL-free call). */
static PyObject *bytes_tuple(PyObject *sequence, const char *what) {
    PyObject *items = PySequence_Tuple(sequence);
    if (items == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyBytes_Check(item) && !(item == Py_None && strcmp(what, "values") == 0)) {
            PyErr_Format(PyExc_TypeError, "%s[%zd] must be bytes%s, not %.100s", what, i,
                         strcmp(what, "values") == 0 ? " or None" : "", Py_TYPE(item)->tp_name);
            Py_DECREF(items);
            return NULL;
        }
    }
    return items;
}

static void free_options(DatabaseObject *self) {
    if (self->read) rocksdb_readoptions_destroy(self->read);
    if (self->read_cached) rocksdb_readoptions_destroy(self->read_cached);
    if (self->write) rocksdb_writeoptions_destroy(self->write);
    if (self->table_options) rocksdb_block_based_options_destroy(self->table_options);
    if (self->cache) rocksdb_cache_destroy(self->cache);
    if (self->meta_options) rocksdb_options_destroy(self->meta_options);
    if (self->options) rocksdb_options_destroy(self->options);
    self->read = self->read_cached = NULL;
    self->write = NULL;
    self->table_options = NULL;
    self->cache = NULL;
    self->meta_options = self->options = NULL;
}

/* ------------------------------------------------------------------------------------------ Database */

static int database_init(DatabaseObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"path", "block_cache_size", "write_buffer_size", "write_buffer_count", "block_size",
                            "bloom_bits_per_key", "memtable_bloom_ratio", "meta_write_buffer_size",
                            "read_only", "max_background_jobs", "max_open_files", "max_log_file_size",
                            "keep_log_file_num", "db_log_dir", "info_log_level", "rate_limit_bytes_per_sec",
                            "compaction_style", "dynamic_level_bytes", "compression_per_level",
                            "target_file_size_base", "max_bytes_for_level_base",
                            "min_write_buffer_number_to_merge", "metadata_block_size",
                            "cache_index_and_filter_blocks", "cache_index_and_filter_blocks_with_high_priority",
                            "pin_l0_filter_and_index_blocks_in_cache", "pin_top_level_index_and_filter",
                            "allow_mmap_reads", "vector_memtable", "max_file_opening_threads", NULL};
    PyObject *path_object;
    unsigned long long block_cache_size = 8 << 20, write_buffer_size = 64 << 20, block_size = 4 << 10;
    unsigned long long meta_write_buffer_size = 64 << 20;
    int write_buffer_count = 2, read_only = 0;
    double bloom_bits = 10.0, memtable_bloom_ratio = 0.1;
    /* the rest: strom's defaults (Fluss's), as RocksDbOptions has them; strom/kv/rocksdb.py passes them all */
    int max_background_jobs = 2, max_open_files = -1, info_log_level = 1, compaction_style = rocksdb_level_compaction;
    int dynamic_level_bytes = 0, min_write_buffer_number_to_merge = 1;
    int cache_index_and_filter_blocks = 0, high_priority = 0, pin_l0 = 0, pin_top_level = 0, allow_mmap_reads = 0;
    int vector_memtable = 0;
    int max_file_opening_threads = 16; /* RocksDB's default */
    unsigned long long max_log_file_size = 25 << 20, keep_log_file_num = 4;
    unsigned long long target_file_size_base = 64 << 20, max_bytes_for_level_base = 256 << 20;
    unsigned long long metadata_block_size = 4 << 10;
    long long rate_limit = 0; /* bytes per second; 0: no limiter */
    const char *db_log_dir = NULL;
    PyObject *compression_per_level = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O&|KKiKddKp$iiKKziLipOKKiKppppppi", names, PyUnicode_FSConverter,
                                     &path_object, &block_cache_size, &write_buffer_size, &write_buffer_count,
                                     &block_size, &bloom_bits, &memtable_bloom_ratio, &meta_write_buffer_size,
                                     &read_only, &max_background_jobs, &max_open_files, &max_log_file_size,
                                     &keep_log_file_num, &db_log_dir, &info_log_level, &rate_limit,
                                     &compaction_style, &dynamic_level_bytes, &compression_per_level,
                                     &target_file_size_base, &max_bytes_for_level_base,
                                     &min_write_buffer_number_to_merge, &metadata_block_size,
                                     &cache_index_and_filter_blocks, &high_priority, &pin_l0, &pin_top_level,
                                     &allow_mmap_reads, &vector_memtable, &max_file_opening_threads)) {
        return -1;
    }
    if (self->db != NULL) {
        Py_DECREF(path_object);
        PyErr_SetString(PyExc_RuntimeError, "the database is already open");
        return -1;
    }
    /* RocksDB takes these enums as ints without checking them */
    if (info_log_level < 0 || info_log_level > HEADER_LEVEL || compaction_style < 0 ||
        compaction_style > COMPACTION_STYLE_NONE || rate_limit < 0 || max_file_opening_threads < 1) {
        Py_DECREF(path_object);
        PyErr_SetString(PyExc_ValueError,
                        "info_log_level, compaction_style, rate_limit_bytes_per_sec or max_file_opening_threads "
                        "out of range");
        return -1;
    }
    int *compressions = NULL;
    size_t compression_levels = 0;
    if (compression_per_level != Py_None &&
        (compressions = int_array(compression_per_level, &compression_levels)) == NULL) {
        Py_DECREF(path_object);
        return -1;
    }
    self->read_only = read_only != 0;
    self->options = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(self->options, 1);
    rocksdb_options_set_create_missing_column_families(self->options, 1);
    /* the changelog is the write-ahead record: every family flushes together (see strom/kv/rocksdb.py) */
    rocksdb_options_set_atomic_flush(self->options, 1);
    rocksdb_options_set_compression(self->options, rocksdb_lz4_compression);
    if (compressions != NULL) {
        rocksdb_options_set_compression_per_level(self->options, compressions, compression_levels);
        PyMem_Free(compressions);
    }
    rocksdb_options_set_write_buffer_size(self->options, (size_t)write_buffer_size);
    rocksdb_options_set_max_write_buffer_number(self->options, write_buffer_count);
    rocksdb_options_set_min_write_buffer_number_to_merge(self->options, min_write_buffer_number_to_merge);
    rocksdb_options_set_max_background_jobs(self->options, max_background_jobs);
    rocksdb_options_set_max_open_files(self->options, max_open_files);
    /* the threads that open the SST files (all of them, with max_open_files -1) while the database opens:
       each is started and joined by the open, files or not (strom/kv/rocksdb.py sizes them) */
    rocksdb_options_set_max_file_opening_threads(self->options, max_file_opening_threads);
    rocksdb_options_set_allow_mmap_reads(self->options, (unsigned char)allow_mmap_reads);
    rocksdb_options_set_max_log_file_size(self->options, (size_t)max_log_file_size);
    rocksdb_options_set_keep_log_file_num(self->options, (size_t)keep_log_file_num);
    if (db_log_dir != NULL) {
        rocksdb_options_set_db_log_dir(self->options, db_log_dir);
    }
    rocksdb_options_set_info_log_level(self->options, info_log_level);
    /* Fluss's DBOptions: no periodic stats dump. RocksDB's (every 600 s, the first ones seconds after the
       process's first opens) collects block-cache statistics on its timer thread for every bucket */
    rocksdb_options_set_stats_dump_period_sec(self->options, 0);
    if (rate_limit > 0) {
        rocksdb_options_set_ratelimiter(self->options, rate_limiter_for(rate_limit));
    }
    rocksdb_options_set_compaction_style(self->options, compaction_style);
    rocksdb_options_set_level_compaction_dynamic_level_bytes(self->options, (unsigned char)dynamic_level_bytes);
    rocksdb_options_set_target_file_size_base(self->options, target_file_size_base);
    rocksdb_options_set_max_bytes_for_level_base(self->options, max_bytes_for_level_base);
    self->table_options = rocksdb_block_based_options_create();
    self->cache = rocksdb_cache_create_lru((size_t)block_cache_size);
    rocksdb_block_based_options_set_block_cache(self->table_options, self->cache);
    rocksdb_block_based_options_set_block_size(self->table_options, (size_t)block_size);
    rocksdb_block_based_options_set_metadata_block_size(self->table_options, metadata_block_size);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks(self->table_options,
                                                                  (unsigned char)cache_index_and_filter_blocks);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks_with_high_priority(self->table_options,
                                                                                     (unsigned char)high_priority);
    rocksdb_block_based_options_set_pin_l0_filter_and_index_blocks_in_cache(self->table_options,
                                                                            (unsigned char)pin_l0);
    rocksdb_block_based_options_set_pin_top_level_index_and_filter(self->table_options, (unsigned char)pin_top_level);
    if (bloom_bits > 0) {
        rocksdb_block_based_options_set_filter_policy(self->table_options, rocksdb_filterpolicy_create_bloom(bloom_bits));
    }
    if (vector_memtable) {
        /* an insert appends; the memtable is sorted once, when it is flushed (strom/kv/rocksdb.py says when) */
        rocksdb_options_set_memtable_vector_rep(self->options);
        rocksdb_options_set_allow_concurrent_memtable_write(self->options, 0);
    } else if (bloom_bits > 0) {
        rocksdb_options_set_memtable_prefix_bloom_size_ratio(self->options, memtable_bloom_ratio);
        rocksdb_options_set_memtable_whole_key_filtering(self->options, 1);
    }
    rocksdb_options_set_block_based_table_factory(self->options, self->table_options);
    self->meta_options = rocksdb_options_create();
    rocksdb_options_set_write_buffer_size(self->meta_options, (size_t)meta_write_buffer_size);
    self->read = rocksdb_readoptions_create();
    self->read_cached = rocksdb_readoptions_create();
    rocksdb_readoptions_set_read_tier(self->read_cached, BLOCK_CACHE_TIER);
    self->write = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(self->write, 1);

    const char *family_names[2] = {"default", META_FAMILY};
    const rocksdb_options_t *family_options[2] = {self->options, self->meta_options};
    const char *path = PyBytes_AS_STRING(path_object);
    char *error = NULL;
    rocksdb_t *db;
    Py_BEGIN_ALLOW_THREADS
    if (self->read_only) {
        db = rocksdb_open_for_read_only_column_families(self->options, path, 2, family_names, family_options,
                                                        self->families, 0, &error);
    } else {
        db = rocksdb_open_column_families(self->options, path, 2, family_names, family_options, self->families,
                                          &error);
    }
    Py_END_ALLOW_THREADS
    Py_DECREF(path_object);
    if (error != NULL) {
        free_options(self);
        raise_rocksdb(error);
        return -1;
    }
    self->db = db;
    return 0;
}

static PyObject *database_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    DatabaseObject *self = (DatabaseObject *)type->tp_alloc(type, 0);
    if (self != NULL && pthread_rwlock_init(&self->lock, NULL) != 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

static void close_iterator(IteratorObject *it);

/* Close under the exclusive lock: no other thread is inside a RocksDB call then (each holds the shared lock
 * for its call). Taken without the GIL; iterators are closed with it (their list is the GIL's), and RocksDB's
 * close, which waits for background work, runs without it. A thread holding the GIL never waits on the lock,
 * so this cannot deadlock. */
static void close_database(DatabaseObject *self) {
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&self->lock);
    Py_END_ALLOW_THREADS
    while (self->iterators != NULL) {
        close_iterator(self->iterators);
    }
    rocksdb_t *db = self->db;
    if (db != NULL) {
        self->db = NULL;
        Py_BEGIN_ALLOW_THREADS
        rocksdb_column_family_handle_destroy(self->families[0]);
        rocksdb_column_family_handle_destroy(self->families[1]);
        rocksdb_close(db);
        Py_END_ALLOW_THREADS
    }
    pthread_rwlock_unlock(&self->lock);
    free_options(self);
}

static void database_dealloc(DatabaseObject *self) {
    close_database(self);
    pthread_rwlock_destroy(&self->lock);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *database_close(DatabaseObject *self, PyObject *unused) {
    close_database(self);
    Py_RETURN_NONE;
}

static PyObject *get_in(DatabaseObject *self, int family, PyObject *key_object) {
    char *key;
    Py_ssize_t key_length;
    if (PyBytes_AsStringAndSize(key_object, &key, &key_length) < 0) {
        return NULL;
    }
    if (!enter(self)) {
        return NULL;
    }
    char *error = NULL;
    rocksdb_pinnableslice_t *found =
        rocksdb_get_pinned_cf(self->db, self->read_cached, self->families[family], key, (size_t)key_length, &error);
    if (error != NULL && strncmp(error, "Result incomplete", 17) == 0) {
        /* not in a memtable or the block cache: the read goes to a file, without the GIL */
        rocksdb_free(error);
        error = NULL;
        Py_BEGIN_ALLOW_THREADS
        found = rocksdb_get_pinned_cf(self->db, self->read, self->families[family], key, (size_t)key_length, &error);
        Py_END_ALLOW_THREADS
    }
    leave(self);
    if (error != NULL) {
        return raise_rocksdb(error);
    }
    if (found == NULL) {
        Py_RETURN_NONE;
    }
    size_t length;
    const char *value = rocksdb_pinnableslice_value(found, &length);
    PyObject *result = PyBytes_FromStringAndSize(value, (Py_ssize_t)length);
    rocksdb_pinnableslice_destroy(found);
    return result;
}

static PyObject *database_get(DatabaseObject *self, PyObject *key) { return get_in(self, 0, key); }

static PyObject *database_get_meta(DatabaseObject *self, PyObject *key) { return get_in(self, 1, key); }

static PyObject *database_put_meta(DatabaseObject *self, PyObject *args) {
    const char *key, *value;
    Py_ssize_t key_length, value_length;
    if (!PyArg_ParseTuple(args, "y#y#", &key, &key_length, &value, &value_length)) {
        return NULL;
    }
    if (!enter(self)) {
        return NULL;
    }
    char *error = NULL;
    Py_BEGIN_ALLOW_THREADS
    rocksdb_put_cf(self->db, self->write, self->families[1], key, (size_t)key_length, value, (size_t)value_length,
                   &error);
    Py_END_ALLOW_THREADS
    leave(self);
    if (error != NULL) {
        return raise_rocksdb(error);
    }
    Py_RETURN_NONE;
}

/* multi_get(keys, sorted=False) -> list of bytes or None, in the order of keys */
static PyObject *database_multi_get(DatabaseObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"keys", "sorted", NULL};
    PyObject *keys_object;
    int sorted = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p", names, &keys_object, &sorted)) {
        return NULL;
    }
    PyObject *keys = bytes_tuple(keys_object, "keys");
    if (keys == NULL) {
        return NULL;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(keys);
    PyObject *result = PyList_New(count);
    if (result == NULL || count == 0) {
        Py_DECREF(keys);
        return result;
    }
    const char **key_pointers = PyMem_Malloc(sizeof(char *) * (size_t)count);
    size_t *key_lengths = PyMem_Malloc(sizeof(size_t) * (size_t)count);
    rocksdb_pinnableslice_t **values = PyMem_Calloc((size_t)count, sizeof(rocksdb_pinnableslice_t *));
    char **errors = PyMem_Calloc((size_t)count, sizeof(char *));
    if (key_pointers == NULL || key_lengths == NULL || values == NULL || errors == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i);
        key_pointers[i] = PyBytes_AS_STRING(key);
        key_lengths[i] = (size_t)PyBytes_GET_SIZE(key);
    }
    if (!enter(self)) {
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    rocksdb_batched_multi_get_cf(self->db, self->read, self->families[0], (size_t)count, key_pointers, key_lengths,
                                 values, errors, sorted != 0);
    Py_END_ALLOW_THREADS
    leave(self);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (errors[i] != NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(RocksDbError, errors[i]);
            }
            continue;
        }
        PyObject *item;
        if (values[i] == NULL) {
            item = Py_NewRef(Py_None);
        } else {
            size_t length;
            const char *value = rocksdb_pinnableslice_value(values[i], &length);
            item = PyBytes_FromStringAndSize(value, (Py_ssize_t)length);
            if (item == NULL) {
                item = Py_NewRef(Py_None); /* the error is set; the list is dropped below */
            }
        }
        PyList_SET_ITEM(result, i, item);
    }
done:
    if (values != NULL) {
        for (Py_ssize_t i = 0; i < count; i++) {
            if (values[i] != NULL) rocksdb_pinnableslice_destroy(values[i]);
            if (errors != NULL && errors[i] != NULL) rocksdb_free(errors[i]);
        }
    }
    PyMem_Free(key_pointers);
    PyMem_Free(key_lengths);
    PyMem_Free(values);
    PyMem_Free(errors);
    Py_DECREF(keys);
    if (PyErr_Occurred()) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

/* write(keys, values, meta_keys, meta_values): one atomic batch (a None value deletes its key); the batch is
 * built and written without the GIL. */
static PyObject *database_write(DatabaseObject *self, PyObject *args) {
    PyObject *keys_object, *values_object, *meta_keys_object, *meta_values_object;
    if (!PyArg_ParseTuple(args, "OOOO", &keys_object, &values_object, &meta_keys_object, &meta_values_object)) {
        return NULL;
    }
    PyObject *keys = bytes_tuple(keys_object, "keys");
    PyObject *values = keys ? bytes_tuple(values_object, "values") : NULL;
    PyObject *meta_keys = values ? bytes_tuple(meta_keys_object, "meta_keys") : NULL;
    PyObject *meta_values = meta_keys ? bytes_tuple(meta_values_object, "meta_values") : NULL;
    PyObject *result = NULL;
    if (meta_values == NULL) {
        goto done;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(keys), meta_count = PyTuple_GET_SIZE(meta_keys);
    if (PyTuple_GET_SIZE(values) != count || PyTuple_GET_SIZE(meta_values) != meta_count) {
        PyErr_SetString(PyExc_ValueError, "keys and values differ in length");
        goto done;
    }
    if (self->read_only) {
        PyErr_SetString(RocksDbError, "the database is open read-only");
        goto done;
    }
    if (!enter(self)) {
        goto done;
    }
    char *error = NULL;
    size_t reserve = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *value = PyTuple_GET_ITEM(values, i);
        reserve += (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(keys, i)) + 16 +
                   (value == Py_None ? 0 : (size_t)PyBytes_GET_SIZE(value));
    }
    Py_BEGIN_ALLOW_THREADS
    rocksdb_writebatch_t *batch = rocksdb_writebatch_create_with_params(reserve + 64 * (size_t)meta_count + 64, 0, 0, 0);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyTuple_GET_ITEM(keys, i), *value = PyTuple_GET_ITEM(values, i);
        if (value == Py_None) {
            rocksdb_writebatch_delete_cf(batch, self->families[0], PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
        } else {
            rocksdb_writebatch_put_cf(batch, self->families[0], PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                                      PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
        }
    }
    for (Py_ssize_t i = 0; i < meta_count; i++) {
        PyObject *key = PyTuple_GET_ITEM(meta_keys, i), *value = PyTuple_GET_ITEM(meta_values, i);
        rocksdb_writebatch_put_cf(batch, self->families[1], PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key),
                                  PyBytes_AS_STRING(value), (size_t)PyBytes_GET_SIZE(value));
    }
    rocksdb_write(self->db, self->write, batch, &error);
    rocksdb_writebatch_destroy(batch);
    Py_END_ALLOW_THREADS
    leave(self);
    if (error != NULL) {
        raise_rocksdb(error);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    Py_XDECREF(meta_keys);
    Py_XDECREF(meta_values);
    return result;
}

/* flush(): the memtables of both families to SST files, together (atomic flush), waiting for it */
static PyObject *database_flush(DatabaseObject *self, PyObject *unused) {
    if (!enter(self)) {
        return NULL;
    }
    char *error = NULL;
    Py_BEGIN_ALLOW_THREADS
    rocksdb_flushoptions_t *options = rocksdb_flushoptions_create();
    rocksdb_flushoptions_set_wait(options, 1);
    rocksdb_flush_cfs(self->db, options, self->families, 2, &error);
    rocksdb_flushoptions_destroy(options);
    Py_END_ALLOW_THREADS
    leave(self);
    if (error != NULL) {
        return raise_rocksdb(error);
    }
    Py_RETURN_NONE;
}

/* checkpoint(directory): hard links of the SST files (and copies of the rest) in a new directory */
static PyObject *database_checkpoint(DatabaseObject *self, PyObject *arg) {
    PyObject *path_object;
    if (!PyUnicode_FSConverter(arg, &path_object)) {
        return NULL;
    }
    if (!enter(self)) {
        Py_DECREF(path_object);
        return NULL;
    }
    char *error = NULL;
    const char *path = PyBytes_AS_STRING(path_object);
    Py_BEGIN_ALLOW_THREADS
    rocksdb_checkpoint_t *checkpoint = rocksdb_checkpoint_object_create(self->db, &error);
    if (error == NULL) {
        rocksdb_checkpoint_create(checkpoint, path, 0, &error);
        rocksdb_checkpoint_object_destroy(checkpoint);
    }
    Py_END_ALLOW_THREADS
    leave(self);
    Py_DECREF(path_object);
    if (error != NULL) {
        return raise_rocksdb(error);
    }
    Py_RETURN_NONE;
}

static PyObject *database_property(DatabaseObject *self, PyObject *arg) {
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || !enter(self)) {
        return NULL;
    }
    char *value = rocksdb_property_value(self->db, name);
    leave(self);
    if (value == NULL) {
        Py_RETURN_NONE;
    }
    PyObject *result = PyUnicode_FromString(value);
    rocksdb_free(value);
    return result;
}

static PyObject *database_iterator(DatabaseObject *self, PyObject *args) {
    const char *start = NULL;
    Py_ssize_t start_length = 0;
    if (!PyArg_ParseTuple(args, "|z#", &start, &start_length)) {
        return NULL;
    }
    if (!enter(self)) {
        return NULL;
    }
    IteratorObject *it = PyObject_New(IteratorObject, &IteratorType);
    if (it == NULL) {
        leave(self);
        return NULL;
    }
    it->iterator = NULL;
    it->owner = NULL;
    it->next_open = it->previous_open = NULL;
    /* created now: the iterator sees the database as of this moment, whatever is written later */
    Py_BEGIN_ALLOW_THREADS
    it->iterator = rocksdb_create_iterator_cf(self->db, self->read, self->families[0]);
    if (start == NULL) {
        rocksdb_iter_seek_to_first(it->iterator);
    } else {
        rocksdb_iter_seek(it->iterator, start, (size_t)start_length);
    }
    Py_END_ALLOW_THREADS
    leave(self);
    it->owner = (DatabaseObject *)Py_NewRef(self);
    it->next_open = self->iterators;
    if (self->iterators != NULL) {
        self->iterators->previous_open = it;
    }
    self->iterators = it;
    return (PyObject *)it;
}

static PyObject *destroy_database(PyObject *module, PyObject *arg) {
    PyObject *path_object;
    if (!PyUnicode_FSConverter(arg, &path_object)) {
        return NULL;
    }
    char *error = NULL;
    const char *path = PyBytes_AS_STRING(path_object);
    Py_BEGIN_ALLOW_THREADS
    rocksdb_options_t *options = rocksdb_options_create();
    rocksdb_destroy_db(options, path, &error);
    rocksdb_options_destroy(options);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_object);
    if (error != NULL) {
        return raise_rocksdb(error);
    }
    Py_RETURN_NONE;
}

static PyMethodDef database_methods[] = {
    {"get", (PyCFunction)database_get, METH_O, "get(key) -> bytes or None (the rows' column family)"},
    {"multi_get", (PyCFunction)(void (*)(void))database_multi_get, METH_VARARGS | METH_KEYWORDS,
     "multi_get(keys, sorted=False) -> list of bytes or None, without the GIL"},
    {"get_meta", (PyCFunction)database_get_meta, METH_O, "get_meta(key) -> bytes or None (strom_meta)"},
    {"put_meta", (PyCFunction)database_put_meta, METH_VARARGS, "put_meta(key, value) into strom_meta"},
    {"write", (PyCFunction)database_write, METH_VARARGS,
     "write(keys, values, meta_keys, meta_values): one atomic batch (None deletes), built and written without "
     "the GIL"},
    {"flush", (PyCFunction)database_flush, METH_NOARGS, "flush both column families' memtables, atomically"},
    {"checkpoint", (PyCFunction)database_checkpoint, METH_O, "checkpoint(directory): a hard-linked copy"},
    {"property", (PyCFunction)database_property, METH_O, "property(name) -> str or None"},
    {"iterator", (PyCFunction)database_iterator, METH_VARARGS,
     "iterator(start=None): rows in key order from start, as of now"},
    {"close", (PyCFunction)database_close, METH_NOARGS, "close (open iterators are closed first); idempotent"},
    {NULL, NULL, 0, NULL},
};

static PyObject *database_closed(DatabaseObject *self, void *unused) { return PyBool_FromLong(self->db == NULL); }

static PyGetSetDef database_getset[] = {
    {"closed", (getter)database_closed, NULL, "whether close() ran", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DatabaseType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "strom.kv._rocksdb.Database",
    .tp_basicsize = sizeof(DatabaseObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Database(path, *, block_cache_size, write_buffer_size, write_buffer_count, block_size, "
              "bloom_bits_per_key, memtable_bloom_ratio, meta_write_buffer_size, read_only, max_background_jobs, "
              "max_open_files, max_log_file_size, keep_log_file_num, db_log_dir, info_log_level, "
              "rate_limit_bytes_per_sec, compaction_style, dynamic_level_bytes, compression_per_level, "
              "target_file_size_base, max_bytes_for_level_base, min_write_buffer_number_to_merge, "
              "metadata_block_size, cache_index_and_filter_blocks, cache_index_and_filter_blocks_with_high_priority, "
              "pin_l0_filter_and_index_blocks_in_cache, pin_top_level_index_and_filter, allow_mmap_reads, "
              "vector_memtable, max_file_opening_threads): a bucket's RocksDB",
    .tp_new = database_new,
    .tp_init = (initproc)database_init,
    .tp_dealloc = (destructor)database_dealloc,
    .tp_methods = database_methods,
    .tp_getset = database_getset,
};

/* ------------------------------------------------------------------------------------------ Iterator */

static void close_iterator(IteratorObject *it) {
    if (it->iterator == NULL) {
        return;
    }
    rocksdb_iter_destroy(it->iterator);
    it->iterator = NULL;
    DatabaseObject *owner = it->owner;
    if (it->previous_open != NULL) {
        it->previous_open->next_open = it->next_open;
    } else {
        owner->iterators = it->next_open;
    }
    if (it->next_open != NULL) {
        it->next_open->previous_open = it->previous_open;
    }
    it->next_open = it->previous_open = NULL;
}

static void iterator_dealloc(IteratorObject *it) {
    close_iterator(it);
    Py_XDECREF(it->owner);
    PyObject_Free(it);
}

typedef struct {
    char *data;
    size_t used, capacity;
    size_t *offsets; /* per entry: key offset, key length, value offset, value length */
    size_t entries, entries_capacity;
} Chunk;

static bool chunk_add(Chunk *chunk, const char *key, size_t key_length, const char *value, size_t value_length) {
    if (chunk->entries == chunk->entries_capacity) {
        size_t capacity = chunk->entries_capacity ? chunk->entries_capacity * 2 : 64;
        size_t *offsets = realloc(chunk->offsets, capacity * 4 * sizeof(size_t));
        if (offsets == NULL) return false;
        chunk->offsets = offsets;
        chunk->entries_capacity = capacity;
    }
    size_t need = chunk->used + key_length + value_length;
    if (need > chunk->capacity) {
        size_t capacity = chunk->capacity ? chunk->capacity : 1 << 16;
        while (capacity < need) capacity *= 2;
        char *data = realloc(chunk->data, capacity);
        if (data == NULL) return false;
        chunk->data = data;
        chunk->capacity = capacity;
    }
    size_t *entry = chunk->offsets + 4 * chunk->entries++;
    entry[0] = chunk->used;
    entry[1] = key_length;
    memcpy(chunk->data + chunk->used, key, key_length);
    chunk->used += key_length;
    entry[2] = chunk->used;
    entry[3] = value_length;
    memcpy(chunk->data + chunk->used, value, value_length);
    chunk->used += value_length;
    return true;
}

/* next(count, prefix=None, bytes_max=0, keys=True): up to count rows from the current position, copied out
 * without the GIL; stops before a key without the prefix (and then stays there) and once the values read
 * pass bytes_max (when not 0; the row that passes it is included). A list of (key, value) tuples, or of
 * values when keys is False; an empty list at the end. */
static PyObject *iterator_next(IteratorObject *it, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"count", "prefix", "bytes_max", "keys", NULL};
    Py_ssize_t count;
    const char *prefix = NULL;
    Py_ssize_t prefix_length = 0;
    unsigned long long bytes_max = 0;
    int with_keys = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n|z#Kp", names, &count, &prefix, &prefix_length, &bytes_max,
                                     &with_keys)) {
        return NULL;
    }
    DatabaseObject *owner = it->owner;
    if (!enter(owner)) {
        return NULL;
    }
    if (it->iterator == NULL) { /* checked under the lock: close() destroys iterators holding it */
        leave(owner);
        PyErr_SetString(RocksDbError, "the iterator is closed");
        return NULL;
    }
    Chunk chunk = {0};
    bool out_of_memory = false;
    char *error = NULL;
    Py_BEGIN_ALLOW_THREADS
    unsigned long long read = 0;
    while ((Py_ssize_t)chunk.entries < count && rocksdb_iter_valid(it->iterator)) {
        size_t key_length, value_length;
        const char *key = rocksdb_iter_key(it->iterator, &key_length);
        if (prefix != NULL &&
            (key_length < (size_t)prefix_length || memcmp(key, prefix, (size_t)prefix_length) != 0)) {
            break;
        }
        const char *value = rocksdb_iter_value(it->iterator, &value_length);
        if (!chunk_add(&chunk, key, with_keys ? key_length : 0, value, value_length)) {
            out_of_memory = true;
            break;
        }
        rocksdb_iter_next(it->iterator);
        read += value_length;
        if (bytes_max != 0 && read > bytes_max) {
            break;
        }
    }
    rocksdb_iter_get_error(it->iterator, &error);
    Py_END_ALLOW_THREADS
    leave(owner);
    PyObject *result = NULL;
    if (error != NULL) {
        raise_rocksdb(error);
    } else if (out_of_memory) {
        PyErr_NoMemory();
    } else if ((result = PyList_New((Py_ssize_t)chunk.entries)) != NULL) {
        for (size_t i = 0; i < chunk.entries; i++) {
            size_t *entry = chunk.offsets + 4 * i;
            PyObject *value = PyBytes_FromStringAndSize(chunk.data + entry[2], (Py_ssize_t)entry[3]);
            PyObject *item = value;
            if (value != NULL && with_keys) {
                PyObject *key = PyBytes_FromStringAndSize(chunk.data + entry[0], (Py_ssize_t)entry[1]);
                item = key ? PyTuple_Pack(2, key, value) : NULL;
                Py_XDECREF(key);
                Py_DECREF(value);
            }
            if (item == NULL) {
                Py_CLEAR(result);
                break;
            }
            PyList_SET_ITEM(result, (Py_ssize_t)i, item);
        }
    }
    free(chunk.data);
    free(chunk.offsets);
    return result;
}

static PyObject *iterator_close(IteratorObject *it, PyObject *unused) {
    DatabaseObject *owner = it->owner;
    Py_BEGIN_ALLOW_THREADS
    pthread_rwlock_wrlock(&owner->lock);
    Py_END_ALLOW_THREADS
    close_iterator(it);
    pthread_rwlock_unlock(&owner->lock);
    Py_RETURN_NONE;
}

static PyMethodDef iterator_methods[] = {
    {"next", (PyCFunction)(void (*)(void))iterator_next, METH_VARARGS | METH_KEYWORDS,
     "next(count, prefix=None, bytes_max=0, keys=True) -> list of (key, value) or of values"},
    {"close", (PyCFunction)iterator_close, METH_NOARGS, "release the iterator's view now"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject IteratorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "strom.kv._rocksdb.Iterator",
    .tp_basicsize = sizeof(IteratorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Rows in key order as of the iterator's creation (Database.iterator)",
    .tp_dealloc = (destructor)iterator_dealloc,
    .tp_methods = iterator_methods,
};

/* ------------------------------------------------------------------------------------------ module */

static PyMethodDef module_methods[] = {
    {"destroy", destroy_database, METH_O, "destroy(path): remove a closed database's files"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "strom.kv._rocksdb", "strom's RocksDB binding over RocksDB's C API", -1, module_methods,
};

PyMODINIT_FUNC PyInit__rocksdb(void) {
    if (PyType_Ready(&DatabaseType) < 0 || PyType_Ready(&IteratorType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    RocksDbError = PyErr_NewException("strom.kv._rocksdb.RocksDbError", PyExc_OSError, NULL);
    if (PyModule_AddObjectRef(m, "RocksDbError", RocksDbError) < 0 ||
        PyModule_AddObjectRef(m, "Database", (PyObject *)&DatabaseType) < 0 ||
        PyModule_AddStringConstant(m, "ROCKSDB_VERSION", "9.10.0") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
