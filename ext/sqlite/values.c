/*
 * values.c - the values the binding reads from SQL: the ids and vectors an
 * embkv table takes, the ids argument of the SQL functions, the values of
 * the training options, and the JSON reader they all share.
 *
 * An id is an INTEGER, or a REAL with an integral value, or TEXT that reads
 * as an integer (what INTEGER affinity would convert); anything else is an
 * error on writes and matches nothing on lookups.  A vector is a float32
 * little-endian BLOB of exactly dim*4 bytes or a JSON array (TEXT) of dim
 * numbers that fit float32; NaN and infinities are rejected either way.
 * Every message names the table and the id and says what was expected.
 *
 * Why the ids argument and the option parsers are here and not with the
 * training functions: the module (its CREATE options) and heat.c (its ids)
 * use them too, and all of them read numbers as JSON writes them
 * (ek_json_number); kept in train.c they tied the module and the SQL
 * functions to one another.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
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
        ekerr_table(v, "id must be an INTEGER, got NULL (an embkv table has no automatic ids)");
        break;
    case SQLITE_TEXT:
        ekerr_table(v, "id must be an INTEGER, got TEXT '%.40s'", (const char *)sqlite3_value_text(val));
        break;
    case SQLITE_FLOAT:
        ekerr_table(v, "id must be an INTEGER, got REAL %!.15g", sqlite3_value_double(val));
        break;
    default:
        ekerr_table(v, "id must be an INTEGER, got a %d-byte BLOB", sqlite3_value_bytes(val));
        break;
    }
    return SQLITE_MISMATCH;
}

static const char *nonfinite_name(float f)
{
    return isnan(f) ? "NaN" : f > 0 ? "Inf" : "-Inf";
}

/* A vector written to a table of a reduced dtype, rounded as the store
 * will keep it, now: the statement, not its COMMIT, refuses a value the
 * dtype cannot hold, and the transaction reads its writes as they will
 * be. */
static int round_vec(ekvtab *v, int64_t id, float *out)
{
    uint32_t bad = v->dtype == EMBKV_F32 ? 0 : embkv_dtype_round(v->dtype, v->dim, out, out);
    if (!bad) return SQLITE_OK;
    ekerr_table(v, "id %lld: vec[%u] = %.9g is beyond %s's range (at most %.9g)", (long long)id, bad - 1,
                (double)out[bad - 1], embkv_dtype_name(v->dtype), (double)embkv_dtype_max(v->dtype));
    return SQLITE_MISMATCH;
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
            ekerr_table(v, EXPECT "a %d-byte BLOB", EXPECT_ARGS, n);
            return SQLITE_MISMATCH;
        }
        memcpy(out, b, (size_t)dim * 4);
        for (unsigned i = 0; i < dim; i++) {
            if (!isfinite(out[i])) {
                ekerr_table(v, "id %lld: vec[%u] is %s; vector elements must be finite", (long long)id, i,
                            nonfinite_name(out[i]));
                return SQLITE_MISMATCH;
            }
        }
        return round_vec(v, id, out);
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
            ekerr_table(v, EXPECT "text with a NUL byte at offset %d, which is not JSON", EXPECT_ARGS, (int)(nul - s));
        } else if (!j) {
            ekerr_table(v, EXPECT "text that is not JSON: '%.32s%s'", EXPECT_ARGS, s, n > 32 ? "..." : "");
        } else if (!cJSON_IsArray(j)) {
            ekerr_table(v, EXPECT "JSON that is not an array: '%.32s%s'", EXPECT_ARGS, s, n > 32 ? "..." : "");
        } else if ((unsigned)cJSON_GetArraySize(j) != dim) {
            ekerr_table(v, EXPECT "a JSON array of %d elements", EXPECT_ARGS, cJSON_GetArraySize(j));
        } else {
            unsigned i = 0;
            const cJSON *e;
            rc = SQLITE_OK;
            cJSON_ArrayForEach(e, j) {
                if (!cJSON_IsNumber(e)) {
                    ekerr_table(v, EXPECT "a JSON array whose element %u is not a number", EXPECT_ARGS, i);
                    rc = SQLITE_MISMATCH;
                    break;
                }
                double d = cJSON_GetNumberValue(e);
                float f = (float)d;
                if (!isfinite(d) || !isfinite(f)) {
                    ekerr_table(v, "id %lld: vec[%u] = %.9g is out of float32 range", (long long)id, i, d);
                    rc = SQLITE_MISMATCH;
                    break;
                }
                out[i++] = f;
            }
        }
        cJSON_Delete(j);
        return rc == SQLITE_OK ? round_vec(v, id, out) : rc;
    }
    case SQLITE_NULL:
        ekerr_table(v, EXPECT "NULL", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    case SQLITE_INTEGER:
        ekerr_table(v, EXPECT "an INTEGER", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    default:
        ekerr_table(v, EXPECT "a REAL", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    }
#undef EXPECT
#undef EXPECT_ARGS
}

/* ------------------------------------------------------------ ids arguments */

int64_t *ek_parse_ids(sqlite3_value *v, size_t *n, char **err)
{
    return ek_parse_ids_or(v, n, err, ", an int64 BLOB or an INTEGER");
}

int64_t *ek_parse_ids_or(sqlite3_value *v, size_t *n, char **err, const char *others)
{
    *n = 0;
    *err = NULL;
    switch (sqlite3_value_type(v)) {
    case SQLITE_INTEGER: {
        int64_t *ids = sqlite3_malloc64(sizeof *ids);
        if (!ids)
            return NULL;
        ids[0] = sqlite3_value_int64(v);
        *n = 1;
        return ids;
    }
    case SQLITE_BLOB: {
        int bytes = sqlite3_value_bytes(v);
        if (bytes <= 0 || bytes % 8) {
            *err = sqlite3_mprintf("ids BLOB must hold int64 values (a non-empty multiple of 8 bytes), got %d bytes",
                                   bytes);
            return NULL;
        }
        int64_t *ids = sqlite3_malloc64((sqlite3_uint64)bytes);
        if (!ids)
            return NULL;
        memcpy(ids, sqlite3_value_blob(v), (size_t)bytes);
        *n = (size_t)bytes / 8;
        return ids;
    }
    case SQLITE_TEXT: {
        cJSON *j = ek_json_parse((const char *)sqlite3_value_text(v), (size_t)sqlite3_value_bytes(v));
        int count = j && cJSON_IsArray(j) ? cJSON_GetArraySize(j) : -1;
        if (count <= 0) {
            const char *txt = (const char *)sqlite3_value_text(v);
            *err = sqlite3_mprintf("ids must be a non-empty JSON array of integers such as '[42]'%s, got the text "
                                   "'%.40s%s'",
                                   others, txt ? txt : "", sqlite3_value_bytes(v) > 40 ? "..." : "");
            cJSON_Delete(j);
            return NULL;
        }
        int64_t *ids = sqlite3_malloc64((sqlite3_uint64)count * sizeof *ids);
        int k = 0;
        for (cJSON *e = j->child; ids && e; e = e->next, k++) {
            double d = cJSON_IsNumber(e) ? e->valuedouble : NAN;
            if (!cJSON_IsNumber(e)) {
                *err = sqlite3_mprintf("ids element %d is not an integer (it is %s)", k,
                                       cJSON_IsString(e) ? "a string" : cJSON_IsArray(e) ? "an array"
                                       : cJSON_IsObject(e) ? "an object" : cJSON_IsBool(e) ? "a boolean" : "null");
                sqlite3_free(ids);
                ids = NULL;
                break;
            }
            /* cJSON keeps numbers as double: integers beyond 2^53 are not exact. */
            if (!(d == floor(d)) || fabs(d) >= 9007199254740992.0) {
                *err = sqlite3_mprintf("ids element %d is not an integer of magnitude below 2^53 (use an int64 BLOB for "
                                       "larger ids)", k);
                sqlite3_free(ids);
                ids = NULL;
                break;
            }
            ids[k] = (int64_t)d;
        }
        cJSON_Delete(j);
        *n = ids ? (size_t)count : 0;
        return ids;
    }
    default:
        *err = sqlite3_mprintf("ids must be an int64 BLOB, a JSON array of integers or an integer");
        return NULL;
    }
}

/* ------------------------------------------------------------ options */

void ek_parse_train_begin(embkv_train_options *t)
{
    embkv_train_defaults(t);
    t->eps = 0;  /* "not given": the optimizer's default is chosen at the end */
}

void ek_parse_train_end(embkv_train_options *t)
{
    /* PyTorch's defaults: Adagrad eps 1e-10, Adam eps 1e-8. */
    if (t->eps == 0)
        t->eps = t->optimizer == EMBKV_ADAM ? 1e-8 : 1e-10;
}

static const char *skip_blanks(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* A decimal number as JSON writes it (no hex, no '1.', no leading zeros),
 * white space around allowed; *end after it and the blanks that follow. */
static int read_number(const char *p, double *out, const char **end)
{
    p = skip_blanks(p);
    size_t k = ek_json_number(p);
    if (!k)
        return -1;
    double d = strtod(p, NULL);
    if (!isfinite(d))
        return -1;
    *out = d;
    *end = skip_blanks(p + k);
    return 0;
}

/* A whole finite number; 0 on success. */
static int parse_double(const char *val, double *out)
{
    const char *end;
    if (read_number(val, out, &end) || *end)
        return -1;
    return 0;
}

int ek_parse_positive(const char *val, void *field)
{
    double d;
    if (parse_double(val, &d) || !(d > 0))
        return -1;
    *(double *)field = d;
    return 0;
}

int ek_parse_nonnegative(const char *val, void *field)
{
    double d;
    if (parse_double(val, &d) || !(d >= 0))
        return -1;
    *(double *)field = d;
    return 0;
}

int ek_parse_unit(const char *val, void *field)
{
    double d;
    if (parse_double(val, &d) || !(d >= 0 && d < 1))
        return -1;
    *(double *)field = d;
    return 0;
}

int ek_parse_optimizer(const char *val, void *field)
{
    static const char *const names[] = {"sgd", "adagrad", "adam"};
    for (int i = 0; i < 3; i++)
        if (sqlite3_stricmp(val, names[i]) == 0) {
            *(int *)field = i;  /* EMBKV_SGD, EMBKV_ADAGRAD, EMBKV_ADAM */
            return 0;
        }
    return -1;
}

/* none | count(N) with N from 1 to 255 (admission: an id is stored from
 * its N-th pull); field is embkv_train_options.admit_count. */
int ek_parse_admit(const char *val, void *field)
{
    val = skip_blanks(val);
    if (sqlite3_stricmp(val, "none") == 0) {
        *(uint32_t *)field = 0;
        return 0;
    }
    if (sqlite3_strnicmp(val, "count", 5) != 0) return -1;
    const char *p = skip_blanks(val + 5);
    if (*p != '(') return -1;
    p = skip_blanks(p + 1);
    char *end;
    long long nv = strtoll(p, &end, 10);
    if (end == p || nv < 1 || nv > 255) return -1;
    p = skip_blanks(end);
    if (*p != ')') return -1;
    if (*skip_blanks(p + 1)) return -1;
    *(uint32_t *)field = nv == 1 ? 0 : (uint32_t)nv;  /* count(1) is none: every id at its first pull */
    return 0;
}

/* none | 0 | N followed by a unit: ms, s, m, h or d (a duration, up to
 * EMBKV_TTL_MAX_MS); field is embkv_train_options.ttl_ms. */
int ek_parse_ttl(const char *val, void *field)
{
    val = skip_blanks(val);
    char text[64];
    size_t len = strlen(val);
    while (len && ek_is_blank(val[len - 1])) len--;
    if (len >= sizeof text) return -1;
    memcpy(text, val, len);
    text[len] = 0;
    val = text;
    if (sqlite3_stricmp(val, "none") == 0 || strcmp(val, "0") == 0) {
        *(uint64_t *)field = 0;
        return 0;
    }
    if (*val < '0' || *val > '9') return -1;
    char *end;
    errno = 0;
    unsigned long long nv = strtoull(val, &end, 10);
    if (end == val || errno) return -1;
    static const struct { const char *unit; uint64_t ms; } units[] = {
        {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
    const char *u = skip_blanks(end);
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (sqlite3_stricmp(u, units[i].unit) != 0) continue;
        if (nv > EMBKV_TTL_MAX_MS / units[i].ms) return -1;  /* (0 in any unit: none) */
        *(uint64_t *)field = nv * units[i].ms;
        return 0;
    }
    return -1;
}

/* A ttl in the largest unit that holds it whole ("30d", "90m", "1500ms"),
 * "none" for 0. */
void ek_format_ttl(uint64_t ms, char *buf, size_t n)
{
    static const struct { const char *unit; uint64_t ms; } units[] = {
        {"d", 86400000}, {"h", 3600000}, {"m", 60000}, {"s", 1000}, {"ms", 1}};
    if (!ms) {
        snprintf(buf, n, "none");
        return;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (ms % units[i].ms == 0) {
            snprintf(buf, n, "%llu%s", (unsigned long long)(ms / units[i].ms), units[i].unit);
            return;
        }
}

/* f32 | f16 | bf16 | i8; field is embkv_tabopts.dtype. */
int ek_parse_dtype(const char *val, void *field)
{
    val = skip_blanks(val);
    for (uint32_t d = EMBKV_F32; d <= EMBKV_I8; d++)
        if (sqlite3_stricmp(val, embkv_dtype_name(d)) == 0) {
            *(uint32_t *)field = d;
            return 0;
        }
    return -1;
}

/* nearest | stochastic; field is embkv_train_options.rounding. */
int ek_parse_rounding(const char *val, void *field)
{
    val = skip_blanks(val);
    if (sqlite3_stricmp(val, "nearest") == 0) *(int *)field = EMBKV_ROUND_NEAREST;
    else if (sqlite3_stricmp(val, "stochastic") == 0) *(int *)field = EMBKV_ROUND_STOCHASTIC;
    else return -1;
    return 0;
}

/* lfu | lru; field is embkv_train_options.evict. */
int ek_parse_evict(const char *val, void *field)
{
    val = skip_blanks(val);
    if (sqlite3_stricmp(val, "lfu") == 0) *(int *)field = EMBKV_EVICT_LFU;
    else if (sqlite3_stricmp(val, "lru") == 0) *(int *)field = EMBKV_EVICT_LRU;
    else return -1;
    return 0;
}

/* none | zeros | uniform(a,b) | normal(mean,std); field is the whole
 * embkv_train_options. */
int ek_parse_init(const char *val, void *field)
{
    embkv_train_options *t = field;
    val = skip_blanks(val);
    size_t len = strlen(val);
    while (len && (val[len - 1] == ' ' || val[len - 1] == '\t' || val[len - 1] == '\n' || val[len - 1] == '\r'))
        len--;
    if (len == 4 && sqlite3_strnicmp(val, "none", 4) == 0) {
        t->init = EMBKV_INIT_NONE;
        return 0;
    }
    if (len == 5 && sqlite3_strnicmp(val, "zeros", 5) == 0) {
        t->init = EMBKV_INIT_ZEROS;
        return 0;
    }
    int kind = sqlite3_strnicmp(val, "uniform(", 8) == 0 ? EMBKV_INIT_UNIFORM
               : sqlite3_strnicmp(val, "normal(", 7) == 0 ? EMBKV_INIT_NORMAL
                                                          : -1;
    if (kind < 0)
        return -1;
    const char *p = strchr(val, '(') + 1, *end;
    double a, b;
    if (read_number(p, &a, &end) || *end != ',' || read_number(end + 1, &b, &end) || *end != ')' ||
        *skip_blanks(end + 1))
        return -1;
    if ((kind == EMBKV_INIT_UNIFORM && !(a < b)) || (kind == EMBKV_INIT_NORMAL && !(b >= 0)))
        return -1;
    t->init = kind;
    t->init_a = a;
    t->init_b = b;
    return 0;
}

const char *ek_name_arg(sqlite3_value *v, bool *nul)
{
    *nul = false;
    if (sqlite3_value_type(v) != SQLITE_TEXT)
        return NULL;
    const char *t = (const char *)sqlite3_value_text(v);
    if (t && strlen(t) != (size_t)sqlite3_value_bytes(v)) {
        *nul = true;
        return NULL;
    }
    return t;
}
