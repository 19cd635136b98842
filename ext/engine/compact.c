/*
 * compact.c - compaction of the SSD log: the live rows of a segment that is
 * mostly garbage are appended anew, so that the segment empties and is
 * deleted (by the sync after, tier_sync_done).
 *
 * A row is live in a segment when the index names that location.  Copies
 * are byte for byte (header with id, clock, epoch, prev and checksum), so a
 * crash treats a moved row as it would the original (tier.c explains why
 * that holds for demotion; the same argument holds here): the copies are
 * synced before any index entry names them, an entry is switched under its
 * key's lock only if it still names the old location, and the old record is
 * released after the readers that may have found it are gone.  The segment
 * file itself stays until a sync has made the switched entries durable.
 *
 * The work is cut into parts of COMPACT_PART bytes of segment read, so that
 * the background thread (tier_worker.c) can pace it; one compaction at a
 * time (compact_mu), resumed from where the last part ended.  Appends share
 * demote_mu with demotion (the log takes one appender at a time).
 *
 * Demotion pays for its appends once the log is urgent (compact_pay): a
 * thread left with little of the CPU (two cores, busy writers) once let
 * demotions fill ssd_size with segments a third live, and writes failed
 * with most of the log garbage.  A demoter that compacts before it appends
 * cannot outrun compaction.  The room comes back at the next sync, which
 * deletes the emptied segments; between syncs nothing can be reclaimed,
 * since the last checkpoint still names the old copies.
 */
#include <stdlib.h>
#include <string.h>

#include "tiers.h"

/* Segments whose live fraction is below this are compacted ... */
#define COMPACT_MAX_LIVE 0.5
/* ... once garbage is at least this fraction of the log's records, or the
 * log's files are past this fraction of ssd_size (then any segment less
 * than COMPACT_FULL_LIVE live is worth it). */
#define COMPACT_GARBAGE 0.25
#define COMPACT_FULL 0.75
#define COMPACT_FULL_LIVE 0.75
/* ... and once new segments are refused to demotions (the files within a
 * segment of ssd_size), any segment with a little garbage: uniform updates
 * leave every segment more than 3/4 live, and writes then failed for good
 * with a sixth of the log garbage.  Costly (a victim 95% live rewrites 19
 * bytes for each it frees), but the log goes on. */
#define COMPACT_STUCK_LIVE 0.97
/* Segment bytes a demotion compacts per byte it will append, when urgent:
 * a victim is at most COMPACT_FULL_LIVE live, so each byte of room costs
 * at most 4 bytes read. */
#define COMPACT_PAY 4
#define PAY_PART (1ull << 20)

typedef struct part_ctx {
    embkv_store *s;
    index_desc *ix;
    size_t n, cap;
    int64_t *ids;
    uint64_t *locs;
    char *recs;
    int rc;
} part_ctx;

static int keep_live(void *arg, uint64_t loc, const void *rec)
{
    part_ctx *c = arg;
    const rec_hdr *r = rec;
    uint32_t probes;
    /* A slot never written reads as zeros: id 0 names no such location. */
    if (ix_lookup(c->ix, r->id, embkv__hash(r->id), &probes) != loc)
        return EMBKV_OK;
    if (!rec_ok(c->s, r, r->id))
        return EMBKV_OK;  /* damaged: left where it is (its reads fail, naming it) */
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        int64_t *ids = realloc(c->ids, cap * sizeof *ids);
        if (ids)
            c->ids = ids;
        uint64_t *locs = realloc(c->locs, cap * sizeof *locs);
        if (locs)
            c->locs = locs;
        char *recs = realloc(c->recs, cap * (size_t)c->s->rec_size);
        if (recs)
            c->recs = recs;
        if (!ids || !locs || !recs)
            return c->rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory compacting the SSD log", c->s->path);
        c->cap = cap;
    }
    c->ids[c->n] = r->id;
    c->locs[c->n] = loc;
    memcpy(c->recs + c->n * c->s->rec_size, rec, c->s->rec_size);
    c->n++;
    return EMBKV_OK;
}

bool compact_urgent(embkv_store *s)
{
    if (!s->log)
        return false;
    log_stats st;
    log_stats_get(s->log, &st);
    return (double)st.file_bytes >= COMPACT_FULL * (double)s->root->ssd_size;
}

/* Whether the log is worth compacting now, and which segment. */
static uint32_t pick(embkv_store *s)
{
    log_stats st;
    log_stats_get(s->log, &st);
    uint64_t per = s->rec_size, written = st.written_bytes / (per ? per : 1);
    if (written == 0)
        return 0;
    bool full = (double)st.file_bytes >= COMPACT_FULL * (double)s->root->ssd_size;
    bool stuck = st.file_bytes + 2ull * log_segment_bytes(s->log) > s->root->ssd_size;
    double garbage = 1.0 - (double)st.live_records / (double)written;
    if (!full && !stuck && garbage < COMPACT_GARBAGE)
        return 0;
    /* A segment compacted since the last sync may still hold versions that
     * sync keeps (no index entry names them): not again until it ran. */
    uint64_t syncs = atomic_load(&s->st_syncs);
    if (s->compact_done_syncs != syncs) {
        s->compact_done_syncs = syncs;
        s->ncompact_done = 0;
    }
    if (s->ncompact_done == COMPACT_DONE_MAX)
        return 0;
    return log_pick_victim(s->log, stuck ? COMPACT_STUCK_LIVE : full ? COMPACT_FULL_LIVE : COMPACT_MAX_LIVE,
                           s->compact_done, s->ncompact_done);
}

static int step_locked(embkv_store *s, uint64_t max_bytes, uint64_t *scanned)
{
    *scanned = 0;
    if (!s->log)
        return EMBKV_OK;
    if (s->compact_seg == 0) {
        if ((s->compact_seg = pick(s)) == 0)
            return EMBKV_OK;
        s->compact_pos = 0;
    }
    part_ctx c = {.s = s};
    uint64_t from = s->compact_pos;
    bool done = false;
    ebr_enter();
    c.ix = atomic_load(&s->ix);
    int rc = log_scan_part(s->log, s->compact_seg, &s->compact_pos, max_bytes, keep_live, &c, &done);
    ebr_leave();
    *scanned = s->compact_pos > from ? s->compact_pos - from : max_bytes;
    if (rc != EMBKV_OK) {
        /* A damaged or vanished segment: leave it (its rows' reads say
         * what is wrong) and look for another next time. */
        s->compact_seg = 0;
        free(c.ids);
        free(c.locs);
        free(c.recs);
        return c.rc != EMBKV_OK ? c.rc : EMBKV_OK;
    }
    uint64_t *nl = c.n ? malloc(c.n * sizeof *nl) : NULL;
    if (c.n && !nl)
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory compacting the SSD log", s->path);
    size_t m = 0;
    if (c.n && rc == EMBKV_OK) {
        pthread_mutex_lock(&s->demote_mu);
        rc = log_append(s->log, c.recs, c.n, nl, true);
        /* The copies durable before the index names them (P1). */
        if (rc == EMBKV_OK && (rc = log_sync(s->log)) != EMBKV_OK)
            for (size_t i = 0; i < c.n; i++)
                log_release(s->log, nl[i]);
        if (rc == EMBKV_OK) {
            pthread_rwlock_rdlock(&s->writers);
            for (size_t i = 0; i < c.n; i++) {
                if (ix_switch(s, c.ids[i], c.locs[i], nl[i], NULL))
                    c.locs[m++] = c.locs[i];
                else
                    log_release(s->log, nl[i]);  /* written meanwhile */
            }
            writers_unlock(s);
        }
        pthread_mutex_unlock(&s->demote_mu);
        if (rc == EMBKV_OK) {
            ebr_synchronize();
            for (size_t i = 0; i < m; i++)
                log_release(s->log, c.locs[i]);
            atomic_fetch_add(&s->st_compact_rows, m);
        }
    }
    if (rc != EMBKV_OK)
        s->compact_pos = from;  /* tried again next time */
    else if (done) {
        if (s->ncompact_done < COMPACT_DONE_MAX)
            s->compact_done[s->ncompact_done++] = s->compact_seg;
        s->compact_seg = 0;
        atomic_fetch_add(&s->st_compactions, 1);
    }
    free(nl);
    free(c.ids);
    free(c.locs);
    free(c.recs);
    return rc;
}

int compact_step(embkv_store *s, uint64_t max_bytes, uint64_t *scanned)
{
    pthread_mutex_lock(&s->compact_mu);
    int rc = step_locked(s, max_bytes, scanned);
    pthread_mutex_unlock(&s->compact_mu);
    return rc;
}

void compact_pay(embkv_store *s, size_t nrecs)
{
    if (!s->log || !compact_urgent(s))
        return;
    /* what the records take in the log: whole blocks (log.c) */
    uint64_t per = s->rec_size <= LOG_BLOCK ? LOG_BLOCK / s->rec_size : 0;
    uint64_t blocks = per ? (nrecs + per - 1) / per : nrecs * ((s->rec_size + LOG_BLOCK - 1) / LOG_BLOCK);
    uint64_t budget = COMPACT_PAY * blocks * LOG_BLOCK, done = 0;
    pthread_mutex_lock(&s->compact_mu);
    while (done < budget) {
        uint64_t scanned = 0;
        /* (An error leaves the demotion to report its own, if it fails.) */
        if (step_locked(s, PAY_PART, &scanned) != EMBKV_OK || scanned == 0)
            break;
        done += scanned;
    }
    pthread_mutex_unlock(&s->compact_mu);
}
