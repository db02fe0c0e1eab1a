/*
 * variant_sigmoid.c — a user-defined attention variant: FlashSigmoid
 * (o = sum_j sigmoid(s_j + bias) v_j, no softmax), declared as a spec of C
 * snippets, compiled by the CPU backend with the system C compiler at plan
 * creation (cached under ~/.cache/flashinfer-c/cpu), run on a paged batch
 * and checked against plain loops.
 *   cc examples/variant_sigmoid.c $(pkg-config --cflags --libs flashinfer) -o variant_sigmoid
 */
#include <flashinfer.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { HQ = 4, HKV = 2, D = 64, PAGE = 16, PAGES = 4, TOKENS = 2 };

static int fail(fi_status st) {
    fprintf(stderr, "flashinfer: %s: %s\n", fi_status_string(st), fi_last_error());
    return st == FI_STATUS_UNSUPPORTED ? 0 : 1; /* no C compiler: nothing to show */
}

int main(void) {
    /* Two decode requests: 20 keys on pages 2, 0; 30 keys on pages 3, 1. */
    int32_t qo_indptr[] = {0, 1, 2}, kv_indptr[] = {0, 2, 4};
    int32_t kv_indices[] = {2, 0, 3, 1}, kv_last_page_len[] = {4, 14}, kv_len[] = {20, 30};
    static float k[PAGES][PAGE][HKV][D], v[PAGES][PAGE][HKV][D], q[TOKENS][HQ][D], o[TOKENS][HQ][D];
    for (int i = 0; i < PAGES * PAGE * HKV * D; i++)
        (&k[0][0][0][0])[i] = sinf(0.37f * (float)i), (&v[0][0][0][0])[i] = cosf(0.11f * (float)i);
    for (int i = 0; i < TOKENS * HQ * D; i++) (&q[0][0][0])[i] = sinf(0.5f * (float)i);

    /* The variant: one f32 parameter, one hook. */
    static const fi_variant_param params[] = {{"bias", FI_VARIANT_PARAM_F32, FI_DTYPE_F32}};
    fi_variant_spec spec;
    fi_variant_spec_init(&spec);
    spec.name = "flash_sigmoid";
    spec.params = params;
    spec.num_params = 1;
    spec.use_softmax = 0;
    spec.logits_transform = "return 1.0f / (1.0f + expf(-(s + p.bias)));";
    fi_variant *variant;
    fi_status st = fi_variant_create(&spec, &variant);
    if (st) return fail(st);

    fi_context *ctx;
    if ((st = fi_context_create(NULL, &ctx))) return fail(st);
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ; p.num_kv_heads = HKV; p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PAGE; p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_F32;
    p.variant = variant;
    fi_plan *plan;
    if ((st = fi_plan_create(ctx, &p, NULL, &plan))) return fail(st); /* compiles here */
    fi_batch batch = {2, qo_indptr, kv_indptr, kv_indices, kv_last_page_len, NULL};
    if ((st = fi_plan_update(plan, &batch))) return fail(st);

    const float bias = -1.5f;
    fi_variant_value values[] = {fi_variant_f32(bias)};
    fi_variant_args vargs = {1, values};
    int64_t qs[3] = {TOKENS, HQ, D}, kvs[4] = {PAGES, PAGE, HKV, D};
    fi_run_args args = {0};
    args.q = fi_tensor_contiguous(q, FI_DTYPE_F32, 3, qs);
    args.k = fi_tensor_contiguous(k, FI_DTYPE_F32, 4, kvs);
    args.v = fi_tensor_contiguous(v, FI_DTYPE_F32, 4, kvs);
    args.o = fi_tensor_contiguous(o, FI_DTYPE_F32, 3, qs);
    args.variant_args = &vargs;
    if ((st = fi_plan_run(plan, &args))) return fail(st);

    /* The same sums by plain loops. */
    double worst = 0.0;
    for (int t = 0; t < TOKENS; t++)
        for (int h = 0; h < HQ; h++) {
            int hk = h / (HQ / HKV);
            for (int d = 0; d < D; d++) {
                double acc = 0.0;
                for (int j = 0; j < kv_len[t]; j++) {
                    int page = kv_indices[kv_indptr[t] + j / PAGE], slot = j % PAGE;
                    double s = 0.0;
                    for (int e = 0; e < D; e++) s += (double)q[t][h][e] * k[page][slot][hk][e];
                    s /= sqrt((double)D);
                    acc += v[page][slot][hk][d] / (1.0 + exp(-(s + bias)));
                }
                double err = fabs(acc - o[t][h][d]) / (1.0 + fabs(acc));
                if (err > worst) worst = err;
            }
        }
    printf("flash_sigmoid: o[0][0][0..3] = %.5f %.5f %.5f %.5f, worst rel. error %.2e\n",
           o[0][0][0], o[0][0][1], o[0][0][2], o[0][0][3], worst);
    fi_plan_destroy(plan);
    fi_context_destroy(ctx);
    fi_variant_destroy(variant);
    return worst < 1e-4 ? 0 : 1;
}
