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
 */
#include <sched.h>
#include <string.h>

#include "store_internal.h"

#define FULL_MASK ((uint16_t)((1u << BUCKET_SLOTS) - 1))

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

/* A bucket is marked for recovery before it changes (sync.c: recovery
 * visits only the buckets marked since the durable epoch, so a process
 * killed between a change and its mark would keep the change past the
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
    uint16_t used = __atomic_load_n(&bk->used, __ATOMIC_RELAXED);
    __atomic_store_n(&bk->used, (uint16_t)(used | (1u << i)), __ATOMIC_RELEASE);
    if (ix->owner)
        debug_index_point();
    touched(ix, bk);
}

static void unplace(const index_desc *ix, bucket *bk, unsigned i)
{
    will_touch(ix, bk);
    uint16_t used = __atomic_load_n(&bk->used, __ATOMIC_RELAXED);
    __atomic_store_n(&bk->used, (uint16_t)(used & ~(1u << i)), __ATOMIC_RELEASE);
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
            atomic_fetch_add(&ix->move_seq, 1);
            unsigned slot_i = (unsigned)__builtin_ctz((unsigned)(~used & FULL_MASK));
            place(ix, hb, slot_i, id, hash_fp(h), f.loc);
            ix_unlock_bucket(hb);
            bucket *ob = &ix->buckets[f.bucket];
            ix_lock_bucket(ob);
            unplace(ix, ob, f.slot);
            ix_unlock_bucket(ob);
            atomic_fetch_add(&ix->move_seq, 1);
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
