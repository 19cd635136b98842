/*
 * test_gpu_real.c - device gathers and pushes on a GPU (run by
 * tests/gpu/run.sh; built by `make gpu-bundle`).  The same checks as
 * tests/test_gpu.c makes with a fake device, here with the driver's, and
 * under load:
 *  A. A GPU is usable (embkv_gpu_status) and the pool's mapping registers.
 *  B. Gathers into device memory equal embkv_get_batch bit for bit, for
 *     rows in the DRAM cache, the pool and the SSD log, missing ids and
 *     repeats, for f32, f16, bf16 and i8 tables.
 *  C. Thousands of Zipf batches gathered (several in flight at once) while
 *     two threads rewrite rows, the tier's thread demotes and compacts, and
 *     a third checkpoints and moves hot rows: every gathered row is a whole
 *     version some write wrote (element 0 its generation, the others a
 *     function of id and generation): never torn, never another row's.
 *  D. embkv_push_device from device gradients equals embkv_push (adagrad,
 *     adam; repeated ids), rows and optimizer state bit for bit; pulls
 *     into device memory equal embkv_pull.
 *  E. The kernel's decoding and checks: rows of random values over each
 *     dtype's whole range (subnormals; i8 rows whose range needs the
 *     double path), dim 100 (lanes with 4 elements and with 3), equal
 *     embkv_get_batch bit for bit; records damaged in place (an f16 or
 *     bf16 element that is not finite in one lane, an i8 scale NaN, a
 *     header naming another id) come back as zeros beside whole rows, and
 *     the next device call reports the first as EMBKV_CORRUPT, once.
 * --short: fewer batches (for compute-sanitizer's memcheck).
 */
#include <cuda.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#define CK(call)                                                                                  \
    do {                                                                                          \
        CUresult r_ = (call);                                                                     \
        if (r_ != CUDA_SUCCESS) {                                                                 \
            const char *s_ = NULL;                                                                \
            cuGetErrorString(r_, &s_);                                                            \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_ ? s_ : "?");         \
            exit(3);                                                                              \
        }                                                                                         \
    } while (0)

static CUstream stream;
static bool short_run;

static float val(int64_t id, uint32_t gen, int j) { return (float)((id * 131 + gen * 17 + j * 7) % 1000) / 8.0f - 60.0f; }

static void row_of(int64_t id, uint32_t gen, float *v, int dim)
{
    v[0] = (float)gen;
    for (int j = 1; j < dim; j++)
        v[j] = val(id, gen, j);
}

/* A gather of ids equals embkv_get_batch's bytes. */
static bool gather_equals_cpu(embkv_store *s, const int64_t *ids, size_t n, int dim)
{
    size_t bytes = n * (size_t)dim * 4;
    CUdeviceptr d;
    CK(cuMemAlloc(&d, bytes ? bytes : 4));
    CK(cuMemsetD8Async(d, 0x5a, bytes ? bytes : 4, stream));
    float *got = malloc(bytes + 4), *want = malloc(bytes + 4);
    size_t m1 = 0, m2 = 0;
    int rc = embkv_get_batch_device(s, ids, n, (void *)d, stream, &m1);
    if (rc != EMBKV_OK)
        fprintf(stderr, "gather: %s\n", embkv_errmsg());
    CK(cuStreamSynchronize(stream));
    CK(cuMemcpyDtoH(got, d, bytes ? bytes : 4));
    bool ok = rc == EMBKV_OK && embkv_get_batch(s, ids, n, want, NULL, &m2) == EMBKV_OK && m1 == m2 &&
              memcmp(got, want, bytes) == 0;
    if (!ok)
        for (size_t i = 0; i < n; i++)
            if (memcmp(got + i * dim, want + i * dim, 4 * (size_t)dim) != 0) {
                fprintf(stderr, "row %zu (id %lld): %g vs %g\n", i, (long long)ids[i], got[i * dim], want[i * dim]);
                break;
            }
    CK(cuMemFree(d));
    free(got);
    free(want);
    return ok;
}

static void test_tiers(const char *root, int dtype)
{
    const int dim = 48;
    char dir[700];
    snprintf(dir, sizeof dir, "%s/tiers-%d", root, dtype);
    size_t n = 150000;
    embkv_options o = {.dim = dim, .dtype = (uint32_t)dtype, .expected_rows = n, .pool_size = 24u << 20,
                       .ssd_size = 512u << 20, .cache_size = 2u << 20};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    float v[64];
    for (size_t id = 0; id < n; id++) {
        row_of((int64_t)id, 1, v, dim);
        if (embkv_put(s, (int64_t)id, v, NULL, 0) != EMBKV_OK) {
            fprintf(stderr, "put: %s\n", embkv_errmsg());
            break;
        }
    }
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
    int64_t *ids = malloc(n * sizeof *ids);
    int *tier = malloc(n * sizeof *tier);
    uint8_t *found = malloc(n);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int64_t)i;
    CHECK_RC(embkv_locate_batch_at(s, NULL, ids, n, tier, found), EMBKV_OK);
    int64_t pick[5000];
    size_t np = 0, ns = 0, nm = 0;
    for (size_t i = 0; i < n && np < 3000; i++) {
        if (tier[i] == EMBKV_TIER_SSD && ns < 1000)
            pick[np++] = ids[i], ns++;
        else if (tier[i] == EMBKV_TIER_PM && nm < 2000)
            pick[np++] = ids[i], nm++;
    }
    embkv_moves mv;
    CHECK_RC(embkv_hotset_move(s, pick + ns, nm / 2, &mv), EMBKV_OK);
    for (int i = 0; i < 500; i++)
        pick[np++] = pick[(i * 7919) % 3000];
    for (int i = 0; i < 100; i++)
        pick[np++] = (int64_t)n + 17 + i;
    CHECK(gather_equals_cpu(s, pick, np, dim));
    CHECK(gather_equals_cpu(s, pick + 7, 1, dim));
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.gpu_registered == 1);
    if (st.gpu_registered != 1)
        fprintf(stderr, "pool not registered: %s\n", st.gpu_note);
    CHECK(st.gpu_rows_direct > 500 && st.gpu_rows_staged > 500);
    printf("dtype %d: %llu rows read from the pool by the GPU, %llu staged\n", dtype,
           (unsigned long long)st.gpu_rows_direct, (unsigned long long)st.gpu_rows_staged);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free(ids);
    free(tier);
    free(found);
}

/* ------------------------------------------------------------ E: decoding */

static uint64_t rng = 88172645463325252ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}
static float uniform(void) { return (float)(next_rand() >> 40) / (float)(1 << 24); } /* [0, 1) */

/* A value over the dtype's range: every binade of it, either sign. */
static float wide_value(int dtype)
{
    float m = 1.0f + uniform(), x;
    int e = dtype == EMBKV_F16 ? -26 + (int)(next_rand() % 41)        /* f16: subnormals to 2^14 */
                               : -140 + (int)(next_rand() % 266);     /* f32, bf16: subnormals to 2^125 */
    x = ldexpf(m, e);
    return next_rand() & 1 ? -x : x;
}

static void random_row(int dtype, int kind, float *v, int dim)
{
    if (dtype != EMBKV_I8) {
        for (int j = 0; j < dim; j++)
            v[j] = wide_value(dtype);
        return;
    }
    /* i8: a row's range is what matters: ordinary, tiny, or near float32's
     * own (the kernel's double path) */
    float lo, span;
    if (kind == 0)
        lo = -100.0f * uniform(), span = 200.0f * uniform() + 1e-3f;
    else if (kind == 1)
        lo = ldexpf(uniform(), -130), span = ldexpf(1.0f + uniform(), -135);
    else
        lo = -FLT_MAX * uniform(), span = FLT_MAX;
    for (int j = 0; j < dim; j++)
        v[j] = fminf(lo + span * uniform(), FLT_MAX);
    if (kind == 2)
        v[next_rand() % (unsigned)dim] = FLT_MAX;  /* (a scale rounded up then reaches past it: clamped) */
}

static bool device_rows(embkv_store *s, const int64_t *ids, size_t n, int dim, float *got)
{
    size_t bytes = n * (size_t)dim * 4, missing = 0;
    CUdeviceptr d;
    CK(cuMemAlloc(&d, bytes));
    CK(cuMemsetD8Async(d, 0x5a, bytes, stream));
    int rc = embkv_get_batch_device(s, ids, n, (void *)d, stream, &missing);
    if (rc != EMBKV_OK)
        fprintf(stderr, "gather: %s\n", embkv_errmsg());
    CK(cuStreamSynchronize(stream));
    CK(cuMemcpyDtoH(got, d, bytes));
    CK(cuMemFree(d));
    return rc == EMBKV_OK;
}

static void test_decode(const char *root, int dtype)
{
    enum { DDIM = 100, DN = 900 };
    char dir[700];
    snprintf(dir, sizeof dir, "%s/decode-%d", root, dtype);
    embkv_options o = {.dim = DDIM, .dtype = (uint32_t)dtype, .expected_rows = DN};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    float v[DDIM];
    for (int64_t id = 0; id < DN; id++) {
        random_row(dtype, (int)(id % 3), v, DDIM);
        if (embkv_put(s, id, v, NULL, 0) != EMBKV_OK) {
            fprintf(stderr, "put %lld: %s\n", (long long)id, embkv_errmsg());
            CHECK(false);
            break;
        }
    }
    int64_t ids[DN + 64];
    size_t n = 0;
    for (int64_t id = 0; id < DN; id++)
        ids[n++] = (id * 337) % DN;
    for (int i = 0; i < 32; i++)
        ids[n++] = (int64_t)(next_rand() % DN);  /* repeats */
    for (int i = 0; i < 32; i++)
        ids[n++] = DN + 5 + i;                   /* missing: zeros */
    CHECK(gather_equals_cpu(s, ids, n, DDIM));
    CHECK_RC(embkv_gpu_sync(s), EMBKV_OK);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    if (st.gpu_registered != 1) {
        /* (staged rows are checked by the CPU, in the call: the kernel's
         * checks below need the pool read in place; test_tiers fails on it) */
        printf("decode, dtype %d: the pool is not registered (%s): damage checks skipped\n", dtype, st.gpu_note);
        CHECK_RC(embkv_close(s), EMBKV_OK);
        return;
    }

    /* Damaged in place: ids 11 (a value) and 13 (the header's id). */
    unsigned char *r11 = embkv_debug_record(s, 11), *r13 = embkv_debug_record(s, 13);
    CHECK(r11 != NULL && r13 != NULL);
    if (!r11 || !r13) {
        embkv_close(s);
        return;
    }
    /* (the record: its header, then the vector as the dtype keeps it) */
    size_t rbytes = 32 + (dtype == EMBKV_F32 ? 4 * DDIM : dtype == EMBKV_I8 ? 8 + DDIM : 2 * DDIM);
    unsigned char keep11[32 + 4 * DDIM], keep13[8];
    memcpy(keep11, r11, rbytes);
    memcpy(keep13, r13, sizeof keep13);
    r13[1] ^= 0x01;  /* the header's id: 13 + 256 */
    uint16_t inf16 = dtype == EMBKV_BF16 ? 0x7f80 : 0xfc00;  /* an infinity in the lane of element 33 or 40 */
    float nan = NAN;
    if (dtype == EMBKV_F16)
        memcpy(r11 + 32 + 2 * 40, &inf16, 2);
    else if (dtype == EMBKV_BF16)
        memcpy(r11 + 32 + 2 * 33, &inf16, 2);
    else if (dtype == EMBKV_I8)
        memcpy(r11 + 32, &nan, 4);          /* the scale */
    else
        r11[0] ^= 0x40;                      /* f32 decodes anything: the header's id */
    int64_t b[5] = {10, 11, 12, 13, 14}, good[3] = {10, 12, 14};
    float got[5 * DDIM], want[3 * DDIM], zero[DDIM] = {0};
    CHECK(device_rows(s, b, 5, DDIM, got));
    CHECK_RC(embkv_get_batch(s, good, 3, want, NULL, NULL), EMBKV_OK);
    CHECK(memcmp(got, want, sizeof v) == 0 && memcmp(got + 2 * DDIM, want + DDIM, sizeof v) == 0 &&
          memcmp(got + 4 * DDIM, want + 2 * DDIM, sizeof v) == 0);
    CHECK(memcmp(got + DDIM, zero, sizeof v) == 0 && memcmp(got + 3 * DDIM, zero, sizeof v) == 0);
    CHECK_RC(embkv_gpu_sync(s), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 11:") != NULL && strstr(embkv_errmsg(), "damaged") != NULL);
    CHECK_RC(embkv_gpu_sync(s), EMBKV_OK);  /* reported once */
    /* Alone, the header's damage is reported too. */
    CHECK(device_rows(s, b + 3, 1, DDIM, got));
    CHECK(memcmp(got, zero, sizeof v) == 0);
    CHECK_RC(embkv_gpu_sync(s), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 13:") != NULL);
    memcpy(r11, keep11, rbytes);
    memcpy(r13, keep13, sizeof keep13);
    CHECK(gather_equals_cpu(s, b, 5, DDIM));
    CHECK_RC(embkv_gpu_sync(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------------------ C: under load */

enum { LN = 200000, LDIM = 32 };
static embkv_store *ls;
static _Atomic int load_stop;
static _Atomic uint32_t gens[LN];

static void *writer(void *arg)
{
    uint64_t r = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    float v[LDIM];
    while (!atomic_load(&load_stop)) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        int64_t id = (int64_t)(r % (LN / 2)) * 2 + (int64_t)(uintptr_t)arg;  /* each writer its own ids */
        uint32_t g = atomic_load(&gens[id]) + 1;
        row_of(id, g, v, LDIM);
        if (embkv_put(ls, id, v, NULL, 0) == EMBKV_OK)
            atomic_store(&gens[id], g);
    }
    return NULL;
}

static void *mover(void *arg)
{
    (void)arg;
    int64_t hot[256];
    for (int k = 0; !atomic_load(&load_stop); k++) {
        (void)embkv_sync(ls);
        for (int i = 0; i < 256; i++)
            hot[i] = (int64_t)((k * 256 + i) * 7919 % LN);
        embkv_moves mv;
        (void)embkv_hotset_move(ls, hot, 256, &mv);
        usleep(20000);
    }
    return NULL;
}

static void test_load(const char *root)
{
    char dir[700];
    snprintf(dir, sizeof dir, "%s/load", root);
    embkv_options o = {.dim = LDIM, .expected_rows = LN, .pool_size = 24u << 20, .ssd_size = 1u << 30,
                       .cache_size = 4u << 20};
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &ls), EMBKV_OK);
    float v[LDIM];
    for (int64_t id = 0; id < LN; id++) {
        row_of(id, 1, v, LDIM);
        CHECK_RC(embkv_put(ls, id, v, NULL, 0), EMBKV_OK);
        atomic_store(&gens[id], 1);
    }
    /* Zipf(0.99) over the ids */
    double *cdf = malloc(LN * sizeof *cdf), sum = 0;
    for (int i = 0; i < LN; i++)
        cdf[i] = (sum += 1.0 / pow(i + 1, 0.99));
    enum { B = 4096, FLIGHT = 4 };
    CUdeviceptr d[FLIGHT];
    CUevent done[FLIGHT];  /* each batch's own end: the later ones stay in flight */
    int64_t *ids[FLIGHT];
    float *host = malloc((size_t)B * LDIM * 4);
    for (int k = 0; k < FLIGHT; k++) {
        CK(cuMemAlloc(&d[k], (size_t)B * LDIM * 4));
        CK(cuEventCreate(&done[k], 0));
        ids[k] = malloc(B * sizeof **ids);
    }
    pthread_t th[3];
    pthread_create(&th[0], NULL, writer, (void *)0);
    pthread_create(&th[1], NULL, writer, (void *)1);
    pthread_create(&th[2], NULL, mover, NULL);
    uint64_t r = 42, bad = 0, rows = 0;
    int batches = short_run ? 40 : 3000;
    for (int b = 0; b < batches; b++) {
        int k = b % FLIGHT;
        if (b >= FLIGHT) {
            /* the batch launched FLIGHT ago, waited for alone */
            CK(cuEventSynchronize(done[k]));
            CK(cuMemcpyDtoH(host, d[k], (size_t)B * LDIM * 4));
            for (int i = 0; i < B; i++) {
                const float *row = host + (size_t)i * LDIM;
                uint32_t g = (uint32_t)row[0];
                float want[LDIM];
                row_of(ids[k][i], g, want, LDIM);
                bad += g == 0 || memcmp(row, want, sizeof want) != 0;
            }
            rows += B;
        }
        for (int i = 0; i < B; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            double u = (double)(r >> 11) / 9007199254740992.0 * sum;
            int lo = 0, hi = LN - 1;
            while (lo < hi) {
                int mid = (lo + hi) / 2;
                if (cdf[mid] < u)
                    lo = mid + 1;
                else
                    hi = mid;
            }
            ids[k][i] = (int64_t)(((uint64_t)lo * 2654435761u) % LN);
        }
        int rc = embkv_get_batch_device(ls, ids[k], B, (void *)d[k], stream, NULL);
        if (rc != EMBKV_OK) {
            fprintf(stderr, "batch %d: %s\n", b, embkv_errmsg());
            bad++;
            break;
        }
        CK(cuEventRecord(done[k], stream));
    }
    atomic_store(&load_stop, 1);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    CK(cuStreamSynchronize(stream));
    embkv_stats st;
    CHECK_RC(embkv_stats_get(ls, &st), EMBKV_OK);
    printf("under load: %llu rows checked, %llu wrong; %llu gathers, %llu from the pool, %llu staged, %llu demotions, "
           "%llu compactions, %llu syncs\n", (unsigned long long)rows, (unsigned long long)bad,
           (unsigned long long)st.gpu_gathers, (unsigned long long)st.gpu_rows_direct,
           (unsigned long long)st.gpu_rows_staged, (unsigned long long)st.demotions,
           (unsigned long long)st.compactions, (unsigned long long)st.syncs);
    CHECK(bad == 0 && rows > 0);
    CHECK_RC(embkv_gpu_sync(ls), EMBKV_OK);
    CHECK_RC(embkv_check(ls), EMBKV_OK);
    CHECK_RC(embkv_close(ls), EMBKV_OK);
    for (int k = 0; k < FLIGHT; k++) {
        CK(cuMemFree(d[k]));
        CK(cuEventDestroy(done[k]));
        free(ids[k]);
    }
    free(host);
    free(cdf);
}

/* ------------------------------------------------------------ D: pushes */

static embkv_store *train_store(const char *root, const char *name, int optimizer)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.optimizer = optimizer;
    t.lr = 0.05;
    t.eps = 1e-8;
    t.init = EMBKV_INIT_NORMAL;
    t.init_a = 0;
    t.init_b = 0.1;
    t.seed = 3;
    enum { D = 64 };
    embkv_options o = {.dim = D, .expected_rows = 10000, .state_floats = embkv_train_state_floats(&t, D)};
    char dir[700];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    return s;
}

static void test_push(const char *root)
{
    enum { D = 64, N = 2048 };
    const int opts[2] = {EMBKV_ADAGRAD, EMBKV_ADAM};
    for (int k = 0; k < 2; k++) {
        embkv_store *a = train_store(root, k ? "adam-cpu" : "ada-cpu", opts[k]);
        embkv_store *b = train_store(root, k ? "adam-dev" : "ada-dev", opts[k]);
        embkv_session *qa, *qb;
        CHECK_RC(embkv_session_open(a, &qa), EMBKV_OK);
        CHECK_RC(embkv_session_open(b, &qb), EMBKV_OK);
        int64_t *ids = malloc(N * sizeof *ids);
        float *g = malloc((size_t)N * D * 4), *pa = malloc((size_t)N * D * 4), *pb = malloc((size_t)N * D * 4);
        CUdeviceptr dg, dp;
        CK(cuMemAlloc(&dg, (size_t)N * D * 4));
        CK(cuMemAlloc(&dp, (size_t)N * D * 4));
        uint64_t r = 99;
        bool same = true;
        for (int step = 0; step < (short_run ? 3 : 40); step++) {
            for (int i = 0; i < N; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                ids[i] = (int64_t)((r >> 33) % 3000);
                for (int j = 0; j < D; j++)
                    g[(size_t)i * D + j] = (float)(((r >> (j % 40)) & 0xffff) / 65536.0 - 0.5);
            }
            CHECK_RC(embkv_pull(qa, ids, N, pa), EMBKV_OK);
            CHECK_RC(embkv_pull_device(qb, ids, N, (void *)dp, stream, 0), EMBKV_OK);
            CK(cuStreamSynchronize(stream));
            CK(cuMemcpyDtoH(pb, dp, (size_t)N * D * 4));
            same &= memcmp(pa, pb, (size_t)N * D * 4) == 0;
            CK(cuMemcpyHtoDAsync(dg, g, (size_t)N * D * 4, stream));
            size_t ua = 0, ub = 0;
            CHECK_RC(embkv_push(qa, ids, N, g, 0, &ua), EMBKV_OK);
            CHECK_RC(embkv_push_device(qb, ids, N, (void *)dg, stream, 0, &ub), EMBKV_OK);
            same &= ua == ub;
        }
        CHECK(same);
        size_t differ = 0;
        for (int64_t id = 0; id < 3000; id++) {
            float va[D], vb[D], sa[2 * D + 1], sb[2 * D + 1];
            embkv_rowinfo ia, ib;
            int ra = embkv_get(a, id, va, sa, &ia), rb = embkv_get(b, id, vb, sb, &ib);
            differ += ra != rb || (ra == EMBKV_OK && (memcmp(va, vb, sizeof va) != 0 || ia.clock != ib.clock ||
                                                       memcmp(sa, sb, 4 * (size_t)(k ? 2 * D + 1 : D)) != 0));
        }
        printf("push from device gradients, %s: %zu rows differ from the CPU push\n", k ? "adam" : "adagrad", differ);
        CHECK(differ == 0);
        CK(cuMemFree(dg));
        CK(cuMemFree(dp));
        free(ids), free(g), free(pa), free(pb);
        embkv_session_close(qa);
        embkv_session_close(qb);
        CHECK_RC(embkv_close(a), EMBKV_OK);
        CHECK_RC(embkv_close(b), EMBKV_OK);
    }
}

int main(int argc, char **argv)
{
    short_run = argc > 1 && strcmp(argv[1], "--short") == 0;
    setvbuf(stdout, NULL, _IOLBF, 0);  /* (a timeout's kill keeps what was printed) */
    char why[512];
    CHECK_RC(embkv_gpu_status(why, sizeof why), EMBKV_OK);
    if (check_failed) {
        fprintf(stderr, "no usable GPU: %s\n", why);
        return test_summary("test_gpu_real");
    }
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    const char *root = getenv("EMBKV_GPU_DIR") ? getenv("EMBKV_GPU_DIR") : "/dev/shm";
    char base[600];
    snprintf(base, sizeof base, "%s/embkv-gpu-XXXXXX", root);
    if (!mkdtemp(base)) {
        perror("mkdtemp");
        return 2;
    }
    for (int dtype = EMBKV_F32; dtype <= EMBKV_I8; dtype++)
        test_decode(base, dtype);
    test_tiers(base, EMBKV_F32);
    if (!short_run) {
        test_tiers(base, EMBKV_F16);
        test_tiers(base, EMBKV_BF16);
        test_tiers(base, EMBKV_I8);
    }
    test_load(base);
    test_push(base);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", base);
    return test_summary("test_gpu_real");
}
