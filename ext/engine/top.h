/*
 * top.h - layer 5: the store's moments and its life.
 *
 * stats.c: statistics and the consistency check; recover.c: crash
 * recovery; sync.c: the checkpoint (sync) and the moment a snapshot is fixed;
 * store.c: open, create, recover, close, destroy; backup.c: online backup
 * into a new store; debug.c: the tests' introspection.
 */
#ifndef EMBKV_TOP_H
#define EMBKV_TOP_H

#include "ops.h"

/* ------------------------------------------------------------- recover.c */
/* Rolls every row of ix back to its version as of the durable epoch (P5);
 * marked: only the buckets the dirty map marked.  *unknown counts the rows
 * left on a record that could not be read.  At open, single-threaded. */
int recover_rows(embkv_store *s, index_desc *ix, bool marked, uint64_t *unknown);
/* Removes the index entries of tombstones whose deletion is durable (a
 * sync keeps them while reader processes may read an older checkpoint:
 * sync.c; a crash may leave them).  Chunks mapped; at open, single-
 * threaded; returns how many went. */
size_t recover_tombstones(embkv_store *s, index_desc *ix);
/* s->rows and s->entries from the index (and the log's rows). */
void recover_count(embkv_store *s, index_desc *ix);

/* ------------------------------------------------------------- sync.c */
/* embkv_sync that also fixes snap (registered, not fixed) at its epoch
 * switch: snap then sees exactly what the sync made durable, the epoch
 * *durable (may be NULL). */
int sync_fixing(embkv_store *s, embkv_snapshot *snap, uint64_t *durable);
/* Purges the tombstones kept for reader processes (the close, before its
 * last sync). */
void sync_purge_deferred(embkv_store *s);

/* ------------------------------------------------------------- store.c */
/* embkv_close for a reference the engine took itself (a backup's): inside
 * the calling thread's write group only the last reference is refused, as
 * dropping another changes nothing the group uses. */
int store_release(embkv_store *s);

#endif
