"""embkv.pull and embkv.push through the extension's entry points for
language bindings (embkv_direct_pull, embkv_direct_push, called with
ctypes): the rows go straight into the array pull returns, the gradients
are read where they lie.

- The direct path is the one taken (pull returns a new, writable array;
  the SQL path's is a read-only view of a BLOB), and it gives what the SQL
  functions give: the same rows, permits and updates (a twin table trained
  through SQL ends bit-identical), repeated ids, 'once'.
- Its errors are the SQL functions' own, with the same exception classes
  and codes: a NaN gradient, a bad lr, a missing row without initializer,
  uncommitted writes, a permit that times out (SQLITE_BUSY), a read-only
  connection; a closed connection and a use from another thread raise
  sqlite3.ProgrammingError as conn.execute does.
- What SQL cannot do: embkv_pull's fourth argument (the output array) is a
  pointer only C binds, so SQL passing anything there gets an error, and
  embkv_connection() cannot be called from a view.  The entry points refuse
  a handle that names no open connection (EK_DIRECT_UNKNOWN, -1: the
  package falls back to SQL) and an output array of the wrong size.
- Handles are never reused; a close in another thread while calls wait
  for the connection makes them return -1, never use it freed; counts
  past one SQL value are SQLITE_TOOBIG; a NaN lr, or one that is not a
  number, is refused on both paths; names holding a NUL name nothing; a
  store another process writes is waited for once.

Standard library unittest plus numpy.  Run by tests/run.sh through
tests/python_run.sh.
"""
import ctypes
import os
import sqlite3
import subprocess
import sys
import threading
import time
import unittest

import numpy as np

import embkv

from embkv_test import EXT, TempDirTest, connect


# (holds the store open to write until the file argv[3] exists)
HOLD = """
import os, sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.enable_load_extension(True); c.load_extension(sys.argv[2])
c.execute("SELECT count(*) FROM a").fetchone()
print("holding", flush=True)
while not os.path.exists(sys.argv[3]):
    time.sleep(0.02)
"""


def sql_pull(conn, table, ids, dim, once=False):
    b = np.asarray(ids, dtype=np.int64).tobytes()
    q = "SELECT embkv_pull(?, ?, 'once')" if once else "SELECT embkv_pull(?, ?)"
    (blob,) = conn.execute(q, (table, b)).fetchone()
    return np.frombuffer(blob, dtype=np.float32).reshape(len(ids), dim)


def sql_push(conn, table, ids, grads):
    b = np.asarray(ids, dtype=np.int64).tobytes()
    g = np.ascontiguousarray(grads, dtype=np.float32).tobytes()
    return conn.execute("SELECT embkv_push(?, ?, ?)", (table, b, g)).fetchone()[0]


def give_back(conn, table, ids):
    """The permits the connection held on ids (returned now)."""
    return embkv.release(conn, table, ids)


class DirectPath(TempDirTest):
    def setUp(self):
        super().setUp()
        self.conn = connect(self.db)
        for t in ("a", "b"):
            self.conn.execute("CREATE VIRTUAL TABLE %s USING embkv(dim=3, optimizer='adagrad', lr=0.1, "
                              "init='normal(0,0.5)', seed=7, staleness=0, wait_ms=200)" % t)

    def tearDown(self):
        self.conn.close()
        super().tearDown()

    def test_pull_is_direct_and_equals_sql(self):
        ids = np.array([5, 9, 5, 2], np.int64)
        got = embkv.pull(self.conn, "a", ids, 3)
        self.assertTrue(got.flags.writeable)  # the direct path's own array
        self.assertTrue(got.flags.c_contiguous)
        self.assertEqual(got.shape, (4, 3))
        want = sql_pull(self.conn, "b", ids, 3)  # the twin: same seed, same rows
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got[0], got[2])  # a repeated id: its row twice
        # Permits as the SQL function takes them; 'once' takes none for ids
        # already held.
        embkv.pull(self.conn, "a", [9, 2, 4], 3, once=True)
        sql_pull(self.conn, "b", [9, 2, 4], 3, once=True)
        self.assertEqual(give_back(self.conn, "a", [5, 9, 2, 4, 8]), 4)
        self.assertEqual(give_back(self.conn, "b", [5, 9, 2, 4, 8]), 4)
        # Without dim, the table's own is used.
        np.testing.assert_array_equal(embkv.pull(self.conn, "a", [2]), want[3:4])
        self.assertEqual(give_back(self.conn, "a", [2]), 1)

    def test_training_equals_sql_bit_for_bit(self):
        rng = np.random.default_rng(3)
        for step in range(20):
            ids = rng.integers(0, 30, 50)
            ra = embkv.pull(self.conn, "a", ids, 3)
            rb = sql_pull(self.conn, "b", ids, 3)
            np.testing.assert_array_equal(ra, rb)
            g = (ra * rng.normal(size=ra.shape)).astype(np.float32)
            g2 = g if step % 2 else np.asfortranarray(g)  # (a non-contiguous one is made contiguous)
            self.assertEqual(embkv.push(self.conn, "a", ids, g2), sql_push(self.conn, "b", ids, g))
        every = np.arange(30)
        np.testing.assert_array_equal(embkv.pull(self.conn, "a", every, 3), sql_pull(self.conn, "b", every, 3))
        self.assertEqual(give_back(self.conn, "a", every), 30)  # (the last pull's)
        self.assertEqual(embkv.push(self.conn, "a", [1], np.ones((1, 3), np.float32), lr=0.5), 1)
        self.assertEqual(give_back(self.conn, "a", every), 0)

    def test_errors_are_the_sql_functions(self):
        with self.assertRaises(sqlite3.OperationalError) as e:
            embkv.push(self.conn, "a", [1], np.array([[np.nan, 0, 0]], np.float32))
        self.assertEqual(str(e.exception), "embkv_push: table a: id 1: gradient element 0 is NaN")
        self.assertEqual(e.exception.sqlite_errorcode, sqlite3.SQLITE_ERROR)
        self.assertEqual(e.exception.sqlite_errorname, "SQLITE_ERROR")
        with self.assertRaises(sqlite3.OperationalError) as e:
            embkv.push(self.conn, "a", [1], np.ones((1, 3), np.float32), lr=-1.0)
        self.assertEqual(str(e.exception), "embkv_push: table a: lr (argument 4) must be a positive finite number")
        with self.assertRaises(sqlite3.OperationalError) as e:
            embkv.pull(self.conn, "a", [1], 4)  # a dim that is not the table's
        self.assertEqual(str(e.exception), "embkv_pull: table a: the output array holds 16 bytes, and 1 ids of "
                                           "dim 3 need 12")
        self.conn.execute("CREATE VIRTUAL TABLE c USING embkv(dim=3)")
        with self.assertRaises(sqlite3.OperationalError) as e:
            embkv.pull(self.conn, "c", [4], 3)
        self.assertIn("id 4 not found", str(e.exception))
        self.conn.execute("BEGIN")
        self.conn.execute("INSERT INTO a(id, vec) VALUES (100, '[1,2,3]')")
        with self.assertRaises(sqlite3.OperationalError) as e:
            embkv.pull(self.conn, "a", [1], 3)
        self.assertEqual(str(e.exception), "embkv_pull: table a: this connection has uncommitted writes to the "
                                           "table; COMMIT them first")
        self.conn.execute("COMMIT")
        with self.assertRaises(sqlite3.OperationalError):
            embkv.pull(self.conn, "nope", [1], 3)  # (the SQL path reports a missing table)

    def test_ids_past_int64_name_the_id(self):
        for ids, exc, msg in (([1, 2**64], ValueError, "embkv: id 18446744073709551616 (at index 1) does not fit "
                                                        "in int64"),
                              ([-2**63 - 1], ValueError, "embkv: id -9223372036854775809 (at index 0) does not fit "
                                                         "in int64"),
                              ([1, None], TypeError, "embkv: ids must be integers, not NoneType (None at index 1)")):
            for call in (lambda: embkv.pull(self.conn, "a", ids),
                         lambda: embkv.push(self.conn, "a", ids, np.ones((len(ids), 3), np.float32))):
                with self.assertRaises(exc) as e:
                    call()
                self.assertEqual(str(e.exception), msg)
        self.assertEqual(embkv.pull(self.conn, "a", [2**63 - 1, -2**63]).shape, (2, 3))

    def test_lr_is_a_positive_number(self):
        one = np.ones((1, 3), np.float32)
        for path in ("direct", "sql"):
            saved = embkv._direct_push
            if path == "sql":
                embkv._direct_push = lambda *a: None  # (as without the entry points)
            try:
                # sqlite3 binds a NaN as NULL, the table's own lr: refused instead
                for lr in (float("nan"), np.float32("nan"), float("inf"), 0, -1.0):
                    with self.assertRaises(sqlite3.OperationalError) as e:
                        embkv.push(self.conn, "a", [1], one, lr=lr)
                    self.assertEqual(str(e.exception), "embkv_push: table a: lr (argument 4) must be a positive "
                                                       "finite number", (path, lr))
                for lr in ("0.5", True, b"1", [0.5]):
                    with self.assertRaises(TypeError) as e:
                        embkv.push(self.conn, "a", [1], one, lr=lr)
                    self.assertEqual(str(e.exception), "embkv.push: table a: lr must be a positive finite number, or None "
                                                       "for the table's own, not %r" % (lr,))
                self.assertEqual(embkv.push(self.conn, "a", [1], one, lr=np.float32(0.5)), 1)
            finally:
                embkv._direct_push = saved
        np.testing.assert_array_equal(embkv.pull(self.conn, "a", [7], 3), sql_pull(self.conn, "b", [7], 3))
        embkv.release(self.conn, "a", [7])
        embkv.release(self.conn, "b", [7])
        self.assertEqual(embkv.release(self.conn, "a", [1]), 0)  # (each refused push took none)

    def test_a_name_with_a_nul_names_nothing(self):
        # (as a C string it would be its prefix, the table a)
        for fn in (lambda: embkv.pull(self.conn, "a\0b", [1], 3),
                   lambda: self.conn.execute("SELECT embkv_pull('a' || char(0) || 'b', 1)").fetchone(),
                   lambda: self.conn.execute("SELECT embkv_push(?, 1, ?)", ("a\0", bytes(12))).fetchone()):
            with self.assertRaises(sqlite3.OperationalError) as e:
                fn()
            self.assertRegex(str(e.exception), r"^embkv_pu(ll|sh): the table name \(argument 1\) holds a NUL "
                                               r"character: no table or file is named so$")
        with self.assertRaises(sqlite3.OperationalError) as e:
            self.conn.execute("SELECT embkv_stats(?)", ("a\0",)).fetchone()
        self.assertEqual(str(e.exception), "embkv_stats: the table name holds a NUL character: no table or file "
                                           "is named so")
        with self.assertRaises(sqlite3.OperationalError) as e:
            self.conn.execute("SELECT id FROM embkv_knn(?, ?, 1)", ("a\0", bytes(12))).fetchall()
        self.assertEqual(str(e.exception), "embkv_knn: the table name (argument 1) holds a NUL character: no "
                                           "table or file is named so")
        with self.assertRaises(sqlite3.OperationalError) as e:
            self.conn.execute("SELECT count(*) FROM embkv_heat(?)", ("a\0",)).fetchall()
        self.assertEqual(str(e.exception), "embkv_heat: the table name holds a NUL character: no table or file "
                                           "is named so")
        out = self.dir + "/x.db"
        with self.assertRaises(sqlite3.OperationalError) as e:
            self.conn.execute("SELECT embkv_export('a', ?)", (out + "\0.tmp",)).fetchone()
        self.assertEqual(str(e.exception), "embkv_export: table a: argument 2 must be a file name (non-empty "
                                           "TEXT), got TEXT that holds a NUL character: no table or file is "
                                           "named so")
        self.assertFalse(os.path.exists(out))
        self.assertEqual(embkv.release(self.conn, "a", [1]), 0)

    def test_a_permit_that_times_out_is_busy(self):
        other = connect(self.db)
        try:
            embkv.pull(other, "a", [1], 3)  # staleness 0: the next pull of 1 waits for this push
            with self.assertRaises(sqlite3.OperationalError) as e:
                embkv.pull(self.conn, "a", [1], 3)
            self.assertEqual(e.exception.sqlite_errorcode, sqlite3.SQLITE_BUSY)
            self.assertIn("id 1", str(e.exception))
            embkv.push(other, "a", [1], np.zeros((1, 3), np.float32))
            embkv.pull(self.conn, "a", [1], 3)
        finally:
            other.close()

    def test_a_store_another_process_writes_waits_once(self):
        self.conn.close()
        go = self.dir + "/go"
        holder = subprocess.Popen([sys.executable, "-c", HOLD, self.db, EXT, go], stdout=subprocess.PIPE, text=True)
        try:
            self.assertEqual(holder.stdout.readline().strip(), "holding")
            c = connect(self.db, timeout=0.3)
            ran = []
            c.set_trace_callback(ran.append)
            with self.assertRaises(sqlite3.OperationalError) as e:
                embkv.pull(c, "a", [1])
            self.assertIn("one process at a time may write a store (waited 300 ms", str(e.exception))
            # (one wait: no pull after it; the others are the extension's own)
            self.assertEqual([q for q in ran if not q.startswith("--")], ["SELECT embkv_stats('a')"])
            c.close()
        finally:
            open(go, "w").close()
            holder.communicate(timeout=60)
        self.conn = connect(self.db)

    def test_read_only_connection_reads_existing_rows(self):
        embkv.pull(self.conn, "a", [1, 2], 3)
        embkv.release(self.conn, "a", [1, 2])
        ro = connect("file:%s?mode=ro" % self.db, uri=True)
        try:
            np.testing.assert_array_equal(embkv.pull(ro, "a", [2, 1], 3), sql_pull(self.conn, "a", [2, 1], 3))
            embkv.release(self.conn, "a", [2, 1])
            with self.assertRaises(sqlite3.OperationalError) as e:
                embkv.pull(ro, "a", [77], 3)
            self.assertIn("id 77 has no row, and this connection creates none", str(e.exception))
            with self.assertRaises(sqlite3.OperationalError):
                embkv.push(ro, "a", [1], np.zeros((1, 3), np.float32))
        finally:
            ro.close()

    def test_float64_gradients_past_float32(self):
        """A finite float64 gradient float32 cannot hold is named as such
        (the cast would make it an infinity), and nothing is updated."""
        with self.assertRaises(ValueError) as cm:
            embkv.push(self.conn, "a", [1, 2], np.array([[0.5, 0, 0], [0, 0, -1e300]]))
        self.assertEqual(str(cm.exception), "embkv.push: table a: id 2: gradient element 2 is -1e+300, beyond "
                                            "float32's range (3.40282e+38): scale the gradients (or clip them) to "
                                            "float32's range")
        self.assertEqual(self.conn.execute("SELECT count(*) FROM a WHERE clock > 0").fetchone()[0], 0)
        self.assertEqual(embkv.push(self.conn, "a", [1], np.array([[0.5, 0, 0]])), 1)  # (float64 in range: fine)

    def test_closed_connection_and_other_thread(self):
        other = connect(self.db)
        other.close()
        with self.assertRaises(sqlite3.ProgrammingError) as cm:
            embkv.pull(other, "a", [1], 3)
        self.assertEqual(str(cm.exception), "embkv.pull: table a: Cannot operate on a closed database.")
        with self.assertRaises(sqlite3.ProgrammingError):
            embkv.push(other, "a", [1], np.zeros((1, 3), np.float32), lr=0.1)
        errors = []

        def use():
            try:
                embkv.pull(self.conn, "a", [1], 3)
            except Exception as e:  # noqa: BLE001 (the type is the test)
                errors.append(e)

        t = threading.Thread(target=use)
        t.start()
        t.join()
        self.assertEqual(len(errors), 1)
        self.assertIsInstance(errors[0], sqlite3.ProgrammingError)
        self.assertEqual(give_back(self.conn, "a", [1]), 0)  # no permit was taken


class WhatSqlCannotDo(TempDirTest):
    def setUp(self):
        super().setUp()
        self.conn = connect(self.db)
        self.conn.execute("CREATE VIRTUAL TABLE a USING embkv(dim=2, init='zeros')")
        self.lib = ctypes.CDLL(EXT + ".so")
        i64, vp, sz, cp = ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        self.lib.embkv_direct_pull.argtypes = [i64, cp, vp, sz, vp, sz, ctypes.c_int, cp, sz]
        self.lib.embkv_direct_pull.restype = ctypes.c_int

    def tearDown(self):
        self.conn.close()
        super().tearDown()

    def direct_pull(self, handle, n, out_bytes):
        ids = np.arange(1, n + 1, dtype=np.int64)
        out = np.zeros(max(1, out_bytes // 4), np.float32)
        err = ctypes.create_string_buffer(512)
        rc = self.lib.embkv_direct_pull(handle, b"a", ids.ctypes.data, n, out.ctypes.data, out_bytes, 0, err, 512)
        return rc, err.value.decode(), out

    def test_the_output_argument_is_a_pointer_sql_cannot_make(self):
        for arg in ("5", "x'00'", "'rows'", "NULL", "embkv_connection()"):
            with self.assertRaises(sqlite3.OperationalError) as e:
                self.conn.execute("SELECT embkv_pull('a', 1, NULL, %s)" % arg).fetchone()
            self.assertEqual(str(e.exception), "embkv_pull: table a: argument 4 is for language bindings (a "
                                               "pointer only C can bind): call embkv_pull(table, ids) or "
                                               "embkv_pull(table, ids, 'once')")
        self.assertEqual(embkv.release(self.conn, "a", [1]), 0)  # no permit was taken

    def test_embkv_connection_is_not_for_views(self):
        self.conn.execute("CREATE VIEW v AS SELECT embkv_connection() AS h")
        with self.assertRaises(sqlite3.OperationalError) as e:
            self.conn.execute("SELECT h FROM v").fetchone()
        self.assertIn("unsafe use of embkv_connection()", str(e.exception))

    def test_handles_of_no_open_connection_are_refused(self):
        h = self.conn.execute("SELECT embkv_connection()").fetchone()[0]
        rc, err, out = self.direct_pull(h, 2, 16)
        self.assertEqual((rc, err), (0, ""))
        np.testing.assert_array_equal(out, np.zeros(4, np.float32))
        rc, err, _ = self.direct_pull(h, 2, 12)  # an array of the wrong size: nothing written past it
        self.assertEqual(rc, sqlite3.SQLITE_ERROR)
        self.assertEqual(err, "embkv_pull: table a: the output array holds 12 bytes, and 2 ids of dim 2 need 16")
        rc, err, _ = self.direct_pull(h + 8, 1, 8)
        self.assertEqual(rc, -1)
        self.assertIn("names no open connection of this library", err)
        other = connect(self.db)
        h2 = other.execute("SELECT embkv_connection()").fetchone()[0]
        self.assertNotEqual(h2, h)
        self.assertEqual(self.direct_pull(h2, 1, 8)[0], 0)
        other.close()
        self.assertEqual(self.direct_pull(h2, 1, 8)[0], -1)  # closed: refused, not used
        embkv.release(self.conn, "a", [1, 2])

    def test_a_handle_of_another_library_file_names_nothing(self):
        """A connection that loaded the extension from another file has a
        handle of that file's: the package's direct call refuses it (-1)
        and runs the SQL functions on that connection."""
        import shutil
        os.makedirs(os.path.join(self.dir, "copy"))
        copy = os.path.join(self.dir, "copy", "embkv")
        shutil.copy(EXT + ".so", copy + ".so")
        b = sqlite3.connect(":memory:", isolation_level=None)
        b.enable_load_extension(True)
        b.load_extension(copy)
        b.execute("CREATE VIRTUAL TABLE a USING embkv(dim=2, init='zeros', lr=1)")
        b.execute("INSERT INTO a VALUES (7, '[5,5]')")
        hb = b.execute("SELECT embkv_connection()").fetchone()[0]
        self.assertNotEqual(hb, self.conn.execute("SELECT embkv_connection()").fetchone()[0])
        self.assertEqual(self.direct_pull(hb, 1, 8)[0], -1)
        np.testing.assert_array_equal(embkv.pull(b, "a", [7]), [[5, 5]])
        embkv.push(b, "a", [7], np.ones((1, 2), np.float32))
        self.assertEqual(b.execute("SELECT embkv_json(vec), clock FROM a WHERE id = 7").fetchone(), ("[4,4]", 1))
        self.assertEqual(self.conn.execute("SELECT count(*) FROM a").fetchone()[0], 0)
        b.close()

    def test_handles_are_never_reused(self):
        # (a new connection may get a closed one's address: never its handle)
        seen = set()
        for _ in range(20):
            c = connect(self.db)
            h = c.execute("SELECT embkv_connection()").fetchone()[0]
            self.assertNotIn(h, seen)
            seen.add(h)
            c.close()
            self.assertEqual(self.direct_pull(h, 1, 8)[0], -1)

    def test_counts_past_what_a_call_takes(self):
        h = self.conn.execute("SELECT embkv_connection()").fetchone()[0]
        out = np.zeros(4, np.float32)
        ids = np.arange(1, 3, dtype=np.int64)
        err = ctypes.create_string_buffer(512)
        # (n * 8 wraps past 2^64: nothing is read past the 2 ids, nothing written)
        for n in (2 ** 61 + 1, 2 ** 60, 2 ** 28):
            rc = self.lib.embkv_direct_pull(h, b"a", ids.ctypes.data, n, out.ctypes.data, 16, 0, err, 512)
            self.assertEqual(rc, sqlite3.SQLITE_TOOBIG)
            self.assertEqual(err.value.decode(), "embkv_direct_pull: table a: %d ids in one call, more than a SQL "
                                                 "value holds (268435455 ids, 2147483647 bytes): pull fewer at a "
                                                 "time" % n)
        np.testing.assert_array_equal(out, np.zeros(4, np.float32))
        i64, vp, sz, cp = ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
        self.lib.embkv_direct_push.argtypes = [i64, cp, vp, sz, vp, sz, vp, vp, cp, sz]
        updated = ctypes.c_int64(7)
        for n, gb in ((2 ** 61 + 1, 16), (2, 2 ** 31), (2, 2 ** 64 - 1)):
            rc = self.lib.embkv_direct_push(h, b"a", ids.ctypes.data, n, out.ctypes.data, gb, None,
                                            ctypes.byref(updated), err, 512)
            self.assertEqual(rc, sqlite3.SQLITE_TOOBIG)
            self.assertEqual(err.value.decode(), "embkv_direct_push: table a: %d ids and %d bytes of gradients in "
                                                 "one call, more than a SQL value holds (268435455 ids, 2147483647 "
                                                 "bytes): push fewer at a time" % (n, gb))
            self.assertEqual(updated.value, 0)
        # a NaN lr through C: refused, not the table's own
        nan = ctypes.c_double(float("nan"))
        rc = self.lib.embkv_direct_push(h, b"a", ids.ctypes.data, 2, out.ctypes.data, 16, ctypes.byref(nan),
                                        ctypes.byref(updated), err, 512)
        self.assertEqual((rc, err.value.decode()), (sqlite3.SQLITE_ERROR, "embkv_push: table a: lr (argument 4) "
                                                    "must be a positive finite number"))
        self.assertEqual(self.conn.execute("SELECT count(*) FROM a").fetchone()[0], 0)  # no row made
        # ids over the connection's SQLITE_LIMIT_LENGTH: said with the figures, from C and from the package
        self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1000)
        many = np.arange(1, 201, dtype=np.int64)
        big = np.zeros(400, np.float32)
        rc = self.lib.embkv_direct_pull(h, b"a", many.ctypes.data, 200, big.ctypes.data, big.nbytes, 0, err, 512)
        self.assertEqual((rc, err.value.decode()), (sqlite3.SQLITE_TOOBIG, "embkv_pull: table a: 200 ids (1600 "
                                                    "bytes) are over this connection's limit of 1000 bytes for one "
                                                    "value (SQLITE_LIMIT_LENGTH): pull fewer ids at a time"))
        for f, verb in ((embkv.pull, "pull"), (embkv.release, "release")):
            with self.assertRaises(sqlite3.DataError) as cm:
                f(self.conn, "a", many)
            self.assertEqual(str(cm.exception), "embkv_%s: table a: 200 ids (1600 bytes) are over this "
                                                "connection's limit of 1000 bytes for one value "
                                                "(SQLITE_LIMIT_LENGTH): %s fewer ids at a time" % (verb, verb))
        self.assertEqual(self.conn.execute("SELECT count(*) FROM a").fetchone()[0], 0)

    def test_a_close_beside_calls_in_other_threads(self):
        # One thread's pull waits for a permit, holding the connection; a
        # second thread's call waits for the connection; the connection is
        # closed meanwhile.  The second call runs before the close or finds
        # the connection gone (-1): never a freed connection.
        self.conn.execute("CREATE VIRTUAL TABLE s USING embkv(dim=2, init='zeros', staleness=0, wait_ms=1500)")
        holder = connect(self.db)
        embkv.pull(holder, "s", [1], 2)
        c = connect(self.db, check_same_thread=False)
        h = c.execute("SELECT embkv_connection()").fetchone()[0]
        got = {}

        def call(name, table, i):
            ids = np.array([i], np.int64)
            out = np.zeros(2, np.float32)
            err = ctypes.create_string_buffer(512)
            got[name] = (self.lib.embkv_direct_pull(h, table, ids.ctypes.data, 1, out.ctypes.data, 8, 0, err, 512),
                         err.value.decode())

        waiting = threading.Thread(target=call, args=("waiting", b"s", 1))
        waiting.start()
        time.sleep(0.3)
        # (the close waits for the waiting pull, SQLite's close taking the
        # connection's mutex; the second call comes after it)
        closer = threading.Thread(target=c.close)
        closer.start()
        time.sleep(0.3)
        second = threading.Thread(target=call, args=("second", b"a", 5))
        second.start()
        for t in (waiting, closer, second):
            t.join()
        self.assertEqual(got["waiting"][0], sqlite3.SQLITE_BUSY, got)
        self.assertIn(got["second"][0], (0, -1), got)
        if got["second"][0] == -1:
            self.assertIn("names no open connection of this library", got["second"][1])
        self.assertEqual(self.direct_pull(h, 1, 8)[0], -1)
        embkv.release(holder, "s", [1])
        holder.close()
        embkv.release(self.conn, "a", [5])

    def test_loading_the_extension_twice_keeps_the_handle(self):
        self.conn.enable_load_extension(True)
        self.conn.load_extension(EXT)
        self.conn.enable_load_extension(False)
        h = self.conn.execute("SELECT embkv_connection()").fetchone()[0]
        self.assertEqual(self.direct_pull(h, 1, 8)[0], 0)
        self.assertTrue(embkv.pull(self.conn, "a", [3], 2).flags.writeable)
        embkv.release(self.conn, "a", [1, 3])


if __name__ == "__main__":
    unittest.main()
