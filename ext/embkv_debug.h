/*
 * embkv_debug.h - introspection of the index for tests and benchmarks.
 * Not part of the stable API: these expose the PetHash layout and the permit
 * stripes so tests can craft collisions and check overflow counters.
 */
#ifndef EMBKV_DEBUG_H
#define EMBKV_DEBUG_H

#include "embkv.h"

uint64_t embkv_debug_nbuckets(embkv_store *s);
unsigned embkv_debug_slots_per_bucket(void);
/* Home bucket and probe step of an id under the current index size. */
uint64_t embkv_debug_home(embkv_store *s, int64_t id);
uint64_t embkv_debug_step(embkv_store *s, int64_t id);
/* Bucket the id is stored in; EMBKV_NOTFOUND when absent. */
int embkv_debug_bucket_of(embkv_store *s, int64_t id, uint64_t *bucket);
/* Overflow counter and number of occupied slots of a bucket. */
uint32_t embkv_debug_overflow(embkv_store *s, uint64_t bucket);
uint32_t embkv_debug_used(embkv_store *s, uint64_t bucket);
/* Buckets a lookup of id reads (present or absent). */
uint32_t embkv_debug_probes(embkv_store *s, int64_t id);
/* Staleness permits out on an id now (all sessions). */
unsigned embkv_debug_permits(embkv_store *s, int64_t id);
/* Halves every access-statistics counter now (as the sketch's own aging
 * does, all at once). */
void embkv_debug_heat_age(embkv_store *s);
/* Cached rows whose pulls skip the statistics' table, their counters
 * known saturated (0 without a cache). */
uint64_t embkv_debug_heat_stamped(embkv_store *s);
/* Touches of such rows counted without the table, so far. */
uint64_t embkv_debug_heat_skipped(embkv_store *s);
/* Stops (paused != 0) or resumes the SSD tier's thread: while stopped it
 * demotes, promotes and compacts nothing, as on a machine that gives it
 * no CPU; writers then demote (and compact) for themselves. */
void embkv_debug_tier_pause(embkv_store *s, int paused);
/* The process kills itself (SIGKILL) right after the nth change of an
 * index slot from now, any store's (n = 0: never): a row's location
 * changed (by a write, or by a move between the pool and the SSD log), or
 * a slot taken or freed (a crash between a write's change and whatever
 * the write does after it, or in the middle of a key's move). */
void embkv_debug_kill_after_index_writes(uint64_t n);
/* The next n syncs (any store's) fail after their epoch switch, as one
 * whose msync or fdatasync failed: the epoch is not durable, and its
 * versions are kept for recovery (n = 0: none). */
void embkv_debug_fail_syncs(uint64_t n);
/* Adds offset ms to the wall clock eviction reads (marks and expiry), in
 * every store of the process: a test's days pass at once. */
void embkv_debug_clock_ms(int64_t offset);
/* Stops (paused != 0) or resumes the store's eviction thread; embkv_evict
 * still runs passes. */
void embkv_debug_evict_pause(embkv_store *s, int paused);
/* The checkpoint marks in the pool's root whose check holds, by epoch
 * (at most cap: epochs[i], times_ms[i]); returns how many there are. */
size_t embkv_debug_marks(embkv_store *s, uint64_t *epochs, uint64_t *times_ms, size_t cap);
/* How long a reader process may hold back this process's writers'
 * reclamation before its read is revoked (0: the default, 10 s); taken by
 * stores opened to write from then on. */
void embkv_debug_reader_hold(uint64_t ms);
/* fn (NULL: none) is called with each segment file name an SSD log's open
 * lists, before it opens the file (dirfd: the log directory's): a test
 * changes the directory between the two, as a writer may. */
void embkv_debug_log_listed(void (*fn)(int dirfd, const char *name));
/* The searches of embkv_knn on s that used the map of the live records
 * kept from the search before (knn.c), skipping the pass over the index. */
uint64_t embkv_debug_knn_reused(embkv_store *s);
/* Of those, the searches whose stream found the kept map wrong (a record
 * failing its check, or the tallies differing) and ran again in index
 * order: 0 unless P11 is broken or the pool was damaged meanwhile. */
uint64_t embkv_debug_knn_kept_reruns(embkv_store *s);

/* The pool record of id's current version (its 32-byte header, the
 * encoded vector after it), or NULL when the row is not in the pool
 * (absent, deleted, cached, in the SSD log): a test damages it in place,
 * as the media would, and puts the bytes back. */
void *embkv_debug_record(embkv_store *s, int64_t id);
#endif
