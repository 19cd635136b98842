/*
 * leftovers.c - removing what processes killed mid-work left behind.
 *
 * Two kinds of directories outlive a process killed at the wrong moment:
 *
 *  - The default store directory of a CREATE VIRTUAL TABLE that never
 *    committed (<database file>-<id>.embkv, possibly with a pool of
 *    pool_size bytes).  The id is random, so a retry makes another one and
 *    nothing would ever look at the old one.  The next CREATE of a
 *    default-path table in the same database removes such directories: it
 *    holds the database's write lock, so no other CREATE on that database
 *    is between making its directory and committing; a directory whose id
 *    no table of the schema carries, that lists no other table as a user
 *    (dirusers.c) and whose store no process has open (embkv_destroy takes
 *    its lock) belongs to nobody.  The sweep gives up at the first thing
 *    it cannot read: an embkv table whose shadow table is unreadable might
 *    own any of them, and keeping a leftover is the safe way to be wrong.
 *
 *  - Temporary directories of :memory: and temporary databases
 *    ($TMPDIR/embkv-<id>-XXXXXX), normally removed by the last connection
 *    or at exit.  Each holds app-sqlite-owner, flock'ed by the process that
 *    made it for as long as it lives (the kernel drops the lock when the
 *    process dies, however it dies).  The first temporary table a process
 *    makes removes those whose lock it can take.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define OWNER_FILE EMBKV_APP_FILE_PREFIX "sqlite-owner"
#define TID_LEN 16

static int is_tid(const char *s, size_t n)
{
    if (n != TID_LEN) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f'))) return 0;
    return 1;
}

/* ------------------------------------------------------------------------
 * Default directories of uncommitted CREATEs
 */

/* The ids of the embkv tables of schema zDb but `creating` (the table whose
 * xCreate runs: its schema row is written, its shadow table not yet), or -1
 * if one cannot be read.  A table counts as embkv's when its CREATE
 * mentions embkv anywhere: a false match only makes the sweep give up. */
static int schema_tids(sqlite3 *db, const char *zDb, const char *creating, char (**out)[TID_LEN + 1])
{
    *out = NULL;
    char *sql = sqlite3_mprintf("SELECT name FROM \"%w\".sqlite_schema WHERE type = 'table' AND "
                                "sql LIKE 'CREATE VIRTUAL TABLE%%' AND sql LIKE '%%embkv%%' AND name <> %Q",
                                zDb, creating);
    if (!sql) return -1;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    sqlite3_free(sql);
    int n = 0, cap = 0, ok = rc == SQLITE_OK;
    char(*ids)[TID_LEN + 1] = NULL;
    while (ok && (rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *name = (const char *)sqlite3_column_text(st, 0);
        char *q = name ? sqlite3_mprintf("SELECT v FROM \"%w\".\"%w_config\" WHERE k = 'id'", zDb, name) : NULL;
        sqlite3_stmt *qs = NULL;
        ok = q && sqlite3_prepare_v2(db, q, -1, &qs, NULL) == SQLITE_OK && sqlite3_step(qs) == SQLITE_ROW;
        const char *t = ok ? (const char *)sqlite3_column_text(qs, 0) : NULL;
        ok = ok && t && is_tid(t, strlen(t));
        if (ok && n == cap) {
            cap = cap ? 2 * cap : 16;
            void *m = realloc(ids, (size_t)cap * sizeof *ids);
            if (m) ids = m;
            else ok = 0;
        }
        if (ok) memcpy(ids[n++], t, TID_LEN + 1);
        sqlite3_finalize(qs);
        sqlite3_free(q);
    }
    if (ok && rc != SQLITE_DONE) ok = 0;
    sqlite3_finalize(st);
    if (!ok) {
        free(ids);
        return -1;
    }
    *out = ids;
    return n;
}

/* A removal this connection's open transaction may still cancel (a DROP
 * not yet committed): that directory is not a leftover. */
static int pending_here(ekconn *c, const char *canon)
{
    char p[PATH_MAX];
    for (int i = 0; i < c->npend; i++)
        if (realpath(c->pend[i].dir, p) && strcmp(p, canon) == 0) return 1;
    return 0;
}

void ekleft_sweep_db(ekconn *c, const char *zDb, const char *creating, const char *dbfile)
{
    const char *slash = strrchr(dbfile, '/');
    char *parent = slash ? sqlite3_mprintf("%.*s", (int)(slash - dbfile), dbfile) : sqlite3_mprintf(".");
    const char *base = slash ? slash + 1 : dbfile;
    size_t blen = strlen(base);
    char(*ids)[TID_LEN + 1] = NULL;
    int n = parent ? schema_tids(c->db, zDb, creating, &ids) : -1;
    DIR *d = n >= 0 ? opendir(*parent ? parent : "/") : NULL;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        /* <base>-<16 hex>.embkv */
        size_t len = strlen(e->d_name);
        if (len != blen + 1 + TID_LEN + 6 || strncmp(e->d_name, base, blen) != 0 || e->d_name[blen] != '-' ||
            !is_tid(e->d_name + blen + 1, TID_LEN) || strcmp(e->d_name + blen + 1 + TID_LEN, ".embkv") != 0)
            continue;
        char tid[TID_LEN + 1];
        memcpy(tid, e->d_name + blen + 1, TID_LEN);
        tid[TID_LEN] = 0;
        int used = 0;
        for (int i = 0; i < n && !used; i++) used = strcmp(ids[i], tid) == 0;
        if (used) continue;
        char path[PATH_MAX], canon[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", parent, e->d_name);
        if (!realpath(path, canon) || pending_here(c, canon) || !ekusers_none_but(canon, tid)) continue;
        /* Open elsewhere or holding foreign files: left alone (and said). */
        int rc = embkv_destroy(canon);
        if (rc == EMBKV_OK)
            sqlite3_log(SQLITE_NOTICE, "embkv: removed %s, left by a CREATE VIRTUAL TABLE that never committed",
                        canon);
    }
    if (d) closedir(d);
    free(ids);
    sqlite3_free(parent);
}

/* ------------------------------------------------------------------------
 * Temporary directories of dead processes
 */

int ekleft_tmp_claim(const char *dir)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, OWNER_FILE) >= (int)sizeof path) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static pthread_once_t tmp_swept = PTHREAD_ONCE_INIT;
static const char *sweep_base;

static void sweep_tmp_once(void)
{
    DIR *d = opendir(sweep_base);
    if (!d) return;
    struct dirent *e;
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        /* embkv-<16 hex>-XXXXXX (mkdtemp's six characters) */
        size_t len = strlen(e->d_name);
        if (len != 6 + TID_LEN + 1 + 6 || strncmp(e->d_name, "embkv-", 6) != 0 || !is_tid(e->d_name + 6, TID_LEN) ||
            e->d_name[6 + TID_LEN] != '-')
            continue;
        char dir[PATH_MAX], owner[PATH_MAX];
        if (snprintf(dir, sizeof dir, "%s/%s", sweep_base, e->d_name) >= (int)sizeof dir ||
            snprintf(owner, sizeof owner, "%s/%s", dir, OWNER_FILE) >= (int)sizeof owner)
            continue;
        struct stat st;
        if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
        int fd = open(owner, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0) {
            /* No owner file: a process killed between mkdtemp and claiming
             * it (a moment), or one of an older version.  Old enough, and
             * with its store closed, it is nobody's. */
            if (errno == ENOENT && now - st.st_mtime > 600 && embkv_destroy(dir) == EMBKV_OK)
                sqlite3_log(SQLITE_NOTICE, "embkv: removed %s, left by a process that is gone", dir);
            continue;
        }
        /* Its process is gone (we hold its mark while removing); the
         * store's own lock still guards a store open somewhere. */
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && embkv_destroy(dir) == EMBKV_OK)
            sqlite3_log(SQLITE_NOTICE, "embkv: removed %s, left by a process that is gone", dir);
        close(fd);
    }
    closedir(d);
}

void ekleft_sweep_tmp(const char *base)
{
    sweep_base = base;
    pthread_once(&tmp_swept, sweep_tmp_once);
}
