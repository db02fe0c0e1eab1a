"""Decode attention: single_decode_with_kv_cache, BatchDecodeWithPagedKVCacheWrapper,
CUDAGraphBatchDecodeWithPagedKVCacheWrapper, and fast_decode_plan."""

import functools
from dataclasses import replace

import numpy as np

from . import _context, _foreign, _host, _single
from . import _structs as S
from ._arrays import empty, name_of
from ._attention import (
    apply_v_scale,
    float_dtype,
    paged_kv_entry,
    plan_dtypes,
    single_kv_shape,
    single_spec,
)
from ._plan import Plan
from ._wrapper import (
    WrapperBase,
    refuse_extras,
    refuse_unknown,
    require_graph_buffers,
    split_size,
    unit_scales,
)
from .page import get_seq_lens
from .utils import _get_range_buf, kv_layout_code

__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
    "get_seq_lens",
    "single_decode_with_kv_cache",
]


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
        **newer,
    ):
        """Plan a decode step: the page table of every request (host or device int32).

        Positional optional arguments follow the newest FlashInfer order (with
        o_data_type after kv_data_type); a call in the older order (no
        o_data_type: ..., kv_data_type, data_type, sm_scale, rope_scale,
        rope_theta, non_blocking, block_tables, seq_lens, fixed_split_size,
        disable_split_kv, as vLLM's fast_plan_decode makes it) is recognised
        by the values landing in the wrong slots (a number as data_type, a bool
        as rope_theta) and read in that order."""
        if newer:
            refuse_unknown(f"{self._name}.plan()", newer)
        if isinstance(rope_theta, bool) or (
            isinstance(data_type, (int, float)) and not isinstance(data_type, bool)
        ):
            slot_after = disable_split_kv  # the older order's q_len_per_req, if given
            (o_data_type, data_type, sm_scale, rope_scale, rope_theta, non_blocking,
             block_tables, seq_lens, fixed_split_size, disable_split_kv) = (
                None, o_data_type, data_type, sm_scale, rope_scale, rope_theta,
                non_blocking, block_tables, seq_lens, fixed_split_size,
            )
            if isinstance(slot_after, int) and not isinstance(slot_after, bool):
                q_len_per_req = slot_after
        self._plan_impl(
            indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
            pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type,
            o_data_type, data_type, sm_scale, rope_scale, rope_theta, fixed_split_size,
            disable_split_kv, q_len_per_req, window_right,
        )

    def _plan_impl(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
        kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
        rope_theta=None, fixed_split_size=None, disable_split_kv=False, q_len_per_req=1,
        window_right=0, copy_buffers=True,
    ):
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
            self._plan_graph_buffers(
                batch, q_len_per_req, kv_indptr, kv_indices, last, copy_buffers
            )
        # The Spec of the last plan() with the same options is reused: an engine
        # plans with the same model options at every step.
        key = (num_qo_heads, num_kv_heads, head_dim, page_size, pos_encoding_mode, window_left,
               logits_soft_cap, q_data_type, kv_data_type, o_data_type, data_type, sm_scale,
               rope_scale, rope_theta, fixed_split_size, disable_split_kv, q_len_per_req)
        memo = self._spec_memo
        plan = self._plan
        if memo is not None and memo[0] == key and plan is not None:
            spec = memo[1]
            # the C plan's update called directly (what _update does once a plan exists)
            self._planned = False
            plan.update(spec, _qo_range(batch, q_len_per_req), kv_indptr, kv_indices, last,
                        capture_checked=True)
            self._planned = True
            self._page_size = spec.page_size
            self._batch_size = batch
            self._q_len_per_req = q_len_per_req
            self._reset_options(memo[2])
            return
        self._spec_memo = None  # until this plan() succeeds
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
            fixed_split_size=split_size(fixed_split_size, page_size),
        )
        self._update(spec, _qo_range(batch, q_len_per_req), kv_indptr, kv_indices, last,
                     capture_checked=True)
        self._set_options(
            spec, q_len_per_req > 1, window_left, logits_soft_cap, sm_scale, pos_encoding_mode,
            rope_scale, rope_theta,
        )
        self._spec_memo = (key, spec, self._options_snapshot())
        self._page_size = int(page_size)
        self._batch_size = batch
        self._q_len_per_req = q_len_per_req

    begin_forward = plan

    def _fast_replan(self, *args):
        """_cached_module.plan() as vLLM's fast_plan_decode calls it on a CUDA-graph
        wrapper after a first plan(): the tensor-core form (float_ws, int_ws,
        pinned_ws, qo_indptr, kv_indptr, kv_lens, total_rows, batch_size, H_qo,
        H_kv, page_size, cuda_graph, D_qk, D_vo, causal, window_left,
        fixed_split_size, disable_split_kv[, num_colocated_ctas[, uniform_q_len]])
        or the plain form (float_ws, int_ws, pinned_ws, kv_indptr, batch_size,
        H_qo, H_kv, page_size, cuda_graph, window_left, logits_soft_cap, D_qk,
        D_vo, q_dtype_tensor, kv_dtype_tensor). The page table is the one in
        paged_kv_indices_buffer (the engine wrote it there); lengths come from
        kv_lens (tensor-core form) or paged_kv_last_page_len_buffer."""
        plan = self._require_plan()
        if not self._use_cuda_graph:
            raise RuntimeError(
                f"{self._name}._cached_module.plan() re-plans from the CUDA-graph buffers, "
                "and this wrapper has none (use_cuda_graph=False): call plan() instead"
            )
        if len(args) >= 18:
            kv_indptr = _host.indptr(args[4], "kv_indptr")
            lens = _host.i32(args[5], "kv_lens", kv_indptr.shape[0] - 1, convert=True)
            page_size, window_left = int(args[10]), int(args[15])
            changes = dict(
                window_left=window_left,
                fixed_split_size=split_size(args[16], page_size),
                disable_split_kv=bool(args[17]),
            )
            pages = np.diff(kv_indptr).astype(np.int64)
            last = np.where(pages > 0, lens - (pages - 1) * page_size, 0).astype(np.int32)
        elif len(args) == 15:
            kv_indptr = _host.indptr(args[3], "kv_indptr")
            page_size, window_left = int(args[7]), int(args[9])
            changes = dict(window_left=window_left, logits_soft_cap=float(args[10] or 0.0))
            last = _host.i32(
                self._paged_kv_last_page_len_buf, "paged_kv_last_page_len_buffer",
                convert=True,
            )[: kv_indptr.shape[0] - 1]
        else:
            raise TypeError(
                f"{self._name}._cached_module.plan() takes FlashInfer's 18-20 (tensor-core) "
                f"or 15 arguments, got {len(args)}"
            )
        if page_size != plan.spec.page_size:
            raise ValueError(f"page_size={page_size} differs from plan()'s {plan.spec.page_size}")
        batch = kv_indptr.shape[0] - 1
        indices = _host.i32(
            self._paged_kv_indices_buf[: int(kv_indptr[-1])], "paged_kv_indices_buffer",
            convert=True,
        )
        if indices.shape[0] < kv_indptr[-1]:
            raise ValueError(
                f"paged_kv_indices_buffer holds {indices.shape[0]} entries, the batch needs "
                f"{kv_indptr[-1]}"
            )
        self._plan_graph_buffers(batch, self._q_len_per_req, kv_indptr, indices, last, False)
        spec = replace(plan.spec, **changes)
        qo_indptr = np.arange(batch + 1, dtype=np.int32) * np.int32(self._q_len_per_req)
        self._update(spec, qo_indptr, kv_indptr, indices[: kv_indptr[-1]].copy(), last)
        self._window_left = window_left
        return None

    def workspace_size(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type="float16",
        kv_data_type=None, o_data_type=None, data_type=None, sm_scale=None, rope_scale=None,
        rope_theta=None, block_tables=None, seq_lens=None, fixed_split_size=None,
        disable_split_kv=False, q_len_per_req=1,
    ):
        """(float_workspace_bytes, int_workspace_bytes) of a plan() of this batch:
        the C plan's own workspace for it (bounds grown as plan() grows them),
        and 0 (there is no separate int workspace). Nothing of the wrapper
        changes."""
        probe = BatchDecodeWithPagedKVCacheWrapper(None, self._kv_layout)
        probe.device = self.device
        probe.plan(
            indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
            pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type,
            o_data_type, data_type, sm_scale, rope_scale, rope_theta,
            fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
            q_len_per_req=q_len_per_req,
        )
        return int(probe.plan_workspace_bytes()), 0

    def _plan_graph_buffers(self, batch, q_len_per_req, kv_indptr, kv_indices, last,
                            copy_buffers=True):
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
        if copy_buffers:
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
        **newer,
    ):
        """Decode attention: q [batch_size * q_len_per_req, num_qo_heads, head_dim].
        sinks: attention-sink logits, float [num_qo_heads] (gpt-oss)."""
        if (
            not args
            and not newer
            and sinks is None
            and self._variant is None
            and skip_softmax_threshold_scale_factor is None
            and kv_cache_sf is None
            and (window_left is None or window_left == self._window_left)
            and (q_len_per_req is None or q_len_per_req == self._q_len_per_req)
            and (
                (q_scale is None and k_scale is None and v_scale is None)
                or unit_scales(q_scale, k_scale, v_scale)
            )
        ):
            plan = self._plan
            fast = None if plan is None else plan.memo
            if fast is not None:
                result = fast.run(q, paged_kv_cache, out, lse, return_lse)
                if result is not None:
                    return result
        if (
            args
            or self._variant is not None
            or skip_softmax_threshold_scale_factor is not None
            or kv_cache_sf is not None
        ):
            refuse_extras(
                f"{self._name}.run()",
                self._variant_args(args),
                skip_softmax_threshold_scale_factor=skip_softmax_threshold_scale_factor,
                kv_cache_sf=kv_cache_sf,
            )
        if newer:
            refuse_unknown(f"{self._name}.run()", newer)
        if not self._planned:
            self._require_plan()
        if window_left is not None:
            self._check_window_left(window_left)
        if q_len_per_req is not None and q_len_per_req != self._q_len_per_req:
            raise ValueError(
                f"q_len_per_req={q_len_per_req} differs from plan()'s {self._q_len_per_req}"
            )
        k, v, arrays, entry = paged_kv_entry(paged_kv_cache, self._kv_layout)
        return self._run(
            q, k, v, arrays, q_scale, k_scale, v_scale, out, lse, return_lse, sinks=sinks,
            kv_entry=entry,
        )

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self,
        q,
        paged_kv_cache,
        pos_encoding_mode="NONE",
        q_scale=None,
        k_scale=None,
        v_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        *,
        _return_lse=False,
    ):
        """FlashInfer's deprecated forward(): sets the run-time options (these
        defaults included, as FlashInfer does), then run()."""
        self._forward_options(
            None, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
            rope_theta,
        )
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
                        return_lse=_return_lse)

    forward_return_lse = functools.partialmethod(forward, _return_lse=True)


_QO_RANGES = {}


def _qo_range(batch, q_len_per_req):
    """The query indptr of a decode batch, [0, q, 2q, ...], cached (read-only)."""
    key = (batch, q_len_per_req)
    a = _QO_RANGES.get(key)
    if a is None:
        if len(_QO_RANGES) > 64:
            _QO_RANGES.clear()
        a = np.arange(batch + 1, dtype=np.int32) * np.int32(q_len_per_req)
        a.flags.writeable = False
        _QO_RANGES[key] = a
    return a


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """FlashInfer's CUDA-graph decode wrapper: BatchDecodeWithPagedKVCacheWrapper
    with use_cuda_graph=True and the fixed buffers (batch size fixed at
    len(last_page_len_buffer))."""

    _name = "CUDAGraphBatchDecodeWithPagedKVCacheWrapper"

    def __init__(
        self,
        workspace_buffer,
        indptr_buffer,
        indices_buffer,
        last_page_len_buffer,
        kv_layout="NHD",
        use_tensor_cores=False,
    ):
        super().__init__(
            workspace_buffer,
            kv_layout,
            use_cuda_graph=True,
            use_tensor_cores=use_tensor_cores,
            paged_kv_indptr_buffer=indptr_buffer,
            paged_kv_indices_buffer=indices_buffer,
            paged_kv_last_page_len_buffer=last_page_len_buffer,
        )


def fast_decode_plan(
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
    q_data_type=None,
    kv_data_type=None,
    data_type=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    non_blocking=True,
    fixed_split_size=None,
    disable_split_kv=False,
    global_override_indptr_cpu=None,
):
    """FlashInfer's fast decode plan (engines install it as a decode wrapper's
    begin_forward, SGLang for its CUDA-graph and draft wrappers): plan()
    without the copies into the CUDA-graph buffers, which the engine has
    written itself (kv indptr, last_page_len and the page table in
    paged_kv_indices_buffer); global_override_indptr_cpu, when given, is the
    host copy of indptr (no device-to-host copy of it). Without CUDA graphs
    it is plan() of the given arrays."""
    if not isinstance(self, BatchDecodeWithPagedKVCacheWrapper):
        raise TypeError("fast_decode_plan's first argument is a BatchDecodeWithPagedKVCacheWrapper")
    if q_data_type is None:
        q_data_type = data_type if data_type is not None else "float16"
    host_indptr = indptr if global_override_indptr_cpu is None else global_override_indptr_cpu
    kv_indptr = _host.indptr(host_indptr, "indptr")
    batch = kv_indptr.shape[0] - 1
    if page_size == 1:
        last = np.ones(batch, dtype=np.int32)  # FlashInfer's shortcut: no device copy
    else:
        last = _host.i32(last_page_len, "last_page_len", convert=True)[:batch]
    graph = self._use_cuda_graph
    if graph:
        if batch != self._fixed_batch_size:
            raise ValueError(
                f"the batch size is fixed at {self._fixed_batch_size} in CUDA-graph mode, "
                f"got {batch}"
            )
        if len(indices) > len(self._paged_kv_indices_buf):
            raise ValueError(
                "indices holds more entries than the wrapper's paged_kv_indices_buffer"
            )
        table = self._paged_kv_indices_buf[: int(kv_indptr[-1])]  # written by the engine
    else:
        table = indices
    self._plan_impl(
        kv_indptr, table, last, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode, window_left, logits_soft_cap, q_data_type, kv_data_type, None,
        None, sm_scale, rope_scale, rope_theta, fixed_split_size, disable_split_kv,
        copy_buffers=False,
    )


_foreign.add_to(__import__(__name__, fromlist=["_"]), "decode")
