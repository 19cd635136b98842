/*
 * slab.c - fixed-size record space inside the pool.
 *
 * The pool hands out chunks (one pmemobj allocation each, of about a
 * thousandth of the pool: store.c, chunk_bytes_for; published
 * atomically into the root's chunk table); embkv carves them into records of
 * the table's record size.  Which records are free is DRAM state only: it is
 * rebuilt at open from the index (a record is in use exactly when the index
 * points at it), so a crash can neither leak nor double-allocate a record.
 *
 * A record's whole life is here: a replaced version is retired
 * (slab_retire) and waits in a limbo list until no reader can still see
 * it (P6: epochs, and for a version an open snapshot may read, no snapshot
 * older than its retirement), then
 * slab_reclaim frees it.  Durable versions replaced since the last sync wait
 * first in the pending lists, until that sync (P2: sync.c), then in the
 * limbo list their pinning says (pending: pinned; pendingu: not).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"

/* Why a pool is full of what it is, and what helps, so that the advice
 * works when followed (short_by: records missing, 0 when unknown): records
 * a checkpoint frees (versions replaced and tombstones since the last one,
 * and versions only waiting for readers' epochs), and those kept for open
 * snapshots, which only their end frees.  Into buf; retire_mu is taken
 * under slab_mu, never the reverse. */
static const char *full_why(embkv_store *s, size_t short_by, bool can_split, char *buf, size_t len)
{
    pthread_mutex_lock(&s->retire_mu);
    size_t ck = s->pending[0].n + s->pending[1].n + s->pendingu[0].n + s->pendingu[1].n + s->ntombs[0] +
                s->ntombs[1] + s->nlimbo,
           sn = s->nplimbo;
    pthread_mutex_unlock(&s->retire_mu);
    if (atomic_load(&s->snap_floor) == UINT64_MAX) {
        ck += sn;  /* no snapshot left: the next reclamation frees them */
        sn = 0;
    }
    const char *advice =
        ck && ck >= short_by ? (short_by ? "checkpoint (embkv_sync; in SQL embkv_checkpoint), then retry"
                                         : "checkpoint (embkv_sync; in SQL embkv_checkpoint) and retry; if it fails "
                                           "again, copy the")
        : sn && ck + sn >= short_by ? "end the open statements, exports or backups (or let them finish), checkpoint, "
                                      "and retry"
        : ck || sn ? (can_split ? "a checkpoint frees too few: delete rows, write fewer at a time, or copy the"
                                : "a checkpoint frees too few: delete rows, or copy the")
        : can_split ? "a checkpoint frees nothing: delete rows, write fewer at a time, or copy the"
                    : "a checkpoint frees nothing: delete rows, or copy the";
    const char *copy = strstr(advice, "copy the") ? " rows into a store with a larger pool_size (a pool does not "
                                                     "grow)" : "";
    int k = snprintf(buf, len, "%zu records hold versions replaced or deleted since the last checkpoint, which the "
                     "next one frees", ck);
    if (sn && k > 0 && (size_t)k < len)
        k += snprintf(buf + k, len - (size_t)k, "; %zu more hold versions that open snapshots (a long SELECT, an "
                      "export, an online backup) may read, until they end", sn);
    if (k > 0 && (size_t)k < len)
        snprintf(buf + k, len - (size_t)k, ": %s%s", advice, copy);
    return buf;
}

static int locvec_reserve(locvec *v, size_t extra)
{
    if (v->n + extra <= v->cap)
        return EMBKV_OK;
    size_t cap = v->cap ? v->cap : 1024;
    while (cap < v->n + extra)
        cap *= 2;
    uint64_t *p = realloc(v->v, cap * sizeof *p);
    if (!p)
        return EMBKV_NOMEM;
    v->v = p;
    v->cap = cap;
    return EMBKV_OK;
}

static char *chunk_records(PMEMobjpool *pop, PMEMoid oid)
{
    /* Records are a multiple of 64 bytes and start 32 bytes before a cache
     * line: the 32-byte header shares a line with the previous record's
     * tail and the vector starts on a line, so a gather of a 64-float row
     * touches exactly four lines. */
    uintptr_t p = (uintptr_t)pmemobj_direct(oid);
    (void)pop;
    return (char *)(((p + 63) & ~(uintptr_t)63) + 64 - sizeof(rec_hdr));
}

static void push_chunk_free(embkv_store *s, uint32_t c)
{
    /* Highest index first so that allocation hands records out ascending. */
    for (uint32_t i = s->recs_per_chunk; i-- > 0;)
        s->free_locs.v[s->free_locs.n++] = loc_make(c, i);
}

/* Chunk c's checked map, all unchecked (left NULL without memory: its
 * records are then checked at every pass). */
static void map_checked(embkv_store *s, uint32_t c)
{
    if (!atomic_load_explicit(&s->checked[c], memory_order_relaxed))
        atomic_store_explicit(&s->checked[c], calloc((s->recs_per_chunk + 63) / 64, sizeof(uint64_t)),
                              memory_order_release);
}

void slab_free_checked(embkv_store *s)
{
    for (uint32_t c = 0; c < MAX_CHUNKS; c++) {
        free((void *)atomic_load_explicit(&s->checked[c], memory_order_relaxed));
        atomic_store_explicit(&s->checked[c], NULL, memory_order_relaxed);
    }
}

/* The places just taken will hold new records: their checks are forgotten
 * (before the record is filled, so before any index entry names it: a
 * scan that finds the entry finds the bit cleared). */
static void forget_checked(embkv_store *s, const uint64_t *locs, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        _Atomic uint64_t *m = atomic_load_explicit(&s->checked[loc_chunk(locs[k])], memory_order_relaxed);
        uint32_t i = loc_index(locs[k]);
        if (m)
            atomic_fetch_and_explicit(&m[i >> 6], ~(1ull << (i & 63)), memory_order_relaxed);
    }
}

/* With slab_mu held: add one chunk to the pool. */
static int add_chunk(embkv_store *s)
{
    if (s->nchunks >= MAX_CHUNKS) {
        s->pool_exhausted = true;
        return embkv__err(EMBKV_FULL, "store %s: record space full (%u chunks of %u bytes)",
                          s->path, (unsigned)MAX_CHUNKS, s->chunk_bytes);
    }
    if (s->chunk_limit && s->nchunks >= s->chunk_limit) {
        /* With an SSD tier the rows that do not fit go to the log, but the
         * index of every row stays in the pool: it keeps room to grow. */
        s->pool_exhausted = true;
        return embkv__err(EMBKV_FULL, "store %s: pool full: its record space is at its limit (%u chunks of %u "
                          "bytes), the rest of the pool is kept for the index; the versions of rows replaced "
                          "since the last checkpoint stay in it until the next one, whatever moves to the SSD "
                          "tier: checkpoint more often, or give the pool more room (pool_size)",
                          s->path, s->chunk_limit, s->chunk_bytes);
    }
    uint32_t c = s->nchunks;
    if (pmemobj_alloc(s->pop, &s->chunks[c], s->chunk_bytes, TYPE_CHUNK, NULL, NULL) != 0) {
        int e = errno;
        s->pool_exhausted = true;
        char why[512];
        return embkv__err(EMBKV_FULL, "store %s: pool full (%zu bytes, %llu rows): %s; %s", s->path, s->pool_size,
                          (unsigned long long)atomic_load(&s->rows),
                          e == ENOMEM ? "no space left in the pool" : pmemobj_errormsg(), full_why(s, 0, false, why, sizeof why));
    }
    /* Every record of every chunk may be free at once: reserve for all, so
     * slab_free never needs to grow the list. */
    size_t total = (size_t)(c + 1) * s->recs_per_chunk;
    if (locvec_reserve(&s->free_locs, total - s->free_locs.n) != EMBKV_OK)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for the free list", s->path);
    atomic_store_explicit(&s->chunk_base[c], chunk_records(s->pop, s->chunks[c]),
                          memory_order_release);
    map_checked(s, c);
    s->nchunks = c + 1;
    push_chunk_free(s, c);
    return EMBKV_OK;
}

/* With slab_mu held (dropped and retaken around a slab_reclaim): make at least
 * `want` records free, reclaiming what epochs allow first, then adding
 * chunks while the pool has room. */
static int ensure_free(embkv_store *s, size_t want)
{
    int rc = EMBKV_OK;
    bool reclaimed = false, waited = false;
    while (s->free_locs.n < want) {
        if (!reclaimed) {
            /* Records retired to the epoch limbo may be free by now. */
            pthread_mutex_unlock(&s->slab_mu);
            slab_reclaim(s, false);
            reclaimed = true;
            pthread_mutex_lock(&s->slab_mu);
            continue;
        }
        if ((rc = add_chunk(s)) == EMBKV_OK)
            continue;
        /* The pool is full, and a reader process may be what holds the
         * versions in limbo: wait for it (at most READER_WAIT_MS, then
         * it is revoked: readers.c R2) rather than refuse the write. */
        if (rc != EMBKV_FULL || waited || !readers_active(s))
            break;
        waited = true;
        pthread_mutex_unlock(&s->slab_mu);
        /* (the other processes' readers only: this thread may be in an
         * epoch, and this process's readers are never held long) */
        ebr_synchronize_foreign();
        slab_reclaim(s, false);
        pthread_mutex_lock(&s->slab_mu);
        rc = EMBKV_OK;
    }
    return rc;
}

/* Take n free records, leaving `keep` free (and what groups hold, when
 * `held`). */
static int alloc_keeping(embkv_store *s, uint64_t *locs, size_t n, size_t keep, bool held)
{
    pthread_mutex_lock(&s->slab_mu);
    if (held)
        keep += atomic_load(&s->room_held);
    int rc = ensure_free(s, n + keep);
    if (rc == EMBKV_OK) {
        s->free_locs.n -= n;
        memcpy(locs, s->free_locs.v + s->free_locs.n, n * sizeof *locs);
        /* The copy came off the top of the stack in reverse: keep ascending. */
        for (size_t i = 0; i < n / 2; i++) {
            uint64_t t = locs[i];
            locs[i] = locs[n - 1 - i];
            locs[n - 1 - i] = t;
        }
        forget_checked(s, locs, n);
    }
    pthread_mutex_unlock(&s->slab_mu);
    return rc;
}

int slab_alloc(embkv_store *s, uint64_t *locs, size_t n)
{
    return alloc_keeping(s, locs, n, s->delete_reserve, false);
}

int slab_alloc_move(embkv_store *s, uint64_t *locs, size_t n)
{
    return alloc_keeping(s, locs, n, s->delete_reserve, true);
}

int slab_alloc_tombstone(embkv_store *s, uint64_t *loc)
{
    return alloc_keeping(s, loc, 1, 0, false);
}

int slab_room_for(embkv_store *s, uint64_t puts, uint64_t deletes, bool hold)
{
    /* Puts leave the delete reserve free; deletes may take it.  (Counts
     * past any pool's records are refused before they add up.) */
    const uint64_t most = (uint64_t)1 << 48;
    uint64_t want = puts > most || deletes > most ? UINT64_MAX : deletes + (puts ? puts + s->delete_reserve : 0);
    pthread_mutex_lock(&s->slab_mu);
    int rc = want > SIZE_MAX ? EMBKV_FULL : ensure_free(s, (size_t)want);
    /* (Held under slab_mu: a move's allocation reads it there, so none
     * takes the room between this check and the hold.) */
    if (rc == EMBKV_OK && hold)
        atomic_fetch_add(&s->room_held, (size_t)(puts + deletes));
    size_t have = s->free_locs.n;
    pthread_mutex_unlock(&s->slab_mu);
    if (rc == EMBKV_FULL && !puts && have == 0) {
        char why[512];
        return embkv__err(rc, "store %s: no room for %llu deletes: the pool is full and has no free record (a delete "
                          "takes one until the next sync); %s",
                          s->path, (unsigned long long)deletes, full_why(s, (size_t)deletes, false, why, sizeof why));
    }
    if (rc == EMBKV_FULL && !puts)
        /* A delete of a synced row takes a record (its tombstone) until the
         * next sync frees both: say how to get through in rounds. */
        return embkv__err(rc, "store %s: no room for %llu deletes: the pool is full and has %zu free records (a "
                          "delete takes one until the next sync); delete at most %zu rows at a time, syncing in "
                          "between (in SQL: one COMMIT each)",
                          s->path, (unsigned long long)deletes, have, have);
    if (rc == EMBKV_FULL) {
        char why[512];
        /* ("full" for this write: an SSD tier makes room between writes) */
        return embkv__err(rc, "store %s: no room for %llu puts and %llu deletes at once: the pool has %zu free "
                          "records, %u of them kept for deletes only%s; %s",
                          s->path, (unsigned long long)puts, (unsigned long long)deletes, have, s->delete_reserve,
                          s->log && puts + deletes > 1 ? " (rows move to the SSD tier between writes, not "
                                                         "during one: smaller writes go through while it has room)"
                                                       : "",
                          full_why(s, (size_t)want - have, puts + deletes > 1 && want - have < puts, why, sizeof why));
    }
    return rc;
}

void slab_free(embkv_store *s, const uint64_t *locs, size_t n)
{
    /* (A freed record may be named by an index entry this thread changed
     * and flushed: drained first, as in slab_retire.) */
    persist_barrier(s);
    pthread_mutex_lock(&s->slab_mu);
    /* Room for every record of every chunk was reserved in add_chunk.  A
     * location in the SSD log goes back to the log's live counts instead
     * (reclamation frees both kinds alike: sync.c). */
    for (size_t i = 0; i < n; i++) {
        if (locs[i] & LOC_SSD)
            log_release(s->log, loc_plain(locs[i]));
        else
            s->free_locs.v[s->free_locs.n++] = loc_plain(locs[i]);
    }
    pthread_mutex_unlock(&s->slab_mu);
}

/* A used slot as the index's writers leave it: the fingerprint of its id,
 * and reachable by a lookup: on the id's probe path, every bucket before it
 * counting an overflow (a lookup stops at the first that counts none). */
static bool slot_placed(const index_desc *ix, const bucket *bk, unsigned i, uint64_t b)
{
    uint64_t h = embkv__hash(bk->slots[i].key), x = h & ix->mask, step = hash_step(h);
    if (bk->fp[i] != hash_fp(h))
        return false;
    for (uint64_t k = 0; k <= ix->mask; k++, x = (x + step) & ix->mask) {
        if (x == b)
            return true;
        if (ix->buckets[x].overflow == 0)
            return false;
    }
    return false;
}

void slab_map_chunks(embkv_store *s)
{
    s->nchunks = 0;
    while (s->nchunks < MAX_CHUNKS && !OID_IS_NULL(s->chunks[s->nchunks])) {
        atomic_store(&s->chunk_base[s->nchunks], chunk_records(s->pop, s->chunks[s->nchunks]));
        map_checked(s, s->nchunks);
        s->nchunks++;
    }
}

/* Damage met while the index is walked at the open: nothing of the store
 * can be trusted to be found, so it does not open. */
#define REBUILD_ADVICE ": the store does not open with its index damaged: restore it from a backup"

int slab_rebuild(embkv_store *s)
{
    slab_map_chunks(s);
    size_t total = (size_t)s->nchunks * s->recs_per_chunk;
    uint8_t *inuse = calloc(total ? total : 1, 1);
    if (!inuse)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory rebuilding the free list", s->path);
    index_desc *ix = atomic_load(&s->ix);
    for (uint64_t b = 0; b < ix->nbuckets; b++) {
        bucket *bk = &ix->buckets[b];
        /* No writer survives a close or a crash; recovery clears these, so
         * a cleanly closed store with one is damaged (readers would spin). */
        if (bk->version & 1) {
            free(inuse);
            return embkv__err(EMBKV_CORRUPT,
                              "store %s: index bucket %llu is damaged (locked by no writer)" REBUILD_ADVICE, s->path,
                              (unsigned long long)b);
        }
        for (unsigned i = 0; i < BUCKET_SLOTS; i++) {
            if (!(bk->used & (1u << i)))
                continue;
            uint64_t loc = bk->slots[i].loc;
            if (!slot_placed(ix, bk, i, b)) {
                free(inuse);
                return embkv__err(EMBKV_CORRUPT, "store %s: index bucket %llu is damaged (id %lld: its "
                                  "fingerprint or its place does not match)" REBUILD_ADVICE, s->path,
                                  (unsigned long long)b, (long long)bk->slots[i].key);
            }
            if ((loc & LOC_SSD) && (!s->log || (loc & LOC_TOMB) || !log_loc_plausible(s->log, loc))) {
                free(inuse);
                return embkv__err(EMBKV_CORRUPT,
                                  "store %s: index bucket %llu is damaged (id %lld points %s)" REBUILD_ADVICE, s->path,
                                  (unsigned long long)b, (long long)bk->slots[i].key, s->log ? "outside the SSD log" : "to an SSD tier this store does not have");
            }
            if (loc & LOC_SSD)
                continue;  /* the log's, not the record space's */
            uint32_t c = loc_chunk(loc), r = loc_index(loc);
            if (c >= s->nchunks || r >= s->recs_per_chunk) {
                free(inuse);
                return embkv__err(EMBKV_CORRUPT,
                                  "store %s: id %lld points outside the record space" REBUILD_ADVICE, s->path,
                                  (long long)bk->slots[i].key);
            }
            inuse[(size_t)c * s->recs_per_chunk + r] = 1;
        }
    }
    s->free_locs.n = 0;
    if (locvec_reserve(&s->free_locs, total ? total : 1) != EMBKV_OK) {
        free(inuse);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory rebuilding the free list", s->path);
    }
    for (size_t k = total; k-- > 0;)
        if (!inuse[k])
            s->free_locs.v[s->free_locs.n++] = loc_make((uint32_t)(k / s->recs_per_chunk),
                                                       (uint32_t)(k % s->recs_per_chunk));
    free(inuse);
    return EMBKV_OK;
}

size_t slab_free_count(embkv_store *s)
{
    pthread_mutex_lock(&s->slab_mu);
    size_t n = s->free_locs.n;
    pthread_mutex_unlock(&s->slab_mu);
    return n;
}

void slab_space(embkv_store *s, size_t *free_recs, size_t *total, bool *exhausted)
{
    pthread_mutex_lock(&s->slab_mu);
    *free_recs = s->free_locs.n;
    *total = (size_t)s->nchunks * s->recs_per_chunk;
    *exhausted = s->pool_exhausted;
    pthread_mutex_unlock(&s->slab_mu);
}

/* ------------------------------------------------------------ reclamation */

#define LIMBO_BATCH 4096  /* retired records that make a slab_reclaim run */

/* Appends n locations to one limbo list (retire_mu held); false when it
 * cannot grow. */
static bool limbo_push(limbo_entry **list, size_t *len, size_t *cap, const uint64_t *locs, size_t n, uint64_t e)
{
    if (*len + n > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *len + n)
            c *= 2;
        limbo_entry *p = realloc(*list, c * sizeof *p);
        if (!p)
            return false;
        *list = p;
        *cap = c;
    }
    for (size_t i = 0; i < n; i++)
        (*list)[(*len)++] = (limbo_entry){loc_plain(locs[i]), e};
    return true;
}

void slab_retire(embkv_store *s, const uint64_t *locs, size_t n, bool pinned, bool told)
{
    if (n == 0)
        return;
    /* Before the records get their epoch (P11): a search using a kept map
     * that names them entered its epoch before this, or sees the map
     * invalid.  (Told: a map that names them is one a search took before
     * the change was told, in its epoch since; one taken after has
     * followed the change.) */
    if (!told)
        knn_note_change(s);
    /* On persistent memory the index entries that stopped naming these
     * records were flushed, not yet drained: drained before the records
     * can be reused, or a power cut could bring back an entry naming a
     * record another row has since filled (test_powercut). */
    persist_barrier(s);
    /* Two lists, each in retirement order: versions an open snapshot may
     * read wait for it (P6); the rest (the versions a hot row goes through
     * while a long statement runs) only for the readers' epochs, so that an
     * open statement holds one version per row it may read, not one per
     * write. */
    pthread_mutex_lock(&s->retire_mu);
    uint64_t e = ebr_now();
    bool ok = pinned ? limbo_push(&s->plimbo, &s->nplimbo, &s->plimbo_cap, locs, n, e)
                     : limbo_push(&s->limbo, &s->nlimbo, &s->limbo_cap, locs, n, e);
    bool over = s->nlimbo + s->nplimbo >= LIMBO_BATCH;
    pthread_mutex_unlock(&s->retire_mu);
    if (!ok) {
        /* Cannot queue: wait out the readers and free right away, unless
         * a snapshot may still read them (then they leak until the next
         * open). */
        if (pinned && atomic_load(&s->snap_floor) != UINT64_MAX)
            return;
        ebr_synchronize();
        slab_free(s, locs, n);
        return;
    }
    if (over)
        slab_reclaim(s, false);
}

/* Takes the prefix of a limbo list retired before `safe` into freed[*k...]
 * (retire_mu held). */
static void limbo_take(limbo_entry *list, size_t *len, uint64_t safe, uint64_t *freed, size_t *k)
{
    size_t j = 0;
    while (j < *len && list[j].ebr_epoch < safe)
        j++;
    if (j == 0)
        return;  /* (the list may be NULL: never grown) */
    for (size_t i = 0; i < j; i++)
        freed[(*k)++] = list[i].loc;
    memmove(list, list + j, (*len - j) * sizeof *list);
    *len -= j;
}

void slab_reclaim(embkv_store *s, bool wait_for_readers)
{
    if (wait_for_readers)
        ebr_synchronize();
    pthread_mutex_lock(&s->retire_mu);
    uint64_t safe = ebr_safe_epoch();
    /* A pinned version retired since the oldest open snapshot began: that
     * snapshot may read it (P6, with the readers' epochs). */
    uint64_t floor = atomic_load(&s->snap_floor), psafe = floor < safe ? floor : safe;
    /* What can go, counted first: with many versions held for a snapshot,
     * most calls free nothing and should cost nothing. */
    size_t most = 0, k = 0;
    while (most < s->nlimbo && s->limbo[most].ebr_epoch < safe)
        most++;
    for (size_t j = 0; j < s->nplimbo && s->plimbo[j].ebr_epoch < psafe; j++)
        most++;
    if (most == 0) {
        pthread_mutex_unlock(&s->retire_mu);
        return;
    }
    uint64_t *freed = malloc(most * sizeof *freed);
    if (!freed) {
        pthread_mutex_unlock(&s->retire_mu);
        return;  /* try again at the next slab_reclaim */
    }
    limbo_take(s->limbo, &s->nlimbo, safe, freed, &k);
    limbo_take(s->plimbo, &s->nplimbo, psafe, freed, &k);
    pthread_mutex_unlock(&s->retire_mu);
    if (k)
        slab_free(s, freed, k);
    free(freed);
}
