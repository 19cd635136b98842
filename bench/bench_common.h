/*
 * bench_common.h - helpers shared by embkv's benchmarks: a seeded PRNG,
 * a Zipf sampler, the benchmark data set (ids, vectors, Zipf batches),
 * timing, best/median of repeated runs, argument parsing and directory
 * handling.  Everything is static: each bench_*.c is one translation unit.
 */
#ifndef EMBKV_BENCH_COMMON_H
#define EMBKV_BENCH_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- misc */

static inline void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory allocating %zu bytes", n);
    return p;
}

/* Cache-line aligned allocation, size rounded up to a multiple of 64. */
static inline void *xalloc64(size_t n)
{
    size_t sz = (n + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, sz ? sz : 64);
    if (!p) die("out of memory allocating %zu bytes", n);
    return p;
}

/* Zeroed memory advised 2 MiB pages (where the kernel gives them to
 * madvise, as the engine's cache and sketch are): the baselines' arrays,
 * so that they do not pay TLB misses the engine's DRAM structures avoid.
 * Freed with xfree_huge. */
static inline void *xalloc_huge(size_t n)
{
    size_t sz = ((n ? n : 1) + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
    char *p = mmap(NULL, sz + (2u << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("out of memory mapping %zu bytes", n);
    char *a = (char *)(((uintptr_t)p + (2u << 20) - 1) & ~(uintptr_t)((2u << 20) - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    munmap(a + sz, (size_t)(p + (2u << 20) - a));
    (void)madvise(a, sz, MADV_HUGEPAGE);
    return a;
}

static inline void xfree_huge(void *p, size_t n)
{
    if (p) munmap(p, ((n ? n : 1) + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1));
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ----------------------------------------------------------------- PRNG */

/* splitmix64 seeds xoshiro256**; both are tiny well-known generators. */
static inline uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct rng { uint64_t s[4]; } rng;

static inline void rng_seed(rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static inline uint64_t rng_next(rng *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

/* Uniform double in [0, 1). */
static inline double rng_double(rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }

/* Uniform integer in [0, n) (n > 0), by multiply-shift (bias < n / 2^64). */
static inline uint64_t rng_below(rng *r, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)rng_next(r) * n) >> 64);
}

/* A random non-negative 63-bit id. */
static inline int64_t rng_id63(rng *r) { return (int64_t)(rng_next(r) >> 1); }

/* Uniform float in [-1, 1). */
static inline float rng_float(rng *r) { return (float)(rng_double(r) * 2.0 - 1.0); }

/* ----------------------------------------------------------------- Zipf */

/*
 * Zipf(s) over ranks 1..n, P(k) proportional to k^-s, sampled by
 * rejection-inversion (Hoermann & Derflinger 1996).  With h(x) = x^-s and
 * H its antiderivative, rank k >= 2 owns the interval
 * [H(k - 1/2), H(k + 1/2)] of the y axis, of which the top h(k) is accepted
 * (h is convex, so h(k) <= the integral over the interval); rank 1 owns
 * [H(3/2) - 1, H(3/2)], all accepted.  y is uniform over
 * [H(3/2) - 1, H(n + 1/2)], k = round(H^-1(y)).  The accepted measure of k is
 * exactly h(k), so the result is exact.  O(1) memory, ~1 exp + 2 log per try.
 */
typedef struct zipf {
    double s, lo, hi;
    uint64_t n;
} zipf;

/* expm1(t)/t and log1p(t)/t with their limits at 0. */
static inline double zipf_expm1_over(double t) { return fabs(t) > 1e-8 ? expm1(t) / t : 1.0 + t / 2.0; }
static inline double zipf_log1p_over(double t) { return fabs(t) > 1e-8 ? log1p(t) / t : 1.0 - t / 2.0; }

/* H(x) = (x^(1-s) - 1) / (1-s), = log x at s = 1. */
static inline double zipf_H(const zipf *z, double x)
{
    double lx = log(x);
    return lx * zipf_expm1_over((1.0 - z->s) * lx);
}

static inline double zipf_Hinv(const zipf *z, double y)
{
    double t = y * (1.0 - z->s);
    if (t < -1.0) t = -1.0;  /* rounding guard; H^-1 is defined for t > -1 */
    return exp(y * zipf_log1p_over(t));
}

static inline double zipf_h(const zipf *z, double x) { return exp(-z->s * log(x)); }

static inline void zipf_init(zipf *z, uint64_t n, double s)
{
    z->n = n;
    z->s = s;
    z->lo = zipf_H(z, 1.5) - 1.0;
    z->hi = zipf_H(z, (double)n + 0.5);
}

/* A rank in 1..n. */
static inline uint64_t zipf_next(const zipf *z, rng *r)
{
    for (;;) {
        double y = z->lo + rng_double(r) * (z->hi - z->lo);
        double x = zipf_Hinv(z, y);
        uint64_t k = (uint64_t)(x + 0.5);
        if (k < 1) k = 1;
        if (k > z->n) k = z->n;
        if (y >= zipf_H(z, (double)k + 0.5) - zipf_h(z, (double)k)) return k;
    }
}

/* --------------------------------------------------------- the data set */

#define BENCH_SEED 0x656D626B76ull /* "embkv" */

typedef struct dataset {
    size_t rows, dim;
    size_t nbatches, batch;   /* batches of `batch` ids each */
    double zipf_s;
    int64_t *ids;             /* ids[row], distinct random 63-bit */
    float *vecs;              /* vecs[row * dim ...] */
    int64_t *bids;            /* bids[b * batch + i]: the batch ids */
    uint32_t *brow;           /* row index of each batch id */
} dataset;

/* A small open-addressing set of ids, used only to make ids distinct. */
static inline int id_set_insert(int64_t *tab, uint64_t mask, int64_t id)
{
    uint64_t h = ((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 20;
    for (uint64_t i = h & mask;; i = (i + 1) & mask) {
        if (tab[i] == -1) { tab[i] = id; return 1; }
        if (tab[i] == id) return 0;
    }
}

/* Builds the data: `rows` distinct random 63-bit ids (fixed seed), random
 * vectors in [-1, 1), and nbatches * batch ids drawn Zipf(s) over the rows,
 * rank r mapped to row perm[r] (a random permutation, so hot ids are spread
 * over the table).  Prints a check of the sampler against the exact
 * probabilities of the top ranks. */
static inline void dataset_make(dataset *d, size_t rows, size_t dim, size_t nbatches,
                         size_t batch, double s, int verbose)
{
    if (rows == 0 || rows > UINT32_MAX) die("rows must be in 1..%u", UINT32_MAX);
    memset(d, 0, sizeof *d);
    d->rows = rows; d->dim = dim; d->nbatches = nbatches; d->batch = batch; d->zipf_s = s;
    rng r;
    rng_seed(&r, BENCH_SEED);

    d->ids = xmalloc(rows * sizeof *d->ids);
    uint64_t cap = 1;
    while (cap < 2 * rows) cap <<= 1;
    int64_t *set = xmalloc(cap * sizeof *set);
    memset(set, 0xff, cap * sizeof *set);
    for (size_t i = 0; i < rows; i++) {
        int64_t id;
        do id = rng_id63(&r); while (!id_set_insert(set, cap - 1, id));
        d->ids[i] = id;
    }
    free(set);

    d->vecs = xalloc64(rows * dim * sizeof *d->vecs);
    for (size_t i = 0; i < rows * dim; i++) d->vecs[i] = rng_float(&r);

    uint32_t *perm = xmalloc(rows * sizeof *perm);
    for (size_t i = 0; i < rows; i++) perm[i] = (uint32_t)i;
    for (size_t i = rows - 1; i > 0; i--) {
        size_t j = rng_below(&r, i + 1);
        uint32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }

    size_t total = nbatches * batch;
    d->bids = xalloc64(total * sizeof *d->bids);
    d->brow = xmalloc(total * sizeof *d->brow);
    zipf z;
    zipf_init(&z, rows, s);
    enum { TOPK = 8 };
    size_t hits[TOPK] = {0};
    for (size_t i = 0; i < total; i++) {
        uint64_t k = zipf_next(&z, &r);
        if (k <= TOPK) hits[k - 1]++;
        uint32_t row = perm[k - 1];
        d->brow[i] = row;
        d->bids[i] = d->ids[row];
    }
    free(perm);

    if (verbose && total > 0) {
        double norm = 0;  /* sum of k^-s, smallest terms first */
        for (size_t k = rows; k >= 1; k--) norm += pow((double)k, -s);
        printf("zipf(%.2f) over %zu rows, %zu ids sampled; P(rank k) sampled/exact:", s, rows, total);
        for (int k = 1; k <= 4; k++)
            printf(" %d: %.4f/%.4f", k, (double)hits[k - 1] / (double)total, pow(k, -s) / norm);
        double top = 0, topx = 0;
        for (int k = 1; k <= TOPK; k++) { top += (double)hits[k - 1]; topx += pow(k, -s) / norm; }
        printf("; top %d: %.4f/%.4f\n", TOPK, top / (double)total, topx);
    }
}

static inline void dataset_free(dataset *d)
{
    free(d->ids); free(d->vecs); free(d->bids); free(d->brow);
    memset(d, 0, sizeof *d);
}

/* Number of distinct ids in each batch, averaged (Zipf batches repeat hot ids). */
static inline double dataset_mean_distinct(const dataset *d)
{
    if (!d->nbatches) return 0;
    uint64_t cap = 1;
    while (cap < 2 * d->batch) cap <<= 1;
    int64_t *set = xmalloc(cap * sizeof *set);
    size_t sum = 0;
    for (size_t b = 0; b < d->nbatches; b++) {
        memset(set, 0xff, cap * sizeof *set);
        for (size_t i = 0; i < d->batch; i++) sum += (size_t)id_set_insert(set, cap - 1, d->bids[b * d->batch + i]);
    }
    free(set);
    return (double)sum / (double)d->nbatches;
}

/* ----------------------------------------------------- repeated timings */

#define MAX_REPS 16

typedef struct timing {
    const char *name;
    double secs[MAX_REPS];
    int n;
} timing;

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static inline void timing_add(timing *t, double secs) { if (t->n < MAX_REPS) t->secs[t->n++] = secs; }

static inline double timing_best(const timing *t)
{
    double b = t->n ? t->secs[0] : NAN;
    for (int i = 1; i < t->n; i++) if (t->secs[i] < b) b = t->secs[i];
    return b;
}

static inline double timing_median(const timing *t)
{
    if (!t->n) return NAN;
    double v[MAX_REPS];
    memcpy(v, t->secs, (size_t)t->n * sizeof *v);
    qsort(v, (size_t)t->n, sizeof *v, cmp_double);
    return t->n % 2 ? v[t->n / 2] : (v[t->n / 2 - 1] + v[t->n / 2]) / 2;
}

/* Prints "name: best X M rows/s, median Y M rows/s (n runs)" for `items`
 * items per run. */
static inline void timing_print_rate(const timing *t, double items, const char *unit)
{
    printf("  %-44s best %8.2f M %s/s  median %8.2f M %s/s  (%d runs)\n", t->name,
           items / timing_best(t) / 1e6, unit, items / timing_median(t) / 1e6, unit, t->n);
}

static inline void timing_print_ms(const timing *t)
{
    printf("  %-44s best %8.2f ms        median %8.2f ms        (%d runs)\n", t->name,
           timing_best(t) * 1e3, timing_median(t) * 1e3, t->n);
}

/* Ratio of rates a/b (= time b / time a), for best and for median. */
static inline void print_ratio(const char *label, const timing *a, const timing *b)
{
    printf("  %-44s best %6.3f   median %6.3f\n", label,
           timing_best(b) / timing_best(a), timing_median(b) / timing_median(a));
}

/* ------------------------------------------------------------ arguments */

static inline size_t parse_size(const char *opt, const char *v)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || x < 0 || x > 1e15) die("%s: bad number '%s'", opt, v);
    if (*end == 'k' || *end == 'K') { x *= 1e3; end++; }
    else if (*end == 'M') { x *= 1e6; end++; }
    if (*end) die("%s: bad number '%s'", opt, v);
    return (size_t)x;
}

/* ---------------------------------------------------------- directories */

/* 1 when the path does not exist or is an empty directory. */
static inline int dir_absent_or_empty(const char *path)
{
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT;
    struct dirent *e;
    int empty = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) { empty = 0; break; }
    closedir(d);
    return empty;
}

static inline int rm_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb; (void)ftw;
    int rc = (type == FTW_DP) ? rmdir(path) : unlink(path);
    if (rc) perror(path);
    return 0;
}

/* rm -rf path (does not follow symlinks). */
/* The file system a path is on, by name (figures differ a lot between them). */
static inline const char *fs_name(const char *path)
{
    struct statfs sf;
    if (statfs(path, &sf)) return "?";
    switch ((unsigned long)sf.f_type) {
    case 0x01021994ul: return "tmpfs";
    case 0xEF53ul: return "ext2/3/4";
    case 0x58465342ul: return "xfs";
    case 0x9123683Eul: return "btrfs";
    case 0x794C7630ul: return "overlayfs";
    default: return "other";
    }
}

static inline void rm_rf(const char *path)
{
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
