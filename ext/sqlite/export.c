/*
 * export.c - copies of a table that leave the store:
 *   embkv_export(table, file)  -> rows written to a new file
 *   embkv_export(table, file, ids) -> those of the rows, as one
 *   embkv_import(table, file)  -> rows put into the table
 *   embkv_backup(table, dir)   -> a checkpoint copied as a new store (the
 *                                 engine's embkv_backup_*, at the end)
 * All are SQLITE_DIRECTONLY (they touch files and write the store).  This
 * file owns the export format, its writer and its reader; the engine gives
 * it a snapshot read of whole rows (embkv_get_rows_at: vector, optimizer
 * state and clock of one version) and a put that sets the clock
 * (embkv_put_clock).
 *
 * The format: a plain SQLite database (any sqlite3 reads it), format
 * version 1, two tables:
 *   embkv_meta(key TEXT PRIMARY KEY, value)
 *       format          'embkv-export'
 *       format_version  1
 *       dim, state_floats, rows              integers
 *       float_format    'float32-le'
 *       dtype           'f32', 'f16', 'bf16' or 'i8': what the table keeps
 *                       (vec holds its rows decoded to float32; an import
 *                       into a table of another dtype rounds them to it)
 *       optimizer, lr, initial_accumulator, eps, beta1, beta2, init, seed,
 *       staleness, wait_ms                   the table's training options,
 *                                            as text CREATE reads back
 *       create_options  'dim=64, optimizer=adagrad, lr=0.05, ...': what to
 *                       put in USING embkv(...) for a table that trains
 *                       as the exported one did
 *       table, embkv_version, crc            informative (crc describes
 *                                            the row checksum, below)
 *   embkv_rows(id INTEGER PRIMARY KEY, clock INTEGER NOT NULL,
 *              vec BLOB NOT NULL, state BLOB, crc INTEGER NOT NULL)
 *       vec: dim float32 little-endian; state: state_floats of them (the
 *       optimizer's per-row state: adagrad's accumulator, adam's moments
 *       and step), NULL when state_floats is 0; clock: the row's update
 *       count; crc: CRC-32 (zlib's crc32, polynomial 0xEDB88320) of the
 *       id and the clock as 8-byte little-endian integers followed by the
 *       vec and state bytes.
 *
 * Export.  The rows are the table as of one moment: an engine snapshot
 * opened first, every row read through it (each push, pull creation and
 * COMMIT entirely or not at all, whatever runs meanwhile; the rows of the
 * SSD log and of the DRAM cache included, each record verified).  The ids are
 * listed first (8 bytes a row, as a full SQL scan does) and sorted, so the
 * file is written in id order (appends to its B-tree); the rows then come
 * a chunk at a time (at most 4 MiB), committed every EXPORT_COMMIT rows
 * into a file written with its own connection, without journal.  The file
 * is written under a temporary name beside it ("<file>.embkv-tmp-<random>",
 * created exclusively), fsync'ed, and renamed to its name only when
 * complete, with RENAME_NOREPLACE (or link(), where the file system lacks
 * it): a crash leaves at most a temporary file, never a half file under
 * the name, and an existing file is never overwritten (an error names it;
 * the check comes first, so nothing is read for nothing).  A relative file
 * name is taken from the process's current directory, as sqlite3_open and
 * ATTACH do.  While it runs the snapshot holds the versions it may read
 * (pool space, beside heavy training).
 *
 * Import.  Into an existing embkv table with the same dim, optimizer and
 * state_floats (a mismatch is refused, naming both values; the other
 * training options are the table's own).  Every row of the file is put
 * with its vector, state and clock exactly: a row of the table with the
 * same id is replaced, the table's other rows stay.  Two passes over the
 * file inside one read transaction: the first checks everything (the
 * meta, every row's sizes, types, finite values and crc, the row count)
 * and counts the ids new to the table, so a damaged file or one that is
 * not an export changes nothing; then the index is grown for all of it
 * and, without an SSD tier, the pool's room checked (an import that
 * cannot fit fails before writing, saying so; with a tier the puts demote
 * colder rows as the pool fills); the second pass writes, in write groups of
 * IMPORT_GROUP rows (readers see the import come in chunk by chunk, each
 * whole), and a checkpoint ends it.  The binding's commit lock is held
 * from the first write to that checkpoint, so no COMMIT or checkpoint of
 * the store falls inside the import: a crash during it returns the table
 * to the state before the import, and after it returns the import is
 * durable.  (COMMITs and checkpoints of other connections on the store
 * wait meanwhile; pushes and pulls do not, and are not ordered with it.)
 * A write that fails part-way (a pool filled by others meanwhile, an I/O
 * error) leaves the rows written so far, as a failed push would; running
 * the import again completes it, since each put sets a row wholly.
 * Staleness permits are neither taken nor checked.
 *
 * Both functions refuse a connection with uncommitted SQL writes to the
 * table (COMMIT first), as the training functions do; like a push, an
 * import is not part of the SQL transaction (ROLLBACK does not undo it).
 * Errors name the function, the table and the file:
 * "embkv_import: table t: file 'x.db' is not an embkv export (...)".
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define EXPORT_FORMAT "embkv-export"
#define EXPORT_FLOATS "float32-le"
#define EXPORT_VERSION 1
#define EXPORT_CHUNK_BYTES (4u << 20) /* rows read from the store at a time */
#define EXPORT_CHUNK_MAX 4096
#define EXPORT_COMMIT 65536           /* rows per transaction of the file */
#define IMPORT_GROUP 256              /* rows per engine write group */
#define IMPORT_IDS 4096               /* ids per existence check */

/* ------------------------------------------------------------------------
 * The row checksum: zlib's crc32, so that any reader of the file can check
 * a row with its own zlib.  The id and the clock go in as 8-byte
 * little-endian integers, the host's order (binding.h).  A row's bytes
 * (dim <= 8192 floats and their optimizer state) fit crc32's length type.
 */
static uint32_t row_crc(int64_t id, uint64_t clock, const void *vec, size_t vbytes, const void *state, size_t sbytes)
{
    unsigned char head[16];
    memcpy(head, &id, 8);
    memcpy(head + 8, &clock, 8);
    uLong c = crc32(0L, head, sizeof head);
    c = crc32(c, vec, (uInt)vbytes);
    return (uint32_t)(sbytes ? crc32(c, state, (uInt)sbytes) : c);
}


/* The name to give sqlite3_open_v2 for the file `name` (sqlite3_malloc'd):
 * the name itself, but "./" before a relative ":memory:" or "file:..."
 * that SQLite would take for an in-memory database or a URI.  Export and
 * import name files of the file system, literally, as open() does. */
static char *literal_path(const char *name)
{
    int special = name[0] != '/' && (!strcmp(name, ":memory:") || !sqlite3_strnicmp(name, "file:", 5));
    return sqlite3_mprintf(special ? "./%s" : "%s", name);
}
/* ------------------------------------------------------------------------
 * Errors: "fname: table T: message" (or "fname: message" before the table
 * is known), with the SQLite code given.
 */
static void fail(sqlite3_context *ctx, const char *fname, const char *table, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *msg = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    char *m = !msg ? NULL
              : table ? sqlite3_mprintf("%s: table %s: %s", fname, table, msg)
                      : sqlite3_mprintf("%s: %s", fname, msg);
    sqlite3_free(msg);
    if (!m || code == SQLITE_NOMEM) {
        sqlite3_free(m);
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_error(ctx, m, -1);
    sqlite3_free(m);
    if (code != SQLITE_ERROR) sqlite3_result_error_code(ctx, code);
}

static int code_of(int erc)
{
    switch (erc) {
    case EMBKV_NOMEM: return SQLITE_NOMEM;
    case EMBKV_FULL: return SQLITE_FULL;
    case EMBKV_IO: return SQLITE_IOERR;
    case EMBKV_BUSY: return SQLITE_BUSY;
    default: return SQLITE_ERROR;
    }
}

static const char *type_name(int t)
{
    switch (t) {
    case SQLITE_INTEGER: return "an integer";
    case SQLITE_FLOAT: return "a real number";
    case SQLITE_TEXT: return "text";
    case SQLITE_BLOB: return "a BLOB";
    default: return "NULL";
    }
}

/* The table and file arguments, resolved; 0, or -1 after reporting. */
static int args(sqlite3_context *ctx, const char *fname, sqlite3_value **argv, embkv_table_ref *ref,
                const char **file)
{
    bool nul;
    const char *name = ek_name_arg(argv[0], &nul);
    if (!name) {
        fail(ctx, fname, NULL, SQLITE_ERROR, "argument 1 must be a table name (TEXT), got %s",
             nul ? "TEXT that " EK_NAME_NUL : type_name(sqlite3_value_type(argv[0])));
        return -1;
    }
    char *err = NULL;
    int lrc = embkv_table_lookup(sqlite3_context_db_handle(ctx), name, ref, &err);
    if (lrc != SQLITE_OK) {
        fail(ctx, fname, NULL, lrc, "%s", err ? err : "out of memory");
        sqlite3_free(err);
        return -1;
    }
    *file = ek_name_arg(argv[1], &nul);
    if (!*file || !**file) {
        fail(ctx, fname, ref->name, SQLITE_ERROR, "argument 2 must be a %s name (non-empty TEXT), got %s",
             strcmp(fname, "embkv_backup") ? "file" : "directory",
             *file ? "an empty string" : nul ? "TEXT that " EK_NAME_NUL : type_name(sqlite3_value_type(argv[1])));
        return -1;
    }
    if (ref->pending_writes) {
        fail(ctx, fname, ref->name, SQLITE_ERROR,
             "this connection has uncommitted writes to the table; COMMIT them first");
        return -1;
    }
    return 0;
}

/* The names SQLite gives the files of a database beside its own: a backup
 * or an export under one would be taken for that file (a rollback journal
 * SQLite plays back or deletes, a WAL it reads). */
typedef struct sqlite_name {
    const char *abs;  /* the name asked for (absolute) */
    char *said;       /* what it is to SQLite, when it is one */
} sqlite_name;

/* Whether a and b name one place: the same parent directory (links
 * resolved) and the same last name. */
static bool same_place(const char *a, const char *b)
{
    const char *sa = strrchr(a, '/'), *sb = strrchr(b, '/');
    if (!sa || !sb || strcmp(sa, sb) != 0) return false;
    char da[PATH_MAX], db[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];
    snprintf(da, sizeof da, "%.*s", (int)(sa - a), a);
    snprintf(db, sizeof db, "%.*s", (int)(sb - b), b);
    if (!realpath(*da ? da : "/", ra) || !realpath(*db ? db : "/", rb)) return !strcmp(da, db);
    return !strcmp(ra, rb);
}

static int sqlite_file_named(sqlite3 *db, const char *schema, void *arg)
{
    sqlite_name *n = arg;
    const char *f = sqlite3_db_filename(db, schema);
    if (!f || !*f) return SQLITE_OK;
    static const char *const suffix[] = {"", "-journal", "-wal", "-shm"};
    static const char *const what[] = {"the database file", "the rollback journal", "the write-ahead log",
                                       "the shared-memory file"};
    for (int k = 0; k < 4; k++) {
        char *p = sqlite3_mprintf("%s%s", f, suffix[k]);
        if (!p) return SQLITE_NOMEM;
        bool hit = same_place(p, n->abs);
        sqlite3_free(p);
        if (hit) {
            n->said = sqlite3_mprintf("%s of database %s (%s)", what[k], schema, f);
            return n->said ? SQLITE_DONE : SQLITE_NOMEM;
        }
    }
    return SQLITE_OK;
}

/* What SQLite would take the file abs for, in db (sqlite3_free it), or NULL.
 * (Trailing "/" and "/." name the same place: "x.db-journal/" is the
 * journal's name as much as "x.db-journal".) */
static char *sqlite_file_at(sqlite3 *db, const char *abs)
{
    char name[PATH_MAX];
    if (snprintf(name, sizeof name, "%s", abs) >= (int)sizeof name) return NULL;
    for (size_t len = strlen(name); len > 1;) {
        if (name[len - 1] == '/') name[--len] = 0;
        else if (len > 2 && name[len - 1] == '.' && name[len - 2] == '/') name[len -= 2] = 0;
        else break;
    }
    sqlite_name n = {name, NULL};
    ek_each_schema(db, sqlite_file_named, &n);
    return n.said;
}

static const char *const optimizer_names[] = {"sgd", "adagrad", "adam"};

static const char *optimizer_name(int o)
{
    return o >= 0 && o < 3 ? optimizer_names[o] : "unknown";
}

/* The shortest of %.15g / %.17g that reads back as d (as the options
 * file writes numbers). */
static void fmt_double(char *buf, size_t n, double d)
{
    snprintf(buf, n, "%.15g", d);
    if (strtod(buf, NULL) != d) snprintf(buf, n, "%.17g", d);
}

/* ------------------------------------------------------------------------
 * embkv_export
 */
typedef struct exporter {
    sqlite3_context *ctx;
    embkv_table_ref ref;
    const char *file;
    char *tmp;           /* the temporary file, while it exists */
    int held;            /* a descriptor of it holding its claim (-1: none) */
    sqlite3 *out;        /* its connection */
    sqlite3_stmt *ins;
    embkv_snapshot *snap;
    int64_t *ids;
    size_t nids, capids;
    float *vecs, *states;
    embkv_rowinfo *infos;
    uint8_t *found;
    char *why;           /* the first failure's message, and its code */
    int code;
} exporter;

/* Records a failure in *why and *code, the first one winning (the
 * exporter's and the importer's); returns -1. */
static int fail_v(char **why, int *code, int c, const char *fmt, va_list ap)
{
    if (*why || *code) return -1;
    *why = sqlite3_vmprintf(fmt, ap);
    *code = *why ? c : SQLITE_NOMEM;
    return -1;
}

static int ex_fail(exporter *e, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(&e->why, &e->code, code, fmt, ap);
    va_end(ap);
    return -1;
}

/* A failure of the file's connection. */
static int ex_file_fail(exporter *e)
{
    int rc = sqlite3_errcode(e->out);
    return ex_fail(e, rc == SQLITE_FULL ? SQLITE_FULL : rc == SQLITE_NOMEM ? SQLITE_NOMEM
                      : rc == SQLITE_IOERR ? SQLITE_IOERR : SQLITE_ERROR,
                   "writing file '%s': %s", e->file, sqlite3_errmsg(e->out));
}

static int ex_engine_fail(exporter *e, int erc)
{
    return ex_fail(e, code_of(erc), "%s", erc == EMBKV_NOMEM ? "out of memory" : embkv_errmsg());
}

static int ids_add(exporter *e, const int64_t *ids, size_t n)
{
    if (e->nids + n > e->capids) {
        size_t cap = e->capids ? e->capids : 4096;
        while (cap < e->nids + n) cap *= 2;
        int64_t *p = realloc(e->ids, cap * sizeof *p);
        if (!p) return -1;
        e->ids = p;
        e->capids = cap;
    }
    memcpy(e->ids + e->nids, ids, n * sizeof *ids);
    e->nids += n;
    return 0;
}

static int scan_add(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)vec;
    (void)state;
    (void)info;
    return ids_add(ctx, &id, 1) ? 1 : 0;
}

/* Sorts ids ascending: a radix sort, a byte at a time from the lowest
 * (skipping the bytes all ids share), through tmp (n entries).  A tenth of
 * qsort's time for a million ids. */
static void sort_ids(int64_t *ids, int64_t *tmp, size_t n)
{
    int64_t *from = ids, *to = tmp;
    for (int shift = 0; shift < 64; shift += 8) {
        size_t count[256] = {0};
        for (size_t i = 0; i < n; i++) count[(((uint64_t)from[i] ^ (1ull << 63)) >> shift) & 0xff]++;
        if (count[(((uint64_t)from[0] ^ (1ull << 63)) >> shift) & 0xff] == n) continue;
        size_t at = 0;
        for (int b = 0; b < 256; b++) {
            size_t c = count[b];
            count[b] = at;
            at += c;
        }
        for (size_t i = 0; i < n; i++) to[count[(((uint64_t)from[i] ^ (1ull << 63)) >> shift) & 0xff]++] = from[i];
        int64_t *t = from;
        from = to;
        to = t;
    }
    if (from != ids) memcpy(ids, from, n * sizeof *ids);
}

/* e->ids sorted, each once; -1 when out of memory. */
static int sort_unique(exporter *e)
{
    if (!e->nids) return 0;
    int64_t *tmp = malloc(e->nids * sizeof *tmp);
    if (!tmp) return -1;
    sort_ids(e->ids, tmp, e->nids);
    free(tmp);
    size_t w = 0;
    for (size_t i = 0; i < e->nids; i++)
        if (w == 0 || e->ids[i] != e->ids[w - 1]) e->ids[w++] = e->ids[i];
    e->nids = w;
    return 0;
}

/* Every id the snapshot may hold, sorted, each once: the index's ids (a
 * pinned pass, as the table's full scan collects them) and those of rows
 * changed or deleted since the snapshot; rows created since are in the
 * list but not in the snapshot (the reads say so). */
static int collect_ids(exporter *e)
{
    embkv_store *s = e->ref.store;
    int erc = EMBKV_BUSY;
    int64_t buf[4096];
    embkv_scan_pin(s);
    for (int attempt = 0; attempt < 3 && erc == EMBKV_BUSY; attempt++) {
        uint64_t pos = 0;
        e->nids = 0;
        for (;;) {
            size_t n = 0;
            erc = embkv_scan_ids(s, &pos, buf, sizeof buf / sizeof buf[0], &n);
            if (erc != EMBKV_OK || n == 0) break;
            if (ids_add(e, buf, n)) {
                erc = EMBKV_NOMEM;
                break;
            }
        }
    }
    embkv_scan_unpin(s);
    if (erc == EMBKV_BUSY) { /* the index keeps growing: a one-pass scan */
        e->nids = 0;
        erc = embkv_scan(s, scan_add, e);
        if (erc == 1) erc = EMBKV_NOMEM;
    }
    if (erc != EMBKV_OK) return erc;
    int64_t *ch = NULL;
    size_t nch = 0;
    if ((erc = embkv_snapshot_changed_ids(e->snap, &ch, &nch)) != EMBKV_OK) return erc;
    int bad = nch && ids_add(e, ch, nch);
    free(ch);
    if (bad) return EMBKV_NOMEM;
    return sort_unique(e) ? EMBKV_NOMEM : EMBKV_OK;
}

/* Statements on the file; 0, or -1 with the failure recorded. */
static int out_exec(exporter *e, const char *sql)
{
    return sqlite3_exec(e->out, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : ex_file_fail(e);
}

static int meta_put(exporter *e, const char *key, const char *text, sqlite3_int64 num, int is_num)
{
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(e->out, "INSERT OR REPLACE INTO embkv_meta(key, value) VALUES (?1, ?2)", -1, &st,
                                NULL);
    if (rc == SQLITE_OK) {
        sqlite3_bind_text(st, 1, key, -1, SQLITE_STATIC);
        if (is_num) sqlite3_bind_int64(st, 2, num);
        else sqlite3_bind_text(st, 2, text, -1, SQLITE_TRANSIENT);
        rc = sqlite3_step(st);
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    sqlite3_finalize(st);
    return rc;
}

/* The meta rows known before the rows are written. */
static int write_meta(exporter *e)
{
    const embkv_train_options *t = &e->ref.opts->train;
    embkv_store *s = e->ref.store;
    char lr[32], acc[32], eps[32], b1[32], b2[32], init[80], seed[32], stale[32], wait[32];
    fmt_double(lr, sizeof lr, t->lr);
    fmt_double(acc, sizeof acc, t->initial_accumulator);
    fmt_double(eps, sizeof eps, t->eps);
    fmt_double(b1, sizeof b1, t->beta1);
    fmt_double(b2, sizeof b2, t->beta2);
    if (t->init == EMBKV_INIT_UNIFORM || t->init == EMBKV_INIT_NORMAL) {
        char a[32], b[32];
        fmt_double(a, sizeof a, t->init_a);
        fmt_double(b, sizeof b, t->init_b);
        snprintf(init, sizeof init, "%s(%s,%s)", t->init == EMBKV_INIT_UNIFORM ? "uniform" : "normal", a, b);
    } else {
        snprintf(init, sizeof init, "%s", t->init == EMBKV_INIT_ZEROS ? "zeros" : "none");
    }
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);
    if (t->staleness == EMBKV_STALENESS_UNLIMITED) snprintf(stale, sizeof stale, "unlimited");
    else snprintf(stale, sizeof stale, "%lld", (long long)t->staleness);
    snprintf(wait, sizeof wait, "%u", t->wait_ms);
    const char *opt = optimizer_name(t->optimizer);
    /* admission and eviction only when set, as the options file keeps them */
    char admit[32] = "", ttl[32] = "", evict[128] = "";
    if (t->admit_count) snprintf(admit, sizeof admit, ", admit='count(%u)'", t->admit_count);
    if (t->ttl_ms) {
        char d[24];
        ek_format_ttl(t->ttl_ms, d, sizeof d);
        snprintf(ttl, sizeof ttl, ", ttl='%s'", d);
    }
    size_t ne = 0;
    if (t->ttl_steps) ne += (size_t)snprintf(evict + ne, sizeof evict - ne, ", ttl_steps=%llu", (unsigned long long)t->ttl_steps);
    if (t->max_rows) ne += (size_t)snprintf(evict + ne, sizeof evict - ne, ", max_rows=%llu", (unsigned long long)t->max_rows);
    if (t->evict == EMBKV_EVICT_LRU) snprintf(evict + ne, sizeof evict - ne, ", evict=lru");
    /* the dtype when not float32, and its rounding when not nearest */
    char dtype[64] = "";
    if (embkv_dtype(s) != EMBKV_F32)
        snprintf(dtype, sizeof dtype, ", dtype=%s%s", embkv_dtype_name(embkv_dtype(s)),
                 t->rounding == EMBKV_ROUND_STOCHASTIC ? ", rounding=stochastic" : "");
    char *create = sqlite3_mprintf("dim=%u%s, optimizer=%s, lr=%s, initial_accumulator=%s, eps=%s, beta1=%s, "
                                   "beta2=%s, init='%s', seed=%s, staleness=%s, wait_ms=%s%s%s%s",
                                   embkv_dim(s), dtype, opt, lr, acc, eps, b1, b2, init, seed, stale, wait, admit, ttl,
                                   evict);
    char *version = NULL;
    sqlite3_stmt *st = NULL;
    /* embkv_version() of this build, through the main connection. */
    if (sqlite3_prepare_v2(sqlite3_context_db_handle(e->ctx), "SELECT embkv_version()", -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        version = sqlite3_mprintf("%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    if (!create) {
        sqlite3_free(version);
        return ex_fail(e, SQLITE_NOMEM, "out of memory");
    }
    struct {
        const char *key, *text;
        sqlite3_int64 num;
    } m[] = {
        {"format", EXPORT_FORMAT, 0},
        {"format_version", NULL, EXPORT_VERSION},
        {"dim", NULL, embkv_dim(s)},
        {"state_floats", NULL, embkv_state_floats(s)},
        {"rows", NULL, 0},
        {"float_format", EXPORT_FLOATS, 0},
        {"dtype", embkv_dtype_name(embkv_dtype(s)), 0},
        {"optimizer", opt, 0},
        {"lr", lr, 0},
        {"initial_accumulator", acc, 0},
        {"eps", eps, 0},
        {"beta1", b1, 0},
        {"beta2", b2, 0},
        {"init", init, 0},
        {"seed", seed, 0},
        {"staleness", stale, 0},
        {"wait_ms", wait, 0},
        {"create_options", create, 0},
        {"table", e->ref.name, 0},
        {"embkv_version", version ? version : "unknown", 0},
        {"crc", "CRC-32 (zlib crc32) of id and clock as 8-byte little-endian integers, then vec and state", 0},
    };
    int rc = SQLITE_OK;
    for (size_t i = 0; i < sizeof m / sizeof m[0] && rc == SQLITE_OK; i++)
        rc = meta_put(e, m[i].key, m[i].text, m[i].num, m[i].text == NULL);
    sqlite3_free(create);
    sqlite3_free(version);
    return rc == SQLITE_OK ? 0 : ex_file_fail(e);
}


/* The rows, a chunk at a time, as of the snapshot; *rows: rows written.
 * 0, or -1 with the failure recorded. */
static int write_rows(exporter *e, uint64_t *rows)
{
    embkv_store *s = e->ref.store;
    size_t dim = embkv_dim(s), sf = embkv_state_floats(s);
    size_t chunk = EXPORT_CHUNK_BYTES / (4 * (dim + sf));
    if (chunk > EXPORT_CHUNK_MAX) chunk = EXPORT_CHUNK_MAX;
    if (chunk < 1) chunk = 1;
    *rows = 0;
    e->vecs = malloc(chunk * dim * sizeof(float));
    e->states = sf ? malloc(chunk * sf * sizeof(float)) : NULL;
    e->infos = malloc(chunk * sizeof *e->infos);
    e->found = malloc(chunk);
    if (!e->vecs || (sf && !e->states) || !e->infos || !e->found) return ex_fail(e, SQLITE_NOMEM, "out of memory");
    if (sqlite3_prepare_v2(e->out, "INSERT INTO embkv_rows(id, clock, vec, state, crc) VALUES (?1, ?2, ?3, ?4, ?5)",
                           -1, &e->ins, NULL) != SQLITE_OK)
        return ex_file_fail(e);
    uint64_t since_commit = 0;
    for (size_t lo = 0; lo < e->nids; lo += chunk) {
        size_t m = e->nids - lo < chunk ? e->nids - lo : chunk;
        int erc = embkv_get_rows_at(s, e->snap, e->ids + lo, m, e->vecs, e->states, e->infos, e->found, NULL);
        if (erc != EMBKV_OK) return ex_engine_fail(e, erc);
        for (size_t j = 0; j < m; j++) {
            if (!e->found[j]) continue; /* created after the snapshot */
            int64_t id = e->ids[lo + j];
            const float *v = e->vecs + j * dim, *st = sf ? e->states + j * sf : NULL;
            uint64_t clock = e->infos[j].clock;
            sqlite3_bind_int64(e->ins, 1, id);
            sqlite3_bind_int64(e->ins, 2, (sqlite3_int64)clock);
            sqlite3_bind_blob(e->ins, 3, v, (int)(dim * 4), SQLITE_STATIC);
            if (sf) sqlite3_bind_blob(e->ins, 4, st, (int)(sf * 4), SQLITE_STATIC);
            else sqlite3_bind_null(e->ins, 4);
            sqlite3_bind_int64(e->ins, 5, row_crc(id, clock, v, dim * 4, st, sf * 4));
            int rc = sqlite3_step(e->ins);
            sqlite3_reset(e->ins);
            if (rc != SQLITE_DONE) return ex_file_fail(e);
            ++*rows;
            if (++since_commit == EXPORT_COMMIT) {
                since_commit = 0;
                if (out_exec(e, "COMMIT; BEGIN")) return -1;
            }
        }
    }
    return 0;
}

/* fsync of a file or directory; 0 or errno. */
static int sync_path(const char *path, int dir)
{
    int fd = open(path, (dir ? O_RDONLY | O_DIRECTORY : O_RDWR) | O_CLOEXEC);
    if (fd < 0) return errno;
    int rc = fsync(fd) == 0 || errno == EINVAL ? 0 : errno; /* EINVAL: a file system that cannot */
    close(fd);
    return rc;
}

/* The temporary file, complete, becomes `file` unless that exists by now. */
static int publish(exporter *e)
{
    int err = sync_path(e->tmp, 0);
    if (err) return ex_fail(e, SQLITE_IOERR, "writing file '%s': fsync: %s", e->file, strerror(err));
    int rc = renameat2(AT_FDCWD, e->tmp, AT_FDCWD, e->file, RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP)) {
        /* No RENAME_NOREPLACE here: link() does not replace either. */
        rc = link(e->tmp, e->file);
        if (rc == 0) unlink(e->tmp);
    }
    if (rc != 0) {
        if (errno == EEXIST)
            return ex_fail(e, SQLITE_ERROR, "file '%s' was created by someone else while the export ran "
                                            "(embkv_export never overwrites a file)", e->file);
        return ex_fail(e, SQLITE_IOERR, "cannot name the finished export '%s': %s", e->file, strerror(errno));
    }
    sqlite3_free(e->tmp);
    e->tmp = NULL;
    /* The rename durable too. */
    const char *slash = strrchr(e->file, '/');
    char *dir = slash ? sqlite3_mprintf("%.*s", slash == e->file ? 1 : (int)(slash - e->file), e->file)
                      : sqlite3_mprintf(".");
    if (dir) sync_path(dir, 1);
    sqlite3_free(dir);
    return 0;
}

/* A temporary file of an export is claimed for as long as its export
 * runs: an open-file-description lock on its byte 0, which SQLite's own
 * locks (at 1 GiB and beyond) never touch, taken on a descriptor kept open
 * until the file is renamed or removed.  The kernel drops it with the
 * process, so a killed export leaves a temporary file that nobody claims,
 * and the next export to the same name removes it (as backups do). */
static struct flock byte0_lock(void)
{
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    return fl;
}

static int claim(int fd)
{
    struct flock fl = byte0_lock();
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* Whether the temporary file at path may belong to a running export.  An
 * export claims its file between creating it and SQLite's first write to
 * it: an empty file may be in that moment, so it counts as claimed until it
 * is a minute old.  Its size is read before its lock, so a file seen with
 * bytes had been claimed, and one unclaimed after that has lost its export. */
static int claimed(const char *path)
{
    /* Never anything but a regular file, and never blocking to find out
     * (a FIFO under such a name would hang an open). */
    struct stat lst;
    if (lstat(path, &lst) != 0 || !S_ISREG(lst.st_mode)) return 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return 1; /* cannot tell: leave it */
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_size == 0 && time(NULL) - st.st_mtime < 60)) {
        close(fd);
        return 1;
    }
    struct flock fl = byte0_lock();
    int held = fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK;
    close(fd);
    return held;
}

/* Removes the temporary files that killed exports to the same file left
 * (prefix: the file's name as its temporary names keep it, then the infix;
 * what follows must be the 8 hex digits of one). */
static void sweep_export_leftovers(const char *file, size_t keep)
{
    const char *slash = strrchr(file, '/');
    char *dir = slash ? sqlite3_mprintf("%.*s", (int)(slash - file), file) : sqlite3_mprintf(".");
    char *prefix = sqlite3_mprintf("%.*s.embkv-tmp-", (int)keep, slash ? slash + 1 : file);
    DIR *d = dir && prefix ? opendir(*dir ? dir : "/") : NULL;
    struct dirent *de;
    size_t plen = prefix ? strlen(prefix) : 0;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, prefix, plen) != 0 || strlen(de->d_name) != plen + 8 ||
            strspn(de->d_name + plen, "0123456789abcdef") != 8)
            continue;
        char *path = sqlite3_mprintf("%s/%s", dir, de->d_name);
        if (path && !claimed(path) && unlink(path) == 0)
            sqlite3_log(SQLITE_NOTICE, "embkv_export: removed %s, left by an export that did not finish", path);
        sqlite3_free(path);
    }
    if (d) closedir(d);
    sqlite3_free(dir);
    sqlite3_free(prefix);
}

/* Creates the temporary file beside `file` (exclusively, never an
 * existing one), claimed, and opens it as the output database; never in a
 * store's directory or SSD tier (the store would refuse to open with a
 * foreign file in it), the rule backups follow. */
static int open_out(exporter *e)
{
    char cwd[PATH_MAX];
    char *abs = e->file[0] == '/' ? sqlite3_mprintf("%s", e->file)
              : getcwd(cwd, sizeof cwd) ? sqlite3_mprintf("%s/%s", cwd, e->file) : NULL;
    if (!abs) return ex_fail(e, SQLITE_ERROR, "cannot create file '%s': %s", e->file, strerror(errno));
    int orc = embkv_path_outside(e->ref.store, abs);
    char *said = orc == EMBKV_OK ? sqlite_file_at(sqlite3_context_db_handle(e->ctx), abs) : NULL;
    sqlite3_free(abs);
    if (said) {
        ex_fail(e, SQLITE_ERROR, "file '%s' is the name SQLite gives %s, which would take the export for it: "
                "name another", e->file, said);
        sqlite3_free(said);
        return -1;
    }
    if (orc != EMBKV_OK)
        return ex_fail(e, SQLITE_ERROR, "cannot create file '%s' there: %s; name a file outside every store",
                       e->file, embkv_errmsg());
    /* (the name kept short enough for the suffix to fit NAME_MAX) */
    const char *slash = strrchr(e->file, '/'), *name = slash ? slash + 1 : e->file;
    size_t keep = NAME_MAX - (sizeof ".embkv-tmp-" - 1) - 8;
    if (strlen(name) < keep) keep = strlen(name);
    sweep_export_leftovers(e->file, keep);
    struct stat sb;
    if (lstat(e->file, &sb) == 0)
        return ex_fail(e, SQLITE_ERROR, "file '%s' already exists (embkv_export never overwrites a file: remove it "
                                        "or name another)", e->file);
    if (errno != ENOENT && errno != ENOTDIR)
        return ex_fail(e, SQLITE_ERROR, "cannot create file '%s': %s", e->file, strerror(errno));
    for (int attempt = 0; attempt < 8 && !e->tmp; attempt++) {
        uint32_t r;
        sqlite3_randomness(sizeof r, &r);
        char *tmp = sqlite3_mprintf("%.*s.embkv-tmp-%08x", (int)(name - e->file + keep), e->file, (unsigned)r);
        if (!tmp) return ex_fail(e, SQLITE_NOMEM, "out of memory");
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd >= 0) {
            if (claim(fd) != 0) {
                int err = errno;
                close(fd);
                unlink(tmp);
                sqlite3_free(tmp);
                return ex_fail(e, SQLITE_ERROR, "cannot create file '%s': cannot lock its temporary file: %s",
                               e->file, strerror(err));
            }
            e->held = fd;
            e->tmp = tmp;
            break;
        }
        int err = errno;
        sqlite3_free(tmp);
        if (err != EEXIST)
            return ex_fail(e, err == ENOSPC ? SQLITE_FULL : SQLITE_ERROR, "cannot create file '%s': %s", e->file,
                           strerror(err));
    }
    if (!e->tmp) return ex_fail(e, SQLITE_ERROR, "cannot create file '%s': no free temporary name beside it", e->file);
    char *lit = literal_path(e->tmp);
    if (!lit) return ex_fail(e, SQLITE_NOMEM, "out of memory");
    int lrc = sqlite3_open_v2(lit, &e->out, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, NULL);
    sqlite3_free(lit);
    if (lrc != SQLITE_OK) {
        if (!e->out) return ex_fail(e, SQLITE_NOMEM, "out of memory");
        return ex_file_fail(e);
    }
    /* No journal: a failed export deletes the file.  The rows go in in id
     * order, appended to the table's B-tree; 16 KiB pages waste less at
     * their ends than 4 KiB ones with rows of a few hundred bytes (5%
     * smaller at dim 64). */
    if (out_exec(e, "PRAGMA page_size=16384; PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; "
                    "PRAGMA locking_mode=EXCLUSIVE; PRAGMA cache_size=-16384; BEGIN; "
                    "CREATE TABLE embkv_meta(key TEXT PRIMARY KEY, value); "
                    "CREATE TABLE embkv_rows(id INTEGER PRIMARY KEY, clock INTEGER NOT NULL, vec BLOB NOT NULL, "
                    "state BLOB, crc INTEGER NOT NULL)"))
        return -1;
    return 0;
}

static void exporter_free(exporter *e)
{
    if (e->ins) sqlite3_finalize(e->ins);
    if (e->out) sqlite3_close(e->out);
    if (e->tmp) unlink(e->tmp);
    if (e->held >= 0) close(e->held); /* after the unlink: no moment unclaimed */
    sqlite3_free(e->tmp);
    if (e->snap) embkv_snapshot_close(e->snap);
    free(e->ids);
    free(e->vecs);
    free(e->states);
    free(e->infos);
    free(e->found);
    sqlite3_free(e->why);
}

/* The ids argument of embkv_export(table, file, ids), sorted, each once,
 * into e->ids; -1 after failing ctx. */
static int given_ids(exporter *e, sqlite3_value *v)
{
    char *err = NULL;
    size_t n = 0;
    int64_t *ids = ek_parse_ids(v, &n, &err);
    if (!ids) {
        fail(e->ctx, "embkv_export", e->ref.name, err ? SQLITE_ERROR : SQLITE_NOMEM, "argument 3: %s",
             err ? err : "out of memory");
        sqlite3_free(err);
        return -1;
    }
    int bad = ids_add(e, ids, n) || sort_unique(e);
    sqlite3_free(ids);
    if (bad) {
        fail(e->ctx, "embkv_export", e->ref.name, SQLITE_NOMEM, "out of memory");
        return -1;
    }
    return 0;
}

static void fn_export(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    exporter e;
    memset(&e, 0, sizeof e);
    e.held = -1;
    e.ctx = ctx;
    if (args(ctx, "embkv_export", argv, &e.ref, &e.file)) return;
    /* (the ids before the file: a bad argument makes nothing) */
    if (argc == 3 && given_ids(&e, argv[2])) {
        exporter_free(&e);
        return;
    }
    uint64_t rows = 0;
    int erc, ok = open_out(&e) == 0 && write_meta(&e) == 0;
    /* The table as of now: the snapshot first, then the ids (those given:
     * the ones the table holds). */
    if (ok && (erc = embkv_snapshot_open(e.ref.store, &e.snap)) != EMBKV_OK) ok = 0, ex_engine_fail(&e, erc);
    if (ok && argc == 2 && (erc = collect_ids(&e)) != EMBKV_OK) ok = 0, ex_engine_fail(&e, erc);
    ok = ok && write_rows(&e, &rows) == 0;
    if (e.snap) {
        embkv_snapshot_close(e.snap);
        e.snap = NULL;
    }
    if (e.ins) {
        sqlite3_finalize(e.ins);
        e.ins = NULL;
    }
    if (ok && meta_put(&e, "rows", NULL, (sqlite3_int64)rows, 1) != SQLITE_OK) ok = 0, ex_file_fail(&e);
    ok = ok && out_exec(&e, "COMMIT") == 0;
    if (ok) {
        int rc = sqlite3_close(e.out);
        e.out = NULL;
        if (rc != SQLITE_OK) ok = 0, ex_fail(&e, SQLITE_IOERR, "writing file '%s': %s", e.file, sqlite3_errstr(rc));
    }
    ok = ok && publish(&e) == 0;
    if (ok) sqlite3_result_int64(ctx, (sqlite3_int64)rows);
    else fail(ctx, "embkv_export", e.ref.name, e.code ? e.code : SQLITE_ERROR, "%s", e.why ? e.why : "failed");
    exporter_free(&e);
}

/* ------------------------------------------------------------------------
 * embkv_import
 */
typedef struct importer {
    sqlite3_context *ctx;
    embkv_table_ref ref;
    const char *file;
    sqlite3 *in;
    sqlite3_stmt *rows;
    uint32_t dim, sf;      /* the file's */
    uint64_t meta_rows;    /* rows it says it holds */
    float *row;            /* dim + sf floats: one row, aligned */
    char *why;
    int code;
} importer;

static int im_fail(importer *m, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(&m->why, &m->code, code, fmt, ap);
    va_end(ap);
    return -1;
}

/* Text read from the file (or SQLite's message about it, which may quote
 * its damaged schema) for a message: printable ASCII, other bytes as \xNN,
 * at most 200 of them (sqlite3_malloc'd; NULL when out of memory). */
static char *printable(const char *t)
{
    sqlite3_str *b = sqlite3_str_new(NULL);
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)(t ? t : ""); *p && k < 200; p++, k++) {
        if (*p >= 0x20 && *p < 0x7f) sqlite3_str_appendchar(b, 1, (char)*p);
        else sqlite3_str_appendf(b, "\\x%02x", *p);
    }
    if (t && strlen(t) > 200) sqlite3_str_appendall(b, "...");
    return sqlite3_str_finish(b);
}

/* A failure reading the file: not an SQLite database, damaged, or
 * unreadable, as SQLite says (rc: SQLite's code, or -1 for the
 * connection's last). */
static int im_file_fail_rc(importer *m, int rc)
{
    if (rc < 0) rc = sqlite3_errcode(m->in) & 0xff;
    char *msg = printable(sqlite3_errmsg(m->in));
    if (!msg) return im_fail(m, SQLITE_NOMEM, "out of memory");
    if (rc == SQLITE_NOTADB)
        im_fail(m, SQLITE_ERROR, "file '%s' is not an embkv export (it is not an SQLite database: %s)", m->file, msg);
    else if (rc == SQLITE_CORRUPT)
        im_fail(m, SQLITE_ERROR, "file '%s' is damaged: %s", m->file, msg);
    else if (rc == SQLITE_NOMEM)
        im_fail(m, SQLITE_NOMEM, "out of memory");
    else
        im_fail(m, rc == SQLITE_BUSY ? SQLITE_BUSY : rc == SQLITE_IOERR ? SQLITE_IOERR : SQLITE_ERROR,
                "cannot read file '%s': %s", m->file, msg);
    sqlite3_free(msg);
    return -1;
}

static int im_file_fail(importer *m)
{
    return im_file_fail_rc(m, -1);
}

static int im_damaged(importer *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *why = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    if (!why) return im_fail(m, SQLITE_NOMEM, "out of memory");
    im_fail(m, SQLITE_ERROR, "file '%s' is damaged: %s", m->file, why);
    sqlite3_free(why);
    return -1;
}

/* Opens the file read-only and checks that it is an export this table can
 * take (its meta). */
static int open_in(importer *m)
{
    struct stat sb;
    if (stat(m->file, &sb) != 0)
        return im_fail(m, SQLITE_ERROR, errno == ENOENT ? "file '%s' does not exist" : "cannot open file '%s': %s",
                       m->file, strerror(errno));
    if (S_ISDIR(sb.st_mode)) return im_fail(m, SQLITE_ERROR, "file '%s' is a directory, not an embkv export", m->file);
    /* (a FIFO would block the open below for good; a device is no export) */
    if (!S_ISREG(sb.st_mode))
        return im_fail(m, SQLITE_ERROR, "file '%s' is not a regular file (a %s), not an embkv export", m->file,
                       S_ISFIFO(sb.st_mode) ? "FIFO" : S_ISCHR(sb.st_mode) ? "character device"
                       : S_ISBLK(sb.st_mode) ? "block device" : S_ISSOCK(sb.st_mode) ? "socket" : "special file");
    /* The system's reason when it may not be read (SQLite says only
     * "unable to open database file"). */
    int fd = open(m->file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return im_fail(m, SQLITE_ERROR, "cannot open file '%s': %s", m->file, strerror(errno));
    close(fd);
    char *lit = literal_path(m->file);
    if (!lit) return im_fail(m, SQLITE_NOMEM, "out of memory");
    int orc = sqlite3_open_v2(lit, &m->in, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    sqlite3_free(lit);
    if (orc != SQLITE_OK) {
        if (!m->in) return im_fail(m, SQLITE_NOMEM, "out of memory");
        return im_file_fail(m);
    }
    sqlite3_busy_timeout(m->in, 5000);
    /* One read transaction over both passes: the file cannot change
     * between the check and the writes (through SQLite). */
    if (sqlite3_exec(m->in, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) return im_file_fail(m);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(m->in, "SELECT key, value FROM embkv_meta", -1, &st, NULL) != SQLITE_OK) {
        int rc = sqlite3_errcode(m->in) & 0xff;
        if (rc == SQLITE_ERROR) /* no such table or column */
            return im_fail(m, SQLITE_ERROR, "file '%s' is not an embkv export (it has no embkv_meta table)", m->file);
        return im_file_fail(m);
    }
    char *format = NULL, *optimizer = NULL, *floats = NULL, *dtype = NULL;
    int dtype_seen = 0;  /* (files from before it have none: f32) */
    sqlite3_int64 version = -1, dim = -1, sf = -1, rows = -1;
    const char *bad = NULL; /* a key whose value has the wrong type */
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        const char *key = (const char *)sqlite3_column_text(st, 0);
        int t = sqlite3_column_type(st, 1);
        if (!key) continue;
        static const char *const num_keys[] = {"format_version", "dim", "state_floats", "rows"};
        sqlite3_int64 *nums[] = {&version, &dim, &sf, &rows};
        int k = 0;
        while (k < 4 && strcmp(key, num_keys[k])) k++;
        char **text = !strcmp(key, "format")         ? &format
                      : !strcmp(key, "optimizer")    ? &optimizer
                      : !strcmp(key, "float_format") ? &floats
                      : !strcmp(key, "dtype")        ? &dtype
                                                     : NULL;
        if (text == &dtype) dtype_seen = 1;
        if (k < 4) {
            if (t != SQLITE_INTEGER || sqlite3_column_int64(st, 1) < 0) {
                if (!bad) bad = num_keys[k];
            } else {
                *nums[k] = sqlite3_column_int64(st, 1);
            }
        } else if (text && t == SQLITE_TEXT) {
            sqlite3_free(*text);
            *text = sqlite3_mprintf("%s", (const char *)sqlite3_column_text(st, 1));
        }
    }
    if (rc != SQLITE_DONE) {
        sqlite3_finalize(st);
        sqlite3_free(format);
        sqlite3_free(optimizer);
        sqlite3_free(floats);
        sqlite3_free(dtype);
        return im_file_fail(m);
    }
    int dtype_ok = !dtype_seen;
    for (uint32_t d = EMBKV_F32; dtype && d <= EMBKV_I8; d++)
        dtype_ok |= !strcmp(dtype, embkv_dtype_name(d));
    sqlite3_free(dtype);
    sqlite3_finalize(st);
    int out = 0;
    uint32_t tdim = embkv_dim(m->ref.store), tsf = embkv_state_floats(m->ref.store);
    const char *topt = optimizer_name(m->ref.opts->train.optimizer);
    if (!format || strcmp(format, EXPORT_FORMAT))
        out = im_fail(m, SQLITE_ERROR, "file '%s' is not an embkv export (its embkv_meta has no format '%s')", m->file,
                      EXPORT_FORMAT);
    else if (version != EXPORT_VERSION)
        out = version < 0 ? im_damaged(m, "embkv_meta's format_version is missing or not an integer")
                          : im_fail(m, SQLITE_ERROR, "file '%s' is an embkv export of format version %lld; this "
                                                     "build reads version %d", m->file, version, EXPORT_VERSION);
    else if (bad)
        out = im_damaged(m, "embkv_meta's %s is not an integer >= 0", bad);
    else if (dim < 0 || sf < 0 || rows < 0 || !optimizer || !floats)
        out = im_damaged(m, "embkv_meta lacks %s", dim < 0 ? "dim" : sf < 0 ? "state_floats" : rows < 0 ? "rows"
                                                   : !optimizer ? "optimizer" : "float_format");
    else if (strcmp(floats, EXPORT_FLOATS)) {
        char *f = printable(floats);
        out = im_fail(m, SQLITE_ERROR, "file '%s' holds values of float_format '%s'; this build reads '%s'", m->file,
                      f ? f : "?", EXPORT_FLOATS);
        sqlite3_free(f);
    }
    else if (!dtype_ok)
        out = im_damaged(m, "embkv_meta's dtype is not f32, f16, bf16 or i8");
    else if (dim < 1 || dim > EMBKV_MAX_DIM || sf > EMBKV_MAX_STATE_FLOATS)
        out = im_damaged(m, "embkv_meta's dim %lld or state_floats %lld is out of range", dim, sf);
    else if ((uint32_t)dim != tdim)
        out = im_fail(m, SQLITE_ERROR, "file '%s' holds rows of dim %lld, the table's dim is %u", m->file, dim, tdim);
    else if (sqlite3_stricmp(optimizer, topt) || (uint32_t)sf != tsf) {  /* (names as CREATE takes them: any case) */
        char *o = printable(optimizer);
        out = im_fail(m, SQLITE_ERROR, "file '%s' holds rows of optimizer %s (state_floats %lld), the table's optimizer "
                                       "is %s (state_floats %u): import into a table created with optimizer=%s",
                      m->file, o ? o : "?", sf, topt, tsf, o ? o : "?");
        sqlite3_free(o);
    }
    sqlite3_free(format);
    sqlite3_free(optimizer);
    sqlite3_free(floats);
    if (out) return -1;
    m->dim = (uint32_t)dim;
    m->sf = (uint32_t)sf;
    m->meta_rows = (uint64_t)rows;
    if (!(m->row = malloc(((size_t)m->dim + m->sf) * sizeof(float)))) return im_fail(m, SQLITE_NOMEM, "out of memory");
    if (sqlite3_prepare_v2(m->in, "SELECT id, clock, vec, state, crc FROM embkv_rows", -1, &m->rows, NULL) !=
        SQLITE_OK) {
        if ((sqlite3_errcode(m->in) & 0xff) == SQLITE_ERROR)
            return im_file_fail_rc(m, SQLITE_CORRUPT); /* no embkv_rows, or a column missing */
        return im_file_fail(m);
    }
    return 0;
}

/* The current row of m->rows, checked: types, sizes, crc (when `crc`),
 * finite values.  Fills m->row (vector, then state); 0, or -1 with the
 * failure recorded. */
static int check_row(importer *m, int crc, int64_t *id, uint64_t *clock)
{
    sqlite3_stmt *st = m->rows;
    size_t vbytes = 4 * (size_t)m->dim, sbytes = 4 * (size_t)m->sf;
    if (sqlite3_column_type(st, 0) != SQLITE_INTEGER) return im_damaged(m, "a row's id is not an integer");
    *id = sqlite3_column_int64(st, 0);
    long long lid = (long long)*id;
    if (sqlite3_column_type(st, 1) != SQLITE_INTEGER || sqlite3_column_int64(st, 1) < 0)
        return im_damaged(m, "row id %lld: clock is not an integer >= 0", lid);
    *clock = (uint64_t)sqlite3_column_int64(st, 1);
    if (sqlite3_column_type(st, 2) != SQLITE_BLOB || (size_t)sqlite3_column_bytes(st, 2) != vbytes)
        return im_damaged(m, "row id %lld: vec is %s of %d bytes, expected a BLOB of %u (dim %u float32)", lid,
                          type_name(sqlite3_column_type(st, 2)), sqlite3_column_bytes(st, 2), (unsigned)vbytes, m->dim);
    const void *vec = sqlite3_column_blob(st, 2);
    const void *state = NULL;
    if (m->sf) {
        if (sqlite3_column_type(st, 3) != SQLITE_BLOB || (size_t)sqlite3_column_bytes(st, 3) != sbytes)
            return im_damaged(m, "row id %lld: state is %s of %d bytes, expected a BLOB of %u (state_floats %u)", lid,
                              type_name(sqlite3_column_type(st, 3)), sqlite3_column_bytes(st, 3), (unsigned)sbytes,
                              m->sf);
        state = sqlite3_column_blob(st, 3);
    } else if (sqlite3_column_type(st, 3) != SQLITE_NULL) {
        return im_damaged(m, "row id %lld: state is %s, expected NULL (state_floats 0)", lid,
                          type_name(sqlite3_column_type(st, 3)));
    }
    if (!vec) return im_fail(m, SQLITE_NOMEM, "out of memory");
    if (m->sf && !state) return im_fail(m, SQLITE_NOMEM, "out of memory");
    sqlite3_int64 stored = sqlite3_column_int64(st, 4);
    if (sqlite3_column_type(st, 4) != SQLITE_INTEGER || stored < 0 || stored > 0xffffffffll)
        return im_damaged(m, "row id %lld: crc is not a 32-bit unsigned integer", lid);
    uint32_t sum = crc ? row_crc(*id, *clock, vec, vbytes, state, sbytes) : (uint32_t)stored;
    if (sum != (uint32_t)stored)
        return im_damaged(m, "row id %lld: its crc (%lld) does not match its contents (%u)", lid, stored,
                          (unsigned)sum);
    memcpy(m->row, vec, vbytes);
    if (sbytes) memcpy(m->row + m->dim, state, sbytes);
    for (size_t k = 0; k < (size_t)m->dim + m->sf; k++)
        if (!isfinite(m->row[k]))
            return im_fail(m, SQLITE_ERROR, "file '%s': row id %lld: %s element %u is %s (a table holds finite "
                                            "values only)", m->file, lid, k < m->dim ? "vec" : "state",
                           (unsigned)(k < m->dim ? k : k - m->dim), isnan(m->row[k]) ? "NaN" : "infinite");
    /* A table of a reduced dtype holds what the dtype holds: checked here,
     * before any row is written. */
    uint32_t dt = embkv_dtype(m->ref.store);
    float top = embkv_dtype_max(dt);
    for (size_t k = 0; dt != EMBKV_F32 && k < m->dim; k++)
        if (!(fabsf(m->row[k]) <= top))
            return im_fail(m, SQLITE_ERROR, "file '%s': row id %lld: vec element %u (%.9g) is beyond the table's "
                                            "dtype %s (at most %.9g): nothing was imported; import into a table of "
                                            "a dtype that holds it (%s)", m->file, lid, (unsigned)k,
                           (double)m->row[k], embkv_dtype_name(dt), (double)top,
                           dt == EMBKV_F16 ? "f32, bf16 or i8" : "f32 or i8");
    /* The optimizer's state as only its updates leave it: adagrad's sum of
     * squared gradients and adam's second moment are >= 0, adam's step
     * count a whole number >= 0 (a negative accumulator sent the next push
     * to -1e9). */
    const float *sv = m->row + m->dim;
    int opt = m->ref.opts->train.optimizer;
    size_t nonneg = opt == EMBKV_ADAGRAD ? m->dim : opt == EMBKV_ADAM ? (size_t)m->dim * 2 + 1 : 0;
    size_t from = opt == EMBKV_ADAM ? m->dim : 0;
    for (size_t k = from; k < nonneg && k < m->sf; k++)
        if (sv[k] < 0 || (opt == EMBKV_ADAM && k == 2 * (size_t)m->dim && sv[k] != floorf(sv[k])))
            return im_fail(m, SQLITE_ERROR, "file '%s': row id %lld: state element %u is %g: %s", m->file, lid,
                           (unsigned)k, (double)sv[k],
                           opt == EMBKV_ADAGRAD ? "adagrad's accumulated squared gradients are >= 0"
                           : k < 2 * (size_t)m->dim ? "adam's second moments are >= 0"
                                                    : "adam's step count is a whole number >= 0");
    return 0;
}

/* Pass 1: every row checked, the ids new to the table counted. */
static int check_file(importer *m, uint64_t *rows, uint64_t *fresh)
{
    int64_t ids[IMPORT_IDS];
    uint8_t found[IMPORT_IDS];
    size_t n = 0;
    int rc;
    *rows = *fresh = 0;
    while ((rc = sqlite3_step(m->rows)) == SQLITE_ROW) {
        uint64_t clock;
        if (check_row(m, 1, &ids[n], &clock)) return -1;
        ++*rows;
        if (++n == IMPORT_IDS) {
            *fresh += embkv_exists_batch(m->ref.store, ids, n, found);
            n = 0;
        }
    }
    if (rc != SQLITE_DONE) return im_file_fail(m);
    if (n) *fresh += embkv_exists_batch(m->ref.store, ids, n, found);
    if (*rows != m->meta_rows)
        return im_damaged(m, "embkv_meta says %llu rows, embkv_rows holds %llu", (unsigned long long)m->meta_rows,
                          (unsigned long long)*rows);
    sqlite3_reset(m->rows);
    return 0;
}

/* Pass 2: the puts, IMPORT_GROUP rows per write group.  *done: rows put.
 * The rows are checked again but for their crc: pass 1 verified it, and
 * the read transaction keeps SQLite from changing the file since. */
static int write_file(importer *m, uint64_t *done)
{
    embkv_store *s = m->ref.store;
    int rc, erc = EMBKV_OK, in_group = 0;
    *done = 0;
    while ((rc = sqlite3_step(m->rows)) == SQLITE_ROW) {
        int64_t id;
        uint64_t clock;
        if (check_row(m, 0, &id, &clock)) break;
        if (!in_group) {
            if ((erc = embkv_group_begin(s)) != EMBKV_OK) break;
            in_group = 1;
        }
        erc = embkv_put_clock(s, id, m->row, m->sf ? m->row + m->dim : NULL, clock);
        if (erc != EMBKV_OK) {
            im_fail(m, code_of(erc), "id %lld: %s", (long long)id, embkv_errmsg());
            break;
        }
        if (++*done % IMPORT_GROUP == 0) {
            embkv_group_end(s);
            in_group = 0;
        }
    }
    if (in_group) embkv_group_end(s);
    if (erc != EMBKV_OK && !m->why) im_fail(m, code_of(erc), "%s", embkv_errmsg());
    if (m->why) return -1;
    if (rc != SQLITE_DONE) return im_file_fail(m);
    if (*done != m->meta_rows)
        return im_damaged(m, "it held %llu rows when checked and %llu when written", (unsigned long long)m->meta_rows,
                          (unsigned long long)*done);
    return 0;
}

static void importer_free(importer *m)
{
    if (m->rows) sqlite3_finalize(m->rows);
    if (m->in) sqlite3_close(m->in);
    free(m->row);
    sqlite3_free(m->why);
}

static void fn_import(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    importer m;
    memset(&m, 0, sizeof m);
    m.ctx = ctx;
    if (args(ctx, "embkv_import", argv, &m.ref, &m.file)) return;
    if (ekerr_refuse_readonly(ctx, "embkv_import", m.ref.schema, m.ref.name, "it writes rows", m.ref.store)) return;
    embkv_store *s = m.ref.store;
    uint64_t rows = 0, fresh = 0, done = 0;
    int ok = open_in(&m) == 0 && check_file(&m, &rows, &fresh) == 0;
    if (ok) {
        /* Room for all of it first: an import that cannot fit writes
         * nothing.  With an SSD tier the pool need not hold it all at once
         * (the puts demote colder rows as it fills): the index must. */
        embkv_stats st;
        int erc = embkv_stats_get(s, &st);
        if (erc == EMBKV_OK) erc = embkv_grow_index_for(s, fresh);
        if (erc == EMBKV_OK && !st.ssd_size) erc = embkv_room_for(s, rows, 0);
        /* (with a tier, a bound: the new rows must fit the pool and the
         * log together) */
        if (erc == EMBKV_OK && st.ssd_size) erc = embkv_capacity_for(s, fresh);
        if (erc != EMBKV_OK)
            ok = 0, im_fail(&m, code_of(erc), "file '%s' holds %llu rows (%llu of them new to the table): %s%s",
                            m.file, (unsigned long long)rows, (unsigned long long)fresh, embkv_errmsg(),
                            erc == EMBKV_FULL && !st.ssd_size ? " (create the table with a larger capacity or pool_size)"
                                                              : "");
    }
    if (ok) {
        /* No COMMIT or checkpoint of the store inside the import: a crash
         * returns to before it, the sync at the end makes all of it
         * durable. */
        pthread_mutex_t *held = ekreg_commit_lock(s);
        ok = write_file(&m, &done) == 0;
        if (ok) {
            int erc = embkv_sync(s);
            if (erc != EMBKV_OK)
                ok = 0, im_fail(&m, code_of(erc), "the rows are in the table but the checkpoint after them failed: %s",
                                embkv_errmsg());
        } else if (done) {
            /* Running it again helps when others filled the room meanwhile;
             * a table that is full stays so. */
            char *more = sqlite3_mprintf("%s (%llu of %llu rows were imported and stay; run the import again once "
                                         "the table has room: %s)", m.why, (unsigned long long)done,
                                         (unsigned long long)rows,
                                         m.code == SQLITE_FULL ? "a full pool or log stays full: import into a "
                                                                 "table with a larger pool_size or ssd_size"
                                                               : "after what failed is fixed");
            if (more) {
                sqlite3_free(m.why);
                m.why = more;
            }
        }
        ekreg_commit_unlock(held);
    }
    if (ok) sqlite3_result_int64(ctx, (sqlite3_int64)done);
    else fail(ctx, "embkv_import", m.ref.name, m.code ? m.code : SQLITE_ERROR, "%s", m.why ? m.why : "failed");
    importer_free(&m);
}

/* ------------------------------------------------------------------------
 * embkv_backup(table, dir): the engine's online backup (embkv_backup_begin:
 * a checkpoint and a copy of it as a new store in dir), in steps of
 * BACKUP_STEP rows.  The commit lock is held only for the checkpoint, as
 * embkv_checkpoint holds it: COMMITs and training go on while rows are
 * copied.  A relative dir is taken from the directory of the table's
 * database file, as the path option is (so the CREATE that restores it
 * names it the same way).  The table's options file goes into the copy
 * before it is renamed into place, so a table created on it trains as the
 * source did.  Returns {"rows": n, "checkpoint": epoch, "bytes": b, "ms": t}.
 */
#define BACKUP_STEP 65536

/* Copies file name of directory from into directory to, synced; 0 or -1. */
static int copy_app_file(const char *from, const char *to, const char *name)
{
    char src[PATH_MAX], dst[PATH_MAX];
    snprintf(src, sizeof src, "%s/%s", from, name);
    snprintf(dst, sizeof dst, "%s/%s", to, name);
    FILE *in = fopen(src, "rb");
    if (!in) return errno == ENOENT ? 0 : -1;
    FILE *out = fopen(dst, "wb");
    char buf[4096];
    size_t n;
    int bad = !out;
    while (!bad && (n = fread(buf, 1, sizeof buf, in)) > 0) bad = fwrite(buf, 1, n, out) != n;
    bad |= ferror(in);
    fclose(in);
    if (out) {
        bad |= fflush(out) != 0 || fsync(fileno(out)) != 0;
        bad |= fclose(out) != 0;
    }
    return bad ? -1 : 0;
}

static void fn_backup(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    const char *dir;
    if (args(ctx, "embkv_backup", argv, &ref, &dir)) return;
    /* (beside another process's writer it copies that writer's last
     * checkpoint, and changes nothing) */
    if (!embkv_readonly(ref.store) &&
        ekerr_refuse_readonly(ctx, "embkv_backup", ref.schema, ref.name, "it checkpoints the table first", ref.store)) return;
    const char *dbfile = sqlite3_db_filename(sqlite3_context_db_handle(ctx), ref.schema);
    const char *slash = dbfile && *dbfile ? strrchr(dbfile, '/') : NULL;
    char *full = dir[0] == '/' || !slash ? sqlite3_mprintf("%s", dir)
                                         : sqlite3_mprintf("%.*s/%s", (int)(slash - dbfile), dbfile, dir);
    if (!full) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    char *said = full[0] == '/' ? sqlite_file_at(sqlite3_context_db_handle(ctx), full) : NULL;
    if (said) {
        fail(ctx, "embkv_backup", ref.name, SQLITE_ERROR, "directory '%s' is the name SQLite gives %s, which "
             "would take the backup for it: name another", dir, said);
        sqlite3_free(said);
        sqlite3_free(full);
        return;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    embkv_backup *b = NULL;
    pthread_mutex_t *held = ekreg_commit_lock(ref.store);
    int erc = embkv_backup_begin(ref.store, full, &b);
    ekreg_commit_unlock(held);
    int done = 0;
    while (erc == EMBKV_OK && !done) erc = embkv_backup_step(b, BACKUP_STEP, &done);
    char why[600] = "";
    if (erc != EMBKV_OK) snprintf(why, sizeof why, "%s", embkv_errmsg());
    if (erc == EMBKV_OK && copy_app_file(ref.dir, embkv_backup_dir(b), OPTS_FILE) != 0) {
        erc = EMBKV_IO;
        snprintf(why, sizeof why, "cannot copy the table's options (%s) into the backup: %s", OPTS_FILE,
                 strerror(errno));
    }
    if (erc == EMBKV_OK && copy_app_file(ref.dir, embkv_backup_dir(b), STORE_ID_FILE) != 0) {
        erc = EMBKV_IO;
        snprintf(why, sizeof why, "cannot copy the store's id (%s) into the backup: %s", STORE_ID_FILE,
                 strerror(errno));
    }
    embkv_backup_info info;
    if (b && erc != EMBKV_OK) {
        /* (a copy without the table's own files is no backup of it: never
         * placed at its name) */
        (void)embkv_backup_abandon(b);
    } else if (b) {
        int frc = embkv_backup_finish(b, &info);
        if (erc == EMBKV_OK && frc != EMBKV_OK) {
            erc = frc;
            snprintf(why, sizeof why, "%s", embkv_errmsg());
        }
    }
    sqlite3_free(full);
    if (erc != EMBKV_OK) {
        const char *msg = strncmp(why, "embkv_backup: ", 14) ? why : why + 14;
        fail(ctx, "embkv_backup", ref.name, code_of(erc), "%s", msg);
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    char *json = sqlite3_mprintf("{\"rows\":%llu,\"checkpoint\":%llu,\"bytes\":%llu,\"ms\":%.1f}",
                                 (unsigned long long)info.rows, (unsigned long long)info.epoch,
                                 (unsigned long long)info.bytes, ms);
    if (!json) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_text(ctx, json, -1, sqlite3_free);
}

int embkv_export_register(sqlite3 *db)
{
    /* Files and writes to the store: never from views, triggers or schema. */
    const int flags = SQLITE_UTF8 | SQLITE_DIRECTONLY;
    int rc = sqlite3_create_function_v2(db, "embkv_export", 2, flags, NULL, fn_export, NULL, NULL, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_create_function_v2(db, "embkv_export", 3, flags, NULL, fn_export, NULL, NULL, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_create_function_v2(db, "embkv_import", 2, flags, NULL, fn_import, NULL, NULL, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_create_function_v2(db, "embkv_backup", 2, flags, NULL, fn_backup, NULL, NULL, NULL);
    return rc;
}
