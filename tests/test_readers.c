/*
 * test_readers.c - reader processes beside a writer (EMBKV_OPEN_READONLY).
 *
 * A writer process rewrites every base row in each batch (one write
 * group: vec[0] = the batch number, vec[1] = the id), inserts one id and
 * deletes the one inserted five batches before, with an SSD tier and a
 * pool small enough that rows are demoted and the log compacted, an index
 * that grows, and a checkpoint every third batch.  Reader processes read
 * meanwhile, every way a reader may: snapshots with full scans, batch gets,
 * single gets, existence, kNN.  What they must see: every row of one read
 * from one checkpoint (all base rows at one batch number, a batch the
 * writer had checkpointed), never older than the checkpoint the writer had
 * completed before the read began, and exactly the inserted ids alive at
 * that batch.  Then readers and the writer are killed (SIGKILL): readers
 * left keep reading, the writer's reclamation does not wait for the dead,
 * and a new writer reopens at the last checkpoint while readers go on.
 * Refusals and the writer-side limits (a revoked read) are checked too, and
 * the reader table's bound (1,023 reading threads beside the process's slot).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#define DIM 8
#define BASE 2000
#define INS0 1000000

typedef struct shared {
    atomic_long synced;        /* last batch a completed checkpoint holds */
    atomic_long batch;         /* batches done */
    atomic_int stop;
    atomic_long reads, bad, busy;
    atomic_long hold_ms;       /* the writer's embkv_debug_reader_hold */
    char why[256];
} shared;
static shared *sh;

static void vec_of(long b, int64_t id, float *v)
{
    for (int j = 0; j < DIM; j++)
        v[j] = (float)j;
    v[0] = (float)b;
    v[1] = (float)id;
}

static int write_batch(embkv_store *s, long b)
{
    float v[DIM];
    int rc = embkv_group_begin(s);
    for (int64_t id = 0; id < BASE && rc == EMBKV_OK; id++) {
        vec_of(b, id, v);
        rc = embkv_put(s, id, v, NULL, 0);
    }
    if (rc == EMBKV_OK) {
        vec_of(b, INS0 + b, v);
        rc = embkv_put(s, INS0 + b, v, NULL, 0);
    }
    if (rc == EMBKV_OK && b > 5)
        rc = embkv_delete(s, INS0 + b - 5);
    embkv_group_end(s);
    return rc;
}

/* The writer: batches from `from` until told to stop (or `until`). */
static void writer(const char *dir, long from, long until)
{
    embkv_options o = {.dim = DIM, .expected_rows = 64, .pool_size = 16 << 20, .ssd_size = 64 << 20};
    embkv_store *s;
    embkv_debug_reader_hold((uint64_t)atomic_load(&sh->hold_ms));
    float v0[DIM];
    if (embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s) != EMBKV_OK) {
        fprintf(stderr, "writer open: %s\n", embkv_errmsg());
        _exit(3);
    }
    /* from < 0: after the batch the store holds (every row has it) */
    if (from < 0) {
        if (embkv_get(s, 0, v0, NULL, NULL) != EMBKV_OK)
            _exit(6);
        from = (long)v0[0] + 1;
        atomic_store(&sh->batch, from - 1);
    }
    for (long b = from; !atomic_load(&sh->stop) && (until == 0 || b <= until); b++) {
        if (write_batch(s, b) != EMBKV_OK) {
            fprintf(stderr, "writer batch %ld: %s\n", b, embkv_errmsg());
            _exit(4);
        }
        atomic_store(&sh->batch, b);
        if (b % 3 == 0) {
            if (embkv_sync(s) != EMBKV_OK) {
                fprintf(stderr, "writer sync: %s\n", embkv_errmsg());
                _exit(5);
            }
            atomic_store(&sh->synced, b);
        }
    }
    embkv_close(s);
    _exit(0);
}

static void bad(const char *fmt, long a, long b)
{
    atomic_fetch_add(&sh->bad, 1);
    snprintf(sh->why, sizeof sh->why, fmt, a, b);
}

/* One consistent read through a snapshot: returns the batch it saw. */
static long read_snapshot(embkv_store *s)
{
    long before = atomic_load(&sh->synced);
    embkv_snapshot *snap;
    int rc = embkv_snapshot_open(s, &snap);
    if (rc != EMBKV_OK) {
        if (rc == EMBKV_BUSY)
            atomic_fetch_add(&sh->busy, 1);
        else
            bad("snapshot_open rc %ld (%ld)", rc, 0);
        return -1;
    }
    static int64_t ids[1 << 16];
    static float vecs[(1 << 16) * DIM];
    static uint8_t found[1 << 16];
    size_t n = 0;
    uint64_t pos = 0;
    embkv_scan_pin(s);
    for (;;) {
        size_t got = 0;
        rc = embkv_scan_ids(s, &pos, ids + n, (1 << 16) - n, &got);
        if (rc != EMBKV_OK || got == 0)
            break;
        n += got;
    }
    embkv_scan_unpin(s);
    long v = -1;
    if (rc == EMBKV_OK)
        rc = embkv_get_batch_at(s, snap, ids, n, vecs, NULL, found, NULL);
    embkv_snapshot_close(snap);
    if (rc == EMBKV_BUSY) {
        atomic_fetch_add(&sh->busy, 1);
        return -1;
    }
    if (rc != EMBKV_OK) {
        bad("scan rc %ld after %ld reads", rc, atomic_load(&sh->reads));
        fprintf(stderr, "reader: %s\n", embkv_errmsg());
        return -1;
    }
    long base = 0, ins = 0;
    for (size_t i = 0; i < n; i++) {
        if (!found[i])
            continue;
        float *x = vecs + i * DIM;
        if ((int64_t)x[1] != ids[i])
            bad("row %ld holds id %ld", (long)ids[i], (long)x[1]);
        if (ids[i] < BASE) {
            if (v < 0)
                v = (long)x[0];
            else if ((long)x[0] != v)
                bad("one snapshot saw batches %ld and %ld", v, (long)x[0]);
            base++;
        } else {
            long b = ids[i] - INS0;
            if ((long)x[0] != b)
                bad("inserted row %ld has batch %ld", b, (long)x[0]);
            ins++;
        }
    }
    if (base != BASE)
        bad("%ld base rows, want %ld", base, BASE);
    if (v >= 0) {
        if (v % 3 != 0)
            bad("snapshot at batch %ld, which no checkpoint holds (%ld)", v, 0);
        if (v < before)
            bad("snapshot at batch %ld, older than checkpoint %ld before it", v, before);
        /* Alive at batch v: id 0's insert (never deleted) and the last
         * five, exactly (a row deleted in a checkpoint after the
         * snapshot's is still there as of it). */
        long want = v < 5 ? v + 1 : 6;
        if (ins != want)
            bad("%ld inserted rows, want %ld", ins, want);
        for (size_t i = 0; i < n; i++)
            if (found[i] && ids[i] >= INS0 && ids[i] != INS0 && ids[i] - INS0 <= v - 5)
                bad("inserted row %ld, deleted by batch %ld, is there", (long)(ids[i] - INS0), v);
    }
    atomic_fetch_add(&sh->reads, 1);
    return v;
}

static void reader(const char *dir, int which)
{
    embkv_store *s;
    if (embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &s) != EMBKV_OK) {
        fprintf(stderr, "reader open: %s\n", embkv_errmsg());
        _exit(3);
    }
    float v[DIM];
    while (!atomic_load(&sh->stop)) {
        long got = read_snapshot(s);
        (void)got;
        /* single gets: one row at one checkpoint, never before the last */
        long before = atomic_load(&sh->synced);
        int64_t id = (which * 7919 + atomic_load(&sh->reads)) % BASE;
        embkv_rowinfo info;
        int rc = embkv_get(s, id, v, NULL, &info);
        if (rc == EMBKV_OK) {
            if ((long)v[0] < before || (long)v[0] % 3 || (int64_t)v[1] != id)
                bad("get: batch %ld, checkpoint %ld before", (long)v[0], before);
        } else if (rc == EMBKV_BUSY) {
            atomic_fetch_add(&sh->busy, 1);
        } else {
            bad("get rc %ld id %ld", rc, id);
        }
        /* writes are refused */
        if (embkv_put(s, id, v, NULL, 0) != EMBKV_READONLY || embkv_sync(s) != EMBKV_READONLY ||
            embkv_delete(s, id) != EMBKV_READONLY)
            bad("a write was not refused (%ld %ld)", 0, 0);
        if (which == 0) {
            /* kNN of a base row: itself at distance 0 (current versions) */
            float q[DIM];
            vec_of(atomic_load(&sh->batch), 5, q);
            int64_t kid[3];
            double kd[3];
            size_t kf = 0;
            /* Current versions, as in the writer's process (not as of a
             * checkpoint: rows read a moment apart may be batches apart),
             * so only the answer's shape is checked. */
            rc = embkv_knn(s, q, 1, 3, NULL, kid, kd, &kf);
            if (rc == EMBKV_BUSY)
                atomic_fetch_add(&sh->busy, 1);
            else if (rc != EMBKV_OK || kf != 3 || !(kd[0] <= kd[1] && kd[1] <= kd[2]) || kid[0] == kid[1] ||
                     kid[1] == kid[2] || kid[0] < 0 || kid[0] >= BASE)
                bad("knn rc %ld first %ld", rc, kf ? (long)kid[0] : -1);
        }
    }
    embkv_close(s);
    _exit(0);
}

static pid_t spawn(void (*fn)(const char *, int), const char *dir, int arg)
{
    pid_t p = fork();
    if (p == 0)
        fn(dir, arg);
    return p;
}

static void writer_forever(const char *dir, int from) { writer(dir, from, 0); }

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (up to 30 s: sanitizer builds on a busy machine are slow) until
 * *v exceeds past; whether it did. */
static bool waits_past(atomic_long *v, long past)
{
    for (int i = 0; i < 600 && atomic_load(v) <= past; i++)
        sleep_ms(50);
    return atomic_load(v) > past;
}

static int wait_exit(pid_t p)
{
    int st = 0;
    if (waitpid(p, &st, 0) != p)
        return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* A writer process opens store d and signals; this process opens a
 * snapshot through x into *hs (the writer's open first: one from before it
 * would be revoked, R3); then the writer runs work and closes.  The
 * writer's exit status (0: work and close succeeded). */
static int snapshot_beside(const char *d, embkv_store *x, embkv_snapshot **hs, int (*work)(embkv_store *))
{
    int up[2], down[2];
    char c;
    if (pipe(up) != 0 || pipe(down) != 0)
        return -1;
    pid_t kid = fork();
    if (kid == 0) {
        embkv_store *cw = NULL;
        if (embkv_open(d, NULL, 0, &cw) != EMBKV_OK || write(up[1], "w", 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(3);
        int wrc = work(cw);
        _exit(wrc ? wrc : embkv_close(cw) == EMBKV_OK ? 0 : 9);
    }
    int rc = read(up[0], &c, 1) == 1 ? embkv_snapshot_open(x, hs) : -1;
    if (rc != EMBKV_OK || write(down[1], "r", 1) != 1)
        kill(kid, SIGKILL);
    int st = wait_exit(kid);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
    return rc != EMBKV_OK ? -1 : st;
}

/* Row 7 updated in 100 checkpoints, then rows 100-149 deleted. */
static int held_updates(embkv_store *cw)
{
    float cv[DIM];
    for (int k = 1; k <= 100; k++) {
        vec_of(k, 7, cv);
        if (embkv_put(cw, 7, cv, NULL, 0) != EMBKV_OK || embkv_sync(cw) != EMBKV_OK)
            return 4;
    }
    for (int64_t id = 100; id < 150; id++)
        if (embkv_delete(cw, id) != EMBKV_OK)
            return 5;
    return embkv_sync(cw) == EMBKV_OK ? 0 : 6;
}

/* 60,000 rows of 64-byte records, rewritten step after step: three
 * versions of each fill the 16 MiB pool. */
static int held_full_pool(embkv_store *cw)
{
    float cv[DIM];
    int64_t n = 60000;
    for (int64_t id = 150; id < n; id++) {
        vec_of(0, id, cv);
        if (embkv_put(cw, id, cv, NULL, 0) != EMBKV_OK)
            return 4;
    }
    if (embkv_sync(cw) != EMBKV_OK)
        return 5;
    for (int step = 0; step < 12; step++) {
        for (int64_t id = 150; id < n; id++) {
            vec_of(step, id, cv);
            if (embkv_put(cw, id, cv, NULL, 0) != EMBKV_OK) {
                fprintf(stderr, "full pool: step %d id %lld: %s\n", step, (long long)id, embkv_errmsg());
                return 6;
            }
        }
        if (embkv_sync(cw) != EMBKV_OK)
            return 7;
    }
    return 0;
}

/* The SSD log's files as a writer changes them under a reader's open: a
 * segment deleted between the reader's listing and its open of the file
 * (the writer removes emptied segments), and a segment whose header is
 * not written yet (seg_create names the file first).  Neither fails the
 * open; the second reads once its header is there. */
static char listed_victim[300];
static void delete_listed(int dirfd, const char *name)
{
    if (strcmp(name, listed_victim) == 0)
        CHECK(unlinkat(dirfd, name, 0) == 0);
}

static void test_log_files_changing(void)
{
    char dir[600], logdir[700], newest[1100];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("rdlog"));
    snprintf(logdir, sizeof logdir, "%s/log", dir);
    embkv_options o = {.dim = DIM, .expected_rows = 300000, .pool_size = 16 << 20, .ssd_size = 32 << 20};
    embkv_store *w, *r;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &w), EMBKV_OK);
    const int64_t n = 300000;
    float v[DIM];
    for (int64_t id = 0; id < n; id++) {
        vec_of(id % 1000, id, v);
        if (embkv_put(w, id, v, NULL, 0) != EMBKV_OK) {
            CHECK_RC(embkv_put(w, id, v, NULL, 0), EMBKV_OK);
            break;
        }
    }
    embkv_stats st;
    CHECK_RC(embkv_stats_get(w, &st), EMBKV_OK);
    CHECK(st.rows_ssd > 0 && st.ssd_segments >= 2);
    CHECK_RC(embkv_close(w), EMBKV_OK);
    /* the newest segment (the highest number), and the rows of the log */
    DIR *dd = opendir(logdir);
    CHECK(dd != NULL);
    if (!dd)
        return;
    char name[300] = "";
    for (struct dirent *de; (de = readdir(dd));)
        if (strncmp(de->d_name, "seg-", 4) == 0 && strcmp(de->d_name, name) > 0)
            snprintf(name, sizeof name, "%s", de->d_name);
    closedir(dd);
    snprintf(newest, sizeof newest, "%s/%s", logdir, name);
    int64_t *ids = malloc(n * sizeof *ids);
    int *tier = malloc(n * sizeof *tier);
    float *vs = malloc(n * sizeof(float) * DIM);
    uint8_t *found = malloc(n);
    for (int64_t id = 0; id < n; id++)
        ids[id] = id;

    /* (a) its header not written yet when the reader opens the log, then
     * written: the rows read, exactly */
    int fd = open(newest, O_RDWR);
    CHECK(fd >= 0);
    char head[4096];
    CHECK(pread(fd, head, sizeof head, 0) == (ssize_t)sizeof head);
    char zero[4096] = {0};
    CHECK(pwrite(fd, zero, sizeof zero, 0) == (ssize_t)sizeof zero);
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &r), EMBKV_OK);
    CHECK(pwrite(fd, head, sizeof head, 0) == (ssize_t)sizeof head);
    close(fd);
    size_t missing = 99;
    CHECK_RC(embkv_get_batch(r, ids, (size_t)n, vs, found, &missing), EMBKV_OK);
    CHECK(missing == 0);
    for (int64_t id = 0; id < n; id++)
        if (vs[id * DIM] != (float)(id % 1000) || vs[id * DIM + 1] != (float)id) {
            CHECK(!"a row read wrong after its segment's header came");
            break;
        }
    CHECK_RC(embkv_locate_batch_at(r, NULL, ids, (size_t)n, tier, NULL), EMBKV_OK);
    int64_t pm = -1;
    for (int64_t id = 0; id < n && pm < 0; id++)
        if (tier[id] == EMBKV_TIER_PM)
            pm = id;
    CHECK(pm >= 0);
    CHECK_RC(embkv_close(r), EMBKV_OK);

    /* (b) the newest segment deleted between the listing and the open: the
     * open succeeds; the rows of the pool read, those of the file gone fail
     * naming it */
    snprintf(listed_victim, sizeof listed_victim, "%s", name);
    embkv_debug_log_listed(delete_listed);
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &r), EMBKV_OK);
    embkv_debug_log_listed(NULL);
    CHECK(access(newest, F_OK) != 0);
    if (r && pm >= 0) {
        CHECK_RC(embkv_get(r, pm, v, NULL, NULL), EMBKV_OK);
        CHECK(v[1] == (float)pm);
        CHECK_RC(embkv_get_batch(r, ids, (size_t)n, vs, found, &missing), EMBKV_CORRUPT);
        CHECK(strstr(embkv_errmsg(), name) != NULL);
        CHECK_RC(embkv_close(r), EMBKV_OK);
    }
    free(ids);
    free(tier);
    free(vs);
    free(found);
}

/* A fork's child may not use its parent's handles: every read and write
 * through them is refused naming both processes, and what it closes of
 * them (a snapshot, a scan pin: a garbage-collected cursor in a forked
 * worker) leaves the parent's reader slot alone, so the parent's reads go
 * on. */
static void test_forked_child(void)
{
    const char *dir = strdup(test_tmpdir("rd-fork"));
    embkv_store *w, *r;
    float v[DIM] = {1, 2};
    CHECK_RC(embkv_open(dir, &(embkv_options){.dim = DIM}, EMBKV_OPEN_CREATE, &w), EMBKV_OK);
    for (int64_t id = 1; id <= 3; id++)
        CHECK_RC(embkv_put(w, id, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_sync(w), EMBKV_OK);
    pid_t c = fork();
    if (c == 0) {
        float got[DIM];
        embkv_snapshot *sn = NULL;
        int bad = 0;
        bad += embkv_get(w, 1, got, NULL, NULL) != EMBKV_READONLY;
        bad += strstr(embkv_errmsg(), "is a fork of it") == NULL;
        bad += embkv_put(w, 9, v, NULL, 0) != EMBKV_READONLY;
        bad += embkv_delete(w, 1) != EMBKV_READONLY;
        bad += embkv_sync(w) != EMBKV_READONLY;
        bad += embkv_check(w) != EMBKV_READONLY;
        bad += embkv_snapshot_open(w, &sn) != EMBKV_READONLY;
        embkv_backup *bk = NULL;
        char to[512];
        snprintf(to, sizeof to, "%s.bak", dir);
        bad += embkv_backup_begin(w, to, &bk) != EMBKV_READONLY;
        bad += strstr(embkv_errmsg(), "embkv_backup_begin") == NULL;
        bad += embkv_close(w) != EMBKV_OK;
        _exit(bad);
    }
    CHECK(wait_exit(c) == 0);
    float got[DIM];
    CHECK_RC(embkv_put(w, 4, v, NULL, 0), EMBKV_OK);  /* the parent goes on */
    CHECK_RC(embkv_sync(w), EMBKV_OK);
    CHECK_RC(embkv_close(w), EMBKV_OK);

    /* A writer in another process; this one reads (a reader slot). */
    int go[2], done[2];
    CHECK(pipe(go) == 0 && pipe(done) == 0);
    pid_t wp = fork();
    if (wp == 0) {
        char b;
        int ok = embkv_open(dir, NULL, 0, &w) == EMBKV_OK;
        ok = ok && write(go[1], "w", 1) == 1;
        ok = ok && read(done[0], &b, 1) == 1;
        _exit(ok && embkv_close(w) == EMBKV_OK ? 0 : 1);
    }
    char b;
    CHECK(read(go[0], &b, 1) == 1);
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &r), EMBKV_OK);
    embkv_snapshot *snap = NULL;
    CHECK_RC(embkv_snapshot_open(r, &snap), EMBKV_OK);
    int64_t ids[2] = {1, 4};
    float out[2 * DIM];
    uint8_t found[2];
    size_t miss = 0;
    CHECK_RC(embkv_get_batch_at(r, snap, ids, 2, out, NULL, found, &miss), EMBKV_OK);
    c = fork();
    if (c == 0) {
        embkv_scan_pin(r);
        embkv_scan_unpin(r);
        embkv_snapshot_close(snap);
        _exit(embkv_get(r, 1, got, NULL, NULL) == EMBKV_READONLY ? 0 : 1);
    }
    CHECK(wait_exit(c) == 0);
    CHECK_RC(embkv_get_batch_at(r, snap, ids, 2, out, NULL, found, &miss), EMBKV_OK);
    CHECK(miss == 0 && out[DIM] == 1.0f && out[DIM + 1] == 2.0f);
    embkv_snapshot_close(snap);
    CHECK_RC(embkv_close(r), EMBKV_OK);
    CHECK(write(done[1], "d", 1) == 1);
    CHECK(wait_exit(wp) == 0);
    close(go[0]);
    close(go[1]);
    close(done[0]);
    close(done[1]);
    free((void *)dir);
}

/* A reading thread of test_full_reader_table: reads, then stays alive
 * (its reader slot held) until released. */
enum { FULL_THREADS = 1023 };
static embkv_store *full_store;
static pthread_barrier_t full_in, full_out;
static atomic_int full_ok;

static void *full_reader(void *arg)
{
    (void)arg;
    float v[DIM];
    if (embkv_get(full_store, 1, v, NULL, NULL) == EMBKV_OK && v[0] == 5.0f)
        atomic_fetch_add(&full_ok, 1);
    pthread_barrier_wait(&full_in);
    pthread_barrier_wait(&full_out);
    return NULL;
}

/* The reader table's bound: the process's presence and 1,023 reading
 * threads fill its 1,024 slots; the next thread is refused, the message
 * saying what a slot is and the way on, and reads once they exit. */
static void test_full_reader_table(void)
{
    const char *d = strdup(test_tmpdir("full_readers"));
    embkv_options o = {.dim = DIM, .pool_size = 16 << 20};
    embkv_store *w = NULL;
    float v[DIM] = {5};
    CHECK_RC(embkv_open(d, &o, EMBKV_OPEN_CREATE, &w), EMBKV_OK);
    CHECK_RC(embkv_put(w, 1, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_close(w), EMBKV_OK);
    CHECK_RC(embkv_open(d, NULL, EMBKV_OPEN_READONLY, &full_store), EMBKV_OK);
    pthread_barrier_init(&full_in, NULL, FULL_THREADS + 1);
    pthread_barrier_init(&full_out, NULL, FULL_THREADS + 1);
    pthread_t *t = spawn_many(FULL_THREADS, full_reader, "test_readers");
    pthread_barrier_wait(&full_in);
    CHECK(atomic_load(&full_ok) == FULL_THREADS);
    CHECK_RC(embkv_get(full_store, 1, v, NULL, NULL), EMBKV_BUSY);
    CHECK(strstr(embkv_errmsg(), "its reader table is full (1024 slots: one for each process that has the store "
                                 "open to read, one for each of their threads reading it;") != NULL);
    pthread_barrier_wait(&full_out);
    for (int i = 0; i < FULL_THREADS; i++)
        pthread_join(t[i], NULL);
    v[0] = 0;
    CHECK_RC(embkv_get(full_store, 1, v, NULL, NULL), EMBKV_OK);
    CHECK(v[0] == 5.0f);
    CHECK_RC(embkv_close(full_store), EMBKV_OK);
    CHECK_RC(embkv_destroy(d), EMBKV_OK);
    pthread_barrier_destroy(&full_in);
    pthread_barrier_destroy(&full_out);
    free(t);
    free((void *)d);
}

int main(void)
{
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(sh != MAP_FAILED);
    test_forked_child();
    test_log_files_changing();
    test_full_reader_table();
    const char *dir = strdup(test_tmpdir("rd"));  /* (test_tmpdir reuses its buffer) */

    /* A: a reader with no writer ever: refused on a missing store, then
     * reads a closed store. */
    embkv_store *s;
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &s), EMBKV_NOTSTORE);
    {
        pid_t w = fork();
        if (w == 0)
            writer(dir, 0, 3);
        CHECK(wait_exit(w) == 0);
    }
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &s), EMBKV_OK);
    float v[DIM];
    CHECK_RC(embkv_get(s, 7, v, NULL, NULL), EMBKV_OK);
    CHECK(v[0] == 3.0f && v[1] == 7.0f);
    CHECK_RC(embkv_get(s, INS0 + 2, v, NULL, NULL), EMBKV_OK);
    CHECK_RC(embkv_get(s, 424242, v, NULL, NULL), EMBKV_NOTFOUND);
    CHECK_RC(embkv_put(s, 1, v, NULL, 0), EMBKV_READONLY);
    CHECK(strstr(embkv_errmsg(), "embkv_put") && strstr(embkv_errmsg(), "read-only"));
    /* Opened to write in this process too: a handle of its own beside the
     * reader's, which reads its checkpoints; a read-only open now shares
     * the writer's. */
    embkv_store *w2, *s2;
    CHECK_RC(embkv_open(dir, NULL, 0, &w2), EMBKV_OK);
    CHECK(w2 != s && !embkv_readonly(w2));
    vec_of(3, 424242, v);
    CHECK_RC(embkv_put(w2, 424242, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_get(s, 424242, v, NULL, NULL), EMBKV_NOTFOUND);
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &s2), EMBKV_OK);
    CHECK(s2 == w2);
    CHECK_RC(embkv_get(s2, 424242, v, NULL, NULL), EMBKV_OK);
    CHECK_RC(embkv_close(s2), EMBKV_OK);
    CHECK_RC(embkv_sync(w2), EMBKV_OK);
    CHECK_RC(embkv_get(s, 424242, v, NULL, NULL), EMBKV_OK);
    CHECK_RC(embkv_delete(w2, 424242), EMBKV_OK);
    CHECK_RC(embkv_close(w2), EMBKV_OK);
    CHECK_RC(embkv_get(s, 424242, v, NULL, NULL), EMBKV_NOTFOUND);
    CHECK_RC(embkv_close(s), EMBKV_OK);

    /* The files written in a store directory are never followed through
     * a link: the victim stays as it was. */
    {
        char victim[700], link[700], save[700];
        snprintf(victim, sizeof victim, "%s/victim", check_tmp_root);
        FILE *f = fopen(victim, "w");
        CHECK(f && fputs("precious\n", f) >= 0 && fclose(f) == 0);
        const char *names[3] = {"READERS", "LOCK", "store.dirty"};
        for (int k = 0; k < 3; k++) {
            snprintf(link, sizeof link, "%s/%s", dir, names[k]);
            snprintf(save, sizeof save, "%s/%s.saved", check_tmp_root, names[k]);
            CHECK(rename(link, save) == 0 || errno == ENOENT);
            CHECK(symlink(victim, link) == 0);
            embkv_store *x = NULL;
            int rrc = embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &x);
            if (k == 0) {
                CHECK(rrc == EMBKV_CORRUPT && strstr(embkv_errmsg(), "READERS is a symbolic link"));
            } else if (rrc == EMBKV_OK) {
                CHECK_RC(embkv_close(x), EMBKV_OK);
            }
            int wrc = embkv_open(dir, NULL, 0, &x);
            if (k == 1)
                CHECK(wrc == EMBKV_IO && strstr(embkv_errmsg(), "LOCK is a symbolic link"));
            if (wrc == EMBKV_OK)
                CHECK_RC(embkv_close(x), EMBKV_OK);
            size_t len = 0;
            char *got = test_read_file(victim, &len);
            CHECK(got && len == 9 && !memcmp(got, "precious\n", 9));
            free(got);
            CHECK(unlink(link) == 0);
            CHECK(rename(save, link) == 0 || k == 2);
        }
    }

    /* A store another process reads is not destroyed under it; embkv_check
     * is the writer's; a reader table with garbage in its slots works. */
    {
        const char *d = strdup(test_tmpdir("destroyme"));
        embkv_options mo = {.dim = DIM, .pool_size = 16 << 20};
        embkv_store *w = NULL;
        CHECK_RC(embkv_open(d, &mo, EMBKV_OPEN_CREATE, &w), EMBKV_OK);
        CHECK_RC(embkv_put(w, 1, v, NULL, 0), EMBKV_OK);
        CHECK_RC(embkv_close(w), EMBKV_OK);
        int fds[2];
        CHECK(pipe(fds) == 0);
        pid_t kid = fork();
        if (kid == 0) {
            embkv_store *x = NULL;
            if (embkv_open(d, NULL, EMBKV_OPEN_READONLY, &x) != EMBKV_OK)
                _exit(3);
            if (write(fds[1], "r", 1) != 1)
                _exit(4);
            sleep_ms(60000);
            _exit(0);
        }
        char c;
        CHECK(read(fds[0], &c, 1) == 1);
        CHECK_RC(embkv_destroy(d), EMBKV_LOCKED);
        CHECK(strstr(embkv_errmsg(), "open for reading in another process") != NULL);
        kill(kid, SIGKILL);
        CHECK(wait_exit(kid) == 128 + SIGKILL);
        close(fds[0]);
        close(fds[1]);
        embkv_store *x = NULL;
        CHECK_RC(embkv_open(d, NULL, EMBKV_OPEN_READONLY, &x), EMBKV_OK);
        CHECK_RC(embkv_check(x), EMBKV_READONLY);
        CHECK_RC(embkv_close(x), EMBKV_OK);
        /* garbage in every slot, the header intact: readers and the
         * writer go on (dead processes' slots are freed) */
        char rp[700];
        snprintf(rp, sizeof rp, "%s/READERS", d);
        FILE *f = fopen(rp, "r+b");
        CHECK(f != NULL);
        if (f) {
            unsigned char junk[4096];
            for (size_t i = 0; i < sizeof junk; i++)
                junk[i] = (unsigned char)(i * 151 + 7);
            CHECK(fseek(f, 4096, SEEK_SET) == 0);
            for (int k = 0; k < 16; k++)
                CHECK(fwrite(junk, 1, sizeof junk, f) == sizeof junk);
            CHECK(fclose(f) == 0);
        }
        CHECK_RC(embkv_open(d, NULL, EMBKV_OPEN_READONLY, &x), EMBKV_OK);
        CHECK_RC(embkv_get(x, 1, v, NULL, NULL), EMBKV_OK);
        CHECK_RC(embkv_close(x), EMBKV_OK);
        CHECK_RC(embkv_destroy(d), EMBKV_OK);
        free((void *)d);
    }

    /* H: a snapshot held while another process's writer updates one row
     * in 100 checkpoints, then deletes rows, checkpoints and closes
     * cleanly: the snapshot still reads its own checkpoint whole.  And a
     * pool too full for the writer's versions while a snapshot holds them
     * back: the writer waits (at most 100 ms), revokes it, and goes on
     * (never "pool full"). */
    {
        const char *d = strdup(test_tmpdir("held"));
        embkv_options ho = {.dim = DIM, .pool_size = 16 << 20};
        embkv_store *w = NULL;
        CHECK_RC(embkv_open(d, &ho, EMBKV_OPEN_CREATE, &w), EMBKV_OK);
        for (int64_t id = 0; id < 200; id++) {
            vec_of(0, id, v);
            CHECK_RC(embkv_put(w, id, v, NULL, 0), EMBKV_OK);
        }
        CHECK_RC(embkv_close(w), EMBKV_OK);
        embkv_store *x = NULL;
        embkv_snapshot *hs = NULL;
        CHECK_RC(embkv_open(d, NULL, EMBKV_OPEN_READONLY, &x), EMBKV_OK);
        /* (the writer opens first: a snapshot from before a writer's open
         * is revoked by it, R3) */
        CHECK(snapshot_beside(d, x, &hs, held_updates) == 0);
        int64_t hid[200];
        float hv[200 * DIM];
        uint8_t hf[200];
        size_t miss = 99;
        for (int i = 0; i < 200; i++)
            hid[i] = i;
        CHECK_RC(embkv_get_batch_at(x, hs, hid, 200, hv, NULL, hf, &miss), EMBKV_OK);
        CHECK(miss == 0 && hv[7 * DIM] == 0.0f && hv[120 * DIM + 1] == 120.0f);
        embkv_snapshot_close(hs);
        /* a new read: the last checkpoint (row 7 at 100, rows 100-149 gone) */
        CHECK_RC(embkv_get_batch_at(x, NULL, hid, 200, hv, NULL, hf, &miss), EMBKV_OK);
        CHECK(miss == 50 && hv[7 * DIM] == 100.0f);
        /* the full pool: every row rewritten each step, no SSD tier */
        CHECK(snapshot_beside(d, x, &hs, held_full_pool) == 0);
        int hrc = embkv_get_batch_at(x, hs, hid, 200, hv, NULL, hf, &miss);
        CHECK(hrc == EMBKV_BUSY || hrc == EMBKV_OK);
        embkv_snapshot_close(hs);
        CHECK_RC(embkv_close(x), EMBKV_OK);
        free((void *)d);
    }

    /* One thread reads more stores over its life than it reads at once. */
    {
        embkv_store *many[12];
        for (int i = 0; i < 12; i++) {
            char name[32];
            snprintf(name, sizeof name, "many%d", i);
            const char *d = test_tmpdir(name);
            embkv_options mo = {.dim = DIM, .pool_size = 16 << 20};
            embkv_store *w = NULL;
            CHECK_RC(embkv_open(d, &mo, EMBKV_OPEN_CREATE, &w), EMBKV_OK);
            vec_of(i, 1, v);
            CHECK_RC(embkv_put(w, 1, v, NULL, 0), EMBKV_OK);
            CHECK_RC(embkv_close(w), EMBKV_OK);
            CHECK_RC(embkv_open(d, NULL, EMBKV_OPEN_READONLY, &many[i]), EMBKV_OK);
        }
        for (int round = 0; round < 2; round++)
            for (int i = 0; i < 12; i++) {
                CHECK_RC(embkv_get(many[i], 1, v, NULL, NULL), EMBKV_OK);
                CHECK(v[0] == (float)i);
            }
        for (int i = 0; i < 12; i++)
            CHECK_RC(embkv_close(many[i]), EMBKV_OK);
    }

    /* B: a writer and three readers. */
    atomic_store(&sh->synced, 3);
    atomic_store(&sh->batch, 3);
    pid_t wp = spawn(writer_forever, dir, 4);
    /* (the writer's open done: its first batch written; a table moved away
     * before it opened would be made anew by it, and the one moved back
     * would not be the writer's) */
    CHECK(waits_past(&sh->batch, 3));
    /* The reader table removed and made again while the writer runs: a
     * new reader is refused (the writer would not honour it). */
    {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/READERS", dir);
        snprintf(b, sizeof b, "%s/READERS.moved", dir);
        snprintf(b, sizeof b, "%s/READERS.moved", check_tmp_root);  /* (outside the store) */
        CHECK(rename(a, b) == 0);
        embkv_store *x = NULL;
        CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &x), EMBKV_BUSY);
        CHECK(strstr(embkv_errmsg(), "does not use the store's reader table READERS") != NULL);
        CHECK(rename(b, a) == 0);
    }
    pid_t rp[3];
    for (int i = 0; i < 3; i++)
        rp[i] = spawn(reader, dir, i);
    sleep_ms(1000);
    CHECK(waits_past(&sh->reads, 10));
    long b1 = atomic_load(&sh->batch);
    /* C: kill a reader mid-read; the writer goes on. */
    kill(rp[1], SIGKILL);
    CHECK(wait_exit(rp[1]) == 128 + SIGKILL);
    CHECK(waits_past(&sh->batch, b1 + 3));
    /* D: kill the writer; readers go on reading its last checkpoint. */
    kill(wp, SIGKILL);
    CHECK(wait_exit(wp) == 128 + SIGKILL);
    long r0 = atomic_load(&sh->reads);
    CHECK(waits_past(&sh->reads, r0 + 2));
    /* E: a new writer recovers (to the last checkpoint: batch synced) and
     * goes on; the readers keep reading, some reads told to run again. */
    long from = atomic_load(&sh->synced) + 1;
    wp = spawn(writer_forever, dir, -1);  /* (from the checkpoint it recovers to, at least `from`) */
    CHECK(waits_past(&sh->batch, from + 3));
    /* G: SIGKILL at random moments, of the writer (a new one recovers)
     * or of a reader (a new one starts), twelve times; the readers'
     * checks go on throughout. */
    unsigned seed = (unsigned)time(NULL);
    fprintf(stderr, "test_readers: random kills, seed %u\n", seed);
    srand(seed);
    long g0 = atomic_load(&sh->batch), r1 = atomic_load(&sh->reads);
    for (int round = 0; round < 12; round++) {
        sleep_ms(50 + rand() % 350);
        int victim = rand() % 3;  /* 0: the writer, 1: reader 0, 2: reader 2 */
        pid_t *p = victim == 0 ? &wp : victim == 1 ? &rp[0] : &rp[2];
        kill(*p, SIGKILL);
        CHECK(wait_exit(*p) == 128 + SIGKILL);
        *p = victim == 0 ? spawn(writer_forever, dir, -1) : spawn(reader, dir, victim == 1 ? 0 : 2);
    }
    CHECK(waits_past(&sh->batch, g0 + 5));
    CHECK(waits_past(&sh->reads, r1));
    atomic_store(&sh->stop, 1);
    CHECK(wait_exit(wp) == 0);
    CHECK(wait_exit(rp[0]) == 0);
    CHECK(wait_exit(rp[2]) == 0);
    /* F: a read that holds the writer back too long is revoked (R2): the
     * writer goes on, the read fails and says to run it again. */
    atomic_store(&sh->stop, 0);
    atomic_store(&sh->hold_ms, 300);
    long b0 = atomic_load(&sh->batch);
    wp = spawn(writer_forever, dir, -1);
    /* (its open done first: an open after the snapshot would revoke it for
     * another reason, R3) */
    CHECK(waits_past(&sh->batch, b0));
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &s), EMBKV_OK);
    embkv_snapshot *snap = NULL;
    CHECK_RC(embkv_snapshot_open(s, &snap), EMBKV_OK);
    int64_t ids[4] = {1, 2, 3, 4};
    float vs[4 * DIM];
    uint8_t fd[4];
    CHECK_RC(embkv_get_batch_at(s, snap, ids, 4, vs, NULL, fd, NULL), EMBKV_OK);
    long held_from = atomic_load(&sh->batch);
    /* (the writer checkpoints, reclaims, and past 300 ms revokes the
     * snapshot's slot instead of waiting: it keeps going) */
    sleep_ms(800);
    for (int i = 0; i < 400 && atomic_load(&sh->batch) < held_from + 12; i++)
        sleep_ms(50);
    CHECK(atomic_load(&sh->batch) >= held_from + 12);
    CHECK_RC(embkv_get_batch_at(s, snap, ids, 4, vs, NULL, fd, NULL), EMBKV_BUSY);
    if (!strstr(embkv_errmsg(), "(more than 300 ms, or 100 ms while it had to wait"))
        fprintf(stderr, "revoked read: %s\n", embkv_errmsg());
    CHECK(strstr(embkv_errmsg(), "(more than 300 ms, or 100 ms while it had to wait") != NULL);
    embkv_snapshot_close(snap);
    CHECK_RC(embkv_snapshot_open(s, &snap), EMBKV_OK);
    CHECK_RC(embkv_get_batch_at(s, snap, ids, 4, vs, NULL, fd, NULL), EMBKV_OK);
    CHECK(fd[0] && vs[1] == 1.0f && (long)vs[0] >= held_from);
    embkv_snapshot_close(snap);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    atomic_store(&sh->stop, 1);
    int wrc = wait_exit(wp);
    if (wrc)
        fprintf(stderr, "writer exit %d\n", wrc);
    CHECK(wrc == 0);

    fprintf(stderr, "readers: %ld reads, %ld told to run again, %ld bad\n", atomic_load(&sh->reads),
            atomic_load(&sh->busy), atomic_load(&sh->bad));
    if (atomic_load(&sh->bad))
        fprintf(stderr, "first fault: %s\n", sh->why);
    CHECK(atomic_load(&sh->bad) == 0);
    free((void *)dir);
    return test_summary("test_readers");
}
