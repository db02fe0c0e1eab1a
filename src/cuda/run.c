/*
 * run.c — fi_plan_run on CUDA: bind the tensors, order the stream after the
 * plan's upload, pick a form from the plan's kernel table and launch it on
 * the fixed grid: the persistent kernel (every item and the merge), or the
 * separate attention, tensor-core and merge kernels. Nothing here
 * allocates, copies or compiles, so a CUDA graph captured around it
 * replays correctly after another fi_plan_update.
 */
#include "cuda/cuda_backend.h"
#include "core/variant.h"

#include "../../kernels/fi_args.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static int64_t bstride(const fi_tensor *t, int dim) {
    return t->stride[dim] * (int64_t)fi_dtype_size(t->dtype);
}

/* K or V strides in bytes: page, slot (token for ragged), head, dim. */
static void kv_strides(const fi_plan *plan, const fi_tensor *t, int64_t *s) {
    bool nhd = plan->params.kv_layout == FI_KV_LAYOUT_NHD;
    if (plan->params.kv_format == FI_KV_FORMAT_PAGED) {
        s[0] = bstride(t, 0);
        s[1] = bstride(t, nhd ? 1 : 2);
        s[2] = bstride(t, nhd ? 2 : 1);
        s[3] = bstride(t, 3);
    } else {
        s[0] = 0;
        s[1] = bstride(t, nhd ? 0 : 1);
        s[2] = bstride(t, nhd ? 1 : 0);
        s[3] = bstride(t, 2);
    }
}

static bool rows_aligned(const fi_tensor *t, const int64_t *s) {
    int64_t e = (int64_t)fi_dtype_size(t->dtype);
    return ((uintptr_t)t->data % 16) == 0 && s[0] % 16 == 0 && s[1] % 16 == 0 &&
           s[2] % 16 == 0 && s[3] == e;
}

/* Q or O [tokens, heads, dim]: 16-byte aligned rows of contiguous elements
 * (rows_aligned with the token and head strides in the page's and slot's
 * places, and 16, always aligned, in the head's) */
static bool token_rows_aligned(const fi_tensor *t) {
    int64_t s[4] = {bstride(t, 0), bstride(t, 1), 16, bstride(t, 2)};
    return rows_aligned(t, s);
}

static void make_args(const fi_plan *plan, const fi_cuda_plan *ps, const fi_run_args *ra,
                      fi_attn_args *a) {
    const fi_attention_params *p = &plan->params;
    memset(a, 0, sizeof *a);
    a->meta = (const char *)(uintptr_t)ps->meta;
    a->partial_o = (float *)(uintptr_t)ps->partial_o;
    a->partial_lse = (float *)(uintptr_t)ps->partial_lse;
    a->q = ra->q.data;
    a->k = ra->k.data;
    a->v = ra->v.data;
    a->o = ra->o.data;
    a->lse = ra->lse.data;
    a->mask = p->mask_mode == FI_MASK_CUSTOM ? ra->custom_mask.data : NULL;
    a->merge_count = (int32_t *)(uintptr_t)ps->merge_count;
    a->upload_done = (uint32_t *)(uintptr_t)ps->upload_done_dev;
    a->q_tok = bstride(&ra->q, 0), a->q_head = bstride(&ra->q, 1), a->q_dim = bstride(&ra->q, 2);
    a->o_tok = bstride(&ra->o, 0), a->o_head = bstride(&ra->o, 1), a->o_dim = bstride(&ra->o, 2);
    if (a->lse) a->lse_tok = ra->lse.stride[0], a->lse_head = ra->lse.stride[1];
    int64_t ks[4], vs[4];
    kv_strides(plan, &ra->k, ks);
    kv_strides(plan, &ra->v, vs);
    a->k_page = ks[0], a->k_slot = ks[1], a->k_head = ks[2], a->k_dim = ks[3];
    a->v_page = vs[0], a->v_slot = vs[1], a->v_head = vs[2], a->v_dim = vs[3];
    a->num_qo_heads = p->num_qo_heads;
    a->num_kv_heads = p->num_kv_heads;
    a->page_size = p->kv_format == FI_KV_FORMAT_PAGED ? p->page_size : 1;
    /* the last page both caches hold: page ids are clamped to it */
    int64_t pages = ra->k.shape[0] < ra->v.shape[0] ? ra->k.shape[0] : ra->v.shape[0];
    a->max_page = pages <= 1 ? 0 : pages - 1 > INT32_MAX ? INT32_MAX : (int32_t)(pages - 1);
    a->page_shift = -1;
    for (int s = 0; s < 31; s++)
        if ((1 << s) == a->page_size) a->page_shift = s;
    a->kv_vec_ok = rows_aligned(&ra->k, ks) && rows_aligned(&ra->v, vs);
    a->q_vec_ok = token_rows_aligned(&ra->q);
    a->o_vec_ok = token_rows_aligned(&ra->o);
    /* the tensor-core kernel gathers K/V rows with 16-byte copies only */
    a->tc_min_rows = ps->tc_path && a->kv_vec_ok ? FI_CUDA_TC_MIN_ROWS : 0;
    a->window_left = p->window_left;
    bool fp8 = p->kv_dtype == FI_DTYPE_E4M3 || p->kv_dtype == FI_DTYPE_E5M2;
    /* logits in natural units for a logits hook or weights (use_softmax = 0);
     * a key hook sees dequantised rows, so k_scale is not in q then */
    bool transform = p->logits_soft_cap > 0.0f || p->pos_encoding == FI_POS_ALIBI ||
                     (ps->vhooks & (FI_VH_LOGITS | FI_VH_NO_SOFTMAX));
    bool kq = fp8 && !(ps->vhooks & FI_VH_KEY);
    a->q_scale = p->sm_scale * (kq ? p->k_scale : 1.0f) * (transform ? 1.0f : 1.4426950408889634f);
    a->sm_scale = p->sm_scale;
    a->k_scale = fp8 ? p->k_scale : 1.0f;
    a->softcap = p->logits_soft_cap;
    a->softcap_rcp = p->logits_soft_cap > 0.0f ? 1.0f / p->logits_soft_cap : 0.0f;
    a->v_scale = fp8 ? p->v_scale : 1.0f;
    a->rope_scale = p->rope_scale > 0.0f ? p->rope_scale : 1.0f;
    a->rope_theta = p->rope_theta > 0.0f ? p->rope_theta : 1e4f;
    /* the variant's per-run values, by value in the launch (so a captured
     * graph replays them; the core checked them) */
    if (p->variant) fi_variant_pack(p->variant, ra->variant_args, a->vparams);
}

_Static_assert(sizeof(((fi_attn_args *)0)->vparams) >= FI_VARIANT_MAX_PARAMS * 8,
               "variant parameter block");
/* Decode version 3 computes a paged key's offset within its page in 32
 * bits: slot x slot stride must fit (it does for any real cache). */
static bool slots_fit(const fi_attn_args *a, const fi_plan *plan) {
    if (plan->params.kv_format != FI_KV_FORMAT_PAGED) return true;
    int64_t ps = a->page_size;
    return a->k_slot >= 0 && a->v_slot >= 0 && ps * a->k_slot < INT32_MAX &&
           ps * a->v_slot < INT32_MAX;
}

/* Whether `stream` is being captured into a graph (*cap). */
static fi_status stream_capturing(const fi_cu_api *cu, CUstream stream, bool *cap) {
    int capturing = FI_CU_CAPTURE_NONE;
    FI_CU(cu, StreamIsCapturing, stream, &capturing);
    *cap = capturing != FI_CU_CAPTURE_NONE;
    return FI_OK;
}

/* Order `stream` after the plan's last upload. During a capture the wait
 * is done on the host (the copy was queued before the capture began).
 * The capture state is asked of the driver only where a wait is needed
 * (a stream other than the one the upload is ordered on): an ordinary run
 * on the upload's stream makes no call here. *cap: the state where it was
 * asked (*asked), for the separate kernels' choice (launch). */
static fi_status order_after_upload(fi_cuda_plan *ps, CUstream stream, bool *cap, bool *asked) {
    const fi_cu_api *cu = ps->cc->cu;
    *cap = *asked = false;
    if (!ps->upload_recorded || stream == ps->ordered_stream) return FI_OK;
    fi_status st = stream_capturing(cu, stream, cap);
    if (st) return st;
    *asked = true;
    if (*cap) {
        int mode = FI_CU_CAPTURE_MODE_RELAXED;
        FI_CU(cu, ThreadExchangeStreamCaptureMode, &mode);
        CUresult r = cu->EventSynchronize(ps->uploaded);
        cu->ThreadExchangeStreamCaptureMode(&mode);
        if (r != 0) return fi_cu_error(cu, "cuEventSynchronize", r);
    } else {
        FI_CU(cu, StreamWaitEvent, stream, ps->uploaded, 0);
    }
    ps->ordered_stream = stream;
    return FI_OK;
}

/* One kernel of a run: grid gx x gy of `threads`. Where the context
 * allows it (cc->pdl), with programmatic dependent launch: its CTAs may
 * start while the kernel before it in the stream ends, and wait for it in
 * the kernel (kernels/prelude.cuh, fi_pdl_wait) before touching any tensor;
 * the launch and the first loads leave the critical path. */
static fi_status launch_one(const fi_cuda_ctx *cc, CUfunction fn, unsigned gx, unsigned gy,
                            unsigned threads, unsigned smem, CUstream stream, void **params,
                            bool pdl) {
    const fi_cu_api *cu = cc->cu;
    if (!cc->pdl || !pdl) {
        FI_CU(cu, LaunchKernel, fn, gx, gy, 1, threads, 1, 1, smem, stream, params, NULL);
        return FI_OK;
    }
    fi_cu_launch_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.id = FI_CU_LAUNCH_PDL;
    attr.v.value = 1;
    fi_cu_launch_config cfg = {gx, gy, 1, threads, 1, 1, smem, stream, &attr, 1};
    FI_CU(cu, LaunchKernelEx, &cfg, fn, params, NULL);
    return FI_OK;
}

/* The persistent kernel's form for this run, or FI_CUDA_FORM_COUNT for the
 * separate kernels. Decode version 3 copies K/V rows 16 bytes at a time
 * within power-of-two pages: other caches take the separate kernels. A
 * batch of tensor-core items only (prefill) takes the standalone
 * tensor-core kernel where the plan has it (select.c); captured too: the
 * graph then holds the separate kernels, which run any later plan (its
 * decode items on the CUDA-core kernel, slower than the decode form: a graph
 * for decode steps is best captured on a decode batch). No item wider than
 * one m16 tile: the decode form; a graph captured there replays any later
 * plan, its wide items in 16-row slices (then not bitwise the eager run,
 * which takes the full form). A mixed batch of mostly decode work: the
 * mixed form (plan.c, pack). */
static fi_cuda_form choose_form(const fi_plan *plan, const fi_cuda_plan *ps,
                                const fi_attn_args *a) {
    if (!ps->fn[FI_CUDA_FORM_PERSIST]) return FI_CUDA_FORM_COUNT;
    const bool dtc_ok = a->kv_vec_ok && a->page_shift >= 0 && slots_fit(a, plan);
    if (ps->decode_tc && !dtc_ok) return FI_CUDA_FORM_COUNT;
    /* no item wider than one m16 tile: decode version 3 takes them all,
     * also where they count as tensor-core items (16 rows) that the full
     * form has no path for (d 256: decode_tc false). (FP8 K/V: the full
     * form runs on CUDA cores, and takes the runs decode version 3 cannot) */
    if (ps->fn[FI_CUDA_FORM_PERSIST_DECODE] && !ps->has_wide_items && dtc_ok)
        return FI_CUDA_FORM_PERSIST_DECODE;
    const bool all_tc = ps->has_tc_items && !ps->has_cc_items &&
                        !(ps->decode_tc && !ps->has_wide_items); /* 16-row items: decode v3 */
    if (ps->prefill_separate && all_tc && a->tc_min_rows > 0) return FI_CUDA_FORM_COUNT;
    /* tensor-core items the persistent kernel has no path for */
    if (!ps->persist_tc && ps->has_tc_items && a->tc_min_rows > 0) return FI_CUDA_FORM_COUNT;
    if (ps->mixed_form) return FI_CUDA_FORM_PERSIST_MIXED;
    return FI_CUDA_FORM_PERSIST;
}

static fi_status launch(fi_plan *plan, fi_cuda_plan *ps, const fi_run_args *ra) {
    const fi_cu_api *cu = ps->cc->cu;
    CUstream stream = (CUstream)ra->stream;
    bool cap, asked;
    fi_status st = order_after_upload(ps, stream, &cap, &asked);
    if (st) return st;
    fi_attn_args a;
    make_args(plan, ps, ra, &a);
    void *params[] = {&a};
    const fi_cuda_form form = choose_form(plan, ps, &a);
    if (form != FI_CUDA_FORM_COUNT) { /* every item and the merge, one launch */
        a.heads_x = 1;                /* grid x = KV heads, y = workers */
        st = launch_one(ps->cc, ps->fn[form], ps->grid_y, ps->grid_x,
                        (unsigned)ps->threads[form], (unsigned)ps->smem[form], stream, params,
                        true);
        if (st) return st;
        ps->last_stream = stream;
        ps->last_form = ps->fn[form];
        return FI_OK;
    }
    /* the table holds the separate kernels wherever choose_form can fall
     * back to them (select.c) */
    if (!ps->fn[FI_CUDA_FORM_ATTN] || !ps->fn[FI_CUDA_FORM_MERGE])
        return fi_error(FI_STATUS_INTERNAL, "CUDA plan: no separate kernels for this run");
    /* Two attention kernels on one grid, each skipping the other's items
     * (a.tc_min_rows); a captured run holds both, as a later plan may need
     * either. */
    if (!asked && (st = stream_capturing(cu, stream, &cap))) return st;
    bool tc = a.tc_min_rows > 0;
    if (cap || !tc || ps->has_cc_items)
        st = launch_one(ps->cc, ps->fn[FI_CUDA_FORM_ATTN], ps->grid_x, ps->grid_y, 128, 0,
                        stream, params, true);
    if (!st && tc && (cap || ps->has_tc_items))
        st = launch_one(ps->cc, ps->fn[FI_CUDA_FORM_ATTN_TC], ps->grid_x, ps->grid_y,
                        (unsigned)ps->threads[FI_CUDA_FORM_ATTN_TC],
                        (unsigned)ps->smem[FI_CUDA_FORM_ATTN_TC], stream, params, true);
    /* A captured run always holds the merge: a later plan may split. Not
     * launched early: its small CTAs, placed while the attention kernel
     * ends, crowded onto the SMs that freed first (measured slower). */
    if (!st && (plan->schedule.num_merge_rows > 0 || cap))
        st = launch_one(ps->cc, ps->fn[FI_CUDA_FORM_MERGE], ps->merge_grid, 1, 128, 0, stream,
                        params, false);
    if (st) return st;
    ps->last_stream = stream;
    ps->last_form = NULL;
    return FI_OK;
}

fi_status fi_cuda_run(fi_plan *plan, const fi_run_args *args) {
    fi_cuda_plan *ps = plan->backend_state;
    bool pushed;
    fi_status st = fi_cuda_enter(ps->cc, &pushed);
    if (st) return st;
    st = launch(plan, ps, args);
    fi_cuda_leave(ps->cc, pushed);
    return st;
}
