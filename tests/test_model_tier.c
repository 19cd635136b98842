/*
 * test_model_tier.c - the model-based randomized test (test_model.c) with
 * the SSD tier: rows of 512 floats in a pool that holds about a tenth of
 * them, the rest in the log, look-ahead among the operations, and kills
 * while demotion, promotion, compaction and look-ahead run.
 */
#define MODEL_TIER 1
#include "test_model.c"
