/*
 * write.c - writes of rows: puts, deletes, batch updates, and the DRAM
 * cache's write-backs (reads are read.c's, the index walks scan.c's).
 *
 * Writes hold the store's writer lock shared (only resize and the epoch
 * switch of a sync take it exclusively) and the stripe lock of the id's
 * hash, which serializes operations on one id.  A write builds a complete
 * new record, then switches the index entry to it with one 8-byte store
 * (P1), keeping the durable version it replaced linked until the next
 * sync (P2).
 *
 * Rows in the SSD log (tier.c) are read in one batch per call, outside the
 * per-row loops where the call can (a write reads its log-resident rows
 * before it takes their locks, and again under the lock only if one moved
 * meanwhile); a write always puts the new version in the pool.
 */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "batch.h"

#define RETIRE_BUF 64

/* ------------------------------------------------------------ retirement */

/* Versions displaced by one writer, handed over in bulk.  `keep` are durable
 * versions (kept until the current epoch's sync), `now` can go as soon as
 * readers are out, `tombs` are deletions to purge after the sync. */
typedef struct retire_buf {
    uint64_t keep[RETIRE_BUF];     /* durable versions an open snapshot may read */
    uint64_t keepu[RETIRE_BUF];    /* durable versions no open snapshot may read */
    uint64_t now[RETIRE_BUF];      /* versions no open snapshot may read */
    uint64_t nowp[RETIRE_BUF];     /* versions an open snapshot may read (P6) */
    tomb_entry tombs[RETIRE_BUF];
    knn_change told[RETIRE_BUF];   /* index changes the kNN change log is told of (knnlog.c) */
    size_t nkeep, nkeepu, nnow, nnowp, ntombs, ntold;
} retire_buf;

static inline void rb_init(retire_buf *rb)
{
    rb->nkeep = rb->nkeepu = rb->nnow = rb->nnowp = rb->ntombs = rb->ntold = 0;
}

static int push_tombs(embkv_store *s, unsigned parity, const tomb_entry *t, size_t n)
{
    if (n == 0)
        return EMBKV_OK;
    if (s->ntombs[parity] + n > s->tombs_cap[parity]) {
        size_t cap = s->tombs_cap[parity] ? s->tombs_cap[parity] * 2 : 256;
        while (cap < s->ntombs[parity] + n)
            cap *= 2;
        tomb_entry *p = realloc(s->tombs[parity], cap * sizeof *p);
        if (!p)
            return EMBKV_NOMEM;
        s->tombs[parity] = p;
        s->tombs_cap[parity] = cap;
    }
    memcpy(s->tombs[parity] + s->ntombs[parity], t, n * sizeof *t);
    s->ntombs[parity] += n;
    return EMBKV_OK;
}

/* Must run before the writer lock is released, so that the lists of the
 * epoch the writes were stamped with receive them. */
static void retire_flush(embkv_store *s, retire_buf *rb)
{
    /* The log first: the versions retired now leave the index with changes
     * the kept map is told of, or the retirement clears it (P11). */
    knnlog_tell(s, rb->told, rb->ntold);
    rb->ntold = 0;
    bool told = ix_section_all_told();
    if (rb->nkeep || rb->nkeepu || rb->ntombs) {
        unsigned parity = atomic_load(&s->cur_epoch) & 1;
        pthread_mutex_lock(&s->retire_mu);
        /* (out of memory: a record leaks until the next open) */
        for (size_t i = 0; i < rb->nkeep; i++)
            if (locvec_push(&s->pending[parity], rb->keep[i]) != EMBKV_OK)
                break;
        for (size_t i = 0; i < rb->nkeepu; i++)
            if (locvec_push(&s->pendingu[parity], rb->keepu[i]) != EMBKV_OK)
                break;
        push_tombs(s, parity, rb->tombs, rb->ntombs);
        pthread_mutex_unlock(&s->retire_mu);
    }
    slab_retire(s, rb->now, rb->nnow, false, told);
    slab_retire(s, rb->nowp, rb->nnowp, true, told);
    rb_init(rb);
}

/* A row's record moved (a row inserted: from LOC_NONE; deleted: to
 * LOC_NONE or its tombstone), for the kNN change log, told at the next
 * retire_flush (before the section ends). */
static inline void rb_tell(embkv_store *s, retire_buf *rb, int64_t id, uint64_t from, uint64_t to)
{
    if (rb->ntold == RETIRE_BUF) {
        knnlog_tell(s, rb->told, rb->ntold);
        rb->ntold = 0;
    }
    rb->told[rb->ntold++] = (knn_change){.id = id, .from = from, .to = to};
}

static inline void retire_add(embkv_store *s, retire_buf *rb, uint64_t loc, bool keep, bool pinned)
{
    if ((keep ? (pinned ? rb->nkeep : rb->nkeepu) : pinned ? rb->nnowp : rb->nnow) == RETIRE_BUF)
        retire_flush(s, rb);
    if (keep && pinned)
        rb->keep[rb->nkeep++] = loc_plain(loc);
    else if (keep)
        rb->keepu[rb->nkeepu++] = loc_plain(loc);
    else if (pinned)
        rb->nowp[rb->nnowp++] = loc_plain(loc);
    else
        rb->now[rb->nnow++] = loc_plain(loc);
}

/* ------------------------------------------------------------ writes */

enum write_kind { W_PUT, W_UPDATE };

typedef struct write_req {
    enum write_kind kind;
    const float *vec, *state;  /* W_PUT */
    unsigned flags;            /* EMBKV_PUT_* or EMBKV_UPDATE_* */
    embkv_update_fn fn;        /* W_UPDATE */
    void *ctx;
    size_t index;
    uint64_t clock;            /* with PUT_CLOCK */
    rec_hdr *pre;              /* the row's log record read ahead, at pre_loc */
    uint64_t pre_loc;
    char **scratch;            /* a log record read here; the caller frees it after each row */
    float *rowbuf;             /* W_UPDATE of a store of another dtype: dim + state floats for fn */
} write_req;

#define PUT_CLOCK 0x100        /* internal: w->clock is the new row's clock */
#define PUT_NOLOG 0x200        /* internal: a cached row's write-back (its content does not change) */
#define UPDATE_IN_PLACE 0x400  /* internal: fn may change a cached row's slot in place (update_batch_in_place) */
#define PUT_RAW 0x800          /* internal: w->vec is a record's payload, encoded (a write-back) */
#define UPDATE_FINITE 0x1000   /* internal: fn is the caller's: what it leaves must be finite (the optimizers check their own) */
/* cache_write_locked: the row is turning dirty and *spare is LOC_NONE (no
 * message set; a batch whose count fell short takes one more record). */
#define NEED_RECORD 0x4e52

/* Decide what the new version links to and what happens to the old one. */
static uint64_t displace(embkv_store *s, retire_buf *rb, const found_slot *f, const rec_hdr *old,
                         uint32_t epoch, bool pinned)
{
    if (rec_epoch(old) < epoch) {
        /* The old version is what a crash must return to: keep it (P2);
         * after the sync, as long as a snapshot may read it. */
        retire_add(s, rb, f->loc, true, pinned);
        return loc_plain(f->loc);
    }
    retire_add(s, rb, f->loc, false, pinned);
    return old->prev;
}


/* The first element of v[0..n) that is NaN or infinite, or n. */
static uint32_t first_not_finite(const float *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return i;
    return n;
}

/* The update's fn, counted in update_fn_depth while it runs: a store call
 * from it that could wait for the locks this batch holds is refused
 * (CALLBACK_REFUSE) rather than deadlocking. */
static int call_fn(const write_req *w, int64_t id, float *vec, float *state)
{
    update_fn_depth++;
    int r = w->fn(w->ctx, w->index, id, vec, state);
    update_fn_depth--;
    return r;
}

/* Rows hold finite values only (what put refuses, a caller's fn may not
 * leave either): nonzero with *err naming the id and the element when
 * fn left a NaN or an infinity in row (vector, then state). */
static int not_finite(const embkv_store *s, const write_req *w, int64_t id, const float *row, int *err)
{
    if (!(w->flags & UPDATE_FINITE))
        return 0;
    uint32_t n = s->dim + s->state_floats, bad = first_not_finite(row, n);
    if (bad == n)
        return 0;
    *err = embkv__err(EMBKV_INVALID, "embkv_update_batch: store %s: id %lld: the callback left %s element %u %s: "
                      "rows hold finite values only; the row is left as it was, and the batch stops there (the rows "
                      "before it are written)", s->path, (long long)id, bad < s->dim ? "vector" : "state",
                      bad < s->dim ? bad : bad - s->dim, isnan(row[bad]) ? "NaN" : "infinite");
    return 1;
}

/* An update's fn over a row whose payload (vector as the store's dtype,
 * then state) is at p, about to get clock `clock`: in place for float32;
 * for another dtype through w->rowbuf, decoded, and encoded back unless
 * fn skips it (rounded stochastically when the table asks, from a seed
 * of (table, id, clock): the same update rounds the same way).  Returns
 * fn's result (nonzero: skipped); when fn's values are beyond the dtype's
 * range, nonzero with *err an error naming the id (the payload then
 * unchanged). */
static int run_fn(embkv_store *s, const write_req *w, int64_t id, void *p, uint64_t clock, int *err)
{
    *err = EMBKV_OK;
    if (s->dtype == EMBKV_F32) {
        float *v = p;
        int r = call_fn(w, id, v, v + s->dim);
        return r ? r : not_finite(s, w, id, v, err);
    }
    float *buf = w->rowbuf, *st = (float *)((char *)p + s->vec_bytes);
    dtype_decode((int)s->dtype, s->dim, p, buf);
    memcpy(buf + s->dim, st, 4 * (size_t)s->state_floats);
    int r = call_fn(w, id, buf, buf + s->dim);
    if (r || (r = not_finite(s, w, id, buf, err)) != 0)
        return r;
    uint64_t seed = atomic_load_explicit(&s->round_seed, memory_order_relaxed) ^ ((uint64_t)id * 0xd6e8feb86659fd93ull) ^
                    (clock * 0x9e3779b97f4a7c15ull);
    bool sr = atomic_load_explicit(&s->round_stochastic, memory_order_relaxed);
    uint32_t bad = dtype_encode((int)s->dtype, s->dim, buf, p, sr ? &seed : NULL);
    if (bad) {
        *err = embkv__err(EMBKV_INVALID, "id %lld: element %u of the update (%g) is beyond %s's range (at most %g): "
                          "the row is left as it was", (long long)id, bad - 1, (double)buf[bad - 1],
                          dtype_name((int)s->dtype), (double)dtype_max((int)s->dtype));
        return 1;
    }
    memcpy(st, buf + s->dim, 4 * (size_t)s->state_floats);
    return 0;
}

/* A put's vector into the payload at p as the store's dtype (rounded to
 * nearest): an error naming the id when it cannot be held. */
static int put_vec(embkv_store *s, int64_t id, const float *vec, void *p)
{
    uint32_t bad = dtype_encode((int)s->dtype, s->dim, vec, p, NULL);
    if (bad)
        return embkv__err(EMBKV_INVALID, "store %s: id %lld: element %u (%g) is beyond %s's range (at most %g)",
                          s->path, (long long)id, bad - 1, (double)vec[bad - 1], dtype_name((int)s->dtype),
                          (double)dtype_max((int)s->dtype));
    return EMBKV_OK;
}

/* With the writer lock shared, the id's stripe lock and an epoch held.
 * Returns EMBKV_OK (written, *consumed set), EMBKV_BUSY for a row the
 * callback skipped, or an error. */
static int write_row(embkv_store *s, index_desc *ix, int64_t id, uint64_t h, uint64_t newloc,
                     const write_req *w, retire_buf *rb, bool *consumed)
{
    *consumed = false;
    found_slot f = {0};  /* (set by ix_find when it finds the id; zeroed for the compilers that cannot tell) */
    bool have = ix_find(ix, id, h, &f);
    bool live = have && !(f.loc & LOC_TOMB);
    rec_hdr *old = NULL;
    if (have && (f.loc & LOC_SSD) && w->pre && w->pre_loc == f.loc) {
        old = w->pre;
    } else if (have) {
        int trc = tier_rec(s, id, f.loc, w->scratch, &old, true);
        if (trc != EMBKV_OK)
            return trc;
    }
    uint32_t epoch = (uint32_t)atomic_load(&s->cur_epoch);
    /* (A log record was checked as it was read.)  A write-back replaces a
     * home that was checked when its row came into the cache, or written
     * by the row's last write-back, and uses its header only: checking the
     * whole record took a third of a checkpoint's time.  Its id, then, and
     * its epoch: a home from before this epoch is kept and linked as the
     * new record's prev (recovery checks it whole if it returns to it);
     * only a home of this epoch passes on its own prev, and is checked
     * whole, so that a damaged header is never passed on. */
    bool light = w->kind == W_PUT && (w->flags & PUT_NOLOG) && old && old->id == id &&
                 !(old->epoch & REC_TOMB) && rec_epoch(old) < epoch;
    if (old && !(f.loc & (LOC_TOMB | LOC_SSD)) && !light && !rec_ok(s, old, id))
        return rec_damaged(s, id);
    size_t sbytes = 4 * (size_t)s->state_floats, pbytes = rec_payload_bytes(s);
    rec_hdr *nr = rec_at(s, newloc);
    float *nstate = rec_state(s, nr);

    if (w->kind == W_PUT) {
        if ((w->flags & EMBKV_PUT_INSERT) && live)
            return embkv__err(EMBKV_EXISTS, "id %lld already exists", (long long)id);
        if ((w->flags & EMBKV_PUT_UPDATE) && !live)
            return embkv__err(EMBKV_NOTFOUND, "id %lld not found", (long long)id);
        if (w->flags & PUT_RAW) {
            memcpy(nr + 1, w->vec, pbytes);
        } else {
            int prc = put_vec(s, id, w->vec, nr + 1);
            if (prc != EMBKV_OK)
                return prc;
            if (w->state)
                memcpy(nstate, w->state, sbytes);
            else if (live && !(w->flags & EMBKV_PUT_RESET))
                memcpy(nstate, rec_state(s, old), sbytes);
            else
                memset(nstate, 0, sbytes);
        }
    } else {
        if (!live && !(w->flags & EMBKV_UPDATE_CREATE)) {
            (void)call_fn(w, id, NULL, NULL);  /* (told only: nothing to skip) */
            return EMBKV_BUSY;
        }
        if (live)
            memcpy(nr + 1, old + 1, pbytes);
        else
            memset(nr + 1, 0, pbytes);  /* (zero bits: zeros in every dtype) */
        int erc, frc = run_fn(s, w, id, nr + 1, live ? clock_next(old->clock) : 0, &erc);
        if (erc != EMBKV_OK)
            return erc;
        if (frc)
            return EMBKV_BUSY;
    }
    /* Readers of an older snapshot must find the version this replaces. */
    bool pinned = true;
    int lrc = w->kind == W_PUT && (w->flags & PUT_NOLOG) ? EMBKV_OK
                                                          : snap_log(s, id, h, have ? f.loc : LOC_NONE, &pinned);
    if (lrc != EMBKV_OK)
        return lrc;
    nr->id = id;
    if (w->kind == W_PUT && (w->flags & PUT_CLOCK))
        nr->clock = w->clock;
    else
        nr->clock = live && !(w->kind == W_PUT && (w->flags & EMBKV_PUT_RESET)) ? clock_next(old->clock) : 0;
    nr->epoch = epoch;
    nr->prev = have ? displace(s, rb, &f, old, epoch, pinned) : LOC_NONE;
    nr->check = rec_checksum(s, nr);
    persist_range(s, nr, s->rec_size);
    persist_barrier(s);  /* the record is durable before anything points at it (P1) */
    if (have) {
        set_loc(s, ix, &f, newloc);
        if (f.loc & LOC_SSD)
            atomic_fetch_sub(&s->rows_ssd, 1);
    } else if (!ix_insert(ix, id, h, newloc, NULL)) {
        return embkv__err(EMBKV_FULL, "store %s: index full inserting id %lld", s->path, (long long)id);
    } else {
        atomic_fetch_add(&s->entries, 1);
    }
    rb_tell(s, rb, id, have ? f.loc : LOC_NONE, newloc);
    if (!live)
        atomic_fetch_add(&s->rows, 1);
    *consumed = true;
    return EMBKV_OK;
}

/* n records from the pool; a full pool with an SSD tier first moves cold
 * rows to the log (a batch at least 1/64 of the pool, so that a stream of
 * small writes does not demote at every call). */
static int alloc_records(embkv_store *s, uint64_t *locs, size_t n, bool tombstone)
{
    int rc = tombstone ? slab_alloc_tombstone(s, locs) : slab_alloc(s, locs, n);
    if (rc != EMBKV_FULL || !s->log)
        return rc;
    size_t want = 2 * n, cap = (size_t)s->nchunks * s->recs_per_chunk / 64, moved = 0;
    if (want < cap)
        want = cap;
    if (want < 256)
        want = 256;
    int drc = tier_demote(s, want, &moved);
    if (drc != EMBKV_OK)
        return drc;
    return tombstone ? slab_alloc_tombstone(s, locs) : slab_alloc(s, locs, n);
}

/* ------------------------------------------------------------ the DRAM cache
 *
 * A cached row (cache.c) is read from the cache by every read that is not
 * a snapshot's, and written there in place; its home (the record the
 * index names) catches up when it is written back, into the pool record
 * the row reserved when it turned dirty (so that a write costs the pool
 * what it costs without a cache, up front, and a checkpoint never needs
 * room).  Write-backs happen only with the groups quiesced (syncs, a
 * snapshot's open, the cleaner), so within a group no row turns clean by
 * a write-back; a row deleted (its reserved record freed with it) and
 * written again may though, and a batch that counted it dirty takes one
 * more record when it gets there (update_batch_in_group).  While
 * a snapshot is open no row is dirty (its open wrote them back) and a
 * write of a clean cached row goes through: a new record as for any row,
 * the cache refreshed with it.  All of it under the row's key lock. */

/* A cached row's record rec as its new home at newloc (logged for
 * snapshots when `log`: a write; not for a write-back, which changes no
 * content).  With the writer lock shared, id's key lock and an epoch. */
static int cache_write_home(embkv_store *s, index_desc *ix, int64_t id, uint64_t h, uint64_t newloc,
                            rec_hdr *rec, bool log, retire_buf *rb, bool *consumed)
{
    char *scratch = NULL;
    write_req w = {.kind = W_PUT, .vec = (const float *)(rec + 1), .flags = PUT_CLOCK | PUT_RAW | (log ? 0 : PUT_NOLOG),
                   .clock = rec->clock, .scratch = &scratch};
    int rc = write_row(s, ix, id, h, newloc, &w, rb, consumed);
    free(scratch);
    return rc;
}

/* A record's lines for writing it whole, header first (prefetch_record
 * fetches the vector only, to read). */
static inline void prefetch_record_to_write(embkv_store *s, uint64_t loc)
{
    const char *p = (const char *)rec_at(s, loc);
    for (size_t off = 0; off < s->rec_size + 64; off += 64)
        __builtin_prefetch(p + off, 1, 3);
}

/* With the groups quiesced: writes back the dirty rows among ids (each
 * into its reserved record).  Pipelined like the batch paths: each row
 * is a chain of misses (the cache's table line, the home bucket, then the
 * old home's header and the reserved record), and a checkpoint writes
 * back every dirty row, so unprefetched it paid each latency in turn. */
static int writeback_ids(embkv_store *s, const int64_t *ids, size_t n)
{
    char *row = malloc(s->rec_size);
    retire_buf *rb = malloc(sizeof *rb);
    if (!row || !rb) {
        free(row);
        free(rb);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory writing back the cache", s->path);
    }
    rb_init(rb);
    int rc = EMBKV_OK;
    pthread_rwlock_rdlock(&s->writers);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    uint64_t hs[RING];
    for (size_t i = 0; i < n + PF_BUCKET && rc == EMBKV_OK; i++) {
        if (i < n) {
            uint64_t h = embkv__hash(ids[i]);
            hs[i % RING] = h;
            cache_prefetch(s->cache, h);
            PREFETCH_BUCKET(&ix->buckets[h & ix->mask], 1);
        }
        if (i >= PF_BUCKET - PF_RECORD && i - (PF_BUCKET - PF_RECORD) < n) {
            size_t j = i - (PF_BUCKET - PF_RECORD);
            uint64_t wb = cache_prefetch_wb(s->cache, ids[j], hs[j % RING]);
            if (wb != LOC_NONE && !(wb & (LOC_TOMB | LOC_SSD)))
                prefetch_record_to_write(s, wb);
            uint32_t probes;
            uint64_t loc = ix_lookup(ix, ids[j], hs[j % RING], &probes);
            /* (of the old home, its header: the whole is read only when
             * it is of this epoch, rarely) */
            if (loc != LOC_NONE && !(loc & (LOC_TOMB | LOC_SSD)))
                __builtin_prefetch(rec_at(s, loc), 0, 3);
        }
        if (i < PF_BUCKET)
            continue;
        size_t j = i - PF_BUCKET;
        uint64_t h = hs[j % RING];
        keylock_acquire(s, h);
        int64_t at = cache_load_locked(s->cache, ids[j], h, -1, row);
        if (at >= 0 && cache_slot_dirty(s->cache, at)) {
            bool consumed;
            int r = cache_write_home(s, ix, ids[j], h, cache_slot_wb(s->cache, at), (rec_hdr *)row, false, rb,
                                     &consumed);
            if (consumed)
                cache_mark_clean_locked(s->cache, at);
            else if (r != EMBKV_OK)
                rc = r;
        }
        keylock_release(s, h);
    }
    ebr_leave();
    retire_flush(s, rb);
    writers_unlock(s);
    free(row);
    free(rb);
    return rc;
}

int writeback_quiesce(embkv_store *s, const char *what)
{
    int qrc = groups_quiesce(s, what);
    if (qrc != EMBKV_OK)
        return qrc;
    int64_t *ids = NULL;
    size_t n = 0;
    int rc = cache_dirty_ids(s->cache, &ids, &n);
    if (rc != EMBKV_OK)
        rc = embkv__err(rc, "store %s: out of memory listing the cache's dirty rows", s->path);
    else
        rc = writeback_ids(s, ids, n);
    free(ids);
    if (rc != EMBKV_OK)
        groups_resume(s);
    return rc;
}

int writeback_clean(embkv_store *s)
{
    cache *c = s->cache;
    uint64_t cap = cache_capacity(c), nd = cache_ndirty(c);
    /* Only when clean victims run short: in a steady state the cache holds
     * the hot set, admission refuses the cold misses, and a dirty row costs
     * nothing until the next checkpoint writes it back once. */
    if (!c || nd * 16 <= cap * 15 || group_held(s))
        return EMBKV_OK;
    if (atomic_exchange(&s->cache_cleaning, true))
        return EMBKV_OK;  /* another writer cleans */
    if (groups_quiesce(s, "a write") != EMBKV_OK) {
        /* A scan pin of this thread holds a group off (pinned_lock): the
         * cleaning is left to a later write (the cache's clean rows last
         * a while; the write's own room is checked where it is taken). */
        atomic_store(&s->cache_cleaning, false);
        return EMBKV_OK;
    }
    /* Down to 7/8 dirty, taking the rows each shard's CLOCK hand reaches
     * next: eviction takes only clean rows, at the hand, so those are the
     * write-backs it needs, and a hot row behind the hand is left dirty
     * (measured at a 10% cache, 2M rows, Zipf 0.99: a third fewer
     * write-backs and a hit rate as high or higher than choosing the
     * coldest dirty rows by the sketch down to 3/4, which also cost a
     * sketch lookup per dirty row each time). */
    int64_t *ids = NULL;
    size_t n = 0;
    int rc = cache_clean_ahead(c, (size_t)(nd - cap * 7 / 8), &ids, &n);
    if (rc != EMBKV_OK)
        rc = embkv__err(rc, "store %s: out of memory listing the cache's dirty rows", s->path);
    else if (n)
        rc = writeback_ids(s, ids, n);
    groups_resume(s);
    free(ids);
    atomic_store(&s->cache_cleaning, false);
    return rc;
}

/* A put's new content over a cached row's record in row. */
static int put_content(embkv_store *s, int64_t id, const write_req *w, char *row)
{
    if (w->flags & EMBKV_PUT_INSERT)
        return embkv__err(EMBKV_EXISTS, "id %lld already exists", (long long)id);
    rec_hdr *r = (rec_hdr *)row;
    int prc = put_vec(s, id, w->vec, r + 1);
    if (prc != EMBKV_OK)
        return prc;
    if (w->state)
        memcpy(rec_state(s, r), w->state, 4 * (size_t)s->state_floats);
    else if (w->flags & EMBKV_PUT_RESET)
        memset(rec_state(s, r), 0, 4 * (size_t)s->state_floats);
    r->clock = (w->flags & PUT_CLOCK) ? w->clock : (w->flags & EMBKV_PUT_RESET) ? 0 : clock_next(r->clock);
    r->epoch = (uint32_t)atomic_load(&s->cur_epoch);
    return EMBKV_OK;
}

/* Under id's key lock, a write (put or update) of a cached row: in place,
 * or, in a logging group over a clean row, through to a new record.  hint:
 * the row's slot as cache_find gave it earlier in the batch (or -1),
 * checked before use.  An update with UPDATE_IN_PLACE runs fn on the slot
 * itself, other writes on a copy in row.  The record at *spare (LOC_NONE:
 * none) is taken when the row turns dirty or goes through (*spare then
 * LOC_NONE).  EMBKV_NOTFOUND when id is not cached, EMBKV_BUSY when fn
 * skipped it, NEED_RECORD (nothing done) when it needs *spare and there is
 * none. */
static int cache_write_locked(embkv_store *s, index_desc *ix, int64_t id, uint64_t h, int64_t hint,
                              const write_req *w, bool logging, uint64_t *spare, retire_buf *rb, char *row)
{
    /* An update that stays in the cache changes the slot in place: a copy
     * out, an update of the copy and a copy back cost a cached push a
     * fifth of its time, most of it the update's loads waiting on the
     * copy's stores (which a load spanning two of them cannot take
     * from).  row then keeps the old content, put back if fn gives up. */
#ifndef EMBKV_TSAN
    bool in_place = w->kind == W_UPDATE && (w->flags & UPDATE_IN_PLACE) && !logging;
#else
    bool in_place = false;
#endif
    int64_t at = cache_load_locked(s->cache, id, h, hint, in_place ? NULL : row);
    if (at < 0)
        return EMBKV_NOTFOUND;
    bool dirty = cache_slot_dirty(s->cache, at);
    if (!dirty && *spare == LOC_NONE)
        return NEED_RECORD;
    if (in_place) {
        rec_hdr *r = cache_update_begin(s->cache, at);
        memcpy(row, r, cache_rec_bytes(s->cache));
        int erc, skip = run_fn(s, w, id, r + 1, clock_next(r->clock), &erc);
        if (skip)
            memcpy(r, row, cache_rec_bytes(s->cache));
        else {
            r->clock = clock_next(r->clock);
            r->epoch = (uint32_t)atomic_load(&s->cur_epoch);
        }
        cache_update_end(s->cache, at);
        if (erc != EMBKV_OK)
            return erc;
        if (skip)
            return EMBKV_BUSY;
    } else {
        rec_hdr *r = (rec_hdr *)row;
        int rc;
        if (w->kind == W_PUT) {
            if ((rc = put_content(s, id, w, row)) != EMBKV_OK)
                return rc;
        } else {
            int erc, frc = run_fn(s, w, id, r + 1, clock_next(r->clock), &erc);
            if (erc != EMBKV_OK)
                return erc;
            if (frc)
                return EMBKV_BUSY;
            r->clock = clock_next(r->clock);
            r->epoch = (uint32_t)atomic_load(&s->cur_epoch);
        }
        if (logging && !dirty) {
            /* A snapshot may be open: the change goes through, logged. */
            bool consumed;
            rc = cache_write_home(s, ix, id, h, *spare, r, true, rb, &consumed);
            if (consumed) {
                cache_store_locked(s->cache, at, rec_at(s, *spare));
                *spare = LOC_NONE;
            }
            return rc;
        }
        /* (A dirty row in a logging group: no snapshot is open now, nor can
         * one open before this group ends and the row is written back.) */
        cache_store_locked(s->cache, at, row);
    }
    if (!dirty) {
        cache_mark_dirty_locked(s->cache, at, *spare);
        *spare = LOC_NONE;
    }
    return EMBKV_OK;
}

static int room_for(embkv_store *s, uint64_t puts, uint64_t deletes, bool hold)
{
    int rc = slab_room_for(s, puts, deletes, hold);
    if (rc != EMBKV_FULL || !s->log)
        return rc;
    /* Room made by moving cold rows to the log: as many as are missing,
     * and a margin, in one go. */
    size_t have = slab_free_count(s), moved = 0;
    uint64_t want = puts + deletes + s->delete_reserve + 256;
    int drc = tier_demote(s, want > have ? (size_t)(want - have) : 256, &moved);
    if (drc != EMBKV_OK)
        return drc;
    return slab_room_for(s, puts, deletes, hold);
}

int embkv_room_for(embkv_store *s, uint64_t puts, uint64_t deletes)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_room_for: store is NULL");
    /* Inside a group the room is the group's until it ends, as far as the
     * SSD tier's own moves go (promotions, hot-set moves: slab_alloc_move):
     * a COMMIT's reads of its rows' previous versions queue promotions
     * that would otherwise take the records its deletes counted on. */
    bool hold = group_held(s);
    int rc = room_for(s, puts, deletes, hold);
    if (rc == EMBKV_OK && hold)
        group_note_hold(s, (size_t)(puts + deletes));  /* (slab_room_for bounded both) */
    return rc;
}

int embkv_capacity_for(embkv_store *s, uint64_t new_rows)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_capacity_for: store is NULL");
    if (!s->log)
        return embkv_room_for(s, new_rows, 0);
    /* At most the pool's free records and those of the chunks it may still
     * allocate, and what the log can still take. */
    size_t free_recs, total;
    bool exhausted;
    slab_space(s, &free_recs, &total, &exhausted);
    uint64_t chunks = total / s->recs_per_chunk, limit = s->chunk_limit;
    if (!limit) {
        uint64_t index = atomic_load(&s->ix)->nbuckets * BUCKET_BYTES;
        uint64_t used = chunks * s->chunk_bytes + index;
        limit = chunks + (s->pool_size > used ? (s->pool_size - used) / s->chunk_bytes : 0);
    }
    uint64_t room = free_recs + (exhausted || limit <= chunks ? 0 : (limit - chunks) * s->recs_per_chunk);
    room = (room > s->delete_reserve ? room - s->delete_reserve : 0) + tier_log_room(s);
    if (new_rows <= room)
        return EMBKV_OK;
    return embkv__err(EMBKV_FULL, "store %s: %llu more rows do not fit: the pool and the SSD log together have room "
                      "for at most %llu more (ssd_size %llu, records of %u bytes): " LOG_GROW_ADVICE,
                      s->path, (unsigned long long)new_rows, (unsigned long long)room,
                      (unsigned long long)s->root->ssd_size, s->rec_size);
}


static int put_row(embkv_store *s, int64_t id, const float *vec, const float *state, unsigned flags,
                   uint64_t clock)
{
    if (!s || !vec)
        return embkv__err(EMBKV_INVALID, "embkv_put: %s is NULL", s ? "vec" : "store");
    if ((flags & EMBKV_PUT_INSERT) && (flags & EMBKV_PUT_UPDATE))
        return embkv__err(EMBKV_INVALID, "embkv_put: EMBKV_PUT_INSERT and EMBKV_PUT_UPDATE together");
    /* A stored row is finite: what it is trained with, read back by SQL
     * and exported, and its import, all require it. */
    uint32_t bad = first_not_finite(vec, s->dim);
    if (bad < s->dim)
        return embkv__err(EMBKV_INVALID, "store %s: id %lld: vector element %u is %s: rows hold finite values only",
                          s->path, (long long)id, bad, isnan(vec[bad]) ? "NaN" : "infinite");
    bad = state ? first_not_finite(state, s->state_floats) : s->state_floats;
    if (bad < s->state_floats)
        return embkv__err(EMBKV_INVALID, "store %s: id %lld: state element %u is %s: rows hold finite values only",
                          s->path, (long long)id, bad, isnan(state[bad]) ? "NaN" : "infinite");
    int rc = s->cache ? writeback_clean(s) : EMBKV_OK;
    if (rc == EMBKV_OK)
        rc = embkv_group_begin(s);
    if (rc != EMBKV_OK)
        return rc;
    rc = ix_grow_for(s, 1);
    uint64_t loc;
    if (rc != EMBKV_OK || (rc = alloc_records(s, &loc, 1, false)) != EMBKV_OK) {
        embkv_group_end(s);
        return rc;
    }
    uint64_t h = embkv__hash(id);
    char *scratch = NULL;
    write_req w = {.kind = W_PUT, .vec = vec, .state = state, .flags = flags, .clock = clock, .scratch = &scratch};
    retire_buf rb;
    rb_init(&rb);
    bool consumed;
    char *row = s->cache ? malloc(s->rec_size) : NULL;
    if (s->cache && !row) {
        embkv_group_end(s);
        slab_free(s, &loc, 1);
        return embkv__err(EMBKV_NOMEM, "embkv_put: out of memory");
    }
    pthread_rwlock_rdlock(&s->writers);
    keylock_acquire(s, h);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    rc = EMBKV_NOTFOUND;
    consumed = false;
    if (s->cache) {
        uint64_t spare = loc;
        rc = cache_write_locked(s, ix, id, h, -1, &w, group_logging(s), &spare, &rb, row);
        consumed = spare == LOC_NONE;
    }
    if (rc == EMBKV_NOTFOUND)  /* not cached */
        rc = write_row(s, ix, id, h, loc, &w, &rb, &consumed);
    ebr_leave();
    keylock_release(s, h);
    retire_flush(s, &rb);
    writers_unlock(s);
    embkv_group_end(s);
    free(row);
    if (!consumed)
        slab_free(s, &loc, 1);
    free(scratch);
    if (heat_counting(s))
        heat_touch(s->heat, h);
    atomic_fetch_add_explicit(&s->st_puts, 1, memory_order_relaxed);
    return rc;
}

int embkv_put(embkv_store *s, int64_t id, const float *vec, const float *state, unsigned flags)
{
    RO_REFUSE(s, "embkv_put");
    /* Unknown bits refused, not dropped: a flag of a newer release (or a
     * mistyped constant) must not be a plain put that says it worked. */
    unsigned unknown = flags & ~(unsigned)(EMBKV_PUT_INSERT | EMBKV_PUT_UPDATE | EMBKV_PUT_RESET);
    if (s && unknown)
        return embkv__err(EMBKV_INVALID, "embkv_put: store %s: id %lld: unknown flags 0x%x (known: EMBKV_PUT_INSERT, "
                          "EMBKV_PUT_UPDATE, EMBKV_PUT_RESET)", s->path, (long long)id, unknown);
    return put_row(s, id, vec, state, flags, 0);
}

int embkv_put_clock(embkv_store *s, int64_t id, const float *vec, const float *state, uint64_t clock)
{
    RO_REFUSE(s, "embkv_put_clock");
    if (clock > CLOCK_MAX)
        return embkv__err(EMBKV_INVALID, "embkv_put_clock: id %lld: clock %llu is over 2^63 - 1", (long long)id,
                          (unsigned long long)clock);
    return put_row(s, id, vec, state, PUT_CLOCK, clock);
}

/* One attempt at a delete.  A row whose durable version must survive until
 * the next sync needs a tombstone record: without one in *tloc the attempt
 * changes nothing and returns EMBKV_BUSY, and the caller allocates and
 * retries.  So a full pool still takes the deletes that need no tombstone. */
static int delete_once(embkv_store *s, int64_t id, uint64_t h, uint64_t *tloc, const delete_cond *c, bool *changed)
{
    int rc = EMBKV_OK;
    char *ssd = NULL;  /* the row's record, when it is in the log */
    retire_buf rb;
    rb_init(&rb);
    pthread_rwlock_rdlock(&s->writers);
    keylock_acquire(s, h);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    found_slot f;
    if (!ix_find(ix, id, h, &f) || (f.loc & LOC_TOMB)) {
        rc = embkv__err(EMBKV_NOTFOUND, "id %lld not found", (long long)id);
        goto out;
    }
    rec_hdr *old, damaged = {.id = id, .prev = LOC_NONE};
    if ((rc = tier_rec(s, id, f.loc, &ssd, &old, true)) != EMBKV_OK) {
        if (rc != EMBKV_CORRUPT || !(f.loc & LOC_SSD))
            goto out;
        /* A damaged log record (or segment) can still be deleted, as a
         * damaged pool record can: taken as durable (epoch 0), so that a
         * crash before the next sync returns to it, as it was. */
        old = &damaged;
        rc = EMBKV_OK;
    }
    if (c) {
        /* The version the caller saw, wherever it is now (a move between
         * tiers keeps clock and epoch; every write changes one of them).
         * A cached row is changed in place: its record is not the row. */
        bool dirty = false;
        if (old->clock != c->clock || rec_epoch(old) != c->epoch ||
            (s->cache && cache_find(s->cache, id, h, &dirty) >= 0 && dirty)) {
            *changed = true;
            goto out;
        }
    }
    uint32_t epoch = (uint32_t)atomic_load(&s->cur_epoch);
    bool keep = rec_epoch(old) < epoch;
    if ((keep || old->prev != LOC_NONE) && *tloc == LOC_NONE) {
        rc = EMBKV_BUSY;
        goto out;
    }
    bool pinned = true;
    if ((rc = snap_log(s, id, h, f.loc, &pinned)) != EMBKV_OK)
        goto out;
    /* A cached copy goes (with its changes since the last write-back):
     * the home's version is the one the delete replaces. */
    if (s->cache) {
        /* its reserved record was never visible: free now */
        uint64_t wb = cache_remove_locked(s->cache, id, h);
        if (wb != LOC_NONE)
            slab_free(s, &wb, 1);
    }
    uint64_t prev = displace(s, &rb, &f, old, epoch, pinned);
    if (prev == LOC_NONE) {
        /* Born in this epoch: nothing to return to after a crash. */
        ix_remove(ix, h, &f);
        atomic_fetch_sub(&s->entries, 1);
        rb_tell(s, &rb, id, f.loc, LOC_NONE);
    } else {
        /* The entry stays, pointing at a tombstone that links to the
         * durable version. */
        rec_hdr *t = rec_at(s, *tloc);
        memset(t + 1, 0, rec_payload_bytes(s));
        t->id = id;
        t->prev = prev;
        t->clock = old->clock;
        t->epoch = epoch | REC_TOMB;
        t->check = rec_checksum(s, t);
        persist_range(s, t, s->rec_size);
        persist_barrier(s);  /* (P1) */
        set_loc(s, ix, &f, *tloc | LOC_TOMB);
        rb_tell(s, &rb, id, f.loc, *tloc | LOC_TOMB);
        rb.tombs[rb.ntombs++] = (tomb_entry){id, *tloc | LOC_TOMB};
        *tloc = LOC_NONE;  /* consumed */
    }
    atomic_fetch_sub(&s->rows, 1);
    if (f.loc & LOC_SSD)
        atomic_fetch_sub(&s->rows_ssd, 1);
out:
    ebr_leave();
    keylock_release(s, h);
    retire_flush(s, &rb);
    writers_unlock(s);
    free(ssd);
    return rc;
}

static int delete_row(embkv_store *s, int64_t id, const delete_cond *c, bool *changed)
{
    uint64_t tloc = LOC_NONE, h = embkv__hash(id);
    int rc = embkv_group_begin(s);
    if (rc != EMBKV_OK)
        return rc;
    rc = delete_once(s, id, h, &tloc, c, changed);
    if (rc == EMBKV_BUSY) {
        if ((rc = alloc_records(s, &tloc, 1, true)) != EMBKV_OK) {
            embkv_group_end(s);
            return rc != EMBKV_FULL ? rc
                                    : embkv__err(rc, "id %lld: the pool is full and its reserve for deletes is "
                                                 "used up: delete at most %u rows between two syncs",
                                                 (long long)id, s->delete_reserve);
        }
        rc = delete_once(s, id, h, &tloc, c, changed);  /* cannot be EMBKV_BUSY with a tombstone in hand */
    }
    embkv_group_end(s);
    if (tloc != LOC_NONE)
        slab_free(s, &tloc, 1);
    if (!*changed)
        atomic_fetch_add_explicit(&s->st_deletes, 1, memory_order_relaxed);
    return rc;
}

int embkv_delete(embkv_store *s, int64_t id)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_delete: store is NULL");
    RO_REFUSE(s, "embkv_delete");
    bool changed = false;
    return delete_row(s, id, NULL, &changed);
}

int delete_if(embkv_store *s, int64_t id, const delete_cond *c, bool *changed)
{
    *changed = false;
    return delete_row(s, id, c, changed);
}

/* Hints a caller found for a write batch (update_batch_in_place), and
 * the gate of a batch split over two threads. */
typedef struct batch_hints {
    const int64_t *slot;   /* per row: its cache slot, or -1 (NULL: none found) */
    const uint8_t *dirty;  /* per row: cached dirty */
    write_gate *gate;      /* NULL: the batch is whole */
    int party;
} batch_hints;

void write_gate_init(write_gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->arrived[0] = g->arrived[1] = false;
    g->ok = true;
}

void write_gate_destroy(write_gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

bool write_gate_pass(write_gate *g, int party, bool ok)
{
    pthread_mutex_lock(&g->mu);
    if (!g->arrived[party]) {
        g->arrived[party] = true;
        g->ok = g->ok && ok;
        pthread_cond_broadcast(&g->cv);
    }
    while (!g->arrived[1 - party])
        pthread_cond_wait(&g->cv, &g->mu);
    bool both = g->ok;
    pthread_mutex_unlock(&g->mu);
    return both;
}

static int update_batch_in_group(embkv_store *s, const int64_t *ids, size_t n, embkv_update_fn fn, void *ctx,
                                 unsigned flags, const batch_hints *given, size_t *nupdated);

static int update_batch(embkv_store *s, const int64_t *ids, size_t n, embkv_update_fn fn, void *ctx,
                        unsigned flags, const batch_hints *given, size_t *nupdated);

int embkv_update_batch(embkv_store *s, const int64_t *ids, size_t n, embkv_update_fn fn, void *ctx,
                       unsigned flags, size_t *nupdated)
{
    RO_REFUSE(s, "embkv_update_batch");
    unsigned unknown = flags & ~(unsigned)EMBKV_UPDATE_CREATE;
    if (s && unknown) {
        if (nupdated)
            *nupdated = 0;
        return embkv__err(EMBKV_INVALID, "embkv_update_batch: store %s: unknown flags 0x%x (known: "
                          "EMBKV_UPDATE_CREATE)", s->path, unknown);
    }
    return update_batch(s, ids, n, fn, ctx, flags | UPDATE_FINITE, NULL, nupdated);
}

int update_batch_in_place(embkv_store *s, const int64_t *ids, size_t n, const int64_t *in_slot, const uint8_t *in_dirty,
                          embkv_update_fn fn, void *ctx, write_gate *gate, int party, size_t *nupdated)
{
    batch_hints h = {.slot = in_slot && in_dirty ? in_slot : NULL, .dirty = in_slot && in_dirty ? in_dirty : NULL,
                     .gate = gate, .party = party};
    int rc = update_batch(s, ids, n, fn, ctx, UPDATE_IN_PLACE, &h, nupdated);
    /* (one that failed before its gate lets the other half go) */
    if (gate)
        write_gate_pass(gate, party, false);
    return rc;
}

static int update_batch(embkv_store *s, const int64_t *ids, size_t n, embkv_update_fn fn, void *ctx,
                        unsigned flags, const batch_hints *given, size_t *nupdated)
{
    if (nupdated)
        *nupdated = 0;
    if (!s || !fn || (n && !ids))
        return embkv__null_arg("embkv_update_batch", "s", (const void *)s, "fn", (const void *)(uintptr_t)fn, "ids",
                               (const void *)ids, (char *)NULL);
    if (n == 0)
        return EMBKV_OK;
    int rc = s->cache ? writeback_clean(s) : EMBKV_OK;
    if (rc == EMBKV_OK)
        rc = embkv_group_begin(s);
    if (rc != EMBKV_OK)
        return rc;
    rc = update_batch_in_group(s, ids, n, fn, ctx, flags, given, nupdated);
    embkv_group_end(s);
    return rc;
}

/* The log-resident rows of a write batch, read in one go before the
 * write takes their locks: recs[j] (NULL for a row elsewhere) was read at
 * locs[j].  Only a store with rows in the log pays for the extra lookups;
 * on any failure recs stays NULL and each row is read under its lock
 * (which reports the error). */
typedef struct pre_read {
    uint64_t *locs;
    rec_hdr **recs;
    char *buf;
} pre_read;

static void pre_read_free(pre_read *p)
{
    free(p->locs);
    free(p->recs);
    free(p->buf);
    memset(p, 0, sizeof *p);
}

static void pre_read_rows(embkv_store *s, const int64_t *ids, size_t n, pre_read *p)
{
    memset(p, 0, sizeof *p);
    if (!s->log || atomic_load(&s->rows_ssd) == 0)
        return;
    p->locs = malloc(n * sizeof *p->locs);
    p->recs = calloc(n, sizeof *p->recs);
    if (!p->locs || !p->recs) {
        pre_read_free(p);
        return;
    }
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    for (size_t j = 0; j < n; j++) {
        uint64_t h = embkv__hash(ids[j]);
        /* A cached row is written from the cache: its home is not read. */
        p->locs[j] = s->cache && cache_contains(s->cache, ids[j], h) ? LOC_NONE
                                                                    : ix_lookup(ix, ids[j], h, &(uint32_t){0});
    }
    if (tier_read(s, ids, p->locs, n, &p->buf, p->recs, true) != EMBKV_OK || !p->buf)
        pre_read_free(p);
    ebr_leave();
}

static int update_batch_in_group(embkv_store *s, const int64_t *ids, size_t n, embkv_update_fn fn, void *ctx,
                                 unsigned flags, const batch_hints *given, size_t *nupdated)
{
    int rc = (flags & EMBKV_UPDATE_CREATE) ? ix_grow_for(s, n) : EMBKV_OK;
    if (rc != EMBKV_OK)
        return rc;
    cache *c = s->cache;
    bool logging = c && group_logging(s);
    char *row = NULL;
    if (c && !(row = malloc(s->rec_size)))
        return embkv__err(EMBKV_NOMEM, "embkv_update_batch: out of memory");
    /* A dirty cached row is updated in place (no record, no bucket read);
     * every other row takes a record: a new version, or a clean cached row
     * the one its write-back will fill.  No row is written back during
     * the group, but one deleted and written again needs a record it was
     * not counted for: taken when the row is reached. */
    /* Per row: its slot, or -1; found here, or by the caller earlier in
     * this group (the existence check of a push). */
    int64_t *own = c && !logging && !(given && given->slot) ? malloc(n * sizeof *own) : NULL;
    /* (with own: each row's stamp in the sketch, 0: none; see the count below) */
    uint32_t *stamps = own && heat_counting(s) ? calloc(n, sizeof *stamps) : NULL;
    const int64_t *hint = own;
    size_t want = n;
    if (c && !logging && given && given->slot) {
        hint = given->slot;
        want = 0;
        for (size_t j = 0; j < n; j++)
            want += !given->dirty[j];
    } else if (own) {
        want = 0;
        for (size_t j = 0; j < n && j < 8; j++)
            cache_prefetch(c, embkv__hash(ids[j]));
        for (size_t j = 0; j < n; j++) {
            if (j + 8 < n)
                cache_prefetch(c, embkv__hash(ids[j + 8]));
            bool dirty = false;
            if (stamps) {
                own[j] = cache_find_heat(c, ids[j], embkv__hash(ids[j]), &stamps[j]);
                dirty = own[j] >= 0 && cache_slot_dirty(c, own[j]);
            } else {
                own[j] = cache_find(c, ids[j], embkv__hash(ids[j]), &dirty);
            }
            want += !dirty;
        }
    } else if (c && !logging) {
        free(row);
        return embkv__err(EMBKV_NOMEM, "embkv_update_batch: out of memory for %zu rows", n);
    }
    uint64_t *fresh = malloc(n * sizeof *fresh);
    if (!fresh || (want && (rc = alloc_records(s, fresh, want, false)) != EMBKV_OK)) {
        free(own);
        free(stamps);
        free(row);
        free(fresh);
        return fresh ? rc : embkv__err(EMBKV_NOMEM, "embkv_update_batch: out of memory for %zu rows", n);
    }
    size_t nfresh = want;
    pre_read pre;
    pre_read_rows(s, ids, n, &pre);
    size_t next_fresh = 0, updated = 0;
    uint64_t hits = 0;
    retire_buf *rb = malloc(sizeof *rb);
    char *scratch = NULL;
    write_req w = {.kind = W_UPDATE, .flags = flags, .fn = fn, .ctx = ctx, .scratch = &scratch};
    bool nomem = !rb || (s->dtype != EMBKV_F32 && !(w.rowbuf = malloc(4 * ((size_t)s->dim + s->state_floats))));
    /* A batch split over two threads changes no row unless both halves
     * have their records: a full pool fails the whole push, as it fails a
     * push on one thread, before any row changes. */
    bool cancelled = !nomem && given && given->gate && !write_gate_pass(given->gate, given->party, true);
    if (nomem || cancelled) {
        slab_free(s, fresh, nfresh);
        free(fresh);
        free(rb);
        free(row);
        free(own);
        free(stamps);
        free(w.rowbuf);
        pre_read_free(&pre);
        return nomem ? embkv__err(EMBKV_NOMEM, "embkv_update_batch: out of memory") : WRITE_CANCELLED;
    }
    rb_init(rb);
    uint64_t hs[RING];

    /* The whole batch lands in one epoch: a sync waits for it. */
    heat_buf hb;
    heat_buf_init(s, &hb, stamps != NULL);  /* (the clock, and skips counted; no stamp filed: ids -1) */
    pthread_rwlock_rdlock(&s->writers);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    for (size_t i = 0; i < n + PF_BUCKET && rc == EMBKV_OK; i++) {
        if (i < n) {
            uint64_t h = embkv__hash(ids[i]);
            hs[i % RING] = h;
            if (!hint || hint[i] < 0)
                PREFETCH_BUCKET(&ix->buckets[h & ix->mask], 1);
            /* Every update counts, cached or not (the rows the cache holds
             * would look half as hot as the others if its pushes did not):
             * a cached row of a push was counted by its existence check
             * (exists_batch_hints: given->slot, used or not, a snapshot
             * open); one found saturated under the current stamp changes
             * nothing when touched. */
            if (heat_counting(s) && !(given && given->slot && given->slot[i] >= 0)) {
                if (stamps && stamps[i] && stamps[i] == heat_stamp(s->heat, &hb.clk, h))
                    heat_skip(s, &hb);
                else
                    heat_add(s, &hb, h, -1);
            }
        }
        if (i >= PF_BUCKET - PF_RECORD && i - (PF_BUCKET - PF_RECORD) < n) {
            size_t j = i - (PF_BUCKET - PF_RECORD);
            if (hint && hint[j] >= 0)
                cache_prefetch_slot(c, hint[j], 1);
            else {
                uint32_t probes;
                uint64_t loc = ix_lookup(ix, ids[j], hs[j % RING], &probes);
                /* All of the old version: its checksum is checked and
                 * its vector and state copied (the vector alone left the
                 * check waiting on the state's lines: a fifth of a push). */
                if (loc != LOC_NONE && !(loc & (LOC_TOMB | LOC_SSD))) {
                    const char *op = (const char *)rec_at(s, loc);
                    for (size_t off = 0; off < s->rec_size; off += 64)
                        __builtin_prefetch(op + off, 0, 3);
                }
                /* The fresh record this row will most likely be written to. */
                if (nfresh) {
                    size_t k = next_fresh + PF_RECORD < nfresh ? next_fresh + PF_RECORD : nfresh - 1;
                    const char *fr = (const char *)rec_at(s, fresh[k]);
                    for (size_t off = 0; off < s->rec_size; off += 64)
                        __builtin_prefetch(fr + off, 1, 3);
                }
            }
        }
        if (i >= PF_BUCKET) {
            size_t j = i - PF_BUCKET;
            uint64_t h = hs[j % RING];
            bool consumed = false;
            w.index = j;
            if (pre.recs) {
                w.pre = pre.recs[j];
                w.pre_loc = pre.locs[j];
            }
            int r;
            uint64_t spare;
            bool locked;
            for (;;) {
                keylock_acquire(s, h);
                locked = true;
                r = EMBKV_NOTFOUND;
                spare = next_fresh < nfresh ? fresh[next_fresh] : LOC_NONE;
                if (c) {
                    r = cache_write_locked(s, ix, ids[j], h, hint ? hint[j] : -1, &w, logging, &spare, rb, row);
                    if (r != EMBKV_NOTFOUND && r != NEED_RECORD) {
                        hits++;
                        if (r == EMBKV_OK)
                            updated++;
                        if (spare == LOC_NONE && next_fresh < nfresh)
                            next_fresh++;  /* taken for its write-back, or went through */
                    }
                }
                if (r != NEED_RECORD && (r != EMBKV_NOTFOUND || spare != LOC_NONE))
                    break;
                /* The records counted ran out: a row counted dirty was
                 * deleted since (its reserved record went with it) and
                 * written again, or its slot changed hands.  One more
                 * (without demotions: the writers lock is held), at most
                 * one per row, so fresh has room; then the row again. */
                keylock_release(s, h);
                locked = false;
                if (slab_alloc(s, fresh + nfresh, 1) != EMBKV_OK) {
                    r = embkv__err(EMBKV_FULL, "store %s: no record left for id %lld", s->path, (long long)ids[j]);
                    break;
                }
                nfresh++;
            }
            if (!locked) {
                rc = r;
                free(scratch);
                scratch = NULL;
                continue;
            }
            if (r == EMBKV_NOTFOUND) {
                r = write_row(s, ix, ids[j], h, spare, &w, rb, &consumed);
                /* The new version may take a colder row's place. */
                if (c && consumed && !logging)
                    cache_admit_locked(s, c, ids[j], h, rec_at(s, spare), false);
                if (consumed) {
                    next_fresh++;
                    updated++;
                }
            }
            keylock_release(s, h);
            free(scratch);
            scratch = NULL;
            if (r != EMBKV_OK && r != EMBKV_BUSY)
                rc = r;
        }
    }
    ebr_leave();
    heat_flush(s, &hb);
    retire_flush(s, rb);
    writers_unlock(s);
    if (c)
        cache_count(c, hits, n - hits);
    free(row);
    free(own);
    free(stamps);
    free(w.rowbuf);
    if (next_fresh < nfresh)
        slab_free(s, fresh + next_fresh, nfresh - next_fresh);
    free(fresh);
    free(rb);
    pre_read_free(&pre);
    if (nupdated)
        *nupdated = updated;
    atomic_fetch_add_explicit(&s->st_puts, updated, memory_order_relaxed);
    return rc;
}
