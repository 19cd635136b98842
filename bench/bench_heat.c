/*
 * bench_heat.c - the access-frequency sketch (engine/heat.c) as the basis of
 * PM-tier placement, in simulation.
 *
 * The PM tier is a cache holding --cache-frac (10%) of --ids (8M) ids; the
 * trace is Zipf(--zipf 0.99) ranks in batches of 512, rank mapped to id by
 * a fixed random permutation.  Phase 1 runs --accesses (32M) accesses;
 * phase 2 as many under another permutation (the hot set moves entirely),
 * to see whether a policy follows.  A hit is an accessed id found resident;
 * a miss reads it from the SSD tier and (unless admission refuses it)
 * makes it resident, evicting a victim.  Policies:
 *   lru             exact LRU (doubly linked list over the resident slots)
 *   clock           CLOCK: one reference bit per resident row
 *   random          evict a random resident row (sampled with k = 1)
 *   sample-k        sample k random resident rows, evict the lowest
 *                   heat_estimate; every miss admitted
 *   sample-k+adm    the same, a miss admitted only if heat_admit(missed,
 *                   victim) (TinyLFU)
 *   clock+adm       CLOCK's victim, heat_admit admission (the DRAM
 *                   cache's policy, engine/cache.c)
 *   lfu             exact access counts since the start (a 32-bit count
 *                   per id, no aging), the victim the lowest of 16
 *                   sampled residents, every miss admitted
 * The sketch is touched with the batch (heat_touch_batch) before the
 * batch's ids are looked up, as the read path would.  Hit rates: phase 1's
 * second half (steady state), phase 2 in eighths, phase 2's second half;
 * throughput: simulated accesses per second over both phases (one core,
 * sketch updates included).  The "static top-C" line is the hit rate of the
 * best fixed set (the C most popular ids), the ceiling of frequency-based
 * policies.  Then heat_touch_batch / heat_touch / heat_estimate rates on
 * one core and heat_touch_batch on 2 threads, for a sketch in cache and
 * one of 1 GiB (DRAM-bound).
 *
 * Usage: bench_heat [--ids N] [--cache-frac F] [--accesses N] [--zipf S]
 *                   [--sketch-mult M] [--quick]
 */
#include <pthread.h>
#include <stdbool.h>

#include "bench_common.h"
#include "heat.h"
#include "base.h"  /* embkv__hash: the hash the read path computes */

#define BATCH 512
#define NONE UINT32_MAX

static size_t N, C;
static uint64_t *hashes;            /* hashes[id index] */
static uint32_t *trace[2];          /* id indexes, per phase */
static size_t A;                    /* accesses per phase */
static double sketch_mult = 1.0;

enum kind { LRU, CLOCK, SAMPLE, CLOCK_ADM, LFU };

typedef struct policy {
    const char *name;
    enum kind kind;
    int k;              /* SAMPLE: candidates */
    bool admit;         /* SAMPLE: TinyLFU admission */
} policy;

typedef struct sim {
    uint32_t *slot_of;  /* id index -> resident slot, NONE */
    uint32_t *id_at;    /* slot -> id index */
    uint32_t used;
    uint32_t *prev, *next, head, tail;  /* LRU list over slots, head = most recent */
    uint8_t *ref;       /* CLOCK bits */
    uint32_t hand;
    heat *h;
    uint32_t *count;    /* LFU: accesses per id */
    rng r;
} sim;

static void lru_unlink(sim *s, uint32_t x)
{
    if (s->prev[x] != NONE) s->next[s->prev[x]] = s->next[x]; else s->head = s->next[x];
    if (s->next[x] != NONE) s->prev[s->next[x]] = s->prev[x]; else s->tail = s->prev[x];
}

static void lru_front(sim *s, uint32_t x)
{
    s->prev[x] = NONE;
    s->next[x] = s->head;
    if (s->head != NONE) s->prev[s->head] = x; else s->tail = x;
    s->head = x;
}

static uint32_t clock_victim(sim *s)
{
    for (;;) {
        uint32_t x = s->hand;
        if (++s->hand == C) s->hand = 0;
        if (!s->ref[x]) return x;
        s->ref[x] = 0;
    }
}

static uint32_t sample_victim(sim *s, int k)
{
    uint32_t best = (uint32_t)rng_below(&s->r, C);
    unsigned be = heat_estimate(s->h, hashes[s->id_at[best]]);
    for (int i = 1; i < k && be; i++) {
        uint32_t x = (uint32_t)rng_below(&s->r, C);
        unsigned e = heat_estimate(s->h, hashes[s->id_at[x]]);
        if (e < be) { be = e; best = x; }
    }
    return best;
}

static uint32_t lfu_victim(sim *s, int k)
{
    uint32_t best = (uint32_t)rng_below(&s->r, C);
    for (int i = 1; i < k; i++) {
        uint32_t x = (uint32_t)rng_below(&s->r, C);
        if (s->count[s->id_at[x]] < s->count[s->id_at[best]]) best = x;
    }
    return best;
}

/* One access; true on a hit. */
static inline bool access1(sim *s, const policy *p, uint32_t id)
{
    if (s->count) s->count[id]++;
    uint32_t x = s->slot_of[id];
    if (x != NONE) {
        if (p->kind == LRU) { lru_unlink(s, x); lru_front(s, x); }
        else if (p->kind == CLOCK || p->kind == CLOCK_ADM) s->ref[x] = 1;
        return true;
    }
    if (s->used < C) {
        x = s->used++;
    } else {
        switch (p->kind) {
        case LRU: x = s->tail; lru_unlink(s, x); break;
        case CLOCK: x = clock_victim(s); break;
        case CLOCK_ADM:
            x = clock_victim(s);
            if (!heat_admit(s->h, hashes[id], hashes[s->id_at[x]])) { s->ref[x] = 0; return false; }
            break;
        case LFU: x = lfu_victim(s, p->k); break;
        case SAMPLE:
            x = sample_victim(s, p->k);
            if (p->admit && !heat_admit(s->h, hashes[id], hashes[s->id_at[x]])) return false;
            break;
        }
        s->slot_of[s->id_at[x]] = NONE;
    }
    s->slot_of[id] = x;
    s->id_at[x] = id;
    if (p->kind == LRU) lru_front(s, x);
    else if (p->kind == CLOCK || p->kind == CLOCK_ADM) s->ref[x] = 0;
    return false;
}

typedef struct result {
    double p1_steady, p2_eighth[8], p2_steady, rate;
    uint64_t agings;
} result;

static void run_policy(const policy *p, result *res)
{
    sim s;
    memset(&s, 0, sizeof s);
    rng_seed(&s.r, 99);
    s.slot_of = xmalloc(N * sizeof *s.slot_of);
    memset(s.slot_of, 0xff, N * sizeof *s.slot_of);
    s.id_at = xmalloc(C * sizeof *s.id_at);
    if (p->kind == LRU) {
        s.prev = xmalloc(C * sizeof *s.prev);
        s.next = xmalloc(C * sizeof *s.next);
        s.head = s.tail = NONE;
    }
    if (p->kind == CLOCK || p->kind == CLOCK_ADM) {
        s.ref = xmalloc(C);
        memset(s.ref, 0, C);
    }
    if (p->kind == LFU) s.count = calloc(N, sizeof *s.count);
    bool sketch = p->kind == SAMPLE || p->kind == CLOCK_ADM;
    if (sketch) {
        s.h = heat_new((uint64_t)((double)C * sketch_mult));
        if (!s.h) die("heat_new: %s", strerror(errno));
    }
    uint64_t bh[BATCH];
    size_t hits_half[2][2] = { { 0, 0 }, { 0, 0 } }, eighth[8] = { 0 };
    double t0 = now_s();
    for (int ph = 0; ph < 2; ph++) {
        const uint32_t *t = trace[ph];
        for (size_t b = 0; b < A; b += BATCH) {
            size_t n = A - b < BATCH ? A - b : BATCH;
            if (sketch) {
                for (size_t i = 0; i < n; i++) bh[i] = hashes[t[b + i]];
                heat_touch_batch(s.h, bh, n);
            }
            size_t hits = 0;
            for (size_t i = 0; i < n; i++) hits += access1(&s, p, t[b + i]);
            hits_half[ph][b >= A / 2] += hits;
            if (ph == 1) eighth[b * 8 / A] += hits;
        }
    }
    double dt = now_s() - t0;
    res->p1_steady = (double)hits_half[0][1] / (double)(A - A / 2);
    res->p2_steady = (double)hits_half[1][1] / (double)(A - A / 2);
    for (int i = 0; i < 8; i++) res->p2_eighth[i] = (double)eighth[i] / ((double)A / 8);
    res->rate = 2.0 * (double)A / dt;
    res->agings = s.h ? heat_agings(s.h) : 0;
    if (s.h) heat_free(s.h);
    free(s.slot_of); free(s.id_at); free(s.prev); free(s.next); free(s.ref); free(s.count);
}

/* ------------------------------------------------------ raw sketch rates */

typedef struct tharg {
    heat *h;
    const uint64_t *hs;
    size_t n;
} tharg;

static void *touch_thread(void *p)
{
    tharg *a = p;
    for (size_t b = 0; b < a->n; b += BATCH)
        heat_touch_batch(a->h, a->hs + b, a->n - b < BATCH ? a->n - b : BATCH);
    return NULL;
}

static void sketch_rates(const char *label, uint64_t sized_for, const uint64_t *hs, size_t n)
{
    heat *h = heat_new(sized_for);
    if (!h) die("heat_new(%" PRIu64 "): %s", sized_for, strerror(errno));
    tharg warm = { h, hs, n };
    touch_thread(&warm);  /* fault the pages in */
    timing tb = { .name = "touch_batch" }, t1 = { .name = "touch" }, te = { .name = "estimate" },
           t2 = { .name = "touch_batch x2 threads" };
    volatile unsigned sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        touch_thread(&warm);
        timing_add(&tb, now_s() - t0);
        t0 = now_s();
        for (size_t i = 0; i < n; i++) heat_touch(h, hs[i]);
        timing_add(&t1, now_s() - t0);
        t0 = now_s();
        unsigned acc = 0;
        for (size_t i = 0; i < n; i++) acc += heat_estimate(h, hs[i]);
        sink += acc;
        timing_add(&te, now_s() - t0);
        tharg halves[2] = { { h, hs, n / 2 }, { h, hs + n / 2, n - n / 2 } };
        pthread_t th[2];
        t0 = now_s();
        for (int t = 0; t < 2; t++)
            if (pthread_create(&th[t], NULL, touch_thread, &halves[t])) die("pthread_create");
        for (int t = 0; t < 2; t++)
            if (pthread_join(th[t], NULL)) die("pthread_join");
        timing_add(&t2, now_s() - t0);
    }
    printf("%s: sketch %.1f MiB, %.0f M ids per run\n", label, (double)heat_bytes(h) / 1048576, (double)n / 1e6);
    timing_print_rate(&tb, (double)n, "ids");
    timing_print_rate(&t1, (double)n, "ids");
    timing_print_rate(&te, (double)n, "ids");
    timing_print_rate(&t2, (double)n, "ids");
    heat_free(h);
}

int main(int argc, char **argv)
{
    N = 8000000;
    double frac = 0.10, zs = 0.99;
    A = 32000000;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--quick")) { N = 1000000; A = 4000000; continue; }
        if (i + 1 >= argc) die("usage: bench_heat [--ids N] [--cache-frac F] [--accesses N] [--zipf S] [--sketch-mult M] [--quick]");
        const char *v = argv[++i];
        if (!strcmp(o, "--ids")) N = parse_size(o, v);
        else if (!strcmp(o, "--accesses")) A = parse_size(o, v);
        else if (!strcmp(o, "--cache-frac")) frac = atof(v);
        else if (!strcmp(o, "--zipf")) zs = atof(v);
        else if (!strcmp(o, "--sketch-mult")) sketch_mult = atof(v);
        else die("unknown option %s", o);
    }
    if (N < 100 || N >= NONE) die("--ids must be in 100..%u", NONE - 1);
    if (!(frac > 0 && frac < 1)) die("--cache-frac must be in (0, 1)");
    if (!(sketch_mult > 0 && sketch_mult <= 64)) die("--sketch-mult must be in (0, 64]");
    if (A < 8 * BATCH) die("--accesses must be at least %d", 8 * BATCH);
    C = (size_t)((double)N * frac);
    if (C < 16) die("cache too small");

    rng r;
    rng_seed(&r, BENCH_SEED);
    hashes = xmalloc(N * sizeof *hashes);
    for (size_t i = 0; i < N; i++) hashes[i] = embkv__hash(rng_id63(&r));
    zipf z;
    zipf_init(&z, N, zs);
    uint32_t *perm = xmalloc(N * sizeof *perm);
    double t0 = now_s();
    for (int ph = 0; ph < 2; ph++) {
        for (size_t i = 0; i < N; i++) perm[i] = (uint32_t)i;
        for (size_t i = N - 1; i > 0; i--) {
            size_t j = rng_below(&r, i + 1);
            uint32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
        trace[ph] = xmalloc(A * sizeof *trace[ph]);
        for (size_t i = 0; i < A; i++) trace[ph][i] = perm[zipf_next(&z, &r) - 1];
    }
    free(perm);
    double norm = 0, top = 0;
    for (size_t k = N; k >= 1; k--) {
        double p = pow((double)k, -zs);
        norm += p;
        if (k <= C) top += p;
    }
    printf("bench_heat: %zu ids, PM tier %zu rows (%.0f%%), Zipf(%.2f), batches of %d, %zu accesses per phase "
           "(trace built in %.1f s), sketch sized for %.0f ids\n",
           N, C, 100 * frac, zs, BATCH, A, now_s() - t0, (double)C * sketch_mult);
    printf("static top-C hit rate (ceiling of a fixed set): %.4f\n\n", top / norm);

    const policy pols[] = {
        { "lru", LRU, 0, false },
        { "clock", CLOCK, 0, false },
        { "random", SAMPLE, 1, false },
        { "sample-8", SAMPLE, 8, false },
        { "sample-16", SAMPLE, 16, false },
        { "sample-8+adm", SAMPLE, 8, true },
        { "sample-16+adm", SAMPLE, 16, true },
        { "clock+adm", CLOCK_ADM, 0, true },
        { "lfu", LFU, 16, false },
    };
    enum { NP = sizeof pols / sizeof *pols };
    result res[NP];
    printf("%-14s %8s | %-47s %8s | %8s %7s\n", "policy", "p1 hit", "phase 2 (new hot set) hit rate by eighth", "p2 hit",
           "M acc/s", "agings");
    for (int i = 0; i < NP; i++) {
        run_policy(&pols[i], &res[i]);
        printf("%-14s %8.4f |", pols[i].name, res[i].p1_steady);
        for (int k = 0; k < 8; k++) printf(" %.3f", res[i].p2_eighth[k]);
        printf(" %8.4f | %8.2f %7" PRIu64 "\n", res[i].p2_steady, res[i].rate / 1e6, res[i].agings);
        fflush(stdout);
    }
    printf("(p1 hit, p2 hit: hit rate over the second half of each phase)\n\n");

    /* Raw sketch rates: a uniform stream of distinct hashes (every touch a
     * miss in a large table) and the phase-1 trace (skewed). */
    size_t n = A < 16000000 ? A : 16000000;
    uint64_t *uni = xmalloc(n * sizeof *uni), *zip = xmalloc(n * sizeof *zip);
    for (size_t i = 0; i < n; i++) { uni[i] = embkv__hash(rng_id63(&r)); zip[i] = hashes[trace[0][i]]; }
    sketch_rates("sketch for the PM tier, uniform ids", C, uni, n);
    sketch_rates("sketch for the PM tier, Zipf trace", C, zip, n);
    sketch_rates("sketch of 1 GiB (128M ids), uniform ids", 128u << 20, uni, n);
    sketch_rates("sketch of 1 GiB (128M ids), Zipf trace", 128u << 20, zip, n);
    free(uni);
    free(zip);

    const result *lru = &res[0], *s8 = &res[3], *s8a = &res[5], *s16a = &res[6], *ck = &res[1], *cka = &res[7],
                 *lfu = &res[8];
    printf("\nRESULT ids=%zu cache=%zu zipf=%.2f lru=%.4f clock=%.4f sample8=%.4f sample8_adm=%.4f sample16_adm=%.4f "
           "clock_adm=%.4f lfu=%.4f top_c=%.4f p2_lru=%.4f p2_sample8_adm=%.4f p2_clock_adm=%.4f p2_lfu=%.4f "
           "p2_first8th_lru=%.4f p2_first8th_sample8_adm=%.4f\n",
           N, C, zs, lru->p1_steady, ck->p1_steady, s8->p1_steady, s8a->p1_steady, s16a->p1_steady, cka->p1_steady,
           lfu->p1_steady, top / norm, lru->p2_steady, s8a->p2_steady, cka->p2_steady, lfu->p2_steady,
           lru->p2_eighth[0], s8a->p2_eighth[0]);
    free(hashes);
    free(trace[0]);
    free(trace[1]);
    return 0;
}
