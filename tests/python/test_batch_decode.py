"""BatchDecodeWithPagedKVCacheWrapper."""

import numpy as np
import pytest
import torch

import batches
import reference
from conftest import assert_close, assert_lse_close


def make_cache(num_pages, page_size, hk, d, dtype, layout, five_d):
    if layout == "NHD":
        shape = (num_pages, 2, page_size, hk, d)
    else:
        shape = (num_pages, 2, hk, page_size, d)
    kv = torch.randn(shape, dtype=dtype)
    return kv if five_d else (kv[:, 0], kv[:, 1])


def reference_decode(q, kv, indptr, indices, last, page_size, layout, **options):
    k_cache, v_cache = (kv[:, 0], kv[:, 1]) if isinstance(kv, torch.Tensor) else kv
    outs, lses = [], []
    for i in range(len(last)):
        k = batches.gather(k_cache, indptr, indices, last, page_size, i, layout)
        v = batches.gather(v_cache, indptr, indices, last, page_size, i, layout)
        o, s = reference.attention(q[i : i + 1], k, v, **options)
        outs.append(o)
        lses.append(s)
    return torch.cat(outs), torch.cat(lses)


def as_backend(backend, kv):
    return backend(kv) if isinstance(kv, torch.Tensor) else tuple(backend(x) for x in kv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("five_d", [True, False])
def test_batch_decode(fi, backend, dtype, layout, five_d):
    page_size, hq, hk, d = 16, 8, 2, 128
    kv_lens = [1, 16, 17, 100, 333, 5]
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, hk, d, dtype, layout, five_d)
    q = torch.randn(len(kv_lens), hq, d, dtype=dtype)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(backend(torch.empty(16, dtype=torch.uint8)), layout)
    w.plan(
        backend(indptr), backend(indices), backend(last), hq, hk, d, page_size, q_data_type=dtype
    )
    o, lse = w.run(backend(q), as_backend(backend, kv), return_lse=True)
    ref_o, ref_lse = reference_decode(q, kv, indptr, indices, last, page_size, layout)
    assert_close(o, ref_o, dtype)
    assert_lse_close(lse, ref_lse, dtype)
    # run_return_lse, and out/lse given by the caller
    out = backend(torch.empty_like(q))
    lse2 = backend(torch.empty(len(kv_lens), hq))
    got = w.run_return_lse(backend(q), as_backend(backend, kv), out=out, lse=lse2)
    assert got[0] is out and got[1] is lse2
    assert_close(out, ref_o, dtype)


@pytest.mark.parametrize(
    "options",
    [
        dict(window_left=30),
        dict(logits_soft_cap=15.0),
        dict(pos_encoding_mode="ALIBI"),
        dict(pos_encoding_mode="ROPE_LLAMA", rope_scale=1.0, rope_theta=1e4),
        dict(sm_scale=0.3),
    ],
)
def test_batch_decode_variants(fi, options):
    page_size, hq, hk, d = 8, 4, 4, 64
    kv_lens = [40, 3, 77]
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, hk, d, torch.float32, "NHD", True)
    q = torch.randn(3, hq, d)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1), "NHD")
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=torch.float32, **options)
    o = w.run(q, kv)
    ref = dict(
        window_left=options.get("window_left", -1),
        logits_soft_cap=options.get("logits_soft_cap", 0.0),
        sm_scale=options.get("sm_scale"),
        alibi=options.get("pos_encoding_mode") == "ALIBI",
    )
    if options.get("pos_encoding_mode") == "ROPE_LLAMA":
        ref["rope_llama"] = (1.0, 1e4)
    ref_o, _ = reference_decode(q, kv, indptr, indices, last, page_size, "NHD", **ref)
    assert_close(o, ref_o, torch.float32)


def test_batch_decode_run_scales(fi):
    """k_scale at run() changes the softmax scale for that call only; v_scale the output."""
    page_size, h, d = 4, 4, 64
    indptr, indices, last = batches.page_table([9, 30], page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(2, h, d)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1))
    w.plan(indptr, indices, last, h, h, d, page_size, q_data_type="float32")
    for _ in range(2):  # the scaled sibling plan is reused
        o = w.run(q, kv, k_scale=0.5, v_scale=2.0)
        ref_o, _ = reference_decode(
            q, kv, indptr, indices, last, page_size, "NHD", sm_scale=0.5 / 8.0
        )
        assert_close(o, 2.0 * ref_o, torch.float32)
    ref_plain, _ = reference_decode(q, kv, indptr, indices, last, page_size, "NHD")
    assert_close(w.run(q, kv), ref_plain, torch.float32)


def test_batch_decode_multi_token_per_request(fi):
    """q_len_per_req > 1 (speculative verification): causal within each request."""
    page_size, h, d, n = 4, 4, 64, 3
    kv_lens = [10, 25]
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(2 * n, h, d)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1), use_tensor_cores=True)
    w.plan(indptr, indices, last, h, h, d, page_size, q_data_type="float32", q_len_per_req=n)
    o = w.run(q, kv)
    for i in range(2):
        k = batches.gather(kv[:, 0], indptr, indices, last, page_size, i)
        v = batches.gather(kv[:, 1], indptr, indices, last, page_size, i)
        ref_o, _ = reference.attention(q[i * n : (i + 1) * n], k, v, causal=True)
        assert_close(o[i * n : (i + 1) * n], ref_o, torch.float32)


def test_batch_decode_replan_grows_and_shrinks(fi):
    """plan() again with other batches: bigger (the C plan's bounds grow) and smaller."""
    page_size, h, d = 4, 4, 64
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1))
    for kv_lens in ([5], [5, 60, 7] * 10, [1, 2], [300] * 40):
        indptr, indices, last = batches.page_table(kv_lens, page_size)
        kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", True)
        q = torch.randn(len(kv_lens), h, d)
        w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float32)
        ref_o, _ = reference_decode(q, kv, indptr, indices, last, page_size, "NHD")
        assert_close(w.run(q, kv), ref_o, torch.float32)


def test_batch_decode_cuda_graph_buffers(fi):
    """use_cuda_graph=True: buffers required, batch size fixed, plan writes the buffers."""
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer"):
        fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1), use_cuda_graph=True)
    page_size, h, d, batch = 4, 4, 64, 3
    bufs = dict(
        paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32),
        paged_kv_indices_buffer=torch.zeros(64, dtype=torch.int32),
        paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32),
    )
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1), "NHD", use_cuda_graph=True, **bufs)
    assert w.is_cuda_graph_enabled
    for kv_lens in ([3, 9, 20], [40, 1, 2]):
        indptr, indices, last = batches.page_table(kv_lens, page_size, num_pages=40)
        kv = make_cache(40, page_size, h, d, torch.float32, "NHD", True)
        w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float32)
        assert torch.equal(bufs["paged_kv_indptr_buffer"], indptr)
        assert torch.equal(bufs["paged_kv_indices_buffer"][: len(indices)], indices)
        q = torch.randn(batch, h, d)
        ref_o, _ = reference_decode(q, kv, indptr, indices, last, page_size, "NHD")
        assert_close(w.run(q, kv), ref_o, torch.float32)
    indptr, indices, last = batches.page_table([3, 4], page_size)
    with pytest.raises(ValueError, match="fixed"):
        w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float32)
    indptr, indices, last = batches.page_table([100, 100, 100], page_size, num_pages=80)
    with pytest.raises(ValueError, match="paged_kv_indices_buffer"):
        w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float32)


def test_batch_decode_empty_requests(fi):
    """A request with no pages (last_page_len 0): output 0, lse -inf."""
    page_size, h, d = 4, 4, 64
    indptr, indices, last = batches.page_table([0, 6, 0], page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(3, h, d)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1))
    w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float32)
    o, lse = w.run(q, kv, return_lse=True)
    ref_o, ref_lse = reference_decode(q, kv, indptr, indices, last, page_size, "NHD")
    assert_close(o, ref_o, torch.float32)
    assert_lse_close(lse, ref_lse, torch.float32)
    assert np.isneginf(lse[0].numpy()).all()


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_batch_decode_fp8_kv(fi, fp8):
    """An FP8 KV cache with FlashInfer's run-time k_scale / v_scale."""
    page_size, h, d = 4, 4, 64
    kv_lens = [11, 30]
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    kv = (torch.randn(int(indices.max()) + 1, 2, page_size, h, d) * 2).to(fp8)
    q = torch.randn(2, h, d, dtype=torch.float16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1))
    w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float16, kv_data_type=fp8)
    o = w.run(q, kv, k_scale=0.5, v_scale=0.25)
    scaled = torch.stack([kv[:, 0].double() * 0.5, kv[:, 1].double() * 0.25], 1)
    ref_o, _ = reference_decode(q, scaled, indptr, indices, last, page_size, "NHD")
    assert_close(o, ref_o, torch.float16)


def test_c_plan_recreated_only_past_its_bounds(fi):
    """Re-planning a batch that fits keeps the C plan; a bigger one grows its bounds."""
    page_size, h, d = 4, 4, 64
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1))

    def plan(kv_lens):
        indptr, indices, last = batches.page_table(kv_lens, page_size)
        w.plan(indptr, indices, last, h, h, d, page_size, q_data_type=torch.float32)
        return w._plan.handle, w._plan.bounds

    handle, bounds = plan([30] * 20)
    assert plan([5, 6]) == (handle, bounds)
    assert plan([30] * 20) == (handle, bounds)
    bigger_handle, bigger = plan([30] * 100)
    assert bigger.batch >= 100 and bigger.batch > bounds.batch
    assert plan([3] * 50)[1] == bigger  # stays grown


def test_caller_may_reuse_page_table_after_plan(fi, backend):
    """As with FlashInfer's plan(), the caller's index arrays can change after plan()."""
    page_size, h, d = 4, 4, 64
    indptr, indices, last = batches.page_table([9, 14], page_size, num_pages=12)
    kv = make_cache(12, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(2, h, d)
    b_indices = backend(indices.clone())
    w = fi.BatchDecodeWithPagedKVCacheWrapper(backend(torch.empty(1)))
    w.plan(backend(indptr), b_indices, backend(last), h, h, d, page_size, q_data_type="float32")
    b_indices[:] = 0  # the caller reuses its buffer for something else
    ref_o, _ = reference_decode(q, kv, indptr, indices, last, page_size, "NHD")
    assert_close(w.run(backend(q), backend(kv)), ref_o, torch.float32)
