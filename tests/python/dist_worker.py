"""One rank of the distributed tests (test_distributed.py starts them).

argv[1] is a JSON config: model_dir, steps (train until this step), every
(checkpoint every that many steps), optimizer, lr, dump (a directory:
export every shard's rows after each checkpoint and after the restore, as
step-S.rank-R.export), world/rank/port come from the environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, as torchrun sets them), and
"mode": "train" (restore, then train and checkpoint), "reference" (one
process, embkv.torch on all ranks' batches together, into model_dir/ref.db),
or a bad-input case.  Prints "step S" after each checkpoint, "restored S".

The batches: global step s has BAGS bags of up to 4 ids drawn from
UNIVERSE ids (some ids hot); rank r of W takes bags r, r + W, ...; the loss
is the sum over bags of ((bag - target)^2).sum(), so the gradient of a row
is the sum of what every rank's bags give it, whatever W is.
"""
import datetime
import json
import os
import sys

import numpy as np
import torch

import embkv
import embkv.torch as ekt

cfg = json.loads(sys.argv[1])
DIM = cfg.get("dim", 8)
BAGS = cfg.get("bags", 48)
UNIVERSE = cfg.get("universe", 3000)
OPTS = dict(optimizer=cfg.get("optimizer", "adagrad"), lr=cfg.get("lr", 0.05), init="normal(0,0.1)", seed=7,
            staleness=0)


def batch(step, rank, world):
    rng = np.random.default_rng(1000 + step)
    sizes = rng.integers(1, 5, BAGS)
    hot = rng.random(int(sizes.sum())) < 0.3
    ids = np.where(hot, rng.integers(0, 20, int(sizes.sum())), rng.integers(0, UNIVERSE, int(sizes.sum())))
    target = rng.standard_normal((BAGS, DIM)).astype(np.float32)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    mine = list(range(rank, BAGS, world))
    bag_ids = [ids[offs[b]:offs[b] + sizes[b]] for b in mine]
    flat = np.concatenate(bag_ids) if bag_ids else np.empty(0, np.int64)
    o = np.concatenate([[0], np.cumsum([len(x) for x in bag_ids])[:-1]]) if bag_ids else np.empty(0, np.int64)
    return (torch.from_numpy(flat.astype(np.int64)), torch.from_numpy(o.astype(np.int64)),
            torch.from_numpy(target[mine]))


def train_step(emb, step, rank, world, split=None):
    """split: the rank's bags in two forwards of the table, with one
    backward over both ("backward"), or a backward each and emb.step()
    ("step"): the same gradients as one forward."""
    ids, offs, tgt = batch(step, rank, world)
    if not split:
        out = emb(ids, offs)
        loss = ((out - tgt) ** 2).sum()
        loss.backward()
        return
    h = len(offs) // 2
    cut = int(offs[h]) if h < len(offs) else len(ids)
    parts = [(ids[:cut], offs[:h], tgt[:h]), (ids[cut:], offs[h:] - cut, tgt[h:])]
    loss = 0
    for i, o, t in parts:
        part = ((emb(i, o) - t) ** 2).sum()
        if split == "step":
            part.backward()
        else:
            loss = loss + part
    if split == "step":
        emb.step()
    else:
        loss.backward()


def reference():
    """One process: every step on all bags."""
    conn = embkv.connect(os.path.join(cfg["model_dir"], "ref.db"))
    emb = ekt.EmbeddingBag(conn, "user", dim=DIM, mode="sum", **OPTS)
    for step in range(1, cfg["steps"] + 1):
        train_step(emb, step, 0, 1)
        if cfg.get("dump") and step % cfg["every"] == 0:
            conn.execute("SELECT embkv_export('user', ?)",
                         (os.path.join(cfg["dump"], "step-%d.ref.export" % step),)).fetchone()
    conn.close()


def main():
    if cfg["mode"] == "reference":
        return reference()
    import torch.distributed as dist
    import embkv.distributed as ekd
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=cfg.get("timeout", 20)))
    rank, world = dist.get_rank(), dist.get_world_size()
    if cfg.get("marks"):
        with open(os.path.join(cfg["marks"], "up-%d-%d" % (os.getpid(), rank)), "w"):
            pass
    if cfg["mode"] == "die-first" and rank == 1:
        os.kill(os.getpid(), 9)  # before the ranks tell each other their processes
    dim = DIM
    opts = dict(OPTS)
    if cfg["mode"] == "bad-dim" and rank == world - 1:
        dim = DIM + 1
    if cfg["mode"] == "bad-option" and rank == world - 1:
        opts["lr"] = 0.5
    if cfg["mode"] == "cache":
        return cache_case(ekd, rank, world)
    if cfg["mode"] == "misc":
        return misc_case(ekd, rank, world)
    if cfg["mode"] == "failed-update":
        return failed_update_case(ekd, rank, world)
    if cfg["mode"] == "checkpoint-step":
        return checkpoint_step_case(ekd, rank, world)
    if "lr" in cfg:
        opts["lr"] = cfg["lr"]
    if "cache_size" in cfg:
        opts["cache_size"] = cfg["cache_size"]
    mode = "mean" if cfg["mode"] == "bad-mode" and rank == world - 1 else "sum"
    if cfg["mode"] == "bad-buckets":
        opts["buckets"] = 1
    if cfg["mode"] == "buckets-given" and rank == world - 1:
        opts["buckets"] = 4096
    if cfg["mode"] == "buckets-float" and rank == world - 1:
        opts["buckets"] = 64.0
    if cfg.get("split") == "step":
        opts["update"] = "step"
    try:
        md = cfg["model_dir"]
        if cfg["mode"] == "file-model-dir" and rank == world - 1:
            md = os.path.join(cfg["marks"], "afile")
            with open(md, "w"):
                pass
        emb = ekd.ShardedEmbeddingBag(md, "user", dim=dim, mode=mode, **opts)
        if cfg["mode"] == "skip-backward":
            train_step(emb, 1, rank, world) if rank == 0 else emb(*batch(1, rank, world)[:2])
            train_step(emb, 2, rank, world)
        if cfg["mode"] == "caught-error":
            if rank == 1:
                try:
                    emb(torch.tensor([1.5]), torch.tensor([0]))
                except TypeError:
                    pass
            train_step(emb, 1, rank, world)
            train_step(emb, 2, rank, world)
        if cfg["mode"] == "stats-vs-forward":
            ekd.stats(emb) if rank == 1 else train_step(emb, 1, rank, world)
        if cfg["mode"] == "subset":
            item = ekd.ShardedEmbedding(cfg["model_dir"], "item", dim=4, optimizer="sgd", lr=0.1, init="zeros")
            ekd.checkpoint([emb], 1)
        if cfg.get("second_table"):
            item = ekd.ShardedEmbedding(cfg["model_dir"], "item", dim=4, optimizer="sgd", lr=0.1, init="zeros")
        mods = [emb] + ([item] if cfg.get("second_table") else [])
        step, extra = ekd.restore(mods)
    except (ekd.EkdError, ValueError) as e:
        print("%s:" % type(e).__name__, e, flush=True)
        sys.exit(3)
    if step is not None and extra != {"step": step, "note": "extra"}:
        print("bad extra", extra, flush=True)
        sys.exit(4)
    step = step or 0

    def dump(s):
        if cfg.get("dump"):
            path = os.path.join(cfg["dump"], "step-%d.w%d.rank-%d.export" % (s, world, rank))
            if os.path.exists(path):
                os.unlink(path)
            emb.conn.execute("SELECT embkv_export('user', ?)", (path,)).fetchone()

    if cfg.get("dump_restore"):
        dump(step)
    print("restored", step, flush=True)
    while step < cfg["steps"]:
        step += 1
        train_step(emb, step, rank, world, cfg.get("split"))
        if cfg.get("second_table"):
            ids = torch.arange(step % 7, step % 7 + 5)
            (item(ids).sum() * 1.0).backward()
        if step % cfg["every"] == 0:
            ekd.checkpoint(mods, step, extra={"step": step, "note": "extra"})
            dump(step)
            print("step", step, flush=True)
    if cfg.get("stats"):
        st = ekd.stats(emb)
        if rank == 0:
            print("stats", json.dumps([{k: s[k] for k in ("rank", "rows", "bytes_sent")} for s in st]), flush=True)
    dist.destroy_process_group()


def misc_case(ekd, rank, world):
    """padding_idx, update="step", lookahead (rows in an SSD tier), stats."""
    import torch.distributed as dist
    emb = ekd.ShardedEmbeddingBag(cfg["model_dir"], "p", dim=4, mode="sum", padding_idx=-1, optimizer="sgd", lr=1,
                                  init="zeros", update="step")
    ids, offs = torch.tensor([1, -1, 2, -1, -1]), torch.tensor([0, 2, 4])
    out = emb(ids, offs)
    out.sum().backward()
    res = {"rank": rank, "out": out.tolist()}
    q = "SELECT group_concat(id || ':' || clock) FROM (SELECT id, clock FROM p ORDER BY id)"
    res["before"] = emb.conn.execute(q).fetchone()[0]
    emb.step()
    res["after"] = emb.conn.execute(q).fetchone()[0]
    with torch.no_grad():
        res["again"] = emb(ids, offs).tolist()
    # rows in the log, then look-ahead of them at their owners
    big = ekd.ShardedEmbedding(cfg["model_dir"], "big", dim=64, optimizer="sgd", lr=1, init="normal(0,1)",
                               pool_size="16M", ssd_size="64M", capacity=100000)
    n = 60000
    with torch.no_grad():
        for a in range(0, n, 10000):
            big(torch.arange(a + rank * n, a + rank * n + 10000))
    res["queued"] = big.lookahead(np.arange(0, 2 * n, 3))
    st = ekd.stats(big)
    res["ssd_rows"] = [x["tiers"].get("ssd", {}).get("rows", 0) for x in st]
    res["rows"] = [x["rows"] for x in st]
    res["la_queued"] = [x["tiers"].get("ssd", {}).get("lookahead", {}).get("queued", 0) for x in st]
    print("misc", json.dumps(res), flush=True)
    dist.destroy_process_group()


def failed_update_case(ekd, rank, world):
    """Rank 1 sends a NaN gradient for a row rank 0 owns: rank 0's update
    fails; both ranks catch their error (rank 1 has none) and go on to a
    checkpoint, which both refuse, naming rank 0's failed update; rank 0's
    next forward is refused too."""
    emb = ekd.ShardedEmbedding(cfg["model_dir"], "f", dim=2, optimizer="sgd", lr=1,
                               init="normal(1,0)" if cfg.get("overflow") else "zeros")
    ids = np.arange(100, dtype=np.int64)
    mine = torch.tensor([int(ids[emb.bucket_map[ekd.bucket_of(ids, emb.buckets)] == 0][0])])
    out = emb(mine)
    try:
        if cfg.get("overflow"):
            (out * 3e38).sum().backward()  # finite on each rank; the two sum past float32's range
        elif cfg.get("inf"):
            (out * (float("inf") if rank == 1 else 1.0)).sum().backward()
        else:
            (out * (float("nan") if rank == 1 else 1.0)).sum().backward()
        print("update ok", flush=True)
    except Exception as e:
        print("update failed:", e, flush=True)
    try:
        ekd.checkpoint([emb], 1)
        print("checkpoint ok", flush=True)
    except Exception as e:
        print("checkpoint failed:", e, flush=True)
    if rank == 0:
        try:
            emb(mine)
        except Exception as e:
            print("forward failed:", e, flush=True)
    sys.exit(0)


def checkpoint_step_case(ekd, rank, world):
    """Checkpoints whose step differs between the ranks, or is no
    integer on one: refused on every rank, nothing written; the same step
    on every rank then checkpoints, and a restore reads it back."""
    emb = ekd.ShardedEmbedding(cfg["model_dir"], "c", dim=2, optimizer="sgd", lr=1, init="zeros")
    (emb(torch.tensor([1, 2, 3])).sum()).backward()
    ekd.checkpoint([emb], 1)
    (emb(torch.tensor([1, 2, 3])).sum()).backward()
    for step in (2 + rank, 2.0 if rank == 1 else 2):
        try:
            ekd.checkpoint([emb], step)
            print("checkpoint ok", flush=True)
        except Exception as e:
            print("checkpoint failed: %s: %s" % (type(e).__name__, e), flush=True)
    print("files", sorted(os.listdir(cfg["model_dir"])), flush=True)
    try:
        ekd.checkpoint([emb], 2, extra={"f": lambda: 0})  # (torch.save cannot pickle it)
    except Exception as e:
        print("extra failed: %s: %s" % (type(e).__name__, e), flush=True)
    ekd.checkpoint([emb], 2)
    step, _ = ekd.restore([emb])
    print("restored", step, flush=True)
    import torch.distributed as dist
    dist.destroy_process_group()


def cache_case(ekd, rank, world):
    """local_cache: two ids, one owned by each rank, read by both every
    step (sgd, lr 1, a gradient of 1 from each rank: a row loses 2 a step).
    Prints what each step read, the rows at the end and the bytes sent."""
    import torch.distributed as dist
    emb = ekd.ShardedEmbedding(cfg["model_dir"], "c", dim=2, optimizer="sgd", lr=1, init="zeros",
                               staleness=cfg["staleness"], local_cache=cfg["local_cache"])
    ids = np.arange(200, dtype=np.int64)
    own = emb.bucket_map[ekd.bucket_of(ids, emb.buckets)]
    pick = torch.tensor([int(ids[own == 0][0]), int(ids[own == 1][0])])
    if cfg.get("uneven"):
        # rank 1 reads two more rows of rank 0's, rank 0 one more of its own
        more = ids[own == 0][1:3] if rank == 1 else ids[own == 0][3:4]
        pick = torch.cat([pick, torch.from_numpy(more)])
    seen = []
    for step in range(cfg["steps"]):
        out = emb(pick)
        seen.append(out[:2, 0].tolist())
        out.sum().backward()
    with torch.no_grad():
        end = emb(pick)[:, 0].tolist()
        if cfg.get("uneven"):
            mine = pick[torch.from_numpy(emb.bucket_map[ekd.bucket_of(pick.numpy(), emb.buckets)] == rank)]
            end = [(int(i), float(v)) for i, v in zip(mine, emb.conn.execute(
                "SELECT json_group_array(json_extract(embkv_json(vec), '$[0]')) FROM c WHERE id IN (%s)"
                % ",".join(str(int(i)) for i in mine)).fetchone()[0][1:-1].split(","))]
    st = ekd.stats(emb)
    print("cache", json.dumps({"rank": rank, "seen": seen, "end": end, "bytes": emb.bytes_sent,
                               "hits": emb.cache_hits, "clocks": [x["rows"] for x in st]}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
