"""single_decode_with_kv_cache, single_prefill_with_kv_cache(_return_lse)."""

import pytest
import torch

import reference
from conftest import assert_close, assert_lse_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def to_layout(x, layout):
    """NHD [n, H, D] -> HND [H, n, D] as a transposed view (not contiguous)."""
    return x if layout == "NHD" else x.transpose(0, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2), (4, 1)])
def test_single_decode(fi, backend, dtype, layout, heads):
    hq, hk = heads
    q = torch.randn(hq, 128, dtype=dtype)
    k = torch.randn(77, hk, 128, dtype=dtype)
    v = torch.randn(77, hk, 128, dtype=dtype)
    o, lse = fi.single_decode_with_kv_cache(
        backend(q),
        backend(to_layout(k, layout)),
        backend(to_layout(v, layout)),
        kv_layout=layout,
        return_lse=True,
    )
    ref_o, ref_lse = reference.attention(q[None], k, v)
    assert tuple(o.shape) == (hq, 128) and tuple(lse.shape) == (hq,)
    assert type(o) is type(backend(q))
    assert_close(o, ref_o[0], dtype)
    assert_lse_close(lse, ref_lse[0], dtype)


@pytest.mark.parametrize(
    "options",
    [
        dict(window_left=20),
        dict(logits_soft_cap=30.0),
        dict(sm_scale=0.05),
        dict(pos_encoding_mode="ALIBI"),
        dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=1e4, rope_scale=2.0),
    ],
)
def test_single_decode_variants(fi, backend, options):
    q = torch.randn(8, 64)
    k = torch.randn(50, 2, 64)
    v = torch.randn(50, 2, 64)
    o = fi.single_decode_with_kv_cache(backend(q), backend(k), backend(v), **options)
    ref = dict(
        window_left=options.get("window_left", -1),
        logits_soft_cap=options.get("logits_soft_cap", 0.0),
        sm_scale=options.get("sm_scale"),
        alibi=options.get("pos_encoding_mode") == "ALIBI",
    )
    if options.get("pos_encoding_mode") == "ROPE_LLAMA":
        ref["rope_llama"] = (options["rope_scale"], options["rope_theta"])
    ref_o, _ = reference.attention(q[None], k, v, **ref)
    assert_close(o, ref_o[0], torch.float32)


def test_single_decode_scales(fi):
    """q_scale/k_scale multiply the softmax scale; v_scale the output (as FlashInfer)."""
    q, k, v = torch.randn(4, 64), torch.randn(30, 4, 64), torch.randn(30, 4, 64)
    o = fi.single_decode_with_kv_cache(q, k, v, q_scale=0.5, k_scale=2.0, v_scale=3.0)
    ref_o, _ = reference.attention(q[None], k, v, sm_scale=0.5 * 2.0 / 8.0)
    assert_close(o, 3.0 * ref_o[0], torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [(1, 1), (17, 17), (33, 90), (64, 200)])
def test_single_prefill(fi, backend, dtype, layout, causal, lens):
    qo_len, kv_len = lens
    q = torch.randn(qo_len, 8, 64, dtype=dtype)
    k = torch.randn(kv_len, 2, 64, dtype=dtype)
    v = torch.randn(kv_len, 2, 64, dtype=dtype)
    o, lse = fi.single_prefill_with_kv_cache(
        backend(q),
        backend(to_layout(k, layout)),
        backend(to_layout(v, layout)),
        causal=causal,
        kv_layout=layout,
        return_lse=True,
    )
    ref_o, ref_lse = reference.attention(q, k, v, causal=causal)
    assert_close(o, ref_o, dtype)
    assert_lse_close(lse, ref_lse, dtype)


def test_single_prefill_return_lse_partial(fi, backend):
    q, k, v = torch.randn(5, 4, 64), torch.randn(9, 4, 64), torch.randn(9, 4, 64)
    o, lse = fi.single_prefill_with_kv_cache_return_lse(backend(q), backend(k), backend(v))
    ref_o, ref_lse = reference.attention(q, k, v)
    assert_close(o, ref_o, torch.float32)
    assert_lse_close(lse, ref_lse, torch.float32)


@pytest.mark.parametrize("packed", [False, True])
def test_single_prefill_custom_mask(fi, backend, packed):
    qo_len, kv_len = 13, 40
    q, k, v = torch.randn(qo_len, 4, 64), torch.randn(kv_len, 2, 64), torch.randn(kv_len, 2, 64)
    mask = torch.rand(qo_len, kv_len) > 0.4
    mask[3] = False  # a row that sees nothing: output 0, lse -inf
    if packed:
        bits = fi.packbits(backend(mask.reshape(-1)), bitorder="little")
        o, lse = fi.single_prefill_with_kv_cache(
            backend(q), backend(k), backend(v), packed_custom_mask=bits, return_lse=True
        )
    else:
        o, lse = fi.single_prefill_with_kv_cache(
            backend(q), backend(k), backend(v), custom_mask=backend(mask), return_lse=True
        )
    ref_o, ref_lse = reference.attention(q, k, v, mask=mask)
    assert_close(o, ref_o, torch.float32)
    assert_lse_close(lse, ref_lse, torch.float32)


@pytest.mark.parametrize(
    "options",
    [
        dict(causal=True, window_left=7),
        dict(logits_soft_cap=20.0, causal=True),
        dict(pos_encoding_mode="ALIBI", causal=True),
        dict(pos_encoding_mode="ROPE_LLAMA", causal=True, rope_theta=5e5, rope_scale=1.0),
    ],
)
def test_single_prefill_variants(fi, options):
    q, k, v = torch.randn(20, 4, 64), torch.randn(45, 4, 64), torch.randn(45, 4, 64)
    o = fi.single_prefill_with_kv_cache(q, k, v, **options)
    ref = dict(
        causal=True,
        window_left=options.get("window_left", -1),
        logits_soft_cap=options.get("logits_soft_cap", 0.0),
        alibi=options.get("pos_encoding_mode") == "ALIBI",
    )
    if options.get("pos_encoding_mode") == "ROPE_LLAMA":
        ref["rope_llama"] = (options["rope_scale"], options["rope_theta"])
    ref_o, _ = reference.attention(q, k, v, **ref)
    assert_close(o, ref_o, torch.float32)


def test_single_prefill_head_dim_vo(fi):
    q, k, v = torch.randn(6, 4, 128), torch.randn(10, 4, 128), torch.randn(10, 4, 64)
    o = fi.single_prefill_with_kv_cache(q, k, v, causal=True)
    assert tuple(o.shape) == (6, 4, 64)
    assert_close(o, reference.attention(q, k, v, causal=True)[0], torch.float32)


def test_single_prefill_o_dtype(fi):
    q, k, v = (torch.randn(6, 4, 64, dtype=torch.float16) for _ in range(3))
    o = fi.single_prefill_with_kv_cache(q, k, v, o_dtype=torch.float32)
    assert o.dtype == torch.float32
    assert_close(o, reference.attention(q, k, v)[0], torch.float16)


def test_single_non_contiguous_views(fi):
    """Strided views go to the kernels as they are: a slice of a wider qkv buffer."""
    qkv = torch.randn(30, 8 + 2 + 2, 64)
    q, k, v = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]
    assert not q.is_contiguous()
    o = fi.single_prefill_with_kv_cache(q, k, v, causal=True)
    assert_close(o, reference.attention(q, k, v, causal=True)[0], torch.float32)
