#!/usr/bin/env python3
"""check_layers.py OBJDIR...: calls and includes go down the layers.

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
  - in each OBJDIR given (one per build variant: code compiled only for
    one, under #ifdef, is seen there), every undefined symbol of
    OBJDIR/<wing>/<file>.o (nm) that another of the wing's objects defines
    is defined by a file ranked below it;
  - every #include of the wing's files ("..." or <...>, however spaced)
    that names a header of the wing names one ranked at or below the
    includer; a "..." include must be the wing's or a public header of
    ext/;
and across the wings: the binding uses of the engine only the functions
its public header ext/embkv.h declares (the engine's internals are not
the binding's, even though the extension links the whole library).

First a self-test: each wing's order reversed must give faults of both
kinds.  Exit 0 when all holds; else each fault on a line of its own, naming the
two files, the symbol or header, and their layers, then exit 1.
"""
import os
import re
import functools
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WINGS = [("engine", "ext/engine", "base.h"), ("sqlite", "ext/sqlite", "binding.h")]
PUBLIC = {"embkv.h", "embkv_debug.h"}  # ext/: the engine's API and its test hooks
# Made by the build into build/gen/ (the Makefile's rules): data, no code to rank.
GENERATED = {"gpu_fatbin.h"}
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
    return nm_dir(os.path.dirname(obj))[os.path.basename(obj)]


@functools.lru_cache(maxsize=None)  # (the self-test reads each object again)
def nm_dir(d):
    """{object name: (defined, undefined)} of every .o in d, from one run of nm."""
    # (the objects of the wing's sources only: one left from a removed file
    # is not read)
    src = os.path.join(ROOT, "ext", os.path.basename(d))
    objs = sorted(f for f in os.listdir(d) if f.endswith(".o") and os.path.exists(os.path.join(src, f[:-2] + ".c")))
    if not objs:
        return {}
    out = subprocess.run(["nm", "-A"] + objs, cwd=d, capture_output=True, text=True,
                         check=True).stdout
    syms = {o: (set(), set()) for o in objs}
    for ln in out.splitlines():
        obj, _, rest = ln.partition(":")
        p = rest.split()
        if len(p) == 3 and p[1] in "TDBRVWCG":
            syms[obj][0].add(p[2])
        elif len(p) == 2 and p[0] == "U":
            syms[obj][1].add(p[1])
    return {o: (frozenset(d_), frozenset(u)) for o, (d_, u) in syms.items()}


def includes(text):
    """(quote, header) of each #include of a file: "..." or <...>, with any
    spacing around the '#' (the preprocessor takes them all)."""
    return re.findall(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^">]+)[">]', text, re.M)


def check_wing(name, src, bottom, objdirs, faults, reverse=False):
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
        text = open(os.path.join(ROOT, src, f)).read()
        for quote, inc in includes(text):
            inc = os.path.basename(inc)
            if inc in PUBLIC or inc in GENERATED:
                continue
            if inc not in rank:
                if quote == '"':
                    faults.append("%s/%s includes %s, which is not a header of its wing" % (src, f, inc))
                continue
            ok = rank[inc][0] < rank[f][0] or (rank[inc][0] == rank[f][0] and
                                               (f.endswith(".c") or rank[inc][1] < rank[f][1]))
            if not ok:
                faults.append("%s/%s (%s) includes %s (%s), which is %s"
                              % (src, f, layer(f), inc, layer(inc), above(f, inc)))
    # symbols, in each build variant
    for objdir in objdirs:
        defs, needs = objects(objdir, name, src, [f for f in files if f in rank])
        for f, syms in sorted(needs.items()):
            for sym in sorted(syms):
                g = defs.get(sym)
                if g is None or g == f or sym in SHARED_SYMBOLS:
                    continue
                if rank[g] > rank[f]:
                    fault = ("%s/%s (%s) uses %s, defined by %s (%s), which is %s"
                             % (src, f, layer(f), sym, g, layer(g), above(f, g)))
                    if fault not in faults:
                        faults.append(fault)


def objects(objdir, name, src, files):
    """The symbols each object of a wing defines (name -> file) and needs."""
    defs, needs = {}, {}
    for f in files:
        if not f.endswith(".c"):
            continue
        obj = os.path.join(objdir, name, f[:-2] + ".o")
        if not os.path.exists(obj):
            sys.exit("check_layers: %s is missing: build the objects first (make check-layers does)" % obj)
        d, u = nm(obj)
        needs[f] = u
        for sym in d:
            defs[sym] = f
    return defs, needs


def check_api(objdirs, faults):
    """The binding calls the engine through ext/embkv.h only."""
    api = set(re.findall(r"\b(embkv_\w+)\s*\(", open(os.path.join(ROOT, "ext", "embkv.h")).read()))
    for objdir in objdirs:
        eng_src = os.path.join(ROOT, "ext", "engine")
        eng, _ = objects(objdir, "engine", "ext/engine",
                         sorted(f for f in os.listdir(eng_src) if f.endswith(".c")))
        bind_src = os.path.join(ROOT, "ext", "sqlite")
        _, needs = objects(objdir, "sqlite", "ext/sqlite",
                           sorted(f for f in os.listdir(bind_src) if f.endswith(".c")))
        for fault in api_faults(api, eng, needs):
            if fault not in faults:
                faults.append(fault)


def api_faults(api, eng_defs, needs):
    """The binding's uses (file -> symbols) of engine symbols (symbol ->
    file) that the public API (a set of names) does not declare."""
    return ["ext/sqlite/%s uses %s of ext/engine/%s, which ext/embkv.h does not declare: "
            "the binding goes through the engine's public API" % (f, sym, eng_defs[sym])
            for f, syms in sorted(needs.items()) for sym in sorted(syms)
            if sym in eng_defs and sym not in api]


def self_test(objdirs):
    """The check must fail on each wing's order turned upside down: a check
    that passes everything would pass the real order too.  And the parts
    that read text must see what the compiler sees."""
    want = [('"', "top.h"), ("<", "top.h"), ('"', "top.h"), ("<", "stdio.h")]
    got = includes('#include "top.h"\n#include <top.h>\n  #  include"top.h"\n#include <stdio.h>\n'
                   '/* #include "x.h" */\n')
    if got != want:
        sys.exit("check_layers: self-test: includes() reads %r, not %r" % (got, want))
    if not api_faults({"embkv_open"}, {"embkv_open": "store.c", "tier_close": "tier.c"},
                      {"vtab.c": {"embkv_open", "tier_close", "sqlite3_free"}}):
        sys.exit("check_layers: self-test: a binding call of tier_close is not seen")
    for name, src, bottom in WINGS:
        faults = []
        check_wing(name, src, bottom, objdirs, faults, reverse=True)
        calls = [f for f in faults if " uses " in f]
        incs = [f for f in faults if " includes " in f]
        if not calls or not incs:
            sys.exit("check_layers: self-test: %s's order reversed gives %d call and %d include faults; "
                     "the check sees nothing" % (src, len(calls), len(incs)))


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: tests/check_layers.py OBJDIR... (the objects' ext/ directory of each build variant, "
                 "e.g. build/layers/plain/ext build/layers/tsan/ext, which make check-layers builds)")
    objdirs = sys.argv[1:]
    self_test(objdirs)
    faults = []
    for name, src, bottom in WINGS:
        check_wing(name, src, bottom, objdirs, faults)
    check_api(objdirs, faults)
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
