"""Reader processes beside a writer, from SQL.

A trainer process pushes a gradient to every row of a table in each step
(one push: one write group), so that after step k every row has clock k
and vec[0] == k, and checkpoints every third step, noting the step in a
file.  Reader processes open the database read-only (a mode=ro URI, and
PRAGMA query_only) and run every plan in a loop: full scans, count(*),
IN lists, point lookups, embkv_pull, embkv_knn, embkv_stats, embkv_export,
embkv_backup (the copy opened as a table).
Each statement must see one checkpoint: every row at one step, a step the
trainer checkpointed, not older than the checkpoint noted before the
statement began.  Readers and the trainer are killed (SIGKILL) meanwhile:
the survivors go on, and a trainer started again resumes from the last
checkpoint while the readers read.  A second process that asks to write is
refused after its busy timeout, told how to read instead.
"""
import json
import os
import signal
import subprocess
import sys
import sqlite3
import time
import unittest

from embkv_test import EXT, TempDirTest as Base, connect

DIM = 16
ROWS = 20000

TRAINER = r"""
import os, sqlite3, sys, time
import numpy as np
db, ext, ck = sys.argv[1], sys.argv[2], sys.argv[3]
c = sqlite3.connect(db, isolation_level=None, timeout=30)
c.enable_load_extension(True); c.load_extension(ext)
n, dim = %(rows)d, %(dim)d
if not c.execute("SELECT count(*) FROM sqlite_master WHERE name='item'").fetchone()[0]:
    c.execute("CREATE VIRTUAL TABLE item USING embkv(dim=%%d, path='item.embkv', optimizer='sgd', lr=1, "
              "pool_size='16M', ssd_size='256M')" %% dim)
    v = np.zeros((n, dim), np.float32); v[:, 1] = np.arange(n)
    for a in range(0, n, 5000):
        c.execute("BEGIN")
        c.executemany("INSERT INTO item(id, vec) VALUES (?, ?)", ((i, v[i].tobytes()) for i in range(a, min(n, a + 5000))))
        c.execute("COMMIT")
        c.execute("SELECT embkv_checkpoint('item')")
step = c.execute("SELECT clock FROM item WHERE id = 0").fetchone()[0]
ids = np.arange(n, dtype=np.int64).tobytes()
g = np.zeros((n, dim), np.float32); g[:, 0] = -1
g = g.tobytes()
def note(k):
    with open(ck + ".tmp", "w") as f: f.write(str(k))
    os.replace(ck + ".tmp", ck)
note(step)
print("ready", step, flush=True)
while True:
    c.execute("SELECT embkv_push('item', ?, ?)", (ids, g))
    step += 1
    if step %% 3 == 0:
        c.execute("SELECT embkv_checkpoint('item')")
        note(step)
    if os.path.exists(ck + ".stop"):
        break
""".replace("%(rows)d", str(ROWS)).replace("%(dim)d", str(DIM)).replace("%%", "%")

READER = r"""
import json, os, random, sqlite3, sys, time
import numpy as np
db, ext, ck, seconds, how = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
if how == "uri":
    c = sqlite3.connect("file:%s?mode=ro" % db, uri=True, isolation_level=None, timeout=30)
else:
    c = sqlite3.connect(db, isolation_level=None, timeout=30)
    c.execute("PRAGMA query_only=1")
c.enable_load_extension(True); c.load_extension(ext)
n, dim = %(rows)d, %(dim)d
rnd = random.Random(os.getpid())
stats = {"statements": 0, "again": 0, "bad": [], "plans": {}}
def ck_now():
    with open(ck) as f: return int(f.read())
def bad(what):
    if len(stats["bad"]) < 5: stats["bad"].append(what)
def judge(plan, rows, before, want=None):
    steps = {r[1] for r in rows}
    if len(steps) != 1: return bad("%%s: %%d checkpoints in one statement: %%s" %% (plan, len(steps), sorted(steps)[:5]))
    s = steps.pop()
    if s %% 3 or s < before: return bad("%%s: step %%d (checkpoint %%d before it)" %% (plan, s, before))
    for r in rows:
        v = np.frombuffer(r[2], np.float32)
        if v[0] != r[1] or v[1] != r[0]: return bad("%%s: row %%d holds %%s at clock %%d" %% (plan, r[0], v[:2], r[1]))
    if want is not None and len(rows) != want: bad("%%s: %%d rows, want %%d" %% (plan, len(rows), want))
    stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
tried = dict.fromkeys(["scan", "count", "in", "point", "pull", "knn", "stats", "export", "backup", "heat"], 0)
end = time.time() + seconds
# (told to stop, it still reads until it has made MIN_STATEMENTS statements
# and each plan has worked once: a slow machine's readers, often told to
# run a statement again, must still show every plan working)
MIN_STATEMENTS = 45
def enough():
    return stats["statements"] >= MIN_STATEMENTS and all(stats["plans"].get(p, 0) for p in tried)
# (past its time, while a plan has not worked yet: a sanitized build on a
# loaded machine, whose long statements a trainer short of pool room keeps
# telling to run again, as operations.md says it may; the test stops the
# trainer if that lasts, and "quiet" names the plans that first worked then)
stats["quiet"] = []
while ((time.time() < end or (not enough() and time.time() < end + 240))
       and not (os.path.exists(ck + ".readers-stop") and enough())):
    # (each turn a plan least tried so far: every plan gets its turns however
    # few statements a loaded machine allows; once MIN_STATEMENTS have
    # worked, the plans that have not yet, so that a long one a loaded
    # machine keeps telling to run again, a backup beside a trainer that
    # must reuse records, gets the rest of the time)
    missing = [p for p in sorted(tried) if not stats["plans"].get(p)]
    if stats["statements"] >= MIN_STATEMENTS and missing:
        plan = rnd.choice(missing)
    else:
        least = min(tried.values())
        plan = rnd.choice([p for p in sorted(tried) if tried[p] == least])
    tried[plan] += 1
    before = ck_now()
    quiet = os.path.exists(ck + ".stop") and not stats["plans"].get(plan)
    try:
        if plan == "scan":
            judge(plan, c.execute("SELECT id, clock, vec FROM item").fetchall(), before, n)
        elif plan == "count":
            got = c.execute("SELECT count(*) FROM item").fetchone()[0]
            if got != n: bad("count: %%d" %% got)
            stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
        elif plan == "in":
            ids = rnd.sample(range(n), 50)
            judge(plan, c.execute("SELECT id, clock, vec FROM item WHERE id IN (%%s)" %% ",".join(map(str, ids))).fetchall(), before, 50)
        elif plan == "point":
            i = rnd.randrange(n)
            judge(plan, c.execute("SELECT id, clock, vec FROM item WHERE id = ?", (i,)).fetchall(), before, 1)
        elif plan == "pull":
            ids = np.array(rnd.sample(range(n), 20), np.int64)
            v = np.frombuffer(c.execute("SELECT embkv_pull('item', ?)", (ids.tobytes(),)).fetchone()[0], np.float32).reshape(-1, dim)
            if len(set(v[:, 0].tolist())) != 1 or v[0, 0] < before or int(v[0, 0]) %% 3 or (v[:, 1] != ids).any():
                bad("pull: steps %%s ids %%s (checkpoint %%d before)" %% (sorted(set(v[:, 0].tolist()))[:4], v[:3, 1], before))
            stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
        elif plan == "knn":
            q = np.zeros(dim, np.float32); q[0] = before; q[1] = 77
            got = c.execute("SELECT id FROM embkv_knn('item', ?, 3)", (q.tobytes(),)).fetchall()
            if len(got) != 3: bad("knn: %%s" %% got)
            stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
        elif plan == "stats":
            st = json.loads(c.execute("SELECT embkv_stats('item')").fetchone()[0])
            if st["dim"] != dim or st["rows"] != n: bad("stats: %%s" %% st)
            stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
        elif plan == "heat":
            # every row with its tier; no access counts in a reader process
            got = c.execute("SELECT count(*), sum(hits), count(DISTINCT tier IN ('pm', 'ssd')) FROM embkv_heat('item')").fetchone()
            if got != (n, 0, 1): bad("heat: %%s" %% (got,))
            stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
        elif plan == "backup":
            # a copy of the last checkpoint, taken here, opens as a table
            d = os.path.join(os.path.dirname(db), "bk-%%d-%%d" %% (os.getpid(), stats["statements"]))
            info = json.loads(c.execute("SELECT embkv_backup('item', ?)", (d,)).fetchone()[0])
            b = sqlite3.connect(d + ".db", isolation_level=None)
            b.enable_load_extension(True); b.load_extension(ext)
            b.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%%d, path='%%s')" %% (dim, d))
            rows = b.execute("SELECT count(*), min(clock), max(clock) FROM t").fetchone()
            b.execute("DROP TABLE t"); b.close(); os.remove(d + ".db")
            if info["rows"] != n or rows[0] != n or rows[1] != rows[2] or rows[1] < before or rows[1] %% 3:
                bad("backup: %%s, rows %%s (checkpoint %%d before)" %% (info, rows, before))
            stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
        else:
            out = "%%s.export.%%d" %% (db, os.getpid())
            got = c.execute("SELECT embkv_export('item', ?)", (out,)).fetchone()[0]
            e = sqlite3.connect(out)
            rows = e.execute("SELECT count(*), min(clock), max(clock) FROM embkv_rows").fetchone()
            e.close(); os.remove(out)
            if got != n or rows[0] != n or rows[1] != rows[2] or rows[1] < before or rows[1] %% 3:
                bad("export: %%s rows, clocks %%s (checkpoint %%d before)" %% (got, rows, before))
            stats["plans"][plan] = stats["plans"].get(plan, 0) + 1
        stats["statements"] += 1
        if quiet and stats["plans"].get(plan): stats["quiet"].append(plan)
    except sqlite3.OperationalError as e:
        if "run the statement again" in str(e) or "is opening it" in str(e): stats["again"] += 1
        else: bad("%%s: %%s" %% (plan, e))
print(json.dumps(stats), flush=True)
""".replace("%(rows)d", str(ROWS)).replace("%(dim)d", str(DIM)).replace("%%", "%")


class TestReaderProcesses(Base):
    def trainer(self):
        p = subprocess.Popen([sys.executable, "-c", TRAINER, self.db, EXT, self.ck], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=self.dir)
        line = p.stdout.readline()
        self.assertTrue(line.startswith("ready"), (line, p.stderr.read() if p.poll() is not None else ""))
        return p

    def reader(self, seconds, how):
        return subprocess.Popen([sys.executable, "-c", READER, self.db, EXT, self.ck, str(seconds), how],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.dir)

    def step(self):
        with open(self.ck) as f:
            return int(f.read())

    def advances(self, seconds=20):
        # (a trainer beside three busy readers on two cores is slow: wait
        # for its next checkpoint, up to a bound)
        before = self.step()
        end = time.time() + seconds
        while time.time() < end and self.step() <= before:
            time.sleep(0.05)
        return self.step() > before

    def finish(self, p):
        out, err = p.communicate(timeout=120)
        self.assertEqual(p.returncode, 0, err)
        return json.loads(out)

    def test_readers_beside_a_trainer_with_kills(self):
        self.ck = os.path.join(self.dir, "ckpt")
        w = self.trainer()
        try:
            # (they read until told to stop: across the trainer's kill and restart)
            readers = [self.reader(90, "uri"), self.reader(90, "query_only"), self.reader(90, "uri")]
            time.sleep(2)
            # a second writer: refused after its busy timeout, told how to read
            c = connect(self.db, timeout=0.2)
            with self.assertRaises(Exception) as e:
                c.execute("SELECT count(*) FROM item").fetchall()
            self.assertIn("one process at a time may write a store (waited 200 ms", str(e.exception))
            self.assertIn("open this database read-only", str(e.exception))
            c.close()
            # a reader killed mid-work: the trainer goes on
            readers[2].kill()
            readers[2].communicate()
            self.assertTrue(self.advances())
            # the trainer killed: readers go on; a new one resumes from the checkpoint
            w.send_signal(signal.SIGKILL)
            w.communicate()
            time.sleep(1)
            w = self.trainer()
            self.assertTrue(self.advances())
            self.assertTrue(self.advances())
            open(self.ck + ".readers-stop", "w").close()
            # (a plan the trainer keeps telling to run again, past a minute:
            # the trainer stops, and the plan must then work)
            end = time.time() + 60
            while time.time() < end and any(r.poll() is None for r in readers[:2]):
                time.sleep(0.2)
            open(self.ck + ".stop", "w").close()
            results = [self.finish(r) for r in readers[:2]]
        finally:
            open(self.ck + ".stop", "w").close()
            w.communicate(timeout=60)
        for r in results:
            print("reader: %d statements, %d told to run again, plans %s, first working once the trainer stopped %s"
                  % (r["statements"], r["again"], r["plans"], r["quiet"]), file=sys.stderr)
            self.assertEqual(r["bad"], [], r)
            self.assertGreater(r["statements"], 40, r)
            self.assertEqual(set(r["plans"]), {"scan", "count", "in", "point", "pull", "knn", "stats", "export",
                                               "backup", "heat"}, r)
        # after the kill, the store reopened at a checkpoint: every row at one step
        c = connect(self.db)
        self.assertEqual(c.execute("SELECT count(DISTINCT clock), count(*) FROM item").fetchone(), (1, ROWS))
        c.close()


HOLDER = r"""
import os, sqlite3, sys, time
db, ext, go = sys.argv[1], sys.argv[2], sys.argv[3]
c = sqlite3.connect("file:%s?mode=ro" % db, uri=True, isolation_level=None)
c.enable_load_extension(True); c.load_extension(ext)
print(c.execute("SELECT count(*) FROM item").fetchone()[0], flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
"""


class TestDropBesideAReader(Base):
    def test_drop_is_refused_while_another_process_reads(self):
        """A DROP that would remove the store another process reads is
        refused (it would leave the directory, and a later CREATE naming it
        would find the old rows); once the reader is gone it removes it."""
        w = connect(self.db)
        w.execute("CREATE VIRTUAL TABLE item USING embkv(dim=4, path='item.embkv')")
        w.execute("INSERT INTO item(id, vec) VALUES (1, '[1,1,1,1]'), (2, '[2,2,2,2]')")
        w.execute("SELECT embkv_checkpoint('item')").fetchone()
        go = os.path.join(self.dir, "go")
        r = subprocess.Popen([sys.executable, "-c", HOLDER, self.db, EXT, go], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.stdout.readline().strip(), "2")
        store = os.path.realpath(os.path.join(self.dir, "item.embkv"))
        with self.assertRaises(sqlite3.OperationalError) as cm:
            w.execute("DROP TABLE item")
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_BUSY)
        self.assertEqual(str(cm.exception),
                         f"store {store} is open for reading in another process (pid {r.pid}), and this COMMIT "
                         "removes it (DROP TABLE of its last table): close the table there (or end that process), "
                         "then DROP again (a COMMIT refused so keeps its transaction open: COMMIT again, or "
                         "ROLLBACK)")
        self.assertFalse(w.in_transaction)
        self.assertEqual(w.execute("SELECT count(*) FROM item").fetchone()[0], 2)
        open(go, "w").close()
        out, err = r.communicate(timeout=60)
        self.assertEqual(r.returncode, 0, err)
        w.execute("DROP TABLE item")
        self.assertFalse(os.path.exists(store))
        w.close()

    def test_drop_decides_as_the_removal_does(self):
        """Refused only when the COMMIT removes the store: not for the
        table that made it while another table still uses it, but for
        the last table using it, whichever made it."""
        w = connect(self.db)
        w.execute("CREATE VIRTUAL TABLE item USING embkv(dim=4, path='item.embkv')")
        w.execute("CREATE VIRTUAL TABLE item2 USING embkv(dim=4, path='item.embkv')")
        w.execute("INSERT INTO item2(id, vec) VALUES (1, '[1,1,1,1]')")
        w.execute("SELECT embkv_checkpoint('item2')").fetchone()
        go = os.path.join(self.dir, "go")
        r = subprocess.Popen([sys.executable, "-c", HOLDER.replace("FROM item", "FROM item2"), self.db, EXT, go],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertEqual(r.stdout.readline().strip(), "1")
        w.execute("DROP TABLE item")  # item2 keeps the store
        store = os.path.realpath(os.path.join(self.dir, "item.embkv"))
        w.execute("BEGIN")
        w.execute("DROP TABLE item2")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            w.execute("COMMIT")
        self.assertIn(f"store {store} is open for reading in another process (pid {r.pid})", str(cm.exception))
        self.assertTrue(w.in_transaction)
        w.execute("ROLLBACK")
        open(go, "w").close()
        out, err = r.communicate(timeout=60)
        self.assertEqual(r.returncode, 0, err)
        w.execute("DROP TABLE item2")
        self.assertFalse(os.path.exists(store))
        w.close()


if __name__ == "__main__":
    unittest.main()
