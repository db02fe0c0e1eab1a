#!/usr/bin/env python3
"""bench_serving_peers.py — the peers of build/bench_serving on its cells, in
the same run: FlashInfer's own op (flashinfer.norm / activation / sampling /
topk / rope) and torch's composition of primitives for each serving op.

Cells (kept equal to bench/cuda/bench_serving.c's): rmsnorm and
fused_add_rmsnorm (bf16, rows 1 / 16 / 64 / 256 / 1024 / 4096 x hidden
2048 / 4096 / 8192 / 16384), silu_and_mul (bf16, rows 1 / 64 / 256 / 1024 /
4096 x d 4096 / 14336), softmax (temperature 0.8), top_k / top_p /
top_k_top_p sampling from probs (k 50, p 0.9), top_k_renorm_probs,
top_k_mask_logits and top_k (f32, rows 1 / 16 / 64 / 256 / 512 x vocab
128256), apply_rope_with_cos_sin_cache (bf16, 4096 tokens, 32/8 heads,
d 128, NeoX, a cache of 8192 positions), rope_quantize_fp8 (DeepSeek MLA, bf16
into e4m3: 128 heads, rope 64, nope 512; 64 / 4096 tokens) and
rope_quantize_fp8_append_paged_kv_cache (GQA 32/8 heads, d 128 all rope, V
128, an NHD e4m3 cache of 16-token pages holding one request; 64 / 4096) and
qk_rmsnorm_rope (per-head RMSNorm of q and k, then NeoX RoPE, 32/8 heads of
128, in place; 64 / 4096 tokens). Ours works on views of a packed bf16 qkv
(32 + 8 + 8 heads); the peers get q and k as contiguous tensors, since
FlashInfer's peer is the unfused path engines take: its rmsnorm over the
[tokens * heads, 128] rows of q and of k, then
apply_rope_with_cos_sin_cache_inplace (three launches).

Inputs random (values uniform in [0, 1), the samplers' probabilities each
row normalised as FlashInfer's samplers expect; top_k_mask_logits' logits in
[-8, 1)), in enough copies that one
sweep reads >= 256 MB (at most 16). Timing as ours: one sweep (the op once
per copy) captured in a CUDA graph, device events around each replay, median
of 30 after warm-up (eager where a capture is refused, noted); time per op =
replay / copies; bytes as ours (every tensor read or written once; sampling
and top-k: the input read once). One JSON line per measurement to --json.

  bench_serving_peers.py [--json FILE] [--peer flashinfer|torch] [--op NAME]
  bench_serving_peers.py --warm     build FlashInfer's modules (JIT) and exit
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

from gpu_timing import median_ms, replay_or_eager

CEILING = 4.22e12
K, TOP_P, TEMP, EPS = 50, 0.9, 0.8, 1e-6
HQ, HK, HD, MAXPOS = 32, 8, 128, 8192
MLA_H, MLA_R, MLA_N, PAGE = 128, 64, 512, 16
FP8 = torch.float8_e4m3fn
VOCAB = 128256
BF16, F32, DEV = torch.bfloat16, torch.float32, "cuda"

CELLS = ([("rmsnorm", r, h) for r in (1, 16, 64, 256, 1024, 4096)
          for h in (2048, 4096, 8192, 16384)]
         + [("fused_add_rmsnorm", r, h) for r in (1, 16, 64, 256, 1024, 4096)
            for h in (2048, 4096, 8192, 16384)]
         + [("silu_and_mul", r, d) for r in (1, 64, 256, 1024, 4096) for d in (4096, 14336)]
         + [(op, r, VOCAB) for op in ("softmax", "top_k_sampling", "top_p_sampling",
                                      "top_k_top_p_sampling", "top_k_renorm_probs",
                                      "top_k_mask_logits", "top_k") for r in (1, 16, 64, 256, 512)]
         + [("rope_cos_sin_cache", 4096, (HQ + HK) * HD)]
         + [(op, t, cols) for t in (64, 4096)
            for op, cols in (("rope_quantize_fp8_mla", (MLA_H + 1) * (MLA_R + MLA_N)),
                             ("rope_quantize_fp8_append_gqa", (HQ + 2 * HK) * HD))]
         + [("qk_rmsnorm_rope", t, (HQ + 2 * HK) * HD) for t in (64, 4096)])


def cell_bytes(op, rows, cols):
    """(bytes of one input copy, bytes the op moves), as bench_serving.c."""
    n = rows * cols
    if op == "rmsnorm":
        return 2 * n, 4 * n
    if op == "fused_add_rmsnorm":
        return 4 * n, 8 * n
    if op == "silu_and_mul":
        return 4 * n, 6 * n
    if op in ("softmax", "top_k_renorm_probs", "top_k_mask_logits"):
        return 4 * n, 8 * n
    if op == "rope_cos_sin_cache":
        return 2 * n, 4 * n
    if op.startswith("rope_quantize_fp8"):
        return 2 * n, 3 * n  # bf16 in, FP8 out
    if op == "qk_rmsnorm_rope":  # the packed qkv; q and k read and written
        return 2 * n, 4 * rows * (HQ + HK) * HD
    return 4 * n, 4 * n  # samplers, top_k


def make_inputs(op, rows, cols, copies, gen):
    """The cell's input copies (a list of tuples of tensors) and its shared tensors."""
    def uni(shape, dtype, lo=0.0, hi=1.0):
        return (torch.rand(shape, device=DEV, generator=gen) * (hi - lo) + lo).to(dtype)

    shared = {}
    xs = []
    for _ in range(copies):
        if op in ("rmsnorm", "fused_add_rmsnorm"):
            xs.append((uni((rows, cols), BF16, -1, 1), uni((rows, cols), BF16, -1, 1)))
        elif op == "silu_and_mul":
            xs.append((uni((rows, 2 * cols), BF16, -4, 4),))
        elif op == "rope_cos_sin_cache":
            xs.append((uni((rows, HQ * HD), BF16, -1, 1), uni((rows, HK * HD), BF16, -1, 1)))
        elif op == "rope_quantize_fp8_mla":  # q_rope, q_nope, k_rope, k_nope
            xs.append((uni((rows, MLA_H, MLA_R), BF16, -1, 1), uni((rows, MLA_H, MLA_N), BF16, -1, 1),
                       uni((rows, MLA_R), BF16, -1, 1), uni((rows, MLA_N), BF16, -1, 1)))
        elif op == "qk_rmsnorm_rope":  # q, k
            xs.append((uni((rows, HQ, HD), BF16, -1, 1), uni((rows, HK, HD), BF16, -1, 1)))
        elif op == "rope_quantize_fp8_append_gqa":  # q, k, v
            xs.append(tuple(uni((rows, h, HD), BF16, -1, 1) for h in (HQ, HK, HK)))
        elif op == "top_k_mask_logits":
            xs.append((uni((rows, cols), F32, -8, 1),))
        elif op in ("softmax", "top_k"):
            xs.append((uni((rows, cols), F32),))
        else:
            p = uni((rows, cols), F32)
            xs.append((p / p.sum(-1, keepdim=True),))
    shared["w"] = uni((cols,), BF16, 0.5, 1.5)
    shared["pos"] = torch.arange(rows, device=DEV, dtype=torch.int64) % MAXPOS
    shared["cache"] = uni((MAXPOS, HD), F32, -1, 1)
    if op.startswith("rope_quantize_fp8"):
        pages = -(-rows // PAGE)
        shared["cache64"] = uni((MAXPOS, MLA_R), F32, -1, 1)
        shared["caches"] = tuple(torch.empty((pages, PAGE, HK, HD), device=DEV, dtype=FP8)
                                 for _ in range(2))
        shared["kv_indices"] = torch.arange(pages, device=DEV, dtype=torch.int32)
        shared["kv_indptr"] = torch.tensor([0, pages], device=DEV, dtype=torch.int32)
        shared["batch"] = torch.zeros(rows, device=DEV, dtype=torch.int32)
        shared["positions"] = torch.arange(rows, device=DEV, dtype=torch.int32)
    return xs, shared


# ------------------------------------------------------------- FlashInfer

def flashinfer_op(op, rows, cols, sh):
    """fn(copy) running FlashInfer's op on one input copy (outputs preallocated
    where the API takes out=)."""
    import flashinfer
    out = torch.empty((rows, cols), device=DEV, dtype=BF16)
    if op == "rmsnorm":
        return lambda x: flashinfer.norm.rmsnorm(x[0], sh["w"], EPS, out=out)
    if op == "fused_add_rmsnorm":
        return lambda x: flashinfer.norm.fused_add_rmsnorm(x[0], x[1], sh["w"], EPS)
    if op == "silu_and_mul":
        return lambda x: flashinfer.activation.silu_and_mul(x[0], out=out)
    if op == "softmax":
        return lambda x: flashinfer.sampling.softmax(x[0], temperature=TEMP)
    if op == "top_k_sampling":
        return lambda x: flashinfer.sampling.top_k_sampling_from_probs(x[0], K)
    if op == "top_p_sampling":
        return lambda x: flashinfer.sampling.top_p_sampling_from_probs(x[0], TOP_P)
    if op == "top_k_top_p_sampling":
        return lambda x: flashinfer.sampling.top_k_top_p_sampling_from_probs(x[0], K, TOP_P)
    if op == "top_k_renorm_probs":
        return lambda x: flashinfer.sampling.top_k_renorm_probs(x[0], K)
    if op == "top_k_mask_logits":
        return lambda x: flashinfer.sampling.top_k_mask_logits(x[0], K)
    if op == "top_k":
        return lambda x: flashinfer.top_k(x[0], K)
    if op == "rope_cos_sin_cache":
        return lambda x: flashinfer.rope.apply_rope_with_cos_sin_cache(
            sh["pos"], x[0], x[1], HD, sh["cache"], is_neox=True)
    if op == "qk_rmsnorm_rope":
        w = sh["w"][:HD]

        def f(x):  # FlashInfer's unfused path: norm of q's and k's head rows, then RoPE
            q, k = x[0].view(-1, HD), x[1].view(-1, HD)
            flashinfer.norm.rmsnorm(q, w, EPS, out=q)
            flashinfer.norm.rmsnorm(k, w, EPS, out=k)
            flashinfer.rope.apply_rope_with_cos_sin_cache_inplace(
                sh["pos"], x[0].view(rows, -1), x[1].view(rows, -1), HD, sh["cache"],
                is_neox=True)
        return f
    if op == "rope_quantize_fp8_mla":
        outs = [torch.empty((rows, MLA_H, MLA_R), device=DEV, dtype=FP8),
                torch.empty((rows, MLA_R), device=DEV, dtype=FP8),
                torch.empty((rows, MLA_H, MLA_N), device=DEV, dtype=FP8),
                torch.empty((rows, MLA_N), device=DEV, dtype=FP8)]
        return lambda x: flashinfer.rope.rope_quantize_fp8(
            x[0], x[2], x[1], x[3], sh["cache64"], sh["pos"], is_neox=True, quantize_dtype=FP8,
            q_rope_out=outs[0], k_rope_out=outs[1], q_nope_out=outs[2], k_nope_out=outs[3])
    if op == "rope_quantize_fp8_append_gqa":
        q_out = torch.empty((rows, HQ, HD), device=DEV, dtype=FP8)
        return lambda x: flashinfer.rope.rope_quantize_fp8_append_paged_kv_cache(
            x[0], x[1], None, None, x[2], sh["cache"], sh["pos"], sh["caches"],
            sh["kv_indices"], sh["kv_indptr"], sh["batch"], sh["positions"], is_neox=True,
            quantize_dtype=FP8, page_size=PAGE, kv_layout="NHD", q_rope_out=q_out)
    raise KeyError(op)


# ------------------------------------------------------------------ torch

def _top_p_mask(sorted_p):
    """Keep the smallest prefix of a descending row whose mass reaches TOP_P."""
    cum = sorted_p.cumsum(-1)
    return (cum - sorted_p) < TOP_P * cum[..., -1:]


def torch_op(op, rows, cols, sh):
    """fn(copy): torch's composition of primitives for the op."""
    if op == "rmsnorm":
        return lambda x: F.rms_norm(x[0], (cols,), sh["w"], EPS)
    if op == "fused_add_rmsnorm":
        def f(x):
            x[1].add_(x[0])
            x[0].copy_(F.rms_norm(x[1], (cols,), sh["w"], EPS))
        return f
    if op == "silu_and_mul":
        return lambda x: F.silu(x[0][:, :cols]) * x[0][:, cols:]
    if op == "softmax":
        return lambda x: torch.softmax(x[0] / TEMP, -1)
    if op == "top_k_sampling":
        def f(x):
            v, i = x[0].topk(K, -1)
            return i.gather(-1, torch.multinomial(v, 1))
        return f
    if op == "top_p_sampling":
        def f(x):
            v, i = x[0].sort(-1, descending=True)
            v = v * _top_p_mask(v)
            return i.gather(-1, torch.multinomial(v, 1))
        return f
    if op == "top_k_top_p_sampling":
        def f(x):
            v, i = x[0].topk(K, -1)
            v = v * _top_p_mask(v)
            return i.gather(-1, torch.multinomial(v, 1))
        return f
    if op == "top_k_renorm_probs":
        def f(x):
            thr = x[0].topk(K, -1).values[:, -1:]
            p = torch.where(x[0] >= thr, x[0], 0.0)
            return p / p.sum(-1, keepdim=True)
        return f
    if op == "top_k_mask_logits":
        def f(x):
            thr = x[0].topk(K, -1).values[:, -1:]
            return torch.where(x[0] >= thr, x[0], -math.inf)
        return f
    if op == "top_k":
        return lambda x: x[0].topk(K, -1)
    if op == "rope_cos_sin_cache":
        cos_sin = sh["cache"][sh["pos"]]
        cos, sin = cos_sin[:, None, : HD // 2], cos_sin[:, None, HD // 2:]

        def rot(t, h):
            t = t.view(rows, h, HD).float()
            a, b = t[..., : HD // 2], t[..., HD // 2:]
            return torch.cat((a * cos - b * sin, b * cos + a * sin), -1).to(BF16)
        return lambda x: (rot(x[0], HQ), rot(x[1], HK))
    if op == "qk_rmsnorm_rope":
        cos_sin = sh["cache"][sh["pos"]]
        cos, sin = cos_sin[:, None, : HD // 2], cos_sin[:, None, HD // 2:]
        w = sh["w"][:HD].float()

        def f(x):
            for t in x:
                n = F.rms_norm(t.float(), (HD,), w, EPS)
                a, b = n[..., : HD // 2], n[..., HD // 2:]
                t.copy_(torch.cat((a * cos - b * sin, b * cos + a * sin), -1))
        return f
    if op.startswith("rope_quantize_fp8"):
        r = MLA_R if op == "rope_quantize_fp8_mla" else HD
        cos_sin = (sh["cache64"] if r == MLA_R else sh["cache"])[sh["pos"]]
        cos, sin = cos_sin[:, None, : r // 2], cos_sin[:, None, r // 2:]

        def rope8(t):  # [rows, h, r] -> FP8 of the NeoX rotation (scale 1)
            t = t.float()
            a, b = t[..., : r // 2], t[..., r // 2:]
            y = torch.cat((a * cos - b * sin, b * cos + a * sin), -1)
            return y.clamp(-448, 448).to(FP8)

        def q8(t):
            return t.float().clamp(-448, 448).to(FP8)
        if op == "rope_quantize_fp8_mla":
            return lambda x: (rope8(x[0]), q8(x[1]), rope8(x[2][:, None])[:, 0], q8(x[3]))
        kc, vc = (c.view(torch.uint8).view(-1, HK, HD) for c in sh["caches"])
        slots = sh["positions"].long()  # one request, pages in order: slot = position

        def f(x):
            kc[slots] = rope8(x[1]).view(torch.uint8)
            vc[slots] = q8(x[2]).view(torch.uint8)
            return rope8(x[0])
        return f
    raise KeyError(op)


PEERS = {"flashinfer": flashinfer_op, "torch": torch_op}


def warm():
    """One small call of every FlashInfer op: its JIT modules built now."""
    import flashinfer
    print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    gen = torch.Generator(device=DEV).manual_seed(1)
    for op, _, cols in CELLS:
        rows = 4 if op != "rope_cos_sin_cache" else 16
        xs, sh = make_inputs(op, rows, cols, 1, gen)
        try:
            flashinfer_op(op, rows, cols, sh)(xs[0])
        except Exception as e:
            print(f"{op}: {type(e).__name__}: {str(e)[:160]}")
    torch.cuda.synchronize()
    print("flashinfer warm serving ops: done")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--peer", choices=sorted(PEERS), action="append")
    ap.add_argument("--op", action="append")
    ap.add_argument("--warm", action="store_true")
    a = ap.parse_args()
    if a.warm:
        return warm()
    out = open(a.json, "w") if a.json else None
    gen = torch.Generator(device=DEV).manual_seed(11)
    for op, rows, cols in CELLS:
        if a.op and op not in a.op:
            continue
        inb, moved = cell_bytes(op, rows, cols)
        copies = max(1, min(16, -(-(256 << 20) // inb)))
        xs, sh = make_inputs(op, rows, cols, copies, gen)
        for peer in a.peer or sorted(PEERS):
            try:
                fn = PEERS[peer](op, rows, cols, sh)
                replay, timing = replay_or_eager([lambda x=x: fn(x) for x in xs])
                us = 1e3 * median_ms(replay, calls=copies)
            except Exception as e:
                print(f"{peer} {op} {rows} x {cols}: {type(e).__name__}: {str(e)[:160]}")
                continue
            gbs = moved / (us * 1e-6) / 1e9
            print(f"{peer:10s} {op:22s} {rows:5d} x {cols:6d}: {us:9.2f} us {gbs:8.1f} GB/s "
                  f"({100 * gbs * 1e9 / CEILING:2.0f}% of copy; {copies} copies, {timing})")
            if out:
                out.write(json.dumps({"peer": peer, "workload": "serving", "op": op, "rows": rows,
                                      "cols": cols, "us": round(us, 3), "gbps": round(gbs, 1),
                                      "copies": copies, "timing": timing}) + "\n")
                out.flush()
        del xs, sh
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
