#!/usr/bin/env python3
"""report_peers.py DIR — the final tables of tests/gpu/run_device.sh: ours
against torch SDPA (flash, cuDNN) and FlashInfer, per cell, from the JSON
lines the benchmarks wrote into DIR:

  bench_decode.json, bench_decode_contig.json   ours (bench_decode.c)
  bench_prefill.json                             ours (bench_prefill.c)
  bench_mixed.json                               ours (bench_mixed.c)
  bench_overhead.json                            ours (bench_overhead.c)
  bench_decode_dtable.json, bench_mixed_dtable.json  ours with device page tables
  bench_torch.json                               torch SDPA (bench_torch.py)
  bench_flashinfer.json                          FlashInfer (bench_flashinfer.py)
  bench_gather.json                              its "d2d copy" row: this run's copy ceiling

Ratios are the peer's time over ours: above 1, ours is faster. Decode also
shows % of the measured device-to-device copy ceiling: BENCH.md's 4.22 TB/s,
and the same copy measured on this machine in this run (bench_gather).
Markdown on stdout; missing files or cells print as '-'."""
import json
import os
import sys

CEILING = 4.22


def load(d, name):
    rows = []
    p = os.path.join(d, name)
    if os.path.exists(p):
        for line in open(p):
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def f(x, fmt="%.1f"):
    return "-" if x is None or x != x else fmt % x


def ratio(peer, ours):
    return "-" if not peer or not ours or peer != peer or ours != ours else "%.2fx" % (peer / ours)


def run_ceiling(d):
    """This run's device-to-device copy, TB/s (read + written), or None."""
    p = os.path.join(d, "bench_gather.json")
    try:
        rows = json.load(open(p))
    except (OSError, ValueError):
        return None
    return next((r["tb_s"] for r in rows if r.get("form") == "d2d copy"), None)


def decode_table(d, ours_file, layout, torch_rows, fi_rows):
    ours = {(r["batch"], r["kv_len"]): r for r in load(d, ours_file)}
    if not ours:
        return
    tr = {(r["peer"], r["batch"], r["kv_len"]): r for r in torch_rows if r.get("workload") == "decode"}
    fi = {(r["batch"], r["kv_len"]): r for r in fi_rows
          if r.get("peer") == "flashinfer-decode" and r.get("pages") == layout}
    here = run_ceiling(d)
    print(f"\nDecode, {layout} pages (bf16, 32/8 heads, d 128, page 16; time in us; x = peer time / ours)\n")
    print(f"| batch | kv_len | ours | TB/s | % of 4.22 | % of {f(here, '%.2f')} (this run's copy) | torch flash | cuDNN | "
          "FlashInfer | vs flash | vs cuDNN | vs FlashInfer |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (b, l), r in sorted(ours.items()):
        tf = tr.get(("torch-sdpa-flash", b, l), {}).get("us")
        tc = tr.get(("torch-sdpa-cudnn", b, l), {}).get("us")
        fr = fi.get((b, l), {})
        fu = fr.get("us")
        path = {"flashinfer-decode-tc": " (tc)", "flashinfer-decode-cc": " (cc)"}.get(fr.get("path"), "")
        print(f"| {b} | {l} | {f(r['us'])} | {f(r['tb_s'], '%.2f')} | {f(100 * r['tb_s'] / CEILING, '%.0f')}% | "
              f"{f(100 * r['tb_s'] / here if here else None, '%.1f%%')} | "
              f"{f(tf)} | {f(tc)} | {f(fu)}{path} | {ratio(tf, r['us'])} | {ratio(tc, r['us'])} | "
              f"{ratio(fu, r['us'])} |")


def prefill_table(d, torch_rows, fi_rows):
    ours = load(d, "bench_prefill.json")
    if not ours:
        return
    tr = {(r["peer"], r["batch"], r["len"]): r for r in torch_rows if r.get("workload", "prefill") == "prefill"}
    fi = {(r["peer"], r["batch"], r["len"]): r for r in fi_rows if r.get("workload") == "prefill"}
    has_fa3 = any(k[0].startswith("flashinfer-fa3") for k in fi)
    print("\nPrefill, causal (bf16, 32/8 heads, d 128; TFLOP/s; x = ours / peer; torch on dense K/V)\n")
    head = "| kv | batch x len | ours | torch flash | cuDNN | FlashInfer fa2 |"
    sep = "|---|---|---|---|---|---|"
    if has_fa3:
        head += " FlashInfer fa3 |"
        sep += "---|"
    head += " vs flash | vs cuDNN | vs FlashInfer (best) |"
    sep += "---|---|---|"
    print(head)
    print(sep)
    for r in ours:
        kvf = "paged" if r["kv"].startswith("paged") else "ragged"
        b, l, t = r["batch"], r["len"], r["tflops"]
        tf = tr.get(("torch-sdpa-flash", b, l), {}).get("tflops")
        tc = tr.get(("torch-sdpa-cudnn", b, l), {}).get("tflops")
        f2 = fi.get((f"flashinfer-fa2-{kvf}", b, l), {}).get("tflops")
        f3 = fi.get((f"flashinfer-fa3-{kvf}", b, l), {}).get("tflops")
        best = max([x for x in (f2, f3) if x], default=None)
        row = f"| {r['kv']} | {b} x {l} | {f(t)} | {f(tf)} | {f(tc)} | {f(f2)} |"
        if has_fa3:
            row += f" {f(f3)} |"
        row += f" {ratio(t, tf)} | {ratio(t, tc)} | {ratio(t, best)} |"
        print(row)


def mixed_table(d, fi_rows):
    ours = load(d, "bench_mixed.json")
    if not ours:
        return
    fi = {r["mix"]: r for r in fi_rows if r.get("workload") == "mixed"}
    print("\nMixed batches (causal, bf16, 32/8 heads, d 128, page 16; time in us; x = FlashInfer time / ours)\n")
    print("| mix | requests | queries | ours | TB/s | TFLOP/s | FlashInfer BatchAttention | vs FlashInfer |")
    print("|---|---|---|---|---|---|---|---|")
    for r in ours:
        fu = fi.get(r["mix"], {}).get("us")
        print(f"| {r['mix']} | {r['requests']} | {r['queries']} | {f(r['us'])} | {f(r['tb_s'], '%.2f')} | "
              f"{f(r['tflops'])} | {f(fu)} | {ratio(fu, r['us'])} |")


def overhead_table(d):
    allrows = load(d, "bench_overhead.json")
    rows = [r for r in allrows if r.get("workload") == "overhead"]
    calls = [r for r in allrows if r.get("workload") == "driver_call"]
    if not rows:
        return
    print("\nHost cost of a 256-request decode step (us, medians; target < 20)\n")
    print("| kv_len | page table | update | run | update + run | update + run, spin-wait |"
          " update + graph launch | update, CPU context | GPU step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kv_len']} | {r.get('page_table', 'host')} | {f(r['update_us'])} | {f(r['run_us'])} | {f(r['update_run_us'])} | "
              f"{f(r.get('update_run_spin_us'))} | {f(r['update_graph_us'])} | {f(r['update_cpu_ctx_us'])} | "
              f"{f(r['gpu_step_us'])} |")
    if calls:
        print("\nDriver calls on this machine (us, medians of 1000)\n")
        print("| call | bytes | us |")
        print("|---|---|---|")
        for r in calls:
            print(f"| {r['call']} | {r['bytes'] or '-'} | {f(r['us'], '%.2f')} |")


def dtable_table(d):
    """Ours with the page table in device memory (kernels that clamp page
    ids) against ours with it in host memory, same run."""
    pairs = []
    host = {(r["batch"], r["kv_len"]): r for r in load(d, "bench_decode.json")}
    for r in load(d, "bench_decode_dtable.json"):
        h = host.get((r["batch"], r["kv_len"]))
        pairs.append((f"decode {r['batch']} x {r['kv_len']}", h and h["us"], r["us"]))
    host = {r["mix"]: r for r in load(d, "bench_mixed.json")}
    for r in load(d, "bench_mixed_dtable.json"):
        h = host.get(r["mix"])
        pairs.append((f"mix {r['mix']}", h and h["us"], r["us"]))
    if not pairs:
        return
    print("\nDevice page tables (fi_plan_config.device_page_table) against host ones, ours (us)\n")
    print("| cell | host table | device table | host / device |")
    print("|---|---|---|---|")
    for name, h, dv in pairs:
        print(f"| {name} | {f(h)} | {f(dv)} | {ratio(h, dv)} |")


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "."
    torch_rows = load(d, "bench_torch.json")
    fi_rows = load(d, "bench_flashinfer.json")
    decode_table(d, "bench_decode.json", "random", torch_rows, fi_rows)
    decode_table(d, "bench_decode_contig.json", "contiguous", torch_rows, fi_rows)
    prefill_table(d, torch_rows, fi_rows)
    mixed_table(d, fi_rows)
    overhead_table(d)
    dtable_table(d)


if __name__ == "__main__":
    main()
