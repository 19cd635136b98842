"""Training through SQL from Python: embkv_pull / embkv_push / embkv_release.

- A matrix-factorization model trained through pull/push (two embkv tables,
  users and items) on generated ratings with a known rank-4 structure: the
  held-out error ends far below that of the untrained model and of the
  global-mean predictor, and the run is deterministic.
- Exact optimizer arithmetic (sgd, adagrad, adam) against a float64
  reference computed here, within float32 rounding: duplicates in a batch,
  rows created by the initializer (by a pull or by a push), the lr argument,
  a close and reopen of the database in the middle.
- Bounded staleness with one connection per thread under heavy contention on
  few ids: no pull ever sees more than staleness+1 unreturned pulls of its id
  (counted here, in Python), and with staleness=0 every pull sees every
  earlier push.  Single-thread timeouts: SQLITE_BUSY after about wait_ms,
  naming the table, the id and the bound.
- Permits of a connection that closes go back (a blocked pull in another
  thread proceeds at once), and a killed process's permits are gone for the
  next process (they live in DRAM).

Standard library unittest plus numpy (Debian's python3-numpy).  Run by
tests/run.sh through tests/python_run.sh, or by hand:
    EMBKV_EXT=build/embkv /usr/bin/python3 tests/python/test_train.py -v
"""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import unittest

import numpy as np

from embkv_test import EXT, TempDirTest as Base, connect


F32_EPS = 2.0 ** -24  # half an ulp of 1.0 in float32 (relative rounding error)


def ids_blob(ids):
    return np.asarray(ids, dtype=np.int64).tobytes()


def pull(conn, table, ids, dim):
    (b,) = conn.execute("SELECT embkv_pull(?, ?)", (table, ids_blob(ids))).fetchone()
    return np.frombuffer(b, dtype=np.float32).reshape(len(ids), dim)


def push(conn, table, ids, grads, lr=None):
    g = np.ascontiguousarray(grads, dtype=np.float32).tobytes()
    if lr is None:
        (n,) = conn.execute("SELECT embkv_push(?, ?, ?)", (table, ids_blob(ids), g)).fetchone()
    else:
        (n,) = conn.execute("SELECT embkv_push(?, ?, ?, ?)", (table, ids_blob(ids), g, lr)).fetchone()
    return n


def training_stats(conn, table):
    (s,) = conn.execute("SELECT json_extract(embkv_stats(?), '$.training')", (table,)).fetchone()
    return json.loads(s)


def clocks(conn, table, ids):
    q = "SELECT id, clock FROM %s WHERE id IN (%s)" % (table, ",".join(str(int(i)) for i in ids))
    return dict(conn.execute(q).fetchall())


# ---------------------------------------------------------------- (a) model

def make_ratings(seed=1234, n_users=150, n_items=120, rank=4, n_train=7000, n_test=1500, noise=0.1):
    """Ratings = <true user factor, true item factor> + noise, rank 4; the
    (user, item) pairs are distinct and split into train and held-out."""
    rng = np.random.default_rng(seed)
    U = rng.normal(0, 1 / np.sqrt(np.sqrt(rank)), (n_users, rank))
    V = rng.normal(0, 1 / np.sqrt(np.sqrt(rank)), (n_items, rank))
    pairs = rng.choice(n_users * n_items, n_train + n_test, replace=False)
    u, i = pairs // n_items, pairs % n_items
    r = np.sum(U[u] * V[i], axis=1) + rng.normal(0, noise, len(u))
    tr, te = slice(0, n_train), slice(n_train, n_train + n_test)
    # ids as the model sees them: users 1000+, items -(1+index) (any int64)
    return (1000 + u[tr], -(1 + i[tr]), r[tr]), (1000 + u[te], -(1 + i[te]), r[te])


class TestMatrixFactorization(Base):
    DIM = 8

    def train(self, dbpath, optimizer, lr, epochs=25, batch=128, lam=0.01):
        """Trains users x items through embkv; returns (untrained test MSE,
        trained test MSE, final train MSE, the tables' contents)."""
        (utr, itr, rtr), (ute, ite, rte) = make_ratings()
        conn = connect(dbpath)
        for name, seed in (("users", 1), ("items", 2)):
            conn.execute("CREATE VIRTUAL TABLE %s USING embkv(dim=%d, pool_size='16M', optimizer=%s, lr=%r, "
                         "init='normal(0,0.1)', seed=%d)" % (name, self.DIM, optimizer, lr, seed))
        pulls = pushes = 0
        updates = {"users": {}, "items": {}}   # id -> pushes that reached it (its clock)

        def mse(u, i, r):
            nonlocal pulls
            pulls += 2 * len(u)
            p = np.sum(pull(conn, "users", u, self.DIM).astype(np.float64)
                       * pull(conn, "items", i, self.DIM).astype(np.float64), axis=1)
            return float(np.mean((p - r) ** 2))

        untrained = mse(ute, ite, rte)
        rng = np.random.default_rng(99)
        for _ in range(epochs):
            order = rng.permutation(len(rtr))
            for k in range(0, len(order), batch):
                b = order[k:k + batch]
                pu = pull(conn, "users", utr[b], self.DIM).astype(np.float64)
                pi = pull(conn, "items", itr[b], self.DIM).astype(np.float64)
                err = np.sum(pu * pi, axis=1) - rtr[b]
                gu = err[:, None] * pi + lam * pu
                gi = err[:, None] * pu + lam * pi
                # duplicates (a user twice in a batch) are summed by the push
                self.assertEqual(push(conn, "users", utr[b], gu), len(np.unique(utr[b])))
                self.assertEqual(push(conn, "items", itr[b], gi), len(np.unique(itr[b])))
                pulls += 2 * len(b)
                pushes += len(np.unique(utr[b])) + len(np.unique(itr[b]))
                for t, ids in (("users", utr[b]), ("items", itr[b])):
                    for i in np.unique(ids):
                        updates[t][int(i)] = updates[t].get(int(i), 0) + 1
        trained, train_mse = mse(ute, ite, rte), mse(utr, itr, rtr)
        su, si = training_stats(conn, "users"), training_stats(conn, "items")
        self.assertEqual(su["pulls"] + si["pulls"], pulls)
        self.assertEqual(su["pushes"] + si["pushes"], pushes)
        # every user and item seen in training or test was created once, by init
        self.assertEqual(su["rows_created"], len(np.unique(np.concatenate([utr, ute]))))
        self.assertEqual(si["rows_created"], len(np.unique(np.concatenate([itr, ite]))))
        tables = {t: conn.execute("SELECT id, vec, clock FROM %s ORDER BY id" % t).fetchall()
                  for t in ("users", "items")}
        conn.close()
        # every row's clock counts the pushes that reached it (0 for rows
        # only pulled, for the held-out ratings)
        for t, rows in tables.items():
            self.assertEqual({i: c for (i, _, c) in rows if c}, updates[t], t)
        return untrained, trained, train_mse, tables

    def check(self, optimizer, lr):
        (_, _, rtr), (_, _, rte) = make_ratings()
        mean_mse = float(np.mean((rte - rtr.mean()) ** 2))  # predicting the global mean
        untrained, trained, train_mse, tables = self.train(self.db, optimizer, lr)
        # the data has structure to learn: both baselines are near the ratings' variance
        self.assertGreater(untrained, 0.5)
        self.assertGreater(mean_mse, 0.5)
        # trained: near the noise floor (0.1^2), far below both baselines
        self.assertLess(trained, 0.1, (optimizer, untrained, trained, train_mse))
        self.assertLess(trained, 0.1 * min(untrained, mean_mse), (optimizer, untrained, trained))
        self.assertLess(train_mse, 0.05)
        return tables, trained

    def test_adagrad(self):
        tables, trained = self.check("adagrad", 0.1)
        # deterministic: the same seeds and calls give the same tables, bit for bit
        other = os.path.join(self.dir, "again.db")
        _, trained2, _, tables2 = self.train(other, "adagrad", 0.1)
        self.assertEqual(trained2, trained)
        self.assertEqual(tables2, tables)

    def test_sgd(self):
        self.check("sgd", 0.02)


# ---------------------------------------------------------- (b) arithmetic

class Reference:
    """The table's optimizer in float64, PyTorch's rules, per row."""

    def __init__(self, optimizer, lr, dim, eps=None, initial_accumulator=0.0, beta1=0.9, beta2=0.999):
        self.opt, self.lr, self.dim = optimizer, lr, dim
        self.eps = eps if eps is not None else (1e-8 if optimizer == "adam" else 1e-10)
        self.acc0, self.b1, self.b2 = initial_accumulator, beta1, beta2
        self.w, self.state, self.clock, self.bound = {}, {}, {}, {}

    def create(self, i, values):
        self.w[i] = np.asarray(values, dtype=np.float64).copy()
        self.clock[i] = 0
        self.bound[i] = 0.0
        if self.opt == "adagrad":
            self.state[i] = np.full(self.dim, self.acc0)
        elif self.opt == "adam":
            self.state[i] = [np.zeros(self.dim), np.zeros(self.dim), 0]

    def push(self, ids, grads, lr=None):
        lr = self.lr if lr is None else lr
        summed = {}
        for i, g in zip(ids, np.asarray(grads, dtype=np.float32).astype(np.float64)):
            summed[int(i)] = summed.get(int(i), 0) + g
        for i, g in summed.items():
            w = self.w[i]
            if self.opt == "sgd":
                step = lr * g
            elif self.opt == "adagrad":
                self.state[i] += g * g
                step = lr * g / (np.sqrt(self.state[i]) + self.eps)
            else:
                m, v, t = self.state[i]
                t += 1
                m = self.b1 * m + (1 - self.b1) * g
                v = self.b2 * v + (1 - self.b2) * g * g
                self.state[i] = [m, v, t]
                step = lr * (m / (1 - self.b1 ** t)) / (np.sqrt(v / (1 - self.b2 ** t)) + self.eps)
            self.w[i] = w - step
            self.clock[i] += 1
            # float32 storage: each step rounds w by up to half an ulp, and
            # the optimizer state the steps are computed from was rounded at
            # each of the row's earlier updates (errors that add up)
            self.bound[i] += 2 * F32_EPS * (np.max(np.abs(self.w[i])) + self.clock[i] * np.max(np.abs(step)))
        return len(summed)


class TestOptimizerArithmetic(Base):
    DIM = 6

    def run_case(self, optimizer, options, ref, steps=60, reopen_at=30):
        """Random pushes with many duplicates, on rows created by pulls and
        by pushes; the pulled values must equal ref's within float32
        rounding, and every clock must count the pushes that reached it."""
        dim = self.DIM
        rng = np.random.default_rng({"sgd": 11, "adagrad": 12, "adam": 13}[optimizer])
        create = ("CREATE VIRTUAL TABLE %%s USING embkv(dim=%d, pool_size='16M', optimizer=%s, "
                  "init='uniform(-1,1)', seed=77%s)" % (dim, optimizer, options))
        conn = connect(self.db)
        conn.execute(create % "w")
        conn.execute(create % "twin")   # same init, same seed, never pushed
        pool = list(range(-3, 9))       # 12 ids: duplicates in nearly every batch
        late = [1000, 2 ** 40]          # first pushed after the reopen: created by a push
        created = set()
        created_since_open = [0]        # the training counters are DRAM state

        def known(ids):
            """Rows ref does not know yet: their initial values, read from the
            twin (rows created by the push must start from the same)."""
            new = sorted(set(int(i) for i in ids) - created)
            if new:
                for i, v in zip(new, pull(conn, "twin", new, dim)):
                    ref.create(i, v)
                created.update(new)
                created_since_open[0] += len(new)

        # some rows created by a first pull, the others by their first push
        first = pool[:5]
        got = pull(conn, "w", first, dim)
        known(first)
        np.testing.assert_array_equal(got, np.array([ref.w[i] for i in first], dtype=np.float32))
        for step in range(steps):
            if step == reopen_at:
                self.assertEqual(training_stats(conn, "w")["rows_created"], created_since_open[0])
                conn.close()   # training writes are durable after a clean close
                conn = connect(self.db)
                created_since_open[0] = 0
            n = int(rng.integers(1, 10))
            ids = rng.choice(pool + (late if step >= reopen_at else []), n)
            if step == reopen_at:
                ids[0] = late[1]
            grads = rng.normal(0, 1, (n, dim)).astype(np.float32)
            lr = None if step % 7 else float(rng.choice([0.5, 0.03125]))
            known(ids)
            want_n = ref.push(ids, grads, lr)
            got_n = push(conn, "w", ids, grads, lr)
            self.assertEqual(got_n, want_n, step)
            if step % 5 == 4 or step == steps - 1:
                some = sorted(created)
                got = pull(conn, "w", some, dim).astype(np.float64)
                for row, i in zip(got, some):
                    err = np.max(np.abs(row - ref.w[i]))
                    self.assertLessEqual(err, ref.bound[i] + 1e-12,
                                         "%s step %d id %d: got %r want %r" % (optimizer, step, i, row, ref.w[i]))
                self.assertEqual(clocks(conn, "w", some), {i: ref.clock[i] for i in some})
        self.assertEqual(sum(1 for i in created if ref.clock[i] > 0), len(pool) + len(late))
        self.assertEqual(training_stats(conn, "w")["rows_created"], created_since_open[0])
        self.assertGreater(created_since_open[0], 0)   # some rows were created by a push after the reopen
        conn.close()
        return ref

    def test_sgd(self):
        ref = self.run_case("sgd", ", lr=0.125", Reference("sgd", 0.125, self.DIM))
        self.assertTrue(any(ref.clock[i] >= 10 for i in ref.clock))

    def test_adagrad(self):
        self.run_case("adagrad", ", lr=0.25, initial_accumulator=0.1",
                      Reference("adagrad", 0.25, self.DIM, initial_accumulator=0.1))

    def test_adagrad_first_step(self):
        # eps 1e-10 is PyTorch's default: the first step of a fresh row is lr*sign(g)
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE a USING embkv(dim=4, pool_size='16M', optimizer=adagrad, lr=0.5, "
                     "init=zeros)")
        self.assertEqual(push(conn, "a", [1], [[3, -0.25, 0.0625, 2e4]]), 1)
        np.testing.assert_array_equal(pull(conn, "a", [1], 4), [[-0.5, 0.5, -0.5, -0.5]])
        conn.close()

    def test_adam(self):
        self.run_case("adam", ", lr=0.0625, beta1=0.8, beta2=0.99",
                      Reference("adam", 0.0625, self.DIM, beta1=0.8, beta2=0.99))


# ---------------------------------------------------------- (c) staleness

def run_threads(target, n):
    errors = []

    def wrap(k):
        try:
            target(k)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append("thread %d: %r" % (k, e))

    threads = [threading.Thread(target=wrap, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors, [t for t in threads if t.is_alive()]


class TestStaleness(Base):
    THREADS = 8
    IDS = [1, 2, 3, 4]

    def make(self, staleness, wait_ms=60000):
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE emb USING embkv(dim=4, pool_size='16M', optimizer=sgd, lr=1, "
                     "init=zeros, staleness=%d, wait_ms=%d)" % (staleness, wait_ms))
        return conn

    def test_bound_holds_under_contention(self):
        S = 1
        setup = self.make(S)
        lock = threading.Lock()
        out = {i: 0 for i in self.IDS}           # pulls returned, push not yet started
        most = {i: 0 for i in self.IDS}
        violations, pushes = [], {i: 0 for i in self.IDS}
        iters = 150

        def worker(k):
            conn = connect(self.db)
            rng = np.random.default_rng(k)
            try:
                for _ in range(iters):
                    ids = rng.choice(self.IDS, int(rng.integers(1, 3)), replace=False)
                    pull(conn, "emb", ids, 4)
                    with lock:   # right after the pull returned
                        for i in ids:
                            out[i] += 1
                            most[i] = max(most[i], out[i])
                            if out[i] > S + 1:
                                violations.append((int(i), out[i]))
                    # the "forward pass": a snapshot read (no permit) that
                    # lets other threads run while these ids are out
                    conn.execute("SELECT count(*) FROM emb WHERE id IN (1, 2, 3, 4)").fetchone()
                    with lock:   # right before the push
                        for i in ids:
                            out[i] -= 1
                            pushes[i] += 1
                    push(conn, "emb", ids, -np.ones((len(ids), 4)))
            finally:
                conn.close()

        t0 = time.monotonic()
        errors, alive = run_threads(worker, self.THREADS)
        self.assertEqual(errors, [])
        self.assertEqual(alive, [])
        self.assertEqual(violations, [])
        # contention was real: some id had staleness+1 pulls out at once, and
        # pulls had to wait for permits (none timed out)
        self.assertEqual(max(most.values()), S + 1, most)
        st = training_stats(setup, "emb")
        self.assertGreater(st["permit_waits"], 0, st)
        self.assertEqual(st["permit_timeouts"], 0, st)
        self.assertEqual(st["pushes"], sum(pushes.values()))
        # sgd, lr 1, gradient -1: every push added exactly 1
        got = pull(setup, "emb", self.IDS, 4)
        for i, row in zip(self.IDS, got):
            self.assertTrue(np.all(row == pushes[i]), (i, row, pushes[i]))
        self.assertEqual(clocks(setup, "emb", self.IDS), pushes)
        setup.close()
        self.assertLess(time.monotonic() - t0, 60)

    def test_bsp_every_pull_sees_every_earlier_push(self):
        setup = self.make(0)
        lock = threading.Lock()
        seen = {i: [] for i in self.IDS[:3]}
        iters = 120

        def worker(k):
            conn = connect(self.db)
            rng = np.random.default_rng(100 + k)
            try:
                for _ in range(iters):
                    ids = rng.choice(list(seen), int(rng.integers(1, 3)), replace=False)
                    vals = pull(conn, "emb", ids, 4)
                    with lock:
                        for i, v in zip(ids, vals):
                            self.assertTrue(np.all(v == v[0]), v)
                            seen[int(i)].append(float(v[0]))
                    conn.execute("SELECT vec FROM emb WHERE id = ?", (int(ids[0]),)).fetchone()
                    push(conn, "emb", ids, -np.ones((len(ids), 4)))
            finally:
                conn.close()

        errors, alive = run_threads(worker, self.THREADS)
        self.assertEqual(errors, [])
        self.assertEqual(alive, [])
        for i, vals in seen.items():
            # one pull out at a time per id, each after the previous push:
            # the values pulled are 0, 1, 2, ... each exactly once
            self.assertEqual(sorted(vals), [float(x) for x in range(len(vals))], i)
        st = training_stats(setup, "emb")
        self.assertEqual(st["pulls"], sum(len(v) for v in seen.values()))
        self.assertEqual(st["pushes"], sum(len(v) for v in seen.values()))
        self.assertGreater(st["permit_waits"], 0, st)
        self.assertEqual(st["permit_timeouts"], 0, st)
        got = pull(setup, "emb", list(seen), 4)
        for (i, vals), row in zip(seen.items(), got):
            self.assertTrue(np.all(row == len(vals)))
        setup.close()

    def busy(self, conn, ids):
        t0 = time.monotonic()
        with self.assertRaises(sqlite3.OperationalError) as cm:
            pull(conn, "emb", ids, 4)
        return cm.exception, time.monotonic() - t0

    def test_single_thread_timeouts(self):
        conn = self.make(0, wait_ms=300)
        pull(conn, "emb", [7], 4)
        e, elapsed = self.busy(conn, [7])
        self.assertEqual(e.sqlite_errorcode, sqlite3.SQLITE_BUSY)
        self.assertEqual(str(e), "embkv_pull: table emb: id 7: staleness bound 0 reached: still 1 pull "
                                 "without a push after 300 ms")
        self.assertGreaterEqual(elapsed, 0.28)
        self.assertLess(elapsed, 5)
        # the failed pull holds nothing: one release frees the id
        self.assertEqual(conn.execute("SELECT embkv_release('emb', 7)").fetchone(), (1,))
        pull(conn, "emb", [7], 4)
        conn.execute("SELECT embkv_release('emb', 7)")
        conn.execute("DROP TABLE emb")
        conn.execute("CREATE VIRTUAL TABLE emb USING embkv(dim=4, pool_size='16M', init=zeros, staleness=2, "
                     "wait_ms=300)")
        for _ in range(3):
            pull(conn, "emb", [7], 4)                 # three pass
        e, elapsed = self.busy(conn, [5, 7])          # the fourth waits, then fails naming 7
        self.assertEqual(e.sqlite_errorcode, sqlite3.SQLITE_BUSY)
        self.assertIn("id 7: staleness bound 2 reached", str(e))
        self.assertGreaterEqual(elapsed, 0.28)
        self.assertLess(elapsed, 5)
        pull(conn, "emb", [5], 4)   # 5 was not kept by the failed pull
        st = training_stats(conn, "emb")
        self.assertEqual((st["pulls"], st["permit_waits"], st["permit_timeouts"]), (4, 1, 1))
        conn.close()


# ------------------------------------------------------ (d) dying holders

KILLED_CHILD = r"""
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.enable_load_extension(True)
conn.load_extension(sys.argv[2])
conn.execute("SELECT embkv_pull('emb', '[5, 6]')").fetchone()
print("pulled", flush=True)
time.sleep(120)
"""


class TestDyingHolders(Base):
    WAIT_MS = 20000

    def make(self):
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE emb USING embkv(dim=4, pool_size='16M', optimizer=sgd, lr=1, "
                     "init=zeros, staleness=0, wait_ms=%d)" % self.WAIT_MS)
        return conn

    def test_closing_connection_wakes_a_blocked_pull(self):
        setup = self.make()
        pulled, close_now, b_started = threading.Event(), threading.Event(), threading.Event()
        times, errors, got = {}, [], {}

        def holder():
            try:
                conn = connect(self.db)
                pull(conn, "emb", [5], 4)           # holds id 5's only permit
                pulled.set()
                close_now.wait(60)
                times["close"] = time.monotonic()
                conn.close()                        # without a push or release
            except BaseException as e:  # pragma: no cover
                errors.append(repr(e))
                pulled.set()

        def blocked():
            try:
                conn = connect(self.db)
                b_started.set()
                times["start"] = time.monotonic()
                got["vec"] = pull(conn, "emb", [5], 4)
                times["end"] = time.monotonic()
                push(conn, "emb", [5], -np.ones((1, 4)))
                conn.close()
            except BaseException as e:
                times["end"] = time.monotonic()
                errors.append(repr(e))

        a = threading.Thread(target=holder)
        a.start()
        self.assertTrue(pulled.wait(30))
        b = threading.Thread(target=blocked)
        b.start()
        self.assertTrue(b_started.wait(30))
        # the one sleep: give B time to block in its pull; it must still be there
        time.sleep(0.5)
        self.assertNotIn("end", times, errors)
        self.assertTrue(b.is_alive())
        close_now.set()
        a.join(30)
        b.join(30)
        self.assertFalse(b.is_alive())
        self.assertEqual(errors, [])
        np.testing.assert_array_equal(got["vec"], np.zeros((1, 4), np.float32))
        # B waited for the close, and proceeded at once after it
        self.assertGreaterEqual(times["end"] - times["start"], 0.45)
        self.assertGreaterEqual(times["end"], times["close"])
        self.assertLess(times["end"] - times["close"], 2.0)   # wait_ms is 20 s
        st = training_stats(setup, "emb")
        self.assertEqual((st["permit_waits"], st["permit_timeouts"]), (1, 0), st)
        np.testing.assert_array_equal(pull(setup, "emb", [5], 4), np.ones((1, 4), np.float32))
        setup.close()

    def test_killed_process_permits_are_gone(self):
        self.make().close()   # the child must be the only process with the store open
        child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, self.db, EXT], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        try:
            line = child.stdout.readline()
            self.assertEqual(line.strip(), "pulled", child.stderr.read() if not line else line)
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            child.stdout.close()
            child.stderr.close()
        self.assertEqual(child.returncode, -signal.SIGKILL)
        conn = connect(self.db)
        t0 = time.monotonic()
        vecs = pull(conn, "emb", [6, 5], 4)
        self.assertLess(time.monotonic() - t0, 5.0)   # no wait for the dead child's permits (wait_ms 20 s)
        np.testing.assert_array_equal(vecs, np.zeros((2, 4), np.float32))
        st = training_stats(conn, "emb")
        self.assertEqual((st["pulls"], st["permit_waits"], st["permit_timeouts"]), (2, 0, 0), st)
        # and the bound is in force again for this process
        conn.close()


class TestFullPool(Base):
    def test_pull_that_cannot_create_all_rows_creates_none(self):
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE big USING embkv(dim=8192, init='zeros', capacity=10)")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            pull(conn, "big", list(range(5000, 6000)) + [5000, 5001], 8192)
        msg = str(cm.exception)
        self.assertIn("embkv_pull: table big: cannot create 1000 missing row(s), the first id 5000: ", msg)
        self.assertIn("no room for 1000 puts and 0 deletes at once: the pool has ", msg)
        self.assertEqual(conn.execute("SELECT count(*) FROM big").fetchone(), (0,))
        self.assertEqual(training_stats(conn, "big")["rows_created"], 0)
        # a batch that fits is created whole, duplicates once each
        vecs = pull(conn, "big", list(range(150)) + [3, 3], 8192)
        self.assertEqual(vecs.shape, (152, 8192))
        self.assertFalse(vecs.any())
        self.assertEqual(conn.execute("SELECT count(*) FROM big").fetchone(), (150,))
        self.assertEqual(training_stats(conn, "big")["rows_created"], 150)
        self.assertNotIn("SSD tier", msg)
        conn.close()

    def test_a_pull_larger_than_the_pool_with_an_ssd_tier(self):
        """With an SSD tier the message says why a write bigger than the
        pool's free records fails, and the smaller pulls it advises go
        through, the tier making room between them."""
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE s USING embkv(dim=64, init='zeros', pool_size='16M', ssd_size='64M', "
                     "capacity=1000)")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            pull(conn, "s", list(range(50000)), 64)
        self.assertIn("no room for 50000 puts and 0 deletes at once: the pool has ", str(cm.exception))
        self.assertIn(" kept for deletes only (rows move to the SSD tier between writes, not during one: smaller "
                      "writes go through while it has room); ", str(cm.exception))
        for a in range(0, 50000, 5000):
            ids = list(range(a, a + 5000))
            pull(conn, "s", ids, 64)
            conn.execute("SELECT embkv_release('s', ?)", (np.array(ids, np.int64).tobytes(),)).fetchone()
        self.assertEqual(conn.execute("SELECT count(*) FROM s").fetchone(), (50000,))
        self.assertGreater(conn.execute("SELECT count(*) FROM s WHERE tier = 'ssd'").fetchone()[0], 0)
        conn.close()

    def test_an_index_past_the_pool_says_what_to_do(self):
        conn = connect(self.db)
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, init='zeros', pool_size='16M')")
        with self.assertRaises(sqlite3.OperationalError) as cm:
            pull(conn, "t", list(range(2000000)), 4)
        self.assertRegex(str(cm.exception), r"^embkv_pull: table t: cannot create 2000000 missing row\(s\), the first "
                                            r"id 0: store .*: an index for 2000000 entries does not fit the pool "
                                            r"\(pool_size 16777216 bytes\): create fewer rows, or copy the rows into a "
                                            r"store with a larger pool_size \(a pool does not grow\)$")
        self.assertEqual(conn.execute("SELECT count(*) FROM t").fetchone(), (0,))
        conn.close()

    def test_large_push_without_room_changes_nothing(self):
        """A push of 20,000 rows (updated on two threads, half each) into a
        pool with room for one half's new versions: it fails whole, every
        clock stays 0, and doing as its message says (a checkpoint, again)
        cannot leave half the rows updated twice."""
        conn = connect(self.db)
        n, d = 20000, 64
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=%d, lr=1, init='zeros', capacity=%d, pool_size='16M')"
                     % (d, n))
        ids = np.arange(n, dtype=np.int64)
        for k in range(0, n, 1000):
            pull(conn, "t", ids[k:k + 1000], d)
            conn.execute("SELECT embkv_release('t', ?)", (ids[k:k + 1000].tobytes(),))
            conn.execute("SELECT embkv_checkpoint('t')")
        g = np.ones((n, d), np.float32)

        def clocks():
            return dict(conn.execute("SELECT clock, count(*) FROM t GROUP BY clock").fetchall())
        for attempt in range(2):
            with self.assertRaises(sqlite3.OperationalError) as cm:
                conn.execute("SELECT embkv_push('t', ?, ?)", (ids.tobytes(), g.tobytes()))
            self.assertIn("embkv_push: table t: store ", str(cm.exception))
            self.assertIn("pool full", str(cm.exception))
            self.assertEqual(clocks(), {0: n})
            conn.execute("SELECT embkv_checkpoint('t')")
        # half of it fits: updated whole
        self.assertEqual(conn.execute("SELECT embkv_push('t', ?, ?)", (ids[:n // 4].tobytes(),
                                                                       g[:n // 4].tobytes())).fetchone()[0], n // 4)
        self.assertEqual(clocks(), {0: n - n // 4, 1: n // 4})
        conn.close()


class TestPermitsPerId(Base):
    def test_other_ids_never_wait(self):
        """Staleness counts only the ids pulled: A holds 0..4999 at
        staleness 0, B pulls 1000000..1000099 (and thousands more) at once."""
        a = connect(self.db)
        b = connect(self.db)
        try:
            a.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, init='zeros', staleness=0, wait_ms=200)")
            a.execute("SELECT embkv_pull('t', ?)", (np.arange(5000, dtype=np.int64).tobytes(),))
            b.execute("SELECT embkv_pull('t', ?)", (np.arange(1000000, 1000100, dtype=np.int64).tobytes(),))
            b.execute("SELECT embkv_pull('t', ?)", (np.arange(2000000, 2005000, dtype=np.int64).tobytes(),))
            # (counted, not timed: a loaded machine makes any time bound flaky)
            stats = json.loads(b.execute("SELECT embkv_stats('t')").fetchone()[0])["training"]
            self.assertEqual((stats["permit_waits"], stats["permit_timeouts"]), (0, 0))
            with self.assertRaisesRegex(sqlite3.OperationalError, "id 4999: staleness bound 0 reached"):
                b.execute("SELECT embkv_pull('t', '[4999]')")
            stats = json.loads(b.execute("SELECT embkv_stats('t')").fetchone()[0])["training"]
            self.assertEqual(stats["permit_timeouts"], 1)
            self.assertEqual(b.execute("SELECT embkv_release('t', ?)",
                                       (np.arange(1000000, 1000100, dtype=np.int64).tobytes(),)).fetchone()[0], 100)
        finally:
            a.close()
            b.close()


if __name__ == "__main__":
    unittest.main()
