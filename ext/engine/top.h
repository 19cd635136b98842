/*
 * top.h - layer 5: the store's moments and its life.
 *
 * sync.c: the checkpoint (sync) and the moment a snapshot is fixed;
 * store.c: open, create, recover, close, destroy; backup.c: online backup
 * into a new store; debug.c: the tests' introspection.
 */
#ifndef EMBKV_TOP_H
#define EMBKV_TOP_H

#include "ops.h"

/* ------------------------------------------------------------- sync.c */
/* embkv_sync that also fixes snap (registered, not fixed) at its epoch
 * switch: snap then sees exactly what the sync made durable, the epoch
 * *durable (may be NULL). */
int sync_fixing(embkv_store *s, embkv_snapshot *snap, uint64_t *durable);

#endif
