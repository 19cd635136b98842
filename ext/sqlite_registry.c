/*
 * sqlite_registry.c - state of the embkv binding beyond one table instance:
 *
 *  - per process: the stores the binding has open (by canonical directory,
 *    reference counted, with a "remove when the last reference closes"
 *    mark), and the temporary directories of tables of :memory: and temp
 *    databases (keyed by the table's stable id, referenced by connections);
 *  - per connection (ekconn, the client data of the modules and functions):
 *    the connected tables (so SQL functions can resolve a table name), the
 *    temporary directories it uses, and the directory removals waiting for
 *    the outcome of the open transaction;
 *  - the eponymous virtual table embkv_pending, through which those
 *    removals take part in the transaction (see below);
 *  - embkv_table_lookup(), embkv_stats() and embkv_checkpoint().
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
 */
#include "sqlite_vtab.h"
SQLITE_EXTENSION_INIT3

#include <cjson/cJSON.h>
#include <dlfcn.h>
#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static pthread_mutex_t ek_mu = PTHREAD_MUTEX_INITIALIZER;

/* ------------------------------------------------------------------------
 * Keeping the shared object loaded
 *
 * SQLite dlclose()s an extension when the connection that loaded it closes;
 * when the last one does, the library is unmapped.  The engine registers a
 * pthread key destructor (epoch.c) and keeps thread-local state: a thread
 * that used a store and outlives the last connection would run unmapped
 * code at exit (a crash seen with Python threads, each with a connection).
 * So the first registration pins the library for the life of the process
 * with RTLD_NODELETE (the link-time equivalent is -Wl,-z,nodelete).
 */
static void pin_library(void)
{
    Dl_info info;
    if (dladdr((void *)&pin_library, &info) && info.dli_fname) {
        void *h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
        (void)h; /* the reference is kept on purpose */
    }
}

void ekreg_pin_library(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, pin_library);
}

/* ------------------------------------------------------------------------
 * Open stores
 */
typedef struct ekopen {
    struct ekopen *next;
    embkv_store *s;
    char *dir;   /* canonical */
    int refs;
    int discard; /* remove the directory when refs drops to 0 */
} ekopen;

static ekopen *ek_open_list;

int ekreg_open(const char *dir, const embkv_options *o, unsigned flags, embkv_store **out, char **err)
{
    embkv_store *s = NULL;
    *out = NULL;
    *err = NULL;
    pthread_mutex_lock(&ek_mu);
    int rc = embkv_open(dir, o, flags, &s);
    if (rc != EMBKV_OK) {
        *err = sqlite3_mprintf("%s", embkv_errmsg());
        pthread_mutex_unlock(&ek_mu);
        return rc;
    }
    ekopen *e;
    for (e = ek_open_list; e && e->s != s; e = e->next) {}
    if (e && e->discard) {
        *err = sqlite3_mprintf("%s belongs to a dropped table and is still open in this process", e->dir);
        embkv_close(s);
        pthread_mutex_unlock(&ek_mu);
        return EMBKV_BUSY;
    }
    if (e) {
        e->refs++;
    } else {
        e = malloc(sizeof *e);
        char *d = e ? strdup(embkv_path(s)) : NULL;
        if (!e || !d) {
            free(e);
            embkv_close(s);
            pthread_mutex_unlock(&ek_mu);
            return EMBKV_NOMEM;
        }
        e->s = s;
        e->dir = d;
        e->refs = 1;
        e->discard = 0;
        e->next = ek_open_list;
        ek_open_list = e;
    }
    pthread_mutex_unlock(&ek_mu);
    *out = s;
    return EMBKV_OK;
}

void ekreg_close(embkv_store *s)
{
    if (!s) return;
    char *remove_dir = NULL;
    /* Under the lock, so that no open can slip in between our last
     * reference and the removal of a discarded directory. */
    pthread_mutex_lock(&ek_mu);
    for (ekopen **pe = &ek_open_list; *pe; pe = &(*pe)->next) {
        ekopen *e = *pe;
        if (e->s != s) continue;
        if (--e->refs == 0) {
            *pe = e->next;
            if (e->discard) remove_dir = e->dir;
            else free(e->dir);
            free(e);
        }
        break;
    }
    embkv_close(s); /* errors: the store syncs on close; nothing to report to */
    if (remove_dir) {
        ek_remove_tree(remove_dir);
        free(remove_dir);
    }
    pthread_mutex_unlock(&ek_mu);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    int r = (flag == FTW_DP) ? rmdir(path) : unlink(path);
    return r == 0 || errno == ENOENT ? 0 : -1;
}

int ek_remove_tree(const char *dir)
{
    if (!dir || !*dir || strcmp(dir, "/") == 0) return -1;
    return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0 ? 0 : -1;
}

void ekreg_discard(const char *dir)
{
    char canon[PATH_MAX];
    if (!realpath(dir, canon)) return; /* already gone */
    pthread_mutex_lock(&ek_mu);
    ekopen *e;
    for (e = ek_open_list; e && strcmp(e->dir, canon) != 0; e = e->next) {}
    if (e) e->discard = 1;
    else ek_remove_tree(canon);
    pthread_mutex_unlock(&ek_mu);
}

/* ------------------------------------------------------------------------
 * Temporary directories
 */
typedef struct ektmp {
    struct ektmp *next;
    char tid[17];
    char *path;
    int nconn;
} ektmp;

static ektmp *ek_tmp_list;

typedef struct ekpend {
    int when;       /* EK_ON_COMMIT, EK_ON_ROLLBACK or both */
    int consumed;   /* set by embkv_pending's xUpdate */
    char *dir;
    char tid[17];
} ekpend;

struct ekconn {
    sqlite3 *db;
    int refs;
    ekconn *next;
    ekvtab *tabs;
    char (*tids)[17];     /* temporary directories this connection references */
    int ntids, captids;
    ekpend *pend;         /* removals waiting for the transaction's outcome */
    int npend, cappend;
    int *pmark;           /* savepoint marks over pend */
    int pnsp, cappmark;
    ekpend *staged;       /* the row our nested INSERT is writing */
};

static ekconn *ek_conn_list;

static ektmp *tmp_find(const char *tid)
{
    ektmp *t;
    for (t = ek_tmp_list; t && strcmp(t->tid, tid) != 0; t = t->next) {}
    return t;
}

/* Caller holds ek_mu. */
static int conn_hold_tid(ekconn *c, const char *tid)
{
    for (int i = 0; i < c->ntids; i++)
        if (strcmp(c->tids[i], tid) == 0) return 1;
    if (c->ntids == c->captids) {
        int cap = c->captids ? c->captids * 2 : 4;
        void *n = realloc(c->tids, (size_t)cap * sizeof c->tids[0]);
        if (!n) return -1;
        c->tids = n;
        c->captids = cap;
    }
    memcpy(c->tids[c->ntids++], tid, 17);
    return 0;
}

int ekreg_tmpdir_create(ekconn *c, const char *tid, char **path, char **err)
{
    *path = NULL;
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    char *tmpl = sqlite3_mprintf("%s/embkv-%s-XXXXXX", base, tid);
    if (!tmpl) return SQLITE_NOMEM;
    if (!mkdtemp(tmpl)) {
        *err = sqlite3_mprintf("cannot create a temporary directory %s: %s", tmpl, strerror(errno));
        sqlite3_free(tmpl);
        return SQLITE_CANTOPEN;
    }
    pthread_mutex_lock(&ek_mu);
    ektmp *t = malloc(sizeof *t);
    char *p = t ? strdup(tmpl) : NULL;
    if (!t || !p || conn_hold_tid(c, tid) < 0) {
        free(t);
        free(p);
        pthread_mutex_unlock(&ek_mu);
        rmdir(tmpl);
        sqlite3_free(tmpl);
        return SQLITE_NOMEM;
    }
    memcpy(t->tid, tid, 17);
    t->path = p;
    t->nconn = 1;
    t->next = ek_tmp_list;
    ek_tmp_list = t;
    pthread_mutex_unlock(&ek_mu);
    *path = tmpl;
    return SQLITE_OK;
}

int ekreg_tmpdir_find(ekconn *c, const char *tid, char **path, char **err)
{
    *path = NULL;
    pthread_mutex_lock(&ek_mu);
    ektmp *t = tmp_find(tid);
    if (!t) {
        pthread_mutex_unlock(&ek_mu);
        *err = sqlite3_mprintf("the temporary store of this table is gone "
                               "(a table of a temporary database lives as long as its connections)");
        return SQLITE_ERROR;
    }
    int held = conn_hold_tid(c, tid);
    if (held == 0) t->nconn++;
    *path = held < 0 ? NULL : sqlite3_mprintf("%s", t->path);
    pthread_mutex_unlock(&ek_mu);
    return *path ? SQLITE_OK : SQLITE_NOMEM;
}

/* Unregisters a temporary directory (all references) and removes it. */
void ekreg_tmpdir_forget(ekconn *c, const char *tid)
{
    (void)c;
    char *path = NULL;
    pthread_mutex_lock(&ek_mu);
    for (ektmp **pt = &ek_tmp_list; *pt; pt = &(*pt)->next) {
        if (strcmp((*pt)->tid, tid) == 0) {
            ektmp *t = *pt;
            *pt = t->next;
            path = t->path;
            free(t);
            break;
        }
    }
    pthread_mutex_unlock(&ek_mu);
    if (path) {
        ekreg_discard(path);
        free(path);
    }
}

/* ------------------------------------------------------------------------
 * Connections
 */
ekconn *ekconn_get(sqlite3 *db)
{
    pthread_mutex_lock(&ek_mu);
    ekconn *c;
    for (c = ek_conn_list; c && c->db != db; c = c->next) {}
    if (c) {
        c->refs++;
    } else if ((c = calloc(1, sizeof *c)) != NULL) {
        c->db = db;
        c->refs = 1;
        c->next = ek_conn_list;
        ek_conn_list = c;
    }
    pthread_mutex_unlock(&ek_mu);
    return c;
}

void ekconn_ref(ekconn *c)
{
    pthread_mutex_lock(&ek_mu);
    c->refs++;
    pthread_mutex_unlock(&ek_mu);
}

static void pend_clear(ekconn *c)
{
    for (int i = 0; i < c->npend; i++) free(c->pend[i].dir);
    c->npend = 0;
    c->pnsp = 0;
}

void ekconn_unref(ekconn *c)
{
    if (!c) return;
    pthread_mutex_lock(&ek_mu);
    if (--c->refs > 0) {
        pthread_mutex_unlock(&ek_mu);
        return;
    }
    for (ekconn **pc = &ek_conn_list; *pc; pc = &(*pc)->next) {
        if (*pc == c) {
            *pc = c->next;
            break;
        }
    }
    /* The connection is closing: release its temporary directories; the
     * last connection of one removes it. */
    char **gone = calloc((size_t)c->ntids + 1, sizeof *gone);
    int ngone = 0;
    for (int i = 0; i < c->ntids; i++) {
        for (ektmp **pt = &ek_tmp_list; *pt; pt = &(*pt)->next) {
            ektmp *t = *pt;
            if (strcmp(t->tid, c->tids[i]) != 0) continue;
            if (--t->nconn == 0) {
                *pt = t->next;
                if (gone) gone[ngone++] = t->path;
                else free(t->path);
                free(t);
            }
            break;
        }
    }
    pthread_mutex_unlock(&ek_mu);
    for (int i = 0; i < ngone; i++) {
        ekreg_discard(gone[i]);
        free(gone[i]);
    }
    free(gone);
    pend_clear(c);
    free(c->pend);
    free(c->pmark);
    free(c->tids);
    free(c);
}

void ekconn_unref_v(void *c) { ekconn_unref(c); }

void ekconn_add(ekconn *c, ekvtab *v)
{
    v->next = c->tabs;
    c->tabs = v;
}

void ekconn_remove(ekconn *c, ekvtab *v)
{
    for (ekvtab **pv = &c->tabs; *pv; pv = &(*pv)->next) {
        if (*pv == v) {
            *pv = v->next;
            return;
        }
    }
}

/* ------------------------------------------------------------------------
 * Removals tied to the transaction: the embkv_pending eponymous table
 */
int ekconn_defer_remove(ekconn *c, int when, const char *dir, const char *tid, char **err)
{
    ekpend p;
    memset(&p, 0, sizeof p);
    p.when = when;
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
        *err = sqlite3_mprintf("cannot tie the removal of directory %s to the transaction: %s", dir,
                               msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return rc;
    }
    sqlite3_free(msg);
    return SQLITE_OK; /* xUpdate took ownership of p.dir */
}

static void pend_carry_out(ekpend *p)
{
    if (p->tid[0]) ekreg_tmpdir_forget(NULL, p->tid);
    else ekreg_discard(p->dir);
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
        const char *a = p->when == EK_ON_COMMIT     ? "remove on commit"
                        : p->when == EK_ON_ROLLBACK ? "remove on rollback"
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

static int pend_sync(sqlite3_vtab *pv)
{
    (void)pv;
    return SQLITE_OK;
}

static int pend_commit(sqlite3_vtab *pv)
{
    ekconn *c = ((pendtab *)pv)->conn;
    for (int i = 0; i < c->npend; i++)
        if (c->pend[i].when & EK_ON_COMMIT) pend_carry_out(&c->pend[i]);
    pend_clear(c);
    return SQLITE_OK;
}

static int pend_rollback(sqlite3_vtab *pv)
{
    ekconn *c = ((pendtab *)pv)->conn;
    for (int i = 0; i < c->npend; i++)
        if (c->pend[i].when & EK_ON_ROLLBACK) pend_carry_out(&c->pend[i]);
    pend_clear(c);
    return SQLITE_OK;
}

static int pend_savepoint(sqlite3_vtab *pv, int n)
{
    ekconn *c = ((pendtab *)pv)->conn;
    if (n < 0) return SQLITE_OK;
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
    if (n < 0) n = 0;
    if (n < c->pnsp) c->pnsp = n;
    return SQLITE_OK;
}

static int pend_rollback_to(sqlite3_vtab *pv, int n)
{
    ekconn *c = ((pendtab *)pv)->conn;
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

/* ------------------------------------------------------------------------
 * Table lookup for SQL functions
 */
static int schema_rank(const char *zDb)
{
    if (sqlite3_stricmp(zDb, "temp") == 0) return 0;
    if (sqlite3_stricmp(zDb, "main") == 0) return 1;
    return 2;
}

static ekvtab *find_connected(ekconn *c, const char *zDb, const char *zName)
{
    ekvtab *best = NULL;
    for (ekvtab *v = c->tabs; v; v = v->next) {
        if (sqlite3_stricmp(v->zName, zName) != 0) continue;
        if (zDb) {
            if (sqlite3_stricmp(v->zDb, zDb) == 0) return v;
        } else if (!best || schema_rank(v->zDb) < schema_rank(best->zDb)) {
            best = v;
        }
    }
    return best;
}

/* Makes SQLite connect the table (if it exists) by preparing a query on it. */
static int touch_table(sqlite3 *db, const char *zDb, const char *zName)
{
    char *sql = zDb ? sqlite3_mprintf("SELECT 1 FROM \"%w\".\"%w\" LIMIT 0", zDb, zName)
                    : sqlite3_mprintf("SELECT 1 FROM \"%w\" LIMIT 0", zName);
    if (!sql) return SQLITE_NOMEM;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    sqlite3_finalize(st);
    sqlite3_free(sql);
    return rc;
}

static ekconn *conn_of(sqlite3 *db)
{
    pthread_mutex_lock(&ek_mu);
    ekconn *c;
    for (c = ek_conn_list; c && c->db != db; c = c->next) {}
    pthread_mutex_unlock(&ek_mu);
    return c;
}

static ekvtab *resolve(ekconn *c, const char *table, char **err)
{
    ekvtab *v = find_connected(c, NULL, table);
    if (v) return v;
    const char *dot = strchr(table, '.');
    char *zDb = dot ? sqlite3_mprintf("%.*s", (int)(dot - table), table) : NULL;
    if (dot && !zDb) return NULL;
    int qualified = zDb && sqlite3_db_filename(c->db, zDb) != NULL;
    if (qualified && (v = find_connected(c, zDb, dot + 1)) != NULL) {
        sqlite3_free(zDb);
        return v;
    }
    int rc = touch_table(c->db, NULL, table);
    if (rc == SQLITE_OK) {
        v = find_connected(c, NULL, table);
    } else if (qualified) {
        rc = touch_table(c->db, zDb, dot + 1);
        if (rc == SQLITE_OK) v = find_connected(c, zDb, dot + 1);
    }
    if (!v)
        *err = rc == SQLITE_OK ? sqlite3_mprintf("%s is not an embkv table", table)
                               : sqlite3_mprintf("no such table: %s", table);
    sqlite3_free(zDb);
    return v;
}

int embkv_table_lookup(sqlite3 *db, const char *table, embkv_table_ref *out, char **pzErr)
{
    if (pzErr) *pzErr = NULL;
    memset(out, 0, sizeof *out);
    char *err = NULL;
    ekconn *c = conn_of(db);
    ekvtab *v = NULL;
    if (!table) err = sqlite3_mprintf("the table name is NULL");
    else if (!c) err = sqlite3_mprintf("embkv is not loaded on this connection");
    else v = resolve(c, table, &err);
    if (v && !v->store) {
        err = sqlite3_mprintf("table %s: %s", v->zName, v->broken);
        v = NULL;
    }
    if (!v) {
        if (pzErr) *pzErr = err;
        else sqlite3_free(err);
        return SQLITE_ERROR;
    }
    out->store = v->store;
    out->opts = &v->opts;
    out->schema = v->zDb;
    out->name = v->zName;
    out->dir = v->dir;
    out->pending_writes = ektxn_count(v->txn);
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * embkv_stats(table) and embkv_checkpoint(table)
 */
static int fn_table(sqlite3_context *ctx, const char *fname, sqlite3_value *arg, embkv_table_ref *ref)
{
    const char *name = sqlite3_value_type(arg) == SQLITE_TEXT ? (const char *)sqlite3_value_text(arg) : NULL;
    if (!name) {
        char *m = sqlite3_mprintf("%s: expected a table name (TEXT)", fname);
        sqlite3_result_error(ctx, m ? m : fname, -1);
        sqlite3_free(m);
        return SQLITE_ERROR;
    }
    char *err = NULL;
    if (embkv_table_lookup(sqlite3_context_db_handle(ctx), name, ref, &err) != SQLITE_OK) {
        char *m = sqlite3_mprintf("%s: %s", fname, err ? err : "out of memory");
        sqlite3_result_error(ctx, m ? m : fname, -1);
        sqlite3_free(m);
        sqlite3_free(err);
        return SQLITE_ERROR;
    }
    return SQLITE_OK;
}

static void fn_engine_error(sqlite3_context *ctx, const char *fname, const embkv_table_ref *ref, int erc)
{
    char *m = sqlite3_mprintf("%s: table %s: %s", fname, ref->name, embkv_errmsg());
    sqlite3_result_error(ctx, m ? m : fname, -1);
    sqlite3_result_error_code(ctx, erc == EMBKV_NOMEM ? SQLITE_NOMEM : erc == EMBKV_IO ? SQLITE_IOERR : SQLITE_ERROR);
    sqlite3_free(m);
}

static void fn_stats(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    if (fn_table(ctx, "embkv_stats", argv[0], &ref) != SQLITE_OK) return;
    embkv_stats st;
    embkv_train_stats ts;
    double pmean = 0;
    uint32_t pmax = 0;
    int erc = embkv_stats_get(ref.store, &st);
    if (erc == EMBKV_OK) erc = embkv_probe_stats(ref.store, &pmean, &pmax);
    if (erc == EMBKV_OK) erc = embkv_train_stats_get(ref.store, &ts);
    if (erc != EMBKV_OK) {
        fn_engine_error(ctx, "embkv_stats", &ref, erc);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *tiers = NULL, *pm = NULL, *ix = NULL, *ops = NULL, *dur = NULL, *tr = NULL;
    int ok = o != NULL;
    ok = ok && cJSON_AddStringToObject(o, "table", ref.name);
    ok = ok && cJSON_AddStringToObject(o, "schema", ref.schema);
    ok = ok && cJSON_AddStringToObject(o, "path", ref.dir);
    ok = ok && cJSON_AddNumberToObject(o, "dim", embkv_dim(ref.store));
    ok = ok && cJSON_AddNumberToObject(o, "state_floats", embkv_state_floats(ref.store));
    ok = ok && cJSON_AddNumberToObject(o, "rows", (double)st.rows);
    ok = ok && cJSON_AddNumberToObject(o, "pending_writes", (double)ref.pending_writes);
    ok = ok && cJSON_AddNumberToObject(o, "record_bytes", (double)st.record_bytes);
    /* The engine keeps every row in the PM tier (its pool) today. */
    ok = ok && (tiers = cJSON_AddObjectToObject(o, "tiers")) != NULL;
    ok = ok && (pm = cJSON_AddObjectToObject(tiers, "pm")) != NULL;
    ok = ok && cJSON_AddNumberToObject(pm, "rows", (double)st.rows);
    ok = ok && cJSON_AddNumberToObject(pm, "bytes", (double)st.pool_used_bytes);
    ok = ok && cJSON_AddNumberToObject(pm, "capacity_bytes", (double)st.pool_bytes);
    ok = ok && cJSON_AddBoolToObject(pm, "is_pmem", st.is_pmem != 0);
    ok = ok && (ix = cJSON_AddObjectToObject(o, "index")) != NULL;
    ok = ok && cJSON_AddNumberToObject(ix, "buckets", (double)st.buckets);
    ok = ok && cJSON_AddNumberToObject(ix, "slots_per_bucket", st.slots_per_bucket);
    ok = ok && cJSON_AddNumberToObject(ix, "bucket_bytes", st.bucket_bytes);
    ok = ok && cJSON_AddNumberToObject(ix, "load_factor", st.load_factor);
    ok = ok && cJSON_AddNumberToObject(ix, "probes_per_lookup", pmean);
    ok = ok && cJSON_AddNumberToObject(ix, "max_probes", pmax);
    ok = ok && cJSON_AddNumberToObject(ix, "resizes", (double)st.resizes);
    ok = ok && (ops = cJSON_AddObjectToObject(o, "ops")) != NULL;
    ok = ok && cJSON_AddNumberToObject(ops, "gets", (double)st.gets);
    ok = ok && cJSON_AddNumberToObject(ops, "batch_gets", (double)st.batch_gets);
    ok = ok && cJSON_AddNumberToObject(ops, "puts", (double)st.puts);
    ok = ok && cJSON_AddNumberToObject(ops, "deletes", (double)st.deletes);
    ok = ok && cJSON_AddNumberToObject(ops, "hot_moves", (double)st.hot_moves);
    ok = ok && (dur = cJSON_AddObjectToObject(o, "durability")) != NULL;
    ok = ok && cJSON_AddNumberToObject(dur, "durable_epoch", (double)st.durable_epoch);
    ok = ok && cJSON_AddNumberToObject(dur, "syncs", (double)st.syncs);
    ok = ok && cJSON_AddNumberToObject(dur, "last_sync_ms", st.last_sync_ms);
    ok = ok && cJSON_AddBoolToObject(dur, "recovered", st.recovered != 0);
    ok = ok && (tr = cJSON_AddObjectToObject(o, "training")) != NULL;
    ok = ok && cJSON_AddNumberToObject(tr, "pulls", (double)ts.pulls);
    ok = ok && cJSON_AddNumberToObject(tr, "pushes", (double)ts.pushes);
    ok = ok && cJSON_AddNumberToObject(tr, "rows_created", (double)ts.rows_created);
    ok = ok && cJSON_AddNumberToObject(tr, "permit_waits", (double)ts.permit_waits);
    ok = ok && cJSON_AddNumberToObject(tr, "permit_timeouts", (double)ts.permit_timeouts);
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_text(ctx, text, -1, SQLITE_TRANSIENT);
    cJSON_free(text);
}

static void fn_checkpoint(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    if (fn_table(ctx, "embkv_checkpoint", argv[0], &ref) != SQLITE_OK) return;
    embkv_stats st;
    int erc = embkv_sync(ref.store);
    if (erc == EMBKV_OK) erc = embkv_stats_get(ref.store, &st);
    if (erc != EMBKV_OK) {
        fn_engine_error(ctx, "embkv_checkpoint", &ref, erc);
        return;
    }
    sqlite3_result_int64(ctx, (sqlite3_int64)st.durable_epoch);
}

int ekfn_register(sqlite3 *db, ekconn *c)
{
    /* Side effects (a sync) or file-system paths in the result: only from
     * top-level SQL, never from views, triggers or schema. */
    const int flags = SQLITE_UTF8 | SQLITE_DIRECTONLY;
    int rc;
    ekconn_ref(c);
    rc = sqlite3_create_function_v2(db, "embkv_stats", 1, flags, c, fn_stats, NULL, NULL, ekconn_unref_v);
    if (rc != SQLITE_OK) return rc;
    ekconn_ref(c);
    return sqlite3_create_function_v2(db, "embkv_checkpoint", 1, flags, c, fn_checkpoint, NULL, NULL,
                                      ekconn_unref_v);
}
