#!/bin/sh
# run.sh — `make test`'s runner: every test program in turn, one line each
# (its counts and time), the whole output of one that fails, then the
# reasons for skips in one line and the counts over all programs last:
#   total: N passed, N failed, N skipped
#   tests/run.sh LOGDIR PROGRAM...
# Each program's output is kept in LOGDIR/NAME.log. FI_TEST_ARGS is passed
# to every program (e.g. --quick); FI_TEST_VERBOSE=1 prints every output.
# The counts are the "tu-summary passed=N failed=N skipped=N" and
# "tu-skip N REASON" lines each program prints last (tests/util.c,
# tu_summary); a program that exits non-zero, or without a tu-summary
# line, counts as one failure besides its own counts.
set -u
logdir=$1
shift
mkdir -p "$logdir"
n=$#
i=0
pass=0 fail=0 skip=0 bad_programs=""
skips="$logdir/skips.txt"
: >"$skips"
start=$(date +%s.%N)
for t in "$@"; do
    i=$((i + 1))
    name=$(basename "$t")
    log="$logdir/$name.log"
    printf '[%2d/%d] %-20s ' "$i" "$n" "$name"
    t0=$(date +%s.%N)
    # shellcheck disable=SC2086 # FI_TEST_ARGS is a list of options
    "$t" ${FI_TEST_ARGS:-} >"$log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    line=$(grep '^tu-summary ' "$log" | tail -n 1)
    p=$(echo "$line" | sed -n 's/.*passed=\([0-9]*\).*/\1/p')
    f=$(echo "$line" | sed -n 's/.*failed=\([0-9]*\).*/\1/p')
    s=$(echo "$line" | sed -n 's/.*skipped=\([0-9]*\).*/\1/p')
    p=${p:-0} f=${f:-0} s=${s:-0}
    note=""
    if [ -z "$line" ] || [ "$rc" -ne 0 ]; then
        [ "$f" -eq 0 ] && f=1
        if [ "$rc" -gt 128 ]; then note="  (killed by signal $((rc - 128)))"
        elif [ -z "$line" ]; then note="  (exit $rc, no summary)"
        else note="  (exit $rc)"; fi
        bad_programs="$bad_programs $name"
    fi
    pass=$((pass + p)) fail=$((fail + f)) skip=$((skip + s))
    sed -n "s/^tu-skip \([0-9]*\) \(.*\)/\1	\2	$name/p" "$log" >>"$skips"
    printf '%6d passed, %d failed, %d skipped  %6.1f s%s\n' "$p" "$f" "$s" \
        "$(echo "$t1 - $t0" | awk '{print $1 - $3}')" "$note"
    if [ -n "$note" ] || [ "${FI_TEST_VERBOSE:-0}" = 1 ]; then
        grep -v '^tu-' "$log" | sed 's/^/    /'
    fi
done
end=$(date +%s.%N)
# one line for every reason, the programs that gave it in brackets
if [ -s "$skips" ]; then
    awk -F '\t' '{ n[$2] += $1; if (!index(" " w[$2] " ", " " $3 " ")) w[$2] = w[$2] (w[$2] ? " " : "") $3
                   if (!($2 in seen)) { seen[$2] = 1; order[++k] = $2 } }
                 END { printf "skipped:"; for (j = 1; j <= k; j++)
                         printf "%s %d %s [%s]", (j > 1 ? ";" : ""), n[order[j]], order[j], w[order[j]]
                       printf "\n" }' "$skips"
fi
printf '%d programs in %.1f s; logs in %s%s\n' "$n" \
    "$(echo "$end - $start" | awk '{print $1 - $3}')" "$logdir" \
    "${bad_programs:+; failed:$bad_programs}"
echo "total: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
