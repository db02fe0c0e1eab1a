"""Block-sparse attention: BlockSparseAttentionWrapper (BSR, block size R x C)
and VariableBlockSparseAttentionWrapper (per-KV-head blocks of any sizes).

Both run on the C library's block-sparse format (fi_bsr_*, docs/CASCADE.md):
fixed R x C blocks through fi_bsr_update (an element mask, and causal
masking turned into one, as per-block [R, C] bits), variable blocks through
fi_bsr_update_variable (q/k/v/out/lse in FlashInfer's head-major layout
passed as strided views, no copy).

As in FlashInfer, causal masking counts along each block row's gathered
keys (a block row is a request whose keys are its non-zero blocks, in
order). fi_bsr has no key positions, so fused RoPE/ALiBi (and causal with
variable blocks, which take no element mask) fall back to the lowering
FlashInfer itself uses: every block row one request of a plain paged plan
whose pages are single KV tokens (page_size 1).
"""

import functools

import numpy as np

from . import _context, _host
from . import _structs as S
from ._arrays import c_int32, check_out, device_of, empty, name_of, view
from ._attention import batch_mask, check_rank, context, float_dtype, outputs
from ._bsr import Bsr
from ._wrapper import WrapperBase, refuse_extras
from .utils import pos_encoding_code


def _gather_tokens(entry_start, entry_width, entry_indptr):
    """Token pages of each request: the tokens [start, start + width) of its
    entries, in order. Returns (kv_indptr, kv_indices) as int32."""
    widths = entry_width.astype(np.int64)
    total = int(widths.sum())
    first = np.cumsum(widths) - widths
    tokens = np.repeat(entry_start.astype(np.int64) - first, widths) + np.arange(total)
    per_entry = np.concatenate([[0], np.cumsum(widths)])
    kv_indptr = per_entry[entry_indptr.astype(np.int64)]
    return kv_indptr.astype(np.int32), tokens.astype(np.int32)


def _token_pages_view(x, name):
    """[tokens, H, D] as a paged NHD cache [tokens, 1, H, D] of single-token
    pages, without a copy."""
    t = view(x, name)
    (n, h, d), (sn, sh, sd) = t.shape[:3], t.stride[:3]
    t.ndim = 4
    t.shape[:4] = (n, 1, h, d)
    t.stride[:4] = (sn, sn, sh, sd)
    return t


def _swapped_view(x, name):
    """An array as an fi_tensor view with its first two axes swapped (no copy)."""
    t = view(x, name)
    t.shape[0], t.shape[1] = t.shape[1], t.shape[0]
    t.stride[0], t.stride[1] = t.stride[1], t.stride[0]
    return t


class _SparseBase(WrapperBase):
    def __init__(self, float_workspace_buffer, backend):
        super().__init__(float_workspace_buffer, "NHD", False, backend, None)
        self._mask = None
        self._bsr = None
        self._tokens = False  # planned on the token lowering (a plain plan)

    def _token_spec(self, num_qo_heads, num_kv_heads, head_dim, **options):
        """The Spec of a batch of single-token pages (NHD, the planned dtypes)."""
        return self._make_spec(
            S.KV_FORMAT_PAGED, 1, num_qo_heads, num_kv_heads, head_dim, head_dim, **options
        )

    def _plan_tokens(self, spec, qo_indptr, kv_indptr, kv_indices, mask_indptr):
        last = (np.diff(kv_indptr) > 0).astype(np.int32)  # pages are single tokens
        self._update(spec, qo_indptr, kv_indptr, kv_indices, last, mask_indptr)
        self._tokens = True

    def _update_bsr(self, method, spec, *arrays):
        """Plan the pattern on the C block-sparse object (fi_bsr_update[_variable])."""
        if self._bsr is None:
            self._bsr = Bsr(context(self.device))
        self._planned = self._tokens = False
        getattr(self._bsr, method)(spec, *arrays)
        self._planned = True

    def _run_bsr(self, q, k, v, arrays, out, lse, want_lse):
        """fi_bsr_run on q, k, v, out, lse (arrays or fi_tensor views)."""
        _context.check_same_device(self.device, arrays)
        _context.check_capture(self.device, False, f"{self._name}.run()")
        if self._bsr.qo_len:
            self._bsr.run(q, k, v, out, lse if want_lse else None, self._bsr.ctx.current_stream())

    def plan_info(self):
        """The token lowering's C plan decisions; {} on the block-sparse object."""
        self._require_plan()
        return self._plan.info() if self._tokens else {}


class BlockSparseAttentionWrapper(_SparseBase):
    """Attention with a block-sparse (BSR) mask: block row i of R query rows
    reads the C-wide column blocks indices[indptr[i]:indptr[i+1]]."""

    _name = "BlockSparseAttentionWrapper"

    def __init__(self, float_workspace_buffer, backend="auto"):
        super().__init__(float_workspace_buffer, backend)

    def plan(
        self,
        indptr,
        indices,
        M,
        N,
        R,
        C,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        mask=None,
        packed_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type="float16",
        non_blocking=True,
    ):
        """Plan for a BSR matrix of M x N elements in R x C blocks.

        mask: bool (nnz, R, C), the element mask of each non-zero block.
        packed_mask: the same in FlashInfer's flattened packed layout.
        """
        self._refuse_capture()
        for name, value in (("M", M), ("N", N), ("R", R), ("C", C)):
            if int(value) <= 0:
                raise ValueError(f"{name}={value}: must be positive")
        M, N, R, C = (c_int32(x, n, 1) for x, n in ((M, "M"), (N, "N"), (R, "R"), (C, "C")))
        MB, NB = -(-M // R), -(-N // C)
        ptr = _host.indptr(indptr, "indptr")
        if ptr.shape[0] != MB + 1:
            raise ValueError(
                f"indptr has {ptr.shape[0]} entries, expected ceil(M/R) + 1 = {MB + 1}"
            )
        idx = _host.i32(indices, "indices")
        nnz = int(ptr[-1])
        if idx.shape[0] < nnz:
            raise ValueError(f"indices has {idx.shape[0]} entries but indptr[-1]={nnz}")
        idx = idx[:nnz].copy()  # fi_bsr_update references it until the next plan
        if nnz and (idx.min() < 0 or idx.max() >= NB):
            raise ValueError(
                f"indices must lie in [0, ceil(N/C) = {NB}); got {idx.min()}..{idx.max()}"
            )
        starts = idx.astype(np.int64) * C
        widths = np.minimum(C, N - starts)
        qo_indptr = np.minimum(np.arange(MB + 1, dtype=np.int64) * R, M).astype(np.int32)
        row_kv = np.bincount(_row_of_blocks(ptr)[0], widths, MB).astype(np.int64)

        q_name = float_dtype(q_data_type, "q_data_type")
        self._q_name = q_name
        self._kv_name = float_dtype(kv_data_type or q_name, "kv_data_type", allow_fp8=True)
        self._o_name = float_dtype(o_data_type or q_name, "o_data_type")
        options = dict(logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)
        self.M, self.N, self.R, self.C = M, N, R, C
        if pos_encoding_code(pos_encoding_mode) != S.POS_NONE:
            self._plan_bsr_tokens(
                ptr, starts, widths, qo_indptr, mask, packed_mask,
                (num_qo_heads, num_kv_heads, head_dim),
                dict(options, causal=causal, pos_encoding_mode=pos_encoding_mode,
                     rope_scale=rope_scale, rope_theta=rope_theta),
            )  # fmt: skip
            return
        blocks = None
        if packed_mask is not None:
            blocks = _unpack_blocks(packed_mask, ptr, widths, np.diff(qo_indptr), row_kv, R, C)
        elif mask is not None:
            blocks = _host.to_numpy(mask)
            if blocks.shape != (nnz, R, C):
                raise ValueError(
                    f"mask must have shape (nnz, R, C) = {(nnz, R, C)}, got {blocks.shape}"
                )
            blocks = blocks.astype(bool)
        if causal:
            seen = _causal_blocks(ptr, np.diff(qo_indptr), row_kv, R, C)
            blocks = seen if blocks is None else blocks & seen
        if blocks is not None:
            blocks = np.ascontiguousarray(blocks, dtype=np.uint8)
        spec = self._make_spec(
            S.KV_FORMAT_PAGED, C, num_qo_heads, num_kv_heads, head_dim, head_dim, **options
        )
        self._update_bsr("update", spec, M, N, R, C, ptr, idx, blocks)

    begin_forward = plan

    def _plan_bsr_tokens(self, ptr, starts, widths, qo_indptr, mask, packed_mask, heads, options):
        """The token lowering (fused RoPE/ALiBi): a plain plan of single-token pages."""
        kv_indptr, kv_indices = _gather_tokens(starts, widths, ptr)
        qo_lens, kv_lens = np.diff(qo_indptr), np.diff(kv_indptr)
        self._mask, mask_indptr = None, None
        if packed_mask is not None:
            self._mask, mask_indptr = batch_mask(None, packed_mask, qo_lens, kv_lens, self.device)
        elif mask is not None:
            bits = self._mask_bits(_host.to_numpy(mask), ptr, widths, qo_lens, self.R, self.C)
            self._mask, mask_indptr = batch_mask(bits, None, qo_lens, kv_lens, self.device)
        spec = self._token_spec(*heads, custom_mask=self._mask is not None, **options)
        self._plan_tokens(spec, qo_indptr, kv_indptr, kv_indices, mask_indptr)

    @staticmethod
    def _mask_bits(mask, ptr, widths, qo_lens, R, C):
        """The element masks (nnz, R, C) as each block row's row-major
        [rows, gathered tokens] bits, concatenated over rows."""
        if mask.shape != (int(ptr[-1]), R, C):
            raise ValueError(
                f"mask must have shape (nnz, R, C) = {(int(ptr[-1]), R, C)}, got {mask.shape}"
            )
        mask = mask.astype(bool, copy=False)
        cols = np.arange(C)
        parts = []
        for i in range(ptr.shape[0] - 1):
            s, e, rows = int(ptr[i]), int(ptr[i + 1]), int(qo_lens[i])
            block = mask[s:e, :rows, :].transpose(1, 0, 2)  # (rows, blocks, C)
            valid = cols[None, :] < widths[s:e, None]  # the last column block may be short
            parts.append(block[:, valid].reshape(-1))
        return np.concatenate(parts) if parts else np.zeros(0, bool)

    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None, *args, **kwargs):
        """q [M, num_qo_heads, head_dim]; k, v [N, num_kv_heads, head_dim]."""
        refuse_extras(f"{self._name}.run()", args, **kwargs)
        self._require_plan()
        check_rank(k, "k", 3, "[N, num_kv_heads, head_dim]")
        check_rank(v, "v", 3, "[N, num_kv_heads, head_dim]")
        if self._tokens:
            k_pages, v_pages = _token_pages_view(k, "k"), _token_pages_view(v, "v")
            arrays = [("k", k), ("v", v)]
            return self._run(
                q, k_pages, v_pages, arrays, None, None, None, out, lse, return_lse, self._mask
            )
        check_rank(q, "q", 3, "[M, num_qo_heads, head_dim]")
        if q.shape[0] != self.M:
            raise ValueError(f"q has {q.shape[0]} rows, plan() was given M={self.M}")
        out, lse = outputs(
            q, self._bsr.spec.head_dim_vo, self._o_name, out, lse, return_lse, self.device
        )
        arrays = [("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)]
        self._run_bsr(q, k, v, arrays, out, lse, return_lse)
        return (out, lse) if return_lse else out

    run_return_lse = functools.partialmethod(run, return_lse=True)


def _row_of_blocks(ptr):
    """Block row of each non-zero block, and its position within the row."""
    counts = np.diff(ptr).astype(np.int64)
    row = np.repeat(np.arange(counts.shape[0]), counts)
    return row, np.arange(row.shape[0]) - ptr[:-1].astype(np.int64)[row]


def _causal_blocks(ptr, qo_lens, row_kv, R, C):
    """Causal masking as element masks (nnz, R, C): row r of block row i sees
    the keys of its gathered blocks up to kv_len_i - qo_len_i + r (bottom-right,
    as FlashInfer's causal over a block row's keys)."""
    row, pos = _row_of_blocks(ptr)
    key = pos[:, None, None] * C + np.arange(C)[None, None, :]
    limit = (row_kv - qo_lens).astype(np.int64)[row][:, None, None] + np.arange(R)[None, :, None]
    return key <= limit


def _unpack_blocks(packed, ptr, widths, qo_lens, row_kv, R, C):
    """FlashInfer's packed_mask (each block row's [rows, gathered keys] bits,
    segments byte-aligned, bitorder little) as element masks (nnz, R, C)."""
    bits = np.unpackbits(_host.to_numpy(packed).astype(np.uint8), bitorder="little")
    sizes = qo_lens.astype(np.int64) * row_kv.astype(np.int64)
    seg = np.concatenate([[0], np.cumsum((sizes + 7) // 8) * 8])
    if bits.shape[0] < seg[-1]:
        raise ValueError(
            f"packed_mask has {bits.shape[0] // 8} bytes; the pattern needs {seg[-1] // 8}"
        )
    blocks = np.zeros((int(ptr[-1]), R, C), bool)
    for i in range(ptr.shape[0] - 1):
        rows, keys = int(qo_lens[i]), int(row_kv[i])
        m = bits[seg[i] : seg[i] + rows * keys].reshape(rows, keys)
        at = 0
        for e in range(int(ptr[i]), int(ptr[i + 1])):
            w = int(widths[e])
            blocks[e, :rows, :w] = m[:, at : at + w]
            at += w
    return blocks


class VariableBlockSparseAttentionWrapper(_SparseBase):
    """Block-sparse attention with blocks of any sizes and a pattern per KV head.

    q [num_qo_heads, qo_len, head_dim], k/v [num_kv_heads, kv_len, head_dim];
    the query heads of a KV head's group share its pattern.
    """

    _name = "VariableBlockSparseAttentionWrapper"

    def __init__(self, float_workspace_buffer, backend="auto"):
        super().__init__(float_workspace_buffer, backend)

    def plan(
        self,
        block_mask_map,
        block_row_sz,
        block_col_sz,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        q_data_type="float16",
        kv_data_type=None,
    ):
        """block_mask_map bool [num_kv_heads, MB, NB]; block_row_sz [num_kv_heads, MB];
        block_col_sz [num_kv_heads, NB] (rows / columns of each block)."""
        self._refuse_capture()
        if num_qo_heads % num_kv_heads:
            raise ValueError(
                f"num_qo_heads={num_qo_heads} is not a multiple of num_kv_heads={num_kv_heads}"
            )
        blocks = _host.to_numpy(block_mask_map).astype(bool)
        rows = _host.to_numpy(block_row_sz).astype(np.int64)
        cols = _host.to_numpy(block_col_sz).astype(np.int64)
        H = num_kv_heads
        if blocks.ndim != 3 or blocks.shape[0] != H:
            raise ValueError(
                f"block_mask_map must be [num_kv_heads={H}, MB, NB], got {blocks.shape}"
            )
        _, MB, NB = blocks.shape
        if rows.shape != (H, MB) or cols.shape != (H, NB):
            raise ValueError(
                f"block_row_sz must be [{H}, {MB}] and block_col_sz [{H}, {NB}]; got "
                f"{rows.shape} and {cols.shape}"
            )
        if (rows < 0).any() or (cols < 0).any():
            raise ValueError("block sizes must not be negative")
        qo_len, kv_len = rows.sum(1), cols.sum(1)
        if (qo_len != qo_len[0]).any() or (kv_len != kv_len[0]).any():
            raise ValueError("every KV head's block sizes must add up to the same qo_len / kv_len")
        self._qo_len, self._kv_len = int(qo_len[0]), int(kv_len[0])
        self._q_name = float_dtype(q_data_type, "q_data_type")
        self._kv_name = float_dtype(kv_data_type or self._q_name, "kv_data_type", allow_fp8=True)
        self._o_name = self._q_name
        self._num_kv_heads, self._group = H, num_qo_heads // H
        options = dict(logits_soft_cap=logits_soft_cap, sm_scale=sm_scale)
        if causal or pos_encoding_code(pos_encoding_mode) != S.POS_NONE:
            options.update(causal=causal, pos_encoding_mode=pos_encoding_mode,
                           rope_scale=rope_scale, rope_theta=rope_theta)  # fmt: skip
            self._plan_variable_tokens(blocks, rows, cols, head_dim, options)
            return
        # Column blocks become pages of the largest size dividing every block.
        granularity = int(np.gcd.reduce(cols.reshape(-1))) or 1
        spec = self._make_spec(
            S.KV_FORMAT_PAGED, granularity, num_qo_heads, H, head_dim, head_dim, **options
        )
        self._update_bsr(
            "update_variable",
            spec,
            self._qo_len,
            self._kv_len,
            np.ascontiguousarray(rows, dtype=np.int32),
            np.ascontiguousarray(cols, dtype=np.int32),
            np.ascontiguousarray(blocks, dtype=np.uint8),
            granularity,
        )

    begin_forward = plan

    def _plan_variable_tokens(self, blocks, rows, cols, head_dim, options):
        """The token lowering (causal, fused RoPE/ALiBi): requests are (head, block
        row); KV token t of head h is page h * kv_len + t."""
        H = self._num_kv_heads
        col_start = np.cumsum(cols, 1) - cols + np.arange(H)[:, None] * self._kv_len
        h_idx, _, c_idx = np.nonzero(blocks)
        entry_indptr = np.concatenate([[0], np.cumsum(blocks.sum(2).reshape(-1))])
        kv_indptr, kv_indices = _gather_tokens(
            col_start[h_idx, c_idx], cols[h_idx, c_idx], entry_indptr
        )
        qo_indptr = np.concatenate([[0], np.cumsum(rows.reshape(-1))]).astype(np.int32)
        spec = self._token_spec(self._group, 1, head_dim, **options)
        self._plan_tokens(spec, qo_indptr, kv_indptr, kv_indices, None)

    def run(self, q, k, v, out=None, lse=None, return_lse=False, enable_pdl=None):
        """Returns out [num_qo_heads, qo_len, head_dim] (and lse [num_qo_heads, qo_len])."""
        self._require_plan()
        check_rank(q, "q", 3, "[num_qo_heads, qo_len, head_dim]")
        check_rank(k, "k", 3, "[num_kv_heads, kv_len, head_dim]")
        check_rank(v, "v", 3, "[num_kv_heads, kv_len, head_dim]")
        H, G, L = self._num_kv_heads, self._group, self._qo_len
        if tuple(q.shape[:2]) != (H * G, L):
            raise ValueError(f"q must be [{H * G}, {L}, head_dim], got {tuple(q.shape)}")
        if self._tokens:
            return self._run_tokens(q, k, v, out, lse, return_lse)
        if tuple(k.shape[:2]) != (H, self._kv_len) or tuple(v.shape[:2]) != (H, self._kv_len):
            raise ValueError(
                f"k and v must be [{H}, {self._kv_len}, head_dim], got {tuple(k.shape)} and "
                f"{tuple(v.shape)}"
            )
        device = device_of(q)
        want_lse = return_lse or lse is not None
        o_shape = (H * G, L, v.shape[-1])
        if out is None:
            out = empty(q, o_shape, self._o_name)
        else:
            check_out(out, "out", o_shape, self._o_name, device)
        if lse is None and want_lse:
            lse = empty(q, (H * G, L), "float32")
        elif lse is not None:
            check_out(lse, "lse", (H * G, L), "float32", device)
        arrays = [("q", q), ("k", k), ("v", v), ("out", out), ("lse", lse)]
        # FlashInfer's head-major tensors, seen token-major by strides.
        views = [_swapped_view(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (out, "out"))]
        lse_view = _swapped_view(lse, "lse") if want_lse else None
        self._run_bsr(*views[:3], arrays, views[3], lse_view, want_lse)
        return (out, lse) if return_lse else out

    def _run_tokens(self, q, k, v, out, lse, return_lse):
        H, G, L = self._num_kv_heads, self._group, self._qo_len
        # Heads become part of the token axis: q rows (h, t) with the group's
        # query heads side by side (a copy when a group has several heads).
        packed_q = _swap01(q.reshape(H, G, L, q.shape[-1])).reshape(H * L, G, q.shape[-1])
        # Heads-major K/V rows are the token pages (reshape copies only when
        # k is not row-contiguous; the names keep any copy alive for the run).
        k_rows = k.reshape(H * self._kv_len, 1, k.shape[-1])
        v_rows = v.reshape(H * self._kv_len, 1, v.shape[-1])
        k_pages, v_pages = _token_pages_view(k_rows, "k"), _token_pages_view(v_rows, "v")
        o, s = self._run(
            packed_q, k_pages, v_pages, [("k", k), ("v", v)], None, None, None, None, None, True
        )
        o = _swap01(o.reshape(H, L, G, o.shape[-1])).reshape(H * G, L, o.shape[-1])
        s = _swap01(s.reshape(H, L, G)).reshape(H * G, L)
        o, s = _into(out, o, "out", device_of(q)), _into(lse, s, "lse", device_of(q))
        return (o, s) if return_lse else o

    run_return_lse = functools.partialmethod(run, return_lse=True)


def _swap01(x):
    """Swap the second and third axes of a 3/4-D array (torch or numpy)."""
    if isinstance(x, np.ndarray):
        return x.swapaxes(1, 2)
    return x.transpose(1, 2)


def _into(dest, value, name, device):
    """value, written into the caller's array `dest` when one was given."""
    if dest is None:
        return value
    check_out(dest, name, tuple(value.shape), name_of(value), device)
    dest[...] = value
    return dest
