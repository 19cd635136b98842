#!/usr/bin/env python3
"""The documentation matches the code, and the README's examples run.

Checks, each failure naming what is at fault:
  1. every SQL function and module the extension registers (those of
     pragma_function_list / pragma_module_list on a connection with
     build/embkv.so loaded, minus those of a connection without it) is
     documented in docs/sql.md: a heading or a table row holding `name(`
     (a module may also be named there as `name` in backquotes);
  2. every table option, as the extension lists them in its error for an
     unknown option, has a row of docs/sql.md's options table (| `name` |);
  3. every fenced code block of README.md runs: ```sql blocks through the
     sqlite3 shell in a temporary directory (build/ linked there, so that
     `.load ./build/embkv` works; the extension loaded first when the
     block does not load it), ```python blocks with this Python in a
     temporary directory (the embkv package installed in build/venv, whose
     Python runs this check, as a user has it), and in ```sh blocks every `make X` names a target that
     exists (`make -n X` succeeds; nothing is run) and every other command
     is found;
  4. README.md has at most 200 lines;
  5. every relative link of README.md, sql/README.md and docs/*.md names a
     file that exists, and every #anchor a heading of the file it names
     (GitHub's anchors).  docs/install.md is written apart: while it is
     missing, links to it are noted, not failed.
  6. the pages of docs/ that others link to exist;
  7. every C example of docs/c-api.md (an indented block that calls
     embkv_) compiles against ext/embkv.h with the types it passes checked
     (-Werror=incompatible-pointer-types and the like): one with a main
     as it is, another inside a function given the store `s`.

Run by tests/run.sh (group docs) through tests/python_run.sh, which picks a
Python whose sqlite3 module can load extensions, or by hand:
    /usr/bin/python3 tests/docs_check.py
"""
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXT = os.environ.get("EMBKV_EXT") or os.path.join(ROOT, "build", "embkv")
if EXT.endswith(".so"):
    EXT = EXT[:-3]
README = os.path.join(ROOT, "README.md")
SQL_DOC = os.path.join(ROOT, "docs", "sql.md")
PAGES = ["README.md", "sql.md", "training.md", "tiers.md", "operations.md", "design.md", "benchmarks.md",
         "testing.md", "c-api.md", "limitations.md"]
WRITTEN_APART = {os.path.join(ROOT, "docs", "install.md")}
MAX_README_LINES = 200

failures = []
notes = []


def fail(msg):
    failures.append(msg)
    print("FAIL  " + msg, flush=True)


def ok(msg):
    print("ok    " + msg, flush=True)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def rel(path):
    return os.path.relpath(path, ROOT)


# ---------------------------------------------------------------- markdown

FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$")


def fenced_blocks(text):
    """(language, first line number, code) of each fenced block."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i + 1
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        blocks.append((lang, start, "\n".join(lines[i + 1:j]) + "\n"))
        i = j + 1
    return blocks


def prose_lines(text):
    """(line number, line) outside fenced and indented code blocks."""
    out, in_fence, fence, prev_blank = [], False, None, True
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if in_fence:
            if line.strip().startswith(fence):
                in_fence = False
            prev_blank = False
            continue
        if m:
            in_fence, fence = True, m.group(2)
            continue
        if prev_blank and line.startswith("    ") and not re.match(r"\s*([-*]|\d+\.)\s", line):
            # an indented code block (a list item's continuation is indented too,
            # but follows a non-blank line or starts with a marker)
            continue
        prev_blank = not line.strip()
        out.append((n, line))
    return out


def slug(heading, seen):
    """GitHub's anchor for a heading's text."""
    s = re.sub(r"`", "", heading.strip()).lower()
    s = re.sub(r"[^\w\- ]", "", s)
    s = s.replace(" ", "-")
    base, k = s, seen.get(s, 0)
    seen[base] = k + 1
    return base if k == 0 else "%s-%d" % (base, k)


def anchors(path):
    seen, out = {}, set()
    for _, line in prose_lines(read(path)):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            out.add(slug(m.group(1), seen))
    return out


# ------------------------------------------------------- 1, 2: the registry

def registry():
    """Functions and modules the extension adds, and its option list."""
    plain = sqlite3.connect(":memory:")
    base_f = {r[0] for r in plain.execute("SELECT name FROM pragma_function_list")}
    base_m = {r[0] for r in plain.execute("SELECT name FROM pragma_module_list")}
    plain.close()
    conn = sqlite3.connect(":memory:")
    conn.enable_load_extension(True)
    conn.load_extension(EXT)
    funcs = sorted({r[0] for r in conn.execute("SELECT name FROM pragma_function_list")} - base_f)
    mods = sorted({r[0] for r in conn.execute("SELECT name FROM pragma_module_list")} - base_m)
    try:
        conn.execute("CREATE VIRTUAL TABLE t USING embkv(dim=4, nosuchoption=1)")
        raise SystemExit("docs_check: an unknown option was accepted: cannot list the options")
    except sqlite3.Error as e:
        m = re.search(r"unknown option 'nosuchoption' \(options: ([^)]*)\)", str(e))
        if not m:
            raise SystemExit("docs_check: the error for an unknown option lists no options: %s" % e)
        options = [o.strip() for o in m.group(1).split(",") if o.strip()]
    conn.close()
    return funcs, mods, options


def check_registry():
    n0 = len(failures)
    funcs, mods, options = registry()
    doc = read(SQL_DOC)
    lines = [line for _, line in prose_lines(doc)]
    entries = [line for line in lines if line.lstrip().startswith(("#", "|"))]
    for name in funcs:
        pat = re.compile(r"(?<![\w])%s\(" % re.escape(name))
        if not any(pat.search(line) for line in entries):
            fail("function %s is registered but docs/sql.md does not document it "
                 "(no heading or table row with `%s(`)" % (name, name))
    for name in mods:
        pat = re.compile(r"(?<![\w])%s\(|`%s`" % (re.escape(name), re.escape(name)))
        if not any(pat.search(line) for line in entries):
            fail("module %s is registered but docs/sql.md does not document it "
                 "(no heading or table row with `%s(` or `%s`)" % (name, name, name))
    rows = [line for line in lines if line.lstrip().startswith("|")]
    for name in options:
        pat = re.compile(r"^\s*\|\s*`%s`\s*\|" % re.escape(name))
        if not any(pat.match(line) for line in rows):
            fail("option %s is not in docs/sql.md's options table (no row | `%s` |)" % (name, name))
    if len(failures) == n0:
        ok("registry: %d functions, %d modules, %d options documented in docs/sql.md"
           % (len(funcs), len(mods), len(options)))


# ------------------------------------------------------ 3: README's blocks

def run_sql(code, where):
    with tempfile.TemporaryDirectory(prefix="embkv-docs-") as d:
        os.symlink(os.path.dirname(EXT), os.path.join(d, "build"))
        cmd = ["sqlite3", "-bail"]
        if ".load" not in code:
            cmd += ["-cmd", ".load " + EXT]
        env = dict(os.environ, TMPDIR=d)
        try:
            p = subprocess.run(cmd, input=code, cwd=d, env=env, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            fail("%s: the sqlite3 shell is missing (Debian package sqlite3)" % where)
            return
        except subprocess.TimeoutExpired:
            fail("%s: the sqlite3 shell ran past 120 s" % where)
            return
        if p.returncode != 0 or p.stderr.strip():
            fail("%s: the sqlite3 shell failed (exit %d): %s" % (where, p.returncode, p.stderr.strip()[-1500:]))
        else:
            ok("%s runs in the sqlite3 shell" % where)


def run_python(code, where):
    with tempfile.TemporaryDirectory(prefix="embkv-docs-") as d:
        script = os.path.join(d, "readme_block.py")
        with open(script, "w") as f:
            f.write(code)
        # As a user runs it: the installed package (tests/python_run.sh runs
        # this check with build/venv's Python), from a directory of its own.
        env = dict(os.environ, TMPDIR=d)
        try:
            p = subprocess.run([sys.executable, script], cwd=d, env=env, capture_output=True, text=True,
                               timeout=300)
        except subprocess.TimeoutExpired:
            fail("%s: Python ran past 300 s" % where)
            return
        if p.returncode != 0:
            fail("%s: Python failed (exit %d): %s" % (where, p.returncode, p.stderr.strip()[-1500:]))
        else:
            ok("%s runs in Python" % where)


def make_targets_exist(args, where):
    targets = [a for a in args if not a.startswith("-") and "=" not in a] or [""]
    for t in targets:
        # a make of its own, not the jobserver of a `make test` that runs this
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        p = subprocess.run(["make", "-n", "-C", ROOT] + ([t] if t else []), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, timeout=120, env=env)
        if p.returncode != 0:
            fail("%s: `make %s` names no target of the Makefile: %s" % (where, t, p.stderr.strip()[-500:]))


def check_sh(code, where):
    n0, checked = len(failures), 0
    for line in code.split("\n"):
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if not line:
            continue
        for command in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
            try:
                words = shlex.split(command)
            except ValueError as e:
                fail("%s: cannot parse `%s`: %s" % (where, command, e))
                continue
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words = words[1:]  # VAR=value before the command
            if not words:
                continue
            checked += 1
            if words[0] == "make":
                make_targets_exist(words[1:], where)
            elif shutil.which(words[0]) is None and not os.path.exists(os.path.join(ROOT, words[0])):
                fail("%s: command %s not found" % (where, words[0]))
            elif words[0] in ("bash", "sh", "python3", "/usr/bin/python3") and len(words) > 1 \
                    and not words[1].startswith("-") and not os.path.exists(os.path.join(ROOT, words[1])):
                fail("%s: %s does not exist" % (where, words[1]))
    if len(failures) == n0:
        ok("%s: %d commands found" % (where, checked))


def check_readme():
    text = read(README)
    n = len(text.rstrip("\n").split("\n"))
    if n > MAX_README_LINES:
        fail("README.md has %d lines, more than %d: move the detail to docs/" % (n, MAX_README_LINES))
    else:
        ok("README.md has %d lines (at most %d)" % (n, MAX_README_LINES))
    for lang, start, code in fenced_blocks(text):
        where = "README.md line %d (```%s block)" % (start, lang or "")
        if lang == "sql":
            run_sql(code, where)
        elif lang in ("python", "py"):
            run_python(code, where)
        elif lang in ("sh", "bash", "shell", "console"):
            check_sh(code, where)
        elif lang in ("text", ""):
            continue
        else:
            fail("%s: a block of language %r, which this check does not know how to run" % (where, lang))


# ------------------------------------------------------------- 5: links

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def check_links():
    files = [README, os.path.join(ROOT, "sql", "README.md")]
    files += sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                    if f.endswith(".md"))
    n0, cache, count = len(failures), {}, 0
    for path in files:
        for n, line in prose_lines(read(path)):
            line = re.sub(r"`[^`]*`", "", line)
            for target in LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue  # http:, https:, mailto:
                count += 1
                where = "%s line %d: link %s" % (rel(path), n, target)
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(dest):
                    if dest in WRITTEN_APART:
                        notes.append("%s: %s is written apart and not here yet" % (where, rel(dest)))
                        continue
                    fail("%s: %s does not exist" % (where, rel(dest)))
                    continue
                if anchor and dest.endswith(".md"):
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        fail("%s: %s has no heading with the anchor #%s" % (where, rel(dest), anchor))
    if len(failures) == n0:
        ok("links: %d relative links in %d files resolve" % (count, len(files)))


def check_pages():
    for page in PAGES:
        if not os.path.exists(os.path.join(ROOT, "docs", page)):
            fail("docs/%s is missing (other pages link to it)" % page)


# ------------------------------------------------- 7: c-api.md's C examples

C_STRICT = ["-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror=incompatible-pointer-types",
            "-Werror=int-conversion", "-Werror=implicit-function-declaration", "-Werror=pointer-sign",
            "-Werror=format"]


def indented_blocks(text):
    """(line, code) of each block of lines indented by 4 spaces after a blank line."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            start, body = i + 1, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            yield start, "\n".join(body).strip() + "\n"
        else:
            i += 1


def check_c_examples():
    page = os.path.join(ROOT, "docs", "c-api.md")
    cc = shutil.which(os.environ.get("CC", "cc"))
    if not cc:
        notes.append("no C compiler: docs/c-api.md's C examples not compiled")
        return
    for line, code in indented_blocks(read(page)):
        if "embkv_" not in code or ";" not in code or code.startswith("cc "):
            continue
        where = "docs/c-api.md line %d (a C example)" % line
        if "int main(" not in code:
            code = ("#include <stdio.h>\n#include <stdint.h>\n#include \"embkv.h\"\n"
                    "void example(embkv_store *s);\nvoid example(embkv_store *s)\n{\n" + code + "}\n")
        with tempfile.TemporaryDirectory() as d:
            src = os.path.join(d, "example.c")
            with open(src, "w") as f:
                f.write(code)
            r = subprocess.run([cc] + C_STRICT + ["-I" + os.path.join(ROOT, "ext"), src],
                               capture_output=True, text=True)
        if r.returncode != 0:
            fail("%s does not compile against ext/embkv.h: %s" % (where, r.stderr.strip()[:800]))
        else:
            ok(where + " compiles")


def main():
    if not os.path.exists(EXT + ".so"):
        sys.exit("docs_check: %s.so is missing: run make first" % EXT)
    check_pages()
    check_registry()
    check_links()
    check_readme()
    check_c_examples()
    for note in notes:
        print("note  " + note)
    print("%d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
