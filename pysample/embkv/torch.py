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
backward's push, and otherwise (inference with gradients on, a graph dropped
without backward, an exception inside the step) as soon as the batch's leaf
tensor is freed, or by release() (a backward after release() pushes nothing).
A forward under torch.no_grad() or in eval mode returns them at once.  At
staleness 0 an id can be pulled once before its push: two forwards of one
table in one step that share ids wait for each other (and fail after the
table's wait_ms).

padding_idx: that id is never read nor stored; its output rows are zeros (as
torch's, whose padding row starts at zero and gets no gradient) and bags skip
it.
"""
import threading
import weakref

import numpy as np
import torch
import torch.nn.functional as F

import embkv

__all__ = ["Embedding", "EmbeddingBag"]


class _Batch:
    """The distinct ids of one forward and whether their permits are back."""

    __slots__ = ("ids", "done", "__weakref__")

    def __init__(self, ids):
        self.ids = ids
        self.done = False


class _TableModule(torch.nn.Module):
    def __init__(self, conn, table, dim=None, padding_idx=None, **options):
        super().__init__()
        self.conn = conn
        self.table = table
        exists = conn.execute("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?", (table,)).fetchone()
        if not exists:
            if dim is None:
                raise ValueError("embkv.torch: table %r does not exist: give dim (and options) to create it" % table)
            opts = ["dim=%d" % int(dim)] + ["%s=%s" % (k, _sql_option(v)) for k, v in options.items()]
            conn.execute('CREATE VIRTUAL TABLE "%s" USING embkv(%s)' % (table.replace('"', '""'), ", ".join(opts)))
        elif options:
            raise ValueError("embkv.torch: table %r exists: its options are the table's own, not %s"
                             % (table, ", ".join(sorted(options))))
        self.embedding_dim = embkv.dim(conn, table)
        if dim is not None and int(dim) != self.embedding_dim:
            raise ValueError("embkv.torch: table %r has dim %d, not %d" % (table, self.embedding_dim, dim))
        self.padding_idx = padding_idx
        self._pending = []          # _Batch of forwards whose permits are out
        self._lock = threading.Lock()

    def extra_repr(self):
        return "table=%r, dim=%d%s" % (self.table, self.embedding_dim,
                                       "" if self.padding_idx is None else ", padding_idx=%d" % self.padding_idx)

    # -- permits

    def _give_back(self, batch):
        with self._lock:
            if batch.done:
                return
            batch.done = True
            try:
                self._pending.remove(batch)
            except ValueError:
                pass
        embkv.release(self.conn, self.table, batch.ids)

    def lookahead(self, ids):
        """Announce the ids of coming batches (embkv_lookahead), so that rows
        on the SSD tier are read ahead; returns the rows queued.  Tables
        without an SSD tier (all of them until that tier exists) have every
        row in memory already: nothing to queue, 0."""
        a = np.ascontiguousarray(np.asarray(ids).reshape(-1), dtype=np.int64)
        try:
            return self.conn.execute("SELECT embkv_lookahead(?, ?)", (self.table, a.tobytes())).fetchone()[0]
        except Exception as e:
            if "no such function" in str(e):
                return 0
            raise

    def release(self):
        """Return the permits of every forward not followed by a backward."""
        with self._lock:
            pending = list(self._pending)
        for b in pending:
            self._give_back(b)

    # -- the batch's rows

    def _gather(self, ids):
        """Pull the distinct ids of ids (a LongTensor); returns the leaf
        weight tensor (one row per distinct id, plus a zero row for padding
        when there is padding) and ids mapped to its rows."""
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
        batch = _Batch(u)
        local = torch.empty_like(flat)
        if is_pad is not None:
            pad_local = len(u)
            w = torch.cat([w, torch.zeros(1, self.embedding_dim)])
            local[is_pad] = pad_local
            local[~is_pad] = inv
        else:
            local = inv
        training = torch.is_grad_enabled() and self.training
        if not training or len(u) == 0:
            if len(u):
                embkv.release(self.conn, self.table, u)
            return w, local.reshape(ids.shape), pad_local
        w.requires_grad_(True)
        with self._lock:
            self._pending.append(batch)
        ref = weakref.ref(self)

        def push(grad, batch=batch, n=len(u)):
            mod = ref()
            if mod is None:
                return grad
            with mod._lock:
                if batch.done:
                    return grad  # released already: the update is dropped, never applied twice
                batch.done = True
                mod._pending.remove(batch)
            embkv.push(mod.conn, mod.table, batch.ids, grad[:n].contiguous().numpy())
            return grad

        w.register_hook(push)
        # Freed without a backward (inference under grad, an exception):
        # the permits go back.
        weakref.finalize(w, _finalize_release, ref, batch)
        return w, local.reshape(ids.shape), pad_local


def _finalize_release(ref, batch):
    mod = ref()
    if mod is not None and not batch.done:
        try:
            mod._give_back(batch)
        except Exception:  # the connection is gone: its permits went with it
            pass


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
