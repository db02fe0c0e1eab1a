"""CUDA graphs as FlashInfer does them: a wrapper made with use_cuda_graph=True
and fixed indptr/indices/last_page_len buffers; run() captured once, then
plan() with another batch (within the buffers' bounds) and replay. Capturing
what cannot be replayed correctly is refused with a message.
"""

import math

import pytest
import torch

import batches
import reference
from conftest import (
    DEVICE,
    GPU_MARKS,
    Graph,
    assert_close,
    assert_lse_close,
    needs_cuda,
    on_gpu,
    synchronize,
)
from test_batch_decode import make_cache, reference_decode

pytestmark = GPU_MARKS

HQ, HK, D, PAGE, POOL = 8, 2, 128, 16, 64
F16 = torch.float16


def workspace():
    return torch.empty(1 << 20, dtype=torch.uint8, device=DEVICE)


def int_buffer(n):
    return torch.zeros(n, dtype=torch.int32, device=DEVICE)


def decode_graph_wrapper(fi, batch, layout="NHD"):
    bufs = dict(
        paged_kv_indptr_buffer=int_buffer(batch + 1),
        paged_kv_indices_buffer=int_buffer(POOL),
        paged_kv_last_page_len_buffer=int_buffer(batch),
    )
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout, use_cuda_graph=True, **bufs)
    return w, bufs


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_graph_replays_new_plans(fi, layout):
    """One capture; each new plan() (other lengths, other pages, requests with
    no pages standing for padding) is read by the replay. The capture holds a
    run with k_scale too, which runs on a second C plan: plan() updates both."""
    steps = [[5, 17, 33, 64], [100, 1, 0, 250], [0, 0, 0, 1], [400, 300, 200, 100]]
    batch = len(steps[0])
    w, bufs = decode_graph_wrapper(fi, batch, layout)
    kv = make_cache(POOL, PAGE, HK, D, F16, layout, True)
    d_kv = on_gpu(kv)
    q = torch.zeros(batch, HQ, D, dtype=F16, device=DEVICE)
    out = torch.empty(batch, HQ, D, dtype=F16, device=DEVICE)
    lse = torch.empty(batch, HQ, device=DEVICE)
    scaled = torch.empty_like(out)

    def forward():
        w.run(q, d_kv, out=out, lse=lse, return_lse=True)
        w.run(q, d_kv, k_scale=0.5, out=scaled)

    graph = None
    for kv_lens in steps:
        indptr, indices, last = batches.page_table(kv_lens, PAGE, num_pages=POOL)
        w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
        assert torch.equal(bufs["paged_kv_indptr_buffer"].cpu(), indptr)
        host_q = torch.randn(batch, HQ, D, dtype=F16)
        q.copy_(host_q)
        if graph is None:
            graph = Graph(forward)
        graph.replay()
        synchronize()
        ref_o, ref_lse = reference_decode(host_q, kv, indptr, indices, last, PAGE, layout)
        assert_close(out, ref_o, F16, what=f"kv_lens {kv_lens}")
        assert_lse_close(lse, ref_lse, F16)
        ref_scaled, _ = reference_decode(
            host_q, kv, indptr, indices, last, PAGE, layout, sm_scale=0.5 / math.sqrt(D)
        )
        assert_close(scaled, ref_scaled, F16, what=f"k_scale, kv_lens {kv_lens}")


@pytest.mark.parametrize("masked", [False, True])
def test_prefill_graph_replays_new_plans(fi, masked):
    """Paged prefill in graph mode: query rows are bounded by the first plan;
    later batches are smaller. With a custom mask, plan() packs it into the
    caller's custom_mask_buf, which is what the captured run reads."""
    steps = [([20, 30, 14], [40, 30, 300]), ([1, 60, 2], [9, 60, 2]), ([3, 0, 5], [3, 16, 5])]
    batch = 3
    max_rows = sum(steps[0][0])
    bufs = dict(
        qo_indptr_buf=int_buffer(batch + 1),
        paged_kv_indptr_buf=int_buffer(batch + 1),
        paged_kv_indices_buf=int_buffer(POOL),
        paged_kv_last_page_len_buf=int_buffer(batch),
    )
    if masked:
        bufs["custom_mask_buf"] = torch.zeros(4096, dtype=torch.uint8, device=DEVICE)
        bufs["mask_indptr_buf"] = int_buffer(batch + 1)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", use_cuda_graph=True, **bufs)
    kv = make_cache(POOL, PAGE, HK, D, F16, "NHD", True)
    d_kv = on_gpu(kv)
    q = torch.zeros(max_rows, HQ, D, dtype=F16, device=DEVICE)
    out = torch.empty(max_rows, HQ, D, dtype=F16, device=DEVICE)
    graph = None
    for qo_lens, kv_lens in steps:
        qo_indptr = batches.indptr_of(qo_lens)
        indptr, indices, last = batches.page_table(kv_lens, PAGE, num_pages=POOL)
        masks = [torch.rand(a, b) > 0.3 for a, b in zip(qo_lens, kv_lens)] if masked else None
        options = dict(causal=True)
        if masked:
            options = dict(custom_mask=torch.cat([m.reshape(-1) for m in masks]))
        w.plan(qo_indptr, indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16, **options)
        host_q = torch.randn(sum(qo_lens), HQ, D, dtype=F16)
        q[: sum(qo_lens)].copy_(host_q)
        if graph is None:
            graph = Graph(lambda: w.run(q, d_kv, out=out))
        graph.replay()
        synchronize()
        for i in range(batch):
            k = batches.gather(kv[:, 0], indptr, indices, last, PAGE, i)
            v = batches.gather(kv[:, 1], indptr, indices, last, PAGE, i)
            rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
            mask = masks[i] if masked else None
            ref_o, _ = reference.attention(host_q[rows], k, v, causal=not masked, mask=mask)
            assert_close(out[rows], ref_o, F16, what=f"step {qo_lens}, request {i}")


def test_graph_buffers_bound_the_batch(fi):
    w, _ = decode_graph_wrapper(fi, 2)
    indptr, indices, last = batches.page_table([3, 4, 5], PAGE)
    with pytest.raises(ValueError, match="batch size is fixed at 2"):
        w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
    indptr, indices, last = batches.page_table([900, 300], PAGE, num_pages=100)
    with pytest.raises(ValueError, match="paged_kv_indices_buffer"):
        w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)


def planned_decode(fi, use_cuda_graph):
    """A planned decode wrapper, its q and KV cache on the device."""
    indptr, indices, last = batches.page_table([20, 7], PAGE, num_pages=POOL)
    if use_cuda_graph:
        w, _ = decode_graph_wrapper(fi, 2)
    else:
        w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
    q = torch.randn(2, HQ, D, dtype=F16, device=DEVICE)
    kv = on_gpu(make_cache(POOL, PAGE, HK, D, F16, "NHD", True))
    w.run(q, kv)  # warm-up
    synchronize()
    return w, q, kv, (indptr, indices, last)


@needs_cuda
def test_capture_refused_without_use_cuda_graph(fi):
    w, q, kv, _ = planned_decode(fi, use_cuda_graph=False)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="use_cuda_graph=True"):
        with torch.cuda.graph(graph):
            w.run(q, kv)


@needs_cuda
def test_plan_refused_inside_capture(fi):
    w, q, kv, (indptr, indices, last) = planned_decode(fi, use_cuda_graph=True)
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="outside the captured region"):
        with torch.cuda.graph(graph):
            w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)


@needs_cuda
def test_new_parameters_after_capture_refused(fi):
    """A graph keeps running the C plan it captured: plan() may change the batch,
    not the attention parameters that fix the C plan."""
    w, q, kv, (indptr, indices, last) = planned_decode(fi, use_cuda_graph=True)
    out = torch.empty_like(q)
    Graph(lambda: w.run(q, kv, out=out))
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)  # same parameters: fine
    with pytest.raises(ValueError, match="captured"):
        w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16, sm_scale=0.1)


@needs_cuda
def test_single_decode_in_a_graph(fi):
    """single_decode_with_kv_cache captured after a warm-up call keeps its plan:
    eager calls of other lengths afterwards do not disturb the replays."""
    q = torch.randn(HQ, D, dtype=F16, device=DEVICE)
    k = torch.randn(200, HK, D, dtype=F16, device=DEVICE)
    v = torch.randn(200, HK, D, dtype=F16, device=DEVICE)
    out = torch.empty(HQ, D, dtype=F16, device=DEVICE)

    def forward():  # two "layers" of the same shapes share the captured plan
        out.copy_(fi.single_decode_with_kv_cache(q, k, v))
        out.add_(fi.single_decode_with_kv_cache(q, k, v))

    graph = Graph(forward)
    fi.single_decode_with_kv_cache(q, k[:37], v[:37])  # re-plans a new cached plan
    q.copy_(torch.randn(HQ, D, dtype=F16))
    graph.replay()
    synchronize()
    ref_o, _ = reference.attention(q[None].cpu(), k.cpu(), v.cpu())
    assert_close(out, 2 * ref_o[0], F16)
    with pytest.raises(RuntimeError, match="warm-up"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fi.single_decode_with_kv_cache(q, k[:55], v[:55])


def test_empty_requests_give_zero_and_minus_inf(fi):
    """Requests with no pages (the padding of a graph batch): output 0, LSE -inf."""
    w, _ = decode_graph_wrapper(fi, 3)
    indptr, indices, last = batches.page_table([0, 40, 0], PAGE, num_pages=POOL)
    w.plan(indptr, indices, last, HQ, HK, D, PAGE, q_data_type=F16)
    q = torch.randn(3, HQ, D, dtype=F16, device=DEVICE)
    kv = on_gpu(make_cache(POOL, PAGE, HK, D, F16, "NHD", True))
    o, lse = w.run(q, kv, return_lse=True)
    assert torch.equal(o[[0, 2]].cpu(), torch.zeros(2, HQ, D, dtype=F16))
    assert torch.isneginf(lse[[0, 2]]).all()
