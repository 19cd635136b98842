/*
 * log.h - the SSD log: append-only segment files of row records (log.c).
 *
 * The log knows blocks, segments and records of one fixed size; it does not
 * know ids, checksums or the index.  The store decides what goes in, keeps
 * every log location in its index, and tells the log when a record became
 * garbage (log_release).  What the log guarantees:
 *   - a record appended is readable at the location log_append returned
 *     until the store releases it and the segment is deleted;
 *   - after log_sync returns, every record appended before it survives a
 *     crash or a power loss (the log is written O_DIRECT and fdatasync'ed:
 *     unlike a pool on an ordinary file, it needs no DAX);
 *   - a block that holds records of an earlier log_sync is never written
 *     again (a torn write cannot damage what a checkpoint relies on);
 *   - a damaged segment (bad header, truncated) fails the reads of its own
 *     records with EMBKV_CORRUPT naming the file; the others work.
 */
#ifndef EMBKV_LOG_H
#define EMBKV_LOG_H

#include "base.h"

/* A log location as the index stores it: bit 63 (LOC_SSD) set, bit 62
 * (LOC_TOMB) left to the index, the segment number in bits 32..61 and the
 * byte offset / 16 in bits 0..31 (segments of up to 64 GiB). */
#define LOG_LOC_FLAG (1ull << 63)
#define LOG_MAX_SEGMENT 0x3fffffffu
static inline uint64_t log_loc(uint32_t seg, uint64_t off)
{
    return LOG_LOC_FLAG | ((uint64_t)seg << 32) | (off >> 4);
}
static inline uint32_t log_loc_seg(uint64_t loc) { return (uint32_t)(loc >> 32) & LOG_MAX_SEGMENT; }
static inline uint64_t log_loc_off(uint64_t loc) { return (uint64_t)(uint32_t)loc << 4; }

/* Every I/O is aligned to this.  4 KiB covers the logical block size of
 * the devices embkv meets (512 or 4096); records of up to a block never
 * straddle one, so a record read is one block read. */
#define LOG_BLOCK 4096u

/* What a log too small for its live rows tells the user: the size is the
 * store's, raised by an open; SQL opens a store only through a table, so
 * its way is a table made for the purpose (sql.md's options). */
#define LOG_GROW_ADVICE "open the store with a larger ssd_size (it may grow, not shrink; in SQL, while no " \
    "connection of the process has the store open: CREATE VIRTUAL TABLE of one more table with " \
    "path= the store directory and the larger ssd_size, then DROP TABLE of it, which leaves the store)"
#define LOG_DEFAULT_SEGMENT (64u << 20)

typedef struct embkv_log embkv_log;

typedef struct log_options {
    const char *dir;          /* segment directory; created (one level) if absent */
    const char *what;         /* names the log in messages ("store X: ssd_path Y") */
    uint64_t max_bytes;       /* ssd_size: the segment files may not exceed it together */
    uint32_t record_bytes;    /* every record's size, a multiple of 16 */
    uint32_t segment_bytes;   /* default LOG_DEFAULT_SEGMENT; a multiple of LOG_BLOCK */
    uint64_t tag;             /* written into every segment header and checked at open,
                                 so that another store's segments are refused */
    bool readonly;            /* a reader process's: no lock, nothing created or
                                 written, segments opened as reads need them */
    bool no_uring;            /* use pread/pwrite (also the fallback when the
                                 kernel refuses io_uring) */
} log_options;

/* Whether a directory above abs (which need not exist yet) holds log
 * segments, and which (found): the nearest.  A directory made there would
 * make that log refuse to open (log_open: files that are not segments). */
bool log_dir_above(const char *abs, char *found, size_t len);
/* Opens the directory and every segment in it (files seg-NNNNNNNNNN.log).
 * A segment whose header is damaged or belongs to another store or record
 * size stays listed as damaged: reads of it fail, the rest works.  Files
 * that are not segments are an error (EMBKV_NOTSTORE): the directory is
 * not the log's. */
int log_open(const log_options *o, embkv_log **out);
/* Closes the files (no sync: call log_sync first for durability). */
void log_close(embkv_log *l);
/* Tells a just-opened log where it ended at the last checkpoint (the
 * log_end value the store kept): segments up to that one are known to
 * have existed, so a missing newest file is noted as damaged like any
 * other missing one, and new segments are numbered after it rather than
 * reusing its number.  A segment past it without a valid header (made
 * after the checkpoint, its header lost to a power cut) is removed. */
void log_expect_end(embkv_log *l, uint64_t end);
/* Recovery leaves a row on a record at loc it could not read, in a
 * segment past the checkpoint's end whose file is gone (the log directory
 * lost with the crash): taken as one of the newest segments missing, as
 * log_expect_end allows, so the row fails reads naming the file. */
void log_note_missing(embkv_log *l, uint64_t loc);

/* Appends n records (n * record_bytes bytes at recs) as one batch of large
 * sequential writes and stores their locations in locs.  Starts a new
 * segment when the current one is full.  EMBKV_FULL (naming ssd_size) when
 * the log would grow past max_bytes; nothing is appended then.  The last
 * segment's worth of max_bytes is compaction's (for_compaction): other
 * appends make no segment past one short of it (a log whose every byte was
 * taken by demotions could never make room again); room left in the
 * current segment is anyone's.  The first segment a process makes for
 * compaction may go one segment past max_bytes: a process appends to no
 * segment of an earlier one, and a log reopened full would otherwise have
 * nowhere to compact into.  One appender at a time per log (callers
 * serialise); readers run alongside. */
int log_append(embkv_log *l, const void *recs, size_t n, uint64_t *locs, bool for_compaction);
/* Bytes of one segment file. */
uint32_t log_segment_bytes(const embkv_log *l);

/* A position: every record appended so far has a location below it and
 * every later one a location at or above it (locations compare as
 * numbers, segment first).  The store keeps the one of each checkpoint so
 * that recovery reads only the records appended since. */
uint64_t log_end(embkv_log *l);

/* Makes every record appended so far durable (fdatasync of the segments
 * written since the last call, and of the directory when one was created).
 * The next append starts in a new block. */
int log_sync(embkv_log *l);

/* Reads n records, locs[i] into out + i * record_bytes, as one batch of
 * io_uring reads at a deep queue (every record is one aligned read).  Any
 * number of threads may read at once.  Returns EMBKV_OK, or the error of the
 * first failed read with *bad set to its index (bad may be NULL); the
 * records that were read are in out either way.  The caller verifies ids
 * and checksums: the log only knows the bytes arrived. */
int log_read(embkv_log *l, const uint64_t *locs, size_t n, void *out, size_t *bad);

/* The segment file name of a location ("seg-0000000003.log"), for messages. */
const char *log_segment_name(uint64_t loc, char *buf, size_t len);
/* Whether loc names a record slot the log has written (segment known, in
 * its written part, on a record boundary): a location read from a damaged
 * index must pass this before it is read. */
bool log_loc_valid(const embkv_log *l, uint64_t loc);
/* Whether loc could name a record of this log, damage aside: on a record
 * boundary, in a segment whose written part holds it or that is damaged
 * (a segment up to the newest, or to log_expect_end's, whose file is gone
 * is noted as damaged then).  Open's check of the index: a location failing it is the index's
 * damage; one in a damaged segment is that segment's, and only its rows
 * fail when read, naming the file. */
bool log_loc_plausible(embkv_log *l, uint64_t loc);
/* Removes the segment files of the log tagged `tag` from dir, then dir
 * itself when nothing else is left; a dir that a log holds open (its lock,
 * in any process) is left whole.  Returns how many entries stayed (0: the
 * directory is gone; 1 for a dir held open), -1 if dir cannot be read. */
int log_remove_files(const char *dir, uint64_t tag);

/* Live accounting, kept by the store: log_hold when an index entry comes to
 * point at loc (at open, for every log location the index holds; appends
 * hold their records already), log_release when the entry stops pointing
 * there and no reader or checkpoint can reach it any more. */
void log_hold(embkv_log *l, uint64_t loc);
void log_release(embkv_log *l, uint64_t loc);

/* Deletes the segments no record of which is held, except the one being
 * appended to; returns how many went.  The caller calls it only when no
 * checkpoint a crash could return to refers to them (after a sync). */
size_t log_delete_dead(embkv_log *l);

/* A segment worth compacting: the one with the smallest live fraction
 * below `max_live` (0..1), not the current one and not an empty one (it
 * only waits for log_delete_dead), nor one of skip[0..nskip).  Returns its number, or 0
 * when none. */
uint32_t log_pick_victim(embkv_log *l, double max_live, const uint32_t *skip, size_t nskip);
/* Calls fn for every record slot of segment seg that was written (in
 * order), with its location; fn returns nonzero to stop (that value is
 * returned).  Reads the segment in large sequential reads.  The caller
 * decides which records are live (the index says). */
typedef int (*log_scan_fn)(void *ctx, uint64_t loc, const void *rec);
int log_scan_segment(embkv_log *l, uint32_t seg, log_scan_fn fn, void *ctx);
/* The same a part at a time: from byte *pos of the segment (0: its start)
 * through about max_bytes more (0: to the end), leaving *pos where the next
 * part starts and *done whether the segment's written end was reached.
 * Returns EMBKV_OK or an error (a value fn returned, or the log's).  Lets a
 * background scan pause between parts. */
int log_scan_part(embkv_log *l, uint32_t seg, uint64_t *pos, uint64_t max_bytes, log_scan_fn fn, void *ctx,
                  bool *done);

typedef struct log_stats {
    uint64_t segments, damaged_segments;
    uint64_t file_bytes;       /* segment files on disk */
    uint64_t written_bytes;    /* record blocks written in live segments */
    uint64_t live_records, live_bytes;
    uint64_t reads, read_bytes, read_submits;
    uint64_t writes, write_bytes, write_submits;
    uint64_t syncs, deleted_segments;
    double mean_read_depth;    /* reads in flight per read submission */
    bool uring;                /* io_uring in use (false: pread/pwrite) */
    bool direct;               /* O_DIRECT in use (false where the file system refuses it) */
    char fallback[160];        /* why not, when either is false */
} log_stats;
void log_stats_get(embkv_log *l, log_stats *st);

#endif
