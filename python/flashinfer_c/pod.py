"""POD attention (prefill and decode of one step together): FlashInfer's
PODWithPagedKVCacheWrapper and BatchPODWithPagedKVCacheWrapper.

BatchPODWithPagedKVCacheWrapper: a batch of prefill requests and a batch of
decode requests over paged caches. When both read the same cache (the usual
case: one pool per layer) and the decode requests are one token each, the
two batches are one C plan (prefill requests first, then the decode ones):
one launch, the persistent schedule balancing both, as FlashInfer's POD
kernel does. Otherwise (two caches, multi-token decode rows under a causal
prefill, decode-only q/k scales) they run as two plans, one after the other.

PODWithPagedKVCacheWrapper (one prefill request whose K/V are their own
tensors, and a paged decode batch): the prefill is a single-request call and
the decode a batch decode plan: two launches.
"""

import numpy as np

from . import _host
from ._attention import apply_v_scale, paged_kv_views, view
from ._wrapper import refuse_unknown
from .decode import BatchDecodeWithPagedKVCacheWrapper
from .prefill import BatchPrefillWithPagedKVCacheWrapper, single_prefill_with_kv_cache
from .utils import kv_layout_code

__all__ = ["PODWithPagedKVCacheWrapper", "BatchPODWithPagedKVCacheWrapper"]


def _cat(a, b, like):
    """a then b along the first axis, as `like`'s array kind."""
    from ._arrays import is_torch

    if is_torch(like):
        import torch

        return torch.cat([a, b], 0)
    return np.concatenate([a, b], 0)


class PODWithPagedKVCacheWrapper:
    """One prefill request (q_p, k_p, v_p) and a batch of decodes over a paged cache."""

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        jit_args=None,
    ):
        if use_cuda_graph:
            raise NotImplementedError(
                "PODWithPagedKVCacheWrapper: CUDA graphs are not supported (as in FlashInfer); "
                "use BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True) for the decodes"
            )
        kv_layout_code(kv_layout)
        self._kv_layout = kv_layout
        self._decode = BatchDecodeWithPagedKVCacheWrapper(
            float_workspace_buffer, kv_layout, jit_args=jit_args
        )
        self.device = self._decode.device

    @property
    def is_cuda_graph_enabled(self):
        return False

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer=None):
        self._decode.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

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
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        **newer,
    ):
        """Plan the decode batch (its page table)."""
        refuse_unknown("PODWithPagedKVCacheWrapper.plan()", newer)
        self._decode.plan(
            indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
            pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type,
            sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
        )

    begin_forward = plan

    def run(
        self,
        q_p,
        k_p,
        v_p,
        q_d,
        paged_kv_cache_d,
        custom_mask_p=None,
        packed_custom_mask_p=None,
        causal_p=False,
        kv_layout_p="NHD",
        pos_encoding_mode_p="NONE",
        sm_scale_p=None,
        window_left_p=-1,
        rope_scale_p=None,
        rope_theta_p=None,
        return_lse_p=False,
        custom_mask_d=None,
        packed_custom_mask_d=None,
        causal_d=False,
        kv_layout_d="NHD",
        pos_encoding_mode_d="NONE",
        sm_scale_d=None,
        window_left_d=-1,
        rope_scale_d=None,
        rope_theta_d=None,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        return_lse_d=False,
        use_fp16_qk_reduction=False,
        enable_pdl=None,
        *args,
        **newer,
    ):
        """(out_p, out_d); each is (out, lse) when its return_lse_* is set. The
        decode options come from plan() (as FlashInfer reads them)."""
        refuse_unknown("PODWithPagedKVCacheWrapper.run()", newer)
        if custom_mask_d is not None or packed_custom_mask_d is not None:
            raise NotImplementedError("PODWithPagedKVCacheWrapper: a decode custom mask")
        if args:
            raise ValueError("PODWithPagedKVCacheWrapper.run(): extra positional arguments")
        out_p = single_prefill_with_kv_cache(
            q_p, k_p, v_p, custom_mask=custom_mask_p, packed_custom_mask=packed_custom_mask_p,
            causal=causal_p, kv_layout=kv_layout_p, pos_encoding_mode=pos_encoding_mode_p,
            sm_scale=sm_scale_p, window_left=window_left_p, rope_scale=rope_scale_p,
            rope_theta=rope_theta_p, return_lse=return_lse_p,
        )
        out_d = self._decode.run(
            q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
            return_lse=return_lse_d,
        )
        return out_p, out_d

    def end_forward(self):
        """Deprecated in FlashInfer; does nothing."""


class BatchPODWithPagedKVCacheWrapper:
    """A batch of prefills and a batch of decodes, one C plan when they share a cache."""

    def __init__(self, float_workspace_buffer, kv_layout="NHD"):
        kv_layout_code(kv_layout)
        self._kv_layout = kv_layout
        self._buffer = float_workspace_buffer
        self._merged = BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._merged._name = "BatchPODWithPagedKVCacheWrapper"
        self.device = self._merged.device
        self._parts = None  # (prefill wrapper, decode wrapper), planned on first need
        self._planned = None

    @property
    def is_cuda_graph_enabled(self):
        return False

    def plan(
        self,
        qo_indptr_p,
        kv_indptr_p,
        kv_indices_p,
        last_page_len_p,
        qo_indptr_d,
        kv_indptr_d,
        kv_indices_d,
        last_page_len_d,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        **newer,
    ):
        """Plan both batches: their prefill and decode page tables (host or device int32)."""
        refuse_unknown("BatchPODWithPagedKVCacheWrapper.plan()", newer)
        if data_type is not None:
            q_data_type = q_data_type or data_type
            kv_data_type = kv_data_type or data_type
        qo_p = _host.indptr(qo_indptr_p, "qo_indptr_p")
        qo_d = _host.indptr(qo_indptr_d, "qo_indptr_d")
        names_p = ("kv_indptr_p", "kv_indices_p", "last_page_len_p")
        names_d = ("kv_indptr_d", "kv_indices_d", "last_page_len_d")
        ptr_p, idx_p, last_p = _host.page_table(
            kv_indptr_p, kv_indices_p, last_page_len_p, names_p, qo_p.shape[0] - 1
        )
        ptr_d, idx_d, last_d = _host.page_table(
            kv_indptr_d, kv_indices_d, last_page_len_d, names_d, qo_d.shape[0] - 1
        )
        options = dict(
            pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            q_data_type=q_data_type, kv_data_type=kv_data_type, sm_scale=sm_scale,
            rope_scale=rope_scale, rope_theta=rope_theta,
        )
        self._planned = (
            (qo_p, ptr_p, idx_p, last_p), (qo_d, ptr_d, idx_d, last_d),
            (num_qo_heads, num_kv_heads, head_dim, page_size), options,
        )
        self._parts = None
        self._rows_p = int(qo_p[-1])
        self._decode_single = bool(np.all(np.diff(qo_d) == 1))
        qo = np.concatenate([qo_p, qo_d[1:] + qo_p[-1]]).astype(np.int32)
        ptr = np.concatenate([ptr_p, ptr_d[1:] + ptr_p[-1]]).astype(np.int32)
        idx = np.concatenate([idx_p, idx_d]).astype(np.int32)
        last = np.concatenate([last_p, last_d]).astype(np.int32)
        self._merged.plan(
            qo, ptr, idx, last, num_qo_heads, num_kv_heads, head_dim, page_size, **options
        )
        self._merged_causal = False

    begin_forward = plan

    def _separate(self):
        if self._parts is None:
            (qo_p, ptr_p, idx_p, last_p), (qo_d, ptr_d, idx_d, last_d), dims, options = (
                self._planned
            )
            p = BatchPrefillWithPagedKVCacheWrapper(self._buffer, self._kv_layout)
            d = BatchPrefillWithPagedKVCacheWrapper(self._buffer, self._kv_layout)
            p.plan(qo_p, ptr_p, idx_p, last_p, *dims, **options)
            d.plan(qo_d, ptr_d, idx_d, last_d, *dims, **options)
            self._parts = (p, d)
        return self._parts

    @staticmethod
    def _same_cache(a, b, kv_layout):
        if a is b:
            return True
        ka, va, _ = paged_kv_views(a, kv_layout)
        kb, vb, _ = paged_kv_views(b, kv_layout)
        def key(t):
            return (t.data, t.dtype, t.ndim, tuple(t.shape[: t.ndim]), tuple(t.stride[: t.ndim]))
        return key(ka) == key(kb) and key(va) == key(vb)

    def run(
        self,
        q_p,
        paged_kv_cache_p,
        q_d,
        paged_kv_cache_d,
        custom_mask_p=None,
        packed_custom_mask_p=None,
        causal_p=False,
        q_scale=None,
        k_scale=None,
        v_scale=None,
        return_lse=False,
        use_fp16_qk_reduction=False,
        enable_pdl=None,
        **newer,
    ):
        """(out_p, out_d), or ((out_p, out_d), (lse_p, lse_d)) with return_lse.
        q_scale/k_scale/v_scale apply to the decode part, as in FlashInfer."""
        refuse_unknown("BatchPODWithPagedKVCacheWrapper.run()", newer)
        if self._planned is None:
            raise RuntimeError("BatchPODWithPagedKVCacheWrapper.run() before plan()")
        if custom_mask_p is not None or packed_custom_mask_p is not None:
            raise NotImplementedError(
                "BatchPODWithPagedKVCacheWrapper: a prefill custom mask (give it to a "
                "BatchPrefillWithPagedKVCacheWrapper plan instead)"
            )
        merged = (
            q_scale is None
            and k_scale is None
            and (self._decode_single or not causal_p)
            and self._same_cache(paged_kv_cache_p, paged_kv_cache_d, self._kv_layout)
        )
        if merged:
            w = self._merged
            if bool(causal_p) != bool(w._causal):
                w._causal = bool(causal_p)
            q = _cat(q_p, q_d, q_p)
            result = w.run(q, paged_kv_cache_p, return_lse=return_lse)
            out, lse = result if return_lse else (result, None)
            n = self._rows_p
            out_p, out_d = out[:n], out[n:]
            apply_v_scale(out_d, v_scale)
            if return_lse:
                return (out_p, out_d), (lse[:n], lse[n:])
            return out_p, out_d
        p, d = self._separate()
        p._causal = bool(causal_p)
        rp = p.run(q_p, paged_kv_cache_p, return_lse=return_lse)
        rd = d.run(
            q_d, paged_kv_cache_d, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
            return_lse=return_lse,
        )
        if return_lse:
            return (rp[0], rd[0]), (rp[1], rd[1])
        return rp, rd

    def end_forward(self):
        """Deprecated in FlashInfer; does nothing."""
