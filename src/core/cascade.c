/*
 * cascade.c — multi-level cascades and automatic shared-prefix detection,
 * composed from plans and the state merge (docs/CASCADE.md). No kernels:
 * every level is an ordinary paged plan whose O (f32) and LSE land in rows
 * of a fixed workspace; one fi_merge_states call through the backend table
 * merges the levels, in level order, into the caller's O and LSE.
 *
 * Workspace (per token t, level l, query head h):
 *   part_o   [max_qo, L, H, D_vo] f32     level l writes the view [:, l]
 *   part_lse [max_qo, L, H]       f32
 *   lse_out  [max_qo, H]          f32     the merged LSE when none is asked for
 */
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

/* Requests per split group bound (auto): scratch arrays have this many. */
struct fi_cascade {
    fi_context *ctx;
    fi_attention_params params;   /* the caller's, alibi_slopes not kept */
    int32_t num_levels;           /* plans in level[] (explicit), 2 (auto) */
    bool automatic;
    bool can_split;               /* auto: detection possible for these params */
    fi_prefix_detection detection;
    fi_plan *level[FI_CASCADE_MAX_LEVELS];
    fi_plan *direct;              /* auto: the plain batch as one plan */
    int32_t max_total_qo;

    /* state of the last update */
    bool planned;
    bool split;                   /* auto: the two levels run (else direct) */
    int32_t total_qo;
    fi_cascade_info info;

    /* workspace */
    void *ws;
    bool ws_owned;
    size_t ws_bytes;
    float *part_o, *part_lse, *lse_out;

    /* auto: the derived batches (capacity from the plain batch's bounds) */
    int32_t max_batch, max_pages;
    int32_t *pre_qo, *pre_kv, *pre_idx, *pre_last;
    int32_t *suf_kv, *suf_idx, *suf_last;
    int32_t *allowed;             /* full pages a request may share */
    void *host;
};

/* --------------------------------------------------------------- options */

void fi_cascade_options_init(fi_cascade_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->struct_size = sizeof *o;
    o->prefix_detection = FI_PREFIX_DETECTION_AUTO;
}

void fi_cascade_info_init(fi_cascade_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
}

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }

size_t fi_cascade_workspace_size(const fi_attention_params *p, int32_t num_levels,
                                 int32_t max_total_qo) {
    if (!p || num_levels <= 0 || max_total_qo <= 0 || p->num_qo_heads <= 0 ||
        p->head_dim_vo <= 0)
        return 0;
    size_t rows = (size_t)max_total_qo * (size_t)p->num_qo_heads;
    size_t b = align64(rows * (size_t)num_levels * (size_t)p->head_dim_vo * sizeof(float));
    b += align64(rows * (size_t)num_levels * sizeof(float));
    b += align64(rows * sizeof(float));
    return b;
}

/* ---------------------------------------------------------------- create */

static fi_status check_options(const fi_cascade_options *o) {
    if (o->struct_size != sizeof *o)
        return INVALID("fi_cascade_options.struct_size=%u, expected %zu: call "
                       "fi_cascade_options_init first", (unsigned)o->struct_size, sizeof *o);
    if (o->prefix_detection < FI_PREFIX_DETECTION_AUTO ||
        o->prefix_detection > FI_PREFIX_DETECTION_ALWAYS)
        return INVALID("prefix_detection=%d is not a fi_prefix_detection",
                       (int)o->prefix_detection);
    if (o->workspace && ((uintptr_t)o->workspace & 63))
        return INVALID("cascade workspace %p: must be 64-byte aligned", o->workspace);
    return FI_OK;
}

/* Carve (or allocate) the partial-state workspace for `levels` levels. */
static fi_status setup_workspace(fi_cascade *c, const fi_cascade_options *o, int32_t levels) {
    size_t need = fi_cascade_workspace_size(&c->params, levels, c->max_total_qo);
    if (o->workspace) {
        if (o->workspace_bytes < need)
            return INVALID("cascade workspace_bytes=%zu < %zu needed for %d levels x "
                           "max_total_qo=%d (fi_cascade_workspace_size)",
                           o->workspace_bytes, need, (int)levels, (int)c->max_total_qo);
        c->ws = o->workspace;
    } else {
        if (c->ctx->device != FI_DEVICE_CPU)
            return INVALID("fi_cascade: a %s context needs options.workspace of %zu bytes "
                           "of device memory (fi_cascade_workspace_size)",
                           c->ctx->backend->name, need);
        c->ws = aligned_alloc(64, align64(need));
        if (!c->ws)
            return fi_error(FI_STATUS_OUT_OF_MEMORY, "cascade workspace of %zu bytes", need);
        c->ws_owned = true;
    }
    c->ws_bytes = need;
    size_t rows = (size_t)c->max_total_qo * (size_t)c->params.num_qo_heads;
    char *p = c->ws;
    c->part_o = (float *)p;
    p += align64(rows * (size_t)levels * (size_t)c->params.head_dim_vo * sizeof(float));
    c->part_lse = (float *)p;
    p += align64(rows * (size_t)levels * sizeof(float));
    c->lse_out = (float *)p;
    return FI_OK;
}

/* Params of level l of L: earlier levels see every key of theirs. */
static fi_attention_params level_params(const fi_attention_params *p, bool last,
                                        bool to_workspace) {
    fi_attention_params q = *p;
    if (!last) {
        q.mask_mode = FI_MASK_NONE;
        q.window_left = -1;
    }
    if (to_workspace) q.o_dtype = FI_DTYPE_F32;
    return q;
}

static fi_status check_params(fi_context *ctx, const fi_attention_params *params,
                              fi_cascade **out) {
    if (!out) return INVALID("fi_cascade_create: out is NULL");
    *out = NULL;
    if (!ctx) return INVALID("fi_cascade_create: context is NULL");
    if (!params) return INVALID("fi_cascade_create: params is NULL");
    if (params->struct_size == sizeof *params && params->kv_format != FI_KV_FORMAT_PAGED)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "fi_cascade: kv_format=%d: cascades index a paged KV pool "
                        "(FI_KV_FORMAT_PAGED)", (int)params->kv_format);
    if (params->struct_size == sizeof *params && params->variant)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "fi_cascade: user-defined variants are not supported in cascades "
                        "(levels are merged by LSE before the output transform); use a plan");
    return FI_OK;
}

static fi_cascade *cascade_new(fi_context *ctx, const fi_attention_params *params) {
    fi_cascade *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->ctx = ctx;
    c->params = *params;
    fi_cascade_info_init(&c->info);
    return c;
}

fi_status fi_cascade_create(fi_context *ctx, const fi_attention_params *params,
                            int32_t num_levels, const fi_plan_config *level_configs,
                            const fi_cascade_options *options, fi_cascade **out) {
    fi_status st = check_params(ctx, params, out);
    if (st) return st;
    if (num_levels < 1 || num_levels > FI_CASCADE_MAX_LEVELS)
        return INVALID("fi_cascade_create: num_levels=%d: expected 1 to %d", (int)num_levels,
                       FI_CASCADE_MAX_LEVELS);
    if (!level_configs) return INVALID("fi_cascade_create: level_configs is NULL");
    fi_cascade_options opt;
    fi_cascade_options_init(&opt);
    if (options) opt = *options;
    if ((st = check_options(&opt))) return st;
    if (num_levels > 1 && params->struct_size == sizeof *params &&
        params->pos_encoding != FI_POS_NONE)
        return fi_error(FI_STATUS_UNSUPPORTED,
                        "fi_cascade_create: pos_encoding=%d with %d levels: a shared level has "
                        "no per-request key positions; apply RoPE with fi_rope_apply first",
                        (int)params->pos_encoding, (int)num_levels);
    int32_t max_qo = level_configs[0].max_total_qo;
    for (int32_t l = 1; l < num_levels; l++)
        if (level_configs[l].max_total_qo != max_qo)
            return INVALID("level_configs[%d].max_total_qo=%d != level_configs[0].max_total_qo="
                           "%d: every level covers the same query tokens", (int)l,
                           (int)level_configs[l].max_total_qo, (int)max_qo);

    fi_cascade *c = cascade_new(ctx, params);
    if (!c) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_cascade_create: out of memory");
    c->num_levels = num_levels;
    c->max_total_qo = max_qo;
    for (int32_t l = 0; l < num_levels && !st; l++) {
        fi_attention_params lp = level_params(params, l == num_levels - 1, num_levels > 1);
        st = fi_plan_create(ctx, &lp, &level_configs[l], &c->level[l]);
        if (st && l > 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", fi_last_error());
            st = fi_error(st, "cascade level %d: %s", (int)l, msg);
        }
    }
    if (!st && num_levels > 1) st = setup_workspace(c, &opt, num_levels);
    if (st) {
        fi_cascade_destroy(c);
        return st;
    }
    *out = c;
    return FI_OK;
}

static void *carve(char **cursor, size_t bytes) {
    uintptr_t p = ((uintptr_t)*cursor + 63) & ~(uintptr_t)63;
    *cursor = (char *)(p + bytes);
    return (void *)p;
}

fi_status fi_cascade_create_auto(fi_context *ctx, const fi_attention_params *params,
                                 const fi_plan_config *config,
                                 const fi_cascade_options *options, fi_cascade **out) {
    fi_status st = check_params(ctx, params, out);
    if (st) return st;
    if (!config) return INVALID("fi_cascade_create_auto: config is NULL");
    fi_cascade_options opt;
    fi_cascade_options_init(&opt);
    if (options) opt = *options;
    if ((st = check_options(&opt))) return st;

    fi_cascade *c = cascade_new(ctx, params);
    if (!c) return fi_error(FI_STATUS_OUT_OF_MEMORY, "fi_cascade_create_auto: out of memory");
    c->automatic = true;
    c->num_levels = 2;
    c->detection = opt.prefix_detection;
    c->max_total_qo = config->max_total_qo;
    if ((st = fi_plan_create(ctx, params, config, &c->direct))) {
        fi_cascade_destroy(c);
        return st;
    }
    /* A shared level holds keys without their positions in each request
     * and without the request's mask: split only where that changes nothing
     * (docs/CASCADE.md "What can be split"). */
    c->can_split = opt.prefix_detection != FI_PREFIX_DETECTION_OFF &&
                   params->pos_encoding == FI_POS_NONE && params->window_left < 0 &&
                   params->mask_mode != FI_MASK_CUSTOM;
    if (c->can_split) {
        c->max_batch = config->max_batch_size;
        c->max_pages = config->max_total_kv;
        size_t b = (size_t)c->max_batch, p = (size_t)c->max_pages;
        size_t bytes = (4 * (b + 1) + 4 * b + 2 * p) * sizeof(int32_t) + 16 * 64;
        char *m = calloc(1, bytes);
        if (!m) st = fi_error(FI_STATUS_OUT_OF_MEMORY, "cascade host arrays of %zu bytes", bytes);
        c->host = m;
        if (m) {
            c->pre_qo = carve(&m, (b + 1) * sizeof(int32_t));
            c->pre_kv = carve(&m, (b + 1) * sizeof(int32_t));
            c->suf_kv = carve(&m, (b + 1) * sizeof(int32_t));
            c->pre_last = carve(&m, b * sizeof(int32_t));
            c->suf_last = carve(&m, b * sizeof(int32_t));
            c->allowed = carve(&m, b * sizeof(int32_t));
            c->pre_idx = carve(&m, p * sizeof(int32_t));
            c->suf_idx = carve(&m, p * sizeof(int32_t));
        }
        for (int32_t l = 0; l < 2 && !st; l++) {
            fi_attention_params lp = level_params(params, l == 1, true);
            st = fi_plan_create(ctx, &lp, config, &c->level[l]);
        }
        if (!st) st = setup_workspace(c, &opt, 2);
    }
    if (st) {
        fi_cascade_destroy(c);
        return st;
    }
    *out = c;
    return FI_OK;
}

void fi_cascade_destroy(fi_cascade *c) {
    if (!c) return;
    for (int32_t l = 0; l < FI_CASCADE_MAX_LEVELS; l++) fi_plan_destroy(c->level[l]);
    fi_plan_destroy(c->direct);
    if (c->ws_owned) free(c->ws);
    free(c->host);
    free(c);
}

/* ---------------------------------------------------------------- update */

static fi_status level_error(fi_status st, int32_t l) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fi_last_error());
    return fi_error(st, "cascade level %d: %s", (int)l, msg);
}

fi_status fi_cascade_update(fi_cascade *c, const fi_batch *levels) {
    if (!c) return INVALID("fi_cascade_update: cascade is NULL");
    if (!levels) return INVALID("fi_cascade_update: levels is NULL");
    if (c->automatic)
        return INVALID("fi_cascade_update: this cascade was made by fi_cascade_create_auto; "
                       "plan it with fi_cascade_update_batch");
    c->planned = false;
    int32_t total = -1;
    for (int32_t l = 0; l < c->num_levels; l++) {
        const fi_batch *b = &levels[l];
        if (b->batch_size < 0)
            return INVALID("cascade level %d: batch_size=%d is negative", (int)l,
                           (int)b->batch_size);
        fi_status st = fi_check_indptr(b->qo_indptr, b->batch_size, "qo_indptr", -1);
        if (st) return level_error(st, l);
        int32_t t = b->qo_indptr[b->batch_size];
        if (total >= 0 && t != total)
            return INVALID("cascade level %d: qo_indptr[%d]=%d != %d query tokens of level 0: "
                           "every level covers the same query tokens", (int)l,
                           (int)b->batch_size, (int)t, (int)total);
        total = t;
    }
    for (int32_t l = 0; l < c->num_levels; l++) {
        fi_status st = fi_plan_update(c->level[l], &levels[l]);
        if (st) return level_error(st, l);
    }
    c->total_qo = total;
    fi_cascade_info_init(&c->info);
    c->info.num_levels = c->num_levels;
    c->planned = true;
    return FI_OK;
}

/* The cost model's figure for one request: `rows` packed query rows (tokens
 * x group) against `keys` keys, tiled as the scheduler tiles it: a tile
 * re-reads the keys, so rows beyond the largest tile cost another pass. */
static double item_cost(const fi_backend *be, int32_t heads, int64_t rows, int64_t keys) {
    if (rows <= 0) return 0.0;
    int32_t max_tile = be->q_tiles[be->num_q_tiles - 1];
    int64_t tiles = (rows + max_tile - 1) / max_tile;
    int64_t tile = max_tile;
    if (tiles == 1)
        for (int32_t i = 0; i < be->num_q_tiles; i++)
            if (be->q_tiles[i] >= rows) {
                tile = be->q_tiles[i];
                break;
            }
    return (double)heads * (double)tiles *
           (be->cost_per_q_row * (double)tile + be->cost_per_key * (double)keys +
            be->cost_per_row_key * (double)tile * (double)keys);
}

/* Required gain before splitting: the merge is estimated, not measured. */
#define FI_CASCADE_SPLIT_MARGIN 0.9

static fi_status detect_and_plan(fi_cascade *c, const fi_batch *b) {
    const fi_backend *be = c->ctx->backend;
    const fi_attention_params *p = &c->params;
    int32_t n = b->batch_size, ps = p->page_size;
    int32_t heads = p->num_kv_heads, group = p->num_qo_heads / p->num_kv_heads;
    bool causal = p->mask_mode == FI_MASK_CAUSAL;
    const int32_t *qi = b->qo_indptr, *ki = b->kv_indptr, *idx = b->kv_indices;

    /* Full pages each request may put in a shared, non-causal level: all its
     * full pages, and with causal no key past its first query's position
     * (kv_len - qo_len), so the suffix keeps every key a query may not see. */
    for (int32_t i = 0; i < n; i++) {
        int32_t pages = ki[i + 1] - ki[i];
        int32_t full = pages == 0 ? 0 : pages - (b->kv_last_page_len[i] < ps);
        if (causal) {
            int64_t kv = pages ? (int64_t)ps * (pages - 1) + b->kv_last_page_len[i] : 0;
            int64_t first_pos = kv - (qi[i + 1] - qi[i]) + 1; /* keys the first query sees */
            int64_t lim = first_pos < 0 ? 0 : first_pos / ps;
            if (lim < full) full = (int32_t)lim;
        }
        c->allowed[i] = full;
    }

    /* Greedy grouping of consecutive requests: extend the group while the
     * pages it saves, (members - 1) x shared pages, do not shrink. */
    double single = 0, cascade = 0;
    int32_t groups = 0, shared_groups = 0;
    int64_t saved = 0, pre_pages = 0, suf_pages = 0;
    c->pre_qo[0] = 0;
    c->pre_kv[0] = 0;
    c->suf_kv[0] = 0;
    for (int32_t i = 0; i < n;) {
        int32_t shared = c->allowed[i], members = 1;
        while (i + members < n) {
            int32_t j = i + members, lim = shared < c->allowed[j] ? shared : c->allowed[j];
            int32_t lcp = 0;
            while (lcp < lim && idx[ki[i] + lcp] == idx[ki[j] + lcp]) lcp++;
            if (lcp == 0 || (int64_t)members * lcp < (int64_t)(members - 1) * shared) break;
            shared = lcp;
            members++;
        }
        if (members == 1) shared = 0;
        int32_t g = groups++;
        c->pre_qo[g + 1] = qi[i + members];
        for (int32_t k = 0; k < shared; k++) c->pre_idx[pre_pages + k] = idx[ki[i] + k];
        pre_pages += shared;
        c->pre_kv[g + 1] = (int32_t)pre_pages;
        c->pre_last[g] = shared ? ps : 0;
        int64_t g_rows = (int64_t)(qi[i + members] - qi[i]) * group;
        cascade += item_cost(be, heads, g_rows, (int64_t)shared * ps);
        if (shared) {
            shared_groups++;
            saved += (int64_t)(members - 1) * shared;
        }
        for (int32_t r = i; r < i + members; r++) {
            int32_t pages = ki[r + 1] - ki[r], rest = pages - shared;
            for (int32_t k = 0; k < rest; k++) c->suf_idx[suf_pages + k] = idx[ki[r] + shared + k];
            suf_pages += rest;
            c->suf_kv[r + 1] = (int32_t)suf_pages;
            c->suf_last[r] = rest ? b->kv_last_page_len[r] : 0;
            int64_t kv = pages ? (int64_t)ps * (pages - 1) + b->kv_last_page_len[r] : 0;
            int64_t rows = (int64_t)(qi[r + 1] - qi[r]) * group;
            single += item_cost(be, heads, rows, kv);
            cascade += item_cost(be, heads, rows, kv - (int64_t)shared * ps);
        }
        i += members;
    }
    /* The merge reads two f32 states and writes one per (token, query
     * head): priced as a pass over two keys of every row. */
    int64_t rows = (int64_t)qi[n] * group;
    cascade += (double)heads * (double)rows *
               (be->cost_per_q_row + 2.0 * (be->cost_per_key + be->cost_per_row_key));

    c->info.cost_single = single;
    c->info.cost_cascade = cascade;
    c->info.num_groups = shared_groups;
    c->info.saved_page_reads = saved;
    bool split = shared_groups > 0 &&
                 (c->detection == FI_PREFIX_DETECTION_ALWAYS ||
                  cascade <= FI_CASCADE_SPLIT_MARGIN * single);
    if (!split) return FI_OK;

    fi_batch pre = {.batch_size = groups, .qo_indptr = c->pre_qo, .kv_indptr = c->pre_kv,
                    .kv_indices = c->pre_idx, .kv_last_page_len = c->pre_last};
    fi_batch suf = {.batch_size = n, .qo_indptr = qi, .kv_indptr = c->suf_kv,
                    .kv_indices = c->suf_idx, .kv_last_page_len = c->suf_last,
                    .mask_indptr = NULL};
    fi_status st = fi_plan_update(c->level[0], &pre);
    if (st) return level_error(st, 0);
    if ((st = fi_plan_update(c->level[1], &suf))) return level_error(st, 1);
    c->split = true;
    return FI_OK;
}

fi_status fi_cascade_update_batch(fi_cascade *c, const fi_batch *batch) {
    if (!c) return INVALID("fi_cascade_update_batch: cascade is NULL");
    if (!batch) return INVALID("fi_cascade_update_batch: batch is NULL");
    if (!c->automatic)
        return INVALID("fi_cascade_update_batch: this cascade has explicit levels; plan it "
                       "with fi_cascade_update (or make it with fi_cascade_create_auto)");
    c->planned = false;
    c->split = false;
    fi_cascade_info_init(&c->info);
    /* The direct plan validates the batch (indptrs, lengths, bounds) before
     * detection reads a page id. */
    fi_status st = fi_plan_update(c->direct, batch);
    if (st) return st;
    c->total_qo = batch->qo_indptr[batch->batch_size];
    if (c->can_split && (st = detect_and_plan(c, batch))) return st;
    c->info.num_levels = c->split ? 2 : 1;
    c->info.split = c->split;
    c->planned = true;
    return FI_OK;
}

fi_status fi_cascade_get_info(const fi_cascade *c, fi_cascade_info *info) {
    if (!c || !info) return INVALID("fi_cascade_get_info: NULL argument");
    if (info->struct_size != sizeof *info)
        return INVALID("fi_cascade_info.struct_size=%u, expected %zu",
                       (unsigned)info->struct_size, sizeof *info);
    if (!c->planned)
        return fi_error(FI_STATUS_NOT_PLANNED, "fi_cascade_get_info: no batch planned yet");
    *info = c->info;
    return FI_OK;
}

/* ------------------------------------------------------------------- run */

static fi_tensor f32_view(float *data, int32_t ndim, const int64_t *shape,
                          const int64_t *stride) {
    fi_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = FI_DTYPE_F32;
    t.ndim = ndim;
    for (int32_t d = 0; d < ndim; d++) {
        t.shape[d] = shape[d];
        t.stride[d] = stride[d];
    }
    return t;
}

/* Levels plans[0..L) into the workspace, then one ordered merge into o/lse. */
static fi_status run_levels(fi_cascade *c, fi_plan *const *plans, int32_t L,
                            const fi_run_args *args) {
    const fi_attention_params *p = &c->params;
    int64_t n = c->total_qo, H = p->num_qo_heads, D = p->head_dim_vo;
    /* o and lse are checked like a plan's: shapes, rows, dtypes. */
    int64_t o_shape[3] = {-1, H, D};
    fi_status st = fi_check_tensor(&args->o, "o", p->o_dtype, 3, o_shape);
    if (st) return st;
    if (args->o.shape[0] < n)
        return INVALID("o.shape[0]=%lld is too small: the batch has %lld query tokens",
                       (long long)args->o.shape[0], (long long)n);
    if (args->lse.data) {
        int64_t s_shape[2] = {-1, H};
        if ((st = fi_check_tensor(&args->lse, "lse", FI_DTYPE_F32, 2, s_shape))) return st;
        if (args->lse.shape[0] < n)
            return INVALID("lse.shape[0]=%lld is too small: the batch has %lld query tokens",
                           (long long)args->lse.shape[0], (long long)n);
    }
    for (int32_t l = 0; l < L; l++) {
        fi_run_args a = *args;
        int64_t os[3] = {n, H, D}, ostr[3] = {L * H * D, D, 1};
        int64_t ss[2] = {n, H}, sstr[2] = {L * H, 1};
        a.o = f32_view(c->part_o + l * H * D, 3, os, ostr);
        a.lse = f32_view(c->part_lse + l * H, 2, ss, sstr);
        if (l < L - 1) memset(&a.custom_mask, 0, sizeof a.custom_mask);
        if ((st = fi_plan_run(plans[l], &a))) return level_error(st, l);
    }
    if (n == 0) return FI_OK;
    int64_t vs[4] = {n, L, H, D}, vstr[4] = {L * H * D, H * D, D, 1};
    int64_t ss[3] = {n, L, H}, sstr[3] = {L * H, H, 1};
    fi_tensor v = f32_view(c->part_o, 4, vs, vstr), s = f32_view(c->part_lse, 3, ss, sstr);
    fi_tensor o = args->o;
    o.shape[0] = n;
    fi_tensor lse;
    if (args->lse.data) {
        lse = args->lse;
        lse.shape[0] = n;
    } else {
        int64_t ls[2] = {n, H}, lstr[2] = {H, 1};
        lse = f32_view(c->lse_out, 2, ls, lstr);
    }
    return fi_merge_states(c->ctx, &v, &s, &o, &lse, args->stream);
}

fi_status fi_cascade_run(fi_cascade *c, const fi_run_args *args) {
    if (!c) return INVALID("fi_cascade_run: cascade is NULL");
    if (!args) return INVALID("fi_cascade_run: args is NULL");
    if (!c->planned)
        return fi_error(FI_STATUS_NOT_PLANNED,
                        "fi_cascade_run: nothing planned; call fi_cascade_update first");
    if (c->automatic && !c->split) return fi_plan_run(c->direct, args);
    if (!c->automatic && c->num_levels == 1) return fi_plan_run(c->level[0], args);
    return run_levels(c, c->level, c->num_levels, args);
}
