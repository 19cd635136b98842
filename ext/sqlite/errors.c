/*
 * errors.c - how the binding reports a failure: a table's error message,
 * the SQLite result code of an engine result, and the refusal of a table
 * connected without its store.
 *
 * Why a file of its own, at the bottom: the module, the cursors, the value
 * readers and the write buffers all report through these, and each message
 * must name the table the same way ("embkv table <name>: ..."); kept in the
 * module, they made every lower file call up into it.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void ekerr_table(ekvtab *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *m = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    sqlite3_free(v->base.zErrMsg);
    v->base.zErrMsg = sqlite3_mprintf("embkv table %s: %s", v->zName, m ? m : "out of memory");
    sqlite3_free(m);
}

int ekerr_vtab(sqlite3_vtab *pv, int rc, char *msg)
{
    sqlite3_free(pv->zErrMsg);
    pv->zErrMsg = msg;
    return msg ? rc : SQLITE_NOMEM;
}

int ekerr_rc(int erc)
{
    switch (erc) {
    case EMBKV_OK: return SQLITE_OK;
    case EMBKV_NOMEM: return SQLITE_NOMEM;
    case EMBKV_FULL: return SQLITE_FULL;
    case EMBKV_IO: return SQLITE_IOERR;
    case EMBKV_LOCKED: return SQLITE_BUSY;
    case EMBKV_READONLY: return SQLITE_READONLY;
    case EMBKV_BUSY: return SQLITE_BUSY;
    case EMBKV_CORRUPT: return SQLITE_CORRUPT;
    case EMBKV_EXISTS: return SQLITE_CONSTRAINT_PRIMARYKEY;
    case EMBKV_NOTSTORE:
    case EMBKV_VERSION: return SQLITE_CANTOPEN;
    default: return SQLITE_ERROR;
    }
}

/* A table connected without its store (see vt_init) can only be dropped:
 * SQLITE_OK when it has its store, else the code of the reason, with the
 * reason as the table's message. */
int ekerr_unusable(ekvtab *v)
{
    if (v->store) return SQLITE_OK;
    ekerr_table(v, "%s", v->broken);
    return v->broken_rc ? v->broken_rc : SQLITE_ERROR;
}

int ek_pragma_int(sqlite3 *db, const char *name, int fallback)
{
    char sql[64];
    snprintf(sql, sizeof sql, "PRAGMA %s", name);
    sqlite3_stmt *st = NULL;
    int v = fallback;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

int ek_in_write_statement(sqlite3 *db)
{
    /* (A COMMIT statement is read-only to SQLite, and no write statement
     * may run beside it: a busy one that writes is the autocommit
     * statement whose commit this is.) */
    for (sqlite3_stmt *st = sqlite3_next_stmt(db, NULL); st; st = sqlite3_next_stmt(db, st))
        if (sqlite3_stmt_busy(st) && !sqlite3_stmt_readonly(st)) return 1;
    return 0;
}

int ek_each_schema(sqlite3 *db, int (*fn)(sqlite3 *db, const char *schema, void *arg), void *arg)
{
    /* sqlite3_db_name where the library has it (3.39; no SQL to prepare),
     * else PRAGMA database_list. */
    int rc = SQLITE_OK;
    if (sqlite3_libversion_number() >= 3039000) {
        const char *name;
        for (int i = 0; rc == SQLITE_OK && (name = sqlite3_db_name(db, i)) != NULL; i++) rc = fn(db, name, arg);
        return rc;
    }
    sqlite3_stmt *st = NULL;
    rc = sqlite3_prepare_v2(db, "SELECT name FROM pragma_database_list", -1, &st, NULL);
    while (rc == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) rc = fn(db, (const char *)sqlite3_column_text(st, 0), arg);
    sqlite3_finalize(st);
    return rc;
}

/* Why a connection may not change the tables of schema zDb (the access
 * model, docs/sql.md "Who may touch a store"), or NULL when it may.  A
 * connection opened read-only, a read-only attached file and PRAGMA
 * query_only all refuse SQL writes in SQLite itself; the functions that
 * change a store (pull creating rows, push, import, checkpoint, hot set)
 * follow the same rule, so that a serving process opened read-only cannot
 * change the model through them either. */
const char *ekerr_readonly(sqlite3 *db, const char *zDb)
{
    if (sqlite3_db_readonly(db, zDb) == 1) return "the database is open read-only";
    /* query_only has no C interface: the pragma is the only way to read it,
     * and a prepared copy would keep the value it was prepared with.  One
     * that cannot be read refuses (the safe answer). */
    int on = ek_pragma_int(db, "query_only", -1);
    return on < 0 ? "PRAGMA query_only cannot be read" : on ? "PRAGMA query_only is on" : NULL;
}

int ekerr_refuse_readonly(sqlite3_context *ctx, const char *fname, const char *schema, const char *table,
                          const char *what, embkv_store *store)
{
    const char *why = ekerr_readonly(sqlite3_context_db_handle(ctx), schema);
    if (!why) return 0;
    int main_db = sqlite3_stricmp(schema, "main") == 0;
    char *whyd = !main_db && strncmp(why, "the database", 12) == 0
                     ? sqlite3_mprintf("the database %s is open read-only", schema)
                     : NULL;
    /* A store this process reads beside another's writer: only there. */
    long writer = store && embkv_readonly(store) ? embkv_writer_pid(store) : 0;
    if (writer == (long)getpid()) writer = 0; /* (this process writes it too: a connection that may write) */
    char *advice = writer ? sqlite3_mprintf("process %ld writes the store: call it there", writer)
                          : sqlite3_mprintf("call it from a connection that may write (the database opened "
                                            "read-write, PRAGMA query_only off)");
    char *m = sqlite3_mprintf("%s: table %s%s%s: %s, and %s changes the store (%s); %s", fname, main_db ? "" : schema,
                              main_db ? "" : ".", table, whyd ? whyd : why, fname, what,
                              advice ? advice : "call it where the store is written");
    sqlite3_free(advice);
    sqlite3_free(whyd);
    sqlite3_result_error(ctx, m ? m : "read-only connection", -1);
    sqlite3_free(m);
    sqlite3_result_error_code(ctx, SQLITE_READONLY);
    return 1;
}
