"""embkv tables as PyTorch embedding modules.

    import embkv, embkv.torch as ekt
    conn = embkv.connect("model.db")
    emb = ekt.EmbeddingBag(conn, "user", dim=64, mode="sum", optimizer="adagrad", lr=0.05,
                           init="normal(0,0.01)")
    out = emb(ids, offsets)          # like torch.nn.EmbeddingBag
    loss.backward()                  # the gradients go to the table's optimizer

The rows live in the table, not in the module: a forward pulls one row per
id of the batch (embkv_pull, which reads a repeated id once and takes one
staleness permit per id) into a tensor of its own (the output of a node of
the graph, _Rows); Embedding's output is that tensor, and torch's own
embedding_bag runs on it, so outputs and gradients follow torch's rules
exactly (modes, offsets, per_sample_weights, padding_idx).  When autograd
has the gradient of those rows (one row per occurrence), the node hands it
to the step, which pushes (embkv_push) at the
update: the store sums each id's gradients and the table's optimizer (sgd,
adagrad or adam, set on the table) updates the rows, as FBGEMM's fused
backward does.  No torch optimizer touches them, the module has no
parameters, and nothing is deduplicated or merged in Python (numpy's
merging of a TransE step's ~37,000 ids would cost more than the store's own
work).

One step, one update: every forward of a table on a connection until its
update belongs to one step (_Step), whichever module made it.  A step's
first pull of an id takes its permit and later pulls take none (embkv_pull's
'once'), so forwards sharing ids never wait for each other's permits, and
the gradients of all of them go to one push, at the end of the backward pass
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

device="cuda" (or .to("cuda"), .cuda()), on a connection opened with
check_same_thread=False (a CUDA backward runs on autograd's device thread):
forwards return CUDA tensors, the
rows gathered straight into device memory on the current stream
(embkv_pull_device: the GPU reads the pool's rows where they lie), and the
backward's CUDA gradients are summed per id on the GPU and applied by the
table's optimizer (embkv_push_device): the same values as on the CPU.  Ids
may be on either device.  It needs a CUDA build of PyTorch and an embkv
built with CUDA (SELECT embkv_gpu() says whether a GPU is usable).
"""
import contextlib
import json
import numbers
import re
import sqlite3
import threading
import weakref

import numpy as np
import torch
import torch.nn.functional as F

import embkv

__all__ = ["Embedding", "EmbeddingBag"]


class _Step:
    """One update of one table on one connection: the ids its forwards
    pulled since the last update, each forward's with its duplicates (a
    step's first pull of an id takes its permit, later pulls of it take
    none: embkv_pull's 'once'), and the gradients their backward passes
    gave, one row per occurrence.  Every module of the table on that
    connection shares it: a step that calls the table several times
    (TransE: heads, tails, corrupted ones) applies one update, as torch sums
    the gradients of a parameter and its optimizer steps once.  It ends at
    the end of the backward pass that reached it (update="backward"), or at
    the module's step() (update="step"): the gradients of all its forwards
    go to one embkv_push, which sums them per id (in the store, in double)
    and applies one optimizer step and one tick of the clock per row, and
    the permits of ids that got no gradient are returned.  Nothing is
    merged here: the store does it, once, in C.
    state: "open", "closed" (pushed) or "released"."""

    __slots__ = ("conn", "table", "key", "dim", "mode", "pulled", "grads", "extra", "state", "lock", "queued",
                 "raised", "leaves", "owner", "__weakref__")

    def __init__(self, conn, table, key, dim, mode):
        self.conn, self.table, self.key, self.dim, self.mode = conn, table, key, dim, mode
        self.pulled = []                           # per forward: its ids (int64, duplicates kept)
        self.grads = {}                            # forward number -> its gradient rows
        self.extra = []                            # (ids, rows): late gradients of ids it holds (_late_push)
        self.state = "open"
        self.lock = threading.RLock()
        self.queued = False                        # its end is queued on the running backward pass
        self.raised = False                        # a backward pass raised in one of its hooks (a NaN gradient)
        self.leaves = 0                            # batch tensors alive that may still get a gradient
        self.owner = threading.get_ident()         # the thread whose forwards make the step

    def pull(self, ids, device=None):
        """Rows of ids (writable; a CUDA tensor when device is one), and
        the forward's number in the step."""
        with self.lock:
            if device is not None and device.type == "cuda":
                rows = _pull_cuda(self.conn, self.table, ids, self.dim, device, once=bool(self.pulled))
            else:
                rows = _writable(embkv.pull(self.conn, self.table, ids, self.dim, once=bool(self.pulled)))
            self.pulled.append(ids)
            return rows, len(self.pulled) - 1

    def held(self):
        """The distinct ids the step holds a permit on."""
        return np.unique(np.concatenate(self.pulled)) if self.pulled else np.empty(0, np.int64)

    def add(self, k, g):
        with self.lock:
            self.grads[k] = g

    def end(self):
        """The update: push the gradients, return the other permits.
        Returns the rows updated (embkv_push's count: rows a table with
        admission does not hold yet are not among them)."""
        with self.lock:
            if self.state != "open":
                return 0
            self.state = "closed"
            _forget_step(self)
            got = sorted(self.grads)
            updated = 0
            ids = g = None
            try:
                if len(got) == 1 and not self.extra:
                    ids, g = self.pulled[got[0]], self.grads[got[0]]
                elif got or self.extra:
                    ids = np.concatenate([self.pulled[k] for k in got] + [e[0] for e in self.extra])
                    gs = [self.grads[k] for k in got] + [e[1] for e in self.extra]
                    cuda = [x.device for x in gs if isinstance(x, torch.Tensor)]
                    # (modules of one table on both devices: summed on the GPU)
                    g = (torch.cat([torch.as_tensor(x, device=cuda[0]) for x in gs]) if cuda
                         else np.concatenate(gs))
                if ids is not None and len(ids):
                    updated = _push_any(self.conn, self.table, ids, g)
            except BaseException:
                # The update failed (a NaN gradient, a transaction open on the
                # connection): the permits go back all the same.
                self._return(np.concatenate(self.pulled))
                raise
            if len(got) < len(self.pulled):
                rest = np.concatenate([p for k, p in enumerate(self.pulled) if k not in self.grads])
                self._return(np.setdiff1d(rest, ids) if ids is not None else rest)
            return updated

    def release(self):
        """No update: every permit back (release(), or every batch tensor
        freed without a backward)."""
        with self.lock:
            if self.state != "open":
                return
            self.state = "released"
            _forget_step(self)
            if self.pulled:
                self._return(np.concatenate(self.pulled))

    def _return(self, ids):
        if not len(ids):
            return
        try:
            embkv.release(self.conn, self.table, ids)
        except sqlite3.ProgrammingError as e:
            if "closed database" in str(e):
                return  # the connection is closed: its permits went with it
            # Another thread than the connection's (a finalizer run by the
            # garbage collector): the connection's next forward, step or
            # release() returns them.
            embkv._defer_release(self.conn, self.table, ids)
        except sqlite3.Error:
            pass  # the connection is closed: its permits went with it

    def failed(self):
        """Whether the backward pass that would have ended this step is over
        without ending it: it raised, after queueing the end (torch drops
        the callbacks of a pass that fails) or in a hook of the step's
        before that (a NaN gradient)."""
        return (self.queued or self.raised) and self.state == "open" and not _backward_running()

    def leaf_freed(self):
        with self.lock:
            self.leaves -= 1
            # (failed() asked in the owner's thread only: see _gather)
            if self.leaves == 0 and self.state == "open" and (
                    not self.grads or (threading.get_ident() == self.owner and self.failed())):
                self.release()


def _writable(rows):
    """rows, or a copy where they are read-only (embkv.pull's view of a
    result BLOB, when it could not pull into a new array)."""
    return rows if rows.flags.writeable else np.array(rows)


def _nothing():
    pass


def _check_device(conn, device):
    """device (a torch.device) as a module may use it, or an error saying why not."""
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError("embkv.torch: device must be 'cpu' or 'cuda', not %r" % str(device))
    if not torch.cuda.is_available():
        raise RuntimeError("embkv.torch: device %r, but this PyTorch has no usable CUDA "
                           "(torch.cuda.is_available() is False): use a CUDA build of PyTorch on a machine "
                           "with a GPU, or device='cpu'" % str(device))
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError("embkv.torch: device %r: this machine has %d GPU(s)" % (str(device), torch.cuda.device_count()))
    gpu = json.loads(conn.execute("SELECT embkv_gpu()").fetchone()[0])
    if not gpu["usable"]:
        raise RuntimeError("embkv.torch: device %r, but embkv cannot use the GPU: %s" % (str(device), gpu.get("reason")))
    # A CUDA backward runs its hooks and its end-of-pass callback on
    # autograd's device thread (yours waits in backward() meanwhile): the
    # push happens there, so the connection must allow it.
    refused = []

    def probe():
        try:
            conn.execute("SELECT 1").fetchone()
        except sqlite3.ProgrammingError as e:
            refused.append(e)
    t = threading.Thread(target=probe)
    t.start()
    t.join()
    if refused:
        raise RuntimeError("embkv.torch: device %r needs a connection that autograd's CUDA thread may use (the "
                           "backward pass pushes from it while your thread waits in backward()): open it with "
                           "embkv.connect(path, check_same_thread=False)" % str(device))
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def _cuda_stream(device):
    return torch.cuda.current_stream(device).cuda_stream


def _pull_cuda(conn, table, ids, dim, device, once=False):
    """Rows of ids gathered into a new CUDA tensor on device (embkv_pull_device,
    on the current stream)."""
    out = torch.empty((len(ids), dim), dtype=torch.float32, device=device)
    if len(ids):
        a = np.ascontiguousarray(ids, dtype=np.int64)
        conn.execute("SELECT embkv_pull_device(?, ?, ?, ?, ?)",
                     (table, a.tobytes(), out.data_ptr(), _cuda_stream(device), "once" if once else None)).fetchone()
    return out


def _push_any(conn, table, ids, g):
    """embkv.push of numpy gradients, or embkv_push_device of CUDA ones."""
    if isinstance(g, torch.Tensor) and g.is_cuda:
        g = g.detach().to(torch.float32).contiguous()
        a = np.ascontiguousarray(ids, dtype=np.int64)
        if g.dim() != 2 or g.shape[0] != len(a):
            raise ValueError("embkv.torch: gradients of shape %s for %d ids" % (tuple(g.shape), len(a)))
        return conn.execute("SELECT embkv_push_device(?, ?, ?, ?)",
                            (table, a.tobytes(), g.data_ptr(), _cuda_stream(g.device))).fetchone()[0]
    return embkv.push(conn, table, ids, g)


def _backward_running():
    """Whether this thread is inside a backward pass (only then does
    autograd take a callback; a no-op one here)."""
    try:
        torch.autograd.Variable._execution_engine.queue_callback(_nothing)
        return True
    except RuntimeError:
        return False


_steps = {}                    # (id(conn), table key) -> the open _Step
# (An RLock, and nothing allocated under it: a collection run by an
# allocation calls finalizers, leaf_freed, which take it in the same thread.)
_steps_lock = threading.RLock()


def _forget_step(step):
    k = (id(step.conn), step.key)
    with _steps_lock:
        if _steps.get(k) is step:
            del _steps[k]


def _open_step(conn, table, key, dim, mode, check_mode=True):
    k = (id(conn), key)
    new = None
    while True:
        with _steps_lock:
            st = _steps.get(k)
            if st is None and new is not None:
                _steps[k] = st = new
        if st is not None:
            break
        new = _Step(conn, table, key, dim, mode)  # (made outside the lock, then put in if still none)
    if check_mode and st.mode != mode:
        raise ValueError("embkv.torch: modules of table %r on one connection disagree: update=%r and %r"
                         % (table, st.mode, mode))
    return st


@contextlib.contextmanager
def _current_step(conn, table, key, dim, mode, check_mode=True):
    """The open step of the table on conn (made if there is none), locked,
    and still the open one once locked (a step ended or forgotten while
    this thread waited for its lock is not joined).  One that pulled
    nothing by the end (a read under no_grad, a pull that failed) is
    forgotten: it must not keep the connection."""
    while True:
        st = _open_step(conn, table, key, dim, mode, check_mode)
        with st.lock:
            if _peek_step(conn, key) is st:
                try:
                    yield st
                finally:
                    if not st.pulled:
                        _forget_step(st)
                return


def _peek_step(conn, key):
    k = (id(conn), key)
    with _steps_lock:
        return _steps.get(k)


class _TableModule(torch.nn.Module):
    def __init__(self, conn, table, dim=None, padding_idx=None, update="backward", device=None, **options):
        super().__init__()
        if update not in ("backward", "step"):
            raise ValueError("embkv.torch: update must be 'backward' (one update per backward pass) or 'step' "
                             "(gradients summed until step()), not %r" % (update,))
        # As torch's modules take them: integers, not bools or floats.
        for what, v in (("dim", dim), ("padding_idx", padding_idx)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral)):
                raise TypeError("embkv.torch: %s must be an integer, not %r" % (what, v))
        if dim is not None and not 1 <= dim <= 8192:
            raise ValueError("embkv.torch: dim must be from 1 to 8192, not %d" % dim)
        if padding_idx is not None and not -2 ** 63 <= padding_idx < 2 ** 63:
            raise ValueError("embkv.torch: padding_idx %d does not fit in int64 (ids are int64)" % padding_idx)
        for k in options:
            if k in ("max_norm", "norm_type", "scale_grad_by_freq", "sparse", "_weight", "_freeze"):
                raise TypeError("embkv.torch: torch.nn.Embedding's argument %s is not embkv.torch's: the rows are "
                                "the table's (float32 vectors its optimizer updates, its dtype option for reduced "
                                "precision)" % k)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError("embkv.torch: %r is not an option name (options are the table's, as in "
                                 "CREATE VIRTUAL TABLE ... USING embkv(...))" % (k,))
        dim = int(dim) if dim is not None else None
        padding_idx = int(padding_idx) if padding_idx is not None else None
        self.conn = conn
        self.table = table
        self.update = update
        # (the device is checked before a table is made for it)
        want = torch.device(device) if device is not None else None
        if want is not None:
            _check_device(conn, want)
        schema, name = _split_table(conn, table)
        _not_a_missing_schema(conn, table, schema)
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
                    if why.startswith("unknown option"):
                        raise ValueError("embkv.torch: table %r: %s" % (table, why)) from None
                    raise ValueError("embkv.torch: table %r exists with other options: %s" % (table, why)) from None
                # A read-only connection cannot make the probe; it cannot
                # train either, so the training options do not matter.
            else:
                conn.execute("DROP TABLE temp.%s" % _quote(probe))
        # Every module of one table shares its steps, however it was
        # named: "t", "main.t" and "MAIN.T" are one key.
        self._key = ((schema or _schema_of(conn, name)).lower(), name.lower())
        self.embedding_dim = embkv.dim(conn, table)
        if dim is not None and int(dim) != self.embedding_dim:
            raise ValueError("embkv.torch: table %r has dim %d, not %d" % (table, self.embedding_dim, dim))
        self.padding_idx = padding_idx
        self.device = torch.device("cpu")
        if want is not None:
            self._set_device(want)

    def _set_device(self, device):
        self.device = _check_device(self.conn, device)

    def to(self, *args, **kwargs):
        device, dtype = torch._C._nn._parse_to(*args, **kwargs)[:2]
        if dtype is not None and dtype != torch.float32:
            raise TypeError("embkv.torch: the table's rows are float32 (reduced precision is the table's dtype "
                            "option), not %s" % dtype)
        if device is not None:
            self._set_device(device)
        return super().to(*args, **kwargs)

    def to_empty(self, *, device, recurse=True):
        self._set_device(torch.device(device))
        return super().to_empty(device=device, recurse=recurse)

    def half(self):
        return self.to(torch.float16)

    def double(self):
        return self.to(torch.float64)

    def bfloat16(self):
        return self.to(torch.bfloat16)

    def cuda(self, device=None):
        self._set_device(torch.device("cuda", device) if isinstance(device, int) else
                         torch.device(device if device is not None else "cuda"))
        return super().cuda(device)

    def cpu(self):
        self._set_device(torch.device("cpu"))
        return super().cpu()

    def extra_repr(self):
        return "table=%r, dim=%d%s%s" % (self.table, self.embedding_dim,
                                         "" if self.padding_idx is None else ", padding_idx=%d" % self.padding_idx,
                                         "" if self.device.type == "cpu" else ", device=%r" % str(self.device))

    def __getstate__(self):
        raise TypeError("embkv.torch: a module over table %r holds its database connection, which cannot be "
                        "pickled or copied (torch.save of the module, copy.deepcopy): its rows are the table's "
                        "(durable with embkv.checkpoint); save the rest of the model with state_dict() and make "
                        "the module again over the same database when loading" % self.table)

    # -- permits

    def release(self):
        """Return the permits of the open step of this table (forwards not
        followed by their update; a backward after release() pushes
        nothing)."""
        embkv._flush_deferred(self.conn)
        st = _peek_step(self.conn, self._key)
        if st is not None:
            st.release()

    def step(self):
        """Apply the gradients summed since the last update (update="step":
        torch's accumulate-then-step; with update="backward" the end of each
        backward pass does it).  Returns the rows updated."""
        embkv._flush_deferred(self.conn)
        st = _peek_step(self.conn, self._key)
        return st.end() if st is not None else 0

    def lookahead(self, ids):
        """Announce the ids of coming batches (embkv_lookahead), so that rows
        on the SSD tier are read ahead; returns the rows queued.  A table
        without an SSD tier (no ssd_size) has every row in memory already:
        nothing to queue, 0."""
        if isinstance(ids, torch.Tensor):
            ids = ids.detach().cpu().numpy()
        a, buf = embkv._ids_bytes(ids)  # (as embkv.pull takes them: integers, int64)
        if len(a) == 0:
            return 0
        try:
            return self.conn.execute("SELECT embkv_lookahead(?, ?)", (self.table, buf)).fetchone()[0]
        except Exception as e:
            if "no such function" in str(e):
                return 0
            raise

    # -- the batch's rows

    def _gather(self, ids):
        """Pull the ids of ids (a LongTensor), one row per occurrence (the
        store reads a repeated id once); returns the weight tensor
        (those rows, plus a zero row for padding when there is padding),
        each id's row in it, and the padding row's index or None."""
        flat, is_pad = _flat_ids(ids, self.padding_idx, "embkv.torch")
        flat = flat.cpu()
        is_pad = is_pad.cpu() if is_pad is not None else None
        # (a copy: the caller may reuse its ids tensor before the backward)
        real = np.array((flat[~is_pad] if is_pad is not None else flat).numpy(), copy=True)
        dev = self.device if self.device.type == "cuda" else None
        embkv._flush_deferred(self.conn)
        prev = _peek_step(self.conn, self._key)
        if prev is not None and prev.owner == threading.get_ident() and prev.failed():
            # Its backward raised: no update, its permits back.  (Its own
            # thread only: failed() can tell whether a backward pass runs
            # only in the thread that runs it.)
            prev.release()
        n = len(real)
        # As torch's: eval mode changes nothing here, only torch.no_grad() does.
        training = torch.is_grad_enabled()
        if not training or n == 0:
            w = self._read(real, dev) if n else torch.zeros((0, self.embedding_dim), device=self.device)
            if training:
                # No row, no step: still an output of the graph, as torch's
                # (a loss over it may call backward), its gradient nobody's.
                w = w * torch.ones((), device=self.device, requires_grad=True)
            local, pad = _positions(flat, is_pad, n)
            if pad is not None:
                w = torch.cat([w, torch.zeros(1, self.embedding_dim, device=self.device)])
            return w, local.reshape(ids.shape).to(self.device), pad
        with _current_step(self.conn, self.table, self._key, self.embedding_dim, self.update) as st:
            me = threading.get_ident()
            _not_another_threads(st, self.table, me)
            if not st.pulled:
                st.owner = me
            rows, k = st.pull(real, dev)
        given = [False]  # this batch tensor's gradient went into an update

        def hook(grad):
            # (a CUDA gradient stays on its device: the push sums it there)
            g = grad.detach().contiguous() if grad.is_cuda else grad.detach().contiguous().numpy()
            # One sum, no mask: a NaN or an infinity makes it non-finite
            # (finite values overflowing it too: the mask then finds none).
            finite = bool(torch.isfinite(g.sum())) if grad.is_cuda else bool(np.isfinite(g.sum()))
            bad = None if finite else ~torch.isfinite(g) if grad.is_cuda else ~np.isfinite(g)
            if bad is not None and bad.any():
                # Raised here, in the pass, before any table's update (they
                # run at its end, and torch drops them when it fails): a
                # pass over several tables updates none of them.
                first = bad.nonzero()[0].tolist() if grad.is_cuda else [int(x[0]) for x in np.nonzero(bad)]
                row, col = first[0], first[1]
                v = float(g[row, col])
                if st.mode == "backward":
                    with st.lock:
                        st.raised = True  # (its permits go back at the next forward: failed())
                raise ValueError("embkv.torch: table %r: id %d: gradient element %d is %s: the backward pass "
                                 "updated no table" % (self.table, int(real[row]), col,
                                                       "NaN" if v != v else "infinite"))
            with st.lock:
                if given[0]:
                    raise RuntimeError("embkv.torch: a second backward through one forward of table %r "
                                       "(retain_graph): the first one's gradient is its step's already; run a "
                                       "forward per backward" % self.table)
                given[0] = True
                if st.state == "released":
                    return grad  # release() came first: the update is dropped, as documented
                if st.state == "closed":
                    _late_push(self.conn, self.table, self._key, st, real, g)
                    return grad
                st.add(k, g)
                if st.mode == "backward" and not st.queued:
                    st.queued = True
                    torch.autograd.Variable._execution_engine.queue_callback(st.end)
            return grad

        # The graph's leaf: an empty anchor; the rows are the output of a
        # node over it, so that they need no copy to be written in place.
        anchor = torch.empty(0, requires_grad=True)
        w = _Rows.apply(anchor, [rows if dev is not None else torch.from_numpy(rows)], hook)
        with st.lock:
            st.leaves += 1
        # Freed without a backward (inference under grad, an exception):
        # once no batch tensor of the step is left (the graph holds the
        # anchor while it lives), the permits go back.
        weakref.finalize(anchor, st.leaf_freed)
        local, pad = _positions(flat, is_pad, n)
        if pad is not None:
            # (the hook sees the gradient of the pulled rows alone)
            w = torch.cat([w, torch.zeros(1, self.embedding_dim, device=self.device)])
        return w, local.reshape(ids.shape).to(self.device), pad

    def _read(self, real, dev=None):
        """Rows of ids without gradient (torch.no_grad()), a tensor on
        dev or the CPU: no permit is kept.  Ids the open step holds are
        read taking no other permit; the others are pulled and returned at
        once."""
        def pull(once):
            if dev is not None:
                return _pull_cuda(self.conn, self.table, real, self.embedding_dim, dev, once=once)
            return torch.from_numpy(_writable(embkv.pull(self.conn, self.table, real, self.embedding_dim,
                                                         once=once)))
        # Under the step's lock, so that another thread's forward on this
        # connection waits for the read instead of taking permits the read
        # would wait for while holding the connection.  (A read joins no
        # step: its module's update mode need not be the step's.)
        with _current_step(self.conn, self.table, self._key, self.embedding_dim, self.update, False) as st:
            _not_another_threads(st, self.table, threading.get_ident())
            held = st.held()
            rows = pull(bool(len(held)))
            embkv.release(self.conn, self.table, np.setdiff1d(real, held) if len(held) else real)
            return rows


def _not_another_threads(st, table, me):
    """Refuses a forward of this thread while another thread's step of the
    table is open on the connection (called under st.lock)."""
    if st.pulled and st.owner != me and st.state == "open":
        # A step is one thread's: another thread's forwards would join it,
        # and its update would end the other's half-way; a pull waiting for
        # the other's permits would hold the connection its update needs.
        raise RuntimeError("embkv.torch: table %r: a training step on this connection is open in another "
                           "thread (its forward is not updated yet), and this thread makes a forward: "
                           "threads that train at once need a connection each (embkv.connect in each "
                           "thread)" % table)


class _Rows(torch.autograd.Function):
    """A forward's pulled rows as the output of a node of the graph, not a
    leaf: the output is the pulled buffer itself (no copy), writable as
    torch.nn.Embedding's output is, and the node's backward hands the
    gradient of the rows to the step (on_grad).  The rows come in a list:
    a tensor given as an input and returned would be taken for a view of
    it."""

    @staticmethod
    def forward(ctx, anchor, held, on_grad):
        ctx.on_grad = on_grad
        return held.pop()

    @staticmethod
    def backward(ctx, grad):
        ctx.on_grad(grad)
        return None, None, None


def _late_push(conn, table, key, st, ids, g):
    """A backward through a forward whose step was updated already: an
    update of its own, except for ids the open step holds (its push would
    return their permits, which are that step's): their gradients join the
    open step's update."""
    cur = _peek_step(conn, key)
    if cur is not None and cur is not st:
        with cur.lock:
            if cur.state == "open" and cur.pulled:
                held = np.isin(ids, cur.held())
                if held.any():
                    mask = torch.from_numpy(held).to(g.device) if isinstance(g, torch.Tensor) else held
                    cur.extra.append((ids[held], g[mask]))
                    ids, g = ids[~held], g[~mask]
    if len(ids):
        _push_any(conn, table, ids, g)


def _flat_ids(ids, padding_idx, who):
    """A batch's ids (a LongTensor or IntTensor of any shape): (the ids
    flat, int64, which are padding_idx or None)."""
    what = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
    if what not in (torch.int64, torch.int32):
        raise TypeError("%s: ids must be a LongTensor or IntTensor (as torch.nn.Embedding's), not %s" % (who, what))
    flat = ids.reshape(-1).to(torch.int64)
    return flat, (flat == padding_idx if padding_idx is not None else None)


def _positions(flat, is_pad, n):
    """Each id's row among the n pulled (the ids that are not padding, in
    order), padding at row n; (positions, the padding row or None)."""
    if is_pad is None:
        return torch.arange(n), None
    local = torch.empty_like(flat)
    local[is_pad] = n
    local[~is_pad] = torch.arange(n)
    return local, n


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


def _schema_of(conn, name):
    """The schema an unqualified table name means, as SQLite resolves it
    (temp, main, then the attached ones in order); main if none has it."""
    dbs = [r[1] for r in conn.execute("PRAGMA database_list")]
    for db in ["temp"] + [d for d in dbs if d != "temp"]:
        try:
            if conn.execute("SELECT 1 FROM %s.sqlite_schema WHERE type = 'table' AND name = ? COLLATE NOCASE"
                            % _quote(db), (name,)).fetchone():
                return db
        except sqlite3.Error:
            continue
    return "main"


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


def _not_a_missing_schema(conn, table, schema):
    """Refuses a name that reads as schema.name of a database this
    connection has not attached (a typo, or an ATTACH not made yet), where
    the whole text would otherwise name a new table of main."""
    if schema is not None:
        return
    a, i = _ident(table, 0)
    if a is None or table[i:i + 1] != "." or _ident(table, i + 1)[1] != len(table):
        return
    if conn.execute("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ? COLLATE NOCASE",
                    (table,)).fetchone():
        return  # (a table of main whose name holds a dot)
    raise ValueError("embkv.torch: table %r: no database %r is attached to this connection: ATTACH it first, or, "
                     "for a table of main whose name holds the dot, quote the name as SQL does (%r)"
                     % (table, a, _quote(table)))


def _sql_option(v):
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return repr(v)


class Embedding(_TableModule):
    """torch.nn.Embedding over an embkv table: forward(input) with a
    LongTensor of ids of any shape gives input.shape + (dim,)."""

    def forward(self, input):
        w, local, pad = self._gather(input)
        if pad is None:
            # One row per id in order: the pulled rows themselves (a buffer
            # of this forward's own, so in-place operations on the output
            # work as on torch's).
            return w.reshape(tuple(input.shape) + (self.embedding_dim,))
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
        if self.device.type == "cuda":
            # (like the ids, offsets and weights may come on either device)
            offsets = offsets.to(self.device) if offsets is not None else None
            per_sample_weights = per_sample_weights.to(self.device) if per_sample_weights is not None else None
        return F.embedding_bag(local, w, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=pad)
