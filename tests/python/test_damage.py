"""A damaged record reaches SQL as an error naming the table and the id,
never as data; the other rows stay readable and the damaged one can be
deleted (existence reads check the record's id only)."""
import json
import os
import re
import shutil
import sqlite3
import unittest

import numpy as np

from embkv_test import TempDirTest, connect


class TestDamagedRecord(TempDirTest):
    def test_corrupt_row_is_an_error_naming_table_and_id(self):
        store = os.path.join(self.dir, "t.embkv")
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, path='%s', optimizer='sgd', lr=0.5)" % store)
        c.execute("BEGIN")
        for i in range(50):
            c.execute("INSERT INTO t(id, vec) VALUES (?, ?)", (i, (np.arange(4, dtype=np.float32) + 100 * i).tobytes()))
        c.execute("COMMIT")
        c.close()
        pool = os.path.join(store, "store.pool")
        with open(pool, "rb") as fh:
            data = bytearray(fh.read())
        at = data.find((np.arange(4, dtype=np.float32) + 100 * 7).tobytes())
        self.assertGreater(at, 0)
        data[at + 5] ^= 0x20
        with open(pool, "wb") as fh:
            fh.write(data)
        c = connect(self.db)
        try:
            for sql in ("SELECT vec FROM t WHERE id = 7", "SELECT id, vec FROM t WHERE id IN (3, 7, 9)",
                        "SELECT sum(embkv_norm(vec)) FROM t", "SELECT id, vec, clock FROM t WHERE id = 7"):
                with self.assertRaises(sqlite3.DatabaseError) as cm:
                    c.execute(sql).fetchall()
                msg = str(cm.exception)
                self.assertIn("embkv table t", msg)
                self.assertIn("id 7: the record is damaged", msg)
            with self.assertRaisesRegex(sqlite3.DatabaseError, "id 7: the record is damaged"):
                c.execute("SELECT embkv_push('t', 7, ?)", (np.ones(4, np.float32).tobytes(),)).fetchall()
            self.assertEqual(np.frombuffer(c.execute("SELECT vec FROM t WHERE id = 8").fetchone()[0],
                                           np.float32).tolist(), [800, 801, 802, 803])
            c.execute("DELETE FROM t WHERE id = 7")  # a damaged row can still be removed
            self.assertEqual(c.execute("SELECT count(*) FROM t").fetchone()[0], 49)
            self.assertIsNone(c.execute("SELECT vec FROM t WHERE id = 7").fetchone())
        finally:
            c.close()


def read(path):
    with open(path, "rb") as fh:
        return fh.read()


class TestDamagedStoreFiles(TempDirTest):
    """Bytes of the binding's files in a store flipped, and each file
    truncated or emptied: a clean error naming the options file or the
    list of users, or the same rows; never a crash, never another option value (the options carry
    a check)."""

    def test_flips_and_truncations(self):
        store = os.path.join(self.dir, "s")
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, path='s', optimizer='sgd', lr=0.5)")
        c.execute("INSERT INTO t VALUES (1, '[1,2]')")
        c.close()
        files = {f: read(os.path.join(store, f))
                 for f in ("app-sqlite-options", "app-sqlite-tables", "app-sqlite-store-id", "LOCK")}

        def attempt():
            c = connect(self.db)
            try:
                got = c.execute("SELECT count(*), sum(clock) FROM t").fetchone()
                c.execute("SELECT embkv_push('t', 1, '[1,1]')").fetchall()
                return got, c.execute("SELECT vec FROM t WHERE id = 1").fetchone()[0]
            except sqlite3.DatabaseError as e:
                return str(e), None
            finally:
                c.close()

        variants, pushes = [], 0
        for name, data in files.items():
            for i in range(0, len(data), 4 if len(data) > 100 else 1):  # brief: every 4th byte of the long one
                b = bytearray(data)
                b[i] ^= 0x01 if i % 2 else 0x40
                variants.append((name, bytes(b)))
            variants += [(name, data[: len(data) // 2]), (name, b"")]
        for name, bad in variants:
            for n2, d2 in files.items():
                with open(os.path.join(store, n2), "wb") as fh:
                    fh.write(bad if n2 == name else d2)
            got, vec = attempt()
            if vec is None:
                self.assertIn("embkv table t", got)
                if name == "app-sqlite-store-id":
                    self.assertIn("the store's id in %s/app-sqlite-store-id is damaged: restore the file from a backup "
                                  "of the directory, or remove it (the pool is then not checked against it)" % store,
                                  got)
                elif name == "app-sqlite-tables":  # its list of users no longer names the table
                    self.assertRegex(got, r"does not list this table among its users \(app-sqlite-tables (is "
                                          r"damaged|does not name its table id|names no table)", (name, bad))
                else:
                    self.assertRegex(got, "app-sqlite-options are (damaged|not the ones its CREATE recorded)",
                                     (name, bad))
            else:
                pushes += 1  # sgd with lr 0.5 and gradient 1, as created: nothing else
                self.assertEqual(got[0], 1)
                self.assertEqual(np.frombuffer(vec, np.float32).tolist(), [1 - 0.5 * pushes, 2 - 0.5 * pushes])
        for n2, d2 in files.items():
            with open(os.path.join(store, n2), "wb") as fh:
                fh.write(d2)
        c = connect(self.db)
        self.assertEqual(c.execute("SELECT count(*) FROM t").fetchone()[0], 1)
        c.close()
        # Deleted, or replaced by another store's (valid, other lr): errors,
        # never the wrong options.
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE u USING embkv(dim=2, path='u', lr=0.7)")
        c.close()
        opts = os.path.join(store, "app-sqlite-options")
        os.rename(opts, opts + ".away")
        got, vec = attempt()
        self.assertIsNone(vec)
        self.assertIn("app-sqlite-options is missing (its CREATE recorded options there): restore it from a backup "
                      "of the directory, or DROP TABLE \"t\" (the store stays) and CREATE it again with path= naming "
                      "the store and the options it was made with", got)
        with open(opts, "wb") as fh:
            fh.write(read(os.path.join(self.dir, "u", "app-sqlite-options")))
        got, vec = attempt()
        self.assertIsNone(vec)
        self.assertIn("are not the ones its CREATE recorded: restore the file from a backup of the directory", got)
        os.replace(opts + ".away", opts)
        # A changed byte: the advice (move it aside, DROP, CREATE with the
        # options) brings the table back with its rows.
        good = read(opts)
        with open(opts, "wb") as fh:
            fh.write(good.replace(b'"sgd"', b'"Sgd"'))
        got, vec = attempt()
        self.assertIsNone(vec)
        self.assertIn("app-sqlite-options are damaged: restore the file from a backup of the directory, or move it "
                      "aside, DROP TABLE \"t\" (the store stays) and CREATE it again with path= naming the store "
                      "and the options it was made with", got)
        os.rename(opts, opts + ".damaged")
        c = connect(self.db)
        c.execute('DROP TABLE "t"')
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, path='s', optimizer='sgd', lr=0.5)")
        self.assertEqual(c.execute("SELECT count(*) FROM t").fetchone()[0], 1)
        c.close()
        self.assertIsNotNone(attempt()[1])

    def test_another_stores_pool_is_refused(self):
        # Two stores alike (dim, optimizer); b's pool copied over a's: a's
        # table refuses it (the options file records the pool's id), and
        # takes its own back.
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE a USING embkv(dim=4, path='a', optimizer='adagrad', init='zeros')")
        c.execute("CREATE VIRTUAL TABLE b USING embkv(dim=4, path='b', optimizer='adagrad', init='zeros')")
        c.execute("INSERT INTO a VALUES (1, '[1,2,3,4]')")
        c.execute("INSERT INTO b VALUES (2, '[5,6,7,8]')")
        c.close()
        mine = os.path.join(self.dir, "a", "store.pool")
        own = os.path.join(self.dir, "a.pool")
        os.rename(mine, own)
        shutil.copyfile(os.path.join(self.dir, "b", "store.pool"), mine)
        c = connect(self.db)
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            c.execute("SELECT count(*) FROM a").fetchone()
        self.assertRegex(str(cm.exception), r"embkv table a: the pool %s/store.pool is not this store's: its id is "
                         r"[0-9a-f]{16}, and %s/app-sqlite-store-id names [0-9a-f]{16} \(a pool copied from another "
                         r"store\): restore the directory from a backup"
                         % (re.escape(os.path.join(self.dir, "a")), re.escape(os.path.join(self.dir, "a"))))
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_CORRUPT)
        self.assertEqual(c.execute("SELECT id FROM b").fetchall(), [(2,)])
        c.close()
        os.replace(own, mine)
        c = connect(self.db)
        self.assertEqual(c.execute("SELECT id, embkv_json(vec) FROM a").fetchall(), [(1, "[1,2,3,4]")])
        c.close()
        # A damaged id file: the advice (remove it) opens the table.
        idf = os.path.join(self.dir, "a", "app-sqlite-store-id")
        write_bytes = read(idf)
        with open(idf, "wb") as fh:
            fh.write(write_bytes[:10])
        c = connect(self.db)
        with self.assertRaisesRegex(sqlite3.DatabaseError, "app-sqlite-store-id is damaged: restore the file"):
            c.execute("SELECT count(*) FROM a").fetchone()
        c.close()
        os.remove(idf)
        c = connect(self.db)
        self.assertEqual(c.execute("SELECT count(*) FROM a").fetchone()[0], 1)
        c.close()

    def test_another_stores_files_but_its_list_of_tables(self):
        # Every file of store b copied over a's but a's list of tables (so
        # the id file and the options travel with the pool): a's table
        # refuses the store, naming the id its CREATE recorded; the advice
        # (DROP, then CREATE with path=) attaches it to the rows there.
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE a USING embkv(dim=4, path='a')")
        c.execute("CREATE VIRTUAL TABLE b USING embkv(dim=4, path='b')")
        c.execute("INSERT INTO a VALUES (1, '[1,1,1,1]')")
        c.execute("INSERT INTO b VALUES (1, '[2,2,2,2]'), (2, '[2,2,2,2]')")
        c.close()
        a, b = os.path.join(self.dir, "a"), os.path.join(self.dir, "b")
        kept = read(os.path.join(a, "app-sqlite-tables"))
        shutil.rmtree(a)
        shutil.copytree(b, a)
        with open(os.path.join(a, "app-sqlite-tables"), "wb") as fh:
            fh.write(kept)
        c = connect(self.db)
        with self.assertRaises(sqlite3.DatabaseError) as cm:
            c.execute("SELECT id FROM a").fetchall()
        self.assertRegex(str(cm.exception), r"embkv table a: the store in %s is not the one this table was made on: "
                         r"its pool's id is [0-9a-f]{16}, and the table's a_config recorded [0-9a-f]{16} \(another "
                         r"store's files copied over this one's\): restore the directory from a backup, or DROP TABLE "
                         r'"a" \(the store stays\) and CREATE it again with path= naming the store'
                         % re.escape(os.path.realpath(a)))
        self.assertEqual(cm.exception.sqlite_errorcode, sqlite3.SQLITE_CORRUPT)
        c.execute("DROP TABLE a")
        c.execute("CREATE VIRTUAL TABLE a USING embkv(dim=4, path='a')")
        self.assertEqual(c.execute("SELECT id, embkv_json(vec) FROM a ORDER BY id").fetchall(),
                         [(1, "[2,2,2,2]"), (2, "[2,2,2,2]")])
        c.close()

    def test_grown_pool_file_is_damage_not_an_option(self):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, path='s', pool_size='16M')")
        c.close()
        with open(os.path.join(self.dir, "s", "store.pool"), "ab") as fh:
            fh.write(b"\0" * 4096)
        c = connect(self.db)
        for sql in ("SELECT count(*) FROM t", "CREATE VIRTUAL TABLE u USING embkv(dim=4, path='s', pool_size='16M')"):
            with self.assertRaises(sqlite3.DatabaseError) as cm:
                c.execute(sql).fetchall()
            self.assertIn("the store's pool file %s/store.pool is 16781312 bytes, not the 16777216 its CREATE made "
                          "(recorded in %s/app-sqlite-options): it was changed outside embkv; restore the store "
                          "from a backup" % ((os.path.join(self.dir, "s"),) * 2), str(cm.exception))
        c.close()

    def test_a_store_without_its_pool_is_kept_by_a_refused_create(self):
        """A directory holding what is left of a store whose pool is lost
        (its dirty map, its SSD log's segments, no list of tables): a
        CREATE naming it is refused, and the directory stays as it was for
        the advice (put the pool back) to be followed."""
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=64, path='s', pool_size='16M', ssd_size='8M', "
                  "capacity=1000)")
        for a in range(0, 30000, 10000):
            c.execute("BEGIN")
            c.executemany("INSERT INTO t(id, vec) VALUES (?, zeroblob(256))", [(i,) for i in range(a, a + 10000)])
            c.execute("COMMIT")
        self.assertGreater(c.execute("SELECT count(*) FROM t WHERE tier = 'ssd'").fetchone()[0], 0)
        c.close()
        src = os.path.join(self.dir, "s")
        for name, keep in (("d", ("LOCK", "READERS", "store.dirty")), ("e", ("LOCK", "READERS", "store.dirty", "log"))):
            d = os.path.join(self.dir, name)
            os.makedirs(d)
            for f in keep:
                (shutil.copytree if f == "log" else shutil.copy2)(os.path.join(src, f), os.path.join(d, f))
            before = sorted(os.listdir(d)), sorted(os.listdir(os.path.join(d, "log"))) if "log" in keep else []
            c = connect(os.path.join(self.dir, "%s.db" % name))
            with self.assertRaises(sqlite3.DatabaseError) as cm:
                c.execute("CREATE VIRTUAL TABLE u USING embkv(dim=64, path='%s')" % d)
            c.close()
            self.assertIn("store %s: store.pool is missing, but the directory holds the rest of a store (%s): its "
                          "rows cannot be read, and no new store is made over them; put the pool file back"
                          % (d, "segments in log/" if "log" in keep else "store.dirty"), str(cm.exception))
            self.assertEqual((sorted(os.listdir(d)), sorted(os.listdir(os.path.join(d, "log"))) if "log" in keep
                              else []), before)
        # the advice followed: the pool back, the store opens with every row
        shutil.copy2(os.path.join(src, "store.pool"), os.path.join(d, "store.pool"))
        shutil.copy2(os.path.join(src, "store.sealed"), os.path.join(d, "store.sealed"))
        c = connect(os.path.join(self.dir, "e2.db"))
        c.execute("CREATE VIRTUAL TABLE u USING embkv(dim=64, path='%s')" % d)
        self.assertEqual(c.execute("SELECT count(*) FROM u").fetchone()[0], 30000)
        c.close()

    def test_a_table_without_its_store_answers_the_reason_code(self):
        """A table whose store is damaged answers every use but DROP with
        SQLITE_CORRUPT, one whose directory is gone with SQLITE_CANTOPEN:
        statements and functions alike, the message naming the file."""
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, path='s', pool_size='16M')")
        c.execute("CREATE VIRTUAL TABLE g USING embkv(dim=4, path='g')")
        c.execute("INSERT INTO t(id, vec) VALUES (1, '[1,2,3,4]')")
        c.close()
        with open(os.path.join(self.dir, "s", "store.pool"), "ab") as fh:
            fh.write(b"\0" * 4096)
        shutil.rmtree(os.path.join(self.dir, "g"))
        c = connect(self.db)
        uses = ("SELECT count(*) FROM {t}", "SELECT vec FROM {t} WHERE id = 1",
                "INSERT INTO {t}(id, vec) VALUES (2, '[0,0,0,0]')", "DELETE FROM {t} WHERE id = 1",
                "SELECT embkv_stats('{t}')", "SELECT embkv_pull('{t}', '[1]')",
                "SELECT embkv_checkpoint('{t}')", "SELECT * FROM embkv_knn('{t}', '[1,2,3,4]', 1)",
                "SELECT embkv_export('{t}', 'x.export')")
        for table, code, why in (("t", 11, "store.pool is 16781312 bytes"),
                                 ("g", 14, "no embkv store at %s: the directory does not exist"
                                  % os.path.join(self.dir, "g"))):
            for sql in uses:
                with self.assertRaises(sqlite3.DatabaseError, msg=sql) as cm:
                    c.execute(sql.format(t=table)).fetchall()
                self.assertEqual(cm.exception.sqlite_errorcode, code, sql)
                self.assertIn("table %s: " % table, str(cm.exception))
                self.assertIn(why, str(cm.exception))
            c.execute("DROP TABLE %s" % table)
        self.assertEqual(c.execute("SELECT count(*) FROM sqlite_master WHERE name IN ('t', 'g')").fetchone()[0], 0)
        self.assertTrue(os.path.exists(os.path.join(self.dir, "s", "store.pool")))
        c.close()

    def test_deleted_options_file_cannot_change_the_optimizer(self):
        """The store's own record (the state its records keep) decides the
        optimizer, not the options file a user can delete."""
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE a USING embkv(dim=4, path='s', optimizer='adagrad', lr=0.1)")
        c.execute("INSERT INTO a(id, vec) VALUES (1, '[1,1,1,1]')")
        c.close()
        os.remove(os.path.join(self.dir, "s", "app-sqlite-options"))
        c = connect(self.db)
        for opt in ("optimizer='sgd'", "lr=0.5", "optimizer='adam'"):
            with self.assertRaises(sqlite3.OperationalError) as cm:
                c.execute("CREATE VIRTUAL TABLE b USING embkv(dim=4, path='s', %s)" % opt)
            want = "adam' keeps 9" if "adam" in opt else "sgd' keeps 0"
            self.assertIn("embkv table b: option optimizer: the store %s keeps 4 floats of optimizer state a row, "
                          "as optimizer 'adagrad' does at dim 4, and '%s: give optimizer='adagrad'"
                          % (os.path.join(self.dir, "s"), want), str(cm.exception))
        self.assertFalse(os.path.exists(os.path.join(self.dir, "s", "app-sqlite-options")))
        c.execute("CREATE VIRTUAL TABLE b USING embkv(dim=4, path='s', optimizer='adagrad', lr=0.1)")
        self.assertEqual(json.loads(c.execute("SELECT embkv_stats('b')").fetchone()[0])["dim"], 4)
        c.close()


if __name__ == "__main__":
    unittest.main()
