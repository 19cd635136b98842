#!/usr/bin/env bash
# pysample/run.sh SCRIPT [args]: runs a Python sample with build/venv/bin/python,
# where `make venv` (run first; it does nothing when up to date) installs the
# embkv package with pip, as a user installs it.  The sample's own directory
# is kept off sys.path (PYTHONSAFEPATH), so `import embkv` is the installed
# package, not pysample/embkv beside it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ $# -lt 1 ]]; then
    echo "usage: pysample/run.sh SCRIPT.py [args]" >&2
    exit 2
fi
if ! make -s --no-print-directory -C "$root" venv >&2; then
    echo "pysample/run.sh: \`make venv\` failed (messages above): the embkv package could not be installed" \
         "into $root/build/venv" >&2
    exit 2
fi
exec env PYTHONSAFEPATH=1 "$root/build/venv/bin/python" "$@"
