/*
 * fuzz_ids.c - libFuzzer target: the ids argument of the training and
 * hot-set functions (ek_parse_ids in ext/sqlite/values.c: an int64 BLOB, a
 * JSON array of integers, or one integer) and the gradients that go with
 * them in embkv_push (a float32 BLOB or a JSON array).
 *
 * Input: a type byte (the SQL type the ids are bound as: INTEGER, REAL,
 * TEXT, BLOB or NULL; and of the gradients: BLOB or TEXT), then the ids
 * value, then after the first 0xff byte the gradients value.  ek_parse_ids
 * is called directly (through a function registered here, which is how it
 * gets its sqlite3_value) and its promises checked: ids or a message,
 * never both, a BLOB read as its int64 values, a JSON array as its
 * elements.  Then the same value goes to embkv_pull, embkv_push,
 * embkv_release, embkv_lookahead and embkv_hotset on a small table
 * (ids 0..63 present, no initializer, unlimited staleness; every permit a
 * pull takes is released at once, so nothing accumulates between inputs).
 */
#include "common.h"
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM 4
static sqlite3 *db;
enum { Q_PARSE, Q_PULL, Q_RELEASE, Q_PUSH, Q_LOOKAHEAD, Q_HOTSET, Q_IN, NQ };
static sqlite3_stmt *q[NQ];
static const char *const sql[NQ] = {
    "SELECT fz_ids(?1)",
    "SELECT embkv_pull('t', ?1)",
    "SELECT embkv_release('t', ?1)",
    "SELECT embkv_push('t', ?1, ?2, 1e-30)",
    "SELECT embkv_lookahead('t', ?1)",
    "SELECT embkv_hotset('t', ?1)",
    "SELECT id, vec FROM t WHERE id IN (SELECT value FROM json_each(?1))",
};

/* fz_ids(v): ek_parse_ids(v) with its promises checked. */
static void fn_ids(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    size_t n = 99;
    char *err = (char *)"x";
    int64_t *ids = ek_parse_ids(argv[0], &n, &err);
    int type = sqlite3_value_type(argv[0]);
    if (ids && err)
        fz_fail("ek_parse_ids returned ids and a message: %s", err);
    if (!ids && n != 0)
        fz_fail("ek_parse_ids failed but set n = %zu", n);
    if (ids && n == 0)
        fz_fail("ek_parse_ids returned an empty list");
    if (!ids && !err)
        fz_fail("ek_parse_ids failed without a message (not out of memory here)");
    if (ids && type == SQLITE_BLOB) {
        if ((size_t)sqlite3_value_bytes(argv[0]) != n * 8 || memcmp(sqlite3_value_blob(argv[0]), ids, n * 8) != 0)
            fz_fail("ek_parse_ids read a BLOB as other ids");
    }
    if (ids && type == SQLITE_INTEGER && (n != 1 || ids[0] != sqlite3_value_int64(argv[0])))
        fz_fail("ek_parse_ids read an integer as other ids");
    if (ids && type == SQLITE_TEXT) {
        cJSON *j = ek_json_parse((const char *)sqlite3_value_text(argv[0]), (size_t)sqlite3_value_bytes(argv[0]));
        if (!cJSON_IsArray(j) || (size_t)cJSON_GetArraySize(j) != n)
            fz_fail("ek_parse_ids read text that is not a JSON array of %zu", n);
        size_t i = 0;
        for (const cJSON *e = j->child; e; e = e->next, i++)
            if (!cJSON_IsNumber(e) || (double)ids[i] != e->valuedouble)
                fz_fail("ek_parse_ids element %zu is %lld, the text has %.17g", i, (long long)ids[i],
                        e->valuedouble);
        cJSON_Delete(j);
    }
    if (ids && type != SQLITE_BLOB && type != SQLITE_INTEGER && type != SQLITE_TEXT)
        fz_fail("ek_parse_ids accepted a value of type %d", type);
    sqlite3_free(ids);
    sqlite3_free(err);
    sqlite3_result_int64(ctx, (sqlite3_int64)n);
}

static void exec(const char *s)
{
    char *err = NULL;
    if (sqlite3_exec(db, s, NULL, NULL, &err) != SQLITE_OK)
        fz_fail("%s: %s", s, err ? err : "?");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_scratch("ids", 0);
    db = fz_db_open(":memory:");
    if (!db)
        fz_fail("no database");
    if (sqlite3_create_function(db, "fz_ids", 1, SQLITE_UTF8, NULL, fn_ids, NULL, NULL) != SQLITE_OK)
        fz_fail("cannot register fz_ids");
    exec("CREATE VIRTUAL TABLE t USING embkv(dim=4, pool_size='16M', capacity=1000, optimizer=adagrad, "
         "staleness=unlimited, wait_ms=0)");
    exec("WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 63) "
         "INSERT INTO t(id, vec) SELECT i, embkv_vec('[1, 2, 3, 4]') FROM n");
    for (int i = 0; i < NQ; i++)
        if (sqlite3_prepare_v2(db, sql[i], -1, &q[i], NULL) != SQLITE_OK)
            fz_fail("prepare %s: %s", sql[i], sqlite3_errmsg(db));
    return 0;
}

static void bind_as(sqlite3_stmt *st, int i, unsigned type, const uint8_t *p, size_t n)
{
    switch (type % 5) {
    case 0: {
        int64_t v = 0;
        memcpy(&v, p, n < 8 ? n : 8);
        sqlite3_bind_int64(st, i, v);
        break;
    }
    case 1: {
        double d = 0;
        memcpy(&d, p, n < 8 ? n : 8);
        sqlite3_bind_double(st, i, d);
        break;
    }
    case 2:
        sqlite3_bind_text(st, i, n ? (const char *)p : "", (int)n, SQLITE_STATIC);
        break;
    case 3:
        sqlite3_bind_blob(st, i, n ? (const void *)p : "", (int)n, SQLITE_STATIC);
        break;
    default:
        sqlite3_bind_null(st, i);
        break;
    }
}

static void run(sqlite3_stmt *st)
{
    int rc;
    for (int rows = 0; (rc = sqlite3_step(st)) == SQLITE_ROW && rows < 100000; rows++) {
    }
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) {
        const char *m = sqlite3_errmsg(db);
        if (!m || !*m)
            fz_fail("a statement failed without a message");
    }
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size, 0};
    unsigned type = fz_u8(&in);
    size_t na;
    const uint8_t *a = fz_take(&in, fz_left(&in), &na);
    if (na > 1 << 20)
        return -1;
    const uint8_t *g = NULL;
    size_t ng = 0;
    const uint8_t *cut = memchr(a, 0xff, na);
    if (cut) {
        g = cut + 1;
        ng = na - (size_t)(g - a);
        na = (size_t)(cut - a);
    }
    for (int i = 0; i < NQ; i++) {
        bind_as(q[i], 1, type, a, na);
        if (i == Q_PUSH)
            bind_as(q[i], 2, (type >> 4) & 1 ? 2 : 3, g, ng);
        run(q[i]);
    }
    /* Whatever a pull took went back with the release above; a pull's
     * permits on ids it then failed on are its own to return. */
    return 0;
}
