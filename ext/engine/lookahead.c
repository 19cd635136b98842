/*
 * lookahead.c - reading the SSD-resident rows of future batches ahead of
 * their pull (embkv_lookahead), in the spirit of MLKV's look-ahead.
 *
 * A caller that knows the next batches' ids hands them over; the call looks
 * each id up, and for every row whose home is the log (rows in the pool are
 * in memory already) reserves a staging buffer and queues the read.  One
 * thread per store takes the queue in batches and reads them with log_read
 * (one io_uring submission per batch, as deep as the batch).  The read
 * paths (tier_read) ask the stage first: a row staged READY is copied from
 * it (a hit), a row still QUEUED or READING is waited for (late) rather
 * than read twice, anything else is read from the log as before.
 *
 * Why a DRAM stage and not a move into the pool: the stage costs no pool
 * write, no persistence and no index change, and a row pulled for training
 * is pushed right after, which writes its new version into the pool anyway.
 * The stage is keyed by id and log location: log records never change while
 * an index entry holds them and segment numbers are never reused, so a
 * staged copy whose location still is the index's is the row.  A copy whose
 * row moved or was written meanwhile is dropped when found.
 *
 * Bounds: the stage holds at most `cap` rows (32 MiB of records, between
 * 1024 and 262144 rows), allocated on the first call.  A staged row stays
 * until it is read once (pulled) or, when the stage is full, until it is the
 * oldest READY row and a new one needs its buffer; rows in flight are never
 * dropped, so a look-ahead that finds the stage full of them queues fewer
 * rows (the count returned says how many).  Rows dropped unread count as
 * wasted.  A pull's copies kept for its push (KEPT) are the stage's
 * leftovers: they take free buffers or other KEPT ones, never a READY
 * row's, so a large pull does not undo the look-ahead of the next batch.  Look-ahead takes no permits and touches no access statistics.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tiers.h"

#define LA_BYTES (32u << 20)
#define LA_MIN_ROWS 1024u
#define LA_MAX_ROWS 262144u
#define LA_READ_MAX 1024u    /* rows per log_read */

/* READY: read ahead, not yet pulled.  KEPT: read once already (a pull took
 * it, or a pull read it from the log and offered it): the push that follows
 * a pull finds it, and drops it. */
enum { LA_FREE, LA_QUEUED, LA_READING, LA_READY, LA_FAILED, LA_KEPT };

typedef struct la_slot {
    int64_t id;
    uint64_t loc;
    uint64_t seq;              /* when it was queued (for oldest-first drops) */
    uint8_t state;
} la_slot;

struct lookahead {
    pthread_mutex_t mu;
    pthread_cond_t work;       /* queue not empty, or stop */
    pthread_cond_t done;       /* some read finished */
    pthread_t thread;
    bool stop;

    uint32_t cap;              /* staging buffers */
    char *bufs;                /* cap records */
    la_slot *slots;
    uint32_t *freelist;        /* free buffer numbers */
    uint32_t nfree;
    /* id -> buffer number + 1 (0: empty), linear probing with backward-shift
     * deletion, 2 x cap entries */
    uint32_t *table;
    uint32_t tmask;
    /* buffers in the order they were queued (a ring, 2 x cap entries: each
     * buffer has at most one live entry; stale ones are skipped) */
    uint32_t *order;
    uint64_t *order_seq;
    uint32_t omask, ohead, otail;
    /* buffers waiting to be read (a ring of cap entries) */
    uint32_t *queue;
    uint32_t qhead, qtail;
    uint64_t seq;

    /* statistics (under mu) */
    uint64_t queued, hits, late, wasted, reads, read_rows, wait_ns;
};

/* ------------------------------------------------------------ the table */

static inline uint32_t la_home(const struct lookahead *la, int64_t id)
{
    return (uint32_t)(embkv__hash(id) & la->tmask);
}

/* The buffer staging id, or UINT32_MAX. */
static uint32_t la_find(const struct lookahead *la, int64_t id)
{
    for (uint32_t i = la_home(la, id);; i = (i + 1) & la->tmask) {
        uint32_t b = la->table[i];
        if (b == 0)
            return UINT32_MAX;
        if (la->slots[b - 1].id == id)
            return b - 1;
    }
}

static void la_insert(struct lookahead *la, int64_t id, uint32_t buf)
{
    uint32_t i = la_home(la, id);
    while (la->table[i])
        i = (i + 1) & la->tmask;
    la->table[i] = buf + 1;
}

static void la_unlink(struct lookahead *la, int64_t id)
{
    uint32_t i = la_home(la, id);
    while (la->table[i] && la->slots[la->table[i] - 1].id != id)
        i = (i + 1) & la->tmask;
    if (!la->table[i])
        return;
    /* Backward shift: pull later entries of the run into the hole when
     * their home does not lie between the hole and them. */
    for (uint32_t j = i;;) {
        la->table[i] = 0;
        for (;;) {
            j = (j + 1) & la->tmask;
            if (!la->table[j])
                return;
            uint32_t h = la_home(la, la->slots[la->table[j] - 1].id);
            if (((j - h) & la->tmask) >= ((j - i) & la->tmask))
                break;
        }
        la->table[i] = la->table[j];
        i = j;
    }
}

/* Drops buffer b's row and frees the buffer. */
static void la_drop(struct lookahead *la, uint32_t b, bool wasted)
{
    la_unlink(la, la->slots[b].id);
    la->slots[b].state = LA_FREE;
    la->freelist[la->nfree++] = b;
    if (wasted)
        la->wasted++;
}

/* A free buffer, dropping the oldest READY, FAILED or KEPT row if none is
 * free; UINT32_MAX when every buffer holds a row in flight.  For a pull's
 * offer (keep_ready), a READY row is as good as in flight: it was staged
 * for a batch still to come, which a copy kept for the push that follows
 * this one must not cost its read. */
static uint32_t la_buffer(struct lookahead *la, bool keep_ready)
{
    while (la->nfree == 0 && la->ohead != la->otail) {
        uint32_t b = la->order[la->ohead & la->omask];
        uint64_t seq = la->order_seq[la->ohead & la->omask];
        la_slot *sl = &la->slots[b];
        if (sl->state == LA_FREE || sl->seq != seq) {
            la->ohead++;       /* read already, or the buffer was reused */
            continue;
        }
        if (sl->state == LA_QUEUED || sl->state == LA_READING)
            return UINT32_MAX; /* the oldest is in flight: so is all behind it */
        if (keep_ready && sl->state == LA_READY)
            return UINT32_MAX; /* (the rest behind it: not worth a search) */
        la->ohead++;
        la_drop(la, b, sl->state == LA_READY);
    }
    return la->nfree ? la->freelist[--la->nfree] : UINT32_MAX;
}

/* Buffer b, just filled, is the newest in the drop order. */
static void la_order(struct lookahead *la, uint32_t b)
{
    if (la->otail - la->ohead == la->omask + 1)
        la->ohead++;  /* the ring is full of stale entries: the oldest goes */
    la->order[la->otail & la->omask] = b;
    la->order_seq[la->otail++ & la->omask] = la->slots[b].seq;
}

/* ------------------------------------------------------------ the reader */

static void *la_main(void *arg)
{
    embkv_store *s = arg;
    struct lookahead *la = s->la;
    uint32_t *bufs = malloc(LA_READ_MAX * sizeof *bufs);
    uint64_t *locs = malloc(LA_READ_MAX * sizeof *locs);
    char *tmp = malloc((size_t)LA_READ_MAX * s->rec_size);
    pthread_mutex_lock(&la->mu);
    for (;;) {
        while (!la->stop && la->qhead == la->qtail)
            pthread_cond_wait(&la->work, &la->mu);
        if (la->stop)
            break;
        uint32_t n = 0;
        while (la->qhead != la->qtail && n < LA_READ_MAX) {
            uint32_t b = la->queue[la->qhead++ % la->cap];
            if (la->slots[b].state != LA_QUEUED)
                continue;
            la->slots[b].state = LA_READING;
            bufs[n] = b;
            locs[n++] = la->slots[b].loc;
        }
        if (n == 0)
            continue;
        pthread_mutex_unlock(&la->mu);
        int rc = bufs && locs && tmp ? EMBKV_OK : EMBKV_NOMEM;
        /* Inside an epoch, as every reader of the log: a row written since
         * it was queued keeps its segment until this read is over. */
        ebr_enter();
        if (rc == EMBKV_OK)
            rc = log_read(s->log, locs, n, tmp, NULL);
        ebr_leave();
        pthread_mutex_lock(&la->mu);
        la->reads++;
        la->read_rows += n;
        for (uint32_t i = 0; i < n; i++) {
            la_slot *sl = &la->slots[bufs[i]];
            /* FAILED: the pull reads it itself and reports the error. */
            sl->state = rc == EMBKV_OK ? LA_READY : LA_FAILED;
            if (rc == EMBKV_OK)
                memcpy(la->bufs + (size_t)bufs[i] * s->rec_size, tmp + (size_t)i * s->rec_size, s->rec_size);
        }
        pthread_cond_broadcast(&la->done);
    }
    pthread_mutex_unlock(&la->mu);
    free(bufs);
    free(locs);
    free(tmp);
    return NULL;
}

static void la_free(struct lookahead *la)
{
    if (!la)
        return;
    pthread_mutex_destroy(&la->mu);
    pthread_cond_destroy(&la->work);
    pthread_cond_destroy(&la->done);
    free(la->bufs);
    free(la->slots);
    free(la->freelist);
    free(la->table);
    free(la->order);
    free(la->order_seq);
    free(la->queue);
    free(la);
}

/* With s->la_mu held. */
static int la_start(embkv_store *s)
{
    struct lookahead *la = calloc(1, sizeof *la);
    if (!la)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for look-ahead", s->path);
    pthread_mutex_init(&la->mu, NULL);
    pthread_cond_init(&la->work, NULL);
    pthread_cond_init(&la->done, NULL);
    uint64_t cap = LA_BYTES / s->rec_size;
    cap = cap < LA_MIN_ROWS ? LA_MIN_ROWS : cap > LA_MAX_ROWS ? LA_MAX_ROWS : cap;
    la->cap = (uint32_t)cap;
    uint32_t t = 1;
    while (t < 2 * la->cap)
        t <<= 1;
    la->tmask = t - 1;
    la->omask = t - 1;
    la->bufs = malloc((size_t)la->cap * s->rec_size);
    la->slots = calloc(la->cap, sizeof *la->slots);
    la->freelist = malloc(la->cap * sizeof *la->freelist);
    la->table = calloc(t, sizeof *la->table);
    la->order = malloc(t * sizeof *la->order);
    la->order_seq = malloc(t * sizeof *la->order_seq);
    la->queue = malloc(la->cap * sizeof *la->queue);
    if (!la->bufs || !la->slots || !la->freelist || !la->table || !la->order || !la->order_seq || !la->queue) {
        la_free(la);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for look-ahead's %u-row stage", s->path,
                          (unsigned)cap);
    }
    for (uint32_t i = 0; i < la->cap; i++)
        la->freelist[i] = la->cap - 1 - i;
    la->nfree = la->cap;
    s->la = la;
    int e = pthread_create(&la->thread, NULL, la_main, s);
    if (e != 0) {
        s->la = NULL;
        la_free(la);
        return embkv__err(EMBKV_NOMEM, "store %s: cannot start the look-ahead thread: %s", s->path, strerror(e));
    }
    return EMBKV_OK;
}

static int la_ensure(embkv_store *s)
{
    if (s->la)
        return EMBKV_OK;
    pthread_mutex_lock(&s->la_mu);
    int rc = s->la ? EMBKV_OK : la_start(s);
    pthread_mutex_unlock(&s->la_mu);
    return rc;
}

void la_close(embkv_store *s)
{
    struct lookahead *la = s->la;
    if (!la)
        return;
    pthread_mutex_lock(&la->mu);
    la->stop = true;
    pthread_cond_broadcast(&la->work);
    pthread_mutex_unlock(&la->mu);
    pthread_join(la->thread, NULL);
    s->la = NULL;
    la_free(la);
}

/* ------------------------------------------------------------ the API */

int embkv_lookahead(embkv_store *s, const int64_t *ids, size_t n, size_t *queued)
{
    if (queued)
        *queued = 0;
    if (s && s->reader)
        return EMBKV_OK;  /* (a hint: a reader process stages nothing) */
    if (!s || (n && !ids))
        return embkv__err(EMBKV_INVALID, "embkv_lookahead: %s is NULL", s ? "ids" : "store");
    if (!s->log || n == 0)
        return EMBKV_OK;
    int rc = la_ensure(s);
    if (rc != EMBKV_OK)
        return rc;
    struct lookahead *la = s->la;
    uint64_t *locs = malloc(n * sizeof *locs);
    if (!locs)
        return embkv__err(EMBKV_NOMEM, "embkv_lookahead: out of memory for %zu ids", n);
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    for (size_t i = 0; i < n; i++) {
        uint32_t probes;
        uint64_t h = embkv__hash(ids[i]);
        /* A cached row is in memory whatever its home (the cache is read
         * first). */
        locs[i] = s->cache && cache_contains(s->cache, ids[i], h) ? LOC_NONE : ix_lookup(ix, ids[i], h, &probes);
    }
    ebr_leave();
    size_t k = 0;
    pthread_mutex_lock(&la->mu);
    for (size_t i = 0; i < n; i++) {
        if (!(locs[i] & LOC_SSD) || (locs[i] & LOC_TOMB))
            continue;          /* in the pool, deleted or absent */
        uint32_t b = la_find(la, ids[i]);
        if (b != UINT32_MAX) {
            if (la->slots[b].loc == locs[i])
                continue;      /* staged or on its way */
            if (la->slots[b].state == LA_QUEUED || la->slots[b].state == LA_READING)
                continue;      /* an older copy in flight: let it land, the pull drops it */
            la_drop(la, b, la->slots[b].state == LA_READY);
        }
        if ((b = la_buffer(la, false)) == UINT32_MAX)
            break;             /* the stage is full of rows in flight */
        la_slot *sl = &la->slots[b];
        sl->id = ids[i];
        sl->loc = locs[i];
        sl->seq = ++la->seq;
        sl->state = LA_QUEUED;
        la_insert(la, ids[i], b);
        la_order(la, b);
        la->queue[la->qtail++ % la->cap] = b;
        k++;
    }
    la->queued += k;
    if (k)
        pthread_cond_signal(&la->work);
    pthread_mutex_unlock(&la->mu);
    free(locs);
    if (queued)
        *queued = k;
    return EMBKV_OK;
}

size_t la_take(embkv_store *s, const int64_t *ids, const uint64_t *locs, size_t k, char *out, uint8_t *got,
               bool consume)
{
    struct lookahead *la = s->la;
    memset(got, 0, k);
    if (!la)
        return 0;
    size_t n = 0;
    uint64_t t0 = 0;
    pthread_mutex_lock(&la->mu);
    for (bool again = true, waited = false; again;) {
        again = false;
        for (size_t j = 0; j < k; j++) {
            if (got[j])
                continue;
            uint32_t b = la_find(la, ids[j]);
            if (b == UINT32_MAX)
                continue;
            la_slot *sl = &la->slots[b];
            if (sl->loc != locs[j]) {
                /* The row moved or was written: this copy is not it. */
                if (sl->state == LA_READY || sl->state == LA_FAILED || sl->state == LA_KEPT)
                    la_drop(la, b, sl->state == LA_READY);
                continue;
            }
            if (sl->state == LA_QUEUED || sl->state == LA_READING) {
                again = true;  /* in flight: wait for it */
                continue;
            }
            if (sl->state == LA_FAILED) {
                la_drop(la, b, false);  /* the caller reads it and reports why */
                continue;
            }
            memcpy(out + j * s->rec_size, la->bufs + (size_t)b * s->rec_size, s->rec_size);
            got[j] = 1;
            n++;
            if (sl->state == LA_READY) {
                if (waited)
                    la->late++;
                else
                    la->hits++;
            }
            /* A write replaces the row: its copy is of no further use.  (An
             * id repeated in a write's batch reads the log the second time.) */
            if (consume)
                la_drop(la, b, false);
            else
                sl->state = LA_KEPT;
        }
        if (again) {
            if (!waited)
                t0 = now_ns();
            waited = true;
            pthread_cond_wait(&la->done, &la->mu);
        }
    }
    if (t0)
        la->wait_ns += now_ns() - t0;
    pthread_mutex_unlock(&la->mu);
    return n;
}

void la_offer(embkv_store *s, const int64_t *ids, const uint64_t *locs, rec_hdr *const *recs, size_t n)
{
    if (!s->log || n == 0 || la_ensure(s) != EMBKV_OK)
        return;
    struct lookahead *la = s->la;
    pthread_mutex_lock(&la->mu);
    for (size_t i = 0; i < n; i++) {
        uint32_t b = la_find(la, ids[i]);
        if (b != UINT32_MAX) {
            if (la->slots[b].loc == locs[i] || la->slots[b].state == LA_QUEUED ||
                la->slots[b].state == LA_READING)
                continue;
            la_drop(la, b, la->slots[b].state == LA_READY);
        }
        if ((b = la_buffer(la, true)) == UINT32_MAX)
            break;
        la_slot *sl = &la->slots[b];
        sl->id = ids[i];
        sl->loc = locs[i];
        sl->seq = ++la->seq;
        sl->state = LA_KEPT;
        memcpy(la->bufs + (size_t)b * s->rec_size, recs[i], s->rec_size);
        la_insert(la, ids[i], b);
        la_order(la, b);
    }
    pthread_mutex_unlock(&la->mu);
}

void la_stats(embkv_store *s, embkv_stats *st)
{
    struct lookahead *la = s->la;
    if (!la)
        return;
    pthread_mutex_lock(&la->mu);
    st->lookahead_queued = la->queued;
    st->lookahead_hits = la->hits;
    st->lookahead_late = la->late;
    st->lookahead_wasted = la->wasted;
    st->lookahead_staged = la->cap - la->nfree;
    st->lookahead_capacity = la->cap;
    st->lookahead_wait_ns = la->wait_ns;
    pthread_mutex_unlock(&la->mu);
}
