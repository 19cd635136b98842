"""The SSD tier from Python: a table ten times larger than its pool's
record space.

- Every row round-trips through a scan, IN batches and embkv_pull, bit for
  bit; rows count by tier ('pm' / 'ssd') and the counts match embkv_stats.
- UPDATE, DELETE and embkv_push (sgd, exact arithmetic) of log rows: the
  written row is back in the pool, the old log copy is garbage.
- embkv_lookahead queues the log rows of the next batch, and the pull that
  follows takes them from the stage.
- A reopen (a new connection, the store closed in between) shows the same.
- Damaged log records: count(*), SELECT id and GROUP BY tier still see
  every row (they read no record), reading a damaged row fails naming it
  and its segment, and DELETE removes it; every other row is intact.
- One COMMIT deleting half of a table whose pool holds half of it: the
  room its check made (demoting rows) stays its own while its reads of
  the rows' previous versions queue promotions; it deletes every row.

Standard library unittest plus numpy.  Run by tests/run.sh through
tests/python_run.sh, or by hand:
    EMBKV_EXT=build/embkv /usr/bin/python3 tests/python/test_tier.py -v
"""
import glob
import json
import os
import re
import sqlite3
import time
import unittest

import numpy as np

from embkv_test import TempDirTest as Base, connect

DIM = 16
N = 300000  # the pool's record space holds about 30000 rows of this size


def vec_of(ids):
    """Exactly representable float32 rows derived from the ids."""
    ids = np.asarray(ids, dtype=np.int64)
    return ((ids[:, None] % 4099).astype(np.float32) * 0.25
            + np.arange(DIM, dtype=np.float32)[None, :] - 3.0).astype(np.float32)


def blob(ids):
    return np.asarray(ids, dtype=np.int64).tobytes()


class TierTest(Base):
    def open(self):
        return connect(self.db)

    def create(self):
        conn = self.open()
        conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=%d, pool_size='16M', ssd_size='128M', "
                     "optimizer='sgd', lr=0.5, capacity=%d)" % (DIM, N))
        ids = np.arange(1, N + 1, dtype=np.int64)
        vecs = vec_of(ids)
        # A COMMIT writes at most what the pool can take after demotion: in rounds.
        for lo in range(0, N, 20000):
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO item(id, vec) VALUES (?, ?)",
                             ((int(i), v.tobytes()) for i, v in zip(ids[lo:lo + 20000], vecs[lo:lo + 20000])))
            conn.execute("COMMIT")
        return conn

    def tiers(self, conn):
        return dict(conn.execute("SELECT tier, count(*) FROM item GROUP BY tier").fetchall())

    def stats(self, conn):
        return json.loads(conn.execute("SELECT embkv_stats('item')").fetchone()[0])

    def check_all(self, conn, expect):
        """expect: {id: vector} for every row."""
        got = {}
        for i, b in conn.execute("SELECT id, vec FROM item"):
            got[i] = b
        self.assertEqual(len(got), len(expect))
        bad = [i for i, v in expect.items() if got.get(i) != v.tobytes()]
        self.assertEqual(bad[:5], [])
        rng = np.random.default_rng(5)
        ids = rng.choice(np.fromiter(expect.keys(), dtype=np.int64), size=4096, replace=False)
        # IN batch
        q = "SELECT id, vec FROM item WHERE id IN (%s)" % ",".join(str(int(i)) for i in ids[:1000])
        rows = dict(conn.execute(q).fetchall())
        self.assertEqual(len(rows), 1000)
        for i in ids[:1000]:
            self.assertEqual(rows[int(i)], expect[int(i)].tobytes())
        # pull (outside any permits: the table has no staleness bound)
        (b,) = conn.execute("SELECT embkv_pull('item', ?)", (blob(ids),)).fetchone()
        pulled = np.frombuffer(b, dtype=np.float32).reshape(len(ids), DIM)
        want = np.stack([expect[int(i)] for i in ids])
        self.assertTrue(np.array_equal(pulled, want))

    def test_larger_than_pool(self):
        conn = self.create()
        expect = dict(zip(range(1, N + 1), vec_of(np.arange(1, N + 1))))
        tiers = self.tiers(conn)
        self.assertEqual(sum(tiers.values()), N)
        self.assertGreater(tiers.get("ssd", 0), N * 8 // 10)  # ten times the pool's record space
        self.assertGreater(tiers.get("pm", 0), 1000)
        st = self.stats(conn)
        self.assertEqual(st["tiers"]["ssd"]["rows"], tiers["ssd"])
        self.assertEqual(st["tiers"]["pm"]["rows"], tiers["pm"])
        self.check_all(conn, expect)

        # log rows written by UPDATE, DELETE and push
        cold = [i for (i,) in conn.execute("SELECT id FROM item WHERE tier = 'ssd' ORDER BY id LIMIT 300")]
        self.assertEqual(len(cold), 300)
        upd, gone, pushed = cold[:100], cold[100:200], cold[200:]
        conn.execute("BEGIN")
        for i in upd:
            v = np.full(DIM, 7.5, np.float32) + np.float32(i % 13)
            conn.execute("UPDATE item SET vec = ? WHERE id = ?", (v.tobytes(), i))
            expect[i] = v
        conn.executemany("DELETE FROM item WHERE id = ?", ((i,) for i in gone))
        conn.execute("COMMIT")
        for i in gone:
            del expect[i]
        grads = np.tile(np.arange(DIM, dtype=np.float32), (len(pushed), 1)) - 4.0
        (n,) = conn.execute("SELECT embkv_push('item', ?, ?)", (blob(pushed), grads.tobytes())).fetchone()
        self.assertEqual(n, len(pushed))
        for k, i in enumerate(pushed):
            expect[i] = (expect[i] - np.float32(0.5) * grads[k]).astype(np.float32)  # sgd, exact here
        where = ",".join(map(str, upd + pushed))
        tier_of = dict(conn.execute("SELECT id, tier FROM item WHERE id IN (%s)" % where).fetchall())
        self.assertEqual(set(tier_of.values()), {"pm"})  # written rows live in the pool
        self.assertEqual(conn.execute("SELECT count(*) FROM item WHERE id IN (%s)"
                                      % ",".join(map(str, gone))).fetchone()[0], 0)
        clocks = dict(conn.execute("SELECT id, clock FROM item WHERE id IN (%s)" % where).fetchall())
        self.assertTrue(all(clocks[i] == 1 for i in upd + pushed))
        self.check_all(conn, expect)

        # look-ahead: the log rows of the next batch are queued once and the
        # pull finds them in the stage
        nxt = [i for (i,) in conn.execute("SELECT id FROM item WHERE tier = 'ssd' ORDER BY id DESC LIMIT 512")]
        (q,) = conn.execute("SELECT embkv_lookahead('item', ?)", (blob(nxt),)).fetchone()
        # (promotions of rows the checks above read run in the background:
        # one may bring a few of these into the pool before the call)
        self.assertTrue(480 <= q <= 512, q)
        (q2,) = conn.execute("SELECT embkv_lookahead('item', ?)", (blob(nxt),)).fetchone()
        self.assertEqual(q2, 0)
        (b,) = conn.execute("SELECT embkv_pull('item', ?)", (blob(nxt),)).fetchone()
        self.assertTrue(np.array_equal(np.frombuffer(b, np.float32).reshape(512, DIM),
                                       np.stack([expect[i] for i in nxt])))
        la = self.stats(conn)["tiers"]["ssd"]["lookahead"]
        self.assertEqual(la["queued"], q)
        self.assertEqual(la["hits"] + la["late"], q)
        conn.close()

        conn = self.open()
        tiers2 = self.tiers(conn)
        self.assertEqual(sum(tiers2.values()), N - 100)
        self.assertGreater(tiers2.get("ssd", 0), N * 7 // 10)
        self.check_all(conn, expect)
        conn.close()

    def test_reads_by_id_promote(self):
        """Rows read from the log twice by SQL point reads and IN lists, as
        by pulls, go back to the pool; rows a scan reads do not, however
        hot (their heat raised by lookups that read no record), nor rows
        not read at all."""
        self.create().close()
        conn = self.open()  # (the access statistics start from zero, and count from the open on)
        self.assertTrue(self.stats(conn)["heat"]["counting"])
        cold = [i for (i,) in conn.execute("SELECT id FROM item WHERE tier = 'ssd' ORDER BY id LIMIT 400")]
        point, listed, scanned, unread = cold[:100], cold[100:200], cold[200:300], cold[300:]

        def in_list(ids):
            return ",".join(map(str, ids))
        for _ in range(3):  # (ids only: found in the index, no record read)
            conn.execute("SELECT count(*) FROM item WHERE id IN (%s)" % in_list(scanned)).fetchone()
        conn.execute("SELECT count(vec) FROM item").fetchone()  # (first: what it offered is promoted first)
        for _ in range(2):
            for i in point:
                conn.execute("SELECT vec FROM item WHERE id = ?", (i,)).fetchone()
            conn.execute("SELECT count(vec) FROM item WHERE id IN (%s)" % in_list(listed)).fetchone()

        def tiers_of(ids):  # (the tier alone: read from the index)
            return dict(conn.execute("SELECT tier, count(*) FROM item WHERE id IN (%s) GROUP BY tier"
                                     % in_list(ids)).fetchall())
        deadline = time.monotonic() + 20
        while tiers_of(point + listed) != {"pm": 200} and time.monotonic() < deadline:
            time.sleep(0.05)  # (the tier's thread promotes in the background, in the order offered)
        self.assertEqual((tiers_of(point), tiers_of(listed), tiers_of(scanned), tiers_of(unread)),
                         ({"pm": 100}, {"pm": 100}, {"ssd": 100}, {"ssd": 100}))
        conn.close()

    def test_lost_segment_stats(self):
        """A segment file deleted by hand: the store opens, its rows there are
        errors, and embkv_stats stays within its ranges (garbage_fraction
        in [0, 1], not below 0 because live bytes exceed the files')."""
        n = 60000
        conn = self.open()
        conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=%d, pool_size='16M', ssd_size='256M')" % DIM)
        # until the log has two segment files (demotion runs in the
        # background: how far it got depends on the machine)
        lo = 0
        while lo < 10 * n and len(glob.glob(self.db + "-*.embkv/log/seg-*.log")) < 2:
            batch = np.arange(lo + 1, lo + 20001, dtype=np.int64)
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO item(id, vec) VALUES (?, ?)",
                             ((int(i), v.tobytes()) for i, v in zip(batch, vec_of(batch))))
            conn.execute("COMMIT")
            lo += 20000
        conn.close()
        segs = sorted(glob.glob(self.db + "-*.embkv/log/seg-*.log"))
        self.assertGreater(len(segs), 1)
        os.remove(segs[0])
        conn = self.open()
        st = json.loads(conn.execute("SELECT embkv_stats('item')").fetchone()[0])
        g = st["tiers"]["ssd"]["garbage_fraction"]
        self.assertTrue(0 <= g <= 1, st["tiers"]["ssd"])
        conn.close()

    def test_damaged_records(self):
        n = 60000  # about half of them in the log
        conn = self.open()
        conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=%d, pool_size='16M', ssd_size='64M')" % DIM)
        ids = np.arange(1, n + 1, dtype=np.int64)
        vecs = vec_of(ids)
        for lo in range(0, n, 20000):
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO item(id, vec) VALUES (?, ?)",
                             ((int(i), v.tobytes()) for i, v in zip(ids[lo:lo + 20000], vecs[lo:lo + 20000])))
            conn.execute("COMMIT")
        before = self.tiers(conn)
        self.assertGreater(before.get("ssd", 0), n // 4)
        conn.close()
        segs = sorted(glob.glob(self.db + "-*.embkv/log/seg-*.log"))
        self.assertGreater(len(segs), 0)
        for path in segs:  # every record of each segment's first block
            with open(path, "r+b") as f:
                f.seek(4096)
                block = bytearray(f.read(4096))
                f.seek(4096)
                f.write(bytes(b ^ 0x5A for b in block))

        conn = self.open()
        self.assertEqual(conn.execute("SELECT count(*) FROM item").fetchone()[0], n)
        after = self.tiers(conn)  # (demotion may go on in the background: not equal to before)
        self.assertEqual(sum(after.values()), n)
        self.assertGreater(after.get("ssd", 0), n // 4)
        listed = [i for (i,) in conn.execute("SELECT id FROM item ORDER BY id")]
        self.assertEqual(listed, list(range(1, n + 1)))
        cold = [i for (i,) in conn.execute("SELECT id FROM item WHERE tier = 'ssd'")]
        damaged = []
        for i in cold:
            try:
                (b,) = conn.execute("SELECT vec FROM item WHERE id = ?", (i,)).fetchone()
                self.assertEqual(b, vecs[i - 1].tobytes())
            except sqlite3.DatabaseError as e:
                msg = str(e)
                self.assertIn("id %d: its record in the SSD log is damaged" % i, msg)
                m = re.search(r"in seg-\d{10}\.log at offset (\d+)\): delete the row \(it can be deleted\) and "
                              r"write it again, or restore the store from a backup$", msg)
                self.assertTrue(m, msg)
                self.assertTrue(4096 <= int(m.group(1)) < 8192, msg)  # the damaged block
                damaged.append(i)
        self.assertGreater(len(damaged), 0)
        self.assertLess(len(damaged), 4096 // 64 * len(segs) + 1)
        # the clock alone reads the record too
        with self.assertRaises(sqlite3.DatabaseError):
            conn.execute("SELECT clock FROM item WHERE id = ?", (damaged[0],)).fetchone()
        conn.execute("DELETE FROM item WHERE id IN (%s)" % ",".join(map(str, damaged)))
        self.assertEqual(conn.execute("SELECT count(*) FROM item").fetchone()[0], n - len(damaged))
        gone = set(damaged)
        rows = conn.execute("SELECT id, vec FROM item").fetchall()
        self.assertEqual(len(rows), n - len(damaged))
        self.assertEqual([i for i, b in rows if i in gone or b != vecs[i - 1].tobytes()], [])
        conn.close()

        conn = self.open()
        self.assertEqual(conn.execute("SELECT count(*) FROM item").fetchone()[0], n - len(damaged))
        self.assertEqual(conn.execute("SELECT count(*) FROM item WHERE id IN (%s)"
                                      % ",".join(map(str, damaged))).fetchone()[0], 0)
        conn.close()



class FullLogTest(Base):
    def test_a_full_log_beside_an_open_select_says_so(self):
        """A SELECT left open keeps what compaction emptied: the full log's
        message says to end it (a checkpoint alone frees too little), and
        once it is closed a checkpoint makes the room."""
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=8, init='zeros', pool_size='16M', capacity=20000, "
                     "ssd_size='64M')")
        n = 60000
        for lo in range(0, n, 5000):
            ids = np.arange(lo, lo + 5000, dtype=np.int64)
            conn.execute("SELECT embkv_pull('t', ?)", (blob(ids),)).fetchone()
            conn.execute("SELECT embkv_push('t', ?, ?)", (blob(ids), np.ones((5000, 8), np.float32).tobytes()))
        conn.execute("SELECT embkv_checkpoint('t')")
        reader = connect(self.db)
        cur = reader.execute("SELECT id, vec FROM t")
        cur.fetchone()
        rng = np.random.default_rng(0)

        def step():
            ids = np.unique(rng.integers(0, n, 2000)).astype(np.int64)
            conn.execute("SELECT embkv_hotset('t', ?)", (blob(ids),)).fetchone()
            conn.execute("SELECT embkv_pull('t', ?)", (blob(ids),)).fetchone()
            conn.execute("SELECT embkv_push('t', ?, ?)", (blob(ids), np.zeros((len(ids), 8), np.float32).tobytes()))
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            for _ in range(2000):
                step()
        self.assertRegex(str(cm.exception), r"ssd_size reached: .*; open snapshots \(a long SELECT, an export, an "
                                            r"online backup\) keep what compaction emptied until they end: end them "
                                            r"first$")
        cur.close()
        reader.close()
        conn.execute("SELECT embkv_checkpoint('t')")
        for _ in range(5):
            step()  # (the advice followed: room again)
        conn.close()


class BigDeleteTest(Base):
    def test_delete_half_in_one_commit(self):
        dim = 256
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d, dtype='f16', pool_size='16M', ssd_size='64M', "
                     "capacity=20000)" % dim)
        rows = np.arange(dim, dtype=np.float32)[None, :] * 0.0 + (np.arange(12000, dtype=np.float32) % 97)[:, None]
        for lo in range(0, 12000, 1000):
            conn.execute("BEGIN")
            conn.executemany("INSERT INTO t(id, vec) VALUES (?, ?)",
                             ((i, rows[i].tobytes()) for i in range(lo, lo + 1000)))
            conn.execute("COMMIT")
        tiers = dict(conn.execute("SELECT tier, count(*) FROM t GROUP BY tier"))
        self.assertEqual(sum(tiers.values()), 12000)
        self.assertGreater(tiers.get("ssd", 0), 4000)
        conn.execute("BEGIN")
        conn.execute("DELETE FROM t WHERE id < 6000")
        conn.execute("COMMIT")
        self.assertEqual(conn.execute("SELECT count(*), min(id) FROM t").fetchone(), (6000, 6000))
        conn.close()
        conn = connect(self.db)
        self.assertEqual(conn.execute("SELECT count(*), min(id) FROM t").fetchone(), (6000, 6000))
        got = conn.execute("SELECT vec FROM t WHERE id = 11999").fetchone()[0]
        self.assertEqual(np.frombuffer(got, np.float32).tolist(), rows[11999].tolist())
        conn.close()

if __name__ == "__main__":
    unittest.main()
