/*
 * aot_set.c — the kernel configurations compiled ahead of time by nvcc
 * (`make aot`, AOT=1) into the library's table of cubins (src/cuda/aot.c):
 * the common serving ones. Everything else is compiled by NVRTC on first
 * use. Shape of the set: {bf16, f16} (Q = KV = O) x head dim {128, 64} x
 * GQA group {1, 4, 8} x {paged, ragged} x {no mask, causal}, each as the
 * CUDA-core kernel and the separate tensor-core kernel (on sm_90a the
 * Hopper kernel, attention_wg.cuh), plus the merge kernel of each
 * dtype and head dim, and the persistent kernel (kernels/persistent.cuh:
 * what a plan runs by default; the separate kernels serve
 * prefill-only runs and user variants), its decode form (what
 * decode batches run) and its 64-row tensor-core block form (plans of 17 to
 * 64 packed rows: a cascade's shared level): 2 x 2 x 3 x 2 x 2 x 5; and for
 * plans with a device page table (fi_plan_config.device_page_table: the
 * Python layer's, kernels that clamp page ids) the persistent kernel and its
 * decode form of each paged configuration, 2 x 2 x 3 x 2 x 2; plus the
 * merge kernels, 2 x 2; and head dim 256's decode form (decode version 3's
 * split-O form, what its decode batches run), paged and with a device page
 * table, with its merge kernels: 2 x 3 x 2 x 2 + 2: 318 kernels (a d 256
 * plan's other kernels are compiled on first use).
 */
#include "cuda/cuda_backend.h"

#include <string.h>

enum { N_DT = 2, N_DIM = 2, N_GROUP = 3, N_FMT = 2, N_MASK = 2 };
enum { N_ATTN = N_DT * N_DIM * N_GROUP * N_FMT * N_MASK };
enum { N_DTABLE = N_ATTN / N_FMT }; /* the paged configurations */
enum { N_D256 = N_DT * N_GROUP * N_MASK * 2 }; /* d 256 decode forms: paged, device table */

static const int aot_dtypes[N_DT] = {FI_DTYPE_BF16, FI_DTYPE_F16};
static const int aot_dims[N_DIM] = {128, 64};
static const int aot_groups[N_GROUP] = {1, 4, 8};

int fi_cuda_aot_set_count(void) { return 5 * N_ATTN + 2 * N_DTABLE + N_DT * N_DIM + N_D256 + N_DT; }

/* The i-th configuration's attention config (i < N_ATTN). */
static void attn_config_at(int i, fi_attn_config *c) {
    memset(c, 0, sizeof *c);
    int mask = i % N_MASK, fmt = (i / N_MASK) % N_FMT;
    int g = (i / (N_MASK * N_FMT)) % N_GROUP, dim = (i / (N_MASK * N_FMT * N_GROUP)) % N_DIM;
    int dt = i / (N_MASK * N_FMT * N_GROUP * N_DIM);
    c->dqk = c->dvo = aot_dims[dim];
    c->qt = c->kvt = c->ot = aot_dtypes[dt];
    c->group = aot_groups[g];
    c->rows = c->group < 8 ? c->group : 8; /* as fi_cuda_attn_config */
    c->paged = fmt == 0 ? FI_CUDA_KV_PAGED : FI_CUDA_KV_RAGGED;
    c->mask = (fi_mask_mode)mask;
}

/* The i-th configuration's form f, as a plan with at most max_rows packed
 * rows selects it on sm_90a under the default settings (the AOT set does not
 * follow the environment: a plan whose settings select other kernels finds
 * no match in the table and JIT-compiles them). */
static void selected_form(const fi_attn_config *c, int64_t max_rows, fi_cuda_form f,
                         fi_kernel_spec *s) {
    const fi_cuda_tuning defaults = {.use_aot = true, .pdl = true, .wgmma = true};
    fi_cuda_selection sel;
    fi_cuda_select(c, max_rows, &defaults, &sel);
    *s = sel.spec[f];
}

void fi_cuda_aot_set_spec(int i, fi_kernel_spec *s) {
    fi_attn_config c;
    if (i < N_ATTN) {
        attn_config_at(i, &c);
        fi_cuda_attn_spec(&c, s);
    } else if (i < 2 * N_ATTN) {
        attn_config_at(i - N_ATTN, &c);
        selected_form(&c, INT32_MAX, FI_CUDA_FORM_ATTN_TC, s);
    } else if (i < 3 * N_ATTN) {
        attn_config_at(i - 2 * N_ATTN, &c);
        selected_form(&c, INT32_MAX, FI_CUDA_FORM_PERSIST, s);
    } else if (i < 4 * N_ATTN) { /* every configuration here has a decode form */
        attn_config_at(i - 3 * N_ATTN, &c);
        selected_form(&c, INT32_MAX, FI_CUDA_FORM_PERSIST_DECODE, s);
    } else if (i < 5 * N_ATTN) { /* and a tensor-core path: 64-row blocks */
        attn_config_at(i - 4 * N_ATTN, &c);
        selected_form(&c, 64, FI_CUDA_FORM_PERSIST, s);
    } else if (i < 5 * N_ATTN + 2 * N_DTABLE) { /* device page tables */
        int k = i - 5 * N_ATTN, j = k % N_DTABLE;
        attn_config_at(j % N_MASK + j / N_MASK * N_MASK * N_FMT, &c); /* fmt 0: paged */
        c.paged = FI_CUDA_KV_DEVICE_TABLE;
        selected_form(&c, INT32_MAX,
                     k < N_DTABLE ? FI_CUDA_FORM_PERSIST : FI_CUDA_FORM_PERSIST_DECODE, s);
    } else if (i < 5 * N_ATTN + 2 * N_DTABLE + N_DT * N_DIM) {
        int k = i - 5 * N_ATTN - 2 * N_DTABLE;
        fi_cuda_merge_spec(aot_dims[k % N_DIM], aot_dtypes[k / N_DIM], s);
    } else if (i < 5 * N_ATTN + 2 * N_DTABLE + N_DT * N_DIM + N_D256) {
        int k = i - 5 * N_ATTN - 2 * N_DTABLE - N_DT * N_DIM;
        const int mask = k / 2 % N_MASK, g = k / (2 * N_MASK) % N_GROUP, dt = k / (2 * N_MASK * N_GROUP);
        /* the paged (fmt 0) configuration of dtype dt, dim 0, group g, at d 256 */
        attn_config_at(mask + N_MASK * N_FMT * (g + N_GROUP * N_DIM * dt), &c);
        c.dqk = c.dvo = 256;
        if (k % 2) c.paged = FI_CUDA_KV_DEVICE_TABLE;
        selected_form(&c, INT32_MAX, FI_CUDA_FORM_PERSIST_DECODE, s);
    } else {
        int k = i - 5 * N_ATTN - 2 * N_DTABLE - N_DT * N_DIM - N_D256;
        fi_cuda_merge_spec(256, aot_dtypes[k], s);
    }
}
