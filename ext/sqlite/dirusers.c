/*
 * dirusers.c - which tables, of which database files, use a store directory.
 *
 * Several tables, in one database file or in several, may use one store:
 * the table whose CREATE made the directory, and tables whose CREATE named
 * it afterwards (they attach).  The directory may only go with the last of
 * them, and the binding cannot see the tables of other database files, so
 * the store directory itself lists them: app-sqlite-tables (the engine
 * leaves "app-" files alone), one line per table and database file:
 *
 *     <table id: 16 hex digits> <device> <inode>     (of the database file)
 *     external                                        (a store no CREATE made)
 *
 * The list is also who may open the store (docs/sql.md, "Who may touch a
 * store"): a table connects to a store only when the list names its table
 * id, which only a CREATE puts there (U1).  A database file that merely
 * names a store in its schema (one made elsewhere, or crafted) is refused:
 * a schema cannot make an application read or write a store it names.
 *
 * The table id is kept in the database file, so a copy of the file (cp, a
 * restored backup, VACUUM INTO) carries it; the file identity (device and
 * inode) tells the copy from the original.  A copy is the same table in
 * another file: where the schema is trusted it may open the store, and is
 * listed beside the original when it first does (U2), so that a DROP in
 * the copy takes only the copy off the list and the store stays while the
 * original names it (U3).  The id is no secret (it names default store
 * directories): with trusted_schema off only the listed file opens it.  An
 * entry is never dropped for a file that moved or vanished: a file the list
 * cannot see any more keeps the store, the safe way to be wrong.
 *
 *   U1. A table connects to a store only if the list names its table id
 *       (with any file identity); a CREATE that made the store starts the
 *       list, a CREATE that attaches adds to it (and marks a store no
 *       CREATE made "external", so that no DROP removes it).
 *   U2. A database file is listed (table id and its identity) before a
 *       DROP in it can take effect: at its CREATE, or at its first
 *       connection as a copy, once the table has opened, by a connection
 *       whose database is not read-only.  A copy opens the store only while
 *       the connection trusts its schema (PRAGMA trusted_schema, SQLite's
 *       switch for files from elsewhere): a file that only knows a table
 *       id cannot pass for a copy where files from elsewhere are opened.
 *       A line without an identity (lists written before identities were
 *       kept) is the first file that connects, and gets its identity.
 *   U3. A DROP removes only its own file's line; the directory goes when
 *       that leaves no line at all.
 *
 * The list is rewritten whole (a temporary file renamed over it), so a
 * crash leaves the old list or the new one.  A crash between the commit of
 * a DROP and the update of the list leaves a stale line: the store then
 * outlives its tables, which is the safe way to be wrong.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define USERS_FILE EMBKV_APP_FILE_PREFIX "sqlite-tables"
#define TID_LEN 16
#define EXTERNAL "external"

static pthread_mutex_t users_mu = PTHREAD_MUTEX_INITIALIZER;

/* Generous: one store shared by more tables than this is not a use case,
 * and the limit is reported, not silently exceeded. */
#define MAX_USERS 4096

typedef struct {
    ekuser *u;
    int n;
    int external;
} userlist;

void ekusers_self(sqlite3 *db, const char *zDb, const char *tid, ekuser *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->tid, sizeof out->tid, "%s", tid);
    out->known = 1;
    const char *file = sqlite3_db_filename(db, zDb);
    struct stat st;
    /* A database without a file (:memory:) is 0 0: it cannot be copied as
     * a file, and its table id is its own. */
    if (file && *file && stat(file, &st) == 0) {
        out->dev = (unsigned long long)st.st_dev;
        out->ino = (unsigned long long)st.st_ino;
    }
}

static int same_file(const ekuser *a, const ekuser *b)
{
    return a->known && b->known && a->dev == b->dev && a->ino == b->ino;
}

/* Reads dir's list into *l: 0, or -1 when there is none, -3 when nothing
 * in it is a line (damaged: it can say neither who may open the store nor
 * that the store is unused), or -2 (errno set) when it cannot be read. */
static int read_users(const char *dir, userlist *l)
{
    memset(l, 0, sizeof *l);
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, USERS_FILE) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -2;
    }
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? -1 : -2;
    l->u = malloc(sizeof *l->u * MAX_USERS);
    if (!l->u) {
        fclose(f);
        errno = ENOMEM;
        return -2;
    }
    char line[128];
    int junk = 0;
    while (fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\n");
        line[len] = 0;
        if (strcmp(line, EXTERNAL) == 0) {
            l->external = 1;
            continue;
        }
        if (len < TID_LEN || strspn(line, "0123456789abcdef") != TID_LEN) {
            junk |= len != 0;
            continue;
        }
        ekuser u;
        memset(&u, 0, sizeof u);
        memcpy(u.tid, line, TID_LEN);
        if (len == TID_LEN) {
            u.known = 0;
        } else {
            char end;
            if (sscanf(line + TID_LEN, " %llx %llx%c", &u.dev, &u.ino, &end) != 2) {
                junk = 1;
                continue;
            }
            u.known = 1;
        }
        if (l->n == MAX_USERS) {
            fclose(f);
            free(l->u);
            l->u = NULL;
            errno = EFBIG;
            return -2;
        }
        l->u[l->n++] = u;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(l->u);
        l->u = NULL;
        errno = EIO;
        return -2;
    }
    if (!l->n && !l->external) {
        /* An empty list is one whose last table went (as no list); one
         * with lines that are no table's is damaged. */
        free(l->u);
        l->u = NULL;
        return junk ? -3 : -1;
    }
    return 0;
}

/* Replaces dir's list with *l.  0 or -1 (errno set). */
static int write_users(const char *dir, const userlist *l)
{
    char path[4096], tmp[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, USERS_FILE) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/%s.new", dir, USERS_FILE) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(tmp, "we");
    if (!f) return -1;
    int ok = !l->external || fprintf(f, "%s\n", EXTERNAL) > 0;
    for (int i = 0; i < l->n && ok; i++)
        ok = l->u[i].known ? fprintf(f, "%s %llx %llx\n", l->u[i].tid, l->u[i].dev, l->u[i].ino) > 0
                           : fprintf(f, "%s\n", l->u[i].tid) > 0;
    if (ok) ok = fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (ok && rename(tmp, path) == 0) return 0;
    if (ok) saved = errno;
    unlink(tmp);
    errno = saved;
    return -1;
}

static int push_user(userlist *l, const ekuser *u)
{
    if (!l->u && !(l->u = malloc(sizeof *l->u * MAX_USERS))) {
        errno = ENOMEM;
        return -1;
    }
    if (l->n == MAX_USERS) {
        errno = EFBIG;
        return -1;
    }
    l->u[l->n++] = *u;
    return 0;
}

int ekusers_add(const char *dir, const ekuser *self, int *made, int *listed, char **err)
{
    *listed = 0;
    userlist l;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, &l);
    if (*made && n == 0) *made = 0;  /* another CREATE got there first: join its list */
    else if (*made) {
        free(l.u);
        memset(&l, 0, sizeof l);
        n = 0;
    } else if (n == -1 || n == -3) {
        /* Attaching to a store no CREATE made (the C API, a backup), or
         * whose list is damaged: listed so that it opens again (U1), never
         * removed by a DROP (U3). */
        memset(&l, 0, sizeof l);
        l.external = 1;
        n = 0;
    }
    int rc = SQLITE_OK;
    if (n < 0) {
        rc = SQLITE_ERROR;
        *err = sqlite3_mprintf("cannot read the list of tables using the store in %s/%s: %s", dir, USERS_FILE,
                               errno == EFBIG ? "too many tables" : strerror(errno));
    } else if (push_user(&l, self) != 0 || write_users(dir, &l) != 0) {
        rc = SQLITE_ERROR;
        *err = sqlite3_mprintf("cannot record the table in %s/%s: %s", dir, USERS_FILE,
                               errno == EFBIG ? "too many tables" : strerror(errno));
    } else {
        *listed = 1;
    }
    pthread_mutex_unlock(&users_mu);
    free(l.u);
    return rc;
}

int ekusers_admit(const char *dir, const ekuser *self, const char *table, unsigned dim, const char *path, int readonly,
                  int trust_copies, int list_copy, char **err)
{
    userlist l;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, &l);
    int rc = SQLITE_OK, mine = -1, same = 0;
    for (int i = 0; n == 0 && i < l.n && !same; i++) {
        if (strcmp(l.u[i].tid, self->tid) != 0) continue;
        if (mine < 0 || !l.u[i].known) mine = i;
        /* (a line without an identity is the first file that connects) */
        same = same_file(&l.u[i], self) || !l.u[i].known;
    }
    /* (A connection that may not write can do neither: it is told where
     * to, and how to read meanwhile when the schema is to be trusted.) */
    char *attach = sqlite3_mprintf("%sDROP TABLE \"%w\" (the store stays) and attach it: CREATE VIRTUAL TABLE "
                                   "\"%w\" USING embkv(dim=%u, path='%q')%s",
                                   readonly ? "from a connection that may write, " : "", table, table, dim, path,
                                   readonly && !trust_copies ? "; or, if you trust this database file, read it on a "
                                                               "connection that sets PRAGMA trusted_schema=ON before "
                                                               "the table's first use"
                                                             : "");
    if (!attach) {
        rc = SQLITE_NOMEM;
    } else if (n == -2) {
        rc = SQLITE_ERROR;
        *err = sqlite3_mprintf("cannot read the list of tables using the store, %s/%s: %s", dir, USERS_FILE,
                               errno == EFBIG ? "too many tables" : strerror(errno));
    } else if (mine < 0) {
        rc = SQLITE_ERROR;
        char lp[4096];
        struct stat st;
        int empty_file = n == -1 && snprintf(lp, sizeof lp, "%s/%s", dir, USERS_FILE) < (int)sizeof lp &&
                         stat(lp, &st) == 0;
        *err = sqlite3_mprintf(
            "the store in %s does not list this table among its users (%s): a database file cannot open a store "
            "merely by naming it in its schema; if this database should use the store, %s",
            dir, empty_file ? "app-sqlite-tables names no table: its tables were dropped, or it was emptied"
                 : n == -1 ? "it has no list, app-sqlite-tables: a store made through the C API or embkv_backup, or "
                             "whose list was deleted"
                 : n == -3 ? "app-sqlite-tables is damaged: no line of it names a table"
                           : "app-sqlite-tables does not name its table id",
            attach);
    } else if (!same && !trust_copies) {
        /* U2: a file that names a listed table id but is not the file
         * listed: a copy, or a file crafted by someone who read the id.
         * SQLite's rule for files from elsewhere decides. */
        rc = SQLITE_ERROR;
        *err = sqlite3_mprintf("the store in %s lists this table for another database file (this one is a copy, "
                               "or names the table's id): with PRAGMA trusted_schema=OFF a copy opens the store only "
                               "once attached: %s", dir, attach);
    } else if (list_copy && (!same || !l.u[mine].known)) {
        /* U2: a line without an identity becomes this file's; another
         * file's line stays, and this copy is listed beside it. */
        int ok = l.u[mine].known ? push_user(&l, self) == 0 : (l.u[mine] = *self, 1);
        if (!ok || write_users(dir, &l) != 0)
            sqlite3_log(SQLITE_WARNING, "embkv: cannot list a copy of a database file in %s/%s: %s (a DROP in "
                        "the original may then remove the store)", dir, USERS_FILE, strerror(errno));
    }
    sqlite3_free(attach);
    pthread_mutex_unlock(&users_mu);
    free(l.u);
    return rc;
}

/* U3: takes self's line off l (or the line without an identity that
 * stands for it); another file's line for the same table stays.  Whether
 * one went. */
static int drop_line(userlist *l, const ekuser *self)
{
    int w = 0, gone = 0;
    for (int i = 0; i < l->n; i++) {
        int match = !gone && strcmp(l->u[i].tid, self->tid) == 0 && (same_file(&l->u[i], self) || !l->u[i].known);
        if (match) gone = 1;
        else l->u[w++] = l->u[i];
    }
    l->n = w;
    return gone;
}

int ekusers_left_after(const char *dir, const ekuser *const *gone, int ngone)
{
    userlist l;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, &l);
    pthread_mutex_unlock(&users_mu);
    if (n == 0) {
        for (int i = 0; i < ngone; i++) drop_line(&l, gone[i]);
        n = l.n + l.external;
    } else if (n == -3) {
        n = -1;
    }
    free(l.u);
    return n;
}

int ekusers_remove(const char *dir, const ekuser *self)
{
    userlist l;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, &l);
    if (n == 0) {
        int gone = drop_line(&l, self);
        if (gone && write_users(dir, &l) != 0) {
            sqlite3_log(SQLITE_WARNING, "embkv: cannot update %s/%s: %s", dir, USERS_FILE, strerror(errno));
            n = -2;
        } else {
            n = l.n + l.external;
        }
    } else if (n == -3) {
        n = -1;
    }
    pthread_mutex_unlock(&users_mu);
    free(l.u);
    return n;
}

int ekusers_none_but(const char *dir, const char *tid)
{
    userlist l;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, &l);
    pthread_mutex_unlock(&users_mu);
    int only = n == -1;
    if (n == 0) {
        only = !l.external;
        for (int i = 0; i < l.n; i++) only &= strcmp(l.u[i].tid, tid) == 0;
    }
    free(l.u);
    return only;
}
