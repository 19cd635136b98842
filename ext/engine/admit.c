/*
 * admit.c - admission of new ids: how many times a missing id was pulled.
 *
 * A table with admit='count(N)' stores an id from its N-th pull on
 * (train.c); before that, a pull returns the id's initial values without
 * creating the row, and a push of it is dropped.  What that needs is a
 * count per id that has no row, for ids that may never get one: an
 * unbounded stream of them (every id a recommender ever sees), so the
 * counts live in a count-min sketch of fixed size (DeepRec's
 * CounterFilter keeps exact counts in the table itself; an id that has no
 * row here has nowhere else to keep one).
 *
 * Layout: 4 rows of `width` 8-bit counters (width a power of two), one
 * counter per row picked by a remix of the id's hash.  An id's count is the
 * least of its 4 (never below the true count); a touch raises only the
 * counters equal to that least (conservative update), so ids sharing a
 * counter inflate each other far less.  A false admission (an id admitted
 * before its N-th pull) needs all 4 of its counters raised by others: with
 * M ids counted into width w the chance is about (M/w)^4 for N = 2, and
 * smaller for larger N.  Counters stop at 255.  Counting is in DRAM only:
 * counts do not survive a restart (an id half way to N starts over).
 *
 * Concurrency: counters are atomic bytes changed by compare-and-swap, so
 * two pulls of one id at once may count once (the id is admitted one pull
 * later), never more than the touches.
 */
#include <stdlib.h>

#include "ops.h"

struct admit_sketch {
    _Atomic uint8_t *cnt;      /* 4 * width */
    uint64_t mask;             /* width - 1 */
};

admit_sketch *admit_new(uint64_t expected_ids)
{
    uint64_t width = 1u << 16;
    /* Twice the ids expected, so that a table's worth of one-off ids
     * admits very few falsely; at most 64M counters a row (256 MiB). */
    while (width < 2 * expected_ids && width < (1ull << 26))
        width <<= 1;
    admit_sketch *a = malloc(sizeof *a);
    if (!a)
        return NULL;
    a->cnt = calloc(4 * width, 1);
    a->mask = width - 1;
    if (!a->cnt) {
        free(a);
        return NULL;
    }
    return a;
}

void admit_free(admit_sketch *a)
{
    if (a) {
        free((void *)a->cnt);
        free(a);
    }
}

size_t admit_bytes(const admit_sketch *a)
{
    return a ? (size_t)(4 * (a->mask + 1)) : 0;
}

static inline uint64_t counter_at(const admit_sketch *a, uint64_t h, int row)
{
    /* One multiply per row from the hash: independent enough for 4 rows
     * of a count-min sketch, and no second hash of the id. */
    static const uint64_t k[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
                                  0xd6e8feb86659fd93ull};
    return (uint64_t)row * (a->mask + 1) + (((h ^ (h >> 29)) * k[row]) >> 32 & a->mask);
}

unsigned admit_touch(admit_sketch *a, int64_t id)
{
    uint64_t h = embkv__hash(id);
    uint8_t c[4], m = 255;
    for (int r = 0; r < 4; r++) {
        c[r] = atomic_load_explicit(&a->cnt[counter_at(a, h, r)], memory_order_relaxed);
        if (c[r] < m)
            m = c[r];
    }
    if (m == 255)
        return 255;
    for (int r = 0; r < 4; r++) {
        if (c[r] != m)
            continue;
        _Atomic uint8_t *p = &a->cnt[counter_at(a, h, r)];
        uint8_t v = atomic_load_explicit(p, memory_order_relaxed);
        /* Up to m + 1 at most: a counter another touch took past m stays. */
        while (v <= m && !atomic_compare_exchange_weak_explicit(p, &v, (uint8_t)(v + 1), memory_order_relaxed,
                                                                memory_order_relaxed))
            ;
    }
    return (unsigned)m + 1;
}
