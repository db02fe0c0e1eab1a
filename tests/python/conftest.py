"""Shared fixtures: the package under test, array backends, tolerances.

The tests import flashinfer_c from this checkout (python/), which loads
build/libflashinfer.so (`make lib`, or `pip install ./python` builds it).
Set FLASHINFER_C_TEST_INSTALLED=1 to test an installed package instead.

GPU tests (test_gpu_*.py) carry the `gpu` marker and are skipped, at
collection, unless torch sees a GPU and libflashinfer's CUDA backend can run;
tests/python/run_device.sh runs them on the GPU machine (`pytest -m gpu`).
FLASHINFER_C_GPU_TESTS_ON_CPU=1 runs them on the CPU backend instead (their
CUDA-graph parts skipped), to check the tests themselves without a GPU.
"""

import os
import sys
from pathlib import Path

import re

import numpy as np
import pytest

try:
    import torch
except ImportError:  # numpy-only machine: the torch-based test modules are not collected
    torch = None

ROOT = Path(__file__).resolve().parents[2]
if not os.environ.get("FLASHINFER_C_TEST_INSTALLED"):
    sys.path.insert(0, str(ROOT / "python"))

import flashinfer_c  # noqa: E402

# Small thread counts keep the suite fast and exercise split work all the same.
os.environ.setdefault("FLASHINFER_C_NUM_THREADS", "2")


HAVE_TORCH = torch is not None


def _needs_torch(path):
    text = Path(path).read_text(errors="replace")
    return re.search(r"^(import torch|from torch)", text, re.M) is not None


# Without torch, the modules that import it are left out (the numpy-only
# ones, e.g. test_engines.py, still run); run_device.sh runs them all.
collect_ignore = (
    []
    if HAVE_TORCH
    else [p.name for p in Path(__file__).parent.glob("test_*.py") if _needs_torch(p)]
)


def pytest_report_header(config):
    if not HAVE_TORCH:
        return "torch is not installed: only the numpy-only test modules run"
    return None


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA GPU and libflashinfer's CUDA backend (run_device.sh)"
    )


# --------------------------------------------------------------------- GPU

GPU_ON_CPU = bool(os.environ.get("FLASHINFER_C_GPU_TESTS_ON_CPU"))
DEVICE = "cpu" if GPU_ON_CPU else "cuda"  # where the GPU tests put their tensors


def _why_no_gpu():
    if torch is None:
        return "torch is not installed"
    if GPU_ON_CPU:
        return None
    if not torch.cuda.is_available():
        return "no GPU: torch.cuda.is_available() is False"
    if not flashinfer_c.cuda_available():
        return f"libflashinfer ({flashinfer_c.library_path}) found no CUDA driver or GPU"
    return None


NO_GPU = _why_no_gpu()
# pytestmark of every GPU test module
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=str(NO_GPU))]
# for the tests (or parts) that need real CUDA graphs, not the CPU stand-in
needs_cuda = pytest.mark.skipif(
    DEVICE != "cuda", reason="CUDA graphs and streams need a GPU (FLASHINFER_C_GPU_TESTS_ON_CPU)"
)


def on_gpu(t):
    """A copy of a host tensor on the GPU tests' device."""
    return None if t is None else t.to(DEVICE, copy=True)


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


TOLERANCE = (
    {  # (atol, rtol) against the fp64 reference
        torch.float32: (2e-5, 2e-5),
        torch.float16: (4e-3, 4e-3),
        torch.bfloat16: (3e-2, 3e-2),
    }
    if torch is not None
    else {}
)


class Backend:
    """Hands the library torch CPU tensors or numpy arrays, and reads them back."""

    def __init__(self, name):
        self.name = name

    def __call__(self, t):
        if t is None or self.name == "torch":
            return t
        if t.dtype == torch.bfloat16:
            pytest.skip("numpy has no bfloat16")
        return t.numpy()

    def torch(self, x):
        return x if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))

    def __repr__(self):
        return self.name


@pytest.fixture(params=["torch", "numpy"])
def backend(request):
    return Backend(request.param)


@pytest.fixture
def fi():
    return flashinfer_c


@pytest.fixture(autouse=True)
def _seed():
    if torch is not None:
        torch.manual_seed(1234)


def assert_close(got, ref, dtype, what="output"):
    """got (any float tensor/array) against an fp64 reference, at dtype's tolerance."""
    got = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got)
    got = got.detach().cpu().double()
    assert not torch.isnan(got).any(), f"{what}: NaN"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(
        got, ref.double(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}"
    )


def assert_lse_close(got, ref, dtype):
    """LSE: -inf rows must match exactly, the rest at dtype's tolerance (scaled)."""
    got = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got)
    got = got.detach().cpu().double()
    ref = ref.double()
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(got), inf), "lse: -inf rows differ"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got[~inf], ref[~inf], atol=4 * atol, rtol=4 * rtol)


class Graph:
    """`fn` captured once into a CUDA graph (after a warm-up call on a side
    stream, as torch.cuda.graph wants), replayed by replay() on the current
    stream. On the CPU stand-in (FLASHINFER_C_GPU_TESTS_ON_CPU) replay()
    calls fn again. fn must write into fixed tensors (out=...)."""

    def __init__(self, fn):
        self.fn = fn
        self.graph = None
        if DEVICE != "cuda":
            fn()
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            fn()

    def replay(self):
        if self.graph is None:
            self.fn()
        else:
            self.graph.replay()
