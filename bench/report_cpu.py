"""report_cpu.py — merge rounds of bench_cpu and torch SDPA results: per cell
each side keeps its best median; add machine and commit; write the results
file and print the markdown table for docs/BENCHMARKS.md.

    python3 bench/report_cpu.py --out OUT.json --ours A.json ... --torch B.json ...
"""
import argparse
import datetime
import json
import platform
import subprocess


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def key(c):
    return (c["kind"], c["batch"], c["kv_len"], c["dtype"])


def best_cells(runs):
    """Per cell, the run with the smallest median time (runs in file order)."""
    best = {}
    for run in runs:
        for c in run["cells"]:
            if c["ms"] > 0 and (key(c) not in best or c["ms"] < best[key(c)]["ms"]):
                best[key(c)] = c
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--torch", nargs="+", required=True)
    args = ap.parse_args()
    ours = [json.load(open(p)) for p in args.ours]
    peer = [json.load(open(p)) for p in args.torch]
    bw = max(r["read_bandwidth_gbs"] for r in ours)
    peak = max(r["fma_peak_gflops"] for r in ours)
    mine, theirs = best_cells(ours), best_cells(peer)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cells = []
    for k, c in mine.items():
        t = theirs.get(k)
        cells.append({**c, "torch_ms": t["ms"] if t else None})
    result = {"date": datetime.date.today().isoformat(), "commit": commit, "cpu": cpu_model(),
              "machine": ours[0]["machine"], "threads": ours[0]["threads"],
              "torch": peer[0]["torch"], "rounds": len(ours),
              "read_bandwidth_gbs": bw, "fma_peak_gflops": peak, "cells": cells}
    print(f"{result['machine']} on {result['cpu']}; measured read bandwidth {bw:.1f} GB/s, "
          f"fp32 FMA peak {peak:.0f} GFLOP/s (best of {len(ours)} rounds); torch {peer[0]['torch']}")
    print("| workload | dtype | ours ms | GB/s | % of read BW | GFLOP/s | % of FMA peak "
          "| torch SDPA ms | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        t = c["torch_ms"]
        ratio = f"{t / c['ms']:.2f}x" if t else "-"
        tms = f"{t:.3f}" if t else "-"
        print(f"| {c['kind']} {c['batch']} x {c['kv_len']} | {c['dtype']} | {c['ms']:.3f} | "
              f"{c['gbs']:.1f} | {100 * c['gbs'] / bw:.0f}% | {c['gflops']:.1f} | "
              f"{100 * c['gflops'] / peak:.0f}% | {tms} | {ratio} |")
    json.dump(result, open(args.out, "w"), indent=2)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
