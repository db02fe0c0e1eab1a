/*
 * cascade.c — multi-level cascades and automatic shared-prefix detection,
 * composed from plans and the state merge (docs/CASCADE.md). No kernels:
 * every level is an ordinary paged plan whose O (f32) and LSE land in rows
 * of a fixed workspace; one fi_merge_states call through the backend table
 * merges the levels, in level order, into the caller's O and LSE.
 *
 * Workspace (backend memory, per token t, level l, query head h):
 *   part_o   [max_qo, L, H, D_vo] f32     level l writes the view [:, l]
 *   part_lse [max_qo, L, H]       f32
 *   lse_out  [max_qo, H]          f32     the merged LSE when none is asked for
 *
 * Automatic detection builds a radix tree of the batch's page tables over
 * consecutive requests: level k's groups are the maximal runs, inside one
 * group of level k - 1, whose requests share more full pages than the
 * levels above hold; each group's next pages form one request of level k.
 * The cost model picks how many shared levels to keep (the rest of every
 * table goes to the suffix level), or none.
 */
#include "core/checked.h"
#include "core/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define INVALID(...) fi_error(FI_STATUS_INVALID_ARGUMENT, __VA_ARGS__)

/* Automatic cascades: shared levels at most (plus the suffix level). */
#define SHARED_MAX (FI_CASCADE_AUTO_MAX_LEVELS - 1)

struct fi_cascade {
    uint32_t magic;               /* FI_MAGIC_CASCADE while alive */
    _Atomic int32_t busy;         /* a call is inside */
    fi_context *ctx;
    fi_attention_params params;   /* the caller's, alibi_slopes not kept */
    int32_t num_levels;           /* plans in level[] (explicit) */
    bool automatic;
    bool can_split;               /* auto: detection possible for these params */
    fi_prefix_detection detection;
    /* explicit: level l's plan; auto: the shared levels' plans */
    fi_plan *level[FI_CASCADE_MAX_LEVELS];
    fi_plan *suffix;              /* auto: the last level */
    fi_plan *direct;              /* auto: the plain batch as one plan */
    int32_t max_total_qo;

    /* state of the last update */
    bool planned;
    bool split;                   /* auto: shared levels + suffix run (else direct) */
    int32_t shared_levels;        /* auto: shared levels of the split */
    int32_t total_qo;
    fi_cascade_info info;

    /* workspace */
    void *ws;
    bool ws_owned;
    size_t ws_bytes;
    float *part_o, *part_lse, *lse_out;

    /* auto: the derived batches (capacity from the plain batch's bounds) */
    int32_t max_batch, max_pages;
    int32_t *lv_qo[SHARED_MAX], *lv_kv[SHARED_MAX], *lv_last[SHARED_MAX];
    int32_t *lv_base[SHARED_MAX]; /* [B] pages of each request held by levels <= k */
    int64_t lv_at[SHARED_MAX];    /* level k's pages start at shared_idx[lv_at[k]] */
    int32_t lv_groups[SHARED_MAX];
    int32_t *shared_idx;          /* [P] the shared levels' pages, level after level */
    int32_t *suf_kv, *suf_idx, *suf_last;
    int32_t *allowed;             /* [B] full pages a request may share */
    int32_t *lcp;                 /* [B] pages request i shares with request i + 1 */
    uint8_t *starts;              /* [B] request i starts a group of the last level built */
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

/* 0 for arguments that name no workspace, or one whose size overflows. */
size_t fi_cascade_workspace_size(const fi_attention_params *p, int32_t num_levels,
                                 int32_t max_total_qo) {
    if (!p || num_levels <= 0 || max_total_qo <= 0 || p->num_qo_heads <= 0 ||
        p->head_dim_vo <= 0)
        return 0;
    size_t rows, level_rows;
    if (!fi_mul_size((size_t)max_total_qo, (size_t)p->num_qo_heads, &rows) ||
        !fi_mul_size(rows, (size_t)num_levels, &level_rows))
        return 0;
    fi_size_sum sum = {0, false};
    fi_size_sum_add(&sum, level_rows, (size_t)p->head_dim_vo * sizeof(float), 64);
    fi_size_sum_add(&sum, level_rows, sizeof(float), 64);
    fi_size_sum_add(&sum, rows, sizeof(float), 64);
    fi_size_sum_add(&sum, 0, 1, 64);
    return sum.overflow ? 0 : sum.bytes;
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
    if (need == 0)
        return INVALID("cascade workspace for %d levels x max_total_qo=%d x num_qo_heads=%d x "
                       "head_dim_vo=%d overflows the address range", (int)levels,
                       (int)c->max_total_qo, (int)c->params.num_qo_heads,
                       (int)c->params.head_dim_vo);
    if (o->workspace) {
        if (o->workspace_bytes < need)
            return INVALID("cascade workspace_bytes=%zu < %zu needed for %d levels x "
                           "max_total_qo=%d (fi_cascade_workspace_size)",
                           o->workspace_bytes, need, (int)levels, (int)c->max_total_qo);
        c->ws = o->workspace;
    } else {
        fi_status st = fi_backend_alloc(c->ctx, need, &c->ws);
        if (st) return st;
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

/* Partial-state rows for a shared level's plan. Its one query tile (all the
 * tokens that share a prefix) faces a long span; the scheduler cuts it into
 * chunks, each chunk's tokens a partial state, within this budget: about one
 * chunk of max_total_qo tokens per item in flight. */
static int32_t shared_budget(fi_context *ctx, const fi_attention_params *p,
                             const fi_plan_config *cfg) {
    if (p->struct_size != sizeof *p || p->num_kv_heads <= 0 || p->num_qo_heads <= 0 ||
        p->head_dim_vo <= 0 || cfg->max_total_qo <= 0)
        return 0; /* fi_plan_create names the bad value */
    int32_t n = cfg->num_workers > 0 ? cfg->num_workers : ctx->backend->num_workers(ctx);
    return fi_plan_split_rows(n, p, cfg->max_total_qo);
}

static fi_status shared_plan(fi_context *ctx, const fi_attention_params *lp,
                             const fi_plan_config *cfg, fi_plan **out) {
    return fi_plan_create_budget(ctx, lp, cfg, shared_budget(ctx, lp, cfg), out);
}

static fi_status check_params(fi_context *ctx, const fi_attention_params *params,
                              fi_cascade **out) {
    if (!out) return INVALID("fi_cascade_create: out is NULL");
    *out = NULL;
    fi_status st = fi_context_check(ctx, "fi_cascade_create");
    if (st) return st;
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
    c->magic = FI_MAGIC_CASCADE;
    c->ctx = ctx;
    fi_context_retain(ctx);
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
        bool last = l == num_levels - 1;
        fi_attention_params lp = level_params(params, last, num_levels > 1);
        st = last ? fi_plan_create(ctx, &lp, &level_configs[l], &c->level[l])
                  : shared_plan(ctx, &lp, &level_configs[l], &c->level[l]);
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
        /* the arrays carved below, in their order, each 64-byte aligned */
        fi_size_sum sum = {64, false};
        for (int32_t k = 0; k < SHARED_MAX; k++) {
            fi_size_sum_add(&sum, b + 1, sizeof(int32_t), 64); /* lv_qo */
            fi_size_sum_add(&sum, b + 1, sizeof(int32_t), 64); /* lv_kv */
            fi_size_sum_add(&sum, b, sizeof(int32_t), 64);     /* lv_last */
            fi_size_sum_add(&sum, b, sizeof(int32_t), 64);     /* lv_base */
        }
        fi_size_sum_add(&sum, b + 1, sizeof(int32_t), 64);     /* suf_kv */
        for (int i = 0; i < 3; i++) fi_size_sum_add(&sum, b, sizeof(int32_t), 64); /* suf_last, allowed, lcp */
        fi_size_sum_add(&sum, p, sizeof(int32_t), 64);         /* shared_idx */
        fi_size_sum_add(&sum, p, sizeof(int32_t), 64);         /* suf_idx */
        fi_size_sum_add(&sum, b, 1, 64);                       /* starts */
        size_t bytes = sum.bytes;
        char *m = sum.overflow ? NULL : calloc(1, bytes);
        if (!m) st = fi_error(FI_STATUS_OUT_OF_MEMORY, "cascade host arrays of %zu bytes%s", bytes,
                              sum.overflow ? " (overflows size_t)" : "");
        c->host = m;
        if (m) {
            for (int32_t k = 0; k < SHARED_MAX; k++) {
                c->lv_qo[k] = carve(&m, (b + 1) * sizeof(int32_t));
                c->lv_kv[k] = carve(&m, (b + 1) * sizeof(int32_t));
                c->lv_last[k] = carve(&m, b * sizeof(int32_t));
                c->lv_base[k] = carve(&m, b * sizeof(int32_t));
            }
            c->suf_kv = carve(&m, (b + 1) * sizeof(int32_t));
            c->suf_last = carve(&m, b * sizeof(int32_t));
            c->allowed = carve(&m, b * sizeof(int32_t));
            c->lcp = carve(&m, b * sizeof(int32_t));
            c->shared_idx = carve(&m, p * sizeof(int32_t));
            c->suf_idx = carve(&m, p * sizeof(int32_t));
            c->starts = carve(&m, b);
        }
        fi_attention_params shared = level_params(params, false, true);
        for (int32_t k = 0; k < SHARED_MAX && !st; k++)
            st = shared_plan(ctx, &shared, config, &c->level[k]);
        fi_attention_params last = level_params(params, true, true);
        if (!st) st = fi_plan_create(ctx, &last, config, &c->suffix);
        if (!st) st = setup_workspace(c, &opt, FI_CASCADE_AUTO_MAX_LEVELS);
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
    if (FI_HANDLE_ENTER(c, FI_MAGIC_CASCADE, "fi_cascade_destroy", "cascade")) return;
    fi_context *ctx = c->ctx;
    for (int32_t l = 0; l < FI_CASCADE_MAX_LEVELS; l++) fi_plan_destroy(c->level[l]);
    fi_plan_destroy(c->suffix);
    fi_plan_destroy(c->direct);
    if (c->ws_owned) fi_backend_free(ctx, c->ws);
    free(c->host);
    fi_handle_retire(&c->magic);
    free(c);
    fi_context_release(ctx);
}

/* ---------------------------------------------------------------- update */

static fi_status level_error(fi_status st, int32_t l) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fi_last_error());
    return fi_error(st, "cascade level %d: %s", (int)l, msg);
}

static fi_status cascade_update(fi_cascade *c, const fi_batch *levels) {
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
    int32_t max_tile = be->policy.q_tiles[be->policy.num_q_tiles - 1];
    int64_t tiles = (rows + max_tile - 1) / max_tile;
    int64_t tile = max_tile;
    if (tiles == 1)
        for (int32_t i = 0; i < be->policy.num_q_tiles; i++)
            if (be->policy.q_tiles[i] >= rows) {
                tile = be->policy.q_tiles[i];
                break;
            }
    return (double)heads * (double)tiles *
           (be->policy.cost_per_q_row * (double)tile + be->policy.cost_per_key * (double)keys +
            be->policy.cost_per_row_key * (double)tile * (double)keys);
}

/* Required gain before splitting: the merge is estimated, not measured. */
#define FI_CASCADE_SPLIT_MARGIN 0.9

/* Full pages each request may put in a shared, non-causal level: all its
 * full pages, and with causal no key past its first query's position
 * (kv_len - qo_len), so the suffix keeps every key a query may not see. */
static void shareable_pages(fi_cascade *c, const fi_batch *b) {
    int32_t ps = c->params.page_size;
    bool causal = c->params.mask_mode == FI_MASK_CAUSAL;
    const int32_t *qi = b->qo_indptr, *ki = b->kv_indptr;
    for (int32_t i = 0; i < b->batch_size; i++) {
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
    /* identical leading page ids of neighbours, within what both may share */
    for (int32_t i = 0; i + 1 < b->batch_size; i++) {
        int32_t lim = c->allowed[i] < c->allowed[i + 1] ? c->allowed[i] : c->allowed[i + 1];
        const int32_t *x = b->kv_indices + ki[i], *y = b->kv_indices + ki[i + 1];
        int32_t n = 0;
        while (n < lim && x[n] == y[n]) n++;
        c->lcp[i] = n;
    }
}

/* Shared level k of the radix tree over consecutive requests: inside each
 * group of level k - 1 (starts[]), a request joins its predecessor's group
 * when the two share more than base pages (base: held by the levels above,
 * the same for a whole group); a group's pages are the ones all its members
 * share beyond base (the minimum of its neighbours' lcp). Consecutive groups
 * without pages become one request of no keys. Returns the pages the level
 * holds (0: nothing more is shared), from shared_idx[at]; starts[] then
 * marks this level's groups; *saved = the page reads it saves, *cost
 * its cost-model figure. */
static int64_t build_shared_level(fi_cascade *c, const fi_batch *b, int32_t k, int64_t at,
                                  int64_t *saved, int32_t *groups, double *cost) {
    const fi_backend *be = c->ctx->backend;
    int32_t n = b->batch_size, ps = c->params.page_size;
    int32_t heads = c->params.num_kv_heads, group = c->params.num_qo_heads / heads;
    const int32_t *qi = b->qo_indptr, *ki = b->kv_indptr;
    const int32_t *base = k > 0 ? c->lv_base[k - 1] : NULL;
    int32_t *qo = c->lv_qo[k], *kv = c->lv_kv[k], *last = c->lv_last[k], *nb = c->lv_base[k];
    int32_t g = 0;
    int64_t pages = 0;
    qo[0] = 0;
    kv[0] = 0;
    c->lv_at[k] = at;
    *saved = 0;
    *groups = 0;
    *cost = 0;
    for (int32_t i = 0; i < n;) {
        int32_t b0 = base ? base[i] : 0, e = i + 1, shared = INT32_MAX;
        c->starts[i] = 1; /* only starts past e are read below */
        while (e < n && !c->starts[e] && c->lcp[e - 1] > b0) {
            if (c->lcp[e - 1] < shared) shared = c->lcp[e - 1];
            e++;
        }
        int32_t np = e - i >= 2 ? shared - b0 : 0;
        for (int32_t r = i; r < e; r++) nb[r] = b0 + np;
        bool merge = np == 0 && g > 0 && kv[g] == kv[g - 1]; /* joins a keyless request */
        if (!merge) g++;
        qo[g] = qi[e];
        if (np) {
            memcpy(c->shared_idx + at + pages, b->kv_indices + ki[i] + b0,
                   (size_t)np * sizeof(int32_t));
            pages += np;
            *saved += (int64_t)(e - i - 1) * np;
            (*groups)++;
            *cost += item_cost(be, heads, (int64_t)(qi[e] - qi[i]) * group, (int64_t)np * ps);
        } else {
            *cost += item_cost(be, heads, (int64_t)(qi[e] - qi[i]) * group, 0);
        }
        kv[g] = (int32_t)pages;
        last[g - 1] = kv[g] > kv[g - 1] ? ps : 0;
        i = e;
    }
    c->lv_groups[k] = g;
    return pages;
}

/* The cost of the suffix level (each request's keys past base pages) plus
 * the merge of `levels` states per row. */
static double suffix_cost(const fi_cascade *c, const fi_batch *b, const int32_t *base,
                          int32_t levels) {
    const fi_backend *be = c->ctx->backend;
    int32_t ps = c->params.page_size, heads = c->params.num_kv_heads;
    int32_t group = c->params.num_qo_heads / heads;
    double cost = 0;
    for (int32_t i = 0; i < b->batch_size; i++) {
        int32_t pages = b->kv_indptr[i + 1] - b->kv_indptr[i];
        int64_t kv = pages ? (int64_t)ps * (pages - 1) + b->kv_last_page_len[i] : 0;
        if (base) kv -= (int64_t)base[i] * ps;
        cost += item_cost(be, heads, (int64_t)(b->qo_indptr[i + 1] - b->qo_indptr[i]) * group, kv);
    }
    if (levels > 1) {
        /* the merge reads `levels` f32 states and writes one per (token,
         * query head): priced as a pass over that many keys of every row */
        int64_t rows = (int64_t)b->qo_indptr[b->batch_size] * group;
        cost += (double)heads * (double)rows *
                (be->policy.cost_per_q_row + levels * (be->policy.cost_per_key + be->policy.cost_per_row_key));
    }
    return cost;
}

static fi_status detect_and_plan(fi_cascade *c, const fi_batch *b) {
    int32_t n = b->batch_size;
    shareable_pages(c, b);
    double single = suffix_cost(c, b, NULL, 1), level_cost = 0, cost_upto[SHARED_MAX];
    int32_t depth = 0, best_depth = 0, groups_upto[SHARED_MAX];
    int64_t at = 0, saved_upto[SHARED_MAX], saved = 0;
    int32_t groups = 0;
    if (n > 0) memset(c->starts, 0, (size_t)n);
    for (int32_t k = 0; k < SHARED_MAX && n > 1; k++) {
        int64_t sv;
        int32_t gk;
        double ck;
        int64_t pages = build_shared_level(c, b, k, at, &sv, &gk, &ck);
        if (pages == 0) break;
        at += pages;
        depth = k + 1;
        level_cost += ck;
        saved += sv;
        groups += gk;
        saved_upto[k] = saved;
        groups_upto[k] = groups;
        cost_upto[k] = level_cost + suffix_cost(c, b, c->lv_base[k], k + 2);
        if (best_depth == 0 || cost_upto[k] < cost_upto[best_depth - 1]) best_depth = depth;
    }
    c->info.cost_single = single;
    c->info.cost_cascade = best_depth ? cost_upto[best_depth - 1] : single;
    if (depth == 0) return FI_OK;
    /* ALWAYS takes every shared level (tests reach the deepest trees) */
    bool always = c->detection == FI_PREFIX_DETECTION_ALWAYS;
    int32_t d = always ? depth : best_depth;
    if (!always && cost_upto[d - 1] > FI_CASCADE_SPLIT_MARGIN * single) return FI_OK;
    c->info.cost_cascade = cost_upto[d - 1];
    c->info.num_groups = groups_upto[d - 1];
    c->info.saved_page_reads = saved_upto[d - 1];

    /* the suffix: every request's pages past what the shared levels hold */
    const int32_t *base = c->lv_base[d - 1];
    int64_t sp = 0;
    c->suf_kv[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t rest = b->kv_indptr[i + 1] - b->kv_indptr[i] - base[i];
        memcpy(c->suf_idx + sp, b->kv_indices + b->kv_indptr[i] + base[i],
               (size_t)rest * sizeof(int32_t));
        sp += rest;
        c->suf_kv[i + 1] = (int32_t)sp;
        c->suf_last[i] = rest ? b->kv_last_page_len[i] : 0;
    }
    for (int32_t k = 0; k < d; k++) {
        fi_batch lb = {.batch_size = c->lv_groups[k], .qo_indptr = c->lv_qo[k],
                       .kv_indptr = c->lv_kv[k], .kv_indices = c->shared_idx + c->lv_at[k],
                       .kv_last_page_len = c->lv_last[k]};
        fi_status st = fi_plan_update(c->level[k], &lb);
        if (st) return level_error(st, k);
    }
    fi_batch suf = {.batch_size = n, .qo_indptr = b->qo_indptr, .kv_indptr = c->suf_kv,
                    .kv_indices = c->suf_idx, .kv_last_page_len = c->suf_last};
    fi_status st = fi_plan_update(c->suffix, &suf);
    if (st) return level_error(st, d);
    c->shared_levels = d;
    c->split = true;
    return FI_OK;
}

static fi_status cascade_update_batch(fi_cascade *c, const fi_batch *batch) {
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
    c->info.num_levels = c->split ? c->shared_levels + 1 : 1;
    c->info.split = c->split;
    c->planned = true;
    return FI_OK;
}

fi_status fi_cascade_get_info(const fi_cascade *c, fi_cascade_info *info) {
    fi_status st = fi_handle_check(c, FI_MAGIC_CASCADE, "fi_cascade_get_info", "cascade");
    if (st) return st;
    if (!info) return INVALID("fi_cascade_get_info: info is NULL");
    if (info->struct_size != sizeof *info)
        return INVALID("fi_cascade_info.struct_size=%u, expected %zu",
                       (unsigned)info->struct_size, sizeof *info);
    if (!c->planned)
        return fi_error(FI_STATUS_NOT_PLANNED, "fi_cascade_get_info: no batch planned yet");
    *info = c->info;
    return FI_OK;
}

fi_plan *fi_cascade_level_plan(const fi_cascade *c, int32_t level) {
    if (!c || !c->planned || level < 0) return NULL;
    if (!c->automatic) return level < c->num_levels ? c->level[level] : NULL;
    if (!c->split) return level == 0 ? c->direct : NULL;
    if (level < c->shared_levels) return c->level[level];
    return level == c->shared_levels ? c->suffix : NULL;
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

/* The caller's o and lse: checked as a plan checks them, and apart from a
 * workspace the caller gave (the levels' partial states live there). */
static fi_status check_outputs(const fi_cascade *c, const fi_run_args *args) {
    fi_status st = fi_check_run_outputs(args);
    if (st || !c->ws || c->ws_owned) return st;
    int64_t bytes = (int64_t)c->ws_bytes;
    fi_tensor ws = fi_tensor_contiguous(c->ws, FI_DTYPE_U8, 1, &bytes);
    if (!(st = fi_check_disjoint(&args->o, "o", &ws, "the cascade's workspace", false)))
        st = fi_check_disjoint(&args->lse, "lse", &ws, "the cascade's workspace", false);
    return st;
}

static fi_status cascade_run(fi_cascade *c, const fi_run_args *args) {
    if (!args) return INVALID("fi_cascade_run: args is NULL");
    if (!c->planned)
        return fi_error(FI_STATUS_NOT_PLANNED,
                        "fi_cascade_run: nothing planned; call fi_cascade_update first");
    fi_status st = check_outputs(c, args);
    if (st) return st;
    if (c->automatic && !c->split) return fi_plan_run(c->direct, args);
    if (c->automatic) {
        fi_plan *plans[FI_CASCADE_AUTO_MAX_LEVELS];
        for (int32_t k = 0; k < c->shared_levels; k++) plans[k] = c->level[k];
        plans[c->shared_levels] = c->suffix;
        return run_levels(c, plans, c->shared_levels + 1, args);
    }
    if (!c->automatic && c->num_levels == 1) return fi_plan_run(c->level[0], args);
    return run_levels(c, c->level, c->num_levels, args);
}

/* ------------------------------------------------------------ entry points */

fi_status fi_cascade_update(fi_cascade *c, const fi_batch *levels) {
    fi_status st = FI_HANDLE_ENTER(c, FI_MAGIC_CASCADE, "fi_cascade_update", "cascade");
    if (st) return st;
    if (!(st = fi_context_check(c->ctx, "fi_cascade_update"))) st = cascade_update(c, levels);
    fi_handle_leave(&c->busy);
    return st;
}

fi_status fi_cascade_update_batch(fi_cascade *c, const fi_batch *batch) {
    fi_status st = FI_HANDLE_ENTER(c, FI_MAGIC_CASCADE, "fi_cascade_update_batch", "cascade");
    if (st) return st;
    if (!(st = fi_context_check(c->ctx, "fi_cascade_update_batch")))
        st = cascade_update_batch(c, batch);
    fi_handle_leave(&c->busy);
    return st;
}

fi_status fi_cascade_run(fi_cascade *c, const fi_run_args *args) {
    fi_status st = FI_HANDLE_ENTER(c, FI_MAGIC_CASCADE, "fi_cascade_run", "cascade");
    if (st) return st;
    if (!(st = fi_context_check(c->ctx, "fi_cascade_run"))) st = cascade_run(c, args);
    fi_handle_leave(&c->busy);
    return st;
}
