#!/usr/bin/env python3
"""bench_prefill_torch.py — torch SDPA (flash and cuDNN backends) on the
prefill cells of tests/gpu/bench_prefill.c, in the same run: causal, 32 query
heads, d 128, bf16, dense [B, H, L, D] (K/V expanded from 8 to 32 heads, as
BENCH.md's peer numbers were taken). Events around one call, warm-up, median
of 30; FLOPs = 4 * H * D * B * L (L + 1) / 2. One JSON line per cell to
--json; a table on stdout."""
import json
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

CELLS = [(128, 1024), (64, 2048), (32, 4096), (16, 8192), (1, 16384), (1, 32768)]
H, D, REPS = 32, 128, 30


def time_one(fn):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[REPS // 2]


def main():
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for B, L in CELLS:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.rand(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
        k = torch.rand(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
        v = torch.rand(B, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g) * 2 - 1
        flops = 4.0 * H * D * B * L * (L + 1) / 2
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(be):
                    ms = time_one(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                tf = flops / (ms * 1e-3) / 1e12
            except Exception as e:  # a backend that refuses the shape
                print(f"{name} {B}x{L}: {type(e).__name__}: {str(e)[:120]}")
                ms, tf = float("nan"), float("nan")
            rows.append({"peer": "torch-sdpa-" + name, "batch": B, "len": L, "ms": ms, "tflops": tf})
            print(f"torch {name:5s} {B:3d} x {L:5d}: {ms:8.3f} ms {tf:6.1f} TFLOP/s", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    if out:
        with open(out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
