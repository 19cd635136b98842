/*
 * test_concurrency_backup.c - online backup (embkv_backup_begin/step/finish):
 *  - a copy of a store whose rows live in all three tiers (DRAM cache, pool,
 *    SSD log) is exact: every row's vector, optimizer state and clock;
 *  - a backup taken while updates, inserts, deletes, syncs and hot-set moves
 *    run beside it, and the index grows under it, is one checkpoint: every
 *    batch update entirely or not at all (all batch rows at one clock), the
 *    inserts a prefix of their order, the deletes too, and not a row more;
 *  - bad targets are refused, naming them, and write nothing; a backup
 *    abandoned, or killed (SIGKILL) half-way, leaves no target, and the
 *    next backup to it removes what the killed one left.
 */
#include <stdbool.h>
#include <dirent.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

static double scale = 1.0;

static embkv_store *open_at(const char *dir, uint32_t dim, uint32_t sf, uint64_t rows, uint64_t pool, uint64_t ssd,
                            uint64_t cache, uint64_t migrate)
{
    embkv_options o;
    memset(&o, 0, sizeof o);
    o.dim = dim;
    o.state_floats = sf;
    o.expected_rows = rows;
    o.pool_size = pool;
    o.ssd_size = ssd;
    o.cache_size = cache;
    o.migrate_rate = migrate;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    return s;
}

static int run_backup(embkv_store *s, const char *dir, size_t step, embkv_backup_info *info)
{
    embkv_backup *b = NULL;
    int rc = embkv_backup_begin(s, dir, &b), done = 0;
    while (rc == EMBKV_OK && !done) rc = embkv_backup_step(b, step, &done);
    if (b) {
        int frc = embkv_backup_finish(b, info);
        if (rc == EMBKV_OK) rc = frc;
    }
    return rc;
}

/* Entries of dir's parent whose names start with prefix. */
static int count_prefixed(const char *parent, const char *prefix)
{
    DIR *d = opendir(parent);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    if (d) closedir(d);
    return n;
}

static bool exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* ------------------------------------------------------------ targets */

static void test_targets(void)
{
    char src[600], dir[700], file[800];
    snprintf(src, sizeof src, "%s", test_tmpdir("tsrc"));
    embkv_store *s = open_at(src, 4, 0, 1000, 0, 0, 0, 0);
    float v[4] = {1, 2, 3, 4};
    for (int64_t id = 0; id < 100; id++) CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    embkv_backup *b = (embkv_backup *)1;

    /* inside the store */
    snprintf(dir, sizeof dir, "%s/inner", src);
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_INVALID);
    CHECK(b == NULL);
    CHECK(strstr(embkv_errmsg(), "inside the store's own directory") != NULL);
    CHECK(!exists(dir));
    /* a file */
    snprintf(file, sizeof file, "%s", test_tmpdir("afile"));
    FILE *f = fopen(file, "w");
    CHECK(f && fputs("x", f) >= 0 && fclose(f) == 0);
    CHECK_RC(embkv_backup_begin(s, file, &b), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "exists and is not a directory") != NULL);
    /* a directory that is not empty */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("full"));
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(file, sizeof file, "%s/keep.txt", dir);
    f = fopen(file, "w");
    CHECK(f && fclose(f) == 0);
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "is not empty (it holds keep.txt)") != NULL);
    CHECK(exists(file));
    /* a parent that does not exist; the store itself; nothing at all */
    snprintf(dir, sizeof dir, "%s/no/such", test_tmpdir("x"));
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "the directory that would hold") != NULL);
    CHECK_RC(embkv_backup_begin(s, src, &b), EMBKV_INVALID);
    CHECK_RC(embkv_backup_begin(s, "", &b), EMBKV_INVALID);
    CHECK_RC(embkv_backup_begin(NULL, "x", &b), EMBKV_INVALID);
    CHECK_RC(embkv_backup_step(NULL, 0, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_backup_finish(NULL, NULL), EMBKV_INVALID);

    /* abandoned after one step: no target, no temporary directory */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("abandoned"));
    int done = 1;
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_OK);
    CHECK_RC(embkv_backup_step(b, 10, &done), EMBKV_OK);
    CHECK(done == 0);
    embkv_backup_info info = {.rows = 99};
    CHECK_RC(embkv_backup_finish(b, &info), EMBKV_BUSY);
    CHECK(strstr(embkv_errmsg(), "finished before its last step") != NULL);
    CHECK(info.rows == 0);
    CHECK(!exists(dir));
    CHECK(count_prefixed(test_tmpdir(""), "abandoned") == 0);

    /* into an empty directory that exists: fine, and a second time refused */
    CHECK(mkdir(dir, 0755) == 0);
    CHECK_RC(run_backup(s, dir, 0, &info), EMBKV_OK);
    CHECK(info.rows == 100);
    CHECK(info.bytes > 0);
    CHECK_RC(run_backup(s, dir, 0, &info), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "already holds an embkv store") != NULL);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------- the store closed, steps at once */

typedef struct { embkv_backup *b; int rc; } stepper;

static void *step_all(void *arg)
{
    stepper *st = arg;
    do st->rc = embkv_backup_step(st->b, 0, NULL);
    while (st->rc == EMBKV_BUSY);  /* the other side's small step held it */
    return NULL;
}

static void test_handles(void)
{
    char src[600], dir[800], other[700];
    snprintf(src, sizeof src, "%s", test_tmpdir("hsrc"));
    snprintf(other, sizeof other, "%s", test_tmpdir("hother"));
    embkv_store *s = open_at(src, 4, 0, 300000, 0, 0, 0, 0);
    embkv_store *o = open_at(other, 4, 0, 100, 0, 0, 0, 0);
    float v[4] = {1, 2, 3, 4};
    const int64_t n = 200000;
    for (int64_t id = 0; id < n; id++) CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_close(o), EMBKV_OK);
    embkv_backup *b = NULL;

    /* not inside another store either */
    snprintf(dir, sizeof dir, "%s/sub", other);
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "is inside the embkv store") != NULL);

    /* a second step while one runs: EMBKV_BUSY, and the copy is whole */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("hcopy1"));
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_OK);
    stepper st = {b, -1};
    pthread_t th;
    pthread_create(&th, NULL, step_all, &st);
    int busy = 0;
    for (int i = 0; i < 2000 && !busy; i++) {
        int rc = embkv_backup_step(b, 10, NULL);
        busy = rc == EMBKV_BUSY;
        if (!busy && rc != EMBKV_OK) break;
        usleep(50);
    }
    pthread_join(th, NULL);
    CHECK(busy);
    CHECK_RC(st.rc, EMBKV_OK);
    int done = 0;
    CHECK_RC(embkv_backup_step(b, 0, &done), EMBKV_OK);
    CHECK(done == 1);
    embkv_backup_info info;
    CHECK_RC(embkv_backup_finish(b, &info), EMBKV_OK);
    CHECK(info.rows == (uint64_t)n);

    /* a relative name is resolved at begin: a chdir before finish does not move it */
    char cwd[PATH_MAX], here[700];
    snprintf(here, sizeof here, "%s", test_tmpdir(""));
    CHECK(getcwd(cwd, sizeof cwd) != NULL && chdir(here) == 0);
    CHECK_RC(embkv_backup_begin(s, "relcopy", &b), EMBKV_OK);
    CHECK(chdir("/") == 0);
    CHECK_RC(embkv_backup_step(b, 0, &done), EMBKV_OK);
    CHECK_RC(embkv_backup_finish(b, &info), EMBKV_OK);
    snprintf(dir, sizeof dir, "%s/relcopy", here);
    CHECK(exists(dir) && !exists("/relcopy"));
    CHECK(chdir(cwd) == 0);

    /* the caller's close while a backup runs: the store stays open for it */
    snprintf(dir, sizeof dir, "%s", test_tmpdir("hcopy2"));
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_OK);
    CHECK_RC(embkv_backup_step(b, 1000, NULL), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_backup_step(b, 0, &done), EMBKV_OK);
    CHECK_RC(embkv_backup_finish(b, &info), EMBKV_OK);
    CHECK(info.rows == (uint64_t)n);
    /* and closes with it: another process could open it now */
    embkv_options oo = {.dim = 4};
    CHECK_RC(embkv_open(src, &oo, 0, &s), EMBKV_OK);
    embkv_stats ss;
    CHECK_RC(embkv_stats_get(s, &ss), EMBKV_OK);
    CHECK(ss.recovered == 0 && ss.rows == (uint64_t)n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------- a copy of three tiers */

#define DIM 60
#define SF 61

static void row_of(int64_t id, float *vec, float *state)
{
    for (int k = 0; k < DIM; k++) vec[k] = (float)(id % 977) + 0.25f * (float)k;
    for (int k = 0; k < SF; k++) state[k] = -(float)(id % 613) - 0.5f * (float)k;
}

static void test_tiers(void)
{
    const int64_t rows = 45000;
    char src[600], dst[600];
    snprintf(src, sizeof src, "%s", test_tmpdir("tiers"));
    snprintf(dst, sizeof dst, "%s", test_tmpdir("tiers-copy"));
    /* a pool of ~30000 records, a log for the rest, a cache of ~500 rows */
    embkv_store *s = open_at(src, DIM, SF, rows, 16u << 20, 256u << 20, 256u << 10, 0);
    float v[DIM], st[SF];
    for (int64_t id = 0; id < rows; id++) {
        row_of(id * 7 - 3000, v, st);
        CHECK_RC(embkv_put_clock(s, id * 7 - 3000, v, st, (uint64_t)(id % 11)), EMBKV_OK);
    }
    CHECK_RC(embkv_tier_idle(s, 20000), EMBKV_OK);
    int64_t hot[64];
    float hv[64 * DIM];
    for (int k = 0; k < 64; k++) hot[k] = (int64_t)k * 7 - 3000;
    for (int r = 0; r < 3; r++) CHECK_RC(embkv_get_batch(s, hot, 64, hv, NULL, NULL), EMBKV_OK);
    /* (the reads may have cached some already: the move brings the rest,
     * and all are in DRAM after it) */
    int htier[64];
    CHECK_RC(embkv_locate_batch_at(s, NULL, hot, 64, htier, NULL), EMBKV_OK);
    uint64_t cached = 0;
    for (int k = 0; k < 64; k++) cached += htier[k] == EMBKV_TIER_DRAM;
    embkv_moves mv;
    CHECK_RC(embkv_hotset_move(s, hot, 64, &mv), EMBKV_OK);
    CHECK(mv.to_dram >= 64 - cached && mv.to_dram <= 64);
    CHECK_RC(embkv_locate_batch_at(s, NULL, hot, 64, htier, NULL), EMBKV_OK);
    for (int k = 0; k < 64; k++) CHECK(htier[k] == EMBKV_TIER_DRAM);
    /* rows changed after the last sync are in the backup too (it syncs) */
    row_of(5, v, st);
    v[0] = 1234.5f;
    CHECK_RC(embkv_put_clock(s, -3000, v, st, 77), EMBKV_OK);
    embkv_stats sst;
    CHECK_RC(embkv_stats_get(s, &sst), EMBKV_OK);
    CHECK(sst.rows_ssd > 0);
    CHECK(sst.cache_rows > 0);

    embkv_backup_info info;
    CHECK_RC(run_backup(s, dst, 333, &info), EMBKV_OK);
    CHECK(info.rows == (uint64_t)rows);
    CHECK_RC(embkv_stats_get(s, &sst), EMBKV_OK);
    CHECK(info.epoch <= sst.durable_epoch && info.epoch > 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);

    embkv_store *d = NULL;
    embkv_options o = {.dim = DIM};
    CHECK_RC(embkv_open(dst, &o, 0, &d), EMBKV_OK);
    if (!d) return;
    CHECK(embkv_state_floats(d) == SF);
    CHECK(embkv_count(d) == (uint64_t)rows);
    CHECK_RC(embkv_check(d), EMBKV_OK);
    embkv_stats dst_st;
    CHECK_RC(embkv_stats_get(d, &dst_st), EMBKV_OK);
    CHECK(dst_st.ssd_size == sst.ssd_size);
    int bad = 0;
    for (int64_t id = 0; id < rows; id++) {
        float gv[DIM], gs[SF];
        embkv_rowinfo ri;
        int64_t key = id * 7 - 3000;
        row_of(key, v, st);
        uint64_t clock = (uint64_t)(id % 11);
        if (key == -3000) {
            row_of(5, v, st);
            v[0] = 1234.5f;
            clock = 77;
        }
        if (embkv_get(d, key, gv, gs, &ri) != EMBKV_OK || memcmp(gv, v, sizeof v) || memcmp(gs, st, sizeof st) ||
            ri.clock != clock)
            bad++;
    }
    CHECK(bad == 0);
    CHECK_RC(embkv_close(d), EMBKV_OK);
}

/* ------------------------------------------- a backup beside every writer */

#define BATCH 256
#define INS_BASE 1000000
#define DEL_BASE 2000000

typedef struct {
    embkv_store *s;
    atomic_int stop;
    atomic_long inserted, deleted;
    long del_rows, ins_rows;
} world;

static int add_one(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    (void)ctx, (void)i, (void)id, (void)state;
    if (!vec) return 1;
    for (int k = 0; k < 4; k++) vec[k] += 1.0f;
    return 0;
}

static void *updater(void *arg)
{
    world *w = arg;
    int64_t ids[BATCH];
    for (int k = 0; k < BATCH; k++) ids[k] = k;
    while (!atomic_load(&w->stop)) {
        size_t n = 0;
        TCHECK_RC(embkv_update_batch(w->s, ids, BATCH, add_one, NULL, 0, &n), EMBKV_OK);
        TCHECK(n == BATCH);
        usleep(50);  /* (the pool's room for versions a backup keeps) */
    }
    return NULL;
}

static void *inserter(void *arg)
{
    world *w = arg;
    /* (capped: a backup's time follows the rows, and every version the
     * updaters replace meanwhile stays in the pool until it ends) */
    for (long k = 0; k < w->ins_rows && !atomic_load(&w->stop); k++) {
        float v[4] = {(float)k, 1, 2, 3};
        TCHECK_RC(embkv_put(w->s, INS_BASE + k, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
        atomic_store(&w->inserted, k + 1);
        if (k % 64 == 0) usleep(200);
    }
    return NULL;
}

static void *deleter(void *arg)
{
    world *w = arg;
    for (long k = 0; k < w->del_rows && !atomic_load(&w->stop); k++) {
        TCHECK_RC(embkv_delete(w->s, DEL_BASE + k), EMBKV_OK);
        atomic_store(&w->deleted, k + 1);
        usleep(300);
    }
    return NULL;
}

static void *syncer(void *arg)
{
    world *w = arg;
    while (!atomic_load(&w->stop)) {
        TCHECK_RC(embkv_sync(w->s), EMBKV_OK);
        usleep(3000);
    }
    return NULL;
}

static void *mover(void *arg)
{
    world *w = arg;
    rng_t r = {42};
    while (!atomic_load(&w->stop)) {
        int64_t ids[32];
        for (int k = 0; k < 32; k++) {
            uint64_t x = rnd_below(&r, 3);
            ids[k] = x == 0 ? (int64_t)rnd_below(&r, BATCH) : x == 1 ? DEL_BASE + (int64_t)rnd_below(&r, (uint64_t)w->del_rows)
                                                                 : INS_BASE + (int64_t)rnd_below(&r, 1 + (uint64_t)atomic_load(&w->inserted));
        }
        size_t m;
        TCHECK_RC(embkv_hotset(w->s, ids, 32, &m), EMBKV_OK);
        usleep(100);
    }
    return NULL;
}

/* The copy holds one checkpoint: the batch rows at one clock c with every
 * element equal to c, the inserts 0..m-1 and the deletes 0..d-1 done for
 * some m and d, and nothing else. */
static void check_copy(const char *dir, long del_rows, long min_ins, long max_ins, long min_del, long max_del)
{
    embkv_store *d = NULL;
    embkv_options o = {.dim = 4};
    CHECK_RC(embkv_open(dir, &o, 0, &d), EMBKV_OK);
    if (!d) return;
    CHECK_RC(embkv_check(d), EMBKV_OK);
    float v[4];
    embkv_rowinfo ri;
    uint64_t clock0 = UINT64_MAX;
    int bad = 0;
    for (int64_t id = 0; id < BATCH; id++) {
        if (embkv_get(d, id, v, NULL, &ri) != EMBKV_OK) { bad++; continue; }
        if (clock0 == UINT64_MAX) clock0 = ri.clock;
        for (int k = 0; k < 4; k++) bad += v[k] != (float)ri.clock;
        bad += ri.clock != clock0;
    }
    CHECK(bad == 0);
    long m = 0;
    while (m <= max_ins + 1 && embkv_exists(d, INS_BASE + m) == 1) m++;
    for (long k = m; k <= max_ins + 2; k++) bad += embkv_exists(d, INS_BASE + k) == 1;
    for (long k = 0; k < m; k++)
        if (embkv_get(d, INS_BASE + k, v, NULL, NULL) != EMBKV_OK || v[0] != (float)k) bad++;
    long dl = 0;
    while (dl < del_rows && embkv_exists(d, DEL_BASE + dl) == 0) dl++;
    for (long k = dl; k < del_rows; k++) bad += embkv_exists(d, DEL_BASE + k) != 1;
    CHECK(bad == 0);
    /* (one put or delete may have returned without its count stored yet) */
    CHECK(m >= min_ins && m <= max_ins + 1);
    CHECK(dl >= min_del && dl <= max_del + 1);
    CHECK(embkv_count(d) == (uint64_t)(BATCH + m + (del_rows - dl)));
    printf("  copy: batch clock %llu, %ld inserts, %ld deletes of %ld\n", (unsigned long long)clock0, m, dl, del_rows);
    CHECK_RC(embkv_close(d), EMBKV_OK);
}

static void test_beside_writers(void)
{
    char src[600];
    snprintf(src, sizeof src, "%s", test_tmpdir("live"));
    /* a small index: the inserts grow it during the backup */
    embkv_store *s = open_at(src, 4, 0, 64, 64u << 20, 0, 32u << 10, 100000);
    world w;
    memset(&w, 0, sizeof w);
    w.s = s;
    w.del_rows = (long)(3000 * scale);
    w.ins_rows = (long)(30000 * scale);
    float z[4] = {0, 0, 0, 0};
    for (int64_t id = 0; id < BATCH; id++) CHECK_RC(embkv_put(s, id, z, NULL, 0), EMBKV_OK);
    for (long k = 0; k < w.del_rows; k++) CHECK_RC(embkv_put(s, DEL_BASE + k, z, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_heat_enable(s), EMBKV_OK);
    pthread_t th[6];
    void *(*fns[6])(void *) = {updater, updater, inserter, deleter, syncer, mover};
    for (int i = 0; i < 6; i++) pthread_create(&th[i], NULL, fns[i], &w);
    int rounds = scale < 1 ? 2 : 4;
    for (int r = 0; r < rounds; r++) {
        usleep(30000);
        char dir[700];
        snprintf(dir, sizeof dir, "%s-copy%d", src, r);
        embkv_backup_info info;
        long ins_before = atomic_load(&w.inserted), del_before = atomic_load(&w.deleted);
        long ins_after = 0, del_after = 0;
        embkv_backup *b = NULL;
        int rc = embkv_backup_begin(s, dir, &b), done = 0;
        /* what was done by the end of begin bounds what the copy holds */
        ins_after = atomic_load(&w.inserted);
        del_after = atomic_load(&w.deleted);
        CHECK_RC(rc, EMBKV_OK);
        while (rc == EMBKV_OK && !done) {
            rc = embkv_backup_step(b, 97, &done);
            usleep(100);
        }
        CHECK_RC(rc, EMBKV_OK);
        CHECK_RC(embkv_backup_finish(b, &info), EMBKV_OK);
        check_copy(dir, w.del_rows, ins_before, ins_after, del_before, del_after);
    }
    atomic_store(&w.stop, 1);
    for (int i = 0; i < 6; i++) pthread_join(th[i], NULL);
    fold_thread_checks();
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    printf("  source: %llu rows, %llu resizes, %llu hot moves\n", (unsigned long long)st.rows,
           (unsigned long long)st.resizes, (unsigned long long)st.hot_moves);
    CHECK(st.resizes > 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------- no row moves under the cursor */

/* Displaced keys moved home while the cursor is between them and their
 * home bucket would be missed: during a backup embkv_hotset moves nothing,
 * and the copy holds every row. */
static void test_moves(void)
{
    char src[600], dir[700];
    snprintf(src, sizeof src, "%s", test_tmpdir("moves"));
    snprintf(dir, sizeof dir, "%s", test_tmpdir("moves-copy"));
    embkv_options o = {.dim = 4, .expected_rows = 2000, .max_load = 0.95};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(src, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    size_t n = (size_t)((double)embkv_debug_nbuckets(s) * embkv_debug_slots_per_bucket() * 0.9);
    float v[4] = {1, 2, 3, 4};
    for (size_t id = 0; id < n; id++) CHECK_RC(embkv_put(s, (int64_t)id, v, NULL, 0), EMBKV_OK);
    int64_t *disp = malloc(n * sizeof *disp);
    size_t nd = 0;
    for (size_t id = 0; id < n; id++) {
        uint64_t b;
        if (embkv_debug_bucket_of(s, (int64_t)id, &b) == EMBKV_OK && b != embkv_debug_home(s, (int64_t)id))
            disp[nd++] = (int64_t)id;
    }
    /* room in the home buckets: every fifth key that is home goes */
    size_t gone = 0;
    for (size_t id = 0; id < n; id += 5) {
        uint64_t b;
        if (embkv_debug_bucket_of(s, (int64_t)id, &b) == EMBKV_OK && b == embkv_debug_home(s, (int64_t)id)) {
            CHECK_RC(embkv_delete(s, (int64_t)id), EMBKV_OK);
            gone++;
        }
    }
    CHECK(nd > 50);
    embkv_backup *b = NULL;
    CHECK_RC(embkv_backup_begin(s, dir, &b), EMBKV_OK);
    CHECK_RC(embkv_backup_step(b, 300, NULL), EMBKV_OK);
    size_t moved = 1;
    CHECK_RC(embkv_hotset(s, disp, nd, &moved), EMBKV_OK);
    CHECK(moved == 0);
    int done = 0;
    CHECK_RC(embkv_backup_step(b, 0, &done), EMBKV_OK);
    CHECK(done == 1);
    embkv_backup_info info;
    CHECK_RC(embkv_backup_finish(b, &info), EMBKV_OK);
    CHECK(info.rows == n - gone);
    /* after it, they move */
    CHECK_RC(embkv_hotset(s, disp, nd, &moved), EMBKV_OK);
    CHECK(moved > 0);
    free(disp);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ---------------------------------------------------- killed half-way */

static void test_killed(void)
{
    char src[600], dir[700], mark[700], parent[700];
    snprintf(src, sizeof src, "%s", test_tmpdir("killsrc"));
    snprintf(dir, sizeof dir, "%s", test_tmpdir("killed-copy"));
    snprintf(mark, sizeof mark, "%s", test_tmpdir("killmark"));
    snprintf(parent, sizeof parent, "%s", test_tmpdir(""));
    embkv_store *s = open_at(src, 4, 0, 20000, 0, 0, 0, 0);
    float v[4] = {1, 2, 3, 4};
    for (int64_t id = 0; id < 20000; id++) CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        embkv_store *c = NULL;
        embkv_options o = {.dim = 4};
        embkv_backup *b = NULL;
        if (embkv_open(src, &o, 0, &c) != EMBKV_OK || embkv_backup_begin(c, dir, &b) != EMBKV_OK ||
            embkv_backup_step(b, 5000, NULL) != EMBKV_OK)
            _exit(3);
        write_mark(mark, "half");
        for (;;) pause();
    }
    for (int i = 0; i < 20000 && !exists(mark); i++) usleep(1000);
    CHECK(exists(mark));
    kill(pid, SIGKILL);
    int wst = 0;
    waitpid(pid, &wst, 0);
    CHECK(WIFSIGNALED(wst));
    CHECK(!exists(dir));
    CHECK(count_prefixed(parent, "killed-copy.embkv-tmp-") == 1);
    CHECK_RC(embkv_open(src, &(embkv_options){.dim = 4}, 0, &s), EMBKV_OK);
    embkv_backup_info info;
    CHECK_RC(run_backup(s, dir, 0, &info), EMBKV_OK);
    CHECK(info.rows == 20000);
    CHECK(count_prefixed(parent, "killed-copy.embkv-tmp-") == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

int main(void)
{
    const char *sc = getenv("EMBKV_TEST_SCALE");
    if (sc) scale = atof(sc) > 0 ? atof(sc) : 1.0;
    test_targets();
    test_handles();
    test_tiers();
    test_beside_writers();
    test_moves();
    test_killed();
    return test_summary("test_concurrency_backup");
}
