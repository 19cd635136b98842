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
 * A second series runs a store with an SSD tier: a pool too small for its
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
} series;

static const series POOL_ONLY = {.n0 = 2000, .m = 60, .upd = 4, .del = 16};
/* 16 MiB pool, dim 8: about a third of the rows stay in the pool. */
static const series WITH_SSD = {.n0 = 120000, .m = 1000, .upd = 16, .del = 256, .ssd = true};
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
    for (;;) {
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

/* What a power cut now leaves, put in place of the pool. */
static void power_cut(const char *dir, const char *pool, rng_t *r, size_t *let_through, size_t *evicted)
{
    char dpath[PATH_MAX], ppath[PATH_MAX];
    sim_paths(dir, dpath, ppath);
    size_t ilen = 0, llen = 0, plen = 0;
    unsigned char *img = fc_read_file(dpath, &ilen), *live = fc_read_file(pool, &llen),
                  *pend = fc_read_file(ppath, &plen);
    CHECK(img && live && pend && ilen == llen && plen >= sizeof(pmemsim_pending));
    *let_through = *evicted = 0;
    if (!img || !live || !pend || ilen != llen || plen < sizeof(pmemsim_pending)) goto out;
    /* lines never flushed that differ: a cache eviction may have written them */
    for (size_t off = 0; off + 64 <= ilen; off += 64)
        if (memcmp(img + off, live + off, 64) && rnd_below(r, 8) == 0) {
            memcpy(img + off, live + off, 64);
            (*evicted)++;
        }
    /* flushed, not drained: each through or not, in order */
    pmemsim_pending *p = (pmemsim_pending *)pend;
    uint64_t at = 0, used = p->used;
    while (at + sizeof(pmemsim_entry) <= used && sizeof *p + at + sizeof(pmemsim_entry) <= plen) {
        pmemsim_entry h;
        memcpy(&h, p->data + at, sizeof h);
        if (sizeof *p + at + sizeof h + h.len > plen || h.off + h.len > ilen) break;
        if (rnd_below(r, 2)) {
            memcpy(img + h.off, p->data + at + sizeof h, h.len);
            (*let_through)++;
        }
        at += sizeof h + h.len;
    }
    CHECK(fc_write_file(pool, img, ilen));
out:
    free(img);
    free(live);
    free(pend);
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
        fprintf(stderr, "  round %d: the store does not open after the power cut: %s\n", round, embkv_errmsg());
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
        fprintf(stderr, "  round %d: %lld rows differ from checkpoint %llu (the first: id %lld)\n", round,
                (long long)bad, (unsigned long long)g, (long long)first_bad);
    model_free(&m);
    CHECK_RC(embkv_close(s), EMBKV_OK);
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
    char env_pre[PATH_MAX + 64], env_files[800], env_journal[800], env_kill[64];
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
        if (at_write) delay = 20000000;  /* a backstop: the library kills it */
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            char *cargv[] = {(char *)self, S.ssd ? "child-ssd" : "child", dir, mark, NULL};
            char *cenv[] = {env_pre, env_files, env_journal, env_kill, NULL};
            if (!S.ssd) cenv[1] = NULL;
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
    const char *only = getenv("EMBKV_POWERCUT_ONLY"); /* "pool" or "ssd" */
    printf("test_powercut: seed=%llu rounds=%d+%d\n", (unsigned long long)seed, rounds, ssd_rounds);
    rng_t r = {seed};
    if (!only || !strcmp(only, "pool"))
        run_series(&POOL_ONLY, "pc", self, shim, &r, rounds, 2000, 60000);
    if (!only || !strcmp(only, "ssd"))
        run_series(&WITH_SSD, "pc-ssd", self, shim, &r, ssd_rounds, 0, 1000000);
    return test_summary("test_powercut");
}
