/*
 * test_tier_bg.c - the SSD tier's background work through the C API:
 * look-ahead (queued counts, pulls served from the stage without log reads,
 * rows changed after they were staged, the stage's bound, a full stage
 * keeping the next batch's rows), promotion of rows
 * reads keep hot, compaction of a log that deletes left mostly garbage (the
 * files shrink, every row survives, reopen), and SIGKILL while look-ahead,
 * promotion, compaction and demotion run: the reopened store equals the
 * last sync exactly (every row's vector and clock).
 */
#include "embkv.h"
#include "check.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIM 16
#include "tier_rows.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static bool small_scale(void)
{
    const char *sc = getenv("EMBKV_TEST_SCALE");
    return sc && atof(sc) > 0 && atof(sc) < 1;
}

static embkv_store *open_loaded(const char *dir, uint64_t *gen, size_t n, uint64_t ssd_size)
{
    embkv_options o = {.dim = DIM, .expected_rows = n, .pool_size = 16u << 20, .ssd_size = ssd_size};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    int rc;
    CHECK(load_rows(s, gen, n, &rc) == n);
    CHECK_RC(rc, EMBKV_OK);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
    return s;
}

static embkv_tier tier_of(embkv_store *s, int64_t id)
{
    embkv_rowinfo info;
    return embkv_get(s, id, NULL, NULL, &info) == EMBKV_OK ? info.tier : EMBKV_TIER_DRAM;
}

/* Up to want ids whose rows are in the log, from id `from` on. */
static size_t log_ids(embkv_store *s, const uint64_t *gen, size_t n, size_t from, int64_t *out, size_t want)
{
    size_t k = 0;
    for (size_t id = from; id < n && k < want; id++) {
        if (!gen[id])
            continue;
        /* A read of a log row would offer it for promotion: where it is
         * comes from the index alone (embkv_locate_batch_at reads nothing). */
        int tier;
        uint8_t f;
        int64_t i64 = (int64_t)id;
        if (embkv_locate_batch_at(s, NULL, &i64, 1, &tier, &f) == EMBKV_OK && f && tier == EMBKV_TIER_SSD)
            out[k++] = (int64_t)id;
    }
    return k;
}

static uint64_t ssd_reads(embkv_store *s)
{
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    return st.ssd_reads;
}

static void test_lookahead(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/la", root);
    size_t n = 200000;
    uint64_t *gen = calloc(n, sizeof *gen);
    embkv_store *s = open_loaded(dir, gen, n, 256u << 20);

    /* Bad calls, and calls that queue nothing. */
    size_t q = 99;
    CHECK_RC(embkv_lookahead(NULL, NULL, 0, &q), EMBKV_INVALID);
    CHECK(q == 0);
    CHECK_RC(embkv_lookahead(s, NULL, 3, &q), EMBKV_INVALID);
    int64_t absent[3] = {-1, (int64_t)n + 5, (int64_t)n + 6};
    CHECK_RC(embkv_lookahead(s, absent, 3, &q), EMBKV_OK);
    CHECK(q == 0);
    int64_t in_pool[64];
    size_t np = 0;
    for (size_t id = n; id-- > 0 && np < 64;)
        if (tier_of(s, (int64_t)id) == EMBKV_TIER_PM)
            in_pool[np++] = (int64_t)id;
    CHECK(np == 64);
    CHECK_RC(embkv_lookahead(s, in_pool, np, &q), EMBKV_OK);
    CHECK(q == 0);

    /* A batch of log rows, with duplicates: each queued once; a second
     * call queues nothing; the pull is served without log reads. */
    enum { B = 512 };
    int64_t ids[2 * B];
    size_t k = log_ids(s, gen, n, 1000, ids, B);
    CHECK(k == B);
    memcpy(ids + B, ids, B * sizeof *ids);
    uint64_t r0 = ssd_reads(s);
    CHECK_RC(embkv_lookahead(s, ids, 2 * B, &q), EMBKV_OK);
    CHECK(q == B);
    CHECK_RC(embkv_lookahead(s, ids, B, &q), EMBKV_OK);
    CHECK(q == 0);
    /* Wait for the background read (the stats count it). */
    for (int i = 0; i < 5000 && ssd_reads(s) < r0 + B; i++)
        usleep(1000);
    CHECK(ssd_reads(s) == r0 + B);
    float *out = malloc(2 * B * DIM * sizeof *out);
    uint8_t found[2 * B];
    CHECK_RC(embkv_get_batch(s, ids, 2 * B, out, found, NULL), EMBKV_OK);
    size_t wrong = 0;
    for (size_t j = 0; j < 2 * B; j++)
        wrong += !found[j] || !vec_is(out + j * DIM, ids[j], gen[ids[j]]);
    CHECK(wrong == 0);
    CHECK(ssd_reads(s) == r0 + B);  /* every row came from the stage */
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.lookahead_queued == B);
    CHECK(st.lookahead_hits + st.lookahead_late == B);
    /* Pulled rows stay staged for the push that follows a pull: a second
     * read does not read the log either, a write drops them. */
    CHECK(st.lookahead_staged == B);
    CHECK_RC(embkv_get_batch(s, ids, B, out, found, NULL), EMBKV_OK);
    CHECK(ssd_reads(s) == r0 + B);
    for (size_t j = 0; j < B; j++) {
        gen[ids[j]] += 3;
        CHECK_RC(put_gen(s, ids[j], gen[ids[j]]), EMBKV_OK);
    }
    CHECK(ssd_reads(s) == r0 + B);  /* the writes found the old rows staged */
    /* (A row the tier's thread promoted meanwhile keeps a stale copy in
     * the stage until it is dropped as the oldest: no staged count here.) */
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.lookahead_hits + st.lookahead_late == B);

    /* Staged, then written or deleted before the pull: the pull sees the
     * new state, never the staged copy. */
    k = log_ids(s, gen, n, 20000, ids, B);
    CHECK(k == B);
    CHECK_RC(embkv_lookahead(s, ids, B, &q), EMBKV_OK);
    CHECK(q == B);
    for (size_t j = 0; j < B; j += 2) {
        if (j % 4 == 0) {
            gen[ids[j]] += 7;
            CHECK_RC(put_gen(s, ids[j], gen[ids[j]]), EMBKV_OK);
        } else {
            CHECK_RC(embkv_delete(s, ids[j]), EMBKV_OK);
            gen[ids[j]] = 0;
        }
    }
    CHECK_RC(embkv_get_batch(s, ids, B, out, found, NULL), EMBKV_OK);
    wrong = 0;
    for (size_t j = 0; j < B; j++)
        wrong += found[j] != (gen[ids[j]] != 0) || (found[j] && !vec_is(out + j * DIM, ids[j], gen[ids[j]]));
    CHECK(wrong == 0);

    /* Many rows at once: at most the stage's capacity are queued (here the
     * stage, 32 MiB of 128-byte records, holds them all: the bound itself
     * is not reached by a table this small). */
    size_t many = small_scale() ? 20000 : 60000;
    int64_t *big = malloc(many * sizeof *big);
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);  /* promotions the pulls above queued are done */
    size_t nb = log_ids(s, gen, n, 0, big, many);
    /* (rows the phase above staged and did not write stay staged: they
     * would not be queued again) */
    uint8_t *staged = calloc(n, 1);
    for (size_t j = 0; j < B; j++)
        staged[ids[j]] = 1;
    size_t w = 0;
    for (size_t j = 0; j < nb; j++)
        if (!staged[big[j]])
            big[w++] = big[j];
    nb = w;
    free(staged);
    CHECK(nb > 4096);
    CHECK_RC(embkv_lookahead(s, big, nb, &q), EMBKV_OK);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(q > 0 && q <= st.lookahead_capacity);
    CHECK(st.lookahead_capacity >= 1024);
    CHECK(nb > st.lookahead_capacity || q == nb);
    /* Queued again while staged or in flight: nothing more to read.  Then
     * every row reads correctly, staged or not. */
    size_t q2;
    CHECK_RC(embkv_lookahead(s, big + nb / 2, nb - nb / 2, &q2), EMBKV_OK);
    CHECK(q2 == 0);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);  /* with rows still staged */

    /* Without an SSD tier: nothing to queue. */
    char plain[700];
    snprintf(plain, sizeof plain, "%s/la-plain", root);
    embkv_options po = {.dim = DIM, .pool_size = 16u << 20};
    CHECK_RC(embkv_open(plain, &po, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    CHECK_RC(put_gen(s, 1, 1), EMBKV_OK);
    int64_t one = 1;
    CHECK_RC(embkv_lookahead(s, &one, 1, &q), EMBKV_OK);
    CHECK(q == 0);
    CHECK_RC(embkv_tier_idle(s, 10), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    embkv_destroy(plain);
    embkv_destroy(dir);
    free(big);
    free(out);
    free(gen);
}

/* With the stage full, the rows a pull offers (for the push that follows
 * it) never take the buffers of rows look-ahead staged for a later batch:
 * that batch's pull still finds every one of them staged. */
static void test_lookahead_full_stage(const char *root)
{
    enum { WIDE = 8192, ROWS = 2400, NEXT = 600, NOW = 800 };
    char dir[600];
    snprintf(dir, sizeof dir, "%s/la-wide", root);
    embkv_options o = {.dim = WIDE, .expected_rows = ROWS, .pool_size = 16u << 20, .ssd_size = 160u << 20};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s)
        return;
    float *v = malloc((size_t)NOW * WIDE * sizeof *v);
    for (int64_t id = 0; id < ROWS; id++) {
        for (int i = 0; i < WIDE; i++)
            v[i] = (float)id + (float)i / WIDE;
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
    int64_t in_log[ROWS];
    size_t k = 0;
    for (int64_t id = 0; id < ROWS; id++) {
        int tier;
        uint8_t f;
        if (embkv_locate_batch_at(s, NULL, &id, 1, &tier, &f) == EMBKV_OK && f && tier == EMBKV_TIER_SSD)
            in_log[k++] = id;
    }
    CHECK(k >= NEXT + NOW);
    const int64_t *next = in_log, *now = in_log + NEXT;
    uint64_t r0 = ssd_reads(s);
    size_t q = 0;
    CHECK_RC(embkv_lookahead(s, next, NEXT, &q), EMBKV_OK);
    CHECK(q == NEXT);
    for (int i = 0; i < 5000 && ssd_reads(s) < r0 + NEXT; i++)
        usleep(1000);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.lookahead_capacity < NEXT + NOW);  /* the pull below fills the stage */
    uint8_t found[NOW];
    CHECK_RC(embkv_get_batch(s, now, NOW, v, found, NULL), EMBKV_OK);
    uint64_t r1 = ssd_reads(s);
    CHECK_RC(embkv_get_batch(s, next, NEXT, v, found, NULL), EMBKV_OK);
    size_t wrong = 0;
    for (size_t j = 0; j < NEXT; j++)
        wrong += !found[j] || v[j * WIDE] != (float)next[j] || v[j * WIDE + WIDE - 1] != (float)next[j] +
                 (float)(WIDE - 1) / WIDE;
    CHECK(wrong == 0);
    CHECK(ssd_reads(s) == r1);  /* every announced row came from the stage */
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.lookahead_hits + st.lookahead_late == NEXT);
    CHECK(st.lookahead_wasted == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    embkv_destroy(dir);
    free(v);
}

static void test_promotion(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/promo", root);
    size_t n = 200000;
    uint64_t *gen = calloc(n, sizeof *gen);
    embkv_store *s = open_loaded(dir, gen, n, 256u << 20);
    enum { H = 300 };
    int64_t hot[H];
    CHECK(log_ids(s, gen, n, 5000, hot, H) == H);
    /* Read often, never written: admission lets them back into the pool. */
    float *out = malloc(H * DIM * sizeof *out);
    for (int round = 0; round < 6; round++)
        CHECK_RC(embkv_get_batch(s, hot, H, out, NULL, NULL), EMBKV_OK);
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
    size_t in_pm = 0;
    for (size_t j = 0; j < H; j++)
        in_pm += tier_of(s, hot[j]) == EMBKV_TIER_PM;
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(in_pm > H * 9 / 10);
    CHECK(st.promotions >= in_pm);
    printf("promotion: %zu of %d hot log rows in the pool, %llu promotions\n", in_pm, H,
           (unsigned long long)st.promotions);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    /* Where a row lives is kept; how hot it was is not (DRAM only). */
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    size_t after = 0;
    for (size_t j = 0; j < H; j++)
        after += tier_of(s, hot[j]) == EMBKV_TIER_PM;
    CHECK(after == in_pm);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    embkv_destroy(dir);
    free(out);
    free(gen);
}

static void test_compaction(const char *root)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/compact", root);
    size_t n = 100000;
    uint64_t *gen = calloc(n, sizeof *gen);
    /* Segments of 1 or 3 MiB (ssd_size / 16): several hold the log's rows. */
    embkv_store *s = open_loaded(dir, gen, n, small_scale() ? 16u << 20 : 48u << 20);
    embkv_stats before, st;
    CHECK_RC(embkv_stats_get(s, &before), EMBKV_OK);
    /* Delete 3 of every 4 log rows: segments become mostly garbage.  (In
     * rounds: a delete of a synced row takes a record until the sync.) */
    int64_t *ids = malloc(n * sizeof *ids);
    size_t k = log_ids(s, gen, n, 0, ids, n), deleted = 0;
    for (size_t j = 0; j < k; j++) {
        if (j % 4 == 3)
            continue;
        CHECK_RC(embkv_delete(s, ids[j]), EMBKV_OK);
        gen[ids[j]] = 0;
        if (++deleted % 4096 == 0)
            CHECK_RC(embkv_sync(s), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(s), EMBKV_OK);  /* the deletes' log records are garbage after it */
    CHECK_RC(embkv_tier_idle(s, 120000), EMBKV_OK);
    CHECK_RC(embkv_sync(s), EMBKV_OK);  /* compacted segments go after the next sync */
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    printf("compaction: %llu segments, %llu file bytes -> %llu segments, %llu file bytes; %llu compactions, "
           "%llu rows rewritten, write amplification %.2f\n",
           (unsigned long long)before.ssd_segments, (unsigned long long)before.ssd_file_bytes,
           (unsigned long long)st.ssd_segments, (unsigned long long)st.ssd_file_bytes,
           (unsigned long long)st.compactions, (unsigned long long)st.compacted_rows, st.write_amplification);
    CHECK(st.compactions > 0);
    CHECK(st.compacted_rows > 0);
    CHECK(st.ssd_file_bytes < before.ssd_file_bytes);
    CHECK(st.rows_ssd > 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    check_all(s, gen, n);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    embkv_destroy(dir);
    free(ids);
    free(gen);
}

/* The child's work per step: pull a batch after looking it up ahead, write
 * most of it (a training step), delete some, sync; marks the step. */
#define KILL_N 100000
#define KILL_BATCH 512

static bool killed_at_load(size_t id) { return id < KILL_N * 6 / 10 && id % 4 != 3; }

static void step_ids(rng_t *r, int64_t *ids)
{
    for (size_t j = 0; j < KILL_BATCH; j++)
        ids[j] = (int64_t)rnd_below(r, KILL_N);
}

/* Summed over the kill rounds: work the child had done by its last mark. */
static unsigned long long kill_compactions, kill_promotions, kill_hits;

static void test_kill(const char *root, int round)
{
    char dir[600], mark[700];
    snprintf(dir, sizeof dir, "%s/kill%d", root, round);
    snprintf(mark, sizeof mark, "%s/kill%d.mark", root, round);
    size_t n = KILL_N;
    uint64_t seed = (uint64_t)round * 1234567 + 3;
    pid_t pid = fork();
    if (pid == 0) {
        embkv_options o = {.dim = DIM, .expected_rows = n, .pool_size = 16u << 20, .ssd_size = 48u << 20};
        embkv_store *s;
        if (embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s) != EMBKV_OK)
            _exit(3);
        for (size_t id = 0; id < n; id++)
            if (put_gen(s, (int64_t)id, 1) != EMBKV_OK)
                _exit(4);
        if (embkv_sync(s) != EMBKV_OK)
            _exit(5);
        /* The oldest rows are the log's: deleting most of them leaves
         * garbage for compaction to work on while the steps run. */
        for (size_t id = 0; id < n; id++)
            if (killed_at_load(id) && (embkv_delete(s, (int64_t)id) != EMBKV_OK ||
                                       (id % 4096 == 0 && embkv_sync(s) != EMBKV_OK)))
                _exit(10);
        if (embkv_sync(s) != EMBKV_OK)
            _exit(5);
        write_mark(mark, "1 0 0 0\n");
        rng_t r = {seed}, ahead = {seed};
        int64_t ids[KILL_BATCH], next[KILL_BATCH];
        float out[KILL_BATCH * DIM];
        step_ids(&ahead, next);
        for (uint64_t step = 2;; step++) {
            memcpy(ids, next, sizeof ids);
            step_ids(&r, ids);  /* the same draw as `ahead` made */
            step_ids(&ahead, next);
            if (embkv_lookahead(s, next, KILL_BATCH, NULL) != EMBKV_OK)
                _exit(6);
            if (embkv_get_batch(s, ids, KILL_BATCH, out, NULL, NULL) != EMBKV_OK)
                _exit(7);
            for (size_t j = 0; j < KILL_BATCH; j++) {
                if (j % 16 == 5) {
                    /* (absent already: deleted by an earlier step) */
                    int drc = embkv_delete(s, ids[j]);
                    if (drc != EMBKV_OK && drc != EMBKV_NOTFOUND)
                        _exit(11);  /* the model takes it as deleted */
                } else if (put_gen(s, ids[j], step) != EMBKV_OK)
                    _exit(8);
            }
            if (step % 4 == 0) {
                if (embkv_sync(s) != EMBKV_OK)
                    _exit(9);
                embkv_stats st;
                embkv_stats_get(s, &st);
                char text[128];
                snprintf(text, sizeof text, "%llu %llu %llu %llu\n", (unsigned long long)step,
                         (unsigned long long)st.compactions, (unsigned long long)st.promotions,
                         (unsigned long long)st.lookahead_hits);
                write_mark(mark, text);
            }
        }
    }
    /* The kill lands during the steps, after the setup's mark. */
    for (int i = 0; i < 120000 && access(mark, F_OK) != 0; i++)
        usleep(1000);
    rng_t pr = {(uint64_t)round + 17};
    usleep((useconds_t)(300000 + rnd_below(&pr, 2500000)));
    kill(pid, SIGKILL);
    int wst;
    waitpid(pid, &wst, 0);
    CHECK(WIFSIGNALED(wst));
    if (WIFEXITED(wst))
        fprintf(stderr, "kill round %d: the child exited with %d (an operation failed)\n", round, WEXITSTATUS(wst));
    unsigned long long synced = 0, compactions = 0, promotions = 0, hits = 0;
    FILE *f = fopen(mark, "r");
    if (f) {
        if (fscanf(f, "%llu %llu %llu %llu", &synced, &compactions, &promotions, &hits) != 4)
            synced = 0;
        fclose(f);
    }
    kill_compactions += compactions;
    kill_promotions += promotions;
    kill_hits += hits;
    /* Replay: the model after the last marked sync and after the next one
     * (a kill between a sync and its mark). */
    uint64_t *model = calloc(n, sizeof *model), *prev = calloc(n, sizeof *prev);
    uint64_t *clk = calloc(n, sizeof *clk), *prev_clk = calloc(n, sizeof *prev_clk);
    for (size_t id = 0; id < n; id++)
        model[id] = killed_at_load(id) ? 0 : 1;
    memcpy(prev, model, n * sizeof *model);
    rng_t r = {seed};
    int64_t ids[KILL_BATCH];
    CHECK(synced >= 1);
    uint64_t last = synced > 1 ? synced + 4 : 4;
    for (uint64_t step = 2; step <= last; step++) {
        if (step % 4 == 1 || step == 2) {
            memcpy(prev, model, n * sizeof *model);
            memcpy(prev_clk, clk, n * sizeof *clk);
        }
        step_ids(&r, ids);
        for (size_t j = 0; j < KILL_BATCH; j++) {
            if (j % 16 == 5) {
                model[ids[j]] = 0;
                clk[ids[j]] = 0;
            } else {
                clk[ids[j]] = model[ids[j]] ? clk[ids[j]] + 1 : 0;
                model[ids[j]] = step;
            }
        }
    }
    /* prev: as of the marked sync (step `synced`, or the load when none);
     * model/clk: as of the sync after it. */
    embkv_store *s;
    int rc = embkv_open(dir, NULL, 0, &s);
    CHECK_RC(rc, EMBKV_OK);
    if (rc == EMBKV_OK) {
        size_t eq_prev, eq_next;
        count_equal(s, n, prev, prev_clk, model, clk, &eq_prev, &eq_next);
        CHECK(eq_prev == n || eq_next == n);
        if (eq_prev != n && eq_next != n)
            fprintf(stderr, "kill round %d: synced %llu, %zu rows equal that sync, %zu the next, of %zu\n", round,
                    synced, eq_prev, eq_next, n);
        CHECK_RC(embkv_check(s), EMBKV_OK);
        embkv_stats st;
        embkv_stats_get(s, &st);
        CHECK(st.rows_pm + st.rows_ssd == st.rows);
        printf("kill round %d: after step %llu (%llu compactions, %llu promotions, %llu look-ahead hits before), "
               "%llu rows in the log\n", round, synced, compactions, promotions, hits,
               (unsigned long long)st.rows_ssd);
        embkv_close(s);
    }
    embkv_destroy(dir);
    free(model);
    free(prev);
    free(clk);
    free(prev_clk);
}

int main(void)
{
    const char *root = test_tmpdir("tier_bg");
    mkdir(root, 0755);
    double t0 = now_s();
    test_lookahead(root);
    test_lookahead_full_stage(root);
    double t1 = now_s();
    test_promotion(root);
    double t2 = now_s();
    test_compaction(root);
    double t3 = now_s();
    int rounds = 2; /* (test_model_tier kills at random moments too) */
    for (int i = 0; i < rounds; i++)
        test_kill(root, i);
    /* The kills landed while compaction, promotion and look-ahead ran. */
    CHECK(kill_compactions > 0 && kill_promotions > 0 && kill_hits > 0);
    printf("seconds: look-ahead %.1f, promotion %.1f, compaction %.1f, kills %.1f\n", t1 - t0, t2 - t1, t3 - t2,
           now_s() - t3);
    return test_summary("test_tier_bg");
}
