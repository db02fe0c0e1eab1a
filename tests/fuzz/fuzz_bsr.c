/*
 * fuzz_bsr.c — block-sparse attention from arbitrary bytes: fixed R x C
 * blocks (R, C up to 2^20, with and without an element mask) and variable
 * blocks per KV head, bounds up to INT32_MAX, patterns some invalid
 * (columns out of range or out of order, sizes that do not sum, bounds);
 * a run that succeeds is checked against the oracle on the equivalent
 * dense custom mask (ragged K/V, one request; per KV head for variable
 * blocks).
 */
#include "fuzz.h"
#include "../oracle.h"

#define MAX_M 48
#define MAX_N 64

/* The oracle for query rows [0, M) of heads [h0, h0 + hq) against KV head
 * hk over N keys with mask bits[i * N + j], compared with the library's. */
static void check_heads(const fi_attention_params *p, const fi_run_args *a, int32_t M, int32_t N,
                        int32_t h0, int32_t hq, int32_t hk, const uint8_t *bits, const char *what) {
    fi_attention_params q = *p;
    q.num_qo_heads = hq, q.num_kv_heads = 1;
    q.kv_format = FI_KV_FORMAT_RAGGED, q.kv_layout = FI_KV_LAYOUT_NHD;
    q.mask_mode = FI_MASK_CUSTOM, q.alibi_slopes = NULL;
    fi_tensor tq = a->q, tk = a->k, tv = a->v, to = a->o, tl = a->lse;
    size_t qe = fi_dtype_size(tq.dtype), ke = fi_dtype_size(tk.dtype), oe = fi_dtype_size(to.dtype);
    tq.data = (char *)tq.data + (size_t)h0 * (size_t)tq.stride[1] * qe, tq.shape[1] = hq, tq.shape[0] = M;
    to.data = (char *)to.data + (size_t)h0 * (size_t)to.stride[1] * oe, to.shape[1] = hq, to.shape[0] = M;
    tl.data = (float *)tl.data + (size_t)h0 * (size_t)tl.stride[1], tl.shape[1] = hq, tl.shape[0] = M;
    tk.data = (char *)tk.data + (size_t)hk * (size_t)tk.stride[1] * ke, tk.shape[1] = 1, tk.shape[0] = N;
    tv.data = (char *)tv.data + (size_t)hk * (size_t)tv.stride[1] * ke, tv.shape[1] = 1, tv.shape[0] = N;
    int32_t qo[2] = {0, M}, kv[2] = {0, N};
    fi_batch b = {1, qo, kv, NULL, NULL, NULL};
    int64_t no = (int64_t)M * hq * p->head_dim_vo, nl = (int64_t)M * hq;
    double *ro = malloc(sizeof(double) * (size_t)(no + 1)), *rl = malloc(sizeof(double) * (size_t)(nl + 1));
    oracle_attention(&q, &b, &tq, &tk, &tv, bits, ro, rl);
    double *go = tu_view_read(&to), *gl = tu_view_read(&tl);
    fz_compare(what, go, ro, no, fz_tol(p->q_dtype, p->kv_dtype, p->o_dtype));
    fz_compare(what, gl, rl, nl, 1e-3);
    free(ro), free(rl), free(go), free(gl);
}

static void set_bit(uint8_t *bits, int64_t i) { bits[i >> 3] |= (uint8_t)(1u << (i & 7)); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size};
    fi_attention_params p;
    float slopes[16];
    fi_context *ctx = fz_attention(&f, &p, slopes);
    if (!fz_one_in(&f, 8)) p.mask_mode = FI_MASK_NONE, p.window_left = -1, p.pos_encoding = FI_POS_NONE;
    fi_bsr_config c;
    fi_bsr_config_init(&c);
    int huge = fz_one_in(&f, 4);
    c.block_rows = huge ? (int32_t)fz_range(&f, 1, 1 << 20) : (int32_t)fz_range(&f, 1, 8);
    c.block_cols = huge ? (int32_t)fz_range(&f, 1, 1 << 20) : (int32_t)fz_range(&f, 1, 8);
    c.max_qo_len = fz_bound(&f, MAX_M);
    c.max_kv_len = fz_bound(&f, MAX_N);
    c.max_nnz = fz_one_in(&f, 2) ? fz_bound(&f, 64) : 0;
    c.element_mask = fz_one_in(&f, 3);
    c.variable_blocks = fz_one_in(&f, 3);
    if (c.variable_blocks) c.element_mask = fz_one_in(&f, 16);
    c.max_block_rows = c.variable_blocks && fz_one_in(&f, 2) ? fz_bound(&f, 16) : 0;
    c.col_granularity = c.variable_blocks ? (int32_t)fz_range(&f, fz_one_in(&f, 16) ? -1 : 1, 4) : 1;
    c.num_workers = fz_one_in(&f, 3) ? (int32_t)fz_range(&f, 0, 5) : 0;
    fi_bsr *b = NULL;
    fi_status st = fi_bsr_create(ctx, &p, &c, &b);
    fz_check_status(st, "fi_bsr_create");
    if (st) return 0;
    tu_rng rng;
    tu_rng_seed(&rng, fz_u32(&f));
    int32_t M = (int32_t)fz_range(&f, 0, MAX_M), N = (int32_t)fz_range(&f, 0, MAX_N);
    int32_t H = p.num_qo_heads, Hk = p.num_kv_heads, group = H / Hk;
    int64_t qs[3] = {M, H, p.head_dim_qk}, ks[3] = {N, Hk, p.head_dim_qk};
    int64_t vs[3] = {N, Hk, p.head_dim_vo}, os[3] = {M, H, p.head_dim_vo}, ls[2] = {M, H};
    tu_buf q, k, v, o, l;
    int bad_alloc = fz_tensor(&q, p.q_dtype, 3, qs, &rng, 2.0) | fz_tensor(&k, p.kv_dtype, 3, ks, &rng, 2.0) |
                    fz_tensor(&v, p.kv_dtype, 3, vs, &rng, 1.0) | fz_tensor(&o, p.o_dtype, 3, os, &rng, 1.0) |
                    fz_tensor(&l, FI_DTYPE_F32, 2, ls, &rng, 1.0);
    fi_run_args a;
    memset(&a, 0, sizeof a);
    a.q = q.t, a.k = k.t, a.v = v.t, a.o = o.t, a.lse = l.t;
    /* the dense mask per KV head: bits [Hk][M * N] */
    size_t mbytes = ((size_t)M * (size_t)N + 7) / 8 + 1;
    uint8_t *bits = calloc((size_t)Hk * mbytes + 1, 1);
    int valid = !bad_alloc && bits;
    /* fixed blocks: the block columns are referenced until the run, as a
     * page table is (fi_bsr_update) */
    static int32_t indptr[MAX_M + 2], indices[MAX_M * MAX_N + 1];
    memset(indptr, 0, sizeof indptr);
    if (valid && !c.variable_blocks) {
        int32_t R = c.block_rows, C = c.block_cols;
        int32_t mb = M ? (M - 1) / R + 1 : 0, nb = N ? (N - 1) / C + 1 : 0;
        uint8_t *em = NULL;
        for (int32_t r = 0; r < mb && r <= MAX_M; r++) {
            int32_t n = 0;
            for (int32_t col = 0; col < nb && indptr[r] + n < MAX_M * MAX_N; col++)
                if (fz_one_in(&f, 2)) indices[indptr[r] + n++] = col;
            if (n > 1 && fz_one_in(&f, 32)) indices[indptr[r]] = indices[indptr[r] + 1]; /* out of order */
            if (n && fz_one_in(&f, 32)) indices[indptr[r] + n - 1] = nb + (int32_t)fz_range(&f, 0, 3);
            indptr[r + 1] = indptr[r] + n;
        }
        int32_t nnz = indptr[mb];
        /* an element mask [nnz, R, C], or NULL (full blocks) */
        if (c.element_mask && !fz_one_in(&f, 4) && (int64_t)nnz * R * C <= (1 << 20)) {
            em = malloc((size_t)nnz * (size_t)R * (size_t)C + 1);
            for (int64_t i = 0; em && i < (int64_t)nnz * R * C; i++) em[i] = fz_one_in(&f, 3) ? 0 : 1;
        }
        if (valid) {
            st = fi_bsr_update(b, M, N, indptr, indices, em);
            fz_check_status(st, "fi_bsr_update");
            valid = st == FI_OK;
        }
        for (int32_t r = 0; valid && r < mb; r++)
            for (int32_t j = indptr[r]; j < indptr[r + 1]; j++)
                for (int32_t i = r * R; i < M && i < (r + 1) * R; i++)
                    for (int32_t key = indices[j] * C; key < N && key < (indices[j] + 1) * C; key++)
                        if (!em || em[((int64_t)j * R + (i - r * R)) * C + (key - indices[j] * C)])
                            for (int32_t h = 0; h < Hk; h++)
                                set_bit(bits + (size_t)h * mbytes, (int64_t)i * N + key);
        free(em);
    } else if (valid) {
        int32_t MB = (int32_t)fz_range(&f, 0, 6), NB = (int32_t)fz_range(&f, 0, 6), g = c.col_granularity;
        int32_t *rs = calloc((size_t)(Hk * MB + 1), 4), *cs = calloc((size_t)(Hk * NB + 1), 4);
        uint8_t *map = calloc((size_t)(Hk * MB * NB + 1), 1);
        for (int32_t h = 0; h < Hk; h++) { /* sizes summing to M and N, mostly */
            int32_t left = M;
            for (int32_t r = 0; r < MB; r++) {
                int32_t v0 = r == MB - 1 ? left : (int32_t)fz_range(&f, 0, left);
                rs[h * MB + r] = v0, left -= v0;
            }
            left = g > 0 ? N / g : 0;
            for (int32_t j = 0; j < NB; j++) {
                int32_t v0 = j == NB - 1 ? left : (int32_t)fz_range(&f, 0, left);
                cs[h * NB + j] = v0 * (g > 0 ? g : 1), left -= v0;
            }
            for (int32_t i = 0; i < MB * NB; i++) map[h * MB * NB + i] = (uint8_t)fz_one_in(&f, 2);
        }
        if (fz_one_in(&f, 16) && Hk * MB > 0) rs[0] += 1; /* does not sum */
        st = fi_bsr_update_variable(b, M, N, MB, NB, rs, cs, map);
        fz_check_status(st, "fi_bsr_update_variable");
        valid = st == FI_OK;
        for (int32_t h = 0; valid && h < Hk; h++)
            for (int32_t r = 0, i0 = 0; r < MB; i0 += rs[h * MB + r], r++)
                for (int32_t j = 0, k0 = 0; j < NB; k0 += cs[h * NB + j], j++)
                    if (map[(h * MB + r) * NB + j])
                        for (int32_t i = i0; i < i0 + rs[h * MB + r]; i++)
                            for (int32_t key = k0; key < k0 + cs[h * NB + j]; key++)
                                set_bit(bits + (size_t)h * mbytes, (int64_t)i * N + key);
        free(rs), free(cs), free(map);
    }
    if (valid) {
        if (fz_one_in(&f, 8)) a.o.data = a.q.data; /* refused: overlaps q */
        st = fi_bsr_run(b, &a);
        fz_check_status(st, "fi_bsr_run");
        if (st == FI_OK && a.o.data != a.q.data && fz_checkable(&p) && p.mask_mode == FI_MASK_NONE &&
            p.window_left < 0 && p.pos_encoding == FI_POS_NONE)
            for (int32_t h = 0; h < Hk; h++)
                check_heads(&p, &a, M, N, h * group, group, h, bits + (size_t)h * mbytes, "fi_bsr_run");
    }
    free(bits);
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&v), tu_buf_free(&o), tu_buf_free(&l);
    fi_bsr_destroy(b);
    return 0;
}
