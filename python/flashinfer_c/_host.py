"""Plan-time index arrays: read on the host as contiguous int32 numpy arrays.

plan() reads the batch's indptr/indices on the host, as FlashInfer's plan
does. The C library wants int32; FlashInfer requires int32 too, so int64
is refused with a message rather than silently narrowed.
"""

import numpy as np

from . import _arrays
from ._arrays import DTypeError, is_torch

_INT32 = np.dtype(np.int32)
# numpy's C function under np.count_nonzero (which adds a Python dispatch layer)
_count_nonzero = getattr(
    getattr(getattr(np, "_core", None), "multiarray", None), "count_nonzero", np.count_nonzero
)


def _host_view(x):
    """x, or the numpy view of x where x is an exact host torch.Tensor not
    requiring grad (to_numpy's result for it, without its checks)."""
    if type(x) is _arrays._torch_tensor and x.is_cpu and not x.requires_grad:
        return x.numpy()
    return x


def to_numpy(x):
    """Any torch tensor (CPU, or a device copied to the host) or numpy array as numpy."""
    if is_torch(x):
        if not x.is_cpu:
            # plan() may read device indices: one copy, as FlashInfer's plan does.
            x = x.detach().cpu()
        return x.detach().numpy() if x.requires_grad else x.numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def i32(x, name, length=None, convert=False):
    """`x` as a contiguous 1-D int32 numpy array on the host.

    convert=True narrows other integer dtypes (for calls where FlashInfer
    converts them itself); otherwise only int32 is accepted.
    """
    a = x
    if type(x) is not np.ndarray and type(x) is _arrays._torch_tensor and x.is_cpu and (
        not x.requires_grad
    ):
        a = x.numpy()  # a host tensor's view: then the numpy case
    if type(a) is np.ndarray and a.dtype is _INT32 and a.ndim == 1 and a.flags.c_contiguous:
        # already what the C library reads (the common case: no conversion)
        if length is not None and a.shape[0] != length:
            raise ValueError(f"{name} has {a.shape[0]} entries, expected {length}")
        return a
    if not (is_torch(x) or isinstance(x, np.ndarray)):
        raise TypeError(
            f"{name} must be an int32 torch.Tensor or numpy.ndarray, got {type(x).__name__}"
        )
    if a is x:
        a = to_numpy(x)
    if a.dtype != np.int32:
        if not convert or a.dtype.kind not in "iu":
            hint = ".int()" if is_torch(x) else ".astype(np.int32)"
            raise DTypeError(f"{name} must be int32, got {a.dtype}: convert it with {hint}")
        a = a.astype(np.int32)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(a.shape)}")
    if length is not None and a.shape[0] != length:
        raise ValueError(f"{name} has {a.shape[0]} entries, expected {length}")
    return np.ascontiguousarray(a)


def indptr(x, name, allow_offset=False):
    """An indptr: int32, at least one entry, starting at 0 (allow_offset: at any
    non-negative entry), non-decreasing."""
    a = i32(x, name)
    if a.shape[0] < 1:
        raise ValueError(f"{name} is empty; an indptr has batch_size + 1 entries")
    first = a.item(0)
    if first != 0 and not (allow_offset and first > 0):
        raise ValueError(f"{name}[0]={first}: an indptr must start at 0")
    if _count_nonzero(a[1:] < a[:-1]):
        i = int(np.argmax(np.diff(a) < 0))
        raise ValueError(
            f"{name}[{i}]={a[i]} > {name}[{i + 1}]={a[i + 1]}: an indptr must not decrease"
        )
    return a


def copy_into(buf, a, name):
    """Write host array `a` into the start of a caller's (CUDA-graph) buffer."""
    n = a.shape[0]
    if buf.shape[0] < n:
        raise ValueError(f"{name} holds {buf.shape[0]} entries, the batch needs {n}")
    if is_torch(buf):
        import torch

        buf[:n].copy_(torch.from_numpy(a))
    else:
        buf[:n] = a


class CheckedIndptr:
    """An indptr its caller has checked as indptr() does (BatchAttention
    hands the prefill wrapper's plan() one so, for page_table to take as it is)."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


def _usual_page_table(kv_indptr, kv_indices, kv_last_page_len, batch):
    """page_table's result for the usual call, in one pass over the three
    arrays: host int32 1-D numpy arrays or exact host torch tensors (through
    their numpy views), indptr and last_page_len contiguous, every check
    passing. None for anything else, which page_table then takes array by
    array (the same checks, in its order, so the same errors)."""
    checked = type(kv_indptr) is CheckedIndptr
    ptr = kv_indptr.array if checked else kv_indptr
    t = _arrays._torch_tensor
    if type(ptr) is not np.ndarray:
        if type(ptr) is not t or not ptr.is_cpu or ptr.requires_grad:
            return None
        ptr = ptr.numpy()
    a = kv_indices
    if type(a) is not np.ndarray:
        if type(a) is not t or not a.is_cpu or a.requires_grad:
            return None
        a = a.numpy()
    last = kv_last_page_len
    if type(last) is not np.ndarray:
        if type(last) is not t or not last.is_cpu or last.requires_grad:
            return None
        last = last.numpy()
    if not (
        ptr.dtype is _INT32 and a.dtype is _INT32 and last.dtype is _INT32
        and ptr.ndim == 1 and a.ndim == 1 and last.ndim == 1
    ):
        return None
    n = ptr.shape[0] - 1
    if n < 0 or last.shape[0] != n or (batch is not None and n != batch):
        return None
    if not (ptr.flags.c_contiguous and last.flags.c_contiguous):
        return None
    start, end = ptr.item(0), ptr.item(-1)
    if start < 0 or a.shape[0] < end or (not checked and _count_nonzero(ptr[1:] < ptr[:-1])):
        return None
    if start:
        ptr = ptr - np.int32(start)
    return ptr, a[start:end].copy(), last


def page_table(kv_indptr, kv_indices, kv_last_page_len, names, batch=None):
    """(indptr, indices, last_page_len) of a paged KV cache, checked against each other."""
    # As FlashInfer's kernels, an indptr may start past 0: its requests' pages
    # are kv_indices[indptr[0]:indptr[-1]] (vLLM plans its prefills so, with
    # the slice of its decode-then-prefill indptr and the whole page table).
    tables = _usual_page_table(kv_indptr, kv_indices, kv_last_page_len, batch)
    if tables is not None:
        return tables
    # Anything else (other types or dtypes, device tensors, bad input): each
    # array checked and converted on its own, raising what is wrong.
    if type(kv_indptr) is CheckedIndptr:
        ptr = kv_indptr.array
    else:
        ptr = indptr(kv_indptr, names[0], allow_offset=True)
    n = ptr.shape[0] - 1
    if batch is not None and n != batch:
        raise ValueError(f"{names[0]} has {n + 1} entries, expected batch_size + 1 = {batch + 1}")
    last = i32(kv_last_page_len, names[2], n)
    start, end = ptr.item(0), ptr.item(-1)
    # Only the entries the batch uses are read (and copied from a device);
    # a host tensor is sliced as numpy (a view), cheaper than torch's slice.
    # The C plan references the page table until the next plan (it does not
    # copy it); FlashInfer's plan copies it, so callers may reuse their arrays
    # at once. A copy of our own (C-contiguous) keeps that promise.
    a = kv_indices if type(kv_indices) is np.ndarray else _host_view(kv_indices)
    if type(a) is np.ndarray and a.dtype is _INT32 and a.ndim == 1:
        # host int32 (the common case): only the length is left to check
        if a.shape[0] < end:
            raise ValueError(f"{names[1]} has {a.shape[0]} entries but {names[0]}[-1]={end}")
        if start:
            ptr = ptr - np.int32(start)
        return ptr, a[start:end].copy(), last
    torch_indices = type(kv_indices) is not np.ndarray and is_torch(kv_indices)
    if not (torch_indices or isinstance(kv_indices, np.ndarray)):
        raise TypeError(
            f"{names[1]} must be an int32 torch.Tensor or numpy.ndarray, got "
            f"{type(kv_indices).__name__}"
        )
    if len(kv_indices.shape) != 1:
        raise ValueError(f"{names[1]} must be 1-D, got shape {tuple(kv_indices.shape)}")
    if kv_indices.shape[0] < end:
        raise ValueError(f"{names[1]} has {kv_indices.shape[0]} entries but {names[0]}[-1]={end}")
    if torch_indices and kv_indices.is_cpu:
        a = to_numpy(kv_indices)
        if a.dtype is _INT32:
            kv_indices = a
    idx = i32(kv_indices[start:end], names[1])
    if start:
        ptr = ptr - np.int32(start)
    return ptr, idx.copy(), last


def kv_lengths(ptr, last, page_size):
    """Tokens of each request of a page table: page_size * (pages - 1) + last."""
    pages = np.diff(ptr).astype(np.int64)
    return np.where(pages > 0, (pages - 1) * page_size + last, 0)
