#!/usr/bin/env bash
# tests/install.sh: embkv installed the ways docs/install.md describes, and
# used from outside the repository.
#   1. `make install DESTDIR=<tmp>/stage` puts exactly the expected files
#      (embkv.h, libembkv.a, libembkv.so with its soname links, the SQLite
#      extension, embkv.pc) and `make uninstall` removes every one.
#   2. `make install PREFIX=<tmp>/prefix`: a C program built with
#      `pkg-config --cflags --libs embkv` (the shared library, found through
#      an rpath) and again with `pkg-config --static` (libembkv.a linked in)
#      creates a store, puts a row, reopens the store and reads the row back
#      bit for bit; the sqlite3 shell loads the installed extension.
#      The libraries export only their interfaces: libembkv.so the C API
#      (embkv_ and a letter), the extension its entry point.  A PREFIX
#      with a space works through pkg-config (its paths escaped, read with
#      eval); a relative PREFIX is refused, naming it.
#   3. A fresh virtual environment (--system-site-packages: Debian's numpy
#      and torch) gets the repository with `pip install --no-index` (no
#      network), and from another directory, with no PYTHONPATH and no
#      EMBKV_EXT, a script imports embkv and embkv.torch, checks
#      embkv.__version__ against SELECT embkv_version(), and trains a few
#      steps of a small embkv.torch model (the loss falls, the rows change).
# Everything lives in one temporary directory, removed at exit.  Run by
# tests/run.sh (group install).  `make install` builds what is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=/usr/bin/python3   # Debian's: its sqlite3 can load extensions
fail() { printf 'install.sh: %b\n' "$*" >&2; exit 1; }
step() { echo "== $*"; }

for tool in make cc pkg-config sqlite3 readelf "$PYTHON"; do
    command -v "$tool" >/dev/null || fail "$tool is missing: \`make deps\` installs the Debian packages the tests need"
done
version=$(sed -n 's/^#define EMBKV_VERSION_STRING "\([^"]*\)".*/\1/p' "$root/ext/embkv.h")
[[ -n $version ]] || fail "no EMBKV_VERSION_STRING in $root/ext/embkv.h"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/embkv-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mk() { make -s --no-print-directory -C "$root" "$@"; }

# ---- 1. DESTDIR: the files, then uninstall ---------------------------------
step "make install DESTDIR=$tmp/stage"
stage=$tmp/stage
mk install DESTDIR="$stage"
lib=$stage/usr/local/lib
soname=$(readelf -d "$lib/libembkv.so.$version" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[[ $soname == libembkv.so.* ]] || fail "libembkv.so.$version has no soname libembkv.so.N (found '$soname')"
want=$(printf '%s\n' usr/local/include/embkv.h usr/local/lib/libembkv.a usr/local/lib/libembkv.so \
    "usr/local/lib/$soname" "usr/local/lib/libembkv.so.$version" usr/local/lib/pkgconfig/embkv.pc \
    usr/local/lib/sqlite3/embkv.so | sort)
got=$(cd "$stage" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort)
[[ $got == "$want" ]] || fail "make install DESTDIR=... installed\n$got\ninstead of\n$want"
[[ $(readlink "$lib/libembkv.so") == "$soname" && $(readlink "$lib/$soname") == "libembkv.so.$version" ]] ||
    fail "the links libembkv.so -> $soname -> libembkv.so.$version are wrong"
cmp -s "$root/ext/embkv.h" "$stage/usr/local/include/embkv.h" || fail "the installed embkv.h differs from ext/embkv.h"
grep -qx "Version: $version" "$lib/pkgconfig/embkv.pc" || fail "embkv.pc does not say Version: $version"
grep -qx "libdir=/usr/local/lib" "$lib/pkgconfig/embkv.pc" || fail "embkv.pc's libdir is not /usr/local/lib"
step "make uninstall DESTDIR=$tmp/stage"
mk uninstall DESTDIR="$stage"
left=$(cd "$stage" && find . \( -type f -o -type l \))
[[ -z $left ]] || fail "make uninstall left\n$left"

# ---- 2. PREFIX: C programs through pkg-config, the sqlite3 shell --------
prefix=$tmp/prefix
step "make install PREFIX=$prefix"
mk install PREFIX="$prefix" LDCONFIG=   # (no ldconfig for a temporary prefix)
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[[ $(pkg-config --modversion embkv) == "$version" ]] || fail "pkg-config --modversion embkv is not $version"
ext=$(pkg-config --variable=extension embkv)
[[ $ext == "$prefix/lib/sqlite3/embkv.so" && -f $ext ]] || fail "pkg-config --variable=extension embkv gave '$ext'"

cat >"$tmp/app.c" <<'EOF'
/* Creates a store, puts a row, reopens the store, gets it back exactly. */
#include <embkv.h>
#include <stdio.h>
#include <string.h>

static int check(int rc, const char *what)
{
    if (rc != EMBKV_OK)
        fprintf(stderr, "app: %s failed (%d): %s\n", what, rc, embkv_errmsg());
    return rc == EMBKV_OK;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: app DIR\n");
        return 2;
    }
    const float want[4] = {1.5f, -2.25f, 0.0f, 3.0e-7f};
    embkv_options o;
    memset(&o, 0, sizeof o);
    o.dim = 4;
    o.expected_rows = 1000;
    embkv_store *s;
    if (!check(embkv_open(argv[1], &o, EMBKV_OPEN_CREATE, &s), "embkv_open (create)") ||
        !check(embkv_put(s, 42, want, NULL, 0), "embkv_put") || !check(embkv_close(s), "embkv_close"))
        return 1;
    o.expected_rows = 0;
    if (!check(embkv_open(argv[1], &o, 0, &s), "embkv_open (reopen)"))
        return 1;
    float got[4] = {0};
    embkv_rowinfo info;
    if (!check(embkv_get(s, 42, got, NULL, &info), "embkv_get"))
        return 1;
    if (memcmp(got, want, sizeof want) != 0 || info.clock != 0 || embkv_count(s) != 1 ||
        embkv_dim(s) != 4) {
        fprintf(stderr, "app: read back %g %g %g %g (clock %llu, %llu rows), not what was put\n", got[0],
                got[1], got[2], got[3], (unsigned long long)info.clock, (unsigned long long)embkv_count(s));
        return 1;
    }
    if (embkv_get(s, 7, got, NULL, NULL) != EMBKV_NOTFOUND) {
        fprintf(stderr, "app: id 7 was never put, but embkv_get did not say EMBKV_NOTFOUND\n");
        return 1;
    }
    if (!check(embkv_close(s), "embkv_close"))
        return 1;
    printf("embkv %s: row 42 read back exactly\n", EMBKV_VERSION_STRING);
    return 0;
}
EOF
cflags=(-std=c11 -Wall -Wextra -Werror)
step "cc app.c \$(pkg-config --cflags --libs embkv)"
# shellcheck disable=SC2046  # pkg-config's output is a list of words
cc "${cflags[@]}" -o "$tmp/app-shared" "$tmp/app.c" $(pkg-config --cflags --libs embkv) -Wl,-rpath,"$prefix/lib"
readelf -d "$tmp/app-shared" | grep -q "(NEEDED).*\[$soname\]" || fail "app-shared does not load $soname"
(cd "$tmp" && ./app-shared "$tmp/store-shared") || fail "the program linked with libembkv.so failed"
step "cc app.c -Wl,-Bstatic -lembkv -Wl,-Bdynamic \$(pkg-config --static --libs embkv)"
# shellcheck disable=SC2046
cc "${cflags[@]}" -o "$tmp/app-static" "$tmp/app.c" $(pkg-config --cflags embkv) \
    -Wl,--as-needed -Wl,-Bstatic -lembkv -Wl,-Bdynamic $(pkg-config --static --libs embkv)
if readelf -d "$tmp/app-static" | grep -q "(NEEDED).*libembkv"; then
    fail "app-static needs the shared libembkv (libembkv.a was not linked in)"
fi
(cd "$tmp" && ./app-static "$tmp/store-static") || fail "the program linked with libembkv.a failed"

step "sqlite3: .load ${ext%.so}"
out=$(cd "$tmp" && sqlite3 -batch :memory: ".load ${ext%.so}" "SELECT embkv_version();" \
    "CREATE VIRTUAL TABLE t USING embkv(dim=2, path='$tmp/shell.store');" \
    "INSERT INTO t(id, vec) VALUES (5, embkv_vec('[0.5, -2]'));" \
    "SELECT id, embkv_json(vec) FROM t;")
[[ $out == "$version"$'\n''5|[0.5,-2]' ]] || fail "the sqlite3 shell with the installed extension printed\n$out"

step "exported symbols"
extra=$(nm -D --defined-only "$prefix/lib/libembkv.so.$version" | awk '{print $3}' | grep -v '^embkv_[a-z]' || true)
[[ -z $extra ]] || fail "libembkv.so exports symbols outside the C API:\n$extra"
nm -D --defined-only "$prefix/lib/libembkv.so.$version" | grep -q ' embkv_open$' || fail "libembkv.so does not export embkv_open"
# its entry point and the entry points for language bindings (direct.c), nothing else
got=$(nm -D --defined-only "$ext" | awk '{print $3}' | sort | tr '\n' ' ')
[[ $got == "embkv_direct_pull embkv_direct_push sqlite3_embkv_init " ]] ||
    fail "the extension exports other symbols than its entry points:\n$got"
mk uninstall PREFIX="$prefix"

step "make install PREFIX='$tmp/with space'"
spaced="$tmp/with space"
mk install PREFIX="$spaced" LDCONFIG=
flags=$(PKG_CONFIG_PATH="$spaced/lib/pkgconfig" pkg-config --cflags --libs embkv)
[[ $flags == *'with\ space/include'* ]] || fail "pkg-config did not escape the space: $flags"
# (pkg-config's escapes are read by the shell: through eval)
eval "cc \"\${cflags[@]}\" -o \"\$tmp/app-spaced\" \"\$tmp/app.c\" $flags -Wl,-rpath,\"\$spaced/lib\""
(cd "$tmp" && ./app-spaced "$tmp/store-spaced") || fail "the program built against PREFIX='$spaced' failed"
mk uninstall PREFIX="$spaced"
[[ -z $(find "$spaced" \( -type f -o -type l \)) ]] || fail "make uninstall PREFIX='$spaced' left files"
if msg=$(mk install PREFIX=relative-prefix LDCONFIG= 2>&1); then
    fail "make install PREFIX=relative-prefix was accepted"
fi
[[ $msg == *"PREFIX must be an absolute path, not 'relative-prefix'"* ]] ||
    fail "make install PREFIX=relative-prefix said\n$msg"
[[ ! -e $root/relative-prefix ]] || fail "make install PREFIX=relative-prefix made $root/relative-prefix"
# characters the shell or pkg-config would break on: refused, nothing made
for odd in "$tmp/q\"uote" "$tmp/h#ash" "$tmp/back\\slash"; do
    before=$(ls -A "$tmp")
    if msg=$(mk install PREFIX="$odd" LDCONFIG= 2>&1); then
        fail "make install PREFIX='$odd' was accepted"
    fi
    [[ $msg == *"may not hold a quote, a backslash, # or \`"* ]] || fail "make install PREFIX='$odd' said\n$msg"
    [[ $(ls -A "$tmp") == "$before" ]] || fail "make install PREFIX='$odd' made directories"
done

# ---- 3. pip install into a fresh virtual environment -----------------------
venv=$tmp/venv
step "$PYTHON -m venv --system-site-packages; pip install --no-index $root"
"$PYTHON" -m venv --system-site-packages "$venv"
(cd "$root" && "$venv/bin/python" -m pip install --quiet --no-index --no-cache-dir --disable-pip-version-check .) ||
    fail "pip install of $root into a fresh virtual environment failed"
mkdir "$tmp/elsewhere"
step "python -c 'import embkv, embkv.torch; ...' in another directory"
cd "$tmp/elsewhere"
env -u PYTHONPATH -u EMBKV_EXT -u PYTHONSAFEPATH "$venv/bin/python" -c '
import os, sys, tempfile
import numpy as np
import torch
import embkv
import embkv.torch as ekt

root, version = sys.argv[1], sys.argv[2]
pkg = os.path.dirname(os.path.realpath(embkv.__file__))
assert not pkg.startswith(os.path.realpath(root) + os.sep), "embkv came from the source tree: " + pkg
assert embkv.find_extension() == os.path.join(os.path.dirname(embkv.__file__), "embkv"), embkv.find_extension()
assert embkv.__version__ == version, (embkv.__version__, version)
with tempfile.TemporaryDirectory(dir=".") as d:
    conn = embkv.connect(os.path.join(d, "model.db"))
    assert conn.execute("SELECT embkv_version()").fetchone()[0] == embkv.__version__
    emb = ekt.Embedding(conn, "emb", dim=4, optimizer="sgd", lr=0.2, init="zeros")
    ids = torch.tensor([1, 2, 3, 2])
    target = torch.tensor([[1.0, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 1, 0, 0]])
    losses = []
    for _ in range(8):
        loss = ((emb(ids) - target) ** 2).sum()
        loss.backward()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    vec = np.frombuffer(conn.execute("SELECT vec FROM emb WHERE id = 2").fetchone()[0], np.float32)
    assert vec[1] > 0.5 and np.all(vec[[0, 2, 3]] == 0), vec
    conn.close()
print("embkv %s from %s: loss %.3f -> %.3f" % (embkv.__version__, pkg, losses[0], losses[-1]))
' "$root" "$version" || fail "the installed package did not work from another directory"
cd "$root"
echo "install.sh: ok"
