/*
 * vtab.c - the embkv virtual table module: options, CREATE/connect/
 * DROP/RENAME, writes (xUpdate) and transactions.
 *
 *   CREATE VIRTUAL TABLE item USING embkv(dim=64 [, path='dir'] [, pool_size='256M']
 *                                         [, capacity=1000000]);
 *   schema: id INTEGER PRIMARY KEY, vec BLOB, clock INTEGER HIDDEN, tier TEXT HIDDEN
 * (Quote values that are not plain numbers or words: SQLite's tokenizer
 * rejects 256M bare.)
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
 * a rolled-back CREATE removes the directory it made (pending.c).
 * CREATE on a directory that already holds a store opens it (and a
 * rolled-back CREATE leaves it alone).
 *
 * Writes go to the connection's transaction buffer (txn.c) and reach
 * the store at COMMIT (xSync), followed by embkv_sync, so a committed
 * transaction is durable; its cost follows the pages the transaction
 * changed, not the size of the table.  Writers of one database file are
 * serialized by SQLite's own lock (a write to the virtual table is a write
 * transaction on its schema's database), so two connections never buffer
 * conflicting changes; connections of different database files whose tables
 * name the same path are not, and the last to commit a row wins.
 *
 * Reading (plans, cursors) is in cursor.c, the parsing of ids and
 * vectors in values.c, the per-connection and per-process state in
 * registry.c, embkv_stats/embkv_checkpoint in stats.c, the error
 * messages and codes in errors.c.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#define EK_SCHEMA "CREATE TABLE x(id INTEGER PRIMARY KEY, vec BLOB, clock INTEGER HIDDEN, tier TEXT HIDDEN)"

/* ------------------------------------------------------------------------
 * Options: one line per option.
 */
static int parse_staleness(const char *val, void *field);
enum { EKO_U32, EKO_U64, EKO_BYTES, EKO_STR, EKO_CUSTOM };

typedef struct ekopt_def {
    const char *name;
    int type;
    size_t off;          /* field in embkv_tabopts */
    uint64_t lo, hi;     /* numeric range */
    const char *expect;  /* for error messages */
    /* EKO_CUSTOM: parses the (unquoted) value into the field; 0 if valid.
     * For enumerations, doubles, 'unlimited'-or-a-number and the like. */
    int (*parse)(const char *val, void *field);
} ekopt_def;

static int parse_migrate(const char *val, void *field)
{
    if (!sqlite3_stricmp(val, "off")) *(uint32_t *)field = 0;
    else if (!sqlite3_stricmp(val, "auto")) *(uint32_t *)field = 1;
    else return -1;
    return 0;
}

static int parse_durable(const char *val, void *field)
{
    if (!sqlite3_stricmp(val, "close")) *(uint32_t *)field = 0;
    else if (!sqlite3_stricmp(val, "checkpoint")) *(uint32_t *)field = 1;
    else return -1;
    return 0;
}

static const ekopt_def ek_options[] = {
    {"dim", EKO_U32, offsetof(embkv_tabopts, dim), 1, EMBKV_MAX_DIM, "an integer from 1 to 8192", NULL},
    {"path", EKO_STR, offsetof(embkv_tabopts, path), 0, 0, "a directory name", NULL},
    {"pool_size", EKO_BYTES, offsetof(embkv_tabopts, pool_size), 1, 1ull << 50,
     "a size in bytes up to 1024T, such as 268435456, 256M or 4G", NULL},
    {"capacity", EKO_U64, offsetof(embkv_tabopts, capacity), 1, 1ull << 40,
     "a row count from 1 to 1099511627776", NULL},
    /* Kept by the engine with the store, as dim is. */
    {"dtype", EKO_CUSTOM, offsetof(embkv_tabopts, dtype), 0, 0, "f32, f16, bf16 or i8", ek_parse_dtype},
    {"optimizer", EKO_CUSTOM, offsetof(embkv_tabopts, train.optimizer), 0, 0, "sgd, adagrad or adam",
     ek_parse_optimizer},
    {"lr", EKO_CUSTOM, offsetof(embkv_tabopts, train.lr), 0, 0, "a positive number", ek_parse_positive},
    {"initial_accumulator", EKO_CUSTOM, offsetof(embkv_tabopts, train.initial_accumulator), 0, 0,
     "a number >= 0", ek_parse_nonnegative},
    {"eps", EKO_CUSTOM, offsetof(embkv_tabopts, train.eps), 0, 0, "a positive number", ek_parse_positive},
    {"beta1", EKO_CUSTOM, offsetof(embkv_tabopts, train.beta1), 0, 0, "a number in [0, 1)", ek_parse_unit},
    {"beta2", EKO_CUSTOM, offsetof(embkv_tabopts, train.beta2), 0, 0, "a number in [0, 1)", ek_parse_unit},
    {"init", EKO_CUSTOM, offsetof(embkv_tabopts, train), 0, 0,
     "none, zeros, uniform(a,b) with a < b, or normal(mean,std) with std >= 0", ek_parse_init},
    {"seed", EKO_U64, offsetof(embkv_tabopts, train.seed), 0, UINT64_MAX, "an integer from 0 to 18446744073709551615", NULL},
    {"staleness", EKO_CUSTOM, offsetof(embkv_tabopts, train.staleness), 0, 0,
     "an integer from 0 to 1000000, or unlimited", parse_staleness},
    {"wait_ms", EKO_U32, offsetof(embkv_tabopts, train.wait_ms), 0, 86400000, "milliseconds from 0 to 86400000",
     NULL},
    /* Admission and eviction: kept in the options file only when not at
     * their defaults (files from before them have none): opt_optional. */
    {"admit", EKO_CUSTOM, offsetof(embkv_tabopts, train.admit_count), 0, 0,
     "none, or count(N) with N from 1 to 255 (an id is stored from its N-th pull)", ek_parse_admit},
    {"ttl", EKO_CUSTOM, offsetof(embkv_tabopts, train.ttl_ms), 0, 0,
     "none, or a duration up to 3650d: a whole number and a unit, ms, s, m, h or d (such as 30d)", ek_parse_ttl},
    {"ttl_steps", EKO_U64, offsetof(embkv_tabopts, train.ttl_steps), 0, 1ull << 62,
     "a count of pushes from 0 (none) to 4611686018427387904", NULL},
    {"max_rows", EKO_U64, offsetof(embkv_tabopts, train.max_rows), 0, 1ull << 40,
     "a row count from 0 (none) to 1099511627776", NULL},
    {"evict", EKO_CUSTOM, offsetof(embkv_tabopts, train.evict), 0, 0, "lfu or lru", ek_parse_evict},
    {"rounding", EKO_CUSTOM, offsetof(embkv_tabopts, train.rounding), 0, 0, "nearest or stochastic",
     ek_parse_rounding},
    /* Kept by the engine with the store (it checks a reopen's values). */
    {"ssd_size", EKO_BYTES, offsetof(embkv_tabopts, ssd_size), 0, 1ull << 50,
     "a size in bytes up to 1024T, such as 4194304, 64M or 200G (0: no SSD tier)", NULL},
    {"ssd_path", EKO_STR, offsetof(embkv_tabopts, ssd_path), 0, 0, "a directory name", NULL},
    /* DRAM: the process's first open of the store decides (embkv.h). */
    {"cache_size", EKO_BYTES, offsetof(embkv_tabopts, cache_size), 0, 1ull << 50,
     "a size in bytes up to 1024T, such as 268435456, 256M or 4G (0: no cache)", NULL},
    /* Background migration: like the cache, the process's first open. */
    {"migrate", EKO_CUSTOM, offsetof(embkv_tabopts, migrate), 0, 0, "off or auto", parse_migrate},
    {"migrate_rate", EKO_U64, offsetof(embkv_tabopts, migrate_rate), 1, 1000000000,
     "moves per second from 1 to 1000000000", NULL},
    /* When the store is durable (the engine's EMBKV_OPEN_NO_CLOSE_SYNC):
     * like the cache, the process's opens; a table's every connection
     * takes it from its CREATE. */
    {"durable", EKO_CUSTOM, offsetof(embkv_tabopts, durable), 0, 0,
     "close (checkpoints and the last close make changes durable) or checkpoint (checkpoints only)",
     parse_durable},
};
#define N_OPTIONS (sizeof ek_options / sizeof ek_options[0])

/* "dim, path, ..." for messages (sqlite3_malloc'd). */
static char *option_names(void)
{
    sqlite3_str *b = sqlite3_str_new(NULL);
    for (size_t j = 0; j < N_OPTIONS; j++) sqlite3_str_appendf(b, "%s%s", j ? ", " : "", ek_options[j].name);
    return sqlite3_str_finish(b);
}

/* The value text of an argument: blanks around it dropped, '...' and "..."
 * unquoted (a doubled quote stands for one).  NULL on unbalanced quotes. */
static char *opt_value(const char *s)
{
    while (ek_is_blank(*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && ek_is_blank(s[n - 1])) n--;
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
/* A whole number in decimal notation at p, with a fraction and/or an
 * exponent (1e6, 2.5e6, 10.0, 100e-2: how SQL and Python write large round
 * numbers): *v its value when it is whole and fits, *end after it; -2
 * for a number that is not whole, -1 otherwise.  The digits are taken as one integer, then scaled by the
 * exponent less the fraction's length. */
static int parse_decimal(const char *p, uint64_t *v, const char **end)
{
    uint64_t m = 0;
    int frac = 0, in_frac = 0, digits = 0;
    for (;; p++) {
        if (*p == '.' && !in_frac) {
            in_frac = 1;
            continue;
        }
        if (*p < '0' || *p > '9') break;
        uint64_t digit = (uint64_t)(*p - '0');
        if (m > (UINT64_MAX - digit) / 10) return -1;
        m = m * 10 + digit;
        frac += in_frac;
        digits++;
    }
    if (!digits) return -1;
    int x = 0;
    if (*p == 'e' || *p == 'E') {
        p++;
        int neg = *p == '-';
        if (*p == '+' || *p == '-') p++;
        if (*p < '0' || *p > '9') return -1;
        for (; *p >= '0' && *p <= '9'; p++)
            if ((x = x * 10 + (*p - '0')) > 100) return -1;
        if (neg) x = -x;
    }
    for (x -= frac; x < 0; x++) { /* 2.50e1, 100e-2: the digits scaled off must be zeros */
        if (m % 10) return -2;
        m /= 10;
    }
    for (; x > 0; x--) {
        if (m > UINT64_MAX / 10) return -1;
        m *= 10;
    }
    *v = m;
    *end = p;
    return 0;
}

static int parse_uint(const char *s, int bytes, uint64_t *out)
{
    uint64_t v = 0;
    const char *p = s;
    if ((*p < '0' || *p > '9') && *p != '.') return -1;
    const char *q = p;
    while (*q >= '0' && *q <= '9') q++;
    if (*q == '.' || *q == 'e' || *q == 'E') {
        if (parse_decimal(s, &v, &p) != 0 || *p) return -1;
        *out = v;
        return 0;
    }
    for (; *p >= '0' && *p <= '9'; p++) {
        uint64_t digit = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10) return -1;
        v = v * 10 + digit;
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

/* unlimited, or a count of pulls from 0 to 1000000 written as counts are
 * (1e3 included); field is embkv_train_options.staleness. */
static int parse_staleness(const char *val, void *field)
{
    uint64_t u;
    if (sqlite3_stricmp(val, "unlimited") == 0) *(int64_t *)field = EMBKV_STALENESS_UNLIMITED;
    else if (parse_uint(val, 0, &u) == 0 && u <= 1000000) *(int64_t *)field = (int64_t)u;
    else return -1;
    return 0;
}

/* A point without a digit on each side ('4.', '.5e1'), which JSON does
 * not write. */
static int bare_point(const char *v)
{
    for (const char *p = strchr(v, '.'); p; p = strchr(p + 1, '.'))
        if (p == v || p[-1] < '0' || p[-1] > '9' || p[1] < '0' || p[1] > '9') return 1;
    return 0;
}

/* create: a new CREATE, whose counts and sizes must be written as JSON
 * writes numbers; the statement of an existing table, read again at
 * every connect, is read without that rule (a table that was taken must
 * still open and drop). */
static int parse_options(ekvtab *v, int argc, const char *const *argv, int create, char **err)
{
    uint64_t seen = 0;
    ek_parse_train_begin(&v->opts.train);
    for (int i = 3; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        if (!eq) {
            char *names = option_names();
            *err = sqlite3_mprintf("argument '%s' is not key=value (options: %s)", a, names);
            sqlite3_free(names);
            return SQLITE_ERROR;
        }
        const char *k = a;
        while (ek_is_blank(*k)) k++;
        size_t klen = (size_t)(eq - k);
        while (klen > 0 && ek_is_blank(k[klen - 1])) klen--;
        const ekopt_def *d = NULL;
        uint64_t bit = 0;
        for (unsigned j = 0; j < N_OPTIONS; j++) {
            if (strlen(ek_options[j].name) == klen && sqlite3_strnicmp(ek_options[j].name, k, (int)klen) == 0) {
                d = &ek_options[j];
                bit = 1ull << j;
            }
        }
        if (!d) {
            char *names = option_names();
            *err = sqlite3_mprintf("unknown option '%.*s' (options: %s)", (int)klen, k, names);
            sqlite3_free(names);
            return SQLITE_ERROR;
        }
        if (seen & bit) {
            *err = sqlite3_mprintf("option %s is given twice", d->name);
            return SQLITE_ERROR;
        }
        seen |= bit;
        char *val = opt_value(eq + 1);
        if (val && d->type != EKO_STR) {
            /* Blanks inside the quotes mean nothing in a number or a name
             * ('16M ', ' adam'); a directory name keeps them. */
            size_t b = 0, n = strlen(val);
            while (ek_is_blank(val[b])) b++;
            while (n > b && ek_is_blank(val[n - 1])) n--;
            memmove(val, val + b, n - b);
            val[n - b] = 0;
        }
        const char *raw = eq + 1;
        while (ek_is_blank(*raw)) raw++;
        int ok = val && *val;
        char *field = (char *)&v->opts + d->off;
        if (ok) {
            uint64_t u = 0;
            switch (d->type) {
            case EKO_U32:
            case EKO_U64:
            case EKO_BYTES:
                ok = parse_uint(val, d->type == EKO_BYTES, &u) == 0 && u >= d->lo && u <= d->hi &&
                     !(create && bare_point(val));
                if (ok && d->type == EKO_U32) *(uint32_t *)(void *)field = (uint32_t)u;
                else if (ok) *(uint64_t *)(void *)field = u;
                break;
            case EKO_CUSTOM:
                ok = d->parse(val, field) == 0 && !(create && d->parse == parse_staleness && bare_point(val));
                break;
            case EKO_STR: {
                /* Each string option has its own storage. */
                char **store = field == (void *)&v->opts.ssd_path ? &v->optssd : &v->optpath;
                sqlite3_free(*store);
                *store = val;
                val = NULL;
                *(const char **)(void *)field = *store;
                break;
            }
            }
        }
        uint64_t whole;
        const char *after;
        int frac = !ok && (d->type == EKO_U32 || d->type == EKO_U64 || d->type == EKO_BYTES) && val &&
                   parse_decimal(val, &whole, &after) == -2;
        sqlite3_free(val);
        if (!ok) {
            *err = sqlite3_mprintf("option %s: expected %s, got %s%s", d->name, d->expect, *raw ? raw : "nothing",
                                   frac ? " (not a whole number)" : "");
            return SQLITE_ERROR;
        }
    }
    if (!(seen & 1)) {
        *err = sqlite3_mprintf("option dim is required, e.g. USING embkv(dim=64)");
        return SQLITE_ERROR;
    }
    if (v->opts.migrate_rate && !v->opts.migrate) {
        int given = 0;
        for (unsigned j = 0; j < N_OPTIONS; j++)
            if ((seen >> j & 1) && strcmp(ek_options[j].name, "migrate") == 0) given = 1;
        *err = sqlite3_mprintf("option migrate_rate: it bounds migrate='auto', which is %s",
                               given ? "off here: give migrate='auto', or leave migrate_rate out" : "not given");
        return SQLITE_ERROR;
    }
    ek_parse_train_end(&v->opts.train);
    /* The optimizer's state lives in the record: dim and the optimizer
     * together bound it (Adam keeps 2 * dim + 1 floats). */
    uint32_t state = embkv_train_state_floats(&v->opts.train, v->opts.dim);
    if (state > EMBKV_MAX_STATE_FLOATS) {
        static const char *const optim[] = {"sgd", "adagrad", "adam"};
        uint32_t most = v->opts.dim;
        while (most > 1 && embkv_train_state_floats(&v->opts.train, most) > EMBKV_MAX_STATE_FLOATS) most--;
        unsigned o = (unsigned)v->opts.train.optimizer;
        *err = sqlite3_mprintf("option dim: dim %u with optimizer '%s' keeps %u floats of optimizer state per row, "
                               "at most %d: use dim at most %u with '%s', or another optimizer",
                               v->opts.dim, o < 3 ? optim[o] : "?", state, EMBKV_MAX_STATE_FLOATS, most,
                               o < 3 ? optim[o] : "?");
        return SQLITE_ERROR;
    }
    v->given = seen;
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * Options belong to the store.  The CREATE that makes a store writes its
 * options (all but dim and path, which the store itself records) to the
 * file app-sqlite-options in the store directory; every table on the store,
 * in any database, takes them from there, so two tables on one store can
 * never train it differently.  An option a table's CREATE writes with a
 * value other than the store's is an error naming both; one it leaves out
 * takes the store's.
 */

/* The shortest of %.15g / %.17g that reads back as d. */
static void fmt_double(char *buf, size_t n, double d)
{
    snprintf(buf, n, "%.15g", d);
    if (strtod(buf, NULL) != d) snprintf(buf, n, "%.17g", d);
}

/* Option j of o as text that parse_options reads back. */
static void opt_canon(const embkv_tabopts *o, uint64_t pool_bytes, unsigned j, char *buf, size_t n)
{
    static const char *const optim[] = {"sgd", "adagrad", "adam"};
    const embkv_train_options *t = &o->train;
    const char *name = ek_options[j].name;
    buf[0] = 0;
    if (!strcmp(name, "pool_size")) snprintf(buf, n, "%llu", (unsigned long long)pool_bytes);
    else if (!strcmp(name, "capacity")) snprintf(buf, n, "%llu", (unsigned long long)(o->capacity ? o->capacity : 100000));
    else if (!strcmp(name, "optimizer")) snprintf(buf, n, "%s", optim[t->optimizer % 3]);
    else if (!strcmp(name, "lr")) fmt_double(buf, n, t->lr);
    else if (!strcmp(name, "initial_accumulator")) fmt_double(buf, n, t->initial_accumulator);
    else if (!strcmp(name, "eps")) fmt_double(buf, n, t->eps);
    else if (!strcmp(name, "beta1")) fmt_double(buf, n, t->beta1);
    else if (!strcmp(name, "beta2")) fmt_double(buf, n, t->beta2);
    else if (!strcmp(name, "init")) {
        if (t->init == EMBKV_INIT_UNIFORM || t->init == EMBKV_INIT_NORMAL) {
            char a[32], b[32];
            fmt_double(a, sizeof a, t->init_a);
            fmt_double(b, sizeof b, t->init_b);
            snprintf(buf, n, "%s(%s,%s)", t->init == EMBKV_INIT_UNIFORM ? "uniform" : "normal", a, b);
        }
        else snprintf(buf, n, "%s", t->init == EMBKV_INIT_ZEROS ? "zeros" : "none");
    } else if (!strcmp(name, "seed")) snprintf(buf, n, "%llu", (unsigned long long)t->seed);
    else if (!strcmp(name, "staleness")) {
        if (t->staleness == EMBKV_STALENESS_UNLIMITED) snprintf(buf, n, "unlimited");
        else snprintf(buf, n, "%lld", (long long)t->staleness);
    } else if (!strcmp(name, "wait_ms")) snprintf(buf, n, "%u", t->wait_ms);
    else if (!strcmp(name, "admit")) {
        if (t->admit_count) snprintf(buf, n, "count(%u)", t->admit_count);
        else snprintf(buf, n, "none");
    } else if (!strcmp(name, "ttl")) ek_format_ttl(t->ttl_ms, buf, n);
    else if (!strcmp(name, "ttl_steps")) snprintf(buf, n, "%llu", (unsigned long long)t->ttl_steps);
    else if (!strcmp(name, "max_rows")) snprintf(buf, n, "%llu", (unsigned long long)t->max_rows);
    else if (!strcmp(name, "evict")) snprintf(buf, n, "%s", t->evict == EMBKV_EVICT_LRU ? "lru" : "lfu");
    else if (!strcmp(name, "rounding")) snprintf(buf, n, "%s", t->rounding == EMBKV_ROUND_STOCHASTIC ? "stochastic" : "nearest");
}

/* A stored option that the options file holds only when it is not at its
 * default ("none"): added after stores were made, whose files lack it and
 * whose checks must stay what they were. */
static int opt_optional(unsigned j, const char *value)
{
    static const char *const opt_default[][2] = {
        {"admit", "none"}, {"ttl", "none"}, {"ttl_steps", "0"}, {"max_rows", "0"}, {"evict", "lfu"},
        {"rounding", "nearest"}};
    for (size_t i = 0; i < sizeof opt_default / sizeof opt_default[0]; i++)
        if (!strcmp(ek_options[j].name, opt_default[i][0])) return !value || !strcmp(value, opt_default[i][1]);
    return 0;
}

static int opt_is_stored(unsigned j)
{
    return strcmp(ek_options[j].name, "dim") && strcmp(ek_options[j].name, "dtype") && strcmp(ek_options[j].name, "path") &&
           strcmp(ek_options[j].name, "ssd_size") && strcmp(ek_options[j].name, "ssd_path") &&
           strcmp(ek_options[j].name, "cache_size") && strcmp(ek_options[j].name, "migrate") &&
           strcmp(ek_options[j].name, "migrate_rate") && strcmp(ek_options[j].name, "durable");
}

/* text written beside path (named with the table's id) and linked into
 * place: link() never replaces, so of two tables racing for one name
 * exactly one's file stands.  0 written, 1 the name was taken, -1 an
 * error (errno). */
static int link_new_file(const char *path, const char *tid, const char *text)
{
    char *tmp = text ? sqlite3_mprintf("%s.%s.tmp", path, tid) : NULL;
    if (!tmp) {
        errno = ENOMEM;
        return -1;
    }
    FILE *w = fopen(tmp, "wb");
    int r = w && fputs(text, w) >= 0 ? 0 : -1;
    if (w && fclose(w) != 0) r = -1;
    if (r == 0 && link(tmp, path) != 0) r = errno == EEXIST ? 1 : -1;
    int e = errno;
    unlink(tmp);
    sqlite3_free(tmp);
    errno = e;
    return r;
}

/* The store's id file: "<id> <check>\n", 16 hex digits each. */
static uint64_t store_id_sum(uint64_t id) { return (id ^ 0x7374696461707073ull) * 0x9e3779b97f4a7c15ull; }

/* Records the pool's id beside it (a new store: the CREATE that made it).
 * A pool whose root holds no id, or a file that cannot be written, goes
 * unchecked: the file is a guard against a copied pool, not the store. */
static void store_id_record(ekvtab *v, const char *dir)
{
    uint64_t id = embkv_store_id(v->store);
    if (!id) return;
    char *path = sqlite3_mprintf("%s/%s", dir, STORE_ID_FILE);
    char *text = sqlite3_mprintf("%016llx %016llx\n", (unsigned long long)id, (unsigned long long)store_id_sum(id));
    if (path) link_new_file(path, v->tid, text);  /* (one there: the first CREATE's stays) */
    sqlite3_free(text);
    sqlite3_free(path);
}

/* The pool is the one whose id the store's id file records (a file that
 * is not there: not checked). */
static int store_id_check(ekvtab *v, const char *dir, char **err)
{
    char *path = sqlite3_mprintf("%s/%s", dir, STORE_ID_FILE);
    if (!path) return SQLITE_NOMEM;
    FILE *f = fopen(path, "rb");
    if (!f) {
        int gone = errno == ENOENT;
        if (!gone) *err = sqlite3_mprintf("cannot read the store's id in %s: %s", path, strerror(errno));
        sqlite3_free(path);
        return gone ? SQLITE_OK : SQLITE_IOERR;
    }
    char text[64];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    unsigned long long id = 0, sum = 0;
    char extra;
    if (n != 34 || sscanf(text, "%16llx %16llx%c", &id, &sum, &extra) != 3 || extra != '\n' || !id ||
        sum != store_id_sum(id)) {
        *err = sqlite3_mprintf("the store's id in %s is damaged: restore the file from a backup of the directory, "
                               "or remove it (the pool is then not checked against it)", path);
        sqlite3_free(path);
        return SQLITE_CORRUPT;
    }
    uint64_t mine = embkv_store_id(v->store);
    if (mine != id) {
        char have[17] = "none";
        if (mine) snprintf(have, sizeof have, "%016llx", (unsigned long long)mine);
        *err = sqlite3_mprintf("the pool %s/store.pool is not this store's: its id is %s, and %s names %016llx (a "
                               "pool copied from another store): restore the directory from a backup",
                               dir, have, path, id);
        sqlite3_free(path);
        return SQLITE_CORRUPT;
    }
    sqlite3_free(path);
    return SQLITE_OK;
}

/* After the store is open: take its options, or record the table's. */
/* The check of the stored options: FNV-1a over "name=value;" in order. */
#define OPTS_SUM_SEED 0xcbf29ce484222325ull
static uint64_t opts_sum(uint64_t h, const char *name, const char *value)
{
    for (const char *parts[] = {name, "=", value, ";"}, **p = parts; p < parts + 4; p++)
        for (const unsigned char *c = (const unsigned char *)*p; *c; c++) h = (h ^ *c) * 0x100000001b3ull;
    return h;
}

/* The store's own record decides what optimizer its rows can serve: the
 * state each record keeps (sgd none, adagrad dim floats, adam 2 * dim + 1:
 * a different size for each at any dim), not the options file beside it,
 * which a user can delete.  A table whose optimizer keeps another size is
 * refused naming the option. */
static int check_state(ekvtab *v, const char *dir, char **err)
{
    static const char *const optim[] = {"sgd", "adagrad", "adam"};
    uint32_t dim = embkv_dim(v->store), has = embkv_state_floats(v->store);
    uint32_t want = embkv_train_state_floats(&v->opts.train, dim);
    if (has == want) return SQLITE_OK;
    const char *theirs = NULL;
    for (int o = EMBKV_SGD; o <= EMBKV_ADAM && !theirs; o++) {
        embkv_train_options t = v->opts.train;
        t.optimizer = o;
        if (embkv_train_state_floats(&t, dim) == has) theirs = optim[o];
    }
    unsigned mine = (unsigned)v->opts.train.optimizer;
    if (theirs)
        *err = sqlite3_mprintf("option optimizer: the store %s keeps %u floats of optimizer state a row, as optimizer "
                               "'%s' does at dim %u, and '%s' keeps %u: give optimizer='%s'",
                               dir, has, theirs, dim, optim[mine % 3], want, theirs);
    else
        *err = sqlite3_mprintf("option optimizer: the store %s keeps %u floats of optimizer state a row, which no "
                               "optimizer keeps at dim %u ('%s' keeps %u): it was made through the C API; train "
                               "it from there", dir, has, dim, optim[mine % 3], want);
    return SQLITE_ERROR;
}

static int store_options(ekvtab *v, const char *dir, char **err)
{
    embkv_stats st;
    if (embkv_stats_get(v->store, &st) != EMBKV_OK) {
        *err = sqlite3_mprintf("%s", embkv_errmsg());
        return SQLITE_ERROR;
    }
    char *path = sqlite3_mprintf("%s/%s", dir, OPTS_FILE);
    if (!path) return SQLITE_NOMEM;
    char buf[160];
    FILE *f = fopen(path, "rb");
    if (!f && errno == ENOENT && v->opts_recorded[0]) {
        *err = sqlite3_mprintf("the store's options file %s is missing (its CREATE recorded options there): restore "
                               "it from a backup of the directory, or DROP TABLE \"%w\" (the store stays) and "
                               "CREATE it again with path= naming the store and the options it was made with",
                               path, v->zName);
        sqlite3_free(path);
        return SQLITE_CORRUPT;
    }
    if (!f && errno == ENOENT) {
        /* A new store (or one made outside SQL): record this table's, if its
         * rows can serve them. */
        if (check_state(v, dir, err) != SQLITE_OK) {
            sqlite3_free(path);
            return SQLITE_ERROR;
        }
        cJSON *o = cJSON_CreateObject();
        uint64_t sum = OPTS_SUM_SEED;
        for (unsigned j = 0; o && j < N_OPTIONS; j++) {
            if (!opt_is_stored(j)) continue;
            opt_canon(&v->opts, st.pool_bytes, j, buf, sizeof buf);
            if (opt_optional(j, buf)) continue;
            cJSON_AddStringToObject(o, ek_options[j].name, buf);
            sum = opts_sum(sum, ek_options[j].name, buf);
        }
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
        memcpy(v->opts_check, hex, sizeof hex);
        if (o) cJSON_AddStringToObject(o, "check", hex);
        char *text = o ? cJSON_Print(o) : NULL;
        cJSON_Delete(o);
        /* Of two tables racing onto a new store exactly one records its
         * options, and the other compares with them. */
        int wr = link_new_file(path, v->tid, text);
        free(text);
        if (wr == 1) {
            sqlite3_free(path);
            return store_options(v, dir, err);
        }
        int rc = SQLITE_OK;
        if (wr != 0) {
            *err = sqlite3_mprintf("cannot record its options in %s: %s", path, strerror(errno));
            rc = SQLITE_ERROR;
        } else {
            store_id_record(v, dir);
        }
        sqlite3_free(path);
        return rc;
    }
    if (!f) {
        *err = sqlite3_mprintf("cannot read the store's options in %s: %s", path, strerror(errno));
        sqlite3_free(path);
        return SQLITE_IOERR;
    }
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cJSON *o = cJSON_Parse(text);
    /* The store's options, read through the same parser as a CREATE's. */
    const char *args[3 + 1 + 24];
    char kv[24][200];
    int argc = 0;
    args[argc++] = "embkv";
    args[argc++] = v->zDb;
    args[argc++] = v->zName;
    char dimarg[32];
    snprintf(dimarg, sizeof dimarg, "dim=%u", embkv_dim(v->store));
    args[argc++] = dimarg;
    /* Every option present, nothing else but the check, and the check
     * matching: a changed byte is an error, never another option value. */
    int bad = !cJSON_IsObject(o), k = 0;
    uint64_t sum = OPTS_SUM_SEED;
    for (unsigned j = 0; !bad && j < N_OPTIONS; j++) {
        if (!opt_is_stored(j)) continue;
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, ek_options[j].name);
        if (!e && opt_optional(j, NULL)) continue;
        bad = k == 24 || !cJSON_IsString(e) || strchr(e->valuestring, '\'') ||
              strlen(e->valuestring) > 150;
        if (bad) break;
        sum = opts_sum(sum, ek_options[j].name, e->valuestring);
        snprintf(kv[k], sizeof kv[k], "%s='%s'", ek_options[j].name, e->valuestring);
        args[argc++] = kv[k++];
    }
    const cJSON *chk = bad ? NULL : cJSON_GetObjectItemCaseSensitive(o, "check");
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)sum);
    if (!bad) bad = !cJSON_IsString(chk) || strcmp(chk->valuestring, hex) != 0 || cJSON_GetArraySize(o) != k + 1;
    cJSON_Delete(o);
    memcpy(v->opts_check, hex, sizeof hex);
    if (!bad && v->opts_recorded[0] && strcmp(v->opts_recorded, hex) != 0) {
        /* A whole valid file, but not this store's (copied from another). */
        *err = sqlite3_mprintf("the store's options in %s are not the ones its CREATE recorded: restore the file from "
                               "a backup of the directory", path);
        sqlite3_free(path);
        return SQLITE_CORRUPT;
    }
    /* (After that check: a foreign options file is named as such, not the
     * pool it does not match.) */
    if (!bad) {
        int irc = store_id_check(v, dir, err);
        if (irc != SQLITE_OK) {
            sqlite3_free(path);
            return irc;
        }
    }
    uint64_t sid = embkv_store_id(v->store);
    char sidhex[17];
    snprintf(sidhex, sizeof sidhex, "%016llx", (unsigned long long)sid);
    if (!bad && sid && v->store_recorded[0] && strcmp(v->store_recorded, sidhex) != 0) {
        *err = sqlite3_mprintf("the store in %s is not the one this table was made on: its pool's id is %s, and "
                               "the table's %s_config recorded %s (another store's files copied over this one's): "
                               "restore the directory from a backup, or DROP TABLE \"%w\" (the store stays) and "
                               "CREATE it again with path= naming the store, to use the rows that are there",
                               dir, sidhex, v->zName, v->store_recorded, v->zName);
        sqlite3_free(path);
        return SQLITE_CORRUPT;
    }
    ekvtab w;
    memset(&w, 0, sizeof w);
    char *perr = NULL;
    if (bad || parse_options(&w, argc, args, 0, &perr) != SQLITE_OK) {
        *err = sqlite3_mprintf("the store's options in %s are damaged%s%s%s: restore the file from a backup of the "
                               "directory, or move it aside, DROP TABLE \"%w\" (the store stays) and CREATE it "
                               "again with path= naming the store and the options it was made with",
                               path, perr ? " (" : "", perr ? perr : "", perr ? ")" : "", v->zName);
        sqlite3_free(perr);
        sqlite3_free(w.optpath);
        sqlite3_free(w.optssd);
        sqlite3_free(path);
        return SQLITE_CORRUPT;
    }
    sqlite3_free(w.optpath);
    sqlite3_free(w.optssd);
    if (w.opts.pool_size && w.opts.pool_size != st.pool_bytes) {
        /* No option changes a pool's size once made: the file was. */
        *err = sqlite3_mprintf("the store's pool file %s/store.pool is %llu bytes, not the %llu its CREATE made "
                               "(recorded in %s): it was changed outside embkv; restore the store from a backup",
                               dir, (unsigned long long)st.pool_bytes, (unsigned long long)w.opts.pool_size, path);
        sqlite3_free(path);
        return SQLITE_CORRUPT;
    }
    char mine[160];
    for (unsigned j = 0; j < N_OPTIONS; j++) {
        if (!opt_is_stored(j) || !(v->given & (1ull << j))) continue;
        opt_canon(&v->opts, v->opts.pool_size, j, mine, sizeof mine);
        opt_canon(&w.opts, st.pool_bytes, j, buf, sizeof buf);
        if (strcmp(mine, buf)) {
            *err = sqlite3_mprintf("option %s: the store %s has %s=%s, not %s (the tables of a store share "
                                   "its options: leave it out to take the store's)",
                                   ek_options[j].name, dir, ek_options[j].name, buf, mine);
            sqlite3_free(path);
            return SQLITE_ERROR;
        }
    }
    v->opts.capacity = w.opts.capacity;
    v->opts.train = w.opts.train;
    sqlite3_free(path);
    return check_state(v, dir, err);
}

/* ------------------------------------------------------------------------
 * The stable id and the shadow table <name>_config
 */
static int shadow_create(ekvtab *v, char **err)
{
    /* The store's id ties the table to the store it was made on: a store
     * whose files another's replaced (the pool, its id file and its options
     * copied over, its list of tables kept) is then not taken for it. */
    uint64_t sid = v->store ? embkv_store_id(v->store) : 0;
    char store[17] = "";
    if (sid) snprintf(store, sizeof store, "%016llx", (unsigned long long)sid);
    char *sql = sqlite3_mprintf("CREATE TABLE \"%w\".\"%w_config\"(k TEXT PRIMARY KEY, v) WITHOUT ROWID;"
                                "INSERT INTO \"%w\".\"%w_config\"(k, v) VALUES ('id', %Q), ('format', 1), "
                                "('owns_dir', %d), ('options', %Q)%s%s%s;",
                                v->zDb, v->zName, v->zDb, v->zName, v->tid, v->owns_dir, v->opts_check,
                                sid ? ", ('store', '" : "", store, sid ? "')" : "");
    if (!sql) return SQLITE_NOMEM;
    char *msg = NULL;
    int rc = sqlite3_exec(v->db, sql, NULL, NULL, &msg);
    sqlite3_free(sql);
    /* A table of that name already there: the shadow table of an embkv
     * table no longer in the schema (the sqlite3 shell's .clone copies
     * ordinary tables only). */
    char *cfg = sqlite3_mprintf("%s_config", v->zName);
    int left = rc != SQLITE_OK && cfg &&
               sqlite3_table_column_metadata(v->db, v->zDb, cfg, "k", NULL, NULL, NULL, NULL, NULL) == SQLITE_OK;
    sqlite3_free(cfg);
    if (rc != SQLITE_OK)
        *err = sqlite3_mprintf("cannot create its shadow table %s_config: %s%s%s%s", v->zName,
                               msg ? msg : sqlite3_errstr(rc),
                               left ? " (left by an embkv table of that name no longer in the schema, copied by "
                                      "the sqlite3 shell's .clone, say: DROP TABLE \"" : "",
                               left ? v->zName : "", left ? "_config\" if it holds nothing you need, then CREATE again)" : "");
    sqlite3_free(msg);
    return rc;
}

static int shadow_read(ekvtab *v, char **err)
{
    /* owns_dir absent (tables made before it was recorded): they made it. */
    char *sql = sqlite3_mprintf("SELECT v, coalesce((SELECT v FROM \"%w\".\"%w_config\" WHERE k = 'owns_dir'), 1), "
                                "(SELECT v FROM \"%w\".\"%w_config\" WHERE k = 'options'), "
                                "(SELECT v FROM \"%w\".\"%w_config\" WHERE k = 'store') "
                                "FROM \"%w\".\"%w_config\" WHERE k = 'id'",
                                v->zDb, v->zName, v->zDb, v->zName, v->zDb, v->zName, v->zDb, v->zName);
    if (!sql) return SQLITE_NOMEM;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(v->db, sql, -1, &st, NULL);
    sqlite3_free(sql);
    if (rc != SQLITE_OK) {
        *err = sqlite3_mprintf("its shadow table %s_config is missing (%s)", v->zName, sqlite3_errmsg(v->db));
        sqlite3_finalize(st);
        return SQLITE_CORRUPT;
    }
    rc = sqlite3_step(st);
    const unsigned char *t = rc == SQLITE_ROW ? sqlite3_column_text(st, 0) : NULL;
    int ok = t && strlen((const char *)t) == 16 && strspn((const char *)t, "0123456789abcdef") == 16;
    if (ok) {
        memcpy(v->tid, t, 17);
        v->owns_dir = sqlite3_column_int(st, 1) != 0;
        /* Tables made before the options were recorded have none. */
        const unsigned char *oc = sqlite3_column_text(st, 2);
        if (oc && strlen((const char *)oc) == 16) memcpy(v->opts_recorded, oc, 17);
        /* (and before the store's id was: none) */
        const unsigned char *sc = sqlite3_column_text(st, 3);
        if (sc && strlen((const char *)sc) == 16) memcpy(v->store_recorded, sc, 17);
    }
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
        /* busy, I/O...: an error now, not a broken table */
        *err = sqlite3_mprintf("cannot read its shadow table %s_config: %s", v->zName, sqlite3_errmsg(v->db));
        rc = sqlite3_finalize(st);
        return rc == SQLITE_OK || rc == SQLITE_ERROR ? SQLITE_IOERR : rc;
    }
    if (!ok) *err = sqlite3_mprintf("its shadow table %s_config holds no valid id", v->zName);
    sqlite3_finalize(st);
    return ok ? SQLITE_OK : SQLITE_CORRUPT;
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

/* An existing directory that holds no store, nor anything else: empty, or
 * with what a creation killed before it finished leaves (the engine's LOCK and READERS,
 * store.pool.new, its dirty map, its log directory and the note of an
 * external one, the binding's app- files).  A CREATE into it makes the
 * store there as into a new directory, and owns it.  (The engine refuses
 * a dirty map or a log that belonged to a published store.) */
static int holds_no_store(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    int empty = 1;
    struct dirent *e;
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, "LOCK") ||
                !strcmp(e->d_name, "READERS") ||
                !strcmp(e->d_name, "store.pool.new") || !strcmp(e->d_name, "store.dirty") ||
                !strcmp(e->d_name, "log") || !strcmp(e->d_name, "ssd-path") || !strcmp(e->d_name, "ssd-path.tmp") ||
                !strncmp(e->d_name, EMBKV_APP_FILE_PREFIX, strlen(EMBKV_APP_FILE_PREFIX));
    closedir(d);
    return empty;
}

/* Whether dir holds a pool file (a store, perhaps damaged). */
static int has_pool(const char *dir)
{
    char *p = sqlite3_mprintf("%s/store.pool", dir);
    struct stat st;
    int yes = p && stat(p, &st) == 0;
    sqlite3_free(p);
    return yes;
}

/* ------------------------------------------------------------------------
 * xCreate, xConnect, xDisconnect, xDestroy, xRename
 */
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;

/* The instance's reference to its store, and its count as a writer. */
static void store_release(ekvtab *v)
{
    if (v->evict_writer) ekreg_train_leave(v->store, &v->opts.train);
    v->evict_writer = 0;
    ekreg_close(v->store);
    v->store = NULL;
}

static void vt_free(ekvtab *v)
{
    ekconn *c = v->conn;
    if (c) ekconn_remove(c, v);
    if (v->session) embkv_session_close(v->session); /* returns its permits */
    if (v->store) store_release(v);
    if (v->wb) ekwbuf_release(v->wb, c);
    if (v->has_spare) ekcurbuf_free(&v->spare);
    sqlite3_free(v->scratch);
    sqlite3_free(v->zDb);
    sqlite3_free(v->zName);
    sqlite3_free(v->optpath);
    sqlite3_free(v->optssd);
    sqlite3_free(v->dir);
    sqlite3_free(v->broken);
    sqlite3_free(v->gone);
    sqlite3_free(v->base.zErrMsg);
    sqlite3_free(v);
    ekconn_unref(c);
}

/* Whether name is one of the extension's own tables (its table-valued
 * functions), which a table of that name would hide in its schema: *err
 * then says so (NULL: out of memory). */
static int reserved_name(const char *name, char **err)
{
    if (sqlite3_stricmp(name, "embkv_knn") && sqlite3_stricmp(name, "embkv_heat") &&
        sqlite3_stricmp(name, "embkv_pending"))
        return 0;
    *err = sqlite3_mprintf("the name %s is one of the extension's own tables (embkv_knn, embkv_heat, "
                           "embkv_pending): give the table another name", name);
    return 1;
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
    int made_dir = 0, leftovers = 0, listed = 0, create_held = 0, rc;
    if (!v->zDb || !v->zName) {
        rc = SQLITE_NOMEM;
        goto fail;
    }
    if (create && reserved_name(argv[2], &err)) {
        rc = err ? SQLITE_ERROR : SQLITE_NOMEM;
        goto fail;
    }
    rc = parse_options(v, argc, argv, create, &err);
    if (rc != SQLITE_OK) goto fail;
    if (create) {
        uint64_t r;
        sqlite3_randomness(sizeof r, &r);
        snprintf(v->tid, sizeof v->tid, "%016llx", (unsigned long long)r);
    } else if ((rc = shadow_read(v, &err)) != SQLITE_OK) {
        if (rc == SQLITE_CORRUPT) goto broken; /* missing or damaged */
        goto fail;
    }
    ekusers_self(db, v->zDb, v->tid, &v->who);
    dir = dir_for(v, create, &err);
    if (!dir) {
        rc = err ? SQLITE_ERROR : SQLITE_NOMEM;
        if (!create && rc == SQLITE_ERROR) goto broken;
        goto fail;
    }
    /* U1: an existing table opens its store only if the store lists it;
     * asked before the open when there is a pool (a refused table must not
     * even recover the store), and after it otherwise (the open says best
     * what is wrong with a directory that holds no store). */
    int check_users = !create && !v->is_tmp;
    int trusted = check_users ? ek_pragma_int(db, "trusted_schema", 0) != 0 : 1;
    /* (It opens the store to read, and the advice of a refusal says where
     * to attach.) */
    int may_not_write = !create && ekerr_readonly(db, v->zDb) != NULL;
    const char *attach_path = v->opts.path ? v->opts.path : dir;
    int admitted = 0;
    if (check_users && has_pool(dir)) {
        if ((rc = ekusers_admit(dir, &v->who, v->zName, v->opts.dim, attach_path, may_not_write, trusted, 0, &err)) != SQLITE_OK)
            goto broken;
        admitted = 1;
    }
    if (create) {
        /* From the look at the directory to the list (U1): one CREATE of
         * the process at a time, so that a CREATE attaching to a store
         * another thread's CREATE is making finds that one's list, not a
         * store without one (which it would take for one the C API made). */
        if (!v->is_tmp) {
            pthread_mutex_lock(&create_mu);
            create_held = 1;
        }
        struct stat st;
        made_dir = v->is_tmp || (stat(dir, &st) != 0 && errno == ENOENT);
        if (!made_dir && holds_no_store(dir))
            made_dir = leftovers = 1;  /* (what a killed CREATE left: this one makes the store) */
        v->owns_dir = made_dir;  /* a path naming an existing store attaches to it */
        const char *dbfile = sqlite3_db_filename(v->db, v->zDb);
        if (!v->opts.path && !v->is_tmp && dbfile && *dbfile) ekleft_sweep_db(v->conn, v->zDb, v->zName, dbfile);
    }
    embkv_options eo;
    memset(&eo, 0, sizeof eo);
    eo.dim = v->opts.dim;
    eo.dtype = v->opts.dtype;
    eo.expected_rows = v->opts.capacity;
    eo.pool_size = v->opts.pool_size;
    /* At a reconnect the CREATE's ssd_size was met when the table was
     * made; another table on the store may have raised it since, so the
     * store's own is taken (0), as a reopen of the store would. */
    eo.ssd_size = create ? v->opts.ssd_size : 0;
    eo.cache_size = v->opts.cache_size;
    /* Without a rate: the store's running migration, or one at the
     * engine's default rate (50000 moves a second). */
    eo.migrate_rate = !v->opts.migrate ? 0 : v->opts.migrate_rate ? v->opts.migrate_rate : EMBKV_MIGRATE_ANY;
    char *ssd_path = NULL;
    if (v->opts.ssd_path) {
        /* Relative to the database file's directory, as path is. */
        const char *dbfile = sqlite3_db_filename(v->db, v->zDb);
        const char *slash = dbfile && *dbfile ? strrchr(dbfile, '/') : NULL;
        ssd_path = v->opts.ssd_path[0] == '/' || !slash
                       ? sqlite3_mprintf("%s", v->opts.ssd_path)
                       : sqlite3_mprintf("%.*s/%s", (int)(slash - dbfile), dbfile, v->opts.ssd_path);
        if (!ssd_path) {
            rc = SQLITE_NOMEM;
            err = sqlite3_mprintf("out of memory");
            goto fail;
        }
        eo.ssd_path = ssd_path;
    }
    /* The optimizer's per-row state lives in the record from the start; an
     * existing store keeps its own (0: any), compared by check_state. */
    eo.state_floats = create && made_dir ? embkv_train_state_floats(&v->opts.train, v->opts.dim) : 0;
    char *emsg = NULL;
    /* A connection that may not write (read-only database, query_only)
     * opens the store to read (the engine's EMBKV_OPEN_READONLY): beside
     * another process's writer, rows as of its last checkpoint, and it
     * never keeps a trainer out; in a process that has the store open to
     * write, it shares that handle (the rows committed there). */
    unsigned oflags = create ? EMBKV_OPEN_CREATE : may_not_write ? EMBKV_OPEN_READONLY : 0;
    /* The tables of a store share one DRAM cache in a process, sized by
     * the first open: a table that reconnects asking for another size
     * shares it.  Its CREATE met the cache of its time; the order in which
     * a later process opens the tables must not leave one unusable. */
    if (!create) oflags |= EMBKV_OPEN_ANY_CACHE;
    if (v->opts.durable && !(oflags & EMBKV_OPEN_READONLY)) oflags |= EMBKV_OPEN_NO_CLOSE_SYNC;
    int erc = ekreg_open(dir, &eo, oflags, &v->store, &emsg);
    /* Another process has the store: wait for it as SQLite waits for a
     * lock, up to the connection's busy timeout, then say who has it. */
    int budget = erc == EMBKV_LOCKED && emsg && strstr(emsg, "another process") ? ek_pragma_int(db, "busy_timeout", 0) : 0;
    int waited = 0;
    while (erc == EMBKV_LOCKED && waited < budget && emsg && strstr(emsg, "another process")) {
        int step = waited < 100 ? 10 : 50;
        sqlite3_sleep(step);
        waited += step;
        sqlite3_free(emsg);
        emsg = NULL;
        erc = ekreg_open(dir, &eo, oflags, &v->store, &emsg);
    }
    if (erc == EMBKV_LOCKED && emsg && strstr(emsg, "another process")) {
        char *c_advice = strstr(emsg, ": one process at a time may write a store");
        if (c_advice)
            *c_advice = 0;  /* (the C API's ways; SQL's follow) */
        char *m = sqlite3_mprintf("%s: one process at a time may write a store (waited %d ms, the "
                                  "connection's busy timeout): to read it beside that process, open this database "
                                  "read-only (sqlite3 -readonly, a file:...?mode=ro URI, or PRAGMA query_only=1 "
                                  "before the table's first use); to write, close it there", emsg, waited);
        if (m) {
            sqlite3_free(emsg);
            emsg = m;
        }
    }
    sqlite3_free(ssd_path);
    if (erc != EMBKV_OK && leftovers)
        made_dir = 0;  /* the engine found more there than leftovers (a store without its pool): not ours to remove */
    if (erc != EMBKV_OK) {
        /* The option is at fault when the CREATE's path names something
         * that is not a store of this version; a damaged or busy store is
         * not an option error, nor is a store that has gone or changed
         * since its table was created (the path was fine then). */
        int dtype_fault = emsg && strstr(emsg, ": has dtype ");
        int path_fault = create && v->opts.path && !dtype_fault &&
                         !(emsg && (strstr(emsg, "option ssd_") || strstr(emsg, ": ssd_path ") ||
                                    strstr(emsg, "cache_size") || strstr(emsg, "migrate_rate") ||
                                    strstr(emsg, ": no room for "))) &&  /* (a full file system: not the path's fault) */
                         (erc == EMBKV_NOTSTORE || erc == EMBKV_VERSION || erc == EMBKV_INVALID || erc == EMBKV_IO);
        /* A pool too large for its filesystem: pool_size sized it, or
         * capacity did (bits 2 and 3 of given, in ek_options' order). */
        const char *sized_by = !(create && erc == EMBKV_FULL) ? NULL
                               : (v->given & (1u << 2)) ? "option pool_size: "
                               : (v->given & (1u << 3)) ? "option capacity: " : NULL;
        struct stat gone;
        int renamed = !create && !v->opts.path && !v->is_tmp && erc == EMBKV_NOTSTORE && stat(dir, &gone) != 0 &&
                      errno == ENOENT;
        int taken_back = create && v->opts.path && ekconn_removing(v->conn, dir);
        err = sqlite3_mprintf("%s%s%s%s", dtype_fault ? "option dtype: " : path_fault ? "option path: " : sized_by ? sized_by : "cannot open its store: ",
                              emsg ? emsg : "out of memory",
                              renamed ? " (a table created without path keeps its store beside the database file it "
                                        "was created in, named after that file and the table's id: if this file was "
                                        "copied or renamed, copy or move that directory to this name)" : "",
                              taken_back ? " (that store was made by a CREATE in this transaction that ROLLBACK TO "
                                           "took back, and it is removed when the transaction ends: end it (COMMIT "
                                           "or ROLLBACK), then CREATE the table again, or name another path)" : "");
        sqlite3_free(emsg);
        rc = ekerr_rc(erc);
        /* Another process holding the store, or a passing condition, is an
         * error here and now; a store that is not there is a broken table. */
        if (!create && erc != EMBKV_LOCKED && erc != EMBKV_NOMEM && erc != EMBKV_BUSY) goto broken;
        goto fail;
    }
    if (check_users && !admitted &&
        (rc = ekusers_admit(dir, &v->who, v->zName, v->opts.dim, attach_path, may_not_write, trusted, 0, &err)) != SQLITE_OK)
        goto broken;
    if ((rc = store_options(v, dir, &err)) != SQLITE_OK) {
        if (!create) goto broken;
        goto fail;
    }
    int writer = !sqlite3_db_readonly(db, v->zDb);
    if (ekreg_train_configure(v->store, &v->opts.train, writer) != EMBKV_OK) {
        err = sqlite3_mprintf("%s", embkv_errmsg());
        rc = SQLITE_ERROR;
        goto fail;
    }
    v->evict_writer = writer;
    v->dir = sqlite3_mprintf("%s", embkv_path(v->store));
    v->dim = embkv_dim(v->store);
    v->dtype = embkv_dtype(v->store);
    v->state_floats = embkv_state_floats(v->store);
    v->scratch = sqlite3_malloc64((uint64_t)v->dim * sizeof(float));
    if (!v->dir || !v->scratch) {
        rc = SQLITE_NOMEM;
        goto fail;
    }
    /* A COMMIT of this table cut off by a dead process (journal.c): put
     * back or kept as SQLite's file decided, before anything reads. */
    if (!create && (rc = ekjournal_recover(v, writer && !may_not_write, &err)) != SQLITE_OK) {
        if (rc == SQLITE_CORRUPT || rc == SQLITE_READONLY) goto broken;
        goto fail;
    }
    if (ekwbuf_acquire(v) != SQLITE_OK) {
        rc = SQLITE_NOMEM;
        goto fail;
    }
    if (create) {
        /* SQLite enlists a table it creates in the open transaction (it
         * gets xSync/xCommit/xRollback) without calling its xBegin. */
        v->joined = 1;
        ekwbuf_begin(v->wb);
    }
    rc = sqlite3_declare_vtab(db, EK_SCHEMA);
    /* Neither DIRECTONLY nor INNOCUOUS: views and triggers may read and
     * write the table while the schema is trusted (PRAGMA trusted_schema,
     * on by default), and not in a database opened with it off, whose
     * schema could otherwise make an application touch a store it names.
     * The functions with side effects (pull, push, checkpoint) stay
     * DIRECTONLY whatever the setting. */
    if (rc == SQLITE_OK) rc = sqlite3_vtab_config(db, SQLITE_VTAB_CONSTRAINT_SUPPORT, 1);
    if (rc != SQLITE_OK) {
        err = sqlite3_mprintf("cannot declare its schema: %s", sqlite3_errmsg(db));
        goto fail;
    }
    if (create) {
        /* Listed first: a CREATE that raced another onto the same new
         * directory (threads of one process; another process is kept out
         * by the store's lock) finds that one's list and only joins it. */
        if (!v->is_tmp) rc = ekusers_add(v->dir, &v->who, &made_dir, &listed, &err);
        if (create_held) {
            pthread_mutex_unlock(&create_mu);
            create_held = 0;
        }
        if (rc != SQLITE_OK) goto fail;
        v->owns_dir = made_dir;
        rc = shadow_create(v, &err);
        if (rc != SQLITE_OK) goto fail;
        /* Rolled back, the table lets go of the store; a directory it made
         * goes with it unless other tables attached meanwhile. */
        if (made_dir && v->is_tmp)
            rc = ekconn_defer_remove(v->conn, EK_ON_ROLLBACK, v->dir, v->tid, &err);
        else if (made_dir || listed)
            rc = ekconn_defer_unlist(v->conn, EK_ON_ROLLBACK, v->dir, &v->who, made_dir, &err);
        if (rc != SQLITE_OK) goto fail;
    }
    /* U2: a copy is listed once its table has opened (never a refused
     * one), unless its database is read-only for this connection for good
     * (query_only can be turned off: not a reason). */
    if (check_users && sqlite3_db_readonly(db, v->zDb) != 1 &&
        ekusers_admit(dir, &v->who, v->zName, v->opts.dim, attach_path, may_not_write, trusted, 1, &err) != SQLITE_OK) {
        sqlite3_free(err); /* (admitted a moment ago: the list changed meanwhile; the next connect says) */
        err = NULL;
    }
    sqlite3_free(dir);
    ekconn_add(v->conn, v);
    *ppVtab = &v->base;
    return SQLITE_OK;

broken:
    if (create_held) pthread_mutex_unlock(&create_mu);
    /* An existing table whose store cannot be opened (its directory is
     * gone, holds something else or a newer format, its shadow table is
     * missing): connect anyway, so that DROP TABLE still works, and fail
     * every other use with the reason.  Such a DROP leaves the directory
     * alone: it was never seen to be an embkv store. */
    v->broken = err ? err : sqlite3_mprintf("%s", sqlite3_errstr(rc));
    v->broken_rc = rc == SQLITE_OK ? SQLITE_ERROR : rc;
    err = NULL;
    if (v->store)  /* opened, then refused (its options are damaged) */
        store_release(v);
    sqlite3_free(dir);
    dir = NULL;
    v->dim = v->opts.dim;
    if (!v->broken) {
        rc = SQLITE_NOMEM;
        goto fail;
    }
    rc = sqlite3_declare_vtab(db, EK_SCHEMA);
    if (rc == SQLITE_OK) rc = sqlite3_vtab_config(db, SQLITE_VTAB_CONSTRAINT_SUPPORT, 1);
    if (rc != SQLITE_OK) goto fail;
    ekconn_add(v->conn, v);
    *ppVtab = &v->base;
    return SQLITE_OK;

fail:
    if (create_held) pthread_mutex_unlock(&create_mu);
    *pzErr = sqlite3_mprintf("embkv table %s: %s", argv[2], err ? err : sqlite3_errstr(rc));
    sqlite3_free(err);
    if (v->store)
        store_release(v);
    if (v->wb) {  /* its reference to the store too, before removing it */
        ekwbuf_release(v->wb, v->conn);
        v->wb = NULL;
        v->txn = NULL;
    }
    if (listed) ekusers_remove(v->dir, &v->who);
    if (made_dir) {
        /* Only if nobody else opened it meanwhile (a racing CREATE). */
        if (v->is_tmp) ekreg_tmpdir_forget(v->conn, v->tid);
        else if (ekusers_none_but(dir, v->tid)) embkv_destroy(dir);
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
    /* The directory goes when the DROP commits, not now, and only with the
     * last table using it (dirusers.c); a temporary one is the
     * table's own. */
    int rc = SQLITE_OK;
    if (v->store && v->is_tmp && v->owns_dir)
        rc = ekconn_defer_remove(v->conn, EK_ON_COMMIT, v->dir, v->tid, &err);
    else if (v->store && !v->is_tmp)
        rc = ekconn_defer_unlist(v->conn, EK_ON_COMMIT, v->dir, &v->who, v->owns_dir, &err);
    if (rc != SQLITE_OK) {
        ekerr_table(v, "%s", err ? err : sqlite3_errstr(rc));
        sqlite3_free(err);
        return rc;
    }
    char *sql = sqlite3_mprintf("DROP TABLE IF EXISTS \"%w\".\"%w_config\"", v->zDb, v->zName);
    if (!sql) return SQLITE_NOMEM;
    char *msg = NULL;
    rc = sqlite3_exec(v->db, sql, NULL, NULL, &msg);
    sqlite3_free(sql);
    if (rc != SQLITE_OK) {
        ekerr_table(v, "cannot drop its shadow table %s_config: %s", v->zName, msg ? msg : sqlite3_errstr(rc));
        sqlite3_free(msg);
        return rc;
    }
    vt_free(v);
    return SQLITE_OK;
}

static int vt_rename(sqlite3_vtab *pv, const char *zNew)
{
    ekvtab *v = (ekvtab *)pv;
    char *why = NULL;
    if (reserved_name(zNew, &why)) {
        int rc = why ? SQLITE_ERROR : SQLITE_NOMEM;
        ekerr_table(v, "%s", why ? why : "out of memory");
        sqlite3_free(why);
        return rc;
    }
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
        ekerr_table(v, "cannot rename its shadow table %s_config: %s", v->zName, msg ? msg : sqlite3_errstr(rc));
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
    ekerr_table(v, "id %lld already exists (UNIQUE constraint failed: %s.id)", (long long)id, v->zName);
    return SQLITE_CONSTRAINT_PRIMARYKEY;
}

static int check_hidden(ekvtab *v, int64_t id, sqlite3_value **argv, int is_insert)
{
    static const char *const names[] = {"clock", "tier"};
    for (int k = 0; k < 2; k++) {
        sqlite3_value *h = argv[2 + COL_CLOCK + k];
        int written = is_insert ? sqlite3_value_type(h) != SQLITE_NULL : !sqlite3_value_nochange(h);
        if (written) {
            ekerr_table(v, "id %lld: column %s is read-only", (long long)id, names[k]);
            return SQLITE_ERROR;
        }
    }
    return SQLITE_OK;
}

static int vt_update(sqlite3_vtab *pv, int argc, sqlite3_value **argv, sqlite3_int64 *pRowid)
{
    ekvtab *v = (ekvtab *)pv;
    int rc;
    if ((rc = ekerr_unusable(v)) != SQLITE_OK) return rc;
    if ((rc = ekwbuf_unsync(v->wb)) != SQLITE_OK) {
        ekerr_table(v, "cannot put the store back after the failed COMMIT: %s", embkv_errmsg());
        return rc;
    }
    if (!v->joined) {
        /* Only a table in the transaction is written; should SQLite have
         * enlisted it without xBegin, it is joined all the same. */
        v->joined = 1;
        ekwbuf_begin(v->wb);
    }
    if (argc == 1) { /* DELETE */
        int64_t id = sqlite3_value_int64(argv[0]);
        if (ektxn_reserve(v->txn, 1) != SQLITE_OK) return SQLITE_NOMEM;
        return ektxn_set(v->txn, id, EKTXN_DEL, 0, NULL);
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
        ekerr_table(v, "id %lld: id and rowid are set to different values", (long long)newid);
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
            ekerr_table(v, "id %lld: row not found", (long long)oldid);
            return SQLITE_ERROR;
        }
    } else {
        return SQLITE_OK; /* nothing changes */
    }
    if (ektxn_reserve(v->txn, 2) != SQLITE_OK) return SQLITE_NOMEM;
    if (is_insert || newid != oldid) {
        /* Present as this connection sees it: its own writes first. */
        const ektxn_entry *e = ektxn_find(v->txn, newid);
        int in_store = embkv_exists(v->store, newid) == 1;
        int replace = 0;
        if ((e ? e->kind == EKTXN_PUT : in_store) && (rc = conflict(v, newid, &replace)) != SQLITE_OK) return rc;
        /* A new row: COMMIT replaces whatever the store has under that id
         * (REPLACE, or a row this transaction deleted), and an id the
         * store does not have must still be free then. */
        int fresh = replace || in_store || sqlite3_vtab_on_conflict(v->db) == SQLITE_REPLACE ? EKTXN_FRESH
                                                                                          : EKTXN_FRESH_NEW;
        /* Deleted here after this transaction inserted it: still an INSERT
         * of an id the store must not have (whatever a pull did since). */
        if (!replace && e && e->kind == EKTXN_DEL && e->fresh == EKTXN_FRESH_NEW) fresh = EKTXN_FRESH_NEW;
        /* Reserved above: these cannot fail, so an id change is never half
         * done. */
        if (!is_insert && (rc = ektxn_set(v->txn, oldid, EKTXN_DEL, 0, NULL)) != SQLITE_OK) return rc;
        if ((rc = ektxn_set(v->txn, newid, EKTXN_PUT, fresh, vec)) != SQLITE_OK) return rc;
        if (is_insert) *pRowid = newid;
    } else {
        const ektxn_entry *e = ektxn_find(v->txn, oldid);
        if ((rc = ektxn_set(v->txn, oldid, EKTXN_PUT, e && e->kind == EKTXN_PUT ? e->fresh : 0, vec)) != SQLITE_OK)
            return rc;
    }
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * Transactions
 */
static int vt_begin(sqlite3_vtab *pv)
{
    ((ekvtab *)pv)->joined = 1;
    if (((ekvtab *)pv)->wb) ekwbuf_begin(((ekvtab *)pv)->wb);
    return SQLITE_OK;
}

static int vt_sync(sqlite3_vtab *pv)
{
    ekvtab *v = (ekvtab *)pv;
    if (!v->wb) return SQLITE_OK;
    char *msg = NULL;
    int rc = ekwbuf_sync(v->wb, v->conn, &msg);
    if (rc != SQLITE_OK) ekerr_table(v, "%s", msg ? msg : "COMMIT failed: out of memory");
    sqlite3_free(msg);
    return rc;
}

static int vt_commit(sqlite3_vtab *pv)
{
    ((ekvtab *)pv)->joined = 0;
    ekwbuf *wb = ((ekvtab *)pv)->wb;
    if (wb) ekwbuf_end(wb);
    return SQLITE_OK;
}

static int vt_rollback(sqlite3_vtab *pv)
{
    ekvtab *v = (ekvtab *)pv;
    v->joined = 0;
    if (v->wb) ekwbuf_rollback(v->wb);
    return SQLITE_OK;
}

/* (A table connected without its store has no buffer.) */
/* (A savepoint operation after a failed COMMIT's first phase puts the
 * store back first: ekwbuf_unsync.) */
static int vt_savepoint(sqlite3_vtab *pv, int n)
{
    ekvtab *v = (ekvtab *)pv;
    int rc = ekwbuf_unsync(v->wb);
    return rc != SQLITE_OK ? rc : v->txn ? ektxn_savepoint(v->txn, n) : SQLITE_OK;
}

static int vt_release(sqlite3_vtab *pv, int n)
{
    ekvtab *v = (ekvtab *)pv;
    int rc = ekwbuf_unsync(v->wb);
    if (v->txn) ektxn_release(v->txn, n);
    return rc;
}

static int vt_rollback_to(sqlite3_vtab *pv, int n)
{
    ekvtab *v = (ekvtab *)pv;
    int rc = ekwbuf_unsync(v->wb);
    if (v->txn) ektxn_rollback_to(v->txn, n);
    return rc;
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

