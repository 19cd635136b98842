/*
 * test_model.c - model-based randomized test of the embkv store engine.
 *
 * Millions of random operations go both to the store and to a plain
 * reference map (the "model"), and every answer of the store is compared
 * exactly with what the model predicts.  Vector contents are derived from
 * (id, version), so the model keeps only a version number per row and still
 * checks every float bit for bit.  The run mixes every point and batch
 * operation, periodic syncs, close+reopen cycles and full scans, and grows the
 * key space far past the initial index size so that the index doubles many
 * times under the model's eye.
 *
 * Kill rounds: the store is closed and a forked child goes on with the same
 * operations, syncing often, until the parent SIGKILLs it at a random
 * moment.  Before each sync the child writes the model as that sync will
 * leave it (aside, then renamed), and after the sync a mark naming it; the
 * reopened store must equal, row for row with clocks and epochs, the model
 * of the last marked sync, or of the next one when the kill came after that
 * sync completed and before its mark.
 *
 * Built twice: test_model (the PM tier only) and test_model_tier (defines
 * MODEL_TIER: rows of 512 floats, a pool whose record space holds about a
 * tenth of them and an SSD tier for the rest, so that most operations cross tiers;
 * look-ahead joins the operations, and the kills land while demotion,
 * promotion, compaction and look-ahead run).
 *
 * test_model_cache (MODEL_CACHE, with MODEL_TIER) adds a DRAM cache about
 * half the pool's size (about 5% of the rows): rows are read and updated
 * in the cache, written back at syncs, snapshots and cleaning, and the
 * kills lose exactly the cache's changes since the last sync.
 *
 * Seed: fixed by default, overridable with EMBKV_TEST_SEED; printed at the
 * start and at the first failure together with the failing operation.
 * Operations: 3,000,000 * EMBKV_TEST_SCALE (test_model_tier: 1,000,000;
 * test_model_cache: 500,000).
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#if defined(MODEL_CACHE)
#define DIM 512
#define NAME "test_model_cache"
#elif defined(MODEL_TIER)
#define DIM 512
#define NAME "test_model_tier"
#else
#define DIM 8
#define NAME "test_model"
#endif
#define SF 2               /* state floats per row */
#define NHOT 64            /* hot ids: updates and deletes hit existing rows */
#define MAX_RAND_IDS 200000

/* ---- deterministic randomness ---------------------------------------- */

static rng_t model_rng;

static double test_scale(void)
{
    const char *e = getenv("EMBKV_TEST_SCALE");
    double s = e && *e ? atof(e) : 1.0;
    return s > 0 ? s : 1.0;
}

/* Vector of version `ver` of row `id`; version 0 is the all-zero vector a
 * row created by embkv_update_batch(EMBKV_UPDATE_CREATE) starts from.  The
 * values are integers below 2^23 scaled by 2^-10: exactly representable, so
 * the store must hand them back bit for bit. */
static void make_vec(int64_t id, uint32_t ver, float *v)
{
    if (ver == 0) { memset(v, 0, DIM * sizeof *v); return; }
    uint64_t h = mix64((uint64_t)id * 0x9E3779B97F4A7C15ull + ver);
    for (int j = 0; j < DIM; j++) {
        h = mix64(h + (uint64_t)j + 1);
        v[j] = (float)((int64_t)(h >> 40) - (1 << 23)) / 1024.0f;
    }
}

static float rnd_state_float(void) { return (float)((int64_t)rnd_below(&model_rng, 2000001) - 1000000) / 8.0f; }

/* ---- the model: open addressing, ids are never removed (present flag) - */

typedef struct ment {
    int64_t id;
    uint8_t used;      /* slot holds this id (present or deleted) */
    uint8_t present;
    uint32_t ver;      /* vector = make_vec(id, ver) */
    uint32_t gen;      /* model sync generation of the last write */
    uint32_t stamp;    /* scan bookkeeping: seen in scan number `stamp` */
    uint64_t clock;
    float st[SF];
} ment;

static ment *mtab;
static size_t mcap, mused, mlive, mpeak;

static void mgrow(void)
{
    ment *old = mtab;
    size_t oldcap = mcap;
    mcap = mcap ? mcap * 2 : 1024;
    mtab = calloc(mcap, sizeof *mtab);
    if (!mtab) { perror("calloc"); exit(2); }
    for (size_t i = 0; i < oldcap; i++) {
        if (!old[i].used) continue;
        size_t j = mix64((uint64_t)old[i].id) & (mcap - 1);
        while (mtab[j].used) j = (j + 1) & (mcap - 1);
        mtab[j] = old[i];
    }
    free(old);
}

static ment *mfind(int64_t id, bool create)
{
    if (create && (mused + 1) * 2 > mcap) mgrow();
    size_t i = mix64((uint64_t)id) & (mcap - 1);
    for (;;) {
        ment *e = &mtab[i];
        if (!e->used) {
            if (!create) return NULL;
            memset(e, 0, sizeof *e);
            e->used = 1;
            e->id = id;
            mused++;
            return e;
        }
        if (e->id == id) return e;
        i = (i + 1) & (mcap - 1);
    }
}

static bool mpresent(int64_t id)
{
    ment *e = mfind(id, false);
    return e && e->present;
}

/* ---- ids -------------------------------------------------------------- */

static int64_t hot[NHOT];
static int64_t *rand_ids;
static size_t nrand;
static uint64_t universe;  /* warm ids: warm_id(0..universe-1); grows */

static int64_t warm_id(uint64_t k)
{
    /* The first 2000 are small ids around 0 (dense, both signs); the rest
     * are scattered over the whole int64 range. */
    if (k < 2000) return (int64_t)k - 1000;
    return (int64_t)mix64(k * 7919 + 13);
}

static int64_t pick_id(void)
{
    uint64_t r = rnd_below(&model_rng, 100);
    if (r < 35) return hot[rnd_below(&model_rng, NHOT)];
    if (r < 92) return warm_id(rnd_below(&model_rng, universe));
    if (r < 97 && nrand) return rand_ids[rnd_below(&model_rng, nrand)];
    /* a fresh random id: half full 64-bit (negative half the time), half
     * 63-bit positive */
    int64_t id = (int64_t)(rnd_below(&model_rng, 2) ? rnd(&model_rng) : rnd(&model_rng) >> 1);
    if (nrand < MAX_RAND_IDS) rand_ids[nrand++] = id;
    return id;
}

/* ---- store state & checking ------------------------------------------ */

static const char *dir;
static embkv_store *S;
static embkv_options opts;
static uint32_t cur_gen;     /* bumped by every sync and clean close */
static uint32_t vcounter;    /* last vector version handed out */

/* What the operation in progress was, for the first-failure report. */
static uint64_t op_index;
static const char *op_name = "setup";
static int64_t op_id;

/* Epoch consistency: rows last written in the same model generation share
 * one epoch, and later generations have larger epochs. */
#define MAX_GENS (1u << 16)
static uint64_t gen_epoch[MAX_GENS];
static uint8_t gen_known[MAX_GENS];

static void check_epoch(uint32_t g, uint64_t epoch)
{
    if (g >= MAX_GENS) return;
    if (gen_known[g]) { CHECK(gen_epoch[g] == epoch); return; }
    gen_known[g] = 1;
    gen_epoch[g] = epoch;
    for (uint32_t p = g; p-- > 0;)
        if (gen_known[p]) { CHECK(gen_epoch[p] < epoch); break; }
    for (uint32_t n = g + 1; n < MAX_GENS; n++)
        if (gen_known[n]) { CHECK(gen_epoch[n] > epoch); break; }
}

/* Compare one row as the store returned it with the model entry. */
static void check_row(const ment *e, const float *vec, const float *st,
                      const embkv_rowinfo *info)
{
    float want[DIM];
    make_vec(e->id, e->ver, want);
    CHECK(memcmp(vec, want, sizeof want) == 0);
    CHECK(st[0] == e->st[0] && st[1] == e->st[1]);
    CHECK(info->clock == e->clock);
    CHECK(info->tier >= EMBKV_TIER_DRAM && info->tier <= EMBKV_TIER_SSD);
    check_epoch(e->gen, info->epoch);
}

static void verify_get(int64_t id)
{
    float vec[DIM], st[SF];
    embkv_rowinfo info;
    memset(vec, 0x7f, sizeof vec);
    ment *e = mfind(id, false);
    int rc = embkv_get(S, id, vec, st, &info);
    if (e && e->present) {
        CHECK_RC(rc, EMBKV_OK);
        if (rc == EMBKV_OK) check_row(e, vec, st, &info);
    } else {
        CHECK_RC(rc, EMBKV_NOTFOUND);
    }
}

static uint32_t scan_stamp;
static size_t scan_visits;

static int scan_cb(void *ctx, int64_t id, const float *vec, const float *state,
                   const embkv_rowinfo *info)
{
    (void)ctx;
    scan_visits++;
    ment *e = mfind(id, false);
    CHECK(e && e->present);
    if (!e || !e->present) return 0;
    CHECK(e->stamp != scan_stamp);  /* each row exactly once */
    e->stamp = scan_stamp;
    check_row(e, vec, state, info);
    return 0;
}

static int stop_after;
static int scan_stop_cb(void *ctx, int64_t id, const float *vec, const float *state,
                        const embkv_rowinfo *info)
{
    (void)ctx; (void)id; (void)vec; (void)state; (void)info;
    return ++scan_visits == (size_t)stop_after ? 7 : 0;
}

/* Every read path over the whole store against the model. */
static void full_verify(void)
{
    CHECK(embkv_count(S) == mlive);
    CHECK_RC(embkv_check(S), EMBKV_OK);

    embkv_stats st;
    CHECK_RC(embkv_stats_get(S, &st), EMBKV_OK);
    CHECK(st.rows == mlive);
    CHECK(st.buckets == embkv_debug_nbuckets(S));
    CHECK(st.slots_per_bucket == 14 && st.bucket_bytes == 256);
    /* the index doubles as soon as rows exceed max_load of its slots */
    CHECK((double)mlive <= 0.9 * (double)st.buckets * 14 + 1);

    /* callback scan: every present row once, with exact contents */
    scan_stamp++;
    scan_visits = 0;
    CHECK_RC(embkv_scan(S, scan_cb, NULL), EMBKV_OK);
    CHECK(scan_visits == mlive);

    /* cursor scan of ids, with the smallest legal and a larger capacity */
    for (int pass = 0; pass < 2; pass++) {
        size_t cap = pass ? 1000 : 64;
        int64_t *ids = malloc(cap * sizeof *ids);
        uint64_t pos = 0;
        size_t total = 0, n;
        scan_stamp++;
        for (;;) {
            n = 0;
            int rc = embkv_scan_ids(S, &pos, ids, cap, &n);
            CHECK_RC(rc, EMBKV_OK);
            if (rc != EMBKV_OK || n == 0) break;
            CHECK(n <= cap);
            for (size_t i = 0; i < n && i < cap; i++) {
                ment *e = mfind(ids[i], false);
                CHECK(e && e->present);
                if (!e) continue;
                CHECK(e->stamp != scan_stamp);
                e->stamp = scan_stamp;
            }
            total += n;
            if (total > mlive + 1000) break;  /* runaway cursor */
        }
        CHECK(total == mlive);
        free(ids);
    }

    /* a scan stopped early returns the callback's value */
    if (mlive >= 5) {
        scan_visits = 0;
        stop_after = 5;
        CHECK_RC(embkv_scan(S, scan_stop_cb, NULL), 7);
        CHECK(scan_visits == 5);
    }

    double mean = 0;
    uint32_t max = 0;
    CHECK_RC(embkv_probe_stats(S, &mean, &max), EMBKV_OK);
    if (mlive) CHECK(mean >= 1.0 && max >= 1 && mean <= max);
}

static void open_store(bool create)
{
    /* Half the reopens pass only dim: zero state_floats means "whatever the
     * store has", so it must not count as a mismatch. */
    embkv_options o = opts;
    if (!create && rnd_below(&model_rng, 2)) { memset(&o, 0, sizeof o); o.dim = DIM; o.cache_size = opts.cache_size; }
    int rc = embkv_open(dir, &o, create ? EMBKV_OPEN_CREATE : 0, &S);
    CHECK_RC(rc, EMBKV_OK);
    if (rc != EMBKV_OK) {
        fprintf(stderr, "cannot open %s, giving up\n", dir);
        exit(test_summary(NAME));
    }
    CHECK(embkv_dim(S) == DIM);
    CHECK(embkv_state_floats(S) == SF);
}

/* ---- operations --------------------------------------------------------- */

static void op_put(void)
{
    int64_t id = pick_id();
    op_id = id;
    unsigned flags = 0;
    uint64_t r = rnd_below(&model_rng, 10);
    if (r < 2) flags = EMBKV_PUT_INSERT;
    else if (r < 4) flags = EMBKV_PUT_UPDATE;
    op_name = flags == EMBKV_PUT_INSERT ? "put(INSERT)" : flags ? "put(UPDATE)" : "put";

    ment *e = mfind(id, false);
    bool present = e && e->present;
    int want = EMBKV_OK;
    if ((flags & EMBKV_PUT_INSERT) && present) want = EMBKV_EXISTS;
    if ((flags & EMBKV_PUT_UPDATE) && !present) want = EMBKV_NOTFOUND;

    float vec[DIM], st[SF];
    bool with_state = rnd_below(&model_rng, 2);
    uint32_t ver = ++vcounter;
    make_vec(id, ver, vec);
    st[0] = rnd_state_float();
    st[1] = rnd_state_float();

    int rc = embkv_put(S, id, vec, with_state ? st : NULL, flags);
    CHECK_RC(rc, want);
    if (rc != EMBKV_OK) {
        verify_get(id);  /* a refused put leaves the row as it was */
        return;
    }
    if (!e) e = mfind(id, true);
    if (present) {
        e->clock++;
    } else {
        e->present = 1;
        e->clock = 0;
        e->st[0] = e->st[1] = 0;  /* NULL state on a new row: zeros */
        if (++mlive > mpeak) mpeak = mlive;
    }
    e->ver = ver;
    if (with_state) { e->st[0] = st[0]; e->st[1] = st[1]; }
    e->gen = cur_gen;
}

static void op_delete(void)
{
    int64_t id = pick_id();
    op_name = "delete";
    op_id = id;
    ment *e = mfind(id, false);
    bool present = e && e->present;
    CHECK_RC(embkv_delete(S, id), present ? EMBKV_OK : EMBKV_NOTFOUND);
    if (present) { e->present = 0; mlive--; }
}

static void op_exists(void)
{
    int64_t id = pick_id();
    op_name = "exists";
    op_id = id;
    CHECK(embkv_exists(S, id) == (mpresent(id) ? 1 : 0));
}

static void op_get_batch(void)
{
    int64_t ids[64];
    float out[64 * DIM];
    uint8_t found[64];
    size_t n = 1 + rnd_below(&model_rng, 64), nmissing = 12345, want_missing = 0;
    op_name = "get_batch";
    for (size_t i = 0; i < n; i++)
        ids[i] = i && rnd_below(&model_rng, 4) == 0 ? ids[rnd_below(&model_rng, i)] : pick_id();  /* duplicates */
    op_id = ids[0];
    memset(out, 0x7f, sizeof out);
    memset(found, 0x55, sizeof found);
    bool pass_found = rnd_below(&model_rng, 4) != 0;  /* found and nmissing may be NULL */
    int rc = embkv_get_batch(S, ids, n, out, pass_found ? found : NULL,
                             pass_found ? &nmissing : NULL);
    CHECK_RC(rc, EMBKV_OK);
    for (size_t i = 0; i < n; i++) {
        ment *e = mfind(ids[i], false);
        float want[DIM];
        make_vec(ids[i], e && e->present ? e->ver : 0, want);
        if (!(e && e->present)) want_missing++;
        if (!(e && e->present)) {
            for (int j = 0; j < DIM; j++) CHECK(out[i * DIM + j] == 0.0f);
        } else {
            CHECK(memcmp(&out[i * DIM], want, sizeof want) == 0);
        }
        if (pass_found) CHECK(found[i] == (e && e->present ? 1 : 0));
    }
    if (pass_found) CHECK(nmissing == want_missing);
    else CHECK(nmissing == 12345);
}

/* embkv_update_batch: the callback checks the private copy it is handed
 * against the model (applying earlier entries of the same batch first, as
 * the batch is applied in order), then changes vector and/or state or skips. */
typedef struct ubctx {
    const int64_t *ids;
    size_t n, next, written;
    bool create;
} ubctx;

static int ub_fn(void *vctx, size_t i, int64_t id, float *vec, float *state)
{
    ubctx *c = vctx;
    CHECK(i == c->next);
    CHECK(i < c->n && id == c->ids[i]);
    c->next = i + 1;
    ment *e = mfind(id, false);
    bool present = e && e->present;
    if (!vec) {
        CHECK(!present && !c->create);
        return 0;
    }
    CHECK(present || c->create);
    float want[DIM];
    make_vec(id, present ? e->ver : 0, want);
    CHECK(memcmp(vec, want, sizeof want) == 0);
    CHECK(state != NULL);
    if (state) {
        CHECK(state[0] == (present ? e->st[0] : 0.0f));
        CHECK(state[1] == (present ? e->st[1] : 0.0f));
    }
    uint64_t r = rnd_below(&model_rng, 8);
    if (r == 0) return 1 + (int)rnd_below(&model_rng, 3);  /* skip: nothing written */

    if (!e) e = mfind(id, true);
    if (present) {
        e->clock++;
    } else {
        e->present = 1;
        e->clock = 0;
        e->ver = 0;
        e->st[0] = e->st[1] = 0;
        if (++mlive > mpeak) mpeak = mlive;
    }
    if (r & 1) { e->ver = ++vcounter; make_vec(id, e->ver, vec); }
    if ((r & 2) && state) {
        state[0] = e->st[0] = rnd_state_float();
        state[1] = e->st[1] = rnd_state_float();
    }
    e->gen = cur_gen;
    c->written++;
    return 0;
}

static void op_update_batch(void)
{
    int64_t ids[16];
    size_t n = 1 + rnd_below(&model_rng, 16), nupdated = 999;
    for (size_t i = 0; i < n; i++)
        ids[i] = i && rnd_below(&model_rng, 5) == 0 ? ids[rnd_below(&model_rng, i)] : pick_id();
    ubctx c = { ids, n, 0, 0, rnd_below(&model_rng, 2) != 0 };
    op_name = c.create ? "update_batch(CREATE)" : "update_batch";
    op_id = ids[0];
    CHECK_RC(embkv_update_batch(S, ids, n, ub_fn, &c, c.create ? EMBKV_UPDATE_CREATE : 0,
                                &nupdated), EMBKV_OK);
    CHECK(c.next == n);  /* fn was called once for every entry */
    CHECK(nupdated == c.written);
    for (size_t i = 0; i < n; i++) verify_get(ids[i]);
}

static void op_hotset(void)
{
    int64_t ids[8];
    size_t n = 1 + rnd_below(&model_rng, 8), moved = 999;
    op_name = "hotset";
    for (size_t i = 0; i < n; i++) {
        /* only present ids: what hotset does with absent ones is unspecified */
        ids[i] = hot[rnd_below(&model_rng, NHOT)];
        for (int t = 0; t < 20 && !mpresent(ids[i]); t++) ids[i] = pick_id();
        if (!mpresent(ids[i])) { n = i; break; }
    }
    if (!n) return;
    op_id = ids[0];
    CHECK_RC(embkv_hotset(S, ids, n, &moved), EMBKV_OK);
    CHECK(moved <= n);
    for (size_t i = 0; i < n; i++) verify_get(ids[i]);
}

static void do_sync(void)
{
    op_name = "sync";
    embkv_stats a, b;
    CHECK_RC(embkv_stats_get(S, &a), EMBKV_OK);
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    cur_gen++;
    CHECK_RC(embkv_stats_get(S, &b), EMBKV_OK);
    CHECK(b.syncs >= a.syncs + 1);
    CHECK(b.durable_epoch >= a.durable_epoch);
}

#ifdef MODEL_CACHE
/* The cache's counters are per open: summed over the run's opens. */
static uint64_t cache_evictions_before;
#endif

static void do_reopen(void)
{
    op_name = "close+reopen";
#ifdef MODEL_CACHE
    {
        embkv_stats cs;
        CHECK_RC(embkv_stats_get(S, &cs), EMBKV_OK);
        cache_evictions_before += cs.cache_evictions;
    }
#endif
    uint64_t nb = embkv_debug_nbuckets(S);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    cur_gen++;  /* a clean close syncs */
    S = NULL;
    open_store(false);
    CHECK(embkv_debug_nbuckets(S) == nb);  /* the index is persistent */
    embkv_stats st;
    CHECK_RC(embkv_stats_get(S, &st), EMBKV_OK);
    CHECK(st.recovered == 0);  /* the close was clean */
    full_verify();
}

/* Look-ahead of a batch, then the batch read (from the stage or the log). */
static void op_lookahead(void)
{
    int64_t ids[64];
    float out[64 * DIM];
    uint8_t found[64];
    size_t n = 1 + rnd_below(&model_rng, 64), queued = 99999;
    op_name = "lookahead";
    for (size_t i = 0; i < n; i++)
        ids[i] = i && rnd_below(&model_rng, 6) == 0 ? ids[rnd_below(&model_rng, i)] : pick_id();
    op_id = ids[0];
    CHECK_RC(embkv_lookahead(S, ids, n, &queued), EMBKV_OK);
    CHECK(queued <= n);
    /* writes between the look-ahead and the read: the stage must not
     * hand back the version it read */
    if (rnd_below(&model_rng, 3) == 0) op_put();
    op_name = "lookahead read";
    CHECK_RC(embkv_get_batch(S, ids, n, out, found, NULL), EMBKV_OK);
    for (size_t i = 0; i < n; i++) {
        ment *e = mfind(ids[i], false);
        bool present = e && e->present;
        CHECK(found[i] == present);
        if (present) {
            float want[DIM];
            make_vec(ids[i], e->ver, want);
            CHECK(memcmp(&out[i * DIM], want, sizeof want) == 0);
        }
    }
}

static void one_op(uint64_t i, uint64_t nops)
{
    op_index = i;
    /* the warm key space grows linearly to 40000 ids over the run */
    universe = 500 + (i < nops ? i : nops) * 40000 / nops;
    uint64_t r = rnd_below(&model_rng, 1000);
    if (r < 380) op_put();
    else if (r < 600) { op_name = "get"; op_id = pick_id(); verify_get(op_id); }
    else if (r < 740) op_delete();
    else if (r < 800) op_exists();
    else if (r < 900) op_get_batch();
    else if (r < 980) op_update_batch();
    else if (r < 985) op_hotset();
    else if (r < 995) op_lookahead();  /* (without a tier: queues nothing) */
    else { op_name = "count"; CHECK(embkv_count(S) == mlive); }
}

/* ---- kill rounds -------------------------------------------------------- */

/* The model as a file: everything a later operation or check reads. */
static bool save_model(const char *path)
{
    char tmp[820];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return false;
    bool ok = fwrite(&mcap, sizeof mcap, 1, f) == 1 && fwrite(&mused, sizeof mused, 1, f) == 1 &&
              fwrite(&mlive, sizeof mlive, 1, f) == 1 && fwrite(&mpeak, sizeof mpeak, 1, f) == 1 &&
              fwrite(&cur_gen, sizeof cur_gen, 1, f) == 1 && fwrite(&vcounter, sizeof vcounter, 1, f) == 1 &&
              fwrite(&nrand, sizeof nrand, 1, f) == 1 &&
              (!nrand || fwrite(rand_ids, sizeof *rand_ids, nrand, f) == nrand) &&
              fwrite(gen_epoch, sizeof gen_epoch, 1, f) == 1 && fwrite(gen_known, sizeof gen_known, 1, f) == 1 &&
              fwrite(mtab, sizeof *mtab, mcap, f) == mcap;
    return fclose(f) == 0 && ok && rename(tmp, path) == 0;
}

static bool load_model(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t cap;
    bool ok = fread(&cap, sizeof cap, 1, f) == 1;
    if (ok) {
        free(mtab);
        mcap = cap;
        mtab = calloc(mcap, sizeof *mtab);
        ok = mtab && fread(&mused, sizeof mused, 1, f) == 1 && fread(&mlive, sizeof mlive, 1, f) == 1 &&
             fread(&mpeak, sizeof mpeak, 1, f) == 1 && fread(&cur_gen, sizeof cur_gen, 1, f) == 1 &&
             fread(&vcounter, sizeof vcounter, 1, f) == 1 && fread(&nrand, sizeof nrand, 1, f) == 1 &&
             nrand <= MAX_RAND_IDS && (!nrand || fread(rand_ids, sizeof *rand_ids, nrand, f) == nrand) &&
             fread(gen_epoch, sizeof gen_epoch, 1, f) == 1 && fread(gen_known, sizeof gen_known, 1, f) == 1 &&
             fread(mtab, sizeof *mtab, mcap, f) == mcap;
    }
    fclose(f);
    return ok;
}

/* How many rows differ between the store and the model, without failing:
 * which of two candidate models the store holds. */
static size_t quiet_mismatch;
static int quiet_cb(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)ctx;
    ment *e = mfind(id, false);
    float want[DIM];
    if (!e || !e->present) { quiet_mismatch++; return 0; }
    make_vec(id, e->ver, want);
    quiet_mismatch += memcmp(vec, want, sizeof want) != 0 || state[0] != e->st[0] || state[1] != e->st[1] ||
                      info->clock != e->clock;
    return 0;
}

static bool store_is_model(void)
{
    quiet_mismatch = 0;
    return embkv_count(S) == mlive && embkv_scan(S, quiet_cb, NULL) == EMBKV_OK && quiet_mismatch == 0;
}

static const char *kill_file(const char *what, long k)
{
    static char path[2][800];
    static int which;
    which ^= 1;
    snprintf(path[which], sizeof path[which], "%s-%s.%ld", dir, what, k);
    return path[which];
}

/* The child: the same operations from op i on, a sync every 1..1000 of
 * them, until it is killed.  Exit 3: a check failed (its message is on
 * stderr). */
static void child_run(uint64_t i, uint64_t nops)
{
    open_store(false);
    for (long k = 1;; k++) {
        uint64_t until = i + 1 + rnd_below(&model_rng, 1000);
        for (; i < until; i++) {
            one_op(i, nops);
            if (check_failed) {
                fprintf(stderr, NAME " child: failure at op %" PRIu64 " (%s id=%" PRId64 ")\n", i, op_name, op_id);
                _exit(3);
            }
        }
        /* the model as sync k leaves it, then the sync, then its mark */
        cur_gen++;
        if (!save_model(kill_file("model", k))) _exit(4);
        cur_gen--;
        op_name = "sync";
        do_sync();
        if (check_failed) _exit(3);
        char text[32];
        snprintf(text, sizeof text, "%ld", k);
        write_mark(kill_file("mark", 0), text);
        if (k > 1) unlink(kill_file("model", k - 1));
    }
}

static void kill_round(uint64_t i, uint64_t nops, int round)
{
    op_name = "kill round";
#ifdef MODEL_CACHE
    {
        embkv_stats cs;
        CHECK_RC(embkv_stats_get(S, &cs), EMBKV_OK);
        cache_evictions_before += cs.cache_evictions;
    }
#endif
    CHECK_RC(embkv_close(S), EMBKV_OK);
    S = NULL;
    cur_gen++;
    unlink(kill_file("mark", 0));
    CHECK(save_model(kill_file("model", 0)));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) child_run(i, nops);
    CHECK(pid > 0);
    /* 0.1 .. 1.5 s: the child has opened the store and is syncing */
    usleep((useconds_t)(100000 + rnd_below(&model_rng, 1400000)));
    kill(pid, SIGKILL);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (!WIFSIGNALED(status)) fprintf(stderr, NAME ": kill round %d: the child exited with %d\n", round,
                                      WIFEXITED(status) ? WEXITSTATUS(status) : -1);

    long k = 0;
    FILE *f = fopen(kill_file("mark", 0), "r");
    if (f) {
        CHECK(fscanf(f, "%ld", &k) == 1 && k > 0);
        fclose(f);
    }
    open_store(false);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(S, &st), EMBKV_OK);
    if (k > 0) CHECK(st.recovered == 1);  /* (with none, the kill may have come before the open) */
    /* The sync after the mark may have completed before the kill. */
    const char *next = kill_file("model", k + 1);
    bool took_next = access(next, F_OK) == 0 && load_model(next) && store_is_model();
    /* (model 0 is the parent's own, as of the close before the fork) */
    if (!took_next) CHECK(load_model(kill_file("model", k)));
    printf(NAME ": kill round %d after %ld syncs%s: %zu rows\n", round, k + took_next,
           took_next ? " (the last one unmarked)" : "", mlive);
    op_name = "verify after kill";
    full_verify();
    for (long j = 0; j <= k + 1; j++) unlink(kill_file("model", j));
}

/* ---- main --------------------------------------------------------------- */

int main(void)
{
    const char *es = getenv("EMBKV_TEST_SEED");
    uint64_t seed = es && *es ? strtoull(es, NULL, 0) : 20240611;
    double scale = test_scale();
#if defined(MODEL_CACHE)
    /* (at least 250,000: fewer leave too few rows for most to be in the log) */
    uint64_t nops = (uint64_t)(500000 * (scale < 0.5 ? 0.5 : scale));
#elif defined(MODEL_TIER)
    uint64_t nops = (uint64_t)(1000000 * scale);
#else
    uint64_t nops = (uint64_t)(3000000 * scale);
#endif
    int kills = scale < 1 ? 2 : 4;
    printf(NAME ": seed=%" PRIu64 " ops=%" PRIu64 " kill rounds=%d (override with EMBKV_TEST_SEED)\n",
           seed, nops, kills);
    fflush(stdout);
    model_rng.s = seed;
    time_t t0 = time(NULL);

    mgrow();
    rand_ids = malloc(MAX_RAND_IDS * sizeof *rand_ids);
    hot[0] = 0; hot[1] = INT64_MIN; hot[2] = INT64_MAX; hot[3] = -1; hot[4] = 1;
    hot[5] = INT64_MIN + 1; hot[6] = INT64_MAX - 1;
    for (int i = 7; i < NHOT; i++) hot[i] = (int64_t)rnd(&model_rng);

#ifdef MODEL_TIER
    /* The model checks logic across tiers, millions of operations with a
     * sync every thousand: on tmpfs when there is one (unless TMPDIR says
     * otherwise), where a sync costs microseconds instead of a journal
     * commit.  The log on a real disk (O_DIRECT, io_uring) is test_log's
     * and test_tier's. */
    if (access("/dev/shm", W_OK) == 0) setenv("TMPDIR", "/dev/shm", 0);
#endif
    dir = strdup(test_tmpdir("model"));
    memset(&opts, 0, sizeof opts);
    opts.dim = DIM;
    opts.state_floats = SF;
    opts.expected_rows = 200;  /* tiny: the run must double the index many times */
#ifdef MODEL_TIER
    opts.pool_size = 32ull << 20;  /* its record space holds about a tenth of the rows */
    /* About 4x the log's rows (a row of 512 floats takes a 4 KiB block),
     * as docs/tiers.md advises: at 2x, with three of these runs on two cores,
     * compaction fell behind and writes were refused until the next sync
     * (test_tier's test_writers_compact is the test of a log near its
     * limit; this one is of logic across tiers). */
    opts.ssd_size = 1024ull << 20;
#ifdef MODEL_CACHE
    opts.cache_size = 16ull << 20;
#endif
#else
    opts.pool_size = 64ull << 20;
#endif
    open_store(true);
    uint64_t nb0 = embkv_debug_nbuckets(S);
    CHECK(nb0 > 0 && (nb0 & (nb0 - 1)) == 0);  /* a power of two */
    CHECK(embkv_count(S) == 0);
    full_verify();

#ifdef MODEL_TIER
    /* Syncs often enough that the versions a sync still holds (writes and
     * demotions since the last one) never fill the pool. */
    const uint64_t sync_every = 1000;
#else
    const uint64_t sync_every = 20000;
#endif
    uint64_t next_sync = 1 + rnd_below(&model_rng, sync_every);
    uint64_t next_reopen = 100000 + rnd_below(&model_rng, 300000);
    uint64_t next_scan = 50000 + rnd_below(&model_rng, 100000);
    int last_failed = 0, reported = 0, round = 0;
#ifdef MODEL_TIER
    size_t pm_low = SIZE_MAX;
#endif

    for (uint64_t i = 0; i < nops; i++) {
        one_op(i, nops);

        if (i == next_sync) { do_sync(); next_sync = i + 1 + rnd_below(&model_rng, sync_every); }
        if (i == next_reopen) { do_reopen(); next_reopen = i + 100000 + rnd_below(&model_rng, 300000); }
        if (i == next_scan) {
            op_name = "full scan";
            full_verify();
            next_scan = i + 50000 + rnd_below(&model_rng, 100000);
#ifdef MODEL_TIER
            /* The pool as demotion leaves it, not as a lagging thread (a
             * sanitizer build on a busy machine) has it at this instant. */
            if (i > nops / 2)
                embkv_tier_idle(S, 10000);
            embkv_stats st;
            CHECK_RC(embkv_stats_get(S, &st), EMBKV_OK);
            if (i > nops / 2 && st.rows) {
                if (st.rows_pm < pm_low) pm_low = st.rows_pm;
                printf(NAME ": op %" PRIu64 ": %" PRIu64 " rows, %" PRIu64 " in the pool, %" PRIu64 " in the log"
                       " (%" PRIu64 " of %" PRIu64 " MiB live in %" PRIu64 " segments, %" PRIu64 " compactions)\n",
                       i, st.rows, st.rows_pm, st.rows_ssd, st.ssd_live_bytes >> 20, st.ssd_file_bytes >> 20,
                       st.ssd_segments, st.compactions);
            }
#endif
        }
        /* kill rounds spread over the run, the first after the index grew */
        if (round < kills && i == (uint64_t)(round + 1) * nops / (uint64_t)(kills + 1)) kill_round(i, nops, ++round);

        if (check_failed != last_failed) {
            if (!reported++) {
                fprintf(stderr, NAME ": FIRST FAILURE at op %" PRIu64 " (%s id=%" PRId64 "), seed=%" PRIu64 "\n",
                        i, op_name, op_id, seed);
                embkv_stats fs;
                if (S && embkv_stats_get(S, &fs) == EMBKV_OK)
                    fprintf(stderr, NAME ": then %" PRIu64 " rows, %" PRIu64 " in the log, %" PRIu64 " of %" PRIu64
                            " MiB of segments live, %" PRIu64 " segments (%" PRIu64 " damaged), %" PRIu64
                            " compactions, %" PRIu64 " syncs\n",
                            fs.rows, fs.rows_ssd, fs.ssd_live_bytes >> 20, fs.ssd_file_bytes >> 20, fs.ssd_segments,
                            fs.ssd_damaged_segments, fs.compactions, fs.syncs);
            }
            last_failed = check_failed;
            if (check_failed > 50) { fprintf(stderr, "too many failures, stopping\n"); break; }
        }
    }

#ifdef MODEL_TIER
    {
        /* One sample at the end too: a short run may have had no scan in
         * its second half. */
        embkv_tier_idle(S, 10000);
        embkv_stats fin;
        CHECK_RC(embkv_stats_get(S, &fin), EMBKV_OK);
        if (fin.rows && fin.rows_pm < pm_low) pm_low = fin.rows_pm;
    }
#endif
    op_name = "final verify";
    full_verify();
    uint64_t nb = embkv_debug_nbuckets(S);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(S, &st), EMBKV_OK);
    printf(NAME ": rows=%zu peak=%zu buckets %" PRIu64 " -> %" PRIu64 ", pool %" PRIu64 " log %" PRIu64
           ", %" PRIu64 " demotions %" PRIu64 " promotions %" PRIu64 " compactions, %ld s\n",
           mlive, mpeak, nb0, nb, st.rows_pm, st.rows_ssd, st.demotions, st.promotions, st.compactions,
           (long)(time(NULL) - t0));
    /* at least two doublings, and no doubling that the load did not need */
    CHECK(nb >= 4 * nb0);
    if (nb > nb0) CHECK(0.9 * (double)(nb / 2) * 14 <= (double)mpeak);
#ifdef MODEL_TIER
    /* most rows lived in the log in the second half of the run */
#ifdef MODEL_CACHE
    /* (the cache's reserved write-back records take pool room too) */
    CHECK(pm_low != SIZE_MAX && pm_low * 4 < mlive);
#else
    CHECK(pm_low != SIZE_MAX && pm_low * 5 < mlive);
#endif
    CHECK(st.promotions > 0);
#endif
#ifdef MODEL_CACHE
    printf(NAME ": cache %" PRIu64 " of %" PRIu64 " rows, %" PRIu64 " hits %" PRIu64 " misses, %" PRIu64
           " evictions, %" PRIu64 " write-backs\n",
           st.cache_rows, st.cache_capacity_rows, st.cache_hits, st.cache_misses, st.cache_evictions,
           st.cache_writebacks);
    CHECK(st.cache_hits > 0 && st.cache_writebacks > 0);
    CHECK(cache_evictions_before + st.cache_evictions > 0);
#endif
    do_reopen();
    CHECK_RC(embkv_close(S), EMBKV_OK);
    if (check_failed) fprintf(stderr, NAME ": seed=%" PRIu64 "\n", seed);
    free(rand_ids);
    free(mtab);
    free((void *)dir);
    return test_summary(NAME);
}
