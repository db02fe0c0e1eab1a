#!/usr/bin/env bash
# ci_compile.sh [BUILD] — compile every supported CUDA kernel configuration
# without a GPU (CI): nvcc -arch=sm_90 on a one-line .cu per configuration
# (the same kernels/ sources, the same -D options), then the library's own
# NVRTC JIT path to PTX (build/jit_compile, compile-only mode). The list of
# configurations comes from build/jit_compile --list: the built-in
# configurations, the standalone ops, and every example variant
# (tests/variant_examples.c) x the main configurations.
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
while read -r file name defs; do
    printf '#include "%s"\n' "$file" > "$tmp/$name.cu"
    echo "$name $defs" >> "$tmp/jobs"
done < "$tmp/list"
n=$(wc -l < "$tmp/jobs")
echo "nvcc $("$NVCC" --version | tail -1): $n kernel configurations for sm_90, $JOBS at a time"
start=$(date +%s)
# each job: nvcc ... -c NAME.cu, registers and spills into NAME.log
xargs -P "$JOBS" -L 1 sh -c '
    name=$1; shift
    if ! "'"$NVCC"'" -std=c++17 -arch=sm_90 -Ikernels -Xptxas -v "$@" \
        -c "'"$tmp"'/$name.cu" -o "'"$tmp"'/$name.o" > "'"$tmp"'/$name.log" 2>&1; then
        cat "'"$tmp"'/$name.log"; echo "nvcc FAILED: $name"; exit 255
    fi
    if grep -q "bytes spill stores" "'"$tmp"'/$name.log" && \
       ! grep -q " 0 bytes spill stores" "'"$tmp"'/$name.log"; then
        echo "note: $name spills registers:"; grep -E "spill|Used" "'"$tmp"'/$name.log"
    fi' _ < "$tmp/jobs"
echo "nvcc: $n configurations compiled in $(( $(date +%s) - start )) s"
"$BUILD/jit_compile" | tail -1
