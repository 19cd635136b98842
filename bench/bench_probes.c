/*
 * bench_probes.c - probe lengths of embkv's PetHash-style index at load
 * factors 0.5, 0.8 and 0.9.
 *
 *   bench_probes DIR [--buckets-log2 K] [--absent N] [--dim D]
 *
 * Creates a store in DIR (absent or empty; removed at the end) whose index
 * has about 2^K buckets (default K = 17) and max_load 0.95, so that it never
 * grows while it is filled (checked: embkv_debug_nbuckets stays the same).
 * Random ids are inserted until rows = L * buckets * slots_per_bucket for
 * each L; then for successful lookups (every present id) and unsuccessful
 * ones (N random absent ids, default 100,000) it reports the mean and maximum
 * number of buckets read and the fraction of lookups reading 1, 2, 3 and more
 * buckets, the share of buckets whose overflow counter is set, and the time
 * of a point embkv_get / embkv_exists.
 */
#include "embkv.h"
#include "embkv_debug.h"
#include "bench_common.h"

#define MAX_LEVELS 3
static const double levels[MAX_LEVELS] = {0.5, 0.8, 0.9};

typedef struct probe_hist {
    uint64_t n, sum, c1, c2, c3, more;
    uint32_t max;
} probe_hist;

static void hist_add(probe_hist *h, uint32_t p)
{
    h->n++;
    h->sum += p;
    if (p > h->max) h->max = p;
    if (p <= 1) h->c1++;
    else if (p == 2) h->c2++;
    else if (p == 3) h->c3++;
    else h->more++;
}

static void hist_print(const char *what, const probe_hist *h)
{
    double n = h->n ? (double)h->n : 1.0;
    printf("    %-12s %9" PRIu64 " lookups: mean %.4f  max %2u  | 1: %6.2f%%  2: %6.2f%%  3: %6.3f%%  >3: %6.3f%%\n",
           what, h->n, (double)h->sum / n, h->max, 100.0 * (double)h->c1 / n, 100.0 * (double)h->c2 / n,
           100.0 * (double)h->c3 / n, 100.0 * (double)h->more / n);
}

static void ck(int rc, const char *what)
{
    if (rc != EMBKV_OK) die("%s failed (rc %d): %s", what, rc, embkv_errmsg());
}

static void usage(void)
{
    fprintf(stderr, "usage: bench_probes DIR [--buckets-log2 K] [--absent N] [--dim D]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *dir = NULL;
    size_t log2b = 17, nabsent = 100000, dim = 4;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-') { if (dir) usage(); dir = a; continue; }
        if (i + 1 >= argc) usage();
        const char *v = argv[++i];
        if (!strcmp(a, "--buckets-log2")) log2b = parse_size(a, v);
        else if (!strcmp(a, "--absent")) nabsent = parse_size(a, v);
        else if (!strcmp(a, "--dim")) dim = parse_size(a, v);
        else usage();
    }
    if (!dir || log2b < 4 || log2b > 26 || dim < 1 || dim > EMBKV_MAX_DIM) usage();
    if (!dir_absent_or_empty(dir)) die("%s exists and is not empty; give a fresh directory", dir);

    const unsigned slots = embkv_debug_slots_per_bucket();
    const uint64_t want = (uint64_t)1 << log2b;
    const double max_load = 0.95;
    printf("== bench_probes: target %" PRIu64 " buckets x %u slots, max_load %.2f, dim %zu\n",
           want, slots, max_load, dim);

    /* Find expected_rows giving about `want` buckets: start at 0.9 of its
     * capacity and rescale by what the engine chose. */
    embkv_store *s = NULL;
    double exp_rows = 0.9 * (double)want * slots;
    uint64_t nb = 0;
    for (int attempt = 0; attempt < 6; attempt++) {
        uint64_t max_rows = (uint64_t)(levels[MAX_LEVELS - 1] * 2.0 * (double)want * slots);
        embkv_options opt = {.dim = (uint32_t)dim, .expected_rows = (uint64_t)exp_rows,
                             .max_load = max_load,
                             .pool_size = max_rows * (64 + dim * 4) * 2 + ((uint64_t)64 << 20)};
        ck(embkv_open(dir, &opt, EMBKV_OPEN_CREATE, &s), "embkv_open");
        nb = embkv_debug_nbuckets(s);
        if (nb * 3 >= want * 2 && nb * 2 <= want * 3) break;
        ck(embkv_close(s), "embkv_close");
        s = NULL;
        rm_rf(dir);
        exp_rows *= (double)want / (double)nb;
    }
    if (!s) die("could not get an index of about %" PRIu64 " buckets (last: %" PRIu64 ")", want, nb);
    printf("  expected_rows %.0f -> %" PRIu64 " buckets (%" PRIu64 " slots)\n", exp_rows, nb, nb * slots);

    const uint64_t cap = nb * slots;
    const size_t max_rows = (size_t)(levels[MAX_LEVELS - 1] * (double)cap) + 1;
    int64_t *ids = xmalloc(max_rows * sizeof *ids);
    float *vec = xmalloc(dim * sizeof *vec);
    rng r, ra;
    rng_seed(&r, BENCH_SEED ^ 0x70726F6265ull);
    rng_seed(&ra, BENCH_SEED ^ 0x616273656E74ull);
    size_t n = 0;
    double tput = 0;

    for (int li = 0; li < MAX_LEVELS; li++) {
        size_t target = (size_t)(levels[li] * (double)cap);
        double t0 = now_s();
        while (n < target) {
            int64_t id = rng_id63(&r);
            for (size_t k = 0; k < dim; k++) vec[k] = rng_float(&r);
            int rc = embkv_put(s, id, vec, NULL, EMBKV_PUT_INSERT);
            if (rc == EMBKV_EXISTS) continue;  /* a repeated random id */
            ck(rc, "embkv_put");
            ids[n++] = id;
        }
        tput += now_s() - t0;
        uint64_t nb_now = embkv_debug_nbuckets(s);
        embkv_stats st;
        ck(embkv_stats_get(s, &st), "embkv_stats_get");
        printf("\n-- load %.2f: %zu rows, load factor %.4f, buckets %" PRIu64 "%s\n", levels[li], n,
               st.load_factor, nb_now, nb_now == nb ? " (unchanged)" : " (INDEX GREW: figures not at this load)");
        if (nb_now != nb) break;

        double pmean = 0;
        uint32_t pmax = 0;
        ck(embkv_probe_stats(s, &pmean, &pmax), "embkv_probe_stats");
        printf("    embkv_probe_stats: successful mean %.4f, max %u\n", pmean, pmax);

        probe_hist hs = {0}, ha = {0};
        for (size_t i = 0; i < n; i++) hist_add(&hs, embkv_debug_probes(s, ids[i]));
        for (size_t i = 0; i < nabsent; i++) {
            int64_t id;
            do id = rng_id63(&ra); while (embkv_exists(s, id));
            hist_add(&ha, embkv_debug_probes(s, id));
        }
        hist_print("successful", &hs);
        hist_print("unsuccessful", &ha);

        uint64_t ovf = 0, full = 0;
        for (uint64_t b = 0; b < nb; b++) {
            if (embkv_debug_overflow(s, b)) ovf++;
            if (embkv_debug_used(s, b) == slots) full++;
        }
        printf("    buckets: %.2f%% full, %.2f%% with overflow counter set\n",
               100.0 * (double)full / (double)nb, 100.0 * (double)ovf / (double)nb);

        /* Point-lookup latency, hits in insertion order and random misses. */
        size_t m = n < 200000 ? n : 200000;
        double t1 = now_s();
        for (size_t i = 0; i < m; i++) ck(embkv_get(s, ids[(i * 7919) % n], vec, NULL, NULL), "embkv_get");
        double t2 = now_s();
        size_t found = 0;
        for (size_t i = 0; i < m; i++) found += (size_t)embkv_exists(s, rng_id63(&ra));
        double t3 = now_s();
        printf("    embkv_get hit %.0f ns, embkv_exists miss %.0f ns (%zu lookups each%s)\n",
               (t2 - t1) / (double)m * 1e9, (t3 - t2) / (double)m * 1e9, m,
               found ? ", some random ids present" : "");
    }
    printf("\n  embkv_put: %.2f M rows/s over %zu inserts\n", (double)n / tput / 1e6, n);
    printf("  (PetPS reports about 1.05 buckets per successful lookup at load 0.8)\n");

    ck(embkv_close(s), "embkv_close");
    rm_rf(dir);
    free(ids);
    free(vec);
    return 0;
}
