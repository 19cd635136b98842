/*
 * gpu_kernels.cu - the device code: the gather of a batch's rows into a
 * device buffer, and the per-id sum of a push's gradients.  Compiled by
 * nvcc into a fat binary the engine embeds (gpudrv.c loads it through
 * the driver API); nothing here is linked into the host code.
 *
 * Equal to the CPU, bit for bit.  Every row is decoded as dtype.c
 * decodes it: each operation rounded on its own (the __f*_rn and __d*_rn
 * intrinsics: nvcc would otherwise fuse a multiply and an add, which the
 * CPU build does not), the i8 rows whose range float32 cannot hold in
 * double, clamped.  A gradient sum adds in the batch's order from 0.0,
 * in double, as train.c's push_grads_make does.
 *
 * Reads.  One warp a row: its 32 lanes read 32 consecutive elements, so
 * the row's bytes go over the link in whole 128-byte requests, whether
 * the row is in registered host memory (a record in the pool's mapping)
 * or in the pinned staging buffer.  A record's header, 32 bytes before
 * its vector, must name the id the CPU resolved (GPU_ROW_RECORD); a row
 * that fails that or its dtype's check is written as zeros and its index
 * reported in *bad (the least such), which the host reads once the
 * gather's event completes.
 */
#include <cuda_fp16.h>
#include <float.h>
#include <stdint.h>

#define GPU_ROW_F32 0u
#define GPU_ROW_F16 1u
#define GPU_ROW_BF16 2u
#define GPU_ROW_I8 3u
#define GPU_ROW_KIND 3u
#define GPU_ROW_RECORD 4u
#define GPU_ROW_FLAGS 7ull

__device__ static float i8_value(float bias, float scale, uint8_t q, bool fast)
{
    if (fast)
        return __fadd_rn(bias, __fmul_rn((float)q, scale));
    double x = __dadd_rn((double)bias, __dmul_rn((double)q, (double)scale));
    return x > FLT_MAX ? FLT_MAX : x < -FLT_MAX ? -FLT_MAX : (float)x;
}

extern "C" __global__ void embkv_gather(const unsigned long long *desc, const long long *ids, float *out,
                                        unsigned *bad, unsigned n, unsigned dim)
{
    unsigned long long row = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    unsigned lane = threadIdx.x & 31;
    if (row >= n)
        return;
    unsigned long long d = desc[row];
    float *o = out + row * dim;
    const char *src = (const char *)(uintptr_t)(d & ~GPU_ROW_FLAGS);
    unsigned kind = (unsigned)d & GPU_ROW_KIND;
    bool ok = src != NULL;
    /* The header read once, by lane 0, for the whole warp: ok stays one
     * value across it (the f32 path returns on it, and __all_sync below
     * needs every lane), even if the record were rewritten meanwhile. */
    if (ok && (d & GPU_ROW_RECORD)) {
        long long h = lane == 0 ? *(const long long *)(src - 32) : 0;
        ok = __shfl_sync(0xffffffffu, h, 0) == ids[row];
    }
    if (ok && kind == GPU_ROW_F32) {
        const float *v = (const float *)src;
        for (unsigned j = lane; j < dim; j += 32)
            o[j] = v[j];
        return;
    }
    if (ok && kind == GPU_ROW_F16) {
        const unsigned short *v = (const unsigned short *)src;
        for (unsigned j = lane; j < dim; j += 32) {
            unsigned short b = v[j];
            if ((b & 0x7c00) == 0x7c00)
                ok = false;
            o[j] = __half2float(__ushort_as_half(b));
        }
    } else if (ok && kind == GPU_ROW_BF16) {
        const unsigned short *v = (const unsigned short *)src;
        for (unsigned j = lane; j < dim; j += 32) {
            unsigned short b = v[j];
            if ((b & 0x7f80) == 0x7f80)
                ok = false;
            o[j] = __uint_as_float((unsigned)b << 16);
        }
    } else if (ok && kind == GPU_ROW_I8) {
        float scale = ((const float *)src)[0], bias = ((const float *)src)[1];
        if (!(scale >= 0) || !isfinite(scale) || !isfinite(bias)) {
            ok = false;
        } else {
            bool fast = __dadd_rn(fabs((double)bias), __dmul_rn(256.0, (double)scale)) < (double)FLT_MAX / 2;
            const uint8_t *q = (const uint8_t *)src + 8;
            for (unsigned j = lane; j < dim; j += 32)
                o[j] = i8_value(bias, scale, q[j], fast);
        }
    }
    /* Any lane's failure fails the row. */
    ok = __all_sync(0xffffffffu, ok);
    if (!ok) {
        for (unsigned j = lane; j < dim; j += 32)
            o[j] = 0.0f;
        if (lane == 0 && src != NULL)
            atomicMin(bad, (unsigned)row);
    }
}

extern "C" __global__ void embkv_grad_sum(const float *g, const unsigned *occ, const unsigned *start,
                                          const unsigned *slot, float *once, double *sums, unsigned nu, unsigned dim)
{
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (unsigned long long)nu * dim)
        return;
    unsigned u = (unsigned)(t / dim), j = (unsigned)(t % dim);
    unsigned a = start[u], b = start[u + 1];
    if (b - a == 1) {
        once[(unsigned long long)slot[u] * dim + j] = g[(unsigned long long)occ[a] * dim + j];
        return;
    }
    double s = __dadd_rn(0.0, (double)g[(unsigned long long)occ[a] * dim + j]);
    for (unsigned k = a + 1; k < b; k++)
        s = __dadd_rn(s, (double)g[(unsigned long long)occ[k] * dim + j]);
    sums[(unsigned long long)slot[u] * dim + j] = s;
}
