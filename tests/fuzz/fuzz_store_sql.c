/*
 * fuzz_store_sql.c - libFuzzer target: a store whose files come from
 * fuzzed bytes, reached through SQL as an application would reach it.
 *
 * The same template and patches as fuzz_store (common.c), but the copy is
 * opened through its database file: the table t on it connects (xConnect
 * opens the store, reads the binding's app-sqlite-options and checks them;
 * a store that cannot be opened gives a table that only DROP TABLE works
 * on), then scans, lookups, stats, writes with COMMIT, training calls, a
 * second table attached to the store by path (its CREATE lists itself in
 * app-sqlite-tables and compares its options with the recorded ones), a
 * checkpoint and DROP TABLE run as the flags byte says.  Any SQLite result
 * code is fine; what must not happen is a crash, a sanitizer report, a
 * hang, or a vector that is not the row's own.
 *
 * Not including binding.h: this file calls SQLite directly.
 */
#include "common.h"

#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    F_WRITE = 1,     /* INSERT, UPDATE, DELETE and COMMIT */
    F_TRAIN = 2,     /* embkv_pull, embkv_push, embkv_release, embkv_lookahead */
    F_ATTACH = 4,    /* a second table on the same store (path='store') */
    F_CHECKPOINT = 8,
    F_DROP = 16,     /* DROP TABLE t at the end */
    F_HEAT = 32,     /* embkv_heat, embkv_hotset */
    F_ROLLBACK = 64, /* writes in a transaction rolled back */
};

static sqlite3_int64 modified[8];
static int nmod;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("EMBKV_PROBE_TIMEOUT", "2", 1);
    fz_template_init("store_sql");
    return 0;
}

static int is_modified(sqlite3_int64 id)
{
    for (int i = 0; i < nmod; i++)
        if (modified[i] == id)
            return 1;
    return 0;
}

/* Runs sql, checking every (id, vec) row it returns; errors are fine. */
static void run(sqlite3 *db, const char *sql)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        sqlite3_finalize(st);
        return;
    }
    int rc;
    for (int rows = 0; (rc = sqlite3_step(st)) == SQLITE_ROW && rows < 1000000; rows++) {
        if (sqlite3_column_count(st) < 2 || strcmp(sqlite3_column_name(st, 0), "id") != 0 ||
            strcmp(sqlite3_column_name(st, 1), "vec") != 0)
            continue;
        sqlite3_int64 id = sqlite3_column_int64(st, 0);
        const void *b = sqlite3_column_blob(st, 1);
        int n = sqlite3_column_bytes(st, 1);
        if (!b || is_modified(id))
            continue;
        if (n != FZ_DIM * 4 || !fz_vec_is(id, b))
            fz_fail("%s: a wrong vector for id %lld", sql, (long long)id);
    }
    sqlite3_finalize(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size, 0};
    unsigned flags = fz_u8(&in);
    nmod = 0;
    if (fz_work_make(&in) != 0) {
        fz_work_clear();
        return -1;
    }
    char dbpath[4200];
    snprintf(dbpath, sizeof dbpath, "%s/t.db", fz_work_dir());
    sqlite3 *db = fz_db_open(dbpath);
    if (!db)
        fz_fail("cannot open %s", dbpath);
    run(db, "SELECT count(*) FROM t");
    run(db, "SELECT id, vec, clock, tier FROM t");
    run(db, "SELECT id, vec, tier FROM t WHERE id IN (1, 2, 3, 40, 41, 100000, 100001, 100500, 101000, 102000)");
    run(db, "SELECT id, vec FROM t WHERE id = 5");
    run(db, "SELECT tier, count(*) FROM t GROUP BY tier");
    run(db, "SELECT embkv_stats('t')");
    if (flags & F_WRITE) {
        modified[nmod++] = 7;
        modified[nmod++] = 900;
        run(db, "BEGIN");
        run(db, "INSERT INTO t(id, vec) SELECT 900, vec FROM t WHERE id = 1");
        run(db, "UPDATE t SET vec = (SELECT vec FROM t WHERE id = 2) WHERE id = 7");
        run(db, "DELETE FROM t WHERE id IN (3, 100002)");
        run(db, "INSERT OR REPLACE INTO t(id, vec) SELECT 8, vec FROM t WHERE id = 8");
        run(db, "COMMIT");
        run(db, "SELECT id, vec FROM t WHERE id IN (7, 8, 900, 1)");
    }
    if (flags & F_ROLLBACK) {
        run(db, "BEGIN");
        run(db, "DELETE FROM t WHERE id IN (10, 11, 100010)");
        run(db, "SAVEPOINT a");
        run(db, "UPDATE t SET vec = (SELECT vec FROM t WHERE id = 12) WHERE id = 13");
        run(db, "ROLLBACK TO a");
        run(db, "SELECT id, vec FROM t WHERE id IN (10, 11, 12, 13)");
        run(db, "ROLLBACK");
    }
    if (flags & F_TRAIN) {
        modified[nmod++] = 20;
        modified[nmod++] = 21;
        modified[nmod++] = 777777;
        run(db, "SELECT embkv_pull('t', '[20, 21, 777777]')");
        run(db, "SELECT embkv_push('t', '[20, 21, 777777]', zeroblob(3 * 4 * 128))");
        run(db, "SELECT embkv_release('t', '[20, 21]')");
        run(db, "SELECT embkv_lookahead('t', '[100000, 100001, 100002, 100003, 100004, 100005]')");
        run(db, "SELECT id, vec FROM t WHERE id IN (100000, 100001, 100002, 100003, 100004, 100005)");
    }
    if (flags & F_HEAT) {
        run(db, "SELECT count(*), sum(hits) FROM embkv_heat('t')");
        run(db, "SELECT embkv_hotset('t', 10)");
        run(db, "SELECT embkv_hotset('t', '[100000, 100001, 1, 2]')");
    }
    if (flags & F_ATTACH) {
        run(db, "CREATE VIRTUAL TABLE u USING embkv(dim=128, path='store', lr=0.05)");
        run(db, "SELECT id, vec FROM u WHERE id IN (1, 2, 100003)");
        run(db, "DROP TABLE u");
    }
    if (flags & F_CHECKPOINT)
        run(db, "SELECT embkv_checkpoint('t')");
    if (flags & F_DROP)
        run(db, "DROP TABLE t");
    if (sqlite3_close(db) != SQLITE_OK)
        fz_fail("sqlite3_close: %s", sqlite3_errmsg(db));
    fz_work_clear();
    return 0;
}
