/*
 * test_bad_input.c — every class of bad input gets the right status and a
 * message that names the offending value, and nothing is touched: all
 * arrays and tensors sit flush against PROT_NONE guard pages (a stray read
 * faults), outputs are poisoned and must stay so after a failed run, and
 * `make sanitize` runs this under ASan + UBSan. After the failures the same
 * plan must still plan and run a valid batch correctly.
 *
 * The fixture: paged NHD f32, H_qo 4, H_kv 2, D 64, page_size 4, two
 * requests (qo 3, kv 6) and (qo 1, kv 4) on pages {4, 1} and {2} of a
 * 5-page cache.
 */
#include "flashinfer.h"
#include "oracle.h"
#include "util.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { HQ = 4, HKV = 2, D = 64, PS = 4, PAGES = 5, B = 2, TOTAL_Q = 4 };

/* ----------------------------------------------------------------- fixture */

typedef struct fixture {
    fi_context *ctx;
    fi_attention_params params;
    fi_plan_config config;
    /* batch arrays, each flush against a guard page */
    tu_buf qo_indptr, kv_indptr, kv_indices, last, mask_indptr;
    fi_batch batch;
    tu_buf q, k, v, o, lse, mask;
    fi_run_args args;
} fixture;

static fixture fx;

static int32_t *arr(tu_buf *b) { return (int32_t *)b->base; }

static void set_ints(tu_buf *b, int32_t n, const int32_t *vals) {
    tu_buf_free(b);
    tu_buf_alloc_tail(b, sizeof(int32_t) * (size_t)n, 4);
    memcpy(b->base, vals, sizeof(int32_t) * (size_t)n);
}

/* The valid batch; tests break a copy of it. */
static void fixture_batch(void) {
    set_ints(&fx.qo_indptr, B + 1, (int32_t[]){0, 3, 4});
    set_ints(&fx.kv_indptr, B + 1, (int32_t[]){0, 2, 3});
    set_ints(&fx.kv_indices, 3, (int32_t[]){4, 1, 2});
    set_ints(&fx.last, B, (int32_t[]){2, 4});
    set_ints(&fx.mask_indptr, B + 1, (int32_t[]){0, 3, 4}); /* ceil(3*6/8), ceil(1*4/8) */
    fx.batch.batch_size = B;
    fx.batch.qo_indptr = arr(&fx.qo_indptr);
    fx.batch.kv_indptr = arr(&fx.kv_indptr);
    fx.batch.kv_indices = arr(&fx.kv_indices);
    fx.batch.kv_last_page_len = arr(&fx.last);
    fx.batch.mask_indptr = NULL;
}

static void tensor(tu_buf *b, fi_dtype dt, int32_t ndim, const int64_t *shape) {
    tu_buf_free(b);
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; d++) n *= shape[d];
    /* flush against the guard page: one element past the end faults */
    tu_buf_alloc_tail(b, (size_t)n * tu_dtype_size(dt), tu_dtype_size(dt));
    b->t = fi_tensor_contiguous(b->base, dt, ndim, shape);
}

static void fixture_tensors(void) {
    tu_rng rng;
    tu_rng_seed(&rng, 12345);
    tensor(&fx.q, FI_DTYPE_F32, 3, (int64_t[]){TOTAL_Q, HQ, D});
    tensor(&fx.k, FI_DTYPE_F32, 4, (int64_t[]){PAGES, PS, HKV, D});
    tensor(&fx.v, FI_DTYPE_F32, 4, (int64_t[]){PAGES, PS, HKV, D});
    tensor(&fx.o, FI_DTYPE_F32, 3, (int64_t[]){TOTAL_Q, HQ, D});
    tensor(&fx.lse, FI_DTYPE_F32, 2, (int64_t[]){TOTAL_Q, HQ});
    tensor(&fx.mask, FI_DTYPE_U8, 1, (int64_t[]){4});
    tu_fill_uniform(&rng, &fx.q.t, -1, 1, 0);
    tu_fill_uniform(&rng, &fx.k.t, -1, 1, 0);
    tu_fill_uniform(&rng, &fx.v.t, -1, 1, 0);
    memset(fx.mask.base, 0x5b, 4);
    tu_buf_poison(&fx.o);
    tu_buf_poison(&fx.lse);
    memset(&fx.args, 0, sizeof fx.args);
    fx.args.q = fx.q.t;
    fx.args.k = fx.k.t;
    fx.args.v = fx.v.t;
    fx.args.o = fx.o.t;
    fx.args.lse = fx.lse.t;
}

static void fixture_params(void) {
    fi_attention_params_init(&fx.params);
    fx.params.num_qo_heads = HQ;
    fx.params.num_kv_heads = HKV;
    fx.params.head_dim_qk = fx.params.head_dim_vo = D;
    fx.params.page_size = PS;
    fx.params.q_dtype = fx.params.kv_dtype = fx.params.o_dtype = FI_DTYPE_F32;
    fi_plan_config_init(&fx.config);
    fx.config.max_batch_size = B;
    fx.config.max_total_qo = TOTAL_Q;
    fx.config.max_total_kv = 3;
}

static void fixture_reset(void) {
    fixture_params();
    fixture_batch();
    fixture_tensors();
}

static void fixture_free(void) {
    tu_buf *bufs[] = {&fx.qo_indptr, &fx.kv_indptr, &fx.kv_indices, &fx.last, &fx.mask_indptr,
                      &fx.q, &fx.k, &fx.v, &fx.o, &fx.lse, &fx.mask};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tu_buf_free(bufs[i]);
    fi_context_destroy(fx.ctx);
}

/* A plan from the fixture's (possibly modified) params and config. */
static fi_plan *make_plan(void) {
    fi_plan *plan = NULL;
    fi_status st = fi_plan_create(fx.ctx, &fx.params, &fx.config, &plan);
    if (st != FI_OK) {
        tu_note("fixture plan: %s: %s", fi_status_string(st), fi_last_error());
        return NULL;
    }
    return plan;
}

/* ------------------------------------------------------------- assertions */

/* Ends the list of strings a message must contain. */
#define END ((const char *)NULL)

static const char *category;

/* Status `got` must be `want`, and fi_last_error() must contain every string
 * of the NULL-terminated list. Returns 1 if all hold. */
static int expect_v(fi_status got, fi_status want, va_list ap) {
    int ok = 1;
    const char *msg = fi_last_error();
    if (got != want) {
        tu_note("status %s (%d), expected %s (%d)", fi_status_string(got), (int)got,
                fi_status_string(want), (int)want);
        ok = 0;
    }
    for (const char *s = va_arg(ap, const char *); s; s = va_arg(ap, const char *))
        if (!msg || !strstr(msg, s)) {
            tu_note("message does not name '%s'", s);
            ok = 0;
        }
    if (!ok || tu_opt.verbose) tu_note("fi_last_error: \"%s\"", msg ? msg : "(null)");
    return ok;
}

static int expect(fi_status got, fi_status want, ...) {
    va_list ap;
    va_start(ap, want);
    int ok = expect_v(got, want, ap);
    va_end(ap);
    return ok;
}

/* O and LSE must still hold the poison after a failed run. */
static int outputs_untouched(void) {
    const tu_buf *bufs[] = {&fx.o, &fx.lse};
    for (int i = 0; i < 2; i++) {
        const uint8_t *p = bufs[i]->base;
        for (size_t j = 0; j < bufs[i]->bytes; j++)
            if (p[j] != 0xFF) {
                tu_note("a failed call wrote %s", i ? "lse" : "o");
                return 0;
            }
    }
    return 1;
}

static void record(const char *name, int ok) {
    char full[160];
    snprintf(full, sizeof full, "bad_input/%s/%s", category, name);
    tu_record(category, full, ok ? TU_PASS : TU_FAIL);
}

static int selected(const char *name) {
    char full[160];
    snprintf(full, sizeof full, "bad_input/%s/%s", category, name);
    if (!tu_begin_case(full)) return 0;
    tu_crash_context(full, 0);
    fixture_reset();
    return 1;
}

/* Plan the fixture's batch with the fixture's params; expect the update to
 * fail with `want` naming the strings. */
#define UPDATE_FAILS(name, want, ...)                                          \
    do {                                                                       \
        fi_plan *plan_ = make_plan();                                          \
        int ok_ = plan_ != NULL;                                               \
        if (plan_) ok_ = expect(fi_plan_update(plan_, &fx.batch), want, __VA_ARGS__, END); \
        fi_plan_destroy(plan_);                                                \
        record(name, ok_);                                                     \
    } while (0)

/* Plan the valid batch, then expect the run with fx.args to fail. */
#define RUN_FAILS(name, want, ...)                                             \
    do {                                                                       \
        fi_plan *plan_ = make_plan();                                          \
        int ok_ = plan_ != NULL;                                               \
        fi_status st_ = plan_ ? fi_plan_update(plan_, &fx.batch) : FI_OK;     \
        if (ok_ && st_ != FI_OK) {                                             \
            tu_note("update of the valid batch: %s: %s", fi_status_string(st_), fi_last_error()); \
            ok_ = 0;                                                           \
        }                                                                      \
        if (ok_) ok_ = expect(fi_plan_run(plan_, &fx.args), want, __VA_ARGS__, END) & outputs_untouched(); \
        fi_plan_destroy(plan_);                                                \
        record(name, ok_);                                                     \
    } while (0)

#define CREATE_FAILS(name, want, ...)                                          \
    do {                                                                       \
        fi_plan *plan_ = (fi_plan *)(uintptr_t)1;                             \
        fi_status st_ = fi_plan_create(fx.ctx, &fx.params, &fx.config, &plan_); \
        int ok_ = expect(st_, want, __VA_ARGS__, END);                        \
        if (st_ == FI_OK) fi_plan_destroy(plan_);                              \
        record(name, ok_);                                                     \
    } while (0)

/* Page-table entries that are negative or point past the K tensor must be
 * caught before any read: the cache ends at a guard page, so a read of page
 * `bad` would fault. plan_update cannot know the cache size and need not
 * read the page table, so either call may report it, naming the page. */
static void page_out_of_range(const char *name, int32_t bad) {
    arr(&fx.kv_indices)[1] = bad;
    fi_plan *plan = make_plan();
    int ok = plan != NULL;
    char val[16], val1[16];
    snprintf(val, sizeof val, "%d", (int)bad);
    snprintf(val1, sizeof val1, "%d", (int)bad + 1); /* "largest page id + 1" */
    if (ok) {
        fi_status st = fi_plan_update(plan, &fx.batch);
        if (st == FI_OK) st = fi_plan_run(plan, &fx.args);
        const char *msg = fi_last_error();
        ok = expect(st, FI_STATUS_INVALID_ARGUMENT, END) && outputs_untouched();
        if (!strstr(msg, val) && !strstr(msg, val1)) {
            tu_note("message names neither page %s nor %s: \"%s\"", val, val1, msg);
            ok = 0;
        }
    }
    fi_plan_destroy(plan);
    record(name, ok);
}

/* ------------------------------------------------------------------ tests */

static void test_indptr(void) {
    category = "indptr";
    if (selected("qo_indptr_start")) {
        set_ints(&fx.qo_indptr, 3, (int32_t[]){17, 17, 18});
        fx.batch.qo_indptr = arr(&fx.qo_indptr);
        UPDATE_FAILS("qo_indptr_start", FI_STATUS_INVALID_ARGUMENT, "qo_indptr", "17");
    }
    if (selected("kv_indptr_start")) {
        set_ints(&fx.kv_indptr, 3, (int32_t[]){11, 13, 14});
        fx.batch.kv_indptr = arr(&fx.kv_indptr);
        UPDATE_FAILS("kv_indptr_start", FI_STATUS_INVALID_ARGUMENT, "kv_indptr", "11");
    }
    if (selected("qo_indptr_decreasing")) {
        set_ints(&fx.qo_indptr, 3, (int32_t[]){0, 3, 2});
        fx.batch.qo_indptr = arr(&fx.qo_indptr);
        UPDATE_FAILS("qo_indptr_decreasing", FI_STATUS_INVALID_ARGUMENT, "qo_indptr", "3", "2");
    }
    if (selected("kv_indptr_decreasing")) {
        /* kv_indices holds 3 entries: a library that walked indptr up to 13
         * before checking it would read past the guard page. */
        set_ints(&fx.kv_indptr, 3, (int32_t[]){0, 13, 11});
        fx.batch.kv_indptr = arr(&fx.kv_indptr);
        UPDATE_FAILS("kv_indptr_decreasing", FI_STATUS_INVALID_ARGUMENT, "kv_indptr", "13", "11");
    }
    if (selected("mask_indptr_decreasing")) {
        fx.params.mask_mode = FI_MASK_CUSTOM;
        set_ints(&fx.mask_indptr, 3, (int32_t[]){0, 9, 7});
        fx.batch.mask_indptr = arr(&fx.mask_indptr);
        UPDATE_FAILS("mask_indptr_decreasing", FI_STATUS_INVALID_ARGUMENT, "mask_indptr", "9", "7");
    }
    if (selected("mask_indptr_short")) {
        /* request 0 needs ceil(3*6/8) = 3 bytes, given 1 */
        fx.params.mask_mode = FI_MASK_CUSTOM;
        set_ints(&fx.mask_indptr, 3, (int32_t[]){0, 1, 4});
        fx.batch.mask_indptr = arr(&fx.mask_indptr);
        UPDATE_FAILS("mask_indptr_short", FI_STATUS_INVALID_ARGUMENT, "mask_indptr");
    }
    if (selected("batch_size_negative")) {
        fx.batch.batch_size = -3;
        UPDATE_FAILS("batch_size_negative", FI_STATUS_INVALID_ARGUMENT, "batch_size", "-3");
    }
}

static void test_pages(void) {
    category = "pages";
    if (selected("page_index_negative")) page_out_of_range("page_index_negative", -5);
    if (selected("page_index_past_cache")) page_out_of_range("page_index_past_cache", 1000);
    if (selected("page_index_equal_pages")) page_out_of_range("page_index_equal_pages", PAGES);
    if (selected("last_page_len_over_page_size")) {
        arr(&fx.last)[1] = 9;
        UPDATE_FAILS("last_page_len_over_page_size", FI_STATUS_INVALID_ARGUMENT,
                     "kv_last_page_len", "9");
    }
    if (selected("last_page_len_zero")) {
        arr(&fx.last)[0] = 0; /* request 0 has two pages */
        UPDATE_FAILS("last_page_len_zero", FI_STATUS_INVALID_ARGUMENT, "kv_last_page_len", "0");
    }
    if (selected("last_page_len_negative")) {
        arr(&fx.last)[0] = -2;
        UPDATE_FAILS("last_page_len_negative", FI_STATUS_INVALID_ARGUMENT, "kv_last_page_len", "-2");
    }
}

static void test_params(void) {
    category = "params";
    if (selected("heads_not_divisible")) {
        fx.params.num_qo_heads = 6;
        fx.params.num_kv_heads = 4;
        CREATE_FAILS("heads_not_divisible", FI_STATUS_INVALID_ARGUMENT, "6", "4");
    }
    if (selected("heads_zero")) {
        fx.params.num_kv_heads = 0;
        CREATE_FAILS("heads_zero", FI_STATUS_INVALID_ARGUMENT, "num_kv_heads");
    }
    if (selected("head_dim_100")) {
        fx.params.head_dim_qk = fx.params.head_dim_vo = 100;
        CREATE_FAILS("head_dim_100", FI_STATUS_UNSUPPORTED, "head_dim", "100");
    }
    if (selected("head_dim_vo_100")) {
        fx.params.head_dim_vo = 100;
        CREATE_FAILS("head_dim_vo_100", FI_STATUS_UNSUPPORTED, "head_dim_vo", "100");
    }
    static const struct { const char *name; int which; fi_dtype dt; } dts[] = {
        {"q_dtype_i32", 0, FI_DTYPE_I32},  {"q_dtype_e4m3", 0, FI_DTYPE_E4M3},
        {"q_dtype_u8", 0, FI_DTYPE_U8},    {"o_dtype_e5m2", 2, FI_DTYPE_E5M2},
        {"kv_dtype_i32", 1, FI_DTYPE_I32}, {"kv_dtype_unknown", 1, (fi_dtype)77},
    };
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        if (!selected(dts[i].name)) continue;
        fi_dtype *f = dts[i].which == 0 ? &fx.params.q_dtype
                    : dts[i].which == 1 ? &fx.params.kv_dtype : &fx.params.o_dtype;
        *f = dts[i].dt;
        const char *field = dts[i].which == 0 ? "q_dtype" : dts[i].which == 1 ? "kv_dtype" : "o_dtype";
        if (dts[i].dt == (fi_dtype)77)
            CREATE_FAILS(dts[i].name, FI_STATUS_UNSUPPORTED, field);
        else
            CREATE_FAILS(dts[i].name, FI_STATUS_UNSUPPORTED, field, fi_dtype_name(dts[i].dt));
    }
    if (selected("page_size_zero")) {
        fx.params.page_size = 0;
        CREATE_FAILS("page_size_zero", FI_STATUS_INVALID_ARGUMENT, "page_size", "0");
    }
    if (selected("window_left_minus2")) {
        fx.params.window_left = -2;
        CREATE_FAILS("window_left_minus2", FI_STATUS_INVALID_ARGUMENT, "window_left", "-2");
    }
    if (selected("soft_cap_negative")) {
        fx.params.logits_soft_cap = -30.0f;
        CREATE_FAILS("soft_cap_negative", FI_STATUS_INVALID_ARGUMENT, "logits_soft_cap", "-30");
    }
    if (selected("soft_cap_nan")) {
        fx.params.logits_soft_cap = NAN;
        CREATE_FAILS("soft_cap_nan", FI_STATUS_INVALID_ARGUMENT, "logits_soft_cap");
    }
    if (selected("sm_scale_negative")) {
        fx.params.sm_scale = -0.5f;
        CREATE_FAILS("sm_scale_negative", FI_STATUS_INVALID_ARGUMENT, "sm_scale", "-0.5");
    }
    if (selected("rope_theta_zero")) {
        fx.params.pos_encoding = FI_POS_ROPE_LLAMA;
        fx.params.rope_theta = 0.0f;
        CREATE_FAILS("rope_theta_zero", FI_STATUS_INVALID_ARGUMENT, "rope_theta");
    }
    if (selected("k_scale_zero")) {
        fx.params.kv_dtype = FI_DTYPE_E4M3;
        fx.params.k_scale = 0.0f;
        CREATE_FAILS("k_scale_zero", FI_STATUS_INVALID_ARGUMENT, "k_scale");
    }
    if (selected("alibi_slope_nan")) {
        float slopes[HQ] = {0.5f, 0.25f, NAN, 0.1f};
        fx.params.pos_encoding = FI_POS_ALIBI;
        fx.params.alibi_slopes = slopes;
        CREATE_FAILS("alibi_slope_nan", FI_STATUS_INVALID_ARGUMENT, "alibi_slopes[2]");
    }
    if (selected("mask_mode_unknown")) {
        fx.params.mask_mode = (fi_mask_mode)9;
        CREATE_FAILS("mask_mode_unknown", FI_STATUS_INVALID_ARGUMENT, "mask_mode", "9");
    }
    if (selected("params_struct_size")) {
        fx.params.struct_size = 12;
        CREATE_FAILS("params_struct_size", FI_STATUS_INVALID_ARGUMENT, "struct_size", "12");
    }
    if (selected("config_struct_size")) {
        fx.config.struct_size = 3;
        CREATE_FAILS("config_struct_size", FI_STATUS_INVALID_ARGUMENT, "struct_size", "3");
    }
    if (selected("config_bounds_zero")) {
        fx.config.max_total_qo = 0;
        CREATE_FAILS("config_bounds_zero", FI_STATUS_INVALID_ARGUMENT, "max_total_qo");
    }
    if (selected("config_fixed_split_negative")) {
        fx.config.fixed_split_size = -8;
        CREATE_FAILS("config_fixed_split_negative", FI_STATUS_INVALID_ARGUMENT, "fixed_split_size", "-8");
    }
    if (selected("config_workers_negative")) {
        fx.config.num_workers = -4;
        CREATE_FAILS("config_workers_negative", FI_STATUS_INVALID_ARGUMENT, "num_workers", "-4");
    }
    if (selected("config_device_table_ragged")) {
        fx.config.device_page_table = 1;
        fx.params.kv_format = FI_KV_FORMAT_RAGGED;
        CREATE_FAILS("config_device_table_ragged", FI_STATUS_INVALID_ARGUMENT, "device_page_table",
                     "paged");
    }
}

static void test_null(void) {
    category = "null";
    if (selected("create_params_null")) {
        fi_plan *plan = NULL;
        record("create_params_null",
               expect(fi_plan_create(fx.ctx, NULL, &fx.config, &plan), FI_STATUS_INVALID_ARGUMENT, END) &&
               plan == NULL);
    }
    if (selected("create_ctx_null")) {
        fi_plan *plan = NULL;
        record("create_ctx_null",
               expect(fi_plan_create(NULL, &fx.params, &fx.config, &plan), FI_STATUS_INVALID_ARGUMENT, END));
    }
    if (selected("create_out_null"))
        record("create_out_null",
               expect(fi_plan_create(fx.ctx, &fx.params, &fx.config, NULL), FI_STATUS_INVALID_ARGUMENT, END));
    if (selected("context_out_null")) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        record("context_out_null", expect(fi_context_create(&opt, NULL), FI_STATUS_INVALID_ARGUMENT, END));
    }
    if (selected("update_plan_null"))
        record("update_plan_null", expect(fi_plan_update(NULL, &fx.batch), FI_STATUS_INVALID_ARGUMENT, END));
    if (selected("update_batch_null")) {
        fi_plan *plan = make_plan();
        record("update_batch_null", plan && expect(fi_plan_update(plan, NULL), FI_STATUS_INVALID_ARGUMENT, END));
        fi_plan_destroy(plan);
    }
    if (selected("qo_indptr_null")) {
        fx.batch.qo_indptr = NULL;
        UPDATE_FAILS("qo_indptr_null", FI_STATUS_INVALID_ARGUMENT, "qo_indptr");
    }
    if (selected("kv_indptr_null")) {
        fx.batch.kv_indptr = NULL;
        UPDATE_FAILS("kv_indptr_null", FI_STATUS_INVALID_ARGUMENT, "kv_indptr");
    }
    if (selected("kv_indices_null")) {
        fx.batch.kv_indices = NULL;
        UPDATE_FAILS("kv_indices_null", FI_STATUS_INVALID_ARGUMENT, "kv_indices");
    }
    if (selected("last_page_len_null")) {
        fx.batch.kv_last_page_len = NULL;
        UPDATE_FAILS("last_page_len_null", FI_STATUS_INVALID_ARGUMENT, "kv_last_page_len");
    }
    if (selected("run_args_null")) {
        fi_plan *plan = make_plan();
        int ok = plan && fi_plan_update(plan, &fx.batch) == FI_OK &&
                 expect(fi_plan_run(plan, NULL), FI_STATUS_INVALID_ARGUMENT, END);
        fi_plan_destroy(plan);
        record("run_args_null", ok);
    }
    if (selected("run_plan_null"))
        record("run_plan_null", expect(fi_plan_run(NULL, &fx.args), FI_STATUS_INVALID_ARGUMENT, END));
    static const char *const names[] = {"q", "k", "v", "o"};
    for (int i = 0; i < 4; i++) {
        char name[32];
        snprintf(name, sizeof name, "%s_data_null", names[i]);
        if (!selected(name)) continue;
        fi_tensor *t = i == 0 ? &fx.args.q : i == 1 ? &fx.args.k : i == 2 ? &fx.args.v : &fx.args.o;
        t->data = NULL;
        char field[16];
        snprintf(field, sizeof field, "%s.data", names[i]);
        RUN_FAILS(name, FI_STATUS_INVALID_ARGUMENT, field);
    }
    if (selected("custom_mask_null")) {
        fx.params.mask_mode = FI_MASK_CUSTOM; /* args.custom_mask left empty */
        RUN_FAILS("custom_mask_null", FI_STATUS_INVALID_ARGUMENT, "custom_mask");
    }
    if (selected("get_info_null")) {
        fi_plan_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        record("get_info_null", expect(fi_plan_get_info(NULL, &info), FI_STATUS_INVALID_ARGUMENT, END));
    }
    if (selected("split_kv_null")) {
        fi_tensor k, v;
        record("split_kv_null", expect(fi_tensor_split_kv(NULL, &k, &v), FI_STATUS_INVALID_ARGUMENT, END));
    }
    if (selected("split_kv_not_2")) {
        fi_tensor k, v;
        record("split_kv_not_2", expect(fi_tensor_split_kv(&fx.k.t, &k, &v), FI_STATUS_INVALID_ARGUMENT,
                                        "shape[1]", END));
    }
}

static void test_buffers(void) {
    category = "buffers";
    if (selected("q_too_few_rows")) {
        tensor(&fx.q, FI_DTYPE_F32, 3, (int64_t[]){TOTAL_Q - 1, HQ, D});
        fx.args.q = fx.q.t;
        RUN_FAILS("q_too_few_rows", FI_STATUS_INVALID_ARGUMENT, "q.shape[0]", "3");
    }
    if (selected("q_wrong_heads")) {
        tensor(&fx.q, FI_DTYPE_F32, 3, (int64_t[]){TOTAL_Q, HQ / 2, D});
        fx.args.q = fx.q.t;
        RUN_FAILS("q_wrong_heads", FI_STATUS_INVALID_ARGUMENT, "q.shape[1]");
    }
    if (selected("q_wrong_dtype")) {
        tensor(&fx.q, FI_DTYPE_F16, 3, (int64_t[]){TOTAL_Q, HQ, D});
        fx.args.q = fx.q.t;
        RUN_FAILS("q_wrong_dtype", FI_STATUS_INVALID_ARGUMENT, "q", "f16");
    }
    if (selected("q_wrong_ndim")) {
        fx.args.q.ndim = 2;
        fx.args.q.shape[1] = HQ * D;
        RUN_FAILS("q_wrong_ndim", FI_STATUS_INVALID_ARGUMENT, "q.ndim");
    }
    if (selected("o_too_few_rows")) {
        tensor(&fx.o, FI_DTYPE_F32, 3, (int64_t[]){TOTAL_Q - 2, HQ, D});
        tu_buf_poison(&fx.o);
        fx.args.o = fx.o.t;
        RUN_FAILS("o_too_few_rows", FI_STATUS_INVALID_ARGUMENT, "o.shape[0]", "2");
    }
    if (selected("o_wrong_head_dim")) {
        tensor(&fx.o, FI_DTYPE_F32, 3, (int64_t[]){TOTAL_Q, HQ, D / 2});
        tu_buf_poison(&fx.o);
        fx.args.o = fx.o.t;
        RUN_FAILS("o_wrong_head_dim", FI_STATUS_INVALID_ARGUMENT, "o.shape[2]", "32");
    }
    if (selected("k_fewer_pages")) {
        /* pages 0..4 are referenced; the cache has 4 */
        tensor(&fx.k, FI_DTYPE_F32, 4, (int64_t[]){PAGES - 1, PS, HKV, D});
        fx.args.k = fx.k.t;
        RUN_FAILS("k_fewer_pages", FI_STATUS_INVALID_ARGUMENT, "k.shape[0]", "4");
    }
    if (selected("v_fewer_pages")) {
        tensor(&fx.v, FI_DTYPE_F32, 4, (int64_t[]){2, PS, HKV, D});
        fx.args.v = fx.v.t;
        RUN_FAILS("v_fewer_pages", FI_STATUS_INVALID_ARGUMENT, "v.shape[0]", "2");
    }
    if (selected("k_wrong_page_size")) {
        tensor(&fx.k, FI_DTYPE_F32, 4, (int64_t[]){PAGES, PS * 2, HKV, D});
        fx.args.k = fx.k.t;
        RUN_FAILS("k_wrong_page_size", FI_STATUS_INVALID_ARGUMENT, "k.shape[1]", "8");
    }
    if (selected("lse_too_small")) {
        tensor(&fx.lse, FI_DTYPE_F32, 2, (int64_t[]){TOTAL_Q - 1, HQ});
        tu_buf_poison(&fx.lse);
        fx.args.lse = fx.lse.t;
        RUN_FAILS("lse_too_small", FI_STATUS_INVALID_ARGUMENT, "lse.shape[0]", "3");
    }
    if (selected("lse_wrong_dtype")) {
        tensor(&fx.lse, FI_DTYPE_F16, 2, (int64_t[]){TOTAL_Q, HQ});
        tu_buf_poison(&fx.lse);
        fx.args.lse = fx.lse.t;
        RUN_FAILS("lse_wrong_dtype", FI_STATUS_INVALID_ARGUMENT, "lse", "f16");
    }
    if (selected("custom_mask_too_small")) {
        fx.params.mask_mode = FI_MASK_CUSTOM; /* needs 3 + 1 bytes */
        tensor(&fx.mask, FI_DTYPE_U8, 1, (int64_t[]){3});
        fx.args.custom_mask = fx.mask.t;
        RUN_FAILS("custom_mask_too_small", FI_STATUS_INVALID_ARGUMENT, "custom_mask", "3");
    }
    if (selected("ragged_k_too_few_tokens")) {
        /* ragged: 10 KV tokens in the batch, K holds 9 */
        fx.params.kv_format = FI_KV_FORMAT_RAGGED;
        fx.config.max_total_kv = 10;
        set_ints(&fx.kv_indptr, 3, (int32_t[]){0, 6, 10});
        fx.batch.kv_indptr = arr(&fx.kv_indptr);
        fx.batch.kv_indices = NULL;
        fx.batch.kv_last_page_len = NULL;
        tensor(&fx.k, FI_DTYPE_F32, 3, (int64_t[]){9, HKV, D});
        tensor(&fx.v, FI_DTYPE_F32, 3, (int64_t[]){10, HKV, D});
        fx.args.k = fx.k.t;
        fx.args.v = fx.v.t;
        RUN_FAILS("ragged_k_too_few_tokens", FI_STATUS_INVALID_ARGUMENT, "k.shape[0]", "9");
    }
    if (selected("stride_negative")) {
        fx.args.q.stride[1] = -D;
        RUN_FAILS("stride_negative", FI_STATUS_INVALID_ARGUMENT, "q.stride[1]");
    }
}

static void test_alignment(void) {
    category = "alignment";
    static const struct { const char *name; int which; size_t off; fi_dtype dt; const char *field; } al[] = {
        {"q_f32_odd_address", 0, 1, FI_DTYPE_F32, "q.data"},
        {"k_f32_address_plus2", 1, 2, FI_DTYPE_F32, "k.data"},
        {"o_f16_odd_address", 2, 1, FI_DTYPE_F16, "o.data"},
        {"lse_address_plus3", 3, 3, FI_DTYPE_F32, "lse.data"},
    };
    for (size_t i = 0; i < sizeof al / sizeof al[0]; i++) {
        if (!selected(al[i].name)) continue;
        if (al[i].dt == FI_DTYPE_F16) {
            fx.params.o_dtype = FI_DTYPE_F16;
            tensor(&fx.o, FI_DTYPE_F16, 3, (int64_t[]){TOTAL_Q + 1, HQ, D});
            tu_buf_poison(&fx.o);
            fx.args.o = fx.o.t;
        }
        /* The view moved by `off` bytes inside its allocation: in bounds,
         * but not aligned to the element. */
        fi_tensor *t = al[i].which == 0 ? &fx.args.q : al[i].which == 1 ? &fx.args.k
                     : al[i].which == 2 ? &fx.args.o : &fx.args.lse;
        tu_buf *b = al[i].which == 0 ? &fx.q : al[i].which == 1 ? &fx.k
                  : al[i].which == 2 ? &fx.o : &fx.lse;
        /* re-allocate one row bigger so the shifted view stays inside */
        if (al[i].which != 2) {
            int64_t shape[4];
            for (int32_t d = 0; d < t->ndim; d++) shape[d] = t->shape[d];
            shape[0] += 1;
            tensor(b, t->dtype, t->ndim, shape);
            tu_buf_poison(b);
            fi_tensor moved = fi_tensor_contiguous(b->base, t->dtype, t->ndim, t->shape);
            *t = moved;
        }
        t->data = (char *)b->base + al[i].off;
        RUN_FAILS(al[i].name, FI_STATUS_INVALID_ARGUMENT, al[i].field, "align");
    }
}

/* The batch over each bound; then the same plan must still plan and run a
 * valid batch correctly (a refused batch corrupts nothing). */
static void test_bounds(void) {
    category = "bounds";
    if (selected("max_batch_size")) {
        fx.config.max_batch_size = 1;
        UPDATE_FAILS("max_batch_size", FI_STATUS_BOUND_EXCEEDED, "max_batch_size", "2");
    }
    if (selected("max_total_qo")) {
        fx.config.max_total_qo = 3;
        UPDATE_FAILS("max_total_qo", FI_STATUS_BOUND_EXCEEDED, "max_total_qo", "4");
    }
    if (selected("max_total_kv_pages")) {
        fx.config.max_total_kv = 2;
        UPDATE_FAILS("max_total_kv_pages", FI_STATUS_BOUND_EXCEEDED, "max_total_kv", "3");
    }
    if (selected("max_total_kv_tokens")) {
        fx.params.kv_format = FI_KV_FORMAT_RAGGED;
        fx.config.max_total_kv = 9;
        set_ints(&fx.kv_indptr, 3, (int32_t[]){0, 6, 10});
        fx.batch.kv_indptr = arr(&fx.kv_indptr);
        UPDATE_FAILS("max_total_kv_tokens", FI_STATUS_BOUND_EXCEEDED, "max_total_kv", "10");
    }
    if (selected("recovery_after_refusals")) {
        /* One plan sized for the fixture: refuse three bad batches, then the
         * good one must plan and run to the oracle's answer. */
        fi_plan *plan = make_plan();
        int ok = plan != NULL;
        if (ok) {
            fi_batch big = fx.batch;
            big.batch_size = 3;
            tu_buf qo3, kv3, last3;
            memset(&qo3, 0, sizeof qo3); memset(&kv3, 0, sizeof kv3); memset(&last3, 0, sizeof last3);
            set_ints(&qo3, 4, (int32_t[]){0, 1, 2, 3});
            set_ints(&kv3, 4, (int32_t[]){0, 1, 2, 3});
            set_ints(&last3, 3, (int32_t[]){1, 1, 1});
            big.qo_indptr = arr(&qo3);
            big.kv_indptr = arr(&kv3);
            big.kv_last_page_len = arr(&last3);
            ok &= expect(fi_plan_update(plan, &big), FI_STATUS_BOUND_EXCEEDED, "max_batch_size", END);
            arr(&fx.last)[1] = 99;
            ok &= expect(fi_plan_update(plan, &fx.batch), FI_STATUS_INVALID_ARGUMENT, "99", END);
            arr(&fx.last)[1] = 4;
            /* after a refused update, run must not use a half-copied batch */
            fi_status st = fi_plan_run(plan, &fx.args);
            if (st != FI_STATUS_NOT_PLANNED) {
                tu_note("run after a refused update: %s, expected not planned", fi_status_string(st));
                ok = 0;
            }
            ok &= outputs_untouched();
            st = fi_plan_update(plan, &fx.batch);
            if (st == FI_OK) st = fi_plan_run(plan, &fx.args);
            if (st != FI_OK) {
                tu_note("valid batch after refusals: %s: %s", fi_status_string(st), fi_last_error());
                ok = 0;
            } else {
                double ref_o[TOTAL_Q * HQ * D], ref_l[TOTAL_Q * HQ], got_o[TOTAL_Q * HQ * D], got_l[TOTAL_Q * HQ];
                oracle_attention(&fx.params, &fx.batch, &fx.q.t, &fx.k.t, &fx.v.t, NULL, ref_o, ref_l);
                for (int i = 0; i < TOTAL_Q * HQ * D; i++) got_o[i] = ((float *)fx.o.base)[i];
                for (int i = 0; i < TOTAL_Q * HQ; i++) got_l[i] = ((float *)fx.lse.base)[i];
                tu_cmp c;
                if (tu_compare(got_o, ref_o, TOTAL_Q * HQ * D, 1e-5, 1e-5, &c) ||
                    tu_compare(got_l, ref_l, TOTAL_Q * HQ, 4e-5, 1e-5, &c)) {
                    tu_note("wrong result after refusals: worst got %g want %g", c.worst_got, c.worst_ref);
                    ok = 0;
                }
            }
            tu_buf_free(&qo3); tu_buf_free(&kv3); tu_buf_free(&last3);
        }
        fi_plan_destroy(plan);
        record("recovery_after_refusals", ok);
    }
}

/* fi_last_error is per thread: two threads fail differently, in lock step,
 * and each reads back its own message. */
typedef struct err_thread {
    int32_t window;       /* the bad window_left this thread passes */
    pthread_barrier_t *barrier;
    char msg[256];
} err_thread;

static void *err_thread_main(void *arg) {
    err_thread *t = arg;
    fi_attention_params p = fx.params;
    p.window_left = t->window;
    fi_plan *plan = NULL;
    fi_plan_create(fx.ctx, &p, &fx.config, &plan); /* fails: window < -1 */
    pthread_barrier_wait(t->barrier);               /* both have failed now */
    snprintf(t->msg, sizeof t->msg, "%s", fi_last_error());
    fi_plan_destroy(plan);
    return NULL;
}

static int last_error_per_thread(void) {
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, 2);
    err_thread t[2] = {{-3, &barrier, ""}, {-9, &barrier, ""}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, err_thread_main, &t[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&barrier);
    int ok = strstr(t[0].msg, "-3") && !strstr(t[0].msg, "-9") && strstr(t[1].msg, "-9") &&
             !strstr(t[1].msg, "-3");
    if (!ok) tu_note("thread messages: \"%s\" and \"%s\"", t[0].msg, t[1].msg);
    return ok;
}

static void test_lifecycle(void) {
    category = "lifecycle";
    if (selected("run_before_update")) {
        fi_plan *plan = make_plan();
        record("run_before_update", plan && expect(fi_plan_run(plan, &fx.args), FI_STATUS_NOT_PLANNED, END) &&
                                        outputs_untouched());
        fi_plan_destroy(plan);
    }
    if (selected("info_before_update")) {
        fi_plan *plan = make_plan();
        fi_plan_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        record("info_before_update", plan && expect(fi_plan_get_info(plan, &info), FI_STATUS_NOT_PLANNED, END));
        fi_plan_destroy(plan);
    }
    if (selected("destroy_null")) {
        fi_plan_destroy(NULL);
        fi_context_destroy(NULL);
        record("destroy_null", 1);
    }
    if (selected("status_strings")) {
        int ok = 1;
        for (int s = FI_OK; s <= FI_STATUS_INTERNAL; s++) {
            const char *str = fi_status_string((fi_status)s);
            if (!str || !str[0]) { tu_note("fi_status_string(%d) is empty", s); ok = 0; }
            for (int t = FI_OK; t < s && str; t++)
                if (!strcmp(str, fi_status_string((fi_status)t))) { tu_note("statuses %d and %d share a name", s, t); ok = 0; }
        }
        if (!fi_status_string((fi_status)1234)) { tu_note("fi_status_string(1234) is NULL"); ok = 0; }
        if (fi_version_number() != FI_VERSION_NUMBER || strcmp(fi_version_string(), FI_VERSION_STRING)) {
            tu_note("run-time version %d differs from the header's %d", (int)fi_version_number(), FI_VERSION_NUMBER);
            ok = 0;
        }
        record("status_strings", ok);
    }
    if (selected("last_error_per_thread")) record("last_error_per_thread", last_error_per_thread());
    if (selected("message_is_per_call")) {
        /* The message of a failure is replaced by the next failure's. */
        fi_plan *plan = NULL;
        fx.params.head_dim_qk = 100;
        fi_plan_create(fx.ctx, &fx.params, &fx.config, &plan);
        fx.params.head_dim_qk = D;
        fx.params.window_left = -7;
        fi_status st = fi_plan_create(fx.ctx, &fx.params, &fx.config, &plan);
        int ok = expect(st, FI_STATUS_INVALID_ARGUMENT, "-7", END) && !strstr(fi_last_error(), "100");
        record("message_is_per_call", ok);
    }
}

static void test_device(void) {
    category = "device";
    if (selected("cuda_without_cuda")) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.device = FI_DEVICE_CUDA;
        fi_context *ctx = (fi_context *)(uintptr_t)1;
        if (fi_device_available(FI_DEVICE_CUDA)) {
            tu_note("CUDA is available here");
            tu_record(category, "bad_input/device/cuda_without_cuda", TU_SKIP);
        } else {
            fi_status st = fi_context_create(&opt, &ctx);
            int ok = expect(st, FI_STATUS_NO_DEVICE, END);
            /* the message must say which device is missing, in any case */
            const char *msg = fi_last_error();
            if (!strstr(msg, "CUDA") && !strstr(msg, "cuda") && !strstr(msg, "GPU")) {
                tu_note("message names neither CUDA nor a GPU: \"%s\"", msg);
                ok = 0;
            }
            record("cuda_without_cuda", ok);
            if (st == FI_OK) fi_context_destroy(ctx);
        }
    }
    if (selected("device_unknown")) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.device = (fi_device_type)5;
        fi_context *ctx = NULL;
        fi_status st = fi_context_create(&opt, &ctx);
        record("device_unknown", expect(st, FI_STATUS_INVALID_ARGUMENT, "5", END) &&
                                    fi_device_available((fi_device_type)5) == 0);
        if (st == FI_OK) fi_context_destroy(ctx);
    }
    if (selected("simd_unknown_name")) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.cpu_simd = "sse9";
        fi_context *ctx = NULL;
        fi_status st = fi_context_create(&opt, &ctx);
        record("simd_unknown_name", expect(st, FI_STATUS_INVALID_ARGUMENT, "sse9", END));
        if (st == FI_OK) fi_context_destroy(ctx);
    }
    if (selected("threads_negative")) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.num_threads = -1;
        fi_context *ctx = NULL;
        fi_status st = fi_context_create(&opt, &ctx);
        record("threads_negative", expect(st, FI_STATUS_INVALID_ARGUMENT, "num_threads", "-1", END));
        if (st == FI_OK) fi_context_destroy(ctx);
    }
    if (selected("options_struct_size")) {
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.struct_size = 7;
        fi_context *ctx = NULL;
        fi_status st = fi_context_create(&opt, &ctx);
        record("options_struct_size", expect(st, FI_STATUS_INVALID_ARGUMENT, "struct_size", "7", END));
        if (st == FI_OK) fi_context_destroy(ctx);
    }
}

/* ------------------------------------------------ sizes, handles, overlap */

/* Requests of sizes no machine has are refused, or fail to allocate with
 * FI_STATUS_OUT_OF_MEMORY; under AddressSanitizer such an allocation must
 * return NULL for that, not abort (past 256 MB at once: the sanitizer's
 * shadow of a lazily mapped one would fill the memory). */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1:max_allocation_size_mb=256";
}

static int status_in(fi_status st, fi_status a, fi_status b) {
    if (st == a || st == b) return 1;
    tu_note("status %s: %s", fi_status_string(st), fi_last_error());
    return 0;
}

/* The fixture's params as block-sparse params (one head dim, f32). */
static fi_attention_params bsr_params(void) {
    fi_attention_params p = fx.params;
    p.mask_mode = FI_MASK_NONE;
    return p;
}

/* Fixed R x C blocks over M queries and N keys, max_nnz nnz (0: dense). */
static fi_bsr_config bsr_config(int32_t R, int32_t C, int32_t M, int32_t N, int32_t nnz) {
    fi_bsr_config c;
    fi_bsr_config_init(&c);
    c.block_rows = R, c.block_cols = C;
    c.max_qo_len = M, c.max_kv_len = N;
    c.max_nnz = nnz;
    return c;
}

static void test_overflow(void) {
    category = "overflow";
    if (selected("bsr_mask_capacity")) {
        /* max_nnz x R x C bits = 2^64: the mask capacity must not wrap */
        fi_bsr_config c = bsr_config(1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 24);
        c.element_mask = 1;
        fi_attention_params p = bsr_params();
        fi_bsr *bsr = NULL;
        fi_status st = fi_bsr_create(fx.ctx, &p, &c, &bsr);
        int ok = expect(st, FI_STATUS_INVALID_ARGUMENT, "block_rows=1048576", "max_nnz=16777216", END);
        if (st == FI_OK) {
            /* what the unchecked capacity let through: 10 x 10 bits, 13 bytes */
            int32_t indptr[2] = {0, 1}, indices[1] = {0};
            fi_bsr_update(bsr, 10, 10, indptr, indices, NULL);
        }
        fi_bsr_destroy(bsr);
        record("bsr_mask_capacity", ok);
    }
    if (selected("bsr_rows_int32_max")) {
        /* INT32_MAX block rows: 2 x (rows + 1) must not overflow int */
        fi_bsr_config c = bsr_config(1, 16, INT32_MAX, 64, 4);
        fi_attention_params p = bsr_params();
        fi_bsr *bsr = NULL;
        fi_status st = fi_bsr_create(fx.ctx, &p, &c, &bsr);
        int ok = st == FI_OK || status_in(st, FI_STATUS_OUT_OF_MEMORY, FI_STATUS_INVALID_ARGUMENT);
        fi_bsr_destroy(bsr);
        record("bsr_rows_int32_max", ok);
    }
    if (selected("bsr_variable_map")) {
        /* H_kv x MB x NB map entries past int64 */
        fi_bsr_config c = bsr_config(0, 0, 64, 64, 64);
        c.variable_blocks = 1;
        c.max_block_rows = INT32_MAX;
        fi_attention_params p = bsr_params();
        fi_bsr *bsr = NULL;
        fi_status st = fi_bsr_create(fx.ctx, &p, &c, &bsr);
        int ok = 1;
        if (st == FI_OK) {
            int32_t rows[2] = {64, 0}, cols[2] = {64, 0};
            uint8_t map[1] = {1};
            ok = expect(fi_bsr_update_variable(bsr, 64, 64, INT32_MAX, INT32_MAX, rows, cols, map),
                        FI_STATUS_INVALID_ARGUMENT, "block_mask_map", "2147483647", END);
        } else {
            ok = status_in(st, FI_STATUS_OUT_OF_MEMORY, FI_STATUS_INVALID_ARGUMENT);
        }
        fi_bsr_destroy(bsr);
        record("bsr_variable_map", ok);
    }
    if (selected("split_kv_ndim")) {
        fi_tensor kv = fx.k.t, k, v;
        kv.ndim = 40;
        kv.shape[1] = 2;
        record("split_kv_ndim", expect(fi_tensor_split_kv(&kv, &k, &v), FI_STATUS_INVALID_ARGUMENT,
                                       "ndim=40", END));
    }
    if (selected("fixed_split_huge_bounds")) {
        /* max_total_qo x ceil(max_kv_len / F) past int64 */
        fx.config.max_batch_size = 1;
        fx.config.max_total_qo = INT32_MAX;
        fx.config.max_total_kv = INT32_MAX;
        fx.config.fixed_split_size = 1;
        fx.params.page_size = 1 << 30;
        fi_plan *plan = NULL;
        fi_status st = fi_plan_create(fx.ctx, &fx.params, &fx.config, &plan);
        int ok = st == FI_OK || status_in(st, FI_STATUS_OUT_OF_MEMORY, FI_STATUS_INVALID_ARGUMENT);
        fi_plan_destroy(plan);
        record("fixed_split_huge_bounds", ok);
    }
    if (selected("plan_workspace_bytes")) {
        /* partial-state rows x heads x (D + 1) floats past size_t */
        fx.params.num_qo_heads = 1 << 30;
        fx.params.num_kv_heads = 1;
        fx.config.max_total_qo = 1 << 16;
        fx.config.max_total_kv = 1 << 16;
        fx.config.fixed_split_size = 1;
        CREATE_FAILS("plan_workspace_bytes", FI_STATUS_INVALID_ARGUMENT, "num_qo_heads=1073741824",
                     "overflows");
    }
    if (selected("cascade_workspace_bytes")) {
        fi_attention_params p = fx.params;
        p.num_qo_heads = INT32_MAX - 1;
        p.num_kv_heads = 1;
        p.head_dim_vo = 256;
        int ok = 1;
        if (fi_cascade_workspace_size(&p, FI_CASCADE_MAX_LEVELS, INT32_MAX) != 0) {
            tu_note("fi_cascade_workspace_size of 2^31 x 2^31 x 8 x 256 floats is not 0");
            ok = 0;
        }
        fi_plan_config cfg[2] = {fx.config, fx.config};
        cfg[0].max_total_qo = cfg[1].max_total_qo = INT32_MAX;
        fi_cascade *c = NULL;
        fi_status st = fi_cascade_create(fx.ctx, &p, 2, cfg, NULL, &c);
        ok &= st != FI_OK && status_in(st, FI_STATUS_OUT_OF_MEMORY, FI_STATUS_INVALID_ARGUMENT);
        fi_cascade_destroy(c);
        record("cascade_workspace_bytes", ok);
    }
    if (selected("cascade_auto_host_arrays")) {
        /* an automatic cascade's host arrays for 400 requests: the sum that
         * sized them left out one array per shared level (found by
         * fuzz_cascade); 400 requests in pairs sharing their first page */
        enum { N = 400 };
        fi_plan_config cfg = fx.config;
        cfg.max_batch_size = N, cfg.max_total_qo = N, cfg.max_total_kv = 2 * N;
        fi_cascade_options co;
        fi_cascade_options_init(&co);
        co.prefix_detection = FI_PREFIX_DETECTION_ALWAYS;
        fi_cascade *c = NULL;
        int ok = expect(fi_cascade_create_auto(fx.ctx, &fx.params, &cfg, &co, &c), FI_OK, END);
        static int32_t qo[N + 1], kv[N + 1], idx[2 * N], last[N];
        for (int32_t i = 0; i <= N; i++) qo[i] = i, kv[i] = 2 * i;
        for (int32_t i = 0; i < N; i++) {
            idx[2 * i] = i / 2; /* shared with its pair */
            idx[2 * i + 1] = N + i;
            last[i] = PS;
        }
        fi_batch b = {N, qo, kv, idx, last, NULL};
        if (ok) ok = expect(fi_cascade_update_batch(c, &b), FI_OK, END);
        fi_cascade_info info;
        fi_cascade_info_init(&info);
        if (ok && (fi_cascade_get_info(c, &info) || !info.split))
            tu_note("the batch was not split into a shared level"), ok = 0;
        fi_cascade_destroy(c);
        record("cascade_auto_host_arrays", ok);
    }
    if (selected("contiguous_shape_product")) {
        /* strides of a contiguous view past int64: refused, not wrapped */
        int64_t shape[3] = {(int64_t)1 << 40, (int64_t)1 << 40, D};
        fx.args.q = fi_tensor_contiguous(fx.q.base, FI_DTYPE_F32, 3, shape);
        fx.args.q.shape[1] = HQ;
        RUN_FAILS("contiguous_shape_product", FI_STATUS_INVALID_ARGUMENT, "q", "overflows");
    }
    if (selected("empty_batch_null_arrays")) {
        /* batch_size 0 with no last_page_len / kv_indices: nothing to copy */
        fi_plan *plan = make_plan();
        int32_t zero[1] = {0};
        fi_batch b = {0, zero, zero, NULL, NULL, NULL};
        int ok = plan && expect(fi_plan_update(plan, &b), FI_OK, END) &&
                 expect(fi_plan_run(plan, &fx.args), FI_OK, END) && outputs_untouched();
        fi_plan_destroy(plan);
        record("empty_batch_null_arrays", ok);
    }
}

/* A handle after its destroy, a handle of another kind, an object whose
 * context went first: refused by status and message, nothing aborts. */
static void test_handles(void) {
    category = "handles";
    if (selected("plan_after_destroy")) {
        fi_plan *plan = make_plan();
        int ok = plan && fi_plan_update(plan, &fx.batch) == FI_OK;
        fi_plan_destroy(plan);
        if (ok) {
            ok &= expect(fi_plan_run(plan, &fx.args), FI_STATUS_INVALID_ARGUMENT, "fi_plan_run",
                         "not a live plan", END);
            ok &= expect(fi_plan_update(plan, &fx.batch), FI_STATUS_INVALID_ARGUMENT,
                         "fi_plan_update", "not a live plan", END);
            fi_plan_info info;
            fi_plan_info_init(&info);
            ok &= expect(fi_plan_get_info(plan, &info), FI_STATUS_INVALID_ARGUMENT,
                         "not a live plan", END);
            fi_plan_destroy(plan); /* twice: refused, nothing freed again */
            ok &= outputs_untouched();
        }
        record("plan_after_destroy", ok);
    }
    if (selected("cascade_after_destroy")) {
        fi_cascade *c = NULL;
        int ok = expect(fi_cascade_create(fx.ctx, &fx.params, 1, &fx.config, NULL, &c), FI_OK, END);
        fi_cascade_destroy(c);
        if (ok) {
            ok &= expect(fi_cascade_update(c, &fx.batch), FI_STATUS_INVALID_ARGUMENT,
                         "not a live cascade", END);
            ok &= expect(fi_cascade_run(c, &fx.args), FI_STATUS_INVALID_ARGUMENT,
                         "not a live cascade", END);
            fi_cascade_destroy(c);
        }
        record("cascade_after_destroy", ok);
    }
    if (selected("bsr_after_destroy")) {
        fi_bsr_config cfg = bsr_config(4, 4, 16, 16, 0);
        fi_attention_params p = bsr_params();
        fi_bsr *b = NULL;
        int ok = expect(fi_bsr_create(fx.ctx, &p, &cfg, &b), FI_OK, END);
        fi_bsr_destroy(b);
        if (ok) {
            int32_t indptr[5] = {0, 1, 1, 1, 1}, indices[1] = {0};
            ok &= expect(fi_bsr_update(b, 16, 16, indptr, indices, NULL),
                         FI_STATUS_INVALID_ARGUMENT, "not a live bsr", END);
            ok &= expect(fi_bsr_run(b, &fx.args), FI_STATUS_INVALID_ARGUMENT, "not a live bsr", END);
            fi_bsr_destroy(b);
        }
        record("bsr_after_destroy", ok);
    }
    if (selected("variant_destroyed_before_its_plan")) {
        /* a plan keeps its variant: destroyed by the user first, the plan
         * still runs; once the plan is gone the variant is too, and a
         * params struct naming it is refused */
        fi_variant_spec vs;
        fi_variant_spec_init(&vs);
        vs.name = "halved";
        vs.logits_transform = "return 0.5f * s;";
        fi_variant *v = NULL;
        int ok = expect(fi_variant_create(&vs, &v), FI_OK, END);
        fi_attention_params p = fx.params;
        p.variant = v;
        fi_plan *plan = NULL;
        ok = ok && expect(fi_plan_create(fx.ctx, &p, &fx.config, &plan), FI_OK, END);
        fi_variant_destroy(v);
        if (ok) {
            ok &= expect(fi_plan_update(plan, &fx.batch), FI_OK, END);
            ok &= expect(fi_plan_run(plan, &fx.args), FI_OK, END);
            fi_plan_destroy(plan);
            fi_plan *again = NULL;
            ok &= expect(fi_plan_create(fx.ctx, &p, &fx.config, &again),
                         FI_STATUS_INVALID_ARGUMENT, "not a live variant", END);
            ok &= fi_variant_get_spec(v) == NULL;
            fi_variant_destroy(v); /* twice: ignored */
        }
        record("variant_destroyed_before_its_plan", ok);
        tu_buf_poison(&fx.o);
        tu_buf_poison(&fx.lse);
    }
    if (selected("foreign_handle")) {
        /* a cascade passed where a plan is expected, and the reverse */
        fi_cascade *c = NULL;
        fi_plan *plan = make_plan();
        int ok = plan && expect(fi_cascade_create(fx.ctx, &fx.params, 1, &fx.config, NULL, &c),
                                FI_OK, END);
        if (ok) {
            ok &= expect(fi_plan_update((fi_plan *)(void *)c, &fx.batch),
                         FI_STATUS_INVALID_ARGUMENT, "not a live plan", END);
            ok &= expect(fi_cascade_run((fi_cascade *)(void *)plan, &fx.args),
                         FI_STATUS_INVALID_ARGUMENT, "not a live cascade", END);
            fi_tensor s = fx.lse.t;
            ok &= expect(fi_merge_state((fi_context *)(void *)plan, &fx.o.t, &s, &fx.o.t, &s,
                                        &fx.o.t, &s, NULL),
                         FI_STATUS_INVALID_ARGUMENT, "not a live ctx", END);
            ok &= outputs_untouched();
        }
        fi_cascade_destroy(c);
        fi_plan_destroy(plan);
        record("foreign_handle", ok);
    }
    if (selected("context_destroyed_first")) {
        /* A plan, a cascade and a bsr outlive their context: every call on
         * them and on the context is refused; their destroys still work and
         * the last one frees the context (LeakSanitizer checks it). */
        fi_context_options opt;
        fi_context_options_init(&opt);
        opt.num_threads = 1;
        fi_context *ctx = NULL;
        int ok = expect(fi_context_create(&opt, &ctx), FI_OK, END);
        fi_plan *plan = NULL;
        fi_cascade *c = NULL;
        fi_bsr *b = NULL;
        fi_bsr_config cfg = bsr_config(4, 4, 16, 16, 0);
        fi_attention_params bp = bsr_params();
        if (ok) {
            ok &= expect(fi_plan_create(ctx, &fx.params, &fx.config, &plan), FI_OK, END);
            ok &= expect(fi_plan_update(plan, &fx.batch), FI_OK, END);
            ok &= expect(fi_cascade_create(ctx, &fx.params, 1, &fx.config, NULL, &c), FI_OK, END);
            ok &= expect(fi_bsr_create(ctx, &bp, &cfg, &b), FI_OK, END);
        }
        if (ok) {
            fi_context_destroy(ctx);
            ok &= strstr(fi_last_error(), "still has") != NULL;
            if (!ok) tu_note("fi_context_destroy with 3 objects left: \"%s\"", fi_last_error());
            ok &= expect(fi_plan_run(plan, &fx.args), FI_STATUS_INVALID_ARGUMENT,
                         "fi_context_destroy", "destroy those first", END);
            ok &= expect(fi_plan_update(plan, &fx.batch), FI_STATUS_INVALID_ARGUMENT,
                         "was destroyed", END);
            ok &= expect(fi_cascade_update(c, &fx.batch), FI_STATUS_INVALID_ARGUMENT,
                         "was destroyed", END);
            int32_t indptr[5] = {0, 1, 1, 1, 1}, indices[1] = {0};
            ok &= expect(fi_bsr_update(b, 16, 16, indptr, indices, NULL),
                         FI_STATUS_INVALID_ARGUMENT, "was destroyed", END);
            fi_plan *p2 = NULL;
            ok &= expect(fi_plan_create(ctx, &fx.params, &fx.config, &p2),
                         FI_STATUS_INVALID_ARGUMENT, "was destroyed", END) && p2 == NULL;
            fi_tensor s = fx.lse.t;
            ok &= expect(fi_merge_state(ctx, &fx.q.t, &s, &fx.q.t, &s, &fx.o.t, &s, NULL),
                         FI_STATUS_INVALID_ARGUMENT, "was destroyed", END);
            fi_context_destroy(ctx); /* twice: refused */
            ok &= expect(FI_STATUS_INVALID_ARGUMENT, FI_STATUS_INVALID_ARGUMENT,
                         "destroyed already", END);
            ok &= outputs_untouched();
        } else {
            fi_context_destroy(ctx);
        }
        fi_plan_destroy(plan);
        fi_cascade_destroy(c);
        fi_bsr_destroy(b); /* the last one: frees the context */
        record("context_destroyed_first", ok);
    }
}

/* A device page table (fi_plan_config.device_page_table) is host memory on
 * the CPU and may be rewritten between runs: every run checks it, and a host
 * table as well (the CPU's kernels read either one in place). */
static void test_page_table(void) {
    category = "page_table";
    for (int device = 1; device >= 0; device--) {
        const char *name = device ? "device_table_rewritten" : "host_table_rewritten";
        if (!selected(name)) continue;
        fx.config.device_page_table = device;
        fi_plan *plan = make_plan();
        int ok = plan && expect(fi_plan_update(plan, &fx.batch), FI_OK, END) &&
                 expect(fi_plan_run(plan, &fx.args), FI_OK, END);
        tu_buf_poison(&fx.o);
        tu_buf_poison(&fx.lse);
        if (ok) {
            /* past the cache: the K buffer ends at a guard page */
            arr(&fx.kv_indices)[1] = 1000;
            ok &= expect(fi_plan_run(plan, &fx.args), FI_STATUS_INVALID_ARGUMENT,
                         "kv_indices[1]=1000", END) && outputs_untouched();
            arr(&fx.kv_indices)[1] = -3;
            ok &= expect(fi_plan_run(plan, &fx.args), FI_STATUS_INVALID_ARGUMENT,
                         "kv_indices[1]=-3", END) && outputs_untouched();
            arr(&fx.kv_indices)[1] = 3; /* a valid page again: runs */
            ok &= expect(fi_plan_run(plan, &fx.args), FI_OK, END);
        }
        fi_plan_destroy(plan);
        record(name, ok);
    }
}

/* RoPE at positions 0 .. TOTAL_Q - 1 with the default params. */
static fi_status rope_pos(const fi_tensor *q, const fi_tensor *k, fi_tensor *q_out,
                          fi_tensor *k_out) {
    int32_t pos[TOTAL_Q] = {0, 1, 2, 3};
    int64_t n = TOTAL_Q;
    fi_tensor pos_ids = fi_tensor_contiguous(pos, FI_DTYPE_I32, 1, &n);
    fi_rope_params rp;
    fi_rope_params_init(&rp);
    return fi_rope_apply_pos_ids(fx.ctx, &rp, q, k, q_out, k_out, &pos_ids, NULL);
}

/* Outputs that share memory with an input or with themselves. */
static void test_overlap(void) {
    category = "overlap";
    if (selected("o_rows_stride0")) {
        fx.args.o.stride[0] = 0;
        RUN_FAILS("o_rows_stride0", FI_STATUS_INVALID_ARGUMENT, "o.stride[0]=0", "share");
    }
    if (selected("o_rows_stride1")) {
        fx.args.o.stride[0] = 1;
        RUN_FAILS("o_rows_stride1", FI_STATUS_INVALID_ARGUMENT, "o.stride[0]=1", "share");
    }
    if (selected("o_in_k_cache")) {
        /* o laid over the K cache (which is larger than o) */
        fx.args.o.data = fx.k.base;
        int ok = 1;
        tu_buf_poison(&fx.k);
        RUN_FAILS("o_in_k_cache", FI_STATUS_INVALID_ARGUMENT, "o (data", "overlaps k");
        const uint8_t *kb = fx.k.base;
        for (size_t i = 0; i < fx.k.bytes && ok; i++) ok = kb[i] == 0xFF;
        if (!ok) tu_note("the refused run wrote the K cache");
    }
    if (selected("lse_in_o")) {
        fx.args.lse.data = fx.o.base;
        RUN_FAILS("lse_in_o", FI_STATUS_INVALID_ARGUMENT, "o (data", "overlaps lse");
    }
    if (selected("o_over_q_offset")) {
        /* o one token into q: not the same view, rows overlap */
        tensor(&fx.q, FI_DTYPE_F32, 3, (int64_t[]){TOTAL_Q + 1, HQ, D});
        fx.args.q = fx.q.t;
        fx.args.q.shape[0] = TOTAL_Q;
        fx.args.o = fx.args.q;
        fx.args.o.data = (float *)fx.q.base + HQ * D;
        RUN_FAILS("o_over_q_offset", FI_STATUS_INVALID_ARGUMENT, "overlaps q");
    }
    if (selected("merge_out_one_row_in")) {
        /* v_out = v_a moved by one row: the old check compared pointers only */
        int64_t vs[3] = {3, HQ, D}, ss[2] = {3, HQ};
        fi_tensor va = fi_tensor_contiguous(fx.q.base, FI_DTYPE_F32, 3, vs);
        fi_tensor vo = fi_tensor_contiguous((float *)fx.q.base + HQ * D, FI_DTYPE_F32, 3, vs);
        fi_tensor vb = fi_tensor_contiguous(fx.o.base, FI_DTYPE_F32, 3, vs);
        fi_tensor sa = fi_tensor_contiguous(fx.lse.base, FI_DTYPE_F32, 2, ss);
        float sb_[3 * HQ], so_[3 * HQ];
        fi_tensor sb = fi_tensor_contiguous(sb_, FI_DTYPE_F32, 2, ss);
        fi_tensor so = fi_tensor_contiguous(so_, FI_DTYPE_F32, 2, ss);
        uint64_t before = 0;
        for (size_t i = 0; i < fx.q.bytes; i++) before = before * 31 + ((uint8_t *)fx.q.base)[i];
        int ok = expect(fi_merge_state(fx.ctx, &va, &sa, &vb, &sb, &vo, &so, NULL),
                        FI_STATUS_INVALID_ARGUMENT, "v_out", "overlaps v_a", END);
        ok &= expect(fi_merge_state_in_place(fx.ctx, &vo, &so, &va, &sa, NULL, NULL),
                     FI_STATUS_INVALID_ARGUMENT, "overlaps v_other", END);
        uint64_t after = 0;
        for (size_t i = 0; i < fx.q.bytes; i++) after = after * 31 + ((uint8_t *)fx.q.base)[i];
        if (before != after) { tu_note("a refused merge wrote its input"); ok = 0; }
        record("merge_out_one_row_in", ok);
    }
    if (selected("merge_states_out_in_s")) {
        int64_t vs[4] = {2, 2, HQ, D}, ss[3] = {2, 2, HQ}, os[3] = {2, HQ, D}, ls[2] = {2, HQ};
        fi_tensor v = fi_tensor_contiguous(fx.q.base, FI_DTYPE_F32, 4, vs);
        fi_tensor s = fi_tensor_contiguous(fx.lse.base, FI_DTYPE_F32, 3, ss);
        fi_tensor vo = fi_tensor_contiguous(fx.o.base, FI_DTYPE_F32, 3, os);
        fi_tensor so = fi_tensor_contiguous((float *)fx.lse.base + HQ, FI_DTYPE_F32, 2, ls);
        record("merge_states_out_in_s",
               expect(fi_merge_states(fx.ctx, &v, &s, &vo, &so, NULL), FI_STATUS_INVALID_ARGUMENT,
                      "s_out", "overlaps s", END));
    }
    if (selected("rope_q_out_over_k")) {
        /* q_out written over k (not in place: another tensor) */
        int64_t qs[3] = {TOTAL_Q, HQ, D}, ks[3] = {TOTAL_Q, HKV, D};
        fi_tensor q = fi_tensor_contiguous(fx.q.base, FI_DTYPE_F32, 3, qs);
        fi_tensor k = fi_tensor_contiguous(fx.o.base, FI_DTYPE_F32, 3, ks);
        fi_tensor q_out = fi_tensor_contiguous(fx.o.base, FI_DTYPE_F32, 3, qs);
        record("rope_q_out_over_k", expect(rope_pos(&q, &k, &q_out, &k), FI_STATUS_INVALID_ARGUMENT,
                                           "q_out", "overlaps k", END));
    }
    if (selected("rope_fused_qkv_in_place")) {
        /* q and k interleaved in one [tokens, HQ + 2 HKV, D] buffer, rotated
         * in place: views of one buffer that share no element are fine */
        int64_t all[3] = {TOTAL_Q, HQ + 2 * HKV, D};
        tu_buf qkv;
        memset(&qkv, 0, sizeof qkv);
        tu_buf_alloc(&qkv, FI_DTYPE_F32, 3, all);
        tu_rng rng;
        tu_rng_seed(&rng, 7);
        tu_fill_uniform(&rng, &qkv.t, -1, 1, 0);
        fi_tensor q = qkv.t, k = qkv.t;
        q.shape[1] = HQ;
        k.shape[1] = HKV;
        k.data = (float *)qkv.base + HQ * D;
        record("rope_fused_qkv_in_place", expect(rope_pos(&q, &k, &q, &k), FI_OK, END));
        tu_buf_free(&qkv);
    }
    if (selected("append_cache_over_rows")) {
        /* the appended rows inside the cache they are written to */
        int64_t rs[3] = {1, HKV, D};
        fi_tensor rows = fi_tensor_contiguous(fx.k.base, FI_DTYPE_F32, 3, rs);
        int32_t bi[1] = {0}, pos[1] = {0};
        int64_t one = 1;
        fi_tensor bt = fi_tensor_contiguous(bi, FI_DTYPE_I32, 1, &one);
        fi_tensor pt = fi_tensor_contiguous(pos, FI_DTYPE_I32, 1, &one);
        int64_t three = 3, nb = B + 1, b2 = B;
        fi_tensor idx = fi_tensor_contiguous(arr(&fx.kv_indices), FI_DTYPE_I32, 1, &three);
        fi_tensor ip = fi_tensor_contiguous(arr(&fx.kv_indptr), FI_DTYPE_I32, 1, &nb);
        fi_tensor lp = fi_tensor_contiguous(arr(&fx.last), FI_DTYPE_I32, 1, &b2);
        record("append_cache_over_rows",
               expect(fi_append_paged_kv_cache(fx.ctx, &rows, &rows, &bt, &pt, &fx.k.t, &fx.v.t,
                                               FI_KV_LAYOUT_NHD, &idx, &ip, &lp, NULL),
                      FI_STATUS_INVALID_ARGUMENT, "k_cache", "overlaps append_k", END));
    }
    if (selected("cascade_o_in_workspace")) {
        /* o inside the workspace the caller gave the cascade */
        fi_plan_config cfg[2] = {fx.config, fx.config};
        fi_cascade_options co;
        fi_cascade_options_init(&co);
        co.workspace_bytes = fi_cascade_workspace_size(&fx.params, 2, TOTAL_Q);
        tu_buf ws;
        memset(&ws, 0, sizeof ws);
        tu_buf_alloc_tail(&ws, co.workspace_bytes + 64 * 1024, 64);
        co.workspace = ws.base;
        fi_cascade *c = NULL;
        int ok = expect(fi_cascade_create(fx.ctx, &fx.params, 2, cfg, &co, &c), FI_OK, END);
        int32_t zero_kv[B + 1] = {0, 0, 0};
        fi_batch lv[2] = {fx.batch, fx.batch};
        lv[0].kv_indptr = zero_kv; /* level 0: no shared pages */
        if (ok) ok = expect(fi_cascade_update(c, lv), FI_OK, END);
        if (ok) {
            fi_run_args a = fx.args;
            a.o.data = (char *)ws.base + 64;
            ok = expect(fi_cascade_run(c, &a), FI_STATUS_INVALID_ARGUMENT, "o (data",
                        "the cascade's workspace", END);
            ok &= expect(fi_cascade_run(c, &fx.args), FI_OK, END);
        }
        fi_cascade_destroy(c);
        tu_buf_free(&ws);
        record("cascade_o_in_workspace", ok);
    }
    if (selected("bsr_o_over_q")) {
        fi_bsr_config cfg = bsr_config(2, 2, TOTAL_Q, 8, 0);
        fi_attention_params p = bsr_params();
        fi_bsr *b = NULL;
        int ok = expect(fi_bsr_create(fx.ctx, &p, &cfg, &b), FI_OK, END);
        int32_t indptr[3] = {0, 1, 2}, indices[2] = {0, 1};
        if (ok) ok = expect(fi_bsr_update(b, TOTAL_Q, 8, indptr, indices, NULL), FI_OK, END);
        if (ok) {
            int64_t kshape[3] = {8, HKV, D};
            fi_run_args a = fx.args;
            a.k = fi_tensor_contiguous(fx.k.base, FI_DTYPE_F32, 3, kshape);
            a.v = fi_tensor_contiguous(fx.v.base, FI_DTYPE_F32, 3, kshape);
            a.o = a.q;
            ok = expect(fi_bsr_run(b, &a), FI_STATUS_INVALID_ARGUMENT, "overlaps q", END);
        }
        fi_bsr_destroy(b);
        record("bsr_o_over_q", ok);
    }
}

int main(int argc, char **argv) {
    int rc = tu_parse_args(argc, argv,
                           "Bad input: status and message for every class, nothing touched.\n"
                           "Case names: bad_input/<class>/<case>.");
    if (rc) return rc;
    fi_context_options opt;
    fi_context_options_init(&opt);
    opt.num_threads = 2;
    fi_status st = fi_context_create(&opt, &fx.ctx);
    if (st != FI_OK) {
        printf("FAIL cannot create a CPU context: %s: %s\n", fi_status_string(st), fi_last_error());
        return 1;
    }
    fixture_reset();
    test_indptr();
    test_pages();
    test_params();
    test_null();
    test_buffers();
    test_alignment();
    test_bounds();
    test_lifecycle();
    test_device();
    test_overflow();
    test_handles();
    test_page_table();
    test_overlap();
    fixture_free();
    if (tu_opt.list) return 0;
    return tu_summary("test_bad_input");
}
