/*
 * readonly.c - a store opened read-only beside another process's writer
 * (EMBKV_OPEN_READONLY): what it loads, and its reads.
 *
 * Such a handle maps the pool read-only and takes no lock: the writer may
 * be writing, resizing, demoting, compacting and checkpointing
 * meanwhile, or be gone (killed, or never there).  It has no DRAM cache,
 * no access statistics, no thread.  Its reads run inside a slot of the
 * reader table (readers.c), which keeps every record, index array and
 * log segment they may reach from being reused (R1), and they return each
 * row as of the durable epoch D, the last checkpoint, when the read (or
 * the snapshot it reads through) began: from the record the index names,
 * `prev` is followed back to the version of epoch D or before (P2 keeps
 * that version linked, R1 keeps it unreused).  So a reader never sees a
 * write group in part, nor rows newer than a checkpoint.  A row deleted
 * since is found through its tombstone's entry, which the writer keeps
 * while a reader is in an epoch older than the tombstone's sync (sync.c).
 * Everything read is copied
 * out and checked (id, checksum) before rd_valid says the slot was not
 * revoked under it (R2, R3); only then is it returned.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"

#define RO_HOPS (1 << 20)  /* versions followed back: each strictly older (a damaged chain ends early) */

int ro_enter(embkv_store *s) { return ix_reader_enter(s); }

void ro_leave(embkv_store *s) { rd_leave(s); }

int ro_load(embkv_store *s)
{
    store_root *r = s->root;
    /* (never counted in: heat_live stays 0; the statistics read it) */
    uint64_t expect = s->pool_size / s->rec_size;
    if (!(s->heat = heat_new(expect < 1024 ? 1024 : expect)))
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
    int rc = readers_attach_reader(s);
    if (rc == EMBKV_OK)
        rc = ix_reader_open(s);
    if (rc != EMBKV_OK)
        return rc;
    if (r->ssd_size) {
        char dir[PATH_MAX + 8];
        size_t plen = strnlen(r->ssd_path, SSD_PATH_MAX);
        if (plen == SSD_PATH_MAX)
            return embkv__err(EMBKV_CORRUPT, "store %s: the root's ssd_path is damaged", s->path);
        if (plen)
            snprintf(dir, sizeof dir, "%s", r->ssd_path);
        else
            snprintf(dir, sizeof dir, "%s/%s", s->path, LOG_DIR);
        char what[PATH_MAX + 64];
        snprintf(what, sizeof what, "store %s: ssd_path %s", s->path, dir);
        log_options lo = {.dir = dir, .what = what, .record_bytes = s->rec_size, .tag = r->log_tag,
                          .readonly = true, .no_uring = true};
        if ((rc = log_open(&lo, &s->log)) != EMBKV_OK)
            return rc;
    }
    ro_count_update(s);
    return EMBKV_OK;
}

void ro_free(embkv_store *s) { ix_reader_free(s); }


void ro_count_update(embkv_store *s)
{
    /* Epoch, count and check are written apart by the writer's sync: a
     * count read between them fails the check, and the last one stays. */
    store_root *r = s->root;
    uint64_t e = __atomic_load_n(&r->durable_epoch, __ATOMIC_ACQUIRE);
    uint64_t rows = __atomic_load_n(&r->durable_rows, __ATOMIC_RELAXED);
    uint64_t check = __atomic_load_n(&r->durable_rows_check, __ATOMIC_RELAXED);
    if (check == durable_rows_check(rows, e))
        atomic_store(&s->rows, rows);
}

uint64_t ro_as_of(embkv_store *s)
{
    return __atomic_load_n(&s->root->durable_epoch, __ATOMIC_ACQUIRE);
}

/* A version older than the one it was reached from is not: the records
 * are damaged, or (the slot revoked) reused under the read. */
static int chain_broken(embkv_store *s, int64_t id)
{
    if (!rd_valid(s))
        return rd_invalid(s);
    return embkv__err(EMBKV_CORRUPT, "store %s: id %lld: its versions since the checkpoint do not lead back to it "
                      "(a damaged record)", s->path, (long long)id);
}

/* A version of id just copied to h, from tier `where`: checked (id and
 * checksum, and older than the one it was reached from, *newer); when it
 * is of epoch d or before it is the row as of d (*st, *tier), else *more
 * and *loc is the version it replaced. */
static int settle(embkv_store *s, uint64_t d, int64_t id, const rec_hdr *h, uint8_t where, uint32_t *newer,
                  uint8_t *st, uint8_t *tier, uint64_t *loc, bool *more)
{
    if (!rec_ok(s, h, id))
        return rd_valid(s) ? rec_damaged(s, id) : rd_invalid(s);
    if (rec_epoch(h) >= *newer)
        return chain_broken(s, id);
    *newer = rec_epoch(h);
    *more = rec_epoch(h) > d;
    if (*more) {
        *loc = h->prev;
    } else {
        *st = !(h->epoch & REC_TOMB);
        if (tier)
            *tier = where;
    }
    return EMBKV_OK;
}

/* Each id's version as of epoch d, copied into recs (rec_size bytes each):
 * st[i] 1 found, 0 absent.  Inside ro_enter. */
static int ro_versions(embkv_store *s, uint64_t d, const int64_t *ids, size_t n, char *recs, uint8_t *st,
                       uint8_t *tier)
{
    index_desc *ix = atomic_load(&s->ix);
    uint64_t *loc = malloc(n * sizeof *loc);
    size_t *todo = malloc(n * sizeof *todo);
    uint64_t *ssd = malloc(n * sizeof *ssd);
    uint8_t *queued = malloc(n);  /* todo[k] waits for this round's log read */
    uint32_t *newer = malloc(n * sizeof *newer); /* the epoch of the version followed back from */
    int rc = EMBKV_OK;
    if (!loc || !todo || !ssd || !queued || !newer) {
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory reading %zu rows", s->path, n);
        goto out;
    }
    size_t nt = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t probes;
        loc[i] = ix_lookup(ix, ids[i], embkv__hash(ids[i]), &probes);
        st[i] = 0;
        newer[i] = UINT32_MAX;
        todo[nt++] = i;
    }
    for (int hop = 0; hop < RO_HOPS && nt > 0 && rc == EMBKV_OK; hop++) {
        /* Pool versions now; the log's in one read a round. */
        size_t ns = 0, keep = 0;
        for (size_t k = 0; k < nt && rc == EMBKV_OK; k++) {
            size_t i = todo[k];
            uint64_t l = loc_plain(loc[i]);
            if (l == LOC_NONE)
                continue;
            if (l & LOC_SSD) {
                if (!s->log) {
                    rc = embkv__err(EMBKV_CORRUPT, "store %s: id %lld: the index names the SSD log, and the store "
                                    "has none", s->path, (long long)ids[i]);
                    break;
                }
                ssd[ns] = l;
                queued[keep] = 1;
                todo[keep++] = i;
                ns++;
                continue;
            }
            /* (a location no chunk of the pool holds: a damaged index) */
            if (!ix_reader_loc_mapped(s, l)) {
                rc = rd_valid(s) ? rec_damaged(s, ids[i]) : rd_invalid(s);
                break;
            }
            char *dst = recs + i * (size_t)s->rec_size;
            memcpy(dst, rec_at(s, l), s->rec_size);
            bool more = false;
            rc = settle(s, d, ids[i], (const rec_hdr *)dst, EMBKV_TIER_PM, &newer[i], &st[i], tier ? &tier[i] : NULL,
                        &loc[i], &more);
            if (rc == EMBKV_OK && more) {
                queued[keep] = 0;
                todo[keep++] = i;
            }
        }
        if (rc != EMBKV_OK || ns == 0) {
            nt = rc == EMBKV_OK ? keep : 0;
            continue;
        }
        /* The log's rows of this round are at the front of todo, in order. */
        char *buf = malloc(ns * (size_t)s->rec_size);
        if (!buf) {
            rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory reading %zu rows", s->path, ns);
            break;
        }
        size_t bad = 0;
        rc = log_read(s->log, ssd, ns, buf, &bad);
        if (rc != EMBKV_OK && !rd_valid(s))
            rc = rd_invalid(s);
        size_t keep2 = 0, j = 0;
        for (size_t k = 0; k < keep && rc == EMBKV_OK; k++) {
            size_t i = todo[k];
            if (!queued[k]) {
                todo[keep2++] = i;
                continue;
            }
            char *dst = recs + i * (size_t)s->rec_size;
            memcpy(dst, buf + j++ * (size_t)s->rec_size, s->rec_size);
            bool more = false;
            rc = settle(s, d, ids[i], (const rec_hdr *)dst, EMBKV_TIER_SSD, &newer[i], &st[i],
                        tier ? &tier[i] : NULL, &loc[i], &more);
            if (rc == EMBKV_OK && more)
                todo[keep2++] = i;
        }
        free(buf);
        nt = rc == EMBKV_OK ? keep2 : 0;
    }
    if (rc == EMBKV_OK && nt > 0)
        rc = chain_broken(s, ids[todo[0]]);
    /* R2, R3: what was copied counts only if the slot held throughout. */
    if (rc == EMBKV_OK && !rd_valid(s))
        rc = rd_invalid(s);
out:
    free(loc);
    free(todo);
    free(ssd);
    free(queued);
    free(newer);
    return rc;
}

int ro_read(embkv_store *s, uint64_t d, const int64_t *ids, size_t n, float *out, float *state,
            embkv_rowinfo *info, uint8_t *found, size_t *nmissing, int *tiers)
{
    if (nmissing)
        *nmissing = 0;
    if (n == 0)
        return EMBKV_OK;
    int rc = ro_enter(s);
    if (rc != EMBKV_OK)
        return rc;
    if (d == 0)
        d = ro_as_of(s);
    char *recs = malloc(n * (size_t)s->rec_size);
    uint8_t *st = malloc(n), *tier = malloc(n);
    if (!recs || !st || !tier) {
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory reading %zu rows", s->path, n);
        goto out;
    }
    rc = ro_versions(s, d, ids, n, recs, st, tier);
    for (size_t i = 0; i < n && rc == EMBKV_OK; i++) {
        rec_hdr *h = (rec_hdr *)(recs + i * (size_t)s->rec_size);
        if (found)
            found[i] = st[i];
        if (tiers)
            tiers[i] = st[i] ? tier[i] : -1;
        if (!st[i]) {
            if (nmissing)
                (*nmissing)++;
            if (out)
                memset(out + i * (size_t)s->dim, 0, 4 * (size_t)s->dim);
            if (state)
                memset(state + i * (size_t)s->state_floats, 0, 4 * (size_t)s->state_floats);
            if (info)
                memset(&info[i], 0, sizeof info[i]);
            continue;
        }
        if (out && !rec_vec_get(s, h, out + i * (size_t)s->dim)) {
            rc = rec_damaged(s, ids[i]);
            break;
        }
        if (state)
            memcpy(state + i * (size_t)s->state_floats, rec_state(s, h), 4 * (size_t)s->state_floats);
        if (info) {
            info[i].clock = h->clock;
            info[i].epoch = rec_epoch(h);
            info[i].tier = tier[i];
        }
    }
out:
    ro_leave(s);
    free(recs);
    free(st);
    free(tier);
    return rc;
}

int ro_scan_ids(embkv_store *s, uint64_t *pos, int64_t *ids, size_t cap, size_t *n)
{
    *n = 0;
    int rc = ro_enter(s);
    if (rc != EMBKV_OK)
        return rc;
    index_desc *ix = atomic_load(&s->ix);
    uint64_t b = *pos & ((1ull << 40) - 1), gen = *pos >> 40;
    if (*pos == 0)
        gen = ix->generation & 0xffffff;
    if (b > ix->nbuckets) {
        ro_leave(s);
        return embkv__err(EMBKV_INVALID, "embkv_scan_ids: store %s: position %llu is not one embkv_scan_ids gave: "
                          "start a scan at 0, and pass back the position each call returns", s->path,
                          (unsigned long long)*pos);
    }
    if (gen != (ix->generation & 0xffffff)) {
        ro_leave(s);
        return embkv__err(EMBKV_BUSY, "store %s: the index was resized during the scan", s->path);
    }
    uint64_t locs[BUCKET_SLOTS];
    while (b < ix->nbuckets && *n + BUCKET_SLOTS <= cap)
        *n += ix_bucket_rows(&ix->buckets[b++], ids + *n, locs, true);
    if (!rd_valid(s))
        rc = rd_invalid(s);
    ro_leave(s);
    *pos = (gen << 40) | b;
    return rc;
}

int ro_scan(embkv_store *s, embkv_scan_fn fn, void *ctx)
{
    int rc = ro_enter(s);
    if (rc != EMBKV_OK)
        return rc;
    rd_pin(s);
    uint64_t d = ro_as_of(s);  /* (one epoch for the whole scan) */
    size_t rowf = (size_t)s->dim + s->state_floats;
    float *buf = malloc(BUCKET_SLOTS * 64 * rowf * sizeof(float));
    int64_t *ids = malloc(BUCKET_SLOTS * 64 * sizeof *ids);
    embkv_rowinfo *info = malloc(BUCKET_SLOTS * 64 * sizeof *info);
    uint8_t *found = malloc(BUCKET_SLOTS * 64);
    if (!buf || !ids || !info || !found)
        rc = embkv__err(EMBKV_NOMEM, "embkv_scan: out of memory");
    uint64_t pos = 0;
    while (rc == EMBKV_OK) {
        size_t n = 0;
        rc = ro_scan_ids(s, &pos, ids, BUCKET_SLOTS * 64, &n);
        if (rc != EMBKV_OK || n == 0)
            break;
        float *vec = buf, *st = buf + n * (size_t)s->dim;
        rc = ro_read(s, d, ids, n, vec, st, info, found, NULL, NULL);
        for (size_t i = 0; i < n && rc == EMBKV_OK; i++)
            if (found[i])
                rc = fn(ctx, ids[i], vec + i * (size_t)s->dim, st + i * (size_t)s->state_floats, &info[i]);
    }
    (void)rd_unpin(s);
    ro_leave(s);
    free(buf);
    free(ids);
    free(info);
    free(found);
    return rc;
}
