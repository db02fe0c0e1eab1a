"""ctypes mirrors of the structs and enums in include/flashinfer.h.

The field order and types here must match the header exactly. The library
checks the size of every extensible struct (its first field), and _lib
compares each *_init() result with ctypes.sizeof() at import, so a header
change that this file misses fails loudly instead of corrupting memory.
"""

from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_void_p,
)

MAX_DIMS = 6

# fi_status
OK = 0
STATUS_INVALID_ARGUMENT = 1
STATUS_UNSUPPORTED = 2
STATUS_OUT_OF_MEMORY = 3
STATUS_BOUND_EXCEEDED = 4
STATUS_NOT_PLANNED = 5
STATUS_NO_DEVICE = 6
STATUS_BACKEND_ERROR = 7
STATUS_INTERNAL = 8
STATUS_COMPILE_ERROR = 9

# fi_dtype
DTYPE_F32 = 0
DTYPE_F16 = 1
DTYPE_BF16 = 2
DTYPE_E4M3 = 3
DTYPE_E5M2 = 4
DTYPE_I32 = 5
DTYPE_U8 = 6

# fi_kv_layout
KV_LAYOUT_NHD = 0
KV_LAYOUT_HND = 1

# fi_kv_format
KV_FORMAT_PAGED = 0
KV_FORMAT_RAGGED = 1

# fi_device_type
DEVICE_CPU = 0
DEVICE_CUDA = 1

# fi_mask_mode
MASK_NONE = 0
MASK_CAUSAL = 1
MASK_CUSTOM = 2

# fi_pos_encoding
POS_NONE = 0
POS_ROPE_LLAMA = 1
POS_ALIBI = 2

# C enums are int-sized on every ABI the library is built for.
c_enum = c_int


class Tensor(Structure):
    """fi_tensor: a view with shape and strides counted in elements."""

    _fields_ = [
        ("data", c_void_p),
        ("dtype", c_enum),
        ("ndim", c_int32),
        ("shape", c_int64 * MAX_DIMS),
        ("stride", c_int64 * MAX_DIMS),
    ]


def ctypes_sizeof_tensor():
    from ctypes import sizeof

    return sizeof(Tensor)


class ContextOptions(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("device", c_enum),
        ("device_id", c_int32),
        ("num_threads", c_int32),
        ("cpu_simd", c_char_p),
    ]


class AttentionParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_qo_heads", c_int32),
        ("num_kv_heads", c_int32),
        ("head_dim_qk", c_int32),
        ("head_dim_vo", c_int32),
        ("kv_format", c_enum),
        ("page_size", c_int32),
        ("kv_layout", c_enum),
        ("q_dtype", c_enum),
        ("kv_dtype", c_enum),
        ("o_dtype", c_enum),
        ("mask_mode", c_enum),
        ("window_left", c_int32),
        ("logits_soft_cap", c_float),
        ("sm_scale", c_float),
        ("pos_encoding", c_enum),
        ("rope_scale", c_float),
        ("rope_theta", c_float),
        ("alibi_slopes", POINTER(c_float)),
        ("k_scale", c_float),
        ("v_scale", c_float),
        ("variant", c_void_p),  # const fi_variant *
    ]


class PlanConfig(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("max_batch_size", c_int32),
        ("max_total_qo", c_int32),
        ("max_total_kv", c_int32),
        ("num_workers", c_int32),
        ("disable_split_kv", c_int32),
        ("fixed_split_size", c_int32),
        ("device_page_table", c_int32),
    ]


class Batch(Structure):
    """fi_batch: host int32 arrays, read (and copied) by fi_plan_update."""

    _fields_ = [
        ("batch_size", c_int32),
        ("qo_indptr", c_void_p),
        ("kv_indptr", c_void_p),
        ("kv_indices", c_void_p),
        ("kv_last_page_len", c_void_p),
        ("mask_indptr", c_void_p),
    ]


class PlanInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("batch_size", c_int32),
        ("num_workers", c_int32),
        ("q_tile", c_int32),
        ("kv_chunk", c_int32),
        ("num_items", c_int32),
        ("num_split_items", c_int32),
        ("num_merge_rows", c_int32),
        ("max_worker_cost", c_double),
        ("total_cost", c_double),
    ]


class RunArgs(Structure):
    _fields_ = [
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("o", Tensor),
        ("lse", Tensor),
        ("custom_mask", Tensor),
        ("stream", c_void_p),
        ("variant_args", c_void_p),  # const fi_variant_args *
    ]


# fi_variant_param_kind
VARIANT_PARAM_F32 = 0
VARIANT_PARAM_I32 = 1
VARIANT_PARAM_TENSOR = 2

# fi_variant_target
VARIANT_TARGET_C = 0
VARIANT_TARGET_CUDA = 1


class VariantParam(Structure):
    _fields_ = [("name", c_char_p), ("kind", c_enum), ("dtype", c_enum)]


class VariantSpec(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("params", POINTER(VariantParam)),
        ("num_params", c_int32),
        ("query_transform", c_char_p),
        ("key_transform", c_char_p),
        ("value_transform", c_char_p),
        ("logits_transform", c_char_p),
        ("logits_mask", c_char_p),
        ("output_transform", c_char_p),
        ("use_softmax", c_int32),
        ("helpers", c_char_p),
    ]


class VariantValue(Structure):
    _fields_ = [("kind", c_enum), ("f32", c_float), ("i32", c_int32), ("ptr", c_void_p)]


class VariantArgs(Structure):
    _fields_ = [("num_values", c_int32), ("values", POINTER(VariantValue))]


class RopeParams(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("rotary_dim", c_int32),
        ("interleave", c_int32),
        ("rope_scale", c_float),
        ("rope_theta", c_float),
        ("llama31", c_int32),
        ("low_freq_factor", c_float),
        ("high_freq_factor", c_float),
        ("old_context_len", c_float),
    ]


# ------------------------------------------------------- composable formats

CASCADE_MAX_LEVELS = 8
CASCADE_AUTO_MAX_LEVELS = 4

# fi_prefix_detection
PREFIX_DETECTION_AUTO = 0
PREFIX_DETECTION_OFF = 1
PREFIX_DETECTION_ALWAYS = 2


class CascadeOptions(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("prefix_detection", c_enum),
        ("workspace", c_void_p),
        ("workspace_bytes", c_size_t),
    ]


class CascadeInfo(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("num_levels", c_int32),
        ("split", c_int32),
        ("num_groups", c_int32),
        ("saved_page_reads", c_int64),
        ("cost_single", c_double),
        ("cost_cascade", c_double),
    ]


class BsrConfig(Structure):
    _fields_ = [
        ("struct_size", c_uint32),
        ("block_rows", c_int32),
        ("block_cols", c_int32),
        ("max_qo_len", c_int32),
        ("max_kv_len", c_int32),
        ("max_nnz", c_int32),
        ("element_mask", c_int32),
        ("variable_blocks", c_int32),
        ("max_block_rows", c_int32),
        ("col_granularity", c_int32),
        ("num_workers", c_int32),
    ]


# Opaque handles.
context_p = c_void_p
plan_p = c_void_p
TensorP = POINTER(Tensor)


class RopeQuantArgs(Structure):
    """fi_rope_quant_args: the tensors of fi_rope_quantize_fp8 and its append form."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("q_rope", TensorP),
        ("q_nope", TensorP),
        ("k_rope", TensorP),
        ("k_nope", TensorP),
        ("v", TensorP),
        ("cos_sin_cache", TensorP),
        ("pos_ids", TensorP),
        ("is_neox", c_int32),
        ("quant_scale_q", c_float),
        ("quant_scale_kv", c_float),
        ("q_rope_out", TensorP),
        ("q_nope_out", TensorP),
        ("k_rope_out", TensorP),
        ("k_nope_out", TensorP),
        ("k_cache", TensorP),
        ("v_cache", TensorP),
        ("ckv_cache", TensorP),
        ("kpe_cache", TensorP),
        ("layout", c_int),
        ("kv_indices", TensorP),
        ("kv_indptr", TensorP),
        ("batch_indices", TensorP),
        ("positions", TensorP),
    ]
