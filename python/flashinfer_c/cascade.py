"""Attention states and their merge: merge_state, merge_state_in_place,
merge_states, and MultiLevelCascadeAttentionWrapper (batch prefill per
level, merged in place, as FlashInfer composes it)."""

import ctypes

from . import _context
from ._arrays import DTypeError, device_of, empty, name_of, view
from ._lib import check_op, fn
from .prefill import BatchPrefillWithPagedKVCacheWrapper


def _lse_f32(s, name):
    if name_of(s) != "float32":
        raise DTypeError(f"{name}.dtype is {name_of(s)}; LSE tensors must be float32")
    return s


def _ctx_and_check(first, named):
    device = device_of(first)
    _context.check_same_device(device, named)
    return _context.get(device)


def merge_state(v_a, s_a, v_b, s_b):
    """Merge two attention states over disjoint KV sets.

    v_a, v_b [seq_len, num_heads, head_dim]; s_a, s_b [seq_len, num_heads]
    float32 (LSE, base 2). Returns (v_merged, s_merged).
    """
    ctx = _ctx_and_check(v_a, [("s_a", s_a), ("v_b", v_b), ("s_b", s_b)])
    _lse_f32(s_a, "s_a")
    _lse_f32(s_b, "s_b")
    v_out = empty(v_a, tuple(v_a.shape))
    s_out = empty(v_a, tuple(s_a.shape), "float32")
    views = [
        view(x, n)
        for x, n in (
            (v_a, "v_a"),
            (s_a, "s_a"),
            (v_b, "v_b"),
            (s_b, "s_b"),
            (v_out, "v_out"),
            (s_out, "s_out"),
        )
    ]
    check_op(
        fn.merge_state(ctx.handle, *map(ctypes.byref, views), ctx.stream()),
        "merge_state",
        ctx.device,
    )
    return v_out, s_out


def merge_state_in_place(v, s, v_other, s_other, mask=None):
    """(v, s) <- merge((v, s), (v_other, s_other)) in place; where mask [seq_len]
    (bool) is given, only the rows where it is True."""
    ctx = _ctx_and_check(v, [("s", s), ("v_other", v_other), ("s_other", s_other), ("mask", mask)])
    _lse_f32(s, "s")
    _lse_f32(s_other, "s_other")
    views = [view(v, "v"), view(s, "s"), view(v_other, "v_other"), view(s_other, "s_other")]
    if mask is not None:
        if name_of(mask) not in ("bool", "uint8"):
            raise DTypeError(f"mask.dtype is {name_of(mask)}, expected bool")
        mask_view = ctypes.byref(view(mask, "mask"))
    else:
        mask_view = None
    check_op(
        fn.merge_state_in_place(ctx.handle, *map(ctypes.byref, views), mask_view, ctx.stream()),
        "merge_state_in_place",
        ctx.device,
    )


def merge_states(v, s):
    """Merge num_states states per row, in order.

    v [seq_len, num_states, num_heads, head_dim]; s [seq_len, num_states,
    num_heads] float32. Returns (v_merged [seq_len, num_heads, head_dim],
    s_merged [seq_len, num_heads]).
    """
    ctx = _ctx_and_check(v, [("s", s)])
    _lse_f32(s, "s")
    if len(v.shape) != 4:
        raise ValueError(
            f"v must be [seq_len, num_states, num_heads, head_dim], got shape {tuple(v.shape)}"
        )
    seq_len, _, num_heads, head_dim = v.shape
    v_out = empty(v, (seq_len, num_heads, head_dim))
    s_out = empty(v, (seq_len, num_heads), "float32")
    views = [view(v, "v"), view(s, "s"), view(v_out, "v_out"), view(s_out, "s_out")]
    check_op(
        fn.merge_states(ctx.handle, *map(ctypes.byref, views), ctx.stream()),
        "merge_states",
        ctx.device,
    )
    return v_out, s_out


class MultiLevelCascadeAttentionWrapper:
    """Cascade attention over a shared page table: one batch prefill per level
    (a level's qo_indptr groups the queries that share its KV), merged in place.

    Only the last level (each request's own KV) is causal.
    """

    def __init__(
        self,
        num_levels,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf_arr=None,
        paged_kv_indptr_buf_arr=None,
        paged_kv_indices_buf_arr=None,
        paged_kv_last_page_len_buf_arr=None,
    ):
        self._num_levels = num_levels
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        if use_cuda_graph:
            arrays = (
                qo_indptr_buf_arr,
                paged_kv_indptr_buf_arr,
                paged_kv_indices_buf_arr,
                paged_kv_last_page_len_buf_arr,
            )
            if any(a is None or len(a) != num_levels for a in arrays):
                raise ValueError(
                    "use_cuda_graph=True needs the four *_buf_arr lists, one buffer per level"
                )
            self._batch_prefill_wrappers = [
                BatchPrefillWithPagedKVCacheWrapper(
                    float_workspace_buffer,
                    kv_layout,
                    use_cuda_graph=True,
                    qo_indptr_buf=qo,
                    paged_kv_indptr_buf=ptr,
                    paged_kv_indices_buf=idx,
                    paged_kv_last_page_len_buf=last,
                )
                for qo, ptr, idx, last in zip(*arrays)
            ]
        else:
            self._batch_prefill_wrappers = [
                BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
                for _ in range(num_levels)
            ]

    @property
    def is_cuda_graph_enabled(self):
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers):
        for wrapper, int_buffer in zip(self._batch_prefill_wrappers, int_workspace_buffers):
            wrapper.reset_workspace_buffer(float_workspace_buffer, int_buffer)

    def plan(
        self,
        qo_indptr_arr,
        paged_kv_indptr_arr,
        paged_kv_indices_arr,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
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
    ):
        """Plan every level: lists of per-level indptr/indices/last_page_len."""
        lists = (qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len)
        if any(len(a) != self._num_levels for a in lists):
            raise ValueError(f"every per-level list must have num_levels={self._num_levels} items")
        for level, (wrapper, qo, ptr, idx, last) in enumerate(
            zip(self._batch_prefill_wrappers, *lists)
        ):
            wrapper.plan(
                qo,
                ptr,
                idx,
                last,
                num_qo_heads,
                num_kv_heads,
                head_dim,
                page_size,
                causal=causal if level == self._num_levels - 1 else False,
                pos_encoding_mode=pos_encoding_mode,
                use_fp16_qk_reduction=use_fp16_qk_reduction,
                sm_scale=sm_scale,
                window_left=window_left,
                logits_soft_cap=logits_soft_cap,
                rope_scale=rope_scale,
                rope_theta=rope_theta,
                q_data_type=q_data_type,
                kv_data_type=kv_data_type,
            )

    begin_forward = plan

    def run(self, q, paged_kv_cache):
        """Cascade attention of q [batch_size, num_qo_heads, head_dim]."""
        out, lse = self._batch_prefill_wrappers[-1].run(q, paged_kv_cache, return_lse=True)
        for wrapper in self._batch_prefill_wrappers[:-1]:
            out_i, lse_i = wrapper.run(q, paged_kv_cache, return_lse=True)
            merge_state_in_place(out, lse, out_i, lse_i)
        return out

    forward = run
