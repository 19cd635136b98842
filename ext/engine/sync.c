/*
 * sync.c - the store's moments: the sync (checkpoint) that makes an epoch
 * durable, and the opening of a snapshot.
 *
 * Both stop the write groups for an instant (groups_quiesce, P7) with the
 * DRAM cache's dirty rows written back, and fix what they see there: a
 * sync closes epoch E between groups, a snapshot takes its sequence
 * number between them.  They are together because backup.c needs both at
 * once (sync_fixing: a snapshot of exactly what a sync made durable).
 * How bytes reach the media (flushes, the dirty map) is persist.c's.
 *
 * Epochs: every write is stamped with the current write epoch E.  A row's
 * version from before E (its durable version) is kept, linked as `prev`,
 * until sync E completes (P2); recovery after a crash follows `prev` for
 * every record newer than the durable epoch (P5), so the store reopens
 * exactly as of the last completed sync.
 */
#include <libpmem.h>
#include <stdlib.h>
#include <string.h>

#include "top.h"


/* Remove the index entries of rows deleted in an epoch that is now durable. */
static void purge_tombstones(embkv_store *s, tomb_entry *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t h = embkv__hash(t[i].id);
        pthread_rwlock_rdlock(&s->writers);
        keylock_acquire(s, h);
        index_desc *ix = atomic_load(&s->ix);
        found_slot f;
        if (ix_find(ix, t[i].id, h, &f) && f.loc == t[i].loc) {
            ix_remove(ix, h, &f);
            atomic_fetch_sub(&s->entries, 1);
            /* (A tombstone is in no kNN map: told, the change is only
             * counted, and the map stays.) */
            knnlog_tell(s, &(knn_change){.id = t[i].id, .from = t[i].loc, .to = LOC_NONE}, 1);
            slab_retire(s, &t[i].loc, 1, true, ix_section_all_told());
        }
        keylock_release(s, h);
        writers_unlock(s);
    }
}

/* Tombstones whose index entries stay for reader processes (readers.c):
 * a reader reads as of the checkpoint that was the last when its
 * statement began, and a row deleted in a later one is still a row as of
 * it.  Purged once every reader slot in an epoch at their sync has left
 * (all: now; the close, before its last sync). */
static void purge_deferred(embkv_store *s, bool all)
{
    if (s->ntdefer == 0)
        return;
    uint64_t safe = all ? UINT64_MAX : ebr_safe_epoch();
    size_t k = 0;
    while (k < s->ntdefer && s->tdefer_epoch[k] < safe)
        k++;
    purge_tombstones(s, s->tdefer, k);
    memmove(s->tdefer, s->tdefer + k, (s->ntdefer - k) * sizeof *s->tdefer);
    memmove(s->tdefer_epoch, s->tdefer_epoch + k, (s->ntdefer - k) * sizeof *s->tdefer_epoch);
    s->ntdefer -= k;
}

/* Keeps n tombstones of a durable epoch for the readers in an epoch now;
 * false when out of memory (they are purged now: such a reader may then
 * miss those rows, and is told nothing). */
static bool defer_tombstones(embkv_store *s, const tomb_entry *t, size_t n)
{
    if (s->ntdefer + n > s->tdefer_cap) {
        size_t cap = s->tdefer_cap ? s->tdefer_cap : 256;
        while (cap < s->ntdefer + n)
            cap *= 2;
        tomb_entry *a = realloc(s->tdefer, cap * sizeof *a);
        if (a)
            s->tdefer = a;
        uint64_t *b = a ? realloc(s->tdefer_epoch, cap * sizeof *b) : NULL;
        if (b)
            s->tdefer_epoch = b;
        if (!a || !b)
            return false;
        s->tdefer_cap = cap;
    }
    uint64_t e = ebr_now();
    for (size_t i = 0; i < n; i++) {
        s->tdefer[s->ntdefer] = t[i];
        s->tdefer_epoch[s->ntdefer++] = e;
    }
    return true;
}

void sync_purge_deferred(embkv_store *s)
{
    pthread_mutex_lock(&s->sync_mu);
    purge_deferred(s, true);
    pthread_mutex_unlock(&s->sync_mu);
}

int embkv_sync(embkv_store *s)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_sync: store is NULL");
    RO_REFUSE(s, "embkv_sync");
    return sync_fixing(s, NULL, NULL);
}

int sync_fixing(embkv_store *s, embkv_snapshot *snap, uint64_t *durable)
{
    if (group_held(s))
        return embkv__err(EMBKV_BUSY, "store %s: embkv_sync inside a write group of the same thread", s->path);
    /* (A sync under way may wait for a group that waits for this
     * thread's scan pin: pinned_lock.) */
    const char *what = snap ? "embkv_backup_begin" : "embkv_sync";
    int lrc = pinned_lock(s, PIN_WAIT_MUTEX, &s->sync_mu, what);
    if (lrc != EMBKV_OK)
        return lrc;
    uint64_t t0 = now_ns();

    /* Close epoch E between write groups (a crash returns to each group
     * entirely or not at all): groups in flight finish in E, later ones
     * write E+1. */
    uint64_t tail = tier_sync_tail(s);  /* log records below it are from epoch E or before */
    /* The cache's dirty rows go home in E (with the groups held for the
     * last of them): the checkpoint holds every change of every group. */
    /* No sync inside a write group (P7): the groups in flight end in E. */
    int frc = s->cache ? writeback_quiesce(s, what) : groups_quiesce(s, what);
    if (frc != EMBKV_OK) {
        pthread_mutex_unlock(&s->sync_mu);
        return frc;
    }
    if (snap)
        snap_fix(snap);
    pthread_rwlock_wrlock(&s->writers);
    uint64_t e = atomic_load(&s->cur_epoch);
    atomic_store(&s->cur_epoch, e + 1);
    uint64_t rows_e = atomic_load(&s->rows);  /* (no writer: exactly epoch e's rows) */
    uint64_t steps_e = atomic_load(&s->steps); /* (P8: every push of epoch e counted) */
    pthread_mutex_lock(&s->retire_mu);
    locvec pend = s->pending[e & 1], pendu = s->pendingu[e & 1];
    tomb_entry *tombs = s->tombs[e & 1];
    size_t ntombs = s->ntombs[e & 1];
    s->pending[e & 1] = (locvec){0};
    s->pendingu[e & 1] = (locvec){0};
    s->tombs[e & 1] = NULL;
    s->ntombs[e & 1] = s->tombs_cap[e & 1] = 0;
    pthread_mutex_unlock(&s->retire_mu);
    pthread_rwlock_unlock(&s->writers);  /* (no index entry changed: P11) */
    groups_resume(s);

    /* The log first: the pool's pages about to be flushed point into it. */
    int rc = tier_sync_log(s, e, tail);
    if (rc == EMBKV_OK) {
        /* E's checkpoint mark goes to the media with E's pages (one flush):
         * the epoch it names is not durable until the root says so below,
         * and a mark of an epoch that never became durable is taken for
         * none (evict.c); should this sync fail, the mark still holds P8
         * for the records of E that a later sync makes durable. */
        evict_mark_write(s, e, steps_e);
        persist_range_in(s, s->root->marks, sizeof s->root->marks, e);
        /* (Where a real flush fails: after E's mark is written.) */
        if (debug_sync_point())
            rc = embkv__err(EMBKV_IO, "store %s: the sync failed (embkv_debug_fail_syncs)", s->path);
    }
    if (rc == EMBKV_OK && s->is_pmem)
        pmem_drain();
    else if (rc == EMBKV_OK) {
        rc = dirtymap_flush(s, s->dirty[e & 1]);
        /* After a failed sync its pages may not all be on disk (and the
         * epoch after it writes into the same bitmap). */
        if (rc == EMBKV_OK && s->sync_failed)
            rc = dirtymap_flush(s, s->dirty[(e + 1) & 1]);
    }
    if (rc == EMBKV_OK) {
        /* (stats read it beside a sync) */
        __atomic_store_n(&s->root->durable_epoch, e, __ATOMIC_RELAXED);
        s->root->durable_rows = rows_e;
        s->root->durable_rows_check = durable_rows_check(rows_e, e);
        /* The epoch and its row count with one flush: their check binds
         * them, so a power cut that writes one of them leaves no count,
         * not a wrong one. */
        pmemobj_persist(s->pop, &s->root->durable_epoch,
                        (size_t)((char *)(&s->root->durable_rows_check + 1) - (char *)&s->root->durable_epoch));
        if (durable)
            *durable = e;
        /* Epoch e is durable: its pages need not be marked any more. */
        if (!s->is_pmem)
            dirtymap_clear_epoch(s, e);
        s->sync_failed = false;
        /* Versions replaced during E and rows deleted during E are garbage
         * now that E is durable (P2), freed once no reader holds them (P6). */
        purge_deferred(s, false);
        if (!(ntombs && readers_active(s) && defer_tombstones(s, tombs, ntombs)))
            purge_tombstones(s, tombs, ntombs);
        /* (Told: each left the index in a section that told the kNN
         * change log or cleared knn_clean at its end, before this sync's
         * switch: P11.) */
        slab_retire(s, pend.v, pend.n, true, true);
        slab_retire(s, pendu.v, pendu.n, false, true);
        slab_reclaim(s, false);
        tier_sync_done(s);
    } else {
        s->sync_failed = true;
        /* The epoch is not durable: keep its old versions for recovery by
         * carrying them into the next epoch's lists (P2). */
        pthread_mutex_lock(&s->retire_mu);
        for (size_t i = 0; i < pend.n; i++)
            locvec_push(&s->pending[(e + 1) & 1], pend.v[i]);
        for (size_t i = 0; i < pendu.n; i++)
            locvec_push(&s->pendingu[(e + 1) & 1], pendu.v[i]);
        pthread_mutex_unlock(&s->retire_mu);
    }
    free(pend.v);
    free(pendu.v);
    free(tombs);
    double took = (double)(now_ns() - t0) / 1e6;
    __atomic_store(&s->last_sync_ms, &took, __ATOMIC_RELAXED);
    atomic_fetch_add(&s->st_syncs, 1);
    pthread_mutex_unlock(&s->sync_mu);
    return rc;
}

int embkv_snapshot_open(embkv_store *s, embkv_snapshot **out)
{
    if (!s || !out)
        return embkv__null_arg("embkv_snapshot_open", "s", (const void *)s, "out", (const void *)out, (char *)NULL);
    FORK_REFUSE(s, "embkv_snapshot_open");
    CALLBACK_REFUSE(s, "embkv_snapshot_open");
    *out = NULL;
    if (s->reader) {
        /* Held open: what its reads may reach stays unreused (R1). */
        int rc = ro_enter(s);
        if (rc != EMBKV_OK)
            return rc;
        if (!(*out = snap_reader_new(s, ro_as_of(s)))) {
            ro_leave(s);
            return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
        }
        return EMBKV_OK;
    }
    if (group_held(s))
        return embkv__err(EMBKV_BUSY, "store %s: a snapshot cannot be opened inside a write group of the same "
                          "thread", s->path);
    embkv_snapshot *snap;
    int rc = snap_register(s, &snap);
    if (rc != EMBKV_OK)
        return rc;
    /* Groups running now end before this returns; later ones log.  The
     * cache's dirty rows go home meanwhile: while a snapshot is open no row
     * is dirty (cached rows are written through), so the version log
     * covers every change a snapshot must not see. */
    rc = s->cache ? writeback_quiesce(s, "embkv_snapshot_open") : groups_quiesce(s, "embkv_snapshot_open");
    if (rc != EMBKV_OK) {
        snap_drop(snap);
        return rc;
    }
    snap_fix(snap);
    groups_resume(s);
    *out = snap;
    return EMBKV_OK;
}

/* ------------------------------------------------------------- checks */
