/*
 * ops_rope_quant.c — RoPE + FP8 quantize (+ paged append) on the CPU
 * (fi_rope_quantize_fp8 and its append form, lowered by the core to the
 * segments of fi_rq_args).
 *
 * Tokens are split across the thread pool. Per token the cos/sin row is
 * read once; per segment and head the source row is read into f32, turned
 * (rope segments: y = x c - x' s, the f32 products of
 * fi_rope_apply_cos_sin_cache), and stored as FP8 by the serving kernels'
 * to_fp8 (fp8(y * scale), the same code as fi_rmsnorm_quant's), into its
 * output row or, past the Q segments of the append form, into the token's
 * (page, slot) row. The core has checked every index.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF /* the CUDA kernel rounds each product: the same bits */
#endif
#include "cpu/serving.h"

#include <string.h>

/* Element i of a 1-D i32 host tensor. */
static inline int32_t rq_i32(const fi_tensor *t, int64_t i) {
    return ((const int32_t *)t->data)[i * t->stride[0]];
}

typedef struct rq_job {
    const fi_rq_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
    int64_t width; /* the widest segment row */
    bool e5m2;
} rq_job;

/* y = the rotation of x [rot] by cos c, sin s [rot / 2]. */
static void rq_rotate(bool neox, int64_t rot, const float *x, const float *c, const float *s,
                      float *y) {
    const int64_t half = rot / 2;
    for (int64_t i = 0; i < half; i++) {
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        y[a] = x[a] * c[i] - x[b] * s[i];
        y[b] = x[b] * c[i] + x[a] * s[i];
    }
}

/* Element offset of the token's row of head 0 in a segment's dst: its
 * output row, or its (page, slot) in the cache; -1: the token has none. */
static int64_t rq_dst_row(const rq_job *j, int si, int64_t t) {
    const fi_rq_args *a = j->a;
    const fi_tensor *d = &a->seg[si].dst;
    if (!a->append || si < a->nq) return t * d->stride[0];
    const int32_t b = rq_i32(a->batch_indices, t), p = rq_i32(a->positions, t);
    const int32_t page = rq_i32(a->kv_indices, rq_i32(a->kv_indptr, b) + p / a->page_size);
    return page * d->stride[0] + (int64_t)(p % a->page_size) * d->stride[1];
}

static void rq_tokens(void *arg, void *scratch, int64_t begin, int64_t end) {
    const rq_job *j = arg;
    const fi_rq_args *a = j->a;
    float *x = scratch, *y = (float *)((char *)scratch + fi_sv_floats(j->width));
    float *cs = (float *)((char *)y + fi_sv_floats(a->rot));
    uint8_t *q8 = (uint8_t *)((char *)cs + fi_sv_floats(a->rot));
    const fi_tensor *cache = a->cache;
    for (int64_t t = begin; t < end; t++) {
        const int64_t p = rq_i32(a->pos_ids, t);
        const float *row =
            fi_sv_load(j->isa, cache, p * cache->stride[0], cache->stride[1], a->rot, cs);
        for (int si = 0; si < a->nseg; si++) {
            const fi_rq_seg *s = &a->seg[si];
            const int64_t w = s->src.shape[2];
            if (w == 0) continue;
            const int64_t d0 = rq_dst_row(j, si, t);
            const int64_t dh = s->dst.stride[s->dst.ndim - 2], dc = s->dst.stride[s->dst.ndim - 1];
            for (int64_t h = 0; h < s->src.shape[1]; h++) {
                const float *v = fi_sv_load(j->isa, &s->src,
                                            t * s->src.stride[0] + h * s->src.stride[1],
                                            s->src.stride[2], w, x);
                if (s->rope) {
                    rq_rotate(a->neox, a->rot, v, row, row + a->rot / 2, y);
                    v = y;
                }
                j->k->to_fp8(q8, v, s->scale, j->e5m2, w);
                fi_ops_copy((uint8_t *)s->dst.data + d0 + h * dh, dc, q8, 1, w, 1);
            }
        }
    }
}

fi_status fi_cpu_rope_quant(fi_context *ctx, const fi_rq_args *a, void *stream) {
    (void)stream;
    rq_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx), a->rot,
                a->seg[0].dst.dtype == FI_DTYPE_E5M2};
    int64_t bytes = 0;
    for (int i = 0; i < a->nseg; i++) {
        const int64_t w = a->seg[i].src.shape[2], n = a->seg[i].src.shape[1] * w;
        if (w > j.width) j.width = w;
        bytes += n * (fi_ops_elem(a->seg[i].src.dtype) + 1);
    }
    bytes *= a->nnz;
    const size_t scratch = fi_sv_floats(j.width) + 2 * fi_sv_floats(a->rot) +
                           fi_sv_floats(j.width / 4 + 1);
    return fi_sv_parallel_rows(ctx, a->nnz, bytes, 0, NULL, scratch, rq_tokens, &j);
}
