"""BatchAttention: mixed prefill and decode requests, KV lengths from kv_len_arr."""

import pytest
import torch

import batches
import reference
from conftest import assert_close, assert_lse_close
from test_batch_decode import make_cache


@pytest.mark.parametrize("causal", [False, True])
def test_batch_attention(fi, backend, causal):
    page_size, hq, hk, d = 8, 8, 2, 128
    qo_lens, kv_lens = [1, 12, 1, 40], [50, 12, 9, 64]
    qo_indptr = batches.indptr_of(qo_lens)
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, hk, d, torch.bfloat16, "NHD", True)
    q = torch.randn(sum(qo_lens), hq, d, dtype=torch.bfloat16)
    w = fi.BatchAttention(kv_layout="NHD", device="cpu")
    kv_len_arr = torch.tensor(kv_lens, dtype=torch.int32)
    w.plan(
        backend(qo_indptr),
        backend(indptr),
        backend(indices),
        backend(kv_len_arr),
        hq,
        hk,
        d,
        d,
        page_size,
        causal=causal,
    )
    o, lse = w.run(backend(q), backend(kv))
    for i in range(len(kv_lens)):
        k = batches.gather(kv[:, 0], indptr, indices, last, page_size, i)
        v = batches.gather(kv[:, 1], indptr, indices, last, page_size, i)
        rows = slice(int(qo_indptr[i]), int(qo_indptr[i + 1]))
        ref_o, ref_lse = reference.attention(q[rows], k, v, causal=causal)
        assert_close(backend.torch(o)[rows], ref_o, torch.bfloat16)
        assert_lse_close(backend.torch(lse)[rows], ref_lse, torch.bfloat16)


def test_batch_attention_soft_cap_at_run(fi):
    page_size, h, d = 4, 4, 64
    indptr, indices, last = batches.page_table([10, 3], page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(2, h, d)
    w = fi.BatchAttention(device="cpu")
    w.plan(
        batches.indptr_of([1, 1]),
        indptr,
        indices,
        torch.tensor([10, 3], dtype=torch.int32),
        h,
        h,
        d,
        d,
        page_size,
        q_data_type=torch.float32,
        kv_data_type=torch.float32,
    )
    o, _ = w.run(q, kv, logits_soft_cap=5.0)
    for i in range(2):
        k = batches.gather(kv[:, 0], indptr, indices, last, page_size, i)
        v = batches.gather(kv[:, 1], indptr, indices, last, page_size, i)
        ref_o, _ = reference.attention(q[i : i + 1], k, v, logits_soft_cap=5.0)
        assert_close(o[i : i + 1], ref_o, torch.float32)


def test_batch_attention_bad_kv_len(fi):
    w = fi.BatchAttention(device="cpu")
    indptr, indices, _ = batches.page_table([10], 4)
    with pytest.raises(ValueError, match="kv_len_arr"):
        w.plan(
            batches.indptr_of([1]),
            indptr,
            indices,
            torch.tensor([13], dtype=torch.int32),
            4,
            4,
            64,
            64,
            4,
        )
