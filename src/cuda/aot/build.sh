#!/bin/sh
# build.sh NVCC BUILD — `make aot`: compile the AOT set (BUILD/aot_list)
# into BUILD/aot/*.cubin, in parallel, skipping cubins newer than every
# kernel source (tests/gpu/ci_compile.sh writes the same files, so CI
# compiles each configuration once), then write the table
# BUILD/gen/aot_table.c that embeds them.
set -e
nvcc=$1 build=$2
jobs=$(nproc 2>/dev/null || echo 2)
"$build/aot_list" > "$build/gen/aot.list.tmp"
mv "$build/gen/aot.list.tmp" "$build/gen/aot.list"
sh src/cuda/aot/todo.sh "$build" < "$build/gen/aot.list" > "$build/gen/aot.todo"
n=$(wc -l < "$build/gen/aot.todo")
if [ "$n" -gt 0 ]; then
    echo "aot: nvcc $n of $(wc -l < "$build/gen/aot.list") kernel configurations for sm_90a, $jobs at a time"
    xargs -P "$jobs" -L 1 sh src/cuda/aot/cubin.sh "$nvcc" < "$build/gen/aot.todo"
fi
sh src/cuda/aot/table.sh "$build" < "$build/gen/aot.list" > "$build/gen/aot_table.c.tmp"
mv "$build/gen/aot_table.c.tmp" "$build/gen/aot_table.c"
