#!/usr/bin/env bash
# profile_decode.sh — hardware counters (Nsight Compute) of one decode cell,
# ours beside FlashInfer's tensor-core decode, to see where the decode kernel
# loses to the copy ceiling: DRAM bytes and throughput, occupancy, warp stall
# reasons per issued instruction. Needs ncu (the Firecracker device image)
# and, for the peer, FlashInfer's wheels on PYTHONPATH (BENCH.md). With
# --mix NAME / --prefill CELL (repeatable), ours on those mixes (bench_mixed)
# and prefill cells (bench_prefill) beside the decode cell: the tensor-core
# path's counters.
#   tests/gpu/profile_decode.sh [--cell 64x16384] [--no-build] [--no-flashinfer]
#                               [--mix prefill] [--prefill 1x16384]
# Env: FLASHINFER_CUDA_* tuning switches pass through to ours; TAG names its
# column; MIXES_FI=1 also profiles FlashInfer's BatchAttention on each
# --mix (the four mixes; even with --no-flashinfer, which skips its decode).
# A --prefill cell is profiled paged and ragged, ours and (unless
# --no-flashinfer) FlashInfer's fa2 kernels on the same cell (its prefill
# module built first: bench_flashinfer.py --warm prefill).
# Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-out}
mkdir -p "$OUT"
CELL=64x16384 BUILD=1 FI=1 MIXES="" PREFILLS=""
while [ $# -gt 0 ]; do
    case $1 in
        --cell) CELL=$2; shift ;;
        --mix) MIXES="$MIXES $2"; shift ;;
        --prefill) PREFILLS="$PREFILLS $2"; shift ;;
        --no-build) BUILD=0 ;;
        --no-flashinfer) FI=0 ;;
    esac
    shift
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
export PATH=$PATH:/usr/local/cuda/bin
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
METRICS=$METRICS,dram__throughput.avg.pct_of_peak_sustained_elapsed
METRICS=$METRICS,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct
METRICS=$METRICS,launch__grid_size,launch__block_size,launch__registers_per_thread
METRICS=$METRICS,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers
METRICS=$METRICS,launch__occupancy_limit_shared_mem,sm__warps_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
METRICS=$METRICS,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
METRICS=$METRICS,sm__cycles_active.avg.pct_of_peak_sustained_elapsed
METRICS=$METRICS,l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum
METRICS="$METRICS,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"

if [ "$BUILD" = 1 ]; then
    make -j"$(nproc)" -s lib build/bench_decode build/bench_mixed build/bench_prefill \
        > "$OUT/profile_build.log" 2>&1 ||
        { tail -30 "$OUT/profile_build.log"; exit 1; }
fi
B=${CELL%x*} L=${CELL#*x}
# warm the JIT outside the profiler
./build/bench_decode --cells "$CELL" --reps 3 > /dev/null 2>&1
profile() { # name kernel-regex command...
    local name=$1 re=$2
    shift 2
    "$NCU" --clock-control none --csv --page raw -k "regex:$re" --launch-skip 2 --launch-count 1 \
        --metrics "$METRICS" "$@" > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
    echo "ncu $name: exit $?, $(grep -c . "$OUT/ncu_$name.csv") lines"
}
profile ours${TAG:-} fi_pers ./build/bench_decode --cells "$CELL" --reps 3
for m in $MIXES; do
    ./build/bench_mixed --mix "$m" --reps 3 > /dev/null 2>&1
    profile "mix_$m${TAG:-}" fi_pers ./build/bench_mixed --mix "$m" --reps 3
    if [ -n "${MIXES_FI:-}" ] && [[ " decode prefill hybrid chunked " == *" $m "* ]] &&
        python3 -c "import flashinfer" 2>/dev/null; then
        # FlashInfer's BatchAttention on the same mix (MIXES_FI=1; the four
        # mixes only): its kernels' first two launches after two
        "$NCU" --clock-control none --csv --page raw -k "regex:Persistent|BatchAttention|Batch" \
            --launch-skip 2 --launch-count 2 --metrics "$METRICS" \
            python3 tests/gpu/bench_flashinfer.py --mixed --mix "$m" > "$OUT/ncu_fimix_$m.csv" \
            2> "$OUT/ncu_fimix_$m.err"
        echo "ncu fimix_$m: exit $?, $(grep -c . "$OUT/ncu_fimix_$m.csv") lines"
    fi
done
for c in $PREFILLS; do
    ./build/bench_prefill --cells "$c" --reps 3 > /dev/null 2>&1
    for kv in paged ragged; do
        profile "prefill_${kv}_$c${TAG:-}" "fi_(pers|attn)" ./build/bench_prefill --cells "$c" \
            --"$kv"-only --reps 3
        if [ "$FI" = 1 ] && python3 -c "import flashinfer" 2>/dev/null; then
            Kv=$([ "$kv" = paged ] && echo Paged || echo Ragged)
            profile "fi_prefill_${kv}_$c" "BatchPrefillWith${Kv}KVCache" \
                python3 tests/gpu/bench_flashinfer.py --prefill --cells "$c"
        fi
    done
done
if [ "$FI" = 1 ] && python3 -c "import flashinfer" 2>/dev/null; then
    # its tensor-core decode (use_tensor_cores=True runs the batch prefill
    # kernel), the faster of its two on the H200
    profile flashinfer BatchPrefill python3 tests/gpu/bench_flashinfer.py --decode --cells "$CELL"
    # and its CUDA-core decode, faster on some cells
    profile flashinfer_cc BatchDecode python3 tests/gpu/bench_flashinfer.py --decode --cells "$CELL"
fi
# one column per profiled kernel, a row per metric
python3 - "$OUT" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
cols = {}
for f in sorted(glob.glob(os.path.join(out, "ncu_*.csv"))):
    rows = [r for r in csv.reader(open(f)) if r]
    hdr = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
    if hdr is None or hdr + 2 >= len(rows):
        continue
    names, data = rows[hdr], rows[hdr + 2:]
    for d in data:
        key = os.path.basename(f)[4:-4] + ":" + d[names.index("Kernel Name")][:24]
        cols[key] = dict(zip(names, d))
want = ("gpu__time_duration.sum", "dram__", "lts__", "launch__", "sm__warps_active.avg",
        "sm__pipe_tensor", "sm__cycles_active",
        "smsp__inst_executed.sum", "smsp__issue_active.avg", "l1tex__",
        "smsp__average_warps_issue_stalled")
keys = sorted({k for c in cols.values() for k in c if k.startswith(want)})
print("| metric | " + " | ".join(cols) + " |")
print("|---|" + "---|" * len(cols))
for k in keys:
    vals = [cols[c].get(k, "") for c in cols]
    if k.startswith("smsp__average_warps_issue_stalled"):
        try:
            if max(float(v.replace(",", "")) for v in vals if v) < 0.05:
                continue
        except ValueError:
            pass
        k2 = k.replace("smsp__average_warps_issue_stalled_", "stall ").replace(
            "_per_issue_active.ratio", "")
    else:
        k2 = k
    print(f"| {k2} | " + " | ".join(vals) + " |")
EOF
