/* The compiled record decoder: Kafka record batches -> Arrow column buffers (docs/decoder.md).
 *
 * Pure: byte buffers in, byte buffers out; no I/O, no Python object per record. The Python side
 * (rlm/formats/records/native.py) decompresses a batch's block, calls Builder.add_v2 per batch
 * and wraps what Builder.take returns with pyarrow.Array.from_buffers.
 *
 * Acceptance equals the pure-Python reference (rlm/formats/records/decode.py): a batch the
 * reference rejects is rejected here (add_* returns ERR_FRAMING and rolls the builder back), and
 * the caller re-runs the reference to raise its exact error. Every read is bounded by the record's
 * own length prefix, itself bounded by the buffer: nothing is read outside [start, end).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

#include "_columns_wire.h"     /* varints, UTF-8, v0/v1 messages, the row window, error codes */
#include "_columns_objects.h"  /* records_v2: Record objects for decode_records */

typedef struct {
    char *p;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int buf_grow(Buf *b, Py_ssize_t extra) {
    Py_ssize_t need = b->len + extra;
    Py_ssize_t cap = b->cap ? b->cap : 4096;
    while (cap < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_reserve(Buf *b, Py_ssize_t extra) {
    return (b->len + extra <= b->cap) ? 0 : buf_grow(b, extra);
}

/* Callers reserve first. */
static inline void put_i64(Buf *b, int64_t v) { memcpy(b->p + b->len, &v, 8); b->len += 8; }
static inline void put_i32(Buf *b, int32_t v) { memcpy(b->p + b->len, &v, 4); b->len += 4; }
static inline void put_u8(Buf *b, uint8_t v) { b->p[b->len++] = (char)v; }
static inline int32_t get_i32(const Buf *b, Py_ssize_t i) { int32_t v; memcpy(&v, b->p + 4 * i, 4); return v; }

/* A variable-length column: per-item validity bytes (1 = valid; packed to a bitmap by take),
 * int32 end offsets (the leading 0 is implicit) and the bytes. */
typedef struct {
    Buf valid;
    Buf ends;
    Buf data;
} VarCol;

static inline int var_append(VarCol *c, const uint8_t *src, Py_ssize_t n, int is_null) {
    if (buf_reserve(&c->valid, 1) < 0 || buf_reserve(&c->ends, 4) < 0) return ERR_NOMEM;
    if (!is_null) {
        if (c->data.len + n > INT32_MAX) return ERR_TOO_BIG;
        if (buf_reserve(&c->data, n) < 0) return ERR_NOMEM;
        memcpy(c->data.p + c->data.len, src, (size_t)n);
        c->data.len += n;
    }
    put_u8(&c->valid, is_null ? 0 : 1);
    put_i32(&c->ends, (int32_t)c->data.len);
    return 0;
}

typedef struct {
    PyObject_HEAD
    int range_err; /* a kept row of the batch being added had an out-of-range timestamp */
    Py_ssize_t rows;
    Buf offsets;   /* int64 per row */
    Buf stamps;    /* int64 per row, microseconds since the epoch */
    Buf types;     /* int32 per row: -1 none, 0 CreateTime, 1 LogAppendTime */
    VarCol key;    /* per row */
    VarCol value;  /* per row */
    Buf hvalid;    /* uint8 per row: 0 = no headers (null list) */
    Buf hends;     /* int32 per row: running header count */
    VarCol hkey;   /* per header (never null) */
    VarCol hval;   /* per header */
} Builder;

#define NBUFS 17

/* Every buffer, to mark their lengths and roll a rejected batch back. */
static void bufs_of(Builder *b, Buf **out) {
    Buf *list[NBUFS] = {&b->offsets, &b->stamps, &b->types, &b->key.valid, &b->key.ends, &b->key.data,
                        &b->value.valid, &b->value.ends, &b->value.data, &b->hvalid, &b->hends,
                        &b->hkey.valid, &b->hkey.ends, &b->hkey.data, &b->hval.valid, &b->hval.ends,
                        &b->hval.data};
    memcpy(out, list, sizeof(list));
}

typedef struct {
    Py_ssize_t rows, len[NBUFS];
} Mark;

static void mark_take(Builder *b, Mark *m) {
    Buf *bufs[NBUFS];
    bufs_of(b, bufs);
    m->rows = b->rows;
    for (int i = 0; i < NBUFS; i++) m->len[i] = bufs[i]->len;
}

static void mark_restore(Builder *b, const Mark *m) {
    Buf *bufs[NBUFS];
    bufs_of(b, bufs);
    b->rows = m->rows;
    for (int i = 0; i < NBUFS; i++) bufs[i]->len = m->len[i];
}

static int append_fixed(Builder *b, int64_t o, int ts_over, int64_t ts_ms, int32_t type) {
    int64_t us;
    if (ts_over || __builtin_mul_overflow(ts_ms, (int64_t)1000, &us)) return ERR_RANGE;
    if (buf_reserve(&b->offsets, 8) < 0 || buf_reserve(&b->stamps, 8) < 0 || buf_reserve(&b->types, 4) < 0)
        return ERR_NOMEM;
    put_i64(&b->offsets, o);
    put_i64(&b->stamps, us);
    put_i32(&b->types, type);
    return 0;
}


/* Parse the headers of one record at [*pp, rec_end); append them when keep. */
static int parse_headers(Builder *b, const uint8_t *d, Py_ssize_t *pp, Py_ssize_t rec_end, int keep,
                         int32_t *count_out) {
    Py_ssize_t p = *pp;
    int32_t hc;
    if (rd_varint(d, &p, rec_end, &hc) < 0 || hc < 0) return ERR_FRAMING;
    if (hc > (rec_end - p) / 2) return ERR_FRAMING;  /* a header takes at least 2 bytes */
    for (int32_t h = 0; h < hc; h++) {
        int32_t kl, vl;
        const uint8_t *k, *v;
        if (rd_field(d, &p, rec_end, &k, &kl) < 0 || kl < 0 || !utf8_ok(k, kl)) return ERR_FRAMING;
        if (rd_field(d, &p, rec_end, &v, &vl) < 0) return ERR_FRAMING;
        if (keep) {
            int rc = var_append(&b->hkey, k, kl, 0);
            if (rc == 0) rc = var_append(&b->hval, v, vl < 0 ? 0 : vl, vl < 0);
            if (rc != 0) return rc;
        }
    }
    *count_out = hc;
    *pp = p;
    return 0;
}

/* Parse one v2 record at *pp (records section [.., n)); append it when the window keeps it. */
static int parse_record(Builder *b, const uint8_t *d, Py_ssize_t *pp, Py_ssize_t n, const BatchFacts *f,
                        const Window *w) {
    Py_ssize_t p = *pp;
    int32_t length, off_delta, kl, vl, hc;
    int64_t ts_delta, o, ts;
    if (rd_varint(d, &p, n, &length) < 0 || length < 0 || length > n - p) return ERR_FRAMING;
    Py_ssize_t rec_end = p + length;
    if (rec_end - p < 1) return ERR_FRAMING;
    p += 1; /* record attributes: unused by Kafka */
    if (rd_varlong(d, &p, rec_end, &ts_delta) < 0 || rd_varint(d, &p, rec_end, &off_delta) < 0)
        return ERR_FRAMING;
    int o_over = __builtin_add_overflow(f->base_offset, (int64_t)off_delta, &o);
    int ts_over = 0;
    if (f->log_append) {
        ts = f->max_ts;
    } else if (__builtin_add_overflow(f->base_ts, ts_delta, &ts)) {
        ts_over = ts_delta > 0 ? 1 : -1;
    }
    const uint8_t *k, *v;
    if (rd_field(d, &p, rec_end, &k, &kl) < 0 || rd_field(d, &p, rec_end, &v, &vl) < 0) return ERR_FRAMING;
    int keep = keep_row(w, o_over, o, ts_over, ts);
    int64_t us;
    if (keep && (ts_over || __builtin_mul_overflow(ts, (int64_t)1000, &us))) {
        /* The reference fails on it only after the whole batch parsed: go on checking framing. */
        b->range_err = 1;
        keep = 0;
    }
    int rc = parse_headers(b, d, &p, rec_end, keep, &hc);
    if (rc != 0) return rc;
    if (p != rec_end) return ERR_FRAMING;
    *pp = p;
    if (!keep) return 0;
    if ((rc = append_fixed(b, o, ts_over, ts, f->type)) != 0) return rc;
    if ((rc = var_append(&b->key, k, kl < 0 ? 0 : kl, kl < 0)) != 0) return rc;
    if ((rc = var_append(&b->value, v, vl < 0 ? 0 : vl, vl < 0)) != 0) return rc;
    if (buf_reserve(&b->hvalid, 1) < 0 || buf_reserve(&b->hends, 4) < 0) return ERR_NOMEM;
    put_u8(&b->hvalid, hc > 0);
    put_i32(&b->hends, (int32_t)(b->hkey.ends.len / 4));
    b->rows++;
    return 1;
}

static PyObject *Builder_add_v2(Builder *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    int32_t count;
    BatchFacts f;
    Window w;
    if (!PyArg_ParseTuple(args, "y*nnLLLpiiLLLLpp", &view, &start, &end, &f.base_offset, &f.base_ts,
                          &f.max_ts, &f.log_append, &f.type, &count, &w.lo, &w.hi, &w.ts_lo, &w.ts_hi,
                          &w.has_ts_lo, &w.has_ts_hi))
        return NULL;
    if (start < 0 || end < start || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "add_v2: [start, end) is not inside the buffer");
        return NULL;
    }
    const uint8_t *d = (const uint8_t *)view.buf + start;
    Py_ssize_t n = end - start, p = 0;
    Mark m;
    mark_take(self, &m);
    long added = 0;
    int rc = 0;
    self->range_err = 0;
    if (count < 0 || count > n / 7) rc = ERR_FRAMING;  /* a record takes at least 7 bytes */
    for (int32_t i = 0; rc >= 0 && i < count; i++) {
        rc = parse_record(self, d, &p, n, &f, &w);
        added += rc > 0;
    }
    if (rc >= 0 && p != n) rc = ERR_FRAMING;  /* bytes after the declared records */
    if (rc >= 0 && self->range_err) rc = ERR_RANGE;
    PyBuffer_Release(&view);
    if (rc < 0) {
        mark_restore(self, &m);
        if (rc == ERR_NOMEM) return NULL;  /* MemoryError is set */
        return PyLong_FromLong(rc);
    }
    return PyLong_FromLong(added);
}

/* append_row(offset, timestamp_ms, timestamp_type, key, value): one row without headers, for
 * v0/v1 messages the caller decoded (rare: legacy logs only). */
static PyObject *Builder_append_row(Builder *self, PyObject *args) {
    int64_t o, ts;
    int32_t type;
    Py_buffer key = {0}, value = {0};
    PyObject *ko, *vo;
    if (!PyArg_ParseTuple(args, "LLiOO", &o, &ts, &type, &ko, &vo)) return NULL;
    if (ko != Py_None && PyObject_GetBuffer(ko, &key, PyBUF_SIMPLE) < 0) return NULL;
    if (vo != Py_None && PyObject_GetBuffer(vo, &value, PyBUF_SIMPLE) < 0) {
        if (ko != Py_None) PyBuffer_Release(&key);
        return NULL;
    }
    Mark m;
    mark_take(self, &m);
    int rc = append_fixed(self, o, 0, ts, type);
    if (rc == 0) rc = var_append(&self->key, key.buf, key.len, ko == Py_None);
    if (rc == 0) rc = var_append(&self->value, value.buf, value.len, vo == Py_None);
    if (rc == 0 && (buf_reserve(&self->hvalid, 1) < 0 || buf_reserve(&self->hends, 4) < 0)) rc = ERR_NOMEM;
    if (ko != Py_None) PyBuffer_Release(&key);
    if (vo != Py_None) PyBuffer_Release(&value);
    if (rc != 0) {
        mark_restore(self, &m);
        if (rc == ERR_NOMEM) return NULL;
        return PyLong_FromLong(rc);
    }
    put_u8(&self->hvalid, 0);
    put_i32(&self->hends, (int32_t)(self->hkey.ends.len / 4));
    self->rows++;
    return PyLong_FromLong(1);
}

/* add_legacy(set, wrapper_offset, magic, wrapper_ts, log_append, ts_type, lo, hi, ts_lo, ts_hi,
 * has_ts_lo, has_ts_hi): the inner messages of a decompressed v0/v1 wrapper value. */
static PyObject *Builder_add_legacy(Builder *self, PyObject *args) {
    Py_buffer view;
    int64_t wrapper_offset, wrapper_ts, last = 0, shift = 0;
    int magic, log_append;
    int32_t type;
    Window w;
    if (!PyArg_ParseTuple(args, "y*LiLpiLLLLpp", &view, &wrapper_offset, &magic, &wrapper_ts, &log_append,
                          &type, &w.lo, &w.hi, &w.ts_lo, &w.ts_hi, &w.has_ts_lo, &w.has_ts_hi))
        return NULL;
    const uint8_t *d = view.buf;
    Py_ssize_t n = view.len;
    Py_ssize_t count = legacy_walk(d, n, magic, &last);
    long rc = count < 0 ? ERR_FRAMING : 0;
    /* v1 inner offsets are relative: the wrapper holds the absolute offset of the last one. */
    if (rc == 0 && magic >= 1 && __builtin_sub_overflow(wrapper_offset, last, &shift)) rc = ERR_FALLBACK;
    Mark mk;
    mark_take(self, &mk);
    for (Py_ssize_t p = 0; rc >= 0 && p < n;) {
        LegacyMsg m;
        Py_ssize_t end = p + 12 + be32(d + p + 8);
        legacy_msg(d, p, end, magic, &m);  /* validated by legacy_walk */
        p = end;
        int64_t o, ts = log_append ? wrapper_ts : m.ts, us;
        if (__builtin_add_overflow(m.offset, shift, &o)) { rc = ERR_FALLBACK; break; }
        if (!keep_row(&w, 0, o, 0, ts)) continue;
        if (__builtin_mul_overflow(ts, (int64_t)1000, &us)) { rc = ERR_RANGE; break; }
        int r = append_fixed(self, o, 0, ts, type);
        if (r == 0) r = var_append(&self->key, m.key, m.kl < 0 ? 0 : m.kl, m.kl < 0);
        if (r == 0) r = var_append(&self->value, m.value, m.vl < 0 ? 0 : m.vl, m.vl < 0);
        if (r == 0 && (buf_reserve(&self->hvalid, 1) < 0 || buf_reserve(&self->hends, 4) < 0)) r = ERR_NOMEM;
        if (r != 0) { rc = r; break; }
        put_u8(&self->hvalid, 0);
        put_i32(&self->hends, (int32_t)(self->hkey.ends.len / 4));
        self->rows++;
        rc++;
    }
    PyBuffer_Release(&view);
    if (rc < 0) {
        mark_restore(self, &mk);
        if (rc == ERR_NOMEM) return NULL;
    }
    return PyLong_FromLong(rc);
}

/* ---- take: the first n rows as Arrow buffers; the rest moves to the front ---- */

/* Validity bytes [0, n) packed LSB-first into an Arrow bitmap; None when all are valid. */
static PyObject *pack_bitmap(const Buf *valid, Py_ssize_t n) {
    const uint8_t *v = (const uint8_t *)valid->p;
    Py_ssize_t i = 0;
    while (i < n && v[i]) i++;
    if (i == n) Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n + 7) / 8);
    if (out == NULL) return NULL;
    uint8_t *bits = (uint8_t *)PyBytes_AS_STRING(out);
    memset(bits, 0, (size_t)(n + 7) / 8);
    for (i = 0; i < n; i++) bits[i >> 3] |= (uint8_t)((v[i] != 0) << (i & 7));
    return out;
}

/* int32 offsets 0, ends[0], ..., ends[n-1] (n + 1 of them). */
static PyObject *offsets_bytes(const Buf *ends, Py_ssize_t n) {
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * (n + 1));
    if (out == NULL) return NULL;
    char *o = PyBytes_AS_STRING(out);
    memset(o, 0, 4);
    if (n > 0) memcpy(o + 4, ends->p, (size_t)(4 * n));
    return out;
}

static void drop_front(Buf *b, Py_ssize_t nbytes) {
    memmove(b->p, b->p + nbytes, (size_t)(b->len - nbytes));
    b->len -= nbytes;
}

/* Drop the first n items of ends-shaped data: ends rebased, `data` (if any) shifted. */
static void drop_ends(Buf *ends, Buf *data, Py_ssize_t n) {
    if (n == 0) return;
    int32_t cut = get_i32(ends, n - 1);
    drop_front(ends, 4 * n);
    Py_ssize_t left = ends->len / 4;
    for (Py_ssize_t i = 0; i < left; i++) {
        int32_t e = get_i32(ends, i) - cut;
        memcpy(ends->p + 4 * i, &e, 4);
    }
    if (data != NULL) drop_front(data, cut);
}

static void drop_var(VarCol *c, Py_ssize_t n) {
    drop_front(&c->valid, n);
    drop_ends(&c->ends, &c->data, n);
}

static PyObject *bytes_of(const Buf *b, Py_ssize_t nbytes) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", nbytes);
}

static PyObject *Builder_take(Builder *self, PyObject *arg) {
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred()) return NULL;
    if (n < 0 || n > self->rows) {
        PyErr_SetString(PyExc_ValueError, "take: n must be in [0, rows]");
        return NULL;
    }
    Py_ssize_t nh = n ? get_i32(&self->hends, n - 1) : 0;
    Py_ssize_t kd = n ? get_i32(&self->key.ends, n - 1) : 0;
    Py_ssize_t vd = n ? get_i32(&self->value.ends, n - 1) : 0;
    Py_ssize_t hkd = nh ? get_i32(&self->hkey.ends, nh - 1) : 0;
    Py_ssize_t hvd = nh ? get_i32(&self->hval.ends, nh - 1) : 0;
    PyObject *out = Py_BuildValue(
        "nNNN" "NNN" "NNN" "NNn" "NN" "NNN", n,
        bytes_of(&self->offsets, 8 * n), bytes_of(&self->stamps, 8 * n), bytes_of(&self->types, 4 * n),
        pack_bitmap(&self->key.valid, n), offsets_bytes(&self->key.ends, n), bytes_of(&self->key.data, kd),
        pack_bitmap(&self->value.valid, n), offsets_bytes(&self->value.ends, n),
        bytes_of(&self->value.data, vd),
        pack_bitmap(&self->hvalid, n), offsets_bytes(&self->hends, n), nh,
        offsets_bytes(&self->hkey.ends, nh), bytes_of(&self->hkey.data, hkd),
        pack_bitmap(&self->hval.valid, nh), offsets_bytes(&self->hval.ends, nh),
        bytes_of(&self->hval.data, hvd));
    if (out == NULL) return NULL;  /* Py_BuildValue releases the N references it got */
    drop_front(&self->offsets, 8 * n);
    drop_front(&self->stamps, 8 * n);
    drop_front(&self->types, 4 * n);
    drop_var(&self->key, n);
    drop_var(&self->value, n);
    drop_front(&self->hvalid, n);
    drop_ends(&self->hends, NULL, n);
    drop_var(&self->hkey, nh);
    drop_var(&self->hval, nh);
    self->rows -= n;
    return out;
}

static PyObject *Builder_get_rows(Builder *self, void *closure) { return PyLong_FromSsize_t(self->rows); }

static PyObject *Builder_get_pending_bytes(Builder *self, void *closure) {
    return PyLong_FromSsize_t(self->key.data.len + self->value.data.len + self->hkey.data.len +
                              self->hval.data.len);
}

static void Builder_dealloc(Builder *self) {
    Buf *bufs[NBUFS];
    bufs_of(self, bufs);
    for (int i = 0; i < NBUFS; i++) PyMem_Free(bufs[i]->p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef Builder_methods[] = {
    {"add_v2", (PyCFunction)Builder_add_v2, METH_VARARGS,
     "add_v2(buf, start, end, base_offset, base_ts, max_ts, log_append, ts_type, count, lo, hi, ts_lo, "
     "ts_hi, has_ts_lo, has_ts_hi) -> rows appended (>= 0) or an error code (< 0)"},
    {"add_legacy", (PyCFunction)Builder_add_legacy, METH_VARARGS,
     "add_legacy(set, wrapper_offset, magic, wrapper_ts, log_append, ts_type, lo, hi, ts_lo, ts_hi, "
     "has_ts_lo, has_ts_hi) -> rows appended (>= 0) or an error code (< 0)"},
    {"append_row", (PyCFunction)Builder_append_row, METH_VARARGS,
     "append_row(offset, timestamp_ms, ts_type, key, value) -> 1 or an error code (< 0)"},
    {"take", (PyCFunction)Builder_take, METH_O, "take(n) -> the first n rows' buffers (native.Columns)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Builder_getset[] = {
    {"rows", (getter)Builder_get_rows, NULL, "rows held", NULL},
    {"pending_bytes", (getter)Builder_get_pending_bytes, NULL, "key/value/header bytes held", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject BuilderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlm.formats.records._columns.Builder",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Accumulates decoded records as Arrow column buffers (rlm/formats/records/native.py).",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Builder_dealloc,
    .tp_methods = Builder_methods,
    .tp_getset = Builder_getset,
};

static PyMethodDef module_methods[] = {
    {"configure", configure, METH_VARARGS, "configure(Record, Header): the classes records_v2 builds"},
    {"records_v2", records_v2, METH_VARARGS,
     "records_v2(buf, start, end, base_offset, base_ts, max_ts, log_append, count) -> list[Record] or "
     "an error code (< 0)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef columns_module = {
    PyModuleDef_HEAD_INIT, "_columns", "Kafka records -> Arrow column buffers (docs/decoder.md).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__columns(void) {
    crc32_init();
    if (PyType_Ready(&BuilderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&columns_module);
    if (m == NULL) return NULL;
    Py_INCREF(&BuilderType);
    if (PyModule_AddObject(m, "Builder", (PyObject *)&BuilderType) < 0 ||
        PyModule_AddIntConstant(m, "ERR_FRAMING", ERR_FRAMING) < 0 ||
        PyModule_AddIntConstant(m, "ERR_RANGE", ERR_RANGE) < 0 ||
        PyModule_AddIntConstant(m, "ERR_TOO_BIG", ERR_TOO_BIG) < 0 ||
        PyModule_AddIntConstant(m, "ERR_FALLBACK", ERR_FALLBACK) < 0) {
        Py_DECREF(&BuilderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
