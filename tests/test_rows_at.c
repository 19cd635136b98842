/*
 * test_rows_at.c - embkv_get_rows_at and embkv_put_clock, the engine calls
 * under the SQLite binding's embkv_export / embkv_import:
 *  - a copy of a store row for row (vector, state, clock) through them is
 *    exact, for rows in the pool, in the DRAM cache and in the SSD log;
 *  - through a snapshot, rows come as of its opening (vector, state and
 *    clock of one version) whatever is written, deleted or created after;
 *    without one, as of now; an absent id gets zeros and found 0;
 *  - a damaged record is an error naming the id when the state is read.
 */
#include "embkv.h"
#include "check.h"


#define DIM 8
#define SF 9   /* state floats: any count, the engine does not interpret them here */
#define ROWS 3000

static void row_of(int64_t id, uint64_t gen, float *vec, float *state)
{
    for (int k = 0; k < DIM; k++) vec[k] = (float)(id % 1000) + 0.25f * k + 1000.0f * (float)gen;
    for (int k = 0; k < SF; k++) state[k] = -(float)(id % 1000) - 0.5f * k - 1000.0f * (float)gen;
}

static embkv_store *open_store(const char *name, uint64_t rows, uint64_t pool, uint64_t ssd, uint64_t cache)
{
    embkv_options o;
    memset(&o, 0, sizeof o);
    o.dim = DIM;
    o.state_floats = SF;
    o.expected_rows = rows;
    o.pool_size = pool;
    o.ssd_size = ssd;
    o.cache_size = cache;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir(name), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    return s;
}

/* Fills s with ROWS rows of generation 0 at clock id % 7, then copies it
 * into d through a snapshot and compares. */
static void copy_and_compare(embkv_store *s, embkv_store *d, int *tiers)
{
    float v[DIM], st[SF];
    for (int64_t id = 0; id < ROWS; id++) {
        row_of(id * 13 - 500, 0, v, st);
        CHECK_RC(embkv_put_clock(s, id * 13 - 500, v, st, (uint64_t)id % 7), EMBKV_OK);
    }
    /* batch reads bring rows into a cache (when the store has one) */
    int64_t hot[64];
    float hv[64 * DIM];
    for (int k = 0; k < 64; k++) hot[k] = (int64_t)k * 13 - 500;
    for (int r = 0; r < 3; r++) CHECK_RC(embkv_get_batch(s, hot, 64, hv, NULL, NULL), EMBKV_OK);
    embkv_snapshot *snap = NULL;
    CHECK_RC(embkv_snapshot_open(s, &snap), EMBKV_OK);
    int64_t *ids = malloc(ROWS * sizeof *ids);
    float *vecs = malloc(ROWS * DIM * sizeof *vecs), *states = malloc(ROWS * SF * sizeof *states);
    embkv_rowinfo *info = malloc(ROWS * sizeof *info);
    uint8_t *found = malloc(ROWS);
    tiers[0] = tiers[1] = tiers[2] = 0;
    for (int64_t id = 0; id < ROWS; id++) ids[id] = id * 13 - 500;
    size_t missing = 99;
    CHECK_RC(embkv_get_rows_at(s, snap, ids, ROWS, vecs, states, info, found, &missing), EMBKV_OK);
    CHECK(missing == 0);
    int bad = 0;
    for (int64_t i = 0; i < ROWS; i++) {
        row_of(ids[i], 0, v, st);
        bad += !found[i] || memcmp(vecs + i * DIM, v, sizeof v) || memcmp(states + i * SF, st, sizeof st) ||
               info[i].clock != (uint64_t)i % 7;
        if (info[i].tier >= 0 && info[i].tier < 3) tiers[info[i].tier]++;
        CHECK_RC(embkv_put_clock(d, ids[i], vecs + i * DIM, states + i * SF, info[i].clock), EMBKV_OK);
    }
    CHECK(bad == 0);
    printf("  rows by tier: dram %d, pm %d, ssd %d\n", tiers[0], tiers[1], tiers[2]);
    /* the copy: every row, state and clock */
    bad = 0;
    for (int64_t i = 0; i < ROWS; i++) {
        embkv_rowinfo ri;
        CHECK_RC(embkv_get(d, ids[i], v, st, &ri), EMBKV_OK);
        bad += memcmp(vecs + i * DIM, v, sizeof v) || memcmp(states + i * SF, st, sizeof st) || ri.clock != (uint64_t)i % 7;
    }
    CHECK(bad == 0);
    /* writes after the snapshot: replaced, deleted, created */
    for (int64_t i = 0; i < ROWS; i += 3) {
        row_of(ids[i], 1, v, st);
        CHECK_RC(embkv_put(s, ids[i], v, st, 0), EMBKV_OK);
    }
    for (int64_t i = 1; i < ROWS; i += 3) CHECK_RC(embkv_delete(s, ids[i]), EMBKV_OK);
    int64_t fresh[2] = {999999, -999999};
    for (int k = 0; k < 2; k++) {
        row_of(fresh[k], 2, v, st);
        CHECK_RC(embkv_put_clock(s, fresh[k], v, st, 41), EMBKV_OK);
    }
    CHECK_RC(embkv_get_rows_at(s, snap, ids, ROWS, vecs, states, info, found, NULL), EMBKV_OK);
    bad = 0;
    for (int64_t i = 0; i < ROWS; i++) {
        row_of(ids[i], 0, v, st);
        bad += !found[i] || memcmp(vecs + i * DIM, v, sizeof v) || memcmp(states + i * SF, st, sizeof st) ||
               info[i].clock != (uint64_t)i % 7;
    }
    CHECK(bad == 0);
    CHECK_RC(embkv_get_rows_at(s, snap, fresh, 2, vecs, states, info, found, &missing), EMBKV_OK);
    CHECK(missing == 2 && !found[0] && !found[1]);
    CHECK(vecs[0] == 0 && states[SF - 1] == 0 && states[2 * SF - 1] == 0);
    embkv_snapshot_close(snap);
    /* now: the new versions */
    CHECK_RC(embkv_get_rows_at(s, NULL, ids, ROWS, vecs, states, info, found, NULL), EMBKV_OK);
    bad = 0;
    for (int64_t i = 0; i < ROWS; i++) {
        int kind = (int)(i % 3); /* 0 replaced, 1 deleted, 2 as it was */
        row_of(ids[i], kind == 0 ? 1 : 0, v, st);
        if (kind == 1) bad += found[i] != 0;
        else bad += !found[i] || memcmp(vecs + i * DIM, v, sizeof v) || memcmp(states + i * SF, st, sizeof st) ||
                    info[i].clock != (kind == 0 ? (uint64_t)i % 7 + 1 : (uint64_t)i % 7);
    }
    CHECK(bad == 0);
    CHECK_RC(embkv_get_rows_at(s, NULL, fresh, 2, NULL, states, info, found, NULL), EMBKV_OK);
    row_of(fresh[1], 2, v, st);
    CHECK(found[0] && found[1] && info[1].clock == 41 && !memcmp(states + SF, st, sizeof st));
    free(ids);
    free(vecs);
    free(states);
    free(info);
    free(found);
}

int main(void)
{
    printf("pool only\n");
    embkv_store *s = open_store("a", ROWS, 0, 0, 0), *d = open_store("a-copy", ROWS, 0, 0, 0);
    int tiers[3];
    copy_and_compare(s, d, tiers);
    CHECK(tiers[EMBKV_TIER_PM] == ROWS);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_close(d), EMBKV_OK);
    printf("with a DRAM cache\n");
    s = open_store("b", ROWS, 0, 0, 1u << 20);
    d = open_store("b-copy", ROWS, 0, 0, 0);
    copy_and_compare(s, d, tiers);
    CHECK(tiers[EMBKV_TIER_DRAM] > 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_close(d), EMBKV_OK);
    printf("with an SSD tier (a small pool)\n");
    s = open_store("c", 200000, 16u << 20, 64u << 20, 0);
    d = open_store("c-copy", 200000, 16u << 20, 64u << 20, 0);
    /* a pool too small for every row: fill it with others first */
    float v[DIM], st[SF];
    for (int64_t id = 1000000; id < 1000000 + 150000; id++) {
        row_of(id, 3, v, st);
        CHECK_RC(embkv_put(s, id, v, st, 0), EMBKV_OK);
    }
    copy_and_compare(s, d, tiers);
    CHECK(tiers[EMBKV_TIER_SSD] > 0);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    CHECK_RC(embkv_close(d), EMBKV_OK);
    /* a damaged record: reading its state is an error naming the id */
    s = open_store("e", 100, 0, 0, 0);
    row_of(7, 0, v, st);
    CHECK_RC(embkv_put(s, 7, v, st, 0), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    char path[700];
    snprintf(path, sizeof path, "%s/store.pool", test_tmpdir("e"));
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (f) {
        fseek(f, 0, SEEK_END);
        long size = ftell(f);
        char *buf = malloc((size_t)size);
        fseek(f, 0, SEEK_SET);
        CHECK(fread(buf, 1, (size_t)size, f) == (size_t)size);
        char *at = memmem(buf, (size_t)size, st, sizeof st);
        CHECK(at != NULL);
        if (at) {
            fseek(f, (long)(at - buf) + 5, SEEK_SET);
            fputc(at[5] ^ 0x10, f);
        }
        free(buf);
        fclose(f);
    }
    s = open_store("e", 100, 0, 0, 0);
    int64_t id = 7;
    float sv[SF];
    uint8_t fd;
    CHECK_RC(embkv_get_rows_at(s, NULL, &id, 1, NULL, sv, NULL, &fd, NULL), EMBKV_CORRUPT);
    CHECK(strstr(embkv_errmsg(), "id 7") != NULL);
    CHECK_RC(embkv_get_rows_at(s, NULL, &id, 1, NULL, NULL, NULL, &fd, NULL), EMBKV_OK);  /* existence only */
    CHECK_RC(embkv_close(s), EMBKV_OK);
    return test_summary("test_rows_at");
}
