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

#endif
