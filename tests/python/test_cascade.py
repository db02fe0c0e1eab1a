"""merge_state, merge_state_in_place, merge_states, MultiLevelCascadeAttentionWrapper."""

import math

import pytest
import torch

import batches
import reference
from conftest import assert_close, assert_lse_close
from test_batch_decode import make_cache


def states(n, h, d, dtype, with_inf=True):
    v = torch.randn(n, h, d, dtype=dtype)
    s = torch.randn(n, h) * 4
    if with_inf:
        s[0, 0] = -math.inf  # an empty state contributes nothing
    return v, s


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_merge_state(fi, backend, dtype):
    v_a, s_a = states(33, 8, 128, dtype)
    v_b, s_b = states(33, 8, 128, dtype)
    s_b[1, 1] = -math.inf
    s_b[0, 0] = -math.inf  # both empty: output 0, lse -inf
    v, s = fi.merge_state(backend(v_a), backend(s_a), backend(v_b), backend(s_b))
    ref_v, ref_s = reference.merge(v_a, s_a, v_b, s_b)
    assert_close(v, ref_v, dtype)
    assert_lse_close(s, ref_s, torch.float32)


@pytest.mark.parametrize("use_mask", [False, True])
def test_merge_state_in_place(fi, backend, use_mask):
    v, s = states(20, 4, 64, torch.float32)
    v_o, s_o = states(20, 4, 64, torch.float32, with_inf=False)
    ref_v, ref_s = reference.merge(v, s, v_o, s_o)
    mask = torch.rand(20) > 0.5
    if use_mask:
        keep = ~mask
        ref_v[keep], ref_s[keep] = v[keep].double(), s[keep].double()
    bv, bs = backend(v.clone()), backend(s.clone())
    fi.merge_state_in_place(
        bv, bs, backend(v_o), backend(s_o), mask=backend(mask) if use_mask else None
    )
    assert_close(bv, ref_v, torch.float32)
    assert_lse_close(bs, ref_s, torch.float32)


def test_merge_states(fi, backend):
    n, k, h, d = 9, 5, 4, 64
    v = torch.randn(n, k, h, d)
    s = torch.randn(n, k, h) * 3
    s[2, :, 1] = -math.inf
    vm, sm = fi.merge_states(backend(v), backend(s))
    ref_v, ref_s = v[:, 0].double(), s[:, 0].double()
    for i in range(1, k):
        ref_v, ref_s = reference.merge(ref_v, ref_s, v[:, i], s[:, i])
    assert_close(vm, ref_v, torch.float32)
    assert_lse_close(sm, ref_s, torch.float32)


def test_merge_of_split_attention_is_whole_attention(fi):
    """Attention over [A; B] == merge(attention over A, attention over B)."""
    q, k, v = torch.randn(6, 4, 64), torch.randn(50, 4, 64), torch.randn(50, 4, 64)
    o_a, s_a = fi.single_prefill_with_kv_cache(q, k[:20], v[:20], return_lse=True)
    o_b, s_b = fi.single_prefill_with_kv_cache(q, k[20:], v[20:], return_lse=True)
    o, s = fi.merge_state(o_a, s_a, o_b, s_b)
    ref_o, ref_s = reference.attention(q, k, v)
    assert_close(o, ref_o, torch.float32)
    assert_lse_close(s, ref_s, torch.float32)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_multi_level_cascade(fi, backend, layout):
    """A shared prefix (level 0, every query) + each request's own pages (level 1, causal)."""
    page_size, h, d, batch = 4, 4, 64, 5
    shared_len, unique_lens = 22, [3, 9, 1, 14, 6]
    num_pages = 40
    order = torch.randperm(num_pages).int()
    shared_pages = (shared_len + page_size - 1) // page_size
    shared = (
        torch.tensor([0, shared_pages], dtype=torch.int32),
        order[:shared_pages],
        torch.tensor([shared_len - (shared_pages - 1) * page_size], dtype=torch.int32),
    )
    counts = [(n + page_size - 1) // page_size for n in unique_lens]
    u_indptr = batches.indptr_of(counts)
    u_indices = order[shared_pages : shared_pages + sum(counts)]
    u_last = torch.tensor(
        [n - (c - 1) * page_size for n, c in zip(unique_lens, counts)], dtype=torch.int32
    )
    kv = make_cache(num_pages, page_size, h, d, torch.float32, layout, True)
    q = torch.randn(batch, h, d)
    w = fi.MultiLevelCascadeAttentionWrapper(2, backend(torch.empty(1)), layout)
    w.plan(
        [
            backend(torch.tensor([0, batch], dtype=torch.int32)),
            backend(torch.arange(batch + 1, dtype=torch.int32)),
        ],
        [backend(shared[0]), backend(u_indptr)],
        [backend(shared[1]), backend(u_indices)],
        [backend(shared[2]), backend(u_last)],
        h,
        h,
        d,
        page_size,
        causal=True,
        q_data_type=torch.float32,
    )
    o = w.run(backend(q), backend(kv))
    k_sh = batches.gather(kv[:, 0], *shared, page_size, 0, layout)
    v_sh = batches.gather(kv[:, 1], *shared, page_size, 0, layout)
    for i in range(batch):
        k_u = batches.gather(kv[:, 0], u_indptr, u_indices, u_last, page_size, i, layout)
        v_u = batches.gather(kv[:, 1], u_indptr, u_indices, u_last, page_size, i, layout)
        ref_o, _ = reference.attention(
            q[i : i + 1], torch.cat([k_sh, k_u]), torch.cat([v_sh, v_u]), causal=True
        )
        assert_close(backend.torch(o)[i : i + 1], ref_o, torch.float32)
