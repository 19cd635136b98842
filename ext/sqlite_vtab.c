/*
 * sqlite_vtab.c - the embkv virtual table module.
 *
 *   CREATE VIRTUAL TABLE item USING embkv(dim=64 [, path='dir'] [, pool_size=256M]
 *                                         [, capacity=1000000]);
 *   schema: id INTEGER PRIMARY KEY, vec BLOB, clock INTEGER HIDDEN, tier TEXT HIDDEN
 *
 * Where a table's data lives.  Option path names the store directory
 * (relative paths are taken relative to the database file's directory, so
 * a database and its tables can move together; for :memory: databases,
 * relative to the current directory).  Without it, the directory is
 * <database file>-<id>.embkv beside the database file, where <id> is a
 * random 64-bit id drawn at CREATE and kept in the shadow table
 * <name>_config (k, v).  Why a shadow table: xConnect only gets the
 * arguments of the original CREATE statement, which cannot be rewritten,
 * and a directory named after the table would break ALTER TABLE RENAME;
 * nothing in those arguments tells two tables with the same options apart,
 * so the id must be stored, and storing it in the database makes it follow
 * the schema through RENAME (xRename renames the shadow table), ROLLBACK
 * and copies of the file.  Tables of :memory: and temporary databases get
 * a temporary directory (under $TMPDIR) removed when the last connection
 * using it closes.  DROP TABLE removes the directory once the DROP commits;
 * a rolled-back CREATE removes the directory it made (sqlite_registry.c).
 *
 * Plans (xBestIndex), shown by EXPLAIN QUERY PLAN as INDEX <n>:<name>:
 *   1 point      id = ?: unique point lookup
 *   2 in-batch   id IN (...), IN (SELECT ...): the whole list through
 *                sqlite3_vtab_in, served by one embkv_get_batch
 *   3 fullscan   anything else: every id from embkv_scan_ids, vectors
 *                fetched 256 rows per embkv_get_batch
 * A name ending in " ids-only" means the query does not use vec (colUsed):
 * the cursor then never reads a vector (count(*), SELECT id, EXISTS).
 *
 * Writes go to the connection's transaction buffer (sqlite_txn.c) and reach
 * the store at COMMIT (xSync), followed by embkv_sync, so a committed
 * transaction is durable; its cost follows the pages the transaction
 * changed, not the size of the table.
 */
#include "sqlite_vtab.h"
SQLITE_EXTENSION_INIT3

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define EK_SCHEMA "CREATE TABLE x(id INTEGER PRIMARY KEY, vec BLOB, clock INTEGER HIDDEN, tier TEXT HIDDEN)"
enum { COL_ID = 0, COL_VEC = 1, COL_CLOCK = 2, COL_TIER = 3 };
enum { PLAN_POINT = 1, PLAN_IN = 2, PLAN_SCAN = 3 };
#define SCAN_CHUNK 256   /* rows per embkv_get_batch in a full scan */
#define SCAN_IDS 4096    /* ids per embkv_scan_ids call */

static void vt_err(ekvtab *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *m = sqlite3_vmprintf(fmt, ap);
    va_end(ap);
    sqlite3_free(v->base.zErrMsg);
    v->base.zErrMsg = sqlite3_mprintf("embkv table %s: %s", v->zName, m ? m : "out of memory");
    sqlite3_free(m);
}

static int sqlite_rc_of(int erc)
{
    switch (erc) {
    case EMBKV_OK: return SQLITE_OK;
    case EMBKV_NOMEM: return SQLITE_NOMEM;
    case EMBKV_FULL: return SQLITE_FULL;
    case EMBKV_IO: return SQLITE_IOERR;
    case EMBKV_LOCKED: return SQLITE_BUSY;
    case EMBKV_BUSY: return SQLITE_BUSY;
    case EMBKV_CORRUPT: return SQLITE_CORRUPT;
    case EMBKV_NOTSTORE:
    case EMBKV_VERSION: return SQLITE_CANTOPEN;
    default: return SQLITE_ERROR;
    }
}

/* ------------------------------------------------------------------------
 * Options: one line per option.
 */
enum { EKO_U32, EKO_U64, EKO_BYTES, EKO_STR };

typedef struct ekopt_def {
    const char *name;
    int type;
    size_t off;          /* field in embkv_tabopts */
    uint64_t lo, hi;     /* numeric range */
    const char *expect;  /* for error messages */
} ekopt_def;

static const ekopt_def ek_options[] = {
    {"dim", EKO_U32, offsetof(embkv_tabopts, dim), 1, EMBKV_MAX_DIM, "an integer from 1 to 8192"},
    {"path", EKO_STR, offsetof(embkv_tabopts, path), 0, 0, "a directory name"},
    {"pool_size", EKO_BYTES, offsetof(embkv_tabopts, pool_size), 1, 1ull << 50,
     "a size in bytes such as 268435456, 256M or 4G"},
    {"capacity", EKO_U64, offsetof(embkv_tabopts, capacity), 1, 1ull << 40,
     "a row count from 1 to 1099511627776"},
};
#define N_OPTIONS (sizeof ek_options / sizeof ek_options[0])
#define OPTION_NAMES "dim, path, pool_size, capacity"

static int is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* The value text of an argument: blanks around it dropped, '...' and "..."
 * unquoted (a doubled quote stands for one).  NULL on unbalanced quotes. */
static char *opt_value(const char *s)
{
    while (is_blank(*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && is_blank(s[n - 1])) n--;
    if (n > 0 && (s[0] == '\'' || s[0] == '"')) {
        char q = s[0];
        if (n < 2 || s[n - 1] != q) return NULL;
        char *out = sqlite3_malloc64(n);
        if (!out) return NULL;
        size_t w = 0;
        for (size_t i = 1; i < n - 1; i++) {
            if (s[i] == q) {
                if (i + 1 < n - 1 && s[i + 1] == q) i++;
                else {
                    sqlite3_free(out);
                    return NULL;
                }
            }
            out[w++] = s[i];
        }
        out[w] = 0;
        return out;
    }
    return sqlite3_mprintf("%.*s", (int)n, s);
}

/* Unsigned decimal, optionally (bytes) with a K/M/G/T suffix (powers of
 * 1024) and an optional trailing B.  0 on success. */
static int parse_uint(const char *s, int bytes, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9') return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (bytes && *p) {
        int shift = 0;
        switch (*p) {
        case 'k': case 'K': shift = 10; break;
        case 'm': case 'M': shift = 20; break;
        case 'g': case 'G': shift = 30; break;
        case 't': case 'T': shift = 40; break;
        case 'b': case 'B': break;
        default: return -1;
        }
        if (shift) {
            p++;
            if (v > (UINT64_MAX >> shift)) return -1;
            v <<= shift;
        }
        if (*p == 'b' || *p == 'B') p++;
    }
    if (*p) return -1;
    *out = v;
    return 0;
}

static int parse_options(ekvtab *v, int argc, const char *const *argv, char **err)
{
    unsigned seen = 0;
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        if (!eq) {
            *err = sqlite3_mprintf("argument '%s' is not key=value (options: %s)", a, OPTION_NAMES);
            return SQLITE_ERROR;
        }
        const char *k = a;
        while (is_blank(*k)) k++;
        size_t klen = (size_t)(eq - k);
        while (klen > 0 && is_blank(k[klen - 1])) klen--;
        const ekopt_def *d = NULL;
        unsigned bit = 0;
        for (unsigned j = 0; j < N_OPTIONS; j++) {
            if (strlen(ek_options[j].name) == klen && sqlite3_strnicmp(ek_options[j].name, k, (int)klen) == 0) {
                d = &ek_options[j];
                bit = 1u << j;
            }
        }
        if (!d) {
            *err = sqlite3_mprintf("unknown option '%.*s' (options: %s)", (int)klen, k, OPTION_NAMES);
            return SQLITE_ERROR;
        }
        if (seen & bit) {
            *err = sqlite3_mprintf("option %s is given twice", d->name);
            return SQLITE_ERROR;
        }
        seen |= bit;
        char *val = opt_value(eq + 1);
        const char *raw = eq + 1;
        while (is_blank(*raw)) raw++;
        int ok = val && *val;
        char *field = (char *)&v->opts + d->off;
        if (ok) {
            uint64_t u = 0;
            switch (d->type) {
            case EKO_U32:
            case EKO_U64:
            case EKO_BYTES:
                ok = parse_uint(val, d->type == EKO_BYTES, &u) == 0 && u >= d->lo && u <= d->hi;
                if (ok && d->type == EKO_U32) *(uint32_t *)(void *)field = (uint32_t)u;
                else if (ok) *(uint64_t *)(void *)field = u;
                break;
            case EKO_STR:
                sqlite3_free(v->optpath);
                v->optpath = val;
                val = NULL;
                *(const char **)(void *)field = v->optpath;
                break;
            }
        }
        sqlite3_free(val);
        if (!ok) {
            *err = sqlite3_mprintf("option %s: expected %s, got %s", d->name, d->expect, *raw ? raw : "nothing");
            return SQLITE_ERROR;
        }
    }
    if (!(seen & 1u)) {
        *err = sqlite3_mprintf("option dim is required, e.g. USING embkv(dim=64)");
        return SQLITE_ERROR;
    }
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * The stable id and the shadow table <name>_config
 */
static int shadow_create(ekvtab *v, char **err)
{
    char *sql = sqlite3_mprintf("CREATE TABLE \"%w\".\"%w_config\"(k TEXT PRIMARY KEY, v) WITHOUT ROWID;"
                                "INSERT INTO \"%w\".\"%w_config\"(k, v) VALUES ('id', %Q), ('format', 1);",
                                v->zDb, v->zName, v->zDb, v->zName, v->tid);
    if (!sql) return SQLITE_NOMEM;
    char *msg = NULL;
    int rc = sqlite3_exec(v->db, sql, NULL, NULL, &msg);
    sqlite3_free(sql);
    if (rc != SQLITE_OK)
        *err = sqlite3_mprintf("cannot create its shadow table %s_config: %s", v->zName,
                               msg ? msg : sqlite3_errstr(rc));
    sqlite3_free(msg);
    return rc;
}

static int shadow_read(ekvtab *v, char **err)
{
    char *sql = sqlite3_mprintf("SELECT v FROM \"%w\".\"%w_config\" WHERE k = 'id'", v->zDb, v->zName);
    if (!sql) return SQLITE_NOMEM;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(v->db, sql, -1, &st, NULL);
    sqlite3_free(sql);
    if (rc != SQLITE_OK) {
        *err = sqlite3_mprintf("its shadow table %s_config is missing (%s)", v->zName, sqlite3_errmsg(v->db));
        sqlite3_finalize(st);
        return SQLITE_ERROR;
    }
    rc = sqlite3_step(st);
    const unsigned char *t = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
    int ok = t && strlen((const char *)t) == 16 && strspn((const char *)t, "0123456789abcdef") == 16;
    if (ok) memcpy(v->tid, t, 17);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        *err = sqlite3_mprintf("cannot read its shadow table %s_config: %s", v->zName, sqlite3_errmsg(v->db));
    } else if (!ok) {
        *err = sqlite3_mprintf("its shadow table %s_config holds no valid id", v->zName);
    }
    sqlite3_finalize(st);
    return ok ? SQLITE_OK : SQLITE_ERROR;
}

/* The store directory of the table (sqlite3_malloc'd). */
static char *dir_for(ekvtab *v, int create, char **err)
{
    const char *dbfile = sqlite3_db_filename(v->db, v->zDb);
    int memdb = !dbfile || !*dbfile;
    if (v->opts.path) {
        const char *slash = memdb ? NULL : strrchr(dbfile, '/');
        if (v->opts.path[0] == '/' || !slash) return sqlite3_mprintf("%s", v->opts.path);
        return sqlite3_mprintf("%.*s/%s", (int)(slash - dbfile), dbfile, v->opts.path);
    }
    if (memdb) {
        char *path = NULL;
        v->is_tmp = 1;
        int rc = create ? ekreg_tmpdir_create(v->conn, v->tid, &path, err)
                        : ekreg_tmpdir_find(v->conn, v->tid, &path, err);
        return rc == SQLITE_OK ? path : NULL;
    }
    return sqlite3_mprintf("%s-%s.embkv", dbfile, v->tid);
}

/* ------------------------------------------------------------------------
 * xCreate, xConnect, xDisconnect, xDestroy, xRename
 */
static void vt_free(ekvtab *v)
{
    ekconn *c = v->conn;
    if (c) ekconn_remove(c, v);
    if (v->store) ekreg_close(v->store);
    ektxn_free(v->txn);
    sqlite3_free(v->scratch);
    sqlite3_free(v->zDb);
    sqlite3_free(v->zName);
    sqlite3_free(v->optpath);
    sqlite3_free(v->dir);
    sqlite3_free(v->broken);
    sqlite3_free(v->base.zErrMsg);
    sqlite3_free(v);
    ekconn_unref(c);
}

static int vt_init(sqlite3 *db, void *aux, int argc, const char *const *argv, sqlite3_vtab **ppVtab,
                   char **pzErr, int create)
{
    ekvtab *v = sqlite3_malloc(sizeof *v);
    if (!v) return SQLITE_NOMEM;
    memset(v, 0, sizeof *v);
    v->db = db;
    v->conn = aux;
    ekconn_ref(v->conn);
    v->zDb = sqlite3_mprintf("%s", argv[1]);
    v->zName = sqlite3_mprintf("%s", argv[2]);
    char *err = NULL, *dir = NULL;
    int made_dir = 0, rc;
    if (!v->zDb || !v->zName) {
        rc = SQLITE_NOMEM;
        goto fail;
    }
    rc = parse_options(v, argc, argv, &err);
    if (rc != SQLITE_OK) goto fail;
    if (create) {
        uint64_t r;
        sqlite3_randomness(sizeof r, &r);
        snprintf(v->tid, sizeof v->tid, "%016llx", (unsigned long long)r);
    } else if ((rc = shadow_read(v, &err)) != SQLITE_OK) {
        goto broken;
    }
    dir = dir_for(v, create, &err);
    if (!dir) {
        rc = err ? SQLITE_ERROR : SQLITE_NOMEM;
        if (!create && rc == SQLITE_ERROR) goto broken;
        goto fail;
    }
    if (create) {
        struct stat st;
        made_dir = v->is_tmp || (stat(dir, &st) != 0 && errno == ENOENT);
    }
    embkv_options eo;
    memset(&eo, 0, sizeof eo);
    eo.dim = v->opts.dim;
    eo.expected_rows = v->opts.capacity;
    eo.pool_size = v->opts.pool_size;
    char *emsg = NULL;
    int erc = ekreg_open(dir, &eo, create ? EMBKV_OPEN_CREATE : 0, &v->store, &emsg);
    if (erc != EMBKV_OK) {
        err = sqlite3_mprintf("%s%s", v->opts.path ? "option path: " : "cannot open its store: ",
                              emsg ? emsg : "out of memory");
        sqlite3_free(emsg);
        rc = sqlite_rc_of(erc);
        /* Another process holding the store is an error here and now. */
        if (!create && erc != EMBKV_LOCKED && erc != EMBKV_NOMEM) goto broken;
        goto fail;
    }
    v->dir = sqlite3_mprintf("%s", embkv_path(v->store));
    v->dim = embkv_dim(v->store);
    v->state_floats = embkv_state_floats(v->store);
    v->txn = ektxn_new(v->dim, v->state_floats);
    v->scratch = sqlite3_malloc64((uint64_t)v->dim * sizeof(float));
    if (!v->dir || !v->txn || !v->scratch) {
        rc = SQLITE_NOMEM;
        goto fail;
    }
    rc = sqlite3_declare_vtab(db, EK_SCHEMA);
    if (rc == SQLITE_OK) rc = sqlite3_vtab_config(db, SQLITE_VTAB_CONSTRAINT_SUPPORT, 1);
    /* Its arguments name files: never from a view, trigger or schema. */
    if (rc == SQLITE_OK) rc = sqlite3_vtab_config(db, SQLITE_VTAB_DIRECTONLY);
    if (rc != SQLITE_OK) {
        err = sqlite3_mprintf("cannot declare its schema: %s", sqlite3_errmsg(db));
        goto fail;
    }
    if (create) {
        rc = shadow_create(v, &err);
        if (rc != SQLITE_OK) goto fail;
        if (made_dir) {
            rc = ekconn_defer_remove(v->conn, EK_ON_ROLLBACK, v->dir, v->is_tmp ? v->tid : NULL, &err);
            if (rc != SQLITE_OK) goto fail;
        }
    }
    sqlite3_free(dir);
    ekconn_add(v->conn, v);
    *ppVtab = &v->base;
    return SQLITE_OK;

broken:
    /* An existing table whose store cannot be opened (its directory is
     * gone, holds something else or a newer format, its shadow table is
     * missing): connect anyway, so that DROP TABLE still works, and fail
     * every other use with the reason.  Such a DROP leaves the directory
     * alone: it was never seen to be an embkv store. */
    v->broken = err ? err : sqlite3_mprintf("%s", sqlite3_errstr(rc));
    err = NULL;
    sqlite3_free(dir);
    dir = NULL;
    v->dim = v->opts.dim;
    if (!v->broken) {
        rc = SQLITE_NOMEM;
        goto fail;
    }
    rc = sqlite3_declare_vtab(db, EK_SCHEMA);
    if (rc == SQLITE_OK) rc = sqlite3_vtab_config(db, SQLITE_VTAB_CONSTRAINT_SUPPORT, 1);
    if (rc == SQLITE_OK) rc = sqlite3_vtab_config(db, SQLITE_VTAB_DIRECTONLY);
    if (rc != SQLITE_OK) goto fail;
    ekconn_add(v->conn, v);
    *ppVtab = &v->base;
    return SQLITE_OK;

fail:
    *pzErr = sqlite3_mprintf("embkv table %s: %s", argv[2], err ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    if (v->store) {
        ekreg_close(v->store);
        v->store = NULL;
    }
    if (made_dir) {
        if (v->is_tmp) ekreg_tmpdir_forget(v->conn, v->tid);
        else ek_remove_tree(dir);
    }
    sqlite3_free(dir);
    vt_free(v);
    return rc == SQLITE_OK ? SQLITE_ERROR : rc;
}

static int vt_create(sqlite3 *db, void *aux, int argc, const char *const *argv, sqlite3_vtab **pp, char **pzErr)
{
    return vt_init(db, aux, argc, argv, pp, pzErr, 1);
}

static int vt_connect(sqlite3 *db, void *aux, int argc, const char *const *argv, sqlite3_vtab **pp, char **pzErr)
{
    return vt_init(db, aux, argc, argv, pp, pzErr, 0);
}

static int vt_disconnect(sqlite3_vtab *pv)
{
    vt_free((ekvtab *)pv);
    return SQLITE_OK;
}

static int vt_destroy(sqlite3_vtab *pv)
{
    ekvtab *v = (ekvtab *)pv;
    char *err = NULL;
    /* The directory goes when the DROP commits, not now. */
    int rc = v->store ? ekconn_defer_remove(v->conn, EK_ON_COMMIT, v->dir, v->is_tmp ? v->tid : NULL, &err)
                      : SQLITE_OK;
    if (rc != SQLITE_OK) {
        vt_err(v, "%s", err ? err : sqlite3_errstr(rc));
        sqlite3_free(err);
        return rc;
    }
    char *sql = sqlite3_mprintf("DROP TABLE IF EXISTS \"%w\".\"%w_config\"", v->zDb, v->zName);
    if (!sql) return SQLITE_NOMEM;
    char *msg = NULL;
    rc = sqlite3_exec(v->db, sql, NULL, NULL, &msg);
    sqlite3_free(sql);
    if (rc != SQLITE_OK) {
        vt_err(v, "cannot drop its shadow table %s_config: %s", v->zName, msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return rc;
    }
    vt_free(v);
    return SQLITE_OK;
}

static int vt_rename(sqlite3_vtab *pv, const char *zNew)
{
    ekvtab *v = (ekvtab *)pv;
    char *name = sqlite3_mprintf("%s", zNew);
    char *sql = sqlite3_mprintf("ALTER TABLE \"%w\".\"%w_config\" RENAME TO \"%w_config\"", v->zDb, v->zName,
                                zNew);
    if (!name || !sql) {
        sqlite3_free(name);
        sqlite3_free(sql);
        return SQLITE_NOMEM;
    }
    char *msg = NULL;
    int rc = sqlite3_exec(v->db, sql, NULL, NULL, &msg);
    sqlite3_free(sql);
    if (rc != SQLITE_OK) {
        vt_err(v, "cannot rename its shadow table %s_config: %s", v->zName, msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        sqlite3_free(name);
        return rc;
    }
    sqlite3_free(v->zName);
    v->zName = name;
    return SQLITE_OK;
}

static int vt_shadow_name(const char *suffix)
{
    return sqlite3_stricmp(suffix, "config") == 0;
}

/* ------------------------------------------------------------------------
 * Values
 */

/* An id from a value: INTEGER, a REAL with an integral value, or TEXT that
 * reads as one (as INTEGER affinity would convert it).  1 if it is one. */
static int value_to_id(sqlite3_value *val, int64_t *out)
{
    switch (sqlite3_value_type(val)) {
    case SQLITE_INTEGER:
        *out = sqlite3_value_int64(val);
        return 1;
    case SQLITE_FLOAT: {
        double d = sqlite3_value_double(val);
        if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == floor(d)) {
            *out = (int64_t)d;
            return 1;
        }
        return 0;
    }
    case SQLITE_TEXT: {
        const char *s = (const char *)sqlite3_value_text(val);
        if (!s) return 0;
        while (is_blank(*s)) s++;
        size_t n = strlen(s);
        while (n > 0 && is_blank(s[n - 1])) n--;
        if (n == 0 || n > 64 || strspn(s, "0123456789+-.eE") < n) return 0;
        char buf[72];
        memcpy(buf, s, n);
        buf[n] = 0;
        /* Exact integers first (beyond 2^53 a double would round). */
        const char *p = buf;
        int neg = 0;
        if (*p == '+' || *p == '-') neg = *p++ == '-';
        if (*p && strspn(p, "0123456789") == strlen(p)) {
            uint64_t u = 0;
            for (; *p; p++) {
                if (u > (UINT64_MAX - 9) / 10) return 0;
                u = u * 10 + (uint64_t)(*p - '0');
            }
            if (neg ? u > (uint64_t)INT64_MAX + 1 : u > (uint64_t)INT64_MAX) return 0;
            *out = neg ? (int64_t)(0 - u) : (int64_t)u;
            return 1;
        }
        char *end = NULL;
        errno = 0;
        double d = strtod(buf, &end);
        if (errno || *end || !(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != floor(d))
            return 0;
        *out = (int64_t)d;
        return 1;
    }
    default:
        return 0;
    }
}

/* The id of a write, or an error naming what was given. */
static int write_id(ekvtab *v, sqlite3_value *val, int64_t *out)
{
    if (value_to_id(val, out)) return SQLITE_OK;
    switch (sqlite3_value_type(val)) {
    case SQLITE_NULL:
        vt_err(v, "id must be an INTEGER, got NULL (an embkv table has no automatic ids)");
        break;
    case SQLITE_TEXT:
        vt_err(v, "id must be an INTEGER, got TEXT '%.40s'", (const char *)sqlite3_value_text(val));
        break;
    case SQLITE_FLOAT:
        vt_err(v, "id must be an INTEGER, got REAL %!.15g", sqlite3_value_double(val));
        break;
    default:
        vt_err(v, "id must be an INTEGER, got a %d-byte BLOB", sqlite3_value_bytes(val));
        break;
    }
    return SQLITE_MISMATCH;
}

static const char *nonfinite_name(float f)
{
    return isnan(f) ? "NaN" : f > 0 ? "Inf" : "-Inf";
}

/* A vector from a float32 BLOB or a JSON array of numbers, into out. */
static int parse_vec(ekvtab *v, int64_t id, sqlite3_value *val, float *out)
{
    const unsigned dim = v->dim;
#define EXPECT "id %lld: vector must be %u float32 (%u-byte BLOB) or a JSON array of %u numbers, got "
#define EXPECT_ARGS (long long)id, dim, dim * 4, dim
    switch (sqlite3_value_type(val)) {
    case SQLITE_BLOB: {
        int n = sqlite3_value_bytes(val);
        const void *b = sqlite3_value_blob(val);
        if ((unsigned)n != dim * 4 || !b) {
            vt_err(v, EXPECT "a %d-byte BLOB", EXPECT_ARGS, n);
            return SQLITE_MISMATCH;
        }
        memcpy(out, b, (size_t)dim * 4);
        for (unsigned i = 0; i < dim; i++) {
            if (!isfinite(out[i])) {
                vt_err(v, "id %lld: vec[%u] is %s; vector elements must be finite", (long long)id, i,
                       nonfinite_name(out[i]));
                return SQLITE_MISMATCH;
            }
        }
        return SQLITE_OK;
    }
    case SQLITE_TEXT: {
        const char *s = (const char *)sqlite3_value_text(val);
        int n = sqlite3_value_bytes(val);
        if (!s) return SQLITE_NOMEM;
        /* The length includes the terminating NUL: with it cJSON rejects
         * anything after the value ('[1,2] junk'). */
        cJSON *j = cJSON_ParseWithLengthOpts(s, (size_t)n + 1, NULL, 1);
        int rc = SQLITE_MISMATCH;
        if (!j) {
            vt_err(v, EXPECT "text that is not JSON: '%.32s%s'", EXPECT_ARGS, s, n > 32 ? "..." : "");
        } else if (!cJSON_IsArray(j)) {
            vt_err(v, EXPECT "JSON that is not an array: '%.32s%s'", EXPECT_ARGS, s, n > 32 ? "..." : "");
        } else if ((unsigned)cJSON_GetArraySize(j) != dim) {
            vt_err(v, EXPECT "a JSON array of %d elements", EXPECT_ARGS, cJSON_GetArraySize(j));
        } else {
            unsigned i = 0;
            const cJSON *e;
            rc = SQLITE_OK;
            cJSON_ArrayForEach(e, j) {
                if (!cJSON_IsNumber(e)) {
                    vt_err(v, EXPECT "a JSON array whose element %u is not a number", EXPECT_ARGS, i);
                    rc = SQLITE_MISMATCH;
                    break;
                }
                double d = cJSON_GetNumberValue(e);
                float f = (float)d;
                if (!isfinite(d) || !isfinite(f)) {
                    vt_err(v, "id %lld: vec[%u] = %g is out of float32 range", (long long)id, i, d);
                    rc = SQLITE_MISMATCH;
                    break;
                }
                out[i++] = f;
            }
        }
        cJSON_Delete(j);
        return rc;
    }
    case SQLITE_NULL:
        vt_err(v, EXPECT "NULL", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    case SQLITE_INTEGER:
        vt_err(v, EXPECT "an INTEGER", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    default:
        vt_err(v, EXPECT "a REAL", EXPECT_ARGS);
        return SQLITE_MISMATCH;
    }
#undef EXPECT
#undef EXPECT_ARGS
}

/* Is id present as this connection sees it (its own writes included)?
 * 1 yes, 0 no. */
static int row_exists(ekvtab *v, int64_t id)
{
    const ektxn_entry *e = ektxn_find(v->txn, id);
    if (e) return e->kind == EKTXN_PUT;
    return embkv_exists(v->store, id) == 1;
}

/* Reads a row's vector as this connection sees it: 1 found, 0 absent,
 * -1 error (message set). */
static int read_row(ekvtab *v, int64_t id, float *out)
{
    const ektxn_entry *e = ektxn_find(v->txn, id);
    if (e) {
        if (e->kind != EKTXN_PUT) return 0;
        memcpy(out, e->vec, (size_t)v->dim * 4);
        return 1;
    }
    int erc = embkv_get(v->store, id, out, NULL, NULL);
    if (erc == EMBKV_OK) return 1;
    if (erc == EMBKV_NOTFOUND) return 0;
    vt_err(v, "id %lld: read failed: %s", (long long)id, embkv_errmsg());
    return -1;
}

/* ------------------------------------------------------------------------
 * xBestIndex
 */
static const char *const plan_name[4][2] = {
    {"", ""},
    {"point ids-only", "point"},
    {"in-batch ids-only", "in-batch"},
    {"fullscan ids-only", "fullscan"},
};

/* A table connected without its store (see vt_init) can only be dropped. */
static int vt_unusable(ekvtab *v)
{
    if (v->store) return 0;
    vt_err(v, "%s", v->broken);
    return 1;
}

static int vt_best_index(sqlite3_vtab *pv, sqlite3_index_info *info)
{
    ekvtab *v = (ekvtab *)pv;
    if (vt_unusable(v)) return SQLITE_ERROR;
    int eq = -1, in = -1;
    for (int i = 0; i < info->nConstraint; i++) {
        const struct sqlite3_index_constraint *k = &info->aConstraint[i];
        if (!k->usable || k->op != SQLITE_INDEX_CONSTRAINT_EQ) continue;
        if (k->iColumn != COL_ID && k->iColumn != -1) continue;
        if (sqlite3_vtab_in(info, i, -1)) {
            if (in < 0) in = i;
        } else if (eq < 0) {
            eq = i;
        }
    }
    int want_vec = (info->colUsed & ((sqlite3_uint64)1 << COL_VEC)) != 0;
    double rows = (double)embkv_count(v->store);
    int plan;
    if (eq >= 0) {
        plan = PLAN_POINT;
        info->aConstraintUsage[eq].argvIndex = 1;
        info->aConstraintUsage[eq].omit = 1;
        info->idxFlags |= SQLITE_INDEX_SCAN_UNIQUE;
        info->estimatedRows = 1;
        info->estimatedCost = 1;
    } else if (in >= 0) {
        plan = PLAN_IN;
        sqlite3_vtab_in(info, in, 1);
        info->aConstraintUsage[in].argvIndex = 1;
        info->aConstraintUsage[in].omit = 1;
        double n = rows < 32 ? rows : 32; /* the list's length is unknown here */
        info->estimatedRows = (sqlite3_int64)(n < 1 ? 1 : n);
        info->estimatedCost = 5 + n;
    } else {
        plan = PLAN_SCAN;
        info->estimatedRows = (sqlite3_int64)(rows < 1 ? 1 : rows);
        info->estimatedCost = 10 + 2 * rows;
    }
    info->idxNum = plan;
    info->idxStr = (char *)plan_name[plan][want_vec];
    info->needToFreeIdxStr = 0;
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * Cursors
 */
typedef struct ekcur {
    sqlite3_vtab_cursor base;
    int plan, want_vec, eof;
    int64_t *ids;          /* the candidate ids, in output order */
    size_t nids, capids;
    size_t pos;            /* current index into ids */
    size_t chunk;          /* rows loaded at a time */
    size_t lo, hi;         /* ids[lo..hi) are loaded */
    size_t capchunk;       /* allocated rows of the buffers below */
    float *vecs;           /* chunk rows of dim floats */
    uint8_t *st;           /* per loaded row: 0 absent, 1 committed, 2 uncommitted */
    uint8_t *found;
    size_t *eidx;          /* rows of the chunk read from the store */
    int64_t *eids;
    float *evecs;
    int info_state;        /* 0 unknown, 1 committed info, 2 absent, 3 uncommitted */
    embkv_rowinfo info;
} ekcur;

static int vt_open(sqlite3_vtab *pv, sqlite3_vtab_cursor **pc)
{
    (void)pv;
    ekcur *c = sqlite3_malloc(sizeof *c);
    if (!c) return SQLITE_NOMEM;
    memset(c, 0, sizeof *c);
    c->eof = 1;
    *pc = &c->base;
    return SQLITE_OK;
}

static int vt_close(sqlite3_vtab_cursor *pc)
{
    ekcur *c = (ekcur *)pc;
    sqlite3_free(c->ids);
    sqlite3_free(c->vecs);
    sqlite3_free(c->st);
    sqlite3_free(c->found);
    sqlite3_free(c->eidx);
    sqlite3_free(c->eids);
    sqlite3_free(c->evecs);
    sqlite3_free(c);
    return SQLITE_OK;
}

static int ids_reserve(ekcur *c, size_t n)
{
    if (n <= c->capids) return SQLITE_OK;
    size_t cap = c->capids ? c->capids : 16;
    while (cap < n) cap *= 2;
    int64_t *p = sqlite3_realloc64(c->ids, (uint64_t)cap * sizeof *p);
    if (!p) return SQLITE_NOMEM;
    c->ids = p;
    c->capids = cap;
    return SQLITE_OK;
}

static int ids_push(ekcur *c, int64_t id)
{
    if (c->nids == c->capids && ids_reserve(c, c->nids + 1) != SQLITE_OK) return SQLITE_NOMEM;
    c->ids[c->nids++] = id;
    return SQLITE_OK;
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int scan_collect(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)vec;
    (void)state;
    (void)info;
    return ids_push(ctx, id) == SQLITE_OK ? 0 : 1;
}

/* Every id the connection sees: the store's (scan_ids), minus those its
 * transaction changed, plus the rows its transaction wrote. */
static int collect_all(ekcur *c, ekvtab *v)
{
    int erc = EMBKV_BUSY;
    for (int attempt = 0; attempt < 3 && erc == EMBKV_BUSY; attempt++) {
        uint64_t pos = 0;
        c->nids = 0;
        for (;;) {
            if (ids_reserve(c, c->nids + SCAN_IDS) != SQLITE_OK) return SQLITE_NOMEM;
            size_t n = 0;
            erc = embkv_scan_ids(v->store, &pos, c->ids + c->nids, SCAN_IDS, &n);
            if (erc != EMBKV_OK || n == 0) break;
            c->nids += n;
        }
    }
    if (erc == EMBKV_BUSY) { /* the index keeps growing under us: a one-pass scan */
        c->nids = 0;
        erc = embkv_scan(v->store, scan_collect, c);
        if (erc == 1) return SQLITE_NOMEM;
    }
    if (erc != EMBKV_OK) {
        vt_err(v, "scan failed: %s", embkv_errmsg());
        return sqlite_rc_of(erc);
    }
    if (ektxn_count(v->txn)) {
        size_t w = 0;
        for (size_t i = 0; i < c->nids; i++)
            if (!ektxn_find(v->txn, c->ids[i])) c->ids[w++] = c->ids[i];
        c->nids = w;
        for (size_t i = 0; i < ektxn_nslots(v->txn); i++) {
            const ektxn_entry *e = ektxn_slot(v->txn, i);
            if (e && e->kind == EKTXN_PUT && ids_push(c, e->id) != SQLITE_OK) return SQLITE_NOMEM;
        }
    }
    return SQLITE_OK;
}

static int chunk_reserve(ekcur *c, ekvtab *v, size_t rows)
{
    if (rows <= c->capchunk && (!c->want_vec || c->vecs)) return SQLITE_OK;
    if (rows < c->capchunk) rows = c->capchunk;
    sqlite3_free(c->vecs);
    sqlite3_free(c->evecs);
    c->vecs = c->evecs = NULL;
    uint8_t *st = sqlite3_realloc64(c->st, rows);
    uint8_t *found = sqlite3_realloc64(c->found, rows);
    if (st) c->st = st;
    if (found) c->found = found;
    size_t *eidx = sqlite3_realloc64(c->eidx, rows * sizeof *eidx);
    if (eidx) c->eidx = eidx;
    int64_t *eids = sqlite3_realloc64(c->eids, rows * sizeof *eids);
    if (eids) c->eids = eids;
    if (!st || !found || !eidx || !eids) return SQLITE_NOMEM;
    c->capchunk = rows;
    if (c->want_vec) {
        c->vecs = sqlite3_malloc64((uint64_t)rows * v->dim * sizeof(float));
        if (!c->vecs) {
            c->capchunk = 0;
            return SQLITE_NOMEM;
        }
    }
    return SQLITE_OK;
}

/* Loads ids[lo..lo+chunk): which rows exist and, if wanted, their vectors:
 * the transaction's own rows from its buffer, the others with one
 * embkv_get_batch. */
static int load_chunk(ekcur *c, ekvtab *v, size_t lo)
{
    size_t hi = lo + c->chunk < c->nids ? lo + c->chunk : c->nids;
    size_t n = hi - lo, m = 0, dim = v->dim;
    const int64_t *ids = c->ids + lo;
    int have_txn = ektxn_count(v->txn) > 0;
    for (size_t j = 0; j < n; j++) {
        const ektxn_entry *e = have_txn ? ektxn_find(v->txn, ids[j]) : NULL;
        if (e) {
            c->st[j] = e->kind == EKTXN_PUT ? 2 : 0;
            if (c->st[j] && c->want_vec) memcpy(c->vecs + j * dim, e->vec, dim * 4);
        } else {
            c->st[j] = 1;
            c->eidx[m++] = j;
        }
    }
    if (m > 0 && c->want_vec) {
        int erc;
        if (m == n) {
            erc = embkv_get_batch(v->store, ids, n, c->vecs, c->found, NULL);
            if (erc == EMBKV_OK)
                for (size_t j = 0; j < n; j++) c->st[j] = c->found[j] ? 1 : 0;
        } else {
            if (!c->evecs && !(c->evecs = sqlite3_malloc64((uint64_t)c->capchunk * dim * sizeof(float))))
                return SQLITE_NOMEM;
            for (size_t k = 0; k < m; k++) c->eids[k] = ids[c->eidx[k]];
            erc = embkv_get_batch(v->store, c->eids, m, c->evecs, c->found, NULL);
            if (erc == EMBKV_OK) {
                for (size_t k = 0; k < m; k++) {
                    size_t j = c->eidx[k];
                    c->st[j] = c->found[k] ? 1 : 0;
                    if (c->found[k]) memcpy(c->vecs + j * dim, c->evecs + k * dim, dim * 4);
                }
            }
        }
        if (erc != EMBKV_OK) {
            vt_err(v, "read failed: %s", embkv_errmsg());
            return sqlite_rc_of(erc);
        }
    } else if (m > 0 && c->plan != PLAN_SCAN) {
        /* ids-only lookups: existence, no vector read.  (A scan's ids come
         * from the index itself.) */
        for (size_t k = 0; k < m; k++) {
            size_t j = c->eidx[k];
            c->st[j] = embkv_exists(v->store, ids[j]) == 1;
        }
    }
    c->lo = lo;
    c->hi = hi;
    return SQLITE_OK;
}

static int advance(ekcur *c, ekvtab *v)
{
    for (;;) {
        c->pos++;
        if (c->pos >= c->nids) {
            c->eof = 1;
            return SQLITE_OK;
        }
        if (c->pos >= c->hi) {
            int rc = load_chunk(c, v, c->pos);
            if (rc != SQLITE_OK) return rc;
        }
        if (c->st[c->pos - c->lo]) {
            c->info_state = 0;
            return SQLITE_OK;
        }
    }
}

static int vt_filter(sqlite3_vtab_cursor *pc, int idxNum, const char *idxStr, int argc, sqlite3_value **argv)
{
    ekcur *c = (ekcur *)pc;
    ekvtab *v = (ekvtab *)pc->pVtab;
    int rc = SQLITE_OK;
    if (vt_unusable(v)) return SQLITE_ERROR;
    c->plan = idxNum;
    c->want_vec = !(idxStr && strstr(idxStr, "ids-only"));
    c->nids = 0;
    c->lo = c->hi = 0;
    c->eof = 0;
    int64_t id;
    if (c->plan == PLAN_POINT && argc >= 1) {
        if (value_to_id(argv[0], &id)) rc = ids_push(c, id);
    } else if (c->plan == PLAN_IN && argc >= 1) {
        sqlite3_value *val = NULL;
        int sorted = 1;
        for (rc = sqlite3_vtab_in_first(argv[0], &val); rc == SQLITE_OK && val;
             rc = sqlite3_vtab_in_next(argv[0], &val)) {
            if (!value_to_id(val, &id)) continue;
            if (c->nids && id <= c->ids[c->nids - 1]) sorted = 0;
            if (ids_push(c, id) != SQLITE_OK) return SQLITE_NOMEM;
        }
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
        if (rc == SQLITE_OK && !sorted) { /* distinct ids, each once */
            qsort(c->ids, c->nids, sizeof *c->ids, cmp_id);
            size_t w = 0;
            for (size_t i = 0; i < c->nids; i++)
                if (w == 0 || c->ids[i] != c->ids[w - 1]) c->ids[w++] = c->ids[i];
            c->nids = w;
        }
    } else {
        c->plan = PLAN_SCAN;
        rc = collect_all(c, v);
    }
    if (rc != SQLITE_OK) return rc;
    c->chunk = c->plan == PLAN_SCAN ? SCAN_CHUNK : (c->nids ? c->nids : 1);
    rc = chunk_reserve(c, v, c->chunk);
    if (rc != SQLITE_OK) return rc;
    c->pos = (size_t)-1;
    return advance(c, v);
}

static int vt_next(sqlite3_vtab_cursor *pc)
{
    return advance((ekcur *)pc, (ekvtab *)pc->pVtab);
}

static int vt_eof(sqlite3_vtab_cursor *pc)
{
    return ((ekcur *)pc)->eof;
}

static int load_info(ekcur *c, ekvtab *v)
{
    if (c->info_state) return SQLITE_OK;
    int64_t id = c->ids[c->pos];
    int erc;
    if (c->st[c->pos - c->lo] == 2) {
        /* Not committed yet: the clock it will have, and no tier. */
        const ektxn_entry *e = ektxn_find(v->txn, id);
        c->info.clock = 0;
        if (!(e && e->fresh)) {
            erc = embkv_get(v->store, id, NULL, NULL, &c->info);
            if (erc == EMBKV_OK) c->info.clock++;
            else if (erc == EMBKV_NOTFOUND) c->info.clock = 0;
            else goto fail;
        }
        c->info_state = 3;
        return SQLITE_OK;
    }
    erc = embkv_get(v->store, id, NULL, NULL, &c->info);
    if (erc == EMBKV_OK || erc == EMBKV_NOTFOUND) {
        c->info_state = erc == EMBKV_OK ? 1 : 2;
        return SQLITE_OK;
    }
fail:
    vt_err(v, "id %lld: read failed: %s", (long long)id, embkv_errmsg());
    return sqlite_rc_of(erc);
}

static int vt_column(sqlite3_vtab_cursor *pc, sqlite3_context *ctx, int col)
{
    ekcur *c = (ekcur *)pc;
    ekvtab *v = (ekvtab *)pc->pVtab;
    int64_t id = c->ids[c->pos];
    int rc;
    switch (col) {
    case COL_ID:
        /* An UPDATE that keeps id: leave it unset, so xUpdate sees
         * sqlite3_value_nochange() and takes the new rowid (argv[1]). */
        if (sqlite3_vtab_nochange(ctx)) return SQLITE_OK;
        sqlite3_result_int64(ctx, id);
        return SQLITE_OK;
    case COL_VEC:
        if (sqlite3_vtab_nochange(ctx)) return SQLITE_OK; /* an UPDATE that keeps vec */
        if (c->want_vec) {
            sqlite3_result_blob(ctx, c->vecs + (c->pos - c->lo) * v->dim, (int)v->dim * 4, SQLITE_TRANSIENT);
            return SQLITE_OK;
        }
        rc = read_row(v, id, v->scratch); /* not planned for: read it now */
        if (rc < 0) return SQLITE_ERROR;
        if (rc == 1) sqlite3_result_blob(ctx, v->scratch, (int)v->dim * 4, SQLITE_TRANSIENT);
        return SQLITE_OK;
    case COL_CLOCK:
    case COL_TIER:
        if (sqlite3_vtab_nochange(ctx)) return SQLITE_OK;
        rc = load_info(c, v);
        if (rc != SQLITE_OK) return rc;
        if (col == COL_CLOCK) {
            if (c->info_state == 1 || c->info_state == 3) sqlite3_result_int64(ctx, (sqlite3_int64)c->info.clock);
        } else if (c->info_state == 1) {
            static const char *const tiers[] = {"dram", "pm", "ssd"};
            if (c->info.tier >= 0 && c->info.tier < 3) sqlite3_result_text(ctx, tiers[c->info.tier], -1, SQLITE_STATIC);
        }
        return SQLITE_OK;
    default:
        return SQLITE_OK;
    }
}

static int vt_rowid(sqlite3_vtab_cursor *pc, sqlite3_int64 *rowid)
{
    ekcur *c = (ekcur *)pc;
    *rowid = c->ids[c->pos];
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * xUpdate: INSERT, UPDATE, DELETE into the transaction buffer
 */

/* An id that is already taken: per the statement's conflict mode. */
static int conflict(ekvtab *v, int64_t id, int *replace)
{
    int mode = sqlite3_vtab_on_conflict(v->db);
    if (mode == SQLITE_REPLACE) {
        *replace = 1;
        return SQLITE_OK;
    }
    if (mode == SQLITE_IGNORE) return SQLITE_CONSTRAINT; /* SQLite skips the row */
    vt_err(v, "id %lld already exists (UNIQUE constraint failed: %s.id)", (long long)id, v->zName);
    return SQLITE_CONSTRAINT_PRIMARYKEY;
}

static int check_hidden(ekvtab *v, int64_t id, sqlite3_value **argv, int is_insert)
{
    static const char *const names[] = {"clock", "tier"};
    for (int k = 0; k < 2; k++) {
        sqlite3_value *h = argv[2 + COL_CLOCK + k];
        int written = is_insert ? sqlite3_value_type(h) != SQLITE_NULL : !sqlite3_value_nochange(h);
        if (written) {
            vt_err(v, "id %lld: column %s is read-only", (long long)id, names[k]);
            return SQLITE_ERROR;
        }
    }
    return SQLITE_OK;
}

static int vt_update(sqlite3_vtab *pv, int argc, sqlite3_value **argv, sqlite3_int64 *pRowid)
{
    ekvtab *v = (ekvtab *)pv;
    int rc;
    if (vt_unusable(v)) return SQLITE_ERROR;
    if (argc == 1) { /* DELETE */
        int64_t id = sqlite3_value_int64(argv[0]);
        if (ektxn_reserve(v->txn, 1) != SQLITE_OK) return SQLITE_NOMEM;
        ektxn_set(v->txn, id, EKTXN_DEL, 0, NULL);
        return SQLITE_OK;
    }
    if (argc != 2 + 4) return SQLITE_ERROR;
    sqlite3_value *a_rowid = argv[1], *a_id = argv[2 + COL_ID], *a_vec = argv[2 + COL_VEC];
    int is_insert = sqlite3_value_type(argv[0]) == SQLITE_NULL;
    int64_t oldid = is_insert ? 0 : sqlite3_value_int64(argv[0]);
    int64_t newid, rid;
    /* The new id: the id column, else the rowid; both given must agree. */
    int id_given = is_insert ? sqlite3_value_type(a_id) != SQLITE_NULL : !sqlite3_value_nochange(a_id);
    int rowid_given = sqlite3_value_type(a_rowid) != SQLITE_NULL &&
                      (is_insert || !(value_to_id(a_rowid, &rid) && rid == oldid));
    /* UPDATE: argv[1] is the new rowid (the old one when unchanged). */
    sqlite3_value *src = id_given ? a_id : (is_insert && !rowid_given) ? a_id : a_rowid;
    if ((rc = write_id(v, src, &newid)) != SQLITE_OK) return rc;
    if (id_given && rowid_given && (!value_to_id(a_rowid, &rid) || rid != newid)) {
        vt_err(v, "id %lld: id and rowid are set to different values", (long long)newid);
        return SQLITE_ERROR;
    }
    if ((rc = check_hidden(v, newid, argv, is_insert)) != SQLITE_OK) return rc;
    float *vec = v->scratch;
    if (is_insert || !sqlite3_value_nochange(a_vec)) {
        if ((rc = parse_vec(v, newid, a_vec, vec)) != SQLITE_OK) return rc;
    } else if (newid != oldid) { /* the row moves with its vector */
        int r = read_row(v, oldid, vec);
        if (r < 0) return SQLITE_ERROR;
        if (r == 0) {
            vt_err(v, "id %lld: row not found", (long long)oldid);
            return SQLITE_ERROR;
        }
    } else {
        return SQLITE_OK; /* nothing changes */
    }
    if (ektxn_reserve(v->txn, 2) != SQLITE_OK) return SQLITE_NOMEM;
    if (is_insert || newid != oldid) {
        int replace = 0;
        if (row_exists(v, newid) && (rc = conflict(v, newid, &replace)) != SQLITE_OK) return rc;
        if (!is_insert) ektxn_set(v->txn, oldid, EKTXN_DEL, 0, NULL);
        /* A new row: COMMIT replaces whatever the store has under that id. */
        ektxn_set(v->txn, newid, EKTXN_PUT, 1, vec);
        if (is_insert) *pRowid = newid;
    } else {
        const ektxn_entry *e = ektxn_find(v->txn, oldid);
        ektxn_set(v->txn, oldid, EKTXN_PUT, e && e->kind == EKTXN_PUT && e->fresh, vec);
    }
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * Transactions
 */
static int vt_begin(sqlite3_vtab *pv)
{
    ekvtab *v = (ekvtab *)pv;
    ektxn_clear(v->txn);
    v->synced = 0;
    return SQLITE_OK;
}

/* COMMIT, phase one: write the buffer to the store and make it durable.
 * An error here fails the COMMIT and leaves the store as it was. */
static int vt_sync(sqlite3_vtab *pv)
{
    ekvtab *v = (ekvtab *)pv;
    if (ektxn_count(v->txn) == 0) return SQLITE_OK;
    int64_t bad = 0;
    char *msg = NULL;
    int erc = ektxn_apply(v->txn, v->store, &bad, &msg);
    if (erc != EMBKV_OK) {
        vt_err(v, "COMMIT failed at id %lld: %s; nothing was written", (long long)bad, msg ? msg : "out of memory");
        sqlite3_free(msg);
        return sqlite_rc_of(erc);
    }
    erc = embkv_sync(v->store);
    if (erc != EMBKV_OK) {
        msg = sqlite3_mprintf("%s", embkv_errmsg());
        ektxn_unapply(v->txn, v->store);
        vt_err(v, "COMMIT failed to make the table durable: %s; nothing was written", msg ? msg : "?");
        sqlite3_free(msg);
        return sqlite_rc_of(erc);
    }
    v->synced = 1;
    return SQLITE_OK;
}

static int vt_commit(sqlite3_vtab *pv)
{
    ekvtab *v = (ekvtab *)pv;
    ektxn_clear(v->txn);
    v->synced = 0;
    return SQLITE_OK;
}

static int vt_rollback(sqlite3_vtab *pv)
{
    ekvtab *v = (ekvtab *)pv;
    if (v->synced) {
        /* xSync wrote to the store, then another part of the commit
         * failed: put the store back and make that durable. */
        ektxn_unapply(v->txn, v->store);
        embkv_sync(v->store);
    }
    ektxn_clear(v->txn);
    v->synced = 0;
    return SQLITE_OK;
}

static int vt_savepoint(sqlite3_vtab *pv, int n)
{
    return ektxn_savepoint(((ekvtab *)pv)->txn, n);
}

static int vt_release(sqlite3_vtab *pv, int n)
{
    ektxn_release(((ekvtab *)pv)->txn, n);
    return SQLITE_OK;
}

static int vt_rollback_to(sqlite3_vtab *pv, int n)
{
    ektxn_rollback_to(((ekvtab *)pv)->txn, n);
    return SQLITE_OK;
}

static const sqlite3_module ek_module = {
    .iVersion = 3,
    .xCreate = vt_create,
    .xConnect = vt_connect,
    .xBestIndex = vt_best_index,
    .xDisconnect = vt_disconnect,
    .xDestroy = vt_destroy,
    .xOpen = vt_open,
    .xClose = vt_close,
    .xFilter = vt_filter,
    .xNext = vt_next,
    .xEof = vt_eof,
    .xColumn = vt_column,
    .xRowid = vt_rowid,
    .xUpdate = vt_update,
    .xBegin = vt_begin,
    .xSync = vt_sync,
    .xCommit = vt_commit,
    .xRollback = vt_rollback,
    .xFindFunction = NULL,
    .xRename = vt_rename,
    .xSavepoint = vt_savepoint,
    .xRelease = vt_release,
    .xRollbackTo = vt_rollback_to,
    .xShadowName = vt_shadow_name,
};

int embkv_vtab_register(sqlite3 *db)
{
    ekreg_pin_library();
    ekconn *c = ekconn_get(db);
    if (!c) return SQLITE_NOMEM;
    /* The module, embkv_pending and the functions each hold a reference. */
    int rc = sqlite3_create_module_v2(db, "embkv", &ek_module, c, ekconn_unref_v);
    if (rc == SQLITE_OK) rc = ekconn_register_pending(db, c);
    if (rc == SQLITE_OK) rc = ekfn_register(db, c);
    return rc;
}
