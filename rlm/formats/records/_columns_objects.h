/* Records as Python objects, for rlm.formats.records.decode_records (lookups, fetches, dump);
 * included by _columns.c (docs/decoder.md). */
#ifndef RLM_COLUMNS_OBJECTS_H
#define RLM_COLUMNS_OBJECTS_H

/* ---- records as objects: rlm.formats.records.decode_records for lookups and fetches ---- */

/* Slot offsets of the Record / Header dataclasses (frozen, slots=True), set once by configure():
 * an instance is filled slot by slot as the dataclass's own __init__ would, without its per-field
 * object.__setattr__ calls. */
static PyTypeObject *record_type, *header_type;
static Py_ssize_t rec_slot[5], hdr_slot[2];

static int slot_offsets(PyTypeObject *t, const char *const *names, int n, Py_ssize_t *out) {
    for (int i = 0; i < n; i++) {
        PyObject *d = PyDict_GetItemString(t->tp_dict, names[i]);  /* borrowed */
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ member", t->tp_name, names[i]);
            return -1;
        }
        out[i] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    return 0;
}

static PyObject *configure(PyObject *mod, PyObject *args) {
    PyTypeObject *rt, *ht;
    static const char *const rnames[5] = {"offset", "timestamp", "key", "value", "headers"};
    static const char *const hnames[2] = {"key", "value"};
    if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &rt, &PyType_Type, &ht)) return NULL;
    if (slot_offsets(rt, rnames, 5, rec_slot) < 0 || slot_offsets(ht, hnames, 2, hdr_slot) < 0) return NULL;
    Py_INCREF(rt);
    Py_INCREF(ht);
    Py_XSETREF(record_type, rt);
    Py_XSETREF(header_type, ht);
    Py_RETURN_NONE;
}

/* A new instance of t with its slots set to vals (references stolen, even on failure). */
static PyObject *fill(PyTypeObject *t, const Py_ssize_t *slots, PyObject **vals, int n) {
    PyObject *o = NULL;
    for (int i = 0; i < n; i++)
        if (vals[i] == NULL) goto fail;
    o = t->tp_alloc(t, 0);
    if (o == NULL) goto fail;
    for (int i = 0; i < n; i++) *(PyObject **)((char *)o + slots[i]) = vals[i];
    return o;
fail:
    for (int i = 0; i < n; i++) Py_XDECREF(vals[i]);
    return NULL;
}

static PyObject *bytes_or_none(const uint8_t *p, int32_t n) {
    if (n < 0) Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)p, n);
}

/* base + delta as a Python int; exact beyond int64 like the reference's arithmetic. */
static PyObject *int_sum(int64_t base, int64_t delta) {
    int64_t r;
    if (!__builtin_add_overflow(base, delta, &r)) return PyLong_FromLongLong(r);
    PyObject *a = PyLong_FromLongLong(base), *b = PyLong_FromLongLong(delta), *sum = NULL;
    if (a != NULL && b != NULL) sum = PyNumber_Add(a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
    return sum;
}

/* The headers tuple of one record at *pp; NULL with *err = ERR_FRAMING (no exception) or
 * ERR_NOMEM (exception set). */
static PyObject *headers_obj(const uint8_t *d, Py_ssize_t *pp, Py_ssize_t rec_end, int *err) {
    Py_ssize_t p = *pp;
    int32_t hc;
    *err = ERR_FRAMING;
    if (rd_varint(d, &p, rec_end, &hc) < 0 || hc < 0 || hc > (rec_end - p) / 2) return NULL;
    PyObject *tup = PyTuple_New(hc);
    if (tup == NULL) { *err = ERR_NOMEM; return NULL; }
    for (int32_t h = 0; h < hc; h++) {
        int32_t kl, vl;
        const uint8_t *k, *v;
        if (rd_field(d, &p, rec_end, &k, &kl) < 0 || kl < 0) goto bad;
        if (rd_field(d, &p, rec_end, &v, &vl) < 0 || !utf8_ok(k, kl)) goto bad;
        PyObject *vals[2] = {PyUnicode_DecodeUTF8((const char *)k, kl, "strict"), bytes_or_none(v, vl)};
        PyObject *hdr = fill(header_type, hdr_slot, vals, 2);
        if (hdr == NULL) { *err = ERR_NOMEM; goto bad; }
        PyTuple_SET_ITEM(tup, h, hdr);
    }
    *pp = p;
    return tup;
bad:
    Py_DECREF(tup);
    return NULL;
}

/* One v2 record at *pp as a Record; NULL with *err as for headers_obj. */
static PyObject *record_obj(const uint8_t *d, Py_ssize_t *pp, Py_ssize_t n, const BatchFacts *f, int *err) {
    Py_ssize_t p = *pp;
    int32_t length, off_delta, kl, vl;
    int64_t ts_delta;
    *err = ERR_FRAMING;
    if (rd_varint(d, &p, n, &length) < 0 || length < 1 || length > n - p) return NULL;
    Py_ssize_t rec_end = p + length;
    p += 1; /* record attributes: unused by Kafka */
    const uint8_t *k, *v;
    if (rd_varlong(d, &p, rec_end, &ts_delta) < 0 || rd_varint(d, &p, rec_end, &off_delta) < 0 ||
        rd_field(d, &p, rec_end, &k, &kl) < 0 || rd_field(d, &p, rec_end, &v, &vl) < 0)
        return NULL;
    PyObject *headers = headers_obj(d, &p, rec_end, err);
    if (headers == NULL) return NULL;
    if (p != rec_end) {
        Py_DECREF(headers);
        return NULL;
    }
    *err = ERR_NOMEM;
    PyObject *vals[5] = {int_sum(f->base_offset, off_delta),
                         f->log_append ? PyLong_FromLongLong(f->max_ts) : int_sum(f->base_ts, ts_delta),
                         bytes_or_none(k, kl), bytes_or_none(v, vl), headers};
    PyObject *rec = fill(record_type, rec_slot, vals, 5);
    if (rec != NULL) *pp = p;
    return rec;
}

/* records_v2(buf, start, end, base_offset, base_ts, max_ts, log_append, count) -> list[Record],
 * or an int error code when the reference decoder would reject the batch. */
static PyObject *records_v2(PyObject *mod, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    int32_t count;
    BatchFacts f = {0};
    if (!PyArg_ParseTuple(args, "y*nnLLLpi", &view, &start, &end, &f.base_offset, &f.base_ts, &f.max_ts,
                          &f.log_append, &count))
        return NULL;
    if (record_type == NULL || start < 0 || end < start || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "records_v2: not configured, or [start, end) outside the buffer");
        return NULL;
    }
    const uint8_t *d = (const uint8_t *)view.buf + start;
    Py_ssize_t n = end - start, p = 0;
    int err = ERR_FRAMING;
    PyObject *out = NULL;
    if (count >= 0 && count <= n / 7 && (out = PyList_New(count)) == NULL) err = ERR_NOMEM;
    for (int32_t i = 0; out != NULL && i < count; i++) {
        PyObject *rec = record_obj(d, &p, n, &f, &err);
        if (rec == NULL) Py_CLEAR(out);
        else PyList_SET_ITEM(out, i, rec);
    }
    if (out != NULL && p != n) Py_CLEAR(out);  /* bytes after the declared records */
    PyBuffer_Release(&view);
    if (out != NULL) return out;
    if (err == ERR_NOMEM && PyErr_Occurred()) return NULL;
    PyErr_Clear();
    return PyLong_FromLong(ERR_FRAMING);
}

#endif
