/*
 * test_concurrency_knn.c - embkv_knn beside writers (run under TSan too).
 *
 * Two threads rewrite rows between two known versions and a third deletes
 * and reinserts some, while two threads search (each with 2 threads of its
 * own): every row found is at the distance of one of its versions, found
 * once, in order, and every search finds k rows.
 */
#include "embkv.h"
#include "check.h"
#include "knn_rows.h"

#include <pthread.h>

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

static void test_writers_beside(void)
{
    embkv_store *s = make_store("beside", D_ROWS);
    if (!s) return;
    d_arg args[5];
    pthread_t th[5];
    atomic_store(&d_stop, 0);
    for (int t = 0; t < 5; t++) {
        args[t] = (d_arg){s, t, 0};
        CHECK(pthread_create(&th[t], NULL, t < 3 ? d_writer : d_searcher, &args[t]) == 0);
    }
    CHECK(pthread_join(th[3], NULL) == 0);
    CHECK(pthread_join(th[4], NULL) == 0);
    atomic_store(&d_stop, 1);
    for (int t = 0; t < 3; t++) CHECK(pthread_join(th[t], NULL) == 0);
    fold_thread_checks();
    printf("  D: %ld searches beside 3 writers\n", args[3].searches + args[4].searches);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

int main(void)
{
    const char *e = getenv("EMBKV_TEST_SCALE");
    if (e && *e && atof(e) > 0) scale = atof(e);
    test_writers_beside();
    return test_summary("test_concurrency_knn");
}
