/*
 * train.c - the training functions of the SQLite binding:
 *   embkv_pull(table, ids)              -> BLOB of len(ids)*dim float32
 *     (a fourth argument, for language bindings only: the array the rows
 *     go into, through direct.c; the result is then their number)
 *   embkv_push(table, ids, grads [,lr]) -> number of distinct rows updated
 *   embkv_release(table, ids)           -> number of permits returned
 *   embkv_lookahead(table, ids)         -> number of SSD rows whose reads were queued
 *   embkv_get_device / embkv_pull_device / embkv_push_device, embkv_gpu():
 *     the same into and from device memory (addresses and streams as
 *     INTEGERs; docs/gpu.md)
 * ids: an int64 little-endian BLOB, a JSON array of integers, or one integer.
 * grads: a float32 BLOB of len(ids)*dim, or a JSON array of that many numbers.
 *
 * Each connection pulls and pushes through its own engine session (kept by
 * the table instance of that connection), so the staleness permits it holds
 * go back when the connection closes.  Training writes go straight to the
 * store: they are not part of the SQL transaction (a ROLLBACK does not undo
 * a push) and become durable at the next embkv_checkpoint or COMMIT.  To
 * keep the two worlds apart, a connection with uncommitted SQL writes to the
 * table cannot pull or push it until it commits.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Result error "fname: table T: message" with the engine's code mapped. */
static void train_error(sqlite3_context *ctx, const char *fname, const char *table, int rc, const char *msg)
{
    /* (the engine's message may name the C function the SQL one calls:
     * the SQL function's name is said once) */
    size_t fl = strlen(fname);
    if (strncmp(msg, fname, fl) == 0 && msg[fl] == ':' && msg[fl + 1] == ' ')
        msg += fl + 2;
    char *m = table ? sqlite3_mprintf("%s: table %s: %s", fname, table, msg) : sqlite3_mprintf("%s: %s", fname, msg);
    sqlite3_result_error(ctx, m ? m : msg, -1);
    sqlite3_free(m);
    switch (rc) {
    case EMBKV_BUSY: sqlite3_result_error_code(ctx, SQLITE_BUSY); break;
    case EMBKV_NOMEM: sqlite3_result_error_nomem(ctx); break;
    case EMBKV_FULL: sqlite3_result_error_code(ctx, SQLITE_FULL); break;
    case EMBKV_READONLY: sqlite3_result_error_code(ctx, SQLITE_READONLY); break;
    /* A missing id is the caller's error (SQLITE_ERROR): SQLITE_NOTFOUND
     * is SQLite's internal code, which Python raises as InternalError. */
    default: break;
    }
}

/* An engine error of a pull or push on ref's table; a full pool of a
 * table that evicts gets the way out that works now (a pass deletes what
 * checkpoints hold, and frees their tombstones' room at the next). */
static void engine_error(sqlite3_context *ctx, const char *fname, const embkv_table_ref *ref, int rc)
{
    const embkv_train_options *t = &ref->opts->train;
    if (rc == EMBKV_FULL && (t->max_rows || t->ttl_ms || t->ttl_steps)) {
        char *m = sqlite3_mprintf("%s (the table evicts, and its eviction thread passes about once a second: "
                                  "SELECT embkv_checkpoint('%q'), embkv_evict('%q') makes room now; eviction "
                                  "keeps rows pulled and not yet pushed: push them, or return them with "
                                  "embkv_release, first)",
                                  embkv_errmsg(), ref->name, ref->name);
        train_error(ctx, fname, ref->name, rc, m ? m : embkv_errmsg());
        sqlite3_free(m);
        return;
    }
    train_error(ctx, fname, ref->name, rc, embkv_errmsg());
}

/* Gradients: a float32 BLOB or a JSON array of n*dim numbers.  A BLOB
 * aligned for floats (SQLite's copies of bound BLOBs are) is read where it
 * is, *owned false: a step's gradients are megabytes, and the copy cost
 * as much as summing them. */
static const float *parse_grads(sqlite3_value *v, size_t n, uint32_t dim, bool *owned, char **err)
{
    size_t want = n * dim;
    *err = NULL;
    *owned = true;
    if (sqlite3_value_type(v) == SQLITE_BLOB) {
        size_t bytes = (size_t)sqlite3_value_bytes(v);
        if (bytes != want * 4) {
            *err = sqlite3_mprintf("grads must be %llu float32 (%llu ids x dim %u = %llu-byte BLOB), got a %llu-byte "
                                   "BLOB", (unsigned long long)want, (unsigned long long)n, dim,
                                   (unsigned long long)want * 4, (unsigned long long)bytes);
            return NULL;
        }
        const void *b = sqlite3_value_blob(v);
        if (((uintptr_t)b & (_Alignof(float) - 1)) == 0 && b) {
            *owned = false;
            return b;
        }
        float *g = sqlite3_malloc64(bytes ? bytes : 1);
        if (g)
            memcpy(g, b, bytes);
        return g;
    }
    if (sqlite3_value_type(v) == SQLITE_TEXT) {
        cJSON *j = ek_json_parse((const char *)sqlite3_value_text(v), (size_t)sqlite3_value_bytes(v));
        if (!j || !cJSON_IsArray(j) || (size_t)cJSON_GetArraySize(j) != want) {
            *err = sqlite3_mprintf("grads must be a JSON array of %llu numbers (%llu ids x dim %u)",
                                   (unsigned long long)want, (unsigned long long)n, dim);
            cJSON_Delete(j);
            return NULL;
        }
        float *g = sqlite3_malloc64(want * sizeof *g);
        size_t k = 0;
        for (cJSON *e = j->child; g && e; e = e->next, k++) {
            if (!cJSON_IsNumber(e)) {
                *err = sqlite3_mprintf("grads element %llu is not a number", (unsigned long long)k);
                sqlite3_free(g);
                g = NULL;
                break;
            }
            if (isfinite(e->valuedouble) && isinf((float)e->valuedouble)) {
                /* (as a float it would be infinite, which the push refuses
                 * naming a value nobody wrote) */
                *err = sqlite3_mprintf("grads element %llu (row %llu of the batch, element %llu) is out of float32 "
                                       "range: %.9g", (unsigned long long)k, (unsigned long long)(k / dim),
                                       (unsigned long long)(k % dim), e->valuedouble);
                sqlite3_free(g);
                g = NULL;
                break;
            }
            g[k] = (float)e->valuedouble;
        }
        cJSON_Delete(j);
        return g;
    }
    *err = sqlite3_mprintf("grads must be a float32 BLOB or a JSON array of numbers");
    return NULL;
}

/* The ids argument, or NULL after reporting why as the function's error. */
static int64_t *ids_arg(sqlite3_context *ctx, const char *fname, const char *table, sqlite3_value *v, size_t *n)
{
    char *err = NULL;
    int64_t *ids = ek_parse_ids(v, n, &err);
    if (!ids) {
        if (err)
            train_error(ctx, fname, table, EMBKV_INVALID, err);
        else
            sqlite3_result_error_nomem(ctx);
        sqlite3_free(err);
    }
    return ids;
}

/* Resolves the table argument (reporting why not as the function's error). */
static int table_arg(sqlite3_context *ctx, const char *fname, sqlite3_value *arg, embkv_table_ref *ref)
{
    bool nul;
    const char *name = ek_name_arg(arg, &nul);
    if (!name) {
        train_error(ctx, fname, NULL, EMBKV_INVALID,
                    nul ? "the table name (argument 1) " EK_NAME_NUL : "expected a table name (TEXT) as argument 1");
        return SQLITE_ERROR;
    }
    char *err = NULL;
    int rc = embkv_table_lookup(sqlite3_context_db_handle(ctx), name, ref, &err);
    if (rc != SQLITE_OK) {
        train_error(ctx, fname, NULL, EMBKV_INVALID, err ? err : "no such embkv table");
        if (rc == SQLITE_NOMEM) sqlite3_result_error_nomem(ctx);
        else sqlite3_result_error_code(ctx, rc);
        sqlite3_free(err);
        return rc;
    }
    return SQLITE_OK;
}

/* The table argument and this connection's session on it.  A pull or a
 * push reads or writes rows, which the connection's uncommitted writes
 * would hide or be hidden by: refused then.  A release changes no row,
 * and must work whatever the connection did since its pull (a failed push
 * returns its permits through it). */
static int train_target(sqlite3_context *ctx, const char *fname, sqlite3_value *arg, embkv_table_ref *ref)
{
    if (table_arg(ctx, fname, arg, ref) != SQLITE_OK)
        return SQLITE_ERROR;
    if (ref->pending_writes && strcmp(fname, "embkv_release") != 0) {
        train_error(ctx, fname, ref->name, EMBKV_INVALID,
                    "this connection has uncommitted writes to the table; COMMIT them first");
        return SQLITE_ERROR;
    }
    /* A store this process opened read-only has no session: pulls read
     * existing rows (fn_pull), releases return nothing, pushes are refused
     * (fn_push). */
    if (!ref->session && embkv_readonly(ref->store)) return SQLITE_OK;
    if (!ref->session) {
        train_error(ctx, fname, ref->name, EMBKV_INVALID, embkv_errmsg());
        return SQLITE_ERROR;
    }
    return SQLITE_OK;
}

/* A pull on a connection that may not write (why: ekerr_readonly): the rows
 * as a batch get reads them, taking no permits (there is no push to wait
 * for) and creating no row; a missing id is the function's error, naming
 * it.  EMBKV_NOTFOUND after setting that error. */
static int pull_existing(sqlite3_context *ctx, const embkv_table_ref *ref, const int64_t *ids, size_t n, float *out,
                         const char *why)
{
    uint8_t *found = sqlite3_malloc64(n ? n : 1);
    if (!found) return EMBKV_NOMEM;
    size_t missing = 0;
    int rc = embkv_get_batch(ref->store, ids, n, out, found, &missing);
    if (rc == EMBKV_OK && missing) {
        size_t i = 0;
        while (found[i]) i++;
        char *m = sqlite3_mprintf("id %lld has no row, and this connection creates none: %s (a pull on a connection "
                                  "that may write creates it from the table's init)", (long long)ids[i], why);
        train_error(ctx, "embkv_pull", ref->name, EMBKV_NOTFOUND, m ? m : "id not found");
        sqlite3_free(m);
        rc = EMBKV_NOTFOUND;
    }
    sqlite3_free(found);
    return rc;
}

/* A pull's argument 'once' (EMBKV_PULL_ONCE), or NULL (no flag). */
static int once_arg(sqlite3_context *ctx, const char *fname, const char *table, sqlite3_value *v, unsigned *flags)
{
    *flags = 0;
    if (sqlite3_value_type(v) == SQLITE_NULL)
        return SQLITE_OK;
    const char *m = sqlite3_value_type(v) == SQLITE_TEXT ? (const char *)sqlite3_value_text(v) : NULL;
    if (!m || sqlite3_value_bytes(v) != 4 || sqlite3_stricmp(m, "once") != 0) {
        char *e = sqlite3_mprintf("argument %d must be 'once' (ids this connection holds a permit on take no "
                                  "other) or NULL, not %s%s%s",
                                  strcmp(fname, "embkv_pull") == 0 ? 3 : 5, m ? "'" : "",
                                  m                                        ? m
                                  : sqlite3_value_type(v) == SQLITE_INTEGER ? "an INTEGER"
                                  : sqlite3_value_type(v) == SQLITE_FLOAT   ? "a REAL"
                                                                            : "a BLOB",
                                  m ? "'" : "");
        train_error(ctx, fname, table, EMBKV_INVALID, e ? e : "bad 'once' argument");
        sqlite3_free(e);
        return SQLITE_ERROR;
    }
    *flags = EMBKV_PULL_ONCE;
    return SQLITE_OK;
}

static void fn_pull(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    embkv_table_ref ref;
    if (train_target(ctx, "embkv_pull", argv[0], &ref) != SQLITE_OK)
        return;
    /* embkv_pull(table, ids, 'once'): one permit per id for this
     * connection (embkv_pull_ex's EMBKV_PULL_ONCE). */
    unsigned flags = 0;
    if (argc > 2 && once_arg(ctx, "embkv_pull", ref.name, argv[2], &flags) != SQLITE_OK)
        return;
    /* embkv_pull(table, ids, once, out): into a language binding's array
     * (direct.c), a pointer SQL text cannot make. */
    ek_rows_out *into = NULL;
    if (argc > 3 && !(into = sqlite3_value_pointer(argv[3], EK_ROWS_OUT))) {
        train_error(ctx, "embkv_pull", ref.name, EMBKV_INVALID,
                    "argument 4 is for language bindings (a pointer only C can bind): call embkv_pull(table, ids) "
                    "or embkv_pull(table, ids, 'once')");
        return;
    }
    size_t n;
    int64_t *ids = ids_arg(ctx, "embkv_pull", ref.name, argv[1], &n);
    if (!ids)
        return;
    uint32_t dim = embkv_dim(ref.store);
    sqlite3_uint64 bytes = (sqlite3_uint64)n * dim * sizeof(float);
    if (into && (into->bytes != bytes || (bytes && !into->rows))) {
        sqlite3_free(ids);
        char *m = sqlite3_mprintf("the output array holds %llu bytes, and %llu ids of dim %u need %llu",
                                  (unsigned long long)into->bytes, (unsigned long long)n, dim,
                                  (unsigned long long)bytes);
        train_error(ctx, "embkv_pull", ref.name, EMBKV_INVALID, m ? m : "output array of the wrong size");
        sqlite3_free(m);
        return;
    }
    int limit = sqlite3_limit(sqlite3_context_db_handle(ctx), SQLITE_LIMIT_LENGTH, -1);
    if (!into && bytes > (sqlite3_uint64)limit) {
        sqlite3_free(ids);
        char *m = sqlite3_mprintf("%llu ids of dim %u make a %llu-byte result, over this connection's limit of %d "
                                  "bytes (SQLITE_LIMIT_LENGTH): pull fewer ids at a time",
                                  (unsigned long long)n, dim, (unsigned long long)bytes, limit);
        train_error(ctx, "embkv_pull", ref.name, EMBKV_INVALID, m ? m : "result too big");
        sqlite3_free(m);
        sqlite3_result_error_code(ctx, SQLITE_TOOBIG);
        return;
    }
    float *out = into ? into->rows : sqlite3_malloc64(bytes);
    if (!out && !into) {
        sqlite3_free(ids);
        char *m = sqlite3_mprintf("out of memory for a %llu-byte result (%llu ids of dim %u)",
                                  (unsigned long long)bytes, (unsigned long long)n, dim);
        train_error(ctx, "embkv_pull", ref.name, EMBKV_NOMEM, m ? m : "out of memory");
        sqlite3_free(m);
        return;
    }
    const char *ro = ekerr_readonly(sqlite3_context_db_handle(ctx), ref.schema);
    if (!ro && embkv_readonly(ref.store)) ro = "the store is open read-only in this process, beside its writer";
    int rc = ro ? pull_existing(ctx, &ref, ids, n, out, ro) : embkv_pull_ex(ref.session, ids, n, out, flags);
    sqlite3_free(ids);
    if (rc != EMBKV_OK) {
        if (!into) sqlite3_free(out);
        if (rc != EMBKV_NOTFOUND || !ro) engine_error(ctx, "embkv_pull", &ref, rc);
        return;
    }
    if (into)
        sqlite3_result_int64(ctx, (sqlite3_int64)n);
    else
        sqlite3_result_blob64(ctx, out, bytes, sqlite3_free);
}

/* Whether a push must be refused on this connection (reported). */
static bool push_refused(sqlite3_context *ctx, const char *fname, const embkv_table_ref *ref)
{
    if (!ref->session && !ekerr_readonly(sqlite3_context_db_handle(ctx), ref->schema)) {
        /* (query_only turned off since the table opened read-only) */
        char *m = sqlite3_mprintf("this process opened the store %s read-only (a connection that may not write "
                                  "opened the table first): train from a process that opens it to write",
                                  embkv_path(ref->store));
        train_error(ctx, fname, ref->name, EMBKV_READONLY, m ? m : "the store is open read-only");
        sqlite3_free(m);
        sqlite3_result_error_code(ctx, SQLITE_READONLY);
        return true;
    }
    return ekerr_refuse_readonly(ctx, fname, ref->schema, ref->name, "it updates rows", ref->store) != 0;
}

/* The lr argument (NULL: the table's own). */
static int lr_arg(sqlite3_context *ctx, const char *fname, const char *table, sqlite3_value *v, int pos, double *lr)
{
    *lr = 0;
    if (sqlite3_value_type(v) == SQLITE_NULL)
        return SQLITE_OK;
    int t = sqlite3_value_type(v);
    *lr = sqlite3_value_double(v);
    if ((t != SQLITE_INTEGER && t != SQLITE_FLOAT) || !(*lr > 0) || !isfinite(*lr)) {
        char *m = sqlite3_mprintf("lr (argument %d) must be a positive finite number", pos);
        train_error(ctx, fname, table, EMBKV_INVALID, m ? m : "bad lr");
        sqlite3_free(m);
        return SQLITE_ERROR;
    }
    return SQLITE_OK;
}

static void fn_push(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    embkv_table_ref ref;
    if (train_target(ctx, "embkv_push", argv[0], &ref) != SQLITE_OK)
        return;
    if (push_refused(ctx, "embkv_push", &ref))
        return;
    double lr = 0;
    if (argc > 3 && lr_arg(ctx, "embkv_push", ref.name, argv[3], 4, &lr) != SQLITE_OK)
        return;
    size_t n;
    char *err = NULL;
    int64_t *ids = ids_arg(ctx, "embkv_push", ref.name, argv[1], &n);
    if (!ids)
        return;
    bool owned;
    const float *grads = parse_grads(argv[2], n, embkv_dim(ref.store), &owned, &err);
    if (!grads) {
        if (err)
            train_error(ctx, "embkv_push", ref.name, EMBKV_INVALID, err);
        else
            sqlite3_result_error_nomem(ctx);
        sqlite3_free(err);
        sqlite3_free(ids);
        return;
    }
    size_t updated = 0;
    int rc = embkv_push(ref.session, ids, n, grads, lr, &updated);
    sqlite3_free(ids);
    if (owned)
        sqlite3_free((void *)grads);
    if (rc != EMBKV_OK)
        engine_error(ctx, "embkv_push", &ref, rc);
    else
        sqlite3_result_int64(ctx, (sqlite3_int64)updated);
}

static void fn_release(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    if (train_target(ctx, "embkv_release", argv[0], &ref) != SQLITE_OK)
        return;
    size_t n;
    int64_t *ids = ids_arg(ctx, "embkv_release", ref.name, argv[1], &n);
    if (!ids)
        return;
    size_t released = 0;
    /* (a reader process's pulls take no permits: none to return) */
    int rc = ref.session ? embkv_release(ref.session, ids, n, &released) : EMBKV_OK;
    sqlite3_free(ids);
    if (rc != EMBKV_OK)
        train_error(ctx, "embkv_release", ref.name, rc, embkv_errmsg());
    else
        sqlite3_result_int64(ctx, (sqlite3_int64)released);
}

/* Look-ahead reads no row into the result and takes no permits: any
 * connection may call it, with or without uncommitted writes. */
static void fn_lookahead(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    if (table_arg(ctx, "embkv_lookahead", argv[0], &ref) != SQLITE_OK)
        return;
    size_t n;
    int64_t *ids = ids_arg(ctx, "embkv_lookahead", ref.name, argv[1], &n);
    if (!ids)
        return;
    size_t queued = 0;
    int rc = embkv_lookahead(ref.store, ids, n, &queued);
    sqlite3_free(ids);
    if (rc != EMBKV_OK)
        train_error(ctx, "embkv_lookahead", ref.name, rc, embkv_errmsg());
    else
        sqlite3_result_int64(ctx, (sqlite3_int64)queued);
}

/* ------------------------------------------------------------ the GPU */

/* A device address or a stream: an INTEGER (a CUDA tensor's data_ptr(),
 * a stream's cuda_stream); the stream may be NULL or 0 (the default
 * stream), an address may not. */
static int devptr_arg(sqlite3_context *ctx, const char *fname, const char *table, sqlite3_value *v, int pos,
                      bool stream, void **out)
{
    *out = NULL;
    int t = sqlite3_value_type(v);
    if (stream && t == SQLITE_NULL)
        return SQLITE_OK;
    sqlite3_int64 p = sqlite3_value_int64(v);
    if (t != SQLITE_INTEGER || p < 0 || (!stream && p == 0)) {
        char got[64];
        if (t == SQLITE_INTEGER)
            sqlite3_snprintf(sizeof got, got, "%lld", (long long)p);
        else if (t == SQLITE_TEXT)
            sqlite3_snprintf(sizeof got, got, "TEXT '%.40s'", (const char *)sqlite3_value_text(v));
        else
            sqlite3_snprintf(sizeof got, got, "%s", t == SQLITE_FLOAT ? "a REAL" : t == SQLITE_BLOB ? "a BLOB" : "NULL");
        char *m = sqlite3_mprintf("argument %d must be %s as an INTEGER, not %s (%s)", pos,
                                  stream ? "a CUDA stream (0 or NULL: the default stream)" : "a device address",
                                  got,
                                  stream ? "torch: torch.cuda.current_stream().cuda_stream"
                                         : "torch: a contiguous CUDA tensor's data_ptr()");
        train_error(ctx, fname, table, EMBKV_INVALID, m ? m : "bad device argument");
        sqlite3_free(m);
        return SQLITE_ERROR;
    }
    *out = (void *)(uintptr_t)p;
    return SQLITE_OK;
}

/* embkv_get_device(table, ids, dev_out, stream) -> rows found: the rows
 * (zeros for a missing id) written to dev_out, float32, len(ids) x dim,
 * once the stream reaches the copy; no permits, no rows created. */
static void fn_get_device(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    embkv_table_ref ref;
    void *dev, *stream;
    if (table_arg(ctx, "embkv_get_device", argv[0], &ref) != SQLITE_OK)
        return;
    if (ref.pending_writes) {
        /* (the store holds what is committed: the device would not see the
         * transaction's rows, which SELECT shows) */
        train_error(ctx, "embkv_get_device", ref.name, EMBKV_INVALID,
                    "this connection has uncommitted writes to the table; COMMIT them first");
        return;
    }
    if (devptr_arg(ctx, "embkv_get_device", ref.name, argv[2], 3, false, &dev) != SQLITE_OK ||
        devptr_arg(ctx, "embkv_get_device", ref.name, argv[3], 4, true, &stream) != SQLITE_OK)
        return;
    size_t n, missing = 0;
    int64_t *ids = ids_arg(ctx, "embkv_get_device", ref.name, argv[1], &n);
    if (!ids)
        return;
    int rc = embkv_get_batch_device(ref.store, ids, n, dev, stream, &missing);
    sqlite3_free(ids);
    if (rc != EMBKV_OK)
        train_error(ctx, "embkv_get_device", ref.name, rc, embkv_errmsg());
    else
        sqlite3_result_int64(ctx, (sqlite3_int64)(n - missing));
}

/* embkv_pull_device(table, ids, dev_out, stream [, 'once']) -> len(ids):
 * embkv_pull into device memory. */
static void fn_pull_device(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    embkv_table_ref ref;
    void *dev, *stream;
    unsigned flags = 0;
    if (train_target(ctx, "embkv_pull_device", argv[0], &ref) != SQLITE_OK ||
        devptr_arg(ctx, "embkv_pull_device", ref.name, argv[2], 3, false, &dev) != SQLITE_OK ||
        devptr_arg(ctx, "embkv_pull_device", ref.name, argv[3], 4, true, &stream) != SQLITE_OK ||
        (argc > 4 && once_arg(ctx, "embkv_pull_device", ref.name, argv[4], &flags) != SQLITE_OK))
        return;
    size_t n;
    int64_t *ids = ids_arg(ctx, "embkv_pull_device", ref.name, argv[1], &n);
    if (!ids)
        return;
    const char *ro = ekerr_readonly(sqlite3_context_db_handle(ctx), ref.schema);
    if (!ro && embkv_readonly(ref.store)) ro = "the store is open read-only in this process, beside its writer";
    int rc;
    if (ro) {
        /* (as embkv_pull there: existing rows, no permits; a missing id is
         * an error before anything is written to dev_out) */
        uint8_t *found = sqlite3_malloc64(n ? n : 1);
        if (!found) {
            sqlite3_free(ids);
            sqlite3_result_error_nomem(ctx);
            return;
        }
        size_t absent = embkv_exists_batch(ref.store, ids, n, found), i = 0;
        if (absent) {
            while (found[i]) i++;
            char *m = sqlite3_mprintf("id %lld has no row, and this connection creates none: %s (a pull on a "
                                      "connection that may write creates it from the table's init)",
                                      (long long)ids[i], ro);
            train_error(ctx, "embkv_pull_device", ref.name, EMBKV_NOTFOUND, m ? m : "id not found");
            sqlite3_free(m);
            sqlite3_free(found);
            sqlite3_free(ids);
            return;
        }
        sqlite3_free(found);
        rc = embkv_get_batch_device(ref.store, ids, n, dev, stream, NULL);
    } else {
        rc = embkv_pull_device(ref.session, ids, n, dev, stream, flags);
    }
    sqlite3_free(ids);
    if (rc != EMBKV_OK)
        engine_error(ctx, "embkv_pull_device", &ref, rc);
    else
        sqlite3_result_int64(ctx, (sqlite3_int64)n);
}

/* embkv_push_device(table, ids, dev_grads, stream [, lr]) -> distinct
 * rows updated: embkv_push of float32 gradients in device memory. */
static void fn_push_device(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    embkv_table_ref ref;
    void *dev, *stream;
    double lr = 0;
    if (train_target(ctx, "embkv_push_device", argv[0], &ref) != SQLITE_OK ||
        push_refused(ctx, "embkv_push_device", &ref) ||
        devptr_arg(ctx, "embkv_push_device", ref.name, argv[2], 3, false, &dev) != SQLITE_OK ||
        devptr_arg(ctx, "embkv_push_device", ref.name, argv[3], 4, true, &stream) != SQLITE_OK ||
        (argc > 4 && lr_arg(ctx, "embkv_push_device", ref.name, argv[4], 5, &lr) != SQLITE_OK))
        return;
    size_t n, updated = 0;
    int64_t *ids = ids_arg(ctx, "embkv_push_device", ref.name, argv[1], &n);
    if (!ids)
        return;
    int rc = embkv_push_device(ref.session, ids, n, dev, stream, lr, &updated);
    sqlite3_free(ids);
    if (rc != EMBKV_OK)
        engine_error(ctx, "embkv_push_device", &ref, rc);
    else
        sqlite3_result_int64(ctx, (sqlite3_int64)updated);
}

/* embkv_gpu() -> {"compiled": whether the CUDA part is built in, "usable":
 * whether a GPU can be used now, "reason": why not (absent when usable)}. */
static void fn_gpu(sqlite3_context *ctx, int argc, sqlite3_value **argv)
{
    (void)argc;
    (void)argv;
    char why[512];
    int rc = embkv_gpu_status(why, sizeof why);
    cJSON *j = cJSON_CreateObject();
    char *txt = NULL;
    if (j && cJSON_AddBoolToObject(j, "compiled", embkv_gpu_compiled()) &&
        cJSON_AddBoolToObject(j, "usable", rc == EMBKV_OK) &&
        (rc == EMBKV_OK || cJSON_AddStringToObject(j, "reason", why)))
        txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!txt) {
        sqlite3_result_error_nomem(ctx);
        return;
    }
    sqlite3_result_text(ctx, txt, -1, SQLITE_TRANSIENT);
    cJSON_free(txt);
}

/* ------------------------------------------------------------ registration */

int embkv_train_register(sqlite3 *db)
{
    /* Side effects on the store and on permits: never from schema objects. */
    const int flags = SQLITE_UTF8 | SQLITE_DIRECTONLY;
    int rc = sqlite3_create_function_v2(db, "embkv_pull", 2, flags, NULL, fn_pull, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_pull", 3, flags, NULL, fn_pull, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_pull", 4, flags, NULL, fn_pull, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_push", 3, flags, NULL, fn_push, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_push", 4, flags, NULL, fn_push, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_release", 2, flags, NULL, fn_release, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_lookahead", 2, flags, NULL, fn_lookahead, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_get_device", 4, flags, NULL, fn_get_device, NULL, NULL, NULL);
    for (int k = 4; k <= 5 && rc == SQLITE_OK; k++)
        rc = sqlite3_create_function_v2(db, "embkv_pull_device", k, flags, NULL, fn_pull_device, NULL, NULL, NULL);
    for (int k = 4; k <= 5 && rc == SQLITE_OK; k++)
        rc = sqlite3_create_function_v2(db, "embkv_push_device", k, flags, NULL, fn_push_device, NULL, NULL, NULL);
    if (rc == SQLITE_OK)
        rc = sqlite3_create_function_v2(db, "embkv_gpu", 0, SQLITE_UTF8 | SQLITE_INNOCUOUS, NULL, fn_gpu, NULL,
                                        NULL, NULL);
    return rc;
}
