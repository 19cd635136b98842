"""A COMMIT is decided by SQLite's file (ext/sqlite/journal.c): a process
killed after the store was written in the COMMIT's first phase, but before
SQLite committed, leaves nothing of that COMMIT once the table is opened
again; one killed after SQLite committed keeps all of it; a COMMIT that
writes an embkv table and ordinary tables is atomic across them.

Each test kills a writer process (SIGKILL) and reopens in this one.  The
window between the store's write and SQLite's commit is short (SQLite's
lock is taken before the store is written), so the writers stretch it
with the binding's test seam EMBKV_TEST_COMMIT=pause:<ms>, and
EMBKV_TEST_COMMIT=busy fails a COMMIT there as a busy lock would.  The
store's journal file (app-sqlite-commit-<k>) is read to know when the
writer is in the window (its header's state word is 1 while a COMMIT is
in flight) and damaged on purpose to check the errors."""
import glob
import os
import random
import signal
import sqlite3
import struct
import subprocess
import sys
import time
import unittest

import numpy as np

import embkv
from embkv_test import EXT, TempDirTest, connect

DIM = 4
OPTS = "dim=4, path='st', pool_size='16M'"

# The writer: argv db, mode; prints "ready" once connected.
WRITER = r"""
import sqlite3, struct, sys, time
db, ext, mode = sys.argv[1], sys.argv[2], sys.argv[3]
conn = sqlite3.connect(db, isolation_level=None, timeout=60)
conn.enable_load_extension(True)
conn.load_extension(ext)
def vec(x):
    return struct.pack("4f", x, x, x, x)
conn.execute("SELECT count(*) FROM t").fetchone()
print("ready", flush=True)
STEPS = {
    "one": [("UPDATE t SET vec = ? WHERE id = 1", (vec(7.0),)),
            ("INSERT INTO t(id, vec) VALUES (5000, ?)", (vec(2.0),))],
    # a table dropped in the transaction, after writes to it
    "drop": [("INSERT INTO u(id, vec) VALUES (6, ?)", (vec(6.0),)), ("DROP TABLE u", ()),
             ("UPDATE t SET vec = ? WHERE id = 2", (vec(8.0),))],
    # through the second table on t's store
    "other": [("UPDATE t2 SET vec = ? WHERE id = 1", (vec(9.0),))],
}
if mode == "window":
    # A COMMIT in its window (the test seam's pause); meanwhile a table of
    # another database file on the same store writes id 1 (in this
    # process: the store is one process's).
    import os, threading
    def other():
        time.sleep(0.5)
        del os.environ["EMBKV_TEST_COMMIT"]  # (this COMMIT goes through)
        b = sqlite3.connect(os.path.join(os.path.dirname(db), "b.db"), isolation_level=None, timeout=60)
        b.enable_load_extension(True)
        b.load_extension(ext)
        b.execute("UPDATE f SET vec = ? WHERE id = 1", (vec(42.0),))
        print("other", flush=True)
    threading.Thread(target=other, daemon=True).start()
    conn.execute("BEGIN")
    conn.execute("UPDATE t SET vec = ? WHERE id IN (1, 2)", (vec(7.0),))
    conn.execute("INSERT INTO log VALUES (1)")
    conn.execute("COMMIT")
    time.sleep(60)
if mode in STEPS:
    conn.execute("BEGIN")
    for sql, args in STEPS[mode]:
        conn.execute(sql, args)
    conn.execute("INSERT INTO log VALUES (1)")
    conn.execute("COMMIT")
    print("committed", flush=True)
    time.sleep(60)
else:
    n = conn.execute("SELECT coalesce(max(n), 0) FROM log").fetchone()[0]
    while True:
        n += 1
        conn.execute("BEGIN")
        conn.execute("UPDATE t SET vec = ? WHERE id BETWEEN 1 AND 50", (vec(float(n)),))
        conn.execute("INSERT INTO t(id, vec) VALUES (?, ?)", (1000 + n, vec(float(n))))
        conn.execute("INSERT INTO log VALUES (?)", (n,))
        conn.execute("COMMIT")
"""

# A reader holding short read transactions on the database file, so that
# the writer's COMMITs wait for SQLite's lock before their first phase.
READER = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=60)
print("ready", flush=True)
while True:
    conn.execute("BEGIN")
    conn.execute("SELECT count(*) FROM log").fetchone()
    time.sleep(0.004)
    conn.execute("COMMIT")
    time.sleep(0.001)
"""


def vec(x):
    return struct.pack("4f", x, x, x, x)


class CommitTest(TempDirTest):
    def setUp(self):
        super().setUp()
        c = connect(self.db)
        c.execute(f"CREATE VIRTUAL TABLE t USING embkv({OPTS})")
        c.execute("CREATE TABLE log(n INTEGER)")
        c.execute("BEGIN")
        for i in range(1, 51):
            c.execute("INSERT INTO t(id, vec) VALUES (?, ?)", (i, vec(0.0)))
        c.execute("COMMIT")
        c.close()
        self.journal = os.path.join(self.dir, "st", "app-sqlite-commit-0")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        super().tearDown()

    def start(self, code, *args, pause=None):
        """pause: ms each COMMIT of the process waits in its window."""
        env = dict(os.environ, EMBKV_TEST_COMMIT=f"pause:{pause}") if pause else None
        p = subprocess.Popen([sys.executable, "-c", code, self.db, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
        line = p.stdout.readline()
        self.assertEqual(line, "ready\n", p.stderr.read() if p.poll() is not None else line)
        return p

    def journal_state(self):
        with open(self.journal, "rb") as f:
            head = f.read(72)
        self.assertEqual(head[:8], b"EKVJRNL1")
        return struct.unpack_from("<I", head, 8)[0]

    def flip_journal(self, off=72 + 32 + 2, mask=0x40):
        """Toggles bits of the journal's byte at off (by default inside the
        first pre-image's floats); a second call puts it back."""
        with open(self.journal, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ mask]))

    def use_error(self, c):
        """The error c's first use of t gives."""
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            c.execute("SELECT count(*) FROM t").fetchone()
        return cm.exception

    def rows(self, c):
        return {i: struct.unpack("4f", v)[0] for i, v in c.execute("SELECT id, vec FROM t")}

    def hold_read(self):
        """A connection in a read transaction of the database file: a
        writer's COMMIT then waits for SQLite's lock, before its first
        phase."""
        r = connect(self.db)
        r.execute("BEGIN")
        r.execute("SELECT count(*) FROM log").fetchone()
        return r

    def release(self, r):
        r.execute("ROLLBACK")
        r.close()

    def kill_in_window(self, mode="one"):
        """A writer killed after its COMMIT wrote the store, before SQLite
        committed: the journal is left pending."""
        # (a pause in each xSync: with two stores, st's comes second)
        w = self.start(WRITER, EXT, mode, pause=5000)
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(self.journal) and self.journal_state() == 1:
                break
            time.sleep(0.01)
        self.assertEqual(self.journal_state(), 1, "the writer never reached its COMMIT's second phase")
        time.sleep(0.2)
        self.assertIsNone(w.poll(), "the COMMIT returned in its window")
        w.send_signal(signal.SIGKILL)
        w.wait()

    def test_kill_in_the_window_leaves_nothing(self):
        self.kill_in_window()
        c = connect(self.db)
        rows = self.rows(c)
        self.assertEqual(len(rows), 50)
        self.assertNotIn(5000, rows, "the row inserted by the cut-off COMMIT is there")
        self.assertEqual(rows[1], 0.0, "the row updated by the cut-off COMMIT kept its new value")
        self.assertEqual(c.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        self.assertEqual(self.journal_state(), 0)
        # The table works on: a COMMIT through the same slot, and a reopen.
        c.execute("UPDATE t SET vec = ? WHERE id = 3", (vec(3.0),))
        c.close()
        c = connect(self.db)
        self.assertEqual(self.rows(c)[3], 3.0)
        self.assertEqual(self.rows(c)[1], 0.0)
        c.close()

    def test_read_only_connection_refuses_a_cut_off_commit(self):
        """A connection that may not write reads the store as it is, and
        cannot put a cut-off COMMIT back: it refuses the table until a
        connection that may write has used it."""
        self.kill_in_window()

        def ro_count():
            r = connect(f"file:{self.db}?mode=ro", uri=True)
            try:
                return r.execute("SELECT count(*) FROM t").fetchone()[0]
            finally:
                r.close()
        with self.assertRaises(sqlite3.OperationalError) as cm:
            ro_count()
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_READONLY)
        self.assertEqual(str(cm.exception),
                         f"embkv table t: a COMMIT cut off by a crash left rows that SQLite never committed in its "
                         f"store (journal {os.path.realpath(self.journal)}), and a connection that may not write "
                         "cannot put them back: use the table once from a connection that may write (any "
                         "statement on it), then open this database again to read it")
        # PRAGMA query_only reads the store as a reader too: the same.
        q = connect(self.db)
        q.execute("PRAGMA query_only=1")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            q.execute("SELECT count(*) FROM t").fetchone()
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_READONLY)
        q.close()
        # Damaged: refused as a writer refuses it.
        self.flip_journal()
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            ro_count()
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_CORRUPT)
        self.assertIn("is damaged (its checksum does not match)", str(cm.exception))
        self.flip_journal()
        # The advice, followed.
        c = connect(self.db)
        self.assertNotIn(5000, self.rows(c))
        c.close()
        self.assertEqual(ro_count(), 50)

    def test_journal_that_cannot_be_opened(self):
        bad = os.path.join(self.dir, "st", "app-sqlite-commit-5")
        os.mkdir(bad)
        c = connect(self.db)
        e = self.use_error(c)
        self.assertIsInstance(e, sqlite3.OperationalError)
        self.assertEqual(str(e),
                         f"embkv table t: cannot open its store's commit journal {os.path.realpath(bad)}: Is a "
                         "directory (give this process read and write access to it: it may hold the rows of a "
                         "COMMIT cut off by a crash, which the table puts back)")
        c.close()

    def test_nolock_connection_keeps_no_lock(self):
        """A file SQLite does not lock (nolock=1) is not locked by the
        COMMIT either: another process writes it afterwards."""
        c = connect(f"file:{self.db}?nolock=1", uri=True)
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(3.0),))
        out = subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], "
                              "timeout=0); c.execute('INSERT INTO log VALUES (5)'); c.commit(); print('ok')",
                              self.db], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.stdout, "ok\n", out.stderr)
        self.assertEqual(self.rows(c)[1], 3.0)
        c.close()

    def test_refused_commit_of_two_stores_writes_neither(self):
        """A COMMIT over two stores, the second written through a temporary
        table whose record goes to another table on its store, in an
        attached file the transaction did not write otherwise: refused
        (that file has a reader) before either store is written."""
        aux = os.path.join(self.dir, "aux.db")
        b = self.other_db()  # (reads t's store through another file)
        c = connect(self.db, timeout=0.3)
        c.execute("ATTACH ? AS aux", (aux,))
        c.execute(f"CREATE VIRTUAL TABLE aux.u USING embkv(dim=4, path='{self.dir}/sb', pool_size='16M')")
        c.execute(f"CREATE VIRTUAL TABLE temp.tt USING embkv(dim=4, path='{self.dir}/sb', pool_size='16M')")
        r = connect(aux)
        r.execute("BEGIN")
        r.execute("SELECT count(*) FROM sqlite_schema").fetchone()
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(4.0),))
        c.execute("INSERT INTO temp.tt(id, vec) VALUES (2, ?)", (vec(2.0),))
        with self.assertRaises(sqlite3.OperationalError) as cm:
            c.execute("COMMIT")
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_BUSY)
        self.assertIn(f"other connections are reading {os.path.realpath(aux)}", str(cm.exception))
        # The stores do not hold the COMMIT's rows meanwhile.
        self.assertEqual(b.execute("SELECT vec FROM f WHERE id = 1").fetchone()[0], vec(0.0))
        b.close()
        c.execute("ROLLBACK")
        r.execute("ROLLBACK")
        self.assertEqual(self.rows(c)[1], 0.0)
        self.assertEqual(c.execute("SELECT count(*) FROM temp.tt").fetchone()[0], 0)
        r.close()
        c.close()

    def test_rollback_to_after_a_refused_commit_of_two_stores(self):
        """A COMMIT refused after its first store was written, its second
        prepared (a slot and a record) but not written; a ROLLBACK TO
        takes that record out of SQLite's transaction: the next COMMIT's
        journal of the second store names the record SQLite commits (a
        lost done mark then keeps the rows)."""
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE a USING embkv(dim=4, path='sa', pool_size='16M')")
        c.execute("CREATE VIRTUAL TABLE b USING embkv(dim=4, path='sb', pool_size='16M')")
        c.execute("INSERT INTO b(id, vec) VALUES (1, ?)", (vec(1.0),))
        c.execute("BEGIN")
        c.execute("SAVEPOINT s")
        c.execute("INSERT INTO a(id, vec) VALUES (5, ?)", (vec(5.0),))
        c.execute("INSERT INTO b(id, vec) VALUES (5, ?)", (vec(5.0),))
        self.seam_refused_commit(c)
        c.execute("ROLLBACK TO s")
        c.execute("INSERT INTO b(id, vec) VALUES (7, ?)", (vec(7.0),))
        c.execute("INSERT INTO log VALUES (7)")
        c.execute("RELEASE s")
        c.execute("COMMIT")
        token = c.execute("SELECT v FROM b_config WHERE k = 'commit-0'").fetchone()[0]
        c.close()
        journal = os.path.join(self.dir, "sb", "app-sqlite-commit-0")
        with open(journal, "rb") as f:
            head = f.read(72)
        self.assertIn(struct.pack("<q", token), head, "the journal's token is not the committed record's")
        # A done mark lost: the record decides, and the rows stay.
        with open(journal, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<I", 1))
        c = connect(self.db)
        self.assertEqual([r[0] for r in c.execute("SELECT id FROM b ORDER BY id")], [1, 7])
        self.assertEqual(c.execute("SELECT count(*) FROM a").fetchone()[0], 0)
        c.close()

    def seam_refused_commit(self, c):
        """c's COMMIT fails busy after its first phase (the test seam)."""
        os.environ["EMBKV_TEST_COMMIT"] = "busy"
        try:
            with self.assertRaises(sqlite3.OperationalError) as cm:
                c.execute("COMMIT")
        finally:
            del os.environ["EMBKV_TEST_COMMIT"]
        return cm.exception

    def busy_commit(self, c):
        """c's COMMIT fails busy after its first phase wrote the store (the
        test seam); SQLite keeps the transaction."""
        e = self.seam_refused_commit(c)
        self.assertEqual(str(e), "embkv table t: database is locked (EMBKV_TEST_COMMIT=busy)")
        self.assertEqual(e.sqlite_errorcode, sqlite3.SQLITE_BUSY)
        self.assertEqual(self.journal_state(), 1)
        self.assertTrue(c.in_transaction)

    def test_writes_after_a_busy_commit_are_committed(self):
        c = connect(self.db, timeout=0.2)
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(2.0),))
        c.execute("INSERT INTO log VALUES (2)")
        self.busy_commit(c)
        # The transaction goes on (SQLite keeps it): more writes, a delete.
        c.execute("INSERT INTO t(id, vec) VALUES (3000, ?)", (vec(3.0),))
        c.execute("DELETE FROM t WHERE id = 50")
        c.execute("INSERT INTO log VALUES (3)")
        self.assertEqual(self.journal_state(), 0, "the store was not put back when the transaction went on")
        c.execute("COMMIT")
        c.close()
        c = connect(self.db)
        rows = self.rows(c)
        self.assertEqual((rows[1], rows[3000], 50 in rows), (2.0, 3.0, False))
        self.assertEqual(c.execute("SELECT n FROM log ORDER BY n").fetchall(), [(2,), (3,)])
        c.close()

    def test_rollback_to_after_a_busy_commit(self):
        c = connect(self.db, timeout=0.2)
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 4", (vec(4.0),))
        c.execute("SAVEPOINT s")
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(9.0),))
        c.execute("INSERT INTO log VALUES (9)")
        self.busy_commit(c)
        c.execute("ROLLBACK TO s")
        self.assertEqual(self.rows(c)[1], 0.0)
        c.execute("COMMIT")
        c.close()
        c = connect(self.db)
        rows = self.rows(c)
        self.assertEqual((rows[1], rows[4]), (0.0, 4.0))
        self.assertEqual(c.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        c.close()

    def test_cut_off_commit_with_a_drop(self):
        """Writes to a table dropped in the transaction: the record goes
        to another table's shadow table, and both stores come back."""
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE u USING embkv(dim=4, path='su', pool_size='16M')")
        c.execute("INSERT INTO u(id, vec) VALUES (1, ?)", (vec(1.0),))
        c.close()
        self.kill_in_window("drop")
        c = connect(self.db)
        self.assertEqual({i: x for i, x in c.execute("SELECT id, vec FROM u")}, {1: vec(1.0)})
        self.assertEqual(self.rows(c)[2], 0.0)
        self.assertEqual(c.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        c.close()

    def test_another_table_on_the_store_resolves_the_journal(self):
        """t2 shares t's store; a COMMIT through t2 is cut off; t, used
        first, puts its rows back, and t2's later connect changes nothing
        t committed since."""
        c = connect(self.db)
        c.execute(f"CREATE VIRTUAL TABLE t2 USING embkv({OPTS})")
        c.close()
        self.kill_in_window("other")
        c = connect(self.db)
        self.assertEqual(c.execute("SELECT vec FROM t WHERE id = 1").fetchone()[0], vec(0.0))
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(42.0),))
        c.close()
        c = connect(self.db)
        self.assertEqual(c.execute("SELECT vec FROM t2 WHERE id = 1").fetchone()[0], vec(42.0))
        self.assertEqual(c.execute("SELECT vec FROM t WHERE id = 1").fetchone()[0], vec(42.0))
        c.close()

    def test_first_use_inside_a_write_transaction(self):
        """The recovery of a table first used inside the connection's own
        write transaction reads the record itself (another connection
        could not read past its lock)."""
        self.kill_in_window()
        c = connect(self.db, timeout=1)
        c.execute("PRAGMA cache_size=2")
        c.execute("BEGIN")
        c.executemany("INSERT INTO log VALUES (?)", ((-i,) for i in range(3000)))
        self.assertEqual(self.rows(c)[1], 0.0)
        c.execute("COMMIT")
        c.close()

    def test_a_memory_database_table_writes_no_record(self):
        c = connect(":memory:")
        c.execute(f"CREATE VIRTUAL TABLE m USING embkv(dim=4, path='{self.dir}/sm', pool_size='16M')")
        c.execute("INSERT INTO m(id, vec) VALUES (1, ?)", (vec(1.0),))
        self.assertEqual(c.execute("SELECT count(*) FROM m_config WHERE k LIKE 'commit-%'").fetchone()[0], 0)
        self.assertEqual(glob.glob(os.path.join(self.dir, "sm", "app-sqlite-commit-*")), [])
        c.close()

    def other_db(self):
        """b.db with table f on t's store (the same directory)."""
        b = connect(os.path.join(self.dir, "b.db"))
        b.execute(f"CREATE VIRTUAL TABLE f USING embkv({OPTS})")
        return b

    def test_rollback_keeps_what_others_wrote_since(self):
        """A COMMIT's rows are put back only where they are still its own:
        a table of another database file on the store, or a push, that
        wrote an id meanwhile wins (the last writer)."""
        b = self.other_db()
        c = connect(self.db, timeout=0.2)
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id IN (1, 2, 3)", (vec(9.0),))
        c.execute("DELETE FROM t WHERE id = 4")
        c.execute("INSERT INTO log VALUES (9)")
        self.busy_commit(c)
        b.execute("UPDATE f SET vec = ? WHERE id = 1", (vec(42.0),))
        b.execute("INSERT INTO f(id, vec) VALUES (4, ?)", (vec(44.0),))
        embkv.push(b, "f", [3], np.ones((1, 4), np.float32), lr=1.0)
        c.execute("ROLLBACK")
        rows = self.rows(c)
        self.assertEqual((rows[1], rows[2], rows[3], rows[4]), (42.0, 0.0, 8.0, 44.0))
        for x in (b, c):
            x.close()

    def test_rollback_of_rounded_rows(self):
        """A row of a reduced-precision table is recognised as the
        COMMIT's own by its value as the store keeps it (rounded)."""
        for dtype in ("f16", "bf16", "i8"):
            c = connect(self.db, timeout=0.2)
            c.execute(f"CREATE VIRTUAL TABLE r_{dtype} USING embkv(dim=4, dtype='{dtype}', path='s_{dtype}', "
                      "pool_size='16M')")
            c.execute(f"INSERT INTO r_{dtype}(id, vec) VALUES (1, ?)", (vec(0.5),))
            c.execute("BEGIN")
            c.execute(f"UPDATE r_{dtype} SET vec = ? WHERE id = 1", (struct.pack("4f", 0.1, -0.3, 0.77, 1e-3),))
            c.execute(f"INSERT INTO r_{dtype}(id, vec) VALUES (2, ?)", (vec(0.123),))
            c.execute("INSERT INTO log VALUES (1)")
            self.seam_refused_commit(c)
            c.execute("ROLLBACK")
            self.assertEqual(c.execute(f"SELECT id, vec FROM r_{dtype}").fetchall(), [(1, vec(0.5))], dtype)
            c.close()

    def test_kill_keeps_what_others_wrote_in_the_window(self):
        b = self.other_db()
        b.close()
        w = self.start(WRITER, EXT, "window", pause=60000)
        self.assertEqual(w.stdout.readline(), "other\n")
        self.assertEqual(self.journal_state(), 1)
        w.send_signal(signal.SIGKILL)
        w.wait()
        c = connect(self.db)
        rows = self.rows(c)
        self.assertEqual((rows[1], rows[2]), (42.0, 0.0))
        self.assertEqual(c.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        c.close()

    def test_committed_journal_left_pending_keeps_rows(self):
        """A done mark lost (a power cut after SQLite committed): the
        record in <name>_config holds the token, so the rows stay."""
        c = connect(self.db)
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(5.0),))
        c.execute("INSERT INTO log VALUES (1)")
        c.execute("COMMIT")
        c.close()
        self.assertEqual(self.journal_state(), 0)
        with open(self.journal, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<I", 1))
        c = connect(self.db)
        self.assertEqual(self.rows(c)[1], 5.0)
        self.assertEqual(self.journal_state(), 0)
        c.close()

    def test_recovery_reads_the_record_as_of_now(self):
        """A connection inside a WAL read transaction that began before a
        writer process committed (and died before its done mark) must not
        take the record's absence in its old snapshot for no commit."""
        c = connect(self.db)
        c.execute("PRAGMA journal_mode=WAL").fetchone()
        c.close()
        x = connect(self.db)
        x.execute("BEGIN")
        self.assertEqual(x.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        w = connect(self.db)
        w.execute("BEGIN")
        w.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(6.0),))
        w.execute("INSERT INTO log VALUES (1)")
        w.execute("COMMIT")
        w.close()  # (the last user of the store in this process: it closes)
        with open(self.journal, "r+b") as f:
            f.seek(8)
            f.write(struct.pack("<I", 1))
        # x's first use of t connects it inside the old snapshot.
        self.assertEqual(x.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        self.assertEqual(self.rows(x)[1], 6.0)
        self.assertEqual(self.journal_state(), 0)
        x.execute("COMMIT")
        x.close()

    def test_damaged_journal_is_an_error_naming_it(self):
        self.kill_in_window()
        self.flip_journal()
        c = connect(self.db)
        self.assertEqual(str(self.use_error(c)),
                         f"embkv table t: its store's commit journal {os.path.realpath(self.journal)} is damaged "
                         "(its checksum does not match): a COMMIT was cut off and its rows cannot be put back. "
                         "Restore the store from a backup, or remove that file to keep the rows as they are (that "
                         "COMMIT's rows may stay although it never returned)")
        c.close()
        # The table id or the state word damaged: the same error, not a
        # journal taken for another table's or for done.
        self.flip_journal()  # (the record back as it was)
        for off, mask in ((24, 0x01), (8, 0xff)):  # (state 1 ^ 0xff: 0xfe)
            self.flip_journal(off, mask)
            c = connect(self.db)
            why = "its checksum does not match" if off == 24 else "its state is neither done nor pending"
            self.assertIn(f"is damaged ({why})", str(self.use_error(c)))
            c.close()
            self.flip_journal(off, mask)
        # Truncated: another reason, the same advice.
        with open(self.journal, "r+b") as f:
            f.truncate(72 + 30)
        c = connect(self.db)
        self.assertIn("is damaged (it ends before its last record)", str(self.use_error(c)))
        c.close()
        # The advice, followed: the cut-off COMMIT's store rows stay.
        os.remove(self.journal)
        c = connect(self.db)
        rows = self.rows(c)
        self.assertEqual((rows[1], rows[5000]), (7.0, 2.0))
        self.assertEqual(c.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        c.close()

    def test_commit_waits_for_readers_before_writing_the_store(self):
        """While a COMMIT waits for SQLite's lock, readers of the file see
        none of it, and a push there updates the committed row; a COMMIT
        that cannot have the lock wrote nothing and keeps its transaction."""
        import threading
        reader = self.hold_read()
        c = connect(self.db, timeout=0.6, check_same_thread=False)
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(9.0),))
        c.execute("INSERT INTO t(id, vec) VALUES (7000, ?)", (vec(7.0),))
        c.execute("INSERT INTO log VALUES (1)")
        failed = []

        def commit():
            try:
                c.execute("COMMIT")
            except sqlite3.OperationalError as e:
                failed.append(e)
        th = threading.Thread(target=commit)
        th.start()
        time.sleep(0.3)  # (the COMMIT waits)
        rows = self.rows(reader)
        self.assertEqual((rows[1], 7000 in rows), (0.0, False), "a reader saw a COMMIT SQLite had not made")
        embkv.push(reader, "t", [1], np.ones((1, 4), np.float32), lr=1.0)
        th.join()
        self.assertEqual(len(failed), 1)
        self.assertEqual(str(failed[0]),
                         f"embkv table t: database is locked: other connections are reading {self.db} (waited "
                         "600 ms, the connection's busy timeout); nothing was written, and the transaction is "
                         "still open: COMMIT again, or ROLLBACK")
        self.assertEqual(failed[0].sqlite_errorcode, sqlite3.SQLITE_BUSY)
        self.assertTrue(c.in_transaction)
        self.assertEqual(self.journal_state(), 0)
        # The reader goes: the same COMMIT, again, commits.
        reader.execute("ROLLBACK")
        c.execute("COMMIT")
        rows = self.rows(reader)
        self.assertEqual((rows[1], rows[7000]), (9.0, 7.0))
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 2", (vec(5.0),))
        c.execute("ROLLBACK")
        reader.close()
        c.close()
        c = connect(self.db)
        rows = self.rows(c)
        self.assertEqual((rows[1], rows[2], rows[7000]), (9.0, 0.0, 7.0))
        self.assertEqual(c.execute("SELECT n FROM log").fetchall(), [(1,)])
        c.close()

    def test_push_during_a_refused_commit_keeps_the_old_row(self):
        """The push a reader makes while a COMMIT waits applies to the
        committed row; the COMMIT, refused and rolled back, leaves it."""
        reader = self.hold_read()
        c = connect(self.db, timeout=0.3)
        # An autocommit statement refused so is undone.
        with self.assertRaises(sqlite3.OperationalError) as cm:
            c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(8.0),))
        self.assertTrue(str(cm.exception).endswith("nothing was written, and the statement is undone: run it again"))
        self.assertFalse(c.in_transaction)
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(9.0),))
        c.execute("INSERT INTO log VALUES (1)")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            c.execute("COMMIT")
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_BUSY)
        embkv.push(reader, "t", [1], np.ones((1, 4), np.float32), lr=1.0)
        c.execute("ROLLBACK")
        reader.execute("ROLLBACK")
        self.assertEqual(c.execute("SELECT vec, clock FROM t WHERE id = 1").fetchone(), (vec(-1.0), 1))
        self.assertEqual(c.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        c.close()
        reader.close()

    def test_random_kills_keep_both_tables_together(self):
        """Rows and the ordinary table log, written in one COMMIT, agree
        after every kill: every row holds max(log), and the rows 1000+k
        exist exactly for k in log."""
        rnd = random.Random(int(os.environ.get("EMBKV_TEST_SEED", "0")) or None)
        reader = self.start(READER)
        waited = 0
        for rnd_i in range(12):
            # (kills in SQLite's lock wait, in the window, and in SQLite's
            # commit)
            w = self.start(WRITER, EXT, "loop", pause=3)
            time.sleep(rnd.uniform(0.05, 0.5))
            w.send_signal(signal.SIGKILL)
            w.wait()
            c = connect(self.db)
            rows = self.rows(c)
            log = sorted(r[0] for r in c.execute("SELECT n FROM log"))
            n = log[-1] if log else 0
            self.assertEqual(log, list(range(1, n + 1)))
            self.assertEqual({rows[i] for i in range(1, 51)}, {float(n)}, f"round {rnd_i}: log says {n}")
            self.assertEqual(sorted(i for i in rows if i > 1000), [1000 + k for k in log], f"round {rnd_i}")
            for path in glob.glob(os.path.join(self.dir, "st", "app-sqlite-commit-*")):
                with open(path, "rb") as f:
                    head = f.read(12)
                if head[:8] == b"EKVJRNL1":
                    waited += 1
                    self.assertEqual(struct.unpack_from("<I", head, 8)[0], 0, f"round {rnd_i}: {path}")
            c.close()
        self.assertGreater(waited, 0)
        reader.kill()


if __name__ == "__main__":
    unittest.main()
