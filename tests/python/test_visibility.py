"""Snapshot reads under concurrent writers, checked against a model.

The visibility rule (docs/sql.md, "Visibility"): a statement reads the table as of
one moment, so what it returns is the state after some prefix of the
committed COMMITs and pushes, and a later statement never sees a shorter
prefix.  The model here keeps the states the writer committed, in order; each
read must equal one of them, at or after the one the previous read matched.
Also: a replaced row is never missing, a row's vec and clock come from one
version, and a COMMIT never overwrites a row a concurrent pull created.
And in WAL mode, a reader whose read transaction began before another
connection's COMMIT is refused (SQLITE_BUSY_SNAPSHOT) rather than shown
that COMMIT's embkv rows beside the ordinary rows from before it."""
import itertools
import json
import os
import sqlite3
import threading
import time
import unittest

import numpy as np

from embkv_test import TempDirTest, connect

N = 100


def rounds(min_rounds, done, target, limit_s=90):
    """1, 2, ... while fewer than min_rounds, or while done() < target
    (a loaded machine reads slowly), for at most limit_s seconds."""
    deadline = time.time() + limit_s
    for k in itertools.count(1):
        if k > min_rounds and (done() >= target or time.time() > deadline):
            return
        yield k


def vec_blob(x, dim=2):
    return np.full(dim, x, dtype=np.float32).tobytes()


class TestSnapshotReads(TempDirTest):
    def setUp(self):
        super().setUp()
        self.a = connect(self.db, check_same_thread=False)
        self.a.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, capacity=1000)")
        self.b = connect(self.db, check_same_thread=False)

    def tearDown(self):
        self.a.close()
        self.b.close()
        super().tearDown()

    def run_pair(self, writer, reader):
        stop = threading.Event()
        errors = []

        def wrap(fn):
            def go():
                try:
                    fn(stop)
                except Exception as e:  # reported by the test thread
                    errors.append(e)
                    stop.set()
            return go

        tw = threading.Thread(target=wrap(writer))
        tr = threading.Thread(target=wrap(reader))
        tr.start()
        tw.start()
        tw.join()
        stop.set()
        tr.join()
        if errors:
            raise errors[0]

    def test_in_reads_see_whole_commits(self):
        with self.a:
            self.a.execute("BEGIN")
            self.a.executemany("INSERT INTO t(id, vec) VALUES (?, ?)", [(i, vec_blob(0)) for i in range(N)])
            self.a.execute("COMMIT")
        committed = [0]  # the model: value of every row after each COMMIT
        reads = []
        def writer(stop):
            for k in rounds(300, lambda: len(reads), 1000):
                self.a.execute("BEGIN")
                for i in range(N):
                    self.a.execute("UPDATE t SET vec = ? WHERE id = ?", (vec_blob(k), i))
                self.a.execute("COMMIT")
                committed.append(k)

        ids = json.dumps(list(range(N - 1, -1, -1)))

        def reader(stop):
            while not stop.is_set():
                rows = self.b.execute("SELECT id, vec FROM t WHERE id IN (SELECT value FROM json_each(?))",
                                      (ids,)).fetchall()
                reads.append(sorted({np.frombuffer(v, np.float32)[0] for _, v in rows}) + [len(rows)])

        self.run_pair(writer, reader)
        self.assertGreater(len(reads), 1000)
        last = 0
        for r in reads:
            *vals, n = r
            self.assertEqual(n, N)
            self.assertEqual(len(vals), 1, f"a read mixed transactions: values {vals}")
            self.assertIn(vals[0], committed)
            self.assertGreaterEqual(vals[0], last)  # never an older state
            last = vals[0]

    def test_scan_sees_whole_commits(self):
        with self.a:
            self.a.execute("BEGIN")
            self.a.executemany("INSERT INTO t(id, vec) VALUES (?, ?)", [(i, vec_blob(0)) for i in range(N)])
            self.a.execute("COMMIT")
        reads = []

        def writer(stop):
            # Each transaction deletes the even rows or puts them back: a scan
            # must see 50 or 100 rows, all with one value.
            for k in rounds(300, lambda: len(reads), 200):
                self.a.execute("BEGIN")
                if k % 2:
                    self.a.execute("DELETE FROM t WHERE id % 2 = 0")
                    self.a.execute("UPDATE t SET vec = ?", (vec_blob(k),))
                else:
                    self.a.executemany("INSERT INTO t(id, vec) VALUES (?, ?)",
                                       [(i, vec_blob(k)) for i in range(0, N, 2)])
                    self.a.execute("UPDATE t SET vec = ?", (vec_blob(k),))
                self.a.execute("COMMIT")

        def reader(stop):
            while not stop.is_set():
                rows = self.b.execute("SELECT id, vec FROM t").fetchall()
                reads.append((len(rows), {np.frombuffer(v, np.float32)[0] for _, v in rows}))

        self.run_pair(writer, reader)
        self.assertGreater(len(reads), 200)
        for n, vals in reads:
            self.assertIn(n, (N // 2, N))
            self.assertEqual(len(vals), 1, f"a scan mixed transactions: {n} rows, values {sorted(vals)[:5]}")
            k = int(next(iter(vals)))
            self.assertEqual(n, N // 2 if k % 2 else N)

    def test_point_reads_never_miss_a_replaced_row(self):
        self.a.execute("INSERT INTO t(id, vec) VALUES (1, ?)", (vec_blob(0),))
        misses = [0, 0]

        def writer(stop):
            for k in rounds(2000, lambda: misses[0], 1000):
                self.a.execute("INSERT OR REPLACE INTO t(id, vec) VALUES (1, ?)", (vec_blob(k),))

        def reader(stop):
            while not stop.is_set():
                row = self.b.execute("SELECT vec FROM t WHERE id = 1").fetchone()
                misses[0] += 1
                misses[1] += row is None

        self.run_pair(writer, reader)
        self.assertGreater(misses[0], 1000)
        self.assertEqual(misses[1], 0)
        self.assertEqual(self.b.execute("SELECT clock FROM t WHERE id = 1").fetchone()[0], 0)


class TestPushVisibility(TempDirTest):
    def test_vec_and_clock_from_one_version_and_whole_pushes(self):
        a = connect(self.db, check_same_thread=False)
        b = connect(self.db, check_same_thread=False)
        try:
            a.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, optimizer='sgd', lr=1, init='zeros')")
            ids = np.arange(N, dtype=np.int64)
            a.execute("SELECT embkv_pull('t', ?)", (ids.tobytes(),))
            grads = np.full((N, 4), -1, dtype=np.float32).tobytes()
            stop = threading.Event()
            reads = []

            def push():
                for _ in rounds(1500, lambda: len(reads), 100):
                    a.execute("SELECT embkv_push('t', ?, ?)", (ids.tobytes(), grads))
                stop.set()

            t = threading.Thread(target=push)
            t.start()
            q = ["SELECT id, vec, clock FROM t",
                 "SELECT id, vec, clock FROM t WHERE id IN (SELECT value FROM json_each(?))"]
            jids = json.dumps(list(range(N)))
            i = 0
            while not stop.is_set():
                sql = q[i % 2]
                rows = b.execute(sql, (jids,) if i % 2 else ()).fetchall()
                reads.append([(np.frombuffer(v, np.float32)[0], c) for _, v, c in rows])
                i += 1
            t.join()
            self.assertGreater(len(reads), 100)
            torn = sum(1 for r in reads for v, c in r if v != c)
            self.assertEqual(torn, 0, "vec and clock from different versions")
            mixed = sum(1 for r in reads if len({c for _, c in r}) != 1)
            self.assertEqual(mixed, 0, "a statement saw half a push")
        finally:
            a.close()
            b.close()


class TestCommitVersusPull(TempDirTest):
    def test_commit_never_overwrites_a_pulled_row(self):
        """B inserts a block of new ids and commits while A pulls the same
        ids (creating them from the initializer): each pulled row must stay
        as the pull made it (the COMMIT then fails with UNIQUE), or the pull
        must see B's row."""
        a = connect(self.db, check_same_thread=False)
        b = connect(self.db, check_same_thread=False)
        try:
            a.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, init='uniform(0,1)', seed=3, capacity=100000)")
            pulled = {}
            outcomes = {"ok": 0, "unique": 0}
            block = 1000
            for k in range(40):
                ids = list(range(k * block, (k + 1) * block))
                b.execute("BEGIN")
                b.executemany("INSERT INTO t(id, vec) VALUES (?, ?)", [(i, vec_blob(7)) for i in ids])
                go = threading.Event()

                def pull(ids=ids, k=k):
                    order = np.random.default_rng(k).permutation(np.array(ids, dtype=np.int64))
                    go.set()
                    for c in range(0, len(order), 50):
                        chunk = order[c:c + 50]
                        out = np.frombuffer(a.execute("SELECT embkv_pull('t', ?)", (chunk.tobytes(),)).fetchone()[0],
                                            np.float32).reshape(-1, 2)
                        for i, v in zip(chunk.tolist(), out[:, 0].tolist()):
                            if v < 1:
                                pulled.setdefault(i, v)

                t = threading.Thread(target=pull)
                t.start()
                go.wait()
                try:
                    b.execute("COMMIT")
                    outcomes["ok"] += 1
                except Exception as e:
                    self.assertIn("UNIQUE constraint failed", str(e))
                    outcomes["unique"] += 1
                    if b.in_transaction:
                        b.execute("ROLLBACK")
                t.join()
            self.assertGreater(outcomes["ok"] + outcomes["unique"], 0)
            ids = np.array(sorted(pulled), dtype=np.int64)
            self.assertGreater(len(ids), 100)
            now = np.frombuffer(b.execute("SELECT embkv_pull('t', ?)", (ids.tobytes(),)).fetchone()[0],
                                np.float32).reshape(-1, 2)[:, 0]
            want = np.array([pulled[i] for i in ids.tolist()], dtype=np.float32)
            overwritten = int(np.sum(now != want))
            self.assertEqual(overwritten, 0, f"{overwritten} pulled rows were overwritten by a COMMIT "
                                             f"({outcomes['ok']} COMMITs succeeded, {outcomes['unique']} failed)")
        finally:
            a.close()
            b.close()


class TestInsertThenDelete(TempDirTest):
    """A transaction that INSERTs an id and DELETEs it again changes
    nothing at COMMIT: a row a pull created meanwhile (and its pushes)
    stays; inserting it a third time is an INSERT of an id the store must
    not have, so that COMMIT fails with the UNIQUE error."""

    def test_pulled_row_survives(self):
        a, b = connect(self.db), connect(self.db)
        a.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, init='uniform(5,6)', seed=3, lr=1)")
        for k, stmts in enumerate((["DELETE FROM t WHERE id = {i}"],
                                   ["INSERT INTO t VALUES ({i}, '[0,0]')", "DELETE FROM t WHERE id = {i}"],
                                   ["INSERT INTO t VALUES ({i}, '[0,0]')", "UPDATE t SET vec = '[1,1]' WHERE id = {i}",
                                    "DELETE FROM t WHERE id = {i}"])):
            i = 50 + k
            a.execute("BEGIN")
            for sql in stmts:
                a.execute(sql.format(i=i))
            pulled = b.execute("SELECT embkv_json(embkv_pull('t', %d))" % i).fetchone()[0]
            b.execute("SELECT embkv_push('t', %d, '[1,1]')" % i).fetchall()
            a.execute("COMMIT")
            got = a.execute("SELECT clock, embkv_json(vec) FROM t WHERE id = ?", (i,)).fetchone()
            self.assertIsNotNone(got, stmts)
            want = [x - 1 for x in json.loads(pulled)]
            self.assertEqual(got[0], 1)
            np.testing.assert_allclose(json.loads(got[1]), want, rtol=1e-6)
        a.execute("BEGIN")
        a.execute("INSERT INTO t VALUES (60, '[0,0]')")
        a.execute("DELETE FROM t WHERE id = 60")
        b.execute("SELECT embkv_pull('t', 60)").fetchall()
        a.execute("INSERT INTO t VALUES (60, '[2,2]')")
        with self.assertRaisesRegex(Exception, "id 60 already exists|UNIQUE"):
            a.execute("COMMIT")
        if a.in_transaction:
            a.execute("ROLLBACK")
        self.assertEqual(a.execute("SELECT clock FROM t WHERE id = 60").fetchone()[0], 0)
        a.close()
        b.close()


class TestWalReaders(TempDirTest):
    """A COMMIT writes e (embkv) and p (ordinary) together; a reader in WAL
    mode whose snapshot is older must not join the new e with the old p."""

    STALE = ("embkv table e: a COMMIT of another connection changed it after this read transaction began (SQLite "
             "keeps a reader's snapshot in WAL mode, and the table cannot go back to it): end the read transaction "
             "(COMMIT or ROLLBACK, or finish the statement) and read again")

    def open(self, mode):
        self.w = connect(self.db, isolation_level=None)
        self.w.execute("PRAGMA journal_mode=%s" % mode)
        self.w.execute("CREATE VIRTUAL TABLE e USING embkv(dim=1)")
        self.w.execute("CREATE TABLE p(id INTEGER PRIMARY KEY, x)")
        self.n = 1
        self.w.execute("BEGIN")
        self.w.execute("INSERT INTO e VALUES (1, '[1]')")
        self.w.execute("INSERT INTO p VALUES (1, 1)")
        self.w.execute("COMMIT")
        self.r = connect(self.db, isolation_level=None, timeout=0.2)
        self.addCleanup(self.r.close)
        self.addCleanup(self.w.close)

    def commit_both(self):
        self.n += 1
        self.w.execute("BEGIN")
        self.w.execute("UPDATE e SET vec = json_array(?)", (self.n,))
        self.w.execute("UPDATE p SET x = ?", (self.n,))
        self.w.execute("COMMIT")

    def joined(self):
        return self.r.execute("SELECT p.x, embkv_json(e.vec) FROM p JOIN e USING (id)").fetchall()

    def test_a_statement_that_read_p_before_the_commit(self):
        self.open("wal")
        fired = []

        def hook(_):
            if not fired:
                fired.append(1)
                self.commit_both()  # (between p's read and e's first read)
            return 1
        self.r.create_function("hook", 1, hook)
        with self.assertRaises(sqlite3.OperationalError) as cm:
            self.r.execute("SELECT p.x, e.vec FROM p CROSS JOIN e ON e.id = p.id WHERE hook(p.id)").fetchall()
        self.assertEqual(str(cm.exception), self.STALE)
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_BUSY_SNAPSHOT)
        self.assertEqual(self.joined(), [(2, "[2]")])  # (the advice: read again)

    def test_a_read_transaction_across_a_commit(self):
        self.open("wal")
        self.r.execute("BEGIN")
        self.assertEqual(self.joined(), [(1, "[1]")])
        self.assertEqual(self.joined(), [(1, "[1]")])  # (no COMMIT between: read again)
        self.commit_both()
        self.assertEqual(self.r.execute("SELECT x FROM p").fetchall(), [(1,)])  # SQLite's snapshot
        with self.assertRaises(sqlite3.OperationalError) as cm:
            self.joined()
        self.assertEqual(str(cm.exception), self.STALE)
        self.r.execute("COMMIT")
        self.assertEqual(self.joined(), [(2, "[2]")])
        # A reader whose read transaction began after the COMMIT, and the
        # writer itself, read on.
        self.r.execute("BEGIN")
        self.assertEqual(self.joined(), [(2, "[2]")])
        self.r.execute("COMMIT")
        self.assertEqual(self.w.execute("SELECT embkv_json(vec) FROM e").fetchall(), [("[2]",)])

    def test_a_commit_that_failed_after_its_store_write(self):
        # SQLite's commit fails after the store was written (the seam of
        # test_commit.py): until the writer's transaction goes on or ends
        # (the rows are then put back), a reader waits for it, then is told
        # to run again, rather than read rows SQLite never committed; after,
        # the reader's transaction reads on, the old rows.
        self.open("wal")
        self.r.execute("BEGIN")
        self.assertEqual(self.joined(), [(1, "[1]")])
        os.environ["EMBKV_TEST_COMMIT"] = "busy"
        try:
            self.w.execute("BEGIN")
            self.w.execute("UPDATE e SET vec = json_array(9)")
            self.w.execute("UPDATE p SET x = 9")
            with self.assertRaises(sqlite3.OperationalError):
                self.w.execute("COMMIT")
        finally:
            del os.environ["EMBKV_TEST_COMMIT"]
        with self.assertRaises(sqlite3.OperationalError) as cm:
            self.joined()
        self.assertRegex(str(cm.exception), r"^embkv table e: a COMMIT of another connection is writing its store "
                         r"\(waited 10[0-9][0-9] ms\): run the statement again$")
        # The writer's own reads are not held up by its COMMIT, nor
        # refused for it: its transaction reads its writes.
        self.assertEqual(self.w.execute("SELECT embkv_json(vec) FROM e WHERE id = 1").fetchall(), [("[9]",)])
        self.w.execute("UPDATE e SET vec = json_array(10) WHERE id = 1")
        self.w.execute("ROLLBACK")
        self.assertEqual(self.joined(), [(1, "[1]")])
        self.r.execute("COMMIT")
        self.assertEqual(self.joined(), [(1, "[1]")])

    def test_rollback_journal_mode_needs_no_refusal(self):
        # The reader's lock holds the COMMIT off: it fails busy, and the
        # reader's transaction reads on.
        self.open("delete")
        self.r.execute("BEGIN")
        self.assertEqual(self.joined(), [(1, "[1]")])
        self.w.execute("PRAGMA busy_timeout=0")
        self.w.execute("BEGIN")
        # (a write that reads nothing: the writer's first read of e comes
        # after the refused COMMIT)
        self.w.execute("INSERT OR REPLACE INTO e VALUES (1, '[5]')")
        with self.assertRaises(sqlite3.OperationalError):
            self.w.execute("COMMIT")
        self.assertEqual(self.joined(), [(1, "[1]")])
        # (the refused COMMIT's number is in the writer's transaction: its
        # own reads go on, neither refused nor held up)
        self.assertEqual(self.w.execute("SELECT embkv_json(vec) FROM e").fetchall(), [("[5]",)])
        self.r.execute("COMMIT")
        self.w.execute("COMMIT")
        self.assertEqual(self.joined(), [(1, "[5]")])

if __name__ == "__main__":
    unittest.main()
