#!/usr/bin/env bash
# Runs embkv's benchmarks (built by `make bench`, which then calls this):
#   bench_probes   index probe lengths at load 0.5 / 0.8 / 0.9 (on /dev/shm)
#   bench_engine   on /dev/shm (tmpfs) and on the ordinary file system
#                  (build/benchdata, ext4 here)
#   bench_sql      when build/embkv.so and build/bench/bench_sql exist
#   bench_train, bench_train.py, bench_recovery, bench_pins.py, bench_readers.py, bench_commit.py, bench_knn.py,
#   bench_ctr.py, bench_kg.py, bench_dist.py (below)
# The Python ones run with build/venv/bin/python, the embkv package installed
# there by `make venv` (which `make bench` runs) as users install it.
# Everything printed is also written to build/bench-results.txt.  Pools live
# in per-run directories that are removed on exit, failure or interrupt.
# BENCH_ROWS / BENCH_BATCHES override the data size (default 2M rows, 2000
# batches of 512) for a quick run.
set -uo pipefail
cd "$(dirname "$0")/.."

BIN=build/bench
PY=build/venv/bin/python
OUT=build/bench-results.txt
ROWS=${BENCH_ROWS:-2000000}
BATCHES=${BENCH_BATCHES:-2000}
BATCH_SIZE=512
DIM_BYTES=256   # dim 64 floats
mkdir -p build

# Pool of bench_engine: records (32-byte header + 256-byte vector) x 2.5 for
# copy-on-write versions and slab slack, plus 64 B/row for the index (enough
# to hold it across one doubling), plus 64 MiB.  2M rows: 1559 MiB.
POOL_MB=$(( ROWS * (32 + DIM_BYTES) * 5 / 2 / 1048576 + ROWS * 64 / 1048576 + 64 ))
# bench_sql holds an engine store (x1.5 records), the virtual table's store
# and the plain SQLite database (~1.2 x the vectors) at once.
SQL_NEED_MB=$(( POOL_MB * 2 + ROWS * (DIM_BYTES + 64) / 1048576 + 256 ))

SHM_ROOT=/dev/shm/embkv-bench.$$
FS_ROOT=build/benchdata/run.$$

cleanup() {
    rm -rf "$SHM_ROOT" "$FS_ROOT"
    rmdir build/benchdata 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

# Leftovers of runs that were killed outright (their shell is gone).
for d in /dev/shm/embkv-bench.* build/benchdata/run.*; do
    [[ -d $d ]] || continue
    pid=${d##*.}
    if [[ $pid =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2>/dev/null; then
        echo "removing leftover $d"; rm -rf "$d"
    fi
done

exec > >(tee "$OUT") 2>&1

free_mb() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }

status=0
RUNLOG=/dev/null  # run() also copies the command's output here
run() {  # name, command...
    local name=$1; shift
    echo
    echo "################ $name"
    echo "\$ $*"
    local t0=$SECONDS
    "$@" 2>&1 | tee "$RUNLOG"
    local rc=${PIPESTATUS[0]}
    echo "(exit $rc, $((SECONDS - t0)) s)"
    if ((rc != 0)); then status=1; echo "FAILED: $name"; fi
    return 0
}

echo "embkv benchmarks, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "host: $(uname -srm), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "memory: $(free -m | awk '/^Mem:/ { print $2 " MiB total, " $7 " MiB available" }')"
echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo '?')"
echo "rows $ROWS, batches $BATCHES x $BATCH_SIZE, engine pool $POOL_MB MiB"
rev=$(git rev-parse --short HEAD 2>/dev/null) && echo "commit $rev$(git diff --quiet HEAD -- ext bench 2>/dev/null || echo ' (with local changes)')"

mkdir -p "$SHM_ROOT" "$FS_ROOT" || exit 1

for b in bench_probes bench_engine; do
    [[ -x $BIN/$b ]] || { echo "missing $BIN/$b (run make bench)"; exit 1; }
done

run "bench_probes (/dev/shm)" "$BIN/bench_probes" "$SHM_ROOT/probes"
rm -rf "$SHM_ROOT/probes"

results=()
for where in shm fs; do
    if [[ $where == shm ]]; then root=$SHM_ROOT; else root=$FS_ROOT; fi
    avail=$(free_mb "$root")
    if ((avail < POOL_MB + 256)); then
        echo; echo "skipping bench_engine on $root: $avail MiB free, need $((POOL_MB + 256)) MiB"
        status=1; continue
    fi
    RUNLOG=$root/engine.log
    run "bench_engine ($root, $(df -PT "$root" | awk 'NR == 2 { print $2 }'))" \
        "$BIN/bench_engine" "$root/engine" --rows "$ROWS" --batches "$BATCHES" \
        --batch-size "$BATCH_SIZE" --pool-mb "$POOL_MB"
    results+=("$where $(grep '^RESULT ' "$RUNLOG" || true)")
    rm -rf "${root:?}/engine" "$RUNLOG"
    RUNLOG=/dev/null
done

# bench_engine once more on /dev/shm with options: tag, MiB of /dev/shm it
# needs, label, then the extra arguments; its RESULT line is kept as tag.
engine_variant() {
    local tag=$1 need=$2 label=$3; shift 3
    local avail; avail=$(free_mb "$SHM_ROOT")
    if ((avail < need)); then
        echo; echo "skipping bench_engine $label: $avail MiB free on /dev/shm"
        return
    fi
    RUNLOG=$SHM_ROOT/engine-$tag.log
    run "bench_engine $label ($SHM_ROOT)" \
        "$BIN/bench_engine" "$SHM_ROOT/engine-$tag" --rows "$ROWS" --batches "$BATCHES" \
        --batch-size "$BATCH_SIZE" --pool-mb "$POOL_MB" "$@"
    results+=("$tag $(grep '^RESULT ' "$RUNLOG" || true)")
    rm -rf "$SHM_ROOT/engine-$tag" "$RUNLOG"
    RUNLOG=/dev/null
}
# With an SSD tier configured (a pool half again as large, so that every
# row stays in it): what the tier costs the in-memory paths (access
# statistics, the tier's checks), as ratios to the run above.
engine_variant tier $((POOL_MB * 3 / 2 + 512 + 256)) "with an SSD tier" --ssd-mb 512
# With a DRAM cache of 10% of the rows, the hot set moved into it: batch
# get against the prefetched baseline gather of the same run.
engine_variant cache $((POOL_MB + 512 + 256)) "with a cache of 10% of the rows, hot set in it" --cache-pct 10
field() {  # where, name: a RESULT field of one run
    printf '%s\n' "${results[@]}" | awk -v w="$1" -v k="$2" '$1 == w { for (i = 2; i <= NF; i++) if (index($i, k "=") == 1) { sub(/.*=/, "", $i); print $i } }'
}
if [[ -n $(field tier get_best) && -n $(field shm get_best) ]]; then
    echo
    for k in get_best get_median rmw_best rmw_median put; do
        awk -v k="$k" -v t="$(field tier "$k")" -v n="$(field shm "$k")" 'BEGIN {
            printf "with an SSD tier / without (/dev/shm), %-10s %.3f  (%.2f vs %.2f M rows/s)\n", k, t / n, t / 1e6, n / 1e6 }'
    done
fi

if [[ -n $(field cache get_best) ]]; then
    awk -v g="$(field cache get_best)" -v b="$(field cache bl_pf_best)" 'BEGIN {
        printf "\ncached hot set: embkv get / prefetched baseline gather %.3f (%.2f vs %.2f M rows/s) -> goal (>= 0.8) %s\n",
               g / b, g / 1e6, b / 1e6, (g / b >= 0.8 ? "met" : "not met") }'
fi

# The file-system goal: get on the ordinary FS within 1.5x of /dev/shm.
shm_get=$(printf '%s\n' "${results[@]}" | awk '$1 == "shm" { for (i = 2; i <= NF; i++) if ($i ~ /^get_best=/) { sub(/.*=/, "", $i); print $i } }')
fs_get=$(printf '%s\n' "${results[@]}" | awk '$1 == "fs" { for (i = 2; i <= NF; i++) if ($i ~ /^get_best=/) { sub(/.*=/, "", $i); print $i } }')
if [[ -n $shm_get && -n $fs_get ]]; then
    echo
    awk -v s="$shm_get" -v f="$fs_get" 'BEGIN {
        printf "embkv_get_batch best: /dev/shm %.2f M rows/s, ordinary FS %.2f M rows/s, shm/FS %.3f -> goal (<= 1.5) %s\n",
               s / 1e6, f / 1e6, s / f, (s / f <= 1.5 ? "met" : "not met") }'
fi

if [[ -x $BIN/bench_sql && -f build/embkv.so ]]; then
    avail=$(free_mb "$SHM_ROOT")
    if ((avail < SQL_NEED_MB)); then
        echo; echo "skipping bench_sql: $avail MiB free on /dev/shm, need $SQL_NEED_MB MiB"; status=1
    else
        run "bench_sql (/dev/shm)" "$BIN/bench_sql" "$SHM_ROOT/sql" --ext build/embkv.so \
            --rows "$ROWS" --batches "$BATCHES" --batch-size "$BATCH_SIZE"
        rm -rf "$SHM_ROOT/sql"
    fi
else
    echo; echo "bench_sql skipped: needs build/bench/bench_sql and build/embkv.so"
fi

# The training step: C API, SQL functions from C, two threads x staleness
# (bench_train), and from Python against numpy and a plain SQLite table.
if [[ -x $BIN/bench_train && -f build/embkv.so ]]; then
    run "bench_train (/dev/shm)" "$BIN/bench_train" "$SHM_ROOT/train" --ext build/embkv \
        --rows "$ROWS" --batches "$BATCHES" --pool-mb "$POOL_MB"
    rm -rf "$SHM_ROOT/train"
    if [[ -x $PY ]] && "$PY" -c 'import embkv' 2>/dev/null; then
        run "bench_train.py (/dev/shm)" "$PY" bench/bench_train.py "$SHM_ROOT/trainpy" \
            --rows "$ROWS" --batches "$BATCHES"
        rm -rf "$SHM_ROOT/trainpy"
    else
        echo; echo "bench_train.py skipped: $PY cannot import embkv (make venv installs it)"; status=1
    fi
fi

# Reopen after a clean close and after SIGKILL, and checkpoint cost, against
# the rows changed since the last checkpoint: on /dev/shm and on the
# ordinary file system.  BENCH_RECOVERY_ROWS adds a larger run (dim 16:
# 20000000 needs about 7 GiB of /dev/shm).
if [[ -x $BIN/bench_recovery ]]; then
    run "bench_recovery (/dev/shm)" "$BIN/bench_recovery" "$SHM_ROOT/recovery" --rows "$ROWS"
    mkdir -p "$FS_ROOT"
    run "bench_recovery ($FS_ROOT)" "$BIN/bench_recovery" "$FS_ROOT/recovery" --rows "$ROWS"
    if [[ -n ${BENCH_RECOVERY_ROWS:-} ]]; then
        run "bench_recovery, $BENCH_RECOVERY_ROWS rows of dim 16 (/dev/shm)" "$BIN/bench_recovery" \
            "$SHM_ROOT/recovery-big" --rows "$BENCH_RECOVERY_ROWS" --dim 16 --reps 1
    fi
fi

# Statements beside training: demotions with and without a reader.
if [[ -x $PY ]] && "$PY" -c 'import embkv' 2>/dev/null; then
    run "bench_pins.py (/dev/shm)" "$PY" bench/bench_pins.py "$SHM_ROOT/pins" --seconds 30
    rm -rf "$SHM_ROOT/pins"
    # Reader processes beside a trainer: their reads, and the trainer's steps.
    run "bench_readers.py (/dev/shm)" "$PY" bench/bench_readers.py "$SHM_ROOT/readers"
    rm -rf "$SHM_ROOT/readers"
    # What a COMMIT costs, against an ordinary SQLite table, on both media.
    run "bench_commit.py (/dev/shm)" "$PY" bench/bench_commit.py "$SHM_ROOT/commit"
    run "bench_commit.py (file system)" "$PY" bench/bench_commit.py build/benchdata/commit
fi

# Nearest-neighbour search: embkv_knn against sqlite-vec (the npm package
# sqlite-vec-linux-x64, a benchmark-only peer, installed under build/npm
# when npm can reach its registry) and numpy, 1M rows of dim 64.
if [[ -x $PY ]] && "$PY" -c 'import embkv, numpy' 2>/dev/null; then
    VEC0=build/npm/node_modules/sqlite-vec-linux-x64/vec0.so
    if [[ ! -f $VEC0 ]] && command -v npm >/dev/null; then
        (mkdir -p build/npm && cd build/npm && timeout 300 npm install --no-save --no-audit --no-fund \
            sqlite-vec-linux-x64 >/dev/null 2>&1) || echo "npm could not install sqlite-vec-linux-x64"
    fi
    run "bench_knn.py (/dev/shm)" "$PY" bench/bench_knn.py "$SHM_ROOT/knn" --vec0 "$VEC0"
    rm -rf "$SHM_ROOT/knn"
fi

# The PyTorch CTR model: embkv against torch in memory, and workers x
# staleness (HET's table).
if [[ -x $PY ]] && "$PY" -c 'import embkv, torch' 2>/dev/null; then
    run "bench_ctr.py (/dev/shm)" "$PY" bench/bench_ctr.py --out "$SHM_ROOT/ctr"
    rm -rf "$SHM_ROOT/ctr"
    # The TransE step of pysample/train_kg.py against torch (needs wordnet-base).
    if [[ -d /usr/share/wordnet ]]; then
        run "bench_kg.py (/dev/shm)" "$PY" bench/bench_kg.py "$SHM_ROOT/kg"
    fi
    rm -rf "$SHM_ROOT/ctr"
    # The same model with its table sharded over 1, 2 and 4 ranks (torchrun).
    run "bench_dist.py (/dev/shm)" "$PY" bench/bench_dist.py --out "$SHM_ROOT/dist"
    rm -rf "$SHM_ROOT/dist"
else
    echo; echo "bench_ctr.py skipped: $PY cannot import embkv and torch (make deps venv installs them)"; status=1
fi

echo
echo "results written to $OUT"
exit $status
