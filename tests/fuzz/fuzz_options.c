/*
 * fuzz_options.c - libFuzzer target: the options of
 * CREATE VIRTUAL TABLE t USING embkv(<input>) (ext/sqlite/vtab.c's option
 * table and parsers, values.c's parsers of the training options, and the
 * engine's checks of what they give it).
 *
 * Driven through SQL on a database file in a fresh directory per input, as
 * an application would: the parser is static in vtab.c, and going through
 * CREATE also runs what follows a valid parse (the store created with those
 * options, app-sqlite-options written from them).  When the CREATE
 * succeeds, the table is used (stats, a pull and a push with the
 * optimizer and initializer the input chose), a second table is created
 * with the same arguments (with a path: attached to the same store, its
 * options compared with the recorded ones), and the database is closed and
 * opened again: the table must then connect and count its rows, since its
 * store and options file are as its CREATE left them (options written by
 * one parse must read back through the same parser).
 *
 * Guards, so that an input cannot reach outside the scratch directory or
 * fill the machine: inputs with a '/' are refused (relative paths resolve
 * inside the per-input directory), and files are capped at 128 MiB
 * (RLIMIT_FSIZE; a pool_size beyond it fails as a full file system would).
 */
#include "common.h"

#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

static char dir[4096], dbfile[4200];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *sc = fz_scratch("options", 0);
    snprintf(dir, sizeof dir, "%s/w", sc);
    snprintf(dbfile, sizeof dbfile, "%s/o.db", dir);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {128u << 20, 128u << 20};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
        fz_fail("setrlimit");
    return 0;
}

/* 0 when sql ran to its end. */
static int run(sqlite3 *db, const char *sql, char **msg)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc == SQLITE_OK && st) {
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        }
        if (rc == SQLITE_DONE)
            rc = SQLITE_OK;
    }
    if (msg)
        *msg = rc == SQLITE_OK ? NULL : sqlite3_mprintf("%s", sqlite3_errmsg(db));
    sqlite3_finalize(st);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096 || memchr(data, '/', size) || memchr(data, 0, size))
        return -1;
    fz_rmtree(dir);
    if (mkdir(dir, 0755) != 0)
        fz_fail("mkdir %s", dir);
    char *sql = sqlite3_mprintf("CREATE VIRTUAL TABLE t USING embkv(%.*s)", (int)size, (const char *)data);
    char *sql2 = sqlite3_mprintf("CREATE VIRTUAL TABLE t2 USING embkv(%.*s)", (int)size, (const char *)data);
    if (!sql || !sql2)
        fz_fail("out of memory");
    sqlite3 *db = fz_db_open(dbfile);
    if (!db)
        fz_fail("cannot open %s", dbfile);
    char *msg = NULL;
    int created = run(db, sql, &msg) == SQLITE_OK;
    if (!created && (!msg || !*msg))
        fz_fail("CREATE failed without a message");
    sqlite3_free(msg);
    if (created) {
        run(db, "SELECT embkv_stats('t')", NULL);
        run(db, "SELECT embkv_push('t', '[1, 2, 3]', zeroblob(length(p))) FROM "
                "(SELECT embkv_pull('t', '[1, 2, 3]') AS p)", NULL);
        run(db, "SELECT embkv_release('t', '[1, 2, 3]')", NULL);
        run(db, "SELECT count(*), sum(length(vec)) FROM t", NULL);
        run(db, sql2, NULL);
        run(db, "SELECT embkv_stats('t2')", NULL);
    }
    if (sqlite3_close(db) != SQLITE_OK)
        fz_fail("sqlite3_close");
    if (created) {
        /* Reopened: the table connects to the store its CREATE made. */
        db = fz_db_open(dbfile);
        if (!db)
            fz_fail("cannot open %s again", dbfile);
        if (run(db, "SELECT count(*) FROM t", &msg) != SQLITE_OK)
            fz_fail("after a successful CREATE, the reopened table fails: %s", msg ? msg : "?");
        run(db, "DROP TABLE t2", NULL);
        run(db, "DROP TABLE t", NULL);
        if (sqlite3_close(db) != SQLITE_OK)
            fz_fail("sqlite3_close");
    }
    sqlite3_free(sql);
    sqlite3_free(sql2);
    fz_rmtree(dir);
    return 0;
}
