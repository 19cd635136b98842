/*
 * read.c - reads of rows: single gets, existence checks, batch gets (the
 * PetPS batch pipeline), snapshot reads, and the offers of what they read
 * to the DRAM cache.
 *
 * Reads take no lock: they run inside an epoch (so a record they found
 * cannot be reused under them, P6) and read buckets under their seqlock.
 * A record read from the pool is checked (rec_ok) before it is handed
 * out.  Rows in the SSD log (tier.c) are read in one batch per call,
 * after the per-row loop.  A snapshot read resolves each id through the
 * version log (snapshot.c) after the index lookup.
 */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "batch.h"

/* Read paths: a row a batch read from the pool is admitted when the access
 * statistics rank it above the victim (cache.c).  Only with its key lock
 * free and the index still naming the record that was read (loc), or with
 * loc LOC_NONE any pool record it names. */
static void cache_offer_read(embkv_store *s, int64_t id, uint64_t h, uint64_t loc)
{
    if (!cache_worth_admitting(s, s->cache, h) || !keylock_try(s, h))
        return;
    uint32_t probes;
    uint64_t now = ix_lookup(atomic_load(&s->ix), id, h, &probes);
    if (loc == LOC_NONE ? now != LOC_NONE && !(now & (LOC_TOMB | LOC_SSD)) : now == loc) {
        rec_hdr *r = rec_at(s, now);
        /* Whole: the batch checked only the id, and the cache's copy is
         * served to the reads that verify records. */
        if (rec_ok(s, r, id))
            cache_admit_locked(s, s->cache, id, h, r, false);
    }
    keylock_release(s, h);
}

void embkv_cache_offer(embkv_store *s, const int64_t *ids, size_t n)
{
    if (!s || !s->cache || !ids)
        return;
    ebr_enter();
    for (size_t i = 0; i < n; i++) {
        /* (A cached row is not weighed: that would count a refusal.) */
        uint64_t h = embkv__hash(ids[i]);
        if (!cache_contains(s->cache, ids[i], h))
            cache_offer_read(s, ids[i], h, LOC_NONE);
    }
    ebr_leave();
}

/* ------------------------------------------------------------ reads */

/* embkv_get; counted false, a read that the cache's hits and misses and
 * the access statistics do not count (get_uncounted). */
static int get_one(embkv_store *s, int64_t id, float *vec, float *state, embkv_rowinfo *info, bool counted)
{
    int rc = EMBKV_OK;
    ebr_enter();
    if (s->cache) {
        rec_hdr hd;
        uint64_t h = embkv__hash(id);
        bool hit = cache_read(s->cache, id, h, &hd, vec, s->dim, state, s->state_floats);
        if (counted)
            cache_count(s->cache, hit, !hit);
        if (hit) {
            ebr_leave();
            if (info) {
                info->clock = hd.clock;
                info->epoch = rec_epoch(&hd);
                info->tier = EMBKV_TIER_DRAM;
            }
            if (counted && heat_counting(s))
                heat_touch(s->heat, h);
            atomic_fetch_add_explicit(&s->st_gets, 1, memory_order_relaxed);
            return EMBKV_OK;
        }
    }
    uint64_t loc = ix_lookup(atomic_load(&s->ix), id, embkv__hash(id), &(uint32_t){0});
    if (loc == LOC_NONE || (loc & LOC_TOMB)) {
        rc = embkv__err(EMBKV_NOTFOUND, "id %lld not found", (long long)id);
    } else {
        rec_hdr *r = NULL;
        char *buf = NULL;
        if ((rc = tier_rec(s, id, loc, &buf, &r, false)) != EMBKV_OK || (!(loc & LOC_SSD) && !rec_ok(s, r, id))) {
            ebr_leave();
            free(buf);
            return rc != EMBKV_OK ? rc : rec_damaged(s, id);
        }
        if (vec)
            rec_vec_get(s, r, vec);
        if (state)
            memcpy(state, rec_state(s, r), 4 * (size_t)s->state_floats);
        if (info)
            fill_info(info, r, loc);
        if (counted && heat_counting(s))
            heat_touch(s->heat, embkv__hash(id));
        if (buf)
            tier_note_read(s, &id, &loc, &r, 1);
        free(buf);
    }
    ebr_leave();
    atomic_fetch_add_explicit(&s->st_gets, 1, memory_order_relaxed);
    return rc;
}

int embkv_get(embkv_store *s, int64_t id, float *vec, float *state, embkv_rowinfo *info)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_get: store is NULL");
    FORK_REFUSE(s, "embkv_get");
    if (s->reader) {
        uint8_t found = 0;
        int rc = ro_read(s, 0, &id, 1, vec, state, info, &found, NULL, NULL);
        return rc != EMBKV_OK ? rc : found ? EMBKV_OK : embkv__err(EMBKV_NOTFOUND, "id %lld not found", (long long)id);
    }
    return get_one(s, id, vec, state, info, true);
}

int get_uncounted(embkv_store *s, int64_t id, float *vec)
{
    return get_one(s, id, vec, NULL, NULL, false);
}

int embkv_exists(embkv_store *s, int64_t id)
{
    if (!s) {
        (void)embkv__null_arg("embkv_exists", "s", (const void *)s, (char *)NULL);
        return 0;
    }
    if (s->reader) {
        uint8_t found = 0;
        return ro_read(s, 0, &id, 1, NULL, NULL, NULL, &found, NULL, NULL) == EMBKV_OK && found;
    }
    ebr_enter();
    uint64_t loc = ix_lookup(atomic_load(&s->ix), id, embkv__hash(id), &(uint32_t){0});
    ebr_leave();
    return loc != LOC_NONE && !(loc & LOC_TOMB);
}

size_t embkv_exists_batch(embkv_store *s, const int64_t *ids, size_t n, uint8_t *found)
{
    if (!n)
        return 0;
    if (!s || !ids) {
        /* A count, not an rc: every id absent, as embkv_exists(NULL) says,
         * and the message names the argument. */
        (void)embkv__null_arg("embkv_exists_batch", "s", (const void *)s, "ids", (const void *)ids, (char *)NULL);
        if (found)
            memset(found, 0, n);
        return n;
    }
    if (!found) {
        /* The count alone: found in blocks of a buffer of our own. */
        uint8_t buf[256];
        size_t absent = 0;
        for (size_t lo = 0; lo < n; lo += sizeof buf)
            absent += embkv_exists_batch(s, ids + lo, n - lo < sizeof buf ? n - lo : sizeof buf, buf);
        return absent;
    }
    if (s->reader) {
        size_t missing = n;
        if (ro_read(s, 0, ids, n, NULL, NULL, NULL, found, &missing, NULL) != EMBKV_OK) {
            if (found)
                memset(found, 0, n);
            return n;
        }
        return missing;
    }
    return exists_batch_hints(s, ids, n, found, NULL, NULL);
}

size_t exists_batch_hints(embkv_store *s, const int64_t *ids, size_t n, uint8_t *found, int64_t *in_slot,
                          uint8_t *in_dirty)
{
    uint64_t hs[RING];
    uint8_t cached[RING];
    size_t absent = 0;
    cache *c = s->cache;
    bool count = in_slot && c && heat_counting(s);
    heat_buf hb;
    heat_buf_init(s, &hb, count);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    for (size_t i = 0; i < n + PF_BUCKET; i++) {
        if (i < n) {
            uint64_t h = embkv__hash(ids[i]);
            hs[i % RING] = h;
            if (c)
                cache_prefetch(c, h);
            else
                PREFETCH_BUCKET(&ix->buckets[h & ix->mask], 0);
        }
        /* A cached row is in the index: its bucket need not be read (the
         * cache's line, fetched a few ids ago, says). */
        if (c && i >= PF_CACHE && i - PF_CACHE < n) {
            size_t j = i - PF_CACHE;
            bool d = false;
            uint32_t stamp = 0;
            int64_t si = count ? cache_find_heat(c, ids[j], hs[j % RING], &stamp)
                               : cache_find(c, ids[j], hs[j % RING], &d);
            if (count && si >= 0)
                d = cache_slot_dirty(c, si);
            cached[j % RING] = si >= 0;
            if (in_slot) {
                in_slot[j] = si;
                in_dirty[j] = si >= 0 && d;
            }
            if (count && si >= 0) {
                if (stamp && stamp == heat_stamp(s->heat, &hb.clk, hs[j % RING]))
                    heat_skip(s, &hb);
                else
                    heat_add(s, &hb, hs[j % RING], ids[j]);
            }
            if (!cached[j % RING])
                PREFETCH_BUCKET(&ix->buckets[hs[j % RING] & ix->mask], 0);
        }
        if (i >= PF_BUCKET) {
            size_t j = i - PF_BUCKET;
            if (c && cached[j % RING]) {
                found[j] = 1;
                continue;
            }
            uint32_t probes;
            uint64_t loc = ix_lookup(ix, ids[j], hs[j % RING], &probes);
            found[j] = loc != LOC_NONE && !(loc & LOC_TOMB);
            absent += !found[j];
        }
    }
    ebr_leave();
    if (count)
        heat_flush(s, &hb);
    return absent;
}

/* The vectors of a batch's log-resident rows (positions at.v[i], locations
 * locs.v[i]), in one log read. */
int read_ssd_rows(embkv_store *s, const int64_t *ids, const locvec *at, const locvec *locs, float *out,
                  const size_t *out_row, size_t stride)
{
    size_t k = at->n;
    int64_t *kid = calloc(k ? k : 1, sizeof *kid);
    rec_hdr **recs = malloc((k ? k : 1) * sizeof *recs);
    char *buf = NULL;
    int rc = EMBKV_OK;
    if (!kid || !recs) {
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory reading %zu rows from the SSD tier", s->path, k);
    } else {
        for (size_t i = 0; i < k; i++)
            kid[i] = ids[at->v[i]];
        rc = tier_read(s, kid, locs->v, k, &buf, recs, false);
        for (size_t i = 0; i < k && rc == EMBKV_OK; i++)
            rec_vec_get(s, recs[i], out + (out_row ? out_row[at->v[i]] : at->v[i]) * stride);
        if (rc == EMBKV_OK) {
            tier_note_read(s, kid, locs->v, recs, k);
            /* A pull's push comes next: it finds the rows in the stage. */
            la_offer(s, kid, locs->v, recs, k);
        }
    }
    free(kid);
    free(buf);
    free(recs);
    return rc;
}

/* Where get_batch_rows puts row j of its batch. */
#define OUT_ROW(j) (out + (out_row ? out_row[j] : (j)) * s->dim)

/* PetPS-style batch pipeline: the home bucket of id i+PF_BUCKET and the
 * record of id i+PF_RECORD are in flight while id i is copied, so a batch
 * pays roughly one memory latency per PF_RECORD ids, not one per id. */
int embkv_get_batch(embkv_store *s, const int64_t *ids, size_t n, float *out, uint8_t *found,
                    size_t *nmissing)
{
    if (!s || (n && (!ids || !out)))
        return embkv__null_arg("embkv_get_batch", "s", (const void *)s, "ids", (const void *)ids, "out",
                               (const void *)out, (char *)NULL);
    FORK_REFUSE(s, "embkv_get_batch");
    if (s->reader)
        return ro_read(s, 0, ids, n, out, NULL, NULL, found, nmissing, NULL);
    return get_batch_rows(s, ids, n, out, NULL, found, nmissing);
}

int get_batch_rows(embkv_store *s, const int64_t *ids, size_t n, float *out, const size_t *out_row, uint8_t *found,
                   size_t *nmissing)
{
    uint64_t hs[RING], locs[RING];
    size_t missing = 0, vbytes = 4 * (size_t)s->dim;
    int64_t bad = 0;
    bool damaged = false;
    /* Rows in the SSD log: gathered here, read in one batch at the end. */
    locvec ssd_at = {0}, ssd_locs = {0};
    int rc = EMBKV_OK;
    cache *c = s->cache;
    heat_buf hb;
    heat_buf_init(s, &hb, c != NULL);
    uint64_t hits = 0;
    /* Pool rows worth offering to the cache (admitted after the batch):
     * every one, on the heap past 512 (only 512 were, so a pull of 4,000
     * rows into a cache with room for all took 8 pulls to bring them in;
     * out of memory, the first 512 still are). */
    enum { OFFERS = 512 };
    struct offer { size_t at; uint64_t loc; } offer_stack[OFFERS], *offers = offer_stack;
    size_t noffer = 0, offer_cap = OFFERS;
    if (c && n > OFFERS) {
        struct offer *big = malloc(n * sizeof *big);
        if (big) {
            offers = big;
            offer_cap = n;
        }
    }
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    int64_t cslot[RING];  /* per id in flight: its cache slot, or -1 */
    for (size_t i = 0; i < n + PF_BUCKET; i++) {
        if (i < n) {
            uint64_t h = embkv__hash(ids[i]);
            hs[i % RING] = h;
            if (c) {
                cache_prefetch(c, h);
            } else {
                PREFETCH_BUCKET(&ix->buckets[h & ix->mask], 0);
                if (heat_counting(s))
                    heat_add(s, &hb, h, -1);
            }
        }
        /* With a cache, a few ids later: the cache's answer decides whether
         * the row's slot or its bucket is fetched, and whether the sketch
         * is touched (a cached row known saturated is only counted: its
         * touch would change nothing, and the line is a tenth of a hit). */
        if (c && i >= PF_CACHE && i - PF_CACHE < n) {
            size_t j = i - PF_CACHE;
            uint64_t h = hs[j % RING];
            uint32_t stamp;
            int64_t si = cslot[j % RING] = cache_find_heat(c, ids[j], h, &stamp);
            if (si >= 0)
                cache_prefetch_slot(c, si, 0);
            else
                PREFETCH_BUCKET(&ix->buckets[h & ix->mask], 0);
            if (heat_counting(s)) {
                if (si >= 0 && stamp && stamp == heat_stamp(s->heat, &hb.clk, h))
                    heat_skip(s, &hb);
                else
                    heat_add(s, &hb, h, si >= 0 ? ids[j] : -1);
            }
        }
        if (i >= PF_BUCKET - PF_RECORD && i - (PF_BUCKET - PF_RECORD) < n) {
            size_t j = i - (PF_BUCKET - PF_RECORD);
            if (c && cslot[j % RING] >= 0) {
                locs[j % RING] = LOC_CACHED;  /* read below, its lines on the way */
            } else {
                uint32_t probes;
                uint64_t loc = ix_lookup(ix, ids[j], hs[j % RING], &probes);
                locs[j % RING] = loc;
                if (loc != LOC_NONE && !(loc & (LOC_TOMB | LOC_SSD)))
                    prefetch_record(s, loc);
            }
        }
        if (i >= PF_BUCKET) {
            size_t j = i - PF_BUCKET;
            uint64_t loc = locs[j % RING];
            if (loc == LOC_CACHED) {
                if (cache_read_at(c, cslot[j % RING], ids[j], hs[j % RING], NULL, OUT_ROW(j), s->dim, NULL, 0)) {
                    hits++;
                    if (found)
                        found[j] = true;
                    continue;
                }
                /* evicted meanwhile: from its home (one lookup, unprefetched) */
                uint32_t probes;
                loc = ix_lookup(ix, ids[j], hs[j % RING], &probes);
            }
            if (c && noffer < offer_cap && loc != LOC_NONE && !(loc & (LOC_TOMB | LOC_SSD)))
                offers[noffer++] = (struct offer){.at = j, .loc = loc};
            bool ok = loc != LOC_NONE && !(loc & (LOC_TOMB | LOC_SSD));
            if ((loc & LOC_SSD) && !(loc & LOC_TOMB)) {
                if (locvec_push(&ssd_at, j) != EMBKV_OK || locvec_push(&ssd_locs, loc) != EMBKV_OK) {
                    rc = embkv__err(EMBKV_NOMEM, "embkv_get_batch: out of memory");
                    break;
                }
                if (found)
                    found[j] = true;
                continue;
            }
            if (ok) {
                rec_hdr *r = rec_at(s, loc);
                /* The pull path checks the record's id only (its checksum
                 * would halve the throughput): the update that follows a
                 * pull verifies it whole. */
                bool decoded = rec_vec_get(s, r, OUT_ROW(j));
                if ((r->id != ids[j] || !decoded) && !damaged) {
                    damaged = true;
                    bad = ids[j];
                }
            } else {
                memset(OUT_ROW(j), 0, vbytes);
                missing++;
            }
            if (found)
                found[j] = ok;
        }
    }
    heat_flush(s, &hb);
    if (ssd_at.n && rc == EMBKV_OK)
        rc = read_ssd_rows(s, ids, &ssd_at, &ssd_locs, out, out_row, s->dim);
    if (c) {
        cache_count(c, hits, n - hits);
        for (size_t k = 0; k < noffer && rc == EMBKV_OK && !damaged; k++)
            cache_offer_read(s, ids[offers[k].at], embkv__hash(ids[offers[k].at]), offers[k].loc);
    }
    ebr_leave();
    if (offers != offer_stack)
        free(offers);
    free(ssd_at.v);
    free(ssd_locs.v);
    if (nmissing)
        *nmissing = missing;
    atomic_fetch_add_explicit(&s->st_batch_gets, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->st_gets, n, memory_order_relaxed);
    if (rc != EMBKV_OK)
        return rc;
    return damaged ? rec_damaged(s, bad) : EMBKV_OK;
}

#undef OUT_ROW

#define AT_BLOCK 256

/* embkv_get_batch's pipeline in three passes per block of ids: index
 * lookups, then (under a snapshot) the version log, then the copies, so
 * that the log is read after every index entry it may correct. */
/* The cached rows among a block of a read (as of snap, or now): those the
 * version log did not decide are read from the cache (out, info: the
 * block's rows) and marked LOC_CACHED.  Under a snapshot, a row written
 * since the log was read went through (snapshot.c: no row is dirty while
 * one is open), so its log entry is there now: read again, the log wins. */
static void cached_rows(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t m, uint64_t *locs,
                        const uint8_t *logged, float *out, float *state, embkv_rowinfo *info)
{
    uint8_t cached[AT_BLOCK];
    size_t nc = 0;
    for (size_t j = 0; j < m; j++) {
        cached[j] = 0;
        if (logged[j] || locs[j] == LOC_NONE || (locs[j] & LOC_TOMB))
            continue;
        uint64_t h = embkv__hash(ids[j]);
        rec_hdr hd;
        bool hit = out || state || info
                       ? cache_read(s->cache, ids[j], h, &hd, out ? out + j * s->dim : NULL, s->dim,
                                    state ? state + j * s->state_floats : NULL, s->state_floats)
                       : cache_contains(s->cache, ids[j], h);
        if (!hit)
            continue;
        cached[j] = 1;
        nc++;
        if (info) {
            info[j].clock = hd.clock;
            info[j].epoch = rec_epoch(&hd);
            info[j].tier = EMBKV_TIER_DRAM;
        }
    }
    if (nc && snap) {
        uint64_t again[AT_BLOCK];
        uint8_t lg[AT_BLOCK];
        memcpy(again, locs, m * sizeof *again);
        snap_resolve(s, snap, ids, m, again, lg);
        for (size_t j = 0; j < m; j++)
            if (cached[j] && lg[j]) {
                cached[j] = 0;
                locs[j] = again[j];
            }
    }
    for (size_t j = 0; j < m; j++)
        if (cached[j])
            locs[j] = LOC_CACHED;
}

/* Lookups by id at a snapshot (embkv_get_batch_at: SQL's point and IN
 * reads) offer the rows they read from the log to promotion, as embkv_get
 * does: a row read often is hot whatever call reads it.  Copies' reads
 * (embkv_get_rows_at: scans, exports, backups, a COMMIT's pre-images)
 * offer nothing.  A version the snapshot's log gave is not the row's
 * current one, whose place the promotion would take. */
static void offer_promotion(embkv_store *s, const int64_t *bid, size_t m, const uint64_t *locs,
                            const uint8_t *logged, rec_hdr *const *recs)
{
    int64_t ids[AT_BLOCK];
    uint64_t at[AT_BLOCK];
    rec_hdr *rs[AT_BLOCK];
    size_t k = 0;
    for (size_t j = 0; j < m; j++)
        if (!logged[j] && (locs[j] & LOC_SSD) && !(locs[j] & LOC_TOMB)) {
            ids[k] = bid[j];
            at[k] = locs[j];
            rs[k++] = recs[j];
        }
    if (k)
        tier_note_read(s, ids, at, rs, k);
}

/* get_batch_at, get_rows_at and locate_batch_at: with neither out, state
 * nor info, rows in the log are not read (the index says where they are). */
static int get_batch(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, float *out,
                     float *state, embkv_rowinfo *info, int *tiers, uint8_t *found, size_t *nmissing, bool offer)
{
    uint64_t locs[AT_BLOCK];
    rec_hdr *recs[AT_BLOCK];
    size_t missing = 0, vbytes = 4 * (size_t)s->dim, sbytes = 4 * (size_t)s->state_floats;
    bool read = out || state || info;
    char *ssd_buf = NULL;  /* the block's log records */
    ebr_enter();
    for (size_t lo = 0; lo < n; lo += AT_BLOCK) {
        size_t m = n - lo < AT_BLOCK ? n - lo : AT_BLOCK;
        const int64_t *bid = ids + lo;
        index_desc *ix = atomic_load(&s->ix);
        uint64_t hs[RING];
        for (size_t i = 0; i < m + PF_BUCKET; i++) {
            if (i < m) {
                hs[i % RING] = embkv__hash(bid[i]);
                PREFETCH_BUCKET(&ix->buckets[hs[i % RING] & ix->mask], 0);
            }
            if (i >= PF_BUCKET) {
                size_t j = i - PF_BUCKET;
                uint32_t probes;
                locs[j] = ix_lookup(ix, bid[j], hs[j % RING], &probes);
            }
        }
        uint8_t logged[AT_BLOCK];
        snap_resolve(s, snap, bid, m, locs, logged);
        if (s->cache)
            cached_rows(s, snap, bid, m, locs, logged, out ? out + lo * s->dim : NULL,
                        state ? state + lo * s->state_floats : NULL, info ? info + lo : NULL);
        free(ssd_buf);
        ssd_buf = NULL;
        int trc = read ? tier_read(s, bid, locs, m, &ssd_buf, recs, false) : EMBKV_OK;
        if (trc != EMBKV_OK) {
            ebr_leave();
            return trc;
        }
        for (size_t j = 0; j < m; j++) {
            uint64_t loc = locs[j];
            if (loc == LOC_CACHED) {
                /* out and info were filled from the cache */
                if (tiers)
                    tiers[lo + j] = EMBKV_TIER_DRAM;
                if (found)
                    found[lo + j] = 1;
                continue;
            }
            bool ok = loc != LOC_NONE && !(loc & LOC_TOMB), ssd = ok && (loc & LOC_SSD);
            if (j + PF_RECORD < m && locs[j + PF_RECORD] != LOC_NONE &&
                !(locs[j + PF_RECORD] & (LOC_TOMB | LOC_SSD)))
                prefetch_record(s, locs[j + PF_RECORD]);
            const rec_hdr *r = ssd ? (read ? recs[j] : NULL) : ok ? rec_at(s, loc) : NULL;
            /* With the vector or state read, the whole record is verified;
             * an existence read (count, ids, a DELETE finding its rows)
             * checks the id, so that a damaged row can still be deleted. */
            if (r && !ssd && (out || state ? !rec_ok(s, r, bid[j]) : r->id != bid[j])) {
                ebr_leave();
                free(ssd_buf);
                return rec_damaged(s, bid[j]);
            }
            if (out) {
                if (ok)
                    rec_vec_get(s, (rec_hdr *)r, out + (lo + j) * s->dim);
                else
                    memset(out + (lo + j) * s->dim, 0, vbytes);
            }
            if (state && sbytes) {
                if (ok)
                    memcpy(state + (lo + j) * s->state_floats, rec_state(s, (rec_hdr *)r), sbytes);
                else
                    memset(state + (lo + j) * s->state_floats, 0, sbytes);
            }
            if (info) {
                if (ok)
                    fill_info(&info[lo + j], r, loc);
                else
                    memset(&info[lo + j], 0, sizeof info[lo + j]);
            }
            if (tiers)
                tiers[lo + j] = !ok ? -1 : ssd ? EMBKV_TIER_SSD : EMBKV_TIER_PM;
            if (found)
                found[lo + j] = ok;
            missing += !ok;
        }
        if (ssd_buf && offer)
            offer_promotion(s, bid, m, locs, logged, recs);
    }
    ebr_leave();
    free(ssd_buf);
    if (nmissing)
        *nmissing = missing;
    atomic_fetch_add_explicit(&s->st_batch_gets, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->st_gets, n, memory_order_relaxed);
    return EMBKV_OK;
}

int embkv_get_batch_at(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, float *out,
                       embkv_rowinfo *info, uint8_t *found, size_t *nmissing)
{
    if (!s || (n && !ids))
        return embkv__null_arg("embkv_get_batch_at", "s", (const void *)s, "ids", (const void *)ids, (char *)NULL);
    FORK_REFUSE(s, "embkv_get_batch_at");
    int rc = snap_check_store(s, snap, "embkv_get_batch_at");
    if (rc != EMBKV_OK)
        return rc;
    if (s->reader)
        return ro_read(s, snap_as_of(snap), ids, n, out, NULL, info, found, nmissing, NULL);
    return get_batch(s, snap, ids, n, out, NULL, info, NULL, found, nmissing, true);
}

int embkv_get_rows_at(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, float *out,
                      float *state, embkv_rowinfo *info, uint8_t *found, size_t *nmissing)
{
    if (!s || (n && !ids))
        return embkv__null_arg("embkv_get_rows_at", "s", (const void *)s, "ids", (const void *)ids, (char *)NULL);
    FORK_REFUSE(s, "embkv_get_rows_at");
    int rc = snap_check_store(s, snap, "embkv_get_rows_at");
    if (rc != EMBKV_OK)
        return rc;
    if (s->reader)
        return ro_read(s, snap_as_of(snap), ids, n, out, state, info, found, nmissing, NULL);
    return get_batch(s, snap, ids, n, out, state, info, NULL, found, nmissing, false);
}

int embkv_locate_batch_at(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, int *tier,
                          uint8_t *found)
{
    if (!s || (n && !ids))
        return embkv__null_arg("embkv_locate_batch_at", "s", (const void *)s, "ids", (const void *)ids,
                               (char *)NULL);
    FORK_REFUSE(s, "embkv_locate_batch_at");
    int rc = snap_check_store(s, snap, "embkv_locate_batch_at");
    if (rc != EMBKV_OK)
        return rc;
    if (s->reader)
        return ro_read(s, snap_as_of(snap), ids, n, NULL, NULL, NULL, found, NULL, tier);
    return get_batch(s, snap, ids, n, NULL, NULL, NULL, tier, found, NULL, false);
}
