/*
 * store_internal.h - layout and shared internals of the embkv engine.
 *
 * Persistent layout (inside one libpmemobj pool, layout name "embkv"):
 *   root     - magic, format version, geometry, the durable epoch, the index
 *              object and the table of record chunks.
 *   index    - one level of 256-byte buckets (PetHash).  Each bucket has a
 *              seqlock version, an overflow counter, a bitmap of used slots,
 *              14 one-byte fingerprints and 14 (id, location) slots.
 *   chunks   - 4 MiB pmemobj allocations carved into fixed-size records by
 *              embkv's own slab allocator (free lists live in DRAM and are
 *              rebuilt from the index at open).
 *
 * A location (8 bytes) names where a row lives: PM record (chunk, slot), or
 * (bit 63) a future SSD-log position.  Bit 62 marks a tombstone entry: the
 * row is deleted but its durable version must survive until the next sync.
 */
#ifndef EMBKV_STORE_INTERNAL_H
#define EMBKV_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>
#include <time.h>
#include <libpmemobj.h>

#include "embkv.h"

#define EMBKV_LAYOUT "embkv"
#define EMBKV_MAGIC "embkv-store\0\0\0\0"  /* 16 bytes */
#define POOL_FILE "store.pool"
#define POOL_TMP "store.pool.new"  /* a pool being created; renamed when complete */
#define LOCK_FILE "LOCK"
#define LOG_DIR "log"          /* the SSD log's default directory */
#define SSD_PATH_FILE "ssd-path" /* an ssd_path outside the store: its tag and path, for embkv_destroy */
#define POOL_SEAL "store.sealed" /* the pool as a clean close left it (store.c: probe_pool) */
#define DIRTY_FILE "store.dirty" /* pages written since the durable epoch (sync.c: the dirty map) */

/* Seqlock fences.  ThreadSanitizer does not model fences; every field a
 * seqlock guards is accessed atomically, so its build can drop them. */
#ifdef EMBKV_TSAN
#define seq_fence(order) ((void)0)
#else
#define seq_fence(order) __atomic_thread_fence(order)
#endif

/* ---------------------------------------------------------------- index */

#define BUCKET_SLOTS 14
#define BUCKET_BYTES 256

/* Buckets (a power of two, at least 16) of an index for `rows` entries at
 * load factor max_load. */
static inline uint64_t index_buckets_for(uint64_t rows, double max_load)
{
    double want = (double)rows / (BUCKET_SLOTS * max_load);
    uint64_t nb = 16;
    while ((double)nb < want)
        nb <<= 1;
    return nb;
}

typedef struct slot {
    int64_t key;
    uint64_t loc;
} slot;

typedef struct bucket {
    uint32_t version;          /* seqlock: odd while a writer changes slots */
    uint16_t overflow;         /* keys homed here that live further on */
    uint16_t used;             /* bitmap of occupied slots */
    uint8_t fp[16];            /* fingerprints of slots 0..13 (14, 15 unused) */
    uint64_t reserved;
    slot slots[BUCKET_SLOTS];
} bucket;

_Static_assert(sizeof(bucket) == BUCKET_BYTES, "bucket must be 256 bytes");

/* A DRAM descriptor of one index array; replaced whole on a resize. */
typedef struct index_desc {
    bucket *buckets;           /* 256-byte aligned inside the pool object */
    uint64_t nbuckets;         /* power of two */
    uint64_t mask;
    uint64_t generation;       /* bumped on every resize (scan cursors) */
    /* Odd while a key is being moved backwards (towards its home bucket):
     * a lookup that misses during or across a move retries. */
    atomic_uint_fast64_t move_seq;
    /* Pages changed are reported to the owner for the next sync; NULL while a
     * resize builds a private array. */
    struct embkv_store *owner;
} index_desc;

/* ------------------------------------------------------------- locations */

#define LOC_NONE 0ull
#define LOC_SSD (1ull << 63)
#define LOC_TOMB (1ull << 62)
#define LOC_FLAGS (LOC_SSD | LOC_TOMB)
/* Not a stored location: a read path's mark for a row it took from the
 * DRAM cache (cache.c). */
#define LOC_CACHED (~0ull)

static inline uint64_t loc_make(uint32_t chunk, uint32_t idx)
{
    return ((uint64_t)(chunk + 1) << 32) | idx;
}
static inline uint32_t loc_chunk(uint64_t loc) { return (uint32_t)((loc & ~LOC_FLAGS) >> 32) - 1; }
static inline uint32_t loc_index(uint64_t loc) { return (uint32_t)loc; }
static inline uint64_t loc_plain(uint64_t loc) { return loc & ~LOC_TOMB; }

/* --------------------------------------------------------------- records */

typedef struct rec_hdr {
    int64_t id;
    uint64_t prev;             /* durable version this one replaced, or LOC_NONE */
    uint64_t clock;            /* updates since insert */
    uint32_t epoch;            /* write epoch (durable epoch + 1 when written) | REC_TOMB */
    uint32_t check;            /* checksum of header fields and payload */
} rec_hdr;

_Static_assert(sizeof(rec_hdr) == 32, "record header must be 32 bytes");

#define REC_TOMB 0x80000000u   /* the record marks a deletion */
static inline uint32_t rec_epoch(const rec_hdr *r) { return r->epoch & ~REC_TOMB; }

/* What embkv_get and the scans report of a row's version. */
static inline void fill_info(embkv_rowinfo *info, const rec_hdr *r, uint64_t loc)
{
    info->clock = r->clock;
    info->epoch = rec_epoch(r);
    info->tier = (loc & LOC_SSD) ? EMBKV_TIER_SSD : EMBKV_TIER_PM;
}

/* libpmemobj hands out large objects in 256 KiB heap units, with a 16-byte
 * header; small objects come from runs that reserve many units at once.
 * Sizing every object embkv allocates to whole units (less 64 bytes) keeps
 * a small pool from losing half its space to partly used runs. */
#define HEAP_UNIT (256u << 10)
static inline uint64_t heap_units_size(uint64_t bytes)
{
    return (bytes + 64 + HEAP_UNIT - 1) / HEAP_UNIT * HEAP_UNIT - 64;
}
#define MAX_CHUNKS ((HEAP_UNIT - 64) / sizeof(PMEMoid))  /* chunk table: one unit */

/* ------------------------------------------------------------------ root */

#define SSD_PATH_MAX 1024

typedef struct store_root {
    char magic[16];
    uint32_t format_version;
    uint32_t dim;
    uint32_t state_floats;
    uint32_t record_size;
    uint64_t durable_epoch;    /* last completed sync */
    uint32_t clean;            /* 1 after a clean close */
    uint32_t chunk_bytes;      /* size of each record chunk allocation */
    double max_load;
    uint64_t nbuckets;
    uint64_t created_rows_hint;
    PMEMoid index;             /* current bucket array */
    PMEMoid index_next;        /* being built by a resize */
    PMEMoid index_old;         /* replaced, not yet freed */
    PMEMoid chunk_table;       /* PMEMoid[MAX_CHUNKS] of record chunks */
    /* Rows at the last clean close, and that count ^ ROWS_CHECK_KEY (zero
     * in a root from before these fields: no count known).  A clean open
     * whose index holds another number of rows has lost some to damage. */
    uint64_t closed_rows;
    uint64_t closed_rows_check;
    /* The SSD tier (tier.c); zero in a root from before it: none. */
    uint64_t ssd_size;
    uint64_t log_tag;          /* in every segment header: this store's log */
    /* log_end at the start of sync e, in slot e & 1 with e beside it: the
     * log records a crash must inspect are those at or after the one of
     * the durable epoch. */
    uint64_t log_tail[2], log_tail_epoch[2];
    char ssd_path[SSD_PATH_MAX]; /* absolute; "" for <store>/log */
    /* Rows as of the durable epoch, and durable_rows_check(that count, the
     * epoch) (zero in a root from before these fields).  Recovery returns
     * to that epoch: an index then holding another number of rows has lost
     * some to damage.  The check binds the count to its epoch, so a crash
     * between the epoch's store and theirs leaves no count, not a wrong one. */
    uint64_t durable_rows;
    uint64_t durable_rows_check;
    /* Per bucket bitmap of the dirty map (slot e & 1): how many bits
     * mark_bucket set in it and a sum of a hash of their numbers (sync.c;
     * zero in a root from before these fields).  In the pool, not beside
     * the bitmaps: a store.dirty zeroed, or replaced by an older copy of
     * itself, agrees with a tally of its own, but not with this one. */
    atomic_uint_fast64_t dirty_count[2], dirty_sum[2];
} store_root;
#define ROWS_CHECK_KEY 0x6b76656d62726f77ull
/* A row's clock stops at 2^63 - 1, the largest a SQL integer (and an
 * export) holds: past it SQL showed it negative and the table's own export
 * was refused.  (An update a nanosecond would take three centuries; only
 * a clock put there, by an import, gets near.) */
#define CLOCK_MAX ((uint64_t)INT64_MAX)
static inline uint64_t clock_next(uint64_t c) { return c < CLOCK_MAX ? c + 1 : CLOCK_MAX; }
static inline uint64_t durable_rows_check(uint64_t rows, uint64_t epoch)
{
    return rows ^ ROWS_CHECK_KEY ^ (epoch * 0x9e3779b97f4a7c15ull) ^ 1;
}

/* -------------------------------------------------------- the store handle */

#define KEYLOCK_STRIPES 4096
#define HEAT_FOR_TIER 1u
#define HEAT_ASKED 2u
#define HEAT_FOR_CACHE 4u

typedef struct locvec {
    uint64_t *v;
    size_t n, cap;
} locvec;

typedef struct limbo_entry {
    uint64_t loc;
    uint64_t ebr_epoch;
} limbo_entry;

typedef struct tomb_entry {
    int64_t id;
    uint64_t loc;              /* the tombstone location (LOC_TOMB set) */
} tomb_entry;

struct embkv_store {
    /* process registry */
    struct embkv_store *next;
    dev_t dev;
    ino_t ino;
    int refs;
    char *path;
    int lockfd;
    pid_t pid;                 /* the opening process (see embkv_close) */

    /* pool */
    PMEMobjpool *pop;
    store_root *root;
    char *pool_base;
    size_t pool_size;
    int is_pmem;
    bool pool_advice_random;   /* the mapping is advised MADV_RANDOM (store.c) */
    int recovered;
    int creating;              /* pool still under its temporary name */

    /* geometry */
    uint32_t dim;
    uint32_t state_floats;
    uint32_t rec_size;         /* bytes per record, multiple of 16 */
    uint32_t recs_per_chunk;
    uint32_t chunk_bytes;
    uint32_t delete_reserve;   /* free records only tombstones may take */
    double max_load;

    /* index */
    _Atomic(index_desc *) ix;
    pthread_rwlock_t writers;  /* shared by writers, exclusive for resize/sync epoch bump */
    atomic_uint keylocks[KEYLOCK_STRIPES];
    atomic_uint_fast64_t rows;     /* live rows */
    atomic_uint_fast64_t entries;  /* used slots including tombstones */
    atomic_uint_fast64_t index_slots; /* buckets * slots of the current index */
    atomic_uint scan_pins;     /* scans running: the index must not resize, rows not move */
    atomic_uint moves_inflight; /* embkv_hotset moves under way (a pin waits them out) */
    atomic_uint move_pins;     /* no row moves between buckets (a backup's cursor), resizes may go on */
    atomic_int grow_pending;   /* a resize waits for the pins: no new ones */

    /* slab */
    pthread_mutex_t slab_mu;
    locvec free_locs;
    PMEMoid *chunks;           /* the pool's chunk table */
    char *_Atomic chunk_base[MAX_CHUNKS];
    uint32_t nchunks;
    uint32_t chunk_limit;      /* with an SSD tier: chunks past this stay unallocated for the index (0: none) */
    bool pool_exhausted;       /* a chunk was refused: the record space is all there is */

    /* epochs and reclamation */
    atomic_uint_fast64_t cur_epoch;    /* epoch stamped on writes */
    pthread_mutex_t retire_mu;
    locvec pending[2];         /* durable versions replaced in epoch e: free after sync e */
    tomb_entry *tombs[2];
    size_t ntombs[2], tombs_cap[2];
    limbo_entry *limbo;        /* waiting for readers to leave */
    size_t nlimbo, limbo_cap;

    /* dirty pages since the last sync, one bitmap per epoch parity */
    atomic_uint_fast64_t *dirty[2];
    size_t dirty_words;
    atomic_uint_fast64_t *bdirty[2]; /* index buckets written in each epoch (mark_bucket) */
    size_t bdirty_words;
    void *dirty_map;           /* the mapping of DIRTY_FILE holding dirty[] and bdirty[], or NULL (DRAM) */
    size_t dirty_map_len;
    bool sync_failed;          /* the last sync failed: the next flushes both bitmaps */
    pthread_mutex_t sync_mu;
    pthread_mutex_t move_mu;   /* one backward move at a time (move_seq) */

    /* write groups, snapshots and the version log (snapshot.c) */
    struct snapstate *snap;
    atomic_uint_fast64_t snap_floor; /* ebr epoch of the oldest open snapshot */

    /* the DRAM cache (cache.c); NULL without one */
    struct cache *_Atomic cache; /* set once (store.c: cache_attach), read once per call */
    uint64_t cache_size;       /* as the open that made it asked */
    atomic_bool cache_cleaning; /* one cache_clean at a time */

    /* training (train.c): options, permits; NULL until configured */
    struct train_state *_Atomic train;

    /* the SSD tier (tier.c); log NULL without one */
    struct embkv_log *log;
    /* Access statistics (heat.h), sized for the rows the pool holds: what
     * demotion ranks.  Every store has the sketch (zero pages until
     * touched); reads and writes count in it while heat_live is not zero:
     * HEAT_FOR_TIER once the SSD tier may be needed (half the record
     * space's room in chunks, or rows in the log: set by the tier thread),
     * HEAT_ASKED once the application asked for them (embkv_heat_enable).
     * A pool that holds every row pays nothing for them. */
    struct heat *heat;
    atomic_uint heat_live;
    pthread_mutex_t demote_mu; /* one log appender (demotion, compaction); the cursor */
    uint64_t demote_cursor;
    _Atomic unsigned evicted_heat; /* hottest row of the last demotion (admission's bar) */
    atomic_uint_fast64_t rows_ssd;
    atomic_uint_fast64_t st_demotions, st_promotions, st_compactions, st_compact_rows;
    atomic_uint_fast64_t st_ssd_wait_ns; /* reads waiting for the log */
    /* rows read from the log that admission let back in, waiting for the
     * thread (tier.c: tier_note_read) */
    pthread_mutex_t promo_mu;
    int64_t *promo_ids;
    uint64_t *promo_locs;
    char *promo_recs;
    size_t promo_n, promo_cap;
    /* compaction in progress (compact.c): under compact_mu, taken by the
     * worker thread and by demoters paying for their appends */
    pthread_mutex_t compact_mu;
    uint32_t compact_seg;
    uint64_t compact_pos;
#define COMPACT_DONE_MAX 256
    uint32_t compact_done[COMPACT_DONE_MAX]; /* compacted since the sync count was compact_done_syncs */
    size_t ncompact_done;
    uint64_t compact_done_syncs;
    /* the tier's thread (tier_worker.c) */
    pthread_t tw_thread;
    bool tw_started, tw_stop, tw_kick, tw_last_idle;
    atomic_bool tw_paused;     /* tests: the thread does nothing (embkv_debug_tier_pause) */
    uint64_t tw_rounds;
    pthread_mutex_t tw_mu;
    pthread_cond_t tw_cond, tw_done;
    /* the hot-set migration thread (migrate.c): rows per second it may
     * move (0: not running), its rounds, rows moved, failed moves */
    pthread_t mg_thread;
    bool mg_started, mg_stop;
    pthread_mutex_t mg_mu;
    pthread_cond_t mg_cond;
    _Atomic uint64_t mg_rate;
    atomic_uint_fast64_t st_mg_rounds, st_mg_moved, st_mg_errors;
    /* look-ahead (lookahead.c): NULL until the first embkv_lookahead */
    struct lookahead *_Atomic la;
    pthread_mutex_t la_mu;

    /* statistics */
    atomic_uint_fast64_t st_gets, st_puts, st_deletes, st_batch_gets, st_hot_moves, st_hot_to_pm, st_hot_to_dram;
    atomic_uint_fast64_t st_resizes, st_syncs;
    double last_sync_ms;
};

/* ------------------------------------------------------------ errmsg.c */
int embkv__err(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ------------------------------------------------------------- epoch.c */
/* Epoch-based reclamation shared by all stores of the process. */
void ebr_enter(void);
void ebr_leave(void);
uint64_t ebr_now(void);
/* Advances the global epoch and returns the oldest epoch a reader may still
 * be in: objects retired at an epoch strictly below it are unreachable. */
uint64_t ebr_safe_epoch(void);
/* Waits until every reader active now has left. */
void ebr_synchronize(void);

/* ------------------------------------------------------------- hash */
static inline uint64_t embkv__hash(int64_t id)
{
    uint64_t x = (uint64_t)id;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}
static inline uint8_t hash_fp(uint64_t h) { return (uint8_t)(h >> 56); }
static inline uint64_t hash_step(uint64_t h) { return ((h >> 48) & 3) * 2 + 1; }

/* ------------------------------------------------------------- pethash.c */
typedef struct found_slot {
    uint64_t bucket;
    unsigned slot;
    uint64_t loc;              /* as stored (may carry LOC_TOMB) */
} found_slot;

void ix_lock_bucket(bucket *b);
void ix_unlock_bucket(bucket *b);
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
#include <sched.h>
static inline void ix_relax(unsigned *spins)
{
    if (++*spins > 64) {
        sched_yield();
        *spins = 0;
    } else {
        __builtin_ia32_pause();
    }
}

/* One consistent read of a bucket: the slot holding id (or -1) and the
 * overflow counter. */
static inline int ix_read_bucket(const bucket *bk, int64_t id, uint8_t fp, uint64_t *loc,
                              uint16_t *ovf)
{
    unsigned spins = 0;
    for (;;) {
        uint32_t v1 = __atomic_load_n(&bk->version, __ATOMIC_ACQUIRE);
        if (v1 & 1) {
            ix_relax(&spins);
            continue;
        }
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
        seq_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&bk->version, __ATOMIC_RELAXED) == v1)
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
        uint64_t seq = atomic_load(&ix->move_seq);
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
        uint64_t seq2 = atomic_load(&ix->move_seq);
        if (seq == seq2 && !(seq & 1)) {
            if (probes)
                *probes = n;
            return false;
        }
        ix_relax(&spins);
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

/* ------------------------------------------------------------- slab.c */
int slab_alloc(embkv_store *s, uint64_t *locs, size_t n);
/* For tombstones: may take the delete reserve that slab_alloc leaves free. */
int slab_alloc_tombstone(embkv_store *s, uint64_t *loc);
void slab_free(embkv_store *s, const uint64_t *locs, size_t n);
/* embkv_room_for of the pool alone (store_ops.c adds demotion). */
int slab_room_for(embkv_store *s, uint64_t puts, uint64_t deletes);
size_t slab_free_count(embkv_store *s);
/* Free records, records in the chunks so far, and whether the pool refused
 * a chunk (then the total is all the pool will hold). */
void slab_space(embkv_store *s, size_t *free_recs, size_t *total, bool *exhausted);
int slab_rebuild(embkv_store *s);
/* Where each record chunk's records begin (what rec_at needs): the part of
 * slab_rebuild that recovery, which reads records, needs before it. */
void slab_map_chunks(embkv_store *s);
static inline rec_hdr *rec_at(embkv_store *s, uint64_t loc)
{
    char *base = atomic_load_explicit(&s->chunk_base[loc_chunk(loc)], memory_order_acquire);
    return (rec_hdr *)(base + (size_t)loc_index(loc) * s->rec_size);
}
static inline float *rec_vec(rec_hdr *r) { return (float *)(r + 1); }
uint32_t rec_checksum(const embkv_store *s, const rec_hdr *r);
/* Where a record enters from the medium (every read that copies one out):
 * it must be id's and match its checksum, else the read fails naming the
 * id (rec_damaged, in sync.c) instead of returning damaged data. */
static inline bool rec_ok(const embkv_store *s, const rec_hdr *r, int64_t id)
{
    return r->id == id && r->check == rec_checksum(s, r);
}

/* ------------------------------------------------------------- sync.c */
void persist_range(embkv_store *s, const void *addr, size_t len);
int rec_damaged(const embkv_store *s, int64_t id);
void persist_barrier(embkv_store *s);
/* Retire a location: freed once no reader can see it. */
void retire_now(embkv_store *s, const uint64_t *locs, size_t n);
void reclaim(embkv_store *s, bool wait_for_readers);
int locvec_push(locvec *v, uint64_t x);

/* keylocks (store_ops.c) */
void keylock_acquire(embkv_store *s, uint64_t h);
void keylock_release(embkv_store *s, uint64_t h);
bool keylock_try(embkv_store *s, uint64_t h);
static inline unsigned keylock_stripe(uint64_t h) { return (unsigned)(h >> 20) & (KEYLOCK_STRIPES - 1); }

int store_grow_index(embkv_store *s, uint64_t need_entries);

/* ------------------------------------------------------------- permits.c */
typedef struct permit_table permit_table;
permit_table *permits_new(void);
void permits_free(permit_table *pt);
/* One permit on id while fewer than bound are out, waiting until deadline
 * (CLOCK_MONOTONIC): EMBKV_OK, EMBKV_BUSY (timed out) or EMBKV_NOMEM. */
int permit_take(permit_table *pt, int64_t id, unsigned bound, const struct timespec *deadline, bool *waited);
void permit_return(permit_table *pt, int64_t id);
unsigned permit_count(permit_table *pt, int64_t id);

/* sync.c: the dirty map.  dirty[] lives in DIRTY_FILE (a shared mapping,
 * so it survives a killed process); dirtymap_open sets *usable when the
 * file's bitmaps describe this pool since its durable epoch (recovery may
 * then visit only the buckets on marked pages), and falls back to DRAM
 * bitmaps (usable false) when the file cannot be used. */
int dirtymap_open(embkv_store *s, bool *usable);
void dirtymap_close(embkv_store *s);
/* Index bucket bk (in the pool) changed in the current epoch: beside
 * persist_range, wherever a slot, its used bit or an overflow counter
 * changes. */
void mark_bucket(embkv_store *s, const void *bk);
/* The crash point of embkv_debug_kill_after_index_writes (debug.c): called
 * right after an index slot changes, it costs one load while unarmed. */
extern _Atomic uint64_t embkv__kill_countdown;
void debug_index_written(void);
static inline void debug_index_point(void)
{
    if (__builtin_expect(atomic_load_explicit(&embkv__kill_countdown, memory_order_relaxed) != 0, 0))
        debug_index_written();
}
/* Points the slot f found at loc; under the row's key lock, with
 * s->writers held shared. */
static inline void set_loc(embkv_store *s, index_desc *ix, const found_slot *f, uint64_t loc)
{
    slot *sl = &ix->buckets[f->bucket].slots[f->slot];
    /* Marked before the change: recovery visits only marked buckets. */
    mark_bucket(s, &ix->buckets[f->bucket]);
    __atomic_store_n(&sl->loc, loc, __ATOMIC_RELEASE);
    debug_index_point();
    persist_range(s, &sl->loc, sizeof sl->loc);
}

/* embkv_debug_fail_syncs (debug.c): whether this sync is to fail (one
 * relaxed load while unarmed). */
extern _Atomic uint64_t embkv__fail_syncs;
bool debug_sync_fails(void);
static inline bool debug_sync_point(void)
{
    return __builtin_expect(atomic_load_explicit(&embkv__fail_syncs, memory_order_relaxed) != 0, 0) &&
           debug_sync_fails();
}
/* Whether bucket bk was changed since the durable epoch. */
bool dirtymap_marked(const embkv_store *s, const void *bk);
/* After recovery: the pool is as of its durable epoch, nothing marked. */
void dirtymap_reset(embkv_store *s);

/* ------------------------------------------------------------- snapshot.c */
int snap_init(embkv_store *s);
void snap_free(embkv_store *s);
/* Whether this thread is inside a write group on s. */
bool group_held(embkv_store *s);
/* Wait for the groups in flight and hold new ones off (sync's epoch switch). */
void groups_quiesce(embkv_store *s);
void groups_resume(embkv_store *s);
/* A snapshot in two steps, for a caller that must fix it at a moment of
 * its own choosing (backup.c: at a sync's epoch switch): snap_register
 * lists it (the groups begun from then on log their changes), snap_fix,
 * called with the groups quiesced, fixes what it sees. */
int snap_register(embkv_store *s, embkv_snapshot **out);
void snap_fix(embkv_snapshot *snap);
/* embkv_sync that also fixes snap (registered, not fixed) at its epoch
 * switch: snap then sees exactly what the sync made durable, the epoch
 * *durable (may be NULL). */
int sync_fixing(embkv_store *s, embkv_snapshot *snap, uint64_t *durable);
/* Before changing id's index entry from prev, inside a group. */
int snap_log(embkv_store *s, int64_t id, uint64_t h, uint64_t prev);
/* locs[i] of ids[i] as of the snapshot, after the index lookups. */
/* logged (may be NULL): 1 where the version log decided locs[i]. */
void snap_resolve(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, uint64_t *locs,
                  uint8_t *logged);
/* Whether the calling thread's group on s logs (a snapshot was open when
 * it began). */
bool group_logging(embkv_store *s);
/* Pins held by the calling thread (on any store). */
extern _Thread_local unsigned scan_pins_here;
/* hotset.c: while a move pin is held no row moves between buckets (a
 * cursor that restarts after a resize instead of holding it off). */
void move_pin(embkv_store *s);
void move_unpin(embkv_store *s);
void train_free(embkv_store *s);
/* train.c: the distinct ids of a batch in first-seen order, uniq[0..*nu),
 * and for each position i, slot_of[i] = its index in uniq (slot_of may be
 * NULL).  EMBKV_NOMEM when the scratch table cannot be had. */
int ids_distinct(const int64_t *ids, size_t n, int64_t *uniq, size_t *slot_of, size_t *nu);
uint64_t store_grow_threshold(embkv_store *s);

/* store_ops.c: embkv_get_batch putting row j of the batch at row
 * out_row[j] of out (out_row NULL: at row j). */
int get_batch_rows(embkv_store *s, const int64_t *ids, size_t n, float *out, const size_t *out_row, uint8_t *found,
                   size_t *nmissing);
/* store_ops.c: a read of a row whose access the caller has already counted (a pull
 * reading back the rows it created): as embkv_get, but not counted again in
 * the cache's hits and misses or in the access statistics. */
int get_uncounted(embkv_store *s, int64_t id, float *vec);
/* store_ops.c: embkv_update_batch for the engine's own update functions
 * (train.c's optimizers), which may be handed a cached row's slot itself
 * instead of a private copy, its readers held off while fn runs: fn must
 * be quick, must not call into the store, and if it returns nonzero its
 * changes are undone.  in_slot and in_dirty (both or neither may be NULL): per
 * row, its cache slot (-1: none) and whether it was dirty, as
 * exists_batch_hints found them earlier in the same write group (each
 * slot is checked before use; a row counted dirty that needs a record when
 * reached, having been deleted and written again since, gets one then). */
int update_batch_in_place(embkv_store *s, const int64_t *ids, size_t n, const int64_t *in_slot, const uint8_t *in_dirty,
                          embkv_update_fn fn, void *ctx, size_t *nupdated);
/* store_ops.c: embkv_exists_batch noting too, when in_slot and in_dirty are not
 * NULL (a store with a cache only), each row's cache slot (-1: not cached)
 * and whether it is dirty. */
size_t exists_batch_hints(embkv_store *s, const int64_t *ids, size_t n, uint8_t *found, int64_t *in_slot,
                          uint8_t *in_dirty);

/* ------------------------------------------------------------- cache.c */
typedef struct cache cache;
/* A cache of `rows` records of rec_size bytes (a multiple of 8: the
 * header, vector and state of a pool record, without its padding); NULL
 * with errno ENOMEM.  What a slot holds, copied in and out. */
cache *cache_new(uint64_t rows, uint32_t rec_size);
uint32_t cache_rec_bytes(const cache *c);
void cache_free(cache *c);
uint64_t cache_capacity(const cache *c);
/* Lock-free, from any thread: */
void cache_prefetch(const cache *c, uint64_t h);
/* The same for a write-back, which then needs the slot's reserved record:
 * returned, read unlocked, as a hint for its fetch (LOC_NONE when the row
 * is not found).  It waits for the slot's line: the batch paths, which
 * need nothing from it yet, use cache_find and cache_prefetch_slot. */
uint64_t cache_prefetch_wb(cache *c, int64_t id, uint64_t h);
bool cache_contains(cache *c, int64_t id, uint64_t h);
/* One probe for a batch path: id's slot (-1: not cached) and (dirty, may
 * be NULL) whether it is dirty, a hint for cache_read_at and
 * cache_load_locked a few ids on; the slot's lines fetched meanwhile for
 * reading or writing (rw). */
int64_t cache_find(cache *c, int64_t id, uint64_t h, bool *dirty);
/* cache_find for a pull, with the sketch stamp filed for id (0: none);
 * cache_heat_mark files one: a pull of a cached row whose counters were
 * seen saturated under the current stamp need not touch the sketch. */
int64_t cache_find_heat(cache *c, int64_t id, uint64_t h, uint32_t *stamp);
void cache_heat_mark(cache *c, int64_t id, uint64_t h, uint32_t stamp);
uint64_t cache_heat_stamped(cache *c);  /* rows with a stamp filed (tests) */
void cache_prefetch_slot(cache *c, int64_t si, int rw);
/* Copies id's cached header, vector and state (each may be NULL); false
 * when id is not cached. */
bool cache_read(cache *c, int64_t id, uint64_t h, rec_hdr *hdr, float *vec, uint32_t dim, float *state,
                uint32_t state_floats);
/* cache_read, starting from the slot cache_find gave in the same
 * call (si may be -1). */
bool cache_read_at(cache *c, int64_t si, int64_t id, uint64_t h, rec_hdr *hdr, float *vec, uint32_t dim,
                   float *state, uint32_t state_floats);
void cache_count(cache *c, uint64_t hits, uint64_t misses);
/* Bytes a cache of rows rows takes (tiers.dram.bytes when full). */
uint64_t cache_bytes_for(uint64_t rows, uint32_t rec_size);
/* Around a pull's reads (this thread): rows it reads or admits are not
 * evicted for the next PULL_WINDOW pulls of the store (cache.c).  end
 * counts the pull; both take NULL (no cache). */
void cache_pull_begin(cache *c);
void cache_pull_end(cache *c);
/* With id's key lock held.  The slot of id (-1: not cached), the whole
 * record copied to rec (rec_size bytes; may be NULL), hint a slot that
 * cache_find gave (or -1); then, by slot:
 * whether it is dirty, its new content, and the turns between clean and
 * dirty.  A row turns dirty with a pool record reserved for its
 * write-back (wb), so that a checkpoint never needs room the pool may not
 * have; turning clean hands wb back (filled by the write-back, or to be
 * freed).  Removing a row hands back its wb (LOC_NONE when clean). */
int64_t cache_load_locked(cache *c, int64_t id, uint64_t h, int64_t hint, void *rec);
bool cache_slot_dirty(cache *c, int64_t slot);
uint64_t cache_slot_wb(cache *c, int64_t slot);
void cache_store_locked(cache *c, int64_t slot, const void *rec);
/* A change in place: the slot's record, its lock-free readers held off
 * (they retry) until cache_update_end.  Plain stores into it race with
 * those readers' copies, which the sequence check then discards: not for
 * the ThreadSanitizer build, which sees every slot word as an atomic. */
void *cache_update_begin(cache *c, int64_t slot);
void cache_update_end(cache *c, int64_t slot);
void cache_mark_dirty_locked(cache *c, int64_t slot, uint64_t wb);
uint64_t cache_mark_clean_locked(cache *c, int64_t slot);
uint64_t cache_remove_locked(cache *c, int64_t id, uint64_t h);
/* A clean row not cached yet (false: refused, or cached already); force
 * evicts any strictly colder clean row, not only the first under the hand
 * (cache.c). */
bool cache_admit_locked(embkv_store *s, cache *c, int64_t id, uint64_t h, const void *rec, bool force);
/* The cheap first test of admission (no lock): a free slot in the row's
 * shard, or hotter than the last victim weighed. */
bool cache_worth_admitting(embkv_store *s, cache *c, uint64_t h);
uint64_t cache_ndirty(const cache *c);
/* Ids of the rows dirty now (check each under its lock; malloc'd). */
int cache_dirty_ids(cache *c, int64_t **ids, size_t *n);
/* About `want` dirty rows for the cleaner: in each shard its share, the
 * first the shard's CLOCK hand reaches (unreferenced ones first).  A hint,
 * as above; malloc'd. */
int cache_clean_ahead(cache *c, size_t want, int64_t **ids, size_t *n);
void cache_stats(const cache *c, embkv_stats *st);

/* store_ops.c: the cache's write-backs.  Quiesces the groups (groups_quiesce) with every dirty row written back;
 * on failure the groups are resumed. */
int cache_flush_quiesce(embkv_store *s);
/* Outside any group of the thread: once more than 15/16 of the cache is
 * dirty, quiesces the groups and writes back the rows the CLOCK hands
 * reach next (down to 7/8). */
int cache_clean(embkv_store *s);
/* Brings ids into the cache (embkv_hotset_move); *admitted counts them. */
int cache_hotset(embkv_store *s, const int64_t *ids, size_t n, size_t *admitted);

/* ------------------------------------------------------------- tier.c */
/* Opens (or creates) the store's SSD log as its root and the options say;
 * before slab_rebuild, which checks the index's log locations. */
int tier_open(embkv_store *s, const embkv_options *opt);
/* The same checks of the tier options for a store already open in this
 * process, which keeps its tier as it is: a larger ssd_size, or a tier
 * where there is none, is refused. */
int tier_check_open(embkv_store *s, const embkv_options *opt);
void tier_close(embkv_store *s);
/* Reads the records of the log locations among locs[0..n) (the others are
 * left alone) in one batch, checking each is its id's and whole (callers
 * need not check again); recs[i] points at each, inside *buf, which the
 * caller frees (NULL when none of locs is in the log: nothing allocated).
 * Inside ebr_enter.  Rows look-ahead staged are taken from the stage;
 * for_write (the row is about to be replaced) also drops them there. */
int tier_read(embkv_store *s, const int64_t *ids, const uint64_t *locs, size_t n, char **buf, rec_hdr **recs,
              bool for_write);
/* One record wherever it lives: PM in place, SSD read into *buf (as above). */
int tier_rec(embkv_store *s, int64_t id, uint64_t loc, char **buf, rec_hdr **out, bool for_write);
/* Makes room for `want` records in the pool by moving cold rows to the
 * log; the caller holds no epoch, no lock and no group of this store's. */
int tier_demote(embkv_store *s, size_t want, size_t *moved);
/* The part of a sync that concerns the log: before the epoch switch
 * (tail), before the pool's pages are flushed (sync), after the durable
 * epoch is recorded (cleanup). */
uint64_t tier_sync_tail(embkv_store *s);
int tier_sync_log(embkv_store *s, uint64_t epoch, uint64_t tail);
void tier_sync_done(embkv_store *s);
/* Recovery: the records of log locations held by the index since the tail
 * of the durable epoch, read to learn their epochs and prev links. */
bool tier_after_tail(embkv_store *s, uint64_t loc);
void tier_count_row(embkv_store *s, uint64_t loc);
uint64_t tier_now_ns(void);
/* Points id's entry at q if it still names p (with s->writers shared). */
bool tier_switch(embkv_store *s, int64_t id, uint64_t p, uint64_t q);
/* Promotion: reads of log rows offer them (the admission policy picks);
 * the thread moves up to `room` of the queued ones into the pool. */
void tier_note_read(embkv_store *s, const int64_t *ids, const uint64_t *locs, rec_hdr *const *recs, size_t n);
/* room: records promotion may take; make_room: demote colder rows for the
 * rest of the admitted ones. */
int tier_promote_queued(embkv_store *s, size_t room, bool make_room, size_t *moved);
/* Promotes the rows of ids that are in the log now (embkv_hotset_move),
 * without asking admission, making room by demoting colder rows; a row
 * whose record is damaged stays in the log.  Without a tier: nothing. */
int tier_promote_ids(embkv_store *s, const int64_t *ids, size_t n, size_t *moved);
size_t tier_promote_pending(embkv_store *s);

/* ------------------------------------------------------------- compact.c */
/* One part of a compaction (about max_bytes of a segment read); *scanned
 * says how much was read, 0 when there was nothing to compact. */
int compact_step(embkv_store *s, uint64_t max_bytes, uint64_t *scanned);
/* Whether the log's files are past COMPACT_FULL of ssd_size: compaction
 * then runs at a higher rate (writes would fail at ssd_size). */
bool compact_urgent(embkv_store *s);
/* What a demotion of nrecs records pays before it appends, when the log is
 * urgent: up to COMPACT_PAY times their bytes of segment compacted, so that
 * appends cannot outrun compaction whatever the thread gets of the CPU. */
void compact_pay(embkv_store *s, size_t nrecs);

/* ------------------------------------------------------------- tier_worker.c */
/* embkv_hotset_move's work; raise tells the sketch the rows are as hot as
 * can be first (an application's move: it says they are), which a
 * background migration, moving what the sketch ranked, does not. */
int hotset_move(embkv_store *s, const int64_t *ids, size_t n, embkv_moves *moves, bool raise);
int tier_worker_start(embkv_store *s);
void tier_worker_stop(embkv_store *s);
/* The hot-set migration thread (migrate.c); stop before the tier's. */
int migrate_start(embkv_store *s, uint64_t rate);
void migrate_stop(embkv_store *s);

/* ------------------------------------------------------------- lookahead.c */
/* Copies into out + j * rec_size the rows among ids/locs[0..k) that
 * look-ahead staged at those locations (waiting for those in flight), sets
 * got[j] for them and returns how many. */
size_t la_take(embkv_store *s, const int64_t *ids, const uint64_t *locs, size_t k, char *out, uint8_t *got,
               bool consume);
/* Rows a pull just read from the log, kept in the stage for the push that
 * follows (only while the stage exists: once look-ahead was used). */
void la_offer(embkv_store *s, const int64_t *ids, const uint64_t *locs, rec_hdr *const *recs, size_t n);
void la_stats(embkv_store *s, embkv_stats *st);
void la_close(embkv_store *s);

#endif
