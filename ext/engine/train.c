/*
 * train.c - pull/push training on a store: optimizers applied in the store,
 * deferred initialization of missing rows, per-embedding bounded staleness.
 *
 * Staleness permits (MLKV): a pull takes a permit on each distinct id of
 * its batch, a push returns it, and a pull waits while its id already has
 * staleness+1 permits out; the counts are exact per id (permits.c).  A pull
 * takes its ids in ascending order, one at a time, so two pulls never hold
 * part of what the other waits for in opposite orders; a pull that times
 * out returns what it took in that call.  Each session remembers the permits
 * it holds, per id, and returns them when it closes.
 *
 * Initialization (MTrainS deferred init): a missing id's values are a pure
 * function of (seed, id, element) through a counter-based generator, so
 * creating rows needs no shared random state and no queue, and the same
 * seed gives the same values whatever the order of calls.
 */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ops.h"
#include "embkv_debug.h"

/* The optimizers' loops and the finiteness checks in clones for wider
 * vector units, the one for this CPU picked when the library loads: built
 * for baseline x86-64, a row of doubles takes SSE2 four times the
 * instructions it takes AVX-512 (measured: a third of a cached push's
 * time).  Every clone computes the same values: IEEE operations, each
 * rounded as written (ISO C mode contracts nothing into FMA).  Only
 * where the C library resolves them at load time (glibc's ifunc), and not
 * under ThreadSanitizer, whose instrumented resolver would run before the
 * sanitizer is set up. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(__SANITIZE_THREAD__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef VECTOR_CLONES
#define VECTOR_CLONES
#endif

/* Permit counts are 32-bit: a bound below 2^31 leaves them room. */
#define STALENESS_LIMIT (0x80000000u - 1)

struct train_state {
    embkv_train_options opt;          /* current options (guarded by mu for writes) */
    pthread_mutex_t mu;
    permit_table *permits;
    admit_sketch *_Atomic admit;      /* pull counts of missing ids; made when admission is configured */
    atomic_uint_fast64_t pulls, pushes, created, waits, timeouts, refused, dropped;
};

struct embkv_session {
    embkv_store *s;
    /* A call of the session under way: its permit table and batch memo
     * have no lock, a session being one thread's (a second call at once
     * is refused, not let corrupt them). */
    atomic_int busy;
    /* Permits held: id -> count (0: empty slot), linear probing. */
    int64_t *keys;
    uint32_t *counts;
    size_t cap, n;
    /* The distinct ids of the session's last batch (distinct_of): a push
     * of the batch just pulled finds them here (kept after the push only
     * for batches up to MEMO_KEEP ids). */
    int64_t *last_ids, *last_uniq;
    size_t *last_slot_of;
    size_t last_n, last_nu, last_cap;
};

/* ------------------------------------------------------------ options */

void embkv_train_defaults(embkv_train_options *o)
{
    if (!o)
        return;  /* (nothing to fill) */
    memset(o, 0, sizeof *o);
    o->optimizer = EMBKV_SGD;
    o->lr = 0.01;
    o->initial_accumulator = 0.0;
    o->eps = 1e-10;
    o->beta1 = 0.9;
    o->beta2 = 0.999;
    o->init = EMBKV_INIT_NONE;
    o->staleness = EMBKV_STALENESS_UNLIMITED;
    o->wait_ms = 5000;
}

uint32_t embkv_train_state_floats(const embkv_train_options *o, uint32_t dim)
{
    if (!o)
        return 0;  /* (an accessor: 0 for no options, as for a NULL store) */
    switch (o->optimizer) {
    case EMBKV_ADAGRAD: return dim;
    case EMBKV_ADAM: return 2 * dim + 1;
    default: return 0;
    }
}

static int validate(embkv_store *s, const embkv_train_options *o)
{
    if (o->optimizer < EMBKV_SGD || o->optimizer > EMBKV_ADAM)
        return embkv__err(EMBKV_INVALID, "store %s: option optimizer: unknown optimizer %d", s->path, o->optimizer);
    if (!(o->lr > 0) || !isfinite(o->lr))
        return embkv__err(EMBKV_INVALID, "store %s: option lr must be a positive finite number, got %g", s->path,
                          o->lr);
    if (embkv_train_state_floats(o, s->dim) > s->state_floats)
        return embkv__err(EMBKV_INVALID, "store %s: the optimizer needs %u state floats per row, the store has %u",
                          s->path, embkv_train_state_floats(o, s->dim), s->state_floats);
    if (!(o->eps > 0) || !isfinite(o->eps))
        return embkv__err(EMBKV_INVALID, "store %s: option eps must be a positive finite number, got %g", s->path,
                          o->eps);
    if (!(o->initial_accumulator >= 0) || !isfinite(o->initial_accumulator))
        return embkv__err(EMBKV_INVALID, "store %s: option initial_accumulator must be >= 0, got %g", s->path,
                          o->initial_accumulator);
    if (!(o->beta1 >= 0 && o->beta1 < 1) || !(o->beta2 >= 0 && o->beta2 < 1))
        return embkv__err(EMBKV_INVALID, "store %s: options beta1 and beta2 must be in [0, 1)", s->path);
    if (o->init < EMBKV_INIT_NONE || o->init > EMBKV_INIT_NORMAL)
        return embkv__err(EMBKV_INVALID, "store %s: option init: unknown initializer %d", s->path, o->init);
    /* Initial values must be numbers the table's dtype holds: uniform's
     * bounds within its range, and normal's mean +- 9 std (beyond the
     * largest deviate the generator can draw, about 8.6). */
    double top = dtype_max((int)s->dtype);
    const char *range = s->dtype == EMBKV_F32 ? "float32" : dtype_name((int)s->dtype);
    if (!isfinite(o->init_a) || !isfinite(o->init_b) ||
        (o->init == EMBKV_INIT_UNIFORM &&
         !(o->init_a < o->init_b && fabs(o->init_a) <= top && fabs(o->init_b) <= top)) ||
        (o->init == EMBKV_INIT_NORMAL && !(o->init_b >= 0 && fabs(o->init_a) + 9 * o->init_b <= top)))
        return embkv__err(EMBKV_INVALID, "store %s: option init: %s within %s range (at most %g)", s->path,
                          o->init == EMBKV_INIT_NORMAL ? "normal(mean, std) needs std >= 0 and |mean| + 9 std"
                                                       : "uniform(a, b) needs a < b, both",
                          range, top);
    if (o->admit_count > 255)
        return embkv__err(EMBKV_INVALID, "store %s: option admit: count(N) takes N from 1 to 255, got %u", s->path,
                          o->admit_count);
    if (o->admit_count > 1 && o->init == EMBKV_INIT_NONE)
        return embkv__err(EMBKV_INVALID,
                          "store %s: option admit needs an initializer (init): an id not yet admitted is read as "
                          "its initial values",
                          s->path);
    if (o->staleness < EMBKV_STALENESS_UNLIMITED || o->staleness >= (int64_t)STALENESS_LIMIT)
        return embkv__err(EMBKV_INVALID, "store %s: option staleness must be from 0 to %lld, or "
                          "EMBKV_STALENESS_UNLIMITED, got %lld", s->path, (long long)STALENESS_LIMIT - 1,
                          (long long)o->staleness);
    if (o->rounding != EMBKV_ROUND_NEAREST && o->rounding != EMBKV_ROUND_STOCHASTIC)
        return embkv__err(EMBKV_INVALID, "store %s: option rounding: unknown rounding %d (nearest or stochastic)",
                          s->path, o->rounding);
    if (o->rounding == EMBKV_ROUND_STOCHASTIC && s->dtype == EMBKV_F32)
        return embkv__err(EMBKV_INVALID,
                          "store %s: option rounding: stochastic rounding needs a dtype below float32 (f16, bf16 or "
                          "i8); the store keeps f32",
                          s->path);
    if (o->evict != EMBKV_EVICT_LFU && o->evict != EMBKV_EVICT_LRU)
        return embkv__err(EMBKV_INVALID, "store %s: option evict: unknown policy %d (lfu or lru)", s->path, o->evict);
    if (o->evict == EMBKV_EVICT_LRU && !o->max_rows)
        return embkv__err(EMBKV_INVALID,
                          "store %s: option evict: lru ranks the rows past max_rows, and max_rows is not set: give "
                          "max_rows too (ttl and ttl_steps need no evict)",
                          s->path);
    if (o->ttl_ms > EMBKV_TTL_MAX_MS)
        return embkv__err(EMBKV_INVALID, "store %s: option ttl_ms is at most %llu ms, got %llu", s->path,
                          (unsigned long long)EMBKV_TTL_MAX_MS, (unsigned long long)o->ttl_ms);
    if (o->ttl_steps > EMBKV_TTL_MAX_STEPS)
        return embkv__err(EMBKV_INVALID, "store %s: option ttl_steps is at most %llu, got %llu", s->path,
                          (unsigned long long)EMBKV_TTL_MAX_STEPS, (unsigned long long)o->ttl_steps);
    if (o->max_rows > EMBKV_MAX_ROWS_MAX)
        return embkv__err(EMBKV_INVALID, "store %s: option max_rows is at most %llu, got %llu", s->path,
                          (unsigned long long)EMBKV_MAX_ROWS_MAX, (unsigned long long)o->max_rows);
    return EMBKV_OK;
}

static struct train_state *train_of(embkv_store *s)
{
    return atomic_load_explicit(&s->train, memory_order_acquire);
}

int embkv_train_configure(embkv_store *s, const embkv_train_options *o)
{
    if (!s || !o)
        return embkv__null_arg("embkv_train_configure", "s", (const void *)s, "o", (const void *)o, (char *)NULL);
    FORK_REFUSE(s, "embkv_train_configure");
    if (s && s->reader)
        return EMBKV_OK; /* (a reader process trains nothing: its pulls read, its pushes are refused) */
    int rc = validate(s, o);
    if (rc != EMBKV_OK)
        return rc;
    pthread_mutex_lock(&s->slab_mu);  /* serializes first configuration */
    struct train_state *t = train_of(s);
    if (!t) {
        t = calloc(1, sizeof *t);
        if (t)
            t->permits = permits_new();
        if (!t || !t->permits) {
            free(t);
            pthread_mutex_unlock(&s->slab_mu);
            return embkv__err(EMBKV_NOMEM, "store %s: out of memory for the permit table", s->path);
        }
        pthread_mutex_init(&t->mu, NULL);
        t->opt = *o;
        atomic_store_explicit(&s->train, t, memory_order_release);
    } else {
        pthread_mutex_lock(&t->mu);
        t->opt = *o;
        /* (With the options, under their lock: a pull reads both at once.) */
        permits_bump(t->permits);
        pthread_mutex_unlock(&t->mu);
    }
    /* The counts, once admission is asked for (kept if it is turned off
     * and on again: they are still counts of pulls). */
    if (o->admit_count > 1 && !atomic_load(&t->admit)) {
        admit_sketch *a = admit_new(atomic_load(&s->index_slots));
        if (!a) {
            pthread_mutex_unlock(&s->slab_mu);
            return embkv__err(EMBKV_NOMEM, "store %s: out of memory for the admission counts", s->path);
        }
        atomic_store(&t->admit, a);
    }
    pthread_mutex_unlock(&s->slab_mu);
    atomic_store(&s->round_seed, o->seed ^ 0x726f756e64696e67ull);
    atomic_store(&s->round_stochastic, o->rounding == EMBKV_ROUND_STOCHASTIC);
    rc = evict_configure(s, o, t->permits);
    /* Pulls waiting for a permit wait under the options they read: they
     * take the new ones (a bound raised or lifted lets them go at once). */
    permits_wake(t->permits);
    return rc;
}

static embkv_train_options options_now(struct train_state *t)
{
    pthread_mutex_lock(&t->mu);
    embkv_train_options o = t->opt;
    pthread_mutex_unlock(&t->mu);
    return o;
}

/* The options with the permit table's generation they were read under
 * (take_permits). */
static embkv_train_options options_gen(struct train_state *t, unsigned *gen)
{
    pthread_mutex_lock(&t->mu);
    embkv_train_options o = t->opt;
    *gen = permits_gen(t->permits);
    pthread_mutex_unlock(&t->mu);
    return o;
}

void train_free(embkv_store *s)
{
    struct train_state *t = train_of(s);
    if (!t)
        return;
    permits_free(t->permits);
    admit_free(atomic_load(&t->admit));
    pthread_mutex_destroy(&t->mu);
    free(t);
}

int embkv_train_stats_get(embkv_store *s, embkv_train_stats *st)
{
    if (!s || !st)
        return embkv__null_arg("embkv_train_stats_get", "s", (const void *)s, "st", (const void *)st, (char *)NULL);
    memset(st, 0, sizeof *st);
    struct train_state *t = train_of(s);
    if (t) {
        st->pulls = atomic_load(&t->pulls);
        st->pushes = atomic_load(&t->pushes);
        st->rows_created = atomic_load(&t->created);
        st->permit_waits = atomic_load(&t->waits);
        st->permit_timeouts = atomic_load(&t->timeouts);
        st->admit_refused = atomic_load(&t->refused);
        st->admit_dropped = atomic_load(&t->dropped);
        st->admit_bytes = admit_bytes(atomic_load(&t->admit));
    }
    evict_stats(s, st);
    return EMBKV_OK;
}

/* ------------------------------------------------------------ sessions */

int embkv_session_open(embkv_store *s, embkv_session **out)
{
    if (!s || !out)
        return embkv__null_arg("embkv_session_open", "s", (const void *)s, "out", (const void *)out, (char *)NULL);
    RO_REFUSE(s, "embkv_pull and embkv_push (training sessions)");
    if (!train_of(s))
        return embkv__err(EMBKV_INVALID, "store %s: not configured for training (embkv_train_configure)", s->path);
    embkv_session *ss = calloc(1, sizeof *ss);
    if (!ss)
        return embkv__err(EMBKV_NOMEM, "embkv_session_open: out of memory");
    ss->s = s;
    atomic_fetch_add(&s->open_sessions, 1);
    *out = ss;
    return EMBKV_OK;
}

static size_t held_slot(const embkv_session *ss, int64_t id)
{
    size_t m = ss->cap - 1, i = embkv__hash(id) & m;
    while (ss->counts[i] && ss->keys[i] != id)
        i = (i + 1) & m;
    return i;
}

static int held_add(embkv_session *ss, int64_t id)
{
    if ((ss->n + 1) * 2 > ss->cap) {
        size_t cap = ss->cap ? ss->cap * 2 : 1024;
        int64_t *k = calloc(cap, sizeof *k);
        uint32_t *c = calloc(cap, sizeof *c);
        if (!k || !c) {
            free(k);
            free(c);
            return EMBKV_NOMEM;
        }
        embkv_session old = *ss;
        ss->keys = k;
        ss->counts = c;
        ss->cap = cap;
        for (size_t i = 0; i < old.cap; i++) {
            if (old.counts[i]) {
                size_t j = held_slot(ss, old.keys[i]);
                ss->keys[j] = old.keys[i];
                ss->counts[j] = old.counts[i];
            }
        }
        free(old.keys);
        free(old.counts);
    }
    size_t i = held_slot(ss, id);
    if (!ss->counts[i]) {
        ss->keys[i] = id;
        ss->n++;
    }
    ss->counts[i]++;
    return EMBKV_OK;
}

/* Takes one held permit on id off the books; false if none held. */
static bool held_take(embkv_session *ss, int64_t id)
{
    if (!ss->cap)
        return false;
    size_t i = held_slot(ss, id), m = ss->cap - 1;
    if (!ss->counts[i])
        return false;
    if (--ss->counts[i] > 0)
        return true;
    /* Backward-shift deletion keeps probe runs unbroken. */
    ss->n--;
    for (size_t j = (i + 1) & m; ss->counts[j]; j = (j + 1) & m) {
        size_t home = embkv__hash(ss->keys[j]) & m;
        if (((j - home) & m) >= ((j - i) & m)) {
            ss->keys[i] = ss->keys[j];
            ss->counts[i] = ss->counts[j];
            ss->counts[j] = 0;
            i = j;
        }
    }
    return true;
}

/* ------------------------------------------------------------ permits */

unsigned embkv_debug_permits(embkv_store *s, int64_t id)
{
    struct train_state *t = train_of(s);
    return t ? permit_count(t->permits, id) : 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Distinct ids ascending (a global order: see the top of the file). */
static int64_t *sorted_distinct(const int64_t *ids, size_t n, size_t *nd)
{
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return NULL;
    memcpy(v, ids, n * sizeof *v);
    qsort(v, n, sizeof *v, cmp_i64);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (k == 0 || v[k - 1] != v[i])
            v[k++] = v[i];
    *nd = k;
    return v;
}

/* ------------------------------------------------------------ init */

static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static void init_values(const embkv_train_options *o, int64_t id, float *v, uint32_t dim)
{
    uint64_t base = mix64(o->seed ^ mix64((uint64_t)id));
    for (uint32_t j = 0; j < dim; j++) {
        uint64_t x = mix64(base + j);
        switch (o->init) {
        case EMBKV_INIT_UNIFORM:
            v[j] = (float)(o->init_a + (o->init_b - o->init_a) * ((double)(x >> 11) * 0x1p-53));
            if (v[j] >= (float)o->init_b)  /* rounding to float can reach b */
                v[j] = nextafterf((float)o->init_b, (float)o->init_a);
            break;
        case EMBKV_INIT_NORMAL: {
            /* Box-Muller on two independent uniforms of this element. */
            double u1 = ((double)(x >> 11) + 0.5) * 0x1p-53;
            double u2 = (double)(mix64(x) >> 11) * 0x1p-53;
            v[j] = (float)(o->init_a + o->init_b * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
            break;
        }
        default:
            v[j] = 0.0f;
        }
    }
}

/* Create each listed missing id (ids distinct) from the initializer
 * (insert-only: a row created meanwhile by another thread is left alone). */
static int create_rows(embkv_store *s, struct train_state *t, const embkv_train_options *o, const int64_t *ids,
                       size_t n)
{
    /* All or none: a pool without room for every row fails before any. */
    int rc = embkv_grow_index_for(s, n);
    if (rc == EMBKV_OK)
        rc = embkv_room_for(s, n, 0);
    if (rc != EMBKV_OK)
        return embkv__err(rc, "cannot create %zu missing row(s), the first id %lld: %s", n, (long long)ids[0],
                          embkv_errmsg());
    float *v = malloc(4 * (size_t)s->dim);
    uint8_t *made = calloc(n ? n : 1, 1);
    if (!v || !made) {
        free(v);
        free(made);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
    }
    /* One write group: a snapshot or a checkpoint has all of them or none. */
    if ((rc = embkv_group_begin(s)) != EMBKV_OK) {
        free(v);
        free(made);
        return rc;
    }
    size_t i, nmade = 0;
    for (i = 0; i < n && rc == EMBKV_OK; i++) {
        init_values(o, ids[i], v, s->dim);
        rc = embkv_put(s, ids[i], v, NULL, EMBKV_PUT_INSERT);
        if (rc == EMBKV_OK)
            made[i] = 1, nmade++;
        else if (rc == EMBKV_EXISTS)
            rc = EMBKV_OK;
    }
    if (rc != EMBKV_OK && nmade) {
        /* The room checked above was not a reservation: writers beside
         * this one took it.  The rows made so far go again, inside the
         * same group, so that no reader and no checkpoint sees a part of
         * the batch (deletes have records set aside for them). */
        char why[512];
        snprintf(why, sizeof why, "%s", embkv_errmsg());
        size_t left = 0;
        for (size_t k = 0; k < i; k++)
            if (made[k] && embkv_delete(s, ids[k]) != EMBKV_OK)
                left++;
        nmade = left;
        embkv__err(rc, "%s%s", why, left ? " (and some of the rows made before it could not be taken back)" : "");
    }
    atomic_fetch_add(&t->created, nmade);
    embkv_group_end(s);
    free(v);
    free(made);
    return rc;
}

/* ------------------------------------------------------------ batches */

#define MEMO_KEEP 65536

static void memo_drop(embkv_session *ss)
{
    free(ss->last_ids);
    free(ss->last_uniq);
    free(ss->last_slot_of);
    ss->last_ids = ss->last_uniq = NULL;
    ss->last_slot_of = NULL;
    ss->last_n = ss->last_nu = ss->last_cap = 0;
}

/* The distinct ids of a batch, as ids_distinct gives them, in the
 * session's memory (valid until its next batch): computed once for a pull
 * and the push of the same ids that follows it.  EMBKV_NOMEM (no message)
 * when out of memory. */
static int distinct_of(embkv_session *ss, const int64_t *ids, size_t n, const int64_t **uniq,
                       const size_t **slot_of, size_t *nu)
{
    if (ss->last_n != n || memcmp(ss->last_ids, ids, n * sizeof *ids) != 0) {
        if (n > ss->last_cap) {
            memo_drop(ss);
            ss->last_ids = malloc(n * sizeof *ss->last_ids);
            ss->last_uniq = malloc(n * sizeof *ss->last_uniq);
            ss->last_slot_of = malloc(n * sizeof *ss->last_slot_of);
            ss->last_cap = ss->last_ids && ss->last_uniq && ss->last_slot_of ? n : 0;
        }
        ss->last_n = 0;
        if (ss->last_cap < n || ids_distinct(ids, n, ss->last_uniq, ss->last_slot_of, &ss->last_nu) != EMBKV_OK)
            return EMBKV_NOMEM;
        memcpy(ss->last_ids, ids, n * sizeof *ids);
        ss->last_n = n;
    }
    *uniq = ss->last_uniq;
    *slot_of = ss->last_slot_of;
    *nu = ss->last_nu;
    return EMBKV_OK;
}

/* ------------------------------------------------------------ pull */

/* Read a batch; duplicates are read once, into the row of their first
 * occurrence, and copied, so that every copy of an id shows the same
 * version even while another thread pushes to it. */
static int read_batch(embkv_session *ss, const int64_t *ids, size_t n, float *out, uint8_t *found, size_t *missing)
{
    embkv_store *s = ss->s;
    const int64_t *uniq;
    const size_t *slot_of;
    size_t nu = 0;
    if (distinct_of(ss, ids, n, &uniq, &slot_of, &nu) != EMBKV_OK)
        return embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory for %zu ids", n);
    if (nu == n)
        return embkv_get_batch(s, ids, n, out, found, missing);
    size_t *first = malloc(nu * sizeof *first);
    uint8_t *ufound = malloc(nu);
    int rc = EMBKV_OK;
    if (!first || !ufound) {
        rc = embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory for %zu ids", n);
    } else {
        /* uniq is in first-seen order */
        for (size_t i = 0, k = 0; i < n; i++)
            if (slot_of[i] == k)
                first[k++] = i;
        rc = get_batch_rows(s, uniq, nu, out, first, ufound, NULL);
        *missing = 0;
        for (size_t i = 0; i < n && rc == EMBKV_OK; i++) {
            size_t u = slot_of[i];
            if (first[u] != i)
                memcpy(out + i * s->dim, out + first[u] * s->dim, 4 * (size_t)s->dim);
            found[i] = ufound[u];
            *missing += !found[i];
        }
    }
    free(first);
    free(ufound);
    return rc;
}

static void return_taken(embkv_session *ss, struct train_state *t, const int64_t *st, size_t k)
{
    for (size_t i = 0; i < k; i++) {
        held_take(ss, st[i]);
        permit_return(t->permits, st[i]);
    }
}

/* Admission: counts a pull of each distinct missing id (umiss[0..*nu));
 * keeps in umiss, in order, those that reached admit_count (*nu of them
 * after), and sets *refuse[m] for each of the k missing occurrences
 * (slot_of[m]: its distinct id) whose id did not. */
static int admit_split(struct train_state *t, const embkv_train_options *o, int64_t *umiss, size_t *nu,
                       uint8_t **refuse, const size_t *slot_of, size_t k)
{
    uint8_t *no = malloc(*nu ? *nu : 1);
    *refuse = malloc(k ? k : 1);
    if (!no || !*refuse) {
        free(no);
        free(*refuse);
        *refuse = NULL;
        return embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory");
    }
    admit_sketch *a = atomic_load(&t->admit);
    size_t w = 0, refused = 0;
    for (size_t j = 0; j < *nu; j++) {
        no[j] = admit_touch(a, umiss[j]) < o->admit_count;
        refused += no[j];
    }
    for (size_t m = 0; m < k; m++)
        (*refuse)[m] = no[slot_of[m]];
    for (size_t j = 0; j < *nu; j++)
        if (!no[j])
            umiss[w++] = umiss[j];
    *nu = w;
    free(no);
    atomic_fetch_add(&t->refused, refused);
    return EMBKV_OK;
}

/* Whether the session holds a permit on id. */
static bool held_has(const embkv_session *ss, int64_t id)
{
    return ss->cap && ss->counts[held_slot(ss, id)] != 0;
}

int embkv_pull(embkv_session *ss, const int64_t *ids, size_t n, float *out)
{
    return embkv_pull_ex(ss, ids, n, out, 0);
}

/* The permits a pull may find out on an id before it waits (0: none
 * taken).  With eviction on, every pull holds its rows until their push
 * (a bound of its own that is never reached in practice). */
static unsigned permit_bound(embkv_store *s, const embkv_train_options *o)
{
    return o->staleness != EMBKV_STALENESS_UNLIMITED ? (unsigned)o->staleness + 1
           : evict_holds_pulls(s)                     ? STALENESS_LIMIT
                                                      : 0;
}

/* A pull's permits: one per distinct id of ids (with EMBKV_PULL_ONCE,
 * none on those the session holds one on), waiting up to wait_ms.  o and
 * gen as options_gen read them; new options installed meanwhile apply
 * from the next id, and to the id waited on (its wait is woken): a bound
 * lifted takes no more permits.  On success *st holds the ids this call
 * took one on (*taken of them; NULL without a bound), for a failure later
 * to give back; on failure nothing is held. */
static int take_permits(embkv_session *ss, struct train_state *t, const embkv_train_options *o, unsigned gen,
                        const int64_t *ids, size_t n, unsigned flags, int64_t **st_out, size_t *taken_out)
{
    embkv_store *s = ss->s;
    int64_t *st = NULL;
    size_t nst = 0, taken = 0;
    *st_out = NULL;
    *taken_out = 0;
    unsigned bound = permit_bound(s, o);
    if (!bound)
        return EMBKV_OK;
    embkv_train_options cur = *o;  /* (read again when they change) */
    st = sorted_distinct(ids, n, &nst);
    if (!st)
        return embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory");
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += o->wait_ms / 1000;
    deadline.tv_nsec += (long)(o->wait_ms % 1000) * 1000000L;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec++;
        deadline.tv_nsec -= 1000000000L;
    }
    bool waited_any = false;
    /* st[0..taken) becomes the ids this call took a permit on (with
     * EMBKV_PULL_ONCE, those the session held already are skipped):
     * what a failure gives back. */
    for (size_t i = 0; i < nst; i++) {
        int64_t id = st[i];
        if ((flags & EMBKV_PULL_ONCE) && held_has(ss, id))
            continue;
        bool waited = false;
        int prc;
        while ((prc = permit_take(t->permits, id, bound, gen, &deadline, &waited)) == PERMIT_RECHECK) {
            cur = options_gen(t, &gen);
            if (!(bound = permit_bound(s, &cur)))
                break;
        }
        waited_any |= waited;
        if (prc == PERMIT_RECHECK)
            break;  /* no bound now: the rest are pulled without a permit */
        if (prc != EMBKV_OK) {
            return_taken(ss, t, st, taken);
            free(st);
            if (prc == EMBKV_NOMEM)
                return embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory for the permit of id %lld",
                                  (long long)id);
            atomic_fetch_add(&t->waits, 1);
            atomic_fetch_add(&t->timeouts, 1);
            return embkv__err(EMBKV_BUSY,
                              "id %lld: staleness bound %lld reached: still %lld pull%s without a push "
                              "after %u ms",
                              (long long)id, (long long)cur.staleness, (long long)cur.staleness + 1,
                              cur.staleness ? "s" : "", o->wait_ms);
        }
        if (held_add(ss, id) != EMBKV_OK) {
            permit_return(t->permits, id);
            return_taken(ss, t, st, taken);
            free(st);
            return embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory");
        }
        st[taken++] = id;
    }
    if (waited_any)
        atomic_fetch_add(&t->waits, 1);
    *st_out = st;
    *taken_out = taken;
    return EMBKV_OK;
}

/* A pull's ids that had no row (found[i] false, missing of them): created
 * from the initializer, or refused by admission.  With out (the CPU
 * path), the created rows are read back into it and a refused id's row is
 * its initial values; without (a device pull), a refused id's initial
 * values go to given_rows with given[i] set, and the created rows are for
 * the gather to read. */
static int pull_missing(embkv_session *ss, struct train_state *t, const embkv_train_options *o, const int64_t *ids,
                        size_t n, const uint8_t *found, size_t missing, float *out, uint8_t *given,
                        float *given_rows)
{
    embkv_store *s = ss->s;
    int rc = EMBKV_OK;
    int64_t *miss = malloc(missing * sizeof *miss), *umiss = malloc(missing * sizeof *umiss);
    size_t *slot_of = malloc(missing * sizeof *slot_of);
    size_t k = 0, nu = 0;
    if (!miss || !umiss || !slot_of) {
        rc = embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory");
    } else {
        for (size_t i = 0; i < n; i++)
            if (!found[i])
                miss[k++] = ids[i];
        uint8_t *refuse = NULL;  /* per distinct missing id: not admitted yet */
        if (o->init == EMBKV_INIT_NONE)
            rc = embkv__err(EMBKV_NOTFOUND, "id %lld not found (the table has no initializer)", (long long)miss[0]);
        else if (ids_distinct(miss, k, umiss, slot_of, &nu) != EMBKV_OK)
            rc = embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory");
        else if (o->admit_count > 1 && atomic_load(&t->admit))
            rc = admit_split(t, o, umiss, &nu, &refuse, slot_of, k);
        if (rc == EMBKV_OK && nu)
            rc = create_rows(s, t, o, umiss, nu);
        /* Read the created rows back: another thread may have created
         * (and even updated) some of them first.  An id not admitted
         * reads as its initial values. */
        for (size_t i = 0, m = 0; i < n && rc == EMBKV_OK; i++) {
            if (found[i])
                continue;
            if (refuse && refuse[m++]) {
                /* (as its row would keep them: rounded to the dtype) */
                float *v = out ? out + i * s->dim : given_rows + i * s->dim;
                init_values(o, ids[i], v, s->dim);
                (void)embkv_dtype_round(s->dtype, s->dim, v, v);  /* (init fits the dtype: validate) */
                if (!out)
                    given[i] = 1;
                continue;
            }
            if (!out)
                continue;
            rc = get_uncounted(s, ids[i], out + i * s->dim);
            if (rc == EMBKV_NOTFOUND)
                rc = embkv__err(EMBKV_BUSY, "id %lld was deleted while being pulled", (long long)ids[i]);
        }
        free(refuse);
    }
    free(miss);
    free(umiss);
    free(slot_of);
    return rc;
}

/* A pull's arguments (fn: the function, in errors). */
static int pull_check(embkv_session *ss, const int64_t *ids, size_t n, const void *out, const char *out_name,
                      unsigned flags, const char *fn)
{
    if (!ss || (n && (!ids || !out)))
        return embkv__null_arg(fn, "ss", (const void *)ss, "ids", (const void *)ids, out_name, (const void *)out,
                               (char *)NULL);
    if (flags & ~(unsigned)EMBKV_PULL_ONCE)
        return embkv__err(EMBKV_INVALID, "%s: store %s: unknown flags 0x%x (known: EMBKV_PULL_ONCE)", fn, ss->s->path,
                          flags & ~(unsigned)EMBKV_PULL_ONCE);
    RO_REFUSE(ss->s, fn);
    return EMBKV_OK;
}

/* A pull's end: the permits it took back when it failed, its rows
 * counted when not. */
static int pull_end(embkv_session *ss, struct train_state *t, int64_t *st, size_t taken, size_t n, int rc)
{
    if (rc != EMBKV_OK)
        return_taken(ss, t, st, taken);
    else
        atomic_fetch_add(&t->pulls, n);
    free(st);
    return rc;
}

static int pull_ex_unguarded(embkv_session *ss, const int64_t *ids, size_t n, float *out, unsigned flags)
{
    int rc = pull_check(ss, ids, n, out, "out", flags, "embkv_pull");
    if (rc != EMBKV_OK || n == 0)
        return rc;
    FORK_REFUSE(ss->s, "embkv_pull");
    embkv_store *s = ss->s;
    struct train_state *t = train_of(s);
    unsigned gen;
    embkv_train_options o = options_gen(t, &gen);
    int64_t *st = NULL;
    size_t taken = 0;
    if ((rc = take_permits(ss, t, &o, gen, ids, n, flags, &st, &taken)) != EMBKV_OK)
        return rc;
    uint8_t *found = malloc(n);
    size_t missing = 0;
    cache_pull_begin(s->cache);
    if (!found)
        rc = embkv__err(EMBKV_NOMEM, "embkv_pull: out of memory");
    else
        rc = read_batch(ss, ids, n, out, found, &missing);
    if (rc == EMBKV_OK && missing)
        rc = pull_missing(ss, t, &o, ids, n, found, missing, out, NULL, NULL);
    cache_pull_end(s->cache);
    free(found);
    return pull_end(ss, t, st, taken, n, rc);
}

/* The device pull: the permits, then the rows that are missing made (or
 * refused), then one gather of them all (gather.c), which reads a
 * repeated id once, as read_batch does. */
static int pull_device_unguarded(embkv_session *ss, const int64_t *ids, size_t n, void *dev_out, void *stream, unsigned flags)
{
    int rc = pull_check(ss, ids, n, dev_out, "dev_out", flags, "embkv_pull_device");
    if (rc != EMBKV_OK || n == 0)
        return rc;
    embkv_store *s = ss->s;
    /* No permit is taken and no row made before the device and the
     * address are known to be usable (a launch may still fail after). */
    if ((rc = gpu_target_check(s, dev_out)) != EMBKV_OK)
        return rc;
    struct train_state *t = train_of(s);
    unsigned gen;
    embkv_train_options o = options_gen(t, &gen);
    int64_t *st = NULL;
    size_t taken = 0;
    if ((rc = take_permits(ss, t, &o, gen, ids, n, flags, &st, &taken)) != EMBKV_OK)
        return rc;
    uint8_t *found = malloc(n), *given = NULL;
    float *given_rows = NULL;
    size_t missing = 0;
    cache_pull_begin(s->cache);
    if (!found) {
        rc = embkv__err(EMBKV_NOMEM, "embkv_pull_device: out of memory");
    } else {
        size_t absent = embkv_exists_batch(s, ids, n, found);
        if (absent) {
            given = calloc(n, 1);
            given_rows = malloc(n * 4 * (size_t)s->dim);
            rc = given && given_rows ? pull_missing(ss, t, &o, ids, n, found, absent, NULL, given, given_rows)
                                     : embkv__err(EMBKV_NOMEM, "embkv_pull_device: out of memory");
        }
    }
    int64_t gone = 0;
    if (rc == EMBKV_OK)
        rc = gpu_gather(s, ids, n, dev_out, stream, given, given_rows, &missing, &gone, "embkv_pull_device");
    if (rc == EMBKV_OK && missing)
        rc = embkv__err(EMBKV_BUSY, "id %lld was deleted while being pulled", (long long)gone);
    cache_pull_end(s->cache);
    free(found);
    free(given);
    free(given_rows);
    return pull_end(ss, t, st, taken, n, rc);
}

/* ------------------------------------------------------------ push */

/* Whether no element is NaN or infinite: the exponent bits all set.  One
 * branch-free pass the compiler vectorizes; the slow search for the culprit
 * runs only when there is one. */
VECTOR_CLONES static bool all_finite(const float *v, size_t n)
{
    uint32_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &v[i], 4);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    return !bad;
}

/* A push's gradient per distinct id: the caller's row for an id that came
 * once, a sum in double for one that came more than once.  (One double row
 * per id of the batch would be a quarter megabyte to clear and fill per
 * push of 512 ids of dim 64, for the few ids a batch repeats.) */
typedef struct push_grads {
    const float *grads;  /* the caller's, n rows */
    size_t *first;       /* per distinct id: its first row in grads */
    uint32_t *sum_of;    /* per distinct id: its row in sums, or UINT32_MAX */
    double *sums;        /* summed rows of the repeated ids */
} push_grads;

static void push_grads_free(push_grads *pg)
{
    free(pg->first);
    free(pg->sum_of);
    free(pg->sums);
}

/* dst = 0.0 + src (first) or dst += src, in double: a Zipf batch repeats
 * its hottest ids dozens of times. */
VECTOR_CLONES static void grad_add(double *restrict dst, const float *restrict src, uint32_t dim, bool first)
{
    if (first)
        for (uint32_t j = 0; j < dim; j++)
            dst[j] = 0.0 + src[j];
    else
        for (uint32_t j = 0; j < dim; j++)
            dst[j] += src[j];
}

/* Fills pg for the n rows of grads whose distinct ids are slot_of's
 * (nu of them).  False when out of memory. */
static bool push_grads_make(push_grads *pg, const float *grads, const size_t *slot_of, size_t n, size_t nu,
                            uint32_t dim)
{
    memset(pg, 0, sizeof *pg);
    pg->grads = grads;
    pg->first = malloc((nu ? nu : 1) * sizeof *pg->first);
    pg->sum_of = malloc((nu ? nu : 1) * sizeof *pg->sum_of);
    if (!pg->first || !pg->sum_of)
        return false;
    memset(pg->first, 0xff, nu * sizeof *pg->first);    /* SIZE_MAX: not seen */
    memset(pg->sum_of, 0xff, nu * sizeof *pg->sum_of);  /* UINT32_MAX: seen once */
    uint32_t nsums = 0;
    for (size_t i = 0; i < n; i++) {
        size_t u = slot_of[i];
        if (pg->first[u] == SIZE_MAX)
            pg->first[u] = i;
        else if (pg->sum_of[u] == UINT32_MAX)
            pg->sum_of[u] = nsums++;
    }
    if (!nsums)
        return true;
    pg->sums = malloc((size_t)nsums * dim * sizeof *pg->sums);
    if (!pg->sums)
        return false;
    /* In the order of the batch, from 0.0 + the first row on: the same
     * sums, bit for bit, as adding every row to a zeroed one. */
    for (size_t i = 0; i < n; i++) {
        size_t u = slot_of[i];
        if (pg->sum_of[u] != UINT32_MAX)
            grad_add(pg->sums + (size_t)pg->sum_of[u] * dim, grads + i * dim, dim, pg->first[u] == i);
    }
    return true;
}

typedef struct push_ctx {
    const embkv_train_options *o;
    double lr;
    const push_grads *grad;
    uint32_t dim, state_floats;
    float limit;         /* the largest magnitude the table's dtype holds */
    size_t overflowed;   /* rows left unchanged: their update was not finite, or beyond the dtype */
    int64_t overflow_id; /* the first of them */
} push_ctx;

static inline uint32_t not_finite(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
}

/* One optimizer step over a row, g(j) its gradient in double, in one pass
 * that also notes whether a new value is not finite (a second pass over
 * the row cost a quarter of a cached push).  Returns nonzero if one is.
 * The row, its state and the gradient are restrict-qualified: without
 * that the compiler must assume a store to state[j] may change w or the
 * gradient, and left every element scalar (a double sqrt and divide each,
 * measured at 40% of a push of cached adagrad rows of dim 64).  Vector
 * lanes compute the same IEEE operations as the scalar loop, each rounded
 * as written: the values do not change. */
#define OPTIMIZER_STEPS(SUFFIX, GT)                                                                        \
    static inline uint32_t adagrad_##SUFFIX(float *restrict w, float *restrict state, const GT *restrict g, \
                                            uint32_t dim, double lr, double init_acc, double eps)           \
    {                                                                                                     \
        uint32_t bad = 0;                                                                                 \
        /* state holds acc - initial_accumulator, so a zero state is a fresh row. */                    \
        for (uint32_t j = 0; j < dim; j++) {                                                              \
            double gj = 0.0 + g[j], acc = (double)state[j] + gj * gj;                                     \
            float sj = (float)acc, wj = (float)(w[j] - lr * gj / (sqrt(acc + init_acc) + eps));           \
            state[j] = sj;                                                                                \
            w[j] = wj;                                                                                    \
            bad |= not_finite(wj) | not_finite(sj);                                                       \
        }                                                                                                 \
        return bad;                                                                                       \
    }                                                                                                     \
    static inline uint32_t adam_##SUFFIX(float *restrict w, float *restrict m, float *restrict v,          \
                                         const GT *restrict g, uint32_t dim, double lr, double beta1,      \
                                         double beta2, double bc1, double bc2, double eps)                 \
    {                                                                                                     \
        uint32_t bad = 0;                                                                                 \
        for (uint32_t j = 0; j < dim; j++) {                                                              \
            double gj = 0.0 + g[j];                                                                       \
            double mj = beta1 * m[j] + (1.0 - beta1) * gj;                                                \
            double vj = beta2 * v[j] + (1.0 - beta2) * gj * gj;                                           \
            float mf = (float)mj, vf = (float)vj, wf = (float)(w[j] - lr * (mj / bc1) / (sqrt(vj / bc2) + eps)); \
            m[j] = mf;                                                                                    \
            v[j] = vf;                                                                                    \
            w[j] = wf;                                                                                    \
            bad |= not_finite(wf) | not_finite(mf) | not_finite(vf);                                      \
        }                                                                                                 \
        return bad;                                                                                       \
    }                                                                                                     \
    static inline uint32_t sgd_##SUFFIX(float *restrict w, const GT *restrict g, uint32_t dim, double lr)   \
    {                                                                                                     \
        uint32_t bad = 0;                                                                                 \
        for (uint32_t j = 0; j < dim; j++) {                                                              \
            float wf = (float)(w[j] - lr * (0.0 + g[j]));                                                 \
            w[j] = wf;                                                                                    \
            bad |= not_finite(wf);                                                                        \
        }                                                                                                 \
        return bad;                                                                                       \
    }                                                                                                     \
    static inline uint32_t step_##SUFFIX(const embkv_train_options *o, float *w, float *state,             \
                                         const GT *g, uint32_t dim, double lr)                            \
    {                                                                                                     \
        switch (o->optimizer) {                                                                           \
        case EMBKV_ADAGRAD:                                                                               \
            return adagrad_##SUFFIX(w, state, g, dim, lr, o->initial_accumulator, o->eps);                \
        case EMBKV_ADAM: {                                                                                \
            double t = (double)state[2 * dim] + 1.0;                                                      \
            state[2 * dim] = (float)t;                                                                    \
            uint32_t bad = not_finite(state[2 * dim]);                                                    \
            double bc1 = 1.0 - pow(o->beta1, t), bc2 = 1.0 - pow(o->beta2, t);                            \
            return bad | adam_##SUFFIX(w, state, state + dim, g, dim, lr, o->beta1, o->beta2, bc1, bc2,     \
                                       o->eps);                                                           \
        }                                                                                                 \
        default:                                                                                          \
            return sgd_##SUFFIX(w, g, dim, lr);                                                           \
        }                                                                                                 \
    }

/* A gradient that came once is the caller's float row, widened as it is
 * added to a zeroed sum (0.0 + g: -0 becomes +0); a summed one is in
 * double. */
OPTIMIZER_STEPS(once, float)
OPTIMIZER_STEPS(summed, double)

VECTOR_CLONES static int apply_optimizer(void *vctx, size_t i, int64_t id, float *w, float *state)
{
    push_ctx *c = vctx;
    if (!w)
        return 1;  /* deleted since the existence check: skipped */
    const push_grads *pg = c->grad;
    const uint32_t dim = c->dim;
    uint32_t bad;
    if (pg->sum_of[i] == UINT32_MAX)
        bad = step_once(c->o, w, state, pg->grads + pg->first[i] * dim, dim, c->lr);
    else
        bad = step_summed(c->o, w, state, pg->sums + (size_t)pg->sum_of[i] * dim, dim, c->lr);
    /* A table never holds NaN or Inf (INSERT refuses them too): an update
     * that overflows float32 (or the table's dtype) leaves the row as it
     * was (w and state are the new version, dropped when this returns
     * nonzero). */
    if (c->limit < FLT_MAX)
        for (uint32_t j = 0; j < dim; j++)
            bad |= !(fabsf(w[j]) <= c->limit);
    if (bad) {
        if (c->overflowed++ == 0)
            c->overflow_id = id;
        return 1;
    }
    return 0;
}

/* A push of many rows updates them on two threads: each row's update is a
 * chain of cache misses (its bucket, its old version, the new record), and
 * one core keeps only so many in flight (measured: a TransE step's push of
 * 30,000 adagrad rows of dim 64 at ~450 ns a row on one thread).  The
 * helper works inside the caller's write group (group_join), on the second
 * half of the rows, which are distinct from the first's: no row is
 * written by both.  Below PUSH_SPLIT_ROWS a thread's start costs more than
 * it saves. */
#define PUSH_SPLIT_ROWS 8192

typedef struct push_half {
    embkv_store *s;
    const int64_t *ids;
    size_t n;
    const int64_t *slot;
    const uint8_t *dirty;
    push_grads grad;  /* the caller's, from the half's first row */
    push_ctx c;
    group_token group;
    write_gate gate;  /* (the caller's half passes it too) */
    size_t updated;
    int rc;
    char msg[512];
} push_half;

static void *push_half_run(void *arg)
{
    push_half *h = arg;
    h->rc = group_join(h->s, &h->group);
    if (h->rc == EMBKV_OK) {
        h->rc = update_batch_in_place(h->s, h->ids, h->n, h->slot, h->dirty, apply_optimizer, &h->c, &h->gate, 1,
                                      &h->updated);
        group_leave(h->s);
    } else {
        write_gate_pass(&h->gate, 1, false);
    }
    if (h->rc != EMBKV_OK && h->rc != WRITE_CANCELLED)
        snprintf(h->msg, sizeof h->msg, "%s", embkv_errmsg());
    return NULL;
}

/* The CPUs online, asked once (sysconf reads /sys on every call). */
static long online_cpus(void)
{
    static atomic_long n;
    long v = atomic_load_explicit(&n, memory_order_relaxed);
    if (!v) {
        v = sysconf(_SC_NPROCESSORS_ONLN);
        atomic_store_explicit(&n, v > 0 ? v : 1, memory_order_relaxed);
    }
    return v;
}

/* The updates of a push's n distinct rows (inside its group): on two
 * threads from PUSH_SPLIT_ROWS rows on, where there are two CPUs, both
 * halves or neither (write_gate) when a half cannot reserve its records. */
static int push_rows(embkv_store *s, const int64_t *ids, size_t n, const int64_t *in_slot, const uint8_t *in_dirty,
                     push_ctx *c, size_t *updated)
{
    *updated = 0;
    group_token g;
    push_half *h = NULL;
    pthread_t th;
    if (n >= PUSH_SPLIT_ROWS && online_cpus() > 1 && group_token_of(s, &g) &&
        (h = malloc(sizeof *h)) != NULL) {
        size_t k = n / 2;
        *h = (push_half){.s = s, .ids = ids + k, .n = n - k, .slot = in_slot ? in_slot + k : NULL,
                         .dirty = in_dirty ? in_dirty + k : NULL, .grad = *c->grad, .c = *c, .group = g};
        h->grad.first += k;
        h->grad.sum_of += k;
        h->c.grad = &h->grad;
        h->c.overflowed = 0;
        write_gate_init(&h->gate);
        if (pthread_create(&th, NULL, push_half_run, h) == 0) {
            int rc = update_batch_in_place(s, ids, k, in_slot, in_dirty, apply_optimizer, c, &h->gate, 0, updated);
            pthread_join(th, NULL);
            write_gate_destroy(&h->gate);
            *updated += h->updated;
            if (h->c.overflowed) {
                if (!c->overflowed)
                    c->overflow_id = h->c.overflow_id;
                c->overflowed += h->c.overflowed;
            }
            /* The batch's error: this half's own, else the helper's (a
             * half cancelled at the gate has none of its own). */
            if ((rc == EMBKV_OK || rc == WRITE_CANCELLED) && h->rc != EMBKV_OK && h->rc != WRITE_CANCELLED)
                rc = embkv__err(h->rc, "%s", h->msg);
            free(h);
            return rc;
        }
        write_gate_destroy(&h->gate);
        free(h);  /* no thread: all of it here */
    }
    return update_batch_in_place(s, ids, n, in_slot, in_dirty, apply_optimizer, c, NULL, 0, updated);
}

/* Return one permit per distinct id (uniq holds no duplicates) the session
 * holds one on.  Returns how many. */
static size_t release_ids(embkv_session *ss, struct train_state *t, const int64_t *uniq, size_t n)
{
    size_t back = 0;
    for (size_t i = 0; ss->n && i < n; i++) {
        if (held_take(ss, uniq[i])) {
            permit_return(t->permits, uniq[i]);
            back++;
        }
    }
    return back;
}

/* A push's updates, its gradients per distinct id (uids, nu of them) in
 * ugrad: the rows checked (and created), then updated in one write group,
 * then the session's permits on them returned. */
static int push_apply(embkv_session *ss, struct train_state *t, const embkv_train_options *opts,
                      const int64_t *uids, size_t nu, push_grads *ugrad, double lr, size_t *nupdated)
{
    embkv_store *s = ss->s;
    embkv_train_options o = *opts;
    uint32_t dim = s->dim;
    /* The rows it creates and its updates are one write group: seen by
     * snapshots and kept by checkpoints entirely or not at all.  (A cache
     * short of clean rows is cleaned first, outside the group.) */
    int rc = s->cache ? writeback_clean(s) : EMBKV_OK;
    if (rc == EMBKV_OK)
        rc = embkv_group_begin(s);
    if (rc != EMBKV_OK)
        return rc;
    /* One step of the table, counted inside the group (P8: a sync's mark
     * counts every push whose writes it holds). */
    atomic_fetch_add(&s->steps, 1);
    /* Check (and with an initializer, create) every row before changing any. */
    int64_t *miss = malloc(nu * sizeof *miss);
    uint8_t *present = malloc(nu);
    /* Where the check found each row in the cache: the update's hints
     * (one probe of the cache per row for the whole push). */
    bool hints = s->cache != NULL;
    int64_t *in_slot = hints ? malloc(nu * sizeof *in_slot) : NULL;
    uint8_t *in_dirty = hints ? malloc(nu) : NULL;
    size_t nmiss = 0;
    if (!miss || !present || (hints && (!in_slot || !in_dirty)))
        rc = embkv__err(EMBKV_NOMEM, "embkv_push: out of memory");
    else if (exists_batch_hints(s, uids, nu, present, in_slot, in_dirty))
        for (size_t i = 0; i < nu; i++)
            if (!present[i])
                miss[nmiss++] = uids[i];
    free(present);
    /* With admission, a gradient of an id without a row is dropped: the
     * rows that exist are updated alone (ids, gradients and hints kept in
     * step, in order). */
    const int64_t *upd = uids;
    int64_t *kept = NULL;
    size_t nupd = nu;
    if (rc == EMBKV_OK && nmiss && o.admit_count > 1) {
        kept = malloc((nu ? nu : 1) * sizeof *kept);
        if (!kept) {
            rc = embkv__err(EMBKV_NOMEM, "embkv_push: out of memory");
        } else {
            size_t w = 0, mi = 0;
            for (size_t i = 0; i < nu; i++) {
                if (mi < nmiss && miss[mi] == uids[i]) {  /* (miss is in the order of uids) */
                    mi++;
                    continue;
                }
                kept[w] = uids[i];
                ugrad->first[w] = ugrad->first[i];
                ugrad->sum_of[w] = ugrad->sum_of[i];
                if (hints) {
                    in_slot[w] = in_slot[i];
                    in_dirty[w] = in_dirty[i];
                }
                w++;
            }
            upd = kept;
            nupd = w;
            atomic_fetch_add(&t->dropped, nmiss);
        }
    } else if (rc == EMBKV_OK && nmiss) {
        if (o.init == EMBKV_INIT_NONE)
            rc = embkv__err(EMBKV_NOTFOUND, "id %lld not found (the table has no initializer)", (long long)miss[0]);
        else
            rc = create_rows(s, t, &o, miss, nmiss);
    }
    free(miss);
    size_t updated = 0;
    if (rc == EMBKV_OK) {
        push_ctx c = {.o = &o, .lr = lr > 0 ? lr : o.lr, .grad = ugrad, .dim = dim, .limit = dtype_max((int)s->dtype),
                      .state_floats = embkv_train_state_floats(&o, dim)};
        rc = nupd ? push_rows(s, upd, nupd, in_slot, in_dirty, &c, &updated) : EMBKV_OK;
        embkv_group_end(s);
        if (rc == EMBKV_OK) {
            /* Updates are visible before the permits go back (BSP: the next
             * pull of an id sees this push). */
            atomic_fetch_add(&t->pushes, updated);
            if (nupdated)
                *nupdated = updated;
            release_ids(ss, t, uids, nu);
            if (c.overflowed)
                rc = embkv__err(EMBKV_INVALID,
                                "id %lld: the update overflows %s (lr %g): %zu row(s) left unchanged, %zu other "
                                "row(s) of the push updated",
                                (long long)c.overflow_id,
                                dtype_max((int)s->dtype) < FLT_MAX ? dtype_name((int)s->dtype) : "float32",
                                c.lr, c.overflowed, updated);
        }
    } else {
        embkv_group_end(s);
    }
    free(kept);
    free(in_slot);
    free(in_dirty);
    return rc;
}

static int push_unguarded(embkv_session *ss, const int64_t *ids, size_t n, const float *grads, double lr, size_t *nupdated)
{
    if (!ss)
        return embkv__null_arg("embkv_push", "ss", (const void *)ss, (char *)NULL);
    RO_REFUSE(ss->s, "embkv_push");
    if (nupdated)
        *nupdated = 0;
    if (!ss || (n && (!ids || !grads)))
        return embkv__null_arg("embkv_push", "ss", (const void *)ss, "ids", (const void *)ids, "grads",
                               (const void *)grads, (char *)NULL);
    if (n == 0)
        return EMBKV_OK;
    embkv_store *s = ss->s;
    struct train_state *t = train_of(s);
    embkv_train_options o = options_now(t);
    uint32_t dim = s->dim;
    if (!all_finite(grads, n * dim))
        for (size_t i = 0; i < n * dim; i++)
            if (!isfinite(grads[i]))
                return embkv__err(EMBKV_INVALID, "id %lld: gradient element %zu is %s", (long long)ids[i / dim],
                                  i % dim, isnan(grads[i]) ? "NaN" : "infinite");
    if (lr != lr || isinf(lr))
        return embkv__err(EMBKV_INVALID, "embkv_push: lr must be a finite number");
    /* Gradients of duplicate ids are summed (in double) into one update. */
    const int64_t *uids;
    const size_t *slot_of;
    size_t nu = 0;
    push_grads ugrad;
    memset(&ugrad, 0, sizeof ugrad);
    if (distinct_of(ss, ids, n, &uids, &slot_of, &nu) != EMBKV_OK ||
        !push_grads_make(&ugrad, grads, slot_of, n, nu, dim)) {
        push_grads_free(&ugrad);
        return embkv__err(EMBKV_NOMEM, "embkv_push: out of memory for %zu ids", n);
    }
    int rc = push_apply(ss, t, &o, uids, nu, &ugrad, lr, nupdated);
    push_grads_free(&ugrad);
    if (ss->last_cap > MEMO_KEEP)
        memo_drop(ss);
    return rc;
}

/* The device push: the gradients summed per distinct id on the GPU as
 * push_grads_make sums them on the CPU (a row that came once as float32,
 * repeated ones in double from 0.0 in the batch's order), read from
 * pinned memory, then applied by push_apply: the same updates. */
static int push_device_unguarded(embkv_session *ss, const int64_t *ids, size_t n, const void *dev_grads, void *stream,
                      double lr, size_t *nupdated)
{
    if (nupdated)
        *nupdated = 0;
    if (!ss || (n && (!ids || !dev_grads)))
        return embkv__null_arg("embkv_push_device", "ss", (const void *)ss, "ids", (const void *)ids, "dev_grads",
                               (const void *)dev_grads, (char *)NULL);
    RO_REFUSE(ss->s, "embkv_push_device");
    if (n == 0)
        return EMBKV_OK;
    if (n > UINT32_MAX / 2)
        return embkv__err(EMBKV_INVALID, "embkv_push_device: %zu ids: at most %u a call", n, UINT32_MAX / 2);
    if (lr != lr || isinf(lr))
        return embkv__err(EMBKV_INVALID, "embkv_push_device: lr must be a finite number");
    embkv_store *s = ss->s;
    struct train_state *t = train_of(s);
    embkv_train_options o = options_now(t);
    uint32_t dim = s->dim;
    const int64_t *uids;
    const size_t *slot_of;
    size_t nu = 0;
    if (distinct_of(ss, ids, n, &uids, &slot_of, &nu) != EMBKV_OK)
        return embkv__err(EMBKV_NOMEM, "embkv_push_device: out of memory for %zu ids", n);
    /* Per distinct id: its occurrences in order (occ from start[u]), and
     * its row among the single rows or the sums. */
    uint32_t *occ = malloc(n * sizeof *occ), *start = calloc(nu + 1, sizeof *start);
    uint32_t *rowof = malloc(nu * sizeof *rowof), *fill = malloc(nu * sizeof *fill);
    push_grads ugrad;
    memset(&ugrad, 0, sizeof ugrad);
    ugrad.first = malloc(nu * sizeof *ugrad.first);
    ugrad.sum_of = malloc(nu * sizeof *ugrad.sum_of);
    gpu_sums gs = {0};
    int rc = EMBKV_OK;
    if (!occ || !start || !rowof || !fill || !ugrad.first || !ugrad.sum_of) {
        rc = embkv__err(EMBKV_NOMEM, "embkv_push_device: out of memory for %zu ids", n);
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        start[slot_of[i] + 1]++;
    uint32_t nonce = 0, nsums = 0;
    for (size_t u = 0; u < nu; u++) {
        uint32_t count = start[u + 1];
        if (count == 1) {
            ugrad.first[u] = nonce;
            ugrad.sum_of[u] = UINT32_MAX;
            rowof[u] = nonce++;
        } else {
            ugrad.first[u] = 0;
            ugrad.sum_of[u] = nsums;
            rowof[u] = nsums++;
        }
        start[u + 1] += start[u];
        fill[u] = start[u];
    }
    for (size_t i = 0; i < n; i++)
        occ[fill[slot_of[i]]++] = (uint32_t)i;
    rc = gpu_grad_sum(s, stream, dev_grads, occ, start, rowof, (uint32_t)n, (uint32_t)nu, nonce, nsums, &gs);
    if (rc != EMBKV_OK)
        goto out;
    /* NaN or infinity in a gradient reaches its row's float or sum. */
    for (size_t u = 0; u < nu && rc == EMBKV_OK; u++) {
        for (uint32_t j = 0; j < dim; j++) {
            double v = ugrad.sum_of[u] == UINT32_MAX ? (double)gs.once[(size_t)ugrad.first[u] * dim + j]
                                                     : gs.sums[(size_t)ugrad.sum_of[u] * dim + j];
            if (!isfinite(v)) {
                rc = embkv__err(EMBKV_INVALID, "id %lld: gradient element %u is %s (on the device)",
                                (long long)uids[u], j, isnan(v) ? "NaN" : "infinite");
                break;
            }
        }
    }
    if (rc == EMBKV_OK) {
        ugrad.grads = gs.once;
        ugrad.sums = gs.sums;
        rc = push_apply(ss, t, &o, uids, nu, &ugrad, lr, nupdated);
        ugrad.sums = NULL;  /* (the lease's, not push_grads_free's) */
    }
out:
    gpu_sums_release(s, &gs);
    free(occ);
    free(start);
    free(rowof);
    free(fill);
    push_grads_free(&ugrad);
    if (ss->last_cap > MEMO_KEEP)
        memo_drop(ss);
    return rc;
}

static int release_unguarded(embkv_session *ss, const int64_t *ids, size_t n, size_t *nreleased)
{
    if (nreleased)
        *nreleased = 0;
    if (!ss || (n && !ids))
        return embkv__null_arg("embkv_release", "ss", (const void *)ss, "ids", (const void *)ids, (char *)NULL);
    FORK_REFUSE(ss->s, "embkv_release");
    if (n && ss->n) {
        int64_t *uniq = malloc(n * sizeof *uniq);
        size_t *slot_of = malloc(n * sizeof *slot_of), nu = 0;
        int rc = uniq && slot_of ? ids_distinct(ids, n, uniq, slot_of, &nu) : EMBKV_NOMEM;
        if (rc == EMBKV_OK) {
            size_t back = release_ids(ss, train_of(ss->s), uniq, nu);
            if (nreleased)
                *nreleased = back;
        }
        free(uniq);
        free(slot_of);
        if (rc != EMBKV_OK)
            return embkv__err(EMBKV_NOMEM, "embkv_release: out of memory for %zu ids", n);
    }
    return EMBKV_OK;
}

/* ------------------------------------------------------------ one thread at a time */

/* (NULL passes: the call itself names the missing session) */
static int session_enter(embkv_session *ss, const char *fn)
{
    if (!ss || atomic_exchange(&ss->busy, 1) == 0)
        return EMBKV_OK;
    return embkv__err(EMBKV_BUSY, "%s: store %s: the session is in a call of another thread: a session is one "
                      "thread's at a time (open a session per thread with embkv_session_open)", fn, ss->s->path);
}

static void session_leave(embkv_session *ss)
{
    if (ss)
        atomic_store(&ss->busy, 0);
}

int embkv_pull_ex(embkv_session *ss, const int64_t *ids, size_t n, float *out, unsigned flags)
{
    int rc = session_enter(ss, "embkv_pull");
    if (rc == EMBKV_OK) {
        rc = pull_ex_unguarded(ss, ids, n, out, flags);
        session_leave(ss);
    }
    return rc;
}

int embkv_pull_device(embkv_session *ss, const int64_t *ids, size_t n, void *dev_out, void *stream, unsigned flags)
{
    int rc = session_enter(ss, "embkv_pull_device");
    if (rc == EMBKV_OK) {
        rc = pull_device_unguarded(ss, ids, n, dev_out, stream, flags);
        session_leave(ss);
    }
    return rc;
}

int embkv_push(embkv_session *ss, const int64_t *ids, size_t n, const float *grads, double lr, size_t *nupdated)
{
    int rc = session_enter(ss, "embkv_push");
    if (rc == EMBKV_OK) {
        rc = push_unguarded(ss, ids, n, grads, lr, nupdated);
        session_leave(ss);
    } else if (nupdated) {
        *nupdated = 0;
    }
    return rc;
}

int embkv_push_device(embkv_session *ss, const int64_t *ids, size_t n, const void *dev_grads, void *stream,
                      double lr, size_t *nupdated)
{
    int rc = session_enter(ss, "embkv_push_device");
    if (rc == EMBKV_OK) {
        rc = push_device_unguarded(ss, ids, n, dev_grads, stream, lr, nupdated);
        session_leave(ss);
    } else if (nupdated) {
        *nupdated = 0;
    }
    return rc;
}

int embkv_release(embkv_session *ss, const int64_t *ids, size_t n, size_t *nreleased)
{
    int rc = session_enter(ss, "embkv_release");
    if (rc == EMBKV_OK) {
        rc = release_unguarded(ss, ids, n, nreleased);
        session_leave(ss);
    } else if (nreleased) {
        *nreleased = 0;
    }
    return rc;
}

void embkv_session_close(embkv_session *ss)
{
    if (!ss)
        return;
    embkv_store *s = ss->s;
    struct train_state *t = train_of(s);
    for (size_t i = 0; i < ss->cap; i++)
        for (; ss->counts[i]; ss->counts[i]--)
            permit_return(t->permits, ss->keys[i]);
    free(ss->keys);
    free(ss->counts);
    memo_drop(ss);
    free(ss);
    atomic_fetch_sub(&s->open_sessions, 1);
}
