/*
 * fuzz_store.c - libFuzzer target: a store whose files come from fuzzed
 * bytes, opened and used through the engine's C API (embkv.h).
 *
 * Each input is a flags byte and patches (common.c) to a fresh copy of a
 * small valid store: its pool, its SSD log's segments, its app- files.
 * The copy is opened with embkv_open; if that succeeds it is checked, every
 * row is read by every read path (scan, point gets, batch gets as of a
 * snapshot, locate, look-ahead), some rows are written and deleted as the
 * flags say, and it is closed.  The contract under test: every call returns
 * an embkv_rc (any of them: a damaged store may refuse anything), nothing
 * crashes, nothing trips ASan/UBSan, nothing hangs (libFuzzer's -timeout),
 * and a read that checks records returns the row's own vector (each row of
 * the template was written once, and its records carry checksums, so
 * damage must show as an error, never as another vector).  embkv_get_batch
 * is the exception by design: the pull path checks a pool record's id, not
 * its checksum.
 */
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    F_WRITE = 1,      /* put a new row, overwrite and delete template rows */
    F_SYNC = 2,       /* embkv_sync before the close */
    F_CACHE = 4,      /* open with a DRAM cache */
    F_TRAIN = 8,      /* pull and push through a training session */
    F_HOT = 16,       /* embkv_hotset_move and embkv_lookahead */
    F_SNAPSHOT = 32,  /* reads through a snapshot left open across writes */
    F_REOPEN = 64,    /* close and open again after the work */
};

static const int64_t *ids;
static size_t nids;
/* Rows this target rewrote in the current input (their vectors changed). */
static int64_t modified[16];
static int nmod;

static void mark_modified(int64_t id)
{
    if (nmod < 16)
        modified[nmod++] = id;
}

static int is_modified(int64_t id)
{
    for (int i = 0; i < nmod; i++)
        if (modified[i] == id)
            return 1;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    /* libpmemobj hangs on some damage: the engine's probe gives up after
     * this many seconds (its clean error), well inside libFuzzer's -timeout. */
    setenv("EMBKV_PROBE_TIMEOUT", "2", 1);
    fz_template_init("store");
    ids = fz_template_ids(&nids);
    return 0;
}

typedef struct scan_ctx {
    size_t rows;
} scan_ctx;

static int scan_cb(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)state;
    (void)info;
    /* The scan hands out rows whose checks passed; an id never written,
     * or another vector, is wrong data. */
    if (vec && !fz_vec_is(id, vec) && !is_modified(id))
        fz_fail("scan returned a wrong vector for id %lld", (long long)id);
    ((scan_ctx *)ctx)->rows++;
    return 0;
}

static void check_vec(int64_t id, const float *got, const char *how)
{
    if (is_modified(id))
        return;
    if (!fz_vec_is(id, got))
        fz_fail("%s returned a wrong vector for id %lld", how, (long long)id);
}

static int upd_fn(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    (void)ctx;
    (void)i;
    (void)id;
    (void)state;
    if (vec)
        vec[0] += 1.0f;
    return 0;
}

static void reads(embkv_store *s, unsigned flags)
{
    int rc = embkv_check(s);
    fz_check_rc(rc, "embkv_check");
    scan_ctx sc = {0};
    rc = embkv_scan(s, scan_cb, &sc);
    fz_check_rc(rc, "embkv_scan");
    uint64_t pos = 0;
    int64_t buf[256];
    size_t got = 0;
    for (int k = 0; k < 100000; k++) {
        rc = embkv_scan_ids(s, &pos, buf, 256, &got);
        fz_check_rc(rc, "embkv_scan_ids");
        if (rc != EMBKV_OK || got == 0)
            break;
    }
    /* Every template id, in one batch and a few point reads. */
    float *out = malloc((nids + 2) * FZ_DIM * sizeof *out);
    uint8_t *found = malloc(nids + 2);
    embkv_rowinfo *info = malloc((nids + 2) * sizeof *info);
    int *tier = malloc((nids + 2) * sizeof *tier);
    int64_t *q = malloc((nids + 2) * sizeof *q);
    if (!out || !found || !info || !tier || !q)
        fz_fail("out of memory");
    memcpy(q, ids, nids * sizeof *q);
    q[nids] = -1;
    q[nids + 1] = 424242;
    size_t n = nids + 2, missing = 0;
    embkv_snapshot *snap = NULL;
    if (flags & F_SNAPSHOT) {
        rc = embkv_snapshot_open(s, &snap);
        fz_check_rc(rc, "embkv_snapshot_open");
    }
    rc = embkv_get_batch_at(s, snap, q, n, out, info, found, &missing);
    fz_check_rc(rc, "embkv_get_batch_at");
    if (rc == EMBKV_OK)
        for (size_t i = 0; i < n; i++)
            if (found[i])
                check_vec(q[i], out + i * FZ_DIM, "embkv_get_batch_at");
    /* The pull path: by design it checks a pool record's id, not its
     * checksum (embkv_get_batch in write.c), so a damaged vector may
     * come back from it; only its return code is checked. */
    rc = embkv_get_batch(s, q, n, out, found, &missing);
    fz_check_rc(rc, "embkv_get_batch");
    rc = embkv_locate_batch_at(s, snap, q, n, tier, found);
    fz_check_rc(rc, "embkv_locate_batch_at");
    /* Point reads: the first rows, and every 97th (log rows among them). */
    for (size_t i = 0; i < n; i += i < 48 ? 1 : 97) {
        float v[FZ_DIM], st[FZ_DIM];
        embkv_rowinfo ri;
        rc = embkv_get(s, q[i], v, st, &ri);
        fz_check_rc(rc, "embkv_get");
        if (rc == EMBKV_OK)
            check_vec(q[i], v, "embkv_get");
        fz_check_rc(embkv_exists(s, q[i]) >= 0 ? EMBKV_OK : -1, "embkv_exists");
    }
    uint8_t *fb = malloc(n);
    if (fb) {
        embkv_exists_batch(s, q, n, fb);
        free(fb);
    }
    if (flags & F_HOT) {
        size_t queued = 0, moved = 0;
        fz_check_rc(embkv_lookahead(s, q, n, &queued), "embkv_lookahead");
        rc = embkv_get_batch(s, q, n, out, found, &missing);
        fz_check_rc(rc, "embkv_get_batch after look-ahead");
        embkv_moves mv;
        fz_check_rc(embkv_hotset_move(s, q, n < 300 ? n : 300, &mv), "embkv_hotset_move");
        fz_check_rc(embkv_hotset(s, q, n < 300 ? n : 300, &moved), "embkv_hotset");
        fz_check_rc(embkv_heat_enable(s), "embkv_heat_enable");
        uint32_t hits[64];
        int64_t hot[64];
        size_t nhot = 0;
        fz_check_rc(embkv_heat_get(s, q, n < 64 ? n : 64, hits), "embkv_heat_get");
        fz_check_rc(embkv_hottest(s, 64, hot, hits, &nhot), "embkv_hottest");
    }
    if (flags & F_WRITE) {
        float v[FZ_DIM];
        mark_modified(7);
        fz_vec(-1, v);
        fz_check_rc(embkv_put(s, -1, v, NULL, 0), "embkv_put new");
        fz_vec(7, v);
        v[0] = 1.5f;
        fz_check_rc(embkv_put(s, 7, v, NULL, 0), "embkv_put");
        fz_check_rc(embkv_delete(s, 3), "embkv_delete");
        fz_check_rc(embkv_delete(s, q[n / 2]), "embkv_delete");
        fz_check_rc(embkv_delete(s, q[n - 3]), "embkv_delete");
        int64_t u = 7;
        size_t nu = 0;
        fz_check_rc(embkv_update_batch(s, &u, 1, upd_fn, NULL, 0, &nu), "embkv_update_batch");
        fz_check_rc(embkv_room_for(s, 10, 10), "embkv_room_for");
        fz_check_rc(embkv_grow_index_for(s, 10), "embkv_grow_index_for");
    }
    if (snap) {
        /* Reads as of the snapshot, after the writes. */
        rc = embkv_get_batch_at(s, snap, q, n, out, info, found, &missing);
        fz_check_rc(rc, "embkv_get_batch_at (snapshot)");
        if (rc == EMBKV_OK)
            for (size_t i = 0; i < n; i++)
                if (found[i])
                    check_vec(q[i], out + i * FZ_DIM, "embkv_get_batch_at (snapshot)");
        int64_t *chg = NULL;
        size_t nchg = 0;
        fz_check_rc(embkv_snapshot_changed_ids(snap, &chg, &nchg), "embkv_snapshot_changed_ids");
        free(chg);
        embkv_snapshot_close(snap);
    }
    if (flags & F_TRAIN) {
        embkv_train_options to;
        embkv_train_defaults(&to);
        to.optimizer = EMBKV_ADAGRAD;
        to.lr = 0.05;
        to.wait_ms = 10;
        to.init = EMBKV_INIT_ZEROS;
        rc = embkv_train_configure(s, &to);
        fz_check_rc(rc, "embkv_train_configure");
        embkv_session *ss = NULL;
        if (rc == EMBKV_OK && (rc = embkv_session_open(s, &ss)) == EMBKV_OK) {
            int64_t t[4] = {q[0], q[n - 5], q[n / 3], 555555};
            for (int k = 0; k < 4; k++)
                mark_modified(t[k]);
            float pv[4 * FZ_DIM], g[4 * FZ_DIM];
            for (int k = 0; k < 4 * FZ_DIM; k++)
                g[k] = 0.01f;
            size_t nupd = 0, nrel = 0;
            fz_check_rc(embkv_pull(ss, t, 4, pv), "embkv_pull");
            fz_check_rc(embkv_push(ss, t, 4, g, 0, &nupd), "embkv_push");
            fz_check_rc(embkv_release(ss, t, 4, &nrel), "embkv_release");
            embkv_session_close(ss);
        } else {
            fz_check_rc(rc, "embkv_session_open");
        }
        embkv_train_stats ts;
        fz_check_rc(embkv_train_stats_get(s, &ts), "embkv_train_stats_get");
    }
    embkv_stats st;
    fz_check_rc(embkv_stats_get(s, &st), "embkv_stats_get");
    double mean = 0;
    uint32_t mx = 0;
    fz_check_rc(embkv_probe_stats(s, &mean, &mx), "embkv_probe_stats");
    (void)embkv_count(s);
    if (flags & F_SYNC)
        fz_check_rc(embkv_sync(s), "embkv_sync");
    free(out);
    free(found);
    free(info);
    free(tier);
    free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size, 0};
    nmod = 0;
    unsigned flags = fz_u8(&in);
    if (fz_work_make(&in) != 0) {
        fz_work_clear();
        return -1;
    }
    embkv_options o;
    memset(&o, 0, sizeof o);
    if (flags & F_CACHE)
        o.cache_size = 1u << 20;
    embkv_store *s = NULL;
    int rc = embkv_open(fz_work_store(), &o, 0, &s);
    fz_check_rc(rc, "embkv_open");
    if (rc == EMBKV_OK) {
        reads(s, flags);
        fz_check_rc(embkv_close(s), "embkv_close");
        if (flags & F_REOPEN) {
            rc = embkv_open(fz_work_store(), NULL, 0, &s);
            fz_check_rc(rc, "embkv_open (again)");
            if (rc == EMBKV_OK) {
                reads(s, 0);
                fz_check_rc(embkv_close(s), "embkv_close (again)");
            }
        }
    } else if (s) {
        fz_fail("embkv_open failed (%d) but set the store", rc);
    }
    fz_work_clear();
    return 0;
}
