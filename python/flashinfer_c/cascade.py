"""Attention states and their merge: merge_state, merge_state_in_place,
merge_states, and MultiLevelCascadeAttentionWrapper (the C library's
cascade: fi_cascade_create / _update / _run)."""

import ctypes

from . import _context, _host
from . import _structs as S
from ._arrays import DTypeError, check_writable, device_of, empty, name_of, view
from ._attention import check_rank, context, outputs, paged_kv_views, plan_dtypes
from ._cascade import Cascade
from ._lib import check_op, fn
from ._plan import Bounds
from ._wrapper import WrapperBase
from .utils import kv_layout_code


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
    check_writable(v, "v")
    check_writable(s, "s")
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


class MultiLevelCascadeAttentionWrapper(WrapperBase):
    """Cascade attention over one paged KV pool, as the C library's cascade
    (fi_cascade_*): level l's qo_indptr groups the queries that share its
    pages; one C plan per level, every level computed into the cascade's
    workspace and merged exactly, in level order, into the output.

    Only the last level (each request's own KV) is causal; window_left
    applies to the last level too (docs/PYTHON_COMPAT.md).
    """

    _name = "MultiLevelCascadeAttentionWrapper"

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
        super().__init__(float_workspace_buffer, kv_layout, use_cuda_graph, "auto", None)
        kv_layout_code(kv_layout)
        if not 1 <= int(num_levels) <= S.CASCADE_MAX_LEVELS:
            raise ValueError(f"num_levels={num_levels}: expected 1 to {S.CASCADE_MAX_LEVELS}")
        self._num_levels = int(num_levels)
        self._bufs = None
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
            self._bufs = list(zip(*arrays))

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers=None):
        """Kept for compatibility: the C cascade owns its workspace."""
        super().reset_workspace_buffer(float_workspace_buffer)

    def _graph_levels(self, levels):
        """CUDA-graph mode: fix the bounds from the buffers (query rows from the
        first plan(), as FlashInfer) and write each level into its buffers."""
        if self._fixed is None:
            total = max(int(level[0][-1]) for level in levels)
            self._fixed = [
                Bounds(len(qo) - 1, max(total, 1), len(idx)) for qo, _, idx, _ in self._bufs
            ]
            self._fixed_names = [
                (
                    f"qo_indptr_buf_arr[{i}]",
                    "the query rows of the first plan()",
                    f"paged_kv_indices_buf_arr[{i}]",
                )
                for i in range(self._num_levels)
            ]
        for i, ((qo, ptr, idx, last), bufs) in enumerate(zip(levels, self._bufs)):
            names = ("qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len")
            # A level under the buffers' batch size leaves their tails as they were.
            for buf, a, name in zip(bufs, (qo, ptr, idx, last), names):
                _host.copy_into(buf, a, f"{name}_buf_arr[{i}]")

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
        """Plan every level: lists of per-level indptr/indices/last_page_len
        (host or device int32)."""
        self._refuse_capture()
        lists = (qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len)
        if any(len(a) != self._num_levels for a in lists):
            raise ValueError(f"every per-level list must have num_levels={self._num_levels} items")
        levels = []
        for i, (qo, ptr, idx, last) in enumerate(zip(*lists)):
            qo = _host.indptr(qo, f"qo_indptr_arr[{i}]")
            names = (
                f"paged_kv_indptr_arr[{i}]",
                f"paged_kv_indices_arr[{i}]",
                f"paged_kv_last_page_len[{i}]",
            )
            levels.append((qo,) + _host.page_table(ptr, idx, last, names, qo.shape[0] - 1))
        if self._use_cuda_graph:
            self._graph_levels(levels)
        self._q_name, self._kv_name, self._o_name = plan_dtypes(q_data_type, kv_data_type, None)
        spec = self._make_spec(
            S.KV_FORMAT_PAGED,
            page_size,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            head_dim,
            causal=causal,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap,
            sm_scale=sm_scale,
            pos_encoding_mode=pos_encoding_mode,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        if self._plan is None:
            ctx = context(self.device)
            self._plan = Cascade(ctx, self._num_levels, self._fixed, self._fixed_names)
        self._planned = False
        self._plan.update(spec, levels)
        self._planned = True

    begin_forward = plan

    def run(self, q, paged_kv_cache):
        """Cascade attention of q [qo_indptr_arr[l][-1], num_qo_heads, head_dim]."""
        cascade = self._require_plan()
        check_rank(q, "q", 3, "[tokens, num_qo_heads, head_dim]")
        k, v, arrays = paged_kv_views(paged_kv_cache)
        _context.check_same_device(self.device, [("q", q)] + arrays)
        short = q.shape[0] < cascade.total_qo
        if short or (q.shape[0] != cascade.total_qo and not self._use_cuda_graph):
            raise ValueError(
                f"q has {q.shape[0]} tokens; plan() was given {cascade.total_qo} "
                "(qo_indptr_arr[l][-1])"
            )
        capturing = _context.check_capture(
            self.device, self._use_cuda_graph, f"{self._name}.run()"
        )
        out, _ = outputs(q, cascade.spec.head_dim_vo, self._o_name, None, None, False, self.device)
        if capturing:
            cascade.captured = True  # replays read this cascade's memory: never re-create it
        cascade.run(q, k, v, out, None, cascade.ctx.current_stream())
        return out

    forward = run


class _SharedPrefixBase:
    """FlashInfer's shared-prefix wrappers: a prefix of keys every query of the
    batch sees (k_shared / v_shared, [shared_len, H_kv, D] NHD or
    [H_kv, shared_len, D] HND, not causal), then each request's own paged
    keys (unique_kv_cache), the two states merged exactly
    (merge_state_in_place), as FlashInfer computes it."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        kv_layout_code(kv_layout)
        self._kv_layout = kv_layout
        self._batch_wrapper = self._inner(float_workspace_buffer, kv_layout)

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._batch_wrapper.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def end_forward(self):
        """Deprecated in FlashInfer; does nothing."""

    def _merge(self, q, k_shared, v_shared, unique, sm_scale, rope_scale, rope_theta):
        from .prefill import single_prefill_with_kv_cache

        v_shared_out, s_shared = single_prefill_with_kv_cache(
            q,
            k_shared,
            v_shared,
            causal=False,
            kv_layout=self._kv_layout,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
            return_lse=True,
        )
        v_unique, s_unique = unique
        merge_state_in_place(v_shared_out, s_shared, v_unique, s_unique)
        return v_shared_out


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper(_SharedPrefixBase):
    """Decode with a prefix shared by every request (FlashInfer's API)."""

    @staticmethod
    def _inner(buffer, kv_layout):
        from .decode import BatchDecodeWithPagedKVCacheWrapper

        return BatchDecodeWithPagedKVCacheWrapper(buffer, kv_layout)

    def begin_forward(
        self,
        unique_kv_indptr,
        unique_kv_indices,
        unique_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        data_type="float16",
        q_data_type=None,
        kv_data_type=None,
        **options,
    ):
        """Plan the unique part: each request's own pages."""
        self._batch_wrapper.plan(
            unique_kv_indptr,
            unique_kv_indices,
            unique_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=q_data_type or data_type,
            kv_data_type=kv_data_type or data_type,
            **options,
        )

    plan = begin_forward

    def forward(
        self,
        q,
        k_shared,
        v_shared,
        unique_kv_cache,
        allow_fp16_qk_reduction=False,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
    ):
        """q [batch_size, H_qo, D]: attention over k_shared/v_shared, then each
        request's unique pages, merged."""
        unique = self._batch_wrapper.forward_return_lse(
            q, unique_kv_cache, sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta
        )
        return self._merge(q, k_shared, v_shared, unique, sm_scale, rope_scale, rope_theta)

    run = forward


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper(_SharedPrefixBase):
    """Prefill/append with a prefix shared by every request (FlashInfer's API)."""

    @staticmethod
    def _inner(buffer, kv_layout):
        from .prefill import BatchPrefillWithPagedKVCacheWrapper

        return BatchPrefillWithPagedKVCacheWrapper(buffer, kv_layout)

    def begin_forward(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        q_data_type="float16",
        kv_data_type=None,
        **options,
    ):
        """Plan the unique part: each request's queries and own pages."""
        self._batch_wrapper.plan(
            qo_indptr,
            paged_kv_indptr,
            paged_kv_indices,
            paged_kv_last_page_len,
            num_qo_heads,
            num_kv_heads,
            head_dim,
            page_size,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
            **options,
        )

    plan = begin_forward

    def forward(
        self,
        q,
        k_shared,
        v_shared,
        unique_kv_cache,
        causal=False,
        allow_fp16_qk_reduction=False,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
    ):
        """q [qo_indptr[-1], H_qo, D]: the shared prefix (every query sees all of
        it), then each request's unique keys (causal when asked), merged."""
        unique = self._batch_wrapper.forward_return_lse(
            q,
            unique_kv_cache,
            causal=causal,
            sm_scale=sm_scale,
            rope_scale=rope_scale,
            rope_theta=rope_theta,
        )
        return self._merge(q, k_shared, v_shared, unique, sm_scale, rope_scale, rope_theta)

    run = forward
