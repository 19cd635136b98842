/*
 * dirusers.c - which tables use a store directory.
 *
 * Several tables, in one database or in several, may use one store: the
 * table whose CREATE made the directory, and tables whose path named it
 * afterwards (they attach).  The directory may only go with the last of
 * them, and the binding cannot see the tables of other databases, so the
 * store directory itself lists them: app-sqlite-tables, one stable table
 * id per line (the engine leaves "app-" files alone).  A store made by a
 * CREATE gets the list; a table attaching to a store that has none (made
 * through the C API, say) is not listed and never removes the store.
 *
 * The list is rewritten whole (a temporary file renamed over it), so a
 * crash leaves the old list or the new one.  A crash between the commit of
 * a DROP and the update of the list leaves a stale id: the store then
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
#include <unistd.h>

#define USERS_FILE EMBKV_APP_FILE_PREFIX "sqlite-tables"
#define TID_LEN 16

static pthread_mutex_t users_mu = PTHREAD_MUTEX_INITIALIZER;

/* The ids listed in dir (each TID_LEN hex digits): the count, or -1 when
 * there is no list (or nothing in it is an id: damaged, it cannot say that
 * the store is unused), or -2 (errno set) when it cannot be read. */
static int read_users(const char *dir, char (*ids)[TID_LEN + 1], int cap)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, USERS_FILE) >= (int)sizeof path) {
        errno = ENAMETOOLONG;
        return -2;
    }
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? -1 : -2;
    int n = 0;
    char line[64];
    while (fgets(line, sizeof line, f)) {
        size_t len = strcspn(line, "\n");
        if (len != TID_LEN || strspn(line, "0123456789abcdef") != TID_LEN) continue;
        if (n == cap) {
            fclose(f);
            errno = EFBIG;
            return -2;
        }
        memcpy(ids[n], line, TID_LEN);
        ids[n][TID_LEN] = 0;
        n++;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        errno = EIO;
        return -2;
    }
    return n ? n : -1;
}

/* Replaces the list with ids[0..n).  0 or -1 (errno set). */
static int write_users(const char *dir, char (*ids)[TID_LEN + 1], int n)
{
    char path[4096], tmp[4096];
    if (snprintf(path, sizeof path, "%s/%s", dir, USERS_FILE) >= (int)sizeof path ||
        snprintf(tmp, sizeof tmp, "%s/%s.new", dir, USERS_FILE) >= (int)sizeof tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    int ok = 1;
    for (int i = 0; i < n && ok; i++) {
        char line[TID_LEN + 1];
        memcpy(line, ids[i], TID_LEN);
        line[TID_LEN] = '\n';
        ok = write(fd, line, sizeof line) == (ssize_t)sizeof line;
    }
    if (ok) ok = fsync(fd) == 0;
    int saved = errno;
    if (close(fd) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (ok && rename(tmp, path) == 0) return 0;
    if (ok) saved = errno;
    unlink(tmp);
    errno = saved;
    return -1;
}

/* Generous: one store shared by more tables than this is not a use case,
 * and the limit is reported, not silently exceeded. */
#define MAX_USERS 4096

int ekusers_add(const char *dir, const char *tid, int *made, int *listed, char **err)
{
    *listed = 0;
    char(*ids)[TID_LEN + 1] = malloc(sizeof *ids * MAX_USERS);
    if (!ids) return SQLITE_NOMEM;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, ids, MAX_USERS - 1);
    if (*made && n > 0) *made = 0;  /* another CREATE got there first: join its list */
    else if (*made) n = 0;
    int rc = SQLITE_OK;
    if (n == -1) {
        /* Attaching to a store no CREATE made: it stays the maker's. */
    } else if (n < 0) {
        rc = SQLITE_ERROR;
        *err = sqlite3_mprintf("cannot read the list of tables using the store in %s/%s: %s", dir, USERS_FILE,
                               errno == EFBIG ? "too many tables" : strerror(errno));
    } else {
        snprintf(ids[n], sizeof ids[n], "%s", tid);
        if (write_users(dir, ids, n + 1) != 0) {
            rc = SQLITE_ERROR;
            *err = sqlite3_mprintf("cannot record the table in %s/%s: %s", dir, USERS_FILE, strerror(errno));
        } else {
            *listed = 1;
        }
    }
    pthread_mutex_unlock(&users_mu);
    free(ids);
    return rc;
}

int ekusers_remove(const char *dir, const char *tid)
{
    char(*ids)[TID_LEN + 1] = malloc(sizeof *ids * MAX_USERS);
    if (!ids) return -2;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, ids, MAX_USERS);
    if (n >= 0) {
        int w = 0;
        for (int i = 0; i < n; i++)
            if (strcmp(ids[i], tid) != 0) memcpy(ids[w++], ids[i], sizeof ids[i]);
        if (w != n && write_users(dir, ids, w) != 0) {
            sqlite3_log(SQLITE_WARNING, "embkv: cannot update %s/%s: %s", dir, USERS_FILE, strerror(errno));
            w = -2;
        }
        n = w;
    }
    pthread_mutex_unlock(&users_mu);
    free(ids);
    return n;
}

int ekusers_none_but(const char *dir, const char *tid)
{
    char(*ids)[TID_LEN + 1] = malloc(sizeof *ids * MAX_USERS);
    if (!ids) return 0;
    pthread_mutex_lock(&users_mu);
    int n = read_users(dir, ids, MAX_USERS);
    pthread_mutex_unlock(&users_mu);
    int only = n == -1;
    if (n > 0) {
        only = 1;
        for (int i = 0; i < n; i++) only &= strcmp(ids[i], tid) == 0;
    }
    free(ids);
    return only;
}
