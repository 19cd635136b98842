/*
 * handle.h - layer 0: the store handle, struct embkv_store.
 *
 * One handle per open store directory in the process (store.c keeps the
 * registry).  It holds every layer's state, as SQLite's struct sqlite3
 * does: the index and the record space inline, the upper layers' larger
 * state (the DRAM cache, look-ahead, training, snapshots, the SSD log, the
 * access sketch) behind opaque pointers whose types only their own files
 * know.  Which lock or epoch guards a field is said beside it.
 */
#ifndef EMBKV_HANDLE_H
#define EMBKV_HANDLE_H

#include "format.h"

typedef struct index_desc index_desc;  /* index.h */

#define KEYLOCK_STRIPES 4096
#define HEAT_FOR_TIER 1u
#define HEAT_ASKED 2u
#define HEAT_FOR_CACHE 4u

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
    /* Sessions and snapshots open on the store (train.c, snapshot.c): the
     * close of the last reference is refused while any is, their close
     * reading the handle (store.c, embkv_close). */
    atomic_uint open_sessions, open_snaps;
    char *path;
    int lockfd;
    pid_t pid;                 /* the opening process (see embkv_close) */
    /* Opened read-only beside another process's writer
     * (EMBKV_OPEN_READONLY): the pool mapped read-only, no lock, no
     * threads; reads as of the durable epoch (readonly.c). */
    bool reader;
    bool no_close_sync;        /* EMBKV_OPEN_NO_CLOSE_SYNC: the close leaves the last sync's state */
    struct readers *readers;   /* the reader table (readers.c); NULL without */
    struct ro_state *ro;       /* a reader's own state (readonly.c) */

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
    uint32_t dtype;            /* the vectors' element type (EMBKV_F32...) */
    uint64_t store_id;         /* the root's (0: the root holds none) */
    uint32_t vec_bytes;        /* a record's encoded vector: its state follows */
    /* Optimizer updates rounded stochastically (train.c), from a seed of
     * the table's (rounding='stochastic'); other writes round to nearest. */
    atomic_bool round_stochastic;
    atomic_uint_fast64_t round_seed;
    uint32_t recs_per_chunk;
    uint32_t chunk_bytes;
    uint32_t delete_reserve;   /* free records only tombstones may take */
    /* Free records write groups in flight counted on (embkv_room_for in a
     * group, until the group ends): the tier's own moves leave them free. */
    atomic_size_t room_held;
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
    /* A bit a record place of each chunk: its record passed its check
     * since it was written in this process (slab.c: slab_checked); NULL
     * where memory was short (nothing remembered). */
    _Atomic uint64_t *_Atomic checked[MAX_CHUNKS];
    uint32_t nchunks;
    uint32_t chunk_limit;      /* with an SSD tier: chunks past this stay unallocated for the index (0: none) */
    bool pool_exhausted;       /* a chunk was refused: the record space is all there is */

    /* epochs and reclamation */
    atomic_uint_fast64_t cur_epoch;    /* epoch stamped on writes */
    pthread_mutex_t retire_mu;
    locvec pending[2];         /* durable versions replaced in epoch e: free after sync e */
    locvec pendingu[2];        /* the same, that no open snapshot may read (P6) */
    tomb_entry *tombs[2];
    size_t ntombs[2], tombs_cap[2];
    /* Tombstones of durable epochs kept in the index while reader
     * processes may read as of an earlier checkpoint (sync.c), each with
     * the reclamation epoch of its sync; under sync_mu. */
    tomb_entry *tdefer;
    uint64_t *tdefer_epoch;
    size_t ntdefer, tdefer_cap;
    limbo_entry *limbo;        /* waiting for readers to leave */
    size_t nlimbo, limbo_cap;
    limbo_entry *plimbo;       /* pinned: waiting for readers and older snapshots (P6) */
    size_t nplimbo, plimbo_cap;

    /* dirty pages since the last sync, one bitmap per epoch parity */
    atomic_uint_fast64_t *dirty[2];
    size_t dirty_words;
    atomic_uint_fast64_t *bdirty[2]; /* index buckets written in each epoch (mark_bucket) */
    size_t bdirty_words;
    void *dirty_map;           /* the mapping of DIRTY_FILE holding dirty[] and bdirty[], or NULL (DRAM) */
    int pool_fd;               /* the pool file, for dirtymap_flush's fdatasync; -1: none (persist.c) */
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
    atomic_bool cache_cleaning; /* one writeback_clean at a time */

    /* training (train.c): options, permits; NULL until configured */
    struct train_state *_Atomic train;
    /* Pushes so far (embkv_push calls: the table's step), from the
     * durable epoch's mark at open; each sync's mark holds it (P8). */
    atomic_uint_fast64_t steps;
    /* eviction (evict.c): options, its thread, counts; NULL until
     * configured */
    struct evict *_Atomic evict;

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
    /* Rows no demotion takes while an explicit promotion runs (sorted; under
     * demote_mu): the rows it was asked to bring up, which rows it promotes
     * after them would otherwise push out, their heat tied at the top.
     * keep_mu: one explicit promotion at a time. */
    const int64_t *demote_keep;
    size_t demote_keep_n;
    pthread_mutex_t keep_mu;
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
    /* device gathers (gather.c): NULL until the first */
    struct gpu_state *_Atomic gpu;
    /* embkv_knn's map of the pool's live records, kept from one search to
     * the next (knn.c), under knn_mu; valid while knn_clean still holds the
     * id of the pass that made it (P11: writers clear it). */
    struct knn_map *knn_map;
    pthread_mutex_t knn_mu;
    /* The kNN change log (knnlog.c), under knn_mu: the index changes told
     * while knn_clean held knn_log_id, not yet applied to the kept map. */
    struct knn_change *knn_log;
    size_t knn_log_n, knn_log_cap;
    uint64_t knn_log_id;
    /* (A cache line of its own, padded rather than aligned since the
     * handle comes from calloc: every writer section reads it, and the
     * counters below are written by every search.) */
    char knn_pad0[64];
    atomic_uint_fast64_t knn_clean;
    char knn_pad1[64];
    atomic_uint_fast64_t knn_passes;
    atomic_uint_fast64_t st_knn_reused;  /* searches that used a kept map (embkv_debug_knn_reused) */
    atomic_uint_fast64_t st_knn_kept_reruns;  /* of them, ones whose stream found the map wrong (embkv_debug_knn_kept_reruns) */

    /* statistics */
    atomic_uint_fast64_t st_gets, st_puts, st_deletes, st_batch_gets, st_hot_moves, st_hot_to_pm, st_hot_to_dram;
    atomic_uint_fast64_t st_resizes, st_syncs;
    double last_sync_ms;
};

#endif
