/*
 * bench_ltm - larger-than-memory benchmark: embkv against RocksDB and LMDB on
 * the same data (dim-64 float32 rows with an Adagrad state of dim floats),
 * read through a file system under a memory budget (bench/ltm.sh runs each
 * measured phase in a memory cgroup after dropping the page cache).
 *
 *   bench_ltm load <embkv|rocksdb|lmdb> DIR --rows N
 *   bench_ltm run  <embkv|rocksdb|lmdb> DIR --rows N [--mode read|train]
 *                  [--batches B] [--warmup W] [--seconds S] [--warmup-seconds S]
 *                  [--perm-seed K] [--cache-mb M] [--lmdb-readahead] [--lookahead K] [--dram-mb M]
 *
 * Ids are 0..N-1.  Batches of 512 ids are drawn Zipf(0.99) over the ranks;
 * rank r maps to id perm(r - 1), a fixed pseudo-random permutation of
 * [0, N) (a Feistel network with cycle walking, keyed by --perm-seed), so
 * hot ids are spread over the files.
 *
 * read:  one batch get per batch (embkv_get_batch, RocksDB MultiGet, one
 *        LMDB read transaction of mdb_get's), duplicates included.
 * train: pull + Adagrad + push.  embkv: embkv_pull then embkv_push with the
 *        store's adagrad (the update happens in the store).  Baselines: the
 *        batch's distinct ids are read (MultiGet / a read transaction), the
 *        gradients of duplicates summed, state += g*g,
 *        v -= lr * g / (sqrt(state) + eps), and the rows written back (one
 *        WriteBatch / one write transaction).  Gradients are small random
 *        numbers, the same for every engine.
 *
 * Durability during the measured batches: none of the engines syncs.
 * embkv does not call embkv_sync (unless its pool fills: then it syncs to
 * free the replaced records, and says how often); RocksDB writes with the
 * WAL disabled; LMDB runs with MDB_NOSYNC.
 *
 * After a warm-up the measured batches report rows/s (batch ids, duplicates
 * counted), this process's storage read bytes per row (/proc/self/io), and
 * from /proc/diskstats of the device holding DIR (device-wide: other I/O on
 * the device counts too) the reads completed per row and the mean queue
 * depth (weighted time in queue / elapsed; rd_qdepth: read time / elapsed).
 * The last line is machine-readable: RESULT engine=... advice=... mode=...
 */
#include <fcntl.h>
#include <lmdb.h>
#include <rocksdb/c.h>
#include <sys/sysmacros.h>

#include "bench_common.h"
#include "embkv.h"

#define DIM 64
#define BATCH 512
#define ZIPF_S 0.99
#define LR 0.01f
#define EPS 1e-10f
#define GRAD_SCALE 0.01f
#define GRAD_BATCHES 16  /* gradient batches generated once and cycled */
#define LOAD_CHUNK 4096

enum { E_EMBKV, E_ROCKSDB, E_LMDB };
static const char *engine_names[] = {"embkv", "rocksdb", "lmdb"};

/* Row layout of the baselines' values: vector, then state. */
#define VAL_FLOATS (2 * DIM)
#define VAL_BYTES (VAL_FLOATS * sizeof(float))

/* ------------------------------------------------------------ options */

typedef struct opts {
    int engine;
    const char *dir;
    size_t rows;
    int train;
    size_t batches, warmup;
    double seconds, warmup_seconds;
    uint64_t perm_seed;
    size_t cache_mb;
    int lmdb_readahead;
    size_t pool_mb;      /* load embkv with an SSD tier: the pool (PM tier) this big */
    uint32_t dtype;      /* load embkv: the rows' element type (0: f32) */
    size_t lookahead;    /* run embkv with embkv_lookahead this many batches ahead */
    size_t dram_mb;      /* run embkv with a DRAM cache (cache_size) this big */
} opts;

/* ---------------------------------------------------- id permutation */

typedef struct perm {
    uint64_t n, mask;
    int half;
    uint64_t keys[4];
} perm;

static void perm_init(perm *p, uint64_t n, uint64_t seed)
{
    int bits = 2;
    while (bits < 64 && (1ull << bits) < n) bits++;
    if (bits & 1) bits++;
    p->n = n;
    p->half = bits / 2;
    p->mask = (1ull << p->half) - 1;
    uint64_t x = seed ^ 0x5045524D55544531ull;
    for (int i = 0; i < 4; i++) p->keys[i] = splitmix64(&x);
}

static uint64_t perm_round(uint64_t r, uint64_t k)
{
    uint64_t z = (r ^ k) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 31)) * 0xBF58476D1CE4E5B9ull;
    return z ^ (z >> 29);
}

/* A bijection of [0, n): a balanced Feistel network over the smallest even
 * power of two >= n, applied again while the result is >= n. */
static uint64_t perm_apply(const perm *p, uint64_t x)
{
    do {
        uint64_t l = x >> p->half, r = x & p->mask;
        for (int i = 0; i < 4; i++) {
            uint64_t t = l ^ (perm_round(r, p->keys[i]) & p->mask);
            l = r;
            r = t;
        }
        x = (l << p->half) | r;
    } while (x >= p->n);
    return x;
}

/* ------------------------------------------------------------ the data */

/* Row values: a stream seeded once and read in id order (every engine loads
 * ids 0..N-1 in order, so every engine holds the same vectors); state 0. */
static void gen_rows(rng *r, size_t n, float *vals, size_t stride)
{
    for (size_t i = 0; i < n; i++) {
        float *v = vals + i * stride;
        for (size_t j = 0; j < DIM; j++) v[j] = rng_float(r);
        for (size_t j = DIM; j < stride; j++) v[j] = 0.0f;
    }
}

static void key_encode(char k[8], uint64_t id)
{
    for (int i = 0; i < 8; i++) k[i] = (char)(id >> (56 - 8 * i));
}

/* ------------------------------------------------ /proc measurements */

typedef struct iosnap {
    double t;
    uint64_t rbytes, wbytes;            /* /proc/self/io */
    uint64_t reads, rsectors, rd_ms, writes, wsectors, weighted_ms; /* /proc/diskstats */
    uint64_t cg_reads, cg_rbytes;       /* blkio cgroup (v1), this device */
    uint64_t blkio_ticks;               /* /proc/self/stat: delay waiting for block I/O */
    int have_disk, have_cg;
} iosnap;

static unsigned disk_major, disk_minor;
static int disk_known;
static char disk_name[64];

static void disk_find(const char *dir)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) die("stat %s: %s", dir, strerror(errno));
    disk_major = major(sb.st_dev);
    disk_minor = minor(sb.st_dev);
    FILE *f = fopen("/proc/diskstats", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned ma, mi;
        char name[64];
        if (sscanf(line, "%u %u %63s", &ma, &mi, name) == 3 && ma == disk_major && mi == disk_minor) {
            disk_known = 1;
            snprintf(disk_name, sizeof disk_name, "%s", name);
        }
    }
    fclose(f);
}

static char blkio_dir[4096];

/* The v1 blkio cgroup of this process, when it is not the root: its
 * throttle counters count the bios this cgroup issued (bench/ltm.sh gives
 * it a limit no run reaches, without which the kernel does not count). */
static void blkio_find(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (c2 && !strncmp(c1 + 1, "blkio:", 6) && strcmp(c2 + 1, "/"))
            snprintf(blkio_dir, sizeof blkio_dir, "/sys/fs/cgroup/blkio%.4000s", c2 + 1);
    }
    fclose(f);
}

static int blkio_read(const char *file, uint64_t *v)
{
    char path[4200], line[256];
    snprintf(path, sizeof path, "%s/%s", blkio_dir, file);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int ok = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned ma, mi;
        unsigned long long n;
        if (sscanf(line, "%u:%u Read %llu", &ma, &mi, &n) == 3 && ma == disk_major && mi == disk_minor) {
            *v = n;
            ok = 1;
        }
    }
    fclose(f);
    return ok;
}

static void io_snap(iosnap *s)
{
    memset(s, 0, sizeof *s);
    s->t = now_s();
    FILE *f = fopen("/proc/self/io", "r");
    if (f) {
        char line[256];
        unsigned long long v;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "read_bytes: %llu", &v) == 1) s->rbytes = v;
            else if (sscanf(line, "write_bytes: %llu", &v) == 1) s->wbytes = v;
        }
        fclose(f);
    }
    f = fopen("/proc/self/stat", "r");
    if (f) {
        char buf[2048];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        char *p = strrchr(buf, ')');  /* the fields after the command name */
        for (int field = 2; p && field < 42; field++) p = strchr(p + 1, ' ');
        if (p) s->blkio_ticks = strtoull(p + 1, NULL, 10);
    }
    if (blkio_dir[0])
        s->have_cg = blkio_read("blkio.throttle.io_serviced", &s->cg_reads) &&
                     blkio_read("blkio.throttle.io_service_bytes", &s->cg_rbytes);
    if (!disk_known) return;
    f = fopen("/proc/diskstats", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        unsigned ma, mi;
        char name[64];
        unsigned long long r, rm, rs, rt, w, wm, ws, wt, inflight, iot, wio;
        if (sscanf(line, "%u %u %63s %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &ma, &mi, name, &r,
                   &rm, &rs, &rt, &w, &wm, &ws, &wt, &inflight, &iot, &wio) == 14 &&
            ma == disk_major && mi == disk_minor) {
            s->reads = r; s->rsectors = rs; s->rd_ms = rt;
            s->writes = w; s->wsectors = ws; s->weighted_ms = wio;
            s->have_disk = 1;
        }
    }
    fclose(f);
}

/* ------------------------------------------------------------- engines */

typedef struct eng {
    int kind;
    /* embkv */
    embkv_store *s;
    embkv_session *ss;
    uint64_t forced_syncs;
    /* rocksdb */
    rocksdb_t *db;
    rocksdb_options_t *ropt;
    rocksdb_block_based_table_options_t *bbto;
    rocksdb_cache_t *cache;
    rocksdb_filterpolicy_t *filter;  /* owned by bbto once set */
    rocksdb_readoptions_t *rdo;
    rocksdb_writeoptions_t *wro;
    rocksdb_column_family_handle_t *cf;
    rocksdb_writebatch_t *wb;
    /* lmdb */
    MDB_env *env;
    MDB_dbi dbi;
    MDB_txn *rtxn;
    /* scratch for the baselines */
    char keys[BATCH][8];
    const char *keyp[BATCH];
    size_t keylen[BATCH];
    rocksdb_pinnableslice_t *vals[BATCH];
    char *errs[BATCH];
} eng;

static void ek(int rc, const char *what)
{
    if (rc != EMBKV_OK) die("%s: rc %d: %s", what, rc, embkv_errmsg());
}

static void rk(char *err, const char *what)
{
    if (err) die("%s: %s", what, err);
}

static void mk(int rc, const char *what)
{
    if (rc != MDB_SUCCESS) die("%s: %s", what, mdb_strerror(rc));
}

static uint32_t adagrad_state_floats(void)
{
    embkv_train_options o;
    embkv_train_defaults(&o);
    o.optimizer = EMBKV_ADAGRAD;
    return embkv_train_state_floats(&o, DIM);
}

static uint64_t lmdb_map_size(size_t rows)
{
    /* ~4.7 KB per 7 rows in full leaf pages; twice that for copy-on-write
     * and half-full pages, plus 1 GiB. */
    return (uint64_t)rows * 2 * (VAL_BYTES + 64) + (1ull << 30);
}

static void rocks_options(eng *e, size_t cache_mb)
{
    e->ropt = rocksdb_options_create();
    rocksdb_options_set_compression(e->ropt, rocksdb_no_compression);
    rocksdb_options_set_max_background_jobs(e->ropt, 2);
    e->bbto = rocksdb_block_based_options_create();
    rocksdb_block_based_options_set_block_size(e->bbto, 4096);
    e->filter = rocksdb_filterpolicy_create_bloom_full(10);
    rocksdb_block_based_options_set_filter_policy(e->bbto, e->filter);
    if (cache_mb) {
        e->cache = rocksdb_cache_create_lru(cache_mb << 20);
        rocksdb_block_based_options_set_block_cache(e->bbto, e->cache);
    }
    rocksdb_options_set_block_based_table_factory(e->ropt, e->bbto);
}

static void rocks_free_options(eng *e)
{
    rocksdb_block_based_options_destroy(e->bbto);
    if (e->cache) rocksdb_cache_destroy(e->cache);
    rocksdb_options_destroy(e->ropt);
}

/* ---------------------------------------------------------------- load */

typedef struct load_ctx {
    const float *vals;  /* LOAD_CHUNK rows of DIM floats */
} load_ctx;

static int load_fn(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    (void)id; (void)state;  /* a new row's state starts as zeros */
    const load_ctx *c = ctx;
    memcpy(vec, c->vals + i * DIM, DIM * sizeof *vec);
    return 0;
}

static void load_embkv(const char *dir, size_t rows, size_t pool_mb, uint32_t dtype)
{
    char path[4096];
    uint32_t sf = adagrad_state_floats();

    /* Record size from a small store made for the purpose. */
    snprintf(path, sizeof path, "%s/probe", dir);
    embkv_store *s;
    embkv_options po = {.dim = DIM, .state_floats = sf, .expected_rows = 1000, .dtype = dtype};
    ek(embkv_open(path, &po, EMBKV_OPEN_CREATE, &s), "embkv_open (probe store)");
    embkv_stats st;
    ek(embkv_stats_get(s, &st), "embkv_stats_get");
    uint64_t rec = st.record_bytes;
    ek(embkv_close(s), "embkv_close");
    ek(embkv_destroy(path), "embkv_destroy");

    /* As bench/run.sh: records x 2.5 for copy-on-write versions and slab
     * slack, 64 B/row for the index, 64 MiB. */
    uint64_t pool = (uint64_t)rows * rec * 5 / 2 + (uint64_t)rows * 64 + (64ull << 20);
    /* With --pool-mb: that pool, the rest in the SSD tier's log (room for
     * the rows three times over: garbage waits for compaction). */
    uint64_t ssd = pool_mb ? (uint64_t)rows * rec * 3 + (1ull << 30) : 0;
    if (pool_mb)
        pool = (uint64_t)pool_mb << 20;
    printf("embkv: record %" PRIu64 " bytes, pool %" PRIu64 " MiB, SSD tier %" PRIu64 " MiB\n", rec, pool >> 20,
           ssd >> 20);
    snprintf(path, sizeof path, "%s/store", dir);
    embkv_options o = {.dim = DIM, .state_floats = sf, .expected_rows = rows, .pool_size = pool, .ssd_size = ssd,
                       .dtype = dtype};
    double t0 = now_s();
    ek(embkv_open(path, &o, EMBKV_OPEN_CREATE, &s), "embkv_open (create)");
    printf("embkv: created in %.1f s\n", now_s() - t0);

    rng r;
    rng_seed(&r, BENCH_SEED);
    float *vals = xalloc64(LOAD_CHUNK * DIM * sizeof *vals);
    int64_t *ids = xmalloc(LOAD_CHUNK * sizeof *ids);
    load_ctx c = {.vals = vals};
    t0 = now_s();
    for (size_t base = 0; base < rows; base += LOAD_CHUNK) {
        size_t n = rows - base < LOAD_CHUNK ? rows - base : LOAD_CHUNK;
        gen_rows(&r, n, vals, DIM);
        for (size_t i = 0; i < n; i++) ids[i] = (int64_t)(base + i);
        size_t upd = 0;
        ek(embkv_update_batch(s, ids, n, load_fn, &c, EMBKV_UPDATE_CREATE, &upd), "embkv_update_batch");
        if (upd != n) die("embkv_update_batch wrote %zu of %zu rows", upd, n);
    }
    double t1 = now_s();
    ek(embkv_sync(s), "embkv_sync");
    double t2 = now_s();
    ek(embkv_stats_get(s, &st), "embkv_stats_get");
    if (st.rows != rows) die("embkv: %" PRIu64 " rows after the load, expected %zu", st.rows, rows);
    printf("embkv: %zu rows in %.1f s (%.0f rows/s), sync %.1f s; pool used %" PRIu64 " of %" PRIu64
           " MiB, %" PRIu64 " buckets of %u bytes (index %.0f MiB), load factor %.2f\n",
           rows, t1 - t0, (double)rows / (t1 - t0), t2 - t1, st.pool_used_bytes >> 20, st.pool_bytes >> 20,
           st.buckets, st.bucket_bytes, (double)st.buckets * st.bucket_bytes / 1048576.0, st.load_factor);
    ek(embkv_close(s), "embkv_close");
    free(vals);
    free(ids);
}

static void load_rocksdb(const char *dir, size_t rows)
{
    char path[4096], sst[4096];
    eng e = {0};
    rocks_options(&e, 0);
    rocksdb_options_set_create_if_missing(e.ropt, 1);
    rocksdb_envoptions_t *envo = rocksdb_envoptions_create();
    const size_t per_file = 500000;  /* ~260 MB files */
    size_t nfiles = (rows + per_file - 1) / per_file;
    char **files = xmalloc(nfiles * sizeof *files);
    rng r;
    rng_seed(&r, BENCH_SEED);
    float *vals = xalloc64(LOAD_CHUNK * VAL_BYTES);
    char *err = NULL;
    double t0 = now_s();
    size_t id = 0;
    for (size_t f = 0; f < nfiles; f++) {
        snprintf(sst, sizeof sst, "%s/load-%05zu.sst", dir, f);
        files[f] = strdup(sst);
        if (!files[f]) die("out of memory");
        rocksdb_sstfilewriter_t *w = rocksdb_sstfilewriter_create(envo, e.ropt);
        rocksdb_sstfilewriter_open(w, sst, &err);
        rk(err, "rocksdb_sstfilewriter_open");
        size_t end = (f + 1) * per_file < rows ? (f + 1) * per_file : rows;
        while (id < end) {
            size_t n = end - id < LOAD_CHUNK ? end - id : LOAD_CHUNK;
            gen_rows(&r, n, vals, VAL_FLOATS);
            for (size_t i = 0; i < n; i++) {
                char k[8];
                key_encode(k, id + i);
                rocksdb_sstfilewriter_put(w, k, 8, (const char *)(vals + i * VAL_FLOATS), VAL_BYTES, &err);
                rk(err, "rocksdb_sstfilewriter_put");
            }
            id += n;
        }
        rocksdb_sstfilewriter_finish(w, &err);
        rk(err, "rocksdb_sstfilewriter_finish");
        rocksdb_sstfilewriter_destroy(w);
    }
    double t1 = now_s();
    snprintf(path, sizeof path, "%s/db", dir);
    rocksdb_t *db = rocksdb_open(e.ropt, path, &err);
    rk(err, "rocksdb_open");
    rocksdb_ingestexternalfileoptions_t *io = rocksdb_ingestexternalfileoptions_create();
    rocksdb_ingestexternalfileoptions_set_move_files(io, 1);
    rocksdb_ingest_external_file(db, (const char *const *)files, nfiles, io, &err);
    rk(err, "rocksdb_ingest_external_file");
    rocksdb_ingestexternalfileoptions_destroy(io);
    rocksdb_close(db);
    for (size_t f = 0; f < nfiles; f++) {
        if (unlink(files[f]) != 0 && errno != ENOENT) die("unlink %s: %s", files[f], strerror(errno));
        free(files[f]);
    }
    free(files);
    sync();
    printf("rocksdb: %zu rows in %zu SST files in %.1f s, ingested and synced in %.1f s\n", rows, nfiles,
           t1 - t0, now_s() - t1);
    rocksdb_envoptions_destroy(envo);
    rocks_free_options(&e);
    free(vals);
}

static void load_lmdb(const char *dir, size_t rows)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/lmdb", dir);
    if (mkdir(path, 0755) != 0) die("mkdir %s: %s", path, strerror(errno));
    MDB_env *env;
    mk(mdb_env_create(&env), "mdb_env_create");
    mk(mdb_env_set_mapsize(env, lmdb_map_size(rows)), "mdb_env_set_mapsize");
    mk(mdb_env_open(env, path, MDB_NOSYNC, 0644), "mdb_env_open");
    MDB_txn *txn;
    MDB_dbi dbi;
    mk(mdb_txn_begin(env, NULL, 0, &txn), "mdb_txn_begin");
    mk(mdb_dbi_open(txn, NULL, 0, &dbi), "mdb_dbi_open");
    mk(mdb_txn_commit(txn), "mdb_txn_commit");
    rng r;
    rng_seed(&r, BENCH_SEED);
    float *vals = xalloc64(LOAD_CHUNK * VAL_BYTES);
    double t0 = now_s();
    for (size_t base = 0; base < rows;) {
        mk(mdb_txn_begin(env, NULL, 0, &txn), "mdb_txn_begin");
        for (int c = 0; c < 32 && base < rows; c++) {
            size_t n = rows - base < LOAD_CHUNK ? rows - base : LOAD_CHUNK;
            gen_rows(&r, n, vals, VAL_FLOATS);
            for (size_t i = 0; i < n; i++) {
                char k[8];
                key_encode(k, base + i);
                MDB_val key = {8, k}, val = {VAL_BYTES, vals + i * VAL_FLOATS};
                mk(mdb_put(txn, dbi, &key, &val, MDB_APPEND), "mdb_put");
            }
            base += n;
        }
        mk(mdb_txn_commit(txn), "mdb_txn_commit");
    }
    double t1 = now_s();
    mk(mdb_env_sync(env, 1), "mdb_env_sync");
    MDB_stat ms;
    mk(mdb_env_stat(env, &ms), "mdb_env_stat");
    printf("lmdb: %zu rows in %.1f s, sync %.1f s; depth %u, %zu branch, %zu leaf, %zu overflow pages\n", rows,
           t1 - t0, now_s() - t1, ms.ms_depth, ms.ms_branch_pages, ms.ms_leaf_pages, ms.ms_overflow_pages);
    mdb_env_close(env);
    free(vals);
}

static void write_meta(const char *dir, int engine, size_t rows)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/ltm.meta", dir);
    FILE *f = fopen(path, "w");
    if (!f) die("%s: %s", path, strerror(errno));
    fprintf(f, "engine=%s rows=%zu dim=%d complete=1\n", engine_names[engine], rows, DIM);
    if (fflush(f) != 0 || fsync(fileno(f)) != 0 || fclose(f) != 0) die("%s: %s", path, strerror(errno));
}

/* ------------------------------------------------------------ run: open */

static void open_engine(eng *e, const opts *o)
{
    char path[4096];
    e->kind = o->engine;
    if (o->engine == E_EMBKV) {
        snprintf(path, sizeof path, "%s/store", o->dir);
        embkv_options eo = {.dim = DIM, .state_floats = adagrad_state_floats(), .expected_rows = o->rows,
                            .cache_size = (uint64_t)o->dram_mb << 20};
        ek(embkv_open(path, &eo, 0, &e->s), "embkv_open");
        if (o->train) {
            embkv_train_options to;
            embkv_train_defaults(&to);
            to.optimizer = EMBKV_ADAGRAD;
            to.lr = LR;
            to.eps = EPS;
            to.initial_accumulator = 0;
            ek(embkv_train_configure(e->s, &to), "embkv_train_configure");
            ek(embkv_session_open(e->s, &e->ss), "embkv_session_open");
        }
    } else if (o->engine == E_ROCKSDB) {
        rocks_options(e, o->cache_mb);
        snprintf(path, sizeof path, "%s/db", o->dir);
        const char *cfn[1] = {"default"};
        const rocksdb_options_t *cfo[1] = {e->ropt};
        char *err = NULL;
        e->db = rocksdb_open_column_families(e->ropt, path, 1, cfn, cfo, &e->cf, &err);
        rk(err, "rocksdb_open_column_families");
        e->rdo = rocksdb_readoptions_create();
        e->wro = rocksdb_writeoptions_create();
        rocksdb_writeoptions_disable_WAL(e->wro, 1);
        e->wb = rocksdb_writebatch_create();
        for (int i = 0; i < BATCH; i++) { e->keyp[i] = e->keys[i]; e->keylen[i] = 8; }
    } else {
        snprintf(path, sizeof path, "%s/lmdb", o->dir);
        mk(mdb_env_create(&e->env), "mdb_env_create");
        mk(mdb_env_set_mapsize(e->env, lmdb_map_size(o->rows)), "mdb_env_set_mapsize");
        unsigned flags = MDB_NOSYNC | (o->lmdb_readahead ? 0 : MDB_NORDAHEAD);
        mk(mdb_env_open(e->env, path, flags, 0644), "mdb_env_open");
        MDB_txn *txn;
        mk(mdb_txn_begin(e->env, NULL, 0, &txn), "mdb_txn_begin");
        mk(mdb_dbi_open(txn, NULL, 0, &e->dbi), "mdb_dbi_open");
        mk(mdb_txn_commit(txn), "mdb_txn_commit");
        mk(mdb_txn_begin(e->env, NULL, MDB_RDONLY, &e->rtxn), "mdb_txn_begin (read)");
        mdb_txn_reset(e->rtxn);
    }
}

static void close_engine(eng *e)
{
    if (e->kind == E_EMBKV) {
        if (e->ss) embkv_session_close(e->ss);
        ek(embkv_close(e->s), "embkv_close");
    } else if (e->kind == E_ROCKSDB) {
        char *err = NULL;
        rocksdb_flushoptions_t *fo = rocksdb_flushoptions_create();
        rocksdb_flushoptions_set_wait(fo, 1);
        rocksdb_flush(e->db, fo, &err);  /* the WAL is off: keep the trained rows */
        rk(err, "rocksdb_flush");
        rocksdb_flushoptions_destroy(fo);
        rocksdb_writebatch_destroy(e->wb);
        rocksdb_readoptions_destroy(e->rdo);
        rocksdb_writeoptions_destroy(e->wro);
        rocksdb_column_family_handle_destroy(e->cf);
        rocksdb_close(e->db);
        rocks_free_options(e);
    } else {
        mdb_txn_abort(e->rtxn);
        mdb_env_close(e->env);
    }
}

/* ------------------------------------------------ run: batch operations */

/* Reads the n ids' values (vector + state, VAL_FLOATS each) into vals,
 * with a vector-only stride when vec_only. */
static void base_get(eng *e, const int64_t *ids, size_t n, float *out, int vec_only)
{
    size_t stride = vec_only ? DIM : VAL_FLOATS, bytes = vec_only ? DIM * sizeof(float) : VAL_BYTES;
    if (e->kind == E_ROCKSDB) {
        for (size_t i = 0; i < n; i++) key_encode(e->keys[i], (uint64_t)ids[i]);
        rocksdb_batched_multi_get_cf(e->db, e->rdo, e->cf, n, e->keyp, e->keylen, e->vals, e->errs, 0);
        for (size_t i = 0; i < n; i++) {
            if (e->errs[i]) die("rocksdb multiget of id %" PRId64 ": %s", ids[i], e->errs[i]);
            if (!e->vals[i]) die("rocksdb: id %" PRId64 " not found", ids[i]);
            size_t len;
            const char *v = rocksdb_pinnableslice_value(e->vals[i], &len);
            if (len != VAL_BYTES) die("rocksdb: id %" PRId64 ": value of %zu bytes", ids[i], len);
            memcpy(out + i * stride, v, bytes);
            rocksdb_pinnableslice_destroy(e->vals[i]);
        }
    } else {
        mk(mdb_txn_renew(e->rtxn), "mdb_txn_renew");
        for (size_t i = 0; i < n; i++) {
            char k[8];
            key_encode(k, (uint64_t)ids[i]);
            MDB_val key = {8, k}, val;
            int rc = mdb_get(e->rtxn, e->dbi, &key, &val);
            if (rc == MDB_NOTFOUND) die("lmdb: id %" PRId64 " not found", ids[i]);
            mk(rc, "mdb_get");
            if (val.mv_size != VAL_BYTES) die("lmdb: id %" PRId64 ": value of %zu bytes", ids[i], val.mv_size);
            memcpy(out + i * stride, val.mv_data, bytes);
        }
        mdb_txn_reset(e->rtxn);
    }
}

static void base_put(eng *e, const int64_t *ids, size_t n, const float *vals)
{
    if (e->kind == E_ROCKSDB) {
        rocksdb_writebatch_clear(e->wb);
        for (size_t i = 0; i < n; i++) {
            char k[8];
            key_encode(k, (uint64_t)ids[i]);
            rocksdb_writebatch_put(e->wb, k, 8, (const char *)(vals + i * VAL_FLOATS), VAL_BYTES);
        }
        char *err = NULL;
        rocksdb_write(e->db, e->wro, e->wb, &err);
        rk(err, "rocksdb_write");
    } else {
        MDB_txn *txn;
        mk(mdb_txn_begin(e->env, NULL, 0, &txn), "mdb_txn_begin (write)");
        for (size_t i = 0; i < n; i++) {
            char k[8];
            key_encode(k, (uint64_t)ids[i]);
            MDB_val key = {8, k}, val = {VAL_BYTES, (void *)(vals + i * VAL_FLOATS)};
            mk(mdb_put(txn, e->dbi, &key, &val, 0), "mdb_put");
        }
        mk(mdb_txn_commit(txn), "mdb_txn_commit");
    }
}

/* Per-batch scratch of the baselines' training step. */
typedef struct trainbuf {
    int64_t dids[BATCH];      /* distinct ids */
    float g[BATCH * DIM];     /* their summed gradients */
    float *vals;              /* their values */
    int64_t tab_id[2048];
    int32_t tab_ix[2048];
} trainbuf;

static size_t dedup_sum(trainbuf *t, const int64_t *ids, size_t n, const float *grads)
{
    size_t nd = 0;
    for (size_t i = 0; i < 2048; i++) t->tab_ix[i] = -1;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = ((uint64_t)ids[i] * 0x9E3779B97F4A7C15ull) >> 53;
        while (t->tab_ix[h] >= 0 && t->tab_id[h] != ids[i]) h = (h + 1) & 2047;
        float *g;
        if (t->tab_ix[h] < 0) {
            t->tab_id[h] = ids[i];
            t->tab_ix[h] = (int32_t)nd;
            t->dids[nd] = ids[i];
            g = t->g + nd * DIM;
            memset(g, 0, DIM * sizeof *g);
            nd++;
        } else {
            g = t->g + (size_t)t->tab_ix[h] * DIM;
        }
        for (size_t j = 0; j < DIM; j++) g[j] += grads[i * DIM + j];
    }
    return nd;
}

static void adagrad(float *vals, const float *g, size_t nd)
{
    for (size_t i = 0; i < nd; i++) {
        float *v = vals + i * VAL_FLOATS, *st = v + DIM;
        const float *gi = g + i * DIM;
        for (size_t j = 0; j < DIM; j++) {
            st[j] += gi[j] * gi[j];
            v[j] -= LR * gi[j] / (sqrtf(st[j]) + EPS);
        }
    }
}

typedef struct runbuf {
    float *out;       /* BATCH * DIM */
    trainbuf *tb;
    uint64_t rows_written;
} runbuf;

static void do_batch(eng *e, const opts *o, runbuf *rb, const int64_t *ids, const float *grads)
{
    if (e->kind == E_EMBKV) {
        if (!o->train) {
            size_t missing = 0;
            ek(embkv_get_batch(e->s, ids, BATCH, rb->out, NULL, &missing), "embkv_get_batch");
            if (missing) die("embkv_get_batch: %zu ids missing", missing);
            return;
        }
        ek(embkv_pull(e->ss, ids, BATCH, rb->out), "embkv_pull");
        size_t upd = 0;
        int rc = embkv_push(e->ss, ids, BATCH, grads, 0, &upd);
        if (rc == EMBKV_FULL) {
            /* Replaced records are freed at the next sync: sync, then push
             * again (a failed push changes nothing and keeps the permits). */
            e->forced_syncs++;
            ek(embkv_sync(e->s), "embkv_sync");
            rc = embkv_push(e->ss, ids, BATCH, grads, 0, &upd);
        }
        ek(rc, "embkv_push");
        rb->rows_written += upd;
        return;
    }
    if (!o->train) {
        base_get(e, ids, BATCH, rb->out, 1);
        return;
    }
    trainbuf *t = rb->tb;
    size_t nd = dedup_sum(t, ids, BATCH, grads);
    base_get(e, t->dids, nd, t->vals, 0);
    adagrad(t->vals, t->g, nd);
    base_put(e, t->dids, nd, t->vals);
    rb->rows_written += nd;
}

/* ------------------------------------------------------------------ run */

/* Batches are drawn CHUNK_BATCHES at a time, outside the timed sections. */
#define CHUNK_BATCHES 256

typedef struct batchsrc {
    rng r;
    zipf z;
    perm p;
    int64_t *ids;   /* CHUNK_BATCHES * BATCH */
    size_t next;    /* next batch of the chunk */
} batchsrc;

static void batchsrc_init(batchsrc *s, const opts *o)
{
    rng_seed(&s->r, BENCH_SEED ^ (o->perm_seed * 0x9E3779B97F4A7C15ull));
    zipf_init(&s->z, o->rows, ZIPF_S);
    perm_init(&s->p, o->rows, o->perm_seed);
    s->ids = xalloc64(CHUNK_BATCHES * BATCH * sizeof *s->ids);
    s->next = CHUNK_BATCHES;
}

/* 1 when the next call of batchsrc_next would draw a new chunk. */
static int batchsrc_empty(const batchsrc *s) { return s->next == CHUNK_BATCHES; }

static const int64_t *batchsrc_next(batchsrc *s)
{
    if (s->next == CHUNK_BATCHES) {
        for (size_t i = 0; i < CHUNK_BATCHES * BATCH; i++)
            s->ids[i] = (int64_t)perm_apply(&s->p, zipf_next(&s->z, &s->r) - 1);
        s->next = 0;
    }
    return s->ids + BATCH * s->next++;
}

/* Batch i, with batch i + K drawn and looked ahead first (K = 0: the
 * plain draw).  Batches come in order: i is the previous call's i + 1. */
static const int64_t *next_batch(eng *e, batchsrc *src, int64_t *ring, size_t K, size_t *drawn, size_t i,
                                 uint64_t *queued)
{
    if (K == 0)
        return batchsrc_next(src);
    while (*drawn <= i + K) {
        int64_t *slot = ring + (*drawn % (K + 1)) * BATCH;
        memcpy(slot, batchsrc_next(src), BATCH * sizeof *slot);
        size_t q = 0;
        ek(embkv_lookahead(e->s, slot, BATCH, &q), "embkv_lookahead");
        *queued += q;
        (*drawn)++;
    }
    return ring + (i % (K + 1)) * BATCH;
}

static void run(const opts *o)
{
    disk_find(o->dir);
    blkio_find();
    batchsrc src;
    batchsrc_init(&src, o);
    float *grads = NULL;
    if (o->train) {
        rng r;
        rng_seed(&r, BENCH_SEED + 1);
        grads = xalloc64(GRAD_BATCHES * BATCH * DIM * sizeof *grads);
        for (size_t i = 0; i < GRAD_BATCHES * BATCH * DIM; i++) grads[i] = rng_float(&r) * GRAD_SCALE;
    }
    runbuf rb = {.out = xalloc64(BATCH * DIM * sizeof(float))};
    if (o->train && o->engine != E_EMBKV) {
        rb.tb = xalloc64(sizeof *rb.tb);
        rb.tb->vals = xalloc64(BATCH * VAL_BYTES);
    }

    const char *adv = getenv("EMBKV_POOL_ADVICE");
    char advice[64];
    eng *e = xalloc64(sizeof *e);
    memset(e, 0, sizeof *e);
    double t0 = now_s();
    open_engine(e, o);
    double open_s = now_s() - t0;
    if (o->engine == E_EMBKV) {
        embkv_stats st;
        ek(embkv_stats_get(e->s, &st), "embkv_stats_get");
        if (st.rows != o->rows) die("embkv: the store holds %" PRIu64 " rows, not %zu", st.rows, o->rows);
        snprintf(advice, sizeof advice, "%s", st.pool_advice_random ? "random" : "normal");
        printf("embkv: pool %" PRIu64 " MiB (%" PRIu64 " MiB used), record %" PRIu64
               " bytes, index %.0f MiB, advice %s (EMBKV_POOL_ADVICE=%s), opened in %.1f s\n",
               st.pool_bytes >> 20, st.pool_used_bytes >> 20, st.record_bytes,
               (double)st.buckets * st.bucket_bytes / 1048576.0, advice, adv ? adv : "unset", open_s);
    } else if (o->engine == E_ROCKSDB) {
        snprintf(advice, sizeof advice, "cache%zuM", o->cache_mb);
        printf("rocksdb: block cache %zu MiB, no compression, bloom 10 bits/key, 4 KiB blocks, "
               "buffered reads, WAL off; opened in %.1f s\n", o->cache_mb, open_s);
    } else {
        snprintf(advice, sizeof advice, "%s", o->lmdb_readahead ? "normal" : "random");
        printf("lmdb: MDB_NOSYNC%s; opened in %.1f s\n", o->lmdb_readahead ? "" : " | MDB_NORDAHEAD", open_s);
    }
    printf("disk: %s (%u:%u)\n", disk_known ? disk_name : "not found in /proc/diskstats", disk_major, disk_minor);
    fflush(stdout);

    /* With look-ahead K, batch i + K is drawn (and handed to
     * embkv_lookahead) before batch i runs: a ring of K + 1 batches. */
    size_t K = o->engine == E_EMBKV ? o->lookahead : 0, drawn = 0;
    int64_t *ring = xalloc64((K + 1) * BATCH * sizeof *ring);
    uint64_t queued = 0;
#define NEXT_BATCH(i) next_batch(e, &src, ring, K, &drawn, (i), &queued)

    /* Warm-up, then the measured batches.  Time spent drawing batches is
     * left out of the engine's time. */
    size_t b = 0, warm = 0;
    double tw = now_s();
    for (; warm < o->warmup && now_s() - tw < o->warmup_seconds; b++, warm++)
        do_batch(e, o, &rb, NEXT_BATCH(b), grads ? grads + (b % GRAD_BATCHES) * BATCH * DIM : NULL);
    double warm_s = now_s() - tw;
    printf("warm-up: %zu batches in %.1f s (%.0f rows/s)\n", warm, warm_s, (double)(warm * BATCH) / warm_s);
    fflush(stdout);
    uint64_t written0 = rb.rows_written, syncs0 = e->forced_syncs;
    embkv_stats s0, s1;
    if (o->engine == E_EMBKV)
        ek(embkv_stats_get(e->s, &s0), "embkv_stats_get");
    iosnap a, z;
    io_snap(&a);
    double next_report = a.t + 10, busy = 0, last_busy = 0, drawing = 0;
    size_t done = 0, last_done = 0;
    while (done < o->batches) {
        if (batchsrc_empty(&src)) {
            double t = now_s();
            (void)batchsrc_next(&src);
            src.next = 0;
            drawing += now_s() - t;
        }
        double t1 = now_s();
        do_batch(e, o, &rb, NEXT_BATCH(b), grads ? grads + (b % GRAD_BATCHES) * BATCH * DIM : NULL);
        double t2 = now_s();
        busy += t2 - t1;
        b++;
        done++;
        if (t2 >= next_report) {
            printf("  %5.0f s: %zu batches, last 10 s %.0f rows/s\n", t2 - a.t, done,
                   (double)((done - last_done) * BATCH) / (busy - last_busy));
            fflush(stdout);
            last_done = done;
            last_busy = busy;
            next_report = t2 + 10;
        }
        if (busy >= o->seconds) break;
    }
    io_snap(&z);
    double wall = z.t - a.t, secs = busy, rows = (double)(done * BATCH);
    double stall = 0;
    if (o->engine == E_EMBKV) {
        ek(embkv_stats_get(e->s, &s1), "embkv_stats_get");
        if (s1.ssd_size) {
            double wait_s = (s1.ssd_wait_ms - s0.ssd_wait_ms) / 1e3 +
                            (double)(s1.lookahead_wait_ns - s0.lookahead_wait_ns) / 1e9;
            stall = wait_s / secs;
            printf("SSD tier: %" PRIu64 " rows in the pool, %" PRIu64 " in the log; log reads %.3f/row at a mean "
                   "depth of %.1f per submission; pulls waited for the log %.1f%% of the time; look-ahead %zu "
                   "batches ahead: %" PRIu64 " rows queued, %" PRIu64 " hits, %" PRIu64 " late, %" PRIu64
                   " wasted; %" PRIu64 " demotions, %" PRIu64 " promotions, %" PRIu64
                   " compactions, write amplification %.2f\n",
                   s1.rows_pm, s1.rows_ssd, (double)(s1.ssd_reads - s0.ssd_reads) / rows, s1.ssd_mean_read_depth,
                   100 * stall, K, s1.lookahead_queued - s0.lookahead_queued, s1.lookahead_hits - s0.lookahead_hits,
                   s1.lookahead_late - s0.lookahead_late, s1.lookahead_wasted - s0.lookahead_wasted,
                   s1.demotions - s0.demotions, s1.promotions - s0.promotions, s1.compactions - s0.compactions,
                   s1.write_amplification);
            snprintf(advice, sizeof advice, "ssd-la%zu", K);
            if (s1.cache_capacity_rows) {
                uint64_t h = s1.cache_hits - s0.cache_hits, m = s1.cache_misses - s0.cache_misses;
                printf("DRAM cache: %zu MiB, %" PRIu64 " of %" PRIu64 " rows, hit rate %.1f%%, %" PRIu64
                       " dirty\n", o->dram_mb, s1.cache_rows, s1.cache_capacity_rows,
                       h + m ? 100.0 * (double)h / (double)(h + m) : 0.0, s1.cache_dirty);
                snprintf(advice, sizeof advice, "ssd-la%zu-dram%zu", K, o->dram_mb);
            }
        }
    }
    double dev_reads_row = z.have_disk ? (double)(z.reads - a.reads) / rows : NAN;
    double qd = z.have_disk ? (double)(z.weighted_ms - a.weighted_ms) / (wall * 1e3) : NAN;
    double rqd = z.have_disk ? (double)(z.rd_ms - a.rd_ms) / (wall * 1e3) : NAN;
    int cg = z.have_cg && a.have_cg && z.cg_reads > a.cg_reads;
    double reads_row = cg ? (double)(z.cg_reads - a.cg_reads) / rows : dev_reads_row;
    double cg_rbytes_row = cg ? (double)(z.cg_rbytes - a.cg_rbytes) / rows : NAN;
    double wbytes_row = (double)(z.wbytes - a.wbytes) / rows;
    double rbytes_row = (double)(z.rbytes - a.rbytes) / rows;
    long hz = sysconf(_SC_CLK_TCK);
    double iowait = (double)(z.blkio_ticks - a.blkio_ticks) / (double)(hz > 0 ? hz : 100) / wall;
    printf("measured: %zu batches (%.0f rows) in %.1f s: %.0f rows/s\n", done, rows, secs, rows / secs);
    printf("  per row: %.3f disk reads (%s), %.0f bytes read by this process, %.0f bytes written by it\n",
           reads_row, cg ? "this cgroup's" : "device-wide", rbytes_row, wbytes_row);
    printf("  device %s, all its users: %.3f reads/row, mean queue depth %.2f (reads %.2f); this process "
           "waited for block I/O %.2f of the time (delay accounting%s)",
           disk_known ? disk_name : "?", dev_reads_row, qd, rqd, iowait,
           z.blkio_ticks ? "" : " off: see kernel.task_delayacct");
    if (o->train)
        printf("; %.0f distinct rows updated per batch", (double)(rb.rows_written - written0) / (double)done);
    if (e->forced_syncs - syncs0)
        printf("; %" PRIu64 " syncs forced by a full pool", e->forced_syncs - syncs0);
    printf("\n");
    const char *dtype_of_run = e->kind == E_EMBKV ? embkv_dtype_name(embkv_dtype(e->s)) : "-";
    double tc = now_s();
    close_engine(e);
    printf("closed in %.1f s\n", now_s() - tc);
    printf("RESULT engine=%s dtype=%s advice=%s mode=%s rows=%zu batches=%zu secs=%.1f rows_per_s=%.0f reads_per_row=%.3f "
           "reads_src=%s read_bytes_per_row=%.0f cg_read_bytes_per_row=%.0f write_bytes_per_row=%.0f qdepth=%.2f "
           "rd_qdepth=%.2f dev_reads_per_row=%.3f proc_iowait=%.2f open_s=%.1f warm_batches=%zu "
           "warm_rows_per_s=%.0f stall=%.3f\n",
           engine_names[o->engine], dtype_of_run, advice, o->train ? "train" : "read", o->rows, done, secs, rows / secs,
           reads_row, cg ? "cgroup" : "device", rbytes_row, cg_rbytes_row, wbytes_row, qd, rqd, dev_reads_row,
           iowait, open_s, warm, (double)(warm * BATCH) / warm_s, stall);
    if (drawing > 0.05 * wall) printf("(drawing the batches took %.1f s of the %.1f s)\n", drawing, wall);
    if (rb.tb) { free(rb.tb->vals); free(rb.tb); }
    free(src.ids);
    free(ring);
    free(rb.out);
    free(grads);
    free(e);
}

/* ----------------------------------------------------------------- main */

static void usage(void)
{
    die("usage: bench_ltm load <embkv|rocksdb|lmdb> DIR --rows N\n"
        "       bench_ltm run <embkv|rocksdb|lmdb> DIR --rows N [--mode read|train] [--batches B] [--warmup W]\n"
        "                 [--seconds S] [--warmup-seconds S] [--perm-seed K] [--cache-mb M] [--lmdb-readahead]\n"
        "                 [--lookahead K] [--dram-mb M]\n"
        "       (load embkv --pool-mb M: a pool of M MiB and an SSD tier for the rest;\n"
        "        --dtype f32|f16|bf16|i8: the rows' element type)");
}

int main(int argc, char **argv)
{
    if (argc < 4) usage();
    int load = !strcmp(argv[1], "load");
    if (!load && strcmp(argv[1], "run")) usage();
    opts o = {.engine = -1, .dir = argv[3], .batches = 20000, .warmup = 2000, .seconds = 60,
              .warmup_seconds = 30, .perm_seed = 1, .cache_mb = 512};
    for (int i = 0; i < 3; i++)
        if (!strcmp(argv[2], engine_names[i])) o.engine = i;
    if (o.engine < 0) die("unknown engine '%s' (embkv, rocksdb or lmdb)", argv[2]);
    for (int i = 4; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--lmdb-readahead")) { o.lmdb_readahead = 1; continue; }
        if (i + 1 >= argc) die("%s needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--rows")) o.rows = parse_size(a, v);
        else if (!strcmp(a, "--batches")) o.batches = parse_size(a, v);
        else if (!strcmp(a, "--warmup")) o.warmup = parse_size(a, v);
        else if (!strcmp(a, "--seconds")) o.seconds = (double)parse_size(a, v);
        else if (!strcmp(a, "--warmup-seconds")) o.warmup_seconds = (double)parse_size(a, v);
        else if (!strcmp(a, "--perm-seed")) o.perm_seed = parse_size(a, v);
        else if (!strcmp(a, "--cache-mb")) o.cache_mb = parse_size(a, v);
        else if (!strcmp(a, "--pool-mb")) o.pool_mb = parse_size(a, v);
        else if (!strcmp(a, "--dtype")) {
            for (uint32_t d = EMBKV_F32; d <= EMBKV_I8; d++)
                if (!strcmp(v, embkv_dtype_name(d))) o.dtype = d;
            if (!o.dtype) die("--dtype: f32, f16, bf16 or i8, not '%s'", v);
        }
        else if (!strcmp(a, "--lookahead")) o.lookahead = parse_size(a, v);
        else if (!strcmp(a, "--dram-mb")) o.dram_mb = parse_size(a, v);
        else if (!strcmp(a, "--mode")) {
            if (!strcmp(v, "read")) o.train = 0;
            else if (!strcmp(v, "train")) o.train = 1;
            else die("--mode: read or train, not '%s'", v);
        } else die("unknown option %s", a);
    }
    if (o.lookahead > 64) die("--lookahead: at most 64 batches");
    if (o.rows < 1 || o.rows > UINT32_MAX) die("--rows must be in 1..%u", UINT32_MAX);
    if (o.batches < 1) die("--batches must be at least 1");
    if (o.engine == E_ROCKSDB && !load && o.cache_mb < 1) die("--cache-mb must be at least 1");
    setvbuf(stdout, NULL, _IOLBF, 0);

    if (load) {
        if (!dir_absent_or_empty(o.dir)) die("%s exists and is not empty", o.dir);
        if (mkdir(o.dir, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", o.dir, strerror(errno));
        double t0 = now_s();
        if (o.engine == E_EMBKV) load_embkv(o.dir, o.rows, o.pool_mb, o.dtype);
        else if (o.engine == E_ROCKSDB) load_rocksdb(o.dir, o.rows);
        else load_lmdb(o.dir, o.rows);
        write_meta(o.dir, o.engine, o.rows);
        printf("load %s: %zu rows in %.1f s\n", engine_names[o.engine], o.rows, now_s() - t0);
        return 0;
    }
    char meta[4096], want[256], line[256] = "";
    snprintf(meta, sizeof meta, "%s/ltm.meta", o.dir);
    FILE *f = fopen(meta, "r");
    if (!f || !fgets(line, sizeof line, f)) die("%s: no data loaded (run bench_ltm load first)", o.dir);
    fclose(f);
    snprintf(want, sizeof want, "engine=%s rows=%zu dim=%d complete=1\n", engine_names[o.engine], o.rows, DIM);
    if (strcmp(line, want)) die("%s holds other data: %s", o.dir, line);
    run(&o);
    return 0;
}
