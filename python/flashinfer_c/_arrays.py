"""torch tensors and numpy arrays as the C library sees them.

One place knows both array types: their devices, their dtypes, how to make
an fi_tensor view of one (data pointer, shape, strides in elements: a
non-contiguous view is passed as it is, never copied), and how to allocate
an output of the same kind on the same device. torch is optional; it is
only looked at when the caller has imported it.
"""

import ctypes
import struct
import sys

import numpy as np

from . import _structs as S


class DTypeError(TypeError, ValueError):
    """A tensor or argument has a dtype the call does not accept."""


def _torch():
    return sys.modules.get("torch")


_torch_tensor = None  # torch.Tensor, looked up once torch has been imported


def is_torch(x):
    global _torch_tensor
    if _torch_tensor is None:
        torch = _torch()
        if torch is None:
            return False
        _torch_tensor = torch.Tensor
    return isinstance(x, _torch_tensor)


def is_array(x):
    return isinstance(x, np.ndarray) or is_torch(x)


# ------------------------------------------------------------------ dtypes

# Canonical dtype names (torch's spelling) and their fi_dtype codes.
FI_CODE = {
    "float32": S.DTYPE_F32,
    "float16": S.DTYPE_F16,
    "bfloat16": S.DTYPE_BF16,
    "float8_e4m3fn": S.DTYPE_E4M3,
    "float8_e5m2": S.DTYPE_E5M2,
    "int32": S.DTYPE_I32,
    "uint8": S.DTYPE_U8,
    "bool": S.DTYPE_U8,  # one byte of 0/1: read as u8 where masks are taken
}

# fi_dtype -> the canonical name, for messages.
FI_NAME = {code: name for name, code in FI_CODE.items() if name != "bool"}

_ALIASES = {
    "float": "float32",
    "fp32": "float32",
    "f32": "float32",
    "half": "float16",
    "fp16": "float16",
    "f16": "float16",
    "bf16": "bfloat16",
    "e4m3": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "fp8_e5m2": "float8_e5m2",
    "int": "int32",
}


def dtype_name(dtype):
    """The canonical name of a dtype given as a string, torch.dtype or numpy dtype."""
    if isinstance(dtype, str):
        name = dtype.removeprefix("torch.")
    elif type(dtype).__module__ == "torch":
        name = str(dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise DTypeError(f"{dtype!r} is not a dtype") from None
    return _ALIASES.get(name, name)


def name_of(x):
    """The canonical dtype name of an array."""
    return dtype_name(x.dtype)


def fi_code(name, what):
    try:
        return FI_CODE[name]
    except KeyError:
        raise DTypeError(
            f"{what}: dtype {name} is not supported; use float16, bfloat16 or float32 "
            "(float8_e4m3fn / float8_e5m2 for a KV cache)"
        ) from None


def _numpy_dtype(name):
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        try:
            import ml_dtypes
        except ImportError:
            raise DTypeError(
                f"numpy has no {name}; install ml_dtypes to use it with numpy arrays"
            ) from None
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


def framework_dtype(name, like):
    """The dtype called `name` in the array library of `like`."""
    if is_torch(like):
        return getattr(_torch(), name)
    return _numpy_dtype(name)


# ----------------------------------------------------------------- devices


def device_of(x):
    """(type, index) of an array: ("cpu", 0) or ("cuda", n)."""
    if is_torch(x):
        d = x.device
        return (d.type, d.index or 0)
    if isinstance(x, np.ndarray):
        return ("cpu", 0)
    raise TypeError(f"expected a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def is_on(x, device):
    """Whether array x is on device (fast for the CPU, the common case)."""
    if device == ("cpu", 0):
        return isinstance(x, np.ndarray) or (is_torch(x) and x.is_cpu)
    return is_array(x) and device_of(x) == device


def device_str(device):
    kind, index = device
    return kind if kind == "cpu" else f"{kind}:{index}"


# ----------------------------------------------------------- data pointers


def _numpy_data_offset():
    """The byte offset of the data pointer inside an ndarray object, or None.

    x.ctypes.data costs about 2 us a call (it builds a helper object each
    time), more than the rest of a run() together. numpy's PyArrayObject puts
    the data pointer right after the object header; that layout is part of
    numpy's C ABI (compiled extensions read it through PyArray_DATA), so the
    pointer can be read from the object itself, in a few hundred ns. The
    offset is checked here against x.ctypes.data on arrays of several kinds;
    if any disagrees (another Python implementation or object layout),
    numpy_data() keeps x.ctypes.data."""
    offset = object.__basicsize__  # the PyObject header
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    probes = (base, base[1:, 2:], base.T, base[2], np.empty(0), np.zeros((), np.float16),
              np.zeros(3, np.int32)[1:])
    try:
        read = ctypes.c_void_p.from_address
        if all((read(id(a) + offset).value or 0) == a.ctypes.data for a in probes):
            return offset
    except Exception:  # a Python without ctypes addresses for objects
        pass
    return None


_DATA_OFFSET = _numpy_data_offset()

if _DATA_OFFSET is not None:
    _read_pointer = ctypes.c_void_p.from_address

    def numpy_data(x):
        """The address of ndarray x's first element (x.ctypes.data, faster)."""
        return _read_pointer(id(x) + _DATA_OFFSET).value or 0

    def numpy_data_or_0(x):
        """numpy_data(x), 0 for None."""
        return 0 if x is None else _read_pointer(id(x) + _DATA_OFFSET).value or 0

else:

    def numpy_data(x):
        """The address of ndarray x's first element."""
        return x.ctypes.data

    def numpy_data_or_0(x):
        """numpy_data(x), 0 for None."""
        return 0 if x is None else x.ctypes.data


def data_ptr(x):
    """The address of an array's first element: torch or numpy."""
    if isinstance(x, np.ndarray):
        return numpy_data(x)
    return x.data_ptr()


# ------------------------------------------------------------------- views


_codes_by_dtype = {}  # torch.dtype / numpy.dtype -> fi_dtype, filled as seen


def _code_of(dtype):
    code = _codes_by_dtype.get(dtype)
    if code is None:
        code = FI_CODE.get(dtype_name(dtype))
        if code is not None:
            _codes_by_dtype[dtype] = code
    return code


def fill_view(t, x, name):
    """Fill the fi_tensor `t` with a view of array `x` (no copy)."""
    if is_torch(x):
        t.data = x.data_ptr()
        shape = x.shape
        stride = x.stride()
    elif isinstance(x, np.ndarray):
        t.data = numpy_data(x)
        shape = x.shape
        item = x.itemsize
        stride = []
        for s in x.strides:
            if s % item:
                raise ValueError(
                    f"{name}: a stride of {s} bytes is not a multiple of the element "
                    f"size {item}; copy the array first (np.ascontiguousarray)"
                )
            stride.append(s // item)
    else:
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    ndim = len(shape)
    if ndim > S.MAX_DIMS:
        raise ValueError(f"{name} has {ndim} dimensions; at most {S.MAX_DIMS} are supported")
    code = _code_of(x.dtype)
    if code is None:
        raise DTypeError(
            f"{name}.dtype is {dtype_name(x.dtype)}; use float16, bfloat16 or float32 "
            "(float8_e4m3fn / float8_e5m2 for a KV cache, int32 for indices)"
        )
    t.dtype = code
    t.ndim = ndim
    t.shape[:ndim] = shape
    t.stride[:ndim] = stride
    return t


def view(x, name):
    return fill_view(S.Tensor(), x, name)


# fi_tensor as bytes: data, dtype, ndim, shape[6], stride[6] (checked against
# the ctypes layout at import). pack_view writes one in a single C call.
_TENSOR = struct.Struct("@Pii6q6q")
assert _TENSOR.size == S.ctypes_sizeof_tensor()
_ZEROS = (0,) * S.MAX_DIMS


def pack_view(buf, offset, x, name):
    """Write the fi_tensor view of array x at byte `offset` of the ctypes
    struct `buf` (the hot path of run(): one struct.pack_into, no ctypes
    attribute writes). Returns the fi_dtype code."""
    if type(x) is np.ndarray:
        shape = x.shape
        item = x.itemsize
        strides = x.strides
        if len(strides) == 3:  # the common case, without a generator
            a, b, c = strides
            if (a | b | c) % item:
                return fill_view(S.Tensor.from_buffer(buf, offset), x, name).dtype
            stride = (a // item, b // item, c // item)
        else:
            if any(st % item for st in strides):
                return fill_view(S.Tensor.from_buffer(buf, offset), x, name).dtype
            stride = tuple(st // item for st in strides)
        data = numpy_data(x)
    elif is_torch(x):
        data = x.data_ptr()
        shape = x.shape
        stride = x.stride()
    elif isinstance(x, np.ndarray):
        data = numpy_data(x)
        shape = x.shape
        item = x.itemsize
        stride = tuple(st // item for st in x.strides)
        if any(st % item for st in x.strides):
            return fill_view(S.Tensor.from_buffer(buf, offset), x, name).dtype
    else:
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    ndim = len(shape)
    if ndim > S.MAX_DIMS:
        raise ValueError(f"{name} has {ndim} dimensions; at most {S.MAX_DIMS} are supported")
    code = _codes_by_dtype.get(x.dtype)
    if code is None:
        code = _code_of(x.dtype)
        if code is None:
            raise DTypeError(
                f"{name}.dtype is {dtype_name(x.dtype)}; use float16, bfloat16 or float32 "
                "(float8_e4m3fn / float8_e5m2 for a KV cache, int32 for indices)"
            )
    pad = _ZEROS[ndim:]
    _TENSOR.pack_into(buf, offset, data, code, ndim, *shape, *pad, *stride, *pad)
    return code


# -------------------------------------------------------------- allocation


def _alloc(kind, like, shape, dtype):
    """torch.<kind> or np.<kind> ("empty", "zeros") of `like`'s kind and device."""
    if is_torch(like):
        torch = _torch()
        dt = like.dtype if dtype is None else getattr(torch, dtype)
        return getattr(torch, kind)(shape, dtype=dt, device=like.device)
    dt = like.dtype if dtype is None else _numpy_dtype(dtype)
    return getattr(np, kind)(shape, dtype=dt)


def empty(like, shape, dtype=None):
    """An uninitialised array of `like`'s kind and device (dtype: a name)."""
    return _alloc("empty", like, shape, dtype)


def zeros(like, shape, dtype=None):
    return _alloc("zeros", like, shape, dtype)


def from_numpy(a, like):
    """The numpy array `a` as an array of `like`'s kind and device."""
    if is_torch(like):
        t = _torch().from_numpy(np.ascontiguousarray(a))
        return t if like.device.type == "cpu" else t.to(like.device)
    return a


def check_writable(out, name):
    """An output the library writes into must be writable memory: numpy's
    writeable flag (a read-only mmap, np.broadcast_to, a frombuffer of bytes)
    is honoured here, since the C library cannot see it and would write (or
    crash on a read-only mapping)."""
    if isinstance(out, np.ndarray):
        if not out.flags.writeable:
            raise ValueError(
                f"{name} is a read-only numpy array (flags.writeable is False): pass a "
                "writable array (e.g. np.empty_like(...)) for the library to write into"
            )
        strides = out.strides
    elif is_torch(out):
        if out.requires_grad and out.is_leaf and _torch().is_grad_enabled():
            raise ValueError(f"{name} is a leaf tensor that requires grad: it cannot be written")
        strides = out.stride()
    else:
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(out).__name__}")
    for size, stride in zip(out.shape, strides):
        if size > 1 and stride == 0:
            raise ValueError(
                f"{name} has a zero stride (a broadcast or expanded view): its elements "
                "overlap, so the library would write several results into one place; pass "
                "an array of its own"
            )


def check_out(out, name, shape, dtype, device):
    """Check a caller-supplied output array: type, writability, shape, dtype
    name and device."""
    check_writable(out, name)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name}.shape is {tuple(out.shape)}, expected {tuple(shape)}")
    code = _codes_by_dtype.get(out.dtype)
    if code is None or code != FI_CODE.get(dtype):
        if name_of(out) != dtype:
            raise DTypeError(f"{name}.dtype is {name_of(out)}, expected {dtype}")
    if not is_on(out, device):
        raise ValueError(
            f"{name} is on {device_str(device_of(out))}, expected {device_str(device)}"
        )


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class IntRangeError(OverflowError, ValueError):
    """An integer argument outside the range of the C type that takes it."""


def c_int32(value, name, minimum=INT32_MIN):
    """An integer argument as the C library's int32_t takes it: an int (or numpy
    integer, not a bool or a float) in [minimum, INT32_MAX]. ctypes would
    silently keep the low 32 bits (2**32 + 4 heads would run as 4)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if hasattr(value, "__index__") and not isinstance(value, bool):
            value = value.__index__()
        else:
            raise TypeError(f"{name}={value!r}: expected an int")
    value = int(value)
    if not minimum <= value <= INT32_MAX:
        raise IntRangeError(
            f"{name}={value} is out of range: the C library takes an int32 in "
            f"[{minimum}, {INT32_MAX}]"
        )
    return value


def int32_index(x, name):
    """An index tensor as the kernels read it: int32 and contiguous, same device.

    FlashInfer converts index tensors with .int() itself, so other integer
    dtypes are converted here too (a copy) rather than refused.
    """
    if not is_array(x):
        raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")
    if is_torch(x):
        if x.dtype == _torch().int32:
            return x.contiguous()
        if x.is_floating_point() or x.is_complex() or x.dtype == _torch().bool:
            raise DTypeError(f"{name}.dtype is {x.dtype}; expected int32")
        return x.to(dtype=_torch().int32).contiguous()
    if x.dtype.kind not in "iu":
        raise DTypeError(f"{name}.dtype is {x.dtype}; expected int32")
    return np.ascontiguousarray(x, dtype=np.int32)
