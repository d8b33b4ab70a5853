/* Kafka wire parsing shared by the decoder's entry points (included by _columns.c; docs/decoder.md).
 * Pure: bytes in, values out; every read is bounded by the caller's limit. */
#ifndef RLM_COLUMNS_WIRE_H
#define RLM_COLUMNS_WIRE_H

/* Return codes of add_v2 / add_legacy (>= 0: rows appended). */
#define ERR_FRAMING (-1)  /* the reference decoder rejects this batch: re-run it for the error */
#define ERR_RANGE (-2)    /* a kept row's timestamp in microseconds does not fit an int64 */
#define ERR_TOO_BIG (-3)  /* a column's pending bytes would pass 2 GiB (Arrow int32 offsets) */
#define ERR_NOMEM (-4)    /* allocation failed: MemoryError is set */
#define ERR_FALLBACK (-5) /* an int64 overflow in the offset arithmetic: let the caller use Python */

/* ---- varints (rlm/formats/varint.py): zig-zag, <= 5 bytes (int32) / <= 10 bytes (int64) ---- */

/* The unsigned base-128 value of at most max_bytes bytes at *pp (bounded by lim); -1 when it runs
 * past lim or is longer. Byte i contributes bits 7i..7i+6, as Java's ByteUtils (bits past 63 drop). */
static inline int rd_uvarint(const uint8_t *d, Py_ssize_t *pp, Py_ssize_t lim, int max_bytes, uint64_t *out) {
    Py_ssize_t p = *pp;
    uint64_t acc = 0;
    for (int i = 0; i < max_bytes; i++) {
        if (p >= lim) return -1;
        uint8_t c = d[p++];
        acc |= (uint64_t)(c & 0x7F) << (7 * i);  /* i = 9: only bit 63 survives, as in Java */
        if (!(c & 0x80)) {
            *out = acc;
            *pp = p;
            return 0;
        }
    }
    return -1;  /* overlong */
}

static inline int rd_varint(const uint8_t *d, Py_ssize_t *pp, Py_ssize_t lim, int32_t *out) {
    uint64_t acc;
    if (rd_uvarint(d, pp, lim, 5, &acc) < 0) return -1;
    acc &= 0xFFFFFFFFu;  /* bits Java shifts out of an int */
    *out = (int32_t)(int64_t)((int64_t)(acc >> 1) ^ -(int64_t)(acc & 1));
    return 0;
}

static inline int rd_varlong(const uint8_t *d, Py_ssize_t *pp, Py_ssize_t lim, int64_t *out) {
    uint64_t acc;
    if (rd_uvarint(d, pp, lim, 10, &acc) < 0) return -1;
    *out = (int64_t)(acc >> 1) ^ -(int64_t)(acc & 1);
    return 0;
}

/* A length-prefixed field (varint length, -1 = null) at *pp, bounded by lim: *out its first byte,
 * *len its length (-1 null). Returns -1 for a bad varint or a field running past lim. */
static inline int rd_field(const uint8_t *d, Py_ssize_t *pp, Py_ssize_t lim, const uint8_t **out,
                           int32_t *len) {
    if (rd_varint(d, pp, lim, len) < 0) return -1;
    *out = d + *pp;
    if (*len >= 0) {
        if (*len > lim - *pp) return -1;
        *pp += *len;
    }
    return 0;
}

/* Strict UTF-8 as Python's bytes.decode("utf-8"): no overlongs, surrogates or > U+10FFFF. */
static int utf8_ok(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80) return 0;
            i += 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80) return 0;
            if (c == 0xE0 && c1 < 0xA0) return 0;  /* overlong */
            if (c == 0xED && c1 > 0x9F) return 0;  /* surrogate */
            i += 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n) return 0;
            uint8_t c1 = s[i + 1];
            if ((c1 & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80 || (s[i + 3] & 0xC0) != 0x80) return 0;
            if (c == 0xF0 && c1 < 0x90) return 0;  /* overlong */
            if (c == 0xF4 && c1 > 0x8F) return 0;  /* > U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

typedef struct {
    int64_t base_offset, base_ts, max_ts;
    int log_append;
    int32_t type;
} BatchFacts;

/* ---- v0/v1 message sets: the inner messages of a compressed wrapper (docs/decoder.md) ---- */


static uint32_t crc32_table[256];

static void crc32_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc32_table[i] = c;
    }
}

/* CRC-32 (IEEE, zlib.crc32) of the legacy message format. */
static uint32_t crc32_ieee(const uint8_t *p, Py_ssize_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (Py_ssize_t i = 0; i < n; i++) c = crc32_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static inline int64_t be64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v = (v << 8) | p[i];
    return (int64_t)v;
}

static inline int32_t be32(const uint8_t *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

typedef struct {
    int64_t offset, ts;
    const uint8_t *key, *value;
    int32_t kl, vl;
} LegacyMsg;

/* One inner message at d[p .. p + 12 + size) (rlm.formats.records.legacy._parse_legacy with
 * verify_crc=True, plus _legacy_inner's magic and nesting checks). 0 or ERR_FRAMING. */
static int legacy_msg(const uint8_t *d, Py_ssize_t p, Py_ssize_t end, int magic, LegacyMsg *m) {
    int32_t size = be32(d + p + 8);
    if (d[p + 16] == 1 && size < 22) return ERR_FRAMING;
    if (crc32_ieee(d + p + 16, end - (p + 16)) != (uint32_t)be32(d + p + 12)) return ERR_FRAMING;
    if (d[p + 16] != magic || (d[p + 17] & 0x07)) return ERR_FRAMING;
    m->offset = be64(d + p);
    Py_ssize_t q = p + 18;
    m->ts = -1;
    if (magic == 1) {
        m->ts = be64(d + q);
        q += 8;
    }
    for (int f = 0; f < 2; f++) {
        if (q + 4 > end) return ERR_FRAMING;
        int32_t len = be32(d + q);
        q += 4;
        if (len >= 0 && len > end - q) return ERR_FRAMING;
        if (f == 0) { m->key = d + q; m->kl = len; }
        else { m->value = d + q; m->vl = len; }
        if (len >= 0) q += len;
    }
    return q == end ? 0 : ERR_FRAMING;
}

/* Walk the set; call each message's (p, end) in order. Returns the count or ERR_FRAMING. */
static Py_ssize_t legacy_walk(const uint8_t *d, Py_ssize_t n, int magic, int64_t *last_offset) {
    Py_ssize_t p = 0, count = 0;
    LegacyMsg m;
    while (p < n) {
        if (n - p < 17) return ERR_FRAMING;
        int32_t size = be32(d + p + 8);
        if (size < 14 || size > n - p - 12) return ERR_FRAMING;
        if (legacy_msg(d, p, p + 12 + size, magic, &m) < 0) return ERR_FRAMING;
        *last_offset = m.offset;
        count++;
        p += 12 + size;
    }
    return count ? count : ERR_FRAMING;
}

/* The row filter of rlm.jobs.reading.decode.iter_task_records. */
typedef struct {
    int64_t lo, hi, ts_lo, ts_hi;
    int has_ts_lo, has_ts_hi;
} Window;

/* ts_ok: 0 when the timestamp (ms) overflowed int64 in direction ts_over (+1/-1). */
static inline int keep_row(const Window *w, int offset_over, int64_t o, int ts_over, int64_t ts) {
    if (offset_over) return 0;  /* beyond int64: outside any int64 window */
    if (o < w->lo || o > w->hi) return 0;
    if (w->has_ts_lo && (ts_over < 0 || (ts_over == 0 && ts < w->ts_lo))) return 0;
    if (w->has_ts_hi && (ts_over > 0 || (ts_over == 0 && ts >= w->ts_hi))) return 0;
    return 1;
}

#endif
