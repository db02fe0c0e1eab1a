"""torch_cpu_sdpa.py — the CPU peer: torch's scaled_dot_product_attention on
the same shapes bench_cpu times (the CPU workloads of docs/BENCHMARKS.md), dense KV, GQA via
enable_gqa, same threads, median of repeats. Prints JSON on stdout.

    python bench/torch_cpu_sdpa.py --threads 2 --reps 30
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

CELLS = [("decode", b, kv, 1, dt) for dt in ("f32", "bf16") for b in (1, 16) for kv in (1024, 4096)]
CELLS += [("prefill", 1, n, n, dt) for dt in ("f32", "bf16") for n in (512, 2048)]
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
H_QO, H_KV, D = 32, 8, 128


def time_cell(kind, batch, kv_len, qo_len, dtype, reps):
    g = torch.Generator().manual_seed(batch * 7919 + kv_len)
    q = torch.rand(batch, H_QO, qo_len, D, generator=g, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    k = torch.rand(batch, H_KV, kv_len, D, generator=g, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    v = torch.rand(batch, H_KV, kv_len, D, generator=g, dtype=torch.float32).mul_(2).sub_(1).to(dtype)
    causal = kind == "prefill"

    def step():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out = {"torch": torch.__version__, "threads": torch.get_num_threads(), "cells": []}
    for kind, batch, kv_len, qo_len, dt in CELLS:
        s = time_cell(kind, batch, kv_len, qo_len, DTYPES[dt], args.reps)
        out["cells"].append({"kind": kind, "batch": batch, "kv_len": kv_len, "qo_len": qo_len,
                             "dtype": dt, "ms": s * 1e3})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
