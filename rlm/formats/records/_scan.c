/* Compiled hot path of rlm.formats.records.iter_batches (docs/scan.md).
 *
 * Scanner walks v2 record batch headers over any contiguous byte buffer, verifies each batch's
 * CRC-32C and builds the RecordBatch itself (filling the slots of the Python dataclass directly),
 * so a warm-cache segment scan costs about one CRC pass plus one small object per batch.
 *
 * Only the common case is decided here: a complete v2 batch with a size >= the v2 header, a
 * matching (or skipped) CRC and a known codec. Everything else -- legacy v0/v1 messages, CRC
 * mismatches, bad sizes, unknown magics and codecs -- is handed, one entry at a time, to the
 * pure-Python reference walk (scan.py passes it in as `slow`), so every error class, message,
 * position and offset has exactly one source. A torn tail (a v2 entry running past the limit) ends
 * the iteration here, as it does there.
 *
 * No buffer export outlives one __next__: an mmap may be closed while the iterator is suspended.
 * Every read is bounded by the buffer's length at that step.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "_scan_crc.h"

/* ---------------------------------------------------------------------------------------------
 * Binding to the Python side: the RecordBatch class (its slot offsets), the Compression and
 * TimestampType members by attribute bits, and the reference walk for everything uncommon.
 */
enum {
    F_POSITION, F_SIZE, F_BASE_OFFSET, F_LAST_OFFSET, F_MAGIC, F_CRC, F_CRC_VALID, F_COMPRESSION,
    F_TIMESTAMP_TYPE, F_BASE_TIMESTAMP, F_MAX_TIMESTAMP, F_PRODUCER_ID, F_PRODUCER_EPOCH,
    F_BASE_SEQUENCE, F_PARTITION_LEADER_EPOCH, F_IS_TRANSACTIONAL, F_IS_CONTROL, F_RECORD_COUNT,
    F_ATTRIBUTES, N_FIELDS
};
static const char *FIELD_NAMES[N_FIELDS] = {
    "position", "size", "base_offset", "last_offset", "magic", "crc", "crc_valid", "compression",
    "timestamp_type", "base_timestamp", "max_timestamp", "producer_id", "producer_epoch",
    "base_sequence", "partition_leader_epoch", "is_transactional", "is_control", "record_count",
    "attributes"};

static PyTypeObject *batch_type = NULL;
static Py_ssize_t field_offset[N_FIELDS];
static PyObject *codecs[8];  /* Compression member by codec id, NULL for unknown ids */
static PyObject *ts_types[2];
static PyObject *slow_step = NULL; /* (buf, pos, limit, verify_crc, skip_crc) -> RecordBatch | None */

static PyObject *scan_bind(PyObject *mod, PyObject *args)
{
    PyObject *cls, *codec_seq, *ts_seq, *slow;
    if (!PyArg_ParseTuple(args, "O!OOO:bind", &PyType_Type, &cls, &codec_seq, &ts_seq, &slow))
        return NULL;
    if (!PyCallable_Check(slow))
        return PyErr_Format(PyExc_TypeError, "slow step must be callable");
    Py_ssize_t offs[N_FIELDS];
    for (int i = 0; i < N_FIELDS; i++) {
        PyObject *d = PyObject_GetAttrString(cls, FIELD_NAMES[i]);
        if (d == NULL)
            return NULL;
        int ok = Py_IS_TYPE(d, &PyMemberDescr_Type)
                 && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX
                 && !(((PyMemberDescrObject *)d)->d_member->flags & READONLY);
        if (ok)
            offs[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
        if (!ok)
            return PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ field", ((PyTypeObject *)cls)->tp_name,
                                FIELD_NAMES[i]);
    }
    PyObject *cs = PySequence_Fast(codec_seq, "codecs must be a sequence");
    if (cs == NULL)
        return NULL;
    PyObject *ts = PySequence_Fast(ts_seq, "timestamp types must be a sequence");
    if (ts == NULL) {
        Py_DECREF(cs);
        return NULL;
    }
    if (PySequence_Fast_GET_SIZE(cs) != 8 || PySequence_Fast_GET_SIZE(ts) != 2) {
        Py_DECREF(cs);
        Py_DECREF(ts);
        return PyErr_Format(PyExc_ValueError, "need 8 codecs and 2 timestamp types");
    }
    for (int i = 0; i < 8; i++) {
        PyObject *c = PySequence_Fast_GET_ITEM(cs, i);
        Py_XSETREF(codecs[i], c == Py_None ? NULL : Py_NewRef(c));
    }
    for (int i = 0; i < 2; i++)
        Py_XSETREF(ts_types[i], Py_NewRef(PySequence_Fast_GET_ITEM(ts, i)));
    Py_DECREF(cs);
    Py_DECREF(ts);
    memcpy(field_offset, offs, sizeof offs);
    Py_XSETREF(batch_type, (PyTypeObject *)Py_NewRef(cls));
    Py_XSETREF(slow_step, Py_NewRef(slow));
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------
 * The v2 header (docs/formats.md §3.2 / the layout in rlm/formats/records/__init__.py).
 */
static inline int64_t be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return (int64_t)__builtin_bswap64(v);
}
static inline int32_t be32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return (int32_t)__builtin_bswap32(v);
}
static inline int16_t be16(const uint8_t *p) { return (int16_t)(((unsigned)p[0] << 8) | p[1]); }

#define LOG_OVERHEAD 12
#define HEADER_UP_TO_MAGIC 17
#define V2_HEADER_SIZE 61
#define CRC_START_V2 21

static PyObject *make_batch(Py_ssize_t pos, const uint8_t *b, int64_t total, int64_t last_offset)
{
    int16_t attrs = be16(b + 21);
    PyObject *codec = codecs[attrs & 7];
    PyObject *v[N_FIELDS] = {
        PyLong_FromSsize_t(pos),
        PyLong_FromLongLong(total),
        PyLong_FromLongLong(be64(b)),
        PyLong_FromLongLong(last_offset),
        PyLong_FromLong(2),
        PyLong_FromUnsignedLong((uint32_t)be32(b + 17)),
        Py_NewRef(Py_True),
        Py_NewRef(codec),
        Py_NewRef(ts_types[(attrs & 0x08) >> 3]),
        PyLong_FromLongLong(be64(b + 27)),
        PyLong_FromLongLong(be64(b + 35)),
        PyLong_FromLongLong(be64(b + 43)),
        PyLong_FromLong(be16(b + 51)),
        PyLong_FromLong(be32(b + 53)),
        PyLong_FromLong(be32(b + 12)),
        PyBool_FromLong(attrs & 0x10),
        PyBool_FromLong(attrs & 0x20),
        PyLong_FromLong(be32(b + 57)),
        PyLong_FromLong(attrs),
    };
    PyObject *o = NULL;
    int failed = 0;
    for (int i = 0; i < N_FIELDS; i++)
        failed |= v[i] == NULL;
    if (!failed)
        o = batch_type->tp_alloc(batch_type, 0);
    if (o == NULL) {
        for (int i = 0; i < N_FIELDS; i++)
            Py_XDECREF(v[i]);
        return NULL;
    }
    for (int i = 0; i < N_FIELDS; i++)
        *(PyObject **)((char *)o + field_offset[i]) = v[i]; /* steals the new reference */
    return o;
}

/* ---------------------------------------------------------------------------------------------
 * Scanner: the iterator iter_batches returns.
 */
typedef struct {
    PyObject_HEAD
    PyObject *buf;
    Py_ssize_t pos;
    Py_ssize_t limit;    /* fixed at the first step, as the reference does with len(buf) */
    long long end;       /* when has_end */
    char has_end, verify, skip, started, done;
} Scanner;

static PyObject *scanner_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *buf, *end_obj;
    Py_ssize_t start;
    int verify, skip;
    static char *names[] = {"buf", "start", "end", "verify_crc", "skip_crc", NULL};
    if (batch_type == NULL)
        return PyErr_Format(PyExc_RuntimeError, "rlm.formats.records._scan.bind() was not called");
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OnOpp:Scanner", names, &buf, &start, &end_obj, &verify, &skip))
        return NULL;
    if (start < 0)
        return PyErr_Format(PyExc_ValueError, "start must be >= 0");
    Scanner *s = (Scanner *)type->tp_alloc(type, 0);
    if (s == NULL)
        return NULL;
    s->buf = Py_NewRef(buf);
    s->pos = start;
    s->verify = (char)verify;
    s->skip = (char)skip;
    if (end_obj != Py_None) {
        int overflow = 0;
        long long e = PyLong_AsLongLongAndOverflow(end_obj, &overflow);
        if (e == -1 && PyErr_Occurred()) {
            Py_DECREF(s);
            return NULL;
        }
        /* an end past any buffer means no end; one below any position means nothing */
        s->has_end = overflow <= 0;
        s->end = overflow < 0 ? LLONG_MIN / 2 : e;
    }
    return (PyObject *)s;
}

static int scanner_traverse(Scanner *s, visitproc visit, void *arg)
{
    Py_VISIT(s->buf);
    return 0;
}

static int scanner_clear(Scanner *s)
{
    Py_CLEAR(s->buf);
    return 0;
}

static void scanner_dealloc(Scanner *s)
{
    PyObject_GC_UnTrack(s);
    scanner_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* One entry through the reference walk; NULL with done set at its end or on its error. */
static PyObject *scanner_slow(Scanner *s, Py_ssize_t pos)
{
    PyObject *r = PyObject_CallFunction(slow_step, "OnnOO", s->buf, pos, s->limit, s->verify ? Py_True : Py_False,
                                        s->skip ? Py_True : Py_False);
    if (r == NULL || r == Py_None) {
        Py_XDECREF(r);
        s->done = 1;
        return NULL;
    }
    if (!PyObject_TypeCheck(r, batch_type)) {
        Py_DECREF(r);
        s->done = 1;
        return PyErr_Format(PyExc_TypeError, "slow step returned a %s", Py_TYPE(r)->tp_name);
    }
    Py_ssize_t p = PyLong_AsSsize_t(*(PyObject **)((char *)r + field_offset[F_POSITION]));
    Py_ssize_t n = PyLong_AsSsize_t(*(PyObject **)((char *)r + field_offset[F_SIZE]));
    if (PyErr_Occurred()) {
        Py_DECREF(r);
        s->done = 1;
        return NULL;
    }
    s->pos = p + n;
    return r;
}

static PyObject *scanner_next(Scanner *s)
{
    if (s->done)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(s->buf, &view, PyBUF_SIMPLE) < 0) {
        s->done = 1;
        return NULL;
    }
    if (!s->started) {
        s->limit = view.len;
        /* a negative end stops at once, as in the reference (pos >= 0); 0 keeps limit - pos exact */
        if (s->has_end && s->end < (long long)view.len)
            s->limit = (Py_ssize_t)(s->end < 0 ? 0 : s->end);
        s->started = 1;
    }
    const Py_ssize_t pos = s->pos, limit = s->limit;
    if (limit - pos < HEADER_UP_TO_MAGIC) {
        PyBuffer_Release(&view);
        s->done = 1;
        return NULL;
    }
    /* limit <= view.len: a buffer that shrank since the first step is the reference's business */
    if (limit <= view.len && limit - pos >= V2_HEADER_SIZE) {
        const uint8_t *b = (const uint8_t *)view.buf + pos;
        const int64_t total = (int64_t)be32(b + 8) + LOG_OVERHEAD;
        if (b[16] == 2 && total >= V2_HEADER_SIZE) {
            if (total > limit - pos) { /* torn tail: the last append did not complete */
                PyBuffer_Release(&view);
                s->done = 1;
                return NULL;
            }
            int16_t attrs = be16(b + 21);
            int64_t last_offset;
            int ok = codecs[attrs & 7] != NULL
                     && !__builtin_add_overflow(be64(b), (int64_t)be32(b + 23), &last_offset)
                     && (s->skip || (uint32_t)be32(b + 17) == crc32c(0, b + CRC_START_V2, (size_t)total - CRC_START_V2));
            if (ok) {
                PyObject *o = make_batch(pos, b, total, last_offset);
                PyBuffer_Release(&view);
                if (o == NULL) {
                    s->done = 1;
                    return NULL;
                }
                s->pos = pos + (Py_ssize_t)total;
                return o;
            }
        }
    }
    PyBuffer_Release(&view);
    return scanner_slow(s, pos);
}

static PyTypeObject ScannerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlm.formats.records._scan.Scanner",
    .tp_basicsize = sizeof(Scanner),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Scanner(buf, start, end, verify_crc, skip_crc): the entries of buf as RecordBatch.",
    .tp_new = scanner_new,
    .tp_dealloc = (destructor)scanner_dealloc,
    .tp_traverse = (traverseproc)scanner_traverse,
    .tp_clear = (inquiry)scanner_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)scanner_next,
};

/* ---------------------------------------------------------------------------------------------
 * crc32c(data, crc=0, path="auto"): a whole segment's and an upload's CRC (rlm.formats.records.scan
 * crc32c), and for the tests (each path against the crc32c package). The GIL is released from
 * CRC_NOGIL_BYTES on (a 128 MiB segment takes ~2.5 ms; the buffer export keeps the bytes alive).
 * CRC_PATHS names the paths this CPU can run, the best first.
 */
#define CRC_NOGIL_BYTES (64 * 1024)

static PyObject *py_crc32c(PyObject *mod, PyObject *args, PyObject *kw)
{
    Py_buffer view;
    unsigned int crc = 0;
    const char *path = "auto";
    static char *names[] = {"data", "crc", "path", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|Is:crc32c", names, &view, &crc, &path))
        return NULL;
    const uint8_t *p = view.buf;
    size_t n = (size_t)view.len;
    uint32_t r = ~(uint32_t)crc;
    if (strcmp(path, "auto") == 0 && n >= CRC_NOGIL_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        r = ~crc32c(crc, p, n);
        Py_END_ALLOW_THREADS
    }
    else if (strcmp(path, "auto") == 0)
        r = ~crc32c(crc, p, n);
    else if (strcmp(path, "table") == 0)
        r = crc_raw_table(r, p, n);
#ifdef RLM_X86
    else if (strcmp(path, "sse4.2") == 0 && have_hw)
        r = crc_raw_hw(r, p, n);
    else if (strcmp(path, "avx512") == 0 && have_fold)
        r = crc_raw_fold(r, p, n);
#endif
    else {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "CRC-32C path %s is not available here", path);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(~r);
}

/* ---------------------------------------------------------------------------------------------
 * batches_crc32c(buf, batches): the CRC-32C of buf from the first batch's position to the end of
 * the last, from batches a walk with verify_crc=True returned over buf (rlm.formats.records.scan
 * batches_crc32c): each v2 batch's stored CRC covers its bytes from CRC_START_V2 on and was
 * checked against them, so only the 21 bytes before it are read, and the CRCs combined. None
 * when a batch is not v2, not contiguous with the one before, or outside buf: the caller then
 * reads every byte. A segment of 8 MiB in 1 MiB batches: 8 headers instead of 8 MiB (#35).
 */
static int batch_field(PyObject *o, int f, long long *out)
{
    PyObject *v = *(PyObject **)((char *)o + field_offset[f]);
    if (v == NULL || !PyLong_Check(v))
        return 0;
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

static PyObject *py_batches_crc32c(PyObject *mod, PyObject *args)
{
    Py_buffer view;
    PyObject *list;
    if (batch_type == NULL)
        return PyErr_Format(PyExc_RuntimeError, "rlm.formats.records._scan.bind() was not called");
    if (!PyArg_ParseTuple(args, "y*O!:batches_crc32c", &view, &PyList_Type, &list))
        return NULL;
    const uint8_t *buf = view.buf;
    uint32_t crc = 0;
    long long next = -1;
    int ok = PyList_GET_SIZE(list) > 0;
    for (Py_ssize_t i = 0; ok && i < PyList_GET_SIZE(list); i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        long long pos, size, magic, stored;
        ok = PyObject_TypeCheck(o, batch_type) && batch_field(o, F_POSITION, &pos) && batch_field(o, F_SIZE, &size)
             && batch_field(o, F_MAGIC, &magic) && batch_field(o, F_CRC, &stored) && magic == 2
             && *(PyObject **)((char *)o + field_offset[F_CRC_VALID]) == Py_True && (next < 0 || pos == next)
             && pos >= 0 && size >= V2_HEADER_SIZE && size <= (long long)view.len - pos;
        if (ok) {
            crc = crc32c(crc, buf + pos, CRC_START_V2);
            crc = crc32c_combine(crc, (uint32_t)stored, (uint64_t)(size - CRC_START_V2));
            next = pos + size;
        }
    }
    PyBuffer_Release(&view);
    if (PyErr_Occurred())
        return NULL;
    if (!ok)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(crc);
}

/* crc32c_combine(crc1, crc2, len2): rlm.formats.records.scan.crc32c_combine where the extension is built. */
static PyObject *py_crc32c_combine(PyObject *mod, PyObject *args)
{
    unsigned int crc1, crc2;
    unsigned long long len2;
    if (!PyArg_ParseTuple(args, "IIK:crc32c_combine", &crc1, &crc2, &len2))
        return NULL;
    return PyLong_FromUnsignedLong(crc32c_combine(crc1, crc2, len2));
}

static PyMethodDef methods[] = {
    {"bind", scan_bind, METH_VARARGS,
     "bind(RecordBatch, codecs_by_id, timestamp_types_by_bit, slow_step): wire the scanner to rlm's types."},
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, crc=0, path='auto') -> int: CRC-32C of data, continuing from crc."},
    {"crc32c_combine", py_crc32c_combine, METH_VARARGS,
     "crc32c_combine(crc1, crc2, len2) -> int: CRC-32C of A + B from CRC(A), CRC(B), len(B)."},
    {"batches_crc32c", py_batches_crc32c, METH_VARARGS,
     "batches_crc32c(buf, batches) -> int | None: CRC-32C of the verified v2 batches' bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "rlm.formats.records._scan",
    "Compiled v2 batch-header walk with CRC-32C (docs/scan.md).", -1, methods,
};

PyMODINIT_FUNC PyInit__scan(void)
{
    crc_init();
    if (PyType_Ready(&ScannerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
#ifdef RLM_X86
    PyObject *paths = have_fold ? Py_BuildValue("(sss)", "avx512", "sse4.2", "table")
                      : have_hw ? Py_BuildValue("(ss)", "sse4.2", "table") : Py_BuildValue("(s)", "table");
#else
    PyObject *paths = Py_BuildValue("(s)", "table");
#endif
    int failed = paths == NULL || PyModule_AddObjectRef(m, "CRC_PATHS", paths) < 0
                 || PyModule_AddObjectRef(m, "Scanner", (PyObject *)&ScannerType) < 0;
    Py_XDECREF(paths);
    if (failed) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
