#!/usr/bin/env python3
"""Training-step benchmark from Python: one step = pull a batch, push its
gradients with SGD (lr 0.01).

Compared in one run on the same data (N rows of random 63-bit ids, dim 64,
batches of 512 ids drawn Zipf(0.99), ranks spread over the rows by a random
permutation):
  numpy     an in-memory float32 array: fancy indexing, then np.add.at
            (ids already resolved to row numbers: the best case);
  embkv     SELECT embkv_pull('t', ?) / SELECT embkv_push('t', ?, ?) with the
            ids as an int64 BLOB, vectors through np.frombuffer; then the
            same with a DRAM cache of --cache-frac of the rows (default
            0.1; 0 skips it);
  sqlite    a plain table (id INTEGER PRIMARY KEY, vec BLOB), WAL, a page
            cache that holds it: SELECT ... WHERE id IN (json_each(?)), then
            one UPDATE per distinct row inside one transaction.
Prints ids/s for each and the ratios.  Usage:
  bench_train.py DIR [--rows N] [--batches B] [--slow-batches S] [--cache-frac F] [--ext PATH]
DIR must be absent or empty; it is removed at the end.
"""
import argparse
import json
import os
import shutil
import sqlite3
import sys
import time

from bench_py import default_extension

try:
    import numpy as np
except ImportError:
    sys.exit("bench_train.py needs numpy (Debian: apt-get install python3-numpy)")

DIM = 64
BATCH = 512
LR = 0.01


def need_extension_loading():
    conn = sqlite3.connect(":memory:")
    if not hasattr(conn, "enable_load_extension"):
        sys.exit("this Python's sqlite3 cannot load extensions; run with /usr/bin/python3")
    conn.close()


def make_data(rows, nbatches, seed=0x656D626B76):
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(1, 2**63 - 1, size=int(rows * 1.01) + 16, dtype=np.int64))
    ids = rng.permutation(ids)[:rows]
    vecs = rng.uniform(-1, 1, size=(rows, DIM)).astype(np.float32)
    weights = np.arange(1, rows + 1, dtype=np.float64) ** -0.99
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(nbatches * BATCH))
    rows_of = rng.permutation(rows)[np.minimum(ranks, rows - 1)].reshape(nbatches, BATCH)
    grads = (rng.standard_normal((nbatches, BATCH, DIM)) * 0.01).astype(np.float32)
    return ids, vecs, rows_of, grads


def timed(label, nbatches, step):
    t0 = time.perf_counter()
    for b in range(nbatches):
        step(b)
    secs = time.perf_counter() - t0
    rate = nbatches * BATCH / secs
    print(f"{label:<34} {rate / 1e6:8.3f} M ids/s  ({nbatches} batches, {secs:.2f} s)")
    return rate


def bench_numpy(vecs, rows_of, grads, nbatches):
    table = vecs.copy()

    def step(b):
        r = rows_of[b]
        v = table[r]                     # the pull
        assert v.shape == (BATCH, DIM)
        np.add.at(table, r, -LR * grads[b])  # the push (duplicates summed)
    return timed("numpy in memory", nbatches, step)


def bench_embkv(dirpath, ext, ids, vecs, rows_of, grads, nbatches, staleness, cache_frac=0.0):
    conn = sqlite3.connect(os.path.join(dirpath, "embkv.db"), isolation_level=None)
    conn.enable_load_extension(True)
    conn.load_extension(ext)
    path = os.path.join(dirpath, f"t_{staleness}")
    # A cached row takes its record, a slot and up to four table entries.
    cache = f", cache_size={int(len(ids) * cache_frac) * (DIM * 4 + 32 + 88)}" if cache_frac else ""
    conn.execute(f"CREATE VIRTUAL TABLE t USING embkv(dim={DIM}, path='{path}', capacity={len(ids)}, "
                 f"optimizer='sgd', lr={LR}, staleness={staleness}{cache})")
    t0 = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO t(id, vec) VALUES (?, ?)",
                     ((int(i), v.tobytes()) for i, v in zip(ids, vecs)))
    conn.execute("COMMIT")
    print(f"embkv load: {len(ids) / (time.perf_counter() - t0) / 1e6:.3f} M rows/s")
    batch_ids = [ids[rows_of[b]].tobytes() for b in range(nbatches)]
    batch_grads = [grads[b].tobytes() for b in range(nbatches)]

    def step(b):
        blob = conn.execute("SELECT embkv_pull('t', ?)", (batch_ids[b],)).fetchone()[0]
        v = np.frombuffer(blob, dtype=np.float32).reshape(BATCH, DIM)
        assert v.shape == (BATCH, DIM)
        conn.execute("SELECT embkv_push('t', ?, ?)", (batch_ids[b], batch_grads[b])).fetchone()
    # A pass to warm up (the pool's pages touched, a cache filled: INSERTed
    # rows enter it on their first read) and a checkpoint, with or without a
    # cache, then the measured pass: both measured in the same steady state.
    for b in range(nbatches):
        step(b)
    conn.execute("SELECT embkv_checkpoint('t')").fetchone()  # (a cache's dirty rows written back)
    label = f"embkv SQL functions (staleness {staleness})"
    if cache_frac:
        label = f"embkv SQL functions, cache {cache_frac:.0%}"
        d0 = json.loads(conn.execute("SELECT embkv_stats('t')").fetchone()[0])["tiers"]["dram"]
    rate = timed(label, nbatches, step)
    if cache_frac:
        d = json.loads(conn.execute("SELECT embkv_stats('t')").fetchone()[0])["tiers"]["dram"]
        h, m = d["hits"] - d0["hits"], d["misses"] - d0["misses"]
        print(f"  cache hit rate {h / max(h + m, 1):.3f} in the measured pass, {d['rows']} of "
              f"{d['capacity_rows']} rows")
    conn.execute("DROP TABLE t")
    conn.close()
    return rate


def bench_sqlite(dirpath, ids, vecs, rows_of, grads, nbatches):
    conn = sqlite3.connect(os.path.join(dirpath, "plain.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA cache_size=-2000000")  # 2 GB: the table fits
    conn.execute("CREATE TABLE p(id INTEGER PRIMARY KEY, vec BLOB)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO p(id, vec) VALUES (?, ?)",
                     ((int(i), v.tobytes()) for i, v in zip(ids, vecs)))
    conn.execute("COMMIT")
    conn.execute("SELECT count(*), sum(length(vec)) FROM p").fetchone()  # warm the cache
    batch_ids = [ids[rows_of[b]] for b in range(nbatches)]
    batch_json = [json.dumps(batch_ids[b].tolist()) for b in range(nbatches)]

    def step(b):
        got = {i: np.frombuffer(v, dtype=np.float32) for i, v in conn.execute(
            "SELECT id, vec FROM p WHERE id IN (SELECT value FROM json_each(?))", (batch_json[b],))}
        assert len(got) > 0
        delta = {}
        for k, i in enumerate(batch_ids[b].tolist()):
            d = delta.get(i)
            delta[i] = grads[b][k] if d is None else d + grads[b][k]
        conn.execute("BEGIN")
        conn.executemany("UPDATE p SET vec = ? WHERE id = ?",
                         (((got[i] - LR * g).astype(np.float32).tobytes(), i) for i, g in delta.items()))
        conn.execute("COMMIT")
    step(0)
    rate = timed("plain SQLite (IN, then UPDATE per row)", nbatches, step)
    conn.close()
    return rate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--slow-batches", type=int, default=100,
                    help="batches for the plain SQLite baseline (it is slow)")
    ap.add_argument("--cache-frac", type=float, default=0.1,
                    help="the cached run's cache, as a fraction of the rows (0: no cached run)")
    ap.add_argument("--ext", default=None,
                    help="the extension (default: the installed embkv package's, embkv.find_extension())")
    a = ap.parse_args()
    if a.ext is None:
        a.ext = default_extension(__file__)
    need_extension_loading()
    if os.path.exists(a.dir) and os.listdir(a.dir):
        sys.exit(f"{a.dir} must be absent or empty")
    os.makedirs(a.dir, exist_ok=True)
    try:
        t0 = time.perf_counter()
        ids, vecs, rows_of, grads = make_data(a.rows, a.batches)
        print(f"data: {a.rows} rows, dim {DIM}, {a.batches} batches of {BATCH} (zipf 0.99), "
              f"{time.perf_counter() - t0:.1f} s")
        r_np = bench_numpy(vecs, rows_of, grads, a.batches)
        r_sql = bench_sqlite(a.dir, ids, vecs, rows_of, grads, min(a.slow_batches, a.batches))
        r_ek = bench_embkv(a.dir, a.ext, ids, vecs, rows_of, grads, a.batches, "unlimited")
        print(f"ratio embkv / plain SQLite: {r_ek / r_sql:.1f}x   (goal >= 20x)")
        print(f"ratio numpy / embkv:        {r_np / r_ek:.2f}x  (goal <= 3x)")
        if a.cache_frac:
            r_c = bench_embkv(a.dir, a.ext, ids, vecs, rows_of, grads, a.batches, "unlimited", a.cache_frac)
            print(f"ratio cached / plain SQLite: {r_c / r_sql:.1f}x   (goal >= 25x)")
            print(f"ratio cached / uncached:     {r_c / r_ek:.2f}x")
            print(f"ratio numpy / cached:        {r_np / r_c:.2f}x")
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
