/*
 * rope_quant_cases.h — the cases of fi_rope_quantize_fp8 and its append
 * form that the CPU test (tests/test_serving_ops.c, against the fp64
 * oracle) and the CUDA test (tests/gpu/test_cuda_serving.c, against the
 * CPU) share: the same buffers from the same seed, the call built from
 * host or device views, and the oracle's check of every written element
 * and of every byte that must not change.
 */
#ifndef FI_TESTS_ROPE_QUANT_CASES_H
#define FI_TESTS_ROPE_QUANT_CASES_H

#include "flashinfer.h"
#include "util.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct rq_cfg {
    int64_t nnz, hq, hk;  /* hk 0: MLA (k_rope [nnz, R], one latent head) */
    int64_t rot, nope;    /* R; N (0: no nope tensors) */
    fi_dtype xt, ot;      /* inputs; FP8 outputs and caches */
    int neox, append, hnd, page_size;
    int strided;          /* inputs and outputs in permuted, padded layouts */
    int sliced;           /* outputs [.., :R] and [.., R:] of one [.., R + N] tensor */
    float sq, skv;        /* quant_scale_q, quant_scale_kv */
} rq_cfg;

/* The buffers of a case, in order (a slot a case does not use holds one
 * byte). Q_OUT: q_rope_out, or sliced the [nnz, H_q, R + N] tensor of
 * both; Q_NOPE_OUT: q_nope_out unsliced. K_OUT / K2_OUT: plain, like Q's
 * for K; append, k_cache / v_cache (GQA) or ckv_cache / kpe_cache (MLA).
 * INDEX: i32 pos_ids [nnz], then (append) batch_indices [nnz], positions
 * [nnz], kv_indptr [B+1], kv_indices. */
enum {
    RQ_Q_ROPE, RQ_K_ROPE, RQ_Q_NOPE, RQ_K_NOPE, RQ_V, RQ_COS_SIN, RQ_INDEX,
    RQ_Q_OUT, RQ_Q_NOPE_OUT, RQ_K_OUT, RQ_K2_OUT, RQ_NBUF
};

typedef struct rq_case {
    rq_cfg c;
    int64_t max_pos, batch, num_indices, pages;
    int64_t off_batch, off_pos, off_indptr, off_indices; /* in INDEX */
} rq_case;

/* Allocate and fill b[RQ_NBUF] for c: inputs uniform in [-2, 2), the
 * cos/sin cache of theta 1e4, random pos_ids, a page table of up to 3
 * requests whose new tokens come in shuffled order, caches full of random
 * bytes (an old cache), outputs poisoned. 0 on success. */
int rq_case_alloc(rq_case *k, const rq_cfg *c, tu_buf *b, tu_rng *rng);
/* The op on ctx over views t[RQ_NBUF] (host or device addresses). */
fi_status rq_case_call(fi_context *ctx, const rq_case *k, const fi_tensor *t, void *stream);
/* Every element the op writes against the fp64 oracle (FP8 rounding of
 * the reference, or of a value within f32 rounding of it), and every other
 * byte of every buffer as before[i] (the bytes before the run). skip
 * (NULL: none) per token: RQ_SKIP_ALL, nothing written (a pos_id outside
 * the cache on CUDA), RQ_SKIP_KV, no cache row (a bad page table entry).
 * 1, or 0 after a note. */
enum { RQ_SKIP_NONE = 0, RQ_SKIP_ALL = 1, RQ_SKIP_KV = 2 };
int rq_case_check(const rq_case *k, const tu_buf *b, void *const *before, const uint8_t *skip);
/* Each invalid argument of the two entry points on ctx: its status and
 * message, nothing written (category "bad_input", names
 * "bad_input/<bname>/rope_quant/..."). device: a CUDA context, where the
 * values in index tensors are not checked on the host (those cases are
 * left out: the kernel's handling is tested on the GPU). */
void rq_bad_input(fi_context *ctx, const char *bname, bool device);
/* "gqa_h4_2_r64_n96/bf16_e4m3/neox/append_nhd_p16/strided" */
void rq_case_name(const rq_cfg *c, char *out, size_t size);

#endif /* FI_TESTS_ROPE_QUANT_CASES_H */
