"""What a COMMIT costs: transactions of 1, 100 and 10,000 rows (dim 64,
256-byte vectors) updating an embkv table, against the same transactions on
an ordinary SQLite table p(id INTEGER PRIMARY KEY, vec BLOB) in the same
database, both in rollback-journal mode with synchronous=FULL (SQLite's
default) and in WAL mode with synchronous=NORMAL.  An embkv COMMIT syncs the
store, SQLite's file (its commit record, ext/sqlite/journal.c) and the
commit journal.

    bench_commit.py DIR [--ext PATH] [--rows N] [--seconds S]

DIR (made, removed at the end) holds the database; give one on the medium to
measure (/dev/shm, an ext4 directory).  Prints commits/s and rows/s per
case, and embkv's rate over the ordinary table's."""
import argparse
import itertools
import os
import random
import shutil
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_py import connect, default_extension  # noqa: E402

DIM = 64
VALUES = itertools.count(1)


def vec(x):
    return struct.pack("%df" % DIM, *([x] * DIM))


def run(conn, table, size, rows, seconds):
    """Commits of `size` rows (random ids of 0..rows-1) for `seconds`.
    Each commit writes a value of its own: SQLite skips a cell rewritten
    with the bytes it holds (no page changes, no sync), which a constant
    value would soon make of every ordinary-table update (and the cases
    repeat their ids: the values count on across them)."""
    rnd = random.Random(1)
    n = 0
    t0 = time.perf_counter()
    while True:
        blob = vec(next(VALUES) + 0.5)
        ids = [(blob, rnd.randrange(rows)) for _ in range(size)]
        conn.execute("BEGIN")
        conn.executemany(f"UPDATE {table} SET vec = ? WHERE id = ?", ids)
        conn.execute("COMMIT")
        n += 1
        dt = time.perf_counter() - t0
        if dt >= seconds and n >= 3:
            return n / dt, n * size / dt


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--ext")
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--seconds", type=float, default=2.0)
    a = ap.parse_args()
    ext = a.ext or default_extension(__file__)
    if os.path.exists(a.dir):
        sys.exit("bench_commit: %s exists: give a directory to make (it is removed at the end)" % a.dir)
    os.makedirs(a.dir)
    try:
        db = os.path.join(a.dir, "commit.db")
        c = connect(db, ext)
        c.execute(f"CREATE VIRTUAL TABLE t USING embkv(dim={DIM}, path='vt', pool_size='256M', capacity={a.rows})")
        c.execute("CREATE TABLE p(id INTEGER PRIMARY KEY, vec BLOB)")
        blob = vec(0.5)
        for table in ("t", "p"):
            c.execute("BEGIN")
            c.executemany(f"INSERT INTO {table}(id, vec) VALUES (?, ?)", ((i, blob) for i in range(a.rows)))
            c.execute("COMMIT")
        print(f"bench_commit: {a.rows} rows of dim {DIM} in {a.dir}; {a.seconds} s per case")
        print(f"{'mode':<14} {'rows/commit':>11} {'sqlite commits/s':>17} {'embkv commits/s':>16} {'embkv/sqlite':>13}")
        for mode, pragmas in (("delete,full", ("journal_mode=DELETE", "synchronous=FULL")),
                              ("wal,normal", ("journal_mode=WAL", "synchronous=NORMAL"))):
            for p in pragmas:
                c.execute("PRAGMA " + p).fetchall()
            for size in (1, 100, 10_000):
                sq, _ = run(c, "p", size, a.rows, a.seconds)
                ek, _ = run(c, "t", size, a.rows, a.seconds)
                print(f"{mode:<14} {size:>11} {sq:>17.1f} {ek:>16.1f} {ek / sq:>12.2f}x", flush=True)
        c.close()
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
