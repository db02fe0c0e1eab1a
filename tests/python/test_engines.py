"""vLLM's and SGLang's FlashInfer call sequences, replayed against flashinfer_c
installed as `flashinfer` (issue 38). Written from the call patterns of
their FlashInfer attention backends (vLLM v1 FlashInferMetadataBuilder.build
and FlashInferImpl.forward, fast_plan_decode; SGLang FlashInferAttnBackend:
FlashInferIndicesUpdaterDecode/Prefill.call_begin_forward, forward_extend,
forward_decode, the CUDA-graph decode wrappers with fast_decode_plan): the
same import lines, persistent buffers, plan/run/forward calls and keywords,
step after step (prefill, mixed, decode, cascade, CUDA-graph capture and
replay), every output checked against the fp64 reference.

Array backends: numpy (always), torch CPU, and torch CUDA where torch sees a
GPU and libflashinfer's CUDA backend runs; CUDA graphs are captured and
replayed on torch CUDA only (elsewhere the captured function is called
eagerly, the same sequence of plans and runs).
"""

import math

import numpy as np
import pytest

import flashinfer_c
import npref

try:
    import torch
except ImportError:
    torch = None


class Arrays:
    """The array library an engine would use: numpy, or torch on a device."""

    def __init__(self, name):
        self.name = name
        self.torch = name.startswith("torch")
        self.device = "cuda" if name == "torch-cuda" else "cpu"
        self.graphs = name == "torch-cuda"

    def __repr__(self):
        return self.name

    def arr(self, a):
        a = np.asarray(a)
        if self.torch:
            return torch.from_numpy(a.copy()).to(self.device)
        return a.copy()

    def host(self, a):
        """A host array (torch CPU tensor / numpy), as engines keep their *_cpu buffers."""
        a = np.asarray(a)
        return torch.from_numpy(a.copy()) if self.torch else a.copy()

    def np(self, x):
        if self.torch:
            t = x.detach().cpu()
            return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
        return np.asarray(x)

    def zeros(self, shape, dtype):
        if self.torch:
            return torch.zeros(shape, dtype=getattr(torch, dtype), device=self.device)
        return np.zeros(shape, dtype=dtype)

    def workspace(self, nbytes=1 << 20):
        if self.torch:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return np.empty(nbytes, dtype=np.uint8)

    def sync(self):
        if self.device == "cuda":
            torch.cuda.synchronize()

    def graph(self, fn):
        """fn captured in a CUDA graph (torch CUDA), after a warm-up call on a side
        stream; elsewhere fn itself. Returns the replay callable."""
        if not self.graphs:
            fn()
            return fn
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return g.replay


def _backends():
    out = [pytest.param("numpy")]
    if torch is not None:
        out.append(pytest.param("torch-cpu"))
        cuda_ok = torch.cuda.is_available() and flashinfer_c.cuda_available()
        out.append(
            pytest.param(
                "torch-cuda",
                marks=[pytest.mark.gpu, pytest.mark.skipif(not cuda_ok, reason="no CUDA GPU")],
            )
        )
    return out


@pytest.fixture(params=_backends())
def xp(request):
    return Arrays(request.param)


@pytest.fixture
def flashinfer():
    flashinfer_c.install_as_flashinfer()
    import flashinfer as fi

    yield fi
    flashinfer_c.uninstall_as_flashinfer()


DTYPE = "float16"


def attention_ref(q, k, v, causal, sm_scale, logits_soft_cap=0.0, window_left=-1):
    o, _ = npref.attention(q, k, v, causal=causal, sm_scale=sm_scale,
                           logits_soft_cap=logits_soft_cap, window_left=window_left)
    return o


# ========================================================================= vLLM


class VllmBuilder:
    """The parts of vLLM's FlashInferMetadataBuilder / FlashInferImpl that call
    FlashInfer, in their order (persistent device and host buffers, decodes
    first and prefills after them, cascade for a common prefix, CUDA-graph
    decode wrappers per padded batch size with fast_plan_decode)."""

    def __init__(self, fi, xp, H, Hk, D, page_size, max_reqs, max_pages, graph_sizes=()):
        self.fi, self.xp = fi, xp
        self.H, self.Hk, self.D, self.page_size = H, Hk, D, page_size
        self.sm_scale = 1.0 / math.sqrt(D)
        self.window_left, self.logits_soft_cap = -1, None
        self.workspace = xp.workspace()
        self.paged_kv_indptr = xp.zeros(max_reqs + 1, "int32")
        self.paged_kv_indices = xp.zeros(max_pages, "int32")
        self.paged_kv_last_page_len = xp.zeros(max_reqs, "int32")
        self.paged_kv_indptr_cpu = xp.host(np.zeros(max_reqs + 1, np.int32))
        self.paged_kv_last_page_len_cpu = xp.host(np.zeros(max_reqs, np.int32))
        self.graph_sizes = graph_sizes
        self.prefill_wrapper = None
        self.decode_wrapper = None
        self.decode_wrappers_cudagraph = {}
        self.cascade_wrapper = None

    def _decode_wrapper(self, batch_size, use_cudagraph):
        fi = self.fi
        if use_cudagraph:
            w = self.decode_wrappers_cudagraph.get(batch_size)
            if w is None:
                w = self.decode_wrappers_cudagraph[batch_size] = (
                    fi.BatchDecodeWithPagedKVCacheWrapper(
                        self.workspace, "NHD", use_cuda_graph=True,
                        paged_kv_indptr_buffer=self.paged_kv_indptr[: batch_size + 1],
                        paged_kv_indices_buffer=self.paged_kv_indices,
                        paged_kv_last_page_len_buffer=self.paged_kv_last_page_len[:batch_size],
                        use_tensor_cores=True,
                    )
                )
            return w
        if self.decode_wrapper is None:
            self.decode_wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", use_tensor_cores=True
            )
        return self.decode_wrapper

    def build(self, query_lens, seq_lens, block_table, common_prefix_len=0):
        """One step's metadata: plans the wrappers this step uses."""
        xp, ps = self.xp, self.page_size
        num_reqs = len(seq_lens)
        seq_lens_np = np.asarray(seq_lens, np.int64)
        num_decodes = sum(1 for q in query_lens if q == 1)
        num_prefills = num_reqs - num_decodes
        num_decode_tokens = num_decodes
        num_blocks_np = (seq_lens_np + ps - 1) // ps
        qo_indptr_np = npref.indptr_of(query_lens)
        meta = dict(num_decodes=num_decodes, num_prefills=num_prefills,
                    num_decode_tokens=num_decode_tokens, use_cascade=common_prefix_len > 0)
        bt = np.asarray(block_table, np.int32)
        if meta["use_cascade"]:
            n_common = common_prefix_len // ps
            shared = (
                xp.host(np.array([0, qo_indptr_np[-1]], np.int32)),
                xp.host(np.array([0, n_common], np.int32)),
                xp.host(bt[0, :n_common]),
                xp.host(np.array([ps], np.int32)),
            )
            bt = bt[:, n_common:]
            num_blocks_np = num_blocks_np - n_common
        ptr_np = np.zeros(num_reqs + 1, np.int64)
        np.cumsum(num_blocks_np, out=ptr_np[1:])
        self.paged_kv_indptr_cpu[: num_reqs + 1] = xp.host(ptr_np.astype(np.int32))
        self.paged_kv_indptr[: num_reqs + 1] = xp.arr(ptr_np.astype(np.int32))
        pages = np.concatenate(
            [bt[i, : num_blocks_np[i]] for i in range(num_reqs)]
        ).astype(np.int32)
        self.paged_kv_indices[: len(pages)] = xp.arr(pages)  # vLLM's copy kernel
        paged_kv_indices = self.paged_kv_indices[: len(pages)]
        last = seq_lens_np % ps
        self.paged_kv_last_page_len_cpu[:num_reqs] = xp.host(
            np.where(last == 0, ps, last).astype(np.int32)
        )
        qo_indptr_cpu = xp.host(qo_indptr_np)
        kv_indptr_cpu = self.paged_kv_indptr_cpu[: 1 + num_reqs]
        last_cpu = self.paged_kv_last_page_len_cpu[:num_reqs]
        common = dict(causal=True, sm_scale=self.sm_scale, window_left=self.window_left,
                      logits_soft_cap=self.logits_soft_cap, q_data_type=DTYPE,
                      kv_data_type=DTYPE)
        if meta["use_cascade"]:
            if self.cascade_wrapper is None:
                self.cascade_wrapper = self.fi.MultiLevelCascadeAttentionWrapper(
                    2, self.workspace, "NHD"
                )
            self.cascade_wrapper.plan(
                [shared[0], qo_indptr_cpu], [shared[1], kv_indptr_cpu],
                [shared[2], paged_kv_indices], [shared[3], last_cpu],
                self.H, self.Hk, self.D, ps, **common,
            )
            meta["cascade_wrapper"] = self.cascade_wrapper
            return meta
        if num_prefills:
            start = num_decodes
            if self.prefill_wrapper is None:
                self.prefill_wrapper = self.fi.BatchPrefillWithPagedKVCacheWrapper(
                    self.workspace, "NHD"
                )
            q_rel = qo_indptr_cpu[start:] - qo_indptr_cpu[start]
            self.prefill_wrapper.plan(
                q_rel, kv_indptr_cpu[start:], paged_kv_indices, last_cpu[start:],
                self.H, self.Hk, self.D, ps, fixed_split_size=-1, disable_split_kv=False,
                **common,
            )
            meta["prefill_wrapper"] = self.prefill_wrapper
        if num_decodes:
            pure = num_prefills == 0
            sizes = [s for s in self.graph_sizes if s >= num_decode_tokens]
            use_cudagraph = pure and bool(sizes)
            n_in = min(sizes) if use_cudagraph else num_decode_tokens
            if use_cudagraph:  # pad the batch with requests of no pages
                self.paged_kv_indptr_cpu[1 + num_decodes : 1 + n_in] = int(ptr_np[-1])
                self.paged_kv_last_page_len_cpu[num_decodes:n_in] = 1
            padded = np.zeros(max(n_in, num_reqs), np.int32)
            padded[:num_reqs] = seq_lens_np
            seq_lens_cpu = xp.host(padded)
            w = self._decode_wrapper(n_in, use_cudagraph)
            c = dict(common)
            del c["causal"]
            fast_plan_decode(
                w, self.paged_kv_indptr_cpu[: n_in + 1], paged_kv_indices,
                self.paged_kv_last_page_len_cpu[:n_in], seq_lens_cpu[:n_in], self.H, self.Hk,
                self.D, ps, pos_encoding_mode="NONE", fixed_split_size=-1,
                disable_split_kv=False, **c,
            )
            meta.update(decode_wrapper=w, num_input_tokens=n_in, use_cudagraph=use_cudagraph)
        return meta

    def forward(self, meta, query, kv_cache, output, k_scale=1.0, v_scale=1.0):
        """FlashInferImpl.forward's FlashInfer calls (one layer)."""
        if meta["use_cascade"]:
            output.__setitem__(slice(None), meta["cascade_wrapper"].run(query, kv_cache))
            return output
        nd = meta["num_decode_tokens"]
        if meta["num_prefills"]:
            w = meta["prefill_wrapper"]
            assert w._causal
            assert w._window_left == self.window_left
            assert w._logits_soft_cap == (self.logits_soft_cap or 0.0)
            assert w._sm_scale == self.sm_scale
            w.run(query[nd:], kv_cache, k_scale=k_scale, v_scale=v_scale, out=output[nd:])
        if meta["num_decodes"]:
            w = meta["decode_wrapper"]
            assert w._window_left == self.window_left
            assert w._logits_soft_cap == (self.logits_soft_cap or 0.0)
            assert w._sm_scale == self.sm_scale
            w.run(query[:nd], kv_cache, k_scale=k_scale, v_scale=v_scale, out=output[:nd])
        return output


def fast_plan_decode(self, indptr_cpu, indices, last_page_len_cpu, seq_lens_cpu, num_qo_heads,
                     num_kv_heads, head_dim, page_size, pos_encoding_mode="NONE",
                     window_left=-1, logits_soft_cap=None, q_data_type="float16",
                     kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
                     rope_theta=None, non_blocking=True, fixed_split_size=-1,
                     disable_split_kv=False):
    """vLLM's fast decode plan, as its backend calls FlashInfer: the wrapper's
    plan() (positional, in FlashInfer's older order) the first time or without
    CUDA graphs, then the wrapper's _cached_module.plan() with the host arrays."""
    if not self.is_cuda_graph_enabled or getattr(self, "vllm_first_call", True):
        self.plan(indptr_cpu, indices, last_page_len_cpu, num_qo_heads, num_kv_heads, head_dim,
                  page_size, pos_encoding_mode, window_left, logits_soft_cap, q_data_type,
                  kv_data_type, data_type, sm_scale, rope_scale, rope_theta, non_blocking,
                  None, None, fixed_split_size, disable_split_kv)
        self.vllm_first_call = False
        return
    batch_size = len(last_page_len_cpu)
    if logits_soft_cap is None:
        logits_soft_cap = 0.0
    assert batch_size == self._fixed_batch_size
    assert len(indices) <= len(self._paged_kv_indices_buf)
    self._paged_kv_indptr_buf.__setitem__(slice(None), _like(self._paged_kv_indptr_buf, indptr_cpu))
    self._paged_kv_last_page_len_buf.__setitem__(
        slice(None), _like(self._paged_kv_last_page_len_buf, last_page_len_cpu)
    )
    qo_indptr_host = flashinfer_c.utils._get_range_buf(batch_size + 1, "cpu")
    self._plan_info = self._cached_module.plan(
        self._float_workspace_buffer, self._int_workspace_buffer,
        self._pin_memory_int_workspace_buffer, qo_indptr_host, indptr_cpu, seq_lens_cpu,
        batch_size, batch_size, num_qo_heads, num_kv_heads, page_size,
        self.is_cuda_graph_enabled, head_dim, head_dim, False, window_left, fixed_split_size,
        disable_split_kv,
    )
    self._pos_encoding_mode = pos_encoding_mode
    self._window_left = window_left
    self._logits_soft_cap = logits_soft_cap
    self._sm_scale = sm_scale
    self._rope_scale = rope_scale
    self._rope_theta = rope_theta


def _like(buf, host):
    if torch is not None and isinstance(buf, torch.Tensor):
        return torch.as_tensor(np.asarray(host)).to(buf.device)
    return np.asarray(host)


def _vllm_reference(q, kv, query_lens, seq_lens, block_table, page_size, sm_scale):
    k_all, v_all = kv[:, 0], kv[:, 1]
    outs = []
    qo = npref.indptr_of(query_lens)
    for i, (ql, sl) in enumerate(zip(query_lens, seq_lens)):
        nb = (sl + page_size - 1) // page_size
        pages = np.asarray(block_table[i][:nb])
        k = k_all[pages].reshape(-1, *k_all.shape[2:])[:sl]
        v = v_all[pages].reshape(-1, *v_all.shape[2:])[:sl]
        outs.append(attention_ref(q[qo[i] : qo[i + 1]], k, v, True, sm_scale))
    return np.concatenate(outs)


def test_vllm_steps(flashinfer, xp):
    """Prefill, mixed, cascade and pure-decode steps (the decodes on a CUDA-graph
    wrapper, captured once and replayed over new plans), two layers each."""
    from flashinfer import (  # noqa: F401  (vLLM's import lines)
        BatchDecodeWithPagedKVCacheWrapper,
        BatchPrefillWithPagedKVCacheWrapper,
        MultiLevelCascadeAttentionWrapper,
    )
    from flashinfer.decode import _get_range_buf, trtllm_batch_decode_with_kv_cache  # noqa
    from flashinfer.prefill import trtllm_batch_context_with_kv_cache  # noqa: F401
    from flashinfer.utils import FP4Tensor  # noqa: F401

    g = npref.rng(11)
    H, Hk, D, ps, layers = 8, 2, 128, 16, 2
    max_reqs, num_blocks = 8, 64
    kv_np = [npref.randn(g, num_blocks, 2, ps, Hk, D, dtype=DTYPE) for _ in range(layers)]
    kv = [xp.arr(c) for c in kv_np]
    b = VllmBuilder(flashinfer, xp, H, Hk, D, ps, max_reqs, num_blocks * 2, graph_sizes=(4,))
    perm = g.permutation(num_blocks).astype(np.int32)
    block_table = np.stack([perm[i * 8 : (i + 1) * 8] for i in range(max_reqs)])
    shared_table = block_table.copy()
    shared_table[:, :2] = block_table[0, :2]  # two common full pages (cascade step)
    steps = [
        ("prefill", [7, 20], [7, 20], block_table, 0),
        ("mixed", [1, 1, 5], [8, 21, 5], block_table, 0),
        ("cascade", [1, 3, 1], [40, 35, 33], shared_table, 32),
        ("decode", [1, 1, 1], [9, 22, 6], block_table, 0),
        ("decode", [1, 1, 1], [10, 23, 7], block_table, 0),
        ("decode", [1, 1], [60, 2], block_table, 0),
    ]
    graph = None
    graph_out = None
    for name, qlens, slens, table, common in steps:
        meta = b.build(qlens, slens, table, common)
        n = sum(qlens)
        for layer in range(layers):
            q_np = npref.randn(g, n, H, D, dtype=DTYPE)
            ref = _vllm_reference(q_np, kv_np[layer], qlens, slens, table, ps, b.sm_scale)
            if meta.get("use_cudagraph"):
                n_in = meta["num_input_tokens"]
                meta["num_decode_tokens"] = n_in  # the padded batch runs in the graph
                if graph is None:
                    graph_q = xp.zeros((n_in, H, D), DTYPE)
                    graph_out = xp.zeros((n_in, H, D), DTYPE)
                    graph_kv = kv[layer]
                    graph = xp.graph(lambda: b.forward(meta, graph_q, graph_kv, graph_out))
                graph_kv_np = kv_np[0]  # the captured layer's cache
                ref = _vllm_reference(q_np, graph_kv_np, qlens, slens, table, ps, b.sm_scale)
                graph_q[:n] = xp.arr(q_np)
                graph_q[n:] = 0
                graph()
                xp.sync()
                got = xp.np(graph_out)
                npref.assert_close(got[:n], ref, "float16", f"{name} step (graph replay)")
                assert not got[n:].any(), "padded requests have no keys: output 0"
                break  # one captured layer
            q = xp.arr(q_np)
            out = xp.zeros((n, H, D), DTYPE)
            b.forward(meta, q, kv[layer], out)
            xp.sync()
            npref.assert_close(xp.np(out), ref, "float16", f"{name} step, layer {layer}")


# ======================================================================= SGLang


class SglangBackend:
    """The FlashInfer calls of SGLang's FlashInferAttnBackend: a token pool of
    [size, H_kv, D] K/V buffers per layer (page_size 1), req_to_token,
    kv_indptr / kv_last_page_len buffers, ragged + paged wrappers for extend,
    decode wrappers, and CUDA-graph decode wrappers with fast_decode_plan."""

    def __init__(self, fi, xp, H, Hk, D, layers, pool, max_bs, max_ctx):
        self.fi, self.xp = fi, xp
        self.H, self.Hk, self.D = H, Hk, D
        self.scaling = 1.0 / math.sqrt(D)
        self.logit_cap = 0.0
        self.k_buffer = [xp.zeros((pool, Hk, D), DTYPE) for _ in range(layers)]
        self.v_buffer = [xp.zeros((pool, Hk, D), DTYPE) for _ in range(layers)]
        self.k_np = [np.zeros((pool, Hk, D), DTYPE) for _ in range(layers)]
        self.v_np = [np.zeros((pool, Hk, D), DTYPE) for _ in range(layers)]
        self.workspace = xp.workspace()
        self.kv_indptr = xp.zeros(max_bs + 1, "int32")
        self.kv_last_page_len = xp.arr(np.ones(max_bs, np.int32))
        self.qo_indptr = xp.zeros(max_bs + 1, "int32")
        self.prefill_wrapper_ragged = fi.BatchPrefillWithRaggedKVCacheWrapper(self.workspace, "NHD")
        self.prefill_wrapper_paged = fi.BatchPrefillWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2"
        )
        self.decode_wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
            self.workspace, "NHD", backend="fa2", use_tensor_cores=False
        )
        self.cuda_graph_kv_indices = xp.zeros(max_bs * max_ctx, "int32")
        self.graph_wrappers = {}

    def get_kv_buffer(self, layer):
        return self.k_buffer[layer], self.v_buffer[layer]

    def set_kv_buffer(self, layer, loc, k, v):
        self.k_buffer[layer][self.xp.arr(loc)] = self.xp.arr(k)
        self.v_buffer[layer][self.xp.arr(loc)] = self.xp.arr(v)
        self.k_np[layer][loc] = k
        self.v_np[layer][loc] = v

    def kv_indices(self, tokens_per_req):
        return np.concatenate(tokens_per_req).astype(np.int32)

    def plan_extend(self, prefix_tokens, extend_lens):
        """call_begin_forward of the prefill updater (ragged for the new tokens)."""
        xp, bs = self.xp, len(extend_lens)
        lens = np.array([len(t) for t in prefix_tokens], np.int32)
        self.kv_indptr[1 : bs + 1] = xp.arr(np.cumsum(lens).astype(np.int32))
        kv_indptr = self.kv_indptr[: bs + 1]
        kv_indices = xp.arr(np.pad(self.kv_indices(prefix_tokens), (0, 256)))  # +256 as SGLang
        self.qo_indptr[1 : bs + 1] = xp.arr(np.cumsum(extend_lens).astype(np.int32))
        qo_indptr = self.qo_indptr[: bs + 1]
        self.prefill_wrapper_ragged.begin_forward(
            qo_indptr, qo_indptr, self.H, self.Hk, self.D, q_data_type=DTYPE
        )
        self.prefill_wrapper_paged.begin_forward(
            qo_indptr, kv_indptr, kv_indices, self.kv_last_page_len[:bs], self.H, self.Hk,
            self.D, 1, q_data_type=DTYPE, kv_data_type=DTYPE, custom_mask=None,
            non_blocking=True, fixed_split_size=None, prefix_len_ptr=None,
            token_pos_in_items_ptr=None, token_pos_in_items_len=0, max_item_len_ptr=None,
        )

    def forward_extend(self, layer, q, k, v, no_prefix, loc):
        if no_prefix:
            o = self.prefill_wrapper_ragged.forward(
                q, k, v, causal=True, sm_scale=self.scaling, logits_soft_cap=self.logit_cap
            )
        else:
            o1, s1 = self.prefill_wrapper_ragged.forward_return_lse(
                q, k, v, causal=True, sm_scale=self.scaling, window_left=-1,
                logits_soft_cap=self.logit_cap,
            )
            o2, s2 = self.prefill_wrapper_paged.forward_return_lse(
                q, self.get_kv_buffer(layer), causal=False, sm_scale=self.scaling,
                window_left=-1, logits_soft_cap=self.logit_cap,
            )
            o, _ = self.fi.cascade.merge_state(o1, s1, o2, s2)
        self.set_kv_buffer(layer, loc, self.xp.np(k), self.xp.np(v))
        return o

    def plan_decode(self, wrapper, tokens_per_req, override_indptr=None):
        """call_begin_forward of the decode updater."""
        xp, bs = self.xp, len(tokens_per_req)
        lens = np.array([len(t) for t in tokens_per_req], np.int32)
        self.kv_indptr[1 : bs + 1] = xp.arr(np.cumsum(lens).astype(np.int32))
        kv_indptr = self.kv_indptr[: bs + 1]
        table = self.kv_indices(tokens_per_req)
        if wrapper.is_cuda_graph_enabled:
            kv_indices = wrapper._paged_kv_indices_buf  # written directly, as SGLang does
            kv_indices[: len(table)] = xp.arr(table)
        else:
            kv_indices = xp.arr(table)
        kwargs = dict(data_type=DTYPE, q_data_type=DTYPE, non_blocking=True,
                      fixed_split_size=None, disable_split_kv=False)
        uses_fast = getattr(wrapper.begin_forward, "func", None) is self.fi.fast_decode_plan
        if uses_fast:
            kwargs["global_override_indptr_cpu"] = override_indptr
        wrapper.begin_forward(kv_indptr, kv_indices, self.kv_last_page_len[:bs], self.H,
                              self.Hk, self.D, 1, **kwargs)

    def forward_decode(self, wrapper, layer, q):
        return wrapper.forward(
            q, self.get_kv_buffer(layer), sm_scale=self.scaling, logits_soft_cap=self.logit_cap,
            k_scale=1.0, v_scale=1.0,
        )

    def graph_wrapper(self, bs):
        w = self.graph_wrappers.get(bs)
        if w is None:
            w = self.graph_wrappers[bs] = self.fi.BatchDecodeWithPagedKVCacheWrapper(
                self.workspace, "NHD", backend="fa2", use_cuda_graph=True,
                use_tensor_cores=False, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.cuda_graph_kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
        return w


def test_sglang_steps(flashinfer, xp):
    """Extend without prefix (ragged), extend with a cached prefix (ragged +
    paged, merged), eager decode steps, then CUDA-graph decode steps: plan()
    at capture, fast_decode_plan installed as begin_forward, replays over new
    page tables."""
    from functools import partial

    from flashinfer import (  # noqa: F401  (SGLang's import lines)
        BatchDecodeWithPagedKVCacheWrapper,
        BatchPrefillWithPagedKVCacheWrapper,
        BatchPrefillWithRaggedKVCacheWrapper,
        fast_decode_plan,
    )
    from flashinfer.cascade import merge_state  # noqa: F401

    g = npref.rng(12)
    H, Hk, D, layers, pool = 8, 2, 128, 2, 512
    be = SglangBackend(flashinfer, xp, H, Hk, D, layers, pool, max_bs=8, max_ctx=64)
    free = list(g.permutation(pool))
    reqs = [[] for _ in range(3)]  # each request's token locations

    def alloc(n):
        return np.array([free.pop() for _ in range(n)], np.int64)

    def reference(layer, q_np, i, n_new):
        toks = np.array(reqs[i])
        k, v = be.k_np[layer][toks], be.v_np[layer][toks]
        return attention_ref(q_np, k, v, True, be.scaling)

    def extend(lens, no_prefix):
        prefix = [np.array(reqs[i], np.int64) for i in range(len(lens))]
        be.plan_extend(prefix, lens)
        locs = [alloc(n) for n in lens]
        n = sum(lens)
        for layer in range(layers):
            q_np = npref.randn(g, n, H, D, dtype=DTYPE)
            k_np, v_np = npref.randn(g, n, Hk, D, dtype=DTYPE), npref.randn(g, n, Hk, D, dtype=DTYPE)
            loc = np.concatenate(locs)
            o = be.forward_extend(layer, xp.arr(q_np), xp.arr(k_np), xp.arr(v_np), no_prefix, loc)
            xp.sync()
            qo = npref.indptr_of(lens)
            for i in range(len(lens)):
                toks = list(prefix[i]) + list(locs[i])
                k = be.k_np[layer][toks]
                v = be.v_np[layer][toks]
                ref = attention_ref(q_np[qo[i] : qo[i + 1]], k, v, True, be.scaling)
                npref.assert_close(xp.np(o)[qo[i] : qo[i + 1]], ref, "float16", "extend")
        for i, loc in enumerate(locs):
            reqs[i].extend(loc.tolist())

    extend([5, 9, 3], no_prefix=True)
    extend([2, 1, 4], no_prefix=False)

    def decode_step(wrapper, graph=None, io=None):
        for r in reqs:
            r.extend(alloc(1).tolist())
        tokens = [np.array(r, np.int64) for r in reqs]
        override = npref.indptr_of([len(t) for t in tokens])
        for layer in range(layers):
            k_np = npref.randn(g, len(reqs), Hk, D, dtype=DTYPE)
            v_np = npref.randn(g, len(reqs), Hk, D, dtype=DTYPE)
            be.set_kv_buffer(layer, np.array([r[-1] for r in reqs]), k_np, v_np)
        be.plan_decode(wrapper, tokens, override)
        for layer in range(layers if graph is None else 1):
            q_np = npref.randn(g, len(reqs), H, D, dtype=DTYPE)
            if graph is None:
                o = xp.np(be.forward_decode(wrapper, layer, xp.arr(q_np)))
            else:
                q_buf, out_buf = io
                q_buf[:] = xp.arr(q_np)
                graph()
                xp.sync()
                o = xp.np(out_buf)
            for i in range(len(reqs)):
                npref.assert_close(o[i : i + 1], reference(layer, q_np[i : i + 1], i, 1),
                                   "float16", "decode")

    decode_step(be.decode_wrapper)
    decode_step(be.decode_wrapper)
    # CUDA-graph decode: capture with the plain plan, then fast_decode_plan
    bs = len(reqs)
    w = be.graph_wrapper(bs)
    for r in reqs:
        r.extend(alloc(1).tolist())
    be.plan_decode(w, [np.array(r, np.int64) for r in reqs])
    q_buf = xp.zeros((bs, H, D), DTYPE)
    out_buf = xp.zeros((bs, H, D), DTYPE)

    def captured():
        out_buf[:] = be.forward_decode(w, 0, q_buf)

    graph = xp.graph(captured)
    w.begin_forward = partial(flashinfer.fast_decode_plan, w)
    for _ in range(3):
        decode_step(w, graph, (q_buf, out_buf))
