#!/usr/bin/env python3
"""ncu_loops.py — where a kernel's loops stall, from Nsight Compute's source page.

Input: the CSV of
    ncu --csv --page source --print-source sass --section SourceCounters \
        --section WarpStateStats -k regex:KERNEL --launch-skip 1 --launch-count 1 CMD
(one kernel). Finds the loops (backward branches) that hold HMMA instructions
and prints, per loop, its sampled stall reasons and its most-sampled
instructions with their top reasons. Offsets are from the kernel's start, as
`cuobjdump -sass` numbers them.
    python3 tests/gpu/ncu_loops.py FILE.csv [--loop 0xOFFSET] [--top N]
"""
import collections
import csv
import re
import sys


def load(path):
    rows, hdr = [], None
    for r in csv.reader(open(path)):
        if r and r[0] == "Address":
            hdr = r
        elif hdr and r and r[0].startswith("0x") and len(r) == len(hdr):
            rows.append(dict(zip(hdr, r)))
    if not rows:
        sys.exit(f"{path}: no source rows (one kernel, --page source --csv)")
    base = int(rows[0]["Address"], 16)
    ins = [(int(r["Address"], 16) - base, r["Source"].strip(), r) for r in rows]
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    return base, ins, stalls


def loops(base, ins):
    out = []
    for a, text, _ in ins:
        m = re.search(r"BRA.*?(0x[0-9a-f]+)", text)
        if not m:
            continue
        tgt = int(m.group(1), 16)
        tgt = tgt - base if tgt >= base else tgt
        if tgt < a:
            body = [x for x in ins if tgt <= x[0] <= a]
            hmma = sum("HMMA" in x[1] for x in body)
            if hmma:
                out.append((tgt, a, body, hmma))
    return out


def samples(x, key="Warp Stall Sampling (All Samples)"):
    return int(x[2][key] or 0)


def main():
    a = sys.argv[1:]
    if not a:
        sys.exit(__doc__)
    want = a[a.index("--loop") + 1] if "--loop" in a else None
    top = int(a[a.index("--top") + 1]) if "--top" in a else 8
    base, ins, stalls = load(a[0])
    print(f"{len(ins)} instructions, {sum(samples(x) for x in ins)} samples")
    found = loops(base, ins)
    for tgt, end, body, hmma in found:
        print(f"loop {tgt:#x}-{end:#x}: {len(body)} instructions, {hmma} HMMA, "
              f"{sum(samples(x) for x in body)} samples, "
              f"{max(int(x[2]['Instructions Executed'] or 0) for x in body)} executions")
    for tgt, end, body, hmma in found:
        if (want and int(want, 16) != tgt) or (not want and len(body) > 2000):
            continue  # the innermost loops unless one is named
        tot = collections.Counter()
        for x in body:
            for s in stalls:
                tot[s] += int(x[2][s] or 0)
        n = sum(tot.values()) or 1
        print(f"\nloop {tgt:#x}: " +
              ", ".join(f"{k[6:]} {v * 100 / n:.0f}%" for k, v in tot.most_common(8)))
        for x in sorted(body, key=lambda x: -samples(x))[:top]:
            why = sorted(((int(x[2][s] or 0), s[6:]) for s in stalls), reverse=True)[:2]
            print(f"  {x[0]:#7x} {samples(x):7d}  {x[1][:56]:56s} " +
                  ", ".join(f"{w} {c}" for c, w in why))


if __name__ == "__main__":
    main()
