"""pysample/train_ctr.py: the CTR model trains well above chance, its SQL
AUC agrees with numpy's, and a run killed with SIGKILL resumes from its last
checkpoint to exactly the rows of a run that was never killed."""
import os
import signal
import subprocess
import sys
import time
import unittest

import numpy as np

from embkv_test import REPO, TempDirTest, connect

SCRIPT = os.path.join(REPO, "pysample", "train_ctr.py")
# The sample's directory stays off sys.path: it imports the installed embkv
# package, as for a user, not pysample/embkv beside it.
SAMPLE_ENV = dict(os.environ, PYTHONSAFEPATH="1")
SMALL = ["--train-rows", "20000", "--test-rows", "5000", "--vocab-scale", "0.1", "--batch", "256",
         "--epochs", "2", "--quiet", "--json", "--eval-every", "0"]


def run(db, *extra, check=True):
    out = subprocess.run([sys.executable, SCRIPT, "--db", db] + SMALL + list(extra), capture_output=True, text=True,
                         timeout=600, env=SAMPLE_ENV)
    if check and out.returncode != 0:
        raise AssertionError("train_ctr.py failed: %s" % out.stderr[-3000:])
    return out


def result(out):
    import json
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def table_rows(db):
    c = connect(db)
    try:
        rows = c.execute("SELECT id, vec, clock FROM emb ORDER BY id").fetchall()
    finally:
        c.close()
    return rows


class TestCtr(TempDirTest):
    def test_trains_well_above_chance(self):
        untrained = result(run(os.path.join(self.dir, "u.db"), "--max-batches", "0"))
        res = result(run(self.db, "--workers", "2", "--staleness", "2"))
        self.assertEqual(res["batches"], 2 * (20000 // 256))
        self.assertGreater(res["auc"], 0.72)
        self.assertGreater(res["auc"], untrained["auc"] + 0.15)
        self.assertLessEqual(res["auc"], res["best_auc"] + 0.01)
        self.assertAlmostEqual(res["auc"], res["sql_auc"], places=9)

    def test_resume_refuses_other_settings(self):
        run(self.db, "--max-batches", "10", "--checkpoint-every", "5")
        for extra, want in ((["--lr", "0.5"], "made with --lr 0.05, not 0.5"),
                            (["--batch", "128"], "made with --batch 256, not 128"),
                            (["--seed", "8"], "generated with --seed 7, not 8")):
            out = run(self.db, "--max-batches", "1", *extra, check=False)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn(want, out.stderr)
        out = run(self.db, "--max-batches", "1", "--test-rows", "1", check=False)
        self.assertEqual(out.returncode, 2)
        self.assertIn("--test-rows at least 2", out.stderr)

    def test_resume_after_sigkill_matches_an_uninterrupted_run(self):
        target = 60
        ref_db = os.path.join(self.dir, "ref.db")
        run(ref_db, "--max-batches", str(target))
        want = table_rows(ref_db)
        p = subprocess.Popen([sys.executable, SCRIPT, "--db", self.db] + SMALL + ["--checkpoint-every", "7"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=SAMPLE_ENV)
        deadline = time.time() + 120
        # Kill it once two checkpoints are behind it, in the middle of work:
        # dense-3 is written only after checkpoint 2 committed (with
        # dense-2 the kill could land inside checkpoint 2, found once under
        # ASan in CI).
        while time.time() < deadline and not any(f.startswith("test.db.dense-3") for f in os.listdir(self.dir)):
            time.sleep(0.02)
        time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.assertEqual(p.returncode, -signal.SIGKILL)
        c = connect(self.db)
        gen, done = (int(x) for x in np.frombuffer(
            c.execute("SELECT vec FROM emb WHERE id = -1").fetchone()[0], np.float32)[:2])
        c.close()
        self.assertGreaterEqual(gen, 2)
        self.assertEqual(done % 7, 0)
        self.assertLess(done, target)
        res = result(run(self.db, "--max-batches", str(target - done)))
        self.assertEqual(res["done"], target)
        got = table_rows(self.db)
        self.assertEqual(len(got), len(want))
        # The position row differs (generations); every embedding row must not.
        pairs = [(g, w) for g, w in zip(got, want) if g[0] != -1]
        self.assertEqual([g[0] for g, _ in pairs], [w[0] for _, w in pairs])
        self.assertEqual([g[2] for g, _ in pairs], [w[2] for _, w in pairs])
        gv = np.stack([np.frombuffer(g[1], np.float32) for g, _ in pairs])
        wv = np.stack([np.frombuffer(w[1], np.float32) for _, w in pairs])
        np.testing.assert_allclose(gv, wv, rtol=1e-5, atol=1e-6)


if __name__ == "__main__":
    unittest.main()
