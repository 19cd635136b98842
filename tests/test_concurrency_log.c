/*
 * test_concurrency_log.c - the SSD log read by several threads while one
 * appends, releases and deletes dead segments (run under ThreadSanitizer
 * too).  Readers only read records the appender has not released (it
 * publishes a release mark, readers publish the mark they started from as
 * the store's epochs will, and it releases and deletes only
 * segments below the mark every reader started from), and every read must return the
 * exact bytes appended.  More readers than the log has io_uring rings, so
 * some wait for a ring.
 */
#include "embkv.h"
#include "log.h"
#include "check.h"

#include <pthread.h>

#define REC 528
#define READERS 6
#define TAG 77

static uint64_t *locs;
static size_t total;
static _Atomic size_t appended;      /* records [released, appended) are readable */
static _Atomic size_t released;
static atomic_int stop;
/* The release mark each reader started from (SIZE_MAX while idle): the
 * appender frees nothing at or above the lowest one. */
static _Atomic size_t using[READERS];
static embkv_log *L;

static void fill(unsigned char *r, uint64_t k)
{
    for (uint32_t i = 0; i < REC; i += 8) {
        uint64_t w = mix64(k * 7919 + i);
        memcpy(r + i, &w, 8 < REC - i ? 8 : REC - i);
    }
}

static void *reader(void *arg)
{
    int me = (int)(uintptr_t)arg - 1;
    rng_t r = {(uint64_t)(uintptr_t)arg};
    unsigned char *out = malloc(64 * REC), want[REC];
    uint64_t batch[64];
    size_t idx[64];
    while (!atomic_load(&stop)) {
        atomic_store(&using[me], atomic_load(&released));
        size_t lo = atomic_load(&released), hi = atomic_load(&appended);
        if (lo < atomic_load(&using[me]))
            lo = atomic_load(&using[me]);
        if (hi <= lo + 64) {
            atomic_store(&using[me], SIZE_MAX);
            continue;
        }
        for (int i = 0; i < 64; i++) {
            idx[i] = lo + 64 + rnd_below(&r, hi - lo - 64); /* away from the release edge */
            batch[i] = locs[idx[i]];
        }
        int rc = log_read(L, batch, 64, out, NULL);
        atomic_store(&using[me], SIZE_MAX);
        TCHECK(rc == EMBKV_OK);
        if (rc != EMBKV_OK) {
            fprintf(stderr, "%s\n", embkv_errmsg());
            break;
        }
        for (int i = 0; i < 64; i++) {
            fill(want, idx[i]);
            TCHECK(memcmp(out + (size_t)i * REC, want, REC) == 0);
        }
    }
    free(out);
    return NULL;
}

int main(void)
{
    const char *dir = test_tmpdir("clog");
    const char *sc = getenv("EMBKV_TEST_SCALE");
    double scale = sc && atof(sc) > 0 ? atof(sc) : 1.0;
    total = (size_t)(200000 * scale);
    locs = calloc(total, sizeof *locs);
    log_options o = {.dir = dir, .what = "clog", .record_bytes = REC, .segment_bytes = 1u << 20, .tag = TAG};
    CHECK_RC(log_open(&o, &L), EMBKV_OK);
    pthread_t th[READERS];
    for (int i = 0; i < READERS; i++)
        atomic_store(&using[i], SIZE_MAX);
    for (int i = 0; i < READERS; i++)
        pthread_create(&th[i], NULL, reader, (void *)(uintptr_t)(i + 1));
    unsigned char *buf = malloc(1000 * REC);
    size_t per_seg = ((1u << 20) / LOG_BLOCK - 1) * (LOG_BLOCK / REC);
    size_t deleted = 0;
    while (atomic_load(&appended) < total) {
        size_t at = atomic_load(&appended), m = total - at < 1000 ? total - at : 1000;
        for (size_t i = 0; i < m; i++)
            fill(buf + i * REC, at + i);
        CHECK_RC(log_append(L, buf, m, locs + at, false), EMBKV_OK);
        atomic_store(&appended, at + m);
        /* Release records far behind (3 segments' worth), then delete the
         * segments that became empty: readers stay above the mark. */
        size_t rel = atomic_load(&released);
        while (at + m > rel + 3 * per_seg + 64 + 1000) {
            /* Raise the mark first: no reader picks these any more... */
            atomic_store(&released, rel + 1000);
            rel += 1000;
        }
        static size_t freed;
        /* ...and free only below the mark of every reader at work. */
        size_t floor = rel;
        for (int i = 0; i < READERS; i++)
            if (atomic_load(&using[i]) < floor)
                floor = atomic_load(&using[i]);
        while (freed < floor) {
            log_release(L, locs[freed]);
            freed++;
        }
        deleted += log_delete_dead(L);
        if ((at / 1000) % 20 == 0)
            CHECK_RC(log_sync(L), EMBKV_OK);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < READERS; i++)
        pthread_join(th[i], NULL);
    fold_thread_checks();
    log_stats st;
    log_stats_get(L, &st);
    CHECK(deleted > 0 && st.deleted_segments == deleted);
    CHECK(st.reads > 0);
    printf("appended %zu, read %llu, deleted %zu segments, mean read depth %.1f\n", total,
           (unsigned long long)st.reads, deleted, st.mean_read_depth);
    log_close(L);
    free(buf);
    free(locs);
    return test_summary("test_concurrency_log");
}
