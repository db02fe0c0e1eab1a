/*
 * persistent.cuh — a whole batch in one launch, as FlashInfer's
 * BatchAttention does: grid x = the plan's workers, y = KV heads (CTA
 * (w, y) runs worker w's items in queue order for KV heads y, y + gridDim.y,
 * ...), or with a.heads_x the other way round (x = KV heads, y = workers:
 * CTAs are dispatched x first, so a worker's heads run at the same time and
 * read the same pages together), 128 threads. Each item goes to the tensor-core path
 * (attention_tc.cuh's run_item) when it has >= a.tc_min_rows packed rows and
 * the configuration has that path (FI_TC = 1), else to the CUDA-core path
 * (attention.cuh's run_item); both use the same dynamic shared memory (the
 * larger of their needs, `fi_cuda_persist_smem`). With FI_DTC = 1 the
 * items of at most 16 packed rows (one m16 tile) go to decode_tc.cuh
 * (decode version 3, tensor cores) instead, and only wider ones to the
 * 128-row tensor-core path; the CUDA-core path still takes every item
 * when K/V rows cannot be copied 16 bytes at a time (a.tc_min_rows == 0).
 *
 * Split items are merged in the same launch: after an item writes its
 * partial rows, the CTA counts each of its tokens in (a.merge_count
 * [merge row][KV head], atomically); the CTA whose count completes a merge
 * row (all its sources written, by whichever CTAs) merges it for its KV
 * head's query heads (merge.cuh's merge_pair: fixed order, so bitwise the
 * same whichever CTA does it) and sets the count back to 0. No CTA waits on
 * another, so the grid need not be resident; every count is 0 again when
 * the launch ends, so a captured graph replays after any re-plan.
 *
 * Built-in variants only (soft-cap, ALiBi, masks, RoPE): a plan with a user
 * variant runs the separate kernels (its merge may carry an output hook).
 *
 * The decode form (FI_TC = 0, FI_DTC = 1) runs every item on decode
 * version 3 alone: without the 128-row path beside it, ptxas keeps decode
 * version 3 in registers (no spills; the full form then spilled ~280 bytes
 * and reloaded them in the tile loop, and now reads Q's fragments from
 * shared memory each tile instead, decode_tc.cuh Q_REGS), and 2 stages of
 * 68 KB: measured much faster on decode than the full form; three CTAs per
 * SM spilled again and ran slower (docs/BENCHMARKS.md). The host launches
 * it for batches with no item
 * wider than 16 rows; a wide item (a graph captured on a decode batch,
 * replayed after a re-plan with a prefill chunk) still runs, in 16-row
 * slices.
 *
 * Configuration: attention.cuh's -D constants, FI_TC (0/1), FI_DTC (0/1;
 * with FI_TC = 0 the decode form) and FI_PERSIST_NAME; FI_PERSIST_MIN_BLOCKS overrides the CTAs per SM the
 * registers are budgeted for (tuning).
 */
#include "attention.cuh"
#ifndef FI_TC
#define FI_TC 1
#endif
#ifndef FI_DTC
#define FI_DTC 0
#endif
#if FI_TC || FI_DTC
#include "attention_tc.cuh" /* decode_tc.cuh builds on its device functions */
#endif
#if FI_DTC
#include "decode_tc.cuh"
#endif
#include "merge.cuh"

#ifndef FI_PERSIST_NAME
#define FI_PERSIST_NAME fi_persist_default
#endif


namespace fi_pers {
constexpr bool TC = FI_TC != 0;
constexpr int NT = 128, NWARP = NT / 32, GROUP = FI_GROUP;
#if FI_TC
constexpr int TC_SMEM = fi_tc::SMEM_BYTES;
#else
constexpr int TC_SMEM = 0;
#endif
/* the decode form (FI_TC = 0, FI_DTC = 1): decode version 3 alone */
constexpr bool DECODE_FORM = !TC && FI_DTC;
#if FI_DTC
constexpr int DTC_SMEM = fi_dtc::SMEM_D;
#else
constexpr int DTC_SMEM = 0;
#endif
/* the host launches max(tensor-core bytes, 48 KB), so every CUDA-core
 * tuning (<= 48 KB, attention.cuh) fits; the decode form its own bytes */
constexpr int SMEM_BYTES = DECODE_FORM ? DTC_SMEM
                           : fi_attn::SMEM_BYTES > TC_SMEM ? fi_attn::SMEM_BYTES : TC_SMEM;
constexpr int MIN_BLOCKS = TC || DECODE_FORM ? 2 : fi_attn::MIN_BLOCKS;
static_assert(fi_attn::NT == NT, "one block size");
static_assert(!fi_v::USER, "user variants run the separate kernels");

/* Merge row r's count for KV head hkv (a.merge_count, finish_split); CLAIM:
 * merged, to be computed again (fix_rows) */
constexpr int32_t CLAIM = -1;
FI_DEV int32_t *count_word(const fi_attn_args &a, int r, int hkv) {
    return a.merge_count + (int64_t)r * a.num_kv_heads + hkv;
}

/* A partial row's merge's sources (fi_args.h) */
FI_DEV fi_merge::Sources sources(const fi_part_merge &m) {
    return {nullptr, m.first, m.n_step >> 16, m.n_step & 0xffff};
}

/* The (row, query head) pairs [0, pairs) of the rows in mrow (r = -1: not
 * this CTA's to merge), LPP lanes each, NT / LPP pairs at once. The
 * built-in merge: no output hook, no row buffer; 4 sources in flight, not
 * the separate kernel's 8 (half the code, on a path each SM runs once at an
 * item's end: measured faster on split decodes). */
template <int LPP>
FI_DEV void merge_completed(const fi_attn_args &a, const fi_view &v, const fi_item &it,
                            const fi_part_merge *mrow, int *mredo, int pairs,
                            const fi_variant_params &VP) {
    for (int pair = threadIdx.x / LPP; pair < pairs; pair += NT / LPP) {
        const fi_part_merge m = mrow[pair / GROUP];
        if (m.r >= 0 &&
            fi_merge::merge_pair<LPP, 4, false>(a, v.meta, m.tok, sources(m), it.hkv * GROUP + pair % GROUP,
                                                VP, nullptr))
            mredo[pair / GROUP] = 1;
    }
}

/* After split item `it` wrote its partial rows: count its tokens in, and
 * merge the rows this CTA completed. mrow: shared [NT], the completed rows'
 * merges (r = -1: not this CTA's to merge); mredo: shared [NT], whether
 * that merged row came out not finite: its count is left at CLAIM (-1) for
 * fix_rows to compute it again, and the call returns true. Every thread
 * calls.
 *
 * The count is the merge's only synchronisation: the barrier orders every
 * thread's partial rows before it (CTA scope), its release carries them to
 * the GPU, its acquire the other sources' rows to the barrier after it
 * (kernels/prelude.cuh, fi_atomic_add_acq_rel). The record is plan data,
 * loaded before the barrier, and names the output token and the sources
 * (evenly spaced), so the merge looks nothing else up. (A fence before the
 * barrier and one after the count, the record loaded between them, was
 * measured slower; so were tickets taken before the partial rows, the
 * merger waiting for the others' written count.) */
FI_DEV bool finish_split(const fi_attn_args &a, const fi_view &v, const fi_item &it,
                         fi_part_merge *mrow, int *mredo) {
    const fi_variant_params VP = fi_v::params(a, v.alibi);
    const int T = it.rows / GROUP;
    bool redo = false;
    for (int t0 = 0; t0 < T; t0 += NT) {
        const int t = t0 + threadIdx.x;
        fi_part_merge pm = {-1, 0, 0, 0};
        if (t < T) { /* plan data: loaded while the CTA's rows are written */
            const int4 m = __ldg(reinterpret_cast<const int4 *>(v.part_merge + it.prow + t));
            pm = {m.x, m.y, m.z, m.w};
        }
        __syncthreads(); /* the CTA's partial rows (and the last round's merges) */
        if (t < T && fi_atomic_add_acq_rel(count_word(a, pm.r, it.hkv), 1) != sources(pm).n - 1)
            pm.r = -1; /* the last source to count in merges */
        mrow[threadIdx.x] = pm;
        mredo[threadIdx.x] = 0;
        __syncthreads();
        /* (row, query head) pairs: a warp each (a decode's rows: their many
         * sources are loaded 32 at a time), or with a 128-row path and more
         * pairs than warps, LPP_WIDE lanes each, NT / LPP_WIDE pairs at once
         * (a prefill tile's 128 pairs in 4 rounds, not 32 rounds of one pair
         * per warp; the decode form keeps to warps: the wide path's
         * registers would cost it a CTA per SM at d 64). */
        const int pairs = (T - t0 < NT ? T - t0 : NT) * GROUP;
        if (!TC || pairs <= NWARP) merge_completed<32>(a, v, it, mrow, mredo, pairs, VP);
        else merge_completed<fi_merge::LPP_WIDE>(a, v, it, mrow, mredo, pairs, VP);
        __syncthreads(); /* mrow is rewritten next */
        if (t < T && pm.r >= 0) { /* every source is in */
            if (mredo[threadIdx.x]) {
                __threadfence(); /* the merged row before the claim */
                atomicExch(count_word(a, pm.r, it.hkv), CLAIM);
                redo = true;
            } else {
                *count_word(a, pm.r, it.hkv) = 0;
            }
        }
    }
    return redo;
}

/* The rows of this CTA's items (worker w's, KV heads h0, h0 + hs, ...)
 * that came out not finite, again, exactly (exact.cuh), once the items are
 * done: an unsplit item's rows as written (recheck, on the path that ran
 * it), and the merged rows of split items left at CLAIM by their merger
 * (finish_split), each taken by one CTA (the merger, or another holding a
 * source of it) and computed over the request's keys whole. A call, after
 * the item loop: inlined in it, or called from it, the path cost the tile
 * loops registers (spills; uniform arithmetic moved to IMAD + R2UR, as
 * measured in attention_wg.cuh). Every thread calls. */
__device__ __noinline__ void fix_rows(const fi_attn_args &a, int W, int w, int h0, int hs) {
    using namespace fi_attn; /* the configuration of every path */
    int ib, ie;
    fi_worker_range(a, W, w, ib, ie);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int hkv = h0; hkv < a.num_kv_heads; hkv += hs)
        for (int n = ib; n < ie; n++) {
            const fi_view v = fi_view_of(a);
            const fi_item it = fi_item_load(fi_items(a, W), n, hkv, GROUP);
            if (it.prow < 0) {
#if FI_TC && FI_DTC
                if (it.rows > fi_dtc::MAX_ROWS) fi_tc::recheck(a, v, it);
                else fi_dtc::recheck(a, v, it);
#elif FI_DTC
                fi_dtc::recheck(a, v, it);
#elif FI_TC
                if (a.tc_min_rows > 0 && it.rows >= a.tc_min_rows) fi_tc::recheck(a, v, it);
                else fi_attn::recheck(a, v, it);
#else
                fi_attn::recheck(a, v, it);
#endif
                continue;
            }
            for (int t = warp; t < it.rows / GROUP; t += NWARP) {
                const fi_part_merge pm = v.part_merge[it.prow + t];
                int claimed = 0;
                if (lane == 0) claimed = atomicCAS(count_word(a, pm.r, hkv), CLAIM, 0) == CLAIM;
                if (!__shfl_sync(0xffffffffu, claimed, 0)) continue;
                __threadfence(); /* after the merger's row */
                fi_item row = it; /* the token's rows over every key of the request */
                row.q0 = it.q0 + t;
                row.rows = GROUP;
                row.k0 = 0;
                row.k1 = it.kv_len;
                row.prow = -1;
                for (int p = 0; p < GROUP; p++)
                    fi_exact_row<QT, KT, OT, DQK, DVO, GROUP, PAGED, DEVICE_TABLE, CAUSAL, ROPE>(
                        a, row, v.kv_indices, v.mask_offset, v.alibi, p);
            }
        }
}
} /* namespace fi_pers */

extern "C" __global__ void __launch_bounds__(fi_pers::NT, fi_pers::MIN_BLOCKS)
FI_PERSIST_NAME(const __grid_constant__ fi_attn_args a) {
    using namespace fi_pers;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ fi_part_merge mrow[NT];
    __shared__ int mredo[NT];
    {
        uint32_t dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (uint32_t)SMEM_BYTES) __trap(); /* the host launched it wrong */
    }
    const int w = a.heads_x ? blockIdx.y : blockIdx.x, W = a.heads_x ? gridDim.y : gridDim.x;
    const int h0 = a.heads_x ? blockIdx.x : blockIdx.y, hs = a.heads_x ? gridDim.x : gridDim.y;
    fi_pdl_launch_dependents();
    /* the worker's range is the plan's (uploaded before any kernel this
     * launch may overlap): loaded while the kernel before still runs */
    int ib, ie;
    fi_worker_range(a, W, w, ib, ie);
    fi_pdl_wait();
    fi_mark_upload_read(a);
    bool redo = false; /* a row came out not finite (exact.cuh) */
    for (int hkv = h0; hkv < a.num_kv_heads; hkv += hs)
        for (int n = ib; n < ie; n++) {
            /* the view is re-read per item (header loads, L1 hits) rather
             * than kept live across both paths: inlined, the paths' live
             * state spilled ~200 bytes with it held */
            const fi_view v = fi_view_of(a);
            const fi_item it = fi_item_load(fi_items(a, W), n, hkv, GROUP);
            /* (fix_rows takes the same paths) */
#if FI_TC && FI_DTC
            /* the host launches this kernel only when K/V rows can be
             * copied 16 bytes at a time (a.tc_min_rows > 0) */
            if (it.rows > fi_dtc::MAX_ROWS) redo = fi_tc::run_item(a, v, it, smem) || redo;
            else redo = fi_dtc::run_item(a, v, it, smem) || redo;
#elif FI_DTC /* the decode form: wide items in 16-row slices */
            redo = fi_dtc::run_sliced(a, v, it, smem) || redo;
#elif FI_TC
            if (a.tc_min_rows > 0 && it.rows >= a.tc_min_rows) redo = fi_tc::run_item(a, v, it, smem) || redo;
            else redo = fi_attn::run_item(a, v, it, smem) || redo;
#else
            redo = fi_attn::run_item(a, v, it, smem) || redo;
#endif
            if (it.prow >= 0) redo = finish_split(a, v, it, mrow, mredo) || redo;
        }
    /* rows that came out not finite (a split item's: their merges left at
     * CLAIM), again, exactly */
    if (__syncthreads_or(redo)) fix_rows(a, W, w, h0, hs);
}
