/*
 * test_model_cache.c - the model-based randomized test (test_model.c) with
 * the three tiers: a DRAM cache holding about 5% of the rows, a pool about
 * a tenth, the SSD log the rest; kills lose exactly the cache's changes
 * since the last sync.
 */
#define MODEL_TIER 1
#define MODEL_CACHE 1
#include "test_model.c"
