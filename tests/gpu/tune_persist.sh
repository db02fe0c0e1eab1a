#!/usr/bin/env bash
# tune_persist.sh — one device call for the persistent kernel and decode
# version 3: build, check (test_cuda: graphs with the persistent and the
# separate kernels; the quick attention harness on the cuda backend against
# the fp64 oracle), then time side by side: decode (v3 persistent, v2 inside
# the persistent kernel, v2 separate kernels as before) and prefill
# (persistent vs separate). Logs under $OUT; a short table last.
#   tests/gpu/tune_persist.sh [--no-harness] [--full] [--decode-cells LIST]
# --full: the whole attention harness (not --quick) and all 16 decode cells
# for the default configuration.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-out}
mkdir -p "$OUT"
HARNESS=1 QUICK=--quick CELLS=1x1024,1x32768,16x4096,16x32768,64x16384,256x1024,256x16384
while [ $# -gt 0 ]; do
    case $1 in
        --no-harness) HARNESS=0 ;;
        --full) QUICK="" ;;
        --decode-cells) CELLS=$2; shift ;;
    esac
    shift
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
JOBS=$(nproc)
status=0
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

stamp "build"
if ! make -j"$JOBS" -s lib gpu build/test_attention > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
stamp "JIT warm-up (persistent kernels of the harness; the benches' kernels)"
printf '%s\n' "1 1 0 0 0 2 2 2 128 128 32 8" "0 1 0 0 0 2 2 2 128 128 32 8" \
    "1 0 0 0 0 2 2 2 128 128 32 8" "1 0 0 0 0 2 2 2 128 128 8 2" > "$OUT/bench_configs.txt"
./build/test_attention --list --backend cuda $QUICK | python3 tests/gpu/harness_configs.py \
    | cat - "$OUT/bench_configs.txt" > "$OUT/configs.txt"
./build/jit_compile --warm -j "$JOBS" < "$OUT/configs.txt" 2>&1 | tail -3
FLASHINFER_CUDA_PERSIST=0 ./build/jit_compile --warm -j "$JOBS" < "$OUT/bench_configs.txt" 2>&1 | tail -1

stamp "test_cuda (graph replay across batches: persistent and separate kernels)"
timeout 120 ./build/test_cuda > "$OUT/test_cuda.log" 2>&1 || status=1
grep -E "FAIL|graph \(|passed|failed" "$OUT/test_cuda.log" | head -30

harness() { # options
    stamp "attention harness $*, backend cuda"
    pids=()
    for s in format variant dtype headdim plan edge determinism; do
        timeout 150 ./build/test_attention --backend cuda --filter "cuda/$s/" "$@" \
            > "$OUT/harness_$s.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    grep -h "^FAIL" "$OUT"/harness_*.log | head -30
    for s in format variant dtype headdim plan edge determinism; do
        printf '%-12s %s\n' "$s" "$(grep -hiE 'total' "$OUT/harness_$s.log" | tail -1)"
    done | tee "$OUT/harness_summary.txt"
}
[ "$HARNESS" = 1 ] && harness --quick

dec() { # name, cells, env...
    local name=$1 cells=$2; shift 2
    stamp "decode $name"
    env "$@" timeout 90 ./build/bench_decode --cells "$cells" --json "$OUT/decode_$name.json" \
        > "$OUT/decode_$name.log" 2>&1 || status=1
}
ALL=1x1024,1x4096,1x16384,1x32768,16x1024,16x4096,16x16384,16x32768,64x1024,64x4096,64x16384,64x32768,256x1024,256x4096,256x16384,256x32768
dec v3 "$([ -z "$QUICK" ] && echo $ALL || echo $CELLS)"
dec v3_workers_x "$CELLS" FLASHINFER_CUDA_HEADS_X=0
dec v3_split_all "$CELLS" FLASHINFER_CUDA_SPLIT_WORKERS=0
dec v3_call1 "$CELLS" FLASHINFER_CUDA_HEADS_X=0 FLASHINFER_CUDA_SPLIT_WORKERS=0
dec v3_stages2 "$CELLS" FLASHINFER_CUDA_DEFINES=-DFI_DTC_STAGES=2
dec v2_separate "$CELLS" FLASHINFER_CUDA_PERSIST=0
pre() {
    local name=$1; shift
    stamp "prefill $name"
    env "$@" timeout 90 ./build/bench_prefill --cells 128x1024,16x8192,1x16384 \
        --json "$OUT/prefill_$name.json" > "$OUT/prefill_$name.log" 2>&1 || status=1
}
pre persist
pre separate FLASHINFER_CUDA_PERSIST=0
pre persist_again

[ "$HARNESS" = 1 ] && [ -z "$QUICK" ] && harness
stamp "done (status $status)"
[ -f "$OUT/harness_summary.txt" ] && cat "$OUT/harness_summary.txt"
for f in "$OUT"/decode_*.log "$OUT"/prefill_*.log; do
    echo "-- $(basename "$f" .log)"; grep "^| [0-9]\|^| paged\|^| ragged" "$f"
done
exit $status
