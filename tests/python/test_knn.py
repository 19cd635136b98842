"""embkv_knn against a numpy brute force.

- Random rows (dim 37: the vector kernels' tail too), every metric, single
  queries and batches (JSON and BLOB), k from 1 past the row count: the
  same ids as numpy in float64, in the same order, and the same distances
  to float32 rounding.  Ties (integer rows with duplicates) break by id,
  exactly.
- The ids argument: the nearest among those ids (absent ones ignored).
- Rows in every tier: a table whose pool holds about half of its rows
  (the rest in the SSD log), with rows changed by embkv_push sitting in the
  DRAM cache newer than their home: the search agrees with numpy over what
  SELECT reads, row for row.
- A read-only connection searches too; a query of the wrong dim is refused
  naming the table.

Standard library unittest plus numpy.  Run by tests/run.sh through
tests/python_run.sh, or by hand:
    EMBKV_EXT=build/embkv /usr/bin/python3 tests/python/test_knn.py -v
"""
import json
import sqlite3
import unittest

import numpy as np

from embkv_test import TempDirTest as Base, connect


def reference(data, ids, q, k, metric):
    """numpy in float64: (ids, distances) of the k nearest, ties by id."""
    x = data.astype(np.float64)
    q = np.asarray(q, dtype=np.float64)
    if metric == "l2":
        d = np.sqrt(((x - q) ** 2).sum(axis=1))
    elif metric == "cosine":
        n = np.linalg.norm(x, axis=1)
        keep = n > 0
        d = np.full(len(x), np.inf)
        d[keep] = 1.0 - (x[keep] @ q) / (n[keep] * np.linalg.norm(q))
        x_ids = ids[keep]
        order = np.lexsort((x_ids, d[keep]))[:k]
        return x_ids[order], d[keep][order]
    else:
        d = -(x @ q)
    order = np.lexsort((ids, d))[:k]
    return ids[order], d[order]


class KnnTest(Base):
    def check(self, got, want_ids, want_d, tol=1e-5):
        """got: [(id, distance)].  Distances agree to float32 rounding;
        ids agree except within a group of reference distances closer than
        that (where float32 may order them either way)."""
        self.assertEqual(len(got), len(want_ids))
        gd = np.array([g[1] for g in got])
        scale = max(1.0, float(np.abs(want_d).max())) if len(want_d) else 1.0
        np.testing.assert_allclose(gd, want_d, rtol=0, atol=tol * scale)
        for i, (gid, _) in enumerate(got):
            if gid == want_ids[i]:
                continue
            near = [int(want_ids[j]) for j in range(len(want_ids)) if abs(want_d[j] - want_d[i]) <= tol * scale]
            self.assertIn(gid, near, "rank %d: got id %d, numpy says %d" % (i + 1, gid, want_ids[i]))

    def fill(self, conn, table, ids, data):
        conn.execute("BEGIN")
        conn.executemany("INSERT INTO %s(id, vec) VALUES (?, ?)" % table,
                         ((int(i), v.tobytes()) for i, v in zip(ids, data)))
        conn.execute("COMMIT")

    def test_random_rows_every_metric(self):
        conn = connect(self.db)
        dim, n = 37, 3000
        rng = np.random.default_rng(11)
        data = rng.standard_normal((n, dim), dtype=np.float32)
        ids = rng.permutation(10 * n)[:n].astype(np.int64) - 7000  # negative ids too
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d)" % dim)
        self.fill(conn, "t", ids, data)
        qs = rng.standard_normal((7, dim), dtype=np.float32)
        for metric in ("l2", "cosine", "dot"):
            for k in (1, 10, n + 5):
                got = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, ?, ?)",
                                   (qs[0].tobytes(), k, metric)).fetchall()
                self.check(got, *reference(data, ids, qs[0], k, metric))
            # a batch, as a BLOB and as JSON: each query's rows as numpy's
            for arg in (qs.tobytes(), json.dumps(qs.tolist())):
                rows = conn.execute("SELECT query, rank, id, distance FROM embkv_knn('t', ?, 10, ?)",
                                    (arg, metric)).fetchall()
                for qi in range(len(qs)):
                    mine = [(r[2], r[3]) for r in rows if r[0] == qi]
                    self.assertEqual([r[1] for r in rows if r[0] == qi], list(range(1, 11)))
                    self.check(mine, *reference(data, ids, qs[qi], 10, metric))
        # A row equal to the query is at distance 0 exactly (L2 is decided
        # on the direct sum, not |q|^2 + |v|^2 - 2 q.v).
        got = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, 1)", (data[123].tobytes(),)).fetchall()
        self.assertEqual(got, [(int(ids[123]), 0.0)])

    def test_ties_break_by_id(self):
        conn = connect(self.db)
        dim, n = 8, 2000
        rng = np.random.default_rng(5)
        data = rng.integers(-2, 3, size=(n, dim)).astype(np.float32)  # many duplicates
        ids = np.arange(n, dtype=np.int64) * 3 + 1
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d)" % dim)
        self.fill(conn, "t", ids, data)
        for metric in ("l2", "dot"):
            for q in (data[0], np.zeros(dim, np.float32) + 0.5, data[77]):
                got = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, 50, ?)",
                                   (q.tobytes(), metric)).fetchall()
                want_ids, want_d = reference(data, ids, q, 50, metric)
                self.assertEqual([g[0] for g in got], want_ids.tolist())  # exact, ties included
                np.testing.assert_allclose([g[1] for g in got], want_d, rtol=1e-6)

    def test_ids_argument(self):
        conn = connect(self.db)
        dim, n = 16, 1000
        rng = np.random.default_rng(3)
        data = rng.standard_normal((n, dim), dtype=np.float32)
        ids = np.arange(1, n + 1, dtype=np.int64)
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d)" % dim)
        self.fill(conn, "t", ids, data)
        pick = rng.choice(ids, 60, replace=False)
        asked = pick.tolist() + [5000, 6000]  # absent ids are ignored
        q = rng.standard_normal(dim, dtype=np.float32)
        got = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, 5, 'l2', ?)",
                           (q.tobytes(), json.dumps(asked))).fetchall()
        sel = np.isin(ids, pick)
        self.check(got, *reference(data[sel], ids[sel], q, 5, "l2"))
        got2 = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, 5, 'l2', ?)",
                            (q.tobytes(), np.asarray(asked, np.int64).tobytes())).fetchall()
        self.assertEqual(got, got2)

    def test_every_tier(self):
        """Pool, SSD log and dirty cached rows in one search."""
        conn = connect(self.db)
        dim, n = 16, 60000
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d, pool_size='16M', ssd_size='128M', "
                     "cache_size='2M', optimizer='sgd', lr=0.5, capacity=%d)" % (dim, n))
        rng = np.random.default_rng(9)
        data = rng.standard_normal((n, dim), dtype=np.float32)
        ids = np.arange(1, n + 1, dtype=np.int64)
        for lo in range(0, n, 20000):
            self.fill(conn, "t", ids[lo:lo + 20000], data[lo:lo + 20000])
        conn.execute("SELECT embkv_checkpoint('t')").fetchall()
        # Pushes change 500 rows; the cache holds them newer than their home.
        ch = np.arange(1, n + 1, 120, dtype=np.int64)
        conn.execute("SELECT embkv_pull('t', ?)", (ch.tobytes(),)).fetchall()
        grad = np.ones((len(ch), dim), np.float32)
        conn.execute("SELECT embkv_push('t', ?, ?)", (ch.tobytes(), grad.tobytes())).fetchall()
        # (A SELECT opens a snapshot, which writes the cache back: none
        # before the searches.)
        st = json.loads(conn.execute("SELECT embkv_stats('t')").fetchone()[0])
        self.assertGreater(st["tiers"]["dram"]["dirty_rows"], 100, st)
        self.assertGreater(st["tiers"]["ssd"]["rows"], 10000, st)
        self.assertGreater(st["tiers"]["pm"]["rows"], 10000, st)
        truth = data.copy()
        truth[ch - 1] -= 0.5  # sgd, lr 0.5, gradient 1: exact
        q_changed = truth[ch[3] - 1]
        results = {}
        for q in (q_changed, rng.standard_normal(dim, dtype=np.float32)):
            for metric in ("l2", "cosine"):
                results[(q.tobytes(), metric)] = conn.execute(
                    "SELECT id, distance FROM embkv_knn('t', ?, 20, ?)", (q.tobytes(), metric)).fetchall()
        got1 = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, 1)", (q_changed.tobytes(),)).fetchall()
        self.assertEqual(got1, [(int(ch[3]), 0.0)])
        # its old version (still at its home) is not a row any more
        got_old = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, 3)", (data[ch[3] - 1].tobytes(),)).fetchall()
        self.assertEqual(got_old[0][0], int(ch[3]))
        self.assertAlmostEqual(got_old[0][1], 2.0, places=5)  # sqrt(16 x 0.25)
        self.assertEqual(len({g[0] for g in got_old}), 3)
        st = json.loads(conn.execute("SELECT embkv_stats('t')").fetchone()[0])
        self.assertGreater(st["tiers"]["dram"]["dirty_rows"], 100, st)
        # Every row scored exactly once, in whichever tier (k = all rows),
        # and a row of the log equal to the query at 0.
        self.assertEqual(conn.execute("SELECT count(*), count(DISTINCT id) FROM embkv_knn('t', zeroblob(?), ?)",
                                      (4 * dim, n)).fetchone(), (n, n))
        ssd_ids = [r[0] for r in conn.execute("SELECT id FROM t WHERE tier = 'ssd' LIMIT 50")]
        for i in ssd_ids[::10]:
            got = conn.execute("SELECT id, distance FROM embkv_knn('t', ?, 1)", (truth[i - 1].tobytes(),)).fetchall()
            self.assertEqual(got, [(i, 0.0)])
        # what SELECT reads is the same truth
        rows = conn.execute("SELECT id, vec FROM t ORDER BY id").fetchall()
        self.assertEqual([r[0] for r in rows], ids.tolist())
        self.assertEqual(b"".join(r[1] for r in rows), truth.tobytes())
        for (qb, metric), got in results.items():
            self.check(got, *reference(truth, ids, np.frombuffer(qb, np.float32), 20, metric))

    def test_read_only_and_errors(self):
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=3, path='t.embkv')")
        conn.execute("INSERT INTO t(id, vec) VALUES (1, '[1,0,0]'), (2, '[0,1,0]'), (3, '[0,0,1]')")
        conn.close()
        ro = connect("file:%s?mode=ro" % self.db, uri=True)
        self.assertEqual(ro.execute("SELECT id FROM embkv_knn('t', '[0.9,0.1,0]', 2)").fetchall(), [(1,), (2,)])
        with self.assertRaises(sqlite3.OperationalError) as cm:
            ro.execute("SELECT id FROM embkv_knn('t', '[1,0]', 2)").fetchall()
        self.assertEqual(str(cm.exception), "embkv_knn: table t: query 0 must be a JSON array of 3 numbers "
                                            "(the table's dim), got an array of 2")
        ro.close()


if __name__ == "__main__":
    unittest.main()
