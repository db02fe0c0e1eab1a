"""Rotary position embedding of q and k (LLaMA and LLaMA-3.1 styles).

q [nnz, num_qo_heads, head_dim], k [nnz, num_kv_heads, head_dim]. Positions
come from indptr + offsets (token t of request i is at offsets[i] + t -
indptr[i]) or from pos_ids [nnz]. The plain forms return new (q_rope,
k_rope); the _inplace forms overwrite q and k.
"""

import ctypes

from . import _context
from ._arrays import c_int32, check_writable, device_of, empty, int32_index, view
from ._lib import check_op, fn
from . import _structs as S


def _params(rotary_dim, interleave, rope_scale, rope_theta, llama31=None):
    p = S.RopeParams()
    fn.rope_params_init(ctypes.byref(p))
    p.rotary_dim = 0 if rotary_dim is None else c_int32(rotary_dim, "rotary_dim", 0)
    p.interleave = int(bool(interleave))
    p.rope_scale = float(rope_scale)
    p.rope_theta = float(rope_theta)
    if llama31 is not None:
        low, high, old_context_len = llama31
        p.llama31 = 1
        p.low_freq_factor = float(low)
        p.high_freq_factor = float(high)
        p.old_context_len = float(old_context_len)
    return p


def _rope(q, k, params, inplace, pos_ids=None, indptr=None, offsets=None):
    device = device_of(q)
    _context.check_same_device(
        device, [("k", k), ("pos_ids", pos_ids), ("indptr", indptr), ("offsets", offsets)]
    )
    ctx = _context.get(device)
    if inplace:
        check_writable(q, "q")
        check_writable(k, "k")
        q_out, k_out = q, k
    else:
        q_out, k_out = empty(q, tuple(q.shape)), empty(k, tuple(k.shape))
    qv, kv = view(q, "q"), view(k, "k")
    qo, ko = (qv, kv) if inplace else (view(q_out, "q_rope"), view(k_out, "k_rope"))
    r = ctypes.byref
    # Converted index arrays stay referenced until the call returns.
    if pos_ids is not None:
        pos_ids = int32_index(pos_ids, "pos_ids")
        pos = view(pos_ids, "pos_ids")
        status = fn.rope_apply_pos_ids(
            ctx.handle, r(params), r(qv), r(kv), r(qo), r(ko), r(pos), ctx.stream()
        )
    else:
        indptr, offsets = int32_index(indptr, "indptr"), int32_index(offsets, "offsets")
        ptr = view(indptr, "indptr")
        off = view(offsets, "offsets")
        status = fn.rope_apply(
            ctx.handle, r(params), r(qv), r(kv), r(qo), r(ko), r(ptr), r(off), ctx.stream()
        )
    check_op(status, "rope", ctx.device)
    return None if inplace else (q_out, k_out)


def apply_rope(
    q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4
):
    params = _params(rotary_dim, interleave, rope_scale, rope_theta)
    return _rope(q, k, params, False, indptr=indptr, offsets=offsets)


def apply_rope_inplace(
    q, k, indptr, offsets, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4
):
    params = _params(rotary_dim, interleave, rope_scale, rope_theta)
    _rope(q, k, params, True, indptr=indptr, offsets=offsets)


def apply_rope_pos_ids(
    q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4
):
    params = _params(rotary_dim, interleave, rope_scale, rope_theta)
    return _rope(q, k, params, False, pos_ids=pos_ids)


def apply_rope_pos_ids_inplace(
    q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4
):
    params = _params(rotary_dim, interleave, rope_scale, rope_theta)
    _rope(q, k, params, True, pos_ids=pos_ids)


def apply_llama31_rope(
    q,
    k,
    indptr,
    offsets,
    rotary_dim=None,
    interleave=False,
    rope_scale=8,
    rope_theta=5e5,
    low_freq_factor=1,
    high_freq_factor=4,
    old_context_len=8192,
):
    factors = (low_freq_factor, high_freq_factor, old_context_len)
    params = _params(rotary_dim, interleave, rope_scale, rope_theta, factors)
    return _rope(q, k, params, False, indptr=indptr, offsets=offsets)


def apply_llama31_rope_inplace(
    q,
    k,
    indptr,
    offsets,
    rotary_dim=None,
    interleave=False,
    rope_scale=8,
    rope_theta=5e5,
    low_freq_factor=1,
    high_freq_factor=4,
    old_context_len=8192,
):
    factors = (low_freq_factor, high_freq_factor, old_context_len)
    params = _params(rotary_dim, interleave, rope_scale, rope_theta, factors)
    _rope(q, k, params, True, indptr=indptr, offsets=offsets)


def apply_llama31_rope_pos_ids(
    q,
    k,
    pos_ids,
    rotary_dim=None,
    interleave=False,
    rope_scale=8,
    rope_theta=5e5,
    low_freq_factor=1,
    high_freq_factor=4,
    old_context_len=8192,
):
    factors = (low_freq_factor, high_freq_factor, old_context_len)
    params = _params(rotary_dim, interleave, rope_scale, rope_theta, factors)
    return _rope(q, k, params, False, pos_ids=pos_ids)


def apply_llama31_rope_pos_ids_inplace(
    q,
    k,
    pos_ids,
    rotary_dim=None,
    interleave=False,
    rope_scale=8,
    rope_theta=5e5,
    low_freq_factor=1,
    high_freq_factor=4,
    old_context_len=8192,
):
    factors = (low_freq_factor, high_freq_factor, old_context_len)
    params = _params(rotary_dim, interleave, rope_scale, rope_theta, factors)
    _rope(q, k, params, True, pos_ids=pos_ids)
