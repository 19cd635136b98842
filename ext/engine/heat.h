/*
 * heat.h - access statistics for tier placement (heat.c).
 *
 * An approximate, aging frequency count per id, kept in DRAM: a count-min
 * sketch of 4-bit counters in the spirit of TinyLFU.  The tiering code asks
 * it two things: which of a few sampled PM-resident rows is the coldest
 * (heat_estimate; demote the minimum) and whether a row read from the SSD
 * log should take the place of such a victim in PM (heat_admit).
 *
 * Ids are given by their 64-bit hash (embkv__hash(id)), which the read path
 * has computed anyway.  Every function may be called from any number of
 * threads at once.  What holds:
 *   - counts saturate at HEAT_MAX_COUNT;
 *   - from one thread, and from several threads touching disjoint ids, an
 *     estimate is never below min(true count, HEAT_MAX_COUNT) as long as no
 *     aging happened since the id's first touch; two threads touching the
 *     same id at the same moment may count it once (the counts are
 *     statistics, not a ledger);
 *   - every counter is halved (rounding down) once per aging window W:
 *     10 x expected_ids (at least 1280) counted touches, touches that
 *     raised a counter (those of ids already at HEAT_MAX_COUNT do not move
 *     the window, so a stable hot set does not age itself away).  The
 *     halving is spread over the touches (a sweep over the table, one
 *     window behind: nothing is halved before W counted touches, the k-th
 *     sweep completes at (k + 1) x W), not a pause; heat_age halves
 *     everything at once, on top of the sweep.
 */
#ifndef EMBKV_HEAT_H
#define EMBKV_HEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HEAT_MAX_COUNT 15u
/* Larger expected_ids are refused (a 512 GiB sketch). */
#define HEAT_MAX_IDS (1ull << 36)

typedef struct heat heat;

/* A sketch sized for about expected_ids distinct ids (the ones worth
 * ranking: the PM tier's capacity in rows), 8 to 16 bytes each, 1 KiB at
 * least.  NULL with errno EINVAL above HEAT_MAX_IDS, ENOMEM when the
 * memory is not there.  The memory is zero pages until touched. */
heat *heat_new(uint64_t expected_ids);
void heat_free(heat *h);

/* One access of the id with this hash. */
void heat_touch(heat *h, uint64_t hash);
/* n accesses; the same counts as n heat_touch calls, faster (the table
 * lines are prefetched ahead and the shared counters updated once). */
void heat_touch_batch(heat *h, const uint64_t *hashes, size_t n);
/* heat_touch_batch that also tells (saturated may be NULL), per hash,
 * whether all its counters were at HEAT_MAX_COUNT (the touch changed
 * nothing). */
void heat_touch_batch_sat(heat *h, const uint64_t *hashes, size_t n, uint8_t *saturated);
/* n touches counted (heat_touches) without reading the table: ids whose
 * touch is known to change nothing (heat_stamp).  heat_skipped: how many
 * so far (tests). */
void heat_count(heat *h, uint64_t n);
uint64_t heat_skipped(const heat *h);

/* A saturated id stays saturated until a halving reaches its block (the
 * sweep, or heat_age): nothing else lowers a counter.  heat_stamp names
 * that state, so that a caller who saw an id saturated under a stamp can
 * skip the id's touches (and its cache line) while its stamp is the same:
 * the table then holds what the touches would have left in it.  The stamp
 * is taken against a heat_clock, a snapshot of the halvings so far, and
 * carries 8 bits of the hash.  0 (no stamp) while a snapshot saw a sweep
 * between claiming blocks and halving them: a touch then may see a
 * counter at the cap just before it is halved.  So a stamp is filed only
 * for a state the touch saw, and a clock older than a halving gives
 * stamps that no longer match: a skip can miss only a halving that began
 * after its clock was taken (take a fresh one every few hundred touches).
 * Compare stamps only when nonzero. */
typedef struct heat_clock {
    uint64_t round, rem, forced;
    bool settled;
} heat_clock;
void heat_clock_now(const heat *h, heat_clock *k);
uint32_t heat_stamp(const heat *h, const heat_clock *k, uint64_t hash);

/* As many touches as take each hash to HEAT_MAX_COUNT: for callers that
 * know the rows are hot (explicit moves up the hierarchy). */
void heat_saturate_batch(heat *h, const uint64_t *hashes, size_t n);

/* The approximate recent access count, 0..HEAT_MAX_COUNT. */
unsigned heat_estimate(const heat *h, uint64_t hash);
/* TinyLFU admission: true when the candidate is estimated strictly more
 * frequent than the victim (a tie keeps the victim: moving a row costs a
 * write in each tier). */
bool heat_admit(const heat *h, uint64_t cand_hash, uint64_t victim_hash);

/* Halves every counter now (tests; a caller that knows popularity moved). */
void heat_age(heat *h);

uint64_t heat_touches(const heat *h);   /* touches so far */
uint64_t heat_agings(const heat *h);    /* complete halvings: sweeps + heat_age calls */
size_t heat_bytes(const heat *h);       /* memory held */

#endif
