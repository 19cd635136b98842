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
 * least of its 4 (never below the true count since the last halving); a
 * touch raises all 4 (admit_touch says why not only the least ones).  A
 * false admission (an id admitted before its N-th pull) needs all 4 of its
 * counters raised by others: with M ids counted into width w the chance is
 * about (1 - e^(-M/w))^4 for N = 2, and smaller for larger N.  Counters stop at 255, and are halved every
 * width / 4 touches (halve).  Counting is in DRAM only: counts do not
 * survive a restart (an id half way to N starts over).
 *
 * Concurrency: counters are atomic bytes changed by compare-and-swap, one
 * increment per touch and counter, so pulls of one id at once each count;
 * a touch racing a halving may be halved with it.
 */
#include <stdlib.h>

#include "ops.h"

struct admit_sketch {
    _Atomic uint8_t *cnt;      /* 4 * width */
    uint64_t mask;             /* width - 1 */
    atomic_uint_fast64_t touches;  /* since the last halving */
};

admit_sketch *admit_new(uint64_t expected_ids)
{
    uint64_t width = 1u << 16;
    /* Four counters a row per id expected (16 bytes an id), at most 64M
     * (256 MiB in all): with the halving every width / 4 touches, a
     * counter holds at most about 1/4 of a touch of one-off ids, and a
     * one-off id rarely finds all 4 of its counters raised by others
     * (tests/test_admit.c measures 0.09% at N = 2 for a stream ten times
     * the table). */
    while (width < 4 * expected_ids && width < (1ull << 26))
        width <<= 1;
    admit_sketch *a = malloc(sizeof *a);
    if (!a)
        return NULL;
    a->cnt = calloc(4 * width, 1);
    a->mask = width - 1;
    atomic_init(&a->touches, 0);
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
    /* A full remix per row (splitmix's finalizer of the hash plus the
     * row): the 4 rows' counters of an id must be independent choices for
     * the count-min bound to hold. */
    uint64_t x = h + (uint64_t)(row + 1) * 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint64_t)row * (a->mask + 1) + (x & a->mask);
}

/* Every width / 4 touches the counters are halved (the thread whose touch
 * crosses the mark does it): a stream of ids seen once, far longer than
 * the table, would otherwise raise every counter in the end and admit
 * everything.  So admission asks for N pulls within about the last
 * width / 4 pulls of missing ids (about the table's rows, at least), as
 * TinyLFU's sample window does. */
static void halve(admit_sketch *a)
{
    for (uint64_t i = 0; i < 4 * (a->mask + 1); i++) {
        uint8_t v = atomic_load_explicit(&a->cnt[i], memory_order_relaxed);
        if (v)
            atomic_store_explicit(&a->cnt[i], (uint8_t)(v >> 1), memory_order_relaxed);
    }
}

unsigned admit_touch(admit_sketch *a, int64_t id)
{
    if (atomic_fetch_add_explicit(&a->touches, 1, memory_order_relaxed) == a->mask / 4) {
        atomic_store_explicit(&a->touches, 0, memory_order_relaxed);
        halve(a);
    }
    /* Every counter of the id goes up by one (a plain count-min update,
     * not the conservative one that raises only those at the least): a
     * conservative touch racing another touch of the same id can read one
     * counter already raised and leave it out, losing a count, and then
     * an id would not be admitted at its N-th pull. */
    uint64_t h = embkv__hash(id);
    for (int r = 0; r < 4; r++) {
        _Atomic uint8_t *p = &a->cnt[counter_at(a, h, r)];
        uint8_t v = atomic_load_explicit(p, memory_order_relaxed);
        while (v < 255 && !atomic_compare_exchange_weak_explicit(p, &v, (uint8_t)(v + 1), memory_order_relaxed,
                                                                 memory_order_relaxed))
            ;
    }
    /* The count read after all four increments: of touches racing on one
     * id, the last to finish sees every one of them (each counter's value
     * at its own increment would not: two touches can each be first on
     * different counters), so one of them at least sees the N-th. */
    unsigned least = 255;
    for (int r = 0; r < 4; r++) {
        unsigned now = atomic_load_explicit(&a->cnt[counter_at(a, h, r)], memory_order_relaxed);
        if (now < least)
            least = now;
    }
    return least;
}
