"""The crash harness: SIGKILL at random moments of random SQL work, then
every row checked against what the last completed durability point left.

A driver process (this file with --child) works on three tables of one
database, each on its own store:
  a  dim 4, sgd lr 1, init zeros, a DRAM cache and an SSD tier: SQL
     writes, pulls and pushes (integer gradients: the arithmetic is exact
     in float32), checkpoints, hot-set moves, migration in the background;
  b  dim 8, adagrad: SQL transactions with savepoints (INSERT, INSERT OR
     REPLACE, UPDATE, DELETE, ROLLBACK TO, RELEASE, COMMIT or ROLLBACK);
  c  dim 2: dropped and created again now and then (DDL), rows inserted.
It keeps a model of each table.  A store's durability points are its
COMMITs (explicit or autocommit), embkv_checkpoint and, for c, its CREATE
and DROP.  Before each, the driver writes the model as the point will
leave it ("pending"), and after it, the same file as "committed" (each
written aside and renamed).  The parent kills the driver with SIGKILL at
a random moment, reopens the database and requires every table to equal,
row for row (vector bits and clock), the committed model, the pending
one (the kill came after the point and before its mark) or, for a COMMIT,
the pending one without the COMMIT's own rows (the kill came after the
COMMIT's store checkpoint, which made the training writes before it
durable, and before SQLite committed: ext/sqlite/journal.c puts those rows
back); the rows by tier
must add up to the table's count.  The state it found becomes the next
driver's starting model, so damage, if any, carries into later rounds.

Every round prints its seed; a failure prints the differences and the
seed to run again (--rounds 1 --seed S on a copy of the directory).

Usage: crash_sql.py [--rounds N] [--seed S] [--dir DIR] [--keep]
Run it with tests/python_run.sh (the installed package's extension, or
$EMBKV_EXT: another build, path with or without .so).
"""
import argparse
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
import time

import embkv

EXT = embkv.find_extension()

TABLES = {
    "a": ("dim=4, optimizer='sgd', lr=1, init='zeros', cache_size='64K', pool_size='16M', "
          "ssd_size='64M', migrate='auto', migrate_rate=5000", 4),
    "b": ("dim=8, optimizer='adagrad', pool_size='16M'", 8),
    "c": ("dim=2, pool_size='16M'", 2),
}
IDS = {"a": 400, "b": 300, "c": 100}   # id space per table


def connect(db):
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    conn.enable_load_extension(True)
    conn.load_extension(EXT)
    conn.enable_load_extension(False)
    return conn


def create(conn, t):
    conn.execute(f"CREATE VIRTUAL TABLE {t} USING embkv({TABLES[t][0]})")


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def vec_json(v):
    return "[" + ",".join(str(int(x)) for x in v) + "]"


# A model: {table: {str(id): [vector as ints, clock]}}, or None for a table
# that does not exist.


def child(d, seed):
    """The driver: random work until killed."""
    rng = random.Random(seed)
    with open(os.path.join(d, "committed.json")) as f:
        model = json.load(f)
    conn = connect(os.path.join(d, "test.db"))
    live = json.loads(json.dumps(model))  # with pushes not yet durable

    def point(t, new_t, do, before=None):
        """A durability point of table t leaving it as new_t.  A COMMIT
        gives `before`, the table as its store checkpoint leaves it without
        the COMMIT's own rows: a kill after that checkpoint and before
        SQLite commits puts those rows back (ext/sqlite/journal.c), and the
        training writes before the COMMIT stay durable."""
        pend = dict(model)
        pend[t] = new_t
        if before is not None:
            pend["_synced"] = [t, before]
        write_json(os.path.join(d, "pending.json"), pend)
        do()
        model[t] = new_t
        write_json(os.path.join(d, "committed.json"), model)

    while True:
        r = rng.random()
        if r < 0.30 and live["b"] is not None:
            # A transaction on b with savepoints.
            t = "b"
            base = live[t]
            buf = json.loads(json.dumps(base))
            saves = []
            deleted = set()
            # A COMMIT puts each written row once: updated only, old clock
            # + 1; inserted or replaced (REPLACE deletes the old row), 0.
            written, fresh = set(), set()
            conn.execute("BEGIN")
            for _ in range(rng.randint(1, 12)):
                op = rng.random()
                i = str(rng.randrange(IDS[t]))
                v = [rng.randint(-50, 50) for _ in range(TABLES[t][1])]
                if op < 0.15:
                    conn.execute(f"SAVEPOINT s{len(saves)}")
                    saves.append((json.loads(json.dumps(buf)), set(written), set(deleted), set(fresh)))
                elif op < 0.22 and saves:
                    k = rng.randrange(len(saves))
                    if rng.random() < 0.5:
                        conn.execute(f"ROLLBACK TO s{k}")
                        buf = json.loads(json.dumps(saves[k][0]))
                        written, deleted, fresh = set(saves[k][1]), set(saves[k][2]), set(saves[k][3])
                        saves = saves[:k + 1]
                    else:
                        conn.execute(f"RELEASE s{k}")
                        saves = saves[:k]
                elif op < 0.55:
                    if i in buf or i in deleted:
                        continue  # (a re-insert after a delete: its clock is not modelled)
                    conn.execute(f"INSERT INTO {t}(id, vec) VALUES (?, ?)", (int(i), vec_json(v)))
                    buf[i] = [v, 0]
                    written.add(i)
                    fresh.add(i)
                elif op < 0.70:
                    if i in deleted:
                        continue
                    conn.execute(f"INSERT OR REPLACE INTO {t}(id, vec) VALUES (?, ?)", (int(i), vec_json(v)))
                    buf[i] = [v, 0]
                    written.add(i)
                    fresh.add(i)
                elif op < 0.85:
                    conn.execute(f"UPDATE {t} SET vec = ? WHERE id = ?", (vec_json(v), int(i)))
                    if i in buf:
                        buf[i] = [v, 0]
                        written.add(i)
                else:
                    conn.execute(f"DELETE FROM {t} WHERE id = ?", (int(i),))
                    if i in buf:
                        del buf[i]
                        deleted.add(i)
            for i in written:
                if i in buf:
                    buf[i][1] = base[i][1] + 1 if i in base and i not in fresh else 0
            if rng.random() < 0.2:
                conn.execute("ROLLBACK")
            else:
                live[t] = buf
                point(t, buf, lambda: conn.execute("COMMIT"), base)
        elif r < 0.55:
            # A pull and a push on a: rows the push names are created
            # (zeros) if absent; gradients of repeated ids add up.
            t = "a"
            ids = [rng.randrange(IDS[t]) for _ in range(rng.randint(1, 20))]
            grads = [[rng.randint(-3, 3) for _ in range(4)] for _ in ids]
            conn.execute("SELECT embkv_pull(?, ?)", (t, json.dumps(ids))).fetchone()
            for i in set(ids):
                if str(i) not in live[t]:
                    live[t][str(i)] = [[0, 0, 0, 0], 0]
            conn.execute("SELECT embkv_push(?, ?, ?)",
                         (t, json.dumps(ids), json.dumps([x for g in grads for x in g]))).fetchone()
            total = {}
            for i, g in zip(ids, grads):
                acc = total.setdefault(i, [0, 0, 0, 0])
                for k in range(4):
                    acc[k] += g[k]
            for i, g in total.items():
                v, c = live[t][str(i)]
                live[t][str(i)] = [[v[k] - g[k] for k in range(4)], c + 1]
        elif r < 0.62:
            t = "a"
            point(t, json.loads(json.dumps(live[t])),
                  lambda: conn.execute("SELECT embkv_checkpoint('a')").fetchone())
        elif r < 0.72:
            # Autocommit SQL writes on a (each its own COMMIT, with the
            # pushes before it).
            t = "a"
            i = str(rng.randrange(IDS[t]))
            v = [rng.randint(-50, 50) for _ in range(4)]
            new = json.loads(json.dumps(live[t]))
            if rng.random() < 0.7:
                new[i] = [v, 0]  # (REPLACE: a new row)
                sql, args = "INSERT OR REPLACE INTO a(id, vec) VALUES (?, ?)", (int(i), vec_json(v))
            else:
                sql, args = "DELETE FROM a WHERE id = ?", (int(i),)
                if i not in new:
                    # Nothing deleted: the table takes no part in the
                    # statement's transaction, so no checkpoint (the
                    # pushes before it stay as durable as they were).
                    conn.execute(sql, args)
                    continue
                new.pop(i)
            before = json.loads(json.dumps(live[t]))
            live[t] = new
            point(t, json.loads(json.dumps(new)), lambda: conn.execute(sql, args), before)
        elif r < 0.76:
            conn.execute("SELECT embkv_hotset('a', 50)").fetchone()
        elif r < 0.82:
            # DDL on c.
            if live["c"] is None:
                live["c"] = {}
                point("c", {}, lambda: create(conn, "c"))
            elif rng.random() < 0.4:
                live["c"] = None
                point("c", None, lambda: conn.execute("DROP TABLE c"))
            else:
                i = str(rng.randrange(IDS["c"]))
                v = [rng.randint(-9, 9) for _ in range(2)]
                new = json.loads(json.dumps(live["c"]))
                new[i] = [v, 0]
                before = live["c"]
                live["c"] = new
                point("c", json.loads(json.dumps(new)),
                      lambda: conn.execute("INSERT OR REPLACE INTO c(id, vec) VALUES (?, ?)",
                                           (int(i), vec_json(v))), before)
        else:
            # Reads: a full scan and a lookup (statements open and closed).
            conn.execute("SELECT count(*), sum(clock) FROM a").fetchone()
            conn.execute("SELECT id, vec FROM a WHERE id IN (1, 2, 3)").fetchall()


def table_state(conn, t, dim):
    """{str(id): [ints, clock]} of a table, or None when absent; and the
    problems of its tier counts."""
    exists = conn.execute("SELECT count(*) FROM sqlite_schema WHERE name = ?", (t,)).fetchone()[0]
    if not exists:
        return None, []
    rows = {}
    for i, vec, clock in conn.execute(f"SELECT id, vec, clock FROM {t}"):
        v = struct.unpack(f"<{dim}f", vec)
        rows[str(i)] = [[int(x) if x == int(x) else x for x in v], clock]
    problems = []
    by_tier = dict(conn.execute(f"SELECT tier, count(*) FROM {t} GROUP BY tier").fetchall())
    if sum(by_tier.values()) != len(rows):
        problems.append(f"{t}: rows by tier {by_tier} do not add up to {len(rows)}")
    st = json.loads(conn.execute("SELECT embkv_stats(?)", (t,)).fetchone()[0])
    if st.get("rows") not in (None, len(rows)):
        problems.append(f"{t}: embkv_stats says {st.get('rows')} rows, the table has {len(rows)}")
    return rows, problems


def diff(t, got, want, limit=5):
    if got is None and want is None:
        return []
    if got is None or want is None:
        return [f"{t}: {'absent' if got is None else 'present'}, model says "
                f"{'absent' if want is None else 'present'}"]
    out = []
    for i in sorted(set(got) | set(want), key=int):
        if got.get(i) != want.get(i):
            out.append(f"{t} id {i}: store {got.get(i)} model {want.get(i)}")
            if len(out) >= limit:
                break
    return out


def check(d):
    """The reopened database against the committed or the pending model;
    returns (state found, problems, which model it equals)."""
    with open(os.path.join(d, "committed.json")) as f:
        committed = json.load(f)
    pending = None
    if os.path.exists(os.path.join(d, "pending.json")):
        with open(os.path.join(d, "pending.json")) as f:
            pending = json.load(f)
    conn = connect(os.path.join(d, "test.db"))
    found, problems = {}, []
    for t, (_, dim) in TABLES.items():
        found[t], p = table_state(conn, t, dim)
        problems += p
    conn.close()
    synced = None
    if pending is not None and "_synced" in pending:
        t, before = pending.pop("_synced")
        synced = dict(pending)
        synced[t] = before
    for name, m in (("committed", committed), ("pending", pending), ("synced", synced)):
        if m is not None and all(found[t] == m[t] for t in TABLES):
            return found, problems, name
    out = problems[:]
    for t in TABLES:
        out += diff(t, found[t], committed[t])
    if pending is not None:
        out.append("(and against the pending model:)")
        for t in TABLES:
            out += diff(t, found[t], pending[t])
    return found, out or ["no model matches"], None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("EMBKV_CRASH_ROUNDS", "100")))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        child(a.dir, a.child)
        return 0
    if not os.path.exists(EXT + ".so"):
        sys.exit(f"crash_sql: {EXT}.so is missing: run make first")
    d = a.dir or tempfile.mkdtemp(prefix="embkv-crash-")
    os.makedirs(d, exist_ok=True)
    base = a.seed if a.seed is not None else int(time.time() * 1000) % 1_000_000_007
    print(f"crash_sql: {a.rounds} rounds, base seed {base}, in {d}", flush=True)
    conn = connect(os.path.join(d, "test.db"))
    for t in TABLES:
        create(conn, t)
    conn.close()
    write_json(os.path.join(d, "committed.json"), {t: {} for t in TABLES})
    t0 = time.time()
    failed = changed = at_pending = at_synced = 0
    start = {t: {} for t in TABLES}
    for rnd in range(a.rounds):
        seed = base + rnd
        rng = random.Random(seed ^ 0x5EED)
        try:
            os.unlink(os.path.join(d, "pending.json"))
        except FileNotFoundError:
            pass
        p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", str(seed), "--dir", d],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # Killed at a random moment: early (opening, recovering) to late.
        deadline = time.time() + rng.choice([0.05, 0.2, 0.4, 0.8]) * rng.random() + 0.15
        while time.time() < deadline and p.poll() is None:
            time.sleep(0.005)
        if p.poll() is not None:
            err = p.stderr.read().decode(errors="replace")
            print(f"round {rnd} seed {seed}: the driver stopped by itself (status {p.returncode}):\n{err}",
                  flush=True)
            failed += 1
            break
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stderr.close()
        found, problems, which = check(d)
        if problems:
            print(f"round {rnd} seed {seed}: FAILED", flush=True)
            for line in problems[:40]:
                print("  " + line, flush=True)
            failed += 1
            break
        # What was found is what the next driver starts from.
        changed += found != start
        at_pending += which == "pending"
        at_synced += which == "synced"
        start = found
        write_json(os.path.join(d, "committed.json"), found)
        if (rnd + 1) % 25 == 0 or rnd + 1 == a.rounds:
            rows = {t: (None if found[t] is None else len(found[t])) for t in TABLES}
            print(f"round {rnd + 1}/{a.rounds} seed {seed}: ok, rows {rows} ({time.time() - t0:.0f} s)",
                  flush=True)
    if not failed:
        print(f"crash_sql: {a.rounds} kills, every reopen equal to a durability point ({changed} rounds "
              f"changed the tables, {at_pending} were killed between a point and its mark, {at_synced} "
              f"between a COMMIT's store checkpoint and SQLite's commit; "
              f"{time.time() - t0:.0f} s)", flush=True)
        if not a.keep and not a.dir:
            shutil.rmtree(d, ignore_errors=True)
    else:
        print(f"crash_sql: kept {d} for inspection", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
