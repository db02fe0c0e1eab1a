"""The C library's serving ops (norms, gated activations, softmax, sampling,
top-k, RoPE from a cos/sin cache, with the QK RMSNorm before it) as the public modules (norm, activation,
sampling, topk, rope) call them:
their C signatures, per-row parameters given as a number or a tensor, the
(seed, offset) of a call's draws, and outputs allocated like the inputs.

numpy arrays and torch CPU tensors run on the CPU backend. A torch CUDA
tensor goes to the CUDA backend (its kernels give the CPU backend's results,
docs/SEMANTICS.md "Serving ops"); an op a backend lacks raises
BackendUnsupportedError (no silent copy to the CPU).
"""

import ctypes
from ctypes import POINTER, c_float, c_int, c_int32, c_uint64, c_void_p

import numpy as np

from . import _context
from . import _structs as S
from ._arrays import check_writable, device_of, empty, is_torch, name_of, view, zeros
from ._lib import check_op, lib

_TP = S.TensorP
_st = ctypes.c_int

_SIGNATURES = {
    "fi_rmsnorm": [_TP, _TP, c_float, _TP],
    "fi_gemma_rmsnorm": [_TP, _TP, c_float, _TP],
    "fi_fused_add_rmsnorm": [_TP, _TP, _TP, c_float],
    "fi_gemma_fused_add_rmsnorm": [_TP, _TP, _TP, c_float],
    "fi_layernorm": [_TP, _TP, _TP, c_float, _TP],
    "fi_rmsnorm_quant": [_TP, _TP, c_float, c_float, _TP],
    "fi_fused_add_rmsnorm_quant": [_TP, _TP, _TP, c_float, c_float, _TP],
    "fi_silu_and_mul": [_TP, _TP],
    "fi_gelu_and_mul": [_TP, _TP],
    "fi_gelu_tanh_and_mul": [_TP, _TP],
    "fi_softmax": [_TP, _TP, c_float, _TP],
    "fi_sampling_from_probs": [_TP, _TP, c_uint64, c_uint64, _TP, _TP],
    "fi_sampling_from_logits": [_TP, _TP, c_uint64, c_uint64, _TP, _TP],
    "fi_top_k_sampling_from_probs": [_TP, _TP, _TP, c_int32, c_uint64, c_uint64, _TP, _TP],
    "fi_top_p_sampling_from_probs": [_TP, _TP, _TP, c_float, c_uint64, c_uint64, _TP, _TP],
    "fi_min_p_sampling_from_probs": [_TP, _TP, _TP, c_float, c_uint64, c_uint64, _TP, _TP],
    "fi_top_k_top_p_sampling_from_probs": [
        _TP, _TP, _TP, c_int32, _TP, c_float, c_int, c_uint64, c_uint64, _TP, _TP
    ],
    "fi_top_k_top_p_sampling_from_logits": [
        _TP, _TP, _TP, c_int32, _TP, c_float, c_int, c_uint64, c_uint64, _TP, _TP
    ],
    "fi_top_k_renorm_probs": [_TP, _TP, c_int32, _TP],
    "fi_top_p_renorm_probs": [_TP, _TP, c_float, _TP],
    "fi_top_k_mask_logits": [_TP, _TP, c_int32, _TP],
    "fi_chain_speculative_sampling": [_TP, _TP, _TP, c_uint64, c_uint64, _TP, _TP, _TP],
    "fi_top_k": [_TP, c_int32, _TP, _TP, _TP, _TP],
    "fi_top_k_ragged": [_TP, _TP, c_int32, _TP, _TP],
    "fi_rope_apply_cos_sin_cache": [_TP, _TP, _TP, _TP, c_int32, _TP, _TP],
    "fi_qk_rmsnorm_rope": [_TP, _TP, _TP, _TP, _TP, c_float, _TP, c_int32, _TP, _TP],
    "fi_gemma_qk_rmsnorm_rope": [_TP, _TP, _TP, _TP, _TP, c_float, _TP, c_int32, _TP, _TP],
}

_fns = {}
for _name, _args in _SIGNATURES.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        raise ImportError(
            f"flashinfer_c: the loaded libflashinfer has no {_name}; it is older than this "
            "binding. Rebuild it with `make lib`."
        ) from None
    _f.restype = _st
    _f.argtypes = [c_void_p] + _args + [c_void_p]
    _fns[_name] = _f

FILTER_ORDER = {"top_k_first": 0, "joint": 1}


def call(name, device, *args):
    """Run C function `name` on the context of `device` (args: views via
    ref() or None, numbers), raising the library's error."""
    ctx = _context.get(device)
    status = _fns[name](ctx.handle, *args, ctx.stream())
    check_op(status, name[3:], device)


class Views:
    """fi_tensor views kept alive for the duration of one call."""

    def __init__(self):
        self._keep = []

    def __call__(self, x, name):
        if x is None:
            return None
        t = view(x, name)
        self._keep.append((t, x))
        return ctypes.byref(t)


def device_checked(first, others):
    device = device_of(first)
    _context.check_same_device(device, others)
    return device


def as_float32(x, like):
    """A number or an array as a contiguous float32 array of like's kind."""
    if is_torch(x):
        return x.detach().to(dtype=__import__("torch").float32).contiguous()
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32))


def as_int32(x):
    if is_torch(x):
        import torch

        return x.detach().to(dtype=torch.int32).contiguous()
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def param(value, kind, like):
    """(array or None, scalar) of a per-row parameter given as a number or
    a tensor [batch] (kind: "f32" or "i32")."""
    if is_torch(value) or isinstance(value, np.ndarray):
        arr = as_float32(value, like) if kind == "f32" else as_int32(value)
        if arr.ndim == 0:
            return None, (float(arr) if kind == "f32" else int(arr))
        return arr, 0
    if kind == "i32":
        return None, int(value)
    return None, float(value)


def scalar(value, name):
    """A float given as a number or a one-element tensor (read on the host)."""
    if is_torch(value) or isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        if flat.shape[0] != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor")
        return float(flat[0])
    return float(value)


_MASK64 = (1 << 64) - 1


def _seed_value(x, name):
    if is_torch(x) or isinstance(x, np.ndarray):
        flat = x.reshape(-1)
        if flat.shape[0] != 1:
            raise NotImplementedError(
                f"flashinfer_c: {name} as a tensor of {flat.shape[0]} values (one per row) is "
                "not supported; pass one value (an int or a one-element tensor)"
            )
        x = int(flat[0])
    return int(x) & _MASK64


def seed_offset(seed, offset, generator, like):
    """The (seed, offset) of a call: the caller's, else two draws from the
    generator (a torch.Generator, a numpy Generator, or None: torch's
    default generator for torch inputs, numpy's global one for numpy), so
    torch.manual_seed / np.random.seed make calls reproducible."""
    if seed is not None and offset is not None:
        return _seed_value(seed, "seed"), _seed_value(offset, "offset")
    if generator is not None and hasattr(generator, "integers"):
        s, o = generator.integers(0, 2**63 - 1, size=2, dtype=np.int64)
    elif generator is not None or is_torch(like):
        import torch

        kw = {"generator": generator} if generator is not None else {}
        s, o = torch.randint(0, 2**63 - 1, (2,), dtype=torch.int64, **kw).tolist()
    else:
        s, o = np.random.randint(0, 2**63 - 1, size=2, dtype=np.int64)
    return int(s) & _MASK64, int(o) & _MASK64


def check_no_nan(x, what):
    if is_torch(x):
        bad = bool(x.isnan().any())
    else:
        bad = bool(np.isnan(np.asarray(x, dtype=np.float32)).any())
    if bad:
        raise ValueError(f"Input {what} contains NaN.")


def new_out(like, shape, dtype=None):
    return empty(like, tuple(shape), dtype)


def new_zeros(like, shape, dtype):
    return zeros(like, tuple(shape), dtype)


def out_checked(out, name):
    check_writable(out, name)
    return out


def dtype_of(x):
    return name_of(x)
