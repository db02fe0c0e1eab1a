"""BatchPrefillWithPagedKVCacheWrapper and BatchPrefillWithRaggedKVCacheWrapper."""

import pytest
import torch

import batches
import reference
from conftest import assert_close, assert_lse_close
from test_batch_decode import as_backend, make_cache

QO_LENS = [1, 7, 33, 1, 64]
KV_LENS = [1, 20, 33, 90, 130]


def reference_batch(q, qo_indptr, keys, values, masks=None, **options):
    outs, lses = [], []
    for i in range(len(keys)):
        qi = q[qo_indptr[i] : qo_indptr[i + 1]]
        o, s = reference.attention(
            qi, keys[i], values[i], mask=None if masks is None else masks[i], **options
        )
        outs.append(o)
        lses.append(s)
    return torch.cat(outs), torch.cat(lses)


def paged_requests(kv, indptr, indices, last, page_size, layout):
    k_cache, v_cache = (kv[:, 0], kv[:, 1]) if isinstance(kv, torch.Tensor) else kv
    n = len(last)
    keys = [batches.gather(k_cache, indptr, indices, last, page_size, i, layout) for i in range(n)]
    values = [
        batches.gather(v_cache, indptr, indices, last, page_size, i, layout) for i in range(n)
    ]
    return keys, values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_prefill(fi, backend, dtype, layout, causal):
    page_size, hq, hk, d = 16, 8, 2, 64
    qo_indptr = batches.indptr_of(QO_LENS)
    indptr, indices, last = batches.page_table(KV_LENS, page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, hk, d, dtype, layout, five_d=True)
    q = torch.randn(int(qo_indptr[-1]), hq, d, dtype=dtype)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(backend(torch.empty(1)), layout)
    w.plan(
        backend(qo_indptr),
        backend(indptr),
        backend(indices),
        backend(last),
        hq,
        hk,
        d,
        page_size,
        causal=causal,
        q_data_type=dtype,
    )
    o, lse = w.run(backend(q), backend(kv), return_lse=True)
    keys, values = paged_requests(kv, indptr, indices, last, page_size, layout)
    ref_o, ref_lse = reference_batch(q, qo_indptr, keys, values, causal=causal)
    assert_close(o, ref_o, dtype)
    assert_lse_close(lse, ref_lse, dtype)


@pytest.mark.parametrize("packed", [False, True])
def test_paged_prefill_custom_mask(fi, backend, packed):
    page_size, h, d = 8, 4, 64
    qo_lens, kv_lens = [3, 10, 1], [9, 10, 30]
    qo_indptr = batches.indptr_of(qo_lens)
    indptr, indices, last = batches.page_table(kv_lens, page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", False)
    q = torch.randn(sum(qo_lens), h, d)
    masks = [torch.rand(a, b) > 0.3 for a, b in zip(qo_lens, kv_lens)]
    flat = torch.cat([m.reshape(-1) for m in masks])
    w = fi.BatchPrefillWithPagedKVCacheWrapper(backend(torch.empty(1)))
    kwargs = {}
    if packed:
        bit_indptr = batches.indptr_of([a * b for a, b in zip(qo_lens, kv_lens)])
        kwargs["packed_custom_mask"], _ = fi.segment_packbits(
            backend(flat), backend(bit_indptr), bitorder="little"
        )
    else:
        kwargs["custom_mask"] = backend(flat)
    w.plan(
        backend(qo_indptr),
        backend(indptr),
        backend(indices),
        backend(last),
        h,
        h,
        d,
        page_size,
        q_data_type="float32",
        **kwargs
    )
    o = w.run(backend(q), as_backend(backend, kv))
    keys, values = paged_requests(kv, indptr, indices, last, page_size, "NHD")
    ref_o, _ = reference_batch(q, qo_indptr, keys, values, masks)
    assert_close(o, ref_o, torch.float32)


@pytest.mark.parametrize(
    "options",
    [
        dict(causal=True, window_left=10),
        dict(causal=True, logits_soft_cap=25.0),
        dict(causal=True, pos_encoding_mode="ALIBI"),
        dict(causal=True, pos_encoding_mode="ROPE_LLAMA", rope_theta=1e4, rope_scale=1.0),
        dict(causal=False, sm_scale=0.2),
    ],
)
def test_paged_prefill_variants(fi, options):
    page_size, h, d = 16, 4, 64
    qo_indptr = batches.indptr_of(QO_LENS)
    indptr, indices, last = batches.page_table(KV_LENS, page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(int(qo_indptr[-1]), h, d)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1))
    w.plan(
        qo_indptr, indptr, indices, last, h, h, d, page_size, q_data_type=torch.float32, **options
    )
    o = w.run(q, kv)
    keys, values = paged_requests(kv, indptr, indices, last, page_size, "NHD")
    ref = dict(
        causal=options["causal"],
        window_left=options.get("window_left", -1),
        logits_soft_cap=options.get("logits_soft_cap", 0.0),
        sm_scale=options.get("sm_scale"),
        alibi=options.get("pos_encoding_mode") == "ALIBI",
    )
    if options.get("pos_encoding_mode") == "ROPE_LLAMA":
        ref["rope_llama"] = (1.0, 1e4)
    ref_o, _ = reference_batch(q, qo_indptr, keys, values, **ref)
    assert_close(o, ref_o, torch.float32)


def test_paged_prefill_deterministic_splits(fi):
    """fixed_split_size / disable_split_kv plan, and the same inputs give the same bits."""
    page_size, h, d = 16, 4, 64
    qo_indptr = batches.indptr_of([1, 1, 2])
    indptr, indices, last = batches.page_table([600, 40, 900], page_size)
    kv = make_cache(int(indices.max()) + 1, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(4, h, d)
    keys, values = paged_requests(kv, indptr, indices, last, page_size, "NHD")
    ref_o, _ = reference_batch(q, qo_indptr, keys, values, causal=True)
    for options in (dict(fixed_split_size=4), dict(disable_split_kv=True), {}):
        w = fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1))
        w.plan(
            qo_indptr,
            indptr,
            indices,
            last,
            h,
            h,
            d,
            page_size,
            causal=True,
            q_data_type=torch.float32,
            **options
        )
        a, b = w.run(q, kv), w.run(q, kv)
        assert torch.equal(a, b)
        assert_close(a, ref_o, torch.float32)
        if "fixed_split_size" in options:
            assert w.plan_info()["kv_chunk"] == 4 * page_size


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
def test_ragged_prefill(fi, backend, dtype, layout, causal):
    hq, hk, d = 8, 4, 128
    qo_indptr, kv_indptr = batches.indptr_of(QO_LENS), batches.indptr_of(KV_LENS)
    q = torch.randn(int(qo_indptr[-1]), hq, d, dtype=dtype)
    k = torch.randn(int(kv_indptr[-1]), hk, d, dtype=dtype)
    v = torch.randn(int(kv_indptr[-1]), hk, d, dtype=dtype)
    k_in = k if layout == "NHD" else k.transpose(0, 1).contiguous()
    v_in = v if layout == "NHD" else v.transpose(0, 1).contiguous()
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(backend(torch.empty(1)), layout)
    w.plan(backend(qo_indptr), backend(kv_indptr), hq, hk, d, causal=causal, q_data_type=dtype)
    o, lse = w.run(backend(q), backend(k_in), backend(v_in), return_lse=True)
    keys = [k[kv_indptr[i] : kv_indptr[i + 1]] for i in range(len(KV_LENS))]
    values = [v[kv_indptr[i] : kv_indptr[i + 1]] for i in range(len(KV_LENS))]
    ref_o, ref_lse = reference_batch(q, qo_indptr, keys, values, causal=causal)
    assert_close(o, ref_o, dtype)
    assert_lse_close(lse, ref_lse, dtype)


def test_ragged_prefill_custom_mask_and_head_dim_vo(fi, backend):
    qo_lens, kv_lens = [4, 6], [5, 11]
    qo_indptr, kv_indptr = batches.indptr_of(qo_lens), batches.indptr_of(kv_lens)
    q, k = torch.randn(10, 4, 128), torch.randn(16, 2, 128)
    v = torch.randn(16, 2, 64)
    masks = [torch.rand(a, b) > 0.5 for a, b in zip(qo_lens, kv_lens)]
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(backend(torch.empty(1)))
    w.plan(
        backend(qo_indptr),
        backend(kv_indptr),
        4,
        2,
        128,
        head_dim_vo=64,
        custom_mask=backend(torch.cat([m.reshape(-1) for m in masks])),
        q_data_type=torch.float32,
    )
    o = w.run(backend(q), backend(k), backend(v))
    assert tuple(o.shape) == (10, 4, 64)
    keys = [k[kv_indptr[i] : kv_indptr[i + 1]] for i in range(2)]
    values = [v[kv_indptr[i] : kv_indptr[i + 1]] for i in range(2)]
    assert_close(o, reference_batch(q, qo_indptr, keys, values, masks)[0], torch.float32)


def test_prefill_cuda_graph_mode(fi):
    batch, page_size, h, d = 2, 4, 4, 64
    with pytest.raises(ValueError, match="qo_indptr_buf"):
        fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1), use_cuda_graph=True)
    bufs = dict(
        qo_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32),
        paged_kv_indptr_buf=torch.zeros(batch + 1, dtype=torch.int32),
        paged_kv_indices_buf=torch.zeros(32, dtype=torch.int32),
        paged_kv_last_page_len_buf=torch.zeros(batch, dtype=torch.int32),
    )
    w = fi.BatchPrefillWithPagedKVCacheWrapper(torch.empty(1), "NHD", True, **bufs)
    qo_indptr = batches.indptr_of([5, 3])
    indptr, indices, last = batches.page_table([9, 30], page_size, num_pages=32)
    w.plan(
        qo_indptr, indptr, indices, last, h, h, d, page_size, causal=True, q_data_type=torch.float32
    )
    assert torch.equal(bufs["qo_indptr_buf"], qo_indptr)
    kv = make_cache(32, page_size, h, d, torch.float32, "NHD", True)
    q = torch.randn(8, h, d)
    keys, values = paged_requests(kv, indptr, indices, last, page_size, "NHD")
    assert_close(
        w.run(q, kv), reference_batch(q, qo_indptr, keys, values, causal=True)[0], torch.float32
    )
    # More query rows than the first plan: refused in CUDA-graph mode, as FlashInfer.
    with pytest.raises(ValueError, match="first plan"):
        w.plan(
            batches.indptr_of([5, 9]),
            indptr,
            indices,
            last,
            h,
            h,
            d,
            page_size,
            q_data_type=torch.float32,
        )


def test_strided_out_and_lse_are_written_in_place(fi, backend):
    """out / lse as strided views of larger buffers: written through, not copied."""
    qo_indptr, kv_indptr = batches.indptr_of([4, 3]), batches.indptr_of([6, 9])
    q, k, v = torch.randn(7, 4, 64), torch.randn(15, 4, 64), torch.randn(15, 4, 64)
    out_buf = torch.zeros(7, 4, 2 * 64)
    lse_buf = torch.zeros(2, 7, 4)
    out, lse = backend(out_buf)[:, :, 64:], backend(lse_buf)[1]
    w = fi.BatchPrefillWithRaggedKVCacheWrapper(backend(torch.empty(1)))
    w.plan(backend(qo_indptr), backend(kv_indptr), 4, 4, 64, causal=True, q_data_type=torch.float32)
    got_out, got_lse = w.run(backend(q), backend(k), backend(v), out=out, lse=lse, return_lse=True)
    assert got_out is out and got_lse is lse
    keys = [k[kv_indptr[i] : kv_indptr[i + 1]] for i in range(2)]
    values = [v[kv_indptr[i] : kv_indptr[i + 1]] for i in range(2)]
    ref_o, ref_lse = reference_batch(q, qo_indptr, keys, values, causal=True)
    assert_close(out_buf[:, :, 64:], ref_o, torch.float32)
    assert torch.equal(out_buf[:, :, :64], torch.zeros(7, 4, 64))
    assert_lse_close(lse_buf[1], ref_lse, torch.float32)
