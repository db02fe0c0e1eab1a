"""Shared fixtures: the package under test, array backends, tolerances.

The tests import flashinfer_c from this checkout (python/), which loads
build/libflashinfer.so (`make lib`, or `pip install ./python` builds it).
Set FLASHINFER_C_TEST_INSTALLED=1 to test an installed package instead.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if not os.environ.get("FLASHINFER_C_TEST_INSTALLED"):
    sys.path.insert(0, str(ROOT / "python"))

import flashinfer_c  # noqa: E402

# Small thread counts keep the suite fast and exercise split work all the same.
os.environ.setdefault("FLASHINFER_C_NUM_THREADS", "2")

TOLERANCE = {  # (atol, rtol) against the fp64 reference
    torch.float32: (2e-5, 2e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 3e-2),
}


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
    torch.manual_seed(1234)


def assert_close(got, ref, dtype, what="output"):
    """got (any float tensor/array) against an fp64 reference, at dtype's tolerance."""
    got = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got)
    got = got.double()
    assert not torch.isnan(got).any(), f"{what}: NaN"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(
        got, ref.double(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}"
    )


def assert_lse_close(got, ref, dtype):
    """LSE: -inf rows must match exactly, the rest at dtype's tolerance (scaled)."""
    got = torch.as_tensor(np.asarray(got) if not isinstance(got, torch.Tensor) else got).double()
    ref = ref.double()
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(got), inf), "lse: -inf rows differ"
    atol, rtol = TOLERANCE[dtype]
    torch.testing.assert_close(got[~inf], ref[~inf], atol=4 * atol, rtol=4 * rtol)
