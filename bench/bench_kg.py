#!/usr/bin/env python3
"""The TransE step of pysample/train_kg.py (WordNet, batches of 2048
triples with 16 corrupted each, dim 64, adagrad): embkv.torch, without
and with a DRAM cache that holds the entity table, against
torch.nn.Embedding(sparse=True) + torch.optim.Adagrad on the same batches,
measured two ways in one run:

- alternating: one step of each in turn, as train_kg.py --memory measures
  (each step starts with the others' data in the caches);
- in blocks: 50 steps of one, then 50 of the next (each with the
  machine's caches to itself), three times;

with torch's own thread count (torch.get_num_threads()), then with torch
on 2 threads (its kernels faster; embkv's push uses two threads from
8,192 rows on in either case).  Each reports the median step and the
fastest: on a shared machine single steps take up to 10x the usual.  All
of it twice, in two processes: with glibc's allocator as it is, and
keeping freed memory (train_kg.keep_freed_memory, for both models: page
faults of fresh buffers otherwise cost both about as much as their work
on the development VM).

    python bench/bench_kg.py DIR [--steps 50] [--malloc both|default|keep]

with the embkv package installed (docs/install.md; `make bench` uses
build/venv/bin/python) and Debian's wordnet-base.  DIR holds the database.
"""
import argparse
import os
import shutil
import statistics
import subprocess
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
    ap.add_argument("--malloc", choices=("both", "default", "keep"), default="both",
                    help="glibc's allocator as it is, or keeping freed memory (train_kg.keep_freed_memory: "
                         "for both models); both: one run of each, in two processes")
    a = ap.parse_args()
    if a.malloc == "both":
        for how in ("default", "keep"):
            r = subprocess.run([sys.executable, os.path.abspath(__file__), a.dir, "--steps", str(a.steps),
                                "--wordnet", a.wordnet, "--malloc", how])
            if r.returncode:
                sys.exit(r.returncode)
        return
    if a.malloc == "keep" and not kg.keep_freed_memory():
        sys.exit("bench_kg: glibc refused mallopt (keep_freed_memory)")
    print("glibc's allocator: %s" % ("keeps freed memory (train_kg.keep_freed_memory)" if a.malloc == "keep"
                                      else "as it is (freed blocks over 128 KiB go back to the kernel)"))
    if not os.path.isdir(a.wordnet):
        sys.exit("bench_kg: %s missing: install Debian's wordnet-base (make deps)" % a.wordnet)
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    synsets, rels, triples = kg.load_wordnet(a.wordnet)
    n_ent, n_rel = len(synsets), len(rels)
    conn = embkv.connect(os.path.join(a.dir, "kg.db"))
    opts = dict(dim=64, optimizer="adagrad", lr=0.3, init="normal(0,0.1)")
    # The same model twice over the store: without a cache (a push writes
    # each row's new version to a pool record) and with a DRAM cache that
    # holds the table (a push updates the cached rows in place).
    tables = {
        "embkv": (ekt.Embedding(conn, "entity", capacity=n_ent, **opts), ekt.Embedding(conn, "relation", **opts)),
        "embkv+cache": (ekt.Embedding(conn, "entity_c", capacity=n_ent, cache_size=kg.cache_for(n_ent, 64),
                                      **opts),
                        ekt.Embedding(conn, "relation_c", **opts)),
    }
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

    def embkv_step(ent, rel):
        def step(x):
            h, r, t, c, nh = x
            kg.transe_loss(ent(h), rel(r), ent(t), ent(c), nh, 4.0, 1e-4).backward()
        return step

    def step_torch(x):
        h, r, t, c, nh = x
        base.step(kg.transe_loss(base.ent(h), base.rel(r), base.ent(t), base.ent(c), nh, 4.0, 1e-4))

    steps = {name: embkv_step(*mods) for name, mods in tables.items()}
    steps["torch"] = step_torch
    data = batches(a.steps)
    for x in data[:10]:  # every entity's row created (and cached), torch's state allocated
        for f in steps.values():
            f(x)

    def report(how, times):
        # The median step (the machine is shared: single steps take up to
        # 10x the usual) and the fastest; embkv at torch's time / its own.
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        for k in ("embkv", "embkv+cache"):
            print("  %-12s %-12s median %.1f ms (torch %.1f): %.2fx   fastest %.1f ms (torch %.1f): %.2fx"
                  % (how, k, 1e3 * med[k], 1e3 * med["torch"], med["torch"] / med[k], 1e3 * low[k],
                     1e3 * low["torch"], low["torch"] / low[k]))

    for threads in (torch.get_num_threads(), 2):
        torch.set_num_threads(threads)
        print("TransE step on WordNet (%d entities), batch %d x (1 + %d corrupted), dim 64, adagrad, torch on %d "
              "thread(s)" % (n_ent, batch, neg, threads))
        times = {k: [] for k in steps}
        for x in data:
            for k, f in steps.items():
                s = time.perf_counter()
                f(x)
                times[k].append(time.perf_counter() - s)
        report("alternating", times)
        times = {k: [] for k in steps}
        for rep in range(3):
            for k, f in steps.items():
                for x in data:
                    s = time.perf_counter()
                    f(x)
                    times[k].append(time.perf_counter() - s)
        report("blocks", times)
    conn.close()
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
