"""BatchAttention: one call for a batch mixing prefill and decode requests
over a paged KV cache, whose lengths come as kv_len_arr."""

import functools

import numpy as np

from . import _context, _host
from ._attention import paged_kv_entry
from ._context import parse_device
from ._wrapper import refuse_extras, unit_scales
from .prefill import BatchPrefillWithPagedKVCacheWrapper
from .utils import kv_layout_code

__all__ = ["BatchAttention", "BatchAttentionWithAttentionSinkWrapper"]


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
        # As FlashInfer allocates its workspaces here: a device that cannot run
        # fails now, with the library's message (no driver / no GPU).
        _context.get(self._wrapper.device)
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
        lens = _host.i32(kv_len_arr, "kv_len_arr", ptr.shape[0] - 1)
        last = _last_page_lens(ptr, lens, page_size)
        self._logits_soft_cap = float(logits_soft_cap or 0.0)
        self._wrapper.plan(
            qo_indptr,
            _host.CheckedIndptr(ptr),  # checked above: not again
            kv_indices,
            last,
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

    def run(
        self,
        q,
        kv_cache,
        out=None,
        lse=None,
        k_scale=None,
        v_scale=None,
        logits_soft_cap=None,
        profiler_buffer=None,
    ):
        """Attention of q [qo_indptr[-1], num_qo_heads, head_dim_qk]; returns (out, lse).
        k_scale folds into the softmax scale, v_scale multiplies the output
        (floats, as FlashInfer's run takes them)."""
        w = self._wrapper
        if (
            profiler_buffer is None
            and ((k_scale is None and v_scale is None) or unit_scales(k_scale, v_scale))
            and (logits_soft_cap is None or logits_soft_cap == self._logits_soft_cap)
            and w._mask is None
        ):
            plan = w._plan
            fast = None if plan is None else plan.memo
            if fast is not None:
                result = fast.run(q, kv_cache, out, lse, True)
                if result is not None:
                    return result
        refuse_extras("BatchAttention.run()", (), profiler_buffer=profiler_buffer)
        changes = {}
        if logits_soft_cap is not None and float(logits_soft_cap) != self._logits_soft_cap:
            changes["logits_soft_cap"] = float(logits_soft_cap)
        w._require_plan()
        k, v, arrays, entry = paged_kv_entry(kv_cache, self._kv_layout)
        return w._run(
            q, k, v, arrays, None, k_scale, v_scale, out, lse, True, w._mask,
            kv_entry=entry, **changes,
        )


_INT32_MAX = 2**31 - 1
_count_nonzero = _host._count_nonzero
_PAGE_SIZE_ROWS = {}


def _last_page_lens(ptr, lens, page_size):
    """Each request's last_page_len (int32) from its pages and KV length,
    checked: 1..page_size tokens on a request's last page, 0 for a request
    without pages (whose length must be 0).

    ptr: a checked kv_indptr (starts at 0, non-decreasing); lens: int32.
    Where every request has pages and page_size * ptr[-1] fits in int32 (a
    serving batch), in int32 with few numpy calls (each costs about a
    microsecond, the arithmetic nothing); else in int64 (_last_page_lens_any)."""
    n = lens.shape[0]
    if type(page_size) is not int or page_size < 1 or ptr.item(-1) * page_size > _INT32_MAX:
        return _last_page_lens_any(ptr, lens, page_size)
    pages = np.subtract(ptr[1:], ptr[:-1])
    if _count_nonzero(pages) != n:
        return _last_page_lens_any(ptr, lens, page_size)
    ps, ps_u32 = _page_size_row(n, page_size)
    d = np.multiply(pages, ps)  # <= page_size * ptr[-1]: no overflow
    np.subtract(d, lens, out=d)  # page_size - last, which may wrap...
    # ...but 1 <= last <= page_size exactly where 0 <= d < page_size as uint32
    # (d's true value lies within (-2**31, 2**32): no other value reads so)
    if _count_nonzero(np.greater_equal(d.view(np.uint32), ps_u32)):
        return _last_page_lens_any(ptr, lens, page_size)
    return np.subtract(ps, d, out=d)


def _page_size_row(n, page_size):
    """[page_size] * n as int32 and as uint32, cached (read-only): numpy
    takes an array operand faster than a Python int it must convert."""
    key = (n, page_size)
    row = _PAGE_SIZE_ROWS.get(key)
    if row is None:
        if len(_PAGE_SIZE_ROWS) > 64:
            _PAGE_SIZE_ROWS.clear()
        ps = np.full(n, page_size, dtype=np.int32)
        ps.flags.writeable = False
        row = _PAGE_SIZE_ROWS[key] = (ps, ps.view(np.uint32))
    return row


def _last_page_lens_any(ptr, lens, page_size):
    """_last_page_lens of any batch, in int64 (no int32 overflow)."""
    pages = np.subtract(ptr[1:], ptr[:-1], dtype=np.int64)
    last = lens - (pages - 1) * page_size
    if pages.size and (
        np.minimum.reduce(pages) == 0
        or np.minimum.reduce(last) < 1
        or np.maximum.reduce(last) > page_size
    ):
        # a request without pages, or a length that does not fit (rare): in full
        last = np.where(pages > 0, last, 0)
        bad = np.nonzero(
            (pages > 0) & ((last < 1) | (last > page_size)) | (pages == 0) & (lens != 0)
        )[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(
                f"kv_len_arr[{i}]={lens[i]} does not fit request {i}'s {pages[i]} pages of "
                f"page_size {page_size}"
            )
    return last.astype(np.int32)


class BatchAttentionWithAttentionSinkWrapper(BatchPrefillWithPagedKVCacheWrapper):
    """FlashInfer's paged prefill/decode wrapper with attention sinks (gpt-oss):
    run(q, paged_kv_cache, sinks, sm_scale) takes the per-head sink logits
    (float [num_qo_heads]) and the softmax scale as FlashInfer's extra run
    arguments. The sinks join each row's softmax denominator (apply_sinks);
    the LSE returned includes them. q/kv dtypes, head dims and window_left
    given to the constructor are the defaults of plan()."""

    _name = "BatchAttentionWithAttentionSinkWrapper"

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
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        q_data_type="bfloat16",
        kv_data_type="bfloat16",
        head_dim_qk=128,
        head_dim_vo=128,
        window_left=-1,
    ):
        super().__init__(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            qo_indptr_buf,
            paged_kv_indptr_buf,
            paged_kv_indices_buf,
            paged_kv_last_page_len_buf,
            custom_mask_buf,
            mask_indptr_buf,
            backend,
        )
        self._sink_defaults = dict(
            q_data_type=q_data_type, kv_data_type=kv_data_type, window_left=window_left,
            pos_encoding_mode=pos_encoding_mode,
        )

    def plan(self, *args, **kwargs):
        for name, value in self._sink_defaults.items():
            kwargs.setdefault(name, value)
        return super().plan(*args, **kwargs)

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, sinks=None, **kwargs):
        """run(q, paged_kv_cache, sinks, sm_scale, out=..., lse=..., return_lse=...)."""
        if len(args) > 2:
            raise ValueError(
                f"{self._name}.run() takes (q, paged_kv_cache, sinks, sm_scale), got "
                f"{2 + len(args)} positional arguments"
            )
        if args:
            if sinks is not None:
                raise TypeError("sinks given both positionally and by keyword")
            sinks = args[0]
        if len(args) == 2 and args[1] is not None and float(args[1]) != self._planned_sm_scale():
            self._sm_scale = float(args[1])
        if sinks is None:
            raise ValueError(f"{self._name}.run() needs sinks (float [num_qo_heads])")
        return super().run(q, paged_kv_cache, sinks=sinks, **kwargs)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def _planned_sm_scale(self):
        spec = self._require_plan().spec
        return spec.sm_scale

