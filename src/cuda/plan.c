/*
 * plan.c — a plan's device side: fixed device workspace (metadata region,
 * partial states) and pinned staging sized from the plan's bounds, the
 * kernel table (select.c) loaded at creation, the scheduler's policy, and
 * the one async copy per fi_plan_update.
 */
#include "cuda/cuda_backend.h"
#include "core/variant.h"

#include "../../kernels/fi_args.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(fi_meta) <= FI_META_WORKERS, "meta header");
_Static_assert(sizeof(fi_item_rec) == 48 && sizeof(fi_part_merge) == 16, "meta records");

static size_t a16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Bytes of the metadata region for the largest batch the plan accepts. */
static size_t meta_capacity(const fi_plan *plan) {
    const fi_schedule_limits *l = &plan->schedule.limits;
    size_t b = (size_t)plan->config.max_batch_size, q = (size_t)l->max_total_qo;
    size_t at = (size_t)fi_meta_items(plan->config.num_workers); /* header, worker_indptr */
    at += a16((size_t)l->max_items * sizeof(fi_item_rec));
    at += a16((b + 1) * 4);                                       /* qo_indptr */
    if (plan->params.kv_format == FI_KV_FORMAT_PAGED && !plan->config.device_page_table)
        at += a16((size_t)plan->config.max_total_kv * 4);         /* kv_indices (host table) */
    at += a16(b * 4) + a16((b + 1) * 8);                          /* kv_len, mask */
    at += a16(q * 4) + a16((q + 1) * 4) + a16((size_t)l->max_partial_rows * 4); /* merge map */
    at += a16((size_t)l->max_partial_rows * sizeof(fi_part_merge));
    at += a16((size_t)plan->params.num_qo_heads * 4);
    return at;
}

/* Place n bytes from src at the cursor; returns their offset. */
static int64_t put(char *base, size_t *at, const void *src, size_t n) {
    size_t off = *at;
    if (n && src) memcpy(base + off, src, n);
    *at = a16(off + n);
    return (int64_t)off;
}

void fi_cuda_plan_fini(fi_plan *plan) {
    fi_cuda_plan *ps = plan->backend_state;
    if (!ps) return;
    const fi_cu_api *cu = ps->cc->cu;
    if (fi_cuda_push(ps->cc) == FI_OK) {
        if (ps->uploaded) {
            if (ps->upload_recorded) cu->EventSynchronize(ps->uploaded);
            cu->EventDestroy(ps->uploaded);
        }
        if (ps->staging) cu->MemFreeHost(ps->staging);
        if (ps->meta) cu->MemFree(ps->meta);
        if (ps->partial_o) cu->MemFree(ps->partial_o);
        if (ps->partial_lse) cu->MemFree(ps->partial_lse);
        if (ps->merge_count) cu->MemFree(ps->merge_count);
        fi_cuda_pop(ps->cc);
    }
    free(ps->vsrc);
    free(ps);
    plan->backend_state = NULL;
}

/* The plan's kernel table (select.c), loaded in one step: cold kernels
 * compile side by side, then every form is loaded (AOT table, disk cache or
 * the compile just made) with its dynamic shared memory allowed. */
static fi_status load_table(fi_cuda_plan *ps, const fi_cuda_selection *sel) {
    const fi_kernel_spec *list[FI_CUDA_FORM_COUNT];
    int n = 0;
    for (int f = 0; f < FI_CUDA_FORM_COUNT; f++)
        if (fi_cuda_has_form(sel, (fi_cuda_form)f)) list[n++] = &sel->spec[f];
    fi_status st = fi_cuda_jit_prepare(ps->cc, list, n);
    for (int f = 0; !st && f < FI_CUDA_FORM_COUNT; f++) {
        if (!fi_cuda_has_form(sel, (fi_cuda_form)f)) continue;
        if ((st = fi_cuda_jit_function(ps->cc, &sel->spec[f], &ps->fn[f]))) break;
        ps->smem[f] = sel->smem[f];
        ps->threads[f] = sel->threads[f];
        if (sel->smem[f] > 0)
            FI_CU(ps->cc->cu, FuncSetAttribute, ps->fn[f], FI_CU_FUNC_MAX_DYN_SMEM, sel->smem[f]);
    }
    return st;
}

/* The scheduler's policy for the kernels this plan runs. With a tensor-core
 * path a key of a 128-row block costs about two decode keys, not 32x as on
 * CUDA cores (measured, docs/BENCHMARKS.md): cost = rows + keys + 0.007 rows
 * x keys, where an item of more than one m16 tile of rows counts whole
 * blocks, and every request in tiles of 128 rows (a decode request still
 * makes 1-token items; a prefill chunk beside decodes gets no tiles of 8 or
 * 32 rows, which the tensor cores would pad to 128). The scheduler shortens
 * a wide tile's split chunks by the same ratio (schedule.c, key_weight). */
static void set_policy(fi_plan *plan, const fi_cuda_plan *ps) {
    fi_sched_policy *pol = &plan->policy;
    /* A worker's items run as grid_y CTAs, blocks_per_sm CTAs per SM at
     * once: split long spans for that many items at a time, not for every
     * worker (one long request then splits into one wave of chunks, not
     * several waves and a wide merge). */
    const int32_t slots = ps->cc->sm_count * ps->blocks_per_sm / (int32_t)ps->grid_y;
    pol->split_workers = slots > 1 ? slots : 1;
    /* ... but a request over few KV heads (8/1: 264 slots) into no more
     * than 64 chunks: the merge of a row reads its chunks' partial states
     * 4 at a time, one after another (persistent.cuh), so more, shorter
     * chunks make a long decode merge-bound (docs/BENCHMARKS.md) */
    pol->split_max_chunks = 64;
    /* Each worker's queue in request order, not longest first: the CTAs
     * then sweep the requests together, and a request's causal tiles, which
     * read the same keys, share them in L2. */
    pol->queues_in_request_order = true;
    /* Items wider than the decode path's m16 tile (tensor-core blocks,
     * compute-bound) lead their queues, and their workers run first:
     * LPT gives them the last workers, where they ran as the launch's tail
     * (schedule.c, emit_queues). */
    pol->wide_first_rows = FI_CUDA_DTC_MAX_ROWS;
    if (ps->tc_path) {
        pol->q_tiles[0] = 128;
        pol->num_q_tiles = 1;
        pol->cost_per_q_row = 1.0;
        pol->cost_per_key = 1.0;
        pol->cost_per_row_key = 0.007;
        pol->cost_rows_exact = FI_CUDA_DTC_MAX_ROWS; /* decode version 3's m16 tile */
        pol->cost_rows_block = ps->tc_block;
    }
}

/* Kernels for the plan's params (the table), and the grid: one CTA per
 * (worker, KV head): the heads of a worker's items run side by side (their
 * pages are read at about the same time), measured faster than keeping
 * every CTA resident with heads looped inside a CTA. When the grid is
 * larger than the resident CTAs it runs in waves. */
static fi_status resolve_kernels(fi_plan *plan, fi_cuda_plan *ps) {
    const fi_attention_params *p = &plan->params;
    fi_attn_config cfg;
    fi_cuda_attn_config(p, plan->group_size, plan->config.device_page_table, &cfg);
    if (p->variant) { /* a user variant: its hooks spliced into every kernel */
        ps->vsrc = fi_variant_source_alloc(p->variant, FI_VARIANT_TARGET_CUDA);
        if (!ps->vsrc) return fi_error(FI_STATUS_OUT_OF_MEMORY, "variant source: out of memory");
        fi_cuda_attn_set_variant(&cfg, p->variant, ps->vsrc);
        ps->vhooks = cfg.vhooks;
    }
    fi_cuda_selection *sel = malloc(sizeof *sel);
    if (!sel) return fi_error(FI_STATUS_OUT_OF_MEMORY, "CUDA plan: out of memory");
    fi_cuda_select(&cfg, (int64_t)plan->config.max_total_qo * plan->group_size,
                   &ps->cc->tuning, sel);
    ps->tc_path = sel->tc_path;
    ps->decode_tc = sel->decode_tc;
    ps->prefill_separate = sel->prefill_separate;
    ps->persist_tc = sel->persist_tc;
    ps->tc_block = sel->tc_block;
    fi_status st = load_table(ps, sel);
    free(sel);
    if (st) return st;
    /* Resident CTAs of the form long decodes run (the decode form where
     * there is one): the split of long spans is sized for it. */
    fi_cuda_form occ = ps->fn[FI_CUDA_FORM_PERSIST_DECODE] ? FI_CUDA_FORM_PERSIST_DECODE
                       : ps->fn[FI_CUDA_FORM_PERSIST]      ? FI_CUDA_FORM_PERSIST
                                                           : FI_CUDA_FORM_ATTN;
    int blocks = 0;
    FI_CU(ps->cc->cu, OccupancyMaxActiveBlocksPerMultiprocessor, &blocks, ps->fn[occ], 128,
          (size_t)ps->smem[occ]);
    ps->blocks_per_sm = blocks > 0 ? blocks : 1;
    ps->grid_x = (unsigned)plan->config.num_workers;
    ps->grid_y = (unsigned)p->num_kv_heads;
    /* The merge kernel: 16 CTAs of 4 warps per SM, more than fit at once,
     * so that every SM keeps all the warps it can on the rows' chains of
     * dependent loads. */
    ps->merge_grid = (unsigned)(ps->cc->sm_count * 16);
    set_policy(plan, ps);
    return FI_OK;
}

fi_status fi_cuda_plan_init(fi_plan *plan) {
    fi_cuda_ctx *cc = plan->ctx->backend_state;
    fi_cuda_plan *ps = calloc(1, sizeof *ps);
    if (!ps) return fi_error(FI_STATUS_OUT_OF_MEMORY, "CUDA plan: out of memory");
    ps->cc = cc;
    plan->backend_state = ps;
    fi_status st = fi_cuda_push(cc);
    if (st) return st;
    const fi_cu_api *cu = cc->cu;
    const fi_schedule_limits *l = &plan->schedule.limits;
    size_t rows = (size_t)l->max_partial_rows * (size_t)plan->params.num_qo_heads;
    size_t po = rows * (size_t)plan->params.head_dim_vo * sizeof(float), pl = rows * sizeof(float);
    ps->meta_cap = meta_capacity(plan);
    CUresult r;
    st = resolve_kernels(plan, ps);
#define TRY(call, ...)                                              \
    if (!st && (r = cu->call(__VA_ARGS__)) != 0) st = fi_cu_error(cu, "cu" #call, r)
    TRY(MemAlloc, &ps->meta, ps->meta_cap);
    TRY(MemAlloc, &ps->partial_o, po ? po : 16);
    TRY(MemAlloc, &ps->partial_lse, pl ? pl : 16);
    size_t nc = (size_t)plan->config.max_total_qo * (size_t)plan->params.num_kv_heads * 4;
    TRY(MemAlloc, &ps->merge_count, nc ? nc : 16);
    TRY(MemsetD8, ps->merge_count, 0, nc ? nc : 16);
    TRY(MemAllocHost, (void **)&ps->staging, ps->meta_cap + 16);
    TRY(EventCreate, &ps->uploaded, FI_CU_EVENT_DISABLE_TIMING);
#undef TRY
    if (!st && cu->MemHostGetDevicePointer) {
        uint32_t *word = (uint32_t *)(void *)(ps->staging + ps->meta_cap);
        *word = 0;
        if (cu->MemHostGetDevicePointer(&ps->upload_done_dev, word, 0) == 0)
            ps->upload_done = word;
    }
    fi_cuda_pop(cc);
    if (st) return st; /* the core destroys the plan, and fini frees what exists */
    plan->workspace_bytes += 2 * ps->meta_cap + po + pl + nc;
    return FI_OK;
}

/* Pack the batch and schedule into staging; returns the bytes used, or 0
 * for a schedule the fused merge cannot take (never: core/schedule.c).
 * On the way, which kernels and forms the run needs (run.c): the has_*
 * flags and mixed_form. */
static size_t pack(fi_plan *plan, fi_cuda_plan *ps, char *base) {
    const fi_schedule *s = &plan->schedule;
    int32_t b = plan->batch_size;
    fi_meta m;
    memset(&m, 0, sizeof m);
    /* worker_indptr and the items first, at offsets fixed by the grid's
     * worker count (fi_args.h); workers past the schedule's run nothing */
    const int32_t W = plan->config.num_workers, ni = s->num_items;
    int32_t *wi = (int32_t *)(void *)(base + FI_META_WORKERS);
    memcpy(wi, s->worker_indptr, (size_t)(s->num_workers + 1) * 4);
    for (int32_t w = s->num_workers + 1; w <= W; w++) wi[w] = ni;
    m.off_worker_indptr = FI_META_WORKERS;
    m.off_items = fi_meta_items(W);
    fi_item_rec *rec = (fi_item_rec *)(void *)(base + m.off_items);
    const int64_t group = plan->group_size;
    const int64_t tc_rows = ps->tc_path ? FI_CUDA_TC_MIN_ROWS : INT64_MAX;
    bool tc = false, cc = false, wide = false;
    int64_t small_keys = 0;   /* per KV head: the decodes' keys in integers, */
    double wide_row_keys = 0; /* off a chain of double additions */
    for (int32_t n = 0; n < ni; n++) {
        const fi_work_item *it = &s->items[n];
        const int32_t r = it->request;
        const int32_t qo_len = plan->qo_indptr[r + 1] - plan->qo_indptr[r];
        const int64_t rows = (int64_t)(it->q_end - it->q_start) * group;
        const int64_t keys = it->kv_end - it->kv_start;
        /* a wide request's narrow items (a prefill's last tokens) go with
         * its other tiles to the tensor cores (work.cuh fi_item_on_tc) */
        const bool on_tc = rows >= tc_rows || (int64_t)qo_len * group >= tc_rows;
        rec[n] = (fi_item_rec){it->request, it->q_start, it->q_end, it->kv_start, it->kv_end,
                               it->partial_row, plan->qo_indptr[r], qo_len, plan->kv_len[r],
                               plan->kv_indptr[r], {0, 0}};
        tc |= on_tc;
        cc |= !on_tc;
        if (rows > FI_CUDA_DTC_MAX_ROWS) {
            wide = true;
            wide_row_keys += (double)rows * (double)keys;
        } else {
            small_keys += keys;
        }
    }
    ps->has_tc_items = tc, ps->has_cc_items = cc, ps->has_wide_items = wide;
    ps->mixed_form = ps->fn[FI_CUDA_FORM_PERSIST_MIXED] && wide &&
                     wide_row_keys < FI_CUDA_MIX_FLOP_PER_BYTE * (double)small_keys;
    size_t at = a16((size_t)m.off_items + (size_t)ni * sizeof(fi_item_rec));
    m.off_qo_indptr = put(base, &at, plan->qo_indptr, (size_t)(b + 1) * 4);
    int32_t nnz = plan->params.kv_format == FI_KV_FORMAT_PAGED ? plan->kv_indptr[b] : 0;
    m.off_kv_indices = (int64_t)at;
    if (plan->config.device_page_table) {
        /* the caller's device table, found from the region's base like the
         * staged arrays (an offset across allocations: the kernels add it to
         * a.meta); its ids are clamped by the kernels (work.cuh fi_page_id),
         * the K/V tensors need only one page */
        m.off_kv_indices = (int64_t)((CUdeviceptr)(uintptr_t)plan->kv_indices - ps->meta);
        plan->max_page_index = nnz > 0 ? 0 : -1;
        plan->pages_checked = true;
        nnz = 0; /* nothing staged */
    } else if (nnz > 0) {
        /* The page table's one pass: copied, and its range taken on the way,
         * which is the check fi_plan_run would otherwise make with a second
         * pass (core/plan_run.c); a negative id is left for it to report. */
        int32_t lo, hi;
        fi_int32_copy_range((int32_t *)(void *)(base + at), plan->kv_indices, nnz, &lo, &hi);
        if (lo >= 0) {
            plan->max_page_index = hi;
            plan->pages_checked = true;
        }
    }
    at = a16(at + (size_t)nnz * 4);
    m.off_kv_len = put(base, &at, plan->kv_len, (size_t)b * 4);
    size_t nmask = plan->params.mask_mode == FI_MASK_CUSTOM ? (size_t)(b + 1) : 0;
    m.off_mask_offset = put(base, &at, plan->mask_offset, nmask * 8);
    m.off_merge_out_row = put(base, &at, s->merge_out_row, (size_t)s->num_merge_rows * 4);
    m.off_merge_indptr = put(base, &at, s->merge_indptr, (size_t)(s->num_merge_rows + 1) * 4);
    m.off_merge_src = put(base, &at, s->merge_src, (size_t)s->merge_indptr[s->num_merge_rows] * 4);
    m.off_alibi = put(base, &at, plan->alibi_slopes, (size_t)plan->params.num_qo_heads * 4);
    /* each partial row's merge (the fused merge counts rows in) */
    m.off_part_merge = put(base, &at, NULL, (size_t)s->num_partial_rows * sizeof(fi_part_merge));
    fi_part_merge *pm = (fi_part_merge *)(void *)(base + m.off_part_merge);
    for (int32_t r = 0; r < s->num_merge_rows; r++) {
        const int32_t s0 = s->merge_indptr[r], n = s->merge_indptr[r + 1] - s0;
        const int32_t first = s->merge_src[s0], step = n > 1 ? s->merge_src[s0 + 1] - first : 0;
        /* the fused merge takes source k as partial row first + k * step: the
         * schedule spaces a row's sources so (core/schedule.c, merge_rows) */
        if (step < 0 || step > 0xffff || n > 0xffff) return 0;
        const fi_part_merge row = {r, s->merge_out_row[r], first, n | step << 16};
        for (int32_t k = 0; k < n; k++) {
            if (s->merge_src[s0 + k] != first + k * step) return 0;
            pm[s->merge_src[s0 + k]] = row;
        }
    }
    m.bytes = (int64_t)at;
    m.batch_size = b;
    m.total_qo = plan->total_qo;
    m.num_items = s->num_items;
    m.num_workers = s->num_workers;
    m.num_merge_rows = s->num_merge_rows;
    m.upload_seq = ps->upload_seq;
    memcpy(base, &m, sizeof m);
    return at;
}

/* The last copy out of staging is done: a kernel that read it has said so. */
static bool copy_done(const fi_cuda_plan *ps) {
    return ps->upload_done &&
           __atomic_load_n(ps->upload_done, __ATOMIC_ACQUIRE) == ps->upload_seq;
}

/* A device page table (fi_plan_config.device_page_table): its entries must lie
 * inside one device allocation, 4-byte aligned. One driver call. */
static fi_status check_device_table(const fi_plan *plan, const fi_cu_api *cu) {
    const int32_t nnz = plan->kv_indptr[plan->batch_size];
    if (!plan->config.device_page_table || nnz == 0) return FI_OK;
    const CUdeviceptr p = (CUdeviceptr)(uintptr_t)plan->kv_indices;
    if (p % 4)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "kv_indices (device table) at %#llx is not "
                        "4-byte aligned", (unsigned long long)p);
    CUdeviceptr base = 0;
    size_t bytes = 0;
    CUresult r = cu->MemGetAddressRange(&base, &bytes, p);
    if (r != 0) {
        const char *name = NULL;
        if (cu->GetErrorName(r, &name) != 0 || !name) name = "?";
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "kv_indices (device table) at %#llx is not "
                        "device memory of the plan's context (cuMemGetAddressRange: %s)",
                        (unsigned long long)p, name);
    }
    if (p + (CUdeviceptr)nnz * 4 > base + bytes)
        return fi_error(FI_STATUS_INVALID_ARGUMENT, "kv_indices (device table): %d entries at "
                        "%#llx run past the end of their allocation (%zu bytes from %#llx)",
                        (int)nnz, (unsigned long long)p, bytes, (unsigned long long)base);
    return FI_OK;
}

fi_status fi_cuda_plan_upload(fi_plan *plan) {
    fi_cuda_plan *ps = plan->backend_state;
    const fi_cu_api *cu = ps->cc->cu;
    if (plan->schedule.num_workers > (int32_t)ps->grid_x)
        return fi_error(FI_STATUS_INTERNAL, "schedule has %d workers, the grid %u",
                        (int)plan->schedule.num_workers, ps->grid_x);
    bool pushed;
    fi_status st = fi_cuda_enter(ps->cc, &pushed);
    if (st) return st;
    if ((st = check_device_table(plan, cu))) {
        fi_cuda_leave(ps->cc, pushed);
        return st;
    }
    CUresult r = 0;
    const char *call = NULL;
    int capturing = FI_CU_CAPTURE_NONE;
    /* The copy goes on the stream the plan last ran on; it must not be in
     * the middle of a graph capture (plan outside the captured region). */
    if ((r = cu->StreamIsCapturing(ps->last_stream, &capturing)) != 0) call = "cuStreamIsCapturing";
    else if (capturing != FI_CU_CAPTURE_NONE) {
        fi_cuda_leave(ps->cc, pushed);
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "fi_plan_update while the plan's stream is being captured into a CUDA "
                        "graph: update the plan outside the captured region");
    }
    /* The previous copy must have left staging before it is rewritten: done
     * when a kernel of a run has written its number into upload_done (a
     * read of host memory, where waiting for the event, already complete,
     * is a driver call that costs more than the rest of the update),
     * else waited for (two updates without a run between them). */
    if (!call && ps->upload_recorded && !copy_done(ps) &&
        (r = cu->EventSynchronize(ps->uploaded)) != 0)
        call = "cuEventSynchronize";
    if (!call) {
        ps->upload_seq++; /* a failed copy leaves it ahead of the word: the event decides */
        size_t bytes = pack(plan, ps, ps->staging);
        if (!bytes) {
            fi_cuda_leave(ps->cc, pushed);
            return fi_error(FI_STATUS_INTERNAL, "a merge row's sources are not evenly spaced");
        }
        if ((r = cu->MemcpyHtoDAsync(ps->meta, ps->staging, bytes, ps->last_stream)) != 0)
            call = "cuMemcpyHtoDAsync";
        else if ((r = cu->EventRecord(ps->uploaded, ps->last_stream)) != 0)
            call = "cuEventRecord";
    }
    fi_cuda_leave(ps->cc, pushed);
    if (call) return fi_cu_error(cu, call, r);
    ps->upload_recorded = 1;
    ps->upload_stream = ps->last_stream;
    ps->ordered_stream = ps->last_stream;
    return FI_OK;
}

/* Queued on last_stream, where fi_cuda_plan_upload puts the metadata copy
 * and records `uploaded` after it: a run on any stream waits for that
 * event, hence for this copy. The copy is waited for here (the event
 * recorded after it), so the caller may rewrite the source on return:
 * the driver does not promise that for pageable memory. */
fi_status fi_cuda_plan_copy_in(fi_plan *plan, void *dst, const void *src, size_t bytes) {
    fi_cuda_plan *ps = plan->backend_state;
    const fi_cu_api *cu = ps->cc->cu;
    bool pushed; /* the context pushed only where the thread lacks it */
    fi_status st = fi_cuda_enter(ps->cc, &pushed);
    if (st) return st;
    int capturing = FI_CU_CAPTURE_NONE;
    CUresult r = cu->StreamIsCapturing(ps->last_stream, &capturing);
    const char *call = r != 0 ? "cuStreamIsCapturing" : NULL;
    if (!call && capturing == FI_CU_CAPTURE_NONE) {
        if ((r = cu->MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes, ps->last_stream)))
            call = "cuMemcpyHtoDAsync";
        else if ((r = cu->EventRecord(ps->uploaded, ps->last_stream)) != 0)
            call = "cuEventRecord";
        else if ((r = cu->EventSynchronize(ps->uploaded)) != 0)
            call = "cuEventSynchronize";
        else
            ps->upload_recorded = 1;
    }
    fi_cuda_leave(ps->cc, pushed);
    if (call) return fi_cu_error(cu, call, r);
    if (capturing != FI_CU_CAPTURE_NONE)
        return fi_error(FI_STATUS_INVALID_ARGUMENT,
                        "update while the plan's stream is being captured into a CUDA graph: "
                        "update outside the captured region");
    return FI_OK;
}
