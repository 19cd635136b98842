/*
 * filesim.c - a disk's write cache, simulated, for tests/test_powercut.c:
 * the half of the power-cut library (pmemsim.so) that covers ordinary
 * files, as the SSD log writes them.
 *
 * A file system promises only what an fsync covered: a write is on the
 * medium once an fdatasync of its file returned, a new or removed name once
 * an fsync of its directory returned; anything later may be lost, block by
 * block, in any combination.  This library journals, for the files of one
 * directory (PMEMSIM_FILES), every operation that changes them, in the
 * order they were made: creates, writes with their bytes (pwrite, and
 * io_uring writes taken from the submission queue as io_uring_submit
 * sends them), size changes (posix_fallocate, ftruncate), fdatasync and
 * fsync of a file, fsync of the directory, and unlinks.  The journal
 * (PMEMSIM_JOURNAL, appended with one write per entry, so a kill leaves at
 * most a torn last entry) lets the test rebuild what a power cut at the
 * kill may leave (tests/powercut/filecut.h).  PMEMSIM_KILL_AT_WRITE=n
 * kills the process itself once the n-th write is journaled, before it is
 * made: the moment between an append and its sync, which a timer seldom
 * finds.
 *
 * A write is journaled before it is made (a write in flight at the cut may
 * land or not), a sync after it returned (only then is anything promised).
 * That a sync covers the writes journaled before it holds because the log
 * waits for its writes to complete before it syncs, under one lock.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "pmemsim.h"

#define MAX_FD 4096

static pthread_mutex_t fmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char simdir[PATH_MAX];       /* realpath of PMEMSIM_FILES ("" : off) */
static int journal = -1;
static long kill_at, writes_seen;   /* PMEMSIM_KILL_AT_WRITE */
/* Per descriptor: 0 untracked, 1 a file of simdir (name below), 2 simdir itself. */
static unsigned char fdkind[MAX_FD];
static char *fdname[MAX_FD];

static int (*real_open)(const char *, int, ...);
static int (*real_openat)(int, const char *, int, ...);
static int (*real_close)(int);
static ssize_t (*real_pwrite)(int, const void *, size_t, off_t);
static int (*real_fdatasync)(int);
static int (*real_fsync)(int);
static int (*real_fallocate)(int, off_t, off_t);
static int (*real_ftruncate)(int, off_t);
static int (*real_unlinkat)(int, const char *, int);
static int (*real_unlink)(const char *);
static int (*real_submit)(struct io_uring *);
static int (*real_submit_wait)(struct io_uring *, unsigned);

static void init(void)
{
    real_open = dlsym(RTLD_NEXT, "open");
    real_openat = dlsym(RTLD_NEXT, "openat");
    real_close = dlsym(RTLD_NEXT, "close");
    real_pwrite = dlsym(RTLD_NEXT, "pwrite");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fallocate = dlsym(RTLD_NEXT, "posix_fallocate");
    real_ftruncate = dlsym(RTLD_NEXT, "ftruncate");
    real_unlinkat = dlsym(RTLD_NEXT, "unlinkat");
    real_unlink = dlsym(RTLD_NEXT, "unlink");
    real_submit = dlsym(RTLD_NEXT, "io_uring_submit");
    real_submit_wait = dlsym(RTLD_NEXT, "io_uring_submit_and_wait");
    const char *d = getenv(PMEMSIM_FILES_ENV), *j = getenv(PMEMSIM_JOURNAL_ENV);
    if (d && *d && j && *j && realpath(d, simdir)) {
        journal = real_open(j, O_WRONLY | O_APPEND | O_CLOEXEC);
        if (journal < 0) {
            fprintf(stderr, "pmemsim: cannot open the journal %s\n", j);
            abort();
        }
        const char *k = getenv(PMEMSIM_KILL_AT_WRITE_ENV);
        kill_at = k && *k ? atol(k) : 0;
    } else {
        simdir[0] = 0;
    }
}

static void need(void)
{
    pthread_once(&once, init);
}

/* One entry, one write(2) (fmu held). */
static void emit(int kind, const char *name, uint64_t off, uint64_t len, const struct iovec *data, int ndata)
{
    filesim_op h = {.magic = FILESIM_MAGIC, .kind = (uint16_t)kind, .name_len = (uint16_t)strlen(name),
                    .off = off, .len = len};
    size_t total = sizeof h + h.name_len + (kind == FILESIM_WRITE ? len : 0);
    char *b = malloc(total);
    if (!b)
        abort();
    memcpy(b, &h, sizeof h);
    memcpy(b + sizeof h, name, h.name_len);
    size_t at = sizeof h + h.name_len;
    for (int i = 0; kind == FILESIM_WRITE && i < ndata; i++) {
        memcpy(b + at, data[i].iov_base, data[i].iov_len);
        at += data[i].iov_len;
    }
    size_t put = 0;
    while (put < total) {
        ssize_t w = write(journal, b + put, total - put);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            abort();
        put += (size_t)w;
    }
    free(b);
}

static void note(int kind, const char *name, uint64_t off, uint64_t len, const struct iovec *data, int ndata)
{
    pthread_mutex_lock(&fmu);
    emit(kind, name, off, len, data, ndata);
    /* Killed with the write journaled but not made: a cut in the middle of
     * an append, which a timed kill seldom hits. */
    if (kind == FILESIM_WRITE && kill_at && ++writes_seen == kill_at)
        kill(getpid(), SIGKILL);
    pthread_mutex_unlock(&fmu);
}

/* What a new descriptor is: simdir, one of its files, or neither. */
static void opened(int fd, int flags)
{
    if (fd < 0 || fd >= MAX_FD || !simdir[0])
        return;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0)
        return;
    path[n] = 0;
    pthread_mutex_lock(&fmu);
    free(fdname[fd]);
    fdname[fd] = NULL;
    fdkind[fd] = 0;
    size_t dl = strlen(simdir);
    if (!strcmp(path, simdir)) {
        fdkind[fd] = 2;
    } else if (!strncmp(path, simdir, dl) && path[dl] == '/' && !strchr(path + dl + 1, '/') &&
               !strstr(path, " (deleted)") && (flags & O_TMPFILE) != O_TMPFILE) {
        fdkind[fd] = 1;
        fdname[fd] = strdup(path + dl + 1);
        if (flags & O_CREAT)
            emit(FILESIM_CREATE, fdname[fd], 0, 0, NULL, 0);
    }
    pthread_mutex_unlock(&fmu);
}

/* The name of a tracked file's descriptor, copied (NULL: not tracked). */
static bool tracked_name(int fd, char *out, size_t len)
{
    if (fd < 0 || fd >= MAX_FD || !simdir[0])
        return false;
    pthread_mutex_lock(&fmu);
    bool ok = fdkind[fd] == 1 && fdname[fd];
    if (ok)
        snprintf(out, len, "%s", fdname[fd]);
    pthread_mutex_unlock(&fmu);
    return ok;
}

static int kind_of(int fd)
{
    if (fd < 0 || fd >= MAX_FD || !simdir[0])
        return 0;
    pthread_mutex_lock(&fmu);
    int k = fdkind[fd];
    pthread_mutex_unlock(&fmu);
    return k;
}

int open(const char *path, int flags, ...)
{
    need();
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    int fd = real_open(path, flags, mode);
    opened(fd, flags);
    return fd;
}

int open64(const char *path, int flags, ...) __attribute__((alias("open")));

int openat(int dirfd, const char *path, int flags, ...)
{
    need();
    va_list ap;
    va_start(ap, flags);
    mode_t mode = (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? va_arg(ap, mode_t) : 0;
    va_end(ap);
    int fd = real_openat(dirfd, path, flags, mode);
    opened(fd, flags);
    return fd;
}

int openat64(int dirfd, const char *path, int flags, ...) __attribute__((alias("openat")));

int close(int fd)
{
    need();
    if (fd >= 0 && fd < MAX_FD && simdir[0]) {
        pthread_mutex_lock(&fmu);
        fdkind[fd] = 0;
        free(fdname[fd]);
        fdname[fd] = NULL;
        pthread_mutex_unlock(&fmu);
    }
    return real_close(fd);
}

ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
    need();
    char name[NAME_MAX + 1];
    if (n && tracked_name(fd, name, sizeof name)) {
        struct iovec v = {(void *)buf, n};
        note(FILESIM_WRITE, name, (uint64_t)off, n, &v, 1);
    }
    return real_pwrite(fd, buf, n, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t n, off_t off) __attribute__((alias("pwrite")));

int posix_fallocate(int fd, off_t off, off_t len)
{
    need();
    char name[NAME_MAX + 1];
    if (tracked_name(fd, name, sizeof name))
        note(FILESIM_SIZE, name, (uint64_t)(off + len), 0, NULL, 0);
    return real_fallocate(fd, off, len);
}

int posix_fallocate64(int fd, off_t off, off_t len) __attribute__((alias("posix_fallocate")));

int ftruncate(int fd, off_t len)
{
    need();
    char name[NAME_MAX + 1];
    if (tracked_name(fd, name, sizeof name))
        note(FILESIM_SIZE, name, (uint64_t)len, 1, NULL, 0);
    return real_ftruncate(fd, len);
}

int ftruncate64(int fd, off_t len) __attribute__((alias("ftruncate")));

static int synced(int fd, int r)
{
    if (r != 0)
        return r;
    int k = kind_of(fd);
    char name[NAME_MAX + 1];
    if (k == 2)
        note(FILESIM_DIRSYNC, "", 0, 0, NULL, 0);
    else if (k == 1 && tracked_name(fd, name, sizeof name))
        note(FILESIM_SYNC, name, 0, 0, NULL, 0);
    return r;
}

int fdatasync(int fd)
{
    need();
    return synced(fd, real_fdatasync(fd));
}

int fsync(int fd)
{
    need();
    return synced(fd, real_fsync(fd));
}

int unlinkat(int dirfd, const char *path, int flags)
{
    need();
    int r = real_unlinkat(dirfd, path, flags);
    if (r == 0 && kind_of(dirfd) == 2 && !strchr(path, '/'))
        note(FILESIM_UNLINK, path, 0, 0, NULL, 0);
    return r;
}

int unlink(const char *path)
{
    need();
    char dir[PATH_MAX], real[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    bool ours = false;
    if (simdir[0] && slash) {
        *slash = 0;
        ours = realpath(dir[0] ? dir : "/", real) && !strcmp(real, simdir);
    }
    int r = real_unlink(path);
    if (r == 0 && ours)
        note(FILESIM_UNLINK, slash + 1, 0, 0, NULL, 0);
    return r;
}

/* The writes about to be submitted, journaled with their bytes. */
static void queued_writes(struct io_uring *ring)
{
    struct io_uring_sq *sq = &ring->sq;
    for (unsigned i = sq->sqe_head; i != sq->sqe_tail; i++) {
        const struct io_uring_sqe *e = &sq->sqes[i & sq->ring_mask];
        if (e->flags & IOSQE_FIXED_FILE)
            continue;
        char name[NAME_MAX + 1];
        if (!tracked_name(e->fd, name, sizeof name))
            continue;
        if (e->opcode == IORING_OP_WRITE || e->opcode == IORING_OP_WRITE_FIXED) {
            struct iovec v = {(void *)(uintptr_t)e->addr, e->len};
            note(FILESIM_WRITE, name, e->off, e->len, &v, 1);
        } else if (e->opcode == IORING_OP_WRITEV) {
            const struct iovec *v = (const struct iovec *)(uintptr_t)e->addr;
            uint64_t len = 0;
            for (unsigned k = 0; k < e->len; k++)
                len += v[k].iov_len;
            note(FILESIM_WRITE, name, e->off, len, v, (int)e->len);
        } else if (e->opcode == IORING_OP_FSYNC) {
            /* Would need its completion to be journaled; the log does not use it. */
            fprintf(stderr, "pmemsim: an io_uring fsync of a simulated file is not supported\n");
            abort();
        }
    }
}

int io_uring_submit(struct io_uring *ring)
{
    need();
    if (simdir[0])
        queued_writes(ring);
    return real_submit(ring);
}

int io_uring_submit_and_wait(struct io_uring *ring, unsigned wait_nr)
{
    need();
    if (simdir[0])
        queued_writes(ring);
    return real_submit_wait(ring, wait_nr);
}
