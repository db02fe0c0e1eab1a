#!/usr/bin/env python3
"""bench_cascade_flashinfer.py — the peer of build/bench_cuda_cascade:
FlashInfer's MultiLevelCascadeAttentionWrapper (2 levels: the shared prefix
as one request holding every query, then each request's unique suffix) on
the same cells, the same layout (random distinct pages of a pool of random
values, page 16, NHD, bf16, 32/32 heads, d 128, one query per request) and
the same timing (CUDA graph of R copies on other pages when a cell fits in
L2, device events, median of >= 30 replays after warm-up, per run = / R).

Before timing, the first copy's output of the first 4 requests is checked
against an fp32 torch reference.

    python3 bench/cuda/bench_cascade_flashinfer.py [--json FILE] [--reps N]
    python3 bench/cuda/bench_cascade_flashinfer.py --warm   # JIT-compile only
"""
import argparse
import json
import math
import sys
import time

import torch

H, D, PS, POOL, MAXR = 32, 128, 16, 32768, 8
CELLS = [(1024, 16, 128), (1024, 64, 128), (8192, 16, 128), (8192, 64, 128),
         (32768, 16, 128), (32768, 64, 128), (16, 64, 1024), (64, 16, 4096), (256, 64, 4096)]


def copies(P, B, S):
    unique = (P + B * S) * H * D * 4
    r = min(MAXR, max(1, math.ceil(200e6 / unique)))
    return min(r, POOL // (P // PS + B * S // PS))


def make_wrapper(flashinfer, ws, P, B, S, pages, dev):
    pp, sp = P // PS, S // PS
    i32 = dict(dtype=torch.int32, device=dev)
    prefix = pages[:pp]
    suffix = pages[pp:pp + B * sp]
    w = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws, "NHD")
    w.plan([torch.tensor([0, B], **i32), torch.arange(B + 1, **i32)],
           [torch.tensor([0, pp], **i32), torch.arange(B + 1, **i32) * sp],
           [prefix.to(torch.int32), suffix.to(torch.int32)],
           [torch.tensor([PS], **i32), torch.full((B,), PS, **i32)],
           H, H, D, PS, causal=False, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16)
    return w, prefix, suffix


def reference(q, k, v, prefix, suffix, b, sp):
    pages = torch.cat([prefix, suffix[b * sp:(b + 1) * sp]]).long()
    kk = k[pages].reshape(-1, H, D).float()
    vv = v[pages].reshape(-1, H, D).float()
    s = torch.einsum("hd,lhd->hl", q[b].float(), kk) / math.sqrt(D)
    return torch.einsum("hl,lhd->hd", torch.softmax(s, -1), vv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warm", action="store_true")
    args = ap.parse_args()
    import flashinfer
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    if args.warm:  # compile the modules the timed run uses
        k = torch.randn(64, PS, H, D, dtype=torch.bfloat16, device=dev)
        pages = torch.randperm(64, device=dev)
        w, _, _ = make_wrapper(flashinfer, ws, 256, 4, 128, pages, dev)
        w.run(torch.randn(4, H, D, dtype=torch.bfloat16, device=dev), (k, k))
        torch.cuda.synchronize()
        print(f"flashinfer {flashinfer.__version__}: JIT modules ready")
        return 0
    k = torch.empty(POOL, PS, H, D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    v = torch.empty(POOL, PS, H, D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
    perm = torch.randperm(POOL, device=dev)
    at = 0
    reps = max(30, args.reps)
    out = open(args.json, "w") if args.json else None
    print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    rows = []
    status = 0
    for P, B, S in CELLS:
        R = copies(P, B, S)
        need = P // PS + B * S // PS
        ws_list, runs = [], []
        for r in range(R):
            if at + need > POOL:
                at = 0
            pages = perm[at:at + need]
            at += need
            w, prefix, suffix = make_wrapper(flashinfer, ws, P, B, S, pages, dev)
            q = torch.empty(B, H, D, dtype=torch.bfloat16, device=dev).uniform_(-1, 1)
            runs.append((w, q, prefix, suffix))
        w, q, prefix, suffix = runs[0]
        o = w.run(q, (k, v))
        err = 0.0
        for b in range(min(4, B)):
            ref = reference(q, k, v, prefix, suffix, b, S // PS)
            e = ((o[b].float() - ref).abs() / (2e-2 + 2e-2 * ref.abs())).max().item()
            err = max(err, e if math.isfinite(e) else math.inf)
        ok = err <= 1
        status |= not ok
        # one graph of the R runs (eager when capture is refused)
        graph = None
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for w, q, _, _ in runs:
                    w.run(q, (k, v))
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for w, q, _, _ in runs:
                    w.run(q, (k, v))
        except Exception as e:  # noqa: BLE001 - report and time eagerly
            print(f"  graph capture failed ({e}); timing eager runs")
            graph = None

        def once():
            if graph is not None:
                graph.replay()
            else:
                for w, q, _, _ in runs:
                    w.run(q, (k, v))
        for _ in range(3):
            once()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        ms = []
        for _ in range(reps):
            e0.record()
            once()
            e1.record()
            e1.synchronize()
            ms.append(e0.elapsed_time(e1))
        ms.sort()
        us = 1e3 * ms[reps // 2] / R
        mode = "graph" if graph is not None else "eager"
        print(f"prefix {P:5d} x batch {B:2d}, suffix {S:4d}: flashinfer cascade {us:9.1f} us "
              f"({R} cop{'ies' if R > 1 else 'y'}, {mode}; check {err:.2f} of tolerance"
              f"{'' if ok else ' MISMATCH'})")
        rows.append((P, B, S, us, R, mode, ok))
        if out:
            out.write(json.dumps({"workload": "cascade", "impl": "flashinfer-multilevel",
                                  "flashinfer": flashinfer.__version__, "prefix": P, "batch": B,
                                  "suffix": S, "h_qo": H, "h_kv": H, "d": D, "page": PS,
                                  "dtype": "bf16", "us": round(us, 2), "copies": R,
                                  "timing": mode, "check_ok": ok, "reps": reps}) + "\n")
        del runs, graph
        torch.cuda.synchronize()
    print("\n| prefix | batch | suffix | flashinfer cascade us | copies | timing |")
    print("|---|---|---|---|---|---|")
    for P, B, S, us, R, mode, ok in rows:
        print(f"| {P} | {B} | {S} | {us:.1f} | {R} | {mode} |{'' if ok else ' MISMATCH'}")
    if out:
        out.close()
    return status


if __name__ == "__main__":
    t0 = time.time()
    rc = main()
    print(f"({time.time() - t0:.0f} s)")
    sys.exit(rc)
