#!/usr/bin/env bash
# tests/gpu/run.sh - every GPU test and the GPU benchmark, on a machine with
# a GPU (docs/gpu.md, docs/testing.md).  In about five minutes:
#   1. test_gpu_real: gathers equal the CPU path's bytes in every tier and
#      dtype, thousands of batches under concurrent writes, demotions,
#      compactions and checkpoints, device pushes equal CPU pushes;
#   2. the same, short, under compute-sanitizer's memcheck (when the
#      toolkit has it);
#   3. tests/gpu/test_torch_cuda.py: embkv.torch on CUDA equals it on the
#      CPU bit for bit, and torch's modules on CUDA within rounding;
#   4. bench/bench_gpu.py: rows/s into device memory (embkv's GPU gather,
#      its CPU gather + copy, torch CPU + .cuda(), torch on the GPU) and the
#      link's bandwidth, measured in the same run.
# Then a summary, one line a step; the exit status is 0 when no step
# failed (a skipped one says why).  It runs in this source tree (tests/,
# bench/ and pysample/ are used from it).  The machine needs the NVIDIA
# driver (for CUDA 13), glibc 2.34 or later, and for 3 and 4 a python3
# with a CUDA build of PyTorch and numpy, whose sqlite3 is SQLite 3.38 or
# later; the rest comes in build/gpu, made where the project builds (`make
# gpu-bundle`: the test, the extension, the library and the Debian
# libraries they load, found through their rpath) and carried there.
# Stores go to /dev/shm when it has room, else to $TMPDIR.  Logs and the
# benchmark's results go to $OUT when it is set (else build/gpu/out).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
kit=$root/build/gpu
out=${OUT:-$kit/out}
mkdir -p "$out"
if [[ ! -x $kit/test_gpu_real ]]; then
    if ! make -s gpu-bundle >"$out/bundle.log" 2>&1; then
        echo "tests/gpu/run.sh: no build/gpu kit, and it cannot be built here ($out/bundle.log): run" \
             "\`make gpu-bundle\` where the project builds and bring build/gpu along" >&2
        exit 2
    fi
fi
export EMBKV_EXT=$kit/embkv
export EMBKV_LIB=$kit/libembkv.so
export PYTHONPATH=$root/pysample${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
# Where the stores go: /dev/shm where it has room (a tmpfs mapping
# registers with or without read-only registration; a disk file's
# writable mapping may not), else the temporary directory.  The tests
# need under 400 MiB, the benchmark's pools of 2M rows about 3 GiB.
free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
dir_for() {  # dir_for KIB: /dev/shm when it has KIB free, else $TMPDIR
    if [[ -n $free_kb && $free_kb -gt $1 ]]; then echo /dev/shm; else echo "${TMPDIR:-/tmp}"; fi
}
# (directories of this run's own, removed at its end: another run's stores
# beside them are not touched)
export EMBKV_GPU_DIR=$(mktemp -d "$(dir_for $((1 << 20)))/embkv-gpu-run.XXXXXX")
bench_dir=$(mktemp -d "$(dir_for $((4 << 20)))/embkv-gpu-bench.XXXXXX")
trap 'rm -rf "$EMBKV_GPU_DIR" "$bench_dir"' EXIT
summary=()
step() {  # step NAME TIMEOUT CMD...: runs it, logs to $out/NAME.log, records the result
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS rc
    timeout -k 10 "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
    # (what a step killed at its limit left behind)
    if [[ $rc -eq 124 || $rc -eq 137 ]]; then rm -rf "${EMBKV_GPU_DIR:?}"/* "${bench_dir:?}"/*; fi
    local verdict=ok
    [[ $rc -ne 0 ]] && verdict="FAILED (exit $rc)"
    [[ $rc -eq 124 ]] && verdict="FAILED (over ${limit}s)"
    summary+=("$(printf '%-16s %-22s %4ss  %s' "$name" "$verdict" $((SECONDS - t0)) "$(tail -n 1 "$out/$name.log")")")
    echo "== $name: $verdict"
    tail -n 15 "$out/$name.log"
}
skip() {
    summary+=("$(printf '%-16s %-22s        %s' "$1" "skipped" "$2")")
    echo "== $1: skipped: $2"
}
refuse() {  # a step that should run here and cannot: a failure, with why
    summary+=("$(printf '%-16s %-22s        %s' "$1" "FAILED (cannot run)" "$2")")
    echo "== $1: FAILED: $2"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4 || true
echo "stores in $EMBKV_GPU_DIR, the benchmark's in $bench_dir"
step test_gpu_real 120 "$kit/test_gpu_real"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer \
      /usr/local/cuda*/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [[ -n $san && -x $san ]]; then
    step memcheck 90 "$san" --tool memcheck --error-exitcode 9 --leak-check no "$kit/test_gpu_real" --short
else
    skip memcheck "no compute-sanitizer on this machine"
fi
# Python: skipped only where this machine's PyTorch has no CUDA (nothing
# of the device path can run from it then); with CUDA, whatever else is
# missing (numpy, a sqlite3 that loads extensions) fails the steps.
pyok=$("$py" - <<'EOF' 2>&1
import sqlite3, sys
try:
    import torch
except ImportError:
    print("skip: no torch for %s" % sys.executable); sys.exit()
if not torch.cuda.is_available():
    print("skip: this PyTorch has no CUDA"); sys.exit()
if sqlite3.sqlite_version_info < (3, 38, 0):
    print("%s's sqlite3 is SQLite %s: embkv needs 3.38 or later" % (sys.executable, sqlite3.sqlite_version)); sys.exit()
try:
    import numpy
except ImportError:
    print("no numpy for %s" % sys.executable); sys.exit()
c = sqlite3.connect(":memory:")
if not hasattr(c, "enable_load_extension"):
    print("%s's sqlite3 cannot load extensions" % sys.executable); sys.exit()
print("ok")
EOF
)
if [[ $pyok == ok ]]; then
    step torch_cuda 90 "$py" -u tests/gpu/test_torch_cuda.py
    step bench_gpu 180 "$py" -u bench/bench_gpu.py --dir "$bench_dir" --out "$out/bench_gpu.json"
elif [[ $pyok == skip:* ]]; then
    skip torch_cuda "${pyok#skip: }"
    skip bench_gpu "${pyok#skip: }"
else
    refuse torch_cuda "$pyok"
    refuse bench_gpu "$pyok"
fi
echo
echo "== summary (logs in $out)"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
! grep -q FAILED "$out/summary.txt"
