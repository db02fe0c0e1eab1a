#!/bin/sh
# todo.sh BUILD < LIST — of the "ENTRY NAME -D..." lines of LIST, print as
# "BUILD/aot/NAME.cubin ENTRY -D..." (src/cuda/aot/cubin.sh's arguments after
# NVCC) those whose cubin is missing or older than a kernel source or
# cubin.sh, and every line with an -I (a variant's hook text, written afresh
# by jit_compile --list --variant-dir: not a source this check knows).
# Shared by build.sh (make aot) and tests/gpu/ci_compile.sh.
build=$1
newest=$(ls -t kernels/*.cuh kernels/*.h src/cuda/aot/cubin.sh | head -1)
while read -r entry name defs; do
    out="$build/aot/$name.cubin"
    case " $defs" in *" -I"*) echo "$out $entry $defs"; continue ;; esac
    if [ ! -f "$out" ] || [ "$newest" -nt "$out" ]; then echo "$out $entry $defs"; fi
done
