/*
 * kernels_on_cpu.cc - ext/engine/gpu_kernels.cu itself, compiled by the
 * host compiler and run on the CPU, for the stand-in driver
 * (fakecuda.c): so that `make test` runs the kernels' own source, not a
 * model of it, on a machine without a GPU.
 *
 * What CUDA gives the source is supplied here: the launch's indices, the
 * rounding intrinsics (plain operations, built with -ffp-contract=off so
 * that none is fused), atomicMin, and host conversions of half floats
 * (host/cuda_fp16.h).  The kernels' one hard part is the warp: lanes
 * exchange values (__shfl_sync) and vote (__all_sync), which a lane run
 * after another cannot do.  So a warp is replayed:
 *
 *   - its 32 lanes run one after another; a collective returns the
 *     result the previous pass settled, or else a guess from the lanes
 *     that already ran in this pass (a shuffle from an earlier lane is
 *     then exact, a vote is the AND so far);
 *   - after the pass, every collective's result is recomputed from all
 *     32 lanes' inputs; if a lane was given anything else, the results up
 *     to the first such collective are settled and the warp runs again;
 *   - the pass in which every lane was given the true results is an
 *     execution of the warp in lock step.  Its atomics are applied then
 *     (those of earlier passes are dropped); its plain stores overwrite
 *     the earlier passes' stores, which holds for these kernels, where
 *     every row's output is written whatever path the row takes.
 *
 * What it checks of the source (reported through fakecuda_complain):
 * every lane of a warp reaches the same full-mask collectives (CUDA's
 * rule; a lane that returned early while others vote is undefined on a
 * GPU), masks are full, and no collective is called outside a warp.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

extern "C" void fakecuda_complain(const char *what);

#define __global__
#define __device__

struct emu_dim3 {
    unsigned x, y, z;
};
static thread_local emu_dim3 blockIdx, threadIdx, blockDim;

/* (-ffp-contract=off: each rounded on its own, as the _rn intrinsics) */
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __uint_as_float(unsigned u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* ------------------------------------------------------------ the warp */

enum { LANES = 32, MAXC = 8, MAXPASS = 2 * MAXC + 2, MAXATOMIC = 64 };
enum { SHFL = 1, VOTE_ALL = 2 };

struct warp_pass {
    bool active;               /* a warp is being replayed on this thread */
    unsigned lane;
    unsigned count[LANES];     /* collectives each lane reached in this pass */
    unsigned kind[MAXC][LANES];
    uint64_t in[MAXC][LANES];  /* each lane's operand */
    int src[MAXC][LANES];
    uint64_t got[MAXC][LANES]; /* what each lane was given */
    unsigned nsettled;         /* collectives whose operands the last pass settled */
    uint64_t settled[MAXC][LANES];
    unsigned natomic;          /* atomicMin calls of this pass, applied at its end if it stands */
    struct {
        unsigned *a;
        unsigned v;
    } atomic[MAXATOMIC];
    bool broken;               /* complained: the warp's results are not to be trusted */
};
static thread_local warp_pass W;

static uint64_t result_of(unsigned kind, const uint64_t *in, int src)
{
    if (kind == SHFL)
        return in[src & (LANES - 1)];
    for (unsigned l = 0; l < LANES; l++)
        if (!in[l])
            return 0;
    return 1;
}

static uint64_t collective(unsigned kind, unsigned mask, uint64_t v, int src)
{
    if (!W.active) {
        if (!W.broken)
            fakecuda_complain("a warp collective outside a warp's replay (a kernel without its launch)");
        W.broken = true;
        return v;
    }
    if (mask != 0xffffffffu && !W.broken) {
        fakecuda_complain("a warp collective with a mask that is not every lane: the kernels assume full warps");
        W.broken = true;
    }
    unsigned l = W.lane, c = W.count[l]++;
    if (c >= MAXC) {
        if (!W.broken)
            fakecuda_complain("more warp collectives in a kernel than the replay keeps");
        W.broken = true;
        return v;
    }
    W.kind[c][l] = kind;
    W.in[c][l] = v;
    W.src[c][l] = src;
    uint64_t r;
    if (c < W.nsettled) {
        r = result_of(kind, W.settled[c], src);
    } else {
        /* A guess from the lanes run so far: exact for a shuffle from an
         * earlier lane; the AND so far for a vote. */
        unsigned s = (unsigned)src & (LANES - 1);
        if (kind == SHFL)
            r = s < l && W.count[s] > c ? W.in[c][s] : v;
        else
            r = (l == 0 || (W.count[l - 1] > c && W.got[c][l - 1])) && v;
    }
    W.got[c][l] = r;
    return r;
}

template <class T> static T __shfl_sync(unsigned mask, T v, int src, int width = LANES)
{
    (void)width;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = collective(SHFL, mask, bits, src);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}

static inline int __all_sync(unsigned mask, int pred) { return (int)collective(VOTE_ALL, mask, pred != 0, 0); }

static unsigned atomic_min_now(unsigned *a, unsigned v)
{
    unsigned old = __atomic_load_n(a, __ATOMIC_RELAXED);
    while (v < old && !__atomic_compare_exchange_n(a, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return old;
}

static inline unsigned atomicMin(unsigned *a, unsigned v)
{
    if (!W.active)
        return atomic_min_now(a, v);
    if (W.natomic == MAXATOMIC) {
        if (!W.broken)
            fakecuda_complain("more atomics in a warp than the replay keeps");
        W.broken = true;
        return atomic_min_now(a, v);
    }
    W.atomic[W.natomic].a = a;
    W.atomic[W.natomic++].v = v;
    return __atomic_load_n(a, __ATOMIC_RELAXED);  /* (the kernels do not use the old value) */
}

#include "../../ext/engine/gpu_kernels.cu"

/* The first collective at which the pass was not a lock-step execution,
 * or -1 if it was one.  A lane that reached fewer collectives than
 * another, with everything before agreeing, is divergence. */
static int pass_check(void)
{
    unsigned most = 0;
    for (unsigned l = 0; l < LANES; l++)
        most = W.count[l] > most ? W.count[l] : most;
    for (unsigned c = 0; c < most && c < MAXC; c++) {
        for (unsigned l = 0; l < LANES; l++)
            if (W.count[l] <= c || W.kind[c][l] != W.kind[c][0]) {
                if (!W.broken)
                    fakecuda_complain("lanes of a warp took different paths at a full-mask collective (some "
                                      "returned or skipped it): undefined on a GPU");
                W.broken = true;
                return -1;
            }
        unsigned kind = W.kind[c][0];
        uint64_t all = kind == VOTE_ALL ? result_of(kind, W.in[c], 0) : 0;
        for (unsigned l = 0; l < LANES; l++)
            if (W.got[c][l] != (kind == VOTE_ALL ? all : result_of(kind, W.in[c], W.src[c][l])))
                return (int)c;
    }
    return -1;
}

/* One warp of a launch, replayed until a pass is a lock-step execution. */
template <class F> static void run_warp(unsigned block, unsigned warp, F kernel)
{
    W.active = true;
    W.broken = false;
    W.nsettled = 0;
    for (unsigned pass = 0;; pass++) {
        memset(W.count, 0, sizeof W.count);
        W.natomic = 0;
        for (unsigned l = 0; l < LANES; l++) {
            W.lane = l;
            blockIdx.x = block;
            threadIdx.x = warp * LANES + l;
            kernel();
        }
        int c = pass_check();
        if (c < 0 || W.broken)
            break;
        if (pass + 1 == MAXPASS) {
            fakecuda_complain("a warp's replay did not settle (the memory it reads changed under it?)");
            W.broken = true;
            break;
        }
        for (int k = 0; k <= c; k++)
            memcpy(W.settled[k], W.in[k], sizeof W.settled[k]);
        W.nsettled = (unsigned)c + 1;
    }
    for (unsigned k = 0; k < W.natomic; k++)
        atomic_min_now(W.atomic[k].a, W.atomic[k].v);
    W.active = false;
}

extern "C" void fakecuda_run_gather(unsigned blocks, unsigned threads, uint64_t desc, uint64_t ids, uint64_t out,
                                    uint64_t bad, uint32_t n, uint32_t dim)
{
    blockDim.x = threads;
    blockDim.y = blockDim.z = 1;
    for (unsigned b = 0; b < blocks; b++)
        for (unsigned w = 0; w < threads / LANES; w++)
            run_warp(b, w, [&] {
                embkv_gather((const unsigned long long *)desc, (const long long *)ids, (float *)out,
                             (unsigned *)bad, n, dim);
            });
}

extern "C" void fakecuda_run_grad_sum(unsigned blocks, unsigned threads, const uint64_t p[6], uint32_t nu,
                                      uint32_t dim)
{
    blockDim.x = threads;
    blockDim.y = blockDim.z = 1;
    for (unsigned b = 0; b < blocks; b++)
        for (unsigned w = 0; w < threads / LANES; w++)
            run_warp(b, w, [&] {
                embkv_grad_sum((const float *)p[0], (const unsigned *)p[1], (const unsigned *)p[2],
                               (const unsigned *)p[3], (float *)p[4], (double *)p[5], nu, dim);
            });
}
