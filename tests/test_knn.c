/*
 * test_knn.c - embkv_knn through the C API.
 *
 *  A. Against a brute force in double on random rows (dim 21: the vector
 *     kernels' tails), every metric, single queries and a batch: the same
 *     ids in the same order (up to float rounding among near-equal
 *     distances), and the same result bit for bit with 1, 2 and 5 threads.
 *  B. only, skip and extra rows; a table with fewer rows than k (found,
 *     the rest id -1); rows deleted are not found.
 *  C. Bad arguments: each EMBKV_INVALID with the message naming it.
 *  D. The map of the live records a search keeps for the next (P11): a
 *     search after no change uses it and answers the same; after an
 *     update, an insert, a delete, a checkpoint retiring replaced records
 *     and purging tombstones, it follows the changes told to the kNN
 *     change log and sees them; after more changes than that log holds or
 *     a resize it is dropped, and the next search sees the change; none is
 *     kept while rows lie in the SSD log or newer in the DRAM cache, and
 *     the answers stay exact there.  A search from an update's callback
 *     with the map behind returns (it does not wait for its own section).
 * Searches beside writers: test_concurrency_knn.c.
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"
#include "knn_rows.h"

#include <stdbool.h>

#define ROWS 6000

typedef struct ranked {
    double d;
    int64_t id;
} ranked;

static int cmp_ranked(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->d != y->d) return x->d < y->d ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* The k nearest of rows 0..n-1 (version 0) by brute force. */
static void brute(const float *q, int metric, size_t k, int64_t n, ranked *out)
{
    ranked *all = malloc((size_t)n * sizeof *all);
    float v[DIM];
    for (int64_t id = 0; id < n; id++) {
        for (int j = 0; j < DIM; j++) v[j] = val(id, j, 0);
        all[id].d = ref_dist(q, v, metric);
        all[id].id = id;
    }
    qsort(all, (size_t)n, sizeof *all, cmp_ranked);
    memcpy(out, all, k * sizeof *out);
    free(all);
}

/* ------------------------------------------------------------ A */

static void test_brute(embkv_store *s)
{
    enum { NQ = 4, K = 12 };
    float qs[NQ * DIM];
    for (int q = 0; q < NQ; q++)
        for (int j = 0; j < DIM; j++) qs[q * DIM + j] = val(1000000 + q, j, 0);
    for (int metric = 0; metric < 3; metric++) {
        int64_t ids[3][NQ * K];
        double dist[3][NQ * K];
        size_t found[3][NQ];
        unsigned threads[3] = {1, 2, 5};
        for (int t = 0; t < 3; t++) {
            embkv_knn_options o = {.metric = metric, .threads = threads[t]};
            CHECK_RC(embkv_knn(s, qs, NQ, K, &o, ids[t], dist[t], found[t]), EMBKV_OK);
        }
        CHECK(memcmp(ids[0], ids[1], sizeof ids[0]) == 0 && memcmp(ids[0], ids[2], sizeof ids[0]) == 0);
        CHECK(memcmp(dist[0], dist[1], sizeof dist[0]) == 0 && memcmp(dist[0], dist[2], sizeof dist[0]) == 0);
        for (int q = 0; q < NQ; q++) {
            CHECK(found[0][q] == K);
            ranked want[K];
            brute(qs + q * DIM, metric, K, ROWS, want);
            for (int i = 0; i < K; i++) {
                double d = dist[0][q * K + i];
                CHECK(fabs(d - want[i].d) <= 1e-4 * fmax(1.0, fabs(want[i].d)));
                /* ids equal unless the reference has a near-tie there */
                bool tie = (i > 0 && fabs(want[i].d - want[i - 1].d) < 1e-4) ||
                           (i + 1 < K && fabs(want[i].d - want[i + 1].d) < 1e-4);
                if (!tie) CHECK(ids[0][q * K + i] == want[i].id);
            }
        }
    }
    /* A row's own vector finds it at distance 0 exactly (L2 decided on the
     * direct sum). */
    float v[DIM];
    for (int j = 0; j < DIM; j++) v[j] = val(4321, j, 0);
    int64_t id;
    double d;
    size_t f;
    CHECK_RC(embkv_knn(s, v, 1, 1, NULL, &id, &d, &f), EMBKV_OK);
    CHECK(f == 1 && id == 4321 && d == 0.0f);
}

/* ------------------------------------------------------------ B */

static void test_lists(embkv_store *s)
{
    float q[DIM];
    for (int j = 0; j < DIM; j++) q[j] = val(17, j, 0);
    int64_t ids[8];
    double dist[8];
    size_t found;
    /* only: among those (absent 99999 ignored, 17 named twice counted once) */
    int64_t only[5] = {5, 99999, 17, 300, 17};
    embkv_knn_options o = {.only = only, .nonly = 5};
    CHECK_RC(embkv_knn(s, q, 1, 8, &o, ids, dist, &found), EMBKV_OK);
    CHECK(found == 3 && ids[0] == 17 && dist[0] == 0.0f && ids[3] == -1 && isnan(dist[3]));
    CHECK((ids[1] == 5 || ids[1] == 300) && (ids[2] == 5 || ids[2] == 300) && ids[1] != ids[2]);
    /* skip 17, and an extra row 17 at q + 1 in element 0: found at 1.0 */
    float extra[DIM];
    memcpy(extra, q, sizeof extra);
    extra[0] += 1.0f;
    int64_t eid = 17;
    embkv_knn_options o2 = {.skip = &eid, .nskip = 1, .extra_ids = &eid, .extra_vecs = extra, .nextra = 1};
    CHECK_RC(embkv_knn(s, q, 1, 2, &o2, ids, dist, &found), EMBKV_OK);
    CHECK(found == 2 && ids[0] == 17 && dist[0] == 1.0f && ids[1] != 17);
    /* the same extra without skip: it replaces the table's 17 all the same
     * (17 found once, at 1.0, not also at 0.0) */
    embkv_knn_options o3 = {.extra_ids = &eid, .extra_vecs = extra, .nextra = 1};
    CHECK_RC(embkv_knn(s, q, 1, 2, &o3, ids, dist, &found), EMBKV_OK);
    CHECK(found == 2 && ids[0] == 17 && dist[0] == 1.0f && ids[1] != 17);
    /* one id twice among the extras: refused, naming it */
    int64_t twice[2] = {17, 17};
    float two[2 * DIM];
    memcpy(two, extra, sizeof extra);
    memcpy(two + DIM, q, sizeof extra);
    embkv_knn_options o4 = {.extra_ids = twice, .extra_vecs = two, .nextra = 2};
    CHECK_RC(embkv_knn(s, q, 1, 3, &o4, ids, dist, &found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "embkv_knn: extra id 17 is given twice: give each row once") != NULL);
    /* a deleted row is not found */
    CHECK_RC(embkv_delete(s, 17), EMBKV_OK);
    CHECK_RC(embkv_knn(s, q, 1, 1, NULL, ids, dist, &found), EMBKV_OK);
    CHECK(found == 1 && ids[0] != 17 && dist[0] > 0);
    for (int j = 0; j < DIM; j++) q[j] = val(17, j, 0);
    CHECK_RC(embkv_put(s, 17, q, NULL, 0), EMBKV_OK);
    /* fewer rows than k */
    embkv_store *small = make_store("small", 3);
    int64_t many[10];
    double md[10];
    CHECK_RC(embkv_knn(small, q, 1, 10, NULL, many, md, &found), EMBKV_OK);
    CHECK(found == 3 && many[3] == -1 && many[9] == -1);
    CHECK_RC(embkv_close(small), EMBKV_OK);
}

/* ------------------------------------------------------------ C */

static void test_errors(embkv_store *s)
{
    float q[DIM] = {0};
    int64_t ids[4];
    double dist[4];
    size_t found[2];
    CHECK_RC(embkv_knn(NULL, q, 1, 1, NULL, ids, dist, found), EMBKV_INVALID);
    CHECK_RC(embkv_knn(s, q, 1, 1, NULL, NULL, dist, found), EMBKV_INVALID);
    CHECK_RC(embkv_knn(s, q, 0, 1, NULL, ids, dist, found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "the number of queries is 0") != NULL);
    CHECK_RC(embkv_knn(s, q, 1, 0, NULL, ids, dist, found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "k is 0") != NULL);
    CHECK_RC(embkv_knn(s, q, 1, EMBKV_KNN_MAX_K + 1, NULL, ids, dist, found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "split the batch") != NULL);
    embkv_knn_options bad = {.metric = 7};
    CHECK_RC(embkv_knn(s, q, 1, 1, &bad, ids, dist, found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "unknown metric 7") != NULL);
    embkv_knn_options cos = {.metric = EMBKV_KNN_COSINE};
    CHECK_RC(embkv_knn(s, q, 1, 1, &cos, ids, dist, found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "query 0 is all zeros") != NULL);
    float q2[2 * DIM] = {0};
    q2[DIM + 3] = NAN;
    CHECK_RC(embkv_knn(s, q2, 2, 1, NULL, ids, dist, found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "query 1 holds NaN at position 3") != NULL);
    q2[DIM + 3] = INFINITY;
    CHECK_RC(embkv_knn(s, q2, 2, 1, NULL, ids, dist, found), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "an infinity") != NULL);
    embkv_knn_options nolist = {.nonly = 3};
    CHECK_RC(embkv_knn(s, q, 1, 1, &nolist, ids, dist, found), EMBKV_INVALID);
}

/* Squared distances below FLT_MIN are rounded to a fixed spacing, not
 * relative to their size: the screen of one or two L2 queries must not
 * drop the nearer of two such rows (it did: row 2, scored first, won). */
static void test_subnormal(void)
{
    embkv_options o = {.dim = 1, .expected_rows = 16};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir("subnormal"), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float far = 0x1.79ca28p-67f, near = 0x1.79ca26p-67f, q[3] = {0, 0, 0};
    CHECK_RC(embkv_put(s, 2, &far, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_put(s, 1, &near, NULL, 0), EMBKV_OK);
    for (size_t nq = 1; nq <= 3; nq++) {
        int64_t ids[3];
        double dist[3];
        size_t found[3];
        CHECK_RC(embkv_knn(s, q, nq, 1, NULL, ids, dist, found), EMBKV_OK);
        for (size_t i = 0; i < nq; i++) {
            CHECK(found[i] == 1 && ids[i] == 1);
            CHECK(dist[i] == sqrt((double)near * (double)near));
        }
    }
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------------------ D */

#define KROWS 3000
typedef struct model {
    float (*v)[DIM];
    bool *live;
    int64_t cap;
} model;

static bool model_init(model *m, int64_t cap)
{
    m->v = calloc((size_t)cap, sizeof *m->v);
    m->live = calloc((size_t)cap, sizeof *m->live);
    m->cap = cap;
    CHECK(m->v && m->live);
    return m->v && m->live;
}

static void model_free(model *m)
{
    free(m->v);
    free(m->live);
}

static void model_put(embkv_store *s, model *m, int64_t id, const float *v)
{
    CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    memcpy(m->v[id], v, sizeof m->v[id]);
    m->live[id] = true;
}

/* One L2 search of q: the k nearest of the model's rows exactly (ids in
 * order, distances equal: both sum the same float products in double). */
static void search_model(embkv_store *s, const model *m, const float *q, const char *what)
{
    enum { K = 8 };
    ranked *all = malloc((size_t)m->cap * sizeof *all);
    if (!all) return;
    size_t n = 0;
    for (int64_t id = 0; id < m->cap; id++)
        if (m->live[id])
            all[n++] = (ranked){ref_dist(q, m->v[id], EMBKV_KNN_L2), id};
    qsort(all, n, sizeof *all, cmp_ranked);
    int64_t ids[K];
    double dist[K];
    size_t found = 0;
    CHECK_RC(embkv_knn(s, q, 1, K, NULL, ids, dist, &found), EMBKV_OK);
    bool same = found == K;
    for (size_t i = 0; same && i < K; i++)
        same = ids[i] == all[i].id && fabs(dist[i] - all[i].d) <= 1e-12 * fmax(1.0, all[i].d);
    if (!same)
        printf("  D: after %s: the answer is not the rows' (first id %lld, want %lld)\n", what, (long long)ids[0],
               (long long)all[0].id);
    CHECK(same);
    free(all);
}

/* After a change: the next search sees it without the kept map (it was
 * dropped), the one after uses the map that search kept. */
static void after_change(embkv_store *s, const model *m, const float *q, const char *what)
{
    uint64_t u = embkv_debug_knn_reused(s);
    search_model(s, m, q, what);
    if (embkv_debug_knn_reused(s) != u)
        printf("  D: after %s: the map was used\n", what);
    CHECK(embkv_debug_knn_reused(s) == u);
    search_model(s, m, q, what);
    if (embkv_debug_knn_reused(s) != u + 1)
        printf("  D: after %s, a search again: the map was not used\n", what);
    CHECK(embkv_debug_knn_reused(s) == u + 1);
}

/* After changes the kept map follows (told to the kNN change log: a row
 * written, a row inserted): the next search uses it, caught up, and sees
 * the change; so does the one after. */
static void after_told(embkv_store *s, const model *m, const float *q, const char *what)
{
    uint64_t u = embkv_debug_knn_reused(s), r = embkv_debug_knn_kept_reruns(s);
    search_model(s, m, q, what);
    search_model(s, m, q, what);
    if (embkv_debug_knn_reused(s) != u + 2 || embkv_debug_knn_kept_reruns(s) != r)
        printf("  D: after %s: %llu of 2 searches used the map, %llu found it wrong\n", what,
               (unsigned long long)(embkv_debug_knn_reused(s) - u),
               (unsigned long long)(embkv_debug_knn_kept_reruns(s) - r));
    CHECK(embkv_debug_knn_reused(s) == u + 2);
    CHECK(embkv_debug_knn_kept_reruns(s) == r);
}

/* An update's callback that searches the store it updates (the map
 * behind the log, the callback's thread inside a writer's section): the
 * search passes over the index rather than wait for its own section. */
typedef struct search_cb {
    embkv_store *s;
    const float *q;
    int rc;
    size_t found;
} search_cb;

static int search_in_update(void *p, size_t i, int64_t id, float *vec, float *state)
{
    search_cb *c = p;
    int64_t ids[4];
    double d[4];
    c->rc = embkv_knn(c->s, c->q, 1, 4, NULL, ids, d, &c->found);
    return 1;  /* (the row left as it was) */
}

static void test_kept_map(void)
{
    model m;
    embkv_store *s = make_store("kept", KROWS);
    if (!s) return;
    if (!model_init(&m, KROWS + 4)) {
        embkv_close(s);
        return;
    }
    for (int64_t id = 0; id < KROWS; id++) {
        for (int j = 0; j < DIM; j++) m.v[id][j] = val(id, j, 0);
        m.live[id] = true;
    }
    float q[DIM], v[DIM];
    for (int j = 0; j < DIM; j++) q[j] = val(2000000, j, 0);
    after_change(s, &m, q, "filling the table");
    /* the map's answer is the pass's, bit for bit (a skip of an id not in
     * the table makes a search pass over the index and keep no map) */
    int64_t a[2][8], absent = -12345;
    double d[2][8];
    size_t f[2];
    uint64_t u0 = embkv_debug_knn_reused(s);
    embkv_knn_options by_pass = {.skip = &absent, .nskip = 1};
    CHECK_RC(embkv_knn(s, q, 1, 8, NULL, a[0], d[0], &f[0]), EMBKV_OK);
    CHECK(embkv_debug_knn_reused(s) == u0 + 1);
    CHECK_RC(embkv_knn(s, q, 1, 8, &by_pass, a[1], d[1], &f[1]), EMBKV_OK);
    CHECK(embkv_debug_knn_reused(s) == u0 + 1);
    CHECK(f[0] == 8 && f[1] == 8 && !memcmp(a[0], a[1], sizeof a[0]) && !memcmp(d[0], d[1], sizeof d[0]));
    /* an update making row 5 the nearest, then moving it away again */
    memcpy(v, q, sizeof v);
    v[0] += 0.5f;
    model_put(s, &m, 5, v);
    after_told(s, &m, q, "an update");
    for (int j = 0; j < DIM; j++) v[j] = val(5, j, 1);
    model_put(s, &m, 5, v);
    after_told(s, &m, q, "a second update");
    /* the checkpoint retiring row 5's durable version (its removal was
     * told): the map stays */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    after_told(s, &m, q, "a checkpoint retiring an updated row's old record");
    /* more changes between two searches than the log holds (1024 + a
     * sixty-fourth of the rows): the map is dropped */
    for (int k = 0; k < 1024 + KROWS / 64 + 1; k++) {
        int64_t id = 7 + k % 100;
        for (int j = 0; j < DIM; j++) v[j] = val(id, j, 2 + k / 100);
        model_put(s, &m, id, v);
    }
    after_change(s, &m, q, "more updates than the change log holds");
    /* just as many, the map kept all along: it follows them */
    for (int k = 0; k < 1024 + KROWS / 64; k++) {
        int64_t id = 7 + k % 100;
        for (int j = 0; j < DIM; j++) v[j] = val(id, j, 20 + k / 100);
        model_put(s, &m, id, v);
    }
    after_told(s, &m, q, "as many updates as the change log holds");
    /* an insert nearer still, then its delete */
    memcpy(v, q, sizeof v);
    v[1] -= 0.25f;
    model_put(s, &m, KROWS + 1, v);
    after_told(s, &m, q, "an insert");
    /* a search from an update's callback, the map behind: it returns */
    for (int j = 0; j < DIM; j++) v[j] = val(9, j, 3);
    model_put(s, &m, 9, v);
    search_cb cb = {.s = s, .q = q, .rc = -1};
    int64_t nine = 9;
    size_t upd = 7;
    CHECK_RC(embkv_update_batch(s, &nine, 1, search_in_update, &cb, 0, &upd), EMBKV_OK);
    CHECK_RC(cb.rc, EMBKV_OK);
    CHECK(cb.found == 4 && upd == 0);
    after_told(s, &m, q, "a search from an update's callback");
    CHECK_RC(embkv_delete(s, KROWS + 1), EMBKV_OK);
    m.live[KROWS + 1] = false;
    after_told(s, &m, q, "a delete");
    /* the nearest row, durable, deleted: its record and tombstone stay
     * until the checkpoint after, which retires and purges them */
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    uint64_t u1 = embkv_debug_knn_reused(s);
    search_model(s, &m, q, "a checkpoint retiring nothing");
    CHECK(embkv_debug_knn_reused(s) == u1 + 1);  /* (it changed no index entry) */
    int64_t near[1];
    double nd[1];
    size_t nf = 0;
    CHECK_RC(embkv_knn(s, q, 1, 1, NULL, near, nd, &nf), EMBKV_OK);
    if (nf == 1) {
        CHECK_RC(embkv_delete(s, near[0]), EMBKV_OK);
        m.live[near[0]] = false;
    }
    after_told(s, &m, q, "a delete of the nearest row");
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    after_told(s, &m, q, "a checkpoint retiring its record and purging its tombstone");
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    u1 = embkv_debug_knn_reused(s);
    search_model(s, &m, q, "a second checkpoint");
    CHECK(embkv_debug_knn_reused(s) == u1 + 1);
    /* a resize: every row in a new index */
    CHECK_RC(embkv_grow_index_for(s, 200000), EMBKV_OK);
    after_change(s, &m, q, "a resize");
    CHECK(embkv_debug_knn_kept_reruns(s) == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    model_free(&m);

    /* Rows newer in the DRAM cache than in the pool, then rows in the SSD
     * log: exact answers, and no map kept. */
    embkv_options oc = {.dim = DIM, .expected_rows = KROWS, .cache_size = 1u << 20};
    embkv_options ol = {.dim = DIM, .expected_rows = 8 * KROWS, .pool_size = 16u << 20, .ssd_size = 64u << 20,
                        .state_floats = 250};
    for (int pass = 0; pass < 2; pass++) {
        int64_t rows = pass ? 8 * KROWS : KROWS;
        s = NULL;
        CHECK_RC(embkv_open(test_tmpdir(pass ? "kept_log" : "kept_cache"), pass ? &ol : &oc, EMBKV_OPEN_CREATE, &s),
                 EMBKV_OK);
        if (!s || !model_init(&m, rows)) return;
        for (int64_t id = 0; id < rows; id++) {
            for (int j = 0; j < DIM; j++) v[j] = val(id, j, 0);
            model_put(s, &m, id, v);
        }
        if (!pass) {
            /* Rows pulled and pushed twice: cached, and newer there. */
            embkv_train_options t;
            embkv_train_defaults(&t);
            CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
            embkv_session *ss = NULL;
            CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
            int64_t ids[64];
            static float g[64 * DIM], out[64 * DIM];
            for (int i = 0; i < 64; i++) ids[i] = 3 * i;
            for (int i = 0; i < 64 * DIM; i++) g[i] = (float)(i % 7) - 3;
            for (int k = 0; ss && k < 2; k++) {
                CHECK_RC(embkv_pull(ss, ids, 64, out), EMBKV_OK);
                CHECK_RC(embkv_push(ss, ids, 64, g, 0.5, NULL), EMBKV_OK);
            }
            if (ss) embkv_session_close(ss);
            for (int i = 0; i < 64; i++) CHECK_RC(embkv_get(s, ids[i], m.v[ids[i]], NULL, NULL), EMBKV_OK);
        }
        embkv_stats st;
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        CHECK(pass ? st.rows_ssd > 0 : st.cache_dirty > 0);
        uint64_t u = embkv_debug_knn_reused(s);
        const char *where = pass ? "rows in the SSD log" : "rows newer in the cache";
        search_model(s, &m, q, where);
        search_model(s, &m, q, where);
        memcpy(v, q, sizeof v);
        v[2] += 0.125f;
        model_put(s, &m, 7, v);
        search_model(s, &m, q, where);
        CHECK(embkv_debug_knn_reused(s) == u);
        CHECK_RC(embkv_close(s), EMBKV_OK);
        model_free(&m);
    }
}

int main(void)
{
    embkv_store *s = make_store("main", ROWS);
    if (s) {
        test_brute(s);
        test_lists(s);
        test_errors(s);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    test_subnormal();
    test_kept_map();
    return test_summary("test_knn");
}
