#!/usr/bin/env python3
"""The CTR model of pysample/train_ctr.py with its table sharded over the
ranks of a torch.distributed job (--dist, gloo on 127.0.0.1, launched with
torchrun), against the same run in one process (embkv.torch) and with
torch.nn.Embedding in memory: examples/s, held-out AUC, bytes sent to other
ranks per example and the time a step spends in the all-to-alls, with 1, 2
and 4 ranks, and with 2 ranks keeping rows read from the other rank for up
to 4 steps (HET's cache).  Same data, seed and global batch (512) in every
run.

    python bench/bench_dist.py [--train-rows N] [--out DIR]

with the embkv package installed (`make bench` uses build/venv/bin/python).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from bench_ctr import run as single  # one process: train_ctr.py as bench_ctr.py runs it

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "pysample", "train_ctr.py")
ENV = dict(os.environ, PYTHONSAFEPATH="1")


def last_json(text, what):
    lines = [line.split("]:", 1)[-1] for line in text.splitlines() if "{" in line]
    lines = [x for x in lines if x.startswith("{")]
    if not lines:
        sys.exit("bench_dist: %s printed no result:\n%s" % (what, text[-3000:]))
    return json.loads(lines[-1])


def dist(db, ranks, logs, *extra):
    shutil.rmtree(db + ".dist", ignore_errors=True)
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=%d" % ranks, "-r", "1",
                        "-t", "1", "--log_dir", logs, SCRIPT, "--dist", "--db", db, "--json"] + list(extra),
                       capture_output=True, text=True, env=ENV)
    if r.returncode:
        sys.exit("bench_dist: torchrun with %d ranks failed: %s" % (ranks, (r.stdout + r.stderr)[-3000:]))
    return last_json(r.stdout, "torchrun")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-rows", default="200000")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    d = args.out or tempfile.mkdtemp(prefix="embkv-bench-dist-")
    os.makedirs(d, exist_ok=True)
    db = os.path.join(d, "data.db")
    size = ["--train-rows", args.train_rows, "--checkpoint-every", "100"]
    mem = single(db, "--fresh", "--memory", *size)
    import embkv
    c = embkv.connect(db)
    c.execute("DROP TABLE IF EXISTS emb")
    c.close()
    one = single(db, *size)
    print("CTR model, %s training rows, global batch 512, 1 epoch, checkpoint every 100 batches; best "
          "achievable AUC %.4f; %d cores" % (args.train_rows, mem["best_auc"], os.cpu_count()))
    print("%-40s %11s %8s %13s %13s %7s" % ("", "examples/s", "AUC", "bytes/example", "a2a ms/step", "ratio"))
    print("%-40s %11.0f %8.4f %13s %13s %7s" % ("torch in memory, 1 process", mem["examples_per_s"], mem["auc"],
                                                 "-", "-", "%.2fx" % (mem["examples_per_s"] / one["examples_per_s"])))
    print("%-40s %11.0f %8.4f %13s %13s %7s" % ("embkv.torch, 1 process", one["examples_per_s"], one["auc"], "-",
                                                 "-", "1.00x"))
    runs = [(1, 0), (2, 0), (4, 0), (2, 4)]
    for ranks, cache in runs:
        r = dist(db, ranks, os.path.join(d, "logs-%d-%d" % (ranks, cache)), *(size + ["--dist-cache", str(cache)]))
        name = "embkv.distributed, %d rank%s" % (ranks, "s" if ranks > 1 else "")
        if cache:
            name += ", local cache %d steps" % cache
        print("%-40s %11.0f %8.4f %13.0f %13.1f %7s" % (
            name, r["examples_per_s"], r["auc"], r["bytes_per_example"], r["exchange_ms_per_step"],
            "%.2fx" % (r["examples_per_s"] / one["examples_per_s"])))
    if not args.out:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
