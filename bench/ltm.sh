#!/usr/bin/env bash
# The larger-than-memory benchmark (`make bench-ltm`): embkv against RocksDB
# and LMDB on the same data, each measured run inside a v1 memory cgroup
# whose limit (which charges the page cache too) is the memory budget.
#
#   1. installs librocksdb-dev and liblmdb-dev when missing, builds
#      build/bench/bench_ltm (make);
#   2. loads the three data sets into build/ltmdata/<engine> (outside the
#      cgroup); a data set loaded earlier with the same row count is reused
#      (kept by LTM_KEEP=1);
#   3. for each run: creates the cgroups embkv-ltm (memory: the limit;
#      blkio: a limit no run reaches, so that the kernel counts the reads of
#      the cgroup), writes back dirty pages and drops the page cache (every
#      run starts cold), runs `bench_ltm run` inside them and removes them;
#   4. prints the RESULT lines and the ratios embkv / RocksDB and
#      embkv / LMDB for read and train.
#
# Runs: read (batch gets) for embkv with EMBKV_POOL_ADVICE=random and
# =normal, RocksDB and LMDB; then train (pull + Adagrad + push) for the same
# four (the trained runs change the data, so they come last, and the two
# embkv ones draw their hot ids through different permutations).
#
# With the SSD tier: run specs embkv:ssd-laK:MODE (K batches of look-ahead,
# 0 for none) load a second embkv data set, build/ltmdata/embkv-ssd, whose
# pool holds LTM_SSD_POOL MiB (default 640: the index of 8M rows takes 256
# MiB of it, the record space at most half) and whose log holds the rest, e.g.
# LTM_RUNS="embkv:ssd-la0:train embkv:ssd-la1:train embkv:ssd-la4:train
# rocksdb:-:train"; embkv:ssd-la4-dram256:train adds a DRAM cache of 256 MiB
# (cache_size), inside the same memory limit.
#
# With another dtype: a fourth field, e.g. embkv:ssd-la4:train:f16 (a data
# set build/ltmdata/embkv-ssd-f16 loaded with --dtype f16); the summary
# gives each dtype's rate over f32's of the same advice and mode.
#
# Knobs: LTM_ROWS (default 8000000), LTM_MEM (memory limit, default 1G;
# RocksDB's block cache gets half of it), LTM_BATCHES (measured batches of
# 512 ids, default 20000), LTM_SECONDS (measured time limit per run, default
# 60), LTM_WARMUP / LTM_WARMUP_SECONDS (warm-up batches / time limit,
# defaults 2000 / 30), LTM_KEEP=1 (keep build/ltmdata for the next run;
# removed otherwise), LTM_RUNS (a subset, e.g. "embkv:random:read
# lmdb:-:train").  Needs root (cgroups, drop_caches).  Output also goes to
# build/ltm-results.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

ROWS=${LTM_ROWS:-8000000}
MEM=${LTM_MEM:-1G}
BATCHES=${LTM_BATCHES:-20000}
RUN_SECONDS=${LTM_SECONDS:-60}
WARMUP=${LTM_WARMUP:-2000}
WARMUP_SECONDS=${LTM_WARMUP_SECONDS:-30}
KEEP=${LTM_KEEP:-}
RUNS=${LTM_RUNS:-"embkv:random:read embkv:normal:read rocksdb:-:read lmdb:-:read embkv:random:train embkv:normal:train rocksdb:-:train lmdb:-:train"}
BIN=build/bench/bench_ltm
DATA=build/ltmdata
OUT=build/ltm-results.txt
CG_NAME=embkv-ltm

die() { echo "ltm.sh: $*" >&2; exit 1; }

[[ $ROWS =~ ^[0-9]+$ ]] && ((ROWS > 0)) || die "LTM_ROWS must be a positive integer"
MEM_BYTES=$(numfmt --from=iec "$MEM" 2>/dev/null) || die "LTM_MEM: bad size '$MEM' (e.g. 1G, 512M)"
((MEM_BYTES >= 64 << 20)) || die "LTM_MEM must be at least 64M"
CACHE_MB=$((MEM_BYTES / 2 / 1048576))
((EUID == 0)) || die "needs root (memory cgroups, drop_caches)"

# 1. packages and the binary
if [[ ! -f /usr/include/rocksdb/c.h || ! -f /usr/include/lmdb.h ]]; then
    echo "installing librocksdb-dev liblmdb-dev"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y librocksdb-dev liblmdb-dev ||
        { apt-get update && apt-get install -y librocksdb-dev liblmdb-dev; } || die "apt-get install failed"
fi
make --no-print-directory "$BIN" || die "build failed"

# The v1 hierarchies, nested under this shell's own cgroups.
cg_parent() { awk -F: -v c="$1" '$2 == c { print $3 }' /proc/self/cgroup; }
MEM_ROOT=/sys/fs/cgroup/memory
BLK_ROOT=/sys/fs/cgroup/blkio
[[ -f $MEM_ROOT/memory.limit_in_bytes || -d $MEM_ROOT ]] || die "no v1 memory cgroup hierarchy at $MEM_ROOT"
p=$(cg_parent memory); CGM=$MEM_ROOT${p%/}/$CG_NAME
CGB=
if [[ -d $BLK_ROOT ]]; then p=$(cg_parent blkio); CGB=$BLK_ROOT${p%/}/$CG_NAME; fi

DELAYACCT_OLD=
cleanup() {
    local d
    for d in "$CGM" "$CGB"; do
        [[ -n $d && -d $d ]] || continue
        for _ in 1 2 3 4 5; do rmdir "$d" 2>/dev/null && break; sleep 1; done
        [[ -d $d ]] && echo "ltm.sh: could not remove cgroup $d (processes left in it?)" >&2
    done
    if [[ -n $DELAYACCT_OLD ]]; then echo "$DELAYACCT_OLD" > /proc/sys/kernel/task_delayacct; fi
    if [[ -z $KEEP && -d $DATA ]]; then echo "removing $DATA (LTM_KEEP=1 keeps it)"; rm -rf "$DATA"; fi
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

for d in "$CGM" "$CGB"; do
    [[ -n $d && -d $d ]] && { rmdir "$d" 2>/dev/null || die "cgroup $d exists and is in use"; }
done

mkdir -p build
exec > >(tee "$OUT") 2>&1

echo "embkv larger-than-memory benchmark, $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "host: $(uname -srm), $(nproc) CPUs, $(free -m | awk '/^Mem:/ { print $2 " MiB" }'), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
rev=$(git rev-parse --short HEAD 2>/dev/null) && echo "commit $rev$(git diff --quiet HEAD -- ext bench 2>/dev/null || echo ' (with local changes)')"
echo "rows $ROWS (dim 64, adagrad state 64 floats), memory limit $MEM ($MEM_BYTES bytes), RocksDB block cache $CACHE_MB MiB"
echo "per run: warm-up $WARMUP batches or ${WARMUP_SECONDS} s, then $BATCHES batches of 512 or ${RUN_SECONDS} s"

# Per-process I/O wait needs delay accounting; switched on for the runs.
if [[ -r /proc/sys/kernel/task_delayacct && $(cat /proc/sys/kernel/task_delayacct) == 0 ]]; then
    echo 1 > /proc/sys/kernel/task_delayacct && DELAYACCT_OLD=0
fi

# 2. the data
mkdir -p "$DATA" || exit 1
DEV=$(findmnt -no MAJ:MIN -T "$DATA" | head -1 | tr -d ' ')
echo "data: $DATA on $(findmnt -no SOURCE,FSTYPE -T "$DATA" | head -1) ($DEV)"
need_mb() {  # rough disk need of one engine's data, MiB
    case $1 in
        embkv) echo $((ROWS * 576 * 5 / 2 / 1048576 + ROWS * 64 / 1048576 + 64)) ;;
        rocksdb) echo $((ROWS * 1100 / 1048576 + 256)) ;;
        lmdb) echo $((ROWS * 700 / 1048576 + 256)) ;;
    esac
}
SSD_POOL=${LTM_SSD_POOL:-640}
# The data set of a run: embkv-ssd for the SSD tier's runs, embkv-DTYPE for
# a dtype other than f32 (a fourth field of the spec), else the engine's.
set_of() {  # engine advice dtype
    local s=$1
    [[ $2 == ssd-* ]] && s=embkv-ssd
    [[ $1 == embkv && -n $3 && $3 != f32 ]] && s="$s-$3"
    echo "$s"
}
sets=$(for spec in $RUNS; do IFS=: read -r e adv _ dt <<< "$spec"; set_of "$e" "$adv" "$dt"; done | sort -u)
for set in $sets; do
    e=${set%%-*}
    extra=()
    [[ $set == embkv-ssd* ]] && extra=(--pool-mb "$SSD_POOL")
    [[ $set =~ -(f16|bf16|i8)$ ]] && extra+=(--dtype "${BASH_REMATCH[1]}")
    if [[ -f $DATA/$set/ltm.meta ]] && grep -qx "engine=$e rows=$ROWS dim=64 complete=1" "$DATA/$set/ltm.meta"; then
        echo "reusing $DATA/$set (loaded earlier with $ROWS rows; trained runs may have updated it)"
        continue
    fi
    rm -rf "${DATA:?}/$set"
    avail=$(df -Pm "$DATA" | awk 'NR == 2 { print $4 }')
    ((avail > $(need_mb $e) + 1024)) || die "loading $set needs about $(need_mb $e) MiB, $avail MiB free"
    echo
    echo "################ load $set ($ROWS rows)"
    t0=$SECONDS
    "$BIN" load "$e" "$DATA/$set" --rows "$ROWS" "${extra[@]}" || die "load $set failed"
    echo "(load $set: $((SECONDS - t0)) s; $(du -sm "$DATA/$set" | cut -f1) MiB on disk)"
done

# 3. the runs
results=()
status=0
run_one() {  # engine advice mode [dtype]
    local e=$1 adv=$2 mode=$3 dt=${4:-} seed=1 log=$DATA/run.log
    if [[ $mode == train ]]; then [[ $adv == normal ]] && seed=3 || seed=2; fi
    echo
    echo "################ run $e mode=$mode${adv:+ advice=$adv} (memory limit $MEM, cold page cache)"
    mkdir "$CGM" || return 1
    echo "$MEM_BYTES" > "$CGM/memory.limit_in_bytes" || return 1
    if [[ -n $CGB ]]; then
        mkdir "$CGB" && echo "$DEV 1000000000" > "$CGB/blkio.throttle.read_iops_device" &&
            echo "$DEV 1000000000" > "$CGB/blkio.throttle.write_iops_device" || { rmdir "$CGB"; CGB=; }
    fi
    sync
    echo 3 > /proc/sys/vm/drop_caches
    local envs=() set extra=()
    set=$(set_of "$e" "$adv" "$dt")
    if [[ $adv == ssd-la* ]]; then
        local la=${adv#ssd-la}
        extra=(--lookahead "${la%%-*}")
        # ssd-laK-dramM: with a DRAM cache of M MiB (inside the same limit)
        if [[ $la == *-dram* ]]; then extra+=(--dram-mb "${la#*-dram}"); fi
    elif [[ $e == embkv ]]; then
        envs=(EMBKV_POOL_ADVICE="$adv")
    fi
    local t0=$SECONDS
    (
        echo "$BASHPID" > "$CGM/cgroup.procs" || exit 1
        if [[ -n $CGB ]]; then echo "$BASHPID" > "$CGB/cgroup.procs" || exit 1; fi
        exec env "${envs[@]}" "$BIN" run "$e" "$DATA/$set" --rows "$ROWS" --mode "$mode" --batches "$BATCHES" "${extra[@]}" \
            --warmup "$WARMUP" --seconds "$RUN_SECONDS" --warmup-seconds "$WARMUP_SECONDS" \
            --perm-seed "$seed" --cache-mb "$CACHE_MB"
    ) 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    local peak fail oom
    peak=$(($(cat "$CGM/memory.max_usage_in_bytes") / 1048576))
    fail=$(cat "$CGM/memory.failcnt")
    oom=$(awk '$1 == "oom_kill" { print $2 }' "$CGM/memory.oom_control")
    echo "(exit $rc, $((SECONDS - t0)) s; cgroup: peak $peak MiB, limit hit $fail times, ${oom:-0} OOM kills)"
    rmdir "$CGM" || echo "could not remove $CGM"
    [[ -n $CGB ]] && { rmdir "$CGB" || echo "could not remove $CGB"; }
    if ((rc != 0)); then status=1; echo "FAILED: $e $adv $mode"; return 0; fi
    local r
    r=$(grep '^RESULT ' "$log" | tail -1)
    [[ -n $r ]] && results+=("$r peak_mib=$peak")
    rm -f "$log"
}
for spec in $RUNS; do
    IFS=: read -r e adv mode dt <<< "$spec"
    [[ $adv == - ]] && adv=
    run_one "$e" "$adv" "$mode" "$dt" || { status=1; echo "FAILED to set up the cgroup for $spec"; }
done

# 4. summary
echo
echo "################ summary ($ROWS rows, memory limit $MEM)"
printf '%s\n' "${results[@]}"
echo
printf '%s\n' "${results[@]}" | awk '
function f(line, k,   i, n, a) { n = split(line, a, " "); for (i = 2; i <= n; i++) if (index(a[i], k "=") == 1) return substr(a[i], length(k) + 2); return "" }
{
    e = f($0, "engine"); adv = f($0, "advice"); m = f($0, "mode"); dt = f($0, "dtype")
    name = (e == "embkv") ? "embkv(" adv (dt != "f32" ? "," dt : "") ")" : e
    rate[name "/" m] = f($0, "rows_per_s")
    printf "%-15s %-5s %8s rows/s  %7s reads/row (%s)  %8s B read/row  dev qdepth %6s  proc iowait %5s  peak %s MiB  open %s s  stall %s\n",
           name, m, f($0, "rows_per_s"), f($0, "reads_per_row"), f($0, "reads_src"), f($0, "read_bytes_per_row"),
           f($0, "qdepth"), f($0, "proc_iowait"), f($0, "peak_mib"), f($0, "open_s"), f($0, "stall")
}
END {
    print ""
    split("read train", modes, " ")
    split("embkv(random) embkv(normal) embkv(ssd-la0) embkv(ssd-la1) embkv(ssd-la4) embkv(ssd-la4-dram256)", ours, " ")
    split("rocksdb lmdb", base, " ")
    for (mi = 1; mi <= 2; mi++) for (oi = 1; oi <= 6; oi++) for (bi = 1; bi <= 2; bi++) {
        a = rate[ours[oi] "/" modes[mi]]; b = rate[base[bi] "/" modes[mi]]
        if (a != "" && b != "" && b > 0)
            printf "%-5s %s / %s: %.2f\n", modes[mi], ours[oi], base[bi], a / b
    }
    split("f16 bf16 i8", dts, " ")
    split("random normal ssd-la0 ssd-la1 ssd-la4", advs, " ")
    for (mi = 1; mi <= 2; mi++) for (ai = 1; ai <= 5; ai++) for (di = 1; di <= 3; di++) {
        a = rate["embkv(" advs[ai] "," dts[di] ")/" modes[mi]]; b = rate["embkv(" advs[ai] ")/" modes[mi]]
        if (a != "" && b != "" && b > 0)
            printf "%-5s embkv(%s,%s) / embkv(%s): %.2f\n", modes[mi], advs[ai], dts[di], advs[ai], a / b
    }
}'
echo
echo "results written to $OUT"
exit $status
