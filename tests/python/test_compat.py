"""FlashInfer's names and call forms beyond the core wrappers (issue 38): the
`import flashinfer` switch, the names engines import, forward(), fast decode
plans, the CUDA-graph decode wrapper, shared-prefix and POD wrappers,
attention sinks, scales, workspace checks. numpy only (runs without torch),
checked against the fp64 reference of npref.py."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import flashinfer_c
import npref
from npref import assert_close, assert_lse_close

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fi():
    """flashinfer_c installed as `flashinfer` for the test, then removed."""
    flashinfer_c.install_as_flashinfer()
    import flashinfer

    yield flashinfer
    flashinfer_c.uninstall_as_flashinfer()


def workspace():
    return np.empty(1 << 16, dtype=np.uint8)


def paged_batch(g, kv_lens, page_size=16, hk=2, d=64, layout="NHD", dtype="float32"):
    indptr, indices, last = npref.page_table(kv_lens, page_size, g)
    pages = int(indices.max()) + 1 if indices.size else 1
    shape = (pages, 2, page_size, hk, d) if layout == "NHD" else (pages, 2, hk, page_size, d)
    kv = npref.randn(g, *shape, dtype=dtype)
    return indptr, indices, last, kv


def decode_ref(q, kv, indptr, indices, last, page_size, layout="NHD", **options):
    qo = np.arange(len(last) + 1, dtype=np.int32)
    return npref.batch_reference(
        q, kv[:, 0], kv[:, 1], qo, indptr, indices, last, page_size, layout, **options
    )


# ---------------------------------------------------------------- the switch


def test_switch_maps_flashinfer_to_flashinfer_c(fi):
    import flashinfer.cascade
    import flashinfer.decode
    import flashinfer.prefill

    assert fi is flashinfer_c
    assert flashinfer.decode is flashinfer_c.decode
    assert sys.modules["flashinfer.prefill"] is flashinfer_c.prefill
    assert flashinfer_c.installed_as_flashinfer()


VLLM_IMPORTS = """
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
)
from flashinfer.decode import _get_range_buf, trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache
from flashinfer.utils import FP4Tensor
"""

SGLANG_IMPORTS = """
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    fast_decode_plan,
)
from flashinfer.cascade import merge_state
from flashinfer.decode import get_seq_lens
from flashinfer.norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm, rmsnorm
from flashinfer.activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from flashinfer.sampling import (
    min_p_sampling_from_probs,
    top_k_renorm_prob,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_prob,
)
from flashinfer import BatchMLAPagedAttentionWrapper
"""

OTHER_IMPORTS = """
import flashinfer.attention, flashinfer.pod, flashinfer.mla, flashinfer.jit, flashinfer.topk
import flashinfer.page, flashinfer.sparse, flashinfer.rope, flashinfer.quantization
from flashinfer import (
    BatchAttention,
    BatchAttentionWithAttentionSinkWrapper,
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    BatchPODWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    PODWithPagedKVCacheWrapper,
    single_decode_with_kv_cache,
    single_prefill_with_kv_cache,
)
from flashinfer.page import append_paged_kv_cache, get_batch_indices_positions
"""


@pytest.mark.parametrize("lines", [VLLM_IMPORTS, SGLANG_IMPORTS, OTHER_IMPORTS])
def test_engine_import_lines(fi, lines):
    exec(compile(lines, "<engine imports>", "exec"), {})


@pytest.mark.parametrize(
    "name",
    [
        "flashinfer.decode.trtllm_batch_decode_with_kv_cache",
        "flashinfer.prefill.trtllm_batch_context_with_kv_cache",
        "flashinfer.decode.xqa_batch_decode_with_kv_cache",
        "flashinfer.prefill.cudnn_batch_prefill_with_kv_cache",
        "flashinfer.BatchMLAPagedAttentionWrapper",
        "flashinfer.gemm.bmm_fp8",
    ],
)
def test_foreign_names_raise_saying_what_to_use(fi, name):
    module, attr = name.rsplit(".", 1)
    target = getattr(__import__(module, fromlist=["_"]), attr)
    with pytest.raises(NotImplementedError, match="not provided by flashinfer_c.*use "):
        target(None)


def test_unknown_names_and_modules(fi):
    with pytest.raises(ImportError, match="nonexistent"):
        exec("from flashinfer.sampling import nonexistent", {})
    with pytest.raises(ModuleNotFoundError, match="flashinfer.no_such_module"):
        exec("import flashinfer.no_such_module", {})
    with pytest.raises(ModuleNotFoundError, match="private"):
        exec("import flashinfer._plan", {})


def _run_python(code, env_extra):
    env = dict(os.environ)
    env.update(env_extra)
    env["PYTHONPATH"] = str(ROOT / "python") + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_shim_package_with_environment_variable():
    code = (
        "import flashinfer, flashinfer_c, flashinfer.decode as d\n"
        "assert flashinfer is flashinfer_c and d is flashinfer_c.decode\n"
        "print('ok')\n"
    )
    r = _run_python(code, {"FLASHINFER_C_AS_FLASHINFER": "1"})
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_shim_package_without_the_variable_says_how():
    r = _run_python("import flashinfer", {"FLASHINFER_C_AS_FLASHINFER": ""})
    assert r.returncode != 0
    assert "FLASHINFER_C_AS_FLASHINFER=1" in r.stderr


# ------------------------------------------------------------ small helpers


def test_get_range_buf_and_seq_lens(fi):
    from flashinfer.decode import _get_range_buf, get_seq_lens

    assert np.array_equal(np.asarray(_get_range_buf(5, "cpu")), np.arange(5))
    indptr = np.array([0, 2, 2, 5], dtype=np.int32)
    last = np.array([3, 0, 16], dtype=np.int32)
    assert np.array_equal(get_seq_lens(indptr, last, 16), [19, 0, 48])


def test_norm_and_activation(fi):
    g = npref.rng()
    x = npref.randn(g, 3, 64)
    w = npref.randn(g, 64)
    ref = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(fi.norm.rmsnorm(x, w), ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        fi.norm.gemma_rmsnorm(x, w), ref / w * (1 + w), rtol=1e-4, atol=1e-4
    )
    r, x2 = x.copy(), x.copy()
    fi.norm.fused_add_rmsnorm(x2, r, w)
    np.testing.assert_allclose(r, 2 * x, rtol=1e-6)
    np.testing.assert_allclose(x2, fi.norm.rmsnorm(2 * x, w), rtol=1e-5, atol=1e-5)
    y = npref.randn(g, 4, 2 * 32)
    a, b = y[:, :32].astype(np.float64), y[:, 32:]
    np.testing.assert_allclose(fi.activation.silu_and_mul(y), a / (1 + np.exp(-a)) * b,
                               rtol=1e-5, atol=1e-6)
    gelu = 0.5 * a * (1 + np.vectorize(math.erf)(a / math.sqrt(2)))
    np.testing.assert_allclose(fi.activation.gelu_and_mul(y), gelu * b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------- wrapper call forms


def test_workspace_alignment_checked(fi):
    buf = np.empty(4096 + 1, dtype=np.uint8)
    offset = (-buf.ctypes.data) % 16 + 1  # an address that is not 16-byte aligned
    with pytest.raises(ValueError, match="16-byte aligned"):
        fi.BatchDecodeWithPagedKVCacheWrapper(buf[offset:])
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    with pytest.raises(ValueError, match="16-byte aligned"):
        w.reset_workspace_buffer(buf[offset:], workspace())


def test_workspace_size(fi):
    g = npref.rng()
    indptr, indices, last, _ = paged_batch(g, [5, 40, 17])
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    float_bytes, int_bytes = w.workspace_size(
        indptr, indices, last, 4, 2, 64, 16, q_data_type="float32"
    )
    assert float_bytes > 0 and int_bytes == 0
    with pytest.raises(RuntimeError, match="before a successful plan"):
        w.run(np.zeros((3, 4, 64), np.float32), np.zeros((4, 2, 16, 2, 64), np.float32))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_forward_and_options(fi, layout):
    """plan() then forward() with sm_scale / logits_soft_cap (SGLang's decode call),
    fixed_split_size=-1 (vLLM's default), k_scale / v_scale."""
    g = npref.rng(1)
    page_size, hq, hk, d = 16, 8, 2, 64
    kv_lens = [1, 33, 70, 16]
    indptr, indices, last, kv = paged_batch(g, kv_lens, page_size, hk, d, layout)
    q = npref.randn(g, len(kv_lens), hq, d)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout, use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type="float32",
           fixed_split_size=-1, sm_scale=0.2)
    assert w._sm_scale == 0.2 and w._logits_soft_cap == 0.0 and w._window_left == -1
    ref, ref_lse = decode_ref(q, kv, indptr, indices, last, page_size, layout, sm_scale=0.2)
    o, lse = w.run(q, kv, return_lse=True)
    assert_close(o, ref)
    assert_lse_close(lse, ref_lse)
    # forward() sets the run-time options (FlashInfer's defaults included)
    o = w.forward(q, kv, sm_scale=0.1, logits_soft_cap=5.0, k_scale=0.5, v_scale=2.0)
    ref2, _ = decode_ref(q, kv, indptr, indices, last, page_size, layout, sm_scale=0.05,
                         logits_soft_cap=5.0)
    assert_close(o, 2.0 * ref2)
    assert w._sm_scale == 0.1 and w._logits_soft_cap == 5.0
    # run() keeps the options forward() set, until the next plan()
    assert_close(w.run(q, kv), decode_ref(q, kv, indptr, indices, last, page_size, layout,
                                          sm_scale=0.1, logits_soft_cap=5.0)[0])
    o, lse = w.forward_return_lse(q, kv)  # defaults: 1/sqrt(d), no soft-cap
    ref3, ref3_lse = decode_ref(q, kv, indptr, indices, last, page_size, layout)
    assert_close(o, ref3)
    assert_lse_close(lse, ref3_lse)


def test_prefill_forward_options_and_three_d_caches(fi):
    """SGLang's paged prefill: page_size 1 over [tokens, H, D] pools passed as a
    tuple, forward(causal=, sm_scale=, logits_soft_cap=, k_scale=, v_scale=)."""
    g = npref.rng(2)
    hq, hk, d = 4, 2, 64
    pool = 200
    k_pool, v_pool = npref.randn(g, pool, hk, d), npref.randn(g, pool, hk, d)
    qo_lens, kv_lens = [3, 1, 7], [10, 4, 7]
    qo = npref.indptr_of(qo_lens)
    kv_indptr = npref.indptr_of(kv_lens)
    kv_indices = g.permutation(pool)[: kv_indptr[-1]].astype(np.int32)
    last = np.ones(len(kv_lens), np.int32)
    q = npref.randn(g, int(qo[-1]), hq, d)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    w.begin_forward(qo, kv_indptr, kv_indices, last, hq, hk, d, 1, q_data_type="float32")
    o = w.forward(q, (k_pool, v_pool), causal=True, sm_scale=0.3, logits_soft_cap=20.0,
                  k_scale=1.0, v_scale=1.0)
    ref, _ = npref.batch_reference(q, k_pool[:, None], v_pool[:, None], qo, kv_indptr,
                                   kv_indices, last, 1, causal=True, sm_scale=0.3,
                                   logits_soft_cap=20.0)
    assert_close(o, ref)
    assert w._causal is True
    o, lse = w.forward_return_lse(q, (k_pool, v_pool), causal=False, sm_scale=0.3)
    ref, ref_lse = npref.batch_reference(q, k_pool[:, None], v_pool[:, None], qo, kv_indptr,
                                         kv_indices, last, 1, sm_scale=0.3)
    assert_close(o, ref)
    assert_lse_close(lse, ref_lse)


def test_ragged_forward_return_lse_and_merge(fi):
    """SGLang's extend: ragged new tokens (causal) + paged prefix, merged."""
    g = npref.rng(3)
    hq, hk, d = 4, 4, 64
    new_lens, prefix_lens = [5, 2], [8, 0]
    qo = npref.indptr_of(new_lens)
    q = npref.randn(g, int(qo[-1]), hq, d)
    k_new, v_new = npref.randn(g, int(qo[-1]), hk, d), npref.randn(g, int(qo[-1]), hk, d)
    pool = 32
    k_pool, v_pool = npref.randn(g, pool, hk, d), npref.randn(g, pool, hk, d)
    kv_indptr = npref.indptr_of(prefix_lens)
    kv_indices = g.permutation(pool)[: kv_indptr[-1]].astype(np.int32)
    ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD")
    ragged.begin_forward(qo, qo, hq, hk, d, q_data_type="float32")
    paged = fi.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    paged.begin_forward(qo, kv_indptr, kv_indices, np.ones(2, np.int32), hq, hk, d, 1,
                        q_data_type="float32")
    o1, s1 = ragged.forward_return_lse(q, k_new, v_new, causal=True, sm_scale=0.125)
    o2, s2 = paged.forward_return_lse(q, (k_pool, v_pool), causal=False, sm_scale=0.125)
    o, _ = fi.cascade.merge_state(o1, s1, o2, s2)
    for i in range(2):
        rows = slice(qo[i], qo[i + 1])
        pk = k_pool[kv_indices[kv_indptr[i] : kv_indptr[i + 1]]]
        pv = v_pool[kv_indices[kv_indptr[i] : kv_indptr[i + 1]]]
        k = np.concatenate([pk, k_new[rows]])
        v = np.concatenate([pv, v_new[rows]])
        ref, _ = npref.attention(q[rows], k, v, causal=True, sm_scale=0.125)
        assert_close(o[rows], ref)


def test_fast_decode_plan_and_graph_wrapper(fi):
    """SGLang's pattern: a CUDA-graph decode wrapper planned once with plan(), then
    begin_forward = partial(fast_decode_plan, w), the engine writing the page
    table into the wrapper's buffer itself; vLLM's: _cached_module.plan()."""
    from functools import partial

    g = npref.rng(4)
    page_size, hq, hk, d, bs = 1, 4, 2, 64, 3
    pool = 256
    k_pool, v_pool = npref.randn(g, pool, hk, d), npref.randn(g, pool, hk, d)
    indptr_buf = np.zeros(bs + 1, np.int32)
    indices_buf = np.zeros(pool, np.int32)
    last_buf = np.ones(bs, np.int32)
    w = fi.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        workspace(), indptr_buf, indices_buf, last_buf, "NHD", use_tensor_cores=True
    )
    assert w.is_cuda_graph_enabled
    q = npref.randn(g, bs, hq, d)
    out = np.empty_like(q)
    for step, lens in enumerate([[5, 9, 1], [6, 10, 2], [30, 1, 4]]):
        seq = np.array(lens, np.int32)
        indptr_buf[1:] = np.cumsum(seq)
        table = g.permutation(pool)[: indptr_buf[-1]].astype(np.int32)
        indices_buf[: len(table)] = table  # the engine's own copy kernel
        if step == 0:
            w.begin_forward(indptr_buf, indices_buf, last_buf, hq, hk, d, page_size,
                            q_data_type="float32")
            w.begin_forward = partial(fi.fast_decode_plan, w)
        else:
            override = np.concatenate([[0], np.cumsum(seq)]).astype(np.int32)
            w.begin_forward(indptr_buf, indices_buf, last_buf, hq, hk, d, page_size,
                            q_data_type="float32", non_blocking=True,
                            global_override_indptr_cpu=override)
        w.run(q, (k_pool, v_pool), out=out)
        ref, _ = decode_ref(q, np.stack([k_pool, v_pool], 1)[:, :, None], indptr_buf,
                            indices_buf, last_buf, 1)
        assert_close(out, ref, what=f"step {step}")
    # vLLM's fast_plan_decode: _cached_module.plan() with the tensor-core arguments
    seq = np.array([7, 3, 12], np.int32)
    indptr_buf[1:] = np.cumsum(seq)
    indices_buf[: indptr_buf[-1]] = g.permutation(pool)[: indptr_buf[-1]]
    w._cached_module.plan(
        w._float_workspace_buffer, w._int_workspace_buffer, w._pin_memory_int_workspace_buffer,
        np.arange(bs + 1, dtype=np.int32), indptr_buf.copy(), seq, bs, bs, hq, hk, page_size,
        True, d, d, False, -1, -1, False,
    )
    w.run(q, (k_pool, v_pool), out=out)
    ref, _ = decode_ref(q, np.stack([k_pool, v_pool], 1)[:, :, None], indptr_buf, indices_buf,
                        last_buf, 1)
    assert_close(out, ref)


def test_shared_prefix_wrappers(fi):
    g = npref.rng(5)
    page_size, hq, hk, d = 4, 4, 2, 64
    shared = 11
    k_sh, v_sh = npref.randn(g, shared, hk, d), npref.randn(g, shared, hk, d)
    unique = [3, 8, 0]
    indptr, indices, last, kv = paged_batch(g, unique, page_size, hk, d)
    # decode
    q = npref.randn(g, len(unique), hq, d)
    w = fi.BatchDecodeWithSharedPrefixPagedKVCacheWrapper(workspace(), "NHD")
    w.begin_forward(indptr, indices, last, hq, hk, d, page_size, data_type="float32")
    o = w.forward(q, k_sh, v_sh, kv)
    for i in range(len(unique)):
        k = np.concatenate([k_sh, npref.gather(kv[:, 0], indptr, indices, last, page_size, i)])
        v = np.concatenate([v_sh, npref.gather(kv[:, 1], indptr, indices, last, page_size, i)])
        assert_close(o[i : i + 1], npref.attention(q[i : i + 1], k, v)[0])
    # prefill, causal within each request's own keys
    qo_lens = [2, 5, 1]
    qo = npref.indptr_of(qo_lens)
    unique = [3, 8, 1]
    indptr, indices, last, kv = paged_batch(g, unique, page_size, hk, d)
    q = npref.randn(g, int(qo[-1]), hq, d)
    w = fi.BatchPrefillWithSharedPrefixPagedKVCacheWrapper(workspace(), "NHD")
    w.begin_forward(qo, indptr, indices, last, hq, hk, d, page_size, q_data_type="float32")
    o = w.forward(q, k_sh, v_sh, kv, causal=True)
    for i in range(len(unique)):
        rows = slice(qo[i], qo[i + 1])
        ku = npref.gather(kv[:, 0], indptr, indices, last, page_size, i)
        vu = npref.gather(kv[:, 1], indptr, indices, last, page_size, i)
        n, m = qo_lens[i], len(ku)
        # shared keys always visible; unique keys causal (bottom-right)
        mask = np.concatenate(
            [np.ones((n, shared), bool), np.arange(m)[None, :] <= (m - n + np.arange(n))[:, None]],
            1,
        )
        ref = _masked(q[rows], np.concatenate([k_sh, ku]), np.concatenate([v_sh, vu]), mask)
        assert_close(o[rows], ref)


def _masked(q, k, v, mask):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    out = np.zeros((q.shape[0], q.shape[1], v.shape[-1]))
    for h in range(q.shape[1]):
        s = q[:, h] @ k[:, h // group].T / math.sqrt(q.shape[-1])
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        out[:, h] = (p / p.sum(1, keepdims=True)) @ v[:, h // group]
    return out


def test_batch_pod_one_plan_and_two(fi):
    g = npref.rng(6)
    page_size, hq, hk, d = 8, 4, 2, 64
    p_qo, p_kv = [6, 3], [20, 3]
    d_kv = [9, 30, 1]
    lens = p_kv + d_kv
    indptr, indices, last, kv = paged_batch(g, lens, page_size, hk, d)
    np_ = len(p_kv)
    ip, ip_d = indptr[: np_ + 1], indptr[np_:] - indptr[np_]
    idx_p, idx_d = indices[: ip[-1]], indices[indptr[np_] :]
    qo_p, qo_d = npref.indptr_of(p_qo), npref.indptr_of([1] * len(d_kv))
    q_p, q_d = npref.randn(g, int(qo_p[-1]), hq, d), npref.randn(g, len(d_kv), hq, d)
    w = fi.BatchPODWithPagedKVCacheWrapper(workspace(), "NHD")
    w.plan(qo_p, ip, idx_p, last[:np_], qo_d, ip_d, idx_d, last[np_:], hq, hk, d, page_size,
           q_data_type="float32")
    ref_p, _ = npref.batch_reference(q_p, kv[:, 0], kv[:, 1], qo_p, ip, idx_p, last[:np_],
                                     page_size, causal=True)
    ref_d, _ = npref.batch_reference(q_d, kv[:, 0], kv[:, 1], qo_d, ip_d, idx_d, last[np_:],
                                     page_size)
    o_p, o_d = w.run(q_p, kv, q_d, kv, causal_p=True)  # one cache: one C plan
    assert_close(o_p, ref_p)
    assert_close(o_d, ref_d)
    (o_p, o_d), (l_p, l_d) = w.run(q_p, kv, q_d, kv.copy(), causal_p=True, v_scale=0.5,
                                   return_lse=True)  # two caches: two plans
    assert_close(o_p, ref_p)
    assert_close(o_d, 0.5 * ref_d)


def test_pod_single_prefill_and_decode(fi):
    g = npref.rng(7)
    page_size, hq, hk, d = 8, 4, 2, 64
    d_kv = [9, 30, 1]
    indptr, indices, last, kv = paged_batch(g, d_kv, page_size, hk, d)
    q_d = npref.randn(g, len(d_kv), hq, d)
    q_p, k_p, v_p = npref.randn(g, 7, hq, d), npref.randn(g, 12, hk, d), npref.randn(g, 12, hk, d)
    w = fi.PODWithPagedKVCacheWrapper(workspace(), "NHD")
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type="float32")
    o_p, o_d = w.run(q_p, k_p, v_p, q_d, kv, causal_p=True)
    assert_close(o_p, npref.attention(q_p, k_p, v_p, causal=True)[0])
    assert_close(o_d, decode_ref(q_d, kv, indptr, indices, last, page_size)[0])


# ------------------------------------------------------------ attention sinks


@pytest.mark.parametrize("window_left", [-1, 5])
def test_sinks_decode_prefill_and_sink_wrapper(fi, window_left):
    g = npref.rng(8)
    page_size, hq, hk, d = 16, 4, 2, 64
    kv_lens = [1, 20, 40]
    indptr, indices, last, kv = paged_batch(g, kv_lens, page_size, hk, d)
    sinks = (npref.randn(g, hq) * 2).astype(np.float32)
    # decode
    q = npref.randn(g, len(kv_lens), hq, d)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type="float32",
           window_left=window_left)
    o, lse = w.run(q, kv, sinks=sinks, return_lse=True)
    ref, ref_lse = decode_ref(q, kv, indptr, indices, last, page_size, sinks=sinks,
                              window_left=window_left)
    assert_close(o, ref)
    assert_lse_close(lse, ref_lse)
    # prefill (causal), and the sink wrapper: run(q, kv, sinks, sm_scale)
    qo = npref.indptr_of([1, 7, 12])
    q = npref.randn(g, int(qo[-1]), hq, d)
    ref, ref_lse = npref.batch_reference(q, kv[:, 0], kv[:, 1], qo, indptr, indices, last,
                                         page_size, causal=True, sinks=sinks, sm_scale=0.1,
                                         window_left=window_left)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace())
    w.plan(qo, indptr, indices, last, hq, hk, d, page_size, causal=True, sm_scale=0.1,
           q_data_type="float32", window_left=window_left)
    assert_close(w.run(q, kv, sinks=sinks), ref)
    sw = fi.BatchAttentionWithAttentionSinkWrapper(
        workspace(), "NHD", q_data_type="float32", kv_data_type="float32", head_dim_qk=d,
        head_dim_vo=d, window_left=window_left,
    )
    sw.plan(qo, indptr, indices, last, hq, hk, d, page_size, causal=True)
    o, lse = sw.run(q, kv, sinks, 0.1, return_lse=True)
    assert_close(o, ref)
    assert_lse_close(lse, ref_lse)


# ------------------------------------------------ BatchAttention, scales, newer


def test_batch_attention_scales(fi):
    g = npref.rng(9)
    page_size, hq, hk, d = 16, 4, 2, 64
    kv_lens = [5, 33]
    indptr, indices, last, kv = paged_batch(g, kv_lens, page_size, hk, d)
    qo = npref.indptr_of([1, 4])
    q = npref.randn(g, int(qo[-1]), hq, d)
    ba = fi.BatchAttention("NHD", device="cpu")
    ba.plan(qo, indptr, indices, np.array(kv_lens, np.int32), hq, hk, d, d, page_size,
            causal=True, q_data_type="float32", kv_data_type="float32")
    o, lse = ba.run(q, kv, k_scale=0.5, v_scale=3.0)
    ref, _ = npref.batch_reference(q, kv[:, 0], kv[:, 1], qo, indptr, indices, last,
                                   page_size, causal=True, sm_scale=0.5 / math.sqrt(d))
    assert_close(o, 3.0 * ref)


def test_batch_attention_without_gpu_says_so():
    if flashinfer_c.cuda_available():
        pytest.skip("this machine has a usable CUDA backend")
    with pytest.raises(RuntimeError, match="cannot run on CUDA here"):
        flashinfer_c.BatchAttention()


def test_single_prefill_scales_and_newer_keywords(fi):
    g = npref.rng(10)
    q, k, v = npref.randn(g, 5, 4, 64), npref.randn(g, 9, 2, 64), npref.randn(g, 9, 2, 64)
    o = fi.single_prefill_with_kv_cache(q, k, v, causal=True, k_scale=0.5, v_scale=2.0)
    assert_close(o, 2.0 * npref.attention(q, k, v, causal=True, sm_scale=0.5 / 8)[0])
    with pytest.raises(NotImplementedError, match="use_fp16_softmax"):
        fi.single_prefill_with_kv_cache(q, k, v, use_fp16_softmax=True)
    indptr, indices, last, kv = paged_batch(g, [5], 16, 2, 64)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, 4, 2, 64, 16, q_data_type="float32")
    q1 = npref.randn(g, 1, 4, 64)
    for name, value in (("use_fp16_softmax", True), ("kv_cache_sf", np.ones(1)),
                        ("skip_softmax_threshold_scale_factor", 0.5), ("uses_spcompress", True)):
        with pytest.raises(NotImplementedError, match=name):
            w.run(q1, kv, **{name: value})
    w.run(q1, kv, use_fp16_softmax=False, enable_pdl=True)  # the option off: accepted
    r = fi.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    qo = npref.indptr_of([5])
    r.plan(qo, npref.indptr_of([9]), 4, 2, 64, q_data_type="float32",
           seq_lens=np.array([9], np.int32))
    with pytest.raises(NotImplementedError, match="some_new_option"):
        r.plan(qo, npref.indptr_of([9]), 4, 2, 64, some_new_option=3)


# ------------------------------------------------------------- head dims


@pytest.mark.parametrize("d", [80, 96, 192, 512])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_wide_head_dims_on_cpu(fi, d, dtype):
    """Head dims real models use beyond 64/128/256 (the CPU backend): decode
    and causal prefill against the reference."""
    g = npref.rng(d)
    page_size, hq, hk = 16, 4, 2
    kv_lens = [3, 40]
    indptr, indices, last, kv = paged_batch(g, kv_lens, page_size, hk, d, dtype=dtype)
    q = npref.randn(g, 2, hq, d, dtype=dtype)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(workspace())
    w.plan(indptr, indices, last, hq, hk, d, page_size, q_data_type=dtype)
    assert_close(w.run(q, kv), decode_ref(q, kv, indptr, indices, last, page_size)[0], dtype)
    qo = npref.indptr_of([2, 9])
    q = npref.randn(g, 11, hq, d, dtype=dtype)
    w = fi.BatchPrefillWithPagedKVCacheWrapper(workspace())
    w.plan(qo, indptr, indices, last, hq, hk, d, page_size, causal=True, q_data_type=dtype)
    ref, _ = npref.batch_reference(q, kv[:, 0], kv[:, 1], qo, indptr, indices, last, page_size,
                                   causal=True)
    assert_close(w.run(q, kv), ref, dtype)


def test_unsupported_head_dim_says_which(fi):
    q, k = np.zeros((4, 72), np.float32), np.zeros((3, 4, 72), np.float32)
    with pytest.raises(ValueError, match="head_dim_qk=72"):
        fi.single_decode_with_kv_cache(q, k, k)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sinks_with_torch(fi, device):
    """The torch path of the sinks (CPU tensors, and CUDA where it runs)."""
    torch = pytest.importorskip("torch")
    if device == "cuda" and not (torch.cuda.is_available() and flashinfer_c.cuda_available()):
        pytest.skip("no CUDA GPU")
    g = npref.rng(13)
    page_size, hq, hk, d = 16, 4, 2, 64
    indptr, indices, last, kv = paged_batch(g, [3, 30], page_size, hk, d, dtype="float16")
    q = npref.randn(g, 2, hq, d, dtype="float16")
    sinks = npref.randn(g, hq)
    ws = torch.empty(1 << 16, dtype=torch.uint8, device=device)
    w = fi.BatchDecodeWithPagedKVCacheWrapper(ws)
    w.plan(torch.from_numpy(indptr), torch.from_numpy(indices), torch.from_numpy(last), hq, hk,
           d, page_size, q_data_type=torch.float16)
    tq, tkv = torch.from_numpy(q).to(device), torch.from_numpy(kv).to(device)
    o, lse = w.run(tq, tkv, sinks=torch.from_numpy(sinks).to(device), return_lse=True)
    ref, ref_lse = decode_ref(q, kv, indptr, indices, last, page_size, sinks=sinks)
    assert_close(o.float().cpu().numpy(), ref, "float16")
    assert_lse_close(lse.cpu().numpy(), ref_lse, "float16")
