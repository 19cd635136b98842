#!/usr/bin/env python3
"""The CTR model of pysample/train_ctr.py, same data and seed in every run:
embkv-backed embeddings against torch.nn.Embedding in memory (sparse
Adagrad, the same initial rows), then one worker with the table's rows in
each dtype (f16, bf16, i8; nearest and stochastic rounding) against f32,
then HET's table: 2 and 4 worker threads at staleness 0, 1, 4, 16 and
unlimited, examples/s and held-out AUC (BENCH_CTR_DTYPE_ONLY=1 stops after
the dtypes).

    python bench/bench_ctr.py [--train-rows N] [--out DIR]

with the embkv package installed (docs/install.md; `make bench` uses
build/venv/bin/python, where `make venv` installs it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "pysample", "train_ctr.py")
# The sample's directory stays off sys.path: it imports the installed embkv
# package, not pysample/embkv beside it.
SAMPLE_ENV = dict(os.environ, PYTHONSAFEPATH="1")


def run(db, *extra):
    out = subprocess.run([sys.executable, SCRIPT, "--db", db, "--quiet", "--json", "--eval-every", "0"] + list(extra),
                         capture_output=True, text=True, env=SAMPLE_ENV)
    if out.returncode:
        sys.exit("bench_ctr: train_ctr.py failed: %s" % out.stderr[-2000:])
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-rows", default="400000")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    d = args.out or tempfile.mkdtemp(prefix="embkv-bench-ctr-")
    os.makedirs(d, exist_ok=True)
    size = ["--train-rows", args.train_rows]
    db = os.path.join(d, "data.db")
    mem = run(db, "--fresh", "--memory", *size)
    print("CTR model, %s training rows, batch 512, 1 epoch; best achievable AUC %.4f" % (args.train_rows,
                                                                                       mem["best_auc"]))
    print("%-34s %12s %9s" % ("", "examples/s", "AUC"))
    print("%-34s %12.0f %9.4f" % ("torch in memory, 1 worker", mem["examples_per_s"], mem["auc"]))

    def fresh_embkv(workers, staleness, *extra):
        # Same data: drop the table and the checkpoints, keep the samples.
        import embkv
        c = embkv.connect(db)
        c.execute("DROP TABLE IF EXISTS emb")
        c.close()
        for f in os.listdir(d):
            if ".dense-" in f:
                os.remove(os.path.join(d, f))
        return run(db, "--workers", str(workers), "--staleness", str(staleness), *size, *extra)

    one = fresh_embkv(1, 0)
    print("%-34s %12.0f %9.4f" % ("embkv, 1 worker, staleness 0", one["examples_per_s"], one["auc"]))
    print("embkv/memory: examples/s %.2fx, AUC difference %+.4f" % (one["examples_per_s"] / mem["examples_per_s"],
                                                                     one["auc"] - mem["auc"]))
    print()
    print("1 worker, staleness 0, by dtype (the table's rows; adagrad's state float32):")
    print("%-22s %12s %9s %14s" % ("dtype", "examples/s", "AUC", "AUC vs f32"))
    print("%-22s %12.0f %9.4f %+14.4f" % ("f32", one["examples_per_s"], one["auc"], 0.0))
    for dt, rounding in (("f16", "nearest"), ("f16", "stochastic"), ("bf16", "nearest"), ("bf16", "stochastic"),
                         ("i8", "nearest"), ("i8", "stochastic")):
        r = fresh_embkv(1, 0, "--dtype", dt, "--rounding", rounding)
        print("%-22s %12.0f %9.4f %+14.4f" % (dt + ", " + rounding, r["examples_per_s"], r["auc"],
                                              r["auc"] - one["auc"]))
        sys.stdout.flush()
    if os.environ.get("BENCH_CTR_DTYPE_ONLY"):
        return
    print()
    print("%-10s %-10s %12s %9s" % ("workers", "staleness", "examples/s", "AUC"))
    for w in (2, 4):
        for s in ("0", "1", "4", "16", "unlimited"):
            r = fresh_embkv(w, s)
            print("%-10d %-10s %12.0f %9.4f" % (w, s, r["examples_per_s"], r["auc"]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
