/*
 * hotset.c - the hot set: which rows are hottest, and moving rows up the
 * hierarchy (PetPS's hotness-aware placement, MTrainS's exclusive tiers).
 *
 * Moves: an SSD-resident row into the pool (tier.c's promotion, without
 * its admission test: the caller says these rows are hot), then a
 * displaced key into its home bucket, so the hottest rows are found with
 * one bucket read.  The counts returned are what the call achieved for the
 * ids given (read back from the index), not what the tier's thread did
 * beside it.
 *
 * The hottest: a pass over the index with the sketch's estimate of each
 * row (heat.h) and a bounded heap: O(rows log n) time, O(n) memory, no
 * order kept between calls (the sketch ages, so a cached ranking would be
 * stale anyway).  Rows never counted (estimate 0) are not hot at all.
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"

int embkv_hotset(embkv_store *s, const int64_t *ids, size_t n, size_t *moved)
{
    RO_REFUSE(s, "embkv_hotset");
    if (moved)
        *moved = 0;
    if (!s || (n && !ids))
        return embkv__null_arg("embkv_hotset", "s", (const void *)s, "ids", (const void *)ids, (char *)NULL);
    size_t m = 0;
    pthread_rwlock_rdlock(&s->writers);
    pthread_mutex_lock(&s->move_mu);
    index_desc *ix = atomic_load(&s->ix);
    for (size_t i = 0; i < n; i++) {
        uint64_t h = embkv__hash(ids[i]);
        keylock_acquire(s, h);
        int r = ix_move_home_unpinned(s, ix, ids[i], h);
        keylock_release(s, h);
        if (r < 0)
            break;
        m += (size_t)r;
    }
    pthread_mutex_unlock(&s->move_mu);
    writers_unlock(s);
    atomic_fetch_add(&s->st_hot_moves, m);
    if (moved)
        *moved = m;
    return EMBKV_OK;
}

/* ------------------------------------------------- access statistics */

int embkv_heat_enable(embkv_store *s)
{
    if (!s)
        return embkv__null_arg("embkv_heat_enable", "s", (const void *)s, (char *)NULL);
    if (s && s->reader)
        return EMBKV_OK; /* (a reader process counts no accesses) */
    atomic_fetch_or_explicit(&s->heat_live, HEAT_ASKED, memory_order_relaxed);
    return EMBKV_OK;
}

int embkv_heat_get(embkv_store *s, const int64_t *ids, size_t n, uint32_t *hits)
{
    if (!s || (n && (!ids || !hits)))
        return embkv__null_arg("embkv_heat_get", "s", (const void *)s, "ids", (const void *)ids, "hits",
                               (const void *)hits, (char *)NULL);
    for (size_t i = 0; i < n; i++)
        hits[i] = heat_estimate(s->heat, embkv__hash(ids[i]));
    return EMBKV_OK;
}

void embkv_heat_touch(embkv_store *s, const int64_t *ids, size_t n)
{
    if (!s || !ids || !atomic_load_explicit(&s->heat_live, memory_order_relaxed))
        return;
    uint64_t h[256];
    while (n) {
        size_t k = n < 256 ? n : 256;
        for (size_t i = 0; i < k; i++)
            h[i] = embkv__hash(ids[i]);
        heat_touch_batch(s->heat, h, k);
        ids += k;
        n -= k;
    }
}

/* The hottest-n selection: a heap whose top is the entry to drop first
 * (fewest hits; among equals the one met last, so ties keep index order). */
typedef struct hot_ent {
    int64_t id;
    uint64_t seq;
    uint32_t hits;
} hot_ent;

static bool hot_worse(const hot_ent *a, const hot_ent *b)
{
    return a->hits < b->hits || (a->hits == b->hits && a->seq > b->seq);
}

static void hot_sift_down(hot_ent *h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && hot_worse(&h[l], &h[w]))
            w = l;
        if (r < n && hot_worse(&h[r], &h[w]))
            w = r;
        if (w == i)
            return;
        hot_ent t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

static void hot_sift_up(hot_ent *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hot_worse(&h[i], &h[p]))
            return;
        hot_ent t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

#define HOT_SCAN_IDS 4096

int embkv_hottest(embkv_store *s, size_t n, int64_t *ids, uint32_t *hits, size_t *nout)
{
    if (nout)
        *nout = 0;
    if (!s || !nout || (n && !ids))
        return embkv__null_arg("embkv_hottest", "s", (const void *)s, "nout", (const void *)nout, "ids",
                               (const void *)ids, (char *)NULL);
    if (n == 0)
        return EMBKV_OK;
    hot_ent *heap = malloc(n * sizeof *heap);
    int64_t *buf = malloc(HOT_SCAN_IDS * sizeof *buf);
    if (!heap || !buf) {
        free(heap);
        free(buf);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory ranking the %zu hottest rows", s->path, n);
    }
    size_t k = 0;
    uint64_t seq = 0, pos = 0;
    int rc = EMBKV_OK;
    embkv_scan_pin(s);
    for (;;) {
        size_t got = 0;
        if ((rc = embkv_scan_ids(s, &pos, buf, HOT_SCAN_IDS, &got)) != EMBKV_OK || got == 0)
            break;
        for (size_t i = 0; i < got; i++, seq++) {
            hot_ent e = {buf[i], seq, heat_estimate(s->heat, embkv__hash(buf[i]))};
            if (e.hits == 0)
                continue;  /* not counted since statistics began: not hot */
            if (k < n) {
                heap[k] = e;
                hot_sift_up(heap, k++);
            } else if (hot_worse(&heap[0], &e)) {
                heap[0] = e;
                hot_sift_down(heap, k, 0);
            }
        }
    }
    embkv_scan_unpin(s);
    free(buf);
    if (rc == EMBKV_OK) {
        /* Pop the worst to the back: the array ends up hottest first. */
        for (size_t m = k; m > 1; m--) {
            hot_ent t = heap[0];
            heap[0] = heap[m - 1];
            heap[m - 1] = t;
            hot_sift_down(heap, m - 1, 0);
        }
        for (size_t i = 0; i < k; i++) {
            ids[i] = heap[i].id;
            if (hits)
                hits[i] = heap[i].hits;
        }
        *nout = k;
    }
    free(heap);
    return rc;
}

/* ------------------------------------------------- moves up the hierarchy */

int embkv_hotset_move(embkv_store *s, const int64_t *ids, size_t n, embkv_moves *moves)
{
    RO_REFUSE(s, "embkv_hotset_move");
    if (moves)
        memset(moves, 0, sizeof *moves);
    if (!s || !moves || (n && !ids))
        return embkv__null_arg("embkv_hotset_move", "s", (const void *)s, "moves", (const void *)moves, "ids",
                               (const void *)ids, (char *)NULL);
    return hotset_move(s, ids, n, moves, true);
}

/* Brings ids into the cache (hotset_move); *admitted counts them. */
static int hotset_admit(embkv_store *s, const int64_t *ids, size_t n, size_t *admitted)
{
    *admitted = 0;
    if (!s->cache)
        return EMBKV_OK;
    ebr_enter();
    for (size_t i = 0; i < n; i++) {
        uint64_t h = embkv__hash(ids[i]);
        keylock_acquire(s, h);
        uint32_t probes;
        uint64_t loc = ix_lookup(atomic_load(&s->ix), ids[i], h, &probes);
        if (loc != LOC_NONE && !(loc & LOC_TOMB) && !cache_contains(s->cache, ids[i], h)) {
            char *buf = NULL;
            rec_hdr *r = NULL;
            if (tier_rec(s, ids[i], loc, &buf, &r, false) == EMBKV_OK && rec_ok(s, r, ids[i]))
                *admitted += cache_admit_locked(s, s->cache, ids[i], h, r, true);
            free(buf);
        }
        keylock_release(s, h);
    }
    ebr_leave();
    return EMBKV_OK;
}

int hotset_move(embkv_store *s, const int64_t *ids, size_t n, embkv_moves *moves, bool raise)
{
    memset(moves, 0, sizeof *moves);
    if (n == 0)
        return EMBKV_OK;
    /* Each id once, in the order given (the first are the hottest when
     * room runs out). */
    int64_t *u = malloc(n * sizeof *u);
    uint8_t *was_ssd = calloc(n, 1);
    size_t k = 0;
    if (!u || !was_ssd || ids_distinct(ids, n, u, NULL, &k) != EMBKV_OK) {
        free(u);
        free(was_ssd);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory moving %zu rows", s->path, n);
    }

    int rc = EMBKV_OK;
    if (s->log) {
        size_t nssd = 0, moved = 0;
        ebr_enter();
        index_desc *ix = atomic_load(&s->ix);
        for (size_t i = 0; i < k; i++) {
            uint64_t l = ix_lookup(ix, u[i], embkv__hash(u[i]), NULL);
            was_ssd[i] = (l & LOC_SSD) && !(l & LOC_TOMB);
            nssd += was_ssd[i];
        }
        ebr_leave();
        if (nssd)
            rc = tier_promote_ids(s, u, k, &moved);
        /* What the call achieved for these ids, whatever else moved. */
        ebr_enter();
        ix = atomic_load(&s->ix);
        for (size_t i = 0; i < k && nssd; i++) {
            uint64_t l = was_ssd[i] ? ix_lookup(ix, u[i], embkv__hash(u[i]), NULL) : LOC_NONE;
            moves->to_pm += l != LOC_NONE && !(l & LOC_FLAGS);
        }
        ebr_leave();
        atomic_fetch_add(&s->st_hot_to_pm, moves->to_pm);
    }
    size_t home = 0, dram = 0;
    if (rc == EMBKV_OK)
        rc = embkv_hotset(s, u, k, &home);
    moves->home_bucket = home;
    if (rc == EMBKV_OK && s->cache) {
        /* Admission passes over rows as hot as the one it brings. */
        for (size_t j = 0; raise && j < k && atomic_load_explicit(&s->heat_live, memory_order_relaxed); j += 256) {
            uint64_t hh[256];
            size_t m = k - j < 256 ? k - j : 256;
            for (size_t q = 0; q < m; q++)
                hh[q] = embkv__hash(u[j + q]);
            heat_saturate_batch(s->heat, hh, m);
        }
        rc = hotset_admit(s, u, k, &dram);
        moves->to_dram = dram;
        atomic_fetch_add(&s->st_hot_to_dram, dram);
    }
    free(u);
    free(was_ssd);
    return rc;
}
