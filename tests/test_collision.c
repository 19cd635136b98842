/*
 * test_collision.c - crafted collisions in the PetHash index.
 *
 * With a small index that must not grow (max_load 0.95, few rows), the test
 * searches ids that share one home bucket (and ones that share home AND probe
 * step) through embkv_debug_home/step, overflows buckets on purpose and checks
 * the index exactly:
 *  - a key homes at home(id); when that bucket is full it goes to
 *    home + k*step (mod nbuckets), the first bucket on its path with room;
 *  - overflow(b) = number of keys whose probe path passed over b;
 *  - a lookup reads its path up to the key, or (absent key) up to the first
 *    bucket whose overflow counter is 0;
 *  - deletes take the keys' contributions back out of the counters (a delete
 *    of a row that is durable - written before the last sync - keeps a
 *    tombstone in its slot until the next sync, so the test syncs before it
 *    looks at slots freed by such deletes);
 *  - embkv_hotset moves a displaced key home, into a free slot or by evicting
 *    a displaced victim further down that victim's own path.
 * Besides the scenario-specific numbers, every step recomputes all counters
 * from the positions of all keys (verify_layout) and compares every bucket.
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "check.h"

#include <stdbool.h>

#define DIM 4
#define MAXKEYS 256


static embkv_store *S;
static uint64_t N;           /* buckets: constant for the whole test */
static unsigned SLOTS;

/* The keys in the store (the test knows all of them) and their versions. */
static int64_t keys[MAXKEYS];
static uint32_t kver[MAXKEYS];
static int nkeys;

static void make_vec(int64_t id, uint32_t ver, float *v)
{
    for (int j = 0; j < DIM; j++)
        v[j] = (float)(int32_t)((mix64((uint64_t)id + ver * 131 + (uint64_t)j) >> 41)) / 64.0f;
}

static uint64_t bucket_at(int64_t id, uint64_t k)
{
    return (embkv_debug_home(S, id) + k * embkv_debug_step(S, id)) % N;
}

static uint64_t where(int64_t id)
{
    uint64_t b = UINT64_MAX;
    CHECK_RC(embkv_debug_bucket_of(S, id, &b), EMBKV_OK);
    return b;
}

static void insert(int64_t id)
{
    float v[DIM];
    make_vec(id, 1, v);
    CHECK_RC(embkv_put(S, id, v, NULL, EMBKV_PUT_INSERT), EMBKV_OK);
    keys[nkeys] = id;
    kver[nkeys++] = 1;
    CHECK(embkv_debug_nbuckets(S) == N);
}

static void delete(int64_t id)
{
    CHECK_RC(embkv_delete(S, id), EMBKV_OK);
    for (int i = 0; i < nkeys; i++)
        if (keys[i] == id) { keys[i] = keys[--nkeys]; kver[i] = kver[nkeys]; return; }
    CHECK(!"deleted a key the test did not insert");
}

/* Deterministic candidate ids (mix64 is a bijection, so never repeated). */
static uint64_t cand_counter = 1;
static int64_t next_candidate(void) { return (int64_t)mix64(cand_counter++ * 0x2545F4914F6CDD1Dull); }

/* n fresh ids with home `home` (and step `step` unless step == UINT64_MAX). */
static void find_ids(uint64_t home, uint64_t step, int64_t *out, int n)
{
    for (int got = 0, tries = 0; got < n; tries++) {
        if (tries > 50000000) {
            fprintf(stderr, "no ids with home %" PRIu64 " step %" PRIu64 "\n", home, step);
            CHECK(0);
            exit(test_summary("test_collision"));
        }
        int64_t id = next_candidate();
        if (embkv_debug_home(S, id) != home) continue;
        if (step != UINT64_MAX && embkv_debug_step(S, id) != step) continue;
        out[got++] = id;
    }
}

static int64_t absent_with_home(uint64_t home, uint64_t step)
{
    int64_t id;
    find_ids(home, step, &id, 1);
    return id;
}

/* Buckets an absent id's lookup must read: its path up to and including
 * the first bucket with overflow 0. */
static uint32_t expected_absent_probes(int64_t id)
{
    for (uint64_t k = 0; k < N; k++)
        if (embkv_debug_overflow(S, bucket_at(id, k)) == 0) return (uint32_t)k + 1;
    return (uint32_t)N;
}

/* Recompute every counter from the keys' positions and compare all buckets;
 * check probe lengths, exact values, count and embkv_check. */
static void verify_layout(const char *what)
{
    int before = check_failed;
    uint32_t *ovf = calloc(N, sizeof *ovf), *used = calloc(N, sizeof *used);
    for (int i = 0; i < nkeys; i++) {
        uint64_t b = where(keys[i]), k;
        for (k = 0; k < N && bucket_at(keys[i], k) != b; k++)
            ovf[bucket_at(keys[i], k)]++;
        CHECK(k < N);  /* the key lies on its own probe path */
        used[b]++;
        CHECK(embkv_debug_probes(S, keys[i]) == k + 1);
        float v[DIM], want[DIM];
        make_vec(keys[i], kver[i], want);
        CHECK_RC(embkv_get(S, keys[i], v, NULL, NULL), EMBKV_OK);
        CHECK(memcmp(v, want, sizeof v) == 0);
    }
    for (uint64_t b = 0; b < N; b++) {
        CHECK(embkv_debug_overflow(S, b) == ovf[b]);
        CHECK(embkv_debug_used(S, b) == used[b]);
        CHECK(used[b] <= SLOTS);
    }
    CHECK(embkv_count(S) == (uint64_t)nkeys);
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK(embkv_debug_nbuckets(S) == N);
    free(ovf);
    free(used);
    if (check_failed != before) fprintf(stderr, "  ... in verify_layout(%s)\n", what);
}

static embkv_store *open_small(const char *dir)
{
    embkv_options o = {0};
    o.dim = DIM;
    o.expected_rows = 100;
    o.max_load = 0.95;
    o.pool_size = 16ull << 20;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(dir, &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    if (!s) exit(test_summary("test_collision"));
    return s;
}

/* Scenario 1: ids sharing home H and step St fill H, then H+St, then spill
 * to H+2St; counters, probe lengths and deletes are checked exactly. */
static void scenario_chain(void)
{
    const unsigned M = SLOTS;
    int64_t A[64];
    int64_t first = next_candidate();
    uint64_t H = embkv_debug_home(S, first), St = embkv_debug_step(S, first);
    uint64_t H1 = (H + St) % N, H2 = (H + 2 * St) % N;
    CHECK(H < N && St % N != 0);
    CHECK(H1 != H && H2 != H && H2 != H1);
    find_ids(H, St, A, 2 * M + 2);
    int64_t absent = absent_with_home(H, St);

    /* an empty bucket: an absent key reads exactly one bucket */
    CHECK(embkv_debug_overflow(S, H) == 0);
    CHECK(embkv_debug_probes(S, absent) == 1);

    /* fill the home bucket: everything at home, no overflow yet */
    for (unsigned i = 0; i < M; i++) insert(A[i]);
    for (unsigned i = 0; i < M; i++) CHECK(where(A[i]) == H);
    CHECK(embkv_debug_used(S, H) == M);
    CHECK(embkv_debug_overflow(S, H) == 0);
    CHECK(embkv_debug_probes(S, absent) == 1);
    verify_layout("home full");

    /* one more: displaced to H+St, H counts one overflow */
    insert(A[M]);
    CHECK(where(A[M]) == H1);
    CHECK(embkv_debug_overflow(S, H) == 1);
    CHECK(embkv_debug_overflow(S, H1) == 0);
    CHECK(embkv_debug_probes(S, A[M]) == 2);
    CHECK(embkv_debug_probes(S, A[0]) == 1);
    CHECK(embkv_debug_probes(S, absent) == 2);

    /* fill H+St, then spill the last one to H+2St */
    for (unsigned i = M + 1; i < 2 * M; i++) insert(A[i]);
    for (unsigned i = M; i < 2 * M; i++) CHECK(where(A[i]) == H1);
    CHECK(embkv_debug_overflow(S, H) == M);
    CHECK(embkv_debug_overflow(S, H1) == 0);
    insert(A[2 * M]);
    CHECK(where(A[2 * M]) == H2);
    CHECK(embkv_debug_overflow(S, H) == M + 1);
    CHECK(embkv_debug_overflow(S, H1) == 1);
    CHECK(embkv_debug_overflow(S, H2) == 0);
    CHECK(embkv_debug_probes(S, A[2 * M]) == 3);
    CHECK(embkv_debug_probes(S, A[M + 3]) == 2);
    CHECK(embkv_debug_probes(S, absent) == 3);
    /* an absent id with the same home but another step leaves the shared
     * path after H; it reads to the first zero-overflow bucket of its path */
    for (int t = 0; t < 10000000; t++) {
        int64_t other = next_candidate();
        if (embkv_debug_home(S, other) != H || embkv_debug_step(S, other) == St) continue;
        CHECK(embkv_debug_probes(S, other) == expected_absent_probes(other));
        CHECK(embkv_debug_probes(S, other) >= 2);
        break;
    }
    /* a lookup of an absent id whose home has overflow 0 reads one bucket */
    for (int t = 0; t < 100; t++) {
        int64_t id = next_candidate();
        uint64_t h = embkv_debug_home(S, id);
        if (embkv_debug_overflow(S, h) == 0) {
            CHECK(embkv_debug_probes(S, id) == 1);
            CHECK(embkv_exists(S, id) == 0);
        }
    }
    CHECK(embkv_exists(S, absent) == 0);
    CHECK_RC(embkv_get(S, absent, NULL, NULL, NULL), EMBKV_NOTFOUND);
    verify_layout("chain of three");

    /* persisted: the same layout after close + reopen */
    const char *path = strdup(embkv_path(S));
    CHECK_RC(embkv_close(S), EMBKV_OK);
    S = open_small(path);
    free((void *)path);
    CHECK(embkv_debug_nbuckets(S) == N);
    CHECK(where(A[2 * M]) == H2 && where(A[M]) == H1 && where(A[0]) == H);
    verify_layout("after reopen");

    /* deletes: the key in H+2St takes one count off H and H+St.  These rows
     * are durable (the close synced), so their slots hold tombstones until
     * the next sync, which is when the counters must come down. */
    delete(A[2 * M]);
    CHECK(embkv_exists(S, A[2 * M]) == 0);
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    CHECK(embkv_debug_overflow(S, H) == M);
    CHECK(embkv_debug_overflow(S, H1) == 0);
    CHECK(embkv_debug_probes(S, absent) == 2);
    CHECK_RC(embkv_delete(S, A[2 * M]), EMBKV_NOTFOUND);  /* already gone */
    /* keys in H+St each take one count off H, down to 0 */
    for (unsigned i = M; i < 2 * M; i++) {
        delete(A[i]);
        CHECK_RC(embkv_sync(S), EMBKV_OK);
        CHECK(embkv_debug_overflow(S, H) == 2 * M - 1 - i);
    }
    CHECK(embkv_debug_overflow(S, H) == 0);
    CHECK(embkv_debug_used(S, H1) == 0 && embkv_debug_used(S, H2) == 0);
    CHECK(embkv_debug_probes(S, absent) == 1);
    verify_layout("after deletes");

    /* deleting a home resident changes no counter, and the next key with
     * that home takes the freed slot at home */
    insert(A[M]);
    CHECK(where(A[M]) == H1 && embkv_debug_overflow(S, H) == 1);
    delete(A[2]);
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    CHECK(embkv_debug_overflow(S, H) == 1);
    CHECK(embkv_debug_probes(S, A[M]) == 2);  /* still behind the full-once home */
    insert(A[M + 1]);
    CHECK(where(A[M + 1]) == H);
    CHECK(embkv_debug_overflow(S, H) == 1);
    verify_layout("refill home");

    /* hotset with a free slot at home: free one, move A[M] home */
    delete(A[3]);
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    size_t moved = 99;
    CHECK_RC(embkv_hotset(S, &A[M], 1, &moved), EMBKV_OK);
    CHECK(moved == 1);
    CHECK(where(A[M]) == H);
    CHECK(embkv_debug_overflow(S, H) == 0);
    CHECK(embkv_debug_used(S, H) == M && embkv_debug_used(S, H1) == 0);
    CHECK(embkv_debug_probes(S, A[M]) == 1);
    CHECK(embkv_debug_probes(S, absent) == 1);
    verify_layout("hotset into free slot");

    /* hotset of a key already at home moves nothing */
    moved = 99;
    CHECK_RC(embkv_hotset(S, &A[0], 1, &moved), EMBKV_OK);
    CHECK(moved == 0);
    CHECK(where(A[0]) == H);

    /* home full of home residents only: nothing may be evicted (victims must
     * be displaced keys), so a displaced key stays where it is */
    insert(A[M + 2]);
    CHECK(where(A[M + 2]) == H1);
    uint64_t pos[MAXKEYS];
    for (int i = 0; i < nkeys; i++) pos[i] = where(keys[i]);
    moved = 99;
    CHECK_RC(embkv_hotset(S, &A[M + 2], 1, &moved), EMBKV_OK);
    CHECK(moved == 0);
    for (int i = 0; i < nkeys; i++) CHECK(where(keys[i]) == pos[i]);
    verify_layout("hotset, no victim");

    while (nkeys) delete(keys[0]);
    CHECK_RC(embkv_sync(S), EMBKV_OK);
    CHECK(embkv_debug_overflow(S, H) == 0);
    verify_layout("empty again");
}

/* Scenario 2: bucket B = G + Sg holds keys displaced from G; a key whose home
 * is B is displaced beyond B; hotset moves it home by evicting one of the
 * G-keys further down the G-keys' path. */
static void scenario_evict(void)
{
    const unsigned M = SLOTS;
    int64_t a = next_candidate();
    uint64_t G = embkv_debug_home(S, a), Sg = embkv_debug_step(S, a);
    uint64_t B = (G + Sg) % N;
    CHECK(B != G);
    int64_t Gk[32], Bk[32];
    find_ids(G, Sg, Gk, M + 4);
    /* B-home keys with a step that does not lead back into G or into G's
     * next bucket, so the displaced one lands exactly at B + Sb */
    int64_t b0;
    uint64_t Sb;
    do {
        b0 = absent_with_home(B, UINT64_MAX);
        Sb = embkv_debug_step(S, b0);
    } while ((B + Sb) % N == G || (B + Sb) % N == (G + 2 * Sg) % N);
    Bk[0] = b0;
    find_ids(B, Sb, Bk + 1, M);

    for (unsigned i = 0; i < M; i++) insert(Gk[i]);
    for (unsigned i = M; i < M + 4; i++) {   /* 4 keys displaced from G into B */
        insert(Gk[i]);
        CHECK(where(Gk[i]) == B);
    }
    CHECK(embkv_debug_overflow(S, G) == 4);
    for (unsigned i = 0; i < M - 4; i++) {   /* B's own keys fill it */
        insert(Bk[i]);
        CHECK(where(Bk[i]) == B);
    }
    CHECK(embkv_debug_used(S, B) == M);
    CHECK(embkv_debug_overflow(S, B) == 0);
    int64_t y = Bk[M - 4];
    insert(y);                               /* displaced: B is full */
    uint64_t B1 = (B + Sb) % N;
    CHECK(where(y) == B1);
    CHECK(embkv_debug_overflow(S, B) == 1);
    CHECK(embkv_debug_probes(S, y) == 2);
    verify_layout("before eviction");

    size_t moved = 99;
    CHECK_RC(embkv_hotset(S, &y, 1, &moved), EMBKV_OK);
    CHECK(moved == 1);
    CHECK(where(y) == B);
    CHECK(embkv_debug_probes(S, y) == 1);
    CHECK(embkv_debug_used(S, B) == M);
    /* exactly one G-key left B, further down its own path; B's own keys and
     * G's home residents stayed */
    int evicted = 0;
    for (unsigned i = M; i < M + 4; i++) {
        uint64_t w = where(Gk[i]);
        if (w == B) continue;
        evicted++;
        uint64_t k;
        for (k = 0; k < N && bucket_at(Gk[i], k) != w; k++) {}
        CHECK(k >= 2 && k < N);
    }
    CHECK(evicted == 1);
    for (unsigned i = 0; i < M; i++) CHECK(where(Gk[i]) == G);
    for (unsigned i = 0; i < M - 4; i++) CHECK(where(Bk[i]) == B);
    /* G's counter is unchanged (the victim still passes over G); B's lost y
     * and gained the victim */
    CHECK(embkv_debug_overflow(S, G) == 4);
    CHECK(embkv_debug_overflow(S, B) == 1);
    verify_layout("after eviction");

    /* values still exact after an update of the moved key and the victim */
    for (int i = 0; i < nkeys; i++) {
        if (keys[i] != y && where(keys[i]) == B) continue;
        float v[DIM];
        make_vec(keys[i], ++kver[i], v);
        CHECK_RC(embkv_put(S, keys[i], v, NULL, EMBKV_PUT_UPDATE), EMBKV_OK);
    }
    verify_layout("after updating moved keys");

    const char *path = strdup(embkv_path(S));
    CHECK_RC(embkv_close(S), EMBKV_OK);
    S = open_small(path);
    free((void *)path);
    verify_layout("eviction after reopen");
}

int main(void)
{
    SLOTS = embkv_debug_slots_per_bucket();
    CHECK(SLOTS == 14);
    S = open_small(test_tmpdir("collision"));
    N = embkv_debug_nbuckets(S);
    printf("test_collision: %" PRIu64 " buckets of %u slots\n", N, SLOTS);
    CHECK(N >= 8 && (N & (N - 1)) == 0);
    /* with 0.95 load, all keys of this test fit without doubling */
    CHECK(0.95 * (double)N * SLOTS > 3 * SLOTS + 8);
    if (N < 8) return test_summary("test_collision");

    /* home and step are functions of the id alone (for a fixed size) */
    for (int i = 0; i < 1000; i++) {
        int64_t id = next_candidate();
        CHECK(embkv_debug_home(S, id) < N);
        CHECK(embkv_debug_home(S, id) == embkv_debug_home(S, id));
        uint64_t st = embkv_debug_step(S, id);
        CHECK(st % N != 0);
        CHECK(st % 2 == 1 || N == 1);  /* odd: the path visits every bucket */
    }

    scenario_chain();
    scenario_evict();
    CHECK(embkv_debug_nbuckets(S) == N);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    return test_summary("test_collision");
}
