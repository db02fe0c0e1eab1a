"""Decode attention: single_decode_with_kv_cache and BatchDecodeWithPagedKVCacheWrapper."""

import functools

import numpy as np

from . import _context, _host, _single
from . import _structs as S
from ._arrays import empty, name_of
from ._attention import (
    apply_v_scale,
    float_dtype,
    paged_kv_views,
    plan_dtypes,
    single_kv_shape,
    single_spec,
)
from ._wrapper import WrapperBase, refuse_extras, require_graph_buffers
from .utils import kv_layout_code


def single_decode_with_kv_cache(
    q,
    k,
    v,
    kv_layout="NHD",
    pos_encoding_mode="NONE",
    use_tensor_cores=False,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    return_lse=False,
):
    """Decode attention of one request.

    q [num_qo_heads, head_dim]; k, v [kv_len, num_kv_heads, head_dim] (NHD)
    or [num_kv_heads, kv_len, head_dim] (HND). Returns out [num_qo_heads,
    head_dim], and lse [num_qo_heads] (base 2) when return_lse.
    """
    device, kv_len, num_kv_heads = single_kv_shape(
        q, k, v, kv_layout, 2, "[num_qo_heads, head_dim]"
    )
    num_qo_heads, head_dim = q.shape
    q_name = float_dtype(name_of(q), "q.dtype")
    scale = (1.0 / head_dim**0.5) if sm_scale is None else sm_scale
    for s in (q_scale, k_scale):
        scale *= 1.0 if s is None else float(s)
    spec = single_spec(
        k,
        v,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        kv_layout,
        q_name,
        q_name,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        sm_scale=scale,
        pos_encoding_mode=pos_encoding_mode,
        rope_scale=rope_scale,
        rope_theta=rope_theta,
    )
    out = empty(q, (num_qo_heads, v.shape[-1]))
    lse = empty(q, (num_qo_heads,), "float32") if return_lse else None
    ctx = _context.get(device)
    _single.run(
        device,
        spec,
        1,
        int(kv_len),
        q[None],
        k,
        v,
        out[None],
        None if lse is None else lse[None],
        stream=ctx.current_stream(),
    )
    apply_v_scale(out, v_scale)
    return (out, lse) if return_lse else out


class BatchDecodeWithPagedKVCacheWrapper(WrapperBase):
    """Decode attention for a batch of requests over a paged KV cache.

    plan() once per step with the page table, then run() for every layer.
    """

    _name = "BatchDecodeWithPagedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        jit_args=None,
        *,
        prefix_detection=None,
    ):
        """prefix_detection (an extension): None (default) plans each batch as one
        C plan; "auto" / "always" / "off" plan it through the C library's
        automatic cascade (shared leading pages split into levels)."""
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        self._set_prefix_detection(prefix_detection)
        kv_layout_code(kv_layout)
        self._use_tensor_cores = bool(use_tensor_cores)
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._fixed_batch_size = 0
        if use_cuda_graph:
            require_graph_buffers(
                ("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer),
            )
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError(
                    "paged_kv_indptr_buffer must hold batch_size + 1 entries, where batch_size "
                    "is len(paged_kv_last_page_len_buffer)"
                )
        self._q_len_per_req = None

    @property
    def use_tensor_cores(self):
        return self._use_tensor_cores

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        block_tables=None,
        seq_lens=None,
        fixed_split_size=None,
        disable_split_kv=False,
        q_len_per_req=1,
        window_right=0,
    ):
        """Plan a decode step: the page table of every request (host or device int32)."""
        self._refuse_capture()
        if window_right not in (0, None):
            raise NotImplementedError("window_right is not supported")
        if q_len_per_req < 1:
            raise ValueError(f"q_len_per_req must be >= 1, got {q_len_per_req}")
        kv_indptr, kv_indices, last = _host.page_table(
            indptr, indices, last_page_len, ("indptr", "indices", "last_page_len")
        )
        batch = kv_indptr.shape[0] - 1
        if self._use_cuda_graph:
            self._plan_graph_buffers(batch, q_len_per_req, kv_indptr, kv_indices, last)
        if data_type is not None:
            # The deprecated data_type sets q and kv unless they were given.
            if q_data_type in (None, "float16"):
                q_data_type = data_type
            kv_data_type = kv_data_type if kv_data_type is not None else data_type
        self._q_name, self._kv_name, self._o_name = plan_dtypes(
            q_data_type, kv_data_type, o_data_type
        )
        spec = self._make_spec(
            S.KV_FORMAT_PAGED,
            page_size,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            head_dim,
            causal=q_len_per_req > 1,  # draft tokens of a request see their past only
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            pos_encoding_mode=pos_encoding_mode,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            disable_split_kv=disable_split_kv,
            fixed_split_size=(fixed_split_size or 0) * page_size,
        )
        qo_indptr = np.arange(batch + 1, dtype=np.int32) * np.int32(q_len_per_req)
        self._update(spec, qo_indptr, kv_indptr, kv_indices, last)
        self._window_left = spec.window_left
        self._batch_size = batch
        self._q_len_per_req = q_len_per_req

    begin_forward = plan

    def _plan_graph_buffers(self, batch, q_len_per_req, kv_indptr, kv_indices, last):
        if batch != self._fixed_batch_size:
            raise ValueError(
                f"the batch size is fixed at {self._fixed_batch_size} in CUDA-graph mode "
                f"(the buffers' size), got {batch}"
            )
        if self._q_len_per_req not in (None, q_len_per_req):
            raise ValueError("q_len_per_req is part of the fixed CUDA-graph shape")
        if self._fixed is None:
            self._fix_bounds(
                batch,
                batch * q_len_per_req,
                len(self._paged_kv_indices_buf),
                ("paged_kv_last_page_len_buffer", "the query rows", "paged_kv_indices_buffer"),
            )
        self._copy_page_table(kv_indptr, kv_indices, last, "buffer")

    def run(
        self,
        q,
        paged_kv_cache,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
        sinks=None,
        q_len_per_req=None,
        skip_softmax_threshold_scale_factor=None,
        kv_cache_sf=None,
    ):
        """Decode attention: q [batch_size * q_len_per_req, num_qo_heads, head_dim]."""
        refuse_extras(
            f"{self._name}.run()",
            self._variant_args(args),
            sinks=sinks,
            skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
            kv_cache_sf=kv_cache_sf,
        )
        self._require_plan()
        self._check_window_left(window_left)
        if q_len_per_req is not None and q_len_per_req != self._q_len_per_req:
            raise ValueError(
                f"q_len_per_req={q_len_per_req} differs from plan()'s {self._q_len_per_req}"
            )
        k, v, arrays = paged_kv_views(paged_kv_cache)
        return self._run(q, k, v, arrays, q_scale, k_scale, v_scale, out, lse, return_lse)

    run_return_lse = functools.partialmethod(run, return_lse=True)
