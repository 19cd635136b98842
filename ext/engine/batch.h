/*
 * batch.h - layer 4: what the batch loops of write.c and read.c share.
 *
 * The pipeline's distances (how many ids ahead a bucket, a record, the
 * cache's table line are prefetched), the prefetches themselves, and the
 * buffer that counts a batch's accesses in the sketch 128 ids at a time.
 * Inline, because they sit inside the per-row loops.
 */
#ifndef EMBKV_BATCH_H
#define EMBKV_BATCH_H

#include "ops.h"

#define PF_BUCKET 16  /* ids ahead whose home bucket is prefetched */
#define PF_RECORD 6   /* ids ahead whose record is prefetched */
#define PF_CACHE 4    /* with a cache: ids after its table line was fetched, the probe */

/* All of a bucket (rw: 0 to read, 1 to write; a constant): the fingerprints
 * are in its first line, the matching slot may be in any of the four. */
#define PREFETCH_BUCKET(b, rw)                                          \
    do {                                                                \
        const char *pb_ = (const char *)(b);                            \
        for (size_t pb_off = 0; pb_off < sizeof(bucket); pb_off += 64)  \
            __builtin_prefetch(pb_ + pb_off, (rw), 3);                  \
    } while (0)
#define RING 32

/* Whether accesses count in the access statistics (handle.h: heat_live). */
static inline bool heat_counting(const embkv_store *s)
{
    return atomic_load_explicit(&s->heat_live, memory_order_relaxed) != 0;
}

static inline void prefetch_record(embkv_store *s, uint64_t loc)
{
    const char *p = (const char *)rec_vec(rec_at(s, loc));  /* line aligned */
    size_t bytes = 4 * (size_t)s->dim;
    if (bytes > 16 * 64)
        bytes = 16 * 64;
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(p + off, 0, 3);
}

/* The access statistics of a batch, gathered and counted 128 ids at a
 * time: heat_touch_batch prefetches the sketch's lines ahead and updates
 * its shared counters once, where a touch per id would wait for a cache
 * miss and two atomic adds in the middle of the batch pipeline (a third of
 * a batch get's time, measured). */
enum { HEAT_BUF = 128 };
typedef struct heat_buf {
    size_t n;
    uint64_t h[HEAT_BUF];
    /* A pull with a cache: the cached rows whose touch may find them
     * saturated (id[k] set, else -1), filed so in the cache's table after
     * the touches; and those found filed so under the clock, counted only
     * (skipped, which take their places in the buffer's window, so that the
     * touches are counted, and the sketch aged, at the same points of the
     * batch as without a cache). */
    bool marking;
    int64_t id[HEAT_BUF];
    size_t skipped;
    heat_clock clk;
} heat_buf;

static inline void heat_buf_init(embkv_store *s, heat_buf *b, bool marking)
{
    b->n = 0;
    b->skipped = 0;
    b->marking = marking && s->heat;
    if (b->marking)
        heat_clock_now(s->heat, &b->clk);
}

static inline void heat_buf_touch(embkv_store *s, heat_buf *b)
{
    if (!b->marking) {
        if (b->n)
            heat_touch_batch(s->heat, b->h, b->n);
    } else {
        uint8_t sat[HEAT_BUF];
        if (b->n)
            heat_touch_batch_sat(s->heat, b->h, b->n, sat);
        heat_count(s->heat, b->skipped);
        /* Stamps under the clock taken before these touches: one taken
         * after could name a halving their own counting ran. */
        for (size_t k = 0; k < b->n; k++)
            if (sat[k] && b->id[k] >= 0) {
                uint32_t st = heat_stamp(s->heat, &b->clk, b->h[k]);
                if (st)
                    cache_heat_mark(s->cache, b->id[k], b->h[k], st);
            }
        heat_clock_now(s->heat, &b->clk);
    }
    b->n = 0;
    b->skipped = 0;
}

/* id: a cached row's (its touch files a stamp when saturated), or -1. */
static inline void heat_add(embkv_store *s, heat_buf *b, uint64_t h, int64_t id)
{
    if (b->marking)
        b->id[b->n] = id;
    b->h[b->n++] = h;
    if (b->n + b->skipped == HEAT_BUF)
        heat_buf_touch(s, b);
}

/* A touch known to change nothing: counted, in its place. */
static inline void heat_skip(embkv_store *s, heat_buf *b)
{
    if (++b->skipped + b->n == HEAT_BUF)
        heat_buf_touch(s, b);
}

static inline void heat_flush(embkv_store *s, heat_buf *b)
{
    if ((b->n || b->skipped) && s->heat)
        heat_buf_touch(s, b);
}

#endif
