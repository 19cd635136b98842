/*
 * ops.h - layer 4: the operations on rows.
 *
 * permits.c: staleness permits; admit.c: pull counts for admission;
 * write.c: row writes (copy-on-write,
 * the cache's write-backs); read.c: row reads; scan.c: index walks;
 * knn.c: nearest-neighbour search; hotset.c: the hottest rows and their
 * moves up; migrate.c: the migration thread; evict.c: expiry and
 * max_rows, the checkpoint marks;
 * gather.c: reads into device memory and the device side of a push;
 * train.c: pull/push, optimizers, deferred initialization, sessions.
 */
#ifndef EMBKV_OPS_H
#define EMBKV_OPS_H

#include "tiers.h"

/* ------------------------------------------------------------- permits.c */
typedef struct permit_table permit_table;
permit_table *permits_new(void);
void permits_free(permit_table *pt);
/* One permit on id while fewer than bound are out, waiting until deadline
 * (CLOCK_MONOTONIC): EMBKV_OK, EMBKV_BUSY (timed out), EMBKV_NOMEM, or
 * PERMIT_RECHECK (nothing taken) once the table's generation is no longer
 * gen, the one bound was read under: the options changed, read them and
 * the generation again and call again. */
#define PERMIT_RECHECK 0x5052
int permit_take(permit_table *pt, int64_t id, unsigned bound, unsigned gen, const struct timespec *deadline,
                bool *waited);
/* The generation: permits_bump changes it (with new options, under the
 * lock they are read under), then permits_wake wakes every waiter. */
unsigned permits_gen(permit_table *pt);
void permits_bump(permit_table *pt);
void permits_wake(permit_table *pt);
void permit_return(permit_table *pt, int64_t id);
unsigned permit_count(permit_table *pt, int64_t id);
/* Runs fn(ctx) (its result in *rc) only while id has no permit out, with
 * the id's stripe held meanwhile, so that no pull takes one until fn is
 * done (eviction: a row is deleted only while no batch in flight holds
 * it).  Returns whether fn ran.  fn may take the store's locks: no one
 * takes a stripe while holding them. */
bool permit_none_run(permit_table *pt, int64_t id, int (*fn)(void *ctx), void *ctx, int *rc);

/* ------------------------------------------------------------- admit.c */
/* Pull counts of ids without a row (admission, admit='count(N)'): a
 * count-min sketch of 8-bit counters sized for about expected_ids. */
typedef struct admit_sketch admit_sketch;
admit_sketch *admit_new(uint64_t expected_ids);
void admit_free(admit_sketch *a);
size_t admit_bytes(const admit_sketch *a);
/* Counts one pull of id; returns its count so far (at most 255), never
 * below the true count. */
unsigned admit_touch(admit_sketch *a, int64_t id);

/* ---------------------------------------------------------- readonly.c */
/* A store opened with EMBKV_OPEN_READONLY (s->reader): ro_load does what
 * store.c's open_reader leaves (the reader table, the index, the log, the
 * count; the root's geometry is checked there), ro_free undoes it; reads
 * as of epoch d (0: the durable epoch now), inside a reader slot of their
 * own. */
int ro_load(embkv_store *s);
void ro_free(embkv_store *s);
int ro_enter(embkv_store *s);
void ro_leave(embkv_store *s);
uint64_t ro_as_of(embkv_store *s);
/* s->rows from the root: the rows of the writer's last checkpoint. */
void ro_count_update(embkv_store *s);
int ro_read(embkv_store *s, uint64_t d, const int64_t *ids, size_t n, float *out, float *state,
            embkv_rowinfo *info, uint8_t *found, size_t *nmissing, int *tiers);
int ro_scan_ids(embkv_store *s, uint64_t *pos, int64_t *ids, size_t cap, size_t *n);
int ro_scan(embkv_store *s, embkv_scan_fn fn, void *ctx);

/* ------------------------------------------------------------- write.c */
/* A batch split over two threads (parties 0 and 1, train.c's push): each
 * half reserves its records, then passes the gate, which waits for the
 * other half; unless both reserved theirs, neither changes a row, and the
 * half whose reservation succeeded returns WRITE_CANCELLED (the other's
 * error is the batch's).  A half that fails before its gate passes it as
 * failed on its way out. */
typedef struct write_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool arrived[2];
    bool ok;
} write_gate;
#define WRITE_CANCELLED 0x4e43
void write_gate_init(write_gate *g);
void write_gate_destroy(write_gate *g);
/* Party arrives (ok: its records reserved), waits for the other; whether
 * both were ok.  A second arrival of a party only waits. */
bool write_gate_pass(write_gate *g, int party, bool ok);
/* embkv_update_batch for the engine's own update functions
 * (train.c's optimizers), which may be handed a cached row's slot itself
 * instead of a private copy, its readers held off while fn runs: fn must
 * be quick, must not call into the store, and if it returns nonzero its
 * changes are undone.  in_slot and in_dirty (both or neither may be NULL): per
 * row, its cache slot (-1: none) and whether it was dirty, as
 * exists_batch_hints found them earlier in the same write group (each
 * slot is checked before use; a row counted dirty that needs a record when
 * reached, having been deleted and written again since, gets one then). */
int update_batch_in_place(embkv_store *s, const int64_t *ids, size_t n, const int64_t *in_slot, const uint8_t *in_dirty,
                          embkv_update_fn fn, void *ctx, write_gate *gate, int party, size_t *nupdated);
/* The cache's write-backs.  Quiesces the groups (groups_quiesce, what:
 * the caller's name) with every dirty row written back; on failure the
 * groups are resumed (or were never held). */
int writeback_quiesce(embkv_store *s, const char *what);
/* Outside any group of the thread: once more than 15/16 of the cache is
 * dirty, quiesces the groups and writes back the rows the CLOCK hands
 * reach next (down to 7/8). */
int writeback_clean(embkv_store *s);

/* A delete's conditions (delete_if): the version of the row a scan saw. */
typedef struct delete_cond {
    uint64_t clock;
    uint32_t epoch;
} delete_cond;
/* embkv_delete of id only while it is the version c says (its record of
 * clock c->clock and epoch c->epoch, in whichever tier) and not dirty in
 * the DRAM cache: *changed (nothing deleted, EMBKV_OK) when it is not.
 * Inside the caller's write group. */
int delete_if(embkv_store *s, int64_t id, const delete_cond *c, bool *changed);

/* ------------------------------------------------------------- read.c */
/* embkv_get_batch putting row j of the batch at row
 * out_row[j] of out (out_row NULL: at row j). */
int get_batch_rows(embkv_store *s, const int64_t *ids, size_t n, float *out, const size_t *out_row, uint8_t *found,
                   size_t *nmissing);
/* A read of a row whose access the caller has already counted (a pull
 * reading back the rows it created): as embkv_get, but not counted again in
 * the cache's hits and misses or in the access statistics. */
int get_uncounted(embkv_store *s, int64_t id, float *vec);
/* embkv_exists_batch noting too, when in_slot and in_dirty are not
 * NULL (a store with a cache only), each row's cache slot (-1: not cached)
 * and whether it is dirty; with them, it counts the cached rows' access
 * (a push's: update_batch_in_place then counts the others), skipping a
 * row its stamp shows saturated, as a batch get does. */
size_t exists_batch_hints(embkv_store *s, const int64_t *ids, size_t n, uint8_t *found, int64_t *in_slot,
                          uint8_t *in_dirty);

/* The vectors of a batch's log-resident rows (positions at->v[i] of ids,
 * locations locs->v[i]) in one log read, row j put at row out_row[j] of
 * out (out_row NULL: at row j), rows stride floats apart. */
int read_ssd_rows(embkv_store *s, const int64_t *ids, const locvec *at, const locvec *locs, float *out,
                  const size_t *out_row, size_t stride);

/* ------------------------------------------------------------- scan.c */

/* ------------------------------------------------------------- knn.c */
/* Frees the record map kept between searches (at close). */
void knn_map_free(embkv_store *s);

/* ------------------------------------------------------------- hotset.c */
/* embkv_hotset_move's work; raise tells the sketch the rows are as hot as
 * can be first (an application's move: it says they are), which a
 * background migration, moving what the sketch ranked, does not. */
int hotset_move(embkv_store *s, const int64_t *ids, size_t n, embkv_moves *moves, bool raise);
/* The hot-set migration thread (migrate.c); stopped before the tier's. */
int migrate_start(embkv_store *s, uint64_t rate);
void migrate_stop(embkv_store *s);

/* ------------------------------------------------------------- gather.c */
typedef struct gpu_state gpu_state;
/* A batch read into device memory (embkv_get_batch_device): rows j with
 * given[j] (given may be NULL) are given_rows' row j instead; a missing id
 * is a row of zeros, counted in *nmissing, the first in *first_missing.
 * fn names the caller in errors.  Returns once the launch is enqueued. */
int gpu_gather(embkv_store *s, const int64_t *ids, size_t n, void *dev_out, void *stream, const uint8_t *given,
               const float *given_rows, size_t *nmissing, int64_t *first_missing, const char *fn);
/* A push's gradients summed on the device (gpudrv.h: gpu_sum_args), waited
 * for: once and sums point into pinned memory held until gpu_sums_release. */
typedef struct gpu_sums {
    float *once;
    double *sums;
    struct lease *lease;
} gpu_sums;
int gpu_grad_sum(embkv_store *s, void *stream, const void *dev_grads, const uint32_t *occ, const uint32_t *start,
                 const uint32_t *rowof, uint32_t n, uint32_t nu, uint32_t nonce, uint32_t nsums, gpu_sums *out);
void gpu_sums_release(embkv_store *s, gpu_sums *sums);
/* Whether a GPU is usable and dev is an address of its memory (and no
 * earlier failure is pending): what a device call checks first, before a
 * pull creates rows. */
int gpu_target_check(embkv_store *s, const void *dev);
void gpu_stats(embkv_store *s, embkv_stats *st);
/* Every gather of the store completed, the pool unregistered: before the
 * pool is unmapped. */
void gpu_close(embkv_store *s);

/* ------------------------------------------------------------- evict.c */
/* Installs the eviction options of embkv_train_options (pt: the permits
 * its deletes respect), starting the eviction thread when one is set. */
int evict_configure(embkv_store *s, const embkv_train_options *o, permit_table *pt);
/* Whether pulls must take permits: eviction is on. */
bool evict_holds_pulls(embkv_store *s);
/* At a sync, with the groups stopped at epoch's switch: writes its mark
 * (P8) into the root's marks, which the caller makes durable
 * (persist_range_in). */
void evict_mark_write(embkv_store *s, uint64_t epoch, uint64_t steps);
/* The table's step as of the durable epoch's mark (at open). */
uint64_t evict_steps_at(embkv_store *s, uint64_t durable);
void evict_stats(embkv_store *s, embkv_train_stats *st);
/* The thread stopped (close), then its state freed (free_store). */
void evict_stop(embkv_store *s);
void evict_free(embkv_store *s);

/* ------------------------------------------------------------- train.c */
void train_free(embkv_store *s);

#endif
