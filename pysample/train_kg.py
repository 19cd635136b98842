#!/usr/bin/env python3
"""Link prediction on WordNet: TransE with its entity embeddings in embkv.

    python3 pysample/train_kg.py            # the embkv package installed (docs/install.md)
    make demo-kg                            # or: installs it into build/venv and runs this

The data: WordNet 3.0 from Debian's wordnet-base (/usr/share/wordnet): every
noun and verb synset is an entity, every semantic pointer between two of
them (hypernym, hyponym, meronyms, holonyms, domains, verb groups,
entailment, cause, ...: 20 kinds) a triple (head, relation, tail), as WN18
was built (WN18 kept 40,943 of the synsets and 18 relations; this keeps all
95,882 and 20, so its figures are comparable, not equal).  The triples are
split at random (--seed): --test of them held out, the rest trained on.
The synsets, relations and triples go to ordinary tables of the same
database, for SQL (sql/kg.sql).

The model: TransE (Bordes et al. 2013), score(h, r, t) = margin -
||e_h + w_r - e_t||_2; entity rows in the embkv table `entity`, relation
rows in `relation` (adagrad in the store; embkv.torch modules; the entity
table with a DRAM cache that holds it, --cache-size: a push then updates
the cached rows in place), trained with
a logistic loss on each triple against --neg corrupted ones (head or tail
replaced by a random entity).  A step calls the entity table three times
(heads, tails, corrupted entities): embkv.torch sums the three gradients
and updates each row once, as torch does.

Evaluation: filtered ranks of the held-out triples' tails given (h, r) and
heads given (r, t): the nearest entities to e_h + w_r (or e_t - w_r) come
from embkv_knn (L2, batches of --eval-batch queries), and other entities
that are known answers are skipped (the filtered setting).  A true answer
beyond the --eval-k nearest counts as rank > k (0 in MRR, a miss in
Hits@10; the mean rank is computed exactly with numpy from the rows).
--memory trains the same model, batches and negatives with torch's own
embeddings (sparse Adagrad) for comparison, ranked among the same entities
(those the training created rows for: every one a triple or a corrupted
triple named).
"""
import argparse
import collections
import os
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:  # pragma: no cover
    sys.exit("train_kg.py: %s: run it with Debian's /usr/bin/python3 (this is %s), with python3-numpy and "
             "python3-torch (`make deps` installs them)" % (e, sys.executable))
try:
    import embkv
    import embkv.torch as ekt
except ImportError as e:  # pragma: no cover
    sys.exit("train_kg.py: %s: install the embkv package for %s (docs/install.md), or run `make demo-kg`"
             % (e, sys.executable))

WORDNET = "/usr/share/wordnet"
REL_NAMES = {
    "@": "hypernym", "~": "hyponym", "@i": "instance_hypernym", "~i": "instance_hyponym",
    "#m": "member_holonym", "%m": "member_meronym", "#p": "part_holonym", "%p": "part_meronym",
    "#s": "substance_holonym", "%s": "substance_meronym", ";c": "domain_topic", "-c": "member_of_domain_topic",
    ";r": "domain_region", "-r": "member_of_domain_region", ";u": "domain_usage", "-u": "member_of_domain_usage",
    "$": "verb_group", "*": "entailment", ">": "cause", "^": "also_see", "&": "similar_to", "=": "attribute",
}
PUBLISHED = "TransE on WN18 (Bordes et al. 2013): filtered Hits@10 89.2%, mean rank 251"


def load_wordnet(root):
    """(synsets [(key, name, pos, gloss)], relations [symbol], triples int64 (n, 3)).  Noun and verb
    synsets; pointers between synsets (not between words), of the kinds of REL_NAMES."""
    files = [("n", "data.noun"), ("v", "data.verb")]
    for _, f in files:
        if not os.path.exists(os.path.join(root, f)):
            sys.exit("train_kg.py: %s is missing: install Debian's wordnet-base (`make deps` does), or give "
                     "--wordnet DIR" % os.path.join(root, f))
    synsets, index, raw = [], {}, []
    for pos, f in files:
        with open(os.path.join(root, f), encoding="latin-1") as fh:
            for line in fh:
                if line.startswith("  "):
                    continue  # the license header
                head, _, gloss = line.partition(" | ")
                p = head.split()
                key = pos + p[0]
                nwords = int(p[3], 16)
                name = p[4]
                i = 4 + 2 * nwords
                npt = int(p[i])
                i += 1
                for _ in range(npt):
                    sym, off, tpos, st = p[i:i + 4]
                    i += 4
                    if st == "0000" and tpos in ("n", "v") and sym in REL_NAMES:
                        raw.append((key, sym, tpos + off))
                index[key] = len(synsets)
                synsets.append((key, name, pos, gloss.strip()))
    rels = sorted({s for _, s, _ in raw})
    rid = {s: i for i, s in enumerate(rels)}
    triples = np.array(sorted({(index[h], rid[s], index[t]) for h, s, t in raw if h in index and t in index}),
                       dtype=np.int64)
    return synsets, rels, triples


def known_answers(triples):
    tails, heads = collections.defaultdict(set), collections.defaultdict(set)
    for h, r, t in triples.tolist():
        tails[(h, r)].add(t)
        heads[(r, t)].add(h)
    return tails, heads


def filtered_ranks(order_ids, truth, known):
    """Rank (1-based, filtered) of truth in order_ids, skipping the other known answers; 0 if it is not
    there (beyond the k looked at)."""
    rank = 0
    for e in order_ids:
        if e == truth:
            return rank + 1
        if e not in known:
            rank += 1
    return 0


def metrics(ranks, k):
    r = np.asarray(ranks, dtype=np.float64)
    found = r > 0
    return {"mrr": float(np.where(found, 1.0 / np.maximum(r, 1), 0.0).mean()),
            "hits10": float((found & (r <= 10)).mean()), "beyond_k": float((~found).mean()), "k": k}


def eval_knn(conn, E_rel, test, tails, heads, k, batch):
    """Filtered ranks of the test triples' tails, then of their heads, the nearest entities from
    embkv_knn."""
    ranks = ([], [])
    rows = np.asarray(embkv_rows(conn, "entity", np.unique(test[:, [0, 2]])))
    ent_ids = np.unique(test[:, [0, 2]])
    pos = {e: i for i, e in enumerate(ent_ids.tolist())}
    for lo in range(0, len(test), batch):
        part = test[lo:lo + batch]
        eh = rows[[pos[h] for h in part[:, 0].tolist()]]
        et = rows[[pos[t] for t in part[:, 2].tolist()]]
        wr = E_rel[part[:, 1]]
        for side, queries, want, known_of in ((0, eh + wr, part[:, 2], lambda x: tails[(x[0], x[1])]),
                                              (1, et - wr, part[:, 0], lambda x: heads[(x[1], x[2])])):
            got = conn.execute("SELECT query, id FROM embkv_knn('entity', ?, ?)",
                               (np.ascontiguousarray(queries, np.float32).tobytes(), k)).fetchall()
            per = collections.defaultdict(list)
            for q, e in got:
                per[q].append(e)
            for i, x in enumerate(part.tolist()):
                ranks[side].append(filtered_ranks(per[i], int(want[i]), known_of(x)))
    return ranks[0] + ranks[1]


def embkv_rows(conn, table, ids, present=None):
    """Rows of ids read without taking permits (a SELECT of the table); zeros for ids without a row
    (present, when given, marks the others)."""
    out = np.zeros((len(ids), embkv.dim(conn, table)), np.float32)
    where = {int(e): i for i, e in enumerate(ids)}
    for lo in range(0, len(ids), 20000):
        chunk = ids[lo:lo + 20000]
        for i, v in conn.execute("SELECT id, vec FROM %s WHERE id IN (SELECT value FROM json_each(?))" % table,
                                 ("[%s]" % ",".join(str(int(x)) for x in chunk),)):
            out[where[i]] = np.frombuffer(v, np.float32)
            if present is not None:
                present[where[i]] = True
    return out


def exact_ranks(E, R, test, tails, heads, present):
    """Filtered ranks against every entity, tails then heads as eval_knn's, in float64 (the mean
    rank; and a check of eval_knn), as (rank, rank counting near-ties too, the answer's unfiltered
    position): entities whose
    distance is within 1e-5 of the answer's may come either side of it in float32."""
    out = {side: ([], [], []) for side in (0, 1)}
    Et = torch.from_numpy(E.astype(np.float64))
    for lo in range(0, len(test), 256):
        part = test[lo:lo + 256]
        for side, q, want, known in (
                (0, E[part[:, 0]] + R[part[:, 1]], part[:, 2], [tails[(h, r)] for h, r, _ in part.tolist()]),
                (1, E[part[:, 2]] - R[part[:, 1]], part[:, 0], [heads[(r, t)] for _, r, t in part.tolist()])):
            lo_r, hi_r, raw = out[side]
            d = torch.cdist(torch.from_numpy(q.astype(np.float64)), Et).numpy()
            d[:, ~present] = np.inf  # entities never trained have no row: not candidates
            for i in range(len(part)):
                dt = d[i, want[i]]
                if not np.isfinite(dt):  # the answer has no row: behind every entity that has one
                    n = int(present.sum()) + 1
                    lo_r.append(n)
                    hi_r.append(n)
                    raw.append(n)
                    continue
                tol = 1e-5 * max(1.0, dt)
                closer = np.flatnonzero(d[i] < dt - tol)
                near = np.flatnonzero(np.abs(d[i] - dt) <= tol)
                n_closer = len(closer) - len(known[i].intersection(closer.tolist()))
                n_near = len([e for e in near.tolist() if e != want[i] and e not in known[i]])
                lo_r.append(1 + n_closer)
                hi_r.append(1 + n_closer + n_near)
                raw.append(1 + len(closer))
    return tuple(out[0][j] + out[1][j] for j in range(3))


class TorchTables:
    """The same model with torch's embeddings (the --memory baseline)."""

    def __init__(self, n_ent, n_rel, dim, lr, seed):
        g = torch.Generator().manual_seed(seed)
        self.ent = torch.nn.Embedding(n_ent, dim, sparse=True)
        self.rel = torch.nn.Embedding(n_rel, dim, sparse=True)
        with torch.no_grad():
            self.ent.weight.normal_(0, 0.1, generator=g)
            self.rel.weight.normal_(0, 0.1, generator=g)
        self.opt = torch.optim.Adagrad(list(self.ent.parameters()) + list(self.rel.parameters()), lr=lr,
                                       initial_accumulator_value=0.0, eps=1e-10)

    def step(self, loss):
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


def keep_freed_memory():
    """Ask glibc to keep freed memory for the process instead of giving it
    back to the kernel at once (blocks over 128 KiB are mmap'd and unmapped
    on free by default, and the heap is trimmed when 128 KiB are free at its
    top): a step's multi-megabyte tensors then take fresh pages every step,
    and each first touch of a page is a page fault.  Measured on the 2-core
    development VM, where a fault costs ~8 us: ~5,500-6,200 faults a step
    for torch's TransE step and embkv.torch's alike, and median steps 2-3x
    their fastest.  It changes the allocator of this process (both models),
    as jemalloc or tcmalloc would; returns whether glibc took it."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # pragma: no cover (not glibc)
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 256 << 20)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 30))


def cache_for(n_rows, dim):
    """A DRAM cache that holds every row of a table of n_rows (adagrad, dim)
    with room to spare (a cache writes dirty rows back once 15/16 of it is
    dirty): 1.25x a cached record (vector, adagrad state, header and slot:
    8 * dim + 128 bytes) a row."""
    return "%dM" % (1 + int(n_rows * 1.25 * (8 * dim + 128)) // (1 << 20))


def transe_loss(eh, wr, et, en, neg_head, margin, reg):
    """Logistic loss of the triples against their corrupted ones (en: (b, neg, dim), replacing the
    head where neg_head, else the tail)."""
    pos = margin - torch.linalg.vector_norm(eh + wr - et, dim=-1)
    h = torch.where(neg_head[..., None], en, eh[:, None, :])
    t = torch.where(neg_head[..., None], et[:, None, :], en)
    neg = margin - torch.linalg.vector_norm(h + wr[:, None, :] - t, dim=-1)
    loss = -F.logsigmoid(pos).mean() - F.logsigmoid(-neg).mean()
    return loss + reg * (eh.pow(2).sum(-1).mean() + et.pow(2).sum(-1).mean() + en.pow(2).sum(-1).mean())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="kg.db", help="the database (created; default kg.db)")
    ap.add_argument("--wordnet", default=WORDNET)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=2048, help="triples a step")
    ap.add_argument("--neg", type=int, default=16, help="corrupted triples per triple")
    ap.add_argument("--lr", type=float, default=0.3)
    ap.add_argument("--margin", type=float, default=4.0)
    ap.add_argument("--reg", type=float, default=1e-4)
    ap.add_argument("--test", type=int, default=5000, help="held-out triples")
    ap.add_argument("--eval-every", type=int, default=5, help="epochs between evaluations on 500 held-out triples")
    ap.add_argument("--eval-k", type=int, default=100)
    ap.add_argument("--eval-batch", type=int, default=500, help="queries a embkv_knn call")
    ap.add_argument("--cache-size", default="auto",
                    help="the entity table's DRAM cache (cache_size): 'auto' holds the whole table, 0 none")
    ap.add_argument("--malloc-default", action="store_true",
                    help="leave glibc's allocator as it is (by default the process keeps freed memory: "
                         "keep_freed_memory())")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the epochs)")
    ap.add_argument("--memory", action="store_true", help="also train the same model with torch's embeddings")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--png", default=None, help="loss and MRR curves (default: <db>.png)")
    a = ap.parse_args()
    # (before the first big tensor: for both models, see keep_freed_memory)
    kept = not a.malloc_default and keep_freed_memory()

    t0 = time.perf_counter()
    synsets, rels, triples = load_wordnet(a.wordnet)
    rng = np.random.default_rng(a.seed)
    perm = rng.permutation(len(triples))
    test, train = triples[perm[:a.test]], triples[perm[a.test:]]
    # Held-out triples whose entities training never sees cannot be ranked (as in WN18's split).
    seen = np.zeros(len(synsets), bool)
    seen[train[:, 0]] = seen[train[:, 2]] = True
    test = test[seen[test[:, 0]] & seen[test[:, 2]]]
    tails, heads = known_answers(triples)
    n_ent, n_rel = len(synsets), len(rels)
    print("WordNet: %d synsets, %d relations, %d triples (%d held out), read in %.1f s"
          % (n_ent, n_rel, len(triples), len(test), time.perf_counter() - t0))

    for suffix in ("", "-journal", "-wal"):
        if os.path.exists(a.db + suffix):
            os.remove(a.db + suffix)
    conn = embkv.connect(a.db)
    conn.execute("CREATE TABLE synsets(id INTEGER PRIMARY KEY, key TEXT, name TEXT, pos TEXT, gloss TEXT)")
    conn.execute("CREATE TABLE relations(id INTEGER PRIMARY KEY, symbol TEXT, name TEXT)")
    conn.execute("CREATE TABLE triples(h INTEGER, r INTEGER, t INTEGER, held_out INTEGER)")
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO synsets VALUES (?, ?, ?, ?, ?)", ((i,) + s for i, s in enumerate(synsets)))
    conn.executemany("INSERT INTO relations VALUES (?, ?, ?)", ((i, s, REL_NAMES[s]) for i, s in enumerate(rels)))
    held = {tuple(x) for x in test.tolist()}
    conn.executemany("INSERT INTO triples VALUES (?, ?, ?, ?)",
                     ((h, r, t, int((h, r, t) in held)) for h, r, t in triples.tolist()))
    conn.execute("COMMIT")
    opts = dict(optimizer="adagrad", lr=a.lr, init="normal(0,0.1)", capacity=n_ent)
    # Cached rows are updated in place by a push (no new record a row) and
    # written back at checkpoints: the store's share of a step is about a
    # third smaller (docs/benchmarks.md#the-transe-step).
    cache = cache_for(n_ent, a.dim) if a.cache_size == "auto" else a.cache_size
    if cache not in ("0", ""):
        opts["cache_size"] = cache
    ent = ekt.Embedding(conn, "entity", dim=a.dim, **opts)
    rel = ekt.Embedding(conn, "relation", dim=a.dim, optimizer="adagrad", lr=a.lr, init="normal(0,0.1)")
    base = TorchTables(n_ent, n_rel, a.dim, a.lr, a.seed) if a.memory else None

    steps_per_epoch = (len(train) + a.batch - 1) // a.batch
    total = a.epochs * steps_per_epoch if not a.max_steps else min(a.max_steps, a.epochs * steps_per_epoch)
    try:
        from tqdm import tqdm
        bar = tqdm(total=total, unit="step", dynamic_ncols=True)
    except ImportError:  # pragma: no cover
        bar = None
    curve, evals = [], []
    t_embkv = t_torch = 0.0
    examples = 0
    step = 0
    probe = test[rng.permutation(len(test))[:500]]
    for epoch in range(a.epochs):
        order = rng.permutation(len(train))
        for lo in range(0, len(train), a.batch):
            if step == total:
                break
            b = train[order[lo:lo + a.batch]]
            h, r, t = (torch.from_numpy(np.ascontiguousarray(b[:, j])) for j in range(3))
            corrupt = torch.from_numpy(rng.integers(0, n_ent, (len(b), a.neg)))
            neg_head = torch.from_numpy(rng.random((len(b), a.neg)) < 0.5)
            s = time.perf_counter()
            loss = transe_loss(ent(h), rel(r), ent(t), ent(corrupt), neg_head, a.margin, a.reg)
            loss.backward()   # one update of each row of entity and relation
            t_embkv += time.perf_counter() - s
            if base is not None:
                s = time.perf_counter()
                base.step(transe_loss(base.ent(h), base.rel(r), base.ent(t), base.ent(corrupt), neg_head,
                                      a.margin, a.reg))
                t_torch += time.perf_counter() - s
            examples += len(b)
            step += 1
            curve.append((step, float(loss)))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(epoch=epoch + 1, loss="%.4f" % float(loss))
        if (epoch + 1) % a.eval_every == 0 or epoch + 1 == a.epochs or step == total:
            R = embkv_rows(conn, "relation", np.arange(n_rel))
            m = metrics(eval_knn(conn, R, probe, tails, heads, a.eval_k, a.eval_batch), a.eval_k)
            evals.append((step, m["mrr"], m["hits10"]))
            if bar is not None:
                bar.write("epoch %d: held-out sample of %d: filtered MRR %.3f, Hits@10 %.1f%%"
                          % (epoch + 1, len(probe), m["mrr"], 100 * m["hits10"]))
        if step == total:
            break
    if bar is not None:
        bar.close()

    print("\ntraining: %d steps of %d triples x (1 + %d corrupted)" % (step, a.batch, a.neg))
    print("  embkv.torch: %.0f triples/s (%.1f ms a step; the process keeps freed memory: %s)"
          % (examples / t_embkv, 1e3 * t_embkv / step, "yes" if kept else "no, --malloc-default"))
    if base is not None:
        print("  torch in memory: %.0f triples/s (%.1f ms a step); embkv at %.2fx"
              % (examples / t_torch, 1e3 * t_torch / step, t_torch / t_embkv))
    clocks = conn.execute("SELECT max(clock) FROM relation").fetchone()[0]
    print("  clock of the relation rows: at most %d (one update a step: %d steps)" % (clocks, step))

    R = embkv_rows(conn, "relation", np.arange(n_rel))
    s = time.perf_counter()
    ranks = eval_knn(conn, R, test, tails, heads, a.eval_k, a.eval_batch)
    dt = time.perf_counter() - s
    m = metrics(ranks, a.eval_k)
    present = np.zeros(n_ent, bool)
    E = embkv_rows(conn, "entity", np.arange(n_ent), present)
    ex, ex_hi, raw = exact_ranks(E, R, test, tails, heads, present)
    # embkv_knn's rank is numpy's (up to near-ties), or the answer is beyond the k nearest
    agree = sum(1 for x, y, z, p in zip(ranks, ex, ex_hi, raw) if ((y <= x <= z) if x else p > a.eval_k))
    print("\nheld-out triples: %d, %d queries (heads and tails) by embkv_knn in %.1f s" % (len(test), len(ranks), dt))
    print("  embkv:    filtered MRR %.3f, Hits@10 %.1f%%, mean rank %.0f  (answers beyond the %d nearest: %.1f%%; "
          "%d of %d ranks as numpy finds them)" % (m["mrr"], 100 * m["hits10"], float(np.mean(ex)), a.eval_k,
                                       100 * m["beyond_k"], agree, len(ranks)))
    if base is not None:
        Eb = base.ent.weight.detach().numpy()
        Rb = base.rel.weight.detach().numpy()
        exb = np.array(exact_ranks(Eb, Rb, test, tails, heads, present)[0])
        print("  torch:    filtered MRR %.3f, Hits@10 %.1f%%, mean rank %.0f"
              % (float(np.mean(1.0 / exb)), 100 * float(np.mean(exb <= 10)), float(exb.mean())))
    print("  published: " + PUBLISHED + " (another subset of WordNet: comparable, not equal)")

    png = a.png or a.db + ".png"
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        ax1.plot([c[0] for c in curve], [c[1] for c in curve], lw=0.6)
        ax1.set_xlabel("step")
        ax1.set_ylabel("loss")
        ax2.plot([e[0] for e in evals], [e[1] for e in evals], "o-", label="filtered MRR")
        ax2.plot([e[0] for e in evals], [e[2] for e in evals], "s-", label="Hits@10")
        ax2.set_xlabel("step")
        ax2.legend()
        fig.suptitle("TransE on WordNet, entities in embkv")
        fig.tight_layout()
        fig.savefig(png, dpi=100)
        print("curves: %s" % png)
    except ImportError:  # pragma: no cover
        print("matplotlib is missing (python3-matplotlib): no plot")
    embkv.checkpoint(conn, "entity")
    embkv.checkpoint(conn, "relation")
    conn.close()


if __name__ == "__main__":
    main()
