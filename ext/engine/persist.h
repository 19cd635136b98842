/*
 * persist.h - layer 1: how bytes reach the media.
 *
 * Flushes and barriers (persist_range marks pages for the next sync on a
 * mapped file, flushes cache lines on persistent memory), the record
 * checksum, the dirty map that lets recovery visit only what changed
 * since the durable epoch, and the crash points the tests arm.  The SSD
 * log's segment files are the other medium of this layer (log.h).
 */
#ifndef EMBKV_PERSIST_H
#define EMBKV_PERSIST_H

#include "handle.h"

/* [addr, addr+len) of the pool is to be durable at the next sync: flushed
 * now on persistent memory, its pages marked in the current epoch's bitmap
 * otherwise.  Any thread; no lock. */
void persist_range(embkv_store *s, const void *addr, size_t len);
/* As persist_range, into the bitmap of epoch (the epoch a sync is closing,
 * after its switch: its flush writes the range with the epoch's pages). */
void persist_range_in(embkv_store *s, const void *addr, size_t len, uint64_t epoch);
/* Orders the flushes before it ahead of the stores after it (drains on
 * persistent memory; nothing on a mapped file, whose order is the sync's). */
void persist_barrier(embkv_store *s);
/* The checksum of a record's header fields and floats (rec_hdr.check). */
uint32_t rec_checksum(const embkv_store *s, const rec_hdr *r);
/* EMBKV_CORRUPT with the message naming id's damaged record. */
int rec_damaged(const embkv_store *s, int64_t id);

/* The dirty map.  dirty[] lives in DIRTY_FILE (a shared mapping,
 * so it survives a killed process); dirtymap_open sets *usable when the
 * file's bitmaps describe this pool since its durable epoch (recovery may
 * then visit only the buckets on marked pages), and falls back to DRAM
 * bitmaps (usable false) when the file cannot be used. */
int dirtymap_open(embkv_store *s, bool *usable);
void dirtymap_close(embkv_store *s);
/* Index bucket bk (in the pool) changed in the current epoch: beside
 * persist_range, wherever a slot, its used bit or an overflow counter
 * changes (P4). */
void mark_bucket(embkv_store *s, const void *bk);
/* Writes every page marked in bitmap bm (s->dirty[e & 1] of the epoch e
 * being synced) to the file: one run of pages by an msync, more by one
 * fdatasync of the pool file; the bits stay until dirtymap_clear_epoch.
 * EMBKV_IO naming the pool on a failure. */
int dirtymap_flush(embkv_store *s, atomic_uint_fast64_t *bm);
/* Epoch e is durable: its page and bucket bitmaps and its tally cleared. */
void dirtymap_clear_epoch(embkv_store *s, uint64_t e);
/* Whether bucket bk was changed since the durable epoch. */
bool dirtymap_marked(const embkv_store *s, const void *bk);
/* After recovery: the pool is as of its durable epoch, nothing marked. */
void dirtymap_reset(embkv_store *s);

/* The crash point of embkv_debug_kill_after_index_writes (debug.c): called
 * right after an index slot changes, it costs one load while unarmed. */
extern _Atomic uint64_t embkv__kill_countdown;
void debug_index_written(void);
static inline void debug_index_point(void)
{
    if (__builtin_expect(atomic_load_explicit(&embkv__kill_countdown, memory_order_relaxed) != 0, 0))
        debug_index_written();
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

/* ------------------------------------------------------------- readers.c */
/* The reader table (readers.c has the rules R1-R3).  The writer's side:
 * attach at open (generation odd, readers of the last writer revoked, its
 * slots counted in reclamation), ready once open, detach at close. */
int readers_attach_writer(embkv_store *s);
void readers_writer_ready(embkv_store *s);
/* Whether a reader process is in an epoch now (an unrevoked slot). */
bool readers_active(embkv_store *s);
void readers_detach(embkv_store *s);
/* A reader process's side: maps the table (s->readers). */
int readers_attach_reader(embkv_store *s);
/* A live process (not this one) that has the store in dir open to read,
 * or 0 (embkv_destroy). */
long readers_live_reader(const char *dir);
/* The live writer's pid, or 0. */
long readers_writer_pid(const embkv_store *s);
/* A reader thread's epoch on s: rd_enter (nests; waits while a writer
 * opens the store; *first: not nested), rd_valid after copying rows out (false: revoked or
 * the writer reopened: R2, R3; rd_invalid gives the error), rd_leave. */
int rd_enter(embkv_store *s, bool *first);
bool rd_valid(embkv_store *s);
int rd_invalid(embkv_store *s);
void rd_leave(embkv_store *s);
/* A reader's scan pin (inside its slot): the writer moves no row between
 * buckets meanwhile.  rd_pin_failed records a pin whose entry failed;
 * rd_unpin returns false for it (nothing to leave). */
void rd_pin(embkv_store *s);
void rd_pin_failed(embkv_store *s);
bool rd_unpin(embkv_store *s);
/* The writer around a move between buckets: true when a reader's scan
 * pin forbids it (readers_move_end in both cases). */
bool readers_move_begin(embkv_store *s);
void readers_move_end(embkv_store *s);
/* Where the index's move_seq lives when readers may look (NULL: none). */
atomic_uint_fast64_t *readers_move_seq(embkv_store *s);
/* The writer around a change of the root's index fields; a reader reads
 * them consistently with readers_ix_read. */
void readers_ix_begin(embkv_store *s);
void readers_ix_end(embkv_store *s);
void readers_ix_read(embkv_store *s, uint64_t *off, uint64_t *nbuckets);
/* EMBKV_READONLY naming fn: what a reader process's handle (s->reader)
 * answers every function that would change the store. */
int rd_refuse(embkv_store *s, const char *fn);
/* A handle whose opening process is not this one came through fork(): its
 * DRAM state (allocator, epochs, locks) is a copy of the parent's while the
 * pool's mapping is shared with it, so a write would damage the store and
 * a read is unprotected from the parent's reuse of records.  Every entry
 * point refuses it: EMBKV_READONLY naming fn and both processes. */
int fork_refused(embkv_store *s, const char *fn);
/* Update callbacks (embkv_update_batch's fn) running in this thread: the
 * batch holds its rows' key locks (stripes of ids), the writer lock shared,
 * an epoch and a write group, so a call from the callback that takes a key
 * lock, the writer lock exclusively, or waits for the epochs or the groups
 * could wait for its own thread.  write.c counts them around each call. */
extern _Thread_local unsigned update_fn_depth;
/* EMBKV_BUSY naming fn: what a store call that could wait for the batch
 * around it answers inside an update callback (CALLBACK_REFUSE). */
int callback_refused(embkv_store *s, const char *fn);
#define CALLBACK_REFUSE(s, fn)                                                                                       \
    do {                                                                                                             \
        if (update_fn_depth)                                                                                         \
            return callback_refused((s), (fn));                                                                      \
    } while (0)
/* Whether s was opened by another process (inherited through fork()). */
static inline bool handle_forked(const embkv_store *s) { return (long)s->pid != proc_pid(); }
#define FORK_REFUSE(s, fn)                                                                                           \
    do {                                                                                                             \
        if ((s) && handle_forked(s))                                                                                 \
            return fork_refused((s), (fn));                                                                          \
    } while (0)
/* The gate of every function that changes the store (none runs inside an
 * update callback: CALLBACK_REFUSE). */
#define RO_REFUSE(s, fn)                                                                                             \
    do {                                                                                                             \
        FORK_REFUSE(s, fn);                                                                                          \
        CALLBACK_REFUSE(s, fn);                                                                                      \
        if ((s) && (s)->reader)                                                                                      \
            return rd_refuse((s), (fn));                                                                             \
    } while (0)

#endif
