/*
 * check.h - the tiny assertion harness of embkv's C tests.
 * Each CHECK counts a pass or a failure; a failure prints file:line and the
 * expression.  test_summary() prints "N passed, N failed" and returns the
 * process exit code.
 */
#ifndef EMBKV_CHECK_H
#define EMBKV_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <inttypes.h>

static int check_passed, check_failed;

#define CHECK(cond) do { \
    if (cond) check_passed++; \
    else { check_failed++; \
        fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } \
} while (0)

#define CHECK_RC(expr, want) do { \
    int check_rc_ = (expr); \
    if (check_rc_ == (want)) check_passed++; \
    else { check_failed++; \
        fprintf(stderr, "%s:%d: %s returned %d, want %d (%s)\n", __FILE__, __LINE__, \
                #expr, check_rc_, (int)(want), embkv_errmsg()); } \
} while (0)

/* A fresh empty directory under $TMPDIR (or /tmp); removed by test_cleanup. */
static char check_tmp_root[512];
static inline const char *test_tmpdir(const char *name) {
    static char path[600];
    if (!check_tmp_root[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(check_tmp_root, sizeof check_tmp_root, "%s/embkv-test-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(check_tmp_root)) { perror("mkdtemp"); exit(2); }
    }
    snprintf(path, sizeof path, "%s/%s", check_tmp_root, name);
    return path;
}

/* A kill test's child records its progress: written aside and renamed, so
 * that a kill never leaves the parent an empty or half-written mark. */
static inline void write_mark(const char *mark, const char *text)
{
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s.tmp", mark);
    FILE *f = fopen(tmp, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0 || rename(tmp, mark) != 0)
        _exit(20);
}

/* A whole file, malloc'ed, *len its size; NULL if it cannot be read. */
static inline void *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *p = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)n + 1)) != NULL &&
        fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *len = n > 0 ? (size_t)n : 0;
    return p;
}

/* path holds exactly len bytes of p; false if that failed. */
static inline int test_write_file(const char *path, const void *p, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    int ok = fwrite(p, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

static inline void test_cleanup(void) {
    if (check_tmp_root[0]) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_tmp_root);
        if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", check_tmp_root);
    }
}

static inline int test_summary(const char *name) {
    test_cleanup();
    printf("%s: %d passed, %d failed\n", name, check_passed, check_failed);
    return check_failed ? 1 : 0;
}

/* ---- shared by the tests: a counter-based generator and thread-safe checks */

#include <stdatomic.h>

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct { uint64_t s; } rng_t;
static inline uint64_t rnd(rng_t *r) { return mix64(r->s += 0x9E3779B97F4A7C15ull); }
static inline uint64_t rnd_below(rng_t *r, uint64_t n) { return rnd(r) % n; }

/* CHECK and CHECK_RC for threads: counted atomically, folded into the
 * totals by fold_thread_checks() after the threads are joined. */
static atomic_int tfail, tpass;
#define TCHECK(cond) do { \
    if (cond) atomic_fetch_add_explicit(&tpass, 1, memory_order_relaxed); \
    else { atomic_fetch_add(&tfail, 1); \
        fprintf(stderr, "%s:%d: CHECK failed (thread): %s\n", __FILE__, __LINE__, #cond); } \
} while (0)
#define TCHECK_RC(expr, want) do { \
    int trc_ = (expr); \
    if (trc_ == (want)) atomic_fetch_add_explicit(&tpass, 1, memory_order_relaxed); \
    else { atomic_fetch_add(&tfail, 1); \
        fprintf(stderr, "%s:%d: %s returned %d, want %d (%s)\n", __FILE__, __LINE__, \
                #expr, trc_, (int)(want), embkv_errmsg()); } \
} while (0)

static inline void fold_thread_checks(void)
{
    check_passed += atomic_exchange(&tpass, 0);
    check_failed += atomic_exchange(&tfail, 0);
}

/* n threads of fn alive at once (tests of many threads: thread i is given
 * i, on a small stack); a test that cannot start them all ends here, its
 * barriers would wait for ever. */
#include <pthread.h>
static inline pthread_t *spawn_many(long n, void *(*fn)(void *), const char *test)
{
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setstacksize(&a, 512u << 10);
    pthread_t *t = calloc((size_t)n, sizeof *t);
    long made = 0;
    for (long i = 0; t && i < n; i++)
        made += pthread_create(&t[i], &a, fn, (void *)(intptr_t)i) == 0;
    pthread_attr_destroy(&a);
    CHECK(made == n);
    if (made != n)
        exit(test_summary(test));
    return t;
}

#endif
