/*
 * cache.c - the DRAM tier: a write-back cache of hot rows (option
 * cache_size), above the pool and the log.
 *
 * What it holds.  A cached row's current version: the whole record
 * (header, vector, optimizer state) in a DRAM slot.  Clean: the row's
 * home (the record the index points at, in the pool or the log) holds the
 * same.  Dirty: the home is older; the cache is the only copy of the
 * changes since the row was last written back (at a checkpoint, when a
 * snapshot opens, or by the cleaner), which is exactly what a crash must
 * lose.  Every cached row is in the index (rows are admitted only once
 * they have a home), so counts, scans and placement keep using the index.
 *
 * Who may change what.  A row's slot content, its dirty bit, and its
 * presence in the cache change only under the row's key lock (write.c:
 * the stripe lock every writer of the row holds), so a writer holding it
 * sees a stable entry.  The tables and the clock hand of a shard change
 * under the shard's lock.  Readers take neither: a table probe is checked
 * against the shard's table version (odd while the table changes; a miss
 * is only trusted if it did not move), a slot copy against the slot's
 * sequence number (odd while its content changes; eviction and reuse bump
 * it too) and the slot's id and use.  Under ThreadSanitizer content is
 * copied in 8-byte atomic words on both sides, so that build's seqlock has
 * no data race; the others copy with memcpy, and the training push updates
 * a slot in place (cache_update_begin), with plain stores: a reader's copy
 * torn by them is thrown away by the sequence check.
 *
 * Admission and eviction (TinyLFU over CLOCK).  The candidate is compared
 * with the first eligible victim under the shard's hand: a slot not
 * referenced since the hand last passed (reads and writes set the bit:
 * rows just pulled, whose push is coming, survive a full turn), clean,
 * whose key lock can be taken without waiting, and not pulled within the
 * last PULL_WINDOW pulls (MTrainS: rows in use stay; the window bounds
 * what a pull that is never pushed can shield), unless the shard has
 * nothing else to offer: the shield orders victims, it never pins a
 * cache smaller than the pulls in flight.  The candidate comes in if
 * the access sketch (heat.c) estimates it strictly hotter, else it is
 * refused.  Hotset moves force it in: the hand goes on past victims at
 * least as hot (up to EVICT_SCAN slots) instead of refusing at the first,
 * but a move never evicts a row as hot as the one it brings, or a
 * background migration that brings the hottest rows first would, in a
 * full shard, churn them out again with the colder ones after.  Dirty rows are never evicted: they
 * are written back first (write.c: writeback_clean), so eviction costs no
 * I/O and no allocation in the middle of a batch.
 *
 * Memory.  Slots live in one anonymous mapping advised MADV_HUGEPAGE: at
 * gigabytes of cache, 4 KiB pages would make every hit a TLB miss too.  A
 * slot is its state (cslot) and its record side by side, rounded up to
 * whole 64-byte lines (slot_stride), so a hit fetches the lines of its
 * record and no other.  The shard tables follow, twice the slots, 16 bytes an entry.
 *
 * The sketch's line.  A read's touch of the sketch is one more line per
 * hit, and for the hottest rows it changes nothing (their counters sit at
 * the cap).  A table entry keeps the sketch's stamp (heat.h: heat_stamp)
 * under which its row was seen saturated; batch reads that find it still
 * current only count the touch (write.c: get_batch_rows), so the
 * sketch holds exactly what the touches would have left.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "tiers.h"

#define CACHE_SHARDS 64
#define EVICT_SCAN 64   /* slots the hand looks at for one admission */
/* How long a pulled row is shielded from eviction, in pulls of the store:
 * a trainer pushes what it pulled within about workers x (staleness + 1)
 * pulls, and a row pulled and never pushed (a reader, a session that
 * ended) must not stay pinned. */
#define PULL_WINDOW 128

/* The cache whose pull this thread is inside (cache_pull_begin). */
static _Thread_local cache *pull_of;

typedef struct centry {
    _Atomic int64_t key;
    _Atomic uint32_t slot1;    /* slot + 1; 0 = empty */
    /* The sketch's stamp (heat_stamp) under which this row's counters
     * were seen saturated, 0 none: its pulls skip the sketch's line while
     * the stamp holds (cache_find_heat).  Set under the shard's lock. */
    _Atomic uint32_t heat;
} centry;

typedef struct cslot {
    _Atomic uint32_t seq;      /* odd while the content changes */
    _Atomic uint8_t ref;       /* CLOCK reference bit */
    _Atomic uint8_t used;      /* changed under the shard lock (and the row's key lock) */
    _Atomic uint16_t pulled;   /* pull_tick of its last pull (low bits); 0 never */
    _Atomic int64_t id;
    uint64_t wb;               /* dirty: the pool record its write-back fills (atomic
                                  stores: read unlocked as a prefetch hint) */
} cslot;

typedef struct cshard {
    atomic_flag lock;
    _Atomic uint32_t tver;     /* odd while the table changes */
    uint32_t base, n;          /* slots [base, base + n) */
    uint32_t hand;
    _Atomic uint32_t used;     /* changed under the lock, read without it as a hint */
    uint64_t tmask;
    centry *tab;
    char pad[64];
} cshard;

struct cache {
    uint64_t capacity;
    uint32_t rec_size, words;
    uint32_t dtype, vec_bytes;  /* how the records keep their vectors */
    uint32_t stride;           /* a slot: its cslot, then its record, in whole lines */
    cshard shards[CACHE_SHARDS];
    char *slots;               /* capacity * stride */
    size_t map_bytes;
    void *map;
    bool huge;
    _Atomic uint64_t *dirty;   /* one bit per slot */
    size_t dirty_words;
    atomic_uint_fast64_t ndirty;
    atomic_uint_fast64_t hits, misses, admissions, evictions, writebacks, refused;
    /* The heat of the last victim the hand weighed a candidate against:
     * a candidate no hotter is refused before the shard is touched (and
     * the bar sinks a step per 64 such refusals: cache_worth_admitting). */
    _Atomic unsigned bar;
    /* Pulls of the store so far (cache_pull_end): a row pulled within the
     * last PULL_WINDOW of them is not evicted, its push being due. */
    _Atomic uint32_t pull_tick;
};

static inline cshard *shard_of(cache *c, uint64_t h) { return &c->shards[h >> 58]; }

void cache_pull_begin(cache *c) { pull_of = c; }

void cache_pull_end(cache *c)
{
    pull_of = NULL;
    if (c)
        atomic_fetch_add_explicit(&c->pull_tick, 1, memory_order_relaxed);
}

static inline uint16_t pull_stamp(cache *c)
{
    uint16_t t = (uint16_t)atomic_load_explicit(&c->pull_tick, memory_order_relaxed);
    return t ? t : 1;
}

static inline bool pull_shielded(cache *c, const cslot *cs)
{
    uint16_t p = atomic_load_explicit(&cs->pulled, memory_order_relaxed);
    return p && (uint16_t)(pull_stamp(c) - p) < PULL_WINDOW;
}
static inline cslot *slot_at(const cache *c, int64_t si) { return (cslot *)(c->slots + (size_t)si * c->stride); }
static inline uint64_t *slot_words(const cache *c, uint32_t si) { return (uint64_t *)(slot_at(c, si) + 1); }

static void shard_lock(cshard *sh)
{
    unsigned spins = 0;
    while (atomic_flag_test_and_set_explicit(&sh->lock, memory_order_acquire))
        ix_relax(&spins);
}
static void shard_unlock(cshard *sh) { atomic_flag_clear_explicit(&sh->lock, memory_order_release); }

/* A shard's table: at least twice its slots, a power of two. */
static uint64_t tab_entries(uint64_t slots)
{
    uint64_t t = 16;
    while (t < 2 * slots)
        t <<= 1;
    return t;
}

/* A slot's state beside its record, in the lines a hit reads anyway (a
 * separate array of states cost every hit one more line from memory);
 * whole lines, so that a slot spans no more of them than it must, unless
 * that wastes more than an eighth of it (small records). */
static uint32_t slot_stride(uint32_t rec_size)
{
    uint32_t raw = (uint32_t)sizeof(cslot) + rec_size, lines = (raw + 63) / 64 * 64;
    return (lines - raw) * 8 <= raw ? lines : raw;
}

uint64_t cache_bytes_for(uint64_t rows, uint32_t rec_size)
{
    uint64_t per = rows / CACHE_SHARDS, extra = rows % CACHE_SHARDS, b = rows * (uint64_t)slot_stride(rec_size);
    for (uint64_t i = 0; i < CACHE_SHARDS; i++)
        b += tab_entries(per + (i < extra)) * sizeof(centry);
    return b;
}

cache *cache_new(uint64_t rows, uint32_t rec_size, uint32_t dtype, uint32_t dim)
{
    if (rows < CACHE_SHARDS)
        rows = CACHE_SHARDS;
    if (rows > UINT32_MAX - CACHE_SHARDS)
        rows = UINT32_MAX - CACHE_SHARDS;
    cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->capacity = rows;
    c->rec_size = rec_size;
    c->dtype = dtype;
    c->vec_bytes = dtype_vec_bytes((int)dtype, dim);
    c->words = rec_size / 8;
    c->stride = slot_stride(rec_size);
    uint64_t per = rows / CACHE_SHARDS, extra = rows % CACHE_SHARDS, base = 0, tab_total = 0;
    for (int i = 0; i < CACHE_SHARDS; i++)
        tab_total += tab_entries(per + ((uint64_t)i < extra));
    /* The shard tables share the mapping (after the records): a probe is a
     * random line of megabytes of tables, and on 4 KiB pages its TLB miss
     * cost about as much as the line (measured). */
    size_t slot_bytes = (size_t)rows * c->stride;
    size_t tab_bytes = (size_t)tab_total * sizeof(centry), align = 2u << 20;
    c->map_bytes = (slot_bytes + 64 + tab_bytes + 2 * align) / align * align;
    c->map = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (c->map == MAP_FAILED) {
        free(c);
        errno = ENOMEM;
        return NULL;
    }
#ifdef MADV_HUGEPAGE
    /* (EMBKV_CACHE_SMALL_PAGES, for benchmarks: measure without them.) */
    const char *small = getenv("EMBKV_CACHE_SMALL_PAGES");
    if (!small || !*small || *small == '0')
        c->huge = madvise(c->map, c->map_bytes, MADV_HUGEPAGE) == 0;
#endif
    /* The slots from the first huge page boundary in the mapping (mmap
     * promises only a page's alignment; the mapping has room to spare),
     * then the shard tables. */
    c->slots = (char *)(((uintptr_t)c->map + align - 1) & ~(uintptr_t)(align - 1));
    centry *next_tab = (centry *)(((uintptr_t)c->slots + slot_bytes + 63) & ~(uintptr_t)63);
    c->dirty_words = (rows + 63) / 64;
    c->dirty = calloc(c->dirty_words, sizeof *c->dirty);
    bool ok = c->dirty != NULL;
    for (int i = 0; i < CACHE_SHARDS && ok; i++) {
        cshard *sh = &c->shards[i];
        atomic_flag_clear(&sh->lock);
        sh->base = (uint32_t)base;
        sh->n = (uint32_t)(per + ((uint64_t)i < extra));
        base += sh->n;
        uint64_t t = tab_entries(sh->n);
        sh->tmask = t - 1;
        sh->tab = next_tab;
        next_tab += t;
    }
    if (!ok) {
        cache_free(c);
        errno = ENOMEM;
        return NULL;
    }
    return c;
}

void cache_free(cache *c)
{
    if (!c)
        return;
    free((void *)c->dirty);
    munmap(c->map, c->map_bytes);
    free(c);
}

uint64_t cache_capacity(const cache *c) { return c ? c->capacity : 0; }

uint32_t cache_rec_bytes(const cache *c) { return c->rec_size; }

/* ---------------------------------------------------------------- tables */

static inline uint64_t tab_home(const cshard *sh, uint64_t h) { return (h ^ (h >> 29)) & sh->tmask; }

/* The slot of id, or -1; lock-free (the caller checks the table version). */
/* The table entry of id, or NULL. */
static inline centry *tab_entry(const cshard *sh, int64_t id, uint64_t h)
{
    for (uint64_t i = tab_home(sh, h);; i = (i + 1) & sh->tmask) {
        uint32_t s1 = atomic_load_explicit(&sh->tab[i].slot1, memory_order_relaxed);
        if (!s1)
            return NULL;
        if (atomic_load_explicit(&sh->tab[i].key, memory_order_relaxed) == id)
            return &sh->tab[i];
    }
}

/* The slot an entry (or NULL) names, or -1. */
static inline int64_t entry_slot(const centry *e)
{
    return e ? (int64_t)atomic_load_explicit(&e->slot1, memory_order_relaxed) - 1 : -1;
}

static inline int64_t tab_find(const cshard *sh, int64_t id, uint64_t h) { return entry_slot(tab_entry(sh, id, h)); }

static void tab_insert(cshard *sh, int64_t id, uint64_t h, uint32_t si)
{
    uint64_t i = tab_home(sh, h);
    while (atomic_load_explicit(&sh->tab[i].slot1, memory_order_relaxed))
        i = (i + 1) & sh->tmask;
    atomic_store_explicit(&sh->tab[i].key, id, memory_order_relaxed);
    atomic_store_explicit(&sh->tab[i].heat, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->tab[i].slot1, si + 1, memory_order_relaxed);
}

/* Linear probing's backward-shift delete: no tombstones to age. */
static void tab_delete(cshard *sh, int64_t id, uint64_t h)
{
    uint64_t i = tab_home(sh, h);
    for (;; i = (i + 1) & sh->tmask) {
        uint32_t s1 = atomic_load_explicit(&sh->tab[i].slot1, memory_order_relaxed);
        if (!s1)
            return;
        if (atomic_load_explicit(&sh->tab[i].key, memory_order_relaxed) == id)
            break;
    }
    for (uint64_t j = i;;) {
        j = (j + 1) & sh->tmask;
        uint32_t s1 = atomic_load_explicit(&sh->tab[j].slot1, memory_order_relaxed);
        if (!s1)
            break;
        int64_t k = atomic_load_explicit(&sh->tab[j].key, memory_order_relaxed);
        uint64_t home = tab_home(sh, embkv__hash(k));
        /* j's entry may fill the hole at i unless its home lies in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        atomic_store_explicit(&sh->tab[i].key, k, memory_order_relaxed);
        atomic_store_explicit(&sh->tab[i].heat, atomic_load_explicit(&sh->tab[j].heat, memory_order_relaxed),
                              memory_order_relaxed);
        atomic_store_explicit(&sh->tab[i].slot1, s1, memory_order_relaxed);
        i = j;
    }
    atomic_store_explicit(&sh->tab[i].slot1, 0, memory_order_relaxed);
}

static inline void tver_begin(cshard *sh)
{
    atomic_store_explicit(&sh->tver, atomic_load_explicit(&sh->tver, memory_order_relaxed) + 1, memory_order_relaxed);
    seq_fence(__ATOMIC_RELEASE);
}
static inline void tver_end(cshard *sh)
{
    atomic_store_explicit(&sh->tver, atomic_load_explicit(&sh->tver, memory_order_relaxed) + 1, memory_order_release);
}
static inline void seq_begin(cslot *cs)
{
    atomic_store_explicit(&cs->seq, atomic_load_explicit(&cs->seq, memory_order_relaxed) + 1, memory_order_relaxed);
    seq_fence(__ATOMIC_RELEASE);
}
static inline void seq_end(cslot *cs)
{
    atomic_store_explicit(&cs->seq, atomic_load_explicit(&cs->seq, memory_order_relaxed) + 1, memory_order_release);
}

/* Slot content is copied in 8-byte atomic words under ThreadSanitizer (so
 * the seqlock's racing copies are visible to it as the atomics they are),
 * and with memcpy otherwise: the copy a torn read makes is thrown away by
 * the sequence check either way, and memcpy moves a row in a few vector
 * instructions. */
static inline void words_store(uint64_t *dst, const void *src, uint32_t words)
{
#ifdef EMBKV_TSAN
    const uint64_t *s = src;
    for (uint32_t i = 0; i < words; i++)
        __atomic_store_n(&dst[i], s[i], __ATOMIC_RELAXED);
#else
    memcpy(dst, src, (size_t)words * 8);
#endif
}
static inline void words_load(void *dst, const uint64_t *src, uint32_t from, uint32_t words)
{
#ifdef EMBKV_TSAN
    uint64_t *d = dst;
    for (uint32_t i = 0; i < words; i++)
        d[i] = __atomic_load_n(&src[from + i], __ATOMIC_RELAXED);
#else
    memcpy(dst, src + from, (size_t)words * 8);
#endif
}

/* Bytes [off, off + n) of a slot's record, read in whole atomic words. */
static void bytes_load(void *dst, const uint64_t *w, size_t off, size_t n)
{
    size_t first = off / 8, skip = off % 8, done = 0;
    if (skip == 0 && n % 8 == 0) {
        words_load(dst, w, (uint32_t)first, (uint32_t)(n / 8));
        return;
    }
    uint64_t tmp[32];
    for (size_t k = first; done < n;) {
        size_t m = (skip + (n - done) + 7) / 8;
        if (m > 32)
            m = 32;
        words_load(tmp, w, (uint32_t)k, (uint32_t)m);
        size_t take = m * 8 - skip < n - done ? m * 8 - skip : n - done;
        memcpy((char *)dst + done, (char *)tmp + skip, take);
        done += take;
        k += m;
        skip = 0;
    }
}

/* ---------------------------------------------------------------- reads */

void cache_prefetch(const cache *c, uint64_t h)
{
    const cshard *sh = &c->shards[h >> 58];
    __builtin_prefetch(&sh->tab[tab_home(sh, h)], 0, 3);
}

void cache_prefetch_slot(cache *c, int64_t si, int rw)
{
    const char *p = (const char *)slot_at(c, si);
    for (uint32_t off = 0; off < c->stride; off += 64) {
        if (rw)
            __builtin_prefetch(p + off, 1, 3);
        else
            __builtin_prefetch(p + off, 0, 3);
    }
}

/* A probe without the version check: a hint for the line fetches. */
static int64_t prefetch_slot(cache *c, int64_t id, uint64_t h, int rw)
{
    const cshard *sh = shard_of(c, h);
    int64_t si = tab_find(sh, id, h);
    if (si < 0)
        return -1;
    cache_prefetch_slot(c, si, rw);
    return si;
}

uint64_t cache_prefetch_wb(cache *c, int64_t id, uint64_t h)
{
    int64_t si = prefetch_slot(c, id, h, 0);
    return si < 0 ? LOC_NONE : __atomic_load_n(&slot_at(c, si)->wb, __ATOMIC_RELAXED);
}

/* The slot of id, or -1, from a probe no table change overlapped (a
 * lock-free reader's trusted answer; stable for a holder of id's key
 * lock, since only such a holder adds or drops id); with it (stamp not
 * NULL) the sketch stamp filed in id's entry, 0 if none. */
static int64_t stable_find(cache *c, int64_t id, uint64_t h, uint32_t *stamp)
{
    cshard *sh = shard_of(c, h);
    unsigned spins = 0;
    for (;;) {
        uint32_t v = atomic_load_explicit(&sh->tver, memory_order_acquire);
        if (v & 1) {
            ix_relax(&spins);
            continue;
        }
        const centry *e = tab_entry(sh, id, h);
        int64_t si = entry_slot(e);
        if (stamp)
            *stamp = e ? atomic_load_explicit(&e->heat, memory_order_relaxed) : 0;
        seq_fence(__ATOMIC_ACQUIRE);
        if (atomic_load_explicit(&sh->tver, memory_order_relaxed) == v)
            return si;
    }
}

static inline bool bit_get(cache *c, uint32_t si)
{
    return (atomic_load_explicit(&c->dirty[si / 64], memory_order_relaxed) >> (si % 64)) & 1;
}

int64_t cache_find(cache *c, int64_t id, uint64_t h, bool *dirty)
{
    int64_t si = stable_find(c, id, h, NULL);
    if (si >= 0 && dirty)
        *dirty = bit_get(c, (uint32_t)si);
    return si;
}


bool cache_contains(cache *c, int64_t id, uint64_t h) { return stable_find(c, id, h, NULL) >= 0; }

int64_t cache_find_heat(cache *c, int64_t id, uint64_t h, uint32_t *stamp) { return stable_find(c, id, h, stamp); }

void cache_heat_mark(cache *c, int64_t id, uint64_t h, uint32_t stamp)
{
    /* Under the shard's lock, which every change of its table holds: a
     * delete's backward shift would otherwise move another row into the
     * entry between the probe and the store.  Once per row and halving of
     * its counters, so the lock is rare. */
    cshard *sh = shard_of(c, h);
    shard_lock(sh);
    centry *e = tab_entry(sh, id, h);
    if (e)
        atomic_store_explicit(&e->heat, stamp, memory_order_relaxed);
    shard_unlock(sh);
}

/* Slot si's content, if it is id's (its id, and in use: an evicted or
 * removed slot keeps its id) and no write overlapped the copy: 1 copied,
 * 0 not id's, -1 a write in progress.  Id and use change only inside the
 * slot's sequence, so the one check covers them with the content. */
static int read_slot(cache *c, int64_t si, int64_t id, rec_hdr *hdr, float *vec, uint32_t dim, float *state,
                     uint32_t state_floats)
{
    cslot *cs = slot_at(c, si);
    uint32_t sv = atomic_load_explicit(&cs->seq, memory_order_acquire);
    if (sv & 1)
        return -1;
    if (atomic_load_explicit(&cs->id, memory_order_relaxed) != id ||
        !atomic_load_explicit(&cs->used, memory_order_relaxed))
        return 0;
    const uint64_t *w = slot_words(c, (uint32_t)si);
    rec_hdr hd;
    words_load(&hd, w, 0, sizeof hd / 8);
    /* (an encoded vector is copied out whole, then decoded once the copy
     * is known to be one version) */
    uint32_t enc[EMBKV_MAX_DIM / 2 + 4];
    bool coded = c->dtype != EMBKV_F32;
    if (vec)
        bytes_load(coded ? (void *)enc : (void *)vec, w, sizeof(rec_hdr), c->vec_bytes);
    if (state && state_floats)
        bytes_load(state, w, sizeof(rec_hdr) + c->vec_bytes, 4 * (size_t)state_floats);
    seq_fence(__ATOMIC_ACQUIRE);
    if (atomic_load_explicit(&cs->seq, memory_order_relaxed) != sv)
        return -1;
    if (vec && coded)
        dtype_decode((int)c->dtype, dim, enc, vec);
    if (hdr)
        *hdr = hd;
    if (!atomic_load_explicit(&cs->ref, memory_order_relaxed))
        atomic_store_explicit(&cs->ref, 1, memory_order_relaxed);
    if (pull_of == c)
        atomic_store_explicit(&cs->pulled, pull_stamp(c), memory_order_relaxed);
    return 1;
}

bool cache_read(cache *c, int64_t id, uint64_t h, rec_hdr *hdr, float *vec, uint32_t dim, float *state,
                uint32_t state_floats)
{
    cshard *sh = shard_of(c, h);
    unsigned spins = 0;
    for (;;) {
        uint32_t v = atomic_load_explicit(&sh->tver, memory_order_acquire);
        if (v & 1) {
            ix_relax(&spins);
            continue;
        }
        int64_t si = tab_find(sh, id, h);
        if (si < 0) {
            seq_fence(__ATOMIC_ACQUIRE);
            if (atomic_load_explicit(&sh->tver, memory_order_relaxed) == v)
                return false;
            continue;
        }
        if (read_slot(c, si, id, hdr, vec, dim, state, state_floats) > 0)
            return true;
        ix_relax(&spins);
    }
}

/* A slot cache_find gave within the caller's call, still id's and in use:
 * read without a probe; else as above. */
bool cache_read_at(cache *c, int64_t si, int64_t id, uint64_t h, rec_hdr *hdr, float *vec, uint32_t dim,
                   float *state, uint32_t state_floats)
{
    if (si >= 0 && read_slot(c, si, id, hdr, vec, dim, state, state_floats) > 0)
        return true;
    return cache_read(c, id, h, hdr, vec, dim, state, state_floats);
}

void cache_count(cache *c, uint64_t hits, uint64_t misses)
{
    if (hits)
        atomic_fetch_add_explicit(&c->hits, hits, memory_order_relaxed);
    if (misses)
        atomic_fetch_add_explicit(&c->misses, misses, memory_order_relaxed);
}

/* ------------------------------------------------ under the row's key lock */

static void set_dirty(cache *c, uint32_t si, bool dirty)
{
    uint64_t bit = 1ull << (si % 64);
    /* Already so (the common case: a hot row pushed again): no write to
     * the shared word. */
    if (((atomic_load_explicit(&c->dirty[si / 64], memory_order_relaxed) & bit) != 0) == dirty)
        return;
    uint64_t old = dirty ? atomic_fetch_or_explicit(&c->dirty[si / 64], bit, memory_order_relaxed)
                         : atomic_fetch_and_explicit(&c->dirty[si / 64], ~bit, memory_order_relaxed);
    if (dirty && !(old & bit))
        atomic_fetch_add_explicit(&c->ndirty, 1, memory_order_relaxed);
    else if (!dirty && (old & bit))
        atomic_fetch_sub_explicit(&c->ndirty, 1, memory_order_relaxed);
}

int64_t cache_load_locked(cache *c, int64_t id, uint64_t h, int64_t hint, void *rec)
{
    /* A slot that holds id and is in use at one moment while id's key lock
     * is held stays id's (only a holder evicts or removes it).  Id and use
     * are read as one state, checked by the slot's sequence: a free slot
     * that still holds id may meanwhile be handed to another row, under
     * that row's lock, not this one. */
    int64_t si = -1;
    if (hint >= 0) {
        cslot *cs = slot_at(c, hint);
        uint32_t sv = atomic_load_explicit(&cs->seq, memory_order_acquire);
        bool mine = !(sv & 1) && atomic_load_explicit(&cs->id, memory_order_relaxed) == id &&
                    atomic_load_explicit(&cs->used, memory_order_relaxed);
        seq_fence(__ATOMIC_ACQUIRE);
        if (mine && atomic_load_explicit(&cs->seq, memory_order_relaxed) == sv)
            si = hint;
    }
    if (si < 0)
        si = stable_find(c, id, h, NULL);
    if (si >= 0) {
        if (rec)
            words_load(rec, slot_words(c, (uint32_t)si), 0, c->words);
        cslot *cs = slot_at(c, si);
        if (!atomic_load_explicit(&cs->ref, memory_order_relaxed))
            atomic_store_explicit(&cs->ref, 1, memory_order_relaxed);
    }
    return si;
}

bool cache_slot_dirty(cache *c, int64_t si) { return bit_get(c, (uint32_t)si); }

void cache_store_locked(cache *c, int64_t si, const void *rec)
{
    cslot *cs = slot_at(c, si);
    seq_begin(cs);
    words_store(slot_words(c, (uint32_t)si), rec, c->words);
    seq_end(cs);
}

void *cache_update_begin(cache *c, int64_t si)
{
    seq_begin(slot_at(c, si));
    return slot_words(c, (uint32_t)si);
}

void cache_update_end(cache *c, int64_t si) { seq_end(slot_at(c, si)); }

void cache_mark_dirty_locked(cache *c, int64_t si, uint64_t wb)
{
    __atomic_store_n(&slot_at(c, si)->wb, wb, __ATOMIC_RELAXED);
    set_dirty(c, (uint32_t)si, true);
}

uint64_t cache_mark_clean_locked(cache *c, int64_t si)
{
    uint64_t wb = slot_at(c, si)->wb;
    __atomic_store_n(&slot_at(c, si)->wb, LOC_NONE, __ATOMIC_RELAXED);
    set_dirty(c, (uint32_t)si, false);
    atomic_fetch_add_explicit(&c->writebacks, 1, memory_order_relaxed);
    return wb;
}

uint64_t cache_slot_wb(cache *c, int64_t si) { return slot_at(c, si)->wb; }

uint64_t cache_remove_locked(cache *c, int64_t id, uint64_t h)
{
    cshard *sh = shard_of(c, h);
    uint64_t wb = LOC_NONE;
    shard_lock(sh);
    int64_t si = tab_find(sh, id, h);
    if (si >= 0) {
        cslot *cs = slot_at(c, si);
        tver_begin(sh);
        tab_delete(sh, id, h);
        tver_end(sh);
        seq_begin(cs);
        atomic_store_explicit(&cs->used, 0, memory_order_relaxed);
        atomic_fetch_sub_explicit(&sh->used, 1, memory_order_relaxed);
        seq_end(cs);
        if (bit_get(c, (uint32_t)si))
            wb = cs->wb;
        __atomic_store_n(&cs->wb, LOC_NONE, __ATOMIC_RELAXED);
        set_dirty(c, (uint32_t)si, false);
    }
    shard_unlock(sh);
    return wb;
}

/* A slot for a new row: a free one, or a victim's (see the top). */
static int64_t take_slot(embkv_store *s, cache *c, cshard *sh, uint64_t cand_h, bool force)
{
    if (atomic_load_explicit(&sh->used, memory_order_relaxed) < sh->n) {
        for (uint32_t k = 0; k < sh->n; k++) {
            uint32_t si = sh->base + (sh->hand + k) % sh->n;
            if (!atomic_load_explicit(&slot_at(c, si)->used, memory_order_relaxed)) {
                sh->hand = (sh->hand + k + 1) % sh->n;
                return si;
            }
        }
    }
    unsigned cand = heat_estimate(s->heat, cand_h);
    /* Pulled rows are passed over first; only a shard with nothing else
     * to give (all its candidates pulled lately) gives one of them: the
     * shield must not pin a cache smaller than the pulls in flight. */
    bool shield = true, shielded = false;
again:
    for (uint32_t k = 0; k < EVICT_SCAN && k < 2 * sh->n; k++) {
        uint32_t si = sh->base + sh->hand;
        sh->hand = (sh->hand + 1) % sh->n;
        cslot *cs = slot_at(c, si);
        if (atomic_load_explicit(&cs->ref, memory_order_relaxed)) {
            atomic_store_explicit(&cs->ref, 0, memory_order_relaxed);
            continue;
        }
        if (bit_get(c, si))
            continue;
        if (shield && pull_shielded(c, cs)) {
            shielded = true;
            continue;
        }
        int64_t vid = atomic_load_explicit(&cs->id, memory_order_relaxed);
        uint64_t vh = embkv__hash(vid);
        unsigned vheat = heat_estimate(s->heat, vh);
        if (atomic_load_explicit(&c->bar, memory_order_relaxed) != vheat)
            atomic_store_explicit(&c->bar, vheat, memory_order_relaxed);
        if (cand <= vheat) {
            if (force)
                continue;  /* a move passes over rows as hot as it */
            atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
            return -1;
        }
        if (!keylock_try(s, vh))
            continue;
        /* Under the victim's lock it stays clean. */
        if (bit_get(c, si)) {
            keylock_release(s, vh);
            continue;
        }
        tver_begin(sh);
        tab_delete(sh, vid, vh);
        tver_end(sh);
        seq_begin(cs);
        atomic_store_explicit(&cs->used, 0, memory_order_relaxed);
        atomic_fetch_sub_explicit(&sh->used, 1, memory_order_relaxed);
        seq_end(cs);
        keylock_release(s, vh);
        atomic_fetch_add_explicit(&c->evictions, 1, memory_order_relaxed);
        return si;
    }
    if (shield && shielded) {
        shield = false;
        goto again;
    }
    atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed);
    return -1;
}

bool cache_worth_admitting(embkv_store *s, cache *c, uint64_t h)
{
    const cshard *sh = shard_of(c, h);
    if (atomic_load_explicit(&sh->used, memory_order_relaxed) < sh->n)
        return true;
    unsigned bar = atomic_load_explicit(&c->bar, memory_order_relaxed);
    if (heat_estimate(s->heat, h) > bar)
        return true;
    /* The bar is one victim's heat, and only a candidate that gets past it
     * weighs another victim: once a row at the sketch's top was weighed
     * nothing would come in again, whatever the workload turns to.  So
     * every 64 refusals it comes down a step, until a victim weighed sets
     * it again. */
    if ((atomic_fetch_add_explicit(&c->refused, 1, memory_order_relaxed) & 63) == 63 && bar)
        atomic_compare_exchange_strong_explicit(&c->bar, &bar, bar - 1, memory_order_relaxed,
                                                memory_order_relaxed);
    return false;
}

bool cache_admit_locked(embkv_store *s, cache *c, int64_t id, uint64_t h, const void *rec, bool force)
{
    if (!force && !cache_worth_admitting(s, c, h))
        return false;
    cshard *sh = shard_of(c, h);
    shard_lock(sh);
    if (tab_find(sh, id, h) >= 0) {
        shard_unlock(sh);
        return false;
    }
    int64_t si = take_slot(s, c, sh, h, force);
    if (si < 0) {
        shard_unlock(sh);
        return false;
    }
    cslot *cs = slot_at(c, si);
    seq_begin(cs);
    atomic_store_explicit(&cs->id, id, memory_order_relaxed);
    words_store(slot_words(c, (uint32_t)si), rec, c->words);
    atomic_store_explicit(&cs->used, 1, memory_order_relaxed);
    atomic_store_explicit(&cs->ref, 1, memory_order_relaxed);
    atomic_store_explicit(&cs->pulled, pull_of == c ? pull_stamp(c) : 0, memory_order_relaxed);
    seq_end(cs);
    atomic_fetch_add_explicit(&sh->used, 1, memory_order_relaxed);
    tver_begin(sh);
    tab_insert(sh, id, h, (uint32_t)si);
    tver_end(sh);
    __atomic_store_n(&cs->wb, LOC_NONE, __ATOMIC_RELAXED);
    set_dirty(c, (uint32_t)si, false);
    shard_unlock(sh);
    atomic_fetch_add_explicit(&c->admissions, 1, memory_order_relaxed);
    return true;
}

/* ---------------------------------------------------------------- dirty rows */

uint64_t cache_ndirty(const cache *c) { return c ? atomic_load(&c->ndirty) : 0; }

int cache_dirty_ids(cache *c, int64_t **ids, size_t *n)
{
    *n = 0;
    *ids = NULL;
    size_t cap = atomic_load(&c->ndirty) + 64, k = 0;
    int64_t *out = malloc(cap * sizeof *out);
    if (!out)
        return EMBKV_NOMEM;
    for (size_t w = 0; w < c->dirty_words; w++) {
        uint64_t bits = atomic_load_explicit(&c->dirty[w], memory_order_relaxed);
        while (bits) {
            uint32_t si = (uint32_t)(w * 64 + (unsigned)__builtin_ctzll(bits));
            bits &= bits - 1;
            if (k == cap) {
                size_t nc = cap * 2;
                int64_t *p = realloc(out, nc * sizeof *p);
                if (!p) {
                    free(out);
                    return EMBKV_NOMEM;
                }
                out = p;
                cap = nc;
            }
            out[k++] = atomic_load_explicit(&slot_at(c, si)->id, memory_order_relaxed);
        }
    }
    *ids = out;
    *n = k;
    return EMBKV_OK;
}

int cache_clean_ahead(cache *c, size_t want, int64_t **ids, size_t *n)
{
    *n = 0;
    *ids = NULL;
    if (!want)
        return EMBKV_OK;
    int64_t *out = malloc((want + CACHE_SHARDS) * sizeof *out);
    if (!out)
        return EMBKV_NOMEM;
    size_t k = 0;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        cshard *sh = &c->shards[i];
        if (!sh->n)
            continue;
        /* The shard's share, rounded up (so at most one more per shard). */
        size_t quota = (size_t)((want * (uint64_t)sh->n + c->capacity - 1) / c->capacity), got = 0;
        shard_lock(sh);
        /* Unreferenced rows first: the hand's next victims.  Referenced
         * ones only to fill the share (the hand clears their bits as it
         * passes, so they are the victims of its next turn). */
        for (int pass = 0; pass < 2 && got < quota; pass++)
            for (uint32_t j = 0; j < sh->n && got < quota; j++) {
                uint32_t si = sh->base + (sh->hand + j) % sh->n;
                cslot *cs = slot_at(c, si);
                if (!atomic_load_explicit(&cs->used, memory_order_relaxed) || !bit_get(c, si) ||
                    (atomic_load_explicit(&cs->ref, memory_order_relaxed) != 0) != (pass == 1))
                    continue;
                out[k++] = atomic_load_explicit(&cs->id, memory_order_relaxed);
                got++;
            }
        shard_unlock(sh);
    }
    *ids = out;
    *n = k;
    return EMBKV_OK;
}

uint64_t cache_heat_stamped(cache *c)
{
    uint64_t k = 0;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        cshard *sh = &c->shards[i];
        shard_lock(sh);
        for (uint64_t e = 0; sh->tab && e <= sh->tmask; e++)
            k += atomic_load_explicit(&sh->tab[e].slot1, memory_order_relaxed) &&
                 atomic_load_explicit(&sh->tab[e].heat, memory_order_relaxed);
        shard_unlock(sh);
    }
    return k;
}

void cache_stats(const cache *c, embkv_stats *st)
{
    if (!c)
        return;
    uint64_t rows = 0;
    for (int i = 0; i < CACHE_SHARDS; i++) {
        cshard *sh = (cshard *)&c->shards[i];
        shard_lock(sh);
        rows += atomic_load_explicit(&sh->used, memory_order_relaxed);
        shard_unlock(sh);
    }
    st->cache_capacity_rows = c->capacity;
    st->cache_rows = rows;
    /* What the rows take when the cache is full (the mapping is reserved
     * in 2 MiB pages beyond that, untouched). */
    st->cache_bytes = cache_bytes_for(c->capacity, c->rec_size);
    st->cache_dirty = atomic_load(&c->ndirty);
    st->cache_hits = atomic_load(&c->hits);
    st->cache_misses = atomic_load(&c->misses);
    st->cache_admissions = atomic_load(&c->admissions);
    st->cache_evictions = atomic_load(&c->evictions);
    st->cache_writebacks = atomic_load(&c->writebacks);
    st->cache_refused = atomic_load(&c->refused);
    st->cache_huge_pages = c->huge;
}
