"""flashinfer_c.norm / activation / sampling / topk against torch references
(FlashInfer's own test formulas), on torch CPU tensors, numpy arrays and,
where there is a GPU, torch CUDA tensors (the C library's CUDA kernels,
whose results are its CPU backend's: the same references hold, the same
tokens for the same seed)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, GPU_MARKS, Backend, assert_close

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rms_ref(x, w, eps=1e-6, gemma=False):
    x = x.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * (1.0 + w.double() if gemma else w.double())


class GpuBackend(Backend):
    """Hands the library torch tensors on the GPU tests' device."""

    def __init__(self):
        super().__init__("cuda")

    def __call__(self, t):
        return None if t is None else t.to(DEVICE)


@pytest.fixture(params=["torch", "numpy", pytest.param("cuda", marks=GPU_MARKS)])
def backend(request):
    return GpuBackend() if request.param == "cuda" else Backend(request.param)


def as_torch(x):
    """A result as a host torch tensor."""
    return x.cpu() if isinstance(x, torch.Tensor) else torch.from_numpy(np.asarray(x))


# ------------------------------------------------------------------ norms


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 111), (3, 4097), (5, 3, 64)])
@pytest.mark.parametrize("gemma", [False, True])
def test_rmsnorm(fi, backend, dtype, shape, gemma):
    x = torch.randn(*shape).to(dtype)
    w = torch.randn(shape[-1]).to(dtype)
    f = fi.gemma_rmsnorm if gemma else fi.rmsnorm
    y = f(backend(x), backend(w))
    assert_close(y, rms_ref(x, w, gemma=gemma), dtype)
    out = backend(torch.empty_like(x))
    assert f(backend(x), backend(w), out=out) is out
    assert_close(out, rms_ref(x, w, gemma=gemma), dtype)


def test_rmsnorm_strided(fi):
    x = torch.randn(6, 256)[:, :100]
    w = torch.randn(100)
    assert_close(fi.rmsnorm(x, w), rms_ref(x, w), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_rmsnorm(fi, backend, dtype, gemma):
    x = torch.randn(9, 300).to(dtype)
    r = torch.randn(9, 300).to(dtype)
    w = torch.randn(300).to(dtype)
    xs, rs = backend(x.clone()), backend(r.clone())
    (fi.gemma_fused_add_rmsnorm if gemma else fi.fused_add_rmsnorm)(xs, rs, backend(w))
    s = x.double() + r.double()
    assert_close(rs, s, dtype, "residual")
    assert_close(xs, rms_ref(s, w, gemma=gemma), dtype, "input")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scale", [0.01, 1.0, 10.0])
@pytest.mark.parametrize("fused", [False, True])
def test_rmsnorm_quant(fi, dtype, scale, fused):
    x = torch.randn(19, 500).to(dtype)
    r = torch.randn(19, 500).to(dtype)
    w = torch.randn(500).to(dtype)
    out = torch.empty(19, 500, dtype=torch.float8_e4m3fn)
    if fused:
        rr = r.clone()
        fi.fused_add_rmsnorm_quant(out, x, rr, w, scale)
        base = x.double() + r.double()
        assert_close(rr, base, dtype, "residual")
    else:
        fi.rmsnorm_quant(out, x, w, torch.tensor(scale))
        base = x
    ref = (rms_ref(base, w) / scale).clamp(-448, 448).float().to(torch.float8_e4m3fn)
    torch.testing.assert_close(out.float(), ref.float(), rtol=0.13, atol=0.02)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 129, 1024])
def test_layernorm(fi, dtype, hidden):
    x = torch.randn(5, hidden).to(dtype)
    g, b = torch.randn(hidden), torch.randn(hidden)
    ref = F.layer_norm(x.double(), (hidden,), g.double(), b.double(), 1e-6)
    assert_close(fi.layernorm(x, g, b, 1e-6), ref, dtype)


# ------------------------------------------------------------ activations


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("d", [1, 7, 4096])
def test_gated(fi, backend, dtype, kind, d):
    x = (torch.randn(5, 2 * d) * 3).to(dtype)
    a, b = x[..., :d].double(), x[..., d:].double()
    if kind == "silu":
        ref, f = F.silu(a) * b, fi.silu_and_mul
    else:
        approx = "tanh" if kind == "gelu_tanh" else "none"
        ref = F.gelu(a, approximate=approx) * b
        f = fi.gelu_tanh_and_mul if kind == "gelu_tanh" else fi.gelu_and_mul
    assert_close(f(backend(x)), ref, dtype)


# ----------------------------------------------------------------- softmax


@pytest.mark.parametrize("temperature", [None, 0.5, "tensor"])
def test_softmax(fi, backend, temperature):
    logits = torch.randn(6, 1000) * 4
    t = torch.rand(6) + 0.3 if temperature == "tensor" else temperature
    probs = fi.sampling.softmax(backend(logits), temperature=backend(t) if temperature == "tensor" else t)
    div = 1.0 if t is None else (t.unsqueeze(1) if temperature == "tensor" else t)
    assert_close(probs, torch.softmax(logits.double() / div, -1), torch.float32)


# ---------------------------------------------------------------- sampling


def normalized(batch, vocab):
    p = torch.rand(batch, vocab)
    return p / p.sum(-1, keepdim=True)


def top_p_mask(p, top_p):
    """Kept where the mass of larger values is below top_p x the row's mass
    (docs/SEMANTICS.md; FlashInfer's test formula up to its epsilon)."""
    p = p.double()
    sorted_prob, indices = torch.sort(p, descending=True)
    above = torch.cumsum(sorted_prob, dim=-1) - sorted_prob
    keep = above < top_p * p.sum(-1, keepdim=True)
    keep[:, 0] = True
    return torch.zeros_like(keep).scatter_(1, indices, keep)


def top_k_mask(p, k):
    pivot = torch.sort(p, descending=True).values[:, k - 1]
    return p >= pivot.unsqueeze(-1)


@pytest.mark.parametrize("vocab", [111, 32000])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_sampling_in_set(fi, backend, vocab, p):
    probs = normalized(8, vocab)
    mask = top_p_mask(probs, p)
    idx = torch.zeros(2000, dtype=torch.int32) + torch.arange(8, dtype=torch.int32).repeat(250)
    s = as_torch(fi.sampling.top_p_sampling_from_probs(backend(probs), p, indices=backend(idx)))
    assert mask[idx.long(), s.long()].all()


@pytest.mark.parametrize("k", [1, 10, 100])
def test_top_k_sampling_in_set(fi, backend, k):
    probs = normalized(8, 5000)
    s = as_torch(fi.sampling.top_k_sampling_from_probs(backend(probs), k))
    assert top_k_mask(probs, k)[torch.arange(8), s.long()].all()


def test_min_p_sampling_in_set(fi):
    probs = normalized(16, 1000)
    min_p = torch.rand(16) * 0.9
    s = fi.sampling.min_p_sampling_from_probs(probs, min_p)
    keep = probs >= (min_p * probs.max(-1).values).unsqueeze(-1)
    assert keep[torch.arange(16), s.long()].all()


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
@pytest.mark.parametrize("from_logits", [False, True])
def test_top_k_top_p_in_set(fi, order, from_logits):
    logits = torch.randn(16, 3000) * 3
    probs = torch.softmax(logits, -1)
    k, p = torch.randint(1, 50, (16,), dtype=torch.int32), torch.rand(16) * 0.9 + 0.05
    kmask = top_k_mask(probs, 1) & False
    for r in range(16):
        kmask[r] = top_k_mask(probs[r : r + 1], int(k[r]))[0]
    if order == "joint":
        pm = torch.stack([top_p_mask(probs[r : r + 1], float(p[r]))[0] for r in range(16)])
        mask = kmask & pm
    else:
        renorm = torch.where(kmask, probs, 0)
        renorm = renorm / renorm.sum(-1, keepdim=True)
        mask = torch.stack([top_p_mask(renorm[r : r + 1], float(p[r]))[0] for r in range(16)])
        mask &= kmask
    f = (fi.sampling.top_k_top_p_sampling_from_logits if from_logits
         else fi.sampling.top_k_top_p_sampling_from_probs)
    s = f(logits if from_logits else probs, k, p, filter_apply_order=order)
    assert mask[torch.arange(16), s.long()].all()


def test_frequencies(fi):
    """Draws from one row follow the renormalised top-k distribution."""
    w = torch.tensor([9, 1, 7, 3, 7, 2, 5, 8, 4, 6, 2, 3, 1, 5, 4, 2], dtype=torch.float32)
    n = 50000
    s = fi.sampling.top_k_sampling_from_probs(w[None], 3, indices=torch.zeros(n, dtype=torch.int32))
    counts = torch.bincount(s.long(), minlength=16).double()
    keep = w >= 7
    q = torch.where(keep, w, 0).double() / w[keep].sum()
    assert counts[~keep].sum() == 0
    chi2 = ((counts[keep] - n * q[keep]) ** 2 / (n * q[keep])).sum()
    assert chi2 < 40  # 3 degrees of freedom: p < 1e-7 for a right filter


def test_reproducible(fi, backend):
    probs = normalized(32, 2000)
    a = fi.sampling.top_p_sampling_from_probs(backend(probs), 0.8, seed=7, offset=3)
    b = fi.sampling.top_p_sampling_from_probs(backend(probs), 0.8, seed=7, offset=3)
    c = fi.sampling.top_p_sampling_from_probs(backend(probs), 0.8, seed=7, offset=4)
    assert (as_torch(a) == as_torch(b)).all() and not (as_torch(a) == as_torch(c)).all()
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    d = fi.sampling.sampling_from_probs(probs, generator=g1)
    e = fi.sampling.sampling_from_probs(probs, generator=g2)
    assert (d == e).all()


def test_indices_and_valid(fi):
    probs = normalized(4, 50)
    probs[2] = 0
    idx = torch.tensor([2, 0, 2, 3, 1], dtype=torch.int64)
    s, valid = fi.sampling.sampling_from_probs(probs, indices=idx, return_valid=True)
    assert s.dtype == torch.int64 and s.shape == (5,)
    assert valid.tolist() == [False, True, False, True, True]
    assert s[0] == 0 and s[2] == 0


def test_sampling_from_logits_matches_softmax(fi):
    logits = torch.randn(1, 8) * 2
    n = 40000
    s = fi.sampling.sampling_from_logits(logits, indices=torch.zeros(n, dtype=torch.int32))
    freq = torch.bincount(s.long(), minlength=8).double() / n
    assert (freq - torch.softmax(logits.double(), -1)[0]).abs().max() < 0.015


def test_check_nan_and_errors(fi):
    probs = normalized(2, 10)
    bad = probs.clone()
    bad[0, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        fi.sampling.sampling_from_probs(bad, check_nan=True)
    with pytest.raises(fi.InvalidArgumentError, match="top_p=1.5"):
        fi.sampling.top_p_sampling_from_probs(probs, 1.5)
    with pytest.raises(ValueError, match="filter_apply_order"):
        fi.sampling.top_k_top_p_sampling_from_probs(probs, 2, 0.5, filter_apply_order="x")
    with pytest.raises(NotImplementedError, match="one value"):
        fi.sampling.sampling_from_probs(probs, seed=torch.tensor([1, 2]), offset=0)


# ---------------------------------------------------------- renorm, mask


@pytest.mark.parametrize("k", [1, 10, 100])
def test_top_k_renorm(fi, backend, k):
    probs = normalized(8, 3000)
    mask = top_k_mask(probs, k)
    ref = torch.where(mask, probs, 0)
    ref = ref / ref.sum(-1, keepdim=True)
    assert_close(fi.sampling.top_k_renorm_probs(backend(probs), k), ref, torch.float32)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p_renorm(fi, backend, p):
    probs = normalized(8, 3000)
    mask = top_p_mask(probs, p)
    ref = torch.where(mask, probs, 0)
    ref = ref / ref.sum(-1, keepdim=True)
    assert_close(fi.sampling.top_p_renorm_probs(backend(probs), p), ref, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_mask_logits(fi, dtype):
    logits = torch.randn(6, 500).to(dtype)
    k = torch.tensor([1, 2, 5, 10, 499, 600], dtype=torch.int32)
    out = fi.sampling.top_k_mask_logits(logits, k)
    for r in range(6):
        kk = min(int(k[r]), 500)
        pivot = torch.sort(logits[r].float(), descending=True).values[kk - 1]
        ref = torch.where(logits[r].float() >= pivot, logits[r].float(), -math.inf)
        assert torch.equal(out[r].float(), ref)


# -------------------------------------------------------------- speculative


def test_chain_speculative_example(fi):
    draft = torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.4, 0.1]]])
    ids = torch.tensor([[2, 1]], dtype=torch.int32)
    target = torch.tensor([[[0.0, 0.1, 0.6, 0.3], [1.0, 0.0, 0.0, 0.0], [0.7, 0.1, 0.1, 0.1]]])
    acc = torch.tensor([5], dtype=torch.int32)
    out, a, e = fi.chain_speculative_sampling(draft, ids, target, acc)
    assert out.tolist() == [[2, 0, -1]] and a is acc and a.tolist() == [6] and e.tolist() == [1]


def test_chain_speculative_all_accepted(fi):
    b, n, v = 16, 4, 100
    draft = normalized(b * n, v).view(b, n, v)
    target = torch.cat([draft, normalized(b, v).view(b, 1, v)], 1)
    ids = draft.argmax(-1).int()
    out, acc, emi = fi.chain_speculative_sampling(draft, ids, target)
    assert (emi == n).all() and (acc == n).all() and torch.equal(out[:, :n], ids)
    assert ((out[:, n] >= 0) & (out[:, n] < v)).all()


# -------------------------------------------------------------------- top-k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 50, 256])
def test_top_k(fi, backend, dtype, k):
    x = torch.randn(4, 32000).to(dtype)
    values, indices = fi.top_k(backend(x), k, sorted=True)
    ref = torch.topk(x.float(), k, dim=-1)
    assert torch.equal(as_torch(values).float(), ref.values)
    assert as_torch(indices).dtype == torch.int64
    assert torch.equal(x.float().gather(1, as_torch(indices)), ref.values)


def test_top_k_ragged_transform(fi):
    x = torch.randn(5, 300)
    lengths = torch.tensor([0, 3, 100, 300, 10], dtype=torch.int32)
    offsets = torch.arange(5, dtype=torch.int32) * 1000
    out = fi.topk.top_k_ragged_transform(x, offsets, lengths, 8)
    for r in range(5):
        n = int(lengths[r])
        want = torch.topk(x[r, :n], min(8, n)).indices.int() + offsets[r]
        got = out[r]
        assert (got[min(8, n) :] == -1).all()
        assert sorted(got[: min(8, n)].tolist()) == sorted(want.tolist())


def test_top_k_page_table_transform(fi):
    x = torch.randn(3, 64)
    table = torch.randint(0, 1000, (3, 64), dtype=torch.int32)
    lengths = torch.tensor([64, 5, 0], dtype=torch.int32)
    out = fi.topk.top_k_page_table_transform(x, table, lengths, 8)
    top = torch.topk(x[0], 8).indices
    assert sorted(out[0].tolist()) == sorted(table[0, top].tolist())
    assert (out[1, 5:] == -1).all() and (out[2] == -1).all()


# ------------------------------------------------------- RoPE from a cache


def cos_sin_cache(max_pos, rot, theta=1e4):
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat([ang.cos(), ang.sin()], -1).float()


def rope_cache_ref(x, pos, cache, neox):
    x = x.double()
    rot = cache.shape[1]
    c, s = cache[pos.long(), : rot // 2].double(), cache[pos.long(), rot // 2 :].double()
    c, s = c[:, None, :], s[:, None, :]
    y = x.clone()
    if neox:
        a, b = x[..., : rot // 2], x[..., rot // 2 : rot]
        y[..., : rot // 2], y[..., rot // 2 : rot] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., 0:rot:2], x[..., 1:rot:2]
        y[..., 0:rot:2], y[..., 1:rot:2] = a * c - b * s, b * c + a * s
    return y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot", [64, 128])
@pytest.mark.parametrize("inplace", [False, True])
def test_rope_with_cos_sin_cache(fi, backend, dtype, is_neox, rot, inplace):
    nnz, hq, hk, d = 9, 4, 2, 128
    q = torch.randn(nnz, hq * d).to(dtype)
    k = torch.randn(nnz, hk * d).to(dtype)
    pos = torch.randint(0, 2048, (nnz,), dtype=torch.int64)
    cache = cos_sin_cache(2048, rot)
    qr = rope_cache_ref(q.view(nnz, hq, d), pos, cache, is_neox).view(nnz, -1)
    kr = rope_cache_ref(k.view(nnz, hk, d), pos, cache, is_neox).view(nnz, -1)
    qb, kb = backend(q.clone()), backend(k.clone())
    args = (backend(pos), qb, kb, d, backend(cache))
    if inplace:
        fi.apply_rope_with_cos_sin_cache_inplace(*args, is_neox=is_neox)
        qo, ko = qb, kb
    else:
        qo, ko = fi.apply_rope_with_cos_sin_cache(*args, is_neox=is_neox)
    assert tuple(qo.shape) == (nnz, hq * d)
    assert_close(qo, qr, dtype, "query")
    assert_close(ko, kr, dtype, "key")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("gemma", [False, True])
@pytest.mark.parametrize("inplace", [False, True])
def test_fused_qk_rmsnorm_rope(fi, backend, dtype, is_neox, gemma, inplace):
    nnz, hq, hk, d, rot = 9, 4, 2, 128, 64
    q = torch.randn(nnz, hq * d).to(dtype)
    k = torch.randn(nnz, hk * d).to(dtype)
    qw, kw = torch.rand(d).to(dtype), torch.rand(d)
    pos = torch.randint(0, 2048, (nnz,), dtype=torch.int64)
    cache = cos_sin_cache(2048, rot)
    qn = rms_ref(q.view(nnz, hq, d), qw, gemma=gemma)
    kn = rms_ref(k.view(nnz, hk, d), kw, gemma=gemma)
    qr = rope_cache_ref(qn, pos, cache, is_neox).view(nnz, -1)
    kr = rope_cache_ref(kn, pos, cache, is_neox).view(nnz, -1)
    qb, kb = backend(q.clone()), backend(k.clone())
    out = fi.fused_qk_rmsnorm_rope(backend(pos), qb, kb, d, backend(cache), backend(qw),
                                   backend(kw), is_neox=is_neox, gemma=gemma, inplace=inplace)
    qo, ko = (qb, kb) if inplace else out
    assert_close(qo, qr, dtype, "query")
    assert_close(ko, kr, dtype, "key")
