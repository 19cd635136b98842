"""What the Python benchmarks share: the extension of the installed embkv
package (bench/run.sh and the Makefile run them with build/venv's Python,
where `make venv` installs it)."""
import os
import sqlite3
import sys


def connect(db, ext):
    """A connection for a benchmark's threads, with the extension loaded."""
    c = sqlite3.connect(db, isolation_level=None, timeout=60, check_same_thread=False)
    c.enable_load_extension(True)
    c.load_extension(ext)
    c.enable_load_extension(False)
    return c


def default_extension(script):
    """The extension of the installed embkv package ($EMBKV_EXT first);
    exits with advice naming `script` when the package is missing."""
    try:
        import embkv
    except ImportError as e:
        sys.exit("%s: the embkv package cannot be imported (%s): install it (docs/install.md; `make venv` "
                 "puts it in build/venv), or name the extension with --ext" % (os.path.basename(script), e))
    try:
        return embkv.find_extension()
    except embkv.EmbkvError as e:
        sys.exit(str(e))
