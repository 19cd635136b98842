/*
 * test_damage.c - damaged store files give clean errors, never a crash, a
 * hang or wrong data.
 *
 *  A. each damaged root field (max_load 0 or 1e300, nbuckets not a power of
 *     two or too large, index_next == index, a chunk outside the pool, a
 *     chunk table elsewhere, the store id or its check) is refused at open
 *     with EMBKV_CORRUPT;
 *  B. a flipped byte in a record's vector is EMBKV_CORRUPT naming the id on
 *     embkv_get, embkv_get_batch_at, embkv_scan and embkv_check, and on the
 *     update that reads it, on embkv_knn; a flipped id byte on embkv_get_batch
 *     too;
 *  B2. embkv_knn checks a pool record once per place (slab.c's checked
 *     map): a record written into a place checked before (its place
 *     reused) is checked again, so damage to it is EMBKV_CORRUPT naming
 *     its id;
 *     An index entry naming another row's record (or a record two entries
 *     name) is EMBKV_CORRUPT naming its id too, not a row missed or met
 *     twice;
 *  C. random single-byte flips in the pool's embkv objects (root, index,
 *     records), each opened in a forked child under alarm(): no signal, no
 *     hang; with a record or root flip, every read either fails cleanly or
 *     returns exactly the data written.  Seed printed.
 * Every child runs under alarm() so that a hang fails the test.
 */
#include "embkv.h"
#include "check.h"
#include "format.h"
#include "handle.h"
#include "index.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#define DIM 8
#define ROWS 400

static double scale = 1.0;
static char pool_path[700], dir[600];

static float value(int64_t id, int j) { return (float)id * 0.5f + (float)j; }

static void build_store(void)
{
    snprintf(dir, sizeof dir, "%s", test_tmpdir("store"));
    snprintf(pool_path, sizeof pool_path, "%s/store.pool", dir);
    embkv_options o = {.dim = DIM, .expected_rows = 1000, .pool_size = 16u << 20};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    float v[DIM];
    for (int64_t id = 0; id < ROWS; id++) {
        for (int j = 0; j < DIM; j++) v[j] = value(id, j);
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void *read_file(const char *path, size_t *len) { return test_read_file(path, len); }

static void write_file(const char *path, const void *p, size_t len)
{
    if (!test_write_file(path, p, len)) {
        perror(path);
        exit(2);
    }
}

/* Under the sanitizers a hung child says where it hung. */
void __sanitizer_print_stack_trace(void) __attribute__((weak));

static void on_alarm(int sig)
{
    if (__sanitizer_print_stack_trace) __sanitizer_print_stack_trace();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Runs fn in a child under alarm(10): its exit status, or 128 + signal. */
static int in_child(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGALRM, on_alarm);
        alarm(10);
        _exit(fn(arg));
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : WEXITSTATUS(st);
}

/* ------------------------------------------------------------ A */

typedef struct root_edit {
    const char *name;
    void (*edit)(store_root *r, PMEMobjpool *pop);
    const char *want;  /* in the message */
} root_edit;

static void e_load0(store_root *r, PMEMobjpool *pop) { (void)pop; r->max_load = 0; }
static void e_loadhuge(store_root *r, PMEMobjpool *pop) { (void)pop; r->max_load = 1e300; }
static void e_nb3(store_root *r, PMEMobjpool *pop) { (void)pop; r->nbuckets = 3; }
static void e_nbbig(store_root *r, PMEMobjpool *pop) { (void)pop; r->nbuckets = 1ull << 40; }
static void e_nbmore(store_root *r, PMEMobjpool *pop) { (void)pop; r->nbuckets *= 4; }
static void e_next(store_root *r, PMEMobjpool *pop) { (void)pop; r->index_next = r->index; }
static void e_old(store_root *r, PMEMobjpool *pop) { (void)pop; r->index_old = r->chunk_table; }
static void e_chunk(store_root *r, PMEMobjpool *pop)
{
    PMEMoid *c = pmemobj_direct(r->chunk_table);
    c[0].off = (16u << 20) - 100;
    pmemobj_persist(pop, c, sizeof *c);
}
static void e_table(store_root *r, PMEMobjpool *pop) { (void)pop; r->chunk_table.off += 1u << 30; }
static void e_index(store_root *r, PMEMobjpool *pop) { (void)pop; r->index.off = 8; }
static void e_locked(store_root *r, PMEMobjpool *pop)
{
    uintptr_t p = (uintptr_t)pmemobj_direct(r->index);  /* buckets start aligned */
    bucket *b = (bucket *)((p + BUCKET_BYTES - 1) & ~(uintptr_t)(BUCKET_BYTES - 1));
    b[r->nbuckets / 2].version |= 1;  /* a writer's mark, left in a clean store */
    pmemobj_persist(pop, &b[r->nbuckets / 2].version, sizeof b->version);
}

static void e_lostbit(store_root *r, PMEMobjpool *pop)
{
    uintptr_t p = (uintptr_t)pmemobj_direct(r->index);
    bucket *b = (bucket *)((p + BUCKET_BYTES - 1) & ~(uintptr_t)(BUCKET_BYTES - 1));
    for (uint64_t i = 0; i < r->nbuckets; i++) {
        if (b[i].used) {  /* a row dropped from a well-formed bucket */
            b[i].used &= (uint16_t)(b[i].used - 1);
            pmemobj_persist(pop, &b[i].used, sizeof b[i].used);
            return;
        }
    }
}
/* The root zeroed (as when libpmemobj's root offset is damaged), a byte
 * of the magic flipped, the magic zeroed with the rest of the root as it
 * was: damage (they were "not an embkv store", which the SQLite binding
 * blamed on the path option: the second adversarial review). */
static void e_magic(store_root *r, PMEMobjpool *pop) { (void)pop; r->magic[1] ^= 0x5a; }
static void e_nomagic(store_root *r, PMEMobjpool *pop) { (void)pop; memset(r->magic, 0, sizeof r->magic); }
static void e_blank(store_root *r, PMEMobjpool *pop) { (void)pop; memset(r, 0, sizeof *r); }
static void e_sid(store_root *r, PMEMobjpool *pop) { (void)pop; r->store_id ^= 1u << 9; }
static void e_sid0(store_root *r, PMEMobjpool *pop) { (void)pop; r->store_id = 0; }
static const root_edit edits[] = {
    {"root zeroed", e_blank, "the pool's root object is damaged: it is empty"},
    {"magic flipped", e_magic, "the pool's root object is damaged: its magic is damaged"},
    {"magic zeroed", e_nomagic, "the pool's root object is damaged: its magic is damaged"},
    {"max_load 0", e_load0, "max_load out of range"},
    {"max_load 1e300", e_loadhuge, "max_load out of range"},
    {"nbuckets 3", e_nb3, "root object is inconsistent"},
    {"nbuckets 2^40", e_nbbig, "more index buckets than the pool"},
    {"nbuckets x4", e_nbmore, "index bucket"},
    {"index_next == index", e_next, "interrupted resize"},
    {"index_old == chunk table", e_old, "interrupted resize"},
    {"chunk outside the pool", e_chunk, "record chunk lies outside"},
    {"chunk table outside the pool", e_table, "bad chunk table"},
    {"index offset 8", e_index, "index object"},
    {"bucket left locked", e_locked,
     "locked by no writer): the store does not open with its index damaged: restore it from a backup"},
    {"used bit cleared", e_lostbit, "index holds 399 rows, 400 when it was closed"},
    {"store id flipped", e_sid, "its store id is damaged"},
    {"store id zeroed", e_sid0, "its store id is damaged"},
};

static int open_expect_corrupt(void *arg)
{
    const root_edit *e = arg;
    embkv_store *s = NULL;
    int rc = embkv_open(dir, NULL, 0, &s);
    if (rc == EMBKV_OK) {
        /* It must not have opened; if it did, make it work: no hang. */
        float v[DIM] = {0};
        embkv_put(s, 100000, v, NULL, 0);
        embkv_close(s);
        return 3;
    }
    if (rc != EMBKV_CORRUPT || !strstr(embkv_errmsg(), e->want)) {
        fprintf(stderr, "  %s: rc %d: %s\n", e->name, rc, embkv_errmsg());
        return 4;
    }
    return 0;
}

static void test_root_fields(void)
{
    size_t len;
    void *orig = read_file(pool_path, &len);
    CHECK(orig != NULL);
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        PMEMobjpool *pop = pmemobj_open(pool_path, EMBKV_LAYOUT);
        CHECK(pop != NULL);
        if (!pop) continue;
        store_root *r = pmemobj_direct(pmemobj_root(pop, 0));
        edits[k].edit(r, pop);
        pmemobj_persist(pop, r, sizeof *r);
        pmemobj_close(pop);
        int st = in_child(open_expect_corrupt, (void *)&edits[k]);
        if (st) fprintf(stderr, "  root edit '%s': child status %d\n", edits[k].name, st);
        CHECK(st == 0);
        write_file(pool_path, orig, len);
    }
    free(orig);
}

/* ------------------------------------------------------------ B */

static int find_row_bytes(const unsigned char *p, size_t len, int64_t id)
{
    float v[DIM];
    for (int j = 0; j < DIM; j++) v[j] = value(id, j);
    for (size_t off = 0; off + sizeof v <= len; off += 4)
        if (!memcmp(p + off, v, sizeof v)) return (int)off;
    return -1;
}

static void test_record_flip(void)
{
    size_t len;
    unsigned char *orig = read_file(pool_path, &len);
    CHECK(orig != NULL);
    if (!orig) return;
    int off = find_row_bytes(orig, len, 77);
    CHECK(off > 0);
    unsigned char *bad = malloc(len);
    memcpy(bad, orig, len);
    bad[off + 9] ^= 0x10;  /* one bit of vec[2] */
    write_file(pool_path, bad, len);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    float v[DIM];
    CHECK_RC(embkv_get(s, 77, v, NULL, NULL), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 77: the record is damaged") != NULL);
    CHECK_RC(embkv_get(s, 78, v, NULL, NULL), EMBKV_OK);
    CHECK(v[3] == value(78, 3));
    int64_t ids[3] = {1, 77, 2};
    float out[3 * DIM];
    CHECK_RC(embkv_get_batch_at(s, NULL, ids, 3, out, NULL, NULL, NULL), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 77") != NULL);
    CHECK_RC(embkv_check(s), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "77") != NULL);
    CHECK_RC(embkv_put(s, 77, v, NULL, EMBKV_PUT_UPDATE), EMBKV_CORRUPT);  /* reads the old row */
    CHECK_RC(embkv_close(s), EMBKV_OK);
    /* An id byte of the header: even the pull path (id check) refuses it. */
    memcpy(bad, orig, len);
    off = find_row_bytes(orig, len, 91);
    bad[off - 32] ^= 0x01;  /* the header's id, 32 bytes before the vector */
    write_file(pool_path, bad, len);
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    int64_t one = 91;
    CHECK_RC(embkv_get_batch(s, &one, 1, out, NULL, NULL), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 91") != NULL);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    write_file(pool_path, orig, len);
    free(bad);
    free(orig);
}

static int scan_cb(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)state, (void)info;
    int *bad = ctx;
    if (id < 0 || id >= ROWS) (*bad)++;
    else
        for (int j = 0; j < DIM; j++) *bad += vec[j] != value(id, j);
    return 0;
}

static void test_scan_flip(void)
{
    size_t len;
    unsigned char *orig = read_file(pool_path, &len);
    int off = find_row_bytes(orig, len, 150);
    orig[off + 4] ^= 0x40;
    write_file(pool_path, orig, len);
    orig[off + 4] ^= 0x40;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    int bad = 0;
    CHECK_RC(embkv_scan(s, scan_cb, &bad), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 150") != NULL);
    CHECK(bad == 0);  /* nothing damaged reached the callback */
    /* The nearest-neighbour pass reads every record too. */
    float q[DIM] = {0};
    int64_t kid[3];
    double kd[3];
    size_t kf;
    CHECK_RC(embkv_knn(s, q, 1, 3, NULL, kid, kd, &kf), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 150") != NULL);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    write_file(pool_path, orig, len);
    free(orig);
}

/* ------------------------------------------------------------ B2 */

/* Where id's record is (a pool place), and whether a scan checked it. */
static uint64_t place_of(embkv_store *s, int64_t id)
{
    ebr_enter();
    uint64_t loc = ix_lookup(atomic_load(&s->ix), id, embkv__hash(id), NULL);
    ebr_leave();
    return loc;
}

static void test_knn_checked_place(void)
{
    char d[600];
    snprintf(d, sizeof d, "%s", test_tmpdir("checked"));
    embkv_options o = {.dim = DIM, .expected_rows = 100, .pool_size = 16u << 20};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(d, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float v[DIM], q[DIM] = {0};
    for (int64_t id = 0; id < 10; id++) {
        for (int j = 0; j < DIM; j++) v[j] = value(id, j);
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    int64_t kid[3];
    double kd[3];
    size_t kf;
    CHECK_RC(embkv_knn(s, q, 1, 3, NULL, kid, kd, &kf), EMBKV_OK);
    uint64_t first = place_of(s, 5);
    CHECK(first != LOC_NONE && !(first & LOC_SSD));
    CHECK(slab_checked(s, loc_chunk(first), loc_index(first)));
    /* Rewritten until its record lands in the place checked above (the
     * old version is freed at the sync after; the free list is a stack). */
    uint64_t loc = first;
    int tries = 0;
    do {
        for (int j = 0; j < DIM; j++) v[j] = value(5, j) + (float)(tries + 1);
        CHECK_RC(embkv_put(s, 5, v, NULL, 0), EMBKV_OK);
        CHECK_RC(embkv_sync(s), EMBKV_OK);
        loc = place_of(s, 5);
        CHECK(!slab_checked(s, loc_chunk(loc), loc_index(loc)));  /* a new record, not checked yet */
    } while (loc != first && ++tries < 50);
    CHECK(loc == first);
    /* A stray write into the new record: found at the next pass. */
    rec_hdr *r = rec_at(s, loc);
    float *f = rec_vec(r);
    f[2] += 1.0f;
    CHECK_RC(embkv_knn(s, q, 1, 3, NULL, kid, kd, &kf), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 5:") != NULL);
    f[2] -= 1.0f;
    CHECK_RC(embkv_knn(s, q, 1, 3, NULL, kid, kd, &kf), EMBKV_OK);
    CHECK(slab_checked(s, loc_chunk(loc), loc_index(loc)));
    /* Row 7's entry pointed at row 6's record (both records checked): the
     * pass that streams the records would find 6 once and 7 never. */
    found_slot f7;
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    bool have = ix_find(ix, 7, embkv__hash(7), &f7);
    ebr_leave();
    CHECK(have);
    if (have) {
        uint64_t *sl = &ix->buckets[f7.bucket].slots[f7.slot].loc, was = *sl;
        *sl = place_of(s, 6);
        /* (A damaged index is met by a pass over it; the map of the records
         * kept from the search before was made from the sound one, and no
         * writer changed the index since to drop it: P11.) */
        atomic_store(&s->knn_clean, 0);
        CHECK_RC(embkv_knn(s, q, 1, 3, NULL, kid, kd, &kf), EMBKV_CORRUPT);
        CHECK(strstr(embkv_errmsg(), "id 7:") != NULL);
        *sl = was;
        int64_t all[10];
        double alld[10];
        CHECK_RC(embkv_knn(s, q, 1, 10, NULL, all, alld, &kf), EMBKV_OK);
        CHECK(kf == 10);
    }
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* ------------------------------------------------------------ C */

enum { R_ROOT, R_INDEX, R_RECORDS, R_META, R_ANY, R_TRUNCATE, R_KINDS };
static const char *const kind_name[R_KINDS] = {"root", "index", "records", "libpmemobj metadata",
                                               "anywhere", "truncation"};

typedef struct region {
    uint64_t off, len;
    int kind;
} region;

static region regions[8 + MAX_CHUNKS];
static size_t nregions;

/* The pool's parts: embkv's root, index and record chunks; libpmemobj's
 * headers, lanes and heap metadata (everything before the first object);
 * the whole file; and truncations. */
static void find_regions(void)
{
    PMEMobjpool *pop = pmemobj_open(pool_path, EMBKV_LAYOUT);
    CHECK(pop != NULL);
    if (!pop) exit(test_summary("test_damage"));
    PMEMoid root = pmemobj_root(pop, 0);
    store_root *r = pmemobj_direct(root);
    uint64_t first = root.off;
    regions[nregions++] = (region){root.off, sizeof *r, R_ROOT};
    regions[nregions++] = (region){r->index.off, r->nbuckets * BUCKET_BYTES, R_INDEX};
    if (r->index.off < first) first = r->index.off;
    const PMEMoid *c = pmemobj_direct(r->chunk_table);
    for (size_t i = 0; i < MAX_CHUNKS && !OID_IS_NULL(c[i]); i++) {
        regions[nregions++] = (region){c[i].off, r->chunk_bytes, R_RECORDS};
        if (c[i].off < first) first = c[i].off;
    }
    if (r->chunk_table.off < first) first = r->chunk_table.off;
    size_t len;
    free(read_file(pool_path, &len));
    regions[nregions++] = (region){0, first, R_META};
    regions[nregions++] = (region){0, len, R_ANY};
    regions[nregions++] = (region){0, len, R_TRUNCATE};
    pmemobj_close(pop);
}

typedef struct flip_job {
    int kind;
} flip_job;

/* Every read is exact or fails; a damaged index may also lose rows. */
static int read_all(void *arg)
{
    flip_job *j = arg;
    embkv_store *s = NULL;
    int rc = embkv_open(dir, NULL, 0, &s);
    if (rc != EMBKV_OK)
        return rc == EMBKV_CORRUPT || rc == EMBKV_NOTSTORE || rc == EMBKV_VERSION || rc == EMBKV_IO ? 0 : 5;
    int wrong = 0;
    float v[DIM];
    embkv_rowinfo info;
    for (int64_t id = 0; id < ROWS; id++) {
        rc = embkv_get(s, id, v, NULL, &info);
        if (rc == EMBKV_OK)
            for (int k = 0; k < DIM; k++) wrong += v[k] != value(id, k);
        else if (rc != EMBKV_CORRUPT && !(rc == EMBKV_NOTFOUND && j->kind == R_INDEX))
            wrong++;
    }
    int bad = 0;
    rc = embkv_scan(s, scan_cb, &bad);
    if (rc == EMBKV_OK) wrong += bad;
    embkv_check(s);
    /* Writes allocate: libpmemobj loads its heap metadata then. */
    for (int64_t id = ROWS; id < ROWS + 2000 && rc != EMBKV_CORRUPT; id++) {
        for (int k = 0; k < DIM; k++) v[k] = value(id, k);
        rc = embkv_put(s, id, v, NULL, 0);
    }
    embkv_close(s);
    return j->kind != R_INDEX && wrong ? 3 : 0;
}

/* EMBKV_DAMAGE_FLIPS=N runs N rounds (the crash-rate figure of docs/design.md
 * comes from N=1000), EMBKV_DAMAGE_KIND picks one kind of region, and
 * EMBKV_DAMAGE_SEED replays a failure. */
static void test_random_flips(void)
{
    size_t len;
    unsigned char *pristine = read_file(pool_path, &len), *work = malloc(len);
    const char *fixed = getenv("EMBKV_DAMAGE_SEED"), *nflips = getenv("EMBKV_DAMAGE_FLIPS");
    unsigned seed = fixed ? (unsigned)strtoul(fixed, NULL, 10) : (unsigned)time(NULL);
    printf("C: seed %u\n", seed);
    srand(seed);
    int rounds = nflips ? atoi(nflips) : (int)(150 * scale);  /* more: EMBKV_DAMAGE_FLIPS */
    if (rounds < 40) rounds = 40;
    int tried[R_KINDS] = {0}, crashes[R_KINDS] = {0}, hangs[R_KINDS] = {0}, wrong[R_KINDS] = {0};
    const char *only = getenv("EMBKV_DAMAGE_KIND");  /* e.g. "libpmemobj metadata" */
    for (int r = 0; r < rounds; r++) {
        const region *g = &regions[(size_t)rand() % nregions];
        if (only && strcmp(kind_name[g->kind], only) != 0) {
            r--;
            continue;
        }
        uint64_t at = g->off + (uint64_t)rand() % g->len;
        if (at >= len) continue;
        memcpy(work, pristine, len);
        if (g->kind == R_TRUNCATE) {
            write_file(pool_path, work, at);
        } else {
            work[at] ^= (unsigned char)(1 + rand() % 255);
            write_file(pool_path, work, len);
        }
        flip_job j = {g->kind};
        tried[g->kind]++;
        int st = in_child(read_all, &j);
        if (st == 128 + SIGALRM) hangs[g->kind]++;
        else if (st > 128) crashes[g->kind]++;
        else if (st != 0) wrong[g->kind]++;
        if (st) fprintf(stderr, "  %s at %llu: child status %d\n", kind_name[g->kind],
                        (unsigned long long)at, st);
    }
    write_file(pool_path, pristine, len);
    int all_crashes = 0, all_hangs = 0, all_wrong = 0;
    for (int k = 0; k < R_KINDS; k++) {
        printf("C: %-20s %4d rounds: %d crashed, %d hung, %d returned wrong data\n", kind_name[k], tried[k],
               crashes[k], hangs[k], wrong[k]);
        all_crashes += crashes[k], all_hangs += hangs[k], all_wrong += wrong[k];
    }
    CHECK(all_crashes == 0);
    CHECK(all_hangs == 0);
    CHECK(all_wrong == 0);
    free(work);
    free(pristine);
}

/* ------------------------------------------------------------ D */

/* A pool being created when its process was killed (store.pool.new) is
 * removed by the next open that takes the directory's lock. */
static void test_unfinished_pool(void)
{
    char d[600], tmp[700];
    snprintf(d, sizeof d, "%s", test_tmpdir("unfinished"));
    snprintf(tmp, sizeof tmp, "%s/store.pool.new", d);
    int killed_mid = 0;
    for (int round = 0; round < 6 && !killed_mid; round++) {
        char cmd[800];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
        if (system(cmd) != 0) break;
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            embkv_options o = {.dim = 64, .pool_size = 1ull << 30};
            embkv_store *s = NULL;
            embkv_open(d, &o, EMBKV_OPEN_CREATE, &s);
            _exit(0);
        }
        usleep(20000 + 20000 * round);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        killed_mid = access(tmp, F_OK) == 0;
    }
    if (!killed_mid) {  /* creation always won the race: leave one by hand */
        mkdir(d, 0755);
        FILE *f = fopen(tmp, "wb");
        CHECK(f && fputs("partial", f) >= 0);
        if (f) fclose(f);
    }
    printf("D: unfinished pool left by %s\n", killed_mid ? "a killed creation" : "hand");
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_NOTSTORE);  /* nothing finished there */
    embkv_options o = {.dim = 4, .pool_size = 16u << 20};
    CHECK_RC(embkv_open(d, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    CHECK(access(tmp, F_OK) != 0);  /* the creation removed it */
    struct stat st;
    char pool[700];
    snprintf(pool, sizeof pool, "%s/store.pool", d);
    CHECK(stat(pool, &st) == 0 && st.st_size == 16 << 20);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* A store directory whose pool file is gone but which holds the rest of a
 * store is neither opened nor created over (a table on it would read the
 * new store's rows as its own); embkv_destroy removes it.  What a killed
 * creation leaves (the unfinished pool and its dirty map) is still taken
 * over. */
static void expect_pool_missing(const char *d, const char *sign)
{
    embkv_store *s = NULL;
    embkv_options o = {.dim = 4, .pool_size = 16u << 20};
    CHECK_RC(embkv_open(d, &o, EMBKV_OPEN_CREATE, &s), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "store.pool is missing, but the directory holds the rest of a store") != NULL);
    if (!strstr(embkv_errmsg(), sign))
        fprintf(stderr, "expected %s in: %s\n", sign, embkv_errmsg());
    CHECK(strstr(embkv_errmsg(), sign) != NULL);
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), sign) != NULL);
}

static void rm_file(const char *d, const char *name)
{
    char p[800];
    snprintf(p, sizeof p, "%s/%s", d, name);
    CHECK(unlink(p) == 0);
}

static void test_pool_missing(void)
{
    char d[600];
    snprintf(d, sizeof d, "%s", test_tmpdir("poolgone"));
    embkv_options o = {.dim = 64, .pool_size = 16u << 20, .ssd_size = 64u << 20};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(d, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    float v[64] = {1};
    for (int64_t id = 0; id < 40000; id++)
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK_RC(embkv_tier_idle(s, 30000), EMBKV_OK);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.rows_ssd > 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    /* each sign, the others gone: the seal of a clean close, log
     * segments, a dirty map with no unfinished pool beside it */
    rm_file(d, "store.pool");
    expect_pool_missing(d, "(store.sealed)");
    /* Judged under the lock: while another process holds it (an
     * embkv_destroy removing the store, the pool first), EMBKV_LOCKED. */
    {
        char lockpath[800];
        snprintf(lockpath, sizeof lockpath, "%s/LOCK", d);
        int pfd[2];
        CHECK(pipe(pfd) == 0);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            int fd = open(lockpath, O_RDWR);
            if (fd < 0 || flock(fd, LOCK_EX) != 0) _exit(3);
            if (write(pfd[1], "x", 1) != 1) _exit(4);
            pause();
            _exit(0);
        }
        char c;
        CHECK(read(pfd[0], &c, 1) == 1);
        embkv_store *t = NULL;
        CHECK_RC(embkv_open(d, NULL, 0, &t), EMBKV_LOCKED);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(pfd[0]);
        close(pfd[1]);
        expect_pool_missing(d, "(store.sealed)");
    }
    rm_file(d, "store.sealed");
    expect_pool_missing(d, "(segments in log/)");
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/log'", d);
    CHECK(system(cmd) == 0);
    expect_pool_missing(d, "(store.dirty)");
    CHECK_RC(embkv_destroy(d), EMBKV_OK);
    CHECK(access(d, F_OK) != 0);

    /* What a killed creation leaves: taken over. */
    embkv_options small = {.dim = 4, .pool_size = 16u << 20};
    CHECK_RC(embkv_open(d, &small, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    CHECK_RC(embkv_close(s), EMBKV_OK);
    char from[800], to[800];
    snprintf(from, sizeof from, "%s/store.pool", d);
    snprintf(to, sizeof to, "%s/store.pool.new", d);
    CHECK(rename(from, to) == 0);
    rm_file(d, "store.sealed");
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_NOTSTORE);
    CHECK_RC(embkv_open(d, &small, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    CHECK(embkv_count(s) == 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_destroy(d), EMBKV_OK);
    printf("D: a store without its pool file refused (3 signs), removed by embkv_destroy\n");
}

/* A store of n rows of dim 4 at d, checkpointed, then written again (2,000
 * puts of rows after's ids, values after_vec) and SIGKILLed: a crash the
 * reopen must roll back to the checkpoint. */
static void crashed_store(const char *d, int64_t n, int64_t (*after)(int64_t k, int64_t n), const float *after_vec)
{
    embkv_options o = {.dim = 4, .pool_size = 16u << 20, .expected_rows = (uint64_t)n};
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        embkv_store *c = NULL;
        if (embkv_open(d, &o, EMBKV_OPEN_CREATE, &c) != EMBKV_OK) _exit(3);
        float v[4] = {1, 2, 3, 4};
        for (int64_t id = 0; id < n; id++)
            if (embkv_put(c, id, v, NULL, 0) != EMBKV_OK) _exit(4);
        if (embkv_sync(c) != EMBKV_OK) _exit(5);
        for (int64_t k = 0; k < 2000; k++)
            if (embkv_put(c, after(k, n), after_vec, NULL, 0) != EMBKV_OK) _exit(6);
        raise(SIGKILL);
        _exit(7);
    }
    int wst = 0;
    CHECK(waitpid(pid, &wst, 0) == pid && WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL);
}

/* len zero bytes at offset at of file path. */
static void zero_bytes(const char *path, uint64_t at, size_t len)
{
    char zero[4096] = {0};
    int fd = open(path, O_WRONLY);
    CHECK(len <= sizeof zero && fd >= 0 && pwrite(fd, zero, len, (off_t)at) == (ssize_t)len);
    if (fd >= 0) close(fd);
}

/* changes and inserts after the checkpoint */
static int64_t changes_and_inserts(int64_t k, int64_t n) { return k * 3 % (2 * n); }
/* changes only */
static int64_t changes(int64_t k, int64_t n) { (void)n; return k; }

/* After a crash, recovery returns to the last checkpoint, whose row count
 * the checkpoint recorded: an index page zeroed meanwhile (its rows gone)
 * is reported, as after a clean close, not opened short. */
static void test_zeroed_index_after_crash(void)
{
    char d[600], copy[700], cmd[2200], pool[800];
    snprintf(d, sizeof d, "%s", test_tmpdir("zeroidx"));
    snprintf(copy, sizeof copy, "%s.copy", d);
    snprintf(pool, sizeof pool, "%s/store.pool", d);
    const int64_t n = 20000;
    const float v[4] = {1, 2, 3, 4};
    crashed_store(d, n, changes_and_inserts, v);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", copy, d, copy);
    CHECK(system(cmd) == 0);
    /* The undamaged copy recovers to the checkpoint. */
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(copy, NULL, 0, &s), EMBKV_OK);
    if (s) {
        CHECK(embkv_count(s) == (uint64_t)n);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
    /* One page in the middle of the index, zeroed. */
    PMEMobjpool *pop = pmemobj_open(pool, EMBKV_LAYOUT);
    CHECK(pop != NULL);
    if (!pop) return;
    store_root *r = pmemobj_direct(pmemobj_root(pop, 0));
    uint64_t at = (r->index.off + r->nbuckets * BUCKET_BYTES / 2) & ~4095ull;
    pmemobj_close(pop);
    zero_bytes(pool, at, 4096);
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), " at that checkpoint: the index is damaged; restore the store from a backup") != NULL);
    printf("D: a zeroed index page after a crash: %s\n", embkv_errmsg());
    /* (and again: the refusal is not a one-off) */
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_CORRUPT);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", copy, d);
    CHECK(system(cmd) == 0);
}

/* After a crash, a damaged pool record among the versions recovery walks
 * leaves its row failing reads, naming it, as after a clean close: the
 * store opens, every other row as of the checkpoint. */
static void test_damaged_record_after_crash(void)
{
    char d[600], pool[800];
    snprintf(d, sizeof d, "%s", test_tmpdir("zerorec"));
    snprintf(pool, sizeof pool, "%s/store.pool", d);
    const int64_t n = 20000, target = 500;
    const float w[4] = {9, 9, 9, 9};  /* (so that a row not rolled back shows) */
    crashed_store(d, n, changes, w);
    /* The newest record of row `target`, zeroed (its whole page would also
     * zero the chunk's allocation header when the record is near the
     * chunk's start: then the open fails, naming the root). */
    PMEMobjpool *pop = pmemobj_open(pool, EMBKV_LAYOUT);
    CHECK(pop != NULL);
    if (!pop) return;
    store_root *r = pmemobj_direct(pmemobj_root(pop, 0));
    const bucket *bk = (const bucket *)(((uintptr_t)pmemobj_direct(r->index) + BUCKET_BYTES - 1) &
                                        ~(uintptr_t)(BUCKET_BYTES - 1));  /* (store.c: aligned) */
    const PMEMoid *chunks = pmemobj_direct(r->chunk_table);
    uint64_t at = 0;
    for (uint64_t b = 0; b < r->nbuckets && !at; b++)
        for (unsigned i = 0; i < BUCKET_SLOTS; i++)
            if ((bk[b].used & (1u << i)) && bk[b].slots[i].key == target) {
                uint64_t loc = bk[b].slots[i].loc;
                uintptr_t p = (uintptr_t)pmemobj_direct(chunks[loc_chunk(loc)]);
                char *recs = (char *)(((p + 63) & ~(uintptr_t)63) + 64 - sizeof(rec_hdr));  /* (slab.c) */
                at = (uint64_t)(recs + (size_t)loc_index(loc) * r->record_size - (char *)pop);
            }
    pmemobj_close(pop);
    CHECK(at > 0);
    if (!at) return;
    zero_bytes(pool, at, 64);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_OK);
    if (!s) return;
    CHECK(embkv_count(s) == (uint64_t)n);
    int64_t failed = 0, wrong = 0;
    for (int64_t id = 0; id < n; id++) {
        float g[4];
        int rc = embkv_get(s, id, g, NULL, NULL);
        if (rc == EMBKV_CORRUPT) {
            char want[64];
            snprintf(want, sizeof want, "id %lld: the record is damaged", (long long)id);
            CHECK(strstr(embkv_errmsg(), want) != NULL);
            failed++;
        } else {
            wrong += rc != EMBKV_OK || g[0] != 1 || g[3] != 4;
        }
    }
    CHECK_RC(embkv_get(s, target, NULL, NULL, NULL), EMBKV_CORRUPT);
    CHECK(failed == 1);
    CHECK(wrong == 0);
    printf("D: a zeroed record after a crash: the store opens, %lld row fails naming its id\n", (long long)failed);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_destroy(d), EMBKV_OK);
}

/* A pool whose signature and layout are embkv's but which libpmemobj then
 * refuses (damaged metadata) is damaged: EMBKV_CORRUPT naming store.pool.
 * It was EMBKV_NOTSTORE, which the SQLite binding reported as the path
 * option's fault (found by the adversarial review).  The first page past
 * the header whose flipped byte libpmemobj refuses is found by trying. */
static void test_refused_pool(void)
{
    size_t len = 0;
    unsigned char *orig = read_file(pool_path, &len);
    CHECK(orig != NULL && len > (1u << 20));
    if (!orig) return;
    int found = 0;
    for (size_t off = 8192; off < (1u << 20) && !found; off += 4096) {
        orig[off] ^= 0x55;
        write_file(pool_path, orig, len);
        orig[off] ^= 0x55;
        embkv_store *s = NULL;
        int rc = embkv_open(dir, NULL, 0, &s);
        if (rc == EMBKV_OK) {
            CHECK_RC(embkv_close(s), EMBKV_OK);
            continue;
        }
        found = 1;
        CHECK_RC(rc, EMBKV_CORRUPT);
        CHECK(strstr(embkv_errmsg(), "store.pool is damaged") != NULL);
        CHECK(strstr(embkv_errmsg(), ": restore the store from a backup") != NULL);
    }
    CHECK(found);
    write_file(pool_path, orig, len);
    free(orig);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, NULL, 0, &s), EMBKV_OK);
    if (s) CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* A file dropped into a store's directory: refused, with advice that
 * works when followed (a directory of another use keeps its message). */
static void test_stray_file(void)
{
    char d[600], stray[700];
    snprintf(d, sizeof d, "%s", test_tmpdir("stray"));
    embkv_options o = {.dim = 4};
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(d, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    CHECK_RC(embkv_close(s), EMBKV_OK);
    snprintf(stray, sizeof stray, "%s/.DS_Store", d);
    FILE *f = fopen(stray, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_NOTSTORE);
    char want[1400];
    snprintf(want, sizeof want, "store %s holds a file that is not the store's (.DS_Store): move it out of the "
             "directory (a store's directory holds its own files, and files named app-* of applications), then "
             "open it again", d);
    CHECK(strcmp(embkv_errmsg(), want) == 0);
    CHECK(unlink(stray) == 0);
    s = NULL;
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_OK);
    if (s) CHECK_RC(embkv_close(s), EMBKV_OK);
}

/* A cp -r of a store, opened beside the original in one process. */
static void test_byte_copy_open_twice(void)
{
    char d[600], copy[700], cmd[1500];
    snprintf(d, sizeof d, "%s", test_tmpdir("orig"));
    snprintf(copy, sizeof copy, "%s.copy", d);
    embkv_options o = {.dim = 4};
    embkv_store *s = NULL, *c = NULL;
    CHECK_RC(embkv_open(d, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return;
    CHECK_RC(embkv_close(s), EMBKV_OK);
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", d, copy);
    CHECK(system(cmd) == 0);
    CHECK_RC(embkv_open(d, NULL, 0, &s), EMBKV_OK);
    CHECK_RC(embkv_open(copy, NULL, 0, &c), EMBKV_BUSY);
    CHECK(strstr(embkv_errmsg(), "store.pool is a copy of a pool this process has open already") != NULL);
    if (s) CHECK_RC(embkv_close(s), EMBKV_OK);
    c = NULL;
    CHECK_RC(embkv_open(copy, NULL, 0, &c), EMBKV_OK);
    if (c) CHECK_RC(embkv_close(c), EMBKV_OK);
}

int main(void)
{
    /* A probe that libpmemobj's damaged metadata sends into a loop must be
     * refused well before the children's alarm. */
    setenv("EMBKV_PROBE_TIMEOUT", "3", 1);
    const char *sc = getenv("EMBKV_TEST_SCALE");
    if (sc) scale = atof(sc);
    build_store();
    test_refused_pool();
    test_record_flip();
    test_scan_flip();
    test_knn_checked_place();
    test_root_fields();
    find_regions();
    test_random_flips();
    test_unfinished_pool();
    test_pool_missing();
    test_zeroed_index_after_crash();
    test_damaged_record_after_crash();
    test_stray_file();
    test_byte_copy_open_twice();
    return test_summary("test_damage");
}
