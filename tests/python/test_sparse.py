"""BlockSparseAttentionWrapper and VariableBlockSparseAttentionWrapper
against dense attention with the equivalent element mask."""

import pytest
import torch

import reference
from conftest import assert_close, assert_lse_close


def bsr_dense_mask(indptr, indices, M, N, R, C, block_masks=None):
    dense = torch.zeros(M, N, dtype=torch.bool)
    for i in range(len(indptr) - 1):
        for e in range(int(indptr[i]), int(indptr[i + 1])):
            j = int(indices[e])
            rows, cols = slice(i * R, min((i + 1) * R, M)), slice(j * C, min((j + 1) * C, N))
            block = torch.ones(R, C, dtype=torch.bool) if block_masks is None else block_masks[e]
            h, w = rows.stop - rows.start, cols.stop - cols.start
            dense[rows, cols] = block[:h, :w]
    return dense


def random_bsr(MB, NB, density=0.5):
    blocks = torch.rand(MB, NB) < density
    indptr = torch.zeros(MB + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(blocks.sum(1), 0)
    indices = torch.cat([torch.nonzero(row).flatten() for row in blocks]).int()
    return indptr, indices


@pytest.mark.parametrize("shape", [(64, 96, 16, 32), (50, 70, 16, 16), (8, 8, 1, 1)])
@pytest.mark.parametrize("element_mask", [False, True])
def test_block_sparse(fi, backend, shape, element_mask):
    M, N, R, C = shape
    MB, NB = -(-M // R), -(-N // C)
    indptr, indices = random_bsr(MB, NB)
    hq, hk, d = 4, 2, 64
    q, k, v = torch.randn(M, hq, d), torch.randn(N, hk, d), torch.randn(N, hk, d)
    masks = (torch.rand(len(indices), R, C) > 0.3) if element_mask else None
    w = fi.BlockSparseAttentionWrapper(backend(torch.empty(1)))
    w.plan(
        backend(indptr),
        backend(indices),
        M,
        N,
        R,
        C,
        hq,
        hk,
        d,
        mask=None if masks is None else backend(masks),
        q_data_type="float32",
        o_data_type="float32",
    )
    o, lse = w.run(backend(q), backend(k), backend(v), return_lse=True)
    dense = bsr_dense_mask(indptr, indices, M, N, R, C, masks)
    ref_o, ref_lse = reference.attention(q, k, v, mask=dense)
    assert_close(o, ref_o, torch.float32)
    assert_lse_close(lse, ref_lse, torch.float32)


def test_block_sparse_example(fi):
    """FlashInfer's docstring example: [[0,0,1],[1,0,1],[0,1,1]] with 1x1 blocks."""
    indptr = torch.tensor([0, 1, 3, 5], dtype=torch.int32)
    indices = torch.tensor([2, 0, 2, 1, 2], dtype=torch.int32)
    q, k, v = torch.randn(3, 4, 64), torch.randn(3, 4, 64), torch.randn(3, 4, 64)
    w = fi.BlockSparseAttentionWrapper(torch.empty(1))
    w.plan(
        indptr, indices, 3, 3, 1, 1, 4, 4, 64, q_data_type=torch.float32, o_data_type=torch.float32
    )
    mask = torch.tensor([[0, 0, 1], [1, 0, 1], [0, 1, 1]], dtype=torch.bool)
    o_ref = fi.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    assert_close(w.run(q, k, v), o_ref.double(), torch.float32)


@pytest.mark.parametrize("heads", [(4, 4), (8, 2)])
def test_variable_block_sparse(fi, backend, heads):
    hq, hk = heads
    d = 64
    row_sz = torch.stack([torch.tensor([1, 2, 3, 10]), torch.tensor([4, 4, 4, 4])] * 4)[:hk].int()
    col_sz = torch.stack([torch.tensor([3, 1, 2, 20, 6]), torch.tensor([8, 8, 8, 4, 4])] * 4)[
        :hk
    ].int()
    blocks = torch.rand(hk, 4, 5) > 0.4
    qo_len, kv_len = 16, 32
    q = torch.randn(hq, qo_len, d)
    k, v = torch.randn(hk, kv_len, d), torch.randn(hk, kv_len, d)
    w = fi.VariableBlockSparseAttentionWrapper(backend(torch.empty(1)))
    w.plan(backend(blocks), backend(row_sz), backend(col_sz), hq, hk, d, q_data_type="float32")
    o, lse = w.run(backend(q), backend(k), backend(v), return_lse=True)
    assert tuple(o.shape) == (hq, qo_len, d) and tuple(lse.shape) == (hq, qo_len)
    group = hq // hk
    for h in range(hq):
        kh = h // group
        dense = torch.zeros(qo_len, kv_len, dtype=torch.bool)
        r0 = 0
        for i, rs in enumerate(row_sz[kh].tolist()):
            c0 = 0
            for j, cs in enumerate(col_sz[kh].tolist()):
                if blocks[kh, i, j]:
                    dense[r0 : r0 + rs, c0 : c0 + cs] = True
                c0 += cs
            r0 += rs
        ref_o, ref_lse = reference.attention(
            q[h][:, None], k[kh][:, None], v[kh][:, None], mask=dense
        )
        assert_close(backend.torch(o)[h], ref_o[:, 0], torch.float32)
        assert_lse_close(backend.torch(lse)[h], ref_lse[:, 0], torch.float32)
