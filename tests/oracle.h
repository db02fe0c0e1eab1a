/*
 * oracle.h — the fp64 reference for batched attention: what every backend,
 * format and variant is checked against. Plain loops, written for reading.
 *
 * Semantics are docs/SEMANTICS.md's (FlashInfer's): causal bottom-right, sliding
 * window, soft-cap, ALiBi, fused LLaMA RoPE, custom bit masks, GQA, LSE in
 * base 2, a row with no visible key gives O = 0 and LSE = -inf. Non-finite
 * inputs as docs/SEMANTICS.md says: a NaN or +inf logit makes its row's O
 * and LSE NaN, a -inf one drops its key, V enters in IEEE arithmetic.
 */
#ifndef FI_TESTS_ORACLE_H
#define FI_TESTS_ORACLE_H

#include "flashinfer.h"
#include "cpu/variant_abi.h"

#include <stdint.h>

/* Attention of one batch in double precision.
 *   params       model-level facts, exactly as given to fi_plan_create
 *                (defaults resolved here: sm_scale 0 = 1/sqrt(D_qk),
 *                rope_scale/rope_theta <= 0 = 1 / 1e4, alibi_slopes NULL =
 *                the standard slopes; k_scale/v_scale multiply FP8 KV only)
 *   batch        the host batch as given to fi_plan_update
 *   q            [total_q, H_qo, D_qk]
 *   k, v         paged NHD [pages, page_size, H_kv, D] / HND [pages, H_kv, page_size, D]
 *                ragged NHD [total_kv, H_kv, D] / HND [H_kv, total_kv, D]
 *   custom_mask  packed bits (FI_MASK_CUSTOM), else ignored
 *   o            out: [total_q, H_qo, D_vo] doubles
 *   lse          out: [total_q, H_qo] doubles, base 2 (may be NULL)
 * Rows total_q = batch->qo_indptr[B]. Returns 0, or -1 for a batch the
 * oracle cannot interpret (it trusts the test to pass a valid batch). */
int oracle_attention(const fi_attention_params *params, const fi_batch *batch,
                     const fi_tensor *q, const fi_tensor *k, const fi_tensor *v,
                     const uint8_t *custom_mask, double *o, double *lse);

/* Attention with a user-defined variant's hooks, given as a function table
 * (compiled from the same generated hook text as the kernels; see
 * vx_oracle_hooks in variant_examples.h) and the packed parameter struct.
 * Everything but the hooks is double: K/V rows are decoded, passed through
 * key/value_transform as floats, q through query_transform; s = sm_scale q.k
 * in double, logits_transform on its float; masks (mask mode, window,
 * custom bits, logits_mask); softmax, or with use_softmax = 0 the weighted
 * sum; output_transform on every row with the natural-log LSE (-inf for a
 * row that sees no key; 0 with use_softmax = 0). lse out is base 2 (0 with
 * use_softmax = 0). params->pos_encoding and soft-cap are ignored (a
 * variant's plan rejects them). Returns 0, or -1 as oracle_attention. */
int oracle_attention_hooks(const fi_attention_params *params, const fi_batch *batch,
                           const fi_tensor *q, const fi_tensor *k, const fi_tensor *v,
                           const uint8_t *custom_mask, const fi_vk_hooks *hooks,
                           const void *hook_params, double *o, double *lse);

/* Keys of request b: paged page_size*(n-1) + last (0 without pages),
 * ragged kv_indptr[b+1] - kv_indptr[b]. */
int64_t oracle_kv_len(const fi_attention_params *params, const fi_batch *batch,
                      int32_t b);

/* FlashInfer's default ALiBi slope of head h among num_heads:
 * n = 2^floor(log2 H); h < n: 2^(-8(h+1)/n), else 2^(-4(2(h-n)+1)/n). */
double oracle_alibi_slope(int32_t h, int32_t num_heads);

/* Whether query row i of a request (qo_len queries, kv_len keys) sees key j
 * by the mask mode and window (custom bits read from `mask_seg`, the
 * request's byte-aligned segment). */
int oracle_visible(const fi_attention_params *params, int64_t qo_len,
                   int64_t kv_len, int64_t i, int64_t j, const uint8_t *mask_seg);

#endif /* FI_TESTS_ORACLE_H */
