"""The wrappers' fast run (issue 38's host cost): a run() like one already
checked only patches data pointers in the C plan's argument block. These
tests prime it (the call repeated, as an engine does at every layer) and
show that it gives the full path's results and refuses everything the full
path refuses, with the same exception and message: wrong shapes, dtypes,
devices and types, read-only or overlapping outputs, a cache whose memory
changed, a plan() that failed, run-time options changed since plan().

On numpy, torch CPU tensors and, where the CUDA backend runs, torch CUDA
tensors."""

import numpy as np
import pytest

import flashinfer_c as fi
import npref

try:
    import torch
except ImportError:
    torch = None

BACKENDS = ["numpy"]
if torch is not None:
    BACKENDS.append("torch")
    if torch.cuda.is_available() and fi.cuda_available():
        BACKENDS.append("torch-cuda")

PAGE, HQ, HK, D = 16, 4, 2, 64


class Xp:
    """numpy, or torch on a device, behind one small interface."""

    def __init__(self, name):
        self.name = name
        self.torch = name.startswith("torch")
        self.device = "cuda" if name == "torch-cuda" else "cpu"

    def arr(self, a):
        a = np.ascontiguousarray(a)
        return torch.from_numpy(a.copy()).to(self.device) if self.torch else a.copy()

    def host(self, a):
        return torch.from_numpy(np.array(a)) if self.torch else np.array(a)

    def empty(self, shape, dtype="float32"):
        if self.torch:
            return torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
        return np.empty(shape, dtype)

    def np(self, x):
        return x.detach().cpu().numpy() if self.torch else np.asarray(x)

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()


@pytest.fixture(params=BACKENDS)
def xp(request):
    return Xp(request.param)


def workspace(xp):
    return xp.empty((1 << 16,), "uint8")


def batch(g, kv_lens, layers=3):
    indptr, indices, last = npref.page_table(kv_lens, PAGE, g)
    pages = int(indices.max()) + 1
    caches = [npref.randn(g, pages, 2, PAGE, HK, D) for _ in range(layers)]
    return (indptr, indices, last), caches


def decode(xp, table, **plan_options):
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(xp))
    w.plan(*map(xp.host, table), HQ, HK, D, PAGE, q_data_type="float32", **plan_options)
    return w


def reference(q, cache, table, qo_indptr=None, causal=False, sm_scale=None):
    indptr, indices, last = table
    if qo_indptr is None:
        qo_indptr = np.arange(len(last) + 1, dtype=np.int32)
    return npref.batch_reference(
        q, cache[:, 0], cache[:, 1], qo_indptr, indptr, indices, last, PAGE, causal=causal,
        sm_scale=sm_scale,
    )


def fast(w):
    """Whether the wrapper's next plain run() can take the fast path."""
    plan = getattr(w, "_wrapper", w)._plan
    return plan.memo is not None


def outcome(call):
    """(exception type, message) of a call, or ("ok", None)."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 (the point is to compare them)
        return type(e), str(e)
    return "ok", None


# ------------------------------------------------------------------ decode


def test_decode_fast_run_matches_reference_across_layers(xp):
    g = npref.rng(1)
    table, caches = batch(g, [5, 40, 17])
    w = decode(xp, table)
    kv = [xp.arr(c) for c in caches]
    q = npref.randn(g, 3, HQ, D)
    qx, out = xp.arr(q), xp.empty((3, HQ, D))
    for step in range(3):  # step 0 primes each layer's views; later steps are all fast
        for layer, c in enumerate(kv):
            got = w.run(qx, c, out=out)
            assert got is out
            assert fast(w)
            xp.sync()
            npref.assert_close(xp.np(out), reference(q, caches[layer], table)[0])
    # without out= (allocated per call), with k_scale / v_scale of 1.0 (vLLM's call)
    for c, ref in zip(kv, caches):
        got = w.run(qx, c, k_scale=1.0, v_scale=1.0)
        assert got is not out
        npref.assert_close(xp.np(got), reference(q, ref, table)[0])


def test_decode_fast_run_lse_and_out_alternate(xp):
    g = npref.rng(2)
    table, caches = batch(g, [9, 33], layers=1)
    w = decode(xp, table)
    kv = xp.arr(caches[0])
    q = npref.randn(g, 2, HQ, D)
    qx = xp.arr(q)
    ref_o, ref_lse = reference(q, caches[0], table)
    out, lse = xp.empty((2, HQ, D)), xp.empty((2, HQ))
    for _ in range(2):
        o, s = w.run(qx, kv, return_lse=True)
        npref.assert_close(xp.np(o), ref_o)
        npref.assert_lse_close(xp.np(s), ref_lse)
        s[...] = 7.0
        o = w.run(qx, kv)
        npref.assert_close(xp.np(o), ref_o)
        assert (xp.np(s) == 7.0).all(), "a run without lse wrote the last run's lse"
        o, s = w.run(qx, kv, out=out, lse=lse, return_lse=True)
        assert o is out and s is lse
        npref.assert_lse_close(xp.np(lse), ref_lse)
        o, s = w.run_return_lse(qx, kv)
        npref.assert_lse_close(xp.np(s), ref_lse)


def test_decode_scales_and_options_leave_the_fast_path(xp):
    g = npref.rng(3)
    table, caches = batch(g, [12, 30], layers=1)
    w = decode(xp, table)
    kv = xp.arr(caches[0])
    q = npref.randn(g, 2, HQ, D)
    qx = xp.arr(q)
    ref = reference(q, caches[0], table)[0]
    for _ in range(2):
        npref.assert_close(xp.np(w.run(qx, kv)), ref)
    # v_scale multiplies the output, k_scale the softmax scale: not the fast path's
    npref.assert_close(xp.np(w.run(qx, kv, v_scale=2.0)), 2 * ref)
    scaled = reference(q, caches[0], table, sm_scale=0.5 / D**0.5)[0]
    npref.assert_close(xp.np(w.run(qx, kv, k_scale=0.5)), scaled)
    npref.assert_close(xp.np(w.run(qx, kv)), ref)
    # an attribute FlashInfer's run() reads, set after plan()
    w._sm_scale = 0.5 / D**0.5
    npref.assert_close(xp.np(w.run(qx, kv)), scaled)
    npref.assert_close(xp.np(w.run(qx, kv)), scaled)
    # forward() with the same options at every layer
    for _ in range(3):
        npref.assert_close(xp.np(w.forward(qx, kv)), ref)
    # a new plan() resets them, as FlashInfer's does
    w.plan(*map(xp.host, table), HQ, HK, D, PAGE, q_data_type="float32")
    npref.assert_close(xp.np(w.run(qx, kv)), ref)


def test_decode_new_batch_and_new_strides(xp):
    g = npref.rng(4)
    table, caches = batch(g, [7, 20, 3], layers=1)
    w = decode(xp, table)
    kv = xp.arr(caches[0])
    q = npref.randn(g, 3, HQ, D)
    for _ in range(2):
        npref.assert_close(xp.np(w.run(xp.arr(q), kv)), reference(q, caches[0], table)[0])
    # q a strided view (heads of a wider tensor)
    wide = npref.randn(g, 3, 2 * HQ, D)
    view = xp.arr(wide)[:, ::2]
    npref.assert_close(xp.np(w.run(view, kv)), reference(wide[:, ::2], caches[0], table)[0])
    # the next step: another batch size, the same caches
    table2 = npref.page_table([31, 2], PAGE, g, num_pages=caches[0].shape[0])
    w.plan(*map(xp.host, table2), HQ, HK, D, PAGE, q_data_type="float32")
    q2 = npref.randn(g, 2, HQ, D)
    for _ in range(2):
        npref.assert_close(xp.np(w.run(xp.arr(q2), kv)), reference(q2, caches[0], table2)[0])


def test_next_step_plan_keeps_the_fast_run(xp):
    """An engine's next step: plan() with the same options and batch size,
    other lengths and pages. The fast run stays (same Spec, same C plan) and
    its first run already reads the new batch; a plan() of other options
    drops it."""
    g = npref.rng(15)
    table, caches = batch(g, [7, 20, 3], layers=2)
    w = decode(xp, table)
    kv = [xp.arr(c) for c in caches]
    q = npref.randn(g, 3, HQ, D)
    qx, out = xp.arr(q), xp.empty((3, HQ, D))
    for c in kv:
        w.run(qx, c, out=out)
    assert fast(w)
    table2 = npref.page_table([30, 1, 12], PAGE, g, num_pages=caches[0].shape[0])
    w.plan(*map(xp.host, table2), HQ, HK, D, PAGE, q_data_type="float32")
    assert fast(w)
    for c, ref in zip(kv, caches):
        assert w.run(qx, c, out=out) is out
        xp.sync()
        npref.assert_close(xp.np(out), reference(q, ref, table2)[0])
    w.plan(*map(xp.host, table2), HQ, HK, D, PAGE, q_data_type="float32", sm_scale=0.5)
    assert not fast(w)
    w.run(qx, kv[0], out=out)
    xp.sync()
    npref.assert_close(xp.np(out), reference(q, caches[0], table2, sm_scale=0.5)[0])


def test_decode_cache_changes_are_seen(xp):
    g = npref.rng(5)
    table, caches = batch(g, [10, 25], layers=2)
    w = decode(xp, table)
    q = npref.randn(g, 2, HQ, D)
    qx = xp.arr(q)
    kv = xp.arr(caches[0])
    for _ in range(2):
        w.run(qx, kv)
    # contents written in place (as an engine appends to its cache)
    kv[...] = xp.arr(caches[1])
    npref.assert_close(xp.np(w.run(qx, kv)), reference(q, caches[1], table)[0])
    # a (k, v) tuple of 4-D caches, the same arrays every call
    pair = (xp.arr(caches[0][:, 0]), xp.arr(caches[0][:, 1]))
    for _ in range(2):
        npref.assert_close(xp.np(w.run(qx, pair)), reference(q, caches[0], table)[0])
    if xp.torch:
        # storage swapped under the same tensor object: a new data pointer
        kv.set_(xp.arr(caches[0]))
        npref.assert_close(xp.np(w.run(qx, kv)), reference(q, caches[0], table)[0])


def bad_calls(xp, w, q, kv, out):
    """Calls the full path refuses, each made after the fast path is primed
    (with and without out=, so that each would otherwise be a fast one)."""
    wrong = "float16" if not xp.torch else torch.float16
    q16 = q.astype(np.float16) if not xp.torch else q.to(wrong)
    kv16 = kv.astype(np.float16) if not xp.torch else kv.to(wrong)
    calls = {
        "q dtype": lambda o: w.run(q16, kv, out=o),
        "q heads": lambda o: w.run(xp.arr(np.zeros((q.shape[0], HQ * 2, D), np.float32)), kv),
        "q rank": lambda o: w.run(q[0], kv, out=o),
        "q tokens": lambda o: w.run(xp.arr(np.zeros((q.shape[0] - 1, HQ, D), np.float32)), kv),
        "q type": lambda o: w.run(xp.np(q).tolist(), kv, out=o),
        "out shape": lambda o: w.run(q, kv, out=xp.empty((q.shape[0], HQ, D + 1))),
        "out dtype": lambda o: w.run(q, kv, out=xp.empty((q.shape[0], HQ, D), "float16")),
        "out overlap": lambda o: w.run(q, kv, out=xp.empty((1, HQ, D)).expand(*out.shape)
                                       if xp.torch else np.broadcast_to(out[:1], out.shape)),
        "lse shape": lambda o: w.run(q, kv, lse=xp.empty((q.shape[0], HQ + 1)), return_lse=True),
        "kv dtype": lambda o: w.run(q, kv16, out=o),
        "kv shape": lambda o: w.run(q, kv[:, :, :, :1] if xp.torch else kv[:, :, :, :1].copy(),
                                    out=o),
        "kv type": lambda o: w.run(q, xp.np(kv).tolist(), out=o),
    }
    if not xp.torch:
        ro = np.empty_like(out)
        ro.flags.writeable = False
        calls["out read-only"] = lambda o: w.run(q, kv, out=ro)
    else:
        grad_out = torch.zeros(out.shape, dtype=out.dtype, device=out.device, requires_grad=True)
        calls["out requires grad"] = lambda o: w.run(q, kv, out=grad_out)
        if xp.device == "cuda":
            calls["q device"] = lambda o: w.run(q.cpu(), kv, out=o)
            calls["out device"] = lambda o: w.run(q, kv, out=out.cpu())
            calls["kv device"] = lambda o: w.run(q, kv.cpu(), out=o)
        else:
            calls["q device"] = lambda o: w.run(q.to("meta"), kv, out=o)
    return calls


def prime(w, q, kv, out):
    """Runs that leave the fast path ready for calls with and without out=."""
    w.run(q, kv, out=out)
    w.run(q, kv)
    w.run(q, kv, out=out)
    assert fast(w)


@pytest.mark.parametrize("with_out", [True, False])
def test_refusals_are_the_full_paths(xp, with_out):
    """Each wrong call raises, after priming, exactly what a wrapper that never
    ran raises (same type, same message), and leaves the fast path working."""
    g = npref.rng(6)
    table, caches = batch(g, [6, 19], layers=1)
    q = npref.randn(g, 2, HQ, D)
    qx, out = xp.arr(q), xp.empty((2, HQ, D))
    kv = xp.arr(caches[0])
    primed = decode(xp, table)
    prime(primed, qx, kv, out)
    o = out if with_out else None
    for name, _ in bad_calls(xp, primed, qx, kv, out).items():
        fresh = decode(xp, table)
        want = outcome(lambda: bad_calls(xp, fresh, qx, kv, out)[name](o))
        got = outcome(lambda: bad_calls(xp, primed, qx, kv, out)[name](o))
        assert want[0] != "ok", f"{name}: the full path accepts it"
        assert got == want, name
        # and the next good call is right (and fast again)
        primed.run(qx, kv, out=out)
        xp.sync()
        npref.assert_close(xp.np(out), reference(q, caches[0], table)[0], what=name)
        assert fast(primed)


def test_two_wrappers_share_caches(xp):
    """A cache's views are shared by every wrapper; each checks their dtype
    against its own plan."""
    g = npref.rng(11)
    table, caches = batch(g, [6, 19], layers=1)
    q = npref.randn(g, 2, HQ, D)
    qx, out = xp.arr(q), xp.empty((2, HQ, D))
    kv32 = xp.arr(caches[0])
    kv16 = kv32.half() if xp.torch else kv32.astype(np.float16)
    w32 = decode(xp, table)
    w16 = decode(xp, table, kv_data_type="float16")
    prime(w32, qx, kv32, out)
    prime(w16, qx, kv16, out)
    want = outcome(lambda: decode(xp, table, kv_data_type="float16").run(qx, kv32, out=out))
    assert want[0] is fi.DTypeError
    assert outcome(lambda: w16.run(qx, kv32, out=out)) == want
    npref.assert_close(xp.np(w32.run(qx, kv32)), reference(q, caches[0], table)[0])


def test_cache_resized_in_place(xp):
    """The same cache object with fewer pages: its views are made again, and
    the C library refuses the page table as for any such cache."""
    g = npref.rng(12)
    table, caches = batch(g, [6, 19], layers=1)
    q = npref.randn(g, 2, HQ, D)
    qx, out = xp.arr(q), xp.empty((2, HQ, D))
    kv = xp.arr(caches[0])
    w = decode(xp, table)
    prime(w, qx, kv, out)
    pages = kv.shape[0]
    small = (int(table[1].max()), 2, PAGE, HK, D)  # the largest page id no longer exists
    want = outcome(lambda: decode(xp, table).run(qx, xp.arr(caches[0][: small[0]]), out=out))
    assert want[0] != "ok" and "page" in want[1]
    if not xp.torch:
        # numpy refuses to resize an array that has weak references (the views'
        # record holds one): a remembered numpy cache cannot change its memory
        with pytest.raises(ValueError, match="cannot resize"):
            kv.resize(small, refcheck=False)
        return
    kv.resize_(*small)
    assert kv.shape[0] < pages
    assert outcome(lambda: w.run(qx, kv, out=out)) == want


def test_plan_that_fails_creating_the_c_plan(xp):
    g = npref.rng(13)
    table, caches = batch(g, [6, 19], layers=1)
    q = npref.randn(g, 2, HQ, D)
    qx, out = xp.arr(q), xp.empty((2, HQ, D))
    kv = xp.arr(caches[0])
    w = decode(xp, table)
    prime(w, qx, kv, out)
    with pytest.raises(ValueError, match="divisible"):
        w.plan(*map(xp.host, table), 6, 4, D, PAGE, q_data_type="float32")
    with pytest.raises(RuntimeError, match="before a successful plan"):
        w.run(qx, kv, out=out)


def test_empty_batch(xp):
    g = npref.rng(14)
    table, caches = batch(g, [6, 19], layers=1)
    q = npref.randn(g, 2, HQ, D)
    qx, out = xp.arr(q), xp.empty((2, HQ, D))
    kv = xp.arr(caches[0])
    w = decode(xp, table)
    prime(w, qx, kv, out)
    empty = (np.zeros(1, np.int32), np.zeros(0, np.int32), np.zeros(0, np.int32))
    w.plan(*map(xp.host, empty), HQ, HK, D, PAGE, q_data_type="float32")
    q0 = xp.arr(np.zeros((0, HQ, D), np.float32))
    for _ in range(2):
        assert tuple(w.run(q0, kv).shape) == (0, HQ, D)


def test_failed_plan_is_not_run(xp):
    g = npref.rng(7)
    table, caches = batch(g, [6, 19], layers=1)
    w = decode(xp, table)
    kv = xp.arr(caches[0])
    qx = xp.arr(npref.randn(g, 2, HQ, D))
    for _ in range(2):
        w.run(qx, kv)
    indptr, indices, last = table
    bad_last = last.copy()
    bad_last[0] = PAGE + 1
    with pytest.raises(ValueError):
        w.plan(xp.host(indptr), xp.host(indices), xp.host(bad_last), HQ, HK, D, PAGE,
               q_data_type="float32")
    with pytest.raises(RuntimeError, match="before a successful plan"):
        w.run(qx, kv)


def test_new_plan_dtype_refuses_old_cache(xp):
    g = npref.rng(8)
    table, caches = batch(g, [6, 19], layers=1)
    w = decode(xp, table)
    kv = xp.arr(caches[0])
    qx = xp.arr(npref.randn(g, 2, HQ, D))
    for _ in range(2):
        w.run(qx, kv)
    w.plan(*map(xp.host, table), HQ, HK, D, PAGE, q_data_type="float32",
           kv_data_type="float16")
    with pytest.raises(fi.DTypeError, match="kv_data_type"):
        w.run(qx, kv)


# ------------------------------------------------------ prefill, BatchAttention


def test_prefill_fast_run(xp):
    g = npref.rng(9)
    table, caches = batch(g, [20, 9, 40])
    qo = npref.indptr_of([3, 1, 5])
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(xp))
    w.plan(xp.host(qo), *map(xp.host, table), HQ, HK, D, PAGE, causal=True,
           q_data_type="float32")
    q = npref.randn(g, int(qo[-1]), HQ, D)
    qx, out = xp.arr(q), xp.empty(q.shape)
    kv = [xp.arr(c) for c in caches]
    for _ in range(2):
        for c, ref in zip(kv, caches):
            w.run(qx, c, out=out)
            assert fast(w)
            xp.sync()
            npref.assert_close(xp.np(out), reference(q, ref, table, qo, causal=True)[0])
    # the next step's plan (the same options): the fast path again
    w.plan(xp.host(qo), *map(xp.host, table), HQ, HK, D, PAGE, causal=True,
           q_data_type="float32")
    o, s = w.run(qx, kv[0], return_lse=True)
    ref_o, ref_s = reference(q, caches[0], table, qo, causal=True)
    npref.assert_close(xp.np(o), ref_o)
    npref.assert_lse_close(xp.np(s), ref_s)
    with pytest.raises(fi.DTypeError):
        w.run(qx, kv[0].astype(np.float16) if not xp.torch else kv[0].half())


def test_batch_attention_fast_run(xp):
    g = npref.rng(10)
    table, caches = batch(g, [20, 1, 40])
    qo = npref.indptr_of([4, 1, 2])
    indptr, indices, last = table
    kv_len = np.array([20, 1, 40], np.int32)
    w = fi.BatchAttention("NHD", device=xp.device)
    w.plan(xp.host(qo), xp.host(indptr), xp.host(indices), xp.host(kv_len), HQ, HK, D, D,
           PAGE, causal=True, q_data_type="float32", kv_data_type="float32")
    q = npref.randn(g, int(qo[-1]), HQ, D)
    qx = xp.arr(q)
    out, lse = xp.empty(q.shape), xp.empty(q.shape[:2])
    kv = [xp.arr(c) for c in caches]
    for _ in range(2):
        for c, ref in zip(kv, caches):
            o, s = w.run(qx, c, out=out, lse=lse)
            assert o is out and s is lse and fast(w)
            xp.sync()
            ref_o, ref_s = reference(q, ref, table, qo, causal=True)
            npref.assert_close(xp.np(out), ref_o)
            npref.assert_lse_close(xp.np(lse), ref_s)
    o, s = w.run(qx, kv[0])
    npref.assert_close(xp.np(o), reference(q, caches[0], table, qo, causal=True)[0])
    o, _ = w.run(qx, kv[0], v_scale=2.0)
    npref.assert_close(xp.np(o), 2 * reference(q, caches[0], table, qo, causal=True)[0])
    bad = kv_len.copy()
    bad[1] = PAGE + 1
    with pytest.raises(ValueError, match=r"kv_len_arr\[1\]=17 does not fit"):
        w.plan(xp.host(qo), xp.host(indptr), xp.host(indices), xp.host(bad), HQ, HK, D, D,
               PAGE, causal=True, q_data_type="float32", kv_data_type="float32")


# ------------------------------------------------------------ plan()'s host work


def test_batch_attention_last_page_lens_paths_agree():
    """BatchAttention.plan() derives last_page_len in int32 where every request
    has pages and page_size * pages fits; any other batch takes the int64
    form. Both give the same lengths or the same error, on edges included."""
    from flashinfer_c.attention import _last_page_lens, _last_page_lens_any

    g = npref.rng(21)
    cases = []
    for trial in range(400):
        n = int(g.integers(0, 12))
        ps = int(g.choice([1, 3, 16, 64]))
        pages = g.integers(0 if trial % 3 == 0 else 1, 5, n)
        ptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        lens = ((pages - 1) * ps + g.integers(-1, ps + 2, n)).astype(np.int32)
        if n and trial % 5 == 0:
            lens[g.integers(0, n)] = g.choice([-(2**31), 2**31 - 1, -1, 0])
        cases.append((ptr, lens, ps))
    # page_size * pages at the int32 limit, and past it
    big = 2**31 - 1
    for ps in (big, 2**30, 2**16):
        for total in (1, 2):
            ptr = np.array([0, total], np.int32)
            for length in (1, ps, ps * total if ps * total <= big else big, big, -(2**31)):
                cases.append((ptr, np.array([length], np.int32), ps))
    cases.append((np.array([0, 1], np.int32), np.array([5], np.int32), np.int64(16)))

    def result(f, ptr, lens, ps):
        try:
            r = f(ptr, lens, ps)
        except ValueError as e:
            return "error", str(e)
        return r.dtype, r.tolist()

    for ptr, lens, ps in cases:
        assert result(_last_page_lens, ptr, lens, ps) == result(
            _last_page_lens_any, ptr, lens, ps
        ), (ptr, lens, ps)


@pytest.mark.parametrize("strided", [False, True])
def test_plans_of_new_shapes_after_cached_ones(xp, strided):
    """plan() reuses what it cached from the last plan() (Spec, query indptr,
    page-size rows): later plans of other batch sizes, lengths (requests
    without pages among them) and page-table strides still compute right."""
    g = npref.rng(22)
    w = fi.BatchAttention("NHD", device=xp.device)
    d = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(xp))
    for kv_lens in ([20, 1, 40], [20, 1, 40], [7, 0, 33, 16], [5], [0, 9, 0], [16, 17, 3]):
        table, caches = batch(g, kv_lens, layers=1)
        indptr, indices, last = table
        if strided:  # the page table as every other entry of a larger array
            spread = np.zeros(2 * len(indices), np.int32)
            spread[::2] = indices
            host_indices = xp.host(spread)[::2]
        else:
            host_indices = xp.host(indices)
        kv = xp.arr(caches[0])
        qo = npref.indptr_of([2] * len(kv_lens))
        w.plan(xp.host(qo), xp.host(indptr), host_indices, xp.host(np.array(kv_lens, np.int32)),
               HQ, HK, D, D, PAGE, causal=True, q_data_type="float32",
               kv_data_type="float32")
        q = npref.randn(g, int(qo[-1]), HQ, D)
        o, _ = w.run(xp.arr(q), kv)
        npref.assert_close(xp.np(o), reference(q, caches[0], table, qo, causal=True)[0])
        d.plan(xp.host(indptr), host_indices, xp.host(last), HQ, HK, D, PAGE,
               q_data_type="float32")
        q1 = npref.randn(g, len(kv_lens), HQ, D)
        npref.assert_close(xp.np(d.run(xp.arr(q1), kv)), reference(q1, caches[0], table)[0])


# ------------------------------------------------- plan()'s page table, run()'s out


def test_usual_page_table_is_the_array_by_array_one(xp):
    """The one-pass check of the usual host int32 page table gives what the
    array-by-array path gives; every call it does not take (other dtypes,
    shapes, bad values) goes that path, with its error."""
    from flashinfer_c import _host

    names = ("indptr", "indices", "last_page_len")
    indptr = np.array([2, 4, 4, 7], np.int32)  # starts past 0, as vLLM's prefill slice
    indices = np.array([9, 8, 1, 2, 3, 4, 5, 6, 0], np.int32)
    last = np.array([3, 0, 16], np.int32)
    for checked in (False, True):
        ptr = xp.host(indptr)
        ptr = _host.CheckedIndptr(np.array(indptr)) if checked else ptr
        args = (ptr, xp.host(indices), xp.host(last))
        got = _host._usual_page_table(*args, None)
        assert got is not None
        want_ptr, want_idx, want_last = indptr - 2, indices[2:7], last
        for a, b in zip(_host.page_table(*args, names), (want_ptr, want_idx, want_last)):
            assert a.dtype == np.int32 and a.tolist() == b.tolist()
        assert not np.shares_memory(got[1], indices)  # the C plan keeps a copy of its own
    bad = [
        (indptr.astype(np.int64), indices, last),  # int64 indptr
        (indptr, indices, last.astype(np.int64)),
        (indptr, indices, last[:2]),  # too few lengths
        (np.array([0, 3, 2, 4], np.int32), indices, last),  # decreasing
        (np.array([-1, 3, 4, 4], np.int32), indices, last),  # negative start
        (np.array([0, 3, 4, 12], np.int32), indices, last),  # past the indices
        (np.zeros(0, np.int32), indices, last),  # empty indptr
        (indptr, indices.reshape(3, 3), last),  # 2-D indices
    ]
    for ptr, idx, lens in bad:
        args = (xp.host(ptr), xp.host(idx), xp.host(lens))
        assert _host._usual_page_table(*args, None) is None
        kind, message = outcome(lambda: _host.page_table(*args, names))
        assert kind not in ("ok", None) and message
    # a batch size other than the caller's
    args = tuple(map(xp.host, (indptr, indices, last)))
    assert _host._usual_page_table(*args, 2) is None
    with pytest.raises(ValueError, match="expected batch_size"):
        _host.page_table(*args, names, batch=2)


def test_fresh_out_of_the_fast_run_is_the_full_paths(xp):
    """run() without out=: the fast path's array has the full path's shape,
    dtype, strides and device, also for a strided q (then not q's strides)."""
    g = npref.rng(7)
    table, caches = batch(g, [6, 21], layers=1)
    w = decode(xp, table)
    kv = xp.arr(caches[0])
    q = npref.randn(g, 2, HQ, D)
    wide = np.zeros((2, HQ, 2 * D), np.float32)
    wide[:, :, :D] = q
    for qx in (xp.arr(q), xp.arr(wide)[:, :, :D]):
        first = w.run(qx, kv)  # the full path
        assert fast(w)
        second = w.run(qx, kv)  # the fast path
        assert second is not first
        for o in (first, second):
            assert tuple(o.shape) == (2, HQ, D)
            strides = o.stride() if xp.torch else o.strides
            want = (HQ * D, D, 1) if xp.torch else (HQ * D * 4, D * 4, 4)
            assert tuple(strides) == want
            if xp.torch:
                assert o.device == qx.device and o.dtype == qx.dtype and not o.requires_grad
        xp.sync()
        npref.assert_close(xp.np(second), reference(q, caches[0], table)[0])


def test_run_keeps_no_cache_alive(xp):
    """The views remembered for a KV cache (and the fast run's record of it)
    hold weak references only: a cache the engine drops is freed, as a single
    tensor and as a (k_cache, v_cache) pair."""
    import gc
    import weakref

    g = npref.rng(9)
    table, caches = batch(g, [7, 20], layers=1)
    w = decode(xp, table)
    q = xp.arr(npref.randn(g, 2, HQ, D))
    out = xp.empty((2, HQ, D))
    kv = xp.arr(caches[0])
    pair = (xp.arr(caches[0][:, 0]), xp.arr(caches[0][:, 1]))
    for _ in range(3):  # the full run, then fast ones
        w.run(q, kv, out=out)
        w.run(q, pair, out=out)
    xp.sync()
    refs = [weakref.ref(kv), weakref.ref(pair[0]), weakref.ref(pair[1])]
    del kv, pair
    gc.collect()
    assert all(r() is None for r in refs)
