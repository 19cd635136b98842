"""Reduced-precision tables (dtype) from Python.

- Every dtype's rows come back bit for bit through an export and an
  import into a table of the same dtype, and through a backup; the vec
  column, embkv.pull and the export's vec agree; an import into an f32
  table keeps the decoded values exactly.
- i8 keeps a row's least and largest elements exactly and the others
  within half a step of its range / 255.

Run by tests/run.sh through tests/python_run.sh, or by hand:
    EMBKV_EXT=build/embkv /usr/bin/python3 tests/python/test_dtype.py -v
"""
import os
import sqlite3
import unittest

import numpy as np

import embkv
from embkv_test import TempDirTest, connect

DIM = 13  # odd: f16 and bf16 rows are padded


def rows_of(conn, table):
    got = conn.execute("SELECT id, vec FROM %s ORDER BY id" % table).fetchall()
    return np.array([r[0] for r in got]), np.stack([np.frombuffer(r[1], np.float32) for r in got])


class TestRoundTrips(TempDirTest):
    def test_export_import_backup_keep_rows(self):
        rng = np.random.default_rng(5)
        c = connect(self.db)
        for dt in ("f32", "f16", "bf16", "i8"):
            c.execute("CREATE VIRTUAL TABLE t_%s USING embkv(dim=%d, dtype='%s', init='zeros')" % (dt, DIM, dt))
            ids = np.arange(1, 501)
            vals = (rng.standard_normal((500, DIM)) * rng.uniform(0.01, 100, (500, 1))).astype(np.float32)
            c.execute("BEGIN")
            c.executemany("INSERT INTO t_%s(id, vec) VALUES (?, ?)" % dt,
                          [(int(i), v.tobytes()) for i, v in zip(ids, vals)])
            c.execute("COMMIT")
            got_ids, got = rows_of(c, "t_" + dt)
            self.assertTrue(np.array_equal(got_ids, ids))
            pulled = embkv.pull(c, "t_" + dt, ids)
            self.assertTrue(np.array_equal(pulled, got))
            if dt == "f32":
                self.assertTrue(np.array_equal(got, vals))
            elif dt == "i8":
                lo, hi = vals.min(1, keepdims=True), vals.max(1, keepdims=True)
                self.assertTrue(np.array_equal(got.min(1), vals.min(1)))
                self.assertTrue(np.all(np.abs(got - vals) <= (hi - lo) / 255 * 0.5 * (1 + 1e-5) + 1e-30))
            else:
                ftype = np.float16 if dt == "f16" else None
                if ftype is not None:
                    self.assertTrue(np.array_equal(got, vals.astype(np.float16).astype(np.float32)))
                else:  # bf16: the top half of each float32, rounded to nearest even
                    u = vals.view(np.uint32).astype(np.uint64)
                    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)
                    self.assertTrue(np.array_equal(got, r))
            path = os.path.join(self.dir, "%s.export" % dt)
            self.assertEqual(c.execute("SELECT embkv_export('t_%s', ?)" % dt, (path,)).fetchone()[0], 500)
            ex = sqlite3.connect(path)
            self.assertEqual(ex.execute("SELECT value FROM embkv_meta WHERE key = 'dtype'").fetchone()[0], dt)
            ex_rows = np.stack([np.frombuffer(v, np.float32) for (v,) in
                                ex.execute("SELECT vec FROM embkv_rows ORDER BY id")])
            ex.close()
            self.assertTrue(np.array_equal(ex_rows, got))
            # into the same dtype, and into f32: the same values
            for into in {dt, "f32"}:
                name = "back_%s_%s" % (dt, into)
                c.execute("CREATE VIRTUAL TABLE %s USING embkv(dim=%d, dtype='%s')" % (name, DIM, into))
                self.assertEqual(c.execute("SELECT embkv_import('%s', ?)" % name, (path,)).fetchone()[0], 500)
                self.assertTrue(np.array_equal(rows_of(c, name)[1], got), (dt, into))
            bdir = os.path.join(self.dir, "%s.bak" % dt)
            c.execute("SELECT embkv_backup('t_%s', ?)" % dt, (bdir,)).fetchone()
            c.execute("CREATE VIRTUAL TABLE b_%s USING embkv(dim=%d, path='%s')" % (dt, DIM, bdir))
            self.assertTrue(np.array_equal(rows_of(c, "b_" + dt)[1], got))
        c.close()


if __name__ == "__main__":
    unittest.main()
