"""Host cost of the Python layer: run() and plan() of the batch wrappers, next
to the bare C calls they make (fi_plan_run / fi_plan_update through ctypes,
on the same arguments), for flashinfer_c and, where it is installed,
FlashInfer, in one run.

    python bench/python/bench_host.py [--device cpu|cpu-numpy|cuda] [--case all]
        [--batch 256] [--run-batch N] [--layers 32] [--reps 200] [--python DIR]
        [--pair DIR]

Cases (--case, default all):
  decode     BatchDecodeWithPagedKVCacheWrapper: run(q, kv_cache[layer], out=out)
             for each layer of a plan reused across --layers layers (the
             engines' form), and plan() of --batch decodes (host page table,
             as vLLM and SGLang pass it)
  prefill    BatchPrefillWithPagedKVCacheWrapper, causal: the same, with
             4 query tokens a request
  attention  BatchAttention: run(q, kv_cache[layer], out=out, lse=lse), and
             plan() (kv_len_arr instead of last_page_len)
  decode-alloc  decode's run() without out= (the output allocated per call)
  decode-step   decode's run() with a plan() of the same batch before each
             repetition's layers (an engine's step; the plan() untimed):
             `first_run_us` is the median of the first run() after plan()

What is timed is host time per call (time.perf_counter_ns around the call;
on CUDA the calls only queue work, and the GPU is synchronised once per
repetition, outside the timed calls). Right after each wrapper call, the
C call it made is timed again on its own: fi_plan_run on the wrapper's C
plan and argument block (`c_run`), fi_plan_update on the batch plan() handed
it (`c_plan`), through ctypes prototypes taking two addresses. `*_overhead` is the
median of (wrapper call - the C call timed right after it): what the
Python layer adds.
All numbers are medians over layers x reps calls (plan: 4 x reps calls; on
CUDA with a run() after each update, the wrapper's and the C one, as in a
serving step; on the CPU backend without, since a run there is a kernel on
the host, which would evict the host caches the next plan() is timed in).

Shapes are tiny (one KV page of 16 tokens per request, 8/1 heads, head dim
128, float16) so the kernels are small next to the host cost; run() is
timed on a plan of --run-batch requests (default: 1 on the CPU backend,
where the kernel runs on the host, else --batch). Prints one JSON object
per library and case.

--python DIR imports flashinfer_c from DIR instead of this tree's python/
(to time another version of the package against the same library).
--pair DIR times the flashinfer_c of DIR too, in the same process, its
repetitions interleaved with this one's (before and after side by side;
both load this tree's build/libflashinfer.so unless FLASHINFER_C_LIB says
otherwise).
"""

import argparse
import ctypes
import importlib
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parents[2] / "python"

PAGE, HQ, HK, D, QLEN = 16, 8, 1, 128, 4


def _torch(device):
    if device == "cpu-numpy":
        return None
    import torch

    return torch


def _page_table(batch, seed=0):
    rng = np.random.default_rng(seed)
    indptr = np.arange(batch + 1, dtype=np.int32)
    indices = rng.permutation(batch).astype(np.int32)
    last = np.full(batch, 5, dtype=np.int32)
    return indptr, indices, last


class Case:
    """One wrapper's plan() and run() as an engine calls them."""

    def __init__(self, lib, case, device, batch, layers):
        self.torch = torch = _torch(device)
        self.lib, self.case, self.device = lib, case, device
        self.dev = "cuda" if device == "cuda" else "cpu"
        qlen = QLEN if case in ("prefill", "attention") else 1
        self.qlen = qlen
        indptr, indices, last = _page_table(batch)
        qo = np.arange(batch + 1, dtype=np.int32) * qlen
        kv_len = np.full(batch, 5, dtype=np.int32)
        if torch is None:
            zeros, empty = np.zeros, np.empty
            f16, f32 = np.float16, np.float32
            ws = np.empty(1 << 20, np.uint8)
            host = lambda a: a  # noqa: E731
        else:
            zeros = lambda *s, dtype: torch.zeros(*s, dtype=dtype, device=self.dev)  # noqa: E731
            empty = lambda *s, dtype: torch.empty(*s, dtype=dtype, device=self.dev)  # noqa: E731
            f16, f32 = torch.float16, torch.float32
            ws = torch.empty(128 << 20, dtype=torch.uint8, device=self.dev)
            host = torch.from_numpy
        self.caches = [zeros((batch, 2, PAGE, HK, D), dtype=f16) for _ in range(layers)]
        self.q = zeros((batch * qlen, HQ, D), dtype=f16)
        self.out = empty((batch * qlen, HQ, D), dtype=f16)
        self.lse = empty((batch * qlen, HQ), dtype=f32)
        opts = dict(q_data_type="float16", kv_data_type="float16")
        if case in ("decode", "decode-alloc", "decode-step"):
            w = lib.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
            args = tuple(host(a) for a in (indptr, indices, last))
            self._plan = lambda: w.plan(*args, HQ, HK, D, PAGE, **opts)
            if case in ("decode", "decode-step"):
                self._run = lambda c: w.run(self.q, c, out=self.out)
            else:
                # the result kept until the next call: the C call timed after it writes there
                self._run = lambda c: setattr(self, "out", w.run(self.q, c))
        elif case == "prefill":
            w = lib.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            args = tuple(host(a) for a in (qo, indptr, indices, last))
            self._plan = lambda: w.plan(*args, HQ, HK, D, PAGE, causal=True, **opts)
            self._run = lambda c: w.run(self.q, c, out=self.out)
        elif case == "attention":
            w = lib.BatchAttention("NHD", device=self.dev)
            args = tuple(host(a) for a in (qo, indptr, indices, kv_len))
            self._plan = lambda: w.plan(*args, HQ, HK, D, D, PAGE, causal=True, **opts)
            self._run = lambda c: w.run(self.q, c, out=self.out, lse=self.lse)
        else:
            raise ValueError(case)
        self.wrapper = w

    def c_plan(self):
        """The C plan a wrapper of flashinfer_c holds (None for FlashInfer)."""
        w = getattr(self.wrapper, "_wrapper", self.wrapper)  # BatchAttention wraps one
        plan = getattr(w, "_plan", None)
        return plan if hasattr(plan, "_args") else None

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()


def _c_calls(plan, pkg):
    """The bare C calls of a flashinfer_c plan: fi_plan_run on its argument
    block as the last run() left it, fi_plan_update on its last batch, each
    through a prototype of this script's taking two addresses (the cheapest
    ctypes call; the same for every version of the package timed)."""
    batch_of = importlib.import_module(pkg.__name__ + "._plan").batch_of
    lib = importlib.import_module(pkg.__name__ + "._lib").lib

    def proto(name):
        f = lib[name]  # a function object of its own
        f.restype, f.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
        return f

    plan_run, plan_update = proto("fi_plan_run"), proto("fi_plan_update")
    run_addr = ctypes.addressof(plan._args)
    arrays = plan._batch  # kept alive here: the C plan reads them (on the CPU) until re-planned
    batch = batch_of(*arrays)
    batch_addr = ctypes.addressof(batch)

    def c_run():
        t0 = time.perf_counter_ns()
        plan_run(plan.handle, run_addr)
        return time.perf_counter_ns() - t0

    def c_update():
        t0 = time.perf_counter_ns()
        plan_update(plan.handle, batch_addr)
        return time.perf_counter_ns() - t0

    c_update.keep = (batch, arrays)
    return c_run, c_update


def _us(ns):
    return round(statistics.median(ns) / 1e3, 2)


class RunTimer:
    """run() of one package: rep() times layers calls (and the C call after each)."""

    def __init__(self, lib, case, device, batch, layers):
        self.c = c = Case(lib, case, device, batch, layers)
        c._plan()
        for cache in c.caches:  # warm-up
            c._run(cache)
        c.sync()
        plan = c.c_plan()
        self.c_run = None if plan is None else _c_calls(plan, lib)[0]
        self.run_t, self.c_run_t, self.first_t = [], [], []
        self.step = case.endswith("-step")

    def rep(self):
        c, c_run, pc = self.c, self.c_run, time.perf_counter_ns
        if self.step:
            c._plan()
        for cache in c.caches:
            t0 = pc()
            c._run(cache)
            self.run_t.append(pc() - t0)
            if c_run is not None:
                self.c_run_t.append(c_run())
        if self.step:
            self.first_t.append(self.run_t[-len(c.caches)])
        c.sync()

    def result(self):
        run_t, c_run_t = self.run_t, self.c_run_t
        r = {"run_us": _us(run_t), "run_us_p10": round(np.percentile(run_t, 10) / 1e3, 2)}
        if c_run_t:
            r["c_run_us"] = _us(c_run_t)
            r["run_overhead_us"] = _us([a - b for a, b in zip(run_t, c_run_t)])
        if self.first_t:
            r["first_run_us"] = _us(self.first_t)
        return r


class PlanTimer:
    """plan() of one package: rep() times one plan() and the C update after it.
    On CUDA a run follows each update (the wrapper's and the C one), as in a
    serving step, so neither update waits for the copy of the one before it
    (a run marks the upload it read: src/cuda/plan.c); on the CPU no run (a
    kernel on the host would evict the caches the next plan() is timed in)."""

    def __init__(self, lib, case, device, batch):
        self.c = c = Case(lib, case, device, batch, 1)
        self.cuda = device == "cuda"
        c._plan()
        c._run(c.caches[0])
        c.sync()
        plan = c.c_plan()
        self.c_update = None if plan is None else _c_calls(plan, lib)[1]
        self.plan_t, self.c_plan_t = [], []

    def _step_run(self):
        if self.cuda:
            self.c._run(self.c.caches[0])
            self.c.sync()

    def rep(self):
        c, pc = self.c, time.perf_counter_ns
        t0 = pc()
        c._plan()
        self.plan_t.append(pc() - t0)
        self._step_run()
        if self.c_update is not None:
            self.c_plan_t.append(self.c_update())
            self._step_run()

    def result(self):
        plan_t, c_plan_t = self.plan_t, self.c_plan_t
        r = {"plan_us": _us(plan_t)}
        if c_plan_t:
            r["c_plan_us"] = _us(c_plan_t)
            r["plan_overhead_us"] = _us([a - b for a, b in zip(plan_t, c_plan_t)])
        return r


def bench(libs, a, case):
    """One case for each (package, name) of libs, their repetitions interleaved
    (one of each in turn), so that a shared machine's drift falls on all alike."""
    run_batch = a.run_batch or (a.batch if a.device == "cuda" else 1)
    outs = []
    for _, name in libs:
        out = {"library": name, "case": case, "device": a.device, "layers": a.layers}
        out["run_batch"] = run_batch
        outs.append(out)
    timers = [RunTimer(lib, case, a.device, run_batch, a.layers) for lib, _ in libs]
    for _ in range(a.reps):
        for t in timers:
            t.rep()
    for out, t in zip(outs, timers):
        out.update(t.result())
    if case not in ("decode-alloc", "decode-step"):
        timers = [PlanTimer(lib, case, a.device, a.batch) for lib, _ in libs]
        for _ in range(a.reps * 4):
            for t in timers:
                t.rep()
        for out, t in zip(outs, timers):
            out["plan_batch"] = a.batch
            out.update(t.result())
    return outs


def _load_pair(directory):
    """The flashinfer_c package of another python/ folder, imported beside this
    one under the name flashinfer_c_pair (its imports are relative), against
    the same library (FLASHINFER_C_LIB: this tree's build, where it has one)."""
    init = Path(directory).resolve() / "flashinfer_c" / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"--pair {directory}: no flashinfer_c/__init__.py there")
    spec = importlib.util.spec_from_file_location(
        "flashinfer_c_pair", init, submodule_search_locations=[str(init.parent)]
    )
    mod = importlib.util.module_from_spec(spec)
    sys.modules["flashinfer_c_pair"] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cpu-numpy", "cuda"])
    ap.add_argument("--case", default="all",
                    choices=["all", "decode", "prefill", "attention", "decode-alloc",
                             "decode-step"])
    ap.add_argument("--batch", type=int, default=256, help="requests of the timed plan()")
    ap.add_argument("--run-batch", type=int, default=0,
                    help="requests of the plan run() is timed on (0: see above)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--python", default=str(HERE), help="where flashinfer_c is imported from")
    ap.add_argument("--pair", metavar="DIR", default=None,
                    help="also time the flashinfer_c of DIR (another python/ folder), "
                         "interleaved with this one, against the same library")
    a = ap.parse_args()
    built = HERE.parent / "build" / "libflashinfer.so"
    if a.pair and built.is_file():
        os.environ.setdefault("FLASHINFER_C_LIB", str(built))
    sys.path.insert(0, a.python)
    import flashinfer_c

    libs = [(flashinfer_c, "flashinfer_c")]
    if a.pair:
        libs.append((_load_pair(a.pair), "flashinfer_c@" + str(Path(a.pair).resolve())))
    cases = ["decode", "prefill", "attention", "decode-alloc", "decode-step"]
    cases = cases if a.case == "all" else [a.case]
    for case in cases:
        for out in bench(libs, a, case):
            print(json.dumps(out), flush=True)
    # FlashInfer itself, not the shim of this tree (python/flashinfer): look
    # for it without this tree's python/ (nor --python) on the path.
    skip = {str(Path(p).resolve()) for p in (HERE, a.python)}
    sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) not in skip]
    try:
        import flashinfer
    except ImportError:
        print(json.dumps({"library": "flashinfer", "skipped": "not installed"}))
        return
    if getattr(flashinfer, "__name__", "") == "flashinfer_c" or a.device != "cuda":
        print(json.dumps({"library": "flashinfer", "skipped": "needs CUDA and the real package"}))
        return
    for case in cases:
        for out in bench([(flashinfer, "flashinfer")], a, case):
            print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
