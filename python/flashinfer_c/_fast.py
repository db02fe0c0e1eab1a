"""The fast path of the batch wrappers' run(): a call like one the full path
(WrapperBase._run) has checked and run, replayed by rewriting the data
pointers of the C plan's argument block and calling the C entry point.

After a successful full run() of plain arrays the C plan keeps a FastRun
(Plan.memo), made there once: what that run checked (types, dtypes, shapes
and strides of q, out and lse; their device; on CUDA the current stream),
the ctypes aliases of the block's q/o/lse data pointers, and the C call
with its two arguments prebuilt. FastRun.run checks a call's arrays against
it (what the caller can change between calls: the objects, their shapes,
strides, dtypes, devices, writability, a cache's memory), writes the
pointers and calls C; it returns None, having changed nothing, for any call
it does not know, and the wrapper then takes the full path, which raises
what is wrong. Nothing is allocated but an out/lse left to the library.

What a FastRun was checked against and the call itself cannot change, the
memo is dropped when it does: Plan.update where the Spec or the C plan (its
handle) changes, the batch is empty or the update fails (an engine's next
step keeps it: same Spec, same C plan), a full run (it rewrites the argument
block), a run-time attribute set (RunOption). So run() asks only whether a
memo exists.

KV caches: a FastRun keeps the KVViews (_attention.kv_views) it has accepted
(their dtype the planned one, their layout the wrapper's, checked on its
device), by object id; each call still checks that the entry's object is the
one passed, with its shape and (torch) data pointer.
"""

import ctypes

import numpy as np

from . import _arrays, _context
from ._attention import _VIEW_CACHE
from ._lib import check
from ._plan import KV_BYTES

_KV_MAX = 512  # accepted caches a FastRun remembers (layers x K/V forms)


def _strides(x):
    return x.stride() if type(x) is not np.ndarray else x.strides


def _plain(x):
    """An exact numpy.ndarray or torch.Tensor (not a subclass, whose attributes
    the fast run could not trust)."""
    t = type(x)
    return t is np.ndarray or (t is _arrays._torch_tensor and t is not None)


def remember(plan, device, layout, q, out, lse, fresh_out, fresh_lse, kv_entry):
    """plan.memo after a successful full run() of plain arrays, else nothing.
    fresh_*: whether the run allocated out / lse itself (a later run without
    them allocates the same shapes, dtypes and strides). kv_entry: the
    KVViews whose views the run left in the argument block."""
    if not (_plain(q) and _plain(out) and (lse is None or _plain(lse))):
        return
    kind = NumpyFastRun if type(q) is np.ndarray else TorchFastRun
    plan.memo = kind(plan, device, layout, q, out, lse, fresh_out, fresh_lse, kv_entry)


if _arrays._DATA_OFFSET is not None:
    _read = ctypes.c_void_p.from_address
    _OFF = _arrays._DATA_OFFSET
else:  # numpy_data's fallback: the pointer through x.ctypes (see _arrays)
    _read = None
    _OFF = 0


class FastRun:
    __slots__ = (
        "spec", "handle", "want_lse", "kv", "kv_code", "layout", "device", "kv_cur", "args_bytes",
        "q_data", "o_data", "lse_data", "c_run", "c_handle", "c_args",
        "cuda", "index", "is_capturing", "raw_stream", "stream",
        "q_type", "q_dtype", "q_shape", "q_strides",
        "o_type", "o_dtype", "o_shape", "o_strides", "o_fresh", "o_like_q",
        "l_type", "l_dtype", "l_shape", "l_strides", "l_fresh",
    )

    def __init__(self, plan, device, layout, q, out, lse, fresh_out, fresh_lse, kv_entry):
        self.spec, self.handle = plan.spec, plan.handle
        self.want_lse = lse is not None
        self.kv = {}
        self.kv_code = plan.spec.kv_dtype
        self.layout = layout
        self.device = device
        if kv_entry is not None:
            refs = kv_entry.refs
            key = id(refs[0]()) if len(refs) == 1 else (id(refs[0]()), id(refs[1]()))
            self._accept_entry(kv_entry, key)
        # The block holds kv_entry's views now; the full run's own record of the
        # views it wrote is dropped, since this path rewrites them.
        self.kv_cur = kv_entry
        plan._last_k = plan._last_v = None
        self.args_bytes = plan._args_bytes
        self.q_data, self.o_data, self.lse_data = plan._q_data, plan._o_data, plan._lse_data
        self.c_run, self.c_handle, self.c_args = plan._c_run_call()
        self.cuda = device[0] == "cuda"
        self.index = device[1]
        if self.cuda:  # torch's functions for the current stream, found once
            self.is_capturing = _context.capture_query()
            self.raw_stream = _context.raw_stream_query()
        self.stream = plan._stream_handle
        self.q_type, self.q_dtype, self.q_shape = type(q), q.dtype, q.shape
        self.q_strides = _strides(q)
        self.o_type, self.o_dtype, self.o_shape = type(out), out.dtype, out.shape
        self.o_strides = _strides(out)
        self.o_fresh = fresh_out
        # A fresh out like q (its shape and dtype, and q's strides those of the
        # new contiguous out): torch.empty_like(q) makes the same tensor on q's
        # device (the wrapper's: checked) with less argument parsing. numpy's
        # np.empty(shape, dtype) is cheaper than its empty_like.
        self.o_like_q = None
        if (
            fresh_out and type(q) is not np.ndarray and self.o_shape == self.q_shape
            and self.o_dtype is self.q_dtype and self.o_strides == self.q_strides
        ):
            self.o_like_q = _arrays._torch().empty_like
        if lse is not None:
            self.l_type, self.l_dtype, self.l_shape = type(lse), lse.dtype, lse.shape
            self.l_strides = _strides(lse)
            self.l_fresh = fresh_lse

    # ---------------------------------------------------------- KV caches

    def _accept_entry(self, e, key):
        """Remember KVViews e if a run may use it: the planned dtype, the
        wrapper's layout, its arrays checked on the wrapper's device."""
        if e.kv_code != self.kv_code or e.layout != self.layout:
            return False
        if self.device not in e.verified_on:
            return False
        if len(self.kv) >= _KV_MAX:
            self.kv.clear()
        self.kv[key] = e
        return True

    def _accept(self, kv):
        """The KVViews of cache kv from the shared view cache, if they are still
        its views and a run may use them (else None: the full path)."""
        t = type(kv)
        if t is tuple or t is list:
            if len(kv) != 2:
                return None
            k, v = kv
            key = (id(k), id(v))
            e = _VIEW_CACHE.get(key)
            if e is None or not e.holds_pair(k, v):
                return None
        else:
            key = id(kv)
            e = _VIEW_CACHE.get(key)
            if e is None or not e.holds(kv):
                return None
        return e if self._accept_entry(e, key) else None

    def _kv_pair(self, kv):
        """The accepted KVViews of a (k_cache, v_cache) pair, checked to be its
        views still (run() checks a single cache tensor itself)."""
        if len(kv) != 2:
            return None
        k, v = kv
        e = self.kv.get((id(k), id(v)))
        if e is not None and e.holds_pair(k, v):
            return e
        return self._accept(kv)

    def _empty(self, shape, dtype):
        """An output as the full run() allocates it: like q, on the wrapper's device."""
        if self.q_type is np.ndarray:
            return np.empty(shape, dtype)
        device = f"cuda:{self.index}" if self.cuda else "cpu"
        return _arrays._torch().empty(shape, dtype=dtype, device=device)


class NumpyFastRun(FastRun):
    """The fast run of numpy q (out and lse numpy arrays as the full run's)."""

    __slots__ = ()

    def run(self, q, kv_cache, out, lse, return_lse):
        if return_lse:
            if not self.want_lse:
                return None
        elif self.want_lse:
            return None
        if (
            type(q) is not np.ndarray
            or q.dtype is not self.q_dtype
            or q.shape != self.q_shape
            or q.strides != self.q_strides
        ):
            return None
        t = type(kv_cache)
        if t is tuple or t is list:
            e = self._kv_pair(kv_cache)
        else:  # the accepted views of this cache, checked to be its views still
            e = self.kv.get(id(kv_cache))
            if (
                e is None
                or e.refs[0]() is not kv_cache
                or kv_cache.shape != e.shapes[0]
                or (e.ptrs[0] is not None and kv_cache.data_ptr() != e.ptrs[0])
            ):
                e = self._accept(kv_cache)
        if e is None:
            return None
        if out is None:
            if not self.o_fresh:
                return None
            out = np.empty(self.o_shape, self.o_dtype)
        elif (
            type(out) is not self.o_type
            or out.dtype is not self.o_dtype
            or out.shape != self.o_shape
            or out.strides != self.o_strides
            or not out.flags.writeable
        ):
            return None
        if return_lse:
            if lse is None:
                if not self.l_fresh:
                    return None
                lse = np.empty(self.l_shape, self.l_dtype)
            elif (
                type(lse) is not self.l_type
                or lse.dtype is not self.l_dtype
                or lse.shape != self.l_shape
                or lse.strides != self.l_strides
                or not lse.flags.writeable
            ):
                return None
            self.lse_data.value = _read(id(lse) + _OFF).value if _read else lse.ctypes.data
        if _read is not None:
            self.q_data.value = _read(id(q) + _OFF).value
            self.o_data.value = _read(id(out) + _OFF).value
        else:
            self.q_data.value = q.ctypes.data
            self.o_data.value = out.ctypes.data
        if e is not self.kv_cur:  # another cache's K/V views are in the block
            self.args_bytes[KV_BYTES] = e.kv_bytes
            self.kv_cur = e
        status = self.c_run(self.c_handle, self.c_args)
        if status:
            check(status, "run")
        return (out, lse) if return_lse else out


class TorchFastRun(FastRun):
    """The fast run of torch q (out and lse torch tensors as the full run's):
    on CUDA also the same current stream as the full run's, and no capture."""

    __slots__ = ()

    def run(self, q, kv_cache, out, lse, return_lse):
        if return_lse:
            if not self.want_lse:
                return None
        elif self.want_lse:
            return None
        if (
            type(q) is not self.q_type
            or q.dtype is not self.q_dtype
            or q.shape != self.q_shape
            or q.stride() != self.q_strides
        ):
            return None
        cuda = self.cuda
        if cuda:
            index = self.index
            if (
                not q.is_cuda
                or q.get_device() != index
                or self.is_capturing()
                or self.raw_stream(index) != self.stream
            ):
                return None
        elif not q.is_cpu:
            return None
        t = type(kv_cache)
        if t is tuple or t is list:
            e = self._kv_pair(kv_cache)
        else:  # the accepted views of this cache, checked to be its views still
            e = self.kv.get(id(kv_cache))
            if (
                e is None
                or e.refs[0]() is not kv_cache
                or kv_cache.shape != e.shapes[0]
                or (e.ptrs[0] is not None and kv_cache.data_ptr() != e.ptrs[0])
            ):
                e = self._accept(kv_cache)
        if e is None:
            return None
        if out is None:
            if not self.o_fresh:
                return None
            like = self.o_like_q
            out = like(q) if like is not None else self._empty(self.o_shape, self.o_dtype)
        elif (
            type(out) is not self.o_type
            or out.dtype is not self.o_dtype
            or out.shape != self.o_shape
            or out.stride() != self.o_strides
            or out.requires_grad
            or ((not out.is_cuda or out.get_device() != index) if cuda else not out.is_cpu)
        ):
            return None
        if return_lse:
            if lse is None:
                if not self.l_fresh:
                    return None
                lse = self._empty(self.l_shape, self.l_dtype)
            elif (
                type(lse) is not self.l_type
                or lse.dtype is not self.l_dtype
                or lse.shape != self.l_shape
                or lse.stride() != self.l_strides
                or lse.requires_grad
                or ((not lse.is_cuda or lse.get_device() != index) if cuda else not lse.is_cpu)
            ):
                return None
            self.lse_data.value = lse.data_ptr()
        self.q_data.value = q.data_ptr()
        self.o_data.value = out.data_ptr()
        if e is not self.kv_cur:  # another cache's K/V views are in the block
            self.args_bytes[KV_BYTES] = e.kv_bytes
            self.kv_cur = e
        status = self.c_run(self.c_handle, self.c_args)
        if status:
            check(status, "run")
        return (out, lse) if return_lse else out
