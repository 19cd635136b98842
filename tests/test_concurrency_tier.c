/*
 * test_concurrency_tier.c - the SSD tier under concurrent use (run under
 * ThreadSanitizer too): writers update and delete rows of their own ids,
 * readers pull random batches (rows in the pool, in the log, staged by
 * look-ahead), a look-ahead thread stages the batches readers are about to
 * pull, and the main thread syncs, while the tier's own thread demotes,
 * promotes and compacts, and a mover brings the hottest rows and random
 * ones up the hierarchy (embkv_hottest, embkv_hotset_move).  Every vector read must be whole and its id's
 * (a row carries its id and generation, the rest derives from them); at
 * the end every row equals what its writer wrote last.
 */
#include "embkv.h"
#include "check.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <unistd.h>

#define DIM 128      /* 576-byte records: a 16 MiB pool holds ~29000 rows */
#define WRITERS 2
#define READERS 2
#define BATCH 256

static embkv_store *S;
static size_t N;
static uint64_t *gen;          /* per id, written only by its writer (id % WRITERS) */
static atomic_int stop;
static _Atomic uint64_t bad_reads, reads_done, lookaheads, failed_calls, moved_to_pm, full_stalls;

/* CHECK's counters are not for threads: calls that fail are counted here,
 * and say why. */
#define T_CHECK(cond)                                                                                   \
    ((cond) ? (void)0                                                                                   \
            : (void)(atomic_fetch_add(&failed_calls, 1),                                                \
                     fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond, embkv_errmsg())))

static void make_vec(int64_t id, uint64_t g, float *v)
{
    v[0] = (float)id;
    v[1] = (float)g;
    for (int i = 2; i < DIM; i++)
        v[i] = (float)((mix64((uint64_t)id * 131 + g * 7 + (uint64_t)i) >> 44) % 4096);
}

static bool vec_ok(int64_t id, const float *v)
{
    if (v[0] != (float)id)
        return false;
    float want[DIM];
    make_vec(id, (uint64_t)v[1], want);
    return memcmp(v, want, sizeof want) == 0;
}

static void *writer(void *arg)
{
    int w = (int)(intptr_t)arg;
    rng_t r = {(uint64_t)w * 31 + 5};
    float v[DIM];
    while (!atomic_load(&stop)) {
        int64_t id = (int64_t)(rnd_below(&r, N / WRITERS) * WRITERS + (uint64_t)w);
        if (rnd_below(&r, 20) == 0) {
            int rc = embkv_delete(S, id);
            T_CHECK(gen[id] ? rc == EMBKV_OK : rc == EMBKV_NOTFOUND);
            if (rc == EMBKV_OK || rc == EMBKV_NOTFOUND)
                gen[id] = 0;
        } else {
            uint64_t g = (gen[id] ? gen[id] : 1000) + 1;
            make_vec(id, g, v);
            int rc = embkv_put(S, id, v, NULL, 0);
            /* Between two syncs the log takes ssd_size less what is live:
             * a slow sync on a busy machine lets the writers fill it, and
             * the put fails saying that the rest is garbage, to checkpoint
             * and write again.  That advice, followed, must work. */
            for (int tries = 0; rc == EMBKV_FULL && tries < 3; tries++) {
                atomic_fetch_add(&full_stalls, 1);
                T_CHECK(strstr(embkv_errmsg(), "checkpoint (embkv_sync; embkv_checkpoint in SQL) and write again") != NULL);
                T_CHECK(embkv_sync(S) == EMBKV_OK);
                rc = embkv_put(S, id, v, NULL, 0);
            }
            T_CHECK(rc == EMBKV_OK);
            if (rc == EMBKV_OK)  /* (a failed put changes nothing: the row is checked so) */
                gen[id] = g;
        }
    }
    return NULL;
}

/* Reader r's batches come from rng seeded r; the look-ahead thread draws
 * the same sequence one batch ahead. */
static void draw(rng_t *r, int64_t *ids)
{
    for (size_t j = 0; j < BATCH; j++)
        ids[j] = (int64_t)rnd_below(r, N);
}

static _Atomic uint64_t reader_batch[READERS];

static void *reader(void *arg)
{
    int k = (int)(intptr_t)arg;
    rng_t r = {(uint64_t)k + 100};
    int64_t ids[BATCH];
    float *out = malloc((size_t)BATCH * DIM * sizeof *out);
    uint8_t found[BATCH];
    while (!atomic_load(&stop)) {
        draw(&r, ids);
        T_CHECK(embkv_get_batch(S, ids, BATCH, out, found, NULL) == EMBKV_OK);
        for (size_t j = 0; j < BATCH; j++)
            if (found[j] && !vec_ok(ids[j], out + j * DIM))
                atomic_fetch_add(&bad_reads, 1);
        atomic_fetch_add(&reader_batch[k], 1);
        atomic_fetch_add(&reads_done, 1);
    }
    free(out);
    return NULL;
}

static void *ahead(void *arg)
{
    (void)arg;
    rng_t r[READERS];
    uint64_t drawn[READERS] = {0};
    int64_t ids[BATCH];
    for (int k = 0; k < READERS; k++)
        r[k].s = (uint64_t)k + 100;
    while (!atomic_load(&stop)) {
        bool any = false;
        for (int k = 0; k < READERS; k++) {
            /* Up to two batches ahead of reader k. */
            if (drawn[k] >= atomic_load(&reader_batch[k]) + 2)
                continue;
            draw(&r[k], ids);
            drawn[k]++;
            size_t q;
            T_CHECK(embkv_lookahead(S, ids, BATCH, &q) == EMBKV_OK);
            atomic_fetch_add(&lookaheads, q);
            any = true;
        }
        if (!any)
            sched_yield();
    }
    return NULL;
}

static void *mover(void *arg)
{
    (void)arg;
    rng_t r = {777};
    int64_t ids[BATCH];
    T_CHECK(embkv_heat_enable(S) == EMBKV_OK);
    while (!atomic_load(&stop)) {
        size_t n = 0;
        embkv_moves mv;
        T_CHECK(embkv_hottest(S, 64, ids, NULL, &n) == EMBKV_OK);
        T_CHECK(embkv_hotset_move(S, ids, n, &mv) == EMBKV_OK);
        atomic_fetch_add(&moved_to_pm, mv.to_pm);
        draw(&r, ids);
        T_CHECK(embkv_hotset_move(S, ids, 32, &mv) == EMBKV_OK);
        atomic_fetch_add(&moved_to_pm, mv.to_pm);
        usleep(20000);
    }
    return NULL;
}

int main(void)
{
    const char *root = test_tmpdir("concurrency_tier");
    mkdir(root, 0755);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/store", root);
    const char *sc = getenv("EMBKV_TEST_SCALE");
    double scale = sc && atof(sc) > 0 ? atof(sc) : 1.0;
    N = (size_t)(80000 * (scale < 1 ? 0.75 : 1.0));
    gen = calloc(N, sizeof *gen);
    embkv_options o = {.dim = DIM, .expected_rows = N, .pool_size = 16u << 20, .ssd_size = 96u << 20};
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &S), EMBKV_OK);
    float v[DIM];
    for (size_t id = 0; id < N; id++) {
        make_vec((int64_t)id, 1000, v);
        CHECK_RC(embkv_put(S, (int64_t)id, v, NULL, 0), EMBKV_OK);
        gen[id] = 1000;
    }
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    pthread_t w[WRITERS], rd[READERS], la, mv;
    for (int i = 0; i < WRITERS; i++)
        pthread_create(&w[i], NULL, writer, (void *)(intptr_t)i);
    for (int i = 0; i < READERS; i++)
        pthread_create(&rd[i], NULL, reader, (void *)(intptr_t)i);
    pthread_create(&la, NULL, ahead, NULL);
    pthread_create(&mv, NULL, mover, NULL);
    uint64_t want_reads = (uint64_t)(1500 * scale) + 50;
    for (int i = 0; atomic_load(&reads_done) < want_reads && i < 600; i++) {
        usleep(100000);
        CHECK_RC(embkv_sync(S), EMBKV_OK);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(w[i], NULL);
    for (int i = 0; i < READERS; i++)
        pthread_join(rd[i], NULL);
    pthread_join(la, NULL);
    pthread_join(mv, NULL);
    CHECK(atomic_load(&bad_reads) == 0);
    CHECK(atomic_load(&failed_calls) == 0);
    CHECK(atomic_load(&lookaheads) > 0);

    embkv_stats st;
    CHECK_RC(embkv_stats_get(S, &st), EMBKV_OK);
    printf("%llu batches read, %llu rows looked ahead (%llu hits, %llu late, %llu wasted); %llu demotions, "
           "%llu promotions, %llu compactions; %llu rows in the log; %llu moved up by the hot set; "
           "%llu puts waited for a sync (log full of garbage)\n",
           (unsigned long long)atomic_load(&reads_done), (unsigned long long)st.lookahead_queued,
           (unsigned long long)st.lookahead_hits, (unsigned long long)st.lookahead_late,
           (unsigned long long)st.lookahead_wasted, (unsigned long long)st.demotions,
           (unsigned long long)st.promotions, (unsigned long long)st.compactions, (unsigned long long)st.rows_ssd,
           (unsigned long long)atomic_load(&moved_to_pm), (unsigned long long)atomic_load(&full_stalls));
    CHECK(st.hotset_to_pm == atomic_load(&moved_to_pm));
    CHECK(st.rows_ssd > 0 && st.demotions > 0);

    /* Every row is what its writer wrote last, before and after a reopen. */
    for (int pass = 0; pass < 2; pass++) {
        size_t wrong = 0;
        for (size_t id = 0; id < N; id++) {
            int rc = embkv_get(S, (int64_t)id, v, NULL, NULL);
            float want[DIM];
            make_vec((int64_t)id, gen[id], want);
            if (gen[id] ? rc != EMBKV_OK || memcmp(v, want, sizeof want) != 0 : rc != EMBKV_NOTFOUND)
                wrong++;
        }
        CHECK(wrong == 0);
        CHECK_RC(embkv_check(S), EMBKV_OK);
        CHECK_RC(embkv_close(S), EMBKV_OK);
        CHECK_RC(embkv_open(dir, NULL, 0, &S), EMBKV_OK);
    }
    CHECK_RC(embkv_close(S), EMBKV_OK);
    embkv_destroy(dir);
    free(gen);
    return test_summary("test_concurrency_tier");
}
