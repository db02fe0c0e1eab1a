"""A stand-in for pytest, for a machine that has no pytest: runs the GPU test
modules (test_gpu_*.py) with the few pytest features they use.

    python3 tests/python/mini_runner.py [test files...]

Supported: module `pytestmark`, pytest.mark.skipif / parametrize (stacked:
the cartesian product) / any other mark (ignored), pytest.raises(match=),
pytest.skip, pytest.fixture (the `fi` fixture is the package; the seed
fixture is applied before every test). Prints one line per failure or skip
and a pytest-like last line; exits 1 when a test failed.
"""

import contextlib
import glob
import importlib
import inspect
import itertools
import os
import re
import sys
import time
import traceback
import types

HERE = os.path.dirname(os.path.abspath(__file__))


class Skipped(Exception):
    pass


class MarkDecorator:
    def __init__(self, name, args=(), kwargs=None):
        self.name, self.args, self.kwargs = name, args, kwargs or {}

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs and not isinstance(args[0], bool):
            func = args[0]
            func.pytestmark = getattr(func, "pytestmark", []) + [self]
            return func
        return MarkDecorator(self.name, args, kwargs)


class MarkGenerator:
    def __getattr__(self, name):
        return MarkDecorator(name)


def fixture(func=None, **kwargs):
    return func if func is not None else (lambda f: f)


def skip(reason=""):
    raise Skipped(reason)


@contextlib.contextmanager
def raises(expected, match=None):
    try:
        yield
    except expected as e:
        if match is not None and not re.search(match, str(e)):
            raise AssertionError(f"{type(e).__name__}({e!s}) does not match {match!r}") from e
        return
    raise AssertionError(f"did not raise {expected}")


def install_shim():
    shim = types.ModuleType("pytest")
    shim.mark = MarkGenerator()
    shim.fixture, shim.skip, shim.raises = fixture, skip, raises
    sys.modules["pytest"] = shim


def marks_of(obj):
    marks = getattr(obj, "pytestmark", [])
    return marks if isinstance(marks, list) else [marks]


def skip_reason(marks):
    for m in marks:
        if m.name == "skipif" and m.args and m.args[0]:
            return m.kwargs.get("reason", "skipif")
    return None


def cases(func):
    """(id, kwargs) for every parametrization of a test function."""
    axes = []
    for m in reversed(marks_of(func)):  # the decorator nearest the function first
        if m.name != "parametrize":
            continue
        names = [n.strip() for n in m.args[0].split(",")]
        values = [v if len(names) > 1 else (v,) for v in m.args[1]]
        axes.append([dict(zip(names, v)) for v in values])
    for combo in itertools.product(*axes):
        kwargs = {}
        for part in combo:
            kwargs.update(part)
        yield "-".join(str(v) for v in kwargs.values()), kwargs


def main(paths):
    sys.path.insert(0, HERE)
    install_shim()
    import torch

    import conftest

    counts = {"passed": 0, "failed": 0, "skipped": 0}
    start = time.time()
    for path in paths:
        module = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
        module_marks = marks_of(module)
        for name, func in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("test_") or func.__module__ != module.__name__:
                continue
            for case_id, kwargs in cases(func):
                test_id = f"{os.path.basename(path)}::{name}[{case_id}]"
                reason = skip_reason(module_marks + marks_of(func))
                try:
                    if reason is not None:
                        raise Skipped(reason)
                    torch.manual_seed(1234)
                    if "fi" in inspect.signature(func).parameters:
                        kwargs = dict(kwargs, fi=conftest.flashinfer_c)
                    func(**kwargs)
                    counts["passed"] += 1
                except Skipped as e:
                    counts["skipped"] += 1
                    print(f"SKIPPED {test_id}: {e}")
                except Exception:
                    counts["failed"] += 1
                    print(f"FAILED {test_id}\n{traceback.format_exc(limit=-3)}")
    line = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    print(f"{line or 'no tests'} in {time.time() - start:.2f}s (mini_runner)")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    files = sys.argv[1:] or sorted(glob.glob(os.path.join(HERE, "test_gpu_*.py")))
    sys.exit(main(files))
