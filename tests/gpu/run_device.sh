#!/usr/bin/env bash
# run_device.sh — the CUDA backend on the GPU machine, in one call: build
# there, JIT (cold compile vs warm load), graph capture/replay across
# batches, the attention harness on the cuda backend against the fp64
# oracle, BENCH.md's decode cells, cascades / block-sparse attention
# (tests/gpu/run_cascade.sh) and user-defined variants (test_cuda_variants,
# bench_variant). Logs under $OUT (or /tmp/fi-out); a short table last.
#   tests/gpu/run_device.sh [--quick] [--no-bench] [--no-harness] [--no-decode]
#                           [--no-torch] [--no-cascade] [--no-variants]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-out}
mkdir -p "$OUT"
QUICK="" BENCH=1 HARNESS=1 DECODE=1 TORCH=1 CASCADE=1 VARIANTS=1
for a in "$@"; do
    case $a in
        --quick) QUICK="--quick" ;;
        --no-bench) BENCH=0 ;;
        --no-harness) HARNESS=0 ;;
        --no-decode) DECODE=0 ;;
        --no-torch) TORCH=0 ;;
        --no-cascade) CASCADE=0 ;;
        --no-variants) VARIANTS=0 ;;
    esac
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
JOBS=$(nproc)
status=0
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv \
    | tee "$OUT/gpu.txt"
nvcc --version | tail -1

stamp "build"
if ! make -j"$JOBS" -s lib gpu build/test_attention > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi

stamp "test_cuda (JIT cold/warm, device ordinals, graph replay across batches)"
FLASHINFER_CACHE_DIR=$(mktemp -d) ./build/test_cuda 2>&1 | tee "$OUT/test_cuda.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

stamp "test_cuda_ops (merge_state(s), append_paged_kv_cache, RoPE vs the fp64 references; graphs)"
./build/test_cuda_ops $QUICK 2>&1 | tee "$OUT/test_cuda_ops.log" | grep -v "^PASS"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

if [ "$VARIANTS" = 1 ]; then
    stamp "test_cuda_variants (example variants x formats x decode/prefill x dtypes x dims x split vs the fp64 oracle with hooks)"
    ./build/test_cuda_variants $QUICK 2>&1 | tee "$OUT/test_cuda_variants.log" | grep -v "^PASS"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if [ "$HARNESS" = 1 ]; then
    stamp "JIT cache warm-up for the harness ($JOBS processes)"
    ./build/test_attention --list --backend cuda $QUICK | python3 tests/gpu/harness_configs.py \
        | ./build/jit_compile --warm -j "$JOBS" 2>&1 | tee "$OUT/warm.log"
    stamp "attention harness, backend cuda, one process per suite"
    pids=()
    for s in oracle format variant dtype headdim plan edge determinism; do
        ./build/test_attention --backend cuda --filter "cuda/$s/" $QUICK > "$OUT/harness_$s.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    grep -h "^FAIL" "$OUT"/harness_*.log | head -40
    for s in format variant dtype headdim plan edge determinism; do
        printf '%-12s %s\n' "$s" "$(grep -hiE 'total|passed|failed' "$OUT/harness_$s.log" | tail -1)"
    done | tee "$OUT/harness_summary.txt"
fi

if [ "$BENCH" = 1 ]; then
    stamp "prefill benchmark (BENCH.md cells, tensor-core kernel)"
    ./build/bench_prefill --json "$OUT/bench_prefill.json" 2>&1 | tee "$OUT/bench_prefill.log" \
        | grep -v "^|" || status=1
    if [ "$TORCH" = 1 ] && python3 -c "import torch" 2>/dev/null; then
        stamp "torch SDPA (flash, cuDNN) on the prefill cells"
        python3 tests/gpu/bench_prefill_torch.py --json "$OUT/bench_prefill_torch.json" 2>&1 \
            | tee "$OUT/bench_prefill_torch.log"
    fi
fi
if [ "$BENCH" = 1 ] && [ "$VARIANTS" = 1 ]; then
    stamp "variant benchmark (JIT cold/warm, fused RoPE vs a separate pass)"
    ./build/bench_variant --json "$OUT/bench_variant.json" 2>&1 | tee "$OUT/bench_variant.log" \
        | grep -v "^|" || status=1
fi
if [ "$BENCH" = 1 ] && [ "$DECODE" = 1 ]; then
    stamp "decode benchmark (BENCH.md cells)"
    ./build/bench_decode --json "$OUT/bench_decode.json" 2>&1 | tee "$OUT/bench.log" | grep -v "^|"
    stamp "decode benchmark, contiguous pages per request (FlashInfer's benchmark layout)"
    ./build/bench_decode --contiguous --json "$OUT/bench_decode_contig.json" 2>&1 \
        | tee "$OUT/bench_contig.log" | grep -v "^|"
fi

if [ "$CASCADE" = 1 ]; then
    stamp "cascades and block-sparse (tests/gpu/run_cascade.sh)"
    cargs=($QUICK)
    [ "$BENCH" = 0 ] && cargs+=(--no-bench)
    OUT="$OUT" tests/gpu/run_cascade.sh "${cargs[@]}" > "$OUT/cascade.log" 2>&1 || status=1
    tail -30 "$OUT/cascade.log"
fi

stamp "done (status $status)"
[ -f "$OUT/harness_summary.txt" ] && cat "$OUT/harness_summary.txt"
[ -f "$OUT/bench_prefill.log" ] && echo "prefill:" && grep "^|" "$OUT/bench_prefill.log"
[ -f "$OUT/bench_variant.log" ] && echo "variants:" && grep "^|" "$OUT/bench_variant.log"
[ -f "$OUT/bench.log" ] && echo "random pages:" && grep "^|" "$OUT/bench.log"
[ -f "$OUT/bench_contig.log" ] && echo "contiguous pages:" && grep "^|" "$OUT/bench_contig.log"
exit $status
