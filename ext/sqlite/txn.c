/*
 * txn.c - the transaction write buffer of an embkv virtual table.
 *
 * Why a buffer: the engine has no transactions (every write is visible to
 * every thread at once), but SQL needs them: ROLLBACK, ROLLBACK TO and a
 * failed statement must leave no trace, a transaction must read its own
 * writes, and other connections must not see them before COMMIT.  So
 * xUpdate never writes to the store: it records the change here, in a map
 * private to the connection (id -> new vector, or deleted).  The cursors of
 * that connection overlay the map on what they read from the store.
 *
 * Savepoints (user SAVEPOINTs and the statement savepoints SQLite opens for
 * statements that may fail midway, e.g. INSERT ... SELECT in a transaction)
 * are an undo log: while a savepoint is open, each change first records the
 * entry it overwrites; ROLLBACK TO pops records down to the savepoint's mark.
 * With no savepoint open nothing is logged, so an autocommit statement or a
 * plain BEGIN ... COMMIT costs no undo memory.  A statement that fails
 * without a statement savepoint (autocommit) ends in xRollback, which drops
 * the whole buffer.
 *
 * COMMIT: xSync calls ektxn_apply(), which checks that the store has room
 * for all of it, reads the previous version of every row it will touch
 * (its pre-image), hands them to the caller's hook (the commit journal,
 * journal.c, makes them durable there) and then writes every change to the
 * store (insert/replace/delete).  If a write fails (pool full, I/O), the rows already written are
 * put back from those pre-images and the COMMIT fails with nothing changed;
 * the same pre-images serve when SQLite rolls back after a successful xSync
 * (another participant of the commit failed).  Restoring a pre-image is a
 * write, so a restored row's clock advances: contents and optimizer state
 * come back exactly, the update counter does not.
 *
 * Memory: vectors live in an arena freed when the transaction ends.  With no
 * savepoint open, a second change of the same row reuses its vector.
 */
#include "binding.h"
SQLITE_EXTENSION_INIT3

#include <stdlib.h>
#include <string.h>

typedef struct ekchunk {
    struct ekchunk *next;
    size_t used, cap;
    char data[]; /* holds floats: the 8-byte alignment of sqlite3_malloc is enough */
} ekchunk;

typedef struct ekundo {
    int64_t id;
    uint8_t had, kind, fresh;
    float *vec;
} ekundo;

typedef struct ekpre {
    int64_t id;
    int existed;    /* 1, or 2: existed but damaged (no pre-image) */
    uint64_t clock; /* when existed */
    float *data; /* dim + state_floats floats when existed */
} ekpre;

struct ektxn {
    uint32_t dim, state_floats;
    size_t vbytes;            /* dim * 4 */
    ektxn_entry *slot;        /* linear probing, cap a power of two */
    size_t cap, n;
    ekchunk *arena;           /* newest chunk first */
    ekundo *undo;
    size_t nundo, capundo;
    size_t *mark;             /* mark[k]: nundo when savepoint k began */
    int nsp, capsp;
    ekpre *pre;               /* pre-images of the last ektxn_apply */
    size_t ncol, npre;        /* pre-images taken; rows written (the first npre) */
    float *rowbuf;            /* dim + state_floats floats */
    float *cmpbuf;            /* 2 * dim floats: still_written's */
};

#define ARENA_CHUNK (256u << 10)

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

ektxn *ektxn_new(uint32_t dim, uint32_t state_floats)
{
    ektxn *t = sqlite3_malloc(sizeof *t);
    if (!t) return NULL;
    memset(t, 0, sizeof *t);
    t->dim = dim;
    t->state_floats = state_floats;
    t->vbytes = (size_t)dim * sizeof(float);
    t->rowbuf = sqlite3_malloc64(((uint64_t)dim + state_floats) * sizeof(float));
    t->cmpbuf = sqlite3_malloc64(2 * (uint64_t)dim * sizeof(float));
    if (!t->rowbuf || !t->cmpbuf) {
        sqlite3_free(t->rowbuf);
        sqlite3_free(t->cmpbuf);
        sqlite3_free(t);
        return NULL;
    }
    return t;
}

static void arena_free(ekchunk *c)
{
    while (c) {
        ekchunk *n = c->next;
        sqlite3_free(c);
        c = n;
    }
}

void ektxn_clear(ektxn *t)
{
    if (!t) return;
    /* Keep the newest chunk (if of the standard size) for the next
     * transaction; an autocommit INSERT then allocates nothing. */
    if (t->arena) {
        ekchunk *keep = t->arena->cap == ARENA_CHUNK ? t->arena : NULL;
        arena_free(keep ? t->arena->next : t->arena);
        if (keep) {
            keep->next = NULL;
            keep->used = 0;
        }
        t->arena = keep;
    }
    if (t->n) {
        if (t->cap > 1024) {
            sqlite3_free(t->slot);
            t->slot = NULL;
            t->cap = 0;
        } else {
            memset(t->slot, 0, t->cap * sizeof *t->slot);
        }
    }
    t->n = 0;
    t->nundo = 0;
    t->nsp = 0;
    sqlite3_free(t->pre);
    t->pre = NULL;
    t->npre = 0;
    t->ncol = 0;
    if (t->capundo > 4096) {
        sqlite3_free(t->undo);
        t->undo = NULL;
        t->capundo = 0;
    }
}

void ektxn_free(ektxn *t)
{
    if (!t) return;
    ektxn_clear(t);
    arena_free(t->arena);
    sqlite3_free(t->slot);
    sqlite3_free(t->undo);
    sqlite3_free(t->mark);
    sqlite3_free(t->rowbuf);
    sqlite3_free(t->cmpbuf);
    sqlite3_free(t);
}

size_t ektxn_count(const ektxn *t) { return t ? t->n : 0; }
size_t ektxn_nslots(const ektxn *t) { return t ? t->cap : 0; }

const ektxn_entry *ektxn_slot(const ektxn *t, size_t i)
{
    return (i < t->cap && t->slot[i].used) ? &t->slot[i] : NULL;
}

/* The slot holding id, or the empty slot where it would go. */
static ektxn_entry *probe(const ektxn *t, int64_t id)
{
    size_t m = t->cap - 1;
    size_t i = (size_t)mix64((uint64_t)id) & m;
    while (t->slot[i].used && t->slot[i].id != id) i = (i + 1) & m;
    return &t->slot[i];
}

const ektxn_entry *ektxn_find(const ektxn *t, int64_t id)
{
    if (!t || t->n == 0) return NULL;
    const ektxn_entry *e = probe(t, id);
    return e->used ? e : NULL;
}

static int grow_map(ektxn *t, size_t need)
{
    size_t cap = t->cap ? t->cap : 64;
    while (need * 2 > cap) cap *= 2;
    if (cap == t->cap) return SQLITE_OK;
    ektxn_entry *ns = sqlite3_malloc64((uint64_t)cap * sizeof *ns);
    if (!ns) return SQLITE_NOMEM;
    memset(ns, 0, cap * sizeof *ns);
    ektxn_entry *old = t->slot;
    size_t oldcap = t->cap;
    t->slot = ns;
    t->cap = cap;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].used) *probe(t, old[i].id) = old[i];
    sqlite3_free(old);
    return SQLITE_OK;
}

static void *arena_take(ektxn *t, size_t bytes)
{
    bytes = (bytes + 15) & ~(size_t)15;
    ekchunk *c = t->arena;
    if (!c || c->cap - c->used < bytes) {
        size_t cap = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
        c = sqlite3_malloc64(sizeof *c + cap);
        if (!c) return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = t->arena;
        t->arena = c;
    }
    void *p = c->data + c->used;
    c->used += bytes;
    return p;
}

int ektxn_reserve(ektxn *t, size_t k)
{
    if (t->n + k > t->cap / 2 && grow_map(t, t->n + k) != SQLITE_OK) return SQLITE_NOMEM;
    if (t->nsp > 0 && t->nundo + k > t->capundo) {
        size_t cap = t->capundo ? t->capundo * 2 : 256;
        while (cap < t->nundo + k) cap *= 2;
        ekundo *u = sqlite3_realloc64(t->undo, (uint64_t)cap * sizeof *u);
        if (!u) return SQLITE_NOMEM;
        t->undo = u;
        t->capundo = cap;
    }
    size_t bytes = k * ((t->vbytes + 15) & ~(size_t)15);
    ekchunk *c = t->arena;
    if (!c || c->cap - c->used < bytes) {
        size_t cap = bytes > ARENA_CHUNK ? bytes : ARENA_CHUNK;
        c = sqlite3_malloc64(sizeof *c + cap);
        if (!c) return SQLITE_NOMEM;
        c->cap = cap;
        c->used = 0;
        c->next = t->arena;
        t->arena = c;
    }
    return SQLITE_OK;
}

int ektxn_set(ektxn *t, int64_t id, int kind, int fresh, const float *vec)
{
    ektxn_entry *e = probe(t, id);
    float *dst = NULL;
    if (kind == EKTXN_PUT) {
        /* No savepoint can need the old vector: overwrite it in place. */
        dst = (e->used && e->vec && t->nsp == 0) ? e->vec : arena_take(t, t->vbytes);
        if (!dst) return SQLITE_NOMEM; /* not after ektxn_reserve */
    }
    /* A DELETE of a row this transaction INSERTed where the store had none
     * leaves the store as it found it: COMMIT skips it (a row a pull made
     * meanwhile is not this transaction's to delete). */
    int undo_insert = kind == EKTXN_DEL && e->used && e->kind == EKTXN_PUT && e->fresh == EKTXN_FRESH_NEW;
    if (t->nsp > 0) {
        ekundo *u = &t->undo[t->nundo++];
        u->id = id;
        u->had = e->used;
        u->kind = e->kind;
        u->fresh = e->fresh;
        u->vec = e->vec;
    }
    if (dst) {
        memcpy(dst, vec, t->vbytes);
        e->vec = dst;
    } else if (t->nsp > 0) {
        e->vec = NULL; /* the undo record owns the old vector */
    }
    if (!e->used) {
        e->used = 1;
        e->id = id;
        t->n++;
    }
    e->kind = (uint8_t)kind;
    e->fresh = (uint8_t)(kind == EKTXN_PUT ? fresh : undo_insert ? EKTXN_FRESH_NEW : 0);
    return SQLITE_OK;
}

/* Backward-shift deletion for linear probing. */
static void remove_slot(ektxn *t, ektxn_entry *e)
{
    size_t m = t->cap - 1;
    size_t i = (size_t)(e - t->slot);
    size_t j = i;
    for (;;) {
        j = (j + 1) & m;
        if (!t->slot[j].used) break;
        size_t home = (size_t)mix64((uint64_t)t->slot[j].id) & m;
        /* Move slot j into the hole at i unless its home lies in (i, j]. */
        int in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            t->slot[i] = t->slot[j];
            i = j;
        }
    }
    memset(&t->slot[i], 0, sizeof t->slot[i]);
    t->n--;
}

int ektxn_savepoint(ektxn *t, int n)
{
    /* Already open: another table sharing this buffer (binding.h,
     * ekwbuf) joined the transaction and is told of the savepoints it
     * missed; the mark set when the savepoint began stays. */
    if (n < 0 || n < t->nsp) return SQLITE_OK;
    if (n >= t->capsp) {
        int cap = t->capsp ? t->capsp : 8;
        while (cap <= n) cap *= 2;
        size_t *m = sqlite3_realloc64(t->mark, (uint64_t)cap * sizeof *m);
        if (!m) return SQLITE_NOMEM;
        t->mark = m;
        t->capsp = cap;
    }
    /* Savepoints below n that we were never told about (the table joined
     * the transaction after they began) hold the state we started from. */
    for (int k = t->nsp; k < n; k++) t->mark[k] = t->nundo;
    t->mark[n] = t->nundo;
    t->nsp = n + 1;
    return SQLITE_OK;
}

void ektxn_release(ektxn *t, int n)
{
    if (n < 0) n = 0;
    if (n < t->nsp) t->nsp = n;
    if (t->nsp == 0) t->nundo = 0; /* nothing can be rolled back to any more */
}

void ektxn_rollback_to(ektxn *t, int n)
{
    if (n < 0) {
        /* Back to the start of the transaction (ROLLBACK TO the savepoint
         * that began it, which SQLite numbers -1): everything goes, changes
         * made while no savepoint was open (and so not logged) included. */
        ektxn_clear(t);
        return;
    }
    if (n >= t->nsp) return;
    size_t to = t->mark[n];
    while (t->nundo > to) {
        ekundo *u = &t->undo[--t->nundo];
        ektxn_entry *e = probe(t, u->id);
        if (!u->had) {
            if (e->used) remove_slot(t, e);
        } else {
            if (!e->used) { /* cannot happen: entries only disappear through undo */
                e->used = 1;
                e->id = u->id;
                t->n++;
            }
            e->kind = u->kind;
            e->fresh = u->fresh;
            e->vec = u->vec;
        }
    }
    t->nsp = n + 1;
}

/* Puts the store back from the pre-images (clock and optimizer state
 * included), newest first, inside the caller's write group. */
uint64_t ek_vec_hash(const float *v, uint32_t dim)
{
    const unsigned char *b = (const unsigned char *)v;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < (size_t)dim * sizeof(float); i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The hash of what a PUT stores: its vector as the store's dtype rounds it. */
static uint64_t written_hash(ektxn *t, embkv_store *s, const ektxn_entry *e)
{
    float *r = t->cmpbuf + t->dim;
    if (embkv_dtype_round(embkv_dtype(s), t->dim, e->vec, r) != 0) memcpy(r, e->vec, t->vbytes);
    return ek_vec_hash(r, t->dim);
}

int ek_get_quiet(embkv_store *s, int64_t id, float *vec, float *state, embkv_rowinfo *info)
{
    uint8_t found = 0;
    int rc = embkv_get_rows_at(s, NULL, &id, 1, vec, state, info, &found, NULL);
    return rc != EMBKV_OK ? rc : found ? EMBKV_OK : EMBKV_NOTFOUND;
}

/* Whether e's row is still as the apply left it (nobody wrote it since:
 * a push, a COMMIT of another database file on the store): only such a
 * row is put back, so that the last writer wins, as everywhere else. */
static int still_written(ektxn *t, embkv_store *s, const ektxn_entry *e)
{
    int rc = ek_get_quiet(s, e->id, t->cmpbuf, NULL, NULL);
    if (e->kind == EKTXN_DEL) return rc == EMBKV_NOTFOUND;
    return rc == EMBKV_OK && ek_vec_hash(t->cmpbuf, t->dim) == written_hash(t, s, e);
}

static int restore(ektxn *t, embkv_store *s)
{
    int first_rc = EMBKV_OK;
    while (t->npre > 0) {
        ekpre *p = &t->pre[--t->npre];
        int rc;
        if (!still_written(t, s, probe(t, p->id))) {
            rc = EMBKV_OK;  /* written since: that write stays */
        } else if (p->existed == 2) {
            rc = EMBKV_OK;  /* a damaged row that was deleted: nothing to put back */
        } else if (p->existed) {
            /* (a store from before clocks stopped at 2^63 - 1 may hold one past it) */
            uint64_t clock = p->clock < (uint64_t)INT64_MAX ? p->clock : (uint64_t)INT64_MAX;
            rc = embkv_put_clock(s, p->id, p->data, t->state_floats ? p->data + t->dim : NULL, clock);
        } else {
            rc = embkv_delete(s, p->id);
            if (rc == EMBKV_NOTFOUND) rc = EMBKV_OK;
        }
        if (rc != EMBKV_OK && first_rc == EMBKV_OK) first_rc = rc;
    }
    return first_rc;
}

/* After a failed write: put the rows back and keep the first message. */
static void undo_failed(ektxn *t, embkv_store *s, char **msg, int *restored)
{
    *restored = restore(t, s) == EMBKV_OK;
    if (!*restored) {
        char *both = sqlite3_mprintf("%s; putting back the rows written before it failed too: %s",
                                     *msg ? *msg : "out of memory", embkv_errmsg());
        sqlite3_free(*msg);
        *msg = both;
    }
}

static int apply_in_group(ektxn *t, embkv_store *s, int64_t *fail_id, char **msg, int *restored,
                          ektxn_hook before, void *ctx);

/* One engine write group: snapshot readers (other statements, other
 * connections) see the whole COMMIT or none of it, and no checkpoint falls
 * inside it. */
int ektxn_apply(ektxn *t, embkv_store *s, int64_t *fail_id, char **msg, int *restored, ektxn_hook before,
                void *ctx)
{
    *fail_id = 0;
    *msg = NULL;
    *restored = 1;
    int rc = embkv_group_begin(s);
    if (rc != EMBKV_OK) {
        *msg = sqlite3_mprintf("%s", embkv_errmsg());
        return rc;
    }
    rc = apply_in_group(t, s, fail_id, msg, restored, before, ctx);
    embkv_group_end(s);
    return rc;
}

static const char unique_msg[] = "the row was created by another connection or a pull after this transaction "
                                 "inserted it (UNIQUE constraint failed)";

static int apply_in_group(ektxn *t, embkv_store *s, int64_t *fail_id, char **msg, int *restored,
                          ektxn_hook before, void *ctx)
{
    *fail_id = 0;
    *msg = NULL;
    *restored = 1;
    sqlite3_free(t->pre);
    t->npre = 0;
    t->ncol = 0;
    t->pre = NULL;
    if (t->n == 0) return EMBKV_OK;
    /* Before writing anything: an INSERT that found its id free must still
     * find it free, and the room must be there (undoing deletes on a full
     * pool would need room too). */
    uint64_t puts = 0, deletes = 0, new_ids = 0;
    for (size_t i = 0; i < t->cap; i++) {
        const ektxn_entry *e = &t->slot[i];
        if (!e->used) continue;
        if (e->kind == EKTXN_DEL) {
            deletes += e->fresh != EKTXN_FRESH_NEW;
            continue;
        }
        int exists = embkv_exists(s, e->id) == 1;
        if (exists && e->fresh == EKTXN_FRESH_NEW) {
            *fail_id = e->id;
            *msg = sqlite3_mprintf("%s", unique_msg);
            return EMBKV_EXISTS;
        }
        puts++;
        new_ids += !exists;
    }
    int room = embkv_grow_index_for(s, new_ids);
    if (room == EMBKV_OK) room = embkv_room_for(s, puts, deletes);
    if (room != EMBKV_OK) {
        *msg = sqlite3_mprintf("%s", embkv_errmsg());
        return room;
    }
    t->pre = sqlite3_malloc64((uint64_t)t->n * sizeof *t->pre);
    if (!t->pre) return EMBKV_NOMEM;
    size_t rowbytes = ((size_t)t->dim + t->state_floats) * sizeof(float);
    float *state = t->state_floats ? t->rowbuf + t->dim : NULL;
    /* Every pre-image first, so that the hook (the commit journal) has them
     * all before the first write. */
    for (size_t i = 0; i < t->cap; i++) {
        const ektxn_entry *e = &t->slot[i];
        if (!e->used || (e->kind == EKTXN_DEL && e->fresh == EKTXN_FRESH_NEW)) continue;
        ekpre *p = &t->pre[t->ncol];
        p->id = e->id;
        p->existed = 0;
        p->clock = 0;
        p->data = NULL;
        embkv_rowinfo info;
        int rc = ek_get_quiet(s, e->id, t->rowbuf, state, &info);
        if (rc == EMBKV_OK) {
            p->clock = info.clock;
            p->data = arena_take(t, rowbytes);
            if (!p->data) {
                *fail_id = e->id;
                *msg = sqlite3_mprintf("out of memory");
                return EMBKV_NOMEM;
            }
            memcpy(p->data, t->rowbuf, rowbytes);
            p->existed = 1;
        } else if (rc == EMBKV_CORRUPT && e->kind == EKTXN_DEL) {
            /* A damaged row can be deleted (its pre-image cannot be kept:
             * a failed COMMIT leaves it deleted). */
            p->existed = 2;
        } else if (rc != EMBKV_NOTFOUND) {
            *fail_id = e->id;
            *msg = sqlite3_mprintf("%s", embkv_errmsg());
            return rc;
        }
        t->ncol++;
    }
    if (before) {
        int rc = before(ctx, t, msg);
        if (rc != EMBKV_OK) return rc;
    }
    /* The writes, in the order of the pre-images: t->npre counts those
     * written, the ones to put back on failure. */
    for (size_t k = 0; k < t->ncol; k++) {
        ekpre *p = &t->pre[k];
        const ektxn_entry *e = probe(t, p->id);
        int rc;
        if (e->kind == EKTXN_DEL) {
            rc = p->existed ? embkv_delete(s, e->id) : EMBKV_OK;
            if (rc == EMBKV_NOTFOUND) rc = EMBKV_OK;
        } else {
            /* An INSERT must still find its id free (a pull may have
             * created it since the check above: the engine decides under
             * the id's lock); a REPLACE starts the row anew (clock 0) in
             * one switch, never leaving it absent. */
            unsigned flags = e->fresh == EKTXN_FRESH_NEW ? EMBKV_PUT_INSERT
                             : e->fresh                  ? EMBKV_PUT_RESET
                                                         : 0;
            rc = embkv_put(s, e->id, e->vec, NULL, flags);
        }
        if (rc != EMBKV_OK) {
            /* Take the engine's message before restoring overwrites it;
             * only the rows written are put back (a failed write wrote
             * nothing). */
            *fail_id = e->id;
            *msg = sqlite3_mprintf("%s", rc == EMBKV_EXISTS ? unique_msg : embkv_errmsg());
            undo_failed(t, s, msg, restored);
            return rc;
        }
        t->npre++;
    }
    return EMBKV_OK;
}

size_t ektxn_npre(const ektxn *t) { return t->ncol; }

int ektxn_pre(ektxn *t, embkv_store *s, size_t k, int64_t *id, uint64_t *clock, const float **data, int *kind,
              uint64_t *whash)
{
    const ekpre *p = &t->pre[k];
    const ektxn_entry *e = probe(t, p->id);
    *id = p->id;
    *clock = p->clock;
    *data = p->data;
    *kind = e->kind;
    *whash = e->kind == EKTXN_PUT ? written_hash(t, s, e) : 0;
    return p->existed;
}

int ektxn_unapply(ektxn *t, embkv_store *s)
{
    int rc = embkv_group_begin(s);
    if (rc != EMBKV_OK) return rc;
    rc = restore(t, s);
    embkv_group_end(s);
    return rc;
}
