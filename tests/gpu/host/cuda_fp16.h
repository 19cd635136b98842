/*
 * cuda_fp16.h - the part of CUDA's half-precision header that
 * ext/engine/gpu_kernels.cu uses, for host code: the kernels compiled by
 * the host compiler (tests/gpu/kernels_on_cpu.cc) include this in place
 * of the toolkit's, whose conversions are device functions.
 *
 * The conversion is IEEE binary16 to binary32, exact for every input
 * (subnormals scaled, infinities and NaNs kept, a NaN's payload moved to
 * the top of the float's), as the device's cvt.f32.f16 gives it.
 */
#ifndef EMBKV_TEST_CUDA_FP16_H
#define EMBKV_TEST_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

struct __half {
    unsigned short x;
};

static inline __half __ushort_as_half(unsigned short b)
{
    __half h;
    h.x = b;
    return h;
}

static inline float __half2float(__half h)
{
    uint32_t sign = (uint32_t)(h.x & 0x8000) << 16, e = (h.x >> 10) & 0x1f, m = h.x & 0x3ff, u;
    float f;
    if (e == 0) {
        f = (float)m * 0x1p-24f;
        return sign ? -f : f;
    }
    u = e == 0x1f ? sign | 0x7f800000u | (m << 13) : sign | ((e + 112) << 23) | (m << 13);
    memcpy(&f, &u, 4);
    return f;
}

#endif
