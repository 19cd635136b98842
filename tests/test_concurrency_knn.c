/*
 * test_concurrency_knn.c - embkv_knn beside writers (run under TSan too).
 *
 * D. Two threads rewrite rows between two known versions and a third
 *    deletes and reinserts some, while two threads search (each with 2
 *    threads of its own): every row found is at the distance of one of its
 *    versions, found once, in order, and every search finds k rows.  The
 *    searches use the kept map, which follows the writes (the kNN change
 *    log), and no stream finds it wrong.
 *
 * E. The same with writers in bursts, so that searches between bursts use
 *    the map of the live records kept by the search before (P11) and
 *    bursts begin while they stream: ten rows near the query and the rest
 *    far in every version; the near ones rewritten with versions going up,
 *    the far ones deleted and inserted again (their records reused).
 *    Every search finds exactly the ten near rows, each at a version no
 *    older than the last one written before it began, and not newer than
 *    the last one begun before it ended.  No search's stream finds the
 *    kept map wrong (the tallies would only make it run again, so the
 *    count of those is what shows P11 holding).
 *
 * F. Searches at once share the kept map: with no writer, once one search
 *    has made it, every search of two threads searching at once uses it.
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"
#include "knn_rows.h"

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

static double scale = 1.0;

#define D_ROWS 3000
#define D_K 25
static atomic_int d_stop;

typedef struct d_arg {
    embkv_store *s;
    int t;
    long searches;
} d_arg;

static void *d_writer(void *p)
{
    d_arg *a = p;
    rng_t r = {77 + (uint64_t)a->t};
    float v[DIM];
    while (!atomic_load(&d_stop)) {
        int64_t id = (int64_t)rnd_below(&r, D_ROWS);
        int ver = (int)rnd_below(&r, 2);
        for (int j = 0; j < DIM; j++) v[j] = val(id, j, ver);
        if (a->t == 2 && id % 3 == 0) {  /* deletes and reinserts */
            int rc = embkv_delete(a->s, id);
            TCHECK(rc == EMBKV_OK || rc == EMBKV_NOTFOUND);
            TCHECK_RC(embkv_put(a->s, id, v, NULL, 0), EMBKV_OK);
        } else {
            TCHECK_RC(embkv_put(a->s, id, v, NULL, 0), EMBKV_OK);
        }
    }
    return NULL;
}

static void *d_searcher(void *p)
{
    d_arg *a = p;
    rng_t r = {900 + (uint64_t)a->t};
    int64_t ids[D_K];
    double dist[D_K];
    float q[DIM];
    size_t found;
    int iters = (int)(400 * scale) + 20;
    for (int it = 0; it < iters; it++) {
        for (int j = 0; j < DIM; j++) q[j] = val(5000000 + (int64_t)rnd_below(&r, 100000), j, 0);
        embkv_knn_options o = {.metric = (int)(it % 3), .threads = 2};
        TCHECK_RC(embkv_knn(a->s, q, 1, D_K, &o, ids, dist, &found), EMBKV_OK);
        /* Rows 0..D_ROWS-1 of which the deleter's (id % 3 == 0) may be
         * momentarily gone: at least the others are there. */
        TCHECK(found == D_K);
        for (size_t i = 0; i < found; i++) {
            TCHECK(ids[i] >= 0 && ids[i] < D_ROWS);
            float v0[DIM], v1[DIM];
            for (int j = 0; j < DIM; j++) {
                v0[j] = val(ids[i], j, 0);
                v1[j] = val(ids[i], j, 1);
            }
            double d0 = ref_dist(q, v0, o.metric), d1 = ref_dist(q, v1, o.metric);
            double tol = 1e-4 * fmax(1.0, fabs(dist[i]));
            TCHECK(fabs(dist[i] - d0) <= tol || fabs(dist[i] - d1) <= tol);
            for (size_t k = 0; k < i; k++) TCHECK(ids[k] != ids[i]);
            if (i) TCHECK(dist[i] >= dist[i - 1]);
        }
        a->searches++;
    }
    return NULL;
}

/* nw writer threads (ids 0..nw-1) until ns searcher threads (the next ids)
 * are done; the searches they made. */
static long run_roles(embkv_store *s, int nw, void *(*writer)(void *), int ns, void *(*searcher)(void *))
{
    d_arg args[8];
    pthread_t th[8];
    bool up[8] = {false};
    long searches = 0;
    atomic_store(&d_stop, 0);
    for (int t = 0; t < nw + ns; t++) {
        args[t] = (d_arg){s, t, 0};
        up[t] = pthread_create(&th[t], NULL, t < nw ? writer : searcher, &args[t]) == 0;
        CHECK(up[t]);
    }
    for (int t = nw; t < nw + ns; t++)
        if (up[t]) {
            CHECK(pthread_join(th[t], NULL) == 0);
            searches += args[t].searches;
        }
    atomic_store(&d_stop, 1);
    for (int t = 0; t < nw; t++)
        if (up[t]) CHECK(pthread_join(th[t], NULL) == 0);
    fold_thread_checks();
    return searches;
}

static void test_writers_beside(void)
{
    embkv_store *s = make_store("beside", D_ROWS);
    if (!s) return;
    uint64_t u = embkv_debug_knn_reused(s);
    long searches = run_roles(s, 3, d_writer, 2, d_searcher);
    printf("  D: %ld searches beside 3 writers, %llu of them from a kept map\n", searches,
           (unsigned long long)(embkv_debug_knn_reused(s) - u));
    /* (the map follows the writes told to its change log: P11) */
    CHECK(embkv_debug_knn_kept_reruns(s) == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------------------ E */

#define E_ROWS 3000
#define E_NEAR 10
static float e_q[DIM];
/* Near row x's versions: the last one a put of which began, and the last
 * one whose put returned (a search must find x at a version between the
 * second as it starts and the first as it ends). */
static atomic_int e_started[E_NEAR], e_done[E_NEAR];

/* Row id's vector at version ver: a near row along its own direction from
 * e_q, a little further each version (within about 5), the far ones at
 * least 70 away. */
static void e_vec(int64_t id, int ver, float *v)
{
    for (int j = 0; j < DIM; j++)
        v[j] = id < E_NEAR ? e_q[j] + val(id, j, 0) / 8 * (1.0f + (float)ver * 1e-4f) : val(id, j, ver & 1) + 20;
}

static void *e_writer(void *p)
{
    d_arg *a = p;
    rng_t r = {300 + (uint64_t)a->t};
    float v[DIM];
    struct timespec pause = {0, 8000000};
    while (!atomic_load(&d_stop)) {
        for (int i = 0; i < 100; i++) {
            int64_t id = (int64_t)rnd_below(&r, E_ROWS);
            if (id < E_NEAR) {
                /* each writer its own near rows, versions going up */
                id = (id & ~1) | a->t;
                int ver = atomic_load(&e_started[id]) + 1;
                atomic_store(&e_started[id], ver);
                e_vec(id, ver, v);
                TCHECK_RC(embkv_put(a->s, id, v, NULL, 0), EMBKV_OK);
                atomic_store(&e_done[id], ver);
                continue;
            }
            e_vec(id, (int)rnd_below(&r, 2), v);
            if (a->t == 1) {
                int rc = embkv_delete(a->s, id);
                TCHECK(rc == EMBKV_OK || rc == EMBKV_NOTFOUND);
            }
            TCHECK_RC(embkv_put(a->s, id, v, NULL, 0), EMBKV_OK);
        }
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static void *e_searcher(void *p)
{
    d_arg *a = p;
    int64_t ids[E_NEAR];
    double dist[E_NEAR];
    size_t found;
    int iters = (int)(600 * scale) + 40;
    for (int it = 0; it < iters; it++) {
        int lo[E_NEAR], hi[E_NEAR];
        for (int x = 0; x < E_NEAR; x++) lo[x] = atomic_load(&e_done[x]);
        embkv_knn_options o = {.threads = 2};
        TCHECK_RC(embkv_knn(a->s, e_q, 1, E_NEAR, &o, ids, dist, &found), EMBKV_OK);
        for (int x = 0; x < E_NEAR; x++) hi[x] = atomic_load(&e_started[x]);
        TCHECK(found == E_NEAR);
        unsigned seen = 0;
        for (size_t i = 0; i < found; i++) {
            TCHECK(ids[i] >= 0 && ids[i] < E_NEAR);
            if (ids[i] < 0 || ids[i] >= E_NEAR) continue;
            TCHECK(!(seen & (1u << ids[i])));
            seen |= 1u << ids[i];
            bool one = false;
            for (int ver = lo[ids[i]]; ver <= hi[ids[i]] && !one; ver++) {
                float w[DIM];
                e_vec(ids[i], ver, w);
                /* (versions apart differ by about 1e-4 of a distance; the
                 * last bits may differ by the multiply-adds knn.c contracts) */
                double want = ref_dist(e_q, w, EMBKV_KNN_L2);
                one = fabs(dist[i] - want) <= 1e-9 * fmax(1.0, want);
            }
            TCHECK(one);
            if (i) TCHECK(dist[i] >= dist[i - 1]);
        }
        a->searches++;
    }
    return NULL;
}

static void test_bursts(void)
{
    embkv_options o = {.dim = DIM, .expected_rows = E_ROWS};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir("bursts"), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    for (int j = 0; j < DIM; j++) e_q[j] = val(7000000, j, 0);
    float v[DIM];
    for (int64_t id = 0; id < E_ROWS; id++) {
        e_vec(id, 0, v);
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    for (int x = 0; x < E_NEAR; x++) {
        atomic_store(&e_started[x], 0);
        atomic_store(&e_done[x], 0);
    }
    uint64_t u = embkv_debug_knn_reused(s);
    long searches = run_roles(s, 2, e_writer, 2, e_searcher);
    uint64_t reused = embkv_debug_knn_reused(s) - u;
    printf("  E: %ld searches beside 2 writers in bursts, %llu of them from a kept map\n", searches,
           (unsigned long long)reused);
    CHECK(reused > 0);
    CHECK(embkv_debug_knn_kept_reruns(s) == 0);

    /* F: no writer now; one search makes the map, then all share it. */
    int64_t ids[E_NEAR];
    double dist[E_NEAR];
    size_t found;
    CHECK_RC(embkv_knn(s, e_q, 1, E_NEAR, NULL, ids, dist, &found), EMBKV_OK);
    u = embkv_debug_knn_reused(s);
    searches = run_roles(s, 0, NULL, 2, e_searcher);
    reused = embkv_debug_knn_reused(s) - u;
    printf("  F: %ld searches at once, %llu of them from the kept map\n", searches, (unsigned long long)reused);
    CHECK(searches > 0 && reused == (uint64_t)searches);
    CHECK(embkv_debug_knn_kept_reruns(s) == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

int main(void)
{
    const char *e = getenv("EMBKV_TEST_SCALE");
    if (e && *e && atof(e) > 0) scale = atof(e);
    test_writers_beside();
    test_bursts();
    return test_summary("test_concurrency_knn");
}
