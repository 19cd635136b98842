/*
 * format.h - layer 0: the on-media layout of a store.
 *
 * A store is a directory: the pool (POOL_FILE, one libpmemobj pool with
 * layout name "embkv"), its lock (LOCK_FILE), the dirty map (DIRTY_FILE),
 * the seal a clean close leaves (POOL_SEAL) and, with an SSD tier, the
 * log's segment files (log.h) in LOG_DIR or at the ssd_path the root
 * names.  Inside the pool:
 *   root     - magic, format version, geometry, the durable epoch, the index
 *              object and the table of record chunks.
 *   index    - one level of 256-byte buckets (PetHash).  Each bucket has a
 *              seqlock version, an overflow counter, a bitmap of used slots,
 *              14 one-byte fingerprints and 14 (id, location) slots.
 *   chunks   - pmemobj allocations (about a thousandth of the pool, 256 KiB
 *              to 64 MiB) carved into fixed-size records by
 *              embkv's own slab allocator (free lists live in DRAM and are
 *              rebuilt from the index at open).
 *
 * A location (8 bytes) names where a row lives: PM record (chunk, slot), or
 * (bit 63) a position in the SSD log.  Bit 62 marks a tombstone entry: the
 * row is deleted but its durable version must survive until the next sync.
 *
 * The invariants the engine relies on are numbered here and cited by
 * number (P1...) where code relies on them.
 *
 * P1  A record is whole and flushed (persist_range) before any index entry
 *     names it: a write, a demotion to the log, a promotion and a
 *     compaction each fill and flush the new record first, then switch the
 *     entry with one 8-byte store.
 * P2  A row's durable version replaced in epoch E stays, linked as `prev`
 *     of the new record, until sync E completes; only then is it freed.
 * P3  No log block holding records of an earlier log sync is written
 *     again.
 * P4  A bucket is marked in the dirty map (mark_bucket) before it changes;
 *     a bucket bitmap that does not match its tally in the root gets the
 *     full recovery.
 * P5  Recovery returns every row to its version at the durable epoch,
 *     following `prev` from any record newer than it.
 * P6  A retired record is reused only after every reader that may hold it
 *     has left (epochs) and, if an open snapshot may read its version (it
 *     was the row's version when the snapshot opened), no older snapshot
 *     is open.
 * P7  Every change to rows is inside a write group, and no sync's epoch
 *     switch falls inside one: a sync (and a snapshot) sees each group
 *     entirely or not at all.
 * P8  A checkpoint mark of epoch e (the root's marks) holds a wall-clock
 *     time and a push count no earlier than those of any write stamped
 *     with epoch e or before: it is taken with the groups stopped at e's
 *     switch, and times never go backwards from mark to mark.  So a row
 *     whose record epoch is at most e was last written no later than
 *     mark e says (evict.c: expiry).
 * P9  A device gather (gather.c) is a reader of P6 until the GPU has read
 *     its rows: its lease keeps the epoch the gather entered in, from
 *     before its first index lookup until its completion event is seen,
 *     so no record the launch reads is reused while the GPU may read it.
 * P10 An index slot's key, location and fingerprint are durable before the
 *     used bit that makes them an entry (pethash.c: place): a power cut
 *     in an insert leaves the slot unused, never an entry whose key is a
 *     former occupant's and whose fingerprint is the new one's.
 * P11 Every change to the index is made holding s->writers.  The
 *     section's end (writers_unlock) clears s->knn_clean after a full
 *     fence unless the section told the kNN change log of every change it
 *     made (knnlog.c: after the changes and a full fence, under knn_mu,
 *     for the id knn_clean holds then).  A retirement of records clears
 *     it too before the records get their epoch (slab_retire), unless
 *     their leaving the index was told, or cleared for, before (a
 *     demotion, which frees its records itself after ebr_synchronize,
 *     clears it with its section's end, before that wait).  A section
 *     that changes no index entry may end with a plain unlock, and says
 *     so.  A kNN map of the live records, made by a pass that entered its
 *     epoch and then set knn_clean to its id before reading the index,
 *     and brought up to date with the changes the log holds for that id
 *     (knn.c: map_take, holding s->writers exclusively, so that the log
 *     holds every change made), describes the pool while knn_clean still
 *     holds that id; its records stay in place for a search that saw the
 *     id after entering its epoch.
 */
#ifndef EMBKV_FORMAT_H
#define EMBKV_FORMAT_H

#include <libpmemobj.h>

#include "base.h"

#define EMBKV_LAYOUT "embkv"
#define EMBKV_MAGIC "embkv-store\0\0\0\0"  /* 16 bytes */
#define POOL_FILE "store.pool"
#define POOL_TMP "store.pool.new"  /* a pool being created; renamed when complete */
#define LOCK_FILE "LOCK"
#define LOG_DIR "log"          /* the SSD log's default directory */
#define SSD_PATH_FILE "ssd-path" /* an ssd_path outside the store: its tag and path, for embkv_destroy */
#define POOL_SEAL "store.sealed" /* the pool as a clean close left it (store.c: probe_pool) */
#define DIRTY_FILE "store.dirty" /* pages written since the durable epoch (sync.c: the dirty map) */
#define READERS_FILE "READERS" /* reader processes' slots beside the writer (readers.c) */
/* How long a reader process may hold back the writer's reclamation before
 * its read is revoked, and how long a writer that must wait for it (to
 * reuse records now: a demotion, a resize, a compaction) waits (readers.c:
 * R2). */
#define READER_HOLD_MS 10000
#define READER_WAIT_MS 100

/* The types of the pool's objects (libpmemobj type numbers). */
#define TYPE_INDEX 1
#define TYPE_CHUNK 2           /* record chunks (slab.c) */
#define TYPE_CHUNK_TABLE 3

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

/* Bytes of a record of dim elements of dtype and state_floats of optimizer
 * state: the header, the vector and the floats, rounded up to a cache line (slab.c: chunk_records
 * aligns the chunks' records to one). */
static inline uint32_t record_size(int dtype, uint32_t dim, uint32_t state_floats)
{
    size_t bytes = sizeof(rec_hdr) + dtype_vec_bytes(dtype, dim) + 4 * (size_t)state_floats;
    return (uint32_t)((bytes + 63) & ~(size_t)63);
}

/* ------------------------------------------------------------------ root */

#define SSD_PATH_MAX 1024

#define EVICT_MARKS 128
typedef struct evict_mark {
    uint64_t epoch;            /* the sync that closed this epoch */
    uint64_t time_ms;          /* wall clock (ms since 1970) at its switch */
    uint64_t steps;            /* pushes to the table by then */
    uint64_t check;            /* evict_mark_check of the three */
} evict_mark;
static inline uint64_t evict_mark_check(const evict_mark *m)
{
    uint64_t x = m->epoch * 0x9e3779b97f4a7c15ull ^ m->time_ms * 0xc2b2ae3d27d4eb4full ^
                 m->steps * 0x165667b19e3779f9ull ^ 0x6d61726b6d61726bull;
    return x ^ (x >> 29);
}

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
    /* Checkpoint marks (P8; evict.c): what time and push count each of
     * the last syncs closed its epoch at, thinned as they age.  Slots in
     * no order; one whose check does not match is empty (zero in a root
     * from before them: no marks). */
    evict_mark marks[EVICT_MARKS];
    /* The vectors' element type and dtype ^ DTYPE_CHECK_KEY (both zero in
     * a root from before them: float32). */
    uint32_t dtype, dtype_check;
    /* A random number made with the store, and it ^ STORE_ID_CHECK_KEY
     * (both zero in a root from before them: no id).  What tells this
     * store's pool from another store's copied into its directory: the
     * binding records it beside the options (embkv_store_id). */
    uint64_t store_id, store_id_check;
} store_root;
#define DTYPE_CHECK_KEY 0x64747970u
#define STORE_ID_CHECK_KEY 0x73746f7265696421ull
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

#endif
