/*
 * bsr.c — block-sparse attention lowered onto paged plans (docs/CASCADE.md
 * "Block-sparse lowering"). No kernels:
 *
 *  - fixed R x C blocks: block row r is request r, its query tokens
 *    [r R, min((r+1) R, M)); its non-zero block columns are its pages, with
 *    page_size = C over K/V [N, H_kv, D] viewed as [ceil(N/C), C, H_kv, D]
 *    (strides only); a partial last column block is the request's partial
 *    last page. The element mask [nnz, R, C] becomes the requests' custom
 *    masks (row-major bits over each request's keys, packed here and
 *    copied into the bsr's backend memory: device memory on CUDA).
 *  - variable blocks per KV head: one plan per KV head over head-sliced
 *    views (its query heads, its K/V head); block row r is request r with
 *    block_row_sz[h][r] tokens, its pages the keys of its chosen column
 *    blocks in units of col_granularity (page_size = granularity).
 */
#include "core/checked.h"
#include "core/internal.h"

#include <stdlib.h>
#include <string.h>

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

struct fi_bsr {
    uint32_t magic;               /* FI_MAGIC_BSR while alive */
    _Atomic int32_t busy;         /* a call is inside */
    fi_context *ctx;
    fi_attention_params params;
    fi_bsr_config config;
    int32_t num_plans;            /* 1 (fixed) or H_kv (variable) */
    fi_plan **plans;
    int32_t max_rows;             /* plan batch bound: block rows */
    int64_t max_pages;            /* plan page bound (per plan) */
    /* per plan: qo_indptr [max_rows+1], kv_indptr [max_rows+1], last [max_rows];
     * variable: indices [max_pages] */
    int32_t *qo, *kv, *last, *indices;
    uint8_t *mask;                /* packed element mask (fixed), host */
    void *dev_mask;               /* its copy the kernels read (backend memory) */
    int64_t mask_cap, mask_bytes;
    bool planned;
    int32_t qo_len, kv_len;
};

void fi_bsr_config_init(fi_bsr_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->col_granularity = 1;
}

static fi_status check_config(const fi_bsr_config *c) {
    if (c->struct_size != sizeof *c)
        return INVALID("fi_bsr_config.struct_size=%u, expected %zu: call fi_bsr_config_init "
                       "first", (unsigned)c->struct_size, sizeof *c);
    if (c->max_qo_len <= 0 || c->max_kv_len <= 0)
        return INVALID("fi_bsr_config max_qo_len=%d, max_kv_len=%d: both must be positive",
                       (int)c->max_qo_len, (int)c->max_kv_len);
    if (c->max_nnz < 0) return INVALID("fi_bsr_config.max_nnz=%d is negative", (int)c->max_nnz);
    if (!c->variable_blocks && (c->block_rows <= 0 || c->block_cols <= 0))
        return INVALID("fi_bsr_config block_rows=%d, block_cols=%d: both must be positive",
                       (int)c->block_rows, (int)c->block_cols);
    if (c->variable_blocks && c->element_mask)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "fi_bsr_config: element_mask with variable_blocks: variable blocks "
                        "take a block mask map, not element masks");
    if (c->variable_blocks && (c->col_granularity <= 0 || c->max_block_rows < 0))
        return INVALID("fi_bsr_config col_granularity=%d, max_block_rows=%d: granularity must "
                       "be positive, block rows >= 0", (int)c->col_granularity,
                       (int)c->max_block_rows);
    return FI_OK;
}

static int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

fi_status fi_bsr_create(fi_context *ctx, const fi_attention_params *params,
                        const fi_bsr_config *config, fi_bsr **out) {
    if (!out) return INVALID("fi_bsr_create: out is NULL");
    *out = NULL;
    fi_status st = fi_context_check(ctx, "fi_bsr_create");
    if (st) return st;
    if (!params) return INVALID("fi_bsr_create: params is NULL");
    if (!config) return INVALID("fi_bsr_create: config is NULL");
    if ((st = check_config(config))) return st;
    if (params->struct_size == sizeof *params) {
        if (params->mask_mode != FI_MASK_NONE)
            return fi_error(FI_STATUS_UNSUPPORTED,
                            "fi_bsr_create: mask_mode=%d: the block pattern (and element "
                            "mask) is the mask; use FI_MASK_NONE", (int)params->mask_mode);
        if (params->window_left != -1)
            return fi_error(FI_STATUS_UNSUPPORTED,
                            "fi_bsr_create: window_left=%d: express a window as blocks",
                            (int)params->window_left);
        if (params->pos_encoding != FI_POS_NONE)
            return fi_error(FI_STATUS_UNSUPPORTED,
                            "fi_bsr_create: pos_encoding=%d: a block row does not know its "
                            "keys' positions; apply RoPE with fi_rope_apply first",
                            (int)params->pos_encoding);
        if (params->variant)
            return fi_error(FI_STATUS_UNSUPPORTED,
                            "fi_bsr_create: user-defined variants are not supported here; "
                            "express the pattern as the variant's logits_mask on a plan");
    }
    fi_bsr *b = calloc(1, sizeof *b);
    if (!b) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_bsr_create: out of memory");
    b->magic = FI_MAGIC_BSR;
    b->ctx = ctx;
    fi_context_retain(ctx); /* released by fi_bsr_destroy, also on the errors below */
    b->params = *params;
    b->config = *config;
    const fi_bsr_config *c = config;
    fi_attention_params lp = *params;
    lp.kv_format = FI_KV_FORMAT_PAGED;
    lp.kv_layout = FI_KV_LAYOUT_NHD;
    fi_plan_config pc;
    fi_plan_config_init(&pc);
    pc.num_workers = c->num_workers;
    pc.max_total_qo = c->max_qo_len;
    if (!c->variable_blocks) {
        b->num_plans = 1;
        b->max_rows = (int32_t)cdiv(c->max_qo_len, c->block_rows);
        int64_t dense = (int64_t)b->max_rows * cdiv(c->max_kv_len, c->block_cols);
        b->max_pages = c->max_nnz ? c->max_nnz : dense;
        if (b->max_pages > INT32_MAX) b->max_pages = INT32_MAX;
        lp.page_size = c->block_cols;
        lp.mask_mode = c->element_mask ? FI_MASK_CUSTOM : FI_MASK_NONE;
        /* every request's segment rounds up to a byte */
        int64_t bits;
        if (c->element_mask &&
            (!fi_mul_i64(b->max_pages, (int64_t)c->block_rows * c->block_cols, &bits) ||
             !fi_add_i64(bits / 8 + 1, b->max_rows, &b->mask_cap) ||
             (uint64_t)b->mask_cap > (uint64_t)SIZE_MAX)) {
            fi_bsr_destroy(b);
            return INVALID("fi_bsr_create: an element mask of max_nnz=%lld blocks x block_rows=%d "
                           "x block_cols=%d bits overflows the address range",
                           (long long)(c->max_nnz ? c->max_nnz : dense), (int)c->block_rows,
                           (int)c->block_cols);
        }
    } else {
        if (params->struct_size == sizeof *params && params->num_kv_heads > 0 &&
            params->num_qo_heads % params->num_kv_heads == 0) {
            b->num_plans = params->num_kv_heads;
            lp.num_qo_heads = params->num_qo_heads / params->num_kv_heads;
            lp.num_kv_heads = 1;
        } else {
            b->num_plans = 1; /* fi_plan_create names the bad value below */
        }
        b->max_rows = c->max_block_rows ? c->max_block_rows : c->max_qo_len;
        int64_t dense = (int64_t)b->max_rows * cdiv(c->max_kv_len, c->col_granularity);
        b->max_pages = c->max_nnz ? c->max_nnz : dense;
        lp.page_size = c->col_granularity;
        lp.mask_mode = FI_MASK_NONE;
        if (params->struct_size == sizeof *params && params->alibi_slopes)
            lp.alibi_slopes = NULL; /* ALiBi is refused above */
    }
    if (b->max_pages > INT32_MAX) b->max_pages = INT32_MAX;
    pc.max_batch_size = b->max_rows;
    pc.max_total_kv = (int32_t)(b->max_pages > 0 ? b->max_pages : 1);
    /* per plan: qo, kv [max_rows + 1], last [max_rows]; variable: indices */
    size_t per = 0, ints = 0;
    if (!fi_mul_size((size_t)b->max_rows, 3, &per) || !fi_add_size(per, 2, &per) ||
        (c->variable_blocks && !fi_add_size(per, (size_t)b->max_pages, &per)) ||
        !fi_mul_size((size_t)b->num_plans, per, &ints) || !fi_add_size(ints, 1, &ints) ||
        ints > SIZE_MAX / sizeof(int32_t)) {
        fi_bsr_destroy(b);
        return INVALID("fi_bsr_create: %d plans x %zu block-row entries overflow the address "
                       "range", (int)b->num_plans, per);
    }
    b->plans = calloc((size_t)b->num_plans, sizeof *b->plans);
    b->qo = calloc(ints, sizeof(int32_t));
    b->mask = b->mask_cap ? malloc((size_t)b->mask_cap) : NULL;
    if (!b->plans || !b->qo || (b->mask_cap && !b->mask)) {
        fi_bsr_destroy(b);
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_bsr_create: out of memory");
    }
    if (b->mask_cap && (st = fi_backend_alloc(ctx, (size_t)b->mask_cap, &b->dev_mask))) {
        fi_bsr_destroy(b);
        return st;
    }
    b->kv = b->qo + (size_t)b->num_plans * ((size_t)b->max_rows + 1);
    b->last = b->kv + (size_t)b->num_plans * ((size_t)b->max_rows + 1);
    b->indices = b->last + (size_t)b->num_plans * (size_t)b->max_rows;
    for (int32_t h = 0; h < b->num_plans; h++) {
        if ((st = fi_plan_create(ctx, &lp, &pc, &b->plans[h]))) {
            fi_bsr_destroy(b);
            return st;
        }
        b->plans[h]->owner_checks_outputs = true; /* bsr_run checks the caller's tensors */
    }
    *out = b;
    return FI_OK;
}

void fi_bsr_destroy(fi_bsr *b) {
    if (!b) return;
    if (FI_HANDLE_ENTER(b, FI_MAGIC_BSR, "fi_bsr_destroy", "bsr")) return;
    fi_context *ctx = b->ctx;
    if (b->plans)
        for (int32_t h = 0; h < b->num_plans; h++) fi_plan_destroy(b->plans[h]);
    free(b->plans);
    free(b->qo);
    free(b->mask);
    fi_backend_free(ctx, b->dev_mask);
    fi_handle_retire(&b->magic);
    free(b);
    fi_context_release(ctx);
}

static fi_status check_lengths(const fi_bsr *b, int32_t qo_len, int32_t kv_len) {
    if (qo_len < 0 || kv_len < 0)
        return INVALID("fi_bsr: qo_len=%d, kv_len=%d: must not be negative", (int)qo_len,
                       (int)kv_len);
    if (qo_len > b->config.max_qo_len)
        return fi_error(FI_STATUS_BOUND_EXCEEDED, "fi_bsr: qo_len=%d > max_qo_len=%d",
                        (int)qo_len, (int)b->config.max_qo_len);
    if (kv_len > b->config.max_kv_len)
        return fi_error(FI_STATUS_BOUND_EXCEEDED, "fi_bsr: kv_len=%d > max_kv_len=%d",
                        (int)kv_len, (int)b->config.max_kv_len);
    return FI_OK;
}

static fi_status bsr_update(fi_bsr *b, int32_t qo_len, int32_t kv_len, const int32_t *indptr,
                            const int32_t *indices, const uint8_t *block_mask) {
    if (b->config.variable_blocks)
        return INVALID("fi_bsr_update: this bsr has variable blocks; use "
                       "fi_bsr_update_variable");
    b->planned = false;
    fi_status st = check_lengths(b, qo_len, kv_len);
    if (st) return st;
    if (block_mask && !b->config.element_mask)
        return INVALID("fi_bsr_update: block_mask given but fi_bsr_config.element_mask is 0");
    int32_t R = b->config.block_rows, C = b->config.block_cols;
    int32_t mb = (int32_t)cdiv(qo_len, R), nb = (int32_t)cdiv(kv_len, C);
    if ((st = fi_check_indptr(indptr, mb, "bsr indptr", -1))) return st;
    if (indptr[mb] > b->max_pages)
        return fi_error(FI_STATUS_BOUND_EXCEEDED, "bsr indptr[%d]=%d non-zero blocks > max_nnz=%lld",
                        (int)mb, (int)indptr[mb], (long long)b->max_pages);
    if (indptr[mb] > 0 && !indices) return INVALID("bsr indices is NULL");
    int32_t tail = kv_len - (nb - 1) * C; /* keys of the last column block */
    for (int32_t r = 0; r < mb; r++) {
        for (int32_t j = indptr[r]; j < indptr[r + 1]; j++) {
            if (indices[j] < 0 || indices[j] >= nb)
                return INVALID("bsr indices[%d]=%d: block columns are in [0, %d) for kv_len=%d "
                               "and C=%d", (int)j, (int)indices[j], (int)nb, (int)kv_len, (int)C);
            if (j > indptr[r] && indices[j] <= indices[j - 1])
                return INVALID("bsr indices[%d]=%d after %d in block row %d: block columns "
                               "must increase within a row", (int)j, (int)indices[j],
                               (int)indices[j - 1], (int)r);
        }
        b->qo[r] = r * R;
        b->kv[r] = indptr[r];
        int32_t n = indptr[r + 1] - indptr[r];
        b->last[r] = n == 0 ? 0 : (indices[indptr[r + 1] - 1] == nb - 1 ? tail : C);
    }
    b->qo[mb] = qo_len;
    b->kv[mb] = indptr[mb];
    b->mask_bytes = 0;
    if (b->config.element_mask) {
        /* Request r: [qo_r, kv_r] bits, row-major, byte-aligned segments. */
        int64_t off = 0;
        for (int32_t r = 0; r < mb; r++) {
            int32_t rows = b->qo[r + 1] - b->qo[r], n = indptr[r + 1] - indptr[r];
            int64_t keys = n ? (int64_t)(n - 1) * C + b->last[r] : 0;
            int64_t bytes = cdiv((int64_t)rows * keys, 8);
            memset(b->mask + off, 0, (size_t)bytes);
            for (int32_t i = 0; i < rows; i++)
                for (int32_t k = 0; k < n; k++) {
                    int32_t cols = k == n - 1 ? b->last[r] : C;
                    const uint8_t *src =
                        block_mask ? block_mask + ((int64_t)(indptr[r] + k) * R + i) * C : NULL;
                    for (int32_t cc = 0; cc < cols; cc++) {
                        if (src && !src[cc]) continue;
                        int64_t bit = (int64_t)i * keys + (int64_t)k * C + cc;
                        b->mask[off + bit / 8] |= (uint8_t)(1u << (bit % 8));
                    }
                }
            off += bytes;
        }
        b->mask_bytes = off;
        /* before the plan's update: the copy is ordered before its runs */
        if ((st = fi_plan_copy_in(b->plans[0], b->dev_mask, b->mask, (size_t)off))) return st;
    }
    fi_batch batch = {.batch_size = mb, .qo_indptr = b->qo, .kv_indptr = b->kv,
                      .kv_indices = indices, .kv_last_page_len = b->last, .mask_indptr = NULL};
    if ((st = fi_plan_update(b->plans[0], &batch))) return st;
    b->qo_len = qo_len;
    b->kv_len = kv_len;
    b->planned = true;
    return FI_OK;
}

static fi_status bsr_update_variable(fi_bsr *b, int32_t qo_len, int32_t kv_len,
                                     int32_t num_block_rows, int32_t num_block_cols,
                                     const int32_t *row_sz, const int32_t *col_sz,
                                     const uint8_t *map) {
    if (!b->config.variable_blocks)
        return INVALID("fi_bsr_update_variable: this bsr has fixed blocks; use fi_bsr_update");
    b->planned = false;
    fi_status st = check_lengths(b, qo_len, kv_len);
    if (st) return st;
    if (num_block_rows < 0 || num_block_cols < 0)
        return INVALID("fi_bsr_update_variable: num_block_rows=%d, num_block_cols=%d: must "
                       "not be negative", (int)num_block_rows, (int)num_block_cols);
    if (num_block_rows > b->max_rows)
        return fi_error(FI_STATUS_BOUND_EXCEEDED,
                        "fi_bsr_update_variable: num_block_rows=%d > max_block_rows=%d",
                        (int)num_block_rows, (int)b->max_rows);
    if (!row_sz || !col_sz || !map)
        return INVALID("fi_bsr_update_variable: block_row_sz, block_col_sz and "
                       "block_mask_map must not be NULL");
    int64_t entries;
    if (!fi_mul_i64((int64_t)b->num_plans * num_block_rows, num_block_cols, &entries))
        return INVALID("fi_bsr_update_variable: block_mask_map of %d KV heads x %d x %d blocks "
                       "overflows the address range", (int)b->num_plans, (int)num_block_rows,
                       (int)num_block_cols);
    int32_t MB = num_block_rows, NB = num_block_cols, g = b->config.col_granularity;
    int64_t stride_q = (int64_t)b->max_rows + 1;
    for (int32_t h = 0; h < b->num_plans; h++) {
        int64_t sum = 0;
        for (int32_t r = 0; r < MB; r++) {
            int32_t v = row_sz[(int64_t)h * MB + r];
            if (v < 0)
                return INVALID("block_row_sz[%d][%d]=%d is negative", (int)h, (int)r, (int)v);
            sum += v;
        }
        if (sum != qo_len)
            return INVALID("block_row_sz[%d] sums to %lld, expected qo_len=%d", (int)h,
                           (long long)sum, (int)qo_len);
        sum = 0;
        for (int32_t j = 0; j < NB; j++) {
            int32_t v = col_sz[(int64_t)h * NB + j];
            if (v < 0 || v % g)
                return INVALID("block_col_sz[%d][%d]=%d: must be >= 0 and a multiple of "
                               "col_granularity=%d", (int)h, (int)j, (int)v, (int)g);
            sum += v;
        }
        if (sum != kv_len)
            return INVALID("block_col_sz[%d] sums to %lld, expected kv_len=%d", (int)h,
                           (long long)sum, (int)kv_len);
    }
    for (int32_t h = 0; h < b->num_plans; h++) {
        int32_t *qo = b->qo + h * stride_q, *kv = b->kv + h * stride_q;
        int32_t *last = b->last + (int64_t)h * b->max_rows;
        int32_t *idx = b->indices + (int64_t)h * b->max_pages;
        const int32_t *rs = row_sz + (int64_t)h * MB, *cs = col_sz + (int64_t)h * NB;
        int64_t pages = 0;
        qo[0] = kv[0] = 0;
        for (int32_t r = 0; r < MB; r++) {
            int32_t col = 0;
            for (int32_t j = 0; j < NB; j++) {
                int32_t w = cs[j];
                if (map[((int64_t)h * MB + r) * NB + j] && w > 0) {
                    if (pages + w / g > b->max_pages)
                        return fi_error(FI_STATUS_BOUND_EXCEEDED,
                                        "fi_bsr_update_variable: KV head %d reads more than "
                                        "max_nnz=%lld key pages", (int)h,
                                        (long long)b->max_pages);
                    for (int32_t k = 0; k < w / g; k++) idx[pages++] = col / g + k;
                }
                col += w;
            }
            qo[r + 1] = qo[r] + rs[r];
            kv[r + 1] = (int32_t)pages;
            last[r] = kv[r + 1] > kv[r] ? g : 0;
        }
        fi_batch batch = {.batch_size = MB, .qo_indptr = qo, .kv_indptr = kv,
                          .kv_indices = idx, .kv_last_page_len = last};
        if ((st = fi_plan_update(b->plans[h], &batch))) return st;
    }
    b->qo_len = qo_len;
    b->kv_len = kv_len;
    b->planned = true;
    return FI_OK;
}

fi_status fi_bsr_packed_mask(const fi_bsr *b, const uint8_t **bits, int64_t *bytes) {
    fi_status st = fi_handle_check(b, FI_MAGIC_BSR, "fi_bsr_packed_mask", "bsr");
    if (st) return st;
    if (!bits || !bytes) return INVALID("fi_bsr_packed_mask: NULL argument");
    if (!b->planned)
        return fi_error(FI_STATUS_NOT_PLANNED, "fi_bsr_packed_mask: no update yet");
    *bits = b->config.element_mask ? b->mask : NULL;
    *bytes = b->config.element_mask ? b->mask_bytes : 0;
    return FI_OK;
}

/* K or V [N, H_kv, D] as pages [ceil(N / ps), ps, heads, D] starting at KV
 * head `head` (heads = 1) or covering every head (head < 0). */
static fi_tensor page_view(const fi_tensor *t, int32_t ps, int32_t head) {
    fi_tensor v = *t;
    size_t es = fi_dtype_size(t->dtype);
    v.ndim = 4;
    v.shape[0] = cdiv(t->shape[0], ps);
    v.shape[1] = ps;
    v.shape[2] = head < 0 ? t->shape[1] : 1;
    v.shape[3] = t->shape[2];
    v.stride[0] = t->stride[0] * ps;
    v.stride[1] = t->stride[0];
    v.stride[2] = t->stride[1];
    v.stride[3] = t->stride[2];
    if (head > 0) v.data = (char *)t->data + (size_t)head * (size_t)t->stride[1] * es;
    return v;
}

/* Query heads [h0, h0 + n) of a [rows, H, ...] tensor. */
static fi_tensor head_slice(const fi_tensor *t, int64_t h0, int64_t n) {
    fi_tensor v = *t;
    if (!t->data) return v;
    v.shape[1] = n;
    v.data = (char *)t->data + (size_t)(h0 * t->stride[1]) * fi_dtype_size(t->dtype);
    return v;
}

static fi_status bsr_run(fi_bsr *b, const fi_run_args *args) {
    if (!args) return INVALID("fi_bsr_run: args is NULL");
    if (!b->planned)
        return fi_error(FI_STATUS_NOT_PLANNED, "fi_bsr_run: no update yet; call fi_bsr_update");
    const fi_attention_params *p = &b->params;
    int64_t k_shape[3] = {-1, p->num_kv_heads, p->head_dim_qk};
    int64_t v_shape[3] = {-1, p->num_kv_heads, p->head_dim_vo};
    int64_t q_shape[3] = {-1, p->num_qo_heads, p->head_dim_qk};
    int64_t o_shape[3] = {-1, p->num_qo_heads, p->head_dim_vo};
    int64_t s_shape[2] = {-1, p->num_qo_heads};
    fi_status st = fi_check_tensor(&args->q, "q", p->q_dtype, 3, q_shape);
    if (!st) st = fi_check_tensor(&args->o, "o", p->o_dtype, 3, o_shape);
    if (!st && args->lse.data) st = fi_check_tensor(&args->lse, "lse", FI_DTYPE_F32, 2, s_shape);
    if (!st) st = fi_check_tensor(&args->k, "k", p->kv_dtype, 3, k_shape);
    if (!st) st = fi_check_tensor(&args->v, "v", p->kv_dtype, 3, v_shape);
    if (!st && args->custom_mask.data)
        st = fi_check_tensor(&args->custom_mask, "custom_mask", FI_DTYPE_U8, 1, NULL);
    if (!st) st = fi_check_run_outputs(args);
    if (st) return st;
    int64_t bs = b->config.variable_blocks ? b->config.col_granularity : b->config.block_cols;
    for (int i = 0; i < 2; i++) {
        const fi_tensor *t = i ? &args->v : &args->k;
        int64_t page_stride;
        if (!fi_mul_i64(t->stride[0], bs, &page_stride))
            return INVALID("%s.stride[0]=%lld x %lld keys per block overflows the address range",
                           i ? "v" : "k", (long long)t->stride[0], (long long)bs);
    }
    if (args->k.shape[0] < b->kv_len || args->v.shape[0] < b->kv_len)
        return INVALID("k.shape[0]=%lld, v.shape[0]=%lld: the update has kv_len=%d keys",
                       (long long)args->k.shape[0], (long long)args->v.shape[0],
                       (int)b->kv_len);
    fi_run_args a = *args;
    fi_tensor k = args->k, v = args->v;
    k.shape[0] = v.shape[0] = b->kv_len; /* the view never reaches past kv_len */
    if (!b->config.variable_blocks) {
        int32_t C = b->config.block_cols;
        a.k = page_view(&k, C, -1);
        a.v = page_view(&v, C, -1);
        if (b->config.element_mask && !args->custom_mask.data) {
            int64_t bytes = b->mask_bytes > 0 ? b->mask_bytes : 1;
            a.custom_mask = fi_tensor_contiguous(b->dev_mask, FI_DTYPE_U8, 1, &bytes);
        }
        return fi_plan_run(b->plans[0], &a);
    }
    int64_t group = p->num_qo_heads / p->num_kv_heads;
    int32_t g = b->config.col_granularity;
    for (int32_t h = 0; h < b->num_plans; h++) {
        a.q = head_slice(&args->q, h * group, group);
        a.o = head_slice(&args->o, h * group, group);
        a.lse = head_slice(&args->lse, h * group, group);
        a.k = page_view(&k, g, h);
        a.v = page_view(&v, g, h);
        if ((st = fi_plan_run(b->plans[h], &a))) return st;
    }
    return FI_OK;
}

/* ------------------------------------------------------------ entry points */

fi_status fi_bsr_update(fi_bsr *b, int32_t qo_len, int32_t kv_len, const int32_t *indptr,
                        const int32_t *indices, const uint8_t *block_mask) {
    fi_status st = FI_HANDLE_ENTER(b, FI_MAGIC_BSR, "fi_bsr_update", "bsr");
    if (st) return st;
    if (!(st = fi_context_check(b->ctx, "fi_bsr_update")))
        st = bsr_update(b, qo_len, kv_len, indptr, indices, block_mask);
    fi_handle_leave(&b->busy);
    return st;
}

fi_status fi_bsr_update_variable(fi_bsr *b, int32_t qo_len, int32_t kv_len,
                                 int32_t num_block_rows, int32_t num_block_cols,
                                 const int32_t *row_sz, const int32_t *col_sz,
                                 const uint8_t *map) {
    fi_status st = FI_HANDLE_ENTER(b, FI_MAGIC_BSR, "fi_bsr_update_variable", "bsr");
    if (st) return st;
    if (!(st = fi_context_check(b->ctx, "fi_bsr_update_variable")))
        st = bsr_update_variable(b, qo_len, kv_len, num_block_rows, num_block_cols, row_sz,
                                 col_sz, map);
    fi_handle_leave(&b->busy);
    return st;
}

fi_status fi_bsr_run(fi_bsr *b, const fi_run_args *args) {
    fi_status st = FI_HANDLE_ENTER(b, FI_MAGIC_BSR, "fi_bsr_run", "bsr");
    if (st) return st;
    if (!(st = fi_context_check(b->ctx, "fi_bsr_run"))) st = bsr_run(b, args);
    fi_handle_leave(&b->busy);
    return st;
}
