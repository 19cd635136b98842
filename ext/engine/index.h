/*
 * index.h - layer 2: where a row's current version is, and the records.
 *
 * pethash.c: the PetHash index (probing, moves home, key locks, resize,
 * the pins that hold resizes and moves off); slab.c: the record space in
 * the pool's chunks and its reclamation; knnlog.c: the index changes a
 * kept kNN map follows; snapshot.c: write groups, the snapshots and the
 * version log that lets a snapshot see replaced rows.
 * The index's read path is inline here, for the batch loops.
 */
#ifndef EMBKV_INDEX_H
#define EMBKV_INDEX_H

#include "persist.h"
#include "log.h"

/* ------------------------------------------------------------- pethash.c */
/* A DRAM descriptor of one index array; replaced whole on a resize. */
typedef struct index_desc {
    bucket *buckets;           /* 256-byte aligned inside the pool object */
    uint64_t nbuckets;         /* power of two */
    uint64_t mask;
    uint64_t generation;       /* bumped on every resize (scan cursors) */
    /* Odd while a key is being moved backwards (towards its home bucket):
     * a lookup that misses during or across a move retries.  In the reader
     * table when the store has one, so that reader processes see it too
     * (move_seq points at it), else move_seq_here. */
    atomic_uint_fast64_t *move_seq;
    atomic_uint_fast64_t move_seq_here;
    /* Pages changed are reported to the owner for the next sync; NULL while a
     * resize builds a private array. */
    struct embkv_store *owner;
} index_desc;

typedef struct found_slot {
    uint64_t bucket;
    unsigned slot;
    uint64_t loc;              /* as stored (may carry LOC_TOMB) */
} found_slot;

/* Seqlock of one bucket, for writers (the key's stripe lock held too). */
void ix_lock_bucket(bucket *b);
void ix_unlock_bucket(bucket *b);
/* ix_insert and ix_remove change slots: with the key's stripe lock
 * (keylock_acquire) and s->writers held shared, or alone on the array (a
 * resize's private one, recovery). */
/* Insert a key known absent; the key's stripe lock held. Returns false only
 * when no bucket on the whole probe cycle has room. */
bool ix_insert(index_desc *ix, int64_t id, uint64_t h, uint64_t loc, found_slot *out);
/* Whether slot i of bucket b is the first slot on id's path that holds id
 * (recovery: a key moved along its path by a process killed half-way is
 * there twice; readers find the first).  Unsynchronized: for recovery. */
bool ix_first_on_path(const index_desc *ix, int64_t id, uint64_t h, uint64_t b, unsigned i);
/* Remove the key at f (found by ix_find) and fix the counters on its path. */
void ix_remove(index_desc *ix, uint64_t h, const found_slot *f);
/* Position (0-based) of bucket b on the probe path of hash h. */
uint64_t ix_path_pos(index_desc *ix, uint64_t h, uint64_t b);
/* Recompute every overflow counter from the placement of the keys. */
void ix_rebuild_overflow(index_desc *ix);
/* Move a displaced key into its home bucket (hotset). 1 moved, 0 not. */
int ix_move_home(embkv_store *s, index_desc *ix, int64_t id, uint64_t h);

static inline unsigned ix_fp_match(const bucket *b, uint8_t fp)
{
    uint64_t w0 = __atomic_load_n((const uint64_t *)&b->fp[0], __ATOMIC_RELAXED);
    uint64_t w1 = __atomic_load_n((const uint64_t *)&b->fp[8], __ATOMIC_RELAXED);
    const uint64_t ones = 0x0101010101010101ull, low7 = 0x7f7f7f7f7f7f7f7full;
    uint64_t pat = ones * fp;
    uint64_t x0 = w0 ^ pat, x1 = w1 ^ pat;
    /* Exact per-byte zero test: high bit set in each byte that was zero. */
    uint64_t z0 = ~(((x0 & low7) + low7) | x0 | low7);
    uint64_t z1 = ~(((x1 & low7) + low7) | x1 | low7);
    /* Gather the eight flag bits of each word into a byte. */
    const uint64_t gather = 0x0102040810204080ull;
    unsigned m = (unsigned)((((z0 >> 7) & ones) * gather) >> 56) |
                 (unsigned)((((z1 >> 7) & ones) * gather) >> 56) << 8;
    return m & __atomic_load_n(&b->used, __ATOMIC_RELAXED);
}

/* The read path, inlined into the batch loops.  ix_lookup: lock-free
 * lookup returning the stored location or LOC_NONE; ix_find: the same with
 * the slot, for writers holding the key's stripe lock. */
static inline void ix_relax(unsigned *spins)
{
    if (++*spins > 64) {
        sched_yield();
        *spins = 0;
    } else {
        __builtin_ia32_pause();
    }
}

/* A bucket's seqlock: the even version a read starts from (waiting out a
 * writer), and whether the version is still it after the read. */
static inline uint32_t ix_read_begin(const bucket *bk, unsigned *spins)
{
    uint32_t v;
    while ((v = __atomic_load_n(&bk->version, __ATOMIC_ACQUIRE)) & 1)
        ix_relax(spins);
    return v;
}

static inline bool ix_read_still(const bucket *bk, uint32_t v)
{
    seq_fence(__ATOMIC_ACQUIRE);
    return __atomic_load_n(&bk->version, __ATOMIC_RELAXED) == v;
}

/* One consistent read of a bucket: the slot holding id (or -1) and the
 * overflow counter. */
static inline int ix_read_bucket(const bucket *bk, int64_t id, uint8_t fp, uint64_t *loc,
                              uint16_t *ovf)
{
    unsigned spins = 0;
    for (;;) {
        uint32_t v1 = ix_read_begin(bk, &spins);
        int found = -1;
        unsigned m = ix_fp_match(bk, fp);
        while (m) {
            unsigned i = (unsigned)__builtin_ctz(m);
            if (__atomic_load_n(&bk->slots[i].key, __ATOMIC_RELAXED) == id) {
                *loc = __atomic_load_n(&bk->slots[i].loc, __ATOMIC_ACQUIRE);
                found = (int)i;
                break;
            }
            m &= m - 1;
        }
        *ovf = __atomic_load_n(&bk->overflow, __ATOMIC_RELAXED);
        if (ix_read_still(bk, v1))
            return found;
    }
}

/* Walk the probe path of id; fills out and returns true when found. */
static inline bool ix_probe(index_desc *ix, int64_t id, uint64_t h, found_slot *out, uint32_t *probes)
{
    uint64_t step = hash_step(h);
    uint8_t fp = hash_fp(h);
    unsigned spins = 0;
    for (;;) {
        uint64_t seq = atomic_load(ix->move_seq);
        uint64_t b = h & ix->mask;
        uint32_t n = 0;
        for (uint64_t i = 0; i <= ix->mask; i++) {
            uint64_t loc = LOC_NONE;
            uint16_t ovf;
            n++;
            int s = ix_read_bucket(&ix->buckets[b], id, fp, &loc, &ovf);
            if (s >= 0) {
                out->bucket = b;
                out->slot = (unsigned)s;
                out->loc = loc;
                if (probes)
                    *probes = n;
                return true;
            }
            if (ovf == 0)
                break;
            b = (b + step) & ix->mask;
        }
        /* A miss is only trusted when no key moved backwards meanwhile. */
        uint64_t seq2 = atomic_load(ix->move_seq);
        if (seq == seq2 && !(seq & 1)) {
            if (probes)
                *probes = n;
            return false;
        }
        ix_relax(&spins);
    }
}

/* The rows of one bucket read under its seqlock as one moment of it: their
 * ids and locations, tombstone entries too when tombs (a reader process:
 * a row deleted since its checkpoint is a row as of it); how many. */
static inline unsigned ix_bucket_rows(const bucket *bk, int64_t *ids, uint64_t *locs, bool tombs)
{
    unsigned spins = 0;
    for (;;) {
        uint32_t v1 = ix_read_begin(bk, &spins);
        unsigned n = 0;
        uint16_t used = __atomic_load_n(&bk->used, __ATOMIC_RELAXED);
        for (unsigned i = 0; i < BUCKET_SLOTS; i++) {
            if (!(used & (1u << i)))
                continue;
            uint64_t loc = __atomic_load_n(&bk->slots[i].loc, __ATOMIC_ACQUIRE);
            if ((loc & LOC_TOMB) && !tombs)
                continue;
            ids[n] = __atomic_load_n(&bk->slots[i].key, __ATOMIC_RELAXED);
            locs[n] = loc;
            n++;
        }
        if (ix_read_still(bk, v1))
            return n;
    }
}

static inline uint64_t ix_lookup(index_desc *ix, int64_t id, uint64_t h, uint32_t *probes)
{
    found_slot f;
    return ix_probe(ix, id, h, &f, probes) ? f.loc : LOC_NONE;
}

static inline bool ix_find(index_desc *ix, int64_t id, uint64_t h, found_slot *out)
{
    return ix_probe(ix, id, h, out, NULL);
}
/* This thread's tally of the index entries it changed in its section of
 * s->writers (place, unplace, set_loc; a move counts twice), and of the
 * changes it told the kNN change log of (knnlog_tell).  Reset at the
 * section's end (writers_unlock).  Changes made outside a section
 * (recovery) carry over to the next one, which then clears knn_clean:
 * the count can only make a section clear more often than it must. */
typedef struct ix_tally {
    uint64_t changes, told;
} ix_tally;
extern _Thread_local ix_tally ix_section;

/* Whether this thread told the log of every entry its section changed
 * (P11: no kept map needs clearing; a section that changed none too). */
static inline bool ix_section_all_told(void)
{
    return ix_section.told == ix_section.changes;
}

/* Points the slot f found at loc; under the row's key lock, with
 * s->writers held shared. */
static inline void set_loc(embkv_store *s, index_desc *ix, const found_slot *f, uint64_t loc)
{
    slot *sl = &ix->buckets[f->bucket].slots[f->slot];
    /* Marked before the change (P4): recovery visits only marked buckets. */
    mark_bucket(s, &ix->buckets[f->bucket]);
    __atomic_store_n(&sl->loc, loc, __ATOMIC_RELEASE);
    ix_section.changes++;
    debug_index_point();
    persist_range(s, &sl->loc, sizeof sl->loc);
}

/* P11: after changing the index or retiring records, a writer clears
 * knn_clean (a kept kNN map no longer describes the pool), unless every
 * kept map has been told of the changes (knnlog_tell).  The fence orders
 * the changes before the load: either the load sees a pass's id (and
 * clears it) or that pass, which set it before reading the index, sees
 * the changes. */
static inline void knn_note_change(struct embkv_store *s)
{
    full_fence();
    /* (seq_cst: a writer that reads another's clear is ordered after it,
     * on hardware that is not multi-copy atomic too) */
    if (atomic_load_explicit(&s->knn_clean, memory_order_seq_cst)) {
        atomic_store_explicit(&s->knn_clean, 0, memory_order_relaxed);
        /* Seen before what follows: slab_retire reads the epoch its
         * records wait for next, and a search that still saw the id must
         * have entered its epoch before that read. */
        full_fence();
    }
}

/* The end of a section holding s->writers (shared or exclusive): every
 * change to the index is made inside one (P11).  A section whose changes
 * were all told to the kNN change log (knnlog.c), or that changed none,
 * leaves the kept map valid; any other clears it. */
static inline void writers_unlock(struct embkv_store *s)
{
    bool told = ix_section_all_told();
    ix_section.changes = ix_section.told = 0;
    /* (Cleared before the unlock: a search that then holds s->writers
     * exclusively finds every change told or its map cleared: knn.c.) */
    if (!told)
        knn_note_change(s);
    pthread_rwlock_unlock(&s->writers);
}

/* Key locks: one spin lock per stripe of ids' hashes; a writer of a row
 * holds its stripe (ordering the writes of one id). */
void keylock_acquire(embkv_store *s, uint64_t h);
void keylock_release(embkv_store *s, uint64_t h);
bool keylock_try(embkv_store *s, uint64_t h);
static inline unsigned keylock_stripe(uint64_t h) { return (unsigned)(h >> 20) & (KEYLOCK_STRIPES - 1); }

/* The resize: grows the index to hold need_entries at the load limit
 * (takes s->writers exclusively; waits for scan pins). */
int ix_grow(embkv_store *s, uint64_t need_entries);
/* Entries the current index holds before it must grow. */
uint64_t ix_grow_threshold(embkv_store *s);
/* Grows the index first when `more` new entries could cross the load limit. */
int ix_grow_for(embkv_store *s, uint64_t more);
/* A descriptor of the bucket array in oid (calloc'd; NULL when out of memory). */
index_desc *ix_desc_new(embkv_store *s, PMEMoid oid, uint64_t nbuckets, uint64_t generation);
/* A reader process's index (s->reader; pethash.c): made at open, freed at
 * close; ix_reader_enter enters the thread's reader slot (rd_enter) and,
 * when not nested, points s->ix at the writer's current array. */
int ix_reader_open(embkv_store *s);
void ix_reader_free(embkv_store *s);
int ix_reader_enter(embkv_store *s);
/* Whether pool location loc names a record of a chunk the reader has
 * mapped (mapping the writer's new chunks first); false for one the pool
 * cannot hold. */
bool ix_reader_loc_mapped(embkv_store *s, uint64_t loc);
/* Pins held by the calling thread (on any store). */
extern _Thread_local unsigned scan_pins_here;
/* Takes lock (a pthread mutex, or an rwlock shared or exclusive) as the
 * blocking call does; in a thread holding a scan pin, EMBKV_BUSY naming
 * what (the caller's name) instead of waiting on while a resize of s
 * waits for the pins (the wait could be on this thread itself). */
enum pin_wait { PIN_WAIT_MUTEX, PIN_WAIT_RDLOCK, PIN_WAIT_WRLOCK };
int pinned_lock(embkv_store *s, enum pin_wait how, void *lock, const char *what);
/* Points id's entry at q if it still names p (with s->writers shared) and,
 * was non-NULL (p a pool record), p still holds the version was copies. */
bool ix_switch(embkv_store *s, int64_t id, uint64_t p, uint64_t q, const rec_hdr *was);
/* While a move pin is held no row moves between buckets (a
 * cursor that restarts after a resize instead of holding it off). */
void move_pin(embkv_store *s);
void move_unpin(embkv_store *s);
/* ix_move_home unless a scan or move pin is held: 1 moved, 0 not, -1
 * pinned (the caller stops moving).  With id's key lock and s->writers
 * shared held. */
int ix_move_home_unpinned(embkv_store *s, index_desc *ix, int64_t id, uint64_t h);

/* ------------------------------------------------------------- slab.c */
/* n free records into locs, leaving the delete reserve free: EMBKV_OK, or
 * EMBKV_FULL naming the pool (nothing taken).  Takes slab_mu; any thread. */
int slab_alloc(embkv_store *s, uint64_t *locs, size_t n);
/* For the SSD tier's moves into the pool (promotions, hot-set moves): as
 * slab_alloc, and leaves free the records write groups hold
 * (s->room_held, read under slab_mu, where slab_room_for adds to it). */
int slab_alloc_move(embkv_store *s, uint64_t *locs, size_t n);
/* For tombstones: may take the delete reserve that slab_alloc leaves free. */
int slab_alloc_tombstone(embkv_store *s, uint64_t *loc);
/* Back to the free list at once (pool records) or to the log's live
 * counts (log locations): only for records no reader can hold any more
 * (slab_reclaim), or never published. */
void slab_free(embkv_store *s, const uint64_t *locs, size_t n);
/* embkv_room_for of the pool alone (write.c adds demotion). */
int slab_room_for(embkv_store *s, uint64_t puts, uint64_t deletes, bool hold);
/* Free records now (under slab_mu: a moment's figure). */
size_t slab_free_count(embkv_store *s);
/* Free records, records in the chunks so far, and whether the pool refused
 * a chunk (then the total is all the pool will hold). */
void slab_space(embkv_store *s, size_t *free_recs, size_t *total, bool *exhausted);
/* At open, single-threaded: maps the chunks and rebuilds the free list
 * from the index (a record is in use exactly when an entry names it);
 * EMBKV_CORRUPT for an index that names records it cannot hold. */
int slab_rebuild(embkv_store *s);
/* Where each record chunk's records begin (what rec_at needs): the part of
 * slab_rebuild that recovery, which reads records, needs before it. */
void slab_map_chunks(embkv_store *s);
/* The checked map.  A scan that reads every record (embkv_knn) checks
 * each (id and checksum) once, not at every pass: a record does not
 * change while its place is in use (P1: filled, then named), so what a
 * check finds (a torn write, a file damaged while closed) is there the
 * first time.  Placing a record (slab_alloc) forgets its place's check;
 * a reopen forgets all.  Chunk c, place i: */
static inline bool slab_checked(embkv_store *s, uint32_t c, uint32_t i)
{
    _Atomic uint64_t *m = atomic_load_explicit(&s->checked[c], memory_order_acquire);
    return m && (atomic_load_explicit(&m[i >> 6], memory_order_relaxed) >> (i & 63)) & 1;
}
static inline void slab_set_checked(embkv_store *s, uint32_t c, uint32_t i)
{
    _Atomic uint64_t *m = atomic_load_explicit(&s->checked[c], memory_order_acquire);
    if (m)
        atomic_fetch_or_explicit(&m[i >> 6], 1ull << (i & 63), memory_order_relaxed);
}
/* The checked map's memory (store.c's free_store). */
void slab_free_checked(embkv_store *s);
static inline rec_hdr *rec_at(embkv_store *s, uint64_t loc)
{
    char *base = atomic_load_explicit(&s->chunk_base[loc_chunk(loc)], memory_order_acquire);
    return (rec_hdr *)(base + (size_t)loc_index(loc) * s->rec_size);
}
/* A record's payload: the vector encoded as the store's dtype, then the
 * optimizer state in float32 (rec_vec: the vector of a float32 store). */
static inline float *rec_vec(rec_hdr *r) { return (float *)(r + 1); }
static inline float *rec_state(const embkv_store *s, rec_hdr *r) { return (float *)((char *)(r + 1) + s->vec_bytes); }
static inline size_t rec_payload_bytes(const embkv_store *s) { return s->vec_bytes + 4 * (size_t)s->state_floats; }
/* The vector of r in float32; false for an encoding no write leaves (a
 * damaged record: dtype_decode). */
static inline bool rec_vec_get(const embkv_store *s, rec_hdr *r, float *dst)
{
    if (s->dtype == EMBKV_F32) {
        memcpy(dst, r + 1, 4 * (size_t)s->dim);
        return true;
    }
    return dtype_decode((int)s->dtype, s->dim, r + 1, dst);
}
/* Where a record enters from the medium (every read that copies one out):
 * it must be id's and match its checksum, else the read fails naming the
 * id (rec_damaged, in sync.c) instead of returning damaged data. */
static inline bool rec_ok(const embkv_store *s, const rec_hdr *r, int64_t id)
{
    return r->id == id && r->check == rec_checksum(s, r);
}
/* Retire locations: freed once no reader can see them (P6).  pinned: a
 * version an open snapshot may read (snap_log says which), kept while a
 * snapshot older than its retirement is open; unpinned ones wait for the
 * readers' epochs only.  told: every kept kNN map knows these records
 * left the index (their removals were told to the kNN change log, or
 * their section's end cleared knn_clean: P11); else the retirement
 * clears knn_clean. */
void slab_retire(embkv_store *s, const uint64_t *locs, size_t n, bool pinned, bool told);

/* ------------------------------------------------------------- knnlog.c */
/* One index change a kept kNN map can follow: id's record moved from
 * place `from` (LOC_NONE for an insert; a flagged one names no place of
 * the map) to place `to` in the pool. */
typedef struct knn_change {
    int64_t id;
    uint64_t from, to;
} knn_change;
/* Tells the kNN change log of n changes this thread made in its section
 * of s->writers, after making them (P11); counts them told. */
void knnlog_tell(embkv_store *s, const knn_change *c, size_t n);
/* At the close. */
void knnlog_free(embkv_store *s);
/* Frees the retired records no reader or snapshot can hold any more (P6);
 * wait_for_readers: waits out the readers in an epoch now first (so never
 * from inside ebr_enter).  Takes retire_mu, then slab_mu (not nested);
 * retire_mu may be taken under slab_mu, never the reverse. */
void slab_reclaim(embkv_store *s, bool wait_for_readers);

/* ------------------------------------------------------------- snapshot.c */
/* The store's group lock and version log (at open: EMBKV_NOMEM or OK);
 * freed at close, with no group or snapshot left. */
int snap_init(embkv_store *s);
void snap_free(embkv_store *s);
/* Whether this thread is inside a write group on s. */
bool group_held(embkv_store *s);
/* The records this thread's group on s holds (slab_room_for with hold,
 * which added them to s->room_held): taken off when the group ends. */
void group_note_hold(embkv_store *s, size_t records);
/* Wait for the groups in flight and hold new ones off (sync's epoch
 * switch): EMBKV_OK, or EMBKV_BUSY naming what (the caller) in a thread
 * holding a scan pin that a group waits for (pinned_lock): nothing held. */
int groups_quiesce(embkv_store *s, const char *what);
/* Lets the groups held off by groups_quiesce go on. */
void groups_resume(embkv_store *s);
/* A snapshot in two steps, for a caller that must fix it at a moment of
 * its own choosing (backup.c: at a sync's epoch switch): snap_register
 * lists it (the groups begun from then on log their changes), snap_fix,
 * called with the groups quiesced, fixes what it sees. */
int snap_register(embkv_store *s, embkv_snapshot **out);
void snap_fix(embkv_snapshot *snap);
/* Closes a snapshot registered and never fixed (its open failed). */
void snap_drop(embkv_snapshot *snap);
/* Before changing id's index entry from prev, inside a group.  *pinned
 * (may be NULL): whether an open snapshot may read the version at prev
 * (one opened after the group that made it and before this one); a
 * version no snapshot can read need not outlive the readers' epochs. */
int snap_log(embkv_store *s, int64_t id, uint64_t h, uint64_t prev, bool *pinned);
/* locs[i] of ids[i] as of the snapshot, after the index lookups;
 * logged (may be NULL): 1 where the version log decided locs[i]. */
void snap_resolve(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, uint64_t *locs,
                  uint8_t *logged);
/* A reader process's snapshot as of durable epoch as_of (inside the
 * reader slot the opener entered; closing it leaves), NULL when out of
 * memory; snap_as_of: that epoch (0 for the writer's snapshots). */
embkv_snapshot *snap_reader_new(embkv_store *s, uint64_t as_of);
uint64_t snap_as_of(const embkv_snapshot *snap);
/* EMBKV_OK when snap is NULL or was opened on s; else EMBKV_INVALID for
 * function fn naming both stores. */
int snap_check_store(embkv_store *s, const embkv_snapshot *snap, const char *fn);
/* Whether the calling thread's group on s logs (a snapshot was open when
 * it began). */
bool group_logging(embkv_store *s);
/* A helper thread's part in another thread's group (train.c's push on two
 * threads): group_token_of gives the calling thread's group on s (false:
 * none); group_join makes the helper's writes that group's (its sequence,
 * its logging) without taking the group lock, which the giver holds: the
 * giver joins the helper, which has called group_leave, before it ends the
 * group.  (Taking the lock again would wait behind a sync's queued
 * quiesce, which waits for the giver: a deadlock.)  group_join is
 * EMBKV_BUSY when the thread has no free group entry. */
typedef struct group_token {
    uint64_t seq;
    bool logging;
} group_token;
bool group_token_of(embkv_store *s, group_token *out);
int group_join(embkv_store *s, const group_token *t);
void group_leave(embkv_store *s);

#endif
