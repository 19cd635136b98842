/*
 * pending.c - directory removals tied to the outcome of the open
 * transaction, through the eponymous virtual table embkv_pending.
 *
 * Why embkv_pending: DROP TABLE calls xDestroy in the middle of the
 * transaction, and a ROLLBACK must give the table back with its data, so
 * the directory can only go once the DROP is committed; symmetrically a
 * CREATE VIRTUAL TABLE that is rolled back must not leave its new directory
 * behind.  SQLite tells a virtual table about COMMIT and ROLLBACK only when
 * it takes part in the transaction, and the dropped table no longer does
 * (xDestroy removes it).  sqlite3_commit_hook() has a single slot per
 * connection that we would take from the application.  So xDestroy/xCreate
 * write one row to embkv_pending (a nested INSERT, as FTS5 runs nested DDL
 * in xDestroy): that makes embkv_pending's instance part of the transaction,
 * with xCommit, xRollback and the savepoint calls, which carry out or cancel
 * the removal exactly when the transaction (or a ROLLBACK TO) decides it.
 * Only the binding can write to embkv_pending; SELECT * FROM embkv_pending
 * shows what the open transaction will remove.
 *
 * A committed DROP also makes the connection's other instances of the
 * table (kept by cached statements) let go of the store: that is part of
 * carrying out the removal, since the directory cannot go while they hold
 * it, so it is done here rather than in the module.  A rolled-back CREATE
 * marks its instance gone (binding.h: ekvtab.gone).
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------
 * Removals tied to the transaction: the embkv_pending eponymous table
 */
static int defer(ekconn *c, int when, const char *dir, const char *tid, const ekuser *who, int owner, char **err)
{
    ekpend p;
    memset(&p, 0, sizeof p);
    p.when = when;
    p.unlist = who != NULL;
    if (who) p.who = *who;
    p.owner = owner;
    p.dir = strdup(dir);
    if (!p.dir) return SQLITE_NOMEM;
    if (tid) memcpy(p.tid, tid, 17);
    c->staged = &p;
    char *msg = NULL;
    int rc = sqlite3_exec(c->db, "INSERT INTO main.embkv_pending(action) VALUES (NULL)", NULL, NULL, &msg);
    c->staged = NULL;
    if (rc == SQLITE_OK && !p.consumed) {
        rc = SQLITE_ERROR;
        msg = sqlite3_mprintf("main.embkv_pending is not embkv's (a table of that name hides it)");
    }
    if (rc != SQLITE_OK) {
        free(p.dir);
        if (ekerr_readonly(c->db, "main"))
            *err = sqlite3_mprintf("a connection that may not write its main database (%s) cannot create or drop "
                                   "embkv tables, temporary ones included: their directories are tied to a "
                                   "transaction in main; use a connection that may write", ekerr_readonly(c->db, "main"));
        else
            *err = sqlite3_mprintf("cannot tie the removal of directory %s to the transaction: %s", dir,
                                   msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return rc;
    }
    sqlite3_free(msg);
    return SQLITE_OK; /* xUpdate took ownership of p.dir */
}

int ekconn_removing(const ekconn *c, const char *dir)
{
    for (int i = 0; i < c->npend; i++)
        if (c->pend[i].when == (EK_ON_COMMIT | EK_ON_ROLLBACK) && (!c->pend[i].unlist || c->pend[i].owner) &&
            strcmp(c->pend[i].dir, dir) == 0)
            return 1;
    return 0;
}

int ekconn_defer_remove(ekconn *c, int when, const char *dir, const char *tid, char **err)
{
    return defer(c, when, dir, tid, NULL, 0, err);
}

int ekconn_defer_unlist(ekconn *c, int when, const char *dir, const ekuser *who, int owner, char **err)
{
    return defer(c, when, dir, who->tid, who, owner, err);
}

/* A DROP of the table with stable id tid has committed: the connection's
 * other instances of it (an instance under the
 * table's old name after ALTER TABLE RENAME, kept by a cached statement)
 * let go of the store, so that its directory can go now. */
static void pend_detach_table(ekconn *c, const char *tid)
{
    for (ekvtab *v = c->tabs; v; v = v->next) {
        if (!v->store || strcmp(v->tid, tid) != 0) continue;
        char *why = sqlite3_mprintf("table %s was dropped", v->zName);
        if (!why) continue;  /* keeps the store: the directory goes with the connection */
        if (v->session) embkv_session_close(v->session);
        v->session = NULL;
        if (v->wb) ekwbuf_release(v->wb, c);
        v->wb = NULL;
        v->txn = NULL;
        if (v->evict_writer) ekreg_train_leave(v->store, &v->opts.train);
        v->evict_writer = 0;
        ekreg_close(v->store);
        v->store = NULL;
        sqlite3_free(v->broken);
        v->broken = why;
        v->broken_rc = SQLITE_ERROR;
    }
}

static void pend_carry_out(ekconn *c, ekpend *p, int committed)
{
    /* A committed DROP: instances of the table that SQLite still keeps
     * (cached statements) let go of it.  A rolled-back CREATE's instance
     * goes with the rollback, unless a cached statement (Python's among
     * them) keeps it: marked gone, so that the functions naming the table
     * fail as SQL does instead of writing into a store that is going.  (It
     * keeps its store until SQLite lets it go: the rollback's own undoing
     * of its writes still needs it.) */
    if (committed && p->tid[0]) pend_detach_table(c, p->tid);
    if (!committed && p->tid[0])
        for (ekvtab *v = c->tabs; v; v = v->next)
            if (!v->gone && strcmp(v->tid, p->tid) == 0)
                v->gone = sqlite3_mprintf("no such table: %s (its CREATE was rolled back)", v->zName);
    if (p->unlist) {
        int left = ekusers_remove(p->dir, &p->who);
        if (left == 0 || (left == -1 && p->owner)) ekreg_discard(p->dir);
    } else if (p->tid[0]) {
        ekreg_tmpdir_forget(NULL, p->tid);
    } else {
        ekreg_discard(p->dir);
    }
}

typedef struct {
    sqlite3_vtab base;
    ekconn *conn;
} pendtab;

typedef struct {
    sqlite3_vtab_cursor base;
    int i;
} pendcur;

static int pend_connect(sqlite3 *db, void *aux, int argc, const char *const *argv, sqlite3_vtab **pp,
                        char **pzErr)
{
    (void)argc;
    (void)argv;
    (void)pzErr;
    int rc = sqlite3_declare_vtab(db, "CREATE TABLE x(action TEXT, path TEXT)");
    if (rc != SQLITE_OK) return rc;
    pendtab *t = sqlite3_malloc(sizeof *t);
    if (!t) return SQLITE_NOMEM;
    memset(t, 0, sizeof *t);
    t->conn = aux;
    ekconn_ref(t->conn);
    *pp = &t->base;
    return SQLITE_OK;
}

static int pend_disconnect(sqlite3_vtab *pv)
{
    pendtab *t = (pendtab *)pv;
    ekconn_unref(t->conn);
    sqlite3_free(t);
    return SQLITE_OK;
}

static int pend_best_index(sqlite3_vtab *pv, sqlite3_index_info *info)
{
    (void)pv;
    info->estimatedCost = 10;
    info->estimatedRows = 10;
    return SQLITE_OK;
}

static int pend_open(sqlite3_vtab *pv, sqlite3_vtab_cursor **pc)
{
    (void)pv;
    pendcur *c = sqlite3_malloc(sizeof *c);
    if (!c) return SQLITE_NOMEM;
    memset(c, 0, sizeof *c);
    *pc = &c->base;
    return SQLITE_OK;
}

static int pend_close(sqlite3_vtab_cursor *pc)
{
    sqlite3_free(pc);
    return SQLITE_OK;
}

static int pend_filter(sqlite3_vtab_cursor *pc, int idxNum, const char *idxStr, int argc, sqlite3_value **argv)
{
    (void)idxNum;
    (void)idxStr;
    (void)argc;
    (void)argv;
    ((pendcur *)pc)->i = 0;
    return SQLITE_OK;
}

static int pend_next(sqlite3_vtab_cursor *pc)
{
    ((pendcur *)pc)->i++;
    return SQLITE_OK;
}

static int pend_eof(sqlite3_vtab_cursor *pc)
{
    pendtab *t = (pendtab *)pc->pVtab;
    return ((pendcur *)pc)->i >= t->conn->npend;
}

static int pend_column(sqlite3_vtab_cursor *pc, sqlite3_context *ctx, int col)
{
    pendtab *t = (pendtab *)pc->pVtab;
    const ekpend *p = &t->conn->pend[((pendcur *)pc)->i];
    if (col == 0) {
        /* release: the table lets go of the store, which goes with the
         * last table using it. */
        const char *a = p->when == EK_ON_COMMIT     ? (p->unlist ? "release on commit" : "remove on commit")
                        : p->when == EK_ON_ROLLBACK ? (p->unlist ? "release on rollback" : "remove on rollback")
                                                    : "remove at transaction end";
        sqlite3_result_text(ctx, a, -1, SQLITE_STATIC);
    } else {
        sqlite3_result_text(ctx, p->dir, -1, SQLITE_TRANSIENT);
    }
    return SQLITE_OK;
}

static int pend_rowid(sqlite3_vtab_cursor *pc, sqlite3_int64 *r)
{
    *r = ((pendcur *)pc)->i + 1;
    return SQLITE_OK;
}

static int pend_update(sqlite3_vtab *pv, int argc, sqlite3_value **argv, sqlite3_int64 *rowid)
{
    pendtab *t = (pendtab *)pv;
    ekconn *c = t->conn;
    if (!c->staged || argc == 1 || sqlite3_value_type(argv[0]) != SQLITE_NULL) {
        sqlite3_free(pv->zErrMsg);
        pv->zErrMsg = sqlite3_mprintf("embkv_pending is maintained by embkv and cannot be written");
        return SQLITE_ERROR;
    }
    if (c->npend == c->cappend) {
        int cap = c->cappend ? c->cappend * 2 : 4;
        ekpend *n = realloc(c->pend, (size_t)cap * sizeof *n);
        if (!n) return SQLITE_NOMEM;
        c->pend = n;
        c->cappend = cap;
    }
    c->pend[c->npend++] = *c->staged;
    c->staged->consumed = 1;
    *rowid = c->npend;
    return SQLITE_OK;
}

static int pend_begin(sqlite3_vtab *pv)
{
    (void)pv;
    return SQLITE_OK;
}

/* The writes of a table dropped in this transaction (ekconn_sync_stranded):
 * the DROP wrote to embkv_pending, so they commit or roll back here. */
static int pend_sync(sqlite3_vtab *pv)
{
    char *msg = NULL;
    ekconn *c = ((pendtab *)pv)->conn;
    int rc = ekconn_commit_prepare(c, &msg);
    if (rc == SQLITE_OK) rc = ekconn_sync_stranded(c, &msg);
    if (rc != SQLITE_OK) {
        sqlite3_free(pv->zErrMsg);
        pv->zErrMsg = msg;
    }
    return rc;
}

static int pend_commit(sqlite3_vtab *pv)
{
    ekconn *c = ((pendtab *)pv)->conn;
    ekconn_end_stranded(c, 1);
    for (int i = 0; i < c->npend; i++)
        if (c->pend[i].when & EK_ON_COMMIT) pend_carry_out(c, &c->pend[i], 1);
    ekconn_pend_clear(c);
    return SQLITE_OK;
}

static int pend_rollback(sqlite3_vtab *pv)
{
    ekconn *c = ((pendtab *)pv)->conn;
    ekconn_end_stranded(c, 0);
    for (int i = 0; i < c->npend; i++)
        if (c->pend[i].when & EK_ON_ROLLBACK) pend_carry_out(c, &c->pend[i], 0);
    ekconn_pend_clear(c);
    return SQLITE_OK;
}

/* The savepoint calls also reach the connection's write buffers: those of
 * a table dropped in the transaction have no instance left to hear them
 * (the calls are idempotent for the others). */
static int pend_savepoint(sqlite3_vtab *pv, int n)
{
    ekconn *c = ((pendtab *)pv)->conn;
    int rc = ekconn_wbufs_savepoint(c, EK_SAVEPOINT, n);
    if (rc != SQLITE_OK || n < 0) return rc;
    if (n >= c->cappmark) {
        int cap = c->cappmark ? c->cappmark : 8;
        while (cap <= n) cap *= 2;
        int *m = realloc(c->pmark, (size_t)cap * sizeof *m);
        if (!m) return SQLITE_NOMEM;
        c->pmark = m;
        c->cappmark = cap;
    }
    for (int k = c->pnsp; k < n; k++) c->pmark[k] = c->npend;
    c->pmark[n] = c->npend;
    c->pnsp = n + 1;
    return SQLITE_OK;
}

static int pend_release(sqlite3_vtab *pv, int n)
{
    ekconn *c = ((pendtab *)pv)->conn;
    ekconn_wbufs_savepoint(c, EK_RELEASE, n);
    if (n < 0) n = 0;
    if (n < c->pnsp) c->pnsp = n;
    return SQLITE_OK;
}

static int pend_rollback_to(sqlite3_vtab *pv, int n)
{
    ekconn *c = ((pendtab *)pv)->conn;
    ekconn_wbufs_savepoint(c, EK_ROLLBACK_TO, n);
    /* n == -1: back to the start of the transaction (ROLLBACK TO the
     * savepoint that began it). */
    if (n >= c->pnsp) return SQLITE_OK;
    int from = n < 0 ? 0 : c->pmark[n];
    /* What happened after the savepoint is undone: a DROP's removal is
     * cancelled; a CREATE's directory must go whatever happens next. */
    int w = from;
    for (int i = from; i < c->npend; i++) {
        if (c->pend[i].when == EK_ON_COMMIT) {
            free(c->pend[i].dir);
            continue;
        }
        c->pend[i].when = EK_ON_COMMIT | EK_ON_ROLLBACK;
        c->pend[w++] = c->pend[i];
    }
    c->npend = w;
    c->pnsp = n < 0 ? 0 : n + 1;
    return SQLITE_OK;
}

static const sqlite3_module pend_module = {
    .iVersion = 2,
    .xCreate = NULL, /* eponymous only */
    .xConnect = pend_connect,
    .xBestIndex = pend_best_index,
    .xDisconnect = pend_disconnect,
    .xDestroy = pend_disconnect,
    .xOpen = pend_open,
    .xClose = pend_close,
    .xFilter = pend_filter,
    .xNext = pend_next,
    .xEof = pend_eof,
    .xColumn = pend_column,
    .xRowid = pend_rowid,
    .xUpdate = pend_update,
    .xBegin = pend_begin,
    .xSync = pend_sync,
    .xCommit = pend_commit,
    .xRollback = pend_rollback,
    .xSavepoint = pend_savepoint,
    .xRelease = pend_release,
    .xRollbackTo = pend_rollback_to,
};

int ekconn_register_pending(sqlite3 *db, ekconn *c)
{
    ekconn_ref(c);
    return sqlite3_create_module_v2(db, "embkv_pending", &pend_module, c, ekconn_unref_v);
}

