/*
 * gather.c - reads of a batch of rows into device memory, and the device
 * side of a push: what the engine does around the GPU's kernels
 * (gpudrv.h), PetPS's offloaded gathering on a GPU.
 *
 * A gather.  The CPU resolves the ids as a batch get does (the index, the
 * DRAM cache), inside an epoch; then one kernel launch on the caller's
 * stream copies every row into the caller's buffer.  Rows in the pool are
 * read by the GPU where they lie: the pool's mapping is registered with
 * the driver once per store (if that fails, the reason is kept in the
 * stats and those rows are staged).  Every other row is copied by the CPU
 * into the pinned buffer of the gather (its "lease"), decoded to float32
 * as the CPU path gives it, and moved by the same launch:
 *   - a cached row (cache.c changes a slot in place under a seqlock,
 *     which a GPU read cannot honour),
 *   - a row in the SSD log or look-ahead's stage (one batched read),
 *   - a pool row when registration failed, and every row of a store
 *     opened by a reader process (readonly.c reads under its own protocol),
 *   - rows the caller hands in (a pull's ids not admitted yet).
 * The call returns once the launch and an event after it are enqueued.
 *
 * Protection (PetPS's epoch list, with the GPU as the reader).  A pool
 * record the GPU reads must not be freed or reused before the copy
 * completes.  Records are retired copy-on-write and reused only once no
 * reader's epoch can hold them (P6); a lease keeps the epoch the gather
 * entered in, and takes part in reclamation as a foreign reader
 * (epoch.c's hooks) until its event completes: the oldest epoch it
 * reports holds every version the launch reads, whatever pushes,
 * demotions, compactions and checkpoints do meanwhile, and a reclaimer
 * that must wait (ebr_synchronize) waits for the event.  The lease's
 * pinned buffer (descriptors, ids, staged rows) is reused only after its
 * event too (P9, format.h).
 *
 * Checks.  A pool row is checked by the kernel (its header must name the
 * id; an encoded row must decode), not by the CPU: reading the record
 * here is the cost the GPU takes off.  A failure is seen when the event
 * completes; the store's next device call (or embkv_gpu_sync) reports
 * it, naming the id, as EMBKV_CORRUPT.
 *
 * Locking.  g->mu guards the leases' states and buffers, and is never held
 * across a call into the store: the epoch hooks take it, and reclamation
 * may run inside any store call.  Nor across the pool's registration,
 * which has an atomic state of its own (pool_registered).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "batch.h"
#include "gpudrv.h"

#define LEASES 8   /* gathers in flight per store: a ninth waits for the oldest */

enum { LEASE_FREE, LEASE_FILLING, LEASE_INFLIGHT };

typedef struct lease {
    _Atomic int state;
    atomic_uint_fast64_t epoch;  /* P9: while FILLING or INFLIGHT (0: pins nothing) */
    uint64_t seq;                /* when it was launched: the oldest is waited for first */
    void *ev;
    char *host;                  /* pinned, mapped: descriptors, ids, the failure word, rows */
    uint64_t dev;
    size_t cap;
    uint32_t *bad;
    const int64_t *ids;
    bool gather;                 /* (a gradient sum checks nothing) */
} lease;

struct gpu_state {
    const gpu_backend *be;
    pthread_mutex_t mu;
    pthread_cond_t freed;        /* a lease went back FREE (under mu) */
    lease leases[LEASES];
    uint64_t seq;
    ebr_foreign hook;
    /* 0 not tried, 2 being registered (gathers meanwhile stage), 1 the
     * pool's mapping, -1 failed (reg_why, written before -1 is stored) */
    _Atomic int registered;
    char reg_why[240];
    uint64_t pool_dev;
    /* A failure seen at a completion, reported by the next call. */
    bool damaged, failed;
    /* A launch whose end cannot be known: its lease stays taken. */
    bool broken;
    int64_t damaged_id;
    atomic_uint_fast64_t gathers, rows_direct, rows_staged, bytes, ns, sums, sum_rows;
};

/* ------------------------------------------------------------ leases */

/* Under g->mu: the lease's completion seen; its failure word read. */
static void lease_finish(gpu_state *g, lease *l, bool ok)
{
    if (!ok) {
        g->failed = true;
    } else if (l->gather && *l->bad != UINT32_MAX && !g->damaged) {
        g->damaged = true;
        g->damaged_id = l->ids[*l->bad];
    }
    g->be->event_free(l->ev);
    l->ev = NULL;
    atomic_store(&l->epoch, 0);
    atomic_store(&l->state, LEASE_FREE);
    pthread_cond_signal(&g->freed);
}

/* Under g->mu: every in-flight lease whose event has completed. */
static void leases_poll(gpu_state *g)
{
    for (int i = 0; i < LEASES; i++) {
        lease *l = &g->leases[i];
        if (atomic_load(&l->state) == LEASE_INFLIGHT) {
            int d = g->be->event_done(l->ev);
            if (d != 0)
                lease_finish(g, l, d > 0);
        }
    }
}

static void lease_wait(gpu_state *g, lease *l) { lease_finish(g, l, g->be->event_wait(l->ev) == 0); }

/* The epoch hooks (epoch.c): the oldest epoch a lease holds (P9), and a
 * wait for those before target. */
static uint64_t hook_oldest(ebr_foreign *f, uint64_t now)
{
    gpu_state *g = (gpu_state *)((char *)f - offsetof(gpu_state, hook));
    if (pthread_mutex_trylock(&g->mu) == 0) {
        leases_poll(g);
        pthread_mutex_unlock(&g->mu);
    }
    uint64_t oldest = now;
    for (int i = 0; i < LEASES; i++) {
        uint64_t e = atomic_load(&g->leases[i].epoch);
        if (e && e < oldest)
            oldest = e;
    }
    return oldest;
}

/* A lease still FILLING is skipped: its gather is inside its own epoch,
 * which the reclaimer waits for through the readers' slots (and may be
 * this very thread). */
static void hook_wait(ebr_foreign *f, uint64_t target)
{
    gpu_state *g = (gpu_state *)((char *)f - offsetof(gpu_state, hook));
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < LEASES; i++) {
        lease *l = &g->leases[i];
        uint64_t e = atomic_load(&l->epoch);
        if (atomic_load(&l->state) == LEASE_INFLIGHT && e && e < target)
            lease_wait(g, l);
    }
    pthread_mutex_unlock(&g->mu);
}

/* The store's GPU state, made at its first device call. */
static int gpu_state_of(embkv_store *s, const gpu_backend *be, gpu_state **out)
{
    gpu_state *g = atomic_load(&s->gpu);
    if (g) {
        *out = g;
        return EMBKV_OK;
    }
    g = calloc(1, sizeof *g);
    if (!g)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for the GPU state", s->path);
    g->be = be;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->freed, NULL);
    g->hook.oldest = hook_oldest;
    g->hook.wait = hook_wait;
    gpu_state *expect = NULL;
    if (!atomic_compare_exchange_strong(&s->gpu, &expect, g)) {
        pthread_cond_destroy(&g->freed);
        pthread_mutex_destroy(&g->mu);
        free(g);
        *out = expect;
        return EMBKV_OK;
    }
    ebr_foreign_add(&g->hook);
    *out = g;
    return EMBKV_OK;
}

/* Its buffer, at least bytes (grown by halves past what is asked:
 * batches vary).  Under g->mu; no call into the store. */
static int lease_grow(embkv_store *s, gpu_state *g, lease *l, size_t bytes)
{
    if (l->cap >= bytes)
        return EMBKV_OK;
    size_t want = bytes + bytes / 2;
    if (want < (1u << 20))
        want = 1u << 20;
    char why[512];
    void *p;
    uint64_t dev;
    if (l->host)
        g->be->host_free(l->host);
    l->host = NULL;
    l->cap = 0;
    int rc = g->be->host_alloc(want, &p, &dev, why, sizeof why);
    if (rc != EMBKV_OK)
        return embkv__err(rc == EMBKV_NOMEM ? EMBKV_NOMEM : EMBKV_NODEVICE,
                          "store %s: no pinned memory for a batch of %zu bytes: %s", s->path, want, why);
    l->host = p;
    l->dev = dev;
    l->cap = want;
    return EMBKV_OK;
}

/* A free lease with a buffer of at least bytes, FILLING, pinning epoch e
 * (0: none).  Waits for the oldest in flight when all are taken, or for
 * one to be given back.  Never called inside an epoch or a write group:
 * the leases it waits for may be held by pushes (gpu_grad_sum) whose
 * updates wait for every epoch to pass (a resize, a demotion). */
static int lease_take(embkv_store *s, gpu_state *g, size_t bytes, uint64_t e, bool gather, lease **out)
{
    pthread_mutex_lock(&g->mu);
    lease *l = NULL;
    for (;;) {
        leases_poll(g);
        lease *oldest = NULL;
        for (int i = 0; i < LEASES && !l; i++) {
            lease *c = &g->leases[i];
            int st = atomic_load(&c->state);
            if (st == LEASE_FREE)
                l = c;
            else if (st == LEASE_INFLIGHT && (!oldest || c->seq < oldest->seq))
                oldest = c;
        }
        if (l)
            break;
        if (g->broken) {
            pthread_mutex_unlock(&g->mu);
            *out = NULL;
            return embkv__err(EMBKV_NODEVICE, "store %s: an earlier device call's end could not be known: close and "
                              "reopen the store to use the GPU again", s->path);
        }
        if (oldest)
            lease_wait(g, oldest);
        else
            pthread_cond_wait(&g->freed, &g->mu);  /* every lease filling on other threads */
    }
    atomic_store(&l->epoch, e);
    atomic_store(&l->state, LEASE_FILLING);
    l->gather = gather;
    int rc = lease_grow(s, g, l, bytes);
    if (rc != EMBKV_OK) {
        atomic_store(&l->epoch, 0);
        atomic_store(&l->state, LEASE_FREE);
        pthread_cond_signal(&g->freed);
    }
    pthread_mutex_unlock(&g->mu);
    *out = rc == EMBKV_OK ? l : NULL;
    return rc;
}

/* A lease that launched nothing goes back. */
static void lease_drop(gpu_state *g, lease *l)
{
    pthread_mutex_lock(&g->mu);
    atomic_store(&l->epoch, 0);
    atomic_store(&l->state, LEASE_FREE);
    pthread_cond_signal(&g->freed);
    pthread_mutex_unlock(&g->mu);
}

/* Its work enqueued: an event after it, and the lease in flight. */
static int lease_launched(embkv_store *s, gpu_state *g, lease *l, void *stream)
{
    char why[512];
    void *ev;
    int rc = g->be->event_record(stream, &ev, why, sizeof why);
    if (rc != EMBKV_OK) {
        /* The launch may run: the lease goes back only once the stream
         * says its work is done.  A stream that cannot say keeps it (its
         * epoch pinned, P9) and the store's device calls fail from then
         * on: nothing can tell when the GPU stops reading. */
        bool done = g->be->stream_wait(stream) == 0;
        pthread_mutex_lock(&g->mu);
        if (done) {
            if (l->gather && *l->bad != UINT32_MAX && !g->damaged) {
                g->damaged = true;
                g->damaged_id = l->ids[*l->bad];
            }
            atomic_store(&l->epoch, 0);
            atomic_store(&l->state, LEASE_FREE);
            pthread_cond_signal(&g->freed);
        } else {
            g->broken = true;
            pthread_cond_broadcast(&g->freed);  /* (waiters see it) */
        }
        pthread_mutex_unlock(&g->mu);
        return embkv__err(EMBKV_NODEVICE, "store %s: %s%s", s->path, why,
                          done ? "" : "; the stream could not be waited for either: this store's device calls fail "
                                      "until it is closed");
    }
    pthread_mutex_lock(&g->mu);
    l->ev = ev;
    l->seq = ++g->seq;
    atomic_store(&l->state, LEASE_INFLIGHT);
    pthread_mutex_unlock(&g->mu);
    return EMBKV_OK;
}

/* A failure an earlier gather's completion left, reported once. */
static int earlier_failure(embkv_store *s, gpu_state *g)
{
    pthread_mutex_lock(&g->mu);
    leases_poll(g);
    bool damaged = g->damaged, failed = g->failed, broken = g->broken;
    int64_t id = g->damaged_id;
    g->damaged = g->failed = false;
    pthread_mutex_unlock(&g->mu);
    if (broken)
        return embkv__err(EMBKV_NODEVICE, "store %s: an earlier device call's end could not be known (its event "
                          "and its stream both failed): close and reopen the store to use the GPU again", s->path);
    if (failed)
        return embkv__err(EMBKV_NODEVICE, "store %s: an earlier device gather or sum failed on the GPU (its "
                          "stream reported an error): the device buffers it wrote are not to be trusted", s->path);
    if (damaged)
        return embkv__err(EMBKV_CORRUPT, "store %s: id %lld: its record failed its check when an earlier call "
                          "gathered it to the device (that row was written as zeros): the record is damaged; delete "
                          "the row (it can be deleted) and write it again, or restore the store from a backup", s->path, (long long)id);
    return EMBKV_OK;
}

/* The backend, the store's state, and the context of dev made current. */
static int gpu_begin(embkv_store *s, uint64_t dev, gpu_state **gout)
{
    char why[512];
    const gpu_backend *be = gpu_backend_get(why, sizeof why);
    if (!be || be->open(why, sizeof why) != EMBKV_OK)
        return embkv__err(EMBKV_NODEVICE, "no usable GPU: %s", why);
    gpu_state *g = NULL;
    int rc = gpu_state_of(s, be, &g);
    if (rc != EMBKV_OK)
        return rc;
    if ((rc = be->enter(dev, why, sizeof why)) != EMBKV_OK)
        return embkv__err(rc, "%s", why);
    if ((rc = earlier_failure(s, g)) != EMBKV_OK) {
        be->leave();
        return rc;
    }
    *gout = g;
    return EMBKV_OK;
}

int gpu_target_check(embkv_store *s, const void *dev)
{
    gpu_state *g;
    int rc = gpu_begin(s, (uint64_t)(uintptr_t)dev, &g);
    if (rc == EMBKV_OK)
        g->be->leave();
    return rc;
}

/* Whether the pool's mapping is registered with the driver: tried once
 * per store, by the first gather, outside g->mu.  Pinning a large mapping
 * takes a while (the driver touches every page), and g->mu is taken by
 * every device call and by a reclaimer that waits for leases: they go on
 * meanwhile, the gathers staging the pool's rows. */
static bool pool_registered(embkv_store *s, gpu_state *g)
{
    /* (a load first: every gather asks, and a failed exchange would still
     * take the line for writing) */
    int state = atomic_load_explicit(&g->registered, memory_order_acquire);
    if (state != 0 || !atomic_compare_exchange_strong(&g->registered, &state, 2))
        return state == 1;
    char why[200];
    if (s->reader) {
        snprintf(g->reg_why, sizeof g->reg_why, "a reader process's store: every row is staged");
        state = -1;
    } else if (g->be->host_register(s->pool_base, s->pool_size, &g->pool_dev, why, sizeof why) == EMBKV_OK) {
        state = 1;
    } else {
        snprintf(g->reg_why, sizeof g->reg_why, "the pool's mapping (%zu bytes, %s/%s) could not be registered: "
                 "%.120s; its rows are staged", s->pool_size, s->path, POOL_FILE, why);
        state = -1;
    }
    atomic_store(&g->registered, state);
    return state == 1;
}

/* ------------------------------------------------------------ gather */

static inline uint64_t row_kind(uint32_t dtype)
{
    switch (dtype) {
    case EMBKV_F16: return GPU_ROW_F16;
    case EMBKV_BF16: return GPU_ROW_BF16;
    case EMBKV_I8: return GPU_ROW_I8;
    default: return GPU_ROW_F32;
    }
}

#define LOC_GIVEN (~0ull - 1)  /* (a pass's mark: the caller's row) */

int gpu_gather(embkv_store *s, const int64_t *ids, size_t n, void *dev_out, void *stream, const uint8_t *given,
               const float *given_rows, size_t *nmissing, int64_t *first_missing, const char *fn)
{
    if (nmissing)
        *nmissing = 0;
    if (first_missing)
        *first_missing = 0;
    if (n && (!ids || !dev_out))
        return embkv__null_arg(fn, "ids", (const void *)ids, "dev_out", (const void *)dev_out, (char *)NULL);
    if (n > UINT32_MAX / 2)
        return embkv__err(EMBKV_INVALID, "%s: %zu ids: at most %u a call", fn, n, UINT32_MAX / 2);
    if (n == 0)
        return EMBKV_OK;  /* (nothing to read: no device asked, as for a pull or push of none) */
    gpu_state *g;
    int rc = gpu_begin(s, (uint64_t)(uintptr_t)dev_out, &g);
    if (rc != EMBKV_OK)
        return rc;
    uint64_t t0 = now_ns();
    bool direct = pool_registered(s, g);
    /* Staged rows start 16-byte aligned (a descriptor's low bits are its
     * kind and flags): sstride floats apart. */
    size_t dim = s->dim, vbytes = 4 * dim, m = 1, sstride = (dim + 3) & ~(size_t)3;
    /* Each distinct id is resolved once, and its occurrences copy the same
     * source: every copy of an id shows one version, as read_batch's. */
    int64_t *uniq = malloc((n ? n : 1) * sizeof *uniq);
    size_t *slot_of = malloc((n ? n : 1) * sizeof *slot_of);
    size_t *first = malloc((n ? n : 1) * sizeof *first);
    uint64_t *locs = malloc((n ? n : 1) * sizeof *locs);
    int64_t *cslot = malloc((n ? n : 1) * sizeof *cslot);
    size_t *srow = malloc((n ? n : 1) * sizeof *srow);
    uint64_t *udesc = malloc((n ? n : 1) * sizeof *udesc);
    if (!uniq || !slot_of || !first || !locs || !cslot || !srow || !udesc ||
        (n && ids_distinct(ids, n, uniq, slot_of, &m) != EMBKV_OK)) {
        rc = embkv__err(EMBKV_NOMEM, "%s: out of memory for %zu ids", fn, n);
        goto out;
    }
    if (!n)
        m = 0;
    for (size_t j = n; j-- > 0;)
        first[slot_of[j]] = j;
    cache *c = s->reader ? NULL : s->cache;
    /* The lease, taken outside the epoch (lease_take may wait for pushes
     * whose updates wait for every epoch to pass), sized for what is staged
     * when every row is; grown below when more are.  Its buffer:
     * descriptors, ids, the failure word, then the staged rows (16-byte
     * aligned).  P9: it pins the epoch before this thread's. */
    size_t off_ids = 8 * n, off_bad = off_ids + 8 * n, off_rows = (off_bad + 4 + 15) & ~(size_t)15;
    lease *l = NULL;
    uint64_t e0 = ebr_now();
    if ((rc = lease_take(s, g, off_rows + (direct ? 0 : m * 4 * sstride), e0, true, &l)) != EMBKV_OK)
        goto out;
    ebr_enter();
    /* Pass 1: where each row is, and how many are staged. */
    size_t staged = 0, missing = 0, hits = 0;
    if (s->reader) {
        for (size_t u = 0; u < m; u++)
            srow[u] = staged++;  /* (all read by embkv_get_batch below) */
    } else {
        index_desc *ix = atomic_load(&s->ix);
        heat_buf hb;
        heat_buf_init(s, &hb, false);
        for (size_t u = 0; u < m; u++) {
            if (u + 8 < m)
                PREFETCH_BUCKET(&ix->buckets[embkv__hash(uniq[u + 8]) & ix->mask], 0);
            uint64_t h = embkv__hash(uniq[u]);
            if (heat_counting(s))
                heat_add(s, &hb, h, -1);
            cslot[u] = -1;
            if (given && given[first[u]]) {
                locs[u] = LOC_GIVEN;
            } else if (c && (cslot[u] = cache_find(c, uniq[u], h, NULL)) >= 0) {
                locs[u] = LOC_CACHED;
                hits++;
            } else {
                uint32_t probes;
                locs[u] = ix_lookup(ix, uniq[u], h, &probes);
            }
            /* (the marks first: they have every flag bit set) */
            uint64_t loc = locs[u];
            bool mark = loc == LOC_CACHED || loc == LOC_GIVEN;
            bool absent = !mark && (loc == LOC_NONE || (loc & LOC_TOMB));
            bool pool = !mark && !absent && !(loc & LOC_SSD);
            srow[u] = absent || (pool && direct) ? SIZE_MAX : staged++;
        }
        heat_flush(s, &hb);
        if (c)
            cache_count(c, hits, m - hits);
    }
    if (l->cap < off_rows + staged * 4 * sstride) {
        pthread_mutex_lock(&g->mu);
        rc = lease_grow(s, g, l, off_rows + staged * 4 * sstride);
        pthread_mutex_unlock(&g->mu);
        if (rc != EMBKV_OK) {
            lease_drop(g, l);
            ebr_leave();
            goto out;
        }
    }
    uint64_t *desc = (uint64_t *)l->host;
    int64_t *lids = (int64_t *)(l->host + off_ids);
    float *rows = (float *)(l->host + off_rows);
    uint64_t rows_dev = l->dev + off_rows;
    l->bad = (uint32_t *)(l->host + off_bad);
    *l->bad = UINT32_MAX;
    l->ids = lids;
    if (n)
        memcpy(lids, ids, 8 * n);
    locvec ssd_at = {0}, ssd_locs = {0};
    size_t ndirect = 0;
    int64_t bad = 0;
    bool damaged = false;
    uint64_t kind = row_kind(s->dtype);
    if (s->reader) {
        /* A reader process's rows, read by its own protocol. */
        size_t miss = 0;
        uint8_t *found = malloc(m ? m : 1);
        float *tmp = malloc(m ? m * vbytes : 1);
        rc = found && tmp ? embkv_get_batch(s, uniq, m, tmp, found, &miss)
                          : embkv__err(EMBKV_NOMEM, "%s: out of memory", fn);
        staged = 0;  /* (counted: the rows found) */
        for (size_t u = 0; rc == EMBKV_OK && u < m; u++) {
            memcpy(rows + srow[u] * sstride, tmp + u * dim, vbytes);
            udesc[u] = found[u] ? rows_dev + srow[u] * 4 * sstride : 0;
            staged += found[u] != 0;
        }
        free(found);
        free(tmp);
    }
    /* Pass 2: the descriptors, and the staged rows' bytes. */
    for (size_t u = 0; !s->reader && u < m && rc == EMBKV_OK; u++) {
        uint64_t loc = locs[u];
        int64_t id = uniq[u];
        float *dst = srow[u] != SIZE_MAX ? rows + srow[u] * sstride : NULL;
        uint64_t dst_dev = srow[u] != SIZE_MAX ? rows_dev + srow[u] * 4 * sstride : 0;
        udesc[u] = dst_dev;
        if (loc == LOC_GIVEN) {
            memcpy(dst, given_rows + first[u] * dim, vbytes);
            continue;
        }
        if (loc == LOC_CACHED) {
            if (cache_read_at(c, cslot[u], id, embkv__hash(id), NULL, dst, (uint32_t)dim, NULL, 0))
                continue;
            /* evicted meanwhile: from its home, into its staged row */
            uint32_t probes;
            loc = ix_lookup(atomic_load(&s->ix), id, embkv__hash(id), &probes);
            if (loc != LOC_NONE && !(loc & (LOC_TOMB | LOC_SSD))) {
                rec_hdr *r = rec_at(s, loc);
                if ((r->id != id || !rec_vec_get(s, r, dst)) && !damaged) {
                    damaged = true;
                    bad = id;
                }
                continue;
            }
        }
        if (loc == LOC_NONE || (loc & LOC_TOMB)) {
            udesc[u] = 0;
            continue;
        }
        if (loc & LOC_SSD) {
            if (locvec_push(&ssd_at, u) != EMBKV_OK || locvec_push(&ssd_locs, loc) != EMBKV_OK)
                rc = embkv__err(EMBKV_NOMEM, "%s: out of memory", fn);
            continue;
        }
        rec_hdr *r = rec_at(s, loc);
        if (direct) {
            udesc[u] = (g->pool_dev + (uint64_t)((char *)rec_vec(r) - s->pool_base)) | kind | GPU_ROW_RECORD;
            ndirect++;
        } else if ((r->id != id || !rec_vec_get(s, r, dst)) && !damaged) {
            damaged = true;
            bad = id;
        }
    }
    /* (read_ssd_rows puts row u at srow[u]: the staged rows' numbers) */
    if (rc == EMBKV_OK && ssd_at.n)
        rc = read_ssd_rows(s, uniq, &ssd_at, &ssd_locs, rows, srow, sstride);
    free(ssd_at.v);
    free(ssd_locs.v);
    if (rc == EMBKV_OK && damaged)
        rc = rec_damaged(s, bad);
    for (size_t j = 0; rc == EMBKV_OK && j < n; j++) {
        desc[j] = udesc[slot_of[j]];
        if (!desc[j] && missing++ == 0 && first_missing)
            *first_missing = ids[j];
    }
    if (rc == EMBKV_OK) {
        char why[512];
        gpu_gather_args a = {.desc = l->dev, .ids = l->dev + off_ids, .out = (uint64_t)(uintptr_t)dev_out,
                             .bad = l->dev + off_bad, .n = (uint32_t)n, .dim = (uint32_t)dim};
        rc = g->be->gather(stream, &a, why, sizeof why);
        if (rc != EMBKV_OK) {
            lease_drop(g, l);
            rc = embkv__err(EMBKV_NODEVICE, "store %s: %s", s->path, why);
        } else {
            rc = lease_launched(s, g, l, stream);
        }
    } else {
        lease_drop(g, l);
    }
    ebr_leave();
    if (nmissing)
        *nmissing = missing;
    if (rc == EMBKV_OK) {
        atomic_fetch_add(&g->gathers, 1);
        atomic_fetch_add(&g->rows_direct, ndirect);
        atomic_fetch_add(&g->rows_staged, staged);
        atomic_fetch_add(&g->bytes, (uint64_t)n * vbytes);
        atomic_fetch_add(&g->ns, now_ns() - t0);
        atomic_fetch_add_explicit(&s->st_batch_gets, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->st_gets, n, memory_order_relaxed);
    }
out:
    g->be->leave();
    free(uniq);
    free(slot_of);
    free(first);
    free(locs);
    free(cslot);
    free(srow);
    free(udesc);
    return rc;
}

int embkv_get_batch_device(embkv_store *s, const int64_t *ids, size_t n, void *dev_out, void *stream,
                           size_t *nmissing)
{
    if (!s)
        return embkv__null_arg("embkv_get_batch_device", "s", (const void *)s, (char *)NULL);
    FORK_REFUSE(s, "embkv_get_batch_device");
    return gpu_gather(s, ids, n, dev_out, stream, NULL, NULL, nmissing, NULL, "embkv_get_batch_device");
}

/* ------------------------------------------------------------ sums */

int gpu_grad_sum(embkv_store *s, void *stream, const void *dev_grads, const uint32_t *occ, const uint32_t *start,
                 const uint32_t *rowof, uint32_t n, uint32_t nu, uint32_t nonce, uint32_t nsums, gpu_sums *out)
{
    memset(out, 0, sizeof *out);
    gpu_state *g;
    int rc = gpu_begin(s, (uint64_t)(uintptr_t)dev_grads, &g);
    if (rc != EMBKV_OK)
        return rc;
    uint64_t t0 = now_ns();
    size_t dim = s->dim;
    /* occ, start, slot, then the float rows, then the double rows (8-aligned) */
    size_t off_start = 4 * (size_t)n, off_slot = off_start + 4 * ((size_t)nu + 1);
    size_t off_once = (off_slot + 4 * (size_t)nu + 15) & ~(size_t)15;
    size_t off_sums = (off_once + 4 * (size_t)nonce * dim + 15) & ~(size_t)15;
    size_t bytes = off_sums + 8 * (size_t)nsums * dim;
    lease *l;
    rc = lease_take(s, g, bytes, 0, false, &l);
    if (rc != EMBKV_OK) {
        g->be->leave();
        return rc;
    }
    memcpy(l->host, occ, 4 * (size_t)n);
    memcpy(l->host + off_start, start, 4 * ((size_t)nu + 1));
    memcpy(l->host + off_slot, rowof, 4 * (size_t)nu);
    char why[512];
    gpu_sum_args a = {.grads = (uint64_t)(uintptr_t)dev_grads, .occ = l->dev, .start = l->dev + off_start,
                      .slot = l->dev + off_slot, .once = l->dev + off_once, .sums = l->dev + off_sums,
                      .nu = nu, .dim = (uint32_t)dim};
    /* The lease stays FILLING, out of the polls' and hooks' sight (it
     * pins no epoch: a sum reads no row), until gpu_sums_release: the
     * push reads its rows after the wait. */
    rc = g->be->grad_sum(stream, &a, why, sizeof why);
    void *ev = NULL;
    bool unknown = false;  /* launched, and its end cannot be known */
    if (rc != EMBKV_OK) {
        rc = embkv__err(EMBKV_NODEVICE, "store %s: %s", s->path, why);
    } else if ((rc = g->be->event_record(stream, &ev, why, sizeof why)) != EMBKV_OK) {
        unknown = g->be->stream_wait(stream) != 0;
        rc = embkv__err(EMBKV_NODEVICE, "store %s: %s%s", s->path, why,
                        unknown ? "; the stream could not be waited for either: this store's device calls fail "
                                  "until it is closed" : "");
    }
    if (ev) {
        if (g->be->event_wait(ev) != 0)
            rc = embkv__err(EMBKV_NODEVICE, "store %s: the gradient sum failed on the GPU (its stream "
                            "reported an error)", s->path);
        g->be->event_free(ev);
    }
    if (unknown) {
        /* the kernel may still write the lease's buffer: kept */
        pthread_mutex_lock(&g->mu);
        g->broken = true;
        pthread_cond_broadcast(&g->freed);
        pthread_mutex_unlock(&g->mu);
    } else if (rc != EMBKV_OK) {
        lease_drop(g, l);
    }
    g->be->leave();
    if (rc != EMBKV_OK)
        return rc;
    out->once = (float *)(l->host + off_once);
    out->sums = (double *)(l->host + off_sums);
    out->lease = l;
    atomic_fetch_add(&g->sums, 1);
    atomic_fetch_add(&g->sum_rows, n);
    atomic_fetch_add(&g->ns, now_ns() - t0);
    return EMBKV_OK;
}

void gpu_sums_release(embkv_store *s, gpu_sums *sums)
{
    gpu_state *g = atomic_load(&s->gpu);
    if (g && sums->lease)
        lease_drop(g, sums->lease);
    sums->lease = NULL;
}

/* ------------------------------------------------------------ the store */

int embkv_gpu_sync(embkv_store *s)
{
    if (!s)
        return embkv__null_arg("embkv_gpu_sync", "s", (const void *)s, (char *)NULL);
    gpu_state *g = atomic_load(&s->gpu);
    if (!g)
        return EMBKV_OK;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < LEASES; i++)
        if (atomic_load(&g->leases[i].state) == LEASE_INFLIGHT)
            lease_wait(g, &g->leases[i]);
    pthread_mutex_unlock(&g->mu);
    return earlier_failure(s, g);
}

int embkv_gpu_status(char *why, size_t cap)
{
    char buf[512];
    const gpu_backend *be = gpu_backend_get(buf, sizeof buf);
    int rc = be ? be->open(buf, sizeof buf) : EMBKV_NODEVICE;
    if (why && cap)
        snprintf(why, cap, "%s", rc == EMBKV_OK ? "" : buf);
    if (rc != EMBKV_OK)
        return embkv__err(EMBKV_NODEVICE, "no usable GPU: %s", buf);
    return EMBKV_OK;
}

int embkv_gpu_compiled(void) { return gpu_compiled(); }

void gpu_stats(embkv_store *s, embkv_stats *st)
{
    gpu_state *g = atomic_load(&s->gpu);
    if (!g)
        return;
    st->gpu_gathers = atomic_load(&g->gathers);
    st->gpu_rows_direct = atomic_load(&g->rows_direct);
    st->gpu_rows_staged = atomic_load(&g->rows_staged);
    st->gpu_bytes = atomic_load(&g->bytes);
    st->gpu_ns = atomic_load(&g->ns);
    st->gpu_sums = atomic_load(&g->sums);
    st->gpu_sum_rows = atomic_load(&g->sum_rows);
    pthread_mutex_lock(&g->mu);
    leases_poll(g);
    int reg = atomic_load(&g->registered);
    st->gpu_registered = reg == 2 ? 0 : reg;  /* (being registered: not yet) */
    snprintf(st->gpu_note, sizeof st->gpu_note, "%s", reg < 0  ? g->reg_why
                                                      : reg == 2 ? "the pool's mapping is being registered; its rows "
                                                                   "are staged meanwhile" : "");
    int inflight = 0;
    for (int i = 0; i < LEASES; i++)
        inflight += atomic_load(&g->leases[i].state) != LEASE_FREE;
    st->gpu_inflight = (uint32_t)inflight;
    pthread_mutex_unlock(&g->mu);
}

/* Before the pool is unmapped: every gather completed, the mapping
 * unregistered, the buffers freed. */
void gpu_close(embkv_store *s)
{
    gpu_state *g = atomic_exchange(&s->gpu, NULL);
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < LEASES; i++)
        if (atomic_load(&g->leases[i].state) == LEASE_INFLIGHT)
            lease_wait(g, &g->leases[i]);
    pthread_mutex_unlock(&g->mu);
    ebr_foreign_remove(&g->hook);
    char why[512];
    for (int i = 0; i < LEASES; i++) {
        lease *l = &g->leases[i];
        if (!l->host)
            continue;
        /* (in a context that knows it) */
        bool in = g->be->enter(l->dev, why, sizeof why) == EMBKV_OK;
        g->be->host_free(l->host);
        if (in)
            g->be->leave();
    }
    if (atomic_load(&g->registered) == 1) {
        bool in = g->be->enter(g->pool_dev, why, sizeof why) == EMBKV_OK;
        g->be->host_unregister(s->pool_base);
        if (in)
            g->be->leave();
    }
    pthread_cond_destroy(&g->freed);
    pthread_mutex_destroy(&g->mu);
    free(g);
}
