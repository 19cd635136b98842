/*
 * persist.c - how bytes reach the media: flushes, the record checksum, the
 * dirty map, and the crash points the tests arm.
 *
 * On real persistent memory every write is flushed as it is made and a sync
 * only drains.  On an ordinary mapped file a flush is an msync (about 100 us
 * on ext4), far too dear per operation, so writers only mark the pages they
 * touch in a bitmap of the current epoch and embkv_sync writes exactly those
 * pages (dirtymap_flush: one msync for one run of pages, one fdatasync of
 * the pool file for more, as each msync flushes the device on its own): its
 * cost follows what changed, not the size of the table.
 *
 * Beside them, bitmaps of the index buckets written in each epoch
 * (mark_bucket; a bucket is marked with its page, so the page bitmap says
 * which words of the bucket bitmap to clear).  All four live in a shared
 * mapping of the file store.dirty: a killed process leaves them in the
 * page cache, so recovery after a crash reads only the buckets marked
 * since the durable epoch (and their rows' records), and its cost follows
 * what changed, not the table.  An epoch's bitmaps are cleared only once
 * it is durable, so at any moment the two of each kind cover everything
 * written since the durable epoch (P4).  A bucket bitmap's set bits are
 * tallied in the pool's root (count and hash sum): a bitmap that damage
 * changed, zeroed or replaced by an older copy does not match its tally,
 * and its store gets the full recovery.  (On real persistent memory nothing is
 * marked, and recovery visits every bucket.)
 */
#include <errno.h>
#include <fcntl.h>
#include <libpmem.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "persist.h"

#define PAGE_SHIFT 12

void persist_range(embkv_store *s, const void *addr, size_t len)
{
    persist_range_in(s, addr, len, atomic_load_explicit(&s->cur_epoch, memory_order_relaxed));
}

void persist_range_in(embkv_store *s, const void *addr, size_t len, uint64_t epoch)
{
    if (s->is_pmem) {
        pmem_flush(addr, len);
        return;
    }
    size_t first = (size_t)((const char *)addr - s->pool_base) >> PAGE_SHIFT;
    size_t last = (size_t)((const char *)addr + len - 1 - s->pool_base) >> PAGE_SHIFT;
    atomic_uint_fast64_t *bm = s->dirty[epoch & 1];
    for (size_t p = first; p <= last; p++) {
        uint64_t bit = 1ull << (p & 63);
        /* Read first: most pages are already marked, and a plain load keeps
         * the cache line shared between writer threads. */
        if (!(atomic_load_explicit(&bm[p >> 6], memory_order_relaxed) & bit))
            atomic_fetch_or_explicit(&bm[p >> 6], bit, memory_order_relaxed);
    }
}

void persist_barrier(embkv_store *s)
{
    if (s->is_pmem)
        pmem_drain();
}

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint32_t rec_checksum(const embkv_store *s, const rec_hdr *r)
{
    /* Four independent lanes keep the multiply chain short. */
    const uint64_t k1 = 0x9e3779b97f4a7c15ull, k2 = 0xc2b2ae3d27d4eb4full;
    uint64_t a = (uint64_t)r->id * k1, b = r->prev * k2, c = r->clock ^ k1, d = (uint64_t)r->epoch ^ k2;
    const unsigned char *p = (const unsigned char *)(r + 1);
    size_t bytes = s->vec_bytes + 4 * (size_t)s->state_floats, i = 0;
    for (; i + 32 <= bytes; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        a = rotl64(a ^ w[0], 29) * k1;
        b = rotl64(b ^ w[1], 31) * k2;
        c = rotl64(c ^ w[2], 27) * k1;
        d = rotl64(d ^ w[3], 33) * k2;
    }
    for (; i + 4 <= bytes; i += 4) {
        uint32_t w;
        memcpy(&w, p + i, 4);
        a = rotl64(a ^ w, 23) * k2;
    }
    uint64_t h = a ^ rotl64(b, 17) ^ rotl64(c, 37) ^ rotl64(d, 49) ^ bytes;
    h ^= h >> 33;
    h *= k1;
    h ^= h >> 29;
    return (uint32_t)(h ^ (h >> 32));
}

int rec_damaged(const embkv_store *s, int64_t id)
{
    return embkv__err(EMBKV_CORRUPT,
                      "store %s: id %lld: the record is damaged (checksum mismatch): delete the row (it can be "
                      "deleted) and write it again, or restore the store from a backup",
                      s->path, (long long)id);
}

/* msync a run of pages; records the first failure. */
static void flush_run(embkv_store *s, size_t first, size_t npages, int *rc)
{
    size_t page = (size_t)1 << PAGE_SHIFT;
    if (npages && msync(s->pool_base + first * page, npages * page, MS_SYNC) != 0 && *rc == EMBKV_OK)
        *rc = embkv__err(EMBKV_IO, "store %s: msync: %s", s->path, strerror(errno));
}

/* Writes every page marked in bitmap bm to the file (the bits stay until
 * the epoch is durable: dirtymap_clear_epoch).  One run of adjacent pages
 * is msynced.  More are written by one fdatasync of the pool file: on a
 * file system each msync is a sync of its range with a flush of the
 * device's cache of its own (ext4: about 40 us each here), so a sync of k
 * scattered pages cost k flushes and now costs one.  The fdatasync also
 * writes the pages dirtied since the epoch switched; that changes no
 * guarantee, as the kernel's writeback may write any dirty page at any
 * moment (only the root's durable_epoch, persisted after this, names
 * what recovery returns to). */
int dirtymap_flush(embkv_store *s, atomic_uint_fast64_t *bm)
{
    size_t run_start = 0, run_len = 0;
    int rc = EMBKV_OK;
    for (size_t w = 0; w < s->dirty_words; w++) {
        uint64_t bits = atomic_load_explicit(&bm[w], memory_order_relaxed);
        if (!bits)
            continue;
        while (bits) {
            size_t p = w * 64 + (size_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            if (run_len && run_start + run_len == p) {
                run_len++;
            } else if (run_len && s->pool_fd >= 0) {
                if (fdatasync(s->pool_fd) != 0)
                    return embkv__err(EMBKV_IO, "store %s: fdatasync of %s: %s", s->path, POOL_FILE,
                                      strerror(errno));
                return EMBKV_OK;
            } else {
                flush_run(s, run_start, run_len, &rc);
                run_start = p;
                run_len = 1;
            }
        }
    }
    flush_run(s, run_start, run_len, &rc);
    return rc;
}

static void clear_words(atomic_uint_fast64_t *bm, size_t words)
{
    for (size_t w = 0; w < words; w++)
        if (atomic_load_explicit(&bm[w], memory_order_relaxed))
            atomic_store_explicit(&bm[w], 0, memory_order_relaxed);
}

/* Epoch e is durable: clear its page bitmap and, word by word, the part
 * of its bucket bitmap those pages hold (a page's 16 buckets sit in
 * bucket word page/4), so the cost follows the pages it changed. */
#define BUCKETS_PER_PAGE ((1u << PAGE_SHIFT) / BUCKET_BYTES)
static void tally_reset(embkv_store *s, unsigned e);
void dirtymap_clear_epoch(embkv_store *s, uint64_t e)
{
    atomic_uint_fast64_t *pm = s->dirty[e & 1], *bm = s->bdirty[e & 1];
    for (size_t w = 0; w < s->dirty_words; w++) {
        uint64_t bits = atomic_load_explicit(&pm[w], memory_order_relaxed);
        if (!bits)
            continue;
        while (bits) {
            size_t bw = (w * 64 + (size_t)__builtin_ctzll(bits)) * BUCKETS_PER_PAGE / 64;
            bits &= bits - 1;
            if (bw < s->bdirty_words)
                atomic_store_explicit(&bm[bw], 0, memory_order_relaxed);
        }
        atomic_store_explicit(&pm[w], 0, memory_order_relaxed);
    }
    tally_reset(s, (unsigned)(e & 1));
}

/* ------------------------------------------------------- the dirty map */

#define DIRTY_MAGIC "embkv-dirtymap4"  /* 16 bytes with its NUL */
#define DIRTY_HDR 4096

/* A bucket bitmap's tally (store_root: dirty_count, dirty_sum): how many
 * bits mark_bucket set in it and the sum of a hash of their numbers.
 * Nothing else tells a bit that damage cleared, and recovery would skip
 * that bucket, keeping a change made after the checkpoint; an open checks
 * each bitmap against its tally, kept in the pool so that a dirty map
 * zeroed or replaced by an older copy of itself does not match either,
 * and a mismatch gets the full recovery.  (A kill between a bit and its
 * tally also mismatches: the full recovery again, correct if slower.) */
static inline uint64_t tally_hash(size_t b)
{
    uint64_t x = (uint64_t)b + 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void tally_reset(embkv_store *s, unsigned e)
{
    atomic_store_explicit(&s->root->dirty_count[e], 0, memory_order_relaxed);
    atomic_store_explicit(&s->root->dirty_sum[e], 0, memory_order_relaxed);
}

/* Whether bucket bitmap e holds exactly the bits its tally counted. */
static bool tally_matches(const embkv_store *s, unsigned e)
{
    uint64_t count = 0, sum = 0;
    for (size_t w = 0; w < s->bdirty_words; w++) {
        uint64_t bits = atomic_load_explicit(&s->bdirty[e][w], memory_order_relaxed);
        for (; bits; bits &= bits - 1) {
            count++;
            sum += tally_hash(w * 64 + (size_t)__builtin_ctzll(bits));
        }
    }
    return count == atomic_load_explicit(&s->root->dirty_count[e], memory_order_relaxed) &&
           sum == atomic_load_explicit(&s->root->dirty_sum[e], memory_order_relaxed);
}

typedef struct dirty_hdr {
    char magic[16];
    uint64_t pool_size, words;
    uint64_t pool_uuid;        /* the pool's libpmemobj uuid (its low half) */
    uint64_t marking;          /* 1: this pool's writes are marked here */
} dirty_hdr;

/* The pool file's descriptor for dirtymap_flush's fdatasync (-1: none,
 * and every run is msynced): the file libpmemobj mapped, under its name of
 * the moment (a pool being created is renamed later; the descriptor
 * follows it). */
static void pool_fd_open(embkv_store *s)
{
    s->pool_fd = -1;
    if (s->is_pmem)
        return;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", s->path, s->creating ? POOL_TMP : POOL_FILE);
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size != s->pool_size)) {
        close(fd);
        fd = -1;
    }
    s->pool_fd = fd;
}

int dirtymap_open(embkv_store *s, bool *usable)
{
    *usable = false;
    s->bdirty_words = ((s->pool_size / BUCKET_BYTES) + 64) / 64;
    size_t pbytes = (s->dirty_words * sizeof(uint64_t) + 4095) & ~(size_t)4095;
    size_t bbytes = (s->bdirty_words * sizeof(uint64_t) + 4095) & ~(size_t)4095;
    size_t len = DIRTY_HDR + 2 * pbytes + 2 * bbytes;
    dirty_hdr want;
    memset(&want, 0, sizeof want);
    memcpy(want.magic, DIRTY_MAGIC, sizeof want.magic);
    want.pool_size = s->pool_size;
    want.words = s->dirty_words;
    want.pool_uuid = pmemobj_oid(s->root).pool_uuid_lo;
    want.marking = s->is_pmem ? 0 : 1;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", s->path, DIRTY_FILE);
    /* Never through a link, never into anything but a plain file: the map
     * is written, and a store directory may come from elsewhere. */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    struct stat fst;
    if (fd >= 0 && (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode))) {
        close(fd);
        fd = -1;
    }
    void *map = MAP_FAILED;
    if (fd >= 0) {
        struct stat st;
        dirty_hdr got;
        bool same = fstat(fd, &st) == 0 && (size_t)st.st_size == len &&
                    pread(fd, &got, sizeof got, 0) == (ssize_t)sizeof got && !memcmp(&got, &want, sizeof got);
        if (same || ftruncate(fd, 0) == 0) {
            /* (blocks allocated first: on a full file system, DRAM bitmaps
             * below, not a SIGBUS at a write into the map) */
            if (ftruncate(fd, (off_t)len) == 0 && file_reserve(fd, len) == 0)
                map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            *usable = same && map != MAP_FAILED && !s->is_pmem;
        }
        close(fd);
    }
    if (map == MAP_FAILED) {
        pool_fd_open(s);
        /* (A read-only or full file system: DRAM bitmaps, full recovery.) */
        for (int i = 0; i < 2; i++)
            if (!(s->dirty[i] = calloc(s->dirty_words, sizeof(uint64_t))) ||
                !(s->bdirty[i] = calloc(s->bdirty_words, sizeof(uint64_t))))
                return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
        return EMBKV_OK;
    }
    pool_fd_open(s);
    s->dirty_map = map;
    s->dirty_map_len = len;
    memcpy(map, &want, sizeof want);
    char *p = (char *)map + DIRTY_HDR;
    s->dirty[0] = (atomic_uint_fast64_t *)p;
    s->dirty[1] = (atomic_uint_fast64_t *)(p + pbytes);
    s->bdirty[0] = (atomic_uint_fast64_t *)(p + 2 * pbytes);
    s->bdirty[1] = (atomic_uint_fast64_t *)(p + 2 * pbytes + bbytes);
    if (*usable && (!tally_matches(s, 0) || !tally_matches(s, 1)))
        *usable = false;
    return EMBKV_OK;
}

void dirtymap_close(embkv_store *s)
{
    if (s->pool_fd >= 0)
        close(s->pool_fd);
    s->pool_fd = -1;
    if (s->dirty_map) {
        munmap(s->dirty_map, s->dirty_map_len);
        s->dirty_map = NULL;
    } else {
        for (int i = 0; i < 2; i++) {
            free((void *)s->dirty[i]);
            free((void *)s->bdirty[i]);
        }
    }
    s->dirty[0] = s->dirty[1] = s->bdirty[0] = s->bdirty[1] = NULL;
}

/* Before the bucket changes (P4), with its tally. */
void mark_bucket(embkv_store *s, const void *bk)
{
    if (s->is_pmem)
        return;
    size_t b = (size_t)((const char *)bk - s->pool_base) / BUCKET_BYTES;
    unsigned e = (unsigned)(atomic_load_explicit(&s->cur_epoch, memory_order_relaxed) & 1);
    atomic_uint_fast64_t *bm = s->bdirty[e];
    uint64_t bit = 1ull << (b & 63);
    if (!(atomic_load_explicit(&bm[b >> 6], memory_order_relaxed) & bit) &&
        !(atomic_fetch_or_explicit(&bm[b >> 6], bit, memory_order_relaxed) & bit)) {
        atomic_fetch_add_explicit(&s->root->dirty_count[e], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->root->dirty_sum[e], tally_hash(b), memory_order_relaxed);
    }
}

bool dirtymap_marked(const embkv_store *s, const void *bk)
{
    size_t b = (size_t)((const char *)bk - s->pool_base) / BUCKET_BYTES;
    uint64_t bit = 1ull << (b & 63);
    return ((atomic_load_explicit(&s->bdirty[0][b >> 6], memory_order_relaxed) |
             atomic_load_explicit(&s->bdirty[1][b >> 6], memory_order_relaxed)) & bit) != 0;
}

void dirtymap_reset(embkv_store *s)
{
    for (int i = 0; i < 2; i++) {
        clear_words(s->dirty[i], s->dirty_words);
        clear_words(s->bdirty[i], s->bdirty_words);
        tally_reset(s, (unsigned)i);
    }
}

/* ------------------------------------------------------- crash points */

_Atomic uint64_t embkv__kill_countdown;

void embkv_debug_kill_after_index_writes(uint64_t n) { atomic_store(&embkv__kill_countdown, n); }

/* Counts one down from a countdown not yet at zero: its value before. */
static uint64_t countdown_take(_Atomic uint64_t *c)
{
    uint64_t n = atomic_load(c);
    while (n && !atomic_compare_exchange_weak(c, &n, n - 1))
        ;
    return n;
}

void debug_index_written(void)
{
    if (countdown_take(&embkv__kill_countdown) == 1)
        raise(SIGKILL);
}

_Atomic uint64_t embkv__fail_syncs;

void embkv_debug_fail_syncs(uint64_t n) { atomic_store(&embkv__fail_syncs, n); }

bool debug_sync_fails(void) { return countdown_take(&embkv__fail_syncs) != 0; }
