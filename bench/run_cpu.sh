#!/usr/bin/env bash
# run_cpu.sh — the recorded CPU benchmark: builds, sets up torch (CPU wheel
# from the package index, in .venv-bench), runs bench_cpu and torch's SDPA on
# the same shapes in one go, writes bench/results/cpu.json and prints the
# table that docs/BENCHMARKS.md records.
#   bench/run_cpu.sh [--reps N]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=30
[[ "${1:-}" == "--reps" ]] && reps=$2
threads=$(nproc)

make -s build/bench_cpu
if [[ ! -x .venv-bench/bin/python ]]; then
  python3 -m venv .venv-bench
  .venv-bench/bin/pip install -q torch numpy
fi
mkdir -p bench/results
ours=$(mktemp)
build/bench_cpu --json "$ours" --reps "$reps" --threads "$threads"
peer=$(.venv-bench/bin/python bench/torch_cpu_sdpa.py --threads "$threads" --reps "$reps")
python3 bench/report_cpu.py "$ours" "$peer" bench/results/cpu.json
rm -f "$ours"
