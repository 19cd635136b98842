/*
 * knn.c - embkv_knn, the k nearest rows of a table to query vectors, as a
 * table-valued function:
 *
 *   SELECT id, distance FROM embkv_knn('item', :q, 10);
 *   SELECT query, rank, id, distance FROM embkv_knn('item', :qs, 10, 'cosine');
 *   SELECT id, distance FROM embkv_knn('item', :q, 5, 'l2', '[1, 2, 3]');
 *
 * :q is one vector (dim float32 as a BLOB, or a JSON array) or a batch of
 * them (a BLOB of n x dim float32, or a JSON array of arrays), answered
 * in one pass over the table (ext/engine/knn.c).  The rows of the
 * connection's open transaction count as written: its pending puts are
 * scored in place of the stored versions and its deletes left out, as a
 * SELECT of the table would see them.  The fifth argument (ids: a JSON
 * array or an int64 BLOB, as embkv_pull takes) searches among those ids
 * only: the k nearest of them.
 *
 * Why ids is an argument and `WHERE id IN (...)` filters afterwards, as
 * SQL does: a constraint on an output column that changed which rows are
 * searched would make the answer depend on the plan (in a join, SQLite
 * may drive the id from the other table row by row, and each single-id
 * search would return that row).  An argument means one thing whatever
 * the plan.
 *
 * Why a table-valued function rather than `WHERE vec MATCH ? AND k = ?` on
 * the table itself: the table's planner already answers id lookups, scans
 * and IN lists; a second meaning of its constraints would make every plan
 * depend on which ones appear.  The function names what it does, takes a
 * batch and a metric, and the table module stays as it is.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KC_ID = 0, KC_DISTANCE, KC_QUERY, KC_RANK, KC_TABLE, KC_Q, KC_K, KC_METRIC, KC_IDS };
#define KC_ARGS 5
/* idxNum bits: which arguments the plan passes, in argv in this order */
enum { KA_TABLE = 1, KA_Q = 2, KA_K = 4, KA_METRIC = 8, KA_IDS = 16 };

#define USAGE "SELECT id, distance FROM embkv_knn('table', query, k [, 'l2'|'cosine'|'dot' [, ids]])"

typedef struct knntab {
    sqlite3_vtab base;
    sqlite3 *db;
} knntab;

typedef struct knncur {
    sqlite3_vtab_cursor base;
    int64_t *ids;
    double *dist;
    size_t *found;
    size_t nq, k;
    size_t q, r;               /* the current row: query q, rank r + 1 */
    char *name;                /* the table argument, for the tbl column */
    char *metric;
    sqlite3_value *ids_arg;    /* the ids argument (a copy), or NULL */
} knncur;

static int knn_connect(sqlite3 *db, void *aux, int argc, const char *const *argv, sqlite3_vtab **pp, char **pzErr)
{
    (void)aux;
    (void)argc;
    (void)argv;
    (void)pzErr;
    int rc = sqlite3_declare_vtab(db, "CREATE TABLE x(id INTEGER, distance REAL, query INTEGER, rank INTEGER, "
                                      "tbl HIDDEN, q HIDDEN, k HIDDEN, metric HIDDEN, ids HIDDEN)");
    if (rc != SQLITE_OK) return rc;
    sqlite3_vtab_config(db, SQLITE_VTAB_DIRECTONLY);
    knntab *t = sqlite3_malloc(sizeof *t);
    if (!t) return SQLITE_NOMEM;
    memset(t, 0, sizeof *t);
    t->db = db;
    *pp = &t->base;
    return SQLITE_OK;
}

static int knn_disconnect(sqlite3_vtab *pv)
{
    sqlite3_free(pv);
    return SQLITE_OK;
}

static int knn_best_index(sqlite3_vtab *pv, sqlite3_index_info *info)
{
    (void)pv;
    int at[KC_ARGS] = { -1, -1, -1, -1, -1 };
    for (int i = 0; i < info->nConstraint; i++) {
        const struct sqlite3_index_constraint *c = &info->aConstraint[i];
        if (c->iColumn < KC_TABLE || c->op != SQLITE_INDEX_CONSTRAINT_EQ) continue;
        /* An argument given but not known yet: not this plan. */
        if (!c->usable) return SQLITE_CONSTRAINT;
        at[c->iColumn - KC_TABLE] = i;
    }
    int argv_i = 1, idx = 0;
    for (int a = 0; a < KC_ARGS; a++) {
        if (at[a] < 0) continue;
        info->aConstraintUsage[at[a]].argvIndex = argv_i++;
        info->aConstraintUsage[at[a]].omit = 1;
        idx |= 1 << a;
    }
    info->idxNum = idx;
    info->estimatedCost = 1e6;
    info->estimatedRows = 10;
    return SQLITE_OK;
}

static int knn_open(sqlite3_vtab *pv, sqlite3_vtab_cursor **pc)
{
    (void)pv;
    knncur *c = sqlite3_malloc(sizeof *c);
    if (!c) return SQLITE_NOMEM;
    memset(c, 0, sizeof *c);
    *pc = &c->base;
    return SQLITE_OK;
}

static void knn_reset(knncur *c)
{
    free(c->ids);
    free(c->dist);
    free(c->found);
    sqlite3_free(c->name);
    sqlite3_free(c->metric);
    sqlite3_value_free(c->ids_arg);
    c->ids_arg = NULL;
    c->ids = NULL;
    c->dist = NULL;
    c->found = NULL;
    c->name = c->metric = NULL;
    c->nq = c->k = c->q = c->r = 0;
}

static int knn_close(sqlite3_vtab_cursor *pc)
{
    knn_reset((knncur *)pc);
    sqlite3_free(pc);
    return SQLITE_OK;
}

/* A value for a message: 'text' (its start), a number, NULL, or a BLOB's
 * size (static buffer: one message at a time). */
static const char *describe(sqlite3_value *v)
{
    static _Thread_local char buf[80];
    switch (sqlite3_value_type(v)) {
    case SQLITE_NULL: return "NULL";
    case SQLITE_BLOB: snprintf(buf, sizeof buf, "a %d-byte BLOB", sqlite3_value_bytes(v)); return buf;
    case SQLITE_TEXT: snprintf(buf, sizeof buf, "'%.40s%s'", (const char *)sqlite3_value_text(v),
                               sqlite3_value_bytes(v) > 40 ? "..." : ""); return buf;
    default: snprintf(buf, sizeof buf, "%s", (const char *)sqlite3_value_text(v)); return buf;
    }
}

/* Skips to the next row that exists (queries with fewer than k found). */
static void knn_settle(knncur *c)
{
    while (c->q < c->nq && c->r >= c->found[c->q]) {
        c->q++;
        c->r = 0;
    }
}

/* The query vectors of val: n x dim floats (malloc'd) into *out, or NULL
 * with *err set. */
static float *parse_queries(sqlite3_value *val, unsigned dim, const char *table, size_t *nq, char **err)
{
    *nq = 0;
    *err = NULL;
    float *out = NULL;
    switch (sqlite3_value_type(val)) {
    case SQLITE_BLOB: {
        int n = sqlite3_value_bytes(val);
        const void *b = sqlite3_value_blob(val);
        size_t row = (size_t)dim * 4;
        if (n <= 0 || !b || (size_t)n % row != 0) {
            *err = sqlite3_mprintf("table %s: the query must be %u float32 (a %llu-byte BLOB), or a batch of them "
                                   "(a multiple of %llu bytes), got a %d-byte BLOB",
                                   table, dim, (unsigned long long)row, (unsigned long long)row, n);
            return NULL;
        }
        *nq = (size_t)n / row;
        if (!(out = malloc((size_t)n))) return NULL;
        memcpy(out, b, (size_t)n);
        break;
    }
    case SQLITE_TEXT: {
        const char *s = (const char *)sqlite3_value_text(val);
        int n = sqlite3_value_bytes(val);
        if (!s) return NULL;
        cJSON *j = memchr(s, 0, (size_t)n) ? NULL : ek_json_parse(s, (size_t)n);
        if (!j || !cJSON_IsArray(j) || cJSON_GetArraySize(j) == 0) {
            *err = sqlite3_mprintf("table %s: the query must be a JSON array of %u numbers, or an array of such "
                                   "arrays (a batch), got '%.40s%s'",
                                   table, dim, s, n > 40 ? "..." : "");
            cJSON_Delete(j);
            return NULL;
        }
        bool batch = cJSON_IsArray(cJSON_GetArrayItem(j, 0));
        size_t rows = batch ? (size_t)cJSON_GetArraySize(j) : 1;
        if (!(out = malloc(rows * dim * sizeof *out))) {
            cJSON_Delete(j);
            return NULL;
        }
        size_t qi = 0;
        for (cJSON *qv = batch ? j->child : j; qv && !*err; qv = batch ? qv->next : NULL, qi++) {
            if (!cJSON_IsArray(qv)) {
                *err = sqlite3_mprintf("table %s: query %llu of the batch is not an array (a batch is an array of "
                                       "arrays of %u numbers)",
                                       table, (unsigned long long)qi, dim);
                break;
            }
            if ((unsigned)cJSON_GetArraySize(qv) != dim) {
                *err = sqlite3_mprintf("table %s: query %llu must be a JSON array of %u numbers (the table's dim), "
                                       "got an array of %d",
                                       table, (unsigned long long)qi, dim, cJSON_GetArraySize(qv));
                break;
            }
            unsigned e = 0;
            for (cJSON *x = qv->child; x; x = x->next, e++) {
                if (!cJSON_IsNumber(x)) {
                    *err = sqlite3_mprintf("table %s: query %llu, element %u is not a number", table,
                                           (unsigned long long)qi, e);
                    break;
                }
                if (fabs(x->valuedouble) > FLT_MAX) {
                    *err = sqlite3_mprintf("table %s: query %llu, element %u is out of float32 range: %g", table,
                                           (unsigned long long)qi, e, x->valuedouble);
                    break;
                }
                out[qi * dim + e] = (float)x->valuedouble;
            }
        }
        cJSON_Delete(j);
        if (*err) {
            free(out);
            return NULL;
        }
        *nq = rows;
        break;
    }
    default:
        *err = sqlite3_mprintf("table %s: the query must be a float32 BLOB or a JSON array (got %s)", table,
                               sqlite3_value_type(val) == SQLITE_NULL ? "NULL" : "a number");
        return NULL;
    }
    for (size_t i = 0; i < *nq * dim; i++) {
        if (!isfinite(out[i])) {
            *err = sqlite3_mprintf("table %s: query %llu, element %llu is %s: query vectors must be finite", table,
                                   (unsigned long long)(i / dim), (unsigned long long)(i % dim),
                                   isnan(out[i]) ? "NaN" : "infinite");
            free(out);
            return NULL;
        }
    }
    return out;
}

static int knn_filter(sqlite3_vtab_cursor *pc, int idxNum, const char *idxStr, int argc, sqlite3_value **argv)
{
    (void)idxStr;
    (void)argc;
    knncur *c = (knncur *)pc;
    knntab *t = (knntab *)pc->pVtab;
    knn_reset(c);
    if ((idxNum & (KA_TABLE | KA_Q | KA_K)) != (KA_TABLE | KA_Q | KA_K))
        return ekerr_vtab(pc->pVtab, SQLITE_ERROR,
                         sqlite3_mprintf("embkv_knn: give the table, the query and k: " USAGE));
    sqlite3_value *a_table = argv[0], *a_q = argv[1], *a_k = argv[2];
    int at = 3;
    sqlite3_value *a_metric = (idxNum & KA_METRIC) ? argv[at++] : NULL;
    sqlite3_value *a_ids = (idxNum & KA_IDS) ? argv[at++] : NULL;
    /* (ids without a metric: the column form, ids = ..., whose metric is
     * l2 when not given; a call's arguments come in order.) */

    bool nul;
    const char *name = ek_name_arg(a_table, &nul);
    if (nul)
        return ekerr_vtab(pc->pVtab, SQLITE_ERROR, sqlite3_mprintf("embkv_knn: the table name (argument 1) " EK_NAME_NUL));
    if (!name)
        return ekerr_vtab(pc->pVtab, SQLITE_ERROR,
                         sqlite3_mprintf("embkv_knn: argument 1 must be a table name (TEXT): " USAGE));
    if (!(c->name = sqlite3_mprintf("%s", name))) return SQLITE_NOMEM;
    embkv_table_ref ref;
    char *err = NULL;
    int lrc = embkv_table_lookup(t->db, name, &ref, &err);
    if (lrc != SQLITE_OK) {
        char *m = sqlite3_mprintf("embkv_knn: %s", err ? err : "out of memory");
        sqlite3_free(err);
        return ekerr_vtab(pc->pVtab, lrc, m);
    }
    /* (Integer text counts, as ids take it: SQL's own affinity; so does
     * a REAL with no fraction, as the id column takes it.) */
    int kt = sqlite3_value_numeric_type(a_k);
    double kd = kt == SQLITE_INTEGER ? (double)sqlite3_value_int64(a_k) : kt == SQLITE_FLOAT ? sqlite3_value_double(a_k)
                                                                                            : NAN;
    if (!(kd >= 1 && kd <= EMBKV_KNN_MAX_K && kd == floor(kd)))
        return ekerr_vtab(pc->pVtab, SQLITE_ERROR,
                         sqlite3_mprintf("embkv_knn: table %s: k (argument 3) must be an integer from 1 to %d, "
                                         "got %s",
                                         ref.name, EMBKV_KNN_MAX_K, describe(a_k)));
    size_t k = (size_t)kd;
    int metric = EMBKV_KNN_L2;
    const char *mname = "l2";
    if (a_metric) {
        int mt = sqlite3_value_type(a_metric);
        mname = mt == SQLITE_TEXT ? (const char *)sqlite3_value_text(a_metric) : mt == SQLITE_NULL ? "l2" : "";
        if (sqlite3_stricmp(mname, "l2") == 0) metric = EMBKV_KNN_L2;
        else if (sqlite3_stricmp(mname, "cosine") == 0) metric = EMBKV_KNN_COSINE;
        else if (sqlite3_stricmp(mname, "dot") == 0) metric = EMBKV_KNN_DOT;
        else
            return ekerr_vtab(pc->pVtab, SQLITE_ERROR,
                             sqlite3_mprintf("embkv_knn: table %s: unknown metric %s (argument 4): use 'l2', "
                                             "'cosine' or 'dot'",
                                             ref.name, describe(a_metric)));
    }
    if (!(c->metric = sqlite3_mprintf("%s", mname))) return SQLITE_NOMEM;
    unsigned dim = embkv_dim(ref.store);
    size_t nq = 0;
    float *queries = parse_queries(a_q, dim, ref.name, &nq, &err);
    if (!queries) {
        char *m = err ? sqlite3_mprintf("embkv_knn: %s", err) : NULL;
        sqlite3_free(err);
        return ekerr_vtab(pc->pVtab, m ? SQLITE_ERROR : SQLITE_NOMEM, m);
    }
    if (nq > EMBKV_KNN_MAX_QUERIES || nq * k > EMBKV_KNN_MAX_RESULTS) {
        free(queries);
        return ekerr_vtab(pc->pVtab, SQLITE_ERROR,
                         sqlite3_mprintf("embkv_knn: table %s: %llu queries of k=%llu is too many (at most %d "
                                         "queries, %d results): split the batch",
                                         ref.name, (unsigned long long)nq, (unsigned long long)k, EMBKV_KNN_MAX_QUERIES, EMBKV_KNN_MAX_RESULTS));
    }

    embkv_knn_options o = { .metric = metric };
    int64_t *only = NULL, *skip = NULL, *extra_ids = NULL;
    float *extra = NULL;
    size_t nonly = 0, nskip = 0, nextra = 0;
    int rc = SQLITE_OK;
    if (a_ids && sqlite3_value_type(a_ids) == SQLITE_NULL) a_ids = NULL;  /* NULL: every row, as for the metric */
    if (a_ids) {
        only = ek_parse_ids(a_ids, &nonly, &err);
        if (!only) {
            free(queries);
            char *m = err ? sqlite3_mprintf("embkv_knn: table %s: ids (argument 5): %s", ref.name, err) : NULL;
            sqlite3_free(err);
            return ekerr_vtab(pc->pVtab, m ? SQLITE_ERROR : SQLITE_NOMEM, m);
        }
        o.only = only;
        o.nonly = nonly;
    }
    /* The open transaction's writes: scored as written, the stored versions
     * left out. */
    if (rc == SQLITE_OK && ref.txn) {
        size_t slots = ektxn_nslots(ref.txn), cnt = ektxn_count(ref.txn);
        skip = malloc((cnt + 1) * sizeof *skip);
        extra_ids = malloc((cnt + 1) * sizeof *extra_ids);
        extra = malloc((cnt + 1) * dim * sizeof *extra);
        if (!skip || !extra_ids || !extra) rc = SQLITE_NOMEM;
        for (size_t i = 0; i < slots && rc == SQLITE_OK; i++) {
            const ektxn_entry *e = ektxn_slot(ref.txn, i);
            if (!e) continue;
            skip[nskip++] = e->id;
            if (e->kind != EKTXN_PUT) continue;
            bool wanted = !a_ids;
            for (size_t j = 0; j < nonly && !wanted; j++) wanted = only[j] == e->id;
            if (!wanted) continue;
            extra_ids[nextra] = e->id;
            memcpy(extra + nextra * dim, e->vec, (size_t)dim * sizeof *extra);
            nextra++;
        }
        o.skip = skip;
        o.nskip = nskip;
        o.extra_ids = extra_ids;
        o.extra_vecs = extra;
        o.nextra = nextra;
    }
    if (rc == SQLITE_OK) {
        c->ids = malloc(nq * k * sizeof *c->ids);
        c->dist = malloc(nq * k * sizeof *c->dist);
        c->found = malloc(nq * sizeof *c->found);
        if (!c->ids || !c->dist || !c->found) rc = SQLITE_NOMEM;
    }
    int erc = EMBKV_OK;
    if (rc == SQLITE_OK) erc = embkv_knn(ref.store, queries, nq, k, &o, c->ids, c->dist, c->found);
    free(queries);
    sqlite3_free(only);
    free(skip);
    free(extra_ids);
    free(extra);
    if (rc != SQLITE_OK) {
        knn_reset(c);
        return rc;
    }
    if (erc != EMBKV_OK) {
        /* (The engine's message names its function too: said once.) */
        const char *why = erc == EMBKV_NOMEM ? "out of memory" : embkv_errmsg();
        if (strncmp(why, "embkv_knn: ", 11) == 0) why += 11;
        knn_reset(c);
        return ekerr_vtab(pc->pVtab, ekerr_rc(erc), sqlite3_mprintf("embkv_knn: table %s: %s", ref.name, why));
    }
    if (a_ids && !(c->ids_arg = sqlite3_value_dup(a_ids))) {
        knn_reset(c);
        return SQLITE_NOMEM;
    }
    c->nq = nq;
    c->k = k;
    knn_settle(c);
    return SQLITE_OK;
}

static int knn_next(sqlite3_vtab_cursor *pc)
{
    knncur *c = (knncur *)pc;
    c->r++;
    knn_settle(c);
    return SQLITE_OK;
}

static int knn_eof(sqlite3_vtab_cursor *pc)
{
    knncur *c = (knncur *)pc;
    return c->q >= c->nq;
}

static int knn_column(sqlite3_vtab_cursor *pc, sqlite3_context *ctx, int col)
{
    knncur *c = (knncur *)pc;
    size_t at = c->q * c->k + c->r;
    switch (col) {
    case KC_ID: sqlite3_result_int64(ctx, c->ids[at]); break;
    case KC_DISTANCE: sqlite3_result_double(ctx, c->dist[at]); break;
    case KC_QUERY: sqlite3_result_int64(ctx, (sqlite3_int64)c->q); break;
    case KC_RANK: sqlite3_result_int64(ctx, (sqlite3_int64)c->r + 1); break;
    case KC_TABLE: sqlite3_result_text(ctx, c->name, -1, SQLITE_TRANSIENT); break;
    case KC_K: sqlite3_result_int64(ctx, (sqlite3_int64)c->k); break;
    case KC_METRIC: sqlite3_result_text(ctx, c->metric, -1, SQLITE_TRANSIENT); break;
    case KC_IDS:
        if (c->ids_arg) sqlite3_result_value(ctx, c->ids_arg);
        else sqlite3_result_null(ctx);
        break;
    default: sqlite3_result_null(ctx); break;
    }
    return SQLITE_OK;
}

static int knn_rowid(sqlite3_vtab_cursor *pc, sqlite3_int64 *r)
{
    knncur *c = (knncur *)pc;
    *r = (sqlite3_int64)(c->q * c->k + c->r) + 1;
    return SQLITE_OK;
}

static const sqlite3_module knn_module = {
    .iVersion = 1,
    .xCreate = NULL, /* eponymous only */
    .xConnect = knn_connect,
    .xBestIndex = knn_best_index,
    .xDisconnect = knn_disconnect,
    .xDestroy = knn_disconnect,
    .xOpen = knn_open,
    .xClose = knn_close,
    .xFilter = knn_filter,
    .xNext = knn_next,
    .xEof = knn_eof,
    .xColumn = knn_column,
    .xRowid = knn_rowid,
};

int embkv_knn_register(sqlite3 *db)
{
    return sqlite3_create_module_v2(db, "embkv_knn", &knn_module, NULL, NULL);
}
