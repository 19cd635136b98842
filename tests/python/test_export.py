"""embkv_export / embkv_import (and embkv_backup) from Python.

- A backup taken while another connection pushes opens (CREATE ... path=)
  as the table after exactly one push count, optimizer state included.

- An export taken while another connection pushes continuously is the
  table after exactly one number of pushes: every push is one write group
  over all rows (and creates one new row), so in a consistent export every
  old row has the same clock K, the same vector and an accumulator of
  exactly K, and the new rows are exactly those of pushes 1..K.
- A round trip of 100,000 rows (adam: 2*dim+1 state floats, clocks 0..5):
  the imported table has every row's vector and clock bit for bit, and its
  own export is the first file row for row (so the state too); every row's
  crc is zlib.crc32 of the documented bytes, so any reader can check it.
  A pool too small for the file (no SSD tier) is refused before writing.
- Rows in the SSD log and in the DRAM cache export with their state, and
  an import into a small pool with an SSD tier demotes as it goes.
- SIGKILL during an import (rows already visible to readers): the table
  reopens as it was before; an import that returned is durable.
- Damaged files (cut at many lengths, single bytes flipped anywhere or in
  a row's vector or state, NaN and Inf with a valid crc) give a clean
  error naming the file, and change nothing; never a crash.  Two exports
  racing for one name: one wins, the other says the file exists, and no
  temporary file is left.

- A backup or a CREATE onto a file system with room for the pool but not
  for the rest (a small tmpfs, mounted when the test runs as root): a
  clean error naming what has no room, never a SIGBUS, and nothing left at
  the backup's name but a whole backup.

Run by tests/run.sh through tests/python_run.sh, or by hand:
    EMBKV_EXT=build/embkv /usr/bin/python3 tests/python/test_export.py -v
"""
import json
import os
import random
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import zlib

import numpy as np

from embkv_test import EXT, TempDirTest, connect


def ids_blob(ids):
    return np.asarray(ids, dtype=np.int64).tobytes()


def file_rows(path):
    """{id: (clock, vec bytes, state bytes or None, crc)} of an export."""
    c = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        return {r[0]: r[1:] for r in c.execute("SELECT id, clock, vec, state, crc FROM embkv_rows")}
    finally:
        c.close()


def file_meta(path):
    c = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        return dict(c.execute("SELECT key, value FROM embkv_meta"))
    finally:
        c.close()


def table_rows(conn, table):
    return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT id, clock, vec FROM %s" % table)}


def start_pusher(db, n, dim, extra=""):
    """Creates table t of db (adagrad, rows 0..n-1 pulled from zeros;
    `extra` options added) and starts a thread pushing into it until
    stopped: push k updates every old row and creates row n + k, in one
    write group.  Returns (connection, thread, stop event, errors list,
    [pushes done])."""
    a = connect(db, check_same_thread=False)
    a.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d, optimizer=adagrad, lr=0.5, init=zeros, "
              "capacity=20000%s)" % (dim, extra))
    a.execute("SELECT length(embkv_pull('t', ?))", (ids_blob(range(n)),)).fetchone()
    a.execute("SELECT embkv_release('t', ?)", (ids_blob(range(n)),)).fetchone()
    stop = threading.Event()
    errors = []
    pushes = [0]

    def pusher():
        try:
            b = connect(db, check_same_thread=False)
            k = 0
            while not stop.is_set() and k < 100000:
                k += 1
                ids = np.append(np.arange(n, dtype=np.int64), n + k)
                grads = np.ones((n + 1, dim), dtype=np.float32)
                b.execute("SELECT embkv_push('t', ?, ?)", (ids.tobytes(), grads.tobytes())).fetchone()
                pushes[0] = k
            b.close()
        except Exception as e:  # reported by the test thread
            errors.append(e)

    th = threading.Thread(target=pusher)
    th.start()
    return a, th, stop, errors, pushes


class TestConsistentExport(TempDirTest):
    N = 3000
    DIM = 8

    def test_export_while_pushing(self):
        n, dim = self.N, self.DIM
        a, th, stop, errors, pushes = start_pusher(self.db, n, dim)
        seen = set()
        deadline = time.time() + 60
        i = 0
        try:
            while (len(seen) < 4 or i < 6) and time.time() < deadline and not errors:
                while pushes[0] == 0 and not errors:
                    time.sleep(0.001)
                i += 1
                path = os.path.join(self.dir, "e%d.export" % i)
                (rows,) = a.execute("SELECT embkv_export('t', ?)", (path,)).fetchone()
                got = file_rows(path)
                self.assertEqual(rows, len(got))
                k = self.check_one_state(got)
                seen.add(k)
                os.unlink(path)
        finally:
            stop.set()
            th.join()
        if errors:
            raise errors[0]
        self.assertGreaterEqual(len(seen), 2, "every export saw the same push count: %s" % sorted(seen))
        # quiet now: an export is the table exactly, and imports back
        path = os.path.join(self.dir, "final.export")
        a.execute("SELECT embkv_export('t', ?)", (path,)).fetchone()
        k = self.check_one_state(file_rows(path))
        self.assertEqual(k, pushes[0])
        a.execute("CREATE VIRTUAL TABLE u USING embkv(dim=%d, optimizer=adagrad, lr=0.5, capacity=20000)" % dim)
        (got,) = a.execute("SELECT embkv_import('u', ?)", (path,)).fetchone()
        self.assertEqual(got, n + k)
        self.assertEqual(table_rows(a, "u"), table_rows(a, "t"))
        a.close()

    def check_one_state(self, rows):
        """The push count K the export shows, after checking that every row
        is as K pushes leave it."""
        n, dim = self.N, self.DIM
        base = [rows[i] for i in range(n)]
        clocks = {r[0] for r in base}
        self.assertEqual(len(clocks), 1, "old rows from several push counts: %s" % sorted(clocks)[:10])
        k = clocks.pop()
        self.assertEqual(len({r[1] for r in base}), 1, "old rows with different vectors")
        acc = np.full(dim, k, dtype=np.float32).tobytes()
        self.assertTrue(all(r[2] == acc for r in base), "an accumulator is not %d" % k)
        self.assertEqual(sorted(set(rows) - set(range(n))), list(range(n + 1, n + k + 1)))
        new_acc = np.ones(dim, dtype=np.float32).tobytes()
        self.assertTrue(all(rows[i][2] == new_acc for i in range(n + 1, n + k + 1)))
        return k


class TestConsistentBackup(TempDirTest):
    """embkv_backup while another connection pushes (every push one group
    over all old rows plus one new row): each backup, opened as a table of
    its own, is the table after exactly one push count K, optimizer state
    included (read back through an export of the restored table); the
    checkpoint it names is one embkv_checkpoint reports afterwards."""

    N = TestConsistentExport.N
    DIM = TestConsistentExport.DIM
    check_one_state = TestConsistentExport.check_one_state

    def test_backup_while_pushing(self):
        n, dim = self.N, self.DIM
        a, th, stop, errors, pushes = start_pusher(self.db, n, dim, ", cache_size='256K'")
        seen, checkpoints = set(), []
        try:
            for i in range(5):
                while pushes[0] == 0 and not errors:
                    time.sleep(0.001)
                if errors:
                    break
                path = os.path.join(self.dir, "b%d" % i)
                (info,) = a.execute("SELECT embkv_backup('t', ?)", (path,)).fetchone()
                info = json.loads(info)
                checkpoints.append(info["checkpoint"])
                a.execute("CREATE VIRTUAL TABLE r%d USING embkv(dim=%d, optimizer=adagrad, lr=0.5, path='%s')"
                          % (i, dim, path))
                ex = os.path.join(self.dir, "r%d.export" % i)
                a.execute("SELECT embkv_export('r%d', ?)" % i, (ex,)).fetchone()
                got = file_rows(ex)
                self.assertEqual(info["rows"], len(got))
                seen.add(self.check_one_state(got))
                time.sleep(0.05)
        finally:
            stop.set()
            th.join()
        if errors:
            raise errors[0]
        self.assertGreaterEqual(len(seen), 2, "every backup saw the same push count: %s" % sorted(seen))
        self.assertEqual(checkpoints, sorted(checkpoints))
        (now,) = a.execute("SELECT embkv_checkpoint('t')").fetchone()
        self.assertGreater(now, checkpoints[-1])
        a.close()


class TestBackupNames(TempDirTest):
    def test_relative_dir_is_beside_the_database(self):
        """A relative backup directory is taken from the database file's
        directory, as path= is: the restore of docs/operations.md finds the rows
        whatever the process's current directory; the table's options
        come along (a CREATE leaving them out trains as the source)."""
        sub = os.path.join(self.dir, "sub")
        os.mkdir(sub)
        elsewhere = os.path.join(self.dir, "elsewhere")
        os.mkdir(elsewhere)
        old = os.getcwd()
        os.chdir(elsewhere)
        try:
            c = connect(os.path.join("..", "sub", "db.sqlite"))
            c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, optimizer=adagrad, lr=0.5, init=zeros)")
            c.execute("SELECT embkv_push('t', '[1, 2]', '[1, 2, 3, 4]')").fetchone()
            (info,) = c.execute("SELECT embkv_backup('t', 'rel.backup')").fetchone()
            self.assertEqual(json.loads(info)["rows"], 2)
            self.assertTrue(os.path.isdir(os.path.join(sub, "rel.backup")))
            self.assertFalse(os.path.exists(os.path.join(elsewhere, "rel.backup")))
            c.execute("CREATE VIRTUAL TABLE r USING embkv(dim=2, path='rel.backup')")
            self.assertEqual(table_rows(c, "r"), table_rows(c, "t"))
            c.execute("SELECT embkv_push('t', '[1]', '[0.5, -1]'), embkv_push('r', '[1]', '[0.5, -1]')").fetchone()
            self.assertEqual(table_rows(c, "r"), table_rows(c, "t"))
            c.close()
        finally:
            os.chdir(old)


    def test_names_up_to_name_max(self):
        """A backup directory or an export file may have any legal name, up
        to 255 bytes: the temporary name beside it keeps only what fits
        (names of 239 bytes and more failed as too long)."""
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2)")
        c.execute("INSERT INTO t(id, vec) VALUES (1, '[1, 2]'), (2, '[3, 4]')")
        for length in (200, 238, 239, 250, 255):
            bdir = os.path.join(self.dir, "B" * (length - 1) + str(length % 10))
            (info,) = c.execute("SELECT embkv_backup('t', ?)", (bdir,)).fetchone()
            self.assertEqual(json.loads(info)["rows"], 2)
            efile = os.path.join(self.dir, "E" * (length - 1) + str(length % 10))
            self.assertEqual(c.execute("SELECT embkv_export('t', ?)", (efile,)).fetchone()[0], 2)
            c.execute("CREATE VIRTUAL TABLE r USING embkv(dim=2, path='%s')" % bdir)
            self.assertEqual(table_rows(c, "r"), table_rows(c, "t"))
            c.execute("DROP TABLE r")
            self.assertEqual(file_rows(efile).keys(), {1, 2})
        self.assertEqual([f for f in os.listdir(self.dir) if "embkv-tmp" in f], [])
        # one byte more is the file system's refusal, naming the file
        with self.assertRaisesRegex(sqlite3.Error, "File name too long"):
            c.execute("SELECT embkv_export('t', ?)", (os.path.join(self.dir, "E" * 256),)).fetchone()
        c.close()


class TestRoundTrip(TempDirTest):
    def test_100k_rows_bit_for_bit(self):
        dim, n = 16, 100000
        c = connect(self.db)
        opts = "dim=%d, optimizer=adam, lr=0.01, init='normal(0,0.5)', seed=11, capacity=150000" % dim
        c.execute("CREATE VIRTUAL TABLE t USING embkv(%s)" % opts)
        rng = np.random.default_rng(5)
        ids = np.unique(rng.integers(-2 ** 62, 2 ** 62, size=n + 1000, dtype=np.int64))[:n]
        ids = np.append(ids[:-2], [-2 ** 63, 2 ** 63 - 1])
        rng.shuffle(ids)
        for lo in range(0, n, 20000):
            c.execute("SELECT length(embkv_pull('t', ?))", (ids[lo:lo + 20000].tobytes(),)).fetchone()
        # pushes on random subsets: clocks 0..5, adam's moments all different
        for step in range(5):
            sub = ids[rng.random(n) < 0.5]
            g = rng.standard_normal((len(sub), dim)).astype(np.float32)
            c.execute("SELECT embkv_push('t', ?, ?)", (sub.tobytes(), g.tobytes())).fetchone()
        f1 = os.path.join(self.dir, "t.export")
        (rows,) = c.execute("SELECT embkv_export('t', ?)", (f1,)).fetchone()
        self.assertEqual(rows, n)
        meta = file_meta(f1)
        self.assertEqual((meta["format"], meta["format_version"], meta["dim"], meta["state_floats"], meta["rows"],
                          meta["optimizer"]), ("embkv-export", 1, dim, 2 * dim + 1, n, "adam"))
        exported = file_rows(f1)
        src = table_rows(c, "t")
        self.assertEqual(set(exported), set(int(i) for i in ids))
        clocks = {}
        for i, (clock, vec, state, crc) in exported.items():
            self.assertEqual((clock, vec), src[i])
            self.assertEqual(len(state), 4 * (2 * dim + 1))
            self.assertEqual(crc, zlib.crc32(struct.pack("<qq", i, clock) + vec + state))
            clocks[clock] = clocks.get(clock, 0) + 1
        self.assertGreaterEqual(len(clocks), 5)
        # into a fresh table: vectors and clocks bit for bit; its export is
        # the same file row for row (the state)
        c.execute("CREATE VIRTUAL TABLE u USING embkv(%s)" % opts)
        (got,) = c.execute("SELECT embkv_import('u', ?)", (f1,)).fetchone()
        self.assertEqual(got, n)
        self.assertEqual(table_rows(c, "u"), src)
        f2 = os.path.join(self.dir, "u.export")
        c.execute("SELECT embkv_export('u', ?)", (f2,)).fetchone()
        self.assertEqual(file_rows(f2), exported)
        # a pool too small for the file (and no SSD tier): refused before
        # anything is written, saying what to do
        c.execute("CREATE VIRTUAL TABLE small USING embkv(%s, pool_size='16M')" % opts.replace(", capacity=150000", ""))
        with self.assertRaises(sqlite3.Error) as cm:
            c.execute("SELECT embkv_import('small', ?)", (f1,)).fetchone()
        self.assertRegex(str(cm.exception), r"^embkv_import: table small: file '.*t.export' holds 100000 rows "
                         r"\(100000 of them new to the table\): .*larger capacity or pool_size")
        self.assertEqual(c.execute("SELECT count(*) FROM small").fetchone()[0], 0)
        # and the state acts the same: one more push on both
        sub = ids[:5000]
        g = rng.standard_normal((len(sub), dim)).astype(np.float32).tobytes()
        for tab in ("t", "u"):
            c.execute("SELECT embkv_push(?, ?, ?)", (tab, sub.tobytes(), g)).fetchone()
        self.assertEqual(table_rows(c, "u"), table_rows(c, "t"))
        c.close()


class TestTiers(TempDirTest):
    def test_rows_in_the_log_and_the_cache(self):
        """Rows in the SSD log and in the DRAM cache export with their state
        (the snapshot read of whole records), and an import into a small
        pool demotes as it goes."""
        dim, n = 32, 30000
        c = connect(self.db)
        opts = ("dim=%d, optimizer=adagrad, lr=0.5, init='uniform(-1,1)', seed=2, pool_size='16M', "
                "ssd_size='128M', cache_size='1M', capacity=%d" % (dim, n))
        c.execute("CREATE VIRTUAL TABLE t USING embkv(%s)" % opts)
        ids = np.arange(n, dtype=np.int64) * 3 - n
        g = np.random.default_rng(3).standard_normal((5000, dim)).astype(np.float32)
        for lo in range(0, n, 5000):
            b = ids[lo:lo + 5000]
            c.execute("SELECT length(embkv_pull('t', ?))", (b.tobytes(),)).fetchone()
            c.execute("SELECT embkv_push('t', ?, ?)", (b.tobytes(), g[:len(b)].tobytes())).fetchone()
        hot = ids[:2000]
        for _ in range(3):  # some rows cached (and dirty), pushed again
            c.execute("SELECT length(embkv_pull('t', ?))", (hot.tobytes(),)).fetchone()
            c.execute("SELECT embkv_push('t', ?, ?)", (hot.tobytes(), g[:2000].tobytes())).fetchone()
        tiers = dict(c.execute("SELECT tier, count(*) FROM t GROUP BY tier"))
        self.assertGreater(tiers.get("ssd", 0), 1000, tiers)
        self.assertGreater(tiers.get("dram", 0), 0, tiers)
        f1 = os.path.join(self.dir, "t.export")
        c.execute("SELECT embkv_export('t', ?)", (f1,)).fetchone()
        rows = file_rows(f1)
        self.assertEqual(len(rows), n)
        self.assertEqual({i: r[:2] for i, r in rows.items()}, table_rows(c, "t"))
        for i in (int(ids[0]), int(ids[-1])):  # adagrad's accumulator: the squares summed
            pushes = 4 if i in set(hot.tolist()) else 1
            k = int(np.nonzero(ids == i)[0][0]) % 5000
            acc = np.frombuffer(rows[i][2], dtype=np.float32)
            want = g[k].astype(np.float32) ** 2 * pushes
            self.assertTrue(np.allclose(acc, want, rtol=1e-5), (i, acc[:3], want[:3]))
        c.execute("CREATE VIRTUAL TABLE u USING embkv(%s)" % opts.replace("cache_size='1M'", "cache_size='2M'")
                  .replace("seed=2", "seed=2, path='u.embkv'"))
        (got,) = c.execute("SELECT embkv_import('u', ?)", (f1,)).fetchone()
        self.assertEqual(got, n)
        self.assertGreater(dict(c.execute("SELECT tier, count(*) FROM u GROUP BY tier")).get("ssd", 0), 1000)
        f2 = os.path.join(self.dir, "u.export")
        c.execute("SELECT embkv_export('u', ?)", (f2,)).fetchone()
        self.assertEqual(file_rows(f2), rows)
        c.close()

    def test_import_that_cannot_fit_the_tiers(self):
        """An import into a table whose pool and SSD log together cannot hold
        the file's new rows is refused before it writes (it wrote part and
        advised running it again, which failed the same way), naming
        ssd_size; one with room imports every row."""
        dim, n = 32, 60000
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE src USING embkv(dim=%d, capacity=%d)" % (dim, n))
        v = np.ones(dim, dtype=np.float32).tobytes()
        c.execute("BEGIN")
        c.executemany("INSERT INTO src(id, vec) VALUES (?, ?)", ((i, v) for i in range(n)))
        c.execute("COMMIT")
        f = os.path.join(self.dir, "src.export")
        c.execute("SELECT embkv_export('src', ?)", (f,)).fetchone()
        c.execute("CREATE VIRTUAL TABLE small USING embkv(dim=%d, pool_size='16M', ssd_size='4M')" % dim)
        c.execute("INSERT INTO small(id, vec) VALUES (-1, ?)", (v,))
        with self.assertRaises(sqlite3.OperationalError) as e:
            c.execute("SELECT embkv_import('small', ?)", (f,)).fetchone()
        self.assertEqual(getattr(e.exception, "sqlite_errorcode", sqlite3.SQLITE_FULL), sqlite3.SQLITE_FULL)
        self.assertIn("embkv_import: table small: file '%s' holds %d rows (%d of them new to the table)" % (f, n, n),
                      str(e.exception))
        self.assertIn("more rows do not fit: the pool and the SSD log together have room for at most",
                      str(e.exception))
        self.assertIn("records of 192 bytes): open the store with a larger ssd_size (it may grow, not shrink; in "
                      "SQL, while no connection of the process has the store open: CREATE VIRTUAL TABLE of one "
                      "more table with path= the store directory and the larger ssd_size, then DROP TABLE of it, which "
                      "leaves the store)", str(e.exception))
        self.assertEqual(c.execute("SELECT id FROM small").fetchall(), [(-1,)])
        # The advice followed, in a process that has not opened the store.
        small = json.loads(c.execute("SELECT embkv_stats('small')").fetchone()[0])["path"]
        c.close()
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE grow USING embkv(dim=%d, path='%s', ssd_size='64M')"
                  % (dim, small.replace("'", "''")))
        c.execute("DROP TABLE grow")
        self.assertEqual(c.execute("SELECT embkv_import('small', ?)", (f,)).fetchone()[0], n)
        self.assertEqual(c.execute("SELECT count(*) FROM small").fetchone()[0], n + 1)
        self.assertEqual(json.loads(c.execute("SELECT embkv_stats('small')").fetchone()[0])["tiers"]["ssd"]
                         ["capacity_bytes"], 64 << 20)
        c.execute("CREATE VIRTUAL TABLE big USING embkv(dim=%d, pool_size='16M', ssd_size='64M')" % dim)
        self.assertEqual(c.execute("SELECT embkv_import('big', ?)", (f,)).fetchone()[0], n)
        self.assertEqual(c.execute("SELECT count(*) FROM big").fetchone()[0], n)
        c.close()


# A process that imports argv[3] into table t of database argv[1] while a
# thread prints the row count it sees, over and over.
IMPORTING_CHILD = r"""
import sqlite3, sys, threading
db, ext, path = sys.argv[1:4]
def connect():
    c = sqlite3.connect(db, isolation_level=None, check_same_thread=False, timeout=30)
    c.enable_load_extension(True)
    c.load_extension(ext)
    return c
a, b = connect(), connect()
b.execute("SELECT count(*) FROM t").fetchone()
# One line at a time: print writes the text and its newline apart, and two
# threads' lines came out as "importedcount 200000".
out = threading.Lock()
def say(word, num):
    with out:
        sys.stdout.write("%s %d\n" % (word, num))
        sys.stdout.flush()
def watch():
    while True:
        say("count", b.execute("SELECT count(*) FROM t").fetchone()[0])
threading.Thread(target=watch, daemon=True).start()
say("imported", a.execute("SELECT embkv_import('t', ?)", (path,)).fetchone()[0])
"""


class TestCrash(TempDirTest):
    def test_killed_export_leaves_nothing_for_long(self):
        """SIGKILL while an export writes its temporary file: the file stays
        (nobody can remove it at that moment), and the next export to the
        same name removes it, leaving only the finished file; a temporary
        file of an export still running is left alone."""
        dim, n = 16, 200000
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE s USING embkv(dim=%d, init='normal(0,1)', capacity=%d)" % (dim, n))
        for lo in range(0, n, 50000):
            c.execute("SELECT length(embkv_pull('s', ?))", (ids_blob(range(lo, lo + 50000)),)).fetchone()
        c.close()
        path = os.path.join(self.dir, "ex.export")
        child_code = ("import sqlite3, sys\nc = sqlite3.connect(sys.argv[1])\nc.enable_load_extension(True)\n"
                      "c.load_extension(sys.argv[2])\nc.execute('SELECT embkv_export(\\'s\\', ?)', (sys.argv[3],))")
        left = []
        for attempt in range(3):
            child = subprocess.Popen([sys.executable, "-c", child_code, self.db, EXT, path],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            deadline = time.time() + 60
            while time.time() < deadline and child.poll() is None:
                tmps = [f for f in os.listdir(self.dir) if f.startswith("ex.export.embkv-tmp-")]
                if tmps and os.path.getsize(os.path.join(self.dir, tmps[0])) > (1 << 20) * attempt:
                    break
                time.sleep(0.002)
            child.send_signal(signal.SIGKILL)
            child.communicate(timeout=60)
            self.assertEqual(child.returncode, -signal.SIGKILL, "the export finished before the kill")
            self.assertFalse(os.path.exists(path))
            left = [f for f in os.listdir(self.dir) if f.startswith("ex.export.embkv-tmp-")]
            self.assertEqual(len(left), 1, left)
        c = connect(self.db)
        # an export to another name leaves this one's leftovers alone
        c.execute("SELECT embkv_export('s', ?)", (os.path.join(self.dir, "other.export"),)).fetchone()
        self.assertEqual([f for f in os.listdir(self.dir) if f.startswith("ex.export.embkv-tmp-")], left)
        self.assertEqual(c.execute("SELECT embkv_export('s', ?)", (path,)).fetchone()[0], n)
        c.close()
        self.assertEqual([f for f in os.listdir(self.dir) if "embkv-tmp" in f], [])
        self.assertEqual(len(file_rows(path)), n)

    def test_leftovers_that_are_no_export_of_ours(self):
        """A FIFO under a temporary file's name does not hang an export; a
        leftover goes even when the export then fails because the file
        exists; an empty leftover (an export killed before its first write)
        goes once it is a minute old, not before (it may be an export in its
        first moment)."""
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE s USING embkv(dim=4, init='zeros')")
        c.execute("SELECT length(embkv_pull('s', '[1,2,3]'))").fetchone()
        path = os.path.join(self.dir, "f.export")
        fifo = path + ".embkv-tmp-0badc0de"
        os.mkfifo(fifo)
        done = []
        c2 = connect(self.db, check_same_thread=False)
        t = threading.Thread(target=lambda: done.append(
            c2.execute("SELECT embkv_export('s', ?)", (path,)).fetchone()[0]), daemon=True)
        t.start()
        t.join(30)
        self.assertEqual(done, [3])
        c2.close()
        self.assertTrue(os.path.exists(fifo))  # not ours to remove
        left = path + ".embkv-tmp-12345678"
        with open(left, "wb") as fh:
            fh.write(b"x" * 4096)
        empty = path + ".embkv-tmp-9abcdef0"
        open(empty, "wb").close()
        with self.assertRaisesRegex(sqlite3.OperationalError, "already exists"):
            c.execute("SELECT embkv_export('s', ?)", (path,)).fetchone()
        self.assertFalse(os.path.exists(left))
        self.assertTrue(os.path.exists(empty))
        old = time.time() - 120
        os.utime(empty, (old, old))
        os.unlink(path)
        self.assertEqual(c.execute("SELECT embkv_export('s', ?)", (path,)).fetchone()[0], 3)
        self.assertFalse(os.path.exists(empty))
        c.close()

    def test_killed_import_leaves_the_table_as_before(self):
        """SIGKILL while the rows come in (some already visible to the
        child's readers): the table reopens as it was before the import;
        an import that returned is durable."""
        dim, n, before = 16, 200000, 10
        src = connect(os.path.join(self.dir, "src.db"))
        src.execute("CREATE VIRTUAL TABLE s USING embkv(dim=%d, init='normal(0,1)', capacity=%d)" % (dim, n))
        for lo in range(0, n, 50000):
            src.execute("SELECT length(embkv_pull('s', ?))", (ids_blob(range(lo, lo + 50000)),)).fetchone()
        path = os.path.join(self.dir, "s.export")
        src.execute("SELECT embkv_export('s', ?)", (path,)).fetchone()
        src.close()
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d, capacity=%d)" % (dim, n + before))
        c.execute("BEGIN")
        for i in range(before):  # rows the import replaces: their clocks and values must come back
            c.execute("INSERT INTO t(id, vec) VALUES (?, ?)", (i, np.full(dim, -i, np.float32).tobytes()))
        c.execute("COMMIT")
        c.execute("UPDATE t SET vec = vec WHERE id < 5")
        want = table_rows(c, "t")
        c.close()
        killed_partial = 0
        for attempt in range(3):
            child = subprocess.Popen([sys.executable, "-c", IMPORTING_CHILD, self.db, EXT, path],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            seen = []
            try:
                for line in child.stdout:
                    word, num = line.split()
                    seen.append(int(num))
                    if word == "imported":
                        break
                    if before < int(num) < n:  # part of the import is in
                        child.send_signal(signal.SIGKILL)
                        break
            finally:
                child.kill()
                child.wait(60)
                err = child.stderr.read()
                child.stdout.close()
                child.stderr.close()
            self.assertTrue(seen, err)
            c = connect(self.db)
            self.assertEqual(table_rows(c, "t"), want, "after a kill at %d rows" % seen[-1])
            c.close()
            killed_partial += child.returncode == -signal.SIGKILL
        self.assertGreater(killed_partial, 0)
        # uninterrupted: the import is durable when it returns (a kill then
        # changes nothing)
        child = subprocess.Popen([sys.executable, "-c", IMPORTING_CHILD, self.db, EXT, path],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            for line in child.stdout:
                if line.startswith("imported"):
                    self.assertEqual(line.split(), ["imported", str(n)])
                    child.send_signal(signal.SIGKILL)
                    break
        finally:
            child.kill()
            child.wait(60)
            child.stdout.close()
            child.stderr.close()
        c = connect(self.db)
        got = table_rows(c, "t")
        self.assertEqual(len(got), n)
        self.assertEqual(got, {i: r[:2] for i, r in file_rows(path).items()})
        c.close()


class TestBadFiles(TempDirTest):
    def setUp(self):
        super().setUp()
        # Hundreds of imports, each ending in a checkpoint: on tmpfs when
        # there is one (an msync of the pool costs ~0.1 s on a disk here).
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = tempfile.mkdtemp(prefix="embkv-py-", dir="/dev/shm")
            self.db = os.path.join(self.dir, "test.db")
        self.c = connect(self.db)
        self.c.execute("CREATE VIRTUAL TABLE src USING embkv(dim=4, optimizer=adagrad, lr=0.5, init='uniform(-1,1)')")
        ids = np.arange(-150, 150, dtype=np.int64)
        self.c.execute("SELECT length(embkv_pull('src', ?))", (ids.tobytes(),)).fetchone()
        g = np.random.default_rng(1).standard_normal((300, 4)).astype(np.float32)
        self.c.execute("SELECT embkv_push('src', ?, ?)", (ids.tobytes(), g.tobytes())).fetchone()
        self.good = os.path.join(self.dir, "good.export")
        self.c.execute("SELECT embkv_export('src', ?)", (self.good,)).fetchone()
        self.c.execute("CREATE VIRTUAL TABLE dst USING embkv(dim=4, optimizer=adagrad, lr=0.5)")
        self.want = table_rows(self.c, "src")

    def tearDown(self):
        self.c.close()
        super().tearDown()

    def attempt(self, path):
        """Imports path into dst: a clean error (dst unchanged) or the
        original rows exactly; then empties dst.  Returns the message or
        None."""
        try:
            (n,) = self.c.execute("SELECT embkv_import('dst', ?)", (path,)).fetchone()
        except sqlite3.Error as e:
            msg = str(e)
            self.assertTrue(msg.startswith("embkv_import: table dst: "), msg)
            self.assertIn(os.path.basename(path), msg)
            self.assertEqual(self.c.execute("SELECT count(*) FROM dst").fetchone()[0], 0, msg)
            return msg
        self.assertEqual(n, len(self.want))
        self.assertEqual(table_rows(self.c, "dst"), self.want)
        self.c.execute("DELETE FROM dst")
        return None

    def test_files_that_are_no_regular_file_or_unreadable(self):
        """A FIFO (an open of it would wait for a writer for good), a
        device, a file the process may not read: refused at once, naming
        the file and the system's reason."""
        fifo = os.path.join(self.dir, "pipe.export")
        os.mkfifo(fifo)
        done = threading.Event()

        def unblock():  # (should the import wait on the FIFO: a writer that closes, so that the test fails, not hangs)
            if not done.wait(5):
                os.close(os.open(fifo, os.O_WRONLY))
        t = threading.Thread(target=unblock)
        t.start()
        t0 = time.monotonic()
        msg = self.attempt(fifo)
        done.set()
        t.join()
        self.assertEqual(msg, "embkv_import: table dst: file '%s' is not a regular file (a FIFO), not an embkv export"
                         % fifo)
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(self.attempt("/dev/zero"), "embkv_import: table dst: file '/dev/zero' is not a regular file "
                         "(a character device), not an embkv export")
        if os.geteuid() != 0:  # (root reads anything)
            locked = os.path.join(self.dir, "locked.export")
            shutil.copy(self.good, locked)
            os.chmod(locked, 0)
            self.assertEqual(self.attempt(locked), "embkv_import: table dst: cannot open file '%s': Permission "
                             "denied" % locked)
        else:  # as nobody: the reason the system gives
            os.chmod(self.dir, 0o755)
            os.chmod(self.good, 0o600)
            script = ("import sqlite3, sys\n"
                      "c = sqlite3.connect(':memory:')\n"
                      "c.enable_load_extension(True)\n"
                      "c.load_extension(sys.argv[1])\n"
                      "c.execute(\"CREATE VIRTUAL TABLE d USING embkv(dim=4, optimizer=adagrad)\")\n"
                      "try:\n"
                      "    c.execute(\"SELECT embkv_import('d', ?)\", (sys.argv[2],)).fetchone()\n"
                      "except sqlite3.Error as e:\n"
                      "    print(e)\n")
            r = subprocess.run([sys.executable, "-c", script, EXT, self.good], user=65534, capture_output=True,
                               text=True, timeout=60, cwd="/")
            if r.returncode != 0 and "Permission denied" in r.stderr and "embkv_import" not in r.stderr:
                self.skipTest("user nobody cannot run this Python or load the extension here")
            self.assertEqual(r.stdout.strip(), "embkv_import: table d: cannot open file '%s': Permission denied"
                             % self.good, r.stderr[-500:])

    def test_truncated(self):
        with open(self.good, "rb") as f:
            data = f.read()
        path = os.path.join(self.dir, "cut.export")
        failed = 0
        for size in sorted({0, 1, 99, 100, 512, 4096, 4097, len(data) // 2, len(data) - 4096, len(data) - 1}):
            with open(path, "wb") as f:
                f.write(data[:size])
            failed += self.attempt(path) is not None
        self.assertGreaterEqual(failed, 8)

    def test_flipped_bytes(self):
        with open(self.good, "rb") as f:
            data = f.read()
        path = os.path.join(self.dir, "flip.export")
        rnd = random.Random(7)
        flips = int(os.environ.get("EMBKV_EXPORT_FLIPS", "300"))
        kinds = {"ok": 0}
        for _ in range(flips):
            d = bytearray(data)
            at = rnd.randrange(len(d))
            d[at] ^= rnd.randrange(1, 256)
            with open(path, "wb") as f:
                f.write(d)
            msg = self.attempt(path)
            if msg is None:
                kinds["ok"] += 1
            else:
                key = "crc" if "crc" in msg else "malformed" if "malformed" in msg else "other"
                kinds[key] = kinds.get(key, 0) + 1
        # flips in free space or informative meta import the rows exactly;
        # the others are caught (by the crc, or by SQLite's own checks)
        self.assertGreater(flips - kinds["ok"], flips // 10, kinds)

    def test_flipped_row_bytes(self):
        """A byte changed in a row's vector or state is always caught, by
        that row's crc, before anything is written."""
        with open(self.good, "rb") as f:
            data = f.read()
        rows = file_rows(self.good)
        path = os.path.join(self.dir, "row.export")
        rnd = random.Random(3)
        for i in sorted(rows)[::10]:
            col = rnd.choice((1, 2))  # vec or state
            at = data.find(rows[i][col])
            self.assertGreater(at, 0)
            d = bytearray(data)
            d[at + rnd.randrange(len(rows[i][col]))] ^= 1 << rnd.randrange(8)
            with open(path, "wb") as f:
                f.write(d)
            msg = self.attempt(path)
            self.assertIsNotNone(msg)
            self.assertIn("is damaged: row id %d: its crc" % i, msg)

    def test_non_finite_values_with_valid_crc(self):
        for what, col in (("nan", "vec"), ("inf", "state")):
            path = os.path.join(self.dir, "%s.export" % what)
            shutil.copy(self.good, path)
            f = sqlite3.connect(path)
            (i, clock, vec, state) = f.execute("SELECT id, clock, vec, state FROM embkv_rows LIMIT 1 OFFSET 7").fetchone()
            v = bytearray(vec if col == "vec" else state)
            v[4:8] = struct.pack("<f", float(what))
            vec, state = (bytes(v), state) if col == "vec" else (vec, bytes(v))
            crc = zlib.crc32(struct.pack("<qq", i, clock) + vec + state)
            f.execute("UPDATE embkv_rows SET vec = ?, state = ?, crc = ? WHERE id = ?", (vec, state, crc, i))
            f.commit()
            f.close()
            msg = self.attempt(path)
            self.assertIsNotNone(msg)
            self.assertIn("row id %d: %s element 1 is %s" % (i, col, "NaN" if what == "nan" else "infinite"), msg)

    def edited(self, name, row_sql=None, meta_sql=None, args=()):
        """A copy of the good export with one edit, its crcs made valid."""
        path = os.path.join(self.dir, name)
        shutil.copy(self.good, path)
        f = sqlite3.connect(path)
        if meta_sql:
            f.execute(meta_sql, args)
        if row_sql:
            f.execute(row_sql, args)
            for i, clock, vec, state in f.execute("SELECT id, clock, vec, state FROM embkv_rows").fetchall():
                crc = zlib.crc32(struct.pack("<qq", i, clock) + vec + (state or b""))
                f.execute("UPDATE embkv_rows SET crc = ? WHERE id = ?", (crc, i))
        f.commit()
        f.close()
        return path

    def test_state_the_optimizer_cannot_have(self):
        """Adagrad's accumulated squared gradients are never negative: a
        file claiming one (crc valid) is refused before anything is
        written (it sent the next push to -1e9)."""
        (i,) = self.c.execute("SELECT id FROM src LIMIT 1 OFFSET 5").fetchone()
        st = struct.pack("<4f", 0.5, -1.0, 0.25, 0.0)
        path = self.edited("negacc.export", "UPDATE embkv_rows SET state = ? WHERE id = ?", args=(st, i))
        msg = self.attempt(path)
        self.assertIsNotNone(msg)
        self.assertIn("row id %d: state element 1 is -1: adagrad's accumulated squared gradients are >= 0" % i, msg)
        # -0 is zero: taken
        st = struct.pack("<4f", 0.5, -0.0, 0.25, 0.0)
        path = self.edited("negzero.export", "UPDATE embkv_rows SET state = ? WHERE id = ?", args=(st, i))
        self.c.execute("SELECT embkv_import('dst', ?)", (path,)).fetchone()
        self.c.execute("DELETE FROM dst")

    def test_adam_state_the_optimizer_cannot_have(self):
        """Adam's state is the first moments, the second moments (>= 0) and
        the step count (a whole number >= 0): a file breaking either rule
        is refused, naming the element."""
        dim = 4
        self.c.execute("CREATE VIRTUAL TABLE asrc USING embkv(dim=4, optimizer=adam, lr=0.01, init='uniform(-1,1)')")
        ids = np.arange(0, 50, dtype=np.int64)
        self.c.execute("SELECT length(embkv_pull('asrc', ?))", (ids.tobytes(),)).fetchone()
        g = np.random.default_rng(2).standard_normal((50, dim)).astype(np.float32)
        self.c.execute("SELECT embkv_push('asrc', ?, ?)", (ids.tobytes(), g.tobytes())).fetchone()
        good = os.path.join(self.dir, "adam.export")
        self.c.execute("SELECT embkv_export('asrc', ?)", (good,)).fetchone()
        self.c.execute("CREATE VIRTUAL TABLE adst USING embkv(dim=4, optimizer=adam, lr=0.01)")
        keep = self.good
        self.good = good
        try:
            cases = (
                (dim + 2, -0.5, "state element 6 is -0.5: adam's second moments are >= 0"),
                (2 * dim, 1.5, "state element 8 is 1.5: adam's step count is a whole number >= 0"),
                (2 * dim, -1.0, "state element 8 is -1: adam's step count is a whole number >= 0"),
                (1, -3.0, None),  # a first moment may be negative
            )
            for k, value, want in cases:
                st = list(struct.unpack("<9f", file_rows(good)[7][2]))
                st[k] = value
                path = self.edited("adam%d.export" % k, "UPDATE embkv_rows SET state = ? WHERE id = 7",
                                   args=(struct.pack("<9f", *st),))
                try:
                    self.c.execute("SELECT embkv_import('adst', ?)", (path,)).fetchone()
                    self.assertIsNone(want)
                except sqlite3.Error as e:
                    self.assertIsNotNone(want, str(e))
                    self.assertIn("row id 7: " + want, str(e))
                    self.assertEqual(self.c.execute("SELECT count(*) FROM adst").fetchone()[0], 0)
                self.c.execute("DELETE FROM adst")
        finally:
            self.good = keep

    def test_float_format(self):
        """The values are float32 little-endian, as embkv_meta says; a file
        that says otherwise, or nothing, is refused, not read as float32."""
        path = self.edited("f64.export", meta_sql="UPDATE embkv_meta SET value = 'float64-le' WHERE key = 'float_format'")
        msg = self.attempt(path)
        self.assertIn("holds values of float_format 'float64-le'; this build reads 'float32-le'", msg)
        path = self.edited("nofmt.export", meta_sql="DELETE FROM embkv_meta WHERE key = 'float_format'")
        msg = self.attempt(path)
        self.assertIn("is damaged: embkv_meta lacks float_format", msg)

    def test_clock_at_its_limit(self):
        """A clock of 2^63 - 1 imports, stays there through pushes (it
        showed negative before), and the table's own export imports again."""
        big = (1 << 63) - 1
        (i,) = self.c.execute("SELECT id FROM src LIMIT 1 OFFSET 9").fetchone()
        path = self.edited("bigclock.export", "UPDATE embkv_rows SET clock = ? WHERE id = ?", args=(big, i))
        self.c.execute("SELECT embkv_import('dst', ?)", (path,)).fetchone()
        ids = np.array([i], dtype=np.int64)
        for _ in range(3):
            self.c.execute("SELECT length(embkv_pull('dst', ?))", (ids.tobytes(),)).fetchone()
            self.c.execute("SELECT embkv_push('dst', ?, ?)", (ids.tobytes(), np.ones(4, np.float32).tobytes())).fetchone()
            self.assertEqual(self.c.execute("SELECT clock FROM dst WHERE id = ?", (i,)).fetchone()[0], big)
        # written in an open transaction: the clock it will have (it read NULL)
        self.c.execute("BEGIN")
        self.c.execute("UPDATE dst SET vec = ? WHERE id = ?", (np.ones(4, np.float32).tobytes(), i))
        self.assertEqual(self.c.execute("SELECT clock FROM dst WHERE id = ?", (i,)).fetchone()[0], big)
        self.c.execute("COMMIT")
        self.assertEqual(self.c.execute("SELECT clock FROM dst WHERE id = ?", (i,)).fetchone()[0], big)
        again = os.path.join(self.dir, "again.export")
        self.c.execute("SELECT embkv_export('dst', ?)", (again,)).fetchone()
        self.c.execute("CREATE VIRTUAL TABLE dst2 USING embkv(dim=4, optimizer=adagrad, lr=0.5)")
        self.assertEqual(self.c.execute("SELECT embkv_import('dst2', ?)", (again,)).fetchone()[0], len(self.want))
        self.assertEqual(self.c.execute("SELECT clock FROM dst2 WHERE id = ?", (i,)).fetchone()[0], big)
        self.c.execute("DROP TABLE dst2")
        self.c.execute("DELETE FROM dst")

    def test_racing_exports_to_one_name(self):
        path = os.path.join(self.dir, "race.export")
        results = []

        def go():
            c = connect(self.db)
            try:
                results.append(c.execute("SELECT embkv_export('src', ?)", (path,)).fetchone()[0])
            except sqlite3.Error as e:
                results.append(str(e))
            finally:
                c.close()

        for _ in range(5):
            ths = [threading.Thread(target=go) for _ in range(3)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            wins = [r for r in results if r == 300]
            self.assertEqual(len(wins), 1, results)
            for r in results:
                if r != 300:
                    self.assertRegex(r, "file '.*race.export' (already exists|was created by someone else)")
            self.assertEqual(file_rows(path), file_rows(self.good))
            self.assertEqual([f for f in os.listdir(self.dir) if "embkv-tmp" in f], [])
            os.unlink(path)
            results.clear()


class TestFullFileSystem(TempDirTest):
    """A file system with room for the pool and little else (a tmpfs of
    16 MiB + k KiB for a pool of 16 MiB): every backup and CREATE there
    either works or fails with a message naming what has no room; the
    process never dies of SIGBUS (a mapped file whose blocks the file
    system could not give), and a failed backup leaves nothing at its
    name."""

    SCRIPT = r"""
import json, sqlite3, sys
ext, db, target, mode = sys.argv[1:5]
c = sqlite3.connect(db, isolation_level=None)
c.enable_load_extension(True)
c.load_extension(ext)
try:
    if mode == "backup":
        c.execute("CREATE VIRTUAL TABLE item USING embkv(dim=16, init='zeros', pool_size='16M')")
        c.execute("INSERT INTO item(id, vec) VALUES (1, zeroblob(64))")
        print("ok", c.execute("SELECT embkv_backup('item', ?)", (target,)).fetchone()[0])
    else:
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=16, pool_size='16M', path=%s)" % json.dumps(target))
        print("ok created")
except sqlite3.Error as e:
    print("error", e)
"""

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("mounting a small tmpfs needs root")
        self.small = os.path.join(self.dir, "small")
        os.makedirs(self.small)
        self.mounted = False

    def mount(self, kib):
        if self.mounted:
            subprocess.run(["umount", self.small], check=True)
            self.mounted = False
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dk" % kib, "tmpfs", self.small],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("cannot mount a tmpfs here: %s" % r.stderr.strip())
        self.mounted = True

    def tearDown(self):
        if self.mounted:
            if subprocess.run(["umount", self.small], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", self.small])
        super().tearDown()

    def attempt(self, mode, kib, n):
        self.mount(kib)
        db = os.path.join(self.dir, "m%d.db" % n)
        target = os.path.join(self.small, "b")
        r = subprocess.run([sys.executable, "-c", self.SCRIPT, EXT, db, target, mode], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, "%s at 16 MiB + %d KiB: exit %d (%s)" % (mode, kib - 16384, r.returncode,
                                                                                 r.stderr[-500:]))
        return r.stdout.strip(), target

    def test_backup_and_create_on_a_nearly_full_file_system(self):
        seen = set()
        for n, extra in enumerate([16] + list(range(60, 104, 4))):
            out, target = self.attempt("backup", 16384 + extra, n)
            if out.startswith("ok"):
                self.assertEqual(json.loads(out[3:])["rows"], 1)
                copy = os.path.join(self.dir, "copy%d" % n)  # (a table records itself there: room elsewhere)
                shutil.copytree(target, copy)
                c = connect(os.path.join(self.dir, "check%d.db" % n))
                try:
                    c.execute("CREATE VIRTUAL TABLE r USING embkv(dim=16, path=%s)" % json.dumps(copy))
                    self.assertEqual(c.execute("SELECT count(*) FROM r").fetchone()[0], 1)
                finally:
                    c.close()
                seen.add("whole")
                continue
            self.assertTrue(out.startswith("error embkv_backup: table item: "), out)
            self.assertIn("No space left on device", out)
            self.assertEqual(os.listdir(self.small), [], out)  # nothing at the name, no temporary copy
            if "no room for its reader table READERS (69632 bytes)" in out:
                seen.add("readers")
            elif "into the backup" in out:
                seen.add("app file")
        self.assertEqual(seen, {"readers", "app file", "whole"})
        out, target = self.attempt("create", 16384 + 16, 99)
        self.assertIn("error embkv table t: cannot open its store: store %s: no room for its reader table READERS "
                      "(69632 bytes): No space left on device: free space on its file system" % target, out)


if __name__ == "__main__":
    unittest.main()
