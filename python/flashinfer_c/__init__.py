"""flashinfer_c: FlashInfer's Python API over flashinfer.c, the C attention engine.

    import flashinfer_c as flashinfer

Same names, arguments, defaults and return conventions as FlashInfer
(docs/PYTHON_COMPAT.md lists every difference). numpy arrays and torch CPU
tensors run on the CPU backend; torch CUDA tensors on the CUDA backend, on
the tensors' device and the caller's current torch stream.
"""

from . import attention, cascade, decode, page, prefill, quantization, rope, sparse, utils, variant
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
from .attention import BatchAttention
from .cascade import (
    MultiLevelCascadeAttentionWrapper,
    merge_state,
    merge_state_in_place,
    merge_states,
)
from .decode import BatchDecodeWithPagedKVCacheWrapper, single_decode_with_kv_cache
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
)
from .sparse import BlockSparseAttentionWrapper, VariableBlockSparseAttentionWrapper
from .utils import MaskMode, PosEncodingMode, TensorLayout
from .variant import Variant

__version__ = "0.1.0"

__all__ = [
    "Variant",
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
    # flashinfer_c's own
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
    "attention",
    "cascade",
    "decode",
    "page",
    "prefill",
    "quantization",
    "rope",
    "sparse",
    "utils",
]
