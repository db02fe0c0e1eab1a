"""torch_cpu_serving.py — the CPU peer of bench_serving_ops: torch's CPU
composition of each serving op (the expressions engines run without
FlashInfer) on the cells of bench_serving_ops' JSON, same threads, median
of repeats; prints a table with our time beside torch's and the ratio.

    build/bench_serving_ops --threads 2 --json /tmp/ours.json
    python bench/torch_cpu_serving.py --from /tmp/ours.json --threads 2
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def rmsnorm(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def qk_rmsnorm_rope(q, k, qw, kw, cos_sin, pos, eps=1e-6):
    """The unfused QK norm + NeoX RoPE of a packed qkv's q and k views, in place."""
    cs = cos_sin[pos]
    c, s = cs.chunk(2, -1)
    c, s = c[:, None, :], s[:, None, :]
    for x, w in ((q, qw), (k, kw)):
        y = rmsnorm(x, w, eps).float()
        a, b = y.chunk(2, -1)
        x.copy_(torch.cat([a * c - b * s, b * c + a * s], -1))


def top_k_top_p_sample(probs, k, p):
    """vLLM's torch path: sort once, mask top-k and top-p, renormalise, draw."""
    sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
    if k:
        sorted_p[:, k:] = 0
    if p < 1:
        cum = torch.cumsum(sorted_p, -1)
        sorted_p[(cum - sorted_p) > p * cum[:, -1:]] = 0
    choice = torch.multinomial(sorted_p, 1)
    return idx.gather(1, choice)


def make(op, rows, cols):
    g = torch.Generator().manual_seed(rows * 131 + cols)
    if op in ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul"):
        width = 2 * cols if op == "silu_and_mul" else cols
        x = (torch.rand(rows, width, generator=g) * 4 - 2).bfloat16()
        r = (torch.rand(rows, cols, generator=g) * 4 - 2).bfloat16()
        w = (torch.rand(cols, generator=g) * 4 - 2).bfloat16()
        if op == "rmsnorm":
            return lambda: rmsnorm(x, w)
        if op == "fused_add_rmsnorm":
            def fused():
                r.add_(x)
                x.copy_(rmsnorm(r, w))
            return fused
        return lambda: F.silu(x[:, :cols]) * x[:, cols:]
    if op == "qk_rmsnorm_rope":  # 32 q + 8 k + 8 v heads of cols (bench_serving_ops.c)
        qkv = (torch.rand(rows, 48, cols, generator=g) * 4 - 2).bfloat16()
        w = (torch.rand(cols, generator=g) * 4 - 2).bfloat16()
        ang = torch.arange(4096.0)[:, None] * 1e4 ** (-torch.arange(0, cols, 2) / cols)
        cos_sin = torch.cat([ang.cos(), ang.sin()], -1)
        pos = torch.arange(rows) * 7 % 4096
        return lambda: qk_rmsnorm_rope(qkv[:, :32], qkv[:, 32:40], w, w, cos_sin, pos)
    probs = torch.rand(rows, cols, generator=g)
    if op == "softmax":
        return lambda: torch.softmax(probs / 0.8, -1)
    if op == "top_k_sampling":
        return lambda: top_k_top_p_sample(probs, 50, 1.0)
    if op == "top_p_sampling":
        return lambda: top_k_top_p_sample(probs, 0, 0.9)
    if op == "top_k_top_p_sampling":
        return lambda: top_k_top_p_sample(probs, 50, 0.9)
    if op == "top_k_renorm_probs":
        def renorm():
            pivot = torch.topk(probs, 50, -1).values[:, -1:]
            kept = torch.where(probs >= pivot, probs, 0)
            return kept / kept.sum(-1, keepdim=True)
        return renorm
    if op == "top_k":
        return lambda: torch.topk(probs, 50, -1)
    raise ValueError(op)


def median_ms(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--from", dest="src", required=True, help="bench_serving_ops --json output")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", help="write the combined numbers here")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    ours = json.load(open(args.src))
    print(f"ours: {ours['describe']}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'op':22} {'rows':>6} {'cols':>7} {'ours ms':>9} {'torch ms':>9} {'x':>6}")
    out = []
    for c in ours["cells"]:
        t = median_ms(make(c["op"], c["rows"], c["cols"]), args.reps)
        print(f"{c['op']:22} {c['rows']:6} {c['cols']:7} {c['ms']:9.3f} {t:9.3f} {t / c['ms']:6.2f}",
              flush=True)
        out.append(dict(c, torch_ms=t))
    if args.json:
        json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "cells": out},
                  open(args.json, "w"))


if __name__ == "__main__":
    main()
