/*
 * pmemsim.c - persistent memory, simulated, for tests/test_powercut.c.
 *
 * An LD_PRELOAD library that takes the place of libpmem's flush calls
 * (pmem_flush, pmem_drain, pmem_persist, pmem_msync, pmem_deep_flush and
 * the pmem_mem* copies), made by the engine and by libpmemobj alike, and
 * says every mapping is persistent memory (pmem_is_pmem), so both take
 * their persistent-memory paths on an ordinary file.  It keeps what real
 * persistent memory would hold after a power cut, in the pool's directory:
 *   app-pmemsim.durable   the pool as far as drained flushes made it: every
 *                         cache line flushed and then drained is there;
 *   app-pmemsim.pending   lines flushed and not yet drained (offset,
 *                         length, content at the flush), which a power cut
 *                         may or may not have let through.
 * Both are shared file mappings, so a process killed with SIGKILL leaves
 * them as they were at the kill.  The test builds the image a power cut
 * leaves from them (and from lines never flushed, which a cache eviction
 * may have written back) and opens it.
 *
 * The test creates both (the durable one a copy of the closed pool) before
 * it starts the process; a mapping of a file without them beside it is
 * not tracked.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pmemsim.h"

#define LINE 64u
/* libpmem's flags (libpmem.h) */
#define F_MEM_NODRAIN (1U << 0)
#define F_MEM_NOFLUSH (1U << 5)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uintptr_t start, end;      /* the pool's mapping */
    uint64_t off;              /* file offset of start */
    char *durable;             /* <pool>.durable, mapped */
    size_t durable_len;
    pmemsim_pending *pend;     /* <pool>.pending, mapped */
    bool ready, tried;
} sim;

static void *map_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > 0)
        p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return NULL;
    *len = (size_t)st.st_size;
    return p;
}

/* Finds the mapping of a file with a .durable beside it that holds addr
 * (the pool; called with mu held, once an address outside it shows up). */
static void locate(uintptr_t addr)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f)
        return;
    char line[4352];
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi, off;
        char perms[8], path[4096] = "";
        if (sscanf(line, "%lx-%lx %7s %lx %*s %*s %4095[^\n]", &lo, &hi, perms, &off, path) < 4)
            continue;
        if (addr < lo || addr >= hi || path[0] != '/')
            continue;
        char dpath[4200], ppath[4200];
        char *slash = strrchr(path, '/');
        *slash = 0;
        snprintf(dpath, sizeof dpath, "%s/%s", path, PMEMSIM_DURABLE);
        snprintf(ppath, sizeof ppath, "%s/%s", path, PMEMSIM_PENDING);
        size_t dl = 0, pl = 0;
        char *d = map_file(dpath, &dl);
        pmemsim_pending *p = d ? map_file(ppath, &pl) : NULL;
        if (d && p && pl >= sizeof *p) {
            if (sim.durable)
                munmap(sim.durable, sim.durable_len);
            sim.start = lo;
            sim.end = hi;
            sim.off = off;
            sim.durable = d;
            sim.durable_len = dl;
            sim.pend = p;
            sim.pend->cap = (uint64_t)(pl - sizeof *p);
            sim.ready = true;
        } else if (d) {
            munmap(d, dl);
        }
        break;
    }
    fclose(f);
}

static bool tracked(uintptr_t a)
{
    if (sim.ready && a >= sim.start && a < sim.end)
        return true;
    locate(a);
    return sim.ready && a >= sim.start && a < sim.end;
}

/* A fence: everything queued is in the durable image (mu held). */
static void drain_locked(void)
{
    if (!sim.ready)
        return;
    uint64_t at = 0, used = sim.pend->used;
    while (at < used) {
        pmemsim_entry h;
        memcpy(&h, sim.pend->data + at, sizeof h);
        if (h.off + h.len <= sim.durable_len)
            memcpy(sim.durable + h.off, sim.pend->data + at + sizeof h, h.len);
        at += sizeof h + h.len;
    }
    __atomic_store_n(&sim.pend->used, 0, __ATOMIC_RELEASE);
}

static void drain(void)
{
    pthread_mutex_lock(&mu);
    drain_locked();
    pthread_mutex_unlock(&mu);
}

/* Lines of [addr, addr+len) flushed: queued with their content now. */
static void record(const void *addr, size_t len)
{
    if (!len)
        return;
    pthread_mutex_lock(&mu);
    uintptr_t a = (uintptr_t)addr & ~(uintptr_t)(LINE - 1);
    uintptr_t e = ((uintptr_t)addr + len + LINE - 1) & ~(uintptr_t)(LINE - 1);
    if (tracked(a)) {
        if (e > sim.end)
            e = sim.end;
        uint64_t need = sizeof(pmemsim_entry) + (e - a);
        if (sim.pend->used + need > sim.pend->cap)
            drain_locked();  /* full: as if a fence came first (stricter than the caller asked) */
        if (need > sim.pend->cap) {
            memcpy(sim.durable + (a - sim.start) + sim.off, (const void *)a, e - a);
        } else {
            pmemsim_entry h = {.off = (a - sim.start) + sim.off, .len = e - a};
            memcpy(sim.pend->data + sim.pend->used, &h, sizeof h);
            memcpy(sim.pend->data + sim.pend->used + sizeof h, (const void *)a, e - a);
            __atomic_store_n(&sim.pend->used, sim.pend->used + need, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&mu);
}

int pmem_is_pmem(const void *addr, size_t len)
{
    (void)addr, (void)len;
    return 1;
}

void pmem_flush(const void *addr, size_t len)
{
    record(addr, len);
}

void pmem_drain(void)
{
    drain();
}

void pmem_persist(const void *addr, size_t len)
{
    record(addr, len);
    drain();
}

int pmem_msync(const void *addr, size_t len)
{
    pmem_persist(addr, len);
    return 0;
}

int pmem_deep_flush(const void *addr, size_t len)
{
    pmem_persist(addr, len);
    return 0;
}

static void after_copy(void *dst, size_t len, unsigned flags)
{
    if (!(flags & F_MEM_NOFLUSH))
        record(dst, len);
    if (!(flags & F_MEM_NODRAIN))
        drain();
}

void *pmem_memcpy(void *dst, const void *src, size_t len, unsigned flags)
{
    memcpy(dst, src, len);
    after_copy(dst, len, flags);
    return dst;
}

void *pmem_memmove(void *dst, const void *src, size_t len, unsigned flags)
{
    memmove(dst, src, len);
    after_copy(dst, len, flags);
    return dst;
}

void *pmem_memset(void *dst, int c, size_t len, unsigned flags)
{
    memset(dst, c, len);
    after_copy(dst, len, flags);
    return dst;
}
