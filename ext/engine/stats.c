/*
 * stats.c - what a store reports of itself: embkv_stats_get (rows per tier,
 * hit rates, bytes, checkpoint times, from every layer's counters),
 * embkv_check (a full consistency check of the index against the record
 * space and the log) and the index's probe statistics.
 *
 * At the top because it reads every layer; nothing below calls it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "top.h"

/* Log-resident rows embkv_check reads at a time. */
#define CHECK_LOG_BATCH 256

/* Reads the n log records of ids at locs, as a read does (inside an epoch,
 * so no record it may reach is reused meanwhile; tier_read checks each
 * one's id and checksum): what embkv_get of the first bad row would
 * report (EMBKV_CORRUPT naming the id and the segment, a missing or
 * truncated one included), or EMBKV_OK. */
static int check_log_rows(embkv_store *s, const int64_t *ids, const uint64_t *locs, size_t n)
{
    if (n == 0)
        return EMBKV_OK;
    rec_hdr *recs[CHECK_LOG_BATCH];
    char *buf = NULL;
    ebr_enter();
    int rc = tier_read(s, ids, locs, n, &buf, recs, false);
    ebr_leave();
    free(buf);
    return rc;
}

int embkv_check(embkv_store *s)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_check: store is NULL");
    /* (It reads the pool the parent may be changing, through a copy of
     * its locks: as any read there.) */
    FORK_REFUSE(s, "embkv_check");
    /* (It takes the writer lock exclusively: a batch around holds it shared.) */
    CALLBACK_REFUSE(s, "embkv_check");
    if (s->reader)
        return embkv__err(EMBKV_READONLY, "embkv_check: store %s is open read-only in this process: its counts "
                          "are the writer's; check it in the process that writes it (or with none open)", s->path);
    /* Held exclusively for the whole pass: no index entry changes, so the
     * log records the index names stay live (no compaction or demotion
     * switches a row meanwhile; their segments stay). */
    pthread_rwlock_wrlock(&s->writers);
    index_desc *ix = atomic_load(&s->ix);
    int rc = EMBKV_OK;
    uint64_t rows = 0, entries = 0;
    /* Log-resident rows, read in batches as the pass finds them. */
    int64_t log_ids[CHECK_LOG_BATCH];
    uint64_t log_locs[CHECK_LOG_BATCH];
    size_t nlog = 0;
    uint32_t *want = calloc(ix->nbuckets, sizeof *want);
    /* (Chunks are added under slab_mu by writers allocating before they
     * wait for this lock; the ones the index can name are there now.) */
    pthread_mutex_lock(&s->slab_mu);
    uint32_t nchunks = s->nchunks;
    pthread_mutex_unlock(&s->slab_mu);
    size_t total = (size_t)nchunks * s->recs_per_chunk;
    uint8_t *seen = calloc(total ? total : 1, 1);
    if (!want || !seen) {
        rc = embkv__err(EMBKV_NOMEM, "embkv_check: out of memory");
        goto out;
    }
    for (uint64_t b = 0; b < ix->nbuckets && rc == EMBKV_OK; b++) {
        bucket *bk = &ix->buckets[b];
        if (bk->version & 1) {
            rc = embkv__err(EMBKV_CORRUPT, "store %s: bucket %llu left locked", s->path,
                            (unsigned long long)b);
            break;
        }
        for (unsigned i = 0; i < BUCKET_SLOTS && rc == EMBKV_OK; i++) {
            if (!(bk->used & (1u << i)))
                continue;
            int64_t id = bk->slots[i].key;
            uint64_t loc = bk->slots[i].loc, h = embkv__hash(id);
            entries++;
            if (bk->fp[i] != hash_fp(h)) {
                rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: wrong fingerprint", s->path, (long long)id);
                break;
            }
            found_slot f;
            if (!ix_find(ix, id, h, &f) || f.bucket != b || f.slot != i) {
                rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: unreachable or duplicated in the index",
                                s->path, (long long)id);
                break;
            }
            uint64_t step = hash_step(h);
            for (uint64_t x = h & ix->mask; x != b; x = (x + step) & ix->mask)
                want[x]++;
            if (loc & LOC_SSD) {
                /* Its record is the log's: read and checked as embkv_get
                 * reads it (a tombstone has none). */
                if (!s->log || !log_loc_plausible(s->log, loc)) {
                    rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: location outside the SSD log", s->path,
                                    (long long)id);
                    break;
                }
                if (!(loc & LOC_TOMB)) {
                    log_ids[nlog] = id;
                    log_locs[nlog++] = loc;
                }
                rows++;
                if (nlog == CHECK_LOG_BATCH) {
                    rc = check_log_rows(s, log_ids, log_locs, nlog);
                    nlog = 0;
                }
                continue;
            }
            uint32_t c = loc_chunk(loc), r = loc_index(loc);
            if (c >= nchunks || r >= s->recs_per_chunk) {
                rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: location outside the record space",
                                s->path, (long long)id);
                break;
            }
            if (seen[(size_t)c * s->recs_per_chunk + r]++) {
                rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: record shared with another row",
                                s->path, (long long)id);
                break;
            }
            rec_hdr *rec = rec_at(s, loc);
            if (rec->id != id || rec->check != rec_checksum(s, rec)) {
                rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: record %s", s->path, (long long)id,
                                rec->id != id ? "belongs to another id" : "fails its checksum");
                break;
            }
            if (!(loc & LOC_TOMB))
                rows++;
        }
    }
    if (rc == EMBKV_OK)
        rc = check_log_rows(s, log_ids, log_locs, nlog);
    for (uint64_t b = 0; b < ix->nbuckets && rc == EMBKV_OK; b++)
        if (ix->buckets[b].overflow != want[b])
            rc = embkv__err(EMBKV_CORRUPT, "store %s: bucket %llu: overflow counter %u, expected %u",
                            s->path, (unsigned long long)b, ix->buckets[b].overflow, want[b]);
    if (rc == EMBKV_OK && (rows != atomic_load(&s->rows) || entries != atomic_load(&s->entries)))
        rc = embkv__err(EMBKV_CORRUPT, "store %s: %llu rows and %llu entries in the index, %llu and %llu counted",
                        s->path, (unsigned long long)rows, (unsigned long long)entries,
                        (unsigned long long)atomic_load(&s->rows),
                        (unsigned long long)atomic_load(&s->entries));
out:
    free(want);
    free(seen);
    pthread_rwlock_unlock(&s->writers);  /* (read only: P11) */
    return rc;
}

int embkv_stats_get(embkv_store *s, embkv_stats *st)
{
    if (!s || !st)
        return embkv__null_arg("embkv_stats_get", "s", (const void *)s, "st", (const void *)st, (char *)NULL);
    memset(st, 0, sizeof *st);
    index_desc *ix;
    ebr_enter();
    ix = atomic_load(&s->ix);
    st->buckets = ix->nbuckets;
    ebr_leave();
    if (s->reader)
        ro_count_update(s);  /* (the rows of the writer's last checkpoint) */
    st->rows = atomic_load(&s->rows);
    st->slots_per_bucket = BUCKET_SLOTS;
    st->bucket_bytes = BUCKET_BYTES;
    st->load_factor = (double)atomic_load(&s->entries) / ((double)st->buckets * BUCKET_SLOTS);
    st->record_bytes = s->rec_size;
    st->pool_bytes = s->pool_size;
    pthread_mutex_lock(&s->slab_mu);
    st->pool_used_bytes = (uint64_t)s->nchunks * s->chunk_bytes + st->buckets * BUCKET_BYTES;
    pthread_mutex_unlock(&s->slab_mu);
    st->resizes = atomic_load(&s->st_resizes);
    st->durable_epoch = __atomic_load_n(&s->root->durable_epoch, __ATOMIC_RELAXED);
    st->syncs = atomic_load(&s->st_syncs);
    __atomic_load(&s->last_sync_ms, &st->last_sync_ms, __ATOMIC_RELAXED);
    st->gets = atomic_load(&s->st_gets);
    st->puts = atomic_load(&s->st_puts);
    st->deletes = atomic_load(&s->st_deletes);
    st->batch_gets = atomic_load(&s->st_batch_gets);
    st->hot_moves = atomic_load(&s->st_hot_moves);
    st->hotset_to_pm = atomic_load(&s->st_hot_to_pm);
    st->hotset_to_dram = atomic_load(&s->st_hot_to_dram);
    st->migrate_rate = s->mg_started ? s->mg_rate : 0;
    gpu_stats(s, st);
    st->migrate_rounds = atomic_load(&s->st_mg_rounds);
    st->migrate_moved = atomic_load(&s->st_mg_moved);
    st->migrate_errors = atomic_load(&s->st_mg_errors);
    cache_stats(s->cache, st);
    st->heat_counting = atomic_load(&s->heat_live) != 0;
    st->heat_touches = heat_touches(s->heat);
    st->heat_agings = heat_agings(s->heat);
    st->heat_bytes = heat_bytes(s->heat);
    st->is_pmem = s->is_pmem;
    st->pool_advice_random = s->pool_advice_random;
    st->recovered = s->recovered;
    st->rows_ssd = atomic_load(&s->rows_ssd);
    st->rows_pm = st->rows > st->rows_ssd ? st->rows - st->rows_ssd : 0;
    st->demotions = atomic_load(&s->st_demotions);
    st->promotions = atomic_load(&s->st_promotions);
    st->compactions = atomic_load(&s->st_compactions);
    st->compacted_rows = atomic_load(&s->st_compact_rows);
    st->ssd_wait_ms = (double)atomic_load(&s->st_ssd_wait_ns) / 1e6;
    la_stats(s, st);
    if (s->log) {
        log_stats ls;
        log_stats_get(s->log, &ls);
        st->ssd_size = s->root->ssd_size;
        st->ssd_file_bytes = ls.file_bytes;
        st->ssd_live_bytes = ls.live_bytes;
        st->ssd_segments = ls.segments;
        st->ssd_damaged_segments = ls.damaged_segments;
        st->ssd_reads = ls.reads;
        st->ssd_read_bytes = ls.read_bytes;
        st->ssd_writes = ls.writes;
        st->ssd_write_bytes = ls.write_bytes;
        st->ssd_syncs = ls.syncs;
        st->ssd_mean_read_depth = ls.mean_read_depth;
        if (st->demotions)
            st->write_amplification = (double)ls.write_bytes / ((double)st->demotions * s->rec_size);
        st->ssd_uring = ls.uring;
        st->ssd_direct = ls.direct;
        snprintf(st->ssd_fallback, sizeof st->ssd_fallback, "%s", ls.fallback);
    }
    return EMBKV_OK;
}

int embkv_probe_stats(embkv_store *s, double *mean, uint32_t *max)
{
    if (!s || !mean || !max)
        return embkv__null_arg("embkv_probe_stats", "s", (const void *)s, "mean", (const void *)mean, "max",
                               (const void *)max, (char *)NULL);
    pthread_rwlock_rdlock(&s->writers);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    uint64_t n = 0, sum = 0;
    uint32_t mx = 0;
    for (uint64_t b = 0; b < ix->nbuckets; b++) {
        bucket *bk = &ix->buckets[b];
        uint16_t used = __atomic_load_n(&bk->used, __ATOMIC_ACQUIRE);
        for (unsigned i = 0; i < BUCKET_SLOTS; i++) {
            if (!(used & (1u << i)))
                continue;
            uint64_t h = embkv__hash(__atomic_load_n(&bk->slots[i].key, __ATOMIC_RELAXED));
            uint32_t p = (uint32_t)ix_path_pos(ix, h, b) + 1;
            sum += p;
            n++;
            if (p > mx)
                mx = p;
        }
    }
    ebr_leave();
    pthread_rwlock_unlock(&s->writers);  /* (read only: P11) */
    *mean = n ? (double)sum / (double)n : 0.0;
    *max = mx;
    return EMBKV_OK;
}
