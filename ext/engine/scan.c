/*
 * scan.c - walks over the index: embkv_scan (every row, with its record)
 * and embkv_scan_ids (ids only, a bucket cursor).
 *
 * A scan reads one bucket at a time under its seqlock, inside an epoch, and
 * hands the rows to its caller outside it, so a long scan holds neither
 * writers nor reclamation for more than a bucket.  A scan does not see one
 * moment: rows written while it runs may or may not be in it (a snapshot,
 * embkv_get_batch_at, is for that).  It holds the scan pin (pethash.c): an
 * index resize and the hot-set moves between buckets wait for it, so a
 * cursor position (a bucket number) stays meaningful and no row is met
 * twice or missed because it moved.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

int embkv_scan(embkv_store *s, embkv_scan_fn fn, void *ctx)
{
    if (!s || !fn)
        return embkv__null_arg("embkv_scan", "s", (const void *)s, "fn", (const void *)(uintptr_t)fn, (char *)NULL);
    FORK_REFUSE(s, "embkv_scan");
    if (s->reader)
        return ro_scan(s, fn, ctx);
    size_t row_floats = (size_t)s->dim + s->state_floats;
    float *buf = malloc(BUCKET_SLOTS * row_floats * sizeof(float));
    if (!buf)
        return embkv__err(EMBKV_NOMEM, "embkv_scan: out of memory");
    int rc = EMBKV_OK;
    embkv_scan_pin(s);
    ebr_enter();
    uint64_t gen = atomic_load(&s->ix)->generation;
    ebr_leave();
    for (uint64_t b = 0;; b++) {
        int64_t ids[BUCKET_SLOTS];
        uint64_t locs[BUCKET_SLOTS];
        embkv_rowinfo info[BUCKET_SLOTS];
        ebr_enter();
        index_desc *ix = atomic_load(&s->ix);
        if (ix->generation != gen) {
            ebr_leave();
            rc = embkv__err(EMBKV_BUSY, "store %s: the index was resized during the scan", s->path);
            break;
        }
        if (b >= ix->nbuckets) {
            ebr_leave();
            break;
        }
        unsigned n = ix_bucket_rows(&ix->buckets[b], ids, locs, false);
        rec_hdr *recs[BUCKET_SLOTS];
        char *ssd = NULL;  /* the bucket's log records */
        /* Cached rows: their current version is the cache's. */
        for (unsigned i = 0; i < n && s->cache; i++) {
            rec_hdr hd;
            float *v = buf + i * row_floats;
            if (cache_read(s->cache, ids[i], embkv__hash(ids[i]), &hd, v, s->dim, v + s->dim, s->state_floats)) {
                locs[i] = LOC_CACHED;
                info[i].clock = hd.clock;
                info[i].epoch = rec_epoch(&hd);
                info[i].tier = EMBKV_TIER_DRAM;
            }
        }
        rc = tier_read(s, ids, locs, n, &ssd, recs, false);
        /* Copy out so the callback runs outside the epoch and may write. */
        for (unsigned i = 0; i < n && rc == EMBKV_OK; i++) {
            if (locs[i] == LOC_CACHED)
                continue;
            bool logged = locs[i] & LOC_SSD;  /* (checked as it was read) */
            rec_hdr *r = logged ? recs[i] : rec_at(s, locs[i]);
            if (!logged && !rec_ok(s, r, ids[i]))
                rc = rec_damaged(s, ids[i]);
            rec_vec_get(s, r, buf + i * row_floats);
            memcpy(buf + i * row_floats + s->dim, rec_state(s, r), 4 * (size_t)s->state_floats);
            fill_info(&info[i], r, locs[i]);
        }
        ebr_leave();
        free(ssd);
        for (unsigned i = 0; i < n && rc == EMBKV_OK; i++)
            rc = fn(ctx, ids[i], buf + i * row_floats, buf + i * row_floats + s->dim, &info[i]);
        if (rc != EMBKV_OK)
            break;
    }
    embkv_scan_unpin(s);
    free(buf);
    return rc;
}

int embkv_scan_ids(embkv_store *s, uint64_t *pos, int64_t *ids, size_t cap, size_t *n)
{
    if (!s || !pos || !ids || !n)
        return embkv__null_arg("embkv_scan_ids", "s", (const void *)s, "pos", (const void *)pos, "ids",
                               (const void *)ids, "n", (const void *)n, (char *)NULL);
    if (cap < 64)
        return embkv__err(EMBKV_INVALID, "embkv_scan_ids: store %s: cap %zu is below 64: give room for 64 ids at "
                          "least", s->path, cap);
    FORK_REFUSE(s, "embkv_scan_ids");
    *n = 0;
    if (s->reader)
        return ro_scan_ids(s, pos, ids, cap, n);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    /* pos: low 40 bits the next bucket, high 24 bits the index generation. */
    uint64_t b = *pos & ((1ull << 40) - 1), gen = *pos >> 40;
    if (*pos == 0)
        gen = ix->generation & 0xffffff;
    if (b > ix->nbuckets) {
        ebr_leave();
        return embkv__err(EMBKV_INVALID, "embkv_scan_ids: store %s: position %llu is not one embkv_scan_ids gave: "
                          "start a scan at 0, and pass back the position each call returns", s->path,
                          (unsigned long long)*pos);
    }
    if (gen != (ix->generation & 0xffffff)) {
        ebr_leave();
        return embkv__err(EMBKV_BUSY, "store %s: the index was resized during the scan", s->path);
    }
    uint64_t locs[BUCKET_SLOTS];
    while (b < ix->nbuckets && *n + BUCKET_SLOTS <= cap)
        *n += ix_bucket_rows(&ix->buckets[b++], ids + *n, locs, false);
    ebr_leave();
    *pos = (gen << 40) | b;
    return EMBKV_OK;
}
