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

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define RLM_X86 1
#include <immintrin.h>
#endif

/* ---------------------------------------------------------------------------------------------
 * CRC-32C (Castagnoli, reflected polynomial 0x82F63B78). The functions below work on the raw
 * register; crc32c() applies Kafka's (and every implementation's) ~ before and after.
 */
#define POLY 0x82F63B78u
static uint32_t crc_table[8][256];

static void crc_table_init(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        crc_table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = crc_table[0][n];
        for (int k = 1; k < 8; k++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[k][n] = c;
        }
    }
}

/* Slicing-by-8: the portable fallback (CPUs without SSE4.2, other architectures). */
static uint32_t crc_raw_table(uint32_t crc, const uint8_t *p, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc;
        crc = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff]
              ^ crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff]
              ^ crc_table[2][(w >> 40) & 0xff] ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
#endif
    while (n--)
        crc = crc_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return crc;
}

/* x^e mod P, reflected (bit 31 is x^0). */
static uint32_t xpow_mod(unsigned e)
{
    uint32_t v = 0x80000000u;
    while (e--)
        v = (v & 1) ? (v >> 1) ^ POLY : v >> 1;
    return v;
}

#ifdef RLM_X86
/* Two hardware paths, picked at import by what the CPU has (measured on the 2-core EPYC of
 * BENCHMARKS.md, 13.5 KiB inputs: one crc32 chain 4-10 GB/s, three chains 12-29, the AVX-512
 * fold 35-61; the machine is shared, hence the ranges).
 *
 * SSE4.2: the crc32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so
 * three chains over adjacent blocks of L bytes run in parallel; they are joined by shifting a
 * register over the bytes after it: r * x^(8n) mod P is one carry-less multiply by
 * x^(8n-33) mod P and one crc32 of the 64-bit product (which reduces it and supplies the x^33).
 *
 * AVX-512 + VPCLMULQDQ: Intel's "Fast CRC Computation Using PCLMULQDQ" folding, 4 x 64 bytes per
 * step. Each 128-bit lane holds, modulo P, the bytes of its lane so far; moving it forward by F
 * bits is lo64 * (x^(F+31) mod P) ^ hi64 * (x^(F-33) mod P) (32-bit reflected constants: the
 * product lands 33 bits off). The final 16-byte remainder has the CRC of the prefix it stands for,
 * so the crc32 instruction finishes it and the tail. */
#define N_LEVELS 3
static const size_t LEVELS[N_LEVELS] = {4096, 512, 64};
static uint64_t K1[N_LEVELS], K2[N_LEVELS]; /* shift over L and over 2L bytes */
static int have_hw = 0, have_fold = 0;
static uint64_t KF[3][2];                   /* fold by 2048, 512, 128 bits: {lo, hi} */

__attribute__((target("sse4.2,pclmul"))) static inline uint32_t shift_hw(uint32_t r, uint64_t k)
{
    __m128i prod = _mm_clmulepi64_si128(_mm_cvtsi32_si128((int)r), _mm_cvtsi64_si128((long long)k), 0);
    return (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(prod));
}

__attribute__((target("sse4.2"))) static uint64_t crc_tail_hw(uint64_t c, const uint8_t *p, size_t n)
{
    while (n >= 8) {
        uint64_t a;
        memcpy(&a, p, 8);
        c = _mm_crc32_u64(c, a);
        p += 8;
        n -= 8;
    }
    uint32_t r = (uint32_t)c;
    while (n--)
        r = _mm_crc32_u8(r, *p++);
    return r;
}

__attribute__((target("sse4.2,pclmul"))) static uint32_t crc_raw_hw(uint32_t crc, const uint8_t *p, size_t n)
{
    uint64_t c0 = crc;
    for (int lv = 0; lv < N_LEVELS; lv++) {
        const size_t L = LEVELS[lv];
        while (n >= 3 * L) {
            uint64_t c1 = 0, c2 = 0;
            const uint8_t *stop = p + L;
            do {
                uint64_t a, b, c;
                memcpy(&a, p, 8);
                memcpy(&b, p + L, 8);
                memcpy(&c, p + 2 * L, 8);
                c0 = _mm_crc32_u64(c0, a);
                c1 = _mm_crc32_u64(c1, b);
                c2 = _mm_crc32_u64(c2, c);
                p += 8;
            } while (p < stop);
            c0 = shift_hw((uint32_t)c0, K2[lv]) ^ shift_hw((uint32_t)c1, K1[lv]) ^ (uint32_t)c2;
            p += 2 * L;
            n -= 3 * L;
        }
    }
    return (uint32_t)crc_tail_hw(c0, p, n);
}

#define FOLD_TARGET __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))
#define FOLD_MIN 256

FOLD_TARGET static inline __m512i fold512(__m512i x, __m512i k, __m512i d)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), d,
                                     0x96); /* a ^ b ^ c */
}

FOLD_TARGET static inline __m128i fold128(__m128i x, __m128i k, __m128i d)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), d);
}

FOLD_TARGET static uint32_t crc_raw_fold(uint32_t crc, const uint8_t *p, size_t n)
{
    if (n < FOLD_MIN)
        return (uint32_t)crc_tail_hw(crc, p, n);
    const __m512i k2048 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KF[0]));
    const __m512i k512 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)KF[1]));
    const __m128i k128 = _mm_loadu_si128((const __m128i *)KF[2]);
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p), _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)crc)));
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128), x3 = _mm512_loadu_si512(p + 192);
    for (p += 256, n -= 256; n >= 256; p += 256, n -= 256) {
        x0 = fold512(x0, k2048, _mm512_loadu_si512(p));
        x1 = fold512(x1, k2048, _mm512_loadu_si512(p + 64));
        x2 = fold512(x2, k2048, _mm512_loadu_si512(p + 128));
        x3 = fold512(x3, k2048, _mm512_loadu_si512(p + 192));
    }
    x0 = fold512(fold512(fold512(x0, k512, x1), k512, x2), k512, x3);
    for (; n >= 64; p += 64, n -= 64)
        x0 = fold512(x0, k512, _mm512_loadu_si512(p));
    __m128i x = fold128(_mm512_extracti32x4_epi32(x0, 0), k128, _mm512_extracti32x4_epi32(x0, 1));
    x = fold128(x, k128, _mm512_extracti32x4_epi32(x0, 2));
    x = fold128(x, k128, _mm512_extracti32x4_epi32(x0, 3));
    for (; n >= 16; p += 16, n -= 16)
        x = fold128(x, k128, _mm_loadu_si128((const __m128i *)p));
    uint64_t c = _mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(x));
    c = _mm_crc32_u64(c, (uint64_t)_mm_extract_epi64(x, 1));
    return (uint32_t)crc_tail_hw(c, p, n);
}
#endif

static uint32_t crc32c(uint32_t crc, const uint8_t *p, size_t n)
{
#ifdef RLM_X86
    if (have_fold)
        return ~crc_raw_fold(~crc, p, n);
    if (have_hw)
        return ~crc_raw_hw(~crc, p, n);
#endif
    return ~crc_raw_table(~crc, p, n);
}

static void crc_init(void)
{
    crc_table_init();
#ifdef RLM_X86
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul");
    have_fold = have_hw && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
    for (int lv = 0; lv < N_LEVELS; lv++) {
        K1[lv] = xpow_mod((unsigned)(8 * LEVELS[lv] - 33));
        K2[lv] = xpow_mod((unsigned)(16 * LEVELS[lv] - 33));
    }
    const unsigned bits[3] = {2048, 512, 128};
    for (int i = 0; i < 3; i++) {
        KF[i][0] = xpow_mod(bits[i] + 31);
        KF[i][1] = xpow_mod(bits[i] - 33);
    }
#endif
}

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
 * The v2 header (FORMATS.md section 2 / the layout in rlm/formats/records/__init__.py).
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
 * crc32c(data, crc=0, path="auto"): for the tests (each path against the crc32c package) and the
 * bench. CRC_PATHS names the paths this CPU can run, the best first.
 */
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
    if (strcmp(path, "auto") == 0)
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

static PyMethodDef methods[] = {
    {"bind", scan_bind, METH_VARARGS,
     "bind(RecordBatch, codecs_by_id, timestamp_types_by_bit, slow_step): wire the scanner to rlm's types."},
    {"crc32c", (PyCFunction)(void (*)(void))py_crc32c, METH_VARARGS | METH_KEYWORDS,
     "crc32c(data, crc=0, path='auto') -> int: CRC-32C of data, continuing from crc."},
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
