/*
 * test_hotset.c - the access statistics and the hot set through the C API:
 *  - statistics count nothing until something needs them, then exactly
 *    (a few ids in a large sketch: the estimate is the count, capped at 15)
 *    for the read and write calls that count, and embkv_heat_touch;
 *  - embkv_hottest ranks by the estimate, leaves out rows never counted;
 *  - embkv_hotset_move brings crafted log-resident rows into the pool (every
 *    one of them, values unchanged, kept after reopen), the n hottest too,
 *    and moves displaced keys into their home buckets, each count equal to
 *    what the index shows afterwards; with a DRAM cache, the n hottest
 *    go into it;
 *  - bad arguments are EMBKV_INVALID.
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#include <stdbool.h>
#include <sys/stat.h>

#define DIM 16
#include "tier_rows.h"

static void test_counts(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/counts", root);
    embkv_options o = {.dim = DIM, .expected_rows = 4000};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    uint64_t gen[1000] = {0};
    int rc;
    CHECK(load_rows(s, gen, 1000, &rc) == 1000);
    float v[DIM];
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.heat_counting == 0 && st.heat_touches == 0);
    /* Not counting yet: reads leave no trace. */
    for (int k = 0; k < 5; k++)
        CHECK_RC(embkv_get(s, 7, v, NULL, NULL), EMBKV_OK);
    uint32_t hits[4];
    int64_t q[4] = {7, 3, 4, 9};
    CHECK_RC(embkv_heat_get(s, q, 4, hits), EMBKV_OK);
    CHECK(hits[0] == 0 && hits[1] == 0 && hits[2] == 0 && hits[3] == 0);
    size_t nout = 99;
    int64_t top[8];
    uint32_t th[8];
    CHECK_RC(embkv_hottest(s, 8, top, th, &nout), EMBKV_OK);
    CHECK(nout == 0);

    CHECK_RC(embkv_heat_enable(s), EMBKV_OK);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.heat_counting == 1);
    for (int k = 0; k < 5; k++)
        CHECK_RC(embkv_get(s, 7, v, NULL, NULL), EMBKV_OK);
    int64_t pair[2] = {3, 4};
    float out[2 * DIM];
    for (int k = 0; k < 2; k++)
        CHECK_RC(embkv_get_batch(s, pair, 2, out, NULL, NULL), EMBKV_OK);
    int64_t nine = 9;
    for (int k = 0; k < 20; k++)
        embkv_heat_touch(s, &nine, 1);
    /* A snapshot read does not count. */
    CHECK_RC(embkv_get_batch_at(s, NULL, pair, 2, out, NULL, NULL, NULL), EMBKV_OK);
    CHECK_RC(embkv_heat_get(s, q, 4, hits), EMBKV_OK);
    CHECK(hits[0] == 5);
    CHECK(hits[1] == 2 && hits[2] == 2);
    CHECK(hits[3] == 15);  /* saturated */
    /* A write counts once. */
    CHECK_RC(put_gen(s, 11, 2), EMBKV_OK);
    int64_t eleven = 11;
    CHECK_RC(embkv_heat_get(s, &eleven, 1, hits), EMBKV_OK);
    CHECK(hits[0] == 1);

    CHECK_RC(embkv_hottest(s, 3, top, th, &nout), EMBKV_OK);
    CHECK(nout == 3);
    CHECK(top[0] == 9 && th[0] == 15);
    CHECK(top[1] == 7 && th[1] == 5);
    CHECK((top[2] == 3 || top[2] == 4) && th[2] == 2);
    /* Only rows counted at all: 9, 7, 3, 4, 11. */
    CHECK_RC(embkv_hottest(s, 8, top, NULL, &nout), EMBKV_OK);
    CHECK(nout == 5);
    CHECK(top[4] == 11);
    CHECK_RC(embkv_hottest(s, 0, top, th, &nout), EMBKV_OK);
    CHECK(nout == 0);

    /* Bad arguments. */
    embkv_moves mv;
    CHECK_RC(embkv_hotset_move(NULL, q, 1, &mv), EMBKV_INVALID);
    CHECK_RC(embkv_hotset_move(s, NULL, 3, &mv), EMBKV_INVALID);
    CHECK_RC(embkv_hotset_move(s, q, 1, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_hottest(s, 5, NULL, NULL, &nout), EMBKV_INVALID);
    CHECK_RC(embkv_hottest(s, 5, top, NULL, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_heat_get(s, q, 2, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_heat_enable(NULL), EMBKV_INVALID);
    embkv_heat_touch(NULL, q, 1); /* ignored */
    /* Without an SSD tier nothing goes to the pool; absent ids are ignored. */
    int64_t some[3] = {7, 123456789, 7};
    CHECK_RC(embkv_hotset_move(s, some, 3, &mv), EMBKV_OK);
    CHECK(mv.to_pm == 0 && mv.to_dram == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* An update's count with a DRAM cache: a cached row's counts as an
 * uncached one's, through embkv_update_batch and through a push (whose
 * existence check counts the cached rows), so that the rows the cache
 * holds do not look colder than the rest. */
static int add_one(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    (void)ctx, (void)i, (void)id, (void)state;
    vec[0] += 1.0f;
    return 0;
}

static void test_counts_cached(const char *root)
{
    embkv_options o = {.dim = DIM, .expected_rows = 4000, .cache_size = 1u << 20};
    uint64_t gen[1000] = {0};
    embkv_store *s = open_with_rows(root, "counts-cached", &o, gen, 1000);
    if (!s)
        return;
    embkv_train_options t;
    embkv_train_defaults(&t);
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    int64_t ids[4] = {5, 6, 7, 8};  /* 5 and 6 cached, 7 and 8 not */
    embkv_cache_offer(s, ids, 2);
    embkv_rowinfo info[4];
    uint8_t found[4];
    float out[4 * DIM];
    CHECK_RC(embkv_get_batch_at(s, NULL, ids, 4, out, info, found, NULL), EMBKV_OK);
    CHECK(info[0].tier == EMBKV_TIER_DRAM && info[1].tier == EMBKV_TIER_DRAM);
    CHECK(info[2].tier != EMBKV_TIER_DRAM && info[3].tier != EMBKV_TIER_DRAM);
    uint32_t before[4], after[4];
    CHECK_RC(embkv_heat_get(s, ids, 4, before), EMBKV_OK);
    for (int k = 0; k < 2; k++)
        CHECK_RC(embkv_update_batch(s, ids, 4, add_one, NULL, 0, NULL), EMBKV_OK);
    embkv_session *ss;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    float g[4 * DIM] = {0};
    /* (the last two with a snapshot open: the push's writes then go
     * through, not in place, and its hints go unused) */
    embkv_snapshot *snap = NULL;
    for (int k = 0; k < 3; k++) {
        if (k == 1)
            CHECK_RC(embkv_snapshot_open(s, &snap), EMBKV_OK);
        CHECK_RC(embkv_push(ss, ids, 4, g, 0, NULL), EMBKV_OK);
    }
    embkv_snapshot_close(snap);
    embkv_session_close(ss);
    CHECK_RC(embkv_heat_get(s, ids, 4, after), EMBKV_OK);
    for (int i = 0; i < 4; i++) {
        if (after[i] != before[i] + 5)
            fprintf(stderr, "  id %lld: %u hits after 5 updates, %u before\n", (long long)ids[i], after[i],
                    before[i]);
        CHECK(after[i] == before[i] + 5);
    }
    CHECK_RC(embkv_get_batch_at(s, NULL, ids, 4, out, info, found, NULL), EMBKV_OK);
    CHECK(info[0].tier == EMBKV_TIER_DRAM && info[1].tier == EMBKV_TIER_DRAM);  /* (still cached) */
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* Keys not in their home bucket move there; the count is what moved. */
static void test_home(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/home", root);
    /* A small index, filled close to its load limit: many keys displaced. */
    embkv_options o = {.dim = DIM, .expected_rows = 2000, .max_load = 0.95};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    uint64_t nb = embkv_debug_nbuckets(s);
    size_t n = (size_t)(nb * embkv_debug_slots_per_bucket() * 0.85);
    uint64_t *gen = calloc(n, sizeof *gen);
    int rc;
    CHECK(load_rows(s, gen, n, &rc) == n);
    CHECK(embkv_debug_nbuckets(s) == nb);
    int64_t *disp = malloc(n * sizeof *disp);
    size_t nd = 0;
    for (size_t id = 0; id < n; id++) {
        uint64_t b;
        CHECK_RC(embkv_debug_bucket_of(s, (int64_t)id, &b), EMBKV_OK);
        if (b != embkv_debug_home(s, (int64_t)id))
            disp[nd++] = (int64_t)id;
    }
    CHECK(nd > 20);
    embkv_moves mv;
    CHECK_RC(embkv_hotset_move(s, disp, nd, &mv), EMBKV_OK);
    size_t home_now = 0;
    for (size_t i = 0; i < nd; i++) {
        uint64_t b;
        CHECK_RC(embkv_debug_bucket_of(s, disp[i], &b), EMBKV_OK);
        home_now += b == embkv_debug_home(s, disp[i]);
    }
    /* A key moved home may displace a colder victim that was home too, so
     * the displaced ids now home can only be counted from above. */
    CHECK(mv.home_bucket > 0);
    CHECK(home_now <= mv.home_bucket);
    CHECK(mv.to_pm == 0);
    check_all(s, gen, n);
    free(disp);
    free(gen);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_to_pm(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/tier", root);
    const char *sc = getenv("EMBKV_TEST_SCALE");
    size_t n = sc && atof(sc) > 0 && atof(sc) < 1 ? 100000 : 200000;
    embkv_options o = {.dim = DIM, .expected_rows = n, .pool_size = 16u << 20, .ssd_size = 256u << 20};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    uint64_t *gen = calloc(n, sizeof *gen);
    int rc;
    CHECK(load_rows(s, gen, n, &rc) == n);
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.rows_ssd > n / 4);

    /* These ids, with repeats and an absent one. */
    int64_t ids[80];
    CHECK(ssd_rows(s, n, 0, 64, ids) == 64);
    for (int i = 0; i < 5; i++)
        ids[64 + i] = ids[i * 3];
    ids[69] = (int64_t)n + 5;
    embkv_moves mv;
    CHECK_RC(embkv_hotset_move(s, ids, 70, &mv), EMBKV_OK);
    CHECK(mv.to_pm == 64);
    CHECK(count_tier(s, ids, 64, EMBKV_TIER_PM) == 64);
    float out[64 * DIM];
    uint8_t found[64];
    CHECK_RC(embkv_get_batch_at(s, NULL, ids, 64, out, NULL, found, NULL), EMBKV_OK);
    size_t same = 0;
    for (int i = 0; i < 64; i++)
        same += found[i] && vec_is(out + i * DIM, ids[i], gen[ids[i]]);
    CHECK(same == 64);

    /* The n hottest: 32 log rows touched 12 times each stand out beside
     * the 64 just moved (a move raises its rows to the top: 15); every
     * other row was counted a few times at most, by the load and reads. */
    int64_t hot[32];
    CHECK(ssd_rows(s, n, n / 2, 32, hot) == 32);
    for (int k = 0; k < 12; k++)
        embkv_heat_touch(s, hot, 32);
    int64_t top[96];
    uint32_t th[96];
    size_t nout;
    CHECK_RC(embkv_hottest(s, 96, top, th, &nout), EMBKV_OK);
    CHECK(nout == 96);
    size_t ours = 0, moved_before = 0;
    for (int i = 0; i < 96; i++) {
        for (int j = 0; j < 32; j++)
            ours += top[i] == hot[j];
        for (int j = 0; j < 64; j++)
            moved_before += top[i] == ids[j];
    }
    CHECK(ours == 32 && moved_before == 64);
    CHECK(th[0] == 15 && th[95] >= 12);
    CHECK_RC(embkv_hotset_move(s, top, nout, &mv), EMBKV_OK);
    CHECK(mv.to_pm == 32);
    CHECK(count_tier(s, hot, 32, EMBKV_TIER_PM) == 32);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.hotset_to_pm == 96);
    CHECK(st.rows == n && st.rows_pm + st.rows_ssd == n);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);

    /* Every row as it was after a reopen (the statistics start from zero
     * there, so the tier's thread may demote any row again). */
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    check_all(s, gen, n);

    /* A reopened store learns its pool's limit when a chunk is refused:
     * a move larger than the free records still happens (it once moved
     * nothing past a few hundred rows). */
    enum { MANY = 1000 };
    int64_t *many = malloc(4 * MANY * sizeof *many);
    CHECK(ssd_rows(s, n, 0, MANY, many) == MANY);
    CHECK_RC(embkv_hotset_move(s, many, MANY, &mv), EMBKV_OK);
    CHECK(mv.to_pm == MANY);
    size_t in_pm = 0;
    for (size_t i = 0; i < MANY; i += 200)
        in_pm += count_tier(s, many + i, 200, EMBKV_TIER_PM);
    CHECK(in_pm == MANY);

    /* More rows than the pool holds: the first ids win, those the pool
     * holds already (the MANY just moved, their heat at the top as the
     * promoted rows' is) included, and the moves do not push each other
     * out (the pool's rows number about a tenth of n). */
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    size_t want = (size_t)st.rows_pm * 3;
    int64_t *lots = malloc((MANY + want) * sizeof *lots);
    memcpy(lots, many, MANY * sizeof *lots);
    size_t got = MANY + ssd_rows(s, n, 0, want, lots + MANY);
    CHECK(got > MANY + st.rows_pm);
    uint64_t dem0 = st.demotions;
    CHECK_RC(embkv_hotset_move(s, lots, got, &mv), EMBKV_OK);
    CHECK(mv.to_pm > 0 && mv.to_pm < got);
    in_pm = 0;
    for (size_t i = 0; i < MANY; i += 200)
        in_pm += count_tier(s, many + i, 200, EMBKV_TIER_PM);
    CHECK(in_pm == MANY);                                                     /* the first, in the pool already */
    CHECK(count_tier(s, lots + MANY, 200, EMBKV_TIER_PM) == 200);            /* the first of the log's */
    CHECK(count_tier(s, lots + got - 200, 200, EMBKV_TIER_SSD) == 200);    /* the last */
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.demotions - dem0 <= 2 * st.rows_pm);  /* no churn through the log */
    free(lots);
    free(many);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free(gen);
}

/* With a DRAM cache: the n hottest go into it, each counted once. */
static void test_to_dram(const char *root)
{
    embkv_options o = {.dim = DIM, .expected_rows = 4000, .cache_size = 1u << 20};
    uint64_t gen[2000] = {0};
    embkv_store *s = open_with_rows(root, "dram", &o, gen, 2000);
    if (!s)
        return;
    /* Loading admitted nothing: puts do not. */
    int64_t hot[40];
    for (int i = 0; i < 40; i++)
        hot[i] = 1000 + 7 * i;
    CHECK(count_tier(s, hot, 40, EMBKV_TIER_DRAM) == 0);
    for (int k = 0; k < 9; k++)
        embkv_heat_touch(s, hot, 40);
    int64_t top[40];
    size_t nout;
    CHECK_RC(embkv_hottest(s, 40, top, NULL, &nout), EMBKV_OK);
    CHECK(nout == 40);
    embkv_moves mv;
    CHECK_RC(embkv_hotset_move(s, top, nout, &mv), EMBKV_OK);
    CHECK(mv.to_dram == 40 && mv.to_pm == 0);
    CHECK(count_tier(s, hot, 40, EMBKV_TIER_DRAM) == 40);
    CHECK_RC(embkv_hotset_move(s, top, nout, &mv), EMBKV_OK);
    CHECK(mv.to_dram == 0);  /* there already */
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.hotset_to_dram == 40 && st.cache_rows == 40);
    check_all(s, gen, 2000);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *root = test_tmpdir("hotset");
    mkdir(root, 0755);
    test_counts(root);
    test_counts_cached(root);
    test_home(root);
    test_to_pm(root);
    test_to_dram(root);
    return test_summary("test_hotset");
}
