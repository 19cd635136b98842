/*
 * epoch.c - epoch-based reclamation for lock-free readers.
 *
 * Readers announce the global epoch they entered in; a record replaced
 * copy-on-write is tagged with the epoch of its retirement and freed only
 * when every reader still inside started after it.  One domain serves every
 * store of the process, so a reader thread owns one announcement slot.
 *
 * Readers in other processes (a store's reader table, readers.c) take
 * part through hooks: each reclamation publishes its epoch to them and
 * asks for their oldest, and a synchronize waits for them too.  The hooks
 * are function pointers so that this file needs nothing above it.
 */
#include <sched.h>
#include <stdlib.h>

#include "base.h"

#define EBR_SLOTS 1024

typedef struct ebr_slot {
    atomic_uint_fast64_t epoch;  /* 0 when the owning thread is outside */
    atomic_int owned;
    char pad[64 - sizeof(atomic_uint_fast64_t) - sizeof(atomic_int)];
} ebr_slot;

static ebr_slot slots[EBR_SLOTS] __attribute__((aligned(64)));
static atomic_uint_fast64_t global_epoch = 1;
static atomic_uint high_water;  /* slots ever handed out: scans stop there */

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

static ebr_slot *claim_slot(void)
{
    pthread_once(&key_once, make_key);
    for (;;) {
        for (unsigned i = 0; i < EBR_SLOTS; i++) {
            int expect = 0;
            if (atomic_load_explicit(&slots[i].owned, memory_order_relaxed) == 0 &&
                atomic_compare_exchange_strong(&slots[i].owned, &expect, 1)) {
                unsigned hw = atomic_load(&high_water);
                while (hw < i + 1 && !atomic_compare_exchange_weak(&high_water, &hw, i + 1)) {
                }
                pthread_setspecific(exit_key, &slots[i]);
                return &slots[i];
            }
        }
        /* More live threads than slots: wait for one to exit. */
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
    for (unsigned i = 0; i < hw; i++) {
        uint64_t e = atomic_load(&slots[i].epoch);
        if (e != 0 && e < oldest)
            oldest = e;
    }
    return oldest;
}

void ebr_synchronize(void)
{
    uint64_t target = atomic_fetch_add(&global_epoch, 1) + 1;
    unsigned hw = atomic_load(&high_water);
    for (unsigned i = 0; i < hw; i++) {
        if (&slots[i] == my_slot && depth > 0)
            continue;  /* the caller itself */
        for (;;) {
            uint64_t e = atomic_load(&slots[i].epoch);
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
