/*
 * tier_worker.c - the SSD tier's background thread: keeps free room in the
 * pool (demotion at a watermark), moves rows that reads admitted back into
 * the pool (promotion), and compacts the log at a bounded rate.
 *
 * Why a thread: the foreground path can only demote when an allocation
 * already failed, so writers would stall on a log append and an fdatasync
 * every 1/64 of the pool.  The thread starts demoting once the pool's
 * record space has run out of chunks to add and fewer than 1/32 of its
 * records are free (past the delete reserve), and stops at 1/16: writers
 * find room and the foreground demotion stays a fallback for bursts faster
 * than the thread.  Promotions only use room above the 1/32 mark, so they
 * never push the pool into the foreground path; when there is not enough,
 * colder rows are demoted for them (admission already found them hotter).
 *
 * Compaction reads at most COMPACT_RATE bytes of segment per second, in
 * parts of COMPACT_PART (compact.c), so a background rewrite cannot take
 * the device from foreground reads for long.  Once the log's files pass
 * 3/4 of ssd_size the rate is COMPACT_URGENT_RATE: there, a slow
 * compaction would make demotion, and so writes, fail at ssd_size.  The thread wakes every
 * TW_TICK_MS, or when kicked (tests, embkv_tier_idle).
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "tiers.h"

#define TW_TICK_MS 20
#define COMPACT_RATE (64ull << 20)
#define COMPACT_URGENT_RATE (256ull << 20)
#define COMPACT_PART (1ull << 20)

/* Counting starts well before demotion does (at half the room): by the
 * time rows must leave, the statistics have seen the workload. */
static void count_for_tier(embkv_store *s, size_t total, bool exhausted)
{
    bool live = exhausted || atomic_load(&s->rows_ssd) > 0 ||
                2 * (uint64_t)total >= (uint64_t)s->chunk_limit * s->recs_per_chunk;
    if (live != ((atomic_load_explicit(&s->heat_live, memory_order_relaxed) & HEAT_FOR_TIER) != 0)) {
        if (live)
            atomic_fetch_or_explicit(&s->heat_live, HEAT_FOR_TIER, memory_order_relaxed);
        else
            atomic_fetch_and_explicit(&s->heat_live, ~HEAT_FOR_TIER, memory_order_relaxed);
    }
}

/* One round of the thread's work; returns whether it did anything. */
static bool tw_round(embkv_store *s, uint64_t *tokens)
{
    bool busy = false;
    if (atomic_load(&s->tw_paused))
        return false;
    size_t free_recs, total;
    bool exhausted;
    slab_space(s, &free_recs, &total, &exhausted);
    count_for_tier(s, total, exhausted);
    size_t low = total / 32 + s->delete_reserve, high = total / 16 + s->delete_reserve;
    if (exhausted && free_recs < low) {
        size_t moved = 0;
        if (tier_demote(s, high - free_recs, &moved) == EMBKV_OK && moved)
            busy = true;
        slab_space(s, &free_recs, &total, &exhausted);
    }
    if (tier_promote_pending(s)) {
        /* (Above the mark and the room groups in flight hold; a pool that
         * may still grow adds chunks: slab_alloc_move keeps that room.) */
        size_t floor = low + atomic_load(&s->room_held);
        size_t room = !exhausted ? SIZE_MAX : free_recs > floor ? free_recs - floor : 0;
        size_t moved = 0;
        if (tier_promote_queued(s, room, exhausted, &moved) == EMBKV_OK && moved)
            busy = true;
    }
    while (*tokens >= COMPACT_PART) {
        uint64_t scanned = 0;
        if (compact_step(s, COMPACT_PART, &scanned) != EMBKV_OK || scanned == 0)
            break;
        *tokens -= scanned < *tokens ? scanned : *tokens;
        busy = true;
    }
    return busy;
}

static void *tw_main(void *arg)
{
    embkv_store *s = arg;
    uint64_t tokens = COMPACT_PART, last = now_ns();
    pthread_mutex_lock(&s->tw_mu);
    while (!s->tw_stop) {
        if (!s->tw_kick) {
            struct timespec until = deadline_after_ms(TW_TICK_MS);
            pthread_cond_timedwait(&s->tw_cond, &s->tw_mu, &until);
        }
        if (s->tw_stop)
            break;
        bool kicked = s->tw_kick;
        s->tw_kick = false;
        pthread_mutex_unlock(&s->tw_mu);
        uint64_t now = now_ns();
        bool urgent = compact_urgent(s);
        tokens += (uint64_t)((double)(now - last) * 1e-9 * (double)(urgent ? COMPACT_URGENT_RATE : COMPACT_RATE));
        if (tokens > (urgent ? 16 : 4) * COMPACT_PART && !kicked)
            tokens = (urgent ? 16 : 4) * COMPACT_PART;
        if (kicked && tokens < COMPACT_PART)
            tokens = COMPACT_PART;
        last = now;
        bool busy = tw_round(s, &tokens);
        pthread_mutex_lock(&s->tw_mu);
        s->tw_rounds++;
        s->tw_last_idle = !busy;
        pthread_cond_broadcast(&s->tw_done);
    }
    pthread_mutex_unlock(&s->tw_mu);
    return NULL;
}

int tier_worker_start(embkv_store *s)
{
    if (!s->log || s->tw_started)
        return EMBKV_OK;
    /* (a store opened with rows in the log counts its first reads, not
     * only those after the thread's first round) */
    size_t free_recs, total;
    bool exhausted;
    slab_space(s, &free_recs, &total, &exhausted);
    count_for_tier(s, total, exhausted);
    s->tw_stop = false;
    int e = pthread_create(&s->tw_thread, NULL, tw_main, s);
    if (e != 0)
        return embkv__err(EMBKV_NOMEM, "store %s: cannot start the SSD tier's thread: %s", s->path, strerror(e));
    s->tw_started = true;
    return EMBKV_OK;
}

void tier_worker_stop(embkv_store *s)
{
    if (!s->tw_started)
        return;
    pthread_mutex_lock(&s->tw_mu);
    s->tw_stop = true;
    pthread_cond_broadcast(&s->tw_cond);
    pthread_mutex_unlock(&s->tw_mu);
    pthread_join(s->tw_thread, NULL);
    s->tw_started = false;
}

int embkv_tier_idle(embkv_store *s, int timeout_ms)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_tier_idle: store is NULL");
    if (!s->tw_started)
        return EMBKV_OK;
    uint64_t deadline = now_ns() + (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * 1000000ull;
    pthread_mutex_lock(&s->tw_mu);
    int rc = EMBKV_OK;
    /* Idle: a whole round that found nothing to do, begun after this call. */
    for (;;) {
        uint64_t rounds0 = s->tw_rounds;
        s->tw_kick = true;
        pthread_cond_broadcast(&s->tw_cond);
        while (s->tw_rounds < rounds0 + 2 && !s->tw_stop) {
            struct timespec until = deadline_after_ms(10);
            pthread_cond_timedwait(&s->tw_done, &s->tw_mu, &until);
            if (now_ns() > deadline)
                break;
        }
        if (s->tw_rounds >= rounds0 + 2 && s->tw_last_idle)
            break;
        if (now_ns() > deadline) {
            rc = embkv__err(EMBKV_BUSY, "store %s: the SSD tier's thread was still busy after %d ms", s->path,
                            timeout_ms);
            break;
        }
    }
    pthread_mutex_unlock(&s->tw_mu);
    return rc;
}
