/*
 * common.h — what the benchmark programs share: a clock, medians, the
 * machine's measured memory read bandwidth and fp32 FMA peak, and the
 * workload's paged KV cache filled with random (never zero) values.
 */
#ifndef FI_BENCH_COMMON_H
#define FI_BENCH_COMMON_H

#include "flashinfer.h"

#include <stddef.h>
#include <stdint.h>

double bench_now(void);                      /* seconds, monotonic */
double bench_median(double *v, int n);       /* sorts v */

/* Read bandwidth in GB/s (1e9 B/s) with `threads` threads streaming over a
 * buffer far larger than the caches; the best of a few passes. */
double bench_read_bandwidth(int threads);
/* fp32 FMA peak in GFLOP/s with `threads` threads (best of 3): 12 independent FMA
 * chains on the widest vectors the CPU has (AVX-512, AVX2, else scalar). */
double bench_fma_peak(int threads);

/* A paged decode/prefill batch: NHD pages, random K/V/Q. */
typedef struct bench_batch {
    int32_t batch, qo_len, page_size, h_qo, h_kv, d;
    int32_t *qo_indptr, *kv_indptr, *kv_indices, *last_page_len, *kv_len;
    int64_t total_qo, total_pages;
    void *q, *k, *v, *o;
    float *lse;
    fi_dtype q_dtype, kv_dtype, o_dtype;
} bench_batch;

/* kv_lens[i] keys per request (qo_len queries each); pages shuffled so
 * reads are not one sequential stream. Returns 0 on success. */
int bench_batch_make(bench_batch *b, int32_t batch, const int32_t *kv_lens, int32_t qo_len,
                     int32_t page_size, int32_t h_qo, int32_t h_kv, int32_t d,
                     fi_dtype q_dtype, fi_dtype kv_dtype, uint64_t seed);
void bench_batch_free(bench_batch *b);
fi_batch bench_batch_view(const bench_batch *b);
fi_run_args bench_batch_args(const bench_batch *b, int with_lse);
/* Params matching the batch (heads, head dim, page size, dtypes) with
 * `mask`, and a plan config whose bounds are the batch itself. */
fi_attention_params bench_batch_params(const bench_batch *b, fi_mask_mode mask);
fi_plan_config bench_batch_config(const bench_batch *b);
/* Bytes a decode step must move: Q + K + V (once per KV head) + O. */
double bench_batch_bytes(const bench_batch *b);
/* 4 * H_qo * D * visible (query, key) pairs; causal counts the triangle. */
double bench_batch_flops(const bench_batch *b, int causal);

#endif
