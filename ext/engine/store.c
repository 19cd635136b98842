/*
 * store.c - opening, creating, recovering, resizing and closing a store.
 *
 * A store is a directory holding LOCK (an flock that keeps a second process
 * out) and store.pool (the libpmemobj pool).  Inside one process, opening a
 * directory that is already open hands out the same store, reference
 * counted, so threads of one trainer share one index and one cache.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libpmem.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include "top.h"

#define DEFAULT_EXPECTED_ROWS 100000
#define DEFAULT_POOL_CAP (1ull << 30)
#define DEFAULT_MAX_LOAD 0.9
#define MIN_POOL_SIZE (16ull << 20)
#define POOL_SIG "PMEMOBJ"
#define POOL_LAYOUT_OFFSET 4096  /* where libpmemobj keeps the layout name */

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static embkv_store *registry;

/* The accessors give 0 (NULL) for a NULL store, as embkv_count does. */
uint32_t embkv_dim(const embkv_store *s) { return s ? s->dim : 0; }
uint32_t embkv_state_floats(const embkv_store *s) { return s ? s->state_floats : 0; }
uint32_t embkv_dtype(const embkv_store *s) { return s ? s->dtype : 0; }
uint64_t embkv_store_id(const embkv_store *s) { return s ? s->store_id : 0; }
const char *embkv_dtype_name(uint32_t dtype)
{
    return dtype >= EMBKV_F32 && dtype <= EMBKV_I8 ? dtype_name((int)dtype) : "unknown";
}
const char *embkv_path(const embkv_store *s) { return s ? s->path : NULL; }
uint64_t embkv_count(embkv_store *s) { return s ? atomic_load(&s->rows) : 0; }
int embkv_readonly(const embkv_store *s) { return s && s->reader; }
long embkv_writer_pid(const embkv_store *s) { return s && s->reader ? readers_writer_pid(s) : 0; }

long embkv_reader_pid(const char *dir) { return dir ? readers_live_reader(dir) : 0; }

/* Record chunks: about a thousandth of the pool, a power of two from
 * 256 KiB to 64 MiB less 64 bytes (so that with libpmemobj's allocation
 * header a chunk fills whole heap units), and at least 8 records. */
static uint32_t chunk_bytes_for(size_t pool_size, uint32_t rec_size)
{
    uint64_t c = 256u << 10;
    while (c < pool_size / 1024 && c < (64u << 20))
        c <<= 1;
    while (c - 128 < 8ull * rec_size)
        c <<= 1;
    return (uint32_t)(c - 64);
}


static int validate_options(const embkv_options *opt, unsigned flags, const char *dir)
{
    if (!opt)
        return (flags & EMBKV_OPEN_CREATE)
                   ? embkv__err(EMBKV_INVALID, "store %s: option dim is required to create a store", dir)
                   : EMBKV_OK;
    if ((flags & EMBKV_OPEN_CREATE) && opt->dim == 0)
        return embkv__err(EMBKV_INVALID, "store %s: option dim is required to create a store", dir);
    if (opt->dim > EMBKV_MAX_DIM)
        return embkv__err(EMBKV_INVALID, "store %s: option dim must be between 1 and %d, got %u", dir,
                          EMBKV_MAX_DIM, opt->dim);
    if (opt->state_floats > EMBKV_MAX_STATE_FLOATS)
        return embkv__err(EMBKV_INVALID, "store %s: option state_floats must be at most %d, got %u", dir,
                          EMBKV_MAX_STATE_FLOATS, opt->state_floats);
    if (opt->dtype > EMBKV_I8)
        return embkv__err(EMBKV_INVALID, "store %s: option dtype: unknown type %u (EMBKV_F32, EMBKV_F16, EMBKV_BF16 "
                          "or EMBKV_I8)", dir, opt->dtype);
    if (opt->max_load != 0 && !(opt->max_load >= 0.1 && opt->max_load <= 0.98))
        return embkv__err(EMBKV_INVALID, "store %s: option max_load must be between 0.1 and 0.98, got %g",
                          dir, opt->max_load);
    if (opt->pool_size != 0 && opt->pool_size < MIN_POOL_SIZE)
        return embkv__err(EMBKV_INVALID, "store %s: option pool_size must be at least %llu bytes, got %llu",
                          dir, (unsigned long long)MIN_POOL_SIZE, (unsigned long long)opt->pool_size);
    if (opt->expected_rows > (1ull << 40))
        return embkv__err(EMBKV_INVALID, "store %s: option expected_rows is too large (%llu)", dir,
                          (unsigned long long)opt->expected_rows);
    if (opt->cache_size) {
        long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        uint64_t mem = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
        if (mem && opt->cache_size > mem)
            return embkv__err(EMBKV_INVALID,
                              "store %s: option cache_size (%llu bytes) is larger than this machine's memory "
                              "(%llu bytes)",
                              dir, (unsigned long long)opt->cache_size, (unsigned long long)mem);
    }
    return EMBKV_OK;
}

/* Gives an open store its DRAM cache: at open, or when a later open in the
 * process asks for one (a table sharing the store with one that had
 * none).  The groups are held while the pointer is set: every write that
 * began without a cache has ended, and every later one sees it, so no
 * write can miss a row the cache has taken. */
static int cache_attach(embkv_store *s, uint64_t bytes)
{
    if (group_held(s))
        return embkv__err(EMBKV_BUSY, "store %s: option cache_size: the store cannot take a cache inside a write "
                          "group of the same thread", s->path);
    /* Rows the bytes hold: the record (its content: not the padding a
     * pool record has), its slot and two to four table entries (the
     * tables round up to powers of two). */
    uint32_t rec = (uint32_t)((sizeof(rec_hdr) + s->vec_bytes + 4 * (size_t)s->state_floats + 7) & ~(size_t)7);
    uint64_t rows = bytes / ((uint64_t)rec + 24 + 32);
    while (rows > 64 && cache_bytes_for(rows, rec) > bytes)
        rows -= rows / 64 ? rows / 64 : 1;
    cache *c = cache_new(rows, rec, s->dtype, s->dim);
    if (!c)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for a cache of %llu rows (option cache_size)",
                          s->path, (unsigned long long)rows);
    int rc = groups_quiesce(s, "embkv_open (option cache_size)");
    if (rc != EMBKV_OK) {
        cache_free(c);
        return rc;
    }
    s->cache = c;
    s->cache_size = bytes;
    atomic_fetch_or(&s->heat_live, HEAT_FOR_CACHE);
    groups_resume(s);
    return EMBKV_OK;
}

static int geometry_matches(const embkv_store *s, const embkv_options *opt)
{
    if (!opt)
        return EMBKV_OK;
    if (opt->dim && opt->dim != s->dim)
        return embkv__err(EMBKV_INVALID, "store %s: has dim %u, dim %u requested", s->path, s->dim, opt->dim);
    if (opt->state_floats && opt->state_floats != s->state_floats)
        return embkv__err(EMBKV_INVALID, "store %s: has state_floats %u, %u requested", s->path,
                          s->state_floats, opt->state_floats);
    if (opt->dtype && opt->dtype != s->dtype)
        return embkv__err(EMBKV_INVALID, "store %s: has dtype %s, %s requested", s->path, dtype_name((int)s->dtype),
                          dtype_name((int)opt->dtype));
    return EMBKV_OK;
}

/* Whether the log directory in dir holds segment files. */
static bool log_has_segments(const char *dir)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, LOG_DIR);
    DIR *d = opendir(path);
    if (!d)
        return false;
    bool any = false;
    struct dirent *e;
    while (!any && (e = readdir(d)))
        any = !strncmp(e->d_name, "seg-", 4);
    closedir(d);
    return any;
}

/* What the directory holds: 1 = a pool file; 0 = nothing of ours and
 * nothing else (empty apart from LOCK and app- files, or what a creation
 * killed before it finished leaves: the unfinished pool, its dirty map, an
 * empty log directory); -1 = foreign files (name copied); -3 = the rest of
 * a store whose pool file is gone (what shows it copied): a pool that was
 * published left a clean close's seal, log segments, or a dirty map with
 * no unfinished pool beside it (an open that removes an unfinished pool
 * removes its dirty map first).  A store is never created over that: the
 * tables on it would read the new store's rows as theirs. */
static int inspect_dir(const char *dir, char *foreign, size_t len)
{
    DIR *d = opendir(dir);
    if (!d)
        return -2;
    int state = 0;
    bool tmp = false, dirty = false, seal = false;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, POOL_TMP))
            tmp = true;
        else if (!strcmp(e->d_name, DIRTY_FILE))
            dirty = true;
        else if (!strcmp(e->d_name, POOL_SEAL))
            seal = true;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, LOCK_FILE) ||
            !strcmp(e->d_name, POOL_TMP) || !strcmp(e->d_name, POOL_SEAL) || !strcmp(e->d_name, LOG_DIR) ||
            !strcmp(e->d_name, DIRTY_FILE) || !strcmp(e->d_name, READERS_FILE) ||
            !strcmp(e->d_name, SSD_PATH_FILE) || !strcmp(e->d_name, SSD_PATH_FILE ".tmp") ||
            !strncmp(e->d_name, EMBKV_APP_FILE_PREFIX, strlen(EMBKV_APP_FILE_PREFIX)))
            continue;
        if (!strcmp(e->d_name, POOL_FILE)) {
            if (state == 0)
                state = 1;
            continue;
        }
        snprintf(foreign, len, "%s", e->d_name);
        state = -1;
        break;
    }
    closedir(d);
    if (state == 0) {
        const char *sign = seal ? POOL_SEAL : log_has_segments(dir) ? "segments in " LOG_DIR "/"
                           : dirty && !tmp                 ? DIRTY_FILE
                                                           : NULL;
        if (sign) {
            snprintf(foreign, len, "%s", sign);
            state = -3;
        }
    }
    return state;
}

/* What inspect_dir's answer for dir means to an open (create: one that may
 * make a store) or to embkv_destroy (create true: an empty directory is
 * fine): EMBKV_OK, or the error naming what was found.  Call right after
 * inspect_dir (-2 reads its errno). */
static int dir_verdict(const char *dir, int state, const char *found, bool create)
{
    switch (state) {
    case 1:
        return EMBKV_OK;
    case 0:
        return create ? EMBKV_OK : embkv__err(EMBKV_NOTSTORE, "no embkv store in %s", dir);
    case -2:
        return embkv__err(EMBKV_IO, "store %s: cannot list the directory: %s", dir, strerror(errno));
    case -3:
        return embkv__err(EMBKV_CORRUPT, "store %s: %s is missing, but the directory holds the rest of a store "
                          "(%s): its rows cannot be read, and no new store is made over them; put the pool file "
                          "back, or remove the directory (embkv_destroy) to start afresh", dir, POOL_FILE, found);
    default: {
        /* A store with a file dropped into it (a desktop's .DS_Store, an
         * editor's backup) is told apart from a directory of another
         * use: the advice differs. */
        char pool[PATH_MAX + sizeof POOL_FILE + 1];
        snprintf(pool, sizeof pool, "%s/%s", dir, POOL_FILE);
        if (access(pool, F_OK) == 0)
            return embkv__err(EMBKV_NOTSTORE, "store %s holds a file that is not the store's (%s): move it out of "
                              "the directory (a store's directory holds its own files, and files named %s* of "
                              "applications), then open it again", dir, found, EMBKV_APP_FILE_PREFIX);
        return embkv__err(EMBKV_NOTSTORE, "%s is not an embkv store: it holds other files (%s)", dir, found);
    }
    }
}

/* Checked by reading the file, before libpmemobj opens it: pmemobj_open
 * writes to a pool even when it then refuses its layout, and a pool that
 * is not embkv's must be left exactly as it was. */
/* Which file beside the pool says the directory was an embkv store
 * before this open (it makes LOCK itself): the dirty map or the seal,
 * which every open that got as far as the pool leaves; NULL: none. */
static const char *store_sign(const char *dir)
{
    static const char *const signs[] = {DIRTY_FILE, POOL_SEAL};
    char p[PATH_MAX];
    for (size_t i = 0; i < sizeof signs / sizeof *signs; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, signs[i]);
        if (access(p, F_OK) == 0)
            return signs[i];
    }
    return NULL;
}

static int check_pool_header(const char *pool, const char *dir)
{
    char sig[8] = {0}, layout[PMEMOBJ_MAX_LAYOUT] = {0};
    int fd = open(pool, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return embkv__err(EMBKV_IO, "store %s: cannot read %s: %s", dir, POOL_FILE, strerror(errno));
    struct stat st;
    bool is_dir = fstat(fd, &st) == 0 && S_ISDIR(st.st_mode);
    ssize_t got = read(fd, sig, sizeof sig);
    ssize_t got_layout = pread(fd, layout, sizeof layout - 1, POOL_LAYOUT_OFFSET);
    close(fd);
    if (got != (ssize_t)sizeof sig || memcmp(sig, POOL_SIG, sizeof POOL_SIG) != 0) {
        /* A pool that lost its header where the store's other files are
         * is the store's, damaged, not a directory of someone else's. */
        const char *sign = store_sign(dir);
        if (sign)
            return embkv__err(EMBKV_CORRUPT, "store %s: %s is damaged: %s, where the store's pool was (its %s is "
                              "there): restore the store from a backup", dir, POOL_FILE,
                              is_dir ? "it is a directory" : got == 0 ? "it is empty"
                                                             : "it does not begin as a pmemobj pool does",
                              sign);
        return embkv__err(EMBKV_NOTSTORE, "%s is not an embkv store: %s is not a pmemobj pool", dir, POOL_FILE);
    }
    if (got_layout <= 0 || strcmp(layout, EMBKV_LAYOUT) != 0)
        return embkv__err(EMBKV_NOTSTORE, "%s is not an embkv store: %s is a pmemobj pool of layout \"%.64s\"",
                          dir, POOL_FILE, layout);
    return EMBKV_OK;
}

/* libpmemobj trusts its own metadata (pool descriptor, lanes, heap, zone
 * and chunk headers, run bitmaps): a damaged byte there can crash
 * pmemobj_open or the first allocation, and pmemobj_check crashes on the
 * same files.  Rather than re-implement its on-media format, a child
 * process opens the pool first and walks every object (which reads the
 * heap metadata the allocator would); if the child dies of a signal or
 * does not finish, the pool is refused as damaged and this process never
 * maps it.  The child only reads, apart from what pmemobj_open itself
 * writes (lane recovery, which the real open would do the same way).
 * Callers hold registry_mu, so no other open or close of this library is
 * inside libpmemobj's global state when we fork.  If fork fails, the open
 * goes on without the probe. */
#define PROBE_TIMEOUT_S 30  /* EMBKV_PROBE_TIMEOUT (seconds) overrides it */

/* The probe costs a process and a second pmemobj_open (tens of ms), so it
 * is skipped for a pool exactly as this library's last clean close left
 * it: that close records the pool file's identity, size and times in
 * POOL_SEAL, and any write to the file since (or a crash, which leaves no
 * seal) changes the ctime, which nobody can set back.  The seal is removed
 * before the pool is opened again. */
static void seal_text(const struct stat *st, char *buf, size_t len)
{
    snprintf(buf, len, "%llu %llu %llu %lld.%09ld %lld.%09ld\n", (unsigned long long)st->st_dev,
             (unsigned long long)st->st_ino, (unsigned long long)st->st_size, (long long)st->st_mtim.tv_sec,
             st->st_mtim.tv_nsec, (long long)st->st_ctim.tv_sec, st->st_ctim.tv_nsec);
}

static void seal_pool(const char *dir)
{
    char pool[PATH_MAX], seal[PATH_MAX], text[160];
    struct stat st;
    snprintf(pool, sizeof pool, "%s/%s", dir, POOL_FILE);
    snprintf(seal, sizeof seal, "%s/%s", dir, POOL_SEAL);
    if (stat(pool, &st) != 0)
        return;
    /* File times come from the kernel's coarse clock: a write in the same
     * tick as our last one would leave the ctime as it is.  Seal only once
     * that tick is over, so any later write shows. */
    for (int i = 0; i < 100; i++) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME_COARSE, &now);
        if (now.tv_sec > st.st_ctim.tv_sec || (now.tv_sec == st.st_ctim.tv_sec && now.tv_nsec > st.st_ctim.tv_nsec))
            break;
        if (i == 99)
            return;
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    seal_text(&st, text, sizeof text);
    FILE *f = fopen(seal, "w");
    if (!f)
        return;  /* no seal: the next open probes */
    int ok = fputs(text, f) >= 0;
    if (fclose(f) != 0 || !ok)
        unlink(seal);
}

/* Whether the pool is as sealed; the seal goes either way. */
static bool take_seal(const char *dir)
{
    char pool[PATH_MAX], seal[PATH_MAX], want[160], got[160] = "";
    struct stat st;
    snprintf(pool, sizeof pool, "%s/%s", dir, POOL_FILE);
    snprintf(seal, sizeof seal, "%s/%s", dir, POOL_SEAL);
    FILE *f = fopen(seal, "r");
    if (!f)
        return false;
    bool read_ok = fgets(got, sizeof got, f) != NULL;
    fclose(f);
    unlink(seal);
    if (!read_ok || stat(pool, &st) != 0)
        return false;
    seal_text(&st, want, sizeof want);
    return strcmp(want, got) == 0;
}

#ifdef __SANITIZE_ADDRESS__
/* Threads of this process, from /proc (0 when it cannot tell). */
static unsigned process_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned n = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %u", &n) == 1)
            break;
    fclose(f);
    return n;
}
#endif

static int probe_pool(const char *pool, const char *dir, int lockfd)
{
#ifdef __SANITIZE_ADDRESS__
    /* AddressSanitizer's allocator has no fork handlers (GCC 12's): a
     * child forked while another thread holds its lock waits forever in
     * the first malloc of pmemobj_open, and the pool would be reported
     * damaged (crash_sql, 1 run in 3).  Sanitized test builds probe only
     * from a process of one thread; glibc's malloc is safe across fork. */
    if (process_threads() != 1)
        return EMBKV_OK;
#endif
    const char *env = getenv("EMBKV_PROBE_TIMEOUT");
    unsigned timeout = env && atoi(env) > 0 ? (unsigned)atoi(env) : PROBE_TIMEOUT_S;
    fflush(NULL);
    pid_t parent = getpid();
    /* The child's refusal comes back through a pipe: libpmemobj leaks
     * megabytes on a pool it refuses, so the parent opens only a pool the
     * child could open (an application retrying grew without bound). */
    int why[2];
    if (pipe2(why, O_CLOEXEC) != 0)
        return EMBKV_OK;
    pid_t pid = fork();
    if (pid < 0) {
        close(why[0]);
        close(why[1]);
        return EMBKV_OK;
    }
    if (pid == 0) {
        close(why[0]);
        /* Not a holder of the store's lock: the flock is shared with the
         * parent's descriptor, and a probe outliving a killed parent for
         * a moment kept the next opener out ("open in another process"). */
        if (lockfd >= 0)
            close(lockfd);
        /* Dies with its parent, and by itself if libpmemobj loops. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(3);  /* the parent died before the line above */
        sigset_t all;
        sigfillset(&all);
        sigprocmask(SIG_UNBLOCK, &all, NULL);
        signal(SIGALRM, SIG_DFL);
        /* A fault kills it, whatever handler the process had (a sanitizer's
         * or a runtime's may exit with a status instead). */
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        signal(SIGILL, SIG_DFL);
        signal(SIGFPE, SIG_DFL);
        signal(SIGABRT, SIG_DFL);
        alarm(timeout);
        PMEMobjpool *pop = pmemobj_open(pool, EMBKV_LAYOUT);
        if (!pop) {
            /* EINVAL: libpmemobj refuses the pool; anything else (its
             * flock held, a pool of this identity open in the parent) the
             * real open reports. */
            if (errno == EINVAL) {
                const char *m = pmemobj_errormsg();
                ssize_t w = write(why[1], m, strlen(m));
                (void)w;
            }
            _exit(2);
        }
        size_t n = 0, limit = 1u << 30;
        for (PMEMoid o = pmemobj_first(pop); !OID_IS_NULL(o) && n < limit; o = pmemobj_next(o))
            n++;
        _exit(0);
    }
    close(why[1]);
    int st = 0;
    bool reaped = true;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR) {
            reaped = false;  /* reaped elsewhere (a SIGCHLD handler): cannot tell */
            break;
        }
    }
    /* Read after the child's end, without waiting: a child another thread
     * forked meanwhile may hold the pipe's write end (no end of file until
     * it exits), and what the probe wrote, under a pipe's buffer, is
     * there. */
    char refused[400];
    ssize_t nr = 0, r;
    int fl = fcntl(why[0], F_GETFL);
    if (fl >= 0 && fcntl(why[0], F_SETFL, fl | O_NONBLOCK) == 0)
        while (nr < (ssize_t)sizeof refused - 1 &&
               ((r = read(why[0], refused + nr, sizeof refused - 1 - (size_t)nr)) > 0 || (r < 0 && errno == EINTR)))
            nr += r > 0 ? r : 0;
    refused[nr] = 0;
    close(why[0]);
    if (!reaped)
        return EMBKV_OK;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 2 && nr > 0)
        return embkv__err(EMBKV_CORRUPT, "store %s: %s is damaged (or made by an incompatible libpmemobj): %s: "
                          "restore the store from a backup", dir, POOL_FILE, refused);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
        return embkv__err(EMBKV_CORRUPT, "store %s: %s is damaged: libpmemobj did not finish opening it in %u s",
                          dir, POOL_FILE, timeout);
    if (WIFSIGNALED(st))
        return embkv__err(EMBKV_CORRUPT, "store %s: %s is damaged: libpmemobj's metadata in it crashes the "
                          "library (signal %d when a probe process opened it)", dir, POOL_FILE, WTERMSIG(st));
    if (!WIFEXITED(st) || (WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 2))
        return embkv__err(EMBKV_CORRUPT, "store %s: %s is damaged: libpmemobj's metadata in it crashes the "
                          "library (exit status %d of a probe process that opened it)", dir, POOL_FILE,
                          WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    return EMBKV_OK;
}

static void free_store(embkv_store *s)
{
    if (!s)
        return;
    /* The tier's thread works on everything below: stopped first (a no-op
     * where embkv_close or a failed open stopped it already). */
    evict_stop(s);
    tier_worker_stop(s);
    gpu_close(s);  /* (before the pool's mapping goes) */
    readers_detach(s);
    if (s->reader) {
        /* (the pool mapped by open_reader; its index descriptors) */
        if (s->pool_base)
            munmap(s->pool_base, s->pool_size);
        ro_free(s);
    }
    free(atomic_load(&s->ix));
    free(s->free_locs.v);
    slab_free_checked(s);
    for (int i = 0; i < 2; i++) {
        free(s->pending[i].v);
        free(s->pendingu[i].v);
        free(s->tombs[i]);
    }
    free(s->tdefer);
    free(s->tdefer_epoch);
    dirtymap_close(s);
    free(s->limbo);
    free(s->plimbo);
    tier_close(s);
    cache_free(s->cache);
    heat_free(s->heat);
    evict_free(s);
    train_free(s);
    snap_free(s);
    pthread_rwlock_destroy(&s->writers);
    pthread_mutex_destroy(&s->slab_mu);
    pthread_mutex_destroy(&s->retire_mu);
    pthread_mutex_destroy(&s->sync_mu);
    pthread_mutex_destroy(&s->move_mu);
    pthread_mutex_destroy(&s->demote_mu);
    pthread_mutex_destroy(&s->keep_mu);
    pthread_mutex_destroy(&s->compact_mu);
    pthread_mutex_destroy(&s->promo_mu);
    pthread_mutex_destroy(&s->tw_mu);
    pthread_cond_destroy(&s->tw_cond);
    pthread_cond_destroy(&s->tw_done);
    pthread_mutex_destroy(&s->mg_mu);
    pthread_cond_destroy(&s->mg_cond);
    pthread_mutex_destroy(&s->la_mu);
    knn_map_free(s);
    knnlog_free(s);
    pthread_mutex_destroy(&s->knn_mu);
    free(s->path);
    free(s);
}

static embkv_store *alloc_store(void)
{
    embkv_store *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    /* Sync and resize must not starve behind a stream of writers. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&s->writers, &attr);
    pthread_rwlockattr_destroy(&attr);
    pthread_mutex_init(&s->slab_mu, NULL);
    pthread_mutex_init(&s->retire_mu, NULL);
    pthread_mutex_init(&s->knn_mu, NULL);
    pthread_mutex_init(&s->sync_mu, NULL);
    pthread_mutex_init(&s->move_mu, NULL);
    pthread_mutex_init(&s->demote_mu, NULL);
    pthread_mutex_init(&s->keep_mu, NULL);
    pthread_mutex_init(&s->compact_mu, NULL);
    pthread_mutex_init(&s->promo_mu, NULL);
    pthread_mutex_init(&s->tw_mu, NULL);
    pthread_cond_init(&s->tw_cond, NULL);
    pthread_cond_init(&s->tw_done, NULL);
    pthread_mutex_init(&s->mg_mu, NULL);
    pthread_cond_init(&s->mg_cond, NULL);
    pthread_mutex_init(&s->la_mu, NULL);
    s->lockfd = -1;
    s->pool_fd = -1;
    if (snap_init(s) != EMBKV_OK) {
        free_store(s);
        return NULL;
    }
    return s;
}

static int init_root(embkv_store *s, const embkv_options *opt)
{
    store_root *r = s->root;
    double max_load = opt->max_load ? opt->max_load : DEFAULT_MAX_LOAD;
    uint64_t expected = opt->expected_rows ? opt->expected_rows : DEFAULT_EXPECTED_ROWS;
    uint64_t nb = index_buckets_for(expected, max_load);
    if (pmemobj_zalloc(s->pop, &r->index, heap_units_size(nb * BUCKET_BYTES + BUCKET_BYTES), TYPE_INDEX) != 0 ||
        pmemobj_zalloc(s->pop, &r->chunk_table, heap_units_size(MAX_CHUNKS * sizeof(PMEMoid)), TYPE_CHUNK_TABLE) != 0)
        return embkv__err(EMBKV_FULL,
                          "store %s: pool_size %zu is too small for an index of %llu buckets, sized for %llu "
                          "expected rows (the capacity option in SQL): the index alone takes about %llu MiB of "
                          "the pool; give a larger pool_size (or leave it out: the default for a capacity "
                          "holds the index and the rows), or a smaller capacity",
                          s->path, s->pool_size, (unsigned long long)nb, (unsigned long long)expected,
                          (unsigned long long)((nb * BUCKET_BYTES + MAX_CHUNKS * sizeof(PMEMoid) + (1u << 20) - 1) >>
                                               20));
    r->format_version = EMBKV_FORMAT_VERSION;
    r->dim = opt->dim;
    r->state_floats = opt->state_floats;
    r->dtype = opt->dtype ? opt->dtype : EMBKV_F32;
    r->dtype_check = r->dtype ^ DTYPE_CHECK_KEY;
    uint64_t id = 0;
    while (id == 0)
        if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id)
            return embkv__err(EMBKV_IO, "store %s: no random number for its id: %s", s->path, strerror(errno));
    r->store_id = id;
    r->store_id_check = id ^ STORE_ID_CHECK_KEY;
    r->record_size = record_size((int)r->dtype, opt->dim, opt->state_floats);
    r->durable_epoch = 0;
    r->clean = 1;
    r->max_load = max_load;
    r->nbuckets = nb;
    r->created_rows_hint = expected;
    r->chunk_bytes = chunk_bytes_for(s->pool_size, r->record_size);
    pmemobj_persist(s->pop, r, sizeof *r);
    /* The magic goes last: a pool without it was never fully created. */
    memcpy(r->magic, EMBKV_MAGIC, sizeof r->magic);
    pmemobj_persist(s->pop, r->magic, sizeof r->magic);
    return EMBKV_OK;
}

/* Memory this process may fill with page cache: the machine's, or less
 * under a memory cgroup (v1 or v2), which charges page cache too. */
static uint64_t memory_budget(void)
{
    uint64_t mem = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return mem;
    char line[PATH_MAX + 64], file[PATH_MAX + 128];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = 0;
        if (strcmp(c1 + 1, "memory") == 0)
            snprintf(file, sizeof file, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", c2 + 1);
        else if (c1[1] == 0 && strncmp(line, "0", 2) == 0)
            snprintf(file, sizeof file, "/sys/fs/cgroup%s/memory.max", c2 + 1);
        else
            continue;
        FILE *l = fopen(file, "r");
        unsigned long long lim;
        if (l && fscanf(l, "%llu", &lim) == 1 && lim < mem)
            mem = lim;
        if (l)
            fclose(l);
    }
    fclose(f);
    return mem;
}

/* The kernel reads ahead around every page fault of a file mapping (128
 * KiB by default).  While the pool fits in memory that is harmless, but a
 * pool larger than memory is read at random: each 544-byte record read
 * brought 32 pages, which evicted the pages the next reads needed, and the
 * disk ran at full bandwidth for a few hundred rows/s.  So a pool larger
 * than half the memory this process may use is advised MADV_RANDOM (one
 * page per fault).  EMBKV_POOL_ADVICE=random|normal overrides the rule
 * (bench/ltm.sh measures both). */
static void advise_pool(embkv_store *s)
{
    if (s->is_pmem)
        return;
    const char *env = getenv("EMBKV_POOL_ADVICE");
    bool rnd;
    if (env && strcmp(env, "random") == 0)
        rnd = true;
    else if (env && strcmp(env, "normal") == 0)
        rnd = false;
    else
        rnd = s->pool_size > memory_budget() / 2;
    s->pool_advice_random = rnd;
    if (rnd && madvise(s->pool_base, s->pool_size & ~(size_t)(sysconf(_SC_PAGESIZE) - 1), MADV_RANDOM) != 0)
        s->pool_advice_random = false; /* only advice: the pool works either way */
}

/* (a dying process lets go within milliseconds; one that holds on is
 * reported after this) */
#define POOL_FLOCK_WAIT_MS 3000

/* The way on for a second writer; the SQL binding replaces it with SQL's
 * own ways, cutting at its first words. */
#define SECOND_WRITER_ADVICE ": one process at a time may write a store: close it there first, or read it " \
    "beside that process with EMBKV_OPEN_READONLY (the rows of its last checkpoint)"

static int open_pool(embkv_store *s, const embkv_options *opt, bool exists)
{
    char pool[PATH_MAX];
    snprintf(pool, sizeof pool, "%s/%s", s->path, POOL_FILE);
    if (exists) {
        int rc = check_pool_header(pool, s->path);
        if (rc == EMBKV_OK && !take_seal(s->path))
            rc = probe_pool(pool, s->path, s->lockfd);
        if (rc != EMBKV_OK)
            return rc;
        /* We hold LOCK, so the only other holder of the pool file's flock
         * (libpmemobj's) should be the probe child of an opener killed a
         * moment ago, still dying (its PR_SET_PDEATHSIG is delivered, its
         * exit not finished: seen under load, a writer restarted at once
         * after a SIGKILL): waited for, up to POOL_FLOCK_WAIT_MS. */
        for (unsigned waited = 0;; waited += 10) {
            s->pop = pmemobj_open(pool, EMBKV_LAYOUT);
            if (s->pop || (errno != EAGAIN && errno != EWOULDBLOCK) || waited >= POOL_FLOCK_WAIT_MS)
                break;
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        }
        if (!s->pop && (errno == EAGAIN || errno == EWOULDBLOCK))
            return embkv__err(EMBKV_BUSY,
                              "store %s: %s is locked by another process that is not an embkv writer (%s): "
                              "stop the program that has the file open (pmempool, a copy of the store opened "
                              "with libpmemobj) and open again",
                              s->path, POOL_FILE, pmemobj_errormsg());
        /* Its signature and layout are embkv's (check_pool_header): a pool
         * libpmemobj then refuses is damaged, not someone else's file (a
         * path option at fault, as the SQLite binding reported it). */
        if (!s->pop && errno == EINVAL)
            return embkv__err(EMBKV_CORRUPT, "store %s: %s is damaged (or made by an incompatible libpmemobj): %s: "
                              "restore the store from a backup", s->path, POOL_FILE, pmemobj_errormsg());
        /* libpmemobj keeps one pool of a UUID per process: a byte copy
         * (cp -r) of a store this process has open. */
        if (!s->pop && errno == EEXIST)
            return embkv__err(EMBKV_BUSY, "store %s: its %s is a copy of a pool this process has open already "
                              "(libpmemobj opens one pool of an identity per process; cp of a store copies its "
                              "identity): open the copy in a process of its own, or make copies with "
                              "embkv_backup, whose pool has an identity of its own",
                              s->path, POOL_FILE);
        if (!s->pop)
            return embkv__err(EMBKV_IO, "%s: cannot open %s: %s", s->path, POOL_FILE, pmemobj_errormsg());
    } else {
        uint32_t rs = record_size((int)(opt->dtype ? opt->dtype : EMBKV_F32), opt->dim, opt->state_floats);
        double max_load = opt->max_load ? opt->max_load : DEFAULT_MAX_LOAD;
        uint64_t expected = opt->expected_rows ? opt->expected_rows : DEFAULT_EXPECTED_ROWS;
        uint64_t size = opt->pool_size;
        if (!size) {
            double est = 2.5 * (double)expected * rs + 3.0 * index_buckets_for(expected, max_load) * BUCKET_BYTES +
                         (16 << 20);
            size = ((uint64_t)est + (1 << 20) - 1) & ~((uint64_t)(1 << 20) - 1);
            if (size < 32ull << 20)
                size = 32ull << 20;
            /* Without a row count from the caller, the guess does not get to
             * claim more than 1 GiB of disk (wide rows would make it many). */
            if (!opt->expected_rows && size > DEFAULT_POOL_CAP)
                size = DEFAULT_POOL_CAP;
        }
        /* libpmemobj allocates the whole file up front: refuse a size the
         * filesystem cannot hold with a message saying what sized it,
         * rather than its "File too large" or "No space left". */
        struct statvfs fs;
        if (statvfs(s->path, &fs) == 0 && (double)size > (double)fs.f_bavail * (double)fs.f_frsize) {
            unsigned long long avail = (unsigned long long)fs.f_bavail * fs.f_frsize;
            if (opt->pool_size)
                return embkv__err(EMBKV_FULL, "store %s: a pool of %llu bytes does not fit: its filesystem has "
                                  "%llu bytes free", s->path, (unsigned long long)size, avail);
            return embkv__err(EMBKV_FULL, "store %s: %llu rows of %u-byte records need a pool of %llu bytes, and "
                              "its filesystem has %llu bytes free", s->path, (unsigned long long)expected, rs,
                              (unsigned long long)size, avail);
        }
        /* Created under a temporary name and renamed once complete, so a
         * crash during creation leaves nothing that looks like a store. */
        snprintf(pool, sizeof pool, "%s/%s", s->path, POOL_TMP);
        unlink(pool);
        s->pop = pmemobj_create(pool, EMBKV_LAYOUT, size, 0644);
        s->creating = 1;
        if (!s->pop) {
            int e = errno;
            unlink(pool);
            return embkv__err(e == ENOSPC ? EMBKV_FULL : EMBKV_IO, "store %s: cannot create a %llu-byte pool: %s",
                              s->path, (unsigned long long)size, pmemobj_errormsg());
        }
    }
    struct stat st;
    if (stat(pool, &st) != 0)
        return embkv__err(EMBKV_IO, "store %s: stat %s: %s", s->path, POOL_FILE, strerror(errno));
    s->pool_size = (size_t)st.st_size;
    s->pool_base = (char *)s->pop;
    PMEMoid root = pmemobj_root(s->pop, sizeof(store_root));
    if (OID_IS_NULL(root))
        return embkv__err(EMBKV_FULL, "store %s: pool too small for the root object", s->path);
    s->root = pmemobj_direct(root);
    return EMBKV_OK;
}

/* An object id read from the pool names an object of this pool of the given
 * type with room for `bytes` bytes, all inside the file.  Checked before any
 * pointer is made from it: a damaged root must give an error, not a fault.
 * libpmemobj's own queries are no help (on a damaged offset they read
 * garbage chunk headers and fault), so this reads the 16-byte header that
 * libpmemobj 1.x writes before every object embkv allocates (a compact
 * header: the allocation's size in the low 48 bits, then the type number),
 * after checking that it lies inside the file. */
static bool oid_sane(const embkv_store *s, PMEMoid oid, uint64_t bytes, uint64_t type)
{
    if (OID_IS_NULL(oid) || oid.pool_uuid_lo != pmemobj_oid(s->root).pool_uuid_lo || (oid.off & 15))
        return false;
    if (oid.off < 4096 || oid.off >= s->pool_size || bytes > s->pool_size - oid.off)
        return false;
    const uint64_t *hdr = (const uint64_t *)(s->pool_base + oid.off - 16);
    return hdr[1] == type && (hdr[0] & ((1ull << 48) - 1)) >= bytes + 16;
}

typedef struct span {
    uint64_t off, len;
} span;

static int cmp_span(const void *a, const void *b)
{
    uint64_t x = ((const span *)a)->off, y = ((const span *)b)->off;
    return (x > y) - (x < y);
}

static int corrupt_root(const embkv_store *s, const char *what)
{
    return embkv__err(EMBKV_CORRUPT, "store %s: the pool's root object is damaged: %s", s->path, what);
}

/* Every value of the root that sizes a loop or makes a pointer. */
static int check_root(embkv_store *s)
{
    store_root *r = s->root;
    if (!(r->max_load >= 0.1 && r->max_load <= 0.98))
        return corrupt_root(s, "max_load out of range");
    if (r->nbuckets > s->pool_size / BUCKET_BYTES)
        return corrupt_root(s, "more index buckets than the pool can hold");
    if (!oid_sane(s, r->index, r->nbuckets * BUCKET_BYTES + BUCKET_BYTES, TYPE_INDEX))
        return corrupt_root(s, "the index object does not fit its bucket count");
    if (!oid_sane(s, r->chunk_table, MAX_CHUNKS * sizeof(PMEMoid), TYPE_CHUNK_TABLE))
        return corrupt_root(s, "bad chunk table");
    if (r->chunk_bytes > s->pool_size)
        return corrupt_root(s, "record chunks larger than the pool");
    /* The index, the chunk table and the chunks: inside the pool, and no
     * two of them overlapping. */
    const PMEMoid *chunks = pmemobj_direct(r->chunk_table);
    span *sp = malloc((MAX_CHUNKS + 2) * sizeof *sp);
    if (!sp)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
    size_t n = 0;
    sp[n++] = (span){r->index.off, r->nbuckets * BUCKET_BYTES + BUCKET_BYTES};
    sp[n++] = (span){r->chunk_table.off, MAX_CHUNKS * sizeof(PMEMoid)};
    for (size_t i = 0; i < MAX_CHUNKS && !OID_IS_NULL(chunks[i]); i++) {
        if (!oid_sane(s, chunks[i], r->chunk_bytes, TYPE_CHUNK)) {
            free(sp);
            return corrupt_root(s, "a record chunk lies outside the pool");
        }
        sp[n++] = (span){chunks[i].off, r->chunk_bytes};
    }
    qsort(sp, n, sizeof *sp, cmp_span);
    for (size_t i = 1; i < n; i++)
        if (sp[i - 1].off + sp[i - 1].len > sp[i].off) {
            free(sp);
            return corrupt_root(s, "the index, the chunk table and the record chunks overlap");
        }
    free(sp);
    /* Leftovers of a resize are freed at open: they must be objects of
     * their own, never the live index or tables. */
    const PMEMoid *left[2] = {&r->index_next, &r->index_old};
    for (int k = 0; k < 2; k++) {
        if (OID_IS_NULL(*left[k]))
            continue;
        if (!oid_sane(s, *left[k], BUCKET_BYTES, TYPE_INDEX) || left[k]->off == r->index.off ||
            left[k]->off == r->chunk_table.off || (k == 1 && left[k]->off == r->index_next.off))
            return corrupt_root(s, "a leftover index of an interrupted resize is not a separate object");
        for (size_t i = 0; i < MAX_CHUNKS && !OID_IS_NULL(chunks[i]); i++)
            if (chunks[i].off == left[k]->off)
                return corrupt_root(s, "a leftover index of an interrupted resize is a record chunk");
    }
    return EMBKV_OK;
}

/* The root's geometry into s (format version, dim, optimizer state, record
 * size, dtype), each checked: the writer's open and a reader's alike. */
static int root_geometry(embkv_store *s)
{
    store_root *r = s->root;
    if (r->format_version != EMBKV_FORMAT_VERSION)
        return embkv__err(EMBKV_VERSION, "store %s: format version %u, this build reads version %d", s->path,
                          r->format_version, EMBKV_FORMAT_VERSION);
    s->dim = r->dim;
    s->state_floats = r->state_floats;
    s->rec_size = r->record_size;
    if (r->dtype == 0 && r->dtype_check == 0)
        s->dtype = EMBKV_F32;
    else if (r->dtype >= EMBKV_F32 && r->dtype <= EMBKV_I8 && r->dtype_check == (r->dtype ^ DTYPE_CHECK_KEY))
        s->dtype = r->dtype;
    else
        return corrupt_root(s, "its dtype is damaged");
    if (r->store_id == 0 && r->store_id_check == 0)
        s->store_id = 0;
    else if (r->store_id != 0 && r->store_id_check == (r->store_id ^ STORE_ID_CHECK_KEY))
        s->store_id = r->store_id;
    else
        return corrupt_root(s, "its store id is damaged");
    s->vec_bytes = dtype_vec_bytes((int)s->dtype, s->dim);
    if (s->dim == 0 || s->dim > EMBKV_MAX_DIM || s->state_floats > EMBKV_MAX_STATE_FLOATS ||
        s->rec_size != record_size((int)s->dtype, s->dim, s->state_floats))
        return embkv__err(EMBKV_CORRUPT, "store %s: root object is inconsistent", s->path);
    return EMBKV_OK;
}

static int load_store(embkv_store *s, const embkv_options *opt, unsigned flags)
{
    store_root *r = s->root;
    /* The pool's layout is embkv's (check_pool_header): a root with a
     * wrong magic, or none beside other fields set, is damaged.  So is an
     * all-zero one in a pool opened without EMBKV_OPEN_CREATE: a pool is
     * renamed store.pool only once its root is filled in, and a flipped
     * byte of libpmemobj's root offset also lands on zeros. */
    bool blank = true;
    for (size_t i = 0; i < offsetof(store_root, dirty_count) && blank; i++)
        blank = ((const unsigned char *)r)[i] == 0;
    if (blank) {
        /* Created by embkv but never finished (or a fresh pool). */
        if (!(flags & EMBKV_OPEN_CREATE))
            return corrupt_root(s, "it is empty (libpmemobj's metadata is damaged, or the pool was never filled in)");
        if (!opt || !opt->dim)
            return embkv__err(EMBKV_NOTSTORE, "%s is not an embkv store: its creation never completed", s->path);
        int rc = init_root(s, opt);
        if (rc != EMBKV_OK)
            return rc;
    } else if (memcmp(r->magic, EMBKV_MAGIC, sizeof r->magic) != 0) {
        return corrupt_root(s, "its magic is damaged");
    }
    int grc = root_geometry(s);
    if (grc != EMBKV_OK)
        return grc;
    if (r->nbuckets == 0 || (r->nbuckets & (r->nbuckets - 1)) || OID_IS_NULL(r->index) ||
        OID_IS_NULL(r->chunk_table))
        return embkv__err(EMBKV_CORRUPT, "store %s: root object is inconsistent", s->path);
    int rrc = check_root(s);
    if (rrc != EMBKV_OK)
        return rrc;
    int rc = geometry_matches(s, opt);
    if (rc != EMBKV_OK)
        return rc;
    s->chunk_bytes = r->chunk_bytes;
    if (s->chunk_bytes < s->rec_size + 64)
        return embkv__err(EMBKV_CORRUPT, "store %s: root object is inconsistent", s->path);
    s->recs_per_chunk = (s->chunk_bytes - 128) / s->rec_size;
    /* Deletes of synced rows need a tombstone record each: a pool that
     * inserts and updates filled must still take them, or it could never be
     * emptied.  One chunk's worth, or 1/128 of the pool if that is more. */
    uint64_t by_pool = s->pool_size / 128 / s->rec_size;
    s->delete_reserve = (uint32_t)(by_pool > s->recs_per_chunk ? by_pool : s->recs_per_chunk);
    s->chunks = pmemobj_direct(r->chunk_table);
    s->max_load = r->max_load;

    /* Leftovers of a resize interrupted by a crash. */
    if (!OID_IS_NULL(r->index_next))
        pmemobj_free(&r->index_next);
    if (!OID_IS_NULL(r->index_old))
        pmemobj_free(&r->index_old);

    index_desc *ix = ix_desc_new(s, r->index, r->nbuckets, 1);
    if (!ix)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", s->path);
    atomic_store(&s->ix, ix);
    atomic_store(&s->index_slots, ix->nbuckets * BUCKET_SLOTS);

    s->is_pmem = pmem_is_pmem(s->pool_base, s->pool_size);
    s->dirty_words = ((s->pool_size >> 12) + 64) / 64;
    bool marked;
    if ((rc = dirtymap_open(s, &marked)) != EMBKV_OK)
        return rc;
    advise_pool(s);
    uint64_t expect = s->pool_size / s->rec_size;
    if (!(s->heat = heat_new(expect < 1024 ? 1024 : expect)))
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory for the access statistics", s->path);
    if ((rc = tier_open(s, opt)) != EMBKV_OK)
        return rc;
    if (opt && opt->cache_size && (rc = cache_attach(s, opt->cache_size)) != EMBKV_OK)
        return rc;

    bool was_clean = r->clean != 0;
    uint64_t unknown = 0;
    if (!r->clean) {
        /* Chunks must be known before recovery reads records; the free
         * list (a walk of the whole index) is built once, after it. */
        slab_map_chunks(s);
        rc = recover_rows(s, ix, marked, &unknown);
        if (rc != EMBKV_OK)
            return rc;
        s->recovered = 1;
        recover_tombstones(s, ix);
        rc = slab_rebuild(s);
        if (rc != EMBKV_OK)
            return rc;
        pmemobj_persist(s->pop, ix->buckets, ix->nbuckets * BUCKET_BYTES);
    } else {
        slab_map_chunks(s);
        if (recover_tombstones(s, ix))
            pmemobj_persist(s->pop, ix->buckets, ix->nbuckets * BUCKET_BYTES);
        if ((rc = slab_rebuild(s)) != EMBKV_OK)
            return rc;
    }
    /* The counts first: a store they refuse keeps its dirty map and its
     * log's segments as they are. */
    recover_count(s, ix);
    uint64_t rows = atomic_load(&s->rows);
    if (was_clean && r->closed_rows_check == (r->closed_rows ^ ROWS_CHECK_KEY) && rows != r->closed_rows)
        return embkv__err(EMBKV_CORRUPT, "store %s: its index holds %llu rows, %llu when it was closed: the index "
                          "is damaged", s->path, (unsigned long long)rows, (unsigned long long)r->closed_rows);
    /* (rows kept on a record recovery could not read may or may not have
     * been there at the checkpoint) */
    if (!was_clean && r->durable_rows_check == durable_rows_check(r->durable_rows, r->durable_epoch) &&
        (rows < r->durable_rows || rows - unknown > r->durable_rows))
        return embkv__err(EMBKV_CORRUPT, "store %s: recovered to its last checkpoint (epoch %llu), its index holds "
                          "%llu rows, %llu at that checkpoint: the index is damaged; restore the store from a backup",
                          s->path, (unsigned long long)r->durable_epoch, (unsigned long long)rows,
                          (unsigned long long)r->durable_rows);
    dirtymap_reset(s);  /* the pool is as of its durable epoch */
    tier_sync_done(s);  /* segments no row points at any more */
    atomic_store(&s->cur_epoch, r->durable_epoch + 1);
    atomic_store(&s->steps, evict_steps_at(s, r->durable_epoch));
    r->closed_rows_check = 0;  /* the count is only known again at a clean close */
    pmemobj_persist(s->pop, &r->closed_rows_check, sizeof r->closed_rows_check);
    r->clean = 0;
    pmemobj_persist(s->pop, &r->clean, sizeof r->clean);
    return EMBKV_OK;
}

/* Give the fully created pool its real name, durably. */
static int publish_pool(embkv_store *s)
{
    char from[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof from, "%s/%s", s->path, POOL_TMP);
    snprintf(to, sizeof to, "%s/%s", s->path, POOL_FILE);
    if (rename(from, to) != 0)
        return embkv__err(EMBKV_IO, "store %s: cannot rename the new pool: %s", s->path, strerror(errno));
    int dfd = open(s->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        return embkv__err(EMBKV_IO, "store %s: fsync of the directory: %s", s->path, strerror(e));
    }
    close(dfd);
    s->creating = 0;
    return EMBKV_OK;
}

/* Unlinks the files inspect_dir() accepts (LOCK last: it is held). */
/* Unlinks every entry of dir but `skip` (NULL: none); a subdirectory named
 * `sub` (the default SSD log) is emptied and removed the same way.
 * Returns nonzero if something stayed. */
static int unlink_entries(const char *dir, const char *skip, const char *sub)
{
    DIR *d = opendir(dir);
    if (!d)
        return errno != ENOENT;
    int bad = 0;
    struct dirent *e;
    char path[PATH_MAX];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || (skip && !strcmp(e->d_name, skip)))
            continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) {
            bad = 1;
            continue;
        }
        if (unlink(path) != 0 && errno != ENOENT)
            bad |= !(sub && errno == EISDIR && !strcmp(e->d_name, sub)) || unlink_entries(path, NULL, NULL) ||
                   rmdir(path) != 0;
    }
    closedir(d);
    return bad;
}

/* An SSD log outside the store directory goes with the store: its
 * segments (this store's, by tag), and its directory if nothing else is
 * left there.  Anything else in it stays. */
static void remove_external_log(const char *dir)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, SSD_PATH_FILE);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    unsigned long long tag = 0;
    char logdir[PATH_MAX];
    if (fscanf(f, "%llx ", &tag) == 1 && fgets(logdir, sizeof logdir, f)) {
        logdir[strcspn(logdir, "\n")] = 0;
        if (logdir[0] == '/')
            (void)log_remove_files(logdir, tag);
    }
    fclose(f);
}

static int remove_store_files(const char *dir)
{
    /* The pool first: what a removal cut short leaves is then the rest of
     * a store without its pool, which nothing opens or creates over
     * (inspect_dir), never a pool without its log or dirty map. */
    char pool[PATH_MAX];
    snprintf(pool, sizeof pool, "%s/%s", dir, POOL_FILE);
    if (unlink(pool) != 0 && errno != ENOENT)
        return -1;
    remove_external_log(dir);
    int bad = unlink_entries(dir, LOCK_FILE, LOG_DIR);
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, LOCK_FILE);
    bad |= unlink(path) != 0 && errno != ENOENT;
    return bad ? -1 : rmdir(dir);
}

/* The LOCK file names its holder: the pid, written once the flock is
 * held, so that a refused opener can say which process has the store.
 * Advisory text only (the flock decides); a stale or damaged one is read
 * as no pid. */
static void lock_note_holder(int fd)
{
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0 && pwrite(fd, buf, (size_t)n, 0) == n)
        return;
    /* (without it a refusal only says "another process") */
}

/* LOCK, never through a link and only a plain file (its holder writes
 * its pid into it: a store directory from elsewhere must not make it
 * write another file); -1 with errno (ELOOP for a link or not a file). */
static int open_lock(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        errno = ELOOP;
        return -1;
    }
    return fd;
}

static long lock_holder(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *end;
    long pid = strtol(buf, &end, 10);
    return pid > 0 && *end == '\n' ? pid : 0;
}

/* 1 when another descriptor of this process than fd holds fd's file open
 * (another copy of the engine in the process has the lock), 0 when none
 * does, -1 when it cannot be told (no /proc). */
static int held_here(int fd)
{
    struct stat me, o;
    DIR *d = opendir("/proc/self/fd");
    if (!d || fstat(fd, &me) != 0) {
        if (d)
            closedir(d);
        return -1;
    }
    int found = 0;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char *end;
        long n = strtol(e->d_name, &end, 10);
        if (*end || end == e->d_name || n == fd || n == dirfd(d))
            continue;
        found = fstat((int)n, &o) == 0 && o.st_dev == me.st_dev && o.st_ino == me.st_ino;
    }
    closedir(d);
    return found;
}

/* Why flock of a store's lock file (fd) failed with errno err.  A lock
 * naming this very process is held by a second copy of the engine in it (a
 * program's library and an extension, or two extensions, each with its
 * own registry of open stores, which do not know each other's) when one
 * of its descriptors has the file; else by a child that inherited it, or
 * by a process of another PID namespace with the same number.  (The
 * binding keys on "another process": it waits for one, and keeps its
 * directory.) */
static int lock_refused(const char *path, int fd, int err, const char *advice)
{
    if (err != EWOULDBLOCK)
        return embkv__err(EMBKV_IO, "store %s: flock: %s", path, strerror(err));
    long holder = lock_holder(fd);
    int here = holder == proc_pid() ? held_here(fd) : 0;
    if (here == 1)
        return embkv__err(EMBKV_LOCKED, "store %s is open in this process (pid %ld) through another copy of embkv: "
                          "two embkv libraries or extensions are loaded in it, and neither can use the other's "
                          "stores: load one copy in a process (in Python, open every connection with "
                          "embkv.connect, which loads the package's)", path, holder);
    if (holder == proc_pid())
        return embkv__err(EMBKV_LOCKED, "store %s is open in another process (its lock names pid %ld, this "
                          "process's number: a child that inherited it through fork, or a process of another PID "
                          "namespace%s)%s", path, holder, here < 0 ? ", or another copy of embkv in this process" : "",
                          advice);
    if (holder)
        return embkv__err(EMBKV_LOCKED, "store %s is open in another process (pid %ld)%s", path, holder, advice);
    return embkv__err(EMBKV_LOCKED, "store %s is open in another process%s", path, advice);
}

int embkv_destroy(const char *dir)
{
    if (!dir || !*dir)
        return embkv__err(EMBKV_INVALID, "embkv_destroy: directory is NULL or empty");
    /* A symbolic link names the directory it leads to, as at an open: that
     * store is removed, the link stays (its files were removed through the
     * link, and then the link itself could not be rmdir'ed). */
    char *real = NULL;
    struct stat lst;
    if (lstat(dir, &lst) == 0 && S_ISLNK(lst.st_mode) && (real = realpath(dir, NULL)))
        dir = real;
    pthread_mutex_lock(&registry_mu);
    int rc = EMBKV_OK, fd = -1;
    struct stat st;
    int found = stat(dir, &st) == 0, err = errno;
    if (!found || !S_ISDIR(st.st_mode)) {
        rc = embkv__err(EMBKV_NOTSTORE, "no embkv store at %s: %s", dir,
                        found ? "not a directory" : err == ENOENT ? "the directory does not exist" : strerror(err));
        goto out;
    }
    for (embkv_store *o = registry; o; o = o->next) {
        if (o->dev == st.st_dev && o->ino == st.st_ino) {
            rc = embkv__err(EMBKV_LOCKED, "store %s is open in this process", dir);
            goto out;
        }
    }
    char foreign[256] = "", lockpath[PATH_MAX];
    /* (the rest of a store without its pool, -3, is what it removes too) */
    int state = inspect_dir(dir, foreign, sizeof foreign);
    if (state != -3 && (rc = dir_verdict(dir, state, foreign, true)) != EMBKV_OK)
        goto out;
    snprintf(lockpath, sizeof lockpath, "%s/%s", dir, LOCK_FILE);
    fd = open_lock(lockpath);
    if (fd < 0) {
        rc = errno == ELOOP ? embkv__err(EMBKV_IO, "store %s: its %s is a symbolic link or not a plain file, which "
                                         "embkv does not open: remove it", dir, LOCK_FILE)
                            : embkv__err(EMBKV_IO, "store %s: cannot open %s: %s", dir, LOCK_FILE, strerror(errno));
        goto out;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        rc = lock_refused(dir, fd, errno, ": close it there first");
        goto out;
    }
    /* Nor may another process be reading it (readers take no lock). */
    long reader = readers_live_reader(dir);
    if (reader) {
        rc = embkv__err(EMBKV_LOCKED, "store %s is open for reading in another process (pid %ld): close it there "
                        "first", dir, reader);
        goto out;
    }
    /* Under the lock, again: nothing foreign arrived meanwhile. */
    state = inspect_dir(dir, foreign, sizeof foreign);
    if (state != -3 && (rc = dir_verdict(dir, state, foreign, true)) != EMBKV_OK)
        goto out;
    if (remove_store_files(dir) != 0)
        rc = embkv__err(EMBKV_IO, "store %s: cannot remove it: %s", dir, strerror(errno));
out:
    if (fd >= 0)
        close(fd);
    pthread_mutex_unlock(&registry_mu);
    free(real);
    return rc;
}

/* ----------------------------------------------------------- readers */

/* Where libpmemobj 1.x keeps the root object's offset in its pool
 * descriptor (after the 4 KiB pool header, the layout name, the lanes' and
 * heap's fields and their checksum).  A reader cannot ask libpmemobj: it
 * takes an exclusive lock on the pool file the writer holds. */
#define PMDK_ROOT_OFFSET_AT 6144

/* A store opened to read beside another process's writer (or none): the
 * pool mapped read-only, no lock taken, no thread started.  What it may do
 * and how its reads stay safe: readonly.c and readers.c. */
static int open_reader(const char *dir, const struct stat *st, const embkv_options *opt, embkv_store **out)
{
    char foreign[256] = "";
    int state = inspect_dir(dir, foreign, sizeof foreign);
    if (state != 1)
        return dir_verdict(dir, state == 0 ? 0 : state, foreign, false);
    embkv_store *s = alloc_store();
    if (!s)
        return embkv__err(EMBKV_NOMEM, "store %s: out of memory", dir);
    s->reader = true;
    s->dev = st->st_dev;
    s->ino = st->st_ino;
    s->refs = 1;
    s->pid = (pid_t)proc_pid();
    s->path = realpath(dir, NULL);
    int rc = EMBKV_OK;
    if (!s->path) {
        rc = embkv__err(EMBKV_IO, "store %s: realpath: %s", dir, strerror(errno));
        goto fail;
    }
    char pool[PATH_MAX];
    snprintf(pool, sizeof pool, "%s/%s", s->path, POOL_FILE);
    if ((rc = check_pool_header(pool, s->path)) != EMBKV_OK)
        goto fail;
    int fd = open(pool, O_RDONLY | O_CLOEXEC);
    struct stat ps;
    if (fd < 0 || fstat(fd, &ps) != 0) {
        rc = embkv__err(EMBKV_IO, "store %s: cannot read %s: %s", s->path, POOL_FILE, strerror(errno));
        if (fd >= 0)
            close(fd);
        goto fail;
    }
    if ((uint64_t)ps.st_size < MIN_POOL_SIZE / 2) {
        close(fd);
        rc = embkv__err(EMBKV_CORRUPT, "store %s: %s is truncated", s->path, POOL_FILE);
        goto fail;
    }
    void *map = mmap(NULL, (size_t)ps.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        rc = embkv__err(EMBKV_IO, "store %s: cannot map %s: %s", s->path, POOL_FILE, strerror(errno));
        goto fail;
    }
    s->pool_base = map;
    s->pool_size = (size_t)ps.st_size;
    uint64_t roff = *(const uint64_t *)(s->pool_base + PMDK_ROOT_OFFSET_AT);
    if (roff < 4096 || (roff & 15) || roff > s->pool_size - sizeof(store_root)) {
        rc = corrupt_root(s, "libpmemobj's root offset is out of the pool");
        goto fail;
    }
    s->root = (store_root *)(s->pool_base + roff);
    store_root *r = s->root;
    if (memcmp(r->magic, EMBKV_MAGIC, sizeof r->magic) != 0) {
        rc = corrupt_root(s, "its magic is damaged (or the store's creation never completed)");
        goto fail;
    }
    if ((rc = root_geometry(s)) != EMBKV_OK)
        goto fail;
    /* (check_root needs libpmemobj's handle: the chunk table and the
     * chunks are checked as they are used, readonly.c) */
    if (r->chunk_bytes < s->rec_size + 64 || r->chunk_bytes > s->pool_size || r->chunk_table.off < 4096 ||
        r->chunk_table.off > s->pool_size - MAX_CHUNKS * sizeof(PMEMoid)) {
        rc = embkv__err(EMBKV_CORRUPT, "store %s: root object is inconsistent", s->path);
        goto fail;
    }
    if ((rc = geometry_matches(s, opt)) != EMBKV_OK)
        goto fail;
    s->chunk_bytes = r->chunk_bytes;
    s->recs_per_chunk = (s->chunk_bytes - 128) / s->rec_size;
    s->chunks = (PMEMoid *)(s->pool_base + r->chunk_table.off);
    s->max_load = r->max_load;
    rc = ro_load(s);
    if (rc != EMBKV_OK)
        goto fail;
    s->next = registry;
    registry = s;
    *out = s;
    return EMBKV_OK;
fail:
    free_store(s);
    return rc;
}

/* A new store is never made inside another store's directory: that store
 * holds only its own files, and would refuse to open with a directory of
 * another's in it (a store made inside one bricked it). */
static int refuse_nested(const char *dir)
{
    char abs[PATH_MAX], found[PATH_MAX];
    if (dir[0] == '/') {
        snprintf(abs, sizeof abs, "%s", dir);
    } else {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd) || snprintf(abs, sizeof abs, "%s/%s", cwd, dir) >= (int)sizeof abs)
            return embkv__err(EMBKV_INVALID, "store %s: the directory name is too long to resolve", dir);
    }
    if (path_below_file(abs, POOL_FILE, found, sizeof found))
        return embkv__err(EMBKV_INVALID, "store %s: the directory would be inside the embkv store %s, whose "
                          "directory holds only its own files: put the new store beside it", dir, found);
    if (log_dir_above(abs, found, sizeof found))
        return embkv__err(EMBKV_INVALID, "store %s: the directory would be inside %s, the SSD log of an embkv "
                          "store (its ssd_path), which holds only that store's segments: put the new store beside "
                          "it", dir, found);
    return EMBKV_OK;
}

int embkv_open(const char *dir, const embkv_options *opt, unsigned flags, embkv_store **out)
{
    if (!out)
        return embkv__err(EMBKV_INVALID, "embkv_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir)
        return embkv__err(EMBKV_INVALID, "embkv_open: directory is NULL or empty");
    unsigned unknown = flags & ~(unsigned)(EMBKV_OPEN_CREATE | EMBKV_OPEN_READONLY | EMBKV_OPEN_NO_CLOSE_SYNC |
                                           EMBKV_OPEN_ANY_CACHE);
    if (unknown)
        return embkv__err(EMBKV_INVALID, "embkv_open: store %s: unknown flags 0x%x (known: EMBKV_OPEN_CREATE, "
                          "EMBKV_OPEN_READONLY, EMBKV_OPEN_NO_CLOSE_SYNC, EMBKV_OPEN_ANY_CACHE)", dir, unknown);
    int rc = validate_options(opt, flags, dir);
    if (rc != EMBKV_OK)
        return rc;

    pthread_mutex_lock(&registry_mu);
    struct stat st;
    if (stat(dir, &st) != 0) {
        if (errno != ENOENT) {
            rc = embkv__err(EMBKV_IO, "store %s: %s", dir, strerror(errno));
            goto unlock;
        }
        if (!(flags & EMBKV_OPEN_CREATE)) {
            rc = embkv__err(EMBKV_NOTSTORE, "no embkv store at %s: the directory does not exist", dir);
            goto unlock;
        }
        if ((rc = refuse_nested(dir)) != EMBKV_OK)
            goto unlock;
        /* (Another process may make it meanwhile: then it is there, as
         * asked, and its lock decides which of the two makes the store.) */
        if ((mkdir(dir, 0755) != 0 && errno != EEXIST) || stat(dir, &st) != 0) {
            rc = embkv__err(EMBKV_IO, "store %s: cannot create the directory: %s", dir, strerror(errno));
            goto unlock;
        }
    }
    if (!S_ISDIR(st.st_mode)) {
        rc = embkv__err(EMBKV_NOTSTORE, "%s is not an embkv store: not a directory", dir);
        goto unlock;
    }
    /* The process's handle of the store: its writer's, which a read-only
     * open shares too, else a read-only open shares its reader's.  (A
     * writer opened while readers of this process read is a handle of its
     * own beside theirs: its reclamation counts their slots as any
     * reader's.) */
    embkv_store *same = NULL;
    for (embkv_store *o = registry; o; o = o->next)
        /* A store inherited through fork() is the parent's: the child opens
         * anew, and the parent's lock refuses it. */
        if (o->dev == st.st_dev && o->ino == st.st_ino && o->pid == proc_pid() &&
            (!o->reader || ((flags & EMBKV_OPEN_READONLY) && !same)))
            same = o;
    if (same) {
        embkv_store *o = same;
        rc = geometry_matches(o, opt);
        /* (a reader's handle takes no cache and runs no migration) */
        if (rc == EMBKV_OK && !o->reader)
            rc = tier_check_open(o, opt);
        if (rc == EMBKV_OK && !o->reader && opt && opt->cache_size && o->cache_size &&
            opt->cache_size != o->cache_size && !(flags & EMBKV_OPEN_ANY_CACHE))
            rc = embkv__err(EMBKV_INVALID,
                            "store %s is already open in this process with option cache_size %llu; another "
                            "open asked for %llu (leave it out, or 0, to share the cache)",
                            o->path, (unsigned long long)o->cache_size, (unsigned long long)opt->cache_size);
        else if (rc == EMBKV_OK && !o->reader && opt && opt->cache_size && !o->cache_size)
            rc = cache_attach(o, opt->cache_size);
        if (rc == EMBKV_OK && !o->reader && opt && opt->migrate_rate)
            rc = migrate_start(o, opt->migrate_rate);
        if (rc == EMBKV_OK) {
            o->refs++;
            if (flags & EMBKV_OPEN_NO_CLOSE_SYNC)
                o->no_close_sync = true;
            *out = o;
        }
        goto unlock;
    }

    if (flags & EMBKV_OPEN_READONLY) {
        rc = open_reader(dir, &st, opt, out);
        goto unlock;
    }
    char foreign[256] = "";
    /* (-3, the rest of a store without its pool, is judged under the lock:
     * another process's embkv_destroy, which removes the pool first, may be
     * at work there, and then the answer is EMBKV_LOCKED) */
    int state = inspect_dir(dir, foreign, sizeof foreign);
    if (state != -3 && (rc = dir_verdict(dir, state, foreign, flags & EMBKV_OPEN_CREATE)) != EMBKV_OK)
        goto unlock;
    if (state == 0 && (rc = refuse_nested(dir)) != EMBKV_OK)
        goto unlock;

    embkv_store *s = alloc_store();
    if (!s) {
        rc = embkv__err(EMBKV_NOMEM, "store %s: out of memory", dir);
        goto unlock;
    }
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->refs = 1;
    s->path = realpath(dir, NULL);
    if (!s->path) {
        rc = embkv__err(EMBKV_IO, "store %s: realpath: %s", dir, strerror(errno));
        free_store(s);
        goto unlock;
    }
    char lockpath[PATH_MAX];
    snprintf(lockpath, sizeof lockpath, "%s/%s", s->path, LOCK_FILE);
    s->pid = (pid_t)proc_pid();
    s->lockfd = open_lock(lockpath);
    if (s->lockfd < 0) {
        rc = errno == ELOOP ? embkv__err(EMBKV_IO, "store %s: its %s is a symbolic link or not a plain file, which "
                                         "embkv does not open: remove it", s->path, LOCK_FILE)
                            : embkv__err(EMBKV_IO, "store %s: cannot open %s: %s", s->path, LOCK_FILE, strerror(errno));
        free_store(s);
        goto unlock;
    }
    if (flock(s->lockfd, LOCK_EX | LOCK_NB) != 0) {
        rc = lock_refused(s->path, s->lockfd, errno, SECOND_WRITER_ADVICE);
        close(s->lockfd);
        free_store(s);
        goto unlock;
    }
    lock_note_holder(s->lockfd);
    {
        /* Only the lock holder creates a pool: one under the temporary name
         * now is what a process killed while creating left (possibly
         * pool_size bytes). */
        char tmp[PATH_MAX], dm[PATH_MAX];
        snprintf(tmp, sizeof tmp, "%s/%s", s->path, POOL_TMP);
        snprintf(dm, sizeof dm, "%s/%s", s->path, DIRTY_FILE);
        if (state != 1) {
            /* Again under the lock: another process may have finished
             * creating it, or removing it, meanwhile. */
            state = inspect_dir(dir, foreign, sizeof foreign);
            if ((rc = dir_verdict(dir, state, foreign, flags & EMBKV_OPEN_CREATE)) != EMBKV_OK) {
                close(s->lockfd);
                free_store(s);
                goto unlock;
            }
        }
        /* (its dirty map first: one without an unfinished pool beside it
         * is a published pool's, inspect_dir) */
        if (state == 0 && unlink(dm) != 0 && errno != ENOENT) {
            rc = embkv__err(EMBKV_IO, "store %s: cannot remove the unfinished %s: %s", s->path, DIRTY_FILE,
                            strerror(errno));
            close(s->lockfd);
            free_store(s);
            goto unlock;
        }
        if (unlink(tmp) != 0 && errno != ENOENT) {
            rc = embkv__err(EMBKV_IO, "store %s: cannot remove the unfinished %s: %s", s->path, POOL_TMP,
                            strerror(errno));
            close(s->lockfd);
            free_store(s);
            goto unlock;
        }
    }
    rc = open_pool(s, opt, state == 1);
    /* The reader table once the pool is embkv's (a refused directory is
     * left as it was) and before load_store: the index's descriptor points
     * into it, and readers of the last writer are revoked before recovery
     * or the free list reuses anything (readers.c: R3). */
    if (rc == EMBKV_OK)
        rc = readers_attach_writer(s);
    if (rc == EMBKV_OK)
        rc = load_store(s, opt, flags);
    if (rc == EMBKV_OK && s->creating)
        rc = publish_pool(s);
    if (rc == EMBKV_OK)
        rc = tier_worker_start(s);
    if (rc == EMBKV_OK && opt && opt->migrate_rate)
        rc = migrate_start(s, opt->migrate_rate);
    if (rc != EMBKV_OK) {
        migrate_stop(s);
        tier_worker_stop(s);
        if (s->pop)
            pmemobj_close(s->pop);
        if (s->creating) {
            /* (the dirty map first: alone, it would be taken for the rest
             * of a published store, inspect_dir) */
            char tmp[PATH_MAX];
            snprintf(tmp, sizeof tmp, "%s/%s", s->path, DIRTY_FILE);
            unlink(tmp);
            snprintf(tmp, sizeof tmp, "%s/%s", s->path, POOL_TMP);
            unlink(tmp);
        }
        close(s->lockfd);
        free_store(s);
        goto unlock;
    }
    readers_writer_ready(s);
    s->no_close_sync = (flags & EMBKV_OPEN_NO_CLOSE_SYNC) != 0;
    s->next = registry;
    registry = s;
    *out = s;
unlock:
    pthread_mutex_unlock(&registry_mu);
    return rc;
}

static int close_ref(embkv_store *s, bool engine_ref);

int embkv_close(embkv_store *s)
{
    return close_ref(s, false);
}

int store_release(embkv_store *s)
{
    return close_ref(s, true);
}

static int close_ref(embkv_store *s, bool engine_ref)
{
    if (!s)
        return embkv__err(EMBKV_INVALID, "embkv_close: store is NULL");
    pthread_mutex_lock(&registry_mu);
    /* Refused, any reference: the last one's sync would be refused inside
     * the group (EMBKV_BUSY) after the store was gone, and the caller's
     * embkv_group_end would then touch freed memory.  One rule for every
     * reference, so that whether a close inside a group works does not
     * depend on what other threads hold.  (The engine's own references,
     * a backup's, are let go inside a group but for the last: a backup
     * finished in a group must not keep the store open for ever.) */
    if (group_held(s) && (!engine_ref || s->refs == 1)) {
        pthread_mutex_unlock(&registry_mu);
        return embkv__err(EMBKV_BUSY, "store %s: embkv_close inside a write group of this thread (embkv_group_begin "
                          "without embkv_group_end): nothing was closed; end the group first, then close", s->path);
    }
    /* The last reference, with sessions or snapshots open: refused, as
     * SQLite's sqlite3_close refuses with statements unfinalized (their
     * close reads the handle, which would be freed; a reference of their
     * own would move the close's sync to their close, where no one sees
     * its result).  A fork's child frees nothing: its close goes on. */
    unsigned nsess = atomic_load(&s->open_sessions), nsnap = atomic_load(&s->open_snaps);
    if (s->refs == 1 && (nsess || nsnap) && !handle_forked(s)) {
        pthread_mutex_unlock(&registry_mu);
        return embkv__err(EMBKV_BUSY, "store %s: embkv_close of its last reference while %u session%s and %u "
                          "snapshot%s of it are open: nothing was closed; close them first (embkv_session_close, "
                          "embkv_snapshot_close), then the store", s->path, nsess, nsess == 1 ? "" : "s", nsnap,
                          nsnap == 1 ? "" : "s");
    }
    if (--s->refs > 0) {
        pthread_mutex_unlock(&registry_mu);
        return EMBKV_OK;
    }
    for (embkv_store **p = &registry; *p; p = &(*p)->next) {
        if (*p == s) {
            *p = s->next;
            break;
        }
    }
    if (handle_forked(s)) {
        /* A forked child closing what it inherited (its connections are
         * garbage collected): the pool is mapped shared, so a sync or the
         * clean mark would write into the parent's live store.  Close the
         * lock descriptor (the flock stays with the parent's) and leave the
         * mapping to the child's exit. */
        close(s->lockfd);
        if (s->pool_fd >= 0)
            close(s->pool_fd);
        s->pool_fd = -1;
        pthread_mutex_unlock(&registry_mu);
        return EMBKV_OK;
    }
    if (s->reader) {
        free_store(s);
        pthread_mutex_unlock(&registry_mu);
        return EMBKV_OK;
    }
    /* Still under the registry lock: an open of this directory from another
     * thread must wait for the flock to go, not take it for another process.
     * The tier's threads first: nothing moves rows during the last sync. */
    evict_stop(s);
    migrate_stop(s);
    tier_worker_stop(s);
    la_close(s);
    /* (kept, with readers reading as of an older checkpoint: the next
     * writer's open removes them, readers.c R3) */
    if (!readers_active(s))
        sync_purge_deferred(s);
    /* Without the sync (EMBKV_OPEN_NO_CLOSE_SYNC) the store stays marked
     * open: the next open recovers it to the last sync, as after a crash
     * (P5). */
    gpu_close(s);  /* the device's reads of the pool completed */
    int rc = s->no_close_sync ? EMBKV_OK : embkv_sync(s);
    bool clean = rc == EMBKV_OK && !s->no_close_sync;
    if (clean) {
        uint64_t rows = atomic_load(&s->rows);
        s->root->closed_rows = rows;
        s->root->closed_rows_check = rows ^ ROWS_CHECK_KEY;
        pmemobj_persist(s->pop, &s->root->closed_rows, 2 * sizeof(uint64_t));
        s->root->clean = 1;
        pmemobj_persist(s->pop, &s->root->clean, sizeof s->root->clean);
    }
    pmemobj_close(s->pop);
    if (clean)
        seal_pool(s->path);
    close(s->lockfd);
    free_store(s);
    pthread_mutex_unlock(&registry_mu);
    return rc;
}

