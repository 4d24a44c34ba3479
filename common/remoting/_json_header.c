/* The usual JSON remoting header, read and written in one C call (issue 28).
 *
 * Theory of operation. Every request and answer of the remoting protocol carries a JSON header
 * (remoting/protocol/RemotingCommand.java in apache/rocketmq 4.9). Nearly all of them have one
 * shape: the integer fields code, version, opaque and flag, the string language, a string or null
 * remark, extFields mapping strings to strings, and serializeTypeCurrentRPC. codec.py reads and
 * writes that shape with orjson and a few Python checks; this module does the same work without
 * the interpreter in between, which matters most when a process wakes with cold caches to read
 * one frame (docs/benchmarks.md, "Seventh round").
 *
 * It is an accelerator, never an authority: each function either gives exactly what codec.py's
 * Python path gives for the same input, or None, and then codec.py's Python path runs and decides
 * (including every error). None is the answer for anything outside the shape: another key, a
 * duplicate key, a number with a fraction, exponent, leading zero or more than 18 digits, a
 * non-string extFields value, a raw control character or invalid UTF-8 in a string, a lone
 * surrogate escape, a header that does not end after its object. The conformance tests
 * (tests/common/test_json_header_c.py) compare both paths over generated headers.
 *
 *   decode_frame(frame) -> RemotingCommand | None
 *       frame: a buffer holding a frame without its length field (headerLenAndType, header,
 *       body), as codec.decode_frame takes it. The command is made by the class given to
 *       configure(), with the body copied into bytes.
 *   encode_prefixed(cmd, body_len) -> bytes | None
 *       length, headerLenAndType and the JSON header of cmd, byte for byte what
 *       codec.encode_header_and_prefix gives (orjson's rendering of header_dict(cmd)).
 *   configure(command_class, json_type)
 *       the RemotingCommand class and SerializeType.JSON, set once by codec.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

static PyObject *command_class = NULL;
static PyObject *json_type = NULL;
static PyObject *str_java = NULL;   /* "JAVA": language when absent */
static PyObject *attr_names[8];     /* code, ext_fields, flag, language, opaque, version, remark,
                                       serialize_type */

enum { A_CODE, A_EXT, A_FLAG, A_LANGUAGE, A_OPAQUE, A_VERSION, A_REMARK, A_STYPE };

/* ------------------------------------------------------------------------------- decoding */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cursor;

static inline void skip_ws(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int hex4(const unsigned char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char ch = p[i];
        v <<= 4;
        if (ch >= '0' && ch <= '9') v |= ch - '0';
        else if (ch >= 'a' && ch <= 'f') v |= ch - 'a' + 10;
        else if (ch >= 'A' && ch <= 'F') v |= ch - 'A' + 10;
        else return 0;
    }
    *out = v;
    return 1;
}

static size_t put_utf8(unsigned char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A JSON string at c->p (its opening quote): a new str, or NULL with no exception set (outside
 * the shape), or NULL with an exception set (out of memory). */
static PyObject *parse_string(Cursor *c) {
    if (c->p >= c->end || *c->p != '"') return NULL;
    const unsigned char *s = ++c->p;
    const unsigned char *q = s;
    while (q < c->end && *q != '"' && *q != '\\' && *q >= 0x20) q++;
    if (q >= c->end || *q < 0x20) return NULL;
    if (*q == '"') {
        c->p = q + 1;
        PyObject *r = PyUnicode_DecodeUTF8((const char *)s, q - s, "strict");
        if (r == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
        return r;
    }
    /* escapes: unescaped into UTF-8 (never longer than the escaped text) */
    size_t cap = (size_t)(c->end - s);
    unsigned char stackbuf[1024];
    unsigned char *buf = cap <= sizeof stackbuf ? stackbuf : PyMem_Malloc(cap);
    if (buf == NULL) { PyErr_NoMemory(); return NULL; }
    unsigned char *o = buf;
    memcpy(o, s, q - s);
    o += q - s;
    const unsigned char *p = q;
    PyObject *r = NULL;
    for (;;) {
        if (p >= c->end) goto out;
        unsigned char ch = *p;
        if (ch == '"') break;
        if (ch < 0x20) goto out;
        if (ch != '\\') { *o++ = ch; p++; continue; }
        if (p + 1 >= c->end) goto out;
        unsigned char e = p[1];
        p += 2;
        switch (e) {
        case '"': *o++ = '"'; break;
        case '\\': *o++ = '\\'; break;
        case '/': *o++ = '/'; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u': {
            unsigned cp;
            if (c->end - p < 4 || !hex4(p, &cp)) goto out;
            p += 4;
            if (cp >= 0xDC00 && cp <= 0xDFFF) goto out; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (c->end - p < 6 || p[0] != '\\' || p[1] != 'u' || !hex4(p + 2, &lo)) goto out;
                if (lo < 0xDC00 || lo > 0xDFFF) goto out;
                p += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            o += put_utf8(o, cp);
            break;
        }
        default: goto out;
        }
    }
    c->p = p + 1;
    r = PyUnicode_DecodeUTF8((const char *)buf, o - buf, "strict");
    if (r == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) PyErr_Clear();
out:
    if (buf != stackbuf) PyMem_Free(buf);
    return r;
}

/* A JSON integer of at most 18 digits (no fraction or exponent): 1, or 0 (outside the shape). */
static int parse_int(Cursor *c, long long *out) {
    const unsigned char *p = c->p;
    int neg = 0;
    if (p < c->end && *p == '-') { neg = 1; p++; }
    const unsigned char *d = p;
    long long v = 0;
    while (p < c->end && *p >= '0' && *p <= '9') {
        v = v * 10 + (*p - '0');
        p++;
        if (p - d > 18) return 0;
    }
    size_t n = p - d;
    if (n == 0 || (n > 1 && *d == '0')) return 0;
    if (p < c->end && (*p == '.' || *p == 'e' || *p == 'E')) return 0;
    c->p = p;
    *out = neg ? -v : v;
    return 1;
}

static int match(Cursor *c, const char *lit, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, lit, n) != 0) return 0;
    c->p += n;
    return 1;
}

/* extFields' object of strings (or null): a new dict, NULL with or without an exception */
static PyObject *parse_ext(Cursor *c) {
    if (match(c, "null", 4)) return PyDict_New();
    if (c->p >= c->end || *c->p != '{') return NULL;
    c->p++;
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') { c->p++; return d; }
    for (;;) {
        skip_ws(c);
        PyObject *k = parse_string(c);
        if (k == NULL) goto fail;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') { Py_DECREF(k); goto fail; }
        c->p++;
        skip_ws(c);
        PyObject *v = parse_string(c);
        if (v == NULL) { Py_DECREF(k); goto fail; }
        int bad = PyDict_SetItem(d, k, v);
        Py_DECREF(k);
        Py_DECREF(v);
        if (bad) goto fail;
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') { c->p++; continue; }
        if (c->p < c->end && *c->p == '}') { c->p++; return d; }
        goto fail;
    }
fail:
    Py_DECREF(d);
    return NULL;
}

enum { K_CODE, K_EXT, K_FLAG, K_LANGUAGE, K_OPAQUE, K_REMARK, K_STYPE, K_VERSION, K_N };

static int key_of(const unsigned char *k, size_t n) {
    switch (n) {
    case 4:
        if (memcmp(k, "code", 4) == 0) return K_CODE;
        if (memcmp(k, "flag", 4) == 0) return K_FLAG;
        break;
    case 6:
        if (memcmp(k, "opaque", 6) == 0) return K_OPAQUE;
        if (memcmp(k, "remark", 6) == 0) return K_REMARK;
        break;
    case 7:
        if (memcmp(k, "version", 7) == 0) return K_VERSION;
        break;
    case 8:
        if (memcmp(k, "language", 8) == 0) return K_LANGUAGE;
        break;
    case 9:
        if (memcmp(k, "extFields", 9) == 0) return K_EXT;
        break;
    case 23:
        if (memcmp(k, "serializeTypeCurrentRPC", 23) == 0) return K_STYPE;
        break;
    }
    return -1;
}

/* The header's fields into out[] (new references: code, language, version, opaque, flag, remark,
 * ext); 1 done, 0 outside the shape, -1 an exception. */
static int parse_header(Cursor *c, PyObject **out) {
    long long nums[K_N];
    int seen[K_N] = {0};
    PyObject *language = NULL, *remark = NULL, *ext = NULL;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    for (;;) {
        skip_ws(c);
        if (c->p >= c->end || *c->p != '"') goto outside;
        const unsigned char *k = ++c->p;
        while (c->p < c->end && *c->p != '"' && *c->p != '\\') c->p++;
        if (c->p >= c->end || *c->p != '"') goto outside;
        int key = key_of(k, c->p - k);
        c->p++;
        if (key < 0 || seen[key]) goto outside;
        seen[key] = 1;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') goto outside;
        c->p++;
        skip_ws(c);
        switch (key) {
        case K_CODE: case K_FLAG: case K_OPAQUE: case K_VERSION:
            if (!parse_int(c, &nums[key])) goto outside;
            break;
        case K_LANGUAGE:
            if ((language = parse_string(c)) == NULL) goto error_or_outside;
            break;
        case K_REMARK:
            if (match(c, "null", 4)) break;
            if ((remark = parse_string(c)) == NULL) goto error_or_outside;
            break;
        case K_STYPE: {
            PyObject *s = parse_string(c);
            if (s == NULL) goto error_or_outside;
            Py_DECREF(s);
            break;
        }
        case K_EXT:
            if ((ext = parse_ext(c)) == NULL) goto error_or_outside;
            break;
        }
        skip_ws(c);
        if (c->p < c->end && *c->p == ',') { c->p++; continue; }
        if (c->p < c->end && *c->p == '}') { c->p++; break; }
        goto outside;
    }
    skip_ws(c);
    if (c->p != c->end) goto outside;
    if (!seen[K_CODE] || !seen[K_VERSION] || !seen[K_OPAQUE] || !seen[K_FLAG]) goto outside;
    if (language == NULL) { language = str_java; Py_INCREF(language); }
    if (remark == NULL) { remark = Py_None; Py_INCREF(remark); }
    if (ext == NULL && (ext = PyDict_New()) == NULL) goto error;
    out[0] = PyLong_FromLongLong(nums[K_CODE]);
    out[1] = language;
    out[2] = PyLong_FromLongLong(nums[K_VERSION]);
    out[3] = PyLong_FromLongLong(nums[K_OPAQUE]);
    out[4] = PyLong_FromLongLong(nums[K_FLAG]);
    out[5] = remark;
    out[6] = ext;
    if (out[0] == NULL || out[2] == NULL || out[3] == NULL || out[4] == NULL) {
        for (int i = 0; i < 7; i++) Py_XDECREF(out[i]);
        return -1;
    }
    return 1;
error_or_outside:
    if (PyErr_Occurred()) goto error;
outside:
    Py_XDECREF(language);
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return 0;
error:
    Py_XDECREF(language);
    Py_XDECREF(remark);
    Py_XDECREF(ext);
    return -1;
}

static PyObject *decode_frame(PyObject *Py_UNUSED(self), PyObject *arg) {
    if (command_class == NULL) Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *result = NULL;
    const unsigned char *b = view.buf;
    Py_ssize_t n = view.len;
    if (n < 4) goto none;
    uint32_t type_and_len = ((uint32_t)b[0] << 24) | ((uint32_t)b[1] << 16)
                            | ((uint32_t)b[2] << 8) | b[3];
    Py_ssize_t header_len = type_and_len & 0xFFFFFF;
    if ((type_and_len >> 24) != 0 || 4 + header_len > n) goto none;
    Cursor c = {b + 4, b + 4 + header_len};
    PyObject *args[9];
    int got = parse_header(&c, args);
    if (got < 0) goto done;
    if (got == 0) goto none;
    args[7] = PyBytes_FromStringAndSize((const char *)b + 4 + header_len, n - 4 - header_len);
    if (args[7] == NULL) {
        for (int i = 0; i < 7; i++) Py_DECREF(args[i]);
        goto done;
    }
    args[8] = json_type;
    result = PyObject_Vectorcall(command_class, args, 9, NULL);
    for (int i = 0; i < 8; i++) Py_DECREF(args[i]);
    goto done;
none:
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&view);
    return result;
}

/* ------------------------------------------------------------------------------- encoding */

typedef struct {
    unsigned char *buf;
    size_t len, cap;
    unsigned char inline_buf[2048];
} Out;

static int grow(Out *o, size_t need) {
    if (o->len + need <= o->cap) return 1;
    size_t cap = o->cap * 2;
    while (cap < o->len + need) cap *= 2;
    unsigned char *nb;
    if (o->buf == o->inline_buf) {
        nb = PyMem_Malloc(cap);
        if (nb != NULL) memcpy(nb, o->buf, o->len);
    } else {
        nb = PyMem_Realloc(o->buf, cap);
    }
    if (nb == NULL) { PyErr_NoMemory(); return 0; }
    o->buf = nb;
    o->cap = cap;
    return 1;
}

static int put(Out *o, const char *s, size_t n) {
    if (!grow(o, n)) return 0;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    return 1;
}

static int put_ll(Out *o, long long v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%lld", v);
    return put(o, tmp, (size_t)n);
}

/* a str as orjson writes it; 0 with no exception: no UTF-8 form (a lone surrogate) */
static int put_str(Out *o, PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (u == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) PyErr_Clear();
        return 0;
    }
    if (!grow(o, (size_t)n * 6 + 2)) return 0;
    unsigned char *w = o->buf + o->len;
    *w++ = '"';
    static const char hex[] = "0123456789abcdef";
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)u[i];
        if (ch >= 0x20 && ch != '"' && ch != '\\') { *w++ = ch; continue; }
        *w++ = '\\';
        switch (ch) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '\b': *w++ = 'b'; break;
        case '\t': *w++ = 't'; break;
        case '\n': *w++ = 'n'; break;
        case '\f': *w++ = 'f'; break;
        case '\r': *w++ = 'r'; break;
        default:
            *w++ = 'u'; *w++ = '0'; *w++ = '0';
            *w++ = hex[ch >> 4]; *w++ = hex[ch & 15];
        }
    }
    *w++ = '"';
    o->len = w - o->buf;
    return 1;
}

/* an int field as orjson writes it: 0 (no exception) for what is outside the shape */
static int int_field(PyObject *v, int exact, long long *out) {
    if (exact ? !PyLong_CheckExact(v) : (!PyLong_Check(v) || PyBool_Check(v))) return 0;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || (x == -1 && PyErr_Occurred())) { PyErr_Clear(); return 0; }
    *out = x;
    return 1;
}

static PyObject *encode_prefixed(PyObject *Py_UNUSED(self), PyObject *const *args,
                                 Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_prefixed(cmd, body_len)");
        return NULL;
    }
    Py_ssize_t body_len = PyLong_AsSsize_t(args[1]);
    if (body_len == -1 && PyErr_Occurred()) return NULL;
    PyObject *f[8] = {NULL};
    PyObject *result = NULL;
    Out o;
    o.buf = o.inline_buf;
    o.len = 8; /* the prefix, written last */
    o.cap = sizeof o.inline_buf;
    for (int i = 0; i < 8; i++) {
        if ((f[i] = PyObject_GetAttr(args[0], attr_names[i])) == NULL) goto done;
    }
    long long code, flag, opaque, version, stype;
    PyObject *ext = f[A_EXT], *language = f[A_LANGUAGE], *remark = f[A_REMARK];
    if (!int_field(f[A_STYPE], 0, &stype) || stype != 0) goto none;
    if (!int_field(f[A_CODE], 0, &code) || !int_field(f[A_FLAG], 1, &flag)
        || !int_field(f[A_OPAQUE], 1, &opaque) || !int_field(f[A_VERSION], 1, &version))
        goto none;
    if (!PyUnicode_CheckExact(language)) goto none;
    if (remark != Py_None && !PyUnicode_CheckExact(remark)) goto none;
    if (ext != Py_None && !PyDict_CheckExact(ext)) goto none;
    if (!put(&o, "{\"code\":", 8) || !put_ll(&o, code) || !put(&o, ",\"extFields\":{", 14))
        goto done;
    if (ext != Py_None) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        int first = 1;
        while (PyDict_Next(ext, &pos, &k, &v)) {
            if (!PyUnicode_CheckExact(k) || !PyUnicode_CheckExact(v)) goto none;
            if (!first && !put(&o, ",", 1)) goto done;
            first = 0;
            if (!put_str(&o, k)) goto error_or_none;
            if (!put(&o, ":", 1)) goto done;
            if (!put_str(&o, v)) goto error_or_none;
        }
    }
    if (!put(&o, "},\"flag\":", 9) || !put_ll(&o, flag) || !put(&o, ",\"language\":", 12))
        goto done;
    if (!put_str(&o, language)) goto error_or_none;
    if (!put(&o, ",\"opaque\":", 10) || !put_ll(&o, opaque)
        || !put(&o, ",\"serializeTypeCurrentRPC\":\"JSON\",\"version\":", 44)
        || !put_ll(&o, version))
        goto done;
    if (remark != Py_None) {
        if (!put(&o, ",\"remark\":", 10)) goto done;
        if (!put_str(&o, remark)) goto error_or_none;
    }
    if (!put(&o, "}", 1)) goto done;
    size_t header_len = o.len - 8;
    /* past these limits codec.py raises (ValueError, struct.error): its path says so */
    if (header_len > 0xFFFFFF || body_len < 0 || 4 + header_len + (size_t)body_len > 0x7FFFFFFF)
        goto none;
    uint32_t total = (uint32_t)(4 + header_len + (size_t)body_len);
    uint32_t tl = (uint32_t)header_len;
    unsigned char *b = o.buf;
    b[0] = total >> 24; b[1] = total >> 16; b[2] = total >> 8; b[3] = total;
    b[4] = tl >> 24; b[5] = tl >> 16; b[6] = tl >> 8; b[7] = tl;
    result = PyBytes_FromStringAndSize((const char *)o.buf, o.len);
    goto done;
error_or_none:
    if (PyErr_Occurred()) goto done;
none:
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < 8; i++) Py_XDECREF(f[i]);
    if (o.buf != o.inline_buf) PyMem_Free(o.buf);
    return result;
}

static PyObject *configure(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "configure(command_class, json_type)");
        return NULL;
    }
    Py_XSETREF(command_class, Py_NewRef(args[0]));
    Py_XSETREF(json_type, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_frame", decode_frame, METH_O, "The command of a frame without its length field, or None."},
    {"encode_prefixed", (PyCFunction)(void (*)(void))encode_prefixed, METH_FASTCALL,
     "Length, headerLenAndType and JSON header of a command, or None."},
    {"configure", (PyCFunction)(void (*)(void))configure, METH_FASTCALL,
     "The RemotingCommand class and SerializeType.JSON."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_json_header", "The usual JSON remoting header in C (codec.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__json_header(void) {
    static const char *names[8] = {"code", "ext_fields", "flag", "language",
                                   "opaque", "version", "remark", "serialize_type"};
    for (int i = 0; i < 8; i++) {
        if ((attr_names[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    }
    if ((str_java = PyUnicode_InternFromString("JAVA")) == NULL) return NULL;
    return PyModule_Create(&module);
}
