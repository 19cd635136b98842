/*
 * vecfn.c - embkv's vector SQL functions, the vector aggregates and
 * embkv_version() / embkv_build().
 *
 * A vector is a float32 little-endian BLOB (4 bytes per element, as stored
 * in the vec column of an embkv table) or, wherever a vector is an input, a
 * JSON array of numbers as TEXT ('[0.5, -1, 2e-3]').  An empty vector (0
 * dimensions) is an error everywhere: embkv tables have dim >= 1.
 *
 *   embkv_vec(v)         -> BLOB   v validated and converted to a float32 BLOB
 *   embkv_json(v)        -> TEXT   JSON array, shortest round-trip floats
 *   embkv_dims(v)        -> INTEGER number of elements
 *   embkv_dot(a, b)      -> REAL   sum a[i]*b[i]
 *   embkv_cosine(a, b)   -> REAL   dot / (|a| |b|), clamped to [-1, 1];
 *                                  NULL when a or b is the zero vector
 *   embkv_l2(a, b)       -> REAL   Euclidean distance |a - b|
 *   embkv_norm(a)        -> REAL   |a|
 *   embkv_add(a, b), embkv_sub(a, b), embkv_scale(a, k) -> BLOB
 *   embkv_sum(v), embkv_avg(v)   aggregates (and window functions) -> BLOB;
 *                                NULL rows are skipped, no rows -> NULL
 *   embkv_version()      -> TEXT   the release, EMBKV_VERSION_STRING of embkv.h
 *   embkv_build()        -> TEXT   JSON: which optional parts were compiled in
 *
 * Semantics shared by all of them:
 *  - A NULL vector argument gives NULL (SQL convention); any other non-vector
 *    argument (INTEGER, REAL, a TEXT that is not a JSON array of numbers, a
 *    BLOB whose length is not a multiple of 4) is an error naming the
 *    function (and the argument, for functions of two vectors).
 *  - Two vectors of different lengths: "embkv_dot: dimension mismatch: 64 vs 32".
 *  - JSON input must be an array of finite numbers that fit float32;
 *    NaN/Inf (e.g. 1e999) or out-of-range values (1e39) are errors.  A JSON
 *    number is rounded to the nearest float32.
 *  - BLOB input is taken as is by the math functions (no per-element check,
 *    for speed); a non-finite result (from NaN/Inf bit patterns in a BLOB, or
 *    float32 overflow of add/sub/scale/sum) is an error, never a silent NULL.
 *    embkv_vec() and embkv_json() reject NaN/Inf elements of a BLOB.
 *  - Reductions (dot, norm, l2, cosine, sum, avg) accumulate in double, in
 *    element order; element-wise results are rounded once to float32.
 *  - embkv_json() writes each element with the fewest significant digits
 *    (1 to 9) that read back to the same float32, so
 *    embkv_vec(embkv_json(v)) = v bit for bit: plain notation when the
 *    decimal exponent is in [-4, 16) ("0.1", "10", "16777216", "-0"),
 *    otherwise "1e+20", "1.5e-05" (the style of numpy's float32 repr).
 *  - The pure functions are SQLITE_UTF8 | SQLITE_INNOCUOUS |
 *    SQLITE_DETERMINISTIC, so they may be used in views, triggers, indexes
 *    and generated columns.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define VEC_BIG_ENDIAN 1
#else
#define VEC_BIG_ENDIAN 0
#endif

#define VEC_LOCAL 64 /* floats copied on the stack before going to the heap */

/* A vector argument: v points to n floats in native byte order, either into
 * the argument's BLOB itself (aligned little-endian input: no copy) or into
 * local/heap. */
typedef struct vecarg {
    const float *v;
    sqlite3_int64 n;
    float *heap;
    float local[VEC_LOCAL];
} vecarg;

enum { VEC_OK = 0, VEC_NULL = 1, VEC_ERR = 2 };

static void vecarg_free(vecarg *a)
{
    sqlite3_free(a->heap);
    a->heap = NULL;
}

/* Room for n floats owned by the vecarg. */
static float *vecarg_room(vecarg *a, sqlite3_int64 n)
{
    if (n <= VEC_LOCAL) return a->local;
    a->heap = sqlite3_malloc64((sqlite3_uint64)n * sizeof(float));
    return a->heap;
}

static uint32_t bswap32(uint32_t x)
{
    return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}

/* Copy n little-endian float32 from bytes p into native floats dst. */
static void load_le(float *dst, const unsigned char *p, sqlite3_int64 n)
{
    memcpy(dst, p, (size_t)n * sizeof(float));
#if VEC_BIG_ENDIAN
    for (sqlite3_int64 i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &dst[i], 4);
        u = bswap32(u);
        memcpy(&dst[i], &u, 4);
    }
#endif
}

/* Convert n native floats in place to little-endian byte order. */
static void store_le(float *v, sqlite3_int64 n)
{
#if VEC_BIG_ENDIAN
    for (sqlite3_int64 i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        u = bswap32(u);
        memcpy(&v[i], &u, 4);
    }
#else
    (void)v;
    (void)n;
    (void)bswap32;
#endif
}

/* Report an error "fname: [argument K: ]message" built from a printf format. */
static void vec_error(sqlite3_context *ctx, const char *fname, int argno,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    char *full = NULL;
    if (msg) {
        full = argno > 0 ? sqlite3_mprintf("%s: argument %d: %s", fname, argno, msg)
                         : sqlite3_mprintf("%s: %s", fname, msg);
    }
    if (full)
        sqlite3_result_error(ctx, full, -1);
    else
        sqlite3_result_error_nomem(ctx);
    sqlite3_free(msg);
    sqlite3_free(full);
}

static const char *type_name(int t)
{
    switch (t) {
    case SQLITE_INTEGER: return "an INTEGER";
    case SQLITE_FLOAT: return "a REAL";
    case SQLITE_TEXT: return "a TEXT";
    case SQLITE_BLOB: return "a BLOB";
    default: return "NULL";
    }
}

static const char *json_kind(const cJSON *j)
{
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsNumber(j)) return "a number";
    return "not a JSON value";
}

/* Length of at most max bytes of s, not cutting a UTF-8 sequence. */
static int snippet_len(const char *s, int avail, int max)
{
    int n = avail < max ? avail : max;
    if (n < avail)
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80) n--;
    return n;
}

/* Parse JSON text (len bytes, NUL-terminated as SQLite guarantees) into
 * floats. */
static int parse_json_vec(sqlite3_context *ctx, const char *fname, int argno,
                          const char *text, int len, vecarg *out)
{
    const char *nul = memchr(text, 0, (size_t)len);
    if (nul) {
        vec_error(ctx, fname, argno,
                  "not a JSON array of numbers: NUL character at offset %d",
                  (int)(nul - text));
        return VEC_ERR;
    }
    int first = 0;
    while (first < len && strchr(" \t\r\n", text[first])) first++;
    if (first == len) {
        vec_error(ctx, fname, argno, "not a JSON array of numbers: empty text");
        return VEC_ERR;
    }
    size_t badnum = ek_json_bad_number(text, (size_t)len);
    if (badnum != SIZE_MAX) {
        vec_error(ctx, fname, argno, "not a JSON array of numbers: invalid JSON number at offset %d: '%.*s'",
                  (int)badnum, snippet_len(text + badnum, len - (int)badnum, 20), text + badnum);
        return VEC_ERR;
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)len + 1, &end, 1);
    if (!root || end != text + len) {
        int off = end ? (int)(end - text) : 0;
        if (off < 0 || off > len) off = 0;
        if (off >= len)
            vec_error(ctx, fname, argno,
                      "not a JSON array of numbers: invalid JSON (unexpected end of text)");
        else
            vec_error(ctx, fname, argno,
                      "not a JSON array of numbers: invalid JSON at offset %d: '%.*s'",
                      off, snippet_len(text + off, len - off, 20), text + off);
        cJSON_Delete(root);
        return VEC_ERR;
    }
    if (!cJSON_IsArray(root)) {
        vec_error(ctx, fname, argno, "not a JSON array of numbers: got %s",
                  json_kind(root));
        cJSON_Delete(root);
        return VEC_ERR;
    }
    sqlite3_int64 n = 0;
    for (const cJSON *e = root->child; e; e = e->next) n++;
    if (n == 0) {
        vec_error(ctx, fname, argno, "empty vector (0 dimensions)");
        cJSON_Delete(root);
        return VEC_ERR;
    }
    float *dst = vecarg_room(out, n);
    if (!dst) {
        sqlite3_result_error_nomem(ctx);
        cJSON_Delete(root);
        return VEC_ERR;
    }
    sqlite3_int64 i = 0;
    for (const cJSON *e = root->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e)) {
            vec_error(ctx, fname, argno,
                      "not a JSON array of numbers: element %lld is %s",
                      (long long)i, json_kind(e));
            cJSON_Delete(root);
            return VEC_ERR;
        }
        double d = e->valuedouble;
        if (!isfinite(d)) {
            vec_error(ctx, fname, argno, "element %lld is not a finite number",
                      (long long)i);
            cJSON_Delete(root);
            return VEC_ERR;
        }
        float f = (float)d;
        if (!isfinite(f)) {
            vec_error(ctx, fname, argno, "element %lld is out of float32 range: %.9g",
                      (long long)i, d);
            cJSON_Delete(root);
            return VEC_ERR;
        }
        dst[i] = f;
    }
    cJSON_Delete(root);
    out->v = dst;
    out->n = n;
    return VEC_OK;
}

/* Fetch argument v as a vector.  argno names the argument in messages (0:
 * unnamed).  Returns VEC_OK, VEC_NULL (SQL NULL; nothing reported) or
 * VEC_ERR (error already reported on ctx).  On VEC_OK the caller must call
 * vecarg_free. */
static int get_vec(sqlite3_context *ctx, const char *fname, int argno,
                   sqlite3_value *v, vecarg *out)
{
    out->v = NULL;
    out->n = 0;
    out->heap = NULL;
    int t = sqlite3_value_type(v);
    if (t == SQLITE_NULL) return VEC_NULL;
    if (t == SQLITE_BLOB) {
        const unsigned char *p = sqlite3_value_blob(v);
        int len = sqlite3_value_bytes(v);
        if (len == 0 || !p) {
            vec_error(ctx, fname, argno, "empty vector (0 dimensions)");
            return VEC_ERR;
        }
        if (len % 4 != 0) {
            vec_error(ctx, fname, argno,
                      "BLOB of %d byte%s is not a float32 vector (length not a multiple of 4)",
                      len, len == 1 ? "" : "s");
            return VEC_ERR;
        }
        sqlite3_int64 n = len / 4;
#ifdef EMBKV_VECFN_FORCE_COPY /* testing: exercise the unaligned path */
        if (0) {
#else
        if (!VEC_BIG_ENDIAN && ((uintptr_t)p % _Alignof(float)) == 0) {
#endif
            out->v = (const float *)(const void *)p; /* zero-copy fast path */
        } else {
            float *dst = vecarg_room(out, n);
            if (!dst) {
                sqlite3_result_error_nomem(ctx);
                return VEC_ERR;
            }
            load_le(dst, p, n);
            out->v = dst;
        }
        out->n = n;
        return VEC_OK;
    }
    if (t == SQLITE_TEXT) {
        const char *s = (const char *)sqlite3_value_text(v);
        int len = sqlite3_value_bytes(v);
        if (!s) {
            sqlite3_result_error_nomem(ctx);
            return VEC_ERR;
        }
        int rc = parse_json_vec(ctx, fname, argno, s, len, out);
        if (rc != VEC_OK) vecarg_free(out);
        return rc;
    }
    vec_error(ctx, fname, argno,
              "expected a vector (float32 BLOB or JSON array text), got %s",
              type_name(t));
    return VEC_ERR;
}

/* Reject NaN/Inf elements (embkv_vec, embkv_json). */
static int check_finite(sqlite3_context *ctx, const char *fname, const vecarg *a)
{
    for (sqlite3_int64 i = 0; i < a->n; i++) {
        if (!isfinite(a->v[i])) {
            vec_error(ctx, fname, 0, "element %lld is %s", (long long)i,
                      isnan(a->v[i]) ? "NaN" : "infinite");
            return VEC_ERR;
        }
    }
    return VEC_OK;
}

/* Hand n native floats (sqlite3_malloc'd, ownership passes) back as a BLOB. */
static void result_vec(sqlite3_context *ctx, float *v, sqlite3_int64 n)
{
    store_le(v, n);
    sqlite3_result_blob64(ctx, v, (sqlite3_uint64)n * sizeof(float), sqlite3_free);
}

/* Check a finished element-wise result for float32 overflow / NaN. */
static int check_result(sqlite3_context *ctx, const char *fname, const float *r,
                        sqlite3_int64 n)
{
    for (sqlite3_int64 i = 0; i < n; i++) {
        if (!isfinite(r[i])) {
            vec_error(ctx, fname, 0,
                      "result element %lld is not finite (float32 overflow, or NaN/Inf in the input)",
                      (long long)i);
            return VEC_ERR;
        }
    }
    return VEC_OK;
}

/* Fetch two vector arguments of equal length.  On VEC_OK both must be freed;
 * otherwise nothing is held. */
static int get_vec2(sqlite3_context *ctx, const char *fname, sqlite3_value **argv,
                    vecarg *a, vecarg *b)
{
    int rc = get_vec(ctx, fname, 1, argv[0], a);
    if (rc != VEC_OK) return rc;
    rc = get_vec(ctx, fname, 2, argv[1], b);
    if (rc != VEC_OK) {
        vecarg_free(a);
        return rc;
    }
    if (a->n != b->n) {
        vec_error(ctx, fname, 0, "dimension mismatch: %lld vs %lld",
                  (long long)a->n, (long long)b->n);
        vecarg_free(a);
        vecarg_free(b);
        return VEC_ERR;
    }
    return VEC_OK;
}

static void result_real(sqlite3_context *ctx, const char *fname, double d)
{
    if (!isfinite(d))
        vec_error(ctx, fname, 0, "result is not finite (NaN or Inf in the input)");
    else
        sqlite3_result_double(ctx, d);
}

/* ---- kernels (double accumulation, element order) ---------------------- */

static double k_dot(const float *a, const float *b, sqlite3_int64 n)
{
    double s = 0;
    for (sqlite3_int64 i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

static double k_sumsq(const float *a, sqlite3_int64 n)
{
    double s = 0;
    for (sqlite3_int64 i = 0; i < n; i++) s += (double)a[i] * (double)a[i];
    return s;
}

static double k_l2sq(const float *a, const float *b, sqlite3_int64 n)
{
    double s = 0;
    for (sqlite3_int64 i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        s += d * d;
    }
    return s;
}

/* ---- scalar functions --------------------------------------------------- */

static void fn_vec(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    vecarg a;
    if (get_vec(ctx, "embkv_vec", 0, argv[0], &a) != VEC_OK) return;
    if (check_finite(ctx, "embkv_vec", &a) == VEC_OK) {
        if (sqlite3_value_type(argv[0]) == SQLITE_BLOB) {
            sqlite3_result_value(ctx, argv[0]);
        } else {
            float *r = sqlite3_malloc64((sqlite3_uint64)a.n * sizeof(float));
            if (!r) {
                sqlite3_result_error_nomem(ctx);
            } else {
                memcpy(r, a.v, (size_t)a.n * sizeof(float));
                result_vec(ctx, r, a.n);
            }
        }
    }
    vecarg_free(&a);
}

/* Format a finite float32 as the shortest decimal (1 to 9 significant
 * digits) that reads back as the same float32, numpy/Python style: plain
 * notation when the decimal exponent is in [-4, 16), otherwise d.ddde+XX.
 * Examples: 0.1, 10, 16777216, 0.33333334, 1e+20, 1e-45, -0.  The decimal
 * point is '.' whatever the locale.  buf must hold FMT_MAX bytes.  Returns
 * the length written. */
#define FMT_MAX 32
static int fmt_float(char *buf, float f)
{
    if (f == 0) {
        int n = 0;
        if (signbit(f)) buf[n++] = '-';
        buf[n++] = '0';
        buf[n] = 0;
        return n;
    }
    char tmp[FMT_MAX];
    /* The round trip holds with 9 significant digits always, and if it holds
     * with N digits it holds with more, so binary search the fewest. */
    int lo = 1, hi = 9;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        int w = snprintf(tmp, sizeof tmp, "%.*e", mid - 1, (double)f);
        if (w > 0 && (size_t)w < sizeof tmp && strtof(tmp, NULL) == f)
            hi = mid;
        else
            lo = mid + 1;
    }
    int w = snprintf(tmp, sizeof tmp, "%.*e", lo - 1, (double)f);
    if (w <= 0 || (size_t)w >= sizeof tmp) return 0; /* cannot happen */
    /* Split "-d.ddde+XX" (any locale's decimal point) into digits and exponent. */
    char dig[16];
    int nd = 0, i = 0, neg = 0;
    if (tmp[i] == '-') {
        neg = 1;
        i++;
    }
    for (; tmp[i] && tmp[i] != 'e' && nd < (int)sizeof dig - 1; i++)
        if (tmp[i] >= '0' && tmp[i] <= '9') dig[nd++] = tmp[i];
    int e = tmp[i] == 'e' ? atoi(tmp + i + 1) : 0;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    int n = 0;
    if (neg) buf[n++] = '-';
    if (e >= 16 || e < -4) {
        buf[n++] = dig[0];
        if (nd > 1) {
            buf[n++] = '.';
            memcpy(buf + n, dig + 1, (size_t)(nd - 1));
            n += nd - 1;
        }
        int x = snprintf(buf + n, (size_t)(FMT_MAX - n), "e%c%02d", e < 0 ? '-' : '+',
                         e < 0 ? -e : e);
        if (x <= 0 || x >= FMT_MAX - n) return 0; /* cannot happen: |e| <= 45 */
        n += x;
    } else if (e < 0) {
        buf[n++] = '0';
        buf[n++] = '.';
        for (int z = 0; z < -e - 1; z++) buf[n++] = '0';
        memcpy(buf + n, dig, (size_t)nd);
        n += nd;
    } else {
        for (int k = 0; k <= e; k++) buf[n++] = k < nd ? dig[k] : '0';
        if (nd > e + 1) {
            buf[n++] = '.';
            memcpy(buf + n, dig + e + 1, (size_t)(nd - e - 1));
            n += nd - e - 1;
        }
    }
    buf[n] = 0;
    return n;
}

static void fn_json(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    vecarg a;
    if (get_vec(ctx, "embkv_json", 0, argv[0], &a) != VEC_OK) return;
    if (check_finite(ctx, "embkv_json", &a) != VEC_OK) {
        vecarg_free(&a);
        return;
    }
    /* The longest element is 17 chars ("-0.00012345678" or
     * "-1234567890000000"), plus a comma. */
    sqlite3_uint64 cap = (sqlite3_uint64)a.n * 18 + 3;
    char *out = sqlite3_malloc64(cap);
    if (!out) {
        sqlite3_result_error_nomem(ctx);
        vecarg_free(&a);
        return;
    }
    sqlite3_uint64 pos = 0;
    out[pos++] = '[';
    for (sqlite3_int64 i = 0; i < a.n; i++) {
        char buf[FMT_MAX];
        int len = fmt_float(buf, a.v[i]);
        if (i) out[pos++] = ',';
        memcpy(out + pos, buf, (size_t)len);
        pos += (sqlite3_uint64)len;
    }
    out[pos++] = ']';
    out[pos] = 0;
    sqlite3_result_text64(ctx, out, pos, sqlite3_free, SQLITE_UTF8);
    vecarg_free(&a);
}

static void fn_dims(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    vecarg a;
    if (get_vec(ctx, "embkv_dims", 0, argv[0], &a) != VEC_OK) return;
    sqlite3_result_int64(ctx, a.n);
    vecarg_free(&a);
}

static void fn_norm(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    vecarg a;
    if (get_vec(ctx, "embkv_norm", 0, argv[0], &a) != VEC_OK) return;
    result_real(ctx, "embkv_norm", sqrt(k_sumsq(a.v, a.n)));
    vecarg_free(&a);
}

static void fn_dot(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    vecarg a, b;
    if (get_vec2(ctx, "embkv_dot", argv, &a, &b) != VEC_OK) return;
    result_real(ctx, "embkv_dot", k_dot(a.v, b.v, a.n));
    vecarg_free(&a);
    vecarg_free(&b);
}

static void fn_l2(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    vecarg a, b;
    if (get_vec2(ctx, "embkv_l2", argv, &a, &b) != VEC_OK) return;
    result_real(ctx, "embkv_l2", sqrt(k_l2sq(a.v, b.v, a.n)));
    vecarg_free(&a);
    vecarg_free(&b);
}

static void fn_cosine(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    vecarg a, b;
    if (get_vec2(ctx, "embkv_cosine", argv, &a, &b) != VEC_OK) return;
    double dot = 0, na = 0, nb = 0;
    for (sqlite3_int64 i = 0; i < a.n; i++) {
        double x = (double)a.v[i], y = (double)b.v[i];
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if (!isfinite(dot) || !isfinite(na) || !isfinite(nb)) {
        result_real(ctx, "embkv_cosine", (double)NAN);
    } else if (na == 0 || nb == 0) {
        sqlite3_result_null(ctx); /* undefined for a zero vector, like x/0 */
    } else {
        /* sqrt(na * nb) rather than sqrt(na) * sqrt(nb): sqrt(x*x) == x
         * exactly in IEEE arithmetic, so parallel vectors give exactly 1.
         * No overflow: na, nb < 2^31 * 2^256 for float32 inputs. */
        double c = dot / sqrt(na * nb);
        if (c > 1) c = 1;
        if (c < -1) c = -1;
        sqlite3_result_double(ctx, c);
    }
    vecarg_free(&a);
    vecarg_free(&b);
}

/* op: 0 add, 1 sub */
static void elementwise(sqlite3_context *ctx, sqlite3_value **argv,
                        const char *fname, int op)
{
    vecarg a, b;
    if (get_vec2(ctx, fname, argv, &a, &b) != VEC_OK) return;
    float *r = sqlite3_malloc64((sqlite3_uint64)a.n * sizeof(float));
    if (!r) {
        sqlite3_result_error_nomem(ctx);
    } else {
        if (op == 0)
            for (sqlite3_int64 i = 0; i < a.n; i++) r[i] = (float)((double)a.v[i] + (double)b.v[i]);
        else
            for (sqlite3_int64 i = 0; i < a.n; i++) r[i] = (float)((double)a.v[i] - (double)b.v[i]);
        if (check_result(ctx, fname, r, a.n) == VEC_OK)
            result_vec(ctx, r, a.n);
        else
            sqlite3_free(r);
    }
    vecarg_free(&a);
    vecarg_free(&b);
}

static void fn_add(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    elementwise(ctx, argv, "embkv_add", 0);
}

static void fn_sub(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    elementwise(ctx, argv, "embkv_sub", 1);
}

static void fn_scale(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    int kt = sqlite3_value_type(argv[1]);
    if (kt == SQLITE_NULL) return; /* NULL factor: NULL */
    if (kt != SQLITE_INTEGER && kt != SQLITE_FLOAT) {
        vec_error(ctx, "embkv_scale", 2, "expected a number, got %s", type_name(kt));
        return;
    }
    double k = sqlite3_value_double(argv[1]);
    if (!isfinite(k)) {
        vec_error(ctx, "embkv_scale", 2, "the factor is not finite");
        return;
    }
    vecarg a;
    if (get_vec(ctx, "embkv_scale", 1, argv[0], &a) != VEC_OK) return;
    float *r = sqlite3_malloc64((sqlite3_uint64)a.n * sizeof(float));
    if (!r) {
        sqlite3_result_error_nomem(ctx);
    } else {
        for (sqlite3_int64 i = 0; i < a.n; i++) r[i] = (float)((double)a.v[i] * k);
        if (check_result(ctx, "embkv_scale", r, a.n) == VEC_OK)
            result_vec(ctx, r, a.n);
        else
            sqlite3_free(r);
    }
    vecarg_free(&a);
}

static void fn_version(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    (void)argv;
    sqlite3_result_text(ctx, EMBKV_VERSION_STRING, -1, SQLITE_STATIC);
}

#define VEC_STR2(x) #x
#define VEC_STR(x) VEC_STR2(x)
/* What this build contains: liburing (the SSD tier) and libpmem's
 * pmem_is_pmem() (persistent-memory detection) are always linked in; CUDA
 * gathering only when built with nvcc (the engine says: embkv_gpu_compiled). */
static const char build_json_cuda[] =
    "{\"version\":\"" EMBKV_VERSION_STRING "\""
    ",\"format_version\":" VEC_STR(EMBKV_FORMAT_VERSION)
    ",\"liburing\":true"
    ",\"cuda\":true"
    ",\"pm_detection\":true"
    ",\"sqlite_headers\":\"" SQLITE_VERSION "\""
    "}";
static const char build_json_plain[] =
    "{\"version\":\"" EMBKV_VERSION_STRING "\""
    ",\"format_version\":" VEC_STR(EMBKV_FORMAT_VERSION)
    ",\"liburing\":true"
    ",\"cuda\":false"
    ",\"pm_detection\":true"
    ",\"sqlite_headers\":\"" SQLITE_VERSION "\""
    "}";

static void fn_build(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    (void)argv;
    sqlite3_result_text(ctx, embkv_gpu_compiled() ? build_json_cuda : build_json_plain, -1, SQLITE_STATIC);
}

/* ---- aggregates: embkv_sum, embkv_avg (also window functions) ---------- */

/* Sums are compensated (Neumaier): a window frame removes leaving rows by
 * subtraction, and a plain double sum would lose small rows added next to a
 * huge one that later leaves ([1e30] then [1] minus [1e30] must give [1]). */
typedef struct vagg {
    double *acc;         /* dim sums then dim compensations; NULL when empty */
    sqlite3_int64 dim;
    sqlite3_int64 count; /* vectors currently in the aggregate */
} vagg;

static void neumaier_add(double *sum, double *comp, double x)
{
    double t = *sum + x;
    if (fabs(*sum) >= fabs(x))
        *comp += (*sum - t) + x;
    else
        *comp += (x - t) + *sum;
    *sum = t;
}

static const char *agg_name(sqlite3_context *ctx)
{
    return sqlite3_user_data(ctx) ? "embkv_avg" : "embkv_sum";
}

static void agg_add(sqlite3_context *ctx, sqlite3_value *v, int sign)
{
    const char *fname = agg_name(ctx);
    vagg *g = sqlite3_aggregate_context(ctx, sizeof *g);
    if (!g) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    vecarg a;
    if (get_vec(ctx, fname, 0, v, &a) != VEC_OK) return; /* NULL: skipped */
    if (!g->acc) {
        g->acc = sqlite3_malloc64((sqlite3_uint64)a.n * 2 * sizeof(double));
        if (!g->acc) {
            sqlite3_result_error_nomem(ctx);
            vecarg_free(&a);
            return;
        }
        memset(g->acc, 0, (size_t)a.n * 2 * sizeof(double));
        g->dim = a.n;
    } else if (g->dim != a.n) {
        vec_error(ctx, fname, 0, "dimension mismatch: %lld vs %lld",
                  (long long)g->dim, (long long)a.n);
        vecarg_free(&a);
        return;
    }
    for (sqlite3_int64 i = 0; i < a.n; i++)
        neumaier_add(&g->acc[i], &g->acc[a.n + i], sign * (double)a.v[i]);
    g->count += sign;
    vecarg_free(&a);
    if (g->count == 0) {
        /* The frame is empty: start afresh (no residue, any dimension next). */
        sqlite3_free(g->acc);
        g->acc = NULL;
        g->dim = 0;
    }
}

static void agg_step(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    agg_add(ctx, argv[0], +1);
}

static void agg_inverse(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    agg_add(ctx, argv[0], -1);
}

static void agg_result(sqlite3_context *ctx)
{
    vagg *g = sqlite3_aggregate_context(ctx, 0);
    if (!g || !g->acc || g->count <= 0) return; /* no vectors: NULL */
    const char *fname = agg_name(ctx);
    double div = sqlite3_user_data(ctx) ? (double)g->count : 1.0;
    float *r = sqlite3_malloc64((sqlite3_uint64)g->dim * sizeof(float));
    if (!r) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    for (sqlite3_int64 i = 0; i < g->dim; i++) r[i] = (float)((g->acc[i] + g->acc[g->dim + i]) / div);
    if (check_result(ctx, fname, r, g->dim) == VEC_OK)
        result_vec(ctx, r, g->dim);
    else
        sqlite3_free(r);
}

static void agg_value(sqlite3_context *ctx)
{
    agg_result(ctx);
}

static void agg_final(sqlite3_context *ctx)
{
    agg_result(ctx);
    vagg *g = sqlite3_aggregate_context(ctx, 0);
    if (g) {
        sqlite3_free(g->acc);
        g->acc = NULL;
    }
}

/* ---- registration ------------------------------------------------------- */

int embkv_vecfn_register(sqlite3 *db)
{
    static const struct {
        const char *name;
        int narg;
        void (*fn)(sqlite3_context *, int, sqlite3_value **);
    } scalars[] = {
        {"embkv_vec", 1, fn_vec},       {"embkv_json", 1, fn_json},
        {"embkv_dims", 1, fn_dims},     {"embkv_dot", 2, fn_dot},
        {"embkv_cosine", 2, fn_cosine}, {"embkv_l2", 2, fn_l2},
        {"embkv_norm", 1, fn_norm},     {"embkv_add", 2, fn_add},
        {"embkv_sub", 2, fn_sub},       {"embkv_scale", 2, fn_scale},
        {"embkv_version", 0, fn_version}, {"embkv_build", 0, fn_build},
    };
    const int flags = SQLITE_UTF8 | SQLITE_INNOCUOUS | SQLITE_DETERMINISTIC;
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        int rc = sqlite3_create_function_v2(db, scalars[i].name, scalars[i].narg, flags,
                                            NULL, scalars[i].fn, NULL, NULL, NULL);
        if (rc != SQLITE_OK) return rc;
    }
    /* user data: NULL for the sum, non-NULL for the average */
    static int avg_tag;
    int rc = sqlite3_create_window_function(db, "embkv_sum", 1, flags, NULL, agg_step,
                                            agg_final, agg_value, agg_inverse, NULL);
    if (rc != SQLITE_OK) return rc;
    return sqlite3_create_window_function(db, "embkv_avg", 1, flags, &avg_tag, agg_step,
                                          agg_final, agg_value, agg_inverse, NULL);
}
