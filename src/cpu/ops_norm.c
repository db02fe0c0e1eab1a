/*
 * ops_norm.c — RMSNorm, LayerNorm (fused residual add, Gemma weights, FP8
 * output), the gated activations and RoPE from a cos/sin cache (with the
 * per-head QK RMSNorm before it, fi_qk_rmsnorm_rope) on the CPU.
 *
 * Rows are split across the thread pool. A row is read into f32 (in place
 * when it already is contiguous f32), reduced with the level's lane sums
 * (serving_kern.h) and written once: the fused add reads input and
 * residual once, writes the f32 sum rounded into residual and the norm of
 * the unrounded sum into the output, as FlashInfer does. The weight (1 + w
 * for Gemma) and bias are converted to f32 once per call.
 */
#include "cpu/serving.h"

#include "core/checked.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct norm_job {
    const fi_norm_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
    const float *w, *b; /* [H] f32 */
    int64_t h;
} norm_job;

/* Scratch per worker: input, residual and result rows, FP8 bytes. */
static size_t norm_scratch(int64_t h) { return 3 * fi_sv_floats(h) + fi_sv_floats(h / 4 + 1); }

/* RMSNorm of contiguous bf16 rows (the residual too) into bf16: read and
 * written directly, with the values and rounding of norm_rows' path. */
static bool norm_rows_bf16(const norm_job *j, float *sum, int64_t begin, int64_t end) {
    const fi_norm_args *a = j->a;
    const fi_tensor *in = a->input, *out = a->out, *res = a->residual;
    if (a->kind == FI_NORM_LAYER || in->dtype != FI_DTYPE_BF16 || out->dtype != FI_DTYPE_BF16 ||
        in->stride[in->ndim - 1] != 1 || out->stride[out->ndim - 1] != 1 ||
        (res && (res->dtype != FI_DTYPE_BF16 || res->stride[res->ndim - 1] != 1)))
        return false;
    const fi_cpu_serving_kernels *k = j->k;
    const int64_t h = j->h;
    for (int64_t r = begin; r < end; r++) {
        const uint16_t *x = (const uint16_t *)in->data + fi_row_offset(in, r);
        uint16_t *y = (uint16_t *)out->data + fi_row_offset(out, r);
        float ss;
        if (res) {
            k->add_bf16(sum, (uint16_t *)res->data + fi_row_offset(res, r), x, h);
            ss = k->sum_sq(sum, h);
        } else {
            ss = k->sum_sq_bf16(x, h);
        }
        const float rstd = 1.0f / sqrtf(ss / (float)h + a->eps);
        k->rms_apply_bf16(y, res ? NULL : x, sum, j->w, rstd, h);
    }
    return true;
}

static void norm_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const norm_job *j = arg;
    const fi_norm_args *a = j->a;
    const fi_cpu_serving_kernels *k = j->k;
    const int64_t h = j->h;
    float *xa = scratch;
    float *rb = (float *)((char *)scratch + fi_sv_floats(h));
    float *sum = (float *)((char *)scratch + 2 * fi_sv_floats(h));
    uint8_t *q = (uint8_t *)scratch + 3 * fi_sv_floats(h);
    if (norm_rows_bf16(j, sum, begin, end)) return;
    const fi_tensor *in = a->input, *out = a->out, *res = a->residual;
    const int64_t in_st = in->stride[in->ndim - 1], out_st = out->stride[out->ndim - 1];
    const bool fp8 = out->dtype == FI_DTYPE_E4M3 || out->dtype == FI_DTYPE_E5M2;
    for (int64_t r = begin; r < end; r++) {
        const int64_t io = fi_row_offset(in, r), oo = fi_row_offset(out, r);
        const float *x = fi_sv_load(j->isa, in, io, in_st, h, xa);
        if (res) {
            const int64_t ro = fi_row_offset(res, r), rs = res->stride[res->ndim - 1];
            k->add(sum, x, fi_sv_load(j->isa, res, ro, rs, h, rb), h);
            fi_sv_store(j->isa, res, ro, rs, sum, h);
            x = sum;
        }
        float mean = 0.0f, rstd;
        if (a->kind == FI_NORM_LAYER) {
            mean = k->sum(x, h) / (float)h;
            rstd = 1.0f / sqrtf(k->sum_sq_dev(x, mean, h) / (float)h + a->eps);
        } else {
            rstd = 1.0f / sqrtf(k->sum_sq(x, h) / (float)h + a->eps);
        }
        float *y = fp8 ? sum : fi_sv_dest(out, oo, out_st, sum);
        if (a->kind == FI_NORM_LAYER)
            k->ln_apply(y, x, j->w, j->b, mean, rstd, h);
        else
            k->rms_apply(y, x, j->w, rstd, h);
        if (!fp8) {
            fi_sv_store(j->isa, out, oo, out_st, y, h);
            continue;
        }
        k->to_fp8(q, y, 1.0f / a->quant_scale, out->dtype == FI_DTYPE_E5M2, h);
        fi_ops_copy((uint8_t *)out->data + oo, out_st, q, 1, h, 1);
    }
}

/* w (+1 for Gemma) and the bias as f32 into the call's shared scratch. */
static void norm_params(void *arg, void *shared) {
    norm_job *j = arg;
    const fi_norm_args *a = j->a;
    const int64_t h = a->hidden;
    float *w = shared, *b = (float *)((char *)shared + fi_sv_floats(h));
    const float *wl = fi_sv_load(j->isa, a->weight, 0, a->weight->stride[0], h, w);
    if (a->gemma)
        for (int64_t i = 0; i < h; i++) w[i] = 1.0f + wl[i];
    else if (wl != w)
        memcpy(w, wl, (size_t)h * sizeof *w);
    if (a->bias) {
        const float *bl = fi_sv_load(j->isa, a->bias, 0, a->bias->stride[0], h, b);
        if (bl != b) memcpy(b, bl, (size_t)h * sizeof *b);
    }
    j->w = w, j->b = b;
}

fi_status fi_cpu_norm(fi_context *ctx, const fi_norm_args *a, void *stream) {
    (void)stream;
    norm_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx), NULL, NULL, a->hidden};
    int64_t bytes = a->rows * a->hidden * (a->residual ? 8 : 4);
    return fi_sv_parallel_rows(ctx, a->rows, bytes, 2 * fi_sv_floats(a->hidden), norm_params,
                               norm_scratch(a->hidden), norm_rows, &j);
}

/* ---------------------------------------------------------- activations */

/* Elements of a row per step: three f32 chunks of scratch. */
#define ACT_CHUNK 2048

typedef struct act_job {
    const fi_act_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
} act_job;

static void act_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const act_job *j = arg;
    const fi_act_args *a = j->a;
    float *ga = scratch, *ub = ga + ACT_CHUNK, *yc = ub + ACT_CHUNK;
    const fi_tensor *in = a->input, *out = a->out;
    const int64_t is = in->stride[in->ndim - 1], os = out->stride[out->ndim - 1];
    /* contiguous bf16 rows go straight through the bf16 kernel */
    const bool bf16 = in->dtype == FI_DTYPE_BF16 && out->dtype == FI_DTYPE_BF16 && is == 1 &&
                      os == 1;
    for (int64_t r = begin; r < end; r++) {
        const int64_t io = fi_row_offset(in, r), oo = fi_row_offset(out, r);
        if (bf16) {
            j->k->act_bf16((int)a->kind, (uint16_t *)out->data + oo,
                           (const uint16_t *)in->data + io,
                           (const uint16_t *)in->data + io + a->dim, a->dim);
            continue;
        }
        for (int64_t c0 = 0; c0 < a->dim; c0 += ACT_CHUNK) {
            int64_t n = a->dim - c0 < ACT_CHUNK ? a->dim - c0 : ACT_CHUNK;
            const float *g = fi_sv_load(j->isa, in, io + c0 * is, is, n, ga);
            const float *u = fi_sv_load(j->isa, in, io + (a->dim + c0) * is, is, n, ub);
            float *y = fi_sv_dest(out, oo + c0 * os, os, yc);
            j->k->act((int)a->kind, y, g, u, n);
            fi_sv_store(j->isa, out, oo + c0 * os, os, y, n);
        }
    }
}

fi_status fi_cpu_gated_act(fi_context *ctx, const fi_act_args *a, void *stream) {
    (void)stream;
    act_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx)};
    int64_t bytes = a->rows * a->dim * 12;
    return fi_sv_parallel_rows(ctx, a->rows, bytes, 0, NULL, 3 * ACT_CHUNK * sizeof(float),
                               act_rows, &j);
}

/* ---------------------------------------------------- RoPE from a cache */

typedef struct rope_cache_job {
    const fi_rope_cache_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
    int64_t dim, rot;
    const float *qw, *kw; /* [dim] f32 (1 + w for Gemma); NULL: no norm */
} rope_cache_job;

/* Rotate head h of token t of `in` into `out` by cos c, sin s [rot / 2],
 * RMS-normalised by w first when w is not NULL (into n: the f32 values
 * that turn, rounded once at the store). */
static void rope_cache_head(const rope_cache_job *j, const fi_tensor *in, const fi_tensor *out,
                            const float *w, int64_t t, int64_t h, const float *c, const float *s,
                            float *x, float *y, float *n) {
    const int64_t io = t * in->stride[0] + h * in->stride[1];
    const int64_t oo = t * out->stride[0] + h * out->stride[1];
    const float *v = fi_sv_load(j->isa, in, io, in->stride[2], j->dim, x);
    if (w) {
        const float rstd = 1.0f / sqrtf(j->k->sum_sq(v, j->dim) / (float)j->dim + j->a->eps);
        j->k->rms_apply(n, v, w, rstd, j->dim);
        v = n;
    }
    j->k->rotate(y, v, c, s, j->rot / 2, j->a->neox);
    for (int64_t i = j->rot; i < j->dim; i++) y[i] = v[i];
    fi_sv_store(j->isa, out, oo, out->stride[2], y, j->dim);
}

static void rope_cache_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const rope_cache_job *j = arg;
    const fi_rope_cache_args *a = j->a;
    const size_t row = fi_sv_floats(j->dim);
    float *x = scratch, *y = (float *)((char *)scratch + row);
    float *n = (float *)((char *)scratch + 2 * row);
    float *cs = (float *)((char *)scratch + 3 * row);
    const fi_tensor *cache = a->cache;
    for (int64_t t = begin; t < end; t++) {
        int64_t p = ((const int32_t *)a->positions->data)[t * a->positions->stride[0]];
        const float *crow =
            fi_sv_load(j->isa, cache, p * cache->stride[0], cache->stride[1], j->rot, cs);
        const float *c = crow, *s = crow + j->rot / 2;
        for (int64_t h = 0; h < a->q->shape[1]; h++)
            rope_cache_head(j, a->q, a->q_out, j->qw, t, h, c, s, x, y, n);
        for (int64_t h = 0; h < a->k->shape[1]; h++)
            rope_cache_head(j, a->k, a->k_out, j->kw, t, h, c, s, x, y, n);
    }
}

/* q_w and k_w (+1 for Gemma) as f32 into the call's shared scratch. */
static void rope_cache_weights(void *arg, void *shared) {
    rope_cache_job *j = arg;
    const fi_rope_cache_args *a = j->a;
    const fi_tensor *src[2] = {a->q_w, a->k_w};
    float *dst[2] = {shared, (float *)((char *)shared + fi_sv_floats(j->dim))};
    for (int i = 0; i < 2; i++) {
        const float *wl = fi_sv_load(j->isa, src[i], 0, src[i]->stride[0], j->dim, dst[i]);
        for (int64_t d = 0; d < j->dim; d++) dst[i][d] = a->gemma ? 1.0f + wl[d] : wl[d];
    }
    j->qw = dst[0], j->kw = dst[1];
}

fi_status fi_cpu_rope_cos_sin(fi_context *ctx, const fi_rope_cache_args *a, void *stream) {
    (void)stream;
    rope_cache_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx), a->q->shape[2],
                        a->cache->shape[1], NULL, NULL};
    const int64_t nnz = a->q->shape[0];
    const int64_t bytes = 4 * nnz * j.dim * (a->q->shape[1] + a->k->shape[1]);
    const bool norm = a->q_w != NULL;
    return fi_sv_parallel_rows(ctx, nnz, bytes, norm ? 2 * fi_sv_floats(j.dim) : 0,
                               norm ? rope_cache_weights : NULL,
                               3 * fi_sv_floats(j.dim) + fi_sv_floats(j.rot), rope_cache_rows, &j);
}
