#!/usr/bin/env python3
"""results_json.py — the benchmark record: bench/results/<platform>/latest.json,
one JSON object per line, one line per (suite, cell):

  {"suite": "decode", "cell": "64x4096-32/8-d128-p16-bf16",
   "params": {"heads_qo": 32, "heads_kv": 8, "head_dim": 128, "page_size": 16,
              "kv_dtype": "bf16", "batch": 64, "kv_len": 4096, ...},
   "ours_us": 246.5, "peers": {"flashinfer-tc": 256.7, "flashinfer-cc": 271.0},
   "metric": {"tb_s": 4.36, "pct_ceiling": 103.1, "ceiling_tb_s": 4.23},
   "commit": "afffea8", "machine": "NVIDIA H200 ..."}

suite: decode, prefill, mixed, cascade, host, ops (GPU: the serving ops,
params heads 0 and the op, rows, cols); cpu-decode, cpu-prefill, host (CPU). params always name heads_qo, heads_kv, head_dim, page_size (0 for
ragged KV), kv_dtype and the lengths (numbers, lists of numbers for a mixed
batch's groups, or "U(a,b)" for drawn ones). Times are microseconds, medians.
A peer whose name starts with "flashinfer" is FlashInfer; where it has
several paths, the fastest counts (best_peers).

Commands (the run scripts call the first two):

  results_json.py gpu DIR --out FILE [--commit C] [--machine M] [--fresh]
      DIR holds what tests/gpu/run_device.sh's benchmarks wrote (bench_*.json
      files under the names of GPU_FILES below, peers' JSON lines,
      bench_gather.json for this run's copy ceiling, gpu.txt for the machine,
      bench_serving.json and bench_serving_peers.json: the serving ops,
      bench_balance.json: the host CPU's split-KV balance).
  results_json.py cpu --ours A.json ... [--torch B.json ...] [--plan P.json]
                  [--balance Q.json] [--variant V.json] [--serving S.json] --out FILE [...]
      bench_cpu rounds (per cell each side keeps its best median: a shared
      machine only ever slows a round down), torch's CPU SDPA rounds
      (bench/torch_cpu_sdpa.py), bench_plan, bench_balance, bench_variant_cpu,
      bench_serving_ops (with torch's times: bench/torch_cpu_serving.py --json).
  results_json.py table FILE [--suite S]
      the markdown tables of docs/BENCHMARKS.md (and run_device.sh's report).
  results_json.py check FILE ...
      every line a record of the format above.

--out merges: a record of FILE whose (suite, cell) this run did not measure
is kept (it carries its own commit); --fresh drops them.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys

REQUIRED = ("suite", "cell", "params", "ours_us", "peers", "metric", "commit", "machine")
PARAMS = ("heads_qo", "heads_kv", "head_dim", "page_size", "kv_dtype")
SUITES = ("decode", "prefill", "mixed", "cascade", "host", "ops", "cpu-decode", "cpu-prefill", "mla")
COPY_CEILING = 4.22  # TB/s, device-to-device copy on the H200 when no run measured its own


# ---------------------------------------------------------------- helpers

def json_lines(path):
    """The JSON objects of a file of JSON lines (other lines skipped), or []."""
    rows = []
    if path and os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return rows


def rnd(x, digits=2):
    return None if x is None else round(float(x), digits)


def shape(hq, hkv, d, page, dtype):
    return {"heads_qo": hq, "heads_kv": hkv, "head_dim": d, "page_size": page, "kv_dtype": dtype}


def cell_name(lengths, hq, hkv, d, page, dtype, *tags):
    kv = f"p{page}" if page else "ragged"
    return "-".join([lengths, f"{hq}/{hkv}", f"d{d}", kv, dtype] + [t for t in tags if t])


def record(suite, cell, params, ours_us, peers=None, metric=None):
    return {"suite": suite, "cell": cell, "params": params, "ours_us": rnd(ours_us),
            "peers": {k: rnd(v) for k, v in (peers or {}).items() if v},
            "metric": {k: v for k, v in (metric or {}).items() if v is not None}}


def git_commit():
    try:
        c = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        return c + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def best_peers(peers):
    """{project: fastest time}: FlashInfer's paths (keys starting with
    "flashinfer") count as one peer, the fastest."""
    out = {}
    for k, v in peers.items():
        p = "flashinfer" if k.startswith("flashinfer") else k
        out[p] = min(v, out.get(p, v))
    return out


# ---------------------------------------------------------------- GPU

# file in the run's directory -> (suite, cell tags, params added)
GPU_FILES = {
    "bench_decode.json": ("decode", "", {"pages": "random", "page_table": "host"}),
    "bench_decode_contig.json": ("decode", "contiguous", {"pages": "contiguous", "page_table": "host"}),
    "bench_decode_dtable.json": ("decode", "device-table", {"pages": "random", "page_table": "device"}),
    # the decode grid (bench/cuda/decode_grid.txt): shapes other than 32/8 d 128 page 16
    "bench_decode_grid.json": ("decode", "grid", {"pages": "random", "page_table": "host",
                                                  "set": "grid"}),
    "bench_decode_e4m3.json": ("decode", "", {"pages": "random", "page_table": "host"}),
    "bench_decode_e5m2.json": ("decode", "", {"pages": "random", "page_table": "host"}),
    "bench_mixed.json": ("mixed", "", {"page_table": "host"}),
    "bench_mixed_dtable.json": ("mixed", "device-table", {"page_table": "device"}),
}
MIXES = {  # bench_mixed.c's mixes: (kv_len, q_len, count) per group
    "decode": [(8192, 1, 128)],
    "prefill": [(4096, 128, 4)],
    "hybrid": [(600, 1, 122), (10000, 17, 8)],
    "chunked": [(8192, 1, 254), (2048, 512, 1)],
}


# bench_serving.c's ops on bf16 tensors (the rest: f32 probabilities / logits)
SERVING_BF16 = ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul", "rope_cos_sin_cache",
                "rope_quantize_fp8_mla", "rope_quantize_fp8_append_gqa", "qk_rmsnorm_rope")


def run_ceiling(d):
    """This run's device-to-device copy in TB/s (bench_gather), or None."""
    try:
        rows = json.load(open(os.path.join(d, "bench_gather.json")))
    except (OSError, ValueError):
        return None
    return next((r["tb_s"] for r in rows if r.get("form") == "d2d copy"), None)


def gpu_machine(d):
    """'NVIDIA H200, driver ...; host CPU, N CPUs' from run_device.sh's gpu.txt."""
    try:
        lines = open(os.path.join(d, "gpu.txt")).read().splitlines()
    except OSError:
        return None
    gpu = lines[1].split(", ") if len(lines) > 1 else []
    cpu = next((l.split(":", 1)[1].strip() for l in lines if l.startswith("model name")), None)
    cpus = next((l.split(",")[0].split(":")[1].strip() for l in lines if l.startswith("cpus:")), None)
    out = f"{gpu[0]}, driver {gpu[1]}" if len(gpu) > 1 else "GPU"
    if cpu:
        out += f"; host {cpu}" + (f", {cpus} CPUs" if cpus else "")
    return out


def gpu_records(d):
    recs = []
    ceiling = run_ceiling(d)
    ceil = ceiling or COPY_CEILING
    fi = json_lines(os.path.join(d, "bench_flashinfer.json")) + \
        json_lines(os.path.join(d, "bench_flashinfer_fp8.json")) + \
        json_lines(os.path.join(d, "bench_flashinfer_d256.json"))
    fi_grid = json_lines(os.path.join(d, "bench_flashinfer_grid.json"))
    torch = json_lines(os.path.join(d, "bench_torch.json"))

    def decode_peers(pages, b, l, kv, r0, grid):
        """FlashInfer's two decode paths (and torch, dense K/V, on the main
        cells) on the cell of our row r0: same lengths, shape and K/V dtype."""
        p = {}
        key = (r0["h_qo"], r0["h_kv"], r0["d"], r0["page"])
        for r in (fi_grid if grid else fi):
            if r.get("workload") == "decode" and r.get("pages") == pages and \
                    (r.get("batch"), r.get("kv_len")) == (b, l) and \
                    r.get("kv_dtype", "bf16") == kv and \
                    (r.get("h_qo", 32), r.get("h_kv", 8), r.get("d", 128), r.get("page", 16)) == key and \
                    r["peer"] in ("flashinfer-decode-tc", "flashinfer-decode-cc"):
                p["flashinfer-" + r["peer"][-2:]] = r["us"]
        for r in ([] if grid else torch):  # dense K/V
            if kv == "bf16" and r.get("workload") == "decode" and \
                    (r.get("batch"), r.get("kv_len")) == (b, l):
                p[r["peer"].replace("torch-sdpa-", "torch-")] = r["us"]
        return p

    for name, (suite, tag, extra) in GPU_FILES.items():
        for r in json_lines(os.path.join(d, name)):
            kv = r.get("kv_dtype", r["dtype"])  # the K/V dtype (FP8 decode cells)
            sh = shape(r["h_qo"], r["h_kv"], r["d"], r["page"], kv)
            if suite == "decode":
                b, l = r["batch"], r["kv_len"]
                recs.append(record("decode", cell_name(f"{b}x{l}", r["h_qo"], r["h_kv"], r["d"],
                                                       r["page"], kv, tag),
                                   {**sh, "batch": b, "kv_len": l, "q_len": 1, **extra}, r["us"],
                                   decode_peers(extra["pages"], b, l, kv, r, tag == "grid"),
                                   {"tb_s": rnd(r["tb_s"], 3), "ceiling_tb_s": ceil,
                                    "pct_ceiling": rnd(100 * r["tb_s"] / ceil, 1)}))
            else:
                g = MIXES.get(r["mix"], [])
                peer = {x["peer"]: x["us"] for x in fi
                        if x.get("workload") == "mixed" and x.get("mix") == r["mix"]}
                recs.append(record("mixed", cell_name(r["mix"], r["h_qo"], r["h_kv"], r["d"],
                                                      r["page"], r["dtype"], tag),
                                   {**sh, "mix": r["mix"], "kv_len": [x[0] for x in g],
                                    "q_len": [x[1] for x in g], "count": [x[2] for x in g],
                                    "requests": r["requests"], "queries": r["queries"],
                                    "causal": bool(r.get("causal", 1)), **extra},
                                   r["us"], peer,
                                   {"tb_s": rnd(r["tb_s"], 3), "tflops": rnd(r["tflops"], 1)}))
    # prefill: bench_prefill*.json (bench_prefill_grid.json: the prefill grid)
    fi_pgrid = json_lines(os.path.join(d, "bench_flashinfer_prefill_grid.json"))
    prefill_rows = [(r, os.path.basename(f) == "bench_prefill_grid.json")
                    for f in sorted(glob.glob(os.path.join(d, "bench_prefill*.json")))
                    for r in json_lines(f)]
    for r, grid in prefill_rows:
        paged = r["kv"].startswith("paged")
        page = (r["page"] if "page" in r else int(re.match(r"paged(\d+)", r["kv"]).group(1))) \
            if paged else 0
        b, l = r["batch"], r["len"]
        kvf = "paged" if paged else "ragged"
        peers = {}
        for x in (fi_pgrid if grid else fi):
            heads = (x.get("h_qo", 32), x.get("h_kv", 8), x.get("d", 128))
            if (x.get("workload") == "prefill" and (x.get("batch"), x.get("len")) == (b, l) and
                    heads == (r["h_qo"], r["h_kv"], r["d"]) and
                    (not paged or x.get("page", 16) == page)):
                m = re.fullmatch(r"flashinfer-(fa[23])-" + kvf, x["peer"])
                if m:
                    peers["flashinfer-" + m.group(1)] = x["ms"] * 1e3
        for x in ([] if grid else torch):  # dense K/V
            if (x.get("workload", "prefill") == "prefill" and (x.get("batch"), x.get("len")) == (b, l)
                    and (r["h_qo"], r["h_kv"], r["d"]) == (32, 8, 128)):
                peers[x["peer"].replace("torch-sdpa-", "torch-")] = x["ms"] * 1e3
        recs.append(record("prefill", cell_name(f"{b}x{l}", r["h_qo"], r["h_kv"], r["d"], page,
                                                r["dtype"], "causal" if r.get("causal") else "",
                                                "grid" if grid else ""),
                           {**shape(r["h_qo"], r["h_kv"], r["d"], page, r["dtype"]), "batch": b,
                            "q_len": r.get("q_len", l), "kv_len": r.get("kv_len", l),
                            "causal": bool(r.get("causal")), **({"set": "grid"} if grid else {})},
                           r["ms"] * 1e3, peers, {"tflops": rnd(r["tflops"], 1)}))
    for r in json_lines(os.path.join(d, "bench_overhead.json")):
        if r.get("workload") != "overhead":
            continue
        t = r.get("page_table", "host")
        recs.append(record("host", f"step-{r['batch']}x{r['kv_len']}-32/8-d128-p16-bf16-{t}-table",
                           {**shape(32, 8, 128, 16, "bf16"), "batch": r["batch"],
                            "kv_len": r["kv_len"], "q_len": 1, "page_table": t},
                           r["update_run_us"], None,
                           {k: rnd(r.get(k)) for k in ("update_us", "run_us", "update_graph_us",
                                                       "update_run_spin_us", "update_cpu_ctx_us",
                                                       "gpu_step_us")}))
    fic = {(x["prefix"], x["batch"], x["suffix"]): x["us"]
           for x in json_lines(os.path.join(d, "bench_cascade_flashinfer.json"))
           if x.get("workload") == "cascade"}
    for r in json_lines(os.path.join(d, "bench_cascade.json")):
        if r.get("workload") == "cascade":
            P, B, S = r["prefix"], r["batch"], r["suffix"]
            recs.append(record("cascade", cell_name(f"{P}+{S}x{B}", r["h_qo"], r["h_kv"], r["d"],
                                                    r["page"], r["dtype"]),
                               {**shape(r["h_qo"], r["h_kv"], r["d"], r["page"], r["dtype"]),
                                "batch": B, "prefix_len": P, "suffix_len": S, "kv_len": P + S,
                                "q_len": 1},
                               r["cascade_us"], {"flashinfer-cascade": fic.get((P, B, S))},
                               {"single_us": rnd(r["single_us"]), "auto_us": rnd(r["auto_us"]),
                                "speedup_vs_single": rnd(r["single_us"] / r["cascade_us"])}))
        elif r.get("workload") == "bsr":
            pct = round(100 * r["density"])
            recs.append(record("prefill", cell_name(f"bsr{r['M']}x{r['N']}", r["h_qo"], r["h_kv"],
                                                    r["d"], r["C"], r["dtype"],
                                                    f"b{r['R']}x{r['C']}", f"density{pct}"),
                               {**shape(r["h_qo"], r["h_kv"], r["d"], r["C"], r["dtype"]),
                                "batch": 1, "q_len": r["M"], "kv_len": r["N"],
                                "block": [r["R"], r["C"]], "density": r["density"]},
                               r["us"], None, {"tflops": rnd(r["tflops"], 1), "blocks": r["blocks"]}))
    variant = json_lines(os.path.join(d, "bench_variant.json"))
    rope = {}
    for r in variant:
        if r.get("bench") == "variant_jit":
            recs.append(record("host", f"variant-jit-{r['variant']}-{r['pass']}",
                               {**shape(32, 8, 128, 16, "bf16"), "kv_len": 0, "variant": r["variant"],
                                "pass": r["pass"]},
                               r["plan_create_ms"] * 1e3, None,
                               {"jit_ms": rnd(r["jit_ms"], 3), "kernels": r["kernels"]}))
        elif r.get("bench") == "fused_rope":
            rope.setdefault((r["workload"], r["batch"], r["len"]), {})[r["mode"]] = r
    for (w, b, l), modes in rope.items():
        if "variant" not in modes:
            continue
        r = modes["variant"]
        recs.append(record(w, cell_name(f"{b}x{l}", r["h_qo"], r["h_kv"], r["d"], 16, r["dtype"],
                                        "causal" if w == "prefill" else "", "rope-variant"),
                           {**shape(r["h_qo"], r["h_kv"], r["d"], 16, r["dtype"]), "batch": b,
                            "kv_len": l, "q_len": l if w == "prefill" else 1,
                            "pos_encoding": "rope_llama", "pages": "contiguous"},
                           r["us"], None,
                           {f"{m}_us": rnd(x["us"]) for m, x in modes.items() if m != "variant"}))
    # the serving ops (bench_serving.c) beside their peers (bench_serving_peers.py)
    sv_peers = {}
    for x in json_lines(os.path.join(d, "bench_serving_peers.json")):
        if x.get("workload") == "serving":
            sv_peers.setdefault((x["op"], x["rows"], x["cols"]), {})[x["peer"]] = x["us"]
    for r in json_lines(os.path.join(d, "bench_serving.json")):
        if r.get("workload") != "serving":
            continue
        op, rows, cols = r["op"], r["rows"], r["cols"]
        dtype = "bf16" if op in SERVING_BF16 else "f32"
        recs.append(record("ops", f"{op}-{rows}x{cols}-{dtype}",
                           {**shape(0, 0, 0, 0, dtype), "kv_len": 0, "op": op, "rows": rows,
                            "cols": cols},
                           r["us"], sv_peers.get((op, rows, cols)),
                           {"gb_s": rnd(r["gbps"], 1),
                            "pct_ceiling": rnd(100 * r["gbps"] * 1e9 / (ceil * 1e12), 1)}))
    bal = os.path.join(d, "bench_balance.json")  # the host CPU: split-KV balance
    if os.path.exists(bal):
        recs += cpu_records([], [], None, json.load(open(bal)), None)
    return recs


# ---------------------------------------------------------------- CPU

def best_cells(runs):
    """Per (kind, batch, kv_len, dtype), the cell of smallest median over the rounds."""
    best = {}
    for run in runs:
        for c in run["cells"]:
            k = (c["kind"], c["batch"], c["kv_len"], c["dtype"])
            if c["ms"] > 0 and (k not in best or c["ms"] < best[k]["ms"]):
                best[k] = c
    return best


# bench_serving_ops.c's ops on bf16 rows (the rest: f32 probabilities)
CPU_SERVING_BF16 = ("rmsnorm", "fused_add_rmsnorm", "silu_and_mul")


def cpu_serving_records(serving):
    """bench_serving_ops' cells (with torch's times where
    bench/torch_cpu_serving.py added them): suite ops."""
    recs = []
    threads = serving.get("threads")
    if threads is None:  # bench_serving_ops' own file: "cpu: 2 threads, ..."
        m = re.search(r"(\d+) thread", serving.get("describe", ""))
        threads = int(m.group(1)) if m else None
    for c in serving["cells"]:
        dt = "bf16" if c["op"] in CPU_SERVING_BF16 else "f32"
        t = c.get("torch_ms")
        recs.append(record("ops", f"cpu-{c['op']}-{c['rows']}x{c['cols']}-{dt}",
                           {**shape(0, 0, 0, 0, dt), "kv_len": 0, "op": c["op"], "rows": c["rows"],
                            "cols": c["cols"], "threads": threads},
                           c["ms"] * 1e3, {"torch": t * 1e3} if t else None,
                           {"gb_s": rnd(c.get("gbs"), 1)}))
    return recs


def cpu_records(ours, torch, plan, balance, variant):
    recs = []
    if ours:
        bw = max(r["read_bandwidth_gbs"] for r in ours)
        peak = max(r["fma_peak_gflops"] for r in ours)
        threads = ours[0]["threads"]
        theirs = best_cells(torch)
        for k, c in best_cells(ours).items():
            kind, b, l, dt = k
            t = theirs.get(k)
            recs.append(record("cpu-" + kind, cell_name(f"{b}x{l}", 32, 8, 128, 16, dt,
                                                        "causal" if kind == "prefill" else ""),
                               {**shape(32, 8, 128, 16, dt), "batch": b, "kv_len": l,
                                "q_len": c["qo_len"], "causal": kind == "prefill",
                                "threads": threads},
                               c["ms"] * 1e3, {"torch-sdpa": t["ms"] * 1e3 if t else None},
                               {"gb_s": rnd(c["gbs"], 1), "pct_read_bw": rnd(100 * c["gbs"] / bw, 1),
                                "gflop_s": rnd(c["gflops"], 1),
                                "pct_fma_peak": rnd(100 * c["gflops"] / peak, 1),
                                "read_bw_gb_s": rnd(bw, 1), "fma_peak_gflop_s": rnd(peak, 0)}))
    if plan:
        for r in plan["latency"]:
            for i, w in enumerate((plan["cpu_workers"], plan["gpu_workers"])):
                recs.append(record("host", f"plan-update-{r['kind']}-{r['batch']}-workers{w}",
                                   {**shape(32, 8, 128, 16, "bf16"), "batch": r["batch"],
                                    "kv_len": "U(1024,4096)" if r["kind"] == "decode" else
                                    "U(1024,4096); every 16th request U(2048,8192)",
                                    "q_len": 1 if r["kind"] == "decode" else
                                    "1; every 16th request 128",
                                    "workers": w},
                                   r["update_us"][i], None,
                                   {"schedule_us": rnd(r["schedule_us"][i], 3),
                                    "items": r["items"][i], "split_items": r["split_items"][i],
                                    "total_qo": r["total_qo"], "pages": r["pages"]}))
    if balance:
        for r in balance["rows"]:
            recs.append(record("cpu-decode", f"balance-{r['batch']}xU(4096,16384)-32/8-d128-p16-bf16",
                               {**shape(32, 8, 128, 16, "bf16"), "batch": r["batch"],
                                "kv_len": "U(4096,16384)", "q_len": 1,
                                "threads": balance["threads"]},
                               r["split_ms"] * 1e3, None,
                               {"nosplit_us": rnd(r["nosplit_ms"] * 1e3),
                                "ideal_us": rnd(r["ideal_ms"] * 1e3), "keys": r["keys"],
                                "read_bw_gb_s": balance["read_bandwidth_gbs"],
                                "split_items": r["split_items"]}))
    if variant:
        for w, b, l, q in (("decode", 16, 4096, 1), ("prefill", 1, 2048, 2048)):
            ms = variant[w]["ms"]
            for name, t in ms.items():
                if name.startswith("built-in"):
                    continue
                base = ms.get("built-in soft-cap" if "soft_cap" in name else "built-in")
                recs.append(record("cpu-" + w, cell_name(f"{b}x{l}", 32, 8, 128, 16, "f16",
                                                         "causal" if w == "prefill" else "",
                                                         name.replace(" ", "-")),
                                   {**shape(32, 8, 128, 16, "f16"), "batch": b, "kv_len": l,
                                    "q_len": q, "variant": name.split()[-1]},
                                   t * 1e3, None,
                                   {"builtin_us": rnd(base * 1e3) if base else None}))
        j = variant["jit"]
        recs.append(record("host", f"cpu-variant-jit-{j['variant']}-cold",
                           {**shape(32, 8, 128, 16, j["dtype"]), "kv_len": 0,
                            "variant": j["variant"]},
                           j["cold_compile_s"] * 1e6, None,
                           {"warm_load_us": rnd(j["warm_load_ms"] * 1e3),
                            "builtin_plan_create_us": rnd(j["builtin_plan_create_ms"] * 1e3)}))
    return recs


def cpu_machine(ours):
    model = None
    try:
        model = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                     if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    ctx = ours[0]["machine"] if ours else None
    return "; ".join(x for x in (model, ctx) if x) or "CPU"


# ---------------------------------------------------------------- output

def write(recs, out, commit, machine, fresh):
    for r in recs:
        r["commit"], r["machine"] = commit, machine
    keep = []
    if not fresh:
        new = {(r["suite"], r["cell"]) for r in recs}
        keep = [r for r in json_lines(out) if (r["suite"], r["cell"]) not in new]
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".tmp", "w") as f:
        for r in keep + recs:
            f.write(json.dumps({k: r[k] for k in REQUIRED}) + "\n")
    os.replace(out + ".tmp", out)
    print(f"{out}: {len(recs)} records written, {len(keep)} kept from before")


def check(paths):
    bad = 0
    for p in paths:
        seen = set()
        for i, line in enumerate(open(p), 1):
            try:
                r = json.loads(line)
                assert all(k in r for k in REQUIRED), "missing " + ", ".join(
                    k for k in REQUIRED if k not in r)
                assert r["suite"] in SUITES, "suite " + r["suite"]
                assert all(k in r["params"] for k in PARAMS), "params lack " + ", ".join(
                    k for k in PARAMS if k not in r["params"])
                assert "kv_len" in r["params"], "params lack kv_len"
                assert isinstance(r["ours_us"], (int, float)) and r["ours_us"] > 0, "ours_us"
                assert all(isinstance(v, (int, float)) and v > 0 for v in r["peers"].values()), "peers"
                assert (r["suite"], r["cell"]) not in seen, "duplicate cell " + r["cell"]
                seen.add((r["suite"], r["cell"]))
            except (ValueError, AssertionError, TypeError, KeyError) as e:
                print(f"{p}:{i}: {e}")
                bad += 1
        print(f"{p}: {len(seen)} records" + (f", {bad} bad" if bad else ", all well-formed"))
    return 1 if bad else 0


# ---------------------------------------------------------------- tables

def f(x, fmt="%.1f"):
    return "-" if x is None else fmt % x


def ratio(peer, ours):
    return "-" if not peer or not ours else "%.2fx" % (peer / ours)


NAMES = {"flashinfer": "FlashInfer", "torch-flash": "torch flash", "torch-cudnn": "cuDNN",
         "torch-sdpa": "torch SDPA"}


def peer_columns(rs):
    """(headers, row -> cells): each peer's best time, then peer / ours."""
    peers = sorted({p for r in rs for p in best_peers(r["peers"])},
                   key=lambda p: (not p.startswith("flashinfer"), p))

    def cells(r):
        b = best_peers(r["peers"])
        out = []
        for p in peers:
            fi = {k: v for k, v in r["peers"].items() if k.startswith("flashinfer")}
            path = ""
            if p == "flashinfer" and len(fi) > 1:  # which of its paths was fastest
                path = " (" + min((v, k) for k, v in fi.items())[1].split("-", 1)[1] + ")"
            out.append(f(b.get(p)) + path)
        return out + [ratio(b.get(p), r["ours_us"]) for p in peers]

    head = [NAMES.get(p, p) + " us" for p in peers] + ["vs " + NAMES.get(p, p) for p in peers]
    return head, cells


def md_table(title, head, rows, rs):
    """A titled markdown table and, under it, the commit(s) and machine(s) of its records."""
    foot = ", ".join(sorted({r["commit"] for r in rs})) + "; " + \
        "; ".join(sorted({r["machine"] for r in rs}))
    return "\n".join([f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(row) + " |" for row in rows] + ["", f"_{foot}_", ""])


def tables(recs, suite):
    """The markdown tables of one suite; ratios are the peer's time over ours
    (above 1: ours is faster)."""
    rs = [r for r in recs if r["suite"] == suite]
    out = []

    def group(pred, key=None):
        g = [r for r in rs if pred(r)]
        return sorted(g, key=key) if key else g

    if suite == "decode":
        def lkey(l):  # fixed lengths, then drawn ones ("U(a,b)")
            return (0, l, "") if isinstance(l, (int, float)) else (1, 0, str(l))

        grid = group(lambda r: r["params"].get("set") == "grid",
                     key=lambda r: (r["params"]["kv_dtype"], r["params"]["head_dim"],
                                    r["params"]["page_size"], -r["params"]["heads_qo"],
                                    -r["params"]["heads_kv"], r["params"]["batch"],
                                    lkey(r["params"]["kv_len"])))
        rs = [r for r in rs if r["params"].get("set") != "grid"]

        def dkey(r):
            p = r["params"]
            return (p.get("pages"), p.get("page_table"), p.get("pos_encoding"), p.get("kv_dtype"))
        keys = []
        for r in rs:
            if dkey(r) not in keys:
                keys.append(dkey(r))
        for pages, tab, pos, kv in keys:
            g = group(lambda r: dkey(r) == (pages, tab, pos, kv),
                      key=lambda r: (r["params"]["batch"], r["params"]["kv_len"]))
            if pos:
                head = ["batch", "kv_len", "ours (fused variant) us", "no RoPE us",
                        "separate RoPE pass us", "built-in fused RoPE us"]
                rows = [[str(r["params"]["batch"]), str(r["params"]["kv_len"]), f(r["ours_us"]),
                         f(r["metric"].get("plain_us")), f(r["metric"].get("separate_us")),
                         f(r["metric"].get("builtin_us"))] for r in g]
                out.append(md_table(f"Decode with {pos} RoPE fused through a variant spec", head, rows, g))
                continue
            ph, pc = peer_columns(g)
            ceil = g[0]["metric"].get("ceiling_tb_s")
            head = ["batch", "kv_len", "ours us", "TB/s", f"% of copy ({ceil} TB/s)"] + ph
            rows = [[str(r["params"]["batch"]), str(r["params"]["kv_len"]), f(r["ours_us"]),
                     f(r["metric"].get("tb_s"), "%.2f"), f(r["metric"].get("pct_ceiling"), "%.1f%%")]
                    + pc(r) for r in g]
            kvs = "" if kv in (None, "bf16") else f", {kv.upper()} K/V (bf16 Q)"
            out.append(md_table(f"Decode, {pages} pages, page table in {tab} memory{kvs}", head,
                                rows, g))
        if grid:
            ph, pc = peer_columns(grid)
            ceil = grid[0]["metric"].get("ceiling_tb_s")
            rows = [[f"{r['params']['heads_qo']}/{r['params']['heads_kv']}",
                     str(r["params"]["head_dim"]), str(r["params"]["page_size"]),
                     r["params"]["kv_dtype"], str(r["params"]["batch"]), str(r["params"]["kv_len"]),
                     f(r["ours_us"]), f(r["metric"].get("tb_s"), "%.2f"),
                     f(r["metric"].get("pct_ceiling"), "%.1f%%")] + pc(r) for r in grid]
            out.append(md_table("Decode grid, random pages, page table in host memory",
                                ["heads", "d", "page", "K/V", "batch", "kv_len", "ours us", "TB/s",
                                 f"% of copy ({ceil} TB/s)"] + ph, rows, grid))
    elif suite == "prefill":
        g = group(lambda r: r["params"].get("set") == "grid",
                  key=lambda r: (r["params"]["head_dim"], -r["params"]["heads_qo"],
                                 -r["params"]["heads_kv"], r["params"]["page_size"] == 0,
                                 r["params"]["page_size"], r["cell"]))
        if g:
            ph, pc = peer_columns(g)
            rows = [[f"paged {r['params']['page_size']}" if r["params"]["page_size"] else "ragged",
                     f"{r['params']['heads_qo']}/{r['params']['heads_kv']} d "
                     f"{r['params']['head_dim']}",
                     f"{r['params']['batch']} x {r['params']['q_len']}" +
                     ("" if r["params"]["q_len"] == r["params"]["kv_len"]
                      else f" over {r['params']['kv_len']}"),
                     f(r["ours_us"]), f(r["metric"].get("tflops"))] + pc(r) for r in g]
            out.append(md_table("Prefill grid, causal", ["KV", "heads", "batch x new tokens (over keys)",
                                                         "ours us", "TFLOP/s"] + ph, rows, g))
        rs = [r for r in rs if r["params"].get("set") != "grid"]
        g = group(lambda r: "density" not in r["params"] and "pos_encoding" not in r["params"],
                  key=lambda r: (r["params"]["page_size"] == 0, r["params"]["head_dim"],
                                 -r["params"]["batch"]))
        if g:
            ph, pc = peer_columns(g)
            rows = [[f"paged {r['params']['page_size']}" if r["params"]["page_size"] else "ragged",
                     f"{r['params']['heads_qo']}/{r['params']['heads_kv']} d "
                     f"{r['params']['head_dim']}",
                     f"{r['params']['batch']} x {r['params']['q_len']}", f(r["ours_us"]),
                     f(r["metric"].get("tflops"))] + pc(r) for r in g]
            out.append(md_table("Prefill, causal", ["KV", "heads", "batch x len", "ours us",
                                                    "TFLOP/s"] + ph, rows, g))
        g = group(lambda r: "density" in r["params"], key=lambda r: r["params"]["density"])
        if g:
            rows = [[f"{r['params']['q_len']} x {r['params']['kv_len']}",
                     f"{100 * r['params']['density']:.0f}%", str(r["metric"].get("blocks")),
                     f(r["ours_us"]), f(r["metric"].get("tflops"))] for r in g]
            out.append(md_table("Block-sparse attention, blocks of 128 queries x 64 keys",
                                ["queries x keys", "density", "blocks", "ours us", "TFLOP/s"], rows, g))
        g = group(lambda r: "pos_encoding" in r["params"])
        if g:
            rows = [[f"{r['params']['batch']} x {r['params']['q_len']}", f(r["ours_us"]),
                     f(r["metric"].get("plain_us")), f(r["metric"].get("separate_us"))] for r in g]
            out.append(md_table("Prefill, causal, with RoPE fused through a variant spec",
                                ["batch x len", "ours (fused variant) us", "no RoPE us",
                                 "separate RoPE pass us"], rows, g))
    elif suite == "mixed":
        for tab in ("host", "device"):
            g = group(lambda r: r["params"].get("page_table") == tab)
            if not g:
                continue
            ph, pc = peer_columns(g)
            rows = [[r["params"]["mix"],
                     " + ".join(f"({a}, {b}) x {c}" for a, b, c in
                                zip(r["params"]["kv_len"], r["params"]["q_len"], r["params"]["count"])),
                     f(r["ours_us"]), f(r["metric"].get("tb_s"), "%.2f"), f(r["metric"].get("tflops"))]
                    + pc(r) for r in g]
            out.append(md_table(f"Mixed batches, causal, page table in {tab} memory",
                                ["mix", "(kv_len, q_len) x count", "ours us", "TB/s", "TFLOP/s"] + ph,
                                rows, g))
    elif suite == "cascade":
        ph, pc = peer_columns(rs)
        rows = [[str(r["params"]["prefix_len"]), str(r["params"]["suffix_len"]), str(r["params"]["batch"]),
                 f(r["metric"].get("single_us")), f(r["ours_us"]), f(r["metric"].get("auto_us")),
                 f(r["metric"].get("speedup_vs_single"), "%.1fx")] + pc(r) for r in rs]
        if rows:
            out.append(md_table("Cascade: a shared prefix and a unique suffix per request, decode",
                                ["prefix", "suffix", "batch", "single format us", "ours (cascade) us",
                                 "auto-detected us", "single / cascade"] + ph, rows, rs))
    elif suite == "host":
        g = group(lambda r: r["cell"].startswith("step-"))
        if g:
            m = lambda r, k: f(r["metric"].get(k))
            rows = [[f"{r['params']['batch']} x {r['params']['kv_len']}", r["params"]["page_table"],
                     f(r["ours_us"]), m(r, "update_us"), m(r, "run_us"), m(r, "update_graph_us"),
                     m(r, "update_cpu_ctx_us"), m(r, "gpu_step_us")] for r in g]
            out.append(md_table("Host cost of one decode step, fi_plan_update + fi_plan_run (us)",
                                ["batch x kv_len", "page table", "update + run", "update", "run",
                                 "update + graph launch", "update, CPU context", "GPU step"], rows, g))
        g = group(lambda r: r["cell"].startswith("plan-update-"))
        if g:
            ws = sorted({r["params"]["workers"] for r in g})
            by = {}
            for r in g:
                by.setdefault((r["cell"].split("-")[2], r["params"]["batch"]), {})[r["params"]["workers"]] = r
            rows = [[kind, str(b)] + [f(x[w]["ours_us"], "%.2f") if w in x else "-" for w in ws]
                    + [f(x[ws[-1]]["metric"].get("schedule_us"), "%.2f") if ws[-1] in x else "-"]
                    for (kind, b), x in sorted(by.items())]
            out.append(md_table("fi_plan_update on a CPU context, medians (us)",
                                ["batch kind", "requests"] + [f"{w} workers" for w in ws]
                                + [f"the schedule alone, {ws[-1]} workers"], rows, g))
        g = group(lambda r: "variant-jit" in r["cell"])
        if g:
            rows = []
            for r in g:
                cpu = r["cell"].startswith("cpu-")
                rows.append([r["params"]["variant"], "cpu" if cpu else "cuda", r["cell"].rsplit("-", 1)[1],
                             f(r["ours_us"] / 1e3, "%.2f")])
                if cpu and r["metric"].get("warm_load_us"):  # the CPU's warm load: one record
                    rows.append([r["params"]["variant"], "cpu", "warm",
                                 f(r["metric"]["warm_load_us"] / 1e3, "%.3f")])
            out.append(md_table("A variant's first plan: compiled (cold), from the disk cache (warm), "
                                "from memory (hot)", ["variant", "backend", "pass", "plan create ms"],
                                rows, g))
    elif suite == "ops":
        g = group(lambda r: "op" in r["params"])
        if g:
            ph, pc = peer_columns(g)
            rows = [[r["params"]["op"], f"{r['params']['rows']} x {r['params']['cols']}",
                     r["params"]["kv_dtype"], f(r["ours_us"], "%.2f"), f(r["metric"].get("gb_s")),
                     f(r["metric"].get("pct_ceiling"), "%.0f%%")] + pc(r) for r in g]
            out.append(md_table("Serving ops: GB/s of one pass over the tensors", ["op", "rows x cols",
                                "dtype", "ours us", "GB/s", "% of copy"] + ph, rows, g))
    elif suite in ("cpu-decode", "cpu-prefill"):
        kind = suite[4:]
        g = group(lambda r: "variant" not in r["params"] and not r["cell"].startswith("balance"))
        if g:
            ph, pc = peer_columns(g)
            m = lambda r, k, fmt="%.1f": f(r["metric"].get(k), fmt)
            rows = [[f"{r['params']['batch']} x {r['params']['kv_len']}", r["params"]["kv_dtype"],
                     f(r["ours_us"]), m(r, "gb_s"), m(r, "pct_read_bw", "%.0f%%"), m(r, "gflop_s"),
                     m(r, "pct_fma_peak", "%.0f%%")] + pc(r) for r in g]
            r0 = g[0]["metric"]
            out.append(md_table(f"CPU {kind}, {g[0]['params'].get('threads')} threads (read bandwidth "
                                f"{r0.get('read_bw_gb_s')} GB/s, fp32 FMA peak "
                                f"{f(r0.get('fma_peak_gflop_s'), '%.0f')} GFLOP/s, measured in the run)",
                                ["batch x kv_len", "dtype", "ours us", "GB/s", "% of read BW", "GFLOP/s",
                                 "% of FMA peak"] + ph, rows, g))
        g = group(lambda r: r["cell"].startswith("balance"), key=lambda r: r["params"]["batch"])
        if g:
            rows = [[str(r["params"]["batch"]), f(r["ours_us"]), f(r["metric"].get("nosplit_us")),
                     f(r["metric"].get("ideal_us")), ratio(r["metric"].get("nosplit_us"), r["ours_us"])]
                    for r in g]
            out.append(md_table(f"Split-KV balance on the CPU, kv_len ~ U(4096, 16384), "
                                f"{g[0]['params'].get('threads')} threads (us)",
                                ["batch", "split on", "split off", "ideal (KV bytes / read BW)",
                                 "off / on"], rows, g))
        g = group(lambda r: "variant" in r["params"])
        if g:
            p0 = g[0]["params"]
            rows = [[r["params"]["variant"], f(r["ours_us"]),
                     f(r["metric"].get("builtin_us")), ratio(r["metric"].get("builtin_us"), r["ours_us"])]
                    for r in g]
            out.append(md_table(f"CPU {kind} through a variant's hook kernel, {p0['batch']} x "
                                f"{p0['kv_len']}, {p0['kv_dtype']} (us)",
                                ["variant", "ours (hook kernel) us", "built-in kernel us",
                                 "vs built-in"], rows, g))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpu")
    g.add_argument("dir")
    c = sub.add_parser("cpu")
    c.add_argument("--ours", nargs="+", action="extend", default=[])
    c.add_argument("--torch", nargs="+", action="extend", default=[])
    c.add_argument("--plan")
    c.add_argument("--balance")
    c.add_argument("--variant")
    c.add_argument("--serving")
    for p in (g, c):
        p.add_argument("--out", required=True)
        p.add_argument("--commit")
        p.add_argument("--machine")
        p.add_argument("--fresh", action="store_true")
    t = sub.add_parser("table")
    t.add_argument("file")
    t.add_argument("--suite", action="append")
    k = sub.add_parser("check")
    k.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.cmd == "gpu":
        recs = gpu_records(a.dir)
        write(recs, a.out, a.commit or git_commit(), a.machine or gpu_machine(a.dir) or "GPU", a.fresh)
    elif a.cmd == "cpu":
        ours = [json.load(open(p)) for p in a.ours]
        load = lambda p: json.load(open(p)) if p else None
        recs = cpu_records(ours, [json.load(open(p)) for p in a.torch], load(a.plan),
                           load(a.balance), load(a.variant))
        if a.serving:
            recs += cpu_serving_records(json.load(open(a.serving)))
        write(recs, a.out, a.commit or git_commit(), a.machine or cpu_machine(ours), a.fresh)
    elif a.cmd == "table":
        recs = json_lines(a.file)
        for s in a.suite or SUITES:
            text = tables(recs, s)
            if text:
                print(text)
    else:
        return check(a.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
