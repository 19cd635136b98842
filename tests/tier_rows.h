/*
 * tier_rows.h - rows for the SSD tier's tests (test_tier, test_tier_bg):
 * vectors derived from (id, generation), a model gen[id] (0: absent) and
 * checks of every row by every read path, and where rows are (ssd_rows,
 * count_tier: test_hotset, test_concurrency_migrate).  Include after
 * defining DIM.
 */
#ifndef EMBKV_TEST_TIER_ROWS_H
#define EMBKV_TEST_TIER_ROWS_H

static void vec_of(int64_t id, uint64_t gen, float *v)
{
    for (int i = 0; i < DIM; i++)
        v[i] = (float)((mix64((uint64_t)id * 31 + gen * 1000003 + (uint64_t)i) >> 40) % 100000) / 7.0f;
}

static bool vec_is(const float *got, int64_t id, uint64_t gen)
{
    float want[DIM];
    vec_of(id, gen, want);
    return memcmp(got, want, sizeof want) == 0;
}

typedef struct scan_ctx {
    uint64_t *gen;
    size_t n, seen, wrong;
} scan_ctx;

static int scan_cb(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)state;
    (void)info;
    scan_ctx *c = ctx;
    c->seen++;
    if (id < 0 || (size_t)id >= c->n || !c->gen[id] || !vec_is(vec, id, c->gen[id]))
        c->wrong++;
    return 0;
}

/* Every row of the model, by every read path; gen[id] 0 = absent. */
static void check_all(embkv_store *s, const uint64_t *gen, size_t n)
{
    size_t present = 0, wrong = 0;
    float v[DIM];
    for (size_t id = 0; id < n; id++)
        present += gen[id] != 0;
    /* One read per row is one I/O per log-resident row: a sample. */
    for (size_t id = 0; id < n; id += 13) {
        int rc = embkv_get(s, (int64_t)id, v, NULL, NULL);
        if (gen[id] ? rc != EMBKV_OK || !vec_is(v, (int64_t)id, gen[id]) : rc != EMBKV_NOTFOUND)
            wrong++;
    }
    CHECK(wrong == 0);
    enum { B = 4096 };
    int64_t *ids = malloc(B * sizeof *ids);
    float *out = malloc((size_t)B * DIM * sizeof *out);
    uint8_t *found = malloc(B);
    embkv_rowinfo *info = malloc(B * sizeof *info);
    size_t wrong_b = 0, wrong_at = 0;
    for (size_t lo = 0; lo < n; lo += B) {
        size_t m = n - lo < B ? n - lo : B;
        for (size_t j = 0; j < m; j++)
            ids[j] = (int64_t)(lo + (j * 7919) % m);  /* shuffled within the block */
        CHECK_RC(embkv_get_batch(s, ids, m, out, found, NULL), EMBKV_OK);
        for (size_t j = 0; j < m; j++)
            if (found[j] != (gen[ids[j]] != 0) || (found[j] && !vec_is(out + j * DIM, ids[j], gen[ids[j]])))
                wrong_b++;
        CHECK_RC(embkv_get_batch_at(s, NULL, ids, m, out, info, found, NULL), EMBKV_OK);
        for (size_t j = 0; j < m; j++)
            if (found[j] != (gen[ids[j]] != 0) || (found[j] && !vec_is(out + j * DIM, ids[j], gen[ids[j]])))
                wrong_at++;
    }
    CHECK(wrong_b == 0);
    CHECK(wrong_at == 0);
    scan_ctx c = {.gen = (uint64_t *)gen, .n = n};
    CHECK_RC(embkv_scan(s, scan_cb, &c), EMBKV_OK);
    CHECK(c.wrong == 0 && c.seen == present);
    embkv_stats st;
    CHECK_RC(embkv_stats_get(s, &st), EMBKV_OK);
    CHECK(st.rows == present && st.rows_pm + st.rows_ssd == present);
    CHECK_RC(embkv_check(s), EMBKV_OK);
    if (wrong || wrong_b || wrong_at || c.wrong)
        fprintf(stderr, "check_all: %zu get, %zu batch, %zu batch_at, %zu scan wrong of %zu\n", wrong, wrong_b,
                wrong_at, c.wrong, n);
    free(ids);
    free(out);
    free(found);
    free(info);
}

static int put_gen(embkv_store *s, int64_t id, uint64_t gen)
{
    float v[DIM];
    vec_of(id, gen, v);
    return embkv_put(s, id, v, NULL, 0);
}

/* Puts ids 0..n-1 at generation 1 until one fails; returns how many went
 * in (gen records them) and that failure in *rc (EMBKV_OK: all did). */
static size_t load_rows(embkv_store *s, uint64_t *gen, size_t n, int *rc)
{
    size_t id = 0;
    for (*rc = EMBKV_OK; id < n; id++) {
        if ((*rc = put_gen(s, (int64_t)id, 1)) != EMBKV_OK)
            break;
        gen[id] = 1;
    }
    return id;
}

/* A new store in root/name with options o, rows 0..n-1 put at generation
 * 1 (gen records them). */
static inline embkv_store *open_with_rows(const char *root, const char *name, const embkv_options *o, uint64_t *gen,
                                         size_t n)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    int rc;
    if (s)
        CHECK(load_rows(s, gen, n, &rc) == n);
    return s;
}

/* After a crash: how many of the n rows equal model a, and how many model b
 * (gen 0: absent), the clocks too where a_clk / b_clk are given.  Read in
 * batches (one io_uring submission for a batch's log rows): a read that
 * fails counts its whole batch as equal to neither. */
static inline void count_equal(embkv_store *s, size_t n, const uint64_t *a, const uint64_t *a_clk, const uint64_t *b,
                        const uint64_t *b_clk, size_t *eq_a, size_t *eq_b)
{
    enum { B = 2048 };
    int64_t *ids = malloc(B * sizeof *ids);
    float *v = malloc((size_t)B * DIM * sizeof *v);
    uint8_t *found = malloc(B);
    embkv_rowinfo *info = malloc(B * sizeof *info);
    *eq_a = *eq_b = 0;
    for (size_t lo = 0; ids && v && found && info && lo < n; lo += B) {
        size_t m = n - lo < B ? n - lo : B;
        for (size_t j = 0; j < m; j++)
            ids[j] = (int64_t)(lo + j);
        if (embkv_get_batch_at(s, NULL, ids, m, v, info, found, NULL) != EMBKV_OK) {
            fprintf(stderr, "count_equal: rows %zu..%zu: %s\n", lo, lo + m - 1, embkv_errmsg());
            continue;
        }
        for (size_t j = 0; j < m; j++) {
            size_t id = lo + j;
            const float *r = v + j * DIM;
            *eq_a += a[id] ? found[j] && vec_is(r, (int64_t)id, a[id]) && (!a_clk || info[j].clock == a_clk[id])
                           : !found[j];
            *eq_b += b[id] ? found[j] && vec_is(r, (int64_t)id, b[id]) && (!b_clk || info[j].clock == b_clk[id])
                           : !found[j];
        }
    }
    free(ids);
    free(v);
    free(found);
    free(info);
}

/* Ids of rows now in the log among 0..n-1, up to want of them, from start. */
static inline size_t ssd_rows(embkv_store *s, size_t n, size_t start, size_t want, int64_t *out)
{
    size_t k = 0;
    for (size_t lo = start; lo < n && k < want; lo += 512) {
        int64_t ids[512];
        int tier[512];
        uint8_t found[512];
        size_t m = n - lo < 512 ? n - lo : 512;
        for (size_t j = 0; j < m; j++)
            ids[j] = (int64_t)(lo + j);
        CHECK_RC(embkv_locate_batch_at(s, NULL, ids, m, tier, found), EMBKV_OK);
        for (size_t j = 0; j < m && k < want; j++)
            if (found[j] && tier[j] == EMBKV_TIER_SSD)
                out[k++] = ids[j];
    }
    return k;
}

/* How many of ids (at most 256) are present in tier want. */
static inline size_t count_tier(embkv_store *s, const int64_t *ids, size_t k, int want)
{
    int tier[256];
    uint8_t found[256];
    CHECK(k <= 256);
    CHECK_RC(embkv_locate_batch_at(s, NULL, ids, k, tier, found), EMBKV_OK);
    size_t c = 0;
    for (size_t i = 0; i < k; i++)
        c += found[i] && tier[i] == want;
    return c;
}

#endif
