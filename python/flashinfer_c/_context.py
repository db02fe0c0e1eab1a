"""Contexts: one per device, created on first use, and the stream to run on.

A tensor's device picks the context: numpy arrays and CPU torch tensors use
the process's CPU context; a torch CUDA tensor on device n will use the
CUDA context of device n and the caller's current torch stream on it. The
CUDA backend does not exist yet, so asking for it raises a RuntimeError
that says so (the library itself answers FI_STATUS_NO_DEVICE).

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

    def stream(self, x):
        """The stream argument for a call on array `x`: NULL on the CPU, else the
        caller's current torch stream on x's device, so our work orders with theirs."""
        if self.device[0] == "cpu":
            return None
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream

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
                "cannot run on CUDA here: the CUDA backend is not built into it yet, or no "
                "GPU and driver were found. Use CPU torch tensors or numpy arrays "
                "(tensor.cpu())."
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


def check_capture(device, graph_ready, what):
    """Refuse to record `what` into a CUDA graph unless the wrapper was built for it."""
    if device[0] != "cuda" or graph_ready:
        return
    import torch

    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{what} is being captured in a CUDA graph, but the wrapper was made without "
            "use_cuda_graph=True and its fixed buffers; a replay would read stale addresses"
        )


def describe(device=("cpu", 0)):
    """One line naming the backend, threads and SIMD level of a device's context."""
    return get(device).describe()
