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
leaf (duplicates already summed), a hook adds it to the step's, which is
pushed (embkv_push) at the update: the table's optimizer (sgd, adagrad or
adam, set on the table) updates the rows in the store, as FBGEMM's fused
backward does.  No torch optimizer touches them, and
the module has no parameters.

One step, one update: every forward of a table on a connection until its
update belongs to one step (_Step), whichever module made it.  An id is
pulled once per step (a second forward reuses the rows, so forwards sharing
ids never wait for each other's permits), and the gradients of all of them
are summed per id and pushed once, at the end of the backward pass
(update="backward", through autograd's end-of-pass callback) or at step()
(update="step", torch's accumulate-then-step).

Permits: a step's update returns them (also when its push fails: a NaN
gradient, say; rows without a gradient go back without an update), and
otherwise (inference with gradients on, a graph dropped without backward,
an exception inside the step) as soon as the step's last batch tensor is
freed, or by release() (a backward after release() pushes nothing).  The
module need not outlive its outputs.  A forward under torch.no_grad() takes
none (eval mode alone does not stop gradients, as in torch).  A second
backward through one forward (retain_graph) is an error: its rows were
updated by the first.  Threads that train at once need a connection each:
a pull waiting for a permit holds its connection, so a push on the same
connection could not run.

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


class _Step:
    """One update of one table on one connection: the rows its forwards
    pulled since the last update (each id once, so each holds one permit),
    and the gradients their backward passes gave, summed per id.  Every
    module of the table on that connection shares it: a step that calls the
    table several times (TransE: heads, tails, corrupted ones) applies one
    update, as torch sums the gradients of a parameter and its optimizer
    steps once.  It ends at the end of the backward pass that reached it
    (update="backward"), or at the module's step() (update="step"): the
    summed gradient is pushed (embkv_push, one optimizer step and one tick of
    the clock per row), and the permits of rows that got none are returned.
    state: "open", "closed" (pushed) or "released"."""

    __slots__ = ("conn", "table", "key", "dim", "mode", "ids", "rows", "grad", "has_grad", "state", "lock",
                 "queued", "leaves", "__weakref__")

    def __init__(self, conn, table, key, dim, mode):
        self.conn, self.table, self.key, self.dim, self.mode = conn, table, key, dim, mode
        self.ids = np.empty(0, np.int64)           # sorted
        self.rows = np.empty((0, dim), np.float32)
        self.grad = None                           # allocated by the first gradient
        self.has_grad = np.empty(0, bool)
        self.state = "open"
        self.lock = threading.RLock()
        self.queued = False                        # its end is queued on the running backward pass
        self.leaves = 0                            # batch tensors alive that may still get a gradient

    def _find(self, u):
        """Positions of the sorted ids u in self.ids, and which are there."""
        pos = np.searchsorted(self.ids, u)
        there = pos < len(self.ids)
        there[there] = self.ids[pos[there]] == u[there]
        return pos, there

    def rows_for(self, u):
        """The rows of the sorted distinct ids u, pulling (with their
        permits) those the step has not pulled yet."""
        with self.lock:
            if not len(self.ids):
                # The step's first forward (with one forward a step, the
                # only one): no merging.
                self.rows = embkv.pull(self.conn, self.table, u, self.dim)
                self.ids = u.copy()
                self.has_grad = np.zeros(len(u), bool)
                self.grad = None
                return np.array(self.rows, copy=True)
            pos, there = self._find(u)
            new = u[~there]
            if len(new):
                r = embkv.pull(self.conn, self.table, new, self.dim)
                ids = np.concatenate([self.ids, new])
                order = np.argsort(ids, kind="stable")
                self.ids = ids[order]
                self.rows = np.concatenate([self.rows, r])[order]
                if self.grad is not None:
                    self.grad = np.concatenate([self.grad, np.zeros((len(new), self.dim), np.float32)])[order]
                self.has_grad = np.concatenate([self.has_grad, np.zeros(len(new), bool)])[order]
                pos = np.searchsorted(self.ids, u)
            return self.rows[pos].copy()

    def cached(self, u):
        """(rows of the ids of u the step holds, mask of those ids): reads
        without gradient see the step's rows, and take no permit for them."""
        with self.lock:
            pos, there = self._find(u)
            return self.rows[pos[there]], there

    def add(self, u, g):
        with self.lock:
            if self.grad is None and len(u) == len(self.ids):
                self.grad = np.array(g, dtype=np.float32, copy=True)  # u is self.ids: sorted, distinct
                self.has_grad[:] = True
                return
            if self.grad is None:
                self.grad = np.zeros((len(self.ids), self.dim), np.float32)
            pos = np.searchsorted(self.ids, u)
            self.grad[pos] += g
            self.has_grad[pos] = True

    def end(self):
        """The update: push the summed gradients, return the other permits.
        Returns the rows updated (embkv_push's count: rows a table with
        admission does not hold yet are not among them)."""
        with self.lock:
            if self.state != "open":
                return 0
            self.state = "closed"
            _forget_step(self)
            got = self.has_grad
            updated = 0
            try:
                if got.all():
                    updated = embkv.push(self.conn, self.table, self.ids, self.grad)
                elif got.any():
                    updated = embkv.push(self.conn, self.table, self.ids[got], self.grad[got])
            except BaseException:
                # The update failed (a NaN gradient, a transaction open on the
                # connection): the permits go back all the same.
                self._return(self.ids[got])
                raise
            finally:
                self._return(self.ids[~got])
            return updated

    def release(self):
        """No update: every permit back (release(), or every batch tensor
        freed without a backward)."""
        with self.lock:
            if self.state != "open":
                return
            self.state = "released"
            _forget_step(self)
            self._return(self.ids)

    def _return(self, ids):
        if not len(ids):
            return
        try:
            embkv.release(self.conn, self.table, ids)
        except sqlite3.ProgrammingError:
            # Another thread than the connection's (a finalizer run by the
            # garbage collector): the connection's next forward, step or
            # release() returns them.
            with _deferred_lock:
                _deferred.setdefault(id(self.conn), []).append((self.table, ids))
        except sqlite3.Error:
            pass  # the connection is closed: its permits went with it

    def leaf_freed(self):
        with self.lock:
            self.leaves -= 1
            if self.leaves == 0 and self.state == "open" and not self.has_grad.any():
                self.release()


_steps = {}                    # (id(conn), table key) -> the open _Step
_steps_lock = threading.Lock()
_deferred = {}                 # id(conn) -> [(table, ids)] whose release must run on the connection's thread
_deferred_lock = threading.Lock()


def _forget_step(step):
    with _steps_lock:
        if _steps.get((id(step.conn), step.key)) is step:
            del _steps[(id(step.conn), step.key)]


def _open_step(conn, table, key, dim, mode):
    with _steps_lock:
        st = _steps.get((id(conn), key))
        if st is not None and st.mode != mode:
            raise ValueError("embkv.torch: modules of table %r on one connection disagree: update=%r and %r"
                             % (table, st.mode, mode))
        if st is None:
            st = _steps[(id(conn), key)] = _Step(conn, table, key, dim, mode)
        return st


def _peek_step(conn, key):
    with _steps_lock:
        return _steps.get((id(conn), key))


def _flush_deferred(conn):
    with _deferred_lock:
        todo = _deferred.pop(id(conn), [])
    for table, ids in todo:
        try:
            embkv.release(conn, table, ids)
        except sqlite3.Error:
            pass


class _TableModule(torch.nn.Module):
    def __init__(self, conn, table, dim=None, padding_idx=None, update="backward", **options):
        super().__init__()
        if update not in ("backward", "step"):
            raise ValueError("embkv.torch: update must be 'backward' (one update per backward pass) or 'step' "
                             "(gradients summed until step()), not %r" % (update,))
        self.conn = conn
        self.table = table
        self.update = update
        schema, name = _split_table(conn, table)
        self._key = ((schema or "").lower(), name.lower())
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

    def extra_repr(self):
        return "table=%r, dim=%d%s" % (self.table, self.embedding_dim,
                                       "" if self.padding_idx is None else ", padding_idx=%d" % self.padding_idx)

    # -- permits

    def release(self):
        """Return the permits of the open step of this table (forwards not
        followed by their update; a backward after release() pushes
        nothing)."""
        _flush_deferred(self.conn)
        st = _peek_step(self.conn, self._key)
        if st is not None:
            st.release()

    def step(self):
        """Apply the gradients summed since the last update (update="step":
        torch's accumulate-then-step; with update="backward" the end of each
        backward pass does it).  Returns the rows updated."""
        _flush_deferred(self.conn)
        st = _peek_step(self.conn, self._key)
        return st.end() if st is not None else 0

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
        flat, is_pad, u, inv = _distinct(ids, self.padding_idx, "embkv.torch")
        _flush_deferred(self.conn)
        # As torch's: eval mode changes nothing here, only torch.no_grad() does.
        training = torch.is_grad_enabled()
        if not training:
            rows = np.zeros((len(u), self.embedding_dim), np.float32)
            st = _peek_step(self.conn, self._key)
            there = np.zeros(len(u), bool)
            if st is not None and len(u):
                held, there = st.cached(u)
                rows[there] = held
            rest = u[~there]
            if len(rest):
                rows[~there] = embkv.pull(self.conn, self.table, rest, self.embedding_dim)
                embkv.release(self.conn, self.table, rest)
            w = torch.from_numpy(rows)
        elif len(u) == 0:
            w = torch.zeros((0, self.embedding_dim))
        else:
            st = _open_step(self.conn, self.table, self._key, self.embedding_dim, self.update)
            w = torch.from_numpy(st.rows_for(u))
        w, local, pad_local = _with_padding(w, flat, is_pad, inv, len(u))
        if not training or len(u) == 0:
            return w, local.reshape(ids.shape), pad_local
        w.requires_grad_(True)
        n = len(u)
        given = [False]  # this batch tensor's gradient went into an update

        def hook(grad):
            g = grad[:n].contiguous().numpy()
            with st.lock:
                if given[0]:
                    raise RuntimeError("embkv.torch: a second backward through one forward of table %r "
                                       "(retain_graph): the first one updated its rows already; run a forward per "
                                       "backward" % self.table)
                given[0] = True
                if st.state == "released":
                    return grad  # release() came first: the update is dropped, as documented
                if st.state == "closed":
                    # Its step was updated by an earlier backward pass: this
                    # gradient is an update of its own.
                    embkv.push(self.conn, self.table, u, g)
                    return grad
                st.add(u, g)
                if st.mode == "backward" and not st.queued:
                    st.queued = True
                    torch.autograd.Variable._execution_engine.queue_callback(st.end)
            return grad

        w.register_hook(hook)
        with st.lock:
            st.leaves += 1
        # Freed without a backward (inference under grad, an exception):
        # once no batch tensor of the step is left, the permits go back.
        weakref.finalize(w, st.leaf_freed)
        return w, local.reshape(ids.shape), pad_local


def _distinct(ids, padding_idx, who):
    """A batch's ids (a LongTensor or IntTensor of any shape): (the ids
    flat, which are padding_idx or None, the distinct others sorted as
    numpy, the index of each other one among them)."""
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError("%s: ids must be a LongTensor or IntTensor (as torch.nn.Embedding's), not %s"
                        % (who, ids.dtype))
    flat = ids.reshape(-1).to(torch.int64)
    is_pad = flat == padding_idx if padding_idx is not None else None
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
