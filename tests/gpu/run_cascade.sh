#!/usr/bin/env bash
# run_cascade.sh — cascades and block-sparse attention on the GPU machine
# (issue 6): test_cascade and test_bsr on the cuda backend against the fp64
# oracle (several processes, so the JIT compiles in parallel), then
# build/bench_cuda_cascade and, when FlashInfer imports, its
# MultiLevelCascadeAttentionWrapper on the same cells in the same run.
# Called by tests/gpu/run_device.sh (skip with --no-cascade there), or alone.
# Logs and JSON under $OUT (or /tmp/fi-out); tables last.
#   tests/gpu/run_cascade.sh [--quick] [--no-bench] [--no-tests] [--no-flashinfer] [--no-build]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-out}
mkdir -p "$OUT"
QUICK="" BENCH=1 TESTS=1 FI=1 BUILD=1
for a in "$@"; do
    case $a in
        --quick) QUICK="--quick" ;;
        --no-bench) BENCH=0 ;;
        --no-tests) TESTS=0 ;;
        --no-flashinfer) FI=0 ;;
        --no-build) BUILD=0 ;;
    esac
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
status=0
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

if [ "$BUILD" = 1 ]; then
    stamp "build (cascade)"
    if ! make -j"$(nproc)" -s lib build/test_cascade build/test_bsr build/bench_cuda_cascade \
        > "$OUT/build_cascade.log" 2>&1; then
        tail -40 "$OUT/build_cascade.log"; echo "BUILD FAILED"; exit 1
    fi
fi
FI_OK=0
if [ "$FI" = 1 ] && python3 -c "import flashinfer" 2>/dev/null; then
    FI_OK=1
    stamp "FlashInfer JIT warm-up (background, while the tests run)"
    python3 bench/cuda/bench_cascade_flashinfer.py --warm > "$OUT/flashinfer_warm.log" 2>&1 &
    fi_pid=$!
fi

if [ "$TESTS" = 1 ]; then
    stamp "test_cascade, test_bsr on cuda (one process per part)"
    pids=()
    for f in cuda/levels/L1/ cuda/levels/L2/ cuda/levels/L3/ cuda/levels/L4/ cuda/detect/; do
        n=$(echo "$f" | tr '/' '_')
        ./build/test_cascade --backend cuda --filter "$f" $QUICK > "$OUT/tc_$n.log" 2>&1 &
        pids+=($!)
    done
    for f in cuda/fixed/ cuda/variable/; do
        n=$(echo "$f" | tr '/' '_')
        ./build/test_bsr --backend cuda --filter "$f" $QUICK > "$OUT/tb_$n.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    # one log for all parts (fewer files to fetch), then a line per part
    for f in "$OUT"/tc_*.log "$OUT"/tb_*.log; do echo "### $(basename "$f")"; cat "$f"; done \
        > "$OUT/cascade_tests.log"
    grep -h "^FAIL" "$OUT"/tc_*.log "$OUT"/tb_*.log | head -20
    for f in "$OUT"/tc_*.log "$OUT"/tb_*.log; do
        printf '%-32s %s\n' "$(basename "$f")" "$(grep -E '^  total' "$f" | tail -1)"
    done | tee "$OUT/cascade_tests_summary.txt"
    rm -f "$OUT"/tc_*.log "$OUT"/tb_*.log
fi

if [ "$BENCH" = 1 ]; then
    [ "$FI_OK" = 1 ] && { stamp "waiting for the FlashInfer warm-up"; wait "$fi_pid"; tail -3 "$OUT/flashinfer_warm.log"; }
    stamp "bench_cuda_cascade (cascade cells, block-sparse densities)"
    ./build/bench_cuda_cascade --json "$OUT/bench_cascade.json" 2>&1 | tee "$OUT/bench_cascade.log" \
        | grep -v "^|"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    if [ "$FI_OK" = 1 ]; then
        stamp "FlashInfer MultiLevelCascadeAttentionWrapper, same cells"
        python3 bench/cuda/bench_cascade_flashinfer.py --json "$OUT/bench_cascade_flashinfer.json" \
            2>&1 | tee "$OUT/bench_cascade_flashinfer.log" | grep -v "^|"
        [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
fi
stamp "done (status $status)"
[ "$TESTS" = 1 ] && cat "$OUT/cascade_tests_summary.txt"
[ -f "$OUT/bench_cascade.log" ] && grep "^|" "$OUT/bench_cascade.log"
[ -f "$OUT/bench_cascade_flashinfer.log" ] && grep "^|" "$OUT/bench_cascade_flashinfer.log"
exit $status
