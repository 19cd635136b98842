"""Builds and installs the embkv Python package (pysample/embkv) with the
SQLite extension inside it (embkv/embkv.so), so that `import embkv` and
`import embkv.torch` work from anywhere, with no environment variable.

    /usr/bin/python3 -m venv --system-site-packages ~/embkv-venv
    ~/embkv-venv/bin/pip install .          # in this directory

The extension is built by the Makefile (`make build/embkv.so`: the compiler
flags live there only) and copied into the package; the version is
EMBKV_VERSION_STRING of ext/embkv.h, written into the package as
embkv/_version.py.  Setuptools and wheel are Debian's (python3-setuptools,
python3-wheel): there is deliberately no pyproject.toml, so pip 23 builds
with them as installed and never downloads a build backend.  With a pip that
insists on an isolated build, add --no-build-isolation.  docs/install.md has
the details.
"""
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(ROOT, "ext", "embkv.h")
EXTENSION = os.path.join(ROOT, "build", "embkv.so")
# setuptools' own scratch files, kept apart from the Makefile's build/.
SCRATCH = os.path.join(ROOT, "build", "python")


def fail(msg):
    sys.stderr.write("embkv setup.py: %s\n" % msg)
    sys.exit(1)


def read_version():
    try:
        with open(HEADER) as f:
            text = f.read()
    except OSError as e:
        fail("cannot read %s (%s): build the package from a complete embkv source tree" % (HEADER, e.strerror))
    m = re.search(r'^#define EMBKV_VERSION_STRING "([^"]+)"', text, re.M)
    if not m:
        fail("%s has no line '#define EMBKV_VERSION_STRING \"X.Y.Z\"'" % HEADER)
    return m.group(1)


VERSION = read_version()


class BuildPy(build_py):
    """The Python files, then the extension built by make and the version."""

    def run(self):
        # Build the package afresh: a file no longer in pysample/embkv must
        # not linger in the scratch copy and end up in the wheel.
        shutil.rmtree(os.path.join(self.build_lib, "embkv"), ignore_errors=True)
        super().run()
        cmd = [os.environ.get("MAKE", "make"), "-C", ROOT]
        if "MAKELEVEL" not in os.environ:  # not under a make that shares its jobs
            cmd.append("-j%d" % (os.cpu_count() or 1))
        cmd.append("build/embkv.so")
        sys.stdout.write("embkv: %s\n" % " ".join(cmd))
        sys.stdout.flush()
        try:
            subprocess.run(cmd, check=True)
        except FileNotFoundError:
            fail("`%s` was not found: the extension is built with make and a C compiler "
                 "(apt-get install make gcc; `make deps` installs the rest)" % cmd[0])
        except subprocess.CalledProcessError as e:
            fail("building the extension failed (`%s` exited with %d, messages above); "
                 "`make deps` in %s installs the Debian packages it needs" % (" ".join(cmd), e.returncode, ROOT))
        pkg = os.path.join(self.build_lib, "embkv")
        self.mkpath(pkg)
        self.copy_file(EXTENSION, os.path.join(pkg, "embkv.so"))
        with open(os.path.join(pkg, "_version.py"), "w") as f:
            f.write('"""Written by setup.py from EMBKV_VERSION_STRING of ext/embkv.h."""\n'
                    '__version__ = "%s"\n' % VERSION)

    def get_outputs(self, include_bytecode=1):
        pkg = os.path.join(self.build_lib, "embkv")
        return super().get_outputs(include_bytecode) + [os.path.join(pkg, "embkv.so"),
                                                        os.path.join(pkg, "_version.py")]


class BinaryDistribution(Distribution):
    """The package holds a compiled library: a platform wheel, installed in
    platlib, never a pure-Python one."""

    def has_ext_modules(self):
        return True


os.makedirs(SCRATCH, exist_ok=True)
setup(
    name="embkv",
    version=VERSION,
    description="Embedding tables for ML training in SQLite: the embkv extension, numpy helpers and embkv.torch",
    packages=["embkv"],
    package_dir={"embkv": "pysample/embkv"},
    install_requires=["numpy"],
    extras_require={"torch": ["torch"]},
    zip_safe=False,
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildPy},
    options={"build": {"build_base": SCRATCH}, "egg_info": {"egg_base": SCRATCH}},
)
