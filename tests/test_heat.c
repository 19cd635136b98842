/*
 * test_heat.c - the access-frequency sketch (engine/heat.c), one thread.
 *
 *  - sizes: heat_new(0) works; absurd sizes are refused with EINVAL; the
 *    memory is 8 to 16 bytes per expected id;
 *  - count-min: before any aging, no estimate is below the id's true count
 *    (capped at 15), whether touched one by one or in batches, and both
 *    ways give the same table;
 *  - error rate: with a sketch sized for n ids and n/2 ids touched 15
 *    times, the fraction of never-touched ids estimating >= 2 stays under
 *    the bound computed for this layout (below);
 *  - aging: heat_age turns every estimate e into floor(e / 2); the
 *    automatic sweep leaves the first 10 x expected_ids counted touches
 *    whole, then halves the table once per such window; touches of
 *    saturated ids do not count;
 *  - admission prefers the more frequent id and keeps the victim on ties;
 *  - stamps: heat_touch_batch_sat tells exactly which ids were saturated;
 *    an id's stamp holds until the sweep passes its block or heat_age
 *    runs, and an id saturated under a stamp that still holds is still
 *    saturated (what lets a caller skip its touches); heat_count counts
 *    touches and changes nothing else.
 * Iterations scale with EMBKV_TEST_SCALE.
 */
#include "heat.h"
#include "check.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>

static double scale = 1.0;

static uint64_t id_hash(uint64_t id) { return mix64(id * 0x9E3779B97F4A7C15ull + 0x1234567ull); }

static void shuffle(uint64_t *a, size_t n, rng_t *r)
{
    for (size_t i = n - 1; i > 0 && n > 1; i--) {
        size_t j = rnd_below(r, i + 1);
        uint64_t t = a[i]; a[i] = a[j]; a[j] = t;
    }
}

static void test_sizes(void)
{
    heat *h = heat_new(0);
    CHECK(h != NULL);
    if (h) {
        CHECK(heat_bytes(h) >= 1024 && heat_bytes(h) < 4096);
        CHECK(heat_estimate(h, 42) == 0);
        heat_touch(h, 42);
        CHECK(heat_estimate(h, 42) == 1);
        CHECK(heat_touches(h) == 1 && heat_agings(h) == 0);
        heat_touch_batch(h, NULL, 0);
        CHECK(heat_touches(h) == 1);
        heat_free(h);
    }
    heat_free(NULL);

    const uint64_t absurd[] = { HEAT_MAX_IDS + 1, 1ull << 40, 1ull << 63, UINT64_MAX, UINT64_MAX - 7 };
    for (size_t i = 0; i < sizeof absurd / sizeof *absurd; i++) {
        errno = 0;
        h = heat_new(absurd[i]);
        CHECK(h == NULL && errno == EINVAL);
        heat_free(h);
    }

    const uint64_t ns[] = { 1, 7, 1000, 123457, 1u << 20 };
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++) {
        h = heat_new(ns[i]);
        CHECK(h != NULL);
        if (!h) continue;
        size_t b = heat_bytes(h);
        CHECK(b >= 8 * ns[i] && b <= 16 * ns[i] + 2048);
        heat_free(h);
    }
}

/* Touches ids[i] cnt[i] times in a random interleaving, alternately one by
 * one and in batches of random length, into both a and b (b all batched). */
static void touch_counts(heat *a, heat *b, const uint64_t *hashes, const unsigned *cnt, size_t n, rng_t *r)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += cnt[i];
    uint64_t *seq = malloc((total ? total : 1) * sizeof *seq);
    CHECK(seq != NULL);
    if (!seq) return;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        for (unsigned c = 0; c < cnt[i]; c++) seq[k++] = hashes[i];
    shuffle(seq, total, r);
    for (size_t i = 0; i < total;) {
        size_t len = 1 + rnd_below(r, 700);
        if (len > total - i) len = total - i;
        if (rnd(r) & 1)
            heat_touch_batch(a, seq + i, len);
        else
            for (size_t j = 0; j < len; j++) heat_touch(a, seq[i + j]);
        if (b) heat_touch_batch(b, seq + i, len);
        i += len;
    }
    free(seq);
}

static void test_count_min(void)
{
    int rounds = (int)(8 * scale) + 1;
    size_t below = 0, over_cap = 0, differ = 0, checked = 0;
    for (int round = 0; round < rounds; round++) {
        rng_t r = { 1000 + (uint64_t)round };
        enum { N = 4096, IDS = 2048 };
        heat *a = heat_new(N), *b = heat_new(N);
        CHECK(a && b);
        if (!a || !b) { heat_free(a); heat_free(b); return; }
        static uint64_t hs[IDS];
        static unsigned cnt[IDS];
        uint64_t want = 0;
        for (size_t i = 0; i < IDS; i++) {
            hs[i] = id_hash((uint64_t)round << 32 | i);
            cnt[i] = (unsigned)rnd_below(&r, 21);
            want += cnt[i];
        }
        /* 2048 ids x 10 touches: half the aging window (10 x 4096). */
        touch_counts(a, b, hs, cnt, IDS, &r);
        CHECK(heat_agings(a) == 0 && heat_agings(b) == 0);
        CHECK(heat_touches(a) == want && heat_touches(b) == want);
        for (size_t i = 0; i < IDS; i++) {
            unsigned e = heat_estimate(a, hs[i]);
            unsigned t = cnt[i] < HEAT_MAX_COUNT ? cnt[i] : HEAT_MAX_COUNT;
            below += e < t;
            over_cap += e > HEAT_MAX_COUNT;
            differ += e != heat_estimate(b, hs[i]);
            checked++;
        }
        heat_free(a);
        heat_free(b);
    }
    CHECK(below == 0);
    CHECK(over_cap == 0);
    CHECK(differ == 0);
    printf("  count-min: %zu ids, %zu below their count, %zu differ single/batched\n", checked, below, differ);
}

/*
 * The bound.  Layout (heat.c): one 64-byte block per 8 expected ids; an id
 * has one counter in each of 4 rows of its block, each row 32 counters.
 * Plain count-min increments are an upper bound of conservative ones, so a
 * never-touched id q estimates >= 1 only if in each of the 4 rows some
 * touched id of q's block took q's counter.  With K touched ids in the
 * block, each taking q's counter of a row with probability 1/32,
 * independently per row: P = E_K[(1 - (31/32)^K)^4], K ~ Binomial(H, 1/B)
 * for H touched ids and B blocks.  Sized for n = 65536 (B = 8192), H =
 * 32768 touched 15 times (491520 touches, under the 655360 window):
 * P = 0.000495.
 */
static double never_touched_bound(double H, double B)
{
    double p = 1.0 / B, s = 0;
    for (int K = 0; K < 400; K++) {
        double lp = lgamma(H + 1) - lgamma(K + 1) - lgamma(H - K + 1) + K * log(p) + (H - K) * log1p(-p);
        s += exp(lp) * pow(1 - pow(31.0 / 32, K), 4);
    }
    return s;
}

static heat *g_aged_src;  /* the sketch of test_error_rate, reused by test_aging */
static uint64_t g_hot[32768];

static void test_error_rate(void)
{
    enum { N = 65536, H = 32768 };
    heat *h = heat_new(N);
    CHECK(h != NULL);
    if (!h) return;
    rng_t r = { 77 };
    static unsigned cnt[H];
    for (size_t i = 0; i < H; i++) { g_hot[i] = id_hash(i); cnt[i] = 15; }
    touch_counts(h, NULL, g_hot, cnt, H, &r);
    CHECK(heat_agings(h) == 0);
    size_t hot_ok = 0;
    for (size_t i = 0; i < H; i++) hot_ok += heat_estimate(h, g_hot[i]) == HEAT_MAX_COUNT;
    CHECK(hot_ok == H);

    size_t samples = (size_t)(400000 * scale) + 1000, ge1 = 0, ge2 = 0, ge15 = 0, admitted = 0;
    for (size_t i = 0; i < samples; i++) {
        uint64_t q = id_hash((1ull << 40) + i);
        unsigned e = heat_estimate(h, q);
        ge1 += e >= 1;
        ge2 += e >= 2;
        ge15 += e >= HEAT_MAX_COUNT;
        /* An SSD row never read does not displace a hot resident. */
        admitted += heat_admit(h, q, g_hot[i % H]);
    }
    double P = never_touched_bound(H, N / 8);
    double expect = P * (double)samples, limit = expect + 5 * sqrt(expect) + 5;
    printf("  never-touched ids: %zu sampled, est>=1 %.5f%%, est>=2 %.5f%%, est=15 %.5f%%, bound %.5f%% (limit %.0f ids)\n",
           samples, 100.0 * (double)ge1 / (double)samples, 100.0 * (double)ge2 / (double)samples,
           100.0 * (double)ge15 / (double)samples, 100 * P, limit);
    CHECK(P > 0.0004 && P < 0.0006);
    CHECK((double)ge1 <= limit);
    CHECK((double)ge2 <= limit);
    /* A hot id (15) beats a never-touched one unless that one reads 15. */
    CHECK((double)ge15 <= limit);
    CHECK(admitted == 0);
    g_aged_src = h;
}

static void test_aging(void)
{
    heat *h = g_aged_src;
    if (!h) return;
    /* Ids of every count 0..15 next to the hot ones. */
    enum { M = 4096 };
    static uint64_t ids[M + 2048];
    static unsigned cnt[M], before[M + 2048];
    rng_t r = { 5 };
    for (size_t i = 0; i < M; i++) { ids[i] = id_hash((2ull << 40) + i); cnt[i] = (unsigned)(i % 16); }
    touch_counts(h, NULL, ids, cnt, M, &r);
    for (size_t i = 0; i < 2048; i++) ids[M + i] = g_hot[i];
    CHECK(heat_agings(h) == 0);
    for (int round = 1; round <= 5; round++) {
        size_t bad = 0, below = 0;
        for (size_t i = 0; i < M + 2048; i++) before[i] = heat_estimate(h, ids[i]);
        heat_age(h);
        CHECK(heat_agings(h) == (uint64_t)round);
        for (size_t i = 0; i < M + 2048; i++) {
            unsigned e = heat_estimate(h, ids[i]);
            bad += e != before[i] / 2;
            if (i < M) below += e < (cnt[i] >> round);
        }
        CHECK(bad == 0);
        CHECK(below == 0);
    }
    for (size_t i = 0; i < M + 2048; i++) CHECK(heat_estimate(h, ids[i]) == 0);
    heat_free(h);
    g_aged_src = NULL;

    /* The sweep: nothing halved in the first 10 x expected_ids touches
     * that raised a counter, then one halving of the whole table per such
     * window.  Fresh ids touched once each almost always raise one. */
    enum { N = 4096, W = 10 * N };
    h = heat_new(N);
    CHECK(h != NULL);
    if (!h) return;
    uint64_t hot = id_hash(3ull << 40);
    for (int i = 0; i < 15; i++) heat_touch(h, hot);
    uint64_t batch[512], next = 0;
    unsigned e[4];
    const int stops[4] = { 9, 19, 21, 31 };  /* tenths of W */
    for (int k = 0; k < 4; k++) {
        while (heat_touches(h) + 512 < (uint64_t)W * stops[k] / 10) {
            for (size_t i = 0; i < 512; i++) batch[i] = id_hash((4ull << 40) + next++);
            heat_touch_batch(h, batch, 512);
        }
        e[k] = heat_estimate(h, hot);
        if (k == 0) CHECK(heat_agings(h) == 0 && e[0] == HEAT_MAX_COUNT);
        if (k == 1) CHECK(heat_agings(h) == 0);
        if (k == 2) CHECK(heat_agings(h) == 1);
        if (k == 3) CHECK(heat_agings(h) == 2);
    }
    /* Halved once by 2.1 W (7, then raised only by ids sharing all its
     * counters), twice more by 3.1 W. */
    CHECK(e[2] >= 7 && e[2] < HEAT_MAX_COUNT);
    CHECK(e[3] < e[2]);
    printf("  sweep: %" PRIu64 " touches, %" PRIu64 " agings, hot id estimate at 0.9/1.9/2.1/3.1 W: %u %u %u %u\n",
           heat_touches(h), heat_agings(h), e[0], e[1], e[2], e[3]);

    /* Touches of saturated ids do not move the window. */
    uint64_t ag = heat_agings(h);
    for (int i = 0; i < 15; i++) heat_touch(h, hot);
    for (int i = 0; i < 4 * W; i++) heat_touch(h, hot);
    CHECK(heat_agings(h) == ag);
    CHECK(heat_estimate(h, hot) == HEAT_MAX_COUNT);
    heat_free(h);
}

static void test_admit(void)
{
    heat *h = heat_new(1 << 16);
    CHECK(h != NULL);
    if (!h) return;
    int n = (int)(2000 * scale) + 100;
    size_t hot_warm = 0, warm_cold = 0, cold_hot = 0, tie = 0;
    for (int i = 0; i < n; i++) {
        uint64_t hot = id_hash((5ull << 40) + 3 * (uint64_t)i), warm = id_hash((5ull << 40) + 3 * (uint64_t)i + 1),
                 cold = id_hash((5ull << 40) + 3 * (uint64_t)i + 2);
        for (int k = 0; k < 15; k++) heat_touch(h, hot);
        for (int k = 0; k < 3; k++) heat_touch(h, warm);
        hot_warm += heat_admit(h, hot, warm);
        warm_cold += heat_admit(h, warm, cold);
        cold_hot += heat_admit(h, cold, hot);
        tie += heat_admit(h, hot, hot) || heat_admit(h, cold, cold);
    }
    CHECK(heat_agings(h) == 0);
    /* 2000 ids x 19 touches in a sketch sized for 65536: collisions that
     * lift a warm id to 15 or a cold one to 3 are rare (< 0.1% each). */
    CHECK(hot_warm >= (size_t)n - (size_t)n / 100);
    CHECK(warm_cold >= (size_t)n - (size_t)n / 100);
    CHECK(cold_hot == 0);
    CHECK(tie == 0);
    heat_free(h);
}

static void test_stamp(void)
{
    enum { N = 4096, W = 10 * N, HOT = 512 };
    heat *h = heat_new(N);
    CHECK(h != NULL);
    if (!h) return;
    static uint64_t hot[HOT];
    static uint32_t st[HOT];
    static uint8_t sat[HOT];
    for (size_t i = 0; i < HOT; i++) hot[i] = id_hash((6ull << 40) + i);
    size_t wrong = 0;
    for (int t = 0; t < 17; t++) {
        unsigned before[HOT];
        for (size_t i = 0; i < HOT; i++) before[i] = heat_estimate(h, hot[i]);
        heat_touch_batch_sat(h, hot, HOT, sat);
        for (size_t i = 0; i < HOT; i++) wrong += sat[i] != (before[i] == HEAT_MAX_COUNT);
    }
    CHECK(wrong == 0);
    heat_clock k0, k1;
    heat_clock_now(h, &k0);
    size_t zero = 0;
    for (size_t i = 0; i < HOT; i++) {
        st[i] = heat_stamp(h, &k0, hot[i]);
        zero += st[i] == 0;
        CHECK(heat_estimate(h, hot[i]) == HEAT_MAX_COUNT);
    }
    CHECK(zero == 0);
    uint64_t t0 = heat_touches(h), a0 = heat_agings(h);
    heat_count(h, 1000);
    CHECK(heat_touches(h) == t0 + 1000);
    heat_clock_now(h, &k1);
    for (size_t i = 0; i < HOT; i++) CHECK(heat_stamp(h, &k1, hot[i]) == st[i]);

    /* Fresh ids until the sweep is about halfway through its first round:
     * the hot ids in the blocks it passed are halved, and only those have
     * another stamp. */
    uint64_t batch[512], next = 0;
    while (heat_touches(h) < t0 + 1000 + W + W / 2) {
        for (size_t i = 0; i < 512; i++) batch[i] = id_hash((7ull << 40) + next++);
        heat_touch_batch(h, batch, 512);
    }
    CHECK(heat_agings(h) == a0);
    heat_clock_now(h, &k1);
    size_t kept = 0, moved = 0, kept_low = 0, moved_full = 0;
    for (size_t i = 0; i < HOT; i++) {
        unsigned e = heat_estimate(h, hot[i]);
        if (heat_stamp(h, &k1, hot[i]) == st[i]) {
            kept++;
            kept_low += e != HEAT_MAX_COUNT;
        } else {
            moved++;
            moved_full += e == HEAT_MAX_COUNT;
        }
    }
    CHECK(kept_low == 0);
    CHECK(moved_full == 0);
    CHECK(kept > HOT / 4 && moved > HOT / 4);
    printf("  stamps: halfway through a sweep %zu of %d saturated ids kept theirs, %zu were halved\n", kept,
           HOT, moved);
    /* heat_age: every stamp moves. */
    heat_age(h);
    heat_clock_now(h, &k0);
    size_t same = 0;
    for (size_t i = 0; i < HOT; i++) same += heat_stamp(h, &k0, hot[i]) == heat_stamp(h, &k1, hot[i]);
    CHECK(same == 0);
    heat_free(h);
}

int main(void)
{
    const char *e = getenv("EMBKV_TEST_SCALE");
    if (e && *e && atof(e) > 0) scale = atof(e);
    test_sizes();
    test_count_min();
    test_error_rate();
    test_aging();
    test_admit();
    test_stamp();
    return test_summary("test_heat");
}
