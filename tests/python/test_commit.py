"""A COMMIT is decided by SQLite's file (ext/sqlite/journal.c): a process
killed after the store was written in the COMMIT's first phase, but before
SQLite committed, leaves nothing of that COMMIT once the table is opened
again; one killed after SQLite committed keeps all of it; a COMMIT that
writes an embkv table and ordinary tables is atomic across them.

Each test kills a writer process (SIGKILL) and reopens in this one.  The
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
if mode == "one":
    conn.execute("BEGIN")
    conn.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(7.0),))
    conn.execute("INSERT INTO t(id, vec) VALUES (5000, ?)", (vec(2.0),))
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
# the writer's COMMITs wait for SQLite's lock after their first phase.
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

    def start(self, code, *args):
        p = subprocess.Popen([sys.executable, "-c", code, self.db, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        line = p.stdout.readline()
        self.assertEqual(line, "ready\n", p.stderr.read() if p.poll() is not None else line)
        return p

    def journal_state(self):
        with open(self.journal, "rb") as f:
            head = f.read(72)
        self.assertEqual(head[:8], b"EKVJRNL1")
        return struct.unpack_from("<I", head, 8)[0]

    def rows(self, c):
        return {i: struct.unpack("4f", v)[0] for i, v in c.execute("SELECT id, vec FROM t")}

    def kill_in_lock_wait(self):
        """A writer killed while its COMMIT waits for SQLite's lock, after
        the store was written: the journal is left pending."""
        reader = connect(self.db)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM log").fetchone()
        w = self.start(WRITER, EXT, "one")
        deadline = time.time() + 30
        while time.time() < deadline:
            if os.path.exists(self.journal) and self.journal_state() == 1:
                break
            time.sleep(0.01)
        self.assertEqual(self.journal_state(), 1, "the writer never reached its COMMIT's second phase")
        time.sleep(0.2)
        self.assertIsNone(w.poll(), "the COMMIT returned although a reader held the file")
        w.send_signal(signal.SIGKILL)
        w.wait()
        reader.execute("ROLLBACK")
        reader.close()

    def test_kill_during_lock_wait_leaves_nothing(self):
        self.kill_in_lock_wait()
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
        self.kill_in_lock_wait()
        with open(self.journal, "r+b") as f:
            f.seek(72 + 24 + 2)  # inside the first pre-image's floats
            b = f.read(1)
            f.seek(72 + 24 + 2)
            f.write(bytes([b[0] ^ 0x40]))
        c = connect(self.db)
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            c.execute("SELECT count(*) FROM t").fetchone()
        self.assertEqual(str(cm.exception),
                         f"embkv table t: its store's commit journal {os.path.realpath(self.journal)} is damaged "
                         "(its checksum does not match): a COMMIT was cut off and its rows cannot be put back. "
                         "Restore the store from a backup, or remove that file to keep the rows as they are (that "
                         "COMMIT's rows may stay although it never returned)")
        c.close()
        # Truncated: another reason, the same advice.
        with open(self.journal, "r+b") as f:
            f.truncate(72 + 30)
        c = connect(self.db)
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            c.execute("SELECT count(*) FROM t").fetchone()
        self.assertIn("is damaged (it ends before its last record)", str(cm.exception))
        c.close()
        # The advice, followed: the cut-off COMMIT's store rows stay.
        os.remove(self.journal)
        c = connect(self.db)
        rows = self.rows(c)
        self.assertEqual((rows[1], rows[5000]), (7.0, 2.0))
        self.assertEqual(c.execute("SELECT count(*) FROM log").fetchone()[0], 0)
        c.close()

    def test_commit_failing_on_the_lock_puts_the_store_back(self):
        reader = connect(self.db)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM log").fetchone()
        c = connect(self.db, timeout=0.3)
        c.execute("BEGIN")
        c.execute("UPDATE t SET vec = ? WHERE id = 1", (vec(9.0),))
        c.execute("INSERT INTO log VALUES (1)")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            c.execute("COMMIT")
        self.assertEqual(str(cm.exception), "database is locked")
        c.execute("ROLLBACK")
        self.assertEqual(self.journal_state(), 0)
        self.assertEqual(self.rows(reader)[1], 0.0)
        reader.execute("ROLLBACK")
        self.assertEqual(self.rows(c)[1], 0.0)
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
            w = self.start(WRITER, EXT, "loop")
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
