/*
 * test_concurrency_migrate.c - background hot-set migration (migrate_rate):
 *  - rows whose statistics say hot (touched, never read) reach the DRAM
 *    cache, and log-resident ones the pool, with no call from the
 *    application;
 *  - the rate bounds the moves: never more than rate x time since the
 *    thread started;
 *  - a later open giving a rate sets it, 0 and EMBKV_MIGRATE_ANY share the
 *    running one; close stops a thread sleeping out its rate at once;
 *  - without a cache or a tier, displaced hot keys are moved home;
 *  - writers and readers beside the thread (also run under TSan) see
 *    every row as they wrote it, and a reopen shows the same;
 *  - scans (embkv_scan, a pinned embkv_scan_ids cursor) beside rows moving
 *    between buckets see every row exactly once (a move behind a scan
 *    once dropped the row from it, a victim pushed ahead showed twice).
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <time.h>

#define DIM 16
#include "tier_rows.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Polls until count_tier reaches k or secs pass; the count reached. */
static size_t wait_tier(embkv_store *s, const int64_t *ids, size_t k, int want, double secs)
{
    double until = now_s() + secs;
    size_t c;
    while ((c = count_tier(s, ids, k, want)) < k && now_s() < until)
        usleep(20000);
    return c;
}

static void test_to_dram(const char *root)
{
    embkv_options o = {.dim = DIM, .expected_rows = 4000, .cache_size = 64u << 10, .migrate_rate = 100000};
    uint64_t gen[2000] = {0};
    embkv_store *s = open_with_rows(root, "dram", &o, gen, 2000);
    if (!s)
        return;
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.migrate_rate == 100000 && st.heat_counting == 1);
    CHECK(st.cache_capacity_rows > 64 && st.cache_capacity_rows < 1000);
    int64_t hot[40];
    for (int i = 0; i < 40; i++)
        hot[i] = 1000 + 7 * i;
    CHECK(count_tier(s, hot, 40, EMBKV_TIER_DRAM) == 0);
    for (int k = 0; k < 9; k++)
        embkv_heat_touch(s, hot, 40);
    CHECK(wait_tier(s, hot, 40, EMBKV_TIER_DRAM, 20) == 40);
    /* The counts follow the moves (a chunk's after it, the round's at
     * its end). */
    for (double until = now_s() + 10; now_s() < until; usleep(20000)) {
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        if (st.migrate_rounds >= 1 && st.migrate_moved >= 40)
            break;
    }
    CHECK(st.migrate_rounds >= 1 && st.migrate_moved >= 40 && st.migrate_errors == 0);
    CHECK(st.cache_rows <= st.cache_capacity_rows);
    check_all(s, gen, 2000);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_to_pm(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/pm", root);
    size_t n = 100000;
    embkv_options o = {.dim = DIM, .expected_rows = n, .pool_size = 16u << 20, .ssd_size = 256u << 20};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    uint64_t *gen = calloc(n, sizeof *gen);
    int rc;
    CHECK(load_rows(s, gen, n, &rc) == n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    /* Reopened with the thread (statistics start from zero: only the
     * touched rows are hot). */
    embkv_options o2 = {.dim = DIM, .migrate_rate = 1000000};
    CHECK_RC(embkv_open(dir, &o2, 0, &s), EMBKV_OK);
    int64_t hot[32];
    CHECK(ssd_rows(s, n, n / 3, 32, hot) == 32);
    for (int k = 0; k < 12; k++)
        embkv_heat_touch(s, hot, 32);
    CHECK(wait_tier(s, hot, 32, EMBKV_TIER_PM, 30) == 32);
    embkv_stats st;
    for (double until = now_s() + 10; now_s() < until; usleep(20000)) {
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        if (st.hotset_to_pm >= 32)
            break;  /* (counted after the moves) */
    }
    CHECK(st.hotset_to_pm >= 32 && st.migrate_errors == 0);
    CHECK(st.rows == n && st.rows_pm + st.rows_ssd == n);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free(gen);
}

#define RATE 200

static void test_rate(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/rate", root);
    embkv_options o = {.dim = DIM, .expected_rows = 4000, .cache_size = 4u << 20, .migrate_rate = RATE};
    embkv_store *s;
    double t0 = now_s();
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    uint64_t gen[3000] = {0};
    int rc;
    CHECK(load_rows(s, gen, 3000, &rc) == 3000);
    int64_t ids[3000];
    for (int i = 0; i < 3000; i++)
        ids[i] = i;
    for (int k = 0; k < 4; k++)
        embkv_heat_touch(s, ids, 3000);

    /* The moves never run ahead of rate x time since the thread started
     * (a chunk is charged its worst case before it runs), whatever the
     * chunks turn out to move. */
    embkv_stats st;
    size_t checks = 0;
    while (now_s() - t0 < 4.5) {
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        double since = now_s() - t0;
        if ((double)st.migrate_moved > RATE * since + 1) {
            CHECK(!"migration ran ahead of its rate");
            fprintf(stderr, "moved %llu at %.2f s\n", (unsigned long long)st.migrate_moved, since);
            break;
        }
        checks++;
        usleep(50000);
    }
    CHECK(checks > 10);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.migrate_moved > RATE && st.migrate_rate == RATE);

    /* Other opens: a rate sets the store's; 0 and EMBKV_MIGRATE_ANY share
     * the running one. */
    embkv_store *s2;
    embkv_options other = {.dim = DIM, .migrate_rate = RATE * 2};
    CHECK_RC(embkv_open(dir, &other, 0, &s2), EMBKV_OK);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.migrate_rate == RATE * 2);
    CHECK_RC(embkv_close(s2), EMBKV_OK);
    other.migrate_rate = 0;
    CHECK_RC(embkv_open(dir, &other, 0, &s2), EMBKV_OK);
    CHECK_RC(embkv_close(s2), EMBKV_OK);
    other.migrate_rate = EMBKV_MIGRATE_ANY;
    CHECK_RC(embkv_open(dir, &other, 0, &s2), EMBKV_OK);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.migrate_rate == RATE * 2);
    CHECK_RC(embkv_close(s2), EMBKV_OK);
    /* Close does not wait out the thread's pacing (it may sleep seconds). */
    double c0 = now_s();
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK(now_s() - c0 < 1.5);

    /* A store opened with EMBKV_MIGRATE_ANY runs at the default rate. */
    CHECK_RC(embkv_open(dir, &other, 0, &s), EMBKV_OK);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.migrate_rate == EMBKV_MIGRATE_DEFAULT_RATE);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* Without a cache or an SSD tier: displaced hot keys go home (the hot
 * set's size was once taken from a chunk limit that only a tier sets,
 * and came out as one row). */
static void test_home(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/home", root);
    embkv_options o = {.dim = DIM, .expected_rows = 2000, .max_load = 0.95, .migrate_rate = 100000};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    size_t n = (size_t)((double)embkv_debug_nbuckets(s) * embkv_debug_slots_per_bucket() * 0.85);
    uint64_t *gen = calloc(n, sizeof *gen);
    int rc;
    CHECK(load_rows(s, gen, n, &rc) == n);
    int64_t *disp = malloc(n * sizeof *disp);
    size_t nd = 0;
    for (size_t id = 0; id < n && nd < 200; id++) {
        uint64_t b;
        CHECK_RC(embkv_debug_bucket_of(s, (int64_t)id, &b), EMBKV_OK);
        if (b != embkv_debug_home(s, (int64_t)id))
            disp[nd++] = (int64_t)id;
    }
    CHECK(nd > 20);
    for (int k = 0; k < 10; k++)
        embkv_heat_touch(s, disp, nd);
    embkv_stats st;
    for (double until = now_s() + 20; now_s() < until; usleep(20000)) {
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        if (st.migrate_rounds >= 1 && st.hot_moves >= 5)
            break;
    }
    printf("home: %llu of %zu displaced hot keys moved home\n", (unsigned long long)st.hot_moves, nd);
    CHECK(st.hot_moves >= 5 && st.migrate_moved >= st.hot_moves);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free(disp);
    free(gen);
}

/* Writers and readers beside the thread; disjoint id ranges per writer,
 * each verifying what it wrote. */
#define NW 2
#define NROWS 120000
typedef struct wctx {
    embkv_store *s;
    int t;
    uint64_t *gen;
    atomic_int *stop;
    size_t wrong;
} wctx;

static void *writer(void *arg)
{
    wctx *w = arg;
    uint64_t r = (uint64_t)w->t * 7919 + 1;
    float v[DIM];
    while (!atomic_load(w->stop)) {
        r = mix64(r);
        /* Skewed: most writes land on the first 200 ids of the range. */
        size_t span = (r & 3) ? 200 : NROWS / NW;
        int64_t id = (int64_t)((size_t)w->t * (NROWS / NW) + (r >> 8) % span);
        uint64_t g = w->gen[id] + 1;
        int rc = put_gen(w->s, id, g);
        if (rc != EMBKV_OK) {
            if (w->wrong++ < 3)
                fprintf(stderr, "writer %d: put of id %lld failed: %s\n", w->t, (long long)id, embkv_errmsg());
            continue;
        }
        w->gen[id] = g;
        if ((rc = embkv_get(w->s, id, v, NULL, NULL)) != EMBKV_OK || !vec_is(v, id, g))
            if (w->wrong++ < 3)
                fprintf(stderr, "writer %d: id %lld read back %s after its put\n", w->t, (long long)id,
                        rc == EMBKV_OK ? "another version" : embkv_errmsg());
    }
    return NULL;
}

static void test_beside_writers(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/beside", root);
    embkv_options o = {.dim = DIM, .expected_rows = NROWS, .pool_size = 16u << 20, .ssd_size = 64u << 20,
                       .cache_size = 256u << 10, .migrate_rate = 1000000};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    uint64_t *gen = calloc(NROWS, sizeof *gen);
    int rc;
    CHECK(load_rows(s, gen, NROWS, &rc) == NROWS);
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
    atomic_int stop = 0;
    pthread_t th[NW];
    wctx w[NW];
    for (int t = 0; t < NW; t++) {
        w[t] = (wctx){s, t, gen, &stop, 0};
        pthread_create(&th[t], NULL, writer, &w[t]);
    }
    /* Rows read by nobody but counted hot: the thread brings them from
     * the log while the writers go on. */
    int64_t cold[64];
    CHECK(ssd_rows(s, NROWS, NROWS / 4, 64, cold) == 64);  /* far from the writers' hot ids */
    const char *sc = getenv("EMBKV_TEST_SCALE");
    double until = now_s() + (sc && atof(sc) > 0 && atof(sc) < 1 ? 3.5 : 5.0);
    /* Syncs as a trainer makes them: without, nothing replaced could be
     * reclaimed, and a fast machine filled ssd_size in the 5 seconds. */
    for (int k = 0; now_s() < until; k++) {
        embkv_heat_touch(s, cold, 64);
        usleep(20000);
        if (k % 10 == 9)
            CHECK_RC(embkv_sync(s), EMBKV_OK);
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < NW; t++) {
        pthread_join(th[t], NULL);
        CHECK(w[t].wrong == 0);
    }
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.migrate_rounds >= 2 && st.migrate_moved > 0 && st.migrate_errors == 0);
    CHECK(st.rows_ssd > 0 && st.hotset_to_pm > 0);  /* all three tiers in play */
    printf("beside writers: %llu rows in the log, %llu moved to the pool, %llu to the cache\n", (unsigned long long)st.rows_ssd, (unsigned long long)st.hotset_to_pm, (unsigned long long)st.hotset_to_dram);
    check_all(s, gen, NROWS);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    check_all(s, gen, NROWS);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free(gen);
}

typedef struct mover_ctx {
    embkv_store *s;
    const int64_t *disp;
    size_t nd;
    atomic_int *stop;
    atomic_size_t moved;
} mover_ctx;

/* Moves the displaced keys home until stopped (each moves once: a round
 * needs a fresh store). */
static void *mover(void *arg)
{
    mover_ctx *m = arg;
    while (!atomic_load(m->stop)) {
        size_t k = 0;
        if (embkv_hotset(m->s, m->disp, m->nd, &k) == EMBKV_OK)
            atomic_fetch_add(&m->moved, k);
    }
    return NULL;
}

static int count_cb(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)vec, (void)state, (void)info;
    uint8_t *seen = ctx;
    seen[id]++;
    if (id % 64 == 0)
        usleep(100);  /* a slow consumer */
    return 0;
}

/* Rounds on fresh stores full of displaced keys: a slow scan runs while
 * a thread moves those keys home; after the scan the moves go through. */
static void test_scan_beside_moves(const char *root)
{
    size_t bad_scan = 0, bad_ids = 0, moved = 0, during = 0;
    for (int round = 0; round < 12; round++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/scan%d", root, round);
        embkv_options o = {.dim = DIM, .expected_rows = 2000, .max_load = 0.95};
        embkv_store *s;
        CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
        size_t n = (size_t)((double)embkv_debug_nbuckets(s) * embkv_debug_slots_per_bucket() * 0.85);
        uint64_t *gen = calloc(n, sizeof *gen);
        int64_t *disp = malloc(n * sizeof *disp), *ids = malloc((n + 64) * sizeof *ids);
        uint8_t *seen = calloc(n, 1);
        int rc;
        CHECK(load_rows(s, gen, n, &rc) == n);
        size_t nd = 0;
        for (size_t id = 0; id < n; id++) {
            uint64_t b;
            CHECK_RC(embkv_debug_bucket_of(s, (int64_t)id, &b), EMBKV_OK);
            if (b != embkv_debug_home(s, (int64_t)id))
                disp[nd++] = (int64_t)id;
        }
        CHECK(nd > 20);
        atomic_int stop = 0;
        mover_ctx m = {s, disp, nd, &stop, 0};
        pthread_t th;
        if (round % 2 == 0) {
            /* A pinned cursor stepping slowly through the index. */
            embkv_scan_pin(s);
            pthread_create(&th, NULL, mover, &m);
            uint64_t pos = 0;
            size_t got = 0, k;
            while (got + 64 <= n + 64 && embkv_scan_ids(s, &pos, ids + got, 64, &k) == EMBKV_OK && k) {
                got += k;
                usleep(200);
            }
            during += atomic_load(&m.moved);
            embkv_scan_unpin(s);
            for (size_t i = 0; i < got; i++)
                if (ids[i] >= 0 && (size_t)ids[i] < n)
                    seen[ids[i]]++;
        } else {
            pthread_create(&th, NULL, mover, &m);
            usleep(100);
            CHECK_RC(embkv_scan(s, count_cb, seen), EMBKV_OK);
        }
        usleep(5000);
        atomic_store(&stop, 1);
        pthread_join(th, NULL);
        size_t *bad = round % 2 == 0 ? &bad_ids : &bad_scan;
        for (size_t id = 0; id < n; id++)
            *bad += seen[id] != 1;
        moved += atomic_load(&m.moved);
        check_all(s, gen, n);
        CHECK_RC(embkv_close(s), EMBKV_OK);
        free(seen);
        free(ids);
        free(disp);
        free(gen);
    }
    CHECK(bad_scan == 0);
    CHECK(bad_ids == 0);
    CHECK(during == 0);  /* nothing moved under the pin */
    CHECK(moved > 100);  /* and the moves went through after it */
    if (bad_scan || bad_ids)
        fprintf(stderr, "scans beside moves: %zu rows wrong in embkv_scan, %zu in a pinned cursor\n", bad_scan,
                bad_ids);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *root = test_tmpdir("migrate");
    mkdir(root, 0755);
    test_to_dram(root);
    test_to_pm(root);
    test_rate(root);
    test_home(root);
    test_beside_writers(root);
    test_scan_beside_moves(root);
    return test_summary("test_concurrency_migrate");
}
