#!/usr/bin/env bash
# run_device.sh — the CUDA backend on the GPU machine, in one call: build
# there (the library with its AOT kernels: `make gpu` compiles them with
# nvcc), JIT vs AOT bit for bit, JIT cold/warm, graph capture/replay across
# batches, the standalone and serving ops (test_cuda_ops, test_cuda_serving),
# compute-sanitizer (memcheck, racecheck) on a small subset, the
# attention harness on the cuda backend against the fp64 oracle, and the
# benchmarks of bench/cuda (docs/BENCHMARKS.md): the decode, prefill and mixed
# cells with the peers timed in the same run (torch SDPA flash and cuDNN;
# FlashInfer where its wheels are installed: PYTHONPATH), cascades /
# block-sparse attention (tests/gpu/run_cascade.sh), user-defined variants
# (test_cuda_variants, bench_variant), the decode cells' reads alone
# (bench_gather) and the host CPU's split-KV balance (bench_balance). The
# benchmarks' record, bench/results/<gpu>/latest.json (bench/results_json.py:
# <gpu> is the GPU's name, e.g. h200), is written in the tree and copied to
# $OUT/bench/results/<gpu>/latest.json, and its tables to $OUT/report.md.
# Logs and JSON under $LOGS (or /tmp/fi-logs), packed into $OUT/logs.tgz (or
# /tmp/fi-out) however the script ends: the device tool returns only a
# handful of files from $OUT.
#   tests/gpu/run_device.sh [--quick] [--no-bench] [--no-harness] [--no-decode]
#                           [--no-torch] [--no-flashinfer] [--fa3]
#                           [--no-sanitize] [--no-tests] [--no-ops] [--no-cascade]
#                           [--no-variants] [--no-python] [--decode-grid] [--prefill-grid]
#                           [--no-cells] [--no-aot] [--commit HASH]
# --no-aot: the library without its AOT cubins (AOT=0: every kernel by
# NVRTC into the cache, seconds on the machine's cores where nvcc's AOT set
# takes minutes); test_aot then has nothing to compare.
# --no-cells: of the benchmarks, the grids alone (not the decode, prefill,
# mixed and serving-ops cells, host overhead and balance).
# --commit: the commit the record names (default: git's HEAD, where the tree
# is a git checkout).
set -uo pipefail
cd "$(dirname "$0")/../.."
PACK=${OUT:-/tmp/fi-out}
OUT=${LOGS:-/tmp/fi-logs} # every log below goes here
# a device machine may be lent again with /tmp kept: the default log
# directory starts empty, so no earlier run's logs or JSON join this run's
[ -n "${LOGS:-}" ] || rm -rf "$OUT"
mkdir -p "$OUT" "$PACK"
pack() { tar czf "$PACK/logs.tgz.tmp" -C "$OUT" . 2>/dev/null && mv "$PACK/logs.tgz.tmp" "$PACK/logs.tgz"; }
trap pack EXIT # and at every stage (stamp): a run killed at its time limit keeps its logs
QUICK="" BENCH=1 CELLS=1 AOT=1 HARNESS=1 DECODE=1 TORCH=1 FI=1 FA3=0 GRID=0 PGRID=0 SANITIZE=1 TESTS=1 OPS=1 CASCADE=1 VARIANTS=1 PYTHON=1
COMMIT=""
while [ $# -gt 0 ]; do
    a=$1
    shift
    case $a in
        --commit) COMMIT=${1:?--commit HASH}; shift ;;
        --quick) QUICK="--quick" ;;
        --no-bench) BENCH=0 ;;
        --no-cells) CELLS=0 ;;
        --no-aot) AOT=0 ;;
        --no-harness) HARNESS=0 ;;
        --no-decode) DECODE=0 ;;
        --no-torch) TORCH=0 ;;
        --no-cascade) CASCADE=0 ;;
        --no-variants) VARIANTS=0 ;;
        --no-python) PYTHON=0 ;;
        --no-flashinfer) FI=0 ;;
        --fa3) FA3=1 ;;
        --decode-grid) GRID=1 ;;
        --prefill-grid) PGRID=1 ;;
        --no-sanitize) SANITIZE=0 ;;
        --no-tests) TESTS=0 ;;
        --no-ops) OPS=0 ;;
        *) echo "unknown option $a"; exit 2 ;;
    esac
done
export AOT # the sub-scripts' makes build the library the same way
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
export PATH=$PATH:/usr/local/cuda/bin
JOBS=$(nproc)
status=0
t0=$(date +%s)
# each stage's GPU clocks, temperature, power and throttle reasons, and the
# background processes still running (FlashInfer's module builds), into
# gpu_state.txt: what a benchmark ran under, for comparing runs
stamp() {
    pack
    echo "== [$(( $(date +%s) - t0 )) s] $*"
    { echo "[$(( $(date +%s) - t0 )) s] $* (background jobs running: $(jobs -rp | wc -l))"
      nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_event_reasons.active \
          --format=csv,noheader 2>&1; } >> "$OUT/gpu_state.txt"
}

stamp "machine"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv \
    | tee "$OUT/gpu.txt"
# the host CPU: bench_overhead's host step follows it (the same code runs
# the CPU-only part of the update up to ~2x slower on some hosts)
{ grep -m1 "model name" /proc/cpuinfo; echo "cpus: $(nproc), load: $(cut -d' ' -f1-3 /proc/loadavg)"
  grep -m1 "cpu MHz" /proc/cpuinfo; } 2>/dev/null | tee -a "$OUT/gpu.txt"
nvcc --version | tail -1

# FlashInfer JIT-compiles each module on first use (tens of seconds): build
# them now, one process per module, while our build and tests run.
fi_pids=()
if [ "$BENCH" = 1 ] && [ "$FI" = 1 ] && python3 -c "import flashinfer" 2>/dev/null; then
    export FLASHINFER_WORKSPACE_BASE=${FLASHINFER_WORKSPACE_BASE:-/tmp/fi-ws}
    export FLASHINFER_CUDA_ARCH_LIST="9.0a" MAX_JOBS=4
    mods="decode prefill attention"
    [ "$FA3" = 1 ] && mods="$mods fa3"
    stamp "FlashInfer: JIT of its modules in the background ($mods)"
    for m in $mods; do
        # fa3 (CUTLASS, sm90) is the slowest to build: given up on after
        # FI_FA3_TIMEOUT seconds rather than hold the run
        lim=0
        [ "$m" = fa3 ] && lim=${FI_FA3_TIMEOUT:-240}
        timeout "$lim" python3 bench/cuda/bench_flashinfer.py --warm "$m" > "$OUT/fi_warm_$m.log" 2>&1 &
        fi_pids+=("$m:$!")
    done
    # the serving ops' modules (norm, activation, sampling, topk, rope)
    timeout 400 python3 bench/cuda/bench_serving_peers.py --warm > "$OUT/fi_warm_serving.log" 2>&1 &
    fi_pids+=("serving:$!")
    # the grids' modules: each (head dim, K/V dtype) of the decode grid, each
    # (head dim, backend) of the prefill grid, a process each
    if [ "$GRID" = 1 ]; then
        python3 bench/cuda/bench_flashinfer.py --warm-grid bench/cuda/decode_grid.txt \
            > "$OUT/fi_warm_grid.log" 2>&1 &
        grid_pid=$!
    fi
    if [ "$PGRID" = 1 ]; then
        timeout "$([ "$FA3" = 1 ] && echo "${FI_FA3_TIMEOUT:-240}" || echo 0)" \
            python3 bench/cuda/bench_flashinfer.py --warm-prefill-grid bench/cuda/prefill_grid.txt \
            $([ "$FA3" = 1 ] && echo --fa3) > "$OUT/fi_warm_prefill_grid.log" 2>&1 &
        pgrid_pid=$!
    fi
elif [ "$BENCH" = 1 ] && [ "$FI" = 1 ]; then
    python3 -c "import flashinfer" 2>&1 | tail -3
    echo "FlashInfer not importable (install its wheels, PYTHONPATH): not timed"
    FI=0
fi

stamp "build (make gpu: library with the AOT kernels)"
# (the cascade tests too: run_cascade.sh's own make, without the gpu goal,
# would rebuild the library without its AOT table)
if ! make -j"$JOBS" -s AOT="$AOT" lib gpu build/test_attention build/test_cascade build/test_bsr build/bench_balance \
        > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; echo "BUILD FAILED"; exit 1
fi
grep -E "^aot:" "$OUT/build.log"

# the command line on a GPU machine: what `fi info` reports of the device
# and the cache; `fi warmup`'s whole default list (--dry-run) and its bf16
# d 128 part compiled into an empty cache
stamp "fi info, fi warmup (into an empty cache)"
make -s AOT="$AOT" build/fi >> "$OUT/build.log" 2>&1
./build/fi info 2>&1 | tee "$OUT/fi_info.log" || status=1
{ ./build/fi warmup --dry-run | tail -4
  FLASHINFER_CACHE_DIR=$(mktemp -d) ./build/fi warmup --head-dims 128 --dtypes bf16 -j "$JOBS"; } \
    > "$OUT/fi_warmup.log" 2>&1 || status=1
tail -6 "$OUT/fi_warmup.log"

if [ "$TESTS" = 1 ]; then
    stamp "test_aot (AOT cubins vs NVRTC, bit for bit); its NVRTC side compiled first, $JOBS at once"
    ./build/test_aot --list | ./build/jit_compile --warm -j "$JOBS" 2>&1 | tail -1
    ./build/test_aot --list | FLASHINFER_CUDA_KERNELS=separate ./build/jit_compile --warm -j "$JOBS" 2>&1 \
        | tail -1
    ./build/test_aot 2>&1 | tee "$OUT/test_aot.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1

    stamp "test_cuda (JIT cold/warm, device ordinals, graph replay across batches)"
    FLASHINFER_CACHE_DIR=$(mktemp -d) ./build/test_cuda 2>&1 | tee "$OUT/test_cuda.log"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1

fi
if [ "$TESTS" = 1 ] && [ "$OPS" = 1 ]; then
    stamp "test_cuda_ops (merge_state(s), append_paged_kv_cache, RoPE vs the fp64 references; graphs)"
    ./build/test_cuda_ops $QUICK 2>&1 | tee "$OUT/test_cuda_ops.log" | grep -v "^PASS"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    stamp "test_cuda_serving (norms, activations, RoPE cache, softmax, sampling, filters, speculative, top-k vs the CPU backend; graphs)"
    ./build/test_cuda_serving $QUICK 2>&1 | tee "$OUT/test_cuda_serving.log" | grep -v "^PASS"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

# sanitize LOG SECONDS WHAT TOOL-ARGS... -- PROGRAM ARGS...: one
# compute-sanitizer run into $OUT/LOG, its summary lines shown, its first
# reports where it fails
sanitize() {
    local log=$1 secs=$2 what=$3
    shift 3
    stamp "compute-sanitizer $what"
    timeout "$secs" compute-sanitizer --error-exitcode 3 "$@" > "$OUT/$log" 2>&1
    local rc=$?
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test_[a-z_]*:|^  total" "$OUT/$log"
    if [ "$rc" != 0 ]; then
        echo "compute-sanitizer $what FAILED (exit $rc)"
        grep -m 20 -E "=====|FAIL" "$OUT/$log"
        status=1
    fi
}

if [ "$SANITIZE" = 1 ]; then
    # decode with a split request (+ merge), prefill on tensor cores (paged,
    # causal), ragged group 8, against the oracle; small shapes
    for tool in memcheck racecheck; do
        sanitize "sanitize_$tool.log" 90 "--tool $tool: build/test_aot --one" --tool "$tool" \
            ./build/test_aot --one
    done
    # the serving ops on small shapes (every op, dtype and layout), and
    # device-tensor values the CPU refuses: handled inside the buffers
    sanitize sanitize_serving.log 300 "--tool memcheck: build/test_cuda_serving, small shapes" \
        --tool memcheck ./build/test_cuda_serving --quick \
        --filter /h7/ --filter /d7/ --filter /v7/ --filter /v9/ --filter /v37/ --filter _v50/ \
        --filter r5_n40_k5/ --filter h4_2_d64 --filter bad_input/device_values
    # device page tables with ids out of range: clamped inside the cache
    # (--report-api-errors no: the test makes the driver refuse a host
    # address on purpose)
    sanitize sanitize_table.log 120 "--tool memcheck: build/test_cuda --table" \
        --tool memcheck --report-api-errors no ./build/test_cuda --table
fi

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
    SUITES="oracle format variant dtype headdim plan edge nonfinite determinism graph table"
    for s in $SUITES; do
        ./build/test_attention --backend cuda --filter "cuda/$s/" $QUICK > "$OUT/harness_$s.log" 2>&1 &
        pids+=($!)
    done
    failed=()
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { status=1; failed+=("$(echo $SUITES | cut -d' ' -f$((i + 1)))"); }
    done
    grep -h "^FAIL" "$OUT"/harness_*.log | head -40
    # A failing suite is run again on the separate kernels (no persistent
    # kernel), to tell a new path's fault from an old one.
    for s in "${failed[@]}"; do
        stamp "harness suite $s again with FLASHINFER_CUDA_KERNELS=separate"
        FLASHINFER_CUDA_KERNELS=separate ./build/test_attention --backend cuda \
            --filter "cuda/$s/" $QUICK > "$OUT/harness_fallback_$s.log" 2>&1
        echo "fallback $s: $(grep -hiE 'total|passed|failed' "$OUT/harness_fallback_$s.log" | tail -1)"
    done
    for s in ${SUITES#oracle }; do
        printf '%-12s %s\n' "$s" "$(grep -hiE 'total|passed|failed' "$OUT/harness_$s.log" | tail -1)"
    done | tee "$OUT/harness_summary.txt"
fi

if [ "$PYTHON" = 1 ]; then
    stamp "Python package on the GPU (tests/python/run_device.sh)"
    OUT="$OUT/python" FI_PYTHON_TEST_LIMIT=120 tests/python/run_device.sh > "$OUT/python.log" 2>&1 \
        || status=1
    grep "SUMMARY" "$OUT/python.log" || tail -5 "$OUT/python.log"
fi

# FlashInfer's background module builds waited for (once); fa3="--fa3"
# where its fa3 module built
fi_waited=0 fa3=""
wait_fi_modules() {
    [ "$FI" = 1 ] && [ "$fi_waited" = 0 ] || return 0
    fi_waited=1
    stamp "FlashInfer: waiting for its module builds"
    for mp in "${fi_pids[@]}"; do
        if wait "${mp#*:}"; then
            [ "${mp%%:*}" = fa3 ] && fa3="--fa3"
        else
            echo "FlashInfer module ${mp%%:*} did not build:"; tail -5 "$OUT/fi_warm_${mp%%:*}.log"
        fi
    done
    cat "$OUT"/fi_warm_*.log | grep "warm"
}

if [ "$BENCH" = 1 ] && [ "$CELLS" = 1 ]; then
    stamp "prefill benchmark (the prefill cells, tensor-core kernel)"
    ./build/bench_prefill --json "$OUT/bench_prefill.json" 2>&1 | tee "$OUT/bench_prefill.log" \
        | grep -v "^|" || status=1
    stamp "prefill benchmark, head dim 256 (16/8 heads)"
    ./build/bench_prefill --heads 16/8 --head-dim 256 --cells 32x4096,1x16384 \
        --json "$OUT/bench_prefill_d256.json" 2>&1 | tee "$OUT/bench_prefill_d256.log" \
        | grep -v "^|" || status=1
    stamp "mixed-batch benchmark (the four mixes)"
    ./build/bench_mixed --json "$OUT/bench_mixed.json" 2>&1 | tee "$OUT/bench_mixed.log" \
        | grep -v "^|" || status=1
    stamp "mixed and some decode cells with device page tables (the kernels that clamp ids)"
    ./build/bench_mixed --device-table --json "$OUT/bench_mixed_dtable.json" \
        > "$OUT/bench_mixed_dtable.log" 2>&1 || status=1
    ./build/bench_decode --device-table --cells 1x1024,16x4096,64x1024,256x16384 \
        --json "$OUT/bench_decode_dtable.json" > "$OUT/bench_decode_dtable.log" 2>&1 || status=1
    if [ "$DECODE" = 1 ]; then
        stamp "decode benchmark (the decode cells)"
        ./build/bench_decode --json "$OUT/bench_decode.json" 2>&1 | tee "$OUT/bench.log" | grep -v "^|"
        stamp "decode benchmark, FP8 K/V (E4M3, E5M2)"
        for t in e4m3 e5m2; do
            ./build/bench_decode --kv-dtype $t --json "$OUT/bench_decode_$t.json" 2>&1 \
                | tee "$OUT/bench_decode_$t.log" | grep -v "^|" || status=1
        done
        stamp "decode benchmark, contiguous pages per request (FlashInfer's benchmark layout)"
        ./build/bench_decode --contiguous --json "$OUT/bench_decode_contig.json" 2>&1 \
            | tee "$OUT/bench_contig.log" | grep -v "^|"
        stamp "the decode cells' reads alone (bench_gather: loads only, the access pattern's ceiling)"
        { make -s AOT="$AOT" build/bench_gather && ./build/bench_gather --json "$OUT/bench_gather.json"; } \
            > "$OUT/bench_gather.log" 2>&1 || status=1
        grep -E "copy of|65536 \| random" "$OUT/bench_gather.log"
        sed -n '/in flight per CTA/,$p' "$OUT/bench_gather.log" | grep "^| [0-9]"
    fi
    if [ "$TORCH" = 1 ] && python3 -c "import torch" 2>/dev/null; then
        stamp "torch SDPA (flash, cuDNN) on the prefill and decode cells"
        python3 bench/cuda/bench_torch.py --prefill $([ "$DECODE" = 1 ] && echo --decode) \
            --json "$OUT/bench_torch.json" > "$OUT/bench_torch.log" 2>&1
        grep -vE "^torch (flash|cudnn)" "$OUT/bench_torch.log" | head -20
    fi
    wait_fi_modules
    stamp "serving ops benchmark (norms, activations, softmax, sampling, top-k, RoPE cache: GB/s)"
    ./build/bench_serving --json "$OUT/bench_serving.json" 2>&1 | tee "$OUT/bench_serving.log" \
        | grep -v "^|" || status=1
    if python3 -c "import torch" 2>/dev/null; then
        stamp "the serving ops' peers on the same cells (FlashInfer's ops, torch's compositions)"
        peers=$([ "$FI" = 1 ] || echo "--peer torch")
        python3 bench/cuda/bench_serving_peers.py $peers --json "$OUT/bench_serving_peers.json" \
            > "$OUT/bench_serving_peers.log" 2>&1 || status=1
        grep -E "^(flashinfer|torch) " "$OUT/bench_serving_peers.log" | head -200
    fi
    # host timing: after FlashInfer's compiler processes are gone
    stamp "host overhead of a 256-request decode step"
    ./build/bench_overhead --json "$OUT/bench_overhead.json" 2>&1 | tee "$OUT/bench_overhead.log" \
        | grep -v "^|" || status=1
    stamp "split-KV balance on the host CPU ($JOBS threads)"
    ./build/bench_balance --threads "$JOBS" --reps 15 --json "$OUT/bench_balance.json" \
        > "$OUT/bench_balance.log" 2>&1 || status=1
    if [ "$FI" = 1 ]; then
        stamp "FlashInfer on the decode, prefill and mixed cells"
        python3 bench/cuda/bench_flashinfer.py --mixed --prefill $fa3 \
            $([ "$DECODE" = 1 ] && echo --decode --contiguous) \
            --json "$OUT/bench_flashinfer.json" > "$OUT/bench_flashinfer.log" 2>&1
        grep -v "^{" "$OUT/bench_flashinfer.log" | head -30
        python3 bench/cuda/bench_flashinfer.py --prefill $fa3 --heads 16/8 --head-dim 256 \
            --cells 32x4096,1x16384 --json "$OUT/bench_flashinfer_d256.json" \
            > "$OUT/bench_flashinfer_d256.log" 2>&1
        grep -v "^{" "$OUT/bench_flashinfer_d256.log" | head -8
        if [ "$DECODE" = 1 ]; then
            stamp "FlashInfer on the decode cells, FP8 K/V"
            for t in e4m3 e5m2; do
                python3 bench/cuda/bench_flashinfer.py --decode --kv-dtype $t --json "$OUT/fi_$t.json" \
                    > "$OUT/bench_flashinfer_$t.log" 2>&1
                grep -v "^{" "$OUT/bench_flashinfer_$t.log" | head -20
            done
            cat "$OUT"/fi_e4m3.json "$OUT"/fi_e5m2.json > "$OUT/bench_flashinfer_fp8.json" 2>/dev/null
        fi
    fi
fi
# One line of a grid: build/$1 (bench_decode or bench_prefill) with the
# line's arguments, its JSON appended to $OUT/$1_grid.json, its log to
# $OUT/$1_grid.log.
grid_run() {
    local prog=$1
    shift
    rm -f "$OUT/grid_part.json"
    ./build/"$prog" "$@" --json "$OUT/grid_part.json" >> "$OUT/${prog}_grid.log" 2>&1 \
        || { status=1; echo "$prog $* FAILED"; }
    cat "$OUT/grid_part.json" >> "$OUT/${prog}_grid.json" 2>/dev/null
}

# The decode grid (bench/cuda/decode_grid.txt: head configs, head dims, page
# sizes, K/V dtypes, fixed and drawn lengths), ours and FlashInfer's: the
# kernels of every shape compiled first, all at once (ours: a tiny cell per
# shape; FlashInfer's: --warm-grid, started with its other modules), then
# each side timed alone.
if [ "$BENCH" = 1 ] && [ "$GRID" = 1 ]; then
    grid=bench/cuda/decode_grid.txt
    stamp "decode grid: JIT of every shape's kernels, ours and FlashInfer's, in parallel"
    pids=(${grid_pid:-})
    while read -r heads d ps kvd cells; do
        case "$heads" in ''|\#*) continue ;; esac
        ./build/bench_decode --heads "$heads" --head-dim "$d" --page-size "$ps" --kv-dtype "$kvd" \
            --cells "1x$ps" --pool 64 --reps 30 > /dev/null 2>&1 &
        pids+=($!)
    done < "$grid"
    wait "${pids[@]}"
    grep -h "warm" "$OUT/fi_warm_grid.log" 2>/dev/null
    stamp "decode grid: ours"
    : > "$OUT/bench_decode_grid.json"
    while read -r heads d ps kvd cells; do
        case "$heads" in ''|\#*) continue ;; esac
        grid_run bench_decode --heads "$heads" --head-dim "$d" --page-size "$ps" --kv-dtype "$kvd" \
            --cells "$cells"
    done < "$grid"
    grep -E "heads|^decode" "$OUT/bench_decode_grid.log"
    if [ "$FI" = 1 ]; then
        stamp "decode grid: FlashInfer (both decode paths)"
        python3 bench/cuda/bench_flashinfer.py --decode-grid "$grid" \
            --json "$OUT/bench_flashinfer_grid.json" > "$OUT/bench_flashinfer_grid.log" 2>&1 || status=1
        grep -c '"peer": "flashinfer-decode"' "$OUT/bench_flashinfer_grid.log"
    fi
fi

# The prefill grid (bench/cuda/prefill_grid.txt), ours (paged and ragged)
# and FlashInfer's (fa2, and fa3 where its module built), each timed alone.
if [ "$BENCH" = 1 ] && [ "$PGRID" = 1 ]; then
    grid=bench/cuda/prefill_grid.txt
    stamp "prefill grid: ours"
    : > "$OUT/bench_prefill_grid.json"
    seen=" "
    while read -r heads d ps cells; do
        case "$heads" in ''|\#*) continue ;; esac
        # ragged KV has no pages: timed on the first line of its heads and dim
        only=()
        case "$seen" in *" $heads/$d "*) only=(--paged-only) ;; esac
        seen="$seen$heads/$d "
        grid_run bench_prefill --heads "$heads" --head-dim "$d" --page-size "$ps" --cells "$cells" "${only[@]}"
    done < "$grid"
    grep -E "^prefill" "$OUT/bench_prefill_grid.log"
    if [ "$FI" = 1 ]; then
        wait_fi_modules
        stamp "prefill grid: FlashInfer (waiting for its modules)"
        [ -n "${pgrid_pid:-}" ] && wait "$pgrid_pid"
        grep -h "warm" "$OUT/fi_warm_prefill_grid.log"
        python3 bench/cuda/bench_flashinfer.py --prefill-grid "$grid" ${fa3:-} \
            --json "$OUT/bench_flashinfer_prefill_grid.json" > "$OUT/bench_flashinfer_prefill_grid.log" 2>&1 \
            || status=1
        grep -c '"workload": "prefill"' "$OUT/bench_flashinfer_prefill_grid.log"
    fi
fi

if [ "$BENCH" = 1 ] && [ "$VARIANTS" = 1 ]; then
    stamp "variant benchmark (JIT cold/warm, fused RoPE vs a separate pass)"
    ./build/bench_variant --json "$OUT/bench_variant.json" 2>&1 | tee "$OUT/bench_variant.log" \
        | grep -v "^|" || status=1
fi

if [ "$CASCADE" = 1 ]; then
    stamp "cascades and block-sparse (tests/gpu/run_cascade.sh)"
    cargs=($QUICK --no-build)
    [ "$BENCH" = 0 ] && cargs+=(--no-bench)
    OUT="$OUT" tests/gpu/run_cascade.sh "${cargs[@]}" > "$OUT/cascade.log" 2>&1 || status=1
    tail -30 "$OUT/cascade.log"
fi

stamp "done (status $status)"
[ -f "$OUT/harness_summary.txt" ] && cat "$OUT/harness_summary.txt"
[ -f "$OUT/bench_variant.log" ] && echo "variants:" && grep "^|" "$OUT/bench_variant.log"
grep -h "test_aot:\|test_cuda:" "$OUT"/test_aot.log "$OUT"/test_cuda.log 2>/dev/null
if [ "$BENCH" = 1 ]; then
    # the record: ours and the peers per cell, from the benchmarks' JSON
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 \
        | sed 's/^NVIDIA //' | tr 'A-Z ' 'a-z-')
    rec=bench/results/${gpu:-gpu}/latest.json
    COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
    python3 bench/results_json.py gpu "$OUT" --out "$rec" --commit "$COMMIT" || status=1
    mkdir -p "$PACK/$(dirname "$rec")" && cp "$rec" "$PACK/$rec"
    python3 bench/results_json.py table "$rec" | tee "$OUT/report.md"
    cp "$OUT/report.md" "$PACK/report.md"
fi
exit $status
