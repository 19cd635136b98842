/*
 * heat.c - the access statistics and the hot set in SQL:
 *   SELECT id, hits, tier FROM embkv_heat('table')   every row with its
 *       estimated recent accesses (0..15) and its tier, in index order;
 *   embkv_hotset(table, n)     moves the n hottest rows up the hierarchy;
 *   embkv_hotset(table, ids)   moves these (int64 BLOB or JSON array);
 *       both return {"home_bucket": a, "to_pm": b, "to_dram": c}.
 *
 * The statistics (the engine's sketch, embkv.h) count only once something
 * needs them; the first use of either function on a table starts them
 * (embkv_heat_enable), so a first call sees no hits and moves nothing by
 * heat: that is the cost model a user of a pool that holds every row
 * chose, and what docs/tiers.md says.
 *
 * embkv_heat materializes its rows when the scan begins (10 bytes a row),
 * as the table's own full scan does with its ids: the store is pinned (no
 * index resize) only while that pass runs, never across SQLite's steps.
 * Its rows are the store's: uncommitted writes of the connection's own
 * transaction are not in it (they have not been accessed in the store).
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const tier_names[] = {"dram", "pm", "ssd"};

/* ------------------------------------------------------------------------
 * embkv_heat(table)
 */
typedef struct {
    sqlite3_vtab base;
    sqlite3 *db;
} heattab;

typedef struct {
    sqlite3_vtab_cursor base;
    int64_t *ids;
    uint8_t *hits;
    int8_t *tier;
    size_t n, cap, i;
    char *name;                /* the argument, for the tbl column */
} heatcur;

#define HEAT_COL_TABLE 3
#define HEAT_CHUNK 4096

static int heat_connect(sqlite3 *db, void *aux, int argc, const char *const *argv, sqlite3_vtab **pp, char **pzErr)
{
    (void)aux;
    (void)argc;
    (void)argv;
    (void)pzErr;
    int rc = sqlite3_declare_vtab(db, "CREATE TABLE x(id INTEGER, hits INTEGER, tier TEXT, tbl HIDDEN)");
    if (rc != SQLITE_OK) return rc;
    sqlite3_vtab_config(db, SQLITE_VTAB_DIRECTONLY);
    heattab *t = sqlite3_malloc(sizeof *t);
    if (!t) return SQLITE_NOMEM;
    memset(t, 0, sizeof *t);
    t->db = db;
    *pp = &t->base;
    return SQLITE_OK;
}

static int heat_disconnect(sqlite3_vtab *pv)
{
    sqlite3_free(pv);
    return SQLITE_OK;
}

static int heat_best_index(sqlite3_vtab *pv, sqlite3_index_info *info)
{
    (void)pv;
    int at = -1;
    for (int i = 0; i < info->nConstraint; i++) {
        const struct sqlite3_index_constraint *c = &info->aConstraint[i];
        if (c->iColumn != HEAT_COL_TABLE || c->op != SQLITE_INDEX_CONSTRAINT_EQ) continue;
        /* The table argument given but not known yet: not this plan.  (A
         * constraint other than = on it is no argument: xFilter says so.) */
        if (!c->usable) return SQLITE_CONSTRAINT;
        at = i;
        break;
    }
    if (at >= 0) {
        info->aConstraintUsage[at].argvIndex = 1;
        info->aConstraintUsage[at].omit = 1;
        info->idxNum = 1;
    }
    info->estimatedCost = 1e6;
    info->estimatedRows = 1000000;
    return SQLITE_OK;
}

static int heat_open(sqlite3_vtab *pv, sqlite3_vtab_cursor **pc)
{
    (void)pv;
    heatcur *c = sqlite3_malloc(sizeof *c);
    if (!c) return SQLITE_NOMEM;
    memset(c, 0, sizeof *c);
    *pc = &c->base;
    return SQLITE_OK;
}

static void heat_reset(heatcur *c)
{
    sqlite3_free(c->name);
    c->name = NULL;
    free(c->ids);
    free(c->hits);
    free(c->tier);
    c->ids = NULL;
    c->hits = NULL;
    c->tier = NULL;
    c->n = c->cap = c->i = 0;
}

static int heat_close(sqlite3_vtab_cursor *pc)
{
    heat_reset((heatcur *)pc);
    sqlite3_free(pc);
    return SQLITE_OK;
}

static int heat_reserve(heatcur *c, size_t want)
{
    if (want <= c->cap) return 0;
    size_t cap = c->cap ? c->cap : HEAT_CHUNK;
    while (cap < want) cap *= 2;
    int64_t *ids = realloc(c->ids, cap * sizeof *ids);
    if (ids) c->ids = ids;
    uint8_t *hits = realloc(c->hits, cap);
    if (hits) c->hits = hits;
    int8_t *tier = realloc(c->tier, cap);
    if (tier) c->tier = tier;
    if (!ids || !hits || !tier) return -1;
    c->cap = cap;
    return 0;
}

/* Every row of the store with its estimate and tier, in one pinned pass. */
static int heat_collect(heatcur *c, embkv_store *s)
{
    int erc = EMBKV_OK;
    uint64_t pos = 0;
    uint32_t hits[HEAT_CHUNK];
    int tier[HEAT_CHUNK];
    uint8_t found[HEAT_CHUNK];
    embkv_scan_pin(s);
    for (;;) {
        if (heat_reserve(c, c->n + HEAT_CHUNK)) {
            erc = EMBKV_NOMEM;
            break;
        }
        size_t got = 0;
        if ((erc = embkv_scan_ids(s, &pos, c->ids + c->n, HEAT_CHUNK, &got)) != EMBKV_OK || got == 0) break;
        if ((erc = embkv_heat_get(s, c->ids + c->n, got, hits)) != EMBKV_OK) break;
        if ((erc = embkv_locate_batch_at(s, NULL, c->ids + c->n, got, tier, found)) != EMBKV_OK) break;
        /* A row deleted between the two reads is left out. */
        size_t w = c->n;
        for (size_t j = 0; j < got; j++) {
            if (!found[j] || tier[j] < 0 || tier[j] > 2) continue;
            c->ids[w] = c->ids[c->n + j];
            c->hits[w] = (uint8_t)hits[j];
            c->tier[w] = (int8_t)tier[j];
            w++;
        }
        c->n = w;
    }
    embkv_scan_unpin(s);
    return erc;
}

static int heat_filter(sqlite3_vtab_cursor *pc, int idxNum, const char *idxStr, int argc, sqlite3_value **argv)
{
    (void)idxStr;
    heatcur *c = (heatcur *)pc;
    heattab *t = (heattab *)pc->pVtab;
    heat_reset(c);
    bool nul = false;
    const char *name = idxNum == 1 && argc == 1 ? ek_name_arg(argv[0], &nul) : NULL;
    if (nul)
        return ekerr_vtab(pc->pVtab, SQLITE_ERROR, sqlite3_mprintf("embkv_heat: the table name " EK_NAME_NUL));
    if (!name)
        return ekerr_vtab(pc->pVtab, SQLITE_ERROR,
                          sqlite3_mprintf("embkv_heat: expected a table name (TEXT): SELECT id, hits, tier FROM "
                                          "embkv_heat('table')"));
    /* (Named like embkv_stats' argument: 'o.t' for a table of schema o;
     * SQLite keeps eponymous tables in main, so o.embkv_heat('t') is
     * main's.) */
    if (!(c->name = sqlite3_mprintf("%s", name))) return SQLITE_NOMEM;
    embkv_table_ref ref;
    char *err = NULL;
    int lrc = embkv_table_lookup(t->db, name, &ref, &err);
    if (lrc != SQLITE_OK) {
        char *m = sqlite3_mprintf("embkv_heat: %s", err ? err : "out of memory");
        sqlite3_free(err);
        return ekerr_vtab(pc->pVtab, lrc, m);
    }
    int erc = embkv_heat_enable(ref.store);
    if (erc == EMBKV_OK) erc = heat_collect(c, ref.store);
    if (erc != EMBKV_OK) {
        heat_reset(c);
        return ekerr_vtab(pc->pVtab, erc == EMBKV_NOMEM ? SQLITE_NOMEM : SQLITE_ERROR,
                          sqlite3_mprintf("embkv_heat: table %s: %s", ref.name,
                                          erc == EMBKV_NOMEM ? "out of memory" : embkv_errmsg()));
    }
    return SQLITE_OK;
}

static int heat_next(sqlite3_vtab_cursor *pc)
{
    ((heatcur *)pc)->i++;
    return SQLITE_OK;
}

static int heat_eof(sqlite3_vtab_cursor *pc)
{
    heatcur *c = (heatcur *)pc;
    return c->i >= c->n;
}

static int heat_column(sqlite3_vtab_cursor *pc, sqlite3_context *ctx, int col)
{
    heatcur *c = (heatcur *)pc;
    switch (col) {
    case 0: sqlite3_result_int64(ctx, c->ids[c->i]); break;
    case 1: sqlite3_result_int(ctx, c->hits[c->i]); break;
    case 2: sqlite3_result_text(ctx, tier_names[c->tier[c->i]], -1, SQLITE_STATIC); break;
    default: sqlite3_result_text(ctx, c->name, -1, SQLITE_TRANSIENT); break;
    }
    return SQLITE_OK;
}

static int heat_rowid(sqlite3_vtab_cursor *pc, sqlite3_int64 *r)
{
    *r = (sqlite3_int64)((heatcur *)pc)->i + 1;
    return SQLITE_OK;
}

static const sqlite3_module heat_module = {
    .iVersion = 1,
    .xCreate = NULL, /* eponymous only */
    .xConnect = heat_connect,
    .xBestIndex = heat_best_index,
    .xDisconnect = heat_disconnect,
    .xDestroy = heat_disconnect,
    .xOpen = heat_open,
    .xClose = heat_close,
    .xFilter = heat_filter,
    .xNext = heat_next,
    .xEof = heat_eof,
    .xColumn = heat_column,
    .xRowid = heat_rowid,
};

/* ------------------------------------------------------------------------
 * embkv_hotset(table, n | ids)
 */
static void hot_error(sqlite3_context *ctx, const char *table, int code, const char *msg)
{
    char *m = table ? sqlite3_mprintf("embkv_hotset: table %s: %s", table, msg)
                    : sqlite3_mprintf("embkv_hotset: %s", msg);
    sqlite3_result_error(ctx, m ? m : msg, -1);
    sqlite3_free(m);
    if (code == SQLITE_NOMEM)
        sqlite3_result_error_nomem(ctx);
    else if (code != SQLITE_ERROR)
        sqlite3_result_error_code(ctx, code);
}

static void fn_hotset(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    bool nul;
    const char *name = ek_name_arg(argv[0], &nul);
    if (!name) {
        hot_error(ctx, NULL, SQLITE_ERROR,
                  nul ? "the table name (argument 1) " EK_NAME_NUL : "expected a table name (TEXT) as argument 1");
        return;
    }
    embkv_table_ref ref;
    char *err = NULL;
    int lrc = embkv_table_lookup(sqlite3_context_db_handle(ctx), name, &ref, &err);
    if (lrc != SQLITE_OK) {
        hot_error(ctx, NULL, lrc, err ? err : "out of memory");
        sqlite3_free(err);
        return;
    }
    if (ekerr_refuse_readonly(ctx, "embkv_hotset", ref.schema, ref.name, "it moves rows between tiers", ref.store)) return;
    int64_t *ids = NULL;
    size_t n = 0;
    int erc = embkv_heat_enable(ref.store);
    int vt = sqlite3_value_type(argv[1]);
    if (vt == SQLITE_FLOAT) {
        /* A REAL with no fraction is n, as embkv_knn's k takes it (a
         * Python float, 1e4). */
        double d = sqlite3_value_double(argv[1]);
        if (!(d == floor(d) && fabs(d) < 9.2e18)) {
            char *m = sqlite3_mprintf("n (argument 2) must be an integer (the number of hottest rows to move), "
                                      "got %!.15g", d);
            hot_error(ctx, ref.name, m ? SQLITE_ERROR : SQLITE_NOMEM, m ? m : "out of memory");
            sqlite3_free(m);
            return;
        }
        vt = SQLITE_INTEGER;
    }
    switch (vt) {
    case SQLITE_INTEGER: {
        sqlite3_int64 want = sqlite3_value_type(argv[1]) == SQLITE_FLOAT ? (sqlite3_int64)sqlite3_value_double(argv[1])
                                                                         : sqlite3_value_int64(argv[1]);
        if (want < 0) {
            char *m = sqlite3_mprintf("n must be 0 or more (the number of hottest rows to move), got %lld", want);
            hot_error(ctx, ref.name, m ? SQLITE_ERROR : SQLITE_NOMEM, m ? m : "out of memory");
            sqlite3_free(m);
            return;
        }
        /* No more than the rows there are: n sizes the ranking's memory. */
        uint64_t rows = embkv_count(ref.store);
        n = (uint64_t)want < rows ? (size_t)want : (size_t)rows;
        ids = sqlite3_malloc64((n ? n : 1) * sizeof *ids);
        if (!ids) {
            hot_error(ctx, ref.name, SQLITE_NOMEM, "out of memory");
            return;
        }
        size_t got = 0;
        if (erc == EMBKV_OK && n) erc = embkv_hottest(ref.store, n, ids, NULL, &got);
        n = got;
        break;
    }
    case SQLITE_TEXT: {
        /* A JSON array: ek_parse_ids' hint at "an integer" would mislead
         * here, where an integer is n. */
        const char *txt = (const char *)sqlite3_value_text(argv[1]);
        while (txt && (*txt == ' ' || *txt == '\t' || *txt == '\n' || *txt == '\r')) txt++;
        if (!txt || *txt != '[') {
            hot_error(ctx, ref.name, SQLITE_ERROR,
                      "argument 2: ids must be a JSON array of integers such as '[42]' or an int64 BLOB (an "
                      "integer is n, the number of hottest rows)");
            return;
        }
    }
    /* fall through */
    case SQLITE_BLOB:
        /* (An integer is n here, not an id.) */
        ids = ek_parse_ids_or(argv[1], &n, &err, " or an int64 BLOB (an integer is n, the number of hottest rows)");
        if (!ids) {
            char *m = err ? sqlite3_mprintf("argument 2: %s", err) : NULL;
            hot_error(ctx, ref.name, m ? SQLITE_ERROR : SQLITE_NOMEM, m ? m : "out of memory");
            sqlite3_free(m);
            sqlite3_free(err);
            return;
        }
        break;
    default:
        hot_error(ctx, ref.name, SQLITE_ERROR,
                  "argument 2 must be n (an integer: the n hottest rows) or ids (an int64 BLOB or a JSON array)");
        return;
    }
    embkv_moves mv;
    memset(&mv, 0, sizeof mv);
    if (erc == EMBKV_OK) erc = embkv_hotset_move(ref.store, ids, n, &mv);
    sqlite3_free(ids);
    if (erc != EMBKV_OK) {
        hot_error(ctx, ref.name,
                  erc == EMBKV_NOMEM ? SQLITE_NOMEM : erc == EMBKV_IO ? SQLITE_IOERR : erc == EMBKV_FULL ? SQLITE_FULL
                                                                                                     : SQLITE_ERROR,
                  embkv_errmsg());
        return;
    }
    char *json = sqlite3_mprintf("{\"home_bucket\":%llu,\"to_pm\":%llu,\"to_dram\":%llu}",
                                 (unsigned long long)mv.home_bucket, (unsigned long long)mv.to_pm,
                                 (unsigned long long)mv.to_dram);
    if (!json) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_text(ctx, json, -1, sqlite3_free);
}

int embkv_heat_register(sqlite3 *db)
{
    int rc = sqlite3_create_module_v2(db, "embkv_heat", &heat_module, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_hotset", 2, SQLITE_UTF8 | SQLITE_DIRECTONLY, NULL, fn_hotset,
                                        NULL, NULL, NULL);
    return rc;
}
