#!/usr/bin/env bash
# Runs the analytics example sql/analytics.sql: in a fresh temporary
# directory, with the sqlite3 shell (results only; tests compare them),
# loading the extension from this repository's build/.  Cleans up after.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
if [[ ! -f $repo/build/embkv.so ]]; then
    echo "analytics: $repo/build/embkv.so is missing: run make first" >&2
    exit 1
fi
if ! command -v sqlite3 >/dev/null; then
    echo "analytics: the sqlite3 shell is missing (Debian: apt-get install sqlite3)" >&2
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/embkv-analytics.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# analytics.sql says `.load ./build/embkv`, as a user typing in the repository root
# would; the link makes that name the repository's build/ from the temp dir.
ln -s "$repo/build" "$tmp/build"
cd "$tmp"
sqlite3 -bail analytics.db < "$here/analytics.sql"
