#!/bin/sh
# cubin.sh NVCC OUT.cubin ENTRY_FILE -D... — one kernel configuration
# compiled ahead of time: nvcc, sm_90a cubin, the options NVRTC gets from
# src/cuda/jit.c (-std=c++17 and the -D constants); registers and spills
# (-Xptxas -v) into OUT.log. Written through a temporary file, so a cubin
# that exists is whole. Used by src/cuda/aot/build.sh and tests/gpu/ci_compile.sh.
set -e
nvcc=$1 out=$2 entry=$3
shift 3
dir=$(dirname "$out")
mkdir -p "$dir"
name=$(basename "$out" .cubin)
src="$dir/$name.cu"
printf '#include "%s"\n' "$entry" > "$src"
if ! "$nvcc" -std=c++17 -arch=sm_90a -cubin -Ikernels -Xptxas -v "$@" "$src" \
        -o "$out.tmp" > "$dir/$name.log" 2>&1; then
    cat "$dir/$name.log"
    rm -f "$out.tmp" "$src"
    echo "nvcc FAILED: $name" >&2
    exit 1
fi
rm -f "$src"
mv "$out.tmp" "$out"
