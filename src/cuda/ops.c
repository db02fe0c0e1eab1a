/*
 * ops.c — the standalone ops on CUDA: merge_state(s), append_paged_kv_cache
 * and RoPE. The core (src/core/ops.c) has checked shapes, dtypes and
 * aliasing; index values live on the device and are checked by the kernels
 * (a bad one skips its token, see kernels/ops.cuh). Each call resolves its
 * kernel configuration (dtypes, form, and whether rows allow 16-byte vector
 * access) to a spec, gets the function through the JIT (memory cache, disk
 * cache or NVRTC: src/cuda/jit.c), and launches it on the caller's stream.
 *
 * Graph capture: a launch allocates nothing and never synchronises, so a
 * call can be captured. The first call of a configuration in a context
 * compiles or loads its module; when that first call happens inside a
 * capture, the load runs with the thread's capture mode relaxed (as
 * run.c's upload wait does), so it is still legal.
 */
#include "cuda/cuda_ops.h"

#include "../../kernels/ops_args.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ specs */

static void spec_begin(fi_kernel_spec *s, int kind) {
    memset(s, 0, sizeof *s);
    s->entry_file = "ops.cuh";
    fi_cuda_spec_define(s, "-DFI_OPS_KIND=%d", kind);
}

/* fi_ops_merge_a2b2o2_m0_v1 */
void fi_cuda_ops_merge_spec(int va, int vb, int vo, int mask, int vec, fi_kernel_spec *s) {
    spec_begin(s, 1);
    snprintf(s->name, sizeof s->name, "fi_ops_merge_a%db%do%d_m%d_v%d", va, vb, vo, mask != 0,
             vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_VA=%d", va);
    fi_cuda_spec_define(s, "-DFI_OPS_VB=%d", vb);
    fi_cuda_spec_define(s, "-DFI_OPS_VO=%d", vo);
    fi_cuda_spec_define(s, "-DFI_OPS_MASK=%d", mask != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_VEC=%d", vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_NAME=%s", s->name);
}

/* fi_ops_merge_n_v2o2_v1 */
void fi_cuda_ops_merge_n_spec(int v, int vo, int vec, fi_kernel_spec *s) {
    spec_begin(s, 2);
    snprintf(s->name, sizeof s->name, "fi_ops_merge_n_v%do%d_v%d", v, vo, vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_VA=%d", v);
    fi_cuda_spec_define(s, "-DFI_OPS_VO=%d", vo);
    fi_cuda_spec_define(s, "-DFI_OPS_VEC=%d", vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_NAME=%s", s->name);
}

/* fi_ops_append_e2_v1 (values are copied as bits: only their size matters) */
void fi_cuda_ops_append_spec(int elem_bytes, int vec, fi_kernel_spec *s) {
    spec_begin(s, 3);
    snprintf(s->name, sizeof s->name, "fi_ops_append_e%d_v%d", elem_bytes, vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_ES=%d", elem_bytes);
    fi_cuda_spec_define(s, "-DFI_OPS_VEC=%d", vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_NAME=%s", s->name);
}

/* fi_ops_rope_q2k2_halves_indptr_v1 */
void fi_cuda_ops_rope_spec(int qt, int kt, int interleave, int pos_ids, int vec,
                           fi_kernel_spec *s) {
    spec_begin(s, 4);
    snprintf(s->name, sizeof s->name, "fi_ops_rope_q%dk%d_%s_%s_v%d", qt, kt,
             interleave ? "pairs" : "halves", pos_ids ? "posids" : "indptr", vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_QT=%d", qt);
    fi_cuda_spec_define(s, "-DFI_OPS_KT=%d", kt);
    fi_cuda_spec_define(s, "-DFI_OPS_INTER=%d", interleave != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_POSIDS=%d", pos_ids != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_VEC=%d", vec != 0);
    fi_cuda_spec_define(s, "-DFI_OPS_NAME=%s", s->name);
}

enum { F32 = FI_DTYPE_F32, F16 = FI_DTYPE_F16, BF16 = FI_DTYPE_BF16 };

/* kind, then the spec function's arguments */
static const int ci_specs[][6] = {
    {1, BF16, BF16, BF16, 0, 1}, {1, F16, F16, F16, 1, 1}, {1, F32, F32, F32, 0, 0},
    {1, F32, BF16, F16, 1, 0},   {1, F32, F32, BF16, 0, 1},
    {2, BF16, BF16, 1, 0, 0},    {2, F32, F16, 1, 0, 0},   {2, F16, F32, 0, 0, 0},
    {2, BF16, BF16, 0, 0, 0},
    {3, 1, 1, 0, 0, 0}, {3, 2, 1, 0, 0, 0}, {3, 4, 1, 0, 0, 0},
    {3, 1, 0, 0, 0, 0}, {3, 2, 0, 0, 0, 0}, {3, 4, 0, 0, 0, 0},
    {4, BF16, BF16, 0, 0, 1}, {4, F16, F16, 1, 1, 1}, {4, F32, F32, 0, 1, 1},
    {4, BF16, BF16, 1, 0, 1}, {4, F16, BF16, 0, 0, 0}, {4, F32, F32, 1, 1, 0},
    {4, BF16, F32, 1, 0, 0},  {4, F16, F16, 0, 1, 0},
};

int fi_cuda_ops_num_ci_specs(void) { return (int)(sizeof ci_specs / sizeof ci_specs[0]); }

void fi_cuda_ops_ci_spec(int i, fi_kernel_spec *s) {
    const int *c = ci_specs[i];
    switch (c[0]) {
    case 1: fi_cuda_ops_merge_spec(c[1], c[2], c[3], c[4], c[5], s); break;
    case 2: fi_cuda_ops_merge_n_spec(c[1], c[2], c[3], s); break;
    case 3: fi_cuda_ops_append_spec(c[1], c[2], s); break;
    default: fi_cuda_ops_rope_spec(c[1], c[2], c[3], c[4], c[5], s); break;
    }
}

/* -------------------------------------------------------------- helpers */

static int64_t bstride(const fi_tensor *t, int d) {
    return t->stride[d] * (int64_t)fi_dtype_size(t->dtype);
}

/* Rows along dim `last` contiguous, and every row starting 16-byte aligned
 * (dims of extent 1 never move the address, so their strides are free). */
static bool rows_vec_ok(const fi_tensor *t, int last) {
    int64_t es = (int64_t)fi_dtype_size(t->dtype);
    if ((uintptr_t)t->data % 16) return false;
    if (t->shape[last] > 1 && t->stride[last] != 1) return false;
    for (int d = 0; d < t->ndim; d++)
        if (d != last && t->shape[d] > 1 && (t->stride[d] * es) % 16) return false;
    return true;
}

/* log2 of the threads per unit: the smallest power of two covering `units`
 * chunks, at most a warp. */
static int tpr_log2_for(int64_t units) {
    int k = 0;
    while (k < 5 && ((int64_t)1 << k) < units) k++;
    return k;
}

static fi_status too_large(const char *fn, const char *what, int64_t v) {
    return fi_error(FI_STATUS_UNSUPPORTED, "%s: %s=%lld is too large for the CUDA kernels", fn,
                    what, (long long)v);
}

/* JIT (relaxed capture mode if the stream is capturing), then launch `rows`
 * units with 2^tpr_log2 threads each. The context is current. */
static fi_status launch_current(fi_cuda_ctx *cc, const fi_kernel_spec *spec, int64_t rows,
                                int tpr_log2, void *args, CUstream stream) {
    const fi_cu_api *cu = cc->cu;
    int capturing = FI_CU_CAPTURE_NONE;
    FI_CU(cu, StreamIsCapturing, stream, &capturing);
    CUfunction fn = NULL;
    fi_status st;
    if (capturing != FI_CU_CAPTURE_NONE) {
        int mode = FI_CU_CAPTURE_MODE_RELAXED;
        FI_CU(cu, ThreadExchangeStreamCaptureMode, &mode);
        st = fi_cuda_jit_function(cc, spec, &fn);
        CUresult r = cu->ThreadExchangeStreamCaptureMode(&mode);
        if (st == FI_OK && r != 0) st = fi_cu_error(cu, "cuThreadExchangeStreamCaptureMode", r);
    } else {
        st = fi_cuda_jit_function(cc, spec, &fn);
    }
    if (st) return st;
    const int64_t per_block = 128 >> tpr_log2;
    int64_t blocks = (rows + per_block - 1) / per_block;
    const int64_t cap = (int64_t)(cc->sm_count > 0 ? cc->sm_count : 1) * 16;
    if (blocks > cap) blocks = cap; /* the kernels stride over the rest */
    void *params[] = {args};
    FI_CU(cu, LaunchKernel, fn, (unsigned)blocks, 1, 1, 128, 1, 1, 0, stream, params, NULL);
    return FI_OK;
}

static fi_status launch(fi_context *ctx, const fi_kernel_spec *spec, int64_t rows, int tpr_log2,
                        void *args, void *stream) {
    if (rows <= 0) return FI_OK;
    fi_cuda_ctx *cc = ctx->backend_state;
    fi_status st = fi_cuda_push(cc);
    if (st) return st;
    st = launch_current(cc, spec, rows, tpr_log2, args, (CUstream)stream);
    fi_cuda_pop(cc);
    return st;
}

/* ---------------------------------------------------------------- merge */

static fi_status merge2(fi_context *ctx, const fi_tensor *va, const fi_tensor *sa,
                        const fi_tensor *vb, const fi_tensor *sb, const fi_tensor *vo,
                        const fi_tensor *so, const fi_tensor *mask, void *stream) {
    const int64_t n = va->shape[0], heads = va->shape[1], dim = va->shape[2];
    if (heads > INT32_MAX) return too_large("fi_merge_state", "heads", heads);
    fi_ops_merge_args a;
    memset(&a, 0, sizeof a);
    a.va = va->data, a.vb = vb->data, a.vo = vo->data;
    a.sa = sa->data, a.sb = sb->data, a.so = so->data;
    a.mask = mask ? mask->data : NULL;
    a.va_tok = bstride(va, 0), a.va_head = bstride(va, 1), a.va_dim = bstride(va, 2);
    a.vb_tok = bstride(vb, 0), a.vb_head = bstride(vb, 1), a.vb_dim = bstride(vb, 2);
    a.vo_tok = bstride(vo, 0), a.vo_head = bstride(vo, 1), a.vo_dim = bstride(vo, 2);
    a.sa_tok = sa->stride[0], a.sa_head = sa->stride[1];
    a.sb_tok = sb->stride[0], a.sb_head = sb->stride[1];
    a.so_tok = so->stride[0], a.so_head = so->stride[1];
    a.mask_stride = mask ? mask->stride[0] : 0;
    a.rows = n * heads;
    a.heads = (int32_t)heads;
    a.dim = (int32_t)dim;
    bool vec = dim % 8 == 0 && rows_vec_ok(va, 2) && rows_vec_ok(vb, 2) && rows_vec_ok(vo, 2);
    a.tpr_log2 = tpr_log2_for(vec ? dim / 8 : dim);
    fi_kernel_spec spec;
    fi_cuda_ops_merge_spec((int)va->dtype, (int)vb->dtype, (int)vo->dtype, mask != NULL, vec,
                           &spec);
    return launch(ctx, &spec, a.rows, a.tpr_log2, &a, stream);
}

fi_status fi_cuda_merge_state(fi_context *ctx, const fi_tensor *v_a, const fi_tensor *s_a,
                              const fi_tensor *v_b, const fi_tensor *s_b, fi_tensor *v_out,
                              fi_tensor *s_out, void *stream) {
    return merge2(ctx, v_a, s_a, v_b, s_b, v_out, s_out, NULL, stream);
}

fi_status fi_cuda_merge_state_in_place(fi_context *ctx, fi_tensor *v, fi_tensor *s,
                                       const fi_tensor *v_other, const fi_tensor *s_other,
                                       const fi_tensor *mask, void *stream) {
    return merge2(ctx, v, s, v_other, s_other, v, s, (mask && mask->data) ? mask : NULL, stream);
}

fi_status fi_cuda_merge_states(fi_context *ctx, const fi_tensor *v, const fi_tensor *s,
                               fi_tensor *v_out, fi_tensor *s_out, void *stream) {
    const int64_t n = v->shape[0], states = v->shape[1], heads = v->shape[2], dim = v->shape[3];
    if (heads > INT32_MAX) return too_large("fi_merge_states", "heads", heads);
    if (states > INT32_MAX) return too_large("fi_merge_states", "num_states", states);
    fi_ops_merge_args a;
    memset(&a, 0, sizeof a);
    a.va = v->data, a.vo = v_out->data;
    a.sa = s->data, a.so = s_out->data;
    a.va_tok = bstride(v, 0), a.va_state = bstride(v, 1), a.va_head = bstride(v, 2);
    a.va_dim = bstride(v, 3);
    a.vo_tok = bstride(v_out, 0), a.vo_head = bstride(v_out, 1), a.vo_dim = bstride(v_out, 2);
    a.sa_tok = s->stride[0], a.sa_state = s->stride[1], a.sa_head = s->stride[2];
    a.so_tok = s_out->stride[0], a.so_head = s_out->stride[1];
    a.rows = n * heads;
    a.heads = (int32_t)heads;
    a.dim = (int32_t)dim;
    a.states = (int32_t)states;
    bool vec = dim % 8 == 0 && rows_vec_ok(v, 3) && rows_vec_ok(v_out, 2);
    a.tpr_log2 = tpr_log2_for(vec ? dim / 8 : dim);
    fi_kernel_spec spec;
    fi_cuda_ops_merge_n_spec((int)v->dtype, (int)v_out->dtype, vec, &spec);
    return launch(ctx, &spec, a.rows, a.tpr_log2, &a, stream);
}

/* --------------------------------------------------------------- append */

static int32_t clamp_i32(int64_t v) { return v > INT32_MAX ? INT32_MAX : (int32_t)v; }

fi_status fi_cuda_append_paged_kv_cache(
    fi_context *ctx, const fi_tensor *append_k, const fi_tensor *append_v,
    const fi_tensor *batch_indices, const fi_tensor *positions, fi_tensor *k_cache,
    fi_tensor *v_cache, fi_kv_layout layout, const fi_tensor *kv_indices,
    const fi_tensor *kv_indptr, const fi_tensor *kv_last_page_len, void *stream) {
    const int64_t nnz = append_k->shape[0], heads = append_k->shape[1];
    const int64_t dk = append_k->shape[2], dv = append_v->shape[2];
    if (heads > INT32_MAX) return too_large("fi_append_paged_kv_cache", "heads", heads);
    if (dk > INT32_MAX || dv > INT32_MAX)
        return too_large("fi_append_paged_kv_cache", "head dim", dk > dv ? dk : dv);
    const bool nhd = layout == FI_KV_LAYOUT_NHD;
    fi_ops_append_args a;
    memset(&a, 0, sizeof a);
    a.ak = append_k->data, a.av = append_v->data;
    a.kc = k_cache->data, a.vc = v_cache->data;
    a.batch = batch_indices->data, a.pos = positions->data;
    a.indices = kv_indices->data, a.indptr = kv_indptr->data, a.last = kv_last_page_len->data;
    a.ak_tok = bstride(append_k, 0), a.ak_head = bstride(append_k, 1);
    a.ak_dim = bstride(append_k, 2);
    a.av_tok = bstride(append_v, 0), a.av_head = bstride(append_v, 1);
    a.av_dim = bstride(append_v, 2);
    a.kc_page = bstride(k_cache, 0), a.kc_slot = bstride(k_cache, nhd ? 1 : 2);
    a.kc_head = bstride(k_cache, nhd ? 2 : 1), a.kc_dim = bstride(k_cache, 3);
    a.vc_page = bstride(v_cache, 0), a.vc_slot = bstride(v_cache, nhd ? 1 : 2);
    a.vc_head = bstride(v_cache, nhd ? 2 : 1), a.vc_dim = bstride(v_cache, 3);
    a.rows = nnz * heads;
    a.heads = (int32_t)heads;
    a.dim_k = (int32_t)dk, a.dim_v = (int32_t)dv;
    a.page_size = (int32_t)k_cache->shape[nhd ? 1 : 2];
    a.batch_size = (int32_t)(kv_indptr->shape[0] - 1);
    a.num_indices = clamp_i32(kv_indices->shape[0]); /* ids past int32 cannot be named */
    a.num_pages = clamp_i32(k_cache->shape[0]);
    const int64_t es = (int64_t)fi_dtype_size(append_k->dtype);
    bool vec = (dk * es) % 16 == 0 && (dv * es) % 16 == 0 && rows_vec_ok(append_k, 2) &&
               rows_vec_ok(append_v, 2) && rows_vec_ok(k_cache, 3) && rows_vec_ok(v_cache, 3);
    const int64_t dmax = dk > dv ? dk : dv;
    a.tpr_log2 = tpr_log2_for(vec ? dmax * es / 16 : dmax);
    fi_kernel_spec spec;
    fi_cuda_ops_append_spec((int)es, vec, &spec);
    return launch(ctx, &spec, a.rows, a.tpr_log2, &a, stream);
}

/* ----------------------------------------------------------------- RoPE */

fi_status fi_cuda_rope(fi_context *ctx, const fi_rope_params *params, const fi_tensor *q,
                       const fi_tensor *k, fi_tensor *q_out, fi_tensor *k_out,
                       const fi_tensor *pos_ids, const fi_tensor *indptr,
                       const fi_tensor *offsets, void *stream) {
    const char *fn = pos_ids ? "fi_rope_apply_pos_ids" : "fi_rope_apply";
    const int64_t nnz = q->shape[0], hq = q->shape[1], hk = k->shape[1], dim = q->shape[2];
    if (hq + hk > INT32_MAX) return too_large(fn, "heads", hq + hk);
    const int32_t rd = params->rotary_dim ? params->rotary_dim : (int32_t)dim;
    const int inter = params->interleave != 0;
    fi_ops_rope_args a;
    memset(&a, 0, sizeof a);
    a.q = q->data, a.k = k->data, a.qo = q_out->data, a.ko = k_out->data;
    a.pos_ids = pos_ids ? pos_ids->data : NULL;
    a.indptr = pos_ids ? NULL : indptr->data;
    a.offsets = pos_ids ? NULL : offsets->data;
    a.q_tok = bstride(q, 0), a.q_head = bstride(q, 1), a.q_dim = bstride(q, 2);
    a.k_tok = bstride(k, 0), a.k_head = bstride(k, 1), a.k_dim = bstride(k, 2);
    a.qo_tok = bstride(q_out, 0), a.qo_head = bstride(q_out, 1), a.qo_dim = bstride(q_out, 2);
    a.ko_tok = bstride(k_out, 0), a.ko_head = bstride(k_out, 1), a.ko_dim = bstride(k_out, 2);
    a.nnz = nnz;
    a.rope_theta = params->rope_theta;
    a.rope_scale = params->rope_scale;
    a.low_freq_factor = params->low_freq_factor;
    a.high_freq_factor = params->high_freq_factor;
    a.old_context_len = params->old_context_len;
    a.heads_q = (int32_t)hq, a.heads_k = (int32_t)hk;
    const int32_t heads = (int32_t)(hq + hk);
    /* up to 8 heads per unit share its cos/sin */
    a.heads_per_unit = heads < 8 ? (heads > 0 ? heads : 1) : 8;
    a.chunks = (heads + a.heads_per_unit - 1) / a.heads_per_unit;
    a.rows = nnz * a.chunks;
    a.dim = (int32_t)dim;
    a.rotary_dim = rd;
    a.batch = pos_ids ? 0 : (int32_t)offsets->shape[0];
    a.llama31 = params->llama31 != 0;
    a.copy_tail_q = q_out->data != q->data;
    a.copy_tail_k = k_out->data != k->data;
    bool vec = dim % 8 == 0 && rd % (inter ? 8 : 16) == 0 && rows_vec_ok(q, 2) &&
               rows_vec_ok(k, 2) && rows_vec_ok(q_out, 2) && rows_vec_ok(k_out, 2);
    const int64_t pv = vec ? (inter ? 4 : 8) : 1, tv = vec ? 8 : 1;
    a.tpr_log2 = tpr_log2_for(rd / 2 / pv + (dim - rd) / tv);
    fi_kernel_spec spec;
    fi_cuda_ops_rope_spec((int)q->dtype, (int)k->dtype, inter, pos_ids != NULL, vec, &spec);
    return launch(ctx, &spec, a.rows, a.tpr_log2, &a, stream);
}
