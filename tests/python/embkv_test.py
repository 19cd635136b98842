"""What the Python tests share: the extension's path (embkv.find_extension()
of the installed package: $EMBKV_EXT when set, e.g. the sanitizer build,
else the copy installed with the package), a connect() that loads it, and a
TestCase with a fresh temporary directory per test.  Importing it checks that
this Python's sqlite3 can load extensions and that numpy and the embkv
package are there, and exits with a message naming what to use otherwise.

The tests run with build/venv/bin/python (tests/python_run.sh), where
`make venv` installed the package with pip as users do: `import embkv` is
the installed package, not pysample/."""
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

if not hasattr(sqlite3.Connection, "enable_load_extension"):  # pragma: no cover
    sys.exit("embkv Python tests: this Python's sqlite3 cannot load extensions; run them with "
             "tests/python_run.sh (build/venv/bin/python, made from Debian's /usr/bin/python3)")
try:
    import embkv
except ImportError:  # pragma: no cover
    sys.exit("embkv Python tests: the embkv package is not installed for %s; run them with tests/python_run.sh "
             "(it installs the package into build/venv: make venv)" % sys.executable)

EXT = embkv.find_extension()


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
