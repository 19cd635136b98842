/*
 * test_powercut.c - a power cut on persistent memory, simulated.
 *
 * A child process runs with tests/powercut/pmemsim.so preloaded: the
 * engine and libpmemobj then take their persistent-memory paths (a flush
 * per write, a fence where order matters, a drain at each sync) on an
 * ordinary file, and the library keeps beside the pool what real
 * persistent memory would hold: the lines drained (app-pmemsim.durable)
 * and the lines flushed but not yet drained (app-pmemsim.pending).  The child works in
 * checkpointed rounds and is killed with SIGKILL at a random moment.  The
 * parent then builds what a power cut at that moment may leave:
 *   - the drained image,
 *   - each flushed-not-drained entry let through or not (half of them,
 *     in order),
 *   - each cache line that was never flushed but differs from the image
 *     written back or not (one in eight: a cache eviction),
 * puts it in place of the pool and opens the store without the library
 * (an ordinary file: recovery reads every row).  It must open, pass
 * embkv_check, and hold exactly the rows of the last checkpoint the child
 * completed (or of the next, if the kill came after its drain and before
 * the child's mark).
 *
 * Rounds, and so the state after checkpoint g, are a function of g alone:
 * round g updates the rows whose hash with g is 0 mod 4, deletes those
 * whose hash is 1 mod 16, inserts M new rows, and writes g into row -1.
 * Each round prints its seed (EMBKV_TEST_SEED repeats a run).
 *
 * A second series kills the child inside an insert, right after a slot's
 * used bit is set (debug.c's crash point), in a table whose deletions
 * leave slots with a former key in them, and checks every state the cut
 * may leave there: 16 of them drawn with even odds for each line that
 * differs and each entry pending (all of them where there are 2^5 or
 * fewer), where the timed series writes a line back once in eight.  A torn
 * insert is one line of one bucket in, the next out, at one moment, which
 * the timed series reaches once in many runs.
 *
 * A third series runs a store with an SSD tier: a pool too small for its
 * rows, so demotion, compaction and the deletion of emptied segments run
 * beside the rounds.  The library then also journals what changes the log's
 * files (tests/powercut/filesim.c), and the cut drops, block by block, what
 * no fdatasync covered and, name by name, what no fsync of the directory
 * covered (tests/powercut/filecut.h).  Rows must come back from both tiers.
 *
 * Only the plain build runs it: a sanitizer's runtime must come first in
 * the library list, ahead of any preload.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"
#include "powercut/pmemsim.h"
#include "powercut/filecut.h"

#define DIM 8
#define PENDING_BYTES (64u << 20)

/* A series: rows before round 1, rows inserted per round, and which rows a
 * round updates (hash % upd == 0) and deletes (hash % del == 1). */
typedef struct {
    int64_t n0, m;
    uint64_t upd, del;
    bool ssd;
    bool torn;  /* killed inside an insert's index write; every state a cut leaves then is checked */
} series;

static const series POOL_ONLY = {.n0 = 2000, .m = 60, .upd = 4, .del = 16};
/* 16 MiB pool, dim 8: about a third of the rows stay in the pool. */
static const series WITH_SSD = {.n0 = 120000, .m = 1000, .upd = 16, .del = 256, .ssd = true};
/* Pool only, more deletions: inserts reuse slots a former key left. */
static const series TORN = {.n0 = 2000, .m = 60, .upd = 4, .del = 8, .torn = true};
#define TORN_ENV "EMBKV_POWERCUT_TORN"
/* What is being checked, for the messages of check_store. */
static char cut_what[96];
static series S;
#define N0 S.n0
#define M S.m

static void make_vec(int64_t id, uint32_t ver, float *v)
{
    for (int k = 0; k < DIM; k++) v[k] = (float)(id % 100000) + 0.5f * (float)ver + 0.125f * (float)k;
}

static uint64_t h2(int64_t id, uint64_t g) { return mix64((uint64_t)id * 0x9E3779B97F4A7C15ull ^ (g * 1000003u)); }

/* The rows after checkpoint g: present[id], ver[id] for ids 0..N0+g*M-1. */
typedef struct { uint8_t *present; uint32_t *ver; int64_t n; } model;

static void model_at(model *m, uint64_t g)
{
    m->n = N0 + (int64_t)g * M;
    m->present = calloc((size_t)m->n, 1);
    m->ver = calloc((size_t)m->n, sizeof *m->ver);
    for (int64_t id = 0; id < N0; id++) m->present[id] = 1;
    for (uint64_t r = 1; r <= g; r++) {
        int64_t live = N0 + (int64_t)(r - 1) * M;
        for (int64_t id = 0; id < live; id++) {
            if (!m->present[id]) continue;
            uint64_t h = h2(id, r);
            if (h % S.upd == 0) m->ver[id]++;
            else if (h % S.del == 1) m->present[id] = 0;
        }
        for (int64_t id = live; id < live + M; id++) m->present[id] = 1;
    }
}

static void model_free(model *m) { free(m->present); free(m->ver); }

/* ------------------------------------------------------------ the child */

static void write_int(const char *path, uint64_t v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%llu\n", (unsigned long long)v);
    write_mark(path, buf);
}

static embkv_options store_options(void)
{
    embkv_options o = {.dim = DIM};
    if (S.ssd) {
        o.pool_size = 16u << 20;
        o.ssd_size = 64u << 20;  /* 4 MiB segments: made and deleted often */
    }
    return o;
}

static int child_main(const char *dir, const char *mark)
{
    embkv_store *s = NULL;
    embkv_options o = store_options();
    if (embkv_open(dir, &o, 0, &s) != EMBKV_OK) {
        fprintf(stderr, "child: open: %s\n", embkv_errmsg());
        return 3;
    }
    embkv_stats st;
    if (embkv_stats_get(s, &st) != EMBKV_OK || !st.is_pmem) {
        fprintf(stderr, "child: the pool is not taken for persistent memory (pmemsim not preloaded?)\n");
        return 4;
    }
    float v[DIM];
    uint64_t g = 0;
    if (embkv_get(s, -1, v, NULL, NULL) == EMBKV_OK) g = (uint64_t)v[0];
    /* The versions as of checkpoint g, kept up to date round by round. */
    model m;
    model_at(&m, g);
    /* The torn series dies in the third round of each child, at the k-th
     * index write of its inserts (debug.c's crash point, taken right
     * after a slot's used bit is set). */
    const char *te = getenv(TORN_ENV);
    long torn = te ? atol(te) : 0;
    for (int lived = 0;; lived++) {
        g++;
        int64_t live = N0 + (int64_t)(g - 1) * M;
        uint8_t *present = realloc(m.present, (size_t)(live + M));
        uint32_t *ver = realloc(m.ver, (size_t)(live + M) * sizeof *ver);
        if (!present || !ver) return 12;
        m.present = present;
        m.ver = ver;
        if (embkv_group_begin(s) != EMBKV_OK) return 5;
        for (int64_t id = 0; id < live; id++) {
            if (!m.present[id]) continue;
            uint64_t h = h2(id, g);
            if (h % S.upd == 0) {
                make_vec(id, ++m.ver[id], v);
                if (embkv_put(s, id, v, NULL, 0) != EMBKV_OK) {
                    fprintf(stderr, "child: put %lld: %s\n", (long long)id, embkv_errmsg());
                    return 7;
                }
            } else if (h % S.del == 1) {
                if (embkv_delete(s, id) != EMBKV_OK) return 8;
                m.present[id] = 0;
            }
        }
        if (torn > 0 && lived == 2) embkv_debug_kill_after_index_writes((uint64_t)torn);
        for (int64_t id = live; id < live + M; id++) {
            make_vec(id, 0, v);
            m.present[id] = 1;
            m.ver[id] = 0;
            if (embkv_put(s, id, v, NULL, 0) != EMBKV_OK) {
                fprintf(stderr, "child: insert %lld: %s\n", (long long)id, embkv_errmsg());
                return 9;
            }
        }
        m.n = live + M;
        float gv[DIM] = {(float)g};
        if (embkv_put(s, -1, gv, NULL, 0) != EMBKV_OK) return 10;
        embkv_group_end(s);
        if (embkv_sync(s) != EMBKV_OK) {
            fprintf(stderr, "child: sync: %s\n", embkv_errmsg());
            return 11;
        }
        write_int(mark, g);
    }
}

/* ------------------------------------------------------------ the parent */

/* The durable image := the pool as it is now; nothing pending. */
static void sim_paths(const char *dir, char *dpath, char *ppath)
{
    snprintf(dpath, PATH_MAX, "%s/%s", dir, PMEMSIM_DURABLE);
    snprintf(ppath, PATH_MAX, "%s/%s", dir, PMEMSIM_PENDING);
}

static void baseline(const char *dir, const char *pool)
{
    char dpath[PATH_MAX], ppath[PATH_MAX];
    sim_paths(dir, dpath, ppath);
    size_t len = 0;
    unsigned char *b = fc_read_file(pool, &len);
    CHECK(b && len > 0 && fc_write_file(dpath, b, len));
    free(b);
    int fd = open(ppath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    CHECK(fd >= 0 && ftruncate(fd, PENDING_BYTES) == 0);
    if (fd >= 0) close(fd);
}

/* What a power cut may leave: the drained image, the lines that differ
 * from it (never flushed, or flushed and not drained), and the flushed,
 * not drained entries in their order. */
typedef struct {
    unsigned char *img, *live, *pend;
    size_t ilen, plen;
    size_t *lines, nlines;  /* offsets of the lines that differ */
    size_t *ents, nents;    /* offsets in the pending data of its entries */
} cut_choices;

static void cut_free(cut_choices *c)
{
    free(c->img);
    free(c->live);
    free(c->pend);
    free(c->lines);
    free(c->ents);
    memset(c, 0, sizeof *c);
}

static bool cut_load(const char *dir, const char *pool, cut_choices *c)
{
    char dpath[PATH_MAX], ppath[PATH_MAX];
    sim_paths(dir, dpath, ppath);
    memset(c, 0, sizeof *c);
    size_t llen = 0;
    c->img = fc_read_file(dpath, &c->ilen);
    c->live = fc_read_file(pool, &llen);
    c->pend = fc_read_file(ppath, &c->plen);
    bool ok = c->img && c->live && c->pend && c->ilen == llen && c->plen >= sizeof(pmemsim_pending);
    CHECK(ok);
    if (!ok) {
        cut_free(c);
        return false;
    }
    size_t cap = 64;
    c->lines = malloc(cap * sizeof *c->lines);
    for (size_t off = 0; c->lines && off + 64 <= c->ilen; off += 64) {
        if (!memcmp(c->img + off, c->live + off, 64)) continue;
        if (c->nlines == cap) {
            size_t *l = realloc(c->lines, (cap *= 2) * sizeof *l);
            if (!l) break;
            c->lines = l;
        }
        c->lines[c->nlines++] = off;
    }
    pmemsim_pending *p = (pmemsim_pending *)c->pend;
    uint64_t at = 0, used = p->used;
    cap = 64;
    c->ents = malloc(cap * sizeof *c->ents);
    while (c->ents && at + sizeof(pmemsim_entry) <= used && sizeof *p + at + sizeof(pmemsim_entry) <= c->plen) {
        pmemsim_entry h;
        memcpy(&h, p->data + at, sizeof h);
        if (sizeof *p + at + sizeof h + h.len > c->plen || h.off + h.len > c->ilen) break;
        if (c->nents == cap) {
            size_t *e = realloc(c->ents, (cap *= 2) * sizeof *e);
            if (!e) break;
            c->ents = e;
        }
        c->ents[c->nents++] = at;
        at += sizeof h + h.len;
    }
    CHECK(c->lines && c->ents);
    return c->lines && c->ents;
}

/* Puts in place of the pool the drained image with differing line k
 * written back (a cache eviction) where pick[k], then pending entry j let
 * through where pick[nlines + j], in order.  img: c->img on entry, and on
 * return again (what was laid over it is taken back). */
static void cut_write(const char *pool, const cut_choices *c, unsigned char *img, const uint8_t *pick,
                      size_t *through, size_t *evicted)
{
    *through = *evicted = 0;
    for (size_t k = 0; k < c->nlines; k++)
        if (pick[k]) {
            memcpy(img + c->lines[k], c->live + c->lines[k], 64);
            (*evicted)++;
        }
    pmemsim_pending *p = (pmemsim_pending *)c->pend;
    for (size_t j = 0; j < c->nents; j++)
        if (pick[c->nlines + j]) {
            pmemsim_entry h;
            memcpy(&h, p->data + c->ents[j], sizeof h);
            memcpy(img + h.off, p->data + c->ents[j] + sizeof h, h.len);
            (*through)++;
        }
    CHECK(fc_write_file(pool, img, c->ilen));
    for (size_t k = 0; k < c->nlines; k++)
        memcpy(img + c->lines[k], c->img + c->lines[k], 64);
    for (size_t j = 0; j < c->nents; j++) {
        pmemsim_entry h;
        memcpy(&h, p->data + c->ents[j], sizeof h);
        memcpy(img + h.off, c->img + h.off, h.len);
    }
}

/* What a power cut now leaves, put in place of the pool: each unflushed
 * line that differs written back one time in eight, each pending entry let
 * through one time in two. */
static void power_cut(const char *dir, const char *pool, rng_t *r, size_t *let_through, size_t *evicted)
{
    cut_choices c;
    *let_through = *evicted = 0;
    if (!cut_load(dir, pool, &c)) return;
    uint8_t *pick = malloc(c.nlines + c.nents + 1);
    CHECK(pick != NULL);
    if (pick) {
        for (size_t k = 0; k < c.nlines; k++) pick[k] = rnd_below(r, 8) == 0;
        for (size_t j = 0; j < c.nents; j++) pick[c.nlines + j] = (uint8_t)rnd_below(r, 2);
        cut_write(pool, &c, c.img, pick, let_through, evicted);
    }
    free(pick);
    cut_free(&c);
}

static uint64_t read_mark(const char *path)
{
    size_t len = 0;
    char *b = (char *)fc_read_file(path, &len);
    if (b) b[len] = 0;
    uint64_t g = b && len ? strtoull(b, NULL, 10) : 0;
    free(b);
    return g;
}

static void check_store(const char *dir, uint64_t done, int round, uint64_t *damaged)
{
    embkv_store *s = NULL;
    embkv_options o = store_options();
    int rc = embkv_open(dir, &o, 0, &s);
    CHECK_RC(rc, EMBKV_OK);
    if (!s) {
        fprintf(stderr, "  round %d%s: the store does not open after the power cut: %s\n", round, cut_what,
                embkv_errmsg());
        exit(1);  /* later rounds would only repeat it */
    }
    CHECK_RC(embkv_check(s), EMBKV_OK);
    float v[DIM];
    uint64_t g = 0;
    if (embkv_get(s, -1, v, NULL, NULL) == EMBKV_OK) g = (uint64_t)v[0];
    CHECK(g == done || g == done + 1);
    model m;
    model_at(&m, g);
    int64_t bad = 0, first_bad = -1;
    uint64_t rows = 0;
    enum { CHUNK = 4096 };
    int64_t ids[CHUNK];
    float *got = malloc(sizeof(float) * DIM * CHUNK);
    uint8_t found[CHUNK];
    for (int64_t at = 0; got && at < m.n + 2 * M; at += CHUNK) {
        size_t n = (size_t)(m.n + 2 * M - at < CHUNK ? m.n + 2 * M - at : CHUNK);
        for (size_t i = 0; i < n; i++) ids[i] = at + (int64_t)i;
        int brc = embkv_get_batch(s, ids, n, got, found, NULL);
        CHECK_RC(brc, EMBKV_OK);
        if (brc != EMBKV_OK) {
            fprintf(stderr, "  round %d: batch get at %lld: %s\n", round, (long long)at, embkv_errmsg());
            bad++;
            continue;
        }
        for (size_t i = 0; i < n; i++) {
            int64_t id = ids[i];
            bool want_row = id < m.n && m.present[id];
            float want[DIM];
            if (want_row) {
                rows++;
                make_vec(id, m.ver[id], want);
            }
            bool ok = want_row ? found[i] && memcmp(got + i * DIM, want, sizeof want) == 0 : !found[i];
            if (!ok && first_bad < 0) first_bad = id;
            bad += !ok;
        }
    }
    free(got);
    CHECK(bad == 0);
    CHECK(embkv_count(s) == rows + (g > 0));
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.rows_pm + st.rows_ssd == rows + (g > 0));
    *damaged = st.ssd_damaged_segments;
    if (bad)
        fprintf(stderr, "  round %d%s: %lld rows differ from checkpoint %llu (the first: id %lld)\n", round,
                cut_what, (long long)bad, (unsigned long long)g, (long long)first_bad);
    model_free(&m);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* Every state a cut now may leave, where they are few (up to 2^5), else 16
 * drawn at random, each line and entry in or out with even odds (a torn
 * insert, its used bit's line in and its slot's out, is one draw in four);
 * each must open to the checkpoint.  *states: how many were checked. */
#define CUT_ALL_MAX 5
#define CUT_DRAWN 16
static void cut_all(const char *dir, const char *pool, uint64_t marked, int round, rng_t *r, size_t *states,
                    size_t *choices)
{
    cut_choices c;
    *states = *choices = 0;
    if (!cut_load(dir, pool, &c)) return;
    /* The store's other files as the kill left them: each state's open
     * rewrites them (recovery clears the dirty map), so each gets them back. */
    static const char *const others[] = {"store.dirty", "READERS"};
    enum { NOTHERS = sizeof others / sizeof others[0] };
    unsigned char *saved[NOTHERS] = {0};
    size_t saved_len[NOTHERS] = {0};
    char opath[NOTHERS][PATH_MAX];
    for (int k = 0; k < NOTHERS; k++) {
        snprintf(opath[k], PATH_MAX, "%s/%s", dir, others[k]);
        saved[k] = fc_read_file(opath[k], &saved_len[k]);
        CHECK(saved[k] != NULL);
    }
    size_t n = c.nlines + c.nents;
    uint64_t count = n <= CUT_ALL_MAX ? 1ull << n : CUT_DRAWN;
    uint8_t *pick = malloc(n + 1);
    unsigned char *img = malloc(c.ilen);
    CHECK(pick && img);
    if (img) memcpy(img, c.img, c.ilen);
    for (uint64_t m = 0; pick && img && m < count; m++) {
        for (size_t k = 0; k < n; k++)
            pick[k] = n <= CUT_ALL_MAX ? (uint8_t)((m >> k) & 1) : (uint8_t)rnd_below(r, 2);
        size_t through, evicted;
        for (int k = 0; k < NOTHERS; k++)
            if (saved[k]) CHECK(fc_write_file(opath[k], saved[k], saved_len[k]));
        cut_write(pool, &c, img, pick, &through, &evicted);
        snprintf(cut_what, sizeof cut_what, " (state %llu of %llu: %zu lines written back, %zu entries through)",
                 (unsigned long long)m, (unsigned long long)count, evicted, through);
        uint64_t damaged = 0;
        check_store(dir, marked, round, &damaged);
        CHECK(damaged == 0);
    }
    cut_what[0] = 0;
    *states = pick ? count : 0;
    *choices = n;
    for (int k = 0; k < NOTHERS; k++) free(saved[k]);
    free(img);
    free(pick);
    cut_free(&c);
}

/* Cuts the power under a child that works in rounds, `rounds` times. */
static void run_series(const series *cfg, const char *name, const char *self, const char *shim, rng_t *r,
                       int rounds, long min_us, long span_us)
{
    S = *cfg;
    char dir[600], pool[700], mark[700], logdir[700], journal[700];
    snprintf(dir, sizeof dir, "%s", test_tmpdir(name));
    snprintf(pool, sizeof pool, "%s/store.pool", dir);
    snprintf(logdir, sizeof logdir, "%s/log", dir);
    snprintf(mark, sizeof mark, "%s.mark", dir);
    snprintf(journal, sizeof journal, "%s.journal", dir);
    {
        /* a small index: inserts double it (pmemobj transactions) */
        embkv_options o = store_options();
        o.expected_rows = S.ssd ? 160000 : 500;
        if (!S.ssd) o.pool_size = 16u << 20;
        embkv_store *s = NULL;
        CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
        float v[DIM];
        for (int64_t id = 0; id < N0 && s; id++) {
            make_vec(id, 0, v);
            CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
        }
        if (s && S.ssd) {
            CHECK_RC(embkv_tier_idle(s, 60000), EMBKV_OK);
            embkv_stats st;
            CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
            printf("  %s: %llu rows in the pool, %llu in the log\n", name, (unsigned long long)st.rows_pm,
                   (unsigned long long)st.rows_ssd);
            CHECK(st.rows_ssd > (uint64_t)N0 / 2);
        }
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    char env_pre[PATH_MAX + 64], env_files[800], env_journal[800], env_kill[64], env_torn[64];
    snprintf(env_pre, sizeof env_pre, "LD_PRELOAD=%s", shim);
    snprintf(env_files, sizeof env_files, "%s=%s", PMEMSIM_FILES_ENV, logdir);
    snprintf(env_journal, sizeof env_journal, "%s=%s", PMEMSIM_JOURNAL_ENV, journal);
    static filecut fc;
    uint64_t done = 0;
    size_t total_through = 0, total_evicted = 0, progressed = 0, timed = 0;
    for (int round = 0; round < rounds; round++) {
        baseline(dir, pool);
        if (S.ssd) CHECK(filecut_begin(&fc, logdir, journal));
        write_int(mark, done);
        long delay = min_us + (long)rnd_below(r, (uint64_t)span_us);
        /* With a log, every other round dies at a write of the log instead
         * (most often between an append and its sync). */
        long at_write = S.ssd && round % 2 ? 1 + (long)rnd_below(r, 16) : 0;
        snprintf(env_kill, sizeof env_kill, "%s=%ld", PMEMSIM_KILL_AT_WRITE_ENV, at_write);
        long torn = S.torn ? 1 + (long)rnd_below(r, (uint64_t)M) : 0;
        snprintf(env_torn, sizeof env_torn, "%s=%ld", TORN_ENV, torn);
        if (at_write || torn) delay = 20000000;  /* a backstop: the library kills it */
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            char *cargv[] = {(char *)self, S.ssd ? "child-ssd" : S.torn ? "child-torn" : "child", dir, mark, NULL};
            char *cenv[] = {env_pre, env_files, env_journal, env_kill, NULL};
            if (S.torn) cenv[1] = env_torn, cenv[2] = NULL;
            else if (!S.ssd) cenv[1] = NULL;
            execve(self, cargv, cenv);
            _exit(99);
        }
        int wst = 0;
        /* With a log, a timed cut comes after the child's first checkpoint
         * (its open alone reads every row, longer on a loaded machine): the
         * cuts land in demotion and compaction, not in the open. */
        for (long waited = 0; S.ssd && !at_write && read_mark(mark) <= done && waited < 60000000; waited += 1000) {
            if (waitpid(pid, &wst, WNOHANG) == pid) break;
            usleep(1000);
        }
        for (long waited = 0; waited < delay; waited += 1000) {
            if (waitpid(pid, &wst, WNOHANG) == pid) break;
            usleep(1000);
        }
        if (waitpid(pid, &wst, WNOHANG) == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &wst, 0);
        }
        if (!(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL)) {
            CHECK(WIFSIGNALED(wst));
            fprintf(stderr, "  round %d: the child ended by itself (status %d)\n", round, wst);
            continue;
        }
        uint64_t marked = read_mark(mark);
        if (S.torn) {
            size_t states = 0, choices = 0;
            cut_all(dir, pool, marked, round, r, &states, &choices);
            embkv_store *s = NULL;
            embkv_options o = store_options();
            float v[DIM];
            if (embkv_open(dir, &o, 0, &s) == EMBKV_OK) {
                done = embkv_get(s, -1, v, NULL, NULL) == EMBKV_OK ? (uint64_t)v[0] : 0;
                embkv_close(s);
            }
            printf("  %s round %d: killed at index write %ld of its inserts, checkpoint %llu; %zu states of "
                   "%zu lines and entries %s open to it\n", name, round, torn, (unsigned long long)marked, states,
                   choices, choices <= CUT_ALL_MAX ? "(every one)" : "(drawn)");
            continue;
        }
        size_t through = 0, evicted = 0;
        power_cut(dir, pool, r, &through, &evicted);
        if (S.ssd) CHECK(filecut_cut(&fc, logdir, journal, r));
        total_through += through;
        total_evicted += evicted;
        uint64_t damaged = 0;
        check_store(dir, marked, round, &damaged);
        /* What a cut leaves of segments made after the checkpoint is removed
         * at the reopen; a segment the checkpoint knows was synced whole. */
        CHECK(damaged == 0);
        embkv_store *s = NULL;
        embkv_options o = store_options();
        float v[DIM];
        uint64_t before = done;
        if (embkv_open(dir, &o, 0, &s) == EMBKV_OK) {
            done = embkv_get(s, -1, v, NULL, NULL) == EMBKV_OK ? (uint64_t)v[0] : 0;
            embkv_close(s);
        }
        progressed += !at_write && done > before;
        timed += !at_write;
        if (at_write)
            printf("  %s round %d: killed at the log's write %ld, checkpoint %llu marked, %llu reopened; "
               "%zu pending entries let through, %zu unflushed lines written back",
               name, round, at_write, (unsigned long long)marked, (unsigned long long)done, through, evicted);
        else
            printf("  %s round %d: killed %ld us after exec, checkpoint %llu marked, %llu reopened; "
                   "%zu pending entries let through, %zu unflushed lines written back",
                   name, round, delay, (unsigned long long)marked, (unsigned long long)done, through, evicted);
        if (S.ssd)
            printf("; log: %zu writes and %zu syncs journaled, of the writes since a sync %zu blocks "
                   "written and %zu lost, %zu new names lost, %zu removals undone, %llu damaged segments",
                   fc.writes, fc.syncs, fc.blocks_kept, fc.blocks_lost, fc.creates_lost, fc.unlinks_undone,
                   (unsigned long long)damaged);
        printf("\n");
        fc.blocks_kept = fc.blocks_lost = fc.creates_lost = fc.unlinks_undone = fc.writes = fc.syncs = 0;
    }
    if (!S.torn)
        printf("%s: %zu pending entries let through, %zu unflushed lines written back in all; "
               "%zu of %zu timed rounds reopened past the last\n",
               name, total_through, total_evicted, progressed, timed);
    /* With a log, every timed cut came after a checkpoint of its round. */
    if (S.ssd) CHECK(progressed == timed);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "child")) {
        S = POOL_ONLY;
        return child_main(argv[2], argv[3]);
    }
    if (argc == 4 && !strcmp(argv[1], "child-torn")) {
        S = TORN;
        return child_main(argv[2], argv[3]);
    }
    if (argc == 4 && !strcmp(argv[1], "child-ssd")) {
        S = WITH_SSD;
        return child_main(argv[2], argv[3]);
    }
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    printf("test_powercut: skipped under a sanitizer (it preloads a library)\n");
    CHECK(1);
    return test_summary("test_powercut");
#endif
    char self[PATH_MAX], shim[PATH_MAX + 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(n > 0);
    if (n <= 0) return test_summary("test_powercut");
    self[n] = 0;
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", self);
    snprintf(shim, sizeof shim, "%s/../../pmemsim.so", dirname(tmp));
    if (access(shim, R_OK) != 0) {
        fprintf(stderr, "test_powercut: %s is missing (make plain-tests builds it)\n", shim);
        return 2;
    }
    const char *es = getenv("EMBKV_TEST_SEED");
    uint64_t seed = es && *es ? strtoull(es, NULL, 0) : (uint64_t)time(NULL);
    const char *sc = getenv("EMBKV_TEST_SCALE");
    double scale = sc && *sc && atof(sc) > 0 ? atof(sc) : 1.0;
    int rounds = (int)(30 * scale), ssd_rounds = (int)(10 * scale);
    if (rounds < 5) rounds = 5;
    if (ssd_rounds < 5) ssd_rounds = 5;
    int torn_rounds = ssd_rounds;
    const char *only = getenv("EMBKV_POWERCUT_ONLY"); /* "pool", "torn" or "ssd" */
    printf("test_powercut: seed=%llu rounds=%d+%d+%d\n", (unsigned long long)seed, rounds, torn_rounds, ssd_rounds);
    rng_t r = {seed};
    if (!only || !strcmp(only, "pool"))
        run_series(&POOL_ONLY, "pc", self, shim, &r, rounds, 2000, 60000);
    if (!only || !strcmp(only, "torn"))
        run_series(&TORN, "pc-torn", self, shim, &r, torn_rounds, 0, 1);
    if (!only || !strcmp(only, "ssd"))
        run_series(&WITH_SSD, "pc-ssd", self, shim, &r, ssd_rounds, 0, 1000000);
    return test_summary("test_powercut");
}
