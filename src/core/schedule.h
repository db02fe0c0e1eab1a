/*
 * schedule.h — sizing the scheduler's fixed arrays from a plan's bounds.
 * The scheduler itself (fi_schedule_init / _build / ...) is declared in
 * core/internal.h; see src/core/schedule.c and docs/SCHEDULER.md.
 */
#ifndef FI_SCHEDULE_H
#define FI_SCHEDULE_H

#include "core/internal.h"

/* Keys below which a KV span is never split (split mode "auto"), so that a
 * small batch does not turn into slivers whose merge costs more than it saves.
 * Chunk sizes are also rounded up to a multiple of FI_SCHEDULE_CHUNK_ALIGN. */
#define FI_SCHEDULE_MIN_CHUNK 256
#define FI_SCHEDULE_CHUNK_ALIGN 16

/* The least chunk bound for a batch of S (weighted) keys on N slots:
 * FI_SCHEDULE_MIN_CHUNK, halved when chunks of that size would fill under a
 * quarter of the slots. A few short spans then run as twice the items, each
 * half as long: with so few items a GPU's CTAs are latency-bound, and the
 * larger merge costs less than half the tiles (measured on a GPU: halving
 * further, or halving a batch that already fills the slots, was slower;
 * docs/SCHEDULER.md). */
static inline int64_t fi_schedule_min_chunk(double S, int64_t N) {
    return 4.0 * S < (double)FI_SCHEDULE_MIN_CHUNK * (double)N ? FI_SCHEDULE_MIN_CHUNK / 2
                                                                : FI_SCHEDULE_MIN_CHUNK;
}

/* The longest piece of a span under chunk bound L: a sliver remainder (under
 * FI_SCHEDULE_MIN_CHUNK keys and at most L / 8) is spread over the span's
 * other chunks (schedule.c, auto_chunks), and a span of one chunk and a
 * sliver is left whole. */
#define FI_SCHEDULE_MAX_PIECE(L) \
    (((int64_t)(L) + ((int64_t)(L) + 7) / 8 + FI_SCHEDULE_CHUNK_ALIGN - 1) / \
     FI_SCHEDULE_CHUNK_ALIGN * FI_SCHEDULE_CHUNK_ALIGN)

/* Limits for a plan whose batches have at most max_batch_size requests and
 * max_total_qo query tokens, run by num_workers workers, automatic split-KV
 * (or split disabled):
 *   max_items        = max_total_qo + num_workers
 *   max_partial_rows = min(3 * num_workers, max_total_qo + num_workers)
 * Every batch within the first two bounds fits (proof in schedule.c): the
 * item count is exact worst case, and the partial-row figure is a budget the
 * scheduler honours by choosing a longer chunk when a batch would need more.
 * A decode batch (one token per request) never needs more than it. Plans
 * raise the budget to fi_plan_split_rows (core/internal.h), so that a few
 * wide tiles can split as finely as decodes. */
void fi_schedule_limits_for(fi_schedule_limits *lim, int32_t max_batch_size,
                            int32_t max_total_qo, int32_t num_workers);

/* Limits for fixed_split_size > 0, where chunks cannot be made longer to fit
 * a budget: max_kv_len is the longest request's key count the plan accepts
 * (e.g. max_total_kv tokens). Worst case, every query token is split into
 * ceil(max_kv_len / F) + 1 chunks:
 *   max_items = max_partial_rows = max_total_qo * (ceil(max_kv_len / F) + 1)
 * (saturated at INT32_MAX / 2). For decode-sized bounds this is small; for
 * prefill-sized bounds it is large: the price of batch invariance. */
void fi_schedule_limits_for_fixed_split(fi_schedule_limits *lim,
                                        int32_t max_batch_size,
                                        int32_t max_total_qo, int64_t max_kv_len,
                                        int32_t num_workers,
                                        int32_t fixed_split_size);

#endif /* FI_SCHEDULE_H */
