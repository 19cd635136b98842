/*
 * knn.c - exact nearest-neighbour search over every row (embkv_knn).
 *
 * Brute force, on purpose: it is exact (recall 1.0), needs no index to keep
 * up with training (an approximate index is stale after every push), and at
 * the sizes a scan can answer interactively (millions of rows) its cost is
 * reading the rows once, which is what this file is built around:
 *   - rows are read where they live, in place: a pool record inside an
 *     epoch (no copy), the log's rows in one batched read per range of
 *     buckets, rows the DRAM cache holds newer (dirty) from the cache;
 *   - the pool's rows in the order of the record space, not the index's:
 *     a first pass over the index marks where each row's record is, a
 *     second streams through the record chunks front to back scoring the
 *     marked places.  Hash order is a random read costing a page walk a
 *     record; in place order one query over 1M rows of dim 64 runs about
 *     four times as fast on a 2-core virtual machine;
 *   - the map of marked places outlives the search (knn_map): the
 *     searches after it stream at once, without the first pass (a quarter
 *     of a query's time at 1M rows of dim 64), sharing the one map when
 *     they run at once, while the index changed only in ways the map
 *     follows: rows written, inserted and deleted are told to the kNN
 *     change log (knnlog.c), applied to the map by the next search
 *     (map_catch_up); anything else (a resize, a move between tiers, more
 *     changes than the log holds) drops it (P11).  A table serving
 *     queries, written between them or not, pays the pass about once (in
 *     the writer's process: a reader process, with no writer's lock to
 *     watch, passes every time);
 *   - every query of a batch is answered in the same pass, a block of rows
 *     at a time while the block sits in the L1/L2 cache, so a batch of 100
 *     queries costs about the arithmetic, not 100 passes over memory;
 *   - the buckets are split among threads (ranges claimed from one
 *     counter), each keeping its own top-k per query, merged at the end;
 *   - distances are dot products (L2 screened as |q|^2 + |v|^2 - 2 q.v,
 *     decided on the direct sum for the rows that pass: block_flush), in the
 *     compiler's vector types, with an x86-64-v3 clone (AVX2, FMA) picked
 *     at load time (no intrinsics to keep in step); the Makefile lets this
 *     file contract multiply-adds (-ffp-contract=fast), so the last bits
 *     of a distance may differ between a CPU with FMA and one without.
 * The scan pin (pethash.c) holds resizes and bucket moves off for the pass,
 * so no row is met twice or missed; a row written while the pass runs is
 * read in one of its versions (the caller's epoch, held from before the
 * marks to the end of the stream, keeps every marked record in place).
 * Every pool record is checked (id and checksum) before it is used, once
 * per place (slab.c's checked map: a record does not change while it
 * lives, so a second check finds what the first did): a damaged record
 * fails the search naming its id, as any read does.  The stream trusts a
 * record's own id only after a check: each pass keeps a tally of the
 * (id, place) pairs it met, and when they differ (an index entry naming
 * another row's record, two entries naming one) or a record fails its
 * check, the search runs again in index order, which names the row at
 * fault from its index entry.
 *
 * Ranking: smaller distance first, equal distances by smaller id, so a
 * search is deterministic whatever the threads did.  Rows whose distance
 * is not a number (a NaN in the row, or a zero vector under cosine) are
 * left out of the ranking.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops.h"

#define RANGE_BUCKETS 256  /* buckets a thread claims at once */
/* Buckets ahead of the pass whose lines are fetched (a bucket is a few
 * lines; 4 ahead covers a memory latency at the pass's pace, about 3%
 * faster than the hardware prefetchers alone at 1M rows). */
#define BUCKET_AHEAD 4
#define BLOCK_ROWS 64      /* rows scored against every query together */
#define MAX_THREADS 8
/* L2 batches of up to this many queries sum each distance directly; larger
 * ones screen with dot products first (block_flush). */
#define DIRECT_L2_QUERIES 2

/* ---------------------------------------------------------------- distances */

typedef float v8f __attribute__((vector_size(32)));
/* The helpers passing v8f are static and inlined: the note that their ABI
 * differs with and without AVX concerns no caller outside this file. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* (Not under ThreadSanitizer: its instrumented ifunc resolver would run
 * before its runtime is up.) */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define KNN_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define KNN_CLONES
#endif

static inline v8f load8(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float hsum8(const v8f *p)
{
    v8f v = *p;  /* (by address: a vector argument is an ABI note without AVX) */
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static inline float dot_tail(const float *a, const float *b, uint32_t from, uint32_t dim)
{
    float s = 0;
    for (uint32_t j = from; j < dim; j++)
        s += a[j] * b[j];
    return s;
}

/* One dot product (a block's odd rows; a row's squared norm). */
KNN_CLONES
static float dot8(const float *a, const float *b, uint32_t dim)
{
    uint32_t d8 = dim & ~7u;
    v8f acc = { 0 };
    for (uint32_t j = 0; j < d8; j += 8)
        acc += load8(a + j) * load8(b + j);
    return hsum8(&acc) + dot_tail(a, b, d8, dim);
}

/* The dot products of rows[0..nr) with queries[0..nq), into
 * out[q * BLOCK_ROWS + r].  Two queries by four rows at a time: eight
 * accumulators fed by six loads, so a batch is bound by the arithmetic,
 * not by loads from L1 (one query against one row would load twice per
 * multiply-add). */
KNN_CLONES
static void dots_block(const float *queries, size_t nq, uint32_t dim, const float *const *rows, size_t nr, float *out)
{
    uint32_t d8 = dim & ~7u;
    size_t q = 0;
    for (; q + 2 <= nq; q += 2) {
        const float *q0 = queries + q * dim, *q1 = q0 + dim;
        float *o0 = out + q * BLOCK_ROWS, *o1 = o0 + BLOCK_ROWS;
        size_t r = 0;
        for (; r + 4 <= nr; r += 4) {
            const float *v0 = rows[r], *v1 = rows[r + 1], *v2 = rows[r + 2], *v3 = rows[r + 3];
            v8f a00 = { 0 }, a01 = { 0 }, a02 = { 0 }, a03 = { 0 }, a10 = { 0 }, a11 = { 0 }, a12 = { 0 }, a13 = { 0 };
            for (uint32_t j = 0; j < d8; j += 8) {
                v8f x0 = load8(q0 + j), x1 = load8(q1 + j);
                v8f y0 = load8(v0 + j), y1 = load8(v1 + j), y2 = load8(v2 + j), y3 = load8(v3 + j);
                a00 += x0 * y0;
                a01 += x0 * y1;
                a02 += x0 * y2;
                a03 += x0 * y3;
                a10 += x1 * y0;
                a11 += x1 * y1;
                a12 += x1 * y2;
                a13 += x1 * y3;
            }
            o0[r] = hsum8(&a00) + dot_tail(q0, v0, d8, dim);
            o0[r + 1] = hsum8(&a01) + dot_tail(q0, v1, d8, dim);
            o0[r + 2] = hsum8(&a02) + dot_tail(q0, v2, d8, dim);
            o0[r + 3] = hsum8(&a03) + dot_tail(q0, v3, d8, dim);
            o1[r] = hsum8(&a10) + dot_tail(q1, v0, d8, dim);
            o1[r + 1] = hsum8(&a11) + dot_tail(q1, v1, d8, dim);
            o1[r + 2] = hsum8(&a12) + dot_tail(q1, v2, d8, dim);
            o1[r + 3] = hsum8(&a13) + dot_tail(q1, v3, d8, dim);
        }
        for (; r < nr; r++) {
            o0[r] = dot8(q0, rows[r], dim);
            o1[r] = dot8(q1, rows[r], dim);
        }
    }
    for (; q < nq; q++) {
        const float *q0 = queries + q * dim;
        float *o0 = out + q * BLOCK_ROWS;
        size_t r = 0;
        for (; r + 4 <= nr; r += 4) {
            const float *v0 = rows[r], *v1 = rows[r + 1], *v2 = rows[r + 2], *v3 = rows[r + 3];
            v8f a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
            for (uint32_t j = 0; j < d8; j += 8) {
                v8f x = load8(q0 + j);
                a0 += x * load8(v0 + j);
                a1 += x * load8(v1 + j);
                a2 += x * load8(v2 + j);
                a3 += x * load8(v3 + j);
            }
            o0[r] = hsum8(&a0) + dot_tail(q0, v0, d8, dim);
            o0[r + 1] = hsum8(&a1) + dot_tail(q0, v1, d8, dim);
            o0[r + 2] = hsum8(&a2) + dot_tail(q0, v2, d8, dim);
            o0[r + 3] = hsum8(&a3) + dot_tail(q0, v3, d8, dim);
        }
        for (; r < nr; r++)
            o0[r] = dot8(q0, rows[r], dim);
    }
}

/* The squared L2 distance summed directly: what a row's rank is decided
 * on (the dot-product form above only picks the rows worth this). */
KNN_CLONES
static float l2sq(const float *a, const float *b, uint32_t dim)
{
    /* Two accumulators: half the chain of dependent adds a row waits on
     * (a screen: any order of the sum is within its tolerance). */
    v8f acc = { 0 }, acc2 = { 0 };
    uint32_t j = 0;
    for (; j + 16 <= dim; j += 16) {
        v8f x = load8(a + j) - load8(b + j), y = load8(a + j + 8) - load8(b + j + 8);
        acc += x * x;
        acc2 += y * y;
    }
    for (; j + 8 <= dim; j += 8) {
        v8f x = load8(a + j) - load8(b + j);
        acc += x * x;
    }
    acc += acc2;
    float s = hsum8(&acc);
    for (; j < dim; j++)
        s += (a[j] - b[j]) * (a[j] - b[j]);
    return s;
}

/* A vector's squared norm. */
static inline float sumsq(const float *v, uint32_t dim)
{
    return dot8(v, v, dim);
}

/* In double, for what float cannot hold: the rows that decide an L2
 * answer, and vectors whose products would overflow or underflow float
 * (norms outside WILD_LO..WILD_HI). */
static double dot_d(const float *a, const float *b, uint32_t dim)
{
    double s = 0;
    for (uint32_t j = 0; j < dim; j++)
        s += (double)a[j] * b[j];
    return s;
}

static double l2sq_d(const float *a, const float *b, uint32_t dim)
{
    double s = 0;
    for (uint32_t j = 0; j < dim; j++) {
        double x = (double)a[j] - b[j];
        s += x * x;
    }
    return s;
}

/* Squared norms between these keep every float product of a query and a
 * row, and their sums, finite and far from underflow. */
#define WILD_LO 1e-30f
#define WILD_HI 1e30f
static inline bool wild_sumsq(float ss)
{
    return !(ss >= WILD_LO && ss <= WILD_HI);
}

/* ---------------------------------------------------------------- top k */

typedef struct topk {
    double *d;
    int64_t *id;
    size_t n;
} topk;

/* a ranks after b */
static inline bool after(double da, int64_t ia, double db, int64_t ib)
{
    return da > db || (da == db && ia > ib);
}

/* A max-heap on (distance, id): the root is the worst kept. */
static void topk_offer(topk *t, size_t k, double d, int64_t id)
{
    size_t i;
    if (t->n < k) {
        i = t->n++;
        while (i > 0) {
            size_t p = (i - 1) / 2;
            if (!after(d, id, t->d[p], t->id[p]))
                break;
            t->d[i] = t->d[p];
            t->id[i] = t->id[p];
            i = p;
        }
        t->d[i] = d;
        t->id[i] = id;
        return;
    }
    if (!after(t->d[0], t->id[0], d, id))
        return;
    i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= t->n)
            break;
        if (c + 1 < t->n && after(t->d[c + 1], t->id[c + 1], t->d[c], t->id[c]))
            c++;
        if (!after(t->d[c], t->id[c], d, id))
            break;
        t->d[i] = t->d[c];
        t->id[i] = t->id[c];
        i = c;
    }
    t->d[i] = d;
    t->id[i] = id;
}

/* ---------------------------------------------------------------- id sets */

/* A set of ids (open addressing; ids the pass must leave to others). */
typedef struct idset {
    int64_t *slot;
    uint8_t *used;
    size_t mask, n;
} idset;

static int idset_init(idset *st, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n + 16)
        cap <<= 1;
    st->slot = malloc(cap * sizeof *st->slot);
    st->used = calloc(cap, 1);
    st->mask = cap - 1;
    st->n = 0;
    return st->slot && st->used ? EMBKV_OK : EMBKV_NOMEM;
}

static void idset_free(idset *st)
{
    free(st->slot);
    free(st->used);
}

static void idset_add(idset *st, int64_t id)
{
    size_t i = embkv__hash(id) & st->mask;
    while (st->used[i]) {
        if (st->slot[i] == id)
            return;
        i = (i + 1) & st->mask;
    }
    st->used[i] = 1;
    st->slot[i] = id;
    st->n++;
}

static bool idset_has(const idset *st, int64_t id)
{
    if (!st->n)
        return false;
    size_t i = embkv__hash(id) & st->mask;
    while (st->used[i]) {
        if (st->slot[i] == id)
            return true;
        i = (i + 1) & st->mask;
    }
    return false;
}

/* ---------------------------------------------------------------- the pass */

typedef struct knn_job {
    embkv_store *s;
    const float *queries;
    const float *qnorm;        /* each query's |q|^2 (l2), 1 / |q| (cosine), |q| (dot), in float */
    const bool *qwild;         /* a query whose norm is outside WILD_LO..WILD_HI: scored in double */
    size_t nq, k;
    int metric;
    const idset *skip;         /* rows scored elsewhere, or left out */
    _Atomic uint64_t next;     /* next range of buckets to claim */
    uint64_t nbuckets;
    /* The pool's rows in pool order (not in a reader process): the pass
     * over the index marks each row's record in its worker's `live` map
     * (one bit a place in the record space, chunks 0..nchunks-1; a map a
     * worker, so marking takes no atomic operation), the maps are merged,
     * and a second pass streams through the record space scoring the
     * places marked.  Not streaming: the pool's rows are scored in index
     * order, where the index names them. */
    bool stream;
    uint32_t nchunks;
    const uint64_t *live;      /* the second pass's map: the workers' merged, or one kept (knn_map) */
    _Atomic uint64_t next_rec; /* next range of records to claim */
    bool streaming;            /* the second pass */
    /* The second pass found a record failing its check, or records other
     * than the ones the first pass marked (the tallies differ: an index
     * entry naming another row's record, or two entries one record): the
     * search runs again in index order, which names the row at fault. */
    atomic_int suspect;
    atomic_int failed;         /* first error (EMBKV_*), 0 none: the others stop */
    uint64_t generation;       /* of the index the first pass read */
} knn_job;

typedef struct knn_worker {
    knn_job *job;
    topk *tops;                /* nq of them */
    float *score;              /* nq x BLOCK_ROWS */
    const float *rows[BLOCK_ROWS];
    float norms[BLOCK_ROWS];   /* each row's |v|^2 (l2), 1 / |v| (cosine), |v| (dot) */
    bool wild[BLOCK_ROWS];     /* a row whose norm is outside WILD_LO..WILD_HI: scored in double */
    int64_t ids[BLOCK_ROWS];
    size_t nr;
    float *dec;                /* a store of another dtype: the block's rows decoded */
    uint64_t *live;            /* the places this worker marked (knn_job.stream) */
    uint64_t marked, seen;     /* tallies of (id, place): marked in the first pass, read in the second */
    bool unmarked;             /* it met rows the map does not hold (in the SSD log, in a newer chunk) */
    int rc;
    char msg[512];
} knn_worker;

/* A pair's distance in double, from scratch (a wild query or row). */
static double pair_d(const knn_job *j, const float *qv, const float *v)
{
    uint32_t dim = j->s->dim;
    if (j->metric == EMBKV_KNN_L2)
        return l2sq_d(qv, v, dim);
    if (j->metric == EMBKV_KNN_DOT)
        return -dot_d(qv, v, dim);
    double qq = dot_d(qv, qv, dim), vv = dot_d(v, v, dim);
    if (!(qq > 0 && vv > 0))
        return NAN;
    double d = 1.0 - dot_d(qv, v, dim) / (sqrt(qq) * sqrt(vv));
    return d < 0 ? 0 : d > 2 ? 2 : d;  /* the last bit of rounding, not a distance */
}

/* The screen of one query against a block, in place of its dot products:
 * a lower bound of each row's distance (the float value less its rounding
 * bound, tol relative: dot products of n terms are off by at most about
 * n x epsilon x |q| |v|).  One pass the compiler vectorizes; qn is the
 * query's |q|^2 (l2), 1 / |q| (cosine) or |q| (dot), norms the rows'. */
KNN_CLONES
static void screen_block(float *sc, size_t nr, const float *norms, int metric, float qn, float tol)
{
    if (metric == EMBKV_KNN_L2)
        for (size_t r = 0; r < nr; r++)
            sc[r] = (qn + norms[r]) * (1.0f - tol) - 2.0f * sc[r];
    else if (metric == EMBKV_KNN_COSINE)
        for (size_t r = 0; r < nr; r++)
            sc[r] = (1.0f - tol) - sc[r] * qn * norms[r];
    else
        for (size_t r = 0; r < nr; r++)
            sc[r] = -sc[r] - tol * qn * norms[r];
}

/* A double the float screen may be compared with: rounded up. */
static inline float above(double worst)
{
    float f = (float)worst;
    return isinf(f) || (double)f >= worst ? f : nextafterf(f, INFINITY);
}

static void block_flush(knn_worker *w)
{
    knn_job *j = w->job;
    if (!w->nr)
        return;
    uint32_t dim = j->s->dim;
    /* Distances are decided in double; float only screens out the rows
     * that cannot enter the top k.  Few L2 queries: the direct float sums
     * screen (cheaper than norms and dots, and a sum that overflows or
     * underflows goes to double by itself).  More: dot products, screened
     * a block and a query at a time (screen_block), rows and queries whose
     * norms would overflow or underflow float products scored in double
     * (pair_d). */
    float tol = (float)(dim + 8) * FLT_EPSILON;
    double abs_tol = 2.0 * (dim + 1) * (double)FLT_TRUE_MIN;
    bool direct = j->metric == EMBKV_KNN_L2 && j->nq <= DIRECT_L2_QUERIES;
    if (!direct) {
        for (size_t r = 0; r < w->nr; r++) {
            float ss = sumsq(w->rows[r], dim);
            w->wild[r] = wild_sumsq(ss);
            w->norms[r] = j->metric == EMBKV_KNN_COSINE ? 1.0f / sqrtf(ss)
                        : j->metric == EMBKV_KNN_DOT    ? sqrtf(ss)
                                                        : ss;
        }
        dots_block(j->queries, j->nq, dim, w->rows, w->nr, w->score);
    }
    /* Most rows lose to the worst kept: one comparison each (a NaN fails
     * it too), the heap only for the few that win. */
    for (size_t q = 0; q < j->nq; q++) {
        float *sc = w->score + q * BLOCK_ROWS;
        topk *t = &w->tops[q];
        const float *qv = j->queries + q * dim;
        double worst = t->n < j->k ? INFINITY : t->d[0];
        if (direct) {
            for (size_t r = 0; r < w->nr; r++) {
                float approx = l2sq(qv, w->rows[r], dim);
                /* Relative error, and below FLT_MIN an absolute one: a
                 * square or sum rounded to a subnormal is off by up to
                 * half its spacing, FLT_TRUE_MIN / 2, whatever its size. */
                if (isfinite(approx) && (double)(approx - tol * approx) - abs_tol > worst)
                    continue;
                double d = l2sq_d(qv, w->rows[r], dim);
                if (!(d <= worst))
                    continue;
                topk_offer(t, j->k, d, w->ids[r]);
                worst = t->n < j->k ? INFINITY : t->d[0];
            }
            continue;
        }
        bool qwild = j->qwild[q];
        if (!qwild)
            screen_block(sc, w->nr, w->norms, j->metric, j->qnorm[q], tol);
        float wf = above(worst);
        for (size_t r = 0; r < w->nr; r++) {
            if (!qwild && sc[r] > wf && !w->wild[r])
                continue;
            double d = j->metric == EMBKV_KNN_L2 ? l2sq_d(qv, w->rows[r], dim) : pair_d(j, qv, w->rows[r]);
            if (!(d <= worst))
                continue;
            topk_offer(t, j->k, d, w->ids[r]);
            worst = t->n < j->k ? INFINITY : t->d[0];
            wf = above(worst);
        }
    }
    w->nr = 0;
}

static void block_add(knn_worker *w, int64_t id, const float *v)
{
    w->rows[w->nr] = v;
    w->ids[w->nr] = id;
    if (++w->nr == BLOCK_ROWS)
        block_flush(w);
}

/* A record's row: in place for float32, else decoded into the block's
 * place in w->dec. */
static void block_add_rec(knn_worker *w, int64_t id, rec_hdr *r)
{
    embkv_store *s = w->job->s;
    if (!w->dec) {
        block_add(w, id, rec_vec(r));
        return;
    }
    float *v = w->dec + w->nr * (size_t)s->dim;
    rec_vec_get(s, r, v);
    block_add(w, id, v);
}

/* A term of the tallies (knn_job.suspect) for id's record at place g. */
static inline uint64_t place_tally(int64_t id, uint64_t g)
{
    return embkv__hash(id ^ (int64_t)(g * 0x9E3779B97F4A7C15ull));
}

static void worker_fail(knn_worker *w, int rc)
{
    if (w->rc == EMBKV_OK) {
        w->rc = rc;
        snprintf(w->msg, sizeof w->msg, "%s", embkv_errmsg());
    }
}

/* One range of buckets, inside an epoch: the pool's rows in place, the
 * log's read in one batch.  The range's rows are listed first, so that
 * the records (at random places in the pool: the index is in hash order)
 * can be fetched PREFETCH_AHEAD rows ahead of their use, into L2: a core
 * has about a dozen line fills to L1 in flight, and five lines a record
 * at that depth stalled the loop on the prefetches themselves; L2 takes
 * several times more (one query over 1M rows of dim 64 runs about 1.6
 * times as fast prefetching 16 rows ahead to L2 as 12 rows ahead to L1). */
#define PREFETCH_AHEAD 16
static void pass_range(knn_worker *w, index_desc *ix, uint64_t b0, uint64_t b1)
{
    knn_job *j = w->job;
    embkv_store *s = j->s;
    /* The range's rows, the pool's and the log's apart (each array holds a
     * whole range: rows never overwrite rows not yet sorted out). */
    int64_t ids[RANGE_BUCKETS * BUCKET_SLOTS], ssd_ids[RANGE_BUCKETS * BUCKET_SLOTS];
    uint64_t locs[RANGE_BUCKETS * BUCKET_SLOTS], ssd_locs[RANGE_BUCKETS * BUCKET_SLOTS];
    size_t n = 0, npm = 0, nssd = 0;
    for (uint64_t b = b0; b < b1; b++) {
        if (b + BUCKET_AHEAD < b1)
            for (size_t l = 0; l < BUCKET_BYTES; l += 64)
                __builtin_prefetch((const char *)&ix->buckets[b + BUCKET_AHEAD] + l, 0, 3);
        n += ix_bucket_rows(&ix->buckets[b], ids + n, locs + n, false);
    }
    /* (In locals: the compiler cannot tell the map's words from the
     * worker's fields, and would load and store these every row.) */
    uint64_t *live = w->live, marked = 0, per_chunk = s->recs_per_chunk;
    uint32_t nchunks = j->stream ? j->nchunks : 0;
    for (size_t i = 0; i < n; i++) {
        if (idset_has(j->skip, ids[i]))
            continue;
        if (locs[i] & LOC_SSD) {
            ssd_ids[nssd] = ids[i];
            ssd_locs[nssd++] = locs[i];
        } else if (loc_chunk(locs[i]) < nchunks && loc_index(locs[i]) < per_chunk) {
            uint64_t g = (uint64_t)loc_chunk(locs[i]) * per_chunk + loc_index(locs[i]);
            live[g >> 6] |= 1ull << (g & 63);
            marked += place_tally(ids[i], g);
        } else {
            ids[npm] = ids[i];
            locs[npm++] = locs[i];
        }
    }
    w->marked += marked;
    if (npm || nssd)
        w->unmarked = true;
    size_t lines = (s->rec_size + 63) / 64;
    /* A reader process maps the record chunks the writer added as their
     * rows turn up (pethash.c). */
    for (size_t i = 0; s->reader && i < npm; i++)
        if (!ix_reader_loc_mapped(s, locs[i])) {
            worker_fail(w, rd_valid(s) ? rec_damaged(s, ids[i]) : rd_invalid(s));
            return;
        }
    for (size_t i = 0; i < npm && w->rc == EMBKV_OK; i++) {
        if (i + PREFETCH_AHEAD < npm) {
            const char *p = (const char *)rec_at(s, locs[i + PREFETCH_AHEAD]);
            for (size_t l = 0; l < lines; l++)
                __builtin_prefetch(p + 64 * l, 0, 1);
        }
        rec_hdr *r = rec_at(s, locs[i]);
        if (!rec_ok(s, r, ids[i])) {
            worker_fail(w, rec_damaged(s, ids[i]));
            break;
        }
        block_add_rec(w, ids[i], r);
    }
    /* The block points into the pool: score it before the epoch ends. */
    block_flush(w);
    if (w->rc == EMBKV_OK && nssd) {
        char *buf = NULL;
        rec_hdr *recs[RANGE_BUCKETS * BUCKET_SLOTS];
        int rc = tier_read(s, ssd_ids, ssd_locs, nssd, &buf, recs, false);
        if (rc != EMBKV_OK)
            worker_fail(w, rc);
        else
            for (size_t i = 0; i < nssd; i++)
                block_add_rec(w, ssd_ids[i], recs[i]);
        /* The block points into buf: score it before it goes. */
        block_flush(w);
        free(buf);
    }
}

/* Places ahead whose lines are fetched to L1 (the prefetchers bring the
 * stream to L2; about 4% faster than without at dim 64). */
#define STREAM_AHEAD 8
/* Records [i0, i1) of chunk c, in place order: the marked ones scored.  A
 * read front to back, which the CPU's prefetchers follow page after page,
 * where the index's (hash) order is a random read that costs a page walk
 * a record.  Inside the caller's epoch (knn_run), held since before the
 * marks were made: no marked record is reused before the pass ends. */
static void stream_range(knn_worker *w, uint32_t c, uint32_t i0, uint32_t i1)
{
    knn_job *j = w->job;
    embkv_store *s = j->s;
    const char *base = atomic_load_explicit(&s->chunk_base[c], memory_order_acquire);
    uint64_t g0 = (uint64_t)c * s->recs_per_chunk;
    const uint64_t *live = j->live;
    uint64_t seen = 0;
    size_t lines = (s->rec_size + 63) / 64;
    uint32_t i = i0;
    while (i < i1 && w->rc == EMBKV_OK && !atomic_load_explicit(&j->suspect, memory_order_relaxed)) {
        uint64_t g = g0 + i, word = live[g >> 6] >> (g & 63);
        uint32_t next = i + (64 - (uint32_t)(g & 63));  /* the first place of the next word */
        if (next > i1)
            next = i1;
        while (word && w->rc == EMBKV_OK) {
            uint32_t at = i + (uint32_t)__builtin_ctzll(word);
            if (at >= next)
                break;
            word &= word - 1;
            rec_hdr *r = (rec_hdr *)(base + (size_t)at * s->rec_size);
            if (at + STREAM_AHEAD < i1) {
                const char *p = (const char *)r + STREAM_AHEAD * (size_t)s->rec_size;
                for (size_t l = 0; l < lines; l++)
                    __builtin_prefetch(p + 64 * l, 0, 3);
            }
            int64_t id = r->id;
            if (!slab_checked(s, c, at)) {
                if (!rec_ok(s, r, id)) {
                    atomic_store(&j->suspect, 1);
                    break;
                }
                slab_set_checked(s, c, at);
            }
            seen += place_tally(id, g0 + at);
            block_add_rec(w, id, r);
        }
        i = next;
    }
    w->seen += seen;
    block_flush(w);
}

/* Records a thread claims at once in the streaming pass (about a megabyte
 * of dim-64 rows). */
#define RANGE_RECORDS 4096

static void *worker_main(void *p)
{
    knn_worker *w = p;
    knn_job *j = w->job;
    if (j->streaming) {
        embkv_store *s = j->s;
        uint64_t per_chunk = (s->recs_per_chunk + RANGE_RECORDS - 1) / RANGE_RECORDS;
        while (w->rc == EMBKV_OK && !atomic_load_explicit(&j->failed, memory_order_relaxed)) {
            uint64_t k = atomic_fetch_add(&j->next_rec, 1);
            if (k >= per_chunk * j->nchunks)
                break;
            uint32_t c = (uint32_t)(k / per_chunk), i0 = (uint32_t)(k % per_chunk) * RANGE_RECORDS;
            uint32_t i1 = i0 + RANGE_RECORDS < s->recs_per_chunk ? i0 + RANGE_RECORDS : s->recs_per_chunk;
            stream_range(w, c, i0, i1);
        }
        goto done;
    }
    while (w->rc == EMBKV_OK && !atomic_load_explicit(&j->failed, memory_order_relaxed)) {
        uint64_t b0 = atomic_fetch_add(&j->next, RANGE_BUCKETS);
        if (b0 >= j->nbuckets)
            break;
        uint64_t b1 = b0 + RANGE_BUCKETS < j->nbuckets ? b0 + RANGE_BUCKETS : j->nbuckets;
        ebr_enter();
        pass_range(w, atomic_load(&j->s->ix), b0, b1);
        ebr_leave();
    }
done:
    if (w->rc != EMBKV_OK) {
        int zero = 0;
        atomic_compare_exchange_strong(&j->failed, &zero, w->rc);
    }
    return NULL;
}

static void worker_free(knn_worker *w, size_t nq)
{
    if (!w)
        return;
    if (w->tops)
        for (size_t q = 0; q < nq; q++) {
            free(w->tops[q].d);
            free(w->tops[q].id);
        }
    free(w->tops);
    free(w->score);
    free(w->dec);
    free(w->live);
}

static int worker_init(knn_worker *w, knn_job *j)
{
    memset(w, 0, sizeof *w);
    w->job = j;
    w->tops = calloc(j->nq, sizeof *w->tops);
    w->score = malloc(j->nq * BLOCK_ROWS * sizeof *w->score);
    if (!w->tops || !w->score)
        return EMBKV_NOMEM;
    if (j->s->dtype != EMBKV_F32 && !(w->dec = malloc(BLOCK_ROWS * (size_t)j->s->dim * sizeof(float))))
        return EMBKV_NOMEM;
    for (size_t q = 0; q < j->nq; q++) {
        w->tops[q].d = malloc(j->k * sizeof(double));
        w->tops[q].id = malloc(j->k * sizeof(int64_t));
        if (!w->tops[q].d || !w->tops[q].id)
            return EMBKV_NOMEM;
    }
    return EMBKV_OK;
}

/* Rows read one at a time (the ids a caller names, the dirty cached rows):
 * scored by worker w, each once, missing ones passed over. */
static int score_listed(knn_worker *w, const int64_t *ids, size_t n)
{
    embkv_store *s = w->job->s;
    size_t dim = s->dim;
    float *buf = malloc(BLOCK_ROWS * dim * sizeof(float));
    idset seen;
    int rc = idset_init(&seen, n);
    if (!buf || rc != EMBKV_OK) {
        free(buf);
        idset_free(&seen);
        return embkv__err(EMBKV_NOMEM, "embkv_knn: out of memory");
    }
    for (size_t i = 0; i < n && rc == EMBKV_OK; i++) {
        if (idset_has(w->job->skip, ids[i]) || idset_has(&seen, ids[i]))
            continue;
        idset_add(&seen, ids[i]);
        float *v = buf + w->nr * dim;
        int r = get_uncounted(s, ids[i], v);
        if (r == EMBKV_NOTFOUND)
            continue;
        if (r != EMBKV_OK)
            rc = r;
        else
            block_add(w, ids[i], v);
    }
    if (rc == EMBKV_OK)
        block_flush(w);
    free(buf);
    idset_free(&seen);
    return rc;
}

/* Sorts a top-k's n entries into ranking order (insertion sort: k is a
 * few hundred at most in practice, and the heap is half sorted). */
static void topk_sort(double *d, int64_t *id, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        double dv = d[i];
        int64_t iv = id[i];
        size_t j = i;
        while (j > 0 && after(d[j - 1], id[j - 1], dv, iv)) {
            d[j] = d[j - 1];
            id[j] = id[j - 1];
            j--;
        }
        d[j] = dv;
        id[j] = iv;
    }
}

static int knn_run(embkv_store *s, const float *queries, size_t nq, size_t k, const embkv_knn_options *opt,
                   int64_t *out_ids, double *out_dist, size_t *found, bool index_order);

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Whether an id is among id[0..n) twice (*twice, may be NULL, gets it): a
 * row met in two of its versions (a search beside writers that could not
 * tell its old place from its new one: the answer would hold it twice), or
 * a caller's extra row given twice; 0 on no memory (not known). */
static bool ids_repeat(const int64_t *id, size_t n, int64_t *twice)
{
    if (n <= 64) {
        for (size_t i = 1; i < n; i++)
            for (size_t j = 0; j < i; j++)
                if (id[i] == id[j]) {
                    if (twice)
                        *twice = id[i];
                    return true;
                }
        return false;
    }
    int64_t *c = malloc(n * sizeof *c);
    if (!c)
        return false;
    memcpy(c, id, n * sizeof *c);
    qsort(c, n, sizeof *c, cmp_id);
    bool rep = false;
    for (size_t i = 1; i < n && !rep; i++)
        if ((rep = c[i] == c[i - 1]) && twice)
            *twice = c[i];
    free(c);
    return rep;
}

/* ------------------------------------------------------- the kept map */

/* The record chunks the pool has now. */
static uint32_t chunks_now(embkv_store *s)
{
    uint32_t c = 0;
    while (c < MAX_CHUNKS && atomic_load_explicit(&s->chunk_base[c], memory_order_acquire))
        c++;
    return c;
}

/* The map of the pool's live records that a search of every row made
 * (one bit a record place, as knn_worker.live), kept in s->knn_map for
 * the next search: one that finds it valid skips the pass over the index
 * (about a quarter of a query's time at 1M rows of dim 64) and streams
 * the records at once.  Valid while s->knn_clean still holds its pass's
 * id: every writer clears it after changing the index or retiring records
 * (P11), so no row was added, moved, demoted or deleted since, and its
 * records are still the rows' (the stream's tallies check that too). */
typedef struct knn_map {
    uint64_t *live;            /* read only once made: searches at once share it */
    uint64_t id;               /* the pass that made it (knn_clean) */
    uint64_t generation;       /* of the index it was made from */
    uint32_t nchunks;
    uint64_t marked;           /* its tally of (id, place) */
    unsigned refs;             /* s->knn_map's, and each search's using it; under knn_mu */
} knn_map;

static void map_free(knn_map *m)
{
    if (m) {
        free(m->live);
        free(m);
    }
}

/* At the close: no search is in flight (the last embkv_close follows
 * every other call on the handle), so the store's is the one reference. */
void knn_map_free(embkv_store *s)
{
    map_free(s->knn_map);
    s->knn_map = NULL;
}

/* Under knn_mu: drops a reference to m; m when it was the last (to free
 * after the unlock), else NULL. */
static knn_map *map_unref(knn_map *m)
{
    return m && --m->refs == 0 ? m : NULL;
}

/* Under knn_mu: s lets its map go; the map to free after the unlock, or
 * NULL (none, or a search still streams it). */
static knn_map *map_unkeep(embkv_store *s)
{
    knn_map *m = s->knn_map;
    s->knn_map = NULL;
    return map_unref(m);
}

/* Drops a search's reference to m, and s's too when `drop` (the stream
 * found the map wrong), freeing it with the last. */
static void map_release(embkv_store *s, knn_map *m, bool drop)
{
    pthread_mutex_lock(&s->knn_mu);
    if (drop && s->knn_map == m)
        (void)map_unkeep(s);  /* (never the last: this search holds m) */
    knn_map *dead = map_unref(m);
    pthread_mutex_unlock(&s->knn_mu);
    map_free(dead);
}

/* The bit of place loc in a map of `places` places, or UINT64_MAX when
 * loc names none (a flagged location, a chunk beyond the map). */
static inline uint64_t map_place(embkv_store *s, uint64_t loc, uint64_t places)
{
    if (loc == LOC_NONE || (loc & LOC_FLAGS))
        return UINT64_MAX;
    uint64_t g = (uint64_t)loc_chunk(loc) * s->recs_per_chunk + loc_index(loc);
    return g < places ? g : UINT64_MAX;
}

/* Under knn_mu, s->writers held exclusively (map_take): the n changes of
 * the log applied to a map of `places` places, its tally in *marked:
 * false when a row is now in a place beyond the map (it is left out), the
 * others applied.  With no writer's section in flight, the log holds every
 * change made since the map's pass began, though not in the order made (a
 * writer tells after letting the row's key lock go: knnlog.c).  So first
 * every entry's old place is cleared (by the bits it finds: the tally
 * moves with the bits, and the stream checks it): its row has left it,
 * and a row that came to it since is told after that leaving (the place
 * is retired after the tell), so in this log or a later one.  Then each
 * entry's row is marked where the index has it now: its last place,
 * whatever order its moves were told in.  A row the log does not name
 * has not changed since the pass read it. */
static bool map_apply(embkv_store *s, uint64_t *live, uint64_t places, uint64_t *marked, const knn_change *log,
                      size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t g = map_place(s, log[i].from, places);
        if (g != UINT64_MAX && (live[g >> 6] >> (g & 63) & 1)) {
            live[g >> 6] &= ~(1ull << (g & 63));
            *marked -= place_tally(log[i].id, g);
        }
    }
    bool all = true;
    index_desc *ix = atomic_load(&s->ix);
    for (size_t i = 0; i < n; i++) {
        uint64_t now = ix_lookup(ix, log[i].id, embkv__hash(log[i].id), NULL);
        if (now == LOC_NONE || (now & LOC_TOMB))
            continue;  /* deleted */
        uint64_t g = map_place(s, now, places);
        if (g == UINT64_MAX) {
            all = false;
            continue;
        }
        if (!(live[g >> 6] >> (g & 63) & 1)) {
            live[g >> 6] |= 1ull << (g & 63);
            *marked += place_tally(log[i].id, g);
        }
    }
    return all;
}

/* Under knn_mu and s->writers, with s's map m valid (its id in knn_clean): m
 * brought up to date with the changes told since its pass (knnlog.c) and
 * kept in its place, or a copy of it when searches stream m meanwhile (a
 * shared map is read only); NULL when it cannot follow them (a record in
 * a place beyond the map, or out of memory), s's map then left for the
 * caller to let go. */
static knn_map *map_catch_up(embkv_store *s, knn_map *m)
{
    size_t n = s->knn_log_n;
    if (s->knn_log_id != m->id || n == 0)
        return m;
    s->knn_log_n = 0;
    uint64_t places = (uint64_t)m->nchunks * s->recs_per_chunk;
    if (m->refs > 1) {
        size_t bytes = (places + 63) / 64 * sizeof *m->live;
        knn_map *c = malloc(sizeof *c);
        uint64_t *live = c ? malloc(bytes) : NULL;
        if (!live) {
            free(c);
            return NULL;
        }
        memcpy(live, m->live, bytes);
        *c = *m;
        c->live = live;
        c->refs = 1;
        (void)map_unref(m);  /* s's reference (never the last: a search streams m) */
        s->knn_map = m = c;
    }
    return map_apply(s, m->live, places, &m->marked, s->knn_log, n) ? m : NULL;
}

/* Lets s's map go if it is still the one of pass `id` (a search found it
 * wrong after releasing it). */
static void map_drop(embkv_store *s, uint64_t id)
{
    pthread_mutex_lock(&s->knn_mu);
    knn_map *dead = s->knn_map && s->knn_map->id == id ? map_unkeep(s) : NULL;
    pthread_mutex_unlock(&s->knn_mu);
    map_free(dead);
}

/* A reference to the kept map if it is still valid (searches at once
 * share it), brought up to date with the changes told since it was made,
 * with the caller inside an epoch entered before the map was found valid
 * (P11: no record it names is reused before ebr_leave); NULL, outside
 * one, when there is none to use (an invalid one is let go).  The
 * changes are applied holding s->writers exclusively: with no writer's
 * section in flight every change made is told (or has cleared knn_clean:
 * writers_unlock clears before it unlocks), and where each row is now is
 * what the index says (map_apply). */
static knn_map *map_take(embkv_store *s)
{
    bool alone = false;
    for (;;) {
        ebr_enter();
        full_fence();
        pthread_mutex_lock(&s->knn_mu);
        knn_map *m = s->knn_map;
        if (m && m->id == atomic_load(&s->knn_clean) && m->generation == atomic_load(&s->ix)->generation &&
            m->nchunks == chunks_now(s)) {
            bool behind = s->knn_log_id == m->id && s->knn_log_n;
            if (behind && !alone) {
                /* (Writers first, then the epoch: a resize holding it
                 * waits for the epochs.  Tried, not waited for: a
                 * writer's section in flight, or this thread's own (a
                 * search from an update's callback), makes this search
                 * pass over the index instead, the map kept for a later
                 * one.) */
                pthread_mutex_unlock(&s->knn_mu);
                ebr_leave();
                if (pthread_rwlock_trywrlock(&s->writers) != 0)
                    return NULL;
                alone = true;
                continue;
            }
            if (behind)
                m = map_catch_up(s, m);
            if (m) {
                m->refs++;
                pthread_mutex_unlock(&s->knn_mu);
                if (alone)
                    pthread_rwlock_unlock(&s->writers);  /* (no index entry changed: P11) */
                return m;
            }
        }
        knn_map *dead = map_unkeep(s);
        pthread_mutex_unlock(&s->knn_mu);
        if (alone)
            pthread_rwlock_unlock(&s->writers);  /* (as above) */
        map_free(dead);
        ebr_leave();
        return NULL;
    }
}

/* Keeps a pass's new map m for the searches after it, in place of the one
 * kept, if m may still be valid: a map whose id has left knn_clean never
 * is again (searches at once: the last id set wins, not the highest). */
static void map_put(embkv_store *s, knn_map *m)
{
    m->refs = 1;
    pthread_mutex_lock(&s->knn_mu);
    knn_map *dead = m;
    if (m->id == atomic_load(&s->knn_clean)) {
        dead = map_unkeep(s);
        s->knn_map = m;
    }
    pthread_mutex_unlock(&s->knn_mu);
    map_free(dead);
}

uint64_t embkv_debug_knn_reused(embkv_store *s)
{
    return atomic_load(&s->st_knn_reused);
}

uint64_t embkv_debug_knn_kept_reruns(embkv_store *s)
{
    return atomic_load(&s->st_knn_kept_reruns);
}

/* worker_main on `want` workers: ws[0] on the calling thread, the others
 * on threads of their own (fewer if one cannot start: the others take its
 * share). */
static void run_workers(knn_worker *ws, unsigned want)
{
    pthread_t th[MAX_THREADS];
    unsigned started = 0;
    for (unsigned t = 1; t < want; t++) {
        if (pthread_create(&th[t], NULL, worker_main, &ws[t]) != 0)
            break;
        started = t;
    }
    worker_main(&ws[0]);
    for (unsigned t = 1; t <= started; t++)
        pthread_join(th[t], NULL);
}

/* The second pass over job->live (job->nchunks chunks), whose places hold
 * records whose (id, place) tally is `marked`: true when the search must
 * run again in index order (a record failing its check, or the tallies
 * differing).  Inside the caller's epoch, entered before the map was made
 * or found valid. */
static bool stream_pass(knn_job *job, knn_worker *ws, unsigned nt, uint64_t marked)
{
    if (!job->stream || atomic_load(&job->failed))
        return false;
    embkv_store *s = job->s;
    job->streaming = true;
    uint64_t per_chunk = (s->recs_per_chunk + RANGE_RECORDS - 1) / RANGE_RECORDS;
    uint64_t nranges = per_chunk * job->nchunks;
    run_workers(ws, nranges < nt ? (unsigned)nranges : nt);
    uint64_t seen = 0;
    for (unsigned t = 0; t < nt; t++)
        seen += ws[t].seen;
    return !atomic_load(&job->failed) && (atomic_load(&job->suspect) || marked != seen);
}

/* The first pass over the index, then (streaming) the second over the
 * record space; a search of every row (`keepable`) keeps its map for the
 * ones after it.  *rerun as stream_pass says. */
static int index_pass(knn_job *job, knn_worker *ws, unsigned nt, bool keepable, bool index_order, bool *rerun)
{
    embkv_store *s = job->s;
    uint64_t pass_id = 0, marked = 0;
    bool unmarked = false;
    embkv_scan_pin(s);
    /* Held through both passes: a record marked in the first is not reused
     * before the second has read it (P6).  Entered before the id is set:
     * a record that leaves the index with a change told for this id is
     * retired after the tell, which read the id, so it waits for this
     * pass too, and no place changes hands while the pass reads (the
     * change log's entries apply to the map in order: knnlog.c). */
    ebr_enter();
    if (keepable) {
        /* Set before the index is read (P11): a writer that changes it
         * from here on clears it or tells the change log, one that
         * changed it before is seen.  (After the pin: a resize the pin
         * waits for would clear it.) */
        pass_id = atomic_fetch_add(&s->knn_passes, 1) + 1;
        atomic_store(&s->knn_clean, pass_id);
        full_fence();
    }
    index_desc *ix = atomic_load(&s->ix);
    job->nbuckets = ix->nbuckets;
    job->generation = ix->generation;
    if (!s->reader && !index_order) {
        uint32_t c = chunks_now(s);
        uint64_t places = (uint64_t)c * s->recs_per_chunk;
        job->nchunks = c;
        job->stream = places > 0;
        /* A row whose record lies in a chunk added after this count is
         * scored where the index names it (pass_range). */
        for (unsigned t = 0; t < nt && job->stream; t++)
            if (!(ws[t].live = calloc((places + 63) / 64, sizeof *ws[t].live))) {
                ebr_leave();
                embkv_scan_unpin(s);
                return embkv__err(EMBKV_NOMEM, "embkv_knn: out of memory for the map of %llu record places",
                                  (unsigned long long)places);
            }
    }
    uint64_t ranges = (job->nbuckets + RANGE_BUCKETS - 1) / RANGE_BUCKETS;
    run_workers(ws, ranges < nt ? (unsigned)ranges : nt);
    if (job->stream) {
        /* One map for the second pass: the workers' merged into the first's. */
        uint64_t words = ((uint64_t)job->nchunks * s->recs_per_chunk + 63) / 64;
        for (unsigned t = 0; t < nt; t++) {
            marked += ws[t].marked;
            unmarked |= ws[t].unmarked;
        }
        for (unsigned t = 1; t < nt; t++)
            for (uint64_t x = 0; x < words; x++)
                ws[0].live[x] |= ws[t].live[x];
        job->live = ws[0].live;
    }
    *rerun = stream_pass(job, ws, nt, marked);
    ebr_leave();
    embkv_scan_unpin(s);
    /* A map of every row, checked by its stream: kept for the searches
     * after it (P11 says when it stops being valid). */
    if (keepable && job->stream && !unmarked && !*rerun && !atomic_load(&job->failed)) {
        knn_map *m = malloc(sizeof *m);
        if (m) {
            *m = (knn_map){ .live = ws[0].live, .id = pass_id, .generation = job->generation,
                            .nchunks = job->nchunks, .marked = marked };
            ws[0].live = NULL;
            map_put(s, m);
        }
    }
    return EMBKV_OK;
}

int embkv_knn(embkv_store *s, const float *queries, size_t nq, size_t k, const embkv_knn_options *opt,
              int64_t *out_ids, double *out_dist, size_t *found)
{
    FORK_REFUSE(s, "embkv_knn");
    if (!s || !s->reader)
        return knn_run(s, queries, nq, k, opt, out_ids, out_dist, found, false);
    /* A reader process: the calling thread's slot covers the workers'
     * reads too (they end before it leaves). */
    int rc = ro_enter(s);
    if (rc != EMBKV_OK)
        return rc;
    rc = knn_run(s, queries, nq, k, opt, out_ids, out_dist, found, false);
    /* A slot revoked meanwhile (R2, R3) may have let the writer reuse
     * records this pass read, failing their checks: run it again. */
    if (rc != EMBKV_INVALID && !rd_valid(s))
        rc = rd_invalid(s);
    ro_leave(s);
    return rc;
}

static int knn_run(embkv_store *s, const float *queries, size_t nq, size_t k, const embkv_knn_options *opt,
                   int64_t *out_ids, double *out_dist, size_t *found, bool index_order)
{
    if (!s || !queries || !out_ids || !out_dist || !found)
        return embkv__null_arg("embkv_knn", "s", (const void *)s, "queries", (const void *)queries, "out_ids",
                               (const void *)out_ids, "out_dist", (const void *)out_dist, "found",
                               (const void *)found, (char *)NULL);
    embkv_knn_options o = { 0 };
    if (opt)
        o = *opt;
    if (o.metric != EMBKV_KNN_L2 && o.metric != EMBKV_KNN_COSINE && o.metric != EMBKV_KNN_DOT)
        return embkv__err(EMBKV_INVALID, "embkv_knn: unknown metric %d (EMBKV_KNN_L2, _COSINE or _DOT)", o.metric);
    if (nq == 0 || k == 0)
        return embkv__err(EMBKV_INVALID, "embkv_knn: %s is 0 (ask for at least one query and one row)",
                          nq == 0 ? "the number of queries" : "k");
    if (k > EMBKV_KNN_MAX_K || nq > EMBKV_KNN_MAX_QUERIES || nq * k > EMBKV_KNN_MAX_RESULTS)
        return embkv__err(EMBKV_INVALID,
                          "embkv_knn: %zu queries of k=%zu is too many (k at most %d, queries at most %d, "
                          "queries x k at most %d): split the batch",
                          nq, k, EMBKV_KNN_MAX_K, EMBKV_KNN_MAX_QUERIES, EMBKV_KNN_MAX_RESULTS);
    if ((o.nonly && !o.only) || (o.nskip && !o.skip) || (o.nextra && (!o.extra_ids || !o.extra_vecs)))
        return embkv__err(EMBKV_INVALID, "embkv_knn: a NULL id list with a nonzero count");
    /* An extra row is a version of its id: two of one id would be two
     * answers for one row. */
    int64_t twice;
    if (ids_repeat(o.extra_ids, o.nextra, &twice))
        return embkv__err(EMBKV_INVALID, "embkv_knn: extra id %lld is given twice: give each row once (its newest "
                          "version)", (long long)twice);
    uint32_t dim = s->dim;
    for (size_t q = 0; q < nq; q++)
        for (uint32_t j = 0; j < dim; j++)
            if (!isfinite(queries[q * dim + j]))
                return embkv__err(EMBKV_INVALID, "embkv_knn: query %zu holds %s at position %u: give finite numbers",
                                  q, isnan(queries[q * dim + j]) ? "NaN" : "an infinity", j);
    float *qnorm = malloc(nq * sizeof *qnorm);
    bool *qwild = malloc(nq * sizeof *qwild);
    if (!qnorm || !qwild) {
        free(qnorm);
        free(qwild);
        return embkv__err(EMBKV_NOMEM, "embkv_knn: out of memory");
    }
    for (size_t q = 0; q < nq; q++) {
        const float *qv = queries + q * dim;
        double qq = dot_d(qv, qv, dim);
        if (o.metric == EMBKV_KNN_COSINE && !(qq > 0)) {
            free(qnorm);
            free(qwild);
            return embkv__err(EMBKV_INVALID,
                              "embkv_knn: query %zu is all zeros: its cosine distance to any row is undefined", q);
        }
        qwild[q] = !(qq >= WILD_LO && qq <= WILD_HI);
        qnorm[q] = qwild[q]                       ? 0.0f
                 : o.metric == EMBKV_KNN_COSINE ? (float)(1.0 / sqrt(qq))
                 : o.metric == EMBKV_KNN_DOT    ? (float)sqrt(qq)
                                                : (float)qq;
    }

    knn_job job = { .s = s, .queries = queries, .qnorm = qnorm, .qwild = qwild, .nq = nq, .k = k, .metric = o.metric };
    atomic_init(&job.next, 0);
    atomic_init(&job.failed, 0);
    atomic_init(&job.suspect, 0);
    bool rerun = false, used_kept = false;
    uint64_t kept_id = 0;
    /* Rows the cache holds newer than their home: read from it, and left
     * out of the pass over the index (the set sized for both from the
     * start). */
    int64_t *dirty = NULL;
    size_t nd = 0;
    int rc = EMBKV_OK;
    if (!o.only && s->cache && cache_ndirty(s->cache) && cache_dirty_ids(s->cache, &dirty, &nd) != EMBKV_OK) {
        free(qnorm);
        free(qwild);
        return embkv__err(EMBKV_NOMEM, "embkv_knn: out of memory listing the cache's rows");
    }
    idset skip;
    rc = idset_init(&skip, o.nskip + nd + o.nextra);
    for (size_t i = 0; i < o.nskip && rc == EMBKV_OK; i++)
        idset_add(&skip, o.skip[i]);
    /* (an extra row replaces the table's version of its id) */
    for (size_t i = 0; i < o.nextra && rc == EMBKV_OK; i++)
        idset_add(&skip, o.extra_ids[i]);
    job.skip = &skip;

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    unsigned nt = o.threads ? o.threads : (ncpu > 0 ? (unsigned)ncpu : 1);
    if (nt > MAX_THREADS)
        nt = MAX_THREADS;
    knn_worker *ws = rc == EMBKV_OK ? calloc(nt, sizeof *ws) : NULL;
    if (rc == EMBKV_OK && !ws)
        rc = EMBKV_NOMEM;
    for (unsigned t = 0; t < nt && rc == EMBKV_OK; t++)
        rc = worker_init(&ws[t], &job);
    if (rc != EMBKV_OK) {
        rc = embkv__err(EMBKV_NOMEM, "embkv_knn: out of memory for %zu queries of k=%zu", nq, k);
        goto out;
    }

    for (size_t i = 0; i < o.nextra; i++)
        block_add(&ws[0], o.extra_ids[i], o.extra_vecs + i * dim);
    block_flush(&ws[0]);
    if (o.only) {
        /* The rows named: read one by one (the caller asked for few). */
        rc = score_listed(&ws[0], o.only, o.nonly);
        goto merge;
    }
    if (nd) {
        if ((rc = score_listed(&ws[0], dirty, nd)) != EMBKV_OK)
            goto out;
        for (size_t i = 0; i < nd; i++)
            idset_add(&skip, dirty[i]);
    }

    /* A search of every row (no ids left to others) may use the map of the
     * searches before, or keep its own for the ones after (knn_map). */
    bool keepable = !s->reader && !index_order && skip.n == 0;
    knn_map *kept = keepable ? map_take(s) : NULL;  /* (in an epoch when taken) */
    used_kept = kept != NULL;
    kept_id = kept ? kept->id : 0;
    if (kept) {
        atomic_fetch_add_explicit(&s->st_knn_reused, 1, memory_order_relaxed);
        job.stream = true;
        job.nchunks = kept->nchunks;
        job.live = kept->live;
        rerun = stream_pass(&job, ws, nt, kept->marked);
        ebr_leave();
        if (rerun)
            atomic_fetch_add_explicit(&s->st_knn_kept_reruns, 1, memory_order_relaxed);
        map_release(s, kept, rerun || atomic_load(&job.failed));
    } else if ((rc = index_pass(&job, ws, nt, keepable, index_order, &rerun)) != EMBKV_OK) {
        goto out;
    }
    if (rerun)
        goto out;

merge:
    for (unsigned t = 0; t < nt && rc == EMBKV_OK; t++)
        if (ws[t].rc != EMBKV_OK)
            rc = embkv__err(ws[t].rc, "%s", ws[t].msg);
    if (rc == EMBKV_OK) {
        for (size_t q = 0; q < nq; q++) {
            topk *all = &ws[0].tops[q];
            for (unsigned t = 1; t < nt; t++)
                for (size_t i = 0; i < ws[t].tops[q].n; i++)
                    topk_offer(all, k, ws[t].tops[q].d[i], ws[t].tops[q].id[i]);
            topk_sort(all->d, all->id, all->n);
            /* A row met twice: the search runs again, in index order (a
             * race with a writer it cannot see otherwise, rare; a kept map
             * that gave it is let go, and counted).  (Not with extra rows:
             * the caller's, which may repeat a stored id it did not
             * skip.) */
            if (!index_order && !o.only && !o.nextra && ids_repeat(all->id, all->n, NULL)) {
                if (used_kept) {
                    atomic_fetch_add_explicit(&s->st_knn_kept_reruns, 1, memory_order_relaxed);
                    map_drop(s, kept_id);
                }
                rerun = true;
                goto out;
            }
            for (size_t i = 0; i < all->n; i++) {
                out_ids[q * k + i] = all->id[i];
                out_dist[q * k + i] = o.metric == EMBKV_KNN_L2 ? sqrt(all->d[i]) : all->d[i];
            }
            for (size_t i = all->n; i < k; i++) {
                out_ids[q * k + i] = -1;
                out_dist[q * k + i] = NAN;
            }
            found[q] = all->n;
        }
    }
out:
    if (ws)
        for (unsigned t = 0; t < nt; t++)
            worker_free(&ws[t], nq);
    free(ws);
    idset_free(&skip);
    free(dirty);
    free(qnorm);
    free(qwild);
    if (rerun && rc == EMBKV_OK)
        return knn_run(s, queries, nq, k, opt, out_ids, out_dist, found, true);
    return rc;
}
