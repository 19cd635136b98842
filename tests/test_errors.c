/*
 * test_errors.c - every error path returns its code, says what is wrong and
 * leaves the store (or the directory) usable and unchanged.
 *
 * Covers: bad options (dim, state_floats, max_load, pool_size, an index
 * bigger than the pool), NULL arguments and handles, missing
 * and foreign directories, a path that is a file, garbage and foreign pool
 * files, dim / state_floats mismatch on reopen, insert-only and update-only
 * puts, NaN and infinity in a put, deletes and gets of missing ids, a pool too small for its rows, and a
 * second process opening a store that is open (EMBKV_LOCKED, both ways),
 * processes creating one store at once (each opens it or is told it is
 * open elsewhere),
 * the pool file's flock held by a process that is not a writer (waited
 * for a moment, then EMBKV_BUSY naming the file), store calls from inside
 * an embkv_update_batch callback (every write, check, sync, snapshot and
 * backup: EMBKV_BUSY naming the callback, where a write of a row the
 * batch had locked hung; reads, scans, searches and pins work; under
 * alarm()).
 * Misuse of handles: embkv_close inside the thread's write group, and of
 * the last reference while sessions or snapshots are open; another
 * store's snapshot given to the *_at reads; NULL in every function's
 * pointer arguments (an rc names the argument, accessors give 0 or NULL);
 * flag bits a function does not define.
 * Messages are checked for the word at fault (the id in decimal, "dim", the
 * path).
 *
 * Not covered: a store of an incompatible format version (EMBKV_VERSION).
 * Making one needs the engine's private root layout; the test instead checks
 * that libpmemobj pools that are not embkv stores are refused and untouched.
 *
 * The binary re-executes itself (/proc/self/exe --child ...) to get a second
 * process with no inherited state.
 */
#include "embkv.h"
#include "check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libpmemobj.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define DIM 8


static void make_vec(int64_t id, uint32_t ver, float *v, uint32_t dim)
{
    for (uint32_t j = 0; j < dim; j++)
        v[j] = (float)((int64_t)(mix64((uint64_t)id * 31 + ver * 7 + j) >> 42) - (1 << 21)) / 4.0f;
}

static embkv_options opts(uint32_t dim, uint32_t sf)
{
    embkv_options o = {0};
    o.dim = dim;
    o.state_floats = sf;
    o.expected_rows = 1000;
    o.pool_size = 16ull << 20;
    return o;
}

/* A new store in dir holding rows first..first+n-1 at version 1, open. */
static embkv_store *create_with_rows(const char *dir, int64_t first, int64_t n)
{
    embkv_options o = opts(DIM, 0);
    embkv_store *s = NULL;
    float v[DIM];
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    for (int64_t id = first; s && id < first + n; id++) {
        make_vec(id, 1, v, DIM);
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    return s;
}

/* The last message names `word`. */
#define CHECK_MSG(word) do { \
    const char *m_ = embkv_errmsg(); \
    CHECK(m_ != NULL && strstr(m_, (word)) != NULL); \
    if (m_ && !strstr(m_, (word))) fprintf(stderr, "    message \"%s\" lacks \"%s\"\n", m_, (word)); \
} while (0)

static void check_msg_id(int64_t id)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, id);
    CHECK_MSG(buf);
}

/* ---- files ------------------------------------------------------------ */

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static bool path_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* FNV-1a of a file's bytes, and its size; 0 when unreadable. */
static uint64_t file_hash(const char *path, off_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 1469598103934665603ull;
    unsigned char buf[65536];
    size_t n;
    off_t total = 0;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
        for (size_t i = 0; i < n; i++) h = (h ^ buf[i]) * 1099511628211ull;
        total += (off_t)n;
    }
    fclose(f);
    if (size) *size = total;
    return h;
}

/* Hash of every file in a directory (names and contents). */
static uint64_t dir_hash(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    uint64_t h = 0;
    struct dirent *e;
    char p[1024];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        uint64_t nh = 1469598103934665603ull;
        for (const char *c = e->d_name; *c; c++) nh = (nh ^ (unsigned char)*c) * 1099511628211ull;
        h += mix64(nh ^ file_hash(p, NULL));  /* order-independent */
    }
    closedir(d);
    return h;
}

static void write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

static int run_cmd(const char *fmt, const char *a, const char *b)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

/* ---- a second process ---------------------------------------------------- */

/* Child modes (argv: --child MODE DIR):
 *   try   open without CREATE; exit status = return code (0 after a close)
 *   tryc  the same with EMBKV_OPEN_CREATE
 *   hold  open, write "o" to stdout, wait for stdin to close, close, exit 0 */
static int child_main(const char *mode, const char *dir)
{
    embkv_options o = opts(DIM, 0);
    embkv_store *s = NULL;
    int rc = embkv_open(dir, &o, !strcmp(mode, "tryc") ? EMBKV_OPEN_CREATE : 0, &s);
    if (!strcmp(mode, "hold")) {
        if (rc) return 100 + rc;
        if (write(1, "o", 1) != 1) return 99;
        char c;
        while (read(0, &c, 1) > 0) {}
        return embkv_close(s) ? 98 : 0;
    }
    if (rc == EMBKV_OK) rc = embkv_close(s) ? 97 : 0;
    return rc;
}

static int run_child(const char *mode, const char *dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "test_errors", "--child", mode, dir, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 200 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

typedef struct { pid_t pid; int to, from; } holder;

static holder start_holder(const char *dir)
{
    int in[2], out[2];
    holder h = { -1, -1, -1 };
    if (pipe(in) || pipe(out)) { perror("pipe"); exit(2); }
    h.pid = fork();
    if (h.pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[0]); close(in[1]); close(out[0]); close(out[1]);
        execl("/proc/self/exe", "test_errors", "--child", "hold", dir, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    h.to = in[1];
    h.from = out[0];
    char c = 0;
    CHECK(read(h.from, &c, 1) == 1 && c == 'o');  /* the child has it open */
    return h;
}

static int stop_holder(holder h)
{
    close(h.to);
    close(h.from);
    int st = 0;
    waitpid(h.pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 200;
}

/* ---- tests ------------------------------------------------------------- */

static void test_options(void)
{
    const char *dir = strdup(test_tmpdir("opts"));
    embkv_store *s = NULL;
    embkv_options o;

    o = opts(0, 0);
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_MSG("dim");
    CHECK(s == NULL);
    o = opts(EMBKV_MAX_DIM + 1, 0);
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_MSG("dim");
    o = opts(DIM, EMBKV_MAX_STATE_FLOATS + 1);
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_MSG("state_floats");
    o = opts(DIM, 0);
    o.max_load = 1.5;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_MSG("max_load");
    o.max_load = -0.5;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_MSG("max_load");
    o = opts(DIM, 0);
    o.pool_size = 1u << 20;  /* below the 16 MiB minimum */
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_MSG("pool_size");
    /* NULL options cannot create: the dim is missing */
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_MSG("dim");
    o = opts(DIM, 0);
    CHECK_RC(embkv_open(NULL, &o, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, NULL), EMBKV_INVALID);

    /* none of the refused creates left anything behind that blocks a create */
    CHECK(!path_exists(dir) || count_entries(dir) == 0);
    o = opts(DIM, 0);
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (s) CHECK_RC(embkv_close(s), EMBKV_OK);

    /* the largest dim is accepted and round-trips */
    const char *big = strdup(test_tmpdir("maxdim"));
    o = opts(EMBKV_MAX_DIM, 0);
    o.expected_rows = 10;
    s = NULL;
    CHECK_RC(embkv_open(big, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (s) {
        float *v = malloc(EMBKV_MAX_DIM * sizeof *v), *w = malloc(EMBKV_MAX_DIM * sizeof *w);
        make_vec(5, 1, v, EMBKV_MAX_DIM);
        CHECK_RC(embkv_put(s, 5, v, NULL, 0), EMBKV_OK);
        CHECK_RC(embkv_get(s, 5, w, NULL, NULL), EMBKV_OK);
        CHECK(memcmp(v, w, EMBKV_MAX_DIM * sizeof *v) == 0);
        CHECK(embkv_dim(s) == EMBKV_MAX_DIM);
        CHECK_RC(embkv_close(s), EMBKV_OK);
        free(v);
        free(w);
    }

    /* an index bigger than the pool cannot be created */
    const char *huge = strdup(test_tmpdir("hugeindex"));
    o = opts(DIM, 0);
    o.expected_rows = 100000000;  /* ~2 GB of buckets in a 16 MiB pool */
    s = NULL;
    int rc = embkv_open(huge, &o, EMBKV_OPEN_CREATE, &s);
    CHECK(rc == EMBKV_FULL || rc == EMBKV_INVALID);
    if (rc == EMBKV_OK && s) embkv_close(s);
    o = opts(DIM, 0);
    CHECK_RC(embkv_open(huge, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (s) CHECK_RC(embkv_close(s), EMBKV_OK);

    free((void *)dir);
    free((void *)big);
    free((void *)huge);
}

static void test_paths(void)
{
    embkv_store *s = NULL;
    embkv_options o = opts(DIM, 0);

    /* a missing directory without CREATE: an error, and nothing created */
    const char *missing = strdup(test_tmpdir("missing"));
    int rc = embkv_open(missing, &o, 0, &s);
    CHECK(rc == EMBKV_NOTSTORE || rc == EMBKV_IO);
    CHECK_MSG(missing);
    CHECK(!path_exists(missing));

    /* with CREATE under a parent that does not exist either: an error */
    char deep[700];
    snprintf(deep, sizeof deep, "%s/no/such/parent", missing);
    rc = embkv_open(deep, &o, EMBKV_OPEN_CREATE, &s);
    CHECK(rc != EMBKV_OK);
    CHECK(!path_exists(missing));

    /* an empty directory without CREATE is not a store */
    const char *empty = strdup(test_tmpdir("empty"));
    mkdir(empty, 0755);
    rc = embkv_open(empty, &o, 0, &s);
    CHECK(rc == EMBKV_NOTSTORE || rc == EMBKV_IO);
    CHECK(count_entries(empty) == 0);

    /* a directory of someone else's files: NOTSTORE, with or without CREATE,
     * and it stays exactly as it was */
    const char *foreign = strdup(test_tmpdir("foreign"));
    mkdir(foreign, 0755);
    char fp[700];
    snprintf(fp, sizeof fp, "%s/notes.txt", foreign);
    write_file(fp, "my notes\n", 9);
    uint64_t h0 = dir_hash(foreign);
    CHECK_RC(embkv_open(foreign, &o, EMBKV_OPEN_CREATE, &s), EMBKV_NOTSTORE);
    CHECK_MSG(foreign);
    CHECK_RC(embkv_open(foreign, &o, 0, &s), EMBKV_NOTSTORE);
    CHECK(count_entries(foreign) == 1 && dir_hash(foreign) == h0);

    /* files of the application ("app-" names) are not foreign: a store is
     * created beside them, reopens with them, and leaves them alone */
    const char *withapp = strdup(test_tmpdir("withapp"));
    mkdir(withapp, 0755);
    snprintf(fp, sizeof fp, "%s/" EMBKV_APP_FILE_PREFIX "list", withapp);
    write_file(fp, "mine\n", 5);
    uint64_t ah = file_hash(fp, NULL);
    CHECK_RC(embkv_open(withapp, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_open(withapp, &o, 0, &s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK(file_hash(fp, NULL) == ah);

    /* a path that is a regular file */
    const char *file = strdup(test_tmpdir("plainfile"));
    write_file(file, "not a directory", 15);
    uint64_t fh = file_hash(file, NULL);
    rc = embkv_open(file, &o, EMBKV_OPEN_CREATE, &s);
    CHECK(rc == EMBKV_NOTSTORE || rc == EMBKV_IO || rc == EMBKV_INVALID);
    CHECK_MSG(file);
    rc = embkv_open(file, &o, 0, &s);
    CHECK(rc == EMBKV_NOTSTORE || rc == EMBKV_IO || rc == EMBKV_INVALID);
    CHECK(file_hash(file, NULL) == fh);

    free((void *)missing);
    free((void *)empty);
    free((void *)foreign);
    free((void *)withapp);
    free((void *)file);
}

/* A good store, a copy whose pool is garbage, pools of other layouts. */
static void test_bad_pools(void)
{
    const char *good = strdup(test_tmpdir("goodpool"));
    embkv_options o = opts(DIM, 0);
    float v[DIM], w[DIM];
    embkv_store *s = create_with_rows(good, 0, 100);
    if (!s) return;
    CHECK_RC(embkv_close(s), EMBKV_OK);

    char pool[700];
    snprintf(pool, sizeof pool, "%s/store.pool", good);
    off_t size = 0;
    file_hash(pool, &size);
    CHECK(size >= (16 << 20));  /* the pool file the engine keeps is store.pool */

    /* whole pool replaced by random bytes of the same size */
    const char *garb = strdup(test_tmpdir("garbage"));
    CHECK(run_cmd("cp -a '%s' '%s'", good, garb) == 0);
    char gp[700];
    snprintf(gp, sizeof gp, "%s/store.pool", garb);
    unsigned char *junk = malloc((size_t)size);
    for (off_t i = 0; i < size; i += 8) {
        uint64_t x = mix64((uint64_t)i);
        memcpy(junk + i, &x, (size_t)(size - i < 8 ? size - i : 8));
    }
    write_file(gp, junk, (size_t)size);
    uint64_t gh = dir_hash(garb);
    /* (damaged, not foreign: the store's other files are there) */
    CHECK_RC(embkv_open(garb, &o, 0, &s), EMBKV_CORRUPT);
    CHECK_MSG(garb);
    CHECK(strstr(embkv_errmsg(), "store.pool is damaged: it does not begin as a pmemobj pool does, where the "
                                 "store's pool was (its store.") &&
          strstr(embkv_errmsg(), "restore the store from a backup"));
    CHECK_RC(embkv_open(garb, &o, EMBKV_OPEN_CREATE, &s), EMBKV_CORRUPT);
    CHECK(dir_hash(garb) == gh);

    /* only the first 64 KiB (the pool header) garbage */
    const char *hdr = strdup(test_tmpdir("badheader"));
    CHECK(run_cmd("cp -a '%s' '%s'", good, hdr) == 0);
    char hp[700];
    snprintf(hp, sizeof hp, "%s/store.pool", hdr);
    int fd = open(hp, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, junk, 65536, 0) == 65536);
    if (fd >= 0) close(fd);
    uint64_t hh = dir_hash(hdr);
    CHECK_RC(embkv_open(hdr, &o, 0, &s), EMBKV_CORRUPT);
    CHECK(dir_hash(hdr) == hh);

    /* the pool cut to half its size: refused as damaged by the probe
     * process, each time (libpmemobj leaks on a pool it refuses: the
     * sanitized run's leak check sees an open that refused it here) */
    const char *half = strdup(test_tmpdir("halfpool"));
    CHECK(run_cmd("cp -a '%s' '%s'", good, half) == 0);
    char hfp[700];
    snprintf(hfp, sizeof hfp, "%s/store.pool", half);
    CHECK(truncate(hfp, size / 2) == 0);
    for (int k = 0; k < 2; k++) {
        CHECK_RC(embkv_open(half, &o, 0, &s), EMBKV_CORRUPT);
        CHECK(strstr(embkv_errmsg(), "store.pool is damaged (or made by an incompatible libpmemobj): ") &&
              strstr(embkv_errmsg(), ": restore the store from a backup"));
    }
    free((void *)half);

    /* an empty pool file */
    const char *zero = strdup(test_tmpdir("zeropool"));
    CHECK(run_cmd("cp -a '%s' '%s'", good, zero) == 0);
    char zp[700];
    snprintf(zp, sizeof zp, "%s/store.pool", zero);
    CHECK(truncate(zp, 0) == 0);
    CHECK_RC(embkv_open(zero, &o, EMBKV_OPEN_CREATE, &s), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "store.pool is damaged: it is empty") != NULL);
    off_t zs = -1;
    file_hash(zp, &zs);
    CHECK(zs == 0);

    /* a valid libpmemobj pool of another application, and one that claims
     * embkv's layout but holds no embkv root: neither is an embkv store */
    const char *layouts[2] = { "someoneelse", "embkv" };
    for (int k = 0; k < 2; k++) {
        const char *d = strdup(test_tmpdir(k ? "emptyembkvpool" : "otherpool"));
        mkdir(d, 0755);
        char p[700];
        snprintf(p, sizeof p, "%s/store.pool", d);
        PMEMobjpool *pop = pmemobj_create(p, layouts[k], 16u << 20, 0644);
        CHECK(pop != NULL);
        if (pop) pmemobj_close(pop);
        uint64_t ph = file_hash(p, NULL);
        int rc = embkv_open(d, &o, 0, &s);
        if (k == 0) CHECK_RC(rc, EMBKV_NOTSTORE);
        else CHECK(rc == EMBKV_NOTSTORE || rc == EMBKV_VERSION || rc == EMBKV_CORRUPT);
        if (rc == EMBKV_OK) embkv_close(s);
        /* the other application's pool is untouched (the half-made embkv
         * one is embkv's own business) */
        if (k == 0) CHECK(file_hash(p, NULL) == ph);
        if (k == 0 && file_hash(p, NULL) != ph)
            fprintf(stderr, "    pool of layout \"%s\" was modified by the refused open (rc %d: %s)\n",
                    layouts[k], rc, embkv_errmsg());
        free((void *)d);
    }

    /* and the original is untouched by all of this */
    CHECK_RC(embkv_open(good, &o, 0, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_count(s) == 100);
        for (int64_t id = 0; id < 100; id++) {
            make_vec(id, 1, v, DIM);
            CHECK_RC(embkv_get(s, id, w, NULL, NULL), EMBKV_OK);
            CHECK(memcmp(v, w, sizeof v) == 0);
        }
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    free(junk);
    free((void *)good);
    free((void *)garb);
    free((void *)hdr);
    free((void *)zero);
}

/* Per-thread messages: a failure on another thread does not touch ours. */
static void *other_thread(void *arg)
{
    embkv_store *s = arg;
    const char *m = embkv_errmsg();
    CHECK(m != NULL && strstr(m, "-777000111222") == NULL);  /* ours is not visible here */
    CHECK(embkv_delete(s, 424242424242) == EMBKV_NOTFOUND);
    check_msg_id(424242424242);
    return NULL;
}

/* Counts calls with vec == NULL (calls[0]) and with a vector (calls[1]);
 * skips every row, so nothing is written. */
static int null_vec_fn(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    int *calls = ctx;
    calls[vec ? 1 : 0]++;
    CHECK(vec ? i == 1 : i == 0);
    return 1;
}

/* Row 0 of the batch: its vector's first element plus one; row 1: a NaN
 * in its vector (ctx 0) or an infinity in its state (ctx 1). */
static int not_finite_fn(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    (void)id;
    if (i == 0)
        vec[0] += 1;
    else if (*(int *)ctx == 0)
        vec[3] = NAN;
    else
        state[1] = INFINITY;
    return 0;
}

static void test_rows(void)
{
    const char *dir = strdup(test_tmpdir("rows"));
    embkv_options o = opts(DIM, 2);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float v[DIM], w[DIM], st[2] = { 1.5f, -2.5f }, st2[2];
    embkv_rowinfo info;
    const int64_t id = -777000111222;

    make_vec(id, 1, v, DIM);
    CHECK_RC(embkv_put(s, id, v, st, EMBKV_PUT_INSERT), EMBKV_OK);
    make_vec(id, 2, v, DIM);
    CHECK_RC(embkv_put(s, id, v, st, 0), EMBKV_OK);  /* clock 1 */

    /* insert-only put of a present id: EXISTS, row untouched */
    float other[DIM], ost[2] = { 9, 9 };
    make_vec(id, 3, other, DIM);
    CHECK_RC(embkv_put(s, id, other, ost, EMBKV_PUT_INSERT), EMBKV_EXISTS);
    check_msg_id(id);
    CHECK_RC(embkv_get(s, id, w, st2, &info), EMBKV_OK);
    CHECK(memcmp(v, w, sizeof v) == 0);
    CHECK(st2[0] == 1.5f && st2[1] == -2.5f);
    CHECK(info.clock == 1);

    /* the message stays until the next failure on this thread */
    CHECK(embkv_exists(s, id) == 1);
    check_msg_id(id);
    pthread_t th;
    pthread_create(&th, NULL, other_thread, s);
    pthread_join(th, NULL);
    check_msg_id(id);

    /* NaN or infinity in a vector or its state: refused naming the id and
     * the element, the row untouched */
    float nanv[DIM], bst[2] = {0, 0};
    memcpy(nanv, other, sizeof nanv);
    nanv[DIM - 1] = NAN;
    CHECK_RC(embkv_put(s, id, nanv, NULL, 0), EMBKV_INVALID);
    check_msg_id(id);
    CHECK(strstr(embkv_errmsg(), "vector element 7 is NaN") != NULL);
    nanv[DIM - 1] = 0;
    nanv[0] = -INFINITY;
    CHECK_RC(embkv_put_clock(s, id, nanv, NULL, 5), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "vector element 0 is infinite") != NULL);
    bst[1] = INFINITY;
    CHECK_RC(embkv_put(s, 31337, other, bst, EMBKV_PUT_INSERT), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "id 31337: state element 1 is infinite") != NULL);
    CHECK(embkv_exists(s, 31337) == 0);
    CHECK_RC(embkv_get(s, id, w, st2, &info), EMBKV_OK);
    CHECK(memcmp(v, w, sizeof v) == 0 && info.clock == 1);

    /* update-only put, delete and get of a missing id: NOTFOUND, nothing made */
    const int64_t miss = 9000000000000000001;
    CHECK_RC(embkv_put(s, miss, v, NULL, EMBKV_PUT_UPDATE), EMBKV_NOTFOUND);
    check_msg_id(miss);
    CHECK(embkv_exists(s, miss) == 0);
    CHECK(embkv_count(s) == 1);
    CHECK_RC(embkv_delete(s, INT64_MIN), EMBKV_NOTFOUND);
    check_msg_id(INT64_MIN);
    CHECK_RC(embkv_get(s, INT64_MAX, w, NULL, NULL), EMBKV_NOTFOUND);
    check_msg_id(INT64_MAX);
    CHECK(embkv_count(s) == 1);

    /* a missing id in update_batch without CREATE: reported, not written */
    size_t nupd = 99;
    int64_t ids[2] = { miss, id };
    int calls[2] = { 0, 0 };
    CHECK_RC(embkv_update_batch(s, ids, 2, null_vec_fn, calls, 0, &nupd), EMBKV_OK);
    CHECK(calls[0] == 1 && calls[1] == 1);  /* one NULL-vector call, one real */
    CHECK(nupd == 0);                       /* the real one skipped itself */
    CHECK(embkv_exists(s, miss) == 0);
    CHECK_RC(embkv_update_batch(s, ids, 2, NULL, NULL, 0, &nupd), EMBKV_INVALID);  /* fn NULL */

    /* a callback that leaves a NaN or an infinity: refused naming the id,
     * the row as it was; the row before it in the batch is written */
    float base[DIM] = {10};
    CHECK_RC(embkv_put(s, 31338, base, NULL, 0), EMBKV_OK);
    int64_t pair[2] = {31338, id};
    for (int which = 0; which < 2; which++) {
        nupd = 99;
        CHECK_RC(embkv_update_batch(s, pair, 2, not_finite_fn, &which, 0, &nupd), EMBKV_INVALID);
        char want[200];
        snprintf(want, sizeof want, "id %lld: the callback left %s: rows hold finite values only; the row is left "
                 "as it was", (long long)id, which == 0 ? "vector element 3 NaN" : "state element 1 infinite");
        CHECK(strstr(embkv_errmsg(), want) != NULL);
        CHECK(nupd == 1);
        CHECK_RC(embkv_get(s, 31338, w, NULL, NULL), EMBKV_OK);
        CHECK(w[0] == 11 + which);
        CHECK_RC(embkv_get(s, id, w, st2, &info), EMBKV_OK);
        CHECK(memcmp(v, w, sizeof v) == 0 && info.clock == 1 && st2[1] == -2.5f);
    }
    CHECK_RC(embkv_delete(s, 31338), EMBKV_OK);

    /* index growth for more ids than 2^64 less the rows: refused, not
     * wrapped round to a count that fits */
    CHECK_RC(embkv_grow_index_for(s, UINT64_MAX), EMBKV_FULL);
    CHECK(strstr(embkv_errmsg(), "does not fit the pool") != NULL);
    CHECK_RC(embkv_grow_index_for(s, UINT64_MAX - embkv_count(s) + 1), EMBKV_FULL);
    CHECK_RC(embkv_grow_index_for(s, 10), EMBKV_OK);

    /* NULL arguments on a live store */
    CHECK_RC(embkv_put(s, 5, NULL, NULL, 0), EMBKV_INVALID);
    CHECK(embkv_exists(s, 5) == 0);
    float out[2 * DIM];
    CHECK_RC(embkv_get_batch(s, NULL, 2, out, NULL, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_get_batch(s, ids, 2, NULL, NULL, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_scan(s, NULL, NULL), EMBKV_INVALID);
    uint64_t pos = 0;
    size_t n = 0;
    int64_t few[16];
    CHECK_RC(embkv_scan_ids(s, &pos, few, 16, &n), EMBKV_INVALID);  /* cap < 64 */
    int64_t room[64];
    pos = UINT64_MAX;  /* (not a position a scan gave: not a resize either) */
    CHECK_RC(embkv_scan_ids(s, &pos, room, 64, &n), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "position 18446744073709551615 is not one embkv_scan_ids gave: start a scan at 0")
          != NULL);
    pos = 0;
    CHECK_RC(embkv_scan_ids(s, NULL, few, 64, &n), EMBKV_INVALID);
    CHECK_RC(embkv_hotset(s, NULL, 3, NULL), EMBKV_INVALID);
    CHECK_RC(embkv_stats_get(s, NULL), EMBKV_INVALID);

    /* NULL store handles, in a child so that a crash is one clear failure */
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        bad |= embkv_get(NULL, 1, w, NULL, NULL) != EMBKV_INVALID;
        bad |= (embkv_put(NULL, 1, v, NULL, 0) != EMBKV_INVALID) << 1;
        bad |= (embkv_delete(NULL, 1) != EMBKV_INVALID) << 2;
        bad |= (embkv_sync(NULL) != EMBKV_INVALID) << 3;
        bad |= (embkv_close(NULL) != EMBKV_INVALID) << 4;
        bad |= (embkv_check(NULL) != EMBKV_INVALID) << 5;
        _exit(bad);
    }
    int wst = 0;
    waitpid(pid, &wst, 0);
    CHECK(WIFEXITED(wst));
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst))
        fprintf(stderr, "    NULL-store child: status 0x%x\n", wst);

    /* still fully usable */
    CHECK_RC(embkv_get(s, id, w, st2, &info), EMBKV_OK);
    CHECK(memcmp(v, w, sizeof v) == 0 && info.clock == 1);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);

    /* dim / state_floats mismatch on reopen: closed store */
    embkv_options bad = opts(DIM * 2, 2);
    CHECK_RC(embkv_open(dir, &bad, 0, &s), EMBKV_INVALID);
    CHECK_MSG("dim");
    CHECK_RC(embkv_open(dir, &bad, EMBKV_OPEN_CREATE, &s), EMBKV_INVALID);
    bad = opts(DIM, 3);
    CHECK_RC(embkv_open(dir, &bad, 0, &s), EMBKV_INVALID);
    CHECK_MSG("state_floats");

    /* ... and while it is open: refused without taking a reference */
    embkv_store *s1 = NULL, *s2 = NULL;
    CHECK_RC(embkv_open(dir, &o, 0, &s1), EMBKV_OK);
    bad = opts(DIM + 1, 2);
    CHECK_RC(embkv_open(dir, &bad, 0, &s2), EMBKV_INVALID);
    CHECK_MSG("dim");
    if (s1) {
        CHECK_RC(embkv_get(s1, id, w, NULL, NULL), EMBKV_OK);
        CHECK(memcmp(v, w, sizeof v) == 0);
        CHECK_RC(embkv_close(s1), EMBKV_OK);
    }
    /* one close was enough: another process can open it now */
    CHECK(run_child("try", dir) == EMBKV_OK);
    free((void *)dir);
}

/* Insert rows into a small pool until EMBKV_FULL. */
static void test_full(void)
{
    const char *dir = strdup(test_tmpdir("full"));
    const uint32_t dim = 1024;   /* 4 KiB rows: 16 MiB holds a few thousand */
    embkv_options o = opts(dim, 0);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float *v = malloc(dim * sizeof *v), *w = malloc(dim * sizeof *w);
    uint8_t *present = calloc(20000, 1);
    uint32_t *ver = calloc(20000, sizeof *ver);
    int64_t n = 0;
    int rc = EMBKV_OK;
    for (; n < 20000; n++) {
        make_vec(n, 1, v, dim);
        rc = embkv_put(s, n, v, NULL, EMBKV_PUT_INSERT);
        if (rc != EMBKV_OK) break;
        present[n] = 1;
        ver[n] = 1;
    }
    CHECK_RC(rc, EMBKV_FULL);
    printf("  pool of 16 MiB full after %" PRId64 " rows of %u floats\n", n, dim);
    /* at least half the pool holds rows (libpmemobj's own metadata takes
     * a few MiB, the rest is the engine's to use) */
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.pool_bytes == o.pool_size);
    CHECK((double)n * (double)st.record_bytes >= 0.5 * (double)st.pool_bytes);
    printf("  pool_used_bytes %" PRIu64 " of %" PRIu64 " (%.0f%% in rows) at EMBKV_FULL\n",
           st.pool_used_bytes, st.pool_bytes,
           100.0 * (double)n * (double)st.record_bytes / (double)st.pool_bytes);
    CHECK(embkv_exists(s, n) == 0);
    CHECK(embkv_count(s) == (uint64_t)n);
    CHECK(strlen(embkv_errmsg()) > 0);
    rc = embkv_put(s, n, v, NULL, 0);  /* still full */
    CHECK_RC(rc, EMBKV_FULL);
    CHECK(embkv_exists(s, n) == 0);

    /* a replacing put on a full pool either lands or leaves the old row */
    make_vec(7, 2, v, dim);
    rc = embkv_put(s, 7, v, NULL, 0);
    CHECK(rc == EMBKV_OK || rc == EMBKV_FULL);
    if (rc == EMBKV_OK) ver[7] = 2;

    for (int64_t i = 0; i < n; i++) {
        make_vec(i, ver[i], v, dim);
        CHECK_RC(embkv_get(s, i, w, NULL, NULL), EMBKV_OK);
        CHECK(memcmp(v, w, dim * sizeof *v) == 0);
    }
    CHECK_RC(embkv_check(s), EMBKV_OK);

    /* delete every other row (a full pool must still take deletes: they are
     * how room is made); after a sync the room is reusable */
    int64_t freed = 0, refused = 0;
    for (int64_t i = 0; i < n; i += 2) {
        rc = embkv_delete(s, i);
        if (rc != EMBKV_OK) { refused++; continue; }
        present[i] = 0;
        freed++;
    }
    CHECK(refused == 0);
    if (refused) fprintf(stderr, "    %" PRId64 " deletes refused on the full pool: %s\n", refused,
                         embkv_errmsg());
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    int64_t added = 0;
    for (int64_t id = 100000; added < freed; id++, added++) {
        make_vec(id, 1, v, dim);
        rc = embkv_put(s, id, v, NULL, EMBKV_PUT_INSERT);
        if (rc != EMBKV_OK) break;
    }
    CHECK(added >= freed / 2);
    printf("  freed %" PRId64 " rows, inserted %" PRId64 " new ones\n", freed, added);
    uint64_t want = (uint64_t)(n - freed + added);
    CHECK(embkv_count(s) == want);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);

    /* reopen: exactly what was there */
    s = NULL;
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_count(s) == want);
        for (int64_t i = 0; i < n; i++) {
            rc = embkv_get(s, i, w, NULL, NULL);
            CHECK_RC(rc, present[i] ? EMBKV_OK : EMBKV_NOTFOUND);
            make_vec(i, ver[i], v, dim);
            if (present[i] && rc == EMBKV_OK) CHECK(memcmp(v, w, dim * sizeof *v) == 0);
        }
        for (int64_t i = 0; i < added; i++) {
            make_vec(100000 + i, 1, v, dim);
            CHECK_RC(embkv_get(s, 100000 + i, w, NULL, NULL), EMBKV_OK);
            CHECK(memcmp(v, w, dim * sizeof *v) == 0);
        }
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    free(v);
    free(w);
    free(present);
    free(ver);
    free((void *)dir);
}

/* The advice of a full pool works when followed: a pool full of versions
 * that a checkpoint frees says to checkpoint and retry, and the retry
 * lands; a pool full of live rows says a checkpoint frees nothing. */
static void test_full_advice(void)
{
    const char *dir = strdup(test_tmpdir("fulladvice"));
    const uint32_t dim = 1024;
    embkv_options o = opts(dim, 0);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float *v = malloc(dim * sizeof *v);
    int64_t n = 0;
    int rc = EMBKV_OK;
    for (; n < 20000 && rc == EMBKV_OK; n++) {
        make_vec(n, 1, v, dim);
        rc = embkv_put(s, n, v, NULL, EMBKV_PUT_INSERT);
    }
    n--;  /* the last put failed */
    CHECK_RC(rc, EMBKV_FULL);
    CHECK(strstr(embkv_errmsg(), "0 records hold versions replaced or deleted since the last checkpoint") != NULL);
    CHECK(strstr(embkv_errmsg(), "a checkpoint frees nothing: delete rows") != NULL);
    /* room for a quarter of the rows again, then replace rows until full */
    for (int64_t i = 0; i < n; i += 4) CHECK_RC(embkv_delete(s, i), EMBKV_OK);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    int64_t replaced = 0, id = 1;
    for (rc = EMBKV_OK; rc == EMBKV_OK && replaced < 4 * n; replaced++, id = id % 4 == 3 ? id + 2 : id + 1) {
        if (id >= n) id = 1;
        make_vec(id, 2, v, dim);
        rc = embkv_put(s, id, v, NULL, 0);
    }
    CHECK_RC(rc, EMBKV_FULL);
    const char *msg = embkv_errmsg();
    CHECK(strstr(msg, "checkpoint (embkv_sync; in SQL embkv_checkpoint) and retry") != NULL ||
          strstr(msg, "checkpoint (embkv_sync; in SQL embkv_checkpoint), then retry") != NULL);
    if (!strstr(msg, "retry")) fprintf(stderr, "    %s\n", msg);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free(v);
    free((void *)dir);
}

/* A full pool whose rows are all synced: each delete needs a tombstone,
 * which the delete reserve provides; when the reserve is used up, a sync
 * returns it, so the table can always be emptied. */
static void test_full_synced_deletes(void)
{
    const char *dir = strdup(test_tmpdir("fulldel"));
    const uint32_t dim = 1024;
    embkv_options o = opts(dim, 0);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float *v = malloc(dim * sizeof *v), *w = malloc(dim * sizeof *w);
    int64_t n = 0;
    int rc;
    for (;; n++) {
        make_vec(n, 1, v, dim);
        if ((rc = embkv_put(s, n, v, NULL, EMBKV_PUT_INSERT)) != EMBKV_OK) break;
    }
    CHECK_RC(rc, EMBKV_FULL);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    int64_t next = 0, rounds = 0, first_round = -1;
    while (next < n && rounds < 1000) {
        int64_t k = 0;
        while (next < n && (rc = embkv_delete(s, next)) == EMBKV_OK) {
            next++;
            k++;
        }
        if (first_round < 0) first_round = k;
        if (next < n) {
            CHECK_RC(rc, EMBKV_FULL);
            CHECK(strstr(embkv_errmsg(), "reserve for deletes") != NULL);
            CHECK(k > 0);  /* every round makes progress */
            /* No record left: the room check says a checkpoint frees them
             * (not "delete at most 0 rows"). */
            CHECK_RC(embkv_room_for(s, 0, 10), EMBKV_FULL);
            CHECK(strstr(embkv_errmsg(), "no room for 10 deletes: the pool is full and has no free record") != NULL);
            CHECK(strstr(embkv_errmsg(), "checkpoint (embkv_sync; in SQL embkv_checkpoint), then retry") != NULL);
            CHECK(strstr(embkv_errmsg(), "delete at most") == NULL);
            /* the row whose delete failed is untouched */
            make_vec(next, 1, v, dim);
            CHECK_RC(embkv_get(s, next, w, NULL, NULL), EMBKV_OK);
            CHECK(memcmp(v, w, dim * sizeof *v) == 0);
        }
        CHECK_RC(embkv_sync(s), EMBKV_OK);
        rounds++;
    }
    printf("  %" PRId64 " synced rows deleted from a full pool in %" PRId64 " rounds (%" PRId64 " in the first)\n",
           n, rounds, first_round);
    CHECK(next == n);
    CHECK(rounds > 1);  /* the reserve is smaller than the table */
    CHECK(embkv_count(s) == 0);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    /* the room is reusable */
    for (int64_t id = 0; id < n / 2; id++) {
        make_vec(id, 2, v, dim);
        CHECK_RC(embkv_put(s, id, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
    }
    CHECK_RC(embkv_close(s), EMBKV_OK);
    s = NULL;
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_count(s) == (uint64_t)(n / 2));
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    free(v);
    free(w);
    free((void *)dir);
}

/* A child forked while the store was open keeps its lock (the child
 * shares the lock file's open file): the parent's reopen after its close
 * is refused naming fork, not another copy of embkv in this process. */
static void test_locked_by_a_child(void)
{
    char *dir = strdup(test_tmpdir("forked"));
    embkv_options o = opts(DIM, 0);
    embkv_store *s = dir ? create_with_rows(dir, 1, 5) : NULL;
    if (!s) {
        free(dir);
        return;
    }
    int p[2];
    CHECK(pipe(p) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(p[1]);
        while (read(p[0], &c, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    close(p[0]);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    s = NULL;
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_LOCKED);
    char want[200];
    snprintf(want, sizeof want, "is open in another process (its lock names pid %ld, this process's number: a child "
             "that inherited it through fork, or a process of another PID namespace): one process at a time",
             (long)getpid());
    CHECK(strstr(embkv_errmsg(), want) != NULL);
    if (!strstr(embkv_errmsg(), want))
        fprintf(stderr, "got: %s\n", embkv_errmsg());
    close(p[1]);
    CHECK(waitpid(pid, NULL, 0) == pid);
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_count(s) == 5);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    free(dir);
}

/* Two processes, one store. */
static void test_locked(void)
{
    const char *dir = strdup(test_tmpdir("locked"));
    embkv_options o = opts(DIM, 0);
    float v[DIM], w[DIM];
    embkv_store *s = create_with_rows(dir, 1, 50);
    if (!s) return;
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    make_vec(1, 2, v, DIM);
    CHECK_RC(embkv_put(s, 1, v, NULL, 0), EMBKV_OK);  /* not yet synced */

    /* another process, while this one has it open */
    CHECK(run_child("try", dir) == EMBKV_LOCKED);
    CHECK(run_child("tryc", dir) == EMBKV_LOCKED);
    CHECK(embkv_count(s) == 50);
    CHECK_RC(embkv_get(s, 1, w, NULL, NULL), EMBKV_OK);
    CHECK(memcmp(v, w, sizeof v) == 0);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);

    /* the other way round: the child holds it, this process is refused */
    holder h = start_holder(dir);
    uint64_t dh = dir_hash(dir);
    s = NULL;
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_LOCKED);
    CHECK_MSG(dir);
    char pid_advice[200];
    snprintf(pid_advice, sizeof pid_advice, "is open in another process (pid %ld): one process at a time may write "
             "a store: close it there first, or read it beside that process with EMBKV_OPEN_READONLY", (long)h.pid);
    CHECK(strstr(embkv_errmsg(), pid_advice) != NULL);
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_LOCKED);
    CHECK(dir_hash(dir) == dh);
    /* the advice followed: a reader beside the writer */
    CHECK_RC(embkv_open(dir, NULL, EMBKV_OPEN_READONLY, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_count(s) == 50);
        CHECK_RC(embkv_close(s), EMBKV_OK);
        s = NULL;
    }
    CHECK(stop_holder(h) == 0);

    /* released: open again, everything as it was */
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_count(s) == 50);
        for (int64_t id = 1; id <= 50; id++) {
            make_vec(id, id == 1 ? 2 : 1, v, DIM);
            CHECK_RC(embkv_get(s, id, w, NULL, NULL), EMBKV_OK);
            CHECK(memcmp(v, w, sizeof v) == 0);
        }
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    free((void *)dir);
}

/* A process (not an embkv writer: LOCK is free) holding the pool file's
 * flock for ms milliseconds (0: until killed), as a probe child of an
 * opener killed a moment ago does while it dies; its pid, once it holds it. */
static pid_t hold_pool_flock(const char *dir, int ms)
{
    char pool[700];
    snprintf(pool, sizeof pool, "%s/store.pool", dir);
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        int fd = open(pool, O_RDWR);
        if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0) _exit(1);
        if (write(pfd[1], "x", 1) != 1) _exit(1);
        if (ms) {
            struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
            nanosleep(&t, NULL);
        } else {
            for (;;) pause();
        }
        _exit(0);
    }
    close(pfd[1]);
    char c;
    bool held = pid > 0 && read(pfd[0], &c, 1) == 1;
    close(pfd[0]);
    return held ? pid : -1;
}

/* dir's store opens as a writer, row 7 at version 1 in it. */
static void opens_with_row7(const char *dir)
{
    embkv_options o = opts(DIM, 0);
    embkv_store *s = NULL;
    float v[DIM], w[DIM];
    make_vec(7, 1, v, DIM);
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_OK);
    if (s) {
        CHECK_RC(embkv_get(s, 7, w, NULL, NULL), EMBKV_OK);
        CHECK(memcmp(v, w, sizeof v) == 0);
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
}

static void test_pool_flock(void)
{
    const char *dir = strdup(test_tmpdir("poolflock"));
    embkv_options o = opts(DIM, 0);
    embkv_store *s = create_with_rows(dir, 7, 1);
    if (!s) return;
    CHECK_RC(embkv_close(s), EMBKV_OK);
    /* held for 300 ms: the open waits it out */
    pid_t h = hold_pool_flock(dir, 300);
    CHECK(h > 0);
    opens_with_row7(dir);
    int st;
    if (h > 0) CHECK(waitpid(h, &st, 0) == h && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* held on: refused after the wait, naming the file and what to do;
     * the store opens once the holder is gone */
    h = hold_pool_flock(dir, 0);
    CHECK(h > 0);
    s = NULL;
    CHECK_RC(embkv_open(dir, &o, 0, &s), EMBKV_BUSY);
    CHECK_MSG("store.pool is locked by another process that is not an embkv writer");
    CHECK_MSG("stop the program that has the file open");
    if (h > 0) {
        kill(h, SIGKILL);
        CHECK(waitpid(h, &st, 0) == h);
    }
    opens_with_row7(dir);
    free((void *)dir);
}

/* embkv_destroy removes a closed store, and only that. */
static void test_destroy(void)
{
    const char *dir = strdup(test_tmpdir("destroy"));
    embkv_options o = opts(DIM, 0);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    CHECK_RC(embkv_destroy(dir), EMBKV_LOCKED);  /* open in this process */
    CHECK(access(dir, F_OK) == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    holder h = start_holder(dir);
    CHECK_RC(embkv_destroy(dir), EMBKV_LOCKED);  /* open in another */
    char want[64];
    snprintf(want, sizeof want, "open in another process (pid %ld)", (long)h.pid);
    CHECK(strstr(embkv_errmsg(), want) != NULL);
    CHECK(stop_holder(h) == 0);
    char other[700];
    snprintf(other, sizeof other, "%s/notes.txt", dir);
    FILE *f = fopen(other, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    CHECK_RC(embkv_destroy(dir), EMBKV_NOTSTORE);  /* not all ours: nothing removed */
    CHECK(strstr(embkv_errmsg(), "notes.txt") != NULL);
    CHECK(access(dir, F_OK) == 0);
    unlink(other);
    CHECK_RC(embkv_destroy(dir), EMBKV_OK);
    CHECK(access(dir, F_OK) != 0);
    CHECK_RC(embkv_destroy(dir), EMBKV_NOTSTORE);
    CHECK(strstr(embkv_errmsg(), ": the directory does not exist") != NULL);
    /* a file: said to be one (after a call that left errno ENOENT) */
    FILE *plain = fopen(dir, "w");
    CHECK(plain && fclose(plain) == 0);
    CHECK_RC(embkv_destroy(dir), EMBKV_NOTSTORE);
    CHECK(strstr(embkv_errmsg(), ": not a directory") != NULL);
    CHECK(access(dir, F_OK) == 0);
    unlink(dir);
    /* a symbolic link to a store: that store removed (not its files only,
     * then an error), the link left dangling */
    embkv_store *ls = NULL;
    embkv_options lo = opts(DIM, 0);
    CHECK_RC(embkv_open(dir, &lo, EMBKV_OPEN_CREATE, &ls), EMBKV_OK);
    if (ls)
        CHECK_RC(embkv_close(ls), EMBKV_OK);
    char link[PATH_MAX];
    snprintf(link, sizeof link, "%s-link", dir);
    CHECK(symlink(dir, link) == 0);
    CHECK_RC(embkv_destroy(link), EMBKV_OK);
    CHECK(access(dir, F_OK) != 0);
    struct stat lst;
    CHECK(lstat(link, &lst) == 0 && S_ISLNK(lst.st_mode));
    unlink(link);
    free((void *)dir);
}

/* ---- calls from inside an update callback ------------------------------ */

#define CB_CALLS 10
typedef struct cb_ctx {
    embkv_store *s;
    int rc[CB_CALLS];          /* the first row's calls */
    int got;                   /* embkv_get of the row itself inside its callback */
    int scanned, searched;     /* embkv_scan and embkv_knn there */
    float seen0;               /* ...its element 0 */
    bool bad_msg;              /* a refusal without the callback's message */
    int calls;
} cb_ctx;

static int cb_scan_fn(void *ctx, int64_t id, const float *vec, const float *st, const embkv_rowinfo *ri)
{
    (void)ctx; (void)id; (void)vec; (void)st; (void)ri;
    return 0;
}

static int cb_nested_fn(void *ctx, size_t i, int64_t id, float *vec, float *st)
{
    (void)ctx; (void)i; (void)id; (void)vec; (void)st;
    return 0;
}

static int cb_writer(void *ctx, size_t i, int64_t id, float *vec, float *state)
{
    (void)i; (void)state;
    cb_ctx *c = ctx;
    if (c->calls++ || !vec)
        return 0;
    embkv_store *s = c->s;
    float v[DIM] = {0}, q[DIM] = {0};
    double dist[1];
    int64_t other = id + 1, kid[1];
    size_t found, nupd;
    embkv_snapshot *snap = NULL;
    embkv_backup *b = NULL;
    int k = 0;
    c->rc[k++] = embkv_put(s, id, v, NULL, 0);              /* the row the batch holds */
    c->rc[k++] = embkv_put(s, other, v, NULL, 0);           /* another row (its stripe may be held) */
    c->rc[k++] = embkv_put_clock(s, 500, v, NULL, 1);
    c->rc[k++] = embkv_delete(s, id);
    c->rc[k++] = embkv_update_batch(s, &other, 1, cb_nested_fn, NULL, 0, &nupd);
    c->rc[k++] = embkv_group_begin(s);
    c->rc[k++] = embkv_sync(s);
    c->rc[k++] = embkv_check(s);
    c->rc[k++] = embkv_snapshot_open(s, &snap);
    c->rc[k++] = embkv_backup_begin(s, test_tmpdir("cb_backup"), &b);
    for (int j = 0; j < k; j++)
        if (c->rc[j] != EMBKV_OK && !strstr(embkv_errmsg(), "inside an embkv_update_batch callback"))
            c->bad_msg = true;
    /* (the last message: the backup's) */
    if (!strstr(embkv_errmsg(), "embkv_backup_begin inside an embkv_update_batch callback"))
        c->bad_msg = true;
    if (snap) embkv_snapshot_close(snap);
    if (b) embkv_backup_finish(b, NULL);
    /* Reads and pins do not wait for the batch. */
    float w[DIM];
    c->got = embkv_get(s, id, w, NULL, NULL);
    c->seen0 = w[0];
    c->scanned = embkv_scan(s, cb_scan_fn, NULL);
    c->searched = embkv_knn(s, q, 1, 1, NULL, kid, dist, &found);
    embkv_scan_pin(s);
    embkv_scan_unpin(s);
    vec[0] += 1;
    return 0;
}

static void test_update_callback(void)
{
    /* A hang (the old behaviour of the first put) fails the test. */
    alarm(20);
    for (int cached = 0; cached < 2; cached++) {
        const char *dir = test_tmpdir(cached ? "cb_cached" : "cb_plain");
        embkv_options o = opts(DIM, 0);
        o.cache_size = cached ? 1u << 20 : 0;
        embkv_store *s = NULL;
        float v[DIM], before[DIM];
        CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
        if (!s) continue;
        for (int64_t id = 1; id <= 3; id++) {
            make_vec(id, 1, v, DIM);
            CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
        }
        CHECK_RC(embkv_get(s, 1, before, NULL, NULL), EMBKV_OK);
        cb_ctx c = {.s = s};
        int64_t ids[2] = {1, 2};
        size_t nupd = 0;
        CHECK_RC(embkv_update_batch(s, ids, 2, cb_writer, &c, 0, &nupd), EMBKV_OK);
        CHECK(nupd == 2 && c.calls == 2);
        for (int j = 0; j < CB_CALLS; j++) {
            CHECK_RC(c.rc[j], EMBKV_BUSY);
            if (c.rc[j] != EMBKV_BUSY) fprintf(stderr, "    (call %d of the callback)\n", j);
        }
        CHECK(!c.bad_msg);
        CHECK_RC(c.got, EMBKV_OK);
        CHECK(c.seen0 == before[0]);  /* the row as it was before the batch */
        CHECK_RC(c.scanned, EMBKV_OK);
        CHECK_RC(c.searched, EMBKV_OK);
        /* Nothing the callback tried went in; the batch's own update did. */
        CHECK_RC(embkv_get(s, 1, v, NULL, NULL), EMBKV_OK);
        CHECK(v[0] == before[0] + 1);
        CHECK_RC(embkv_get(s, 500, v, NULL, NULL), EMBKV_NOTFOUND);
        CHECK(embkv_count(s) == 3);
        /* Outside the callback all of it works again. */
        make_vec(4, 1, v, DIM);
        CHECK_RC(embkv_put(s, 4, v, NULL, 0), EMBKV_OK);
        CHECK_RC(embkv_sync(s), EMBKV_OK);
        CHECK_RC(embkv_check(s), EMBKV_OK);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    alarm(0);
}

/* ---- misuse of handles ------------------------------------------------ */

/* embkv_close inside the thread's own write group: EMBKV_BUSY for the last
 * reference and for another, the handle still usable, nothing lost (a
 * last close that freed the store there would lose the unsynced rows, and
 * the group's end would touch freed memory). */
static void test_close_in_group(void)
{
    const char *dir = strdup(test_tmpdir("close_in_group"));
    embkv_store *s = create_with_rows(dir, 0, 20);
    if (!s) return;
    float v[DIM];
    make_vec(1000, 1, v, DIM);
    CHECK_RC(embkv_group_begin(s), EMBKV_OK);
    CHECK_RC(embkv_put(s, 1000, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_BUSY);  /* the last reference */
    CHECK_MSG(dir);
    CHECK_MSG("embkv_group_end");
    embkv_store *s2 = NULL;  /* another reference: refused the same */
    CHECK_RC(embkv_open(dir, NULL, 0, &s2), EMBKV_OK);
    CHECK(s2 == s);
    CHECK_RC(embkv_close(s2), EMBKV_BUSY);
    CHECK_RC(embkv_put(s, 1001, v, NULL, 0), EMBKV_OK);  /* still usable */
    /* A backup finished inside the group lets its own reference go (it
     * is not the last): the store still closes below. */
    char *bdir = strdup(test_tmpdir("close_in_group.bak"));
    embkv_group_end(s);
    embkv_backup *b = NULL;
    CHECK_RC(embkv_backup_begin(s, bdir, &b), EMBKV_OK);
    CHECK_RC(embkv_group_begin(s), EMBKV_OK);
    int done = 0;
    if (b) CHECK_RC(embkv_backup_step(b, 0, &done), EMBKV_OK);
    if (b) CHECK_RC(embkv_backup_finish(b, NULL), EMBKV_OK);
    embkv_group_end(s);
    free(bdir);
    CHECK(embkv_count(s) == 22);
    CHECK_RC(embkv_close(s2), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    s = NULL;
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    if (s) {
        embkv_stats st;
        CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
        CHECK(st.recovered == 0);
        CHECK(embkv_count(s) == 22);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    CHECK(run_child("try", dir) == EMBKV_OK);  /* closed: another process opens it */
    free((void *)dir);
}

/* The last reference's close with a session or a snapshot open: EMBKV_BUSY
 * saying how many, the handle still usable, and once they are closed the
 * close goes through (a close that freed the store under them would make
 * their close read freed memory).  Another reference's close goes on. */
static void test_close_with_open(void)
{
    const char *dir = strdup(test_tmpdir("close_with_open"));
    embkv_store *s = create_with_rows(dir, 0, 4);
    if (!s) return;
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    embkv_session *ss = NULL;
    embkv_snapshot *snap = NULL;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    CHECK_RC(embkv_snapshot_open(s, &snap), EMBKV_OK);
    embkv_store *s2 = NULL;
    CHECK_RC(embkv_open(dir, NULL, 0, &s2), EMBKV_OK);
    CHECK_RC(embkv_close(s2), EMBKV_OK);  /* not the last */
    CHECK_RC(embkv_close(s), EMBKV_BUSY);
    CHECK_MSG(dir);
    CHECK_MSG("1 session and 1 snapshot");
    CHECK_MSG("close them first");
    int64_t ids[2] = {1, 100};
    float out[2 * DIM];
    CHECK_RC(embkv_pull(ss, ids, 2, out), EMBKV_OK);  /* still usable */
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_BUSY);
    CHECK_MSG("0 sessions and 1 snapshot");
    uint8_t found[2];
    CHECK_RC(embkv_get_batch_at(s, snap, ids, 2, out, NULL, found, NULL), EMBKV_OK);
    CHECK(found[0] == 1 && found[1] == 0);  /* as of the snapshot */
    embkv_snapshot_close(snap);
    CHECK(embkv_count(s) == 5);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free((void *)dir);
}

/* A snapshot of another store given to the *_at reads: EMBKV_INVALID
 * naming both stores (it read the current rows of the store given, rc 0). */
static void test_foreign_snapshot(void)
{
    char *da = strdup(test_tmpdir("snap_a")), *db = strdup(test_tmpdir("snap_b"));
    embkv_store *a = create_with_rows(da, 0, 4), *b = create_with_rows(db, 100, 4);
    embkv_snapshot *sb = NULL;
    if (a && b && embkv_snapshot_open(b, &sb) == EMBKV_OK) {
        int64_t ids[2] = {1, 2};
        float out[2 * DIM];
        float state[2];
        int tier[2];
        uint8_t found[2] = {9, 9};
        CHECK_RC(embkv_get_batch_at(a, sb, ids, 2, out, NULL, found, NULL), EMBKV_INVALID);
        CHECK_MSG(da);
        CHECK_MSG(db);
        CHECK(found[0] == 9);  /* nothing written */
        CHECK_RC(embkv_get_rows_at(a, sb, ids, 2, out, state, NULL, found, NULL), EMBKV_INVALID);
        CHECK_MSG("embkv_get_rows_at");
        CHECK_RC(embkv_locate_batch_at(a, sb, ids, 2, tier, found), EMBKV_INVALID);
        CHECK_MSG("embkv_locate_batch_at");
        CHECK_RC(embkv_get_batch_at(b, sb, ids, 2, out, NULL, found, NULL), EMBKV_OK);  /* its own */
        embkv_snapshot_close(sb);
    }
    if (a) CHECK_RC(embkv_close(a), EMBKV_OK);
    if (b) CHECK_RC(embkv_close(b), EMBKV_OK);
    free(da);
    free(db);
}

/* NULL across the API: an rc names the argument; accessors give 0 or
 * NULL; embkv_exists_batch's found may be NULL (its count is the answer).
 * The accessors, embkv_exists_batch with NULL found, ids or store,
 * embkv_scan_pin, embkv_train_defaults and embkv_dtype_round with NULL
 * arrays read or wrote through NULL. */
static void test_nulls(void)
{
    const char *dir = strdup(test_tmpdir("nulls"));
    embkv_store *s = create_with_rows(dir, 0, 4);
    if (!s) return;
    int64_t ids[3] = {1, 2, 100};
    uint8_t found[3] = {9, 9, 9};
    CHECK(embkv_exists_batch(s, ids, 3, NULL) == 1);  /* the count alone */
    int64_t many[600];
    for (int i = 0; i < 600; i++) many[i] = i - 300;  /* (over its buffer of 256) */
    CHECK(embkv_exists_batch(s, many, 600, NULL) == 596);
    CHECK(embkv_exists_batch(s, NULL, 3, found) == 3);
    CHECK_MSG("argument ids is NULL");
    CHECK(found[0] == 0 && found[2] == 0);
    CHECK(embkv_exists_batch(s, NULL, 0, NULL) == 0);
    float out[3 * DIM], one[DIM] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_RC(embkv_get_batch(s, ids, 3, NULL, NULL, NULL), EMBKV_INVALID);
    CHECK_MSG("argument out is NULL");
    int64_t oid[1];
    size_t nf;
    CHECK_RC(embkv_knn(s, one, 1, 1, NULL, oid, NULL, &nf), EMBKV_INVALID);
    CHECK_MSG("embkv_knn: argument out_dist is NULL");
    CHECK_RC(embkv_pull(NULL, ids, 3, out), EMBKV_INVALID);
    CHECK_MSG("argument ss is NULL");
    CHECK(embkv_dtype_round(EMBKV_F16, DIM, NULL, out) == 1);
    CHECK_MSG("argument in is NULL");
    CHECK(embkv_dtype_round(EMBKV_F16, DIM, one, NULL) == 1);
    CHECK(embkv_dtype_round(EMBKV_F16, 0, NULL, NULL) == 0);  /* nothing to round */
    pid_t pid = fork();
    if (pid == 0) {
        int bad = 0;
        bad |= embkv_dim(NULL) != 0;
        bad |= (embkv_state_floats(NULL) != 0) << 1;
        bad |= (embkv_dtype(NULL) != 0) << 2;
        bad |= (embkv_path(NULL) != NULL) << 3;
        bad |= (embkv_exists_batch(NULL, ids, 3, found) != 3 || found[1] != 0) << 4;
        bad |= (embkv_dtype_round(EMBKV_F16, 4, NULL, NULL) != 1) << 5;
        embkv_scan_pin(NULL);
        embkv_scan_unpin(NULL);
        embkv_train_defaults(NULL);
        bad |= (embkv_train_state_floats(NULL, DIM) != 0) << 6;
        _exit(bad);
    }
    int wst = 0;
    waitpid(pid, &wst, 0);
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst))
        fprintf(stderr, "    NULL child: status 0x%x\n", wst);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free((void *)dir);
}

/* Flag bits a function does not define: EMBKV_INVALID naming them in hex,
 * nothing done (embkv_open, embkv_put and embkv_update_batch dropped them
 * and succeeded). */
static void test_unknown_flags(void)
{
    const char *dir = strdup(test_tmpdir("flags"));
    embkv_options o = opts(DIM, 0);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE | 0x140, &s), EMBKV_INVALID);
    CHECK_MSG("0x140");
    CHECK_MSG("embkv_open");
    CHECK(s == NULL);
    CHECK(count_entries(dir) == -1);  /* nothing created */
    s = create_with_rows(dir, 0, 2);
    if (!s) return;
    float v[DIM] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_RC(embkv_put(s, 50, v, NULL, 0x1000), EMBKV_INVALID);
    CHECK_MSG("0x1000");
    CHECK_MSG("50");
    CHECK_RC(embkv_put(s, 50, v, NULL, EMBKV_PUT_INSERT | 0x80), EMBKV_INVALID);
    CHECK_MSG("0x80");
    CHECK_RC(embkv_put(s, 50, v, NULL, 0x100), EMBKV_INVALID);  /* (an internal bit) */
    CHECK(embkv_exists(s, 50) == 0);
    int64_t ids[1] = {60};
    size_t nu = 9;
    CHECK_RC(embkv_update_batch(s, ids, 1, null_vec_fn, (int[2]){0, 0}, EMBKV_UPDATE_CREATE | 0x80, &nu),
             EMBKV_INVALID);
    CHECK_MSG("0x80");
    CHECK(nu == 0 && embkv_exists(s, 60) == 0);
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    embkv_session *ss = NULL;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    float out[DIM];
    CHECK_RC(embkv_pull_ex(ss, ids, 1, out, 0x2), EMBKV_INVALID);
    CHECK_MSG("0x2");
    CHECK(embkv_exists(s, 60) == 0);
    embkv_session_close(ss);
    CHECK(embkv_count(s) == 2);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    free((void *)dir);
}

/* Eight processes creating one store at once: each one's open succeeds
 * or finds the store open in another (EMBKV_LOCKED); none fails on the
 * directory another had just made ("File exists"), and the store holds
 * the row of each that opened it. */
static void test_create_race(void)
{
    for (int round = 0; round < 6; round++) {
        char d[700];
        snprintf(d, sizeof d, "%.600s/race%d", test_tmpdir("create_race"), round);
        mkdir(test_tmpdir("create_race"), 0755);
        int go[2];
        CHECK(pipe(go) == 0);
        pid_t kids[8];
        for (int k = 0; k < 8; k++) {
            if ((kids[k] = fork()) == 0) {
                char c;
                close(go[1]);
                if (read(go[0], &c, 1) != 0)
                    _exit(99);
                embkv_options o = {.dim = 8, .pool_size = 16 << 20, .expected_rows = 1000};
                embkv_store *st = NULL;
                int r = embkv_open(d, &o, EMBKV_OPEN_CREATE, &st);
                if (r == EMBKV_OK) {
                    float v[8] = {(float)k};
                    r = embkv_put(st, k, v, NULL, 0) == EMBKV_OK && embkv_close(st) == EMBKV_OK ? 0 : 98;
                } else if (r != EMBKV_LOCKED) {
                    fprintf(stderr, "create race: %s\n", embkv_errmsg());
                }
                _exit(r);
            }
        }
        close(go[0]);
        close(go[1]);  /* (all start at once) */
        int opened = 0, other = 0;
        for (int k = 0; k < 8; k++) {
            int status = 0;
            waitpid(kids[k], &status, 0);
            int r = WIFEXITED(status) ? WEXITSTATUS(status) : 100;
            opened += r == 0;
            other += r != 0 && r != EMBKV_LOCKED;
        }
        CHECK(other == 0 && opened > 0);
        embkv_store *st = NULL;
        CHECK_RC(embkv_open(d, NULL, 0, &st), EMBKV_OK);
        if (st) {
            CHECK(embkv_count(st) == (uint64_t)opened);
            CHECK_RC(embkv_check(st), EMBKV_OK);
            CHECK_RC(embkv_close(st), EMBKV_OK);
        }
    }
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--child")) return child_main(argv[2], argv[3]);
    CHECK(embkv_errmsg() != NULL);
    test_options();
    test_paths();
    test_bad_pools();
    test_rows();
    test_full();
    test_full_advice();
    test_full_synced_deletes();
    test_locked();
    test_locked_by_a_child();
    test_create_race();
    test_pool_flock();
    test_destroy();
    test_update_callback();
    test_close_in_group();
    test_close_with_open();
    test_foreign_snapshot();
    test_nulls();
    test_unknown_flags();
    return test_summary("test_errors");
}
