/*
 * fuzz_vec.c - libFuzzer target: the binding's readers of vectors and ids
 * from SQL values (ext/sqlite/values.c: parse_vec, value_to_id, write_id,
 * ek_json_parse, ek_json_number) and the vector functions built on its
 * JSON and BLOB forms (ext/sqlite/vecfn.c: embkv_vec, embkv_json, the
 * math functions, the aggregates and their window forms).
 *
 * Input: a mode byte (bit 0: the value is a BLOB, else TEXT; bit 1: the
 * second vector of the two-vector functions is the first one, else the
 * rest of the input after the first 0xff byte), a u16 picking dim (0: the
 * value's own length), a u64 that is the scale factor's bits, then the
 * value.  parse_vec runs on a table instance made here (values.c needs
 * only its dim and name); the functions run through SQL on an in-memory
 * connection with the extension registered, and so does embkv_knn over a
 * small table of dim 2 (the value as its query, a batch, its ids).
 *
 * Besides "no crash, no sanitizer report, an error or a result", it checks
 * what the code promises: a vector parse_vec accepts holds dim finite
 * floats (a BLOB's exactly); embkv_json(embkv_vec(v)) read back by
 * embkv_vec and by parse_vec gives v bit for bit; text parse_vec accepts,
 * embkv_vec accepts with the same floats.
 */
#include "common.h"
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static sqlite3 *db;
enum { Q_VEC, Q_JSON, Q_BACK, Q_DIMS, Q_NORM, Q_DOT, Q_COS, Q_L2, Q_ADD, Q_SUB, Q_SCALE, Q_AGG, Q_WIN, Q_ID, Q_KNN,
       Q_KNN_IDS, Q_KNN_K, NQ };
static sqlite3_stmt *q[NQ];
static const char *const sql[NQ] = {
    "SELECT embkv_vec(?1)",
    "SELECT embkv_json(?1)",
    "SELECT embkv_vec(embkv_json(?1))",
    "SELECT embkv_dims(?1)",
    "SELECT embkv_norm(?1)",
    "SELECT embkv_dot(?1, ?2)",
    "SELECT embkv_cosine(?1, ?2)",
    "SELECT embkv_l2(?1, ?2)",
    "SELECT embkv_add(?1, ?2)",
    "SELECT embkv_sub(?1, ?2)",
    "SELECT embkv_scale(?1, ?3)",
    "SELECT embkv_sum(v), embkv_avg(v) FROM (SELECT ?1 AS v UNION ALL SELECT ?2 UNION ALL SELECT NULL "
    "UNION ALL SELECT ?1)",
    "SELECT embkv_sum(v) OVER w, embkv_avg(v) OVER w FROM (SELECT ?1 AS v UNION ALL SELECT ?2 UNION ALL "
    "SELECT NULL UNION ALL SELECT ?1) WINDOW w AS (ROWS BETWEEN 1 PRECEDING AND CURRENT ROW)",
    "SELECT fz_values(?4, ?1)",
    /* embkv_knn's query parser (one vector or a batch, BLOB or JSON) */
    "SELECT count(*), min(distance) FROM embkv_knn('fzk', ?1, 3)",
    "SELECT count(*) FROM embkv_knn('fzk', ?1, 2, 'cosine', ?2)",
    "SELECT count(*) FROM embkv_knn('fzk', '[1,2]', ?3, 'dot', ?1)",
};

/* The result of the last fz_values call. */
static struct {
    int rc;           /* parse_vec's */
    unsigned dim;
    float *vec;       /* dim floats when rc is SQLITE_OK */
} last;

/* fz_values(dim, value): parse_vec, value_to_id and write_id on value. */
static void fn_values(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    ekvtab v;
    memset(&v, 0, sizeof v);
    v.zName = "fz";
    v.dim = (unsigned)sqlite3_value_int(argv[0]);
    last.dim = v.dim;
    last.rc = SQLITE_ERROR;
    free(last.vec);
    last.vec = malloc((size_t)v.dim * sizeof(float) + 1);
    if (!last.vec)
        fz_fail("out of memory");
    last.rc = parse_vec(&v, 1, argv[1], last.vec);
    if (last.rc == SQLITE_OK) {
        if (v.base.zErrMsg)
            fz_fail("parse_vec succeeded with a message: %s", v.base.zErrMsg);
        for (unsigned i = 0; i < v.dim; i++)
            if (!isfinite(last.vec[i]))
                fz_fail("parse_vec returned a non-finite element %u", i);
        if (sqlite3_value_type(argv[1]) == SQLITE_BLOB &&
            ((size_t)sqlite3_value_bytes(argv[1]) != v.dim * 4u ||
             memcmp(sqlite3_value_blob(argv[1]), last.vec, v.dim * 4u) != 0))
            fz_fail("parse_vec changed the BLOB's floats");
    } else if (!v.base.zErrMsg && last.rc != SQLITE_NOMEM) {
        fz_fail("parse_vec failed (%d) without a message", last.rc);
    }
    sqlite3_free(v.base.zErrMsg);
    v.base.zErrMsg = NULL;
    int64_t id = 0;
    int is_id = value_to_id(argv[1], &id);
    int wrc = write_id(&v, argv[1], &id);
    if ((wrc == SQLITE_OK) != (is_id == 1))
        fz_fail("write_id and value_to_id disagree");
    if (wrc != SQLITE_OK && !v.base.zErrMsg)
        fz_fail("write_id failed without a message");
    sqlite3_free(v.base.zErrMsg);
    sqlite3_result_int(ctx, last.rc);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_scratch("vec", 0);
    db = fz_db_open(":memory:");
    if (!db)
        fz_fail("no database");
    if (sqlite3_create_function(db, "fz_values", 2, SQLITE_UTF8, NULL, fn_values, NULL, NULL) != SQLITE_OK)
        fz_fail("cannot register fz_values");
    char *err = NULL;
    if (sqlite3_exec(db, "CREATE VIRTUAL TABLE fzk USING embkv(dim=2);"
                         "INSERT INTO fzk(id, vec) VALUES (1, '[0,0]'), (2, '[1,0]'), (3, '[0,1]'), (-4, '[3,4]');",
                     NULL, NULL, &err) != SQLITE_OK)
        fz_fail("the knn table: %s", err ? err : "?");
    for (int i = 0; i < NQ; i++)
        if (sqlite3_prepare_v2(db, sql[i], -1, &q[i], NULL) != SQLITE_OK)
            fz_fail("prepare %s: %s", sql[i], sqlite3_errmsg(db));
    return 0;
}

static void bind(sqlite3_stmt *st, int blob, const uint8_t *a, size_t na, const uint8_t *b, size_t nb, double k,
                 unsigned dim)
{
    int n = sqlite3_bind_parameter_count(st);
    for (int i = 1; i <= n; i++) {
        const char *name = sqlite3_bind_parameter_name(st, i);
        int which = name ? atoi(name + 1) : i;
        const uint8_t *p = which == 1 ? a : b;
        size_t len = which == 1 ? na : nb;
        if (which == 3)
            sqlite3_bind_double(st, i, k);
        else if (which == 4)
            sqlite3_bind_int(st, i, (int)dim);
        else if (blob)
            sqlite3_bind_blob(st, i, len ? (const void *)p : "", (int)len, SQLITE_STATIC);
        else
            sqlite3_bind_text(st, i, len ? (const char *)p : "", (int)len, SQLITE_STATIC);
    }
}

/* Steps st to its end; returns the first row's first column as a copy
 * (sqlite3_malloc'd, *len bytes, *type its type) or NULL on an error. */
static void *step_all(sqlite3_stmt *st, int *len, int *type)
{
    void *first = NULL;
    int rc, rows = 0;
    *len = 0;
    *type = SQLITE_NULL;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (rows++ == 0) {
            *type = sqlite3_column_type(st, 0);
            const void *p = *type == SQLITE_TEXT ? (const void *)sqlite3_column_text(st, 0) : sqlite3_column_blob(st, 0);
            *len = sqlite3_column_bytes(st, 0);
            first = sqlite3_malloc(*len + 1);
            if (!first)
                fz_fail("out of memory");
            if (*len)
                memcpy(first, p, (size_t)*len);
            ((char *)first)[*len] = 0;
        }
    }
    if (rc != SQLITE_DONE) {
        const char *m = sqlite3_errmsg(db);
        if (!m || !*m)
            fz_fail("a statement failed without a message");
        sqlite3_free(first);
        first = NULL;
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
    return first;
}

/* parse_vec (through fz_values) of value with dim. */
static int parse_with(const void *p, int len, int blob, unsigned dim)
{
    bind(q[Q_ID], blob, p, (size_t)len, NULL, 0, 0, dim);
    int l, t;
    sqlite3_free(step_all(q[Q_ID], &l, &t));
    return last.rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size, 0};
    unsigned mode = fz_u8(&in);
    unsigned dimsel = fz_u16(&in);
    uint64_t kbits = fz_u64(&in);
    double k;
    memcpy(&k, &kbits, sizeof k);
    size_t na;
    const uint8_t *a = fz_take(&in, fz_left(&in), &na);
    if (na > 1 << 20)
        return -1;
    const uint8_t *b = a;
    size_t nb = na;
    if (!(mode & 2)) {
        const uint8_t *cut = memchr(a, 0xff, na);
        if (cut) {
            b = cut + 1;
            nb = na - (size_t)(b - a);
            na = (size_t)(cut - a);
        }
    }
    int blob = mode & 1;
    /* ek_json_number over a terminated copy. */
    char *z = malloc(na + 1);
    if (!z)
        fz_fail("out of memory");
    memcpy(z, a, na);
    z[na] = 0;
    size_t jn = ek_json_number(z);
    if (jn > strlen(z))
        fz_fail("ek_json_number ran past the end");
    cJSON *j = ek_json_parse(z, strlen(z));
    cJSON_Delete(j);
    free(z);

    /* The vector functions. */
    void *res[NQ];
    int len[NQ], type[NQ];
    for (int i = 0; i < NQ; i++) {
        if (i == Q_ID)
            continue;
        bind(q[i], blob, a, na, b, nb, k, 0);
        res[i] = step_all(q[i], &len[i], &type[i]);
    }
    /* parse_vec: at the chosen dim, and at the value's own length. */
    unsigned dim = dimsel ? 1 + dimsel % EMBKV_MAX_DIM : 0;
    if (!dim && res[Q_DIMS] && type[Q_DIMS] == SQLITE_INTEGER) {
        long long d = atoll(res[Q_DIMS]);
        dim = d >= 1 && d <= EMBKV_MAX_DIM ? (unsigned)d : 0;
    }
    if (dim) {
        int prc = parse_with(a, (int)na, blob, dim);
        /* Text parse_vec takes, embkv_vec takes too, with the same floats. */
        if (prc == SQLITE_OK && !blob &&
            (!res[Q_VEC] || len[Q_VEC] != (int)dim * 4 || memcmp(res[Q_VEC], last.vec, dim * 4u) != 0))
            fz_fail("parse_vec accepted text that embkv_vec %s", res[Q_VEC] ? "read otherwise" : "refused");
    }
    /* The round trip: embkv_vec(embkv_json(v)) is v, and parse_vec reads
     * embkv_json's text as the same floats. */
    if (res[Q_VEC] && type[Q_VEC] == SQLITE_BLOB) {
        if (!res[Q_JSON] || !res[Q_BACK])
            fz_fail("embkv_vec accepted a value that embkv_json or the round trip refused");
        if (len[Q_BACK] != len[Q_VEC] || memcmp(res[Q_BACK], res[Q_VEC], (size_t)len[Q_VEC]) != 0)
            fz_fail("embkv_vec(embkv_json(v)) is not v: %s", (char *)res[Q_JSON]);
        unsigned n = (unsigned)len[Q_VEC] / 4;
        if (n >= 1 && n <= EMBKV_MAX_DIM) {
            if (parse_with(res[Q_JSON], len[Q_JSON], 0, n) != SQLITE_OK)
                fz_fail("parse_vec refused embkv_json's output: %s", (char *)res[Q_JSON]);
            if (memcmp(last.vec, res[Q_VEC], n * 4u) != 0)
                fz_fail("parse_vec read embkv_json's output as other floats: %s", (char *)res[Q_JSON]);
        }
    }
    for (int i = 0; i < NQ; i++)
        if (i != Q_ID)
            sqlite3_free(res[i]);
    return 0;
}
