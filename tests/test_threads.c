/*
 * test_threads.c — the library from several threads at once, as the header
 * allows it, checked against the fp64 oracle; `make tsan` runs it under
 * ThreadSanitizer, which reports any data race as a failure.
 *   separate_contexts   each thread its own context, plans, runs and ops
 *   shared_context      one CPU context, each thread its own plans (created,
 *                       run and destroyed concurrently; runs are serialised
 *                       by the context's thread pool)
 *   one_plan_refused    two threads calling one plan: every call either
 *                       runs or is refused as "in use by another call", and
 *                       every run that ran gives the right answer
 * Batches are small paged f32 decodes and prefills.
 */
#include "flashinfer.h"
#include "oracle.h"
#include "util.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HQ = 4, HKV = 2, D = 64, PS = 8, B = 3, ROUNDS = 6, THREADS = 4 };

/* One problem: a batch, its tensors, the oracle's answer. */
typedef struct problem {
    int32_t qo_indptr[B + 1], kv_indptr[B + 1], last[B], indices[64];
    fi_batch batch;
    tu_buf q, k, v, o, lse;
    double *ref_o, *ref_l;
    int64_t no, nl;
} problem;

static fi_attention_params params(void) {
    fi_attention_params p;
    fi_attention_params_init(&p);
    p.num_qo_heads = HQ, p.num_kv_heads = HKV, p.head_dim_qk = p.head_dim_vo = D;
    p.page_size = PS, p.mask_mode = FI_MASK_CAUSAL;
    p.q_dtype = p.kv_dtype = p.o_dtype = FI_DTYPE_F32;
    return p;
}

static int problem_make(problem *pb, uint64_t seed) {
    memset(pb, 0, sizeof *pb);
    tu_rng rng;
    tu_rng_seed(&rng, seed);
    int32_t pages = 0;
    for (int32_t i = 0; i < B; i++) {
        int32_t qo = tu_rng_int(&rng, 1, 6), kv = qo + tu_rng_int(&rng, 0, 60);
        int32_t n = (kv + PS - 1) / PS;
        pb->qo_indptr[i + 1] = pb->qo_indptr[i] + qo;
        pb->kv_indptr[i + 1] = pb->kv_indptr[i] + n;
        pb->last[i] = kv - PS * (n - 1);
        pages += n;
    }
    for (int32_t i = 0; i < pages; i++) pb->indices[i] = pages - 1 - i;
    pb->batch = (fi_batch){B, pb->qo_indptr, pb->kv_indptr, pb->indices, pb->last, NULL};
    int32_t tq = pb->qo_indptr[B];
    int64_t qs[3] = {tq, HQ, D}, ks[4] = {pages, PS, HKV, D}, ls[2] = {tq, HQ};
    if (tu_buf_alloc(&pb->q, FI_DTYPE_F32, 3, qs) || tu_buf_alloc(&pb->k, FI_DTYPE_F32, 4, ks) ||
        tu_buf_alloc(&pb->v, FI_DTYPE_F32, 4, ks) || tu_buf_alloc(&pb->o, FI_DTYPE_F32, 3, qs) ||
        tu_buf_alloc(&pb->lse, FI_DTYPE_F32, 2, ls))
        return -1;
    tu_fill_uniform(&rng, &pb->q.t, -2, 2, 0);
    tu_fill_uniform(&rng, &pb->k.t, -2, 2, 0);
    tu_fill_uniform(&rng, &pb->v.t, -1, 1, 0);
    pb->no = (int64_t)tq * HQ * D, pb->nl = (int64_t)tq * HQ;
    pb->ref_o = malloc(sizeof(double) * (size_t)pb->no);
    pb->ref_l = malloc(sizeof(double) * (size_t)pb->nl);
    fi_attention_params p = params();
    return oracle_attention(&p, &pb->batch, &pb->q.t, &pb->k.t, &pb->v.t, NULL, pb->ref_o, pb->ref_l);
}

static void problem_free(problem *pb) {
    tu_buf_free(&pb->q), tu_buf_free(&pb->k), tu_buf_free(&pb->v);
    tu_buf_free(&pb->o), tu_buf_free(&pb->lse);
    free(pb->ref_o), free(pb->ref_l);
}

static fi_run_args args_of(const problem *pb) {
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = pb->q.t, a.k = pb->k.t, a.v = pb->v.t, a.o = pb->o.t, a.lse = pb->lse.t;
    return a;
}

/* The last run's O and LSE against the oracle; 0 if they hold. */
static int problem_check(const problem *pb, char *why, size_t n) {
    double *o = tu_view_read(&pb->o.t), *l = tu_view_read(&pb->lse.t);
    tu_cmp c;
    int bad = tu_compare(o, pb->ref_o, pb->no, 1e-5, 1e-5, &c) != 0;
    if (bad) snprintf(why, n, "O: %lld elements off, worst got %g want %g", (long long)c.bad,
                      c.worst_got, c.worst_ref);
    if (!bad && tu_compare(l, pb->ref_l, pb->nl, 1e-5, 1e-5, &c)) {
        snprintf(why, n, "LSE: %lld elements off", (long long)c.bad);
        bad = 1;
    }
    free(o), free(l);
    return bad;
}

/* ---------------------------------------------------------------- workers */

typedef struct worker {
    fi_context *shared;   /* NULL: the worker makes its own context */
    fi_plan *plan;        /* one_plan_refused: the plan both call */
    problem *pb;          /* one_plan_refused: the problem both run */
    uint64_t seed;
    pthread_barrier_t *start;
    int runs, refused, failed;
    char why[256];
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    fi_attention_params p = params();
    fi_context *ctx = w->shared;
    if (!ctx) {
        fi_context_options o;
        fi_context_options_init(&o);
        o.num_threads = 2;
        if (fi_context_create(&o, &ctx)) {
            snprintf(w->why, sizeof w->why, "context: %s", fi_last_error());
            w->failed = 1;
            pthread_barrier_wait(w->start);
            return NULL;
        }
    }
    pthread_barrier_wait(w->start);
    for (int r = 0; r < ROUNDS && !w->failed; r++) {
        problem pb;
        fi_plan *plan = NULL;
        if (problem_make(&pb, w->seed * 131 + (uint64_t)r)) {
            snprintf(w->why, sizeof w->why, "problem: out of memory");
            w->failed = 1;
        } else if (fi_plan_create(ctx, &p, NULL, &plan) || fi_plan_update(plan, &pb.batch)) {
            snprintf(w->why, sizeof w->why, "plan: %s", fi_last_error());
            w->failed = 1;
        } else {
            fi_run_args a = args_of(&pb);
            for (int layer = 0; layer < 3 && !w->failed; layer++) {
                fi_status st = fi_plan_run(plan, &a);
                if (st) snprintf(w->why, sizeof w->why, "run: %s", fi_last_error()), w->failed = 1;
                else w->failed = problem_check(&pb, w->why, sizeof w->why);
                w->runs++;
            }
            /* an op on the same context: O merged with itself is itself */
            int64_t s2[2] = {pb.qo_indptr[B], HQ};
            tu_buf mo, ml;
            if (!w->failed && !tu_buf_alloc(&mo, FI_DTYPE_F32, 3, pb.o.t.shape) &&
                !tu_buf_alloc(&ml, FI_DTYPE_F32, 2, s2)) {
                fi_status st = fi_merge_state(ctx, &pb.o.t, &pb.lse.t, &pb.o.t, &pb.lse.t, &mo.t,
                                              &ml.t, NULL);
                if (st) snprintf(w->why, sizeof w->why, "merge: %s", fi_last_error()), w->failed = 1;
                double *got = tu_view_read(&mo.t);
                tu_cmp c;
                if (!w->failed && tu_compare(got, pb.ref_o, pb.no, 1e-5, 1e-5, &c))
                    snprintf(w->why, sizeof w->why, "merge: O differs"), w->failed = 1;
                free(got);
                tu_buf_free(&mo), tu_buf_free(&ml);
            }
        }
        fi_plan_destroy(plan);
        problem_free(&pb);
    }
    if (!w->shared) fi_context_destroy(ctx);
    return NULL;
}

/* Both threads run one plan on their own outputs; refused calls are the
 * detection of misuse, the others must be right. */
static void *same_plan_main(void *arg) {
    worker *w = arg;
    problem *pb = w->pb;
    tu_buf o, l;
    if (tu_buf_alloc(&o, FI_DTYPE_F32, 3, pb->o.t.shape) || tu_buf_alloc(&l, FI_DTYPE_F32, 2, pb->lse.t.shape)) {
        w->failed = 1;
        pthread_barrier_wait(w->start);
        return NULL;
    }
    fi_run_args a = args_of(pb);
    a.o = o.t, a.lse = l.t;
    pthread_barrier_wait(w->start);
    for (int i = 0; i < 200 && !w->failed; i++) {
        fi_status st = fi_plan_run(w->plan, &a);
        if (st == FI_OK) {
            w->runs++;
            double *got = tu_view_read(&o.t);
            tu_cmp c;
            if (tu_compare(got, pb->ref_o, pb->no, 1e-5, 1e-5, &c))
                snprintf(w->why, sizeof w->why, "a run that ran gave a wrong O"), w->failed = 1;
            free(got);
        } else if (st == FI_STATUS_INVALID_ARGUMENT && strstr(fi_last_error(), "in use by another")) {
            w->refused++;
        } else {
            snprintf(w->why, sizeof w->why, "run: %s: %s", fi_status_string(st), fi_last_error());
            w->failed = 1;
        }
    }
    tu_buf_free(&o), tu_buf_free(&l);
    return NULL;
}

static int run_threads(worker *w, int n, void *(*fn)(void *)) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)n);
    pthread_t th[THREADS];
    for (int i = 0; i < n; i++) {
        w[i].start = &start;
        pthread_create(&th[i], NULL, fn, &w[i]);
    }
    int bad = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (w[i].failed) tu_note("thread %d: %s", i, w[i].why), bad = 1;
    }
    pthread_barrier_destroy(&start);
    return bad;
}

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "Concurrency: separate contexts, one shared CPU context, one plan "
                           "called from two threads (refused, not raced).");
    if (rc) return rc;
    if (!tu_backend_selected("cpu")) return tu_summary("test_threads");
    if (tu_begin_case("threads/separate_contexts")) {
        worker w[THREADS];
        memset(w, 0, sizeof w);
        for (int i = 0; i < THREADS; i++) w[i].seed = 100 + (uint64_t)i;
        tu_record("threads", "threads/separate_contexts",
                  run_threads(w, THREADS, worker_main) ? TU_FAIL : TU_PASS);
    }
    if (tu_begin_case("threads/shared_context")) {
        fi_context *ctx = NULL;
        fi_context_options o;
        fi_context_options_init(&o);
        o.num_threads = 2;
        int bad = fi_context_create(&o, &ctx) != FI_OK;
        worker w[THREADS];
        memset(w, 0, sizeof w);
        for (int i = 0; i < THREADS && !bad; i++) w[i].seed = 200 + (uint64_t)i, w[i].shared = ctx;
        if (!bad) bad = run_threads(w, THREADS, worker_main);
        fi_context_destroy(ctx);
        tu_record("threads", "threads/shared_context", bad ? TU_FAIL : TU_PASS);
    }
    if (tu_begin_case("threads/one_plan_refused")) {
        fi_context *ctx = NULL;
        fi_context_options o;
        fi_context_options_init(&o);
        o.num_threads = 1;
        fi_attention_params p = params();
        problem pb;
        memset(&pb, 0, sizeof pb);
        fi_plan *plan = NULL;
        int bad = fi_context_create(&o, &ctx) != FI_OK || problem_make(&pb, 7) ||
                  fi_plan_create(ctx, &p, NULL, &plan) || fi_plan_update(plan, &pb.batch);
        worker w[2];
        memset(w, 0, sizeof w);
        for (int i = 0; i < 2 && !bad; i++) w[i].plan = plan, w[i].pb = &pb;
        if (!bad) bad = run_threads(w, 2, same_plan_main);
        if (tu_opt.verbose)
            tu_note("runs %d + %d, refused %d + %d", w[0].runs, w[1].runs, w[0].refused, w[1].refused);
        if (!bad && w[0].runs + w[1].runs == 0) tu_note("no call ran"), bad = 1;
        fi_plan_destroy(plan);
        problem_free(&pb);
        fi_context_destroy(ctx);
        tu_record("threads", "threads/one_plan_refused", bad ? TU_FAIL : TU_PASS);
    }
    if (tu_opt.list) return 0;
    return tu_summary("test_threads");
}
