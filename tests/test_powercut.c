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
 * Only the plain build runs it: a sanitizer's runtime must come first in
 * the library list, ahead of any preload.  The SSD log is not simulated
 * here (its segments are written with O_DIRECT and fdatasync'ed at each
 * checkpoint, before the pool's flushes).
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

#define DIM 8
#define N0 2000        /* rows before round 1 */
#define M 60           /* rows inserted per round */
#define PENDING_BYTES (64u << 20)

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
            if (h % 4 == 0) m->ver[id]++;
            else if (h % 16 == 1) m->present[id] = 0;
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

static int child_main(const char *dir, const char *mark)
{
    embkv_store *s = NULL;
    embkv_options o = {.dim = DIM};
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
    for (;;) {
        g++;
        int64_t live = N0 + (int64_t)(g - 1) * M;
        if (embkv_group_begin(s) != EMBKV_OK) return 5;
        for (int64_t id = 0; id < live; id++) {
            uint64_t h = h2(id, g);
            if (h % 4 == 0) {
                float cur[DIM];
                int grc = embkv_get(s, id, cur, NULL, NULL);
                if (grc == EMBKV_NOTFOUND) continue;  /* deleted in an earlier round */
                if (grc != EMBKV_OK) return 6;
                /* version from the value: make_vec's 0.5 * ver */
                uint32_t ver = (uint32_t)((cur[0] - (float)(id % 100000)) * 2.0f + 0.5f);
                make_vec(id, ver + 1, v);
                if (embkv_put(s, id, v, NULL, 0) != EMBKV_OK) return 7;
            } else if (h % 16 == 1) {
                int rc = embkv_delete(s, id);
                if (rc != EMBKV_OK && rc != EMBKV_NOTFOUND) return 8;
            }
        }
        for (int64_t id = live; id < live + M; id++) {
            make_vec(id, 0, v);
            if (embkv_put(s, id, v, NULL, 0) != EMBKV_OK) return 9;
        }
        float gv[DIM] = {(float)g};
        if (embkv_put(s, -1, gv, NULL, 0) != EMBKV_OK) return 10;
        embkv_group_end(s);
        if (embkv_sync(s) != EMBKV_OK) return 11;
        write_int(mark, g);
    }
}

/* ------------------------------------------------------------ the parent */

static char *read_all(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    char *b = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (b && got < (size_t)st.st_size) {
        ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *len = got;
    return b;
}

static bool write_all(const char *path, const char *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    size_t put = 0;
    while (fd >= 0 && put < len) {
        ssize_t w = write(fd, buf + put, len - put);
        if (w <= 0) break;
        put += (size_t)w;
    }
    bool ok = fd >= 0 && put == len && close(fd) == 0;
    return ok;
}

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
    char *b = read_all(pool, &len);
    CHECK(b && len > 0 && write_all(dpath, b, len));
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
    char *img = read_all(dpath, &ilen), *live = read_all(pool, &llen), *pend = read_all(ppath, &plen);
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
    CHECK(write_all(pool, img, ilen));
out:
    free(img);
    free(live);
    free(pend);
}

static uint64_t read_mark(const char *path)
{
    size_t len = 0;
    char *b = read_all(path, &len);
    uint64_t g = b && len ? strtoull(b, NULL, 10) : 0;
    free(b);
    return g;
}

static void check_store(const char *dir, uint64_t done, int round)
{
    embkv_store *s = NULL;
    embkv_options o = {.dim = DIM};
    int rc = embkv_open(dir, &o, 0, &s);
    CHECK_RC(rc, EMBKV_OK);
    if (!s) {
        fprintf(stderr, "  round %d: the store does not open after the power cut: %s\n", round, embkv_errmsg());
        exit(1);  /* later rounds would only repeat it */
    }
    CHECK_RC(embkv_check(s), EMBKV_OK);
    float v[DIM], want[DIM];
    uint64_t g = 0;
    if (embkv_get(s, -1, v, NULL, NULL) == EMBKV_OK) g = (uint64_t)v[0];
    CHECK(g == done || g == done + 1);
    model m;
    model_at(&m, g);
    int bad = 0;
    uint64_t rows = 0;
    for (int64_t id = 0; id < m.n; id++) {
        int r = embkv_get(s, id, v, NULL, NULL);
        if (!m.present[id]) {
            bad += r != EMBKV_NOTFOUND;
            continue;
        }
        rows++;
        make_vec(id, m.ver[id], want);
        bad += r != EMBKV_OK || memcmp(v, want, sizeof v) != 0;
    }
    for (int64_t id = m.n; id < m.n + 2 * M; id++) bad += embkv_exists(s, id) != 0;
    CHECK(bad == 0);
    CHECK(embkv_count(s) == rows + (g > 0));
    if (bad) fprintf(stderr, "  round %d: %d rows differ from checkpoint %llu\n", round, bad, (unsigned long long)g);
    model_free(&m);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "child")) return child_main(argv[2], argv[3]);
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
    int rounds = (int)(30 * scale);
    if (rounds < 5) rounds = 5;
    printf("test_powercut: seed=%llu rounds=%d\n", (unsigned long long)seed, rounds);

    char dir[600], pool[700], mark[700];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("pc"));
    snprintf(pool, sizeof pool, "%s/store.pool", dir);
    snprintf(mark, sizeof mark, "%s", test_tmpdir("pc.mark"));
    {
        /* a small index: inserts double it (pmemobj transactions) */
        embkv_options o = {.dim = DIM, .expected_rows = 500, .pool_size = 16u << 20};
        embkv_store *s = NULL;
        CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
        float v[DIM];
        for (int64_t id = 0; id < N0 && s; id++) {
            make_vec(id, 0, v);
            CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
        }
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    char env[PATH_MAX + 64];
    snprintf(env, sizeof env, "LD_PRELOAD=%s", shim);
    rng_t r = {seed};
    uint64_t done = 0;
    size_t total_through = 0, total_evicted = 0;
    for (int round = 0; round < rounds; round++) {
        baseline(dir, pool);
        write_int(mark, done);
        long delay = 2000 + (long)rnd_below(&r, 60000);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            char *cargv[] = {self, "child", dir, mark, NULL};
            char *cenv[] = {env, NULL};
            execve(self, cargv, cenv);
            _exit(99);
        }
        usleep((useconds_t)delay);
        kill(pid, SIGKILL);
        int wst = 0;
        waitpid(pid, &wst, 0);
        if (!(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL)) {
            CHECK(WIFSIGNALED(wst));
            fprintf(stderr, "  round %d: the child ended by itself (status %d)\n", round, wst);
            continue;
        }
        uint64_t marked = read_mark(mark);
        size_t through = 0, evicted = 0;
        power_cut(dir, pool, &r, &through, &evicted);
        total_through += through;
        total_evicted += evicted;
        check_store(dir, marked, round);
        embkv_store *s = NULL;
        embkv_options o = {.dim = DIM};
        float v[DIM];
        if (embkv_open(dir, &o, 0, &s) == EMBKV_OK) {
            done = embkv_get(s, -1, v, NULL, NULL) == EMBKV_OK ? (uint64_t)v[0] : 0;
            embkv_close(s);
        }
        printf("  round %d: killed %ld us after exec, checkpoint %llu marked, %llu reopened; "
               "%zu pending entries let through, %zu unflushed lines written back\n",
               round, delay, (unsigned long long)marked, (unsigned long long)done, through, evicted);
    }
    printf("test_powercut: %zu pending entries let through, %zu unflushed lines written back in all\n",
           total_through, total_evicted);
    return test_summary("test_powercut");
}
