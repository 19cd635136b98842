#!/usr/bin/env bash
# bench/bench_export.sh: embkv_export / embkv_import / embkv_backup
# throughput against cp.
#
# Builds a table of EXPORT_ROWS rows (default 1,000,000) of dim EXPORT_DIM
# (default 64) with optimizer EXPORT_OPTIMIZER (default sgd; adagrad adds
# dim floats of state per row) on /dev/shm, rows created by pulls from a
# normal initializer and one push over all of them, then times:
#   export   SELECT embkv_export(t, file)              (a new SQLite file)
#   import   SELECT embkv_import(u, file)              (into a fresh table,
#            ending with its checkpoint)
#   backup   SELECT embkv_backup(t, dir)              (a new store)
#   cp       of the export file, of the backup directory (cp -r) and of
#            the source store's pool file
# and prints MB/s (10^6 bytes per second) of each, the export's and the
# import's against cp of the same file, and the file's bytes per row
# against the raw row (id, clock, vec, state).  Needs build/embkv.so
# (`make`) and /usr/bin/python3 (its sqlite3 loads extensions).  Everything
# lives under /dev/shm/embkv-bench-export.$$ and is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${EXPORT_ROWS:-1000000}
DIM=${EXPORT_DIM:-64}
OPT=${EXPORT_OPTIMIZER:-sgd}
EXT=${EMBKV_EXT:-$PWD/build/embkv}
PY=/usr/bin/python3
[[ -f $EXT.so ]] || { echo "bench_export: $EXT.so is missing: run make first" >&2; exit 2; }
ROOT=/dev/shm/embkv-bench-export.$$
trap 'rm -rf "$ROOT"' EXIT
trap 'echo interrupted; exit 130' INT TERM
mkdir -p "$ROOT"

"$PY" - "$ROOT" "$EXT" "$ROWS" "$DIM" "$OPT" <<'EOF'
import os, sqlite3, subprocess, sys, time
import numpy as np

root, ext, rows, dim, opt = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
MB = 1e6


def connect(path):
    c = sqlite3.connect(path, isolation_level=None)
    c.enable_load_extension(True)
    c.load_extension(ext)
    return c


def timed(fn):
    t = time.perf_counter()
    r = fn()
    return r, time.perf_counter() - t


def cp(src, dst):
    _, s = timed(lambda: subprocess.run(["cp", src, dst], check=True))
    os.unlink(dst)
    return s


c = connect(os.path.join(root, "bench.db"))
opts = "dim=%d, optimizer=%s, lr=0.01, init='normal(0,0.1)', seed=1, capacity=%d" % (dim, opt, rows)
c.execute("CREATE VIRTUAL TABLE t USING embkv(%s, path='t.embkv')" % opts)
ids = np.random.default_rng(1).permutation(np.arange(rows, dtype=np.int64) * 7919 - rows)
for lo in range(0, rows, 50000):
    b = ids[lo:lo + 50000]
    c.execute("SELECT length(embkv_pull('t', ?))", (b.tobytes(),)).fetchone()
    g = np.full((len(b), dim), 0.5, dtype=np.float32)
    c.execute("SELECT embkv_push('t', ?, ?)", (b.tobytes(), g.tobytes())).fetchone()
c.execute("SELECT embkv_checkpoint('t')").fetchone()
sf = int(c.execute("SELECT json_extract(embkv_stats('t'), '$.state_floats')").fetchone()[0])

out = os.path.join(root, "t.export")
(n,), t_exp = timed(lambda: c.execute("SELECT embkv_export('t', ?)", (out,)).fetchone())
assert n == rows, n
size = os.path.getsize(out)
c.execute("CREATE VIRTUAL TABLE u USING embkv(%s, path='u.embkv')" % opts)
(m,), t_imp = timed(lambda: c.execute("SELECT embkv_import('u', ?)", (out,)).fetchone())
assert m == rows, m
bdir = os.path.join(root, "t.backup")
(binfo,), t_bak = timed(lambda: c.execute("SELECT embkv_backup('t', ?)", (bdir,)).fetchone())
import json
binfo = json.loads(binfo)
assert binfo["rows"] == rows, binfo
bbytes = binfo["bytes"]


def cp_tree(src, dst):
    _, s = timed(lambda: subprocess.run(["cp", "-r", src, dst], check=True))
    subprocess.run(["rm", "-rf", dst], check=True)
    return s


t_cpb = min(cp_tree(bdir, bdir + ".copy") for _ in range(3))
t_cp = min(cp(out, out + ".copy") for _ in range(3))
pool = os.path.join(root, "t.embkv", "store.pool")
psize = os.path.getsize(pool)
t_pool = min(cp(pool, os.path.join(root, "pool.copy")) for _ in range(3))
raw = 16 + 4 * (dim + sf)

print("embkv export/import on /dev/shm: %d rows, dim %d, %s (state_floats %d)" % (rows, dim, opt, sf))
print("  export file   %8.1f MB  (%.0f bytes/row, raw row %d bytes: %.2fx)" % (size / MB, size / rows, raw, size / rows / raw))
print("  embkv_export  %8.3f s  %8.1f MB/s of file   %8.0f rows/s" % (t_exp, size / MB / t_exp, rows / t_exp))
print("  embkv_import  %8.3f s  %8.1f MB/s of file   %8.0f rows/s" % (t_imp, size / MB / t_imp, rows / t_imp))
print("  cp export     %8.3f s  %8.1f MB/s   (best of 3)" % (t_cp, size / MB / t_cp))
print("  cp pool file  %8.3f s  %8.1f MB/s   (%.1f MB, best of 3)" % (t_pool, psize / MB / t_pool, psize / MB))
print("  embkv_backup  %8.3f s  %8.1f MB/s of store files (%.1f MB), %.1f MB/s of rows (%d bytes each), %.0f rows/s"
      % (t_bak, bbytes / MB / t_bak, bbytes / MB, rows * raw / MB / t_bak, raw, rows / t_bak))
print("  cp -r backup  %8.3f s  %8.1f MB/s   (best of 3)" % (t_cpb, bbytes / MB / t_cpb))
print("  backup / cp -r of the same bytes: %.3fx the throughput (%.1fx the time)" % (t_cpb / t_bak, t_bak / t_cpb))
print("  export / cp of the same bytes: %.3fx the throughput (%.1fx the time)" % (t_cp / t_exp, t_exp / t_cp))
print("  import / cp of the same bytes: %.3fx the throughput (%.1fx the time)" % (t_cp / t_imp, t_imp / t_cp))
print("  export time / cp of the pool:  %.2fx" % (t_exp / t_pool))
c.close()
EOF
