/*
 * util.c - small pieces every layer uses: the monotonic clock, growable
 * vectors of locations, the distinct ids of a batch, whether a path
 * lies below a directory holding a given file (a store's pool), and the
 * blocks of a file to be mapped.
 *
 * Here, at the bottom, so that no file needs a higher one for them (there
 * were three copies of the clock).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base.h"

static _Atomic long cached_pid;
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;

static void pid_forgotten(void) { atomic_store(&cached_pid, 0); }
static void pid_watch(void) { pthread_atfork(NULL, NULL, pid_forgotten); }

long proc_pid(void)
{
    long p = atomic_load_explicit(&cached_pid, memory_order_relaxed);
    if (p)
        return p;
    pthread_once(&pid_once, pid_watch);
    p = (long)getpid();
    atomic_store(&cached_pid, p);
    return p;
}

int file_reserve(int fd, uint64_t len)
{
    /* The system call, not posix_fallocate: where a file system has none,
     * glibc's stand-in writes a zero byte into every block that reads as
     * zero, which could undo another process's write into a shared map. */
    int r;
    while ((r = fallocate(fd, 0, 0, (off_t)len)) != 0 && errno == EINTR) {
    }
    /* (EPERM: a seccomp filter, say; an immutable file fails its map) */
    return r == 0 || errno == EOPNOTSUPP || errno == ENOSYS || errno == EPERM ? 0 : errno;
}

uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

struct timespec deadline_after_ms(long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_nsec += ms * 1000000L;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return t;
}

int locvec_push(locvec *v, uint64_t x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        uint64_t *p = realloc(v->v, cap * sizeof *p);
        if (!p)
            return EMBKV_NOMEM;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return EMBKV_OK;
}

int ids_distinct(const int64_t *ids, size_t n, int64_t *uniq, size_t *slot_of, size_t *nu)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    size_t *table = malloc(cap * sizeof *table);
    if (!table)
        return EMBKV_NOMEM;
    memset(table, 0xff, cap * sizeof *table);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)embkv__hash(ids[i]) & (cap - 1);
        while (table[h] != SIZE_MAX && uniq[table[h]] != ids[i])
            h = (h + 1) & (cap - 1);
        if (table[h] == SIZE_MAX) {
            table[h] = k;
            uniq[k++] = ids[i];
        }
        if (slot_of)
            slot_of[i] = table[h];
    }
    free(table);
    *nu = k;
    return EMBKV_OK;
}

bool path_resolve(const char *abs, char *out, size_t len)
{
    /* realpath of the deepest part that exists, the rest appended. */
    char path[PATH_MAX], head[PATH_MAX];
    if (abs[0] != '/' || snprintf(path, sizeof path, "%s", abs) >= (int)sizeof path)
        return false;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = 0;
    memcpy(head, path, n + 1);
    char real[PATH_MAX];
    size_t cut = n;  /* head is path[0..cut) */
    while (!realpath(head, real)) {
        char *slash = strrchr(head, '/');
        if (!slash)
            return false;
        cut = (size_t)(slash - head);
        if (slash == head)
            slash[1] = 0;
        else
            *slash = 0;
    }
    const char *tail = path + cut;
    while (*tail == '/')
        tail++;
    if (!strcmp(tail, "..") || !strncmp(tail, "../", 3) || strstr(tail, "/../") ||
        (strlen(tail) >= 3 && !strcmp(tail + strlen(tail) - 3, "/..")))
        return false;  /* (a ".." past what exists: left unresolved) */
    if (!*tail)
        return snprintf(out, len, "%s", real) < (int)len;
    return snprintf(out, len, "%s/%s", strcmp(real, "/") ? real : "", tail) < (int)len;
}

bool path_below_file(const char *abs, const char *name, char *found, size_t len)
{
    char real[PATH_MAX];
    if (!path_resolve(abs, real, sizeof real))
        return false;
    for (;;) {
        char *slash = strrchr(real, '/');
        if (!slash || !strcmp(real, "/"))
            return false;
        if (slash == real)
            slash[1] = 0;
        else
            *slash = 0;
        char probe[PATH_MAX + 256];
        snprintf(probe, sizeof probe, "%s/%s", strcmp(real, "/") ? real : "", name);
        if (access(probe, F_OK) == 0) {
            snprintf(found, len, "%s", real);
            return true;
        }
    }
}
