"""Gated activations as FlashInfer's flashinfer.activation computes them, on
numpy arrays and torch tensors: input [..., 2d] -> act(input[..., :d]) *
input[..., d:], in float32, the result in the input's dtype (written into
`out` when given).

numpy arrays and torch CPU tensors run the C library's CPU kernels, torch
CUDA tensors its CUDA kernels (on the tensors' device and torch's current
stream); torch tensors on another device keep torch's expression.
"""

import math

import numpy as np

from ._arrays import is_on, is_torch
from . import _serving as _C

_C_NAMES = {"silu": "fi_silu_and_mul", "gelu": "fi_gelu_and_mul", "gelu_tanh": "fi_gelu_tanh_and_mul"}


def _gelu_np(x, approximate):
    if approximate:
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x**3)))
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf, otypes=[np.float64])(x / math.sqrt(2.0)))


def _gated(input, out, kind):
    d = input.shape[-1] // 2
    if input.shape[-1] % 2:
        raise ValueError(f"input's last dimension {input.shape[-1]} must be even (gate, up)")
    if is_on(input, ("cpu", 0)) or (is_torch(input) and input.is_cuda):  # the C library's kernels
        shape = tuple(input.shape[:-1]) + (d,)
        out = _C.new_out(input, shape) if out is None else _C.out_checked(out, "out")
        device = _C.device_checked(input, [("out", out)])
        v = _C.Views()
        _C.call(_C_NAMES[kind], device, v(input, "input"), v(out, "out"))
        return out
    if is_torch(input):
        import torch.nn.functional as F

        a, b = input[..., :d].float(), input[..., d:].float()
        if kind == "silu":
            y = F.silu(a) * b
        else:
            y = F.gelu(a, approximate="tanh" if kind == "gelu_tanh" else "none") * b
        if out is not None:
            out.copy_(y)
            return out
        return y.to(input.dtype)
    x = np.asarray(input, dtype=np.float64)
    a, b = x[..., :d], x[..., d:]
    if kind == "silu":
        y = a / (1.0 + np.exp(-a)) * b
    else:
        y = _gelu_np(a, kind == "gelu_tanh") * b
    if out is not None:
        out[...] = y.astype(out.dtype)
        return out
    return y.astype(input.dtype)


def silu_and_mul(input, out=None, enable_pdl=None):
    return _gated(input, out, "silu")


def gelu_and_mul(input, out=None, enable_pdl=None):
    return _gated(input, out, "gelu")


def gelu_tanh_and_mul(input, out=None, enable_pdl=None):
    return _gated(input, out, "gelu_tanh")
