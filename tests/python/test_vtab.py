"""The embkv virtual table from Python's sqlite3 module (and numpy).

Loading the extension; float32 vectors round-tripping bit for bit as numpy
BLOBs; batched reads with IN (SELECT value FROM json_each(?)); errors as
Python exceptions; two connections in two threads sharing one table (the
writes of one visible to the other after COMMIT, not before); a second
process refused with a message naming the store directory; an INSERT whose
id is taken before its COMMIT; temporary stores at exit and across fork();
a forked child refused; SIGKILL during a COMMIT while another connection
checkpoints.

Standard library unittest plus numpy (Debian's python3-numpy).  Run by
tests/run.sh through tests/python_run.sh, or by hand:
    EMBKV_EXT=build/embkv /usr/bin/python3 tests/python/test_vtab.py -v
"""
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
import unittest

import numpy as np

from embkv_test import EXT, TempDirTest as Base, connect


class TestLoad(Base):
    def test_load_without_entry_point(self):
        conn = connect(self.db)
        mods = {r[0] for r in conn.execute("SELECT name FROM pragma_module_list WHERE name GLOB 'embkv*'")}
        self.assertEqual(mods, {"embkv", "embkv_heat", "embkv_knn", "embkv_pending"})
        conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=8, pool_size='16M')")
        self.assertEqual(conn.execute("SELECT count(*) FROM item").fetchone(), (0,))
        conn.close()


class TestNumpy(Base):
    DIM = 16

    def setUp(self):
        super().setUp()
        self.conn = connect(self.db)
        self.conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=%d, pool_size='16M')" % self.DIM)

    def tearDown(self):
        self.conn.close()
        super().tearDown()

    def test_roundtrip_bits(self):
        rng = np.random.default_rng(7)
        n = 500
        ids = rng.choice(np.arange(-(2 ** 62), 2 ** 62, 2 ** 50, dtype=np.int64), n, replace=False)
        vecs = rng.standard_normal((n, self.DIM)).astype(np.float32)
        # awkward values: signed zero, subnormals, the largest float32
        vecs[0, :4] = [-0.0, np.float32(1e-45), np.finfo(np.float32).max, -np.finfo(np.float32).tiny]
        with_tx(self.conn, lambda c: c.executemany(
            "INSERT INTO item(id, vec) VALUES (?, ?)", zip(map(int, ids), (v.tobytes() for v in vecs))))
        # one batch: IN (SELECT value FROM json_each(?)), any order, duplicates, missing ids
        want = list(map(int, ids[::-1])) + [int(ids[3]), 12345]
        rows = self.conn.execute("SELECT id, vec FROM item WHERE id IN (SELECT value FROM json_each(?))",
                                 (json.dumps(want),)).fetchall()
        self.assertEqual(len(rows), n)
        got = {i: np.frombuffer(b, dtype=np.float32) for i, b in rows}
        for i, v in zip(ids, vecs):
            self.assertTrue(np.array_equal(got[int(i)].view(np.uint32), v.view(np.uint32)), int(i))
        plan = self.conn.execute("EXPLAIN QUERY PLAN SELECT id, vec FROM item WHERE id IN "
                                 "(SELECT value FROM json_each(?))", ("[]",)).fetchall()
        self.assertIn("INDEX 2:in-batch", plan[0][3])
        # point lookup of every row, and a full scan
        for i, v in zip(ids[:50], vecs[:50]):
            (b,) = self.conn.execute("SELECT vec FROM item WHERE id = ?", (int(i),)).fetchone()
            self.assertEqual(b, v.tobytes())
        scanned = dict(self.conn.execute("SELECT id, vec FROM item"))
        self.assertEqual(set(scanned), set(map(int, ids)))

    def test_json_input_rounds_to_float32(self):
        x = [0.1, -1 / 3, 1e-8, 3e38, 16777217, -2.5, 0, 1] + [0.5] * (self.DIM - 8)
        self.conn.execute("INSERT INTO item(id, vec) VALUES (1, ?)", (json.dumps(x),))
        (b,) = self.conn.execute("SELECT vec FROM item WHERE id = 1").fetchone()
        self.assertTrue(np.array_equal(np.frombuffer(b, np.float32), np.array(x, dtype=np.float32)))

    def test_errors_are_exceptions(self):
        self.conn.execute("INSERT INTO item(id, vec) VALUES (1, ?)", (np.zeros(self.DIM, np.float32).tobytes(),))
        with self.assertRaises(sqlite3.IntegrityError) as cm:
            self.conn.execute("INSERT INTO item(id, vec) VALUES (1, ?)", (np.ones(self.DIM, np.float32).tobytes(),))
        self.assertEqual(str(cm.exception), "embkv table item: id 1 already exists (UNIQUE constraint failed: item.id)")
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            self.conn.execute("INSERT INTO item(id, vec) VALUES (2, ?)", (np.zeros(3, np.float32).tobytes(),))
        self.assertEqual(str(cm.exception), "embkv table item: id 2: vector must be 16 float32 (64-byte BLOB) "
                                            "or a JSON array of 16 numbers, got a 12-byte BLOB")
        bad = np.zeros(self.DIM, np.float32)
        bad[5] = np.nan
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            self.conn.execute("INSERT INTO item(id, vec) VALUES (3, ?)", (bad.tobytes(),))
        self.assertIn("id 3: vec[5] is NaN", str(cm.exception))
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            self.conn.execute("INSERT INTO item(id, vec) VALUES (?, ?)", ("12a", bad.tobytes()))
        self.assertIn("id must be an INTEGER, got TEXT '12a'", str(cm.exception))
        self.assertEqual(self.conn.execute("SELECT count(*) FROM item").fetchone(), (1,))
        # numpy integers bind as INTEGER once converted: int(np.int64(...))
        self.conn.execute("INSERT INTO item(id, vec) VALUES (?, ?)",
                          (int(np.int64(4)), np.ones(self.DIM, np.float32).tobytes()))
        self.assertEqual(self.conn.execute("SELECT count(*) FROM item").fetchone(), (2,))

    def test_context_manager_rolls_back(self):
        conn = connect(self.db, isolation_level="DEFERRED")
        try:
            with self.assertRaises(sqlite3.DatabaseError):
                with conn:
                    conn.execute("INSERT INTO item(id, vec) VALUES (10, ?)", (np.ones(self.DIM, np.float32).tobytes(),))
                    conn.execute("INSERT INTO item(id, vec) VALUES (11, 'oops')")
            self.assertEqual(conn.execute("SELECT count(*) FROM item").fetchone(), (0,))
            with conn:
                conn.execute("INSERT INTO item(id, vec) VALUES (10, ?)", (np.ones(self.DIM, np.float32).tobytes(),))
            self.assertEqual(self.conn.execute("SELECT count(*) FROM item").fetchone(), (1,))
        finally:
            conn.close()


class TestRolledBackCreate(Base):
    def test_cached_statement_keeps_no_table(self):
        """A CREATE rolled back while Python's statement cache keeps an
        instance of the table: the functions naming it fail as SQL does
        (never write into the store the rollback removes), and a new
        CREATE works."""
        for path in (os.path.join(self.dir, "g.db"), ":memory:"):
            c = connect(path)
            c.execute("BEGIN")
            c.execute("CREATE VIRTUAL TABLE g USING embkv(dim=2, init='zeros')")
            c.execute("SELECT * FROM g").fetchall()  # cached: the instance stays
            c.execute("ROLLBACK")
            for q in ("SELECT embkv_push('g', '[5]', '[1,1]')", "SELECT id FROM embkv_knn('g', '[0,0]', 5)",
                      "SELECT embkv_checkpoint('g')", "SELECT embkv_stats('g')"):
                with self.assertRaises(sqlite3.OperationalError) as cm:
                    c.execute(q).fetchall()
                self.assertIn("no such table: g (its CREATE was rolled back)", str(cm.exception))
            c.execute("CREATE VIRTUAL TABLE g USING embkv(dim=2, init='zeros')")
            self.assertEqual(c.execute("SELECT embkv_push('g', '[5]', '[1,1]')").fetchone(), (1,))
            self.assertEqual(c.execute("SELECT id FROM embkv_knn('g', '[0,0]', 5)").fetchall(), [(5,)])
            c.close()

    def test_same_path_with_other_options(self):
        """A CREATE with path= rolled back while a cached statement keeps
        its store open: a CREATE of the same path with another dim is told
        that store belongs to a dropped table (not only that the dims
        differ), and once the connection closes the CREATE works."""
        db = os.path.join(self.dir, "f.db")
        c = connect(db)
        c.execute("BEGIN")
        c.execute("CREATE VIRTUAL TABLE f USING embkv(dim=2, path='fdir')")
        c.execute("INSERT INTO f VALUES (1, '[1,1]')")
        c.execute("ROLLBACK")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            c.execute("CREATE VIRTUAL TABLE f USING embkv(dim=3, path='fdir')")
        self.assertEqual(str(cm.exception), "embkv table f: cannot open its store: store %s: has dim 2, dim 3 "
                         "requested (that store belongs to a dropped table and is still open in this process: a "
                         "prepared statement may still hold that table: finalize it, or close the connection)"
                         % os.path.realpath(os.path.join(self.dir, "fdir")))
        c.close()
        c = connect(db)
        c.execute("CREATE VIRTUAL TABLE f USING embkv(dim=3, path='fdir')")
        c.execute("INSERT INTO f VALUES (1, '[1,2,3]')")
        self.assertEqual(c.execute("SELECT embkv_json(vec) FROM f").fetchone(), ("[1,2,3]",))
        c.close()


def with_tx(conn, fn):
    conn.execute("BEGIN")
    try:
        fn(conn)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class TestThreads(Base):
    def test_two_connections_two_threads(self):
        setup = connect(self.db)
        setup.execute("CREATE VIRTUAL TABLE item USING embkv(dim=4, pool_size='16M')")
        setup.execute("INSERT INTO item(id, vec) VALUES (1, '[1,1,1,1]')")
        setup.close()

        step = [threading.Event() for _ in range(4)]
        seen = {}
        errors = []

        def writer():
            try:
                conn = connect(self.db)
                conn.execute("BEGIN")
                conn.execute("INSERT INTO item(id, vec) VALUES (2, '[2,2,2,2]')")
                conn.execute("UPDATE item SET vec = '[9,9,9,9]' WHERE id = 1")
                seen["writer-own"] = conn.execute("SELECT id, embkv_json(vec) FROM item ORDER BY id").fetchall()
                seen["writer-path"] = conn.execute("SELECT json_extract(embkv_stats('item'), '$.path')").fetchone()[0]
                step[0].set()
                step[1].wait(30)
                conn.execute("COMMIT")
                step[2].set()
                step[3].wait(30)
                seen["writer-after"] = conn.execute("SELECT id FROM item ORDER BY id").fetchall()
                conn.close()
            except Exception as e:  # pragma: no cover
                errors.append(repr(e))
                for s in step:
                    s.set()

        def reader():
            try:
                conn = connect(self.db)
                step[0].wait(30)
                seen["reader-before"] = conn.execute("SELECT id, embkv_json(vec) FROM item ORDER BY id").fetchall()
                seen["reader-before-in"] = conn.execute(
                    "SELECT id, embkv_json(vec) FROM item WHERE id IN (1, 2) ORDER BY id").fetchall()
                seen["reader-path"] = conn.execute("SELECT json_extract(embkv_stats('item'), '$.path')").fetchone()[0]
                step[1].set()
                step[2].wait(30)
                seen["reader-after"] = conn.execute("SELECT id, embkv_json(vec), clock FROM item ORDER BY id").fetchall()
                conn.execute("INSERT INTO item(id, vec) VALUES (3, '[3,3,3,3]')")
                step[3].set()
                conn.close()
            except Exception as e:  # pragma: no cover
                errors.append(repr(e))
                for s in step:
                    s.set()

        threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(seen["writer-own"], [(1, "[9,9,9,9]"), (2, "[2,2,2,2]")])
        self.assertEqual(seen["reader-before"], [(1, "[1,1,1,1]")])
        self.assertEqual(seen["reader-before-in"], [(1, "[1,1,1,1]")])
        self.assertEqual(seen["reader-after"], [(1, "[9,9,9,9]", 1), (2, "[2,2,2,2]", 0)])
        self.assertEqual(seen["writer-after"], [(1,), (2,), (3,)])
        self.assertEqual(seen["writer-path"], seen["reader-path"])  # one store, shared

    def test_concurrent_autocommit_writers(self):
        setup = connect(self.db)
        setup.execute("CREATE VIRTUAL TABLE item USING embkv(dim=4, pool_size='16M')")
        setup.close()
        errors = []

        def work(base):
            try:
                conn = connect(self.db)
                for i in range(200):
                    conn.execute("INSERT INTO item(id, vec) VALUES (?, ?)",
                                 (base + i, np.full(4, base + i, np.float32).tobytes()))
                    if i % 50 == 0:
                        conn.execute("SELECT count(*) FROM item").fetchone()
                conn.close()
            except Exception as e:  # pragma: no cover
                errors.append(repr(e))

        threads = [threading.Thread(target=work, args=(k * 1000,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        conn = connect(self.db)
        rows = conn.execute("SELECT id, vec FROM item").fetchall()
        self.assertEqual(len(rows), 600)
        for i, b in rows:
            self.assertTrue(np.all(np.frombuffer(b, np.float32) == i))
        conn.close()


class TestInsertRaces(Base):
    """An INSERT of a free id, committed after someone else took the id: a
    pull creating it, or a table of another database on the same store."""

    def setUp(self):
        super().setUp()
        store = os.path.join(self.dir, "shared.embkv")
        self.a, self.b = connect(self.db), connect(os.path.join(self.dir, "other.db"))
        for conn in (self.a, self.b):
            conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=1, init='zeros', path=?)".replace("?", "'%s'" % store))

    def tearDown(self):
        self.a.close()
        self.b.close()
        super().tearDown()

    def rows(self, conn):
        return conn.execute("SELECT id, embkv_json(vec), clock FROM t ORDER BY id").fetchall()

    def test_commit_fails_when_a_pull_created_the_row(self):
        self.a.execute("BEGIN")
        self.a.execute("INSERT INTO t VALUES (5, '[5]')")
        self.b.execute("SELECT embkv_pull('t', 5)")
        self.b.execute("SELECT embkv_push('t', 5, '[1]')")
        with self.assertRaises(sqlite3.IntegrityError) as cm:
            self.a.execute("COMMIT")
        self.assertEqual(str(cm.exception), "embkv table t: COMMIT failed at id 5: the row was created by another "
                         "connection or a pull after this transaction inserted it (UNIQUE constraint failed); "
                         "nothing was written")
        self.assertFalse(self.a.in_transaction)
        self.assertEqual(self.rows(self.a), [(5, "[-0.01]", 1)])   # the pushed row, not overwritten

    def test_commit_fails_when_another_table_on_the_store_inserted(self):
        self.a.execute("BEGIN")
        self.a.execute("INSERT INTO t VALUES (5, '[5]'), (6, '[6]')")
        self.b.execute("INSERT INTO t VALUES (6, '[60]')")
        with self.assertRaises(sqlite3.IntegrityError):
            self.a.execute("COMMIT")
        self.assertEqual(self.rows(self.a), [(6, "[60]", 0)])

    def test_replace_and_reinsert_still_replace(self):
        self.a.execute("INSERT INTO t VALUES (7, '[7]')")
        self.a.execute("BEGIN")
        self.a.execute("INSERT OR REPLACE INTO t VALUES (8, '[8]')")   # free now
        self.a.execute("DELETE FROM t WHERE id = 7")
        self.a.execute("INSERT INTO t VALUES (7, '[70]')")             # this transaction's delete
        self.b.execute("INSERT INTO t VALUES (8, '[80]')")
        self.a.execute("COMMIT")
        self.assertEqual(self.rows(self.b), [(7, "[70]", 0), (8, "[8]", 0)])


EXIT_WITHOUT_CLOSING = r"""
import ctypes, os, sqlite3, sys
conn = sqlite3.connect(":memory:")
conn.enable_load_extension(True)
conn.load_extension(sys.argv[1])
conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2)")
conn.execute("INSERT INTO t VALUES (1, '[1,2]')")
if sys.argv[2].startswith("fork"):
    pid = os.fork()
    if pid == 0:
        if sys.argv[2] == "fork-c":
            ctypes.CDLL(None).exit(0)   # C's exit(): atexit handlers, no connection closed
        sys.exit(0)                     # Python's: the inherited connection is closed, then exit()
    os.waitpid(pid, 0)
    conn.execute("INSERT INTO t VALUES (2, '[3,4]')")
    print(sorted(os.listdir(os.environ["TMPDIR"])) != [],
          conn.execute("SELECT group_concat(embkv_json(vec), ' ') FROM (SELECT vec FROM t ORDER BY id)").fetchone()[0])
    sys.stdout.flush()
ctypes.CDLL(None).exit(3)           # no connection closed
"""


class TestTemporaryStores(Base):
    def run_child(self, mode):
        tmp = os.path.join(self.dir, "tmp")
        os.makedirs(tmp, exist_ok=True)
        out = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_CLOSING, EXT, mode], capture_output=True,
                             text=True, timeout=60, env=dict(os.environ, TMPDIR=tmp))
        self.assertEqual(out.returncode, 3, out.stderr)
        return out.stdout, os.listdir(tmp)

    def test_exit_without_closing_removes_them(self):
        self.assertEqual(self.run_child("plain"), ("", []))

    def test_a_forked_child_exiting_leaves_the_parents(self):
        for mode in ("fork-c", "fork-py"):
            with self.subTest(mode=mode):
                self.assertEqual(self.run_child(mode), ("True [1,2] [3,4]\n", []))


# The parent of the fork scripts: a connection to argv[2] with argv[1]
# loaded, its pid written first on standard error (out_pid).
FORK_PARENT = r"""
import os, sqlite3, sys
def conn():
    c = sqlite3.connect(sys.argv[2], isolation_level=None)
    c.enable_load_extension(True)
    c.load_extension(sys.argv[1])
    return c
parent = conn()
sys.stderr.write("pid %d\n" % os.getpid())
"""

FORKED_OPEN = FORK_PARENT + r"""
parent.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, path='forked.embkv')")
parent.execute("INSERT INTO t VALUES (1, '[1,1]')")
pid = os.fork()
if pid == 0:
    try:
        c = sqlite3.connect(sys.argv[2], isolation_level=None, timeout=0)
        c.enable_load_extension(True)
        c.load_extension(sys.argv[1])
        c.execute("INSERT INTO t VALUES (100, '[5,5]')")
        print("child wrote")
    except sqlite3.Error as e:
        print("child refused:", e)
    sys.stdout.flush()
    os._exit(0)
os.waitpid(pid, 0)
parent.execute("INSERT INTO t VALUES (2, '[2,2]')")
parent.close()
print(conn().execute("SELECT group_concat(id || ':' || embkv_json(vec), ' ') FROM (SELECT * FROM t ORDER BY id)").fetchone()[0])
"""


def out_pid(out):
    """The pid a child script wrote first on its standard error."""
    return int(out.stderr.split()[1])


class TestForkedChild(Base):
    def test_a_new_connection_in_a_forked_child_is_refused(self):
        out = subprocess.run([sys.executable, "-c", FORKED_OPEN, EXT, self.db], capture_output=True, text=True,
                             timeout=60, cwd=self.dir)
        self.assertEqual(out.returncode, 0, out.stderr)
        store = os.path.join(os.path.realpath(self.dir), "forked.embkv")
        self.assertEqual(out.stdout, "child refused: embkv table t: cannot open its store: store %s is open in another "
                         "process (pid %d): one process at a time may write a store (waited 0 ms, the connection's busy "
                         "timeout): to read it beside that process, open this database read-only (sqlite3 -readonly, "
                         "a file:...?mode=ro URI, or PRAGMA query_only=1 before the table's first use); to write, "
                         "close it there\n1:[1,1] 2:[2,2]\n"
                         % (store, out_pid(out)))


FORKED_INHERITED = FORK_PARENT + r"""
parent.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, path='inherited.embkv', init='zeros', lr=1)")
parent.execute("INSERT INTO t VALUES (1, '[1,1]')")
parent.execute("SELECT embkv_pull('t', '[1, 2]')").fetchone()
parent.execute("SELECT embkv_push('t', '[1, 2]', '[1,1,1,1]')").fetchone()
parent.execute("SELECT embkv_checkpoint('t')").fetchone()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    # what a DataLoader worker would do with the connection it inherited
    for sql in ("SELECT embkv_pull('t', '[3]')", "SELECT embkv_pull('t', '[1]')",
                "SELECT embkv_push('t', '[1]', '[1,1]')", "INSERT INTO t VALUES (100, '[5,5]')",
                "SELECT count(*) FROM t", "SELECT embkv_checkpoint('t')"):
        try:
            parent.execute(sql).fetchall()
            os.write(w, b"child did: %s\n" % sql.encode())
        except sqlite3.Error as e:
            os.write(w, b"child refused: %d %s\n" % (e.sqlite_errorcode, str(e).encode()))
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
with os.fdopen(r) as fh:
    sys.stdout.write(fh.read())
parent.execute("SELECT embkv_push('t', '[1]', '[1,1]')").fetchone()
parent.close()
print(conn().execute("SELECT group_concat(id || ':' || embkv_json(vec) || ':' || clock, ' ') "
                     "FROM (SELECT id, vec, clock FROM t ORDER BY id)").fetchone()[0])
"""


class TestInheritedConnection(Base):
    def test_a_forked_child_may_not_use_its_parents_connection(self):
        """Reads, pulls, pushes, an INSERT and a checkpoint through the
        handle a fork inherited are refused (SQLITE_READONLY); the parent
        goes on and the store reopens with exactly its rows."""
        out = subprocess.run([sys.executable, "-c", FORKED_INHERITED, EXT, self.db], capture_output=True, text=True,
                             timeout=60, cwd=self.dir)
        self.assertEqual(out.returncode, 0, out.stderr)
        pid = out_pid(out)
        lines = out.stdout.splitlines()
        self.assertEqual(len(lines), 7, out.stdout)
        tail = " was opened by process %d, and this process (" % pid
        for line in lines[:6]:
            self.assertTrue(line.startswith("child refused: 8 ") and tail in line, line)
        # (the function is named once, not again by the engine's message)
        self.assertTrue(lines[0].startswith("child refused: 8 embkv_pull: table t: store "), lines[0])
        self.assertEqual(lines[6], "1:[-1,-1]:2 2:[-1,-1]:1")


COMMIT_UNDER_CHECKPOINTS = r"""
import os, sqlite3, sys, threading
def conn():
    c = sqlite3.connect(sys.argv[2], isolation_level=None, check_same_thread=False)
    c.enable_load_extension(True)
    c.load_extension(sys.argv[1])
    return c
n = int(sys.argv[3])
c, other = conn(), conn()
def checkpoints():
    while True:
        other.execute("SELECT embkv_checkpoint('t')").fetchone()
threading.Thread(target=checkpoints, daemon=True).start()
c.execute("BEGIN")
c.execute("UPDATE t SET vec = '[2,2]'")
c.executemany("INSERT INTO t VALUES (?, '[2,2]')", ((1000 + i,) for i in range(n)))
print("committing", flush=True)
c.execute("COMMIT")
print("committed", flush=True)
threading.Event().wait()
"""


class TestCrashDuringCommit(Base):
    """SIGKILL during a COMMIT while another connection checkpoints the same
    store in a loop: the reopened table holds the old state or the new one,
    never part of the transaction."""

    def test_no_half_transaction(self):
        n = 20000
        for trial in range(4):
            with self.subTest(trial=trial):
                if os.path.exists(self.db):
                    conn = connect(self.db)
                    conn.execute("DROP TABLE t")
                    conn.close()
                conn = connect(self.db)
                conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, capacity=1000)")
                conn.execute("WITH RECURSIVE c(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM c WHERE i < 499) "
                             "INSERT INTO t SELECT i, '[1,1]' FROM c")
                conn.close()
                child = subprocess.Popen([sys.executable, "-c", COMMIT_UNDER_CHECKPOINTS, EXT, self.db, str(n)],
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                try:
                    self.assertEqual(child.stdout.readline(), "committing\n")
                    time.sleep(0.01 * trial)
                finally:
                    child.kill()
                    child.wait(30)
                    child.stdout.close()
                    child.stderr.close()
                conn = connect(self.db)
                state = conn.execute("SELECT count(*), sum(id >= 1000), sum(embkv_json(vec) = '[2,2]') "
                                     "FROM t").fetchone()
                conn.close()
                self.assertIn(state, [(500, 0, 0), (500 + n, n, 500 + n)])


class TestModel(Base):
    """Random writes, transactions and savepoints on an embkv table and, in
    the same statements' transactions, on an ordinary table: after every
    step both hold the same rows.  Failing statements (a conflict, a bad
    vector in the middle of an INSERT ... SELECT) must leave both as they
    were."""

    def test_against_plain_table(self):
        seed = int(os.environ.get("EMBKV_TEST_SEED", "20260"))
        rng = np.random.default_rng(seed)
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, pool_size='16M')")
        conn.execute("CREATE TABLE p(id INTEGER PRIMARY KEY, vec BLOB NOT NULL CHECK (length(vec) = 16))")
        conn.execute("CREATE TABLE src(k INTEGER PRIMARY KEY, id INTEGER, vec BLOB)")
        depth = []          # open savepoint names
        in_txn = False

        def vec():
            return rng.integers(-50, 50, 4).astype(np.float32).tobytes()

        def both(sql, args=()):
            """Runs sql on t and on p; both must succeed or both fail."""
            errs = []
            for table in ("t", "p"):
                try:
                    conn.execute(sql.replace("{T}", table), args)
                    errs.append(None)
                except sqlite3.Error as e:
                    errs.append(type(e).__name__)
            self.assertEqual(errs[0] is None, errs[1] is None, (seed, sql, args, errs))

        for step in range(1500):
            r = rng.random()
            i = int(rng.integers(0, 40))
            if r < 0.25:
                mode = rng.choice(["", "OR REPLACE ", "OR IGNORE "])
                both("INSERT %sINTO {T}(id, vec) VALUES (?, ?)" % mode, (i, vec()))
            elif r < 0.40:
                both("UPDATE {T} SET vec = ? WHERE id = ?", (vec(), i))
            elif r < 0.47:
                j = int(rng.integers(0, 40))
                mode = rng.choice(["", "OR REPLACE ", "OR IGNORE "])
                both("UPDATE %s{T} SET id = ? WHERE id = ?" % mode, (j, i))
            elif r < 0.57:
                both("DELETE FROM {T} WHERE id IN (?, ?)", (i, int(rng.integers(0, 40))))
            elif r < 0.62:
                # INSERT ... SELECT whose k-th row may be bad
                n = int(rng.integers(1, 6))
                bad = int(rng.integers(0, n + 2))
                conn.execute("DELETE FROM src")
                for k in range(n):
                    conn.execute("INSERT INTO src VALUES (?, ?, ?)",
                                 (k, int(rng.integers(40, 80)), b"x" if k == bad else vec()))
                # (OR IGNORE would skip the plain table's CHECK failure; a bad
                # vector is an error for embkv, like a datatype mismatch)
                mode = rng.choice(["", "OR REPLACE "] + (["OR IGNORE "] if bad >= n else []))
                both("INSERT %sINTO {T}(id, vec) SELECT id, vec FROM src ORDER BY k" % mode)
            elif r < 0.64:
                both("UPDATE {T} SET vec = CASE WHEN id = ? THEN x'00' ELSE vec END", (i,))
            elif r < 0.72:
                if not in_txn:
                    conn.execute("BEGIN")
                    in_txn = True
                else:
                    name = "s%d" % len(depth)
                    conn.execute("SAVEPOINT " + name)
                    depth.append(name)
            elif r < 0.80 and depth:
                k = int(rng.integers(0, len(depth)))
                if rng.random() < 0.5:
                    conn.execute("ROLLBACK TO " + depth[k])
                    del depth[k + 1:]
                else:
                    conn.execute("RELEASE " + depth[k])
                    del depth[k:]
            elif r < 0.86 and in_txn:
                conn.execute("COMMIT" if rng.random() < 0.6 else "ROLLBACK")
                in_txn = False
                depth = []
            got = conn.execute("SELECT id, vec FROM t ORDER BY id").fetchall()
            want = conn.execute("SELECT id, vec FROM p ORDER BY id").fetchall()
            self.assertEqual(got, want, "seed %d step %d" % (seed, step))
            if step % 50 == 0:
                ids = json.dumps([int(x) for x in rng.integers(0, 80, 20)])
                q = "SELECT id, vec FROM %s WHERE id IN (SELECT value FROM json_each(?)) ORDER BY id"
                self.assertEqual(conn.execute(q % "t", (ids,)).fetchall(), conn.execute(q % "p", (ids,)).fetchall())
                self.assertEqual(conn.execute("SELECT count(*) FROM t").fetchone(),
                                 conn.execute("SELECT count(*) FROM p").fetchone())
        if in_txn:
            conn.execute("COMMIT")
        want = conn.execute("SELECT id, vec FROM p ORDER BY id").fetchall()
        conn.close()
        conn = connect(self.db)  # what was committed is what a new connection sees
        self.assertEqual(conn.execute("SELECT id, vec FROM t ORDER BY id").fetchall(), want)
        conn.close()


CHILD = r"""
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], timeout=float(sys.argv[3]) if len(sys.argv) > 3 else 5.0)
conn.enable_load_extension(True)
conn.load_extension(sys.argv[2])
try:
    print(conn.execute("SELECT count(*) FROM item").fetchone()[0])
except sqlite3.Error as e:
    print("ERROR", type(e).__name__, e)
"""


class TestSecondProcess(Base):
    def test_refused_with_the_directory_named(self):
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=4, pool_size='16M')")
        conn.execute("INSERT INTO item(id, vec) VALUES (1, '[1,2,3,4]')")
        path = conn.execute("SELECT json_extract(embkv_stats('item'), '$.path')").fetchone()[0]
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", CHILD, self.db, EXT, "0.3"], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(),
                         "ERROR OperationalError embkv table item: cannot open its store: "
                         "store %s is open in another process (pid %d): one process at a time may write a store "
                         "(waited 300 ms, the connection's busy timeout): to read it beside that process, open this "
                         "database read-only (sqlite3 -readonly, a file:...?mode=ro URI, or PRAGMA query_only=1 "
                         "before the table's first use); to write, close it there"
                         % (path, os.getpid()))
        self.assertGreaterEqual(time.time() - t0, 0.3)
        # the table is untouched, and the child gets in once this process lets go
        self.assertEqual(conn.execute("SELECT count(*) FROM item").fetchone(), (1,))
        conn.close()
        out = subprocess.run([sys.executable, "-c", CHILD, self.db, EXT], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(out.stdout.strip(), "1", out.stderr)

    def test_waits_for_the_busy_timeout(self):
        """A second process waits, as for a SQLite lock, and gets in when the
        first lets go within its busy timeout."""
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=4, pool_size='16M')")
        conn.execute("INSERT INTO item(id, vec) VALUES (1, '[1,2,3,4]')")
        child = subprocess.Popen([sys.executable, "-c", CHILD, self.db, EXT, "20"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        self.assertIsNone(child.poll())  # waiting
        conn.close()
        out, err = child.communicate(timeout=60)
        self.assertEqual(out.strip(), "1", err)


class TestDurableCheckpoint(Base):
    """durable='checkpoint': what changed after the last checkpoint is gone
    at the next open, though the connection closed cleanly (pushes, pulls
    that created rows, and a COMMIT, which checkpoints, kept); the default
    keeps it at the close."""

    def run_case(self, durable):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, optimizer=sgd, lr=1, init=zeros%s)"
                  % (", durable='%s'" % durable if durable else ""))
        ids = np.arange(10, dtype=np.int64)
        c.execute("SELECT embkv_pull('t', ?)", (ids.tobytes(),)).fetchone()
        c.execute("SELECT embkv_push('t', ?, ?)", (ids.tobytes(), np.ones((10, 2), np.float32).tobytes()))
        c.execute("SELECT embkv_checkpoint('t')")
        c.execute("SELECT embkv_pull('t', ?)", (np.arange(20, dtype=np.int64).tobytes(),)).fetchone()
        c.execute("SELECT embkv_push('t', ?, ?)", (np.arange(20, dtype=np.int64).tobytes(),
                                                  np.ones((20, 2), np.float32).tobytes()))
        c.close()
        c = connect(self.db)
        got = c.execute("SELECT count(*), sum(clock), min(json_extract(embkv_json(vec), '$[0]')) FROM t").fetchone()
        c.execute("INSERT INTO t(id, vec) VALUES (100, '[5, 5]')")  # a COMMIT: durable
        c.execute("SELECT embkv_push('t', 0, '[1, 1]')")
        c.close()
        c = connect(self.db)
        after = c.execute("SELECT count(*), (SELECT clock FROM t WHERE id = 0) FROM t").fetchone()
        c.close()
        return got, after

    def test_rolled_back_at_open(self):
        self.assertEqual(self.run_case("checkpoint"), ((10, 10, -1.0), (11, 1)))

    def test_default_keeps_at_close(self):
        self.assertEqual(self.run_case(None), ((20, 30, -2.0), (21, 3)))


if __name__ == "__main__":
    unittest.main()
