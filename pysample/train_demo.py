#!/usr/bin/env python3
"""embkv from Python: the standard sqlite3 module plus numpy.

    python pysample/train_demo.py          # the embkv package installed (docs/install.md)
    pysample/run.sh pysample/train_demo.py # or: with build/venv (make venv)

What it shows, in order:
  1. loading the extension (conn.load_extension, no entry-point argument);
  2. creating an embedding table and inserting numpy float32 vectors as BLOBs;
  3. pulling one training batch in one query,
         SELECT id, vec FROM t WHERE id IN (SELECT value FROM json_each(?))
     which embkv serves with one batched lookup, and np.frombuffer on the BLOBs;
  4. similarities: numpy on the batch, and the same in SQL with embkv_cosine;
  5. a toy SGD step written back with UPDATE, then embkv_checkpoint.

Options: --ext PATH (the extension; default embkv.find_extension() of the
installed embkv package: $EMBKV_EXT, else the copy installed with it),
--rows N, --dim D.

It needs a Python whose sqlite3 module can load extensions.  Debian's
/usr/bin/python3 can (numpy comes from the python3-numpy package); Pythons
built without extension loading (pyenv's default build, for instance) cannot,
and the script then exits with a message that says so.
"""
import argparse
import json
import os
import sqlite3
import sys
import tempfile

def refuse(msg):
    sys.stderr.write("train_demo.py: %s\n" % msg)
    sys.exit(2)


def check_python():
    """Fail early, and clearly, on a Python that cannot run the sample."""
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        refuse(
            "this Python's sqlite3 module cannot load extensions (%s was built "
            "without SQLite extension loading). Run the sample with /usr/bin/python3 "
            "(Debian's python3, plus the python3-numpy package), or any Python whose "
            "sqlite3 supports enable_load_extension()." % sys.executable
        )
    try:
        import numpy  # noqa: F401
    except ImportError:
        refuse(
            "numpy is not installed for %s. Run the sample with /usr/bin/python3 after "
            "`apt-get install python3-numpy`." % sys.executable
        )


def default_extension():
    """The extension the installed embkv package would load."""
    try:
        import embkv
    except ImportError as e:
        refuse("the embkv package cannot be imported (%s): install it for %s (docs/install.md), or name the "
               "extension with --ext PATH" % (e, sys.executable))
    try:
        return embkv.find_extension()
    except embkv.EmbkvError as e:
        refuse(str(e))


def connect(db_path, ext):
    conn = sqlite3.connect(db_path)
    conn.enable_load_extension(True)
    try:
        conn.load_extension(ext)
    except sqlite3.OperationalError as e:
        refuse("cannot load the embkv extension from %s: %s (build it with `make`, or name another with --ext)"
               % (ext, e))
    finally:
        conn.enable_load_extension(False)  # no further extension loading through SQL
    return conn


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ext", default=None, help="the extension (default: the installed embkv package's)")
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=16)
    args = ap.parse_args()
    check_python()
    import numpy as np
    ext = args.ext or default_extension()

    with tempfile.TemporaryDirectory(prefix="embkv-pysample-") as tmp:
        conn = connect(os.path.join(tmp, "demo.db"), ext)
        version = conn.execute("SELECT embkv_version()").fetchone()[0]
        print("embkv %s loaded into SQLite %s" % (version, sqlite3.sqlite_version))

        # 2. A table of `rows` vectors of `dim` floats, stored in its own directory.
        store = os.path.join(tmp, "item.embkv").replace("'", "''")
        conn.execute("CREATE VIRTUAL TABLE item USING embkv(dim=%d, path='%s')" % (args.dim, store))
        rng = np.random.default_rng(42)
        table = rng.standard_normal((args.rows, args.dim)).astype("<f4")  # float32 little-endian
        with conn:  # one transaction: COMMIT makes the rows durable
            conn.executemany("INSERT INTO item(id, vec) VALUES (?, ?)",
                             ((i, table[i].tobytes()) for i in range(args.rows)))
        print("inserted %d vectors of dim %d" % (conn.execute("SELECT count(*) FROM item").fetchone()[0],
                                                 args.dim))

        # 3. One batch (ids may repeat in a real batch; rows come back once per id
        #    present, in no particular order, so index them by id).
        batch = [7, 3, 512, 99, 3 % args.rows, 250]
        ids = list(dict.fromkeys(i % args.rows for i in batch))
        rows = conn.execute("SELECT id, vec FROM item WHERE id IN (SELECT value FROM json_each(?))",
                            (json.dumps(ids),)).fetchall()
        got = {i: np.frombuffer(v, dtype="<f4") for i, v in rows}
        x = np.stack([got[i] for i in ids])  # (len(ids), dim), in batch order
        assert x.shape == (len(ids), args.dim)
        assert np.array_equal(x, table[ids]), "batch differs from what was inserted"
        print("pulled a batch of %d ids in one query; vectors match bit for bit" % len(ids))

        # 4. Cosine similarity of the batch's first row to every row: numpy ...
        q = x[0].astype(np.float64)
        t64 = table.astype(np.float64)
        cos = t64 @ q / (np.linalg.norm(t64, axis=1) * np.linalg.norm(q))
        top_np = [int(i) for i in np.argsort(-cos, kind="stable")[:5]]
        # ... and the same in SQL, with the query vector bound as a BLOB.
        top_sql = conn.execute(
            "SELECT id, embkv_cosine(vec, ?1) AS c FROM item ORDER BY c DESC, id LIMIT 5",
            (x[0].tobytes(),)).fetchall()
        assert [i for i, _ in top_sql] == top_np, (top_sql, top_np)
        assert all(abs(c - cos[i]) < 1e-12 for i, c in top_sql)
        print("top-5 by cosine to id %d: %s" % (ids[0], ", ".join("%d (%.4f)" % (i, c) for i, c in top_sql)))
        print("numpy and embkv_cosine agree")

        # 5. A toy SGD step: pull the batch toward the query vector, push it back.
        lr = 0.1
        grad = x - x[0]                      # d/dx of 0.5 * |x - q|^2
        new = (x - lr * grad).astype("<f4")
        with conn:
            conn.executemany("UPDATE item SET vec = ? WHERE id = ?",
                             ((new[k].tobytes(), i) for k, i in enumerate(ids)))
        conn.execute("SELECT embkv_checkpoint('item')").fetchone()
        back = dict(conn.execute("SELECT id, vec FROM item WHERE id IN (SELECT value FROM json_each(?))",
                                 (json.dumps(ids),)).fetchall())
        assert all(np.array_equal(np.frombuffer(back[i], dtype="<f4"), new[k]) for k, i in enumerate(ids))
        clocks = [c for (c,) in conn.execute("SELECT clock FROM item WHERE id IN (SELECT value FROM json_each(?))",
                                             (json.dumps(ids[:2]),))]
        mean = np.frombuffer(conn.execute(
            "SELECT embkv_avg(vec) FROM item WHERE id IN (SELECT value FROM json_each(?))",
            (json.dumps(ids),)).fetchone()[0], dtype="<f4")
        assert np.allclose(mean, new.astype(np.float64).mean(axis=0), rtol=0, atol=1e-6)
        print("SGD step written back and checkpointed; clocks now %s" % sorted(clocks))
        conn.close()
    print("ok")


if __name__ == "__main__":
    main()
