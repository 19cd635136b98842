/*
 * base.h - layer 0 of the engine: what every file may use.
 *
 * Errors (errmsg.c), the reader epochs of the process (epoch.c), the id
 * hash, the clock, growable vectors and the distinct ids of a batch
 * (util.c), the element types of vectors (dtype.c).  Nothing here knows a store's layout.
 *
 * The engine is layered and calls go down: a file may call the files of
 * lower layers and those listed before it in its own layer, never one
 * above, and includes the headers of its own layer and those below.  The
 * list below is the one place the order is written: `make check-layers`
 * (tests/check_layers.py) checks every object's undefined symbols (nm)
 * and every file's includes against it.  A new file goes into the layer
 * it belongs to; one that needs something from above means the shared
 * piece belongs lower.
 *
 * LAYERS (bottom to top; headers first, then the files in calling order):
 *   base.h format.h handle.h gpudrv.h | errmsg.c epoch.c util.c dtype.c gpudrv.c
 *   persist.h log.h | persist.c log.c readers.c
 *   index.h | pethash.c slab.c knnlog.c snapshot.c
 *   heat.h tiers.h | heat.c cache.c lookahead.c compact.c tier.c tier_worker.c
 *   ops.h batch.h | permits.c admit.c readonly.c write.c read.c scan.c knn.c hotset.c migrate.c evict.c gather.c train.c
 *   top.h | stats.c recover.c sync.c store.c backup.c debug.c
 *
 * Layer 0 (this line's headers): base.h, errors, epochs, util; format.h,
 * the on-media layout and the invariants P1-P11; handle.h, the store
 * handle.  1: persistence and the SSD log's files.  2: the index, the
 * record space, snapshots.  3: the tiers.  4: the operations on rows.
 * 5: the store's moments and life.
 */
#ifndef EMBKV_BASE_H
#define EMBKV_BASE_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "embkv.h"

/* Seqlock fences.  ThreadSanitizer does not model fences; every field a
 * seqlock guards is accessed atomically, so its build can drop them. */
#ifdef EMBKV_TSAN
#define seq_fence(order) ((void)0)
#else
#define seq_fence(order) __atomic_thread_fence(order)
#endif

/* A full fence: the stores before it are seen by other threads before the
 * loads after it are made (the store-load order a Dekker handshake needs:
 * index.h, knn_note_change).  Under ThreadSanitizer a sequentially
 * consistent read-modify-write of a dummy instead, which it accepts and
 * which orders the same on x86-64. */
#ifdef EMBKV_TSAN
extern atomic_int embkv__fence_dummy;
#define full_fence() ((void)atomic_fetch_add(&embkv__fence_dummy, 0))
#else
#define full_fence() atomic_thread_fence(memory_order_seq_cst)
#endif

/* ------------------------------------------------------------ errmsg.c */
/* Records the message of the calling thread's last error (embkv_errmsg)
 * and returns rc. */
int embkv__err(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* EMBKV_INVALID for function fn naming the first of its pointer arguments
 * that is NULL: pairs of (const char *name, const void *value), ended by
 * a NULL name.  The caller's test decides which may be NULL; this names
 * the one at fault. */
int embkv__null_arg(const char *fn, ...);
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
/* Readers of other processes (readers.c): oldest publishes `now` to them
 * and returns the oldest epoch one may still be in (now when none);
 * wait returns once none is in an epoch below target.  Both may give up
 * on a reader that holds its epoch too long (it is revoked, and fails
 * its statement). */
typedef struct ebr_foreign {
    struct ebr_foreign *next;
    uint64_t (*oldest)(struct ebr_foreign *f, uint64_t now);
    void (*wait)(struct ebr_foreign *f, uint64_t target);
} ebr_foreign;
void ebr_foreign_add(ebr_foreign *f);
/* Waits until no reader of another process is in an epoch older than now
 * (each at most its wait bound: readers.c R2); this process's readers are
 * not waited for. */
void ebr_synchronize_foreign(void);
void ebr_foreign_remove(ebr_foreign *f);
/* Raises the global epoch to at least e (a writer taking over a reader
 * table whose readers hold epochs of an earlier writer). */
void ebr_advance_to(uint64_t e);

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

/* ------------------------------------------------------------ util.c */
/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t now_ns(void);
/* This process's id, without a system call: cached, and reset in the child
 * of a fork (pthread_atfork, registered at the first call).  A store
 * handle records it at its open; a handle whose pid is not this one was
 * inherited through fork() (fork_refused). */
long proc_pid(void);
/* The blocks of a file's first len bytes allocated (its size at least
 * len), before it is mapped to be written: on a full file system an
 * error (its errno) here, not a SIGBUS at a write into the map.  0 also
 * where the file system cannot allocate ahead (nothing more is done). */
int file_reserve(int fd, uint64_t len);
/* A condition variable's deadline ms from now (CLOCK_REALTIME: their
 * default clock; the background threads' ticks). */
struct timespec deadline_after_ms(long ms);

typedef struct locvec {
    uint64_t *v;
    size_t n, cap;
} locvec;

/* EMBKV_OK, or EMBKV_NOMEM (v unchanged). */
int locvec_push(locvec *v, uint64_t x);
/* Whether a directory above the absolute path abs (not abs itself, which
 * need not exist) holds a file called name; *found gets the first such
 * directory, nearest first.  (A store's directory holds only its own
 * files: no store, backup or log goes inside another's.) */
bool path_below_file(const char *abs, const char *name, char *found, size_t len);
/* The absolute path abs with links and ".." resolved as far as it exists
 * (the rest appended as given); false when it cannot be. */
bool path_resolve(const char *abs, char *out, size_t len);
/* The distinct ids of a batch in first-seen order, uniq[0..*nu),
 * and for each position i, slot_of[i] = its index in uniq (slot_of may be
 * NULL).  EMBKV_NOMEM when the scratch table cannot be had. */
int ids_distinct(const int64_t *ids, size_t n, int64_t *uniq, size_t *slot_of, size_t *nu);

/* ------------------------------------------------------------ dtype.c */
/* Bytes of a vector of dim elements of dtype as a record keeps it (a
 * multiple of 4: the optimizer state after it is float32). */
static inline uint32_t dtype_vec_bytes(int dtype, uint32_t dim)
{
    switch (dtype) {
    case EMBKV_F16:
    case EMBKV_BF16: return (2 * dim + 3) & ~3u;
    case EMBKV_I8: return (8 + dim + 3) & ~3u;
    default: return 4 * dim;
    }
}
/* The largest magnitude dtype holds (i8: float32's). */
float dtype_max(int dtype);
const char *dtype_name(int dtype);
/* dim float32 from a vector encoded as dtype; false when the encoding is
 * none a write leaves (an f16 or bf16 Inf or NaN, an i8 scale or bias not
 * finite: a damaged record, decoded as far as it goes). */
bool dtype_decode(int dtype, uint32_t dim, const void *src, float *dst);
/* Encodes dim float32 as dtype: rounded to nearest (seed NULL) or
 * stochastically from *seed.  Returns 0, or j + 1 for an element j that
 * dtype cannot hold (beyond its range; nothing is to be kept then). */
uint32_t dtype_encode(int dtype, uint32_t dim, const float *src, void *dst, const uint64_t *seed);

#endif
