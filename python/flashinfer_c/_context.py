"""Contexts: one per device, created on first use, and the stream to run on.

A tensor's device picks the context: numpy arrays and CPU torch tensors use
the process's CPU context; a torch CUDA tensor on device n uses the CUDA
context of ordinal n, and every call is queued on the caller's current torch
stream on that device (torch.cuda.current_stream(n)), so it orders with the
caller's own work. Where libflashinfer cannot run on CUDA (no driver, no
GPU), asking for a CUDA context raises a RuntimeError that says so.

Environment: FLASHINFER_C_NUM_THREADS (CPU worker threads, default all
cores), FLASHINFER_C_CPU_SIMD (auto, avx512, avx2, neon or generic).
"""

import ctypes
import os
import threading

from . import _structs as S
from ._arrays import device_of, device_str, is_on
from ._lib import check, fn


class Context:
    """An fi_context for one device; destroyed when the last user drops it."""

    def __init__(self, device):
        kind, index = device
        opts = S.ContextOptions()
        fn.context_options_init(ctypes.byref(opts))
        opts.device = S.DEVICE_CPU if kind == "cpu" else S.DEVICE_CUDA
        opts.device_id = index
        if kind == "cpu":
            opts.num_threads = int(os.environ.get("FLASHINFER_C_NUM_THREADS", "0"))
            simd = os.environ.get("FLASHINFER_C_CPU_SIMD")
            self._simd = simd.encode() if simd else None  # kept alive for the call
            opts.cpu_simd = self._simd
        handle = ctypes.c_void_p()
        check(fn.context_create(ctypes.byref(opts), ctypes.byref(handle)), "fi_context_create")
        self.handle = handle.value
        self.device = device
        self._destroy = fn.context_destroy  # still reachable at interpreter exit

    def describe(self):
        return fn.context_describe(self.handle).decode()

    def current_stream(self):
        """The caller's current torch stream on this device (None on the CPU)."""
        if self.device[0] == "cpu":
            return None
        import torch

        return torch.cuda.current_stream(self.device[1])

    def stream(self, x=None):
        """The stream argument of a C call: NULL on the CPU, else the handle
        (CUstream) of the caller's current torch stream on this device."""
        stream = self.current_stream()
        return None if stream is None else stream.cuda_stream

    def __del__(self):
        if getattr(self, "handle", None):
            self._destroy(self.handle)
            self.handle = None


_contexts = {}
_lock = threading.Lock()


def get(device):
    """The context of a device ("cpu", 0) / ("cuda", n), created on first use."""
    ctx = _contexts.get(device)
    if ctx is not None:
        return ctx
    kind = device[0]
    if kind == "cuda":
        if not fn.device_available(S.DEVICE_CUDA):
            raise RuntimeError(
                f"flashinfer_c: this tensor is on {device_str(device)}, but libflashinfer "
                "cannot run on CUDA here: its CUDA backend found no driver (libcuda.so.1) or "
                "no GPU. Use CPU torch tensors or numpy arrays (tensor.cpu())."
            )
    elif kind != "cpu":
        raise ValueError(
            f"flashinfer_c: tensors on {device_str(device)} are not supported; use the CPU "
            "(torch CPU tensors or numpy arrays)"
        )
    with _lock:
        ctx = _contexts.get(device)
        if ctx is None:
            ctx = _contexts[device] = Context(device)
    return ctx


def of(x):
    """The context for array `x`'s device."""
    return get(device_of(x))


def check_same_device(device, arrays):
    """Every named array is on `device`: [(name, array), ...] (None entries skipped)."""
    for name, x in arrays:
        if x is None or is_on(x, device):
            continue
        d = device_of(x)
        raise ValueError(
            f"{name} is on {device_str(d)} but this call runs on {device_str(device)}: "
            "put every tensor of a call on one device"
        )


_is_capturing = None  # torch's check, looked up once


def capture_query():
    """torch's function telling whether the current CUDA stream is being
    captured (found once; the wrappers' fast run keeps it)."""
    global _is_capturing
    if _is_capturing is None:
        import torch

        # torch.cuda.is_current_stream_capturing() is a Python wrapper of this
        _is_capturing = getattr(
            torch._C, "_cuda_isCurrentStreamCapturing", torch.cuda.is_current_stream_capturing
        )
    return _is_capturing


def capturing(device):
    """Whether the caller's current stream is being captured into a CUDA graph."""
    if device[0] != "cuda":
        return False
    return (_is_capturing or capture_query())()


_raw_current = None  # torch's accessor of the current stream's raw handle
_default_raw = {}  # device index -> the raw handle of its default stream


def _raw_accessor():
    """torch's cheap private accessor of the current stream's raw handle
    (False where torch has none), found once."""
    global _raw_current
    if _raw_current is None:
        import torch

        _raw_current = getattr(torch._C, "_cuda_getCurrentRawStream", False)
    return _raw_current


def raw_current_stream(index):
    """The raw CUstream of torch's current stream on CUDA device `index`, through
    torch's cheap private accessor (None where torch has none)."""
    get = _raw_current if _raw_current is not None else _raw_accessor()
    return get(index) if get else None


def raw_stream_query():
    """raw_current_stream as one function of the device index: torch's accessor
    itself where it has one (the wrappers' fast run keeps it)."""
    return _raw_accessor() or raw_current_stream


def raw_stream(stream, index):
    """The raw handle of a torch stream; None stands for device `index`'s
    default stream (where a C plan that has not run uploads)."""
    if stream is not None:
        return stream.cuda_stream
    raw = _default_raw.get(index)
    if raw is None:
        import torch

        raw = _default_raw[index] = torch.cuda.default_stream(index).cuda_stream
    return raw


def check_capture(device, graph_ready, what):
    """Refuse to record `what` into a CUDA graph unless the wrapper was built for it.
    Returns whether the current stream is capturing."""
    if not capturing(device):
        return False
    if not graph_ready:
        raise RuntimeError(
            f"{what} is being captured in a CUDA graph, but the wrapper was made without "
            "use_cuda_graph=True: a later plan() could move or resize its C plan, and a "
            "replay would then read stale memory. Make the wrapper with use_cuda_graph=True "
            "and its fixed indptr/indices/last_page_len buffers to capture it"
        )
    return True


def parse_device(device):
    """("cpu", 0) or ("cuda", n) from such a tuple, "cpu", "cuda", "cuda:n" or a
    torch.device; a bare "cuda" is torch's current CUDA device."""
    if isinstance(device, tuple):
        return device
    kind, _, index = str(device).partition(":")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: expected 'cpu' or 'cuda[:n]'")
    if kind == "cuda" and not index:
        try:
            import torch
        except ImportError:
            return (kind, 0)
        return (kind, torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return (kind, int(index) if index else 0)


def describe(device="cpu"):
    """One line naming a device's backend: threads and SIMD level on the CPU,
    the GPU and its architecture on CUDA ("cuda:0")."""
    return get(parse_device(device)).describe()
