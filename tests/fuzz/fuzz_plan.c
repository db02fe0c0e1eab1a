/*
 * fuzz_plan.c — fi_plan_create / fi_plan_update / fi_plan_run from
 * arbitrary bytes: params of every kind (some invalid), bounds up to
 * INT32_MAX, split options and workers, then up to three batches, some
 * broken (indptrs, last page lengths, page ids past the cache, bounds) and
 * tensors some too small; a run that succeeds is checked against the fp64
 * oracle. Every call must return a status with a message, nothing may read
 * or write outside the test's guarded buffers.
 */
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size};
    fi_attention_params p;
    float slopes[16];
    fi_context *ctx = fz_attention(&f, &p, slopes);
    fi_plan_config c;
    fi_plan_config_init(&c);
    c.max_batch_size = fz_bound(&f, FZ_MAX_B);
    c.max_total_qo = fz_bound(&f, 64);
    c.max_total_kv = fz_bound(&f, 256);
    c.num_workers = fz_one_in(&f, 3) ? (int32_t)fz_range(&f, -1, 70) : 0;
    c.disable_split_kv = fz_one_in(&f, 4);
    c.fixed_split_size = fz_one_in(&f, 4) ? (int32_t)fz_range(&f, -1, 40) : 0;
    c.device_page_table = fz_one_in(&f, 4);
    fi_plan *plan = NULL;
    fi_status st = fi_plan_create(ctx, &p, &c, &plan);
    fz_check_status(st, "fi_plan_create");
    if (st) return 0;
    tu_rng rng;
    tu_rng_seed(&rng, fz_u32(&f));
    for (int round = 0; round < 3 && f.n; round++) {
        int32_t B = (int32_t)fz_range(&f, 0, FZ_MAX_B), qo[FZ_MAX_B], kv[FZ_MAX_B];
        for (int32_t i = 0; i < B; i++) {
            qo[i] = (int32_t)fz_range(&f, 0, 12);
            kv[i] = (int32_t)fz_range(&f, 0, fz_one_in(&f, 4) ? 200 : 40);
        }
        if (p.page_size > 64 && p.kv_format == FI_KV_FORMAT_PAGED) break; /* cache too big */
        fz_problem pb;
        if (fz_problem_make(&p, B, qo, kv, 0, &rng, &pb)) {
            fz_problem_free(&pb);
            break;
        }
        int broken = 0;
        switch (fz_pick(&f, 12)) { /* a fault the update or the run must catch */
        case 0: if (B) pb.qo_indptr[fz_range(&f, 0, B)] += (int32_t)fz_range(&f, -3, 3), broken = 1; break;
        case 1: if (B) pb.kv_indptr[fz_range(&f, 0, B)] += (int32_t)fz_range(&f, -3, 3), broken = 1; break;
        case 2: if (B) pb.last[fz_range(&f, 0, B - 1)] = (int32_t)fz_range(&f, -2, p.page_size + 2), broken = 1; break;
        case 3:
            if (pb.indices && pb.kv_indptr[B] > 0) {
                pb.indices[fz_range(&f, 0, pb.kv_indptr[B] - 1)] =
                    fz_one_in(&f, 2) ? -(int32_t)fz_range(&f, 1, 9) : pb.num_pages + (int32_t)fz_range(&f, 0, 1000);
                broken = 1;
            }
            break;
        case 4: pb.batch.batch_size = (int32_t)fz_range(&f, -2, FZ_MAX_B), broken = 1; break;
        default: break;
        }
        st = fi_plan_update(plan, &pb.batch);
        fz_check_status(st, "fi_plan_update");
        if (st == FI_OK) {
            fi_run_args a = fz_problem_args(&pb);
            int small = 0;
            switch (fz_pick(&f, 10)) { /* tensors the run must refuse */
            case 0: a.q.shape[0] -= 1, small = 1; break;
            case 1: a.k.shape[0] -= 1, small = 1; break;
            case 2: a.o.stride[0] = 0, small = a.o.shape[0] > 1; break;
            case 3: a.o.data = a.k.data, small = 1; break;
            case 4: a.lse.data = NULL; break;
            default: break;
            }
            st = fi_plan_run(plan, &a);
            fz_check_status(st, "fi_plan_run");
            if (st == FI_OK && !broken && !small && a.lse.data && fz_checkable(&p))
                fz_problem_check(&p, &pb, "fi_plan_run");
            /* a second run of the same update: the same answer */
            if (st == FI_OK && !broken && !small && a.lse.data && fz_checkable(&p)) {
                tu_buf_poison(&pb.o);
                st = fi_plan_run(plan, &a);
                fz_check_status(st, "fi_plan_run (again)");
                if (st) FZ_FAIL("a second run of one update failed: %s", fi_last_error());
                fz_problem_check(&p, &pb, "fi_plan_run (again)");
            }
        }
        fz_problem_free(&pb);
    }
    fi_plan_destroy(plan);
    return 0;
}
