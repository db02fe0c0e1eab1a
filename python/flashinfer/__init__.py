"""The `flashinfer` shim of flashinfer_c: lets a program that writes
`import flashinfer` (an engine: vLLM, SGLang) run on flashinfer_c unchanged.

    FLASHINFER_C_AS_FLASHINFER=1 python serve.py ...

With FLASHINFER_C_AS_FLASHINFER=1 (or true/yes/on) in the environment,
importing this package calls flashinfer_c.install_as_flashinfer(): from
then on `flashinfer` and every `flashinfer.<submodule>` are flashinfer_c's
modules (docs/PYTHON_COMPAT.md). Without it, the shim steps aside: it loads
a real FlashInfer found later on sys.path if there is one, and otherwise
raises ImportError saying how to switch. Put the folder holding this shim
(python/ of the source tree) on PYTHONPATH to use it.
"""

import os
import sys
from pathlib import Path


def _wanted():
    value = os.environ.get("FLASHINFER_C_AS_FLASHINFER", "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def _real_flashinfer():
    """A FlashInfer installed elsewhere on sys.path (not this shim), or None."""
    import importlib.machinery

    here = Path(__file__).resolve().parent.parent
    others = [p for p in sys.path if Path(p or ".").resolve() != here]
    return importlib.machinery.PathFinder.find_spec("flashinfer", others)


if _wanted():
    import flashinfer_c

    flashinfer_c.install_as_flashinfer()  # replaces this module in sys.modules
else:
    _spec = _real_flashinfer()
    if _spec is None or _spec.loader is None:
        raise ImportError(
            "this `flashinfer` is flashinfer_c's shim, and FLASHINFER_C_AS_FLASHINFER is not "
            "set: set FLASHINFER_C_AS_FLASHINFER=1 to run FlashInfer programs on flashinfer_c "
            "(or call flashinfer_c.install_as_flashinfer()), or install FlashInfer",
            name="flashinfer",
        )
    import importlib.util

    _module = importlib.util.module_from_spec(_spec)
    sys.modules["flashinfer"] = _module
    _spec.loader.exec_module(_module)
