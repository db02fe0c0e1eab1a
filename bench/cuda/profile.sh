#!/usr/bin/env bash
# profile.sh — hardware counters (Nsight Compute) of benchmark cells on the
# GPU machine, ours beside FlashInfer's kernels on the same cell: time, DRAM
# bytes and throughput, L2 hit rate, occupancy and its limits, tensor-pipe
# use, and warp stall reasons per issued instruction; one column per kernel
# in a markdown table ($OUT/profile.md). Needs ncu and, for the peer,
# FlashInfer's wheels on PYTHONPATH.
#   bench/cuda/profile.sh [--decode BxL] [--mix NAME] [--prefill BxL] [--no-build]
#                         [--no-flashinfer]
# Each option may repeat; with none, --decode 64x16384. A decode cell runs
# bench_decode (FlashInfer: its tensor-core and CUDA-core decode), a mix
# bench_mixed (FlashInfer: BatchAttention), a prefill cell bench_prefill paged
# and ragged (FlashInfer: its fa2 prefill). Logs and CSV under $OUT (or
# /tmp/fi-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-out}
mkdir -p "$OUT"
DECODES="" MIXES="" PREFILLS="" BUILD=1 FI=1
while [ $# -gt 0 ]; do
    case $1 in
        --decode) DECODES="$DECODES $2"; shift ;;
        --mix) MIXES="$MIXES $2"; shift ;;
        --prefill) PREFILLS="$PREFILLS $2"; shift ;;
        --no-build) BUILD=0 ;;
        --no-flashinfer) FI=0 ;;
        *) echo "unknown option $1"; exit 2 ;;
    esac
    shift
done
[ -z "$DECODES$MIXES$PREFILLS" ] && DECODES=64x16384
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
export PATH=$PATH:/usr/local/cuda/bin
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
[ "$FI" = 1 ] && ! python3 -c "import flashinfer" 2>/dev/null && { echo "FlashInfer not importable"; FI=0; }
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
# name kernel-regex launches command...: the kernels of one launch (after two
# warm-up launches) into $OUT/ncu_NAME.csv
profile() {
    local name=$1 re=$2 count=$3
    shift 3
    "$NCU" --clock-control none --csv --page raw -k "regex:$re" --launch-skip 2 \
        --launch-count "$count" --metrics "$METRICS" "$@" > "$OUT/ncu_$name.csv" 2> "$OUT/ncu_$name.err"
    echo "ncu $name: exit $?, $(grep -c . "$OUT/ncu_$name.csv") lines"
}
FIB=bench/cuda/bench_flashinfer.py
for c in $DECODES; do
    ./build/bench_decode --cells "$c" --reps 3 > /dev/null 2>&1 # the JIT, outside the profiler
    profile "decode_$c" fi_pers 1 ./build/bench_decode --cells "$c" --reps 3
    if [ "$FI" = 1 ]; then
        # use_tensor_cores=True runs its batch prefill kernel; False its decode kernel
        profile "fi_decode_tc_$c" BatchPrefill 1 python3 "$FIB" --decode --cells "$c"
        profile "fi_decode_cc_$c" BatchDecode 1 python3 "$FIB" --decode --cells "$c"
    fi
done
for m in $MIXES; do
    ./build/bench_mixed --mix "$m" --reps 3 > /dev/null 2>&1
    profile "mix_$m" fi_pers 1 ./build/bench_mixed --mix "$m" --reps 3
    [ "$FI" = 1 ] && profile "fi_mix_$m" "Persistent|BatchAttention|Batch" 2 \
        python3 "$FIB" --mixed --mix "$m"
done
for c in $PREFILLS; do
    ./build/bench_prefill --cells "$c" --reps 3 > /dev/null 2>&1
    for kv in paged ragged; do
        profile "prefill_${kv}_$c" "fi_(pers|attn)" 1 ./build/bench_prefill --cells "$c" \
            --"$kv"-only --reps 3
        if [ "$FI" = 1 ]; then
            Kv=$([ "$kv" = paged ] && echo Paged || echo Ragged)
            profile "fi_prefill_${kv}_$c" "BatchPrefillWith${Kv}KVCache" 1 \
                python3 "$FIB" --prefill --cells "$c"
        fi
    done
done
# one column per profiled kernel, a row per metric
python3 - "$OUT" <<'EOF' | tee "$OUT/profile.md"
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
        "sm__pipe_tensor", "sm__cycles_active", "smsp__inst_executed.sum",
        "smsp__issue_active.avg", "l1tex__", "smsp__average_warps_issue_stalled")
keys = sorted({k for c in cols.values() for k in c if k.startswith(want)})
print("| metric | " + " | ".join(cols) + " |")
print("|---|" + "---|" * len(cols))
for k in keys:
    vals = [cols[c].get(k, "") for c in cols]
    name = k
    if k.startswith("smsp__average_warps_issue_stalled"):
        try:  # stall reasons that matter only
            if max(float(v.replace(",", "")) for v in vals if v) < 0.05:
                continue
        except ValueError:
            pass
        name = k.replace("smsp__average_warps_issue_stalled_", "stall ").replace(
            "_per_issue_active.ratio", "")
    print(f"| {name} | " + " | ".join(vals) + " |")
EOF
