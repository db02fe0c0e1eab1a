"""rope_quantize_fp8 and rope_quantize_fp8_append_paged_kv_cache on torch
tensors (bf16 in, FP8 out), on the CPU and (gpu-marked) on CUDA, against a
torch float32 reference: the FP8 codes must be equal (the library rounds
the f32 products once, as the reference does)."""

import pytest
import torch

import flashinfer_c as fi
from conftest import GPU_MARKS, on_gpu

R, N, HQ, HK, NNZ, PAGE = 64, 32, 8, 2, 7, 16


def inputs(seed):
    g = torch.Generator().manual_seed(seed)
    t = {n: torch.randn(NNZ, h, w, generator=g).bfloat16()
         for n, h, w in (("q_rope", HQ, R), ("k_rope", HK, R), ("q_nope", HQ, N),
                         ("k_nope", HK, N), ("v", HK, R + N))}
    inv = 1e4 ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    ang = torch.arange(100, dtype=torch.float64)[:, None] * inv[None, :]
    t["cs"] = torch.cat([ang.cos(), ang.sin()], 1).float()
    t["pos"] = torch.arange(NNZ, dtype=torch.int32) + 3
    return t


def turned(x, cs, pos):
    """NeoX RoPE of x [nnz, H, R] by rows cs[pos], in float32."""
    x = x.float()
    c, s = cs[pos.long(), : R // 2][:, None, :], cs[pos.long(), R // 2 :][:, None, :]
    a, b = x[..., : R // 2], x[..., R // 2 :]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def fp8(y, scale):
    return (y.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn)


def same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))


def check_quantize(dev):
    t = inputs(1)
    d = {k: on_gpu(v) if dev == "cuda" else v for k, v in t.items()}
    outs = fi.rope_quantize_fp8(d["q_rope"], d["k_rope"], d["q_nope"], d["k_nope"], d["cs"],
                                d["pos"], is_neox=True, quant_scale_q=0.5, quant_scale_kv=2.0)
    want = (fp8(turned(t["q_rope"], t["cs"], t["pos"]), 0.5),
            fp8(turned(t["k_rope"], t["cs"], t["pos"]), 2.0),
            fp8(t["q_nope"], 0.5), fp8(t["k_nope"], 2.0))
    for got, w in zip(outs, want):
        same(got, w)


def check_append(dev):
    t = inputs(2)
    kc = torch.zeros(4, PAGE, HK, R + N, dtype=torch.float8_e4m3fn)
    vc = torch.zeros_like(kc)
    table = dict(kv_indices=torch.tensor([2, 0, 1, 3], dtype=torch.int32),
                 kv_indptr=torch.tensor([0, 1, 4], dtype=torch.int32),
                 batch_indices=torch.tensor([0, 0, 1, 1, 1, 1, 1], dtype=torch.int32),
                 positions=torch.tensor([0, 1, 0, 1, 2, 17, 33], dtype=torch.int32))
    mv = (lambda x: on_gpu(x)) if dev == "cuda" else (lambda x: x)
    d = {k: mv(v) for k, v in t.items()}
    cache = (mv(kc), mv(vc))
    qr, qn = fi.rope_quantize_fp8_append_paged_kv_cache(
        d["q_rope"], d["k_rope"], d["q_nope"], d["k_nope"], d["v"], d["cs"], d["pos"], cache,
        *(mv(table[n]) for n in ("kv_indices", "kv_indptr", "batch_indices", "positions")),
        page_size=PAGE)
    same(qr, fp8(turned(t["q_rope"], t["cs"], t["pos"]), 1.0))
    same(qn, fp8(t["q_nope"], 1.0))
    k = torch.cat([turned(t["k_rope"], t["cs"], t["pos"]), t["k_nope"].float()], -1)
    for i in range(NNZ):
        b, p = int(table["batch_indices"][i]), int(table["positions"][i])
        page = int(table["kv_indices"][int(table["kv_indptr"][b]) + p // PAGE])
        same(cache[0][page, p % PAGE], fp8(k[i], 1.0))
        same(cache[1][page, p % PAGE], fp8(t["v"][i], 1.0))


def test_quantize_cpu():
    check_quantize("cpu")


def test_append_cpu():
    check_append("cpu")


@pytest.mark.parametrize("check", [check_quantize, check_append])
def test_cuda(check):
    check("cuda")


for mark in GPU_MARKS:
    test_cuda = mark(test_cuda)
