/*
 * tier.c - placement of rows between the pool (the PM tier) and the SSD log.
 *
 * A row lives in exactly one home: a record in the pool, or a record in the
 * log (log.c), named by its index slot.  Log records are byte for byte the
 * pool's (header with id, prev, clock, epoch and checksum, then the payload),
 * so every check and the crash rules of sync.c hold for both:
 *
 *   - Demotion copies the coldest rows' current records to the log, makes
 *     them durable (log_sync) and only then points the index at the copies.
 *     A copy keeps its record's epoch and prev, so recovery treats it as it
 *     would the pool record: kept when its epoch is durable, else followed
 *     back to prev (still held: sync.c frees prev versions only after the
 *     sync that makes them unneeded).  The pool record is freed once no
 *     reader can be inside it; no checkpoint needs it (the copy is equal).
 *   - A write of a log-resident row writes its new version into the pool
 *     (write.c); the log record becomes garbage through the same
 *     pending/limbo path as a replaced pool record, and reclamation returns
 *     it to the log's live counts (sync.c), so segments empty out and are
 *     deleted after a sync.
 *   - Recovery must learn the epoch of log records appended since the last
 *     checkpoint: each sync records the log's end before its epoch switch,
 *     and only records at or past the durable epoch's mark are read.
 *
 * Which rows are coldest comes from a frequency sketch (heat.c) touched by
 * the read and write paths while the tier exists: demotion walks the index
 * from a cursor, samples eight pool-resident rows per row it must move and
 * moves the least touched (sampled eviction; measured against LRU on Zipf
 * traffic in bench/bench_heat.c).  Demotion runs in the tier's thread
 * (tier_worker.c) at a watermark, and in an allocating thread that finds
 * the pool full anyway, a batch at a time.
 *
 * Reads of log-resident rows go out as one batch per call (log_read: one
 * io_uring submission, O_DIRECT), after look-ahead's stage (lookahead.c).
 * Writes bring a row back to the pool.  Reads by id offer the rows they
 * read to promotion (embkv_get, embkv_get_batch, embkv_get_batch_at: point
 * reads, IN lists and pulls; not embkv_get_rows_at, the reads of scans,
 * exports and backups); admission (PROMOTE_MIN_HEAT) keeps those
 * read at least twice lately and hotter than what demotion last evicted,
 * and the thread copies them into the pool (the same switch as demotion,
 * the other way round).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tiers.h"

#define MIN_SSD_SIZE (4ull << 20)
#define DEMOTE_BATCH 4096
#define DEMOTE_SAMPLE 8
/* Reads admit a log row back into the pool when its estimated count is at
 * least this (a row read once, as by a scan, stays where it is) and above
 * the hottest row the last demotion evicted (TinyLFU's comparison, against
 * the victims demotion actually picks). */
#define PROMOTE_MIN_HEAT 2

/* dir made absolute without requiring it to exist (the log creates it). */
static int absolute_path(const char *in, char *out, size_t len)
{
    if (in[0] == '/')
        return snprintf(out, len, "%s", in) < (int)len ? 0 : -1;
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return -1;
    return snprintf(out, len, "%s/%s", cwd, in) < (int)len ? 0 : -1;
}

static void log_dir_of(const embkv_store *s, char *out, size_t len)
{
    if (s->root->ssd_path[0])
        snprintf(out, len, "%s", s->root->ssd_path);
    else
        snprintf(out, len, "%s/log", s->path);
}

static uint32_t segment_bytes_for(uint64_t ssd_size)
{
    uint64_t seg = ssd_size / 16;
    if (seg > LOG_DEFAULT_SEGMENT)
        seg = LOG_DEFAULT_SEGMENT;
    if (seg < (1u << 20))
        seg = 1u << 20;
    return (uint32_t)(seg & ~(uint64_t)(LOG_BLOCK - 1));
}

static void promo_free(embkv_store *s)
{
    free(s->promo_ids);
    free(s->promo_locs);
    free(s->promo_recs);
    s->promo_ids = NULL;
    s->promo_locs = NULL;
    s->promo_recs = NULL;
    s->promo_cap = s->promo_n = 0;
}

/* An ssd_path outside the store directory is named in a file inside it
 * (with the log's tag), written once the log is open and before its first
 * segment, so that embkv_destroy, which does not open the pool, removes
 * that log too. */
static int note_external_log(embkv_store *s, uint64_t tag, const char *dir)
{
    char path[PATH_MAX + 64], tmp[PATH_MAX + 80];
    snprintf(path, sizeof path, "%s/%s", s->path, SSD_PATH_FILE);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    bool ok = f && fprintf(f, "%llx\n%s\n", (unsigned long long)tag, dir) > 0 && fflush(f) == 0 &&
              fdatasync(fileno(f)) == 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return embkv__err(EMBKV_IO, "store %s: cannot write %s: %s", s->path, SSD_PATH_FILE, strerror(e));
    }
    int dfd = open(s->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    return EMBKV_OK;
}

/* The checks every open makes of the tier options against the root:
 * given is ssd_path made absolute ("" when not given), dir the log's
 * directory (the root's, or the new tier's); *tier false when no tier is
 * wanted or kept. */
static int tier_check(embkv_store *s, const embkv_options *opt, char *given, char *dir, size_t len, bool *tier)
{
    *tier = false;
    store_root *r = s->root;
    uint64_t want = opt ? opt->ssd_size : 0;
    const char *path = opt && opt->ssd_path && *opt->ssd_path ? opt->ssd_path : NULL;
    given[0] = 0;
    if (!memchr(r->ssd_path, 0, sizeof r->ssd_path) || (r->ssd_path[0] && r->ssd_path[0] != '/') ||
        (!r->ssd_size && (r->ssd_path[0] || r->log_tag)))
        return embkv__err(EMBKV_CORRUPT, "store %s: the pool's root object is damaged: bad SSD tier settings",
                          s->path);
    if (!r->ssd_size && !want) {
        if (path)
            return embkv__err(EMBKV_INVALID, "store %s: option ssd_path needs option ssd_size", s->path);
        return EMBKV_OK;
    }
    if (want && want < MIN_SSD_SIZE)
        return embkv__err(EMBKV_INVALID, "store %s: option ssd_size must be at least %llu bytes, got %llu",
                          s->path, (unsigned long long)MIN_SSD_SIZE, (unsigned long long)want);
    if (want && want < r->ssd_size)
        return embkv__err(EMBKV_INVALID, "store %s: option ssd_size %llu is below the store's %llu: the SSD tier "
                          "cannot shrink (leave ssd_size out, or 0, to take the store's)", s->path,
                          (unsigned long long)want, (unsigned long long)r->ssd_size);
    if (path && absolute_path(path, given, len) != 0)
        return embkv__err(EMBKV_INVALID, "store %s: option ssd_path is too long or unresolvable: %s", s->path, path);
    if (strlen(given) >= SSD_PATH_MAX)
        return embkv__err(EMBKV_INVALID, "store %s: option ssd_path is longer than %d bytes", s->path,
                          SSD_PATH_MAX - 1);
    if (path && !r->ssd_size) {
        /* A new tier's directory: the store's own log/ or outside any
         * store (another directory inside a store's bricks it: a store's
         * directory holds only its own files). */
        char store[PATH_MAX], at[PATH_MAX], found[PATH_MAX];
        if (!path_resolve(s->path, store, sizeof store))
            snprintf(store, sizeof store, "%s", s->path);
        if (!path_resolve(given, at, sizeof at))
            snprintf(at, sizeof at, "%s", given);
        size_t sl = strlen(store);
        bool in_own = !strncmp(at, store, sl) && (at[sl] == '/' || at[sl] == 0);
        bool is_own_log = in_own && !strcmp(at + sl, "/" LOG_DIR);
        bool nested = in_own || path_below_file(given, POOL_FILE, found, sizeof found);
        if (in_own)
            snprintf(found, sizeof found, "%s", store);
        if (nested && !is_own_log)
            return embkv__err(EMBKV_INVALID, "store %s: option ssd_path %s is inside the embkv store %s, whose "
                              "directory holds only its own files: name a directory outside it (or leave "
                              "ssd_path out: the log goes to %s/%s)", s->path, path, found, s->path, LOG_DIR);
        if (!in_own && log_dir_above(at, found, sizeof found))
            return embkv__err(EMBKV_INVALID, "store %s: option ssd_path %s is inside %s, the SSD log of another "
                              "store, which holds only that store's segments: name a directory outside it (or "
                              "leave ssd_path out: the log goes to %s/%s)", s->path, path, found, s->path, LOG_DIR);
    }
    if (r->ssd_size) {
        log_dir_of(s, dir, len);
        if (path && strcmp(given, dir) != 0)
            return embkv__err(EMBKV_INVALID, "store %s: option ssd_path is %s, the store's SSD tier is at %s",
                              s->path, given, dir);
    } else if (snprintf(dir, len, "%s%s%s", path ? given : s->path, path ? "" : "/", path ? "" : LOG_DIR) >=
               (int)len) {
        return embkv__err(EMBKV_INVALID, "store %s: the SSD log's directory name is too long", s->path);
    }
    *tier = true;
    return EMBKV_OK;
}

int tier_check_open(embkv_store *s, const embkv_options *opt)
{
    char given[PATH_MAX], dir[PATH_MAX];
    bool tier;
    int rc = tier_check(s, opt, given, dir, sizeof dir, &tier);
    if (rc != EMBKV_OK)
        return rc;
    /* The log, its size and the record space's bound are fixed while the
     * store is open: another table may share them, not change them. */
    uint64_t want = opt ? opt->ssd_size : 0;
    if (want > s->root->ssd_size)
        return embkv__err(EMBKV_INVALID, "store %s: option ssd_size %llu: the store is already open in this "
                          "process with %s%llu; a tier is added or raised only by the open that opens the store",
                          s->path, (unsigned long long)want, s->root->ssd_size ? "ssd_size " : "no SSD tier, ssd_size ",
                          (unsigned long long)s->root->ssd_size);
    return EMBKV_OK;
}

int tier_open(embkv_store *s, const embkv_options *opt)
{
    store_root *r = s->root;
    uint64_t want = opt ? opt->ssd_size : 0;
    const char *path = opt && opt->ssd_path && *opt->ssd_path ? opt->ssd_path : NULL;
    char given[PATH_MAX], dir[PATH_MAX];
    bool tier;
    int crc = tier_check(s, opt, given, dir, sizeof dir, &tier);
    if (crc != EMBKV_OK || !tier)
        return crc;
    bool adding = r->ssd_size == 0;
    uint64_t tag = r->log_tag;
    if (adding) {
        if (getrandom(&tag, sizeof tag, 0) != (ssize_t)sizeof tag)
            tag = (uint64_t)getpid() * 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
        tag |= 1;  /* never 0: a root with a tier always has one */
    }
    uint64_t size = want > r->ssd_size ? want : r->ssd_size;
    char what[PATH_MAX + SSD_PATH_MAX + 64];
    snprintf(what, sizeof what, "store %s: ssd_path %s", s->path, dir);
    log_options lo = {.dir = dir, .what = what, .max_bytes = size, .record_bytes = s->rec_size,
                      .segment_bytes = segment_bytes_for(size), .tag = tag,
                      .no_uring = getenv("EMBKV_NO_URING") && *getenv("EMBKV_NO_URING") == '1'};
    if (adding && path) {
        /* A new tier's log starts empty: segments there are another
         * store's (or a dropped one's), never to be taken over. */
        DIR *d = opendir(given);
        struct dirent *e;
        while (d && (e = readdir(d)))
            if (!strncmp(e->d_name, "seg-", 4)) {
                char name[64];
                snprintf(name, sizeof name, "%.60s", e->d_name);
                closedir(d);
                return embkv__err(EMBKV_INVALID, "store %s: option ssd_path %s already holds segment files (%s) "
                                  "of another store", s->path, given, name);
            }
        if (d)
            closedir(d);
    }
    int rc = log_open(&lo, &s->log);
    if (rc != EMBKV_OK)
        return rc;
    /* Noted once the log holds the directory (its lock): a store refused
     * it because another store's log has it must not name it, or removing
     * the refused store would remove the other's directory. */
    if (adding && path && (rc = note_external_log(s, tag, given)) != EMBKV_OK) {
        log_close(s->log);
        s->log = NULL;
        return rc;
    }
    if (!adding) {
        uint64_t d = r->durable_epoch;
        if (r->log_tail_epoch[d & 1] == d)
            log_expect_end(s->log, r->log_tail[d & 1]);
    }
    if (size != r->ssd_size) {
        if (adding) {
            memcpy(r->ssd_path, path ? given : "", path ? strlen(given) + 1 : 1); /* length checked above */
            r->log_tag = tag;
            memset(r->log_tail, 0, sizeof r->log_tail);
            memset(r->log_tail_epoch, 0, sizeof r->log_tail_epoch);
            pmemobj_persist(s->pop, &r->log_tag, (size_t)((char *)(r + 1) - (char *)&r->log_tag));
        }
        /* The size last: a root with a size has its path and tag. */
        r->ssd_size = size;
        pmemobj_persist(s->pop, &r->ssd_size, sizeof r->ssd_size);
    }
    /* The pool holds the index of every row of both tiers, and chunks are
     * never given back: keep the room the index may grow into out of the
     * record space, for as many rows as both tiers could hold, at most half
     * the pool.  A doubling needs the new array beside the old one, and
     * the arrays freed by earlier doublings may lie in holes between
     * chunks: twice the last array covers both.  Past that index, inserts
     * fail naming the pool. */
    uint64_t max_rows = size / s->rec_size + s->pool_size / s->rec_size;
    uint64_t nb = index_buckets_for(max_rows, s->max_load);
    uint64_t keep = nb > s->pool_size / BUCKET_BYTES ? s->pool_size : 2 * nb * BUCKET_BYTES;
    if (keep > s->pool_size / 2)
        keep = s->pool_size / 2;
    /* libpmemobj's own: 3 MiB of lanes, the heap's headers */
    uint64_t own = (4u << 20) + s->pool_size / 64;
    uint64_t room = s->pool_size > keep + own ? s->pool_size - keep - own : 0;
    uint64_t per = (uint64_t)s->chunk_bytes + 64;
    s->chunk_limit = room / per > 1 ? (uint32_t)(room / per < MAX_CHUNKS ? room / per : MAX_CHUNKS) : 1;
    /* Promotion's queue: 8 MiB of records (at least 64). */
    size_t pc = (8u << 20) / s->rec_size;
    pc = pc < 64 ? 64 : pc;
    s->promo_ids = malloc(pc * sizeof *s->promo_ids);
    s->promo_locs = malloc(pc * sizeof *s->promo_locs);
    s->promo_recs = malloc(pc * (size_t)s->rec_size);
    if (s->promo_ids && s->promo_locs && s->promo_recs)
        s->promo_cap = pc;
    if (!s->promo_cap) {
        promo_free(s);
        log_close(s->log);
        s->log = NULL;
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for the access statistics", s->path);
    }
    return EMBKV_OK;
}

void tier_close(embkv_store *s)
{
    la_close(s);
    promo_free(s);
    if (s->log)
        log_close(s->log);
    s->log = NULL;
}

/* The log's message, with the id whose read failed in front. */
static int read_failed(embkv_store *s, int rc, int64_t id)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", embkv_errmsg());
    return embkv__err(rc, "id %lld: %s", (long long)id, msg);
}

/* A log record whose checksum or id does not match: the message names
 * the segment file, for whoever restores it. */
static int log_rec_damaged(embkv_store *s, int64_t id, uint64_t loc)
{
    char name[32];
    log_segment_name(loc_plain(loc), name, sizeof name);
    return embkv__err(EMBKV_CORRUPT, "store %s: id %lld: its record in the SSD log is damaged (checksum mismatch "
                      "in %s at offset %llu): delete the row (it can be deleted) and write it again, or restore "
                      "the store from a backup", s->path, (long long)id, name,
                      (unsigned long long)log_loc_off(loc_plain(loc)));
}

static inline bool in_log(uint64_t loc) { return (loc & LOC_SSD) && !(loc & LOC_TOMB); }

int tier_read(embkv_store *s, const int64_t *ids, const uint64_t *locs, size_t n, char **buf, rec_hdr **recs,
              bool for_write)
{
    *buf = NULL;
    size_t k = 0, first = 0;
    for (size_t i = n; i-- > 0;)
        if (in_log(locs[i])) {
            k++;
            first = i;
        }
    if (k == 0)
        return EMBKV_OK;
    if (!s->log)
        return embkv__err(EMBKV_CORRUPT, "store %s: id %lld points to an SSD tier this store does not have",
                          s->path, (long long)ids[first]);
    uint64_t *q = malloc(k * sizeof *q);
    size_t *at = malloc(k * sizeof *at);
    char *b = malloc(k * (size_t)s->rec_size);
    int rc = EMBKV_OK;
    if (!q || !at || !b)
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory reading %zu rows from the SSD tier", s->path, k);
    for (size_t i = first, j = 0; i < n && rc == EMBKV_OK; i++) {
        if (!in_log(locs[i]))
            continue;
        if (!log_loc_plausible(s->log, locs[i]))
            rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld points outside the SSD log", s->path,
                            (long long)ids[i]);
        at[j] = i;
        q[j++] = locs[i];
    }
    /* Rows look-ahead staged (or is reading) come from the stage; the
     * rest from the log, in one batch. */
    size_t staged = 0;
    uint8_t *got = NULL;
    if (rc == EMBKV_OK && s->la) {
        int64_t *kid = malloc(k * sizeof *kid);
        got = malloc(k);
        if (!kid || !got) {
            rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory reading %zu rows from the SSD tier", s->path, k);
        } else {
            for (size_t j = 0; j < k; j++)
                kid[j] = ids[at[j]];
            staged = la_take(s, kid, q, k, b, got, for_write);
        }
        free(kid);
    }
    if (rc == EMBKV_OK && staged < k) {
        uint64_t t0 = now_ns();
        size_t bad = 0;
        if (staged == 0) {
            if ((rc = log_read(s->log, q, k, b, &bad)) != EMBKV_OK)
                rc = read_failed(s, rc, ids[at[bad]]);
        } else {
            /* The misses packed in front, read, and put back in place. */
            size_t m = 0;
            size_t *from = malloc((k - staged) * sizeof *from);
            uint64_t *mq = malloc((k - staged) * sizeof *mq);  /* q stays whole: errors below name q[j] */
            char *tmp = malloc((k - staged) * (size_t)s->rec_size);
            if (!from || !mq || !tmp)
                rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory reading %zu rows from the SSD tier", s->path, k);
            for (size_t j = 0; j < k && rc == EMBKV_OK; j++)
                if (!got[j]) {
                    from[m] = j;
                    mq[m++] = q[j];
                }
            if (rc == EMBKV_OK && (rc = log_read(s->log, mq, m, tmp, &bad)) != EMBKV_OK)
                rc = read_failed(s, rc, ids[at[from[bad]]]);
            for (size_t j = 0; j < m && rc == EMBKV_OK; j++)
                memcpy(b + from[j] * s->rec_size, tmp + j * s->rec_size, s->rec_size);
            free(from);
            free(mq);
            free(tmp);
        }
        atomic_fetch_add_explicit(&s->st_ssd_wait_ns, now_ns() - t0, memory_order_relaxed);
    }
    free(got);
    for (size_t j = 0; j < k && rc == EMBKV_OK; j++) {
        rec_hdr *r = (rec_hdr *)(b + j * s->rec_size);
        if (!rec_ok(s, r, ids[at[j]]))
            rc = log_rec_damaged(s, ids[at[j]], q[j]);
        recs[at[j]] = r;
    }
    free(q);
    free(at);
    if (rc != EMBKV_OK)
        free(b);
    else
        *buf = b;
    return rc;
}

int tier_rec(embkv_store *s, int64_t id, uint64_t loc, char **buf, rec_hdr **out, bool for_write)
{
    if (!(loc & LOC_SSD)) {
        *buf = NULL;
        *out = rec_at(s, loc);
        return EMBKV_OK;
    }
    return tier_read(s, &id, &loc, 1, buf, out, for_write);
}

/* ------------------------------------------------------------ demotion */

typedef struct cand {
    int64_t id;
    uint64_t loc;
    unsigned heat;
} cand;

static int cmp_cand(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    return (x->heat > y->heat) - (x->heat < y->heat);
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Whether an explicit promotion running now keeps id (under demote_mu). */
static bool kept(const embkv_store *s, int64_t id)
{
    return s->demote_keep_n && bsearch(&id, s->demote_keep, s->demote_keep_n, sizeof id, cmp_id);
}

/* This thread runs an explicit promotion (tier_promote_ids): its own
 * demotions take none of the rows it keeps. */
static _Thread_local bool promoting_here;

/* Up to cap pool-resident rows from the cursor on, with their heat. */
static size_t sample_rows(embkv_store *s, cand *c, size_t cap)
{
    size_t n = 0;
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    uint64_t b = s->demote_cursor & ix->mask;
    for (uint64_t seen = 0; seen < ix->nbuckets && n + BUCKET_SLOTS <= cap; seen++, b = (b + 1) & ix->mask) {
        int64_t ids[BUCKET_SLOTS];
        uint64_t locs[BUCKET_SLOTS];
        unsigned m = ix_bucket_rows(&ix->buckets[b], ids, locs, false);
        for (unsigned i = 0; i < m; i++) {
            if (locs[i] & LOC_SSD)
                continue;
            c[n].id = ids[i];
            c[n].loc = locs[i];
            n++;
        }
    }
    s->demote_cursor = b;
    ebr_leave();
    for (size_t i = 0; i < n; i++)
        c[i].heat = s->heat ? heat_estimate(s->heat, embkv__hash(c[i].id)) : 0;
    return n;
}

static int demote_batch(embkv_store *s, size_t want, size_t *moved, bool use_keep)
{
    size_t cap = want * DEMOTE_SAMPLE + BUCKET_SLOTS;
    cand *c = malloc(cap * sizeof *c);
    char *buf = malloc(want * (size_t)s->rec_size);
    uint64_t *p = malloc(want * sizeof *p), *q = malloc(want * sizeof *q);
    int64_t *ids = malloc(want * sizeof *ids);
    int rc = EMBKV_OK;
    if (!c || !buf || !p || !q || !ids) {
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory moving rows to the SSD tier", s->path);
        goto out;
    }
    size_t n = sample_rows(s, c, cap);
    qsort(c, n, sizeof *c, cmp_cand);
    /* The coldest `want`, copied while no reader can see their records
     * reused; a copy that fails its checksum was being replaced: skip it. */
    size_t k = 0;
    ebr_enter();
    for (size_t i = 0; i < n && k < want; i++) {
        if (use_keep && kept(s, c[i].id))
            continue;
        rec_hdr *r = rec_at(s, c[i].loc);
        char *to = buf + k * s->rec_size;
        memcpy(to, r, s->rec_size);
        if (!rec_ok(s, (rec_hdr *)to, c[i].id) || (((rec_hdr *)to)->epoch & REC_TOMB))
            continue;
        ids[k] = c[i].id;
        p[k++] = c[i].loc;
    }
    ebr_leave();
    if (k == 0)
        goto out;
    if ((rc = log_append(s->log, buf, k, q, false)) != EMBKV_OK) {
        /* (the log knows no snapshot: what it says of checkpoints holds
         * only once they end) */
        if (rc == EMBKV_FULL && atomic_load(&s->snap_floor) != UINT64_MAX)
            rc = embkv__err(rc, "%s; open snapshots (a long SELECT, an export, an online backup) keep what "
                            "compaction emptied until they end: end them first", embkv_errmsg());
        goto out;
    }
    /* Durable before any index entry points at it (P1). */
    if ((rc = log_sync(s->log)) != EMBKV_OK) {
        for (size_t i = 0; i < k; i++)
            log_release(s->log, q[i]);
        goto out;
    }
    size_t m = 0;
    unsigned hottest = 0;
    pthread_rwlock_rdlock(&s->writers);
    for (size_t i = 0; i < k; i++) {
        if (ix_switch(s, ids[i], p[i], q[i], (const rec_hdr *)(buf + i * s->rec_size))) {
            p[m++] = p[i];
            unsigned hv = s->heat ? heat_estimate(s->heat, embkv__hash(ids[i])) : 0;
            hottest = hv > hottest ? hv : hottest;
        } else {
            log_release(s->log, q[i]);  /* replaced meanwhile: the copy is garbage */
        }
    }
    /* (Before the wait below: this frees the pool records with slab_free,
     * not slab_retire, so the clear of writers_unlock is what tells a kept
     * kNN map they go, P11.) */
    writers_unlock(s);
    /* Admission compares rows read from the log with what was evicted. */
    atomic_store(&s->evicted_heat, hottest);
    /* Readers that found the pool records may still copy them. */
    ebr_synchronize();
    slab_free(s, p, m);
    atomic_fetch_add(&s->rows_ssd, m);
    atomic_fetch_add(&s->st_demotions, m);
    *moved += m;
out:
    free(c);
    free(buf);
    free(p);
    free(q);
    free(ids);
    return rc;
}

int tier_demote(embkv_store *s, size_t want, size_t *moved)
{
    *moved = 0;
    if (!s->log)
        return EMBKV_OK;
    compact_pay(s, want);
    int rc = EMBKV_OK;
    pthread_mutex_lock(&s->demote_mu);
    bool use_keep = true;
    for (int empty = 0; *moved < want && rc == EMBKV_OK && empty < 2;) {
        size_t before = *moved, b = want - *moved < DEMOTE_BATCH ? want - *moved : DEMOTE_BATCH;
        rc = demote_batch(s, b, moved, use_keep);
        empty = *moved == before ? empty + 1 : 0;
        /* A writer (or the tier's thread) that finds only rows a promotion
         * keeps takes them rather than fail: the promotion gives way. */
        if (empty && use_keep && s->demote_keep_n && !promoting_here)
            use_keep = false;
    }
    pthread_mutex_unlock(&s->demote_mu);
    return rc;
}


/* ------------------------------------------------------------ promotion */

/* Queues rows read from the log that admission lets in, for the tier's
 * thread to promote (explicit moves promote their own: tier_promote_ids). */
void tier_note_read(embkv_store *s, const int64_t *ids, const uint64_t *locs, rec_hdr *const *recs, size_t n)
{
    if (!s->heat || !s->promo_cap)
        return;
    unsigned bar = atomic_load(&s->evicted_heat);
    pthread_mutex_lock(&s->promo_mu);
    for (size_t i = 0; i < n && s->promo_n < s->promo_cap; i++) {
        if (!in_log(locs[i]))
            continue;
        unsigned h = heat_estimate(s->heat, embkv__hash(ids[i]));
        if (h < PROMOTE_MIN_HEAT || h <= bar)
            continue;
        s->promo_ids[s->promo_n] = ids[i];
        s->promo_locs[s->promo_n] = locs[i];
        memcpy(s->promo_recs + s->promo_n * s->rec_size, recs[i], s->rec_size);
        s->promo_n++;
    }
    pthread_mutex_unlock(&s->promo_mu);
}

/* For explicit moves: what is free above the high watermark (tier_worker.c
 * keeps that much for writers), more only by demoting colder rows. */
static size_t move_room(embkv_store *s)
{
    size_t free_recs, total;
    bool exhausted;
    slab_space(s, &free_recs, &total, &exhausted);
    /* (A pool that may still grow: its moves add chunks, leaving what
     * groups hold free: slab_alloc_move.) */
    size_t high = total / 16 + s->delete_reserve + atomic_load(&s->room_held);
    return !exhausted ? SIZE_MAX : free_recs > high ? free_recs - high : 0;
}

/* Records the pool can hold at most, less the high watermark's free part:
 * more promotions than that would only demote each other. */
static size_t pool_room_total(embkv_store *s)
{
    size_t free_recs, total;
    bool exhausted;
    slab_space(s, &free_recs, &total, &exhausted);
    size_t cap = exhausted || !s->chunk_limit ? total : (size_t)s->chunk_limit * s->recs_per_chunk;
    if (cap < total)
        cap = total;
    size_t keep = cap / 16 + s->delete_reserve;
    return cap > keep ? cap - keep : 0;
}

static int promote_batch(embkv_store *s, int64_t *ids, uint64_t *q, char *recs, size_t n, size_t room,
                         bool make_room, size_t *moved);

int tier_promote_ids(embkv_store *s, const int64_t *ids, size_t n, size_t *moved)
{
    *moved = 0;
    if (!s->log || !s->promo_cap || n == 0)
        return EMBKV_OK;
    /* The first ids that fit: the later ones would push them out again. */
    size_t fit = pool_room_total(s);
    if (n > fit)
        n = fit;
    size_t per = s->promo_cap / 2;
    int64_t *cid = malloc(per * sizeof *cid);
    uint64_t *loc = malloc(per * sizeof *loc);
    rec_hdr **recs = malloc(per * sizeof *recs);
    int64_t *keep = malloc((n ? n : 1) * sizeof *keep);
    int rc = EMBKV_OK;
    if (!cid || !loc || !recs || !keep)
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory promoting %zu rows", s->path, n);
    /* The demotions that make room for these rows take none of them,
     * those in the pool already included (their heat ties with the
     * promoted ones' at the top). */
    pthread_mutex_lock(&s->keep_mu);
    promoting_here = true;
    if (keep) {
        memcpy(keep, ids, n * sizeof *keep);
        qsort(keep, n, sizeof *keep, cmp_id);
        pthread_mutex_lock(&s->demote_mu);
        s->demote_keep = keep;
        s->demote_keep_n = n;
        pthread_mutex_unlock(&s->demote_mu);
    }
    for (size_t i = 0; i < n && rc == EMBKV_OK;) {
        size_t k = 0;
        ebr_enter();
        index_desc *ix = atomic_load(&s->ix);
        for (; i < n && k < per; i++) {
            uint64_t l = ix_lookup(ix, ids[i], embkv__hash(ids[i]), NULL);
            if (in_log(l)) {
                cid[k] = ids[i];
                loc[k++] = l;
            }
        }
        char *buf = NULL;
        if (k && tier_read(s, cid, loc, k, &buf, recs, false) != EMBKV_OK) {
            /* A damaged record fails its batch: the others are read one by
             * one, and a damaged one stays where reading it says so. */
            size_t w = 0;
            char *one = NULL;
            buf = malloc(k * (size_t)s->rec_size);
            for (size_t j = 0; j < k && buf; j++) {
                rec_hdr *r;
                if (tier_read(s, &cid[j], &loc[j], 1, &one, &r, false) != EMBKV_OK)
                    continue;
                memcpy(buf + w * s->rec_size, r, s->rec_size);
                cid[w] = cid[j];
                loc[w++] = loc[j];
                free(one);
            }
            k = buf ? w : 0;
            for (size_t j = 0; j < k; j++)
                recs[j] = (rec_hdr *)(buf + j * s->rec_size);
        }
        ebr_leave();
        /* The caller says these rows are hot: the sketch is told so, or the
         * demotions that make room for the next ones would take them. */
        for (size_t j = 0; j < k; j += 256) {
            uint64_t hh[256];
            size_t m = k - j < 256 ? k - j : 256;
            for (size_t q = 0; q < m; q++)
                hh[q] = embkv__hash(cid[j + q]);
            heat_saturate_batch(s->heat, hh, m);
        }
        /* The records are copies: the queue takes them outside the epoch,
         * and promotion (which waits for readers) may run between. */
        /* A reopened store learns the pool's limit only when a chunk is
         * refused: its room is asked for first, and made by demotion. */
        if (k && slab_room_for(s, k, 0, false) == EMBKV_FULL) {
            size_t freed = 0;
            tier_demote(s, k, &freed);
        }
        /* Promoted here, not through the queue that admission fills: the
         * tier's thread drains that one too, and under load it took these
         * rows, promoted what its own room allowed, dropped the rest, and
         * the call said it moved none. */
        if (k && rc == EMBKV_OK) {
            int64_t *bi = malloc(k * sizeof *bi);
            uint64_t *bq = malloc(k * sizeof *bq);
            char *br = malloc(k * (size_t)s->rec_size);
            if (!bi || !bq || !br) {
                free(bi);
                free(bq);
                free(br);
                rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory promoting %zu rows", s->path, k);
            } else {
                memcpy(bi, cid, k * sizeof *bi);
                memcpy(bq, loc, k * sizeof *bq);
                for (size_t j = 0; j < k; j++)
                    memcpy(br + j * s->rec_size, recs[j], s->rec_size);
                size_t m = 0;
                rc = promote_batch(s, bi, bq, br, k, move_room(s), true, &m);
                *moved += m;
            }
        }
        free(buf);
    }
    pthread_mutex_lock(&s->demote_mu);
    s->demote_keep = NULL;
    s->demote_keep_n = 0;
    pthread_mutex_unlock(&s->demote_mu);
    promoting_here = false;
    pthread_mutex_unlock(&s->keep_mu);
    free(keep);
    free(cid);
    free(loc);
    free(recs);
    return rc;
}

/* Promotes n rows read from the log (ids, their locations q, copies of
 * their records): at most `room` of them, more by demoting colder rows
 * when make_room.  Takes the arrays (freed here). */
static int promote_batch(embkv_store *s, int64_t *ids, uint64_t *q, char *recs, size_t n, size_t room,
                         bool make_room, size_t *moved)
{
    *moved = 0;
    uint64_t *p = malloc(n * sizeof *p);
    if (!p) {
        free(ids);
        free(q);
        free(recs);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory promoting rows", s->path);
    }

    /* Only rows the index still keeps where they were read (a pull's push
     * has usually brought them back already), each once (a row read in
     * several batches was offered by each: p marks the locations seen). */
    size_t k = 0, mask = 1;
    while (mask < 2 * n)
        mask <<= 1;
    uint64_t *seen = calloc(mask, sizeof *seen);
    mask--;
    ebr_enter();
    index_desc *ix = atomic_load(&s->ix);
    for (size_t i = 0; i < n && seen; i++) {
        uint32_t probes;
        if (ix_lookup(ix, ids[i], embkv__hash(ids[i]), &probes) != q[i])
            continue;
        size_t h = embkv__hash((int64_t)q[i]) & mask;
        while (seen[h] && seen[h] != q[i])
            h = (h + 1) & mask;
        if (seen[h])
            continue;
        seen[h] = q[i];
        ids[k] = ids[i];
        q[k] = q[i];
        memmove(recs + k * s->rec_size, recs + i * s->rec_size, s->rec_size);
        k++;
    }
    ebr_leave();
    free(seen);
    /* Admitted rows are hotter than what demotion last moved out: when the
     * pool has no room above its watermark, the coldest rows make it. */
    if (k > room && make_room) {
        size_t freed = 0;
        tier_demote(s, k - room, &freed);
        room += freed;
    }
    if (k > room)
        k = room;
    if (k && slab_alloc_move(s, p, k) != EMBKV_OK)
        k = 0;  /* no room after all (or held by a group): the rows stay in the log */
    size_t m = 0;
    if (k) {
        pthread_rwlock_rdlock(&s->writers);
        for (size_t i = 0; i < k; i++) {
            rec_hdr *d = rec_at(s, p[i]);
            memcpy(d, recs + i * s->rec_size, s->rec_size);
            persist_range(s, d, s->rec_size);
        }
        persist_barrier(s);  /* the copies are durable before the index names them (P1) */
        for (size_t i = 0; i < k; i++) {
            if (ix_switch(s, ids[i], q[i], p[i], NULL)) {
                q[m] = q[i];
                ids[m++] = ids[i];
            } else {
                slab_free(s, &p[i], 1);  /* written meanwhile */
            }
        }
        writers_unlock(s);
        /* Readers that found the log locations may still read them. */
        ebr_synchronize();
        for (size_t i = 0; i < m; i++)
            log_release(s->log, q[i]);
        atomic_fetch_sub(&s->rows_ssd, m);
        atomic_fetch_add(&s->st_promotions, m);
    }
    *moved = m;
    free(ids);
    free(q);
    free(p);
    free(recs);
    return EMBKV_OK;
}

int tier_promote_queued(embkv_store *s, size_t room, bool make_room, size_t *moved)
{
    *moved = 0;
    pthread_mutex_lock(&s->promo_mu);
    size_t n = s->promo_n;
    if (n == 0) {
        pthread_mutex_unlock(&s->promo_mu);
        return EMBKV_OK;
    }
    int64_t *ids = malloc(n * sizeof *ids);
    uint64_t *q = malloc(n * sizeof *q);
    char *recs = malloc(n * (size_t)s->rec_size);
    if (!ids || !q || !recs) {
        pthread_mutex_unlock(&s->promo_mu);
        free(ids);
        free(q);
        free(recs);
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory promoting rows", s->path);
    }
    memcpy(ids, s->promo_ids, n * sizeof *ids);
    memcpy(q, s->promo_locs, n * sizeof *q);
    memcpy(recs, s->promo_recs, n * (size_t)s->rec_size);
    s->promo_n = 0;
    pthread_mutex_unlock(&s->promo_mu);
    return promote_batch(s, ids, q, recs, n, room, make_room, moved);
}

size_t tier_promote_pending(embkv_store *s)
{
    pthread_mutex_lock(&s->promo_mu);
    size_t n = s->promo_n;
    pthread_mutex_unlock(&s->promo_mu);
    return n;
}

/* ------------------------------------------------------------ checkpoints */

uint64_t tier_sync_tail(embkv_store *s) { return s->log ? log_end(s->log) : 0; }

int tier_sync_log(embkv_store *s, uint64_t epoch, uint64_t tail)
{
    if (!s->log)
        return EMBKV_OK;
    int rc = log_sync(s->log);
    if (rc != EMBKV_OK)
        return rc;
    store_root *r = s->root;
    r->log_tail[epoch & 1] = tail;
    r->log_tail_epoch[epoch & 1] = epoch;
    pmemobj_persist(s->pop, &r->log_tail[epoch & 1], sizeof r->log_tail[0]);
    pmemobj_persist(s->pop, &r->log_tail_epoch[epoch & 1], sizeof r->log_tail_epoch[0]);
    return EMBKV_OK;
}

void tier_sync_done(embkv_store *s)
{
    if (s->log)
        log_delete_dead(s->log);
}

bool tier_after_tail(embkv_store *s, uint64_t loc)
{
    store_root *r = s->root;
    uint64_t d = r->durable_epoch, tail = r->log_tail_epoch[d & 1] == d ? r->log_tail[d & 1] : 0;
    return (loc & ~LOC_FLAGS) >= (tail & ~LOC_FLAGS);
}

void tier_count_row(embkv_store *s, uint64_t loc)
{
    log_hold(s->log, loc);
    atomic_fetch_add(&s->rows_ssd, 1);
}

uint64_t tier_log_room(embkv_store *s)
{
    if (!s->log)
        return 0;
    log_stats st;
    log_stats_get(s->log, &st);
    uint64_t usable = s->root->ssd_size > log_segment_bytes(s->log) ? s->root->ssd_size - log_segment_bytes(s->log) : 0;
    if (usable <= st.live_bytes)
        return 0;
    uint64_t blocks = (usable - st.live_bytes) / LOG_BLOCK;
    if (s->rec_size <= LOG_BLOCK)
        return blocks * (LOG_BLOCK / s->rec_size);
    return blocks / ((s->rec_size + LOG_BLOCK - 1) / LOG_BLOCK);
}
