/*
 * test_concurrency_cache.c - the DRAM cache under concurrent use (run
 * under ThreadSanitizer too): 4 threads push (sgd, lr 1, gradients of
 * ones) batches of overlapping hot ids through a cache smaller than the
 * hot set, so rows are admitted, updated in place, evicted and written
 * back all the time; a reader pulls and checks every row is whole (all
 * components equal: a row pushed c times from v0 holds v0 - c); a
 * snapshot reader checks each row against its clock as of its snapshot
 * (opening snapshots forces write-backs and write-through); a mover brings
 * rows into the cache with embkv_hotset_move; the main thread checkpoints.
 * At the end every row's clock is the number of pushes that touched it
 * and its value follows, before and after a reopen.
 */
#include "embkv.h"
#include "check.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIM 16
#define HOT 2048
#define PUSHERS 4
#define BATCH 64

static embkv_store *S;
static atomic_int stop;
static _Atomic uint64_t pushes_of[HOT];
static _Atomic uint64_t bad_rows, failed_calls, pushes_done, snap_reads, moved;

#define T_CHECK(cond) ((cond) ? (void)0 : (void)atomic_fetch_add(&failed_calls, 1))

static float v0_of(int64_t id) { return (float)(5000 + id % 1000); }

static bool whole(int64_t id, const float *v, uint64_t clock, bool check_clock)
{
    for (int k = 1; k < DIM; k++)
        if (v[k] != v[0])
            return false;
    return !check_clock || v[0] == v0_of(id) - (float)clock;
}

static void *pusher(void *arg)
{
    int t = (int)(intptr_t)arg;
    rng_t r = {(uint64_t)t * 7919 + 3};
    embkv_session *ss;
    T_CHECK(embkv_session_open(S, &ss) == EMBKV_OK);
    int64_t ids[BATCH];
    float ones[BATCH * DIM], out[BATCH * DIM];
    for (int i = 0; i < BATCH * DIM; i++)
        ones[i] = 1;
    while (!atomic_load(&stop)) {
        /* skewed, distinct within the batch */
        int n = 0;
        while (n < BATCH) {
            int64_t id = (int64_t)rnd_below(&r, rnd_below(&r, HOT) + 1);
            bool dup = false;
            for (int i = 0; i < n; i++)
                dup |= ids[i] == id;
            if (!dup)
                ids[n++] = id;
        }
        T_CHECK(embkv_pull(ss, ids, BATCH, out) == EMBKV_OK);
        for (int i = 0; i < BATCH; i++)
            if (!whole(ids[i], out + i * DIM, 0, false))
                atomic_fetch_add(&bad_rows, 1);
        T_CHECK(embkv_push(ss, ids, BATCH, ones, 0, NULL) == EMBKV_OK);
        for (int i = 0; i < BATCH; i++)
            atomic_fetch_add(&pushes_of[ids[i]], 1);
        atomic_fetch_add(&pushes_done, 1);
    }
    embkv_session_close(ss);
    return NULL;
}

static void *snap_reader(void *arg)
{
    (void)arg;
    rng_t r = {99};
    int64_t ids[256];
    float out[256 * DIM];
    embkv_rowinfo info[256];
    uint8_t found[256];
    while (!atomic_load(&stop)) {
        embkv_snapshot *snap;
        T_CHECK(embkv_snapshot_open(S, &snap) == EMBKV_OK);
        for (int round = 0; round < 4; round++) {
            for (int i = 0; i < 256; i++)
                ids[i] = (int64_t)rnd_below(&r, HOT);
            T_CHECK(embkv_get_batch_at(S, snap, ids, 256, out, info, found, NULL) == EMBKV_OK);
            for (int i = 0; i < 256; i++)
                if (!found[i] || !whole(ids[i], out + i * DIM, info[i].clock, true))
                    atomic_fetch_add(&bad_rows, 1);
            atomic_fetch_add(&snap_reads, 1);
        }
        embkv_snapshot_close(snap);
        usleep(3000);
    }
    return NULL;
}

static void *mover(void *arg)
{
    (void)arg;
    rng_t r = {4242};
    int64_t ids[32];
    while (!atomic_load(&stop)) {
        for (int i = 0; i < 32; i++)
            ids[i] = (int64_t)rnd_below(&r, HOT);
        embkv_moves mv;
        T_CHECK(embkv_hotset_move(S, ids, 32, &mv) == EMBKV_OK);
        atomic_fetch_add(&moved, mv.to_dram);
        usleep(2000);
    }
    return NULL;
}

int main(void)
{
    const char *root = test_tmpdir("concurrency_cache");
    mkdir(root, 0755);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/store", root);
    const char *sc = getenv("EMBKV_TEST_SCALE");
    double scale = sc && atof(sc) > 0 ? atof(sc) : 1.0;
    /* records of 96 bytes: about a quarter of the hot set fits */
    embkv_options o = {.dim = DIM, .expected_rows = HOT, .cache_size = HOT / 4 * 144};
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &S), EMBKV_OK);
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.lr = 1;
    CHECK_RC(embkv_train_configure(S, &t), EMBKV_OK);
    float v[DIM];
    for (int64_t id = 0; id < HOT; id++) {
        for (int k = 0; k < DIM; k++)
            v[k] = v0_of(id);
        CHECK_RC(embkv_put(S, id, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(S), EMBKV_OK);

    pthread_t pu[PUSHERS], sr, mv;
    for (int i = 0; i < PUSHERS; i++)
        pthread_create(&pu[i], NULL, pusher, (void *)(intptr_t)i);
    pthread_create(&sr, NULL, snap_reader, NULL);
    pthread_create(&mv, NULL, mover, NULL);
    uint64_t want = (uint64_t)(4000 * scale) + 200;
    for (int i = 0; atomic_load(&pushes_done) < want && i < 1200; i++) {
        usleep(50000);
        CHECK_RC(embkv_sync(S), EMBKV_OK);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < PUSHERS; i++)
        pthread_join(pu[i], NULL);
    pthread_join(sr, NULL);
    pthread_join(mv, NULL);
    CHECK(atomic_load(&bad_rows) == 0);
    CHECK(atomic_load(&failed_calls) == 0);
    CHECK(atomic_load(&snap_reads) > 0);

    embkv_stats st;
    CHECK_RC(embkv_stats_get(S, &st), EMBKV_OK);
    printf("%llu pushes, %llu snapshot reads; cache %llu of %llu rows, %llu hits %llu misses, %llu evictions, "
           "%llu write-backs, %llu moved in by the hot set\n",
           (unsigned long long)atomic_load(&pushes_done), (unsigned long long)atomic_load(&snap_reads),
           (unsigned long long)st.cache_rows, (unsigned long long)st.cache_capacity_rows,
           (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses,
           (unsigned long long)st.cache_evictions, (unsigned long long)st.cache_writebacks,
           (unsigned long long)atomic_load(&moved));
    CHECK(st.cache_evictions > 0 && st.cache_writebacks > 0);

    for (int pass = 0; pass < 2; pass++) {
        size_t wrong = 0;
        for (int64_t id = 0; id < HOT; id++) {
            embkv_rowinfo info;
            int rc = embkv_get(S, id, v, NULL, &info);
            uint64_t c = atomic_load(&pushes_of[id]);
            if (rc != EMBKV_OK || info.clock != c || !whole(id, v, c, true))
                wrong++;
        }
        CHECK(wrong == 0);
        CHECK_RC(embkv_check(S), EMBKV_OK);
        CHECK_RC(embkv_close(S), EMBKV_OK);
        CHECK_RC(embkv_open(dir, NULL, 0, &S), EMBKV_OK);
    }
    CHECK_RC(embkv_close(S), EMBKV_OK);
    embkv_destroy(dir);
    return test_summary("test_concurrency_cache");
}
