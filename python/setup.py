"""Build hook for `pip install ./python` and `python -m build python`.

The wheel carries the C library prebuilt: build_py runs `make lib` in the
flashinfer.c source tree and ships its libflashinfer.so inside the package
(flashinfer_c/_lib/), where flashinfer_c looks for it first, so installing
the wheel needs no compiler. The source tree is the repository this folder
sits in, or, building from an sdist, the copy of the C sources the sdist
carries (csrc/: Makefile, include/, src/, kernels/). FLASHINFER_C_LIB=path
ships a library built elsewhere instead.

The wheel is tagged py3-none-<platform>: the package is Python alone
(ctypes), so any Python 3 takes it, but the library is machine code for
this platform (linux_x86_64, ...). A wheel built in a manylinux container
becomes manylinux-tagged by `auditwheel repair` (python/README.md).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

try:  # setuptools >= 70.1 has bdist_wheel itself
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
# What `make lib` reads; an sdist carries a copy of these in csrc/.
C_SOURCES = ["Makefile", "flashinfer.pc.in", "include", "src", "kernels"]


def source_tree():
    for root in (HERE / "csrc", HERE.parent):
        if (root / "Makefile").is_file() and (root / "include" / "flashinfer.h").is_file():
            return root
    return None


def log(message):
    # pip shows a build backend's output with -v
    print(f"flashinfer-c: {message}", file=sys.stderr, flush=True)


def build_library():
    prebuilt = os.environ.get("FLASHINFER_C_LIB")
    if prebuilt:
        log(f"shipping FLASHINFER_C_LIB={prebuilt}")
        return Path(prebuilt)
    root = source_tree()
    if root is None:
        raise RuntimeError(
            f"flashinfer-c: no flashinfer.c source tree at {HERE}/csrc or above {HERE}; "
            "build the library and set FLASHINFER_C_LIB to its path"
        )
    command = ["make", "-C", str(root), "-j", str(max(1, os.cpu_count() or 1)), "lib"]
    # A build folder made by `make aot` stays one: plain `make lib` would
    # rebuild its table of ahead-of-time kernels empty.
    flag = root / "build" / "gen" / "aot.flag"
    if flag.is_file() and flag.read_text().strip() == "1":
        command.append("AOT=1")
    log("building the C library: " + " ".join(command))
    subprocess.run(command, check=True)
    return root / "build" / "libflashinfer.so"


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        library = build_library()
        dest = Path(self.build_lib) / "flashinfer_c" / "_lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(library, dest / "libflashinfer.so")
        # debug info is three quarters of the file; the code is the same
        strip = shutil.which("strip")
        if strip:
            subprocess.run([strip, "--strip-debug", str(dest / "libflashinfer.so")], check=False)
        size = (dest / "libflashinfer.so").stat().st_size
        log(f"shipping {library} as flashinfer_c/_lib/libflashinfer.so ({size / 1e6:.1f} MB)")


class SdistWithSources(sdist):
    """The sdist carries the C sources (csrc/), so a wheel builds from it."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        root = source_tree()
        if root is None:
            raise RuntimeError("flashinfer-c: an sdist needs the flashinfer.c source tree")
        for name in C_SOURCES:
            src, dst = root / name, Path(base_dir) / "csrc" / name
            if src.is_dir():
                shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.o"))
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


class PlatformWheel(bdist_wheel):
    """py3-none-<platform>: any Python 3 (ctypes), this platform's library."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


class BinaryDistribution(Distribution):
    """The package holds a shared library: install it as platform code."""

    def has_ext_modules(self):
        return True


setup(
    cmdclass={"build_py": BuildPyWithLibrary, "sdist": SdistWithSources,
              "bdist_wheel": PlatformWheel},
    distclass=BinaryDistribution,
)
