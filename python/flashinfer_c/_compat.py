"""`import flashinfer` answered by flashinfer_c, on request.

    import flashinfer_c
    flashinfer_c.install_as_flashinfer()
    import flashinfer                     # flashinfer_c
    from flashinfer.decode import BatchDecodeWithPagedKVCacheWrapper

or, for a program that cannot be changed (an engine), the `flashinfer`
shim package beside flashinfer_c (python/flashinfer/) with
FLASHINFER_C_AS_FLASHINFER=1 in the environment. Either way `flashinfer`
and `flashinfer.<sub>` are flashinfer_c's module objects themselves (not
copies): flashinfer.decode is flashinfer_c.decode. The submodules engines
import that flashinfer_c has no module of its own for (mla, xqa,
cudnn, gemm, ...) are modules whose listed names raise NotImplementedError
saying what to use instead (_foreign.py); any other flashinfer.<sub> is
mapped onto flashinfer_c.<sub>, or raises ModuleNotFoundError.
"""

import importlib
import importlib.abc
import importlib.util
import sys

from . import _foreign

# flashinfer_c modules engines import under FlashInfer's names.
SUBMODULES = (
    "activation",
    "attention",
    "cascade",
    "decode",
    "norm",
    "page",
    "pod",
    "prefill",
    "quantization",
    "rope",
    "sampling",
    "sparse",
    "topk",
    "utils",
    "variant",
)

_PACKAGE = "flashinfer_c"


def _target(fullname):
    """The module object for flashinfer[.rest], importing it if needed."""
    if fullname == "flashinfer":
        return importlib.import_module(_PACKAGE)
    rest = fullname[len("flashinfer.") :]
    head = rest.split(".", 1)[0]
    if head.startswith("_"):
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: flashinfer_c's private modules are not "
            "FlashInfer's (install_as_flashinfer maps FlashInfer's public names only)",
            name=fullname,
        )
    if rest in _foreign.FOREIGN_ONLY:
        module = _foreign.foreign_module(rest)
        setattr(sys.modules[_PACKAGE], rest, module)
        return module
    try:
        return importlib.import_module(f"{_PACKAGE}.{rest}")
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"No module named {fullname!r}: flashinfer_c (installed as flashinfer) has no "
            f"{rest}; docs/PYTHON_COMPAT.md lists what it provides",
            name=fullname,
        ) from None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, module):
        self.module = module

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        pass  # already executed under its flashinfer_c name


class _Finder(importlib.abc.MetaPathFinder):
    """Answers `flashinfer` and `flashinfer.*` with flashinfer_c's modules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "flashinfer" and not fullname.startswith("flashinfer."):
            return None
        module = _target(fullname)
        spec = importlib.util.spec_from_loader(
            fullname, _AliasLoader(module), is_package=hasattr(module, "__path__")
        )
        return spec


_finder = _Finder()


def install_as_flashinfer():
    """Make `import flashinfer` (and every flashinfer.<submodule> an engine
    imports) resolve to flashinfer_c. Idempotent; returns the package.

    Replaces a FlashInfer already imported in this process (its modules are
    dropped from sys.modules; objects made from it keep working as they were).
    """
    package = importlib.import_module(_PACKAGE)
    current = sys.modules.get("flashinfer")
    if current is not package:
        for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
            del sys.modules[name]
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)
    sys.modules["flashinfer"] = package
    for name in SUBMODULES + _foreign.FOREIGN_ONLY:
        sys.modules[f"flashinfer.{name}"] = _target(f"flashinfer.{name}")
    return package


def uninstall_as_flashinfer():
    """Undo install_as_flashinfer (for tests): `import flashinfer` finds whatever
    the path holds again."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in [n for n in sys.modules if n == "flashinfer" or n.startswith("flashinfer.")]:
        del sys.modules[name]


def installed_as_flashinfer():
    return sys.modules.get("flashinfer") is sys.modules.get(_PACKAGE)
