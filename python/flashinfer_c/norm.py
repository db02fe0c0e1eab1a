"""RMSNorm as FlashInfer's flashinfer.norm computes it, on numpy arrays and
torch tensors: the arithmetic in float32, the result in the input's dtype.

    rmsnorm(x, w)                  x / sqrt(mean(x^2) + eps) * w
    gemma_rmsnorm(x, w)            x / sqrt(mean(x^2) + eps) * (1 + w)
    fused_add_rmsnorm(x, r, w)     r += x; x = rmsnorm(r, w)         (in place)
    gemma_fused_add_rmsnorm(x, r, w)

    rmsnorm_quant(out, x, w, scale)          out = fp8(rmsnorm(x, w) / scale)
    fused_add_rmsnorm_quant(out, x, r, w, scale)
    layernorm(x, gamma, beta)

numpy arrays and torch CPU tensors run the C library's CPU kernels, torch
CUDA tensors its CUDA kernels (f32 arithmetic, each row read and written
once, on the tensors' device and torch's current stream); torch tensors on
another device keep torch's own expression for the four RMSNorms (the FP8
forms and layernorm raise there).
"""

import numpy as np

from ._arrays import is_on, is_torch
from . import _serving as _C


def _native(x):
    """Arrays the C library's backends take: host arrays (numpy, torch CPU)
    and torch CUDA tensors; torch tensors elsewhere keep the torch expression."""
    return is_on(x, ("cpu", 0)) or (is_torch(x) and x.is_cuda)


def _c_norm(name, input, *rest):
    """C op `name` on input's device: rest is (value, name) pairs, the
    arrays named, plain numbers with name None."""
    device = _C.device_checked(input, [(n, a) for a, n in rest if n])
    v = _C.Views()
    args = [v(a, n) if n else a for a, n in rest]
    _C.call(name, device, v(input, "input"), *args)


def _rms(x, weight, eps, gemma):
    if is_torch(x):
        import torch

        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        w = weight.float()
        return y * (1.0 + w if gemma else w)
    xf = np.asarray(x, dtype=np.float32)
    y = xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + np.float32(eps))
    w = np.asarray(weight, dtype=np.float32)
    return y * (1.0 + w if gemma else w)


def _store(dst, value):
    if is_torch(dst):
        dst.copy_(value)
    else:
        dst[...] = value.astype(dst.dtype)
    return dst


def _new(like, value):
    if is_torch(like):
        return value.to(like.dtype)
    return value.astype(like.dtype)


def rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    """RMSNorm of input [..., hidden] with weight [hidden]."""
    if _native(input):
        out = _C.new_out(input, input.shape) if out is None else _C.out_checked(out, "out")
        _c_norm("fi_rmsnorm", input, (weight, "weight"), (float(eps), None), (out, "out"))
        return out
    y = _rms(input, weight, eps, False)
    return _store(out, y) if out is not None else _new(input, y)


def gemma_rmsnorm(input, weight, eps=1e-6, out=None, enable_pdl=None):
    """Gemma's RMSNorm: the weight is applied as (1 + weight)."""
    if _native(input):
        out = _C.new_out(input, input.shape) if out is None else _C.out_checked(out, "out")
        _c_norm("fi_gemma_rmsnorm", input, (weight, "weight"), (float(eps), None), (out, "out"))
        return out
    y = _rms(input, weight, eps, True)
    return _store(out, y) if out is not None else _new(input, y)


def _fused_add(input, residual, weight, eps, gemma):
    if _native(input):
        _C.out_checked(input, "input")
        _C.out_checked(residual, "residual")
        name = "fi_gemma_fused_add_rmsnorm" if gemma else "fi_fused_add_rmsnorm"
        _c_norm(name, input, (residual, "residual"), (weight, "weight"), (float(eps), None))
        return
    if is_torch(residual):
        residual.add_(input.to(residual.dtype))
    else:
        residual[...] = (
            np.asarray(residual, np.float32) + np.asarray(input, np.float32)
        ).astype(residual.dtype)
    _store(input, _rms(residual, weight, eps, gemma))


def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """residual += input, then input = rmsnorm(residual, weight), both in place."""
    _fused_add(input, residual, weight, eps, False)


def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
    """residual += input, then input = gemma_rmsnorm(residual, weight), in place."""
    _fused_add(input, residual, weight, eps, True)


def rmsnorm_quant(out, input, weight, scale, eps=1e-6, enable_pdl=None):
    """out (float8_e4m3fn / float8_e5m2) = rmsnorm(input, weight) / scale,
    saturated; scale a number or a one-element tensor."""
    _C.out_checked(out, "out")
    _c_norm("fi_rmsnorm_quant", input, (weight, "weight"), (_C.scalar(scale, "scale"), None),
            (float(eps), None), (out, "out"))
    return out


def fused_add_rmsnorm_quant(out, input, residual, weight, scale, eps=1e-6, enable_pdl=None):
    """residual += input (in place), then out = the FP8 RMSNorm of it / scale."""
    _C.out_checked(out, "out")
    _C.out_checked(residual, "residual")
    _c_norm("fi_fused_add_rmsnorm_quant", input, (residual, "residual"), (weight, "weight"),
            (_C.scalar(scale, "scale"), None), (float(eps), None), (out, "out"))


def layernorm(input, gemma, beta, eps=1e-6):
    """LayerNorm of input [..., hidden]: (x - mean) / sqrt(var + eps) * gemma + beta."""
    out = _C.new_out(input, input.shape)
    _c_norm("fi_layernorm", input, (gemma, "gemma"), (beta, "beta"), (float(eps), None),
            (out, "out"))
    return out
