"""The standalone ops on CUDA tensors: merge_state*, append_paged_kv_cache,
apply_rope*, and a two-level cascade (test_gpu_composable.py has more).

They go through the C library's CUDA backend. Where it does not implement
an op yet, the call must raise flashinfer_c.BackendUnsupportedError (a
RuntimeError / NotImplementedError naming the op), never fall back to the
CPU: such a test checks that and is skipped with the library's message.
"""

import math

import pytest
import torch

import batches
import reference
from conftest import DEVICE, GPU_MARKS, assert_close, assert_lse_close, on_gpu
from test_batch_decode import make_cache

pytestmark = GPU_MARKS

F16 = torch.float16


def call(fi, op, *args, **kwargs):
    """op(*args, **kwargs), or a skip when the CUDA backend lacks the op."""
    try:
        return op(*args, **kwargs)
    except fi.BackendUnsupportedError as e:
        assert isinstance(e, RuntimeError) and isinstance(e, NotImplementedError)
        assert "does not fall back" in str(e)
        pytest.skip(f"not implemented by the CUDA backend yet: {e}")


def states(n, h, d, dtype):
    v = torch.randn(n, h, d, dtype=dtype)
    s = torch.randn(n, h) * 4
    s[0, 0] = -math.inf
    return v, s


def test_merge_state(fi):
    v_a, s_a = states(33, 8, 128, F16)
    v_b, s_b = states(33, 8, 128, F16)
    s_b[0, 0] = -math.inf  # both empty: output 0, lse -inf
    v, s = call(fi, fi.merge_state, on_gpu(v_a), on_gpu(s_a), on_gpu(v_b), on_gpu(s_b))
    assert v.device.type == DEVICE
    ref_v, ref_s = reference.merge(v_a, s_a, v_b, s_b)
    assert_close(v, ref_v, F16)
    assert_lse_close(s, ref_s, torch.float32)


@pytest.mark.parametrize("use_mask", [False, True])
def test_merge_state_in_place(fi, use_mask):
    v, s = states(20, 4, 128, F16)
    v_o, s_o = states(20, 4, 128, F16)
    ref_v, ref_s = reference.merge(v, s, v_o, s_o)
    mask = torch.rand(20) > 0.5
    if use_mask:
        keep = ~mask
        ref_v[keep], ref_s[keep] = v[keep].double(), s[keep].double()
    dv, ds = on_gpu(v), on_gpu(s)
    d_mask = on_gpu(mask) if use_mask else None
    call(fi, fi.merge_state_in_place, dv, ds, on_gpu(v_o), on_gpu(s_o), mask=d_mask)
    assert_close(dv, ref_v, F16)
    assert_lse_close(ds, ref_s, torch.float32)


def test_merge_states(fi):
    n, k, h, d = 9, 5, 4, 128
    v = torch.randn(n, k, h, d, dtype=F16)
    s = torch.randn(n, k, h) * 3
    s[2, :, 1] = -math.inf
    vm, sm = call(fi, fi.merge_states, on_gpu(v), on_gpu(s))
    ref_v, ref_s = v[:, 0].double(), s[:, 0].double()
    for i in range(1, k):
        ref_v, ref_s = reference.merge(ref_v, ref_s, v[:, i], s[:, i])
    assert_close(vm, ref_v, F16)
    assert_lse_close(sm, ref_s, torch.float32)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("five_d", [True, False])
def test_append_paged_kv_cache(fi, layout, five_d):
    page_size, h, d = 16, 2, 128
    old_lens, new_lens = [5, 0, 30], [3, 20, 1]
    total = [a + b for a, b in zip(old_lens, new_lens)]
    indptr, indices, last = batches.page_table(total, page_size, num_pages=20)
    shape = (20, 2, page_size, h, d) if layout == "NHD" else (20, 2, h, page_size, d)
    kv = on_gpu(torch.zeros(shape, dtype=F16))
    nnz = sum(new_lens)
    k_new = torch.randn(nnz, h, d, dtype=F16)
    v_new = torch.randn(nnz, h, d, dtype=F16)
    d_indptr, d_last = on_gpu(indptr), on_gpu(last)
    seq_lens = fi.get_seq_lens(d_indptr, d_last, page_size)
    bi, pos = fi.get_batch_indices_positions(on_gpu(batches.indptr_of(new_lens)), seq_lens, nnz)
    assert bi.device.type == DEVICE and pos.device.type == DEVICE
    cache = kv if five_d else (kv[:, 0], kv[:, 1])
    table = (on_gpu(indices), d_indptr, d_last)
    call(fi, fi.append_paged_kv_cache, on_gpu(k_new), on_gpu(v_new), bi, pos, cache, *table,
         kv_layout=layout)
    got = kv.cpu()
    start = 0
    for i in range(3):
        k_all = batches.gather(got[:, 0], indptr, indices, last, page_size, i, layout)
        v_all = batches.gather(got[:, 1], indptr, indices, last, page_size, i, layout)
        rows = slice(start, start + new_lens[i])
        assert torch.equal(k_all[old_lens[i] :], k_new[rows])
        assert torch.equal(v_all[old_lens[i] :], v_new[rows])
        start += new_lens[i]


LLAMA31 = dict(rope_scale=8.0, rope_theta=5e5, low_freq_factor=1.0, high_freq_factor=4.0)


@pytest.mark.parametrize("llama31", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
def test_rope(fi, llama31, interleave):
    lens, offsets = [3, 10, 1], torch.tensor([0, 100, 5000], dtype=torch.int32)
    indptr = batches.indptr_of(lens)
    q = torch.randn(14, 8, 128, dtype=F16)
    k = torch.randn(14, 2, 128, dtype=F16)
    pos = torch.cat([torch.arange(n) + int(o) for n, o in zip(lens, offsets)])
    extra = LLAMA31 if llama31 else dict(rope_scale=2.0, rope_theta=1e4)
    ref_opts = dict(
        interleave=interleave,
        rope_scale=extra["rope_scale"],
        rope_theta=extra["rope_theta"],
        llama31=(1.0, 4.0, 8192) if llama31 else None,
    )
    ref_q, ref_k = reference.rope(q, pos, **ref_opts), reference.rope(k, pos, **ref_opts)
    op = fi.apply_llama31_rope if llama31 else fi.apply_rope
    args = (on_gpu(q), on_gpu(k), on_gpu(indptr), on_gpu(offsets))
    q_rope, k_rope = call(fi, op, *args, interleave=interleave, **extra)
    assert_close(q_rope, ref_q, F16)
    assert_close(k_rope, ref_k, F16)
    # positions as int64 (torch.arange's dtype) and in place
    op = fi.apply_llama31_rope_pos_ids_inplace if llama31 else fi.apply_rope_pos_ids_inplace
    dq, dk = on_gpu(q), on_gpu(k)
    call(fi, op, dq, dk, on_gpu(pos), interleave=interleave, **extra)
    assert_close(dq, ref_q, F16)
    assert_close(dk, ref_k, F16)


def test_cascade_two_levels(fi):
    """A shared prefix (level 0) and each request's own pages (level 1)."""
    page_size, hq, hk, d = 16, 8, 2, 128
    kv = make_cache(40, page_size, hk, d, F16, "NHD", True)
    shared = torch.tensor([0, 1, 2], dtype=torch.int32)  # 48 shared tokens
    own_lens = [5, 20]
    own_indptr, own_indices, own_last = batches.page_table(own_lens, page_size, num_pages=30)
    own_indices = own_indices + 3
    q = torch.randn(2, hq, d, dtype=F16)
    w = fi.MultiLevelCascadeAttentionWrapper(2, torch.empty(1, device=DEVICE))
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    qo_indptr_arr = [i32([0, 2]), i32([0, 1, 2])]
    table = ([i32([0, 3]), own_indptr], [shared, own_indices], [i32([16]), own_last])
    w.plan(qo_indptr_arr, *table, hq, hk, d, page_size, causal=True, q_data_type=F16)
    o = call(fi, w.run, on_gpu(q), on_gpu(kv))
    for i in range(2):
        k_own = batches.gather(kv[:, 0], own_indptr, own_indices, own_last, page_size, i)
        v_own = batches.gather(kv[:, 1], own_indptr, own_indices, own_last, page_size, i)
        k = torch.cat([kv[:3, 0].reshape(-1, hk, d), k_own])
        v = torch.cat([kv[:3, 1].reshape(-1, hk, d), v_own])
        ref_o, _ = reference.attention(q[i : i + 1], k, v, causal=True)
        assert_close(o[i : i + 1], ref_o, F16, what=f"request {i}")
