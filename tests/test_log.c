/*
 * test_log.c - the SSD log (ext/engine/log.c) on its own.
 *
 * Records of a known pattern are appended and read back, byte for byte, in
 * shuffled batches, across segments, a reopen and a SIGKILL; with small
 * records (several per block) and records larger than a block; through
 * io_uring, with io_uring turned off, and with the kernel refusing it
 * (a seccomp filter in a child, as container runtimes do).  Then the
 * faults: ssd_size reached (nothing appended), a truncated segment, a
 * damaged header, another store's segment, a foreign file, a location the
 * log never wrote, an unwritable directory: each an exact error, and the
 * records of the other segments still read; segment headers of both
 * formats (zlib's crc32, and format 1's FNV-1a), a check that does not
 * match its format, a format unknown.  Live accounting: a segment
 * whose records are all released is deleted, and the victim for compaction
 * is the emptiest one.
 */
#include "embkv.h"
#include "log.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zlib.h>
#ifdef __x86_64__
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/syscall.h>
#endif

#define TAG 0x1234abcd5678ef01ull
#define SEG (1u << 20)

/* Record k of a test: its bytes follow from (k, salt). */
static void fill(unsigned char *r, uint32_t bytes, uint64_t k, uint64_t salt)
{
    for (uint32_t i = 0; i < bytes; i += 8) {
        uint64_t w = mix64(k * 1000003 + salt + i);
        memcpy(r + i, &w, bytes - i < 8 ? bytes - i : 8);
    }
}

static int open_log(const char *dir, uint32_t rec, uint64_t max, bool no_uring, embkv_log **l)
{
    log_options o = {.dir = dir, .what = "test log", .max_bytes = max, .record_bytes = rec,
                     .segment_bytes = SEG, .tag = TAG, .no_uring = no_uring};
    return log_open(&o, l);
}

/* Reads every record back in shuffled batches of up to 512 and compares. */
static int verify_all(embkv_log *l, uint32_t rec, const uint64_t *locs, size_t n, uint64_t salt, uint64_t seed)
{
    size_t *order = malloc(n * sizeof *order);
    unsigned char *out = malloc((size_t)rec * 512), *want = malloc(rec);
    uint64_t *batch = malloc(512 * sizeof *batch);
    rng_t r = {seed};
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = rnd_below(&r, i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
    for (size_t at = 0; at < n && !bad; at += 512) {
        size_t m = n - at < 512 ? n - at : 512;
        for (size_t i = 0; i < m; i++)
            batch[i] = locs[order[at + i]];
        if (log_read(l, batch, m, out, NULL) != EMBKV_OK) {
            fprintf(stderr, "read failed: %s\n", embkv_errmsg());
            bad = 1;
            break;
        }
        for (size_t i = 0; i < m; i++) {
            fill(want, rec, order[at + i], salt);
            if (memcmp(out + i * rec, want, rec) != 0) {
                fprintf(stderr, "record %zu differs\n", order[at + i]);
                bad = 1;
                break;
            }
        }
    }
    free(order);
    free(out);
    free(want);
    free(batch);
    return bad;
}

static int append_n(embkv_log *l, uint32_t rec, size_t first, size_t n, uint64_t *locs, uint64_t salt)
{
    unsigned char *buf = malloc((size_t)rec * n + 1);
    for (size_t i = 0; i < n; i++)
        fill(buf + i * rec, rec, first + i, salt);
    int rc = log_append(l, buf, n, locs, false);
    free(buf);
    return rc;
}

/* Records [from, to) read one by one equal what was appended. */
static bool read_range(embkv_log *l, uint32_t rec, const uint64_t *locs, size_t from, size_t to, uint64_t salt)
{
    unsigned char *out = malloc(rec), *want = malloc(rec);
    bool ok = true;
    for (size_t i = from; i < to && ok; i++) {
        ok = log_read(l, &locs[i], 1, out, NULL) == EMBKV_OK;
        fill(want, rec, i, salt);
        ok = ok && memcmp(out, want, rec) == 0;
    }
    free(out);
    free(want);
    return ok;
}

static bool has(const char *msg, const char *part)
{
    if (strstr(msg, part))
        return true;
    fprintf(stderr, "message \"%s\" lacks \"%s\"\n", msg, part);
    return false;
}

/* Round trip through several segments, then reopen. */
static void test_roundtrip(uint32_t rec, bool no_uring, const char *name)
{
    const char *dir = test_tmpdir(name);
    size_t n = 6000; /* several segments, at any scale */
    uint64_t *locs = malloc(n * sizeof *locs);
    embkv_log *l;
    CHECK_RC(open_log(dir, rec, 0, no_uring, &l), EMBKV_OK);
    /* Appends of varied sizes. */
    size_t done = 0;
    rng_t r = {rec};
    while (done < n) {
        size_t m = 1 + rnd_below(&r, 900);
        if (m > n - done)
            m = n - done;
        CHECK_RC(append_n(l, rec, done, m, locs + done, rec), EMBKV_OK);
        done += m;
    }
    for (size_t i = 0; i < n; i++)
        CHECK(log_loc_valid(l, locs[i]));
    CHECK(verify_all(l, rec, locs, n, rec, 1) == 0);
    log_stats st;
    log_stats_get(l, &st);
    CHECK(st.writes == n);
    CHECK(st.reads == n);
    CHECK(st.live_records == n);
    CHECK(st.segments >= 2);
    CHECK(st.uring == !no_uring);
    printf("%s: io_uring %s, O_DIRECT %s%s%s\n", name, st.uring ? "yes" : "no", st.direct ? "yes" : "no",
           st.fallback[0] ? ": " : "", st.fallback);
    if (no_uring)
        CHECK(has(st.fallback, "io_uring turned off"));
    /* A record per read: one block for small records. */
    uint32_t per = rec <= LOG_BLOCK ? LOG_BLOCK : (rec + LOG_BLOCK - 1) / LOG_BLOCK * LOG_BLOCK;
    CHECK(st.read_bytes == (uint64_t)n * per);
    if (!no_uring)
        CHECK(st.mean_read_depth > 16.0);
    CHECK_RC(log_sync(l), EMBKV_OK);
    uint32_t last = 0;
    for (size_t i = 0; i < n; i++)
        if (log_loc_seg(locs[i]) > last)
            last = log_loc_seg(locs[i]);
    log_close(l);

    CHECK_RC(open_log(dir, rec, 0, no_uring, &l), EMBKV_OK);
    CHECK(verify_all(l, rec, locs, n, rec, 2) == 0);
    uint64_t more[10];
    CHECK_RC(append_n(l, rec, n, 10, more, rec), EMBKV_OK);
    CHECK(log_loc_seg(more[0]) == last + 1); /* a reopened log appends to a new segment */
    log_close(l);
    free(locs);
}

/* ssd_size: a batch that does not fit appends nothing; new rows stop one
 * segment short of it, which only compaction may fill. */
static void test_full(void)
{
    const char *dir = test_tmpdir("full");
    uint32_t rec = 1024;
    uint64_t per_seg = (SEG / LOG_BLOCK - 1) * (LOG_BLOCK / rec);
    embkv_log *l;
    CHECK_RC(open_log(dir, rec, 3ull * SEG, false, &l), EMBKV_OK);
    uint64_t *locs = malloc(3 * per_seg * sizeof *locs);
    CHECK_RC(append_n(l, rec, 0, per_seg + 10, locs, 7), EMBKV_OK);
    log_stats before, after;
    log_stats_get(l, &before);
    CHECK_RC(append_n(l, rec, per_seg + 10, per_seg, locs + per_seg + 10, 7), EMBKV_FULL);
    CHECK(has(embkv_errmsg(), "test log: ssd_size reached"));
    CHECK(has(embkv_errmsg(), "records to append; open the store with a larger ssd_size (it may grow, not shrink; in SQL, "));
    log_stats_get(l, &after);
    CHECK(after.writes == before.writes && after.segments == 2 && after.file_bytes == 2ull * SEG);
    /* What still fits goes in: every append starts on a new block, so the
     * 10 records took 3 blocks (12 slots). */
    uint64_t room = per_seg - 12;
    CHECK_RC(append_n(l, rec, per_seg + 10, room, locs + per_seg + 10, 7), EMBKV_OK);
    CHECK_RC(append_n(l, rec, per_seg + 10 + room, 1, locs + per_seg + 10 + room, 7), EMBKV_FULL);
    CHECK(verify_all(l, rec, locs, per_seg + 10 + room, 7, 3) == 0);
    /* Compaction's segment: its appends go on to ssd_size itself. */
    size_t at = per_seg + 10 + room;
    unsigned char *buf = malloc((size_t)rec * per_seg);
    for (size_t i = 0; i < per_seg; i++)
        fill(buf + i * rec, rec, at + i, 7);
    CHECK_RC(log_append(l, buf, per_seg - 100, locs + at, true), EMBKV_OK);
    /* Past the new rows' limit now, but room in the head segment is
     * anyone's (demotions refused there made writes fail until the next
     * sync). */
    uint64_t spare[64];
    CHECK_RC(log_append(l, buf + (per_seg - 100) * rec, 60, locs + at + per_seg - 100, false), EMBKV_OK);
    CHECK_RC(log_append(l, buf + (per_seg - 40) * rec, 40, locs + at + per_seg - 40, true), EMBKV_OK);
    CHECK_RC(log_append(l, buf, 1, spare, true), EMBKV_FULL);
    CHECK(has(embkv_errmsg(), "kept for compaction"));
    log_stats_get(l, &after);
    CHECK(after.segments == 3 && after.file_bytes == 3ull * SEG);
    CHECK(verify_all(l, rec, locs, at + per_seg, 7, 3) == 0);
    log_close(l);
    /* Reopened full: no segment of the last process takes appends, so
     * compaction's first segment goes one past ssd_size (without it, a
     * victim half moved would never finish); demotions still get nothing,
     * and a second new segment goes nowhere. */
    CHECK_RC(open_log(dir, rec, 3ull * SEG, false, &l), EMBKV_OK);
    for (size_t i = 0; i < at + per_seg; i++)
        log_hold(l, locs[i]);
    CHECK_RC(log_append(l, buf, 1, spare, false), EMBKV_FULL);
    CHECK_RC(log_append(l, buf, 10, spare, true), EMBKV_OK);
    log_stats_get(l, &after);
    CHECK(after.segments == 4 && after.file_bytes == 4ull * SEG);
    CHECK_RC(log_append(l, buf, per_seg, spare, true), EMBKV_FULL);
    free(buf);
    log_close(l);
    free(locs);
}

static void seg_path(char *buf, size_t len, const char *dir, uint32_t seg)
{
    char name[32];
    snprintf(buf, len, "%s/%s", dir, log_segment_name(log_loc(seg, 0), name, sizeof name));
}

static void flip(const char *file, off_t at)
{
    int fd = open(file, O_RDWR);
    unsigned char c;
    CHECK(fd >= 0 && pread(fd, &c, 1, at) == 1);
    c ^= 0x5a;
    CHECK(pwrite(fd, &c, 1, at) == 1);
    close(fd);
}

/* Damaged segments: their records fail by name, the others read. */
static void test_damage(void)
{
    const char *dir = test_tmpdir("damage");
    uint32_t rec = 512;
    uint64_t per_seg = (SEG / LOG_BLOCK - 1) * (LOG_BLOCK / rec);
    size_t n = (size_t)(4 * per_seg);
    uint64_t *locs = malloc(n * sizeof *locs);
    embkv_log *l;
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    CHECK_RC(append_n(l, rec, 0, n, locs, 9), EMBKV_OK);
    CHECK_RC(log_sync(l), EMBKV_OK);
    log_close(l);
    char p[700];
    /* Segment 1: truncated to half; 2: a header byte flipped; 3: a record
     * byte flipped (the log returns the bytes; the store's checksum catches
     * it); 4: intact. */
    seg_path(p, sizeof p, dir, 1);
    CHECK(truncate(p, SEG / 2) == 0);
    seg_path(p, sizeof p, dir, 2);
    flip(p, 20);
    seg_path(p, sizeof p, dir, 3);
    flip(p, LOG_BLOCK + 3);

    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    log_stats st;
    log_stats_get(l, &st);
    CHECK(st.segments == 4 && st.damaged_segments == 2);
    unsigned char *out = malloc(rec);
    size_t bad = 99;
    CHECK_RC(log_read(l, &locs[0], 1, out, &bad), EMBKV_CORRUPT);
    CHECK(bad == 0);
    CHECK(has(embkv_errmsg(), "test log: seg-0000000001.log is damaged: it is truncated"));
    CHECK_RC(log_read(l, &locs[per_seg], 1, out, NULL), EMBKV_CORRUPT);
    CHECK(has(embkv_errmsg(), "seg-0000000002.log is damaged: its header is damaged"));
    CHECK(!log_loc_valid(l, locs[per_seg]));
    /* A batch mixing good and bad records names the bad one's index. */
    uint64_t mix[3] = {locs[3 * per_seg], locs[3 * per_seg + 1], locs[5]};
    unsigned char *out3 = malloc(3 * (size_t)rec);
    CHECK_RC(log_read(l, mix, 3, out3, &bad), EMBKV_CORRUPT);
    free(out3);
    CHECK(bad == 2);
    /* Segment 3's first record differs in byte 3, the rest equal. */
    unsigned char *want = malloc(rec);
    CHECK_RC(log_read(l, &locs[2 * per_seg], 1, out, NULL), EMBKV_OK);
    fill(want, rec, 2 * per_seg, 9);
    CHECK(out[3] == (want[3] ^ 0x5a) && memcmp(out + 4, want + 4, rec - 4) == 0);
    CHECK(read_range(l, rec, locs, 2 * per_seg + 1, 3 * per_seg, 9));
    /* Segment 4 reads whole. */
    CHECK(read_range(l, rec, locs, 3 * per_seg, n, 9));
    /* Locations the log never wrote. */
    uint64_t odd = locs[3 * per_seg] + 1; /* 16 bytes into a record */
    CHECK_RC(log_read(l, &odd, 1, out, NULL), EMBKV_CORRUPT);
    CHECK(has(embkv_errmsg(), "is not a record the log wrote"));
    uint64_t missing = log_loc(77, LOG_BLOCK);
    CHECK_RC(log_read(l, &missing, 1, out, NULL), EMBKV_CORRUPT);
    CHECK(has(embkv_errmsg(), "seg-0000000077.log is missing"));
    uint64_t beyond = log_loc(4, SEG);
    CHECK(!log_loc_valid(l, beyond));
    log_close(l);

    /* Another store's segment. */
    log_options o = {.dir = dir, .what = "other", .record_bytes = rec, .segment_bytes = SEG, .tag = TAG + 1};
    CHECK_RC(log_open(&o, &l), EMBKV_OK);
    CHECK_RC(log_read(l, &locs[3 * per_seg], 1, out, NULL), EMBKV_CORRUPT);
    CHECK(has(embkv_errmsg(), "other: seg-0000000004.log is damaged: it belongs to another store"));
    log_close(l);
    /* Another record size. */
    o.tag = TAG;
    o.record_bytes = 256;
    CHECK_RC(log_open(&o, &l), EMBKV_OK);
    log_stats_get(l, &st);
    CHECK(st.damaged_segments == 4);
    log_close(l);

    /* A foreign file: the directory is not the log's. */
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    FILE *f = fopen(p, "w");
    CHECK(f && fputs("x", f) >= 0 && fclose(f) == 0);
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_NOTSTORE);
    CHECK(has(embkv_errmsg(), "holds notes.txt, which is not a log segment"));
    free(out);
    free(want);
    free(locs);
}

/* A segment header's check: zlib's crc32 of the 40 bytes before it
 * (format 2, what the log writes), or FNV-1a (format 1, still read).  A
 * header rewritten in format 1 reads; one whose check does not match its
 * format is damaged. */
static void rewrite_header(const char *file, uint32_t format, bool fnv)
{
    unsigned char h[48];
    int fd = open(file, O_RDWR);
    CHECK(fd >= 0 && pread(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
    memcpy(h + 16, &format, 4);
    uint64_t c;
    if (fnv) {
        c = 0xcbf29ce484222325ull;
        for (int i = 0; i < 40; i++)
            c = (c ^ h[i]) * 0x100000001b3ull;
    } else {
        c = crc32(0, h, 40);
    }
    memcpy(h + 40, &c, 8);
    CHECK(pwrite(fd, h, sizeof h, 0) == (ssize_t)sizeof h);
    close(fd);
}

static void test_header_formats(void)
{
    const char *dir = test_tmpdir("formats");
    uint32_t rec = 512;
    uint64_t per_seg = (SEG / LOG_BLOCK - 1) * (LOG_BLOCK / rec);
    size_t n = (size_t)(3 * per_seg);
    uint64_t *locs = malloc(n * sizeof *locs);
    embkv_log *l;
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    CHECK_RC(append_n(l, rec, 0, n, locs, 5), EMBKV_OK);
    CHECK_RC(log_sync(l), EMBKV_OK);
    log_close(l);
    char p[700];
    /* As written: format 2 with zlib's crc32 (the rewrite changes nothing). */
    seg_path(p, sizeof p, dir, 1);
    unsigned char before[48], after[48];
    int fd = open(p, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, before, sizeof before, 0) == (ssize_t)sizeof before);
    close(fd);
    rewrite_header(p, 2, false);
    fd = open(p, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, after, sizeof after, 0) == (ssize_t)sizeof after);
    close(fd);
    CHECK(memcmp(before, after, sizeof before) == 0);
    /* Segment 2 in format 1 (FNV-1a): read; segment 3 in format 1 with a
     * crc32 check: damaged. */
    seg_path(p, sizeof p, dir, 2);
    rewrite_header(p, 1, true);
    seg_path(p, sizeof p, dir, 3);
    rewrite_header(p, 1, false);
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    log_stats st;
    log_stats_get(l, &st);
    CHECK(st.segments == 3 && st.damaged_segments == 1);
    CHECK(read_range(l, rec, locs, 0, 2 * per_seg, 5));
    unsigned char *out = malloc(rec);
    CHECK_RC(log_read(l, &locs[2 * per_seg], 1, out, NULL), EMBKV_CORRUPT);
    CHECK(has(embkv_errmsg(), "seg-0000000003.log is damaged: its header is damaged"));
    /* A format this build does not know: refused by name. */
    log_close(l);
    seg_path(p, sizeof p, dir, 3);
    rewrite_header(p, 3, false);
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    CHECK_RC(log_read(l, &locs[2 * per_seg], 1, out, NULL), EMBKV_CORRUPT);
    CHECK(has(embkv_errmsg(), "seg-0000000003.log is damaged: it was written by another format version"));
    log_close(l);
    free(out);
    free(locs);
}

static void test_bad_options(void)
{
    embkv_log *l = NULL;
    char p[700];
    snprintf(p, sizeof p, "%s", test_tmpdir("file"));
    FILE *f = fopen(p, "w");
    CHECK(f && fclose(f) == 0);
    char under[720];
    snprintf(under, sizeof under, "%s/log", p);
    CHECK_RC(open_log(under, 512, 0, false, &l), EMBKV_IO);
    CHECK(has(embkv_errmsg(), "test log: cannot create "));
    CHECK(has(embkv_errmsg(), "Not a directory"));
    CHECK(l == NULL);
    CHECK_RC(open_log(test_tmpdir("odd"), 520, 0, false, &l), EMBKV_INVALID);
    CHECK(has(embkv_errmsg(), "record size 520"));
    log_options o = {.dir = test_tmpdir("small"), .what = "t", .record_bytes = 512, .segment_bytes = 8192};
    CHECK_RC(log_open(&o, &l), EMBKV_INVALID);
    CHECK(has(embkv_errmsg(), "segment size 8192"));
}

/* Live accounting, deletion of dead segments, the compaction victim, and a
 * scan of a segment. */
typedef struct scan_ctx {
    uint32_t rec;
    size_t seen, matched;
    const uint64_t *locs;
    size_t first, n;
} scan_ctx;

static int scan_cb(void *ctx, uint64_t loc, const void *r)
{
    scan_ctx *c = ctx;
    unsigned char *want = malloc(c->rec);
    /* Slots are visited in order: the k-th written slot is record first + k. */
    if (c->seen < c->n && loc == c->locs[c->first + c->seen]) {
        fill(want, c->rec, c->first + c->seen, 5);
        c->matched += memcmp(r, want, c->rec) == 0;
    }
    c->seen++;
    free(want);
    return 0;
}

static void test_live(void)
{
    const char *dir = test_tmpdir("live");
    uint32_t rec = 2048;
    uint64_t per_seg = (SEG / LOG_BLOCK - 1) * 2;
    size_t n = (size_t)(3 * per_seg);
    uint64_t *locs = malloc(n * sizeof *locs);
    embkv_log *l;
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    CHECK_RC(append_n(l, rec, 0, n, locs, 5), EMBKV_OK);
    CHECK(log_loc_seg(locs[0]) == 1 && log_loc_seg(locs[n - 1]) == 3);
    CHECK(log_pick_victim(l, 0.5, NULL, 0) == 0); /* all full */
    scan_ctx sc = {.rec = rec, .locs = locs, .first = (size_t)per_seg, .n = (size_t)per_seg};
    CHECK_RC(log_scan_segment(l, 2, scan_cb, &sc), EMBKV_OK);
    CHECK(sc.seen == per_seg && sc.matched == per_seg);
    for (size_t i = 0; i < per_seg; i++)
        log_release(l, locs[i]);
    for (size_t i = per_seg; i < per_seg + per_seg * 3 / 4; i++)
        log_release(l, locs[i]);
    CHECK(log_pick_victim(l, 0.5, NULL, 0) == 2);  /* 1 is empty: it waits for log_delete_dead */
    CHECK(log_delete_dead(l) == 1);
    char p[700];
    seg_path(p, sizeof p, dir, 1);
    CHECK(access(p, F_OK) != 0 && errno == ENOENT);
    CHECK(log_pick_victim(l, 0.5, NULL, 0) == 2);
    CHECK(log_pick_victim(l, 0.2, NULL, 0) == 0);
    unsigned char *out = malloc(rec);
    CHECK_RC(log_read(l, &locs[0], 1, out, NULL), EMBKV_CORRUPT);
    CHECK(has(embkv_errmsg(), "seg-0000000001.log is missing"));
    /* The head is never deleted, even when empty. */
    for (size_t i = 2 * per_seg; i < n; i++)
        log_release(l, locs[i]);
    CHECK(log_delete_dead(l) == 0);
    log_stats st;
    log_stats_get(l, &st);
    CHECK(st.segments == 2 && st.deleted_segments == 1 && st.live_records == per_seg - per_seg * 3 / 4);
    log_close(l);
    /* At open nothing is held until the store says so. */
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    log_hold(l, locs[n - 1]);
    CHECK(log_delete_dead(l) == 1); /* segment 2, unheld now */
    log_stats_get(l, &st);
    CHECK(st.segments == 1 && st.live_records == 1 && st.live_bytes == rec);
    log_close(l);
    free(out);
    free(locs);

    /* Live bytes are the room the records take: three records of 1,296
     * bytes share a block, 32 of 4,208 take two blocks each (they once
     * counted 1,296 and 4,208, and a full log read as a third garbage). */
    const uint32_t odd[2] = {1296, 4208};
    const uint64_t room[2] = {LOG_BLOCK / 3, 2 * LOG_BLOCK};
    for (int k = 0; k < 2; k++) {
        char sub[64];
        snprintf(sub, sizeof sub, "live-odd%d", k);
        uint64_t ol[32];
        CHECK_RC(open_log(test_tmpdir(sub), odd[k], 0, false, &l), EMBKV_OK);
        CHECK_RC(append_n(l, odd[k], 0, 32, ol, 3), EMBKV_OK);
        log_stats_get(l, &st);
        CHECK(st.live_records == 32 && st.live_bytes == 32 * room[k]);
        log_close(l);
    }
}

/* The kernel refusing io_uring (a seccomp filter, as container runtimes
 * install): the log falls back to pread/pwrite and says so. */
static void test_refused_uring(void)
{
#ifdef __x86_64__
    const char *dir = test_tmpdir("refused");
    pid_t pid = fork();
    if (pid == 0) {
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
            _exit(3);
        embkv_log *l;
        uint64_t locs[3000];
        if (open_log(dir, 512, 0, false, &l) != EMBKV_OK || append_n(l, 512, 0, 3000, locs, 11) != EMBKV_OK)
            _exit(4);
        log_stats st;
        log_stats_get(l, &st);
        int rc = st.uring ? 5 : !strstr(st.fallback, "the kernel refused io_uring: Operation not permitted") ? 6
                 : verify_all(l, 512, locs, 3000, 11, 5)                                                     ? 7
                                                                                                             : 0;
        log_close(l);
        _exit(rc);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status))
        fprintf(stderr, "refused-uring child: status %d\n", status);
#endif
}

/* SIGKILL while appending: what was synced reads back. */
static void test_kill(void)
{
    const char *dir = test_tmpdir("kill");
    char lp[700];
    snprintf(lp, sizeof lp, "%s.locs", dir);
    uint32_t rec = 544;
    size_t n = 5000;
    pid_t pid = fork();
    if (pid == 0) {
        embkv_log *l;
        uint64_t *locs = malloc(n * sizeof *locs);
        if (open_log(dir, rec, 0, false, &l) != EMBKV_OK || append_n(l, rec, 0, n, locs, 13) != EMBKV_OK ||
            log_sync(l) != EMBKV_OK)
            _exit(4);
        FILE *f = fopen(lp, "w");
        if (!f || fwrite(locs, sizeof *locs, n, f) != n || fclose(f) != 0)
            _exit(5);
        /* Tell the parent, then keep appending until killed. */
        if (write(1, "", 0) < 0)
            _exit(6);
        kill(getppid(), SIGUSR1);
        for (;;)
            if (append_n(l, rec, 0, 700, locs, 99) != EMBKV_OK)
                _exit(7);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    int sig;
    CHECK(sigwait(&set, &sig) == 0);
    usleep(20000);
    kill(pid, SIGKILL);
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    uint64_t *locs = malloc(n * sizeof *locs);
    FILE *f = fopen(lp, "r");
    CHECK(f && fread(locs, sizeof *locs, n, f) == n);
    if (f)
        fclose(f);
    embkv_log *l;
    CHECK_RC(open_log(dir, rec, 0, false, &l), EMBKV_OK);
    CHECK(verify_all(l, rec, locs, n, 13, 6) == 0);
    log_close(l);
    free(locs);
}

/* ssd_size reached with garbage in it: the message tells a log full of
 * rows (grow ssd_size) from one full of garbage that only checkpoints
 * take back (checkpoint and write again). */
static void test_full_of_garbage(void)
{
    const char *dir = test_tmpdir("full_garbage");
    uint32_t rec = 1024;
    uint64_t per_seg = (SEG / LOG_BLOCK - 1) * (LOG_BLOCK / rec);
    embkv_log *l;
    CHECK_RC(open_log(dir, rec, 3ull * SEG, false, &l), EMBKV_OK);
    uint64_t *locs = malloc(2 * per_seg * sizeof *locs);
    CHECK_RC(append_n(l, rec, 0, 2 * per_seg, locs, 3), EMBKV_OK);
    CHECK_RC(append_n(l, rec, 2 * per_seg, 1, locs, 3), EMBKV_FULL);
    CHECK(has(embkv_errmsg(), "2097152 bytes of segments, 2088960 of them live rows (0 in segments emptied"));
    CHECK(has(embkv_errmsg(), "open the store with a larger ssd_size"));
    /* Three quarters of the first segment replaced (garbage, not yet
     * compacted). */
    for (size_t i = 0; i < per_seg * 3 / 4; i++)
        log_release(l, locs[i]);
    CHECK_RC(append_n(l, rec, 2 * per_seg, 1, locs, 3), EMBKV_FULL);
    CHECK(has(embkv_errmsg(), "2097152 bytes of segments, 1305600 of them live rows (0 in segments emptied"));
    CHECK(has(embkv_errmsg(), "the rest is garbage that compaction frees across checkpoints: checkpoint "
                              "(embkv_sync; embkv_checkpoint in SQL) and write again, checkpoint more often"));
    /* All of it: an emptied segment, deleted at the next sync. */
    for (size_t i = per_seg * 3 / 4; i < per_seg; i++)
        log_release(l, locs[i]);
    CHECK_RC(append_n(l, rec, 2 * per_seg, 1, locs, 3), EMBKV_FULL);
    CHECK(has(embkv_errmsg(), "1044480 of them live rows (1048576 in segments emptied by compaction"));
    CHECK(has(embkv_errmsg(), "checkpoint (embkv_sync; embkv_checkpoint in SQL) and write again"));
    log_delete_dead(l);
    CHECK_RC(append_n(l, rec, 2 * per_seg, 1, locs, 3), EMBKV_OK);
    log_close(l);
    free(locs);
}

int main(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    test_roundtrip(544, false, "small");
    test_roundtrip(544, true, "small-sync");
    test_roundtrip(8208, false, "large");
    test_roundtrip(4096, false, "block");
    test_full();
    test_full_of_garbage();
    test_damage();
    test_header_formats();
    test_bad_options();
    test_live();
    test_refused_uring();
    test_kill();
    return test_summary("test_log");
}
