#!/usr/bin/env bash
# tune_decode_form.sh — one device call for the decode form of the
# persistent kernel (decode version 3 alone) and the 64-row tensor-core
# block: build with the AOT kernels, check (test_cuda: graphs replayed across
# batches; the quick attention harness and the cascade / block-sparse tests on
# the cuda backend against the fp64 oracle), then time decode side by side
# (the decode form with 2 and 3 stages, the full persistent kernel as
# before), the mixes, the cascade cells with FlashInfer's cascade in the same
# run, and with --ncu Nsight Compute counters of both forms beside
# FlashInfer's tensor-core decode. Logs under $LOGS, packed into
# $OUT/logs.tgz; a short table last.
#   tests/gpu/tune_decode_form.sh [--no-harness] [--ncu] [--no-cascade]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-out}
# a device machine may be lent again with /tmp kept: the default log
# directory starts empty
[ -n "${LOGS:-}" ] || rm -rf /tmp/fi-logs
LOGS=${LOGS:-/tmp/fi-logs}
mkdir -p "$OUT" "$LOGS"
HARNESS=1 NCU=0 CASCADE=1
for a in "$@"; do
    case $a in
        --no-harness) HARNESS=0 ;;
        --ncu) NCU=1 ;;
        --no-cascade) CASCADE=0 ;;
    esac
done
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
export PATH=$PATH:/usr/local/cuda/bin
export FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=6
JOBS=$(nproc)
status=0
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }
pack() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; }
trap pack EXIT

FI=0
if [ "$NCU" = 1 ] && python3 -c "import flashinfer" 2>/dev/null; then
    FI=1 # its decode modules (CUDA-core and tensor-core), JIT in the background
    python3 tests/gpu/bench_flashinfer.py --decode --cells 1x1024 > "$LOGS/fi_warm.log" 2>&1 &
fi
stamp "build (make gpu: AOT kernels)"
if ! make -j"$JOBS" -s lib gpu build/test_attention build/test_cascade build/test_bsr \
        build/bench_cuda_cascade > "$LOGS/build.log" 2>&1; then
    tail -40 "$LOGS/build.log"; echo "BUILD FAILED"; exit 1
fi
stamp "JIT warm-up (the harness's plans)"
./build/test_attention --list --backend cuda --quick | python3 tests/gpu/harness_configs.py \
    > "$LOGS/configs.txt"
./build/jit_compile --warm -j "$JOBS" < "$LOGS/configs.txt" 2>&1 | tail -2

stamp "test_cuda (graphs replayed across batches)"
timeout 150 ./build/test_cuda > "$LOGS/test_cuda.log" 2>&1 || status=1
grep -E "FAIL|graph \(|passed|failed" "$LOGS/test_cuda.log" | head -20
if [ "$HARNESS" = 1 ]; then
    stamp "attention harness --quick, backend cuda"
    pids=()
    for s in format variant dtype headdim plan edge determinism; do
        timeout 150 ./build/test_attention --backend cuda --filter "cuda/$s/" --quick \
            > "$LOGS/harness_$s.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    grep -h "^FAIL" "$LOGS"/harness_*.log | head -20
    for s in format variant dtype headdim plan edge determinism; do
        printf '%-12s %s\n' "$s" "$(grep -hiE 'total' "$LOGS/harness_$s.log" | tail -1)"
    done | tee "$LOGS/harness_summary.txt"
fi

dec() { # name, env...
    local name=$1; shift
    stamp "decode $name"
    env "$@" timeout 100 ./build/bench_decode --cells "$CELLS" --json "$LOGS/decode_$name.json" \
        > "$LOGS/decode_$name.log" 2>&1 || status=1
}
CELLS=1x1024,1x32768,16x1024,16x4096,16x32768,64x1024,64x16384,256x1024,256x16384,256x32768
dec form
dec form_s3 FLASHINFER_CUDA_DEFINES=-DFI_DTC_STAGES=3
dec full FLASHINFER_CUDA_DECODE_FORM=0
stamp "mixes"
timeout 100 ./build/bench_mixed --json "$LOGS/mixed.json" > "$LOGS/mixed.log" 2>&1 || status=1
stamp "mixes without the 64-row-block full form for mostly-decode batches (FLASHINFER_CUDA_MIXED_B64=0)"
FLASHINFER_CUDA_MIXED_B64=0 timeout 100 ./build/bench_mixed --json "$LOGS/mixed_no_b64.json" \
    > "$LOGS/mixed_no_b64.log" 2>&1 || status=1
if [ "$CASCADE" = 1 ]; then
    stamp "cascade / block-sparse tests (--quick) and cells, FlashInfer's cascade beside"
    OUT=$LOGS timeout 240 tests/gpu/run_cascade.sh --quick --no-build > "$LOGS/cascade.log" 2>&1 ||
        status=1
    grep -A12 "done (status" "$LOGS/cascade.log" | head -12
fi
if [ "$NCU" = 1 ]; then
    stamp "registers and spills of the decode form (nvcc -Xptxas -v), local loads in its SASS"
    line=$(./build/jit_compile --list | grep -m1 "q2k2o2_g4r4_paged_m0w0c0p0_t0d1")
    set -- $line
    entry=$1 name=$2
    shift 2
    sh src/cuda/aot/cubin.sh nvcc "$LOGS/$name.cubin" "$entry" "$@" &&
        grep -E "Used|spill" "$LOGS/$name.log" &&
        cuobjdump -sass "$LOGS/$name.cubin" > "$LOGS/$name.sass" &&
        echo "SASS: $(grep -c HMMA "$LOGS/$name.sass") HMMA, $(grep -c 'LDL' "$LOGS/$name.sass") LDL, $(grep -c 'STL' "$LOGS/$name.sass") STL"
    rm -f "$LOGS/$name.cubin"
    stamp "Nsight Compute: full form, decode form, FlashInfer tensor-core decode (64 x 16384)"
    [ "$FI" = 1 ] && { wait; tail -2 "$LOGS/fi_warm.log"; }
    OUT=$LOGS TAG=_full FLASHINFER_CUDA_DECODE_FORM=0 timeout 100 tests/gpu/profile_decode.sh \
        --no-build --no-flashinfer > /dev/null 2>&1
    OUT=$LOGS TAG=_form timeout 150 tests/gpu/profile_decode.sh --no-build \
        $([ "$FI" = 1 ] || echo --no-flashinfer) > "$LOGS/ncu_table.md" 2>&1
fi
stamp "done (status $status)"
[ -f "$LOGS/harness_summary.txt" ] && cat "$LOGS/harness_summary.txt"
[ -f "$LOGS/ncu_table.md" ] && grep -E "^\| (metric|gpu__|dram__bytes_read|dram__throughput|launch__(grid|reg|shared|occupancy)|sm__warps|smsp__i|stall)" "$LOGS/ncu_table.md"
for f in "$LOGS"/decode_*.log "$LOGS"/mixed.log "$LOGS"/mixed_no_b64.log "$LOGS"/bench_cascade.log "$LOGS"/bench_cascade_flashinfer.log; do
    [ -f "$f" ] && { echo "-- $(basename "$f" .log)"; grep "^| [0-9a-z]" "$f" | grep -v "^| batch\|^| mix \|^| prefix\|^| density\|^| [0-9]*% "; }
done
exit $status
