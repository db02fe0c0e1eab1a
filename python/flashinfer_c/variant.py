"""User-defined attention variants (docs/VARIANTS.md): the C library's
fi_variant_spec from Python.

FlashInfer declares a custom variant with `jit_args` for its JIT
(gen_customize_batch_prefill_module: additional tensor names and dtypes,
additional scalar names and dtypes, and a CUDA C++ struct whose methods are
the hooks). flashinfer_c's documented equivalent is a `Variant`: the same
names and dtypes, and the hooks as C snippets (the *bodies* of six fixed
functions, valid C and CUDA) that both backends compile -- the system C
compiler on the CPU, NVRTC on the GPU:

    sink = Variant(
        "sink",
        tensors=[("sink", "float32")],          # p.sink, a [num_qo_heads] array
        output_transform=(
            "float w = 1.0f / (1.0f + expf(p.sink[c->qo_head] - lse));"
            "for (int32_t d = 0; d < c->head_dim; d++) o[d] *= w;"
        ),
    )
    wrapper = BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", jit_args=sink)
    wrapper.plan(...)
    out = wrapper.run(q, kv_cache, sink_logits)   # values in declaration order

Variant.from_jit_args(...) takes FlashInfer's argument names. Parameters are
ordered tensors first, then scalars (FlashInfer's order); run() takes them
positionally in that order. Tensors must be contiguous, on the wrapper's
device, of the declared dtype.
"""

import ctypes

import numpy as np

from . import _structs as S
from ._arrays import c_int32, dtype_name, is_torch
from ._lib import check, fn

_TENSOR_DTYPES = {
    "float32": S.DTYPE_F32,
    "float16": S.DTYPE_F16,
    "bfloat16": S.DTYPE_BF16,
    "int32": S.DTYPE_I32,
    "uint8": S.DTYPE_U8,
}
_SCALAR_KINDS = {
    "float": S.VARIANT_PARAM_F32,
    "float32": S.VARIANT_PARAM_F32,
    "double": S.VARIANT_PARAM_F32,
    "int": S.VARIANT_PARAM_I32,
    "int32": S.VARIANT_PARAM_I32,
    "int32_t": S.VARIANT_PARAM_I32,
}
_HOOKS = (
    "query_transform",
    "key_transform",
    "value_transform",
    "logits_transform",
    "logits_mask",
    "output_transform",
)


def _enc(s):
    return None if s is None else s.encode()


class Variant:
    """A validated variant spec owned by the C library (fi_variant)."""

    def __init__(self, name, *, tensors=(), scalars=(), use_softmax=True, helpers=None, **hooks):
        unknown = set(hooks) - set(_HOOKS)
        if unknown:
            raise TypeError(f"Variant: unknown hooks {sorted(unknown)}; hooks are {_HOOKS}")
        self.name = name
        self.params = []  # (name, kind, dtype code), the C order
        for pname, dtype in tensors:
            dname = dtype_name(dtype)
            if dname not in _TENSOR_DTYPES:
                raise ValueError(
                    f"Variant {name}: tensor {pname} of dtype {dname}: expected one of "
                    f"{', '.join(_TENSOR_DTYPES)}"
                )
            self.params.append((pname, S.VARIANT_PARAM_TENSOR, _TENSOR_DTYPES[dname]))
        for pname, kind in scalars:
            key = str(kind).removeprefix("torch.")
            if key not in _SCALAR_KINDS:
                raise ValueError(
                    f"Variant {name}: scalar {pname} of type {kind}: expected float or int"
                )
            code = _SCALAR_KINDS[key]
            self.params.append((pname, code, S.DTYPE_F32 if code == 0 else S.DTYPE_I32))
        self.use_softmax = bool(use_softmax)
        self.hooks = {k: v for k, v in hooks.items() if v is not None}
        self.helpers = helpers
        spec = S.VariantSpec()
        fn.variant_spec_init(ctypes.byref(spec))
        self._keep = [n.encode() for n, _, _ in self.params]
        arr = (S.VariantParam * max(len(self.params), 1))()
        for i, (n, kind, dt) in enumerate(self.params):
            arr[i].name, arr[i].kind, arr[i].dtype = self._keep[i], kind, dt
        spec.name = name.encode()
        spec.params = arr
        spec.num_params = len(self.params)
        for hook in _HOOKS:
            setattr(spec, hook, _enc(self.hooks.get(hook)))
        spec.use_softmax = int(self.use_softmax)
        spec.helpers = _enc(helpers)
        handle = ctypes.c_void_p()
        check(fn.variant_create(ctypes.byref(spec), ctypes.byref(handle)), f"Variant {name}")
        self.handle = handle.value  # the spec was copied: nothing above must stay alive
        self._destroy = fn.variant_destroy

    @classmethod
    def from_jit_args(
        cls,
        variant_name,
        additional_tensor_names=(),
        additional_tensor_dtypes=(),
        additional_scalar_names=(),
        additional_scalar_dtypes=(),
        **hooks,
    ):
        """A Variant from FlashInfer's jit_args names; hooks as C snippets."""
        if len(additional_tensor_names) != len(additional_tensor_dtypes):
            raise ValueError("additional_tensor_names and _dtypes differ in length")
        if len(additional_scalar_names) != len(additional_scalar_dtypes):
            raise ValueError("additional_scalar_names and _dtypes differ in length")
        return cls(
            variant_name,
            tensors=list(zip(additional_tensor_names, additional_tensor_dtypes)),
            scalars=list(zip(additional_scalar_names, additional_scalar_dtypes)),
            **hooks,
        )

    def source(self, target="c"):
        """The generated hook text the kernels splice in ("c" or "cuda")."""
        code = S.VARIANT_TARGET_C if target == "c" else S.VARIANT_TARGET_CUDA
        n = fn.variant_source(self.handle, code, None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        fn.variant_source(self.handle, code, buf, n + 1)
        return buf.value.decode()

    def pack(self, values, device=("cpu", 0)):
        """fi_variant_args for one run (the struct and what keeps it alive)."""
        if len(values) != len(self.params):
            raise ValueError(
                f"variant {self.name} takes {len(self.params)} values "
                f"({', '.join(n for n, _, _ in self.params)}), got {len(values)}"
            )
        arr = (S.VariantValue * max(len(values), 1))()
        keep = []
        for i, ((pname, kind, dt), x) in enumerate(zip(self.params, values)):
            arr[i].kind = kind
            if kind == S.VARIANT_PARAM_F32:
                arr[i].f32 = float(x)
            elif kind == S.VARIANT_PARAM_I32:
                arr[i].i32 = c_int32(x, f"variant {self.name}: {pname}")
            else:
                arr[i].ptr = self._tensor_ptr(pname, dt, x, device, keep)
        args = S.VariantArgs(len(values), arr)
        return args, (arr, keep)

    def _tensor_ptr(self, pname, code, x, device, keep):
        want = next(k for k, v in _TENSOR_DTYPES.items() if v == code)
        if is_torch(x):
            if dtype_name(x.dtype) != want or not x.is_contiguous():
                raise ValueError(f"variant {self.name}: {pname} must be a contiguous {want} tensor")
            if x.device.type != device[0]:
                raise ValueError(f"variant {self.name}: {pname} is on {x.device}, not {device[0]}")
            keep.append(x)
            return x.data_ptr()
        if device[0] != "cpu":
            raise ValueError(f"variant {self.name}: {pname} must be a torch tensor on {device[0]}")
        a = np.asarray(x)
        if a.dtype.name != want:
            raise ValueError(f"variant {self.name}: {pname} has dtype {a.dtype}, declared {want}")
        a = np.ascontiguousarray(a)
        keep.append(a)
        return a.ctypes.data

    def __del__(self):
        if getattr(self, "handle", None):
            self._destroy(self.handle)
            self.handle = None

    def __repr__(self):
        return f"Variant({self.name!r}, params={[n for n, _, _ in self.params]})"


def builtin_source(name, target="c"):
    """The hook text of a built-in spec ("soft_cap", "alibi", "rope_llama" ...)."""
    h = ctypes.c_void_p()
    check(fn.variant_builtin(name.encode(), ctypes.byref(h)), f"built-in variant {name}")
    code = S.VARIANT_TARGET_C if target == "c" else S.VARIANT_TARGET_CUDA
    n = fn.variant_source(h.value, code, None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    fn.variant_source(h.value, code, buf, n + 1)
    return buf.value.decode()
