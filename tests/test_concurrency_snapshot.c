/*
 * test_concurrency_snapshot.c - write groups and snapshot reads.
 *
 *  A. groups seen whole: a writer rewrites rows 0..99 with the value k in
 *     one group per k; readers reading all 100 through a snapshot must see
 *     one k for all of them (and k never goes back), thousands of times.
 *  B. no gap on replace: a writer replaces id 1 (EMBKV_PUT_RESET, and
 *     delete + put in one group); snapshot readers always find it.
 *  C. one version per row: updates add 1 to vec[0] and the clock; a reader
 *     of vec and clock together must always find vec[0] == clock.
 *  D. a snapshot's view is fixed: rows updated, deleted and created after it
 *     read as they were (also after syncs and enough churn to reuse the
 *     records of freed versions); changed_ids lists the changed and deleted.
 *  E. rules: sync or snapshot inside a group are EMBKV_BUSY; groups nest.
 *  F. SIGKILL during pushes that create rows, with a checkpointing thread:
 *     each push is in the reopened store entirely or not at all.
 *  G. an open snapshot holds the versions it may read, not every version
 *     written beside it: in a pool of about 2,800 records, 20,000 updates of
 *     one row (and of a second row while a second snapshot is open) all
 *     land, and each snapshot still reads its rows as they were; the same
 *     with a checkpoint after each of 6,000 updates.
 * Also built under TSan (tests/test_concurrency*.c), where it must be clean.
 */
#include "embkv.h"
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>

#define DIM 8
#define NROWS 100
static embkv_store *S;
static atomic_bool stop;
static double scale = 1.0;

static uint64_t scaled(double n, uint64_t min)
{
    uint64_t v = (uint64_t)(n * scale);
    return v < min ? min : v;
}

static embkv_store *open_store(const char *dir, uint32_t sf)
{
    embkv_options o = {0};
    o.dim = DIM;
    o.state_floats = sf;
    o.expected_rows = 1000;
    o.pool_size = 64ull << 20;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) exit(test_summary("test_concurrency_snapshot"));
    return s;
}

static void fill(float *v, float x)
{
    for (int i = 0; i < DIM; i++) v[i] = x;
}

/* ------------------------------------------------------------ A */

static atomic_long a_reads, a_mixed;

static void *a_writer(void *arg)
{
    long rounds = (long)(intptr_t)arg;
    float v[DIM];
    for (long k = 2; k <= rounds + 1; k++) {
        fill(v, (float)k);
        TCHECK_RC(embkv_group_begin(S), EMBKV_OK);
        for (int64_t id = 0; id < NROWS; id++) TCHECK_RC(embkv_put(S, id, v, NULL, 0), EMBKV_OK);
        embkv_group_end(S);
        if (k % 50 == 0) TCHECK_RC(embkv_sync(S), EMBKV_OK);
    }
    atomic_store(&stop, true);
    return NULL;
}

static void *a_reader(void *arg)
{
    (void)arg;
    int64_t ids[NROWS];
    float out[NROWS * DIM];
    embkv_rowinfo info[NROWS];
    for (int i = 0; i < NROWS; i++) ids[i] = NROWS - 1 - i;
    float last = 0;
    while (!atomic_load(&stop)) {
        embkv_snapshot *snap = NULL;
        TCHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_OK);
        size_t missing = 1;
        TCHECK_RC(embkv_get_batch_at(S, snap, ids, NROWS, out, info, NULL, &missing), EMBKV_OK);
        TCHECK(missing == 0);
        bool mixed = false;
        for (int i = 0; i < NROWS; i++)
            for (int j = 0; j < DIM; j++) mixed |= out[i * DIM + j] != out[0];
        /* Each row was written once per k, so its clock is k - 1 too. */
        for (int i = 0; i < NROWS; i++) mixed |= info[i].clock != (uint64_t)out[0] - 1;
        if (mixed) atomic_fetch_add(&a_mixed, 1);
        TCHECK(out[0] >= last);
        last = out[0];
        embkv_snapshot_close(snap);
        atomic_fetch_add(&a_reads, 1);
    }
    return NULL;
}

static void test_groups_whole(void)
{
    S = open_store(test_tmpdir("a"), 0);
    float v[DIM];
    fill(v, 0);
    for (int64_t id = 0; id < NROWS; id++) CHECK_RC(embkv_put(S, id, v, NULL, 0), EMBKV_OK);
    /* Value 1 at clock 0; the writer's k-th value then has clock k - 1. */
    fill(v, 1);
    for (int64_t id = 0; id < NROWS; id++) CHECK_RC(embkv_put(S, id, v, NULL, EMBKV_PUT_RESET), EMBKV_OK);
    atomic_store(&stop, false);
    pthread_t w, r[2];
    long rounds = (long)scaled(3000, 300);
    for (int i = 0; i < 2; i++) pthread_create(&r[i], NULL, a_reader, NULL);
    pthread_create(&w, NULL, a_writer, (void *)(intptr_t)rounds);
    pthread_join(w, NULL);
    for (int i = 0; i < 2; i++) pthread_join(r[i], NULL);
    fold_thread_checks();
    printf("A: %ld snapshot reads of %d rows during %ld group commits, %ld mixed\n", atomic_load(&a_reads), NROWS,
           rounds, atomic_load(&a_mixed));
    CHECK(atomic_load(&a_reads) > 0);
    CHECK(atomic_load(&a_mixed) == 0);
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK_RC(embkv_close(S), EMBKV_OK);
}

/* ------------------------------------------------------------ B */

static atomic_long b_reads, b_missing;

static void *b_writer(void *arg)
{
    long rounds = (long)(intptr_t)arg;
    float v[DIM];
    for (long k = 0; k < rounds; k++) {
        fill(v, (float)k);
        if (k % 2) {
            TCHECK_RC(embkv_put(S, 1, v, NULL, EMBKV_PUT_RESET), EMBKV_OK);
        } else {
            TCHECK_RC(embkv_group_begin(S), EMBKV_OK);
            TCHECK_RC(embkv_delete(S, 1), EMBKV_OK);
            TCHECK_RC(embkv_put(S, 1, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
            embkv_group_end(S);
        }
        if (k % 100 == 0) TCHECK_RC(embkv_sync(S), EMBKV_OK);
    }
    atomic_store(&stop, true);
    return NULL;
}

static void *b_reader(void *arg)
{
    (void)arg;
    int64_t id = 1;
    float out[DIM];
    while (!atomic_load(&stop)) {
        embkv_snapshot *snap = NULL;
        TCHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_OK);
        uint8_t found = 0;
        TCHECK_RC(embkv_get_batch_at(S, snap, &id, 1, out, NULL, &found, NULL), EMBKV_OK);
        if (!found) atomic_fetch_add(&b_missing, 1);
        embkv_snapshot_close(snap);
        /* A single put that replaces is one switch: never absent, even
         * without a snapshot (the delete + put groups may be). */
        atomic_fetch_add(&b_reads, 1);
    }
    return NULL;
}

static void test_replace_gap(void)
{
    S = open_store(test_tmpdir("b"), 0);
    float v[DIM];
    fill(v, 0);
    CHECK_RC(embkv_put(S, 1, v, NULL, 0), EMBKV_OK);
    atomic_store(&stop, false);
    pthread_t w, r;
    long rounds = (long)scaled(20000, 2000);
    pthread_create(&r, NULL, b_reader, NULL);
    pthread_create(&w, NULL, b_writer, (void *)(intptr_t)rounds);
    pthread_join(w, NULL);
    pthread_join(r, NULL);
    fold_thread_checks();
    printf("B: %ld snapshot point reads during %ld replaces, %ld missing\n", atomic_load(&b_reads), rounds,
           atomic_load(&b_missing));
    CHECK(atomic_load(&b_missing) == 0);
    embkv_rowinfo info;
    CHECK_RC(embkv_get(S, 1, v, NULL, &info), EMBKV_OK);
    CHECK(info.clock == 0);  /* every replace starts the row anew */
    CHECK(v[0] == (float)(rounds - 1));
    CHECK_RC(embkv_close(S), EMBKV_OK);
}

/* ------------------------------------------------------------ C */

static atomic_long c_reads, c_torn;

static int add_one(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    (void)ctx, (void)i, (void)id, (void)state;
    if (!vec) return 1;
    vec[0] += 1;
    return 0;
}

static void *c_writer(void *arg)
{
    long rounds = (long)(intptr_t)arg;
    int64_t ids[NROWS];
    for (int i = 0; i < NROWS; i++) ids[i] = i;
    for (long k = 0; k < rounds; k++) {
        size_t n = 0;
        TCHECK_RC(embkv_update_batch(S, ids, NROWS, add_one, NULL, 0, &n), EMBKV_OK);
        TCHECK(n == NROWS);
    }
    atomic_store(&stop, true);
    return NULL;
}

static void *c_reader(void *arg)
{
    bool with_snap = arg != NULL;
    int64_t ids[NROWS];
    float out[NROWS * DIM];
    embkv_rowinfo info[NROWS];
    for (int i = 0; i < NROWS; i++) ids[i] = i;
    while (!atomic_load(&stop)) {
        embkv_snapshot *snap = NULL;
        if (with_snap) TCHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_OK);
        TCHECK_RC(embkv_get_batch_at(S, snap, ids, NROWS, out, info, NULL, NULL), EMBKV_OK);
        for (int i = 0; i < NROWS; i++)
            if (out[i * DIM] != (float)info[i].clock) atomic_fetch_add(&c_torn, 1);
        embkv_snapshot_close(snap);
        atomic_fetch_add(&c_reads, NROWS);
    }
    return NULL;
}

static void test_one_version(void)
{
    S = open_store(test_tmpdir("c"), 0);
    float v[DIM];
    fill(v, 0);
    for (int64_t id = 0; id < NROWS; id++) CHECK_RC(embkv_put(S, id, v, NULL, 0), EMBKV_OK);
    atomic_store(&stop, false);
    pthread_t w, r[2];
    long rounds = (long)scaled(4000, 400);
    pthread_create(&r[0], NULL, c_reader, NULL);
    pthread_create(&r[1], NULL, c_reader, (void *)1);
    pthread_create(&w, NULL, c_writer, (void *)(intptr_t)rounds);
    pthread_join(w, NULL);
    for (int i = 0; i < 2; i++) pthread_join(r[i], NULL);
    fold_thread_checks();
    printf("C: %ld rows read with their clock during %ld batch updates, %ld torn\n", atomic_load(&c_reads), rounds,
           atomic_load(&c_torn));
    CHECK(atomic_load(&c_torn) == 0);
    CHECK_RC(embkv_close(S), EMBKV_OK);
}

/* ------------------------------------------------------------ D */

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void test_fixed_view(void)
{
    S = open_store(test_tmpdir("d"), 2);
    float v[DIM], st[2] = {0.5f, 0.25f};
    for (int64_t id = 0; id < 200; id++) {
        fill(v, (float)id);
        CHECK_RC(embkv_put(S, id, v, st, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    embkv_snapshot *snap = NULL;
    CHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_OK);
    /* After it: update 0..49 many times (syncs between, so freed versions
     * would be reused if the snapshot did not hold them), delete 50..99,
     * create 1000..1049. */
    for (int round = 0; round < 20; round++) {
        for (int64_t id = 0; id < 50; id++) {
            fill(v, 5000.0f + (float)round);
            CHECK_RC(embkv_put(S, id, v, NULL, 0), EMBKV_OK);
        }
        CHECK_RC(embkv_sync(S), EMBKV_OK);
    }
    for (int64_t id = 50; id < 100; id++) CHECK_RC(embkv_delete(S, id), EMBKV_OK);
    for (int64_t id = 1000; id < 1050; id++) {
        fill(v, -1);
        CHECK_RC(embkv_put(S, id, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    int64_t ids[300];
    for (int i = 0; i < 200; i++) ids[i] = i;
    for (int i = 0; i < 100; i++) ids[200 + i] = 1000 + i;
    float out[300 * DIM];
    embkv_rowinfo info[300];
    uint8_t found[300];
    size_t missing = 0;
    CHECK_RC(embkv_get_batch_at(S, snap, ids, 300, out, info, found, &missing), EMBKV_OK);
    CHECK(missing == 100);
    int bad = 0;
    for (int i = 0; i < 200; i++) bad += !found[i] || out[i * DIM] != (float)i || info[i].clock != 0;
    for (int i = 200; i < 300; i++) bad += found[i];
    CHECK(bad == 0);
    /* The current state is the new one. */
    uint8_t cf[300];
    CHECK_RC(embkv_get_batch_at(S, NULL, ids, 300, out, info, cf, &missing), EMBKV_OK);
    CHECK(missing == 100);
    CHECK(cf[0] && out[0] == 5019.0f && info[0].clock == 20);
    CHECK(!cf[50] && cf[200] && !cf[250]);
    int64_t *ch = NULL;
    size_t nch = 0;
    CHECK_RC(embkv_snapshot_changed_ids(snap, &ch, &nch), EMBKV_OK);
    CHECK(nch == 100);
    if (ch) qsort(ch, nch, sizeof *ch, cmp64);
    bad = 0;
    for (size_t i = 0; i < nch; i++) bad += ch[i] != (int64_t)i;
    CHECK(bad == 0);
    free(ch);
    embkv_snapshot_close(snap);
    /* Closed: the held versions go back once nothing can read them. */
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK(embkv_count(S) == 200);
    CHECK_RC(embkv_close(S), EMBKV_OK);
}

/* ------------------------------------------------------------ E */

static void test_rules(void)
{
    S = open_store(test_tmpdir("e"), 0);
    float v[DIM];
    fill(v, 3);
    CHECK_RC(embkv_group_begin(S), EMBKV_OK);
    CHECK_RC(embkv_group_begin(S), EMBKV_OK);  /* nests */
    CHECK_RC(embkv_put(S, 7, v, NULL, 0), EMBKV_OK);
    embkv_group_end(S);
    CHECK_RC(embkv_sync(S), EMBKV_BUSY);
    CHECK(strstr(embkv_errmsg(), "inside a write group") != NULL);
    embkv_snapshot *snap = (embkv_snapshot *)1;
    CHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_BUSY);
    CHECK(snap == NULL);
    embkv_group_end(S);
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    CHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_OK);
    embkv_snapshot_close(snap);
    embkv_group_end(S);  /* unbalanced end: ignored */
    CHECK_RC(embkv_close(S), EMBKV_OK);
}

/* ------------------------------------------------------------ F */

#define F_BATCH 4000

static void *f_syncer(void *arg)
{
    embkv_store *s = arg;
    while (!atomic_load(&stop))
        if (embkv_sync(s) != EMBKV_OK) _exit(3);
    return NULL;
}

static void f_child(const char *dir)
{
    embkv_store *s = NULL;
    embkv_options o = {.dim = DIM, .expected_rows = 200000, .pool_size = 256ull << 20};
    if (embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s) != EMBKV_OK) _exit(2);
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_UNIFORM;
    t.init_a = 0;
    t.init_b = 1;
    if (embkv_train_configure(s, &t) != EMBKV_OK) _exit(2);
    embkv_session *ss = NULL;
    if (embkv_session_open(s, &ss) != EMBKV_OK) _exit(2);
    pthread_t th;
    pthread_create(&th, NULL, f_syncer, s);
    static int64_t ids[F_BATCH];
    static float grads[F_BATCH * DIM];
    for (int64_t b = 0;; b++) {
        for (int i = 0; i < F_BATCH; i++) ids[i] = b * F_BATCH + i;
        if (embkv_push(ss, ids, F_BATCH, grads, 0, NULL) != EMBKV_OK) _exit(4);
        if (b == 40) {
            /* done before the kill came: stop cleanly, nothing to check */
            atomic_store(&stop, true);
            pthread_join(th, NULL);
            _exit(0);
        }
    }
}

static void test_push_crash(void)
{
    unsigned seed = (unsigned)time(NULL);
    printf("F: seed %u\n", seed);
    srand(seed);
    int rounds = (int)scaled(8, 3), torn = 0, kills = 0;
    for (int r = 0; r < rounds; r++) {
        char name[32];
        snprintf(name, sizeof name, "f%d", r);
        const char *dir = test_tmpdir(name);
        char dirc[600];
        snprintf(dirc, sizeof dirc, "%s", dir);
        atomic_store(&stop, false);
        pid_t pid = fork();
        if (pid == 0) f_child(dirc);
        usleep(100000 + (useconds_t)(rand() % 400000));
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        if (!WIFSIGNALED(status)) {
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) CHECK(!"child failed");
            continue;
        }
        kills++;
        embkv_store *s = NULL;
        embkv_options o = {.dim = DIM};
        char pool[700];
        snprintf(pool, sizeof pool, "%s/store.pool", dirc);
        if (access(pool, F_OK) != 0) continue;  /* killed before the pool was made */
        int rc = embkv_open(dirc, &o, 0, &s);
        CHECK_RC(rc, EMBKV_OK);
        if (!s) continue;
        CHECK_RC(embkv_check(s), EMBKV_OK);
        /* Every batch: all rows or none, and all pushed once (clock 1). */
        static int64_t ids[F_BATCH];
        static embkv_rowinfo info[F_BATCH];
        static uint8_t found[F_BATCH];
        uint64_t total = 0;
        for (int64_t b = 0; b <= 40; b++) {
            for (int i = 0; i < F_BATCH; i++) ids[i] = b * F_BATCH + i;
            size_t missing = 0;
            CHECK_RC(embkv_get_batch_at(s, NULL, ids, F_BATCH, NULL, info, found, &missing), EMBKV_OK);
            if (missing != 0 && missing != F_BATCH) torn++;
            for (int i = 0; i < F_BATCH; i++)
                if (found[i] && info[i].clock != 1) torn++;
            total += F_BATCH - missing;
        }
        CHECK(total == embkv_count(s));
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    printf("F: %d kills during pushes creating rows with a checkpointing thread, %d torn\n", kills, torn);
    CHECK(torn == 0);
}

/* ------------------------------------------------------------ G */

static void test_pins_what_it_reads(void)
{
    const char *dir = test_tmpdir("snap_pins");
    const uint32_t dim = 1024;  /* 4 KiB records: a 16 MiB pool holds about 2,800 */
    embkv_options o = {0};
    o.dim = dim;
    o.expected_rows = 100;
    o.pool_size = 16ull << 20;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float *v = malloc(dim * sizeof *v), *w = malloc(dim * sizeof *w);
    for (int64_t id = 1; id <= 2; id++) {
        for (uint32_t i = 0; i < dim; i++) v[i] = (float)id;
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    embkv_snapshot *a = NULL, *b = NULL;
    CHECK_RC(embkv_snapshot_open(s, &a), EMBKV_OK);
    int rc = EMBKV_OK;
    int k = 0;
    for (; k < 20000 && rc == EMBKV_OK; k++) {
        for (uint32_t i = 0; i < dim; i++) v[i] = (float)(100 + k);
        rc = embkv_put(s, 1, v, NULL, 0);
        if (k == 10000) {
            CHECK_RC(embkv_snapshot_open(s, &b), EMBKV_OK);  /* sees row 1 as 10100 */
        }
        if (k >= 10000 && rc == EMBKV_OK) rc = embkv_put(s, 2, v, NULL, 0);
    }
    CHECK_RC(rc, EMBKV_OK);
    if (rc != EMBKV_OK) fprintf(stderr, "    update %d: %s\n", k, embkv_errmsg());
    int64_t ids[2] = {1, 2};
    float *out = malloc(2 * dim * sizeof *out);
    CHECK_RC(embkv_get_batch_at(s, a, ids, 2, out, NULL, NULL, NULL), EMBKV_OK);
    CHECK(out[0] == 1.0f && out[dim - 1] == 1.0f && out[dim] == 2.0f);
    if (b) {
        CHECK_RC(embkv_get_batch_at(s, b, ids, 2, out, NULL, NULL, NULL), EMBKV_OK);
        CHECK(out[0] == 10100.0f && out[dim - 1] == 10100.0f && out[dim] == 2.0f);
    }
    CHECK_RC(embkv_get(s, 1, w, NULL, NULL), EMBKV_OK);
    CHECK(w[0] == (float)(100 + 19999));
    embkv_snapshot_close(a);
    embkv_snapshot_close(b);
    /* With a checkpoint after every update: the durable version each
     * update replaces is kept until the sync, and then only if the open
     * snapshot may read it (one, row 1's version when it opened). */
    CHECK_RC(embkv_snapshot_open(s, &a), EMBKV_OK);
    rc = EMBKV_OK;
    for (k = 0; k < 6000 && rc == EMBKV_OK; k++) {
        for (uint32_t i = 0; i < dim; i++) v[i] = (float)(50000 + k);
        rc = embkv_put(s, 1, v, NULL, 0);
        if (rc == EMBKV_OK) rc = embkv_sync(s);
    }
    CHECK_RC(rc, EMBKV_OK);
    if (rc != EMBKV_OK) fprintf(stderr, "    update and sync %d: %s\n", k, embkv_errmsg());
    CHECK_RC(embkv_get_batch_at(s, a, ids, 1, out, NULL, NULL, NULL), EMBKV_OK);
    CHECK(out[0] == (float)(100 + 19999) && out[dim - 1] == (float)(100 + 19999));
    embkv_snapshot_close(a);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free(v);
    free(w);
    free(out);
}

int main(void)
{
    const char *sc = getenv("EMBKV_TEST_SCALE");
    if (sc) scale = atof(sc);
    test_rules();
    test_fixed_view();
    test_groups_whole();
    test_replace_gap();
    test_one_version();
    test_pins_what_it_reads();
    test_push_crash();
    return test_summary("test_concurrency_snapshot");
}
