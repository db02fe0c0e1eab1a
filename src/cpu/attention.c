/*
 * attention.c — the portable driver of the CPU attention kernel: one work
 * item (a request's query tokens [q_start, q_end) against keys [kv_start,
 * kv_end)), every KV head, FlashAttention's online softmax.
 *
 * For each KV head the item's tokens x the GQA group are packed into rows
 * (token major: row p is token q_start + p / group, query head
 * hkv * group + p % group), so each K/V row is read once per group. Rows go
 * in blocks of FI_CPU_BM, keys in blocks of FI_CPU_BN; the SIMD table does
 * the arithmetic (simd.h), this file does the bookkeeping: staging q (dtype,
 * RoPE, scale), K/V row pointers through the page table, masks, logit
 * transforms, and writing O/LSE or the partial state.
 */
#include "cpu/attention.h"
#include "cpu/convert.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- scratch */

fi_status fi_cpu_scratch_init(fi_cpu_scratch *s) {
    const size_t qd = (size_t)FI_CPU_BM * FI_CPU_MAX_D, kd = (size_t)FI_CPU_BN * FI_CPU_MAX_D;
    const size_t sizes[] = {
        qd * 4, qd * 4, qd * 4, (size_t)FI_CPU_BM * FI_CPU_BN * 4, FI_CPU_BM * 4,
        FI_CPU_BM * 4, FI_CPU_BM * 4, kd * 4, kd * 4, 2 * FI_CPU_BN * sizeof(void *),
        2 * FI_CPU_BN * sizeof(void *), FI_CPU_WORK_BYTES,
    };
    size_t n = sizeof sizes / sizeof sizes[0], total = 0;
    for (size_t i = 0; i < n; i++) total += (sizes[i] + 63) & ~(size_t)63;
    char *mem = NULL;
    if (posix_memalign((void **)&mem, 64, total) != 0)
        return fi_error(FI_STATUS_OUT_OF_MEMORY, "CPU scratch of %zu bytes: out of memory", total);
    memset(mem, 0, total);
    void *p[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0, at = 0; i < n; i++) {
        p[i] = mem + at;
        at += (sizes[i] + 63) & ~(size_t)63;
    }
    *s = (fi_cpu_scratch){
        .q = p[0], .qx = p[1], .o = p[2], .s = p[3], .m = p[4], .l = p[5], .alpha = p[6],
        .kst = p[7], .vst = p[8], .kp = p[9], .vp = p[10], .work = p[11], .memory = mem,
    };
    return FI_OK;
}

void fi_cpu_scratch_fini(fi_cpu_scratch *s) {
    free(s->memory);
    s->memory = NULL;
}

/* ------------------------------------------------------------- row block */

/* What stays fixed while one row block walks its keys. */
typedef struct rowblock {
    int32_t req, qo_len, kv_len;
    int32_t q_start, kv_start, kv_end; /* the item's ranges, within the request */
    int32_t hkv, row0, rows;
    int32_t t_first, t_last;           /* tokens of rows 0 and rows - 1 */
    bool single;                       /* the head's only row block */
    int64_t qo_base;                   /* qo_indptr[req] */
} rowblock;

/* Keys [lo, hi) that token t (position within the request) may see. */
static inline void token_range(const fi_cpu_job *j, const rowblock *b, int32_t t, int32_t *lo,
                               int32_t *hi) {
    int32_t diag = b->kv_len - b->qo_len + t;
    int32_t l = b->kv_start, h = b->kv_end;
    if (j->causal && diag + 1 < h) h = diag + 1;
    if (j->window_left >= 0 && diag - j->window_left > l) l = diag - j->window_left;
    *lo = l;
    *hi = h;
}

/* x <- RoPE(x) at position pos: LLaMA, non-interleaved halves. */
static void rope_rotate(const fi_cpu_job *j, float *x, int32_t pos) {
    int32_t h = j->dqk / 2;
    for (int32_t i = 0; i < h; i++) {
        double a = (double)pos * j->rope_freq[i], c = cos(a), s = sin(a);
        float x0 = x[i], x1 = x[i + h];
        x[i] = (float)(x0 * c - x1 * s);
        x[i + h] = (float)(x1 * c + x0 * s);
    }
}

/* Query head `head` of token t (within the request) into dst[dqk]:
 * converted, rotated, scaled. */
static void load_q_row(const fi_cpu_job *j, const rowblock *b, int32_t t, int32_t head,
                       float *dst) {
    const uint8_t *src = j->q + (b->qo_base + t) * j->q_tok + head * j->q_head;
    fi_load_row_f32(dst, src, j->plan->params.q_dtype, j->q_elem, j->dqk, 1.0f);
    if (j->rope) rope_rotate(j, dst, b->kv_len - b->qo_len + t);
    for (int32_t d = 0; d < j->dqk; d++) dst[d] *= j->q_scale;
}

/* Scratch q rows from row `off`: converted, rotated, scaled; padding rows
 * (up to a multiple of 8) zeroed. */
static void stage_q(const fi_cpu_job *j, const rowblock *b, fi_cpu_scratch *sc, int32_t off) {
    for (int32_t r = 0; r < b->rows; r++) {
        int32_t p = b->row0 + r, t = b->q_start + p / j->group;
        load_q_row(j, b, t, b->hkv * j->group + p % j->group, sc->q + (size_t)(off + r) * j->dqk);
    }
    int32_t pad = (off + b->rows + 7) & ~7;
    if (pad > FI_CPU_BM) pad = FI_CPU_BM;
    memset(sc->q + (size_t)(off + b->rows) * j->dqk, 0,
           sizeof(float) * (size_t)(pad - off - b->rows) * j->dqk);
}

/* Row pointers of keys [j0, j0 + n) of KV head hkv. */
static void kv_rows(const fi_cpu_job *j, const fi_cpu_kv *kv, const rowblock *b, int32_t hkv,
                    int32_t j0, int32_t n, const uint8_t **out) {
    const fi_plan *plan = j->plan;
    const uint8_t *base = kv->base + hkv * kv->head_stride;
    if (!j->paged) {
        const uint8_t *p = base + ((int64_t)plan->kv_indptr[b->req] + j0) * kv->slot_stride;
        for (int32_t i = 0; i < n; i++) out[i] = p + i * kv->slot_stride;
        return;
    }
    const int32_t *pages = plan->kv_indices + plan->kv_indptr[b->req];
    int32_t ps = j->page_size, page = j0 / ps, slot = j0 % ps;
    const uint8_t *pg = base + (int64_t)pages[page] * kv->page_stride;
    for (int32_t i = 0; i < n; i++) {
        out[i] = pg + slot * kv->slot_stride;
        if (++slot == ps && i + 1 < n) {
            slot = 0;
            pg = base + (int64_t)pages[++page] * kv->page_stride;
        }
    }
}

/* Copy rows to f32 scratch (RoPE on K, or a cache not contiguous along D);
 * the rows then read as f32 with scale 1. */
static void stage_rows(const fi_cpu_job *j, const fi_cpu_kv *kv, const uint8_t **rows,
                       int32_t n, int32_t d, float scale, float *dst, int32_t rope_pos0) {
    for (int32_t i = 0; i < n; i++) {
        float *x = dst + (size_t)i * FI_CPU_MAX_D;
        fi_load_row_f32(x, rows[i], kv->dtype, kv->elem_stride, d, scale);
        if (rope_pos0 >= 0) rope_rotate(j, x, rope_pos0 + i);
        rows[i] = (const uint8_t *)x;
    }
}

/* Masks and logit transforms of one key block, in place on tile->s. */
static void mask_block(const fi_cpu_job *j, const rowblock *b, fi_cpu_tile *tl, int32_t j0,
                       bool transform) {
    const uint8_t *mask = j->mask ? j->mask + j->plan->mask_offset[b->req] : NULL;
    int32_t n = tl->keys;
    for (int32_t r = 0; r < b->rows; r++) {
        int32_t p = b->row0 + r, t = b->q_start + p / j->group, lo, hi;
        token_range(j, b, t, &lo, &hi);
        int32_t a = lo - j0 < 0 ? 0 : (lo - j0 > n ? n : lo - j0);
        int32_t e = hi - j0 < a ? a : (hi - j0 > n ? n : hi - j0);
        float *s = tl->s + (size_t)r * FI_CPU_BN;
        for (int32_t i = 0; i < a; i++) s[i] = -INFINITY;
        for (int32_t i = e; i < n; i++) s[i] = -INFINITY;
        if (transform) {
            int32_t diag = b->kv_len - b->qo_len + t;
            float slope = j->alibi ? j->plan->alibi_slopes[b->hkv * j->group + p % j->group] : 0;
            for (int32_t i = a; i < e; i++) {
                float x = s[i];
                if (j->alibi) x += slope * (float)(j0 + i - diag);
                if (j->softcap) x = j->softcap_c * tanhf(x / j->softcap_c);
                s[i] = x * j->logit_scale;
            }
        }
        if (mask) {
            int64_t bit = (int64_t)t * b->kv_len + j0 + a;
            for (int32_t i = a; i < e; i++, bit++)
                if (!((mask[bit >> 3] >> (bit & 7)) & 1)) s[i] = -INFINITY;
        }
    }
}

/* Whether any row of the block sees a key of [j0, j0 + n), and whether all
 * rows see all of them (no range mask needed). */
static void block_visibility(const fi_cpu_job *j, const rowblock *b, int32_t j0, int32_t n,
                             bool *any, bool *all) {
    *any = false;
    *all = true;
    for (int32_t t = b->t_first; t <= b->t_last; t++) {
        int32_t lo, hi;
        token_range(j, b, t, &lo, &hi);
        if ((lo > j0 ? lo : j0) < (hi < j0 + n ? hi : j0 + n)) *any = true;
        if (lo > j0 || hi < j0 + n) *all = false;
    }
}

/* Row (token t, query head `head`) of the item exactly as docs/SEMANTICS.md
 * ("Non-finite values") says, in scalar C with f64 sums, whatever the SIMD
 * level: taken when the fast path's output row is not finite, which is how
 * a NaN or infinity in V (or a sum past f32) shows. Keys of the item the
 * row sees, logits as the kernel forms them (f32); a logit that is NaN or
 * +inf makes the row NaN, one of -inf drops its key (its V unread); every
 * other key's v enters sum_j w_j v_j in IEEE f64 arithmetic, whatever its
 * weight (an infinity stays one, opposite ones or a NaN give NaN). */
static void exact_row(const fi_cpu_job *j, const rowblock *b, int32_t t, int32_t head,
                      float *o, float *lse) {
    float q[FI_CPU_MAX_D], x[FI_CPU_MAX_D];
    double acc[FI_CPU_MAX_D];
    int32_t hkv = head / j->group, lo, hi, diag = b->kv_len - b->qo_len + t;
    load_q_row(j, b, t, head, q);
    token_range(j, b, t, &lo, &hi);
    const uint8_t *mask = j->mask ? j->mask + j->plan->mask_offset[b->req] : NULL;
    float slope = j->alibi ? j->plan->alibi_slopes[head] : 0.0f;
    double m = -INFINITY, l = 0.0;
    bool poisoned = false;
    for (int32_t d = 0; d < j->dvo; d++) acc[d] = 0.0;
    for (int32_t key = lo; key < hi && !poisoned; key++) {
        int64_t bit = (int64_t)t * b->kv_len + key;
        if (mask && !((mask[bit >> 3] >> (bit & 7)) & 1)) continue;
        const uint8_t *row;
        kv_rows(j, &j->k, b, hkv, key, 1, &row);
        fi_load_row_f32(x, row, j->k.dtype, j->k.elem_stride, j->dqk, j->k_scale);
        if (j->rope) rope_rotate(j, x, key);
        double dot = 0.0;
        for (int32_t d = 0; d < j->dqk; d++) dot += (double)q[d] * x[d];
        float s = (float)dot;
        if (j->alibi || j->softcap) {
            if (j->alibi) s += slope * (float)(key - diag);
            if (j->softcap) s = j->softcap_c * tanhf(s / j->softcap_c);
            s *= j->logit_scale;
        }
        if (!(s < INFINITY)) poisoned = true;
        if (poisoned || s == -INFINITY) continue;
        if (s > m) { /* rescale what is summed so far to the new maximum */
            double r = exp2(m - s);
            l *= r;
            for (int32_t d = 0; d < j->dvo; d++) acc[d] *= r;
            m = s;
        }
        double w = exp2(s - m);
        l += w;
        kv_rows(j, &j->v, b, hkv, key, 1, &row);
        fi_load_row_f32(x, row, j->v.dtype, j->v.elem_stride, j->dvo, j->v_scale);
        for (int32_t d = 0; d < j->dvo; d++) acc[d] += w * x[d];
    }
    if (poisoned || l == 0.0) {
        for (int32_t d = 0; d < j->dvo; d++) o[d] = poisoned ? NAN : 0.0f;
        *lse = poisoned ? NAN : -INFINITY;
        return;
    }
    for (int32_t d = 0; d < j->dvo; d++) o[d] = (float)(acc[d] / l);
    *lse = (float)(m + log2(l));
}

/* The row block's output: O / l and LSE = m + log2 l; 0 and -inf for a row
 * that saw no key; NaN for a poisoned one (l NaN); the exact path for a row
 * whose accumulator is not finite. */
static void write_rows(const fi_cpu_job *j, const rowblock *b, const fi_work_item *it,
                       const fi_cpu_scratch *sc, int32_t off) {
    fi_dtype od = j->plan->params.o_dtype;
    float row[FI_CPU_MAX_D];
    for (int32_t r = 0; r < b->rows; r++) {
        int32_t p = b->row0 + r, t = b->q_start + p / j->group;
        int32_t head = b->hkv * j->group + p % j->group;
        float l = sc->l[off + r], inv = 1.0f, lse;
        const float *acc = sc->o + (size_t)(off + r) * j->dvo;
        if (l > 0.0f && fi_all_finite(acc, j->dvo)) {
            inv = 1.0f / l;
            lse = sc->m[off + r] + log2f(l);
        } else if (l == 0.0f || l != l) { /* no key seen, or poisoned */
            for (int32_t d = 0; d < j->dvo; d++) row[d] = l == 0.0f ? 0.0f : NAN;
            acc = row;
            lse = l == 0.0f ? -INFINITY : NAN;
        } else {
            exact_row(j, b, t, head, row, &lse);
            acc = row;
        }
        if (it->partial_row >= 0) {
            int64_t prow = (int64_t)(it->partial_row + t - it->q_start) * j->h_qo + head;
            float *dst = j->plan->partial_o + prow * j->dvo;
            for (int32_t d = 0; d < j->dvo; d++) dst[d] = acc[d] * inv;
            j->plan->partial_lse[prow] = lse;
            continue;
        }
        int64_t tok = b->qo_base + t;
        fi_store_row_f32(j->o + tok * j->o_tok + head * j->o_head, od, j->o_elem, acc, inv,
                         j->dvo);
        if (j->lse) j->lse[tok * j->lse_tok + head * j->lse_head] = lse;
    }
}

/* One key block of one row block; its row pointers are in tl->k / tl->v,
 * the next block's (to prefetch) in tl->k_next / tl->v_next. */
static void key_block(const fi_cpu_job *j, const rowblock *b, fi_cpu_tile *tl,
                      fi_cpu_scratch *sc, int32_t j0, int32_t n) {
    bool any, all;
    block_visibility(j, b, j0, n, &any, &all);
    if (!any) return;
    tl->keys = n;
    const uint8_t **kp = (const uint8_t **)tl->k, **vp = (const uint8_t **)tl->v;
    if (j->stage_k) stage_rows(j, &j->k, kp, n, j->dqk, j->k_scale, sc->kst, j->rope ? j0 : -1);
    if (j->stage_v) stage_rows(j, &j->v, vp, n, j->dvo, j->v_scale, sc->vst, -1);
    j->simd->qk(tl);
    bool transform = j->alibi || j->softcap;
    if (!all || transform || j->mask) mask_block(j, b, tl, j0, transform);
    j->simd->softmax(tl);
    j->simd->pv(tl);
}

/* The tile of head `h`'s rows: scratch rows from off = (h - first) * rows. */
static fi_cpu_tile head_tile(const fi_cpu_job *j, const rowblock *b, fi_cpu_scratch *sc,
                             int32_t off) {
    fi_cpu_tile tl = {
        .rows = b->rows, .dqk = j->dqk, .dvo = j->dvo,
        .q = sc->q + (size_t)off * j->dqk, .qx = sc->qx + (size_t)off * j->dqk,
        .s = sc->s + (size_t)off * FI_CPU_BN, .o = sc->o + (size_t)off * j->dvo,
        .m = sc->m + off, .l = sc->l + off, .alpha = sc->alpha + off, .work = sc->work,
        .k_dtype = j->k_dtype, .v_dtype = j->v_dtype,
        .k_scale = j->stage_k ? 1.0f : j->k_scale, .v_scale = j->stage_v ? 1.0f : j->v_scale,
    };
    return tl;
}

/* Rows [row0, row0 + rows) of `heads` consecutive KV heads from b->hkv, in
 * scratch one head after another. Key blocks are walked in order, every
 * head per block: with a paged NHD cache this reads each page's heads
 * together (one TLB walk and a prefetchable stream per page, not one per
 * head); the next (head, block)'s rows are prefetched during each. */
static void row_block(const fi_cpu_job *j, const fi_work_item *it, rowblock *b, int32_t heads,
                      fi_cpu_scratch *sc) {
    int32_t first = b->hkv, total = heads * b->rows;
    b->t_first = b->q_start + b->row0 / j->group;
    b->t_last = b->q_start + (b->row0 + b->rows - 1) / j->group;
    int32_t kbeg, kend, lo, hi;
    token_range(j, b, b->t_first, &kbeg, &hi);
    token_range(j, b, b->t_last, &lo, &kend);
    for (int32_t r = 0; r < total; r++) sc->m[r] = -INFINITY, sc->l[r] = 0.0f;
    memset(sc->o, 0, sizeof(float) * (size_t)total * j->dvo);
    if (kbeg < kend) {
        for (int32_t h = 0; h < heads; h++) {
            b->hkv = first + h;
            stage_q(j, b, sc, h * b->rows);
            fi_cpu_tile tl = head_tile(j, b, sc, h * b->rows);
            if (j->simd->prepare_q) j->simd->prepare_q(&tl);
        }
        int32_t cur = 0, n = kend - kbeg < FI_CPU_BN ? kend - kbeg : FI_CPU_BN;
        kv_rows(j, &j->k, b, first, kbeg, n, sc->kp);
        kv_rows(j, &j->v, b, first, kbeg, n, sc->vp);
        for (int32_t j0 = kbeg; j0 < kend; j0 += FI_CPU_BN) {
            n = kend - j0 < FI_CPU_BN ? kend - j0 : FI_CPU_BN;
            for (int32_t h = 0; h < heads; h++, cur ^= 1) {
                /* Next: this block's next head, else the next block's first
                 * head, else (one row block per head) the next head's first. */
                int32_t nh = first + h + 1, nj = j0;
                if (h + 1 == heads) nh = first, nj = j0 + FI_CPU_BN;
                if (nj >= kend && b->single && first + heads < j->h_kv) nj = kbeg, nh = first + heads;
                int32_t nn = nj < kend ? (kend - nj < FI_CPU_BN ? kend - nj : FI_CPU_BN) : 0;
                const uint8_t **kn = sc->kp + (cur ^ 1) * FI_CPU_BN;
                const uint8_t **vn = sc->vp + (cur ^ 1) * FI_CPU_BN;
                if (nn > 0) {
                    kv_rows(j, &j->k, b, nh, nj, nn, kn);
                    kv_rows(j, &j->v, b, nh, nj, nn, vn);
                }
                b->hkv = first + h;
                fi_cpu_tile tl = head_tile(j, b, sc, h * b->rows);
                tl.k = sc->kp + cur * FI_CPU_BN, tl.v = sc->vp + cur * FI_CPU_BN;
                tl.k_next = kn, tl.v_next = vn, tl.keys_next = nn;
                key_block(j, b, &tl, sc, j0, n);
            }
        }
        for (int32_t h = 0; h < heads && j->simd->finish_o; h++) {
            b->hkv = first + h;
            fi_cpu_tile tl = head_tile(j, b, sc, h * b->rows);
            j->simd->finish_o(&tl);
        }
    }
    for (int32_t h = 0; h < heads; h++) {
        b->hkv = first + h;
        write_rows(j, b, it, sc, h * b->rows);
    }
    b->hkv = first;
}

void fi_cpu_attend_item(const fi_cpu_job *j, const fi_work_item *it, fi_cpu_scratch *sc) {
    const fi_plan *plan = j->plan;
    rowblock b = {
        .req = it->request,
        .qo_len = plan->qo_indptr[it->request + 1] - plan->qo_indptr[it->request],
        .kv_len = plan->kv_len[it->request],
        .q_start = it->q_start, .kv_start = it->kv_start, .kv_end = it->kv_end,
        .qo_base = plan->qo_indptr[it->request],
    };
    int32_t rows = (it->q_end - it->q_start) * j->group;
    b.single = rows <= FI_CPU_BM;
    /* Small items (decode) take every KV head in one row block; a head's
     * rows stay in the SIMD table's small-row path (below the GEMM rows). */
    int32_t heads = 1;
    if (rows < 16 && rows * j->h_kv <= FI_CPU_BM) heads = j->h_kv;
    for (b.hkv = 0; b.hkv < j->h_kv; b.hkv += heads) {
        for (b.row0 = 0; b.row0 < rows; b.row0 += FI_CPU_BM) {
            b.rows = rows - b.row0 < FI_CPU_BM ? rows - b.row0 : FI_CPU_BM;
            row_block(j, it, &b, heads, sc);
        }
    }
}
