"""The attention calls on torch CUDA tensors (the CUDA backend), against the
fp64 references on the host.

Each distinct kernel configuration is JIT-compiled on first use (1-2 s), so
these tests share a few: d 128, 8 query heads over 2 KV heads (group 4),
f16 (and bf16 once), paged or ragged, mask none / causal / custom.
"""

import pytest
import torch

import batches
import reference
from conftest import (
    DEVICE,
    GPU_MARKS,
    assert_close,
    assert_lse_close,
    needs_cuda,
    on_gpu,
    synchronize,
)
from test_batch_decode import make_cache, reference_decode

pytestmark = GPU_MARKS

HQ, HK, D, PAGE = 8, 2, 128, 16
F16 = torch.float16


def workspace():
    return torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)


def gpu_kv(kv):
    return on_gpu(kv) if isinstance(kv, torch.Tensor) else tuple(on_gpu(x) for x in kv)


@pytest.mark.parametrize("dtype", [F16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("five_d", [True, False])
def test_batch_decode(fi, dtype, layout, five_d):
    kv_lens = [1, 16, 17, 100, 333, 5, 2048]
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, dtype, layout, five_d)
    q = torch.randn(len(kv_lens), HQ, D, dtype=dtype)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    # host index tensors, as FlashInfer's plan prefers them
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=dtype)
    o, lse = w.run(on_gpu(q), gpu_kv(kv), return_lse=True)
    assert o.device.type == DEVICE and lse.device.type == DEVICE
    ref_o, ref_lse = reference_decode(q, kv, indptr, indices, last, PAGE, layout)
    assert_close(o, ref_o, dtype)
    assert_lse_close(lse, ref_lse, dtype)


def test_plan_takes_device_index_tensors(fi):
    """indptr/indices/last_page_len on the GPU are copied to the host once, by plan()."""
    kv_lens = [40, 3, 77, 0]
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, F16, "NHD", True)
    q = torch.randn(len(kv_lens), HQ, D, dtype=F16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    d_indices = on_gpu(indices)
    w.plan(on_gpu(indptr), d_indices, on_gpu(last), HQ, HK, D, PAGE, q_data_type=F16)
    d_indices.zero_()  # reused by the caller after plan(), as FlashInfer allows
    o, lse = w.run_return_lse(on_gpu(q), on_gpu(kv))
    ref_o, ref_lse = reference_decode(q, kv, indptr, indices, last, PAGE, "NHD")
    assert_close(o, ref_o, F16)
    assert_lse_close(lse, ref_lse, F16)  # the empty request: lse -inf, output 0


def test_batch_decode_run_scales_and_out(fi):
    """k_scale (a sibling C plan), v_scale, and out/lse given by the caller."""
    kv_lens = [9, 300]
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, F16, "NHD", True)
    q = torch.randn(2, HQ, D, dtype=F16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
    out = torch.empty(2, HQ, D, dtype=F16, device=DEVICE)
    lse = torch.empty(2, HQ, device=DEVICE)
    got = w.run(on_gpu(q), on_gpu(kv), k_scale=0.5, v_scale=2.0, out=out, lse=lse, return_lse=True)
    assert got[0] is out and got[1] is lse
    ref_o, _ = reference_decode(q, kv, indptr, indices, last, PAGE, "NHD", sm_scale=0.5 / D**0.5)
    assert_close(out, 2.0 * ref_o, F16)


# head dims beyond 64/128/256 too (80, 96, 192, 512: the CUDA-core kernel)
@pytest.mark.parametrize(
    "layout, d", [("NHD", D), ("HND", D), ("NHD", 80), ("NHD", 96), ("NHD", 192), ("NHD", 512)]
)
def test_batch_prefill_paged_causal(fi, layout, d):
    qo_lens, kv_lens = [1, 17, 64, 5], [30, 17, 200, 5]
    qo_indptr = batches.indptr_of(qo_lens)
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, d, F16, layout, True)
    q = torch.randn(sum(qo_lens), HQ, d, dtype=F16)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), layout)
    w.plan(qo_indptr, indptr, indices, last, HQ, HK, d, PAGE, causal=True, q_data_type=F16)
    o, lse = w.run(on_gpu(q), on_gpu(kv), return_lse=True)
    for i in range(len(qo_lens)):
        k = batches.gather(kv[:, 0], indptr, indices, last, PAGE, i, layout)
        v = batches.gather(kv[:, 1], indptr, indices, last, PAGE, i, layout)
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref_o, ref_lse = reference.attention(q[rows], k, v, causal=True)
        assert_close(o[rows], ref_o, F16, what=f"request {i}")
        assert_lse_close(lse[rows], ref_lse, F16)


def test_batch_prefill_custom_mask(fi):
    qo_lens, kv_lens = [3, 9], [10, 40]
    qo_indptr = batches.indptr_of(qo_lens)
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, F16, "NHD", True)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=F16)
    masks = [torch.rand(a, b) > 0.3 for a, b in zip(qo_lens, kv_lens)]
    flat = torch.cat([m.reshape(-1) for m in masks])
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace())
    mask = on_gpu(flat)
    w.plan(qo_indptr, indptr, indices, last, HQ, HK, D, PAGE, custom_mask=mask, q_data_type=F16)
    o = w.run(on_gpu(q), on_gpu(kv))
    for i, m in enumerate(masks):
        k = batches.gather(kv[:, 0], indptr, indices, last, PAGE, i)
        v = batches.gather(kv[:, 1], indptr, indices, last, PAGE, i)
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref_o, _ = reference.attention(q[rows], k, v, mask=m)
        assert_close(o[rows], ref_o, F16, what=f"request {i}")


# and DeepSeek's prefill shape: head_dim_qk 192, head_dim_vo 128
@pytest.mark.parametrize("dqk, dvo", [(D, D), (192, 128)])
def test_batch_prefill_ragged_causal(fi, dqk, dvo):
    qo_lens, kv_lens = [4, 50, 1], [4, 120, 33]
    qo_indptr, kv_indptr = batches.indptr_of(qo_lens), batches.indptr_of(kv_lens)
    q = torch.randn(sum(qo_lens), HQ, dqk, dtype=F16)
    k = torch.randn(sum(kv_lens), HK, dqk, dtype=F16)
    v = torch.randn(sum(kv_lens), HK, dvo, dtype=F16)
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    w.plan(on_gpu(qo_indptr), on_gpu(kv_indptr), HQ, HK, dqk, dvo, causal=True, q_data_type=F16)
    o = w.run(on_gpu(q), on_gpu(k), on_gpu(v))
    assert o.shape == (sum(qo_lens), HQ, dvo)
    for i in range(len(qo_lens)):
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        keys = slice(int(kv_indptr[i]), int(kv_indptr[i + 1]))
        ref_o, _ = reference.attention(q[rows], k[keys], v[keys], causal=True)
        assert_close(o[rows], ref_o, F16, what=f"request {i}")


@pytest.mark.parametrize("d", [80, 96, 192, 512])
def test_batch_decode_wide_head_dims(fi, d):
    """Head dims beyond 64/128/256 (the CUDA-core kernel), bf16, a long
    request split over CTAs."""
    dtype = torch.bfloat16
    kv_lens = [3, 40, 700]
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, d, dtype, "NHD", True)
    q = torch.randn(len(kv_lens), HQ, d, dtype=dtype)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, HQ, HK, d, PAGE, q_data_type=dtype)
    o, lse = w.run(on_gpu(q), on_gpu(kv), return_lse=True)
    ref_o, ref_lse = reference_decode(q, kv, indptr, indices, last, PAGE, "NHD")
    assert_close(o, ref_o, dtype)
    assert_lse_close(lse, ref_lse, dtype)


def test_single_decode_and_prefill(fi):
    q1 = torch.randn(HQ, D, dtype=F16)
    k = torch.randn(300, HK, D, dtype=F16)
    v = torch.randn(300, HK, D, dtype=F16)
    o, lse = fi.single_decode_with_kv_cache(on_gpu(q1), on_gpu(k), on_gpu(v), return_lse=True)
    ref_o, ref_lse = reference.attention(q1[None], k, v)
    assert_close(o, ref_o[0], F16)
    assert_lse_close(lse, ref_lse[0], F16)
    q = torch.randn(40, HQ, D, dtype=F16)
    o, lse = fi.single_prefill_with_kv_cache_return_lse(
        on_gpu(q), on_gpu(k), on_gpu(v), causal=True
    )
    ref_o, ref_lse = reference.attention(q, k, v, causal=True)
    assert_close(o, ref_o, F16)
    assert_lse_close(lse, ref_lse, F16)


def test_batch_attention(fi):
    """BatchAttention on device="cuda" (FlashInfer's default)."""
    qo_lens, kv_lens = [1, 12, 1], [50, 12, 17]
    qo_indptr = batches.indptr_of(qo_lens)
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, F16, "NHD", True)
    q = torch.randn(sum(qo_lens), HQ, D, dtype=F16)
    w = fi.BatchAttention(device=DEVICE)
    kv_len_arr = torch.tensor(kv_lens, dtype=torch.int32)
    dtypes = dict(q_data_type=F16, kv_data_type=F16)
    w.plan(qo_indptr, indptr, indices, kv_len_arr, HQ, HK, D, D, PAGE, causal=True, **dtypes)
    o, _ = w.run(on_gpu(q), on_gpu(kv))
    for i in range(len(qo_lens)):
        k = batches.gather(kv[:, 0], indptr, indices, last, PAGE, i)
        v = batches.gather(kv[:, 1], indptr, indices, last, PAGE, i)
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref_o, _ = reference.attention(q[rows], k, v, causal=True)
        assert_close(o[rows], ref_o, F16, what=f"request {i}")


@needs_cuda
def test_runs_on_the_callers_stream(fi):
    """run() is queued on torch's current stream: q written on a side stream
    after a long sleep is seen (on another stream the kernel would read zeros)."""
    kv_lens = [64, 500]
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, F16, "NHD", True)
    q = torch.randn(2, HQ, D, dtype=F16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
    d_q, d_kv, src = torch.zeros_like(on_gpu(q)), on_gpu(kv), on_gpu(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time before q is written
        d_q.copy_(src)
        o = w.run(d_q, d_kv)
    side.synchronize()
    ref_o, _ = reference_decode(q, kv, indptr, indices, last, PAGE, "NHD")
    assert_close(o, ref_o, F16)


@needs_cuda
def test_plan_orders_with_the_callers_stream(fi):
    """Planned and run on a side stream, then re-planned and run on the default
    stream: each run sees its own batch."""
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    kv = make_cache(80, PAGE, HK, D, F16, "NHD", True)
    d_kv = on_gpu(kv)
    side = torch.cuda.Stream()
    results = []
    for stream, kv_lens in ((side, [100, 7]), (torch.cuda.current_stream(), [5, 300, 60])):
        indptr, indices, last = batches.page_table(kv_lens, PAGE, num_pages=80)
        q = torch.randn(len(kv_lens), HQ, D, dtype=F16)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
            results.append((w.run(on_gpu(q), d_kv), q, indptr, indices, last))
    synchronize()
    for o, q, indptr, indices, last in results:
        ref_o, _ = reference_decode(q, kv, indptr, indices, last, PAGE, "NHD")
        assert_close(o, ref_o, F16)


@needs_cuda
@pytest.mark.skipif(
    DEVICE == "cuda" and torch.cuda.device_count() < 2, reason="needs two GPUs"
)
def test_second_device(fi):
    """Tensors on cuda:1 run on the context of ordinal 1."""
    kv_lens = [33, 4]
    indptr, indices, last = batches.page_table(kv_lens, PAGE)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, F16, "NHD", True)
    q = torch.randn(2, HQ, D, dtype=F16)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1, device="cuda:1"))
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
    o = w.run(q.to("cuda:1"), kv.to("cuda:1"))
    assert o.device == torch.device("cuda:1")
    ref_o, _ = reference_decode(q, kv, indptr, indices, last, PAGE, "NHD")
    assert_close(o, ref_o, F16)
    assert "device 1" in fi.describe("cuda:1")


@needs_cuda
def test_mixed_devices_refused(fi):
    indptr, indices, last = batches.page_table([5], PAGE)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
    kv = make_cache(int(indices.max()) + 1, PAGE, HK, D, F16, "NHD", True)
    with pytest.raises(ValueError, match="q is on cpu but this call runs on cuda:0"):
        w.run(torch.randn(1, HQ, D, dtype=F16), on_gpu(kv))
    with pytest.raises(ValueError, match="paged_kv_cache is on cpu"):
        w.run(torch.randn(1, HQ, D, dtype=F16, device=DEVICE), kv)
