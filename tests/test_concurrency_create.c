/*
 * test_concurrency_create.c - rows a pull creates appear all together or
 * not at all, also when the pool runs out under it.
 *
 * A pull checks that the pool has room for the rows it must create before
 * it creates any, but the check reserves nothing: pulls beside it take the
 * room, and one of its puts fails part-way.  Four threads pull batches of
 * new ids (64 consecutive ids each) into a pool too small for all of them,
 * until each has seen the pool full a few times; every batch must then be
 * all present (its pull succeeded) or all absent (it failed), and the
 * count must be the successful pulls' rows.
 */
#include <pthread.h>

#include "embkv.h"
#include "check.h"

#define DIM 120
#define B 64
#define THREADS 4

static embkv_store *S;
static atomic_long next_batch, made_rows;

static void *puller(void *arg)
{
    (void)arg;
    embkv_session *ss = NULL;
    TCHECK_RC(embkv_session_open(S, &ss), EMBKV_OK);
    float *out = malloc(sizeof(float) * DIM * B);
    int fulls = 0;
    while (ss && fulls < 3) {
        long k = atomic_fetch_add(&next_batch, 1);
        int64_t ids[B];
        for (int j = 0; j < B; j++) ids[j] = (int64_t)k * B + j;
        int rc = embkv_pull(ss, ids, B, out);
        if (rc == EMBKV_OK) {
            atomic_fetch_add(&made_rows, B);
            TCHECK_RC(embkv_release(ss, ids, B, NULL), EMBKV_OK);
        } else {
            TCHECK(rc == EMBKV_FULL);
            fulls++;
        }
    }
    free(out);
    embkv_session_close(ss);
    return NULL;
}

int main(void)
{
    embkv_options o = {.dim = DIM, .expected_rows = 40000, .pool_size = 16u << 20};
    CHECK_RC(embkv_open(test_tmpdir("create"), &o, EMBKV_OPEN_CREATE, &S), EMBKV_OK);
    if (!S) return test_summary("test_concurrency_create");
    embkv_train_options t;
    embkv_train_defaults(&t);
    t.init = EMBKV_INIT_UNIFORM;
    t.init_a = -1;
    t.init_b = 1;
    CHECK_RC(embkv_train_configure(S, &t), EMBKV_OK);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, puller, NULL);
    for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
    fold_thread_checks();
    long batches = atomic_load(&next_batch), partial = 0, whole = 0;
    for (long k = 0; k < batches; k++) {
        int present = 0;
        for (int j = 0; j < B; j++) present += embkv_exists(S, (int64_t)k * B + j) == 1;
        partial += present != 0 && present != B;
        whole += present == B;
    }
    printf("  %ld batches pulled, %ld created whole, %ld in part\n", batches, whole, partial);
    CHECK(partial == 0);
    CHECK(embkv_count(S) == (uint64_t)atomic_load(&made_rows));
    CHECK_RC(embkv_check(S), EMBKV_OK);
    CHECK_RC(embkv_close(S), EMBKV_OK);
    return test_summary("test_concurrency_create");
}
