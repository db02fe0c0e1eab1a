"""The composable-format wrappers on CUDA tensors: MultiLevelCascadeAttentionWrapper
(fi_cascade_*, eager and replayed in a CUDA graph over new plans), the paged
wrappers' prefix_detection (fi_cascade_create_auto), and both block-sparse
wrappers (fi_bsr_*), against fp64 references on the host."""

import pytest
import torch

import batches
import reference
from conftest import DEVICE, GPU_MARKS, Graph, assert_close, assert_lse_close, on_gpu, synchronize
from test_batch_decode import make_cache
from test_composable import (
    bsr_keys,
    gathered_mask,
    i32,
    page_run,
    radix_batch,
    random_bsr,
    variable_mask,
)

pytestmark = GPU_MARKS

F16 = torch.float16


def cascade_batch(batch, page_size, order):
    """Levels: 21 shared tokens, two groups (10 and 7 tokens), own tokens 1..."""
    lv0, at = page_run([21], page_size, order, 0)
    half = batch // 2
    lv1, at = page_run([10, 7], page_size, order, at)
    lv2, _ = page_run([3 + 5 * i for i in range(batch)], page_size, order, at)
    qo = [i32([0, batch]), i32([0, half, batch]), torch.arange(batch + 1, dtype=torch.int32)]
    return qo, [lv0, lv1, lv2], half


def cascade_reference(q, kv, levels, half, page_size):
    outs = []
    for i in range(q.shape[0]):
        parts = [(levels[0], 0), (levels[1], 0 if i < half else 1), (levels[2], i)]
        k = torch.cat([batches.gather(kv[:, 0], *lv, page_size, r) for lv, r in parts])
        v = torch.cat([batches.gather(kv[:, 1], *lv, page_size, r) for lv, r in parts])
        outs.append(reference.attention(q[i : i + 1], k, v, causal=True)[0])
    return torch.cat(outs)


def plan_cascade(w, qo, levels, heads, page_size):
    hq, hk, d = heads
    tables = [[on_gpu(lv[j]) for lv in levels] for j in range(3)]
    w.plan([on_gpu(x) for x in qo], *tables, hq, hk, d, page_size, causal=True, q_data_type=F16)


def test_cascade_three_levels(fi):
    page_size, heads = 16, (8, 2, 128)
    kv = make_cache(64, page_size, 2, 128, F16, "NHD", True)
    qo, levels, half = cascade_batch(6, page_size, torch.randperm(64).int())
    q = torch.randn(6, 8, 128, dtype=F16)
    w = fi.MultiLevelCascadeAttentionWrapper(3, torch.empty(1, device=DEVICE))
    plan_cascade(w, qo, levels, heads, page_size)
    o = w.run(on_gpu(q), on_gpu(kv))
    synchronize()
    assert w.plan_info()["num_levels"] == 3
    assert_close(o, cascade_reference(q, kv, levels, half, page_size), F16)


def test_cascade_graph_replay(fi):
    """use_cuda_graph=True: one capture, replayed after each plan() of a new batch."""
    page_size, heads, batch = 16, (8, 2, 128), 6
    kv = on_gpu(make_cache(64, page_size, 2, 128, F16, "NHD", True))
    bufs = [
        [torch.zeros(n, dtype=torch.int32, device=DEVICE) for n in sizes]
        for sizes in ((2, 3, batch + 1), (2, 3, batch + 1), (8, 8, 40), (1, 2, batch))
    ]
    w = fi.MultiLevelCascadeAttentionWrapper(3, torch.empty(1, device=DEVICE), "NHD", True, *bufs)
    q = on_gpu(torch.randn(batch, 8, 128, dtype=F16))
    result = {}
    graph = None
    for step in range(3):
        qo, levels, half = cascade_batch(batch, page_size, torch.randperm(64).int())
        plan_cascade(w, qo, levels, heads, page_size)
        if graph is None:
            graph = Graph(lambda: result.__setitem__("o", w.run(q, kv)))
        graph.replay()
        synchronize()
        ref = cascade_reference(q.cpu(), kv.cpu(), levels, half, page_size)
        assert_close(result["o"], ref, F16, what=f"step {step}")


@pytest.mark.parametrize("mode", ["auto", "always"])
def test_prefix_detection_decode(fi, mode):
    page_size, hq, hk, d = 16, 8, 2, 128
    indptr, indices, last, num_pages = radix_batch(page_size)
    kv = make_cache(num_pages, page_size, hk, d, F16, "NHD", True)
    q = torch.randn(6, hq, d, dtype=F16)
    outs = []
    for detection in (None, mode):
        w = fi.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(1, device=DEVICE), prefix_detection=detection
        )
        w.plan(on_gpu(indptr), on_gpu(indices), on_gpu(last), hq, hk, d, page_size)
        outs.append(w.run(on_gpu(q), on_gpu(kv), return_lse=True))
    synchronize()
    if mode == "always":
        assert w.plan_info()["num_levels"] == 4
    assert_close(outs[1][0], outs[0][0].cpu().double(), F16)
    assert_lse_close(outs[1][1], outs[0][1].cpu().double(), F16)


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse(fi, causal):
    M, N, R, C, hq, hk, d = 100, 200, 16, 16, 8, 2, 128
    MB, NB = -(-M // R), -(-N // C)
    indptr, indices = random_bsr(MB, NB, 0.3)
    masks = torch.rand(len(indices), R, C) > 0.3
    q, k, v = (torch.randn(n, h, d, dtype=F16) for n, h in ((M, hq), (N, hk), (N, hk)))
    w = fi.BlockSparseAttentionWrapper(torch.empty(1, device=DEVICE))
    w.plan(on_gpu(indptr), on_gpu(indices), M, N, R, C, hq, hk, d, mask=on_gpu(masks),
           causal=causal)  # fmt: skip
    o, lse = w.run(on_gpu(q), on_gpu(k), on_gpu(v), return_lse=True)
    synchronize()
    starts = [min(i * R, M) for i in range(MB + 1)]
    dense = gathered_mask(M, N, starts, bsr_keys(indptr, indices, N, C), causal)
    for i in range(MB):
        for e in range(int(indptr[i]), int(indptr[i + 1])):
            j, h, wd = int(indices[e]), min(R, M - i * R), min(C, N - int(indices[e]) * C)
            dense[i * R : i * R + h, j * C : j * C + wd] &= masks[e][:h, :wd]
    ref_o, ref_lse = reference.attention(q, k, v, mask=dense)
    assert_close(o, ref_o, F16)
    assert_lse_close(lse, ref_lse, F16)


def test_variable_block_sparse(fi):
    hq, hk, d, qo_len, kv_len = 8, 2, 128, 64, 96
    row_sz = i32([[16, 0, 32, 16], [8, 8, 16, 32]])
    col_sz = i32([[32, 16, 16, 32], [48, 16, 0, 32]])
    blocks = torch.rand(hk, 4, 4) > 0.4
    q = torch.randn(hq, qo_len, d, dtype=F16)
    k, v = torch.randn(hk, kv_len, d, dtype=F16), torch.randn(hk, kv_len, d, dtype=F16)
    w = fi.VariableBlockSparseAttentionWrapper(torch.empty(1, device=DEVICE))
    w.plan(on_gpu(blocks), on_gpu(row_sz), on_gpu(col_sz), hq, hk, d)
    o, lse = w.run(on_gpu(q), on_gpu(k), on_gpu(v), return_lse=True)
    synchronize()
    for h in range(hq):
        kh = h // (hq // hk)
        dense = variable_mask(blocks[kh], row_sz[kh], col_sz[kh], False)
        ref_o, ref_lse = reference.attention(
            q[h][:, None], k[kh][:, None], v[kh][:, None], mask=dense
        )
        assert_close(o[h], ref_o[:, 0], F16, what=f"head {h}")
        assert_lse_close(lse[h], ref_lse[:, 0], F16)
