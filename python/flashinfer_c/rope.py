"""Rotary position embedding of q and k (LLaMA and LLaMA-3.1 styles).

q [nnz, num_qo_heads, head_dim], k [nnz, num_kv_heads, head_dim]. Positions
come from indptr + offsets (token t of request i is at offsets[i] + t -
indptr[i]) or from pos_ids [nnz]. The plain forms return new (q_rope,
k_rope); the _inplace forms overwrite q and k.
"""

import ctypes

from . import _context
from ._arrays import c_int32, check_writable, device_of, empty, int32_index, is_torch, view
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


def _outputs(q, k, inplace, names):
    """q and k themselves (checked writable) in place, else new arrays like them."""
    if inplace:
        check_writable(q, names[0])
        check_writable(k, names[1])
        return q, k
    return empty(q, tuple(q.shape)), empty(k, tuple(k.shape))


def _rope(q, k, params, inplace, pos_ids=None, indptr=None, offsets=None):
    device = device_of(q)
    _context.check_same_device(
        device, [("k", k), ("pos_ids", pos_ids), ("indptr", indptr), ("offsets", offsets)]
    )
    ctx = _context.get(device)
    q_out, k_out = _outputs(q, k, inplace, ("q", "k"))
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


def _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, inplace):
    from . import _serving

    device = device_of(query)
    _context.check_same_device(
        device, [("key", key), ("positions", positions), ("cos_sin_cache", cos_sin_cache)]
    )
    head_size = c_int32(head_size, "head_size", 1)
    nnz = query.shape[0]
    q3 = query.reshape(nnz, -1, head_size)
    k3 = key.reshape(nnz, -1, head_size)
    if inplace:
        check_writable(query, "query")
        check_writable(key, "key")
    q_out, k_out = _outputs(q3, k3, inplace, ("query", "key"))
    pos = int32_index(positions, "positions")
    v = _serving.Views()
    _serving.call("fi_rope_apply_cos_sin_cache", device, v(pos, "positions"), v(q3, "query"),
                  v(k3, "key"), v(cos_sin_cache, "cos_sin_cache"), int(bool(is_neox)),
                  v(q_out, "query_out"), v(k_out, "key_out"))
    if inplace:
        # a reshape of a non-contiguous array may have been a copy: write back
        for dst, src in ((query, q3), (key, k3)):
            if not _same_memory(src, dst):
                dst[...] = src.reshape(dst.shape)
        return None
    return q_out.reshape(query.shape), k_out.reshape(key.shape)


def _same_memory(a, b):
    if is_torch(a):
        return a.data_ptr() == b.data_ptr()
    import numpy as np

    return np.shares_memory(a, b)


def apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    """RoPE by rows positions[t] of cos_sin_cache [max_pos, rotary_dim] (cos
    then sin halves, float32), vLLM's form: query [nnz, num_q_heads *
    head_size] (or [nnz, heads, head_size]), key likewise; is_neox: halves,
    else interleaved pairs. Returns (query_out, key_out)."""
    return _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, False)


def apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                          is_neox=True):
    """apply_rope_with_cos_sin_cache writing query and key in place."""
    _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, True)
