/*
 * commitseq.c - the numbers of the COMMITs that wrote a table, kept both in
 * SQLite's file and in the process, so that a reader in WAL mode never
 * sees a COMMIT in an embkv table that its SQLite snapshot does not show.
 *
 * Why: a WAL reader reads SQLite's tables as of its read transaction's
 * start, and an embkv table as of its cursor's first read (cursor.c): a
 * COMMIT of another connection between the two is in the store and not in
 * the reader's snapshot, which would join the COMMIT's embkv rows with the
 * ordinary rows from before it.  A store cannot go back to an older state,
 * so the reader is refused (SQLITE_BUSY_SNAPSHOT, as SQLite refuses a
 * stale snapshot) rather than given a state that never existed.  In
 * rollback-journal mode a reader holds SQLite's lock, a COMMIT waits for
 * it (journal.c, step 0), and the check always passes.
 *
 * How: each COMMIT that writes a store writes, in SQLite's transaction,
 * the row ('seq', n) into the shadow table of each of the connection's
 * tables on that store (n above the row's value and every number the
 * process handed out), and keeps the process's count per table (its stable id and its
 * database file) while the process has the store open (ekreg_seq: no other
 * process writes it meanwhile): inflight counts up before the store is
 * written, seq becomes n once it is, and inflight counts down when the
 * COMMIT ends (seq back to what it was if its rows were put back).  A
 * reader, having opened its snapshot, reads inflight (above 0: waits for
 * the COMMITs to end, then takes a new snapshot), then seq; equal to what the same table instance last verified, the
 * snapshots agree; otherwise it reads the row 'seq' in its own read
 * transaction, and only that value equal to seq lets it on.
 *
 * Invariants (S1-S3), relied on by ekseq_check:
 *   S1. A COMMIT's seq is stored after its store write completes and
 *       before its inflight count goes; SQLite commits it after the store
 *       write and before the count goes too.
 *   S2. A table's store writes are serialized (SQLite's write lock on its
 *       database file, held from the first xSync to its own commit): one
 *       COMMIT at a time stores seq.  (Two may be in flight at once: SQLite
 *       lets its lock go before xCommit, so a count, not a flag.)
 *   S3. A connection's read transactions follow each other, each
 *       snapshot no older than the last: a value it verified holds until
 *       seq changes.
 * A connection with a write transaction on the table's database is not
 * checked: it reads the newest state (in WAL mode a writer's snapshot is
 * the newest), and its own COMMIT refused or in flight is not another's.
 * Not covered: a table of another connection of the process on the same
 * store that the COMMIT's connection has not connected (its shadow table
 * gets no row: its readers are not checked against that COMMIT), reader
 * processes (they read checkpoints: operations.md), tables of temporary
 * and in-memory databases (no other connection sees them), and a reader
 * whose read transaction began before its process opened the store (the
 * numbers go when the process closes it).
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A table is checked when it is in a database file (the file's identity is
 * part of the key: a copy of the file has the same stable ids). */
static int checked(const ekvtab *v)
{
    return !v->is_tmp && (v->who.dev || v->who.ino) && v->store && !embkv_readonly(v->store);
}

/* The row 'seq' of v's shadow table in the connection's view (0: none). */
static int shadow_seq(ekvtab *v, uint64_t *out, char **err)
{
    char *sql = sqlite3_mprintf("SELECT v FROM \"%w\".\"%w_config\" WHERE k = 'seq'", v->zDb, v->zName);
    sqlite3_stmt *st = NULL;
    int rc = sql ? sqlite3_prepare_v2(v->db, sql, -1, &st, NULL) : SQLITE_NOMEM;
    sqlite3_free(sql);
    *out = 0;
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) *out = (uint64_t)sqlite3_column_int64(st, 0);
        rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? SQLITE_OK : rc;
    }
    if (rc != SQLITE_OK)
        *err = sqlite3_mprintf("cannot read the COMMIT number in its shadow table %s_config: %s", v->zName,
                               sqlite3_errmsg(v->db));
    sqlite3_finalize(st);
    return rc;
}

int ekseq_prepare(ekconn *c, ekwbuf *wb, char **msg)
{
    wb->nseq = 0;
    for (ekvtab *o = c->tabs; o; o = o->next) {
        if (o->wb != wb || !checked(o) || !ekjournal_wanted(o)) continue;
        if (wb->nseq == EK_SEQ_TABLES) break;  /* (more tables of one store in one connection: unchecked) */
        ekseq *e = ekreg_seq(o->store, &o->who, 1);
        if (!e) return SQLITE_NOMEM;
        int again = 0;  /* (one table twice in the connection: a renamed one a cached statement holds) */
        for (int i = 0; i < wb->nseq && !again; i++) again = wb->seqs[i].e == e;
        if (again) continue;
        /* Numbers go up from the shadow table's, read once while the
         * process has the store open: no other process writes it then. */
        uint64_t last = atomic_load(&e->handed);
        int rc = SQLITE_OK;
        if (last == 0 && (rc = shadow_seq(o, &last, msg)) != SQLITE_OK) return rc;
        uint64_t mine = atomic_load(&e->seq), n = (last > mine ? last : mine) + 1;
        char *sql = sqlite3_mprintf("INSERT OR REPLACE INTO \"%w\".\"%w_config\"(k, v) VALUES ('seq', %lld)",
                                    o->zDb, o->zName, (long long)n);
        char *err = NULL;
        rc = sql ? sqlite3_exec(o->db, sql, NULL, NULL, &err) : SQLITE_NOMEM;
        sqlite3_free(sql);
        if (rc != SQLITE_OK) {
            *msg = sqlite3_mprintf("cannot write the COMMIT number into its shadow table %s_config: %s; nothing "
                                   "was written", o->zName, err ? err : sqlite3_errstr(rc));
            sqlite3_free(err);
            return rc;
        }
        atomic_store(&e->handed, n);
        wb->seqs[wb->nseq].e = e;
        wb->seqs[wb->nseq++].n = n;
    }
    return SQLITE_OK;
}

void ekseq_writing(ekwbuf *wb)
{
    for (int i = 0; i < wb->nseq; i++) {
        wb->seqs[i].prev = atomic_load(&wb->seqs[i].e->seq);
        atomic_fetch_add(&wb->seqs[i].e->inflight, 1);
    }
    wb->seq_inflight = wb->nseq > 0;
}

void ekseq_written(ekwbuf *wb)
{
    for (int i = 0; i < wb->nseq && wb->seq_inflight; i++)
        atomic_store(&wb->seqs[i].e->seq, wb->seqs[i].n);  /* (S1) */
}

void ekseq_end(ekwbuf *wb, int rows_back)
{
    for (int i = 0; i < wb->nseq && wb->seq_inflight; i++) {
        if (rows_back) atomic_store(&wb->seqs[i].e->seq, wb->seqs[i].prev);
        atomic_fetch_sub(&wb->seqs[i].e->inflight, 1);
    }
    wb->seq_inflight = 0;
    wb->nseq = 0;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int ekseq_check(ekvtab *v, embkv_snapshot **snap, char **err)
{
    if (!checked(v) || sqlite3_txn_state(v->db, v->zDb) == SQLITE_TXN_WRITE) return SQLITE_OK;
    if (!v->seq && !(v->seq = ekreg_seq(v->store, &v->who, 0))) return SQLITE_OK;  /* no COMMIT of the process wrote it */
    ekseq *e = v->seq;
    /* COMMITs between their store write and their end: waited for as for
     * a lock (a second at least: the window is a sync long), then a
     * snapshot taken after them. */
    int budget = -1;
    double t0 = 0;
    while (atomic_load(&e->inflight) > 0) {
        if (budget < 0) {
            budget = ek_pragma_int(v->db, "busy_timeout", 0);
            if (budget < 1000) budget = 1000;
            t0 = now_ms();
        }
        while (atomic_load(&e->inflight) > 0) {
            if (now_ms() - t0 >= budget) {
                *err = sqlite3_mprintf("a COMMIT of another connection is writing its store (waited %.0f ms): run "
                                       "the statement again", now_ms() - t0);
                return SQLITE_BUSY;
            }
            sqlite3_sleep(1);
        }
        embkv_snapshot_close(*snap);
        *snap = NULL;
        if (embkv_snapshot_open(v->store, snap) != EMBKV_OK) {
            *err = sqlite3_mprintf("cannot open a snapshot: %s", embkv_errmsg());
            return SQLITE_ERROR;
        }
        /* (another one may have begun meanwhile: waited for as well) */
    }
    uint64_t s = atomic_load(&e->seq);
    if (s == v->seq_seen) return SQLITE_OK;  /* (S3) */
    uint64_t mine = 0;
    int rc = shadow_seq(v, &mine, err);
    if (rc != SQLITE_OK) return rc;
    if (mine == s) {
        v->seq_seen = s;
        return SQLITE_OK;
    }
    *err = sqlite3_mprintf("a COMMIT of another connection changed it after this read transaction began (SQLite "
                           "keeps a reader's snapshot in WAL mode, and the table cannot go back to it): end the read "
                           "transaction (COMMIT or ROLLBACK, or finish the statement) and read again");
    return SQLITE_BUSY_SNAPSHOT;
}
