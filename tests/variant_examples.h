/*
 * variant_examples.h — the example variants of docs/VARIANTS.md as specs,
 * with the per-run values each takes, shared by the CPU tests
 * (tests/test_variant_run.c) and the GPU test (tests/gpu/), so both backends
 * run the very same hook text against the fp64 oracle.
 *
 *   sigmoid       FlashSigmoid: use_softmax 0, weight sigmoid(s + bias)
 *   sink          attention sink: per-head sink logit, o *= 1/(1 + e^(sink_h - lse))
 *   block_mask    custom block mask: keep (q_pos/B, kv_pos/B) where blocks[] != 0
 *   streaming     StreamingLLM: RoPE in the query/key transforms at positions in
 *                 the cache, keep num_sink first keys + a window of recent keys
 *   head_scale    per-head logit scaling: s * scale[h]
 *   all_hooks     (test only) every hook at once, bf16 and i32 tensor params
 */
#ifndef FI_TESTS_VARIANT_EXAMPLES_H
#define FI_TESTS_VARIANT_EXAMPLES_H

#include "flashinfer.h"
#include "util.h"

#include <stddef.h>
#include <stdint.h>

enum { VX_SIGMOID, VX_SINK, VX_BLOCK_MASK, VX_STREAMING, VX_HEAD_SCALE, VX_ALL_HOOKS, VX_COUNT };

/* The spec of example i (static storage; its name is the example's). */
const fi_variant_spec *vx_spec(int i);

/* What the values of a run depend on. */
typedef struct vx_shape {
    int32_t num_qo_heads;
    int32_t head_dim_vo;
    int32_t max_kv_len;   /* longest request's keys (block mask table extent) */
} vx_shape;

/* One run's values. Tensor parameters point into host[i] (malloc'd, bytes[i]
 * long); a GPU test copies them to device memory and repoints values[i].ptr. */
typedef struct vx_args {
    int32_t num_values;
    fi_variant_value values[FI_VARIANT_MAX_PARAMS];
    void *host[FI_VARIANT_MAX_PARAMS];
    size_t bytes[FI_VARIANT_MAX_PARAMS];
} vx_args;

/* {num_values, values} of a (pointing into it: do not outlive a). */
fi_variant_args vx_variant_args(const vx_args *a);

/* Fresh random values for example i. Returns 0, or -1 when out of memory. */
int vx_make_args(int i, tu_rng *rng, const vx_shape *shape, vx_args *a);
void vx_args_free(vx_args *a);

/* The fp64 oracle (oracle_attention_hooks) with variant's hooks, compiled
 * for the host by the system C compiler, and `args` packed as the kernels
 * get them. Tensors are host views. Returns 0; -1 on failure (tu_note says
 * why); -2 when there is no C compiler (the caller skips). */
int vx_oracle(const fi_variant *variant, const fi_variant_args *args,
              const fi_attention_params *params, const fi_batch *batch, const fi_tensor *q,
              const fi_tensor *k, const fi_tensor *v, const uint8_t *custom_mask, double *o,
              double *lse);

#endif /* FI_TESTS_VARIANT_EXAMPLES_H */
