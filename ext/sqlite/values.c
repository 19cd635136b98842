/*
 * values.c - the values an embkv table takes: ids and vectors.
 *
 * An id is an INTEGER, or a REAL with an integral value, or TEXT that reads
 * as an integer (what INTEGER affinity would convert); anything else is an
 * error on writes and matches nothing on lookups.  A vector is a float32
 * little-endian BLOB of exactly dim*4 bytes or a JSON array (TEXT) of dim
 * numbers that fit float32; NaN and infinities are rejected either way.
 * Every message names the table and the id and says what was expected.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_digit(char c) { return c >= '0' && c <= '9'; }

size_t ek_json_number(const char *p)
{
    const char *q = p;
    if (*q == '-') q++;
    if (*q == '0') q++;
    else if (*q >= '1' && *q <= '9') while (is_digit(*q)) q++;
    else return 0;
    if (*q == '.') {
        if (!is_digit(*++q)) return 0;
        while (is_digit(*q)) q++;
    }
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!is_digit(*q)) return 0;
        while (is_digit(*q)) q++;
    }
    return (size_t)(q - p);
}

size_t ek_json_bad_number(const char *s, size_t n)
{
    /* cJSON is lenient with numbers ('01', '1.', hex through strtod):
     * every number token is checked against JSON's grammar.  Strings are
     * skipped whole. */
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\') i++;
            i++;
        } else if (c == '-' || is_digit(c)) {
            size_t k = ek_json_number(s + i);
            if (!k) return i;
            size_t at = i;
            i += k;
            if (i < n && (is_digit(s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' || s[i] == '+' ||
                          s[i] == '-' || s[i] == 'x' || s[i] == 'X'))
                return at;
        } else if (c == '+' || c == '.') {
            return i;
        } else {
            i++;
        }
    }
    return SIZE_MAX;
}

cJSON *ek_json_parse(const char *s, size_t n)
{
    if (!s || memchr(s, 0, n)) return NULL;  /* cJSON would take a NUL for white space */
    if (ek_json_bad_number(s, n) != SIZE_MAX) return NULL;
    /* n + 1: the terminating NUL is part of the buffer, so cJSON refuses
     * anything after the value. */
    return cJSON_ParseWithLengthOpts(s, n + 1, NULL, 1);
}

/* An id from a value: INTEGER, a REAL with an integral value, or TEXT that
 * reads as one (as INTEGER affinity would convert it).  1 if it is one. */
int value_to_id(sqlite3_value *val, int64_t *out)
{
    switch (sqlite3_value_type(val)) {
    case SQLITE_INTEGER:
        *out = sqlite3_value_int64(val);
        return 1;
    case SQLITE_FLOAT: {
        double d = sqlite3_value_double(val);
        if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == floor(d)) {
            *out = (int64_t)d;
            return 1;
        }
        return 0;
    }
    case SQLITE_TEXT: {
        const char *s = (const char *)sqlite3_value_text(val);
        if (!s) return 0;
        while (ek_is_blank(*s)) s++;
        size_t n = strlen(s);
        while (n > 0 && ek_is_blank(s[n - 1])) n--;
        if (n == 0 || n > 64 || strspn(s, "0123456789+-.eE") < n) return 0;
        char buf[72];
        memcpy(buf, s, n);
        buf[n] = 0;
        /* Exact integers first (beyond 2^53 a double would round). */
        const char *p = buf;
        int neg = 0;
        if (*p == '+' || *p == '-') neg = *p++ == '-';
        if (*p && strspn(p, "0123456789") == strlen(p)) {
            uint64_t u = 0;
            for (; *p; p++) {
                if (u > (UINT64_MAX - 9) / 10) return 0;
                u = u * 10 + (uint64_t)(*p - '0');
            }
            if (neg ? u > (uint64_t)INT64_MAX + 1 : u > (uint64_t)INT64_MAX) return 0;
            *out = neg ? (int64_t)(0 - u) : (int64_t)u;
            return 1;
        }
        char *end = NULL;
        errno = 0;
        double d = strtod(buf, &end);
        if (errno || *end || !(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d))
            return 0;
        *out = (int64_t)d;
        return 1;
    }
    default:
        return 0;
    }
}

/* The id of a write, or an error naming what was given. */
int write_id(ekvtab *v, sqlite3_value *val, int64_t *out)
{
    if (value_to_id(val, out)) return SQLITE_OK;
    switch (sqlite3_value_type(val)) {
    case SQLITE_NULL:
        vt_err(v, "id must be an INTEGER, got NULL (an embkv table has no automatic ids)");
        break;
    case SQLITE_TEXT:
        vt_err(v, "id must be an INTEGER, got TEXT '%.40s'", (const char *)sqlite3_value_text(val));
        break;
    case SQLITE_FLOAT:
        vt_err(v, "id must be an INTEGER, got REAL %!.15g", sqlite3_value_double(val));
        break;
    default:
        vt_err(v, "id must be an INTEGER, got a %d-byte BLOB", sqlite3_value_bytes(val));
        break;
    }
    return SQLITE_MISMATCH;
}

static const char *nonfinite_name(float f)
{
    return isnan(f) ? "NaN" : f > 0 ? "Inf" : "-Inf";
}

/* A vector from a float32 BLOB or a JSON array of numbers, into out. */
int parse_vec(ekvtab *v, int64_t id, sqlite3_value *val, float *out)
{
    const unsigned dim = v->dim;
#define EXPECT "id %lld: vector must be %u float32 (%u-byte BLOB) or a JSON array of %u numbers, got "
#define EXPECT_ARGS (long long)id, dim, dim * 4, dim
    switch (sqlite3_value_type(val)) {
    case SQLITE_BLOB: {
        int n = sqlite3_value_bytes(val);
        const void *b = sqlite3_value_blob(val);
        if ((unsigned)n != dim * 4 || !b) {
            vt_err(v, EXPECT "a %d-byte BLOB", EXPECT_ARGS, n);
            return SQLITE_MISMATCH;
        }
        memcpy(out, b, (size_t)dim * 4);
        for (unsigned i = 0; i < dim; i++) {
            if (!isfinite(out[i])) {
                vt_err(v, "id %lld: vec[%u] is %s; vector elements must be finite", (long long)id, i,
                       nonfinite_name(out[i]));
                return SQLITE_MISMATCH;
            }
        }
        return SQLITE_OK;
    }
    case SQLITE_TEXT: {
        const char *s = (const char *)sqlite3_value_text(val);
        int n = sqlite3_value_bytes(val);
        if (!s) return SQLITE_NOMEM;
        const char *nul = memchr(s, 0, (size_t)n);
        cJSON *j = nul ? NULL : ek_json_parse(s, (size_t)n);
        int rc = SQLITE_MISMATCH;
        if (nul) {
            /* cJSON would skip it as white space */
            vt_err(v, EXPECT "text with a NUL byte at offset %d, which is not JSON", EXPECT_ARGS, (int)(nul - s));
        } else if (!j) {
            vt_err(v, EXPECT "text that is not JSON: '%.32s%s'", EXPECT_ARGS, s, n > 32 ? "..." : "");
        } else if (!cJSON_IsArray(j)) {
            vt_err(v, EXPECT "JSON that is not an array: '%.32s%s'", EXPECT_ARGS, s, n > 32 ? "..." : "");
        } else if ((unsigned)cJSON_GetArraySize(j) != dim) {
            vt_err(v, EXPECT "a JSON array of %d elements", EXPECT_ARGS, cJSON_GetArraySize(j));
        } else {
            unsigned i = 0;
            const cJSON *e;
            rc = SQLITE_OK;
            cJSON_ArrayForEach(e, j) {
                if (!cJSON_IsNumber(e)) {
                    vt_err(v, EXPECT "a JSON array whose element %u is not a number", EXPECT_ARGS, i);
                    rc = SQLITE_MISMATCH;
                    break;
                }
                double d = cJSON_GetNumberValue(e);
                float f = (float)d;
                if (!isfinite(d) || !isfinite(f)) {
                    vt_err(v, "id %lld: vec[%u] = %.9g is out of float32 range", (long long)id, i, d);
                    rc = SQLITE_MISMATCH;
                    break;
                }
                out[i++] = f;
            }
        }
        cJSON_Delete(j);
        return rc;
    }
    case SQLITE_NULL:
        vt_err(v, EXPECT "NULL", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    case SQLITE_INTEGER:
        vt_err(v, EXPECT "an INTEGER", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    default:
        vt_err(v, EXPECT "a REAL", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    }
#undef EXPECT
#undef EXPECT_ARGS
}

