/*
 * readers.c - the reader table: processes that read a store while another
 * process writes it.
 *
 * A store has one writer process (the flock on LOCK) and any number of
 * reader processes.  Readers map the pool read-only and walk the index
 * without locks, as the writer's own threads do; what keeps that safe
 * across processes lives in READERS_FILE beside LOCK, a small file every
 * party maps shared (LMDB's lock file is the model):
 *   - one slot per reader thread: its process (pid and start time, so a
 *     dead process's slots are found and freed), the reclamation epoch it
 *     reads in, and its scan pins;
 *   - the writer's reclamation epoch, published at every reclamation;
 *     the writer counts the slots in through epoch.c's foreign hooks, so
 *     no record, index array or log segment a reader may hold is reused
 *     (P6 for other processes: R1 below);
 *   - a generation, odd while a writer opens (and recovers) the store;
 *   - seqlocks for what a reader cannot see otherwise: the root's index
 *     fields during a resize, the index's backward moves (move_seq), and
 *     the moves between buckets that a reader's scan pin holds off.
 *
 * R1  A writer frees nothing retired while a live, unrevoked reader slot
 *     holds an epoch at or below the retirement's.
 * R2  A reader's epoch holds back what the writer frees later (its
 *     reclamation) for at most READER_HOLD_MS, and what it must reuse now
 *     (a demotion making room, a resize, a compaction waiting for readers)
 *     for at most READER_WAIT_MS: then the writer revokes the slot (sets
 *     bit 0 of its word) and goes on.  A reader checks its word after
 *     copying rows out (rd_valid) and fails its statement instead of
 *     returning them.  So a reader stalls a trainer for a moment at most.
 * R3  A writer's open makes the generation odd, revokes every slot in an
 *     epoch (they read under the previous writer, whose frees the new
 *     one's free list does not know), and makes it even when the store
 *     is ready; readers enter only at an even generation, and a read whose
 *     generation changed under it is not returned.
 *
 * The file holds no durable state: a damaged or missing one is made anew.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "persist.h"
#include "embkv_debug.h"

#define RD_MAGIC "embkv-readers\0\0"  /* 16 bytes */
#define RD_VERSION 1
#define RD_SLOTS 1024
#define RD_HEADER 4096
#define RD_FILE_BYTES (RD_HEADER + RD_SLOTS * 64)
#define RD_TL 8  /* reader tables a thread may be in at once */

typedef struct rd_slot {
    atomic_int pid;            /* 0: free */
    atomic_int tid;
    atomic_uint_fast64_t start; /* the process's start time (pid reuse) */
    atomic_uint_fast64_t word;  /* epoch << 1 | revoked; 0 outside */
    atomic_uint pins;
    char pad[64 - 2 * sizeof(atomic_int) - 2 * sizeof(atomic_uint_fast64_t) - sizeof(atomic_uint)];
} rd_slot;
_Static_assert(sizeof(rd_slot) == 64, "reader slot must be 64 bytes");

typedef struct rd_header {
    char magic[16];
    uint32_t version, nslots;
    atomic_uint_fast64_t epoch;     /* the writer's reclamation epoch */
    atomic_uint_fast64_t gen;       /* odd while a writer opens the store (R3) */
    atomic_uint_fast64_t ix_seq;    /* odd while the root's index fields change */
    atomic_uint_fast64_t move_seq;  /* the index's backward moves (index_desc) */
    atomic_uint_fast64_t moving;    /* moves between buckets under way */
    atomic_uint_fast64_t pins;      /* scan pins of all slots */
    atomic_int writer_pid;          /* 0: no writer */
    atomic_uint_fast64_t writer_start;
    atomic_uint high;               /* slots ever claimed: scans stop there */
    atomic_uint_fast64_t hold_ms;   /* the writer's READER_HOLD_MS (R2) */
} rd_header;
_Static_assert(sizeof(rd_header) <= RD_HEADER, "reader table header too large");

struct readers {
    ebr_foreign hook;          /* first: epoch.c calls back with it */
    rd_header *h;
    rd_slot *slot;
    bool writer;
    uint64_t hold_ns;          /* R2: how long reclamation lets a slot lag */
    uint64_t wait_ns;          /* R2: how long a writer waiting for a slot waits */
    /* the writer's view of each slot: the word it last saw, since when */
    uint64_t *seen_word, *seen_ns;
};

/* Tables stay mapped until the process exits: a thread's slot, found
 * through its thread-local list, must never point into an unmapping.  One
 * per store directory (dev, ino of the file). */
typedef struct rd_table {
    struct rd_table *next;
    dev_t dev;
    ino_t ino;
    struct readers *r;
} rd_table;
static pthread_mutex_t tables_mu = PTHREAD_MUTEX_INITIALIZER;
static rd_table *tables;

typedef struct rd_tl {
    struct readers *r;
    int slot;                  /* -1: none */
    unsigned depth;
    unsigned failed_pins;      /* pins whose entry failed: their unpins undo nothing */
    uint64_t word, gen;
} rd_tl;
static _Thread_local rd_tl tl[RD_TL];
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;
static pthread_key_t tl_key;

static uint64_t readers_hold_ms = READER_HOLD_MS;

void embkv_debug_reader_hold(uint64_t ms)
{
    readers_hold_ms = ms ? ms : READER_HOLD_MS;
}

/* ------------------------------------------------------------ processes */

/* The start time of process pid (field 22 of /proc/pid/stat), 0 when it
 * cannot be read. */
static uint64_t proc_start(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    /* The command may hold spaces and parentheses: count from the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p)
        return 0;
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    return strtoull(p, NULL, 10);
}

static bool proc_alive(pid_t pid, uint64_t start)
{
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    uint64_t now = start ? proc_start(pid) : 0;
    return !(start && now && now != start);
}

static uint64_t my_start(void)
{
    static atomic_uint_fast64_t cached;
    static atomic_int cached_pid;
    if (atomic_load(&cached_pid) != getpid()) {
        atomic_store(&cached, proc_start(getpid()));
        atomic_store(&cached_pid, getpid());
    }
    return atomic_load(&cached);
}

/* ------------------------------------------------------------ slots */

static void slot_free(struct readers *r, rd_slot *sl)
{
    unsigned pins = atomic_exchange(&sl->pins, 0);
    if (pins)
        atomic_fetch_sub(&r->h->pins, pins);
    atomic_store(&sl->word, 0);
    atomic_store(&sl->tid, 0);
    atomic_store(&sl->start, 0);
    atomic_store(&sl->pid, 0);
}

/* Frees the slots of processes that are gone (all: every slot, not only
 * those below the high-water mark, which a damaged table may understate);
 * returns how many. */
static unsigned sweep_dead(struct readers *r, bool all)
{
    unsigned n = 0, high = all ? RD_SLOTS : atomic_load(&r->h->high);
    for (unsigned i = 0; i < high && i < RD_SLOTS; i++) {
        rd_slot *sl = &r->slot[i];
        int pid = atomic_load(&sl->pid);
        if (pid && !proc_alive(pid, atomic_load(&sl->start))) {
            slot_free(r, sl);
            n++;
        }
    }
    return n;
}

/* A free slot taken for this process (tid 0: its presence while the store
 * is open here; else the reading thread's), the slots of dead processes
 * freed if none is; its number, or -1 with the error set. */
static int slot_take(embkv_store *s, struct readers *r, int tid)
{
    int pid = getpid();
    for (int round = 0; round < 2; round++) {
        for (unsigned i = 0; i < RD_SLOTS; i++) {
            rd_slot *sl = &r->slot[i];
            int expect = 0;
            if (atomic_load_explicit(&sl->pid, memory_order_relaxed) == 0 &&
                atomic_compare_exchange_strong(&sl->pid, &expect, pid)) {
                atomic_store(&sl->tid, tid);
                atomic_store(&sl->start, my_start());
                atomic_store(&sl->word, 0);
                unsigned hw = atomic_load(&r->h->high);
                while (hw < i + 1 && !atomic_compare_exchange_weak(&r->h->high, &hw, i + 1)) {
                }
                return (int)i;
            }
        }
        if (!sweep_dead(r, true))
            break;
    }
    embkv__err(EMBKV_BUSY, "store %s: its reader table is full (%d slots: one for each process that has the "
               "store open to read, one for each of their threads reading it; a slot goes when its thread exits "
               "or its process closes the store): read from fewer threads, or close the store in idle processes",
               s->path, RD_SLOTS);
    return -1;
}

/* --------------------------------------------------------- the writer */

static uint64_t writer_oldest(ebr_foreign *f, uint64_t now)
{
    struct readers *r = (struct readers *)f;
    atomic_store(&r->h->epoch, now);
    uint64_t oldest = now, t = 0;
    unsigned high = atomic_load(&r->h->high);
    for (unsigned i = 0; i < high && i < RD_SLOTS; i++) {
        rd_slot *sl = &r->slot[i];
        uint64_t w = atomic_load(&sl->word);
        if (w == 0 || (w & 1) || (w >> 1) >= oldest)
            continue;
        if (!t)
            t = now_ns();
        if (r->seen_word[i] != w) {
            r->seen_word[i] = w;
            r->seen_ns[i] = t;
        } else if (t - r->seen_ns[i] > 1000000000ull && !proc_alive(atomic_load(&sl->pid), atomic_load(&sl->start))) {
            slot_free(r, sl);  /* (a dead process's slot, found within a second) */
            continue;
        } else if (t - r->seen_ns[i] > r->hold_ns) {
            /* R2: held too long.  A dead process's slot is freed instead. */
            if (!proc_alive(atomic_load(&sl->pid), atomic_load(&sl->start)))
                slot_free(r, sl);
            else
                atomic_compare_exchange_strong(&sl->word, &w, w | 1);
            continue;
        }
        oldest = w >> 1;
    }
    return oldest;
}

static void writer_wait(ebr_foreign *f, uint64_t target)
{
    struct readers *r = (struct readers *)f;
    atomic_store(&r->h->epoch, target);
    uint64_t t0 = 0;
    unsigned high = atomic_load(&r->h->high);
    for (unsigned i = 0; i < high && i < RD_SLOTS; i++) {
        rd_slot *sl = &r->slot[i];
        unsigned spins = 0;
        for (;;) {
            uint64_t w = atomic_load(&sl->word);
            if (w == 0 || (w & 1) || (w >> 1) >= target)
                break;
            if (!t0)
                t0 = now_ns();
            if (++spins % 256 == 0 && !proc_alive(atomic_load(&sl->pid), atomic_load(&sl->start))) {
                slot_free(r, sl);
                break;
            }
            if (now_ns() - t0 > r->wait_ns) {
                atomic_compare_exchange_strong(&sl->word, &w, w | 1);  /* R2 */
                continue;
            }
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

/* ------------------------------------------------------------ the file */

static void tl_destroy(void *unused)
{
    (void)unused;
    for (int i = 0; i < RD_TL; i++) {
        rd_tl *t = &tl[i];
        if (!t->r || t->slot < 0)
            continue;
        rd_slot *sl = &t->r->slot[t->slot];
        if (atomic_load(&sl->pid) == getpid() && atomic_load(&sl->tid) == (int)syscall(SYS_gettid))
            slot_free(t->r, sl);
        t->r = NULL;
        t->slot = -1;
    }
}

static void tl_make_key(void)
{
    if (pthread_key_create(&tl_key, tl_destroy) != 0)
        abort();  /* the process is out of thread keys: nothing works */
}

/* Maps (making or repairing) the table of the store in s->path. */
static int table_map(embkv_store *s, struct readers **out)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->path, READERS_FILE);
    /* Never through a link (the table is written: a store directory from
     * elsewhere must not make it write another file). */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0 && errno == ELOOP)
        return embkv__err(EMBKV_CORRUPT, "store %s: its reader table %s is a symbolic link, which embkv does not "
                          "follow: remove it (the table holds nothing durable; it is made again)", s->path,
                          READERS_FILE);
    if (fd < 0 && errno == EISDIR)
        return embkv__err(EMBKV_CORRUPT, "store %s: its reader table %s is a directory: remove it (the table holds "
                          "nothing durable; it is made again)", s->path, READERS_FILE);
    if (fd < 0)
        return embkv__err(EMBKV_IO, "store %s: cannot open its reader table %s: %s (the writer and the readers of "
                          "a store need write access to it)", s->path, READERS_FILE, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return embkv__err(EMBKV_IO, "store %s: stat %s: %s", s->path, READERS_FILE, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return embkv__err(EMBKV_CORRUPT, "store %s: its reader table %s is not a plain file: remove it (it holds "
                          "nothing durable; it is made again)", s->path, READERS_FILE);
    }
    pthread_mutex_lock(&tables_mu);
    for (rd_table *t = tables; t; t = t->next)
        if (t->dev == st.st_dev && t->ino == st.st_ino) {
            pthread_mutex_unlock(&tables_mu);
            close(fd);
            *out = t->r;
            return EMBKV_OK;
        }
    /* Made or repaired under an flock of the file itself: two processes
     * arriving at once must not both initialize it. */
    int rc = EMBKV_OK;
    void *map = MAP_FAILED;
    if (flock(fd, LOCK_EX) != 0) {
        rc = embkv__err(EMBKV_IO, "store %s: flock %s: %s", s->path, READERS_FILE, strerror(errno));
        goto out;
    }
    if (st.st_size != RD_FILE_BYTES && ftruncate(fd, RD_FILE_BYTES) != 0) {
        rc = embkv__err(EMBKV_IO, "store %s: cannot size %s: %s", s->path, READERS_FILE, strerror(errno));
        goto out;
    }
    /* Its blocks allocated before it is mapped: a store on a full file
     * system is then an error here, not a SIGBUS at the first write of a
     * page the file system has no room for. */
    int e = file_reserve(fd, RD_FILE_BYTES);
    if (e != 0) {
        rc = embkv__err(EMBKV_IO, "store %s: no room for its reader table %s (%u bytes): %s: free space on its file "
                        "system", s->path, READERS_FILE, (unsigned)RD_FILE_BYTES, strerror(e));
        goto out;
    }
    map = mmap(NULL, RD_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = embkv__err(EMBKV_IO, "store %s: cannot map %s: %s", s->path, READERS_FILE, strerror(errno));
        goto out;
    }
    rd_header *h = map;
    if (memcmp(h->magic, RD_MAGIC, 16) != 0 || h->version != RD_VERSION || h->nslots != RD_SLOTS) {
        /* New, or not a table this build knows: nothing in it is durable. */
        memset(map, 0, RD_FILE_BYTES);
        h->version = RD_VERSION;
        h->nslots = RD_SLOTS;
        atomic_store(&h->epoch, 1);
        memcpy(h->magic, RD_MAGIC, 16);
    }
    struct readers *r = calloc(1, sizeof *r);
    rd_table *t = calloc(1, sizeof *t);
    if (r)
        r->seen_word = calloc(RD_SLOTS, sizeof *r->seen_word), r->seen_ns = calloc(RD_SLOTS, sizeof *r->seen_ns);
    if (!r || !t || !r->seen_word || !r->seen_ns) {
        if (r)
            free(r->seen_word), free(r->seen_ns);
        free(r);
        free(t);
        munmap(map, RD_FILE_BYTES);
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
        goto out;
    }
    r->h = h;
    r->slot = (rd_slot *)((char *)map + RD_HEADER);
    r->hook.oldest = writer_oldest;
    r->hook.wait = writer_wait;
    t->dev = st.st_dev;
    t->ino = st.st_ino;
    t->r = r;
    t->next = tables;
    tables = t;
    *out = r;
out:
    flock(fd, LOCK_UN);
    close(fd);  /* the mapping stays */
    pthread_mutex_unlock(&tables_mu);
    return rc;
}

int readers_attach_writer(embkv_store *s)
{
    struct readers *r;
    int rc = table_map(s, &r);
    if (rc != EMBKV_OK)
        return rc;
    rd_header *h = r->h;
    r->writer = true;
    r->hold_ns = readers_hold_ms * 1000000ull;
    r->wait_ns = (readers_hold_ms < READER_WAIT_MS ? readers_hold_ms : READER_WAIT_MS) * 1000000ull;
    atomic_store(&h->hold_ms, readers_hold_ms);
    /* R3: odd while this writer opens; the readers of the last one are
     * revoked (a killed writer may have left the generation odd). */
    uint64_t g = atomic_load(&h->gen);
    atomic_store(&h->gen, (g | 1) + 2);
    atomic_store(&h->ix_seq, 0);
    atomic_store(&h->moving, 0);
    sweep_dead(r, true);
    /* (the mark again, from the slots in use: a damaged table's may be
     * anything) */
    unsigned high = 0;
    for (unsigned i = 0; i < RD_SLOTS; i++)
        if (atomic_load(&r->slot[i].pid))
            high = i + 1;
    atomic_store(&h->high, high);
    for (unsigned i = 0; i < high && i < RD_SLOTS; i++) {
        uint64_t w = atomic_load(&r->slot[i].word);
        if (w && !(w & 1))
            atomic_compare_exchange_strong(&r->slot[i].word, &w, w | 1);
        r->seen_word[i] = 0;
    }
    /* This process's epochs continue above the table's, so that a slot
     * entered under the last writer counts as old. */
    ebr_advance_to(atomic_load(&h->epoch) + 1);
    atomic_store(&h->epoch, ebr_now());
    atomic_store(&h->writer_start, my_start());
    atomic_store(&h->writer_pid, getpid());
    ebr_foreign_add(&r->hook);
    s->readers = r;
    return EMBKV_OK;
}

bool readers_active(embkv_store *s)
{
    struct readers *r = s->readers;
    if (!r)
        return false;
    unsigned high = atomic_load(&r->h->high);
    for (unsigned i = 0; i < high && i < RD_SLOTS; i++) {
        uint64_t w = atomic_load(&r->slot[i].word);
        if (w && !(w & 1))
            return true;
    }
    return false;
}

void readers_writer_ready(embkv_store *s)
{
    if (s->readers)
        atomic_fetch_add(&s->readers->h->gen, 1);  /* even: readers may enter (R3) */
}

void readers_detach(embkv_store *s)
{
    struct readers *r = s->readers;
    if (!r)
        return;
    if (r->writer) {
        ebr_foreign_remove(&r->hook);
        rd_header *h = r->h;
        atomic_store(&h->writer_pid, 0);
        atomic_store(&h->writer_start, 0);
        uint64_t g = atomic_load(&h->gen);
        if (g & 1)
            atomic_store(&h->gen, g + 1);
        r->writer = false;
    } else {
        /* This process reads the store no more: its threads' slots go. */
        unsigned high = atomic_load(&r->h->high);
        for (unsigned i = 0; i < high && i < RD_SLOTS; i++)
            if (atomic_load(&r->slot[i].pid) == getpid())
                slot_free(r, &r->slot[i]);
    }
    s->readers = NULL;
}

/* The process holding the flock on dir's LOCK (the writer), from the
 * kernel's table of locks (the pid written in LOCK may be stale), or 0. */
static long lock_pid(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, LOCK_FILE);
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    FILE *f = fopen("/proc/locks", "re");
    if (!f)
        return 0;
    char line[256];
    long pid = 0;
    while (!pid && fgets(line, sizeof line, f)) {
        char kind[16], mode[16];
        long p;
        unsigned maj, min;
        unsigned long long ino;
        if (sscanf(line, "%*[^:]: %15s %*s %15s %ld %x:%x:%llu", kind, mode, &p, &maj, &min, &ino) == 6 &&
            !strcmp(kind, "FLOCK") && !strcmp(mode, "WRITE") && ino == (unsigned long long)st.st_ino)
            pid = p;
    }
    fclose(f);
    return pid;
}

int readers_attach_reader(embkv_store *s)
{
    struct readers *r;
    int rc = table_map(s, &r);
    if (rc != EMBKV_OK)
        return rc;
    pthread_once(&tl_once, tl_make_key);
    /* A live writer is in this table, or the table is not the one it
     * honours (READERS removed and made again while it runs): reading
     * beside it then would be unsafe.  (A writer between its lock and its
     * table is given a moment.) */
    long holder = lock_pid(s->path);
    for (int i = 0; holder && proc_alive((pid_t)holder, 0) && atomic_load(&r->h->writer_pid) != holder; i++) {
        if (i == 200)
            return embkv__err(EMBKV_BUSY, "store %s: its writer (process %ld) does not use the store's reader "
                              "table %s (was the file removed while it ran?): readers cannot read beside it "
                              "safely; restart the writer", s->path, holder, READERS_FILE);
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
        holder = lock_pid(s->path);
    }
    /* A slot of the process's own while the store is open here (no epoch,
     * no thread): embkv_destroy in another process sees it and refuses. */
    int i = slot_take(s, r, 0);
    if (i < 0)
        return EMBKV_BUSY;
    s->readers = r;
    return EMBKV_OK;
}

long readers_live_reader(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, READERS_FILE);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return 0;
    struct stat st;
    void *map = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == RD_FILE_BYTES
                    ? mmap(NULL, RD_FILE_BYTES, PROT_READ, MAP_SHARED, fd, 0)
                    : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED)
        return 0;
    long found = 0;
    const rd_header *h = map;
    rd_slot *slots = (rd_slot *)((char *)map + RD_HEADER);
    if (!memcmp(h->magic, RD_MAGIC, 16))
        for (unsigned i = 0; i < RD_SLOTS && !found; i++) {
            int pid = atomic_load(&slots[i].pid);
            if (pid && pid != getpid() && proc_alive(pid, atomic_load(&slots[i].start)))
                found = pid;
        }
    munmap(map, RD_FILE_BYTES);
    return found;
}

long readers_writer_pid(const embkv_store *s)
{
    if (!s->readers)
        return 0;
    rd_header *h = s->readers->h;
    int pid = atomic_load(&h->writer_pid);
    return pid && proc_alive(pid, atomic_load(&h->writer_start)) ? pid : 0;
}

/* ------------------------------------------------------ reader threads */

static rd_tl *tl_get(struct readers *r)
{
    rd_tl *fr = NULL;
    for (int i = 0; i < RD_TL; i++) {
        if (tl[i].r == r)
            return &tl[i];
        if (!tl[i].r && !fr)
            fr = &tl[i];
    }
    /* All taken: one of a table this thread is not reading now gives its
     * slot back (a thread may read any number of stores over its life). */
    for (int i = 0; i < RD_TL && !fr; i++)
        if (tl[i].depth == 0 && tl[i].failed_pins == 0) {
            fr = &tl[i];
            if (fr->slot >= 0) {
                rd_slot *sl = &fr->r->slot[fr->slot];
                if (atomic_load(&sl->pid) == getpid() && atomic_load(&sl->tid) == (int)syscall(SYS_gettid))
                    slot_free(fr->r, sl);
            }
        }
    if (fr) {
        fr->r = r;
        fr->slot = -1;
        fr->depth = 0;
        fr->failed_pins = 0;
    }
    return fr;
}

/* The calling thread's slot, claimed on first use. */
static int slot_claim(embkv_store *s, struct readers *r, rd_tl *t)
{
    int tid = (int)syscall(SYS_gettid);
    if (t->slot >= 0) {
        rd_slot *sl = &r->slot[t->slot];
        if (atomic_load(&sl->pid) == getpid() && atomic_load(&sl->tid) == tid)
            return EMBKV_OK;
        t->slot = -1;  /* freed meanwhile (this process closed the store, or a sweep) */
    }
    int i = slot_take(s, r, tid);
    if (i < 0)
        return EMBKV_BUSY;
    t->slot = i;
    pthread_setspecific(tl_key, (void *)1);
    return EMBKV_OK;
}

int rd_enter(embkv_store *s, bool *first)
{
    struct readers *r = s->readers;
    rd_tl *t = tl_get(r);
    *first = false;
    if (!t)
        return embkv__err(EMBKV_BUSY, "store %s: this thread reads %d stores at once, the most it may", s->path,
                          RD_TL);
    if (t->depth > 0) {
        t->depth++;
        return EMBKV_OK;
    }
    *first = true;
    int rc = slot_claim(s, r, t);
    if (rc != EMBKV_OK)
        return rc;
    rd_slot *sl = &r->slot[t->slot];
    rd_header *h = r->h;
    uint64_t waited_from = 0;
    for (;;) {
        uint64_t g = atomic_load(&h->gen);
        if (g & 1) {
            /* A writer is opening the store (R3).  One that died at it
             * left the generation odd: read the store as it is then. */
            int wp = atomic_load(&h->writer_pid);
            if (wp && proc_alive(wp, atomic_load(&h->writer_start))) {
                if (!waited_from)
                    waited_from = now_ns();
                if (now_ns() - waited_from > 30ull * 1000000000ull)
                    return embkv__err(EMBKV_BUSY, "store %s: its writer (process %d) has been opening it for "
                                      "30 s (recovering after a crash?): try again later", s->path, wp);
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
                continue;
            }
        }
        uint64_t e = atomic_load(&h->epoch);
        for (;;) {
            /* Store then load, both sequentially consistent: the writer's
             * scan sees this slot, or this load sees its new epoch. */
            atomic_store(&sl->word, e << 1);
            uint64_t again = atomic_load(&h->epoch);
            if (again == e)
                break;
            e = again;
        }
        if (atomic_load(&h->gen) == g) {
            t->word = e << 1;
            t->gen = g;
            t->depth = 1;
            return EMBKV_OK;
        }
        atomic_store(&sl->word, 0);
    }
}

bool rd_valid(embkv_store *s)
{
    struct readers *r = s->readers;
    rd_tl *t = tl_get(r);
    if (!t || t->depth == 0 || t->slot < 0)
        return false;
    return atomic_load(&r->slot[t->slot].word) == t->word && atomic_load(&r->h->gen) == t->gen;
}

int rd_invalid(embkv_store *s)
{
    struct readers *r = s->readers;
    rd_tl *t = tl_get(r);
    if (t && t->depth && atomic_load(&r->h->gen) != t->gen) {
        long w = readers_writer_pid(s);
        return w ? embkv__err(EMBKV_BUSY, "store %s: its writer (process %ld) opened it anew during this read: run "
                              "the statement again", s->path, w)
                 : embkv__err(EMBKV_BUSY, "store %s: its writer opened it anew during this read (or the reader "
                              "table %s was changed): run the statement again", s->path, READERS_FILE);
    }
    return embkv__err(EMBKV_BUSY, "store %s: this read held back records the writer needed (more than %llu ms, "
                      "or %d ms while it had to wait for them), and it went on without it: run the statement "
                      "again, or read fewer rows a statement", s->path,
                      (unsigned long long)atomic_load(&r->h->hold_ms), READER_WAIT_MS);
}

void rd_leave(embkv_store *s)
{
    struct readers *r = s->readers;
    rd_tl *t = tl_get(r);
    if (!t || t->depth == 0)
        return;
    if (--t->depth == 0 && t->slot >= 0)
        atomic_store(&r->slot[t->slot].word, 0);
}

void rd_pin(embkv_store *s)
{
    struct readers *r = s->readers;
    rd_tl *t = tl_get(r);
    if (!t || t->slot < 0)
        return;
    atomic_fetch_add(&r->slot[t->slot].pins, 1);
    atomic_fetch_add(&r->h->pins, 1);
    /* A move under way finishes first; later ones see the pin. */
    while (atomic_load(&r->h->moving) > 0)
        sched_yield();
}

void rd_pin_failed(embkv_store *s)
{
    rd_tl *t = tl_get(s->readers);
    if (t)
        t->failed_pins++;
}

bool rd_unpin(embkv_store *s)
{
    struct readers *r = s->readers;
    rd_tl *t = tl_get(r);
    if (!t)
        return false;
    if (t->failed_pins) {
        t->failed_pins--;
        return false;
    }
    if (t->slot < 0)
        return false;
    rd_slot *sl = &r->slot[t->slot];
    unsigned p = atomic_load(&sl->pins);
    while (p > 0 && !atomic_compare_exchange_weak(&sl->pins, &p, p - 1)) {
    }
    if (p > 0)
        atomic_fetch_sub(&r->h->pins, 1);
    return true;
}

/* ------------------------------------------------- the writer's moves */

bool readers_move_begin(embkv_store *s)
{
    struct readers *r = s->readers;
    if (!r)
        return false;
    atomic_fetch_add(&r->h->moving, 1);
    if (atomic_load(&r->h->pins) == 0)
        return false;
    /* Pinned: a dead reader's pins are its slot's, freed with it. */
    sweep_dead(r, false);
    return atomic_load(&r->h->pins) > 0;
}

void readers_move_end(embkv_store *s)
{
    if (s->readers)
        atomic_fetch_sub(&s->readers->h->moving, 1);
}

atomic_uint_fast64_t *readers_move_seq(embkv_store *s)
{
    return s->readers ? &s->readers->h->move_seq : NULL;
}

void readers_ix_begin(embkv_store *s)
{
    if (s->readers)
        atomic_fetch_add(&s->readers->h->ix_seq, 1);
}

void readers_ix_end(embkv_store *s)
{
    if (s->readers)
        atomic_fetch_add(&s->readers->h->ix_seq, 1);
}

void readers_ix_read(embkv_store *s, uint64_t *off, uint64_t *nbuckets)
{
    rd_header *h = s->readers->h;
    uint64_t from = 0;
    for (;;) {
        uint64_t q = atomic_load(&h->ix_seq);
        *off = __atomic_load_n(&s->root->index.off, __ATOMIC_ACQUIRE);
        *nbuckets = __atomic_load_n(&s->root->nbuckets, __ATOMIC_ACQUIRE);
        if (!(q & 1) && atomic_load(&h->ix_seq) == q)
            return;
        /* A writer killed in a resize leaves the count odd. */
        if (!from)
            from = now_ns();
        else if (now_ns() - from > 100000000ull && !readers_writer_pid(s))
            return;
        sched_yield();
    }
}

int fork_refused(embkv_store *s, const char *fn)
{
    return embkv__err(EMBKV_READONLY, "%s: store %s was opened by process %ld, and this process (%ld) is a fork of "
                      "it: a forked process may not use its parent's handle of a store (the parent may be changing "
                      "the store beside it); open the store in this process instead (in SQL: a connection opened "
                      "here, read-only to read beside the parent)", fn, s->path, (long)s->pid, proc_pid());
}

_Thread_local unsigned update_fn_depth;

int callback_refused(embkv_store *s, const char *fn)
{
    return embkv__err(EMBKV_BUSY, "%s inside an embkv_update_batch callback (store %s): the batch holds its rows' "
                      "locks until it returns, and this call could wait for them; no call that changes a store "
                      "(nor a check, snapshot or backup) may be made from the callback: note what to change in "
                      "the callback's ctx and make the change after embkv_update_batch returns", fn,
                      s ? s->path : "(NULL)");
}

int rd_refuse(embkv_store *s, const char *fn)
{
    long w = readers_writer_pid(s);
    if (w == getpid())
        return embkv__err(EMBKV_READONLY, "%s: this handle of store %s was opened read-only; this process also has "
                          "the store open to write, through another handle: use that one (in SQL: a connection "
                          "that opens the table after one that may write, or reconnect)", fn, s->path);
    if (w)
        return embkv__err(EMBKV_READONLY, "%s: store %s is open read-only in this process, beside its writer "
                          "(process %ld): only that process may change it", fn, s->path, w);
    return embkv__err(EMBKV_READONLY, "%s: store %s is open read-only in this process: open it without "
                      "EMBKV_OPEN_READONLY to change it (in SQL: reconnect with a connection that may write)", fn,
                      s->path);
}

