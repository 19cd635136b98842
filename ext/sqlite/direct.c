/*
 * direct.c - the training functions called from a language binding
 * without its copies of SQL values: embkv_direct_pull writes the rows
 * into the caller's array, embkv_direct_push hands SQLite the caller's
 * gradients where they lie.
 *
 * Why: Python's sqlite3 module copies every BLOB it binds and every BLOB
 * it reads into a new object.  A TransE step pulls and pushes ~10 MB of
 * rows each way: each copy is a fresh ~10 MB buffer, its pages faulted
 * in, on every step (docs/benchmarks.md, the TransE step).  The Python
 * package (pysample/embkv) calls these entry points through ctypes, and
 * falls back to plain SQL where it cannot.
 *
 * Why it stays safe:
 *  - The entry points run the ordinary SQL functions (embkv_pull and
 *    embkv_push, train.c) on the connection: every check, message and
 *    permit rule is theirs, and the connection's mutex is held for the
 *    call as sqlite3_step holds it.
 *  - The one new thing, the pull's output buffer, reaches embkv_pull as
 *    its fourth argument through SQLite's pointer-passing interface
 *    (sqlite3_bind_pointer, type EK_ROWS_OUT): SQL text cannot make such a
 *    value, so no statement, and no view or trigger of a foreign database
 *    file (the training functions are DIRECTONLY besides), can make
 *    embkv_pull write into memory.
 *  - A connection is named by the handle embkv_connection() returns, and
 *    a handle is used only while it names a connection this library
 *    registered and that is still open (the live list below); any other is
 *    refused with EK_DIRECT_UNKNOWN, which tells the binding to use SQL.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The connections this copy of the library registered and that are open,
 * each with the number of its registrations (loading the extension again
 * into a connection registers it again, and the replaced function's
 * destructor then runs for the first) and its handle.
 *
 * Invariants (relied on by run_one):
 *  D1. A handle is a number given once per library copy, never an
 *      address: a handle kept past its connection's close names nothing,
 *      even when a new connection gets the same address.  Each copy counts
 *      from a random base of its own (a multiple of 2^32), so that a
 *      handle another copy of the library gave (a connection that loaded
 *      the extension from another file) names nothing here either.
 *  D2. An entry leaves the list in live_drop, which SQLite calls while
 *      closing the connection, holding its mutex, before freeing it.  So
 *      a thread that holds live_mu, finds the entry and then takes the
 *      connection's mutex holds a connection that cannot be freed until
 *      it lets the mutex go.  It only tries that mutex (a thread blocked
 *      on it holding live_mu would deadlock with a close, which holds the
 *      connection's mutex and waits for live_mu). */
typedef struct live_conn {
    sqlite3 *db;
    int refs;
    sqlite3_int64 handle;
} live_conn;

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static live_conn *live;
static size_t nlive, caplive;
static sqlite3_int64 last_handle;

static bool live_add(sqlite3 *db)
{
    bool ok = true;
    pthread_mutex_lock(&live_mu);
    size_t i = 0;
    while (i < nlive && live[i].db != db)
        i++;
    if (i < nlive) {
        live[i].refs++;
    } else {
        if (nlive == caplive) {
            size_t cap = caplive ? 2 * caplive : 8;
            live_conn *grown = realloc(live, cap * sizeof *live);
            if (grown) {
                live = grown;
                caplive = cap;
            }
        }
        if (!last_handle) {
            uint32_t r;
            sqlite3_randomness(sizeof r, &r);
            last_handle = (sqlite3_int64)((r & 0x3fffffffu) + 1) << 32;
        }
        if (nlive < caplive)
            live[nlive++] = (live_conn){db, 1, ++last_handle}; /* D1 */
        else
            ok = false;
    }
    pthread_mutex_unlock(&live_mu);
    return ok;
}

static void live_drop(void *p)
{
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < nlive; i++) {
        if (live[i].db == p) {
            if (--live[i].refs == 0)
                live[i] = live[--nlive];
            break;
        }
    }
    pthread_mutex_unlock(&live_mu);
}

/* embkv_connection(): this connection's handle for the entry points. */
static void fn_connection(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    (void)argv;
    sqlite3 *db = sqlite3_user_data(ctx);
    sqlite3_int64 handle = 0;
    pthread_mutex_lock(&live_mu);
    for (size_t i = 0; i < nlive && !handle; i++)
        if (live[i].db == db)
            handle = live[i].handle;
    pthread_mutex_unlock(&live_mu);
    if (handle)
        sqlite3_result_int64(ctx, handle);
    else
        sqlite3_result_error(ctx, "embkv_connection: this connection is not registered (load the extension again)",
                             -1);
}

int embkv_direct_register(sqlite3 *db)
{
    if (!live_add(db))
        return SQLITE_NOMEM;
    /* live_drop runs when the connection closes (or this registration is
     * replaced), also when the registration fails. */
    return sqlite3_create_function_v2(db, "embkv_connection", 0, SQLITE_UTF8 | SQLITE_DIRECTONLY, db, fn_connection,
                                      NULL, NULL, live_drop);
}

/* The open connection a handle names, its mutex held (or none: a
 * connection opened without mutexes), or NULL.  Another thread's statement
 * on the connection holds its mutex: wait for it, as sqlite3_step would,
 * trying again with a growing pause (D2). */
static sqlite3 *live_enter(sqlite3_int64 handle)
{
    for (long pause_ns = 1000;; pause_ns = pause_ns < 1000000 ? 2 * pause_ns : pause_ns) {
        sqlite3 *db = NULL;
        bool held = false;
        pthread_mutex_lock(&live_mu);
        for (size_t i = 0; i < nlive && !db; i++)
            if (live[i].handle == handle)
                db = live[i].db;
        if (db) {
            sqlite3_mutex *mu = sqlite3_db_mutex(db);
            held = !mu || sqlite3_mutex_try(mu) == SQLITE_OK;
        }
        pthread_mutex_unlock(&live_mu);
        if (!db || held)
            return db;
        struct timespec ts = {0, pause_ns};
        nanosleep(&ts, NULL);
    }
}

/* One statement of sql over the connection a handle names, its arguments
 * bound by bind(stmt, arg); *value its INTEGER result.  Returns SQLite's
 * code, the message in err. */
static int run_one(sqlite3_int64 handle, const char *sql, int (*bind)(sqlite3_stmt *, const void *), const void *arg,
                   sqlite3_int64 *value, char *err, size_t errlen, const char *fname, const char *table, size_t n,
                   size_t grad_bytes)
{
    sqlite3 *db = live_enter(handle);
    if (!db) {
        if (err && errlen)
            snprintf(err, errlen, "embkv: %lld names no open connection of this library", (long long)handle);
        return EK_DIRECT_UNKNOWN;
    }
    sqlite3_stmt *stmt = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, NULL);
    if (rc == SQLITE_MISUSE) {
        /* sqlite3_close_v2 left it open for unfinalized statements (a
         * zombie): closed for its user. */
        sqlite3_mutex_leave(sqlite3_db_mutex(db));
        if (err && errlen)
            snprintf(err, errlen, "embkv: connection %lld is closed", (long long)handle);
        return EK_DIRECT_UNKNOWN;
    }
    if (rc == SQLITE_OK && (rc = bind(stmt, arg)) == SQLITE_TOOBIG) {
        /* An argument over the connection's length limit: said with the
         * figures (SQLite's own message names none). */
        if (err && errlen)
            snprintf(err, errlen,
                     "%s: table %s: %zu ids (%zu bytes)%s are over this connection's limit of %d bytes for one "
                     "value (SQLITE_LIMIT_LENGTH): %s fewer ids at a time",
                     fname, table, n, n * sizeof(int64_t), grad_bytes ? " or their gradients" : "",
                     sqlite3_limit(db, SQLITE_LIMIT_LENGTH, -1), grad_bytes ? "push" : "pull");
        sqlite3_finalize(stmt);
        sqlite3_mutex_leave(sqlite3_db_mutex(db));
        return SQLITE_TOOBIG;
    }
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(stmt);
        if (rc == SQLITE_ROW) {
            *value = sqlite3_column_int64(stmt, 0);
            rc = SQLITE_OK;
        }
    }
    if (rc != SQLITE_OK) {
        /* The function's own error and code (the statement's step set
         * them on the connection). */
        rc = sqlite3_extended_errcode(db);
        if (rc == SQLITE_OK)
            rc = SQLITE_ERROR;
        if (err && errlen)
            snprintf(err, errlen, "%s", sqlite3_errmsg(db));
    }
    sqlite3_finalize(stmt);
    sqlite3_mutex_leave(sqlite3_db_mutex(db));
    return rc;
}

/* Arguments 1 and 2 of both statements: the table, the ids where they lie. */
static int bind_table_ids(sqlite3_stmt *stmt, const char *table, const int64_t *ids, size_t n)
{
    int rc = sqlite3_bind_text(stmt, 1, table, -1, SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_blob64(stmt, 2, ids ? (const void *)ids : (const void *)"", n * sizeof *ids, SQLITE_STATIC);
    return rc;
}

/* The most ids one call takes: their int64 array is one SQL value, which
 * holds at most 2^31 - 1 bytes (a lower SQLITE_LIMIT_LENGTH of the
 * connection: SQLite's own SQLITE_TOOBIG). */
#define EK_DIRECT_MAX_IDS (INT32_MAX / (int)sizeof(int64_t))

typedef struct pull_args {
    const char *table;
    const int64_t *ids;
    size_t n;
    int once;
    ek_rows_out *out;
} pull_args;

static int bind_pull(sqlite3_stmt *stmt, const void *p)
{
    const pull_args *a = p;
    int rc = bind_table_ids(stmt, a->table, a->ids, a->n);
    if (rc == SQLITE_OK)
        rc = a->once ? sqlite3_bind_text(stmt, 3, "once", 4, SQLITE_STATIC) : sqlite3_bind_null(stmt, 3);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_pointer(stmt, 4, a->out, EK_ROWS_OUT, NULL);
    return rc;
}

int embkv_direct_pull(sqlite3_int64 handle, const char *table, const int64_t *ids, size_t n, float *out,
                      size_t out_bytes, int once, char *err, size_t errlen)
{
    if (!table || (n && (!ids || !out))) {
        if (err && errlen)
            snprintf(err, errlen, "embkv_direct_pull: NULL argument");
        return SQLITE_MISUSE;
    }
    if (n > EK_DIRECT_MAX_IDS) {
        if (err && errlen)
            snprintf(err, errlen,
                     "embkv_direct_pull: table %s: %zu ids in one call, more than a SQL value holds (%d ids, "
                     "2147483647 bytes): pull fewer at a time",
                     table, n, (int)EK_DIRECT_MAX_IDS);
        return SQLITE_TOOBIG;
    }
    ek_rows_out o = {out, out_bytes};
    pull_args a = {table, ids, n, once, &o};
    sqlite3_int64 got = 0;
    return run_one(handle, "SELECT embkv_pull(?1, ?2, ?3, ?4)", bind_pull, &a, &got, err, errlen, "embkv_pull", table,
                   n, 0);
}

typedef struct push_args {
    const char *table;
    const int64_t *ids;
    size_t n;
    const float *grads;
    size_t grad_bytes;
    const double *lr;
    bool nan_lr;
} push_args;

static int bind_push(sqlite3_stmt *stmt, const void *p)
{
    const push_args *a = p;
    int rc = bind_table_ids(stmt, a->table, a->ids, a->n);
    if (rc == SQLITE_OK)
        rc = sqlite3_bind_blob64(stmt, 3, a->grads ? (const void *)a->grads : (const void *)"", a->grad_bytes,
                                 SQLITE_STATIC);
    if (rc == SQLITE_OK)
        rc = a->nan_lr ? sqlite3_bind_text(stmt, 4, "NaN", 3, SQLITE_STATIC)
             : a->lr   ? sqlite3_bind_double(stmt, 4, *a->lr)
                       : sqlite3_bind_null(stmt, 4);
    return rc;
}

int embkv_direct_push(sqlite3_int64 handle, const char *table, const int64_t *ids, size_t n, const float *grads,
                      size_t grad_bytes, const double *lr, sqlite3_int64 *updated, char *err, size_t errlen)
{
    sqlite3_int64 got = 0;
    if (updated)
        *updated = 0;
    if (!table || (n && (!ids || !grads))) {
        if (err && errlen)
            snprintf(err, errlen, "embkv_direct_push: NULL argument");
        return SQLITE_MISUSE;
    }
    if (n > EK_DIRECT_MAX_IDS || grad_bytes > INT32_MAX) {
        if (err && errlen)
            snprintf(err, errlen,
                     "embkv_direct_push: table %s: %zu ids and %zu bytes of gradients in one call, more than a SQL "
                     "value holds (%d ids, 2147483647 bytes): push fewer at a time",
                     table, n, grad_bytes, (int)EK_DIRECT_MAX_IDS);
        return SQLITE_TOOBIG;
    }
    /* SQLite binds a NaN as NULL, which would mean the table's own lr: a
     * NaN goes as text, which embkv_push refuses as any bad lr. */
    bool nan_lr = lr && isnan(*lr);
    push_args a = {table, ids, n, grads, grad_bytes, lr, nan_lr};
    int rc = run_one(handle, "SELECT embkv_push(?1, ?2, ?3, ?4)", bind_push, &a, &got, err, errlen, "embkv_push",
                     table, n, grad_bytes ? grad_bytes : 1);
    if (rc == SQLITE_OK && updated)
        *updated = got;
    return rc;
}
