#!/usr/bin/env bash
# run_cpu.sh — the recorded CPU benchmark: builds, sets up torch (from the
# package index, in .venv-bench), then runs bench_cpu and torch's SDPA on the
# same shapes, alternating, for several rounds; per cell each side keeps its
# best median (a shared machine only ever slows a round down). Writes
# bench/results/cpu.json and prints the table that docs/BENCHMARKS.md records.
#   bench/run_cpu.sh [--reps N] [--rounds N]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=30 rounds=3
while (($#)); do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--rounds N]" >&2; exit 2 ;;
  esac
done
threads=$(nproc)

make -s build/bench_cpu
if [[ ! -x .venv-bench/bin/python ]]; then
  python3 -m venv .venv-bench
  .venv-bench/bin/pip install -q torch numpy
fi
mkdir -p bench/results
tmp=$(mktemp -d)
for r in $(seq "$rounds"); do
  build/bench_cpu --json "$tmp/ours$r.json" --reps "$reps" --threads "$threads" >/dev/null
  .venv-bench/bin/python bench/torch_cpu_sdpa.py --threads "$threads" --reps "$reps" >"$tmp/torch$r.json"
done
python3 bench/report_cpu.py --out bench/results/cpu.json --ours "$tmp"/ours*.json --torch "$tmp"/torch*.json
rm -rf "$tmp"
