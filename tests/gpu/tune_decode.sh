#!/usr/bin/env bash
# tune_decode.sh — decode-kernel variants on a few BENCH.md cells, one call
# on the GPU machine: grid.y (KV-head slices), workers, and compile-time
# knobs through FLASHINFER_CUDA_DEFINES. Prints one table per variant.
#   tests/gpu/tune_decode.sh [cells]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
CELLS=${1:-1x1024,1x32768,16x4096,64x16384,256x1024,256x16384}
make -j"$(nproc)" -s lib gpu > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
variant() { # name, env...
    local name=$1; shift
    echo "== $name"
    env "$@" ./build/bench_decode --cells "$CELLS" 2>&1 | tee "$OUT/tune_$name.log" | grep "^| [0-9]"
}
variant base
variant gy8 FLASHINFER_CUDA_GRID_Y=8
variant mb4 FLASHINFER_CUDA_DEFINES="-DFI_MIN_BLOCKS=4"
variant gy8_mb4 FLASHINFER_CUDA_GRID_Y=8 FLASHINFER_CUDA_DEFINES="-DFI_MIN_BLOCKS=4"
variant gy8_mb4_s6 FLASHINFER_CUDA_GRID_Y=8 FLASHINFER_CUDA_DEFINES="-DFI_MIN_BLOCKS=4 -DFI_STAGES=6 -DFI_TILE_BYTES=8192"
