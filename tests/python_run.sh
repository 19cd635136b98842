#!/usr/bin/env bash
# tests/python_run.sh tests/python/test_NAME.py [unittest args]
#
# Runs one Python test file (standard library unittest), or
# tests/crash/crash_sql.py, with build/venv/bin/python: a virtual
# environment over Debian's /usr/bin/python3 (whose sqlite3 can load
# extensions; numpy and torch come from Debian) where the embkv package is
# installed with pip, as users install it.  `make venv` runs first: it
# creates the environment and installs the package again when the
# extension or the package's files changed, and does nothing otherwise.
# The tests import the installed package (not pysample/) and load the
# extension installed with it; $EMBKV_EXT names another build instead (the
# sanitizer runs), and $EMBKV_PRELOAD goes into LD_PRELOAD.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ $# -lt 1 || ! -f $1 ]]; then
    echo "usage: tests/python_run.sh tests/python/test_NAME.py [unittest args]" >&2
    exit 2
fi
if ! make -s --no-print-directory -C "$root" venv >&2; then
    echo "python_run: \`make venv\` failed (messages above): the embkv package could not be installed" \
         "into $root/build/venv" >&2
    exit 2
fi
exec env ${EMBKV_PRELOAD:+LD_PRELOAD="$EMBKV_PRELOAD"} "$root/build/venv/bin/python" "$@"
