"""fused_qk_rmsnorm_rope (per-head RMSNorm of query and key, then RoPE from
a cos/sin cache) and vLLM's packed fused_qk_norm_rope, on numpy arrays
against a float64 reference; torch CPU tensors where torch is installed
(tests/python/test_serving_ops.py runs the CUDA form on the GPU machine)."""

import zlib

import ml_dtypes
import numpy as np
import pytest

TOL = {np.float32: 2e-5, np.float16: 3e-3, ml_dtypes.bfloat16: 3e-2}


def cos_sin_cache(max_pos, rot):
    inv = 1e4 ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    ang = np.arange(max_pos, dtype=np.float64)[:, None] * inv[None, :]
    return np.concatenate([np.cos(ang), np.sin(ang)], axis=1).astype(np.float32)


def ref(x, w, eps, gemma, cs, pos, neox):
    """x [nnz, H, D] normalised per head by w [D], its first R dims turned."""
    x = x.astype(np.float64)
    w = w.astype(np.float64) + (1.0 if gemma else 0.0)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w
    r = cs.shape[1]
    c = cs[pos, : r // 2].astype(np.float64)[:, None, :]
    s = cs[pos, r // 2 :].astype(np.float64)[:, None, :]
    idx_a = np.arange(r // 2) if neox else np.arange(0, r, 2)
    idx_b = idx_a + r // 2 if neox else idx_a + 1
    a, b = y[..., idx_a].copy(), y[..., idx_b].copy()
    y[..., idx_a], y[..., idx_b] = a * c - b * s, b * c + a * s
    return y


def close(got, want, dtype):
    tol = TOL[dtype]
    got = np.asarray(got).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("shape", [(9, 4, 2, 128, 128), (5, 3, 1, 67, 32), (1, 1, 1, 2, 2)])
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_qk_rmsnorm_rope(fi, dtype, neox, gemma, shape, inplace):
    nnz, hq, hk, d, rot = shape
    rng = np.random.default_rng(zlib.crc32(repr((dtype, neox, gemma, shape)).encode()))
    q = rng.uniform(-2, 2, (nnz, hq * d)).astype(dtype)
    k = rng.uniform(-2, 2, (nnz, hk * d)).astype(dtype)
    qw = rng.uniform(-0.5, 1.5, d).astype(dtype)
    kw = rng.uniform(-0.5, 1.5, d).astype(np.float32)
    cs = cos_sin_cache(512, rot)
    pos = rng.integers(0, 512, nnz)  # int64: converted as FlashInfer does
    qr = ref(q.reshape(nnz, hq, d), qw, 1e-6, gemma, cs, pos, neox).reshape(nnz, -1)
    kr = ref(k.reshape(nnz, hk, d), kw, 1e-6, gemma, cs, pos, neox).reshape(nnz, -1)
    out = fi.fused_qk_rmsnorm_rope(pos, q, k, d, cs, qw, kw, is_neox=neox, gemma=gemma,
                                   inplace=inplace)
    if inplace:
        assert out is None
        qo, ko = q, k
    else:
        qo, ko = out
        assert qo.shape == q.shape and qo.dtype == q.dtype
    close(qo, qr, dtype)
    close(ko, kr, dtype)


@pytest.mark.parametrize("neox", [True, False])
def test_fused_qk_norm_rope_packed(fi, neox):
    """vLLM's form: q and k heads of one qkv tensor in place, v untouched."""
    nnz, hq, hk, hv, d = 6, 8, 2, 2, 64
    rng = np.random.default_rng(7)
    qkv = rng.uniform(-2, 2, (nnz, (hq + hk + hv) * d)).astype(ml_dtypes.bfloat16)
    before = qkv.copy()
    qw = rng.uniform(0.5, 1.5, d).astype(ml_dtypes.bfloat16)
    kw = rng.uniform(0.5, 1.5, d).astype(ml_dtypes.bfloat16)
    cs = cos_sin_cache(64, d)
    pos = rng.integers(0, 64, nnz).astype(np.int32)
    heads = before.reshape(nnz, hq + hk + hv, d)
    qr = ref(heads[:, :hq], qw, 1e-5, False, cs, pos, neox)
    kr = ref(heads[:, hq:hq + hk], kw, 1e-5, False, cs, pos, neox)
    assert fi.fused_qk_norm_rope(qkv, hq, hk, hv, d, 1e-5, qw, kw, cs, neox, pos) is None
    got = qkv.reshape(nnz, hq + hk + hv, d)
    close(got[:, :hq], qr, ml_dtypes.bfloat16)
    close(got[:, hq:hq + hk], kr, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(got[:, hq + hk:].view(np.uint16),
                                  heads[:, hq + hk:].view(np.uint16))


def test_strided_views_of_qkv(fi):
    """q and k as strided views into a packed qkv, written out of place."""
    nnz, hq, hk, d = 4, 4, 2, 32
    rng = np.random.default_rng(3)
    qkv = rng.uniform(-2, 2, (nnz, hq + 2 * hk, d)).astype(np.float32)
    q, k = qkv[:, :hq], qkv[:, hq:hq + hk]
    qw, kw = np.ones(d, np.float32), rng.uniform(0.5, 1.5, d).astype(np.float32)
    cs, pos = cos_sin_cache(16, 16), np.array([0, 3, 15, 7])
    qo, ko = fi.fused_qk_rmsnorm_rope(pos, q, k, d, cs, qw, kw, eps=1e-3)
    close(qo, ref(q, qw, 1e-3, False, cs, pos, True), np.float32)
    close(ko, ref(k, kw, 1e-3, False, cs, pos, True), np.float32)


def test_errors(fi):
    q = np.ones((2, 2, 8), np.float32)
    k = np.ones((2, 1, 8), np.float32)
    w = np.ones(8, np.float32)
    cs = cos_sin_cache(4, 8)
    with pytest.raises(Exception, match="positions\\[1\\]=4 is not a row of cos_sin_cache"):
        fi.fused_qk_rmsnorm_rope(np.array([0, 4]), q, k, 8, cs, w, w)
    with pytest.raises(Exception, match="q_weight.shape\\[0\\]=7, expected 8"):
        fi.fused_qk_rmsnorm_rope(np.array([0, 1]), q, k, 8, cs, w[:7], w)
    with pytest.raises(Exception, match="eps=-1"):
        fi.fused_qk_rmsnorm_rope(np.array([0, 1]), q, k, 8, cs, w, w, eps=-1.0)
    with pytest.raises(ValueError, match="expected \\[nnz, 32\\]"):
        fi.fused_qk_norm_rope(np.ones((2, 24), np.float32), 2, 1, 1, 8, 1e-6, w, w, cs,
                              True, np.array([0, 1]))


def test_torch_cpu(fi):
    torch = pytest.importorskip("torch")
    nnz, hq, hk, d = 5, 4, 2, 64
    q = torch.randn(nnz, hq * d, dtype=torch.bfloat16)
    k = torch.randn(nnz, hk * d, dtype=torch.bfloat16)
    qw, kw = torch.rand(d) + 0.5, torch.rand(d) + 0.5
    cs = torch.from_numpy(cos_sin_cache(128, 32))
    pos = torch.randint(0, 128, (nnz,))
    qr = ref(q.float().numpy().reshape(nnz, hq, d), qw.numpy(), 1e-6, False, cs.numpy(),
             pos.numpy(), True).reshape(nnz, -1)
    kr = ref(k.float().numpy().reshape(nnz, hk, d), kw.numpy(), 1e-6, False, cs.numpy(),
             pos.numpy(), True).reshape(nnz, -1)
    fi.fused_qk_rmsnorm_rope(pos, q, k, d, cs, qw, kw, inplace=True)
    close(q.float().numpy(), qr, ml_dtypes.bfloat16)
    close(k.float().numpy(), kr, ml_dtypes.bfloat16)
