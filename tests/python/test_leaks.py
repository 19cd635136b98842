"""What a killed or careless process leaves on disk goes away:

- the default directory of a CREATE VIRTUAL TABLE killed before it
  committed is removed by the next CREATE in that database, while the
  directories of committed tables, of stores open in another process and of
  stores other tables use stay;
- a CREATE into an existing empty directory (or one holding only what a
  killed creation left) owns it: DROP removes it;
- the temporary store of a :memory: table whose process was SIGKILLed is
  removed by the next process that makes a temporary table;
- a table renamed and then dropped loses its directory at the DROP's
  commit, not when the connection closes (Python caches statements that
  keep the table's old instance).
"""
import glob
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from embkv_test import EXT, TempDirTest, connect

CHILD = r"""
import sqlite3, sys, os
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.enable_load_extension(True)
c.load_extension(sys.argv[2])
print("ready", flush=True)
c.executescript(sys.argv[3])
print("done", flush=True)
sys.stdin.readline()
"""


def child(db, sql, env=None):
    """A process that runs sql, says "ready" before and "done" after, and
    then waits for its stdin to close."""
    return subprocess.Popen([sys.executable, "-c", CHILD, db, EXT, sql], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)


def finish(p, kill=False):
    if kill:
        p.send_signal(signal.SIGKILL)
    p.stdin.close()
    p.wait()
    p.stdout.close()


class TestKilledCreate(TempDirTest):
    def leftovers(self):
        return sorted(glob.glob(self.db + "-*.embkv"))

    def test_next_create_removes_uncommitted_directories(self):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE kept USING embkv(dim=2)")
        c.execute("INSERT INTO kept VALUES (1, '[1,2]')")
        kept = self.leftovers()
        self.assertEqual(len(kept), 1)
        c.close()
        # Kill CREATEs of a large pool while they make it, until one leaves
        # its directory behind (and always one inside an open transaction).
        left = []
        for delay in (0.05, 0.1, 0.2, 0.4, 0.8):
            p = child(self.db, "BEGIN; CREATE VIRTUAL TABLE big USING embkv(dim=64, pool_size='512M')")
            p.stdout.readline()
            time.sleep(delay)
            finish(p, kill=True)
            left = [d for d in self.leftovers() if d not in kept]
            if left:
                break
        if not left:  # every CREATE finished inside its transaction: kill one after it
            p = child(self.db, "BEGIN; CREATE VIRTUAL TABLE big USING embkv(dim=4)")
            self.assertEqual(p.stdout.readline().strip(), "ready")
            self.assertEqual(p.stdout.readline().strip(), "done")
            finish(p, kill=True)
            left = [d for d in self.leftovers() if d not in kept]
        self.assertTrue(left, "no directory was left to test with")
        # A store open in another process and a store another table uses
        # look like leftovers by name, and must stay.
        busy = self.db + "-00000000000000aa.embkv"
        held = child(os.path.join(self.dir, "other.db"),
                     "CREATE VIRTUAL TABLE h USING embkv(dim=2, path='%s')" % busy)
        self.assertEqual(held.stdout.readline().strip(), "ready")
        self.assertEqual(held.stdout.readline().strip(), "done")
        shared = self.db + "-00000000000000bb.embkv"
        o = connect(os.path.join(self.dir, "other2.db"))
        o.execute("CREATE VIRTUAL TABLE s USING embkv(dim=2, path='%s')" % shared)
        o.close()
        c = connect(self.db)
        try:
            c.execute("CREATE VIRTUAL TABLE fresh USING embkv(dim=2)")
            now = self.leftovers()
            for d in left:
                self.assertNotIn(d, now)
            self.assertIn(kept[0], now)
            self.assertIn(busy, now)
            self.assertIn(shared, now)
            self.assertEqual(c.execute("SELECT vec FROM kept WHERE id = 1").fetchone()[0],
                             b"\x00\x00\x80\x3f\x00\x00\x00\x40")
        finally:
            c.close()
            finish(held)

    def test_uncommitted_drop_keeps_its_directory(self):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE a USING embkv(dim=2)")
        c.execute("INSERT INTO a VALUES (5, '[5,6]')")
        (d,) = self.leftovers()
        c.execute("BEGIN")
        c.execute("DROP TABLE a")
        c.execute("CREATE VIRTUAL TABLE b USING embkv(dim=2)")  # sweeps: a's directory is pending
        self.assertIn(d, self.leftovers())
        c.execute("ROLLBACK")
        self.assertEqual(c.execute("SELECT count(*) FROM a").fetchone()[0], 1)
        c.close()


class TestEmptyDirectory(TempDirTest):
    def test_create_into_empty_directory_owns_it(self):
        # what a creation killed part-way leaves: its unfinished pool, its
        # dirty map, its (empty) log directory, the note of an external log
        for leftovers in ((), ("LOCK", "store.pool.new"), ("LOCK", "READERS", "store.pool.new", "store.dirty"),
                          ("LOCK", "store.pool.new", "store.dirty", "log/", "ssd-path.tmp")):
            d = os.path.join(self.dir, "store")
            os.mkdir(d)
            for f in leftovers:
                if f.endswith("/"):
                    os.mkdir(os.path.join(d, f))
                    continue
                with open(os.path.join(d, f), "wb") as fh:
                    fh.write(b"x" * 100)
            c = connect(self.db)
            c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, path='store', optimizer='adagrad')")
            c.execute("INSERT INTO t VALUES (1, '[1,2]')")
            self.assertEqual(c.execute("SELECT embkv_push('t', 1, '[1,1]')").fetchone()[0], 1)
            self.assertFalse(os.path.exists(os.path.join(d, "store.pool.new")))
            c.execute("DROP TABLE t")
            self.assertFalse(os.path.exists(d), "DROP left the directory (leftovers %r)" % (leftovers,))
            c.close()

    def test_killed_create_with_path(self):
        """A CREATE naming its store's path, killed at any moment (the
        directory made, the reader table, the pool half made, published),
        and the same CREATE again: it makes the table with the optimizer's
        state (a directory left before the pool was published is a new
        directory, not a store to attach to)."""
        sql = ("CREATE VIRTUAL TABLE user USING embkv(dim=8, optimizer='adagrad', lr=0.05, init='zeros', path='user.embkv', "
               "pool_size='64M')")
        for i in range(16):
            d = os.path.join(self.dir, "k%d" % i)
            os.mkdir(d)
            db = os.path.join(d, "r.db")
            p = child(db, sql)
            p.stdout.readline()
            time.sleep(i * 0.004)
            finish(p, kill=True)
            c = connect(db)
            try:
                if not c.execute("SELECT 1 FROM sqlite_schema WHERE name = 'user'").fetchone():
                    c.execute(sql)
                self.assertEqual(c.execute("SELECT length(embkv_pull('user', 1))").fetchone()[0], 32)
                self.assertEqual(c.execute("SELECT embkv_push('user', 1, ?)", (b"\0" * 32,)).fetchone()[0], 1)
            finally:
                c.close()

    def test_directory_with_other_files_is_refused_and_kept(self):
        d = os.path.join(self.dir, "store")
        os.mkdir(d)
        with open(os.path.join(d, "notes.txt"), "w") as fh:
            fh.write("mine")
        c = connect(self.db)
        with self.assertRaisesRegex(Exception, "option path: .*holds other files \\(notes.txt\\)"):
            c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, path='store')")
        self.assertEqual(os.listdir(d), ["notes.txt"])
        c.close()


class TestTemporaryStores(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="embkv-py-tmp-")
        self.env = dict(os.environ, TMPDIR=self.tmp)

    def tearDown(self):
        subprocess.run(["rm", "-rf", self.tmp])

    def stores(self):
        return sorted(glob.glob(os.path.join(self.tmp, "embkv-*")))

    def test_killed_process_temporary_store_is_removed(self):
        p = child(":memory:", "CREATE VIRTUAL TABLE m USING embkv(dim=2)", env=self.env)
        self.assertEqual(p.stdout.readline().strip(), "ready")
        self.assertEqual(p.stdout.readline().strip(), "done")
        dead = self.stores()
        self.assertEqual(len(dead), 1)
        # A live process's store stays, whoever sweeps.
        live = child(":memory:", "CREATE VIRTUAL TABLE m USING embkv(dim=2)", env=self.env)
        self.assertEqual(live.stdout.readline().strip(), "ready")
        self.assertEqual(live.stdout.readline().strip(), "done")
        finish(p, kill=True)
        both = self.stores()
        self.assertEqual(len(both), 2)
        mine = child(":memory:", "CREATE VIRTUAL TABLE m USING embkv(dim=2)", env=self.env)
        self.assertEqual(mine.stdout.readline().strip(), "ready")
        self.assertEqual(mine.stdout.readline().strip(), "done")
        now = self.stores()
        self.assertNotIn(dead[0], now)
        self.assertEqual(len(now), 2)  # the live one and the new one
        for q in (live, mine):
            finish(q)
        self.assertEqual(self.stores(), [])  # both removed their own at exit


class TestCreateRace(TempDirTest):
    """Two CREATEs racing onto one new path (threads, separate databases):
    with different options exactly one wins and its store survives the
    loser's cleanup; with the same options both attach, and the store goes
    only with the second DROP."""

    def race(self, k, lrs):
        path = os.path.join(self.dir, "race%d" % k)
        won = {}

        def make(n, lr):
            c = connect(os.path.join(self.dir, "r%d_%d.db" % (n, k)), check_same_thread=False)
            try:
                c.execute("CREATE VIRTUAL TABLE x USING embkv(dim=2, path='%s', lr=%s)" % (path, lr))
                won[n] = c
            except sqlite3.DatabaseError as e:
                self.assertIn("option lr", str(e))
                c.close()

        ts = [threading.Thread(target=make, args=(n, lr)) for n, lr in enumerate(lrs)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return path, won

    def test_different_options(self):
        for k in range(12):
            path, won = self.race(k, ("0.1", "0.2"))
            self.assertEqual(len(won), 1, "race %d" % k)
            (n, c), = won.items()
            c.execute("INSERT INTO x VALUES (1, '[1,2]')")
            c.close()
            c = connect(os.path.join(self.dir, "r%d_%d.db" % (n, k)))
            self.assertEqual(c.execute("SELECT count(*) FROM x").fetchone()[0], 1, "race %d" % k)
            c.close()

    def test_same_options(self):
        for k in range(6):
            path, won = self.race(k, ("0.1", "0.1"))
            self.assertEqual(len(won), 2, "race %d" % k)
            first, second = won[0], won[1]
            first.execute("INSERT INTO x VALUES (1, '[1,2]')")
            first.execute("DROP TABLE x")
            first.close()
            self.assertTrue(os.path.isdir(path))
            self.assertEqual(second.execute("SELECT count(*) FROM x").fetchone()[0], 1)
            second.execute("DROP TABLE x")
            second.close()
            self.assertFalse(os.path.exists(path))


class TestTooLarge(TempDirTest):
    """A pool the filesystem cannot hold is refused before anything is
    allocated, naming the option that sized it, and leaves nothing."""

    def test_capacity_and_pool_size_beyond_the_filesystem(self):
        c = connect(self.db)
        for opt, name in (("capacity=1099511627776", "capacity"), ("pool_size='1024T'", "pool_size"),
                          ("capacity=1000, pool_size='1024T'", "pool_size")):
            with self.assertRaisesRegex(sqlite3.DatabaseError, "embkv table t: option %s: store .*(need a pool of "
                                        "\\d+ bytes|a pool of \\d+ bytes does not fit).* bytes free" % name):
                c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=64, %s)" % opt)
            self.assertEqual(glob.glob(self.db + "-*"), [])
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=64, capacity=1000)")
        c.close()


class TestRenameThenDrop(TempDirTest):
    def test_directory_goes_at_the_drop(self):
        c = connect(self.db, isolation_level="DEFERRED")  # Python's default: cached statements
        c.execute("CREATE VIRTUAL TABLE a USING embkv(dim=2)")
        c.execute("INSERT INTO a VALUES (1, '[1,2]')")
        c.commit()
        self.assertEqual(c.execute("SELECT count(*) FROM a").fetchone()[0], 1)
        (d,) = glob.glob(self.db + "-*.embkv")
        c.execute("ALTER TABLE a RENAME TO b")
        c.commit()
        self.assertEqual(c.execute("SELECT count(*) FROM b").fetchone()[0], 1)
        c.execute("DROP TABLE b")
        c.commit()
        self.assertFalse(os.path.exists(d))
        c.close()


if __name__ == "__main__":
    unittest.main()
