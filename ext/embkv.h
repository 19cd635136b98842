/*
 * embkv.h - the embkv store engine: a C API with no SQLite inside.
 *
 * A store maps int64 ids to fixed-size float32 vectors (plus an optional
 * per-row optimizer state of `state_floats` floats) and lives in a directory
 * of its own holding a libpmemobj pool.  The index is a PetHash-style
 * single-level hash in the pool; records live in a slab space inside the
 * pool and are updated copy-on-write.
 *
 * Threading: one store handle may be used by many threads at once.  Readers
 * take no lock; writers lock only the buckets they change.
 *
 * Visibility: every operation is visible to all threads as soon as it
 * returns.  Changes are made in write groups (embkv_group_begin/end; each
 * put, delete, batch update, pull that creates rows and push is a group of
 * its own, and groups nest): a snapshot (embkv_snapshot_open) sees each
 * group entirely or not at all, and a sync never falls inside one.
 *
 * Durability:  embkv_sync() makes the current state durable; after a crash the
 * store reopens exactly as of the last completed sync (a clean close syncs).
 *
 * Errors: functions return an embkv_rc.  On failure a message describing it
 * (naming the id, option or path at fault) is kept per thread and returned by
 * embkv_errmsg() until the next failing call on that thread.
 *
 * NULL: a pointer argument said "(may be NULL)" below may be NULL, and so
 * may an array whose count is 0 (and snap, meaning now).  Any other NULL
 * is EMBKV_INVALID naming the argument from a function returning an rc;
 * the accessors (embkv_dim, embkv_state_floats, embkv_dtype,
 * embkv_store_id, embkv_path, embkv_count, embkv_readonly,
 * embkv_writer_pid, embkv_group_epoch, embkv_backup_dir,
 * embkv_train_state_floats) give 0 or NULL; the void functions
 * (embkv_group_end, the closes, embkv_scan_pin/unpin, embkv_heat_touch,
 * embkv_cache_offer, embkv_train_defaults) do nothing; embkv_exists and
 * embkv_exists_batch count every id absent and embkv_dtype_round returns
 * 1 (the last three also set the message).
 *
 * Flags: a bit a function does not define (embkv_open, embkv_put,
 * embkv_update_batch, embkv_pull_ex, embkv_pull_device) is EMBKV_INVALID
 * naming the bits, and nothing is done.
 */
#ifndef EMBKV_H
#define EMBKV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The release (embkv_version() in SQL, embkv.__version__ in Python, the
 * pkg-config Version): the one place it is written. */
#define EMBKV_VERSION_STRING "0.1.0"
#define EMBKV_FORMAT_VERSION 1
#define EMBKV_MAX_DIM 8192
#define EMBKV_MAX_STATE_FLOATS 16384

typedef enum embkv_rc {
    EMBKV_OK = 0,
    EMBKV_NOTFOUND,  /* the id is not in the store */
    EMBKV_EXISTS,    /* insert-only put of an id that is present */
    EMBKV_INVALID,   /* bad argument or option (message names it) */
    EMBKV_NOTSTORE,  /* the directory is not an embkv store */
    EMBKV_VERSION,   /* store written by an incompatible format version */
    EMBKV_LOCKED,    /* the store is open in another process */
    EMBKV_FULL,      /* the pool has no room left (it does not grow: copy into a larger one) */
    EMBKV_NOMEM,     /* out of DRAM */
    EMBKV_IO,        /* an operating-system call failed */
    EMBKV_CORRUPT,   /* an integrity check failed */
    EMBKV_BUSY,      /* the operation could not proceed now */
    EMBKV_READONLY,  /* the store is open read-only (EMBKV_OPEN_READONLY) */
    EMBKV_NODEVICE   /* no usable GPU: built without CUDA, no driver, no device (message says which) */
} embkv_rc;

/* Tier a row lives in (embkv_rowinfo.tier). */
typedef enum embkv_tier {
    EMBKV_TIER_DRAM = 0,
    EMBKV_TIER_PM = 1,
    EMBKV_TIER_SSD = 2
} embkv_tier;

typedef struct embkv_store embkv_store;

/* The element type a store keeps its vectors in (embkv_options.dtype):
 * reads give float32, writes are rounded to it; optimizer state stays
 * float32.  0: float32 at create, the store's own at a reopen. */
enum {
    EMBKV_F32 = 1,   /* float32 */
    EMBKV_F16 = 2,   /* IEEE binary16 (up to 65504) */
    EMBKV_BF16 = 3,  /* bfloat16 (float32's range, 8 significant bits) */
    EMBKV_I8 = 4     /* a byte a element, with a float32 scale and bias a row */
};

/* Options for creating a store.  Zero means "default" for every field but
 * dim.  When opening an existing store, a non-zero dim / state_floats /
 * dtype must match what the store was created with. */
typedef struct embkv_options {
    uint32_t dim;            /* floats per vector, 1..EMBKV_MAX_DIM */
    uint32_t state_floats;   /* optimizer-state floats per row (default 0) */
    uint32_t dtype;          /* EMBKV_F32 (default) ... EMBKV_I8; kept with the store */
    uint64_t expected_rows;  /* sizes the index (default 100000) */
    uint64_t pool_size;      /* pool file bytes (default: from expected_rows) */
    double max_load;         /* index load factor that triggers doubling (default 0.9) */
    /* The SSD tier: rows that do not fit in the pool go to a log of segment
     * files.  ssd_size bounds the files (0: no SSD tier, or at a reopen the
     * store's own), but for compaction after a reopen of a full log: one
     * segment more (ssd_size/16, 1 to 64 MiB) until the next sync.  ssd_path
     * is their directory (NULL or "": "log" inside the store directory; a
     * relative path is taken from the process's working directory, and
     * kept as it resolved then: give an absolute one).  Both
     * are kept with the store: a reopen may raise ssd_size (or add a tier
     * to a store without one), never lower it, and may not name another
     * ssd_path. */
    uint64_t ssd_size;
    const char *ssd_path;
    /* The DRAM cache (0: none): bytes of DRAM for a write-back cache of hot
     * rows, updated in place and written back at syncs (and when a
     * snapshot opens, or when 15/16 of it is dirty).  Not kept with the
     * store: the first open in the process that asks for a cache decides
     * its size (a store open without one takes it then); a later open
     * asking for another size is refused, 0 shares it.  At most the
     * machine's memory; at least 64 rows. */
    uint64_t cache_size;
    /* Background hot-set migration (0: none): a thread that, about once a
     * second, ranks the hottest rows and moves them up as
     * embkv_hotset_move does, at most migrate_rate moves per second
     * (each step of a row counts: log to pool, into its home bucket, into
     * the cache; never more than rate x time since it started, at most
     * one second's worth at once).  It considers as many rows as 7/8 of
     * the cache holds, or without a cache half of what the pool holds.
     * Not kept with the store: it runs while the store is open in the
     * process, and a later open giving a rate sets it (EMBKV_MIGRATE_ANY:
     * the running migration at its rate, or one at the default rate). */
    uint64_t migrate_rate;
} embkv_options;

#define EMBKV_MIGRATE_ANY UINT64_MAX
#define EMBKV_MIGRATE_DEFAULT_RATE 50000

/* A store directory may also hold files whose names begin with this
 * prefix: they belong to the application using the store (the SQLite
 * binding keeps the list of the tables using it there), and the engine
 * neither counts them as foreign nor touches them. */
#define EMBKV_APP_FILE_PREFIX "app-"

/* Flags for embkv_open. */
#define EMBKV_OPEN_CREATE 0x1  /* create the store if the directory is absent or empty */
/* Read the store beside its writer in another process (or with none):
 * no lock is taken, the pool is mapped read-only, and every read returns
 * rows as of the last checkpoint (the durable epoch when the read or its
 * snapshot began: one checkpoint, whole).  Reads, scans, snapshots,
 * embkv_knn (current versions, as always), embkv_stats_get work; every
 * function that would change the store returns EMBKV_READONLY.  A read
 * that holds back the writer's reclamation for more than 10 s (100 ms when
 * the writer must wait for it: a demotion, a resize, a compaction), or
 * that the writer's reopening overtook, fails with EMBKV_BUSY (run it
 * again).  In
 * a process that has the store open to write, this shares that handle. */
#define EMBKV_OPEN_READONLY 0x2
/* Changes are durable at embkv_sync only: the last embkv_close does not
 * sync, and what changed since the last sync is rolled back at the next
 * open, as after a crash.  For a store that must never be durable at a
 * moment its application did not choose (a shard of a distributed table,
 * whose checkpoints must be the job's steps).  A handle shared in the
 * process keeps it once any of its opens gave it. */
#define EMBKV_OPEN_NO_CLOSE_SYNC 0x4
/* opt->cache_size is a preference: a store already open in the process
 * with a cache of another size is shared with that cache (without the
 * flag such an open is refused). */
#define EMBKV_OPEN_ANY_CACHE 0x8
/* Whether s was opened with EMBKV_OPEN_READONLY (not sharing a writer's handle). */
int embkv_readonly(const embkv_store *s);
/* For such a handle: the live process writing the store (0: none). */
long embkv_writer_pid(const embkv_store *s);
/* A live process other than this one reading the store in dir through
 * EMBKV_OPEN_READONLY (its pid; 0: none): embkv_destroy refuses while
 * there is one. */
long embkv_reader_pid(const char *dir);

/* Open (and with EMBKV_OPEN_CREATE, create) the store in directory `dir`.
 * Opening a directory already open in this process returns the same store
 * with its reference count raised; each open needs its own embkv_close. */
int embkv_open(const char *dir, const embkv_options *opt, unsigned flags,
               embkv_store **out);

/* Drop one reference; the last one syncs (unless an open gave
 * EMBKV_OPEN_NO_CLOSE_SYNC) and closes the pool.  Inside a write group of
 * the calling thread on s (embkv_group_begin without its
 * embkv_group_end), any reference's close is EMBKV_BUSY and changes
 * nothing: end the group, then close.  The last reference's close while
 * sessions (embkv_session_open) or snapshots (embkv_snapshot_open) of the
 * store are open is EMBKV_BUSY, saying how many, and changes nothing (as
 * SQLite's sqlite3_close with statements unfinalized): close them first;
 * another reference's close goes on.  In a child
 * forked from the process that opened the store it writes nothing (the
 * pool is shared with the parent): a store is used by one process. */
int embkv_close(embkv_store *s);

/* Remove the store directory `dir` (its store's files, its "app-" files
 * and the directory) if no process has it open: its lock is taken and held
 * while the files go, so an open racing with it fails or waits for nothing.
 * EMBKV_LOCKED if it is open (in this process or another), EMBKV_NOTSTORE
 * if it holds files that are not a store's (then nothing is removed). */
int embkv_destroy(const char *dir);

/* The per-thread message of the last failure. Never NULL. */
const char *embkv_errmsg(void);

/* Store geometry. */
uint32_t embkv_dim(const embkv_store *s);
uint32_t embkv_state_floats(const embkv_store *s);
/* The store's element type (EMBKV_F32 ... EMBKV_I8) and its name ("f32",
 * "f16", "bf16", "i8"). */
uint32_t embkv_dtype(const embkv_store *s);
/* A random number made with the store, the same in every copy of it (a
 * backup, a copied directory); 0 when the store's root holds none.
 * A caller that records it beside the store's files (the SQLite binding,
 * in its options file) tells this store's pool from another's put in its
 * place. */
uint64_t embkv_store_id(const embkv_store *s);
const char *embkv_dtype_name(uint32_t dtype);  /* "unknown" for another value */
/* The largest magnitude a dtype holds (f16 65504, bf16 about 3.3895e38;
 * f32 and i8 float32's); a larger value is refused, not rounded down. */
float embkv_dtype_max(uint32_t dtype);
/* dim float32 from in to out (they may be the same) rounded to nearest as
 * a store of dtype keeps them: 0, or j + 1 for an element j beyond the
 * dtype's range or not finite (out then unchanged); 1 when in or out is
 * NULL (dim 0: 0). */
uint32_t embkv_dtype_round(uint32_t dtype, uint32_t dim, const float *in, float *out);
const char *embkv_path(const embkv_store *s);  /* canonical directory */

/* Per-row metadata. */
typedef struct embkv_rowinfo {
    uint64_t clock;  /* number of updates applied to the row since insert (it stops at 2^63 - 1) */
    uint64_t epoch;  /* sync generation of its last write */
    int tier;        /* embkv_tier */
} embkv_rowinfo;

/* Point operations.
 * get:  copies dim floats to vec (may be NULL), state_floats floats to state
 *       (may be NULL) and metadata to info (may be NULL).
 * put:  insert or replace.  state NULL keeps the existing state (zeros for a
 *       new row).  A replaced row's clock is old clock + 1 (up to 2^63 - 1); a new row's is 0.
 *       flags: EMBKV_PUT_INSERT (fail with EMBKV_EXISTS when present),
 *              EMBKV_PUT_UPDATE (fail with EMBKV_NOTFOUND when absent).
 *       A NaN or infinity in vec or state: EMBKV_INVALID naming the id. */
#define EMBKV_PUT_INSERT 0x1
#define EMBKV_PUT_UPDATE 0x2
#define EMBKV_PUT_RESET 0x4   /* a new row replaces any present: clock 0, state zeros unless given */
int embkv_get(embkv_store *s, int64_t id, float *vec, float *state,
              embkv_rowinfo *info);
int embkv_put(embkv_store *s, int64_t id, const float *vec, const float *state,
              unsigned flags);
int embkv_delete(embkv_store *s, int64_t id);
/* Put with an explicit clock (putting a row back as it was, importing
 * one): insert or replace, the row's clock set to `clock` (at most
 * 2^63 - 1, else EMBKV_INVALID); state NULL
 * keeps the existing state (zeros for a new row).  A write group of its
 * own, like embkv_put. */
int embkv_put_clock(embkv_store *s, int64_t id, const float *vec, const float *state, uint64_t clock);
/* For callers that must not fail half-way (a transaction commit, rows
 * created by a pull), before writing anything: embkv_grow_index_for grows
 * the index now if `new_ids` ids not yet in the store would need it (it
 * takes pool space); embkv_room_for says whether `puts` puts and `deletes`
 * deletes of existing rows would find records now (free ones, or pool
 * space for more): EMBKV_OK, or EMBKV_FULL with a message.  Not a
 * reservation: other writers may take the room; called inside a write
 * group, the SSD tier's own moves (promotions, hot-set moves) leave the
 * room it found free until the group ends. */
int embkv_grow_index_for(embkv_store *s, uint64_t new_ids);
int embkv_room_for(embkv_store *s, uint64_t puts, uint64_t deletes);
/* Whether `new_rows` rows beside those the store holds could fit its pool
 * and its SSD log together (a bound: EMBKV_OK does not promise room, but
 * EMBKV_FULL, with a message naming ssd_size, means they cannot).  For a
 * store with an SSD tier, where embkv_room_for would demote rows to make
 * room in the pool; without one, embkv_room_for(s, new_rows, 0). */
int embkv_capacity_for(embkv_store *s, uint64_t new_rows);
int embkv_exists(embkv_store *s, int64_t id); /* 1 present, 0 absent */
/* found[i] = embkv_exists(ids[i]) for a whole batch, with the buckets
 * prefetched ahead; returns the number absent.  found may be NULL (the
 * count alone). */
size_t embkv_exists_batch(embkv_store *s, const int64_t *ids, size_t n, uint8_t *found);
uint64_t embkv_count(embkv_store *s);

/* Look-ahead (stores with an SSD tier): the ids of batches about to be
 * read.  Returns at once with *queued (may be NULL) set to the number of
 * rows whose reads it queued: the SSD-resident ones among ids, each once,
 * not those in the pool or the DRAM cache, absent or already staged.  A background thread
 * reads them from the log (one io_uring batch as deep as what is queued)
 * into a DRAM stage of 32 MiB of rows (at least 1024, at most 262144); the
 * next read of such a row (embkv_get_batch, a pull, any read path) takes it
 * from the stage, or waits for its read if still in flight, instead of
 * reading the log.  A staged row stays, read or not, until a write replaces
 * the row or the stage is full and it is the oldest staged row (counted as
 * wasted in the stats when it was never read);
 * rows in flight are never dropped, so a full stage queues fewer.  Takes no
 * staleness permits.  Without an SSD tier: EMBKV_OK, nothing queued. */
int embkv_lookahead(embkv_store *s, const int64_t *ids, size_t n, size_t *queued);

/* Waits up to timeout_ms for the SSD tier's background thread to have
 * nothing left to do (demotion to its watermark, queued promotions,
 * compaction, which is then not rate-limited); EMBKV_BUSY if it still had
 * work at the deadline.  For tests and benchmarks that need a settled
 * tier; EMBKV_OK at once without an SSD tier. */
int embkv_tier_idle(embkv_store *s, int timeout_ms);

/* Batch get: writes n vectors of dim floats to out in the order of ids
 * (duplicates allowed).  A missing id's vector is zero-filled; found (may be
 * NULL) gets 1/0 per id, and *nmissing (may be NULL) the number missing.
 * Returns EMBKV_OK even when ids are missing. */
int embkv_get_batch(embkv_store *s, const int64_t *ids, size_t n, float *out,
                    uint8_t *found, size_t *nmissing);

/* Write groups.  Everything a thread changes between begin and end is one
 * group: seen by snapshots entirely or not at all, and inside one epoch (a
 * sync waits for the groups in flight).  Groups nest within a thread; keep
 * them short (snapshot opens and syncs wait for them), and call neither
 * embkv_sync nor embkv_snapshot_open inside one (EMBKV_BUSY). */
int embkv_group_begin(embkv_store *s);
void embkv_group_end(embkv_store *s);
/* The epoch of the calling thread's open group on s (0 outside one): its
 * writes are durable once a checkpoint has completed that epoch
 * (embkv_stats' durable_epoch at least this), and a crash before that
 * takes the store back past all of them. */
uint64_t embkv_group_epoch(embkv_store *s);

/* Snapshots.  A snapshot fixes the set of groups it sees when it opens
 * (waiting for the groups in flight to end); reads through it return each
 * row as of then, whatever is written meanwhile.  While it is open the
 * versions it may read are kept: a long-lived snapshot with heavy writes
 * beside it holds pool space.  Close it when the statement ends, and
 * before the store's last embkv_close (which refuses while one is open). */
typedef struct embkv_snapshot embkv_snapshot;
int embkv_snapshot_open(embkv_store *s, embkv_snapshot **out);
void embkv_snapshot_close(embkv_snapshot *snap);
/* Ids of rows that existed at the snapshot and were changed or deleted
 * since (a scan of the index misses the deleted ones).  *ids is malloc'd. */
int embkv_snapshot_changed_ids(embkv_snapshot *snap, int64_t **ids, size_t *n);

/* Batch get as of a snapshot (snap NULL: the current state; one opened on
 * another store or handle: EMBKV_INVALID naming both, for every *_at
 * function), each row's columns from one version: out (may be NULL: existence only) gets dim
 * floats per id, info (may be NULL) each row's metadata, found (may be
 * NULL) 1/0 per id.  A row read from the SSD log is offered to promotion,
 * as by embkv_get (embkv_locate_batch_at reads nothing). */
int embkv_get_batch_at(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n,
                       float *out, embkv_rowinfo *info, uint8_t *found, size_t *nmissing);
/* embkv_get_batch_at with the optimizer state, for reads that copy rows
 * rather than use them (a scan, an export): it offers no row to promotion.
 * state (may be NULL) gets
 * state_floats floats per id (zeros for an absent one), from the same
 * version as the row's vector and info; a record read for its vector or
 * state is verified whole (id and checksum).  With embkv_put_clock it
 * copies a table row for row: vector, state and clock (the SQLite
 * binding's embkv_export reads through it). */
int embkv_get_rows_at(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n,
                      float *out, float *state, embkv_rowinfo *info, uint8_t *found, size_t *nmissing);
/* Where each row is as of a snapshot (snap NULL: now): tier (may be NULL)
 * gets its embkv_tier, -1 when absent; found (may be NULL) 1/0.  A row in
 * the SSD log is not read, so counting, listing ids and grouping by tier
 * cost no I/O, and a row whose log record is damaged can still be found
 * (and deleted).  A pool row's id is checked, as by an existence get. */
int embkv_locate_batch_at(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, int *tier,
                          uint8_t *found);

/* Batch read-modify-write.  For each ids[i] in order, fn is called with a
 * private copy of the row's vector and state, which it modifies in place; the
 * result is published copy-on-write and the clock incremented.  fn returning
 * non-zero skips the row (nothing written).  A row fn leaves with a NaN or
 * an infinity is not written either: the batch stops there, EMBKV_INVALID
 * naming the id (the rows before it are written and counted).  A missing id is reported through
 * fn with vec == NULL unless EMBKV_UPDATE_CREATE is given, in which case the
 * row starts as zeros (clock 0 after this first write).  *nupdated (may be
 * NULL) counts rows written.  The batch holds its rows' locks while fn
 * runs, so fn makes no store call that could wait for them: every call
 * that changes a store (put, delete, update_batch, group_begin, pull,
 * push, sync, evict, hotset...), and embkv_check, embkv_snapshot_open
 * and embkv_backup_begin, on any store, return EMBKV_BUSY inside fn
 * ("inside an embkv_update_batch callback"): note the changes in ctx and
 * make them after the batch.  Reads (embkv_get, embkv_get_batch, ...),
 * embkv_scan, embkv_knn and scan pins work. */
#define EMBKV_UPDATE_CREATE 0x1
typedef int (*embkv_update_fn)(void *ctx, size_t i, int64_t id, float *vec,
                               float *state);
int embkv_update_batch(embkv_store *s, const int64_t *ids, size_t n,
                       embkv_update_fn fn, void *ctx, unsigned flags,
                       size_t *nupdated);

/* Scan: visits every row present when the scan starts and not changed during
 * it exactly once.  fn returning non-zero stops the scan (that value is
 * returned).  vec/state point into the store and are valid only during the
 * call. */
typedef int (*embkv_scan_fn)(void *ctx, int64_t id, const float *vec,
                             const float *state, const embkv_rowinfo *info);
int embkv_scan(embkv_store *s, embkv_scan_fn fn, void *ctx);

/* Cursor-style scan of ids: fills ids[0..*n) with the ids of the next whole
 * buckets from *pos (start with *pos = 0), cap must be >= 64.  *n == 0 means
 * the end.  An index resize since the scan began returns EMBKV_BUSY; hold a
 * pin for the life of the cursor to rule that out. */
int embkv_scan_ids(embkv_store *s, uint64_t *pos, int64_t *ids, size_t cap,
                   size_t *n);

/* While any pin is held the index does not resize (inserts keep going into
 * the current array; a thread holding a pin gets EMBKV_BUSY once it is 98%
 * full, others wait for the last unpin) and no row moves between buckets
 * (embkv_hotset, migration), so a pinned embkv_scan_ids cursor sees every
 * row present throughout exactly once.  embkv_scan pins for its own
 * duration.  An insert waiting for the unpin waits inside its write
 * group, so a thread holding a pin does not wait for write groups then:
 * its embkv_sync, embkv_snapshot_open, embkv_backup_begin, and a write
 * while another thread's sync waits for the groups, return EMBKV_BUSY
 * (call them again after the unpin). */
void embkv_scan_pin(embkv_store *s);
void embkv_scan_unpin(embkv_store *s);

/* Nearest neighbours, exact: the k rows nearest to each of nq query
 * vectors (queries: nq x dim floats, finite), over every tier.  Results of
 * query q are at out_ids/out_dist[q * k ...], nearest first, equal
 * distances by smaller id; found[q] says how many (fewer than k when the
 * table has fewer rows; the rest are id -1, distance NaN).  Distances:
 * EMBKV_KNN_L2 the Euclidean distance, EMBKV_KNN_COSINE 1 - cosine
 * similarity (zero rows left out; a zero query is EMBKV_INVALID),
 * EMBKV_KNN_DOT minus the inner product.  Rows whose distance is NaN are
 * left out.  Reads each row's current version (a row written during the
 * search in one of its versions); counts no access (the statistics and the
 * cache are left as they are).  Takes the scan pin (embkv_scan_pin) for
 * the pass.  Limits: k <= EMBKV_KNN_MAX_K, nq <= EMBKV_KNN_MAX_QUERIES,
 * nq x k <= EMBKV_KNN_MAX_RESULTS (EMBKV_INVALID beyond). */
enum { EMBKV_KNN_L2 = 0, EMBKV_KNN_COSINE = 1, EMBKV_KNN_DOT = 2 };
#define EMBKV_KNN_MAX_K 100000
#define EMBKV_KNN_MAX_QUERIES 100000
#define EMBKV_KNN_MAX_RESULTS 10000000
typedef struct embkv_knn_options {
    int metric;                /* EMBKV_KNN_L2 (0, the default), _COSINE, _DOT */
    const int64_t *only;       /* not NULL: only these ids (absent ones ignored) */
    size_t nonly;
    const int64_t *skip;       /* ids of the table left out (a caller holding newer versions) */
    size_t nskip;
    const int64_t *extra_ids;  /* rows scored beside the table's (those newer versions: */
    const float *extra_vecs;   /* nextra x dim floats), whatever only says */
    size_t nextra;
    unsigned threads;          /* 0: one per online CPU, at most 8 */
} embkv_knn_options;
int embkv_knn(embkv_store *s, const float *queries, size_t nq, size_t k,
              const embkv_knn_options *opt, int64_t *out_ids, double *out_dist,
              size_t *found);

/* Hotness-aware placement (PetPS): move each listed id into its home bucket
 * if it is displaced, evicting a displaced victim when the home bucket is
 * full.  Concurrent readers keep seeing every row.  While a scan pin is
 * held nothing moves (a scan would miss a row or see it twice): the call
 * stops there.  *moved (may be NULL) gets the number moved. */
int embkv_hotset(embkv_store *s, const int64_t *ids, size_t n, size_t *moved);

/* Access statistics: an approximate, aging count of each row's recent
 * reads and writes (a frequency sketch in DRAM with 4-bit counters, so
 * hits run 0..15; every counter is halved once per ~10 counted accesses
 * per row the pool holds).  They are not kept with the store: a reopen
 * starts from zero.  They count while something needs them: the SSD tier
 * once the pool is half full, or from the first embkv_heat_enable in the
 * process (a store whose rows all fit in the pool pays nothing until
 * then).  Estimates are by hash: an absent id may show hits. */
int embkv_heat_enable(embkv_store *s);
int embkv_heat_get(embkv_store *s, const int64_t *ids, size_t n, uint32_t *hits);
/* Counts one access of each id, made outside the engine's read and write
 * calls that count their own (embkv_get, embkv_get_batch, embkv_put,
 * embkv_update_batch, pulls and pushes; snapshot reads and scans do not
 * count): the SQLite binding's lookups by id.  Nothing while the
 * statistics are not counting. */
void embkv_heat_touch(embkv_store *s, const int64_t *ids, size_t n);
/* Offers the rows of ids that are in the pool to the DRAM cache, as the
 * engine's batch reads (embkv_get_batch, pulls) do with the rows they read
 * there: admitted while the cache has room, later only when the access
 * statistics rank them above the victim.  Snapshot reads and scans offer
 * nothing (one pass over a table would fill the cache with its cold rows):
 * the SQLite binding's lookups by id call this after their reads.  Nothing
 * without a cache. */
void embkv_cache_offer(embkv_store *s, const int64_t *ids, size_t n);
/* The up-to-n hottest rows present, hottest first (equal estimates in
 * index order), with their estimates (hits may be NULL); rows with no
 * counted access are never among them, so *nout may be below n. */
int embkv_hottest(embkv_store *s, size_t n, int64_t *ids, uint32_t *hits, size_t *nout);

/* Moves the rows of ids (absent ones and repeats ignored) up the hierarchy:
 * from the SSD log into the pool (making room by demoting colder rows; the
 * first ids win when room runs out; a row whose log record is damaged
 * stays there), then into their home buckets.  *moves counts what happened
 * to these ids: rows now in the pool that were in the log, rows moved into
 * their home bucket, rows brought into the DRAM cache (with one: each
 * row present ends there, evicting colder clean rows). */
typedef struct embkv_moves {
    uint64_t home_bucket, to_pm, to_dram;
} embkv_moves;
int embkv_hotset_move(embkv_store *s, const int64_t *ids, size_t n, embkv_moves *moves);

/* Make everything written so far durable.  Cost is proportional to what
 * changed since the previous sync. */
int embkv_sync(embkv_store *s);

/* Online backup: a copy of the store as of one checkpoint, taken while
 * every kind of work goes on, written as a new store in directory dir
 * (absent, or empty; not inside the store or its SSD tier) that
 * embkv_open opens like any other.  Like SQLite's backup API, in steps:
 *   begin   syncs (the checkpoint copied is that sync's, every write
 *           group entirely or not at all, all tiers) and creates the copy,
 *           with this store's dim, state floats, pool size and SSD size,
 *           in a temporary directory beside dir;
 *   step    copies up to `rows` rows (0: all that are left) with their
 *           vectors, optimizer state and clocks; *done (may be NULL) 1
 *           when none is left.  Steps may run on any thread, one at a time;
 *   finish  when done: syncs, verifies and closes the copy and renames it
 *           to dir (never over a directory that is not empty), filling
 *           *info (may be NULL); otherwise, or after a failed step, it
 *           removes the copy and says why.  Always frees the backup.
 * A crash leaves dir complete or absent; the temporary directory it may
 * leave is removed by the next backup to dir.  The backup holds a
 * reference of its own to the store: an embkv_close while it runs leaves
 * the store open until finish.  Extra memory: one chunk
 * of at most 4 MiB of rows, and the ids changed since begin.  Until
 * finish, every version replaced since begin is kept, as for any open
 * snapshot (pool space, and SSD log space that compaction cannot take
 * back: under heavy writes a backup may fill either), and rows do not move
 * between buckets (embkv_hotset, migration skip their moves).  A row whose record is damaged fails the
 * step, naming it. */
typedef struct embkv_backup embkv_backup;
typedef struct embkv_backup_info {
    uint64_t epoch;   /* the checkpoint copied (durable_epoch of embkv_stats) */
    uint64_t rows;    /* rows in the copy */
    uint64_t bytes;   /* bytes of its files */
} embkv_backup_info;
int embkv_backup_begin(embkv_store *s, const char *dir, embkv_backup **out);
int embkv_backup_step(embkv_backup *b, size_t rows, int *done);
/* The directory the copy is built in until finish renames it (files an
 * application writes there whose names begin with EMBKV_APP_FILE_PREFIX
 * travel with the copy: the SQLite binding puts the table's options). */
const char *embkv_backup_dir(const embkv_backup *b);
int embkv_backup_finish(embkv_backup *b, embkv_backup_info *info);
/* Instead of finish: the copy removed, nothing placed at dir, the backup
 * freed (for an application whose own files could not be written into
 * embkv_backup_dir).  EMBKV_BUSY, nothing done, while a step runs. */
int embkv_backup_abandon(embkv_backup *b);
/* Whether an application may create path (absolute) for this store's
 * data: EMBKV_OK when it is outside the store's directory, its SSD tier
 * and every other embkv store; EMBKV_INVALID naming the one it is in (a
 * store that finds a foreign file in its directory refuses to open).  The
 * rule embkv_backup_begin applies to its target; the SQLite binding's
 * export applies it to its file. */
int embkv_path_outside(embkv_store *s, const char *path);

/* Verify the index and records (checksums, overflow counters, row count),
 * the SSD log's records too (each row's read and checked, as embkv_get
 * does: a missing, truncated or damaged segment is corruption).  Returns
 * EMBKV_CORRUPT with a message naming the first problem (for a row, the
 * message embkv_get gives for it).  Writers wait while it runs. */
int embkv_check(embkv_store *s);

typedef struct embkv_stats {
    uint64_t rows;
    uint64_t buckets;          /* index buckets */
    uint32_t slots_per_bucket;
    uint32_t bucket_bytes;
    double load_factor;        /* rows / (buckets * slots_per_bucket) */
    uint64_t record_bytes;     /* bytes per record (header + vector + state) */
    uint64_t pool_bytes;       /* pool file size */
    uint64_t pool_used_bytes;  /* index + record chunks allocated */
    uint64_t resizes;          /* index doublings since open */
    uint64_t durable_epoch;    /* last completed sync */
    uint64_t syncs;            /* since open */
    double last_sync_ms;
    uint64_t gets, puts, deletes, batch_gets, hot_moves;
    int is_pmem;               /* pool on real persistent memory */
    int pool_advice_random;    /* mapping advised MADV_RANDOM: a pool larger than half the memory */
    int recovered;             /* open had to roll back an unclean shutdown */
    /* The tiers (zero without an SSD tier, but rows_pm). */
    uint64_t rows_pm, rows_ssd;
    uint64_t ssd_size;             /* the limit */
    uint64_t ssd_file_bytes;       /* segment files on disk */
    uint64_t ssd_live_bytes;       /* room the records rows point at take (4 KiB blocks hold whole records) */
    uint64_t ssd_segments, ssd_damaged_segments;
    uint64_t ssd_reads, ssd_read_bytes, ssd_writes, ssd_write_bytes, ssd_syncs;
    double ssd_mean_read_depth;    /* reads in flight per submission */
    int ssd_uring, ssd_direct;     /* io_uring and O_DIRECT in use */
    char ssd_fallback[160];        /* why not, when either is 0 */
    uint64_t demotions, promotions;
    uint64_t compactions;          /* segments compacted */
    uint64_t compacted_rows;       /* live rows compaction rewrote */
    double write_amplification;    /* log bytes written / bytes of rows demoted */
    double ssd_wait_ms;            /* reads waiting for the log (foreground) */
    /* Look-ahead (embkv_lookahead): rows queued; pulled from the stage
     * (hits) or while their read was in flight (late); dropped unpulled
     * (wasted); in the stage now and its capacity in rows; time pulls
     * waited for rows in flight. */
    uint64_t lookahead_queued, lookahead_hits, lookahead_late, lookahead_wasted;
    uint64_t lookahead_staged, lookahead_capacity;
    uint64_t lookahead_wait_ns;
    /* Access statistics: counting now, touches counted, halvings, DRAM
     * held; rows embkv_hotset_move brought into the pool. */
    int heat_counting;
    uint64_t heat_touches, heat_agings, heat_bytes;
    uint64_t hotset_to_pm, hotset_to_dram;
    /* The DRAM cache (zero without one): rows it can hold and holds, bytes
     * mapped, dirty rows; hits and misses of reads and writes that looked
     * it up; rows admitted, evicted, written back, refused by admission;
     * whether the kernel took the huge-page advice. */
    uint64_t cache_capacity_rows, cache_rows, cache_bytes, cache_dirty;
    uint64_t cache_hits, cache_misses, cache_admissions, cache_evictions, cache_writebacks, cache_refused;
    int cache_huge_pages;
    /* Background migration (migrate_rate): the rate, rounds done, row
     * moves made, moves that failed (a full pool, a damaged record). */
    uint64_t migrate_rate, migrate_rounds, migrate_moved, migrate_errors;
    /* Device gathers and sums (embkv_get_batch_device, embkv_pull_device,
     * embkv_push_device; zero before the first): gathers, rows the GPU
     * read from the registered pool and rows the CPU staged, bytes
     * gathered, time the calls took on the CPU; gradient sums and their
     * rows; whether the pool's mapping is registered (1; -1: it failed,
     * gpu_note says why; 0: not tried, or not done yet); leases not yet
     * completed. */
    uint64_t gpu_gathers, gpu_rows_direct, gpu_rows_staged, gpu_bytes, gpu_ns, gpu_sums, gpu_sum_rows;
    int gpu_registered;
    uint32_t gpu_inflight;
    char gpu_note[240];
} embkv_stats;
int embkv_stats_get(embkv_store *s, embkv_stats *st);

/* Probe lengths (buckets read) of successful lookups of every present id:
 * mean and maximum.  Walks the whole index. */
int embkv_probe_stats(embkv_store *s, double *mean, uint32_t *max);


/* ------------------------------------------------------------ training
 *
 * Pull/push with an optimizer applied in the store, deferred initialization
 * of missing rows and per-embedding bounded staleness (MLKV's counter: a
 * pull takes a permit on each id, a push returns it).  Configure a store
 * once with embkv_train_configure; each trainer thread or connection uses
 * its own session, which remembers the permits it holds and returns them
 * when it closes.
 */
enum { EMBKV_SGD = 0, EMBKV_ADAGRAD = 1, EMBKV_ADAM = 2 };
enum { EMBKV_INIT_NONE = 0, EMBKV_INIT_ZEROS = 1, EMBKV_INIT_UNIFORM = 2, EMBKV_INIT_NORMAL = 3 };
#define EMBKV_STALENESS_UNLIMITED (-1)

typedef struct embkv_train_options {
    int optimizer;               /* EMBKV_SGD, EMBKV_ADAGRAD or EMBKV_ADAM */
    double lr;                   /* learning rate, > 0 */
    double initial_accumulator;  /* adagrad: starting value of the accumulator */
    double eps;                  /* adagrad and adam denominator term, > 0 */
    double beta1, beta2;         /* adam */
    int init;                    /* EMBKV_INIT_*: how a missing id is created on pull */
    double init_a, init_b;       /* uniform(a, b) or normal(mean a, std b) */
    uint64_t seed;               /* initial values are a function of (seed, id) */
    int64_t staleness;           /* >= 0, or EMBKV_STALENESS_UNLIMITED */
    uint32_t wait_ms;            /* how long a pull waits for a permit */
    /* Admission (0 or 1: every id is stored on its first pull): a missing
     * id is stored from its admit_count-th pull on (at most 255; needs an
     * initializer).  Before that a pull returns its initial values without
     * creating the row, and a push drops its gradient.  Counts are kept in
     * DRAM (a count-min sketch sized for the index), not across a close. */
    uint32_t admit_count;
    /* Eviction (all 0: none).  A row not written (pushed, updated or
     * inserted) for ttl_ms of wall clock, or for ttl_steps pushes to the
     * table, expires; with max_rows, rows past that many are evicted in
     * the order evict ranks (EMBKV_EVICT_LFU: fewest recent accesses
     * first, LFU with aging; EMBKV_EVICT_LRU: least recently written
     * first).  A row's age is known from the checkpoint (sync) after its
     * last write; a row pulled and not yet pushed or released is never
     * evicted (pulls take a permit on every id while eviction is on).
     * Applied by the store's eviction thread, about once a second, and by
     * embkv_evict. */
    uint64_t ttl_ms, ttl_steps, max_rows;
    int evict;
    /* How a push's results are rounded to a dtype below float32:
     * EMBKV_ROUND_NEAREST (ties to even), or EMBKV_ROUND_STOCHASTIC (up
     * with probability the distance to the value below over the step:
     * unbiased; its random bits a function of (seed, id, clock, element)).
     * Other writes round to nearest. */
    int rounding;
} embkv_train_options;
enum { EMBKV_ROUND_NEAREST = 0, EMBKV_ROUND_STOCHASTIC = 1 };
enum { EMBKV_EVICT_LFU = 0, EMBKV_EVICT_LRU = 1 };
#define EMBKV_TTL_MAX_MS (3650ull * 86400000ull) /* ten years */
#define EMBKV_TTL_MAX_STEPS (1ull << 62)
#define EMBKV_MAX_ROWS_MAX (1ull << 40)

/* Defaults: sgd, lr 0.01, adagrad accumulator 0, eps 1e-10 (PyTorch's
 * Adagrad default; PyTorch's Adam uses 1e-8: set it when choosing adam),
 * adam betas 0.9/0.999, no initializer, seed 0, unlimited staleness, wait
 * 5000 ms. */
void embkv_train_defaults(embkv_train_options *o);
/* Optimizer-state floats a row needs (create the store with this many):
 * sgd 0, adagrad dim, adam 2*dim + 1. */
uint32_t embkv_train_state_floats(const embkv_train_options *o, uint32_t dim);
/* Validates and installs the training options of an open store (all its
 * handles and sessions share them); may be called again to change them.
 * Pulls waiting for a permit then wait under the new staleness bound (a
 * bound raised or lifted lets them go at once), within their own wait_ms. */
int embkv_train_configure(embkv_store *s, const embkv_train_options *o);

/* A session is one thread's at a time: its pull, push or release while
 * another thread's call of it runs is EMBKV_BUSY, doing nothing (closing
 * it then is the caller's error). */
typedef struct embkv_session embkv_session;
int embkv_session_open(embkv_store *s, embkv_session **out);
/* Returns every permit the session still holds.  Close every session
 * before the store's last embkv_close (which refuses while one is open). */
void embkv_session_close(embkv_session *ss);

/* Pull: n vectors in the order of ids (duplicates allowed: each gets the
 * same vector, read once).  Takes one permit per distinct id of the batch; waits while an id
 * has staleness+1 unreturned pulls, and gives up with EMBKV_BUSY (naming the
 * id and the bound) after wait_ms, holding nothing it took in this call.  A
 * missing id is created from the initializer, or is EMBKV_NOTFOUND naming it
 * when there is none (nothing taken, nothing created). */
int embkv_pull(embkv_session *ss, const int64_t *ids, size_t n, float *out);
/* embkv_pull with flags.  EMBKV_PULL_ONCE: an id on which the session
 * holds a permit already takes no other (and never waits): a step that
 * reads a row in several pulls (an id among heads and tails, say) holds
 * one permit on it, which its one push returns. */
#define EMBKV_PULL_ONCE 0x1
int embkv_pull_ex(embkv_session *ss, const int64_t *ids, size_t n, float *out, unsigned flags);
/* Push: gradients (n * dim floats) applied with the optimizer; duplicates'
 * gradients are summed first; every distinct row's clock advances by one.
 * lr <= 0 uses the configured rate.  Then returns the session's permits on
 * those ids.  NaN/Inf gradients or a missing id (without initializer) are
 * errors that change nothing.  A row whose update would overflow float32 is
 * left unchanged and reported (EMBKV_INVALID naming the first such id) after
 * the other rows are updated.  *nupdated (may be NULL): distinct rows. */
int embkv_push(embkv_session *ss, const int64_t *ids, size_t n, const float *grads, double lr,
               size_t *nupdated);
/* Return the session's permits on ids without an update.  *nreleased (may
 * be NULL): permits that went back; ids the session holds no permit for
 * count nothing; each distinct id returns at most one. */
int embkv_release(embkv_session *ss, const int64_t *ids, size_t n, size_t *nreleased);

/* ---- The GPU (docs/gpu.md).  Built when nvcc is found; everything else
 * works without a GPU or a CUDA driver, and these then fail with
 * EMBKV_NODEVICE saying why.  dev_out and dev_grads are device addresses
 * (a CUDA tensor's data_ptr()), stream a CUstream / cudaStream_t (NULL:
 * the default stream) of the context that owns them.  A gather returns
 * once its copy is enqueued on stream: read dev_out in stream order.  The
 * rows it reads are protected until the copy completes, whatever writes
 * do meanwhile, and equal the CPU path's bytes. */
/* Whether the CUDA part was compiled in (1) or not (0). */
int embkv_gpu_compiled(void);
/* EMBKV_OK when a GPU is usable now; else EMBKV_NODEVICE, and why (also
 * in embkv_errmsg) in why[cap] (may be NULL). */
int embkv_gpu_status(char *why, size_t cap);
/* embkv_get_batch into device memory: n rows of dim float32 at dev_out; a
 * missing id gives a row of zeros, counted in *nmissing (may be NULL). */
int embkv_get_batch_device(embkv_store *s, const int64_t *ids, size_t n, void *dev_out, void *stream,
                           size_t *nmissing);
/* embkv_pull_ex into device memory (permits, waits, creation, admission
 * as embkv_pull_ex). */
int embkv_pull_device(embkv_session *ss, const int64_t *ids, size_t n, void *dev_out, void *stream, unsigned flags);
/* embkv_push of n x dim float32 gradients in device memory: the rows of
 * duplicate ids are summed on the GPU (in double, in the batch's order,
 * as embkv_push sums them), copied to pinned memory, and applied as
 * embkv_push applies them: the same result.  Waits for the stream's work
 * up to the sum. */
int embkv_push_device(embkv_session *ss, const int64_t *ids, size_t n, const void *dev_grads, void *stream,
                      double lr, size_t *nupdated);
/* Waits until every device gather of the store has completed; reports a
 * row an earlier gather found damaged (EMBKV_CORRUPT naming the id), as
 * the store's next device call would. */
int embkv_gpu_sync(embkv_store *s);

typedef struct embkv_train_stats {
    uint64_t pulls, pushes;      /* rows pulled / distinct rows pushed */
    uint64_t rows_created;       /* by the initializer */
    uint64_t permit_waits;       /* pulls that had to wait for a permit */
    uint64_t permit_timeouts;
    /* Admission (admit_count > 1): pulls of a missing id that did not
     * reach the count (its initial values returned, no row made), and
     * gradients of ids without a row dropped by pushes. */
    uint64_t admit_refused, admit_dropped;
    uint64_t admit_bytes;        /* DRAM of the counts */
    /* Eviction: passes run, rows evicted because they expired (ttl_ms,
     * ttl_steps) and because the table was over max_rows, rows a pass
     * would have evicted but kept because a pull holds them; the table's
     * step (pushes so far). */
    uint64_t evict_passes, evicted_expired, evicted_over, evict_kept;
    uint64_t steps;
} embkv_train_stats;
int embkv_train_stats_get(embkv_store *s, embkv_train_stats *st);

/* One eviction pass now (as the eviction thread runs them): expired rows
 * and, over max_rows, the lowest ranked rows down to max_rows exactly,
 * deleted in all tiers within one write group (a checkpoint holds the
 * whole pass or none of it).  What it did in *r (may be NULL).  A store
 * without eviction options evicts nothing.  A full pool holds a
 * tombstone for each row deleted since the last sync (embkv_delete): a
 * pass that runs out of them stops there, its other victims left for a
 * pass after the next sync (r->left). */
typedef struct embkv_evict_result {
    uint64_t scanned;            /* rows looked at */
    uint64_t expired, over;      /* rows evicted: expired, over max_rows */
    uint64_t kept;               /* victims kept: pulled and not yet pushed */
    uint64_t left;               /* victims not reached: the pool's room for tombstones ran out */
} embkv_evict_result;
int embkv_evict(embkv_store *s, embkv_evict_result *r);

#ifdef __cplusplus
}
#endif
#endif
