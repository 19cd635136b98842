/*
 * binding.h - the SQLite binding's objects and the functions its files
 * export to each other (ext/sqlite/), and the order of its layers.
 *
 * Why one header, in this order: every layer of the binding handles the
 * same few objects (errors.c sets an ekvtab's message, values.c reads its
 * dim, registry.c keeps a connection's ekvtab list, the module builds them),
 * so the objects come first, as SQLite's sqliteInt.h declares its structs
 * before the layers' headers; then one section per file, in the order of
 * the layers below, so that a file's section comes after those of the
 * files it uses.  The SQL functions that only need a table by name do not
 * touch these objects: they go through embkv_table_lookup (stats.c).
 *
 * The layers, bottom up: what needs nothing of the binding but this header
 * (the transaction buffer, error reporting, a directory's list of tables,
 * the readers of SQL values, the removal of what killed processes left;
 * values.c reports through errors.c, leftovers.c reads dirusers.c's
 * list); the registry of open stores and connections, which frees
 * everything a connection holds; the parts the module is made of (cursors,
 * write buffers, the table lookup, removals tied to the transaction); the
 * SQL interfaces (the functions and the module); the entry point.  A file
 * calls only files of lower layers and those before it in its own.  The
 * block below is the one place this order is written, kept in a form a
 * check can read.  Every file uses sqlite3_api, which ext.c defines
 * (SQLITE_EXTENSION_INIT1) while it calls every register function: the
 * usual form of an extension, not a use of a higher layer.
 *
 * Every file of the binding but ext.c uses SQLITE_EXTENSION_INIT3.
 */
/* LAYERS (bottom to top; a file may use files of lower lines and those before it on its own line):
 *   binding.h
 *   txn.c errors.c dirusers.c values.c leftovers.c
 *   registry.c
 *   journal.c commitseq.c cursor.c wbuf.c stats.c pending.c
 *   vecfn.c train.c direct.c heat.c knn.c export.c vtab.c
 *   ext.c
 */
#ifndef EMBKV_BINDING_H
#define EMBKV_BINDING_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>
#include <sqlite3ext.h>

#include "embkv.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "embkv stores vectors as little-endian float32 BLOBs: a little-endian host is required"
#endif

/* ========================================================================
 * The objects
 */
typedef struct ekconn ekconn;
typedef struct ekvtab ekvtab;
typedef struct ektxn ektxn;   /* txn.c's, opaque */
typedef struct ekseq ekseq;   /* commitseq.c's, opaque */

/* Options of an embkv virtual table, the key=value arguments of
 * CREATE VIRTUAL TABLE t USING embkv(...).  Adding an option is a field here
 * and one line in ek_options[] (vtab.c; EKO_CUSTOM takes a parser
 * for enumerations, doubles and the like). */
typedef struct embkv_tabopts {
    uint32_t dim;          /* dim: floats per vector (required, 1..8192) */
    uint32_t dtype;        /* dtype: EMBKV_F32.. as given, 0 when not (the store's; f32 for a new one) */
    const char *path;      /* path: the store directory as written, NULL when defaulted */
    uint64_t pool_size;    /* pool_size: pool file bytes (0: the engine's default) */
    uint64_t capacity;     /* capacity: expected rows (0: the engine's default) */
    /* optimizer, lr, initial_accumulator, eps, beta1, beta2, init, seed,
     * staleness, wait_ms: the training options (values.c parses them) */
    embkv_train_options train;
    uint64_t ssd_size;     /* ssd_size: the SSD tier's bytes (0: none, or the store's) */
    const char *ssd_path;  /* ssd_path: its directory as written, NULL: <store>/log */
    uint64_t cache_size;   /* cache_size: the DRAM cache's bytes (0: none) */
    uint32_t migrate;      /* migrate: 1 for 'auto' (background hot-set migration), 0 for 'off' */
    uint64_t migrate_rate; /* migrate_rate: its bound in moves per second (0: not given) */
    uint32_t durable;      /* durable: 1 for 'checkpoint' (a close does not checkpoint), 0 for 'close' */
} embkv_tabopts;

/* The store's table options, beside it (vtab.c writes and reads it; an
 * embkv_backup carries it to the copy). */
#define OPTS_FILE "app-sqlite-options"
/* The pool's id (embkv_store_id) as the store's first CREATE found it, and
 * a check: a file of its own, so that a build that does not know it reads
 * the options file as before. */
#define STORE_ID_FILE "app-sqlite-store-id"

/* One change of a transaction write buffer (txn.c). */
enum { EKTXN_PUT = 1, EKTXN_DEL = 2 };
enum { EKTXN_FRESH = 1, EKTXN_FRESH_NEW = 2 };  /* ektxn_entry.fresh */

typedef struct ektxn_entry {
    int64_t id;
    uint8_t used;
    uint8_t kind;   /* EKTXN_PUT or EKTXN_DEL */
    uint8_t fresh;  /* PUT of a row (re)created in this transaction: COMMIT
                     * deletes any committed row of that id first, so the row
                     * starts anew (clock 0, zero optimizer state).
                     * EKTXN_FRESH_NEW: an INSERT of an id the store did not
                     * have; COMMIT fails if it has one by then (another
                     * connection inserted it, or a pull created it).
                     * On a DEL, EKTXN_FRESH_NEW: the row was such an INSERT
                     * of this transaction, and COMMIT writes nothing */
    float *vec;     /* PUT: dim floats */
} ektxn_entry;

/* One connection's write buffer for one store (wbuf.c), shared by
 * every instance of that connection whose table is on that store: two
 * tables attached to one store, and the instance SQLite connects anew
 * after a schema change is rolled back while the old one still takes part
 * in the transaction.  So the transaction methods may each run once per
 * sharing instance: the first xBegin starts the transaction, the first
 * xSync writes the buffer, and the others find nothing left to do
 * (savepoint calls are idempotent).  It belongs to the connection and
 * holds its own reference to the store: the writes of a table dropped in
 * the transaction outlive its instances until the transaction ends. */
typedef struct ekwbuf {
    struct ekwbuf *next;  /* the connection's list */
    int refs;             /* instances using it */
    char *dir;            /* the store's canonical directory */
    embkv_store *store;
    ektxn *txn;
    int in_txn;           /* an xBegin came and the transaction has not ended */
    int synced;           /* xSync wrote txn to the store; xCommit/xRollback follow */
    int jslot, jfd;       /* the COMMIT's journal slot and file (journal.c), -1 when none */
    uint64_t jtoken;      /* its token */
    char jtid[16];        /* the stable id of the table whose record holds it */
    /* The COMMIT's numbers (commitseq.c): one per table of the connection
     * on the store, with the number before it; in flight from the store
     * write to the COMMIT's end. */
#define EK_SEQ_TABLES 16
    struct { ekseq *e; uint64_t n, prev; } seqs[EK_SEQ_TABLES];
    int nseq, seq_inflight;
} ekwbuf;

/* A cursor's buffers (cursor.c). */
typedef struct ekcurbuf {
    int64_t *ids;          /* candidate ids */
    size_t capids;
    size_t capchunk;       /* allocated rows of the buffers below */
    float *vecs;           /* capchunk rows of dim floats */
    uint8_t *st;           /* per loaded row: 0 absent, 1 committed, 2 uncommitted */
    uint8_t *found;
    size_t *eidx;          /* rows of the chunk read from the store */
    int64_t *eids;
    float *evecs;
    embkv_rowinfo *infos;  /* per loaded row: its clock and tier (st 1) */
    embkv_rowinfo *einfos;
    int *tiers;            /* embkv_locate_batch_at's, for ids-only plans */
} ekcurbuf;

/* A table as a store's list of users names it (dirusers.c): its stable
 * id, and the database file holding it (device and inode; 0 0 for a
 * database without a file). */
typedef struct ekuser {
    char tid[17];
    unsigned long long dev, ino;
    int known;  /* 0: a line written before file identities were kept */
} ekuser;

/* A directory removal waiting for the outcome of the transaction
 * (pending.c). */
enum { EK_ON_COMMIT = 1, EK_ON_ROLLBACK = 2 };
typedef struct ekpend {
    int when;       /* EK_ON_COMMIT, EK_ON_ROLLBACK or both */
    int consumed;   /* set by embkv_pending's xUpdate */
    char *dir;
    char tid[17];   /* the temporary directory's id, or with unlist the table's */
    ekuser who;     /* with unlist: the table and its file */
    int unlist;     /* take `who` off dir's list of tables (dirusers.c),
                     * and remove dir if that leaves the list empty, or if
                     * dir has no list and `owner` (the table made it) */
    int owner;
} ekpend;

/* Per-connection state (registry.c), shared by the modules and functions
 * registered on one sqlite3 connection; reference counted (registrations,
 * tables). */
struct ekconn {
    sqlite3 *db;
    int refs;
    ekconn *next;
    ekvtab *tabs;
    char (*tids)[17];     /* temporary directories this connection references */
    int ntids, captids;
    ekpend *pend;         /* removals waiting for the transaction's outcome */
    int npend, cappend;
    int *pmark;           /* savepoint marks over pend */
    int pnsp, cappmark;
    ekpend *staged;       /* the row our nested INSERT is writing */
    ekwbuf *wbufs;        /* write buffers, one per store (wbuf.c) */
    long pid;             /* the process that opened the connection: a
                           * fork's child may not commit through it (its
                           * journal slots are the parent's; the engine
                           * refuses the child every use of the store) */
};

/* The virtual table instance (vtab.c): one per table per connection. */
struct ekvtab {
    sqlite3_vtab base;
    sqlite3 *db;
    ekconn *conn;         /* per-connection state (holds a reference) */
    ekvtab *next;         /* conn's list of connected tables */
    char *zDb;            /* schema: "main", "temp", ... */
    char *zName;          /* current table name */
    char tid[17];         /* stable id: 16 hex digits, kept in <name>_config */
    ekuser who;           /* tid and its database file, as store lists say it */
    int is_tmp;           /* store in a temporary directory (:memory:/temp db) */
    int owns_dir;         /* the CREATE made the directory: DROP removes it */
    char opts_check[17];  /* the store's options check: as read or written (store_options), and as
                           * its CREATE recorded it in <name>_config ("" when not recorded) */
    char opts_recorded[17];
    char store_recorded[17]; /* the store's id (its pool's) as its CREATE recorded it in <name>_config ("": not) */
    embkv_tabopts opts;
    uint64_t given;       /* options written in its CREATE (bit j: ek_options[j]) */
    char *optpath;        /* storage of opts.path */
    char *optssd;         /* storage of opts.ssd_path */
    embkv_store *store;
    char *dir;            /* the store's canonical directory */
    uint32_t dim, state_floats;
    ekwbuf *wb;           /* this connection's uncommitted writes to the store */
    ektxn *txn;           /* wb->txn */
    int joined;           /* in the open transaction (xBegin came) */
    ekseq *seq;           /* the process's COMMIT numbers of the table (commitseq.c), NULL until one */
    uint64_t seq_seen;    /* the number this instance's read transaction last found in its shadow table */
    float *scratch;       /* dim floats */
    embkv_session *session; /* training session, see embkv_table_ref */
    int evict_writer;     /* counted as a writer by ekreg_train_configure */
    uint32_t dtype;       /* the store's element type (EMBKV_F32...) */
    ekcurbuf spare;       /* buffers of the last closed cursor, for the next */
    int has_spare;
    char *gone;           /* set when the CREATE that made this instance was
                           * rolled back while SQLite keeps it (a cached
                           * statement): why the functions must not use it */
    char *broken;         /* why the store could not be opened at connect
                           * (NULL when open); see vt_init */
    int broken_rc;        /* the SQLite code every use but DROP answers
                           * then: SQLITE_CORRUPT for damage, SQLITE_CANTOPEN
                           * for a directory that holds no store of this
                           * version, SQLITE_ERROR for a refusal */
};

enum { COL_ID = 0, COL_VEC = 1, COL_CLOCK = 2, COL_TIER = 3 };
enum { PLAN_POINT = 1, PLAN_IN = 2, PLAN_SCAN = 3 };

static inline int ek_is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* ========================================================================
 * txn.c: one connection's private write buffer for one table.
 *
 * Maps id -> pending new vector or deletion for the open transaction.  Reads
 * of the owning connection overlay it on the store; other connections never
 * see it.  Savepoints are an undo log over the map.  ektxn_apply() writes it
 * to the store at COMMIT, keeping pre-images so that a failure (or a
 * rollback after a successful xSync) can put the store back as it was.
 */
ektxn *ektxn_new(uint32_t dim, uint32_t state_floats);
void ektxn_free(ektxn *t);
/* Forget everything (the transaction ended); keeps some memory for reuse. */
void ektxn_clear(ektxn *t);
/* Number of ids with a pending change. */
size_t ektxn_count(const ektxn *t);
const ektxn_entry *ektxn_find(const ektxn *t, int64_t id);
/* Makes room so that the next k ektxn_set() calls cannot fail: reserve
 * first, then mutate, and a statement never leaves half a change behind.
 * SQLITE_OK or SQLITE_NOMEM. */
int ektxn_reserve(ektxn *t, size_t k);
/* Records a change (copies vec for PUT).  After ektxn_reserve it cannot
 * fail; SQLITE_NOMEM (nothing changed) otherwise. */
int ektxn_set(ektxn *t, int64_t id, int kind, int fresh, const float *vec);
/* Slots of the map, for iteration: ektxn_slot() is NULL for an empty one. */
size_t ektxn_nslots(const ektxn *t);
const ektxn_entry *ektxn_slot(const ektxn *t, size_t i);

/* SQLite's savepoint numbering (xSavepoint/xRelease/xRollbackTo). */
int ektxn_savepoint(ektxn *t, int n);
void ektxn_release(ektxn *t, int n);
void ektxn_rollback_to(ektxn *t, int n);

/* Called by ektxn_apply with every pre-image read and nothing written yet;
 * an error (embkv_rc, *msg sqlite3_malloc'd) fails the apply unwritten. */
typedef int (*ektxn_hook)(void *ctx, ektxn *t, char **msg);
/* Applies the buffer to the store (embkv_rc).  It first checks that the
 * store has room for every write (fail_id 0 when it has not) and reads the
 * pre-images, then calls before(ctx) when given, then writes.  On failure it
 * undoes what it had applied, sets *fail_id to the id that failed and *msg
 * to the engine's message (sqlite3_malloc'd); *msg also says so when putting
 * the previous rows back failed too (*restored 0). */
int ektxn_apply(ektxn *t, embkv_store *s, int64_t *fail_id, char **msg, int *restored, ektxn_hook before,
                void *ctx);
/* The pre-images of the last ektxn_apply (k < ektxn_npre): returns 0 for
 * a row that did not exist, 1 for one that did (*clock, *data: dim +
 * state_floats floats), 2 for a damaged row being deleted (no image);
 * *kind is the change (EKTXN_PUT, EKTXN_DEL) and *whash, for a PUT, the
 * ek_vec_hash of the vector as the store keeps it.  A row is put back
 * only while it is still as the apply left it (the last writer wins). */
size_t ektxn_npre(const ektxn *t);
int ektxn_pre(ektxn *t, embkv_store *s, size_t k, int64_t *id, uint64_t *clock, const float **data, int *kind,
              uint64_t *whash);
uint64_t ek_vec_hash(const float *v, uint32_t dim);
int ektxn_unapply(ektxn *t, embkv_store *s);
/* A row as embkv_get reads it (vec, state and info may be NULL; its rc,
 * EMBKV_NOTFOUND for an absent one), for the transaction's own
 * bookkeeping: not an access, so not counted in the access statistics nor
 * in the cache's hits and misses (a pre-image, a put-back's check). */
int ek_get_quiet(embkv_store *s, int64_t id, float *vec, float *state, embkv_rowinfo *info);

/* ========================================================================
 * errors.c
 */
/* Sets the table's error message: "embkv table <name>: <fmt...>". */
void ekerr_table(ekvtab *v, const char *fmt, ...);
/* The SQLite result code for an embkv_rc. */
int ekerr_rc(int erc);
/* Sets an eponymous table's error message (msg sqlite3_malloc'd, taken);
 * returns rc, or SQLITE_NOMEM when msg is NULL. */
int ekerr_vtab(sqlite3_vtab *pv, int rc, char *msg);
/* A table connected without its store can only be dropped: sets the
 * message and returns its code (broken_rc) for such a table, SQLITE_OK
 * for a table with its store. */
int ekerr_unusable(ekvtab *v);
/* The integer a value-less PRAGMA name returns (trusted_schema,
 * busy_timeout, query_only: settings SQLite has no C getter for), or
 * fallback when it cannot be read. */
int ek_pragma_int(sqlite3 *db, const char *name, int fallback);
/* fn for each schema of db (main, temp, the attached ones) until one
 * returns other than SQLITE_OK; that code, or SQLITE_OK. */
int ek_each_schema(sqlite3 *db, int (*fn)(sqlite3 *db, const char *schema, void *arg), void *arg);
/* Whether db's COMMIT in progress ends an autocommit statement that writes
 * (its failure undoes the statement) rather than a COMMIT (whose failure
 * keeps the transaction). */
int ek_in_write_statement(sqlite3 *db);
/* Why this connection may not change the tables of schema zDb (opened
 * read-only, a read-only attached file, PRAGMA query_only), or NULL. */
const char *ekerr_readonly(sqlite3 *db, const char *zDb);
/* For a SQL function fname that changes the store of table (in schema):
 * when the connection may not write, sets the function's error
 * (SQLITE_READONLY, naming the function, the table, the reason and `what`
 * the function would have changed) and returns 1; else 0. */
int ekerr_refuse_readonly(sqlite3_context *ctx, const char *fname, const char *schema, const char *table,
                          const char *what, embkv_store *store);

/* ========================================================================
 * dirusers.c: the tables using a store directory, listed in it, and who
 * may open it (invariants U1-U3 there).
 * ekusers_self: the entry of table tid of schema zDb (its database file's
 * identity).  ekusers_add (a CREATE): *made (the CREATE made the store):
 * start the list, unless a racing CREATE already started one (then *made
 * becomes 0 and it joins it); otherwise add to the list (starting one
 * marked external when the store has none); *listed says whether it went
 * in.  ekusers_admit (a connection): SQLITE_OK when the list names the
 * table for this file, or for another (a copy) and trust_copies, listing
 * this file then when list_copy; else SQLITE_ERROR with *err saying why
 * the table may not open the store and what to do (path: as the CREATE
 * that would attach it should name the store).
 * ekusers_remove: the number of entries left (an external store counts
 * one), -1 when dir has no list, -2 when it could not be updated.
 */
int ekusers_add(const char *dir, const ekuser *self, int *made, int *listed, char **err);
int ekusers_admit(const char *dir, const ekuser *self, const char *table, unsigned dim, const char *path, int readonly,
                  int trust_copies, int list_copy, char **err);
int ekusers_remove(const char *dir, const ekuser *self);
/* What ekusers_remove of each of gone would leave, the list unchanged. */
int ekusers_left_after(const char *dir, const ekuser *const *gone, int ngone);
void ekusers_self(sqlite3 *db, const char *zDb, const char *tid, ekuser *out);

/* 1 if dir's list names no table but tid (in any file) or dir has no list;
 * 0 if it names others, is external or cannot be read. */
int ekusers_none_but(const char *dir, const char *tid);

/* ========================================================================
 * values.c: the one JSON and number reader of the binding (vectors, ids,
 * gradients, options).  ek_json_number: the length of the JSON number at p
 * (-?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?), 0 when there is none.
 * ek_json_parse: n bytes of text holding one JSON value and nothing else but
 * white space, no NUL byte, every number as JSON writes it ('01', '1.',
 * '+1', '0x10' are not); NULL otherwise.
 */
size_t ek_json_number(const char *p);
/* The offset of the first number in s[0, n) that is not JSON's, or SIZE_MAX. */
size_t ek_json_bad_number(const char *s, size_t n);
cJSON *ek_json_parse(const char *s, size_t n);
/* 1 if the value is an id (INTEGER, integral REAL, integer TEXT). */
int value_to_id(sqlite3_value *val, int64_t *out);
/* The id of a write, or an error (message set) naming what was given. */
int write_id(ekvtab *v, sqlite3_value *val, int64_t *out);
/* A vector (BLOB or JSON array) into out (dim floats), or an error naming
 * the table and id. */
int parse_vec(ekvtab *v, int64_t id, sqlite3_value *val, float *out);
/* An ids argument (an int64 BLOB, a JSON array of integers or one integer)
 * as an array (sqlite3_malloc'd, *n entries); NULL with an error message in
 * *err (sqlite3_malloc'd) when it is not one of the forms, NULL with *err
 * NULL when out of memory. */
int64_t *ek_parse_ids(sqlite3_value *v, size_t *n, char **err);
/* The same, naming the other forms the caller takes after the JSON array
 * in the message for a text that is not one (ek_parse_ids: ", an int64
 * BLOB or an INTEGER"). */
int64_t *ek_parse_ids_or(sqlite3_value *v, size_t *n, char **err, const char *others);
/* The text of a name argument (a table, a file) when it is TEXT with no
 * NUL character inside (as a C string it would name a prefix of itself);
 * NULL otherwise, *nul telling which. */
const char *ek_name_arg(sqlite3_value *v, bool *nul);
#define EK_NAME_NUL "holds a NUL character: no table or file is named so"
/* The parsers of the training options (0 when the value is valid). */
int ek_parse_optimizer(const char *val, void *field);
int ek_parse_init(const char *val, void *field);
int ek_parse_admit(const char *val, void *field);
int ek_parse_ttl(const char *val, void *field);
void ek_format_ttl(uint64_t ms, char *buf, size_t n);
int ek_parse_evict(const char *val, void *field);
int ek_parse_dtype(const char *val, void *field);
int ek_parse_rounding(const char *val, void *field);
int ek_parse_positive(const char *val, void *field);
int ek_parse_nonnegative(const char *val, void *field);
int ek_parse_unit(const char *val, void *field);
/* Fills the defaults the options start from / completes them after parsing. */
void ek_parse_train_begin(embkv_train_options *t);
void ek_parse_train_end(embkv_train_options *t);

/* ========================================================================
 * leftovers.c: what killed processes left behind.  ekleft_sweep_db: the
 * default directories (<database file>-<id>.embkv) beside dbfile that no
 * table of schema zDb uses and no process has open: CREATEs that never
 * committed.  Called by the CREATE of table `creating`, which holds the
 * database's write lock.
 * ekleft_tmp_claim: marks a new temporary directory as this process's (an
 * flock held until the process ends: -1 or the descriptor to close after
 * removing it); ekleft_sweep_tmp: removes the temporary directories under
 * base whose process is gone (once per process).
 */
void ekleft_sweep_db(ekconn *c, const char *zDb, const char *creating, const char *dbfile);
int ekleft_tmp_claim(const char *dir);
void ekleft_sweep_tmp(const char *base);

/* ========================================================================
 * registry.c
 */
/* Keeps the extension's shared object loaded until the process exits. */
void ekreg_pin_library(void);

/* The state of a connection (struct ekconn). */
ekconn *ekconn_get(sqlite3 *db);   /* find or create, +1 reference */
void ekconn_ref(ekconn *c);
void ekconn_unref(ekconn *c);
void ekconn_unref_v(void *c);      /* for SQLite destructors */
void ekconn_add(ekconn *c, ekvtab *v);
void ekconn_remove(ekconn *c, ekvtab *v);
ekconn *ekconn_of(sqlite3 *db);   /* the state of a connection, or NULL */
/* What a connection holds, freed by its last ekconn_unref: its pending
 * removals (pending.c also clears them when the transaction ends) and its
 * write buffers (wbuf.c also frees one when the last of its tables lets
 * go of it). */
void ekconn_pend_clear(ekconn *c);
void ekreg_free_wbuf(ekwbuf *wb);
void ekconn_free_wbufs(ekconn *c);

/* Opens a store and counts the binding's references per canonical
 * directory (embkv_open itself shares one handle per directory).  Returns
 * an embkv_rc; on failure *err (sqlite3_malloc'd) says why. */
int ekreg_open(const char *dir, const embkv_options *o, unsigned flags, embkv_store **s, char **err);
void ekreg_close(embkv_store *s);
/* embkv_train_configure of a table instance's options, its eviction on
 * only while an instance of a connection that may write holds the store
 * (a read-only connection must not delete rows, nor its background
 * passes): writer says this instance is one, counted until
 * ekreg_train_leave (before its ekreg_close).  An embkv_rc. */
int ekreg_train_configure(embkv_store *s, const embkv_train_options *o, int writer);
void ekreg_train_leave(embkv_store *s, const embkv_train_options *o);
/* Held while a COMMIT writes a buffer to the store and syncs it, and while
 * a checkpoint syncs: a sync of another connection (of this or another
 * database with a table on the store) must not make half of a COMMIT
 * durable.  The caller holds a reference to s. */
pthread_mutex_t *ekreg_commit_lock(embkv_store *s);
/* Journal slot k of s's store in this process (journal.c, J4): take
 * returns 1 when it was free and is now the caller's. */
int ekreg_journal_take(embkv_store *s, int k);
void ekreg_journal_drop(embkv_store *s, int k);
void ekreg_commit_unlock(pthread_mutex_t *held);
/* A table's COMMIT numbers in this process (commitseq.c), kept with the
 * open store and dropped when the process closes it: a later open finds
 * the COMMITs other processes made since in the store and in the file
 * alike.  NULL when none (or, with create, out of memory).  The caller
 * holds a reference to s. */
struct ekseq {
    struct ekseq *next;
    char tid[17];
    unsigned long long dev, ino;
    _Atomic uint64_t seq;  /* the number of the last COMMIT that the store holds */
    atomic_int inflight;   /* COMMITs between their store write and their end */
    _Atomic uint64_t handed; /* the last number a COMMIT took (0: the shadow table's not read yet) */
};
ekseq *ekreg_seq(embkv_store *s, const ekuser *who, int create);
/* Removes a store directory now, or when its last reference in this process
 * closes if it is still open. */
void ekreg_discard(const char *dir);
/* Recursive removal, not following symbolic links.  0 or -1 (errno). */
int ek_remove_tree(const char *dir);

/* Temporary directories of tables of :memory: and temporary databases,
 * keyed by the table's stable id and referenced by the connections that
 * use them; removed when the last such connection closes (or the DROP
 * commits).  Return SQLITE_OK or an error with *err (sqlite3_malloc'd). */
int ekreg_tmpdir_create(ekconn *c, const char *tid, char **path, char **err);
int ekreg_tmpdir_find(ekconn *c, const char *tid, char **path, char **err);
void ekreg_tmpdir_forget(ekconn *c, const char *tid);   /* creation failed */

/* ========================================================================
 * cursor.c: xBestIndex and the cursor methods.
 */
int vt_best_index(sqlite3_vtab *pv, sqlite3_index_info *info);
int vt_open(sqlite3_vtab *pv, sqlite3_vtab_cursor **pc);
int vt_close(sqlite3_vtab_cursor *pc);
int vt_filter(sqlite3_vtab_cursor *pc, int idxNum, const char *idxStr, int argc, sqlite3_value **argv);
int vt_next(sqlite3_vtab_cursor *pc);
int vt_eof(sqlite3_vtab_cursor *pc);
int vt_column(sqlite3_vtab_cursor *pc, sqlite3_context *ctx, int col);
int vt_rowid(sqlite3_vtab_cursor *pc, sqlite3_int64 *rowid);
/* A row's vector as this connection sees it (its own writes first):
 * 1 found, 0 absent, -1 error (message set). */
int read_row(ekvtab *v, int64_t id, float *out);
void ekcurbuf_free(ekcurbuf *b);

/* ========================================================================
 * wbuf.c: a connection's write buffer for one store (struct ekwbuf).
 */
/* v->wb and v->txn for v's store: the connection's buffer, or a new one. */
int ekwbuf_acquire(ekvtab *v);
/* An instance lets go; an unused buffer goes unless it holds writes of an
 * open transaction. */
void ekwbuf_release(ekwbuf *wb, ekconn *c);
void ekwbuf_begin(ekwbuf *wb);
/* COMMIT phase one (writes and syncs; SQLite rc, *msg says why it failed),
 * the end of the transaction, and its rollback (undoing phase one). */
int ekwbuf_sync(ekwbuf *wb, ekconn *c, char **msg);
void ekwbuf_end(ekwbuf *wb);
void ekwbuf_rollback(ekwbuf *wb);
/* Before the transaction changes after a failed second phase: puts the
 * store back (an SQLite rc). */
int ekwbuf_unsync(ekwbuf *wb);
/* Whatever may refuse the COMMIT, before any store is written: the
 * fork check, a DROP beside a reader, the commit records, SQLite's locks
 * (every xSync calls it; an SQLite rc, *msg says why). */
int ekconn_commit_prepare(ekconn *c, char **msg);

/* ========================================================================
 * journal.c: the commit journal (SQLite's file decides a COMMIT; J1-J4
 * there).
 */
#define EK_JOURNAL_SLOTS 64
/* Whether v's COMMITs are journaled (not temporary, not read-only). */
int ekjournal_wanted(const ekvtab *v);
/* Locks every file the transaction writes in rollback-journal mode
 * EXCLUSIVE, waiting up to the busy timeout (SQLITE_BUSY with *msg). */
int ekjournal_lock_files(sqlite3 *db, char **msg);
/* Takes a slot and writes the commit record into SQLite's transaction. */
int ekjournal_begin(ekwbuf *wb, ekvtab *v, char **msg);
/* ektxn_apply's hook (ctx: the ekwbuf): the pre-images, made durable. */
int ekjournal_write(void *ctx, ektxn *t, char **msg);
/* The COMMIT ended: committed by SQLite (or nothing of it is in the
 * store), or rolled back with rows_back telling whether its rows are back. */
void ekjournal_finish(ekwbuf *wb, int committed, int rows_back);
/* Lets the slot go without marking the file. */
void ekjournal_end(ekwbuf *wb);
/* At connect: resolves the pending journals naming v (an SQLite rc); a
 * connection that may not write (writer 0) refuses a table whose store
 * shows a COMMIT SQLite never made. */
int ekjournal_recover(ekvtab *v, int writer, char **err);

/* ========================================================================
 * commitseq.c: the numbers of the COMMITs that wrote a table, in SQLite's
 * file and in the process, for readers in WAL mode (S1-S3 there).
 */
/* At a COMMIT's prepare, after its commit record: the row ('seq', n) of
 * each of the connection's tables on wb's store, into SQLite's
 * transaction (an SQLite rc, *msg says why). */
int ekseq_prepare(ekconn *c, ekwbuf *wb, char **msg);
/* Around the store write: before it, after it, and at the COMMIT's end
 * (rows_back: the store was put back as it was). */
void ekseq_writing(ekwbuf *wb);
void ekseq_written(ekwbuf *wb);
void ekseq_end(ekwbuf *wb, int rows_back);
/* After a cursor opens *snap: whether the store it shows is the one the
 * connection's read transaction shows (it may take a new snapshot after a
 * COMMIT in flight); SQLITE_BUSY_SNAPSHOT with *err when the store holds
 * a COMMIT that transaction does not see. */
int ekseq_check(ekvtab *v, embkv_snapshot **snap, char **err);

/* Writes that no table of the transaction will commit: those of a table
 * dropped in it (SQLite calls no xSync/xCommit on a dropped table).  The
 * DROP made embkv_pending part of the transaction, and its xSync, xCommit
 * and xRollback call these. */
int ekconn_sync_stranded(ekconn *c, char **msg);
void ekconn_end_stranded(ekconn *c, int commit);
/* xSavepoint, xRelease or xRollbackTo for every buffer of the transaction,
 * from embkv_pending (idempotent for buffers whose tables heard it too). */
enum { EK_SAVEPOINT, EK_RELEASE, EK_ROLLBACK_TO };
int ekconn_wbufs_savepoint(ekconn *c, int op, int n);

/* ========================================================================
 * stats.c: embkv_table_lookup, and embkv_stats and embkv_checkpoint,
 * registered by ekfn_register.
 */
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
    const ektxn *txn;            /* those writes (ektxn_slot), NULL with none */
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
 * call only.  Returns SQLITE_OK, or an error with *pzErr (sqlite3_malloc'd,
 * NULL with SQLITE_NOMEM) naming the table: SQLITE_ERROR when there is no
 * such table or it is not an embkv table, the table's broken_rc when its
 * store could not be opened. */
int embkv_table_lookup(sqlite3 *db, const char *table, embkv_table_ref *out, char **pzErr);
int ekfn_register(sqlite3 *db, ekconn *c);

/* ========================================================================
 * pending.c: directory removal tied to the outcome of the open
 * transaction: on commit (DROP TABLE) or on rollback (CREATE VIRTUAL
 * TABLE).  Implemented by a write to the eponymous table embkv_pending,
 * which makes it take part in the transaction (xCommit/xRollback/
 * savepoints).  tid: the id of a temporary directory (its registration
 * goes too), or NULL.
 */
int ekconn_register_pending(sqlite3 *db, ekconn *c);
int ekconn_defer_remove(ekconn *c, int when, const char *dir, const char *tid, char **err);
/* The same for taking table tid off the list of dir's tables (removing dir
 * when that leaves none; see ekpend.unlist). */
int ekconn_defer_unlist(ekconn *c, int when, const char *dir, const ekuser *who, int owner, char **err);
/* Whether the open transaction removes dir whatever its outcome: a CREATE
 * of it that a ROLLBACK TO took back (its directory waits for the end). */
int ekconn_removing(const ekconn *c, const char *dir);

/* ========================================================================
 * vecfn.c: vector functions, aggregates, embkv_version/embkv_build.
 */
int embkv_vecfn_register(sqlite3 *db);

/* ========================================================================
 * train.c: embkv_pull, embkv_push, embkv_release, embkv_lookahead.
 */
int embkv_train_register(sqlite3 *db);

/* embkv_pull's fourth argument, a pointer (sqlite3_bind_pointer, type
 * EK_ROWS_OUT) that only C can bind: the pulled rows go into rows, which
 * holds bytes, and the function returns their number (direct.c). */
typedef struct ek_rows_out {
    float *rows;
    size_t bytes;
} ek_rows_out;
#define EK_ROWS_OUT "embkv_rows_out"

/* ========================================================================
 * direct.c: embkv_connection() and the entry points of language bindings,
 * exported by the extension (embkv.map).  Each returns SQLite's result
 * code with the message in err, or EK_DIRECT_UNKNOWN when the handle
 * names no open connection of this copy of the library (use SQL then).
 */
int embkv_direct_register(sqlite3 *db);
#define EK_DIRECT_UNKNOWN (-1)
/* SELECT embkv_pull(table, ids, 'once' or NULL) into out (out_bytes:
 * exactly n * dim * 4). */
int embkv_direct_pull(sqlite3_int64 handle, const char *table, const int64_t *ids, size_t n, float *out,
                      size_t out_bytes, int once, char *err, size_t errlen);
/* SELECT embkv_push(table, ids, grads, *lr or NULL when lr is NULL):
 * *updated its result. */
int embkv_direct_push(sqlite3_int64 handle, const char *table, const int64_t *ids, size_t n, const float *grads,
                      size_t grad_bytes, const double *lr, sqlite3_int64 *updated, char *err, size_t errlen);

/* ========================================================================
 * heat.c: embkv_heat (a table-valued function) and embkv_hotset.
 */
int embkv_heat_register(sqlite3 *db);

/* ========================================================================
 * knn.c: embkv_knn, nearest-neighbour search (a table-valued function).
 */
int embkv_knn_register(sqlite3 *db);

/* ========================================================================
 * export.c: embkv_export and embkv_import (a portable file of every row
 * with its clock and optimizer state).
 */
int embkv_export_register(sqlite3 *db);

/* ========================================================================
 * vtab.c: the module.
 */
/* The embkv virtual table module, the embkv_pending module, embkv_stats()
 * and embkv_checkpoint() (the functions through ekfn_register). */
int embkv_vtab_register(sqlite3 *db);

#endif
