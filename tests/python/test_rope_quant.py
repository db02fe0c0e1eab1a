"""rope_quantize_fp8 / mla_rope_quantize_fp8 / rope_quantize_fp8_append_paged_kv_cache
on numpy arrays against a numpy reference that computes in float32 as the
library does (x c - x' s, times the scale, clipped, rounded to FP8 by
ml_dtypes): the FP8 codes must be equal."""

import ml_dtypes
import numpy as np
import pytest

FP8 = {"e4m3": (ml_dtypes.float8_e4m3fn, 448.0), "e5m2": (ml_dtypes.float8_e5m2, 57344.0)}


def cos_sin_cache(max_pos, rot):
    inv = 1e4 ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def rope_ref(x, cs, pos, neox):
    """x [nnz, H, R] (or [nnz, R]) turned in float32 by rows cs[pos]."""
    x = x.astype(np.float32)
    r = x.shape[-1]
    c = cs[pos, : r // 2].astype(np.float32)
    s = cs[pos, r // 2 :].astype(np.float32)
    if x.ndim == 3:
        c, s = c[:, None, :], s[:, None, :]
    if neox:
        a, b = x[..., : r // 2], x[..., r // 2 :]
    else:
        a, b = x[..., 0::2], x[..., 1::2]
    ya, yb = a * c - b * s, b * c + a * s
    y = np.empty_like(x)
    if neox:
        y[..., : r // 2], y[..., r // 2 :] = ya, yb
    else:
        y[..., 0::2], y[..., 1::2] = ya, yb
    return y


def fp8(y, scale, name):
    dt, m = FP8[name]
    return np.clip(y.astype(np.float32) * np.float32(scale), -m, m).astype(dt)


def same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("fp8_name", ["e4m3", "e5m2"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("shape", [(5, 4, 2, 64, 32), (7, 8, 0, 64, 96), (3, 2, 2, 32, 0)])
def test_rope_quantize_fp8(fi, fp8_name, neox, shape):
    nnz, hq, hk, rot, nope = shape
    rng = np.random.default_rng(0)
    mla = hk == 0
    kshape = (nnz,) if mla else (nnz, hk)
    q_rope = rng.uniform(-2, 2, (nnz, hq, rot)).astype(np.float32)
    k_rope = rng.uniform(-2, 2, kshape + (rot,)).astype(np.float32)
    q_nope = rng.uniform(-2, 2, (nnz, hq, nope)).astype(np.float32) if nope else None
    k_nope = rng.uniform(-2, 2, kshape + (nope,)).astype(np.float32) if nope else None
    cs = cos_sin_cache(256, rot)
    pos = rng.integers(0, 256, nnz).astype(np.int32)
    fn = fi.mla_rope_quantize_fp8 if mla else fi.rope_quantize_fp8
    qr, kr, qn, kn = fn(q_rope, k_rope, q_nope, k_nope, cs, pos, is_neox=neox,
                        quantize_dtype=FP8[fp8_name][0], quant_scale_q=0.5, quant_scale_kv=3.0)
    same(qr, fp8(rope_ref(q_rope, cs, pos, neox), 0.5, fp8_name))
    same(kr, fp8(rope_ref(k_rope, cs, pos, neox), 3.0, fp8_name))
    if nope:
        same(qn, fp8(q_nope, 0.5, fp8_name))
        same(kn, fp8(k_nope, 3.0, fp8_name))
    else:
        assert qn.shape == (nnz, hq, 0) and kn.shape == kshape + (0,)


def test_rope_quantize_fp8_sliced_outputs(fi):
    """Outputs as the two column ranges of one [nnz, H, R + N] FP8 tensor."""
    rng = np.random.default_rng(1)
    nnz, h, rot, nope = 6, 3, 32, 64
    q_rope = rng.uniform(-2, 2, (nnz, h, rot)).astype(np.float16)
    q_nope = rng.uniform(-2, 2, (nnz, h, nope)).astype(np.float16)
    k_rope = rng.uniform(-2, 2, (nnz, rot)).astype(np.float16)
    k_nope = rng.uniform(-2, 2, (nnz, nope)).astype(np.float16)
    cs, pos = cos_sin_cache(64, rot), rng.integers(0, 64, nnz).astype(np.int32)
    q_out = np.zeros((nnz, h, rot + nope), dtype=ml_dtypes.float8_e4m3fn)
    k_out = np.zeros((nnz, rot + nope), dtype=ml_dtypes.float8_e4m3fn)
    fi.rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cs, pos,
                         q_rope_out=q_out[..., :rot], q_nope_out=q_out[..., rot:],
                         k_rope_out=k_out[..., :rot], k_nope_out=k_out[..., rot:])
    same(q_out[..., :rot], fp8(rope_ref(q_rope, cs, pos, True), 1.0, "e4m3"))
    same(q_out[..., rot:], fp8(q_nope, 1.0, "e4m3"))
    same(k_out[..., rot:], fp8(k_nope, 1.0, "e4m3"))


def page_table(rng, nnz, page_size, batch=3):
    """Each request's new tokens after some earlier ones; pages shuffled."""
    req = np.sort(rng.integers(0, batch, nnz)).astype(np.int32)
    pre = rng.integers(0, 2 * page_size, batch)
    pos = np.array([pre[b] + np.sum(req[:i] == b) for i, b in enumerate(req)], dtype=np.int32)
    npages = [(pre[b] + np.sum(req == b) + page_size - 1) // page_size for b in range(batch)]
    indptr = np.concatenate([[0], np.cumsum(npages)]).astype(np.int32)
    pages = int(indptr[-1]) + 2
    indices = rng.permutation(pages)[: indptr[-1]].astype(np.int32)
    return req, pos, indptr, indices, pages


def slot_of(req, pos, indptr, indices, page_size, t):
    return indices[indptr[req[t]] + pos[t] // page_size], pos[t] % page_size


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_append_gqa(fi, layout, page_size):
    rng = np.random.default_rng(2)
    nnz, hq, hk, rot, nope = 9, 8, 2, 64, 64
    q_rope = rng.uniform(-2, 2, (nnz, hq, rot)).astype(np.float32)
    q_nope = rng.uniform(-2, 2, (nnz, hq, nope)).astype(np.float32)
    k_rope = rng.uniform(-2, 2, (nnz, hk, rot)).astype(np.float32)
    k_nope = rng.uniform(-2, 2, (nnz, hk, nope)).astype(np.float32)
    v = rng.uniform(-2, 2, (nnz, hk, rot + nope)).astype(np.float32)
    cs, pos_ids = cos_sin_cache(128, rot), rng.integers(0, 128, nnz).astype(np.int32)
    req, pos, indptr, indices, pages = page_table(rng, nnz, page_size)
    shape = (pages, page_size, hk, rot + nope) if layout == "NHD" else (pages, hk, page_size, rot + nope)
    k_cache = np.zeros(shape, dtype=ml_dtypes.float8_e5m2)
    v_cache = np.zeros(shape, dtype=ml_dtypes.float8_e5m2)
    qr, qn = fi.rope_quantize_fp8_append_paged_kv_cache(
        q_rope, k_rope, q_nope, k_nope, v, cs, pos_ids, (k_cache, v_cache), indices, indptr,
        req, pos, quantize_dtype=ml_dtypes.float8_e5m2, quant_scale_kv=0.25,
        page_size=page_size, kv_layout=layout)
    same(qr, fp8(rope_ref(q_rope, cs, pos_ids, True), 1.0, "e5m2"))
    same(qn, fp8(q_nope, 1.0, "e5m2"))
    kref = np.concatenate([rope_ref(k_rope, cs, pos_ids, True), k_nope], axis=-1)
    kq, vq = fp8(kref, 0.25, "e5m2"), fp8(v, 0.25, "e5m2")
    for t in range(nnz):
        page, slot = slot_of(req, pos, indptr, indices, page_size, t)
        kc = k_cache[page, slot] if layout == "NHD" else k_cache[page, :, slot]
        vc = v_cache[page, slot] if layout == "NHD" else v_cache[page, :, slot]
        same(kc, kq[t])
        same(vc, vq[t])


def test_append_mla(fi):
    rng = np.random.default_rng(3)
    nnz, hq, rot, nope, page_size = 7, 16, 64, 512, 16
    q_rope = rng.uniform(-2, 2, (nnz, hq, rot)).astype(np.float16)
    q_nope = rng.uniform(-2, 2, (nnz, hq, nope)).astype(np.float16)
    k_rope = rng.uniform(-2, 2, (nnz, rot)).astype(np.float16)
    k_nope = rng.uniform(-2, 2, (nnz, nope)).astype(np.float16)
    cs, pos_ids = cos_sin_cache(64, rot), rng.integers(0, 64, nnz).astype(np.int32)
    req, pos, indptr, indices, pages = page_table(rng, nnz, page_size)
    ckv = np.zeros((pages, page_size, nope), dtype=ml_dtypes.float8_e4m3fn)
    kpe = np.zeros((pages, page_size, rot), dtype=ml_dtypes.float8_e4m3fn)
    fi.rope_quantize_fp8_append_paged_kv_cache(
        q_rope, k_rope, q_nope, k_nope, None, cs, pos_ids, (ckv, kpe), indices, indptr, req, pos,
        is_neox=False, page_size=page_size)
    kr = fp8(rope_ref(k_rope, cs, pos_ids, False), 1.0, "e4m3")
    for t in range(nnz):
        page, slot = slot_of(req, pos, indptr, indices, page_size, t)
        same(kpe[page, slot], kr[t])
        same(ckv[page, slot], fp8(k_nope[t], 1.0, "e4m3"))


def test_errors(fi):
    rng = np.random.default_rng(4)
    q = rng.uniform(-2, 2, (2, 2, 8)).astype(np.float32)
    k = rng.uniform(-2, 2, (2, 1, 8)).astype(np.float32)
    cs, pos = cos_sin_cache(4, 8), np.array([0, 4], dtype=np.int32)
    with pytest.raises(Exception, match="pos_ids\\[1\\]=4 is not a row of cos_sin_cache"):
        fi.rope_quantize_fp8(q, k, None, None, cs, pos)
    with pytest.raises(ValueError, match="quantize_dtype"):
        fi.rope_quantize_fp8(q, k, None, None, cs, pos, quantize_dtype=np.float16)
    with pytest.raises(ValueError, match="needs v"):
        fi.rope_quantize_fp8_append_paged_kv_cache(
            q, k, None, None, None, cs, pos, (None, None), pos, pos, pos, pos)
