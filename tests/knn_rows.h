/*
 * knn_rows.h - what the nearest-neighbour tests share (test_knn.c,
 * test_concurrency_knn.c): rows of DIM floats that are a function of
 * (id, version), exact in float32; distances to them in double; a store
 * filled with version 0 of rows 0..n-1.  Include after check.h.
 */
#ifndef EMBKV_TEST_KNN_ROWS_H
#define EMBKV_TEST_KNN_ROWS_H

#include <math.h>

#define DIM 21  /* not a multiple of 8: the vector kernels' tails too */

static float val(int64_t id, int j, int version)
{
    return (float)((int64_t)mix64((uint64_t)id * 131 + (uint64_t)j * 7 + (uint64_t)version * 1000003) % 2001 - 1000) /
           256.0f;
}

static double ref_dist(const float *q, const float *v, int metric)
{
    double dot = 0, qq = 0, vv = 0, l2 = 0;
    for (int j = 0; j < DIM; j++) {
        dot += (double)q[j] * v[j];
        qq += (double)q[j] * q[j];
        vv += (double)v[j] * v[j];
        l2 += ((double)q[j] - v[j]) * ((double)q[j] - v[j]);
    }
    return metric == EMBKV_KNN_L2 ? sqrt(l2) : metric == EMBKV_KNN_COSINE ? 1 - dot / sqrt(qq * vv) : -dot;
}

static embkv_store *make_store(const char *name, int64_t rows)
{
    embkv_options o = {0};
    o.dim = DIM;
    o.expected_rows = (uint64_t)rows;
    embkv_store *s = NULL;
    CHECK_RC(embkv_open(test_tmpdir(name), &o, EMBKV_OPEN_CREATE, &s), EMBKV_OK);
    float v[DIM];
    for (int64_t id = 0; id < rows && s; id++) {
        for (int j = 0; j < DIM; j++) v[j] = val(id, j, 0);
        CHECK_RC(embkv_put(s, id, v, NULL, 0), EMBKV_OK);
    }
    return s;
}

#endif
