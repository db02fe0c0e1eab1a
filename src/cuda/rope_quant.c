/*
 * rope_quant.c — RoPE + FP8 quantize (+ paged append) on CUDA
 * (kernels/rope_quant.cuh): the core's segments (core/serving.h) turned
 * into the kernel's byte strides and units, the configuration (input and
 * FP8 dtypes, NeoX or GPT-J pairs, whether every row allows vector access)
 * resolved to a spec, and one launch on the caller's stream through the
 * serving ops' launcher (graph-safe: nothing allocated or synchronised).
 * Index values live on the device and are checked by the kernel.
 */
#include "cuda/cuda_ops.h"

#include "../../kernels/rope_quant_args.h"

#include <stdio.h>
#include <string.h>

/* fi_rq_x2o3_neox_v1 */
void fi_cuda_rq_spec(int xt, int ot, int neox, int vec, fi_kernel_spec *s) {
    memset(s, 0, sizeof *s);
    s->entry_file = "rope_quant.cuh";
    snprintf(s->name, sizeof s->name, "fi_rq_x%do%d_%s_v%d", xt, ot, neox ? "neox" : "gptj",
             vec != 0);
    fi_cuda_spec_define(s, "-DFI_RQ_XT=%d", xt);
    fi_cuda_spec_define(s, "-DFI_RQ_OT=%d", ot);
    fi_cuda_spec_define(s, "-DFI_RQ_NEOX=%d", neox != 0);
    fi_cuda_spec_define(s, "-DFI_RQ_VEC=%d", vec != 0);
    fi_cuda_spec_define(s, "-DFI_RQ_NAME=%s", s->name);
}

/* every input dtype, both FP8 dtypes, both pair forms, both paths */
static const int ci_specs[][4] = {
    {FI_DTYPE_BF16, FI_DTYPE_E4M3, 1, 1}, {FI_DTYPE_F16, FI_DTYPE_E4M3, 1, 1},
    {FI_DTYPE_BF16, FI_DTYPE_E5M2, 0, 1}, {FI_DTYPE_F32, FI_DTYPE_E4M3, 1, 0},
    {FI_DTYPE_F16, FI_DTYPE_E5M2, 0, 0},  {FI_DTYPE_F32, FI_DTYPE_E5M2, 1, 1},
};

int fi_cuda_rq_num_ci_specs(void) { return (int)(sizeof ci_specs / sizeof ci_specs[0]); }

void fi_cuda_rq_ci_spec(int i, fi_kernel_spec *s) {
    fi_cuda_rq_spec(ci_specs[i][0], ci_specs[i][1], ci_specs[i][2], ci_specs[i][3], s);
}

static fi_status too_large(const char *what, int64_t v) {
    return fi_error(FI_STATUS_UNSUPPORTED,
                    "fi_rope_quantize_fp8: %s=%lld is too large for the CUDA kernel", what,
                    (long long)v);
}

static int32_t clamp_i32(int64_t v) { return v > INT32_MAX ? INT32_MAX : (int32_t)v; }

/* The kernel's form of segment s; *vec cleared where its rows cannot take
 * units of 8 elements. */
static fi_status kernel_seg(const fi_rq_args *a, const fi_rq_seg *s, fi_rq_kseg *k, bool *vec) {
    const fi_tensor *x = &s->src, *d = &s->dst;
    const int dl = d->ndim - 1;
    const int64_t heads = x->shape[1], width = x->shape[2];
    if (heads > INT32_MAX) return too_large("heads", heads);
    if (width > INT32_MAX / 2) return too_large("head dim", width);
    const bool paged = a->append && d->ndim == 4;
    k->src = x->data, k->dst = d->data;
    k->s_tok = fi_cuda_sv_bstride(x, 0), k->s_head = fi_cuda_sv_bstride(x, 1);
    k->s_col = fi_cuda_sv_bstride(x, 2);
    k->d_row = fi_cuda_sv_bstride(d, 0), k->d_slot = paged ? fi_cuda_sv_bstride(d, 1) : 0;
    k->d_head = fi_cuda_sv_bstride(d, dl - 1), k->d_col = fi_cuda_sv_bstride(d, dl);
    k->heads = (int32_t)heads, k->width = (int32_t)width;
    k->rope = s->rope, k->paged = paged;
    k->scale = s->scale;
    const int64_t in_align = 8 * (int64_t)fi_dtype_size(x->dtype) < 16
                                 ? 8 * (int64_t)fi_dtype_size(x->dtype)
                                 : 16;
    const int64_t unit = s->rope && a->neox ? 16 : 8;
    if (width % unit || !fi_cuda_sv_rows_aligned(x, in_align) || !fi_cuda_sv_rows_aligned(d, 8))
        *vec = false;
    return FI_OK;
}

fi_status fi_cuda_rope_quant(fi_context *ctx, const fi_rq_args *a, void *stream) {
    fi_rq_kargs k;
    memset(&k, 0, sizeof k);
    bool vec = true;
    for (int i = 0; i < a->nseg; i++) {
        fi_status st = kernel_seg(a, &a->seg[i], &k.seg[i], &vec);
        if (st) return st;
    }
    k.nseg = a->nseg;
    int64_t units = 0;
    for (int i = 0; i < a->nseg; i++) {
        fi_rq_kseg *s = &k.seg[i];
        /* a rope unit: 8 pairs (NeoX) or 4 (GPT-J) vectorised, else a pair */
        s->upr = vec ? s->width / (s->rope && a->neox ? 16 : 8) : s->rope ? s->width / 2 : s->width;
        s->units = (int64_t)s->heads * s->upr;
        units += s->units;
    }
    k.units = units;
    const fi_tensor *c = a->cache;
    k.pos = a->pos_ids->data, k.pos_st = a->pos_ids->stride[0];
    k.cache = c->data, k.cache_row = c->stride[0], k.cache_col = c->stride[1];
    k.nnz = a->nnz, k.max_pos = c->shape[0];
    k.rot = (int32_t)a->rot;
    if (a->append) {
        k.batch = a->batch_indices->data, k.batch_st = a->batch_indices->stride[0];
        k.slot_pos = a->positions->data, k.slot_pos_st = a->positions->stride[0];
        k.indptr = a->kv_indptr->data, k.indptr_st = a->kv_indptr->stride[0];
        k.indices = a->kv_indices->data, k.indices_st = a->kv_indices->stride[0];
        k.page_size = (int32_t)a->page_size;
        k.batch_size = (int32_t)(a->kv_indptr->shape[0] - 1);
        k.num_indices = clamp_i32(a->kv_indices->shape[0]); /* ids past int32 cannot be named */
        k.num_pages = clamp_i32(a->pages);
    }
    /* the vector path: FI_RQ_UNITS units a thread, unless that leaves
     * fewer than two blocks an SM (few tokens: one unit a thread) */
    const fi_cuda_ctx *cc = ctx->backend_state;
    const int64_t sms = cc && cc->sm_count > 0 ? cc->sm_count : 1;
    int64_t gy = a->nnz < 65535 ? a->nnz : 65535, gx = (units + 255) / 256;
    if (vec && (gx + FI_RQ_UNITS - 1) / FI_RQ_UNITS * gy >= 2 * sms)
        gx = (gx + FI_RQ_UNITS - 1) / FI_RQ_UNITS;
    if (gx > 64) gx = 64;
    fi_kernel_spec spec;
    fi_cuda_rq_spec((int)a->seg[0].src.dtype, (int)a->seg[0].dst.dtype, a->neox, vec, &spec);
    return fi_cuda_sv_launch(ctx, &spec, gx, gy, 256, 1, &k, stream);
}
