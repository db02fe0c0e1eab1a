"""Host cost of the Python layer: run() and plan() of a decode plan reused across
layers, for flashinfer_c and, where it is installed, FlashInfer, in one run.

    python bench/python/bench_host.py [--device cpu|cuda] [--batch 256] [--layers 32]

What is timed is host time per call (time.perf_counter around the call; on
CUDA the calls only queue work, and the GPU is synchronised once per
repetition, outside the timed calls): `run` is one wrapper.run() with out=
given (the engines' form), the median over layers x repetitions;
`plan` is one plan() of a decode batch of --batch requests (host page
table, as vLLM and SGLang pass it), the median over repetitions. The
kernels are tiny (one KV page per request, 8/1 heads, head dim 128) so that
on the CPU backend the C work is small next to the host overhead. Prints one
JSON object per library.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))


def arrays(device):
    if device == "cpu-numpy":
        return None
    import torch

    return torch


def bench(lib, name, device, batch, layers, reps, page_size=16, hq=8, hk=1, d=128):
    torch = arrays(device)
    rng = np.random.default_rng(0)
    pages_per_req = 1
    num_pages = batch * pages_per_req
    indptr = np.arange(batch + 1, dtype=np.int32) * pages_per_req
    indices = rng.permutation(num_pages).astype(np.int32)
    last = np.full(batch, 5, dtype=np.int32)
    dev = "cuda" if device == "cuda" else "cpu"
    if torch is None:
        ws = np.empty(1 << 20, np.uint8)
        caches = [np.zeros((num_pages, 2, page_size, hk, d), np.float16) for _ in range(layers)]
        q = np.zeros((batch, hq, d), np.float16)
        out = np.empty_like(q)
        host = (indptr, indices, last)
    else:
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
        caches = [
            torch.zeros(num_pages, 2, page_size, hk, d, dtype=torch.float16, device=dev)
            for _ in range(layers)
        ]
        q = torch.zeros(batch, hq, d, dtype=torch.float16, device=dev)
        out = torch.empty_like(q)
        host = tuple(torch.from_numpy(a) for a in (indptr, indices, last))
    w = lib.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")

    def plan():
        w.plan(*host, hq, hk, d, page_size, q_data_type="float16", kv_data_type="float16")

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    plan()
    for c in caches:  # warm-up
        w.run(q, c, out=out)
    sync()
    plan_t, run_t = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        plan()
        plan_t.append(time.perf_counter() - t0)
        for c in caches:
            t0 = time.perf_counter()
            w.run(q, c, out=out)
            run_t.append(time.perf_counter() - t0)
        sync()
    return {
        "library": name,
        "device": device,
        "batch": batch,
        "layers": layers,
        "run_us_median": round(statistics.median(run_t) * 1e6, 2),
        "run_us_p10": round(np.percentile(run_t, 10) * 1e6, 2),
        "plan_us_median": round(statistics.median(plan_t) * 1e6, 2),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu", choices=["cpu", "cpu-numpy", "cuda"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args()
    import flashinfer_c

    print(json.dumps(bench(flashinfer_c, "flashinfer_c", a.device, a.batch, a.layers, a.reps)))
    # FlashInfer itself, not the shim of this tree (python/flashinfer): look
    # for it without this tree's python/ on the path.
    here = str(Path(__file__).resolve().parents[2] / "python")
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != here]
    try:
        import flashinfer
    except ImportError:
        print(json.dumps({"library": "flashinfer", "skipped": "not installed"}))
        return
    if getattr(flashinfer, "__name__", "") == "flashinfer_c" or a.device != "cuda":
        print(json.dumps({"library": "flashinfer", "skipped": "needs CUDA and the real package"}))
        return
    print(json.dumps(bench(flashinfer, "flashinfer", a.device, a.batch, a.layers, a.reps)))


if __name__ == "__main__":
    main()
