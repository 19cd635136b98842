#!/usr/bin/env python3
"""A DLRM-style click-through-rate model trained through embkv.

    python3 pysample/train_ctr.py       # with the embkv package installed (docs/install.md)
    make demo-train                     # or: installs it into build/venv and runs this

The data: a generated Criteo-like set in an ordinary SQLite table `samples`
of the same database (26 categorical fields with Zipf-distributed ids over
vocabularies from a handful to 100k ids, 13 dense features), its labels
drawn from a hidden model, so the best AUC any model can reach on the
held-out rows is known (printed as "best achievable").

The model: one embedding row per (field, id) in the embkv table `emb` (ids
field << 40 | id; adagrad in the store, rows created on first pull), a
bottom MLP over the dense features, the dot products of every pair of the
27 vectors (DLRM's interaction) and a top MLP.  Batches are read with SQL;
`--workers` threads train the same table under the table's `staleness`
bound (the dense MLP is shared, Hogwild-style, its steps serialized).

Checkpoints (every --checkpoint-every batches): the workers pause, the dense
state goes to `<db>.dense-<generation>.pt`, then one autocommit INSERT of the
training position into the reserved row -1 of `emb` is the embkv checkpoint
of all the embeddings and the position at once; killed at any moment, the
next run resumes from the last one with exactly its rows (--fresh starts
over).  At the end: AUC on the held-out rows, in numpy and with the SQL of
sql/analytics.sql (window functions over a predictions table), the loss and
AUC curves drawn to --png.
"""
import argparse
import glob
import json
import math
import os
import sys
import threading
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    sys.exit("train_ctr.py: %s: run it with Debian's /usr/bin/python3 (this is %s), with the packages "
             "python3-numpy and python3-torch (`make deps` installs them)" % (e, sys.executable))
try:
    import embkv
    import embkv.torch as ekt
except ImportError as e:  # pragma: no cover
    sys.exit("train_ctr.py: %s: install the embkv package for %s (docs/install.md), or run `make demo-train`"
             % (e, sys.executable))

NCAT, NDENSE = 26, 13
POS_ROW = -1          # reserved id of emb: (generation, batches done)
FIELD_SHIFT = 40

AUC_SQL = """
WITH ranked AS (
  SELECT label, rank() OVER (ORDER BY score) + (count(*) OVER (PARTITION BY score) - 1) / 2.0 AS r
  FROM predictions),
totals AS (
  SELECT sum(label) AS pos, sum(1 - label) AS neg, sum(CASE WHEN label = 1 THEN r ELSE 0 END) AS pos_rank_sum
  FROM ranked)
SELECT (pos_rank_sum - pos * (pos + 1) / 2.0) / (pos * neg) FROM totals"""


def auc(scores, labels):
    """Rank-based AUC (ties share their average rank)."""
    scores = np.asarray(scores, np.float64)
    labels = np.asarray(labels, np.int64)
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), np.float64)
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    r = np.empty(len(s), np.float64)
    r[order] = ranks
    pos = labels.sum()
    neg = len(labels) - pos
    return float((r[labels == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


# ------------------------------------------------------------------ data

def vocab_sizes(scale):
    return [max(2, int(v * scale)) for v in np.geomspace(4, 100000, NCAT)]


def generate(conn, n_train, n_test, seed, vocab_scale):
    """The samples table and the hidden model's best AUC on the test rows."""
    rng = np.random.default_rng(seed)
    n = n_train + n_test
    sizes = vocab_sizes(vocab_scale)
    cats = np.empty((n, NCAT), np.int64)
    logit = np.full(n, -1.0)
    u = []
    for f, v in enumerate(sizes):
        p = 1.0 / np.arange(1, v + 1) ** 1.05
        p /= p.sum()
        perm = rng.permutation(v)           # popular ids are not the small ones
        cats[:, f] = perm[np.minimum(np.searchsorted(np.cumsum(p), rng.random(n)), v - 1)]
        effect = rng.normal(0, 0.35, v)
        logit += effect[cats[:, f]]
        if f < 4:
            u.append(rng.normal(0, 0.6, (v, 4))[cats[:, f]])
    for a in range(4):
        for b in range(a + 1, 4):
            logit += (u[a] * u[b]).sum(1)
    dense = rng.normal(0, 1, (n, NDENSE)).astype(np.float32)
    logit += dense @ rng.normal(0, 0.3, NDENSE)
    prob = 1 / (1 + np.exp(-logit))
    label = (rng.random(n) < prob).astype(np.int64)
    cols = ", ".join(["id INTEGER PRIMARY KEY", "split INTEGER", "label INTEGER"] +
                     ["d%d REAL" % i for i in range(NDENSE)] + ["c%d INTEGER" % i for i in range(NCAT)])
    conn.execute("BEGIN")
    conn.execute("CREATE TABLE samples (%s)" % cols)
    marks = ", ".join("?" * (3 + NDENSE + NCAT))
    split = np.r_[np.zeros(n_train, np.int64), np.ones(n_test, np.int64)]
    conn.executemany("INSERT INTO samples VALUES (%s)" % marks,
                     (tuple([i, int(split[i]), int(label[i])] + dense[i].tolist() + cats[i].tolist())
                      for i in range(n)))
    best = auc(prob[n_train:], label[n_train:])
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value)")
    conn.executemany("INSERT INTO meta VALUES (?, ?)",
                     [("best_auc", best), ("n_train", n_train), ("n_test", n_test), ("seed", seed),
                      ("vocab", json.dumps(sizes)), ("positives", float(label.mean()))])
    conn.execute("COMMIT")


def meta(conn):
    return dict(conn.execute("SELECT key, value FROM meta").fetchall())


def read_rows(conn, first, count):
    """Rows first..first+count-1 of samples: dense, ids (field-offset), labels."""
    cols = ", ".join(["label"] + ["d%d" % i for i in range(NDENSE)] + ["c%d" % i for i in range(NCAT)])
    rows = np.array(conn.execute("SELECT %s FROM samples WHERE id >= ? AND id < ? ORDER BY id" % cols,
                                 (first, first + count)).fetchall(), dtype=np.float64).reshape(-1, 1 + NDENSE + NCAT)
    label = rows[:, 0].astype(np.float32)
    dense = rows[:, 1:1 + NDENSE].astype(np.float32)
    ids = rows[:, 1 + NDENSE:].astype(np.int64) + (np.arange(NCAT, dtype=np.int64) << FIELD_SHIFT)
    return torch.from_numpy(dense), torch.from_numpy(ids), torch.from_numpy(label)


# ------------------------------------------------------------------ model

class Dense(torch.nn.Module):
    """DLRM's dense part: bottom MLP, pairwise dots, top MLP."""

    def __init__(self, dim):
        super().__init__()
        self.bottom = torch.nn.Sequential(torch.nn.Linear(NDENSE, 64), torch.nn.ReLU(), torch.nn.Linear(64, dim))
        nvec = NCAT + 1
        self.iu = torch.triu_indices(nvec, nvec, 1)
        self.top = torch.nn.Sequential(torch.nn.Linear(dim + nvec * (nvec - 1) // 2, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 1))

    def forward(self, dense, embs):
        x = self.bottom(dense)
        t = torch.cat([x.unsqueeze(1), embs], 1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.iu[0], self.iu[1]]
        return self.top(torch.cat([x, z], 1)).squeeze(1)


class MemoryEmbedding(torch.nn.Module):
    """The in-memory baseline: torch.nn.EmbeddingBag-style rows in a dict of
    field tables, sparse gradients, torch's sparse Adagrad."""

    def __init__(self, sizes, dim, lr, seed):
        super().__init__()
        self.tabs = torch.nn.ModuleList(torch.nn.Embedding(v, dim, sparse=True) for v in sizes)
        # The same initial rows as the embkv table's initializer (a function
        # of the seed and the id), read from a scratch table.
        scratch = embkv.connect(":memory:")
        scratch.execute("CREATE VIRTUAL TABLE init USING embkv(dim=%d, init='normal(0,0.05)', seed=%d, "
                        "capacity=%d)" % (dim, seed, max(sizes) + 1))
        for f, t in enumerate(self.tabs):
            ids = np.arange(len(t.weight), dtype=np.int64) + (f << FIELD_SHIFT)
            rows = np.array(embkv.pull(scratch, "init", ids))
            embkv.release(scratch, "init", ids)
            scratch.execute("DELETE FROM init")
            with torch.no_grad():
                t.weight.copy_(torch.from_numpy(rows))
        scratch.close()
        self.opt = torch.optim.Adagrad(self.parameters(), lr=lr, eps=1e-10)

    def forward(self, ids):
        raw = ids & ((1 << FIELD_SHIFT) - 1)
        return torch.stack([t(raw[:, f]) for f, t in enumerate(self.tabs)], 1)


# ------------------------------------------------------------------ training

class Trainer:
    def __init__(self, args):
        self.args = args
        self.db = args.db
        # Used by whichever worker checkpoints (the others are paused).
        conn = embkv.connect(self.db, check_same_thread=False)
        self.conn = conn
        if args.fresh:
            self.drop_all()
        if not conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'samples'").fetchone():
            t0 = time.time()
            generate(conn, args.train_rows, args.test_rows, args.seed, args.vocab_scale)
            print("generated %d training and %d held-out rows in %.1f s" % (args.train_rows, args.test_rows,
                                                                            time.time() - t0))
        self.meta = meta(conn)
        self.n_train, self.n_test = int(self.meta["n_train"]), int(self.meta["n_test"])
        made = {"--train-rows": self.n_train, "--test-rows": self.n_test, "--seed": int(self.meta["seed"])}
        asked = {"--train-rows": args.train_rows, "--test-rows": args.test_rows, "--seed": args.seed}
        for k in made:
            if made[k] != asked[k]:
                sys.exit("train_ctr.py: the data in %s was generated with %s %s, not %s: give the same, or --fresh "
                         "to start over" % (self.db, k, made[k], asked[k]))
        self.sizes = json.loads(self.meta["vocab"])
        torch.manual_seed(args.seed)
        self.dense = Dense(args.dim)
        self.dense_opt = torch.optim.Adagrad(self.dense.parameters(), lr=args.dense_lr)
        self.dense_lock = threading.Lock()
        self.memory = None
        if args.memory:
            self.memory = MemoryEmbedding(self.sizes, args.dim, args.lr, args.seed)
        elif not conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'emb'").fetchone():
            conn.execute("CREATE VIRTUAL TABLE emb USING embkv(dim=%d, optimizer='adagrad', lr=%r, eps=1e-10, "
                         "init='normal(0,0.05)', seed=%d, staleness=%s, capacity=%d, dtype=%s, rounding=%s)"
                         % (args.dim, args.lr, args.seed, args.staleness, sum(self.sizes) + 1, args.dtype,
                            args.rounding))
        self.batches_per_epoch = self.n_train // args.batch
        self.total = self.batches_per_epoch * args.epochs
        self.generation, self.done = self.load_position()
        self.losses, self.aucs = [], []

    def drop_all(self):
        for name in ("emb", "samples", "meta", "predictions"):
            self.conn.execute("DROP TABLE IF EXISTS %s" % name)
        for f in glob.glob(self.db + ".dense-*.pt"):
            os.remove(f)

    # -- position and checkpoints

    def load_position(self):
        if self.memory is not None:
            return 0, 0
        row = self.conn.execute("SELECT vec FROM emb WHERE id = ?", (POS_ROW,)).fetchone()
        if not row:
            return 0, 0
        gen, done = (int(x) for x in np.frombuffer(row[0], np.float32)[:2])
        path = self.dense_file(gen)
        try:
            # A checkpoint is as trusted as the database beside it (torch 1.13's
            # weights_only loader cannot read an optimizer's state).
            state = torch.load(path)
            saved = state["args"]
        except Exception as e:
            sys.exit("train_ctr.py: cannot resume: the dense checkpoint %s of checkpoint %d is missing or damaged "
                     "(%s); --fresh starts over" % (path, gen, e))
        for k, v in self.run_args().items():
            if saved.get(k) != v:
                sys.exit("train_ctr.py: the checkpoint in %s was made with --%s %s, not %s: give the same to resume, "
                         "or --fresh to start over" % (self.db, k.replace("_", "-"), saved.get(k), v))
        try:
            self.dense.load_state_dict(state["dense"])
            self.dense_opt.load_state_dict(state["opt"])
        except Exception as e:
            sys.exit("train_ctr.py: cannot resume: the dense checkpoint %s of checkpoint %d is damaged (%s); "
                     "--fresh starts over" % (path, gen, e))
        print("resuming at batch %d of %d (checkpoint %d)" % (done, self.total, gen))
        return gen, done

    def run_args(self):
        """What a resumed run must share with the checkpoint it resumes."""
        a = self.args
        return {"dim": a.dim, "batch": a.batch, "lr": float(a.lr), "dense_lr": float(a.dense_lr),
                "staleness": str(a.staleness), "seed": a.seed}

    def dense_file(self, gen):
        return "%s.dense-%d.pt" % (self.db, gen)

    def checkpoint(self, done):
        """With every worker paused: the dense state first, then one COMMIT
        that makes the embeddings and the position durable together."""
        if self.memory is not None:
            return
        gen = self.generation + 1
        tmp = self.dense_file(gen) + ".tmp"
        torch.save({"dense": self.dense.state_dict(), "opt": self.dense_opt.state_dict(), "args": self.run_args()},
                   tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.dense_file(gen))
        pos = np.zeros(self.args.dim, np.float32)
        pos[0], pos[1] = gen, done
        self.conn.execute("INSERT OR REPLACE INTO emb(id, vec) VALUES (?, ?)", (POS_ROW, pos.tobytes()))
        for f in glob.glob(self.db + ".dense-*.pt"):
            if f != self.dense_file(gen):
                os.remove(f)
        self.generation = gen

    # -- one step

    def batch_rows(self, b):
        epoch, k = divmod(b, self.batches_per_epoch)
        order = np.random.default_rng(self.args.seed * 1000 + epoch).permutation(self.batches_per_epoch)
        return int(order[k]) * self.args.batch

    def step(self, local, b):
        """One batch on a worker: (conn, embedding module, dense replica)."""
        conn, emb, dense_w = local
        dense, ids, label = read_rows(conn, self.batch_rows(b), self.args.batch)
        with self.dense_lock:  # the dense weights as of now (another worker may step them)
            for p, q in zip(dense_w.parameters(), self.dense.parameters()):
                p.data.copy_(q.data)
        embs = emb(ids) if emb is not None else self.memory(ids)
        logit = dense_w(dense, embs)
        loss = F.binary_cross_entropy_with_logits(logit, label)
        params = list(dense_w.parameters())
        grads = torch.autograd.grad(loss, params + [embs])
        embs.backward(grads[-1])  # pushes the embedding gradients (embkv) or fills .grad (memory)
        with self.dense_lock:
            for p, g in zip(self.dense.parameters(), grads[:-1]):
                p.grad = g
            self.dense_opt.step()
            if self.memory is not None:
                self.memory.opt.step()
                self.memory.opt.zero_grad()
        return float(loss)

    def evaluate(self, conn, emb):
        scores, labels = [], []
        with torch.no_grad():
            for first in range(self.n_train, self.n_train + self.n_test, 2048):
                count = min(2048, self.n_train + self.n_test - first)
                dense, ids, label = read_rows(conn, first, count)
                embs = emb(ids) if emb is not None else self.memory(ids)
                scores.append(torch.sigmoid(self.dense(dense, embs)).numpy())
                labels.append(label.numpy())
        return np.concatenate(scores), np.concatenate(labels).astype(np.int64)

    def sql_auc(self, scores, labels):
        c = self.conn
        c.execute("DROP TABLE IF EXISTS predictions")
        c.execute("CREATE TABLE predictions (id INTEGER PRIMARY KEY, score REAL, label INTEGER)")
        c.execute("BEGIN")
        c.executemany("INSERT INTO predictions VALUES (?, ?, ?)",
                      zip(range(len(scores)), scores.astype(float).tolist(), labels.tolist()))
        c.execute("COMMIT")
        return c.execute(AUC_SQL).fetchone()[0]

    def run(self):
        args = self.args
        start, lock = self.done, threading.Condition()
        state = {"next": start, "completed": set(), "low": start, "pause": False, "error": None}
        bar = None
        if not args.quiet:
            try:
                from tqdm import tqdm
                bar = tqdm(total=self.total, initial=start, unit="batch", dynamic_ncols=True)
            except ImportError:
                bar = None
        stop_at = self.total if args.max_batches is None else min(self.total, start + args.max_batches)

        def take():
            with lock:
                while state["pause"]:
                    lock.wait()
                b = state["next"]
                if b >= stop_at or state["error"]:
                    return None
                if b > start and b % args.checkpoint_every == 0 and b != state.get("ckpt_at"):
                    # Wait for every earlier batch, checkpoint, go on.
                    state["pause"] = True
                    while state["low"] < b and not state["error"]:
                        lock.wait()
                    if not state["error"]:
                        self.checkpoint(b)
                    state["ckpt_at"] = b
                    state["pause"] = False
                    lock.notify_all()
                state["next"] = b + 1
                return b

        def finish(b, loss):
            with lock:
                state["completed"].add(b)
                while state["low"] in state["completed"]:
                    state["completed"].discard(state["low"])
                    state["low"] += 1
                self.losses.append((b, loss))
                lock.notify_all()
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss="%.4f" % loss)

        last_eval = [start]

        def worker(w):
            conn = embkv.connect(self.db) if self.memory is None else None
            emb = ekt.Embedding(conn, "emb") if conn is not None else None
            data = conn or embkv.connect(self.db)
            dense_w = Dense(args.dim)
            try:
                while True:
                    b = take()
                    if b is None:
                        break
                    finish(b, self.step((data, emb, dense_w), b))
                    low = state["low"]
                    if w == 0 and args.eval_every and low - last_eval[0] >= args.eval_every:
                        last_eval[0] = low
                        s, lab = self.evaluate(data, emb)
                        self.aucs.append((low, auc(s, lab)))
            except Exception as e:  # reported by run()
                with lock:
                    state["error"] = e
                    lock.notify_all()
            finally:
                data.close()

        t0 = time.time()
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(args.workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if bar is not None:
            bar.close()
        if state["error"]:
            raise state["error"]
        elapsed = time.time() - t0
        trained = state["low"] - start
        if state["low"] == stop_at and stop_at > start:
            self.checkpoint(stop_at)  # where the next run resumes
        emb = ekt.Embedding(self.conn, "emb") if self.memory is None else None
        scores, labels = self.evaluate(self.conn, emb)
        result = {
            "batches": trained, "examples_per_s": trained * args.batch / elapsed if elapsed > 0 else 0.0,
            "auc": auc(scores, labels), "sql_auc": self.sql_auc(scores, labels),
            "best_auc": float(self.meta["best_auc"]), "workers": args.workers, "staleness": args.staleness,
            "memory_baseline": bool(args.memory), "done": state["low"], "total": self.total,
        }
        self.aucs.append((state["low"], result["auc"]))
        return result

    def plot(self, path):
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is missing (python3-matplotlib): no plot")
            return
        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
        if self.losses:
            xs, ys = zip(*sorted(self.losses))
            k = max(1, len(ys) // 100)
            ys = np.convolve(ys, np.ones(k) / k, mode="valid")
            a.plot(xs[:len(ys)], ys)
        a.set_xlabel("batch")
        a.set_ylabel("training log loss")
        if self.aucs:
            xs, ys = zip(*sorted(self.aucs))
            b.plot(xs, ys, marker="o", label="model")
        b.axhline(float(self.meta["best_auc"]), color="gray", linestyle="--", label="best achievable")
        b.axhline(0.5, color="lightgray", linestyle=":", label="chance")
        b.set_xlabel("batch")
        b.set_ylabel("held-out AUC")
        b.legend()
        fig.tight_layout()
        fig.savefig(path)
        print("curves: %s" % path)


# ------------------------------------------------------------------ distributed

def run_dist(args):
    """--dist: every rank of a torch.distributed job (torchrun) trains its
    slice of each global batch of --batch rows; the embedding table is
    sharded over the ranks (embkv.distributed: the store of each shard in
    <db>.dist/), the dense model replicated, its gradients summed with
    all_reduce (as DDP does).  Checkpoints are embkv.distributed's (the
    dense state and the position in their `extra`)."""
    import datetime
    import torch.distributed as dist
    import embkv.distributed as ekd
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.dist_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        sys.exit("train_ctr.py --dist: --batch %d must be a multiple of the ranks, %d" % (args.batch, world))
    if rank == 0:
        conn = embkv.connect(args.db)
        if args.fresh:
            for name in ("emb", "samples", "meta", "predictions"):
                conn.execute("DROP TABLE IF EXISTS %s" % name)
            import shutil
            shutil.rmtree(args.db + ".dist", ignore_errors=True)
        if not conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'samples'").fetchone():
            generate(conn, args.train_rows, args.test_rows, args.seed, args.vocab_scale)
        conn.close()
    dist.barrier()
    conn = embkv.connect(args.db)
    m = meta(conn)
    n_train, n_test = int(m["n_train"]), int(m["n_test"])
    sizes = json.loads(m["vocab"])
    torch.manual_seed(args.seed)
    dense = Dense(args.dim)
    opt = torch.optim.Adagrad(dense.parameters(), lr=args.dense_lr)
    emb = ekd.ShardedEmbedding(args.db + ".dist", "emb", dim=args.dim, optimizer="adagrad", lr=args.lr,
                               eps=1e-10, init="normal(0,0.05)", seed=args.seed, staleness=args.dist_cache,
                               local_cache=args.dist_cache > 0, capacity=max(1000, (sum(sizes) + 1) // world * 2))
    step, extra = ekd.restore([emb])
    done = 0
    if extra is not None:
        dense.load_state_dict(extra["dense"])
        opt.load_state_dict(extra["opt"])
        done = extra["done"]
        if rank == 0:
            print("resuming at batch %d (checkpoint %d)" % (done, step))
    per_epoch = n_train // args.batch
    total = per_epoch * args.epochs
    stop_at = total if args.max_batches is None else min(total, done + args.max_batches)
    local = args.batch // world
    t0 = time.time()
    steps = 0
    for b in range(done, stop_at):
        epoch, k = divmod(b, per_epoch)
        order = np.random.default_rng(args.seed * 1000 + epoch).permutation(per_epoch)
        first = int(order[k]) * args.batch + rank * local
        dv, ids, label = read_rows(conn, first, local)
        embs = emb(ids)
        # the global batch's mean loss, summed over the ranks
        loss = F.binary_cross_entropy_with_logits(dense(dv, embs), label, reduction="sum") / args.batch
        opt.zero_grad()
        loss.backward()  # the embedding gradients go to their owners here
        for p in dense.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        steps += 1
        if (b + 1) % args.checkpoint_every == 0 or b + 1 == stop_at:
            ekd.checkpoint([emb], b + 1, extra={"dense": dense.state_dict(), "opt": opt.state_dict(),
                                                "done": b + 1})
    elapsed = time.time() - t0
    # held-out AUC: each rank scores a slice, rank 0 gathers
    scores, labels = [], []
    with torch.no_grad():
        for first in range(n_train, n_train + n_test, 2048):
            count = min(2048, n_train + n_test - first)
            part = (count + world - 1) // world
            lo = first + rank * part
            cnt = max(0, min(part, first + count - lo))
            dv, ids, label = read_rows(conn, lo, cnt)
            embs = emb(ids)  # collective: every rank calls it, its slice maybe empty
            scores.append(torch.sigmoid(dense(dv, embs)).numpy())
            labels.append(label.numpy())
    got = [None] * world
    dist.all_gather_object(got, (np.concatenate(scores), np.concatenate(labels).astype(np.int64)))
    st = ekd.stats(emb)
    res = None
    if rank == 0:
        sc = np.concatenate([g[0] for g in got])
        lab = np.concatenate([g[1] for g in got])
        examples = steps * args.batch
        sent = sum(x["bytes_sent"] for x in st)
        res = {"batches": steps, "ranks": world, "examples_per_s": examples / elapsed if elapsed > 0 else 0.0,
               "auc": auc(sc, lab), "best_auc": float(m["best_auc"]),
               "bytes_per_example": sent / examples if examples else 0.0,
               "exchange_ms_per_step": 1000 * max(x["exchange_seconds"] for x in st) / max(1, steps),
               "rows_per_shard": [x["rows"] for x in st], "done": stop_at, "total": total,
               "cache_hits": sum(x["cache_hits"] for x in st)}
        if args.json:
            print(json.dumps(res))
        else:
            print("held-out AUC %.5f; best achievable %.4f; %d ranks, %d batches of %d, %.0f examples/s, "
                  "%.0f bytes sent per example, %.1f ms a step in the exchanges"
                  % (res["auc"], res["best_auc"], world, steps, args.batch, res["examples_per_s"],
                     res["bytes_per_example"], res["exchange_ms_per_step"]))
    conn.close()
    dist.destroy_process_group()
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=os.path.join(os.getcwd(), "ctr-demo.db"))
    ap.add_argument("--fresh", action="store_true", help="drop the data, the table and the checkpoints first")
    ap.add_argument("--train-rows", type=int, default=400000)
    ap.add_argument("--test-rows", type=int, default=20000)
    ap.add_argument("--vocab-scale", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--lr", type=float, default=0.05, help="embedding adagrad rate (in the store)")
    ap.add_argument("--dense-lr", type=float, default=0.02)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--staleness", default="unlimited")
    ap.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16", "i8"],
                    help="the element type the table keeps its rows in")
    ap.add_argument("--rounding", default="nearest", choices=["nearest", "stochastic"],
                    help="how pushes round to a dtype below f32")
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--max-batches", type=int, default=None, help="stop after this many batches (resumable)")
    ap.add_argument("--memory", action="store_true", help="baseline: torch.nn.Embedding in memory, no embkv")
    ap.add_argument("--png", default=None, help="loss/AUC curves (default <db>.png)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--dist", action="store_true",
                    help="one rank of a torch.distributed job (launch with torchrun): the table sharded over "
                         "the ranks (embkv.distributed)")
    ap.add_argument("--dist-timeout", type=int, default=60, help="seconds before a hung rank fails the others")
    ap.add_argument("--dist-cache", type=int, default=0,
                    help="with --dist: keep rows read from other ranks for up to this many steps (HET's cache; "
                         "the table's staleness)")
    args = ap.parse_args(argv)
    if args.staleness != "unlimited" and not args.staleness.isdigit():
        ap.error("--staleness: a number or 'unlimited'")
    if min(args.workers, args.batch, args.checkpoint_every, args.epochs, args.dim) < 1:
        ap.error("--workers, --batch, --checkpoint-every, --epochs and --dim must be positive")
    if args.train_rows < args.batch or args.test_rows < 2:
        ap.error("--train-rows must hold at least one --batch, and --test-rows at least 2")
    if not args.vocab_scale > 0 or args.eval_every < 0 or (args.max_batches is not None and args.max_batches < 0):
        ap.error("--vocab-scale must be positive, --eval-every and --max-batches >= 0")
    if args.dist_cache < 0:
        ap.error("--dist-cache must be >= 0")
    if args.dist:
        if args.memory or args.workers != 1:
            ap.error("--dist takes neither --memory nor --workers")
        return run_dist(args)
    tr = Trainer(args)
    try:
        res = tr.run()
    except BaseException as e:
        # Stop as a crash would: closing would make the embeddings trained
        # since the last checkpoint durable without the position that goes
        # with them; without the close the store reopens at the checkpoint.
        import traceback
        traceback.print_exc()
        print("train_ctr.py: stopped (%s); the run resumes from its last checkpoint" % type(e).__name__,
              file=sys.stderr, flush=True)
        os._exit(130 if isinstance(e, KeyboardInterrupt) else 1)
    if args.json:
        print(json.dumps(res))
    else:
        print("held-out AUC %.5f (SQL %.5f); best achievable %.4f; chance 0.5" % (res["auc"], res["sql_auc"],
                                                                               res["best_auc"]))
        print("%d batches of %d, %.0f examples/s, %d worker(s), staleness %s%s"
              % (res["batches"], args.batch, res["examples_per_s"], args.workers, args.staleness,
                 ", in-memory baseline" if args.memory else ""))
    if not args.quiet or args.png:
        tr.plot(args.png or (args.db + ".png"))
    tr.conn.close()
    return res


if __name__ == "__main__":
    main()
