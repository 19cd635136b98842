/*
 * stats.c - SQL functions over a named embkv table:
 *   embkv_table_lookup()  (C, binding.h) resolves a table name of a
 *                         connection to its store and options;
 *   embkv_stats(table)    statistics as JSON (cJSON);
 *   embkv_checkpoint(table)  embkv_sync, returning the durable epoch;
 *   embkv_evict(table)    an eviction pass (embkv_evict), what it did as JSON.
 * The SQL functions are SQLITE_DIRECTONLY.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

static int schema_rank(const char *zDb)
{
    if (sqlite3_stricmp(zDb, "temp") == 0) return 0;
    if (sqlite3_stricmp(zDb, "main") == 0) return 1;
    return 2;
}

static ekvtab *find_connected(ekconn *c, const char *zDb, const char *zName)
{
    /* An instance without a store (a dropped table's or a rolled-back
     * CREATE's, kept by a cached statement) only if no live one has the
     * name: it is there to say why. */
    ekvtab *best = NULL;
    for (ekvtab *v = c->tabs; v; v = v->next) {
        if (sqlite3_stricmp(v->zName, zName) != 0) continue;
        if (zDb && sqlite3_stricmp(v->zDb, zDb) != 0) continue;
        int live = v->store && !v->gone, best_live = best && best->store && !best->gone;
        if (!best || (!best_live && live) || (!zDb && best_live == live && schema_rank(v->zDb) < schema_rank(best->zDb)))
            best = v;
    }
    return best;
}

/* Makes SQLite connect the table (if it exists) by preparing a query on it;
 * on failure *why is SQLite's reason (no such table, or why it could not
 * connect: its store open in another process...). */
static int touch_table(sqlite3 *db, const char *zDb, const char *zName, char **why)
{
    char *sql = zDb ? sqlite3_mprintf("SELECT 1 FROM \"%w\".\"%w\" LIMIT 0", zDb, zName)
                    : sqlite3_mprintf("SELECT 1 FROM \"%w\" LIMIT 0", zName);
    if (!sql) return SQLITE_NOMEM;
    sqlite3_stmt *st = NULL;
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK) {
        sqlite3_free(*why);
        *why = sqlite3_mprintf("%s", sqlite3_errmsg(db));
    }
    sqlite3_finalize(st);
    sqlite3_free(sql);
    return rc;
}

/* One identifier of a table name at *p: "quoted" (with "" for a quote),
 * [bracketed], `quoted` (with ``), or a bare run up to the next dot; its
 * text (sqlite3_malloc'd) or NULL, *p after it. */
static char *ident(const char **p)
{
    const char *s = *p;
    char close = *s == '"' ? '"' : *s == '[' ? ']' : *s == '`' ? '`' : 0;
    if (!close) {
        size_t n = strcspn(s, ".");
        if (!n) return NULL;
        *p = s + n;
        return sqlite3_mprintf("%.*s", (int)n, s);
    }
    char *out = sqlite3_malloc64(strlen(s) + 1);
    if (!out) return NULL;
    size_t k = 0;
    for (s++; *s; s++) {
        if (*s == close) {
            if (close != ']' && s[1] == close) {
                out[k++] = *s++;
                continue;
            }
            out[k] = 0;
            *p = s + 1;
            return out;
        }
        out[k++] = *s;
    }
    sqlite3_free(out); /* unterminated */
    return NULL;
}

/* Splits a table name the way SQL reads one: "table", "schema.table", each
 * part bare or quoted ("...", [...], `...`).  *zDb is NULL without a schema,
 * or when the name does not read as schema.table or names no schema of the
 * connection: then the whole text is the table's name, as before schemas
 * were read (a table named "o.item" in main stays reachable as 'o.item'
 * while no schema o is attached).  SQLITE_OK or SQLITE_NOMEM. */
static int split_name(sqlite3 *db, const char *table, char **zDb, char **zName)
{
    *zDb = *zName = NULL;
    const char *p = table;
    char *a = ident(&p), *b = NULL;
    int dotted = a && *p == '.';
    if (dotted) {
        p++;
        b = ident(&p);
    }
    /* ("main." names no table: taken whole, as a name that is not found) */
    if (a && !*p && (!dotted || b) && (!b || sqlite3_stricmp(a, "temp") == 0 || sqlite3_db_filename(db, a) != NULL)) {
        *zDb = b ? a : NULL;
        *zName = b ? b : a;
        if (!b) a = NULL;
        else a = b = NULL;
    } else {
        *zName = sqlite3_mprintf("%s", table);
    }
    sqlite3_free(a);
    sqlite3_free(b);
    return *zName ? SQLITE_OK : SQLITE_NOMEM;
}

/* Whether the schema declares zName an embkv virtual table (which this
 * copy of the extension did not connect: another copy loaded on the
 * connection did, whose module its xConnect went to). */
static int declared_embkv(sqlite3 *db, const char *zDb, const char *zName)
{
    char *sql = sqlite3_mprintf("SELECT 1 FROM \"%w\".sqlite_schema WHERE type = 'table' AND name = ?1 COLLATE "
                                "NOCASE AND lower(sql) GLOB 'create virtual table*using*embkv*'", zDb ? zDb : "main");
    if (!sql) return 0;
    sqlite3_stmt *st = NULL;
    int yes = sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
              sqlite3_bind_text(st, 1, zName, -1, SQLITE_STATIC) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW;
    sqlite3_finalize(st);
    sqlite3_free(sql);
    return yes;
}

static ekvtab *resolve(ekconn *c, const char *table, char **err)
{
    /* A plain name of a connected table, as training loops pass on every
     * call: found without parsing (nothing to unquote or split). */
    ekvtab *v = strpbrk(table, ".\"[`") ? NULL : find_connected(c, NULL, table);
    if (v) return v;
    char *zDb = NULL, *zName = NULL;
    if (split_name(c->db, table, &zDb, &zName) != SQLITE_OK) return NULL;
    v = find_connected(c, zDb, zName);
    char *why = NULL;
    int rc = SQLITE_OK;
    if (!v) {
        rc = touch_table(c->db, zDb, zName, &why);
        if (rc == SQLITE_OK) v = find_connected(c, zDb, zName);
    }
    if (!v && rc == SQLITE_OK && declared_embkv(c->db, zDb, zName))
        *err = sqlite3_mprintf("%s is an embkv table connected through another copy of the embkv extension "
                               "loaded on this connection (two extension files: the functions are the last "
                               "one's): load one copy in a process", table);
    else if (!v)
        *err = rc == SQLITE_OK ? sqlite3_mprintf("%s is not an embkv table", table)
                               : sqlite3_mprintf("%s", why ? why : "out of memory");
    sqlite3_free(why);
    sqlite3_free(zDb);
    sqlite3_free(zName);
    return v;
}

int embkv_table_lookup(sqlite3 *db, const char *table, embkv_table_ref *out, char **pzErr)
{
    if (pzErr) *pzErr = NULL;
    memset(out, 0, sizeof *out);
    char *err = NULL;
    ekconn *c = ekconn_of(db);
    ekvtab *v = NULL;
    if (!table) err = sqlite3_mprintf("the table name is NULL");
    else if (!c) err = sqlite3_mprintf("embkv is not loaded on this connection");
    else v = resolve(c, table, &err);
    int rc = SQLITE_ERROR;
    if (v && (v->gone || !v->store)) {
        err = sqlite3_mprintf("table %s: %s", v->zName, v->gone ? v->gone : v->broken);
        if (!v->gone && v->broken_rc) rc = v->broken_rc;
        v = NULL;
    }
    if (!v) {
        if (pzErr) *pzErr = err;
        else sqlite3_free(err);
        return err ? rc : SQLITE_NOMEM;
    }
    out->store = v->store;
    out->opts = &v->opts;
    out->schema = v->zDb;
    out->name = v->zName;
    out->dir = v->dir;
    out->pending_writes = ektxn_count(v->txn);
    out->txn = out->pending_writes ? v->txn : NULL;
    if (!v->session && embkv_session_open(v->store, &v->session) != EMBKV_OK) v->session = NULL;
    out->session = v->session;
    return SQLITE_OK;
}

/* ------------------------------------------------------------------------
 * embkv_stats(table) and embkv_checkpoint(table)
 */
static int fn_table(sqlite3_context *ctx, const char *fname, sqlite3_value *arg, embkv_table_ref *ref)
{
    bool nul;
    const char *name = ek_name_arg(arg, &nul);
    if (!name) {
        char *m = nul ? sqlite3_mprintf("%s: the table name " EK_NAME_NUL, fname)
                      : sqlite3_mprintf("%s: expected a table name (TEXT)", fname);
        sqlite3_result_error(ctx, m ? m : fname, -1);
        sqlite3_free(m);
        return SQLITE_ERROR;
    }
    char *err = NULL;
    int rc = embkv_table_lookup(sqlite3_context_db_handle(ctx), name, ref, &err);
    if (rc != SQLITE_OK) {
        char *m = sqlite3_mprintf("%s: %s", fname, err ? err : "out of memory");
        sqlite3_result_error(ctx, m ? m : fname, -1);
        if (rc == SQLITE_NOMEM) sqlite3_result_error_nomem(ctx);
        else sqlite3_result_error_code(ctx, rc);
        sqlite3_free(m);
        sqlite3_free(err);
        return rc;
    }
    return SQLITE_OK;
}

static void fn_engine_error(sqlite3_context *ctx, const char *fname, const embkv_table_ref *ref, int erc)
{
    char *m = sqlite3_mprintf("%s: table %s: %s", fname, ref->name, embkv_errmsg());
    sqlite3_result_error(ctx, m ? m : fname, -1);
    sqlite3_result_error_code(ctx, erc == EMBKV_NOMEM      ? SQLITE_NOMEM
                                   : erc == EMBKV_IO       ? SQLITE_IOERR
                                   : erc == EMBKV_READONLY ? SQLITE_READONLY
                                                           : SQLITE_ERROR);
    sqlite3_free(m);
}

static void fn_stats(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    if (fn_table(ctx, "embkv_stats", argv[0], &ref) != SQLITE_OK) return;
    embkv_stats st;
    embkv_train_stats ts;
    double pmean = 0;
    uint32_t pmax = 0;
    int erc = embkv_stats_get(ref.store, &st);
    if (erc == EMBKV_OK) erc = embkv_probe_stats(ref.store, &pmean, &pmax);
    if (erc == EMBKV_OK) erc = embkv_train_stats_get(ref.store, &ts);
    if (erc != EMBKV_OK) {
        fn_engine_error(ctx, "embkv_stats", &ref, erc);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *tiers = NULL, *pm = NULL, *ix = NULL, *ops = NULL, *dur = NULL, *tr = NULL;
    int ok = o != NULL;
    ok = ok && cJSON_AddStringToObject(o, "table", ref.name);
    ok = ok && cJSON_AddStringToObject(o, "schema", ref.schema);
    ok = ok && cJSON_AddStringToObject(o, "path", ref.dir);
    ok = ok && cJSON_AddNumberToObject(o, "dim", embkv_dim(ref.store));
    ok = ok && cJSON_AddStringToObject(o, "dtype", embkv_dtype_name(embkv_dtype(ref.store)));
    ok = ok && cJSON_AddNumberToObject(o, "state_floats", embkv_state_floats(ref.store));
    ok = ok && cJSON_AddNumberToObject(o, "rows", (double)st.rows);
    ok = ok && cJSON_AddNumberToObject(o, "pending_writes", (double)ref.pending_writes);
    ok = ok && cJSON_AddNumberToObject(o, "record_bytes", (double)st.record_bytes);
    ok = ok && (tiers = cJSON_AddObjectToObject(o, "tiers")) != NULL;
    if (ok && st.cache_capacity_rows) {
        /* The DRAM cache, when the table has one. */
        cJSON *dram = cJSON_AddObjectToObject(tiers, "dram");
        uint64_t looked = st.cache_hits + st.cache_misses;
        ok = dram != NULL;
        ok = ok && cJSON_AddNumberToObject(dram, "rows", (double)st.cache_rows);
        ok = ok && cJSON_AddNumberToObject(dram, "capacity_rows", (double)st.cache_capacity_rows);
        ok = ok && cJSON_AddNumberToObject(dram, "bytes", (double)st.cache_bytes);
        ok = ok && cJSON_AddBoolToObject(dram, "huge_pages", st.cache_huge_pages != 0);
        ok = ok && cJSON_AddNumberToObject(dram, "dirty_rows", (double)st.cache_dirty);
        ok = ok && cJSON_AddNumberToObject(dram, "hits", (double)st.cache_hits);
        ok = ok && cJSON_AddNumberToObject(dram, "misses", (double)st.cache_misses);
        ok = ok && cJSON_AddNumberToObject(dram, "hit_rate", looked ? (double)st.cache_hits / (double)looked : 0.0);
        ok = ok && cJSON_AddNumberToObject(dram, "admissions", (double)st.cache_admissions);
        ok = ok && cJSON_AddNumberToObject(dram, "refused", (double)st.cache_refused);
        ok = ok && cJSON_AddNumberToObject(dram, "evictions", (double)st.cache_evictions);
        ok = ok && cJSON_AddNumberToObject(dram, "write_backs", (double)st.cache_writebacks);
        ok = ok && cJSON_AddNumberToObject(dram, "migrations", (double)st.hotset_to_dram);
    }
    ok = ok && (pm = cJSON_AddObjectToObject(tiers, "pm")) != NULL;
    ok = ok && cJSON_AddNumberToObject(pm, "rows", (double)st.rows_pm);
    ok = ok && cJSON_AddNumberToObject(pm, "bytes", (double)st.pool_used_bytes);
    ok = ok && cJSON_AddNumberToObject(pm, "capacity_bytes", (double)st.pool_bytes);
    ok = ok && cJSON_AddBoolToObject(pm, "is_pmem", st.is_pmem != 0);
    ok = ok && cJSON_AddStringToObject(pm, "pool_advice", st.pool_advice_random ? "random" : "normal");
    if (ok && st.ssd_size) {
        /* The SSD tier, when the table has one. */
        cJSON *ssd = cJSON_AddObjectToObject(tiers, "ssd");
        ok = ssd != NULL;
        ok = ok && cJSON_AddNumberToObject(ssd, "rows", (double)st.rows_ssd);
        ok = ok && cJSON_AddNumberToObject(ssd, "bytes", (double)st.ssd_live_bytes);
        ok = ok && cJSON_AddNumberToObject(ssd, "file_bytes", (double)st.ssd_file_bytes);
        ok = ok && cJSON_AddNumberToObject(ssd, "capacity_bytes", (double)st.ssd_size);
        ok = ok && cJSON_AddNumberToObject(ssd, "segments", (double)st.ssd_segments);
        ok = ok && cJSON_AddNumberToObject(ssd, "damaged_segments", (double)st.ssd_damaged_segments);
        /* Live bytes above the files' (a segment file lost: see
         * damaged_segments) are no negative garbage. */
        ok = ok && cJSON_AddNumberToObject(ssd, "garbage_fraction",
                                           st.ssd_file_bytes > st.ssd_live_bytes
                                               ? 1.0 - (double)st.ssd_live_bytes / (double)st.ssd_file_bytes
                                               : 0.0);
        ok = ok && cJSON_AddNumberToObject(ssd, "reads", (double)st.ssd_reads);
        ok = ok && cJSON_AddNumberToObject(ssd, "read_bytes", (double)st.ssd_read_bytes);
        ok = ok && cJSON_AddNumberToObject(ssd, "writes", (double)st.ssd_writes);
        ok = ok && cJSON_AddNumberToObject(ssd, "write_bytes", (double)st.ssd_write_bytes);
        ok = ok && cJSON_AddNumberToObject(ssd, "syncs", (double)st.ssd_syncs);
        ok = ok && cJSON_AddNumberToObject(ssd, "mean_queue_depth", st.ssd_mean_read_depth);
        ok = ok && cJSON_AddBoolToObject(ssd, "io_uring", st.ssd_uring != 0);
        ok = ok && cJSON_AddBoolToObject(ssd, "o_direct", st.ssd_direct != 0);
        if (st.ssd_fallback[0]) ok = ok && cJSON_AddStringToObject(ssd, "fallback", st.ssd_fallback);
        ok = ok && cJSON_AddNumberToObject(ssd, "demotions", (double)st.demotions);
        ok = ok && cJSON_AddNumberToObject(ssd, "promotions", (double)st.promotions);
        ok = ok && cJSON_AddNumberToObject(ssd, "compactions", (double)st.compactions);
        ok = ok && cJSON_AddNumberToObject(ssd, "compacted_rows", (double)st.compacted_rows);
        ok = ok && cJSON_AddNumberToObject(ssd, "write_amplification", st.write_amplification);
        ok = ok && cJSON_AddNumberToObject(ssd, "read_wait_ms", st.ssd_wait_ms);
        cJSON *la = ok ? cJSON_AddObjectToObject(ssd, "lookahead") : NULL;
        ok = la != NULL;
        ok = ok && cJSON_AddNumberToObject(la, "queued", (double)st.lookahead_queued);
        ok = ok && cJSON_AddNumberToObject(la, "hits", (double)st.lookahead_hits);
        ok = ok && cJSON_AddNumberToObject(la, "late", (double)st.lookahead_late);
        ok = ok && cJSON_AddNumberToObject(la, "wasted", (double)st.lookahead_wasted);
        ok = ok && cJSON_AddNumberToObject(la, "staged", (double)st.lookahead_staged);
        ok = ok && cJSON_AddNumberToObject(la, "capacity_rows", (double)st.lookahead_capacity);
        ok = ok && cJSON_AddNumberToObject(la, "wait_ms", (double)st.lookahead_wait_ns / 1e6);
    }
    ok = ok && (ix = cJSON_AddObjectToObject(o, "index")) != NULL;
    ok = ok && cJSON_AddNumberToObject(ix, "buckets", (double)st.buckets);
    ok = ok && cJSON_AddNumberToObject(ix, "slots_per_bucket", st.slots_per_bucket);
    ok = ok && cJSON_AddNumberToObject(ix, "bucket_bytes", st.bucket_bytes);
    ok = ok && cJSON_AddNumberToObject(ix, "load_factor", st.load_factor);
    ok = ok && cJSON_AddNumberToObject(ix, "probes_per_lookup", pmean);
    ok = ok && cJSON_AddNumberToObject(ix, "max_probes", pmax);
    ok = ok && cJSON_AddNumberToObject(ix, "resizes", (double)st.resizes);
    ok = ok && (ops = cJSON_AddObjectToObject(o, "ops")) != NULL;
    ok = ok && cJSON_AddNumberToObject(ops, "gets", (double)st.gets);
    ok = ok && cJSON_AddNumberToObject(ops, "batch_gets", (double)st.batch_gets);
    ok = ok && cJSON_AddNumberToObject(ops, "puts", (double)st.puts);
    ok = ok && cJSON_AddNumberToObject(ops, "deletes", (double)st.deletes);
    ok = ok && cJSON_AddNumberToObject(ops, "hot_moves", (double)st.hot_moves);
    ok = ok && cJSON_AddNumberToObject(ops, "hotset_to_pm", (double)st.hotset_to_pm);
    ok = ok && cJSON_AddNumberToObject(ops, "hotset_to_dram", (double)st.hotset_to_dram);
    if (ok && st.migrate_rate) {
        /* migrate='auto': its moves are also in hot_moves and hotset_*. */
        cJSON *mg = cJSON_AddObjectToObject(o, "migration");
        ok = mg != NULL;
        ok = ok && cJSON_AddNumberToObject(mg, "rate", (double)st.migrate_rate);
        ok = ok && cJSON_AddNumberToObject(mg, "rounds", (double)st.migrate_rounds);
        ok = ok && cJSON_AddNumberToObject(mg, "moved", (double)st.migrate_moved);
        ok = ok && cJSON_AddNumberToObject(mg, "errors", (double)st.migrate_errors);
    }
    if (ok && (st.gpu_registered || st.gpu_gathers || st.gpu_sums)) {
        /* Device gathers and sums (docs/gpu.md), from the first on. */
        cJSON *gpu = cJSON_AddObjectToObject(o, "gpu");
        ok = gpu != NULL;
        ok = ok && cJSON_AddNumberToObject(gpu, "gathers", (double)st.gpu_gathers);
        ok = ok && cJSON_AddNumberToObject(gpu, "rows_from_pool", (double)st.gpu_rows_direct);
        ok = ok && cJSON_AddNumberToObject(gpu, "rows_staged", (double)st.gpu_rows_staged);
        ok = ok && cJSON_AddNumberToObject(gpu, "bytes", (double)st.gpu_bytes);
        ok = ok && cJSON_AddNumberToObject(gpu, "cpu_ms", (double)st.gpu_ns / 1e6);
        ok = ok && cJSON_AddNumberToObject(gpu, "sums", (double)st.gpu_sums);
        ok = ok && cJSON_AddNumberToObject(gpu, "sum_rows", (double)st.gpu_sum_rows);
        ok = ok && cJSON_AddBoolToObject(gpu, "pool_registered", st.gpu_registered > 0);
        ok = ok && (st.gpu_registered > 0 || cJSON_AddStringToObject(gpu, "staged_why", st.gpu_note));
        ok = ok && cJSON_AddNumberToObject(gpu, "in_flight", (double)st.gpu_inflight);
    }
    cJSON *heat = ok ? cJSON_AddObjectToObject(o, "heat") : NULL;
    ok = heat != NULL;
    ok = ok && cJSON_AddBoolToObject(heat, "counting", st.heat_counting != 0);
    ok = ok && cJSON_AddNumberToObject(heat, "touches", (double)st.heat_touches);
    ok = ok && cJSON_AddNumberToObject(heat, "agings", (double)st.heat_agings);
    ok = ok && cJSON_AddNumberToObject(heat, "bytes", (double)st.heat_bytes);
    ok = ok && (dur = cJSON_AddObjectToObject(o, "durability")) != NULL;
    ok = ok && cJSON_AddNumberToObject(dur, "durable_epoch", (double)st.durable_epoch);
    ok = ok && cJSON_AddNumberToObject(dur, "syncs", (double)st.syncs);
    ok = ok && cJSON_AddNumberToObject(dur, "last_sync_ms", st.last_sync_ms);
    ok = ok && cJSON_AddBoolToObject(dur, "recovered", st.recovered != 0);
    ok = ok && (tr = cJSON_AddObjectToObject(o, "training")) != NULL;
    ok = ok && cJSON_AddNumberToObject(tr, "pulls", (double)ts.pulls);
    ok = ok && cJSON_AddNumberToObject(tr, "pushes", (double)ts.pushes);
    ok = ok && cJSON_AddNumberToObject(tr, "rows_created", (double)ts.rows_created);
    ok = ok && cJSON_AddNumberToObject(tr, "permit_waits", (double)ts.permit_waits);
    ok = ok && cJSON_AddNumberToObject(tr, "permit_timeouts", (double)ts.permit_timeouts);
    if (ok && ref.opts->train.admit_count > 1) {
        /* Admission, on tables that have it: rows created are the admitted. */
        cJSON *ad = cJSON_AddObjectToObject(tr, "admission");
        ok = ad != NULL;
        ok = ok && cJSON_AddNumberToObject(ad, "count", (double)ref.opts->train.admit_count);
        ok = ok && cJSON_AddNumberToObject(ad, "admitted", (double)ts.rows_created);
        ok = ok && cJSON_AddNumberToObject(ad, "refused", (double)ts.admit_refused);
        ok = ok && cJSON_AddNumberToObject(ad, "dropped_gradients", (double)ts.admit_dropped);
        ok = ok && cJSON_AddNumberToObject(ad, "bytes", (double)ts.admit_bytes);
    }
    const embkv_train_options *to = &ref.opts->train;
    if (ok && (to->ttl_ms || to->ttl_steps || to->max_rows)) {
        /* Eviction, on tables that have it. */
        cJSON *ev = cJSON_AddObjectToObject(tr, "eviction");
        char ttl[24];
        ek_format_ttl(to->ttl_ms, ttl, sizeof ttl);
        ok = ev != NULL;
        ok = ok && cJSON_AddStringToObject(ev, "ttl", ttl);
        char num[24];
        snprintf(num, sizeof num, "%llu", (unsigned long long)to->ttl_steps);  /* (up to 2^62: no double holds it) */
        ok = ok && cJSON_AddRawToObject(ev, "ttl_steps", num);
        ok = ok && cJSON_AddNumberToObject(ev, "max_rows", (double)to->max_rows);
        ok = ok && cJSON_AddStringToObject(ev, "evict", to->evict == EMBKV_EVICT_LRU ? "lru" : "lfu");
        snprintf(num, sizeof num, "%llu", (unsigned long long)ts.steps);
        ok = ok && cJSON_AddRawToObject(ev, "step", num);
        ok = ok && cJSON_AddNumberToObject(ev, "passes", (double)ts.evict_passes);
        ok = ok && cJSON_AddNumberToObject(ev, "expired", (double)ts.evicted_expired);
        ok = ok && cJSON_AddNumberToObject(ev, "over_max_rows", (double)ts.evicted_over);
        ok = ok && cJSON_AddNumberToObject(ev, "kept_pulled", (double)ts.evict_kept);
    }
    char *text = ok ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    if (!text) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_text(ctx, text, -1, SQLITE_TRANSIENT);
    cJSON_free(text);
}

static void fn_checkpoint(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    if (fn_table(ctx, "embkv_checkpoint", argv[0], &ref) != SQLITE_OK) return;
    if (ekerr_refuse_readonly(ctx, "embkv_checkpoint", ref.schema, ref.name, "it makes the rows written so far durable", ref.store))
        return;
    embkv_stats st;
    pthread_mutex_t *held = ekreg_commit_lock(ref.store);
    int erc = embkv_sync(ref.store);
    ekreg_commit_unlock(held);
    if (erc == EMBKV_OK) erc = embkv_stats_get(ref.store, &st);
    if (erc != EMBKV_OK) {
        fn_engine_error(ctx, "embkv_checkpoint", &ref, erc);
        return;
    }
    sqlite3_result_int64(ctx, (sqlite3_int64)st.durable_epoch);
}

static void fn_evict(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    if (fn_table(ctx, "embkv_evict", argv[0], &ref) != SQLITE_OK) return;
    if (ekerr_refuse_readonly(ctx, "embkv_evict", ref.schema, ref.name, "it deletes rows", ref.store))
        return;
    if (ref.pending_writes) {
        /* (its deletes are not the transaction's: a ROLLBACK would not undo them) */
        char *m = sqlite3_mprintf("embkv_evict: table %s: this connection has uncommitted writes to the table; "
                                  "COMMIT them first", ref.name);
        sqlite3_result_error(ctx, m ? m : "embkv_evict: uncommitted writes", -1);
        sqlite3_free(m);
        return;
    }
    embkv_evict_result r;
    pthread_mutex_t *held = ekreg_commit_lock(ref.store);
    int erc = embkv_evict(ref.store, &r);
    ekreg_commit_unlock(held);
    if (erc != EMBKV_OK) {
        fn_engine_error(ctx, "embkv_evict", &ref, erc);
        return;
    }
    char *text = sqlite3_mprintf("{\"scanned\":%llu,\"expired\":%llu,\"over_max_rows\":%llu,\"kept_pulled\":%llu,"
                                 "\"left\":%llu}",
                                 (unsigned long long)r.scanned, (unsigned long long)r.expired,
                                 (unsigned long long)r.over, (unsigned long long)r.kept, (unsigned long long)r.left);
    if (!text) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_text(ctx, text, -1, sqlite3_free);
}

int ekfn_register(sqlite3 *db, ekconn *c)
{
    /* Side effects (a sync) or file-system paths in the result: only from
     * top-level SQL, never from views, triggers or schema. */
    const int flags = SQLITE_UTF8 | SQLITE_DIRECTONLY;
    int rc;
    ekconn_ref(c);
    rc = sqlite3_create_function_v2(db, "embkv_stats", 1, flags, c, fn_stats, NULL, NULL, ekconn_unref_v);
    if (rc != SQLITE_OK) return rc;
    ekconn_ref(c);
    rc = sqlite3_create_function_v2(db, "embkv_checkpoint", 1, flags, c, fn_checkpoint, NULL, NULL, ekconn_unref_v);
    if (rc != SQLITE_OK) return rc;
    ekconn_ref(c);
    return sqlite3_create_function_v2(db, "embkv_evict", 1, flags, c, fn_evict, NULL, NULL, ekconn_unref_v);
}

