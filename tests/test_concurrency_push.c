/*
 * test_concurrency_push.c - pushes large enough to be updated on two
 * threads (train.c's push_rows: from 8,192 distinct rows on, the second
 * half by a helper inside the caller's write group).
 *
 *  A. Two trainer threads push every id of the table at once (shuffled,
 *     with duplicates) again and again, on a store with and without a DRAM
 *     cache, while a third syncs and a fourth opens snapshots and reads
 *     them: no row is ever torn (a vector's elements are equal), a snapshot
 *     reads the same rows twice, and at the end each row's value and clock
 *     count exactly the pushes that named it (no lost or doubled update),
 *     also after close and reopen.
 *  B. SIGKILL: a child pushes every id once per push (gradient -1, so a
 *     row's value is the number of its updates), syncing after some; killed
 *     at random moments, the store reopens with every row equal and its
 *     clock equal to its value: a checkpoint holds each push whole, both
 *     halves or neither.
 * Also built and run under TSan.  Rounds scale with EMBKV_TEST_SCALE.
 */
#include "embkv.h"
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DIM 4
#define N 12000 /* ids 0..N-1: a push of all of them is split */

static double scale = 1.0;

static embkv_store *open_store(const char *dir, uint64_t cache_size, unsigned flags)
{
    embkv_options so = {.dim = DIM, .expected_rows = N, .cache_size = cache_size};
    embkv_store *s = NULL;
    if (embkv_open(dir, &so, flags, &s) != EMBKV_OK) {
        fprintf(stderr, "open %s: %s\n", dir, embkv_errmsg());
        exit(2);
    }
    embkv_train_options o;
    embkv_train_defaults(&o);
    o.optimizer = EMBKV_SGD;
    o.lr = 1.0;
    o.init = EMBKV_INIT_ZEROS;
    CHECK_RC(embkv_train_configure(s, &o), EMBKV_OK);
    return s;
}

static uint64_t rng_next(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* ================================================================ A */

static embkv_store *A_s;
static atomic_bool A_stop;
static atomic_llong A_torn, A_unstable, A_errors, A_snaps;
static long long A_pushes_of[2][N];  /* per trainer: occurrences pushed (each adds 1) */
static long long A_named[2][N];      /* per trainer: pushes that named the id */
static int A_rounds;

static void *a_trainer(void *arg)
{
    int me = (int)(intptr_t)arg;
    embkv_session *ss;
    if (embkv_session_open(A_s, &ss) != EMBKV_OK) {
        atomic_fetch_add(&A_errors, 1);
        return NULL;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(me + 1);
    size_t cap = N + N / 4;
    int64_t *ids = malloc(cap * sizeof *ids);
    float *g = malloc(cap * DIM * sizeof *g);
    if (!ids || !g)
        abort();
    for (size_t i = 0; i < cap * DIM; i++)
        g[i] = -1.0f;
    for (int r = 0; r < A_rounds; r++) {
        size_t n = 0;
        for (int64_t id = 0; id < N; id++)
            ids[n++] = id;
        size_t extra = rng_next(&x) % (N / 4);
        for (size_t k = 0; k < extra; k++)
            ids[n++] = (int64_t)(rng_next(&x) % N);
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = rng_next(&x) % (i + 1);
            int64_t t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
        }
        size_t upd = 0;
        if (embkv_push(ss, ids, n, g, 0, &upd) != EMBKV_OK || upd != N) {
            fprintf(stderr, "push: %s (%zu rows)\n", embkv_errmsg(), upd);
            atomic_fetch_add(&A_errors, 1);
            break;
        }
        for (size_t i = 0; i < n; i++)
            A_pushes_of[me][ids[i]]++;
        for (int64_t id = 0; id < N; id++)
            A_named[me][id]++;
    }
    free(ids);
    free(g);
    embkv_session_close(ss);
    return NULL;
}

static void *a_syncer(void *arg)
{
    (void)arg;
    while (!atomic_load(&A_stop)) {
        if (embkv_sync(A_s) != EMBKV_OK)
            atomic_fetch_add(&A_errors, 1);
        usleep(2000);
    }
    return NULL;
}

static void *a_snapper(void *arg)
{
    (void)arg;
    enum { K = 64 };
    int64_t ids[K];
    float a[K * DIM], b[K * DIM];
    uint64_t x = 12345;
    while (!atomic_load(&A_stop)) {
        embkv_snapshot *snap;
        if (embkv_snapshot_open(A_s, &snap) != EMBKV_OK) {
            atomic_fetch_add(&A_errors, 1);
            break;
        }
        for (int k = 0; k < K; k++)
            ids[k] = (int64_t)(rng_next(&x) % N);
        size_t miss1 = 0, miss2 = 0;
        int r1 = embkv_get_batch_at(A_s, snap, ids, K, a, NULL, NULL, &miss1);
        usleep(500);
        int r2 = embkv_get_batch_at(A_s, snap, ids, K, b, NULL, NULL, &miss2);
        if (r1 != EMBKV_OK || r2 != EMBKV_OK)
            atomic_fetch_add(&A_errors, 1);
        else if (miss1 != miss2 || memcmp(a, b, sizeof a) != 0)
            atomic_fetch_add(&A_unstable, 1);
        for (int k = 0; k < K; k++)
            for (int j = 1; j < DIM; j++)
                if (a[k * DIM + j] != a[k * DIM])
                    atomic_fetch_add(&A_torn, 1);
        embkv_snapshot_close(snap);
        atomic_fetch_add(&A_snaps, 1);
    }
    return NULL;
}

static void test_concurrent_pushes(uint64_t cache_size)
{
    char name[64];
    snprintf(name, sizeof name, "a-%llu", (unsigned long long)cache_size);
    const char *dir = test_tmpdir(name);
    char path[700];
    snprintf(path, sizeof path, "%s", dir);
    A_s = open_store(path, cache_size, EMBKV_OPEN_CREATE);
    memset(A_pushes_of, 0, sizeof A_pushes_of);
    memset(A_named, 0, sizeof A_named);
    atomic_store(&A_stop, false);
    atomic_store(&A_torn, 0);
    atomic_store(&A_unstable, 0);
    atomic_store(&A_errors, 0);
    atomic_store(&A_snaps, 0);
    A_rounds = (int)(12 * scale) < 3 ? 3 : (int)(12 * scale);
    pthread_t tr[2], sy, sn;
    for (int i = 0; i < 2; i++)
        pthread_create(&tr[i], NULL, a_trainer, (void *)(intptr_t)i);
    pthread_create(&sy, NULL, a_syncer, NULL);
    pthread_create(&sn, NULL, a_snapper, NULL);
    for (int i = 0; i < 2; i++)
        pthread_join(tr[i], NULL);
    atomic_store(&A_stop, true);
    pthread_join(sy, NULL);
    pthread_join(sn, NULL);
    CHECK(atomic_load(&A_errors) == 0);
    CHECK(atomic_load(&A_torn) == 0);
    CHECK(atomic_load(&A_unstable) == 0);
    CHECK(atomic_load(&A_snaps) > 0);
    for (int pass = 0; pass < 2; pass++) {
        size_t bad = 0;
        for (int64_t id = 0; id < N; id++) {
            float v[DIM];
            embkv_rowinfo info;
            if (embkv_get(A_s, id, v, NULL, &info) != EMBKV_OK) {
                bad++;
                continue;
            }
            double want = (double)(A_pushes_of[0][id] + A_pushes_of[1][id]);
            uint64_t clock = (uint64_t)(A_named[0][id] + A_named[1][id]);
            for (int j = 0; j < DIM; j++)
                bad += v[j] != (float)want;
            bad += info.clock != clock;
        }
        if (bad)
            fprintf(stderr, "cache %llu, pass %d: %zu rows off\n", (unsigned long long)cache_size, pass, bad);
        CHECK(bad == 0);
        CHECK_RC(embkv_close(A_s), EMBKV_OK);
        if (pass == 0)
            A_s = open_store(path, cache_size, 0);
    }
}

/* ================================================================ B */

static void child_pushes(const char *dir, const char *mark)
{
    embkv_store *s = open_store(dir, 0, EMBKV_OPEN_CREATE);
    embkv_session *ss;
    if (embkv_session_open(s, &ss) != EMBKV_OK)
        _exit(3);
    static int64_t ids[N];
    static float g[N * DIM];
    for (int64_t id = 0; id < N; id++)
        ids[id] = N - 1 - id;
    for (size_t i = 0; i < (size_t)N * DIM; i++)
        g[i] = -1.0f;
    for (int k = 0;; k++) {
        if (embkv_push(ss, ids, N, g, 0, NULL) != EMBKV_OK)
            _exit(4);
        if (k % 2 == 1 && embkv_sync(s) != EMBKV_OK)
            _exit(5);
        if (k == 1)
            write_mark(mark, "synced");
    }
}

static void test_kills(void)
{
    char path[700], mark[700];
    snprintf(path, sizeof path, "%s", test_tmpdir("b"));
    snprintf(mark, sizeof mark, "%s", test_tmpdir("b.mark"));
    uint64_t x = (uint64_t)time(NULL) | 1;
    int rounds = (int)(8 * scale) < 3 ? 3 : (int)(8 * scale);
    float last = 0;
    for (int r = 0; r < rounds; r++) {
        unlink(mark);
        pid_t pid = fork();
        if (pid == 0)
            child_pushes(path, mark);
        /* (the first round's kill after a sync, so that one lands at all
         * under the sanitizers' slowness) */
        for (int w = 0; r == 0 && w < 60000 && access(mark, F_OK) != 0; w++)
            usleep(500);
        usleep((useconds_t)(rng_next(&x) % 200000));
        kill(pid, SIGKILL);
        int st;
        waitpid(pid, &st, 0);
        CHECK(WIFSIGNALED(st));
        embkv_store *s = open_store(path, 0, EMBKV_OPEN_CREATE);
        float first[DIM];
        embkv_rowinfo info0;
        size_t bad = 0;
        if (embkv_get(s, 0, first, NULL, &info0) != EMBKV_OK) {
            first[0] = 0;  /* no push made durable yet: no row */
            info0.clock = 0;
            for (int64_t id = 0; id < N; id++)
                bad += embkv_get(s, id, NULL, NULL, NULL) != EMBKV_NOTFOUND;
        } else {
            for (int64_t id = 0; id < N; id++) {
                float v[DIM];
                embkv_rowinfo info;
                if (embkv_get(s, id, v, NULL, &info) != EMBKV_OK) {
                    bad++;
                    continue;
                }
                for (int j = 0; j < DIM; j++)
                    bad += v[j] != first[0];
                bad += (double)info.clock != (double)v[0];
            }
        }
        if (bad)
            fprintf(stderr, "round %d: %zu rows not of one push count (row 0: %g)\n", r, bad, (double)first[0]);
        CHECK(bad == 0);
        CHECK(first[0] >= last);
        last = first[0];
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    CHECK(last > 0);
}

int main(void)
{
    const char *e = getenv("EMBKV_TEST_SCALE");
    if (e && *e && atof(e) > 0)
        scale = atof(e);
    test_concurrent_pushes(0);
    test_concurrent_pushes(1u << 20);
    test_kills();
    return test_summary("test_concurrency_push");
}
