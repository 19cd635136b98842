/*
 * tiers.h - layer 3: where rows live and how they move between tiers.
 *
 * heat.c (heat.h): the access sketch; cache.c: the DRAM cache;
 * lookahead.c: staged reads of log rows ahead of their pulls; compact.c:
 * the log's compaction; tier.c: placement between the pool and the log
 * (demotion, promotion, reads of log rows); tier_worker.c: its thread.
 */
#ifndef EMBKV_TIERS_H
#define EMBKV_TIERS_H

#include "index.h"
#include "heat.h"

/* ------------------------------------------------------------- cache.c */
typedef struct cache cache;
/* A cache of `rows` records of rec_size bytes (a multiple of 8: the
 * header, vector and state of a pool record, without its padding), whose
 * vectors are dim elements of dtype (decoded as they are read); NULL
 * with errno ENOMEM.  What a slot holds, copied in and out. */
cache *cache_new(uint64_t rows, uint32_t rec_size, uint32_t dtype, uint32_t dim);
uint32_t cache_rec_bytes(const cache *c);
void cache_free(cache *c);
uint64_t cache_capacity(const cache *c);
/* Lock-free, from any thread: */
void cache_prefetch(const cache *c, uint64_t h);
/* The same for a write-back, which then needs the slot's reserved record:
 * returned, read unlocked, as a hint for its fetch (LOC_NONE when the row
 * is not found).  It waits for the slot's line: the batch paths, which
 * need nothing from it yet, use cache_find and cache_prefetch_slot. */
uint64_t cache_prefetch_wb(cache *c, int64_t id, uint64_t h);
bool cache_contains(cache *c, int64_t id, uint64_t h);
/* One probe for a batch path: id's slot (-1: not cached) and (dirty, may
 * be NULL) whether it is dirty, a hint for cache_read_at and
 * cache_load_locked a few ids on; the slot's lines fetched meanwhile for
 * reading or writing (rw). */
int64_t cache_find(cache *c, int64_t id, uint64_t h, bool *dirty);
/* cache_find for a pull, with the sketch stamp filed for id (0: none);
 * cache_heat_mark files one: a pull of a cached row whose counters were
 * seen saturated under the current stamp need not touch the sketch. */
int64_t cache_find_heat(cache *c, int64_t id, uint64_t h, uint32_t *stamp);
void cache_heat_mark(cache *c, int64_t id, uint64_t h, uint32_t stamp);
uint64_t cache_heat_stamped(cache *c);  /* rows with a stamp filed (tests) */
void cache_prefetch_slot(cache *c, int64_t si, int rw);
/* Copies id's cached header, vector and state (each may be NULL); false
 * when id is not cached. */
bool cache_read(cache *c, int64_t id, uint64_t h, rec_hdr *hdr, float *vec, uint32_t dim, float *state,
                uint32_t state_floats);
/* cache_read, starting from the slot cache_find gave in the same
 * call (si may be -1). */
bool cache_read_at(cache *c, int64_t si, int64_t id, uint64_t h, rec_hdr *hdr, float *vec, uint32_t dim,
                   float *state, uint32_t state_floats);
void cache_count(cache *c, uint64_t hits, uint64_t misses);
/* Bytes a cache of rows rows takes (tiers.dram.bytes when full). */
uint64_t cache_bytes_for(uint64_t rows, uint32_t rec_size);
/* Around a pull's reads (this thread): rows it reads or admits are not
 * evicted for the next PULL_WINDOW pulls of the store (cache.c).  end
 * counts the pull; both take NULL (no cache). */
void cache_pull_begin(cache *c);
void cache_pull_end(cache *c);
/* With id's key lock held.  The slot of id (-1: not cached), the whole
 * record copied to rec (rec_size bytes; may be NULL), hint a slot that
 * cache_find gave (or -1); then, by slot:
 * whether it is dirty, its new content, and the turns between clean and
 * dirty.  A row turns dirty with a pool record reserved for its
 * write-back (wb), so that a checkpoint never needs room the pool may not
 * have; turning clean hands wb back (filled by the write-back, or to be
 * freed).  Removing a row hands back its wb (LOC_NONE when clean). */
int64_t cache_load_locked(cache *c, int64_t id, uint64_t h, int64_t hint, void *rec);
bool cache_slot_dirty(cache *c, int64_t slot);
uint64_t cache_slot_wb(cache *c, int64_t slot);
void cache_store_locked(cache *c, int64_t slot, const void *rec);
/* A change in place: the slot's record, its lock-free readers held off
 * (they retry) until cache_update_end.  Plain stores into it race with
 * those readers' copies, which the sequence check then discards: not for
 * the ThreadSanitizer build, which sees every slot word as an atomic. */
void *cache_update_begin(cache *c, int64_t slot);
void cache_update_end(cache *c, int64_t slot);
void cache_mark_dirty_locked(cache *c, int64_t slot, uint64_t wb);
uint64_t cache_mark_clean_locked(cache *c, int64_t slot);
uint64_t cache_remove_locked(cache *c, int64_t id, uint64_t h);
/* A clean row not cached yet (false: refused, or cached already); force
 * evicts any strictly colder clean row, not only the first under the hand
 * (cache.c). */
bool cache_admit_locked(embkv_store *s, cache *c, int64_t id, uint64_t h, const void *rec, bool force);
/* The cheap first test of admission (no lock): a free slot in the row's
 * shard, or hotter than the last victim weighed. */
bool cache_worth_admitting(embkv_store *s, cache *c, uint64_t h);
uint64_t cache_ndirty(const cache *c);
/* Ids of the rows dirty now (check each under its lock; malloc'd). */
int cache_dirty_ids(cache *c, int64_t **ids, size_t *n);
/* About `want` dirty rows for the cleaner: in each shard its share, the
 * first the shard's CLOCK hand reaches (unreferenced ones first).  A hint,
 * as above; malloc'd. */
int cache_clean_ahead(cache *c, size_t want, int64_t **ids, size_t *n);
/* The cache's fields of embkv_stats (cache_rows, cache_capacity_rows, its
 * hits and misses...); nothing without a cache (c NULL). */
void cache_stats(const cache *c, embkv_stats *st);

/* ------------------------------------------------------------- tier.c */
/* Opens (or creates) the store's SSD log as its root and the options say;
 * before slab_rebuild, which checks the index's log locations. */
int tier_open(embkv_store *s, const embkv_options *opt);
/* The same checks of the tier options for a store already open in this
 * process, which keeps its tier as it is: a larger ssd_size, or a tier
 * where there is none, is refused. */
int tier_check_open(embkv_store *s, const embkv_options *opt);
/* Closes the log and frees the tier's state; its thread stopped first
 * (tier_worker_stop). */
void tier_close(embkv_store *s);
/* Reads the records of the log locations among locs[0..n) (the others are
 * left alone) in one batch, checking each is its id's and whole (callers
 * need not check again); recs[i] points at each, inside *buf, which the
 * caller frees (NULL when none of locs is in the log: nothing allocated).
 * Inside ebr_enter.  Rows look-ahead staged are taken from the stage;
 * for_write (the row is about to be replaced) also drops them there. */
int tier_read(embkv_store *s, const int64_t *ids, const uint64_t *locs, size_t n, char **buf, rec_hdr **recs,
              bool for_write);
/* One record wherever it lives: PM in place, SSD read into *buf (as above). */
int tier_rec(embkv_store *s, int64_t id, uint64_t loc, char **buf, rec_hdr **out, bool for_write);
/* Makes room for `want` records in the pool by moving cold rows to the
 * log; the caller holds no epoch, no lock and no group of this store's. */
int tier_demote(embkv_store *s, size_t want, size_t *moved);
/* The part of a sync that concerns the log: before the epoch switch
 * (tail), before the pool's pages are flushed (sync), after the durable
 * epoch is recorded (cleanup). */
uint64_t tier_sync_tail(embkv_store *s);
int tier_sync_log(embkv_store *s, uint64_t epoch, uint64_t tail);
void tier_sync_done(embkv_store *s);
/* Recovery: the records of log locations held by the index since the tail
 * of the durable epoch, read to learn their epochs and prev links. */
bool tier_after_tail(embkv_store *s, uint64_t loc);
void tier_count_row(embkv_store *s, uint64_t loc);
/* Promotion: reads of log rows offer them (the admission policy picks);
 * the thread moves up to `room` of the queued ones into the pool. */
void tier_note_read(embkv_store *s, const int64_t *ids, const uint64_t *locs, rec_hdr *const *recs, size_t n);
/* room: records promotion may take; make_room: demote colder rows for the
 * rest of the admitted ones. */
int tier_promote_queued(embkv_store *s, size_t room, bool make_room, size_t *moved);
/* Promotes the rows of ids that are in the log now (embkv_hotset_move),
 * without asking admission, making room by demoting colder rows; a row
 * whose record is damaged stays in the log.  Without a tier: nothing. */
int tier_promote_ids(embkv_store *s, const int64_t *ids, size_t n, size_t *moved);
/* Rows queued for promotion now (promo_mu: a moment's figure). */
size_t tier_promote_pending(embkv_store *s);

/* Records the log could still take at most: its room (ssd_size less the
 * segment kept for compaction) less the blocks its live records hold. */
uint64_t tier_log_room(embkv_store *s);

/* ------------------------------------------------------------- compact.c */
/* One part of a compaction (about max_bytes of a segment read); *scanned
 * says how much was read, 0 when there was nothing to compact. */
int compact_step(embkv_store *s, uint64_t max_bytes, uint64_t *scanned);
/* Whether the log's files are past COMPACT_FULL of ssd_size: compaction
 * then runs at a higher rate (writes would fail at ssd_size). */
bool compact_urgent(embkv_store *s);
/* What a demotion of nrecs records pays before it appends, when the log is
 * urgent: up to COMPACT_PAY times their bytes of segment compacted, so that
 * appends cannot outrun compaction whatever the thread gets of the CPU. */
void compact_pay(embkv_store *s, size_t nrecs);

/* ------------------------------------------------------------- tier_worker.c */
/* The tier's thread (demotion to the watermark, queued promotions,
 * compaction): started at open for a store with a log; stopped, and
 * joined, before anything it uses is freed (no-op when not running). */
int tier_worker_start(embkv_store *s);
void tier_worker_stop(embkv_store *s);

/* ------------------------------------------------------------- lookahead.c */
/* Copies into out + j * rec_size the rows among ids/locs[0..k) that
 * look-ahead staged at those locations (waiting for those in flight), sets
 * got[j] for them and returns how many. */
size_t la_take(embkv_store *s, const int64_t *ids, const uint64_t *locs, size_t k, char *out, uint8_t *got,
               bool consume);
/* Rows a pull just read from the log, kept in the stage for the push that
 * follows (only while the stage exists: once look-ahead was used). */
void la_offer(embkv_store *s, const int64_t *ids, const uint64_t *locs, rec_hdr *const *recs, size_t n);
/* Look-ahead's fields of embkv_stats (zero before its first use). */
void la_stats(embkv_store *s, embkv_stats *st);
/* Stops look-ahead's thread and frees the stage; at close, or when the
 * tier goes. */
void la_close(embkv_store *s);

#endif
