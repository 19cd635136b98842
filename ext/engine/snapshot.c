/*
 * snapshot.c - write groups and snapshot reads.
 *
 * The visibility rule.  Every change to rows is made inside a write group:
 * a COMMIT, a push (with the rows it creates), a pull's row creation, or a
 * single put/delete of the C API.  A snapshot sees each group entirely or
 * not at all, and sees no group that began after it was opened.  A sync
 * (checkpoint) never falls inside a group, so a crash returns to a state
 * with each group entirely or not at all, too.
 *
 * How (P7).  Groups hold the store's `groups` lock shared; opening a snapshot
 * (sync.c: embkv_snapshot_open) takes it exclusively for an instant, so every group is wholly before or
 * wholly after the snapshot's sequence number S.  Groups that begin while
 * any snapshot is open log, before switching a row's index entry, the
 * location the row had (the version log: id -> newest-first list of
 * (group sequence, previous location)).  A snapshot reader looks a row up in
 * the index as usual and then, if the log holds an entry of a group at or
 * after S for that id, uses the oldest such entry's location instead: that
 * is the version as of S (LOC_NONE or a tombstone: absent then).
 *
 * Why this and not copying: readers pay nothing while no writer runs beside
 * them (one load sees an empty log); writers pay nothing while no snapshot
 * is open (one load at the start of a group).  Old versions stay readable
 * because reclamation never frees a record retired after the oldest open
 * snapshot began (P6) (slab_reclaim() takes snap_floor into account): an open
 * statement holds the old versions of rows changed meanwhile, as in any
 * multi-version store.  The log is trimmed when snapshots close.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"

#define VLOG_STRIPES 64
#define TL_GROUPS 8

typedef struct vnode {
    uint64_t w;        /* group sequence of the change */
    uint64_t loc;      /* location before it (as stored, may carry LOC_TOMB) */
    uint32_t older;    /* index + 1 of the previous change of the id, 0 none */
    int64_t id;
} vnode;

typedef struct vslot {
    int64_t id;
    uint32_t head;     /* index + 1 of the newest change, 0 = empty slot */
} vslot;

typedef struct vstripe {
    pthread_mutex_t mu;
    vnode *nodes;
    size_t nnodes, capnodes;
    vslot *tab;        /* open addressing, power-of-two size */
    size_t captab, ntab;
} vstripe;

struct embkv_snapshot {
    embkv_store *s;
    uint64_t seq;          /* groups with w >= seq are not visible */
    uint64_t floor;        /* ebr epoch when opened */
    struct embkv_snapshot *next;
    /* A reader process's snapshot (s->reader): the durable epoch its reads
     * are as of, read inside the reader slot it holds open (readonly.c). */
    uint64_t as_of;
};

embkv_snapshot *snap_reader_new(embkv_store *s, uint64_t as_of)
{
    embkv_snapshot *snap = calloc(1, sizeof *snap);
    if (snap) {
        snap->s = s;
        snap->as_of = as_of;
        atomic_fetch_add(&s->open_snaps, 1);
    }
    return snap;
}

uint64_t snap_as_of(const embkv_snapshot *snap) { return snap ? snap->as_of : 0; }

int snap_check_store(embkv_store *s, const embkv_snapshot *snap, const char *fn)
{
    if (!snap || snap->s == s)
        return EMBKV_OK;
    /* Another store's snapshot resolves nothing here (its version log and
     * epochs are that store's): the read would be of the current rows, or
     * wrong ones, with nothing to say so. */
    const char *other = snap->s->path;
    if (strcmp(other, s->path) == 0)
        return embkv__err(EMBKV_INVALID, "%s: the snapshot was opened on another handle of store %s (its %s one): "
                          "read through the handle it was opened on", fn, s->path,
                          snap->s->reader ? "read-only" : "writer's");
    return embkv__err(EMBKV_INVALID, "%s: the snapshot belongs to store %s, not %s: open a snapshot of %s "
                      "(embkv_snapshot_open) to read it", fn, other, s->path, s->path);
}

struct snapstate {
    pthread_rwlock_t groups;
    atomic_uint_fast64_t next_seq;
    atomic_uint nsnap;
    pthread_mutex_t mu;            /* the list of open snapshots */
    embkv_snapshot *open;
    atomic_uint_fast64_t logged;   /* nodes in the log */
    /* The newest open snapshot's seq (UINT64_MAX while one is not fixed
     * yet, 0 with none): a version made by group w is one some open
     * snapshot may read only if this is above w (snap_log). */
    atomic_uint_fast64_t pin_above;
    vstripe stripes[VLOG_STRIPES];
};

/* The groups a thread is inside, per store (nested begins count). */
static _Thread_local struct tl_group {
    embkv_store *s;
    unsigned depth;
    uint64_t seq;
    bool logging;
    size_t held;               /* its part of s->room_held */
} tl_groups[TL_GROUPS];

static struct tl_group *tl_find(embkv_store *s)
{
    for (int i = 0; i < TL_GROUPS; i++)
        if (tl_groups[i].s == s && tl_groups[i].depth)
            return &tl_groups[i];
    return NULL;
}

int snap_init(embkv_store *s)
{
    struct snapstate *st = calloc(1, sizeof *st);
    if (!st)
        return EMBKV_NOMEM;
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* Snapshots and syncs must not starve behind a stream of pushes. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&st->groups, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&st->mu, NULL);
    for (int i = 0; i < VLOG_STRIPES; i++)
        pthread_mutex_init(&st->stripes[i].mu, NULL);
    atomic_store(&st->next_seq, 1);
    s->snap = st;
    atomic_store(&s->snap_floor, UINT64_MAX);
    return EMBKV_OK;
}

void snap_free(embkv_store *s)
{
    struct snapstate *st = s->snap;
    if (!st)
        return;
    for (int i = 0; i < VLOG_STRIPES; i++) {
        free(st->stripes[i].nodes);
        free(st->stripes[i].tab);
        pthread_mutex_destroy(&st->stripes[i].mu);
    }
    pthread_rwlock_destroy(&st->groups);
    pthread_mutex_destroy(&st->mu);
    free(st);
    s->snap = NULL;
}

/* ------------------------------------------------------------ groups */

int embkv_group_begin(embkv_store *s)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_group_begin: store is NULL");
    RO_REFUSE(s, "writing rows (embkv_group_begin)");
    struct tl_group *g = tl_find(s);
    if (g) {
        g->depth++;
        return EMBKV_OK;
    }
    for (int i = 0; i < TL_GROUPS && !g; i++)
        if (!tl_groups[i].depth)
            g = &tl_groups[i];
    if (!g)
        return embkv__err(EMBKV_BUSY, "store %s: write groups open on more than %d stores in this thread",
                          s->path, TL_GROUPS);
    struct snapstate *st = s->snap;
    /* (A sync waiting for the groups holds new ones off: in a pinned
     * thread, that sync may wait for a group that waits for this pin.) */
    int rc = pinned_lock(s, PIN_WAIT_RDLOCK, &st->groups, "a write");
    if (rc != EMBKV_OK)
        return rc;
    g->s = s;
    g->depth = 1;
    g->seq = atomic_fetch_add(&st->next_seq, 1);
    g->logging = atomic_load(&st->nsnap) > 0;
    g->held = 0;
    return EMBKV_OK;
}

uint64_t embkv_group_epoch(embkv_store *s)
{
    /* A sync moves cur_epoch on only while it holds the groups off. */
    return s && tl_find(s) ? atomic_load(&s->cur_epoch) : 0;
}

void embkv_group_end(embkv_store *s)
{
    struct tl_group *g = s ? tl_find(s) : NULL;
    if (!g || --g->depth)
        return;
    if (g->held) {
        atomic_fetch_sub(&s->room_held, g->held);
        g->held = 0;
    }
    g->s = NULL;
    pthread_rwlock_unlock(&s->snap->groups);
}

bool group_held(embkv_store *s)
{
    return tl_find(s) != NULL;
}

void group_note_hold(embkv_store *s, size_t records)
{
    struct tl_group *g = tl_find(s);
    if (g)
        g->held += records;
}

bool group_logging(embkv_store *s)
{
    struct tl_group *g = tl_find(s);
    return g && g->logging;
}

bool group_token_of(embkv_store *s, group_token *out)
{
    struct tl_group *g = tl_find(s);
    if (!g)
        return false;
    out->seq = g->seq;
    out->logging = g->logging;
    return true;
}

int group_join(embkv_store *s, const group_token *t)
{
    struct tl_group *g = NULL;
    for (int i = 0; i < TL_GROUPS && !g; i++)
        if (!tl_groups[i].depth)
            g = &tl_groups[i];
    if (!g || tl_find(s))
        return embkv__err(EMBKV_BUSY, "store %s: no write group entry left in this thread", s->path);
    g->s = s;
    g->depth = 1;
    g->seq = t->seq;
    g->logging = t->logging;
    g->held = 0;
    return EMBKV_OK;
}

void group_leave(embkv_store *s)
{
    struct tl_group *g = tl_find(s);
    if (g) {
        if (g->held)
            atomic_fetch_sub(&s->room_held, g->held);
        g->held = 0;
        g->depth = 0;
        g->s = NULL;
    }
}

int groups_quiesce(embkv_store *s, const char *what)
{
    return pinned_lock(s, PIN_WAIT_WRLOCK, &s->snap->groups, what);
}

void groups_resume(embkv_store *s)
{
    pthread_rwlock_unlock(&s->snap->groups);
}

/* ------------------------------------------------------------ the log */

static inline vstripe *stripe_for(struct snapstate *st, uint64_t h)
{
    return &st->stripes[(h >> 8) & (VLOG_STRIPES - 1)];
}

static vslot *tab_slot(vstripe *vs, int64_t id, uint64_t h)
{
    size_t mask = vs->captab - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask)
        if (!vs->tab[i].head || vs->tab[i].id == id)
            return &vs->tab[i];
}

static int tab_grow(vstripe *vs)
{
    size_t cap = vs->captab ? vs->captab * 2 : 64;
    vslot *old = vs->tab;
    size_t oldcap = vs->captab;
    vs->tab = calloc(cap, sizeof *vs->tab);
    if (!vs->tab) {
        vs->tab = old;
        return EMBKV_NOMEM;
    }
    vs->captab = cap;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i].head)
            *tab_slot(vs, old[i].id, embkv__hash(old[i].id)) = old[i];
    free(old);
    return EMBKV_OK;
}

/* Called by writers in a logging group, before the index entry of id
 * changes; prev is the location it has now (LOC_NONE when absent). */
int snap_log(embkv_store *s, int64_t id, uint64_t h, uint64_t prev, bool *pinned)
{
    struct tl_group *g = tl_find(s);
    if (pinned)
        *pinned = g != NULL;  /* (outside a group: as before, pinned) */
    if (!g || !g->logging) {
        /* No snapshot was open when the group began, and none can open
         * before it ends (P7): none may read prev's version. */
        if (pinned && g)
            *pinned = false;
        return EMBKV_OK;
    }
    struct snapstate *st = s->snap;
    vstripe *vs = stripe_for(st, h);
    int rc = EMBKV_OK;
    pthread_mutex_lock(&vs->mu);
    if ((vs->ntab + 1) * 2 > vs->captab && tab_grow(vs) != EMBKV_OK)
        rc = EMBKV_NOMEM;
    if (rc == EMBKV_OK && vs->nnodes == vs->capnodes) {
        size_t cap = vs->capnodes ? vs->capnodes * 2 : 256;
        vnode *p = realloc(vs->nodes, cap * sizeof *p);
        if (p) {
            vs->nodes = p;
            vs->capnodes = cap;
        } else {
            rc = EMBKV_NOMEM;
        }
    }
    if (rc == EMBKV_OK) {
        vslot *sl = tab_slot(vs, id, h);
        if (!sl->head) {
            sl->id = id;
            vs->ntab++;
        }
        /* prev's version was made by the group of the id's newest logged
         * change (the id's writes are serialized), or before logging began
         * (0: any open snapshot may read it).  It is some snapshot's only if
         * one opened after it was made; one opening after now (a later seq)
         * sees this change instead. */
        if (pinned)
            *pinned = atomic_load(&st->pin_above) > (sl->head ? vs->nodes[sl->head - 1].w : 0);
        vs->nodes[vs->nnodes] = (vnode){.w = g->seq, .loc = prev, .older = sl->head, .id = id};
        sl->head = (uint32_t)++vs->nnodes;
        atomic_fetch_add(&st->logged, 1);
    }
    pthread_mutex_unlock(&vs->mu);
    return rc == EMBKV_OK ? EMBKV_OK
                          : embkv__err(rc, "store %s: id %lld: out of memory keeping its version for a reader",
                                       s->path, (long long)id);
}

/* The location of id as of seq, when the log knows it (true). */
static bool log_lookup(vstripe *vs, int64_t id, uint64_t h, uint64_t seq, uint64_t *loc)
{
    if (!vs->captab)
        return false;
    vslot *sl = tab_slot(vs, id, h);
    bool found = false;
    for (uint32_t k = sl->head; k; k = vs->nodes[k - 1].older) {
        const vnode *nd = &vs->nodes[k - 1];
        if (nd->w < seq)
            break;  /* older changes were all visible to the snapshot */
        *loc = nd->loc;
        found = true;
    }
    return found;
}

/* Drop the changes no open snapshot can need (all of them when none is
 * open): a snapshot S needs only changes of groups w >= S. */
static void log_trim(struct snapstate *st, uint64_t min_seq)
{
    for (int i = 0; i < VLOG_STRIPES; i++) {
        vstripe *vs = &st->stripes[i];
        pthread_mutex_lock(&vs->mu);
        size_t keep = 0;
        if (min_seq != UINT64_MAX)
            for (size_t k = 0; k < vs->nnodes; k++)
                keep += vs->nodes[k].w >= min_seq;
        if (keep == vs->nnodes) {
            pthread_mutex_unlock(&vs->mu);
            continue;
        }
        /* Rebuild the stripe from the nodes kept, oldest first (out of
         * memory: keep everything until the next trim). */
        vnode *kept = keep ? malloc(keep * sizeof *kept) : NULL;
        if (keep && !kept) {
            pthread_mutex_unlock(&vs->mu);
            continue;
        }
        vnode *old = vs->nodes;
        size_t nold = vs->nnodes;
        atomic_fetch_sub(&st->logged, nold - keep);
        memset(vs->tab, 0, vs->captab * sizeof *vs->tab);
        vs->ntab = 0;
        vs->nodes = kept;
        vs->nnodes = 0;
        vs->capnodes = keep;
        for (size_t k = 0; k < nold; k++) {
            if (old[k].w < min_seq)
                continue;
            uint64_t h = embkv__hash(old[k].id);
            vslot *sl = tab_slot(vs, old[k].id, h);
            if (!sl->head) {
                sl->id = old[k].id;
                vs->ntab++;
            }
            vs->nodes[vs->nnodes] = old[k];
            vs->nodes[vs->nnodes].older = sl->head;
            sl->head = (uint32_t)++vs->nnodes;
        }
        free(old);
        pthread_mutex_unlock(&vs->mu);
    }
}

/* ------------------------------------------------------------ snapshots */

static void recompute_floor(embkv_store *s, uint64_t *min_seq)
{
    struct snapstate *st = s->snap;
    uint64_t floor = UINT64_MAX, mseq = UINT64_MAX, newest = 0;
    for (embkv_snapshot *p = st->open; p; p = p->next) {
        if (p->floor < floor)
            floor = p->floor;
        if (p->seq < mseq)
            mseq = p->seq;
        uint64_t q = p->seq ? p->seq : UINT64_MAX;
        if (q > newest)
            newest = q;
    }
    atomic_store(&st->pin_above, newest);
    atomic_store(&s->snap_floor, floor);
    if (min_seq)
        *min_seq = mseq;
}

int snap_register(embkv_store *s, embkv_snapshot **out)
{
    *out = NULL;
    embkv_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for a snapshot", s->path);
    struct snapstate *st = s->snap;
    snap->s = s;
    snap->seq = 0;  /* until known: a trim meanwhile keeps every change */
    pthread_mutex_lock(&st->mu);
    snap->floor = ebr_now();
    snap->next = st->open;
    st->open = snap;
    recompute_floor(s, NULL);
    atomic_fetch_add(&st->nsnap, 1);
    pthread_mutex_unlock(&st->mu);
    atomic_fetch_add(&s->open_snaps, 1);
    *out = snap;
    return EMBKV_OK;
}

void snap_fix(embkv_snapshot *snap)
{
    struct snapstate *st = snap->s->snap;
    uint64_t seq = atomic_load(&st->next_seq);
    pthread_mutex_lock(&st->mu);
    snap->seq = seq;
    recompute_floor(snap->s, NULL);
    pthread_mutex_unlock(&st->mu);
}

void snap_drop(embkv_snapshot *snap)
{
    snap->seq = UINT64_MAX;
    embkv_snapshot_close(snap);
}

void embkv_snapshot_close(embkv_snapshot *snap)
{
    if (!snap)
        return;
    embkv_store *s = snap->s;
    if (s->reader) {
        /* (in a fork's child the thread's reader slot is the parent's:
         * left alone, or the parent's read would lose its protection) */
        if (!handle_forked(s))
            rd_leave(s);
        free(snap);
        atomic_fetch_sub(&s->open_snaps, 1);
        return;
    }
    struct snapstate *st = s->snap;
    uint64_t min_seq;
    pthread_mutex_lock(&st->mu);
    for (embkv_snapshot **pp = &st->open; *pp; pp = &(*pp)->next)
        if (*pp == snap) {
            *pp = snap->next;
            break;
        }
    recompute_floor(s, &min_seq);
    atomic_fetch_sub(&st->nsnap, 1);
    /* Trimming under the list lock: a snapshot opening meanwhile must not
     * lose changes it needs (its seq is 0 until known). */
    if (atomic_load(&st->logged))
        log_trim(st, min_seq);
    pthread_mutex_unlock(&st->mu);
    free(snap);
    atomic_fetch_sub(&s->open_snaps, 1);
}

uint64_t embkv_snapshot_seq(const embkv_snapshot *snap)
{
    return snap ? snap->seq : 0;
}

/* Replaces locs[i] by the location each id had as of the snapshot where the
 * log knows better.  Must run after the index lookups that produced locs. */
void snap_resolve(embkv_store *s, const embkv_snapshot *snap, const int64_t *ids, size_t n, uint64_t *locs,
                  uint8_t *logged)
{
    struct snapstate *st = s->snap;
    if (logged)
        memset(logged, 0, n);
    if (!snap || atomic_load(&st->logged) == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = embkv__hash(ids[i]);
        vstripe *vs = stripe_for(st, h);
        pthread_mutex_lock(&vs->mu);
        bool hit = log_lookup(vs, ids[i], h, snap->seq, &locs[i]);
        pthread_mutex_unlock(&vs->mu);
        if (logged)
            logged[i] = hit;
    }
}

int embkv_snapshot_changed_ids(embkv_snapshot *snap, int64_t **ids, size_t *n)
{
    if (!snap || !ids || !n)
        return embkv__null_arg("embkv_snapshot_changed_ids", "snap", (const void *)snap, "ids", (const void *)ids,
                               "n", (const void *)n, (char *)NULL);
    *ids = NULL;
    *n = 0;
    if (snap->s->reader)
        return EMBKV_OK;  /* (its reads follow versions back themselves) */
    struct snapstate *st = snap->s->snap;
    size_t cap = 0, cnt = 0;
    int64_t *out = NULL;
    for (int i = 0; i < VLOG_STRIPES; i++) {
        vstripe *vs = &st->stripes[i];
        pthread_mutex_lock(&vs->mu);
        for (size_t k = 0; k < vs->captab; k++) {
            if (!vs->tab[k].head)
                continue;
            int64_t id = vs->tab[k].id;
            uint64_t loc = LOC_NONE;
            if (!log_lookup(vs, id, embkv__hash(id), snap->seq, &loc) || loc == LOC_NONE || (loc & LOC_TOMB))
                continue;
            if (cnt == cap) {
                size_t nc = cap ? cap * 2 : 256;
                int64_t *p = realloc(out, nc * sizeof *p);
                if (!p) {
                    pthread_mutex_unlock(&vs->mu);
                    free(out);
                    return embkv__err(EMBKV_NOMEM, "store %s: out of memory listing changed rows",
                                      snap->s->path);
                }
                out = p;
                cap = nc;
            }
            out[cnt++] = id;
        }
        pthread_mutex_unlock(&vs->mu);
    }
    *ids = out;
    *n = cnt;
    return EMBKV_OK;
}
