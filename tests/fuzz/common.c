/*
 * common.c - the shared part of embkv's libFuzzer targets (see common.h):
 * scratch directories, a SQLite connection with embkv registered, the input
 * reader, and the store template with its patches.
 *
 * The patch language of the store-file targets.  An input is one flags
 * byte (the target's: which operations to run on the opened store), then
 * patches until the input ends:
 *
 *   op:u8 target:u8 offset:u32 ...
 *     op % 6 == 0  write:     len:u8, len bytes at offset
 *     op % 6 == 1  xor:       len:u8, len bytes xored into the file there
 *     op % 6 == 2  truncate:  the file cut to offset % (its size + 1)
 *     op % 6 == 3  delete:    the file removed
 *     op % 6 == 4  replace:   len:u16, the whole file becomes len bytes
 *     op % 6 == 5  u64 set:   value:u64 written at offset (a count, an
 *                             offset or a pointer-sized field)
 *
 * target % (number of targets) picks a region of one file: each file
 * whole, and for the pool its libpmemobj header, the root object, the
 * index, the chunk table, the first record chunk, the 16-byte allocation
 * headers in front of them, and the pool's non-zero pages (offset picks
 * one); for each log segment its header block and its first records.
 * offset is taken modulo the region's length, so every input lands
 * somewhere meaningful.  A file a patch removed stays removed.
 *
 * One guard: the root records the SSD log's directory as an absolute path
 * that the engine creates and writes; an input that leaves it naming
 * anything but the template's (the store's own log/) is refused before it
 * is run, and so is one that touches libpmemobj's root offset, which could
 * move the root onto other bytes.  Nothing else is filtered.
 */
#include "common.h"
#include "format.h"
#include "handle.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ basics */

static char scratch[PATH_MAX];

static void scratch_remove(void)
{
    if (scratch[0] && getpid() != 0) {
        if (chdir("/") != 0) { /* leave it before removing it */
        }
        fz_rmtree(scratch);
    }
}

const char *fz_scratch(const char *name, int cwd)
{
    if (scratch[0])
        return scratch;
    const char *base = getenv("EMBKV_FUZZ_SCRATCH");
    struct stat st;
    if (!base || !*base)
        base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : NULL;
    if (!base)
        base = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(scratch, sizeof scratch, "%s/embkv-fuzz-%s-%ld", base, name, (long)getpid());
    fz_rmtree(scratch);
    if (mkdir(scratch, 0755) != 0)
        fz_fail("cannot make the scratch directory %s: %s", scratch, strerror(errno));
    atexit(scratch_remove);
    if (cwd && chdir(scratch) != 0)
        fz_fail("chdir %s: %s", scratch, strerror(errno));
    /* Temporary stores of :memory: tables land here too. */
    setenv("TMPDIR", scratch, 1);
    return scratch;
}

int fz_rmtree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISDIR(st.st_mode))
        return unlink(path);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    struct dirent *e;
    int bad = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[PATH_MAX];
        if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) {
            bad = -1;
            continue;
        }
        bad |= fz_rmtree(sub);
    }
    closedir(d);
    return rmdir(path) | bad;
}

void fz_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "embkv fuzz: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

void fz_check_rc(int rc, const char *what)
{
    if (rc < EMBKV_OK || rc > EMBKV_BUSY)
        fz_fail("%s returned %d, which is not an embkv_rc (%s)", what, rc, embkv_errmsg());
    const char *m = embkv_errmsg();
    if (!m)
        fz_fail("%s: embkv_errmsg() is NULL", what);
}

/* The extension's entry point (ext/sqlite/ext.c). */
int sqlite3_embkv_init(sqlite3 *db, char **pzErrMsg, const struct sqlite3_api_routines *pApi);

sqlite3 *fz_db_open(const char *file)
{
    static int registered;
    if (!registered) {
        if (sqlite3_auto_extension((void (*)(void))sqlite3_embkv_init) != SQLITE_OK)
            fz_fail("sqlite3_auto_extension failed");
        registered = 1;
    }
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(file, &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) != SQLITE_OK) {
        fprintf(stderr, "embkv fuzz: cannot open %s: %s\n", file, db ? sqlite3_errmsg(db) : "out of memory");
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

/* ------------------------------------------------------------ input */

uint8_t fz_u8(fz_in *in) { return in->at < in->n ? in->p[in->at++] : 0; }
uint16_t fz_u16(fz_in *in) { return (uint16_t)(fz_u8(in) | (unsigned)fz_u8(in) << 8); }
uint32_t fz_u32(fz_in *in) { return (uint32_t)fz_u16(in) | (uint32_t)fz_u16(in) << 16; }
uint64_t fz_u64(fz_in *in) { return (uint64_t)fz_u32(in) | (uint64_t)fz_u32(in) << 32; }
size_t fz_left(const fz_in *in) { return in->n - in->at; }

const uint8_t *fz_take(fz_in *in, size_t n, size_t *got)
{
    size_t k = n < fz_left(in) ? n : fz_left(in);
    const uint8_t *p = in->p + in->at;
    in->at += k;
    *got = k;
    return p;
}

/* ------------------------------------------------------------ template */

/* The vectors of ids 0..FZ_SQL_ROWS and FZ_FILL_BASE.. (the template's),
 * computed once: the targets compare every row they read. */
static float *vec_cache;
static int64_t vec_cache_hi;

static void vec_compute(int64_t id, float *v)
{
    uint64_t z = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < FZ_DIM; i++) {
        z ^= z >> 29;
        z *= 0xBF58476D1CE4E5B9ull;
        v[i] = (float)((z >> 40) % 20001) / 1000.0f - 10.0f;
    }
}

static int64_t vec_slot(int64_t id)
{
    if (id >= 0 && id <= FZ_SQL_ROWS)
        return id;
    if (id >= FZ_FILL_BASE && id < vec_cache_hi)
        return FZ_SQL_ROWS + 1 + (id - FZ_FILL_BASE);
    return -1;
}

void fz_vec(int64_t id, float *v)
{
    int64_t k = vec_cache ? vec_slot(id) : -1;
    if (k >= 0)
        memcpy(v, vec_cache + k * FZ_DIM, FZ_DIM * sizeof *v);
    else
        vec_compute(id, v);
}

int fz_vec_is(int64_t id, const float *v)
{
    int64_t k = vec_cache ? vec_slot(id) : -1;
    if (k >= 0)
        return memcmp(v, vec_cache + k * FZ_DIM, FZ_DIM * sizeof *v) == 0;
    float want[FZ_DIM];
    vec_compute(id, want);
    return memcmp(v, want, sizeof want) == 0;
}

#define MAX_FILES 64
#define MAX_TARGETS 256

typedef struct run {
    size_t off, len;
} run;

typedef struct tfile {
    char rel[64];       /* path under the template / work directory */
    unsigned char *data;
    size_t size;
    run *runs;          /* its non-zero stretches (of whole 4 KiB pages) */
    size_t nruns;
} tfile;

typedef struct target {
    int file;
    uint64_t off, len;  /* region */
    bool pages;         /* the pool's non-zero pages (off, len unused) */
} target;

static void find_runs(tfile *f);

static struct {
    bool built;
    char tmpl[PATH_MAX], work[PATH_MAX], work_store[PATH_MAX];
    tfile files[MAX_FILES];
    int nfiles, pool;                /* index of store.pool */
    target targets[MAX_TARGETS];
    int ntargets;
    uint64_t *pages;                 /* non-zero 4 KiB pages of the pool */
    size_t npages;
    uint64_t ssd_path_off;           /* the root's ssd_path in the pool file */
    uint64_t root_field_off;         /* libpmemobj's root offset field (0: not found) */
    int64_t *ids;
    size_t nids;
} T;

static void must(int ok, const char *what)
{
    if (!ok)
        fz_fail("template: %s failed: %s", what, embkv_errmsg());
}

static void exec_sql(sqlite3 *db, const char *sql)
{
    char *err = NULL;
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        fz_fail("template: %s: %s", sql, err ? err : "?");
}

static void load_files(const char *dir, const char *rel)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s%s%s", dir, *rel ? "/" : "", rel);
    DIR *d = opendir(path);
    if (!d)
        fz_fail("template: opendir %s: %s", path, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[64], full[PATH_MAX];
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        snprintf(full, sizeof full, "%s/%s", dir, sub);
        struct stat st;
        if (lstat(full, &st) != 0)
            fz_fail("template: stat %s", full);
        if (S_ISDIR(st.st_mode)) {
            load_files(dir, sub);
            continue;
        }
        if (T.nfiles == MAX_FILES)
            fz_fail("template: too many files");
        tfile *f = &T.files[T.nfiles++];
        snprintf(f->rel, sizeof f->rel, "%s", sub);
        f->size = (size_t)st.st_size;
        f->data = malloc(f->size ? f->size : 1);
        FILE *fp = fopen(full, "rb");
        if (!f->data || !fp || fread(f->data, 1, f->size, fp) != f->size)
            fz_fail("template: cannot read %s", full);
        fclose(fp);
    }
    closedir(d);
}

/* A region of a file; off and len are clipped to the template's file (an
 * empty file keeps one byte, so that writes can grow it). */
static void add_target(int file, uint64_t off, uint64_t len)
{
    uint64_t size = T.files[file].size;
    if (T.ntargets == MAX_TARGETS || (size && off >= size))
        return;
    if (size && off + len > size)
        len = size - off;
    T.targets[T.ntargets++] = (target){file, off, len ? len : 1, false};
}

static int cmp_file(const void *a, const void *b)
{
    return strcmp(((const tfile *)a)->rel, ((const tfile *)b)->rel);
}

static int file_index(const char *rel)
{
    for (int i = 0; i < T.nfiles; i++)
        if (!strcmp(T.files[i].rel, rel))
            return i;
    return -1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

void fz_template_init(const char *name)
{
    if (T.built)
        return;
    const char *sc = fz_scratch(name, 0);
    snprintf(T.tmpl, sizeof T.tmpl, "%s/template", sc);
    snprintf(T.work, sizeof T.work, "%s/work", sc);
    snprintf(T.work_store, sizeof T.work_store, "%s/work/store", sc);
    fz_rmtree(T.work);
    fz_rmtree(T.tmpl);
    if (mkdir(T.work, 0755) != 0)
        fz_fail("template: mkdir %s: %s", T.work, strerror(errno));

    /* 1. Through SQL: the database, the table, its app- files, a few rows. */
    char dbpath[PATH_MAX + 16];
    snprintf(dbpath, sizeof dbpath, "%s/t.db", T.work);
    sqlite3 *db = fz_db_open(dbpath);
    if (!db)
        fz_fail("template: no database");
    char sql[512];
    snprintf(sql, sizeof sql,
             "CREATE VIRTUAL TABLE t USING embkv(dim=%d, path='store', pool_size='16M', capacity=1000, "
             "ssd_size='128M', optimizer=adagrad, lr=0.05, init='uniform(-0.1,0.1)', staleness=4)",
             FZ_DIM);
    exec_sql(db, sql);
    exec_sql(db, "BEGIN");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "INSERT INTO t(id, vec) VALUES (?, ?)", -1, &st, NULL) != SQLITE_OK)
        fz_fail("template: prepare: %s", sqlite3_errmsg(db));
    for (int64_t id = 1; id <= FZ_SQL_ROWS; id++) {
        float v[FZ_DIM];
        fz_vec(id, v);
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_blob(st, 2, v, sizeof v, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE)
            fz_fail("template: insert: %s", sqlite3_errmsg(db));
        sqlite3_reset(st);
    }
    sqlite3_finalize(st);
    exec_sql(db, "COMMIT");
    if (sqlite3_close(db) != SQLITE_OK)
        fz_fail("template: close");

    /* 2. Through the C API: rows until the pool demotes some to the log. */
    embkv_store *s = NULL;
    must(embkv_open(T.work_store, NULL, 0, &s) == EMBKV_OK, "embkv_open");
    embkv_stats sts;
    int64_t id = FZ_FILL_BASE;
    for (int round = 0;; round++) {
        for (int k = 0; k < 256; k++, id++) {
            float v[FZ_DIM];
            fz_vec(id, v);
            must(embkv_put(s, id, v, NULL, 0) == EMBKV_OK, "embkv_put");
        }
        embkv_tier_idle(s, 10000);
        must(embkv_stats_get(s, &sts) == EMBKV_OK, "embkv_stats_get");
        if (sts.rows_ssd > 0)
            break;
        if (round > 4000)
            fz_fail("template: no row reached the SSD log");
    }
    /* A few rows deleted and updated, so that tombstones and freed
     * records are in the files too. */
    for (int64_t k = FZ_FILL_BASE; k < FZ_FILL_BASE + 64; k += 8)
        must(embkv_delete(s, k) == EMBKV_OK, "embkv_delete");
    must(embkv_sync(s) == EMBKV_OK, "embkv_sync");
    must(embkv_tier_idle(s, 10000) == EMBKV_OK, "embkv_tier_idle");
    must(embkv_stats_get(s, &sts) == EMBKV_OK, "embkv_stats_get");
    /* Where the root and its parts are (offsets in the pool file). */
    store_root *r = s->root;
    uint64_t root_off = (uint64_t)((char *)r - s->pool_base);
    T.ssd_path_off = root_off + offsetof(store_root, ssd_path);
    uint64_t index_off = r->index.off, index_len = r->nbuckets * BUCKET_BYTES + BUCKET_BYTES;
    uint64_t table_off = r->chunk_table.off, chunk_off = s->chunks[0].off, chunk_len = r->chunk_bytes;
    /* The ids, for the targets' reads. */
    T.nids = 0;
    T.ids = malloc((size_t)(id - FZ_FILL_BASE + FZ_SQL_ROWS) * sizeof *T.ids);
    for (int64_t k = 1; k <= FZ_SQL_ROWS; k++)
        T.ids[T.nids++] = k;
    for (int64_t k = FZ_FILL_BASE; k < id; k++)
        if (embkv_exists(s, k) == 1)
            T.ids[T.nids++] = k;
    qsort(T.ids, T.nids, sizeof *T.ids, cmp_i64);
    vec_cache = malloc((size_t)(FZ_SQL_ROWS + 1 + (id - FZ_FILL_BASE)) * FZ_DIM * sizeof *vec_cache);
    if (!vec_cache)
        fz_fail("template: out of memory");
    for (int64_t k = 0; k <= FZ_SQL_ROWS; k++)
        vec_compute(k, vec_cache + k * FZ_DIM);
    for (int64_t k = FZ_FILL_BASE; k < id; k++)
        vec_compute(k, vec_cache + (FZ_SQL_ROWS + 1 + (k - FZ_FILL_BASE)) * FZ_DIM);
    vec_cache_hi = id;
    fprintf(stderr, "embkv fuzz: template: %zu rows, %llu in the log (%llu segments), pool %llu bytes\n", T.nids,
            (unsigned long long)sts.rows_ssd, (unsigned long long)sts.ssd_segments,
            (unsigned long long)sts.pool_bytes);
    must(embkv_close(s) == EMBKV_OK, "embkv_close");

    /* 3. The copy becomes the template. */
    if (rename(T.work, T.tmpl) != 0)
        fz_fail("template: rename: %s", strerror(errno));
    load_files(T.tmpl, "");
    /* Sorted by name: the patch targets keep their numbers from one
     * process (and machine) to the next, so the seed corpus means the same. */
    qsort(T.files, (size_t)T.nfiles, sizeof T.files[0], cmp_file);
    for (int i = 0; i < T.nfiles; i++)
        find_runs(&T.files[i]);
    T.pool = file_index("store/store.pool");
    if (T.pool < 0)
        fz_fail("template: no pool file");
    const tfile *pf = &T.files[T.pool];
    /* libpmemobj's root offset field: the one place in its descriptor
     * page holding the root object's offset. */
    int hits = 0;
    for (uint64_t o = 4096; o + 8 <= 8192 && o + 8 <= pf->size; o += 8) {
        uint64_t v;
        memcpy(&v, pf->data + o, 8);
        if (v == root_off - 16 || v == root_off) {
            T.root_field_off = o;
            hits++;
        }
    }
    if (hits != 1)
        T.root_field_off = 0;
    for (uint64_t o = 0; o + 4096 <= pf->size; o += 4096) {
        static const unsigned char zero[4096];
        if (memcmp(pf->data + o, zero, 4096) != 0) {
            T.pages = realloc(T.pages, (T.npages + 1) * sizeof *T.pages);
            T.pages[T.npages++] = o;
        }
    }
    /* The targets: every file whole, then the regions. */
    for (int i = 0; i < T.nfiles; i++)
        if (strcmp(T.files[i].rel, "t.db") != 0)
            add_target(i, 0, T.files[i].size);
    add_target(T.pool, 0, 8192);
    add_target(T.pool, root_off, sizeof(store_root));
    add_target(T.pool, root_off, 256);
    add_target(T.pool, index_off, index_len);
    add_target(T.pool, table_off, 4096);
    add_target(T.pool, chunk_off, chunk_len);
    add_target(T.pool, chunk_off, 4096);
    add_target(T.pool, root_off - 64, 64);
    add_target(T.pool, index_off - 64, 64);
    add_target(T.pool, table_off - 64, 64);
    add_target(T.pool, chunk_off - 64, 64);
    if (T.ntargets < MAX_TARGETS)
        T.targets[T.ntargets++] = (target){T.pool, 0, 1, true};
    for (int i = 0; i < T.nfiles; i++) {
        if (strncmp(T.files[i].rel, "store/log/", 10) != 0)
            continue;
        add_target(i, 0, 4096);
        add_target(i, 4096, 8192);
    }
    fprintf(stderr, "embkv fuzz: template: %d files, %d patch targets, %zu non-zero pool pages, root at %llu%s\n",
            T.nfiles, T.ntargets, T.npages, (unsigned long long)root_off,
            T.root_field_off ? "" : " (its libpmemobj field not found)");
    if (getenv("EMBKV_FUZZ_VERBOSE"))
        for (int i = 0; i < T.ntargets; i++)
            fprintf(stderr, "  target %2d: %s %s+%llu, %llu bytes\n", i, T.files[T.targets[i].file].rel,
                    T.targets[i].pages ? "non-zero pages" : "", (unsigned long long)T.targets[i].off,
                    (unsigned long long)T.targets[i].len);
    T.built = true;
}

const int64_t *fz_template_ids(size_t *n)
{
    *n = T.nids;
    return T.ids;
}

const char *fz_work_dir(void) { return T.work; }
const char *fz_work_store(void) { return T.work_store; }

void fz_work_clear(void)
{
    if (fz_rmtree(T.work) != 0)
        fz_fail("cannot remove %s: %s", T.work, strerror(errno));
}

static void mkdirs_for(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + strlen(T.work) + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        mkdir(buf, 0755);
        *p = '/';
    }
}

/* The non-zero stretches of f, once: a copy writes only those. */
static void find_runs(tfile *f)
{
    static const unsigned char zero[4096];
    for (size_t o = 0; o < f->size;) {
        size_t n = f->size - o < 4096 ? f->size - o : 4096;
        if (memcmp(f->data + o, zero, n) == 0) {
            o += n;
            continue;
        }
        if (f->nruns && f->runs[f->nruns - 1].off + f->runs[f->nruns - 1].len == o) {
            f->runs[f->nruns - 1].len += n;
        } else {
            f->runs = realloc(f->runs, (f->nruns + 1) * sizeof *f->runs);
            if (!f->runs)
                fz_fail("out of memory");
            f->runs[f->nruns++] = (run){o, n};
        }
        o += n;
    }
}

/* Writes f's content (its non-zero pages only: the copy is sparse). */
static void write_copy(const tfile *f, const char *path)
{
    mkdirs_for(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)f->size) != 0)
        fz_fail("copy: %s: %s", path, strerror(errno));
    for (size_t i = 0; i < f->nruns; i++)
        if (pwrite(fd, f->data + f->runs[i].off, f->runs[i].len, (off_t)f->runs[i].off) != (ssize_t)f->runs[i].len)
            fz_fail("copy: write %s: %s", path, strerror(errno));
    close(fd);
}

static bool overlaps(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    return a < b + blen && b < a + alen;
}

int fz_work_make(fz_in *in)
{
    fz_rmtree(T.work);
    if (mkdir(T.work, 0755) != 0)
        fz_fail("mkdir %s: %s", T.work, strerror(errno));
    char path[PATH_MAX + 80];
    for (int i = 0; i < T.nfiles; i++) {
        snprintf(path, sizeof path, "%s/%s", T.work, T.files[i].rel);
        write_copy(&T.files[i], path);
    }
    int refused = 0;
    while (fz_left(in) >= 6) {
        uint8_t op = fz_u8(in) % 6;
        const target *t = &T.targets[fz_u8(in) % T.ntargets];
        uint32_t raw = fz_u32(in);
        const tfile *f = &T.files[t->file];
        uint64_t off;
        if (t->pages)
            off = T.npages ? T.pages[(raw >> 12) % T.npages] + (raw & 4095) : 0;
        else
            off = t->off + raw % t->len;
        unsigned char buf[65536];
        size_t n = 0, got;
        const uint8_t *p;
        switch (op) {
        case 0:
        case 1:
            n = fz_u8(in);
            p = fz_take(in, n, &got);
            memcpy(buf, p, got);
            n = got;
            break;
        case 4:
            n = fz_u16(in);
            p = fz_take(in, n, &got);
            memcpy(buf, p, got);
            n = got;
            break;
        case 5: {
            uint64_t v = fz_u64(in);
            memcpy(buf, &v, 8);
            n = 8;
            break;
        }
        default:
            break;
        }
        snprintf(path, sizeof path, "%s/%s", T.work, f->rel);
        if (t->file == T.pool && (op == 0 || op == 1 || op == 5)) {
            if (T.root_field_off && overlaps(off, n, T.root_field_off, 8))
                refused = 1;
        }
        if (op == 3) {
            unlink(path);
            continue;
        }
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0)
            continue; /* removed by an earlier patch */
        if (op == 2) {
            if (ftruncate(fd, (off_t)(raw % (f->size + 1))) != 0)
                fz_fail("truncate %s: %s", path, strerror(errno));
        } else if (op == 4) {
            if (ftruncate(fd, 0) != 0 || pwrite(fd, buf, n, 0) != (ssize_t)n)
                fz_fail("replace %s: %s", path, strerror(errno));
        } else if (n) {
            if (op == 1) {
                unsigned char old[256];
                ssize_t r = pread(fd, old, n, (off_t)off);
                for (ssize_t k = 0; k < r; k++)
                    buf[k] ^= old[k];
                n = r > 0 ? (size_t)r : 0;
            }
            if (n && pwrite(fd, buf, n, (off_t)off) != (ssize_t)n)
                fz_fail("patch %s: %s", path, strerror(errno));
        }
        close(fd);
    }
    /* The guard: the root's ssd_path (absolute, made and written by the
     * log) must still name the store's own log directory (""). */
    snprintf(path, sizeof path, "%s/%s", T.work, T.files[T.pool].rel);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        char c = 0;
        if (pread(fd, &c, 1, (off_t)T.ssd_path_off) == 1 && c == '/')
            refused = 1;
        close(fd);
    }
    return refused ? -1 : 0;
}
