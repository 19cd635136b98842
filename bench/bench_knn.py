"""Nearest-neighbour search: embkv_knn against sqlite-vec's brute force and
numpy, on the same rows, in one run.

    build/venv/bin/python bench/bench_knn.py DIR [--rows 1000000] [--dim 64]
        [--vec0 PATH/vec0.so] [--queries 20] [--batch 100]

Rows are N(0,1) floats (seed 7) in an embkv table (pool on DIR's mount), a
sqlite-vec vec0 table and a numpy array.  Measured: one query at a time
(median of --queries; embkv also with one row written before each query,
which drops the map of the live records a search keeps for the next), and
a batch of --batch queries (embkv: one call;
sqlite-vec: one query after another, it has no batch; numpy: one matrix
product).  Every answer is checked against numpy's (same ids; distances
within float32 rounding).  sqlite-vec is the npm package
sqlite-vec-linux-x64 (bench/run.sh installs it under build/npm); without it
the sqlite-vec rows are left out and the script says so."""
import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_py  # noqa: E402


def median_each(fn, items):
    """The median time of fn over each item, one call at a time."""
    ts = []
    for it in items:
        t = time.perf_counter()
        fn(it)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def timed(fn, reps):
    ts = []
    out = None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--vec0", default=os.path.join("build", "npm", "node_modules", "sqlite-vec-linux-x64", "vec0.so"))
    ap.add_argument("--ext", default=None)
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16", "i8"],
                    help="embkv's table keeps its rows in this type (the others, and the checks, get the same "
                         "values decoded)")
    a = ap.parse_args()
    ext = a.ext or bench_py.default_extension(__file__)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    rng = np.random.default_rng(7)
    data = rng.standard_normal((a.rows, a.dim), dtype=np.float32)
    ids = np.arange(1, a.rows + 1, dtype=np.int64)
    qs = rng.standard_normal((max(a.queries, a.batch), a.dim), dtype=np.float32)
    k = a.k

    c = bench_py.connect(os.path.join(a.dir, "knn.db"), ext)
    pool = max(64 << 20, int(a.rows * (32 + 4 * a.dim + 63) // 64 * 64 * 1.6))
    c.execute("CREATE VIRTUAL TABLE item USING embkv(dim=%d, path='item.embkv', pool_size=%d, capacity=%d, dtype=%s)"
              % (a.dim, pool, a.rows, a.dtype))
    t = time.perf_counter()
    c.execute("BEGIN")
    step = 50000
    for s in range(0, a.rows, step):
        c.executemany("INSERT INTO item(id, vec) VALUES (?, ?)",
                      ((int(ids[i]), data[i].tobytes()) for i in range(s, min(s + step, a.rows))))
    c.execute("COMMIT")
    print("loaded %d rows of dim %d into embkv (%s) in %.1f s" % (a.rows, a.dim, a.dtype, time.perf_counter() - t))
    if a.dtype != "f32":
        # everyone searches the values the table keeps
        data = np.stack([np.frombuffer(v, np.float32) for (v,) in c.execute("SELECT vec FROM item ORDER BY id")])

    vec = None
    if os.path.exists(a.vec0):
        vec = sqlite3.connect(":memory:")
        vec.enable_load_extension(True)
        vec.load_extension(os.path.abspath(a.vec0).rsplit(".so", 1)[0])
        vec.execute("CREATE VIRTUAL TABLE v USING vec0(embedding float[%d])" % a.dim)
        t = time.perf_counter()
        vec.execute("BEGIN")
        for s in range(0, a.rows, step):
            vec.executemany("INSERT INTO v(rowid, embedding) VALUES (?, ?)",
                            ((int(ids[i]), data[i].tobytes()) for i in range(s, min(s + step, a.rows))))
        vec.execute("COMMIT")
        print("loaded sqlite-vec %s in %.1f s" % (vec.execute("SELECT vec_version()").fetchone()[0],
                                                    time.perf_counter() - t))
    else:
        print("sqlite-vec not found at %s (bench/run.sh installs it): its rows are left out" % a.vec0)

    def np_knn(q):
        d = ((data - q) ** 2).sum(axis=1)
        top = np.argpartition(d, k)[:k]
        top = top[np.lexsort((ids[top], d[top]))]
        return ids[top], np.sqrt(d[top])

    def np_batch(Q):
        # |x|^2 - 2 x.q + |q|^2, one matrix product for the batch
        d = (data * data).sum(axis=1)[None, :] - 2.0 * (Q @ data.T) + (Q * Q).sum(axis=1)[:, None]
        top = np.argpartition(d, k, axis=1)[:, :k]
        return top

    def ek_one(q):
        return c.execute("SELECT id, distance FROM embkv_knn('item', ?, %d)" % k, (q.tobytes(),)).fetchall()

    def ek_batch(Q):
        return c.execute("SELECT query, id, distance FROM embkv_knn('item', ?, %d)" % k, (Q.tobytes(),)).fetchall()

    def vec_one(q):
        return vec.execute("SELECT rowid, distance FROM v WHERE embedding MATCH ? AND k = %d ORDER BY distance" % k,
                           (q.tobytes(),)).fetchall()

    # correctness first: every answer equals numpy's
    bad = 0
    for i in range(min(5, a.queries)):
        want_ids, want_d = np_knn(qs[i])
        got = ek_one(qs[i])
        if [r[0] for r in got] != list(want_ids) or not np.allclose([r[1] for r in got], want_d, rtol=1e-4):
            bad += 1
        if vec is not None:
            gv = vec_one(qs[i])
            if [r[0] for r in gv] != list(want_ids):
                print("sqlite-vec differs from numpy on query %d" % i)
    B = qs[:a.batch]
    got = ek_batch(B)
    top = np_batch(B)
    for qi in range(a.batch):
        mine = sorted(r[1] for r in got if r[0] == qi)
        if mine != sorted(ids[top[qi]].tolist()):
            bad += 1
    print("answers checked against numpy: %d differ" % bad)

    rows = []
    t1 = median_each(ek_one, qs[:a.queries])
    rows.append(("embkv_knn, one query", t1))
    # A row written (to the value it has) before each query, or deleted and
    # put back: the map of the live records kept from the query before
    # follows the changes (the kNN change log) and the query streams at
    # once.  More rows written between two queries than that log holds (a
    # sixty-fourth of the rows): the query makes the map again with a pass
    # over the index.
    def after_each(change, label, n=a.queries):
        tw, after = [], []
        for i, q in enumerate(qs[:n]):
            change(int(ids[i]))
            t = time.perf_counter()
            after.append(ek_one(q))
            tw.append(time.perf_counter() - t)
        rows.append((label, statistics.median(tw)))
        # (checked after the timing: the rows written kept their values)
        bad = sum([r[0] for r in after[i]] != list(np_knn(qs[i])[0]) for i in range(min(5, a.queries)))
        print("answers %s checked against numpy: %d differ" % (label.split(", ")[1], bad))

    def write(rid):
        c.execute("UPDATE item SET vec = (SELECT vec FROM item WHERE id = ?) WHERE id = ?", (rid, rid))

    def delete_put_back(rid):
        c.execute("BEGIN")
        old = c.execute("SELECT vec FROM item WHERE id = ?", (rid,)).fetchone()[0]
        c.execute("DELETE FROM item WHERE id = ?", (rid,))
        c.execute("COMMIT")
        c.execute("INSERT INTO item(id, vec) VALUES (?, ?)", (rid, old))

    many = min(a.rows, a.rows // 64 + 8000)

    def write_many(rid):
        c.execute("BEGIN")
        c.executemany("UPDATE item SET vec = (SELECT vec FROM item WHERE id = ?) WHERE id = ?",
                      ((int(ids[j]), int(ids[j])) for j in range(many)))
        c.execute("COMMIT")

    after_each(write, "embkv_knn, one query after a write")
    after_each(delete_put_back, "embkv_knn, one query after a delete")
    after_each(write_many, "embkv_knn, one query after %d writes" % many, n=min(5, a.queries))
    if vec is not None:
        tv = median_each(vec_one, qs[:a.queries])
        rows.append(("sqlite-vec vec0, one query", tv))
    tn = median_each(np_knn, qs[:a.queries])
    rows.append(("numpy, one query", tn))
    tb, _ = timed(lambda: ek_batch(B), 3)
    rows.append(("embkv_knn, batch of %d (per query)" % a.batch, tb / a.batch))
    if vec is not None:
        n_vb = min(a.batch, 20)
        tvb, _ = timed(lambda: [vec_one(B[i]) for i in range(n_vb)], 1)
        rows.append(("sqlite-vec vec0, %d queries (per query)" % n_vb, tvb / n_vb))
    tnb, _ = timed(lambda: np_batch(B), 3)
    rows.append(("numpy, batch of %d (per query)" % a.batch, tnb / a.batch))
    base = dict(rows)["sqlite-vec vec0, one query"] if vec is not None else None
    print("\n%-42s %12s %14s" % ("", "ms/query", "vs sqlite-vec"))
    for name, sec in rows:
        print("%-42s %12.2f %14s" % (name, sec * 1e3, ("%.1fx" % (base / sec)) if base else "-"))
    gb = a.rows * a.dim * 4 / 1e9
    print("\none query reads %.2f GB of vectors: %.1f GB/s at embkv_knn's speed" % (gb, gb / t1))


if __name__ == "__main__":
    main()
