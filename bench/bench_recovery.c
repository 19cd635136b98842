/*
 * bench_recovery.c - what reopening a store costs: after a clean close,
 * and after SIGKILL with some rows changed since the last checkpoint; and
 * what a checkpoint (embkv_sync) costs against the rows changed since the
 * one before.
 *
 *   bench_recovery DIR [--rows N] [--dim D] [--reps R]
 *
 * DIR must be absent or empty and is removed at the end.  N rows (default
 * 2,000,000) with ids 0..N-1 and random values are loaded and checkpointed
 * once.  Then, each phase R times (default 3), best and median:
 *   - clean reopen: embkv_open of the closed store (and embkv_count);
 *   - crash recovery: a child opens the store, rewrites C rows, checkpoints,
 *     rewrites K more without a checkpoint and is killed with SIGKILL; the
 *     parent times the reopen (which rolls the K rows back) for K = 0,
 *     1,000, 10,000, 100,000 and N/10, and checks that the rows are those
 *     of the checkpoint; then for K = 0 and 10,000 with the dirty map
 *     removed before the reopen, which then reads every row (the full
 *     recovery of a store whose map is lost or damaged);
 *   - checkpoint: K rows rewritten in place, then embkv_sync timed, for the
 *     same K.
 * The page cache is not dropped between phases: on /dev/shm it is the
 * store itself, and on a disk file system the figures are warm reopens.
 */
#include "embkv.h"
#include "bench_common.h"

#include <signal.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <unistd.h>

static void ck(int rc, const char *what)
{
    if (rc != EMBKV_OK)
        die("%s failed (rc %d): %s", what, rc, embkv_errmsg());
}

/* Row id's values for generation g: cheap, and checkable after a crash. */
static void fill(float *v, size_t dim, int64_t id, uint32_t g)
{
    for (size_t j = 0; j < dim; j++)
        v[j] = (float)((uint64_t)id % 1000003) + (float)g * 0.5f + (float)j;
}

/* Rewrites k rows spread over the table (a stride), generation g. */
static void rewrite(embkv_store *s, size_t rows, size_t dim, size_t k, uint32_t g)
{
    float *v = xmalloc(dim * sizeof *v);
    size_t stride = k ? rows / k : 1;
    for (size_t i = 0; i < k; i++) {
        int64_t id = (int64_t)((i * stride) % rows);
        fill(v, dim, id, g);
        ck(embkv_put(s, id, v, NULL, EMBKV_PUT_UPDATE), "embkv_put");
    }
    free(v);
}

/* A child opens the store, rewrites 1,000 rows and checkpoints, rewrites
 * k more and is killed; the reopen (recovery) is timed into t and the
 * checkpoint's rows checked.  no_map: store.dirty is removed first, so the
 * reopen reads every row (the full recovery). */
static void crash_round(const char *dir, size_t rows, size_t dim, size_t k, uint32_t gen, bool no_map, timing *t)
{
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        embkv_store *c;
        ck(embkv_open(dir, NULL, 0, &c), "embkv_open (child)");
        rewrite(c, rows, dim, 1000, gen);      /* checkpointed */
        ck(embkv_sync(c), "embkv_sync (child)");
        rewrite(c, rows, dim, k, gen + 1);     /* lost */
        raise(SIGKILL);
        _exit(3);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
        die("the child did not die of SIGKILL (status %d)", st);
    if (no_map) {
        char map[4096];
        snprintf(map, sizeof map, "%s/store.dirty", dir);
        if (unlink(map) != 0)
            die("unlink %s: %s", map, strerror(errno));
    }
    embkv_store *s;
    double t0 = now_s();
    ck(embkv_open(dir, NULL, 0, &s), "embkv_open (recovery)");
    timing_add(t, now_s() - t0);
    /* The checkpoint's rows, not the lost ones. */
    float *v = xmalloc(dim * sizeof *v), *w = xmalloc(dim * sizeof *w);
    size_t stride = rows / 1000;
    for (size_t i = 0; i < 1000; i += 97) {
        int64_t id = (int64_t)(i * stride);
        ck(embkv_get(s, id, w, NULL, NULL), "embkv_get");
        fill(v, dim, id, gen);
        if (memcmp(v, w, dim * sizeof *v))
            die("row %" PRId64 " after recovery is not the checkpoint's", id);
    }
    free(v);
    free(w);
    embkv_stats es;
    ck(embkv_stats_get(s, &es), "embkv_stats_get");
    if (!es.recovered)
        die("the reopen after SIGKILL did not recover");
    ck(embkv_close(s), "embkv_close");
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *dir = NULL;
    size_t rows = 2000000, dim = 64, reps = 3;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-') {
            dir = argv[i];
            continue;
        }
        if (i + 1 >= argc)
            die("%s needs a value", argv[i]);
        if (!strcmp(argv[i], "--rows")) rows = parse_size(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) dim = parse_size(argv[i], argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = parse_size(argv[i], argv[i + 1]);
        else die("usage: bench_recovery DIR [--rows N] [--dim D] [--reps R]");
        i++;
    }
    if (!dir || rows < 1000 || dim < 1 || dim > EMBKV_MAX_DIM || reps < 1 || reps > MAX_REPS)
        die("usage: bench_recovery DIR [--rows N >= 1000] [--dim D] [--reps R <= %d]", MAX_REPS);
    if (!dir_absent_or_empty(dir))
        die("%s must be absent or empty", dir);
    uint64_t pool = (uint64_t)((double)rows * (32.0 + 4.0 * (double)dim) * 2.5) + rows * 64 + (64ull << 20);
    embkv_options o = {.dim = (uint32_t)dim, .expected_rows = rows, .pool_size = pool};
    printf("== bench_recovery: %zu rows, dim %zu, pool %.0f MiB, %zu runs/phase\n", rows, dim,
           (double)pool / 1048576.0, reps);

    embkv_store *s;
    double t0 = now_s();
    ck(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), "embkv_open (create)");
    float *v = xmalloc(dim * sizeof *v);
    for (size_t i = 0; i < rows; i++) {
        fill(v, dim, (int64_t)i, 0);
        ck(embkv_put(s, (int64_t)i, v, NULL, EMBKV_PUT_INSERT), "embkv_put (load)");
    }
    ck(embkv_close(s), "embkv_close");
    printf("  loaded and closed in %.1f s (store on %s)\n", now_s() - t0, fs_name(dir));

    /* Clean reopen. */
    timing t_clean = {.name = "reopen after a clean close"};
    for (size_t r = 0; r < reps; r++) {
        t0 = now_s();
        ck(embkv_open(dir, NULL, 0, &s), "embkv_open");
        if (embkv_count(s) != rows)
            die("%" PRIu64 " rows after reopen, want %zu", embkv_count(s), rows);
        timing_add(&t_clean, now_s() - t0);
        ck(embkv_close(s), "embkv_close");
    }
    printf("\n-- reopen\n");
    timing_print_ms(&t_clean);

    /* Crash recovery against the rows changed since the last checkpoint. */
    size_t ks[5] = {0, 1000, 10000, 100000, rows / 10};
    printf("\n-- reopen after SIGKILL, K rows rewritten since the last checkpoint\n");
    uint32_t gen = 1;
    for (int ki = 0; ki < 5; ki++) {
        char name[96];
        snprintf(name, sizeof name, "K = %zu", ks[ki]);
        timing t = {.name = name};
        for (size_t r = 0; r < reps; r++, gen += 2)
            crash_round(dir, rows, dim, ks[ki], gen, false, &t);
        timing_print_ms(&t);
    }
    /* The same without the dirty map (a store whose map is lost or
     * damaged, or on persistent memory): recovery reads every row. */
    printf("\n-- reopen after SIGKILL without the dirty map (full recovery)\n");
    for (int ki = 0; ki < 3; ki += 2) {
        char name[96];
        snprintf(name, sizeof name, "K = %zu", ks[ki]);
        timing t = {.name = name};
        for (size_t r = 0; r < reps; r++, gen += 2)
            crash_round(dir, rows, dim, ks[ki], gen, true, &t);
        timing_print_ms(&t);
    }

    /* Checkpoint cost against the rows changed since the previous one. */
    printf("\n-- checkpoint (embkv_sync) after K rows rewritten\n");
    ck(embkv_open(dir, NULL, 0, &s), "embkv_open");
    for (int ki = 0; ki < 5; ki++) {
        size_t k = ks[ki];
        char name[96];
        snprintf(name, sizeof name, "K = %zu", k);
        timing t = {.name = name};
        for (size_t r = 0; r < reps; r++, gen++) {
            ck(embkv_sync(s), "embkv_sync");
            rewrite(s, rows, dim, k, gen);
            t0 = now_s();
            ck(embkv_sync(s), "embkv_sync");
            timing_add(&t, now_s() - t0);
        }
        timing_print_ms(&t);
    }
    ck(embkv_close(s), "embkv_close");
    free(v);
    rm_rf(dir);
    return 0;
}
