/*
 * common.h - what the libFuzzer targets of tests/fuzz/ share (common.c).
 *
 * Owns: the scratch directory of a fuzzing process, an in-memory SQLite
 * connection with embkv registered, a byte reader over the fuzz input, and
 * the store template of the store-file targets with the patches they apply
 * to copies of it.  Why it is built this way: pools are 16 MiB at least and
 * take tens of milliseconds to create, so each process builds one small
 * valid store once (a few rows in the pool, more in the SSD log's segment
 * files, the binding's app- files, a database file with a table on it) and
 * every input is a list of patches to a fresh copy of it; the copy writes
 * only the template's non-zero pages, so it costs little more than the
 * data the template really holds.
 *
 * This header does not include sqlite3ext.h: common.c calls SQLite
 * directly, while the targets that include binding.h go through
 * the extension's API table, which the first connection opened here sets.
 */
#ifndef EMBKV_FUZZ_COMMON_H
#define EMBKV_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "embkv.h"

typedef struct sqlite3 sqlite3;

/* The process's scratch directory: $EMBKV_FUZZ_SCRATCH or /dev/shm (else
 * $TMPDIR, /tmp), a fresh embkv-fuzz-<name>-<pid> under it, removed at a
 * normal exit.  cwd: the process changes into it. */
const char *fz_scratch(const char *name, int cwd);
/* rm -rf without following symbolic links; 0 or -1. */
int fz_rmtree(const char *path);
/* Abort with a message (a finding: libFuzzer records the input). */
void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* rc must be one of the embkv_rc values. */
void fz_check_rc(int rc, const char *what);

/* A connection (file, or ":memory:") with embkv registered through
 * sqlite3_auto_extension, as a loaded extension would be.  NULL on failure. */
sqlite3 *fz_db_open(const char *file);

/* Reads the fuzz input front to back; past its end every read gives 0s. */
typedef struct fz_in {
    const uint8_t *p;
    size_t n, at;
} fz_in;
uint8_t fz_u8(fz_in *in);
uint16_t fz_u16(fz_in *in);
uint32_t fz_u32(fz_in *in);
uint64_t fz_u64(fz_in *in);
size_t fz_left(const fz_in *in);
/* Up to n bytes (fewer at the end): a pointer into the input. */
const uint8_t *fz_take(fz_in *in, size_t n, size_t *got);

/* ------------------------------------------------------------------
 * The store template (fuzz_store, fuzz_store_sql).
 *
 * Layout of a copy under <scratch>/work/: t.db, a SQLite database with
 * table t (embkv, dim FZ_DIM, path 'store', the SSD tier, adagrad), and
 * store/ with the pool, the log in store/log/ and the app- files.  Ids
 * 1..FZ_SQL_ROWS were inserted through SQL, FZ_FILL_BASE.. by the C API
 * until rows went to the log; every row's vector is fz_vec(id).
 */
#define FZ_DIM 128
#define FZ_SQL_ROWS 40
#define FZ_FILL_BASE 100000

void fz_vec(int64_t id, float *v);
/* 1 if v is fz_vec(id). */
int fz_vec_is(int64_t id, const float *v);
/* Builds the template once, in fz_scratch(name) (aborts if it cannot). */
void fz_template_init(const char *name);
/* Ids the template holds. */
const int64_t *fz_template_ids(size_t *n);
/* The work directory of the copies and its store directory. */
const char *fz_work_dir(void);
const char *fz_work_store(void);
/* A fresh copy of the template in the work directory with the input's
 * patches applied.  Returns 0, or -1 for an input that must not be run
 * (one that would point the SSD log outside the scratch directory). */
int fz_work_make(fz_in *in);
/* Removes the work directory. */
void fz_work_clear(void);

#endif
