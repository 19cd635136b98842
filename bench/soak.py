"""Load soak: 8 threads (more than the cores) of mixed work on one table
for a fixed time, with the process's memory and the store's files sampled,
to show they stay bounded.

Each thread has its own connection to one database holding one table
(dim 64, adagrad, a DRAM cache, a pool smaller than the rows and an SSD
tier, background migration).  Threads, by number:
  0-3  trainers: pull a Zipf(0.99) batch of 256 ids, push gradients;
  4-5  SQL readers: point lookups, IN lists, count(*), a GROUP BY tier,
       embkv_heat's top rows;
  6    a checkpointer: embkv_checkpoint every 0.5 s;
  7    a writer: SQL transactions of INSERT OR REPLACE / DELETE of new ids,
       committed or rolled back.
Every SAMPLE seconds it prints: RSS (VmRSS of the process), the pool file,
the log's bytes on disk, the rows, and the operations done.  At the end it
compares the last third of the samples with the first third after warm-up
and says whether each stayed bounded (grew by less than 10%, or by less
than 64 MiB), and checks every row by a full scan.

The SSD tier gets 4 MiB per 1000 rows (about 7x the rows' bytes): the
readers' full-table queries hold snapshots, and while one is open the
cache writes through and replaced versions stay, so the log carries 4-6x
the live rows' bytes (3.1 GiB at most in 10 minutes of 1M rows).  With
less room, a log near ssd_size can refuse writes until the next sync
deletes what compaction emptied (docs/tiers.md: sizing the SSD tier).
Also per sample: the log's live MiB, rows demoted and segments compacted.

Usage: soak.py DIR [--seconds S] [--rows N] [--ssd-mb M] [--ext PATH]
DIR must be absent or empty; it is removed at the end.
"""
import argparse
import json
import os
import random
import shutil
import sys
import threading
import time

from bench_py import connect, default_extension

import numpy as np

DIM = 64


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def du_mb(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total / 1048576


def du_mb_file(path):
    try:
        return os.stat(path).st_blocks * 512 / 1048576
    except FileNotFoundError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--sample", type=float, default=10)
    ap.add_argument("--ssd-mb", type=int, default=0, help="ssd_size in MiB (default: 4 MiB per 1000 rows)")
    ap.add_argument("--ext", default=None,
                    help="the extension (default: the installed embkv package's, embkv.find_extension())")
    a = ap.parse_args()
    if a.ext is None:
        a.ext = default_extension(__file__)
    if os.path.exists(a.dir) and os.listdir(a.dir):
        sys.exit(f"{a.dir} must be absent or empty")
    os.makedirs(a.dir, exist_ok=True)
    db = os.path.join(a.dir, "soak.db")
    store = os.path.join(a.dir, "t.store")
    c = connect(db, a.ext)
    # The pool holds about as many records (adagrad: 32 + 512 bytes a row)
    # as there are rows, besides the index: the rows the writer adds, and
    # the versions replaced since the last checkpoint (kept until the next
    # one), push some rows out to the log.  (With much less, those versions
    # alone fill the pool between two checkpoints and pushes fail.)
    pool_mb = max(64, a.rows * 544 // 1048576 + a.rows * 64 // 1048576 + 64)
    c.execute(f"CREATE VIRTUAL TABLE t USING embkv(dim={DIM}, path='{store}', optimizer='adagrad', lr=0.05, "
              f"init='normal(0,0.01)', capacity={a.rows}, pool_size='{pool_mb}M', ssd_size='{a.ssd_mb or a.rows * 4 // 1000}M', "
              f"cache_size='16M', migrate='auto', migrate_rate=20000)")
    t0 = time.time()
    ids = np.arange(1, a.rows + 1, dtype=np.int64)
    for lo in range(0, a.rows, 50000):
        b = ids[lo:lo + 50000]
        c.execute("SELECT embkv_pull('t', ?)", (b.tobytes(),)).fetchone()
        c.execute("SELECT embkv_release('t', ?)", (b.tobytes(),)).fetchone()
    c.execute("SELECT embkv_checkpoint('t')").fetchone()
    print(f"soak: {a.rows} rows created in {time.time() - t0:.0f} s; pool {pool_mb} MiB; "
          f"{a.seconds:.0f} s of 8 threads on {os.cpu_count()} cores", flush=True)

    stop = threading.Event()
    counts = [0] * 8
    errors = []
    w = np.arange(1, a.rows + 1, dtype=np.float64) ** -0.99
    cdf = np.cumsum(w)
    cdf /= cdf[-1]

    def trainer(k):
        conn = connect(db, a.ext)
        rng = np.random.default_rng(k)
        g = (rng.standard_normal((256, DIM)) * 0.01).astype(np.float32).tobytes()
        while not stop.is_set():
            b = ids[np.minimum(np.searchsorted(cdf, rng.random(256)), a.rows - 1)].tobytes()
            conn.execute("SELECT embkv_pull('t', ?)", (b,)).fetchone()
            conn.execute("SELECT embkv_push('t', ?, ?)", (b, g)).fetchone()
            counts[k] += 1

    def reader(k):
        conn = connect(db, a.ext)
        rng = random.Random(k)
        while not stop.is_set():
            r = rng.random()
            if r < 0.5:
                conn.execute("SELECT vec, clock FROM t WHERE id = ?", (rng.randint(1, a.rows),)).fetchall()
            elif r < 0.8:
                q = ",".join(str(rng.randint(1, a.rows)) for _ in range(64))
                conn.execute(f"SELECT id, vec FROM t WHERE id IN ({q})").fetchall()
            elif r < 0.9:
                conn.execute("SELECT tier, count(*) FROM t GROUP BY tier").fetchall()
            elif r < 0.97:
                conn.execute("SELECT count(*) FROM t").fetchone()
            else:
                conn.execute("SELECT id, hits FROM embkv_heat('t') ORDER BY hits DESC LIMIT 10").fetchall()
            counts[k] += 1

    def checkpointer(k):
        conn = connect(db, a.ext)
        while not stop.wait(0.5):
            conn.execute("SELECT embkv_checkpoint('t')").fetchone()
            counts[k] += 1

    def writer(k):
        conn = connect(db, a.ext)
        rng = random.Random(k)
        while not stop.is_set():
            conn.execute("BEGIN")
            for _ in range(rng.randint(1, 20)):
                i = a.rows + rng.randint(1, 20000)
                if rng.random() < 0.7:
                    v = json.dumps([rng.random() for _ in range(DIM)])
                    conn.execute("INSERT OR REPLACE INTO t(id, vec) VALUES (?, ?)", (i, v))
                else:
                    conn.execute("DELETE FROM t WHERE id = ?", (i,))
            conn.execute("COMMIT" if rng.random() < 0.8 else "ROLLBACK")
            counts[k] += 1

    def guarded(fn, k):
        def run():
            try:
                fn(k)
            except Exception as e:  # noqa: BLE001  (reported below)
                errors.append(f"thread {k}: {e!r}")
                stop.set()
        return run

    roles = [trainer] * 4 + [reader] * 2 + [checkpointer, writer]
    threads = [threading.Thread(target=guarded(f, k)) for k, f in enumerate(roles)]
    for th in threads:
        th.start()
    samples = []
    start = time.time()
    print(f"{'s':>5} {'RSS MiB':>8} {'pool MiB':>9} {'log MiB':>8} {'rows':>9} {'steps':>8} {'reads':>8} "
          f"{'ckpts':>6} {'txns':>6} {'live MiB':>9} {'demoted':>8} {'compacted':>9}", flush=True)
    while not stop.is_set() and time.time() - start < a.seconds:
        stop.wait(a.sample)
        st = json.loads(c.execute("SELECT embkv_stats('t')").fetchone()[0])
        s = (time.time() - start, rss_mb(), du_mb_file(os.path.join(store, "store.pool")),
             du_mb(os.path.join(store, "log")), st["rows"],
             sum(counts[0:4]), sum(counts[4:6]), counts[6], counts[7])
        samples.append(s)
        ssd = st.get("tiers", {}).get("ssd", {})
        print(f"{s[0]:5.0f} {s[1]:8.0f} {s[2]:9.0f} {s[3]:8.0f} {s[4]:9d} {s[5]:8d} {s[6]:8d} {s[7]:6d} {s[8]:6d} "
              f"{ssd.get('bytes', 0) / 2**20:9.0f} {int(ssd.get('demotions', 0)):8d} {int(ssd.get('compactions', 0)):9d}",
              flush=True)
    stop.set()
    for th in threads:
        th.join()
    status = 0
    if errors:
        print("soak: FAILED:", *errors, sep="\n  ")
        status = 1
    n = len(samples)
    if n >= 6:
        early = samples[n // 6: n // 6 + n // 3]
        late = samples[-(n // 3):]
        for idx, name in ((1, "RSS"), (2, "pool file"), (3, "log")):
            e = max(x[idx] for x in early)
            l = max(x[idx] for x in late)
            bounded = l <= e * 1.10 or l - e < 64
            print(f"soak: {name}: {e:.0f} MiB early, {l:.0f} MiB late -> {'bounded' if bounded else 'GROWING'}")
            status |= 0 if bounded else 1
    rows = c.execute("SELECT count(*), count(vec) FROM t").fetchone()
    print(f"soak: {rows[0]} rows at the end, every vector read ({rows[1]})", flush=True)
    c.close()
    shutil.rmtree(a.dir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
