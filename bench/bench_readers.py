"""Reader processes beside a trainer: what reading from another process
costs, and what readers cost the trainer.

A table of ROWS rows of dim 64 (sgd).  A trainer process owns the store:
it pulls and pushes batches of 512 random ids and checkpoints every 0.5 s.
Readers read batches of 512 random ids (`SELECT id, vec FROM t WHERE id IN
(SELECT value FROM json_each(?))`) in a loop.  Phases of SECONDS each,
one run, on the same store:

  alone        the trainer alone: its steps/s (the baseline)
  in-process   the trainer and one reader thread in its own process (a
               read-only connection sharing the trainer's store): rows/s
  1 process    the trainer and one reader process (mode=ro): rows/s
  3 processes  the trainer and three reader processes: their rows/s, and
               the trainer's steps/s against the baseline

Reported as ratios within the run.  Statements told to run again (the
trainer revoked them, readers.c: R2) are counted.

Usage: bench_readers.py DIR [--seconds S] [--rows N] [--ext PATH]
DIR must be absent or empty; it is removed at the end.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

from bench_py import connect, default_extension

TRAINER = r"""
import json, os, sqlite3, sys, threading, time
import numpy as np
sys.path.insert(0, %(bench)r)
from bench_py import connect
db, ext, seconds, threads, go = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
c = connect(db, ext)
n = c.execute("SELECT count(*) FROM t").fetchone()[0]
out = {"steps": 0, "rows": 0, "again": 0}
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.01)
stop = time.time() + seconds
def reader():
    # a read-only connection of this process: it shares the trainer's store
    rc = sqlite3.connect("file:%%s?mode=ro" %% db, uri=True, isolation_level=None, check_same_thread=False)
    rc.enable_load_extension(True); rc.load_extension(ext)
    rng = np.random.default_rng(7)
    while time.time() < stop:
        ids = json.dumps(rng.integers(0, n, 512).tolist())
        out["rows"] += len(rc.execute("SELECT id, vec FROM t WHERE id IN (SELECT value FROM json_each(?))", (ids,)).fetchall())
ts = [threading.Thread(target=reader) for _ in range(threads)]
for t in ts: t.start()
rng = np.random.default_rng(1)
g = np.full((512, 64), 0.01, np.float32).tobytes()
last = time.time()
while time.time() < stop:
    ids = rng.integers(0, n, 512).astype(np.int64).tobytes()
    c.execute("SELECT length(embkv_pull('t', ?))", (ids,)).fetchone()
    c.execute("SELECT embkv_push('t', ?, ?)", (ids, g)).fetchone()
    out["steps"] += 1
    if time.time() - last > 0.5:
        c.execute("SELECT embkv_checkpoint('t')").fetchone()
        last = time.time()
for t in ts: t.join()
print(json.dumps(out), flush=True)
"""

READER = r"""
import json, sqlite3, sys, time
import numpy as np
db, ext, seconds, go, seed = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
c = sqlite3.connect("file:%s?mode=ro" % db, uri=True, isolation_level=None)
c.enable_load_extension(True); c.load_extension(ext)
n = int(sys.argv[6])
c.execute("SELECT count(*) FROM t WHERE id = 0").fetchone()  # (the table opens now, not in the timing)
out = {"rows": 0, "again": 0}
print("ready", flush=True)
import os
while not os.path.exists(go):
    time.sleep(0.01)
rng = np.random.default_rng(seed)
stop = time.time() + seconds
while time.time() < stop:
    ids = json.dumps(rng.integers(0, n, 512).tolist())
    try:
        out["rows"] += len(c.execute("SELECT id, vec FROM t WHERE id IN (SELECT value FROM json_each(?))", (ids,)).fetchall())
    except sqlite3.OperationalError as e:
        if "run the statement again" not in str(e): raise
        out["again"] += 1
print(json.dumps(out), flush=True)
"""


def run_phase(db, ext, seconds, threads, procs, rows, tag):
    go = db + ".go." + tag
    here = os.path.dirname(os.path.abspath(__file__))
    tr = subprocess.Popen([sys.executable, "-c", TRAINER % {"bench": here}, db, ext, str(seconds), str(threads), go],
                          stdout=subprocess.PIPE, text=True)
    assert tr.stdout.readline().startswith("ready")
    rd = [subprocess.Popen([sys.executable, "-c", READER, db, ext, str(seconds), go, str(10 + i), str(rows)],
                           stdout=subprocess.PIPE, text=True) for i in range(procs)]
    for r in rd:
        assert r.stdout.readline().startswith("ready")
    open(go, "w").close()
    t = json.loads(tr.communicate()[0].strip().splitlines()[-1])
    rs = [json.loads(r.communicate()[0].strip().splitlines()[-1]) for r in rd]
    os.remove(go)
    for p in [tr] + rd:
        if p.returncode:
            sys.exit("bench_readers: a process of phase %s failed" % tag)
    return t, rs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--ext")
    a = ap.parse_args()
    ext = a.ext or default_extension(__file__)
    if os.path.exists(a.dir) and os.listdir(a.dir):
        sys.exit("bench_readers: %s is not empty" % a.dir)
    os.makedirs(a.dir, exist_ok=True)
    try:
        db = os.path.join(a.dir, "b.db")
        c = connect(db, ext)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=64, optimizer='sgd', lr=0.01, capacity=%d)" % a.rows)
        v = np.random.default_rng(0).standard_normal((a.rows, 64)).astype(np.float32)
        for s in range(0, a.rows, 50000):
            c.execute("BEGIN")
            c.executemany("INSERT INTO t(id, vec) VALUES (?, ?)", ((i, v[i].tobytes()) for i in range(s, min(a.rows, s + 50000))))
            c.execute("COMMIT")
        c.execute("SELECT embkv_checkpoint('t')").fetchone()
        c.close()
        S = a.seconds
        alone, _ = run_phase(db, ext, S, 0, 0, a.rows, "alone")
        inproc, _ = run_phase(db, ext, S, 1, 0, a.rows, "inproc")
        one, r1 = run_phase(db, ext, S, 0, 1, a.rows, "one")
        three, r3 = run_phase(db, ext, S, 0, 3, a.rows, "three")
        base = alone["steps"] / S
        print("bench_readers: %d rows of dim 64, %.0f s a phase, batches of 512 ids" % (a.rows, S))
        print("%-34s %12s %14s %10s" % ("phase", "trainer st/s", "reader rows/s", "run again"))
        print("%-34s %12.0f %14s %10s" % ("trainer alone", base, "-", "-"))
        print("%-34s %12.0f %14.0f %10d" % ("+ 1 reader thread in its process", inproc["steps"] / S, inproc["rows"] / S, 0))
        print("%-34s %12.0f %14.0f %10d" % ("+ 1 reader process", one["steps"] / S, r1[0]["rows"] / S, r1[0]["again"]))
        print("%-34s %12.0f %14.0f %10d" % ("+ 3 reader processes (sum)", three["steps"] / S,
                                          sum(r["rows"] for r in r3) / S, sum(r["again"] for r in r3)))
        print("reader process vs thread in the trainer's process: %.2fx rows/s" % (r1[0]["rows"] / max(1, inproc["rows"])))
        print("trainer with 3 reader processes vs alone: %.2fx steps/s (with 1: %.2fx)" %
              (three["steps"] / max(1, alone["steps"]), one["steps"] / max(1, alone["steps"])))
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
