"""apply_rope, apply_rope_pos_ids, apply_llama31_rope(_pos_ids) and their _inplace forms."""

import pytest
import torch

import batches
import reference
from conftest import assert_close

LLAMA31 = dict(
    rope_scale=8.0, rope_theta=5e5, low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192
)


def positions_of(indptr, offsets):
    pos = []
    for i in range(len(offsets)):
        n = int(indptr[i + 1] - indptr[i])
        pos.append(torch.arange(n) + int(offsets[i]))
    return torch.cat(pos)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 32])
@pytest.mark.parametrize("llama31", [False, True])
def test_rope_indptr_offsets(fi, backend, dtype, interleave, rotary_dim, llama31):
    indptr = batches.indptr_of([3, 10, 1])
    offsets = torch.tensor([0, 100, 5000], dtype=torch.int32)
    q = torch.randn(14, 8, 64, dtype=dtype)
    k = torch.randn(14, 2, 64, dtype=dtype)
    opts = dict(rotary_dim=rotary_dim, interleave=interleave)
    fn = fi.apply_llama31_rope if llama31 else fi.apply_rope
    extra = LLAMA31 if llama31 else dict(rope_scale=2.0, rope_theta=1e4)
    q_rope, k_rope = fn(backend(q), backend(k), backend(indptr), backend(offsets), **opts, **extra)
    pos = positions_of(indptr, offsets)
    ref_opts = dict(
        rotary_dim=rotary_dim,
        interleave=interleave,
        rope_scale=extra["rope_scale"],
        rope_theta=extra["rope_theta"],
        llama31=(1.0, 4.0, 8192) if llama31 else None,
    )
    tol = dtype
    assert_close(q_rope, reference.rope(q, pos, **ref_opts), tol)
    assert_close(k_rope, reference.rope(k, pos, **ref_opts), tol)
    # the inputs are untouched by the out-of-place form
    assert torch.equal(backend.torch(backend(q)), q) if backend.name == "torch" else True


@pytest.mark.parametrize("llama31", [False, True])
def test_rope_pos_ids_and_inplace(fi, backend, llama31):
    q = torch.randn(9, 4, 128)
    k = torch.randn(9, 4, 128)
    pos = torch.tensor([0, 1, 2, 7, 8, 100, 3, 3, 40], dtype=torch.int32)
    extra = LLAMA31 if llama31 else dict(rope_scale=1.0, rope_theta=1e4)
    ref_opts = dict(
        rope_scale=extra["rope_scale"],
        rope_theta=extra["rope_theta"],
        llama31=(1.0, 4.0, 8192) if llama31 else None,
    )
    fn = fi.apply_llama31_rope_pos_ids if llama31 else fi.apply_rope_pos_ids
    fn_inplace = fi.apply_llama31_rope_pos_ids_inplace if llama31 else fi.apply_rope_pos_ids_inplace
    q_rope, k_rope = fn(backend(q), backend(k), backend(pos), **extra)
    assert_close(q_rope, reference.rope(q, pos, **ref_opts), torch.float32)
    bq, bk = backend(q.clone()), backend(k.clone())
    assert fn_inplace(bq, bk, backend(pos), **extra) is None
    assert_close(bq, reference.rope(q, pos, **ref_opts), torch.float32)
    assert_close(bk, reference.rope(k, pos, **ref_opts), torch.float32)


@pytest.mark.parametrize("llama31", [False, True])
def test_rope_inplace_indptr(fi, llama31):
    indptr = batches.indptr_of([4, 4])
    offsets = torch.tensor([7, 0], dtype=torch.int32)
    q, k = torch.randn(8, 2, 64), torch.randn(8, 2, 64)
    extra = LLAMA31 if llama31 else {}
    fn = fi.apply_llama31_rope_inplace if llama31 else fi.apply_rope_inplace
    q2, k2 = q.clone(), k.clone()
    fn(q2, k2, indptr, offsets, **extra)
    ref_opts = dict(llama31=(1.0, 4.0, 8192), rope_scale=8.0, rope_theta=5e5) if llama31 else {}
    assert_close(q2, reference.rope(q, positions_of(indptr, offsets), **ref_opts), torch.float32)


def test_rope_int64_positions(fi):
    """int64 positions (torch.arange's default) are converted, as FlashInfer accepts them."""
    q, k = torch.randn(5, 2, 64), torch.randn(5, 2, 64)
    pos = torch.arange(5)
    q_rope, _ = fi.apply_rope_pos_ids(q, k, pos)
    assert_close(q_rope, reference.rope(q, pos), torch.float32)


def test_rope_strided_qk(fi):
    """q and k as column slices of one qkv buffer, rotated in place."""
    qkv = torch.randn(6, (4 + 2 + 2) * 64)
    q = qkv[:, : 4 * 64].view(6, 4, 64)
    k = qkv[:, 4 * 64 : 6 * 64].view(6, 2, 64)
    q0, k0 = q.clone(), k.clone()
    pos = torch.arange(6, dtype=torch.int32) * 3
    fi.apply_rope_pos_ids_inplace(q, k, pos)
    assert_close(q, reference.rope(q0, pos), torch.float32)
    assert_close(k, reference.rope(k0, pos), torch.float32)
