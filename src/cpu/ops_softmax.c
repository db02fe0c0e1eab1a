/*
 * ops_softmax.c — softmax (with temperature) on the CPU.
 *
 * Three passes over a row, each over blocks of FI_SV_BLOCK values: the
 * maximum m (and whether the row holds NaN or +inf), e = exp((x - m) / T)
 * into the output with each block's lane sum, and the scale by 1 / total,
 * total the f64 sum of the blocks' sums in block order. A result depends
 * on the blocks alone, never on which worker ran them: rows enough for
 * every worker go whole to one (its passes find the row in cache), fewer
 * rows with an f32 contiguous output are split by blocks across the pool,
 * a pass at a time, bitwise the same.
 */
#include "cpu/serving.h"

#include <math.h>

typedef struct softmax_job {
    const fi_softmax_args *a;
    const fi_cpu_serving_kernels *k;
    fi_ops_isa isa;
    int64_t v, nb;     /* values and blocks of a row */
    bool direct;       /* the output is f32 and contiguous: written in place */
    double *sum;       /* [rows, nb] per block: sum of exp */
    float *max;        /* [rows, nb] per block: maximum */
    uint32_t *kinds;   /* [rows, nb] FI_SV_* of the block */
} softmax_job;

static int64_t block_len(const softmax_job *j, int64_t b) {
    return j->v - b * FI_SV_BLOCK < FI_SV_BLOCK ? j->v - b * FI_SV_BLOCK : FI_SV_BLOCK;
}

/* Row r of the input from block b on, n values (xb: scratch for them). */
static const float *row_at(const softmax_job *j, int64_t r, int64_t b, int64_t n, float *xb) {
    const fi_tensor *in = j->a->logits;
    return fi_sv_load(j->isa, in, r * in->stride[0] + b * FI_SV_BLOCK * in->stride[1],
                      in->stride[1], n, xb);
}

/* The row's maximum, false when it is no distribution (NaN, +inf, all
 * -inf: the row becomes NaN, as torch). */
static bool row_max(const softmax_job *j, int64_t r, float *m) {
    const float *mx = j->max + r * j->nb;
    const uint32_t *kd = j->kinds + r * j->nb;
    uint32_t kinds = 0;
    *m = -INFINITY;
    for (int64_t b = 0; b < j->nb; b++) *m = mx[b] > *m ? mx[b] : *m, kinds |= kd[b];
    return !(kinds & (FI_SV_NAN | FI_SV_POS_INF)) && *m != -INFINITY;
}

/* Pass `pass` over blocks [b0, b1) of row r; y is the row's f32 output. */
static void blocks(const softmax_job *j, int pass, int64_t r, int64_t b0, int64_t b1, float *y,
                   float *xb) {
    const int64_t u = r * j->nb;
    float m = 0.0f;
    bool ok = pass == 1 || row_max(j, r, &m);
    double total = 0.0;
    if (pass == 3 && ok)
        for (int64_t b = 0; b < j->nb; b++) total += j->sum[u + b];
    /* One kernel call for the whole range where the pass allows it: a call
     * per block cost 15-20% of a 1 x 128256 row. The range's maximum
     * stands for its first block (the row's maximum is all that is read). */
    const fi_tensor *in = j->a->logits;
    const int64_t o0 = b0 * FI_SV_BLOCK, len = b1 * FI_SV_BLOCK < j->v ? (b1 - b0) * FI_SV_BLOCK
                                                                         : j->v - o0;
    if (pass == 1 && in->dtype == FI_DTYPE_F32 && (in->stride[1] == 1 || j->v <= 1)) {
        j->k->stats(row_at(j, r, b0, len, NULL), len, &j->max[u + b0], &j->kinds[u + b0]);
        for (int64_t b = b0 + 1; b < b1; b++) j->max[u + b] = -INFINITY, j->kinds[u + b] = 0;
        return;
    }
    if (pass == 3 && ok) {
        j->k->masked_scale(y + o0, y + o0, -INFINITY, (float)(1.0 / total), len);
        return;
    }
    for (int64_t b = b0; b < b1; b++) {
        const int64_t n = block_len(j, b), o = b * FI_SV_BLOCK;
        if (pass == 1) {
            j->k->stats(row_at(j, r, b, n, xb), n, &j->max[u + b], &j->kinds[u + b]);
        } else if (!ok) {
            for (int64_t i = 0; pass == 3 && i < n; i++) y[o + i] = NAN;
        } else {
            const fi_param_f32 *t = &j->a->temperature;
            const float inv_t =
                1.0f / (t->arr ? ((const float *)t->arr->data)[r * t->arr->stride[0]] : t->val);
            j->sum[u + b] =
                (double)j->k->exp_sum(y + o, row_at(j, r, b, n, xb), m, inv_t, -INFINITY, n);
        }
    }
}

/* Whole rows [begin, end), the three passes of a row one after another:
 * in place (direct), else through a row of f32 scratch, then stored. */
static void whole_rows(void *arg, void *scratch, int64_t begin, int64_t end) {
    const softmax_job job = *(const softmax_job *)arg, *j = &job; /* see split_units */
    const fi_tensor *out = j->a->probs;
    float *xb = scratch, *buf = (float *)((char *)scratch + fi_sv_floats(FI_SV_BLOCK));
    for (int64_t r = begin; r < end; r++) {
        float *y = j->direct ? (float *)out->data + r * out->stride[0] : buf;
        for (int pass = 1; pass <= 3; pass++) blocks(j, pass, r, 0, j->nb, y, xb);
        if (!j->direct) fi_sv_store(j->isa, out, r * out->stride[0], out->stride[1], y, j->v);
    }
}

/* Units [begin, end) of the rows x blocks grid, in row order, for one pass
 * in place in the f32 output. */
static void split_units(const softmax_job *shared, int pass, void *xb, int64_t begin,
                        int64_t end) {
    /* the worker's own copy: the job lies on the caller's stack, in lines
     * the caller writes while it runs (with reads of it there, 16 x 128256
     * took 0.83 ms on 2 threads, 0.55 with the copy) */
    const softmax_job job = *shared, *j = &job;
    const fi_tensor *out = j->a->probs;
    for (int64_t u = begin; u < end;) {
        const int64_t r = u / j->nb, b0 = u % j->nb;
        const int64_t b1 = end - r * j->nb < j->nb ? end - r * j->nb : j->nb;
        blocks(j, pass, r, b0, b1, (float *)out->data + r * out->stride[0], xb);
        u = r * j->nb + b1;
    }
}

static void pass1(void *arg, void *xb, int64_t begin, int64_t end) {
    split_units(arg, 1, xb, begin, end);
}
static void pass2(void *arg, void *xb, int64_t begin, int64_t end) {
    split_units(arg, 2, xb, begin, end);
}
static void pass3(void *arg, void *xb, int64_t begin, int64_t end) {
    split_units(arg, 3, xb, begin, end);
}

/* The per-block arrays in the call's shared scratch. */
static void block_arrays(void *arg, void *shared) {
    softmax_job *j = arg;
    const int64_t cells = j->a->logits->shape[0] * j->nb;
    j->sum = shared;
    j->max = (float *)((char *)shared + fi_sv_floats(2 * cells));
    j->kinds = (uint32_t *)((char *)shared + fi_sv_floats(2 * cells) + fi_sv_floats(cells));
}

fi_status fi_cpu_softmax(fi_context *ctx, const fi_softmax_args *a, void *stream) {
    (void)stream;
    const fi_tensor *out = a->probs;
    const int64_t rows = a->logits->shape[0], v = a->logits->shape[1];
    softmax_job j = {a, fi_cpu_serving_for(ctx), fi_ops_isa_for(ctx), v,
                     (v + FI_SV_BLOCK - 1) / FI_SV_BLOCK,
                     out->dtype == FI_DTYPE_F32 && (out->stride[1] == 1 || v <= 1), NULL, NULL,
                     NULL};
    /* the pool's threshold is in bytes moved; a softmax value costs about
     * what four copies of it do (three passes, the exp's arithmetic), so a
     * row of 128256 already pays for both threads */
    const int64_t cells = rows * j.nb, bytes = rows * v * 8 * 4;
    const size_t shared = fi_sv_floats(2 * cells) + 2 * fi_sv_floats(cells);
    const size_t xb = fi_sv_floats(FI_SV_BLOCK);
    if (!j.direct || rows >= fi_thread_pool_size(fi_cpu_pool(ctx)))
        return fi_sv_parallel_rows(ctx, rows, bytes, shared, block_arrays,
                                   xb + (j.direct ? 0 : fi_sv_floats(v)), whole_rows, &j);
    /* a pass reads what the one before left in the shared scratch: the
     * same sizes each time, so the context's scratch is not reallocated */
    fi_sv_rows_fn passes[3] = {pass1, pass2, pass3};
    for (int p = 0; p < 3; p++) {
        fi_status st = fi_sv_parallel_rows(ctx, cells, bytes, shared, block_arrays, xb, passes[p], &j);
        if (st) return st;
    }
    return FI_OK;
}
