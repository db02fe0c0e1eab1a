/*
 * ops_append.c — writing new tokens' K/V into a paged cache on the CPU.
 *
 * Token n belongs to request b = batch_indices[n] at position p within it;
 * it lands in page kv_indices[kv_indptr[b] + p / page_size], slot
 * p % page_size. Values are copied bit for bit (the cache and the appended
 * rows share a dtype, FP8 included). The core has checked every index.
 * Tokens are split across the thread pool; each writes its own slots, so
 * two tokens naming the same (request, position) are a caller error (which
 * one lands is then unspecified, as in FlashInfer).
 */
#include "cpu/cpu.h"
#include "cpu/ops_rows.h"

typedef struct append_job {
    const fi_tensor *ak, *av; /* [nnz, H, D_k], [nnz, H, D_v] */
    const fi_tensor *kc, *vc; /* paged NHD/HND caches */
    fi_kv_layout layout;
    const int32_t *batch, *pos, *indices, *indptr;
    int32_t page_size;
    int64_t heads;
} append_job;

/* Copy the H rows of token n of `src` into (page, slot) of `cache`. */
static void append_token(const append_job *j, const fi_tensor *src, const fi_tensor *cache,
                         int64_t n, int64_t page, int64_t slot) {
    size_t elem = (size_t)fi_ops_elem(cache->dtype);
    const int64_t *cs = cache->stride;
    int64_t slot_off = j->layout == FI_KV_LAYOUT_NHD ? slot * cs[1] : slot * cs[2];
    int64_t head_stride = j->layout == FI_KV_LAYOUT_NHD ? cs[2] : cs[1];
    for (int64_t h = 0; h < j->heads; h++) {
        const void *from = fi_ops_at(src->data, src->dtype,
                                     n * src->stride[0] + h * src->stride[1]);
        void *to = (void *)fi_ops_at(cache->data, cache->dtype,
                                     page * cs[0] + slot_off + h * head_stride);
        fi_ops_copy(to, cs[3], from, src->stride[2], src->shape[2], elem);
    }
}

static void append_tokens(void *arg, int64_t begin, int64_t end) {
    const append_job *j = arg;
    for (int64_t n = begin; n < end; n++) {
        int32_t b = j->batch[n], p = j->pos[n];
        int64_t page = j->indices[j->indptr[b] + p / j->page_size];
        int64_t slot = p % j->page_size;
        append_token(j, j->ak, j->kc, n, page, slot);
        append_token(j, j->av, j->vc, n, page, slot);
    }
}

fi_status fi_cpu_append_paged_kv_cache(
    fi_context *ctx, const fi_tensor *append_k, const fi_tensor *append_v,
    const fi_tensor *batch_indices, const fi_tensor *positions,
    fi_tensor *k_cache, fi_tensor *v_cache, fi_kv_layout layout,
    const fi_tensor *kv_indices, const fi_tensor *kv_indptr,
    const fi_tensor *kv_last_page_len, void *stream) {
    (void)kv_last_page_len;
    (void)stream;
    append_job j = {
        .ak = append_k, .av = append_v, .kc = k_cache, .vc = v_cache, .layout = layout,
        .batch = batch_indices->data, .pos = positions->data,
        .indices = kv_indices->data, .indptr = kv_indptr->data,
        .page_size = (int32_t)(layout == FI_KV_LAYOUT_NHD ? k_cache->shape[1]
                                                          : k_cache->shape[2]),
        .heads = append_k->shape[1],
    };
    int64_t nnz = append_k->shape[0];
    int64_t bytes = 2 * nnz * j.heads *
                    (append_k->shape[2] * fi_ops_elem(append_k->dtype) +
                     append_v->shape[2] * fi_ops_elem(append_v->dtype));
    fi_ops_parallel_for(ctx, nnz, bytes, append_tokens, &j);
    return FI_OK;
}
