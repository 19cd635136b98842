"""Who may touch a store, from Python (docs/sql.md, "Who may touch a
store"): a connection opened read-only (mode=ro) reads rows and pulls
existing ones but changes nothing; a copy of the database file is a user of
its own; table names with a schema ("o.item", quoted parts) reach the
attached table from every function and from embkv.torch."""
import json
import os
import shutil
import sqlite3
import sys
import unittest

import numpy as np

from embkv_test import EXT, TempDirTest, connect

try:
    import torch
except ImportError:  # pragma: no cover
    sys.exit("embkv Python tests: PyTorch is required (Debian package python3-torch; `make deps` installs it)")

import embkv  # noqa: E402
import embkv.torch as ekt  # noqa: E402


class ReadOnly(TempDirTest):
    def setUp(self):
        super().setUp()
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE item USING embkv(dim=2, path='item.embkv', init='zeros', optimizer='sgd', lr=1)")
        c.execute("INSERT INTO item(id, vec) VALUES (1, '[1,1]'), (2, '[2,2]')")
        c.close()
        self.ro = connect("file:%s?mode=ro" % self.db, uri=True)

    def tearDown(self):
        self.ro.close()
        super().tearDown()

    def test_reads_and_pulls_existing_rows(self):
        self.assertEqual(embkv.pull(self.ro, "item", [2, 1]).tolist(), [[2, 2], [1, 1]])
        self.assertEqual(self.ro.execute("SELECT count(*) FROM item").fetchone()[0], 2)

    def test_changes_nothing(self):
        with self.assertRaisesRegex(sqlite3.OperationalError,
                                    r"^embkv_pull: table item: id 5 has no row, and this connection creates none: "
                                    r"the database is open read-only"):
            embkv.pull(self.ro, "item", [1, 5])
        with self.assertRaisesRegex(sqlite3.OperationalError,
                                    r"^embkv_push: table item: the database is open read-only, and embkv_push "
                                    r"changes the store \(it updates rows\); call it from a connection that may "
                                    r"write"):
            embkv.push(self.ro, "item", [1], np.ones((1, 2), dtype=np.float32))
        with self.assertRaisesRegex(sqlite3.OperationalError, r"^embkv_checkpoint: table item: the database is open"):
            embkv.checkpoint(self.ro, "item")
        exported = os.path.join(self.dir, "x.ekx")
        self.assertEqual(self.ro.execute("SELECT embkv_export('item', ?)", (exported,)).fetchone()[0], 2)
        with self.assertRaisesRegex(sqlite3.OperationalError, r"^embkv_import: table item: the database is open"):
            self.ro.execute("SELECT embkv_import('item', ?)", (exported,))
        with self.assertRaises(sqlite3.OperationalError):
            self.ro.execute("DELETE FROM item")
        # embkv.torch on the read-only connection: forward works, backward is refused
        ekt.Embedding(self.ro, "item", optimizer="sgd", lr=1)  # options given: nothing to check them with
        emb = ekt.Embedding(self.ro, "item")
        out = emb(torch.tensor([1, 2]))
        self.assertEqual(out.tolist(), [[1, 1], [2, 2]])
        with self.assertRaisesRegex(sqlite3.OperationalError, r"embkv_push: table item: the database is open"):
            out.sum().backward()
        c = connect(self.db)
        self.assertEqual(embkv.pull(c, "item", [1, 2]).tolist(), [[1, 1], [2, 2]])
        self.assertEqual(c.execute("SELECT count(*) FROM item").fetchone()[0], 2)
        c.close()


class Copies(TempDirTest):
    def test_drop_in_a_copy_keeps_the_store(self):
        c = connect(self.db)
        c.execute("CREATE VIRTUAL TABLE item USING embkv(dim=4, path='item.embkv')")
        c.execute("INSERT INTO item(id, vec) VALUES (1, '[1,1,1,1]'), (2, '[2,2,2,2]')")
        c.close()
        copy = os.path.join(self.dir, "copy.db")
        shutil.copyfile(self.db, copy)
        c = connect(copy)
        self.assertEqual(c.execute("SELECT count(*) FROM item").fetchone()[0], 2)
        c.execute("DROP TABLE item")
        c.close()
        c = connect(self.db)
        self.assertEqual(c.execute("SELECT count(*) FROM item").fetchone()[0], 2)
        # and the original's DROP, the last user, removes it
        c.execute("DROP TABLE item")
        c.close()
        self.assertFalse(os.path.exists(os.path.join(self.dir, "item.embkv")))


class SchemaNames(TempDirTest):
    def test_attached_tables_by_schema(self):
        c = connect(self.db)
        c.execute("ATTACH ? AS o", (os.path.join(self.dir, "other.db"),))
        emb = ekt.Embedding(c, "o.item", dim=4, optimizer="sgd", lr=0.1, init="zeros")
        self.assertEqual(emb(torch.tensor([3, 4])).tolist(), [[0] * 4] * 2)
        self.assertEqual(c.execute("SELECT name FROM o.sqlite_schema WHERE name = 'item'").fetchone(), ("item",))
        self.assertIsNone(c.execute("SELECT name FROM main.sqlite_schema WHERE name LIKE '%item%'").fetchone())
        for name in ("o.item", '"o"."item"', "[o].item", "O.ITEM"):
            self.assertEqual(json.loads(c.execute("SELECT embkv_stats(?)", (name,)).fetchone()[0])["dim"], 4, name)
        self.assertEqual(c.execute("SELECT count(*) FROM o.item").fetchone()[0], 2)
        # a table named with a dot, quoted
        c.execute('CREATE VIRTUAL TABLE "a.b" USING embkv(dim=3)')
        self.assertEqual(json.loads(c.execute("SELECT embkv_stats(?)", ('"a.b"',)).fetchone()[0])["dim"], 3)
        with self.assertRaisesRegex(sqlite3.OperationalError, r"^embkv_stats: no such table: nope\.item$"):
            c.execute("SELECT embkv_stats('nope.item')")
        # the module again on the existing attached table, options checked by name
        again = ekt.Embedding(c, "o.item", optimizer="sgd")
        self.assertEqual(again.embedding_dim, 4)
        with self.assertRaisesRegex(ValueError, r"^embkv.torch: table 'o.item' exists with other options: option "
                                                r"optimizer: .*") as cm:
            ekt.Embedding(c, "o.item", optimizer="adagrad")
        self.assertNotIn("_embkv_torch_check", str(cm.exception))
        c.close()


if __name__ == "__main__":
    unittest.main()
