"""The embkv package under test is the installed one (pip, `make venv`), its
version is the release of ext/embkv.h, and find_extension() looks where
docs/install.md says: $EMBKV_EXT, then the extension installed inside the
package, then build/ of a source checkout the package sits in; when none is
there, the error says what to do."""
import importlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import unittest

import embkv

from embkv_test import REPO, TempDirTest, connect

SOURCE = os.path.join(REPO, "pysample", "embkv")


def header_version():
    with open(os.path.join(REPO, "ext", "embkv.h")) as f:
        return re.search(r'^#define EMBKV_VERSION_STRING "([^"]+)"', f.read(), re.M).group(1)


class WithoutEnv:
    """EMBKV_EXT unset (or set to value) for the duration."""

    def __init__(self, value=None):
        self.value = value

    def __enter__(self):
        self.saved = os.environ.pop("EMBKV_EXT", None)
        if self.value is not None:
            os.environ["EMBKV_EXT"] = self.value

    def __exit__(self, *exc):
        os.environ.pop("EMBKV_EXT", None)
        if self.saved is not None:
            os.environ["EMBKV_EXT"] = self.saved


class Installed(TempDirTest):
    def test_the_installed_package_is_imported(self):
        pkg = os.path.realpath(os.path.dirname(embkv.__file__))
        self.assertNotEqual(pkg, os.path.realpath(SOURCE), "the tests must import the installed package")
        self.assertTrue(os.path.isfile(os.path.join(pkg, "embkv.so")), pkg)
        self.assertTrue(os.path.isfile(os.path.join(pkg, "_version.py")), pkg)
        ekt = importlib.import_module("embkv.torch")
        self.assertEqual(os.path.dirname(os.path.realpath(ekt.__file__)), pkg)

    def test_version_is_the_release(self):
        self.assertEqual(embkv.__version__, header_version())
        c = connect(self.db)
        try:
            self.assertEqual(c.execute("SELECT embkv_version()").fetchone()[0], embkv.__version__)
        finally:
            c.close()

    def test_two_copies_in_one_process(self):
        """Two embkv extensions in one process (a file loaded by hand
        beside the package's): the copy that finds the store open in the
        other says so, naming this process, not "another process"."""
        script = (
            "import os, sqlite3, sys, embkv\n"
            "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
            "c.enable_load_extension(True)\n"
            "c.load_extension(sys.argv[2])\n"
            "c.execute(\"CREATE VIRTUAL TABLE t USING embkv(dim=4, init='zeros')\")\n"
            "c.execute(\"SELECT embkv_pull('t', 1)\").fetchone()\n"
            "d = embkv.connect(sys.argv[1], timeout=0.1)\n"
            "try:\n"
            "    embkv.pull(d, 't', [0])\n"
            "except sqlite3.OperationalError as e:\n"
            "    print(os.getpid(), e)\n")
        env = dict(os.environ)
        env.pop("EMBKV_EXT", None)  # (the package's own copy for embkv.connect)
        out = subprocess.run([sys.executable, "-c", script, self.db, os.path.join(REPO, "build", "embkv")], env=env,
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        pid, msg = out.stdout.split(" ", 1)
        self.assertIn("embkv_pull: embkv table t: cannot open its store: store ", msg)
        self.assertIn(" is open in this process (pid %s) through another copy of embkv: two embkv libraries or "
                      "extensions are loaded in it, and neither can use the other's stores: load one copy in a "
                      "process (in Python, open every connection with embkv.connect, which loads the package's)"
                      % pid, msg)

    def test_two_copies_on_one_connection(self):
        """A second extension file loaded on a connection whose table the
        first connected: the second's functions (the last registered) say
        so, not that the table is no embkv table."""
        pkg_so = os.path.join(os.path.dirname(embkv.__file__), "embkv.so")
        c = sqlite3.connect(self.db, isolation_level=None)
        try:
            c.enable_load_extension(True)
            c.load_extension(os.path.join(REPO, "build", "embkv"))
            c.execute("CREATE VIRTUAL TABLE t USING embkv(dim=2, init='zeros')")
            c.execute("SELECT count(*) FROM t").fetchone()
            c.load_extension(pkg_so)
            with self.assertRaises(sqlite3.OperationalError) as cm:
                c.execute("SELECT embkv_pull('t', 1)").fetchone()
            self.assertIn("embkv_pull: t is an embkv table connected through another copy of the embkv extension "
                          "loaded on this connection (two extension files: the functions are the last one's): load "
                          "one copy in a process", str(cm.exception))
            with self.assertRaises(sqlite3.OperationalError) as cm:
                c.execute("SELECT embkv_pull('nosuch', 1)").fetchone()
            self.assertIn("no such table", str(cm.exception))
        finally:
            c.close()

    def test_find_extension_order(self):
        inside = os.path.join(os.path.dirname(embkv.__file__), "embkv")
        with WithoutEnv():
            self.assertEqual(embkv.find_extension(), inside)
        other = os.path.join(self.dir, "other.so")
        shutil.copy(inside + ".so", other)
        for value in (other, other[:-3]):
            with WithoutEnv(value):
                self.assertEqual(embkv.find_extension(), other[:-3])
        missing = os.path.join(self.dir, "nothere")
        with WithoutEnv(missing):
            with self.assertRaises(embkv.EmbkvError) as cm:
                embkv.find_extension()
        self.assertIn("EMBKV_EXT", str(cm.exception))
        self.assertIn(missing + ".so does not exist", str(cm.exception))


def probe(pythonpath, cwd):
    """find_extension() and __version__ of the package found on pythonpath,
    in a fresh interpreter without EMBKV_EXT."""
    env = {k: v for k, v in os.environ.items() if k not in ("EMBKV_EXT", "PYTHONPATH")}
    env["PYTHONPATH"] = pythonpath
    code = ("import embkv\nprint(embkv.__file__)\nprint(embkv.__version__)\n"
            "try:\n    print(embkv.find_extension())\nexcept embkv.EmbkvError as e:\n    print('ERROR', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    if r.returncode:
        raise AssertionError(r.stderr)
    where, version, found = r.stdout.splitlines()
    if where != os.path.join(pythonpath, "embkv", "__init__.py"):
        raise AssertionError("imported %s, not the copy on PYTHONPATH %s" % (where, pythonpath))
    return version, found


class SourceCopies(TempDirTest):
    """The package's source files (no extension, no _version.py), placed in
    a fake source checkout and outside of any."""

    def copy_source(self, dst):
        os.makedirs(dst)
        for f in os.listdir(SOURCE):
            if f.endswith(".py"):
                shutil.copy(os.path.join(SOURCE, f), dst)

    def test_in_a_source_checkout(self):
        repo = os.path.join(self.dir, "repo")
        self.copy_source(os.path.join(repo, "pysample", "embkv"))
        os.makedirs(os.path.join(repo, "ext"))
        with open(os.path.join(repo, "ext", "embkv.h"), "w") as f:
            f.write('#define EMBKV_VERSION_STRING "9.8.7"\n')
        open(os.path.join(repo, "Makefile"), "w").close()
        version, found = probe(os.path.join(repo, "pysample"), self.dir)
        self.assertEqual(version, "9.8.7")
        self.assertTrue(found.startswith("ERROR embkv: the SQLite extension was not found"), found)
        self.assertIn("run `make` in %s" % repo, found)
        os.makedirs(os.path.join(repo, "build"))
        shutil.copy(embkv.find_extension() + ".so", os.path.join(repo, "build", "embkv.so"))
        self.assertEqual(probe(os.path.join(repo, "pysample"), self.dir)[1], os.path.join(repo, "build", "embkv"))

    def test_outside_a_checkout_without_the_extension(self):
        self.copy_source(os.path.join(self.dir, "site", "embkv"))
        version, found = probe(os.path.join(self.dir, "site"), self.dir)
        self.assertEqual(version, "unknown")
        self.assertTrue(found.startswith("ERROR embkv: the SQLite extension was not found"), found)
        self.assertIn("reinstall the package", found)
        self.assertIn("EMBKV_EXT", found)


if __name__ == "__main__":
    unittest.main()
