/*
 * evict.c - eviction: rows that expired (ttl_ms, ttl_steps) and rows past
 * max_rows deleted in passes, by the store's eviction thread and by
 * embkv_evict; the checkpoint marks that give rows their ages.
 *
 * Ages without a field per row.  A record carries the epoch of its last
 * write (copies between tiers keep it), and every sync leaves a mark in
 * the root: the epoch it closed, the wall clock and the table's step (its
 * pushes so far) at that moment (P8).  A row of epoch E was last written
 * no later than the first mark at or after E says, so "expired" is a
 * question about marks: the rows of every epoch up to the newest expired
 * mark are expired, those after it are not.  The answer errs one way only
 * (a row may live up to one checkpoint interval past its ttl, never go
 * before it), costs no byte per row and no write per push, and the marks
 * are durable with the epochs they describe: a crash returns rows, marks
 * and the step count to one checkpoint together.  128 marks are kept,
 * thinned as they age (the one whose neighbours are closest beside its
 * age goes), so an old row's age is known to a few percent of it.
 *
 * Rows written since the last checkpoint (epoch past the durable one, or
 * newer in the cache) are never victims: a pass deletes what checkpoints
 * hold, and so never ranks a transaction half applied.
 *
 * Ranks for max_rows: lfu by the access sketch (heat.c: 4-bit counts
 * that halve as the window moves: LFU with aging), ties to the older
 * write; lru by the mark interval of the last write, ties to the fewer
 * accesses; rows still equal go in id order.  A pass counts the table
 * in a histogram of those keys, finds the key at which the excess is
 * reached, and takes the rows below it and, of those at it, the smallest
 * ids: two walks of the index, no per-row memory beyond the victims.
 *
 * A victim is deleted only as the pass saw it (the same version, clock
 * and epoch, wherever the tiers moved it meanwhile, and not newer in the
 * cache: delete_if), and only while no pull holds
 * it: while eviction is on, pulls take a permit on every id (train.c),
 * and the delete runs with the id's permit stripe held (permit_none_run),
 * so a batch in flight never loses a row between its pull and its push.
 * The deletes of a pass are one write group (P7): a checkpoint holds the
 * whole pass or none of it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"
#include "embkv_debug.h"

#define EVICT_TICK_MS 100
/* A background pass for max_rows evicts down to max_rows less this
 * fraction, so that a table growing at its limit is not walked for every
 * few rows it gains. */
#define EVICT_SLACK 32
#define RANGE 64  /* buckets read in one epoch */

struct evict {
    pthread_mutex_t mu;        /* options, the thread's state */
    pthread_cond_t cv;
    embkv_train_options o;
    atomic_bool on;            /* o sets an eviction option (read by every pull) */
    permit_table *permits;
    pthread_t th;
    bool started, stop, paused;
    pthread_mutex_t pass_mu;   /* one pass at a time */
    uint64_t last_ms, last_steps;
    atomic_uint_fast64_t passes, expired, over, kept;
};

static _Atomic int64_t clock_offset_ms;

void embkv_debug_clock_ms(int64_t offset) { atomic_store(&clock_offset_ms, offset); }

static uint64_t wall_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    int64_t ms = (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000 + atomic_load(&clock_offset_ms);
    return ms > 0 ? (uint64_t)ms : 0;
}

static bool evicting(const embkv_train_options *o)
{
    return o->ttl_ms || o->ttl_steps || o->max_rows;
}

static struct evict *evict_of(embkv_store *s)
{
    return atomic_load_explicit(&s->evict, memory_order_acquire);
}

/* ------------------------------------------------------------- marks */

static bool mark_valid(const evict_mark *m)
{
    return m->epoch && m->check == evict_mark_check(m);
}

/* The valid marks up to epoch `upto`, sorted by epoch (insertion: 128). */
static size_t marks_sorted(embkv_store *s, uint64_t upto, evict_mark *out, int *at)
{
    size_t n = 0;
    for (int i = 0; i < EVICT_MARKS; i++) {
        evict_mark m = s->root->marks[i];
        if (!mark_valid(&m) || m.epoch > upto)
            continue;
        size_t j = n++;
        for (; j > 0 && out[j - 1].epoch > m.epoch; j--) {
            out[j] = out[j - 1];
            if (at)
                at[j] = at[j - 1];
        }
        out[j] = m;
        if (at)
            at[j] = i;
    }
    return n;
}

size_t embkv_debug_marks(embkv_store *s, uint64_t *epochs, uint64_t *times_ms, size_t cap)
{
    evict_mark m[EVICT_MARKS];
    size_t n = marks_sorted(s, UINT64_MAX, m, NULL);
    for (size_t i = 0; i < n && i < cap; i++) {
        epochs[i] = m[i].epoch;
        times_ms[i] = m[i].time_ms;
    }
    return n;
}

uint64_t evict_steps_at(embkv_store *s, uint64_t durable)
{
    evict_mark m[EVICT_MARKS];
    size_t n = marks_sorted(s, durable, m, NULL);
    return n ? m[n - 1].steps : 0;
}

/* (With sync_mu held: the sync's, which makes the mark durable with the
 * epoch's pages.) */
void evict_mark_write(embkv_store *s, uint64_t epoch, uint64_t steps)
{
    /* Marks of this epoch or later are of syncs that did not complete
     * (recovery returned to before them, or a sync failed): they go, so
     * that none of them outlives this one beside it with its older time. */
    for (int i = 0; i < EVICT_MARKS; i++)
        if (mark_valid(&s->root->marks[i]) && s->root->marks[i].epoch >= epoch)
            s->root->marks[i].check = evict_mark_check(&s->root->marks[i]) ^ 1;  /* (invalid) */
    evict_mark m[EVICT_MARKS];
    int at[EVICT_MARKS];
    size_t n = marks_sorted(s, epoch - 1, m, at);
    uint64_t now = wall_ms();
    if (n && now < m[n - 1].time_ms)
        now = m[n - 1].time_ms;  /* (P8: times never go backwards) */
    if (n && steps < m[n - 1].steps)
        steps = m[n - 1].steps;
    int to = -1;
    if (n < EVICT_MARKS) {
        bool used[EVICT_MARKS] = {false};
        for (size_t i = 0; i < n; i++)
            used[at[i]] = true;
        for (int i = 0; i < EVICT_MARKS && to < 0; i++)
            if (!used[i])
                to = i;
    } else {
        /* Thinning: the oldest and the two newest stay; of the others the
         * one whose neighbours are closest, beside its age, goes. */
        double best = 0;
        for (size_t j = 1; j + 2 < n; j++) {
            double gt = (double)(m[j + 1].time_ms - m[j - 1].time_ms) / (double)(now - m[j].time_ms + 1);
            double gs = (double)(m[j + 1].steps - m[j - 1].steps) / (double)(steps - m[j].steps + 1);
            double sc = gt > gs ? gt : gs;
            if (to < 0 || sc < best) {
                best = sc;
                to = at[j];
            }
        }
    }
    evict_mark nm = {.epoch = epoch, .time_ms = now, .steps = steps};
    nm.check = evict_mark_check(&nm);
    s->root->marks[to] = nm;
}

/* ------------------------------------------------------------- a pass */

typedef struct victim {
    int64_t id;
    delete_cond c;
    bool expired;
} victim;

typedef struct vvec {
    victim *v;
    size_t n, cap;
} vvec;

static bool vvec_push(vvec *vv, victim x)
{
    if (vv->n == vv->cap) {
        size_t cap = vv->cap ? 2 * vv->cap : 1024;
        victim *p = realloc(vv->v, cap * sizeof *p);
        if (!p)
            return false;
        vv->v = p;
        vv->cap = cap;
    }
    vv->v[vv->n++] = x;
    return true;
}

typedef struct pass {
    embkv_store *s;
    embkv_train_options o;
    evict_mark marks[EVICT_MARKS];
    size_t nmarks;
    uint64_t durable;
    bool has_cut;
    uint64_t cut;              /* rows of epochs up to it are expired */
    unsigned nb;               /* mark intervals: nmarks + 2 */
    uint64_t *hist;            /* per key, rows not expired */
    /* the second walk: keys below `below` go, and of those at it the
     * `need` smallest ids */
    int walk;
    unsigned at;
    vvec victims, boundary;
    uint64_t scanned, live;
    int rc;
} pass;

/* Which mark interval a row's last write is in: the first mark at or
 * after its epoch; nmarks for a write not yet checkpointed (or past the
 * newest mark), nmarks + 1 for a row the cache holds newer. */
static unsigned interval_of(const pass *p, uint32_t epoch, bool dirty)
{
    if (dirty)
        return (unsigned)p->nmarks + 1;
    if (epoch > p->durable)
        return (unsigned)p->nmarks;
    size_t lo = 0, hi = p->nmarks;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->marks[mid].epoch < epoch)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (unsigned)lo;
}

static unsigned key_of(const pass *p, uint64_t h, uint32_t epoch, bool dirty)
{
    unsigned hot = heat_estimate(p->s->heat, h), iv = interval_of(p, epoch, dirty);
    return p->o.evict == EMBKV_EVICT_LRU ? iv * 16 + hot : hot * p->nb + iv;
}

static void consider(pass *p, int64_t id, const rec_hdr *r)
{
    embkv_store *s = p->s;
    uint64_t h = embkv__hash(id);
    bool dirty = false;
    if (s->cache)
        (void)cache_find(s->cache, id, h, &dirty);
    uint32_t epoch = rec_epoch(r);
    victim v = {.id = id, .c = {.clock = r->clock, .epoch = epoch}};
    bool expired = p->has_cut && epoch <= p->cut && !dirty;
    /* Rows written since the last checkpoint are no victims: a pass
     * deletes what checkpoints hold, so a transaction being applied is
     * never ranked half way. */
    bool fresh = dirty || epoch > p->durable;
    if (p->walk == 0) {
        p->scanned++;
        if (expired) {
            v.expired = true;
            if (!vvec_push(&p->victims, v))
                p->rc = EMBKV_NOMEM;
        } else if (p->hist) {
            if (!fresh)
                p->hist[key_of(p, h, epoch, dirty)]++;
            p->live++;
        }
        return;
    }
    if (expired || fresh)
        return;  /* (a victim of the first walk; a row to keep) */
    unsigned k = key_of(p, h, epoch, dirty);
    if (k < p->at) {
        if (!vvec_push(&p->victims, v))
            p->rc = EMBKV_NOMEM;
    } else if (k == p->at) {
        if (!vvec_push(&p->boundary, v))
            p->rc = EMBKV_NOMEM;
    }
}

/* One walk of the index (scan pin held: no resize, no row between
 * buckets); damaged records are left to the reads that meet them. */
static void walk(pass *p)
{
    embkv_store *s = p->s;
    int64_t ids[RANGE * BUCKET_SLOTS], ssd_ids[RANGE * BUCKET_SLOTS];
    uint64_t locs[RANGE * BUCKET_SLOTS], ssd_locs[RANGE * BUCKET_SLOTS];
    for (uint64_t b0 = 0; p->rc == EMBKV_OK; b0 += RANGE) {
        ebr_enter();
        index_desc *ix = atomic_load(&s->ix);
        if (b0 >= ix->nbuckets) {
            ebr_leave();
            break;
        }
        uint64_t b1 = b0 + RANGE < ix->nbuckets ? b0 + RANGE : ix->nbuckets;
        size_t n = 0, nssd = 0;
        for (uint64_t b = b0; b < b1; b++)
            n += ix_bucket_rows(&ix->buckets[b], ids + n, locs + n, false);
        for (size_t i = 0; i < n && p->rc == EMBKV_OK; i++) {
            if (locs[i] & LOC_SSD) {
                ssd_ids[nssd] = ids[i];
                ssd_locs[nssd++] = locs[i];
                continue;
            }
            const rec_hdr *r = rec_at(s, locs[i]);
            rec_hdr hd = *r;
            if (hd.id == ids[i] && !(hd.epoch & REC_TOMB))
                consider(p, ids[i], &hd);
        }
        if (nssd && p->rc == EMBKV_OK) {
            char *buf = NULL;
            rec_hdr *recs[RANGE * BUCKET_SLOTS];
            /* (a damaged record: its range is skipped, and the read that
             * meets it says) */
            if (tier_read(s, ssd_ids, ssd_locs, nssd, &buf, recs, false) == EMBKV_OK)
                for (size_t i = 0; i < nssd; i++)
                    consider(p, ssd_ids[i], recs[i]);
            free(buf);
        }
        ebr_leave();
    }
}

static int cmp_victim_id(const void *a, const void *b)
{
    int64_t x = ((const victim *)a)->id, y = ((const victim *)b)->id;
    return x < y ? -1 : x > y;
}

typedef struct del_ctx {
    embkv_store *s;
    const victim *v;
    bool changed;
} del_ctx;

static int del_fn(void *ctx)
{
    del_ctx *d = ctx;
    return delete_if(d->s, d->v->id, &d->v->c, &d->changed);
}

static int run_pass(embkv_store *s, struct evict *ev, uint64_t target, embkv_evict_result *res)
{
    pass p;
    memset(&p, 0, sizeof p);
    p.s = s;
    pthread_mutex_lock(&ev->mu);
    p.o = ev->o;
    permit_table *pt = ev->permits;
    pthread_mutex_unlock(&ev->mu);
    if (!evicting(&p.o))
        return EMBKV_OK;
    uint64_t now = wall_ms(), steps = atomic_load(&s->steps);
    /* (the marks are written by syncs, under sync_mu) */
    pthread_mutex_lock(&s->sync_mu);
    p.durable = __atomic_load_n(&s->root->durable_epoch, __ATOMIC_RELAXED);
    p.nmarks = marks_sorted(s, p.durable, p.marks, NULL);
    pthread_mutex_unlock(&s->sync_mu);
    p.nb = (unsigned)p.nmarks + 2;
    for (size_t i = 0; i < p.nmarks; i++) {
        const evict_mark *m = &p.marks[i];
        if ((p.o.ttl_ms && m->time_ms + p.o.ttl_ms <= now) || (p.o.ttl_steps && m->steps + p.o.ttl_steps <= steps)) {
            p.has_cut = true;
            p.cut = m->epoch;
        }
    }
    if (p.o.max_rows && !(p.hist = calloc((size_t)16 * p.nb, sizeof *p.hist)))
        return embkv__err(EMBKV_NOMEM, "store %s: embkv_evict: out of memory", s->path);
    embkv_scan_pin(s);
    walk(&p);
    if (p.rc == EMBKV_OK && p.hist && p.live > target) {
        uint64_t excess = p.live - target, sum = 0;
        unsigned k = 0, nkeys = 16 * p.nb;
        for (; k < nkeys && sum + p.hist[k] < excess; k++)
            sum += p.hist[k];
        p.walk = 1;
        p.at = k;
        walk(&p);
        if (p.rc == EMBKV_OK) {
            if (p.boundary.n)
                qsort(p.boundary.v, p.boundary.n, sizeof *p.boundary.v, cmp_victim_id);
            for (size_t i = 0; i < p.boundary.n && sum < excess && p.rc == EMBKV_OK; i++, sum++)
                if (!vvec_push(&p.victims, p.boundary.v[i]))
                    p.rc = EMBKV_NOMEM;
        }
    }
    embkv_scan_unpin(s);
    free(p.hist);
    free(p.boundary.v);
    int rc = p.rc == EMBKV_OK ? EMBKV_OK : embkv__err(p.rc, "store %s: embkv_evict: out of memory", s->path);
    uint64_t expired = 0, over = 0, kept = 0, left = 0;
    if (rc == EMBKV_OK && p.victims.n) {
        if ((rc = embkv_group_begin(s)) == EMBKV_OK) {
            for (size_t i = 0; i < p.victims.n && rc == EMBKV_OK; i++) {
                del_ctx d = {.s = s, .v = &p.victims.v[i]};
                int drc = EMBKV_OK;
                if (!permit_none_run(pt, d.v->id, del_fn, &d, &drc))
                    kept++;
                else if (drc == EMBKV_FULL) {
                    /* No room for the tombstones of more durable rows
                     * until a sync frees those of this epoch: the rest
                     * is the next pass's. */
                    left = p.victims.n - i;
                    break;
                } else if (drc != EMBKV_OK && drc != EMBKV_NOTFOUND)  /* (not found: deleted meanwhile) */
                    rc = drc;
                else if (drc == EMBKV_OK && !d.changed)
                    *(d.v->expired ? &expired : &over) += 1;
            }
            embkv_group_end(s);
        }
    }
    free(p.victims.v);
    atomic_fetch_add(&ev->passes, 1);
    atomic_fetch_add(&ev->expired, expired);
    atomic_fetch_add(&ev->over, over);
    atomic_fetch_add(&ev->kept, kept);
    if (res) {
        res->scanned = p.scanned;
        res->expired = expired;
        res->over = over;
        res->kept = kept;
        res->left = left;
    }
    return rc;
}

int embkv_evict(embkv_store *s, embkv_evict_result *r)
{
    RO_REFUSE(s, "embkv_evict");
    if (r)
        memset(r, 0, sizeof *r);
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_evict: store is NULL");
    if (group_held(s))
        return embkv__err(EMBKV_BUSY, "store %s: embkv_evict inside a write group of the same thread", s->path);
    struct evict *ev = evict_of(s);
    if (!ev)
        return EMBKV_OK;
    pthread_mutex_lock(&ev->pass_mu);
    pthread_mutex_lock(&ev->mu);
    uint64_t target = ev->o.max_rows;
    pthread_mutex_unlock(&ev->mu);
    int rc = run_pass(s, ev, target, r);
    pthread_mutex_unlock(&ev->pass_mu);
    return rc;
}

/* ------------------------------------------------------------- the thread */

/* How often expiry by wall clock is looked at: a sixteenth of the ttl,
 * from a second to a minute. */
static uint64_t ttl_period(uint64_t ttl_ms)
{
    uint64_t p = ttl_ms / 16;
    return p < 1000 ? 1000 : p > 60000 ? 60000 : p;
}

static void *evict_main(void *arg)
{
    embkv_store *s = arg;
    struct evict *ev = evict_of(s);
    pthread_mutex_lock(&ev->mu);
    while (!ev->stop) {
        struct timespec until = deadline_after_ms(EVICT_TICK_MS);
        pthread_cond_timedwait(&ev->cv, &ev->mu, &until);
        if (ev->stop)
            break;
        if (ev->paused)
            continue;
        embkv_train_options o = ev->o;
        uint64_t now = wall_ms(), steps = atomic_load(&s->steps), rows = atomic_load(&s->rows);
        uint64_t since = now - ev->last_ms;
        bool due = (o.max_rows && rows > o.max_rows && since >= 1000) ||
                   (o.ttl_ms && since >= ttl_period(o.ttl_ms)) ||
                   (o.ttl_steps && since >= 1000 && steps - ev->last_steps >= (o.ttl_steps + 15) / 16);
        if (!due)
            continue;
        ev->last_ms = now;
        ev->last_steps = steps;
        uint64_t target = o.max_rows ? o.max_rows - o.max_rows / EVICT_SLACK : 0;
        pthread_mutex_unlock(&ev->mu);
        pthread_mutex_lock(&ev->pass_mu);
        (void)run_pass(s, ev, target, NULL);  /* (a failure: the next pass tries again; embkv_evict reports) */
        pthread_mutex_unlock(&ev->pass_mu);
        pthread_mutex_lock(&ev->mu);
    }
    pthread_mutex_unlock(&ev->mu);
    return NULL;
}

int evict_configure(embkv_store *s, const embkv_train_options *o, permit_table *pt)
{
    struct evict *ev = evict_of(s);
    if (!ev && !evicting(o))
        return EMBKV_OK;
    if (!ev) {
        if (!(ev = calloc(1, sizeof *ev)))
            return embkv__err(EMBKV_NOMEM, "store %s: out of memory for eviction", s->path);
        pthread_mutex_init(&ev->mu, NULL);
        pthread_mutex_init(&ev->pass_mu, NULL);
        pthread_cond_init(&ev->cv, NULL);
        ev->last_ms = wall_ms();
        ev->last_steps = atomic_load(&s->steps);
        atomic_store_explicit(&s->evict, ev, memory_order_release);
    }
    pthread_mutex_lock(&ev->mu);
    ev->o = *o;
    atomic_store(&ev->on, evicting(o));
    ev->permits = pt;
    bool start = evicting(o) && !ev->started;
    if (start)
        ev->stop = false;
    pthread_mutex_unlock(&ev->mu);
    /* lfu ranks by the access sketch: it must count from now on. */
    if (o->max_rows && o->evict == EMBKV_EVICT_LFU)
        atomic_fetch_or_explicit(&s->heat_live, HEAT_ASKED, memory_order_relaxed);
    if (start) {
        int e = pthread_create(&ev->th, NULL, evict_main, s);
        if (e != 0)
            return embkv__err(EMBKV_NOMEM, "store %s: cannot start the eviction thread: %s", s->path, strerror(e));
        pthread_mutex_lock(&ev->mu);
        ev->started = true;
        pthread_mutex_unlock(&ev->mu);
    }
    return EMBKV_OK;
}

bool evict_holds_pulls(embkv_store *s)
{
    struct evict *ev = evict_of(s);
    return ev && atomic_load_explicit(&ev->on, memory_order_acquire);
}

void evict_stop(embkv_store *s)
{
    struct evict *ev = evict_of(s);
    if (!ev)
        return;
    pthread_mutex_lock(&ev->mu);
    bool started = ev->started;
    ev->stop = true;
    pthread_cond_broadcast(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
    if (started)
        pthread_join(ev->th, NULL);
    ev->started = false;
}

void evict_free(embkv_store *s)
{
    struct evict *ev = evict_of(s);
    if (!ev)
        return;
    evict_stop(s);
    pthread_mutex_destroy(&ev->mu);
    pthread_mutex_destroy(&ev->pass_mu);
    pthread_cond_destroy(&ev->cv);
    free(ev);
    atomic_store(&s->evict, NULL);
}

void evict_stats(embkv_store *s, embkv_train_stats *st)
{
    struct evict *ev = evict_of(s);
    st->steps = atomic_load(&s->steps);
    if (!ev)
        return;
    st->evict_passes = atomic_load(&ev->passes);
    st->evicted_expired = atomic_load(&ev->expired);
    st->evicted_over = atomic_load(&ev->over);
    st->evict_kept = atomic_load(&ev->kept);
}

void embkv_debug_evict_pause(embkv_store *s, int paused)
{
    struct evict *ev = s ? evict_of(s) : NULL;
    if (!ev)
        return;
    pthread_mutex_lock(&ev->mu);
    ev->paused = paused != 0;
    pthread_mutex_unlock(&ev->mu);
}
