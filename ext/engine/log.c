/*
 * log.c - the SSD log: segment files of fixed-size records, written and
 * read with io_uring, O_DIRECT (log.h has the contract).
 *
 * A segment is one preallocated file: block 0 holds a header (magic, format,
 * record size, segment number, the owning store's tag, a check), records
 * follow from block 1.  A record of up to a block never straddles one
 * (LOG_BLOCK / record_bytes records per block, the rest of the block is
 * padding), so reading a row is one aligned block read: one IOPS, no read
 * amplification beyond the block.  Larger records start on a block boundary.
 *
 * Every append starts on a fresh block.  That wastes at most a block per
 * append (appends are demotion and compaction batches of thousands of
 * rows), and buys the rule that no block holding records of an earlier
 * checkpoint is ever written again (P3): a torn write can only hit records
 * no checkpoint refers to yet.
 *
 * Segments are never appended to after a reopen: the first append of a
 * process starts a new segment, so the log needs no record of where the
 * last one ended.  Which records are live is the index's business; the log
 * only counts, per segment, the records the store holds (log_hold /
 * log_release) so that empty segments can be deleted and nearly empty ones
 * compacted.
 *
 * io_uring rings are not thread-safe, so the log keeps a few and lends each
 * to one thread at a time; threads that find none free wait in line, first
 * come first served (a mutex per ring let busy readers starve the appender
 * for minutes: glibc's mutexes are not fair).  A kernel that
 * refuses io_uring (seccomp in containers, old kernels) gets pread/pwrite,
 * and a file system that refuses O_DIRECT (tmpfs) buffered I/O: the log
 * works either way and its stats say which.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <liburing.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "embkv_debug.h"
#include "log.h"

#define SEG_MAGIC "embkv-log-seg\0\0"  /* 16 bytes */
/* Format 2: the header's check is zlib's crc32.  Format 1 (an FNV-1a
 * check) is still read: a store's older segments stay readable. */
#define SEG_FORMAT 2
#define SEG_FORMAT_FNV 1
#define NRINGS 4
#define RING_DEPTH 256
#define WRITE_CHUNK (1u << 20)   /* bytes per write request */
#define SCAN_CHUNK (1u << 20)

typedef struct seg_header {
    char magic[16];
    uint32_t format;
    uint32_t record_bytes;
    uint32_t segment_bytes;
    uint32_t seg;
    uint64_t tag;
    uint64_t check;            /* crc32 of the fields above (FNV-1a in format 1) */
} seg_header;

typedef struct segment {
    uint32_t id;
    int fd;
    bool damaged;
    bool unborn;               /* damaged, and not another store's: no valid header, or short */
    bool dirty;                /* written since the last log_sync */
    char why[96];              /* what is wrong with a damaged one */
    uint64_t size;             /* file bytes */
    _Atomic uint64_t end;      /* bytes written: records below it are readable */
    atomic_uint_fast64_t live; /* records held by the store */
} segment;

typedef struct ring_slot {
    struct io_uring ring;
    bool busy;                 /* lent out (under ring_mu) */
} ring_slot;

struct embkv_log {
    char *dir, *what;
    uint64_t max_bytes, tag;
    uint32_t rec_bytes, seg_bytes;
    uint32_t per_block;        /* records per block (0: a record takes rec_blocks) */
    uint32_t rec_blocks;       /* blocks per record read */
    int dirfd;
    int open_flags;            /* O_DIRECT when the file system takes it */
    bool readonly;             /* a reader process's (log_options.readonly) */

    pthread_rwlock_t lock;     /* the segment table: shared by readers */
    segment **segs;            /* by number; NULL where none */
    uint32_t segs_cap, max_id;
    uint32_t head;             /* segment appended to (0: none yet) */
    uint64_t file_bytes;

    pthread_mutex_t write_mu;  /* appends and syncs */
    bool dir_dirty;

    bool uring;
    ring_slot rings[NRINGS];
    pthread_mutex_t ring_mu;   /* the rings' busy flags and the line */
    pthread_cond_t ring_cv;
    uint64_t ring_ticket, ring_serving; /* the line of waiting threads */
    char fallback[160];

    atomic_uint_fast64_t reads, read_bytes, read_submits, depth_sum;
    atomic_uint_fast64_t writes, write_bytes, write_submits, syncs, deleted;
};

/* The header's check as its format computes it. */
static uint64_t header_check(const seg_header *h)
{
    size_t n = offsetof(seg_header, check);
    if (h->format == SEG_FORMAT_FNV) {
        /* Format 1's FNV-1a: no library has it, and those segments must read. */
        const unsigned char *b = (const unsigned char *)h;
        uint64_t x = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n; i++)
            x = (x ^ b[i]) * 0x100000001b3ull;
        return x;
    }
    return crc32(0, (const Bytef *)h, (uInt)n);
}

static void *block_alloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, LOG_BLOCK, bytes ? bytes : LOG_BLOCK) != 0)
        return NULL;
    return p;
}

static bool parse_segment_name(const char *name, uint32_t *id);

/* Whether dir holds an entry named as a segment. */
static bool holds_segments(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool any = false;
    uint32_t id;
    struct dirent *e;
    while (!any && (e = readdir(d)))
        any = parse_segment_name(e->d_name, &id);
    closedir(d);
    return any;
}

bool log_dir_above(const char *abs, char *found, size_t len)
{
    char real[PATH_MAX];
    if (!path_resolve(abs, real, sizeof real))
        return false;
    for (;;) {
        char *slash = strrchr(real, '/');
        if (!slash || slash == real)
            return false;
        *slash = 0;
        if (holds_segments(real)) {
            snprintf(found, len, "%s", real);
            return true;
        }
    }
}

const char *log_segment_name(uint64_t loc, char *buf, size_t len)
{
    snprintf(buf, len, "seg-%010u.log", log_loc_seg(loc));
    return buf;
}

static bool parse_segment_name(const char *name, uint32_t *id)
{
    unsigned v;
    int used = 0;
    if (strlen(name) != 18 || sscanf(name, "seg-%10u.log%n", &v, &used) != 1 || used != 18 || v == 0 ||
        v > LOG_MAX_SEGMENT)
        return false;
    for (int i = 4; i < 14; i++)
        if (name[i] < '0' || name[i] > '9')
            return false;
    *id = v;
    return true;
}

/* ------------------------------------------------------------ segments */

static int seg_table_put(embkv_log *l, segment *g)
{
    if (g->id >= l->segs_cap) {
        uint32_t cap = l->segs_cap ? l->segs_cap : 64;
        while (cap <= g->id)
            cap *= 2;
        segment **n = realloc(l->segs, (size_t)cap * sizeof *n);
        if (!n)
            return embkv__err(EMBKV_NOMEM, "%s: out of memory", l->what);
        memset(n + l->segs_cap, 0, (size_t)(cap - l->segs_cap) * sizeof *n);
        l->segs = n;
        l->segs_cap = cap;
    }
    l->segs[g->id] = g;
    if (g->id > l->max_id)
        l->max_id = g->id;
    return EMBKV_OK;
}

static segment *seg_get(const embkv_log *l, uint32_t id)
{
    return id < l->segs_cap ? l->segs[id] : NULL;
}

static void seg_damage(segment *g, const char *fmt, const char *detail)
{
    g->damaged = true;
    snprintf(g->why, sizeof g->why, fmt, detail);
}

static void (*log_listed)(int dirfd, const char *name);  /* embkv_debug_log_listed */

void embkv_debug_log_listed(void (*fn)(int dirfd, const char *name)) { log_listed = fn; }

/* Opens an existing segment.  Damage is recorded in the segment, not
 * returned: only its own records become unreadable. */
static int seg_open_existing(embkv_log *l, uint32_t id, const char *name)
{
    segment *g = calloc(1, sizeof *g);
    if (!g)
        return embkv__err(EMBKV_NOMEM, "%s: out of memory", l->what);
    g->id = id;
    g->fd = openat(l->dirfd, name, (l->readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC | l->open_flags);
    if (g->fd < 0 && errno == EINVAL && l->readonly && l->open_flags) {
        l->open_flags = 0;  /* (a reader finds out per file: it cannot probe) */
        g->fd = openat(l->dirfd, name, O_RDONLY | O_CLOEXEC);
    }
    if (g->fd < 0 && errno == ENOENT && l->readonly) {
        /* Deleted by the writer since the listing (an emptied segment):
         * a read that names it finds it missing (ro_refresh). */
        free(g);
        return EMBKV_OK;
    }
    if (g->fd < 0 && errno == EISDIR &&
        (g->fd = openat(l->dirfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        /* A directory where a segment was: its rows are lost as with a
         * damaged file, and the rest of the log works. */
        seg_damage(g, "%s", "it is a directory, not a segment file");
        int rc = seg_table_put(l, g);
        if (rc != EMBKV_OK) {
            close(g->fd);
            free(g);
        }
        return rc;
    }
    if (g->fd < 0) {
        int e = errno;
        free(g);
        return embkv__err(EMBKV_IO, "%s: cannot open %s: %s", l->what, name, strerror(e));
    }
    struct stat st;
    if (fstat(g->fd, &st) != 0) {
        int e = errno;
        close(g->fd);
        free(g);
        return embkv__err(EMBKV_IO, "%s: stat %s: %s", l->what, name, strerror(e));
    }
    g->size = (uint64_t)st.st_size;
    atomic_store(&g->end, g->size & ~(uint64_t)(LOG_BLOCK - 1));
    seg_header *h = block_alloc(LOG_BLOCK);
    if (!h) {
        close(g->fd);
        free(g);
        return embkv__err(EMBKV_NOMEM, "%s: out of memory", l->what);
    }
    ssize_t r = pread(g->fd, h, LOG_BLOCK, 0);
    if (r < 0) {
        seg_damage(g, "its header cannot be read: %s", strerror(errno));
    } else if (r < (ssize_t)LOG_BLOCK) {
        seg_damage(g, "%s", "it is truncated (shorter than its header)");
        g->unborn = true;
    } else if (memcmp(h->magic, SEG_MAGIC, 16) != 0 || h->check != header_check(h)) {
        seg_damage(g, "%s", "its header is damaged");
        g->unborn = true;
    } else if (h->format != SEG_FORMAT && h->format != SEG_FORMAT_FNV) {
        seg_damage(g, "%s", "it was written by another format version");
    } else if (h->tag != l->tag || h->seg != id) {
        seg_damage(g, "%s", "it belongs to another store or was renamed");
    } else if (h->record_bytes != l->rec_bytes) {
        seg_damage(g, "%s", "its records have another size");
    } else if (h->segment_bytes > g->size) {
        seg_damage(g, "%s", "it is truncated");
        g->unborn = true;      /* ours: its size, not its header, was lost */
    }
    free(h);
    int rc = seg_table_put(l, g);
    if (rc != EMBKV_OK) {
        close(g->fd);
        free(g);
        return rc;
    }
    l->file_bytes += g->size;
    return EMBKV_OK;
}

/* A new segment for appends: created whole (preallocated, header written),
 * then published. */
static int seg_create(embkv_log *l, segment **out)
{
    if (l->max_id >= LOG_MAX_SEGMENT)
        return embkv__err(EMBKV_FULL, "%s: segment numbers exhausted", l->what);
    uint32_t id = l->max_id + 1;
    char name[32];
    log_segment_name(log_loc(id, 0), name, sizeof name);
    int fd = openat(l->dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | l->open_flags, 0644);
    if (fd < 0)
        return embkv__err(errno == ENOSPC ? EMBKV_FULL : EMBKV_IO, "%s: cannot create %s: %s", l->what, name,
                          strerror(errno));
    int rc = EMBKV_OK;
    int e = posix_fallocate(fd, 0, (off_t)l->seg_bytes);
    if (e == EOPNOTSUPP || e == EINVAL)
        e = ftruncate(fd, (off_t)l->seg_bytes) == 0 ? 0 : errno;
    if (e)
        rc = embkv__err(e == ENOSPC ? EMBKV_FULL : EMBKV_IO, "%s: cannot allocate %s (%u bytes): %s", l->what,
                        name, l->seg_bytes, strerror(e));
    seg_header *h = rc == EMBKV_OK ? block_alloc(LOG_BLOCK) : NULL;
    if (rc == EMBKV_OK && !h)
        rc = embkv__err(EMBKV_NOMEM, "%s: out of memory", l->what);
    if (rc == EMBKV_OK) {
        memset(h, 0, LOG_BLOCK);
        memcpy(h->magic, SEG_MAGIC, 16);
        h->format = SEG_FORMAT;
        h->record_bytes = l->rec_bytes;
        h->segment_bytes = l->seg_bytes;
        h->seg = id;
        h->tag = l->tag;
        h->check = header_check(h);
        ssize_t w = pwrite(fd, h, LOG_BLOCK, 0);
        if (w != (ssize_t)LOG_BLOCK)
            rc = embkv__err(w < 0 && errno == ENOSPC ? EMBKV_FULL : EMBKV_IO, "%s: cannot write %s: %s", l->what,
                            name, w < 0 ? strerror(errno) : "short write");
    }
    free(h);
    segment *g = rc == EMBKV_OK ? calloc(1, sizeof *g) : NULL;
    if (rc == EMBKV_OK && !g)
        rc = embkv__err(EMBKV_NOMEM, "%s: out of memory", l->what);
    if (rc == EMBKV_OK) {
        g->id = id;
        g->fd = fd;
        g->size = l->seg_bytes;
        g->dirty = true;
        atomic_store(&g->end, LOG_BLOCK);
        pthread_rwlock_wrlock(&l->lock);
        rc = seg_table_put(l, g);
        if (rc == EMBKV_OK) {
            l->file_bytes += g->size;
            l->head = id;
        }
        pthread_rwlock_unlock(&l->lock);
    }
    if (rc != EMBKV_OK) {
        close(fd);
        unlinkat(l->dirfd, name, 0);
        free(g);
        return rc;
    }
    l->dir_dirty = true;
    *out = g;
    return EMBKV_OK;
}

/* ---------------------------------------------------------------- open */

int log_open(const log_options *o, embkv_log **out)
{
    *out = NULL;
    const char *what = o->what ? o->what : o->dir;
    if (o->record_bytes == 0 || o->record_bytes % 16)
        return embkv__err(EMBKV_INVALID, "%s: record size %u is not a positive multiple of 16", what,
                          o->record_bytes);
    uint32_t seg_bytes = o->segment_bytes ? o->segment_bytes : LOG_DEFAULT_SEGMENT;
    uint32_t rec_blocks = (o->record_bytes + LOG_BLOCK - 1) / LOG_BLOCK;
    if (seg_bytes % LOG_BLOCK || seg_bytes / LOG_BLOCK < 1 + 4ull * rec_blocks)
        return embkv__err(EMBKV_INVALID, "%s: segment size %u is not a multiple of %u holding 4 records", what,
                          seg_bytes, LOG_BLOCK);
    if (!o->readonly && mkdir(o->dir, 0755) != 0 && errno != EEXIST)
        return embkv__err(EMBKV_IO, "%s: cannot create %s: %s", what, o->dir, strerror(errno));
    int dirfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return embkv__err(EMBKV_IO, "%s: cannot open %s: %s", what, o->dir, strerror(errno));
    /* One log per directory at a time, in this process or another: two
     * stores given the same ssd_path would take each other's segments.
     * (A reader process takes no lock: the writer holds it.) */
    if (!o->readonly && flock(dirfd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(dirfd);
        return e == EWOULDBLOCK
                   ? embkv__err(EMBKV_LOCKED, "%s: the directory is in use by another store's SSD log", what)
                   : embkv__err(EMBKV_IO, "%s: cannot lock %s: %s", what, o->dir, strerror(e));
    }

    embkv_log *l = calloc(1, sizeof *l);
    if (!l) {
        close(dirfd);
        return embkv__err(EMBKV_NOMEM, "%s: out of memory", what);
    }
    l->dirfd = dirfd;
    l->dir = strdup(o->dir);
    l->what = strdup(what);
    l->max_bytes = o->max_bytes;
    l->tag = o->tag;
    l->rec_bytes = o->record_bytes;
    l->seg_bytes = seg_bytes;
    l->per_block = o->record_bytes <= LOG_BLOCK ? LOG_BLOCK / o->record_bytes : 0;
    l->rec_blocks = rec_blocks;
    /* Readers hold the table across their I/O; with glibc's default,
     * readers that keep coming starve the appender's new segment. */
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&l->lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&l->write_mu, NULL);
    pthread_mutex_init(&l->ring_mu, NULL);
    pthread_cond_init(&l->ring_cv, NULL);
    if (!l->dir || !l->what) {
        log_close(l);
        return embkv__err(EMBKV_NOMEM, "%s: out of memory", what);
    }

    /* Does the file system take O_DIRECT?  tmpfs does not.  Asked of an
     * unnamed file, so that nothing is left behind. */
    l->open_flags = O_DIRECT;
    l->readonly = o->readonly;
    int probe = o->readonly ? -1 : openat(dirfd, ".", O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
    int perr = probe < 0 ? errno : 0;
    if (probe < 0 && errno == EINVAL) {
        int plain = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        perr = plain < 0 ? errno : 0;
        if (plain >= 0) {
            l->open_flags = 0;
            snprintf(l->fallback, sizeof l->fallback, "the file system refuses O_DIRECT");
            close(plain);
        }
    }
    if (probe >= 0)
        close(probe);
    /* The same probe says whether segments could be made here: a log that
     * cannot write fails now, not at the first demotion. */
    if (!o->readonly && (perr == EACCES || perr == EPERM || perr == EROFS)) {
        log_close(l);
        return embkv__err(EMBKV_IO, "%s: cannot write in %s: %s", what, o->dir, strerror(perr));
    }

    DIR *d = fdopendir(dup(dirfd));
    if (!d) {
        int e = errno;
        log_close(l);
        return embkv__err(EMBKV_IO, "%s: cannot list %s: %s", what, o->dir, strerror(e));
    }
    int rc = EMBKV_OK;
    struct dirent *de;
    while (rc == EMBKV_OK && (de = readdir(d))) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        uint32_t id;
        if (!parse_segment_name(de->d_name, &id))
            rc = embkv__err(EMBKV_NOTSTORE, "%s: %s holds %s, which is not a log segment: move it out of the "
                            "directory (it holds only the log's segments)", what, o->dir, de->d_name);
        else {
            if (log_listed)
                log_listed(l->dirfd, de->d_name);
            rc = seg_open_existing(l, id, de->d_name);
        }
    }
    closedir(d);
    /* A directory opened O_DIRECT-less above may still hold files that
     * refuse it: seg_open_existing reported those as errors. */
    if (rc != EMBKV_OK) {
        log_close(l);
        return rc;
    }

    if (o->no_uring) {
        snprintf(l->fallback, sizeof l->fallback, "io_uring turned off");
    } else {
        int ok = 0;
        for (int i = 0; i < NRINGS; i++) {
            int e = io_uring_queue_init(RING_DEPTH, &l->rings[i].ring, 0);
            if (e < 0) {
                snprintf(l->fallback, sizeof l->fallback, "the kernel refused io_uring: %s", strerror(-e));
                break;
            }
            ok++;
        }
        if (ok == NRINGS) {
            l->uring = true;
        } else {
            for (int i = 0; i < ok; i++)
                io_uring_queue_exit(&l->rings[i].ring);
        }
    }
    *out = l;
    return EMBKV_OK;
}

void log_close(embkv_log *l)
{
    if (!l)
        return;
    for (uint32_t i = 0; i < l->segs_cap; i++) {
        if (l->segs && l->segs[i]) {
            if (l->segs[i]->fd >= 0)
                close(l->segs[i]->fd);
            free(l->segs[i]);
        }
    }
    free(l->segs);
    if (l->uring)
        for (int i = 0; i < NRINGS; i++)
            io_uring_queue_exit(&l->rings[i].ring);
    pthread_mutex_destroy(&l->ring_mu);
    pthread_cond_destroy(&l->ring_cv);
    pthread_rwlock_destroy(&l->lock);
    pthread_mutex_destroy(&l->write_mu);
    if (l->dirfd >= 0)
        close(l->dirfd);
    free(l->dir);
    free(l->what);
    free(l);
}

/* ------------------------------------------------------------ I/O core */

typedef struct io_req {
    int fd;
    void *buf;
    uint32_t len;
    uint64_t off;
    int res;                   /* bytes done, or -errno */
} io_req;

/* A free ring, in the order threads asked: each takes a ticket and is
 * served when its number comes up and a ring is free. */
static ring_slot *ring_take(embkv_log *l)
{
    pthread_mutex_lock(&l->ring_mu);
    uint64_t me = l->ring_ticket++;
    ring_slot *r = NULL;
    for (;;) {
        if (me == l->ring_serving)
            for (int i = 0; i < NRINGS && !r; i++)
                if (!l->rings[i].busy)
                    r = &l->rings[i];
        if (r)
            break;
        pthread_cond_wait(&l->ring_cv, &l->ring_mu);
    }
    r->busy = true;
    l->ring_serving++;
    pthread_cond_broadcast(&l->ring_cv); /* the next in line may find one too */
    pthread_mutex_unlock(&l->ring_mu);
    return r;
}

static void ring_give(embkv_log *l, ring_slot *r)
{
    pthread_mutex_lock(&l->ring_mu);
    r->busy = false;
    pthread_cond_broadcast(&l->ring_cv);
    pthread_mutex_unlock(&l->ring_mu);
}

/* Runs every request to completion, at most RING_DEPTH in flight; res of
 * each says how it went.  Returns false only when the ring itself failed
 * (then the caller may fall back: nothing is left in flight). */
static bool run_uring(embkv_log *l, io_req *rq, size_t n, bool write)
{
    ring_slot *rs = ring_take(l);
    struct io_uring *ring = &rs->ring;
    size_t next = 0, done = 0, inflight = 0;
    bool ok = true;
    while (done < n) {
        size_t queued = 0;
        while (next < n && inflight + queued < RING_DEPTH) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
            if (!sqe)
                break;
            io_req *q = &rq[next];
            if (write)
                io_uring_prep_write(sqe, q->fd, q->buf, q->len, q->off);
            else
                io_uring_prep_read(sqe, q->fd, q->buf, q->len, q->off);
            io_uring_sqe_set_data64(sqe, next);
            next++;
            queued++;
        }
        if (queued) {
            int s = io_uring_submit(ring);
            if (s < 0 && inflight == 0 && done == 0) {
                /* Nothing went out: the caller falls back. */
                ok = false;
                break;
            }
            if (s < 0) {
                /* Unsubmitted entries are failed; the ones in flight drain. */
                for (size_t i = next - queued; i < next; i++)
                    rq[i].res = s;
                done += queued;
                queued = 0;
            }
            inflight += queued;
            if (write) {
                atomic_fetch_add(&l->write_submits, 1);
            } else {
                atomic_fetch_add(&l->read_submits, 1);
                atomic_fetch_add(&l->depth_sum, inflight);
            }
        }
        if (!inflight)
            continue;
        struct io_uring_cqe *cqe;
        int w = io_uring_wait_cqe(ring, &cqe);
        if (w < 0)
            continue; /* the kernel completes what is in flight: wait on */
        uint64_t i = io_uring_cqe_get_data64(cqe);
        if (i < n)
            rq[i].res = cqe->res;
        io_uring_cqe_seen(ring, cqe);
        inflight--;
        done++;
    }
    ring_give(l, rs);
    return ok;
}

static void run_sync(io_req *rq, size_t n, bool write)
{
    for (size_t i = 0; i < n; i++) {
        io_req *q = &rq[i];
        size_t got = 0;
        while (got < q->len) {
            ssize_t r = write ? pwrite(q->fd, (char *)q->buf + got, q->len - got, (off_t)(q->off + got))
                              : pread(q->fd, (char *)q->buf + got, q->len - got, (off_t)(q->off + got));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                if (r < 0)
                    got = 0;
                q->res = r < 0 ? -errno : (int)got;
                break;
            }
            got += (size_t)r;
        }
        if (got == q->len)
            q->res = (int)got;
    }
}

static void run_io(embkv_log *l, io_req *rq, size_t n, bool write)
{
    for (size_t i = 0; i < n; i++)
        rq[i].res = INT32_MIN;
    if (l->uring && run_uring(l, rq, n, write)) {
        /* io_uring may complete a buffered request short; finish it. */
        for (size_t i = 0; i < n; i++) {
            if (rq[i].res > 0 && (uint32_t)rq[i].res < rq[i].len) {
                io_req rest = rq[i];
                rest.buf = (char *)rq[i].buf + rq[i].res;
                rest.off += (uint64_t)rq[i].res;
                rest.len -= (uint32_t)rq[i].res;
                run_sync(&rest, 1, write);
                rq[i].res = rest.res < 0 ? rest.res : rq[i].res + rest.res;
            }
        }
        return;
    }
    run_sync(rq, n, write);
    if (write)
        atomic_fetch_add(&l->write_submits, n);
    else {
        atomic_fetch_add(&l->read_submits, n);
        atomic_fetch_add(&l->depth_sum, n);
    }
}

/* -------------------------------------------------------------- append */

static uint64_t blocks_for(const embkv_log *l, size_t n)
{
    return l->per_block ? (n + l->per_block - 1) / l->per_block : (uint64_t)n * l->rec_blocks;
}
static uint64_t fits_in(const embkv_log *l, uint64_t blocks)
{
    return l->per_block ? blocks * l->per_block : blocks / l->rec_blocks;
}
static uint64_t rec_offset(const embkv_log *l, uint64_t first_block, size_t k)
{
    if (l->per_block)
        return (first_block + k / l->per_block) * LOG_BLOCK + (uint64_t)(k % l->per_block) * l->rec_bytes;
    return (first_block + (uint64_t)k * l->rec_blocks) * LOG_BLOCK;
}

/* Writes records [0, n) of recs into segment g from its end. */
static int append_part(embkv_log *l, segment *g, const char *recs, size_t n, uint64_t *locs)
{
    uint64_t end = atomic_load(&g->end);
    uint64_t first = end / LOG_BLOCK, blocks = blocks_for(l, n);
    size_t bytes = (size_t)(blocks * LOG_BLOCK);
    char *buf = block_alloc(bytes);
    if (!buf)
        return embkv__err(EMBKV_NOMEM, "%s: out of memory for a %zu-byte write", l->what, bytes);
    memset(buf, 0, bytes);
    for (size_t k = 0; k < n; k++) {
        uint64_t off = rec_offset(l, first, k);
        memcpy(buf + (off - end), recs + k * l->rec_bytes, l->rec_bytes);
        locs[k] = log_loc(g->id, off);
    }
    size_t nreq = (bytes + WRITE_CHUNK - 1) / WRITE_CHUNK;
    io_req *rq = calloc(nreq, sizeof *rq);
    if (!rq) {
        free(buf);
        return embkv__err(EMBKV_NOMEM, "%s: out of memory", l->what);
    }
    for (size_t i = 0; i < nreq; i++) {
        rq[i].fd = g->fd;
        rq[i].buf = buf + i * WRITE_CHUNK;
        rq[i].off = end + i * WRITE_CHUNK;
        rq[i].len = (uint32_t)(i + 1 < nreq ? WRITE_CHUNK : bytes - i * WRITE_CHUNK);
    }
    run_io(l, rq, nreq, true);
    int rc = EMBKV_OK;
    char name[32];
    for (size_t i = 0; i < nreq && rc == EMBKV_OK; i++) {
        if (rq[i].res == (int)rq[i].len)
            continue;
        int e = rq[i].res < 0 ? -rq[i].res : ENOSPC;
        rc = embkv__err(e == ENOSPC ? EMBKV_FULL : EMBKV_IO, "%s: cannot write %s: %s", l->what,
                        log_segment_name(log_loc(g->id, 0), name, sizeof name), strerror(e));
    }
    free(rq);
    free(buf);
    if (rc != EMBKV_OK)
        return rc;
    g->dirty = true;
    atomic_store(&g->end, end + bytes);
    atomic_fetch_add(&l->writes, n);
    atomic_fetch_add(&l->write_bytes, bytes);
    return EMBKV_OK;
}

/* The room n records take: a record smaller than a block shares it with
 * whole records only, the rest of the block is padding. */
static uint64_t room_of(const embkv_log *l, uint64_t n)
{
    return l->per_block ? n * (LOG_BLOCK / l->per_block) : n * l->rec_blocks * LOG_BLOCK;
}

int log_append(embkv_log *l, const void *recs, size_t n, uint64_t *locs, bool for_compaction)
{
    if (n == 0)
        return EMBKV_OK;
    pthread_mutex_lock(&l->write_mu);
    /* Room check first, so that a batch that does not fit writes nothing. */
    segment *g = l->head ? seg_get(l, l->head) : NULL;
    uint64_t room = g ? fits_in(l, (g->size - atomic_load(&g->end)) / LOG_BLOCK) : 0;
    uint64_t per_seg = fits_in(l, l->seg_bytes / LOG_BLOCK - 1);
    uint64_t new_segs = n > room ? (n - room + per_seg - 1) / per_seg : 0;
    /* The last segment's worth is compaction's (log.h).  (A log too small
     * for a reserve, under two segments, has none.) */
    uint64_t limit = l->max_bytes;
    if (!for_compaction && limit >= 2 * l->seg_bytes)
        limit -= l->seg_bytes;
    /* A process appends to no segment of an earlier one: a log reopened
     * at ssd_size, its last segment made by a compaction whose victim was
     * half moved, would have nowhere to finish it.  The first segment of a
     * process may then go one past ssd_size, for compaction only. */
    if (for_compaction && l->head == 0 && l->max_bytes >= 2 * l->seg_bytes)
        limit += l->seg_bytes;
    /* (Room left in the head segment is anyone's: only new segments count
     * against the limit.  Refusing demotions there made writes fail until
     * the next sync wherever compaction had just made its segment.) */
    bool fits = !l->max_bytes || !new_segs || l->file_bytes + new_segs * l->seg_bytes <= limit;
    if (!fits) {
        uint64_t empty = 0, live = 0, written = 0;
        pthread_rwlock_rdlock(&l->lock);
        for (uint32_t i = 1; i <= l->max_id && i < l->segs_cap; i++) {
            segment *e = l->segs[i];
            if (!e)
                continue;
            live += atomic_load(&e->live);
            written += atomic_load(&e->end) - LOG_BLOCK;
            if (!e->damaged && i != l->head && atomic_load(&e->live) == 0)
                empty += e->size;
        }
        pthread_rwlock_unlock(&l->lock);
        pthread_mutex_unlock(&l->write_mu);
        live = room_of(l, live);
        /* Garbage is taken back only across checkpoints (compaction's
         * emptied segments go at the next one): with a quarter of the
         * room garbage, a checkpoint and a retry is the way on; without,
         * the rows themselves fill it. */
        bool garbage = empty || (written > live && written - live >= limit / 4);
        return embkv__err(EMBKV_FULL, "%s: ssd_size reached: %llu bytes of segments, %llu of them live rows (%llu "
                          "in segments emptied by compaction, deleted at the next sync), ssd_size %llu (%u bytes "
                          "of it kept for compaction), %zu records to append; %s", l->what,
                          (unsigned long long)l->file_bytes, (unsigned long long)live, (unsigned long long)empty,
                          (unsigned long long)l->max_bytes, l->seg_bytes, n,
                          garbage ? "the rest is garbage that compaction frees across checkpoints: checkpoint "
                                    "(embkv_sync; embkv_checkpoint in SQL) and write again, checkpoint more "
                                    "often, or give a larger "
                                    "ssd_size (about 3x the live rows)"
                                  : LOG_GROW_ADVICE);
    }
    const char *p = recs;
    size_t done = 0;
    int rc = EMBKV_OK;
    while (done < n && rc == EMBKV_OK) {
        if (!g || room == 0) {
            rc = seg_create(l, &g);
            if (rc != EMBKV_OK)
                break;
            room = per_seg;
        }
        size_t part = (size_t)(n - done < room ? n - done : room);
        rc = append_part(l, g, p + done * l->rec_bytes, part, locs + done);
        if (rc == EMBKV_OK) {
            done += part;
            room = fits_in(l, (g->size - atomic_load(&g->end)) / LOG_BLOCK);
        }
    }
    if (rc == EMBKV_OK)
        for (size_t i = 0; i < n; i++)
            log_hold(l, locs[i]);
    pthread_mutex_unlock(&l->write_mu);
    return rc;
}

uint32_t log_segment_bytes(const embkv_log *l) { return l->seg_bytes; }

uint64_t log_end(embkv_log *l)
{
    pthread_mutex_lock(&l->write_mu);
    segment *g = l->head ? seg_get(l, l->head) : NULL;
    /* Appends after this one go to a later block, or a new segment. */
    uint64_t end = g ? log_loc(g->id, atomic_load(&g->end)) : log_loc(l->max_id + 1, 0);
    pthread_mutex_unlock(&l->write_mu);
    return end;
}

int log_sync(embkv_log *l)
{
    pthread_mutex_lock(&l->write_mu);
    int rc = EMBKV_OK;
    char name[32];
    pthread_rwlock_rdlock(&l->lock);
    for (uint32_t i = 1; i <= l->max_id && rc == EMBKV_OK; i++) {
        segment *g = seg_get(l, i);
        if (!g || !g->dirty)
            continue;
        if (fdatasync(g->fd) != 0)
            rc = embkv__err(EMBKV_IO, "%s: fdatasync %s: %s", l->what,
                            log_segment_name(log_loc(i, 0), name, sizeof name), strerror(errno));
        else
            g->dirty = false;
    }
    pthread_rwlock_unlock(&l->lock);
    if (rc == EMBKV_OK && l->dir_dirty) {
        if (fsync(l->dirfd) != 0)
            rc = embkv__err(EMBKV_IO, "%s: fsync of %s: %s", l->what, l->dir, strerror(errno));
        else
            l->dir_dirty = false;
    }
    if (rc == EMBKV_OK)
        atomic_fetch_add(&l->syncs, 1);
    pthread_mutex_unlock(&l->write_mu);
    return rc;
}

/* ---------------------------------------------------------------- read */

/* On a record boundary of a segment of this log's size. */
static bool loc_shape(const embkv_log *l, uint64_t loc)
{
    uint64_t off = log_loc_off(loc);
    if (!(loc & LOG_LOC_FLAG) || (loc & (1ull << 62)) || off < LOG_BLOCK || off + l->rec_bytes > l->seg_bytes)
        return false;
    if (l->per_block) {
        uint64_t in = off % LOG_BLOCK;
        if (in % l->rec_bytes || in / l->rec_bytes >= l->per_block)
            return false;
    } else if (off % LOG_BLOCK || (off / LOG_BLOCK - 1) % l->rec_blocks) {
        return false;
    }
    return true;
}

static bool loc_in(const embkv_log *l, const segment *g, uint64_t loc)
{
    return loc_shape(l, loc) && log_loc_off(loc) + l->rec_bytes <= atomic_load(&g->end);
}

void log_expect_end(embkv_log *l, uint64_t end)
{
    uint32_t id = log_loc_seg(end);
    if (log_loc_off(end) == 0 && id > 0)
        id--;          /* the end was the start of a segment not yet made */
    pthread_rwlock_wrlock(&l->lock);
    /* A segment past the end was made after the checkpoint, and nothing
     * durable refers to it.  One without a valid header is what a power cut
     * leaves of a segment whose name reached the disk and whose header (or
     * size) did not (a checkpoint syncs a segment with its records): removed
     * here, it would otherwise stay damaged for good.  One with a valid
     * header goes with the other empty ones (log_delete_dead); another
     * store's stays damaged. */
    char name[32];
    for (uint32_t i = id + 1; i <= l->max_id && i < l->segs_cap; i++) {
        segment *g = l->segs[i];
        if (!g || !g->unborn)
            continue;
        log_segment_name(log_loc(i, 0), name, sizeof name);
        if (unlinkat(l->dirfd, name, 0) != 0 && errno != ENOENT)
            continue; /* stays listed as damaged */
        close(g->fd);
        l->file_bytes -= g->size;
        free(g);
        l->segs[i] = NULL;
        l->dir_dirty = true;
        atomic_fetch_add(&l->deleted, 1);
    }
    /* Only the newest files can be missing past max_id, and no more of them
     * than the log holds segments: a larger gap is a damaged root's. */
    if (id > l->max_id && id < LOG_MAX_SEGMENT && id - l->max_id <= l->max_bytes / l->seg_bytes + 2)
        l->max_id = id;
    pthread_rwlock_unlock(&l->lock);
}

void log_note_missing(embkv_log *l, uint64_t loc)
{
    uint32_t id = log_loc_seg(loc);
    pthread_rwlock_wrlock(&l->lock);
    if (!seg_get(l, id) && id > l->max_id && id < LOG_MAX_SEGMENT &&
        id - l->max_id <= l->max_bytes / l->seg_bytes + 2)
        l->max_id = id;
    pthread_rwlock_unlock(&l->lock);
}

bool log_loc_plausible(embkv_log *l, uint64_t loc)
{
    uint32_t id = log_loc_seg(loc);
    if (!loc_shape(l, loc))
        return false;
    if (l->readonly)
        return true;  /* (a reader's read opens the segment it names, or names it missing) */
    pthread_rwlock_rdlock(&l->lock);
    const segment *g = seg_get(l, id);
    bool ok = g && (g->damaged || loc_in(l, g, loc));
    bool missing = !g && id >= 1 && id <= l->max_id;
    pthread_rwlock_unlock(&l->lock);
    if (!missing)
        return ok;
    /* A segment below the newest whose file is gone: its rows fail by
     * name, the others read. */
    segment *m = calloc(1, sizeof *m);
    if (!m)
        return false;
    m->id = id;
    m->fd = -1;
    seg_damage(m, "%s", "its file is missing");
    pthread_rwlock_wrlock(&l->lock);
    if (!seg_get(l, id) && seg_table_put(l, m) == EMBKV_OK)
        m = NULL;
    pthread_rwlock_unlock(&l->lock);
    free(m);
    return true;
}

bool log_loc_valid(const embkv_log *l, uint64_t loc)
{
    pthread_rwlock_rdlock((pthread_rwlock_t *)&l->lock);
    const segment *g = seg_get(l, log_loc_seg(loc));
    bool ok = g && !g->damaged && loc_in(l, g, loc);
    pthread_rwlock_unlock((pthread_rwlock_t *)&l->lock);
    return ok;
}

static int bad_loc(const embkv_log *l, const segment *g, uint64_t loc)
{
    char name[32];
    log_segment_name(loc, name, sizeof name);
    if (!g)
        return embkv__err(EMBKV_CORRUPT, "%s: %s is missing", l->what, name);
    if (g->damaged)
        return embkv__err(EMBKV_CORRUPT, "%s: %s is damaged: %s", l->what, name, g->why);
    return embkv__err(EMBKV_CORRUPT, "%s: offset %llu of %s is not a record the log wrote", l->what,
                      (unsigned long long)log_loc_off(loc), name);
}

/* A reader process's log: the segments these locations name, opened if
 * the writer made them since, and opened again if the file open here was
 * deleted (the writer may make a new one of the same number after a
 * restart).  The caller's reader slot keeps the writer from deleting the
 * ones its locations name meanwhile (readers.c: R1). */
static void ro_refresh(embkv_log *l, const uint64_t *locs, size_t n)
{
    pthread_rwlock_wrlock(&l->lock);
    uint32_t last = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t id = log_loc_seg(locs[i]);
        if (id == last || id == 0)
            continue;
        last = id;
        segment *g = seg_get(l, id);
        struct stat st;
        /* (one without its whole header may be one the writer was making
         * when this process opened it: seg_create writes the header after
         * the name exists) */
        if (g && !g->unborn && fstat(g->fd, &st) == 0 && st.st_nlink > 0)
            continue;
        char name[32];
        log_segment_name(locs[i], name, sizeof name);
        if (g) {
            l->segs[id] = NULL;
            l->file_bytes -= g->size;
            close(g->fd);
            free(g);
        }
        (void)seg_open_existing(l, id, name);  /* (none: the read names it missing) */
    }
    pthread_rwlock_unlock(&l->lock);
}

int log_read(embkv_log *l, const uint64_t *locs, size_t n, void *out, size_t *bad)
{
    if (n == 0)
        return EMBKV_OK;
    uint32_t len = l->per_block ? LOG_BLOCK : l->rec_blocks * LOG_BLOCK;
    char *bounce = block_alloc((size_t)len * n);
    io_req *rq = calloc(n, sizeof *rq);
    if (!bounce || !rq) {
        free(bounce);
        free(rq);
        return embkv__err(EMBKV_NOMEM, "%s: out of memory reading %zu records", l->what, n);
    }
    int rc = EMBKV_OK;
    if (l->readonly)
        ro_refresh(l, locs, n);
    pthread_rwlock_rdlock(&l->lock);
    for (size_t i = 0; i < n; i++) {
        segment *g = seg_get(l, log_loc_seg(locs[i]));
        if (!g || g->damaged || !loc_in(l, g, locs[i])) {
            rc = bad_loc(l, g, locs[i]);
            if (bad)
                *bad = i;
            break;
        }
        uint64_t off = log_loc_off(locs[i]);
        rq[i].fd = g->fd;
        rq[i].buf = bounce + (size_t)len * i;
        rq[i].len = len;
        rq[i].off = off & ~(uint64_t)(LOG_BLOCK - 1);
    }
    if (rc == EMBKV_OK) {
        run_io(l, rq, n, false);
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++) {
            uint64_t in = log_loc_off(locs[i]) - rq[i].off;
            if (rq[i].res >= 0 && (uint64_t)rq[i].res >= in + l->rec_bytes) {
                memcpy((char *)out + i * l->rec_bytes, rq[i].buf + in, l->rec_bytes);
                bytes += (uint64_t)rq[i].res;
                continue;
            }
            if (rc == EMBKV_OK) {
                char name[32];
                log_segment_name(locs[i], name, sizeof name);
                rc = rq[i].res < 0 ? embkv__err(EMBKV_IO, "%s: reading %s: %s", l->what, name, strerror(-rq[i].res))
                                   : embkv__err(EMBKV_CORRUPT, "%s: %s is truncated at offset %llu", l->what,
                                                name, (unsigned long long)(rq[i].off + (uint64_t)rq[i].res));
                if (bad)
                    *bad = i;
            }
        }
        atomic_fetch_add(&l->reads, n);
        atomic_fetch_add(&l->read_bytes, bytes);
    }
    pthread_rwlock_unlock(&l->lock);
    free(rq);
    free(bounce);
    return rc;
}

/* ------------------------------------------------------ live accounting */

void log_hold(embkv_log *l, uint64_t loc)
{
    pthread_rwlock_rdlock(&l->lock);
    segment *g = seg_get(l, log_loc_seg(loc));
    if (g)
        atomic_fetch_add(&g->live, 1);
    pthread_rwlock_unlock(&l->lock);
}

void log_release(embkv_log *l, uint64_t loc)
{
    pthread_rwlock_rdlock(&l->lock);
    segment *g = seg_get(l, log_loc_seg(loc));
    if (g && atomic_load(&g->live) > 0)
        atomic_fetch_sub(&g->live, 1);
    pthread_rwlock_unlock(&l->lock);
}

size_t log_delete_dead(embkv_log *l)
{
    pthread_mutex_lock(&l->write_mu);
    pthread_rwlock_wrlock(&l->lock);
    size_t gone = 0;
    char name[32];
    for (uint32_t i = 1; i <= l->max_id && i < l->segs_cap; i++) {
        segment *g = l->segs[i];
        /* A damaged segment is never deleted: it may be another store's,
         * or hold what its owner wants to salvage. */
        if (!g || g->damaged || i == l->head || atomic_load(&g->live) != 0)
            continue;
        log_segment_name(log_loc(i, 0), name, sizeof name);
        if (unlinkat(l->dirfd, name, 0) != 0 && errno != ENOENT)
            continue; /* kept: tried again next time */
        if (g->fd >= 0)
            close(g->fd);
        l->file_bytes -= g->size;
        free(g);
        l->segs[i] = NULL;
        gone++;
    }
    if (gone)
        l->dir_dirty = true;
    pthread_rwlock_unlock(&l->lock);
    pthread_mutex_unlock(&l->write_mu);
    atomic_fetch_add(&l->deleted, gone);
    return gone;
}

uint32_t log_pick_victim(embkv_log *l, double max_live, const uint32_t *skip, size_t nskip)
{
    pthread_rwlock_rdlock(&l->lock);
    uint32_t best = 0;
    double best_frac = max_live;
    for (uint32_t i = 1; i <= l->max_id && i < l->segs_cap; i++) {
        segment *g = l->segs[i];
        /* An empty one waits for log_delete_dead: nothing to move. */
        if (!g || g->damaged || i == l->head || atomic_load(&g->live) == 0)
            continue;
        bool skipped = false;
        for (size_t k = 0; k < nskip && !skipped; k++)
            skipped = skip[k] == i;
        if (skipped)
            continue;
        uint64_t slots = fits_in(l, atomic_load(&g->end) / LOG_BLOCK - 1);
        if (!slots)
            continue;
        double frac = (double)atomic_load(&g->live) / (double)slots;
        if (frac < best_frac) {
            best_frac = frac;
            best = i;
        }
    }
    pthread_rwlock_unlock(&l->lock);
    return best;
}

int log_scan_part(embkv_log *l, uint32_t seg, uint64_t *pos, uint64_t max_bytes, log_scan_fn fn, void *ctx,
                  bool *done)
{
    *done = false;
    char *buf = block_alloc(SCAN_CHUNK);
    if (!buf)
        return embkv__err(EMBKV_NOMEM, "%s: out of memory", l->what);
    int rc = EMBKV_OK;
    char name[32];
    log_segment_name(log_loc(seg, 0), name, sizeof name);
    pthread_rwlock_rdlock(&l->lock);
    segment *g = seg_get(l, seg);
    uint64_t end = g ? atomic_load(&g->end) : 0;
    if (!g || g->damaged)
        rc = bad_loc(l, g, log_loc(seg, LOG_BLOCK));
    /* Whole records per chunk: a chunk is a whole number of record groups. */
    uint64_t group = l->per_block ? LOG_BLOCK : (uint64_t)l->rec_blocks * LOG_BLOCK;
    uint64_t chunk = SCAN_CHUNK / group * group;
    uint64_t off = *pos < LOG_BLOCK ? LOG_BLOCK : LOG_BLOCK + (*pos - LOG_BLOCK) / group * group;
    uint64_t stop = max_bytes && end - off > max_bytes ? off + (max_bytes + group - 1) / group * group : end;
    if (stop > end)
        stop = end;
    for (; rc == EMBKV_OK && off < stop; off += chunk) {
        uint32_t want = (uint32_t)(stop - off < chunk ? stop - off : chunk);
        io_req rq = {.fd = g->fd, .buf = buf, .len = want, .off = off};
        run_sync(&rq, 1, false);
        if (rq.res != (int)want) {
            rc = rq.res < 0 ? embkv__err(EMBKV_IO, "%s: reading %s: %s", l->what, name, strerror(-rq.res))
                            : embkv__err(EMBKV_CORRUPT, "%s: %s is truncated at offset %llu", l->what, name,
                                         (unsigned long long)(off + (uint64_t)rq.res));
            break;
        }
        for (uint64_t b = 0; b < want && rc == EMBKV_OK; b += group) {
            if (l->per_block) {
                for (uint32_t k = 0; k < l->per_block && rc == EMBKV_OK; k++)
                    rc = fn(ctx, log_loc(seg, off + b + (uint64_t)k * l->rec_bytes), buf + b + (size_t)k * l->rec_bytes);
            } else {
                rc = fn(ctx, log_loc(seg, off + b), buf + b);
            }
        }
    }
    pthread_rwlock_unlock(&l->lock);
    free(buf);
    if (rc == EMBKV_OK) {
        *pos = off < stop ? off : stop;
        *done = *pos >= end;
    }
    return rc;
}

int log_scan_segment(embkv_log *l, uint32_t seg, log_scan_fn fn, void *ctx)
{
    uint64_t pos = 0;
    bool done;
    return log_scan_part(l, seg, &pos, 0, fn, ctx, &done);
}

void log_stats_get(embkv_log *l, log_stats *st)
{
    memset(st, 0, sizeof *st);
    pthread_rwlock_rdlock(&l->lock);
    for (uint32_t i = 1; i <= l->max_id && i < l->segs_cap; i++) {
        segment *g = l->segs[i];
        if (!g)
            continue;
        st->segments++;
        st->damaged_segments += g->damaged;
        st->written_bytes += atomic_load(&g->end) - LOG_BLOCK;
        st->live_records += atomic_load(&g->live);
    }
    st->file_bytes = l->file_bytes;
    pthread_rwlock_unlock(&l->lock);
    st->live_bytes = room_of(l, st->live_records);
    st->reads = atomic_load(&l->reads);
    st->read_bytes = atomic_load(&l->read_bytes);
    st->read_submits = atomic_load(&l->read_submits);
    st->writes = atomic_load(&l->writes);
    st->write_bytes = atomic_load(&l->write_bytes);
    st->write_submits = atomic_load(&l->write_submits);
    st->syncs = atomic_load(&l->syncs);
    st->deleted_segments = atomic_load(&l->deleted);
    st->mean_read_depth = st->read_submits ? (double)atomic_load(&l->depth_sum) / (double)st->read_submits : 0.0;
    st->uring = l->uring;
    st->direct = l->open_flags != 0;
    snprintf(st->fallback, sizeof st->fallback, "%s", l->fallback);
}

int log_remove_files(const char *dir, uint64_t tag)
{
    /* A directory another store's log holds (its lock, as log_open takes
     * it) is that store's now: nothing in it is touched, and it stays. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return errno == ENOENT ? 0 : -1;
    if (flock(dfd, LOCK_EX | LOCK_NB) != 0) {
        close(dfd);
        return 1;
    }
    DIR *d = fdopendir(dfd);  /* (the lock stays with it until closedir) */
    if (!d) {
        close(dfd);
        return -1;
    }
    int left = 0;
    struct dirent *e;
    char path[PATH_MAX];
    seg_header h;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (strncmp(e->d_name, "seg-", 4) != 0 ||
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) {
            left++;
            continue;
        }
        /* Only this store's segments (by the tag in their header); a
         * segment too damaged to tell is left where it is. */
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        bool ours = fd >= 0 && pread(fd, &h, sizeof h, 0) == (ssize_t)sizeof h && !memcmp(h.magic, SEG_MAGIC, 16) &&
                    h.tag == tag;
        if (fd >= 0)
            close(fd);
        if (!ours || unlink(path) != 0)
            left++;
    }
    if (!left && rmdir(dir) != 0 && errno != ENOENT)
        left++;
    closedir(d);
    return left;
}
