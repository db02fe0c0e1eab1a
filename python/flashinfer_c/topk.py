"""Top-k selection as FlashInfer's flashinfer.topk has it: top_k (values and
indices per row), and the fused transforms of sparse attention's second
stage (top_k_ragged_transform, top_k_page_table_transform), on numpy arrays
and torch CPU tensors, run by the C library.

Selection is exact and deterministic: ties at the boundary go to the
smaller index (TopKTieBreak.SMALL, whatever tie_break asks for NONE or
SMALL; LARGE is not offered), NaN ranks above +inf, and `sorted` results
are in descending value, ties by index. Unsorted results come sorted too.
"""

from enum import IntEnum

from ._arrays import is_torch
from . import _serving as C


class TopKTieBreak(IntEnum):
    """FlashInfer's tie-break modes at the selection boundary."""

    NONE = 0
    SMALL = 1
    LARGE = 2


def _tie(tie_break):
    if int(tie_break) == TopKTieBreak.LARGE:
        raise NotImplementedError(
            "flashinfer_c: tie_break=LARGE is not supported; ties go to the smaller index"
        )


def _run(input, k, lengths=None, offsets=None, want_values=True):
    device = C.device_checked(input, [("lengths", lengths), ("offsets", offsets)])
    rows = input.shape[0]
    k = int(k)
    lens = C.as_int32(lengths) if lengths is not None else None
    offs = C.as_int32(offsets) if offsets is not None else None
    values = C.new_out(input, (rows, k)) if want_values else None
    indices = C.new_out(input, (rows, k), "int32")
    v = C.Views()
    C.call("fi_top_k", device, v(input, "input"), k, v(lens, "lengths"), v(offs, "offsets"),
           v(values, "values"), v(indices, "indices"))
    return values, indices


def top_k(input, k, sorted=False, deterministic=False, tie_break=TopKTieBreak.NONE):
    """(values [batch, k] in input's dtype, indices [batch, k] int64)."""
    _tie(tie_break)
    values, indices = _run(input, k)
    indices = indices.long() if is_torch(indices) else indices.astype("int64")
    return values, indices


topk = top_k


def top_k_ragged_transform(input, offsets, lengths, k, deterministic=False,
                           tie_break=TopKTieBreak.NONE):
    """indices [rows, k] int32 of the top-k of input[i, :lengths[i]], plus
    offsets[i]; -1 past a row's length."""
    _tie(tie_break)
    return _run(input, k, lengths, offsets, want_values=False)[1]


def top_k_page_table_transform(input, src_page_table, lengths, k, row_to_batch=None,
                               deterministic=False, tie_break=TopKTieBreak.NONE):
    """src_page_table[row_to_batch[i] (or i), top-k index] per row, -1 past
    the row's length: [rows, k] int32."""
    _tie(tie_break)
    idx = _run(input, k, lengths, None, want_values=False)[1]
    if is_torch(idx):
        import torch

        batch = (row_to_batch.long() if row_to_batch is not None
                 else torch.arange(idx.shape[0]))
        table = src_page_table[batch]
        out = torch.gather(table, 1, idx.clamp(min=0).long()).to(torch.int32)
        return torch.where(idx < 0, torch.full_like(out, -1), out)
    import numpy as np

    batch = (np.asarray(row_to_batch, dtype=np.int64) if row_to_batch is not None
             else np.arange(idx.shape[0]))
    table = np.asarray(src_page_table)[batch]
    out = np.take_along_axis(table, np.maximum(idx, 0).astype(np.int64), 1).astype(np.int32)
    return np.where(idx < 0, np.int32(-1), out)


__all__ = ["TopKTieBreak", "top_k", "topk", "top_k_ragged_transform",
           "top_k_page_table_transform"]
