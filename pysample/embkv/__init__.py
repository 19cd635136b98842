"""embkv from Python: load the extension, and numpy helpers for training.

    import embkv
    conn = embkv.connect("model.db")                # sqlite3 connection, embkv loaded
    vecs = embkv.pull(conn, "item", ids)            # (len(ids), dim) float32
    embkv.push(conn, "item", ids, grads)            # the table's optimizer applies them

Installed with pip (docs/install.md), the package holds the extension
(embkv/embkv.so).  find_extension() looks in $EMBKV_EXT first (another
build, e.g. a sanitizer one), then in the package, then in build/ of the
source checkout the package sits in (so running from the repository without
installing works after `make`).  A Python whose sqlite3 module cannot load
extensions (many self-built ones) gets an error naming one that can
(Debian's /usr/bin/python3).

pull and push call the extension's entry points for language bindings
(embkv_direct_pull, embkv_direct_push, through ctypes): they run the same
SQL functions on the connection, but the rows are pulled straight into the
array pull returns and the gradients are read where they lie, without the
copies sqlite3 makes of every BLOB it binds or returns (a step's rows are
megabytes).  Where that is not possible (the extension loaded into the
connection is another file than find_extension() names, a Python without
ctypes) they run the SQL functions through conn.execute: the same results,
except that pulled vectors are then a read-only view of the result BLOB.
embkv.torch has nn.Module wrappers.
"""
import atexit
import json
import numbers
import os
import re
import sqlite3
import sys
import threading
import weakref

import numpy as np

__all__ = ["__version__", "EmbkvError", "Connection", "find_extension", "load", "connect", "dim", "pull", "push",
           "release", "checkpoint"]

_HERE = os.path.dirname(os.path.abspath(__file__))
# The source checkout this package sits in (<repo>/pysample/embkv), if any.
_REPO = os.path.dirname(os.path.dirname(_HERE))
_IN_CHECKOUT = os.path.isfile(os.path.join(_REPO, "ext", "embkv.h")) and \
    os.path.isfile(os.path.join(_REPO, "Makefile"))


def _checkout_version():
    with open(os.path.join(_REPO, "ext", "embkv.h")) as f:
        m = re.search(r'^#define EMBKV_VERSION_STRING "([^"]+)"', f.read(), re.M)
    return m.group(1) if m else "unknown"


try:  # written by setup.py when the package is built
    from ._version import __version__
except ImportError:  # running from the source checkout
    __version__ = _checkout_version() if _IN_CHECKOUT else "unknown"


class EmbkvError(RuntimeError):
    """The extension cannot be found or loaded."""


def find_extension():
    """Path of the extension without its .so suffix (what load_extension
    takes): $EMBKV_EXT, else embkv.so in this package, else build/embkv.so
    of the source checkout the package sits in."""
    env = os.environ.get("EMBKV_EXT")
    if env:
        base = env[:-3] if env.endswith(".so") else env
        if not os.path.isfile(base + ".so"):
            raise EmbkvError("embkv: EMBKV_EXT is set to %r, but %s.so does not exist: point it at a built "
                             "extension (path with or without .so), or unset it to use the one installed with "
                             "this package" % (env, base))
        return os.path.abspath(base)
    tried = [os.path.join(_HERE, "embkv.so")]
    if _IN_CHECKOUT:
        tried.append(os.path.join(_REPO, "build", "embkv.so"))
    for path in tried:
        if os.path.isfile(path):
            return path[:-3]
    if _IN_CHECKOUT:
        advice = "run `make` in %s, or install the package (pip install %s; see docs/install.md)" % (_REPO, _REPO)
    else:
        advice = ("reinstall the package from the embkv source tree (pip install . there; see docs/install.md), "
                  "which builds the extension into it")
    raise EmbkvError("embkv: the SQLite extension was not found (looked for %s; EMBKV_EXT is not set): %s, "
                     "or set EMBKV_EXT to a built extension" % (" and ".join(tried), advice))


def load(conn, path=None):
    """Load embkv into an open sqlite3 connection."""
    if not hasattr(conn, "enable_load_extension"):
        raise EmbkvError("embkv: this Python's sqlite3 module cannot load extensions (it was built without "
                         "them); use Debian's /usr/bin/python3")
    conn.enable_load_extension(True)
    try:
        conn.load_extension(path or find_extension())
    finally:
        conn.enable_load_extension(False)
    return conn


def connect(database, **kw):
    """sqlite3.connect with embkv loaded.  Autocommit by default
    (isolation_level=None): BEGIN/COMMIT are written by hand, and training
    calls never open a transaction behind the caller's back.  A connection
    still open at a normal exit of the interpreter is closed then (atexit),
    so that its stores close as at any close: an object alive at exit (a
    loss or output kept in a global holds its connection) would otherwise
    leave the connection unclosed, and the stores as after a crash."""
    kw.setdefault("isolation_level", None)
    kw.setdefault("factory", Connection)
    conn = sqlite3.connect(database, **kw)
    try:
        load(conn)
    except Exception:
        conn.close()
        raise
    try:
        with _open_lock:
            _open[conn] = (str(database), threading.current_thread())
    except TypeError:
        pass  # a factory of the caller's whose connections take no weak reference
    return conn


class Connection(sqlite3.Connection):
    """The connections connect() makes: sqlite3's, with room for a weak
    reference (so that the exit hook can find them without keeping them)."""


_open = weakref.WeakKeyDictionary()  # connection connect() made -> (database, thread); closing twice is harmless
_open_lock = threading.Lock()


def _close_at_exit():
    # Before or after weakref.finalize's exit hook (whichever registered
    # last runs first): a step freed after its connection closed has nothing
    # to return (the permits went with the connection).
    with _open_lock:
        conns = list(_open.items())
    for c, (database, thread) in conns:
        try:
            c.close()
        except sqlite3.ProgrammingError:
            # Made in another thread with check_same_thread (sqlite3's
            # default): only that thread may close it.  One whose thread has
            # ended is closed when the interpreter frees it, after this hook
            # (as at any close); one a running daemon thread holds is not.
            if thread.is_alive():
                sys.stderr.write("embkv: the connection to %s made in thread %r, which still runs, was open at exit; "
                                 "only that thread may close it (sqlite3's check_same_thread), so its stores keep what "
                                 "their last checkpoint holds: close it in its thread (or checkpoint there) before "
                                 "the exit to keep the rest\n" % (database, thread.name))
        except Exception:  # pragma: no cover - already gone
            pass


atexit.register(_close_at_exit)


def _ids_bytes(ids):
    """Ids as int64 bytes; integers only (a float or bool id is an error,
    not a truncation), and unsigned ones must fit in int64."""
    a = np.asarray(ids)
    if a.size and a.dtype == object:
        # Python ints numpy could not hold, or a mix: name the first culprit.
        lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        for k, x in enumerate(a.reshape(-1)):
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
                raise TypeError("embkv: ids must be integers, not %s (%r at index %d)" % (type(x).__name__, x, k))
            if not lo <= int(x) <= hi:
                raise ValueError("embkv: id %d (at index %d) does not fit in int64" % (int(x), k))
        a = a.astype(np.int64)
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise TypeError("embkv: ids must be integers, not %s" % a.dtype)
    if a.size and a.dtype == np.uint64 and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError("embkv: id %d does not fit in int64" % int(a.max()))
    a = np.ascontiguousarray(a.reshape(-1), dtype=np.int64)
    return a, memoryview(a).cast("B")


# ------------------------------------------------------------ direct calls

_EK_DIRECT_UNKNOWN = -1  # the handle names no connection of the library ctypes loaded: use SQL
_lib_lock = threading.Lock()
_lib = []  # [the ctypes library, or None where it cannot be loaded], once loaded
# The exception sqlite3 raises for each primary result code (as the module maps them).
_ERRORS = {7: MemoryError, 18: sqlite3.DataError, 19: sqlite3.IntegrityError, 20: sqlite3.IntegrityError,
           21: sqlite3.ProgrammingError, 11: sqlite3.DatabaseError, 26: sqlite3.DatabaseError}
_ERRNAMES = {1: "SQLITE_ERROR", 5: "SQLITE_BUSY", 6: "SQLITE_LOCKED", 7: "SQLITE_NOMEM", 8: "SQLITE_READONLY",
             9: "SQLITE_INTERRUPT", 10: "SQLITE_IOERR", 11: "SQLITE_CORRUPT", 13: "SQLITE_FULL",
             18: "SQLITE_TOOBIG", 19: "SQLITE_CONSTRAINT", 21: "SQLITE_MISUSE", 26: "SQLITE_NOTADB"}


def _library():
    with _lib_lock:
        if not _lib:
            lib = None
            try:
                import ctypes
                lib = ctypes.CDLL(find_extension() + ".so")
                i64, vp, sz, cp = ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
                lib.embkv_direct_pull.argtypes = [i64, cp, vp, sz, vp, sz, ctypes.c_int, cp, sz]
                lib.embkv_direct_pull.restype = ctypes.c_int
                lib.embkv_direct_push.argtypes = [i64, cp, vp, sz, vp, sz, vp, vp, cp, sz]
                lib.embkv_direct_push.restype = ctypes.c_int
            except (ImportError, OSError, AttributeError, EmbkvError):
                lib = None  # (an extension without the entry points, or none found: SQL)
            _lib.append(lib)
        return _lib[0]


def _handle(conn, table):
    """(the library, conn's handle) for a direct call on table, or None.
    The query also makes sqlite3's own checks: a closed connection, or one
    used from another thread than its own, raises ProgrammingError here as
    conn.execute would."""
    if not isinstance(table, str) or "\0" in table:
        return None  # (SQL reports what is wrong with it: not TEXT, or a NUL in it)
    lib = _library()
    if lib is None:
        return None
    try:
        h = conn.execute("SELECT embkv_connection()").fetchone()[0]
    except sqlite3.OperationalError:
        return None  # an extension without embkv_connection loaded into conn
    return lib, h


def _raise(rc, err):
    msg = err.value.decode("utf-8", "replace")
    e = _ERRORS.get(rc & 0xff, sqlite3.OperationalError)(msg)
    if isinstance(e, sqlite3.Error):
        e.sqlite_errorcode = rc
        e.sqlite_errorname = _ERRNAMES.get(rc & 0xff, "SQLITE_ERROR")
    raise e


def _direct_pull(conn, table, a, d, once):
    """Rows of the int64 array a into a new (len(a), d) array, or None
    where SQL must do it."""
    import ctypes
    lh = _handle(conn, table)
    if lh is None:
        return None
    lib, h = lh
    out = np.empty((len(a), d), np.float32)
    err = ctypes.create_string_buffer(1024)
    rc = lib.embkv_direct_pull(h, table.encode("utf-8"), a.ctypes.data, len(a), out.ctypes.data, out.nbytes,
                               int(bool(once)), err, len(err))
    if rc == _EK_DIRECT_UNKNOWN:
        return None
    if rc != 0:
        _raise(rc, err)
    return out


def _direct_push(conn, table, a, g, lr):
    """The rows updated by the push, or None where SQL must do it."""
    import ctypes
    lh = _handle(conn, table)
    if lh is None:
        return None
    lib, h = lh
    err = ctypes.create_string_buffer(1024)
    updated = ctypes.c_int64(0)
    lrv = ctypes.c_double(lr) if lr is not None else None
    rc = lib.embkv_direct_push(h, table.encode("utf-8"), a.ctypes.data, len(a), g.ctypes.data, g.nbytes,
                               ctypes.byref(lrv) if lrv is not None else None, ctypes.byref(updated), err, len(err))
    if rc == _EK_DIRECT_UNKNOWN:
        return None
    if rc != 0:
        _raise(rc, err)
    return updated.value


def dim(conn, table):
    """The vector length of a table."""
    return json.loads(conn.execute("SELECT embkv_stats(?)", (table,)).fetchone()[0])["dim"]


def _fits(conn, fname, table, nids, nbytes, verb):
    """Refuses, with the figures, arguments over the connection's length
    limit for one value (sqlite3 would say only "string or blob too big")."""
    try:
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
    except (AttributeError, sqlite3.Error):  # (Python before 3.11)
        return
    if nbytes > limit:
        e = sqlite3.DataError("%s: table %s: %d ids (%d bytes)%s are over this connection's limit of %d bytes for "
                              "one value (SQLITE_LIMIT_LENGTH): %s fewer ids at a time"
                              % (fname, table, nids, 8 * nids, "" if nbytes == 8 * nids else " or their gradients",
                                 limit, verb))
        e.sqlite_errorcode, e.sqlite_errorname = sqlite3.SQLITE_TOOBIG, "SQLITE_TOOBIG"
        raise e


def _usable(conn, fname, table):
    """sqlite3's own checks of conn (closed; another thread than its own,
    with check_same_thread), raised naming the call and the table."""
    try:
        conn.total_changes
    except sqlite3.ProgrammingError as e:
        raise sqlite3.ProgrammingError("%s: table %s: %s" % (fname, table, e)) from None


# ------------------------------------------------------------ permits freed elsewhere

_deferred = {}  # id(conn) -> (a callable giving conn while it lives, [(table, int64 ids)])
# (An RLock, and nothing allocated under it: a finalizer run by a collection
# that an allocation starts may call _defer_release in the same thread.)
_deferred_lock = threading.RLock()
_NOTHING = (None, ())


def _defer_release(conn, table, ids):
    """Keeps the permits of ids for conn's own thread (their batch tensor
    was freed by the garbage collector on another, where sqlite3 refuses
    the connection): its next pull, push or release returns them first."""
    try:
        ref = weakref.ref(conn)
    except TypeError:
        # (a connection that takes no weak reference is held until then:
        # an id() alone could name a later connection)
        ref = (lambda c: lambda: c)(conn)
    k, new, item = id(conn), (ref, []), (table, ids)
    with _deferred_lock:
        got = _deferred.get(k)
        if got is None or got[0]() is not conn:
            got = _deferred[k] = new  # (a list of a connection gone is dropped: its permits went with it)
        got[1].append(item)


def _flush_deferred(conn):
    """Returns the permits kept for conn by _defer_release."""
    if not _deferred:
        return
    k = id(conn)
    with _deferred_lock:
        ref, todo = _deferred.pop(k, _NOTHING)
    if ref is None or ref() is not conn:
        return
    for n, (table, ids) in enumerate(todo):
        try:
            conn.execute("SELECT embkv_release(?, ?)", (table, _ids_bytes(ids)[1])).fetchone()
        except sqlite3.ProgrammingError as e:
            if "closed database" in str(e):
                return  # (its permits went with it)
            # (not the connection's thread: the caller's own call says so)
            for t, i in todo[n:]:
                _defer_release(conn, t, i)
            return
        except sqlite3.Error:
            pass  # (a table dropped meanwhile: nothing to return)


def pull(conn, table, ids, dim_=None, once=False):
    """Vectors of ids (any int64 array-like, taken flat), shape (number of ids, dim), float32:
    a new array (read-only, a view of the result BLOB, where the direct call
    is not possible).  Takes the staleness permits of the table; push or
    release returns them.  once=True: ids on which this connection holds a
    permit already take no other (embkv_pull's 'once')."""
    _usable(conn, "embkv.pull", table)
    _flush_deferred(conn)
    a, buf = _ids_bytes(ids)
    if len(a) == 0:
        return np.zeros((0, dim_ or dim(conn, table)), np.float32)
    _fits(conn, "embkv_pull", table, len(a), 8 * len(a), "pull")
    try:
        d = dim_ or dim(conn, table)
    except sqlite3.Error as e:
        if (getattr(e, "sqlite_errorcode", 0) & 0xff in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
                or "is open in another process" in str(e)):
            raise  # (the pull would wait as long again, to say the same)
        d = None  # (no such table, say: embkv_pull's own error says so)
    out = _direct_pull(conn, table, a, d, once) if d else None
    if out is not None:
        return out
    if once:
        blob = conn.execute("SELECT embkv_pull(?, ?, 'once')", (table, buf)).fetchone()[0]
    else:
        blob = conn.execute("SELECT embkv_pull(?, ?)", (table, buf)).fetchone()[0]
    d = dim_ or len(blob) // (4 * len(a))
    return np.frombuffer(blob, dtype=np.float32).reshape(len(a), d)


def _float32_grads(grads, table, ids):
    """grads as float32, contiguous; a finite value float32 cannot hold is
    an error naming it (numpy's cast would make it an infinity, which the
    push would then report as if given)."""
    g0 = np.asarray(grads)
    with np.errstate(over="ignore"):
        g = np.ascontiguousarray(g0, dtype=np.float32)
    if g0.dtype.kind == "f" and g0.dtype.itemsize > 4 and g0.size:
        big = np.isinf(g) & np.isfinite(g0)  # (what rounds to float32's largest is fine)
        if big.any():
            at = tuple(int(k) for k in np.argwhere(big)[0])
            row = at[0] if g0.ndim == 2 else None
            raise ValueError("embkv.push: table %s: %sgradient element %s is %r, beyond float32's range (%g): "
                             "scale the gradients (or clip them) to float32's range"
                             % (table, "id %d: " % int(ids[row]) if row is not None and row < len(ids) else "",
                                at[-1] if row is not None else at, float(g0[at]), float(np.finfo(np.float32).max)))
    return g


def push(conn, table, ids, grads, lr=None):
    """Apply gradients (len(ids) x dim float32) with the table's optimizer;
    returns the number of rows updated."""
    _usable(conn, "embkv.push", table)
    _flush_deferred(conn)
    a, buf = _ids_bytes(ids)
    g = _float32_grads(grads, table, a)
    if g.ndim != 2 or g.shape[0] != len(a):
        raise ValueError("embkv.push: grads must have shape (%d, dim), not %s" % (len(a), g.shape))
    if len(a) == 0:
        return 0
    _fits(conn, "embkv_push", table, len(a), max(8 * len(a), g.nbytes), "push")
    if lr is not None:
        if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
            raise TypeError("embkv.push: table %s: lr must be a positive finite number, or None for the table's own, "
                            "not %r" % (table, lr))
        lr = float(lr)
    done = _direct_push(conn, table, a, g, lr)
    if done is not None:
        return done
    gbuf = memoryview(g).cast("B")
    if lr is None:
        return conn.execute("SELECT embkv_push(?, ?, ?)", (table, buf, gbuf)).fetchone()[0]
    # (sqlite3 binds a NaN as NULL, the table's own lr: as text, embkv_push
    # refuses it as any bad lr)
    return conn.execute("SELECT embkv_push(?, ?, ?, ?)", (table, buf, gbuf, "NaN" if lr != lr else lr)).fetchone()[0]


def release(conn, table, ids):
    """Return the permits of ids without an update; returns how many went back."""
    _usable(conn, "embkv.release", table)
    _flush_deferred(conn)
    a, buf = _ids_bytes(ids)
    if len(a) == 0:
        return 0
    _fits(conn, "embkv_release", table, len(a), 8 * len(a), "release")
    return conn.execute("SELECT embkv_release(?, ?)", (table, buf)).fetchone()[0]


def checkpoint(conn, table):
    """Make the table durable as of now (embkv_checkpoint)."""
    return conn.execute("SELECT embkv_checkpoint(?)", (table,)).fetchone()[0]
