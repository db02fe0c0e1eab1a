"""The paged KV cache: append_paged_kv_cache, get_batch_indices_positions, get_seq_lens."""

import ctypes

import numpy as np

from . import _context, _host
from ._arrays import (
    c_int32,
    check_writable,
    device_of,
    from_numpy,
    int32_index,
    is_torch,
    name_of,
    view,
)
from ._attention import paged_kv_views
from ._lib import check_op, fn
from .utils import kv_layout_code


def append_paged_kv_cache(
    append_key,
    append_value,
    batch_indices,
    positions,
    paged_kv_cache,
    kv_indices,
    kv_indptr,
    kv_last_page_len,
    kv_layout="NHD",
):
    """Write new tokens' K/V into their pages.

    append_key/append_value [nnz, num_kv_heads, head_dim]; batch_indices and
    positions [nnz] (from get_batch_indices_positions); the page table
    (kv_indices, kv_indptr, kv_last_page_len) already counts the new tokens.
    """
    device = device_of(append_key)
    layout = kv_layout_code(kv_layout)
    k_cache, v_cache, cache_arrays = paged_kv_views(paged_kv_cache)
    named = [
        ("append_value", append_value),
        ("batch_indices", batch_indices),
        ("positions", positions),
        ("kv_indices", kv_indices),
        ("kv_indptr", kv_indptr),
        ("kv_last_page_len", kv_last_page_len),
    ] + cache_arrays
    _context.check_same_device(device, named)
    for name, x in cache_arrays:
        check_writable(x, name)
    ctx = _context.get(device)
    # The converted arrays must outlive the call: the views only hold pointers.
    converted = [
        (int32_index(x, name), name)
        for x, name in (
            (batch_indices, "batch_indices"),
            (positions, "positions"),
            (kv_indices, "kv_indices"),
            (kv_indptr, "kv_indptr"),
            (kv_last_page_len, "kv_last_page_len"),
        )
    ]
    index = [view(x, name) for x, name in converted]
    k_rows, v_rows = view(append_key, "append_key"), view(append_value, "append_value")
    r = ctypes.byref
    check_op(
        fn.append_paged_kv_cache(
            ctx.handle,
            r(k_rows),
            r(v_rows),
            r(index[0]),
            r(index[1]),
            r(k_cache),
            r(v_cache),
            layout,
            r(index[2]),
            r(index[3]),
            r(index[4]),
            ctx.stream(),
        ),
        "append_paged_kv_cache",
        ctx.device,
    )


def get_seq_lens(kv_indptr, kv_last_page_len, page_size):
    """Tokens of each request: max(pages - 1, 0) * page_size + last_page_len."""
    if is_torch(kv_indptr):
        import torch

        pages = kv_indptr[1:] - kv_indptr[:-1]
        return torch.clamp(pages - 1, min=0) * page_size + kv_last_page_len
    pages = np.diff(kv_indptr)
    return np.maximum(pages - 1, 0) * page_size + kv_last_page_len


def get_batch_indices_positions(append_indptr, seq_lens, nnz, batch_indices=None, positions=None):
    """For each appended token: its request and its position in the request.

    Request i appends append_indptr[i+1] - append_indptr[i] tokens at the end
    of its seq_lens[i] tokens (seq_lens counts them already). Entries past
    append_indptr[-1] (up to nnz) get batch index -1 and position 0.
    """
    nnz = c_int32(nnz, "nnz", 0)
    ptr = _host.to_numpy(append_indptr).astype(np.int64)
    lens = _host.to_numpy(seq_lens).astype(np.int64)
    counts = np.diff(ptr)
    if lens.shape[0] != counts.shape[0]:
        raise ValueError(
            f"seq_lens has {lens.shape[0]} entries but append_indptr describes {counts.shape[0]}"
        )
    total = int(ptr[-1]) if ptr.size else 0
    if total > nnz:
        raise ValueError(f"append_indptr[-1]={total} exceeds nnz={nnz}")
    b = np.full(nnz, -1, dtype=np.int32)
    p = np.zeros(nnz, dtype=np.int32)
    b[:total] = np.repeat(np.arange(counts.shape[0], dtype=np.int32), counts)
    token = np.arange(total, dtype=np.int64)
    p[:total] = (np.repeat(lens - counts - ptr[:-1], counts) + token).astype(np.int32)
    out = []
    for given, value, name in ((batch_indices, b, "batch_indices"), (positions, p, "positions")):
        if given is None:
            out.append(from_numpy(value, append_indptr))
        else:
            if tuple(given.shape) != (nnz,) or name_of(given) != "int32":
                raise ValueError(f"{name} must be int32 of shape ({nnz},)")
            _host.copy_into(given, value, name)
            out.append(given)
    return tuple(out)
