#!/usr/bin/env bash
# tests/sql_check.sh [-o] tests/sql/NAME.sql
#
# Runs one SQL test script through the sqlite3 shell and compares what it
# prints (stdout and stderr, in order, errors included) with
# tests/sql/NAME.expected, byte for byte.  -o prints the actual output
# instead of comparing (to read it, never to paste it unread).
#
# The run happens in a fresh temporary directory, which is the shell's
# current directory (and holds nothing else): the database is test.db
# there, $TMPDIR is its tmp/
# (so temporary stores of :memory: tables land where `.shell ls tmp` sees
# them), and build/ links to the directory of the extension (so
# `.load build/embkv` works after `.open`).  The extension is loaded before the script by
# -cmd, so line numbers in error messages ("near line N") are the script's.
# Paths under the run's directory are printed as $WORK/..., and the random
# part of store directory names as <id>.
#
# A line "-- @reopen" ends one sqlite3 process and starts another on the
# same database: what comes after it runs in a new process (persistence
# tests).  Every process sees the whole script with the other parts blanked
# out, so line numbers stay those of the file; the output shows the marker.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
show=0
if [[ ${1:-} == -o ]]; then show=1; shift; fi
if [[ $# -ne 1 || ! -f $1 ]]; then
    echo "usage: tests/sql_check.sh [-o] tests/sql/NAME.sql" >&2
    exit 2
fi
script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
expected=${script%.sql}.expected
# Another build (the sanitized one) via $EMBKV_EXT, with the libraries it
# needs preloaded into the shell only via $EMBKV_PRELOAD.
ext=${EMBKV_EXT:-$root/build/embkv}
if [[ ! -f $ext.so ]]; then
    echo "sql_check: $ext.so is missing: run make first" >&2
    exit 2
fi
if ! command -v sqlite3 >/dev/null; then
    echo "sql_check: the sqlite3 shell is missing (Debian package sqlite3)" >&2
    exit 2
fi
top=$(mktemp -d "${TMPDIR:-/tmp}/embkv-sql-XXXXXX") || exit 2
trap 'rm -rf "$top"' EXIT
work=$top/run
mkdir "$work" "$work/tmp"
ln -s "$(dirname "$ext")" "$work/build"

nparts=$(( $(grep -c '^-- @reopen' "$script") + 1 ))
for ((k = 0; k < nparts; k++)); do
    awk -v k="$k" '/^-- @reopen/ { p++; print ""; next } { print (p == k) ? $0 : "" }' \
        "$script" >"$top/part$k.sql"
    if ((k > 0)); then echo "-- @reopen" >>"$top/out"; fi
    # Line-buffered stdout and stderr into one file keep errors in place.
    (cd "$work" && TMPDIR="$work/tmp" stdbuf -oL -eL \
        env ${EMBKV_PRELOAD:+LD_PRELOAD="$EMBKV_PRELOAD"} \
        sqlite3 -batch -init /dev/null -cmd ".load $ext" test.db <"$top/part$k.sql" >>"$top/out" 2>&1)
done

# The run's directory differs each time: messages that name files show it
# as $WORK; the random ids in default store directories show as <id>.
real=$(cd "$work" && pwd -P)
sed -i -e "s|$real|\$WORK|g" -e "s|$work|\$WORK|g" \
    -e 's/-[0-9a-f]\{16\}\.embkv/-<id>.embkv/g' \
    -e 's|/embkv-[0-9a-f]\{16\}-[A-Za-z0-9]\{6\}|/embkv-<id>-<tmp>|g' "$top/out"

if ((show)); then
    cat "$top/out"
    exit 0
fi
if [[ ! -f $expected ]]; then
    echo "sql_check: $expected is missing; the actual output was:"
    cat "$top/out"
    exit 1
fi
diff -u --label "$(basename "$expected")" --label actual "$expected" "$top/out"
