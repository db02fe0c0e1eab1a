/*
 * serving_ops.c — the serving ops (norms, gated activations, softmax,
 * sampling, filters, speculative sampling, top-k) on the CUDA backend: not
 * written yet. Each entry refuses with FI_STATUS_UNSUPPORTED and says so,
 * rather than computing anything; the CPU backend has them all. The CUDA
 * kernels must keep docs/SEMANTICS.md "Serving ops" (thresholds with ties
 * kept, the Philox draws of core/serving.h) so both backends agree.
 */
#include "cuda/cuda_ops.h"

/* The one refusal, naming the family and what to use meanwhile. */
static fi_status not_yet(const char *family) {
    return fi_error(FI_STATUS_UNSUPPORTED,
                    "%s on CUDA: not yet (the CPU backend implements it: a CPU context, "
                    "host tensors)", family);
}

fi_status fi_cuda_norm(fi_context *ctx, const fi_norm_args *a, void *stream) {
    (void)ctx, (void)stream;
    return not_yet(a->kind == FI_NORM_LAYER ? "layernorm" : "rmsnorm");
}

fi_status fi_cuda_gated_act(fi_context *ctx, const fi_act_args *a, void *stream) {
    (void)ctx, (void)a, (void)stream;
    return not_yet("gated activation (silu/gelu_and_mul)");
}

fi_status fi_cuda_softmax(fi_context *ctx, const fi_softmax_args *a, void *stream) {
    (void)ctx, (void)a, (void)stream;
    return not_yet("softmax");
}

fi_status fi_cuda_sample(fi_context *ctx, const fi_sample_args *a, void *stream) {
    (void)ctx, (void)a, (void)stream;
    return not_yet("sampling");
}

fi_status fi_cuda_filter(fi_context *ctx, const fi_filter_args *a, void *stream) {
    (void)ctx, (void)stream;
    return not_yet(a->op == FI_FILTER_TOP_K_MASK ? "top_k_mask_logits" : "top-k/top-p renorm");
}

fi_status fi_cuda_chain_speculative(fi_context *ctx, const fi_spec_args *a, void *stream) {
    (void)ctx, (void)a, (void)stream;
    return not_yet("chain_speculative_sampling");
}

fi_status fi_cuda_top_k(fi_context *ctx, const fi_topk_args *a, void *stream) {
    (void)ctx, (void)a, (void)stream;
    return not_yet("top_k");
}

fi_status fi_cuda_rope_cos_sin(fi_context *ctx, const fi_rope_cache_args *a, void *stream) {
    (void)ctx, (void)a, (void)stream;
    return not_yet("apply_rope_with_cos_sin_cache");
}
