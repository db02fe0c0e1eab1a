"""FlashInfer names this package does not implement, so that an engine's
import lines still work: each name exists and raises NotImplementedError,
when called, saying what to use instead.

Two kinds: entry points that exist only for other hardware or libraries
(TRT-LLM-gen, XQA, cuDNN, CUTLASS/FP4 paths: Blackwell and NVIDIA-library
kernels), whose flashinfer_c equivalent is a wrapper; and whole areas that
are not attention (GEMM, MoE, communication, MLA), for which the
engine's own (torch) path is the one to use. Modules of the second kind
exist only under FlashInfer's names (install_as_flashinfer); a name not
listed raises AttributeError, so `from flashinfer.gemm import x` fails
with ImportError naming it, as for any missing name.
"""

import sys
import types

_DECODE = "flashinfer.BatchDecodeWithPagedKVCacheWrapper (plan once per step, run per layer)"
_PREFILL = "flashinfer.BatchPrefillWithPagedKVCacheWrapper (or BatchPrefillWithRaggedKVCacheWrapper)"
_TORCH = "the engine's own torch implementation"

# module -> {name: what to use instead}
FOREIGN = {
    "decode": {
        "trtllm_batch_decode_with_kv_cache": _DECODE,
        "trtllm_batch_decode_with_kv_cache_mla": "an MHA/GQA attention backend (MLA is not provided)",
        "trtllm_batch_decode_sparse_mla_dsv4": "an MHA/GQA attention backend (MLA is not provided)",
        "xqa_batch_decode_with_kv_cache": _DECODE,
        "xqa_batch_decode_with_kv_cache_mla": "an MHA/GQA attention backend (MLA is not provided)",
        "cudnn_batch_decode_with_kv_cache": _DECODE,
    },
    "prefill": {
        "trtllm_batch_context_with_kv_cache": _PREFILL,
        "trtllm_ragged_attention_deepseek": _PREFILL,
        "cudnn_batch_prefill_with_kv_cache": _PREFILL,
        "fmha_varlen": _PREFILL,
    },
    "xqa": {"xqa": _DECODE, "xqa_mla": "an MHA/GQA attention backend (MLA is not provided)"},
    "cudnn": {
        "cudnn_batch_decode_with_kv_cache": _DECODE,
        "cudnn_batch_prefill_with_kv_cache": _PREFILL,
    },
    "mla": {
        "BatchMLAPagedAttentionWrapper": "an MHA/GQA attention backend (MLA is not provided)",
        "trtllm_batch_decode_with_kv_cache_mla": "an MHA/GQA attention backend (MLA is not provided)",
        "xqa_batch_decode_with_kv_cache_mla": "an MHA/GQA attention backend (MLA is not provided)",
    },
    "gemm": {
        name: "torch.matmul / the engine's GEMM kernels"
        for name in ("bmm_fp8", "mm_fp4", "mm_fp8", "gemm_fp8_nt_groupwise",
                     "group_gemm_fp8_nt_groupwise", "SegmentGEMMWrapper", "tgv_gemm_sm100")
    },
    "fused_moe": {
        name: "the engine's own MoE kernels"
        for name in ("cutlass_fused_moe", "trtllm_fp8_block_scale_moe",
                     "trtllm_fp8_per_tensor_scale_moe", "trtllm_fp4_block_scale_moe",
                     "trtllm_bf16_moe", "RoutingMethodType", "GatedActType")
    },
    "comm": {
        name: "torch.distributed / the engine's all-reduce"
        for name in ("trtllm_allreduce_fusion", "trtllm_create_ipc_workspace_for_all_reduce",
                     "trtllm_destroy_ipc_workspace_for_all_reduce", "AllReduceFusionPattern",
                     "vllm_all_reduce", "vllm_init_custom_ar")
    },
    "fp4_quantization": {
        name: "an FP8 or bf16 KV cache and the engine's quantization kernels"
        for name in ("fp4_quantize", "nvfp4_quantize", "nvfp4_block_scale_interleave",
                     "block_scale_interleave", "e2m1_and_ufp8sf_scale_to_float",
                     "mxfp8_quantize", "mxfp4_quantize")
    },
    "jit": {
        name: "flashinfer_c.Variant (docs/VARIANTS.md): hooks as C snippets, passed as jit_args"
        for name in ("gen_customize_batch_prefill_module", "gen_customize_batch_decode_module",
                     "gen_customize_single_prefill_module", "gen_customize_single_decode_module",
                     "gen_batch_prefill_module", "gen_batch_decode_module", "build_jit_specs")
    },
}

# Modules that exist only as these names (no flashinfer_c module of their own).
FOREIGN_ONLY = ("xqa", "cudnn", "mla", "gemm", "fused_moe", "comm",
                "fp4_quantization", "jit")


def unavailable(module, name, instead):
    """A callable named `name` that raises NotImplementedError saying what to use."""
    message = (
        f"flashinfer.{module}.{name} is not provided by flashinfer_c (it is FlashInfer's entry "
        f"point for other hardware or another library, or not attention); use {instead}"
    )

    def refuse(*args, **kwargs):
        raise NotImplementedError(message)

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = message
    return refuse


def _missing(module):
    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"module 'flashinfer.{module}' (flashinfer_c) has no attribute {name!r}: "
            "flashinfer_c does not provide it (docs/PYTHON_COMPAT.md lists what it provides)"
        )

    return __getattr__


def add_to(module_obj, module):
    """Put the FOREIGN names of `module` into an existing module object."""
    for name, instead in FOREIGN.get(module, {}).items():
        if not hasattr(module_obj, name):
            setattr(module_obj, name, unavailable(module, name, instead))


def foreign_module(module):
    """The module object standing for flashinfer.<module> when flashinfer_c has none."""
    full = f"flashinfer_c.{module}"
    existing = sys.modules.get(full)
    if existing is not None:
        return existing
    m = types.ModuleType(full, f"FlashInfer's flashinfer.{module}: not provided by flashinfer_c.")
    add_to(m, module)
    m.__getattr__ = _missing(module)
    m.__all__ = sorted(FOREIGN.get(module, {}))
    sys.modules[full] = m
    return m
