#!/usr/bin/env bash
# install_torch_cpu.sh VENV — torch's CPU build into the virtual environment
# VENV, for the Python tests (.ci/run) and the CPU benchmark
# (bench/run_cpu.sh). Exits 0 when VENV's python imports torch afterwards,
# else 1 after one line saying why (callers then leave torch out).
#
# Where a CPU build comes from, in order:
#  1. a torch VENV has already (whatever its build: nothing is downloaded);
#  2. $FI_TORCH_WHEEL, a wheel file or requirement the caller has at hand;
#  3. PyTorch's CPU index (download.pytorch.org/whl/cpu: the `+cpu` builds,
#     about 200 MB), asked twice;
#  4. on every platform but Linux x86_64, the package index's torch, which
#     is a CPU build there (macOS, Linux aarch64).
# On Linux x86_64 the package index has no CPU build: its torch pulls the
# CUDA runtime (some 4-5 GB of nvidia-* wheels), which a CPU job must not
# download; with the CPU index unreachable torch is left out.
# FI_TORCH_ALLOW_CUDA_BUILD=1 takes that build all the same (an explicit
# choice, e.g. where bandwidth is no object and the torch tests must run).
set -uo pipefail
venv=${1:?usage: $0 VENV}
py=$venv/bin/python
pip=("$py" -m pip install -q --retries 0 --timeout 20)

has_torch() { "$py" -c "import torch" 2>/dev/null; }
say() { echo "torch: $*"; }

if has_torch; then
  say "$("$py" -c 'import torch; print(torch.__version__)') already in $venv"
  exit 0
fi
if [[ -n ${FI_TORCH_WHEEL:-} ]]; then
  "${pip[@]}" "$FI_TORCH_WHEEL" && has_torch && { say "installed $FI_TORCH_WHEEL"; exit 0; }
  say "FI_TORCH_WHEEL=$FI_TORCH_WHEEL did not install"
fi
for attempt in 1 2; do
  if "${pip[@]}" torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null && has_torch; then
    say "$("$py" -c 'import torch; print(torch.__version__)') from the CPU index"
    exit 0
  fi
  [[ $attempt = 1 ]] && sleep 5
done
if [[ $(uname -s)/$(uname -m) != Linux/x86_64 ]]; then
  "${pip[@]}" torch && has_torch && { say "the package index's (a CPU build on $(uname -sm))"; exit 0; }
elif [[ ${FI_TORCH_ALLOW_CUDA_BUILD:-0} = 1 ]]; then
  "${pip[@]}" torch && has_torch && { say "the package index's CUDA build (FI_TORCH_ALLOW_CUDA_BUILD=1)"; exit 0; }
fi
say "not installed: PyTorch's CPU index is not reachable from here, and the package index's" \
    "torch for Linux x86_64 is the CUDA build (4-5 GB), never fetched for a CPU job" \
    "(FI_TORCH_WHEEL=a CPU wheel, or FI_TORCH_ALLOW_CUDA_BUILD=1, overrides)"
exit 1
