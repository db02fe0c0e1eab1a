"""Finding and loading libflashinfer, declaring its functions, and turning
its status codes into Python exceptions.

Search order for the shared library:
  1. $FLASHINFER_C_LIB (a path to the .so),
  2. the copy shipped inside this package (pip install puts it in _lib/),
  3. build/libflashinfer.so of the source tree this package sits in,
  4. an installed libflashinfer.so.0 (make install) on the loader's path.
"""

import ctypes
import ctypes.util
import os
from ctypes import POINTER, c_char_p, c_int32, c_size_t, c_void_p
from pathlib import Path

from . import _structs as S

# The ABI this binding was written against (FI_VERSION_MAJOR/MINOR).
ABI_MAJOR = 0
ABI_MINOR = 1


def _candidates():
    env = os.environ.get("FLASHINFER_C_LIB")
    if env:
        yield Path(env)
        return
    here = Path(__file__).resolve().parent
    yield here / "_lib" / "libflashinfer.so"
    for parent in here.parents:
        if (parent / "include" / "flashinfer.h").is_file():
            yield parent / "build" / "libflashinfer.so"
            break
    yield Path("libflashinfer.so.0")  # resolved by the dynamic loader
    found = ctypes.util.find_library("flashinfer")
    if found:
        yield Path(found)


def _load():
    tried = []
    for path in _candidates():
        name = str(path)
        if path.is_absolute() and not path.exists():
            tried.append(f"{name} (missing)")
            continue
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append(f"{name} ({e})")
    raise ImportError(
        "flashinfer_c: cannot load libflashinfer. Build it with `make lib` in the "
        "repository root, install the package with `pip install ./python`, or point "
        "$FLASHINFER_C_LIB at the .so. Tried: " + "; ".join(tried)
    )


lib, path = _load()

_TP = S.TensorP
_status = ctypes.c_int

# name: (restype, argtypes)
_SIGNATURES = {
    "fi_version_number": (c_int32, []),
    "fi_version_string": (c_char_p, []),
    "fi_status_string": (c_char_p, [ctypes.c_int]),
    "fi_last_error": (c_char_p, []),
    "fi_dtype_size": (c_size_t, [ctypes.c_int]),
    "fi_dtype_name": (c_char_p, [ctypes.c_int]),
    "fi_tensor_split_kv": (_status, [_TP, _TP, _TP]),
    "fi_context_options_init": (None, [POINTER(S.ContextOptions)]),
    "fi_context_create": (_status, [POINTER(S.ContextOptions), POINTER(c_void_p)]),
    "fi_context_destroy": (None, [c_void_p]),
    "fi_context_describe": (c_char_p, [c_void_p]),
    "fi_device_available": (c_int32, [ctypes.c_int]),
    "fi_attention_params_init": (None, [POINTER(S.AttentionParams)]),
    "fi_plan_config_init": (None, [POINTER(S.PlanConfig)]),
    "fi_plan_create": (
        _status,
        [c_void_p, POINTER(S.AttentionParams), POINTER(S.PlanConfig), POINTER(c_void_p)],
    ),
    "fi_plan_destroy": (None, [c_void_p]),
    "fi_variant_spec_init": (None, [POINTER(S.VariantSpec)]),
    "fi_variant_create": (_status, [POINTER(S.VariantSpec), POINTER(c_void_p)]),
    "fi_variant_destroy": (None, [c_void_p]),
    "fi_variant_builtin": (_status, [c_char_p, POINTER(c_void_p)]),
    "fi_variant_source": (c_size_t, [c_void_p, ctypes.c_int, c_char_p, c_size_t]),
    "fi_plan_update": (_status, [c_void_p, POINTER(S.Batch)]),
    "fi_plan_workspace_size": (c_size_t, [c_void_p]),
    "fi_plan_get_info": (_status, [c_void_p, POINTER(S.PlanInfo)]),
    "fi_plan_run": (_status, [c_void_p, POINTER(S.RunArgs)]),
    "fi_merge_state": (_status, [c_void_p, _TP, _TP, _TP, _TP, _TP, _TP, c_void_p]),
    "fi_merge_state_in_place": (_status, [c_void_p, _TP, _TP, _TP, _TP, _TP, c_void_p]),
    "fi_merge_states": (_status, [c_void_p, _TP, _TP, _TP, _TP, c_void_p]),
    "fi_append_paged_kv_cache": (
        _status,
        [c_void_p, _TP, _TP, _TP, _TP, _TP, _TP, ctypes.c_int, _TP, _TP, _TP, c_void_p],
    ),
    "fi_rope_params_init": (None, [POINTER(S.RopeParams)]),
    "fi_rope_apply": (
        _status,
        [c_void_p, POINTER(S.RopeParams), _TP, _TP, _TP, _TP, _TP, _TP, c_void_p],
    ),
    "fi_rope_apply_pos_ids": (
        _status,
        [c_void_p, POINTER(S.RopeParams), _TP, _TP, _TP, _TP, _TP, c_void_p],
    ),
    "fi_cascade_options_init": (None, [POINTER(S.CascadeOptions)]),
    "fi_cascade_workspace_size": (c_size_t, [POINTER(S.AttentionParams), c_int32, c_int32]),
    "fi_cascade_create": (
        _status,
        [
            c_void_p,
            POINTER(S.AttentionParams),
            c_int32,
            POINTER(S.PlanConfig),
            POINTER(S.CascadeOptions),
            POINTER(c_void_p),
        ],
    ),
    "fi_cascade_create_auto": (
        _status,
        [
            c_void_p,
            POINTER(S.AttentionParams),
            POINTER(S.PlanConfig),
            POINTER(S.CascadeOptions),
            POINTER(c_void_p),
        ],
    ),
    "fi_cascade_destroy": (None, [c_void_p]),
    "fi_cascade_update": (_status, [c_void_p, POINTER(S.Batch)]),
    "fi_cascade_update_batch": (_status, [c_void_p, POINTER(S.Batch)]),
    "fi_cascade_run": (_status, [c_void_p, POINTER(S.RunArgs)]),
    "fi_cascade_info_init": (None, [POINTER(S.CascadeInfo)]),
    "fi_cascade_get_info": (_status, [c_void_p, POINTER(S.CascadeInfo)]),
    "fi_bsr_config_init": (None, [POINTER(S.BsrConfig)]),
    "fi_bsr_create": (
        _status,
        [c_void_p, POINTER(S.AttentionParams), POINTER(S.BsrConfig), POINTER(c_void_p)],
    ),
    "fi_bsr_destroy": (None, [c_void_p]),
    "fi_bsr_update": (_status, [c_void_p, c_int32, c_int32, c_void_p, c_void_p, c_void_p]),
    "fi_bsr_update_variable": (
        _status,
        [c_void_p, c_int32, c_int32, c_int32, c_int32, c_void_p, c_void_p, c_void_p],
    ),
    "fi_bsr_run": (_status, [c_void_p, POINTER(S.RunArgs)]),
}


class _Functions:
    """The library's functions as attributes, with their C signatures set."""


fn = _Functions()
for _name, (_res, _args) in _SIGNATURES.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        raise ImportError(
            f"flashinfer_c: {path} has no symbol {_name}; it is older than this binding. "
            "Rebuild it with `make lib`."
        ) from None
    _f.restype = _res
    _f.argtypes = _args
    setattr(fn, _name[3:], _f)  # fn.plan_run, fn.merge_state ...

# The full run()'s prototype of fi_plan_run: both arguments plain addresses
# (ints), which ctypes converts faster than a byref() of a structure. A
# function object of its own (lib[name] makes a new one), so fn.plan_run
# keeps its typed prototype.
plan_run_addr = lib["fi_plan_run"]
plan_run_addr.restype = _status
plan_run_addr.argtypes = [c_void_p, c_void_p]
# plan()'s likewise: fi_plan_update on the plan's own fi_batch by address.
plan_update_addr = lib["fi_plan_update"]
plan_update_addr.restype = _status
plan_update_addr.argtypes = [c_void_p, c_void_p]
# The wrappers' fast run (_fast.FastRun): fi_plan_run and fi_cascade_run
# without argtypes, called only with a prebuilt c_void_p handle and a byref of
# the plan's own fi_run_args, which ctypes passes without converting anything
# (the cheapest call it has: a two-pointer libc call took 101 ns so, 153 ns
# through argtypes [c_void_p, c_void_p] with ints, on the development machine).
plan_run_raw = lib["fi_plan_run"]
plan_run_raw.restype = _status
plan_run_raw.argtypes = None
cascade_run_raw = lib["fi_cascade_run"]
cascade_run_raw.restype = _status
cascade_run_raw.argtypes = None


# ------------------------------------------------------------------ errors


class FlashInferCError(Exception):
    """An error reported by libflashinfer; `status` is its fi_status code."""

    status = S.STATUS_INTERNAL


class InvalidArgumentError(FlashInferCError, ValueError):
    status = S.STATUS_INVALID_ARGUMENT


class UnsupportedError(FlashInferCError, ValueError):
    status = S.STATUS_UNSUPPORTED


class OutOfMemoryError(FlashInferCError, MemoryError):
    status = S.STATUS_OUT_OF_MEMORY


class BoundExceededError(FlashInferCError, ValueError):
    status = S.STATUS_BOUND_EXCEEDED


class NotPlannedError(FlashInferCError, RuntimeError):
    status = S.STATUS_NOT_PLANNED


class NoDeviceError(FlashInferCError, RuntimeError):
    status = S.STATUS_NO_DEVICE


class BackendError(FlashInferCError, RuntimeError):
    status = S.STATUS_BACKEND_ERROR


class InternalError(FlashInferCError, RuntimeError):
    status = S.STATUS_INTERNAL


class CompileError(FlashInferCError, RuntimeError):
    """A variant's hook source did not compile; the message carries the log."""

    status = S.STATUS_COMPILE_ERROR


class BackendUnsupportedError(FlashInferCError, NotImplementedError):
    """An op that the backend of the tensors' device does not implement (yet):
    raised instead of a silent fall-back to another device."""

    status = S.STATUS_UNSUPPORTED


_ERRORS = {
    cls.status: cls
    for cls in (
        InvalidArgumentError,
        UnsupportedError,
        OutOfMemoryError,
        BoundExceededError,
        NotPlannedError,
        NoDeviceError,
        BackendError,
        InternalError,
        CompileError,
    )
}


def check(status, what):
    """Raise the exception for a non-zero fi_status, with fi_last_error()'s text."""
    if status == S.OK:
        return
    message = (fn.last_error() or b"").decode(errors="replace")
    name = (fn.status_string(status) or b"?").decode()
    cls = _ERRORS.get(status, InternalError)
    raise cls(f"{what}: {message or name} ({name})")


def check_op(status, what, device):
    """check() for a standalone op: on a CUDA device, FI_STATUS_UNSUPPORTED (the
    CUDA backend lacks the op) becomes a BackendUnsupportedError (a RuntimeError)."""
    if status == S.STATUS_UNSUPPORTED and device[0] == "cuda":
        message = (fn.last_error() or b"").decode(errors="replace")
        raise BackendUnsupportedError(
            f"{what} on cuda:{device[1]}: {message} (unsupported). The CUDA backend of "
            f"{path} does not implement this op yet; flashinfer_c does not fall back to the "
            "CPU on its own: move the tensors with .cpu() to use the CPU backend"
        )
    check(status, what)


def cuda_available():
    """Whether libflashinfer's CUDA backend can run here (a driver and a GPU found)."""
    return bool(fn.device_available(S.DEVICE_CUDA))


# --------------------------------------------------- version and ABI check


def _check_abi():
    number = fn.version_number()
    major, minor = number // 1000000, (number // 1000) % 1000
    if major != ABI_MAJOR or minor < ABI_MINOR:
        raise ImportError(
            f"flashinfer_c: {path} is version {fn.version_string().decode()}, "
            f"this binding needs {ABI_MAJOR}.{ABI_MINOR}.x"
        )
    # Each *_init writes the struct size the library was compiled with.
    for init, struct in (
        (fn.context_options_init, S.ContextOptions),
        (fn.attention_params_init, S.AttentionParams),
        (fn.plan_config_init, S.PlanConfig),
        (fn.rope_params_init, S.RopeParams),
        (fn.variant_spec_init, S.VariantSpec),
        (fn.cascade_options_init, S.CascadeOptions),
        (fn.cascade_info_init, S.CascadeInfo),
        (fn.bsr_config_init, S.BsrConfig),
    ):
        value = struct()
        init(ctypes.byref(value))
        if value.struct_size != ctypes.sizeof(struct):
            raise ImportError(
                f"flashinfer_c: {struct.__name__} is {ctypes.sizeof(struct)} bytes here but "
                f"{value.struct_size} in {path}: the binding and the header disagree"
            )


_check_abi()
version = fn.version_string().decode()
