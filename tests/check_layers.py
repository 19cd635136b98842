#!/usr/bin/env python3
"""check_layers.py OBJDIR: calls and includes go down the layers.

The layer order of each wing is written in one place, a LAYERS block in
a comment at the top of its bottom header (ext/engine/base.h,
ext/sqlite/binding.h): one line per layer, bottom first, headers and
files in order ('|' is only for the eye).  A file may use what files of
lower lines define and what files listed before it on its own line
define; a file may include the headers of its own line and of lower
lines, a header those of lower lines and those before it on its line.

What is checked, for each wing:
  - every .c and .h of the wing's directory is in the list (a new file
    must be placed);
  - every undefined symbol of OBJDIR/<wing>/<file>.o (nm) that another of
    the wing's objects defines is defined by a file ranked below it;
  - every #include "..." of the wing's files names a header of the wing
    ranked at or below the includer (or a public header of ext/).

First a self-test: each wing's order reversed must give faults of both
kinds.  Exit 0 when all holds; else each fault on a line of its own, naming the
two files, the symbol or header, and their layers, then exit 1.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINGS = [("engine", "ext/engine", "base.h"), ("sqlite", "ext/sqlite", "binding.h")]
PUBLIC = {"embkv.h", "embkv_debug.h"}  # ext/: the engine's API and its test hooks
# The extension idiom: ext.c defines sqlite3_api (SQLITE_EXTENSION_INIT1)
# and every file of the binding uses it (SQLITE_EXTENSION_INIT3).
SHARED_SYMBOLS = {"sqlite3_api"}


def read_layers(path, reverse=False):
    text = open(path).read()
    m = re.search(r"LAYERS \(bottom to top[^\n]*\n((?:[ \t]*\*[ \t]+\S[^\n]*\n)+)", text)
    if not m:
        sys.exit("check_layers: no LAYERS block in %s" % path)
    rank = {}
    lines = m.group(1).splitlines()
    if reverse:  # (the self-test: the order upside down must fail)
        lines = lines[::-1]
    for line_no, line in enumerate(lines):
        names = [w for w in line.strip().lstrip("*").split() if w != "|"]
        for pos, name in enumerate(names):
            if name in rank:
                sys.exit("check_layers: %s is listed twice in %s" % (name, path))
            rank[name] = (line_no, pos)
    return rank


def nm(obj):
    out = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for ln in out.splitlines():
        p = ln.split()
        if len(p) == 3 and p[1] in "TDBRVWCG":
            defined.add(p[2])
        elif len(p) == 2 and p[0] == "U":
            undefined.add(p[1])
    return defined, undefined


def check_wing(name, src, bottom, objdir, faults, reverse=False):
    rank = read_layers(os.path.join(ROOT, src, bottom), reverse)
    files = sorted(f for f in os.listdir(os.path.join(ROOT, src)) if f.endswith((".c", ".h")))
    for f in files:
        if f not in rank:
            faults.append("%s/%s: not in the LAYERS list of %s/%s: add it to the layer it belongs to"
                          % (src, f, src, bottom))
    def layer(f):
        return "layer %d" % rank[f][0]

    def above(lower, upper):
        return "above it" if rank[upper][0] > rank[lower][0] else "after it in its layer"

    # includes
    for f in files:
        if f not in rank:
            continue
        for inc in re.findall(r'^#include "([^"]+)"', open(os.path.join(ROOT, src, f)).read(), re.M):
            if inc in PUBLIC:
                continue
            if inc not in rank:
                faults.append("%s/%s includes %s, which is not a header of its wing" % (src, f, inc))
                continue
            ok = rank[inc][0] < rank[f][0] or (rank[inc][0] == rank[f][0] and
                                               (f.endswith(".c") or rank[inc][1] < rank[f][1]))
            if not ok:
                faults.append("%s/%s (%s) includes %s (%s), which is %s"
                              % (src, f, layer(f), inc, layer(inc), above(f, inc)))
    # symbols
    defs, needs = {}, {}
    for f in files:
        if not f.endswith(".c") or f not in rank:
            continue
        obj = os.path.join(objdir, name, f[:-2] + ".o")
        if not os.path.exists(obj):
            sys.exit("check_layers: %s is missing: build the objects first (make all)" % obj)
        d, u = nm(obj)
        needs[f] = u
        for sym in d:
            defs[sym] = f
    for f, syms in sorted(needs.items()):
        if f not in rank:
            continue
        for sym in sorted(syms):
            g = defs.get(sym)
            if g is None or g == f or sym in SHARED_SYMBOLS or g not in rank:
                continue
            if rank[g] > rank[f]:
                faults.append("%s/%s (%s) uses %s, defined by %s (%s), which is %s"
                              % (src, f, layer(f), sym, g, layer(g), above(f, g)))


def self_test(objdir):
    """The check must fail on each wing's order turned upside down: a check
    that passes everything would pass the real order too."""
    for name, src, bottom in WINGS:
        faults = []
        check_wing(name, src, bottom, objdir, faults, reverse=True)
        calls = [f for f in faults if " uses " in f]
        incs = [f for f in faults if " includes " in f]
        if not calls or not incs:
            sys.exit("check_layers: self-test: %s's order reversed gives %d call and %d include faults; "
                     "the check sees nothing" % (src, len(calls), len(incs)))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tests/check_layers.py OBJDIR (the objects' ext/ directory, e.g. build/plain/ext)")
    self_test(sys.argv[1])
    faults = []
    for name, src, bottom in WINGS:
        check_wing(name, src, bottom, sys.argv[1], faults)
    for f in faults:
        print(f)
    if faults:
        print("check-layers: %d fault(s); the order is the LAYERS block of ext/engine/base.h and "
              "ext/sqlite/binding.h" % len(faults))
        return 1
    print("check-layers: calls and includes go down the layers (engine and binding)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
