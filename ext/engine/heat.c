/*
 * heat.c - the access-frequency sketch behind tier placement (heat.h).
 *
 * Layout: a table of 64-byte blocks, one block per 8 expected ids, each
 * block 8 words of 16 4-bit counters.  An id's hash picks one block and, in
 * it, one counter in each of 4 rows (row i is words 2i and 2i+1: 32
 * counters).  So a touch or an estimate reads one cache line, whatever the
 * size of the table: at billions of ids the table is far larger than any
 * cache and the miss is the whole cost, which heat_touch_batch hides by
 * prefetching the lines of the ids further on in the batch.  The block is
 * picked by a multiply-shift of the hash (no power-of-two rounding, so
 * memory follows expected_ids), the counters by a remix of it (the block
 * takes the high bits, the index's home bucket the low ones).
 *
 * Why 4-bit counters, 4 rows, 16 counters per id: a placement decision
 * only compares ids, and "touched 15 times in the last window" is hot
 * enough; that is TinyLFU's (and Caffeine's) choice, 8 bytes per id.
 *
 * Conservative update: a touch raises only the counters equal to the
 * minimum of its 4.  An id's estimate stays at least its count (the
 * count-min property) and ids sharing a counter inflate each other far
 * less than with plain increments, which matters for a long tail of ids
 * read once.  No doorkeeper (a Bloom filter absorbing first touches): it
 * would cost a second cache miss per touch, and conservative update plus
 * halving already keeps one-off touches from accumulating.
 *
 * Concurrency: every word is an _Atomic uint64_t changed by
 * compare-and-swap only, with relaxed ordering (nothing else is published
 * through it).  A touch never writes a counter back from a stale read, so
 * it cannot undo a halving or another id's increment, and a saturated id
 * (the hottest, read by every thread) is never written at all, so its line
 * stays shared between cores.  Two touches of one id racing may count
 * once, which is fine for statistics.
 *
 * Stamps (heat_stamp): a saturated id stays saturated until a halving
 * reaches its block, so a caller that saw it saturated may skip its
 * touches until then; the count of halvings per block is what the stamp
 * names.  The sweep claims blocks (swept) before it halves them (halved),
 * and no stamp is given while the two differ.
 *
 * Aging: TinyLFU halves all counters after a sample of W touches.  Here a
 * block is halved every W / nblocks counted touches, in order, by the
 * threads whose batches move the count past it (claimed on `swept` with a
 * compare-and-swap, so each block is halved once per round): each counter
 * is halved once per W, as a sweep rather than a stop of one unlucky
 * reader for the whole table (gigabytes at the sizes this is for).  Only
 * touches that raised a counter count toward W, so a hot set that sits at
 * the cap does not drain itself.  heat_age halves the table on top of the
 * sweep without moving it.
 */
#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "heat.h"

#define IDS_PER_BLOCK 8
#define WORDS_PER_BLOCK 8
#define MIN_BLOCKS 16
/* The aging window, in counted touches per expected id (TinyLFU's W/C). */
#define WINDOW_PER_ID 10
#define HALF_MASK 0x7777777777777777ull
/* Tables of this size or more are mapped in huge pages (heat_new). */
#define HUGE_FROM (4u << 20)

struct heat {
    _Atomic uint64_t *table;   /* nblocks * WORDS_PER_BLOCK words, 64-byte aligned */
    void *mem;                 /* the allocation table lies in */
    uint64_t nblocks;
    uint64_t per_block;        /* counted touches between two block halvings */
    size_t bytes;
    bool mapped;               /* mem is a mapping of bytes - sizeof(heat) bytes */
    alignas(64) _Atomic uint64_t touches;
    _Atomic uint64_t counted;  /* touches that raised a counter */
    _Atomic uint64_t swept;    /* blocks the sweep has claimed so far (all rounds) */
    _Atomic uint64_t halved;   /* of those, blocks whose halving is done */
    _Atomic uint64_t skipped;  /* heat_count touches (tests) */
    _Atomic uint64_t forced;   /* heat_age calls */
};

heat *heat_new(uint64_t expected_ids)
{
    if (expected_ids > HEAT_MAX_IDS) {
        errno = EINVAL;
        return NULL;
    }
    uint64_t nblocks = (expected_ids + IDS_PER_BLOCK - 1) / IDS_PER_BLOCK;
    if (nblocks < MIN_BLOCKS)
        nblocks = MIN_BLOCKS;
    /* At most 2^33 blocks of 64 bytes: no product below overflows a 64-bit
     * size_t; a 32-bit one is checked. */
    if (nblocks > (SIZE_MAX - 64 - sizeof(heat)) / (WORDS_PER_BLOCK * sizeof(uint64_t))) {
        errno = ENOMEM;
        return NULL;
    }
    size_t table_bytes = (size_t)nblocks * WORDS_PER_BLOCK * sizeof(uint64_t);
    heat *h = aligned_alloc(64, sizeof *h);
    if (!h)
        return NULL;
    /* Zero pages, untouched until ids land in them (calloc, or a mapping).
     * A table of megabytes is mapped and advised huge pages: every touch
     * lands on a random line of it, and with 4 KiB pages each would be a
     * TLB miss too (measured: most of a touch's time at 2M ids). */
    h->mapped = table_bytes >= HUGE_FROM;
    if (h->mapped) {
        h->mem = mmap(NULL, table_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
                      0);
        if (h->mem == MAP_FAILED)
            h->mem = NULL;
#ifdef MADV_HUGEPAGE
        else
            (void)madvise(h->mem, table_bytes, MADV_HUGEPAGE);  /* a hint: 4 KiB pages work too */
#endif
    } else {
        h->mem = calloc(1, table_bytes + 64);
    }
    if (!h->mem) {
        free(h);
        errno = ENOMEM;
        return NULL;
    }
    h->table = (_Atomic uint64_t *)(((uintptr_t)h->mem + 63) & ~(uintptr_t)63);
    h->nblocks = nblocks;
    h->per_block = (uint64_t)IDS_PER_BLOCK * WINDOW_PER_ID;
    h->bytes = sizeof *h + table_bytes + (h->mapped ? 0 : 64);
    atomic_init(&h->touches, 0);
    atomic_init(&h->counted, 0);
    atomic_init(&h->swept, 0);
    atomic_init(&h->halved, 0);
    atomic_init(&h->skipped, 0);
    atomic_init(&h->forced, 0);
    return h;
}

void heat_free(heat *h)
{
    if (!h)
        return;
    if (h->mapped)
        munmap(h->mem, h->bytes - sizeof *h);
    else
        free(h->mem);
    free(h);
}

static inline _Atomic uint64_t *block_of(const heat *h, uint64_t hash)
{
    uint64_t b = (uint64_t)(((unsigned __int128)hash * h->nblocks) >> 64);
    return h->table + b * WORDS_PER_BLOCK;
}

/* 8 bits per row: bit 0 picks the row's word, bits 1-4 the counter in it. */
static inline uint32_t counter_bits(uint64_t hash)
{
    uint64_t x = (hash ^ (hash >> 31)) * 0x94d049bb133111ebull;
    return (uint32_t)(x >> 32);
}

static inline _Atomic uint64_t *row_word(_Atomic uint64_t *blk, uint32_t cb, int row)
{
    return blk + 2 * row + ((cb >> (8 * row)) & 1);
}

static inline unsigned row_shift(uint32_t cb, int row)
{
    return ((cb >> (8 * row + 1)) & 15) * 4;
}

/* One touch; true when it raised a counter. */
static inline bool bump(heat *h, uint64_t hash)
{
    _Atomic uint64_t *blk = block_of(h, hash);
    uint32_t cb = counter_bits(hash);
    unsigned c[4], m = HEAT_MAX_COUNT;
    for (int r = 0; r < 4; r++) {
        uint64_t w = atomic_load_explicit(row_word(blk, cb, r), memory_order_relaxed);
        c[r] = (unsigned)(w >> row_shift(cb, r)) & 15;
        if (c[r] < m)
            m = c[r];
    }
    if (m == HEAT_MAX_COUNT)
        return false;
    for (int r = 0; r < 4; r++) {
        if (c[r] != m)
            continue;
        _Atomic uint64_t *wp = row_word(blk, cb, r);
        unsigned sh = row_shift(cb, r);
        uint64_t w = atomic_load_explicit(wp, memory_order_relaxed);
        /* Raise to m + 1 at most: a counter another touch already took
         * past m stays, one halved meanwhile stays below m + 1 (m < 15,
         * so the add never carries into the neighbour). */
        while (((w >> sh) & 15) <= m &&
               !atomic_compare_exchange_weak_explicit(wp, &w, w + (1ull << sh),
                                                      memory_order_relaxed, memory_order_relaxed))
            ;
    }
    return true;
}

static void halve_blocks(heat *h, uint64_t from, uint64_t to)
{
    uint64_t b = from % h->nblocks;
    for (uint64_t i = from; i < to; i++) {
        _Atomic uint64_t *blk = h->table + b * WORDS_PER_BLOCK;
        for (int j = 0; j < WORDS_PER_BLOCK; j++) {
            uint64_t w = atomic_load_explicit(&blk[j], memory_order_relaxed);
            while (w && !atomic_compare_exchange_weak_explicit(&blk[j], &w, (w >> 1) & HALF_MASK,
                                                               memory_order_relaxed, memory_order_relaxed))
                ;
        }
        if (++b == h->nblocks)
            b = 0;
    }
}

/* Counts a batch and halves the blocks whose turn it has become: block b
 * of round k at (k + 1) x W + b x per_block counted touches.  The sweep
 * runs one window behind so that nothing is halved in the first window
 * (whatever was counted then is still whole). */
static void account(heat *h, uint64_t n, uint64_t raised)
{
    atomic_fetch_add_explicit(&h->touches, n, memory_order_relaxed);
    if (!raised)
        return;
    uint64_t due = (atomic_fetch_add_explicit(&h->counted, raised, memory_order_relaxed) + raised) / h->per_block;
    if (due <= h->nblocks)
        return;
    due -= h->nblocks;
    uint64_t s = atomic_load_explicit(&h->swept, memory_order_relaxed);
    while (s < due) {
        if (atomic_compare_exchange_weak_explicit(&h->swept, &s, due, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            halve_blocks(h, s, due);
            atomic_fetch_add_explicit(&h->halved, due - s, memory_order_release);
            break;
        }
    }
}

void heat_touch(heat *h, uint64_t hash)
{
    account(h, 1, bump(h, hash));
}

void heat_touch_batch(heat *h, const uint64_t *hashes, size_t n)
{
    heat_touch_batch_sat(h, hashes, n, NULL);
}

void heat_touch_batch_sat(heat *h, const uint64_t *hashes, size_t n, uint8_t *saturated)
{
    /* Far enough ahead to cover a DRAM miss at ~10-20 ns per touch. */
    enum { AHEAD = 12 };
    uint64_t raised = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n)
            __builtin_prefetch((const void *)block_of(h, hashes[i + AHEAD]), 1, 3);
        /* bump raises a counter unless all four are at the cap */
        bool r = bump(h, hashes[i]);
        if (saturated)
            saturated[i] = !r;
        raised += r;
    }
    if (n)
        account(h, n, raised);
}

void heat_count(heat *h, uint64_t n)
{
    if (n) {
        account(h, n, 0);
        atomic_fetch_add_explicit(&h->skipped, n, memory_order_relaxed);
    }
}

uint64_t heat_skipped(const heat *h)
{
    return atomic_load_explicit(&h->skipped, memory_order_relaxed);
}

void heat_clock_now(const heat *h, heat_clock *k)
{
    /* Block b has been halved once per sweep past it: round + (b < rem)
     * times, blocks being swept in order from 0.  The sweep claims blocks
     * (swept) before it halves them (halved): in between, a touch may
     * find a counter at the cap that is about to be halved, so no stamp is
     * given then.  heat_age halves first and counts after, so a stamp
     * taken before its count is stale once it is made. */
    uint64_t swept = atomic_load_explicit(&h->swept, memory_order_acquire);
    uint64_t halved = atomic_load_explicit(&h->halved, memory_order_acquire);
    k->settled = swept == halved;
    k->round = swept / h->nblocks;
    k->rem = swept % h->nblocks;
    k->forced = atomic_load_explicit(&h->forced, memory_order_acquire);
}

uint32_t heat_stamp(const heat *h, const heat_clock *k, uint64_t hash)
{
    if (!k->settled)
        return 0;
    uint64_t b = (uint64_t)(((unsigned __int128)hash * h->nblocks) >> 64);
    uint64_t halvings = k->round + (b < k->rem) + k->forced;
    /* 8 bits of a remix of the hash: the cache's shard and table home
     * take the hash's own high and low bits, shared by the rows whose
     * entries a stamp could be misfiled on. */
    uint32_t st = (uint32_t)(halvings << 8) | (uint32_t)((hash * 0x9e3779b97f4a7c15ull) >> 56);
    return st ? st : 1;
}

void heat_saturate_batch(heat *h, const uint64_t *hashes, size_t n)
{
    for (unsigned t = 0; t < HEAT_MAX_COUNT; t++)
        heat_touch_batch(h, hashes, n);
}

unsigned heat_estimate(const heat *h, uint64_t hash)
{
    _Atomic uint64_t *blk = block_of(h, hash);
    uint32_t cb = counter_bits(hash);
    unsigned m = HEAT_MAX_COUNT;
    for (int r = 0; r < 4; r++) {
        uint64_t w = atomic_load_explicit(row_word(blk, cb, r), memory_order_relaxed);
        unsigned c = (unsigned)(w >> row_shift(cb, r)) & 15;
        if (c < m)
            m = c;
    }
    return m;
}

bool heat_admit(const heat *h, uint64_t cand_hash, uint64_t victim_hash)
{
    return heat_estimate(h, cand_hash) > heat_estimate(h, victim_hash);
}

void heat_age(heat *h)
{
    halve_blocks(h, 0, h->nblocks);
    atomic_fetch_add_explicit(&h->forced, 1, memory_order_relaxed);
}

uint64_t heat_touches(const heat *h)
{
    return atomic_load_explicit(&h->touches, memory_order_relaxed);
}

uint64_t heat_agings(const heat *h)
{
    return atomic_load_explicit(&h->swept, memory_order_relaxed) / h->nblocks +
           atomic_load_explicit(&h->forced, memory_order_relaxed);
}

size_t heat_bytes(const heat *h)
{
    return h->bytes;
}
