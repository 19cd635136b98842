/*
 * journal.c - the commit journal: SQLite's database file decides whether a
 * COMMIT that wrote an embkv store happened.
 *
 * Why: a COMMIT reaches two places.  The store is written in the first
 * phase (xSync), and SQLite commits its own file after that, possibly
 * after waiting for its lock.  A process killed in between would leave
 * rows in the store that SQLite never committed.  So SQLite's file is the
 * coordinator of a two-phase commit, and this file keeps the store's side
 * undoable until SQLite has decided:
 *
 *   1. xSync writes the commit record ('commit-<k>', T) into the table's
 *      shadow table <name>_config, T a fresh random token and k the
 *      journal slot: part of SQLite's transaction (SQLite lets xSync write
 *      to the database), so the record is in the file if and only if
 *      SQLite commits.
 *   2. The pre-images of every row the COMMIT writes (txn.c hands them over
 *      before its first write) go to the journal file
 *      <store>/app-sqlite-commit-<k> with T and the table's stable id; the
 *      header, marked pending, is written last and the file made durable
 *      (fdatasync) before the store is touched.
 *   3. The writes, then embkv_sync.
 *   4. xCommit: the journal is marked done.  xRollback: the pre-images are
 *      put back (from memory, txn.c), synced, and the journal marked done
 *      durably.
 *
 * A table that connects and finds a pending journal naming it (or a table
 * of its connection: find_named), that no COMMIT of this process owns,
 * resolves it: if its record 'commit-<k>'
 * holds the journal's token, SQLite committed, and the journal is marked
 * done; otherwise SQLite never committed (and its own journal rolled the
 * record back).  Then if the store's durable epoch has reached the
 * COMMIT's (step 3's sync, or another checkpoint, completed), the
 * pre-images are put back and synced; if not, the store's own recovery
 * already went back past the COMMIT.  Either way the journal is then
 * marked done durably.
 *
 * Invariants:
 *   J1. A journal is pending on disk (durably) before the store holds any
 *       write of its COMMIT, and it holds every pre-image of that COMMIT.
 *   J2. One record per slot and table: a later COMMIT through another slot
 *       never overwrites this slot's record, so a done mark lost in a power
 *       cut still resolves as committed (the record still holds T).
 *   J3. A journal resolved by putting rows back is marked done durably
 *       before anything else writes the store: a lost mark would put old
 *       rows over later COMMITs.
 *   J4. Slots are per process (ekreg_journal_take); a process owns the
 *       store's writes alone (the engine's lock), so a pending journal no
 *       COMMIT of this process owns is one a dead process left.
 *   J5. A row is put back only while it is as the COMMIT left it (absent
 *       for a delete; for a put, a value whose hash the record keeps): a
 *       push or another database file's table that wrote it since keeps
 *       its write, as the last writer does everywhere else (txn.c's
 *       still_written for a ROLLBACK, put_back here).
 *
 * Step 0, after every buffer's step 1 and before any store is written
 * (ekconn_commit_prepare, wbuf.c, at the COMMIT's first xSync): every
 * database file the transaction writes in rollback-journal mode (the
 * commit records' files among them) is locked EXCLUSIVE, waiting for
 * readers as SQLite's own COMMIT would (the connection's busy timeout, for
 * all of them together); a file SQLite does not lock (nolock=1) is left
 * alone.  SQLite takes that lock only after xSync, so without it the
 * store would hold the COMMIT's rows while SQLite waited for its readers:
 * they and everything reading the store meanwhile would see rows SQLite
 * might never commit, and a push there would train on them.  Holding the
 * lock first, no connection reads those files between the store's write
 * and SQLite's commit, and a COMMIT that cannot have the lock fails busy
 * with nothing written, its transaction still open (as SQLite's does).
 * In WAL mode a COMMIT waits for no reader: nothing to take.
 *
 * What it does not cover: tables of temporary and in-memory databases
 * (their store goes with the process); read-only connections write
 * nothing, and refuse a table whose store shows a cut-off COMMIT, with no
 * writer process to resolve it (ekjournal_recover, writer 0).  A journal whose header is not one (zeros, another
 * file) is taken as done: J1's header is written last, so a journal cut
 * off before it was complete never saw a store write.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define J_MAGIC "EKVJRNL1"
#define J_HEAD 72
#define J_STATE_OFF 8
#define J_PENDING 1u
#define J_REC 32 /* id, existed, kind, clock, whash */
#define J_CHUNK (1u << 20)

/* Header: magic[8] state:u32 dim:u32 state_floats:u32 pad:u32 tid[16]
 * token:u64 epoch:u64 nrec:u64 check:u64; records: id:i64 existed:u32 kind:u32
 * clock:u64 whash:u64 [dim + state_floats floats when existed is 1] (kind
 * and whash: ektxn_pre's, so that a row written since is not put back).  check is
 * FNV-1a over the header after the state and every record, so that the
 * done mark (the state alone) is one small write. */
typedef struct jhead {
    char magic[8];
    uint32_t state, dim, state_floats, pad;
    char tid[16];
    uint64_t token;
    uint64_t epoch; /* the engine epoch of the COMMIT's writes (embkv_group_epoch) */
    uint64_t nrec, check;
} jhead;

_Static_assert(sizeof(jhead) == J_HEAD, "journal header is 72 bytes");

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

#define FNV0 0xcbf29ce484222325ull

static uint64_t head_check(const jhead *h)
{
    return fnv(FNV0, (const char *)h + J_STATE_OFF + 4, offsetof(jhead, check) - J_STATE_OFF - 4);
}

static char *slot_path(const char *dir, int k) { return sqlite3_mprintf("%s/app-sqlite-commit-%d", dir, k); }

/* pwrite or pread of all n bytes at off: 0, or -1 (errno set; a short
 * read is one too). */
static int io_all(int fd, void *p, size_t n, off_t off, int write)
{
    char *b = p;
    while (n > 0) {
        ssize_t k = write ? pwrite(fd, b, n, off) : pread(fd, b, n, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        b += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

static int write_all(int fd, const void *p, size_t n, off_t off) { return io_all(fd, (void *)p, n, off, 1); }
static int read_all(int fd, void *p, size_t n, off_t off) { return io_all(fd, p, n, off, 0); }

/* 1 when the file holds a pending journal (its header read into *h), 0
 * when not (absent, done, or no journal header), 2 for a journal whose
 * state is neither (damaged), -1 on an I/O error. */
static int read_head(int fd, jhead *h)
{
    ssize_t r;
    do {
        r = pread(fd, h, sizeof *h, 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return -1;
    if (r < (ssize_t)sizeof *h || memcmp(h->magic, J_MAGIC, 8) != 0) return 0;
    return h->state == J_PENDING ? 1 : h->state == 0 ? 0 : 2;
}

static int mark_done(int fd, int durable)
{
    uint32_t z = 0;
    if (write_all(fd, &z, sizeof z, J_STATE_OFF) != 0) return -1;
    return durable ? fdatasync(fd) : 0;
}

static int sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* A usable table of a database file (one of a temporary or in-memory
 * database, with a path, has no file to keep a record in). */
static int in_a_file(const ekvtab *v)
{
    if (!v || v->is_tmp || v->gone || v->broken || !v->store) return 0;
    const char *file = sqlite3_db_filename(v->db, v->zDb);
    return file && *file;
}

int ekjournal_wanted(const ekvtab *v)
{
    if (!in_a_file(v) || embkv_readonly(v->store)) return 0;
    /* A table whose CREATE was rolled back to a savepoint still gets
     * xSync, without its shadow table. */
    char *cfg = sqlite3_mprintf("%s_config", v->zName);
    int ok = cfg && sqlite3_table_column_metadata(v->db, v->zDb, cfg, "k", NULL, NULL, NULL, NULL, NULL) == SQLITE_OK;
    sqlite3_free(cfg);
    return ok;
}

/* Whether schema name of db is in WAL mode (its COMMIT waits for no
 * reader), or cannot be told (taken as WAL: nothing is locked). */
static int wal_mode(sqlite3 *db, const char *name)
{
    char *sql = sqlite3_mprintf("PRAGMA \"%w\".journal_mode", name);
    sqlite3_stmt *st = NULL;
    int wal = 1;
    if (sql && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
        const char *m = (const char *)sqlite3_column_text(st, 0);
        wal = m && sqlite3_stricmp(m, "wal") == 0;
    }
    sqlite3_finalize(st);
    sqlite3_free(sql);
    return wal;
}

/* Step 0.  The VFS lock is taken through the file's own methods: the
 * pager, asking for EXCLUSIVE later, finds it held (a no-op in every
 * VFS's xLock), and releases it when the transaction ends, as it does a
 * PENDING lock left by a wait that timed out.
 * For one schema: EXCLUSIVE when SQLite's COMMIT of its file would
 * wait for readers, waiting up to what is left of *budget (ms, read at the
 * first busy file; *waited counts the whole COMMIT's wait). */
typedef struct lock_wait {
    int budget, waited;  /* ms: the busy timeout (-1: not read yet), and the COMMIT's wait so far */
    char **msg;
} lock_wait;

static int lock_one(sqlite3 *db, const char *name, void *arg)
{
    lock_wait *lw = arg;
    if (!strcmp(name, "temp") || sqlite3_txn_state(db, name) != SQLITE_TXN_WRITE) return SQLITE_OK;
    const char *file = sqlite3_db_filename(db, name);
    sqlite3_file *f = NULL;
    /* (A file SQLite does not lock, nolock=1, is not locked here: the
     * pager would never release it.) */
    if (!file || !*file || sqlite3_uri_boolean(file, "nolock", 0) ||
        sqlite3_file_control(db, name, SQLITE_FCNTL_FILE_POINTER, &f) != SQLITE_OK || !f || !f->pMethods ||
        wal_mode(db, name))
        return SQLITE_OK;
    /* SQLite's busy callback's steps, in ms. */
    static const int step[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100};
    int rc;
    for (int n = 0;; n++) {
        rc = f->pMethods->xLock(f, SQLITE_LOCK_EXCLUSIVE);
        if ((rc & 0xff) != SQLITE_BUSY) break;
        if (lw->budget < 0) lw->budget = ek_pragma_int(db, "busy_timeout", 0);
        int d = step[n < 12 ? n : 11];
        if (lw->waited >= lw->budget) break;
        if (d > lw->budget - lw->waited) d = lw->budget - lw->waited;
        sqlite3_sleep(d);
        lw->waited += d;
    }
    if (rc != SQLITE_OK)
        *lw->msg = (rc & 0xff) == SQLITE_BUSY
                   ? sqlite3_mprintf("database is locked: other connections are reading %s (waited %d ms, the "
                                     "connection's busy timeout); nothing was written, %s",
                                     file, lw->waited, ek_in_write_statement(db)
                                                        ? "and the statement is undone: run it again"
                                                        : "and the transaction is still open: COMMIT again, or "
                                                          "ROLLBACK")
                   : sqlite3_mprintf("cannot lock %s to commit: %s; nothing was written", file, sqlite3_errstr(rc));
    return rc;
}

int ekjournal_lock_files(sqlite3 *db, char **msg)
{
    *msg = NULL;
    if (sqlite3_txn_state(db, NULL) != SQLITE_TXN_WRITE) return SQLITE_OK;
    lock_wait lw = {-1, 0, msg};
    return ek_each_schema(db, lock_one, &lw);
}

/* Step 1: a slot of this process whose file holds no pending journal of
 * anyone else, and the record in SQLite's transaction. */
int ekjournal_begin(ekwbuf *wb, ekvtab *v, char **msg)
{
    *msg = NULL;
    wb->jfd = -1;
    wb->jslot = -1;
    for (int k = 0; k < EK_JOURNAL_SLOTS && wb->jslot < 0; k++) {
        if (!ekreg_journal_take(wb->store, k)) continue;
        char *path = slot_path(wb->dir, k);
        if (!path) {
            ekreg_journal_drop(wb->store, k);
            return SQLITE_NOMEM;
        }
        int created = 0;
        int fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            created = fd >= 0;
        }
        jhead h;
        int pend = fd >= 0 ? read_head(fd, &h) : -1;
        if (pend != 0) {
            if (fd < 0 || pend < 0) {
                *msg = sqlite3_mprintf("cannot open the commit journal %s: %s; nothing was written", path,
                                       strerror(errno));
                if (fd >= 0) close(fd);
                sqlite3_free(path);
                ekreg_journal_drop(wb->store, k);
                return SQLITE_IOERR;
            }
            /* Another table's COMMIT cut off by a dead process (J4): that
             * table resolves it when it connects. */
            close(fd);
            sqlite3_free(path);
            ekreg_journal_drop(wb->store, k);
            continue;
        }
        if (created && sync_dir(wb->dir) != 0) {
            *msg = sqlite3_mprintf("cannot make the commit journal %s durable: %s; nothing was written", path,
                                   strerror(errno));
            close(fd);
            sqlite3_free(path);
            ekreg_journal_drop(wb->store, k);
            return SQLITE_IOERR;
        }
        sqlite3_free(path);
        wb->jfd = fd;
        wb->jslot = k;
    }
    if (wb->jslot < 0) {
        *msg = sqlite3_mprintf("all %d commit journal slots of store %s are taken (COMMITs in flight, or "
                               "journals of tables that have not connected since a crash: use those tables once)",
                               EK_JOURNAL_SLOTS, wb->dir);
        return SQLITE_BUSY;
    }
    uint64_t t;
    do sqlite3_randomness(sizeof t, &t);
    while (t == 0);
    wb->jtoken = t;
    memcpy(wb->jtid, v->tid, 16);
    char *sql = sqlite3_mprintf("INSERT OR REPLACE INTO \"%w\".\"%w_config\"(k, v) VALUES ('commit-%d', %lld)",
                                v->zDb, v->zName, wb->jslot, (long long)t);
    char *err = NULL;
    int rc = sql ? sqlite3_exec(v->db, sql, NULL, NULL, &err) : SQLITE_NOMEM;
    sqlite3_free(sql);
    if (rc != SQLITE_OK) {
        *msg = sqlite3_mprintf("cannot write the commit record into its shadow table %s_config: %s; nothing was "
                               "written", v->zName, err ? err : sqlite3_errstr(rc));
        sqlite3_free(err);
        ekjournal_end(wb);
        return rc;
    }
    return SQLITE_OK;
}

/* Step 2, as txn.c's hook: every pre-image, then the pending header, then
 * fdatasync (J1). */
int ekjournal_write(void *ctx, ektxn *t, char **msg)
{
    ekwbuf *wb = ctx;
    size_t n = ektxn_npre(t);
    uint32_t dim = embkv_dim(wb->store), sf = embkv_state_floats(wb->store);
    size_t rowbytes = ((size_t)dim + sf) * sizeof(float);
    char *buf = sqlite3_malloc64(J_CHUNK + J_REC + rowbytes);
    if (!buf) return EMBKV_NOMEM;
    jhead h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, J_MAGIC, 8);
    h.dim = dim;
    h.state_floats = sf;
    memcpy(h.tid, wb->jtid, 16);
    h.token = wb->jtoken;
    h.epoch = embkv_group_epoch(wb->store); /* (txn.c calls this hook inside its group) */
    h.nrec = n;
    uint64_t check = head_check(&h);
    off_t off = J_HEAD;
    size_t used = 0;
    /* (The header there is done or none: ekjournal_begin took no pending
     * one, and it is written last.) */
    int bad = 0;
    for (size_t k = 0; k < n && !bad; k++) {
        int64_t id;
        uint64_t clock, whash;
        const float *data;
        int kind;
        uint32_t existed = (uint32_t)ektxn_pre(t, wb->store, k, &id, &clock, &data, &kind, &whash);
        uint32_t ukind = (uint32_t)kind;
        char *r = buf + used;
        memcpy(r, &id, 8);
        memcpy(r + 8, &existed, 4);
        memcpy(r + 12, &ukind, 4);
        memcpy(r + 16, &clock, 8);
        memcpy(r + 24, &whash, 8);
        size_t len = J_REC;
        if (existed == 1) {
            memcpy(r + J_REC, data, rowbytes);
            len += rowbytes;
        }
        check = fnv(check, r, len);
        used += len;
        if (used >= J_CHUNK || k + 1 == n) {
            bad = write_all(wb->jfd, buf, used, off) != 0;
            off += (off_t)used;
            used = 0;
        }
    }
    sqlite3_free(buf);
    h.check = check;
    h.state = J_PENDING;
    if (!bad) bad = write_all(wb->jfd, &h, sizeof h, 0) != 0 || fdatasync(wb->jfd) != 0;
    if (bad) {
        int e = errno;
        char *path = slot_path(wb->dir, wb->jslot);
        mark_done(wb->jfd, 0);
        *msg = sqlite3_mprintf("cannot write the commit journal %s: %s", path ? path : wb->dir, strerror(e));
        sqlite3_free(path);
        return EMBKV_IO;
    }
    return EMBKV_OK;
}

/* Step 4.  committed: SQLite committed, or the store holds nothing of the
 * COMMIT (a failed apply that put its rows back): the done mark needs no
 * sync when the store's rows are the committed ones (J2), and one when
 * they were put back (J3).  rows_back: the rows are back in the store and
 * synced.  When not (putting back or its sync failed: an I/O error), the
 * journal stays pending and the slot stays owned while the store is open
 * in this process, so that no recovery here puts old rows over later
 * COMMITs; the table's next connect in a process that opens the store
 * anew puts the rows back. */
void ekjournal_finish(ekwbuf *wb, int committed, int rows_back)
{
    if (wb->jfd < 0) return;
    if (committed || rows_back) {
        if (mark_done(wb->jfd, !committed) != 0)
            sqlite3_log(SQLITE_IOERR, "embkv store %s: cannot mark commit journal %d done: %s", wb->dir, wb->jslot,
                        strerror(errno));
    } else {
        sqlite3_log(SQLITE_IOERR, "embkv store %s: commit journal %d stays pending: the rows of a failed COMMIT "
                    "could not be put back", wb->dir, wb->jslot);
        wb->jslot = -1; /* (owned until the store closes) */
    }
    ekjournal_end(wb);
}

void ekjournal_end(ekwbuf *wb)
{
    if (wb->jfd >= 0) close(wb->jfd);
    if (wb->jslot >= 0) ekreg_journal_drop(wb->store, wb->jslot);
    wb->jfd = -1;
    wb->jslot = -1;
}

static int damaged(const char *path, const char *why, char **err)
{
    *err = sqlite3_mprintf("its store's commit journal %s is damaged (%s): a COMMIT was cut off and its rows "
                           "cannot be put back. Restore the store from a backup, or remove that file to keep "
                           "the rows as they are (that COMMIT's rows may stay although it never returned)",
                           path, why);
    return SQLITE_CORRUPT;
}

/* Verifies a journal's bytes (apply 0), or puts its pre-images back (apply
 * 1, after a verification: a damaged journal puts nothing back). */
static int put_back(ekvtab *v, int fd, const jhead *h, const char *path, int apply, char **err)
{
    size_t rowbytes = ((size_t)h->dim + h->state_floats) * sizeof(float);
    if (h->dim != v->dim || h->state_floats != v->state_floats) {
        char why[160];
        snprintf(why, sizeof why, "it says dim %u with %u state floats; the store has %u and %u", h->dim,
                 h->state_floats, v->dim, v->state_floats);
        return damaged(path, why, err);
    }
    float *row = sqlite3_malloc64(rowbytes + J_REC);
    float *cur = sqlite3_malloc64((uint64_t)h->dim * sizeof(float));
    if (!row || !cur) {
        sqlite3_free(row);
        sqlite3_free(cur);
        return SQLITE_NOMEM;
    }
    const char *why = NULL;
    int rc = SQLITE_OK;
    for (int pass = apply; pass < 1 + apply && !why && rc == SQLITE_OK; pass++) {
        uint64_t check = head_check(h);
        off_t off = J_HEAD;
        if (pass == 1 && embkv_group_begin(v->store) != EMBKV_OK) {
            *err = sqlite3_mprintf("cannot put back the rows of a cut-off COMMIT: %s", embkv_errmsg());
            rc = SQLITE_IOERR;
            break;
        }
        for (uint64_t k = 0; k < h->nrec && !why && rc == SQLITE_OK; k++) {
            char rec[J_REC];
            if (read_all(fd, rec, J_REC, off) != 0) {
                why = "it ends before its last record";
                break;
            }
            int64_t id;
            uint32_t existed, kind;
            uint64_t clock, whash;
            memcpy(&id, rec, 8);
            memcpy(&existed, rec + 8, 4);
            memcpy(&kind, rec + 12, 4);
            memcpy(&clock, rec + 16, 8);
            memcpy(&whash, rec + 24, 8);
            if (existed > 2 || (kind != EKTXN_PUT && kind != EKTXN_DEL)) {
                why = "a record's kind is not one";
                break;
            }
            if (pass == 0) check = fnv(check, rec, J_REC);
            off += J_REC;
            if (existed == 1) {
                if (read_all(fd, row, rowbytes, off) != 0) {
                    why = "it ends before its last record";
                    break;
                }
                if (pass == 0) check = fnv(check, row, rowbytes);
                off += (off_t)rowbytes;
            }
            if (pass == 0) continue;
            /* Only a row still as the COMMIT left it (the last writer
             * wins, as in ROLLBACK: txn.c's still_written). */
            int grc = ek_get_quiet(v->store, id, cur, NULL, NULL);
            int mine = kind == EKTXN_DEL ? grc == EMBKV_NOTFOUND
                                         : grc == EMBKV_OK && ek_vec_hash(cur, h->dim) == whash;
            int erc = EMBKV_OK;
            if (!mine) {
                /* written since: that write stays */
            } else if (existed == 1) {
                if (clock > (uint64_t)INT64_MAX) clock = (uint64_t)INT64_MAX;
                erc = embkv_put_clock(v->store, id, row, h->state_floats ? row + h->dim : NULL, clock);
            } else if (existed == 0) {
                erc = embkv_delete(v->store, id);
                if (erc == EMBKV_NOTFOUND) erc = EMBKV_OK;
            }
            if (erc != EMBKV_OK) {
                *err = sqlite3_mprintf("cannot put back row %lld of a cut-off COMMIT (journal %s): %s", (long long)id,
                                       path, embkv_errmsg());
                rc = ekerr_rc(erc);
            }
        }
        if (pass == 0 && !why && check != h->check) why = "its checksum does not match";
        if (pass == 1) embkv_group_end(v->store);
    }
    sqlite3_free(row);
    sqlite3_free(cur);
    if (why) return damaged(path, why, err);
    if (rc == SQLITE_OK && apply && embkv_sync(v->store) != EMBKV_OK) {
        *err = sqlite3_mprintf("cannot make the rows put back from journal %s durable: %s", path, embkv_errmsg());
        rc = SQLITE_IOERR;
    }
    return rc;
}

/* The record 'commit-<k>' of v's shadow table: *holds 1 when it holds
 * token.  An SQLite rc.  Read as of now: a connection inside a
 * transaction may read an older snapshot of the file (WAL) that predates
 * the dead process's commit, so it asks a connection of its own. */
static int record_holds(ekvtab *v, const char *schema, const char *cfg, int k, uint64_t token, int *holds,
                        char **err)
{
    int ro = sqlite3_db_readonly(v->db, schema) == 1;
    *holds = 0;
    sqlite3 *db = v->db, *own = NULL;
    int rc = SQLITE_OK;
    /* (A connection holding a write transaction is on the latest state,
     * and another connection could not read past its lock.) */
    if (!sqlite3_get_autocommit(v->db) && sqlite3_txn_state(v->db, schema) != SQLITE_TXN_WRITE) {
        const char *file = sqlite3_db_filename(v->db, schema);
        /* Read-write, so that it can roll back a hot journal (a read-only
         * connection's own is read-only too). */
        rc = file && *file ? sqlite3_open_v2(file, &own, ro ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE, NULL)
                           : SQLITE_CANTOPEN;
        if (rc == SQLITE_OK) rc = sqlite3_busy_timeout(own, 5000);
        if (rc != SQLITE_OK) {
            *err = sqlite3_mprintf("cannot read the commit record of the shadow table %s (another "
                                   "connection to %s): %s",
                                   cfg, file ? file : "?", own ? sqlite3_errmsg(own) : sqlite3_errstr(rc));
            sqlite3_close(own);
            return rc;
        }
        db = own;
    }
    char *sql = sqlite3_mprintf("SELECT v FROM \"%w\".\"%w\" WHERE k = 'commit-%d'", own ? "main" : schema, cfg, k);
    sqlite3_stmt *st = NULL;
    rc = sql ? sqlite3_prepare_v2(db, sql, -1, &st, NULL) : SQLITE_NOMEM;
    sqlite3_free(sql);
    if (rc == SQLITE_OK) {
        rc = sqlite3_step(st);
        if (rc == SQLITE_ROW) *holds = sqlite3_column_type(st, 0) == SQLITE_INTEGER &&
                                      (uint64_t)sqlite3_column_int64(st, 0) == token;
        if (rc == SQLITE_ROW || rc == SQLITE_DONE) rc = SQLITE_OK;
    }
    if (rc != SQLITE_OK)
        *err = sqlite3_mprintf("cannot read the commit record of the shadow table %s: %s", cfg, sqlite3_errmsg(db));
    sqlite3_finalize(st);
    sqlite3_close(own);
    return rc;
}

/* The shadow table <name>_config holding id tid in a schema of v's
 * connection: *schema and *cfg (sqlite3_malloc'd), or both NULL.  An
 * SQLite rc. */
static int find_named(ekvtab *v, const char *tid, char **schema, char **cfg)
{
    *schema = *cfg = NULL;
    if (memcmp(tid, v->tid, 16) == 0) {
        *schema = sqlite3_mprintf("%s", v->zDb);
        *cfg = sqlite3_mprintf("%s_config", v->zName);
        return *schema && *cfg ? SQLITE_OK : SQLITE_NOMEM;
    }
    char want[17];
    memcpy(want, tid, 16);
    want[16] = 0;
    sqlite3_stmt *dbs = NULL;
    int rc = sqlite3_prepare_v2(v->db, "SELECT name FROM pragma_database_list", -1, &dbs, NULL);
    while (rc == SQLITE_OK && !*cfg && sqlite3_step(dbs) == SQLITE_ROW) {
        const char *sch = (const char *)sqlite3_column_text(dbs, 0);
        char *sql = sqlite3_mprintf("SELECT name FROM \"%w\".sqlite_schema WHERE type = 'table' AND name GLOB "
                                    "'*_config'", sch ? sch : "main");
        sqlite3_stmt *tabs = NULL;
        if (!sql || sqlite3_prepare_v2(v->db, sql, -1, &tabs, NULL) != SQLITE_OK) {
            sqlite3_free(sql);
            sqlite3_finalize(tabs);
            continue;
        }
        sqlite3_free(sql);
        while (!*cfg && sqlite3_step(tabs) == SQLITE_ROW) {
            const char *name = (const char *)sqlite3_column_text(tabs, 0);
            char *q = sqlite3_mprintf("SELECT 1 FROM \"%w\".\"%w\" WHERE k = 'id' AND v = %Q", sch, name, want);
            sqlite3_stmt *st = NULL;
            /* (a table of another kind named so fails to prepare: not it) */
            if (q && sqlite3_prepare_v2(v->db, q, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW) {
                *schema = sqlite3_mprintf("%s", sch);
                *cfg = sqlite3_mprintf("%s", name);
                if (!*schema || !*cfg) rc = SQLITE_NOMEM;
            }
            sqlite3_finalize(st);
            sqlite3_free(q);
        }
        sqlite3_finalize(tabs);
    }
    sqlite3_finalize(dbs);
    if (rc != SQLITE_OK || !*cfg) {
        sqlite3_free(*schema);
        sqlite3_free(*cfg);
        *schema = *cfg = NULL;
    }
    return rc;
}

static int epoch_durable(embkv_store *s, uint64_t epoch)
{
    embkv_stats st;
    /* (Unknown: put back, which the older rows make harmless.) */
    if (embkv_stats_get(s, &st) != EMBKV_OK) return 1;
    return st.durable_epoch >= epoch;
}

/* The slots whose journal files the directory holds: one readdir at a
 * connect rather than an open per slot (all of them when it cannot be
 * read: the opens then say what is wrong). */
static uint64_t journal_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return ~0ull;
    static const char prefix[] = "app-sqlite-commit-";
    uint64_t present = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0) continue;
        char *end;
        unsigned long k = strtoul(e->d_name + sizeof prefix - 1, &end, 10);
        if (*end == 0 && k < EK_JOURNAL_SLOTS) present |= 1ull << k;
    }
    closedir(d);
    return present;
}

/* Whether a connection that may not write sees a cut-off COMMIT: on a
 * store it reads beside no live writer (a writer process resolves its
 * tables' journals as they connect there; one in flight is its own), in a
 * database file. */
static int readonly_checks(const ekvtab *v)
{
    return in_a_file(v) && embkv_readonly(v->store) && !embkv_writer_pid(v->store);
}

int ekjournal_recover(ekvtab *v, int writer, char **err)
{
    *err = NULL;
    if (writer ? !ekjournal_wanted(v) : !readonly_checks(v)) return SQLITE_OK;
    int rc = SQLITE_OK;
    uint64_t present = journal_files(v->dir);
    for (int k = 0; k < EK_JOURNAL_SLOTS && rc == SQLITE_OK; k++) {
        /* Owned while it is looked at: no COMMIT of this process takes the
         * slot meanwhile, and one that owns it is in flight (J4). */
        if (!(present & (1ull << k)) || !ekreg_journal_take(v->store, k)) continue;
        char *path = slot_path(v->dir, k);
        if (!path) {
            ekreg_journal_drop(v->store, k);
            return SQLITE_NOMEM;
        }
        int fd = open(path, (writer ? O_RDWR : O_RDONLY) | O_CLOEXEC);
        jhead h;
        int pend = fd >= 0 ? read_head(fd, &h) : (errno == ENOENT ? 0 : -1);
        char *schema = NULL, *cfg = NULL;
        if (pend < 0) {
            *err = sqlite3_mprintf("cannot %s its store's commit journal %s: %s (give this process %s it: it may "
                                   "hold the rows of a COMMIT cut off by a crash, which the table puts back)",
                                   fd < 0 ? "open" : "read", path, strerror(errno),
                                   writer ? "read and write access to" : "read access to");
            rc = SQLITE_IOERR;
        } else if (pend == 2) {
            rc = damaged(path, "its state is neither done nor pending", err);
        } else if (pend == 1 && (rc = put_back(v, fd, &h, path, 0, err)) != SQLITE_OK) {
            /* damaged, whichever table it names */
        } else if (pend == 1 && (rc = find_named(v, h.tid, &schema, &cfg)) == SQLITE_OK && cfg) {
            /* Its table, or another of this connection's (on the same
             * store), whose record decides. */
            int holds = 0;
            rc = record_holds(v, schema, cfg, k, h.token, &holds, err);
            if (rc != SQLITE_OK) {
                /* (busy, I/O: an error now, the journal stays) */
            } else if (!writer) {
                /* Its rows are what this connection would read (the store
                 * reads as of its durable epoch), and it cannot put them
                 * back. */
                if (!holds && epoch_durable(v->store, h.epoch)) {
                    *err = sqlite3_mprintf("a COMMIT cut off by a crash left rows that SQLite never committed in "
                                           "its store (journal %s), and a connection that may not write cannot "
                                           "put them back: use the table once from a connection that may write "
                                           "(any statement on it), then open this database again to read it",
                                           path);
                    rc = SQLITE_READONLY;
                }
            } else if (holds) {
                /* SQLite committed: only the mark was missing. */
                if (mark_done(fd, 0) != 0) {
                    *err = sqlite3_mprintf("cannot mark its store's commit journal %s done: %s", path,
                                           strerror(errno));
                    rc = SQLITE_IOERR;
                }
            } else if (!epoch_durable(v->store, h.epoch)) {
                /* The process died before the store's checkpoint completed
                 * the COMMIT's epoch: the store's own recovery went back
                 * past every write of it (and the pre-images may hold
                 * training writes it dropped).  Marked durably: after later
                 * checkpoints the epoch would look durable (J3). */
                if (mark_done(fd, 1) != 0) {
                    *err = sqlite3_mprintf("cannot mark its store's commit journal %s done: %s", path,
                                           strerror(errno));
                    rc = SQLITE_IOERR;
                }
            } else {
                rc = put_back(v, fd, &h, path, 1, err);
                if (rc == SQLITE_OK && mark_done(fd, 1) != 0) { /* J3 */
                    *err = sqlite3_mprintf("cannot mark its store's commit journal %s done: %s", path,
                                           strerror(errno));
                    rc = SQLITE_IOERR;
                }
            }
        }
        sqlite3_free(schema);
        sqlite3_free(cfg);
        if (fd >= 0) close(fd);
        sqlite3_free(path);
        ekreg_journal_drop(v->store, k);
    }
    return rc;
}
