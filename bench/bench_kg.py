#!/usr/bin/env python3
"""The TransE step of pysample/train_kg.py (WordNet, batches of 2048
triples with 16 corrupted each, dim 64, adagrad): embkv.torch against
torch.nn.Embedding(sparse=True) + torch.optim.Adagrad on the same batches,
measured two ways in one run:

- alternating: one embkv step, then one torch step, as train_kg.py
  --memory measures (each step starts with the other's data in the caches);
- in blocks: 50 embkv steps, then 50 torch steps (each with the machine's
  caches to itself), three times;

with torch's own thread count (torch.get_num_threads(): one per core), then
with torch on 2 threads (its kernels faster; embkv's push uses two threads
from 8,192 rows on in either case).

    python bench/bench_kg.py DIR [--steps 50]

with the embkv package installed (docs/install.md; `make bench` uses
build/venv/bin/python) and Debian's wordnet-base.  DIR holds the database.
"""
import argparse
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "pysample"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import embkv  # noqa: E402
import embkv.torch as ekt  # noqa: E402
import train_kg as kg  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--wordnet", default=kg.WORDNET)
    a = ap.parse_args()
    if not os.path.isdir(a.wordnet):
        sys.exit("bench_kg: %s missing: install Debian's wordnet-base (make deps)" % a.wordnet)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    synsets, rels, triples = kg.load_wordnet(a.wordnet)
    n_ent, n_rel = len(synsets), len(rels)
    conn = embkv.connect(os.path.join(a.dir, "kg.db"))
    ent = ekt.Embedding(conn, "entity", dim=64, optimizer="adagrad", lr=0.3, init="normal(0,0.1)", capacity=n_ent)
    rel = ekt.Embedding(conn, "relation", dim=64, optimizer="adagrad", lr=0.3, init="normal(0,0.1)")
    base = kg.TorchTables(n_ent, n_rel, 64, 0.3, 1)
    rng = np.random.default_rng(1)
    order = rng.permutation(len(triples))
    batch, neg = 2048, 16

    def batches(n):
        out = []
        for i in range(n):
            b = triples[order[(i * batch) % (len(triples) - batch):][:batch]]
            h, r, t = (torch.from_numpy(np.ascontiguousarray(b[:, j])) for j in range(3))
            out.append((h, r, t, torch.from_numpy(rng.integers(0, n_ent, (batch, neg))),
                        torch.from_numpy(rng.random((batch, neg)) < 0.5)))
        return out

    def step_embkv(x):
        h, r, t, c, nh = x
        kg.transe_loss(ent(h), rel(r), ent(t), ent(c), nh, 4.0, 1e-4).backward()

    def step_torch(x):
        h, r, t, c, nh = x
        base.step(kg.transe_loss(base.ent(h), base.rel(r), base.ent(t), base.ent(c), nh, 4.0, 1e-4))

    data = batches(a.steps)
    for x in data[:10]:  # every entity's row created, torch's state allocated
        step_embkv(x)
        step_torch(x)
    for threads in (torch.get_num_threads(), 2):
        torch.set_num_threads(threads)
        te = tt = 0.0
        for x in data:
            s = time.perf_counter()
            step_embkv(x)
            te += time.perf_counter() - s
            s = time.perf_counter()
            step_torch(x)
            tt += time.perf_counter() - s
        n = len(data)
        print("TransE step on WordNet (%d entities), batch %d x (1 + %d corrupted), dim 64, adagrad, torch on %d "
              "thread(s)" % (n_ent, batch, neg, threads))
        print("  alternating:  embkv.torch %.1f ms a step, torch in memory %.1f ms: embkv at %.2fx"
              % (1e3 * te / n, 1e3 * tt / n, tt / te))
        for rep in range(3):
            s = time.perf_counter()
            for x in data:
                step_embkv(x)
            te = time.perf_counter() - s
            s = time.perf_counter()
            for x in data:
                step_torch(x)
            tt = time.perf_counter() - s
            print("  blocks of %d: embkv.torch %.1f ms a step, torch in memory %.1f ms: embkv at %.2fx"
                  % (n, 1e3 * te / n, 1e3 * tt / n, tt / te))
    conn.close()
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
