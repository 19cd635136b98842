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
# Where the stores go: /dev/shm with 6 GiB free (the benchmark's two
# pools of 2M rows take about 4.5), else the temporary directory.
free_kb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
if [[ -n $free_kb && $free_kb -gt $((6 << 20)) ]]; then
    export EMBKV_GPU_DIR=/dev/shm
else
    export EMBKV_GPU_DIR=${TMPDIR:-/tmp}
fi
summary=()
step() {  # step NAME TIMEOUT CMD...: runs it, logs to $out/NAME.log, records the result
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS rc
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    rc=$?
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

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4 || true
echo "stores in $EMBKV_GPU_DIR"
step test_gpu_real 120 "$kit/test_gpu_real"
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
if [[ -n $san && -x $san ]]; then
    step memcheck 90 "$san" --tool memcheck --error-exitcode 9 --leak-check no "$kit/test_gpu_real" --short
else
    skip memcheck "no compute-sanitizer on this machine"
fi
pyok=$("$py" - <<'EOF' 2>&1
import sqlite3, sys
if sqlite3.sqlite_version_info < (3, 38, 0):
    print("%s's sqlite3 is SQLite %s: embkv needs 3.38 or later" % (sys.executable, sqlite3.sqlite_version)); sys.exit()
try:
    import numpy, torch
except ImportError as e:
    print("no %s for %s" % (e.name, sys.executable)); sys.exit()
if not torch.cuda.is_available():
    print("this PyTorch has no CUDA"); sys.exit()
c = sqlite3.connect(":memory:")
if not hasattr(c, "enable_load_extension"):
    print("%s's sqlite3 cannot load extensions" % sys.executable); sys.exit()
print("ok")
EOF
)
if [[ $pyok == ok ]]; then
    step torch_cuda 90 "$py" -u tests/gpu/test_torch_cuda.py
else
    skip torch_cuda "$pyok"
fi
if "$py" -c 'import numpy, torch; assert torch.cuda.is_available()' 2>/dev/null; then
    step bench_gpu 180 "$py" -u bench/bench_gpu.py --dir "$EMBKV_GPU_DIR" --out "$out/bench_gpu.json"
else
    skip bench_gpu "needs numpy and a CUDA build of PyTorch for $py"
fi
echo
echo "== summary (logs in $out)"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
! grep -q FAILED "$out/summary.txt"
