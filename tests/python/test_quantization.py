"""packbits and segment_packbits follow numpy.packbits."""

import numpy as np
import pytest
import torch


@pytest.mark.parametrize("bitorder", ["big", "little"])
@pytest.mark.parametrize("n", [0, 1, 8, 13, 100])
def test_packbits(fi, backend, bitorder, n):
    x = torch.rand(n) > 0.5
    got = fi.packbits(backend(x), bitorder=bitorder)
    assert np.array_equal(np.asarray(backend.torch(got)), np.packbits(x.numpy(), bitorder=bitorder))
    assert backend.torch(got).dtype == torch.uint8


def test_packbits_example(fi):
    x = torch.tensor([1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    assert [bin(b) for b in fi.packbits(x).tolist()] == ["0b10110011"]


@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_segment_packbits(fi, backend, bitorder):
    lengths = [5, 0, 16, 9, 1]
    indptr = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    x = torch.rand(int(indptr[-1])) > 0.5
    y, new_indptr = fi.segment_packbits(backend(x), backend(indptr), bitorder=bitorder)
    y, new_indptr = np.asarray(backend.torch(y)), np.asarray(backend.torch(new_indptr))
    assert new_indptr.tolist() == [0, 1, 1, 3, 5, 6]
    for i, n in enumerate(lengths):
        seg = x.numpy()[indptr[i] : indptr[i + 1]]
        assert np.array_equal(
            y[new_indptr[i] : new_indptr[i + 1]], np.packbits(seg, bitorder=bitorder)
        )
