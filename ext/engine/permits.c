/*
 * permits.c - per-embedding staleness permits (MLKV's per-record counter).
 *
 * A pull takes one permit on an id, a push returns it, and a pull waits
 * while that id already has `bound` permits out.  The count is exact per id:
 * only ids actually pulled count, whatever their hash.
 *
 * The counts live in DRAM in PERMIT_STRIPES independent hash tables (id ->
 * count, open addressing), each behind its own mutex, with a condition
 * variable for the pulls waiting on one of its ids.  An entry exists only
 * while its count is above zero, so memory follows the permits out now,
 * not the ids ever pulled.  A returning permit wakes the stripe's waiters
 * only when there are some.  Waits use CLOCK_MONOTONIC deadlines.
 *
 * The bound is the caller's, from the options as they were when it read
 * them; new options (embkv_train_configure) bump the table's generation
 * and wake every waiter, and a waiter that finds the generation moved
 * returns PERMIT_RECHECK for its caller to read the options again.
 *
 * Why mutexes and not one atomic per id: an id's counter must come and go
 * with its permits (billions of ids, a few thousand in flight), and a table
 * whose slots move cannot be updated with a lone compare-and-swap; 1024
 * stripes keep two pulls of different ids from meeting on a lock most of
 * the time, and the uncontended cost is one lock round trip per id.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"

#define PERMIT_STRIPES 1024

typedef struct pentry {
    int64_t id;
    uint32_t count;            /* 0: empty slot */
} pentry;

typedef struct pstripe {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    unsigned waiters;
    pentry *tab;
    size_t cap, n;
    char pad[64];
} pstripe;

struct permit_table {
    pstripe stripes[PERMIT_STRIPES];
    atomic_uint gen;           /* bumped by new options (permits_bump) */
};

unsigned permits_gen(permit_table *pt) { return atomic_load(&pt->gen); }

void permits_bump(permit_table *pt) { atomic_fetch_add(&pt->gen, 1); }

void permits_wake(permit_table *pt)
{
    /* Each stripe's lock is taken: a waiter that read the generation
     * before the bump is inside its wait by then, and is woken. */
    for (int i = 0; i < PERMIT_STRIPES; i++) {
        pstripe *ps = &pt->stripes[i];
        pthread_mutex_lock(&ps->mu);
        if (ps->waiters)
            pthread_cond_broadcast(&ps->cv);
        pthread_mutex_unlock(&ps->mu);
    }
}

permit_table *permits_new(void)
{
    permit_table *pt = calloc(1, sizeof *pt);
    if (!pt)
        return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    for (int i = 0; i < PERMIT_STRIPES; i++) {
        pthread_mutex_init(&pt->stripes[i].mu, NULL);
        pthread_cond_init(&pt->stripes[i].cv, &ca);
    }
    pthread_condattr_destroy(&ca);
    return pt;
}

void permits_free(permit_table *pt)
{
    if (!pt)
        return;
    for (int i = 0; i < PERMIT_STRIPES; i++) {
        pthread_mutex_destroy(&pt->stripes[i].mu);
        pthread_cond_destroy(&pt->stripes[i].cv);
        free(pt->stripes[i].tab);
    }
    free(pt);
}

static inline pstripe *stripe_for(permit_table *pt, uint64_t h)
{
    return &pt->stripes[(h >> 40) & (PERMIT_STRIPES - 1)];
}

/* The slot of id, or the empty slot where it would go. */
static size_t find(const pstripe *ps, int64_t id, uint64_t h)
{
    size_t m = ps->cap - 1, i = h & m;
    while (ps->tab[i].count && ps->tab[i].id != id)
        i = (i + 1) & m;
    return i;
}

static int grow(pstripe *ps)
{
    size_t cap = ps->cap ? ps->cap * 2 : 16;
    pentry *tab = calloc(cap, sizeof *tab);
    if (!tab)
        return EMBKV_NOMEM;
    pentry *old = ps->tab;
    size_t oldcap = ps->cap;
    ps->tab = tab;
    ps->cap = cap;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].count)
            ps->tab[find(ps, old[i].id, embkv__hash(old[i].id))] = old[i];
    free(old);
    return EMBKV_OK;
}

int permit_take(permit_table *pt, int64_t id, unsigned bound, unsigned gen, const struct timespec *deadline,
                bool *waited)
{
    uint64_t h = embkv__hash(id);
    pstripe *ps = stripe_for(pt, h);
    int rc = EMBKV_OK;
    pthread_mutex_lock(&ps->mu);
    for (;;) {
        if ((ps->n + 1) * 2 > ps->cap && grow(ps) != EMBKV_OK) {
            rc = EMBKV_NOMEM;
            break;
        }
        size_t i = find(ps, id, h);
        if (ps->tab[i].count < bound) {
            if (!ps->tab[i].count) {
                ps->tab[i].id = id;
                ps->n++;
            }
            ps->tab[i].count++;
            break;
        }
        if (atomic_load(&pt->gen) != gen) {
            rc = PERMIT_RECHECK;  /* the bound may be another now */
            break;
        }
        *waited = true;
        ps->waiters++;
        int w = pthread_cond_timedwait(&ps->cv, &ps->mu, deadline);
        ps->waiters--;
        if (w == ETIMEDOUT) {
            /* One last look: a return may have come with the deadline. */
            i = find(ps, id, h);
            if (ps->tab[i].count < bound)
                continue;
            rc = EMBKV_BUSY;
            break;
        }
    }
    pthread_mutex_unlock(&ps->mu);
    return rc;
}

void permit_return(permit_table *pt, int64_t id)
{
    uint64_t h = embkv__hash(id);
    pstripe *ps = stripe_for(pt, h);
    pthread_mutex_lock(&ps->mu);
    if (ps->cap) {
        size_t i = find(ps, id, h), m = ps->cap - 1;
        if (ps->tab[i].count && --ps->tab[i].count == 0) {
            /* Backward-shift deletion keeps probe runs unbroken. */
            ps->n--;
            for (size_t j = (i + 1) & m; ps->tab[j].count; j = (j + 1) & m) {
                size_t home = embkv__hash(ps->tab[j].id) & m;
                if (((j - home) & m) >= ((j - i) & m)) {
                    ps->tab[i] = ps->tab[j];
                    ps->tab[j].count = 0;
                    i = j;
                }
            }
        }
        if (ps->waiters)
            pthread_cond_broadcast(&ps->cv);
    }
    pthread_mutex_unlock(&ps->mu);
}

unsigned permit_count(permit_table *pt, int64_t id)
{
    uint64_t h = embkv__hash(id);
    pstripe *ps = stripe_for(pt, h);
    pthread_mutex_lock(&ps->mu);
    unsigned c = ps->cap ? ps->tab[find(ps, id, h)].count : 0;
    pthread_mutex_unlock(&ps->mu);
    return c;
}

bool permit_none_run(permit_table *pt, int64_t id, int (*fn)(void *ctx), void *ctx, int *rc)
{
    uint64_t h = embkv__hash(id);
    pstripe *ps = stripe_for(pt, h);
    pthread_mutex_lock(&ps->mu);
    bool none = !ps->cap || !ps->tab[find(ps, id, h)].count;
    if (none)
        *rc = fn(ctx);
    pthread_mutex_unlock(&ps->mu);
    return none;
}
