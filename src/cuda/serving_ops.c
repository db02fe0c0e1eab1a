/*
 * serving_ops.c — the row-wise serving ops on CUDA: RMSNorm / LayerNorm
 * (fused residual add, Gemma weights, FP8 output), the gated activations
 * and RoPE from a cos/sin cache, with the QK RMSNorm before it
 * (kernels/serving.cuh); the serving kernels'
 * specs and the launch the sampling ops share (sampling_ops.c). The core
 * (src/core/ops_norm.c) has checked shapes, dtypes, eps, the FP8 scale and
 * aliasing; position values live on the device and are checked by the
 * kernel (a position outside the cache skips its token). Each call resolves
 * its configuration (dtypes, form, whether every row allows 16-byte vector
 * access) to a spec, gets the function through the JIT and launches it on
 * the caller's stream.
 *
 * Graph capture: a launch allocates nothing, needs no scratch and never
 * synchronises, so every call can be captured. A configuration's first
 * call in a context compiles or loads its module; inside a capture that
 * load runs with the thread's capture mode relaxed (as ops.c does).
 */
#include "cuda/cuda_ops.h"

#include "../../kernels/serving_args.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------ specs */

/* One -D option of a serving kernel: -D<key>=<val>. */
typedef struct sv_opt {
    const char *key;
    int val;
} sv_opt;

#define NOPT(o) ((int)(sizeof(o) / sizeof((o)[0])))

/* s: the kernel of family `kind` in kernels/<file> with the n options opt,
 * its entry point named by fmt. The -D come in this order (FI_SV_KIND, the
 * options, FI_SV_NAME): the JIT cache key hashes them in order. */
static void sv_spec(fi_kernel_spec *s, const char *file, int kind, const sv_opt *opt, int n,
                    const char *fmt, ...) FI_PRINTF(6, 7);
static void sv_spec(fi_kernel_spec *s, const char *file, int kind, const sv_opt *opt, int n,
                    const char *fmt, ...) {
    memset(s, 0, sizeof *s);
    s->entry_file = file;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->name, sizeof s->name, fmt, ap);
    va_end(ap);
    fi_cuda_spec_define(s, "-DFI_SV_KIND=%d", kind);
    for (int i = 0; i < n; i++) fi_cuda_spec_define(s, "-D%s=%d", opt[i].key, opt[i].val);
    fi_cuda_spec_define(s, "-DFI_SV_NAME=%s", s->name);
}

/* A dtype code in a name: its number, or n for none. */
static char code(int t) { return t < 0 ? 'n' : (char)('0' + t); }

/* fi_sv_norm_rms_x2rnw2bno2_v1 */
void fi_cuda_sv_norm_spec(fi_sv_norm_form form, int xt, int rt, int wt, int bt, int ot, int vec,
                          fi_kernel_spec *s) {
    static const char *const forms[] = {"rms", "gemma", "layer"};
    const sv_opt opt[] = {{"FI_SV_XT", xt}, {"FI_SV_RT", rt}, {"FI_SV_WT", wt},
                          {"FI_SV_BT", bt}, {"FI_SV_OT", ot},
                          {"FI_SV_LAYER", form == FI_SV_LAYER},
                          {"FI_SV_GEMMA", form == FI_SV_GEMMA}, {"FI_SV_VEC", vec != 0}};
    sv_spec(s, "serving.cuh", 1, opt, NOPT(opt), "fi_sv_norm_%s_x%dr%cw%db%co%d_v%d", forms[form],
            xt, code(rt), wt, code(bt), ot, vec != 0);
}

/* fi_sv_silu_and_mul_x2o2_v1 */
void fi_cuda_sv_act_spec(int kind, int xt, int ot, int vec, fi_kernel_spec *s) {
    static const char *const kinds[] = {"silu", "gelu", "gelu_tanh"};
    const sv_opt opt[] = {{"FI_SV_XT", xt}, {"FI_SV_OT", ot}, {"FI_SV_ACT", kind},
                          {"FI_SV_VEC", vec != 0}};
    sv_spec(s, "serving.cuh", 2, opt, NOPT(opt), "fi_sv_%s_and_mul_x%do%d_v%d", kinds[kind], xt,
            ot, vec != 0);
}

/* fi_sv_rope_cache_q2k2_neox */
void fi_cuda_sv_rope_spec(int qt, int kt, int neox, fi_kernel_spec *s) {
    const sv_opt opt[] = {{"FI_SV_QT", qt}, {"FI_SV_KT", kt}, {"FI_SV_NEOX", neox != 0}};
    sv_spec(s, "serving.cuh", 3, opt, NOPT(opt), "fi_sv_rope_cache_q%dk%d_%s", qt, kt,
            neox ? "neox" : "gptj");
}

/* fi_sv_qk_rmsnorm_rope_q2k2w2w0_neox (gemma: fi_sv_qk_gemma_rmsnorm_rope_...) */
void fi_cuda_sv_qk_norm_rope_spec(int qt, int kt, int qwt, int kwt, int gemma, int neox,
                                  fi_kernel_spec *s) {
    const sv_opt opt[] = {{"FI_SV_QT", qt},   {"FI_SV_KT", kt},
                          {"FI_SV_QWT", qwt}, {"FI_SV_KWT", kwt},
                          {"FI_SV_GEMMA", gemma != 0}, {"FI_SV_NEOX", neox != 0}};
    sv_spec(s, "serving.cuh", 9, opt, NOPT(opt), "fi_sv_qk_%srmsnorm_rope_q%dk%dw%dw%d_%s",
            gemma ? "gemma_" : "", qt, kt, qwt, kwt, neox ? "neox" : "gptj");
}

/* fi_sv_softmax_x2o0 */
void fi_cuda_sv_softmax_spec(int xt, int ot, fi_kernel_spec *s) {
    const sv_opt opt[] = {{"FI_SV_XT", xt}, {"FI_SV_OT", ot}};
    sv_spec(s, "sampling.cuh", 4, opt, NOPT(opt), "fi_sv_softmax_x%do%d", xt, ot);
}

/* fi_sv_sample_probs_x0 (the filters are run-time flags) */
void fi_cuda_sv_sample_spec(int xt, int logits, fi_kernel_spec *s) {
    const sv_opt opt[] = {{"FI_SV_XT", xt}, {"FI_SV_LOGITS", logits != 0}};
    sv_spec(s, "sampling.cuh", 5, opt, NOPT(opt), "fi_sv_sample_%s_x%d",
            logits ? "logits" : "probs", xt);
}

/* fi_sv_top_k_renorm_x0o0 */
void fi_cuda_sv_filter_spec(int op, int xt, int ot, fi_kernel_spec *s) {
    static const char *const ops[] = {"top_k_renorm", "top_p_renorm", "top_k_mask"};
    const sv_opt opt[] = {{"FI_SV_XT", xt}, {"FI_SV_OT", ot}, {"FI_SV_OP", op}};
    sv_spec(s, "sampling.cuh", 6, opt, NOPT(opt), "fi_sv_%s_x%do%d", ops[op], xt, ot);
}

/* fi_sv_chain_spec_d0t0 */
void fi_cuda_sv_spec_spec(int dt, int tt, fi_kernel_spec *s) {
    const sv_opt opt[] = {{"FI_SV_XT", dt}, {"FI_SV_TT", tt}};
    sv_spec(s, "sampling.cuh", 7, opt, NOPT(opt), "fi_sv_chain_spec_d%dt%d", dt, tt);
}

/* fi_sv_top_k_x0_dense */
void fi_cuda_sv_topk_spec(int xt, int ragged, fi_kernel_spec *s) {
    const sv_opt opt[] = {{"FI_SV_XT", xt}, {"FI_SV_RAGGED", ragged != 0}};
    sv_spec(s, "sampling.cuh", 8, opt, NOPT(opt), "fi_sv_top_k_x%d_%s", xt,
            ragged ? "ragged" : "dense");
}

enum { F32 = FI_DTYPE_F32, F16 = FI_DTYPE_F16, BF16 = FI_DTYPE_BF16, E4M3 = FI_DTYPE_E4M3,
       E5M2 = FI_DTYPE_E5M2, NONE = -1 };

/* family, then the spec function's arguments: every form, dtype (in and
 * out, FP8 out), vector flag, kind and op at least once */
static const int ci_specs[][8] = {
    {1, FI_SV_RMS, BF16, NONE, BF16, NONE, BF16, 1}, {1, FI_SV_RMS, F16, NONE, F16, NONE, F32, 0},
    {1, FI_SV_RMS, F32, BF16, F16, NONE, F32, 1},    {1, FI_SV_GEMMA, BF16, BF16, BF16, NONE, BF16, 1},
    {1, FI_SV_GEMMA, F16, F16, F32, NONE, F16, 0},   {1, FI_SV_LAYER, BF16, NONE, BF16, F32, BF16, 1},
    {1, FI_SV_LAYER, F32, NONE, F16, F16, F32, 0},   {1, FI_SV_RMS, BF16, NONE, BF16, NONE, E4M3, 1},
    {1, FI_SV_RMS, F16, F16, F16, NONE, E5M2, 0},    {1, FI_SV_RMS, F32, F32, F32, NONE, E4M3, 1},
    {2, 0, BF16, BF16, 1}, {2, 1, F16, F16, 1}, {2, 2, F32, F32, 0}, {2, 0, F16, F32, 0},
    {2, 2, BF16, F16, 1},
    {3, BF16, BF16, 1}, {3, F16, F32, 0}, {3, F32, F32, 1},
    {4, F32, F32}, {4, BF16, F32}, {4, F16, BF16},
    {5, F32, 0}, {5, BF16, 1}, {5, F16, 0}, {5, F32, 1},
    {6, FI_FILTER_TOP_K_RENORM, F32, F32}, {6, FI_FILTER_TOP_P_RENORM, BF16, F16},
    {6, FI_FILTER_TOP_K_MASK, F16, F16}, {6, FI_FILTER_TOP_K_MASK, F32, F32},
    {6, FI_FILTER_TOP_K_MASK, BF16, BF16},
    {7, F32, F32}, {7, BF16, F16},
    {8, F32, 0}, {8, BF16, 1}, {8, F16, 0},
    {9, BF16, BF16, BF16, BF16, 0, 1}, {9, F16, F16, F32, F32, 1, 0},
    {9, F32, F32, F32, F32, 0, 0}, {9, BF16, F16, F32, BF16, 1, 1},
};

int fi_cuda_sv_num_ci_specs(void) { return (int)(sizeof ci_specs / sizeof ci_specs[0]); }

void fi_cuda_sv_ci_spec(int i, fi_kernel_spec *s) {
    const int *c = ci_specs[i];
    switch (c[0]) {
    case 1: fi_cuda_sv_norm_spec((fi_sv_norm_form)c[1], c[2], c[3], c[4], c[5], c[6], c[7], s); break;
    case 2: fi_cuda_sv_act_spec(c[1], c[2], c[3], c[4], s); break;
    case 3: fi_cuda_sv_rope_spec(c[1], c[2], c[3], s); break;
    case 4: fi_cuda_sv_softmax_spec(c[1], c[2], s); break;
    case 5: fi_cuda_sv_sample_spec(c[1], c[2], s); break;
    case 6: fi_cuda_sv_filter_spec(c[1], c[2], c[3], s); break;
    case 7: fi_cuda_sv_spec_spec(c[1], c[2], s); break;
    case 8: fi_cuda_sv_topk_spec(c[1], c[2], s); break;
    default: fi_cuda_sv_qk_norm_rope_spec(c[1], c[2], c[3], c[4], c[5], c[6], s); break;
    }
}

/* -------------------------------------------------------------- helpers */

int64_t fi_cuda_sv_bstride(const fi_tensor *t, int d) {
    return t->stride[d] * (int64_t)fi_dtype_size(t->dtype);
}

bool fi_cuda_sv_rows_aligned(const fi_tensor *t, int64_t align) {
    const int last = t->ndim - 1;
    if ((uintptr_t)t->data % (uintptr_t)align) return false;
    if (t->shape[last] > 1 && t->stride[last] != 1) return false;
    for (int d = 0; d < last; d++)
        if (t->shape[d] > 1 && fi_cuda_sv_bstride(t, d) % align) return false;
    return true;
}

int64_t fi_cuda_sv_row_blocks(const fi_context *ctx, int64_t rows) {
    const fi_cuda_ctx *cc = ctx->backend_state;
    const int64_t cap = 2 * (int64_t)(cc->sm_count > 0 ? cc->sm_count : 1);
    return rows < cap ? rows : cap;
}

int fi_cuda_sv_team_size(const fi_context *ctx, int64_t rows, int64_t vocab) {
    enum { MAX_TEAM = 8, BLOCK = 1024, SUMS = 1024 }; /* select.cuh's BLK and SB */
    const fi_cuda_ctx *cc = ctx->backend_state;
    if (cc->cc_major < 9 || !cc->cu->LaunchKernelEx || rows <= 0) return 1;
    const int64_t blocks = (vocab + BLOCK - 1) / BLOCK;
    /* clusters of 4 or 8 need that many free SMs of one GPC: 15 of 8 at
     * once on the H200's 132 SMs, so they fill 7/8 of the SMs */
    const int64_t fill = cc->sm_count - cc->sm_count / 8;
    int c = 1;
    while (c < MAX_TEAM && rows * 2 * c <= (c >= 2 ? fill : cc->sm_count) && 2 * c <= blocks) c *= 2;
    return (blocks + c - 1) / c <= SUMS ? c : 1;
}

fi_status fi_cuda_sv_launch(fi_context *ctx, const fi_kernel_spec *spec, int64_t gx, int64_t gy,
                            int threads, int cluster, void *args, void *stream) {
    if (gx <= 0 || gy <= 0) return FI_OK;
    fi_cuda_ctx *cc = ctx->backend_state;
    const fi_cu_api *cu = cc->cu;
    fi_status st = fi_cuda_push(cc);
    if (st) return st;
    CUstream s = (CUstream)stream;
    int capturing = FI_CU_CAPTURE_NONE;
    CUfunction fn = NULL;
    CUresult r = cu->StreamIsCapturing(s, &capturing);
    if (r) st = fi_cu_error(cu, "cuStreamIsCapturing", r);
    if (!st && capturing != FI_CU_CAPTURE_NONE) {
        int mode = FI_CU_CAPTURE_MODE_RELAXED;
        r = cu->ThreadExchangeStreamCaptureMode(&mode);
        if (r) {
            st = fi_cu_error(cu, "cuThreadExchangeStreamCaptureMode", r);
        } else {
            st = fi_cuda_jit_function(cc, spec, &fn);
            r = cu->ThreadExchangeStreamCaptureMode(&mode);
            if (!st && r) st = fi_cu_error(cu, "cuThreadExchangeStreamCaptureMode", r);
        }
    } else if (!st) {
        st = fi_cuda_jit_function(cc, spec, &fn);
    }
    if (!st) {
        void *params[] = {args};
        if (cluster > 1) {
            fi_cu_launch_attr attr;
            memset(&attr, 0, sizeof attr);
            attr.id = FI_CU_LAUNCH_CLUSTER_DIM;
            const unsigned dim[3] = {(unsigned)cluster, 1, 1};
            memcpy(attr.v.bytes, dim, sizeof dim);
            fi_cu_launch_config cfg = {(unsigned)gx, (unsigned)gy, 1, (unsigned)threads, 1, 1, 0,
                                       s, &attr, 1};
            r = cu->LaunchKernelEx(&cfg, fn, params, NULL);
            if (r) st = fi_cu_error(cu, "cuLaunchKernelEx", r);
        } else {
            r = cu->LaunchKernel(fn, (unsigned)gx, (unsigned)gy, 1, (unsigned)threads, 1, 1, 0, s,
                                 params, NULL);
            if (r) st = fi_cu_error(cu, "cuLaunchKernel", r);
        }
    }
    fi_cuda_pop(cc);
    return st;
}

static fi_status too_large(const char *fn, const char *what, int64_t v) {
    return fi_error(FI_STATUS_UNSUPPORTED, "%s: %s=%lld is too large for the CUDA kernels", fn,
                    what, (long long)v);
}

/* The leading dims of n tensors of one leading shape (t[0]'s first ndim - 1
 * dims), merged where every tensor is contiguous across them and without
 * dims of extent 1: extents into lead, each tensor's byte strides into
 * st[i]; returns how many. */
static int leading_dims(const fi_tensor *const *t, int n, int64_t *lead,
                        int64_t (*st)[FI_SV_LEAD]) {
    int k = 0;
    for (int d = 0; d + 1 < t[0]->ndim; d++) {
        if (t[0]->shape[d] == 1) continue;
        bool merge = k > 0;
        for (int i = 0; i < n && merge; i++)
            merge = st[i][k - 1] == fi_cuda_sv_bstride(t[i], d) * t[0]->shape[d];
        if (merge) {
            lead[k - 1] *= t[0]->shape[d];
            for (int i = 0; i < n; i++) st[i][k - 1] = fi_cuda_sv_bstride(t[i], d);
            continue;
        }
        lead[k] = t[0]->shape[d];
        for (int i = 0; i < n; i++) st[i][k] = fi_cuda_sv_bstride(t[i], d);
        k++;
    }
    return k;
}

/* Bytes a vector unit of 8 elements of t needs its rows aligned to. */
static int64_t unit_align(const fi_tensor *t) {
    int64_t b = 8 * (int64_t)fi_dtype_size(t->dtype);
    return b < 16 ? b : 16;
}

static bool vec_1d(const fi_tensor *t) {
    return t->stride[0] == 1 && (uintptr_t)t->data % (uintptr_t)unit_align(t) == 0;
}

/* ----------------------------------------------------------------- norms */

fi_status fi_cuda_norm(fi_context *ctx, const fi_norm_args *a, void *stream) {
    const fi_tensor *x = a->input, *res = a->residual, *o = a->out;
    if (a->hidden > INT32_MAX) return too_large("norm", "hidden", a->hidden);
    const int last = x->ndim - 1;
    fi_sv_norm_args k;
    memset(&k, 0, sizeof k);
    int64_t st[3][FI_SV_LEAD];
    const fi_tensor *ts[3] = {x, o, res};
    k.nlead = leading_dims(ts, res ? 3 : 2, k.lead, st);
    memcpy(k.x_lead, st[0], sizeof k.x_lead);
    memcpy(k.o_lead, st[1], sizeof k.o_lead);
    if (res) memcpy(k.r_lead, st[2], sizeof k.r_lead);
    k.x = x->data, k.out = o->data, k.w = a->weight->data;
    k.res = res ? res->data : NULL;
    k.b = a->bias ? a->bias->data : NULL;
    k.x_col = fi_cuda_sv_bstride(x, last), k.o_col = fi_cuda_sv_bstride(o, last);
    k.r_col = res ? fi_cuda_sv_bstride(res, last) : 0;
    k.w_col = fi_cuda_sv_bstride(a->weight, 0);
    k.b_col = a->bias ? fi_cuda_sv_bstride(a->bias, 0) : 0;
    k.rows = a->rows, k.hidden = a->hidden;
    k.eps = a->eps;
    k.inv_scale = 1.0f / a->quant_scale; /* as the CPU: y x (1 / scale) */
    const bool vec = a->hidden % 8 == 0 && fi_cuda_sv_rows_aligned(x, unit_align(x)) &&
                     fi_cuda_sv_rows_aligned(o, unit_align(o)) &&
                     (!res || fi_cuda_sv_rows_aligned(res, unit_align(res))) &&
                     vec_1d(a->weight) && (!a->bias || vec_1d(a->bias));
    /* threads per row: a power of two giving each at most the values it
     * keeps in registers (kernels/serving.cuh: 2 units of 8, or 8), up to
     * 1024; more (each keeping fewer) while the rows would not fill the
     * GPU's resident threads, so a small batch has more loads in flight */
    const fi_cuda_ctx *cc = ctx->backend_state;
    const int64_t sms = cc->sm_count > 0 ? cc->sm_count : 1;
    const int64_t units = vec ? a->hidden / 8 : a->hidden, per_thread = vec ? 2 : 8;
    int group = 32;
    while (group < 1024 && (int64_t)group * per_thread < units) group <<= 1;
    while (group < 1024 && group < units && a->rows * group < sms * 1024) group <<= 1;
    k.group = group;
    const int threads = group > 32 ? group : 256;
    int64_t blocks = (a->rows + threads / group - 1) / (threads / group);
    /* one resident wave (64 registers a thread: 1024 threads per SM): its
     * blocks stride over the rest, loading each next row ahead */
    const int64_t cap = sms * (1024 / threads);
    if (blocks > cap) blocks = cap;
    const fi_sv_norm_form form =
        a->kind == FI_NORM_LAYER ? FI_SV_LAYER : a->gemma ? FI_SV_GEMMA : FI_SV_RMS;
    fi_kernel_spec spec;
    fi_cuda_sv_norm_spec(form, (int)x->dtype, res ? (int)res->dtype : -1, (int)a->weight->dtype,
                         a->bias ? (int)a->bias->dtype : -1, (int)o->dtype, vec, &spec);
    return fi_cuda_sv_launch(ctx, &spec, blocks, 1, threads, 1, &k, stream);
}

/* ----------------------------------------------------------- activations */

fi_status fi_cuda_gated_act(fi_context *ctx, const fi_act_args *a, void *stream) {
    const fi_tensor *x = a->input, *o = a->out;
    const int last = x->ndim - 1;
    fi_sv_act_args k;
    memset(&k, 0, sizeof k);
    int64_t st[2][FI_SV_LEAD];
    const fi_tensor *ts[2] = {x, o};
    k.nlead = leading_dims(ts, 2, k.lead, st);
    memcpy(k.x_lead, st[0], sizeof k.x_lead);
    memcpy(k.o_lead, st[1], sizeof k.o_lead);
    k.x = x->data, k.out = o->data;
    k.x_col = fi_cuda_sv_bstride(x, last), k.o_col = fi_cuda_sv_bstride(o, last);
    k.rows = a->rows, k.dim = a->dim;
    const bool vec = a->dim % 8 == 0 && fi_cuda_sv_rows_aligned(x, unit_align(x)) &&
                     fi_cuda_sv_rows_aligned(o, unit_align(o));
    const int64_t units = vec ? a->dim / 8 : a->dim;
    int64_t gx = (units + 255) / 256, gy = a->rows < 65535 ? a->rows : 65535;
    if (gx > 64) gx = 64;
    fi_kernel_spec spec;
    fi_cuda_sv_act_spec((int)a->kind, (int)x->dtype, (int)o->dtype, vec, &spec);
    return fi_cuda_sv_launch(ctx, &spec, gx, gy, 256, 1, &k, stream);
}

/* ------------------------------------------------------ RoPE from a cache */

fi_status fi_cuda_rope_cos_sin(fi_context *ctx, const fi_rope_cache_args *a, void *stream) {
    const char *fn = a->q_w ? "fi_qk_rmsnorm_rope" : "fi_rope_apply_cos_sin_cache";
    const fi_tensor *q = a->q, *kt = a->k, *qo = a->q_out, *ko = a->k_out, *c = a->cache;
    const int64_t hq = q->shape[1], hk = kt->shape[1], dim = q->shape[2];
    if (hq > INT32_MAX || hk > INT32_MAX) return too_large(fn, "heads", hq > hk ? hq : hk);
    if (dim > INT32_MAX) return too_large(fn, "head_dim", dim);
    fi_sv_rope_args k;
    memset(&k, 0, sizeof k);
    k.q = q->data, k.k = kt->data, k.qo = qo->data, k.ko = ko->data;
    k.pos = a->positions->data, k.cache = c->data;
    k.q_tok = fi_cuda_sv_bstride(q, 0), k.q_head = fi_cuda_sv_bstride(q, 1);
    k.q_dim = fi_cuda_sv_bstride(q, 2);
    k.k_tok = fi_cuda_sv_bstride(kt, 0), k.k_head = fi_cuda_sv_bstride(kt, 1);
    k.k_dim = fi_cuda_sv_bstride(kt, 2);
    k.qo_tok = fi_cuda_sv_bstride(qo, 0), k.qo_head = fi_cuda_sv_bstride(qo, 1);
    k.qo_dim = fi_cuda_sv_bstride(qo, 2);
    k.ko_tok = fi_cuda_sv_bstride(ko, 0), k.ko_head = fi_cuda_sv_bstride(ko, 1);
    k.ko_dim = fi_cuda_sv_bstride(ko, 2);
    k.pos_st = a->positions->stride[0];
    k.cache_row = c->stride[0], k.cache_col = c->stride[1];
    k.nnz = q->shape[0], k.max_pos = c->shape[0];
    k.heads_q = (int32_t)hq, k.heads_k = (int32_t)hk;
    k.dim = (int32_t)dim, k.rot = (int32_t)c->shape[1];
    k.copy_tail_q = qo->data != q->data; /* in place: the same view (core-checked) */
    k.copy_tail_k = ko->data != kt->data;
    fi_kernel_spec spec;
    const int64_t gy = k.nnz < 65535 ? k.nnz : 65535;
    if (a->q_w) { /* a warp per head row, 8 to a block */
        k.qw = a->q_w->data, k.kw = a->k_w->data;
        k.qw_col = fi_cuda_sv_bstride(a->q_w, 0), k.kw_col = fi_cuda_sv_bstride(a->k_w, 0);
        k.eps = a->eps;
        int64_t gx = (hq + hk + 7) / 8;
        if (gx > 64) gx = 64;
        fi_cuda_sv_qk_norm_rope_spec((int)q->dtype, (int)kt->dtype, (int)a->q_w->dtype,
                                     (int)a->k_w->dtype, a->gemma, a->neox, &spec);
        return fi_cuda_sv_launch(ctx, &spec, gx, gy, 256, 1, &k, stream);
    }
    const int64_t units = (hq + hk) * dim; /* at most: pairs and copied dims */
    int64_t gx = (units + 255) / 256;
    if (gx > 64) gx = 64;
    fi_cuda_sv_rope_spec((int)q->dtype, (int)kt->dtype, a->neox, &spec);
    return fi_cuda_sv_launch(ctx, &spec, gx, gy, 256, 1, &k, stream);
}
