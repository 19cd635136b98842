/*
 * migrate.c - background hot-set migration (PetPS's migration thread):
 * what embkv_hotset_move does when asked, done continuously at a rate the
 * application bounds (embkv_options.migrate_rate, rows per second).
 *
 * A round ranks the hottest rows (embkv_hottest: one pass over the index)
 * and moves them up in chunks, hottest first: log to pool, displaced key to
 * its home bucket, into the DRAM cache.  Rows already where they belong
 * cost a probe and count nothing, so the rate bounds the work that matters
 * (records copied, buckets rewritten, cache admissions); a token bucket
 * (below) keeps the moves within rate x time since the thread started,
 * with at most one second's worth at once.  The ranking is the expensive
 * part on a large table, so rounds begin at most once per MG_PERIOD_MS,
 * and never sooner than ten times the last ranking's duration after it:
 * at most a tenth of a core goes to ranking whatever the table's size;
 * and none while nothing is counted.
 *
 * How many rows a round considers (the hot set's size): with a cache, 7/8
 * of its rows (the rest stays for what admission brings in between
 * rounds); without one, half of what the pool's records hold (hot rows in
 * the pool, in their home bucket); at most MG_MAX_HOT either way.
 *
 * The thread only calls the public operations, which take their own locks,
 * so it needs no lock of its own beyond its sleep.  A failed move (a full
 * pool, a damaged log record) is counted and the round ends; the next one
 * tries again.  Statistics must count for a ranking to mean anything, so
 * starting the thread turns them on.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ops.h"

#define MG_PERIOD_MS 1000
#define MG_CHUNK 256
#define MG_MAX_HOT (4u << 20)

/* Sleeps ns or until stopped; false once the thread must stop. */
static bool mg_sleep(embkv_store *s, uint64_t ns)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    uint64_t t = (uint64_t)until.tv_nsec + ns % 1000000000ull;
    until.tv_sec += (time_t)(ns / 1000000000ull + t / 1000000000ull);
    until.tv_nsec = (long)(t % 1000000000ull);
    pthread_mutex_lock(&s->mg_mu);
    while (!s->mg_stop) {
        if (pthread_cond_timedwait(&s->mg_cond, &s->mg_mu, &until) == ETIMEDOUT)
            break;
    }
    bool go_on = !s->mg_stop;
    pthread_mutex_unlock(&s->mg_mu);
    return go_on;
}

static size_t hot_target(embkv_store *s)
{
    uint64_t n;
    if (s->cache) {
        n = cache_capacity(s->cache) / 8 * 7;
    } else {
        /* The slab learns its chunk limit late (a reopened pool only when
         * a chunk is refused); the pool's bytes bound it from the start. */
        uint64_t cap = s->chunk_limit ? (uint64_t)s->chunk_limit * s->recs_per_chunk : UINT64_MAX,
                 by_size = s->pool_size / s->rec_size;
        n = (cap < by_size ? cap : by_size) / 2;
    }
    return (size_t)(n > MG_MAX_HOT ? MG_MAX_HOT : n < 1 ? 1 : n);
}

/* The rate's token bucket: a move costs a token; tokens accrue at the
 * rate from the thread's start, up to one second's worth (at least enough
 * for one chunk).  A chunk of k ids is charged its worst case, three moves
 * an id, before it runs and refunded what it did not move, so the moves
 * never run ahead of rate x time, whatever a chunk turns out to do. */
typedef struct bucket_of_moves {
    double tokens;
    uint64_t last_ns;
} bucket_of_moves;

static double bom_cap(uint64_t rate)
{
    double one_second = (double)rate;
    return one_second > 3.0 * MG_CHUNK ? one_second : 3.0 * MG_CHUNK;
}

static void bom_refill(bucket_of_moves *b, uint64_t rate)
{
    uint64_t now = now_ns();
    b->tokens += (double)rate * (double)(now - b->last_ns) * 1e-9;
    if (b->tokens > bom_cap(rate))
        b->tokens = bom_cap(rate);
    b->last_ns = now;
}

/* One round: rank, then move within the rate.  Returns the ranking's
 * time; *whole says whether every ranked row was offered a move. */
static uint64_t mg_round(embkv_store *s, int64_t *ids, size_t cap, bucket_of_moves *b, bool *whole)
{
    uint64_t t0 = now_ns();
    size_t want = hot_target(s), n = 0;
    *whole = false;
    if (want > cap)
        want = cap;
    if (embkv_hottest(s, want, ids, NULL, &n) != EMBKV_OK) {
        atomic_fetch_add(&s->st_mg_errors, 1);
        return now_ns() - t0;
    }
    uint64_t t1 = now_ns();
    size_t at = 0;
    while (at < n) {
        uint64_t rate = atomic_load_explicit(&s->mg_rate, memory_order_relaxed);
        bom_refill(b, rate);
        if (b->tokens < 3.0) {
            if (!mg_sleep(s, (uint64_t)((3.0 - b->tokens) / (double)rate * 1e9) + 1000))
                break;
            continue;
        }
        size_t k = (size_t)(b->tokens / 3.0);
        if (k > MG_CHUNK)
            k = MG_CHUNK;
        if (k > n - at)
            k = n - at;
        b->tokens -= 3.0 * (double)k;
        embkv_moves mv;
        if (hotset_move(s, ids + at, k, &mv, false) != EMBKV_OK) {
            atomic_fetch_add(&s->st_mg_errors, 1);
            b->tokens += 3.0 * (double)k;
            break;
        }
        uint64_t m = mv.to_pm + mv.home_bucket + mv.to_dram;
        b->tokens += 3.0 * (double)k - (double)m;
        atomic_fetch_add(&s->st_mg_moved, m);
        at += k;
    }
    *whole = at >= n;
    atomic_fetch_add(&s->st_mg_rounds, 1);
    return t1 - t0;
}

static void *mg_main(void *arg)
{
    embkv_store *s = arg;
    int64_t *ids = NULL;
    size_t cap = 0;
    uint64_t wait_ns = MG_PERIOD_MS * 1000000ull, seen = UINT64_MAX;
    bool whole = false;
    bucket_of_moves b = {0, now_ns()};
    while (mg_sleep(s, wait_ns)) {
        /* Nothing counted since a round that offered every ranked row a
         * move: the ranking would be the same, and every row is in place
         * (a row only leaves its place when something is counted).  An
         * idle table costs no ranking. */
        uint64_t touches = heat_touches(s->heat);
        if (whole && touches == seen) {
            wait_ns = MG_PERIOD_MS * 1000000ull;
            continue;
        }
        seen = touches;
        size_t want = hot_target(s);
        if (want > cap) {
            int64_t *p = realloc(ids, want * sizeof *ids);
            if (p) {
                ids = p;
                cap = want;
            }
        }
        if (!cap) {
            atomic_fetch_add(&s->st_mg_errors, 1);
            continue;
        }
        uint64_t start = now_ns(), rank_ns = mg_round(s, ids, cap, &b, &whole);
        uint64_t spent = now_ns() - start, next = MG_PERIOD_MS * 1000000ull;
        if (10 * rank_ns > next)
            next = 10 * rank_ns;
        wait_ns = next > spent ? next - spent : 0;
        if (wait_ns < 1000000)
            wait_ns = 1000000;
    }
    free(ids);
    return NULL;
}

int migrate_start(embkv_store *s, uint64_t rate)
{
    if (rate == 0)
        return EMBKV_OK;
    if (s->mg_started) {
        /* A later open: its rate is the store's from now on; one that
         * asks for migration at any rate shares the running one. */
        if (rate != EMBKV_MIGRATE_ANY)
            atomic_store(&s->mg_rate, rate);
        return EMBKV_OK;
    }
    atomic_store(&s->mg_rate, rate == EMBKV_MIGRATE_ANY ? EMBKV_MIGRATE_DEFAULT_RATE : rate);
    s->mg_stop = false;
    embkv_heat_enable(s);
    int e = pthread_create(&s->mg_thread, NULL, mg_main, s);
    if (e != 0)
        return embkv__err(EMBKV_NOMEM, "store %s: cannot start the migration thread (option migrate_rate): %s",
                          s->path, strerror(e));
    s->mg_started = true;
    return EMBKV_OK;
}

void migrate_stop(embkv_store *s)
{
    if (!s->mg_started)
        return;
    pthread_mutex_lock(&s->mg_mu);
    s->mg_stop = true;
    pthread_cond_broadcast(&s->mg_cond);
    pthread_mutex_unlock(&s->mg_mu);
    pthread_join(s->mg_thread, NULL);
    s->mg_started = false;
}
