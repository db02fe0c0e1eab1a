"""BatchAttention: one call for a batch mixing prefill and decode requests
over a paged KV cache, whose lengths come as kv_len_arr."""

import numpy as np

from . import _host
from ._attention import paged_kv_views
from ._context import parse_device
from ._wrapper import refuse_extras
from .prefill import BatchPrefillWithPagedKVCacheWrapper
from .utils import kv_layout_code


class BatchAttention:
    """Paged attention for a mixed batch; run() returns (out, lse).

    FlashInfer's default device is "cuda"; pass device="cpu" for CPU tensors
    and numpy arrays.
    """

    def __init__(self, kv_layout="NHD", device="cuda"):
        kv_layout_code(kv_layout)
        self._kv_layout = kv_layout
        self._wrapper = BatchPrefillWithPagedKVCacheWrapper(None, kv_layout)
        self._wrapper._name = "BatchAttention"
        self._wrapper.device = parse_device(device)
        self._logits_soft_cap = 0.0

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        kv_indices,
        kv_len_arr,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        head_dim_vo,
        page_size,
        causal=False,
        sm_scale=None,
        logits_soft_cap=None,
        q_data_type="bfloat16",
        kv_data_type="bfloat16",
        use_profiler=False,
    ):
        """Plan a batch: query indptr, page table, and each request's KV length."""
        self._wrapper._refuse_capture()
        if use_profiler:
            raise NotImplementedError("use_profiler is not supported by flashinfer_c")
        ptr = _host.indptr(kv_indptr, "kv_indptr")
        lens = _host.i32(kv_len_arr, "kv_len_arr", ptr.shape[0] - 1).astype(np.int64)
        pages = np.diff(ptr).astype(np.int64)
        last = np.where(pages > 0, lens - (pages - 1) * page_size, 0)
        bad = np.nonzero(
            (pages > 0) & ((last < 1) | (last > page_size)) | (pages == 0) & (lens != 0)
        )[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"kv_len_arr[{i}]={lens[i]} does not fit request {i}'s {pages[i]} pages of "
                f"page_size {page_size}"
            )
        self._logits_soft_cap = float(logits_soft_cap or 0.0)
        self._wrapper.plan(
            qo_indptr,
            ptr,
            kv_indices,
            last.astype(np.int32),
            num_qo_heads,
            num_kv_heads,
            head_dim_qk,
            page_size,
            head_dim_vo=head_dim_vo,
            causal=causal,
            sm_scale=sm_scale,
            logits_soft_cap=logits_soft_cap,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type,
        )

    def run(self, q, kv_cache, out=None, lse=None, logits_soft_cap=None, profiler_buffer=None):
        """Attention of q [qo_indptr[-1], num_qo_heads, head_dim_qk]; returns (out, lse)."""
        refuse_extras("BatchAttention.run()", (), profiler_buffer=profiler_buffer)
        changes = {}
        if logits_soft_cap is not None and float(logits_soft_cap) != self._logits_soft_cap:
            changes["logits_soft_cap"] = float(logits_soft_cap)
        self._wrapper._require_plan()
        k, v, arrays = paged_kv_views(kv_cache)
        return self._wrapper._run(
            q, k, v, arrays, None, None, None, out, lse, True, self._wrapper._mask, **changes
        )
