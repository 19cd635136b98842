/*
 * util.c - small pieces every layer uses: the monotonic clock, growable
 * vectors of locations and the distinct ids of a batch.
 *
 * Here, at the bottom, so that no file needs a higher one for them (there
 * were three copies of the clock).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base.h"

uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int locvec_push(locvec *v, uint64_t x)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 1024;
        uint64_t *p = realloc(v->v, cap * sizeof *p);
        if (!p)
            return EMBKV_NOMEM;
        v->v = p;
        v->cap = cap;
    }
    v->v[v->n++] = x;
    return EMBKV_OK;
}

int ids_distinct(const int64_t *ids, size_t n, int64_t *uniq, size_t *slot_of, size_t *nu)
{
    size_t cap = 16;
    while (cap < 2 * n)
        cap <<= 1;
    size_t *table = malloc(cap * sizeof *table);
    if (!table)
        return EMBKV_NOMEM;
    memset(table, 0xff, cap * sizeof *table);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)embkv__hash(ids[i]) & (cap - 1);
        while (table[h] != SIZE_MAX && uniq[table[h]] != ids[i])
            h = (h + 1) & (cap - 1);
        if (table[h] == SIZE_MAX) {
            table[h] = k;
            uniq[k++] = ids[i];
        }
        if (slot_of)
            slot_of[i] = table[h];
    }
    free(table);
    *nu = k;
    return EMBKV_OK;
}
