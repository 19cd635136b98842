/*
 * test_gpu.c - device gathers and pushes (gather.c) without a GPU.
 *
 * The engine's GPU calls go through gpudrv.h's table; this test puts in
 * its place a "device" whose memory is host memory and whose kernels are
 * run on the CPU when the test says they complete (the model of
 * gpu_kernels.cu: a descriptor per row, a record's id checked, rows
 * decoded as dtype.c decodes them; sums in double in the batch's order).
 * What it shows:
 *  A. With no GPU (the driver's table, on a machine without one): every
 *     device call fails with EMBKV_NODEVICE and a reason, and a failed
 *     device pull holds no permit.  (Skipped where a GPU is usable.)
 *  B. A gather gives the CPU path's bytes, for rows in the DRAM cache, the
 *     pool and the SSD log, missing ids (zeros) and repeats, for f32, f16
 *     and i8 tables, with the pool registered (its rows read in place) and
 *     with registration failing (every row staged); the stats count both.
 *  C. Protection: while a gather is not complete, its rows are rewritten
 *     many times, synced and their records' room reused; when it completes
 *     it copies the versions of the call, not the new ones (G1).  A close
 *     waits for it.  Eight gathers in flight, then a ninth waits for the
 *     oldest.
 *  D. A row the kernel finds damaged is reported by the next call, naming
 *     the id (EMBKV_CORRUPT); a stream's failure likewise.
 *  C2. Two threads gather while two rewrite rows and one checkpoints,
 *     the device completing at moments of its own: every row whole (also
 *     under TSan).
 *  C3. Twelve device pushes of new rows at once (more than the store's
 *     leases; the index grows under them) beside a device reader: none
 *     waits for another for good.
 *  E. Pushes from device gradients equal embkv_push bit for bit (adagrad
 *     and adam, repeated ids); a NaN changes nothing; pull_device takes
 *     permits (staleness 0: a second pull of an id times out), creates
 *     rows, and gives a refused id (admission) its initial values.
 *  F. The pool's registration, slow with a large pool, holds up neither
 *     other gathers (theirs are staged meanwhile) nor writes, checkpoints
 *     or the stats.
 */
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <unistd.h>

#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"
#include "gpudrv.h"

#define DIM 16

bool dtype_decode(int dtype, uint32_t dim, const void *src, float *dst);

/* ------------------------------------------------------------ the fake device */

enum { OP_GATHER, OP_SUM };
typedef struct op {
    int kind;
    gpu_gather_args g;
    gpu_sum_args s;
} op;

static pthread_mutex_t fk_mu = PTHREAD_MUTEX_INITIALIZER;
static op fk_ops[4096];
static size_t fk_nops, fk_done;     /* ops queued, ops run */
static bool fk_auto = true;         /* run each op at its launch */
static bool fk_register_fails;
static bool fk_force_bad;           /* the next gather run reports row 0 damaged */
static bool fk_stream_fails;        /* the next event fails */
static bool fk_record_fails;        /* the next event cannot be recorded */
static bool fk_sync_fails;          /* nor the stream waited for */
static size_t fk_registered, fk_unregistered, fk_allocs, fk_frees;

static void run_gather(const gpu_gather_args *a)
{
    const uint64_t *desc = (const uint64_t *)(uintptr_t)a->desc;
    const int64_t *ids = (const int64_t *)(uintptr_t)a->ids;
    float *out = (float *)(uintptr_t)a->out;
    uint32_t *bad = (uint32_t *)(uintptr_t)a->bad;
    for (uint32_t i = 0; i < a->n; i++) {
        uint64_t d = desc[i];
        float *o = out + (size_t)i * a->dim;
        const char *src = (const char *)(uintptr_t)(d & ~GPU_ROW_FLAGS);
        bool ok = src != NULL;
        if (ok && (d & GPU_ROW_RECORD))
            ok = *(const int64_t *)(src - 32) == ids[i];
        static const int dt[] = {EMBKV_F32, EMBKV_F16, EMBKV_BF16, EMBKV_I8};
        if (ok)
            ok = dtype_decode(dt[d & GPU_ROW_KIND], a->dim, src, o);
        if (fk_force_bad && i == 0) {
            ok = false;
            fk_force_bad = false;
        }
        if (!ok) {
            memset(o, 0, 4 * (size_t)a->dim);
            if (src && i < *bad)
                *bad = i;
        }
    }
}

static void run_sum(const gpu_sum_args *a)
{
    const float *g = (const float *)(uintptr_t)a->grads;
    const uint32_t *occ = (const uint32_t *)(uintptr_t)a->occ, *start = (const uint32_t *)(uintptr_t)a->start;
    const uint32_t *slot = (const uint32_t *)(uintptr_t)a->slot;
    float *once = (float *)(uintptr_t)a->once;
    double *sums = (double *)(uintptr_t)a->sums;
    for (uint32_t u = 0; u < a->nu; u++)
        for (uint32_t j = 0; j < a->dim; j++) {
            uint32_t b = start[u], e = start[u + 1];
            if (e - b == 1) {
                once[(size_t)slot[u] * a->dim + j] = g[(size_t)occ[b] * a->dim + j];
                continue;
            }
            double s = 0.0 + (double)g[(size_t)occ[b] * a->dim + j];
            for (uint32_t k = b + 1; k < e; k++)
                s += (double)g[(size_t)occ[k] * a->dim + j];
            sums[(size_t)slot[u] * a->dim + j] = s;
        }
}

/* Under fk_mu: the ops up to (not including) index upto run. */
static void run_upto(size_t upto)
{
    for (; fk_done < upto; fk_done++) {
        op *o = &fk_ops[fk_done % 4096];
        if (o->kind == OP_GATHER)
            run_gather(&o->g);
        else
            run_sum(&o->s);
    }
}

static void fake_complete_all(void)
{
    pthread_mutex_lock(&fk_mu);
    run_upto(fk_nops);
    pthread_mutex_unlock(&fk_mu);
}

static int fk_open(char *why, size_t cap) { (void)why; (void)cap; return EMBKV_OK; }
/* An address below 64 KiB is no device memory (as a driver says of a
 * host pointer). */
static int fk_enter(uint64_t p, char *why, size_t cap)
{
    if (p < 65536) {
        snprintf(why, cap, "address 0x%llx is not memory CUDA knows (the test's)", (unsigned long long)p);
        return EMBKV_INVALID;
    }
    return EMBKV_OK;
}
static void fk_leave(void) {}
/* F: 1 holds the next registration (as a driver pinning a large mapping
 * takes a while), 2 while it is held, 0 lets it go. */
static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static int hold_state;

static int fk_host_register(void *p, size_t n, uint64_t *dev, char *why, size_t cap)
{
    (void)n;
    pthread_mutex_lock(&hold_mu);
    if (hold_state == 1) {
        hold_state = 2;
        pthread_cond_broadcast(&hold_cv);
        while (hold_state == 2)
            pthread_cond_wait(&hold_cv, &hold_mu);
    }
    pthread_mutex_unlock(&hold_mu);
    if (fk_register_fails) {
        snprintf(why, cap, "cuMemHostRegister: operation not supported (the test's)");
        return EMBKV_NODEVICE;
    }
    fk_registered++;
    *dev = (uint64_t)(uintptr_t)p;
    return EMBKV_OK;
}
static void fk_host_unregister(void *p) { (void)p; fk_unregistered++; }
static int fk_host_alloc(size_t n, void **p, uint64_t *dev, char *why, size_t cap)
{
    (void)why;
    (void)cap;
    *p = aligned_alloc(64, (n + 63) & ~(size_t)63);
    if (!*p)
        return EMBKV_NOMEM;
    fk_allocs++;
    *dev = (uint64_t)(uintptr_t)*p;
    return EMBKV_OK;
}
static void fk_host_free(void *p) { free(p); fk_frees++; }
static int fk_queue(const op *o)
{
    pthread_mutex_lock(&fk_mu);
    if (fk_nops - fk_done == 4096) {
        pthread_mutex_unlock(&fk_mu);
        return EMBKV_NOMEM;
    }
    fk_ops[fk_nops++ % 4096] = *o;
    if (fk_auto)
        run_upto(fk_nops);
    pthread_mutex_unlock(&fk_mu);
    return EMBKV_OK;
}
static int fk_gather(void *stream, const gpu_gather_args *a, char *why, size_t cap)
{
    (void)stream, (void)why, (void)cap;
    return fk_queue(&(op){.kind = OP_GATHER, .g = *a});
}
static int fk_grad_sum(void *stream, const gpu_sum_args *a, char *why, size_t cap)
{
    (void)stream, (void)why, (void)cap;
    return fk_queue(&(op){.kind = OP_SUM, .s = *a});
}
typedef struct fk_event {
    size_t upto;
    bool fails;
} fk_event;
static int fk_event_record(void *stream, void **ev, char *why, size_t cap)
{
    (void)stream;
    if (fk_record_fails) {
        fk_record_fails = false;
        snprintf(why, cap, "cuEventRecord: the test's failure");
        return EMBKV_NODEVICE;
    }
    fk_event *e = malloc(sizeof *e);
    if (!e)
        return EMBKV_NOMEM;
    pthread_mutex_lock(&fk_mu);
    e->upto = fk_nops;
    e->fails = fk_stream_fails;
    fk_stream_fails = false;
    pthread_mutex_unlock(&fk_mu);
    *ev = e;
    return EMBKV_OK;
}
static int fk_event_done(void *ev)
{
    fk_event *e = ev;
    pthread_mutex_lock(&fk_mu);
    int d = fk_done >= e->upto;
    pthread_mutex_unlock(&fk_mu);
    return d ? (e->fails ? -1 : 1) : 0;
}
static int fk_event_wait(void *ev)
{
    fk_event *e = ev;
    pthread_mutex_lock(&fk_mu);
    run_upto(e->upto);
    pthread_mutex_unlock(&fk_mu);
    return e->fails ? -1 : 0;
}
static void fk_event_free(void *ev) { free(ev); }
static int fk_stream_wait(void *stream)
{
    (void)stream;
    if (fk_sync_fails)
        return -1;
    fake_complete_all();
    return 0;
}

static const gpu_backend fake = {
    .open = fk_open, .enter = fk_enter, .leave = fk_leave, .host_register = fk_host_register,
    .host_unregister = fk_host_unregister, .host_alloc = fk_host_alloc, .host_free = fk_host_free,
    .gather = fk_gather, .grad_sum = fk_grad_sum, .event_record = fk_event_record, .event_done = fk_event_done,
    .event_wait = fk_event_wait, .event_free = fk_event_free, .stream_wait = fk_stream_wait,
};

/* ------------------------------------------------------------ helpers */

static float val(int64_t id, int gen, int j) { return (float)((id * 131 + gen * 17 + j * 7) % 1000) / 8.0f - 60.0f; }

static void put_row(embkv_store *s, int64_t id, int gen)
{
    float v[DIM];
    for (int j = 0; j < DIM; j++)
        v[j] = val(id, gen, j);
    int rc = embkv_put(s, id, v, NULL, 0);
    if (rc != EMBKV_OK)
        fprintf(stderr, "put %lld: %s\n", (long long)id, embkv_errmsg());
}

/* A gather of ids into dev (host memory here) equals embkv_get_batch's. */
static bool same_as_cpu(embkv_store *s, const int64_t *ids, size_t n, size_t *missing)
{
    float *dev = malloc(n * DIM * 4), *cpu = malloc(n * DIM * 4);
    memset(dev, 0x5a, n * DIM * 4);
    uint8_t *found = malloc(n);
    size_t m1 = 0, m2 = 0;
    bool ok = embkv_get_batch_device(s, ids, n, dev, NULL, &m1) == EMBKV_OK;
    if (!ok)
        fprintf(stderr, "gather: %s\n", embkv_errmsg());
    fake_complete_all();
    ok = ok && embkv_get_batch(s, ids, n, cpu, found, &m2) == EMBKV_OK && m1 == m2;
    ok = ok && memcmp(dev, cpu, n * DIM * 4) == 0;
    for (size_t i = 0; !ok && i < n; i++)
        if (memcmp(dev + i * DIM, cpu + i * DIM, DIM * 4) != 0) {
            fprintf(stderr, "row %zu (id %lld) differs: %g vs %g (missing %zu vs %zu)\n", i, (long long)ids[i],
                    dev[i * DIM], cpu[i * DIM], m1, m2);
            break;
        }
    if (missing)
        *missing = m1;
    free(dev);
    free(cpu);
    free(found);
    return ok;
}

/* ------------------------------------------------------------ A */

static void test_no_device(void)
{
    gpu_backend_set(NULL);
    char why[512];
    if (embkv_gpu_status(why, sizeof why) == EMBKV_OK) {
        printf("A: a GPU is usable here: the no-device checks are skipped\n");
        return;
    }
    CHECK(strlen(why) > 10);
    CHECK(strstr(embkv_errmsg(), "no usable GPU: ") == embkv_errmsg());
    const char *dir = test_tmpdir("nodev");
    embkv_options o = {.dim = DIM, .expected_rows = 1000};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    t.staleness = 0;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    embkv_session *ss;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    int64_t ids[3] = {1, 2, 1};
    float buf[3 * DIM];
    size_t upd;
    CHECK_RC(embkv_get_batch_device(s, ids, 3, buf, NULL, NULL), EMBKV_NODEVICE);
    CHECK(strstr(embkv_errmsg(), "no usable GPU: ") != NULL);
    CHECK_RC(embkv_get_batch_device(s, ids, 0, NULL, NULL, NULL), EMBKV_OK);  /* none: as a pull of none */
    CHECK_RC(embkv_pull_device(ss, ids, 3, buf, NULL, 0), EMBKV_NODEVICE);
    CHECK(embkv_debug_permits(s, 1) == 0 && embkv_debug_permits(s, 2) == 0);
    CHECK(embkv_exists(s, 1) == 0);  /* nothing created */
    CHECK_RC(embkv_push_device(ss, ids, 3, buf, NULL, 0, &upd), EMBKV_NODEVICE);
    CHECK_RC(embkv_gpu_sync(s), EMBKV_OK);  /* (nothing in flight) */
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.gpu_gathers == 0 && st.gpu_registered == 0);
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------------------ B */

static void test_tiers(int dtype, bool reg_fails)
{
    gpu_backend_set(&fake);
    fk_register_fails = reg_fails;
    char name[64];
    snprintf(name, sizeof name, "tiers-%d-%d", dtype, reg_fails);
    const char *dir = test_tmpdir(name);
    const char *sc = getenv("EMBKV_TEST_SCALE");
    size_t n = sc && atof(sc) > 0 && atof(sc) < 1 ? 100000 : 160000;
    embkv_options o = {.dim = DIM, .dtype = (uint32_t)dtype, .expected_rows = n, .pool_size = 16u << 20,
                       .ssd_size = 256u << 20, .cache_size = 1u << 20};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    for (size_t id = 0; id < n; id++)
        put_row(s, (int64_t)id, 1);
    CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
    /* 300 ids in each tier (the cache's brought there by a move) */
    int64_t *all = malloc(n * sizeof *all);
    int *tier = malloc(n * sizeof *tier);
    uint8_t *found = malloc(n);
    for (size_t i = 0; i < n; i++)
        all[i] = (int64_t)i;
    CHECK_RC(embkv_locate_batch_at(s, NULL, all, n, tier, found), EMBKV_OK);
    int64_t pick[1000];
    size_t np = 0, nssd = 0, npm = 0;
    for (size_t i = 0; i < n && (nssd < 300 || npm < 600); i++) {
        if (tier[i] == EMBKV_TIER_SSD && nssd < 300)
            pick[np++] = all[i], nssd++;
        else if (tier[i] == EMBKV_TIER_PM && npm < 600)
            pick[np++] = all[i], npm++;
    }
    CHECK(nssd == 300 && npm == 600);
    embkv_moves mv;
    CHECK_RC(embkv_hotset_move(s, pick + 300, 300, &mv), EMBKV_OK);
    CHECK_RC(embkv_locate_batch_at(s, NULL, pick, np, tier, found), EMBKV_OK);
    size_t in[3] = {0};
    for (size_t i = 0; i < np; i++)
        in[tier[i]]++;
    CHECK(in[EMBKV_TIER_DRAM] > 100 && in[EMBKV_TIER_PM] > 250 && in[EMBKV_TIER_SSD] > 100);
    if (!(in[EMBKV_TIER_DRAM] > 100 && in[EMBKV_TIER_PM] > 250 && in[EMBKV_TIER_SSD] > 100))
        fprintf(stderr, "dtype %d: %zu in the cache, %zu in the pool, %zu in the log\n", dtype, in[0], in[1], in[2]);
    /* and repeats, and missing ids */
    int64_t ids[1100];
    memcpy(ids, pick, np * sizeof *ids);
    for (int i = 0; i < 50; i++)
        ids[np + i] = pick[(i * 37) % np];
    for (int i = 0; i < 50; i++)
        ids[np + 50 + i] = (int64_t)n + 1000 + i;
    size_t missing = 0;
    CHECK(same_as_cpu(s, ids, np + 100, &missing));
    CHECK(missing == 50);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.gpu_gathers == 1);
    CHECK(st.gpu_registered == (reg_fails ? -1 : 1));
    if (reg_fails) {
        CHECK(st.gpu_rows_direct == 0 && st.gpu_rows_staged == np);
        CHECK(strstr(st.gpu_note, "could not be registered: cuMemHostRegister: operation not supported") != NULL);
    } else {
        /* the pool's rows read in place, the others staged (the tier's
         * thread may move a few between the count and the gather) */
        CHECK(st.gpu_rows_direct + st.gpu_rows_staged == np);
        CHECK(st.gpu_rows_direct + 50 >= in[EMBKV_TIER_PM] && st.gpu_rows_staged + 50 >= in[EMBKV_TIER_SSD]);
    }
    CHECK(st.gpu_inflight == 0);
    /* A batch of one, and of none. */
    CHECK(same_as_cpu(s, ids + 400, 1, NULL));
    CHECK_RC(embkv_get_batch_device(s, ids, 0, (void *)8, NULL, NULL), EMBKV_OK);
    size_t regs = fk_registered, unregs = fk_unregistered;
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK(fk_unregistered - unregs == (reg_fails ? 0 : 1) && (reg_fails || regs >= 1));
    CHECK(fk_allocs == fk_frees);
    free(all);
    free(tier);
    free(found);
    fk_register_fails = false;
}

/* An odd dim: staged rows (cached, unregistered) 16-byte aligned all the
 * same, each read as itself. */
static void test_odd_dim(void)
{
    gpu_backend_set(&fake);
    const uint32_t dims[3] = {1, 5, 37};
    for (int k = 0; k < 3; k++) {
        for (int reg = 0; reg < 2; reg++) {
            fk_register_fails = reg == 1;
            char name[32];
            snprintf(name, sizeof name, "odd-%u-%d", dims[k], reg);
            embkv_options o = {.dim = dims[k], .expected_rows = 1000, .cache_size = 1u << 20};
            embkv_store *s;
            CHECK_RC(embkv_open(test_tmpdir(name), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
            float v[64];
            int64_t ids[40];
            for (int64_t id = 0; id < 40; id++) {
                for (uint32_t j = 0; j < dims[k]; j++)
                    v[j] = val(id, 3, (int)j);
                CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
                ids[id] = id;
            }
            embkv_moves mv;
            CHECK_RC(embkv_hotset_move(s, ids, 20, &mv), EMBKV_OK);  /* half of them cached */
            size_t n = 40;
            float *dev = malloc(n * dims[k] * 4), *cpu = malloc(n * dims[k] * 4);
            CHECK_RC(embkv_get_batch_device(s, ids, n, dev, NULL, NULL), EMBKV_OK);
            CHECK_RC(embkv_get_batch(s, ids, n, cpu, NULL, NULL), EMBKV_OK);
            CHECK(memcmp(dev, cpu, n * dims[k] * 4) == 0);
            CHECK_RC(embkv_gpu_sync(s), EMBKV_OK);  /* no false damage */
            free(dev);
            free(cpu);
            CHECK_RC(embkv_close(s), EMBKV_OK);
        }
    }
    fk_register_fails = false;
}

/* ------------------------------------------------------------ C */

static void test_protection(void)
{
    gpu_backend_set(&fake);
    const char *dir = test_tmpdir("protect");
    enum { N = 2000 };
    embkv_options o = {.dim = DIM, .expected_rows = N};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    for (int64_t id = 0; id < N; id++)
        put_row(s, id, 1);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    int64_t ids[256];
    for (int i = 0; i < 256; i++)
        ids[i] = i * 7;
    float want[256 * DIM];
    CHECK_RC(embkv_get_batch(s, ids, 256, want, NULL, NULL), EMBKV_OK);
    /* The gather launched, not completed. */
    fk_auto = false;
    float *dev = malloc(sizeof want);
    memset(dev, 0, sizeof want);
    CHECK_RC(embkv_get_batch_device(s, ids, 256, dev, NULL, NULL), EMBKV_OK);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.gpu_inflight == 1 && st.gpu_rows_direct == 256);
    /* Every row rewritten 20 times, synced after each round (each sync
     * frees the versions the one before replaced, if it may), and new
     * rows written into whatever room was freed. */
    for (int gen = 2; gen < 22; gen++) {
        for (int i = 0; i < 256; i++)
            put_row(s, ids[i], gen);
        for (int64_t id = N + (gen - 2) * 256; id < N + (gen - 1) * 256; id++)
            put_row(s, id, gen);
        CHECK_RC(embkv_sync(s), EMBKV_OK);
    }
    /* Now the copy runs: the versions of the call. */
    fake_complete_all();
    CHECK(memcmp(dev, want, sizeof want) == 0);
    CHECK_RC(embkv_gpu_sync(s), EMBKV_OK);
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.gpu_inflight == 0);

    /* Nine gathers: eight in flight, the ninth waits for (runs) the oldest. */
    float *bufs = calloc(9, sizeof want);
    for (int k = 0; k < 9; k++)
        CHECK_RC(embkv_get_batch_device(s, ids, 256, bufs + (size_t)k * 256 * DIM, NULL, NULL), EMBKV_OK);
    pthread_mutex_lock(&fk_mu);
    size_t done = fk_done, queued = fk_nops;
    pthread_mutex_unlock(&fk_mu);
    CHECK(queued - done == 8);
    float now[256 * DIM];
    CHECK_RC(embkv_get_batch(s, ids, 256, now, NULL, NULL), EMBKV_OK);
    CHECK(memcmp(bufs, now, sizeof now) == 0);  /* the first, run by the ninth's wait */
    /* A close with gathers in flight waits for them: each copied its rows. */
    for (int i = 0; i < 256; i++)
        put_row(s, ids[i], 99);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    for (int k = 1; k < 9; k++)
        CHECK(memcmp(bufs + (size_t)k * 256 * DIM, now, sizeof now) == 0);
    fk_auto = true;
    free(dev);
    free(bufs);
}

/* ------------------------------------------------------------ D */

/* Gathers from two threads while two writers rewrite rows and a third
 * thread checkpoints (reclaiming what the writers retired), with the
 * device completing its work at moments of its own (a completer thread):
 * every gathered row is one whole version (element 0 its generation, the
 * rest a function of id and generation). */
enum { CN = 3000 };
static embkv_store *cs;
static atomic_int cstop;
static atomic_long cwrong, crows;

static void crow(int64_t id, int gen, float *v)
{
    v[0] = (float)gen;
    for (int j = 1; j < DIM; j++)
        v[j] = val(id, gen, j);
}

static void *c_writer(void *arg)
{
    uint64_t r = (uint64_t)(uintptr_t)arg * 7919 + 1;
    float v[DIM];
    for (int gen = 2; !atomic_load(&cstop); gen++)
        for (int k = 0; k < 200 && !atomic_load(&cstop); k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            int64_t id = (int64_t)((r >> 33) % CN);
            crow(id, gen, v);
            (void)embkv_put(cs, id, v, NULL, 0);
        }
    return NULL;
}

static void *c_syncer(void *arg)
{
    (void)arg;
    while (!atomic_load(&cstop)) {
        (void)embkv_sync(cs);
        usleep(2000);
    }
    return NULL;
}

static void *c_completer(void *arg)
{
    (void)arg;
    while (!atomic_load(&cstop)) {
        fake_complete_all();
        usleep(200);
    }
    return NULL;
}

static void *c_gatherer(void *arg)
{
    uint64_t r = (uint64_t)(uintptr_t)arg * 104729 + 3;
    enum { B = 256 };
    int64_t ids[B];
    float *out = malloc(B * DIM * 4);
    for (int round = 0; round < 150; round++) {
        for (int i = 0; i < B; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int64_t)((r >> 33) % CN);
        }
        if (embkv_get_batch_device(cs, ids, B, out, NULL, NULL) != EMBKV_OK) {
            atomic_fetch_add(&cwrong, 1);
            continue;
        }
        (void)embkv_gpu_sync(cs);  /* its copy done (the completer's, or this wait's) */
        for (int i = 0; i < B; i++) {
            float want[DIM];
            crow(ids[i], (int)out[i * DIM], want);
            if (out[i * DIM] < 1 || memcmp(out + i * DIM, want, sizeof want) != 0)
                atomic_fetch_add(&cwrong, 1);
        }
        atomic_fetch_add(&crows, B);
    }
    free(out);
    return NULL;
}

static void test_concurrent(void)
{
    gpu_backend_set(&fake);
    embkv_options o = {.dim = DIM, .expected_rows = CN, .cache_size = 1u << 20};
    CHECK_RC(embkv_open(test_tmpdir("concurrent"), &o, EMBKV_OPEN_CREATE, &cs), EMBKV_OK);
    float v[DIM];
    for (int64_t id = 0; id < CN; id++) {
        crow(id, 1, v);
        CHECK_RC(embkv_put(cs, id, v, NULL, 0), EMBKV_OK);
    }
    fk_auto = false;
    pthread_t w[2], sy, co, g[2];
    pthread_create(&co, NULL, c_completer, NULL);
    pthread_create(&sy, NULL, c_syncer, NULL);
    for (int k = 0; k < 2; k++)
        pthread_create(&w[k], NULL, c_writer, (void *)(uintptr_t)k);
    for (int k = 0; k < 2; k++)
        pthread_create(&g[k], NULL, c_gatherer, (void *)(uintptr_t)k);
    for (int k = 0; k < 2; k++)
        pthread_join(g[k], NULL);
    atomic_store(&cstop, 1);
    for (int k = 0; k < 2; k++)
        pthread_join(w[k], NULL);
    pthread_join(sy, NULL);
    pthread_join(co, NULL);
    fk_auto = true;
    CHECK(atomic_load(&cwrong) == 0);
    CHECK(atomic_load(&crows) == 2 * 150 * 256);
    CHECK_RC(embkv_check(cs), EMBKV_OK);
    CHECK_RC(embkv_close(cs), EMBKV_OK);
}

/* More device pushes at once than a store has leases, their rows new (the
 * index grows under them: a resize waits for every reader's epoch), beside
 * a device reader: all finish (a gather waits for a lease outside its
 * epoch, never inside it). */
static embkv_store *ps;
static atomic_long pushed;

static void *p_pusher(void *arg)
{
    embkv_session *q;
    if (embkv_session_open(ps, &q) != EMBKV_OK)
        return NULL;
    uint64_t r = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 5;
    int64_t ids[200];
    float g[200 * DIM];
    for (int i = 0; i < 200 * DIM; i++)
        g[i] = 0.25f;
    for (int k = 0; k < 25; k++) {
        for (int i = 0; i < 200; i++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int64_t)(r >> 20);
        }
        if (embkv_push_device(q, ids, 200, g, NULL, 0, NULL) == EMBKV_OK)
            atomic_fetch_add(&pushed, 1);
    }
    embkv_session_close(q);
    return NULL;
}

static void *p_reader(void *arg)
{
    (void)arg;
    int64_t ids[200];
    float out[200 * DIM];
    for (int i = 0; i < 200; i++)
        ids[i] = i;
    while (atomic_load(&pushed) < 12 * 25)
        if (embkv_get_batch_device(ps, ids, 200, out, NULL, NULL) != EMBKV_OK)
            break;
    return NULL;
}

static void test_many_pushes(void)
{
    gpu_backend_set(&fake);
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    embkv_options o = {.dim = DIM, .expected_rows = 1000, .pool_size = 64u << 20};
    CHECK_RC(embkv_open(test_tmpdir("pushes"), &o, EMBKV_OPEN_CREATE, &ps), EMBKV_OK);
    CHECK_RC(embkv_train_configure(ps, &t), EMBKV_OK);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(ps, &st), EMBKV_OK);
    uint64_t buckets = st.buckets;
    alarm(120);  /* (a deadlock fails the test instead of hanging it) */
    pthread_t th[13];
    for (int k = 0; k < 12; k++)
        pthread_create(&th[k], NULL, p_pusher, (void *)(uintptr_t)(k + 1));
    pthread_create(&th[12], NULL, p_reader, NULL);
    for (int k = 0; k < 13; k++)
        pthread_join(th[k], NULL);
    alarm(0);
    CHECK(atomic_load(&pushed) == 12 * 25);
    CHECK_RC(embkv_stats_get(ps, &st), EMBKV_OK);
    CHECK(st.buckets > buckets && st.rows == 12 * 25 * 200);  /* the index grew under them */
    CHECK(st.gpu_sums == 12 * 25 && st.gpu_inflight == 0);
    CHECK_RC(embkv_close(ps), EMBKV_OK);
}

static void test_failures(void)
{
    gpu_backend_set(&fake);
    const char *dir = test_tmpdir("fail");
    embkv_options o = {.dim = DIM, .expected_rows = 100};
    embkv_store *s;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    for (int64_t id = 0; id < 10; id++)
        put_row(s, id, 1);
    int64_t ids[2] = {7, 3};
    float dev[2 * DIM];
    fk_force_bad = true;
    CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_OK);
    CHECK(dev[0] == 0 && dev[DIM - 1] == 0);
    CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 7: its record failed its check") != NULL);
    CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_OK);  /* reported once */
    fk_stream_fails = true;
    CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_OK);
    CHECK_RC(embkv_gpu_sync(s), EMBKV_NODEVICE);
    CHECK(strstr(embkv_errmsg(), "failed on the GPU") != NULL);
    CHECK_RC(embkv_gpu_sync(s), EMBKV_OK);
    CHECK_RC(embkv_get_batch_device(s, ids, 2, NULL, NULL, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_get_batch_device(s, ids, 2, (void *)4096, NULL, NULL), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "address 0x1000 is not memory CUDA knows") == embkv_errmsg());
    /* An event that cannot be recorded: the stream is waited for, the
     * lease goes back, the call fails and the next one works. */
    fk_record_fails = true;
    CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_NODEVICE);
    CHECK(strstr(embkv_errmsg(), "cuEventRecord: the test's failure") != NULL);
    for (int k = 0; k < 12; k++)
        CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_OK);
    /* ... and a stream that cannot be waited for either: the store's device
     * calls fail from then on (none hangs), until it is reopened. */
    fk_record_fails = true;
    fk_sync_fails = true;
    CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_NODEVICE);
    CHECK(strstr(embkv_errmsg(), "could not be waited for either") != NULL);
    for (int k = 0; k < 10; k++)
        CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_NODEVICE);
    CHECK(strstr(embkv_errmsg(), "close and reopen the store") != NULL);
    float cpu[2 * DIM];
    CHECK_RC(embkv_get_batch(s, ids, 2, cpu, NULL, NULL), EMBKV_OK);  /* the CPU path is unaffected */
    fk_sync_fails = false;
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_OK);
    CHECK_RC(embkv_get_batch_device(s, ids, 2, dev, NULL, NULL), EMBKV_OK);
    CHECK(memcmp(dev, cpu, sizeof cpu) == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------------------ E */

static embkv_store *train_store(const char *name, int optimizer, uint32_t admit, int64_t staleness)
{
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.optimizer = optimizer;
    t.lr = 0.05;
    t.eps = 1e-8;
    t.init = EMBKV_INIT_UNIFORM;
    t.init_a = -0.5;
    t.init_b = 0.5;
    t.seed = 7;
    t.admit_count = admit;
    t.staleness = staleness;
    t.wait_ms = 50;
    embkv_options o = {.dim = DIM, .expected_rows = 1000, .state_floats = embkv_train_state_floats(&t, DIM)};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir(name), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    return s;
}

static void test_push(void)
{
    gpu_backend_set(&fake);
    const int opts[2] = {EMBKV_ADAGRAD, EMBKV_ADAM};
    for (int k = 0; k < 2; k++) {
        char a[32], b[32];
        snprintf(a, sizeof a, "push-cpu-%d", k);
        snprintf(b, sizeof b, "push-dev-%d", k);
        embkv_store *sc = train_store(a, opts[k], 0, EMBKV_STALENESS_UNLIMITED);
        embkv_store *sd = train_store(b, opts[k], 0, EMBKV_STALENESS_UNLIMITED);
        embkv_session *qc, *qd;
        CHECK_RC(embkv_session_open(sc, &qc), EMBKV_OK);
        CHECK_RC(embkv_session_open(sd, &qd), EMBKV_OK);
        uint64_t r = 12345;
        bool same = true;
        for (int step = 0; step < 30; step++) {
            int64_t ids[64];
            float g[64 * DIM], pc[64 * DIM], pd[64 * DIM];
            for (int i = 0; i < 64; i++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                ids[i] = (int64_t)((r >> 33) % 40);  /* many repeats */
                for (int j = 0; j < DIM; j++)
                    g[i * DIM + j] = (float)((double)((r >> (j + 8)) & 0xffff) / 65536.0 - 0.5) * 0.37f;
            }
            CHECK_RC(embkv_pull(qc, ids, 64, pc), EMBKV_OK);
            CHECK_RC(embkv_pull_device(qd, ids, 64, pd, NULL, 0), EMBKV_OK);
            same &= memcmp(pc, pd, sizeof pc) == 0;
            size_t uc = 0, ud = 0;
            CHECK_RC(embkv_push(qc, ids, 64, g, 0, &uc), EMBKV_OK);
            CHECK_RC(embkv_push_device(qd, ids, 64, g, NULL, 0, &ud), EMBKV_OK);
            same &= uc == ud;
        }
        CHECK(same);
        for (int64_t id = 0; id < 40; id++) {
            float vc[DIM], vd[DIM], stc[2 * DIM + 1], std_[2 * DIM + 1];
            embkv_rowinfo ic, id_;
            CHECK_RC(embkv_get(sc, id, vc, stc, &ic), EMBKV_OK);
            CHECK_RC(embkv_get(sd, id, vd, std_, &id_), EMBKV_OK);
            CHECK(memcmp(vc, vd, sizeof vc) == 0 && ic.clock == id_.clock);
            CHECK(memcmp(stc, std_, 4 * (size_t)(k ? 2 * DIM + 1 : DIM)) == 0);
        }
        /* A NaN anywhere: nothing changes. */
        int64_t ids2[3] = {1, 2, 1};
        float g2[3 * DIM] = {0}, before[DIM], after[DIM];
        g2[2 * DIM + 5] = NAN;
        CHECK_RC(embkv_get(sd, 1, before, NULL, NULL), EMBKV_OK);
        CHECK_RC(embkv_push_device(qd, ids2, 3, g2, NULL, 0, NULL), EMBKV_INVALID);
        CHECK(strstr(embkv_errmsg(), "id 1: gradient element 5 is NaN") != NULL);
        CHECK_RC(embkv_get(sd, 1, after, NULL, NULL), EMBKV_OK);
        CHECK(memcmp(before, after, sizeof before) == 0);
        embkv_stats st;
        CHECK_RC(embkv_stats_get(sd, &st), EMBKV_OK);
        CHECK(st.gpu_sums == 31 && st.gpu_gathers == 30);
        embkv_session_close(qc);
        embkv_session_close(qd);
        CHECK_RC(embkv_close(sc), EMBKV_OK);
        CHECK_RC(embkv_close(sd), EMBKV_OK);
    }

    /* Permits and admission through the device pull. */
    embkv_store *s = train_store("pull-admit", EMBKV_SGD, 3, 0);
    embkv_session *q1, *q2;
    CHECK_RC(embkv_session_open(s, &q1), EMBKV_OK);
    CHECK_RC(embkv_session_open(s, &q2), EMBKV_OK);
    int64_t ids[2] = {5, 6};
    float d1[2 * DIM], c1[2 * DIM];
    CHECK_RC(embkv_pull_device(q1, ids, 2, d1, NULL, 0), EMBKV_OK);
    CHECK(embkv_debug_permits(s, 5) == 1 && embkv_exists(s, 5) == 0);  /* refused: pull 1 of 3 */
    CHECK_RC(embkv_pull_device(q2, ids, 2, d1, NULL, 0), EMBKV_BUSY);  /* staleness 0 */
    CHECK(strstr(embkv_errmsg(), "staleness bound 0 reached") != NULL);
    CHECK_RC(embkv_release(q1, ids, 2, NULL), EMBKV_OK);
    CHECK_RC(embkv_pull(q2, ids, 2, c1), EMBKV_OK);  /* pull 2: still refused, its init values */
    CHECK(memcmp(d1, c1, sizeof c1) == 0 && embkv_exists(s, 5) == 0);
    CHECK_RC(embkv_release(q2, ids, 2, NULL), EMBKV_OK);
    CHECK_RC(embkv_pull_device(q1, ids, 2, d1, NULL, EMBKV_PULL_ONCE), EMBKV_OK);  /* pull 3: stored */
    CHECK(embkv_exists(s, 5) == 1 && embkv_exists(s, 6) == 1);
    CHECK(memcmp(d1, c1, sizeof c1) == 0);  /* the same initial values, now a row */
    CHECK_RC(embkv_pull_device(q1, ids, 2, d1, NULL, EMBKV_PULL_ONCE), EMBKV_OK);  /* held: no wait */
    CHECK(embkv_debug_permits(s, 5) == 1);
    CHECK_RC(embkv_pull_device(q1, ids, 2, d1, NULL, 0x8), EMBKV_INVALID);
    /* A bad address is refused before a row is made or a permit taken. */
    int64_t fresh[2] = {70, 71};
    CHECK_RC(embkv_pull_device(q2, fresh, 2, (void *)4096, NULL, 0), EMBKV_INVALID);
    CHECK(embkv_exists(s, 70) == 0 && embkv_debug_permits(s, 70) == 0);
    embkv_session_close(q1);
    embkv_session_close(q2);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------------------ F */

static embkv_store *rs;
static atomic_int r_first_rc = -100, r_others_done;
static float r_first_out[4 * DIM], r_second_out[4 * DIM];
static embkv_stats r_during;
static int r_rcs[4];

static void *r_first(void *arg)
{
    (void)arg;
    int64_t ids[4] = {0, 1, 2, 3};
    atomic_store(&r_first_rc, embkv_get_batch_device(rs, ids, 4, r_first_out, NULL, NULL));
    return NULL;
}

static void *r_others(void *arg)
{
    (void)arg;
    int64_t ids[4] = {4, 5, 6, 7};
    float v[DIM] = {0.5f};
    r_rcs[0] = embkv_get_batch_device(rs, ids, 4, r_second_out, NULL, NULL);
    r_rcs[1] = embkv_put(rs, 8, v, NULL, 0);
    r_rcs[2] = embkv_sync(rs);
    r_rcs[3] = embkv_stats_get(rs, &r_during);
    atomic_store(&r_others_done, 1);
    return NULL;
}

/* F. While the first gather registers the pool (slow with a large one), a
 * second gather (its pool rows staged), a write, a checkpoint and the
 * stats all finish; then the first reads the pool in place. */
static void test_slow_registration(void)
{
    gpu_backend_set(&fake);
    embkv_options o = {.dim = DIM, .expected_rows = 64};
    CHECK_RC(embkv_open(test_tmpdir("slowreg"), &o, EMBKV_OPEN_CREATE, &rs), EMBKV_OK);
    float v[DIM];
    for (int64_t id = 0; id < 16; id++) {
        crow(id, 1, v);
        CHECK_RC(embkv_put(rs, id, v, NULL, 0), EMBKV_OK);
    }
    pthread_mutex_lock(&hold_mu);
    hold_state = 1;
    pthread_mutex_unlock(&hold_mu);
    pthread_t a, b;
    pthread_create(&a, NULL, r_first, NULL);
    pthread_mutex_lock(&hold_mu);
    while (hold_state != 2)
        pthread_cond_wait(&hold_cv, &hold_mu);
    pthread_mutex_unlock(&hold_mu);
    pthread_create(&b, NULL, r_others, NULL);
    for (int ms = 0; ms < 10000 && !atomic_load(&r_others_done); ms++)
        usleep(1000);
    CHECK(atomic_load(&r_others_done) == 1);  /* not held up by the registration */
    CHECK(atomic_load(&r_first_rc) == -100);  /* which is still held */
    pthread_mutex_lock(&hold_mu);
    hold_state = 0;
    pthread_cond_broadcast(&hold_cv);
    pthread_mutex_unlock(&hold_mu);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    CHECK(r_rcs[0] == EMBKV_OK && r_rcs[1] == EMBKV_OK && r_rcs[2] == EMBKV_OK && r_rcs[3] == EMBKV_OK);
    CHECK(r_during.gpu_registered == 0 && r_during.gpu_rows_direct == 0 && r_during.gpu_rows_staged == 4);
    CHECK(strcmp(r_during.gpu_note, "the pool's mapping is being registered; its rows are staged meanwhile") == 0);
    CHECK_RC(atomic_load(&r_first_rc), EMBKV_OK);
    float want[8 * DIM];
    int64_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    CHECK_RC(embkv_get_batch(rs, ids, 8, want, NULL, NULL), EMBKV_OK);
    CHECK(memcmp(r_first_out, want, sizeof r_first_out) == 0);
    CHECK(memcmp(r_second_out, want + 4 * DIM, sizeof r_second_out) == 0);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(rs, &st), EMBKV_OK);
    CHECK(st.gpu_registered == 1 && st.gpu_rows_direct == 4 && st.gpu_rows_staged == 4);
    CHECK_RC(embkv_close(rs), EMBKV_OK);
}

int main(void)
{
    test_no_device();
    test_tiers(EMBKV_F32, false);
    test_tiers(EMBKV_F32, true);
    test_tiers(EMBKV_F16, false);
    test_tiers(EMBKV_I8, false);
    test_odd_dim();
    test_protection();
    test_concurrent();
    test_many_pushes();
    test_failures();
    test_push();
    test_slow_registration();
    gpu_backend_set(NULL);
    return test_summary("test_gpu");
}
