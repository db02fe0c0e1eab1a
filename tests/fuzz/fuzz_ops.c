/*
 * fuzz_ops.c — the standalone ops from arbitrary bytes: fi_merge_state,
 * fi_merge_state_in_place, fi_merge_states (LSE finite, -inf, +inf, NaN),
 * fi_append_paged_kv_cache (page tables and token slots some out of range)
 * and fi_rope_apply / fi_rope_apply_pos_ids (rotary dims, interleave,
 * LLaMA-3.1), outputs the same view as an input, overlapping one, or
 * apart; results of a call that succeeds against tests/oracle_ops.c.
 */
#include "fuzz.h"
#include "../ops_cases.h"
#include "../oracle_ops.h"

static const fi_dtype float_dt[3] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16};

static double out_tol(fi_dtype d) {
    return d == FI_DTYPE_F16 ? 2e-3 : d == FI_DTYPE_BF16 ? 2e-2 : 2e-5;
}

/* An LSE: mostly finite, sometimes -inf, +inf or NaN. */
static double lse_value(fz *f) {
    switch (fz_pick(f, 12)) {
    case 0: return -INFINITY;
    case 1: return INFINITY;
    case 2: return NAN;
    case 3: return (double)fz_range(f, -400, 0); /* weights that underflow */
    default: return (double)fz_range(f, -2000, 2000) / 100.0;
    }
}

static void fuzz_merge(fz *f, fi_context *ctx, tu_rng *rng) {
    int mode = fz_pick(f, 3); /* merge_state, in place, merge_states */
    int64_t n = fz_range(f, 0, 6), H = fz_range(f, 1, 3), D = fz_range(f, 1, 70);
    int64_t S = mode == 2 ? fz_range(f, 0, 4) : 2;
    fi_dtype dv = float_dt[fz_pick(f, 3)], dout = float_dt[fz_pick(f, 3)];
    int64_t vs[4] = {n, S, H, D}, ss[3] = {n, S, H}, v3[3] = {n, H, D}, s2[2] = {n, H};
    tu_buf b[6]; /* merge_states: v, s; else v_a, s_a, v_b, s_b; then v_out, s_out */
    memset(b, 0, sizeof b);
    enum { VA, SA, VB, SB, VO, SO };
    int fail = mode == 2 ? fz_tensor(&b[VA], dv, 4, vs, rng, 2.0) || fz_tensor(&b[SA], FI_DTYPE_F32, 3, ss, rng, 1.0)
                         : fz_tensor(&b[VA], dv, 3, v3, rng, 2.0) || fz_tensor(&b[SA], FI_DTYPE_F32, 2, s2, rng, 1.0) ||
                               fz_tensor(&b[VB], float_dt[fz_pick(f, 3)], 3, v3, rng, 2.0) ||
                               fz_tensor(&b[SB], FI_DTYPE_F32, 2, s2, rng, 1.0);
    fail = fail || fz_tensor(&b[VO], dout, 3, v3, rng, 1.0) || fz_tensor(&b[SO], FI_DTYPE_F32, 2, s2, rng, 1.0);
    double *ro = malloc(sizeof(double) * (size_t)(n * H * D + 1)), *rl = malloc(sizeof(double) * (size_t)(n * H + 1));
    fi_status st = FI_OK;
    int overlap = fz_one_in(f, 6), checked = 0;
    const fi_tensor *out_v = &b[VO].t, *out_s = &b[SO].t;
    if (!fail) {
        for (int64_t i = 0; i < tu_numel(&b[SA].t); i++) tu_view_set(&b[SA].t, i, lse_value(f));
        for (int64_t i = 0; mode != 2 && i < tu_numel(&b[SB].t); i++) tu_view_set(&b[SB].t, i, lse_value(f));
        double *x = tu_view_read(&b[VA].t), *l = tu_view_read(&b[SA].t);
        if (mode == 2) {
            oracle_merge_states(n, S, H, D, x, l, ro, rl);
            fi_tensor out = b[VO].t;
            overlap = overlap && S > 0; /* with no state, v has no memory to lay it on */
            if (overlap) { /* v_out laid over state 0 of v */
                out = b[VA].t, out.ndim = 3, out.shape[1] = H, out.shape[2] = D;
                out.stride[1] = b[VA].t.stride[2], out.stride[2] = b[VA].t.stride[3];
                out.dtype = dv;
            }
            st = fi_merge_states(ctx, &b[VA].t, &b[SA].t, &out, &b[SO].t, NULL);
            fz_check_status(st, "fi_merge_states");
            if (overlap && st == FI_OK && n > 0) FZ_FAIL("fi_merge_states wrote into its input");
            checked = !overlap;
        } else {
            double *y = tu_view_read(&b[VB].t), *lb = tu_view_read(&b[SB].t);
            oracle_merge_state(n, H, D, x, l, y, lb, ro, rl);
            free(y), free(lb);
            if (mode == 1) {
                fi_tensor other = overlap ? b[VA].t : b[VB].t;
                st = fi_merge_state_in_place(ctx, &b[VA].t, &b[SA].t, &other, &b[SB].t, NULL, NULL);
                fz_check_status(st, "fi_merge_state_in_place");
                if (overlap && st == FI_OK && n > 0) FZ_FAIL("in place with v_other = v was accepted");
                out_v = &b[VA].t, out_s = &b[SA].t, checked = !overlap;
            } else {
                int same = fz_one_in(f, 4); /* v_out is v_a, the very same view: in place */
                fi_tensor out = same ? b[VA].t : b[VO].t, sout = same ? b[SA].t : b[SO].t;
                int over = overlap && n > 1;
                if (over) { /* v_out one row into v_b */
                    out = b[VB].t, out.shape[0] = n - 1;
                    out.data = (char *)b[VB].t.data + b[VB].t.stride[0] * (int64_t)fi_dtype_size(b[VB].t.dtype);
                    sout = b[SO].t, sout.shape[0] = n - 1;
                }
                st = fi_merge_state(ctx, &b[VA].t, &b[SA].t, &b[VB].t, &b[SB].t, &out, &sout, NULL);
                fz_check_status(st, "fi_merge_state");
                if (over && st == FI_OK) FZ_FAIL("fi_merge_state wrote over v_b");
                if (same) out_v = &b[VA].t, out_s = &b[SA].t;
                checked = !over;
            }
        }
        free(x), free(l);
    }
    if (!fail && st == FI_OK && checked) {
        double *go = tu_view_read(out_v), *gl = tu_view_read(out_s);
        fz_compare("merge O", go, ro, n * H * D, out_tol(out_v->dtype));
        fz_compare("merge LSE", gl, rl, n * H, 1e-5);
        free(go), free(gl);
    }
    free(ro), free(rl);
    for (int i = 0; i < 6; i++) tu_buf_free(&b[i]);
}

static void fuzz_append(fz *f, fi_context *ctx, tu_rng *rng) {
    static const fi_dtype kv_dt[5] = {FI_DTYPE_F32, FI_DTYPE_F16, FI_DTYPE_BF16, FI_DTYPE_E4M3,
                                      FI_DTYPE_E5M2};
    fi_dtype dt = kv_dt[fz_pick(f, 5)];
    fi_kv_layout layout = (fi_kv_layout)fz_pick(f, 2);
    int32_t ps = (int32_t)fz_range(f, 1, 9), batch = (int32_t)fz_range(f, 1, 4);
    int64_t H = fz_range(f, 1, 3), D = fz_range(f, 1, 40);
    ops_append_table t;
    if (ops_table_make(rng, (ops_append_shape)fz_pick(f, 3), batch, ps, 12, &t)) {
        ops_table_free(&t);
        return;
    }
    int broken = 0;
    switch (fz_pick(f, 10)) { /* faults the host checks refuse */
    case 0: if (t.nnz) t.positions[fz_range(f, 0, t.nnz - 1)] += (int32_t)fz_range(f, 50, 100), broken = 1; break;
    case 1: /* a request outside the batch */
        if (t.nnz)
            t.batch_indices[fz_range(f, 0, t.nnz - 1)] =
                fz_one_in(f, 2) ? -(int32_t)fz_range(f, 1, 3) : batch + (int32_t)fz_range(f, 0, 3);
        broken = t.nnz > 0;
        break;
    case 2: /* a page past the cache */
        if (t.num_indices) t.indices[fz_range(f, 0, t.num_indices - 1)] = t.pages + (int32_t)fz_range(f, 0, 9);
        broken = t.num_indices > 0;
        break;
    case 3: /* a last page length outside [1, page_size] */
        t.last[fz_range(f, 0, batch - 1)] = fz_one_in(f, 2) ? -(int32_t)fz_range(f, 1, 2) : ps + (int32_t)fz_range(f, 1, 3);
        broken = 1;
        break;
    default: break;
    }
    int64_t rows[3] = {t.nnz, H, D};
    int64_t cache[4] = {t.pages, layout == FI_KV_LAYOUT_NHD ? ps : H, layout == FI_KV_LAYOUT_NHD ? H : ps, D};
    tu_buf ak, av, kc, vc;
    if (fz_tensor(&ak, dt, 3, rows, rng, 2.0) || fz_tensor(&av, dt, 3, rows, rng, 2.0) ||
        fz_tensor(&kc, dt, 4, cache, rng, 1.0) || fz_tensor(&vc, dt, 4, cache, rng, 1.0)) {
        ops_table_free(&t);
        return;
    }
    void *kref = malloc(kc.bytes + 1), *vref = malloc(vc.bytes + 1);
    memcpy(kref, kc.base, kc.bytes), memcpy(vref, vc.base, vc.bytes);
    int64_t nnz = t.nnz, nb = batch + 1, b1 = batch, ni = t.num_indices;
    fi_tensor bi = fi_tensor_contiguous(t.batch_indices, FI_DTYPE_I32, 1, &nnz);
    fi_tensor po = fi_tensor_contiguous(t.positions, FI_DTYPE_I32, 1, &nnz);
    fi_tensor ix = fi_tensor_contiguous(t.indices, FI_DTYPE_I32, 1, &ni);
    fi_tensor ip = fi_tensor_contiguous(t.indptr, FI_DTYPE_I32, 1, &nb);
    fi_tensor lp = fi_tensor_contiguous(t.last, FI_DTYPE_I32, 1, &b1);
    fi_tensor k_out = kc.t;
    int overlap = fz_one_in(f, 8) && t.nnz > 0;
    if (overlap) k_out = vc.t; /* K written into the V cache */
    fi_status st = fi_append_paged_kv_cache(ctx, &ak.t, &av.t, &bi, &po, &k_out, &vc.t, layout, &ix,
                                            &ip, &lp, NULL);
    fz_check_status(st, "fi_append_paged_kv_cache");
    if (st == FI_OK && (broken || overlap))
        FZ_FAIL("fi_append_paged_kv_cache accepted a %s", overlap ? "K cache that is the V cache"
                                                                : "broken page table");
    if (st == FI_OK) {
        fi_tensor kr = kc.t, vr = vc.t;
        kr.data = kref, vr.data = vref;
        oracle_append_paged(&ak.t, &kr, layout, t.batch_indices, t.positions, t.indices, t.indptr);
        oracle_append_paged(&av.t, &vr, layout, t.batch_indices, t.positions, t.indices, t.indptr);
        if (memcmp(kref, kc.base, kc.bytes) || memcmp(vref, vc.base, vc.bytes))
            FZ_FAIL("fi_append_paged_kv_cache: the caches differ from the reference copy");
    }
    free(kref), free(vref);
    tu_buf_free(&ak), tu_buf_free(&av), tu_buf_free(&kc), tu_buf_free(&vc);
    ops_table_free(&t);
}

static void fuzz_rope(fz *f, fi_context *ctx, tu_rng *rng) {
    int use_pos = fz_pick(f, 2);
    fi_dtype dt = float_dt[fz_pick(f, 3)];
    int64_t nnz = fz_range(f, 0, 8), Hq = fz_range(f, 1, 3), Hk = fz_range(f, 1, 2);
    int64_t D = 2 * fz_range(f, 1, 32);
    fi_rope_params rp;
    fi_rope_params_init(&rp);
    rp.rotary_dim = fz_one_in(f, 3) ? (int32_t)(2 * fz_range(f, 0, D / 2 + 1)) : 0;
    rp.interleave = fz_pick(f, 2);
    rp.rope_theta = fz_one_in(f, 4) ? (float)fz_range(f, 1, 100000) : 1e4f;
    rp.rope_scale = fz_one_in(f, 4) ? (float)fz_range(f, 1, 8) : 1.0f;
    rp.llama31 = fz_one_in(f, 4);
    int64_t qs[3] = {nnz, Hq, D}, ks[3] = {nnz, Hk, D};
    tu_buf q, k, qo, ko;
    if (fz_tensor(&q, dt, 3, qs, rng, 2.0) || fz_tensor(&k, dt, 3, ks, rng, 2.0) ||
        fz_tensor(&qo, dt, 3, qs, rng, 1.0) || fz_tensor(&ko, dt, 3, ks, rng, 1.0))
        return;
    int32_t pos32[9] = {0}, indptr[4] = {0}, offsets[3] = {0};
    int64_t pos[9], B = fz_range(f, 0, 3);
    for (int64_t i = 0; i < nnz; i++) pos32[i] = (int32_t)fz_range(f, fz_one_in(f, 16) ? -2 : 0, 5000);
    for (int64_t b = 0; b < B; b++) {
        indptr[b + 1] = indptr[b] + (int32_t)fz_range(f, 0, nnz - indptr[b]);
        offsets[b] = (int32_t)fz_range(f, fz_one_in(f, 16) ? -2 : 0, 3000);
    }
    int in_place = fz_one_in(f, 3);
    fi_tensor qout = in_place ? q.t : qo.t, kout = in_place ? k.t : ko.t;
    int overlap = fz_one_in(f, 10) && nnz > 0;
    if (overlap) kout = qout, kout.shape[1] = Hk; /* k_out over q_out */
    double *x = tu_view_read(&q.t), *y = tu_view_read(&k.t);
    fi_status st;
    int64_t n1 = nnz, nb = B + 1, b1 = B;
    if (use_pos) {
        fi_tensor pt = fi_tensor_contiguous(pos32, FI_DTYPE_I32, 1, &n1);
        for (int64_t i = 0; i < nnz; i++) pos[i] = pos32[i];
        st = fi_rope_apply_pos_ids(ctx, &rp, &q.t, &k.t, &qout, &kout, &pt, NULL);
    } else {
        fi_tensor it = fi_tensor_contiguous(indptr, FI_DTYPE_I32, 1, &nb);
        fi_tensor ot = fi_tensor_contiguous(offsets, FI_DTYPE_I32, 1, &b1);
        oracle_rope_positions((int32_t)B, indptr, offsets, nnz, pos);
        st = fi_rope_apply(ctx, &rp, &q.t, &k.t, &qout, &kout, &it, &ot, NULL);
    }
    fz_check_status(st, "fi_rope_apply");
    if (st == FI_OK && overlap) FZ_FAIL("RoPE accepted k_out over q_out");
    int pos_ok = 1;
    for (int64_t i = 0; i < nnz; i++) pos_ok &= !use_pos || pos[i] >= 0;
    if (st == FI_OK && pos_ok && rp.rotary_dim <= D) {
        double *rq = malloc(sizeof(double) * (size_t)(nnz * Hq * D + 1));
        double *rk = malloc(sizeof(double) * (size_t)(nnz * Hk * D + 1));
        oracle_rope(&rp, nnz, Hq, D, x, pos, rq);
        oracle_rope(&rp, nnz, Hk, D, y, pos, rk);
        double *gq = tu_view_read(&qout), *gk = tu_view_read(&kout);
        /* tokens past indptr[B] keep their values: the reference has none */
        for (int64_t t = 0; t < nnz; t++)
            if (pos[t] < 0) {
                for (int64_t i = 0; i < Hq * D; i++) rq[t * Hq * D + i] = gq[t * Hq * D + i];
                for (int64_t i = 0; i < Hk * D; i++) rk[t * Hk * D + i] = gk[t * Hk * D + i];
            }
        /* angles in f32 at positions up to ~8000 */
        double tol = (dt == FI_DTYPE_F32 ? 2e-4 : out_tol(dt) * 2);
        fz_compare("rope q", gq, rq, nnz * Hq * D, tol);
        fz_compare("rope k", gk, rk, nnz * Hk * D, tol);
        free(rq), free(rk), free(gq), free(gk);
    }
    free(x), free(y);
    tu_buf_free(&q), tu_buf_free(&k), tu_buf_free(&qo), tu_buf_free(&ko);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz f = {data, size};
    fi_context *ctx = fz_context(&f);
    tu_rng rng;
    tu_rng_seed(&rng, fz_u32(&f));
    switch (fz_pick(&f, 3)) {
    case 0: fuzz_merge(&f, ctx, &rng); break;
    case 1: fuzz_append(&f, ctx, &rng); break;
    default: fuzz_rope(&f, ctx, &rng); break;
    }
    return 0;
}
