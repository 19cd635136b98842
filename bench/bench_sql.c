/*
 * bench_sql.c - batched lookups through SQLite: a plain table versus an
 * embkv virtual table, and embkv's engine API for the cost of the SQL layer.
 *
 *   bench_sql DIR [--ext PATH] [--rows N] [--batches B] [--batch-size S]
 *                 [--reps R] [--commit-every C]
 *
 * Needs -lsqlite3.  DIR (absent or empty; removed at the end) holds the
 * database plain.db, the virtual table's directory vt/ and an engine store
 * engine/.  The extension is loaded from PATH (default build/embkv.so).
 *
 * Data as in bench_engine: N rows (default 2,000,000) with random 63-bit
 * ids, dim 64; B batches (default 2,000) of S ids (default 512) drawn
 * Zipf(0.99); all generated, and each batch's JSON array of ids written,
 * before timing.  Timed, R times each (default 3), interleaved:
 *   plain:  SELECT id, vec FROM p WHERE id IN (SELECT value FROM json_each(?))
 *           on p(id INTEGER PRIMARY KEY, vec BLOB), WAL, a page cache of
 *           1.25 x the database, warmed by a full scan and one untimed pass;
 *   embkv:  the same query on CREATE VIRTUAL TABLE t USING embkv(dim=64,
 *           path='DIR/vt', capacity=N), also warmed;
 *   pull:   SELECT embkv_pull('t', ?) with the batch as an int64 BLOB, when
 *           the extension has embkv_pull;
 *   engine: embkv_get_batch on a store holding the same rows.
 * Each query copies every returned vector into an output buffer, as a
 * client would.  IN (...) returns each distinct id once, so rates are given
 * per requested id (ids/s) and the distinct rows returned are counted.
 * The first pass of each query checks every returned vector.
 * If the extension cannot be loaded or the virtual table does not work, the
 * embkv SQL parts are skipped with the reason and the rest still runs.
 */
#include "embkv.h"
#include "bench_common.h"

#include <sqlite3.h>

#define DIM 64
#define ZIPF_S 0.99

static void ck(int rc, const char *what)
{
    if (rc != EMBKV_OK) die("%s failed (rc %d): %s", what, rc, embkv_errmsg());
}

static void sql_exec(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK) die("%s: %s", sql, err ? err : "?");
}

/* id -> row, for checking returned vectors. */
typedef struct idmap {
    int64_t *key;
    uint32_t *row;
    uint64_t mask;
} idmap;

static void idmap_build(idmap *m, const int64_t *ids, size_t n)
{
    uint64_t cap = 2;
    while (cap < 2 * n) cap <<= 1;
    m->key = xmalloc(cap * sizeof *m->key);
    m->row = xmalloc(cap * sizeof *m->row);
    memset(m->key, 0xff, cap * sizeof *m->key);
    m->mask = cap - 1;
    for (size_t r = 0; r < n; r++) {
        uint64_t i = ((uint64_t)ids[r] * 0x9E3779B97F4A7C15ull) >> 20;
        for (i &= m->mask; m->key[i] != -1; i = (i + 1) & m->mask) {}
        m->key[i] = ids[r];
        m->row[i] = (uint32_t)r;
    }
}

static int64_t idmap_find(const idmap *m, int64_t id)
{
    uint64_t i = (((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 20) & m->mask;
    for (; m->key[i] != -1; i = (i + 1) & m->mask)
        if (m->key[i] == id) return m->row[i];
    return -1;
}

typedef struct ctx {
    const dataset *d;
    char **json;      /* json[b]: the ids of batch b as a JSON array */
    int *json_len;
    float *out;       /* batch * dim floats */
    const idmap *map;
} ctx;

/* Runs the IN query over all batches; returns the rows returned.  With
 * check, verifies every row and returns (size_t)-1 on the first problem. */
static size_t run_in_query(sqlite3 *db, sqlite3_stmt *st, const ctx *c, int check)
{
    const dataset *d = c->d;
    const size_t dim = d->dim, vbytes = dim * sizeof(float);
    size_t rows = 0;
    for (size_t b = 0; b < d->nbatches; b++) {
        sqlite3_bind_text(st, 1, c->json[b], c->json_len[b], SQLITE_STATIC);
        size_t k = 0;
        int rc;
        while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
            const void *blob = sqlite3_column_blob(st, 1);
            int nbytes = sqlite3_column_bytes(st, 1);
            if (check) {
                int64_t id = sqlite3_column_int64(st, 0);
                int64_t row = idmap_find(c->map, id);
                if (row < 0 || (size_t)nbytes != vbytes || !blob ||
                    memcmp(blob, d->vecs + (size_t)row * dim, vbytes)) {
                    fprintf(stderr, "  batch %zu: wrong row for id %" PRId64 " (%d bytes)\n", b, id, nbytes);
                    sqlite3_reset(st);
                    return (size_t)-1;
                }
            }
            if (k < d->batch && blob && (size_t)nbytes == vbytes) memcpy(c->out + k * dim, blob, vbytes);
            k++;
        }
        if (rc != SQLITE_DONE) {
            fprintf(stderr, "  batch %zu: %s\n", b, sqlite3_errmsg(db));
            sqlite3_reset(st);
            return (size_t)-1;
        }
        sqlite3_reset(st);
        rows += k;
    }
    return rows;
}

/* SELECT embkv_pull('t', ?) with int64 BLOBs; 0 on success. */
static int run_pull(sqlite3 *db, sqlite3_stmt *st, const ctx *c, int check)
{
    const dataset *d = c->d;
    const size_t dim = d->dim, vbytes = dim * sizeof(float);
    for (size_t b = 0; b < d->nbatches; b++) {
        const int64_t *ids = d->bids + b * d->batch;
        sqlite3_bind_blob(st, 1, ids, (int)(d->batch * sizeof *ids), SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_ROW) {
            fprintf(stderr, "  embkv_pull, batch %zu: %s\n", b, sqlite3_errmsg(db));
            sqlite3_reset(st);
            return -1;
        }
        const void *blob = sqlite3_column_blob(st, 0);
        size_t nbytes = (size_t)sqlite3_column_bytes(st, 0);
        if (nbytes != d->batch * vbytes || !blob) {
            fprintf(stderr, "  embkv_pull, batch %zu: %zu bytes, want %zu\n", b, nbytes, d->batch * vbytes);
            sqlite3_reset(st);
            return -1;
        }
        memcpy(c->out, blob, nbytes);
        if (check)
            for (size_t i = 0; i < d->batch; i++)
                if (memcmp(c->out + i * dim, d->vecs + (size_t)d->brow[b * d->batch + i] * dim, vbytes)) {
                    fprintf(stderr, "  embkv_pull, batch %zu: wrong vector at %zu\n", b, i);
                    sqlite3_reset(st);
                    return -1;
                }
        sqlite3_reset(st);
    }
    return 0;
}

/* Inserts all rows with INSERT INTO <table>(id, vec), committing every
 * `every` rows; returns seconds, or -1 with the error printed. */
static double load_table(sqlite3 *db, const char *table, const dataset *d, size_t every)
{
    char sql[128];
    snprintf(sql, sizeof sql, "INSERT INTO %s(id, vec) VALUES (?1, ?2)", table);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        fprintf(stderr, "  %s: %s\n", sql, sqlite3_errmsg(db));
        return -1;
    }
    const size_t vbytes = d->dim * sizeof(float);
    double t0 = now_s();
    for (size_t i = 0; i < d->rows; i++) {
        if (i % every == 0) sql_exec(db, "BEGIN");
        sqlite3_bind_int64(st, 1, d->ids[i]);
        sqlite3_bind_blob(st, 2, d->vecs + i * d->dim, (int)vbytes, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE) {
            fprintf(stderr, "  insert into %s, row %zu: %s\n", table, i, sqlite3_errmsg(db));
            sqlite3_finalize(st);
            sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
            return -1;
        }
        sqlite3_reset(st);
        if ((i + 1) % every == 0 || i + 1 == d->rows) {
            if (sqlite3_exec(db, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
                fprintf(stderr, "  COMMIT into %s: %s\n", table, sqlite3_errmsg(db));
                sqlite3_finalize(st);
                return -1;
            }
        }
    }
    double t = now_s() - t0;
    sqlite3_finalize(st);
    return t;
}

static void explain(sqlite3 *db, const char *sql)
{
    char q[512];
    snprintf(q, sizeof q, "EXPLAIN QUERY PLAN %s", sql);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, q, -1, &st, NULL) != SQLITE_OK) return;
    while (sqlite3_step(st) == SQLITE_ROW) printf("      plan: %s\n", (const char *)sqlite3_column_text(st, 3));
    sqlite3_finalize(st);
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_sql DIR [--ext PATH] [--rows N] [--batches B] [--batch-size S] "
                    "[--reps R] [--commit-every C]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *dir = NULL, *ext = "build/embkv.so";
    size_t rows = 2000000, nbatches = 2000, bsize = 512, reps = 3, every = 100000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') { if (dir) usage(); dir = a; continue; }
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--ext")) ext = v;
        else if (!strcmp(a, "--rows")) rows = parse_size(a, v);
        else if (!strcmp(a, "--batches")) nbatches = parse_size(a, v);
        else if (!strcmp(a, "--batch-size")) bsize = parse_size(a, v);
        else if (!strcmp(a, "--reps")) reps = parse_size(a, v);
        else if (!strcmp(a, "--commit-every")) every = parse_size(a, v);
        else usage();
    }
    if (!dir || rows < 1 || nbatches < 1 || bsize < 1 || reps < 1 || reps > MAX_REPS || every < 1) usage();
    if (!dir_absent_or_empty(dir)) die("%s exists and is not empty; give a fresh directory", dir);
    if (mkdir(dir, 0755) && errno != EEXIST) die("mkdir %s: %s", dir, strerror(errno));
    const size_t dim = DIM, vbytes = dim * sizeof(float);
    char dbpath[1024], vtdir[1024], engdir[1024];
    snprintf(dbpath, sizeof dbpath, "%s/plain.db", dir);
    snprintf(vtdir, sizeof vtdir, "%s/vt", dir);
    snprintf(engdir, sizeof engdir, "%s/engine", dir);

    printf("== bench_sql: %zu rows, dim %zu, %zu batches x %zu ids, zipf %.2f, %zu runs/phase, SQLite %s\n",
           rows, dim, nbatches, bsize, ZIPF_S, reps, sqlite3_libversion());
    dataset d;
    dataset_make(&d, rows, dim, nbatches, bsize, ZIPF_S, 1);
    const size_t total = nbatches * bsize;
    const double distinct = dataset_mean_distinct(&d);
    printf("  %.1f distinct ids per batch of %zu\n", distinct, bsize);
    idmap map;
    idmap_build(&map, d.ids, rows);

    ctx c = {.d = &d, .map = &map, .out = xalloc64(bsize * vbytes)};
    c.json = xmalloc(nbatches * sizeof *c.json);
    c.json_len = xmalloc(nbatches * sizeof *c.json_len);
    for (size_t b = 0; b < nbatches; b++) {
        char *j = xmalloc(bsize * 21 + 3), *p = j;
        *p++ = '[';
        for (size_t i = 0; i < bsize; i++)
            p += sprintf(p, "%s%" PRId64, i ? "," : "", d.bids[b * bsize + i]);
        *p++ = ']';
        *p = 0;
        c.json[b] = j;
        c.json_len[b] = (int)(p - j);
    }

    /* ---- the engine store */
    printf("\n-- load\n");
    size_t pool_mb = (size_t)((double)rows * (32.0 + (double)vbytes) * 1.5 / 1048576.0) + rows * 64 / 1048576 + 64;
    embkv_options opt = {.dim = (uint32_t)dim, .expected_rows = rows, .pool_size = (uint64_t)pool_mb << 20};
    embkv_store *s;
    ck(embkv_open(engdir, &opt, EMBKV_OPEN_CREATE, &s), "embkv_open");
    double t0 = now_s();
    for (size_t i = 0; i < rows; i++) ck(embkv_put(s, d.ids[i], d.vecs + i * dim, NULL, EMBKV_PUT_INSERT), "embkv_put");
    ck(embkv_sync(s), "embkv_sync");
    double t = now_s() - t0;
    printf("  %-44s %8.3f M rows/s  (%.2f s)\n", "engine embkv_put + embkv_sync", (double)rows / t / 1e6, t);

    /* ---- the plain table */
    sqlite3 *db;
    if (sqlite3_open_v2(dbpath, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK)
        die("sqlite3_open %s: %s", dbpath, sqlite3_errmsg(db));
    char sql[512];
    /* Cache for the table: ~(vector + 24 bytes) per row in 4 KiB pages, x1.5. */
    snprintf(sql, sizeof sql, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA cache_size=-%zu;",
             (size_t)((double)rows * ((double)vbytes + 24.0) * 1.5 / 1024.0) + 1024);
    sql_exec(db, sql);
    sql_exec(db, "CREATE TABLE p(id INTEGER PRIMARY KEY, vec BLOB)");
    t = load_table(db, "p", &d, every);
    if (t < 0) die("loading the plain table failed");
    printf("  %-44s %8.3f M rows/s  (%.2f s)\n", "plain table INSERT (WAL)", (double)rows / t / 1e6, t);
    sql_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)");
    {
        /* A page cache of 1.25 x the database, then one full scan to fill it. */
        int64_t pages = 0, page_size = 0, cache_kib;
        sqlite3_stmt *st;
        if (sqlite3_prepare_v2(db, "SELECT (SELECT page_count FROM pragma_page_count), "
                                   "(SELECT page_size FROM pragma_page_size)", -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW) {
            pages = sqlite3_column_int64(st, 0);
            page_size = sqlite3_column_int64(st, 1);
        }
        sqlite3_finalize(st);
        cache_kib = pages * page_size / 1024 * 5 / 4 + 16384;
        snprintf(sql, sizeof sql, "PRAGMA cache_size=-%lld", (long long)cache_kib);
        sql_exec(db, sql);
        t0 = now_s();
        sql_exec(db, "SELECT sum(length(vec)) FROM p");
        printf("  plain database %.0f MiB (%lld pages of %lld B), cache_size %.0f MiB, warmed by a scan in %.2f s\n",
               (double)(pages * page_size) / 1048576.0, (long long)pages, (long long)page_size,
               (double)cache_kib / 1024.0, now_s() - t0);
    }

    /* ---- the embkv virtual table */
    int have_vt = 0;
    char *err = NULL;
    sqlite3_enable_load_extension(db, 1);
    if (sqlite3_load_extension(db, ext, NULL, &err) != SQLITE_OK) {
        printf("  embkv extension %s not usable: %s\n", ext, err ? err : "?");
        sqlite3_free(err);
    } else {
        char *create = sqlite3_mprintf("CREATE VIRTUAL TABLE t USING embkv(dim=%d, path='%q', capacity=%lld)",
                                       (int)dim, vtdir, (long long)rows);
        int crc = sqlite3_exec(db, create, NULL, NULL, &err);
        if (crc != SQLITE_OK) {
            printf("  %s: %s\n", create, err ? err : "?");
            sqlite3_free(err);
        } else if ((t = load_table(db, "t", &d, every)) < 0) {
            printf("  loading the embkv table failed; its SQL figures are skipped\n");
        } else {
            have_vt = 1;
            printf("  %-44s %8.3f M rows/s  (%.2f s)\n", "embkv table INSERT", (double)rows / t / 1e6, t);
        }
        sqlite3_free(create);
    }

    /* ---- statements, plans and the checked warm-up pass */
    const char *q_plain = "SELECT id, vec FROM p WHERE id IN (SELECT value FROM json_each(?1))";
    const char *q_vt = "SELECT id, vec FROM t WHERE id IN (SELECT value FROM json_each(?1))";
    sqlite3_stmt *st_plain = NULL, *st_vt = NULL, *st_pull = NULL;
    if (sqlite3_prepare_v2(db, q_plain, -1, &st_plain, NULL) != SQLITE_OK) die("%s: %s", q_plain, sqlite3_errmsg(db));
    printf("\n-- queries\n  plain: %s\n", q_plain);
    explain(db, q_plain);
    size_t want_rows = (size_t)(distinct * (double)nbatches + 0.5);
    size_t got = run_in_query(db, st_plain, &c, 1);
    if (got != want_rows) die("plain query returned %zu rows, expected %zu", got, want_rows);
    if (have_vt) {
        printf("  embkv: %s\n", q_vt);
        if (sqlite3_prepare_v2(db, q_vt, -1, &st_vt, NULL) != SQLITE_OK) {
            printf("  not usable: %s\n", sqlite3_errmsg(db));
            have_vt = 0;
        } else {
            explain(db, q_vt);
            got = run_in_query(db, st_vt, &c, 1);
            if (got != want_rows) {
                printf("  embkv query returned %zu rows, expected %zu: its figures are skipped\n",
                       got == (size_t)-1 ? 0 : got, want_rows);
                have_vt = 0;
            }
        }
        const char *q_pull = "SELECT embkv_pull('t', ?1)";
        if (sqlite3_prepare_v2(db, q_pull, -1, &st_pull, NULL) == SQLITE_OK) {
            printf("  pull:  %s  (int64 BLOB of the batch)\n", q_pull);
            if (run_pull(db, st_pull, &c, 1)) {
                printf("  embkv_pull failed: its figures are skipped\n");
                sqlite3_finalize(st_pull);
                st_pull = NULL;
            }
        } else {
            printf("  (no embkv_pull: %s)\n", sqlite3_errmsg(db));
            st_pull = NULL;
        }
    }
    {
        size_t nm = 0, miss = 0;
        for (size_t b = 0; b < nbatches; b++) {
            ck(embkv_get_batch(s, d.bids + b * bsize, bsize, c.out, NULL, &nm), "embkv_get_batch");
            miss += nm;
        }
        if (miss) die("engine store misses %zu ids", miss);
    }
    printf("  checked: every returned vector matches the data\n");

    /* ---- timed */
    timing t_plain = {.name = "plain SQLite table, IN (json_each)"};
    timing t_vt = {.name = "embkv virtual table, IN (json_each)"};
    timing t_pull = {.name = "embkv_pull('t', int64 blob)"};
    timing t_eng = {.name = "engine embkv_get_batch"};
    for (size_t rep = 0; rep < reps; rep++) {
        t0 = now_s();
        if (run_in_query(db, st_plain, &c, 0) != want_rows) die("plain query failed");
        timing_add(&t_plain, now_s() - t0);
        if (have_vt) {
            t0 = now_s();
            if (run_in_query(db, st_vt, &c, 0) != want_rows) die("embkv query failed");
            timing_add(&t_vt, now_s() - t0);
        }
        if (st_pull) {
            t0 = now_s();
            if (run_pull(db, st_pull, &c, 0)) die("embkv_pull failed");
            timing_add(&t_pull, now_s() - t0);
        }
        t0 = now_s();
        for (size_t b = 0; b < nbatches; b++) embkv_get_batch(s, d.bids + b * bsize, bsize, c.out, NULL, NULL);
        timing_add(&t_eng, now_s() - t0);
    }
    printf("\n-- batched lookups (%zu ids requested per run, %zu distinct rows returned by IN)\n",
           total, want_rows);
    timing_print_rate(&t_plain, (double)total, "ids");
    if (have_vt) timing_print_rate(&t_vt, (double)total, "ids");
    if (st_pull) timing_print_rate(&t_pull, (double)total, "ids");
    timing_print_rate(&t_eng, (double)total, "ids");
    printf("  per requested id: plain %.0f ns", timing_best(&t_plain) / (double)total * 1e9);
    if (have_vt) printf(", embkv SQL %.0f ns", timing_best(&t_vt) / (double)total * 1e9);
    if (st_pull) printf(", embkv_pull %.0f ns", timing_best(&t_pull) / (double)total * 1e9);
    printf(", engine %.0f ns\n", timing_best(&t_eng) / (double)total * 1e9);

    printf("\n-- ratios (rate / rate)\n");
    print_ratio("engine get_batch / plain SQL", &t_eng, &t_plain);
    if (have_vt) {
        print_ratio("embkv SQL / plain SQL", &t_vt, &t_plain);
        print_ratio("embkv SQL / engine get_batch", &t_vt, &t_eng);
    } else {
        printf("  embkv SQL figures skipped: the extension's virtual table was not usable\n");
    }
    if (st_pull) {
        print_ratio("embkv_pull / plain SQL", &t_pull, &t_plain);
        print_ratio("embkv_pull / engine get_batch", &t_pull, &t_eng);
    }

    sqlite3_finalize(st_plain);
    sqlite3_finalize(st_vt);
    sqlite3_finalize(st_pull);
    if (sqlite3_close(db) != SQLITE_OK) fprintf(stderr, "sqlite3_close: %s\n", sqlite3_errmsg(db));
    ck(embkv_close(s), "embkv_close");
    rm_rf(dir);
    for (size_t b = 0; b < nbatches; b++) free(c.json[b]);
    free(c.json); free(c.json_len); free(c.out);
    free(map.key); free(map.row);
    dataset_free(&d);
    return 0;
}
