/*
 * recover.c - crash recovery: every row back to its version as of the
 * durable epoch (P5), and the counts of what the index holds.
 *
 * Recovery runs at open, single-threaded, before any reader or writer: it
 * reads buckets without their seqlocks and rewrites slots in place.  With
 * a usable dirty map it visits only the buckets marked since the durable
 * epoch (P4), so its cost follows what changed, not the table.  It follows
 * each marked row's `prev` links (P2) back to the durable version; a
 * record it cannot read leaves the row on it, so that one damaged record
 * fails the reads of its row, not the open of the store.
 */
#include <stdlib.h>

#include "top.h"

/* Where id's version at loc is, for recover_rows(): PM in place, or read from the
 * log into *ssd (the previous one freed).  EMBKV_CORRUPT with *unreadable
 * set: a record that is there but cannot be read as id's (a damaged pool
 * record, a log record whose segment is damaged or gone); without it, a
 * location that cannot be (index damage). */
static int recover_rec(embkv_store *s, int64_t id, uint64_t loc, char **ssd, rec_hdr **r, bool *unreadable)
{
    free(*ssd);
    *ssd = NULL;
    *unreadable = false;
    if (loc & LOC_SSD) {
        int rc = tier_rec(s, id, loc, ssd, r, false);
        *unreadable = rc == EMBKV_CORRUPT;
        return rc;
    }
    size_t total = (size_t)s->nchunks * s->recs_per_chunk;
    if (loc_chunk(loc) >= s->nchunks || loc_index(loc) >= s->recs_per_chunk ||
        (size_t)loc_chunk(loc) * s->recs_per_chunk + loc_index(loc) >= total)
        return embkv__err(EMBKV_CORRUPT, "store %s: id %lld points outside the record space", s->path,
                          (long long)id);
    *r = rec_at(s, loc);
    if ((*r)->id != id) {
        int64_t other = (*r)->id;
        *r = NULL;
        *unreadable = true;
        return embkv__err(EMBKV_CORRUPT, "store %s: id %lld: record belongs to id %lld", s->path, (long long)id,
                          (long long)other);
    }
    return EMBKV_OK;
}

/* Versions a row may have past the durable epoch: one per epoch (a write
 * over a version of its own epoch frees that one), so one more than the
 * syncs that failed in a row before a crash (the bound was 4: after three
 * failed syncs a row's checkpoint version was out of reach, and the row
 * was dropped).  A bound only against a damaged chain, which must also
 * never go forward in time. */
#define RECOVER_MAX_HOPS 65536

/* Roll every row back to its version as of the durable epoch.  With the
 * dirty map (marked), only the buckets marked since then can hold newer
 * versions: the others are not read past their seqlock (a
 * writer killed between locking a bucket and changing a slot leaves it
 * odd), so the cost follows what changed.
 *
 * A record on the way back that cannot be read (a damaged pool record, a
 * log record whose segment is damaged or gone, the version to return to
 * failing its check) leaves the row on it: reads of that row fail naming
 * it or its file, as after a clean close, instead of the whole store
 * failing to open.  Whether such a row existed at the checkpoint is not
 * known: *unknown counts them, for the row count check (load_store). */
int recover_rows(embkv_store *s, index_desc *ix, bool marked, uint64_t *unknown)
{
    uint32_t durable = (uint32_t)s->root->durable_epoch;
    char *ssd = NULL;  /* the log record being inspected */
    int rc = EMBKV_OK;
    *unknown = 0;
    for (uint64_t b = 0; b < ix->nbuckets && rc == EMBKV_OK; b++) {
        bucket *bk = &ix->buckets[b];
        if (bk->version & 1)
            bk->version = 0;
        if (marked && !dirtymap_marked(s, bk))
            continue;
        for (unsigned i = 0; i < BUCKET_SLOTS && rc == EMBKV_OK; i++) {
            if (!(bk->used & (1u << i)))
                continue;
            int64_t id = bk->slots[i].key;
            uint64_t loc = loc_plain(bk->slots[i].loc);
            rec_hdr *r = NULL;
            bool keep = false;
            uint64_t newer = UINT64_MAX;  /* the epoch of the version just passed */
            for (int hops = 0; loc != LOC_NONE; hops++) {
                /* A log record from before the mark is durable: it is the
                 * version to return to, read or not (tombstones are never
                 * demoted).  Not reading it keeps a damaged segment to its
                 * own rows, as after a clean close. */
                if ((loc & LOC_SSD) && (!s->log || !tier_after_tail(s, loc))) {
                    keep = true;
                    break;
                }
                bool unreadable;
                if ((rc = recover_rec(s, id, loc, &ssd, &r, &unreadable)) != EMBKV_OK) {
                    if (unreadable) {
                        ++*unknown;
                        if ((loc & LOC_SSD) && s->log)
                            log_note_missing(s->log, loc);
                        rc = EMBKV_OK;
                        keep = true;
                    }
                    break;
                }
                if (rec_epoch(r) > newer || hops >= RECOVER_MAX_HOPS) {
                    rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: its versions since the checkpoint do not "
                                    "lead back to it (a damaged record)", s->path, (long long)id);
                    break;
                }
                if (rec_epoch(r) <= durable)
                    break;
                newer = rec_epoch(r);
                loc = r->prev;
                r = NULL;
            }
            if (rc != EMBKV_OK)
                break;
            if (keep) {
                bk->slots[i].loc = loc;
                continue;
            }
            if (r && !(r->epoch & REC_TOMB) && !rec_ok(s, r, id)) {
                /* the version to return to is damaged: the row stays on it */
                ++*unknown;
                bk->slots[i].loc = loc;
                continue;
            }
            if (loc == LOC_NONE || !r || (r->epoch & REC_TOMB)) {
                /* Inserted after the durable point, or its deletion is durable. */
                bk->used &= (uint16_t)~(1u << i);
                continue;
            }
            bk->slots[i].loc = loc;
        }
    }
    /* A key moved along its path (pethash.c: ix_move_home, evict_victim)
     * by a process killed between placing the copy and removing the
     * original is there twice, both buckets marked and rolled back alike:
     * the second on its path goes (the overflow counts are rebuilt below). */
    for (uint64_t b = 0; b < ix->nbuckets && rc == EMBKV_OK; b++) {
        bucket *bk = &ix->buckets[b];
        if (marked && !dirtymap_marked(s, bk))
            continue;
        for (unsigned i = 0; i < BUCKET_SLOTS; i++)
            if ((bk->used & (1u << i)) &&
                !ix_first_on_path(ix, bk->slots[i].key, embkv__hash(bk->slots[i].key), b, i))
                bk->used &= (uint16_t)~(1u << i);
    }
    free(ssd);
    if (rc == EMBKV_OK)
        ix_rebuild_overflow(ix);
    return rc;
}

size_t recover_tombstones(embkv_store *s, index_desc *ix)
{
    /* Tombstones are never demoted: each names a pool record. */
    uint64_t durable = s->root->durable_epoch;
    size_t gone = 0;
    for (uint64_t b = 0; b < ix->nbuckets; b++) {
        bucket *bk = &ix->buckets[b];
        for (unsigned i = 0; i < BUCKET_SLOTS; i++) {
            uint64_t loc = bk->slots[i].loc;
            if (!(bk->used & (1u << i)) || !(loc & LOC_TOMB) || (loc & LOC_SSD))
                continue;
            uint64_t p = loc_plain(loc);
            if (loc_chunk(p) >= s->nchunks || loc_index(p) >= s->recs_per_chunk)
                continue;  /* (slab_rebuild names what such an entry is) */
            rec_hdr *r = rec_at(s, p);
            if (r->id == bk->slots[i].key && (r->epoch & REC_TOMB) && rec_epoch(r) <= durable) {
                mark_bucket(s, bk);
                bk->used &= (uint16_t)~(1u << i);
                persist_range(s, &bk->used, sizeof bk->used);
                gone++;
            }
        }
    }
    if (gone)
        ix_rebuild_overflow(ix);
    return gone;
}

void recover_count(embkv_store *s, index_desc *ix)
{
    uint64_t rows = 0, entries = 0;
    for (uint64_t b = 0; b < ix->nbuckets; b++) {
        bucket *bk = &ix->buckets[b];
        for (unsigned i = 0; i < BUCKET_SLOTS; i++) {
            if (!(bk->used & (1u << i)))
                continue;
            entries++;
            if (!(bk->slots[i].loc & LOC_TOMB))
                rows++;
            if (bk->slots[i].loc & LOC_SSD)
                tier_count_row(s, bk->slots[i].loc);
        }
    }
    atomic_store(&s->rows, rows);
    atomic_store(&s->entries, entries);
}
