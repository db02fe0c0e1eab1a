#!/usr/bin/env bash
# run_device.sh — the GPU part of the Python package's tests, on the GPU
# machine, in one call: build libflashinfer (make -s lib), then run the
# `gpu`-marked tests (tests/python/test_gpu_*.py) with FLASHINFER_C_LIB
# pointing at build/libflashinfer.so. With pytest missing, says so and runs
# them with tests/python/mini_runner.py. Logs under $OUT (or
# /tmp/fi-python-out); a short summary last. Capped at ~3 minutes.
#   tests/python/run_device.sh [--all]    --all: the CPU tests as well
# Exit status: 0 all ran and passed; 1 a failure; 2 nothing ran on the GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/fi-python-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
LIMIT=${FI_PYTHON_TEST_LIMIT:-150}  # seconds for the tests themselves
ALL=0
[ "${1:-}" = "--all" ] && ALL=1
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-cache}
export FLASHINFER_C_NUM_THREADS=${FLASHINFER_C_NUM_THREADS:-4}
unset FLASHINFER_C_GPU_TESTS_ON_CPU FLASHINFER_C_TEST_INSTALLED
t0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - t0 )) s] $*"; }

stamp "build (make -s lib)"
if ! make -s -j"$(nproc)" lib > "$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    echo "SUMMARY: python GPU tests: the library did not build (log: $OUT/build.log)"
    exit 1
fi
export FLASHINFER_C_LIB=$PWD/build/libflashinfer.so

stamp "environment"
"$PY" - <<'EOF' 2>&1 | tee "$OUT/environment.txt"
import sys
import torch
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda)
ok = torch.cuda.is_available()
print("torch.cuda.is_available():", ok, "|", torch.cuda.get_device_name(0) if ok else "no GPU")
sys.path.insert(0, "python")
import flashinfer_c
print("libflashinfer", flashinfer_c.library_version, "at", flashinfer_c.library_path)
print("CUDA backend usable:", flashinfer_c.cuda_available())
if ok and flashinfer_c.cuda_available():
    print(flashinfer_c.describe(("cuda", 0)))
EOF

# test_engines.py: vLLM's and SGLang's call sequences, its torch-CUDA cases
# (CUDA graphs captured and replayed) carry the gpu marker too, as do
# test_rope_quant_torch.py's CUDA cases.
FILES=(tests/python/test_gpu_*.py tests/python/test_engines.py tests/python/test_compat.py
       tests/python/test_rope_quant_torch.py)
if "$PY" -c "import pytest" 2> /dev/null; then
    ARGS=(-q -rsfE -p no:cacheprovider --junitxml="$OUT/junit.xml")
    "$PY" -c "import pytest_timeout" 2> /dev/null && ARGS+=(--timeout=120)
    if [ "$ALL" = 1 ]; then
        stamp "pytest tests/python (CPU and GPU tests)"
        TARGET=(tests/python)
    else
        stamp "pytest -m gpu ${FILES[*]}"
        TARGET=(-m gpu "${FILES[@]}")
    fi
    timeout "$LIMIT" "$PY" -m pytest "${ARGS[@]}" "${TARGET[@]}" 2>&1 | tee "$OUT/pytest.log"
    status=${PIPESTATUS[0]}
else
    echo "pytest is not installed for $PY: running the GPU tests with tests/python/mini_runner.py"
    echo "(carry a pytest wheel to run them under pytest)"
    stamp "mini_runner ${FILES[*]}"
    timeout "$LIMIT" "$PY" tests/python/mini_runner.py "${FILES[@]}" 2>&1 | tee "$OUT/pytest.log"
    status=${PIPESTATUS[0]}
fi

last=$(grep -E "(passed|failed|skipped|error|no tests)" "$OUT/pytest.log" | tail -1)
[ "$status" = 124 ] && last="TIMED OUT after ${LIMIT} s; last result line: ${last:-none}"
passed=$(echo "$last" | grep -oE "[0-9]+ passed" | grep -oE "[0-9]+")
stamp "done"
echo "skip reasons:"
grep -hE "^SKIPPED" "$OUT/pytest.log" | sed -E 's/^SKIPPED (\[[0-9]+\] )?[^ ]+: /  /' | sort -u | head -10
grep -hE "^(FAILED|ERROR)" "$OUT/pytest.log" | cut -c1-200 | head -20
if [ "$status" = 0 ] && [ -z "$passed" ]; then
    echo "SUMMARY: python GPU tests: nothing ran on the GPU (all skipped; see the reasons above)"
    exit 2
fi
echo "SUMMARY: python GPU tests: ${last:-no result line} (exit $status; logs in $OUT)"
exit "$status"
