/*
 * fakecuda.c - a stand-in libcuda.so.1 for machines without a GPU, so that
 * the driver path of ext/engine/gpudrv.c (dlopen, the versioned symbols,
 * contexts, registration, launches and their parameters, events) and the
 * GPU tests themselves (tests/gpu/test_gpu_real.c, and the SQL functions
 * from Python) run in `make test`.
 *
 * "Device memory" is host memory (cuMemAlloc is malloc, a registered or
 * pinned host range is its own device address), and a launch runs
 * ext/engine/gpu_kernels.cu's own kernels on the CPU, compiled by the host
 * compiler (kernels_on_cpu.cc, which replays each warp in lock step and
 * checks the warps' collectives).  What it checks of its callers: the fat
 * binary handed to cuModuleLoadData is one (its magic), launches cover every row with the
 * block size the kernels assume, calls that need a context have one
 * current, and every event and pinned block is freed (counted; reported
 * at exit when FAKECUDA_REPORT is set).  With FAKECUDA_ASYNC_US=N the
 * launches run later, in order, on a "device" thread, each after a random
 * 0 to N microseconds, so that the caller's events, waits and protection
 * of the rows a launch reads meet real asynchrony; otherwise a launch runs
 * at once.  Timing says nothing of a GPU's.
 */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int the_context;                  /* the one context there is */
static _Thread_local int depth;          /* contexts pushed on this thread */
static _Thread_local int set_current;    /* cuCtxSetCurrent was called here */
static atomic_long events, pinned, allocs, launches, bad_calls;

static void device_drain(void);

static void complain(const char *what)
{
    atomic_fetch_add(&bad_calls, 1);
    fprintf(stderr, "fakecuda: %s\n", what);
}

void fakecuda_complain(const char *what) { complain(what); }

static int current(void) { return depth > 0 || set_current; }

/* At exit: what is left, and a failing status if a call was wrong. */
__attribute__((destructor)) static void report(void)
{
    device_drain();
    if (getenv("FAKECUDA_REPORT"))
        fprintf(stderr, "fakecuda: %ld launches; left: %ld events, %ld pinned blocks, %ld allocations; %ld bad calls\n",
                atomic_load(&launches), atomic_load(&events), atomic_load(&pinned), atomic_load(&allocs),
                atomic_load(&bad_calls));
    if (atomic_load(&bad_calls))
        _exit(86);
}

CUresult cuInit(unsigned flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }
CUresult cuDriverGetVersion(int *v) { *v = CUDA_VERSION; return CUDA_SUCCESS; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return CUDA_SUCCESS; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { *d = ordinal; return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == CUDA_ERROR_INVALID_VALUE ? "invalid argument (fakecuda)" : "an error (fakecuda)";
    return CUDA_SUCCESS;
}

/* Addresses below 64 KiB are nobody's: as a driver says of a pointer it
 * does not know. */
CUresult cuPointerGetAttribute(void *data, CUpointer_attribute a, CUdeviceptr p)
{
    if (p < 65536)
        return CUDA_ERROR_INVALID_VALUE;
    if (a == CU_POINTER_ATTRIBUTE_CONTEXT) {
        *(CUcontext *)data = (CUcontext)&the_context;
        return CUDA_SUCCESS;
    }
    if (a == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
        *(int *)data = 0;
        return CUDA_SUCCESS;
    }
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    *c = (CUcontext)&the_context;
    return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
CUresult cuCtxSetCurrent(CUcontext c) { set_current = c != NULL; return CUDA_SUCCESS; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current() ? (CUcontext)&the_context : NULL; return CUDA_SUCCESS; }
CUresult cuCtxPushCurrent(CUcontext c)
{
    if (c != (CUcontext)&the_context)
        return CUDA_ERROR_INVALID_CONTEXT;
    depth++;
    return CUDA_SUCCESS;
}
CUresult cuCtxPopCurrent(CUcontext *c)
{
    if (depth == 0) {
        complain("cuCtxPopCurrent without a push");
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    depth--;
    if (c)
        *c = (CUcontext)&the_context;
    return CUDA_SUCCESS;
}

enum { GATHER = 1, SUM = 2 };
CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    uint32_t magic;
    memcpy(&magic, image, 4);
    if (magic != 0xBA55ED50u) {  /* a fat binary's header */
        complain("cuModuleLoadData: not a fat binary");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    if (!current())
        complain("cuModuleLoadData without a current context");
    *m = (CUmodule)&the_context;
    return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    (void)m;
    if (strcmp(name, "embkv_gather") == 0)
        *f = (CUfunction)(uintptr_t)GATHER;
    else if (strcmp(name, "embkv_grad_sum") == 0)
        *f = (CUfunction)(uintptr_t)SUM;
    else
        return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

/* FAKECUDA_NO_READONLY: a device without read-only registration (the
 * flag is then an API error, as compute-sanitizer reports it). */
CUresult cuCtxGetDevice(CUdevice *d)
{
    if (!current())
        complain("cuCtxGetDevice with no context current");
    *d = 0;
    return current() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    if (d != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *v = a == CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED ? !getenv("FAKECUDA_NO_READONLY") : 0;
    return CUDA_SUCCESS;
}

CUresult cuMemHostRegister(void *p, size_t n, unsigned flags)
{
    (void)p, (void)n;
    if (!(flags & CU_MEMHOSTREGISTER_DEVICEMAP))
        complain("cuMemHostRegister without DEVICEMAP: the kernels could not reach it");
    if ((flags & CU_MEMHOSTREGISTER_READ_ONLY) && getenv("FAKECUDA_NO_READONLY")) {
        complain("cuMemHostRegister with READ_ONLY on a device without it (an API error)");
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    if (getenv("FAKECUDA_NO_REGISTER"))
        return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}
CUresult cuMemHostUnregister(void *p) { (void)p; return CUDA_SUCCESS; }
CUresult cuMemHostGetDevicePointer(CUdeviceptr *d, void *p, unsigned flags)
{
    if (!current())
        complain("cuMemHostGetDevicePointer without a current context");
    *d = (CUdeviceptr)(uintptr_t)p;
    return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemHostAlloc(void **p, size_t n, unsigned flags)
{
    (void)flags;
    *p = aligned_alloc(4096, (n + 4095) & ~(size_t)4095);
    if (!*p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    atomic_fetch_add(&pinned, 1);
    return CUDA_SUCCESS;
}
CUresult cuMemFreeHost(void *p)
{
    device_drain();
    free(p);
    atomic_fetch_sub(&pinned, 1);
    return CUDA_SUCCESS;
}
CUresult cuMemAlloc(CUdeviceptr *d, size_t n)
{
    void *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    atomic_fetch_add(&allocs, 1);
    *d = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}
CUresult cuMemFree(CUdeviceptr d)
{
    device_drain();
    free((void *)(uintptr_t)d);
    atomic_fetch_sub(&allocs, 1);
    return CUDA_SUCCESS;
}
/* (copies and sets wait for the launches before them: stream order) */
CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s)
{
    (void)s;
    device_drain();
    memset((void *)(uintptr_t)d, v, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
    device_drain();
    memcpy(dst, (void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    (void)s;
    device_drain();
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}
CUresult cuStreamCreate(CUstream *s, unsigned flags) { (void)flags; *s = (CUstream)&the_context; return CUDA_SUCCESS; }
CUresult cuStreamSynchronize(CUstream s)
{
    (void)s;
    device_drain();
    return CUDA_SUCCESS;
}

/* The kernels themselves, compiled for the CPU (kernels_on_cpu.cc). */
void fakecuda_run_gather(unsigned blocks, unsigned threads, uint64_t desc, uint64_t ids, uint64_t out, uint64_t bad,
                         uint32_t n, uint32_t dim);
void fakecuda_run_grad_sum(unsigned blocks, unsigned threads, const uint64_t p[6], uint32_t nu, uint32_t dim);

/* ---- the device's queue (FAKECUDA_ASYNC_US) */

typedef struct launch {
    CUfunction f;
    unsigned blocks;
    uint64_t ptr[6];  /* the kernel's pointer parameters, as given */
    uint32_t n, dim;
} launch;
#define QUEUE 1024
static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dev_work = PTHREAD_COND_INITIALIZER, dev_ran = PTHREAD_COND_INITIALIZER;
static launch queue[QUEUE];
static uint64_t queued, ran;  /* launches queued, launches run (the next one's number) */
static int async_us = -1;     /* FAKECUDA_ASYNC_US; 0: at once */
static pthread_once_t async_once = PTHREAD_ONCE_INIT;

static void run_launch(const launch *l)
{
    if (l->f == (CUfunction)(uintptr_t)GATHER)
        fakecuda_run_gather(l->blocks, 256, l->ptr[0], l->ptr[1], l->ptr[2], l->ptr[3], l->n, l->dim);
    else
        fakecuda_run_grad_sum(l->blocks, 256, l->ptr, l->n, l->dim);
}

static void *device_main(void *arg)
{
    (void)arg;
    unsigned seed = 7;
    pthread_mutex_lock(&dev_mu);
    for (;;) {
        while (ran == queued)
            pthread_cond_wait(&dev_work, &dev_mu);
        launch l = queue[ran % QUEUE];
        pthread_mutex_unlock(&dev_mu);
        usleep((useconds_t)(rand_r(&seed) % (unsigned)(async_us + 1)));
        run_launch(&l);
        pthread_mutex_lock(&dev_mu);
        ran++;
        pthread_cond_broadcast(&dev_ran);
    }
    return NULL;
}

static void async_start(void)
{
    const char *e = getenv("FAKECUDA_ASYNC_US");
    async_us = e ? atoi(e) : 0;
    pthread_t t;
    if (async_us > 0 && pthread_create(&t, NULL, device_main, NULL) != 0)
        async_us = 0;
}

/* The number the next launch will have: an event recorded now completes
 * once every launch before it has run. */
static uint64_t device_now(void)
{
    pthread_mutex_lock(&dev_mu);
    uint64_t q = queued;
    pthread_mutex_unlock(&dev_mu);
    return q;
}

static void device_wait(uint64_t upto)
{
    pthread_mutex_lock(&dev_mu);
    while (ran < upto)
        pthread_cond_wait(&dev_ran, &dev_mu);
    pthread_mutex_unlock(&dev_mu);
}

static void device_drain(void) { device_wait(device_now()); }

static void device_launch(const launch *l)
{
    pthread_once(&async_once, async_start);
    if (async_us <= 0) {
        run_launch(l);
        return;
    }
    pthread_mutex_lock(&dev_mu);
    while (queued - ran == QUEUE)
        pthread_cond_wait(&dev_ran, &dev_mu);
    queue[queued++ % QUEUE] = *l;
    pthread_cond_signal(&dev_work);
    pthread_mutex_unlock(&dev_mu);
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shared, CUstream s, void **p, void **extra)
{
    (void)s;
    if (!current())
        complain("cuLaunchKernel without a current context");
    if (gy != 1 || gz != 1 || by != 1 || bz != 1 || shared != 0 || extra != NULL || bx != 256) {
        complain("cuLaunchKernel: not the 1-D launch of 256 threads the kernels assume");
        return CUDA_ERROR_INVALID_VALUE;
    }
    atomic_fetch_add(&launches, 1);
    if (f == (CUfunction)(uintptr_t)GATHER) {
        uint32_t n = *(uint32_t *)p[4], dim = *(uint32_t *)p[5];
        if ((uint64_t)gx * bx / 32 < n)
            complain("gather launch: fewer warps than rows");
        launch l = {f, gx, {*(uint64_t *)p[0], *(uint64_t *)p[1], *(uint64_t *)p[2], *(uint64_t *)p[3]}, n, dim};
        device_launch(&l);
    } else if (f == (CUfunction)(uintptr_t)SUM) {
        uint32_t nu = *(uint32_t *)p[6], dim = *(uint32_t *)p[7];
        if ((uint64_t)gx * bx < (uint64_t)nu * dim)
            complain("sum launch: fewer threads than elements");
        launch l = {f, gx,
                    {*(uint64_t *)p[0], *(uint64_t *)p[1], *(uint64_t *)p[2], *(uint64_t *)p[3], *(uint64_t *)p[4],
                     *(uint64_t *)p[5]},
                    nu, dim};
        device_launch(&l);
    } else {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *e, unsigned flags)
{
    if (!current())
        complain("cuEventCreate without a current context");
    *e = (CUevent)calloc(1, sizeof(uint64_t));  /* the launch it waits for */
    atomic_fetch_add(&events, 1);
    (void)flags;
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuEventRecord(CUevent e, CUstream s)
{
    (void)s;
    *(uint64_t *)e = device_now();
    return CUDA_SUCCESS;
}
CUresult cuEventQuery(CUevent e)
{
    if (!current())
        complain("cuEventQuery without a current context");
    pthread_mutex_lock(&dev_mu);
    int done = ran >= *(uint64_t *)e;
    pthread_mutex_unlock(&dev_mu);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult cuEventSynchronize(CUevent e)
{
    if (!current())
        complain("cuEventSynchronize without a current context");
    device_wait(*(uint64_t *)e);
    return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent e)
{
    if (!current())
        complain("cuEventDestroy without a current context");
    free(e);
    atomic_fetch_sub(&events, 1);
    return CUDA_SUCCESS;
}
