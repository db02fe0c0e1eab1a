#!/bin/sh
# test_cli.sh — the `fi` tool as a user runs it: exit codes (0 done, 1 the
# work failed, 2 a command line it cannot use), --help on every command,
# --version, messages for malformed numbers and unknown options, what
# `fi info` shows (the cache directory and its size among it), what `fi
# warmup` prepares by default, and a short `fi demo` with its comparison
# column and schedule picture. (The warmup API and the tool's lists are
# tests/test_warmup.c's.)
#   FI=build/fi tests/test_cli.sh [-v]      (make test runs it; other options ignored)
# Prints "ok NAME" with -v, "FAIL NAME" always, then the tu-summary line
# that tests/run.sh reads.
set -u
FI=${FI:-build/fi}
verbose=0
for a in "$@"; do [ "$a" = -v ] && verbose=1; done
tmp=$(mktemp -d /tmp/fi-test-cli-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# a cache of its own: never the user's
FLASHINFER_CACHE_DIR=$tmp/cache
export FLASHINFER_CACHE_DIR
pass=0 fail=0 skip=0

# run NAME WANT_RC ARGS...: runs $FI ARGS, stdout in $tmp/out, stderr in
# $tmp/err; records a failure if the exit code is not WANT_RC.
run() {
    name=$1 want=$2
    shift 2
    "$FI" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ "$rc" -ne "$want" ]; then
        bad "$name" "exit $rc, $want expected: $FI $*"
        return 1
    fi
    return 0
}
good() { pass=$((pass + 1)); [ "$verbose" = 1 ] && echo "ok   $1"; return 0; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    echo "     $2"
    sed 's/^/     out: /' "$tmp/out" | head -n 5
    sed 's/^/     err: /' "$tmp/err" | head -n 5
}
# has NAME FILE TEXT: FILE (out or err) contains TEXT
has() {
    if grep -qF -- "$3" "$tmp/$2"; then good "$1"; else bad "$1" "$2 lacks \"$3\""; fi
}

if [ ! -x "$FI" ]; then
    echo "FAIL cli/tool: $FI is not an executable (FI=path)"
    echo "tu-summary passed=0 failed=1 skipped=0"
    exit 1
fi
version=$(sed -n 's/^#define FI_VERSION_STRING "\(.*\)"/\1/p' "$(dirname "$0")/../include/flashinfer.h")

run cli/version 0 --version && has cli/version out "fi (flashinfer.c) $version"
run cli/version-short 0 -V && has cli/version-short out "$version"
run cli/help 0 --help && has cli/help out "usage: fi "
run cli/help-word 0 help && has cli/help-word out "commands:"
run cli/no-command 2 && has cli/no-command err "usage: fi "
run cli/unknown-command 2 frob && has cli/unknown-command err "unknown command frob"
run cli/unknown-global-option 2 --frob && has cli/unknown-global-option err "unknown option --frob"
for cmd in info demo warmup; do
    run "cli/$cmd/help" 0 "$cmd" --help && has "cli/$cmd/help" out "usage: fi $cmd"
    run "cli/$cmd/h" 0 "$cmd" -h && has "cli/$cmd/h" out "usage: fi $cmd"
    run "cli/help-$cmd" 0 help "$cmd" && has "cli/help-$cmd" out "usage: fi $cmd"
    run "cli/$cmd/unknown-option" 2 "$cmd" --frob && has "cli/$cmd/unknown-option" err "unknown option --frob"
    run "cli/$cmd/argument" 2 "$cmd" stray && has "cli/$cmd/argument" err "unexpected argument stray"
done

# malformed and out-of-range numbers: exit 2 and a message naming the value
for v in abc 4x "" -1 0 65 99999999999999999999; do
    run "cli/demo/layers=$v" 2 demo --layers "$v" &&
        has "cli/demo/layers=$v" err "--layers $v: expected a whole number from 1 to 64"
done
run cli/demo/layers-missing 2 demo --layers && has cli/demo/layers-missing err "--layers needs a value"
run cli/demo/threads=x 2 demo --threads x && has cli/demo/threads=x err "--threads x: expected"
for v in abc 0 1.5; do
    run "cli/warmup/j=$v" 2 warmup -j "$v" && has "cli/warmup/j=$v" err "-j $v: expected a whole number"
done
run cli/warmup/head-dims=x 2 warmup --head-dims x && has cli/warmup/head-dims=x err "head dim x"
run cli/warmup/variants=sink 2 warmup --variants sink && has cli/warmup/variants=sink err "variant sink"

# fi info: backends, SIMD levels, devices, the cache directory and its size
run cli/info/empty-cache 0 info && has cli/info/empty-cache out "kernel cache: $tmp/cache (\$FLASHINFER_CACHE_DIR)" &&
    has cli/info/empty-cache out "not created yet"
mkdir -p "$tmp/cache/cpu"
head -c 1500000 /dev/zero >"$tmp/cache/cpu/a.so"
head -c 500000 /dev/zero >"$tmp/cache/b.cubin"
if run cli/info 0 info; then
    has cli/info/version out "flashinfer.c $version"
    has cli/info/backends out "backends:"
    has cli/info/cpu out "cpu   available: cpu: "
    has cli/info/simd out "SIMD levels here: "
    has cli/info/generic out " generic"
    has cli/info/cuda out "  cuda  "
    has cli/info/devices out "devices:"
    has cli/info/cache-size out "2 files, 2.0 MB"
fi
rm -rf "$tmp/cache"

# fi warmup by default: the built-in paths' CUDA kernels for the visible
# GPU; on a machine without one, nothing (the CPU compiles only variants)
if grep -q "cuda  available" "$tmp/out"; then
    skip=$((skip + 1))
    echo "tu-skip 1 a GPU is visible: fi warmup's default compiles its kernels (tests/gpu)"
else
    run cli/warmup/default 0 warmup && has cli/warmup/default out "nothing to prepare" &&
        if [ -e "$tmp/cache" ]; then bad cli/warmup/default-writes "the cache was created"; else good cli/warmup/default-writes; fi
fi
run cli/warmup/cpu-builtin 0 warmup --backends cpu && has cli/warmup/cpu-builtin err "nothing to compile"
if run cli/warmup/arch-dry-run 0 warmup --arch sm_90a --head-dims 128 --dtypes bf16 --dry-run \
        --manifest "$tmp/manifest"; then
    n=$(grep -c '^cuda sm_90a ' "$tmp/manifest")
    others=$(grep -vc '^cuda sm_90a ' "$tmp/manifest")
    if [ "$n" -gt 0 ] && [ "$others" -eq 0 ]; then good cli/warmup/arch-manifest
    else bad cli/warmup/arch-manifest "$n CUDA lines, $others others in the manifest"; fi
    has cli/warmup/arch-announce err "CUDA kernels for sm_90a into $tmp/cache"
    if [ -e "$tmp/cache" ]; then bad cli/warmup/dry-run-writes "a dry run created the cache"
    else good cli/warmup/dry-run-writes; fi
fi
run cli/warmup/list 0 warmup --list && has cli/warmup/list out "builtin " && has cli/warmup/list out "soft_cap"

# fi demo: the check passes, the comparison column and the schedule picture
if run cli/demo 0 demo --layers 1 --threads 2; then
    has cli/demo/check out "pass: max |err|"
    has cli/demo/baseline out "| naive fp64 reference |"
    has cli/demo/faster out "x faster"
    has cli/demo/schedule out "work items on 2 workers"
    has cli/demo/worker-row out "  worker 1 "
    has cli/demo/balance out "balance: the busiest worker's load is"
fi

echo "tu-summary passed=$pass failed=$fail skipped=$skip"
[ "$fail" -eq 0 ]
