/*
 * cursor.c - how an embkv table is read: the plans (xBestIndex) and
 * the cursor.
 *
 * Plans, shown by EXPLAIN QUERY PLAN as INDEX <n>:<name>:
 *   1 point      id = ?: unique point lookup
 *   2 in-batch   id IN (...), IN (SELECT ...): the whole list through
 *                sqlite3_vtab_in, served by one embkv_get_batch
 *   3 fullscan   anything else: every id from embkv_scan_ids, vectors
 *                fetched 256 rows per embkv_get_batch
 * A name ending in " ids-only" means the query does not use vec (colUsed):
 * the cursor then never reads a vector (count(*), SELECT id, EXISTS).
 *
 * A cursor works on a list of candidate ids, loaded a chunk at a time (the
 * whole list for point and IN plans): rows the connection's open transaction
 * wrote or deleted come from its buffer (txn.c), the others from one
 * embkv_get_batch_at per chunk, copied into the cursor so that what a row
 * returns does not change under it.
 *
 * Snapshot reads: a cursor opens an engine snapshot at its first xFilter and
 * keeps it until xClose, so everything one statement reads through it (all
 * the point lookups of a join included) is the store as of that moment:
 * each COMMIT and each push entirely or not at all, and every column of a
 * row from one version.  A full scan adds the rows deleted since the
 * snapshot (embkv_snapshot_changed_ids) to the ids the index still has.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <stdlib.h>
#include <string.h>

#define SCAN_CHUNK 256   /* rows per embkv_get_batch in a full scan */
#define SCAN_IDS 4096    /* ids per embkv_scan_ids call */

/* Reads a row's vector as this connection sees it (its own writes, then
 * the store as of snap, or now when snap is NULL): 1 found, 0 absent, -1
 * error (message set). */
static int read_row_at(ekvtab *v, embkv_snapshot *snap, int64_t id, float *out)
{
    const ektxn_entry *e = ektxn_find(v->txn, id);
    if (e) {
        if (e->kind != EKTXN_PUT) return 0;
        memcpy(out, e->vec, (size_t)v->dim * 4);
        return 1;
    }
    uint8_t found = 0;
    int erc = embkv_get_batch_at(v->store, snap, &id, 1, out, NULL, &found, NULL);
    if (erc == EMBKV_OK) return found;
    ekerr_table(v, "id %lld: read failed: %s", (long long)id, embkv_errmsg());
    return -1;
}

int read_row(ekvtab *v, int64_t id, float *out)
{
    return read_row_at(v, NULL, id, out);
}

/* ------------------------------------------------------------------------
 * xBestIndex
 */
/* [plan][what is read]: 0 nothing but where each row is (neither vec nor
 * clock used: a row in the SSD log is not read), 1 the record's metadata
 * (clock), 2 the vector too. */
static const char *const plan_name[4][3] = {
    {"", "", ""},
    {"point ids-only", "point no-vec", "point"},
    {"in-batch ids-only", "in-batch no-vec", "in-batch"},
    {"fullscan ids-only", "fullscan no-vec", "fullscan"},
};

int vt_best_index(sqlite3_vtab *pv, sqlite3_index_info *info)
{
    ekvtab *v = (ekvtab *)pv;
    /* A broken table plans a scan that vt_filter refuses: an error at
     * xBestIndex is SQLITE_ERROR whatever it returns (SQLite prepares
     * the statement then), while vt_filter's code reaches sqlite3_step. */
    if (!v->store) {
        info->estimatedCost = 1e12;
        return SQLITE_OK;
    }
    int eq = -1, in = -1;
    for (int i = 0; i < info->nConstraint; i++) {
        const struct sqlite3_index_constraint *k = &info->aConstraint[i];
        if (!k->usable || k->op != SQLITE_INDEX_CONSTRAINT_EQ) continue;
        if (k->iColumn != COL_ID && k->iColumn != -1) continue;
        if (sqlite3_vtab_in(info, i, -1)) {
            if (in < 0) in = i;
        } else if (eq < 0) {
            eq = i;
        }
    }
    int want = (info->colUsed & ((sqlite3_uint64)1 << COL_VEC)) ? 2
               : (info->colUsed & ((sqlite3_uint64)1 << COL_CLOCK)) ? 1 : 0;
    double rows = (double)embkv_count(v->store);
    int plan;
    if (eq >= 0) {
        plan = PLAN_POINT;
        info->aConstraintUsage[eq].argvIndex = 1;
        info->aConstraintUsage[eq].omit = 1;
        info->idxFlags |= SQLITE_INDEX_SCAN_UNIQUE;
        info->estimatedRows = 1;
        info->estimatedCost = 1;
    } else if (in >= 0) {
        plan = PLAN_IN;
        sqlite3_vtab_in(info, in, 1);
        info->aConstraintUsage[in].argvIndex = 1;
        info->aConstraintUsage[in].omit = 1;
        double n = rows < 32 ? rows : 32; /* the list's length is unknown here */
        info->estimatedRows = (sqlite3_int64)(n < 1 ? 1 : n);
        info->estimatedCost = 5 + n;
    } else {
        plan = PLAN_SCAN;
        info->estimatedRows = (sqlite3_int64)(rows < 1 ? 1 : rows);
        info->estimatedCost = 10 + 2 * rows;
    }
    info->idxNum = plan;
    info->idxStr = (char *)plan_name[plan][want];
    info->needToFreeIdxStr = 0;
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * Cursors
 */
typedef struct ekcur {
    sqlite3_vtab_cursor base;
    int plan, want_vec, want_meta, eof; /* want_meta: records' metadata (clock) */
    size_t nids;           /* b.ids[0..nids): the candidate ids, in output order */
    size_t pos;            /* current index into ids */
    size_t chunk;          /* rows loaded at a time */
    size_t lo, hi;         /* ids[lo..hi) are loaded */
    ekcurbuf b;            /* buffers (reused through the table: ekvtab.spare) */
    int info_state;        /* 0 unknown, 1 committed info, 3 uncommitted, 4 committed tier only */
    embkv_rowinfo info;
    embkv_snapshot *snap;  /* from the first xFilter to xClose */
} ekcur;

int vt_open(sqlite3_vtab *pv, sqlite3_vtab_cursor **pc)
{
    ekvtab *v = (ekvtab *)pv;
    ekcur *c = sqlite3_malloc(sizeof *c);
    if (!c) return SQLITE_NOMEM;
    memset(c, 0, sizeof *c);
    c->eof = 1;
    /* A statement opens a cursor per execution: reuse the buffers of the
     * last one, rather than allocating (and page-faulting) them anew. */
    if (v->has_spare) {
        c->b = v->spare;
        v->has_spare = 0;
    }
    *pc = &c->base;
    return SQLITE_OK;
}

void ekcurbuf_free(ekcurbuf *b)
{
    sqlite3_free(b->ids);
    sqlite3_free(b->vecs);
    sqlite3_free(b->st);
    sqlite3_free(b->found);
    sqlite3_free(b->eidx);
    sqlite3_free(b->eids);
    sqlite3_free(b->evecs);
    sqlite3_free(b->infos);
    sqlite3_free(b->einfos);
    sqlite3_free(b->tiers);
    memset(b, 0, sizeof *b);
}

int vt_close(sqlite3_vtab_cursor *pc)
{
    ekcur *c = (ekcur *)pc;
    ekvtab *v = (ekvtab *)pc->pVtab;
    embkv_snapshot_close(c->snap);
    uint64_t bytes = (uint64_t)c->b.capchunk * (v->dim * 4 + sizeof(embkv_rowinfo)) * 2 + (uint64_t)c->b.capids * 8;
    if (!v->has_spare && bytes <= (8u << 20)) {
        v->spare = c->b;
        v->has_spare = 1;
    } else {
        ekcurbuf_free(&c->b);
    }
    sqlite3_free(c);
    return SQLITE_OK;
}

static int ids_reserve(ekcur *c, size_t n)
{
    if (n <= c->b.capids) return SQLITE_OK;
    size_t cap = c->b.capids ? c->b.capids : 16;
    while (cap < n) cap *= 2;
    int64_t *p = sqlite3_realloc64(c->b.ids, (uint64_t)cap * sizeof *p);
    if (!p) return SQLITE_NOMEM;
    c->b.ids = p;
    c->b.capids = cap;
    return SQLITE_OK;
}

static int ids_push(ekcur *c, int64_t id)
{
    if (c->nids == c->b.capids && ids_reserve(c, c->nids + 1) != SQLITE_OK) return SQLITE_NOMEM;
    c->b.ids[c->nids++] = id;
    return SQLITE_OK;
}

static int cmp_id(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int scan_collect(void *ctx, int64_t id, const float *vec, const float *state, const embkv_rowinfo *info)
{
    (void)vec;
    (void)state;
    (void)info;
    return ids_push(ctx, id) == SQLITE_OK ? 0 : 1;
}

/* The rows that existed at the snapshot and changed since, each once: the
 * scan may have found them in the index or not (deleted). */
static int add_changed_ids(ekcur *c, ekvtab *v)
{
    int64_t *ch = NULL;
    size_t nch = 0;
    int erc = embkv_snapshot_changed_ids(c->snap, &ch, &nch);
    if (erc != EMBKV_OK) {
        ekerr_table(v, "scan failed: %s", embkv_errmsg());
        return ekerr_rc(erc);
    }
    if (nch == 0) return SQLITE_OK;
    qsort(ch, nch, sizeof *ch, cmp_id);
    size_t w = 0;
    for (size_t i = 0; i < c->nids; i++)
        if (!bsearch(&c->b.ids[i], ch, nch, sizeof *ch, cmp_id)) c->b.ids[w++] = c->b.ids[i];
    c->nids = w;
    int rc = ids_reserve(c, c->nids + nch);
    if (rc == SQLITE_OK) {
        memcpy(c->b.ids + c->nids, ch, nch * sizeof *ch);
        c->nids += nch;
    }
    free(ch);
    return rc;
}

/* Every id the connection sees: the store's (scan_ids), minus those its
 * transaction changed, plus the rows its transaction wrote. */
static int collect_all(ekcur *c, ekvtab *v)
{
    int erc = EMBKV_BUSY;
    /* Pinned: no resize, and no row moving between buckets (migration)
     * behind the cursor, which would drop it or list it twice. */
    embkv_scan_pin(v->store);
    for (int attempt = 0; attempt < 3 && erc == EMBKV_BUSY; attempt++) {
        uint64_t pos = 0;
        c->nids = 0;
        for (;;) {
            if (ids_reserve(c, c->nids + SCAN_IDS) != SQLITE_OK) { embkv_scan_unpin(v->store); return SQLITE_NOMEM; }
            size_t n = 0;
            erc = embkv_scan_ids(v->store, &pos, c->b.ids + c->nids, SCAN_IDS, &n);
            if (erc != EMBKV_OK || n == 0) break;
            c->nids += n;
        }
    }
    embkv_scan_unpin(v->store);
    if (erc == EMBKV_BUSY) { /* the index keeps growing under us: a one-pass scan */
        c->nids = 0;
        erc = embkv_scan(v->store, scan_collect, c);
        if (erc == 1) return SQLITE_NOMEM;
    }
    if (erc != EMBKV_OK) {
        ekerr_table(v, "scan failed: %s", embkv_errmsg());
        return ekerr_rc(erc);
    }
    int rc = add_changed_ids(c, v);
    if (rc != SQLITE_OK) return rc;
    if (ektxn_count(v->txn)) {
        size_t w = 0;
        for (size_t i = 0; i < c->nids; i++)
            if (!ektxn_find(v->txn, c->b.ids[i])) c->b.ids[w++] = c->b.ids[i];
        c->nids = w;
        for (size_t i = 0; i < ektxn_nslots(v->txn); i++) {
            const ektxn_entry *e = ektxn_slot(v->txn, i);
            if (e && e->kind == EKTXN_PUT && ids_push(c, e->id) != SQLITE_OK) return SQLITE_NOMEM;
        }
    }
    return SQLITE_OK;
}

static int chunk_reserve(ekcur *c, ekvtab *v, size_t rows)
{
    if (rows <= c->b.capchunk && (!c->want_vec || c->b.vecs)) return SQLITE_OK;
    if (rows < c->b.capchunk) rows = c->b.capchunk;
    sqlite3_free(c->b.vecs);
    sqlite3_free(c->b.evecs);
    c->b.vecs = c->b.evecs = NULL;
    uint8_t *st = sqlite3_realloc64(c->b.st, rows);
    uint8_t *found = sqlite3_realloc64(c->b.found, rows);
    if (st) c->b.st = st;
    if (found) c->b.found = found;
    size_t *eidx = sqlite3_realloc64(c->b.eidx, rows * sizeof *eidx);
    if (eidx) c->b.eidx = eidx;
    int64_t *eids = sqlite3_realloc64(c->b.eids, rows * sizeof *eids);
    if (eids) c->b.eids = eids;
    embkv_rowinfo *infos = sqlite3_realloc64(c->b.infos, rows * sizeof *infos);
    if (infos) c->b.infos = infos;
    embkv_rowinfo *einfos = sqlite3_realloc64(c->b.einfos, rows * sizeof *einfos);
    if (einfos) c->b.einfos = einfos;
    int *tiers = sqlite3_realloc64(c->b.tiers, rows * sizeof *tiers);
    if (tiers) c->b.tiers = tiers;
    if (!st || !found || !eidx || !eids || !infos || !einfos || !tiers) return SQLITE_NOMEM;
    c->b.capchunk = rows;
    if (c->want_vec) {
        c->b.vecs = sqlite3_malloc64((uint64_t)rows * v->dim * sizeof(float));
        if (!c->b.vecs) {
            c->b.capchunk = 0;
            return SQLITE_NOMEM;
        }
    }
    return SQLITE_OK;
}

/* Committed rows by id, as of the cursor's snapshot: a lookup's read
 * offers the rows it finds in the SSD log to promotion
 * (embkv_get_batch_at); a scan's is a copy's (embkv_get_rows_at), since a
 * pass over every row says nothing of which are hot. */
static int read_rows(ekcur *c, ekvtab *v, const int64_t *ids, size_t n, float *vecs, embkv_rowinfo *infos,
                     uint8_t *found)
{
    return c->plan == PLAN_SCAN ? embkv_get_rows_at(v->store, c->snap, ids, n, vecs, NULL, infos, found, NULL)
                                : embkv_get_batch_at(v->store, c->snap, ids, n, vecs, infos, found, NULL);
}

/* Loads ids[lo..lo+chunk): which rows exist and, if wanted, their vectors:
 * the transaction's own rows from its buffer, the others with one
 * embkv_get_batch. */
static int load_chunk(ekcur *c, ekvtab *v, size_t lo)
{
    size_t hi = lo + c->chunk < c->nids ? lo + c->chunk : c->nids;
    size_t n = hi - lo, m = 0, dim = v->dim;
    const int64_t *ids = c->b.ids + lo;
    int have_txn = ektxn_count(v->txn) > 0;
    for (size_t j = 0; j < n; j++) {
        const ektxn_entry *e = have_txn ? ektxn_find(v->txn, ids[j]) : NULL;
        if (e) {
            c->b.st[j] = e->kind == EKTXN_PUT ? 2 : 0;
            if (c->b.st[j] && c->want_vec) memcpy(c->b.vecs + j * dim, e->vec, dim * 4);
        } else {
            c->b.st[j] = 1;
            c->b.eidx[m++] = j;
        }
    }
    if (m > 0) {
        /* Lookups by id count in the access statistics (whatever columns
         * they read), before the read, whose offer to promotion weighs
         * them; a scan visits every row once and would only flatten the
         * counts. */
        if (c->plan != PLAN_SCAN) embkv_heat_touch(v->store, ids, n);
        /* Committed rows as of the cursor's snapshot: vectors (when the
         * plan uses them) and metadata from one version of each row. */
        int erc;
        float *vecs = c->want_vec ? c->b.vecs : NULL;
        if (!c->want_meta) {
            /* Where each row is, nothing read: the clock, if asked after
             * all, is read row by row (load_info). */
            for (size_t k = 0; k < m; k++) c->b.eids[k] = ids[c->b.eidx[k]];
            erc = embkv_locate_batch_at(v->store, c->snap, c->b.eids, m, c->b.tiers, c->b.found);
            for (size_t k = 0; k < m && erc == EMBKV_OK; k++) {
                size_t j = c->b.eidx[k];
                c->b.st[j] = c->b.found[k] ? 1 : 0;
                memset(&c->b.infos[j], 0, sizeof c->b.infos[j]);
                c->b.infos[j].tier = c->b.tiers[k];
            }
        } else if (m == n) {
            erc = read_rows(c, v, ids, n, vecs, c->b.infos, c->b.found);
            if (erc == EMBKV_OK)
                for (size_t j = 0; j < n; j++) c->b.st[j] = c->b.found[j] ? 1 : 0;
        } else {
            if (c->want_vec && !c->b.evecs &&
                !(c->b.evecs = sqlite3_malloc64((uint64_t)c->b.capchunk * dim * sizeof(float))))
                return SQLITE_NOMEM;
            for (size_t k = 0; k < m; k++) c->b.eids[k] = ids[c->b.eidx[k]];
            erc = read_rows(c, v, c->b.eids, m, c->want_vec ? c->b.evecs : NULL, c->b.einfos, c->b.found);
            if (erc == EMBKV_OK) {
                for (size_t k = 0; k < m; k++) {
                    size_t j = c->b.eidx[k];
                    c->b.st[j] = c->b.found[k] ? 1 : 0;
                    c->b.infos[j] = c->b.einfos[k];
                    if (c->b.found[k] && c->want_vec) memcpy(c->b.vecs + j * dim, c->b.evecs + k * dim, dim * 4);
                }
            }
        }
        if (erc != EMBKV_OK) {
            ekerr_table(v, "read failed: %s", embkv_errmsg());
            return ekerr_rc(erc);
        }
        /* Lookups offer their rows to the DRAM cache; a scan would only
         * flush it. */
        if (c->plan != PLAN_SCAN) embkv_cache_offer(v->store, ids, n);
    }
    c->lo = lo;
    c->hi = hi;
    return SQLITE_OK;
}

static int advance(ekcur *c, ekvtab *v)
{
    for (;;) {
        c->pos++;
        if (c->pos >= c->nids) {
            c->eof = 1;
            return SQLITE_OK;
        }
        if (c->pos >= c->hi) {
            int rc = load_chunk(c, v, c->pos);
            if (rc != SQLITE_OK) return rc;
        }
        if (c->b.st[c->pos - c->lo]) {
            c->info_state = 0;
            return SQLITE_OK;
        }
    }
}

int vt_filter(sqlite3_vtab_cursor *pc, int idxNum, const char *idxStr, int argc, sqlite3_value **argv)
{
    ekcur *c = (ekcur *)pc;
    ekvtab *v = (ekvtab *)pc->pVtab;
    int rc = ekerr_unusable(v);
    if (rc != SQLITE_OK) return rc;
    if (!c->snap) {
        int erc = embkv_snapshot_open(v->store, &c->snap);
        if (erc != EMBKV_OK) {
            ekerr_table(v, "cannot open a snapshot: %s", embkv_errmsg());
            return ekerr_rc(erc);
        }
        /* The store as SQLite's read transaction sees the database
         * (commitseq.c: a WAL reader). */
        char *why = NULL;
        if ((rc = ekseq_check(v, &c->snap, &why)) != SQLITE_OK) {
            ekerr_table(v, "%s", why ? why : "out of memory");
            sqlite3_free(why);
            return rc;
        }
    }
    c->plan = idxNum;
    c->want_vec = !(idxStr && (strstr(idxStr, "ids-only") || strstr(idxStr, "no-vec")));
    c->want_meta = !(idxStr && strstr(idxStr, "ids-only"));
    c->nids = 0;
    c->lo = c->hi = 0;
    c->eof = 0;
    int64_t id;
    if (c->plan == PLAN_POINT && argc >= 1) {
        if (value_to_id(argv[0], &id)) rc = ids_push(c, id);
    } else if (c->plan == PLAN_IN && argc >= 1) {
        sqlite3_value *val = NULL;
        int sorted = 1;
        for (rc = sqlite3_vtab_in_first(argv[0], &val); rc == SQLITE_OK && val;
             rc = sqlite3_vtab_in_next(argv[0], &val)) {
            if (!value_to_id(val, &id)) continue;
            if (c->nids && id <= c->b.ids[c->nids - 1]) sorted = 0;
            if (ids_push(c, id) != SQLITE_OK) return SQLITE_NOMEM;
        }
        if (rc == SQLITE_DONE) rc = SQLITE_OK;
        if (rc == SQLITE_OK && !sorted) { /* distinct ids, each once */
            qsort(c->b.ids, c->nids, sizeof *c->b.ids, cmp_id);
            size_t w = 0;
            for (size_t i = 0; i < c->nids; i++)
                if (w == 0 || c->b.ids[i] != c->b.ids[w - 1]) c->b.ids[w++] = c->b.ids[i];
            c->nids = w;
        }
    } else {
        c->plan = PLAN_SCAN;
        rc = collect_all(c, v);
    }
    if (rc != SQLITE_OK) return rc;
    c->chunk = c->plan == PLAN_SCAN ? SCAN_CHUNK : (c->nids ? c->nids : 1);
    rc = chunk_reserve(c, v, c->chunk);
    if (rc != SQLITE_OK) return rc;
    c->pos = (size_t)-1;
    return advance(c, v);
}

int vt_next(sqlite3_vtab_cursor *pc)
{
    return advance((ekcur *)pc, (ekvtab *)pc->pVtab);
}

int vt_eof(sqlite3_vtab_cursor *pc)
{
    return ((ekcur *)pc)->eof;
}

/* The current row's metadata.  A plan without the clock knows the tier
 * from where the row is (info_state 4); the clock is read when asked. */
static int load_info(ekcur *c, ekvtab *v, int clock)
{
    if (c->info_state == 1 || c->info_state == 3 || (c->info_state == 4 && !clock)) return SQLITE_OK;
    int64_t id = c->b.ids[c->pos];
    int erc;
    if (c->b.st[c->pos - c->lo] == 2) {
        /* Not committed yet: the clock it will have, and no tier. */
        const ektxn_entry *e = ektxn_find(v->txn, id);
        c->info.clock = 0;
        if (!(e && e->fresh)) {
            erc = embkv_get(v->store, id, NULL, NULL, &c->info);
            if (erc == EMBKV_OK) {
                if (c->info.clock < (uint64_t)INT64_MAX) c->info.clock++;  /* (it stops there) */
            } else if (erc == EMBKV_NOTFOUND) c->info.clock = 0;
            else goto fail;
        }
        c->info_state = 3;
        return SQLITE_OK;
    }
    /* Committed: read with the row's vector, from the same version. */
    c->info = c->b.infos[c->pos - c->lo];
    if (!c->want_meta) {
        if (!clock) {
            c->info_state = 4;
            return SQLITE_OK;
        }
        /* Planned without the clock: read it now, as of the snapshot. */
        uint8_t found = 0;
        erc = read_rows(c, v, &id, 1, NULL, &c->info, &found);
        if (erc != EMBKV_OK) goto fail;
    }
    c->info_state = 1;
    return SQLITE_OK;
fail:
    ekerr_table(v, "id %lld: read failed: %s", (long long)id, embkv_errmsg());
    return ekerr_rc(erc);
}

int vt_column(sqlite3_vtab_cursor *pc, sqlite3_context *ctx, int col)
{
    ekcur *c = (ekcur *)pc;
    ekvtab *v = (ekvtab *)pc->pVtab;
    int64_t id = c->b.ids[c->pos];
    int rc;
    switch (col) {
    case COL_ID:
        /* An UPDATE that keeps id: leave it unset, so xUpdate sees
         * sqlite3_value_nochange() and takes the new rowid (argv[1]). */
        if (sqlite3_vtab_nochange(ctx)) return SQLITE_OK;
        sqlite3_result_int64(ctx, id);
        return SQLITE_OK;
    case COL_VEC:
        if (sqlite3_vtab_nochange(ctx)) return SQLITE_OK; /* an UPDATE that keeps vec */
        if (c->want_vec) {
            sqlite3_result_blob(ctx, c->b.vecs + (c->pos - c->lo) * v->dim, (int)v->dim * 4, SQLITE_TRANSIENT);
            return SQLITE_OK;
        }
        rc = read_row_at(v, c->snap, id, v->scratch); /* not planned for: read it now */
        if (rc < 0) return SQLITE_ERROR;
        if (rc == 1) sqlite3_result_blob(ctx, v->scratch, (int)v->dim * 4, SQLITE_TRANSIENT);
        return SQLITE_OK;
    case COL_CLOCK:
    case COL_TIER:
        if (sqlite3_vtab_nochange(ctx)) return SQLITE_OK;
        rc = load_info(c, v, col == COL_CLOCK);
        if (rc != SQLITE_OK) return rc;
        if (col == COL_CLOCK) {
            if (c->info_state == 1 || c->info_state == 3) sqlite3_result_int64(ctx, (sqlite3_int64)c->info.clock);
        } else if (c->info_state == 1 || c->info_state == 4) {
            static const char *const tiers[] = {"dram", "pm", "ssd"};
            if (c->info.tier >= 0 && c->info.tier < 3) sqlite3_result_text(ctx, tiers[c->info.tier], -1, SQLITE_STATIC);
        }
        return SQLITE_OK;
    default:
        return SQLITE_OK;
    }
}

int vt_rowid(sqlite3_vtab_cursor *pc, sqlite3_int64 *rowid)
{
    ekcur *c = (ekcur *)pc;
    *rowid = c->b.ids[c->pos];
    return SQLITE_OK;
}

