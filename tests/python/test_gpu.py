"""The GPU functions from SQL and embkv.torch on a machine without a GPU.

- embkv_gpu() says whether the CUDA part is built in (as embkv_build()
  does) and, without a usable GPU, why.
- embkv_get_device / embkv_pull_device / embkv_push_device fail with that
  reason, naming the function and the table, and change nothing: no row
  created, no permit kept (a second connection pulls at staleness 0 at
  once), no gpu section in embkv_stats.
- Bad arguments are named before any device is asked for: a device
  address of 0 or not an INTEGER, a stream that is not one, 'once' and lr
  as embkv_pull and embkv_push check them, a table that does not exist,
  bad ids.
- embkv.torch: device='cuda' on a PyTorch without CUDA is refused at
  construction with the reason, and .cuda()/.to('cuda') likewise; the
  module stays on the CPU and works there.

- Through the driver path, with the stand-in libcuda.so.1 of
  tests/gpu/fakecuda.c (built with the CUDA part; device memory is host
  memory there, so numpy arrays serve as device buffers): embkv_gpu() is
  usable, embkv_pull_device and embkv_get_device write what embkv_pull
  reads (odd dims, repeats, missing ids), embkv_push_device updates as
  embkv_push does, embkv_stats has its gpu section.

The GPU's own tests (gathers equal to the CPU path, pushes from CUDA
gradients, embkv.torch on CUDA against torch's modules) are
tests/gpu/run.sh, on a machine with one.
"""
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import unittest

import numpy as np
import torch

import embkv.torch as ekt
from embkv_test import TempDirTest as Base, connect


class GpuWithoutDevice(Base):
    def setUp(self):
        super().setUp()
        self.conn = connect(self.db)
        self.conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, init='zeros', staleness=0, wait_ms=100, "
                          "optimizer='sgd', lr=0.5)")
        self.gpu = json.loads(self.conn.execute("SELECT embkv_gpu()").fetchone()[0])
        if self.gpu["usable"]:
            self.skipTest("a GPU is usable here: tests/gpu/run.sh tests it")

    def tearDown(self):
        self.conn.close()
        super().tearDown()

    def q(self, sql, *args):
        return self.conn.execute(sql, args).fetchone()[0]

    def test_status(self):
        build = json.loads(self.q("SELECT embkv_build()"))
        self.assertEqual(self.gpu["compiled"], build["cuda"])
        self.assertFalse(self.gpu["usable"])
        self.assertGreater(len(self.gpu["reason"]), 20)
        if not self.gpu["compiled"]:
            self.assertIn("no CUDA part", self.gpu["reason"])

    def test_calls_fail_and_change_nothing(self):
        ids = np.array([1, 2, 1], np.int64).tobytes()
        for sql in ("SELECT embkv_get_device('t', ?, 4096, 0)",
                    "SELECT embkv_pull_device('t', ?, 4096, 0)",
                    "SELECT embkv_pull_device('t', ?, 4096, NULL, 'once')",
                    "SELECT embkv_push_device('t', ?, 4096, 0)"):
            fn = sql.split("(")[0].split()[-1]
            with self.assertRaises(sqlite3.OperationalError) as cm:
                self.q(sql, ids)
            self.assertEqual(str(cm.exception), "%s: table t: no usable GPU: %s" % (fn, self.gpu["reason"]))
        self.assertEqual(self.q("SELECT count(*) FROM t"), 0)
        other = connect(self.db)
        try:
            # no permit was kept: staleness 0 lets another connection pull at once
            blob = other.execute("SELECT embkv_pull('t', ?)", (ids,)).fetchone()[0]
            self.assertEqual(len(blob), 3 * 4 * 4)
        finally:
            other.close()
        self.assertNotIn("gpu", json.loads(self.q("SELECT embkv_stats('t')")))

    def test_bad_arguments(self):
        ids = "[1,2]"
        cases = [
            ("SELECT embkv_get_device('t', ?, 0, 0)", "argument 3 must be a device address as an INTEGER, not 0 "),
            ("SELECT embkv_get_device('t', ?, 'x', 0)", "argument 3 must be a device address as an INTEGER, not TEXT 'x'"),
            ("SELECT embkv_get_device('t', ?, -5, 0)", "argument 3 must be a device address as an INTEGER, not -5"),
            ("SELECT embkv_get_device('t', ?, x'00', 0)", "argument 3 must be a device address as an INTEGER, not a BLOB"),
            ("SELECT embkv_pull_device('t', ?, 4096, 'x')", "argument 4 must be a CUDA stream (0 or NULL: the default "
                                                            "stream) as an INTEGER, not TEXT 'x'"),
            ("SELECT embkv_pull_device('t', ?, 4096, 1.5)", "argument 4 must be a CUDA stream"),
            ("SELECT embkv_pull_device('t', ?, 4096, 0, 'twice')", "argument 5 must be 'once'"),
            ("SELECT embkv_push_device('t', ?, 4096, 0, -1)", "lr (argument 5) must be a positive finite number"),
            ("SELECT embkv_push_device('t', ?, 4096, 0, 'fast')", "lr (argument 5) must be a positive finite number"),
            ("SELECT embkv_pull_device('nope', ?, 4096, 0)", "no such"),
            ("SELECT embkv_get_device('t', x'0102', 4096, 0)", "ids"),
        ]
        for sql, want in cases:
            with self.assertRaises(sqlite3.OperationalError, msg=sql) as cm:
                self.q(sql, *((ids,) if "?" in sql else ()))
            self.assertIn(want, str(cm.exception), sql)
            self.assertNotIn("no usable GPU", str(cm.exception), sql)
        self.assertEqual(self.q("SELECT count(*) FROM t"), 0)

    def test_transaction_and_read_only(self):
        self.conn.execute("INSERT INTO t(id, vec) VALUES (1, '[1,2,3,4]')")
        self.conn.execute("BEGIN")
        self.conn.execute("INSERT INTO t(id, vec) VALUES (2, '[1,2,3,4]')")
        for fn in ("embkv_get_device", "embkv_pull_device", "embkv_push_device"):
            with self.assertRaises(sqlite3.OperationalError) as cm:
                self.q("SELECT %s('t', '[1,2]', 4096, 0)" % fn)
            self.assertEqual(str(cm.exception), "%s: table t: this connection has uncommitted writes to the table; "
                             "COMMIT them first" % fn)
        self.conn.execute("COMMIT")
        self.conn.execute("PRAGMA query_only = 1")
        # a read-only connection's pull reads existing rows only: a missing id
        # is named before any device is asked for
        with self.assertRaises(sqlite3.OperationalError) as cm:
            self.q("SELECT embkv_pull_device('t', '[1,9]', 4096, 0)")
        self.assertIn("embkv_pull_device: table t: id 9 has no row, and this connection creates none", str(cm.exception))
        with self.assertRaises(sqlite3.OperationalError) as cm:
            self.q("SELECT embkv_pull_device('t', '[1,2]', 4096, 0)")
        self.assertIn("no usable GPU", str(cm.exception))
        with self.assertRaises(sqlite3.OperationalError) as cm:
            self.q("SELECT embkv_push_device('t', '[1,2]', 4096, 0)")
        self.assertIn("embkv_push_device: table t:", str(cm.exception))
        self.assertNotIn("no usable GPU", str(cm.exception))
        self.conn.execute("PRAGMA query_only = 0")

    def test_torch_refuses_cuda(self):
        if torch.cuda.is_available():
            self.skipTest("this PyTorch has CUDA")
        with self.assertRaises(RuntimeError) as cm:
            ekt.Embedding(self.conn, "t", dim=4, device="cuda")
        self.assertIn("this PyTorch has no usable CUDA (torch.cuda.is_available() is False)", str(cm.exception))
        # refused before a table is made for it
        for dev in ("cuda", "meta", "cuda:1"):
            with self.assertRaises((RuntimeError, ValueError)):
                ekt.Embedding(self.conn, "fresh", dim=4, device=dev)
        self.assertIsNone(self.conn.execute("SELECT 1 FROM sqlite_schema WHERE name = 'fresh'").fetchone())
        emb = ekt.Embedding(self.conn, "t", dim=4)
        for move in (lambda: emb.cuda(), lambda: emb.to("cuda"), lambda: emb.to(torch.device("cuda", 0))):
            with self.assertRaises(RuntimeError):
                move()
            self.assertEqual(emb.device, torch.device("cpu"))
        with self.assertRaises(ValueError) as cm:
            ekt.Embedding(self.conn, "t", dim=4, device="meta")
        self.assertIn("device must be 'cpu' or 'cuda'", str(cm.exception))
        for move in (lambda: emb.to(torch.float64), lambda: emb.half(), lambda: emb.double(),
                     lambda: emb.to("cpu", torch.bfloat16)):
            with self.assertRaises(TypeError) as cm:
                move()
            self.assertIn("the table's rows are float32", str(cm.exception))
        emb = emb.to(torch.float32).cpu()  # (no device: allowed)
        out = emb(torch.tensor([3, 3]))
        self.assertEqual(out.device.type, "cpu")
        out.sum().backward()
        row = np.frombuffer(self.q("SELECT vec FROM t WHERE id = 3"), np.float32)
        np.testing.assert_array_equal(row, np.full(4, -1.0, np.float32))  # 0 - 0.5 * (1 + 1)


FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "fakecuda")

FAKE_SCRIPT = r"""
import json, sys
import numpy as np
import embkv
db = sys.argv[1]
c = embkv.connect(db)
gpu = json.loads(c.execute("SELECT embkv_gpu()").fetchone()[0])
assert gpu == {"compiled": True, "usable": True}, gpu
for dim in (5, 16):
    for t in ("a%d" % dim, "b%d" % dim):
        c.execute("CREATE VIRTUAL TABLE %s USING embkv(dim=%d, optimizer='adagrad', lr=0.1, init='normal(0,1)', "
                  "seed=3)" % (t, dim))
    rng = np.random.default_rng(dim)
    for step in range(10):
        ids = rng.integers(0, 60, 40).astype(np.int64)
        cpu = embkv.pull(c, "a%d" % dim, ids)
        dev = np.full((len(ids), dim), 7.0, np.float32)
        n = c.execute("SELECT embkv_pull_device(?, ?, ?, 0)", ("b%d" % dim, ids.tobytes(), dev.ctypes.data)).fetchone()[0]
        assert n == len(ids) and np.array_equal(cpu, dev), (dim, step)
        g = rng.standard_normal((len(ids), dim)).astype(np.float32)
        ua = embkv.push(c, "a%d" % dim, ids, g)
        ub = c.execute("SELECT embkv_push_device(?, ?, ?, NULL)", ("b%d" % dim, ids.tobytes(), g.ctypes.data)).fetchone()[0]
        assert ua == ub == len(np.unique(ids)), (ua, ub)
    ra = c.execute("SELECT id, vec, clock FROM a%d ORDER BY id" % dim).fetchall()
    rb = c.execute("SELECT id, vec, clock FROM b%d ORDER BY id" % dim).fetchall()
    assert ra == rb, dim
    ids = np.array([1, 2, 999, 2], np.int64)
    out = np.full((4, dim), 7.0, np.float32)
    found = c.execute("SELECT embkv_get_device(?, ?, ?, 0)", ("b%d" % dim, ids.tobytes(), out.ctypes.data)).fetchone()[0]
    assert found == 3 and not out[2].any() and np.array_equal(out[1], out[3]), found
    st = json.loads(c.execute("SELECT embkv_stats(?)", ("b%d" % dim,)).fetchone()[0])["gpu"]
    assert st["gathers"] == 11 and st["sums"] == 10 and st["pool_registered"] is True, st
print("ok")
"""


@unittest.skipUnless(os.path.exists(os.path.join(FAKE, "libcuda.so.1")),
                     "no stand-in driver (build/fakecuda: built with the CUDA part)")
class GpuStandInDriver(Base):
    def test_functions_through_the_driver_path(self):
        env = dict(os.environ, LD_LIBRARY_PATH=os.path.abspath(FAKE), FAKECUDA_REPORT="1")
        r = subprocess.run([sys.executable, "-c", FAKE_SCRIPT, self.db], env=env, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stdout.strip(), "ok")
        self.assertIn("0 bad calls", r.stderr)


if __name__ == "__main__":
    unittest.main()
