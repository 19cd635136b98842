/*
 * embkv_sqlite.h - shared declarations of the SQLite binding (ext/sqlite/).
 * Every file of the binding but ext.c uses SQLITE_EXTENSION_INIT3.
 */
#ifndef SQLITE_EMBKV_H
#define SQLITE_EMBKV_H

#include <sqlite3ext.h>
#include "embkv.h"
#include <cjson/cJSON.h>

/* The embkv virtual table module, the embkv_pending module, embkv_stats()
 * and embkv_checkpoint() (vtab.c, cursor.c, values.c,
 * txn.c, registry.c, pending.c, stats.c; their
 * private declarations are in binding.h). */
int embkv_vtab_register(sqlite3 *db);

/* Options of an embkv virtual table, the key=value arguments of
 * CREATE VIRTUAL TABLE t USING embkv(...).  Adding an option is a field here
 * and one line in ek_options[] (vtab.c; EKO_CUSTOM takes a parser
 * for enumerations, doubles and the like). */
typedef struct embkv_tabopts {
    uint32_t dim;          /* dim: floats per vector (required, 1..8192) */
    const char *path;      /* path: the store directory as written, NULL when defaulted */
    uint64_t pool_size;    /* pool_size: pool file bytes (0: the engine's default) */
    uint64_t capacity;     /* capacity: expected rows (0: the engine's default) */
    /* optimizer, lr, initial_accumulator, eps, beta1, beta2, init, seed,
     * staleness, wait_ms: the training options (train.c) */
    embkv_train_options train;
    uint64_t ssd_size;     /* ssd_size: the SSD tier's bytes (0: none, or the store's) */
    const char *ssd_path;  /* ssd_path: its directory as written, NULL: <store>/log */
    uint64_t cache_size;   /* cache_size: the DRAM cache's bytes (0: none) */
    uint32_t migrate;      /* migrate: 1 for 'auto' (background hot-set migration), 0 for 'off' */
    uint64_t migrate_rate; /* migrate_rate: its bound in moves per second (0: not given) */
} embkv_tabopts;

/* The store's table options, beside it (vtab.c writes and reads it; an
 * embkv_backup carries it to the copy). */
#define OPTS_FILE "app-sqlite-options"

/* An embkv table of a connection, as embkv_table_lookup() resolves it. */
typedef struct embkv_table_ref {
    embkv_store *store;          /* the table's open store (shared in the process) */
    const embkv_tabopts *opts;   /* its options */
    const char *schema;          /* "main", "temp", or an attached schema */
    const char *name;            /* the table's current name */
    const char *dir;             /* the store's canonical directory */
    size_t pending_writes;       /* rows this connection's open transaction wrote
                                  * to the table and has not committed yet: they
                                  * are not in the store */
    embkv_session *session;      /* this connection's training session on the
                                  * table (opened on the first lookup, closed
                                  * with the table instance, which returns its
                                  * permits); NULL when the store is not
                                  * configured for training, embkv_errmsg()
                                  * then saying why */
} embkv_table_ref;

/* Resolves `table` ("name" or "schema.name", searched like SQLite does: temp,
 * main, then attached schemas) to an embkv table of connection db, connecting
 * it if needed.  For SQL functions that take a table name (embkv_stats,
 * embkv_checkpoint, the training functions): everything in *out stays valid
 * until the table is disconnected, so use it within the current SQL function
 * call only.  Returns SQLITE_OK, or SQLITE_ERROR with *pzErr (sqlite3_malloc'd,
 * may be NULL) naming the table when there is no such table or it is not an
 * embkv table. */
int embkv_table_lookup(sqlite3 *db, const char *table, embkv_table_ref *out, char **pzErr);
/* train.c: embkv_pull, embkv_push, embkv_release; and the parsers
 * of the training options (0 when the value is valid). */
int embkv_train_register(sqlite3 *db);
/* An ids argument (an int64 BLOB, a JSON array of integers or one integer)
 * as an array (sqlite3_malloc'd, *n entries); NULL with an error message in
 * *err (sqlite3_malloc'd) when it is not one of the forms, NULL with *err
 * NULL when out of memory. */
int64_t *ek_parse_ids(sqlite3_value *v, size_t *n, char **err);
/* heat.c: embkv_heat (a table-valued function) and embkv_hotset. */
int embkv_heat_register(sqlite3 *db);
/* export.c: embkv_export and embkv_import (a portable file of every row
 * with its clock and optimizer state). */
int embkv_export_register(sqlite3 *db);
int embkv_parse_optimizer(const char *val, void *field);
int embkv_parse_init(const char *val, void *field);
int embkv_parse_staleness(const char *val, void *field);
int embkv_parse_positive(const char *val, void *field);
int embkv_parse_nonnegative(const char *val, void *field);
int embkv_parse_unit(const char *val, void *field);
/* Fills the defaults the options start from / completes them after parsing. */
void embkv_train_opts_begin(embkv_train_options *t);
void embkv_train_opts_end(embkv_train_options *t);

/* vecfn.c: vector functions, aggregates, embkv_version/embkv_build. */
int embkv_vecfn_register(sqlite3 *db);

/* values.c: the one JSON and number reader of the binding (vectors, ids,
 * gradients, options).  ek_json_number: the length of the JSON number at p
 * (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), 0 when there is none.
 * ek_json_parse: n bytes of text holding one JSON value and nothing else but
 * white space, no NUL byte, every number as JSON writes it ('01', '1.',
 * '+1', '0x10' are not); NULL otherwise. */
size_t ek_json_number(const char *p);
/* The offset of the first number in s[0, n) that is not JSON's, or SIZE_MAX. */
size_t ek_json_bad_number(const char *s, size_t n);
cJSON *ek_json_parse(const char *s, size_t n);

#endif
