#!/usr/bin/env bash
# Runs every embkv test: the C tests built plain (at EMBKV_TEST_SCALE, 0.3
# unless set), under ASan+UBSan and (the threaded ones) under TSan (at
# 0.25); the SQL tests through the sqlite3 shell against expected output;
# the Python tests (with the embkv package installed into build/venv:
# tests/python_run.sh); the docs check; the install test.  Ends
# with "N passed, N failed".  An argument picks one group: c, sql, python or
# crash (each also run against the sanitizer builds), docs or install, or
# rest (all but c); none runs them all.  The crash group is the SIGKILL harness (tests/crash/: 100
# kills, 30 more against the sanitized extension; EMBKV_CRASH_ROUNDS
# changes the first).  The docs group is tests/docs_check.py: docs/
# documents every function and option the extension registers, and the
# README's examples run.  The install group is tests/install.sh (make
# install into a temporary directory, a C program built with pkg-config,
# pip install into a fresh virtual environment).
#
# All groups run in two lanes at once (EMBKV_TEST_LANES=2, the default): the
# C tests beside the others ("rest": SQL, Python, crash, docs, install),
# each lane's tests one after another; their output is printed lane by
# lane and the counts added (EMBKV_TEST_LANES=1: one lane).  Each lane's
# tests leave much of the machine idle: on two CPUs the lanes take about
# 11 minutes (docs/testing.md).
set -uo pipefail
cd "$(dirname "$0")/.."
group=${1:-all}
case $group in
    all | c | rest | sql | python | crash | docs | install) ;;
    *) echo "usage: tests/run.sh [c|rest|sql|python|crash|docs|install]" >&2; exit 2 ;;
esac
want() { [[ $group == all || $group == "$1" || ($group == rest && $1 != c) ]]; }

if [[ $group == all && ${EMBKV_TEST_LANES:-2} != 1 ]]; then
    lane_c=$(mktemp) lane_rest=$(mktemp)
    echo "two lanes: the C tests beside the others (EMBKV_TEST_LANES=1: one)"
    bash "$0" c >"$lane_c" 2>&1 &
    cpid=$!
    bash "$0" rest 2>&1 | tee "$lane_rest"
    wait "$cpid"
    echo "--- the C tests (the lane beside):"
    cat "$lane_c"
    p=0 f=0 list=()
    for l in "$lane_c" "$lane_rest"; do
        last=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$l" | tail -1)
        if [[ -z $last ]]; then
            echo "a lane ended without its counts: $(tail -1 "$l")"; f=$((f + 1)); list+=("(a lane)")
            continue
        fi
        p=$((p + ${last%% passed*})); last=${last#* passed, }; f=$((f + ${last%% failed*}))
        l_failed=$(grep -E '^failed: ' "$l" | tail -1)
        [[ -n $l_failed ]] && list+=("${l_failed#failed: }")
    done
    rm -f "$lane_c" "$lane_rest"
    ((f)) && printf 'failed: %s\n' "${list[*]}"
    echo "$p passed, $f failed ($SECONDS s)"
    ((f == 0))
    exit
fi
passed=0 failed=0 failures=()

run_one() {  # name, command...
    local name=$1; shift
    local log; log=$(mktemp)
    local t0=$SECONDS
    if "$@" >"$log" 2>&1; then
        passed=$((passed + 1)); echo "ok    $name ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1)); failures+=("$name"); echo "FAIL  $name ($((SECONDS - t0)) s)"; sed 's/^/      /' "$log" | tail -40
    fi
    rm -f "$log"
}

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp"

if want c; then
    # (plain at half size, unless EMBKV_TEST_SCALE says otherwise: the
    # full size, 1, runs in twice the time and is for a change's last check)
    for t in build/plain/tests/test_*; do
        run_one "plain/$(basename "$t")" env EMBKV_TEST_SCALE="${EMBKV_TEST_SCALE:-0.3}" "$t"
    done
    for t in build/asan/tests/test_*; do
        run_one "asan/$(basename "$t")" env EMBKV_TEST_SCALE=0.25 "$t"
    done
    for t in build/tsan/tests/test_concurrency* build/tsan/tests/test_gpu; do
        [[ -x $t ]] && run_one "tsan/$(basename "$t")" env EMBKV_TEST_SCALE=0.25 "$t"
    done
    # The GPU test through the driver path, against a stand-in driver (built
    # with the CUDA part: tests/gpu/fakecuda.c); on a GPU, tests/gpu/run.sh.
    if [[ -x build/fakecuda/test_gpu_real ]]; then
        run_one "fakecuda/test_gpu_real" env LD_LIBRARY_PATH="$PWD/build/fakecuda" FAKECUDA_REPORT=1 \
            build/fakecuda/test_gpu_real
        # (launches run later on the stand-in's device thread: events,
        # waits and the rows' protection meet asynchrony)
        run_one "fakecuda/test_gpu_real-async" env LD_LIBRARY_PATH="$PWD/build/fakecuda" FAKECUDA_REPORT=1 \
            FAKECUDA_ASYNC_US=2000 build/fakecuda/test_gpu_real
        # (a device without read-only registration: the flag is not used)
        run_one "fakecuda/test_gpu_real-no-readonly" env LD_LIBRARY_PATH="$PWD/build/fakecuda" FAKECUDA_REPORT=1 \
            FAKECUDA_NO_READONLY=1 build/fakecuda/test_gpu_real --short
    fi
fi
if want sql && [[ -d tests/sql ]]; then
    for t in tests/sql/*.sql; do
        [[ -f $t ]] && run_one "sql/$(basename "$t" .sql)" bash tests/sql_check.sh "$t"
    done
fi
if want python && [[ -d tests/python ]]; then
    for t in tests/python/test_*.py; do
        [[ -f $t ]] && run_one "python/$(basename "$t" .py)" bash tests/python_run.sh "$t"
    done
fi

if want install; then
    run_one "install/install.sh" bash tests/install.sh
fi

if want crash && [[ -f tests/crash/crash_sql.py ]]; then
    run_one "crash/crash_sql" bash tests/python_run.sh tests/crash/crash_sql.py \
        --rounds "${EMBKV_CRASH_ROUNDS:-100}"
fi

if want docs && [[ -f tests/docs_check.py ]]; then
    run_one "docs/docs_check" bash tests/python_run.sh tests/docs_check.py
fi

# The SQL and Python tests again against the extension built with
# ASan+UBSan, its runtimes preloaded into the shell or Python that loads it
# (Python's own allocations are not leak-checked: it frees little at exit).
if [[ -f build/asan/embkv.so ]]; then
    asan_rt="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
    want sql && for t in tests/sql/*.sql; do
        run_one "asan-sql/$(basename "$t" .sql)" env EMBKV_EXT="$PWD/build/asan/embkv" EMBKV_PRELOAD="$asan_rt" \
            LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp" bash tests/sql_check.sh "$t"
    done
    want python && for t in tests/python/test_*.py; do
        run_one "asan-python/$(basename "$t" .py)" env EMBKV_EXT="$PWD/build/asan/embkv" EMBKV_PRELOAD="$asan_rt" \
            ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 bash tests/python_run.sh "$t"
    done
    want crash && [[ -f tests/crash/crash_sql.py ]] && \
        run_one "asan-crash/crash_sql" env EMBKV_EXT="$PWD/build/asan/embkv" EMBKV_PRELOAD="$asan_rt" \
            ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 bash tests/python_run.sh tests/crash/crash_sql.py --rounds 30
fi

((failed)) && printf 'failed: %s\n' "${failures[*]}"
echo "$passed passed, $failed failed ($SECONDS s)"
((failed == 0))
