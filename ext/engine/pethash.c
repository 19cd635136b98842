/*
 * pethash.c - the PetHash index: one level of 256-byte buckets in PM.
 *
 * A key's home bucket is hash & mask.  When the home bucket is full the key
 * goes to home + k*step (step odd and hash-dependent, so neighbouring homes
 * do not pile onto the same run), and every bucket passed over counts the
 * displacement in its overflow counter.  A lookup reads buckets along the
 * path and stops at the first one whose overflow counter is 0: at load 0.8
 * that is one bucket for most keys.
 *
 * Concurrency: readers take no lock.  Each bucket's version is a seqlock:
 * writers make it odd while they change the slot table, readers retry when
 * it moved.  A row's location is replaced with one atomic 8-byte store
 * without touching the version (the copy-on-write switch).  Overflow
 * counters are changed atomically and only ever over-approximate during a
 * change (incremented before a key is placed, decremented after it left).
 *
 * Also here, because the index is what they protect: the key locks (one
 * writer per id), the switch of an entry to a row's new copy, the pins
 * that hold resizes and moves between buckets off a scan, and the resize.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "index.h"

#define FULL_MASK ((uint16_t)((1u << BUCKET_SLOTS) - 1))

_Thread_local ix_tally ix_section;

void ix_lock_bucket(bucket *b)
{
    unsigned spins = 0;
    for (;;) {
        uint32_t v = __atomic_load_n(&b->version, __ATOMIC_RELAXED);
        if (!(v & 1) && __atomic_compare_exchange_n(&b->version, &v, v + 1, false,
                                                    __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
            seq_fence(__ATOMIC_RELEASE);
            return;
        }
        ix_relax(&spins);
    }
}

void ix_unlock_bucket(bucket *b)
{
    __atomic_fetch_add(&b->version, 1, __ATOMIC_RELEASE);
}

static inline uint64_t next_bucket(const index_desc *ix, uint64_t b, uint64_t step)
{
    return (b + step) & ix->mask;
}

/* A bucket is marked for recovery before it changes (P4: recovery visits
 * only the buckets marked since the durable epoch, so a process killed
 * between a change and its mark would keep the change past the
 * checkpoint), and its page is marked for the next flush after. */
static inline void will_touch(const index_desc *ix, const bucket *bk)
{
    if (ix->owner)
        mark_bucket(ix->owner, bk);
}

static inline void touched(const index_desc *ix, const bucket *bk)
{
    if (ix->owner)
        persist_range(ix->owner, bk, BUCKET_BYTES);
}

/* Writes a key into free slot i of a locked bucket. */
static void place(const index_desc *ix, bucket *bk, unsigned i, int64_t id, uint8_t fp, uint64_t loc)
{
    will_touch(ix, bk);
    __atomic_store_n(&bk->slots[i].key, id, __ATOMIC_RELAXED);
    __atomic_store_n(&bk->slots[i].loc, loc, __ATOMIC_RELEASE);
    uint64_t *w = (uint64_t *)&bk->fp[i < 8 ? 0 : 8];
    unsigned shift = 8 * (i & 7);
    uint64_t word = __atomic_load_n(w, __ATOMIC_RELAXED);
    word = (word & ~(0xffull << shift)) | ((uint64_t)fp << shift);
    __atomic_store_n(w, word, __ATOMIC_RELAXED);
    if (ix->owner) {
        /* The slot and its fingerprint are durable before the used bit
         * that makes them an entry (P10): they lie on other cache lines,
         * which persistent memory may write back in any order. */
        persist_range(ix->owner, &bk->slots[i], sizeof bk->slots[i]);
        persist_range(ix->owner, w, sizeof *w);
        persist_barrier(ix->owner);
    }
    uint16_t used = __atomic_load_n(&bk->used, __ATOMIC_RELAXED);
    __atomic_store_n(&bk->used, (uint16_t)(used | (1u << i)), __ATOMIC_RELEASE);
    ix_section.changes++;
    if (ix->owner)
        debug_index_point();
    touched(ix, bk);
}

static void unplace(const index_desc *ix, bucket *bk, unsigned i)
{
    will_touch(ix, bk);
    uint16_t used = __atomic_load_n(&bk->used, __ATOMIC_RELAXED);
    __atomic_store_n(&bk->used, (uint16_t)(used & ~(1u << i)), __ATOMIC_RELEASE);
    ix_section.changes++;
    if (ix->owner)
        debug_index_point();
    touched(ix, bk);
}

static inline void count_over(const index_desc *ix, bucket *bk, int delta)
{
    will_touch(ix, bk);
    if (delta > 0)
        __atomic_fetch_add(&bk->overflow, 1, __ATOMIC_RELAXED);
    else
        __atomic_fetch_sub(&bk->overflow, 1, __ATOMIC_RELAXED);
    touched(ix, bk);
}

/* Place id in the first bucket with room from position `from` of its path
 * (from = its home, or a bucket on the path), counting the displacement in
 * every full bucket passed. */
static bool place_along_path(index_desc *ix, uint64_t from, int64_t id, uint64_t h,
                             uint64_t loc, found_slot *out)
{
    uint64_t step = hash_step(h), b = from;
    for (uint64_t i = 0; i <= ix->mask; i++) {
        bucket *bk = &ix->buckets[b];
        ix_lock_bucket(bk);
        uint16_t used = __atomic_load_n(&bk->used, __ATOMIC_RELAXED);
        if (used != FULL_MASK) {
            unsigned s = (unsigned)__builtin_ctz((unsigned)(~used & FULL_MASK));
            place(ix, bk, s, id, hash_fp(h), loc);
            ix_unlock_bucket(bk);
            if (out) {
                out->bucket = b;
                out->slot = s;
                out->loc = loc;
            }
            return true;
        }
        ix_unlock_bucket(bk);
        count_over(ix, bk, +1);
        b = next_bucket(ix, b, step);
    }
    /* Every bucket is full: undo the counts. */
    for (uint64_t i = 0; i <= ix->mask; i++) {
        count_over(ix, &ix->buckets[b], -1);
        b = next_bucket(ix, b, step);
    }
    return false;
}

bool ix_insert(index_desc *ix, int64_t id, uint64_t h, uint64_t loc, found_slot *out)
{
    return place_along_path(ix, h & ix->mask, id, h, loc, out);
}

/* Decrement the counters of the buckets a key at `b` passed over, walking
 * from `from` (its home or an earlier position) up to b. */
static void uncount_path(index_desc *ix, uint64_t h, uint64_t from, uint64_t b)
{
    uint64_t step = hash_step(h);
    for (uint64_t x = from; x != b; x = next_bucket(ix, x, step))
        count_over(ix, &ix->buckets[x], -1);
}

void ix_remove(index_desc *ix, uint64_t h, const found_slot *f)
{
    bucket *bk = &ix->buckets[f->bucket];
    ix_lock_bucket(bk);
    unplace(ix, bk, f->slot);
    ix_unlock_bucket(bk);
    uncount_path(ix, h, h & ix->mask, f->bucket);
}

uint64_t ix_path_pos(index_desc *ix, uint64_t h, uint64_t b)
{
    uint64_t step = hash_step(h), x = h & ix->mask, pos = 0;
    while (x != b) {
        x = next_bucket(ix, x, step);
        pos++;
    }
    return pos;
}

void ix_rebuild_overflow(index_desc *ix)
{
    for (uint64_t b = 0; b < ix->nbuckets; b++)
        ix->buckets[b].overflow = 0;
    for (uint64_t b = 0; b < ix->nbuckets; b++) {
        bucket *bk = &ix->buckets[b];
        for (unsigned i = 0; i < BUCKET_SLOTS; i++) {
            if (!(bk->used & (1u << i)))
                continue;
            uint64_t h = embkv__hash(bk->slots[i].key);
            uint64_t step = hash_step(h);
            for (uint64_t x = h & ix->mask; x != b; x = next_bucket(ix, x, step))
                ix->buckets[x].overflow++;
        }
    }
}

/* Make room in a full home bucket by pushing one displaced key (a victim
 * whose own home is elsewhere) further along its own path.  The victim's
 * key lock is taken with trylock: the caller holds another key lock, and
 * waiting here could deadlock. */
static bool evict_victim(embkv_store *s, index_desc *ix, uint64_t home, uint64_t my_h)
{
    bucket *hb = &ix->buckets[home];
    for (unsigned i = 0; i < BUCKET_SLOTS; i++) {
        if (!(__atomic_load_n(&hb->used, __ATOMIC_ACQUIRE) & (1u << i)))
            continue;
        int64_t vkey = __atomic_load_n(&hb->slots[i].key, __ATOMIC_RELAXED);
        uint64_t vh = embkv__hash(vkey);
        if ((vh & ix->mask) == home)
            continue;  /* at home itself: not a victim */
        bool same_stripe = keylock_stripe(vh) == keylock_stripe(my_h);
        if (!same_stripe && !keylock_try(s, vh))
            continue;
        found_slot vf;
        bool moved = false;
        /* Under its key lock the victim cannot change; re-find it. */
        if (ix_find(ix, vkey, vh, &vf) && vf.bucket == home) {
            /* Count home itself as passed over, then place further on.
             * A forward move is safe for readers: the copy exists before the
             * original is removed, and readers walk the path forwards. */
            count_over(ix, hb, +1);  /* (marks home before the copy: see ix_move_home) */
            found_slot nf;
            if (place_along_path(ix, next_bucket(ix, home, hash_step(vh)), vkey, vh, vf.loc, &nf)) {
                ix_lock_bucket(hb);
                unplace(ix, hb, vf.slot);
                ix_unlock_bucket(hb);
                moved = true;
            } else {
                count_over(ix, hb, -1);
            }
        }
        if (!same_stripe)
            keylock_release(s, vh);
        if (moved)
            return true;
    }
    return false;
}

int ix_move_home(embkv_store *s, index_desc *ix, int64_t id, uint64_t h)
{
    found_slot f;
    uint64_t home = h & ix->mask;
    if (!ix_find(ix, id, h, &f) || f.bucket == home || (f.loc & LOC_TOMB))
        return 0;
    bucket *hb = &ix->buckets[home];
    for (int attempt = 0; attempt < 2; attempt++) {
        ix_lock_bucket(hb);
        uint16_t used = __atomic_load_n(&hb->used, __ATOMIC_RELAXED);
        if (used != FULL_MASK) {
            /* Both buckets are marked before the copy is placed: a kill
             * between the copy and the removal of the original leaves the
             * key twice, and recovery (which visits marked buckets only)
             * must see both to roll them back alike and drop the second
             * (ix_first_on_path). */
            will_touch(ix, &ix->buckets[f.bucket]);
            /* Backward move: readers that miss across it retry (move_seq). */
            atomic_fetch_add(ix->move_seq, 1);
            unsigned slot_i = (unsigned)__builtin_ctz((unsigned)(~used & FULL_MASK));
            place(ix, hb, slot_i, id, hash_fp(h), f.loc);
            ix_unlock_bucket(hb);
            bucket *ob = &ix->buckets[f.bucket];
            ix_lock_bucket(ob);
            unplace(ix, ob, f.slot);
            ix_unlock_bucket(ob);
            atomic_fetch_add(ix->move_seq, 1);
            uncount_path(ix, h, home, f.bucket);
            return 1;
        }
        ix_unlock_bucket(hb);
        if (attempt == 0 && !evict_victim(s, ix, home, h))
            return 0;
    }
    return 0;
}

bool ix_first_on_path(const index_desc *ix, int64_t id, uint64_t h, uint64_t b, unsigned i)
{
    uint64_t step = hash_step(h), x = h & ix->mask;
    for (uint64_t n = 0; n <= ix->mask; n++, x = next_bucket(ix, x, step)) {
        const bucket *bk = &ix->buckets[x];
        for (unsigned k = 0; k < BUCKET_SLOTS; k++) {
            if (x == b && k == i)
                return true;
            if ((bk->used & (1u << k)) && bk->slots[k].key == id)
                return false;
        }
    }
    return true;
}

/* ------------------------------------------------------------ key locks */

void keylock_acquire(embkv_store *s, uint64_t h)
{
    atomic_uint *l = &s->keylocks[keylock_stripe(h)];
    unsigned spins = 0;
    while (atomic_exchange_explicit(l, 1, memory_order_acquire)) {
        while (atomic_load_explicit(l, memory_order_relaxed)) {
            if (++spins > 100) {
                sched_yield();
                spins = 0;
            }
        }
    }
}

void keylock_release(embkv_store *s, uint64_t h)
{
    atomic_store_explicit(&s->keylocks[keylock_stripe(h)], 0, memory_order_release);
}

bool keylock_try(embkv_store *s, uint64_t h)
{
    return !atomic_exchange_explicit(&s->keylocks[keylock_stripe(h)], 1, memory_order_acquire);
}

/* ------------------------------------------------------------ switches */

/* Points id's entry at the copy q if it still names p; with s->writers
 * held shared (persist_range marks the epoch's dirty pages). */
bool ix_switch(embkv_store *s, int64_t id, uint64_t p, uint64_t q, const rec_hdr *was)
{
    uint64_t h = embkv__hash(id);
    bool done = false;
    keylock_acquire(s, h);
    index_desc *ix = atomic_load(&s->ix);
    found_slot f;
    /* A pool record the index names again may be another version in the
     * same record (freed and reused for the row meanwhile): the copy must
     * still be of the version there (under the key lock it cannot change). */
    const rec_hdr *r = NULL;
    if (ix_find(ix, id, h, &f) && f.loc == p &&
        (!was || ((r = rec_at(s, p))->check == was->check && r->clock == was->clock && r->epoch == was->epoch))) {
        set_loc(s, ix, &f, q);  /* (a crash point of embkv_debug_kill_after_index_writes) */
        done = true;
    }
    keylock_release(s, h);
    return done;
}

/* ----------------------------------------------- reader processes' index */

/* A reader process (s->reader) has no index of its own: it walks the
 * writer's array, found through the root under the reader table's
 * seqlock (readers_ix_read) each time one of its threads starts reading. */
typedef struct ro_state {
    pthread_mutex_t mu;
    index_desc **old;          /* descriptors replaced (freed at close) */
    size_t nold;
    uint64_t ix_off, ix_nb;    /* what the current descriptor describes */
} ro_state;

/* The record chunks the writer added since (in order: slab.c), for rec_at
 * (knn reads records where they are).  Under ro->mu. */
static void reader_chunks(embkv_store *s)
{
    while (s->nchunks < MAX_CHUNKS) {
        uint64_t coff = __atomic_load_n(&s->chunks[s->nchunks].off, __ATOMIC_ACQUIRE);
        if (coff < 4096 || coff > s->pool_size || s->chunk_bytes > s->pool_size - coff)
            break;
        atomic_store(&s->chunk_base[s->nchunks], s->pool_base + ((coff + 63) & ~(uint64_t)63) + 64 - sizeof(rec_hdr));
        s->nchunks++;
    }
}

static int reader_index(embkv_store *s)
{
    ro_state *ro = s->ro;
    uint64_t off, nb;
    readers_ix_read(s, &off, &nb);
    pthread_mutex_lock(&ro->mu);
    index_desc *cur = atomic_load(&s->ix);
    if (cur && off == ro->ix_off && nb == ro->ix_nb) {
        reader_chunks(s);
        pthread_mutex_unlock(&ro->mu);
        return EMBKV_OK;
    }
    if (nb < 16 || (nb & (nb - 1)) || off < 4096 || nb > s->pool_size / BUCKET_BYTES ||
        off > s->pool_size - (nb + 1) * BUCKET_BYTES) {
        pthread_mutex_unlock(&ro->mu);
        return embkv__err(EMBKV_CORRUPT, "store %s: the pool's root names an index outside the pool", s->path);
    }
    index_desc *ix = calloc(1, sizeof *ix);
    index_desc **old = cur ? realloc(ro->old, (ro->nold + 1) * sizeof *old) : ro->old;
    if (!ix || (cur && !old)) {
        free(ix);
        pthread_mutex_unlock(&ro->mu);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
    }
    uintptr_t p = (uintptr_t)(s->pool_base + off);
    ix->buckets = (bucket *)((p + BUCKET_BYTES - 1) & ~(uintptr_t)(BUCKET_BYTES - 1));
    ix->nbuckets = nb;
    ix->mask = nb - 1;
    ix->generation = cur ? cur->generation + 1 : 1;
    ix->owner = s;
    ix->move_seq = readers_move_seq(s);
    /* (Other threads of this process may still walk the one it replaces.) */
    if (cur) {
        ro->old = old;
        ro->old[ro->nold++] = cur;
    }
    atomic_store(&s->ix, ix);
    reader_chunks(s);
    ro->ix_off = off;
    ro->ix_nb = nb;
    pthread_mutex_unlock(&ro->mu);
    return EMBKV_OK;
}

int ix_reader_open(embkv_store *s)
{
    ro_state *ro = calloc(1, sizeof *ro);
    if (!ro)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
    pthread_mutex_init(&ro->mu, NULL);
    s->ro = ro;
    return reader_index(s);
}

void ix_reader_free(embkv_store *s)
{
    ro_state *ro = s->ro;
    if (!ro)
        return;
    for (size_t i = 0; i < ro->nold; i++)
        free(ro->old[i]);
    free(ro->old);
    pthread_mutex_destroy(&ro->mu);
    free(ro);
    s->ro = NULL;
}

bool ix_reader_loc_mapped(embkv_store *s, uint64_t loc)
{
    uint32_t c = loc_chunk(loc);
    if (c >= MAX_CHUNKS || loc_index(loc) >= s->recs_per_chunk)
        return false;
    if (atomic_load_explicit(&s->chunk_base[c], memory_order_acquire))
        return true;
    ro_state *ro = s->ro;
    pthread_mutex_lock(&ro->mu);
    reader_chunks(s);
    pthread_mutex_unlock(&ro->mu);
    return atomic_load_explicit(&s->chunk_base[c], memory_order_acquire) != NULL;
}

int ix_reader_enter(embkv_store *s)
{
    bool first;
    int rc = rd_enter(s, &first);
    /* The index array the writer uses now, on entering: one it replaced
     * stays unreused while this slot holds (R1), but only until then. */
    if (rc == EMBKV_OK && first && (rc = reader_index(s)) != EMBKV_OK)
        rd_leave(s);
    return rc;
}

/* ------------------------------------------------------------ pins */

/* Scans and cursors pin the index: a resize (scan pins only) and moves
 * between buckets wait for them, so that a cursor's bucket number stays
 * meaningful and no row is met twice or missed because it moved.  The
 * mover's side of the handshake is ix_move_home_unpinned. */
_Thread_local unsigned scan_pins_here;

void embkv_scan_pin(embkv_store *s)
{
    if (!s)
        return;  /* (nothing to pin; the unpin of NULL is nothing too) */
    if (s->reader) {
        /* In a fork's child the thread's reader slot is the parent's: no
         * pin (the child's scans are refused, FORK_REFUSE). */
        if (handle_forked(s))
            return;
        /* The reader's slot stays entered while pinned (its array cannot
         * go), and the writer moves no row between buckets meanwhile. */
        if (ix_reader_enter(s) == EMBKV_OK)
            rd_pin(s);
        else
            rd_pin_failed(s);
        return;
    }
    for (;;) {
        atomic_fetch_add(&s->scan_pins, 1);
        /* A resize waiting for scans to end must not be starved by new ones
         * (unless this thread already scans, or runs an update callback
         * whose batch holds the writer lock the resize waits for: it could
         * wait for itself). */
        if (!atomic_load(&s->grow_pending) || scan_pins_here > 0 || update_fn_depth)
            break;
        atomic_fetch_sub(&s->scan_pins, 1);
        while (atomic_load(&s->grow_pending))
            sched_yield();
    }
    /* A move between buckets under way finishes first; later ones see the
     * pin and wait (hotset.c).  Both sides are sequentially consistent:
     * either the move sees the pin or the pin sees the move. */
    while (atomic_load(&s->moves_inflight) > 0)
        sched_yield();
    scan_pins_here++;
    /* A resize that started before the pin finishes before we go on.  (An
     * update callback's batch holds the writer lock shared: no resize
     * runs, and a second shared lock would wait behind a waiting one.) */
    if (!update_fn_depth) {
        pthread_rwlock_rdlock(&s->writers);
        pthread_rwlock_unlock(&s->writers);  /* (nothing changed: P11) */
    }
}

void embkv_scan_unpin(embkv_store *s)
{
    if (!s)
        return;
    if (s->reader) {
        if (handle_forked(s))
            return;  /* (the slot is the parent's: see embkv_scan_pin) */
        if (rd_unpin(s))
            rd_leave(s);
        return;
    }
    scan_pins_here--;
    atomic_fetch_sub(&s->scan_pins, 1);
}

/* A thread holding a pin must not wait for what waits for the pins: an
 * insert that found the index full waits, inside its write group, for the
 * last unpin (ix_grow), so the groups lock, and every lock held by a
 * thread waiting for the groups (a sync's sync_mu), is out of reach until
 * this thread unpins.  Such a thread waits in slices instead and gives up
 * once a resize of s waits for pins.  (scan_pins_here counts pins on any
 * store, as ix_grow's does: a pin on another store may make this refuse
 * where waiting would have ended; never the other way round.) */
#define PIN_WAIT_SLICE_NS 2000000L

int pinned_lock(embkv_store *s, enum pin_wait how, void *lock, const char *what)
{
    for (;;) {
        if (scan_pins_here == 0) {
            int e = how == PIN_WAIT_MUTEX    ? pthread_mutex_lock(lock)
                    : how == PIN_WAIT_RDLOCK ? pthread_rwlock_rdlock(lock)
                                             : pthread_rwlock_wrlock(lock);
            if (e == 0)
                return EMBKV_OK;
            return embkv__err(EMBKV_IO, "store %s: %s: taking a lock failed: %s", s->path, what, strerror(e));
        }
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);  /* (the timed locks' clock) */
        t.tv_nsec += PIN_WAIT_SLICE_NS;
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        int e = how == PIN_WAIT_MUTEX    ? pthread_mutex_timedlock(lock, &t)
                : how == PIN_WAIT_RDLOCK ? pthread_rwlock_timedrdlock(lock, &t)
                                         : pthread_rwlock_timedwrlock(lock, &t);
        if (e == 0)
            return EMBKV_OK;
        if (e != ETIMEDOUT)
            return embkv__err(EMBKV_IO, "store %s: %s: taking a lock failed: %s", s->path, what, strerror(e));
        if (atomic_load(&s->grow_pending) > 0)
            return embkv__err(EMBKV_BUSY,
                              "store %s: %s in a thread that holds a scan pin (embkv_scan_pin, or inside an "
                              "embkv_scan callback) would wait for an insert that waits for that pin to grow the "
                              "index: call it after embkv_scan_unpin (or after the scan returns)",
                              s->path, what);
    }
}

void move_pin(embkv_store *s)
{
    atomic_fetch_add(&s->move_pins, 1);
    /* As embkv_scan_pin: a move under way finishes first, later ones see
     * the pin. */
    while (atomic_load(&s->moves_inflight) > 0)
        sched_yield();
}

void move_unpin(embkv_store *s)
{
    atomic_fetch_sub(&s->move_pins, 1);
}

int ix_move_home_unpinned(embkv_store *s, index_desc *ix, int64_t id, uint64_t h)
{
    /* A scan walks the buckets in order: a row moved home behind it
     * would be missed, a victim pushed ahead of it seen twice.  While
     * one is pinned, no row moves (see embkv_scan_pin). */
    atomic_fetch_add(&s->moves_inflight, 1);
    bool pinned = atomic_load(&s->scan_pins) > 0 || atomic_load(&s->move_pins) > 0;
    /* Reader processes' scans pin the same way, in the reader table. */
    pinned = readers_move_begin(s) || pinned;
    int r = pinned ? -1 : ix_move_home(s, ix, id, h);
    readers_move_end(s);
    atomic_fetch_sub(&s->moves_inflight, 1);
    return r;
}

/* ------------------------------------------------------------ resize */

index_desc *ix_desc_new(embkv_store *s, PMEMoid oid, uint64_t nbuckets, uint64_t generation)
{
    index_desc *ix = calloc(1, sizeof *ix);
    if (!ix)
        return NULL;
    uintptr_t p = (uintptr_t)pmemobj_direct(oid);
    ix->buckets = (bucket *)((p + BUCKET_BYTES - 1) & ~(uintptr_t)(BUCKET_BYTES - 1));
    ix->nbuckets = nbuckets;
    ix->mask = nbuckets - 1;
    ix->generation = generation;
    ix->owner = s;
    ix->move_seq = readers_move_seq(s);
    if (!ix->move_seq)
        ix->move_seq = &ix->move_seq_here;
    return ix;
}

uint64_t ix_grow_threshold(embkv_store *s)
{
    return (uint64_t)(s->max_load * (double)atomic_load(&s->index_slots));
}

int ix_grow(embkv_store *s, uint64_t need_entries)
{
    pthread_rwlock_wrlock(&s->writers);
    index_desc *old = atomic_load(&s->ix);
    uint64_t nb = old->nbuckets;
    if (atomic_load(&s->scan_pins) > 0) {
        writers_unlock(s);
        if (scan_pins_here > 0) {
            /* This thread is itself scanning (a scan callback inserting):
             * keep inserting into the current array while it has room and
             * grow after the scan. */
            if (need_entries <= old->nbuckets * BUCKET_SLOTS * 98 / 100)
                return EMBKV_OK;
            return embkv__err(EMBKV_BUSY, "store %s: the index is full and cannot grow during this scan",
                              s->path);
        }
        /* Let running scans finish; new ones wait for the resize. */
        atomic_fetch_add(&s->grow_pending, 1);
        while (atomic_load(&s->scan_pins) > 0)
            sched_yield();
        int rc = ix_grow(s, need_entries);
        atomic_fetch_sub(&s->grow_pending, 1);
        return rc;
    }
    while ((uint64_t)(s->max_load * (double)(nb * BUCKET_SLOTS)) < need_entries) {
        nb <<= 1;
        if (nb > s->pool_size / BUCKET_BYTES) {  /* bounded whatever need_entries says */
            writers_unlock(s);
            return embkv__err(EMBKV_FULL, "store %s: an index for %llu entries does not fit the pool (pool_size "
                              "%llu bytes): create fewer rows, or copy the rows into a store with a larger pool_size "
                              "(a pool does not grow)", s->path, (unsigned long long)need_entries,
                              (unsigned long long)s->pool_size);
        }
    }
    if (nb == old->nbuckets) {
        writers_unlock(s);
        return EMBKV_OK;  /* another thread grew it meanwhile */
    }
    store_root *r = s->root;
    if (pmemobj_zalloc(s->pop, &r->index_next, heap_units_size(nb * BUCKET_BYTES + BUCKET_BYTES), TYPE_INDEX) != 0) {
        writers_unlock(s);
        return embkv__err(EMBKV_FULL, "store %s: pool full: no room to grow the index to %llu buckets; "
                          "copy the rows into a store with a larger pool_size (a pool does not grow)", s->path,
                          (unsigned long long)nb);
    }
    index_desc *nix = ix_desc_new(s, r->index_next, nb, old->generation + 1);
    if (!nix) {
        pmemobj_free(&r->index_next);
        writers_unlock(s);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
    }
    /* Writers are out; readers keep using the old array, which does not
     * change, until the switch below. */
    nix->owner = NULL;
    for (uint64_t b = 0; b < old->nbuckets; b++) {
        bucket *bk = &old->buckets[b];
        for (unsigned i = 0; i < BUCKET_SLOTS; i++)
            if (bk->used & (1u << i))
                ix_insert(nix, bk->slots[i].key, embkv__hash(bk->slots[i].key), bk->slots[i].loc, NULL);
    }
    pmemobj_persist(s->pop, nix->buckets, nb * BUCKET_BYTES);
    /* Its slots came from buckets marked in this epoch or before: a
     * recovery once the root names it must visit all of it (marked before
     * the switch, which a crash may follow at once). */
    persist_range(s, nix->buckets, nb * BUCKET_BYTES);
    for (uint64_t b = 0; b < nb; b++)
        mark_bucket(s, &nix->buckets[b]);
    int rc = EMBKV_OK;
    readers_ix_begin(s);
    TX_BEGIN(s->pop) {
        pmemobj_tx_add_range_direct(&r->nbuckets, sizeof r->nbuckets);
        pmemobj_tx_add_range_direct(&r->index, 3 * sizeof(PMEMoid));
        r->index_old = r->index;
        r->index = r->index_next;
        r->index_next = OID_NULL;
        r->nbuckets = nb;
    } TX_ONABORT {
        rc = embkv__err(EMBKV_FULL, "store %s: cannot switch to the grown index: %s", s->path,
                        pmemobj_errormsg());
    } TX_END
    readers_ix_end(s);
    if (rc != EMBKV_OK) {
        free(nix);
        pmemobj_free(&r->index_next);
        writers_unlock(s);
        return rc;
    }
    nix->owner = s;
    atomic_store(&s->ix, nix);
    atomic_store(&s->index_slots, nb * BUCKET_SLOTS);
    ebr_synchronize();
    pmemobj_free(&r->index_old);
    free(old);
    atomic_fetch_add(&s->st_resizes, 1);
    writers_unlock(s);
    return EMBKV_OK;
}

int ix_grow_for(embkv_store *s, uint64_t more)
{
    uint64_t have = atomic_load(&s->entries);
    /* (a count past 2^64 fits no index: ix_grow refuses the largest) */
    uint64_t need = more > UINT64_MAX - have ? UINT64_MAX : have + more;
    if (need <= ix_grow_threshold(s))
        return EMBKV_OK;
    return ix_grow(s, need);
}

int embkv_grow_index_for(embkv_store *s, uint64_t new_ids)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_grow_index_for: store is NULL");
    RO_REFUSE(s, "embkv_grow_index_for");
    return new_ids ? ix_grow_for(s, new_ids) : EMBKV_OK;
}
