#!/usr/bin/env bash
# run_cpu.sh — the recorded CPU benchmark. Builds the CPU benchmark programs,
# sets up torch's CPU build (in .venv-bench), then runs bench_cpu
# and torch's CPU SDPA (bench/torch_cpu_sdpa.py) on the same shapes,
# alternating, for several rounds (per cell each side keeps its best median:
# a shared machine only ever slows a round down); then bench_plan (the host
# cost of fi_plan_update), bench_balance (split-KV on and off),
# bench_serving_ops beside torch's CPU serving ops (bench/torch_cpu_serving.py)
# and bench_variant_cpu (a variant's JIT and hook kernel). Writes
# bench/results/<platform>/latest.json (bench/results_json.py), prints its
# tables (docs/BENCHMARKS.md) and redraws the plots (bench/plot.py, into
# docs/img/) where matplotlib is installed.
#   bench/run_cpu.sh [--reps N] [--rounds N] [--quick] [--no-torch] [--no-variant]
#                    [--platform NAME] [--out FILE]
# --quick: 3 reps, 1 round, no variant benchmark (a check of the scripts, not a
# record: give it --out). The platform is named by the CPU (cpu-xeon-spr,
# cpu-epyc-zen5, ...; --platform overrides). BUILD=dir builds elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
reps=30 rounds=3 torch=1 variant=1 platform="" out=""
while (($#)); do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --quick) reps=3 rounds=1 variant=0; shift ;;
    --no-torch) torch=0; shift ;;
    --no-variant) variant=0; shift ;;
    --platform) platform=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--rounds N] [--quick] [--no-torch] [--no-variant]" \
            "[--platform NAME] [--out FILE]" >&2; exit 2 ;;
  esac
done
BUILD=${BUILD:-build}
threads=$(nproc)

# the platform: the CPU's vendor and generation
cpu_platform() {
  local vendor family model flags
  vendor=$(grep -m1 '^vendor_id' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d ' ')
  family=$(grep -m1 '^cpu family' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | tr -d ' ')
  model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2)
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
  case $vendor in
    GenuineIntel)
      if [[ $flags == *amx_bf16* ]]; then echo cpu-xeon-spr      # Sapphire Rapids class: AMX
      elif [[ $flags == *avx512f* ]]; then echo cpu-intel-avx512
      else echo cpu-intel-avx2; fi ;;
    AuthenticAMD)
      local line=amd; [[ $model == *EPYC* ]] && line=epyc
      case $family in
        26) echo "cpu-$line-zen5" ;;
        25) [[ $flags == *avx512f* ]] && echo "cpu-$line-zen4" || echo "cpu-$line-zen3" ;;
        23) echo "cpu-$line-zen2" ;;
        *) echo "cpu-$line" ;;
      esac ;;
    *) echo "cpu-$(uname -m)" ;;
  esac
}
platform=${platform:-$(cpu_platform)}
out=${out:-bench/results/$platform/latest.json}

make -s BUILD="$BUILD" "$BUILD/bench_cpu" "$BUILD/bench_plan" "$BUILD/bench_balance" \
  "$BUILD/bench_variant_cpu" "$BUILD/bench_serving_ops"
if [[ $torch = 1 ]]; then
  [[ -x .venv-bench/bin/python ]] || python3 -m venv .venv-bench
  .venv-bench/bin/python -c "import numpy" 2>/dev/null || .venv-bench/bin/pip install -q numpy
  # torch's CPU build, never the CUDA one (tests/python/install_torch_cpu.sh)
  if ! tests/python/install_torch_cpu.sh .venv-bench; then
    echo "run_cpu.sh: torch SDPA is left out of this run (as with --no-torch)"
    torch=0
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=()
for r in $(seq "$rounds"); do
  echo "round $r of $rounds: bench_cpu$([[ $torch = 1 ]] && echo " and torch SDPA")"
  "$BUILD/bench_cpu" --json "$tmp/ours$r.json" --reps "$reps" --threads "$threads" >/dev/null
  args+=(--ours "$tmp/ours$r.json")
  if [[ $torch = 1 ]]; then
    .venv-bench/bin/python bench/torch_cpu_sdpa.py --threads "$threads" --reps "$reps" \
      >"$tmp/torch$r.json"
    args+=(--torch "$tmp/torch$r.json")
  fi
done
echo "bench_plan, bench_balance"
"$BUILD/bench_plan" --json "$tmp/plan.json" >/dev/null
"$BUILD/bench_balance" --threads "$threads" --reps "$reps" --json "$tmp/balance.json" >/dev/null
args+=(--plan "$tmp/plan.json" --balance "$tmp/balance.json")
echo "bench_serving_ops$([[ $torch = 1 ]] && echo " and torch's CPU serving ops")"
"$BUILD/bench_serving_ops" --threads "$threads" --json "$tmp/serving.json" >/dev/null
if [[ $torch = 1 ]]; then
  .venv-bench/bin/python bench/torch_cpu_serving.py --from "$tmp/serving.json" --threads "$threads" \
    --json "$tmp/serving_torch.json" >/dev/null
  args+=(--serving "$tmp/serving_torch.json")
else
  args+=(--serving "$tmp/serving.json")
fi
if [[ $variant = 1 ]]; then
  echo "bench_variant_cpu"
  "$BUILD/bench_variant_cpu" --reps 3 --cold 1 --threads "$threads" --json "$tmp/variant.json" \
    >/dev/null
  args+=(--variant "$tmp/variant.json")
fi
python3 bench/results_json.py cpu "${args[@]}" --out "$out"
python3 bench/results_json.py table "$out" --suite cpu-decode --suite cpu-prefill --suite host --suite ops
# The plots of docs/BENCHMARKS.md (docs/img/) from the records, where a
# python with matplotlib is at hand; a run written elsewhere (--out) is no
# record of bench/results/ and leaves them alone.
if [[ $out = bench/results/*/latest.json ]]; then
  plotter=""
  for py in python3 .venv-bench/bin/python; do
    if "$py" -c "import matplotlib" 2>/dev/null; then plotter=$py; break; fi
  done
  if [[ -n $plotter ]]; then
    "$plotter" bench/plot.py
  else
    echo "plots not redrawn: no matplotlib (pip install matplotlib; python3 bench/plot.py)"
  fi
fi
