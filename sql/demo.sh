#!/usr/bin/env bash
# Runs the shell walkthrough sql/demo.sql (`make demo`): in a fresh temporary
# directory, with the sqlite3 shell echoing each statement before its result,
# loading the extension from this repository's build/.  Cleans up after.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
if [[ ! -f $repo/build/embkv.so ]]; then
    echo "demo: $repo/build/embkv.so is missing: run make first" >&2
    exit 1
fi
if ! command -v sqlite3 >/dev/null; then
    echo "demo: the sqlite3 shell is missing (Debian: apt-get install sqlite3)" >&2
    exit 1
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/embkv-demo.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# demo.sql says `.load ./build/embkv`, as a user typing in the repository root
# would; the link makes that name the repository's build/ from the temp dir.
ln -s "$repo/build" "$tmp/build"
cd "$tmp"
sqlite3 -bail -echo demo.db < "$here/demo.sql"
