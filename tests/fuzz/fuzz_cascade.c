/*
 * fuzz_cascade.c — cascades from arbitrary bytes: automatic ones
 * (fi_cascade_create_auto + fi_cascade_update_batch over batches whose
 * requests share leading pages, every detection mode) checked against the
 * oracle on the plain batch, and explicit ones (1 or 2 levels, a shared
 * prefix of full pages) checked against the oracle on the flattened batch;
 * bounds up to INT32_MAX, workspaces the caller gives (some too small or
 * misaligned).
 */
#include "fuzz.h"

/* Level 0 of an explicit cascade: one request over every query token with
 * the s spare pages of pb as its keys (full pages). */
typedef struct levels {
    int32_t qo[2], kv[2], last[1];
    fi_batch lv[2];
    /* the flattened batch: each request's pages, the prefix then its own */
    int32_t fkv[FZ_MAX_B + 1], flast[FZ_MAX_B];
    int32_t *findices;
    fi_batch flat;
} levels;

static void make_levels(const fi_attention_params *p, fz_problem *pb, int32_t s, levels *l) {
    int32_t B = pb->B, ps = p->page_size, *prefix = pb->indices + pb->kv_indptr[B];
    l->qo[0] = 0, l->qo[1] = pb->qo_indptr[B];
    l->kv[0] = 0, l->kv[1] = s;
    l->last[0] = s ? ps : 0;
    l->lv[0] = (fi_batch){1, l->qo, l->kv, prefix, l->last, NULL};
    l->lv[1] = pb->batch;
    l->findices = malloc(sizeof(int32_t) * (size_t)(pb->kv_indptr[B] + B * s + 1));
    l->fkv[0] = 0;
    for (int32_t i = 0; i < B; i++) {
        int32_t own = pb->kv_indptr[i + 1] - pb->kv_indptr[i], at = l->fkv[i];
        for (int32_t k = 0; k < s; k++) l->findices[at + k] = prefix[k];
        for (int32_t k = 0; k < own; k++) l->findices[at + s + k] = pb->indices[pb->kv_indptr[i] + k];
        l->fkv[i + 1] = at + s + own;
        l->flast[i] = own ? pb->last[i] : (s ? ps : 0);
    }
    l->flat = (fi_batch){B, pb->qo_indptr, l->fkv, l->findices, l->flast, NULL};
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size};
    fi_attention_params p;
    float slopes[16];
    fi_context *ctx = fz_attention(&f, &p, slopes);
    if (!fz_one_in(&f, 16)) p.kv_format = FI_KV_FORMAT_PAGED;
    int automatic = !fz_one_in(&f, 3);
    fi_plan_config c[FI_CASCADE_MAX_LEVELS];
    fi_plan_config_init(&c[0]);
    c[0].max_batch_size = fz_bound(&f, FZ_MAX_B);
    c[0].max_total_qo = fz_bound(&f, 64);
    c[0].max_total_kv = fz_bound(&f, 256);
    c[0].num_workers = fz_one_in(&f, 3) ? (int32_t)fz_range(&f, 0, 9) : 0;
    c[0].fixed_split_size = fz_one_in(&f, 4) ? (int32_t)fz_range(&f, 0, 40) : 0;
    for (int i = 1; i < FI_CASCADE_MAX_LEVELS; i++) c[i] = c[0];
    c[1].max_batch_size = fz_bound(&f, FZ_MAX_B);
    c[1].max_total_kv = fz_bound(&f, 256);
    static const int32_t level_counts[4] = {0, 1, 2, FI_CASCADE_MAX_LEVELS + 1};
    int32_t levels_n = level_counts[fz_pick(&f, 4)]; /* 0 and 9 are refused */
    fi_cascade_options o;
    fi_cascade_options_init(&o);
    o.prefix_detection = (fi_prefix_detection)fz_range(&f, 0, fz_one_in(&f, 16) ? 5 : 2);
    tu_buf ws;
    memset(&ws, 0, sizeof ws);
    if (fz_one_in(&f, 4)) {
        size_t need = fi_cascade_workspace_size(&p, automatic ? FI_CASCADE_AUTO_MAX_LEVELS : 2,
                                                c[0].max_total_qo);
        if (need > 0 && need < (64u << 20)) {
            size_t give = need + (size_t)fz_range(&f, -64, 64) * 64;
            if (give > 0 && give < (64u << 20) && !tu_buf_alloc_tail(&ws, give + 64, 64)) {
                o.workspace = (char *)ws.base + (fz_one_in(&f, 8) ? 4 : 0);
                o.workspace_bytes = give;
            }
        }
    }
    fi_cascade *cas = NULL;
    fi_status st = automatic ? fi_cascade_create_auto(ctx, &p, &c[0], &o, &cas)
                             : fi_cascade_create(ctx, &p, levels_n, c, &o, &cas);
    fz_check_status(st, "fi_cascade_create");
    tu_rng rng;
    tu_rng_seed(&rng, fz_u32(&f));
    for (int round = 0; !st && round < 2 && f.n; round++) {
        if (p.page_size > 64) break;
        int32_t B = (int32_t)fz_range(&f, 0, FZ_MAX_B), qo[FZ_MAX_B], kv[FZ_MAX_B];
        for (int32_t i = 0; i < B; i++) {
            qo[i] = (int32_t)fz_range(&f, 0, 10);
            kv[i] = (int32_t)fz_range(&f, 0, 120);
        }
        fz_problem pb;
        if (fz_problem_make(&p, B, qo, kv, automatic, &rng, &pb)) {
            fz_problem_free(&pb);
            break;
        }
        levels l;
        memset(&l, 0, sizeof l);
        fi_status us;
        if (automatic) {
            us = fi_cascade_update_batch(cas, &pb.batch);
        } else {
            make_levels(&p, &pb, (int32_t)fz_range(&f, 0, 4), &l);
            us = fi_cascade_update(cas, levels_n == 1 ? &pb.batch : l.lv);
        }
        fz_check_status(us, "fi_cascade_update");
        if (us == FI_OK) {
            fi_run_args a = fz_problem_args(&pb);
            us = fi_cascade_run(cas, &a);
            fz_check_status(us, "fi_cascade_run");
            /* explicit levels: every level but the last sees all its keys,
             * so the flattened batch is the reference without a mask */
            int flat_ok = levels_n == 1 ||
                          (p.mask_mode == FI_MASK_NONE && p.window_left < 0);
            if (us == FI_OK && fz_checkable(&p) && (automatic || flat_ok)) {
                if (!automatic && levels_n == 2) pb.batch = l.flat;
                fz_problem_check(&p, &pb, automatic ? "auto cascade" : "cascade");
            }
        }
        free(l.findices);
        fz_problem_free(&pb);
    }
    fi_cascade_destroy(cas);
    tu_buf_free(&ws);
    return 0;
}
