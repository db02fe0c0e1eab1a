#!/usr/bin/env python3
"""bench_torch.py — torch SDPA (flash and cuDNN backends) on the cells of our
CUDA benchmarks, in the same run. One JSON line per cell to --json; a line per
cell on stdout.

  --prefill  bench/cuda/bench_prefill.c's cells: causal, 32 query heads, d 128,
             bf16, dense [B, H, L, D] (K/V expanded from 8 to 32 heads, as
             the peer numbers of docs/BENCHMARKS.md were taken). Events around one call,
             warm-up, median of 30; FLOPs = 4 * H * D * B * L (L + 1) / 2.
  --decode   bench/cuda/bench_decode.c's cells: one query per request, dense
             K/V [B, 8, L, D] with enable_gqa (the expanded 32-head copy of
             the largest cells would not fit), bf16. Small cells rotate over
             copies of K/V (>= ~300 MB read per replay, at most 16) so the L2
             cannot hold them; a CUDA graph of one call per copy, replayed,
             median of 30. Bytes as ours: Q + K + V + O.
"""
import json
import math
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

from gpu_timing import median_ms, replay_or_eager

PREFILL = [(128, 1024), (64, 2048), (32, 4096), (16, 8192), (1, 16384), (1, 32768)]
DECODE_B = [1, 16, 64, 256]
DECODE_L = [1024, 4096, 16384, 32768]
H, HKV, D = 32, 8, 128
CEILING = 4.22e12
BACKENDS = (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION))


def rand(*shape, g):
    return torch.rand(*shape, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1


def prefill(rows):
    for B, L in PREFILL:
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = rand(B, H, L, D, g=g), rand(B, H, L, D, g=g), rand(B, H, L, D, g=g)
        flops = 4.0 * H * D * B * L * (L + 1) / 2
        for name, be in BACKENDS:
            try:
                with sdpa_kernel(be):
                    ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                tf = flops / (ms * 1e-3) / 1e12
            except Exception as e:  # a backend that refuses the shape
                print(f"{name} {B}x{L}: {type(e).__name__}: {str(e)[:120]}")
                ms, tf = float("nan"), float("nan")
            rows.append({"peer": "torch-sdpa-" + name, "workload": "prefill", "batch": B, "len": L,
                         "ms": ms, "tflops": tf})
            print(f"torch {name:5s} prefill {B:3d} x {L:5d}: {ms:8.3f} ms {tf:6.1f} TFLOP/s", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


def decode(rows):
    for B in DECODE_B:
        for L in DECODE_L:
            nbytes = 2.0 * B * H * D * 2 + 2.0 * B * L * HKV * D * 2
            R = max(1, min(16, math.ceil(300e6 / nbytes)))
            g = torch.Generator(device="cuda").manual_seed(2)
            q = rand(B, H, 1, D, g=g)
            kvs = [(rand(B, HKV, L, D, g=g), rand(B, HKV, L, D, g=g)) for _ in range(R)]
            for name, be in BACKENDS:
                try:
                    with sdpa_kernel(be):
                        fns = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                               for k, v in kvs]
                        replay, mode = replay_or_eager(fns)
                        us = 1e3 * median_ms(replay, R)
                    tbs = nbytes / (us * 1e-6) / 1e12
                except Exception as e:
                    print(f"{name} decode {B}x{L}: {type(e).__name__}: {str(e)[:120]}")
                    us, tbs, mode = float("nan"), float("nan"), "failed"
                rows.append({"peer": "torch-sdpa-" + name, "workload": "decode", "batch": B, "kv_len": L,
                             "us": us, "tb_s": tbs, "plans": R, "timing": mode})
                print(f"torch {name:5s} decode {B:3d} x {L:5d}: {us:9.1f} us {tbs:6.2f} TB/s ({mode})",
                      flush=True)
            del q, kvs
            torch.cuda.empty_cache()


def main():
    a = sys.argv[1:]
    out = a[a.index("--json") + 1] if "--json" in a else None
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    try:
        if "--prefill" in a or "--decode" not in a:
            prefill(rows)
        if "--decode" in a:
            decode(rows)
    finally:
        if out:
            with open(out, "w") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
