/*
 * test_fuzz_regress.c - one regression test per finding of the libFuzzer
 * targets (tests/fuzz/): the input that found it, reduced to what the
 * engine's C API sees, and the clean error it must give now.  The input
 * itself is also in the fuzz corpus (named in each test), so the fuzzers
 * replay it on every run.  Every case runs in a forked child under
 * alarm(): a crash or a hang fails the test instead of ending it.
 *
 *  1. A damaged libpmemobj lane (fuzz_store_sql; corpus
 *     store_sql/regress-probe-exit-status): 19 bytes written at offset
 *     327680 of a 16 MiB pool make pmemobj_open fault.  embkv_open's probe
 *     process takes that fault, but the probe took only death by a signal
 *     as damage: in a process whose fault handler exits with a status
 *     instead (ASan's, libFuzzer's, some language runtimes'; here the
 *     test's own), the child exited 1, the probe passed, and the real open
 *     crashed.  Now the probe's child dies of the fault whatever handlers
 *     the process installed, and any exit but its own two counts as
 *     damage: EMBKV_CORRUPT.
 *  2. A damaged record let into the DRAM cache (fuzz_store; corpus
 *     store/regress-cache-admits-damaged): embkv_get_batch, the pull path,
 *     checks a pool record's id and not its checksum (by design: the
 *     update that follows a pull verifies it), and offered what it read
 *     to the cache, which took it; from then on embkv_get and
 *     embkv_get_batch_at, which verify pool records, served the damaged
 *     vector from the cache with EMBKV_OK.  Now a read offers the cache
 *     only records that pass their checksum: the damaged row stays a
 *     clean EMBKV_CORRUPT on every verifying read.
 */
#include "embkv.h"
#include "check.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

/* Runs fn in a child under alarm(20): its exit status, or 128 + signal. */
static int in_child(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        alarm(20);
        _exit(fn(arg));
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

static void patch(const char *path, off_t off, const void *p, size_t n)
{
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(pwrite(fd, p, n, off) == (ssize_t)n);
    close(fd);
}

/* ------------------------------------------------------------ 1 */

static void exit_on_fault(int sig)
{
    (void)sig;
    _exit(3);  /* as a sanitizer's or a runtime's handler would: a status, not the signal */
}

static int open_with_fault_handler(void *arg)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = exit_on_fault;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    embkv_store *s = NULL;
    int rc = embkv_open(arg, NULL, 0, &s);
    if (rc == EMBKV_OK) embkv_close(s);
    if (rc != EMBKV_CORRUPT) {
        fprintf(stderr, "embkv_open returned %d (%s), want EMBKV_CORRUPT\n", rc, embkv_errmsg());
        return 1;
    }
    if (!strstr(embkv_errmsg(), "store.pool is damaged")) {
        fprintf(stderr, "message: %s\n", embkv_errmsg());
        return 2;
    }
    return 0;
}

static void test_probe_exit_status(void)
{
    char dir[600], pool[700];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("lane"));
    snprintf(pool, sizeof pool, "%s/store.pool", dir);
    embkv_options o = {.dim = 16, .expected_rows = 1000, .pool_size = 16u << 20};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    float v[16] = {1, 2, 3};
    for (int64_t id = 0; id < 100; id++) CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    static const unsigned char lane[19] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 9, 232, 3, 0, 0, 1, 1};
    patch(pool, 327680, lane, sizeof lane);
    CHECK(in_child(open_with_fault_handler, dir) == 0);
}

/* ------------------------------------------------------------ 2 */

#define DIM2 16
static void vec2(int64_t id, float *v)
{
    for (int j = 0; j < DIM2; j++) v[j] = (float)id * 1000.0f + (float)j + 0.25f;
}

static int cache_damaged_read(void *arg)
{
    embkv_options o = {.cache_size = 1u << 20};
    embkv_store *s = NULL;
    int rc = embkv_open(arg, &o, 0, &s);
    if (rc != EMBKV_OK) {
        fprintf(stderr, "embkv_open: %d %s\n", rc, embkv_errmsg());
        return 1;
    }
    int64_t ids[4] = {41, 42, 43, 42};
    float out[4 * DIM2], v[DIM2];
    uint8_t found[4];
    /* The pull path: its result for 42 is not verified (by design). */
    rc = embkv_get_batch(s, ids, 4, out, found, NULL);
    int bad = rc != EMBKV_OK;
    /* The verifying reads: the damage shows, never the damaged vector. */
    for (int k = 0; k < 2; k++) {
        rc = embkv_get(s, 42, v, NULL, NULL);
        if (rc != EMBKV_CORRUPT) {
            fprintf(stderr, "embkv_get(42): %d, want EMBKV_CORRUPT (%s)\n", rc, embkv_errmsg());
            bad = 1;
        }
        rc = embkv_get_batch_at(s, NULL, ids, 3, out, NULL, found, NULL);
        if (rc != EMBKV_CORRUPT) {
            fprintf(stderr, "embkv_get_batch_at: %d, want EMBKV_CORRUPT (%s)\n", rc, embkv_errmsg());
            bad = 1;
        }
    }
    /* Its neighbours read as written, from the cache or not. */
    for (int64_t id = 41; id <= 43; id += 2) {
        float want[DIM2];
        vec2(id, want);
        if (embkv_get(s, id, v, NULL, NULL) != EMBKV_OK || memcmp(v, want, sizeof v) != 0) bad = 1;
    }
    embkv_close(s);
    return bad;
}

static void test_cache_admits_damaged(void)
{
    char dir[600], pool[700];
    snprintf(dir, sizeof dir, "%s", test_tmpdir("cache"));
    snprintf(pool, sizeof pool, "%s/store.pool", dir);
    embkv_options o = {.dim = DIM2, .expected_rows = 1000, .pool_size = 16u << 20};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    float v[DIM2];
    for (int64_t id = 0; id < 100; id++) {
        vec2(id, v);
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_close(s), EMBKV_OK);
    /* One byte of row 42's vector (written once: its only copy). */
    vec2(42, v);
    FILE *f = fopen(pool, "rb");
    CHECK(f != NULL);
    if (!f) return;
    static unsigned char buf[16u << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    long at = -1;
    for (size_t i = 0; i + sizeof v <= n && at < 0; i += 4)
        if (memcmp(buf + i, v, sizeof v) == 0) at = (long)i;
    CHECK(at > 0);
    if (at <= 0) return;
    unsigned char b = buf[at + 9] ^ 0x40;
    patch(pool, at + 9, &b, 1);
    CHECK(in_child(cache_damaged_read, dir) == 0);
}

int main(void)
{
    setenv("EMBKV_PROBE_TIMEOUT", "5", 1);
    test_probe_exit_status();
    test_cache_admits_damaged();
    return test_summary("test_fuzz_regress");
}
