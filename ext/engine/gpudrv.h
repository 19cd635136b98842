/*
 * gpudrv.h - layer 0: the GPU as the engine sees it, a table of the few
 * things it asks of a CUDA driver (gpudrv.c).
 *
 * Why a table of functions.  The driver is loaded at first use (dlopen of
 * libcuda.so.1), so that the library and the extension load and work on a
 * machine with no GPU and no driver; and a test can put its own table in
 * its place (gpu_backend_set), whose "device" is host memory and whose
 * completions it decides, to test what the engine does around a gather
 * (gather.c: the rows it protects, the staging) on a machine without one.
 *
 * Addresses are the device's (uint64_t): host memory registered or
 * allocated through the table has one too (host_register, host_alloc).
 * Knows no store.
 */
#ifndef EMBKV_GPUDRV_H
#define EMBKV_GPUDRV_H

#include "base.h"

/* A row descriptor of a gather: the device address of the row's first
 * element, or of its record's vector, with the kind in the low bits (the
 * rows are 16-byte aligned, records' vectors 32). */
#define GPU_ROW_F32 0u    /* float32 elements */
#define GPU_ROW_F16 1u
#define GPU_ROW_BF16 2u
#define GPU_ROW_I8 3u     /* float scale, float bias, dim bytes */
#define GPU_ROW_KIND 3u
#define GPU_ROW_RECORD 4u /* a record's vector: its header (32 bytes before) holds the id to check */
#define GPU_ROW_FLAGS 7ull

/* What a gather launch reads and writes: n rows of dim elements. */
typedef struct gpu_gather_args {
    uint64_t desc;  /* n row descriptors (uint64_t); 0: a row of zeros */
    uint64_t ids;   /* n ids (int64_t): a record's header must name its own */
    uint64_t out;   /* n x dim float32 */
    uint64_t bad;   /* one uint32_t, UINT32_MAX before: the least row that failed its check */
    uint32_t n, dim;
} gpu_gather_args;

/* What a gradient sum reads and writes: per distinct id u (nu of them) the
 * rows occ[start[u]] .. occ[start[u+1]-1] of grads (n x dim float32) are
 * summed in that order, from 0.0 + the first, in double, into row slot[u]
 * of sums; a u with one row copies it, as float32, to row slot[u] of once
 * (the engine's push sums exactly so: train.c, push_grads_make). */
typedef struct gpu_sum_args {
    uint64_t grads, occ, start, slot, once, sums;
    uint32_t nu, dim;
} gpu_sum_args;

typedef struct gpu_backend {
    /* EMBKV_OK when a device is usable; else EMBKV_NODEVICE with why. */
    int (*open)(char *why, size_t cap);
    /* Makes current the context that owns device address p (for the calls
     * that follow on this thread, until leave). */
    int (*enter)(uint64_t p, char *why, size_t cap);
    void (*leave)(void);
    int (*host_register)(void *p, size_t n, uint64_t *dev, char *why, size_t cap);
    void (*host_unregister)(void *p);
    /* Pinned host memory the device reads and writes (mapped). */
    int (*host_alloc)(size_t n, void **p, uint64_t *dev, char *why, size_t cap);
    void (*host_free)(void *p);
    /* Launches on stream (0: the default stream), returns once enqueued. */
    int (*gather)(void *stream, const gpu_gather_args *a, char *why, size_t cap);
    int (*grad_sum)(void *stream, const gpu_sum_args *a, char *why, size_t cap);
    /* An event recorded on stream after the work enqueued so far. */
    int (*event_record)(void *stream, void **ev, char *why, size_t cap);
    int (*event_done)(void *ev);  /* 1 done, 0 not yet, -1 failed */
    int (*event_wait)(void *ev);  /* 0 done, -1 failed */
    void (*event_free)(void *ev);
    /* Everything enqueued on stream so far done (when an event could not
     * be recorded): 0, or -1 failed. */
    int (*stream_wait)(void *stream);
} gpu_backend;

/* The backend in use (the driver's, once it opened), or NULL with the
 * reason in why: not built with CUDA, no driver, no device. */
const gpu_backend *gpu_backend_get(char *why, size_t cap);
/* A test's table instead of the driver's (NULL: the driver's again). */
void gpu_backend_set(const gpu_backend *b);
/* Whether the CUDA part was compiled in. */
bool gpu_compiled(void);

#endif
