"""embkv.distributed: tables sharded over the ranks of a torch.distributed
job (gloo on 127.0.0.1), each rank a process of dist_worker.py.

- Sharded training equals one process training on all ranks' batches
  (embkv.torch): every clock equal, values within 1e-6 with 1 rank
  and within 1e-4 with more (the ranks' gradients of a row are added in
  rank order, torch adds one process's in bag order: float rounding);
  also with each rank's batch in two forwards a step (update="backward"
  with one backward over both, and update="step").
- SIGKILL of a random rank at a random moment, again and again: the other
  ranks fail within the process group's timeout, naming the dead rank, and
  the job started again resumes from the last checkpoint with every shard
  bit for bit what an uninterrupted run had at that step.
- Resharding 2 -> 3 -> 2 ranks keeps every row, clock and optimizer state,
  each row in exactly one shard, its owner's; a kill during the move, then
  a restart, ends the same way.
- Bad input: ranks that disagree on dim or options, a damaged manifest, a
  bucket map that does not cover every bucket, options against the
  checkpoint's, a table not made by embkv.distributed.
"""
import glob
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import unittest

import numpy as np

import embkv.distributed as ekd
from embkv_test import TempDirTest

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "dist_worker.py")
SCALE = float(os.environ.get("EMBKV_TEST_SCALE", "1") or 1)
# The sanitizer pass (tests/run.sh preloads their runtimes) checks the
# extension's memory under the exchanges (local cache, look-ahead, SSD-tier
# shards); the protocol's tests (equality, kills, resharding, refusals) run
# in the plain pass only.
SANITIZED = bool(os.environ.get("EMBKV_PRELOAD"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(world, cfg, extra_env=None):
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r), WORLD_SIZE=str(world),
                   LOCAL_RANK=str(r), OMP_NUM_THREADS="1")
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, WORKER, json.dumps(cfg)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def wait_up(procs, marks, limit=120):
    """Until every process of procs has its process group (dist_worker
    marks it), or one has exited."""
    t0 = time.time()
    while time.time() - t0 < limit:
        have = set(f.split("-")[1] for f in os.listdir(marks))
        if all(str(p.pid) in have or p.poll() is not None for p in procs):
            return
        time.sleep(0.05)


def finish(procs, timeout=240):
    out = []
    for p in procs:
        try:
            o, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, _ = p.communicate()
            o += "\n[killed by the test: still running after %d s]" % timeout
        out.append((p.returncode, o))
    return out


def run(world, cfg, timeout=240):
    return finish(start(world, cfg), timeout)


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def rows(path):
    c = sqlite3.connect(path)
    try:
        return {i: (cl, bytes(v), bytes(s) if s else b"") for i, cl, v, s in
                c.execute("SELECT id, clock, vec, state FROM embkv_rows")}
    finally:
        c.close()


def union(paths):
    """Rows of several exports, and ids found in more than one."""
    got, dup = {}, []
    for p in paths:
        for i, r in rows(p).items():
            if i in got:
                dup.append(i)
            got[i] = r
    return got, dup


def buckets_ok(model_dir, table, world, dump_glob):
    """Each shard's rows are its own (the manifest's bucket map)."""
    with open(os.path.join(model_dir, ekd.MANIFEST)) as f:
        man = json.load(f)["manifest"]
    t = man["tables"][table]
    bmap = np.asarray(t["bucket_map"])
    bad = 0
    for p in glob.glob(dump_glob):
        r = int(p.rsplit("rank-", 1)[1].split(".")[0])
        ids = np.array(sorted(rows(p)), np.int64)
        if len(ids):
            bad += int((bmap[ekd.bucket_of(ids, man["buckets"])] != r).sum())
    return t["world_size"] == world and bad == 0


class Base(TempDirTest):
    def cfg(self, **kw):
        c = {"mode": "train", "model_dir": os.path.join(self.dir, "m"), "steps": 6, "every": 3,
             "dump": os.path.join(self.dir, "dump"), "marks": os.path.join(self.dir, "marks")}
        c.update(kw)
        os.makedirs(c["dump"], exist_ok=True)
        os.makedirs(c["marks"], exist_ok=True)
        return c

    def ok(self, results):
        for r, (rc, out) in enumerate(results):
            self.assertEqual(rc, 0, "rank %d failed:\n%s" % (r, out[-3000:]))
        return [o for _, o in results]

    def dumps(self, step, world):
        return sorted(glob.glob(os.path.join(self.dir, "dump", "step-%d.w%d.rank-*.export" % (step, world))))


@unittest.skipIf(SANITIZED, "the protocol's arithmetic, in the plain pass")
class TestEquality(Base):
    def compare(self, world, optimizer, split=None):
        cfg = self.cfg(optimizer=optimizer, model_dir=os.path.join(self.dir, "m%d%s" % (world, split or "")))
        if split:
            cfg["split"] = split
            cfg["dump"] = os.path.join(self.dir, "dump-" + split)
            os.makedirs(cfg["dump"], exist_ok=True)
        self.ok(run(world, cfg))
        ref_cfg = dict(cfg, mode="reference", model_dir=self.dir, dump=os.path.join(self.dir, "dump"))
        if not os.path.exists(os.path.join(self.dir, "dump", "step-6.ref.export")):
            r = subprocess.run([sys.executable, WORKER, json.dumps(ref_cfg)], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
        for step in (3, 6):
            ref = rows(os.path.join(self.dir, "dump", "step-%d.ref.export" % step))
            got, dup = union(sorted(glob.glob(os.path.join(cfg["dump"], "step-%d.w%d.rank-*.export" % (step, world)))))
            self.assertEqual(dup, [])
            self.assertEqual(sorted(got), sorted(ref))
            self.assertGreater(len(ref), 200)
            self.assertEqual([got[i][0] for i in sorted(ref)], [ref[i][0] for i in sorted(ref)])  # clocks
            worst = 0.0
            exact = 0
            for i in ref:
                a = np.frombuffer(ref[i][1] + ref[i][2], np.float32)
                b = np.frombuffer(got[i][1] + got[i][2], np.float32)
                worst = max(worst, float(np.abs(a - b).max()))
                exact += ref[i][1:] == got[i][1:]
            # One rank sums a row's gradients as torch does (float32, per
            # forward); embkv.torch hands them to the store's push, which
            # sums them in double: the same to float32 rounding.
            self.assertLessEqual(worst, 1e-6 if world == 1 else 1e-4, "%d ranks, %s, step %d" % (world, optimizer, step))
            self.assertGreater(exact, len(ref) // 2 if world == 1 else -1)
        self.assertTrue(buckets_ok(cfg["model_dir"], "user", world, os.path.join(self.dir, "dump",
                                                                               "step-6.w%d.rank-*.export" % world)))
        if world == 2 and not split:
            # sql/shards.sql over the shards, read-only
            from embkv_test import EXT
            with open(os.path.join(os.path.dirname(os.path.dirname(HERE)), "sql", "shards.sql")) as f:
                script = f.read()
            r = subprocess.run(["sqlite3", "-readonly", "-cmd", ".load " + EXT, "-cmd", ".mode list", "rank-00000.db"],
                               input=script.replace(".mode column", ".mode list"), capture_output=True, text=True,
                               cwd=cfg["model_dir"])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stderr, "")
            lines = r.stdout.splitlines()
            n = len(union(self.dumps(6, 2))[0])
            self.assertIn("rows|ids", lines)
            self.assertEqual(lines[lines.index("rows|ids") + 1], "%d|%d" % (n, n))
            per = [x.split("|") for x in lines[1:3]]
            self.assertEqual([p[0] for p in per], ["0", "1"])
            self.assertEqual(sum(int(p[1]) for p in per), n)

    def test_sgd(self):
        for world in (1, 2, 3):
            self.compare(world, "sgd")

    def test_adagrad(self):
        for world in (2, 3):
            self.compare(world, "adagrad")

    def test_two_forwards_a_step(self):
        # Each rank's bags in two forwards of the table per step (ids new
        # in the second move the owner's rows of the first): one backward
        # over both, or one each and step(); the reference takes all the
        # bags in one forward.
        for split in ("backward", "step"):
            self.compare(2, "adagrad", split)


class TestLocalCache(Base):
    def case(self, local_cache, staleness=2, steps=5, uneven=False):
        res = self.ok(run(2, self.cfg(mode="cache", local_cache=local_cache, staleness=staleness, steps=steps,
                                      uneven=uneven, model_dir=os.path.join(self.dir, "m%d%d" % (local_cache,
                                                                                             uneven)))))
        out = [json.loads(next(line for line in o.splitlines() if line.startswith("cache "))[6:]) for o in res]
        return sorted(out, key=lambda x: x["rank"])

    def test_stale_for_at_most_staleness_steps(self):
        fresh = [[-2.0 * k] * 2 for k in range(5)]
        for r in self.case(False):
            self.assertEqual(r["seen"], fresh)     # every step asks the owners
            self.assertEqual(r["hits"], 0)
        cached = self.case(True)
        for r in cached:
            # the own row fresh; the other's read at steps 0, 2, 4 and
            # served from the cache in between (2 steps at most)
            other = 1 - r["rank"]
            want = [[None, None] for _ in range(5)]
            for k in range(5):
                want[k][r["rank"]] = -2.0 * k
                want[k][other] = -2.0 * (k - k % 2)
            self.assertEqual(r["seen"], want)
            # (and the read after the last step: the other's row from step 4)
            self.assertEqual(r["hits"], 3)
            self.assertEqual(r["end"][other], -8.0)
            # every gradient reached the owner, those of cached rows too
            self.assertEqual(r["end"][r["rank"]], -10.0)
        plain = self.case(False)
        for a, b in zip(cached, plain):
            self.assertLess(a["bytes"], b["bytes"])

    def test_uneven(self):
        """Ranks with different numbers of cached rows: every gradient
        reaches its owner (a gradient of 1 per read: the rows do not
        depend on what was read)."""
        a = self.case(True, staleness=3, steps=7, uneven=True)
        b = self.case(False, staleness=3, steps=7, uneven=True)
        self.assertEqual([r["end"] for r in a], [r["end"] for r in b])
        self.assertGreater(sum(r["hits"] for r in a), 6)

    def test_needs_staleness(self):
        res = run(2, self.cfg(mode="cache", local_cache=True, staleness=0, steps=1))
        for rc, out in res:
            self.assertNotEqual(rc, 0)
            self.assertIn("local_cache serves a remote row for at most `staleness` steps", out)


class TestMisc(Base):
    def test_padding_step_lookahead(self):
        res = self.ok(run(2, self.cfg(mode="misc")))
        out = sorted((json.loads(next(line for line in o.splitlines() if line.startswith("misc "))[5:])
                      for o in res), key=lambda x: x["rank"])
        for r in out:
            self.assertEqual(r["out"], [[0.0] * 4] * 3)   # zeros; the padding id adds nothing
            # each rank's bags gave ids 1 and 2 a gradient of 1: summed, 2
            self.assertEqual(r["again"], [[-2.0] * 4, [-2.0] * 4, [0.0] * 4])
        # before step(): rows created (clock 0) at their owners; after: one
        # update each; the padding id stored nowhere
        before = ",".join(x for x in (r["before"] for r in out) if x)
        after = ",".join(x for x in (r["after"] for r in out) if x)
        self.assertEqual(sorted(before.split(",")), ["1:0", "2:0"])
        self.assertEqual(sorted(after.split(",")), ["1:1", "2:1"])
        # rows in both shards' logs, and look-ahead queued reads of them
        self.assertEqual(sum(out[0]["rows"]), 120000)
        self.assertTrue(all(x > 0 for x in out[0]["ssd_rows"]))
        self.assertEqual(sum(r["queued"] for r in out), sum(out[0]["la_queued"]))
        self.assertGreater(sum(r["queued"] for r in out), 0)


@unittest.skipIf(SANITIZED, "kills and restarts test the protocol, in the plain pass")
class TestKill(Base):
    def test_kill_random_rank(self):
        """A clean 2-rank run dumps every checkpoint; then a job that is
        killed again and again (a random rank, a random moment) and started
        again each time must restore exactly those states."""
        world, steps, every = 2, 600, 10
        clean = self.cfg(steps=steps, every=every, model_dir=os.path.join(self.dir, "clean"),
                         dump=os.path.join(self.dir, "clean-dump"))
        self.ok(run(world, clean))
        ref = {s: union(sorted(glob.glob(os.path.join(clean["dump"], "step-%d.w2.rank-*.export" % s))))[0]
               for s in range(every, steps + 1, every)}
        cfg = self.cfg(steps=steps, every=every, dump_restore=True, timeout=10)
        rng = random.Random(5)
        rounds = max(12, int(12 * SCALE))
        kills = restored = 0
        failed_fast = []
        for rnd in range(rounds):
            procs = start(world, cfg)
            victim = rng.randrange(world)
            wait_up(procs, cfg["marks"])
            # (a loaded machine may not reach a checkpoint in 0.6 s: after
            # four rounds that restored none, longer, so that some do)
            time.sleep(rng.uniform(0.0, 0.6) if restored or rnd < 4 else rng.uniform(1.0, 3.0))
            if procs[victim].poll() is None:
                procs[victim].send_signal(signal.SIGKILL)
                kills += 1
                t0 = time.time()
                res = finish(procs, timeout=60)
                took = time.time() - t0
                others = [res[r] for r in range(world) if r != victim]
                for rc, out in others:
                    if rc != 0:
                        self.assertIn("embkv.distributed", out)
                        self.assertIn("restart the job", out)
                        if "rank %d (pid" % victim in out:
                            failed_fast.append(took)
                self.assertLess(took, 40, "the other ranks must fail within the timeout")
            else:
                res = finish(procs)
            # every restore (this round's start) equals the clean run at its step
            for r, (rc, out) in enumerate(res):
                for line in out.splitlines():
                    if line.startswith("restored "):
                        s = int(line.split()[1])
                        if s:
                            got = rows(os.path.join(self.dir, "dump", "step-%d.w%d.rank-%d.export" % (s, world, r)))
                            ids = np.array(sorted(ref[s]), np.int64)
                            mine = ids[ekd.bucket_of(ids) % world == r]
                            self.assertEqual(got, {int(i): ref[s][int(i)] for i in mine},
                                             "round %d: rank %d's restore of step %d" % (rnd, r, s))
                            restored += 1
            if all(rc == 0 for rc, _ in res):
                break
        # a rank that hangs (SIGSTOP): the others fail after the process
        # group's timeout (10 s here), saying no rank here is gone
        procs = start(world, dict(cfg, steps=10 ** 6, dump_restore=False, dump=None,
                                  model_dir=os.path.join(self.dir, "hung")))
        wait_up(procs, cfg["marks"])
        time.sleep(0.3)
        if procs[1].poll() is None:
            procs[1].send_signal(signal.SIGSTOP)
            t0 = time.time()
            try:
                o, _ = procs[0].communicate(timeout=60)
            finally:
                procs[1].send_signal(signal.SIGKILL)
                procs[1].communicate()
            took = time.time() - t0
            self.assertNotEqual(procs[0].returncode, 0)
            self.assertIn("no rank on this machine is gone", o)
            self.assertLess(took, 40)
            print("a hung rank: the other failed after %.1f s (timeout 10 s)" % took, file=sys.stderr)
        # and to the end
        self.ok(run(world, cfg))
        got, dup = union(self.dumps(steps, world))
        self.assertEqual(got, ref[steps])
        self.assertGreaterEqual(kills, 9)
        self.assertGreater(restored, 0)
        self.assertTrue(failed_fast, "some failure names the dead rank")
        print("kill test: %d kills, %d restores checked, %d failures named the dead rank (within %.1f s)"
              % (kills, restored, len(failed_fast), max(failed_fast)), file=sys.stderr)


@unittest.skipIf(SANITIZED, "kills and restarts test the protocol, in the plain pass")
class TestReshard(Base):
    def test_2_3_2(self):
        cfg = self.cfg(steps=4, every=2, dump_restore=True, second_table=True)
        self.ok(run(2, cfg))
        at4, _ = union(self.dumps(4, 2))
        # 2 -> 3 cut by a kill, then the job started again with 2 ranks:
        # whatever the cut move copied is removed, each row in one shard
        rng = random.Random(3)
        cut = 0
        for delay in (0.02, 0.06, 0.1, 0.15, 0.2, 0.3):
            procs = start(3, dict(cfg, steps=4))
            wait_up(procs, cfg["marks"])
            time.sleep(delay)
            procs[2].send_signal(signal.SIGKILL)
            finish(procs, timeout=60)
            with open(os.path.join(cfg["model_dir"], ekd.MANIFEST)) as f:
                cut += "moving_to" in json.load(f)["manifest"]["tables"]["user"]
            self.ok(run(2, dict(cfg, steps=4)))
            got, dup = union(self.dumps(4, 2))
            self.assertEqual(dup, [])
            self.assertEqual(got, at4)
            self.assertTrue(buckets_ok(cfg["model_dir"], "user", 2,
                                       os.path.join(self.dir, "dump", "step-4.w2.rank-*")))
            self.assertEqual([f for f in os.listdir(cfg["model_dir"]) if f.startswith("move-")], [])
        self.assertGreater(cut, 0, "no kill landed inside a move")
        # 2 -> 3, killed during the move a few times, then done
        for _ in range(3):
            procs = start(3, dict(cfg, steps=4))
            wait_up(procs, cfg["marks"])
            time.sleep(rng.uniform(0.0, 1.5))
            procs[rng.randrange(3)].send_signal(signal.SIGKILL)
            res = finish(procs, timeout=60)
            for rc, out in res:
                self.assertTrue(rc <= 0 or "EkdError" in out, out[-2000:])
        self.ok(run(3, dict(cfg, steps=4)))
        got, dup = union(self.dumps(4, 3))
        self.assertEqual(dup, [])
        self.assertEqual(got, at4)
        self.assertTrue(buckets_ok(cfg["model_dir"], "user", 3, os.path.join(self.dir, "dump", "step-4.w3.rank-*")))
        # train on with 3 ranks, then back to 2
        self.ok(run(3, dict(cfg, steps=8)))
        at8, dup = union(self.dumps(8, 3))
        self.assertEqual(dup, [])
        self.ok(run(2, dict(cfg, steps=8)))
        got, dup = union(self.dumps(8, 2))
        self.assertEqual(dup, [])
        self.assertEqual(got, at8)
        self.assertTrue(buckets_ok(cfg["model_dir"], "user", 2, os.path.join(self.dir, "dump", "step-8.w2.rank-*")))
        # the third shard's table is gone, its rows moved
        c = sqlite3.connect(os.path.join(cfg["model_dir"], "rank-00002.db"))
        self.assertEqual(c.execute("SELECT count(*) FROM sqlite_schema WHERE type='table' AND name IN "
                                   "('user','item')").fetchone()[0], 0)
        c.close()


@unittest.skipIf(SANITIZED, "the protocol's refusals, in the plain pass")
class TestBadInput(Base):
    def failing(self, world, cfg, want):
        res = run(world, cfg, timeout=120)
        for r, (rc, out) in enumerate(res):
            self.assertNotEqual(rc, 0, "rank %d should fail" % r)
            self.assertIn(want, out, "rank %d" % r)

    def test_disagree(self):
        self.failing(2, self.cfg(mode="bad-dim"), "table 'user': ranks disagree on dim: rank 0 has 8, rank 1 9")
        self.failing(2, self.cfg(mode="bad-option"),
                     "table 'user': ranks disagree on options: lr: 0.05 against 0.5 (rank 0 against rank 1)")
        self.failing(2, self.cfg(mode="bad-mode"), "table 'user': ranks disagree on mode: rank 0 has 'sum', "
                                                   "rank 1 'mean'")
        # a model_dir that is a file on one rank only (storage of its own):
        # every rank refuses, at once
        self.failing(2, self.cfg(mode="file-model-dir", timeout=60),
                     "table 'user': rank 1: model_dir %s is not a directory: name a directory (made if missing)"
                     % os.path.join(self.dir, "marks", "afile"))
        self.failing(2, self.cfg(mode="buckets-given"), "table 'user': ranks disagree on buckets: rank 0 leaves it "
                                                        "out (the checkpoint's, or 4096 for a new table), rank 1 "
                                                        "gives 4096: give it on every rank or on none")
        # (one rank's bad argument: every rank refuses at once, none waits)
        self.failing(2, self.cfg(mode="buckets-float", timeout=60), "table 'user': rank 1: buckets must be an "
                                                                     "integer, not 64.0")
        self.failing(2, self.cfg(mode="bad-buckets"), "table 'user': buckets must be from the number of ranks (2) "
                                                      "to 1048576, not 1")

    def test_arguments(self):
        """Refused before any collective, naming the argument."""
        path = os.path.join(self.dir, "afile")
        write(path, b"x")
        for md, want in (("", "table 'u': model_dir must name a directory (made if missing), not ''"),
                         (None, "table 'u': model_dir must name a directory (made if missing), not None"),
                         (path, "table 'u': model_dir %s is not a directory: name a directory (made if missing)"
                          % path)):
            with self.assertRaises(ValueError) as cm:
                ekd.ShardedEmbedding(md, "u", dim=2)
            self.assertIn(want, str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            ekd.ShardedEmbedding(self.dir, "u", dim=2, local_cache=True, staleness="unlimited")
        self.assertIn("give staleness=N with N >= 1 (not 'unlimited')", str(cm.exception))
        with self.assertRaises(TypeError) as cm:
            ekd.ShardedEmbedding(self.dir, "u", dim=2, buckets=64.0)
        self.assertIn("table 'u': buckets must be an integer, not 64.0", str(cm.exception))
        with self.assertRaises(ValueError) as cm:
            ekd.ShardedEmbedding(self.dir, "u", dim=2, local_cache=True)
        self.assertIn("give staleness=N with N >= 1 (it is not given)", str(cm.exception))

    def test_out_of_step(self):
        """A rank that skips a backward, one that caught an error and went
        on, stats on one rank and a forward on the other: both fail at once
        (the process group's timeout is a minute), naming the operations."""
        cases = [("skip-backward", "rank 0 is at the gradient exchange of table 'user' (operation 2 of the table "
                                   "there), rank 1 at the forward of table 'user' (operation 2)"),
                 ("caught-error", "rank 0 is at the forward of table 'user' (operation 1 of the table there), rank 1 "
                                  "at the forward of table 'user' (operation 2)"),
                 ("stats-vs-forward", "rank 0 is at the forward of table 'user' (operation 1 of the table there), "
                                      "rank 1 at embkv.distributed.stats of table 'user' (operation 1)")]
        for mode, want in cases:
            t0 = time.monotonic()
            res = run(2, self.cfg(mode=mode, timeout=60, model_dir=os.path.join(self.dir, mode)), timeout=120)
            for rc, out in res:
                self.assertNotEqual(rc, 0, mode)
                self.assertIn("embkv.distributed: ranks out of step", out, mode)
                self.assertNotIn("Timed out", out, mode)
            self.assertIn(want, res[0][1], mode)
            self.assertLess(time.monotonic() - t0, 60, mode)

    def test_failed_update(self):
        """An update that fails on one rank only (a NaN gradient from
        another rank): that rank's table refuses its next forward, and the
        checkpoint fails on every rank, naming the update."""
        res = run(2, self.cfg(mode="failed-update"), timeout=120)
        out0, out1 = res[0][1], res[1][1]
        self.assertIn("update failed:", out0)
        self.assertIn("update ok", out1)
        want = "the update of table 'f' failed on rank 0 at its step 1 ("
        for out in (out0, out1):
            self.assertIn("checkpoint failed: embkv.distributed.checkpoint: step 1: " + want, out)
            self.assertIn("gradient element 0 is NaN): that shard missed the update, so no checkpoint of the job can "
                          "be taken; restart the job (it resumes from the last checkpoint)", out)
        self.assertIn("forward failed: embkv.distributed: the forward of table 'f': " + want, out0)
        self.assertIn("this rank's shard missed that update, so the ranks are no longer at one step: restart the "
                      "job (it resumes from the last checkpoint)", out0)

    def test_gradients_that_sum_past_float32(self):
        """Finite gradients from two ranks that sum past float32's range:
        summed in double, the owner's update fails naming the id and the
        sum (not a gradient that was never infinite)."""
        res = run(2, self.cfg(mode="failed-update", overflow=True), timeout=120)
        out0 = res[0][1]
        self.assertIn("update failed: embkv.distributed: table 'f': id ", out0)
        self.assertIn(": the gradients the ranks sent for it sum to 6e+38 in element 0, past float32's range (each "
                      "was finite): clip the gradients or lower the loss's scale", out0)
        self.assertNotIn("infinite", out0)
        # an infinity a rank sent is named as such
        res = run(2, self.cfg(mode="failed-update", inf=True, model_dir=os.path.join(self.dir, "inf")), timeout=120)
        self.assertIn("update failed: embkv_push: table f: id ", res[0][1])
        self.assertIn(": gradient element 0 is infinite", res[0][1])

    def test_a_rank_dead_before_the_first_exchange(self):
        """A rank killed before the construction's first exchange: the
        other fails at once, saying that no rank was known yet (not that
        none on this machine is gone)."""
        res = run(2, self.cfg(mode="die-first", timeout=60), timeout=120)
        self.assertEqual(res[1][0], -9)
        self.assertNotEqual(res[0][0], 0)
        self.assertIn("embkv.distributed: the construction of a sharded table failed on rank 0 of 2: a rank died or "
                      "hangs before the ranks had told each other their processes, or the process group's timeout "
                      "passed (", res[0][1])

    def test_checkpoint_step_disagrees(self):
        """A step that differs between ranks (or is a float on one) is
        refused on every rank before anything is written; the same step
        then checkpoints and restores."""
        res = run(2, self.cfg(mode="checkpoint-step"), timeout=120)
        outs = self.ok(res)
        for out in outs:
            self.assertIn("checkpoint failed: EkdError: embkv.distributed.checkpoint: ranks disagree on the step: "
                          "rank 0 has 2, rank 1 3; nothing was written: call it on every rank with the same step "
                          "(the job's, counted alike on every rank)", out)
            self.assertIn("checkpoint failed: TypeError: embkv.distributed.checkpoint: rank 1: step must be an "
                          "integer, not float 2.0; nothing was written", out)
            self.assertNotIn("checkpoint ok", out)
            self.assertIn("restored 2", out)
            self.assertIn("extra failed: EkdError: embkv.distributed.checkpoint: step 2: rank 0 could not write "
                          "extra to %s (torch.save of it failed, or the file): "
                          % os.path.join(self.dir, "m", "extra-2.pt"), out)
        files = [l for l in outs[0].splitlines() if l.startswith("files ")][0]
        self.assertNotIn("redo-2", files)
        self.assertNotIn("redo-3", files)

    def test_every_table(self):
        res = run(2, self.cfg(mode="subset"), timeout=120)
        for rc, out in res:
            self.assertNotEqual(rc, 0)
            self.assertIn("embkv.distributed.checkpoint: table 'item' of %s is not among the modules"
                          % os.path.join(self.dir, "m"), out)

    def test_manifest(self):
        cfg = self.cfg(steps=3, every=3)
        self.ok(run(2, cfg))
        path = os.path.join(cfg["model_dir"], "manifest.json")
        with open(path, "rb") as f:
            good = f.read()
        # no manifest beside shards that hold rows: refused (a fresh
        # model_dir restores (None, None): every first run here)
        os.rename(path, path + ".away")
        self.failing(2, dict(cfg, steps=0), "the shards of 'user' hold rows of a checkpoint, but %s is missing" % path)
        os.rename(path + ".away", path)
        # damaged
        bad = good.replace(b'"step": 3', b'"step": 4')
        self.assertNotEqual(bad, good)
        write(path, bad)
        self.failing(2, cfg, "manifest %s is damaged: its checksum does not match" % path)
        write(path, b"{not json")
        self.failing(2, cfg, "manifest %s is damaged" % path)
        # a bucket map that does not cover every bucket (checksum right)
        m = json.loads(good)["manifest"]
        m["tables"]["user"]["bucket_map"] = m["tables"]["user"]["bucket_map"][:-1]
        write(path, ekd._manifest_bytes(m))
        self.failing(2, cfg, "the bucket map of table 'user' does not give each of its 4096 buckets")
        m = json.loads(good)["manifest"]
        m["tables"]["user"]["bucket_map"][5] = 7
        write(path, ekd._manifest_bytes(m))
        self.failing(2, cfg, "does not give each of its 4096 buckets to one of its 2 ranks")
        write(path, good)
        # options against the checkpoint's, naming them; the same value
        # as text is the same; sizes may change at a restart
        self.failing(2, dict(cfg, lr=0.5), "table 'user': options differ from the checkpoint in %s: lr: 0.05 against "
                                          "0.5" % path)
        self.ok(run(2, dict(cfg, lr="0.05", cache_size="8M")))
        # a redo file of another rank's (swapped by hand)
        redo = os.path.join(cfg["model_dir"], "redo-3")
        a, b = (os.path.join(redo, "user.rank-%05d.export" % r) for r in (0, 1))
        os.rename(a, a + ".x")
        os.rename(b, a)
        os.rename(a + ".x", b)
        self.failing(2, cfg, "holds rows of rank 1's buckets, not only of rank 0's: it is another shard's")
        # a shard database of another job (the same options)
        other_job = self.cfg(steps=3, every=3, model_dir=os.path.join(self.dir, "job2"))
        self.ok(run(2, other_job))
        os.replace(os.path.join(other_job["model_dir"], "rank-00001.db"), os.path.join(cfg["model_dir"], "rank-00001.db"))
        self.failing(2, cfg, "rank-00001.db belongs to another job")
        # a table of that name not made by embkv.distributed
        other = self.cfg(model_dir=os.path.join(self.dir, "other"))
        os.makedirs(other["model_dir"])
        c = sqlite3.connect(os.path.join(other["model_dir"], "rank-00000.db"))
        c.enable_load_extension(True)
        from embkv_test import EXT
        c.load_extension(EXT)
        c.execute("CREATE VIRTUAL TABLE user USING embkv(dim=8, optimizer=adagrad, lr=0.05)")
        c.close()
        self.failing(2, other, "was not made by embkv.distributed")

    def test_torchrun(self):
        """The documented launch line works (Debian's torch 1.13 needs
        -r 1 -t 1 --log_dir)."""
        cfg = self.cfg(steps=3, every=3)
        logs = os.path.join(self.dir, "logs")
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                            "--master_port=%d" % free_port(), "-r", "1", "-t", "1", "--log_dir", logs,
                            WORKER, json.dumps(cfg)], capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        self.assertEqual(len(self.dumps(3, 2)), 2)


if __name__ == "__main__":
    unittest.main()
