/*
 * registry.c - state of the embkv binding beyond one table instance:
 *
 *  - per process: the stores the binding has open (by canonical directory,
 *    reference counted, with a "remove when the last reference closes"
 *    mark), and the temporary directories of tables of :memory: and temp
 *    databases (keyed by the table's stable id, referenced by connections);
 *  - per connection (ekconn, the client data of the modules and functions):
 *    the connected tables (so SQL functions can resolve a table name), the
 *    temporary directories it uses, and the directory removals waiting for
 *    the outcome of the open transaction; and the freeing of all it holds
 *    when it closes (those removals, its write buffers), here although
 *    pending.c and wbuf.c fill them, so that closing a connection calls
 *    nothing above the registry;
 *  - the directory removals themselves (ek_remove_tree).
 * The eponymous table embkv_pending, which ties removals to the outcome of
 * transactions, is in pending.c; embkv_table_lookup(), embkv_stats()
 * and embkv_checkpoint() in stats.c.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

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
    pid_t pid;   /* the process that opened it: a forked child closing an
                  * inherited connection must not remove the parent's files */
    pthread_mutex_t commit_mu; /* see ekreg_commit_lock */
    int writers; /* table instances of connections that may write (ekreg_train_configure) */
    uint64_t jlive; /* journal slots owned by COMMITs or recoveries of this process (journal.c, J4) */
    ekseq *seqs;    /* ekreg_seq's */
} ekopen;

static ekopen *ek_open_list;

int ekreg_open(const char *dir, const embkv_options *o, unsigned flags, embkv_store **out, char **err)
{
    embkv_store *s = NULL;
    *out = NULL;
    *err = NULL;
    pthread_mutex_lock(&ek_mu);
    int rc = embkv_open(dir, o, flags, &s);
    ekopen *e;
    if (rc != EMBKV_OK) {
        /* (a store a dropped table still holds refuses options it was not
         * made with, too: the way on is the same as below) */
        char *canon = realpath(dir, NULL);
        for (e = ek_open_list; e && !(canon && e->discard && strcmp(e->dir, canon) == 0); e = e->next) {}
        free(canon);
        *err = e ? sqlite3_mprintf("%s (that store belongs to a dropped table and is still open in this process: a "
                                   "prepared statement may still hold that table: finalize it, or close the "
                                   "connection)", embkv_errmsg())
                 : sqlite3_mprintf("%s", embkv_errmsg());
        pthread_mutex_unlock(&ek_mu);
        return e ? EMBKV_BUSY : rc;
    }
    for (e = ek_open_list; e && e->s != s; e = e->next) {}
    if (e && e->discard) {
        *err = sqlite3_mprintf("%s belongs to a dropped table and is still open in this process (a prepared "
                               "statement may still hold that table: finalize it, or close the connection)", e->dir);
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
        e->writers = 0;
        e->jlive = 0;
        e->seqs = NULL;
        e->pid = getpid();
        pthread_mutex_init(&e->commit_mu, NULL);
        e->next = ek_open_list;
        ek_open_list = e;
    }
    pthread_mutex_unlock(&ek_mu);
    *out = s;
    return EMBKV_OK;
}

/* Whether any COMMIT of the process numbered a table: until one did, a
 * cursor's lookup takes no lock. */
static atomic_int ek_seq_made;

ekseq *ekreg_seq(embkv_store *s, const ekuser *who, int create)
{
    if (!create && !atomic_load_explicit(&ek_seq_made, memory_order_acquire)) return NULL;
    pthread_mutex_lock(&ek_mu);
    ekopen *o = ek_open_list;
    while (o && o->s != s) o = o->next;
    ekseq *e = o ? o->seqs : NULL;
    while (e && !(e->dev == who->dev && e->ino == who->ino && strcmp(e->tid, who->tid) == 0)) e = e->next;
    if (o && !e && create && (e = calloc(1, sizeof *e)) != NULL) {
        memcpy(e->tid, who->tid, sizeof e->tid);
        e->dev = who->dev;
        e->ino = who->ino;
        e->next = o->seqs;
        o->seqs = e;
        atomic_store_explicit(&ek_seq_made, 1, memory_order_release);
    }
    pthread_mutex_unlock(&ek_mu);
    return e;
}

pthread_mutex_t *ekreg_commit_lock(embkv_store *s)
{
    pthread_mutex_lock(&ek_mu);
    ekopen *e;
    for (e = ek_open_list; e && e->s != s; e = e->next) {}
    pthread_mutex_unlock(&ek_mu);
    /* The entry lives while the caller holds its reference to s. */
    if (e) pthread_mutex_lock(&e->commit_mu);
    return e ? &e->commit_mu : NULL;
}

int ekreg_journal_take(embkv_store *s, int k)
{
    pthread_mutex_lock(&ek_mu);
    ekopen *e;
    for (e = ek_open_list; e && e->s != s; e = e->next) {}
    int took = e && !(e->jlive & (1ull << k));
    if (took) e->jlive |= 1ull << k;
    pthread_mutex_unlock(&ek_mu);
    return took;
}

void ekreg_journal_drop(embkv_store *s, int k)
{
    pthread_mutex_lock(&ek_mu);
    ekopen *e;
    for (e = ek_open_list; e && e->s != s; e = e->next) {}
    if (e) e->jlive &= ~(1ull << k);
    pthread_mutex_unlock(&ek_mu);
}

void ekreg_commit_unlock(pthread_mutex_t *mu)
{
    if (mu) pthread_mutex_unlock(mu);
}

static void remove_store_dir(const char *dir);

/* The options a store's training runs with now: the table's, with its
 * eviction only while a writer holds it. */
static int configure(ekopen *e, const embkv_train_options *o)
{
    embkv_train_options t = *o;
    if (!e || e->writers == 0) t.ttl_ms = t.ttl_steps = t.max_rows = 0;
    return embkv_train_configure(e ? e->s : NULL, &t);
}

int ekreg_train_configure(embkv_store *s, const embkv_train_options *o, int writer)
{
    pthread_mutex_lock(&ek_mu);
    ekopen *e;
    for (e = ek_open_list; e && e->s != s; e = e->next) {}
    if (e && writer) e->writers++;
    int rc = e ? configure(e, o) : embkv_train_configure(s, o);
    if (rc != EMBKV_OK && e && writer) e->writers--;
    pthread_mutex_unlock(&ek_mu);
    return rc;
}

void ekreg_train_leave(embkv_store *s, const embkv_train_options *o)
{
    pthread_mutex_lock(&ek_mu);
    ekopen *e;
    for (e = ek_open_list; e && e->s != s; e = e->next) {}
    if (e && e->writers > 0 && --e->writers == 0 && e->refs > 1 && configure(e, o) != EMBKV_OK)
        sqlite3_log(SQLITE_WARNING, "embkv: stopping a store's eviction: %s", embkv_errmsg());
    pthread_mutex_unlock(&ek_mu);
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
            for (ekseq *q = e->seqs, *qn; q; q = qn) {
                qn = q->next;
                free(q);
            }
            if (e->discard && e->pid == getpid()) remove_dir = e->dir;
            else free(e->dir);
            pthread_mutex_destroy(&e->commit_mu);
            free(e);
        }
        break;
    }
    if (embkv_close(s) != EMBKV_OK) /* it syncs; nobody to return an error to */
        sqlite3_log(SQLITE_WARNING, "embkv: closing a store: %s", embkv_errmsg());
    if (remove_dir) {
        remove_store_dir(remove_dir);
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
    if (nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) == 0) return 0;
    /* Nobody to return an error to (COMMIT has happened, or a connection
     * is closing): SQLite's error log gets it. */
    sqlite3_log(SQLITE_WARNING, "embkv: cannot remove directory %s: %s", dir, strerror(errno));
    return -1;
}

/* A dropped store's directory: embkv_destroy, which also removes its SSD
 * log when that lies outside the directory (ssd_path); the whole tree when
 * it refuses (a store still open here at exit, files it does not know),
 * but for a store another process (or another copy of embkv in this one)
 * has open (to read: readers take no lock), which stays, its table gone. */
static void remove_store_dir(const char *dir)
{
    int rc = embkv_destroy(dir);
    if (rc != EMBKV_OK && !(rc == EMBKV_LOCKED && (strstr(embkv_errmsg(), "another process") ||
                                                   strstr(embkv_errmsg(), "another copy of embkv"))))
        ek_remove_tree(dir);
}

void ekreg_discard(const char *dir)
{
    char canon[PATH_MAX];
    if (!realpath(dir, canon)) return; /* already gone */
    pthread_mutex_lock(&ek_mu);
    ekopen *e;
    for (e = ek_open_list; e && strcmp(e->dir, canon) != 0; e = e->next) {}
    if (e) e->discard = 1;
    else remove_store_dir(canon);
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
    pid_t pid;      /* the process that made it */
    int ownerfd;    /* its flock'ed owner mark (leftovers.c), or -1 */
} ektmp;

static void tmp_free(ektmp *t)
{
    if (t->ownerfd >= 0) close(t->ownerfd);
    free(t);
}

static ektmp *ek_tmp_list;

/* A process that exits without closing its connections (the shell after an
 * error, exit() from a script) would leave its temporary stores behind.  A
 * forked child exiting must not take its parent's. */
static void remove_tmpdirs_at_exit(void)
{
    pthread_mutex_lock(&ek_mu);
    for (ektmp *t = ek_tmp_list; t; t = t->next)
        if (t->pid == getpid()) remove_store_dir(t->path);
    pthread_mutex_unlock(&ek_mu);
}

static pthread_once_t exit_hook_once = PTHREAD_ONCE_INIT;
static void add_exit_hook(void)
{
    if (atexit(remove_tmpdirs_at_exit) != 0)
        sqlite3_log(SQLITE_WARNING, "embkv: cannot register the removal of temporary stores at exit");
}

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
    pthread_once(&exit_hook_once, add_exit_hook);
    const char *base = getenv("TMPDIR");
    if (!base || !*base) base = "/tmp";
    ekleft_sweep_tmp(base);
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
    t->pid = getpid();
    t->ownerfd = ekleft_tmp_claim(tmpl);
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
            if (t->pid == getpid()) path = t->path;
            else free(t->path);
            tmp_free(t);
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
        c->pid = (long)getpid();
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

/* What a connection holds (binding.h says who else frees it). */
void ekconn_pend_clear(ekconn *c)
{
    for (int i = 0; i < c->npend; i++) free(c->pend[i].dir);
    c->npend = 0;
    c->pnsp = 0;
}

void ekreg_free_wbuf(ekwbuf *wb)
{
    /* (A COMMIT's journal ends with its xCommit or xRollback: a slot
     * still held here belongs to a connection closed inside one.) */
    if (wb->jfd >= 0) close(wb->jfd);
    if (wb->jslot >= 0 && wb->store) ekreg_journal_drop(wb->store, wb->jslot);
    ektxn_free(wb->txn);
    if (wb->store) ekreg_close(wb->store);
    sqlite3_free(wb->dir);
    sqlite3_free(wb);
}

void ekconn_free_wbufs(ekconn *c)
{
    while (c->wbufs) {
        ekwbuf *wb = c->wbufs;
        c->wbufs = wb->next;
        ekreg_free_wbuf(wb);
    }
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
                if (gone && t->pid == getpid()) gone[ngone++] = t->path;
                else free(t->path);
                tmp_free(t);
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
    ekconn_pend_clear(c);
    ekconn_free_wbufs(c);
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

ekconn *ekconn_of(sqlite3 *db)
{
    pthread_mutex_lock(&ek_mu);
    ekconn *c;
    for (c = ek_conn_list; c && c->db != db; c = c->next) {}
    pthread_mutex_unlock(&ek_mu);
    return c;
}

