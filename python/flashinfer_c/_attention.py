"""What every attention entry point shares: keyword options turned into a
plan Spec, KV caches turned into views, outputs allocated or checked, and
the run-time scales.
"""

import ctypes
import math
import weakref

import numpy as np

from . import _context
from . import _structs as S
from ._arrays import (
    DTypeError,
    c_int32,
    check_out,
    device_of,
    device_str,
    dtype_name,
    empty,
    fi_code,
    is_array,
    is_torch,
    name_of,
    view,
)
from ._lib import check, fn
from ._plan import Spec
from .utils import kv_layout_code, pos_encoding_code

_FLOAT_NAMES = ("float32", "float16", "bfloat16")


def float_dtype(dtype, what, allow_fp8=False):
    """Canonical name of a q/kv/o dtype option, checked."""
    name = dtype_name(dtype)
    allowed = _FLOAT_NAMES + (("float8_e4m3fn", "float8_e5m2") if allow_fp8 else ())
    if name not in allowed:
        raise DTypeError(f"{what}={name}: supported are {', '.join(allowed)}")
    return name


def make_spec(
    *,
    num_qo_heads,
    num_kv_heads,
    head_dim_qk,
    head_dim_vo,
    kv_format,
    page_size,
    kv_layout,
    q_dtype,
    kv_dtype,
    o_dtype,
    causal=False,
    custom_mask=False,
    window_left=-1,
    logits_soft_cap=None,
    sm_scale=None,
    pos_encoding_mode="NONE",
    rope_scale=None,
    rope_theta=None,
    disable_split_kv=False,
    fixed_split_size=0,
    variant=None,
):
    """A Spec with FlashInfer's defaults applied (None = the default)."""
    for name, value in (
        ("num_qo_heads", num_qo_heads),
        ("num_kv_heads", num_kv_heads),
        ("head_dim_qk", head_dim_qk),
        ("head_dim_vo", head_dim_vo),
        ("page_size", page_size),
    ):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r}: expected a positive int")
        c_int32(value, name, 1)
    if window_left is None:
        window_left = -1
    window_left = c_int32(window_left, "window_left")
    fixed_split_size = c_int32(fixed_split_size or 0, "fixed_split_size")
    mask = S.MASK_CUSTOM if custom_mask else (S.MASK_CAUSAL if causal else S.MASK_NONE)
    return Spec(
        num_qo_heads=int(num_qo_heads),
        num_kv_heads=int(num_kv_heads),
        head_dim_qk=int(head_dim_qk),
        head_dim_vo=int(head_dim_vo),
        kv_format=kv_format,
        page_size=int(page_size),
        kv_layout=kv_layout_code(kv_layout),
        q_dtype=fi_code(q_dtype, "q_data_type"),
        kv_dtype=fi_code(kv_dtype, "kv_data_type"),
        o_dtype=fi_code(o_dtype, "o_data_type"),
        mask_mode=mask,
        window_left=int(window_left),
        logits_soft_cap=float(logits_soft_cap or 0.0),
        sm_scale=float(sm_scale if sm_scale is not None else 1.0 / math.sqrt(head_dim_qk)),
        pos_encoding=pos_encoding_code(pos_encoding_mode),
        rope_scale=float(1.0 if rope_scale is None else rope_scale),
        rope_theta=float(1e4 if rope_theta is None else rope_theta),
        disable_split_kv=bool(disable_split_kv),
        fixed_split_size=int(fixed_split_size or 0),
        variant=variant,
    )


def plan_dtypes(q_data_type, kv_data_type, o_data_type):
    """(q, kv, o) dtype names of a wrapper's plan(): q defaults to float16,
    kv and o to q."""
    q_name = float_dtype(q_data_type if q_data_type is not None else "float16", "q_data_type")
    kv_name = float_dtype(kv_data_type or q_name, "kv_data_type", allow_fp8=True)
    o_name = float_dtype(o_data_type or q_name, "o_data_type")
    return q_name, kv_name, o_name


def single_kv_shape(q, k, v, kv_layout, q_ndim, q_hint):
    """The checks of a single-request call: (device, kv_len, num_kv_heads)."""
    check_rank(q, "q", q_ndim, q_hint)
    check_rank(k, "k", 3, f"({kv_layout} layout)")
    check_rank(v, "v", 3, f"({kv_layout} layout)")
    device = device_of(q)
    _context.check_same_device(device, [("k", k), ("v", v)])
    nhd = kv_layout_code(kv_layout) == S.KV_LAYOUT_NHD
    kv_len, num_kv_heads = (k.shape[0], k.shape[1]) if nhd else (k.shape[1], k.shape[0])
    return device, kv_len, num_kv_heads


def single_spec(k, v, num_qo_heads, num_kv_heads, head_dim, kv_layout, q_name, o_name, **options):
    """The Spec of a single-request call: ragged k/v of k's dtype."""
    return make_spec(
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        head_dim_qk=head_dim,
        head_dim_vo=v.shape[-1],
        kv_format=S.KV_FORMAT_RAGGED,
        page_size=1,
        kv_layout=kv_layout,
        q_dtype=q_name,
        kv_dtype=float_dtype(name_of(k), "k.dtype", allow_fp8=True),
        o_dtype=o_name,
        **options,
    )


def run_scale(spec, q_scale, k_scale):
    """The softmax scale of one run: FlashInfer multiplies q_scale and k_scale in."""
    scale = spec.sm_scale
    for s in (q_scale, k_scale):
        if s is not None:
            if is_torch(s) or isinstance(s, np.ndarray):
                raise NotImplementedError(
                    "per-head scale tensors are not supported yet; pass a float scale"
                )
            scale *= float(s)
    return scale


def apply_v_scale(out, v_scale):
    """FlashInfer scales the output by v_scale after the kernel; so do we."""
    if v_scale is not None:
        if is_torch(v_scale) or isinstance(v_scale, np.ndarray):
            raise NotImplementedError("per-head v_scale tensors are not supported yet")
        out *= float(v_scale)


# ------------------------------------------------------------- KV caches


def _unit_axis(t, axis):
    """Insert an axis of size 1 at `axis` of the fi_tensor view t (no copy):
    FlashInfer reads a cache without its page axis as pages of one token."""
    n = t.ndim
    shape, stride = list(t.shape[:n]), list(t.stride[:n])
    inner = stride[axis] * shape[axis] if axis < n else 1
    shape.insert(axis, 1)
    stride.insert(axis, inner)
    t.ndim = n + 1
    t.shape[: n + 1] = shape
    t.stride[: n + 1] = stride
    return t


def _page_axis(kv_layout):
    """Where a cache of single-token pages lacks its page_size axis (FlashInfer's
    _expand_4d / _expand_5d): NHD [pages, H, D] -> [pages, 1, H, D]; HND
    [pages, H, D] -> [pages, H, 1, D]."""
    return 1 if kv_layout_code(kv_layout) == S.KV_LAYOUT_NHD else 2


_VIEW_CACHE = {}  # id of the cache array (a pair: both ids) -> its KVViews
_VIEW_CACHE_MAX = 512


def _data_ptr(x):
    """A torch tensor's data pointer (set_() can move it); None for a numpy
    array, whose data never moves while the object lives."""
    return x.data_ptr() if is_torch(x) else None


class _Arrays(list):
    """[(name, array)] of a cache, remembering the devices it was checked on
    (verified_on: a KVViews entry's own set, which outlives the list)."""

    def __init__(self, items, verified_on=None):
        super().__init__(items)
        self.verified_on = set() if verified_on is None else verified_on


class KVViews:
    """The fi_tensor views of one KV cache object (or (k_cache, v_cache) pair),
    made once and reused while the arrays live with the same shape and data
    pointer. Weak references only: an entry never keeps a cache alive (an
    engine that drops its KV cache gets the memory back), so `arrays` is made
    from them at each use.

    kv_bytes: the K and V views as the bytes of fi_run_args' adjacent k and v
    fields; kv_code: their fi_dtype when both have one (else -1);
    verified_on: the devices the arrays were checked on."""

    __slots__ = ("refs", "ptrs", "shapes", "layout", "k", "v", "names", "verified_on",
                 "kv_bytes", "kv_code")

    def __init__(self, objs, layout, k, v, arrays):
        self.refs = tuple(weakref.ref(o) for o in objs)  # TypeError: not cacheable
        self.ptrs = tuple(map(_data_ptr, objs))
        self.shapes = tuple(tuple(o.shape) for o in objs)
        self.layout = layout
        self.k, self.v = k, v
        # arrays are (name, obj) for objs in order (paged_kv_views_uncached);
        # else the cache is not remembered (kv_views)
        if len(arrays) != len(objs) or any(a is not o for (_, a), o in zip(arrays, objs)):
            raise TypeError("arrays do not match the cache objects")
        self.names = tuple(name for name, _ in arrays)
        self.verified_on = set()
        self.kv_bytes = bytes(k) + bytes(v)
        self.kv_code = k.dtype if k.dtype == v.dtype else -1

    @property
    def arrays(self):
        """[(name, array)] of the live arrays (the caller holds them)."""
        return _Arrays([(n, r()) for n, r in zip(self.names, self.refs)], self.verified_on)

    def holds(self, x):
        """Whether these are still the views of cache array x (one object)."""
        return (
            self.refs[0]() is x
            and x.shape == self.shapes[0]
            and (self.ptrs[0] is None or x.data_ptr() == self.ptrs[0])
        )

    def holds_pair(self, k, v):
        """Whether these are still the views of the arrays (k, v)."""
        refs, ptrs, shapes = self.refs, self.ptrs, self.shapes
        return (
            refs[0]() is k
            and refs[1]() is v
            and k.shape == shapes[0]
            and v.shape == shapes[1]
            and (ptrs[0] is None or k.data_ptr() == ptrs[0])
            and (ptrs[1] is None or v.data_ptr() == ptrs[1])
        )


def kv_views(paged_kv_cache, kv_layout="NHD"):
    """The KVViews of a paged KV cache (see paged_kv_views), made at the first
    call with an object and remembered; None for an object that cannot be
    remembered (an array type without weak references)."""
    x = paged_kv_cache
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            return None
        k, v = x
        hit = _VIEW_CACHE.get((id(k), id(v)))
        if hit is not None and hit.layout == kv_layout and hit.holds_pair(k, v):
            return hit
        key, objs = (id(k), id(v)), (k, v)
    else:
        hit = _VIEW_CACHE.get(id(x))
        if hit is not None and hit.layout == kv_layout and hit.holds(x):
            return hit
        key, objs = id(x), (x,)
    k, v, arrays = paged_kv_views_uncached(x, kv_layout)
    try:
        entry = KVViews(objs, kv_layout, k, v, arrays)
    except TypeError:  # an array type without weak references
        return None
    if len(_VIEW_CACHE) >= _VIEW_CACHE_MAX:
        _VIEW_CACHE.clear()
    _VIEW_CACHE[key] = entry
    return entry


def paged_kv_entry(paged_kv_cache, kv_layout="NHD"):
    """(k view, v view, the arrays, the KVViews or None): paged_kv_views and
    the entry it came from."""
    entry = kv_views(paged_kv_cache, kv_layout)
    if entry is None:
        k, v, arrays = paged_kv_views_uncached(paged_kv_cache, kv_layout)
        return k, v, _Arrays(arrays), None
    return entry.k, entry.v, entry.arrays, entry


def paged_kv_views(paged_kv_cache, kv_layout="NHD"):
    """(k view, v view, the arrays) of a paged KV cache (paged_kv_views_uncached),
    remembered per cache object: an engine passes the same per-layer cache
    tensors at every step, so their views are made once, and reused while
    those arrays live with the same data pointer and shape (checked at each
    call; weak references, so nothing is kept alive)."""
    entry = kv_views(paged_kv_cache, kv_layout)
    if entry is None:
        k, v, arrays = paged_kv_views_uncached(paged_kv_cache, kv_layout)
        return k, v, _Arrays(arrays)
    return entry.k, entry.v, entry.arrays


def paged_kv_views_uncached(paged_kv_cache, kv_layout="NHD"):
    """(k view, v view, the arrays) of a (k_cache, v_cache) tuple of 4-D
    tensors or a 5-D [max_num_pages, 2, ...] tensor (split with
    fi_tensor_split_kv, no copy). As in FlashInfer, 3-D caches in a tuple
    and a 4-D [max_num_pages, 2, H, D] tensor are pages of one token (SGLang
    passes its [tokens, H, D] pools so, with page_size 1)."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(
                "paged_kv_cache as a tuple must be (k_cache, v_cache), got "
                f"{len(paged_kv_cache)} items"
            )
        k, v = paged_kv_cache
        kt, vt = view(k, "k_cache"), view(v, "v_cache")
        if kt.ndim == 3 and vt.ndim == 3:
            axis = _page_axis(kv_layout)
            _unit_axis(kt, axis)
            _unit_axis(vt, axis)
        return kt, vt, [("k_cache", k), ("v_cache", v)]
    x = paged_kv_cache
    ndim = len(x.shape)
    if ndim not in (4, 5) or x.shape[1] != 2:
        raise ValueError(
            "paged_kv_cache must be a (k_cache, v_cache) tuple of 4-D tensors or one 5-D "
            f"tensor [max_num_pages, 2, ...]; got shape {tuple(x.shape)}"
        )
    kv = view(x, "paged_kv_cache")
    if ndim == 4:
        _unit_axis(kv, _page_axis(kv_layout) + 1)
    k, v = S.Tensor(), S.Tensor()
    check(fn.tensor_split_kv(ctypes.byref(kv), ctypes.byref(k), ctypes.byref(v)), "paged_kv_cache")
    return k, v, [("paged_kv_cache", x)]


LOG2E = 1.0 / math.log(2.0)


def apply_sinks(out, lse, sinks, num_qo_heads, device):
    """Attention sinks (gpt-oss; FlashInfer's `sinks=`, AttentionSink variant):
    each query head h has a logit sinks[h] (natural units, like s * sm_scale)
    that joins the softmax denominator and carries no value. That is exactly
    a merge of the computed state (O, LSE) with the state (0, sinks[h] *
    log2 e): O *= 1 / (1 + 2^(sinks[h] * log2 e - LSE)), LSE = log2(2^LSE +
    2^(sinks[h] * log2 e)). Done in place on out [..., H, D] and lse [..., H]
    (f32), in float32, with the array library of `out` (torch ops on CUDA:
    capturable in a CUDA graph)."""
    if tuple(sinks.shape) != (num_qo_heads,):
        raise ValueError(
            f"sinks has shape {tuple(sinks.shape)}, expected ({num_qo_heads},): one "
            "logit per query head"
        )
    if is_torch(out):
        import torch

        if not is_torch(sinks):
            sinks = torch.as_tensor(np.asarray(sinks))
        s = sinks.to(device=out.device, dtype=torch.float32) * LOG2E
        weight = torch.sigmoid((lse - s) * math.log(2.0))  # 1 / (1 + 2^(s - lse))
        if out.dtype == torch.float32:
            out.mul_(weight.unsqueeze(-1))
        else:
            out.copy_(out.float() * weight.unsqueeze(-1))
        torch.logaddexp2(lse, s.expand_as(lse), out=lse)
        return
    _context.check_same_device(device, [("sinks", sinks)])
    s = np.asarray(sinks, dtype=np.float32) * np.float32(LOG2E)
    with np.errstate(over="ignore", invalid="ignore"):
        weight = 1.0 / (1.0 + np.exp2(s - lse))
    out[...] = (out.astype(np.float32) * weight[..., None]).astype(out.dtype)
    np.logaddexp2(lse, s, out=lse)


def kv_page_size(k_view, kv_layout):
    return int(k_view.shape[1] if kv_layout_code(kv_layout) == S.KV_LAYOUT_NHD else k_view.shape[2])


# ---------------------------------------------------------------- checks


def check_rank(x, name, ndim, layout_hint):
    if not is_array(x):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if len(x.shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout_hint}, got shape {tuple(x.shape)}")


def outputs(q, head_dim_vo, o_name, out, lse, return_lse, device):
    """out [*q.shape[:-1], head_dim_vo] and, when wanted, lse [*q.shape[:-1]] f32;
    given ones are checked (shape, dtype, device, writable) before any call."""
    shape = tuple(q.shape[:-1]) + (head_dim_vo,)
    if out is None:
        out = empty(q, shape, o_name)
    else:
        check_out(out, "out", shape, o_name, device)
    if return_lse:
        lse_shape = tuple(q.shape[:-1])
        if lse is None:
            lse = empty(q, lse_shape, "float32")
        else:
            check_out(lse, "lse", lse_shape, "float32", device)
    else:
        lse = None
    return out, lse


def workspace_device(buffer, what):
    """The device a wrapper runs on: its workspace buffer's (CPU when None)."""
    if buffer is None:
        return ("cpu", 0)
    device = device_of(buffer)
    if device[0] not in ("cpu", "cuda"):
        raise ValueError(f"{what}: workspace on {device_str(device)} is not supported")
    return device


def on_device(a, device):
    """A host numpy array placed where the kernels of `device` read it."""
    if device[0] == "cpu":
        return a
    import torch

    return torch.from_numpy(a).to(f"cuda:{device[1]}")


def context(device):
    return _context.get(device)


# ------------------------------------------------------------ custom masks


def batch_mask(custom_mask, packed_custom_mask, qo_lens, kv_lens, device):
    """The packed custom mask of a batch and its byte indptr (None: the C default,
    segments back to back, each byte-aligned).

    custom_mask: the flattened boolean [qo_len_i, kv_len_i] matrices of every
    request, as FlashInfer takes it. packed_custom_mask: the same already
    packed by segment_packbits(..., bitorder="little"); it wins when given.
    """
    from ._host import to_numpy
    from .quantization import segment_packbits

    if packed_custom_mask is not None:
        if name_of(packed_custom_mask) != "uint8":
            raise DTypeError(
                f"packed_custom_mask.dtype is {name_of(packed_custom_mask)}, expected uint8 "
                "(from packbits / segment_packbits with bitorder='little')"
            )
        _context.check_same_device(device, [("packed_custom_mask", packed_custom_mask)])
        return packed_custom_mask, None
    bits = to_numpy(custom_mask).reshape(-1)
    sizes = np.asarray(qo_lens, dtype=np.int64) * np.asarray(kv_lens, dtype=np.int64)
    bit_indptr = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=bit_indptr[1:])
    if bits.shape[0] != bit_indptr[-1]:
        raise ValueError(
            f"custom_mask has {bits.shape[0]} elements; the batch needs "
            f"sum(qo_len * kv_len) = {bit_indptr[-1]}"
        )
    if bit_indptr[-1] > np.iinfo(np.int32).max:
        raise ValueError("custom_mask has more than 2^31 elements")
    packed, byte_indptr = segment_packbits(bits, bit_indptr.astype(np.int32), bitorder="little")
    return on_device(packed, device), byte_indptr
