"""Build hook for `pip install ./python`.

The same command builds the C library: build_py runs `make lib` in the
repository root and ships build/libflashinfer.so inside the package
(flashinfer_c/_lib/), where flashinfer_c looks for it first. Set
FLASHINFER_C_LIB to ship a library built elsewhere instead.
"""

import os
import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def build_library():
    prebuilt = os.environ.get("FLASHINFER_C_LIB")
    if prebuilt:
        return Path(prebuilt)
    if not (ROOT / "Makefile").is_file() or not (ROOT / "include" / "flashinfer.h").is_file():
        raise RuntimeError(
            f"flashinfer-c: no flashinfer.c source tree above {HERE}; build the library and "
            "set FLASHINFER_C_LIB to its path"
        )
    jobs = str(max(1, os.cpu_count() or 1))
    subprocess.run(["make", "-C", str(ROOT), "-j", jobs, "lib"], check=True)
    return ROOT / "build" / "libflashinfer.so"


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = build_library()
        dest = Path(self.build_lib) / "flashinfer_c" / "_lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, dest / "libflashinfer.so")


class BinaryDistribution(Distribution):
    """The wheel holds a shared library: tag it for this platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
