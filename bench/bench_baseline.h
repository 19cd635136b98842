/*
 * bench_baseline.h - the plain C baseline the engine is measured against:
 * an open-addressing hash of id -> row index over a dense float array, with
 * batch gather (with and without software prefetch) and batch
 * read-modify-write v -= LR * g.  Shared by bench_engine and bench_train.
 */
#ifndef EMBKV_BENCH_BASELINE_H
#define EMBKV_BENCH_BASELINE_H

#include "bench_common.h"

#ifndef LR
#define LR 0.01f
#endif

/* Prefetch distances of the baseline: the hash slot of the id `slot` ahead
 * and the row of the id `row` ahead (its slot prefetched earlier) are
 * prefetched.  Two settings are measured: the one of the issue (slot +8,
 * row +2) and a deeper one that was faster on this 2-core machine; ratios
 * are taken against the faster of the two, and the RMW baseline uses it. */
typedef struct pf_dist {
    size_t slot, row;
} pf_dist;
static const pf_dist pf_settings[2] = {{8, 2}, {16, 4}};
#define PF_RING 16 /* power of two > every row distance */

/* ---------------------------------------------------------- the baseline */

#define BL_EMPTY ((int64_t)-1) /* ids are non-negative */
#define BL_NONE UINT64_MAX

typedef struct bl_slot {
    int64_t key;
    uint64_t row;
} bl_slot;

typedef struct baseline {
    bl_slot *tab;
    uint64_t mask;
    int shift;    /* 64 - log2(table size) */
    size_t dim, rows;
    float *data;  /* dense rows */
} baseline;

static inline uint64_t bl_home(const baseline *b, int64_t id)
{
    return ((uint64_t)id * 0x9E3779B97F4A7C15ull) >> b->shift;
}

static inline uint64_t bl_find(const baseline *b, int64_t id)
{
    for (uint64_t i = bl_home(b, id);; i = (i + 1) & b->mask) {
        const bl_slot *s = &b->tab[i];
        if (s->key == id) return s->row;
        if (s->key == BL_EMPTY) return BL_NONE;
    }
}

static void bl_init(baseline *b, size_t rows, size_t dim)
{
    uint64_t cap = 2;
    int bits = 1;
    while (cap < 2 * rows) { cap <<= 1; bits++; }  /* load <= 0.5 */
    b->tab = xalloc_huge(cap * sizeof *b->tab);
    for (uint64_t i = 0; i < cap; i++) b->tab[i].key = BL_EMPTY;
    b->mask = cap - 1;
    b->shift = 64 - bits;
    b->dim = dim;
    b->rows = rows;
    b->data = xalloc_huge(rows * dim * sizeof(float));
}

/* Insert id as row `row`, copying its vector into the dense array. */
static void bl_insert(baseline *b, int64_t id, uint64_t row, const float *vec)
{
    uint64_t i = bl_home(b, id);
    while (b->tab[i].key != BL_EMPTY) i = (i + 1) & b->mask;
    b->tab[i].key = id;
    b->tab[i].row = row;
    memcpy(b->data + row * b->dim, vec, b->dim * sizeof(float));
}

static void bl_free(baseline *b)
{
    xfree_huge(b->tab, (b->mask + 1) * sizeof *b->tab);
    xfree_huge(b->data, b->rows * b->dim * sizeof(float));
}

static inline void prefetch_row(const float *p, size_t bytes, int write)
{
    for (size_t off = 0; off < bytes; off += 64) {
        if (write) __builtin_prefetch((const char *)p + off, 1, 3);
        else __builtin_prefetch((const char *)p + off, 0, 3);
    }
}

__attribute__((noinline, unused))
static void bl_gather(const baseline *b, const int64_t *ids, size_t n, float *out)
{
    size_t dim = b->dim;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = bl_find(b, ids[i]);
        if (r == BL_NONE) memset(out + i * dim, 0, dim * sizeof(float));
        else memcpy(out + i * dim, b->data + r * dim, dim * sizeof(float));
    }
}

/* The software-pipelined gather: slot of i + pf.slot prefetched,
 * i + pf.row looked up and its row prefetched, i copied. */
__attribute__((noinline))
static void bl_gather_pf(const baseline *b, const int64_t *ids, size_t n, float *out, pf_dist pf)
{
    size_t dim = b->dim, bytes = dim * sizeof(float);
    uint64_t ring[PF_RING];
    for (size_t j = 0; j < n && j < pf.slot; j++) __builtin_prefetch(&b->tab[bl_home(b, ids[j])]);
    for (size_t j = 0; j < n && j < pf.row; j++) {
        uint64_t r = ring[j & (PF_RING - 1)] = bl_find(b, ids[j]);
        if (r != BL_NONE) prefetch_row(b->data + r * dim, bytes, 0);
    }
    for (size_t i = 0; i < n; i++) {
        if (i + pf.slot < n) __builtin_prefetch(&b->tab[bl_home(b, ids[i + pf.slot])]);
        if (i + pf.row < n) {
            uint64_t r = ring[(i + pf.row) & (PF_RING - 1)] = bl_find(b, ids[i + pf.row]);
            if (r != BL_NONE) prefetch_row(b->data + r * dim, bytes, 0);
        }
        uint64_t r = ring[i & (PF_RING - 1)];
        if (r == BL_NONE) memset(out + i * dim, 0, bytes);
        else memcpy(out + i * dim, b->data + r * dim, bytes);
    }
}

/* The update both sides apply. */
static inline void sgd_step(float *restrict v, const float *restrict g, size_t dim)
{
    for (size_t j = 0; j < dim; j++) v[j] -= LR * g[j];
}

/* Batch v -= LR * g[i] in place, pipelined like bl_gather_pf. */
__attribute__((noinline))
static void bl_rmw_pf(baseline *b, const int64_t *ids, size_t n, const float *grad, pf_dist pf)
{
    size_t dim = b->dim, bytes = dim * sizeof(float);
    uint64_t ring[PF_RING];
    for (size_t j = 0; j < n && j < pf.slot; j++) __builtin_prefetch(&b->tab[bl_home(b, ids[j])]);
    for (size_t j = 0; j < n && j < pf.row; j++) {
        uint64_t r = ring[j & (PF_RING - 1)] = bl_find(b, ids[j]);
        if (r != BL_NONE) prefetch_row(b->data + r * dim, bytes, 1);
    }
    for (size_t i = 0; i < n; i++) {
        if (i + pf.slot < n) __builtin_prefetch(&b->tab[bl_home(b, ids[i + pf.slot])]);
        if (i + pf.row < n) {
            uint64_t r = ring[(i + pf.row) & (PF_RING - 1)] = bl_find(b, ids[i + pf.row]);
            if (r != BL_NONE) prefetch_row(b->data + r * dim, bytes, 1);
        }
        uint64_t r = ring[i & (PF_RING - 1)];
        if (r != BL_NONE) sgd_step(b->data + r * dim, grad + i * dim, dim);
    }
}

#endif
