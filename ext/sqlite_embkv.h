/*
 * sqlite_embkv.h - shared declarations of the SQLite binding (ext/sqlite_*.c).
 * Every file of the binding but sqlite_ext.c uses SQLITE_EXTENSION_INIT3.
 */
#ifndef SQLITE_EMBKV_H
#define SQLITE_EMBKV_H

#include <sqlite3ext.h>
#include "embkv.h"

/* sqlite_vtab.c: the embkv module, embkv_stats() and the table functions. */
int embkv_vtab_register(sqlite3 *db);
/* sqlite_vecfn.c: vector functions, aggregates, embkv_version/embkv_build. */
int embkv_vecfn_register(sqlite3 *db);

#endif
