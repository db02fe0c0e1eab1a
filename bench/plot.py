#!/usr/bin/env python3
"""plot.py — the plots of docs/BENCHMARKS.md, drawn from the records
(bench/results/<platform>/latest.json, bench/results_json.py): time against
length, ours and each peer, one PNG per platform and workload.

    python3 bench/plot.py [--results bench/results] [--out docs/img]

Writes OUT/<platform>-<workload>.png for the workloads a record holds:
decode (a panel per batch size, time against kv_len), prefill (paged and
ragged KV against the request length; TFLOP/s, as the cells differ in
tokens: each side's FLOPs over its time), cascade (a panel per batch,
time against the shared prefix), cpu-decode and cpu-prefill (a panel per
dtype), and the grids (h200-decode-grid, h200-prefill-grid: FlashInfer's
best time over ours for every cell, a bar each, grouped by shape). Needs
matplotlib.
"""
import argparse
import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"ours": dict(color="black", marker="o", linewidth=2)}
LABELS = {"flashinfer-tc": "FlashInfer (tensor-core decode)",
          "flashinfer-cc": "FlashInfer (CUDA-core decode)",
          "flashinfer-fa2": "FlashInfer fa2", "flashinfer-fa3": "FlashInfer fa3",
          "flashinfer-cascade": "FlashInfer cascade", "torch-flash": "torch SDPA flash",
          "torch-cudnn": "torch SDPA cuDNN", "torch-sdpa": "torch SDPA", "single": "ours, single format"}


def load(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def panel(ax, rows, x, title, xlabel, rate=False):
    """Ours and every peer of `rows` (records) against x(record): time, or
    with rate the TFLOP/s of the record's FLOPs in that time."""
    rows = sorted(rows, key=x)
    xs = [x(r) for r in rows]
    y = (lambda r, us: r["metric"]["tflops"] * r["ours_us"] / us) if rate else (lambda r, us: us)
    ax.plot(xs, [y(r, r["ours_us"]) for r in rows], label="ours", **STYLE["ours"])
    peers = sorted({p for r in rows for p in r["peers"]})
    for p in peers:
        pts = [(x(r), y(r, r["peers"][p])) for r in rows if p in r["peers"]]
        ax.plot([a for a, _ in pts], [b for _, b in pts], marker=".", label=LABELS.get(p, p))
    if any("single_us" in r["metric"] for r in rows):
        ax.plot(xs, [r["metric"]["single_us"] for r in rows], marker=".", linestyle="--",
                label=LABELS["single"])
    ax.set_xscale("log", base=2)
    if not rate:
        ax.set_yscale("log")
    ax.set_xticks(sorted(set(xs)))
    ax.set_xticklabels([str(v) for v in sorted(set(xs))], fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel("TFLOP/s" if rate else "us (median)", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6)


def figure(panels, title, path):
    """panels: [(rows, x, title, xlabel[, rate])]."""
    panels = [p for p in panels if p[0]]
    if not panels:
        return
    n = len(panels)
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.0 * rows), squeeze=False)
    for ax, p in zip(axes.flat, panels):
        panel(ax, *p)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    commits = sorted({r["commit"] for p in panels for r in p[0]})
    fig.suptitle(f"{title} ({', '.join(commits)})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print("wrote", path)


def grid_figure(rows, shape, cell, title, path):
    """One bar per record of a grid: the fastest peer's time over ours (> 1:
    ours faster), bars grouped by shape(record) in the grid's order, each
    labelled cell(record)."""
    rows = [r for r in rows if r["peers"]]
    if not rows:
        return
    ratio = [min(r["peers"].values()) / r["ours_us"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(8.0, 0.17 * len(rows)), 4.2))
    ax.bar(range(len(rows)), ratio, color=["#3a7d44" if x >= 0.995 else "#b03a2e" for x in ratio])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([cell(r) for r in rows], rotation=90, fontsize=5)
    starts = [i for i in range(len(rows)) if i == 0 or shape(rows[i]) != shape(rows[i - 1])]
    for i in starts:
        if i:
            ax.axvline(i - 0.5, color="grey", linewidth=0.5)
        ax.text(i - 0.4, max(ratio) * 1.03, "\n".join(shape(rows[i]).split()),
                fontsize=5.5, va="bottom")
    ax.set_ylim(0, max(ratio) * 1.22)
    ax.set_ylabel("FlashInfer's best time / ours", fontsize=8)
    commits = sorted({r["commit"] for r in rows})
    ax.set_title(f"{title} ({', '.join(commits)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    print("wrote", path)


def plots(platform, recs, out):
    def sel(suite, **kv):
        return [r for r in recs if r["suite"] == suite and
                all(r["params"].get(k) == v for k, v in kv.items())]

    def shape(r):
        q = r["params"]
        return f"{q['heads_qo']}/{q['heads_kv']} d{q['head_dim']} p{q['page_size']} {q['kv_dtype']}"

    grid = [r for r in recs if r["params"].get("set") == "grid"]
    recs = [r for r in recs if r["params"].get("set") != "grid"]
    grid_figure([r for r in grid if r["suite"] == "decode"], shape,
                lambda r: f"{r['params']['batch']}x{r['params']['kv_len']}",
                f"{platform}: decode grid, random pages", os.path.join(out, f"{platform}-decode-grid.png"))
    grid_figure([r for r in grid if r["suite"] == "prefill"],
                lambda r: shape(r).replace(" p0 ", " ragged "),
                lambda r: f"{r['params']['batch']}x{r['cell'].split('-')[0].split('x', 1)[1]}",
                f"{platform}: prefill grid, causal, vs FlashInfer (best of fa2, fa3)",
                os.path.join(out, f"{platform}-prefill-grid.png"))

    for kv in ("bf16", "e4m3"):
        dec = [r for r in sel("decode", pages="random", page_table="host", kv_dtype=kv)
               if "pos_encoding" not in r["params"]]
        if not dec:
            continue
        figure([([r for r in dec if r["params"]["batch"] == b], lambda r: r["params"]["kv_len"],
                 f"batch {b}", "kv_len") for b in sorted({r["params"]["batch"] for r in dec})],
               f"{platform}: decode, random pages, 32/8 heads, d 128, page 16, {kv} K/V",
               os.path.join(out, f"{platform}-decode{'' if kv == 'bf16' else '-' + kv}.png"))
    pre = [r for r in sel("prefill", causal=True) if "pos_encoding" not in r["params"]
           and (r["params"]["heads_qo"], r["params"]["head_dim"]) == (32, 128)]
    figure([([r for r in pre if bool(r["params"]["page_size"]) == paged], lambda r: r["params"]["q_len"],
             "paged KV (page 16)" if paged else "ragged KV",
             "request length (128k tokens to 8k, then 1 request)", True) for paged in (True, False)],
           f"{platform}: prefill, causal, 32/8 heads, d 128, bf16; TFLOP/s of each side's time",
           os.path.join(out, f"{platform}-prefill.png"))
    cas = sel("cascade", suffix_len=128)
    figure([([r for r in cas if r["params"]["batch"] == b], lambda r: r["params"]["prefix_len"],
             f"batch {b}, suffix 128", "shared prefix length") for b in
            sorted({r["params"]["batch"] for r in cas})],
           f"{platform}: cascade decode, 32/32 heads, d 128, page 16, bf16",
           os.path.join(out, f"{platform}-cascade.png"))
    for suite in ("cpu-decode", "cpu-prefill"):
        rs = [r for r in sel(suite) if "variant" not in r["params"] and
              not r["cell"].startswith("balance")]
        groups = sorted({(r["params"]["kv_dtype"], r["params"]["batch"]) for r in rs})
        figure([([r for r in rs if (r["params"]["kv_dtype"], r["params"]["batch"]) == g],
                 lambda r: r["params"]["kv_len"], f"{g[0]}, batch {g[1]}", "kv_len")
                for g in groups],
               f"{platform}: {suite[4:]}, 32/8 heads, d 128, page 16",
               os.path.join(out, f"{platform}-{suite}.png"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", default="bench/results")
    ap.add_argument("--out", default="docs/img")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(a.results, "*", "latest.json"))):
        plots(os.path.basename(os.path.dirname(path)), load(path), a.out)


if __name__ == "__main__":
    main()
