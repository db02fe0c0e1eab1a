"""flashinfer_c: FlashInfer's Python API over flashinfer.c, the C attention engine.

    import flashinfer_c as flashinfer

Same names, arguments, defaults and return conventions as FlashInfer
(docs/PYTHON_COMPAT.md lists every difference). numpy arrays and torch CPU
tensors run on the CPU backend; torch CUDA tensors on the CUDA backend, on
the tensors' device and the caller's current torch stream.
"""

from . import (
    activation,
    attention,
    cascade,
    decode,
    norm,
    page,
    pod,
    prefill,
    quantization,
    rope,
    sampling,
    sparse,
    topk,
    utils,
    variant,
)
from ._compat import install_as_flashinfer, installed_as_flashinfer, uninstall_as_flashinfer
from ._arrays import DTypeError
from ._context import describe
from ._lib import (
    BackendError,
    BackendUnsupportedError,
    BoundExceededError,
    CompileError,
    FlashInferCError,
    InternalError,
    InvalidArgumentError,
    NoDeviceError,
    NotPlannedError,
    OutOfMemoryError,
    UnsupportedError,
    cuda_available,
)
from ._lib import path as library_path
from ._lib import version as library_version
from .attention import BatchAttention, BatchAttentionWithAttentionSinkWrapper
from .cascade import (
    BatchDecodeWithSharedPrefixPagedKVCacheWrapper,
    BatchPrefillWithSharedPrefixPagedKVCacheWrapper,
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)
from .decode import (
    BatchDecodeWithPagedKVCacheWrapper,
    CUDAGraphBatchDecodeWithPagedKVCacheWrapper,
    fast_decode_plan,
    single_decode_with_kv_cache,
)
from .pod import BatchPODWithPagedKVCacheWrapper, PODWithPagedKVCacheWrapper
from .page import append_paged_kv_cache, get_batch_indices_positions, get_seq_lens
from .prefill import (
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
    single_prefill_with_kv_cache,
    single_prefill_with_kv_cache_return_lse,
)
from .quantization import packbits, segment_packbits
from .rope import (
    apply_llama31_rope,
    apply_llama31_rope_inplace,
    apply_llama31_rope_pos_ids,
    apply_llama31_rope_pos_ids_inplace,
    apply_rope,
    apply_rope_inplace,
    apply_rope_pos_ids,
    apply_rope_pos_ids_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
    fused_qk_norm_rope,
    fused_qk_rmsnorm_rope,
    mla_rope_quantize_fp8,
    rope_quantize_fp8,
    rope_quantize_fp8_append_paged_kv_cache,
)
from .sparse import BlockSparseAttentionWrapper, VariableBlockSparseAttentionWrapper
from .activation import gelu_and_mul, gelu_tanh_and_mul, silu_and_mul
from .norm import fused_add_rmsnorm, gemma_fused_add_rmsnorm, gemma_rmsnorm, rmsnorm
from .norm import fused_add_rmsnorm_quant, layernorm, rmsnorm_quant
from .sampling import (
    chain_speculative_sampling,
    min_p_sampling_from_probs,
    sampling_from_logits,
    sampling_from_probs,
    softmax,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)
from .topk import top_k, top_k_page_table_transform, top_k_ragged_transform
from .utils import MaskMode, PosEncodingMode, TensorLayout
from .variant import Variant

__version__ = "0.1.0"

# FlashInfer's top-level names for entry points of other hardware (TRT-LLM-gen,
# XQA, cuDNN) and for MLA: they exist and raise, saying what to use instead.
from ._foreign import FOREIGN as _FOREIGN
from ._foreign import unavailable as _unavailable

for _module, _names in _FOREIGN.items():
    if _module in ("decode", "prefill", "mla", "xqa", "cudnn"):
        for _name, _instead in _names.items():
            globals().setdefault(_name, _unavailable(_module, _name, _instead))
del _module, _names, _name, _instead

__all__ = [
    "Variant",
    "BatchAttentionWithAttentionSinkWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
    "BatchPODWithPagedKVCacheWrapper",
    "PODWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
    "CompileError",
    "BatchAttention",
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
    "BlockSparseAttentionWrapper",
    "MaskMode",
    "MultiLevelCascadeAttentionWrapper",
    "PosEncodingMode",
    "TensorLayout",
    "VariableBlockSparseAttentionWrapper",
    "append_paged_kv_cache",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "fused_qk_norm_rope",
    "fused_qk_rmsnorm_rope",
    "mla_rope_quantize_fp8",
    "rope_quantize_fp8",
    "rope_quantize_fp8_append_paged_kv_cache",
    "get_batch_indices_positions",
    "get_seq_lens",
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "packbits",
    "segment_packbits",
    "single_decode_with_kv_cache",
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "rmsnorm",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "silu_and_mul",
    "fused_add_rmsnorm_quant",
    "layernorm",
    "rmsnorm_quant",
    "chain_speculative_sampling",
    "min_p_sampling_from_probs",
    "sampling_from_logits",
    "sampling_from_probs",
    "softmax",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
    "top_k",
    "top_k_page_table_transform",
    "top_k_ragged_transform",
    # flashinfer_c's own
    "install_as_flashinfer",
    "installed_as_flashinfer",
    "uninstall_as_flashinfer",
    "cuda_available",
    "describe",
    "library_path",
    "library_version",
    "DTypeError",
    "FlashInferCError",
    "InvalidArgumentError",
    "UnsupportedError",
    "OutOfMemoryError",
    "BoundExceededError",
    "NotPlannedError",
    "NoDeviceError",
    "BackendError",
    "BackendUnsupportedError",
    "InternalError",
    "activation",
    "attention",
    "cascade",
    "norm",
    "decode",
    "page",
    "prefill",
    "quantization",
    "rope",
    "sampling",
    "sparse",
    "topk",
    "utils",
]
