"""Rotary position embedding of q and k (LLaMA and LLaMA-3.1 styles), and
RoPE + FP8 quantize (+ append to a paged FP8 KV cache) in one pass.

q [nnz, num_qo_heads, head_dim], k [nnz, num_kv_heads, head_dim]. Positions
come from indptr + offsets (token t of request i is at offsets[i] + t -
indptr[i]) or from pos_ids [nnz]. The plain forms return new (q_rope,
k_rope); the _inplace forms overwrite q and k.
"""

import ctypes

from . import _context
from ._arrays import (
    c_int32,
    check_writable,
    device_of,
    empty,
    int32_index,
    is_torch,
    name_of,
    view,
)
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


def _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, inplace,
                  norm=None):
    """norm: None, or (q_weight, k_weight, eps, gemma) for fi_qk_rmsnorm_rope."""
    from . import _serving

    device = device_of(query)
    weights = [] if norm is None else [("q_weight", norm[0]), ("k_weight", norm[1])]
    _context.check_same_device(
        device,
        [("key", key), ("positions", positions), ("cos_sin_cache", cos_sin_cache)] + weights,
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
    head = (v(pos, "positions"), v(q3, "query"), v(k3, "key"))
    tail = (int(bool(is_neox)), v(q_out, "query_out"), v(k_out, "key_out"))
    if norm is None:
        _serving.call("fi_rope_apply_cos_sin_cache", device, *head,
                      v(cos_sin_cache, "cos_sin_cache"), *tail)
    else:
        q_weight, k_weight, eps, gemma = norm
        name = "fi_gemma_qk_rmsnorm_rope" if gemma else "fi_qk_rmsnorm_rope"
        _serving.call(name, device, *head, v(q_weight, "q_weight"), v(k_weight, "k_weight"),
                      float(eps), v(cos_sin_cache, "cos_sin_cache"), *tail)
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


# ------------------------------------------------- QK RMSNorm + RoPE from a cache


def fused_qk_rmsnorm_rope(positions, query, key, head_size, cos_sin_cache, q_weight, k_weight,
                          eps=1e-6, is_neox=True, gemma=False, inplace=False):
    """Per-head RMSNorm of query and key (the QK norm of Qwen3 / Gemma 3 /
    OLMo 2) fused with RoPE from a cos/sin cache: each head row x becomes
    x / sqrt(mean(x^2) + eps) * w (1 + w with gemma=True; q_weight,
    k_weight [head_size], one for every head), in float32, then turns as
    apply_rope_with_cos_sin_cache; one rounding at the store. query [nnz,
    num_q_heads * head_size] (or [nnz, heads, head_size]), key likewise;
    either may be a strided view into a packed qkv tensor. Returns
    (query_out, key_out), or None with inplace=True (query and key
    overwritten)."""
    return _rope_cos_sin(positions, query, key, head_size, cos_sin_cache, is_neox, inplace,
                         (q_weight, k_weight, eps, gemma))


def fused_qk_norm_rope(qkv, num_heads_q, num_heads_k, num_heads_v, head_dim, eps, q_weight,
                       k_weight, cos_sin_cache, is_neox, position_ids):
    """vLLM's packed form (its fused_qk_norm_rope custom op): qkv [nnz,
    (num_heads_q + num_heads_k + num_heads_v) * head_dim], q and k heads
    RMS-normalised and turned in place, v untouched. Returns None."""
    heads = [c_int32(h, n, 0) for h, n in ((num_heads_q, "num_heads_q"),
                                            (num_heads_k, "num_heads_k"),
                                            (num_heads_v, "num_heads_v"))]
    head_dim = c_int32(head_dim, "head_dim", 1)
    if qkv.ndim != 2 or qkv.shape[-1] != sum(heads) * head_dim:
        raise ValueError(
            f"qkv.shape is {tuple(qkv.shape)}; expected [nnz, {sum(heads) * head_dim}] "
            f"(({heads[0]} + {heads[1]} + {heads[2]}) heads x head_dim {head_dim})")
    check_writable(qkv, "qkv")
    # views, never copies: a reshape of a non-contiguous qkv would be one
    packed = qkv.view(qkv.shape[0], sum(heads), head_dim) if is_torch(qkv) else \
        qkv.reshape(qkv.shape[0], sum(heads), head_dim)
    if not _same_memory(packed, qkv):
        raise ValueError("qkv must be viewable as [nnz, heads, head_dim] (its last dim "
                         "contiguous)")
    q, k = packed[:, :heads[0]], packed[:, heads[0]:heads[0] + heads[1]]
    _rope_cos_sin(position_ids, q, k, head_dim, cos_sin_cache, is_neox, True,
                  (q_weight, k_weight, eps, False))


# ------------------------------------------------- RoPE + FP8 quantize (+ append)

_FP8 = ("float8_e4m3fn", "float8_e5m2")
_rq_fns = {}


def _rq_fn(name):
    """The C entry point `name` (fi_rope_quantize_fp8 or its append form)."""
    f = _rq_fns.get(name)
    if f is None:
        from ._lib import lib

        f = getattr(lib, name)
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p, ctypes.POINTER(S.RopeQuantArgs), ctypes.c_void_p]
        _rq_fns[name] = f
    return f


def _fp8_name(quantize_dtype, outs):
    """quantize_dtype, else the first given output's dtype, else float8_e4m3fn."""
    from ._arrays import dtype_name

    if quantize_dtype is not None:
        name = dtype_name(quantize_dtype)
    else:
        name = next((name_of(o) for o in outs if o is not None), "float8_e4m3fn")
    if name not in _FP8:
        raise ValueError(f"quantize_dtype is {name}; expected float8_e4m3fn or float8_e5m2")
    return name


def _width(x):
    return 0 if x is None else x.shape[-1]


def _rq_call(name, device, tensors, is_neox, quant_scale_q, quant_scale_kv, layout=0):
    """One call with `tensors` {field: array or None}: zero-width nope
    tensors go as absent, like FlashInfer's size-0 ones."""
    a = S.RopeQuantArgs()
    a.struct_size = ctypes.sizeof(S.RopeQuantArgs)
    a.is_neox = int(bool(is_neox))
    a.quant_scale_q = float(quant_scale_q)
    a.quant_scale_kv = float(quant_scale_kv)
    a.layout = layout
    keep = []
    for field, x in tensors.items():
        if x is None or (field in ("q_nope", "k_nope", "q_nope_out", "k_nope_out") and x.shape[-1] == 0):
            continue
        t = view(x, field)
        keep.append((t, x))
        setattr(a, field, ctypes.pointer(t))
    ctx = _context.get(device)
    status = _rq_fn(name)(ctx.handle, ctypes.byref(a), ctx.stream())
    check_op(status, name[3:], device)


def _fp8_outputs(rope, nope, rope_out, nope_out, fp8, names):
    """The FP8 outputs of a (rope, nope) pair: the caller's (checked
    writable) or new ones; a None nope gives a size-0 nope output."""
    if rope_out is None:
        rope_out = empty(rope, tuple(rope.shape), fp8)
    if nope_out is None:
        nope_out = empty(rope, tuple(rope.shape[:-1]) + (_width(nope),), fp8)
    check_writable(rope_out, names[0])
    if nope is not None:
        check_writable(nope_out, names[1])
    return rope_out, nope_out


def rope_quantize_fp8(
    q_rope,
    k_rope,
    q_nope,
    k_nope,
    cos_sin_cache,
    pos_ids,
    is_neox=True,
    quantize_dtype=None,
    quant_scale_q=1.0,
    quant_scale_kv=1.0,
    q_rope_out=None,
    k_rope_out=None,
    q_nope_out=None,
    k_nope_out=None,
    enable_pdl=False,
):
    """RoPE by rows pos_ids[t] of cos_sin_cache [max_pos, R] (float32, cos
    then sin halves), then FP8: q_rope_out = fp8(rope(q_rope) *
    quant_scale_q), q_nope_out = fp8(q_nope * quant_scale_q), and K likewise
    with quant_scale_kv. q_rope [nnz, H_q, R], q_nope [nnz, H_q, N] or None;
    k_rope [nnz, H_k, R] (MLA: [nnz, R]), k_nope likewise or None. Outputs
    may be given (e.g. slices of one [.., R + N] tensor). Returns
    (q_rope_out, k_rope_out, q_nope_out, k_nope_out)."""
    device = device_of(q_rope)
    _context.check_same_device(
        device,
        [("k_rope", k_rope), ("q_nope", q_nope), ("k_nope", k_nope),
         ("cos_sin_cache", cos_sin_cache), ("pos_ids", pos_ids)],
    )
    fp8 = _fp8_name(quantize_dtype, (q_rope_out, k_rope_out, q_nope_out, k_nope_out))
    q_rope_out, q_nope_out = _fp8_outputs(q_rope, q_nope, q_rope_out, q_nope_out, fp8,
                                      ("q_rope_out", "q_nope_out"))
    k_rope_out, k_nope_out = _fp8_outputs(k_rope, k_nope, k_rope_out, k_nope_out, fp8,
                                      ("k_rope_out", "k_nope_out"))
    pos = int32_index(pos_ids, "pos_ids")
    _rq_call(
        "fi_rope_quantize_fp8",
        device,
        {"q_rope": q_rope, "q_nope": q_nope, "k_rope": k_rope, "k_nope": k_nope,
         "cos_sin_cache": cos_sin_cache, "pos_ids": pos,
         "q_rope_out": q_rope_out, "q_nope_out": q_nope_out if q_nope is not None else None,
         "k_rope_out": k_rope_out, "k_nope_out": k_nope_out if k_nope is not None else None},
        is_neox, quant_scale_q, quant_scale_kv,
    )
    return q_rope_out, k_rope_out, q_nope_out, k_nope_out


def mla_rope_quantize_fp8(*args, **kwargs):
    """rope_quantize_fp8 under FlashInfer's MLA name (the same function)."""
    return rope_quantize_fp8(*args, **kwargs)


def rope_quantize_fp8_append_paged_kv_cache(
    q_rope,
    k_rope,
    q_nope,
    k_nope,
    v,
    cos_sin_cache,
    pos_ids,
    paged_kv_cache,
    kv_indices,
    kv_indptr,
    batch_indices,
    positions,
    is_neox=True,
    quantize_dtype=None,
    quant_scale_q=1.0,
    quant_scale_kv=1.0,
    page_size=16,
    kv_layout="NHD",
    q_rope_out=None,
    q_nope_out=None,
    enable_pdl=False,
):
    """rope_quantize_fp8 for Q, with K (and V) quantized straight into a
    paged FP8 cache: token t of request batch_indices[t] at position
    positions[t] goes to page kv_indices[kv_indptr[b] + p // page_size],
    slot p % page_size. GQA/MHA (k_rope 3-D): paged_kv_cache = (k_cache,
    v_cache) [pages, page_size, H_k, R + N] (NHD) or [pages, H_k,
    page_size, R + N] (HND), v [nnz, H_k, D_v]. MLA (k_rope 2-D, v None):
    (ckv_cache [pages, page_size, N], kpe_cache [pages, page_size, R]).
    Returns (q_rope_out, q_nope_out)."""
    device = device_of(q_rope)
    _context.check_same_device(
        device,
        [("k_rope", k_rope), ("q_nope", q_nope), ("k_nope", k_nope), ("v", v),
         ("cos_sin_cache", cos_sin_cache), ("pos_ids", pos_ids), ("kv_indices", kv_indices),
         ("kv_indptr", kv_indptr), ("batch_indices", batch_indices), ("positions", positions)],
    )
    mla = k_rope.ndim == 2
    if len(paged_kv_cache) != 2:
        raise ValueError("paged_kv_cache must be a tuple of 2 tensors")
    c0, c1 = paged_kv_cache
    if mla and v is not None:
        raise ValueError("MLA (a 2-D k_rope) takes no v: pass None")
    if not mla and v is None:
        raise ValueError("GQA/MHA (a 3-D k_rope) needs v; only MLA passes None")
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"kv_layout is {kv_layout!r}; expected 'NHD' or 'HND'")
    layout = 1 if kv_layout == "HND" and not mla else 0
    cache_ps = c0.shape[1] if mla or layout == 0 else c0.shape[2]
    if c0.ndim == (3 if mla else 4) and cache_ps != page_size:
        raise ValueError(f"page_size={page_size}, but the cache holds pages of {cache_ps}")
    fp8 = _fp8_name(quantize_dtype, (q_rope_out, q_nope_out))
    for cache, what in ((c0, "paged_kv_cache[0]"), (c1, "paged_kv_cache[1]")):
        if name_of(cache) != fp8:
            raise ValueError(f"{what}.dtype is {name_of(cache)}, expected {fp8} (quantize_dtype)")
        check_writable(cache, what)
    q_rope_out, q_nope_out = _fp8_outputs(q_rope, q_nope, q_rope_out, q_nope_out, fp8,
                                      ("q_rope_out", "q_nope_out"))
    idx = {n: int32_index(x, n) for n, x in (("pos_ids", pos_ids), ("kv_indices", kv_indices),
                                             ("kv_indptr", kv_indptr),
                                             ("batch_indices", batch_indices),
                                             ("positions", positions))}
    caches = {"ckv_cache": c0, "kpe_cache": c1} if mla else {"k_cache": c0, "v_cache": c1}
    _rq_call(
        "fi_rope_quantize_fp8_append_paged_kv_cache",
        device,
        {"q_rope": q_rope, "q_nope": q_nope, "k_rope": k_rope, "k_nope": k_nope, "v": v,
         "cos_sin_cache": cos_sin_cache, "q_rope_out": q_rope_out,
         "q_nope_out": q_nope_out if q_nope is not None else None, **caches, **idx},
        is_neox, quant_scale_q, quant_scale_kv, layout,
    )
    return q_rope_out, q_nope_out
