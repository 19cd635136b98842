#!/usr/bin/env bash
# tests/fuzz/run.sh - runs embkv's libFuzzer targets (tests/fuzz/fuzz_*.c).
#
#   run.sh short   each target briefly (FUZZ_SHORT_SECONDS, default 15), from
#                  a temporary copy of its seed corpus: the pass `make test`
#                  ends with.  The repository's corpus is never written.
#   run.sh long    each target FUZZ_SECONDS (default 600; `make fuzz`), its
#                  corpus kept in build/fuzz/corpus/<name> (seeded from the
#                  repository's) so that later long runs go on from it.
#   run.sh long store vec ...   only the targets named.
#
# A long run goes in rounds of FUZZ_ROUND_SECONDS (default 300), each a
# fresh process on the corpus so far (libpmemobj's leak on failed opens,
# see lsan.supp, would otherwise reach libFuzzer's RSS limit); executions
# and new units are summed over the rounds.
#
# Targets run FUZZ_JOBS at a time (default: the number of cores).  Each
# prints its executions; a crash, a sanitizer report, a leak, a hang
# (-timeout) or running out of memory fails the run (exit status 1), and
# the input that did it is kept in build/fuzz/artifacts/<name>/ with the
# end of the target's log shown.  Why a script and not make rules: the
# pass needs temporary corpora and scratch directories cleaned up whatever
# happens, parallel runs with their logs kept apart, and a summary.
set -uo pipefail
cd "$(dirname "$0")/../.."
mode=${1:-short}
shift || true
case $mode in
    short) secs=${FUZZ_SHORT_SECONDS:-15} ;;
    long) secs=${FUZZ_SECONDS:-600} ;;
    *) echo "usage: tests/fuzz/run.sh short|long [target...]" >&2; exit 2 ;;
esac

# Build what is missing (a no-op when `make fuzz` or a previous pass did);
# a make of its own, not the calling make's jobserver.
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 2)}
build() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory -j"$jobs" "$@" fuzz-build; }
if ! build -s >/dev/null 2>&1; then
    echo "fuzz: the build of the targets failed" >&2
    build 2>&1 | tail -30 >&2
    exit 1
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
    for f in tests/fuzz/fuzz_*.c; do
        n=$(basename "$f" .c)
        targets+=("${n#fuzz_}")
    done
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/embkv-fuzz-run.XXXXXX")
scratch_base=/dev/shm
[[ -d $scratch_base && -w $scratch_base ]] || scratch_base=$tmp
scratch=$(mktemp -d "$scratch_base/embkv-fuzz-scratch.XXXXXX")
cleanup() { rm -rf "$tmp" "$scratch"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# libpmemobj keeps pointers to its runtime state inside the pool mapping,
# which LeakSanitizer does not scan: its allocations would show as leaks.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0}
export EMBKV_FUZZ_SCRATCH=$scratch

run_target() {  # name -> writes $tmp/<name>.log and $tmp/<name>.rc
    local name=$1 bin=build/fuzz/fuzz_$1 corpus seeds=tests/fuzz/corpus/$1
    local art=build/fuzz/artifacts/$name
    mkdir -p "$art"
    if [[ $mode == short ]]; then
        corpus=$tmp/corpus-$name
        mkdir -p "$corpus"
        [[ -d $seeds ]] && cp -r "$seeds"/. "$corpus"/
    else
        corpus=build/fuzz/corpus/$name
        mkdir -p "$corpus"
        [[ -d $seeds ]] && cp -rn "$seeds"/. "$corpus"/
    fi
    local args=(-timeout=30 -rss_limit_mb=3072 -max_len=4096 -print_final_stats=1 -artifact_prefix="$art/")
    [[ -f tests/fuzz/$name.dict ]] && args+=(-dict="tests/fuzz/$name.dict")
    # A cache_size option may ask for more than libFuzzer's default limit
    # on one allocation; the engine maps it lazily (what counts is RSS).
    # It caps files with RLIMIT_FSIZE itself: a pool past the cap must fail
    # as on a full disk, not stop the fuzzer (libFuzzer's SIGXFSZ handler).
    [[ $name == options ]] && args+=(-malloc_limit_mb=65536 -handle_xfsz=0)
    # Long runs go in rounds of a fresh process each, on the corpus so far:
    # libpmemobj 1.12 leaks its runtime state (8 MB for a 16 MiB pool) on
    # every pmemobj_open that fails (a truncated pool, say), which would
    # otherwise add up to libFuzzer's RSS limit within minutes.
    local left=$secs round=${FUZZ_ROUND_SECONDS:-300} rc=0 t
    [[ $mode == short ]] && round=$secs
    : >"$tmp/$name.log"
    touch "$tmp/$name.start"
    local start=$SECONDS
    while ((left > 0)); do
        t=$((left < round ? left : round))
        "$bin" "${args[@]}" -max_total_time="$t" "$corpus" >>"$tmp/$name.log" 2>&1
        rc=$?
        ((rc != 0)) && break
        left=$((left - t))
    done
    echo "$((SECONDS - start))" >"$tmp/$name.wall"
    echo "$rc" >"$tmp/$name.rc"
}

t0=$SECONDS
echo "fuzz: $mode pass, ${secs} s per target, ${#targets[@]} targets, $jobs at a time"
running=0
for name in "${targets[@]}"; do
    if [[ ! -x build/fuzz/fuzz_$name ]]; then
        echo "fuzz: no target $name" >&2
        echo 2 >"$tmp/$name.rc"
        continue
    fi
    run_target "$name" &
    running=$((running + 1))
    if ((running >= jobs)); then
        wait -n
        running=$((running - 1))
    fi
done
wait

failed=0
for name in "${targets[@]}"; do
    rc=$(cat "$tmp/$name.rc" 2>/dev/null || echo 2)
    log=$tmp/$name.log
    # Summed over the rounds of a long run.
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" 2>/dev/null | awk '{s += $1} END {print s + 0}')
    added=$(sed -n 's/^stat::new_units_added: *//p' "$log" 2>/dev/null | awk '{s += $1} END {print s + 0}')
    rounds=$(grep -c '^stat::number_of_executed_units' "$log" 2>/dev/null)
    wall=$(cat "$tmp/$name.wall" 2>/dev/null || echo 0)
    if [[ $rc == 0 ]]; then
        printf 'ok    fuzz/%-10s %9s executions in %s s (%s/s, %s new units%s)\n' "$name" "$execs" "$wall" \
            "$((execs / (wall > 0 ? wall : 1)))" "$added" "$( ((rounds > 1)) && echo ", $rounds rounds")"
    else
        failed=$((failed + 1))
        printf 'FAIL  fuzz/%-10s %9s executions (exit %s)\n' "$name" "${execs:-?}" "$rc"
        [[ -f $log ]] && grep -v '^#[0-9]' "$log" | tail -60 | sed 's/^/      /'
        find build/fuzz/artifacts/"$name" -type f -newer "$tmp/$name.start" 2>/dev/null |
            sed "s|^|      input: |; s|\$| (rerun: build/fuzz/fuzz_$name <input>)|"
    fi
done
echo "fuzz: ${#targets[@]} targets, $failed failed ($((SECONDS - t0)) s)"
((failed == 0))
