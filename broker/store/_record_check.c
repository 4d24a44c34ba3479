/* The record check of crash recovery, compiled: RocketMQ's checkMessageAndReturnSize with
 * checkCRCOnRecover (store/CommitLog.java in apache/rocketmq 4.9) over a run of CommitLog records.
 *
 * walk(buf, file_from_offset, start, stop) -> (position, code, value)
 *
 * Walks the records of one segment from ``start`` (a record start) exactly as
 * commitlog_scan.scan_segment does (TOTALSIZE, MAGIC, PHYSICALOFFSET pointing at itself, BLANK
 * filler reaching the end, zeros) and checks each record as commitlog_scan.first_damaged does
 * (field lengths against TOTALSIZE, a zero byte ending TOPIC or PROPERTIES, the body against
 * BODYCRC = zlib crc32 & 0x7FFFFFFF, UtilAll.crc32).  It stops at the first record that is not
 * intact or where the records end; ``code`` (the WALK_* constants) says which and ``value``
 * carries the number the reason names.  commitlog_scan turns the triple into the same answer
 * its numpy path gives; tests/broker/store/test_record_check.py holds the two to it.
 *
 * Why C: zlib itself runs at ~4 GB/s, but one Python-level call per 1 KiB body halves that, and
 * recovery checks a whole segment after a crash.  The GIL is released for the walk (the buffer
 * stays exported, so the mapping cannot go away under it): the broker's other threads go on.
 *
 * The CRC: zlib's crc32 is a table method, ~4 GB/s, most of the walk's time.  On x86-64 with
 * PCLMULQDQ a body of 64 bytes or more is folded 64 bytes at a time with carry-less multiplies
 * instead (Intel's "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"; the fold
 * constants are x^n mod P for the CRC-32 polynomial, bit-reflected, as in the Linux kernel's
 * crc32-pclmul): four 128-bit lanes, each folded 512 bits forward per step, then folded into
 * one.  The folded 16 bytes stand where the message's last whole 16 bytes stood and are
 * congruent to the message modulo P, so zlib's crc32 over them (from a register of 0, i.e.
 * crc 0xFFFFFFFF) and then over the 0-15 bytes left gives the message's CRC-32, bit for bit,
 * ~3x faster.  Shorter bodies and other CPUs use zlib throughout (CRC_KERNEL says which).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <zlib.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_FOLD 1
#endif

#define MESSAGE_MAGIC 0xDAA320A7u
#define BLANK_MAGIC 0xCBD43194u
#define MIN_RECORD_SIZE 91 /* IPv4 hosts, empty body, topic and properties */
#define BLANK_MIN 8
#define BODY_CRC_POSITION 8
#define PHYS_POSITION 28
#define SYSFLAG_POSITION 36
#define BODY_LENGTH_V4 84 /* BODYLENGTH's position with IPv4 hosts */
#define V6_EXTRA 12       /* per IPv6 host */
#define BORNHOST_V6 0x10
#define STOREHOST_V6 0x20

enum {
    WALK_END_OF_FILE,   /* the records reach the end of the buffer */
    WALK_RANGE_END,     /* the records reach ``stop`` */
    WALK_BLANK,         /* BLANK filler to the end of the buffer */
    WALK_ZEROS,         /* zeros where a record would start */
    WALK_SHORT,         /* fewer than 8 bytes left, not all zero; value: bytes left */
    WALK_BAD_SIZE,      /* value: the impossible TOTALSIZE */
    WALK_CROSSES_END,   /* value: TOTALSIZE */
    WALK_BAD_OFFSET,    /* value: the PHYSICALOFFSET the record claims */
    WALK_BAD_BLANK,     /* value: the filler's size */
    WALK_BAD_MAGIC,     /* value: the magic, unsigned */
    WALK_FIELDS,        /* field lengths disagree with TOTALSIZE */
    WALK_ZEROED,        /* TOPIC or PROPERTIES ends in a zero byte */
    WALK_BODY_CRC,      /* the body does not match BODYCRC */
};

static inline int32_t be32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) |
                     (uint32_t)p[3]);
}

static inline int16_t be16(const unsigned char *p) {
    return (int16_t)(((uint16_t)p[0] << 8) | (uint16_t)p[1]);
}

static inline int64_t be64(const unsigned char *p) {
    return (int64_t)(((uint64_t)(uint32_t)be32(p) << 32) | (uint64_t)(uint32_t)be32(p + 4));
}

static inline Py_ssize_t clip(Py_ssize_t v, Py_ssize_t lo, Py_ssize_t hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

#ifdef HAVE_FOLD
static int use_fold;

__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_fold(const unsigned char *p,
                                                                   size_t len) {
    /* len >= 64; the constants' low qword multiplies a lane's low half, the high one its high */
    const __m128i by4 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL); /* 512 bits forward */
    const __m128i by1 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL); /* 128 bits forward */
#define LOAD(at) _mm_loadu_si128((const __m128i *)(at))
#define FOLD(x, k, next)                                                                       \
    _mm_xor_si128(                                                                             \
        _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next)
    __m128i x0 = LOAD(p), x1 = LOAD(p + 16), x2 = LOAD(p + 32), x3 = LOAD(p + 48);
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)0xFFFFFFFF)); /* the register's start, ~0 */
    p += 64;
    len -= 64;
    while (len >= 64) {
        x0 = FOLD(x0, by4, LOAD(p));
        x1 = FOLD(x1, by4, LOAD(p + 16));
        x2 = FOLD(x2, by4, LOAD(p + 32));
        x3 = FOLD(x3, by4, LOAD(p + 48));
        p += 64;
        len -= 64;
    }
    x0 = FOLD(x0, by1, x1);
    x0 = FOLD(x0, by1, x2);
    x0 = FOLD(x0, by1, x3);
    while (len >= 16) {
        x0 = FOLD(x0, by1, LOAD(p));
        p += 16;
        len -= 16;
    }
#undef FOLD
#undef LOAD
    unsigned char folded[16];
    _mm_storeu_si128((__m128i *)folded, x0);
    uLong crc = crc32(0xFFFFFFFFUL, folded, 16);
    return (uint32_t)crc32(crc, p, (uInt)len);
}
#endif

/* zlib's crc32(0, body) */
static uint32_t body_crc(const unsigned char *p, size_t len) {
#ifdef HAVE_FOLD
    if (use_fold && len >= 64)
        return crc32_fold(p, len);
#endif
    return (uint32_t)crc32(0L, p, (uInt)len);
}

/* The checks of first_damaged on the complete record at [s, e) of b[0:n], in its order (its
 * gathers clip every index into the buffer; so does this, so the answers agree bit for bit). */
static int check_record(const unsigned char *b, Py_ssize_t n, Py_ssize_t s, Py_ssize_t e) {
    int32_t flag = be32(b + s + SYSFLAG_POSITION);
    Py_ssize_t at = s + BODY_LENGTH_V4 + ((flag & BORNHOST_V6) ? V6_EXTRA : 0) +
                    ((flag & STOREHOST_V6) ? V6_EXTRA : 0);
    int64_t length = be32(b + (at < n - 4 ? at : n - 4));
    Py_ssize_t body = at + 4;
    int64_t body_end = body + length;
    int64_t topic_len = b[clip((Py_ssize_t)body_end, 0, n - 1)];
    int64_t props_at = body_end + 1 + topic_len;
    int64_t props_len = be16(b + clip((Py_ssize_t)props_at, 0, n - 2));
    if (!(length >= 0 && body_end + 3 <= e && props_at + 2 + props_len == e))
        return WALK_FIELDS;
    unsigned char last_topic = b[clip((Py_ssize_t)props_at - 1, 0, n - 1)];
    if ((topic_len > 0 && last_topic == 0) || (props_len > 0 && b[e - 1] == 0))
        return WALK_ZEROED;
    uint32_t want = (uint32_t)be32(b + s + BODY_CRC_POSITION);
    uint32_t got = body_crc(b + body, (size_t)length) & 0x7FFFFFFFu;
    return got == want ? -1 : WALK_BODY_CRC;
}

/* scan_segment's walk, checking each record on the way; *value as the module comment says */
static int walk(const unsigned char *b, Py_ssize_t n, int64_t from, Py_ssize_t *pos_io,
                Py_ssize_t limit, int64_t *value) {
    Py_ssize_t pos = *pos_io;
    int code;
    for (;;) {
        if (pos >= limit) {
            code = pos < n ? WALK_RANGE_END : WALK_END_OF_FILE;
            break;
        }
        if (pos + 8 > n) {
            code = WALK_ZEROS;
            for (Py_ssize_t i = pos; i < n; i++) {
                if (b[i]) {
                    code = WALK_SHORT;
                    *value = n - pos;
                    break;
                }
            }
            break;
        }
        int32_t size = be32(b + pos);
        uint32_t magic = (uint32_t)be32(b + pos + 4);
        if (magic == MESSAGE_MAGIC) {
            if (size < MIN_RECORD_SIZE) {
                code = WALK_BAD_SIZE;
                *value = size;
                break;
            }
            if (pos + size > n) {
                code = WALK_CROSSES_END;
                *value = size;
                break;
            }
            int64_t poff = be64(b + pos + PHYS_POSITION);
            if (poff != from + pos) {
                code = WALK_BAD_OFFSET;
                *value = poff;
                break;
            }
            code = check_record(b, n, pos, pos + size);
            if (code >= 0)
                break;
            pos += size;
        } else if (magic == BLANK_MAGIC) {
            if (size < BLANK_MIN || pos + size != n) {
                code = WALK_BAD_BLANK;
                *value = size;
                break;
            }
            code = WALK_BLANK;
            pos = n;
            break;
        } else if (size == 0 && magic == 0) {
            code = WALK_ZEROS;
            break;
        } else {
            code = WALK_BAD_MAGIC;
            *value = magic;
            break;
        }
    }
    *pos_io = pos;
    return code;
}

static PyObject *record_check_walk(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    long long from;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "y*Lnn:walk", &view, &from, &start, &stop))
        return NULL;
    Py_ssize_t n = view.len;
    if (start < 0 || start > n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "start outside the buffer");
        return NULL;
    }
    Py_ssize_t pos = start, limit = stop < n ? stop : n;
    int64_t value = 0;
    int code;
    Py_BEGIN_ALLOW_THREADS
    code = walk((const unsigned char *)view.buf, n, (int64_t)from, &pos, limit, &value);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("niL", pos, code, (long long)value);
}

static PyMethodDef methods[] = {
    {"walk", record_check_walk, METH_VARARGS,
     "walk(buf, file_from_offset, start, stop) -> (position, code, value): check the records "
     "from start up to the first one not intact or their end (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_record_check", NULL, -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__record_check(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    const char *kernel = "zlib";
#ifdef HAVE_FOLD
    __builtin_cpu_init();
    use_fold = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    if (use_fold)
        kernel = "pclmulqdq";
#endif
    if (PyModule_AddStringConstant(m, "CRC_KERNEL", kernel) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    static const struct {
        const char *name;
        int value;
    } codes[] = {
        {"WALK_END_OF_FILE", WALK_END_OF_FILE}, {"WALK_RANGE_END", WALK_RANGE_END},
        {"WALK_BLANK", WALK_BLANK},             {"WALK_ZEROS", WALK_ZEROS},
        {"WALK_SHORT", WALK_SHORT},             {"WALK_BAD_SIZE", WALK_BAD_SIZE},
        {"WALK_CROSSES_END", WALK_CROSSES_END}, {"WALK_BAD_OFFSET", WALK_BAD_OFFSET},
        {"WALK_BAD_BLANK", WALK_BAD_BLANK},     {"WALK_BAD_MAGIC", WALK_BAD_MAGIC},
        {"WALK_FIELDS", WALK_FIELDS},           {"WALK_ZEROED", WALK_ZEROED},
        {"WALK_BODY_CRC", WALK_BODY_CRC},
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        if (PyModule_AddIntConstant(m, codes[i].name, codes[i].value) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
