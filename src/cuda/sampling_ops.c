/*
 * sampling_ops.c — softmax, sampling, the filters, chain speculative
 * sampling and top-k on CUDA (kernels/sampling.cuh): one block of 1024
 * threads per row, a grid of two blocks per SM striding over the rows (one
 * is resident per SM: 1024 threads x 64 registers fill the register
 * file). Where few rows would leave SMs idle, softmax, sampling and the
 * filters run each row on a cluster of up to 8 CTAs instead
 * (fi_cuda_sv_team_size), one cluster a row. The core
 * (src/core/ops_sample.c) has checked shapes, dtypes, aliasing and the
 * scalar parameters; values in device tensors (row indices, per-row
 * top_p / min_p / temperature, draft token ids, lengths, a ragged indptr)
 * are the kernels' to handle (kernels/sampling.cuh says how), since
 * reading them here would need a sync.
 *
 * No scratch: every row's histograms and sums live in its block's shared
 * memory (41 KB), so a call allocates nothing, never synchronises, and can
 * be captured in a CUDA graph (the first call of a configuration loads its
 * module, in relaxed capture mode inside a capture: serving_ops.c).
 */
#include "cuda/cuda_ops.h"

#include "../../kernels/serving_args.h"

#include <string.h>

enum { NT = 1024 }; /* threads per block of every kernel here */

/* spec with the arguments k over `rows` rows, on the grid described above. */
static fi_status launch_rows(fi_context *ctx, const fi_kernel_spec *spec, int64_t rows, void *k,
                             void *stream) {
    return fi_cuda_sv_launch(ctx, spec, fi_cuda_sv_row_blocks(ctx, rows), 1, NT, 1, k, stream);
}

/* The same where a row of `vocab` values may be shared by a team (softmax,
 * sampling, the filters): few rows run on clusters of CTAs, one a row. */
static fi_status launch_teams(fi_context *ctx, const fi_kernel_spec *spec, int64_t rows,
                              int64_t vocab, void *k, void *stream) {
    const int team = fi_cuda_sv_team_size(ctx, rows, vocab);
    if (team == 1) return launch_rows(ctx, spec, rows, k, stream);
    return fi_cuda_sv_launch(ctx, spec, rows * team, 1, NT, team, k, stream);
}

/* The i32 / f32 parameter tensor of p, or NULL. */
static const void *param_data(const fi_tensor *t) { return t ? t->data : NULL; }
static int64_t param_stride(const fi_tensor *t) { return t ? t->stride[0] : 0; }

fi_status fi_cuda_softmax(fi_context *ctx, const fi_softmax_args *a, void *stream) {
    const fi_tensor *x = a->logits, *o = a->probs;
    fi_sv_softmax_args k;
    memset(&k, 0, sizeof k);
    k.x = x->data, k.out = o->data;
    k.temp = param_data(a->temperature.arr);
    k.temp_st = param_stride(a->temperature.arr);
    k.temp_val = a->temperature.val;
    k.x_row = fi_cuda_sv_bstride(x, 0), k.x_col = fi_cuda_sv_bstride(x, 1);
    k.o_row = fi_cuda_sv_bstride(o, 0), k.o_col = fi_cuda_sv_bstride(o, 1);
    k.rows = x->shape[0], k.vocab = x->shape[1];
    fi_kernel_spec spec;
    fi_cuda_sv_softmax_spec((int)x->dtype, (int)o->dtype, &spec);
    return launch_teams(ctx, &spec, k.rows, k.vocab, &k, stream);
}

fi_status fi_cuda_sample(fi_context *ctx, const fi_sample_args *a, void *stream) {
    const fi_tensor *x = a->input;
    fi_sv_sample_args k;
    memset(&k, 0, sizeof k);
    k.x = x->data;
    k.indices = param_data(a->indices), k.idx_st = param_stride(a->indices);
    k.top_k = param_data(a->top_k.arr), k.tk_st = param_stride(a->top_k.arr);
    k.top_p = param_data(a->top_p.arr), k.tp_st = param_stride(a->top_p.arr);
    k.min_p = param_data(a->min_p.arr), k.mp_st = param_stride(a->min_p.arr);
    k.top_k_val = a->top_k.val, k.top_p_val = a->top_p.val, k.min_p_val = a->min_p.val;
    k.use_top_k = a->use_top_k, k.use_top_p = a->use_top_p, k.use_min_p = a->use_min_p;
    k.joint = a->order == FI_FILTER_JOINT;
    k.samples = a->samples->data, k.s_st = a->samples->stride[0];
    k.valid = a->valid ? a->valid->data : NULL;
    k.v_st = a->valid ? a->valid->stride[0] : 0;
    k.seed = a->seed, k.offset = a->offset;
    k.x_row = fi_cuda_sv_bstride(x, 0), k.x_col = fi_cuda_sv_bstride(x, 1);
    k.rows = x->shape[0], k.vocab = x->shape[1], k.batch = a->batch;
    fi_kernel_spec spec;
    fi_cuda_sv_sample_spec((int)x->dtype, a->logits, &spec);
    return launch_teams(ctx, &spec, a->batch, k.vocab, &k, stream);
}

fi_status fi_cuda_filter(fi_context *ctx, const fi_filter_args *a, void *stream) {
    const fi_tensor *x = a->input, *o = a->out;
    fi_sv_filter_args k;
    memset(&k, 0, sizeof k);
    k.x = x->data, k.out = o->data;
    k.top_k = param_data(a->top_k.arr), k.tk_st = param_stride(a->top_k.arr);
    k.top_p = param_data(a->top_p.arr), k.tp_st = param_stride(a->top_p.arr);
    k.top_k_val = a->top_k.val, k.top_p_val = a->top_p.val;
    k.x_row = fi_cuda_sv_bstride(x, 0), k.x_col = fi_cuda_sv_bstride(x, 1);
    k.o_row = fi_cuda_sv_bstride(o, 0), k.o_col = fi_cuda_sv_bstride(o, 1);
    k.rows = x->shape[0], k.vocab = x->shape[1];
    k.in_place = x->data == o->data; /* the very same view (core-checked) */
    fi_kernel_spec spec;
    fi_cuda_sv_filter_spec((int)a->op, (int)x->dtype, (int)o->dtype, &spec);
    return launch_teams(ctx, &spec, k.rows, k.vocab, &k, stream);
}

fi_status fi_cuda_chain_speculative(fi_context *ctx, const fi_spec_args *a, void *stream) {
    const fi_tensor *dp = a->draft_probs, *tp = a->target_probs;
    fi_sv_spec_args k;
    memset(&k, 0, sizeof k);
    k.dp = dp->data, k.tp = tp->data, k.ids = a->draft_ids->data, k.out_ids = a->out_ids->data;
    k.acc = a->accepted ? a->accepted->data : NULL;
    k.emi = a->emitted ? a->emitted->data : NULL;
    k.seed = a->seed, k.offset = a->offset;
    k.dp_b = fi_cuda_sv_bstride(dp, 0), k.dp_i = fi_cuda_sv_bstride(dp, 1);
    k.dp_v = fi_cuda_sv_bstride(dp, 2);
    k.tp_b = fi_cuda_sv_bstride(tp, 0), k.tp_i = fi_cuda_sv_bstride(tp, 1);
    k.tp_v = fi_cuda_sv_bstride(tp, 2);
    k.ids_b = a->draft_ids->stride[0], k.ids_i = a->draft_ids->stride[1];
    k.out_b = a->out_ids->stride[0], k.out_i = a->out_ids->stride[1];
    k.acc_st = param_stride(a->accepted), k.emi_st = param_stride(a->emitted);
    k.batch = dp->shape[0], k.n = dp->shape[1], k.vocab = dp->shape[2];
    fi_kernel_spec spec;
    fi_cuda_sv_spec_spec((int)dp->dtype, (int)tp->dtype, &spec);
    return launch_rows(ctx, &spec, k.batch, &k, stream);
}

fi_status fi_cuda_top_k(fi_context *ctx, const fi_topk_args *a, void *stream) {
    const fi_tensor *x = a->input;
    fi_sv_topk_args k;
    memset(&k, 0, sizeof k);
    k.x = x->data;
    k.lengths = param_data(a->lengths), k.len_st = param_stride(a->lengths);
    k.offsets = param_data(a->offsets), k.off_st = param_stride(a->offsets);
    k.indptr = param_data(a->indptr), k.ptr_st = param_stride(a->indptr);
    k.idx = a->indices->data;
    k.idx_r = a->indices->stride[0], k.idx_c = a->indices->stride[1];
    k.vals = a->values ? a->values->data : NULL;
    k.val_r = a->values ? fi_cuda_sv_bstride(a->values, 0) : 0;
    k.val_c = a->values ? fi_cuda_sv_bstride(a->values, 1) : 0;
    if (a->indptr) {
        k.x_col = fi_cuda_sv_bstride(x, 0), k.cols = x->shape[0];
    } else {
        k.x_row = fi_cuda_sv_bstride(x, 0), k.x_col = fi_cuda_sv_bstride(x, 1);
        k.cols = x->shape[1];
    }
    k.rows = a->rows, k.k = a->k;
    fi_kernel_spec spec;
    fi_cuda_sv_topk_spec((int)x->dtype, a->indptr != NULL, &spec);
    return launch_rows(ctx, &spec, a->rows, &k, stream);
}
