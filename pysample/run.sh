#!/usr/bin/env bash
# pysample/run.sh SCRIPT [args]: runs a Python sample with a Python whose
# sqlite3 module can load extensions (Debian's /usr/bin/python3 first).
set -euo pipefail
probe='import sqlite3; sqlite3.connect(":memory:").enable_load_extension(True)'
for py in /usr/bin/python3 "$(command -v python3 || true)"; do
    if [[ -n $py && -x $py ]] && "$py" -c "$probe" 2>/dev/null; then
        exec "$py" "$@"
    fi
done
echo "pysample/run.sh: no Python whose sqlite3 module can load extensions (tried /usr/bin/python3 and" \
     "python3 on PATH); install Debian's python3 (make deps)" >&2
exit 1
