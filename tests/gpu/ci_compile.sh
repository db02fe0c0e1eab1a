#!/usr/bin/env bash
# ci_compile.sh [BUILD] — compile every supported CUDA kernel configuration
# without a GPU (CI): nvcc to an sm_90a cubin per configuration (the same
# kernels/ sources and -D options, src/cuda/aot/cubin.sh), then the library's
# own NVRTC JIT path to PTX (build/jit_compile, compile-only mode). The list of
# configurations comes from build/jit_compile --list: the built-in
# configurations, the standalone ops, every example variant
# (tests/variant_examples.c) x the main configurations, and the AOT set. The
# cubins land in BUILD/aot/, where `make aot` (src/cuda/aot/build.sh) takes
# them instead of compiling them again; cubins newer than every kernel source
# are not recompiled here either (src/cuda/aot/todo.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build}
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
JOBS=$(nproc 2>/dev/null || echo 2)
if [ ! -x "$NVCC" ]; then
    echo "ci_compile: no nvcc on this machine: CUDA kernels NOT compiled" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# example variants: their hook text goes to $tmp/variants/<variant>/, and
# their lines carry the -I that finds it
"$BUILD/jit_compile" --list --variant-dir "$tmp/variants" > "$tmp/list"
sh src/cuda/aot/todo.sh "$BUILD" < "$tmp/list" > "$tmp/jobs"
n=$(wc -l < "$tmp/jobs")
echo "nvcc $("$NVCC" --version | tail -1): $n of $(wc -l < "$tmp/list") kernel configurations" \
     "for sm_90a ($(( $(wc -l < "$tmp/list") - n )) already compiled), $JOBS at a time"
start=$(date +%s)
xargs -P "$JOBS" -L 1 sh src/cuda/aot/cubin.sh "$NVCC" < "$tmp/jobs" || {
    echo "nvcc FAILED"; exit 1; }
# registers and spills of every configuration compiled now
while read -r out rest; do
    log="${out%.cubin}.log"
    if grep -q "bytes spill stores" "$log" && ! grep -q " 0 bytes spill stores" "$log"; then
        echo "note: $(basename "$out" .cubin) spills registers:"; grep -E "spill|Used" "$log"
    fi
done < "$tmp/jobs"
echo "nvcc: $n configurations compiled in $(( $(date +%s) - start )) s"
"$BUILD/jit_compile" | tail -1
# the loads-only program of the decode cells' access pattern (nvcc, runtime API)
make -s "$BUILD/bench_gather" NVCC="$NVCC" BUILD="$BUILD" || { echo "nvcc FAILED: bench_gather"; exit 1; }
echo "nvcc: $BUILD/bench_gather built"
