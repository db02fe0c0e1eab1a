/*
 * quickstart.c — the README's C example as a whole program: a paged batch of
 * two requests (a 3-token prefill chunk over 40 keys, and a decode over 17),
 * planned once and run for two layers on the CPU.
 *   cc examples/quickstart.c $(pkg-config --cflags --libs flashinfer) -o quickstart
 * (what pkg-config gives is all it needs: no libm of its own).
 */
#include <flashinfer.h>

#include <stdio.h>
#include <stdlib.h>

enum { HQ = 8, HKV = 2, D = 64, PAGE = 16, PAGES = 8, TOKENS = 4, LAYERS = 2 };

/* A fixed pseudo-random value in [-1, 1) for element i of a tensor. */
static float value(size_t i, uint32_t tensor) {
    uint32_t h = (uint32_t)i * 2654435761u ^ tensor * 0x9e3779b9u;
    h ^= h >> 15, h *= 0x2c1b3c6du, h ^= h >> 12;
    return (float)(h >> 8) * 0x1.0p-23f - 1.0f;
}

static int fail(fi_status st) {
    fprintf(stderr, "flashinfer: %s: %s\n", fi_status_string(st), fi_last_error());
    return 1;
}

int main(void) {
    /* Request 0: 3 queries, 40 keys on pages 5, 2, 7; request 1: 1 query, 17 keys on 0, 3. */
    int32_t qo_indptr[] = {0, 3, 4}, kv_indptr[] = {0, 3, 5};
    int32_t kv_indices[] = {5, 2, 7, 0, 3}, kv_last_page_len[] = {8, 1};
    size_t kv_elems = (size_t)PAGES * PAGE * HKV * D, q_elems = (size_t)TOKENS * HQ * D;
    float *k = malloc(kv_elems * sizeof *k), *v = malloc(kv_elems * sizeof *v);
    float *q = malloc(q_elems * sizeof *q), *o = malloc(q_elems * sizeof *o);
    if (!k || !v || !q || !o) return 1;
    for (size_t i = 0; i < kv_elems; i++) k[i] = value(i, 1), v[i] = value(i, 2);
    for (size_t i = 0; i < q_elems; i++) q[i] = value(i, 3);

    fi_context *ctx;
    fi_status st = fi_context_create(NULL, &ctx); /* CPU, all cores */
    if (st) return fail(st);
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ; p.num_kv_heads = HKV; p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PAGE; p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_F32;
    p.mask_mode = FI_MASK_CAUSAL;
    fi_plan *plan;
    if ((st = fi_plan_create(ctx, &p, NULL, &plan))) return fail(st); /* default bounds */
    fi_batch b = {2, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, NULL};
    if ((st = fi_plan_update(plan, &b))) return fail(st); /* once per step */

    int64_t qs[3] = {TOKENS, HQ, D}, ks[4] = {PAGES, PAGE, HKV, D};
    fi_run_args a = {.q = fi_tensor_contiguous(q, FI_DTYPE_F32, 3, qs),
                     .k = fi_tensor_contiguous(k, FI_DTYPE_F32, 4, ks),
                     .v = fi_tensor_contiguous(v, FI_DTYPE_F32, 4, ks),
                     .o = fi_tensor_contiguous(o, FI_DTYPE_F32, 3, qs)};
    for (int l = 0; l < LAYERS; l++) /* per layer: the same plan */
        if ((st = fi_plan_run(plan, &a))) return fail(st);
    printf("flashinfer %s: o[0][0][0..3] = %.4f %.4f %.4f %.4f\n", fi_version_string(), o[0],
           o[1], o[2], o[3]);
    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    free(k); free(v); free(q); free(o);
    return 0;
}
