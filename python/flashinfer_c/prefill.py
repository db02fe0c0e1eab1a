"""Prefill/append attention: single_prefill_with_kv_cache(_return_lse),
BatchPrefillWithPagedKVCacheWrapper and BatchPrefillWithRaggedKVCacheWrapper."""

import functools

import numpy as np

from . import _context, _foreign, _host, _single
from . import _structs as S
from ._arrays import empty, name_of
from ._attention import (
    apply_v_scale,
    batch_mask,
    float_dtype,
    paged_kv_entry,
    plan_dtypes,
    run_scale,
    single_kv_shape,
    single_spec,
)
from ._wrapper import (
    WrapperBase,
    refuse_extras,
    refuse_unknown,
    require_graph_buffers,
    split_size,
    unit_scales,
)
from .page import get_seq_lens  # noqa: F401  (flashinfer.prefill.get_seq_lens)
from .utils import kv_layout_code


def _refuse_tensor_scales(**scales):
    for name, value in scales.items():
        if value is not None:
            raise NotImplementedError(
                f"{name}: per-head FP8 scale tensors are not supported by flashinfer_c yet"
            )


def single_prefill_with_kv_cache(
    q,
    k,
    v,
    scale_q=None,
    scale_k=None,
    scale_v=None,
    o_dtype=None,
    custom_mask=None,
    packed_custom_mask=None,
    causal=False,
    kv_layout="NHD",
    pos_encoding_mode="NONE",
    use_fp16_qk_reduction=False,
    sm_scale=None,
    window_left=-1,
    logits_soft_cap=None,
    rope_scale=None,
    rope_theta=None,
    backend="auto",
    return_lse=False,
    *,
    q_scale=None,
    k_scale=None,
    v_scale=None,
    **newer,
):
    """Prefill/append attention of one request.

    q [qo_len, num_qo_heads, head_dim_qk]; k [kv_len, num_kv_heads, head_dim_qk]
    and v [kv_len, num_kv_heads, head_dim_vo] (NHD) or [num_kv_heads, kv_len, D]
    (HND). custom_mask: bool [qo_len, kv_len] (False = masked out), or
    packed_custom_mask from packbits(mask.flatten(), bitorder="little").
    Returns out [qo_len, num_qo_heads, head_dim_vo] and, with return_lse,
    lse [qo_len, num_qo_heads] in base 2. q_scale/k_scale/v_scale (floats)
    as in the decode calls: q and k scales fold into sm_scale, v_scale
    multiplies the output.
    """
    refuse_unknown("single_prefill_with_kv_cache", newer)
    _refuse_tensor_scales(scale_q=scale_q, scale_k=scale_k, scale_v=scale_v)
    device, kv_len, num_kv_heads = single_kv_shape(
        q, k, v, kv_layout, 3, "[qo_len, num_qo_heads, head_dim]"
    )
    qo_len, num_qo_heads, head_dim = q.shape
    q_name = float_dtype(name_of(q), "q.dtype")
    o_name = float_dtype(o_dtype or q_name, "o_dtype")
    mask = None
    if custom_mask is not None or packed_custom_mask is not None:
        mask, _ = batch_mask(custom_mask, packed_custom_mask, [qo_len], [kv_len], device)
    if q_scale is not None or k_scale is not None:
        base = (1.0 / head_dim**0.5) if sm_scale is None else sm_scale
        sm_scale = run_scale(_Scale(base), q_scale, k_scale)
    spec = single_spec(
        k,
        v,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        kv_layout,
        q_name,
        o_name,
        causal=causal,
        custom_mask=mask is not None,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale,
        pos_encoding_mode=pos_encoding_mode,
        rope_scale=rope_scale,
        rope_theta=rope_theta,
    )
    out = empty(q, (qo_len, num_qo_heads, v.shape[-1]), o_name)
    lse = empty(q, (qo_len, num_qo_heads), "float32") if return_lse else None
    ctx = _context.get(device)
    stream = ctx.current_stream()
    _single.run(device, spec, int(qo_len), int(kv_len), q, k, v, out, lse, mask, stream)
    apply_v_scale(out, v_scale)
    return (out, lse) if return_lse else out


class _Scale:
    """A stand-in Spec for run_scale: only sm_scale."""

    def __init__(self, sm_scale):
        self.sm_scale = sm_scale


def single_prefill_with_kv_cache_return_lse(*args, **kwargs):
    """single_prefill_with_kv_cache(..., return_lse=True)."""
    kwargs["return_lse"] = True
    return single_prefill_with_kv_cache(*args, **kwargs)


def _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr):
    for name, value in (
        ("prefix_len_ptr", prefix_len_ptr),
        ("token_pos_in_items_ptr", token_pos_in_items_ptr),
        ("max_item_len_ptr", max_item_len_ptr),
    ):
        if value is not None:
            raise NotImplementedError(f"{name} (multi-item scoring) is not supported yet")


class _PrefillBase(WrapperBase):
    """Shared by the paged and ragged prefill wrappers: graph buffers, masks."""

    def __init__(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, bufs):
        """bufs: (qo_indptr_buf, custom_mask_buf, mask_indptr_buf)."""
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args)
        kv_layout_code(kv_layout)
        self._qo_indptr_buf, self._custom_mask_buf, self._mask_indptr_buf = bufs
        self._fixed_batch_size = 0
        self._mask = None

    def _plan_mask(self, custom_mask, packed_custom_mask, qo_lens, kv_lens):
        """self._mask and the mask indptr of a batch (None, None: no custom mask).
        qo_lens, kv_lens: functions giving the lengths, called only for a mask."""
        self._mask, mask_indptr = None, None
        if custom_mask is not None or packed_custom_mask is not None:
            self._mask, mask_indptr = batch_mask(
                custom_mask, packed_custom_mask, qo_lens(), kv_lens(), self.device
            )
        return mask_indptr

    def _graph_bounds(self, batch, total_qo, kv_bound, kv_name):
        if batch != self._fixed_batch_size:
            raise ValueError(
                f"the batch size is fixed at {self._fixed_batch_size} in CUDA-graph mode "
                f"(len(qo_indptr_buf) - 1), got {batch}"
            )
        if self._fixed is None:
            # As FlashInfer: the first plan's query rows bound the later ones.
            self._fix_bounds(
                batch,
                max(total_qo, 1),
                kv_bound,
                ("qo_indptr_buf", "the query rows of the first plan()", kv_name),
            )

    def _graph_mask(self, mask, mask_indptr):
        """Copy the batch's packed mask into the caller's fixed buffer, which is
        what run() then reads: a captured run keeps reading that address."""
        if mask is None:
            return None
        if self._custom_mask_buf is None or self._mask_indptr_buf is None:
            raise ValueError(
                "custom_mask_buf and mask_indptr_buf must be given to the constructor in "
                "CUDA-graph mode to plan with a custom mask"
            )
        _host.copy_into(self._custom_mask_buf, _host.to_numpy(mask), "custom_mask_buf")
        if mask_indptr is not None:
            _host.copy_into(self._mask_indptr_buf, mask_indptr, "mask_indptr_buf")
        return self._custom_mask_buf


class BatchPrefillWithPagedKVCacheWrapper(_PrefillBase):
    """Prefill/append attention for a batch of requests over a paged KV cache."""

    _name = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
        jit_kwargs=None,
        *,
        prefix_detection=None,
    ):
        """prefix_detection (an extension): as BatchDecodeWithPagedKVCacheWrapper's."""
        bufs = (qo_indptr_buf, custom_mask_buf, mask_indptr_buf)
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, bufs)
        self._set_prefix_detection(prefix_detection)
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        if use_cuda_graph:
            require_graph_buffers(
                ("qo_indptr_buf", qo_indptr_buf),
                ("paged_kv_indptr_buf", paged_kv_indptr_buf),
                ("paged_kv_indices_buf", paged_kv_indices_buf),
                ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf),
            )
            self._fixed_batch_size = len(qo_indptr_buf) - 1
            if len(paged_kv_indptr_buf) != self._fixed_batch_size + 1:
                raise ValueError("paged_kv_indptr_buf must hold batch_size + 1 entries")
            if len(paged_kv_last_page_len_buf) != self._fixed_batch_size:
                raise ValueError("paged_kv_last_page_len_buf must hold batch_size entries")

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len=0,
        max_item_len_ptr=None,
        seq_lens=None,
        seq_lens_q=None,
        block_tables=None,
        max_token_per_sequence=None,
        max_sequence_kv=None,
        fixed_split_size=None,
        disable_split_kv=False,
        **newer,
    ):
        """Plan a batch: query indptr and the page table (host or device int32)."""
        if newer:
            refuse_unknown(f"{self._name}.plan()", newer)
        self._refuse_capture()
        _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr)
        qo = _host.indptr(qo_indptr, "qo_indptr")
        batch = qo.shape[0] - 1
        kv_indptr, kv_indices, last = _host.page_table(
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            ("paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len"),
            batch,
        )
        if custom_mask is None and packed_custom_mask is None:
            self._mask = mask_indptr = None  # _plan_mask's result, without its call
        else:
            mask_indptr = self._plan_mask(
                custom_mask,
                packed_custom_mask,
                lambda: np.diff(qo),
                lambda: _host.kv_lengths(kv_indptr, last, page_size),
            )
        if self._use_cuda_graph:
            self._graph_bounds(
                batch, int(qo[-1]), len(self._paged_kv_indices_buf), "paged_kv_indices_buf"
            )
            _host.copy_into(self._qo_indptr_buf, qo, "qo_indptr_buf")
            self._copy_page_table(kv_indptr, kv_indices, last, "buf")
            self._mask = self._graph_mask(self._mask, mask_indptr)
        # The Spec of the last plan() with the same options is reused: an engine
        # plans with the same model options at every step.
        key = (num_qo_heads, num_kv_heads, head_dim_qk, page_size, head_dim_vo,
               self._mask is not None, causal, pos_encoding_mode, sm_scale, window_left,
               logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type, o_data_type,
               fixed_split_size, disable_split_kv)
        memo = self._spec_memo
        if memo is not None and memo[0] == key and self._plan is not None:
            spec = memo[1]
            self._update(spec, qo, kv_indptr, kv_indices, last, mask_indptr, capture_checked=True)
            self._reset_options(memo[2])
            self._page_size = spec.page_size
            return
        self._spec_memo = None  # until this plan() succeeds
        dtypes = plan_dtypes(q_data_type, kv_data_type, o_data_type)
        self._q_name, self._kv_name, self._o_name = dtypes
        spec = self._make_spec(
            S.KV_FORMAT_PAGED,
            page_size,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            head_dim_vo or head_dim_qk,
            causal=causal,
            custom_mask=self._mask is not None,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            pos_encoding_mode=pos_encoding_mode,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            disable_split_kv=disable_split_kv,
            fixed_split_size=split_size(fixed_split_size, page_size),
        )
        self._update(spec, qo, kv_indptr, kv_indices, last, mask_indptr, capture_checked=True)
        self._set_options(
            spec, causal, window_left, logits_soft_cap, sm_scale, pos_encoding_mode, rope_scale,
            rope_theta,
        )
        self._spec_memo = (key, spec, self._options_snapshot())
        self._page_size = int(page_size)

    begin_forward = plan

    def workspace_size(self, qo_indptr, paged_kv_indptr, paged_kv_indices,
                       paged_kv_last_page_len, num_qo_heads, num_kv_heads, head_dim_qk,
                       page_size, *args, **kwargs):
        """(float_workspace_bytes, int_workspace_bytes) of a plan() of this batch (plan()'s
        arguments): the C plan's own workspace for it, and 0. Nothing of the
        wrapper changes."""
        probe = BatchPrefillWithPagedKVCacheWrapper(None, self._kv_layout)
        probe.device = self.device
        probe.plan(qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len,
                   num_qo_heads, num_kv_heads, head_dim_qk, page_size, *args, **kwargs)
        return int(probe.plan_workspace_bytes()), 0

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
        **newer,
    ):
        """Attention of q [qo_indptr[-1], num_qo_heads, head_dim_qk] over the paged cache.
        sinks: attention-sink logits, float [num_qo_heads] (gpt-oss)."""
        if (
            not args
            and not newer
            and sinks is None
            and self._variant is None
            and self._mask is None
            and (window_left is None or window_left == self._window_left)
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
        if args or self._variant is not None:
            refuse_extras(f"{self._name}.run()", self._variant_args(args))
        if newer:
            refuse_unknown(f"{self._name}.run()", newer)
        if not self._planned:
            self._require_plan()
        if window_left is not None:
            self._check_window_left(window_left)
        k, v, arrays, entry = paged_kv_entry(paged_kv_cache, self._kv_layout)
        return self._run(
            q, k, v, arrays, q_scale, k_scale, v_scale, out, lse, return_lse, self._mask,
            sinks=sinks, kv_entry=entry,
        )

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self,
        q,
        paged_kv_cache,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
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
            causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
            rope_theta,
        )
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale,
                        return_lse=_return_lse)

    forward_return_lse = functools.partialmethod(forward, _return_lse=True)


class BatchPrefillWithRaggedKVCacheWrapper(_PrefillBase):
    """Prefill/append attention for a batch whose K/V are ragged tensors."""

    _name = "BatchPrefillWithRaggedKVCacheWrapper"

    # In CUDA-graph mode the C plan needs a bound on the ragged KV tokens,
    # which FlashInfer's constructor does not take: this many.
    GRAPH_MAX_KV_TOKENS = 1 << 20

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        kv_indptr_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
        jit_kwargs=None,
    ):
        bufs = (qo_indptr_buf, custom_mask_buf, mask_indptr_buf)
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, bufs)
        self._kv_indptr_buf = kv_indptr_buf
        if use_cuda_graph:
            if qo_indptr_buf is None or kv_indptr_buf is None:
                raise ValueError(
                    "qo_indptr_buf and kv_indptr_buf must be given when use_cuda_graph=True"
                )
            self._fixed_batch_size = len(qo_indptr_buf) - 1
            if len(kv_indptr_buf) != self._fixed_batch_size + 1:
                raise ValueError("kv_indptr_buf must hold as many entries as qo_indptr_buf")

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        window_left=-1,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        prefix_len_ptr=None,
        token_pos_in_items_ptr=None,
        token_pos_in_items_len=0,
        max_item_len_ptr=None,
        fixed_split_size=None,
        disable_split_kv=False,
        seq_lens=None,
        seq_lens_q=None,
        max_token_per_sequence=None,
        max_sequence_kv=None,
        **newer,
    ):
        """Plan a batch: query and key/value indptrs (host or device int32).
        seq_lens, seq_lens_q, max_token_per_sequence, max_sequence_kv (cuDNN
        inputs) are accepted and not used: the lengths are the indptrs'."""
        if newer:
            refuse_unknown(f"{self._name}.plan()", newer)
        self._refuse_capture()
        _refuse_multi_item(prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr)
        qo = _host.indptr(qo_indptr, "qo_indptr")
        kv = _host.indptr(kv_indptr, "kv_indptr")
        batch = qo.shape[0] - 1
        if kv.shape[0] != qo.shape[0]:
            raise ValueError(f"kv_indptr has {kv.shape[0]} entries but qo_indptr has {qo.shape[0]}")
        mask_indptr = self._plan_mask(
            custom_mask, packed_custom_mask, lambda: np.diff(qo), lambda: np.diff(kv)
        )
        if self._use_cuda_graph:
            self._graph_bounds(batch, int(qo[-1]), self.GRAPH_MAX_KV_TOKENS, "GRAPH_MAX_KV_TOKENS")
            _host.copy_into(self._qo_indptr_buf, qo, "qo_indptr_buf")
            _host.copy_into(self._kv_indptr_buf, kv, "kv_indptr_buf")
            self._mask = self._graph_mask(self._mask, mask_indptr)
        dtypes = plan_dtypes(q_data_type, kv_data_type, o_data_type)
        self._q_name, self._kv_name, self._o_name = dtypes
        spec = self._make_spec(
            S.KV_FORMAT_RAGGED,
            1,
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            head_dim_vo or head_dim_qk,
            causal=causal,
            custom_mask=self._mask is not None,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            pos_encoding_mode=pos_encoding_mode,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            disable_split_kv=disable_split_kv,
            fixed_split_size=split_size(fixed_split_size),
        )
        self._update(spec, qo, kv, None, None, mask_indptr, capture_checked=True)
        self._set_options(
            spec, causal, window_left, logits_soft_cap, sm_scale, pos_encoding_mode, rope_scale,
            rope_theta,
        )

    begin_forward = plan

    def run(
        self,
        q,
        k,
        v,
        *args,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        o_scale=None,
        out=None,
        lse=None,
        return_lse=False,
        enable_pdl=None,
        window_left=None,
        sinks=None,
        **newer,
    ):
        """Attention of q [qo_indptr[-1], H_qo, D_qk] over k, v [kv_indptr[-1], H_kv, D]
        (NHD) or [H_kv, kv_indptr[-1], D] (HND)."""
        refuse_extras(f"{self._name}.run()", self._variant_args(args), o_scale=o_scale)
        if newer:
            refuse_unknown(f"{self._name}.run()", newer)
        self._require_plan()
        self._check_window_left(window_left)
        arrays = [("k", k), ("v", v)]
        return self._run(
            q, k, v, arrays, q_scale, k_scale, v_scale, out, lse, return_lse, self._mask,
            sinks=sinks,
        )

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(
        self,
        q,
        k,
        v,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        window_left=-1,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        *,
        _return_lse=False,
    ):
        """FlashInfer's deprecated forward(): sets the run-time options, then run()."""
        self._forward_options(
            causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
            rope_theta,
        )
        return self.run(q, k, v, return_lse=_return_lse)

    forward_return_lse = functools.partialmethod(forward, _return_lse=True)


_foreign.add_to(__import__(__name__, fromlist=["_"]), "prefill")
