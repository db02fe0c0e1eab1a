"""packbits / segment_packbits: binary arrays packed into uint8, as numpy.packbits.

Custom attention masks are packed with bitorder="little" (bit j of a byte is
element 8*i + j), one byte-aligned segment per request. These run on the
host (masks are built at plan time); the result has the input's type and
device.
"""

import numpy as np

from ._arrays import from_numpy, is_torch
from ._host import i32, to_numpy


def _bits(x, name):
    a = to_numpy(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(a.shape)}")
    return a.astype(bool, copy=False)


def _bitorder(bitorder):
    if bitorder not in ("big", "little"):
        raise ValueError(f"bitorder={bitorder!r}: expected 'big' or 'little'")
    return bitorder


def packbits(x, bitorder="big"):
    """Pack a 1-D binary array into uint8, shape ((len(x) + 7) // 8,)."""
    packed = np.packbits(_bits(x, "x"), bitorder=_bitorder(bitorder))
    return from_numpy(packed, x) if is_torch(x) else packed


def segment_packbits(x, indptr, bitorder="big"):
    """Pack each segment x[indptr[i]:indptr[i+1]] on its own, byte-aligned.

    Returns (y, new_indptr): segment i's bytes are y[new_indptr[i]:new_indptr[i+1]].
    """
    bits = _bits(x, "x")
    ptr = i32(indptr, "indptr", convert=True).astype(np.int64)
    order = _bitorder(bitorder)
    if ptr.shape[0] < 1 or ptr[-1] > bits.shape[0]:
        raise ValueError(
            f"indptr[-1]={ptr[-1] if ptr.size else None} exceeds len(x)={bits.shape[0]}"
        )
    sizes = (np.diff(ptr) + 7) // 8
    new_indptr = np.zeros(ptr.shape[0], dtype=np.int32)
    np.cumsum(sizes, out=new_indptr[1:])
    y = np.concatenate(
        [np.packbits(bits[ptr[i] : ptr[i + 1]], bitorder=order) for i in range(ptr.shape[0] - 1)]
        or [np.zeros(0, np.uint8)]
    )
    if is_torch(x):
        return from_numpy(y, x), from_numpy(new_indptr, x)
    return y, new_indptr
