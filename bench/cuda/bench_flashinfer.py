#!/usr/bin/env python3
"""bench_flashinfer.py — FlashInfer (flashinfer-python, carried to the device
as wheels) on the cells of our CUDA benchmarks, in the same run, with the same
inputs and timing:

  decode   bench/cuda/bench_decode.c's cells: batch {1,16,64,256} x kv_len
           {1024,4096,16384,32768}, 32/8 heads, d 128, bf16, page 16, NHD;
           pages drawn at random from a pool of random values (4 GiB, or
           the largest cell's pages; no page twice in a batch: random pages,
           or --contiguous: the requests' runs back to back from a random
           start), as tests/gpu/gpu_util.h gu_draw_pages. BatchDecodeWithPagedKVCacheWrapper on CUDA
           cores and with use_tensor_cores=True; the faster is FlashInfer's
           number. Small cells rotate over several plans (>= ~300 MB read per
           replay, at most 16) so the 60 MB L2 cannot hold them.
  prefill  bench/cuda/bench_prefill.c's cells: causal, (128,1k) (64,2k) (32,4k)
           (16,8k) (1,16k) (1,32k); BatchPrefillWithPagedKVCacheWrapper (page
           16, a random permutation of the pages) and
           BatchPrefillWithRaggedKVCacheWrapper, backend fa2 (and fa3 with
           --fa3); --heads HQ/HKV and --head-dim D as bench_prefill's (the
           rows name h_qo, h_kv, d).
  mixed    bench/cuda/bench_mixed.c's four mixes through flashinfer.BatchAttention
           (causal, random pages).
  --decode-grid FILE  the decode grid (bench/cuda/decode_grid.txt: head configs,
           head dims, page sizes, K/V dtypes, fixed and drawn lengths), random
           pages from a 4 GiB pool per shape, both decode paths; the rows carry
           "grid": 1 and their shape.
  --prefill-grid FILE  the prefill grid (bench/cuda/prefill_grid.txt: heads, head
           dims, page sizes; drawn lengths and chunks over cached prefixes),
           paged and ragged, fa2 (and fa3 with --fa3).

Timing as ours: a CUDA graph of one run per plan, replayed, device events
around each replay, median of 30 after warm-up (eager events where a capture
is refused, noted in the output). Bytes and FLOPs as ours. One JSON line per
measurement to --json.

  bench_flashinfer.py [--json FILE] [--decode [--kv-dtype e4m3|e5m2]] [--contiguous] [--prefill]
                      [--mixed [--mix NAME]] [--fa3] [--cells 1x1024,...]
                      [--heads HQ/HKV] [--head-dim D] [--decode-grid FILE]
                      [--prefill-grid FILE]
  bench_flashinfer.py --warm decode|prefill|attention|fa3
      build (JIT) one FlashInfer module on a tiny problem, then exit: run
      several at once before timing anything (tests/gpu/run_device.sh).
  bench_flashinfer.py --warm-grid FILE | --warm-prefill-grid FILE [--fa3]
      the same for the decode grid's modules (each head dim and K/V dtype,
      both paths) or the prefill grid's (each head dim and backend), one
      process per module, all at once.
"""
import json
import math
import subprocess
import sys
import time

import torch

import flashinfer
from gpu_timing import median_ms, replay_or_eager

HQ, HKV, D, PS = 32, 8, 128, 16
POOL = 65536
CEILING = 4.22e12
BF16 = torch.bfloat16
DEV = "cuda"

DECODE_B = [1, 16, 64, 256]
DECODE_L = [1024, 4096, 16384, 32768]
PREFILL = [(128, 1024), (64, 2048), (32, 4096), (16, 8192), (1, 16384), (1, 32768)]
MIXES = {
    "decode": [(8192, 1, 128)],
    "prefill": [(4096, 128, 4)],
    "hybrid": [(600, 1, 122), (10000, 17, 8)],
    "chunked": [(8192, 1, 254), (2048, 512, 1)],
}
# the hybrid mix's halves, timed by --mix NAME only (as bench_mixed.c)
HALVES = {"hybrid-decode": [(600, 1, 122)], "hybrid-wide": [(10000, 17, 8)]}

out_file = None  # JSON lines, written as they come (a run cut short keeps them)


def emit(row):
    print(json.dumps(row), flush=True)
    if out_file:
        out_file.write(json.dumps(row) + "\n")
        out_file.flush()


def ws(mb=128):
    return torch.empty(mb << 20, dtype=torch.uint8, device=DEV)


def rand_bf16(*shape, gen=None):
    return (torch.rand(*shape, device=DEV, dtype=torch.float32, generator=gen) * 2 - 1).to(BF16)


def time_replay(fns):
    """Median time of one call (us): a graph of every fn, replayed; eager if
    the capture is refused."""
    replay, mode = replay_or_eager(fns)
    return 1e3 * median_ms(replay, len(fns)), mode


def page_table(lens, contiguous, gen, pool, PS=PS):
    """kv_indptr, kv_indices, last_page_len (int32, on the device) for
    requests of `lens` keys over `pool` pages, no page twice in the batch (as
    a serving engine's requests own their pages): random pages, or the
    requests' runs back to back from a random start."""
    pages = [(l + PS - 1) // PS for l in lens]
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(torch.tensor(pages, dtype=torch.int32), 0)
    total = int(indptr[-1])
    assert total <= pool, f"{total} pages from a pool of {pool}"
    if contiguous:
        start = int(torch.randint(0, pool, (1,), generator=gen))
        indices = ((torch.arange(total) + start) % pool).to(torch.int32)
    else:
        indices = torch.randperm(pool, generator=gen)[:total].to(torch.int32)
    last = torch.tensor([l - PS * (n - 1) for l, n in zip(lens, pages)], dtype=torch.int32)
    return indptr.to(DEV), indices.to(DEV), last.to(DEV)


def kv_pool(pages, PS=PS, HKV=HKV, D=D):
    """K and V caches of `pages` pages of random values, filled in slices
    (a 16 GB cache would need twice that in f32 at once)."""
    g = torch.Generator(device=DEV).manual_seed(42)
    k = torch.empty(pages, PS, HKV, D, dtype=BF16, device=DEV)
    v = torch.empty_like(k)
    for t in (k, v):
        for at in range(0, pages, 16384):
            n = min(16384, pages - at)
            t[at:at + n] = rand_bf16(n, PS, HKV, D, gen=g)
    return k, v


# ------------------------------------------------------------------ decode


FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def draw_lengths(n, lo, hi):
    """n request lengths from U(lo, hi), the same as tests/gpu/gpu_util.h's
    gu_draw_lengths for (n, lo, hi): bench_decode.c times the same requests."""
    M = (1 << 64) - 1
    seed = (n << 40) + (lo << 20) + hi
    out = []
    for i in range(n):
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        z ^= z >> 31
        out.append(lo + z % (hi - lo + 1))
    return out


def decode_cell(B, lo, hi, kv, kv_dtype, contiguous, gen, shape=(HQ, HKV, D, PS), tags=None):
    """Both FlashInfer decode paths (CUDA cores, tensor cores) on one cell of
    B requests of lengths U(lo, hi) (lo == hi: fixed); the faster is its
    number. FP8 (kv_dtype e4m3|e5m2): the caches cast to it, k_scale 0.5 and
    v_scale 2 as bench_decode.c's."""
    hq, hkv, d, ps = shape
    k, v = kv
    kvt, scales = BF16, {}
    if kv_dtype in FP8:
        kvt, scales = FP8[kv_dtype], {"k_scale": 0.5, "v_scale": 2.0}
        k, v = k.to(kvt), v.to(kvt)
    kvb = 2 if kvt == BF16 else 1
    lens = draw_lengths(B, lo, hi)
    L = lo if lo == hi else f"U({lo},{hi})"
    layout = "contiguous" if contiguous else "random"
    nbytes = 2.0 * B * hq * d * 2 + 2.0 * sum(lens) * hkv * d * kvb
    R = max(1, min(16, math.ceil(300e6 / nbytes)))
    q = rand_bf16(B, hq, d)
    o = torch.empty_like(q)
    tables = [page_table(lens, contiguous, gen, k.shape[0], ps) for _ in range(R)]
    row = {"workload": "decode", "pages": layout, "batch": B, "kv_len": L, "kv_dtype": kv_dtype,
           **(tags or {})}
    best = None
    for tc in (False, True):
        name = "flashinfer-decode-" + ("tc" if tc else "cc")
        try:
            wrappers = []
            for indptr, indices, last in tables:
                w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(), "NHD", use_tensor_cores=tc)
                w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=BF16, kv_data_type=kvt)
                wrappers.append(w)
            us, mode = time_replay([lambda w=w: w.run(q, (k, v), out=o, **scales)
                                    for w in wrappers])
            assert torch.isfinite(o[:, :4].float()).all(), "non-finite output"
        except Exception as e:
            print(f"{name} {B}x{L}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        tbs = nbytes / (us * 1e-6) / 1e12
        emit({"peer": name, **row, "us": round(us, 2), "tb_s": round(tbs, 3), "plans": R,
              "timing": mode})
        if best is None or us < best[0]:
            best = (us, tbs, name)
        del wrappers
    if best:
        emit({"peer": "flashinfer-decode", **row, "us": round(best[0], 2),
              "tb_s": round(best[1], 3), "pct_ceiling": round(100 * best[1] * 1e12 / CEILING, 1),
              "path": best[2]})
    torch.cuda.empty_cache()


def bench_decode(cells, contiguous, kv, kv_dtype="bf16"):
    """bench_decode.c's grid (32/8, d 128, page 16)."""
    gen = torch.Generator().manual_seed(7)
    for B in DECODE_B:
        for L in DECODE_L:
            if not cells or f"{B}x{L}" in cells:
                decode_cell(B, L, L, kv, kv_dtype, contiguous, gen)


def read_grid(path):
    """bench/cuda/decode_grid.txt: (heads_qo, heads_kv, head_dim, page_size,
    kv_dtype, [(B, lo, hi), ...]) per line."""
    grid = []
    for line in open(path):
        line = line.split("#")[0].split()
        if not line:
            continue
        heads, d, ps, kvd, cells = line
        hq, hkv = map(int, heads.split("/"))
        cs = []
        for c in cells.split(","):
            b, ls = c.split("x")
            lo, hi = (ls.split("-") + [ls])[:2]
            cs.append((int(b), int(lo), int(hi)))
        grid.append((hq, hkv, int(d), int(ps), kvd, cs))
    return grid


def warm_decode_grid(path, pair=None):
    """FlashInfer's decode modules of every (head dim, K/V dtype) of the grid
    (both paths) built now, on one tiny cell each: one process per pair, all
    at once (each module's build is mostly serial); `pair`: that one alone."""
    gen = torch.Generator().manual_seed(7)
    shapes = {}
    for hq, hkv, d, ps, kvd, _ in read_grid(path):
        shapes.setdefault((d, kvd), (hq, hkv, d, ps))
    if pair is None:
        t0 = time.time()
        bad = run_children([["--warm-grid", path, "--pair", str(i)] for i in range(len(shapes))])
        print(f"flashinfer warm decode grid: {len(shapes)} (head dim, K/V dtype) pairs, "
              f"{bad} failed, {time.time() - t0:.1f} s", flush=True)
        return
    (d, kvd), (hq, hkv, _, ps) = list(shapes.items())[pair]
    decode_cell(1, ps, ps, kv_pool(4, ps, hkv, d), kvd, False, gen, (hq, hkv, d, ps))


def run_children(arg_lists):
    """This script once per argument list, all at once; the number that
    failed."""
    procs = [subprocess.Popen([sys.executable, __file__] + a) for a in arg_lists]
    return sum(p.wait() != 0 for p in procs)


def bench_decode_grid(path):
    """The decode grid (random pages), as tests/gpu/run_device.sh --decode-grid
    runs bench_decode.c on it; rows tagged with their shape."""
    gen = torch.Generator().manual_seed(7)
    for hq, hkv, d, ps, kvd, cells in read_grid(path):
        pool = max(((2 << 30) // (ps * hkv * d * 2)),
                   max(b * ((hi + ps - 1) // ps) for b, _, hi in cells))
        kv = kv_pool(pool, ps, hkv, d)
        for b, lo, hi in cells:
            decode_cell(b, lo, hi, kv, kvd, False, gen, (hq, hkv, d, ps),
                        {"grid": 1, "h_qo": hq, "h_kv": hkv, "d": d, "page": ps})
        del kv
        torch.cuda.empty_cache()


# ----------------------------------------------------------------- prefill


def cell_label(lo, hi, prefix):
    """A prefill cell's length as bench_prefill.c names it: L, "U(lo,hi)" or
    "Q+P" (a chunk of Q tokens over a cached prefix of P)."""
    if prefix:
        return f"{lo}+{prefix}"
    return lo if lo == hi else f"U({lo},{hi})"


def prefill_cell(B, lo, hi, prefix, backends, gen, shape=(HQ, HKV, D, PS), tags=None,
                 formats=("paged", "ragged")):
    """FlashInfer's paged and ragged prefill (each backend) on B requests of
    lengths U(lo, hi) (draw_lengths: bench_prefill.c's requests) over cached
    prefixes of `prefix` keys, causal; random values, random pages."""
    hq, hkv, d, ps = shape
    qlens = draw_lengths(B, lo, hi)
    kvlens = [q + prefix for q in qlens]
    label = cell_label(lo, hi, prefix)
    T, K = sum(qlens), sum(kvlens)
    q = rand_bf16(T, hq, d)
    o = torch.empty_like(q)
    k = rand_bf16(K, hkv, d)
    v = rand_bf16(K, hkv, d)
    pairs = sum(x * (y - x) + x * (x + 1) / 2 for x, y in zip(qlens, kvlens))
    flops = 4.0 * hq * d * pairs
    qo_indptr = torch.tensor([0] + qlens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEV)
    kv_indptr_r = torch.tensor([0] + kvlens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(DEV)
    kv_indptr_p, perm, last = page_table(kvlens, False, gen, sum((x + ps - 1) // ps for x in kvlens), ps)
    kp = rand_bf16(perm.numel(), ps, hkv, d)
    vp = rand_bf16(perm.numel(), ps, hkv, d)
    q_len = qlens[0] if lo == hi else label
    kv_len = kvlens[0] if lo == hi else label
    for backend in backends:
        for kvf in formats:
            name = f"flashinfer-{backend}-{kvf}"
            try:
                if kvf == "paged":
                    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(256), "NHD", backend=backend)
                    w.plan(qo_indptr, kv_indptr_p, perm, last, hq, hkv, d, ps, causal=True,
                           q_data_type=BF16, kv_data_type=BF16)
                    fn = lambda: w.run(q, (kp, vp), out=o)
                else:
                    w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws(256), "NHD", backend=backend)
                    w.plan(qo_indptr, kv_indptr_r, hq, hkv, d, causal=True, q_data_type=BF16,
                           kv_data_type=BF16)
                    fn = lambda: w.run(q, k, v, out=o)
                us, mode = time_replay([fn])
                assert torch.isfinite(o[-4:].float()).all(), "non-finite output"
            except Exception as e:
                print(f"{name} {B}x{label}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            tf = flops / (us * 1e-6) / 1e12
            emit({"peer": name, "workload": "prefill", "kv": kvf, "batch": B, "len": label,
                  "q_len": q_len, "kv_len": kv_len, "h_qo": hq, "h_kv": hkv, "d": d,
                  "page": ps if kvf == "paged" else 0, **(tags or {}),
                  "ms": round(us / 1e3, 4), "tflops": round(tf, 2), "timing": mode})
    del q, o, k, v, kp, vp
    torch.cuda.empty_cache()


def bench_prefill(backends, cells, HQ=HQ, HKV=HKV, D=D):
    """bench_prefill.c's six cells (page 16)."""
    gen = torch.Generator().manual_seed(11)
    for B, L in PREFILL:
        if not cells or f"{B}x{L}" in cells:
            prefill_cell(B, L, L, 0, backends, gen, (HQ, HKV, D, PS))


def read_prefill_grid(path):
    """bench/cuda/prefill_grid.txt: (heads_qo, heads_kv, head_dim, page_size,
    [(B, lo, hi, prefix), ...]) per line."""
    grid = []
    for line in open(path):
        line = line.split("#")[0].split()
        if not line:
            continue
        heads, d, ps, cells = line
        hq, hkv = map(int, heads.split("/"))
        cs = []
        for c in cells.split(","):
            b, ls = c.split("x")
            if "+" in ls:
                ql, pre = ls.split("+")
                cs.append((int(b), int(ql), int(ql), int(pre)))
            else:
                lo, hi = (ls.split("-") + [ls])[:2]
                cs.append((int(b), int(lo), int(hi), 0))
        grid.append((hq, hkv, int(d), int(ps), cs))
    return grid


def bench_prefill_grid(backends, path):
    """The prefill grid, as tests/gpu/run_device.sh --prefill-grid runs
    bench_prefill.c on it; rows carry "grid": 1."""
    gen = torch.Generator().manual_seed(11)
    seen = set()
    for hq, hkv, d, ps, cells in read_prefill_grid(path):
        # ragged KV has no pages: timed on the first line of its heads and dim
        formats = ("paged",) if (hq, hkv, d) in seen else ("paged", "ragged")
        seen.add((hq, hkv, d))
        for b, lo, hi, pre in cells:
            prefill_cell(b, lo, hi, pre, backends, gen, (hq, hkv, d, ps), {"grid": 1}, formats)


def warm_prefill_grid(backends, path, pair=None):
    """FlashInfer's prefill modules (paged and ragged) of every head dim of
    the prefill grid and each backend, one process each, all at once."""
    dims = sorted({d for _, _, d, _, _ in read_prefill_grid(path)})
    pairs = [(d, b) for d in dims for b in backends]
    if pair is None:
        t0 = time.time()
        bad = run_children([["--warm-prefill-grid", path, "--pair", str(i)] + (["--fa3"] if "fa3" in backends else [])
                            for i in range(len(pairs))])
        print(f"flashinfer warm prefill grid: {len(pairs)} (head dim, backend) pairs, "
              f"{bad} failed, {time.time() - t0:.1f} s", flush=True)
        return
    d, backend = pairs[pair]
    prefill_cell(1, 64, 64, 0, [backend], torch.Generator().manual_seed(11), (HQ, HKV, d, PS))


# ------------------------------------------------------------------- mixed


def bench_mixed(kv, only=None):
    k, v = kv
    gen = torch.Generator().manual_seed(13)
    for name, groups in {**MIXES, **HALVES}.items():
        if (only and name != only) or (not only and name in HALVES):
            continue
        qo, lens = [], []
        for kvl, ql, count in groups:
            qo += [ql] * count
            lens += [kvl] * count
        nq = sum(qo)
        nbytes = sum(2.0 * l * HKV * D * 2 + 2.0 * ql * HQ * D * 2 for ql, l in zip(qo, lens))
        flops = sum(4.0 * HQ * D * (ql * (l - ql) + ql * (ql + 1) / 2) for ql, l in zip(qo, lens))
        indptr, indices, _ = page_table(lens, False, gen, k.shape[0])
        qo_indptr = torch.zeros(len(qo) + 1, dtype=torch.int32)
        qo_indptr[1:] = torch.cumsum(torch.tensor(qo, dtype=torch.int32), 0)
        q = rand_bf16(nq, HQ, D)
        o = torch.empty_like(q)
        lse = torch.empty(nq, HQ, dtype=torch.float32, device=DEV)
        try:
            w = flashinfer.BatchAttention("NHD")
            w.plan(qo_indptr.to(DEV), indptr, indices, torch.tensor(lens, dtype=torch.int32, device=DEV),
                   HQ, HKV, D, D, PS, causal=True, q_data_type=BF16, kv_data_type=BF16)
            us, mode = time_replay([lambda: w.run(q, (k, v), out=o, lse=lse)])
            assert torch.isfinite(o[-4:].float()).all(), "non-finite output"
        except Exception as e:
            print(f"flashinfer-batchattention {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        emit({"peer": "flashinfer-batchattention", "workload": "mixed", "mix": name,
              "requests": len(qo), "queries": nq, "us": round(us, 2),
              "tb_s": round(nbytes / (us * 1e-6) / 1e12, 3),
              "tflops": round(flops / (us * 1e-6) / 1e12, 2), "timing": mode})
        del w
        torch.cuda.empty_cache()


# -------------------------------------------------------------------- warm


def warm(what):
    """Build one module (JIT) on a tiny problem."""
    t0 = time.time()
    B, L = 2, 64
    k = rand_bf16(16, PS, HKV, D)
    v = rand_bf16(16, PS, HKV, D)
    indptr = torch.tensor([0, 4, 8], dtype=torch.int32, device=DEV)
    indices = torch.arange(8, dtype=torch.int32, device=DEV)
    last = torch.full((B,), PS, dtype=torch.int32, device=DEV)
    if what == "decode":
        q = rand_bf16(B, HQ, D)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws(16), "NHD")
        w.plan(indptr, indices, last, HQ, HKV, D, PS, q_data_type=BF16, kv_data_type=BF16)
        w.run(q, (k, v))
    elif what in ("prefill", "fa3"):
        backend = "fa2" if what == "prefill" else "fa3"
        q = rand_bf16(B * L, HQ, D)
        qo = torch.tensor([0, L, 2 * L], dtype=torch.int32, device=DEV)
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws(16), "NHD", backend=backend)
        w.plan(qo, indptr, indices, last, HQ, HKV, D, PS, causal=True, q_data_type=BF16, kv_data_type=BF16)
        w.run(q, (k, v))
        kr, vr = rand_bf16(B * L, HKV, D), rand_bf16(B * L, HKV, D)
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws(16), "NHD", backend=backend)
        w.plan(qo, qo, HQ, HKV, D, causal=True, q_data_type=BF16, kv_data_type=BF16)
        w.run(q, kr, vr)
    elif what == "attention":
        q = rand_bf16(B, HQ, D)
        qo = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)
        w = flashinfer.BatchAttention("NHD")
        w.plan(qo, indptr, indices, torch.tensor([L, L], dtype=torch.int32, device=DEV), HQ, HKV, D, D,
               PS, causal=True, q_data_type=BF16, kv_data_type=BF16)
        w.run(q, (k, v))
    torch.cuda.synchronize()
    print(f"flashinfer warm {what}: {time.time() - t0:.1f} s", flush=True)


def main():
    a = sys.argv[1:]
    if "--warm" in a:
        warm(a[a.index("--warm") + 1])
        return
    pair = int(a[a.index("--pair") + 1]) if "--pair" in a else None
    if "--warm-grid" in a:
        warm_decode_grid(a[a.index("--warm-grid") + 1], pair)
        return
    if "--warm-prefill-grid" in a:
        warm_prefill_grid(["fa2"] + (["fa3"] if "--fa3" in a else []), a[a.index("--warm-prefill-grid") + 1], pair)
        return
    global out_file
    if "--json" in a:
        out_file = open(a[a.index("--json") + 1], "w")
    cells = set(a[a.index("--cells") + 1].split(",")) if "--cells" in a else None
    print(f"flashinfer {flashinfer.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}",
          flush=True)
    # the pool: 4 GiB of pages, or the largest batch's pages
    pool = POOL
    if "--mixed" in a:
        pool = max([pool] + [sum(c * ((kvl + PS - 1) // PS) for kvl, _, c in g) for g in MIXES.values()])
    if "--decode" in a:
        pool = max([pool] + [B * (L // PS) for B in DECODE_B for L in DECODE_L
                             if not cells or f"{B}x{L}" in cells])
    kv = kv_pool(pool) if ("--decode" in a or "--mixed" in a) else None
    # the mixes and random-page decode first: a run cut short loses the rest
    if "--mixed" in a:
        bench_mixed(kv, a[a.index("--mix") + 1] if "--mix" in a else None)
    if "--decode" in a:
        bench_decode(cells, False, kv, a[a.index("--kv-dtype") + 1] if "--kv-dtype" in a else "bf16")
    if "--prefill" in a:
        hq, hkv = map(int, a[a.index("--heads") + 1].split("/")) if "--heads" in a else (HQ, HKV)
        d = int(a[a.index("--head-dim") + 1]) if "--head-dim" in a else D
        bench_prefill(["fa2"] + (["fa3"] if "--fa3" in a else []), cells, hq, hkv, d)
    if "--decode" in a and "--contiguous" in a:
        bench_decode(cells, True, kv)
    if "--prefill-grid" in a:
        bench_prefill_grid(["fa2"] + (["fa3"] if "--fa3" in a else []),
                           a[a.index("--prefill-grid") + 1])
    if "--decode-grid" in a:
        del kv
        torch.cuda.empty_cache()
        bench_decode_grid(a[a.index("--decode-grid") + 1])


if __name__ == "__main__":
    main()
