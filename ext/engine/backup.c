/*
 * backup.c - online backup: a copy of a store as of one checkpoint, taken
 * while training and SQL writes go on, that opens as a store of its own.
 *
 * Why a logical copy and not the files: the pool is a live mapping that
 * writers change in place (bucket slots, free records, the root), and the
 * log's segments are compacted under the tier's thread; bytes copied from
 * them while work goes on are no state the store was ever in.  So a backup
 * is a new store built row by row from a snapshot:
 *
 *   begin   a snapshot is listed, then a sync runs and fixes the snapshot
 *           at its epoch switch (sync_fixing): the snapshot sees exactly
 *           the checkpoint the sync makes durable, every group entirely or
 *           not at all, the DRAM cache's dirty rows and the SSD log's rows
 *           included.  A new store with the source's geometry (dim, state
 *           floats, pool and SSD sizes) is created in a temporary directory
 *           beside the target ("<dir>.embkv-tmp-XXXXXX", the name cut
 *           to fit NAME_MAX).
 *   step    a cursor over the index (embkv_scan_ids) lists ids a chunk at
 *           a time; each chunk is read as of the snapshot (embkv_get_rows_at:
 *           vector, optimizer state and clock of one version, verified) and
 *           put into the copy with its clock (embkv_put_clock).  Rows moved
 *           between buckets would be missed or seen twice, so a move pin
 *           holds the hot-set moves off for the backup's life; an index
 *           resize, which must not wait for a backup, restarts the cursor
 *           (a row copied twice is the same row).  Rows the snapshot holds
 *           that were deleted or changed since are listed by the version log
 *           (embkv_snapshot_changed_ids) and copied last.
 *   finish  the copy is synced and closed, renamed to the target (never
 *           over a non-empty directory) and the parent directory fsync'ed:
 *           a crash leaves the target complete or absent, and at most a
 *           temporary directory, which the next backup to the same target
 *           removes (embkv_destroy: only when no process has it open).
 *
 * Memory: one chunk of rows (at most 4 MiB, at least 64 rows) and the ids
 * changed since the snapshot.  Pool space: the snapshot keeps the versions
 * it may read until finish, as any long-lived snapshot does.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "top.h"

#define BACKUP_CHUNK_BYTES (4u << 20)
#define BACKUP_CHUNK_MAX 1024
#define TMP_INFIX ".embkv-tmp-"

struct embkv_backup {
    embkv_store *s, *dst;       /* s: a reference of the backup's own (embkv_close of the caller's waits) */
    pthread_mutex_t step_mu;    /* one step at a time */
    embkv_snapshot *snap;
    char *dir, *abs, *tmp;      /* as given, resolved at begin, being built */
    uint64_t epoch, rows;       /* the checkpoint copied; rows in the copy */
    uint64_t pos;               /* index cursor */
    int phase;                  /* 0 the index, 1 changed ids, 2 done */
    int64_t *changed;
    size_t nchanged, changed_at;
    int failed;                 /* a step failed: finish discards */
    bool pinned;
    size_t cap;                 /* rows per chunk */
    int64_t *ids;
    float *vec, *state;
    embkv_rowinfo *info;
    uint8_t *found;
};

/* ------------------------------------------------------- the target */

/* Absolute form of dir whose last component may not exist yet: the
 * parent resolved (it must exist), the name appended. */
static int resolve_target(const char *dir, char *out, size_t len)
{
    char buf[PATH_MAX];
    size_t n = strlen(dir);
    if (n >= sizeof buf)
        return embkv__err(EMBKV_INVALID, "embkv_backup: directory name is longer than %d bytes", PATH_MAX - 1);
    memcpy(buf, dir, n + 1);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = 0;
    char *slash = strrchr(buf, '/');
    const char *name = slash ? slash + 1 : buf;
    char parent[PATH_MAX];
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else if (slash == buf)
        snprintf(parent, sizeof parent, "/");
    else {
        *slash = 0;
        snprintf(parent, sizeof parent, "%s", buf);
    }
    if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
        return embkv__err(EMBKV_INVALID, "embkv_backup: %s does not name a new directory", dir);
    char real[PATH_MAX];
    if (!realpath(parent, real))
        return embkv__err(EMBKV_INVALID, "embkv_backup: the directory that would hold %s: %s", dir, strerror(errno));
    if ((size_t)snprintf(out, len, "%s/%s", strcmp(real, "/") ? real : "", name) >= len)
        return embkv__err(EMBKV_INVALID, "embkv_backup: directory name %s is too long", dir);
    return EMBKV_OK;
}

static bool inside(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == 0);
}

/* Not inside the store, its SSD tier or another store (each would find a
 * foreign file or directory in its own); what: the caller, for messages. */
static int outside(embkv_store *s, const char *what, const char *name, const char *abs)
{
    char log[PATH_MAX];
    if (inside(abs, s->path))
        return embkv__err(EMBKV_INVALID, "%s: %s is inside the store's own directory %s", what, name, s->path);
    if (s->root->ssd_path[0]) {
        char *real = realpath(s->root->ssd_path, NULL);
        snprintf(log, sizeof log, "%s", real ? real : s->root->ssd_path);
        free(real);
        if (inside(abs, log))
            return embkv__err(EMBKV_INVALID, "%s: %s is inside the store's SSD tier %s", what, name, log);
    } else {
        snprintf(log, sizeof log, "%s/%s", s->path, LOG_DIR);
        if (inside(abs, log))
            return embkv__err(EMBKV_INVALID, "%s: %s is inside the store's SSD tier %s", what, name, log);
    }
    char up[PATH_MAX];
    if (path_below_file(abs, POOL_FILE, up, sizeof up))
        return embkv__err(EMBKV_INVALID, "%s: %s is inside the embkv store %s", what, name, up);
    return EMBKV_OK;
}

int embkv_path_outside(embkv_store *s, const char *path)
{
    if (!s || !path)
        return embkv__null_arg("embkv_path_outside", "s", (const void *)s, "path", (const void *)path, (char *)NULL);
    if (path[0] != '/')
        return embkv__err(EMBKV_INVALID, "embkv_path_outside: store %s: path %s is not absolute: give the absolute "
                          "path", s->path, path);
    return outside(s, "embkv", path, path);
}

/* The target: absent, or an empty directory; not inside the store or its
 * SSD tier (the store would find a foreign directory in its own). */
static int check_target(embkv_store *s, const char *dir, const char *abs)
{
    int rc = outside(s, "embkv_backup", dir, abs);
    if (rc != EMBKV_OK)
        return rc;
    struct stat st;
    if (lstat(abs, &st) != 0) {
        if (errno == ENOENT)
            return EMBKV_OK;
        return embkv__err(EMBKV_IO, "embkv_backup: %s: %s", dir, strerror(errno));
    }
    if (S_ISLNK(st.st_mode))
        return embkv__err(EMBKV_INVALID, "embkv_backup: %s is a symbolic link: name the directory itself", dir);
    if (!S_ISDIR(st.st_mode))
        return embkv__err(EMBKV_INVALID, "embkv_backup: %s exists and is not a directory", dir);
    DIR *d = opendir(abs);
    if (!d)
        return embkv__err(EMBKV_IO, "embkv_backup: %s: %s", dir, strerror(errno));
    struct dirent *e;
    const char *first = NULL;
    bool store = false;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (!first)
            first = e->d_name;
        store |= !strcmp(e->d_name, POOL_FILE);
    }
    rc = store ? embkv__err(EMBKV_INVALID, "embkv_backup: %s already holds an embkv store: a backup goes into a "
                                "new or empty directory", dir)
             : first ? embkv__err(EMBKV_INVALID, "embkv_backup: %s is not empty (it holds %s): a backup goes "
                                  "into a new or empty directory", dir, first)
                     : EMBKV_OK;
    closedir(d);
    return rc;
}

/* How much of the target's name its temporary directory's name keeps:
 * with TMP_INFIX and mkdtemp's six characters it must fit NAME_MAX (a
 * legal name of 239 bytes or more failed as too long).  Two targets whose
 * names agree that far share the prefix: harmless, the sweep below only
 * removes what no process has open. */
#define TMP_NAME_KEEP (NAME_MAX - (sizeof TMP_INFIX - 1) - 6)

/* Temporary directories a crashed backup to the same target left behind;
 * embkv_destroy leaves those still open in some process. */
static void sweep_leftovers(const char *abs)
{
    char parent[PATH_MAX], prefix[PATH_MAX];
    const char *slash = strrchr(abs, '/');
    size_t plen = (size_t)(slash - abs);
    snprintf(parent, sizeof parent, "%.*s", (int)(plen ? plen : 1), plen ? abs : "/");
    snprintf(prefix, sizeof prefix, "%.*s%s", (int)TMP_NAME_KEEP, slash + 1, TMP_INFIX);
    DIR *d = opendir(parent);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)))
            continue;
        char path[PATH_MAX];
        if ((size_t)snprintf(path, sizeof path, "%s/%s", plen ? parent : "", e->d_name) < sizeof path)
            (void)embkv_destroy(path);
    }
    closedir(d);
}

/* rename(2) into the target: over an empty directory (atomic), or where
 * nothing is (RENAME_NOREPLACE where the file system has it). */
static int place(const char *tmp, const char *abs, const char *dir)
{
    struct stat st;
    int r;
    if (lstat(abs, &st) == 0) {
        r = rename(tmp, abs);
    } else {
        r = renameat2(AT_FDCWD, tmp, AT_FDCWD, abs, RENAME_NOREPLACE);
        if (r != 0 && (errno == EINVAL || errno == ENOSYS))
            r = rename(tmp, abs);
    }
    if (r != 0)
        return embkv__err(errno == EEXIST || errno == ENOTEMPTY ? EMBKV_INVALID : EMBKV_IO,
                          "embkv_backup: cannot put the backup at %s: %s", dir,
                          errno == EEXIST || errno == ENOTEMPTY ? "something else was put there meanwhile"
                                                                : strerror(errno));
    char parent[PATH_MAX];
    const char *slash = strrchr(abs, '/');
    snprintf(parent, sizeof parent, "%.*s", slash == abs ? 1 : (int)(slash - abs), abs);
    int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return embkv__err(EMBKV_IO, "embkv_backup: fsync of the directory holding %s: %s", dir, strerror(e));
    }
    close(fd);
    return EMBKV_OK;
}

/* Bytes of the regular files under path (the backup's size). */
static uint64_t tree_bytes(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return 0;
    uint64_t total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char p[PATH_MAX];
        struct stat st;
        if ((size_t)snprintf(p, sizeof p, "%s/%s", path, e->d_name) >= sizeof p || lstat(p, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode))
            total += tree_bytes(p);
        else if (S_ISREG(st.st_mode))
            total += (uint64_t)st.st_size;
    }
    closedir(d);
    return total;
}

/* ------------------------------------------------------------ the API */

/* No row moves between buckets while the cursor runs: the hot-set moves
 * of this process wait (move_pin), or, in a reader process, the writer's
 * (a scan pin in the reader table, held in the thread that began the
 * backup: a reader's backup runs in one thread). */
static void backup_pin(embkv_store *s)
{
    if (s->reader)
        rd_pin(s);
    else
        move_pin(s);
}

static void backup_unpin(embkv_store *s)
{
    if (s->reader)
        (void)rd_unpin(s);
    else
        move_unpin(s);
}

static void backup_free(embkv_backup *b)
{
    if (b->pinned)
        backup_unpin(b->s);
    if (b->snap)
        embkv_snapshot_close(b->snap);
    if (b->dst)
        embkv_close(b->dst);
    if (b->s)
        (void)store_release(b->s);  /* (nobody to report to: the caller's own close reports) */
    pthread_mutex_destroy(&b->step_mu);
    if (b->tmp) {
        (void)embkv_destroy(b->tmp);
        rmdir(b->tmp);
    }
    free(b->dir);
    free(b->abs);
    free(b->tmp);
    free(b->changed);
    free(b->ids);
    free(b->vec);
    free(b->state);
    free(b->info);
    free(b->found);
    free(b);
}

int embkv_backup_begin(embkv_store *s, const char *dir, embkv_backup **out)
{
    if (!out)
        return embkv__err(EMBKV_INVALID, "embkv_backup_begin: out is NULL");
    *out = NULL;
    if (!s || !dir)
        return embkv__null_arg("embkv_backup_begin", "s", (const void *)s, "dir", (const void *)dir, (char *)NULL);
    if (!*dir)
        return embkv__err(EMBKV_INVALID, "embkv_backup_begin: store %s: dir is empty: name the directory of the copy",
                          s->path);
    FORK_REFUSE(s, "embkv_backup_begin");
    CALLBACK_REFUSE(s, "embkv_backup_begin");
    if (group_held(s))
        return embkv__err(EMBKV_BUSY, "store %s: a backup cannot begin inside a write group of the same thread",
                          s->path);
    char abs[PATH_MAX];
    int rc = resolve_target(dir, abs, sizeof abs);
    if (rc == EMBKV_OK)
        rc = check_target(s, dir, abs);
    if (rc != EMBKV_OK)
        return rc;
    embkv_backup *b = calloc(1, sizeof *b);
    size_t row_floats = (size_t)s->dim + s->state_floats;
    size_t cap = BACKUP_CHUNK_BYTES / (row_floats * 4 + 64);
    cap = cap < 64 ? 64 : cap > BACKUP_CHUNK_MAX ? BACKUP_CHUNK_MAX : cap;
    if (b) {
        pthread_mutex_init(&b->step_mu, NULL);
        b->cap = cap;
        b->dir = strdup(dir);
        b->abs = strdup(abs);
        b->tmp = malloc(strlen(abs) + sizeof TMP_INFIX + 7);
        b->ids = malloc(cap * sizeof *b->ids);
        b->vec = malloc(cap * s->dim * sizeof(float));
        b->state = s->state_floats ? malloc(cap * s->state_floats * sizeof(float)) : NULL;
        b->info = malloc(cap * sizeof *b->info);
        b->found = malloc(cap);
    }
    /* The backup's own reference: a close of the caller's while it runs
     * leaves the store open until the backup ends. */
    if (b && embkv_open(s->path, NULL, s->reader ? EMBKV_OPEN_READONLY : 0, &b->s) != EMBKV_OK)
        b->s = NULL;
    if (!b || !b->s || !b->dir || !b->abs || !b->tmp || !b->ids || !b->vec || (s->state_floats && !b->state) || !b->info ||
        !b->found) {
        if (b) {
            free(b->tmp);
            b->tmp = NULL;
            backup_free(b);
        }
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for a backup", s->path);
    }
    sweep_leftovers(abs);
    {
        const char *name = strrchr(abs, '/') + 1;
        size_t keep = strlen(name) < TMP_NAME_KEEP ? strlen(name) : TMP_NAME_KEEP;
        sprintf(b->tmp, "%.*s%sXXXXXX", (int)(name - abs + keep), abs, TMP_INFIX);
    }
    /* (mkdtemp's mode is 0700; the copy gets a store's usual one) */
    bool made = mkdtemp(b->tmp) != NULL;
    if (!made || chmod(b->tmp, 0755) != 0) {
        int e = errno;
        if (made)
            rmdir(b->tmp);
        free(b->tmp);
        b->tmp = NULL;
        backup_free(b);
        return embkv__err(EMBKV_IO, "embkv_backup: cannot create a directory beside %s: %s", dir, strerror(e));
    }

    /* The checkpoint and the snapshot of it, in one epoch switch; in a
     * reader process, the writer's last checkpoint (readonly.c). */
    if (s->reader) {
        rc = embkv_snapshot_open(s, &b->snap);
        if (rc == EMBKV_OK)
            b->epoch = snap_as_of(b->snap);
    } else if ((rc = snap_register(s, &b->snap)) == EMBKV_OK) {
        rc = sync_fixing(s, b->snap, &b->epoch);
        if (rc != EMBKV_OK) {
            embkv_snapshot_close(b->snap);
            b->snap = NULL;
        }
    }
    embkv_stats st;
    if (rc == EMBKV_OK)
        rc = embkv_stats_get(s, &st);
    if (rc == EMBKV_OK) {
        embkv_options o = {.dim = s->dim,
                           .state_floats = s->state_floats,
                           .dtype = s->dtype,
                           .expected_rows = st.rows ? st.rows : 1,
                           .pool_size = st.pool_bytes,
                           .max_load = s->max_load,
                           .ssd_size = st.ssd_size};
        rc = embkv_open(b->tmp, &o, EMBKV_OPEN_CREATE, &b->dst);
        if (rc != EMBKV_OK)
            rc = embkv__err(rc, "embkv_backup: creating the copy beside %s: %s", dir, embkv_errmsg());
    }
    if (rc == EMBKV_OK) {
        /* A copy is the same store: it takes the store's id (what the
         * application's files beside it, copied with it, may name). */
        store_root *r = b->dst->root;
        r->store_id = s->store_id;
        r->store_id_check = s->store_id ? s->store_id ^ STORE_ID_CHECK_KEY : 0;
        pmemobj_persist(b->dst->pop, &r->store_id, 2 * sizeof r->store_id);
        b->dst->store_id = s->store_id;
    }
    if (rc != EMBKV_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", embkv_errmsg());
        backup_free(b);
        return embkv__err(rc, "%s", msg);
    }
    backup_pin(s);
    b->pinned = true;
    *out = b;
    return EMBKV_OK;
}

static int step_locked(embkv_backup *b, size_t rows, int *done);

/* Copy n ids (those the snapshot holds) into the copy. */
static int copy_ids(embkv_backup *b, const int64_t *ids, size_t n)
{
    embkv_store *s = b->s;
    int rc = embkv_get_rows_at(s, b->snap, ids, n, b->vec, b->state, b->info, b->found, NULL);
    if (rc != EMBKV_OK)
        return rc;  /* (its message names the store and the id) */
    if ((rc = embkv_group_begin(b->dst)) != EMBKV_OK)
        return rc;
    for (size_t i = 0; i < n && rc == EMBKV_OK; i++) {
        if (!b->found[i])
            continue;
        /* (a store from before clocks stopped at CLOCK_MAX may hold one past it) */
        uint64_t clock = b->info[i].clock < CLOCK_MAX ? b->info[i].clock : CLOCK_MAX;
        rc = embkv_put_clock(b->dst, ids[i], b->vec + i * s->dim, b->state ? b->state + i * s->state_floats : NULL,
                             clock);
        if (rc != EMBKV_OK)
            rc = embkv__err(rc, "embkv_backup of store %s: writing id %lld into the copy: %s", s->path,
                            (long long)ids[i], embkv_errmsg());
    }
    embkv_group_end(b->dst);
    return rc;
}

int embkv_backup_step(embkv_backup *b, size_t rows, int *done)
{
    if (done)
        *done = 0;
    if (!b)
        return embkv__err(EMBKV_INVALID, "embkv_backup_step: backup is NULL");
    if (pthread_mutex_trylock(&b->step_mu) != 0)
        return embkv__err(EMBKV_BUSY, "embkv_backup_step: another step of this backup is running");
    int rc = step_locked(b, rows, done);
    pthread_mutex_unlock(&b->step_mu);
    return rc;
}

static int step_locked(embkv_backup *b, size_t rows, int *done)
{
    if (b->failed)
        return embkv__err(EMBKV_INVALID, "embkv_backup_step: an earlier step of this backup failed");
    size_t left = rows ? rows : SIZE_MAX;
    int rc = EMBKV_OK;
    while (rc == EMBKV_OK && b->phase < 2 && left > 0) {
        size_t want = left < b->cap ? left : b->cap, n = 0;
        const int64_t *ids = b->ids;
        if (b->phase == 0) {
            rc = embkv_scan_ids(b->s, &b->pos, b->ids, want < 64 ? 64 : want, &n);
            /* (a reader process's snapshot revoked, or overtaken by the
             * writer's reopening: the backup fails, saying to run again) */
            if (rc == EMBKV_BUSY && b->s->reader && !rd_valid(b->s))
                rc = rd_invalid(b->s);
            else if (rc == EMBKV_BUSY) {
                /* Resized: again from the start, the copy synced so that
                 * the versions the repeats replace are freed. */
                b->pos = 0;
                rc = embkv_sync(b->dst);
                continue;
            }
            if (rc == EMBKV_OK && n == 0) {
                backup_unpin(b->s);
                b->pinned = false;
                rc = embkv_snapshot_changed_ids(b->snap, &b->changed, &b->nchanged);
                b->phase = 1;
                continue;
            }
        } else {
            n = b->nchanged - b->changed_at < want ? b->nchanged - b->changed_at : want;
            ids = b->changed + b->changed_at;
            b->changed_at += n;
            if (n == 0) {
                b->phase = 2;
                continue;
            }
        }
        if (rc == EMBKV_OK)
            rc = copy_ids(b, ids, n);
        left = left > n ? left - n : 0;
    }
    if (rc != EMBKV_OK) {
        b->failed = 1;
        return rc;
    }
    if (done)
        *done = b->phase == 2;
    return EMBKV_OK;
}

const char *embkv_backup_dir(const embkv_backup *b)
{
    return b ? b->tmp : NULL;
}

int embkv_backup_abandon(embkv_backup *b)
{
    if (!b)
        return embkv__err(EMBKV_INVALID, "embkv_backup_abandon: backup is NULL");
    if (pthread_mutex_trylock(&b->step_mu) != 0)
        return embkv__err(EMBKV_BUSY, "embkv_backup_abandon: a step of this backup is running");
    pthread_mutex_unlock(&b->step_mu);
    backup_free(b);  /* (the copy, never renamed, goes with it) */
    return EMBKV_OK;
}

int embkv_backup_finish(embkv_backup *b, embkv_backup_info *info)
{
    if (info)
        memset(info, 0, sizeof *info);
    if (!b)
        return embkv__err(EMBKV_INVALID, "embkv_backup_finish: backup is NULL");
    if (pthread_mutex_trylock(&b->step_mu) != 0)
        return embkv__err(EMBKV_BUSY, "embkv_backup_finish: a step of this backup is running");
    int rc = EMBKV_OK;
    if (b->phase != 2)
        rc = embkv__err(b->failed ? EMBKV_INVALID : EMBKV_BUSY, "embkv_backup of store %s to %s: %s", b->s->path,
                        b->dir, b->failed ? "abandoned after a failed step" : "finished before its last step");
    if (rc == EMBKV_OK) {
        /* The snapshot's versions go; the copy is verified, and its close
         * (the last reference) syncs it. */
        embkv_snapshot_close(b->snap);
        b->snap = NULL;
        rc = embkv_check(b->dst);
        b->rows = embkv_count(b->dst);  /* distinct: a row may have been copied twice */
        int crc = embkv_close(b->dst);
        b->dst = NULL;
        if (rc == EMBKV_OK)
            rc = crc;
        if (rc != EMBKV_OK)
            rc = embkv__err(rc, "embkv_backup of store %s: completing the copy: %s", b->s->path, embkv_errmsg());
    }
    /* (the name as resolved at begin: the current directory may have
     * changed since) */
    if (rc == EMBKV_OK)
        rc = place(b->tmp, b->abs, b->dir);
    if (rc == EMBKV_OK) {
        if (info) {
            info->epoch = b->epoch;
            info->rows = b->rows;
            info->bytes = tree_bytes(b->abs);
        }
        free(b->tmp);
        b->tmp = NULL;
    }
    pthread_mutex_unlock(&b->step_mu);
    backup_free(b);
    return rc;
}
