/*
 * test_admit.c - admission of new ids (admit_count, admit='count(N)').
 *
 *  A. An id alone is stored exactly at its N-th pull; before, each pull
 *     returns its initial values (the ones the row then gets) and creates
 *     nothing; pushes of it are dropped and counted, other rows of the push
 *     updated; stats exact.  N = 1 and 0 store at the first pull.
 *  B. The false-admission rate: a table's worth of ids pulled once each,
 *     then ten times as many: the share stored at N = 2 (printed; bounded
 *     well below 1%).  Ids pulled N times among them are all stored.
 *  C. Options: N above 255, admission without an initializer.
 *  D. Reopen: the counts start over (DRAM), rows stored stay.
 */
#include "embkv.h"
#include "check.h"

#define DIM 4

static embkv_store *open_store(const char *name, uint64_t rows, unsigned admit)
{
    embkv_options o = {0};
    o.dim = DIM;
    o.expected_rows = rows;
    embkv_train_options t;
    embkv_train_defaults(&t);
    o.state_floats = embkv_train_state_floats(&t, DIM);
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir(name), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) return NULL;
    t.init = EMBKV_INIT_UNIFORM;
    t.init_a = -1;
    t.init_b = 1;
    t.seed = 7;
    t.lr = 0.5;
    t.admit_count = admit;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    return s;
}

static void test_exact(void)
{
    embkv_store *s = open_store("exact", 1000, 3);
    if (!s) return;
    embkv_session *ss = NULL;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    int64_t ids[2] = {11, 12};
    float v[2 * DIM], first[2 * DIM], g[2 * DIM];
    for (int i = 0; i < 2 * DIM; i++) g[i] = 1.0f;
    size_t upd = 99;
    /* pulls 1 and 2: initial values, no row; pushes dropped */
    CHECK_RC(embkv_pull(ss, ids, 2, first), EMBKV_OK);
    CHECK(embkv_count(s) == 0);
    CHECK_RC(embkv_push(ss, ids, 2, g, 0, &upd), EMBKV_OK);
    CHECK(upd == 0 && embkv_count(s) == 0);
    CHECK_RC(embkv_pull(ss, ids, 1, v), EMBKV_OK);
    CHECK(memcmp(v, first, DIM * sizeof(float)) == 0);  /* the same initial values */
    CHECK(embkv_count(s) == 0);
    CHECK_RC(embkv_release(ss, ids, 1, NULL), EMBKV_OK);
    /* pull 3 of id 11: stored, from those values */
    CHECK_RC(embkv_pull(ss, ids, 2, v), EMBKV_OK);
    CHECK(embkv_count(s) == 1);
    CHECK(embkv_exists(s, 11) && !embkv_exists(s, 12));
    CHECK(memcmp(v, first, 2 * DIM * sizeof(float)) == 0);
    /* a push of both: 11 updated (sgd, lr 0.5), 12's gradient dropped */
    CHECK_RC(embkv_push(ss, ids, 2, g, 0, &upd), EMBKV_OK);
    CHECK(upd == 1);
    float row[DIM];
    embkv_rowinfo info;
    CHECK_RC(embkv_get(s, 11, row, NULL, &info), EMBKV_OK);
    for (int j = 0; j < DIM; j++) CHECK(row[j] == first[j] - 0.5f);
    CHECK(info.clock == 1);
    embkv_train_stats st;
    CHECK_RC(embkv_train_stats_get(s, &st), EMBKV_OK);
    /* refused: pull 1 (11, 12), pull 2 (11), pull 3 (12); dropped: 2 + 1 */
    CHECK(st.admit_refused == 4);
    CHECK(st.admit_dropped == 3);
    CHECK(st.rows_created == 1);
    CHECK(st.admit_bytes > 0);
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_OK);

    /* N = 1 (and 0): the first pull stores, as without admission */
    for (unsigned n = 0; n <= 1; n++) {
        s = open_store(n ? "one" : "zero", 1000, n);
        if (!s) return;
        CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
        CHECK_RC(embkv_pull(ss, ids, 2, v), EMBKV_OK);
        CHECK(embkv_count(s) == 2);
        embkv_session_close(ss);
        CHECK_RC(embkv_train_stats_get(s, &st), EMBKV_OK);
        CHECK(st.admit_refused == 0 && st.admit_bytes == 0);
        CHECK_RC(embkv_close(s), EMBKV_OK);
    }
}

static void test_false_admissions(void)
{
    const uint64_t rows = 100000;
    embkv_store *s = open_store("false", rows, 2);
    if (!s) return;
    embkv_session *ss = NULL;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    enum { B = 1000 };
    int64_t ids[B];
    float out[B * DIM];
    uint64_t next = 1;
    uint64_t shares[2] = {rows, 10 * rows};
    uint64_t done = 0;
    for (int phase = 0; phase < 2; phase++) {
        uint64_t before = embkv_count(s);
        for (; done < shares[phase]; done += B) {
            for (int i = 0; i < B; i++) ids[i] = (int64_t)(next++ * 2654435761u % 1000000007u);
            CHECK_RC(embkv_pull(ss, ids, B, out), EMBKV_OK);
            CHECK_RC(embkv_release(ss, ids, B, NULL), EMBKV_OK);
        }
        uint64_t stored = embkv_count(s) - before;
        double rate = (double)stored / (double)(shares[phase] - (phase ? shares[0] : 0));
        printf("  B: %llu ids pulled once: %.4f%% stored at N = 2\n",
               (unsigned long long)(shares[phase] - (phase ? shares[0] : 0)), 100 * rate);
        CHECK(rate < 0.002);
    }
    /* ids pulled twice among them: all stored */
    uint64_t before = embkv_count(s);
    for (int i = 0; i < B; i++) ids[i] = -1 - i;
    CHECK_RC(embkv_pull(ss, ids, B, out), EMBKV_OK);
    CHECK_RC(embkv_release(ss, ids, B, NULL), EMBKV_OK);
    CHECK_RC(embkv_pull(ss, ids, B, out), EMBKV_OK);
    CHECK_RC(embkv_release(ss, ids, B, NULL), EMBKV_OK);
    size_t there = 0;
    for (int i = 0; i < B; i++) there += embkv_exists(s, ids[i]);
    CHECK(there == B);
    CHECK(embkv_count(s) - before == B);
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_options(void)
{
    embkv_store *s = open_store("opts", 1000, 0);
    if (!s) return;
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.admit_count = 256;
    t.init = EMBKV_INIT_ZEROS;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "option admit: count(N) takes N from 1 to 255, got 256") != NULL);
    t.admit_count = 2;
    t.init = EMBKV_INIT_NONE;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_INVALID);
    CHECK(strstr(embkv_errmsg(), "option admit needs an initializer (init)") != NULL);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

static void test_reopen(void)
{
    embkv_store *s = open_store("reopen", 1000, 2);
    if (!s) return;
    embkv_session *ss = NULL;
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    int64_t a = 5, b = 6;
    float v[DIM];
    CHECK_RC(embkv_pull(ss, &a, 1, v), EMBKV_OK);
    CHECK_RC(embkv_pull(ss, &a, 1, v), EMBKV_OK);  /* stored */
    CHECK_RC(embkv_pull(ss, &b, 1, v), EMBKV_OK);  /* half way */
    embkv_session_close(ss);
    CHECK_RC(embkv_sync(s), EMBKV_OK);
    CHECK_RC(embkv_close(s), EMBKV_OK);
    embkv_options o = {0};
    CHECK_RC(embkv_open(test_tmpdir("reopen"), &o, 0, &s), EMBKV_OK);
    if (!s) return;
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_ZEROS;
    t.admit_count = 2;
    CHECK_RC(embkv_train_configure(s, &t), EMBKV_OK);
    CHECK(embkv_exists(s, 5) && !embkv_exists(s, 6));
    CHECK_RC(embkv_session_open(s, &ss), EMBKV_OK);
    CHECK_RC(embkv_pull(ss, &b, 1, v), EMBKV_OK);
    CHECK(!embkv_exists(s, 6));  /* its count started over */
    CHECK_RC(embkv_pull(ss, &b, 1, v), EMBKV_OK);
    CHECK(embkv_exists(s, 6));
    embkv_session_close(ss);
    CHECK_RC(embkv_close(s), EMBKV_OK);
}

int main(void)
{
    test_exact();
    test_false_admissions();
    test_options();
    test_reopen();
    return test_summary("test_admit");
}
