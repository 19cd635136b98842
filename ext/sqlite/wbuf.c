/*
 * wbuf.c - a connection's uncommitted writes to one store, shared by
 * the connection's tables on that store (see ekwbuf in binding.h), and
 * the steps that commit them.  A buffer is freed by registry.c's
 * ekreg_free_wbuf, which the closing connection calls too: so the registry
 * needs nothing from this file.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void wbuf_unlink(ekconn *c, ekwbuf *wb)
{
    for (ekwbuf **p = &c->wbufs; *p; p = &(*p)->next) {
        if (*p == wb) {
            *p = wb->next;
            return;
        }
    }
}

int ekwbuf_acquire(ekvtab *v)
{
    ekconn *c = v->conn;
    ekwbuf *wb;
    for (wb = c->wbufs; wb && strcmp(wb->dir, v->dir) != 0; wb = wb->next) {}
    if (!wb) {
        wb = sqlite3_malloc(sizeof *wb);
        if (!wb) return SQLITE_NOMEM;
        memset(wb, 0, sizeof *wb);
        wb->jslot = wb->jfd = -1;
        wb->dir = sqlite3_mprintf("%s", v->dir);
        wb->txn = ektxn_new(v->dim, v->state_floats);
        /* Its own reference: it may outlive every instance (a DROP). */
        embkv_options eo;
        memset(&eo, 0, sizeof eo);
        eo.dim = v->dim;
        eo.state_floats = v->state_floats;
        char *err = NULL;
        if (!wb->dir || !wb->txn || ekreg_open(v->dir, &eo, embkv_readonly(v->store) ? EMBKV_OPEN_READONLY : 0, &wb->store, &err) != EMBKV_OK) {
            sqlite3_free(err);
            ekreg_free_wbuf(wb);
            return SQLITE_NOMEM;
        }
        wb->next = c->wbufs;
        c->wbufs = wb;
    }
    wb->refs++;
    v->wb = wb;
    v->txn = wb->txn;
    return SQLITE_OK;
}

void ekwbuf_release(ekwbuf *wb, ekconn *c)
{
    if (--wb->refs > 0 || (wb->in_txn && ektxn_count(wb->txn) > 0)) return;
    wbuf_unlink(c, wb);
    ekreg_free_wbuf(wb);
}

void ekwbuf_begin(ekwbuf *wb)
{
    if (wb->in_txn) return;
    ektxn_clear(wb->txn);
    wb->synced = 0;
    wb->in_txn = 1;
}

/* COMMIT, phase one: write the buffer to the store and make it durable,
 * journaled (journal.c) when journal is set.  An error fails the COMMIT
 * and leaves the store as it was. */
static int wbuf_sync_locked(ekwbuf *wb, int journal, char **msg)
{
    int64_t bad = 0;
    char *why = NULL;
    int restored = 1;
    int erc = ektxn_apply(wb->txn, wb->store, &bad, &why, &restored, journal ? ekjournal_write : NULL, wb);
    if (erc != EMBKV_OK) {
        if (bad)
            *msg = sqlite3_mprintf("COMMIT failed at id %lld: %s%s", (long long)bad, why ? why : "out of memory",
                                   restored ? "; nothing was written" : "");
        else
            *msg = sqlite3_mprintf("COMMIT failed: %s; nothing was written", why ? why : "out of memory");
        sqlite3_free(why);
        if (journal) ekjournal_finish(wb, 0, restored);
        return ekerr_rc(erc);
    }
    erc = embkv_sync(wb->store);
    if (erc != EMBKV_OK) {
        why = sqlite3_mprintf("%s", embkv_errmsg());
        int urc = ektxn_unapply(wb->txn, wb->store);
        *msg = sqlite3_mprintf("COMMIT failed to make the table durable: %s; %s", why ? why : "?",
                               urc == EMBKV_OK ? "nothing was written" : "and putting back the previous rows failed too");
        sqlite3_free(why);
        /* The rows are back in memory but not durably: the journal stays
         * pending until the table's next connect or COMMIT syncs. */
        if (journal) ekjournal_finish(wb, 0, 0);
        return ekerr_rc(erc);
    }
    wb->synced = 1;
    return SQLITE_OK;
}

/* A seam for the tests of a COMMIT whose store is written and whose
 * SQLite commit has not happened (tests/python/test_commit.py): the
 * window is too short to hit since SQLite's lock is taken first
 * (journal.c, step 0).  EMBKV_TEST_COMMIT=pause:<ms> sleeps in it;
 * =busy fails there, as a lock SQLite could not have would. */
static int test_seam(char **msg)
{
    const char *e = getenv("EMBKV_TEST_COMMIT");
    if (!e) return SQLITE_OK;
    if (strncmp(e, "pause:", 6) == 0) sqlite3_sleep(atoi(e + 6));
    if (strcmp(e, "busy") != 0) return SQLITE_OK;
    *msg = sqlite3_mprintf("database is locked (EMBKV_TEST_COMMIT=busy)");
    return SQLITE_BUSY;
}

/* The table whose shadow table keeps wb's commit record (journal.c): one
 * of the connection's tables on wb's store, or another of its tables when
 * none can (a dropped table's writes); NULL: the COMMIT is not journaled. */
static ekvtab *record_holder(ekconn *c, ekwbuf *wb)
{
    ekvtab *o;
    for (o = c->tabs; o && !(o->wb == wb && ekjournal_wanted(o)); o = o->next) {}
    if (!o)
        for (o = c->tabs; o && !ekjournal_wanted(o); o = o->next) {}
    return o;
}

static int pending_writes(const ekwbuf *wb)
{
    return wb->in_txn && !wb->synced && ektxn_count(wb->txn) > 0;
}

/* SQLITE_BUSY with *msg when the COMMIT would remove a store another
 * process reads (a DROP of its last table: pending.c carries it out). */
static int refuse_readers(ekconn *c, char **msg)
{
    /* A removal while another process reads the store would leave the
     * directory behind, silently (embkv_destroy refuses it then), and a
     * later CREATE naming it would find the old rows: the COMMIT is
     * refused, as SQLite refuses one beside its readers.  Removed: as
     * pend_carry_out decides, with every table of the store this
     * transaction drops gone from its list. */
    for (int i = 0; i < c->npend; i++) {
        ekpend *p = &c->pend[i];
        if (!(p->when & EK_ON_COMMIT) || (!p->unlist && p->tid[0])) continue; /* (a temporary store) */
        int removed = !p->unlist, seen = 0;
        if (p->unlist) {
            const ekuser *gone[64];
            int n = 0, owner = 0;
            for (int j = 0; j < c->npend; j++) {
                ekpend *q = &c->pend[j];
                if (!(q->when & EK_ON_COMMIT) || !q->unlist || strcmp(q->dir, p->dir) != 0) continue;
                seen |= j < i; /* (decided at its first) */
                owner |= q->owner;
                if (n < 64) gone[n++] = &q->who;
            }
            int left = seen ? 1 : ekusers_left_after(p->dir, gone, n);
            removed = left == 0 || (left == -1 && owner);
        }
        long reader = removed ? embkv_reader_pid(p->dir) : 0;
        if (reader) {
            *msg = sqlite3_mprintf("store %s is open for reading in another process (pid %ld), and this COMMIT "
                                   "removes it (DROP TABLE of its last table): close the table there (or end that "
                                   "process), then DROP again (a COMMIT refused so keeps its transaction open: "
                                   "COMMIT again, or ROLLBACK)",
                                   p->dir, reader);
            return SQLITE_BUSY;
        }
    }
    return SQLITE_OK;
}

/* COMMIT, before any store is written (the first xSync of the COMMIT does
 * it; the later ones find it done): whatever may refuse the COMMIT refuses
 * here, so that one refused has written no store, whichever xSync comes
 * first.  The commit records of every buffer go into SQLite's transaction
 * first, so that the files they make part of it are locked with the rest
 * (journal.c, steps 1 and 0). */
int ekconn_commit_prepare(ekconn *c, char **msg)
{
    *msg = NULL;
    if (c->pid != (long)getpid()) {
        *msg = sqlite3_mprintf("this connection was opened by process %ld, and this process (%ld) is a fork of it: "
                               "a forked process may not commit through its parent's connection (nor may SQLite's "
                               "own connections be used across fork); open the database in this process",
                               c->pid, (long)getpid());
        return SQLITE_READONLY;
    }
    /* Once a store of this COMMIT is written, all of it was decided (and
     * a reader that came since leaves the directory behind rather than a
     * refusal after the write). */
    for (ekwbuf *wb = c->wbufs; wb; wb = wb->next)
        if (wb->in_txn && wb->synced) return SQLITE_OK;
    int rc = refuse_readers(c, msg);
    for (ekwbuf *wb = c->wbufs; wb && rc == SQLITE_OK; wb = wb->next) {
        if (!pending_writes(wb) || wb->jslot >= 0) continue;
        ekvtab *o = record_holder(c, wb);
        if (o) rc = ekjournal_begin(wb, o, msg);
        if (o && rc == SQLITE_OK) rc = ekseq_prepare(c, wb, msg);
    }
    /* (Before any commit lock: a reader this waits for may be a connection
     * of this process committing to one of the stores.) */
    if (rc == SQLITE_OK) rc = ekjournal_lock_files(c->db, msg);
    if (rc != SQLITE_OK)
        for (ekwbuf *wb = c->wbufs; wb; wb = wb->next) {
            if (pending_writes(wb) && wb->jslot >= 0) ekjournal_end(wb);
            ekseq_end(wb, 0);  /* (nothing written: the numbers are dropped) */
        }
    return rc;
}

int ekwbuf_sync(ekwbuf *wb, ekconn *c, char **msg)
{
    *msg = NULL;
    if (wb->synced || ektxn_count(wb->txn) == 0) return SQLITE_OK;
    int rc = ekconn_commit_prepare(c, msg);
    if (rc != SQLITE_OK) return rc;
    pthread_mutex_t *held = ekreg_commit_lock(wb->store);
    ekseq_writing(wb);
    rc = wbuf_sync_locked(wb, wb->jslot >= 0, msg);
    if (rc == SQLITE_OK)
        ekseq_written(wb);
    else
        ekseq_end(wb, 1);  /* (the store as it was) */
    ekreg_commit_unlock(held);
    return rc == SQLITE_OK ? test_seam(msg) : rc;
}

void ekwbuf_end(ekwbuf *wb)
{
    ekseq_end(wb, 0);  /* (after SQLite's commit, S1; or nothing was written) */
    if (wb->synced) ekjournal_finish(wb, 1, 0);
    else if (wb->jslot >= 0) ekjournal_end(wb); /* (prepared, never written: another part failed first) */
    ektxn_clear(wb->txn);
    wb->synced = 0;
    wb->in_txn = 0;
}

/* The transaction goes on after a COMMIT whose first phase wrote the
 * store and whose second failed (SQLite keeps the transaction after a busy
 * COMMIT): the store is put back, so that the buffer, changed from here
 * on, is applied whole by the next COMMIT. */
int ekwbuf_unsync(ekwbuf *wb)
{
    /* Prepared, not written: the slot goes, for the next COMMIT writes a
     * record of its own (a ROLLBACK TO may take this one's record out of
     * SQLite's transaction, and a journal under a token no record holds
     * would be put back after SQLite committed). */
    if (wb && !wb->synced && wb->jslot >= 0) ekjournal_end(wb);
    if (wb && !wb->synced) ekseq_end(wb, 0);  /* (the next COMMIT numbers its own) */
    if (!wb || !wb->synced) return SQLITE_OK;
    pthread_mutex_t *held = ekreg_commit_lock(wb->store);
    int erc = ektxn_unapply(wb->txn, wb->store);
    if (erc == EMBKV_OK) erc = embkv_sync(wb->store);
    ekjournal_finish(wb, 0, erc == EMBKV_OK);
    ekseq_end(wb, 1);
    ekreg_commit_unlock(held);
    wb->synced = 0;
    return erc == EMBKV_OK ? SQLITE_OK : ekerr_rc(erc);
}

void ekwbuf_rollback(ekwbuf *wb)
{
    /* ekwbuf_sync wrote to the store, then another part of the commit
     * failed: put the store back and make that durable.  SQLite ignores
     * xRollback's result: failures go to its error log, and the journal
     * stays pending for the table's next connect in a new process. */
    if (ekwbuf_unsync(wb) != SQLITE_OK)
        sqlite3_log(SQLITE_IOERR, "embkv store %s: ROLLBACK after COMMIT's first phase could not put "
                    "the store back: %s", wb->dir, embkv_errmsg());
    ekwbuf_end(wb);
}

/* A buffer in the transaction that no table in it will commit or end
 * (empty or not: it must end with the transaction all the same). */
static int stranded(const ekwbuf *wb, const ekconn *c)
{
    if (!wb->in_txn) return 0;
    for (const ekvtab *o = c->tabs; o; o = o->next)
        if (o->wb == wb && o->joined) return 0;
    return 1;
}

int ekconn_sync_stranded(ekconn *c, char **msg)
{
    *msg = NULL;
    for (ekwbuf *wb = c->wbufs; wb; wb = wb->next) {
        if (!stranded(wb, c)) continue;
        /* (Its record goes into another table's shadow table, the dropped
         * table's having gone with it: record_holder.) */
        char *why = NULL;
        int rc = ekwbuf_sync(wb, c, &why);
        if (rc != SQLITE_OK) {
            *msg = sqlite3_mprintf("embkv store %s (written through a table dropped in this transaction): %s",
                                   wb->dir, why ? why : "out of memory");
            sqlite3_free(why);
            return rc;
        }
    }
    return SQLITE_OK;
}

void ekconn_end_stranded(ekconn *c, int commit)
{
    ekwbuf *next;
    for (ekwbuf *wb = c->wbufs; wb; wb = next) {
        next = wb->next;
        if (!stranded(wb, c)) continue;
        if (commit) ekwbuf_end(wb);
        else ekwbuf_rollback(wb);
        if (wb->refs == 0) {
            wbuf_unlink(c, wb);
            ekreg_free_wbuf(wb);
        }
    }
}

int ekconn_wbufs_savepoint(ekconn *c, int op, int n)
{
    for (ekwbuf *wb = c->wbufs; wb; wb = wb->next) {
        if (!wb->in_txn) continue;
        int urc = ekwbuf_unsync(wb);
        if (urc != SQLITE_OK) return urc;
        if (op == EK_SAVEPOINT) {
            int rc = ektxn_savepoint(wb->txn, n);
            if (rc != SQLITE_OK) return rc;
        } else if (op == EK_RELEASE) {
            ektxn_release(wb->txn, n);
        } else {
            ektxn_rollback_to(wb->txn, n);
        }
    }
    return SQLITE_OK;
}
