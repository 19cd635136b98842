"""embkv tables as PyTorch embedding modules.

    import embkv, embkv.torch as ekt
    conn = embkv.connect("model.db")
    emb = ekt.EmbeddingBag(conn, "user", dim=64, mode="sum", optimizer="adagrad", lr=0.05,
                           init="normal(0,0.01)")
    out = emb(ids, offsets)          # like torch.nn.EmbeddingBag
    loss.backward()                  # the gradients go to the table's optimizer

The rows live in the table, not in the module: a forward pulls the distinct
ids of the batch once (embkv_pull, which takes their staleness permits) into
a small leaf tensor, and torch's own embedding / embedding_bag run on it, so
outputs and gradients follow torch's rules exactly (modes, offsets,
per_sample_weights, padding_idx).  When autograd has the gradient of that
leaf (duplicates already summed), a hook pushes it (embkv_push): the table's
optimizer (sgd, adagrad or adam, set on the table) updates the rows in the
store, as FBGEMM's fused backward does.  No torch optimizer touches them, and
the module has no parameters.

Permits: each forward is one pull.  Its permits are returned by its
backward's push (also when the push fails: a NaN gradient, say), and
otherwise (inference with gradients on, a graph dropped without backward,
an exception inside the step) as soon as the batch's leaf tensor is freed,
or by release() (a backward after release() pushes nothing).  The module
need not outlive its outputs.  A forward under torch.no_grad() returns them
at once (eval mode alone does not: as in torch, it does not stop gradients).
At staleness 0 an id can be pulled once before its push: two forwards of one
table in one step that share ids wait for each other (and fail after the
table's wait_ms), and a loss, output or traceback kept alive holds its
step's permits.  A second backward through one forward (retain_graph) is an
error: its rows were updated by the first.  Threads that train at once need
a connection each: a pull waiting for a permit holds its connection, so a
push on the same connection could not run.

padding_idx: that id is never read nor stored; its output rows are zeros (as
torch's, whose padding row starts at zero and gets no gradient) and bags skip
it.
"""
import json
import sqlite3
import threading
import weakref

import numpy as np
import torch
import torch.nn.functional as F

import embkv

__all__ = ["Embedding", "EmbeddingBag"]


class _Lease:
    """The permits of one forward: the distinct ids it pulled, on what
    table, and where they are.  It does not depend on the module (a module
    dropped while its output lives still pushes or releases), and the hook
    and the finalizer hold it.  state: "out", "pushed" or "released"."""

    __slots__ = ("conn", "table", "ids", "state", "lock", "__weakref__")

    def __init__(self, conn, table, ids):
        self.conn, self.table, self.ids = conn, table, ids
        self.state = "out"
        self.lock = threading.Lock()

    def push(self, grad):
        with self.lock:
            if self.state == "pushed":
                raise RuntimeError("embkv.torch: a second backward through one forward of table %r (retain_graph): "
                                   "the first one updated its rows already; run a forward per backward" % self.table)
            if self.state == "released":
                return  # release() came first: the update is dropped, as documented
            try:
                embkv.push(self.conn, self.table, self.ids, grad)
            except BaseException:
                # The update failed (a NaN gradient, a transaction open on the
                # connection): the permits go back all the same, now or later.
                self._release_locked()
                raise
            self.state = "pushed"

    def release(self):
        with self.lock:
            if self.state == "out":
                self._release_locked()

    def _release_locked(self):
        try:
            embkv.release(self.conn, self.table, self.ids)
            self.state = "released"
        except sqlite3.ProgrammingError:
            # Another thread than the connection's (a finalizer run by the
            # garbage collector): the connection's next forward, backward
            # or release() returns them.
            with _deferred_lock:
                _deferred.setdefault(id(self.conn), []).append(self)
        except sqlite3.Error:
            pass  # the connection is closed: its permits went with it


_deferred = {}                 # id(conn) -> leases whose release must run on the connection's thread
_deferred_lock = threading.Lock()


def _flush_deferred(conn):
    with _deferred_lock:
        todo = _deferred.pop(id(conn), [])
    for lease in todo:
        lease.release()


def _finalize(lease):
    if lease.state == "out":
        lease.release()


class _TableModule(torch.nn.Module):
    def __init__(self, conn, table, dim=None, padding_idx=None, **options):
        super().__init__()
        self.conn = conn
        self.table = table
        schema, name = _split_table(conn, table)
        exists = conn.execute("SELECT 1 FROM %s.sqlite_schema WHERE type = 'table' AND name = ? COLLATE NOCASE"
                              % _quote(schema or "main"), (name,)).fetchone()
        quoted = _quote(name) if schema is None else "%s.%s" % (_quote(schema), _quote(name))
        opts = ["%s=%s" % (k, _sql_option(v)) for k, v in options.items()]
        if not exists:
            if dim is None:
                raise ValueError("embkv.torch: table %r does not exist: give dim (and options) to create it" % table)
            conn.execute("CREATE VIRTUAL TABLE %s USING embkv(%s)" % (quoted, ", ".join(["dim=%d" % int(dim)] + opts)))
        elif opts:
            # The store's rule decides: a table attached to the same store
            # with these options is refused when one differs (naming it).
            st = json.loads(conn.execute("SELECT embkv_stats(?)", (table,)).fetchone()[0])
            probe = "_embkv_torch_check_%d" % threading.get_ident()
            try:
                conn.execute("CREATE VIRTUAL TABLE temp.%s USING embkv(dim=%d, path=%s, %s)"
                             % (_quote(probe), st["dim"], _sql_option(st["path"]), ", ".join(opts)))
            except sqlite3.Error as e:
                if "cannot create or drop embkv tables" not in str(e):
                    # The refusal names the probe's table: say the user's.
                    why = str(e).replace("embkv table %s: " % probe, "")
                    raise ValueError("embkv.torch: table %r exists with other options: %s" % (table, why)) from None
                # A read-only connection cannot make the probe; it cannot
                # train either, so the training options do not matter.
            else:
                conn.execute("DROP TABLE temp.%s" % _quote(probe))
        self.embedding_dim = embkv.dim(conn, table)
        if dim is not None and int(dim) != self.embedding_dim:
            raise ValueError("embkv.torch: table %r has dim %d, not %d" % (table, self.embedding_dim, dim))
        self.padding_idx = padding_idx
        self._leases = weakref.WeakSet()  # forwards whose permits may be out

    def extra_repr(self):
        return "table=%r, dim=%d%s" % (self.table, self.embedding_dim,
                                       "" if self.padding_idx is None else ", padding_idx=%d" % self.padding_idx)

    # -- permits

    def release(self):
        """Return the permits of every forward not followed by a backward
        (a backward after release() pushes nothing)."""
        _flush_deferred(self.conn)
        for lease in list(self._leases):
            lease.release()

    def lookahead(self, ids):
        """Announce the ids of coming batches (embkv_lookahead), so that rows
        on the SSD tier are read ahead; returns the rows queued.  A table
        without an SSD tier (no ssd_size) has every row in memory already:
        nothing to queue, 0."""
        a = np.ascontiguousarray(np.asarray(ids).reshape(-1), dtype=np.int64)
        try:
            return self.conn.execute("SELECT embkv_lookahead(?, ?)", (self.table, a.tobytes())).fetchone()[0]
        except Exception as e:
            if "no such function" in str(e):
                return 0
            raise

    # -- the batch's rows

    def _gather(self, ids):
        """Pull the distinct ids of ids (a LongTensor); returns the leaf
        weight tensor (one row per distinct id, plus a zero row for padding
        when there is padding) and ids mapped to its rows."""
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError("embkv.torch: ids must be a LongTensor or IntTensor (as torch.nn.Embedding's), not %s"
                            % ids.dtype)
        _flush_deferred(self.conn)
        flat = ids.reshape(-1).to(torch.int64)
        pad_local = None
        if self.padding_idx is not None:
            is_pad = flat == self.padding_idx
            real = flat[~is_pad]
        else:
            is_pad, real = None, flat
        uniq, inv = torch.unique(real, return_inverse=True)
        u = uniq.numpy()
        rows = embkv.pull(self.conn, self.table, u, self.embedding_dim) if len(u) else \
            np.zeros((0, self.embedding_dim), np.float32)
        w = torch.from_numpy(np.array(rows, dtype=np.float32, copy=True))
        local = torch.empty_like(flat)
        if is_pad is not None:
            pad_local = len(u)
            w = torch.cat([w, torch.zeros(1, self.embedding_dim)])
            local[is_pad] = pad_local
            local[~is_pad] = inv
        else:
            local = inv
        # As torch's: eval mode changes nothing here, only torch.no_grad() does.
        training = torch.is_grad_enabled()
        if not training or len(u) == 0:
            if len(u):
                embkv.release(self.conn, self.table, u)
            return w, local.reshape(ids.shape), pad_local
        w.requires_grad_(True)
        lease = _Lease(self.conn, self.table, u)
        self._leases.add(lease)
        n = len(u)

        def push(grad):
            lease.push(grad[:n].contiguous().numpy())
            return grad

        w.register_hook(push)
        # Freed without a backward (inference under grad, an exception):
        # the permits go back.
        weakref.finalize(w, _finalize, lease)
        return w, local.reshape(ids.shape), pad_local


def _quote(name):
    return '"%s"' % name.replace('"', '""')


def _ident(text, i):
    """One identifier of a table name at text[i:] (bare up to a dot, or
    "quoted", [bracketed], `quoted`): (its text, the index after it), or
    (None, i)."""
    close = {'"': '"', '[': ']', '`': '`'}.get(text[i:i + 1])
    if close is None:
        j = text.find(".", i)
        j = len(text) if j < 0 else j
        return (text[i:j], j) if j > i else (None, i)
    out, j = [], i + 1
    while j < len(text):
        if text[j] == close:
            if close != "]" and text[j + 1:j + 2] == close:
                out.append(close)
                j += 2
                continue
            return "".join(out), j + 1
        out.append(text[j])
        j += 1
    return None, i


def _split_table(conn, table):
    """(schema or None, name): a table name as embkv's SQL functions read
    it ("item", "schema.item", parts quoted as SQL quotes them); the whole
    text is the name when it does not read as schema.name of an attached
    schema."""
    a, i = _ident(table, 0)
    b = None
    if a is not None and table[i:i + 1] == ".":
        b, i = _ident(table, i + 1)
    if a is None or i != len(table):
        return None, table
    if b is None:
        return None, a
    schemas = {r[1].lower() for r in conn.execute("PRAGMA database_list")} | {"temp"}
    return (a, b) if a.lower() in schemas else (None, table)


def _sql_option(v):
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


class Embedding(_TableModule):
    """torch.nn.Embedding over an embkv table: forward(input) with a
    LongTensor of ids of any shape gives input.shape + (dim,)."""

    def forward(self, input):
        w, local, pad = self._gather(input)
        return F.embedding(local, w, padding_idx=pad)


class EmbeddingBag(_TableModule):
    """torch.nn.EmbeddingBag over an embkv table (modes "sum" and "mean"):
    forward(input, offsets=None, per_sample_weights=None) as torch's."""

    def __init__(self, conn, table, dim=None, mode="mean", padding_idx=None, include_last_offset=False, **options):
        if mode not in ("sum", "mean"):
            raise ValueError("embkv.torch.EmbeddingBag: mode must be 'sum' or 'mean', not %r" % (mode,))
        super().__init__(conn, table, dim=dim, padding_idx=padding_idx, **options)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def extra_repr(self):
        return super().extra_repr() + ", mode=%r" % self.mode

    def forward(self, input, offsets=None, per_sample_weights=None):
        w, local, pad = self._gather(input)
        return F.embedding_bag(local, w, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=pad)
