/*
 * debug.c - introspection of the PetHash layout, the sketch and the tier
 * thread for tests and benchmarks (the crash points are persist.c's).
 */
#include <signal.h>

#include "top.h"
#include "embkv_debug.h"

uint64_t embkv_debug_nbuckets(embkv_store *s) { return atomic_load(&s->ix)->nbuckets; }
unsigned embkv_debug_slots_per_bucket(void) { return BUCKET_SLOTS; }
uint64_t embkv_debug_home(embkv_store *s, int64_t id) { return embkv__hash(id) & atomic_load(&s->ix)->mask; }
uint64_t embkv_debug_step(embkv_store *s, int64_t id) { (void)s; return hash_step(embkv__hash(id)); }

int embkv_debug_bucket_of(embkv_store *s, int64_t id, uint64_t *bucket_out)
{
    found_slot f;
    ebr_enter();
    bool ok = ix_find(atomic_load(&s->ix), id, embkv__hash(id), &f) && !(f.loc & LOC_TOMB);
    ebr_leave();
    if (!ok)
        return embkv__err(EMBKV_NOTFOUND, "id %lld not found", (long long)id);
    *bucket_out = f.bucket;
    return EMBKV_OK;
}

void *embkv_debug_record(embkv_store *s, int64_t id)
{
    ebr_enter();
    uint64_t loc = ix_lookup(atomic_load(&s->ix), id, embkv__hash(id), NULL);
    ebr_leave();
    if (loc == LOC_NONE || loc == LOC_CACHED || (loc & LOC_FLAGS))
        return NULL;
    return rec_at(s, loc);
}

uint32_t embkv_debug_overflow(embkv_store *s, uint64_t b)
{
    return __atomic_load_n(&atomic_load(&s->ix)->buckets[b].overflow, __ATOMIC_RELAXED);
}

uint32_t embkv_debug_used(embkv_store *s, uint64_t b)
{
    return (uint32_t)__builtin_popcount(__atomic_load_n(&atomic_load(&s->ix)->buckets[b].used, __ATOMIC_RELAXED));
}

uint32_t embkv_debug_probes(embkv_store *s, int64_t id)
{
    uint32_t probes = 0;
    ebr_enter();
    ix_lookup(atomic_load(&s->ix), id, embkv__hash(id), &probes);
    ebr_leave();
    return probes;
}

void embkv_debug_heat_age(embkv_store *s)
{
    if (s->heat)
        heat_age(s->heat);
}

uint64_t embkv_debug_heat_stamped(embkv_store *s) { return s->cache ? cache_heat_stamped(s->cache) : 0; }

uint64_t embkv_debug_heat_skipped(embkv_store *s) { return s->heat ? heat_skipped(s->heat) : 0; }

void embkv_debug_tier_pause(embkv_store *s, int paused) { atomic_store(&s->tw_paused, paused != 0); }
