#!/usr/bin/env bash
# tests/python_run.sh tests/python/test_NAME.py
#
# Runs one Python test file (standard library unittest) with a Python whose
# sqlite3 module can load extensions: /usr/bin/python3 (Debian's) first,
# then python3 from PATH.  Many self-built Pythons (pyenv, some venvs) are
# compiled without extension loading; they are skipped.  The tests find the
# extension through $EMBKV_EXT (build/embkv, without the .so).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ $# -lt 1 || ! -f $1 ]]; then
    echo "usage: tests/python_run.sh tests/python/test_NAME.py [unittest args]" >&2
    exit 2
fi
probe='import sqlite3; sqlite3.connect(":memory:").enable_load_extension(True)'
py=
for cand in /usr/bin/python3 "$(command -v python3 || true)"; do
    if [[ -n $cand && -x $cand ]] && "$cand" -c "$probe" 2>/dev/null; then
        py=$cand
        break
    fi
done
if [[ -z $py ]]; then
    echo "python_run: no Python whose sqlite3 module can load extensions" \
         "(tried /usr/bin/python3 and python3 on PATH);" \
         "install Debian's python3 (apt-get install python3 python3-numpy)" >&2
    exit 1
fi
export EMBKV_EXT=${EMBKV_EXT:-$root/build/embkv}   # another build via $EMBKV_EXT
if [[ ! -f $EMBKV_EXT.so ]]; then
    echo "python_run: $EMBKV_EXT.so is missing: run make first" >&2
    exit 2
fi
exec env ${EMBKV_PRELOAD:+LD_PRELOAD="$EMBKV_PRELOAD"} "$py" "$@"
