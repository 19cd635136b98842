/*
 * test_concurrency.c - many threads on one store.
 *
 * Vectors written here are uniform (every element equal), so a reader that
 * ever sees two different elements in one vector has caught a torn read.
 *  A. versions: writers put version v into their own ids (one writer per id),
 *     readers (get, get_batch) check uniformity, that versions never go back,
 *     that vector, state and clock come from the same write; a scanner checks
 *     untouched rows are visited exactly once; a syncer syncs all along.
 *  B. churn: writers insert/update/delete disjoint id ranges from a tiny
 *     index (it doubles several times under load) while readers require that
 *     rows nobody touches are always found with exact values, and hotset and
 *     sync threads run; exact final state, embkv_check, reopen.
 *  C. scans during growth: embkv_scan and embkv_scan_ids passes while the
 *     index doubles must see every untouched row exactly once (scan_ids may
 *     answer EMBKV_BUSY on a resize, and then starts over).
 *  D. refcounting: threads open and close one directory concurrently.
 *  E. a pinned thread beside an insert that waits for its pin to grow the
 *     index: its sync, snapshot open and backup answer EMBKV_BUSY (they
 *     waited for the insert's group, which waited for the pin: a hang), as
 *     does its write while another thread's sync waits for that group;
 *     after the unpin all of them go through.  Under alarm(): a hang fails.
 *  F. 1,100 threads alive at once, each reading and writing (more than a
 *     chunk of epoch slots), while the main thread writes and syncs.
 *  G. embkv_check over and over beside inserts that add record chunks.
 * Also built under TSan (tests/test_concurrency*.c), where it must be clean.
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

/* check.h's counters are plain ints; threads report through these and the
 * main thread folds them in, so the harness itself is race-free. */


static double scale = 1.0;
static uint64_t scaled(double n, uint64_t min)
{
    uint64_t v = (uint64_t)(n * scale);
    return v < min ? min : v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define DIM 64
static embkv_store *S;
static atomic_int writers_left;
static atomic_bool stop_aux;  /* stops syncers, hotset, scanners */

static void fill(float *v, float x) { for (int i = 0; i < DIM; i++) v[i] = x; }
static bool uniform(const float *v)
{
    for (int i = 1; i < DIM; i++) if (v[i] != v[0]) return false;
    return true;
}

static double max_load;  /* 0: default */

static embkv_store *open_store(const char *dir, uint32_t sf, uint64_t expected)
{
    embkv_options o = {0};
    o.max_load = max_load;
    o.dim = DIM;
    o.state_floats = sf;
    o.expected_rows = expected;
    o.pool_size = 128ull << 20;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) exit(test_summary("test_concurrency"));
    return s;
}

static void *syncer(void *arg)
{
    (void)arg;
    while (!atomic_load(&stop_aux)) {
        TCHECK_RC(embkv_sync(S), EMBKV_OK);
        usleep(2000);
    }
    return NULL;
}

/* ---- A: versions ------------------------------------------------------ */

#define A_NS 200               /* stable rows: id A_STABLE+i, value -(i+1) */
#define A_STABLE 1000000
#define A_NW 256               /* writer rows: id i, writer i % 2 */
static uint32_t a_versions;

static void *a_writer(void *arg)
{
    int w = (int)(intptr_t)arg;
    float v[DIM], st[1];
    for (uint32_t ver = 2; ver <= a_versions; ver++)
        for (int64_t id = w; id < A_NW; id += 2) {
            fill(v, (float)ver);
            st[0] = (float)ver;
            TCHECK_RC(embkv_put(S, id, v, st, EMBKV_PUT_UPDATE), EMBKV_OK);
        }
    atomic_fetch_sub(&writers_left, 1);
    return NULL;
}

static void *a_reader(void *arg)
{
    rng_t r = { (uint64_t)(intptr_t)arg * 1000003 };
    float last[A_NW] = {0};   /* highest version seen per writer id */
    float v[DIM], st[1], *out = malloc(48 * DIM * sizeof *out);
    int64_t ids[48];
    uint8_t found[48];
    embkv_rowinfo info;
    long reads = 0;
    while (atomic_load(&writers_left) > 0) {
        if (rnd_below(&r, 3)) {
            int64_t id = (int64_t)rnd_below(&r, A_NW);
            int rc = embkv_get(S, id, v, st, &info);
            TCHECK_RC(rc, EMBKV_OK);
            if (rc) continue;
            TCHECK(uniform(v));
            TCHECK(v[0] >= last[id]);           /* never backwards */
            TCHECK(st[0] == v[0]);              /* state of the same write */
            TCHECK(info.clock == (uint64_t)v[0] - 1);  /* and its clock */
            last[id] = v[0];
            int64_t sid = A_STABLE + (int64_t)rnd_below(&r, A_NS);
            TCHECK_RC(embkv_get(S, sid, v, NULL, NULL), EMBKV_OK);
            TCHECK(uniform(v) && v[0] == -(float)(sid - A_STABLE + 1));
            reads += 2;
        } else {
            size_t n = 1 + rnd_below(&r, 48);
            for (size_t i = 0; i < n; i++) {
                uint64_t k = rnd_below(&r, 10);
                ids[i] = k < 7 ? (int64_t)rnd_below(&r, A_NW)
                       : k < 9 ? A_STABLE + (int64_t)rnd_below(&r, A_NS)
                       : -5 - (int64_t)rnd_below(&r, 100);  /* never present */
            }
            size_t nmissing = 999;
            TCHECK_RC(embkv_get_batch(S, ids, n, out, found, &nmissing), EMBKV_OK);
            size_t miss = 0;
            float before[48];
            for (size_t i = 0; i < n; i++)
                before[i] = ids[i] >= 0 && ids[i] < A_NW ? last[ids[i]] : 0;
            for (size_t i = 0; i < n; i++) {
                const float *x = out + i * DIM;
                TCHECK(uniform(x));
                if (ids[i] < 0) { miss++; TCHECK(found[i] == 0 && x[0] == 0.0f); }
                else if (ids[i] >= A_STABLE) TCHECK(found[i] == 1 && x[0] == -(float)(ids[i] - A_STABLE + 1));
                else {
                    TCHECK(found[i] == 1);
                    TCHECK(x[0] >= before[i] && x[0] >= 1.0f);
                    if (x[0] > last[ids[i]]) last[ids[i]] = x[0];
                }
            }
            TCHECK(nmissing == miss);
            reads += (long)n;
        }
        TCHECK(embkv_count(S) == A_NS + A_NW);
    }
    free(out);
    return (void *)reads;
}

typedef struct { int stable_seen[A_NS]; long rows; } scan_acc;
static int a_scan_cb(void *ctx, int64_t id, const float *vec, const float *state,
                     const embkv_rowinfo *info)
{
    scan_acc *a = ctx;
    a->rows++;
    TCHECK(uniform(vec));
    if (id >= A_STABLE && id < A_STABLE + A_NS) {
        a->stable_seen[id - A_STABLE]++;
        TCHECK(vec[0] == -(float)(id - A_STABLE + 1));
    } else {
        TCHECK(id >= 0 && id < A_NW);
        TCHECK(vec[0] >= 1.0f && vec[0] == state[0] && info->clock == (uint64_t)vec[0] - 1);
    }
    return 0;
}

static void *a_scanner(void *arg)
{
    (void)arg;
    long passes = 0;
    scan_acc *a = malloc(sizeof *a);
    while (!atomic_load(&stop_aux)) {
        memset(a, 0, sizeof *a);
        TCHECK_RC(embkv_scan(S, a_scan_cb, a), EMBKV_OK);
        for (int i = 0; i < A_NS; i++) TCHECK(a->stable_seen[i] == 1);
        passes++;
    }
    free(a);
    return (void *)passes;
}

static void phase_a(void)
{
    double t0 = now_s();
    a_versions = (uint32_t)scaled(1500, 60);
    S = open_store(test_tmpdir("conc_a"), 1, 256);
    float v[DIM], st[1];
    for (int i = 0; i < A_NS; i++) {
        fill(v, -(float)(i + 1));
        CHECK_RC(embkv_put(S, A_STABLE + i, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
    }
    for (int i = 0; i < A_NW; i++) {
        fill(v, 1.0f);
        st[0] = 1.0f;
        CHECK_RC(embkv_put(S, i, v, st, EMBKV_PUT_INSERT), EMBKV_OK);
    }
    atomic_store(&writers_left, 2);
    atomic_store(&stop_aux, false);
    pthread_t w[2], r[2], sc, sy;
    for (intptr_t i = 0; i < 2; i++) pthread_create(&w[i], NULL, a_writer, (void *)i);
    for (intptr_t i = 0; i < 2; i++) pthread_create(&r[i], NULL, a_reader, (void *)(i + 1));
    pthread_create(&sc, NULL, a_scanner, NULL);
    pthread_create(&sy, NULL, syncer, NULL);
    long reads = 0;
    void *ret;
    for (int i = 0; i < 2; i++) pthread_join(w[i], NULL);
    for (int i = 0; i < 2; i++) { pthread_join(r[i], &ret); reads += (long)ret; }
    atomic_store(&stop_aux, true);
    pthread_join(sc, &ret);
    long passes = (long)ret;
    pthread_join(sy, NULL);
    fold_thread_checks();
    CHECK(passes >= 1);

    /* final state: every writer row at the last version */
    embkv_rowinfo info;
    for (int i = 0; i < A_NW; i++) {
        CHECK_RC(embkv_get(S, i, v, st, &info), EMBKV_OK);
        CHECK(uniform(v) && v[0] == (float)a_versions && st[0] == (float)a_versions);
        CHECK(info.clock == a_versions - 1);
    }
    CHECK(embkv_count(S) == A_NS + A_NW);
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    printf("  A versions: %u versions x %d rows, %ld reads, %ld scans, %.1f s\n",
           a_versions, A_NW, reads, passes, now_s() - t0);
}

/* ---- B: churn with growth, hotset and sync ---------------------------- */

#define B_NS 500
#define B_W 2
static uint32_t b_range;   /* ids per writer, <= 8192 */
static int64_t b_stable_id(int i) { return (int64_t)mix64(0xABCD0000ull + (uint64_t)i); }
static float b_stable_val(int i) { return -(float)(i + 1); }
static int64_t b_id(int w, uint32_t j) { return (int64_t)mix64(((uint64_t)(w + 1) << 32) | j); }
/* value of version `ver` of writer row j: the low 13 bits say whose row it is */
static float b_val(uint32_t j, uint32_t ver) { return (float)(((ver & 0x3ff) << 13) | j); }

typedef struct {
    int w;
    uint8_t *present;
    uint32_t *ver;
    long ops;
} bwriter;

static void *b_writer(void *arg)
{
    bwriter *bw = arg;
    rng_t r = { 77 + (uint64_t)bw->w };
    float v[DIM];
    /* fill 80% of the range first: this is what makes the index double
     * while readers, hotset and syncs run */
    for (uint32_t j = 0; j < b_range; j++) {
        if (rnd_below(&r, 5) == 0) continue;
        bw->ver[j] = 1;
        fill(v, b_val(j, 1));
        TCHECK_RC(embkv_put(S, b_id(bw->w, j), v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
        bw->present[j] = 1;
        bw->ops++;
    }
    for (uint64_t n = 0; n < 5ull * b_range; n++) {
        uint32_t j = (uint32_t)rnd_below(&r, b_range);
        int64_t id = b_id(bw->w, j);
        uint64_t k = rnd_below(&r, 10);
        bw->ops++;
        if (bw->present[j]) {
            if (k < 4) {
                TCHECK_RC(embkv_delete(S, id), EMBKV_OK);
                bw->present[j] = 0;
            } else if (k < 9) {
                fill(v, b_val(j, ++bw->ver[j]));
                TCHECK_RC(embkv_put(S, id, v, NULL, k < 6 ? EMBKV_PUT_UPDATE : 0), EMBKV_OK);
            } else {
                fill(v, b_val(j, bw->ver[j] + 1));
                TCHECK_RC(embkv_put(S, id, v, NULL, EMBKV_PUT_INSERT), EMBKV_EXISTS);
            }
        } else {
            if (k < 7) {
                fill(v, b_val(j, ++bw->ver[j]));
                TCHECK_RC(embkv_put(S, id, v, NULL, k < 4 ? EMBKV_PUT_INSERT : 0), EMBKV_OK);
                bw->present[j] = 1;
            } else if (k < 9) {
                fill(v, b_val(j, bw->ver[j] + 1));
                TCHECK_RC(embkv_put(S, id, v, NULL, EMBKV_PUT_UPDATE), EMBKV_NOTFOUND);
            } else {
                TCHECK_RC(embkv_delete(S, id), EMBKV_NOTFOUND);
            }
        }
    }
    atomic_fetch_sub(&writers_left, 1);
    return NULL;
}

static void *b_reader(void *arg)
{
    rng_t r = { 4242 + (uint64_t)(intptr_t)arg };
    float v[DIM], *out = malloc(32 * DIM * sizeof *out);
    int64_t ids[32];
    int kind[32];
    uint32_t js[32];
    uint8_t found[32];
    long reads = 0;
    while (atomic_load(&writers_left) > 0) {
        /* a row nobody touches must be found at every moment, resizes and
         * hotset moves included */
        int i = (int)rnd_below(&r, B_NS);
        int rc = embkv_get(S, b_stable_id(i), v, NULL, NULL);
        TCHECK_RC(rc, EMBKV_OK);
        TCHECK(uniform(v) && v[0] == b_stable_val(i));
        TCHECK(embkv_exists(S, b_stable_id(i)) == 1);

        uint32_t j = (uint32_t)rnd_below(&r, b_range);
        int w = (int)rnd_below(&r, B_W);
        rc = embkv_get(S, b_id(w, j), v, NULL, NULL);
        TCHECK(rc == EMBKV_OK || rc == EMBKV_NOTFOUND);
        if (rc == EMBKV_OK) TCHECK(uniform(v) && ((uint32_t)v[0] & 0x1fff) == j);

        size_t n = 1 + rnd_below(&r, 32);
        for (size_t k = 0; k < n; k++) {
            kind[k] = (int)rnd_below(&r, 2);
            if (kind[k]) { int si = (int)rnd_below(&r, B_NS); js[k] = (uint32_t)si; ids[k] = b_stable_id(si); }
            else { js[k] = (uint32_t)rnd_below(&r, b_range); ids[k] = b_id((int)rnd_below(&r, B_W), js[k]); }
        }
        TCHECK_RC(embkv_get_batch(S, ids, n, out, found, NULL), EMBKV_OK);
        for (size_t k = 0; k < n; k++) {
            const float *x = out + k * DIM;
            TCHECK(uniform(x));
            if (kind[k]) TCHECK(found[k] == 1 && x[0] == b_stable_val((int)js[k]));
            else if (found[k]) TCHECK(((uint32_t)x[0] & 0x1fff) == js[k]);
            else TCHECK(x[0] == 0.0f);
        }
        uint64_t c = embkv_count(S);
        TCHECK(c >= B_NS && c <= B_NS + (uint64_t)B_W * b_range);
        reads += 3 + (long)n;
    }
    free(out);
    return (void *)reads;
}

static void *b_hotset(void *arg)
{
    (void)arg;
    rng_t r = { 99 };
    int64_t ids[16];
    long calls = 0, moved_total = 0, moved_writer = 0;
    while (!atomic_load(&stop_aux)) {
        size_t moved = 999;
        /* stable rows only: all present, so the call must succeed */
        for (int k = 0; k < 16; k++) ids[k] = b_stable_id((int)rnd_below(&r, B_NS));
        TCHECK_RC(embkv_hotset(S, ids, 16, &moved), EMBKV_OK);
        TCHECK(moved <= 16);
        moved_total += moved <= 16 ? (long)moved : 0;
        /* writer rows, possibly deleted concurrently */
        for (int k = 0; k < 16; k++)
            ids[k] = b_id((int)rnd_below(&r, B_W), (uint32_t)rnd_below(&r, b_range));
        moved = 0;
        int rc = embkv_hotset(S, ids, 16, &moved);
        TCHECK(rc == EMBKV_OK || rc == EMBKV_NOTFOUND);
        if (rc == EMBKV_OK && moved <= 16) moved_writer += (long)moved;
        calls += 2;
    }
    printf("  B hotset: %ld calls, moved %ld stable and %ld writer rows\n", calls, moved_total,
           moved_writer);
    return (void *)(moved_total + moved_writer);
}

static void verify_b(bwriter *bw)
{
    float v[DIM];
    uint64_t want = B_NS;
    for (int i = 0; i < B_NS; i++) {
        CHECK_RC(embkv_get(S, b_stable_id(i), v, NULL, NULL), EMBKV_OK);
        CHECK(uniform(v) && v[0] == b_stable_val(i));
    }
    for (int w = 0; w < B_W; w++)
        for (uint32_t j = 0; j < b_range; j++) {
            int rc = embkv_get(S, b_id(w, j), v, NULL, NULL);
            if (bw[w].present[j]) {
                want++;
                CHECK_RC(rc, EMBKV_OK);
                CHECK(uniform(v) && v[0] == b_val(j, bw[w].ver[j]));
            } else {
                CHECK_RC(rc, EMBKV_NOTFOUND);
            }
        }
    CHECK(embkv_count(S) == want);
    CHECK_RC(embkv_check(S), EMBKV_OK);
}

static void phase_b(void)
{
    double t0 = now_s();
    b_range = (uint32_t)scaled(6000, 1500);
    if (b_range > 8192) b_range = 8192;
    const char *dir = strdup(test_tmpdir("conc_b"));
    max_load = 0.97;  /* full buckets: many displaced rows for hotset to move */
    S = open_store(dir, 0, 64);
    uint64_t nb0 = embkv_debug_nbuckets(S);
    float v[DIM];
    for (int i = 0; i < B_NS; i++) {
        fill(v, b_stable_val(i));
        CHECK_RC(embkv_put(S, b_stable_id(i), v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
    }
    uint64_t nb1 = embkv_debug_nbuckets(S);

    bwriter bw[B_W];
    for (int w = 0; w < B_W; w++) {
        bw[w].w = w;
        bw[w].present = calloc(b_range, 1);
        bw[w].ver = calloc(b_range, sizeof(uint32_t));
        bw[w].ops = 0;
    }
    atomic_store(&writers_left, B_W);
    atomic_store(&stop_aux, false);
    pthread_t w[B_W], r[2], hs, sy;
    for (int i = 0; i < B_W; i++) pthread_create(&w[i], NULL, b_writer, &bw[i]);
    for (intptr_t i = 0; i < 2; i++) pthread_create(&r[i], NULL, b_reader, (void *)i);
    pthread_create(&hs, NULL, b_hotset, NULL);
    pthread_create(&sy, NULL, syncer, NULL);
    void *ret;
    long reads = 0;
    for (int i = 0; i < B_W; i++) pthread_join(w[i], NULL);
    for (int i = 0; i < 2; i++) { pthread_join(r[i], &ret); reads += (long)ret; }
    atomic_store(&stop_aux, true);
    pthread_join(hs, &ret);
    long moved = (long)ret;
    pthread_join(sy, NULL);
    fold_thread_checks();
    CHECK(moved > 0);  /* hotset really moved rows while the others ran */

    uint64_t nb2 = embkv_debug_nbuckets(S);
    /* at least two doublings happened while the threads ran */
    CHECK(nb2 >= 4 * nb1);
    verify_b(bw);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    S = open_store(dir, 0, 64);
    verify_b(bw);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    max_load = 0;
    printf("  B churn: %ld writes, %ld reads, buckets %" PRIu64 " -> %" PRIu64 " -> %" PRIu64
           ", %.1f s\n", bw[0].ops + bw[1].ops, reads, nb0, nb1, nb2, now_s() - t0);
    for (int i = 0; i < B_W; i++) { free(bw[i].present); free(bw[i].ver); }
    free((void *)dir);
}

/* ---- C: scans while the index doubles --------------------------------- */

#define C_NS 300
#define C_STABLE (-1000000)   /* stable ids C_STABLE - i, value i + 0.5 */
static uint32_t c_range;

static void *c_writer(void *arg)
{
    (void)arg;
    float v[DIM];
    for (uint32_t j = 0; j < c_range; j++) {   /* growth */
        fill(v, (float)j);
        TCHECK_RC(embkv_put(S, (int64_t)j * 7919, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
    }
    for (uint32_t j = 0; j < c_range; j += 3) { /* and updates */
        fill(v, (float)j);
        TCHECK_RC(embkv_put(S, (int64_t)j * 7919, v, NULL, EMBKV_PUT_UPDATE), EMBKV_OK);
    }
    atomic_fetch_sub(&writers_left, 1);
    return NULL;
}

typedef struct { uint8_t seen[C_NS]; } c_acc;
static int c_scan_cb(void *ctx, int64_t id, const float *vec, const float *state,
                     const embkv_rowinfo *info)
{
    (void)state; (void)info;
    c_acc *a = ctx;
    TCHECK(uniform(vec));
    if (id <= C_STABLE && id > C_STABLE - C_NS) {
        int i = (int)(C_STABLE - id);
        a->seen[i]++;
        TCHECK(vec[0] == (float)i + 0.5f);
    } else {
        TCHECK(id % 7919 == 0 && vec[0] == (float)(id / 7919));
    }
    return 0;
}

static void *c_scanner(void *arg)
{
    bool cursor = arg != NULL;
    long passes = 0, busy = 0;
    c_acc *a = malloc(sizeof *a);
    int64_t ids[256];
    while (atomic_load(&writers_left) > 0 || passes < 1) {
        memset(a, 0, sizeof *a);
        if (!cursor) {
            /* unlike scan_ids, embkv_scan has no EMBKV_BUSY in its contract:
             * a resize during the scan must not cut it short */
            int rc = embkv_scan(S, c_scan_cb, a);
            TCHECK_RC(rc, EMBKV_OK);
            if (rc != EMBKV_OK) continue;
        } else {
            uint64_t pos = 0;
            size_t n;
            int rc;
            while ((rc = embkv_scan_ids(S, &pos, ids, 256, &n)) == EMBKV_OK && n > 0) {
                for (size_t k = 0; k < n; k++)
                    if (ids[k] <= C_STABLE && ids[k] > C_STABLE - C_NS) a->seen[C_STABLE - ids[k]]++;
            }
            if (rc == EMBKV_BUSY) { busy++; continue; }   /* a resize: start over */
            TCHECK_RC(rc, EMBKV_OK);
        }
        for (int i = 0; i < C_NS; i++) TCHECK(a->seen[i] == 1);
        passes++;
    }
    free(a);
    if (cursor) fprintf(stderr, "  C scan_ids: %ld passes, %ld BUSY restarts\n", passes, busy);
    return (void *)passes;
}

static void phase_c(void)
{
    double t0 = now_s();
    c_range = (uint32_t)scaled(40000, 4000);
    S = open_store(test_tmpdir("conc_c"), 0, 64);
    float v[DIM];
    for (int i = 0; i < C_NS; i++) {
        fill(v, (float)i + 0.5f);
        CHECK_RC(embkv_put(S, C_STABLE - i, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
    }
    uint64_t nb1 = embkv_debug_nbuckets(S);
    atomic_store(&writers_left, 1);
    atomic_store(&stop_aux, false);
    pthread_t w, sc[2], sy;
    pthread_create(&w, NULL, c_writer, NULL);
    pthread_create(&sc[0], NULL, c_scanner, NULL);
    pthread_create(&sc[1], NULL, c_scanner, (void *)1);
    pthread_create(&sy, NULL, syncer, NULL);
    void *ret;
    long passes = 0;
    pthread_join(w, NULL);
    for (int i = 0; i < 2; i++) { pthread_join(sc[i], &ret); passes += (long)ret; }
    atomic_store(&stop_aux, true);
    pthread_join(sy, NULL);
    fold_thread_checks();
    uint64_t nb2 = embkv_debug_nbuckets(S);
    CHECK(nb2 >= 4 * nb1);
    CHECK(embkv_count(S) == C_NS + c_range);
    for (uint32_t j = 0; j < c_range; j += 97) {
        CHECK_RC(embkv_get(S, (int64_t)j * 7919, v, NULL, NULL), EMBKV_OK);
        CHECK(uniform(v) && v[0] == (float)j);
    }
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    printf("  C scans: %ld passes, buckets %" PRIu64 " -> %" PRIu64 ", %.1f s\n",
           passes, nb1, nb2, now_s() - t0);
}

/* ---- D: one directory opened from many threads -------------------------- */

#define D_T 4
static const char *d_dir;
static uint8_t *d_done;   /* [t * d_loops + k]: thread t's k-th row went in */
static pthread_barrier_t d_bar;
static embkv_store *d_handles[D_T];
static int d_rounds, d_loops;

static void *d_barrier_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    embkv_options o = {0};
    o.dim = DIM;
    o.expected_rows = 1000;
    o.pool_size = 32ull << 20;
    float v[DIM];
    for (int round = 0; round < d_rounds; round++) {
        pthread_barrier_wait(&d_bar);
        embkv_store *s = NULL;
        TCHECK_RC(embkv_open(d_dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
        d_handles[t] = s;
        pthread_barrier_wait(&d_bar);
        for (int k = 0; k < D_T; k++) TCHECK(d_handles[k] == s);  /* one shared handle */
        if (s) {
            fill(v, (float)round);
            TCHECK_RC(embkv_put(s, (int64_t)round * D_T + t, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
        }
        pthread_barrier_wait(&d_bar);  /* nobody closes before all wrote */
        if (s) {
            /* every thread's row of this round is visible through the handle */
            for (int k = 0; k < D_T; k++) TCHECK(embkv_exists(s, (int64_t)round * D_T + k) == 1);
        }
        pthread_barrier_wait(&d_bar);
        if (s) TCHECK_RC(embkv_close(s), EMBKV_OK);
    }
    return NULL;
}

/* Free-running open/put/get/close: races of the last close with new opens. */
static void *d_free_thread(void *arg)
{
    int t = (int)(intptr_t)arg;
    embkv_options o = {0};
    o.dim = DIM;
    float v[DIM], got[DIM];
    for (int k = 0; k < d_loops; k++) {
        embkv_store *s = NULL;
        int rc = embkv_open(d_dir, &o, 0, &s);
        TCHECK_RC(rc, EMBKV_OK);
        if (rc) continue;
        int64_t id = 1000000 + (int64_t)t * 100000 + k;
        fill(v, (float)k);
        TCHECK_RC(embkv_put(s, id, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
        d_done[t * d_loops + k] = 1;
        TCHECK_RC(embkv_get(s, id, got, NULL, NULL), EMBKV_OK);
        TCHECK(uniform(got) && got[0] == (float)k);
        TCHECK(embkv_dim(s) == DIM);
        TCHECK_RC(embkv_close(s), EMBKV_OK);
    }
    return NULL;
}

static void phase_d(void)
{
    double t0 = now_s();
    d_dir = strdup(test_tmpdir("conc_d"));
    d_rounds = (int)scaled(20, 5);
    d_loops = (int)scaled(100, 20);
    d_done = calloc((size_t)D_T * (size_t)d_loops, 1);
    pthread_barrier_init(&d_bar, NULL, D_T);
    pthread_t th[D_T];
    for (intptr_t i = 0; i < D_T; i++) pthread_create(&th[i], NULL, d_barrier_thread, (void *)i);
    for (int i = 0; i < D_T; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&d_bar);
    for (intptr_t i = 0; i < D_T; i++) pthread_create(&th[i], NULL, d_free_thread, (void *)i);
    for (int i = 0; i < D_T; i++) pthread_join(th[i], NULL);
    fold_thread_checks();

    /* all closed: a fresh open sees every row, and the refcount is back to
     * one (a single close closes it, so the next open starts from disk) */
    embkv_options o = {0};
    o.dim = DIM;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(d_dir, &o, 0, &s), EMBKV_OK);
    if (s) {
        uint64_t done = 0;
        for (int i = 0; i < D_T * d_loops; i++) done += d_done[i];
        CHECK(done == (uint64_t)d_loops * D_T);  /* no open was refused */
        CHECK(embkv_count(s) == (uint64_t)d_rounds * D_T + done);
        float v[DIM];
        for (int i = 0; i < d_rounds * D_T; i++) {
            CHECK_RC(embkv_get(s, i, v, NULL, NULL), EMBKV_OK);
            CHECK(uniform(v) && v[0] == (float)(i / D_T));
        }
        /* every row put through a handle that was open survived its close */
        for (int t = 0; t < D_T; t++)
            for (int k = 0; k < d_loops; k++) {
                if (!d_done[t * d_loops + k]) continue;
                CHECK_RC(embkv_get(s, 1000000 + (int64_t)t * 100000 + k, v, NULL, NULL), EMBKV_OK);
                CHECK(uniform(v) && v[0] == (float)k);
            }
        CHECK_RC(embkv_check(s), EMBKV_OK);
        embkv_stats st;
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        CHECK(st.recovered == 0);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    printf("  D refcount: %d barrier rounds, %d free loops x %d threads, %.1f s\n",
           d_rounds, d_loops, D_T, now_s() - t0);
    free(d_done);
    free((void *)d_dir);
}

/* ---- E: a pinned thread's waits ----------------------------------------- */

#define E_ROWS 5000           /* the index of 1000 expected rows grows at ~1600 */
static atomic_long e_put;     /* rows the inserter put */
static atomic_bool e_synced;  /* the other thread's sync returned */

static void *e_inserter(void *arg)
{
    (void)arg;
    float v[DIM];
    for (long i = 0; i < E_ROWS; i++) {
        fill(v, (float)i);
        TCHECK_RC(embkv_put(S, i, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
        atomic_store(&e_put, i + 1);
    }
    return NULL;
}

static void *e_syncer(void *arg)
{
    (void)arg;
    TCHECK_RC(embkv_sync(S), EMBKV_OK);  /* waits for the inserter's group, then goes through */
    atomic_store(&e_synced, true);
    return NULL;
}

void __sanitizer_print_stack_trace(void) __attribute__((weak));
static void e_on_alarm(int sig)
{
    fprintf(stderr, "test_concurrency: phase E hung (a pinned thread waited for its own pin)\n");
    if (__sanitizer_print_stack_trace) __sanitizer_print_stack_trace();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Calls fn until it answers other than EMBKV_OK, at most 20 s: the resize
 * may not be waiting yet when the first call is made. */
static int e_until_busy(int (*fn)(void), double *waited)
{
    double t0 = now_s();
    int rc;
    while ((rc = fn()) == EMBKV_OK && now_s() - t0 < 20)
        usleep(1000);
    *waited = now_s() - t0;
    return rc;
}

static int e_sync(void) { return embkv_sync(S); }
static int e_update(void)
{
    float v[DIM];
    fill(v, -1);
    return embkv_put(S, 0, v, NULL, 0);
}

static void phase_e(void)
{
    double t0 = now_s();
    signal(SIGALRM, e_on_alarm);
    alarm(30);
    S = open_store(test_tmpdir("conc_e"), 0, 1000);
    atomic_store(&e_put, 0);
    atomic_store(&e_synced, false);
    embkv_scan_pin(S);
    pthread_t ins, sy;
    pthread_create(&ins, NULL, e_inserter, NULL);
    double waited;
    int rc = e_until_busy(e_sync, &waited);
    CHECK_RC(rc, EMBKV_BUSY);
    CHECK(strstr(embkv_errmsg(), "holds a scan pin") && strstr(embkv_errmsg(), "embkv_sync") &&
          strstr(embkv_errmsg(), "embkv_scan_unpin"));
    long stalled = atomic_load(&e_put);
    CHECK(stalled < E_ROWS);  /* the inserter waits for the unpin */
    embkv_snapshot *snap = NULL;
    CHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_BUSY);
    CHECK(snap == NULL && strstr(embkv_errmsg(), "embkv_snapshot_open"));
    embkv_backup *b = NULL;
    CHECK_RC(embkv_backup_begin(S, test_tmpdir("conc_e_backup"), &b), EMBKV_BUSY);
    CHECK(b == NULL && strstr(embkv_errmsg(), "embkv_backup_begin"));
    /* Another thread's sync waits for the inserter's group and holds new
     * groups off: this thread's write would wait for it. */
    pthread_create(&sy, NULL, e_syncer, NULL);
    double waited2;
    CHECK_RC(e_until_busy(e_update, &waited2), EMBKV_BUSY);
    CHECK(strstr(embkv_errmsg(), "a write in a thread that holds a scan pin"));
    CHECK_RC(e_until_busy(e_sync, &waited2), EMBKV_BUSY);  /* (its sync_mu is held by the other sync) */
    CHECK(!atomic_load(&e_synced) && atomic_load(&e_put) == stalled);
    embkv_scan_unpin(S);
    pthread_join(ins, NULL);
    pthread_join(sy, NULL);
    fold_thread_checks();
    alarm(0);
    CHECK(atomic_load(&e_synced));
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    CHECK_RC(embkv_snapshot_open(S, &snap), EMBKV_OK);
    if (snap) embkv_snapshot_close(snap);
    CHECK(embkv_count(S) == E_ROWS);
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    printf("  E pinned waits: the insert stopped at %ld rows, BUSY after %.2f s, %.1f s\n", stalled, waited,
           now_s() - t0);
}

/* F. more live threads than a chunk of epoch slots (1,024): each writes
 * and reads its row, then all stay alive while the main thread rewrites
 * every row and syncs (reclamation scans every slot), then read again.
 * A thread that found no slot would wait for another to exit: for ever,
 * spinning (phase F's alarm says so). */
enum { F_THREADS = 1100 };
static pthread_barrier_t f_in, f_out;

static void *f_thread(void *arg)
{
    long id = (long)(intptr_t)arg;
    float v[DIM];
    fill(v, (float)id);
    TCHECK_RC(embkv_put(S, id, v, NULL, 0), EMBKV_OK);
    TCHECK_RC(embkv_get(S, id, v, NULL, NULL), EMBKV_OK);
    TCHECK(v[0] == (float)id && uniform(v));
    pthread_barrier_wait(&f_in);
    pthread_barrier_wait(&f_out);
    TCHECK_RC(embkv_get(S, id, v, NULL, NULL), EMBKV_OK);
    TCHECK(v[0] == (float)id + 0.5f && uniform(v));
    return NULL;
}

static void f_on_alarm(int sig)
{
    fprintf(stderr, "test_concurrency: phase F hung (a thread past the epoch slots waited for one)\n");
    signal(sig, SIG_DFL);
    raise(sig);
}

static void phase_f(void)
{
    double t0 = now_s();
    signal(SIGALRM, f_on_alarm);
    alarm(120);
    S = open_store(test_tmpdir("conc_f"), 0, F_THREADS);
    pthread_barrier_init(&f_in, NULL, F_THREADS + 1);
    pthread_barrier_init(&f_out, NULL, F_THREADS + 1);
    pthread_t *t = spawn_many(F_THREADS, f_thread, "test_concurrency");
    pthread_barrier_wait(&f_in);
    float v[DIM];
    for (long i = 0; i < F_THREADS; i++) {
        fill(v, (float)i + 0.5f);
        CHECK_RC(embkv_put(S, i, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    pthread_barrier_wait(&f_out);
    for (long i = 0; i < F_THREADS; i++)
        pthread_join(t[i], NULL);
    fold_thread_checks();
    alarm(0);
    free(t);
    pthread_barrier_destroy(&f_in);
    pthread_barrier_destroy(&f_out);
    CHECK(embkv_count(S) == F_THREADS);
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    printf("  F %d live threads: %.1f s\n", F_THREADS, now_s() - t0);
}

/* G. embkv_check beside a writer whose inserts add record chunks (it
 * allocates before it waits for the check's exclusive lock): every check
 * passes, and ThreadSanitizer finds no race on the chunk count. */
static atomic_bool g_done;

static void *g_inserter(void *arg)
{
    (void)arg;
    float v[DIM];
    long n = (long)scaled(20000, 4000);
    for (long i = 0; i < n; i++) {
        fill(v, (float)i);
        TCHECK_RC(embkv_put(S, i, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
    }
    atomic_store(&g_done, true);
    return NULL;
}

static void phase_g(void)
{
    double t0 = now_s();
    S = open_store(test_tmpdir("conc_g"), 0, 64);
    atomic_store(&g_done, false);
    pthread_t t;
    pthread_create(&t, NULL, g_inserter, NULL);
    int checks = 0;
    while (!atomic_load(&g_done)) {
        CHECK_RC(embkv_check(S), EMBKV_OK);
        checks++;
    }
    pthread_join(t, NULL);
    fold_thread_checks();
    CHECK(checks > 0);
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    printf("  G %d checks beside inserts: %.1f s\n", checks, now_s() - t0);
}

int main(void)
{
    const char *e = getenv("EMBKV_TEST_SCALE");
    if (e && *e && atof(e) > 0) scale = atof(e);
    double t0 = now_s();
    setvbuf(stdout, NULL, _IOLBF, 0);  /* progress lines survive a crash */
    printf("test_concurrency: scale %.2f\n", scale);
    fflush(stdout);
    /* EMBKV_TEST_PHASES=bd runs only phases B and D (for debugging) */
    const char *ph = getenv("EMBKV_TEST_PHASES");
    if (!ph || !*ph) ph = "abcdefg";
    if (strchr(ph, 'a')) phase_a();
    if (strchr(ph, 'b')) phase_b();
    if (strchr(ph, 'c')) phase_c();
    if (strchr(ph, 'd')) phase_d();
    if (strchr(ph, 'e')) phase_e();
    if (strchr(ph, 'f')) phase_f();
    if (strchr(ph, 'g')) phase_g();
    printf("test_concurrency: %.1f s\n", now_s() - t0);
    return test_summary("test_concurrency");
}
