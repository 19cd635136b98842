/*
 * hotset.c - moves of rows up the hierarchy (PetPS's hotness-aware
 * placement): a displaced key into its home bucket, so the hottest rows are
 * found with one bucket read.
 */
#include "store_internal.h"

int embkv_hotset(embkv_store *s, const int64_t *ids, size_t n, size_t *moved)
{
    if (moved)
        *moved = 0;
    if (!s || (n && !ids))
        return embkv__err(EMBKV_INVALID, "embkv_hotset: NULL argument");
    size_t m = 0;
    pthread_rwlock_rdlock(&s->writers);
    pthread_mutex_lock(&s->move_mu);
    index_desc *ix = atomic_load(&s->ix);
    for (size_t i = 0; i < n; i++) {
        uint64_t h = embkv__hash(ids[i]);
        keylock_acquire(s, h);
        m += (size_t)ix_move_home(s, ix, ids[i], h);
        keylock_release(s, h);
    }
    pthread_mutex_unlock(&s->move_mu);
    pthread_rwlock_unlock(&s->writers);
    atomic_fetch_add(&s->st_hot_moves, m);
    if (moved)
        *moved = m;
    return EMBKV_OK;
}
