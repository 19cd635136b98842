"""Every SQL function and module the extension registers has a test.

Loads build/embkv.so, lists its functions (pragma_function_list, names
embkv_*) and modules (pragma_module_list, names embkv*), and requires each
name to be used in at least one SQL or Python test under tests/: a function
called as `name(`, a module used as `USING name`, `FROM name` (also JOIN, INTO) or `name(`.  The registry test
(tests/sql/registry.*), which names every function by design, and this file
do not count.  Flags are checked by tests/sql/registry.sql.

Also runnable alone: tests/python_run.sh tests/python/test_fn_coverage.py
"""
import glob
import os
import re
import sqlite3
import unittest

import embkv

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXT = embkv.find_extension()
EXCLUDED = {os.path.join(REPO, "tests", "sql", "registry.sql"),
            os.path.join(REPO, "tests", "sql", "registry.expected"),
            os.path.abspath(__file__)}


def registered():
    if not hasattr(sqlite3.Connection, "enable_load_extension"):
        raise unittest.SkipTest("this Python's sqlite3 cannot load extensions; use /usr/bin/python3")
    conn = sqlite3.connect(":memory:")
    try:
        conn.enable_load_extension(True)
        conn.load_extension(EXT)
        conn.enable_load_extension(False)
        fns = sorted({r[0] for r in conn.execute(
            "SELECT name FROM pragma_function_list WHERE name GLOB 'embkv_*'")})
        mods = sorted({r[0] for r in conn.execute(
            "SELECT name FROM pragma_module_list WHERE name GLOB 'embkv*'")})
    finally:
        conn.close()
    return fns, mods


def test_corpus():
    files = sorted(set(glob.glob(os.path.join(REPO, "tests", "**", "*.sql"), recursive=True)
                       + glob.glob(os.path.join(REPO, "tests", "**", "*.py"), recursive=True)))
    text = {}
    for f in files:
        if os.path.abspath(f) in EXCLUDED:
            continue
        with open(f, encoding="utf-8", errors="replace") as fh:
            text[os.path.relpath(f, REPO)] = fh.read()
    return text


class Coverage(unittest.TestCase):
    def test_functions_and_modules_registered(self):
        fns, mods = registered()
        self.assertIn("embkv", mods)
        for f in ("embkv_vec", "embkv_json", "embkv_dims", "embkv_dot", "embkv_cosine",
                  "embkv_l2", "embkv_norm", "embkv_add", "embkv_sub", "embkv_scale",
                  "embkv_sum", "embkv_avg", "embkv_version", "embkv_build",
                  "embkv_stats", "embkv_checkpoint"):
            self.assertIn(f, fns)

    def test_each_has_a_test(self):
        fns, mods = registered()
        corpus = test_corpus()
        self.assertTrue(corpus, "no SQL or Python tests found under tests/")
        missing = []
        for name in fns:
            pat = re.compile(r"\b%s\s*\(" % re.escape(name), re.I)
            if not any(pat.search(t) for t in corpus.values()):
                missing.append(name + "()")
        for name in mods:
            # a module is used by CREATE VIRTUAL TABLE ... USING name, or (an
            # eponymous one) as FROM / JOIN / INTO [schema.]name or name(...)
            n = re.escape(name)
            pat = re.compile(r"\b(USING|FROM|JOIN|INTO)\s+(\w+\.)?%s\b|\b%s\s*\(" % (n, n), re.I)
            if not any(pat.search(t) for t in corpus.values()):
                missing.append("module " + name)
        self.assertEqual(missing, [], "registered but used by no test under tests/: %s" % ", ".join(missing))


if __name__ == "__main__":
    unittest.main()
