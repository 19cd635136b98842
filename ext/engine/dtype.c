/*
 * dtype.c - the element types a row's vector may be stored in (dtype),
 * and the conversions between them and float32.
 *
 * A record keeps its vector encoded (format.h: dtype_vec_bytes) and its
 * optimizer state in float32; every read decodes to float32, every write
 * encodes from it.  Why here, at the bottom: the codec knows no store,
 * and the layers above (the record space, the cache, the reads, the
 * writes, the search) each meet encoded records.
 *
 *   f16   IEEE binary16: 11 significant bits, up to 65504.
 *   bf16  the top half of a float32: 8 significant bits, float32's range.
 *   i8    a float32 scale and bias, then one byte a element: x = bias +
 *         q * scale, q in 0..255, bias the row's least element and scale
 *         its range over 255 (FBGEMM's row-wise 8-bit form).
 *
 * Round to nearest (ties to even), or stochastically: up with probability
 * the distance to the value below over the step, from 32 random bits an
 * element that are a function of a 64-bit seed (so that the same update
 * rounds the same way, and each element draws its own): unbiased, as
 * FBGEMM's stochastic rounding for fp16.  A value outside a type's range
 * is not encoded (dtype_encode says which): a table never holds Inf.
 *
 * i8 is made to re-encode its own output exactly (a backup, and an
 * export imported into an i8 table, encode decoded rows again): a row
 * whose values already lie on the grid of some (scale, bias) near the one
 * computed from them is encoded on that grid, so that decode(encode(v))
 * is v for every v that decode gave.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "base.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(__SANITIZE_THREAD__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DTYPE_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
#endif
#ifndef DTYPE_CLONES
#define DTYPE_CLONES
#endif
#if defined(__GNUC__) && !defined(__clang__) && defined(__FLT16_MAX__)
#define HAVE_F16 1  /* _Float16: the conversions vectorize (F16C) */
#endif

float dtype_max(int dtype)
{
    switch (dtype) {
    case EMBKV_F16: return 65504.0f;
    case EMBKV_BF16: return 0x1.fep127f;  /* the largest bf16 */
    default: return FLT_MAX;
    }
}

const char *dtype_name(int dtype)
{
    switch (dtype) {
    case EMBKV_F16: return "f16";
    case EMBKV_BF16: return "bf16";
    case EMBKV_I8: return "i8";
    default: return "f32";
    }
}

static inline uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* binary16 in integer arithmetic, for compilers without _Float16 (clang
 * before 15 on x86, which builds the fuzz targets): the same bits as the
 * hardware's conversions (round to nearest even; checked against them for
 * every float32). */
static uint16_t soft_f2h(float f)
{
    uint32_t x = f2u(f), sign = (x >> 16) & 0x8000, ax = x & 0x7fffffff;
    if (ax >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000 ? 0x200 : 0));
    if (ax >= 0x477ff000) return (uint16_t)(sign | 0x7c00);
    if (ax < 0x38800000) {
        if (ax < 0x33000000) return (uint16_t)sign;
        uint32_t m = (ax & 0x7fffff) | 0x800000, shift = 126 - (ax >> 23);
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t h = (ax >> 13) - (112u << 10), rem = ax & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}
static float soft_h2f(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return u2f(sign | 0x7f800000 | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    return u2f(sign | ((e + 112) << 23) | (m << 13));
}

/* 32 random bits for element j of a write seeded with seed. */
static inline uint32_t rnd32(uint64_t seed, uint32_t j)
{
    uint64_t x = seed ^ ((uint64_t)j * 0x9e3779b97f4a7c15ull);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint32_t)x;
}

/* ------------------------------------------------------------- decode */

/* (f16 and bf16: an element whose exponent bits are all ones, Inf or NaN,
 * is none a write leaves: a damaged record) */
DTYPE_CLONES static bool f16_decode(uint32_t dim, const void *src, float *dst)
{
    /* two passes over the row's bytes, each one vector loop (a kNN pass
     * decodes every row) */
    const uint16_t *bits = src;
    uint16_t bad = 0;
    for (uint32_t j = 0; j < dim; j++)
        bad |= (uint16_t)((bits[j] & 0x7c00) == 0x7c00);
#ifdef HAVE_F16
    const _Float16 *h = src;
    for (uint32_t j = 0; j < dim; j++)
        dst[j] = (float)h[j];
#else
    for (uint32_t j = 0; j < dim; j++)
        dst[j] = soft_h2f(bits[j]);
#endif
    return !bad;
}

static bool bf16_decode(uint32_t dim, const uint16_t *src, float *dst)
{
    uint16_t bad = 0;
    for (uint32_t j = 0; j < dim; j++) {
        bad |= (uint16_t)((src[j] & 0x7f80) == 0x7f80);
        dst[j] = u2f((uint32_t)src[j] << 16);
    }
    return !bad;
}

/* A row whose levels float32 arithmetic reaches without overflow (all but
 * ranges near float32's own) decodes as bias + q * scale in float (each
 * operation rounded, nothing contracted: every clone the same); the
 * others in double, clamped. */
static inline bool i8_float_safe(float bias, float scale)
{
    return fabs((double)bias) + 256.0 * (double)scale < (double)FLT_MAX / 2;
}

static inline float i8_value(float bias, float scale, uint8_t q)
{
    if (i8_float_safe(bias, scale))
        return bias + (float)q * scale;
    double x = (double)bias + (double)q * (double)scale;
    return x > FLT_MAX ? FLT_MAX : x < -FLT_MAX ? -FLT_MAX : (float)x;
}

DTYPE_CLONES static void i8_decode_fast(uint32_t dim, const unsigned char *q, float bias, float scale, float *dst)
{
    for (uint32_t j = 0; j < dim; j++)
        dst[j] = bias + (float)q[j] * scale;
}

static bool i8_decode(uint32_t dim, const unsigned char *src, float *dst)
{
    float scale, bias;
    memcpy(&scale, src, 4);
    memcpy(&bias, src + 4, 4);
    if (!(scale >= 0) || !isfinite(scale) || !isfinite(bias)) {
        memset(dst, 0, 4 * (size_t)dim);  /* (no NaN leaves here, whatever the caller does) */
        return false;
    }
    if (i8_float_safe(bias, scale)) {
        i8_decode_fast(dim, src + 8, bias, scale, dst);
        return true;
    }
    for (uint32_t j = 0; j < dim; j++)
        dst[j] = i8_value(bias, scale, src[8 + j]);
    return true;
}

bool dtype_decode(int dtype, uint32_t dim, const void *src, float *dst)
{
    switch (dtype) {
    case EMBKV_F16: return f16_decode(dim, src, dst);
    case EMBKV_BF16: return bf16_decode(dim, src, dst);
    case EMBKV_I8: return i8_decode(dim, src, dst);
    default: memcpy(dst, src, 4 * (size_t)dim); return true;
    }
}

/* ------------------------------------------------------------- encode */

DTYPE_CLONES static void f16_encode_nearest(uint32_t dim, const float *src, void *dst)
{
#ifdef HAVE_F16
    _Float16 *d = dst;
    for (uint32_t j = 0; j < dim; j++)
        d[j] = (_Float16)src[j];
#else
    uint16_t *d = dst;
    for (uint32_t j = 0; j < dim; j++)
        d[j] = soft_f2h(src[j]);
#endif
}

/* The binary16 value next to the one with bits b, toward +inf (up) or
 * -inf (sign and magnitude: a step of the magnitude). */
static uint16_t f16_next(uint16_t b, bool up)
{
    bool neg = (b & 0x8000) != 0, zero = (b & 0x7fff) == 0;
    if (zero)
        return up ? 0x0001 : 0x8001;
    return up != neg ? (uint16_t)(b + 1) : (uint16_t)(b - 1);
}

/* x rounded to one of the two binary16 values around it, the upper with
 * probability (x - lo) / (hi - lo). */
static uint16_t f16_stochastic(float x, uint32_t r)
{
    uint16_t n = soft_f2h(x);
    float fn = soft_h2f(n);
    if (fn == x)
        return n;
    bool n_low = fn < x;
    uint16_t o = f16_next(n, n_low);
    float fo = soft_h2f(o);
    if (!isfinite(fo))
        return n;
    float lo = n_low ? fn : fo, hi = n_low ? fo : fn;
    double p = ((double)x - lo) / ((double)hi - lo);
    bool take_hi = (double)r < p * 4294967296.0;
    return take_hi == n_low ? o : n;
}

static uint16_t bf16_nearest(float x)
{
    uint32_t u = f2u(x);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static uint16_t bf16_stochastic(float x, uint32_t r)
{
    uint32_t u = f2u(x);
    /* adding 16 random low bits and truncating rounds the magnitude up
     * with probability its dropped bits over 2^16 */
    u += r & 0xffffu;
    return (uint16_t)(u >> 16);
}

/* (scale, bias) of the grid through min and max, or a neighbouring scale
 * on which every value of v already lies (see the top). */
static void i8_params(uint32_t dim, const float *v, float *scale_out, float *bias_out, bool *on_grid)
{
    float lo = v[0], hi = v[0];
    for (uint32_t j = 1; j < dim; j++) {
        lo = v[j] < lo ? v[j] : lo;
        hi = v[j] > hi ? v[j] : hi;
    }
    float scale = (float)(((double)hi - (double)lo) / 255.0);
    if (scale == 0 && hi > lo)
        scale = FLT_TRUE_MIN;  /* a range of a few denormals: steps of the least one */
    *bias_out = lo;
    *scale_out = scale;
    *on_grid = false;
    if (scale == 0)
        return;
    /* the scale itself, then 1, 2 and 3 floats above and below it */
    float cands[7] = {scale};
    float up = scale, down = scale;
    for (int k = 1; k < 7; k += 2) {
        cands[k] = up = nextafterf(up, INFINITY);
        cands[k + 1] = down = nextafterf(down, 0);
    }
    for (int k = 0; k < 7; k++) {
        float cand = cands[k];
        bool ok = true;
        for (uint32_t j = 0; j < dim && ok; j++) {
            double q = nearbyint(((double)v[j] - lo) / cand);
            ok = q >= 0 && q <= 255 && i8_value(lo, cand, (uint8_t)q) == v[j];
        }
        if (ok) {
            *scale_out = cand;
            *on_grid = true;
            return;
        }
    }
}

static void i8_encode(uint32_t dim, const float *src, unsigned char *dst, const uint64_t *seed)
{
    float scale, bias;
    bool on_grid;
    i8_params(dim, src, &scale, &bias, &on_grid);
    memcpy(dst, &scale, 4);
    memcpy(dst + 4, &bias, 4);
    for (uint32_t j = 0; j < dim; j++) {
        double t = scale > 0 ? ((double)src[j] - bias) / scale : 0;
        /* an element on a level (the row's least and largest, and those
         * an update left alone: within float32's error of the scale, a
         * few 1e-5 of a level) stays there, stochastic or not */
        double q = nearbyint(t);
        if (seed && !on_grid && fabs(t - q) > 1e-3)
            q = floor(t + rnd32(*seed, j) * (1.0 / 4294967296.0));
        dst[8 + j] = (unsigned char)(q < 0 ? 0 : q > 255 ? 255 : q);
    }
}

uint32_t dtype_encode(int dtype, uint32_t dim, const float *src, void *dst, const uint64_t *seed)
{
    if (dtype == EMBKV_F32 || dtype == 0) {
        memcpy(dst, src, 4 * (size_t)dim);
        return 0;
    }
    if (dtype != EMBKV_I8) {
        float m = dtype_max(dtype);
        for (uint32_t j = 0; j < dim; j++)
            if (!(fabsf(src[j]) <= m))
                return j + 1;
    }
    switch (dtype) {
    case EMBKV_F16:
        if (!seed) {
            f16_encode_nearest(dim, src, dst);
        } else {
            uint16_t *d = dst;
            for (uint32_t j = 0; j < dim; j++)
                d[j] = f16_stochastic(src[j], rnd32(*seed, j));
        }
        break;
    case EMBKV_BF16: {
        uint16_t *d = dst;
        for (uint32_t j = 0; j < dim; j++)
            d[j] = seed ? bf16_stochastic(src[j], rnd32(*seed, j)) : bf16_nearest(src[j]);
        break;
    }
    default:
        for (uint32_t j = 0; j < dim; j++)
            if (!isfinite(src[j]))
                return j + 1;
        i8_encode(dim, src, dst, seed);
    }
    return 0;
}

float embkv_dtype_max(uint32_t dtype) { return dtype_max((int)dtype); }

uint32_t embkv_dtype_round(uint32_t dtype, uint32_t dim, const float *in, float *out)
{
    if (dim > EMBKV_MAX_DIM)
        return 1;
    /* Nothing to round, or nowhere to put it: refused as element 0 is (out
     * unchanged), so a caller testing for 0 refuses the row. */
    if (dim && (!in || !out)) {
        (void)embkv__null_arg("embkv_dtype_round", "in", (const void *)in, "out", (const void *)out, (char *)NULL);
        return 1;
    }
    for (uint32_t j = 0; j < dim; j++)
        if (!isfinite(in[j]))
            return j + 1;
    if (dtype == EMBKV_F32 || dtype == 0) {
        memmove(out, in, 4 * (size_t)dim);
        return 0;
    }
    uint32_t enc[EMBKV_MAX_DIM / 2 + 4];
    uint32_t bad = dtype_encode((int)dtype, dim, in, enc, NULL);
    if (!bad)
        dtype_decode((int)dtype, dim, enc, out);
    return bad;
}
