"""Short statements beside training must not empty the pool.

A table of ROWS rows of dim 64 (adagrad) with a pool that holds about an
eighth of them, an SSD tier and a DRAM cache; 120k rows (ids 2000-121999)
moved into the pool with embkv_hotset.  Two threads train on ids 0-1999
(pull and push a batch of 512), one checkpoints every 0.3 s, and, in the
second phase, one more runs `SELECT count(*)` every 50 ms.  Each phase
reports the rows the tier thread demoted after a warm-up of 5 s, per minute
and as a share of the pool's rows after the hot set moved in, and then the time to pull ids
2000-101999 (rows still in the pool are fast; demoted ones come back from
the SSD).  The goal: with the reader, demotions under 1% of the pool's rows
a minute, as without it.

Usage: bench_pins.py DIR [--seconds S] [--rows N] [--ext PATH]
DIR must be absent or empty; it is removed at the end.
"""
import argparse
import json
import os
import shutil
import sqlite3
import sys
import threading
import time

import numpy as np

from bench_py import connect, default_extension

WARM = 5.0


def stats(c):
    s = json.loads(c.execute("SELECT embkv_stats('t')").fetchone()[0])
    return s["tiers"]["pm"]["rows"], s["tiers"]["ssd"]["demotions"]


def phase(db, ext, seconds, reader):
    c = connect(db, ext)
    c.execute("SELECT embkv_hotset('t', ?)", (json.dumps(list(range(2000, 122000))),)).fetchone()
    rows_start = stats(c)[0]
    stop = time.time() + WARM + seconds
    errors = []

    def guard(fn):
        def run():
            try:
                fn()
            except sqlite3.Error as e:
                errors.append(str(e))
        return run

    def trainer(seed):
        cc = connect(db, ext)
        rng = np.random.default_rng(seed)
        g = np.full((512, 64), 0.01, np.float32).tobytes()
        while time.time() < stop:
            ids = rng.integers(0, 2000, 512).astype(np.int64).tobytes()
            cc.execute("SELECT length(embkv_pull('t', ?))", (ids,)).fetchone()
            cc.execute("SELECT embkv_push('t', ?, ?)", (ids, g)).fetchone()
        cc.close()

    def checkpointer():
        cc = connect(db, ext)
        while time.time() < stop:
            cc.execute("SELECT embkv_checkpoint('t')").fetchone()
            time.sleep(0.3)
        cc.close()

    reads = [0]

    def counter():
        cc = connect(db, ext)
        while time.time() < stop:
            cc.execute("SELECT count(*) FROM t").fetchone()
            reads[0] += 1
            time.sleep(0.05)
        cc.close()

    ths = [threading.Thread(target=guard(lambda i=i: trainer(i))) for i in range(2)]
    ths.append(threading.Thread(target=guard(checkpointer)))
    if reader:
        ths.append(threading.Thread(target=guard(counter)))
    for t in ths:
        t.start()
    time.sleep(WARM)
    rows0, dem0 = stats(c)
    for t in ths:
        t.join()
    rows1, dem1 = stats(c)
    t0 = time.time()
    for lo in range(2000, 102000, 10000):
        c.execute("SELECT length(embkv_pull('t', ?))", (np.arange(lo, lo + 10000, dtype=np.int64).tobytes(),)).fetchone()
    pull_s = time.time() - t0
    c.close()
    per_min = (dem1 - dem0) * 60.0 / seconds
    return {"reader": reader, "statements": reads[0], "pool_rows_start": rows_start, "pool_rows_before": rows0,
            "pool_rows_after": rows1, "demotions_per_min": per_min, "share_per_min": per_min / max(rows_start, 1),
            "pull_s": pull_s,
            "errors": errors}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rows", type=int, default=1000000)
    ap.add_argument("--ext")
    a = ap.parse_args()
    ext = a.ext or default_extension(__file__)
    if os.path.exists(a.dir) and os.listdir(a.dir):
        sys.exit("bench_pins: %s is not empty" % a.dir)
    os.makedirs(a.dir, exist_ok=True)
    db = os.path.join(a.dir, "m.db")
    try:
        c = connect(db, ext)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=64, optimizer='adagrad', lr=0.01, init='normal(0,0.01)', "
                  "pool_size='160M', ssd_size='2G', cache_size='32M', capacity=%d)" % a.rows)
        for lo in range(0, a.rows, 50000):
            ids = np.arange(lo, min(lo + 50000, a.rows), dtype=np.int64).tobytes()
            c.execute("SELECT length(embkv_pull('t', ?))", (ids,)).fetchone()
        c.execute("SELECT embkv_checkpoint('t')").fetchone()
        c.close()
        print("== bench_pins: %d rows of dim 64, adagrad, pool 160M, cache 32M, %g s a phase after %g s of warm-up"
              % (a.rows, a.seconds, WARM))
        for reader in (False, True):
            r = phase(db, ext, a.seconds, reader)
            print("  %-34s pool rows %6d, after warm-up %6d -> %6d, demotions %8.0f a minute (%.2f%% of the pool's rows), "
                  "pull of ids 2000-101999 %.2f s, errors %d%s"
                  % ("with SELECT count(*) every 50 ms:" if reader else "training and checkpoints only:",
                     r["pool_rows_start"], r["pool_rows_before"], r["pool_rows_after"], r["demotions_per_min"],
                     100 * r["share_per_min"], r["pull_s"], len(r["errors"]),
                     " (%d statements)" % r["statements"] if reader else ""))
            for e in r["errors"][:3]:
                print("    error: %s" % e)
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
