"""The samples work: pysample/train_demo.py with the installed embkv package
(and its refusal on a Python that cannot load extensions), sql/demo.sh
(`make demo`) and sql/analytics.sh (its output against
tests/python/analytics.expected, and its numbers against an independent
numpy recomputation of the same synthetic dataset); pysample/train_kg.py on
WordNet for a few steps (one update a step, embkv_knn's ranks equal to
numpy's) and sql/kg.sql over its database.

Standard library unittest; numpy where available.  Run by tests/run.sh, or
by hand: tests/python_run.sh tests/python/test_samples.py
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SAMPLE = os.path.join(REPO, "pysample", "train_demo.py")
SYSTEM_PY = "/usr/bin/python3"
# A sample's directory stays off sys.path: it imports the installed embkv
# package, as for a user, not pysample/embkv beside it.
SAMPLE_ENV = dict(os.environ, PYTHONSAFEPATH="1")
PROBE = ("import sqlite3, sys; "
         "sys.exit(0 if hasattr(sqlite3.Connection, 'enable_load_extension') else 3)")

try:
    import numpy as np
except ImportError:  # pragma: no cover - Debian's python3-numpy is a dependency
    np = None


def run(cmd, **kw):
    kw.setdefault("timeout", 600)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, **kw)


def python_without_load_extension():
    """A Python interpreter on this machine whose sqlite3 cannot load
    extensions (e.g. a pyenv build), or None: PATH entries first, then
    pyenv's versions."""
    seen = set()
    cands = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        cands += sorted(glob.glob(os.path.join(d, "python3")) + glob.glob(os.path.join(d, "python3.[0-9]*")))
    home = os.path.expanduser("~")
    cands += sorted(glob.glob(os.path.join(os.environ.get("PYENV_ROOT", os.path.join(home, ".pyenv")),
                                           "versions", "*", "bin", "python3")))
    for c in cands:
        if not os.access(c, os.X_OK) or c.endswith("-config"):
            continue
        key = os.path.realpath(c)
        if key in seen or key == os.path.realpath(SYSTEM_PY):
            continue
        seen.add(key)
        try:
            r = subprocess.run([c, "-c", PROBE], capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 3:
            return c
    return None


class TrainDemo(unittest.TestCase):
    def test_runs_with_the_installed_package(self):
        r = run([sys.executable, SAMPLE], env=SAMPLE_ENV)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = r.stdout.splitlines()
        self.assertRegex(out[0], r"^embkv 0\.1\.0 loaded into SQLite 3\.\d+\.\d+$")
        self.assertIn("inserted 1000 vectors of dim 16", out)
        self.assertIn("pulled a batch of 5 ids in one query; vectors match bit for bit", out)
        # the query row is its own nearest neighbour, with cosine exactly 1
        self.assertTrue(any(l.startswith("top-5 by cosine to id 7: 7 (1.0000), ") for l in out), out)
        self.assertIn("numpy and embkv_cosine agree", out)
        self.assertIn("SGD step written back and checkpointed; clocks now [1, 1]", out)
        self.assertEqual(out[-1], "ok")

    def check_refusal(self, r):
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("cannot load extensions", r.stderr)
        self.assertIn("/usr/bin/python3", r.stderr)

    def test_refusal_simulated(self):
        # Always runs: the sample under this Python, with a sqlite3 module
        # whose Connection lacks enable_load_extension.
        code = (
            "import runpy, sys, types\n"
            "fake = types.ModuleType('sqlite3')\n"
            "class Connection: pass\n"
            "fake.Connection = Connection\n"
            "sys.modules['sqlite3'] = fake\n"
            "sys.argv = [%r]\n"
            "runpy.run_path(%r, run_name='__main__')\n" % (SAMPLE, SAMPLE))
        self.check_refusal(run([sys.executable, "-c", code]))

    def test_refusal_real_python(self):
        py = python_without_load_extension()
        if not py:
            self.skipTest("no python3 without sqlite3 extension loading on this machine")
        self.check_refusal(run([py, SAMPLE]))


class ShellDemos(unittest.TestCase):
    def setUp(self):
        if not shutil.which("sqlite3"):
            self.skipTest("no sqlite3 shell")

    def test_demo(self):
        r = run(["bash", os.path.join(REPO, "sql", "demo.sh")])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stderr, "")
        out = r.stdout
        # count after the fill, and after the rolled-back DELETE
        self.assertRegex(out, r"│ rows │\n├─+┤\n│ 1000 │")
        self.assertRegex(out, r"│ rows_inside_transaction │\n├─+┤\n│ 900 +│")
        self.assertRegex(out, r"│ rows_after_rollback │\n├─+┤\n│ 1001 +│")
        self.assertIn("[2,0,0,0,0,0,0,0]", out)
        # the five nearest neighbours of row 42 are all in its cluster (2)
        top = out.split("ORDER BY cosine DESC, id LIMIT 5;", 1)[1].split("-- 7.", 1)[0]
        clusters = re.findall(r"^│ +\d+ +│ +(\d+) +│ +[-0-9.]+ +│$", top, re.M)
        self.assertEqual(clusters, ["2"] * 5, top)

    def test_analytics_output(self):
        r = run(["bash", os.path.join(REPO, "sql", "analytics.sh")])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stderr, "")
        with open(os.path.join(HERE, "analytics.expected")) as f:
            expected = f.read()
        self.assertEqual(r.stdout, expected)

    @unittest.skipIf(np is None, "numpy is missing")
    def test_analytics_numbers_independently(self):
        """Recompute the analytics dataset with numpy from the formulas in
        sql/analytics.sql and check analytics.expected against it, the AUC
        by counting all (click, non-click) pairs rather than by ranks."""
        dim = 16

        def h(x):  # element hash of analytics.sql, exact in Python integers
            return ((x * 2654435761 % 4294967291) % 2001) / 1000.0 - 1.0

        def table(n, salt):
            rows = np.zeros((n + 1, dim), dtype=np.float32)
            for i in range(1, n + 1):
                for j in range(dim):
                    x = 0.5 * h(1000000 + (i % 8) * 16 + j) + 0.3 * h(salt + i * 16 + j)
                    # json_group_array writes the double with 15 significant
                    # digits; embkv_vec reads it and rounds to float32
                    rows[i, j] = np.float32(float("%.15g" % x))
            return rows

        users, items = table(200, 2000000), table(500, 3000000)
        U64, I64 = users.astype(np.float64), items.astype(np.float64)
        imp, scores, labels = [], [], []
        for u in range(1, 201):
            for s in range(40):
                i = (37 * u + 101 * s) % 500 + 1
                d = 0.0
                for j in range(dim):  # element order, in double, as embkv_dot
                    d += U64[u, j] * I64[i, j]
                p = 0.5 + 0.5 * (2 * d) / (1 + abs(2 * d))
                lab = int(((u * 1000003 + i) * 2654435761 % 4294967291) / 4294967291.0 < p)
                imp.append((u, i))
                scores.append(d)
                labels.append(lab)
        scores, labels = np.array(scores), np.array(labels)
        pos, neg = scores[labels == 1], scores[labels == 0]
        gt = (pos[:, None] > neg[None, :]).sum()
        eq = (pos[:, None] == neg[None, :]).sum()
        auc = (gt + 0.5 * eq) / (len(pos) * len(neg))

        with open(os.path.join(HERE, "analytics.expected")) as f:
            exp = f.read()
        sections = {m.group(1): [l.split("|") for l in m.group(2).strip().splitlines()[1:]]
                    for m in re.finditer(r"^-- (\d)\. [^\n]*\n(.*?)(?=^-- \d\.|\Z)", exp, re.M | re.S)}

        def same(row, want):
            """row: printed fields; want: ints (exact) and floats (equal to
            the printed decimals, up to the last digit's rounding)."""
            self.assertEqual(len(row), len(want), (row, want))
            for got, w in zip(row, want):
                if isinstance(w, float):
                    decimals = len(got.split(".")[1])
                    self.assertLessEqual(abs(float(got) - w), 0.5 * 10 ** -decimals + 1e-12, (row, want))
                else:
                    self.assertEqual(int(got), int(w), (row, want))

        same(sections["1"][0], [200, 500, 8000, labels.sum(), float(labels.mean())])
        first5 = sorted(range(len(imp)), key=lambda k: imp[k])[:5]
        for row, k in zip(sections["2"], first5):
            same(row, [imp[k][0], imp[k][1], labels[k], float(scores[k])])
        self.assertEqual(len(sections["2"]), 5)
        same(sections["3"][0], [0, len(neg), float(neg.mean())])
        same(sections["3"][1], [1, len(pos), float(pos.mean())])
        same(sections["4"][0], [len(pos), len(neg), float(auc)])
        cos = I64[1:] @ I64[1] / (np.linalg.norm(I64[1:], axis=1) * np.linalg.norm(I64[1]))
        order = [k + 1 for k in np.argsort(-cos, kind="stable") if k + 1 != 1][:5]
        self.assertEqual(len(sections["5"]), 5)
        for row, k in zip(sections["5"], order):
            same(row, [k, k % 8, float(cos[k - 1])])
        self.assertEqual([r[0] for r in sections["6"][:3]], ["1", "2", "3"])
        for row in sections["6"][:3]:
            u = int(row[0])
            clicked = [i for (uu, i), lab in zip(imp, labels) if uu == u and lab]
            prof = I64[clicked].mean(axis=0).astype(np.float32).astype(np.float64)
            c = prof @ U64[u] / (np.linalg.norm(prof) * np.linalg.norm(U64[u]))
            same(row, [u, len(clicked), dim, float(np.linalg.norm(prof)), float(c)])

class KnowledgeGraph(unittest.TestCase):
    """pysample/train_kg.py on WordNet, briefly (20 steps), then
    sql/kg.sql over what it left."""

    def setUp(self):
        if not os.path.exists("/usr/share/wordnet/data.noun"):
            self.skipTest("Debian's wordnet-base is not installed (`make deps` installs it)")
        self.dir = tempfile.mkdtemp(prefix="embkv-kg-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_train_and_sql(self):
        db = os.path.join(self.dir, "kg.db")
        r = run([sys.executable, os.path.join(REPO, "pysample", "train_kg.py"), "--db", db, "--max-steps", "20",
                 "--batch", "512", "--neg", "4", "--test", "300", "--eval-k", "20", "--memory", "--lr", "0.3"],
                env=SAMPLE_ENV)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        out = r.stdout
        self.assertIn("WordNet: 95882 synsets, 20 relations, 256995 triples", out)
        # One update a step: the relation rows (in every step) tick once per step.
        self.assertIn("clock of the relation rows: at most 20 (one update a step: 20 steps)", out)
        m = re.search(r"(\d+) of (\d+) ranks as numpy finds them", out)
        self.assertIsNotNone(m, out)
        self.assertEqual(m.group(1), m.group(2), out)  # embkv_knn's ranks are numpy's
        self.assertRegex(out, r"torch: +filtered MRR")
        self.assertTrue(os.path.exists(db + ".png"))
        if not shutil.which("sqlite3"):
            return
        with open(os.path.join(REPO, "sql", "kg.sql")) as f:
            r = run(["sqlite3", "-cmd", ".load " + os.path.join(REPO, "build", "embkv"), db], input=f.read())
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertIn("hypernym", r.stdout)
        self.assertIn("held_out  hits_at_10", r.stdout)


if __name__ == "__main__":
    unittest.main()
