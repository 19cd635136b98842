/*
 * knnlog.c - the kNN change log: the index changes a kept kNN map follows.
 *
 * A search of every row keeps a map of the places of the pool's live
 * records (knn.c), valid while knn_clean holds the id of the pass that
 * made it (P11).  Clearing knn_clean at every change meant a table written
 * between queries, as one that serves while it trains is, paid the pass
 * over the whole index (a quarter of a query's time at 1M rows of dim 64)
 * at every query.  Most writes are changes a map can follow: a row's new
 * version placed in a new record (copy-on-write), or a new row.  The
 * writer tells this log (id, old place, new place) instead of clearing,
 * and the next search applies the log to the map before it streams
 * (knn.c: map_catch_up).
 *
 * The handshake is P11's, the log in place of the clear: the writer tells
 * after its changes and a full fence, reading knn_clean under knn_mu; a
 * pass that set its id before that read finds the changes in the log, one
 * that sets it after sees them in the index.  The log holds the changes
 * of one id (knn_log_id): appends are ordered by knn_mu, and an id that
 * has left knn_clean never returns to it, so a change told for another id
 * means the kept map is dead and the log starts again.
 *
 * What the log does not give is each row's moves in the order made: a
 * writer tells after letting the row's key lock go (a batch's changes at
 * its end), so two writers of a row may tell in either order.  The search
 * that applies the log holds s->writers exclusively meanwhile, so every
 * change made has been told, and it takes from an entry only the place
 * its row left; where the row is now it asks the index (knn.c:
 * map_apply).
 *
 * Bounded: applying a change costs an index lookup, and past a
 * sixty-fourth of the rows a pass would be about as cheap; a tell beyond
 * that (or one the log cannot grow for) clears knn_clean as an untold
 * change does, and the log empties.
 */
#include <stdlib.h>
#include <string.h>

#include "index.h"

#define LOG_MIN 1024

void knnlog_tell(embkv_store *s, const knn_change *c, size_t n)
{
    if (n == 0)
        return;
    /* Whatever follows, every kept map is told: by the log, by the clear,
     * or (knn_clean 0) by there being none a later pass does not see
     * the changes of. */
    ix_section.told += n;
    full_fence();
    if (!atomic_load_explicit(&s->knn_clean, memory_order_seq_cst))
        return;
    pthread_mutex_lock(&s->knn_mu);
    uint64_t id = atomic_load_explicit(&s->knn_clean, memory_order_seq_cst);
    if (id) {
        if (s->knn_log_id != id) {
            s->knn_log_id = id;
            s->knn_log_n = 0;
        }
        size_t need = s->knn_log_n + n;
        bool fits = need <= LOG_MIN + atomic_load_explicit(&s->rows, memory_order_relaxed) / 64;
        if (fits && need > s->knn_log_cap) {
            size_t cap = s->knn_log_cap ? 2 * s->knn_log_cap : 256;
            while (cap < need)
                cap *= 2;
            knn_change *p = realloc(s->knn_log, cap * sizeof *p);
            if (p) {
                s->knn_log = p;
                s->knn_log_cap = cap;
            } else {
                fits = false;
            }
        }
        if (fits) {
            /* (A change that names no place, a tombstone's purge, needs no
             * entry: counted told, it leaves the map as it is.) */
            knn_change *to = s->knn_log + s->knn_log_n;
            size_t kept = 0;
            for (size_t i = 0; i < n; i++)
                if (!((c[i].from == LOC_NONE || (c[i].from & LOC_FLAGS)) &&
                      (c[i].to == LOC_NONE || (c[i].to & LOC_FLAGS))))
                    to[kept++] = c[i];
            s->knn_log_n += kept;
        } else {
            s->knn_log_n = 0;
            knn_note_change(s);
        }
    }
    pthread_mutex_unlock(&s->knn_mu);
}

void knnlog_free(embkv_store *s)
{
    free(s->knn_log);
    s->knn_log = NULL;
    s->knn_log_n = s->knn_log_cap = 0;
}
