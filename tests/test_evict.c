/*
 * test_evict.c - eviction: ttl_ms, ttl_steps, max_rows (lru, lfu), against
 * a model of the table's checkpoints, clocks and steps.
 *
 *  A. ttl_ms: rows expire exactly when the checkpoint after their last
 *     write is ttl old (the wall clock moved by embkv_debug_clock_ms);
 *     a row written since the last checkpoint never expires; rewritten
 *     rows start over; stats exact.
 *  B. ttl_steps: a row not pushed for N pushes of the table expires at
 *     the N-th; one pulled and not pushed is kept (counted) until its
 *     push or release; the step count survives a reopen, and so do the
 *     marks (ages go on across it).
 *  C. max_rows, lru: the oldest writes go first, ties by id; exactly down
 *     to max_rows.
 *  D. max_rows, lfu: the rows read least go first.
 *  E. Rows in every tier: the DRAM cache (a row pushed since its last
 *     checkpoint is newer there and stays), the SSD log (rows read from
 *     the log's records expire like the pool's).
 *  F. The eviction thread: a table over max_rows comes back under it by
 *     itself; expired rows go by themselves.
 *  G. Options: out of range and unknown policies refused, naming them.
 *  H. SIGKILL during eviction passes: each reopen holds whole batches
 *     (a pass is one write group), contiguous, and passes the check.
 *  I. A checkpoint cut off after its mark (its flush failed, then
 *     SIGKILL) at a clock 100 days ahead: the mark is in the root past the
 *     durable epoch; the reopened store's checkpoint of the same epoch
 *     replaces it (no day-100 mark left), and ages go by the real clock.
 *     (Here the new mark takes the cut one's slot; the invalidation of
 *     marks past the epoch in evict_mark_write is for two cut marks with
 *     slots reordered by thinning, which no test builds.)
 */
#include <math.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#define DIM 4
#define DAY (86400000ll)

static int64_t clock_now;  /* the offset given to embkv_debug_clock_ms */
static void advance(int64_t ms)
{
    clock_now += ms;
    embkv_debug_clock_ms(clock_now);
}

static embkv_store *open_with(const char *dir, const embkv_options *base, unsigned flags, const embkv_train_options *t)
{
    embkv_options o = base ? *base : (embkv_options){0};
    o.dim = DIM;
    if (!o.expected_rows) o.expected_rows = 1000;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, flags, &s), EMBKV_OK);
    if (!s) return NULL;
    CHECK_RC(embkv_train_configure(s, t), EMBKV_OK);
    embkv_debug_evict_pause(s, 1);
    return s;
}

static void put(embkv_store *s, int64_t id)
{
    float v[DIM] = {(float)id, 1, 2, 3};
    CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
}

static void put_range(embkv_store *s, int64_t lo, int64_t hi)
{
    for (int64_t id = lo; id < hi; id++) put(s, id);
}

/* Which of lo..hi-1 exist, as a bit string ("1101..."). */
static const char *present(embkv_store *s, int64_t lo, int64_t hi)
{
    static char buf[256];
    size_t k = 0;
    for (int64_t id = lo; id < hi && k + 1 < sizeof buf; id++) buf[k++] = embkv_exists(s, id) ? '1' : '0';
    buf[k] = 0;
    return buf;
}

static embkv_evict_result evict(embkv_store *s)
{
    embkv_evict_result r;
    CHECK_RC(embkv_evict(s, &r), EMBKV_OK);
    return r;
}

static void test_ttl_ms(void)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.ttl_ms = 10 * DAY;
    embkv_store *s = open_with(test_tmpdir("ttl"), NULL, EMBKV_OPEN_CREATE, &t);
    if (!s) return;
    put_range(s, 1, 11);                   /* day 0 */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    advance(5 * DAY);
    put_range(s, 11, 21);                  /* day 5 */
    put(s, 1);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    advance(5 * DAY - 60000);              /* day 10, less a minute: nothing yet */
    embkv_evict_result r = evict(s);
    CHECK(r.expired == 0 && r.over == 0 && r.scanned == 20);
    advance(60000);                        /* day 10: the rows of day 0 */
    r = evict(s);
    CHECK(r.expired == 9 && r.scanned == 20);
    CHECK(strcmp(present(s, 1, 21), "10000000001111111111") == 0);
    put(s, 30);                            /* day 10, no checkpoint after it */
    advance(6 * DAY);                      /* day 16: the rows of day 5 */
    r = evict(s);
    CHECK(r.expired == 11);
    CHECK(embkv_count(s) == 1 && embkv_exists(s, 30));
    CHECK_RC(embkv_sync(s), EMBKV_OK);     /* day 16: row 30's checkpoint */
    advance(10 * DAY - 60000);
    CHECK(evict(s).expired == 0);
    advance(60000);
    CHECK(evict(s).expired == 1);
    CHECK(embkv_count(s) == 0);
    embkv_train_stats st;
    CHECK_RC(embkv_train_stats_get(s, &st), EMBKV_OK);
    CHECK(st.evicted_expired == 21 && st.evicted_over == 0 && st.evict_kept == 0 && st.evict_passes == 5);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void push_ids(embkv_session *ss, const int64_t *ids, size_t n)
{
    float v[8 * DIM], g[8 * DIM];
    for (size_t i = 0; i < n * DIM; i++) g[i] = 0.5f;
    CHECK_RC(embkv_pull(ss, ids, n, v), EMBKV_OK);
    CHECK_RC(embkv_push(ss, ids, n, g, 0, NULL), EMBKV_OK);
}

static void test_ttl_steps(void)
{
    const char *dir = test_tmpdir("steps");
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    t.ttl_steps = 3;
    embkv_store *s = open_with(dir, NULL, EMBKV_OPEN_CREATE, &t);
    if (!s) return;
    embkv_session *ss = NULL;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    int64_t ab[2] = {1, 2}, a = 1, c = 3;
    push_ids(ss, ab, 2);                   /* step 1: a, b */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    push_ids(ss, &a, 1);                   /* step 2 */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    push_ids(ss, &a, 1);                   /* step 3 */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK(evict(s).expired == 0);          /* b: 2 steps without a push */
    /* c pulled and held (no push) in step 3's epoch */
    float v[DIM];
    CHECK_RC(embkv_pull(ss, &c, 1, v), EMBKV_OK);
    CHECK(embkv_debug_permits(s, 3) == 1);  /* pulls hold their rows while eviction is on */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    push_ids(ss, &a, 1);                   /* step 4: b's third step without a push */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    embkv_evict_result r = evict(s);
    CHECK(r.expired == 1 && !embkv_exists(s, 2) && embkv_exists(s, 1) && embkv_exists(s, 3));
    embkv_train_stats st;
    CHECK_RC(embkv_train_stats_get(s, &st), EMBKV_OK);
    CHECK(st.steps == 4);
    push_ids(ss, &a, 1);
    push_ids(ss, &a, 1);
    push_ids(ss, &a, 1);                   /* step 7: c (created at step 3) is 4 steps old, held */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    r = evict(s);
    CHECK(r.expired == 0 && r.kept == 1 && embkv_exists(s, 3));
    CHECK_RC(embkv_release(ss, &c, 1, NULL), EMBKV_OK);
    r = evict(s);
    CHECK(r.expired == 1 && r.kept == 0 && !embkv_exists(s, 3));
    /* The steps and the marks survive a reopen: a is 1 step old at 7. */
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    embkv_options none = {0};
    s = open_with(dir, &none, 0, &t);
    if (!s) return;
    CHECK_RC(embkv_train_stats_get(s, &st), EMBKV_OK);
    CHECK(st.steps == 7);
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    int64_t d = 4;
    push_ids(ss, &d, 1);                   /* step 8 */
    push_ids(ss, &d, 1);                   /* step 9 */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK(evict(s).expired == 0);
    push_ids(ss, &d, 1);                   /* step 10: a last pushed at 7 */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    r = evict(s);
    CHECK(r.expired == 1 && !embkv_exists(s, 1) && embkv_exists(s, 4));
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_lru(void)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.max_rows = 5;
    t.evict = EMBKV_EVICT_LRU;
    embkv_store *s = open_with(test_tmpdir("lru"), NULL, EMBKV_OPEN_CREATE, &t);
    if (!s) return;
    for (int64_t id = 1; id <= 10; id++) {  /* one checkpoint each */
        put(s, id);
        CHECK_RC(embkv_sync(s), EMBKV_OK);
    }
    embkv_evict_result r = evict(s);
    CHECK(r.over == 5 && r.expired == 0);
    CHECK(strcmp(present(s, 1, 11), "0000011111") == 0);
    put(s, 6);                             /* rewritten: the newest */
    put(s, 11);
    put(s, 12);
    r = evict(s);
    CHECK(r.over == 2);
    CHECK(strcmp(present(s, 1, 13), "000001001111") == 0);
    /* ties (one checkpoint): the smallest ids */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    put_range(s, 20, 26);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    r = evict(s);                          /* 11 rows: 6 of them the newest, equal */
    CHECK(r.over == 6);
    CHECK(strcmp(present(s, 20, 26), "011111") == 0);
    CHECK(embkv_count(s) == 5);
    CHECK(evict(s).over == 0);
    /* rows written since the last checkpoint are no victims, even with
     * the table 10 rows over and 5 others to take */
    put_range(s, 30, 40);
    r = evict(s);
    CHECK(r.over == 5 && embkv_count(s) == 10);
    CHECK(strcmp(present(s, 30, 40), "1111111111") == 0);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK(evict(s).over == 5);
    CHECK(strcmp(present(s, 30, 40), "0000011111") == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_lfu(void)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.max_rows = 3;
    embkv_store *s = open_with(test_tmpdir("lfu"), NULL, EMBKV_OPEN_CREATE, &t);
    if (!s) return;
    put_range(s, 1, 7);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    float v[DIM];
    for (int k = 0; k < 3; k++)
        for (int64_t id = 4; id <= 6; id++) CHECK_RC(embkv_get(s, id, v, NULL, NULL), EMBKV_OK);
    CHECK_RC(embkv_get(s, 1, v, NULL, NULL), EMBKV_OK);
    embkv_evict_result r = evict(s);
    CHECK(r.over == 3);
    CHECK(strcmp(present(s, 1, 7), "000111") == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_tiers(void)
{
    /* the DRAM cache: a row pushed since its checkpoint is newer there */
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    t.ttl_ms = DAY;
    embkv_options co = {.cache_size = 1u << 20};
    embkv_store *s = open_with(test_tmpdir("cache"), &co, EMBKV_OPEN_CREATE, &t);
    if (s) {
        embkv_session *ss = NULL;
        CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
        int64_t ids[4] = {1, 2, 3, 4};
        push_ids(ss, ids, 4);
        CHECK_RC(embkv_sync(s), EMBKV_OK);
        advance(2 * DAY);
        push_ids(ss, ids, 1);              /* row 1, after the checkpoint */
        embkv_evict_result r = evict(s);
        CHECK(r.expired == 3);
        CHECK(strcmp(present(s, 1, 5), "1000") == 0);
        float v[DIM];
        CHECK_RC(embkv_get(s, 1, v, NULL, NULL), EMBKV_OK);
        CHECK(fabsf(v[0] + 0.01f) < 1e-6f); /* two pushes of 0.5 at lr 0.01 */
        embkv_session_close(ss);
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    /* the SSD log: 50,000 rows of 576 bytes, half of them at least
     * beyond a 16 MiB pool */
    embkv_options so = {.expected_rows = 50000, .state_floats = 120, .pool_size = 16u << 20,
                        .ssd_size = 128u << 20};
    s = open_with(test_tmpdir("ssd"), &so, EMBKV_OPEN_CREATE, &t);
    if (s) {
        enum { N = 50000 };
        float v[8 * DIM];
        memset(v, 0, sizeof v);
        for (int64_t id = 0; id < N; id++) {
            v[0] = (float)id;
            CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
        }
        CHECK_RC(embkv_sync(s), EMBKV_OK);
        embkv_stats st;
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        CHECK(st.rows_ssd > N / 2);
        advance(DAY);
        put(s, N);                         /* after the checkpoint: stays */
        /* the full pool's tombstones: a pass as far as they go, the
         * next after a sync */
        embkv_evict_result r = evict(s);
        CHECK(r.scanned == N + 1 && r.expired > 0 && r.expired + r.left == N);
        uint64_t done = r.expired;
        for (int i = 0; i < 1000 && done < N && (r.left || r.expired); i++) {
            CHECK_RC(embkv_sync(s), EMBKV_OK);
            r = evict(s);
            done += r.expired;
        }
        CHECK(done == N && r.left == 0);
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        int64_t last = N;
        int tier = -1;
        CHECK_RC(embkv_locate_batch_at(s, NULL, &last, 1, &tier, NULL), EMBKV_OK);
        CHECK(st.rows == 1 && st.rows_ssd == (tier == EMBKV_TIER_SSD));  /* (the last row may be in the log) */
        CHECK(embkv_exists(s, N));
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
}

static void test_thread(void)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.max_rows = 1000;
    t.ttl_ms = DAY;
    embkv_store *s = open_with(test_tmpdir("thread"), NULL, EMBKV_OPEN_CREATE, &t);
    if (!s) return;
    embkv_debug_evict_pause(s, 0);
    put_range(s, 0, 1500);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    uint64_t n = 0;
    for (int i = 0; i < 100 && (n = embkv_count(s)) > 1000; i++) usleep(50000);
    CHECK(n <= 1000 && n >= 1000 - 1000 / 32);
    advance(DAY);
    for (int i = 0; i < 100 && (n = embkv_count(s)) > 0; i++) usleep(50000);
    CHECK(n == 0);
    embkv_train_stats st;
    CHECK_RC(embkv_train_stats_get(s, &st), EMBKV_OK);
    CHECK(st.evicted_over >= 500 && st.evicted_over + st.evicted_expired == 1500);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_options(void)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    embkv_store *s = open_with(test_tmpdir("opts"), NULL, EMBKV_OPEN_CREATE, &t);
    if (!s) return;
    t.evict = 7;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "option evict: unknown policy 7 (lfu or lru)") != NULL);
    t.evict = EMBKV_EVICT_LRU;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "option evict: lru ranks the rows past max_rows, and max_rows is not set") != NULL);
    t.evict = EMBKV_EVICT_LFU;
    t.ttl_ms = EMBKV_TTL_MAX_MS + 1;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "option ttl_ms is at most 315360000000 ms, got 315360000001") != NULL);
    /* without eviction, pulls take no permits at unlimited staleness */
    t.ttl_ms = 0;
    t.init = EMBKV_INIT_ZEROS;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    embkv_session *ss = NULL;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    int64_t id = 5;
    float v[DIM];
    CHECK_RC(embkv_pull(ss, &id, 1, v), EMBKV_OK);
    CHECK(embkv_debug_permits(s, 5) == 0);
    embkv_evict_result r;
    CHECK_RC(embkv_evict(s, &r), EMBKV_OK);
    CHECK(r.scanned == 0 && embkv_exists(s, 5));
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* H: the child adds a batch of B rows a step (each its checkpoint), with
 * ttl_steps 3: every pass evicts whole batches.  Killed at random. */
#define B 200
static void crash_child(const char *dir, int round)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    t.ttl_steps = 3;
    embkv_options o = {.dim = DIM, .expected_rows = 4000};
    embkv_store *s = NULL;
    if (embkv_open(dir, &o, round == 0 ? EMBKV_OPEN_CREATE : 0, &s) != EMBKV_OK ||
        embkv_train_configure(s, &t) != EMBKV_OK)
        _exit(3);
    embkv_debug_evict_pause(s, 1);
    char mark[800];
    snprintf(mark, sizeof mark, "%s.open", dir);
    write_mark(mark, "open");
    embkv_session *ss = NULL;
    if (embkv_session_open(s, &ss) != EMBKV_OK)
        _exit(3);
    int64_t ids[B];
    static float v[B * DIM], g[B * DIM];
    for (int64_t k = 1000 * (round + 1);; k++) {
        for (int i = 0; i < B; i++) ids[i] = k * B + i;
        if (embkv_pull(ss, ids, B, v) != EMBKV_OK || embkv_push(ss, ids, B, g, 0, NULL) != EMBKV_OK ||
            embkv_evict(s, NULL) != EMBKV_OK || embkv_sync(s) != EMBKV_OK)
            _exit(4);
    }
}

static void test_crash(void)
{
    const char *dir = test_tmpdir("crash");
    char path[700];
    snprintf(path, sizeof path, "%s", dir);
    srand((unsigned)time(NULL));
    for (int round = 0; round < 4; round++) {
        char mark[800];
        snprintf(mark, sizeof mark, "%s.open", path);
        unlink(mark);
        pid_t pid = fork();
        if (pid == 0) crash_child(path, round);
        for (int i = 0; i < 600 && access(mark, F_OK) != 0; i++) usleep(10000);
        usleep(20000 + (useconds_t)(rand() % 300000));
        kill(pid, SIGKILL);
        int wst;
        waitpid(pid, &wst, 0);
        CHECK(WIFSIGNALED(wst));
        embkv_options o = {0};
        embkv_store *s = NULL;
        CHECK_RC(embkv_open(path, &o, 0, &s), EMBKV_OK);
        if (!s) return;
        CHECK_RC(embkv_check(s), EMBKV_OK);
        /* whole batches, the ones of the last three steps of some round */
        uint64_t whole = 0, partial = 0;
        for (int r = 0; r <= round; r++)
            for (int64_t k = 1000 * (r + 1); k < 1000 * (r + 1) + 999; k++) {
                int have = 0;
                for (int i = 0; i < B; i++) have += embkv_exists(s, k * B + i);
                whole += have == B;
                partial += have != 0 && have != B;
            }
        printf("  H: round %d: %llu whole batches, %llu partial\n", round, (unsigned long long)whole,
               (unsigned long long)partial);
        CHECK(partial == 0);
        CHECK(whole <= 3 && embkv_count(s) == whole * B);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
}

static void test_cut_mark(void)
{
    const char *dir = test_tmpdir("cutmark");
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.ttl_ms = 10 * DAY;
    embkv_store *s = open_with(dir, NULL, EMBKV_OPEN_CREATE, &t);
    if (!s) return;
    put_range(s, 1, 3);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    int64_t at = clock_now;
    pid_t pid = fork();
    if (pid == 0) {
        /* Day 100: a write, and a checkpoint whose flush fails after the
         * mark of its epoch is written; then the process dies. */
        embkv_debug_clock_ms(at + 100 * DAY);
        embkv_options none = {0};
        embkv_store *c = NULL;
        if (embkv_open(dir, &none, 0, &c) != EMBKV_OK || embkv_train_configure(c, &t) != EMBKV_OK)
            _exit(3);
        float v[DIM] = {9, 9, 9, 9};
        if (embkv_put(c, 5, v, NULL, 0) != EMBKV_OK)
            _exit(4);
        embkv_debug_fail_syncs(1);
        if (embkv_sync(c) != EMBKV_IO)
            _exit(5);
        kill(getpid(), SIGKILL);
        _exit(6);
    }
    int wst;
    waitpid(pid, &wst, 0);
    CHECK(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
    /* Day 0 again: row 5 is gone with its epoch, whose mark (day 100) is
     * in the root, past the durable epoch; the checkpoint of that epoch
     * now is of day 0, and no mark of day 100 is left. */
    embkv_options none = {0};
    s = open_with(dir, &none, 0, &t);
    if (!s) return;
    CHECK(!embkv_exists(s, 5) && embkv_count(s) == 2);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    uint64_t ep[128], ms[128];
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    uint64_t day0 = (uint64_t)((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000 + at);  /* the test's clock */
    size_t nm = embkv_debug_marks(s, ep, ms, 128);
    CHECK(nm > 0 && nm <= 128 && ep[nm - 1] == st.durable_epoch + 1);
    CHECK(nm > 0 && nm <= 128 && ms[nm - 1] >= day0 + 99 * DAY);
    put(s, 7);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    size_t nm2 = embkv_debug_marks(s, ep, ms, 128);
    CHECK(nm2 == nm && nm2 <= 128 && ep[nm2 - 1] == st.durable_epoch + 1);
    for (size_t i = 0; i < nm2 && i < 128; i++)
        CHECK(ms[i] < day0 + DAY && (i == 0 || ep[i] > ep[i - 1]));
    advance(2 * DAY);
    put(s, 8);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    advance(8 * DAY);                      /* day 10: rows 1, 2 and 7 are 10 days old */
    embkv_evict_result r = evict(s);
    CHECK(r.expired == 3 && r.scanned == 4);
    CHECK(strcmp(present(s, 1, 9), "00000001") == 0);
    advance(2 * DAY);                      /* day 12: row 8 */
    CHECK(evict(s).expired == 1 && embkv_count(s) == 0);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

int main(void)
{
    test_ttl_ms();
    test_ttl_steps();
    test_lru();
    test_lfu();
    test_tiers();
    test_thread();
    test_options();
    test_crash();
    test_cut_mark();
    return test_summary("test_evict");
}
