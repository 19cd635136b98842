"""What the Python tests share: the extension's path ($EMBKV_EXT, else
build/embkv), a connect() that loads it, and a TestCase with a fresh
temporary directory per test.  Importing it checks that this Python's sqlite3
can load extensions and that numpy is there, and exits with a message naming
what to use otherwise."""
import os
import shutil
import sqlite3
import sys
import tempfile
import unittest

try:
    import numpy  # noqa: F401  (the tests use it; fail here, clearly)
except ImportError:  # pragma: no cover
    sys.exit("embkv Python tests: numpy is required (Debian package python3-numpy)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXT = os.path.abspath(os.environ.get("EMBKV_EXT") or os.path.join(REPO, "build", "embkv"))

if not hasattr(sqlite3.Connection, "enable_load_extension"):  # pragma: no cover
    sys.exit("embkv Python tests: this Python's sqlite3 cannot load extensions; use /usr/bin/python3")


def connect(path, **kw):
    """A connection with embkv loaded; autocommit (BEGIN/COMMIT by hand)."""
    kw.setdefault("isolation_level", None)
    kw.setdefault("timeout", 30)
    conn = sqlite3.connect(path, **kw)
    conn.enable_load_extension(True)
    conn.load_extension(EXT)
    conn.enable_load_extension(False)
    return conn


class TempDirTest(unittest.TestCase):
    """self.dir: a fresh directory, removed afterwards; self.db in it."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="embkv-py-")
        self.db = os.path.join(self.dir, "test.db")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)
