"""embkv tables sharded over the ranks of a torch.distributed job.

    # torchrun --nproc_per_node=2 train.py   (launch line: docs/distributed.md)
    import torch.distributed as dist, embkv.distributed as ekd
    dist.init_process_group("gloo")
    emb = ekd.ShardedEmbeddingBag("model-dir", "user", dim=64, mode="sum", optimizer="adagrad",
                                  lr=0.05, init="normal(0,0.01)")
    step, extra = ekd.restore([emb])     # (None, None) before the first checkpoint
    out = emb(ids, offsets)              # this rank's batch
    loss.backward()                      # gradients go to the rows' owners
    ekd.checkpoint([emb], step, extra=state_dict)

Rows are sharded by row: an id's bucket is a hash of it (splitmix64) modulo
`buckets` (4096), and a bucket map, kept in the manifest, gives each bucket
to a rank.  Each rank owns one embkv store per table under model_dir
(`rank-00000.db` and the store beside it), with every option embkv.torch
takes (tiers, cache, optimizer, staleness), and serves its rows.

A forward is collective (every rank calls it, as with DDP): each rank sends
the distinct ids of its batch to their owners with one all_to_all_single of
counts and one of ids; an owner pulls each distinct id once per step (its
staleness permit is taken there) and the rows come back the same way.  Torch
then runs its own embedding / embedding_bag on them, so outputs and
gradients follow torch's rules.  At the end of the backward pass (or at
step() with update="step") the gradients of every forward of the step go to
the owners (one all_to_all_single per forward, in forward order, so that
every rank runs the same collectives whatever order autograd ran its hooks
in); an owner adds what the ranks sent for an id in rank order and pushes
the sum once: one optimizer step and one tick of the clock per row per step,
as one process training on all ranks' batches together.

Checkpoints (checkpoint(), collective) are batch-aligned.  The shards'
tables are created durable='checkpoint': a shard is durable only when this
module checkpoints it, never at a close (a rank that fails and exits rolls
back to its last checkpoint, as a killed one does).  checkpoint(step):
  1. every rank writes a redo file: its shard's rows touched since the last
     checkpoint, whole (vector, optimizer state, clock: embkv_export with
     ids), and rank 0 the caller's `extra` (torch.save);
  2. rank 0 writes the manifest (step, world size, bucket map, tables and
     options, the redo files), atomically: a temporary file, fsync, rename,
     fsync of the directory.  This is the commit point;
  3. every shard checkpoints (embkv_checkpoint), then the redo files of the
     checkpoint before are deleted.
A job killed anywhere restarts from the last manifest: restore() imports
each shard's redo file of that step (embkv_import: idempotent), bringing a
shard that had not reached step 3 to the step, and one that had to itself.
No shard can be past the manifest, since shards checkpoint only after it.

Resharding: a job started with another number of ranks than the manifest's
moves buckets to their new owners at construction of each table (collective,
crash-safe: rows are copied, then the new manifest is written, then the
sources' copies removed; a kill anywhere starts the move over).  Every old
shard's database must be reachable under model_dir from the new ranks (one
machine, or a shared file system).

A rank that dies makes the collectives of the others fail (gloo: at once
when the connection drops, else after the process group's timeout); the
error is raised as EkdError naming the table, the operation and the ranks
found dead on this machine.
"""
import datetime
import io
import json
import operator
import os
import shutil
import sqlite3
import time
import uuid
import weakref
import zlib

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import embkv
import embkv.torch as ekt

__all__ = ["EkdError", "ShardedEmbedding", "ShardedEmbeddingBag", "checkpoint", "restore", "stats", "bucket_of",
           "MANIFEST"]

MANIFEST = "manifest.json"
_FORMAT = "embkv-distributed-manifest"
_VERSION = 1
DEFAULT_BUCKETS = 4096


class EkdError(RuntimeError):
    """A distributed operation failed (a rank died, a collective timed out,
    the manifest or a shard is not what the job expects)."""


# ---------------------------------------------------------------- buckets

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_G = np.uint64(0x9E3779B97F4A7C15)


def bucket_of(ids, buckets=DEFAULT_BUCKETS):
    """Bucket of each id: splitmix64(id) mod buckets (the same on every
    machine and in every version of this module)."""
    z = np.asarray(ids, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        z = z + _G
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(buckets)).astype(np.int64)


# Options that size memory and tiers: they may change when a job restarts
# (the store's own rules apply: ssd_size grows, never shrinks).
_RUNTIME = {"cache_size", "migrate", "migrate_rate", "ssd_size", "pool_size", "capacity", "wait_ms"}


def _norm(opts):
    return {k: str(v) for k, v in opts.items()}


def _diff(a, b):
    """'lr: 0.05 against 0.5, ...' for the keys where a and b differ."""
    keys = sorted(set(a) | set(b))
    return ", ".join("%s: %s against %s" % (k, a.get(k, "(none)"), b.get(k, "(none)"))
                     for k in keys if str(a.get(k, "(none)")) != str(b.get(k, "(none)")))


def _default_map(buckets, world):
    return np.arange(buckets, dtype=np.int64) % world


# ---------------------------------------------------------------- files

def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path, data):
    """data (bytes) at path, whole or not at all, durable when it returns."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _manifest_bytes(m):
    body = json.dumps(m, sort_keys=True, separators=(",", ":"))
    return json.dumps({"manifest": m, "crc32": zlib.crc32(body.encode())}, sort_keys=True).encode()


def _commit(g, model_dir, man, what):
    """Rank 0 writes man as model_dir's manifest (collective: every rank
    learns whether it did)."""
    err = None
    if g.rank == 0:
        path = os.path.join(model_dir, MANIFEST)
        try:
            _write_atomic(path, _manifest_bytes(man))
        except OSError as e:
            err = "cannot write %s: %s" % (path, e)
    g.agree(what, err)
    _latest[model_dir] = man


def _read_manifest(model_dir):
    """The manifest of model_dir (a dict), None when there is none; raises
    EkdError naming the file when it is damaged or not a manifest."""
    path = os.path.join(model_dir, MANIFEST)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    advice = ("restore model_dir from a backup; to start the job over, remove model_dir (the manifest alone is not "
              "enough: the shards hold the checkpoint's rows)")
    try:
        outer = json.loads(raw)
        m = outer["manifest"]
        body = json.dumps(m, sort_keys=True, separators=(",", ":"))
        if zlib.crc32(body.encode()) != outer["crc32"]:
            raise EkdError("embkv.distributed: manifest %s is damaged: its checksum does not match; %s"
                           % (path, advice))
        if m.get("format") != _FORMAT or m.get("version") != _VERSION:
            raise EkdError("embkv.distributed: %s is not an embkv.distributed manifest of version %d; %s"
                           % (path, _VERSION, advice))
        int(m["step"]), int(m["buckets"])
        for name, t in m["tables"].items():
            bm, w = t["bucket_map"], t["world_size"]
            if (not isinstance(w, int) or w < 1 or not isinstance(bm, list) or len(bm) != m["buckets"] or
                    any(not isinstance(r, int) or r < 0 or r >= w for r in bm)):
                raise EkdError("embkv.distributed: manifest %s: the bucket map of table %r does not give each of "
                               "its %s buckets to one of its %s ranks; %s" % (path, name, m["buckets"], w, advice))
            if len(t["redo"]) > w:
                raise EkdError("embkv.distributed: manifest %s: table %r has redo files of more ranks than its %d; "
                               "%s" % (path, name, w, advice))
        return m
    except EkdError:
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise EkdError("embkv.distributed: manifest %s is damaged (%s: %s); %s"
                       % (path, type(e).__name__, e, advice)) from None


def _shard_db(model_dir, rank):
    return os.path.join(model_dir, "rank-%05d.db" % rank)


def _redo_dir(model_dir, step):
    return os.path.join(model_dir, "redo-%d" % step)


def _extra_file(model_dir, step):
    return os.path.join(model_dir, "extra-%d.pt" % step)


# ---------------------------------------------------------------- collectives

class _Group:
    """The process group and what this module knows of its ranks: (host, pid)
    of each, to name the dead ones when a collective fails."""

    def __init__(self, group):
        if not dist.is_available() or not dist.is_initialized():
            raise EkdError("embkv.distributed: torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group('gloo') first (torchrun sets its environment)")
        self.group = group
        self.seconds = 0.0      # spent in collectives
        # Operations of the table begun on this rank (forwards, gradient
        # exchanges, look-aheads, stats), counted as they begin, also when
        # they fail before any collective: ranks in step agree on it, and
        # one that caught an error and went on does not.
        self.op = 0
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        self.where = [None] * self.world
        try:
            dist.all_gather_object(self.where, (os.uname().nodename, os.getpid()), group=group)
        except RuntimeError as e:
            self.where = [(None, None)] * self.world
            raise self.fail("the construction of a sharded table", e) from None

    def dead(self):
        """Ranks on this machine whose process is gone (or a zombie not yet
        reaped by its launcher); waits up to a second for one, since the
        connection may drop before the process is reaped."""
        host = os.uname().nodename
        for _ in range(20):
            out = [r for r, (h, pid) in enumerate(self.where) if h == host and r != self.rank and _gone(pid)]
            if out:
                return out
            time.sleep(0.05)
        return []

    def fail(self, what, e):
        if self.where[0] == (None, None):
            # (the exchange of (host, pid) itself failed: no rank is known)
            who = ("a rank died or hangs before the ranks had told each other their processes, or the process "
                   "group's timeout passed")
        else:
            dead = self.dead()
            who = ("rank %s (pid %s) is gone" % (", ".join(map(str, dead)),
                                                ", ".join(str(self.where[r][1]) for r in dead))) if dead else \
                "no rank on this machine is gone: one elsewhere died or hangs, or the process group's timeout passed"
        return EkdError("embkv.distributed: %s failed on rank %d of %d: %s (%s); restart the job: it resumes from "
                        "the last checkpoint" % (what, self.rank, self.world, who, str(e).strip().splitlines()[0]
                                                 if str(e).strip() else type(e).__name__))

    def call(self, what, fn, *a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, group=self.group, **kw)
        except EkdError:
            raise
        except RuntimeError as e:
            raise self.fail(what, e) from None
        finally:
            self.seconds += time.perf_counter() - t0

    def gather(self, what, obj):
        out = [None] * self.world
        self.call(what, dist.all_gather_object, out, obj)
        return out

    def bcast(self, what, obj):
        box = [obj]
        self.call(what, dist.broadcast_object_list, box, src=0)
        return box[0]

    def barrier(self, what):
        # (an all_reduce, not dist.barrier: its failure names the same way
        # and it works with every backend)
        t = torch.zeros(1)
        self.call(what, dist.all_reduce, t)

    def agree(self, what, ok_or_error):
        """Every rank's outcome of a local step: raises on every rank when
        one failed (naming it), so that no rank goes on into a collective
        the others left."""
        res = self.gather(what, ok_or_error)
        bad = [(r, e) for r, e in enumerate(res) if e is not None]
        if bad:
            r, e = bad[0]
            raise EkdError("embkv.distributed: %s failed on rank %d: %s" % (what, r, e))

    def begin(self):
        self.op += 1

    def counts(self, what, send_counts):
        """The counts each rank sends this one, exchanged with the name of
        the operation (a tag) and its number (self.op): every operation of
        the module begins so, in one shape (three int64 a rank), so that
        ranks out of step (one skipped a backward, or caught an error and
        went on) fail naming both operations instead of gloo mismatching
        two payloads or pairing one rank's step with another's next."""
        tag = _tag(what)
        sc = torch.as_tensor(np.stack([np.asarray(send_counts, dtype=np.int64),
                                       np.full(self.world, tag, np.int64),
                                       np.full(self.world, self.op, np.int64)], 1).reshape(-1))
        rc = torch.empty_like(sc)
        self.call(what, dist.all_to_all_single, rc, sc)
        got = rc.numpy().reshape(self.world, 3)
        for r in range(self.world):
            if got[r, 1] != tag or got[r, 2] != self.op:
                raise EkdError("embkv.distributed: ranks out of step: rank %d is at %s (operation %d of the table "
                               "there), rank %d at %s (operation %d) (every rank must run the same forwards, "
                               "backwards and checkpoints in the same order; a rank that caught an error must "
                               "stop, as the others do)"
                               % (self.rank, what, self.op, r, _tags.get(int(got[r, 1]), "another operation"),
                                  int(got[r, 2])))
        return got[:, 0].copy()

    def exchange(self, what, send, send_counts, width=1):
        """all_to_all_single of send (rows grouped by destination rank,
        send_counts of them for each, `width` values a row); returns
        (received rows, counts received from each rank)."""
        recv_counts = self.counts(what, send_counts)
        t = torch.from_numpy(np.ascontiguousarray(send).reshape(-1))
        out = torch.empty(int(recv_counts.sum()) * width, dtype=t.dtype)
        self.call(what, dist.all_to_all_single, out, t, [int(c) * width for c in recv_counts],
                  [int(c) * width for c in send_counts])
        return out.numpy().reshape((-1, width) if width > 1 else (-1,)), recv_counts

    def exchange_back(self, what, send, recv_counts, send_counts, width):
        """The reply to an exchange: send holds recv_counts[r] rows for each
        rank r (one for each id the exchange brought from r, in its order),
        and each rank r sends back send_counts[r] (one for each id sent to
        it).  Returns the rows received."""
        t = torch.from_numpy(np.ascontiguousarray(send).reshape(-1))
        out = torch.empty(int(np.sum(send_counts)) * width, dtype=t.dtype)
        self.call(what, dist.all_to_all_single, out, t, [int(c) * width for c in send_counts],
                  [int(c) * width for c in recv_counts])
        return out.numpy().reshape(-1, width)


def _recorded_job(db):
    """The job id a shard database records, or None."""
    if not os.path.exists(db):
        return None
    c = sqlite3.connect(db)
    try:
        row = c.execute("SELECT value FROM embkv_distributed WHERE key = 'job'").fetchone()
        return row[0] if row else None
    except sqlite3.OperationalError:
        return None
    finally:
        c.close()


def _claim(conn, db, job):
    """A shard database belongs to one job: it records the job's id (the
    manifest's), and one of another job is refused."""
    conn.execute("CREATE TABLE IF NOT EXISTS embkv_distributed (key TEXT PRIMARY KEY, value)")
    row = conn.execute("SELECT value FROM embkv_distributed WHERE key = 'job'").fetchone()
    if row is None:
        conn.execute("INSERT INTO embkv_distributed VALUES ('job', ?)", (job,))
    elif row[0] != job:
        raise EkdError("embkv.distributed: %s belongs to another job (id %s) than model_dir's (id %s, its manifest "
                       "or rank 0's database): give this job another model_dir, or remove the stray database"
                       % (db, row[0], job))


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True
    except (OSError, IndexError):
        return False


# tag -> the operation it names (this process's; every rank names its
# operations alike)
_tags = {}


def _tag(what):
    """The tag of an operation's name, remembered to name it back."""
    tag = zlib.crc32(what.encode()) & 0x7FFFFFFF
    _tags[tag] = what
    return tag


# ---------------------------------------------------------------- the owner's step

def _distinct(ids, padding_idx, who):
    """A batch's ids (a LongTensor or IntTensor of any shape): (the ids
    flat, which are padding_idx or None, the distinct others sorted as
    numpy, the index of each other one among them)."""
    flat, is_pad = ekt._flat_ids(ids, padding_idx, who)
    uniq, inv = torch.unique(flat[~is_pad] if is_pad is not None else flat, return_inverse=True)
    return flat, is_pad, uniq.numpy(), inv


def _with_padding(w, flat, is_pad, inv, n):
    """The rows w of the n distinct ids, with a zero row for padding after
    them when there is padding; (rows, each id's row index, the padding
    row's index or None)."""
    if is_pad is None:
        return w, inv, None
    local = torch.empty_like(flat)
    local[is_pad] = n
    local[~is_pad] = inv
    return torch.cat([w, torch.zeros(1, w.shape[1])]), local, n


class _OwnerStep:
    """The rows this rank's shard served in the open step (each id pulled
    once: one permit), and the gradients the ranks sent for them, summed
    in double (as embkv_push sums a row's gradients: finite gradients
    never sum to an infinity on the way)."""

    def __init__(self, dim):
        self.dim = dim
        self.ids = np.empty(0, np.int64)
        self.rows = np.empty((0, dim), np.float32)
        self.grad = np.empty((0, dim), np.float64)
        self.has_grad = np.empty(0, bool)
        self.pulled = np.empty(0, bool)     # (false: only a gradient came, for a row a rank had cached)

    def _insert(self, new, rows, pulled):
        ids = np.concatenate([self.ids, new])
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self.rows = np.concatenate([self.rows, rows])[order]
        self.grad = np.concatenate([self.grad, np.zeros((len(new), self.dim), np.float64)])[order]
        self.has_grad = np.concatenate([self.has_grad, np.zeros(len(new), bool)])[order]
        self.pulled = np.concatenate([self.pulled, np.full(len(new), pulled)])[order]

    def _find(self, u):
        pos = np.searchsorted(self.ids, u)
        there = pos < len(self.ids)
        there[there] = self.ids[pos[there]] == u[there]
        return pos, there

    def rows_for(self, conn, table, u):
        """Rows of the sorted distinct ids u, pulling those not pulled yet."""
        pos, there = self._find(u)
        new = u[~there]
        if len(new):
            self._insert(new, embkv.pull(conn, table, new, self.dim), True)
            pos = np.searchsorted(self.ids, u)
        # (gradient-only entries come at the step's end, after its forwards)
        return self.rows[pos]

    def positions(self, u):
        """Positions of the distinct ids u (any order), adding those not
        there without pulling them (their gradients only)."""
        s = np.unique(u)
        pos, there = self._find(s)
        if not there.all():
            self._insert(s[~there], np.zeros((int((~there).sum()), self.dim), np.float32), False)
        return np.searchsorted(self.ids, u)


class _Fwd:
    """One training forward of a table: what the backward exchange needs.
    ask: which of the forward's distinct ids were asked of their owners
    (the others came from the local cache); order, send_counts, recv_counts
    and owner_ids (the ids this rank received, in the order they came):
    that exchange, seen from both ends; hit_*: the cached ids, grouped by
    owner.  (Ids, not positions in the owner's step: a later forward of
    the step inserts its new ids there and moves the positions.)"""
    __slots__ = ("mod", "n", "ask", "order", "send_counts", "recv_counts", "owner_ids", "hit_ids", "hit_order",
                 "hit_counts", "grad")

    def __init__(self, mod, n, ask, order, send_counts, recv_counts, owner_ids, hit):
        self.mod, self.n, self.ask, self.order = mod, n, ask, order
        self.send_counts, self.recv_counts, self.owner_ids = send_counts, recv_counts, owner_ids
        self.hit_ids, self.hit_order, self.hit_counts = hit
        self.grad = None


# The last manifest of each model_dir this process read or wrote.
_latest = {}
# The modules alive in this process: a checkpoint or restore of a
# model_dir takes every table of it.
_alive = weakref.WeakSet()

# Forwards of the open step, in forward order (all tables): the end of the
# step exchanges their gradients in this order on every rank.
_pending = []
_queued = [False]


def _end_step():
    _queued[0] = False
    todo = list(_pending)
    del _pending[:]
    mods = []
    try:
        for f in todo:
            m = f.mod
            if m not in mods:
                mods.append(m)
            g = f.grad
            flag = np.ones((f.n, 1), np.float32) if g is not None else np.zeros((f.n, 1), np.float32)
            if g is None:
                g = np.zeros((f.n, m.embedding_dim), np.float32)
            gf = np.concatenate([g, flag], axis=1)
            what = "the gradient exchange of table %r" % m.table
            m._g.begin()
            if not np.array_equal(m._g.counts(what, f.send_counts), f.recv_counts):
                raise EkdError("embkv.distributed: %s: the ranks' forwards do not match their backwards (ranks out "
                               "of step)" % what)
            got = m._g.exchange_back(what, gf[f.ask][f.order], f.send_counts, f.recv_counts, m.embedding_dim + 1)
            me = m._g.rank
            m.bytes_sent += 4 * (m.embedding_dim + 1) * int(f.send_counts.sum() - f.send_counts[me])
            st = m._owner
            # np.add.at adds in index order: rank 0's gradients first, then
            # rank 1's, ... (the order of summation is fixed)
            sel = got[:, -1] > 0
            pos = np.searchsorted(st.ids, f.owner_ids[sel])
            np.add.at(st.grad, pos, got[sel, :-1])
            st.has_grad[pos] = True
            if m.local_cache:
                # the gradients of rows served from the cache: ids and
                # gradients to their owners
                rids, rc = m._g.exchange(what, f.hit_ids[f.hit_order], f.hit_counts)
                rg = m._g.exchange_back(what, gf[~f.ask][f.hit_order], f.hit_counts, rc, m.embedding_dim + 1)
                m.bytes_sent += (8 + 4 * (m.embedding_dim + 1)) * int(f.hit_counts.sum() - f.hit_counts[me])
                sel = rg[:, -1] > 0
                if sel.any():
                    m._touched.append(np.unique(rids[sel]))
                    pos = st.positions(rids[sel])
                    np.add.at(st.grad, pos, rg[sel, :-1])
                    st.has_grad[pos] = True
    except BaseException:
        for m in mods:
            m._release_owner()
        raise
    failed = None
    for m in mods:
        try:
            m._push_owner()
        except BaseException as e:
            # This shard missed the step's update (the others did not): the
            # table refuses to go on until the job restarts (every module's
            # update is still tried, and its permits returned).
            m._failed = "the update of table %r failed on rank %d at its step %d (%s)" % (
                m.table, m._g.rank, m._steps + 1, str(e).strip().splitlines()[0] if str(e).strip()
                else type(e).__name__)
            failed = failed or e
            continue
        m._steps += 1
        if m.local_cache:
            m._cache = {k: v for k, v in m._cache.items() if m._steps - v[1] < m._cache_steps}
    if failed is not None:
        raise failed
    return mods


class _ShardedTable(torch.nn.Module):
    def __init__(self, model_dir, table, dim=None, padding_idx=None, update="backward", buckets=None, group=None,
                 local_cache=False, **options):
        super().__init__()
        if not isinstance(model_dir, (str, os.PathLike)) or not os.fspath(model_dir):
            raise ValueError("embkv.distributed: table %r: model_dir must name a directory (made if missing), "
                             "not %r" % (table, model_dir))
        # (Told every rank at the construction's exchange: each host may
        # have a model_dir of its own, and one rank's refusal alone would
        # leave the others waiting for it.)
        rank_error = None
        if os.path.exists(model_dir) and not os.path.isdir(model_dir):
            rank_error = "model_dir %s is not a directory: name a directory (made if missing)" % (
                os.path.abspath(model_dir),)
            if not dist.is_available() or not dist.is_initialized():
                raise ValueError("embkv.distributed: table %r: %s" % (table, rank_error))
        if update not in ("backward", "step"):
            raise ValueError("embkv.distributed: update must be 'backward' or 'step', not %r" % (update,))
        if buckets is not None:
            # (told every rank at the exchange, as a model_dir that is a file is)
            try:
                buckets = operator.index(buckets)
            except TypeError:
                rank_error = rank_error or "buckets must be an integer, not %r" % (buckets,)
                buckets = None
                if not dist.is_available() or not dist.is_initialized():
                    raise TypeError("embkv.distributed: table %r: %s" % (table, rank_error)) from None
        if "durable" in options or "path" in options:
            raise ValueError("embkv.distributed: table %r: options path and durable are the module's own (each "
                             "shard is a store under model_dir, durable at the job's checkpoints)" % table)
        for k, v in options.items():
            if not isinstance(v, (int, float, str)) or isinstance(v, bool):
                raise ValueError("embkv.distributed: table %r: option %s must be a number or a string, not %r"
                                 % (table, k, v))
        self.local_cache = bool(local_cache)
        self._cache_steps = 0
        if self.local_cache:
            given = options.get("staleness")
            try:
                st = int(str(given), 10)
            except ValueError:
                st = None
            if st is None or st < 1:
                raise ValueError("embkv.distributed: table %r: local_cache serves a remote row for at most "
                                 "`staleness` steps: give staleness=N with N >= 1 (%s)"
                                 % (table, "not %r" % (given,) if given is not None else "it is not given"))
            self._cache_steps = st
        self._cache = {}            # remote id -> (row, step it was read at)
        self._steps = 0             # updates done
        self._failed = None         # what made an update of this rank's shard fail
        self.cache_hits = 0
        self._g = _Group(group)
        self.model_dir = os.path.abspath(model_dir)
        self.table = table
        # (the names of the table's operations, for the other ranks' tags)
        for fmt in ("the forward of table %r", "the gradient exchange of table %r", "the look-ahead of table %r",
                    "embkv.distributed.stats of table %r"):
            _tag(fmt % table)
        self.update = update
        self.padding_idx = padding_idx
        rank, world = self._g.rank, self._g.world
        want = {"table": table, "dim": None if dim is None else int(dim), "options": dict(sorted(options.items())),
                "buckets": None if buckets is None else int(buckets), "update": update,
                "kind": type(self).__name__, "padding_idx": padding_idx, "local_cache": self.local_cache,
                "bag": getattr(self, "_bag_args", None), "model_dir": self.model_dir, "rank_error": rank_error}
        # The ranks must agree on the table: each compares every rank's.
        every = self._g.gather("the construction of table %r" % table, want)
        bad = [(r, w["rank_error"]) for r, w in enumerate(every) if w["rank_error"]]
        if bad:
            raise (TypeError if bad[0][1].startswith("buckets") else ValueError)(
                "embkv.distributed: table %r: rank %d: %s" % (table, bad[0][0], bad[0][1]))
        for r, w in enumerate(every):
            for k in want:
                if k in ("model_dir", "rank_error"):
                    continue  # (each host its own)
                if k == "options" and _norm(w[k]) != _norm(every[0][k]):
                    raise EkdError("embkv.distributed: table %r: ranks disagree on options: %s (rank 0 against rank "
                                   "%d)" % (table, _diff(every[0][k], w[k]), r))
                if k == "bag" and w[k] != every[0][k]:
                    # (mode, include_last_offset): named as the arguments
                    j = 0 if w[k][0] != every[0][k][0] else 1
                    raise EkdError("embkv.distributed: table %r: ranks disagree on %s: rank 0 has %r, rank %d %r"
                                   % (table, ("mode", "include_last_offset")[j], every[0][k][j], r, w[k][j]))
                if k == "buckets" and (w[k] is None) != (every[0][k] is None):
                    a, b = (0, r) if every[0][k] is None else (r, 0)
                    raise EkdError("embkv.distributed: table %r: ranks disagree on buckets: rank %d leaves it out "
                                   "(the checkpoint's, or %d for a new table), rank %d gives %d: give it on every "
                                   "rank or on none" % (table, a, DEFAULT_BUCKETS, b,
                                                        every[0][k] if every[0][k] is not None else w[k]))
                if k != "options" and w[k] != every[0][k]:
                    raise EkdError("embkv.distributed: table %r: ranks disagree on %s: rank 0 has %r, rank %d %r"
                                   % (table, k, every[0][k], r, w[k]))
        # The manifest: rank 0's, for every rank; and the job's id, which
        # every shard database records (_claim).
        err, m, job = None, None, None
        if rank == 0:
            try:
                os.makedirs(self.model_dir, exist_ok=True)
                m = _read_manifest(self.model_dir)
                job = m.get("job") if m is not None else None
                job = job or _recorded_job(_shard_db(self.model_dir, 0)) or uuid.uuid4().hex
            except (EkdError, OSError, sqlite3.Error) as e:
                err = str(e)
        m, job, err = self._g.bcast("reading the manifest", (m, job, err))
        if err:
            raise EkdError(err)
        self.job = job
        os.makedirs(self.model_dir, exist_ok=True)
        t = m["tables"].get(table) if m is not None else None
        if m is not None:
            if t is not None:
                where = os.path.join(self.model_dir, MANIFEST)
                for k, mine in (("dim", want["dim"]), ("kind", want["kind"])):
                    if mine is not None and t[k] != mine:
                        raise EkdError("embkv.distributed: table %r: %s is %r, but the checkpoint in %s has %r "
                                       "(another table, or another job's model_dir): give the same, or another "
                                       "model_dir" % (table, k, mine, where, t[k]))
                # The table's own options: one given must be the
                # checkpoint's, one left out is taken from it; the sizes
                # of memory and tiers (_RUNTIME) may change at a restart.
                mine = {k: v for k, v in options.items() if k not in _RUNTIME}
                theirs = {k: v for k, v in t["options"].items() if k not in _RUNTIME}
                bad = {k: v for k, v in mine.items() if str(v) != str(theirs.get(k, "(none)"))}
                if bad:
                    raise EkdError("embkv.distributed: table %r: options differ from the checkpoint in %s: %s "
                                   "(another table, or another job's model_dir): give the checkpoint's, leave them "
                                   "out to take them, or use another model_dir"
                                   % (table, where, _diff({k: theirs.get(k, "(none)") for k in bad}, bad)))
                dim = t["dim"]
                options = dict(theirs, **{k: v for k, v in options.items() if k in _RUNTIME})
            if buckets is not None and int(buckets) != m["buckets"]:
                raise EkdError("embkv.distributed: table %r: buckets=%d, but the checkpoint in %s has %d buckets "
                               "(they cannot change)" % (table, buckets, os.path.join(self.model_dir, MANIFEST),
                                                       m["buckets"]))
            buckets = m["buckets"]
        if dim is None:
            raise ValueError("embkv.distributed: table %r does not exist: give dim (and options) to create it" % table)
        self.buckets = int(buckets if buckets is not None else DEFAULT_BUCKETS)
        if not world <= self.buckets <= 1 << 20:
            raise ValueError("embkv.distributed: table %r: buckets must be from the number of ranks (%d) to 1048576, "
                             "not %d" % (table, world, self.buckets))
        self._options = dict(options)
        self._dim_req = int(dim)
        if t is not None and t["world_size"] != world:
            m = _reshard(self, m)
        elif t is not None and ("moved_from" in t or "moving_to" in t):
            # a move that ended (its sources' copies to remove), or one cut
            # before its manifest (the copies it made to remove)
            m = _cleanup(self, m)
        if m is not None:
            _latest[self.model_dir] = m
        t = m["tables"].get(table) if m is not None else None
        self.bucket_map = np.asarray(t["bucket_map"], np.int64) if t is not None else _default_map(self.buckets, world)
        err = None
        try:
            self.conn = self._open_shard(rank)
        except (EkdError, ValueError, sqlite3.Error) as e:
            err = str(e)
        self._g.agree("opening the shards of table %r" % table, err)
        self.embedding_dim = embkv.dim(self.conn, table)
        _alive.add(self)
        self._owner = _OwnerStep(self.embedding_dim)
        self._touched = []          # ids this shard served since the last checkpoint
        self.bytes_sent = 0         # ids, rows and gradients this rank sent to other ranks (payload bytes)

    # -- the shard

    def _open_shard(self, k, conn=None):
        """This module's table in shard k's database (created, with the
        module's options, when absent); a new connection unless given."""
        c = conn or embkv.connect(_shard_db(self.model_dir, k), timeout=30)
        _claim(c, _shard_db(self.model_dir, k), self.job)
        opts = dict(self._options)
        row = c.execute("SELECT sql FROM sqlite_schema WHERE type='table' AND name=? COLLATE NOCASE",
                        (self.table,)).fetchone()
        if row is None:
            opts["durable"] = "checkpoint"
            opts["path"] = "%s.rank-%05d.embkv" % (self.table, k)
        elif "durable='checkpoint'" not in (row[0] or "").replace(" ", ""):
            raise EkdError("embkv.distributed: table %r in %s was not made by embkv.distributed (its CREATE lacks "
                           "durable='checkpoint'): give another model_dir or table name"
                           % (self.table, _shard_db(self.model_dir, k)))
        # (an existing table: the store's rule refuses other options)
        ekt._TableModule(c, self.table, dim=self._dim_req, **opts)
        return c

    def _release_owner(self):
        st = self._owner
        self._owner = _OwnerStep(self.embedding_dim)
        if st.pulled.any():
            try:
                embkv.release(self.conn, self.table, st.ids[st.pulled])
            except sqlite3.Error:
                pass

    def _push_owner(self):
        st = self._owner
        self._owner = _OwnerStep(self.embedding_dim)
        got = st.has_grad
        back = ~got & st.pulled
        try:
            if got.any():
                g = st.grad[got]
                # (an infinity or a NaN a rank sent is the push's to refuse, as such)
                big = np.isfinite(g) & (np.abs(g) > np.finfo(np.float32).max)
                if big.any():
                    r, j = np.argwhere(big)[0]
                    raise EkdError("embkv.distributed: table %r: id %d: the gradients the ranks sent for it sum to "
                                   "%g in element %d, past float32's range (each was finite): clip the gradients "
                                   "or lower the loss's scale" % (self.table, st.ids[got][r], g[r, j], j))
                embkv.push(self.conn, self.table, st.ids[got], g.astype(np.float32))
        finally:
            if back.any():
                embkv.release(self.conn, self.table, st.ids[back])

    # -- forward

    def _route(self, u):
        """Owner of each id, and u reordered by owner (stable)."""
        owner = self.bucket_map[bucket_of(u, self.buckets)] if len(u) else np.empty(0, np.int64)
        order = np.argsort(owner, kind="stable")
        counts = np.bincount(owner, minlength=self._g.world)
        return order, counts

    def _refuse_if_failed(self, what):
        if self._failed:
            raise EkdError("embkv.distributed: %s of table %r: %s; this rank's shard missed that update, so the "
                           "ranks are no longer at one step: restart the job (it resumes from the last checkpoint)"
                           % (what, self.table, self._failed))

    def _gather(self, ids):
        self._g.begin()
        self._refuse_if_failed("the forward")
        flat, is_pad, u, inv = _distinct(ids, self.padding_idx, "embkv.distributed")
        training = torch.is_grad_enabled()
        me = self._g.rank
        owner = self.bucket_map[bucket_of(u, self.buckets)] if len(u) else np.empty(0, np.int64)
        ask = np.ones(len(u), bool)
        cached_rows = None
        if self.local_cache and len(u):
            cache, now, bound = self._cache, self._steps, self._cache_steps
            hits = [i for i in np.nonzero(owner != me)[0]
                    if (e := cache.get(int(u[i]))) is not None and now - e[1] < bound]
            if hits:
                ask[hits] = False
                cached_rows = np.stack([cache[int(u[i])][0] for i in hits])
                self.cache_hits += len(hits)
        ua = u[ask]
        order = np.argsort(owner[ask], kind="stable")
        counts = np.bincount(owner[ask], minlength=self._g.world)
        what = "the forward of table %r" % self.table
        rids, recv_counts = self._g.exchange(what, ua[order], counts)
        # the owner: each distinct id once
        uu, rinv = np.unique(rids, return_inverse=True)
        self._touched.append(uu)
        if training:
            rows_uu = self._owner.rows_for(self.conn, self.table, uu)
        else:
            rows_uu = np.zeros((len(uu), self.embedding_dim), np.float32)
            held = np.zeros(len(uu), bool)
            st = self._owner
            if len(st.ids) and len(uu):
                p = np.searchsorted(st.ids, uu)
                held = p < len(st.ids)
                held[held] = st.ids[p[held]] == uu[held]
                rows_uu[held] = st.rows[p[held]]
            rest = uu[~held]
            if len(rest):
                rows_uu[~held] = embkv.pull(self.conn, self.table, rest, self.embedding_dim)
                embkv.release(self.conn, self.table, rest)
        back = self._g.exchange_back(what, rows_uu[rinv], recv_counts, counts, self.embedding_dim)
        # (what crosses to other ranks: ids out, rows back to their requesters)
        self.bytes_sent += 8 * int(counts.sum() - counts[me]) + \
            4 * self.embedding_dim * int(recv_counts.sum() - recv_counts[me])
        rows_a = np.empty((len(ua), self.embedding_dim), np.float32)
        rows_a[order] = back
        rows = np.empty((len(u), self.embedding_dim), np.float32)
        rows[ask] = rows_a
        if cached_rows is not None:
            rows[~ask] = cached_rows
        if self.local_cache:
            remote = owner[ask] != me
            for i, r in zip(ua[remote].tolist(), rows_a[remote]):
                self._cache[i] = (r, self._steps)
        w, local, pad_local = _with_padding(torch.from_numpy(rows), flat, is_pad, inv, len(u))
        if not training:
            return w, local.reshape(ids.shape), pad_local
        hit_ids = u[~ask]
        ho = owner[~ask]
        f = _Fwd(self, len(u), ask, order, counts, recv_counts, rids,
                 (hit_ids, np.argsort(ho, kind="stable"), np.bincount(ho, minlength=self._g.world)))
        _pending.append(f)
        w.requires_grad_(True)
        n = len(u)
        mode = self.update

        def hook(grad):
            g = grad[:n].contiguous().numpy()
            if f.grad is not None:
                raise RuntimeError("embkv.distributed: a second backward through one forward of table %r "
                                   "(retain_graph): run a forward per backward" % self.table)
            f.grad = np.array(g, np.float32, copy=True)
            if mode == "backward" and not _queued[0]:
                _queued[0] = True
                torch.autograd.Variable._execution_engine.queue_callback(_end_step)
            return grad

        w.register_hook(hook)
        return w, local.reshape(ids.shape), pad_local

    def step(self):
        """update="step": exchange and apply the gradients of every forward
        since the last update (collective: every rank calls it)."""
        _end_step()

    def lookahead(self, ids):
        """Announce coming batches' ids to their owners (collective), which
        read ahead the rows on their SSD tier; returns the rows queued on
        this rank's shard."""
        self._g.begin()
        a = np.unique(np.ascontiguousarray(np.asarray(ids).reshape(-1), dtype=np.int64))
        order, counts = self._route(a)
        rids, _ = self._g.exchange("the look-ahead of table %r" % self.table, a[order], counts)
        if not len(rids):
            return 0
        return ekt._TableModule.lookahead(self, np.unique(rids))

    def extra_repr(self):
        return "table=%r, dim=%d, rank=%d/%d, buckets=%d" % (self.table, self.embedding_dim, self._g.rank,
                                                          self._g.world, self.buckets)

    def _describe(self):
        return {"dim": self.embedding_dim, "options": dict(sorted(self._options.items())),
                "kind": type(self).__name__, "world_size": self._g.world,
                "bucket_map": [int(x) for x in self.bucket_map]}


class ShardedEmbedding(_ShardedTable):
    """torch.nn.Embedding over a table sharded across the job's ranks."""

    def forward(self, input):
        w, local, pad = self._gather(input)
        return F.embedding(local, w, padding_idx=pad)


class ShardedEmbeddingBag(_ShardedTable):
    """torch.nn.EmbeddingBag (modes "sum" and "mean") over a table sharded
    across the job's ranks."""

    def __init__(self, model_dir, table, dim=None, mode="mean", padding_idx=None, include_last_offset=False,
                 **options):
        if mode not in ("sum", "mean"):
            raise ValueError("embkv.distributed.ShardedEmbeddingBag: mode must be 'sum' or 'mean', not %r" % (mode,))
        self._bag_args = (mode, bool(include_last_offset))
        super().__init__(model_dir, table, dim=dim, padding_idx=padding_idx, **options)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input, offsets=None, per_sample_weights=None):
        w, local, pad = self._gather(input)
        return F.embedding_bag(local, w, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=pad)


# ---------------------------------------------------------------- checkpoints

def _check_modules(modules, what):
    modules = list(modules)
    if not modules or not all(isinstance(m, _ShardedTable) for m in modules):
        raise TypeError("embkv.distributed.%s: give a list of ShardedEmbedding / ShardedEmbeddingBag modules" % what)
    dirs = {m.model_dir for m in modules}
    if len(dirs) != 1:
        raise ValueError("embkv.distributed.%s: the modules live in different model_dirs (%s): one checkpoint is "
                         "one model_dir" % (what, ", ".join(sorted(dirs))))
    names = [m.table.lower() for m in modules]
    if len(set(names)) != len(names):
        raise ValueError("embkv.distributed.%s: a table is given twice" % what)
    left = sorted({m.table for m in list(_alive) if m.model_dir == modules[0].model_dir and m not in modules} -
                  {m.table for m in modules})
    if left:
        raise ValueError("embkv.distributed.%s: table %s of %s is not among the modules: give every table of "
                         "model_dir, so that the checkpoint holds them all at one step"
                         % (what, ", ".join(map(repr, left)), modules[0].model_dir))
    if _pending:
        raise EkdError("embkv.distributed.%s: forwards of the open step have not been updated yet (their "
                       "backward, or step() with update='step', comes first)" % what)
    return modules


def checkpoint(modules, step, extra=None):
    """Make every shard of the modules' tables durable as of `step` (an
    integer, larger than the last checkpoint's), with `extra` (any object
    torch.save takes: dense model and optimizer state, data position) kept
    beside it.  Collective: every rank calls it, between steps."""
    modules = _check_modules(modules, "checkpoint")
    g = modules[0]._g
    model_dir = modules[0].model_dir
    last = _latest.get(model_dir)
    # Every rank's step, before anything is written: a rank whose step is
    # not an integer or not the others' would make a checkpoint that no
    # restore can read (its redo files under another step's name).
    try:
        mine = (operator.index(step), None)
    except TypeError:
        mine = (None, "%s %r" % (type(step).__name__, step))
    steps = g.gather("checkpoint (the step of each rank)", mine)
    odd = next((r for r, (_, bad) in enumerate(steps) if bad), None)
    if odd is not None:
        raise TypeError("embkv.distributed.checkpoint: rank %d: step must be an integer, not %s; nothing was "
                        "written" % (odd, steps[odd][1]))
    step = steps[g.rank][0]
    odd = next((r for r, (s, _) in enumerate(steps) if s != steps[0][0]), None)
    if odd is not None:
        raise EkdError("embkv.distributed.checkpoint: ranks disagree on the step: rank 0 has %d, rank %d %d; "
                       "nothing was written: call it on every rank with the same step (the job's, counted alike "
                       "on every rank)" % (steps[0][0], odd, steps[odd][0]))
    if last is not None and step <= last["step"]:
        raise ValueError("embkv.distributed.checkpoint: step %d is not after the last checkpoint's, %d"
                         % (step, last["step"]))
    # 1. redo files and the extra state
    redo = {}
    failed = next((m._failed for m in modules if m._failed), None)
    err = None
    try:
        d = _redo_dir(model_dir, step)
        os.makedirs(d, exist_ok=True)
        for m in modules:
            name = "%s.rank-%05d.export" % (m.table, g.rank)
            path = os.path.join(d, name)
            if os.path.exists(path):
                os.unlink(path)  # a checkpoint of this step that did not commit
            ids = np.unique(np.concatenate(m._touched)) if m._touched else np.empty(0, np.int64)
            n = 0
            if len(ids):
                n = m.conn.execute("SELECT embkv_export(?, ?, ?)", (m.table, path, ids.tobytes())).fetchone()[0]
            redo[m.table] = name if n else None
        _fsync_dir(d)
    except Exception as e:  # noqa: BLE001  (every rank must learn of it)
        err = "could not write its redo files: %s: %s" % (type(e).__name__, e)
    if err is None and g.rank == 0 and extra is not None:
        try:
            buf = io.BytesIO()
            torch.save(extra, buf)
            _write_atomic(_extra_file(model_dir, step), buf.getvalue())
        except Exception as e:  # noqa: BLE001
            err = "could not write extra to %s (torch.save of it failed, or the file): %s: %s" % (
                _extra_file(model_dir, step), type(e).__name__, e)
    every = g.gather("checkpoint %d (its redo files)" % step, (redo, err, failed))
    lost = [f for _, _, f in every if f]
    if lost:
        raise EkdError("embkv.distributed.checkpoint: step %d: %s: that shard missed the update, so no checkpoint "
                       "of the job can be taken; restart the job (it resumes from the last checkpoint)"
                       % (step, lost[0]))
    bad = [(r, e) for r, (_, e, _) in enumerate(every) if e]
    if bad:
        raise EkdError("embkv.distributed.checkpoint: step %d: rank %d %s" % (step, bad[0][0], bad[0][1]))
    # 2. the manifest (rank 0), the commit point
    man = {"format": _FORMAT, "version": _VERSION, "step": step, "buckets": modules[0].buckets,
           "job": modules[0].job,
           "tables": {m.table: dict(m._describe(), redo=[every[r][0][m.table] for r in range(g.world)])
                      for m in modules},
           "extra": os.path.basename(_extra_file(model_dir, step)) if extra is not None else None}
    # tables not checkpointed now but named by the last manifest stay named
    if last is not None:
        for t, desc in last["tables"].items():
            if t not in man["tables"]:
                raise EkdError("embkv.distributed.checkpoint: table %r of the last checkpoint is not among the "
                               "modules: checkpoint every table of model_dir together" % t)
    _commit(g, model_dir, man, "checkpoint %d (the manifest)" % step)
    # 3. the shards durable at the step; then the last checkpoint's files go
    err = None
    try:
        for m in modules:
            embkv.checkpoint(m.conn, m.table)
            m._touched = []
    except sqlite3.Error as e:
        err = str(e)
    g.agree("checkpoint %d (the shards)" % step, err)
    if last is not None:
        old = _redo_dir(model_dir, last["step"])
        for m in modules:
            try:
                os.unlink(os.path.join(old, "%s.rank-%05d.export" % (m.table, g.rank)))
            except FileNotFoundError:
                pass
        g.barrier("checkpoint %d (removing the last one's files)" % step)
        if g.rank == 0:
            shutil.rmtree(old, ignore_errors=True)
            if last.get("extra"):
                try:
                    os.unlink(os.path.join(model_dir, last["extra"]))
                except FileNotFoundError:
                    pass
    return step


def restore(modules):
    """Put every shard of the modules' tables back at the last checkpoint's
    step (collective); returns (step, extra), or (None, None) when model_dir
    has no checkpoint.  Call it after constructing the modules, before
    training."""
    modules = _check_modules(modules, "restore")
    g = modules[0]._g
    model_dir = modules[0].model_dir
    man, err = None, None
    if g.rank == 0:
        try:
            man = _read_manifest(model_dir)
        except EkdError as e:
            err = str(e)
    man, err = g.bcast("restore (reading the manifest)", (man, err))
    if err:
        raise EkdError(err)
    if man is None:
        # Shards become durable only at checkpoints, after a manifest: rows
        # in them without one mean the manifest was lost.
        err = None
        held = [m.table for m in modules
                if json.loads(m.conn.execute("SELECT embkv_stats(?)", (m.table,)).fetchone()[0])["rows"]]
        if held:
            err = ("the shards of %s hold rows of a checkpoint, but %s is missing (removed or lost): restore "
                   "model_dir from a backup, or remove model_dir to start the job over"
                   % (", ".join(map(repr, held)), os.path.join(model_dir, MANIFEST)))
        g.agree("restore", err)
        return None, None
    _latest[model_dir] = man
    for name, t in man["tables"].items():
        if t["world_size"] != g.world:
            raise EkdError("embkv.distributed.restore: table %r of the checkpoint in %s has %d ranks, this job %d: "
                           "construct its module first (the construction moves the buckets)"
                           % (name, model_dir, t["world_size"], g.world))
    missing = [t for t in man["tables"] if t not in {m.table for m in modules}]
    if missing:
        raise EkdError("embkv.distributed.restore: the checkpoint has tables %s that are not among the modules: "
                       "restore every table of model_dir together" % ", ".join(map(repr, missing)))
    err = None
    try:
        for m in modules:
            redo = man["tables"].get(m.table, {}).get("redo") or []
            name = redo[g.rank] if g.rank < len(redo) else None
            if name:
                path = os.path.join(_redo_dir(model_dir, man["step"]), name)
                if not os.path.exists(path):
                    raise EkdError("the checkpoint's redo file %s is missing: restore model_dir from a backup"
                                   % path)
                _check_redo(m, path, g.rank, man["tables"][m.table])
                m.conn.execute("SELECT embkv_import(?, ?)", (m.table, path)).fetchone()
            m._touched = []
            m._cache = {}
            m._release_owner()
    except (EkdError, sqlite3.Error, OSError) as e:
        err = str(e)
    g.agree("restore of step %d" % man["step"], err)
    extra = None
    if man.get("extra"):
        data, err = None, None
        if g.rank == 0:
            try:
                with open(os.path.join(model_dir, man["extra"]), "rb") as f:
                    data = f.read()
            except OSError as e:
                err = "cannot read the checkpoint's extra state: %s" % e
        data, err = g.bcast("restore (the extra state)", (data, err))
        if err:
            raise EkdError("embkv.distributed.restore: %s" % err)
        try:
            extra = torch.load(io.BytesIO(data))
        except Exception as e:  # noqa: BLE001  (whatever the unpickler says)
            raise EkdError("embkv.distributed.restore: the checkpoint's extra state %s is damaged (%s: %s): restore "
                           "model_dir from a backup" % (os.path.join(model_dir, man["extra"]), type(e).__name__,
                                                        e)) from None
    return man["step"], extra


def _check_redo(mod, path, rank, t):
    """A redo file holds rows of this rank's buckets only (a file of another
    rank's, swapped by hand, would put rows in two shards)."""
    c = sqlite3.connect("file:%s?mode=ro" % path, uri=True)
    try:
        ids = np.array([r[0] for r in c.execute("SELECT id FROM embkv_rows")], np.int64)
    except sqlite3.Error as e:
        raise EkdError("the checkpoint's redo file %s cannot be read (%s): restore model_dir from a backup"
                       % (path, e)) from None
    finally:
        c.close()
    owners = np.asarray(t["bucket_map"], np.int64)[bucket_of(ids, len(t["bucket_map"]))]
    if len(ids) and (owners != rank).any():
        raise EkdError("the checkpoint's redo file %s holds rows of rank %d's buckets, not only of rank %d's: it is "
                       "another shard's; restore model_dir from a backup" % (path, int(owners[owners != rank][0]), rank))


def stats(module):
    """embkv_stats of every shard of the module's table (collective): a list
    of dicts, rank order, each with its "rank"."""
    what = "embkv.distributed.stats of table %r" % module.table
    # (An operation of the table as the others: a rank at a forward
    # meanwhile fails at once, out of step, instead of at the timeout.)
    module._g.begin()
    module._g.counts(what, np.zeros(module._g.world, np.int64))
    st = json.loads(module.conn.execute("SELECT embkv_stats(?)", (module.table,)).fetchone()[0])
    st["rank"] = module._g.rank
    st["bytes_sent"] = module.bytes_sent
    st["exchange_seconds"] = module._g.seconds
    st["cache_hits"] = module.cache_hits
    return module._g.gather(what, st)


# ---------------------------------------------------------------- resharding

def _reshard(mod, man):
    """Move the buckets of mod's table from the manifest's ranks to this
    job's (collective).  Rows are copied first (embkv_export of the ids of
    the buckets that change owner, embkv_import at the new owner), then rank
    0 writes the manifest naming the new layout for the table, then the
    copies left behind are removed (_cleanup).  A kill before the manifest
    starts the move over (the old shards are whole: each first drops rows
    that are not its own, leftovers of a move that was cut); one after it
    leaves the cleanup to the next construction."""
    g = mod._g
    t = man["tables"][mod.table]
    old_world, step, B = t["world_size"], man["step"], man["buckets"]
    old_map = np.asarray(t["bucket_map"], np.int64)
    new_map = _default_map(B, g.world)
    what = "resharding table %r from %d to %d ranks" % (mod.table, old_world, g.world)
    move = os.path.join(mod.model_dir, "move-%s-%d-%dto%d" % (mod.table, step, old_world, g.world))
    redo = t.get("redo") or []
    # The move's mark first: a job started again with the old number of
    # ranks removes what this move copied (_cleanup).
    marked = json.loads(json.dumps(man))
    marked["tables"][mod.table]["moving_to"] = max(g.world, t.get("moving_to", 0))
    _commit(g, mod.model_dir, marked, what + " (its mark in the manifest)")
    err = None
    try:
        for k in range(old_world):
            if k % g.world != g.rank:
                continue
            db = _shard_db(mod.model_dir, k)
            if not os.path.exists(db):
                raise EkdError("shard %d's database %s is missing: every shard of the checkpoint must be "
                               "reachable under model_dir (one machine, or a shared file system)" % (k, db))
            c = embkv.connect(db, timeout=30)
            try:
                mod._open_shard(k, conn=c)
                # the old shard at the step, then only its own rows
                name = redo[k] if k < len(redo) else None
                if name:
                    c.execute("SELECT embkv_import(?, ?)",
                              (mod.table, os.path.join(_redo_dir(mod.model_dir, step), name))).fetchone()
                ids = _all_ids(c, mod.table)
                b = bucket_of(ids, B)
                own = old_map[b] == k
                if not own.all():
                    _delete(c, mod.table, ids[~own])
                    ids, b = ids[own], b[own]
                dest = new_map[b]
                os.makedirs(move, exist_ok=True)
                for n in np.unique(dest):
                    if n == k:
                        continue
                    path = os.path.join(move, "from-%05d.to-%05d.export" % (k, n))
                    if os.path.exists(path):
                        os.unlink(path)
                    c.execute("SELECT embkv_export(?, ?, ?)", (mod.table, path, ids[dest == n].tobytes())).fetchone()
            finally:
                c.close()
        if os.path.isdir(move):
            _fsync_dir(move)
    except (EkdError, sqlite3.Error, OSError) as e:
        err = str(e)
    g.agree(what + " (copying out)", err)
    err = None
    try:
        c = embkv.connect(_shard_db(mod.model_dir, g.rank), timeout=30)
        try:
            mod._open_shard(g.rank, conn=c)
            for name in sorted(os.listdir(move)) if os.path.isdir(move) else []:
                if name.endswith(".to-%05d.export" % g.rank):
                    c.execute("SELECT embkv_import(?, ?)", (mod.table, os.path.join(move, name))).fetchone()
        finally:
            c.close()
    except (EkdError, sqlite3.Error, OSError) as e:
        err = str(e)
    g.agree(what + " (copying in)", err)
    new = json.loads(json.dumps(marked))
    nt = new["tables"][mod.table]
    nt.update({"world_size": g.world, "bucket_map": [int(x) for x in new_map], "redo": [],
               "moved_from": max(old_world, nt.pop("moving_to"))})
    _commit(g, mod.model_dir, new, what + " (the manifest)")
    return _cleanup(mod, new)


def _cleanup(mod, man):
    """After a move, or after one cut before its manifest: each shard keeps
    only its own rows of mod's table (the manifest's bucket map), and shards
    past the job's ranks lose the table (collective; again at each
    construction until done).  Returns the manifest, rewritten without the
    marks."""
    g = mod._g
    t = man["tables"][mod.table]
    B = man["buckets"]
    new_map = np.asarray(t["bucket_map"], np.int64)
    what = "the cleanup after resharding table %r" % mod.table
    err = None
    try:
        for k in range(max(t.get("moved_from", 0), t.get("moving_to", 0), g.world)):
            if k % g.world != g.rank or not os.path.exists(_shard_db(mod.model_dir, k)):
                continue
            c = embkv.connect(_shard_db(mod.model_dir, k), timeout=30)
            try:
                if k >= g.world:
                    if c.execute("SELECT 1 FROM sqlite_schema WHERE name=? COLLATE NOCASE",
                                 (mod.table,)).fetchone():
                        c.execute("DROP TABLE %s" % ekt._quote(mod.table))
                    continue
                mod._open_shard(k, conn=c)
                ids = _all_ids(c, mod.table)
                gone = ids[new_map[bucket_of(ids, B)] != k]
                if len(gone):
                    _delete(c, mod.table, gone)
            finally:
                c.close()
    except (EkdError, sqlite3.Error, OSError) as e:
        err = str(e)
    g.agree(what, err)
    new = json.loads(json.dumps(man))
    new["tables"][mod.table].pop("moved_from", None)
    new["tables"][mod.table].pop("moving_to", None)
    if g.rank == 0:
        for name in os.listdir(mod.model_dir):
            if name.startswith("move-%s-" % mod.table):
                shutil.rmtree(os.path.join(mod.model_dir, name), ignore_errors=True)
    _commit(g, mod.model_dir, new, what + " (the manifest)")
    return new


def _all_ids(conn, table):
    return np.array([r[0] for r in conn.execute("SELECT id FROM %s" % ekt._quote(table))], np.int64)


def _delete(conn, table, ids):
    """Delete ids from table in one transaction (its COMMIT checkpoints: the
    state is a checkpoint's here)."""
    conn.execute("BEGIN")
    try:
        for a in range(0, len(ids), 10000):
            conn.execute("DELETE FROM %s WHERE id IN (SELECT value FROM json_each(?))" % ekt._quote(table),
                         (json.dumps([int(x) for x in ids[a:a + 10000]]),))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
