/*
 * test_concurrency_evict.c - eviction beside trainers (run under TSan too).
 *
 * Three trainer threads (a session each) pull 8 random ids of 400, check
 * that every one of them exists, and push them (a checkpoint every 25
 * steps), while the eviction
 * thread and a fourth thread (embkv_evict, then a sync, in a loop) evict
 * with max_rows 60 (lru) and ttl_steps 4: a row pulled and not yet pushed
 * is never evicted (no trainer finds one of its rows gone), passes run
 * and evict, and the store checks clean at the end.
 */
#include "embkv.h"
#include "check.h"

#include <pthread.h>

#define DIM 4
#define RANGE_IDS 400

typedef struct arg {
    embkv_store *s;
    unsigned seed;
    atomic_int *stop;
    atomic_uint_fast64_t *gone, *steps;
} arg;

static void *trainer(void *p)
{
    arg *a = p;
    embkv_session *ss = NULL;
    TCHECK_RC(embkv_session_open(a->s, &ss), EMBKV_OK);
    int64_t ids[8];
    float v[8 * DIM], g[8 * DIM];
    for (int i = 0; i < 8 * DIM; i++) g[i] = 0.01f;
    int iters = getenv("EMBKV_TEST_SCALE") ? 500 : 2000;
    for (int it = 0; it < iters; it++) {
        for (int i = 0; i < 8; i++) ids[i] = (int64_t)(rand_r(&a->seed) % RANGE_IDS);
        TCHECK_RC(embkv_pull(ss, ids, 8, v), EMBKV_OK);
        for (int i = 0; i < 8; i++)
            if (!embkv_exists(a->s, ids[i])) atomic_fetch_add(a->gone, 1);
        TCHECK_RC(embkv_push(ss, ids, 8, g, 0, NULL), EMBKV_OK);
        atomic_fetch_add(a->steps, 1);
        /* checkpoints often enough that rows age past them between their
         * pushes (rows since the last are never evicted) */
        if (it % 25 == 24) TCHECK_RC(embkv_sync(a->s), EMBKV_OK);
    }
    embkv_session_close(ss);
    return NULL;
}

static void *evictor(void *p)
{
    arg *a = p;
    while (!atomic_load(a->stop)) {
        TCHECK_RC(embkv_evict(a->s, NULL), EMBKV_OK);
        TCHECK_RC(embkv_sync(a->s), EMBKV_OK);
    }
    return NULL;
}

int main(void)
{
    embkv_options o = {0};
    o.dim = DIM;
    o.expected_rows = 1000;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir("evict"), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return test_summary("test_concurrency_evict");
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    t.max_rows = 60;
    t.evict = EMBKV_EVICT_LRU;
    t.ttl_steps = 4;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    atomic_int stop = 0;
    atomic_uint_fast64_t gone = 0, steps = 0;
    pthread_t th[4];
    arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (arg){.s = s, .seed = 17u + (unsigned)i, .stop = &stop, .gone = &gone, .steps = &steps};
        pthread_create(&th[i], NULL, i < 3 ? trainer : evictor, &args[i]);
    }
    for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(th[3], NULL);
    embkv_train_stats st;
    CHECK_RC(embkv_train_stats_get(s, &st), EMBKV_OK);
    printf("steps %llu, passes %llu, expired %llu, over %llu, kept %llu, rows %llu\n",
           (unsigned long long)st.steps, (unsigned long long)st.evict_passes, (unsigned long long)st.evicted_expired,
           (unsigned long long)st.evicted_over, (unsigned long long)st.evict_kept,
           (unsigned long long)embkv_count(s));
    CHECK(atomic_load(&gone) == 0);
    CHECK(st.steps == atomic_load(&steps));
    CHECK(st.evict_passes > 0 && st.evicted_expired + st.evicted_over > 0);
    CHECK_RC(embkv_sync(s), EMBKV_OK);  /* (rows since the last checkpoint are never evicted) */
    CHECK_RC(embkv_evict(s, NULL), EMBKV_OK);
    CHECK(embkv_count(s) <= 60);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    return test_summary("test_concurrency_evict");
}
