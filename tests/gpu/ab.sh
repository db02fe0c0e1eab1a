#!/usr/bin/env bash
# ab.sh — builds side by side in one device call: each variant is a set of
# environment assignments (FLASHINFER_CUDA_DEFINES=..., FLASHINFER_CUDA_*
# knobs) over one NVRTC build of the working tree (FLASHINFER_AOT=0, so the
# defines reach every kernel; the JIT cache keys on them). Each variant is
# first checked (test_cuda, and the attention harness suites named by
# --suites on the cuda backend against the fp64 oracle), then timed: the
# decode cells (bench_decode) and, with --mixed, BENCH.md's four mixes
# (bench_mixed), the variants alternated for --rounds rounds; the copy
# ceiling (bench_gather --copy-only) before and after them, and for each
# decode cell over 256 MB the time that is 90% of it (issue 4's target). Logs and the
# JSON under $LOGS (or /tmp/fi-ab), the table also in $OUT/ab.md; the table
# last on stdout, one line per cell, every round's time per variant (us).
#   tests/gpu/ab.sh [--rounds N] [--cells 16x4096,64x1024] [--mixed]
#                   [--suites "format graph edge plan" | --no-check]
#                   NAME=ASSIGNMENTS ...
# e.g. tests/gpu/ab.sh main= "old=FLASHINFER_CUDA_DEFINES=-DFI_DTC_PREFETCH=0"
#      tests/gpu/ab.sh main= 'two=FLASHINFER_CUDA_DEFINES="-DA=1 -DB=2" FLASHINFER_CUDA_GRID_Y=2'
set -uo pipefail
cd "$(dirname "$0")/../.."
PACK=${OUT:-/tmp/fi-out}
# a device machine may be lent again with /tmp kept: the default log
# directory starts empty, so no earlier call's rounds join this table
[ -n "${LOGS:-}" ] || rm -rf /tmp/fi-ab
LOGS=${LOGS:-/tmp/fi-ab}
mkdir -p "$LOGS" "$PACK"
ROUNDS=2 CELLS=1x1024,1x32768,16x1024,16x4096,64x1024,256x4096 MIXED=0
SUITES="format graph edge plan" CHECK=1
names=() envs=()
while [ $# -gt 0 ]; do
    case $1 in
        --rounds) ROUNDS=$2; shift ;;
        --cells) CELLS=$2; shift ;;
        --mixed) MIXED=1 ;;
        --suites) SUITES=$2; shift ;;
        --no-check) CHECK=0 ;;
        *=*) names+=("${1%%=*}"); envs+=("${1#*=}") ;;
        *) echo "ab.sh: unknown argument $1"; exit 2 ;;
    esac
    shift
done
[ ${#names[@]} -ge 1 ] || { echo "ab.sh: no variants (NAME=ASSIGNMENTS)"; exit 2; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
export FLASHINFER_CACHE_DIR=${FLASHINFER_CACHE_DIR:-/tmp/flashinfer-c-ab} FLASHINFER_AOT=0
t0=$(date +%s)
make AOT=0 -j"$(nproc)" -s lib gpu build/test_attention > "$LOGS/build.log" 2>&1 ||
    { tail -30 "$LOGS/build.log"; exit 1; }
make -s build/bench_gather >> "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
copy_ceiling() { ./build/bench_gather --copy-only > "$LOGS/copy_$1.log" 2>&1 || status=1; }
status=0
run() { # variant index, command... (the assignments as the shell reads them: quotes work)
    local i=$1; shift
    eval "env ${envs[$i]} \"\$@\""
}
for i in "${!names[@]}"; do
    n=${names[$i]}
    run "$i" ./build/bench_decode --cells "$CELLS" --reps 30 > "$LOGS/warm_$n.log" 2>&1 # JIT
    [ "$CHECK" = 1 ] || continue
    run "$i" ./build/test_cuda > "$LOGS/test_cuda_$n.log" 2>&1 || status=1
    line="$n: test_cuda $(tail -1 "$LOGS/test_cuda_$n.log")"
    pids=()
    for s in $SUITES; do
        run "$i" ./build/test_attention --backend cuda --filter "cuda/$s/" > "$LOGS/harness_${n}_$s.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    for s in $SUITES; do
        line="$line; $s $(grep -hiE 'total' "$LOGS/harness_${n}_$s.log" | tail -1 | awk '{print $2, $3, $4}')"
    done
    echo "$line"
    grep -h "^FAIL" "$LOGS"/test_cuda_"$n".log "$LOGS"/harness_"$n"_*.log 2>/dev/null | head -5
done
copy_ceiling before
for r in $(seq 1 "$ROUNDS"); do
    for i in "${!names[@]}"; do
        n=${names[$i]}
        run "$i" ./build/bench_decode --cells "$CELLS" --reps 40 --json "$LOGS/decode_${n}_$r.json" \
            > "$LOGS/decode_${n}_$r.log" 2>&1 || status=1
        if [ "$MIXED" = 1 ]; then
            run "$i" ./build/bench_mixed --json "$LOGS/mixed_${n}_$r.json" > "$LOGS/mixed_${n}_$r.log" 2>&1 ||
                status=1
        fi
    done
done
copy_ceiling after
python3 - "$LOGS" "$ROUNDS" "${names[@]}" <<'EOF' | tee "$PACK/ab.md"
import json, os, re, sys
logs, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ceil = []  # TB/s, before and after the rounds
for when in ("before", "after"):
    m = re.search(r"([0-9.]+) TB/s", open(os.path.join(logs, f"copy_{when}.log")).read())
    if m:
        ceil.append(float(m.group(1)))
copy = sum(ceil) / len(ceil) if ceil else None
print("copy ceiling (2 GiB, read + written), before / after: "
      + (" / ".join(f"{c:.3f}" for c in ceil) + " TB/s" if ceil else "not measured") + "\n")
kv_bytes = {}  # decode cell -> K + V bytes read
rows = {}  # cell -> name -> [us per round]
for n in names:
    for r in range(1, rounds + 1):
        for kind in ("decode", "mixed"):
            path = os.path.join(logs, f"{kind}_{n}_{r}.json")
            if not os.path.exists(path):
                continue
            for line in open(path):
                if not line.strip():
                    continue
                d = json.loads(line)
                cell = (f"decode {d['batch']} x {d['kv_len']}" if kind == "decode"
                        else f"mix {d['mix']}")
                if kind == "decode" and d.get("bytes", 0) > 256e6:
                    kv_bytes[cell] = d["bytes"]
                rows.setdefault(cell, {}).setdefault(n, []).append(d["us"])
print("| cell | " + " | ".join(names) + " | 90% of the copy ceiling (us) |")
print("|---|" + "---|" * (len(names) + 1))
for cell, by in rows.items():
    floor = (f"{kv_bytes[cell] / (0.9 * copy) * 1e-6:.1f}" if copy and cell in kv_bytes else "")
    print(f"| {cell} | " + " | ".join(" / ".join(f"{u:.1f}" for u in by.get(n, [])) for n in names)
          + f" | {floor} |")
EOF
tar czf "$PACK/ab_logs.tgz" -C "$LOGS" . 2>/dev/null
echo "ab.sh: $(( $(date +%s) - t0 )) s, status $status"
exit $status
