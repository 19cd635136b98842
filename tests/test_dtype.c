/*
 * test_dtype.c - reduced-precision rows (dtype f16, bf16, i8).
 *
 *  A. The codec: errors within each type's step (f16 2^-11 relative,
 *     bf16 2^-8, i8 half its scale), values beyond f16's and bf16's range
 *     refused, and every decoded row encoded again to the same values (so
 *     that a backup, an export or a cache write-back keeps rows as they
 *     are); i8 keeps a row's least element exactly and its largest to two
 *     float32 steps of the row's largest magnitude.
 *  B. Every read path of a store of each dtype (get, batch get, a
 *     snapshot's rows, scan, kNN) gives the decoded values, with rows in
 *     the pool, the DRAM cache and the SSD log; after a reopen; in a
 *     backup.  Record sizes follow the dtype.
 *  C. Training: sgd and adagrad pushes equal the float32 update rounded
 *     to the dtype (state float32); stochastic rounding is unbiased where
 *     nearest rounding stalls (1,000 updates below a step: mean within
 *     3%); an update beyond f16's range leaves its row and is reported.
 *  D. Errors: a put beyond f16's range, a reopen with another dtype.
 */
#include <math.h>
#include <stdbool.h>

#include "embkv.h"
#include "check.h"

#define DIM 16

/* (ext/engine's codec, which the library exports for its own layers) */
bool dtype_decode(int dtype, uint32_t dim, const void *src, float *dst);
uint32_t dtype_encode(int dtype, uint32_t dim, const float *src, void *dst, const uint64_t *seed);

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static void round_trip(int dt, const float *x, float *y, uint32_t n)
{
    unsigned char enc[4 * 1024 + 16];
    CHECK(dtype_encode(dt, n, x, enc, NULL) == 0);
    dtype_decode(dt, n, enc, y);
}

static void test_codec(void)
{
    const int types[] = {EMBKV_F16, EMBKV_BF16, EMBKV_I8};
    for (int ti = 0; ti < 3; ti++) {
        int dt = types[ti];
        size_t worse = 0, moved = 0, ends = 0;
        for (int row = 0; row < 20000; row++) {
            float x[DIM], y[DIM], z[DIM];
            double sc = pow(10.0, urand() * 6 - 3);
            for (int j = 0; j < DIM; j++) x[j] = (float)((urand() * 2 - 1) * sc);
            round_trip(dt, x, y, DIM);
            float lo = x[0], hi = x[0];
            for (int j = 0; j < DIM; j++) {
                lo = fminf(lo, x[j]);
                hi = fmaxf(hi, x[j]);
            }
            for (int j = 0; j < DIM; j++) {
                double err = fabs((double)y[j] - x[j]);
                double bound = dt == EMBKV_F16    ? fmax(fabs(x[j]) * 0x1p-11, 0x1p-25)
                               : dt == EMBKV_BF16 ? fabs(x[j]) * 0x1p-8
                                                  : (hi - lo) / 255.0 * 0.5 + fabs(x[j]) * 0x1p-22;
                worse += err > bound;
            }
            round_trip(dt, y, z, DIM);
            moved += memcmp(y, z, sizeof y) != 0;
            if (dt == EMBKV_I8) {
                /* (training.md) the least kept exactly, the largest to two
                 * float32 steps of the row's largest magnitude */
                float ylo = y[0], yhi = y[0];
                for (int j = 0; j < DIM; j++) {
                    ylo = fminf(ylo, y[j]);
                    yhi = fmaxf(yhi, y[j]);
                }
                float mag = fmaxf(fabsf(lo), fabsf(hi));
                double step = (double)nextafterf(mag, INFINITY) - mag;
                ends += ylo != lo || fabs((double)yhi - hi) > 2 * step;
            }
        }
        CHECK(ends == 0);
        printf("  A: %s: %zu elements beyond the step, %zu of 20000 rows changed by a second round\n",
               dt == EMBKV_F16 ? "f16" : dt == EMBKV_BF16 ? "bf16" : "i8", worse, moved);
        CHECK(worse == 0);
        CHECK(moved == 0);
    }
    float pub[3] = {0.1f, 65504.0f, -2.5f}, pr[3];
    CHECK(embkv_dtype_round(EMBKV_F16, 3, pub, pr) == 0 && pr[0] == (float)(_Float16)0.1f && pr[1] == 65504.0f);
    float over[2] = {1.0f, 65505.0f};
    CHECK(embkv_dtype_round(EMBKV_F16, 2, over, pr) == 2);
    CHECK(embkv_dtype_max(EMBKV_F16) == 65504.0f && strcmp(embkv_dtype_name(99), "unknown") == 0);
    unsigned char enc[64];
    float big[2] = {1.0f, 70000.0f};
    CHECK(dtype_encode(EMBKV_F16, 2, big, enc, NULL) == 2);
    float huge[2] = {3.4e38f, 1.0f};
    CHECK(dtype_encode(EMBKV_BF16, 2, huge, enc, NULL) == 1);
    CHECK(dtype_encode(EMBKV_I8, 2, huge, enc, NULL) == 0);
    float same[3] = {2.5f, 2.5f, 2.5f}, back[3];
    round_trip(EMBKV_I8, same, back, 3);
    CHECK(memcmp(same, back, sizeof same) == 0);
    /* i8: a range of a few denormals keeps its values (steps of the least) */
    float tiny[4] = {1e-45f, -1e-45f, 0.0f, 1e-45f}, tback[4];
    round_trip(EMBKV_I8, tiny, tback, 4);
    CHECK(memcmp(tiny, tback, sizeof tiny) == 0);
    /* i8, stochastic: elements on a level (the least, the largest, those
     * an update left) stay on it, whatever the random bits */
    size_t moved_edges = 0;
    for (uint64_t seed = 1; seed <= 20000; seed++) {
        float row[4] = {0.0f, 1.0f, 0.5f + (float)(seed % 7) * 1e-3f, 1.0f / 3.0f}, out[4];
        unsigned char e8[16];
        CHECK(dtype_encode(EMBKV_I8, 4, row, e8, &seed) == 0);
        dtype_decode(EMBKV_I8, 4, e8, out);
        moved_edges += out[0] != 0.0f || out[1] != 1.0f;
    }
    CHECK(moved_edges == 0);
    /* encodings no write leaves decode as damaged */
    uint16_t inf16[2] = {0x3c00, 0x7c00}, nan_bf[2] = {0x3f80, 0x7fc1};
    float dec[2];
    CHECK(!dtype_decode(EMBKV_F16, 2, inf16, dec));
    CHECK(!dtype_decode(EMBKV_BF16, 2, nan_bf, dec));
    unsigned char bad8[10] = {0};
    float nanf_ = NAN;
    memcpy(bad8, &nanf_, 4);
    CHECK(!dtype_decode(EMBKV_I8, 2, bad8, dec) && dec[0] == 0 && dec[1] == 0);
    CHECK(dtype_decode(EMBKV_F16, 1, inf16, dec) && dec[0] == 1.0f);
}

typedef struct scan_ctx {
    const float *want;
    size_t n, bad, seen;
} scan_ctx;

static int scan_cb(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)state;
    (void)info;
    scan_ctx *c = ctx;
    c->seen++;
    if (id < 0 || (size_t)id >= c->n || memcmp(vec, c->want + id * DIM, DIM * sizeof(float)) != 0) c->bad++;
    return 0;
}

/* Every read path against want (n rows, ids 0..n-1). */
static void check_reads(embkv_store *s, const float *want, size_t n)
{
    float *out = malloc(n * DIM * sizeof(float));
    int64_t *ids = malloc(n * sizeof *ids);
    for (size_t i = 0; i < n; i++) ids[i] = (int64_t)i;
    size_t bad = 0;
    for (size_t i = 0; i < n; i += 97) {
        float v[DIM];
        CHECK_RC(embkv_get(s, (int64_t)i, v, NULL, NULL), EMBKV_OK);
        bad += memcmp(v, want + i * DIM, sizeof v) != 0;
    }
    CHECK(bad == 0);
    CHECK_RC(embkv_get_batch(s, ids, n, out, NULL, NULL), EMBKV_OK);
    CHECK(memcmp(out, want, n * DIM * sizeof(float)) == 0);
    embkv_snapshot *snap = NULL;
    CHECK_RC(embkv_snapshot_open(s, &snap), EMBKV_OK);
    memset(out, 0, n * DIM * sizeof(float));
    CHECK_RC(embkv_get_rows_at(s, snap, ids, n, out, NULL, NULL, NULL, NULL), EMBKV_OK);
    CHECK(memcmp(out, want, n * DIM * sizeof(float)) == 0);
    embkv_snapshot_close(snap);
    scan_ctx c = {.want = want, .n = n};
    CHECK_RC(embkv_scan(s, scan_cb, &c), EMBKV_OK);
    CHECK(c.seen == n && c.bad == 0);
    /* kNN: a stored row is its own nearest, at 0 */
    for (size_t i = 0; i < n; i += n / 5) {
        int64_t got;
        double d;
        size_t found;
        CHECK_RC(embkv_knn(s, want + i * DIM, 1, 1, NULL, &got, &d, &found), EMBKV_OK);
        CHECK(found == 1 && d == 0);
    }
    free(out);
    free(ids);
}

static void test_store(int dt, const char *name, const embkv_options *extra, size_t n)
{
    const char *dir = test_tmpdir(name);
    char path[700];
    snprintf(path, sizeof path, "%s", dir);
    embkv_options o = *extra;
    o.dim = DIM;
    o.dtype = (uint32_t)dt;
    o.expected_rows = n;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(path, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float *x = malloc(n * DIM * sizeof(float)), *want = malloc(n * DIM * sizeof(float));
    for (size_t i = 0; i < n * DIM; i++) x[i] = (float)(urand() * 4 - 2);
    for (size_t i = 0; i < n; i++) {
        CHECK_RC(embkv_put(s, (int64_t)i, x + i * DIM, NULL, 0), EMBKV_OK);
        round_trip(dt, x + i * DIM, want + i * DIM, DIM);
    }
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    uint32_t vec = dt == EMBKV_I8 ? 8 + DIM : dt == EMBKV_F32 ? 4 * DIM : 2 * DIM;
    CHECK(st.record_bytes == ((32 + vec + 4 * o.state_floats + 63) & ~63u));
    check_reads(s, want, n);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    check_reads(s, want, n);
    /* a backup holds the same rows in the same dtype, and is the same
     * store (its id); a new store has another */
    uint64_t sid = embkv_store_id(s);
    CHECK(sid != 0);
    char bdir[800];
    snprintf(bdir, sizeof bdir, "%s.bak", path);
    embkv_backup *b = NULL;
    CHECK_RC(embkv_backup_begin(s, bdir, &b), EMBKV_OK);
    int done = 0;
    while (b && !done) CHECK_RC(embkv_backup_step(b, 100000, &done), EMBKV_OK);
    if (b) CHECK_RC(embkv_backup_finish(b, NULL), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    embkv_options none = {0};
    CHECK_RC(embkv_open(path, &none, 0, &s), EMBKV_OK);
    if (s) {
        check_reads(s, want, n);
        embkv_options other = {.dtype = dt == EMBKV_F16 ? EMBKV_BF16 : EMBKV_F16};
        embkv_store *s2 = NULL;
        CHECK_RC(embkv_open(path, &other, 0, &s2), EMBKV_INVALID);
        CHECK(strstr(embkv_errmsg(), "has dtype") != NULL);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    CHECK_RC(embkv_open(bdir, &none, 0, &s), EMBKV_OK);
    if (s) {
        check_reads(s, want, n);
        CHECK(embkv_store_id(s) == sid);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    snprintf(bdir, sizeof bdir, "%s.fresh", path);
    CHECK_RC(embkv_open(bdir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_store_id(s) != 0 && embkv_store_id(s) != sid);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    free(x);
    free(want);
}

static embkv_store *train_store(const char *name, int dt, int optimizer, int rounding)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.optimizer = optimizer;
    t.init = EMBKV_INIT_ZEROS;
    t.rounding = rounding;
    t.seed = 5;
    embkv_options o = {.dim = DIM, .dtype = (uint32_t)dt, .expected_rows = 100,
                       .state_floats = embkv_train_state_floats(&t, DIM)};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir(name), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (s) CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    return s;
}

static void test_training(void)
{
    const int types[] = {EMBKV_F16, EMBKV_BF16, EMBKV_I8};
    for (int ti = 0; ti < 3; ti++) {
        int dt = types[ti];
        for (int opt = EMBKV_SGD; opt <= EMBKV_ADAGRAD; opt++) {
            char name[32];
            snprintf(name, sizeof name, "train%d%d", dt, opt);
            embkv_store *s = train_store(name, dt, opt, EMBKV_ROUND_NEAREST);
            if (!s) continue;
            embkv_session *ss = NULL;
            CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
            float w[DIM] = {0}, acc[DIM] = {0}, g[DIM], v[DIM], state[DIM];
            int64_t id = 3;
            size_t bad = 0;
            for (int step = 0; step < 50; step++) {
                for (int j = 0; j < DIM; j++) g[j] = (float)(urand() * 2 - 1);
                CHECK_RC(embkv_pull(ss, &id, 1, v), EMBKV_OK);
                CHECK_RC(embkv_push(ss, &id, 1, g, 0.05, NULL), EMBKV_OK);
                float ref[DIM];
                for (int j = 0; j < DIM; j++) {
                    double gj = 0.0 + g[j];
                    if (opt == EMBKV_ADAGRAD) {
                        double a = (double)acc[j] + gj * gj;
                        acc[j] = (float)a;
                        ref[j] = (float)(w[j] - 0.05 * gj / (sqrt(a) + 1e-10));
                    } else {
                        ref[j] = (float)(w[j] - 0.05 * gj);
                    }
                }
                round_trip(dt, ref, w, DIM);  /* the float32 update, rounded */
                CHECK_RC(embkv_get(s, id, v, opt == EMBKV_ADAGRAD ? state : NULL, NULL), EMBKV_OK);
                bad += memcmp(v, w, sizeof v) != 0;
                if (opt == EMBKV_ADAGRAD) bad += memcmp(state, acc, sizeof state) != 0;
            }
            CHECK(bad == 0);
            embkv_session_close(ss);
            CHECK_RC(embkv_close(s), EMBKV_OK);
        }
    }
    /* stochastic rounding: an update a tenth of a step, thousands of times
     * (i8: a row whose range 0..2 is held by two elements, so that its
     * grid stays) */
    for (int ti = 0; ti < 3; ti++) {
        int dt = types[ti];
        bool i8 = dt == EMBKV_I8;
        int steps = i8 ? 2000 : 4000, first = i8 ? 2 : 0;
        double step = dt == EMBKV_F16 ? 0x1p-10 : dt == EMBKV_BF16 ? 0x1p-7 : 2.0 / 255;
        double mean[2];
        for (int mode = 0; mode < 2; mode++) {
            char name[32];
            snprintf(name, sizeof name, "sr%d%d", dt, mode);
            embkv_store *s = train_store(name, dt, EMBKV_SGD, mode);
            if (!s) continue;
            embkv_session *ss = NULL;
            CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
            float start[DIM], g[DIM], v0[DIM], v[DIM];
            for (int j = 0; j < DIM; j++) start[j] = j < first ? (j == 0 ? 0.0f : 2.0f) : i8 ? 0.2f : 1.0f;
            for (int j = 0; j < DIM; j++) g[j] = j < first ? 0.0f : (float)(-step / 10);
            int64_t id = 1;
            CHECK_RC(embkv_put(s, id, start, NULL, 0), EMBKV_OK);
            CHECK_RC(embkv_get(s, id, v0, NULL, NULL), EMBKV_OK);
            for (int k = 0; k < steps; k++) {
                CHECK_RC(embkv_pull(ss, &id, 1, v), EMBKV_OK);
                CHECK_RC(embkv_push(ss, &id, 1, g, 1.0, NULL), EMBKV_OK);
            }
            CHECK_RC(embkv_get(s, id, v, NULL, NULL), EMBKV_OK);
            double sum = 0;
            for (int j = first; j < DIM; j++) sum += (double)v[j] - v0[j];
            mean[mode] = sum / (DIM - first);
            embkv_session_close(ss);
            CHECK_RC(embkv_close(s), EMBKV_OK);
        }
        double want = steps * step / 10;
        printf("  C: %s: %d updates of a tenth of a step: nearest %+.5f, stochastic %+.5f (exact %+.5f)\n",
               dt == EMBKV_F16 ? "f16" : dt == EMBKV_BF16 ? "bf16" : "i8", steps, mean[0], mean[1], want);
        CHECK(mean[0] == 0);  /* nearest: every update rounds back */
        CHECK(fabs(mean[1] - want) < 0.05 * want);
    }
    /* an update beyond f16's range: the row stays, the push says so */
    embkv_store *s = train_store("range", EMBKV_F16, EMBKV_SGD, EMBKV_ROUND_NEAREST);
    if (s) {
        embkv_session *ss = NULL;
        CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
        int64_t ids[2] = {1, 2};
        float v[2 * DIM], g[2 * DIM];
        for (int j = 0; j < 2 * DIM; j++) g[j] = j < DIM ? -1.0f : -1e-3f;  /* 1: 70000; 2: 70 */
        CHECK_RC(embkv_pull(ss, ids, 2, v), EMBKV_OK);
        size_t upd = 0;
        CHECK_RC(embkv_push(ss, ids, 2, g, 70000, &upd), EMBKV_INVALID);
        CHECK(strstr(embkv_errmsg(), "id 1: the update overflows f16 (lr 70000): 1 row(s) left unchanged, 1 other") != NULL);
        CHECK(upd == 1);
        CHECK_RC(embkv_get(s, 1, v, NULL, NULL), EMBKV_OK);
        CHECK(v[0] == 0);
        CHECK_RC(embkv_get(s, 2, v, NULL, NULL), EMBKV_OK);
        CHECK(fabsf(v[0] - 70.0f) < 0.04f);
        embkv_session_close(ss);
        float big[DIM] = {70000.0f};
        CHECK_RC(embkv_put(s, 9, big, NULL, 0), EMBKV_INVALID);
        CHECK(strstr(embkv_errmsg(), "id 9: element 0 (70000) is beyond f16's range (at most 65504)") != NULL);
        CHECK(!embkv_exists(s, 9));
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.rounding = EMBKV_ROUND_STOCHASTIC;
    embkv_options o = {.dim = DIM, .expected_rows = 100};
    CHECK_RC(embkv_open(test_tmpdir("f32sr"), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (s) {
        CHECK_RC(embkv_train_configure(s, &t), EMBKV_INVALID);
        CHECK(strstr(embkv_errmsg(), "stochastic rounding needs a dtype below float32") != NULL);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
}

int main(void)
{
    test_codec();
    const char *sc = getenv("EMBKV_TEST_SCALE");
    size_t n = sc && atof(sc) > 0 && atof(sc) < 1 ? 2000 : 8000;
    const int types[] = {EMBKV_F32, EMBKV_F16, EMBKV_BF16, EMBKV_I8};
    for (int ti = 0; ti < 4; ti++) {
        char name[32];
        embkv_options plain = {0}, cached = {.cache_size = 1u << 20},
                      logged = {.pool_size = 16u << 20, .ssd_size = 64u << 20, .state_floats = 250};
        snprintf(name, sizeof name, "pool%d", ti);
        test_store(types[ti], name, &plain, n);
        snprintf(name, sizeof name, "cache%d", ti);
        test_store(types[ti], name, &cached, n);
        snprintf(name, sizeof name, "log%d", ti);
        test_store(types[ti], name, &logged, 5 * n);
    }
    test_training();
    return test_summary("test_dtype");
}
