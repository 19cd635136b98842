/*
 * epoch.c - epoch-based reclamation for lock-free readers.
 *
 * Readers announce the global epoch they entered in; a record replaced
 * copy-on-write is tagged with the epoch of its retirement and freed only
 * when every reader still inside started after it.  One domain serves every
 * store of the process, so a reader thread owns one announcement slot, from
 * its first read to its exit, and there are as many as threads.
 *
 * Readers in other processes (a store's reader table, readers.c) take
 * part through hooks: each reclamation publishes its epoch to them and
 * asks for their oldest, and a synchronize waits for them too.  The hooks
 * are function pointers so that this file needs nothing above it.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "base.h"

/* Slots come in chunks, linked as threads need them and never freed: a
 * thread that used a store keeps its slot until it exits, and a process
 * may keep any number of threads alive (a server's pool, a loader's
 * workers), so a fixed table would make the thread after it wait for an
 * exit that may never come.  A chunk is published (its link) before any
 * of its slots counts in high_water, so a scan up to high_water finds
 * every link it walks. */
#define EBR_CHUNK 1024

typedef struct ebr_slot {
    atomic_uint_fast64_t epoch;  /* 0 when the owning thread is outside */
    atomic_int owned;
    char pad[64 - sizeof(atomic_uint_fast64_t) - sizeof(atomic_int)];
} ebr_slot;

typedef struct ebr_chunk {
    ebr_slot slots[EBR_CHUNK];
    _Atomic(struct ebr_chunk *) next;
} ebr_chunk;

static ebr_chunk first_chunk __attribute__((aligned(64)));
static atomic_uint_fast64_t global_epoch = 1;
static atomic_uint high_water;  /* slots ever handed out, over all chunks: scans stop there */

static pthread_mutex_t foreign_mu = PTHREAD_MUTEX_INITIALIZER;
#ifdef EMBKV_TSAN
atomic_int embkv__fence_dummy;  /* (base.h: full_fence) */
#endif
static ebr_foreign *foreign;

static _Thread_local ebr_slot *my_slot;
static _Thread_local unsigned depth;

static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t exit_key;

static void release_slot(void *p)
{
    ebr_slot *sl = p;
    atomic_store(&sl->epoch, 0);
    atomic_store(&sl->owned, 0);
}

static void make_key(void)
{
    if (pthread_key_create(&exit_key, release_slot) != 0)
        abort();  /* cannot happen with the process's first key */
}

/* Slot i of the scan order, c the chunk of slot i - 1 (or NULL for i 0). */
static ebr_slot *scan_slot(ebr_chunk **c, unsigned i)
{
    if (i == 0)
        *c = &first_chunk;
    else if (i % EBR_CHUNK == 0)
        *c = atomic_load(&(*c)->next);
    return *c ? &(*c)->slots[i % EBR_CHUNK] : NULL;
}

static ebr_slot *claim_slot(void)
{
    pthread_once(&key_once, make_key);
    for (;;) {
        ebr_chunk *c = &first_chunk;
        for (unsigned base = 0;; base += EBR_CHUNK) {
            for (unsigned i = 0; i < EBR_CHUNK; i++) {
                int expect = 0;
                if (atomic_load_explicit(&c->slots[i].owned, memory_order_relaxed) == 0 &&
                    atomic_compare_exchange_strong(&c->slots[i].owned, &expect, 1)) {
                    unsigned hw = atomic_load(&high_water);
                    while (hw < base + i + 1 && !atomic_compare_exchange_weak(&high_water, &hw, base + i + 1)) {
                    }
                    pthread_setspecific(exit_key, &c->slots[i]);
                    return &c->slots[i];
                }
            }
            ebr_chunk *next = atomic_load(&c->next);
            if (!next) {
                void *mem = NULL;
                if (posix_memalign(&mem, 64, sizeof(ebr_chunk)) != 0)
                    break;  /* no memory for more: wait for a thread to exit */
                ebr_chunk *n = mem;
                memset(n, 0, sizeof *n);
                if (atomic_compare_exchange_strong(&c->next, &next, n))
                    next = n;
                else
                    free(n);  /* another thread linked one: use that */
            }
            c = next;
        }
        sched_yield();
    }
}

void ebr_enter(void)
{
    if (depth++ > 0)
        return;
    if (!my_slot)
        my_slot = claim_slot();
    uint64_t e = atomic_load(&global_epoch);
    for (;;) {
        /* seq_cst store then seq_cst load: ordered in the single total
         * order, so a reclaimer either sees this slot or we see its bump. */
        atomic_store(&my_slot->epoch, e);
        uint64_t again = atomic_load(&global_epoch);
        if (again == e)
            break;
        e = again;
    }
}

void ebr_leave(void)
{
    if (--depth > 0)
        return;
    atomic_store_explicit(&my_slot->epoch, 0, memory_order_release);
}

uint64_t ebr_now(void)
{
    return atomic_load(&global_epoch);
}

void ebr_foreign_add(ebr_foreign *f)
{
    pthread_mutex_lock(&foreign_mu);
    f->next = foreign;
    foreign = f;
    pthread_mutex_unlock(&foreign_mu);
}

void ebr_foreign_remove(ebr_foreign *f)
{
    pthread_mutex_lock(&foreign_mu);
    for (ebr_foreign **p = &foreign; *p; p = &(*p)->next)
        if (*p == f) {
            *p = f->next;
            break;
        }
    pthread_mutex_unlock(&foreign_mu);
}

void ebr_synchronize_foreign(void)
{
    uint64_t target = atomic_fetch_add(&global_epoch, 1) + 1;
    pthread_mutex_lock(&foreign_mu);
    for (ebr_foreign *f = foreign; f; f = f->next)
        f->wait(f, target);
    pthread_mutex_unlock(&foreign_mu);
}

void ebr_advance_to(uint64_t e)
{
    uint64_t cur = atomic_load(&global_epoch);
    while (cur < e && !atomic_compare_exchange_weak(&global_epoch, &cur, e)) {
    }
}

uint64_t ebr_safe_epoch(void)
{
    uint64_t now = atomic_fetch_add(&global_epoch, 1) + 1;
    uint64_t oldest = now;
    pthread_mutex_lock(&foreign_mu);
    for (ebr_foreign *f = foreign; f; f = f->next) {
        uint64_t o = f->oldest(f, now);
        if (o < oldest)
            oldest = o;
    }
    pthread_mutex_unlock(&foreign_mu);
    unsigned hw = atomic_load(&high_water);
    ebr_chunk *c = NULL;
    ebr_slot *sl;
    for (unsigned i = 0; i < hw && (sl = scan_slot(&c, i)); i++) {
        uint64_t e = atomic_load(&sl->epoch);
        if (e != 0 && e < oldest)
            oldest = e;
    }
    return oldest;
}

void ebr_synchronize(void)
{
    uint64_t target = atomic_fetch_add(&global_epoch, 1) + 1;
    unsigned hw = atomic_load(&high_water);
    ebr_chunk *c = NULL;
    ebr_slot *sl;
    for (unsigned i = 0; i < hw && (sl = scan_slot(&c, i)); i++) {
        if (sl == my_slot && depth > 0)
            continue;  /* the caller itself */
        for (;;) {
            uint64_t e = atomic_load(&sl->epoch);
            if (e == 0 || e >= target)
                break;
            sched_yield();
        }
    }
    pthread_mutex_lock(&foreign_mu);
    for (ebr_foreign *f = foreign; f; f = f->next)
        f->wait(f, target);
    pthread_mutex_unlock(&foreign_mu);
}
