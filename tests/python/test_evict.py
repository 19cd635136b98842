"""Eviction from Python: who may evict, and what a full pool says.

- A read-only connection (mode=ro) reads a table whose rows are past
  max_rows and expired as they are: its background passes delete nothing,
  and embkv_evict is refused; a connection that may write then evicts
  them by itself.  When the last writable connection of a process closes,
  the passes stop for the read-only ones left.
- A large transaction into a table far past max_rows: every row is there
  or counted evicted, and embkv_evict brings the table to max_rows.
- A trainer that fills a small pool faster than the eviction thread
  passes gets SQLITE_FULL with a message that names the way out, and that
  way (embkv_checkpoint, then embkv_evict) lets training go on.
- embkv_evict is refused on a connection with uncommitted writes.

Run by tests/run.sh through tests/python_run.sh, or by hand:
    EMBKV_EXT=build/embkv /usr/bin/python3 tests/python/test_evict.py -v
"""
import json
import sqlite3
import time
import unittest

import numpy as np

from embkv_test import TempDirTest, connect


def count(conn, table):
    return conn.execute("SELECT count(*) FROM %s" % table).fetchone()[0]


def wait_for(pred, seconds=10.0):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


class TestReadOnly(TempDirTest):
    def test_read_only_connections_do_not_evict(self):
        w = connect(self.db)
        w.execute("CREATE VIRTUAL TABLE item USING embkv(dim=2, max_rows=2, ttl='1s')")
        w.execute("INSERT INTO item(id, vec) SELECT value, '[1,1]' FROM json_each('[1,2,3,4,5]')")
        w.execute("SELECT embkv_checkpoint('item')").fetchone()
        w.close()
        ro = connect("file:%s?mode=ro" % self.db, uri=True)
        self.assertEqual(count(ro, "item"), 5)
        time.sleep(2.5)  # two passes' worth, and past the ttl
        self.assertEqual(count(ro, "item"), 5)
        with self.assertRaisesRegex(sqlite3.OperationalError, "embkv_evict"):
            ro.execute("SELECT embkv_evict('item')").fetchone()
        # a writable connection beside it (its table connected by a use):
        # the thread passes; the read-only connection, which opened the
        # store to read before any could write here, sees them at the
        # next checkpoint
        w = connect(self.db)
        self.assertEqual(count(w, "item"), 5)
        self.assertTrue(wait_for(lambda: count(w, "item") == 0))
        self.assertEqual(count(ro, "item"), 5)
        w.execute("SELECT embkv_checkpoint('item')").fetchone()
        self.assertEqual(count(ro, "item"), 0)
        w.close()
        ro.close()

    def test_passes_stop_with_the_last_writer(self):
        w = connect(self.db)
        w.execute("CREATE VIRTUAL TABLE item USING embkv(dim=2, max_rows=3)")
        ro = connect("file:%s?mode=ro" % self.db, uri=True)
        self.assertEqual(count(ro, "item"), 0)
        w.close()  # the writer goes: the read-only connection keeps the store
        w2 = connect(self.db)
        w2.execute("INSERT INTO item(id, vec) SELECT value, '[1,1]' FROM json_each('[1,2,3,4,5,6,7,8]')")
        w2.execute("SELECT embkv_checkpoint('item')").fetchone()
        self.assertTrue(wait_for(lambda: count(ro, "item") <= 3))
        w2.close()
        stats = json.loads(ro.execute("SELECT embkv_stats('item')").fetchone()[0])
        passes = stats["training"]["eviction"]["passes"]
        time.sleep(1.5)
        stats = json.loads(ro.execute("SELECT embkv_stats('item')").fetchone()[0])
        self.assertEqual(stats["training"]["eviction"]["passes"], passes)
        ro.close()


class TestTransactions(TempDirTest):
    def test_a_large_commit_is_kept_or_counted(self):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, capacity=400000, max_rows=1000)")
        n = 200000
        c.execute("BEGIN")
        c.execute("WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s WHERE x < ?) "
                  "INSERT INTO t(id, vec) SELECT x, '[1,2,3,4]' FROM s", (n,))
        c.execute("COMMIT")
        ev = json.loads(c.execute("SELECT embkv_stats('t')").fetchone()[0])["training"]["eviction"]
        # every row of the commit is there or was counted evicted (by a pass
        # after it: test_evict.c shows rows since the last checkpoint stay)
        self.assertEqual(count(c, "t") + ev["over_max_rows"], n)
        got = json.loads(c.execute("SELECT embkv_evict('t')").fetchone()[0])
        # max_rows, or the background pass's target (max_rows less 1/32)
        # when that pass ran first
        self.assertIn(count(c, "t"), (1000, 1000 - 1000 // 32))
        self.assertEqual(got["kept_pulled"], 0)
        c.close()

    def test_evict_refused_with_uncommitted_writes(self):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, max_rows=1)")
        c.execute("BEGIN")
        c.execute("INSERT INTO t(id, vec) VALUES (1, '[1,1]'), (2, '[2,2]')")
        with self.assertRaisesRegex(sqlite3.OperationalError,
                                    "embkv_evict: table t: this connection has uncommitted writes to the table; "
                                    "COMMIT them first"):
            c.execute("SELECT embkv_evict('t')").fetchone()
        c.execute("COMMIT")
        c.execute("SELECT embkv_checkpoint('t')").fetchone()
        self.assertEqual(json.loads(c.execute("SELECT embkv_evict('t')").fetchone()[0])["over_max_rows"], 1)
        c.close()


class TestFullPool(TempDirTest):
    def test_full_pool_names_the_way_out(self):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=64, pool_size='16M', init='zeros', max_rows=1000)")
        grads = json.dumps([0.0] * 64 * 1000)
        err = None
        for step in range(200):
            ids = json.dumps(list(range(step * 1000, step * 1000 + 1000)))
            try:
                c.execute("SELECT embkv_pull('t', ?)", (ids,)).fetchone()
                c.execute("SELECT embkv_push('t', ?, ?)", (ids, grads)).fetchone()
            except sqlite3.OperationalError as e:
                err = str(e)
                break
        self.assertIsNotNone(err)
        self.assertIn("(the table evicts, and its eviction thread passes about once a second: "
                      "SELECT embkv_checkpoint('t'), embkv_evict('t') makes room now; eviction keeps rows "
                      "pulled and not yet pushed: push them, or return them with embkv_release, first)", err)
        c.execute("SELECT embkv_release('t', ?)", (ids,)).fetchone()
        for _ in range(20):  # as the message says, until the table is back under max_rows
            c.execute("SELECT embkv_checkpoint('t')").fetchone()
            got = json.loads(c.execute("SELECT embkv_evict('t')").fetchone()[0])
            if count(c, "t") <= 1000 and got["left"] == 0:
                break
        self.assertLessEqual(count(c, "t"), 1000)
        ids = json.dumps(list(range(10 ** 6, 10 ** 6 + 1000)))
        c.execute("SELECT embkv_pull('t', ?)", (ids,)).fetchone()
        self.assertEqual(c.execute("SELECT embkv_push('t', ?, ?)", (ids, grads)).fetchone()[0], 1000)
        c.close()

    def test_full_pool_of_held_rows(self):
        # Rows pulled and never pushed fill the pool: eviction keeps them
        # (kept_pulled) until they are returned, as the message says.
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, pool_size='16M', max_rows=1000, capacity=200000, "
                  "init='zeros')")
        n, err = 0, None
        while n < 2000000:
            ids = np.arange(n, n + 20000, dtype=np.int64).tobytes()
            try:
                c.execute("SELECT embkv_pull('t', ?)", (ids,)).fetchone()
            except sqlite3.OperationalError as e:
                err = str(e)
                break
            n += 20000
        self.assertIsNotNone(err)
        self.assertIn("push them, or return them with embkv_release, first", err)
        c.execute("SELECT embkv_checkpoint('t')").fetchone()
        got = json.loads(c.execute("SELECT embkv_evict('t')").fetchone()[0])
        self.assertEqual((got["over_max_rows"], got["kept_pulled"]), (0, n - 1000))
        c.execute("SELECT embkv_release('t', ?)", (np.arange(0, n, dtype=np.int64).tobytes(),)).fetchone()
        for _ in range(40):
            c.execute("SELECT embkv_checkpoint('t')").fetchone()
            got = json.loads(c.execute("SELECT embkv_evict('t')").fetchone()[0])
            if count(c, "t") <= 1000 and got["left"] == 0:
                break
        self.assertLessEqual(count(c, "t"), 1000)
        ids = np.arange(n, n + 20000, dtype=np.int64).tobytes()
        self.assertEqual(len(c.execute("SELECT embkv_pull('t', ?)", (ids,)).fetchone()[0]), 20000 * 16)
        c.close()


if __name__ == "__main__":
    unittest.main()
