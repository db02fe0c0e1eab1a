#!/usr/bin/env python3
"""harness_configs.py — read `test_attention --list` case names on stdin and
print the distinct attention configurations they use, one per line, as
`jit_compile --warm` reads them:
    paged mask window softcap pos qt kvt ot dqk dvo hq hkv
(paged: 0 ragged, 1 paged, 2 paged with a device page table: the table
suite and the graph suite's device-table case)
(only what fixes a kernel; runtime values such as the window size are not
needed). Used by tests/gpu/run_device.sh to pre-warm the JIT cache in
parallel before the harness runs."""
import re
import sys

DT = {"f32": 0, "f16": 1, "bf16": 2, "e4m3": 3, "e5m2": 4}
seen = set()
for line in sys.stdin:
    f = line.strip().split("/")
    if len(f) < 8:
        continue
    fmt, var, dt, dims, heads = f[2], f[3], f[4], f[5], f[6]
    v = var.split("+")
    mask = 1 if "causal" in v else 2 if any(x.startswith("custom") for x in v) else 0
    window = int(any(x.startswith("window") for x in v))
    softcap = int(any(x.startswith("softcap") for x in v))
    pos = 1 if any(x.startswith("rope") for x in v) else 2 if any(x.startswith("alibi") for x in v) else 0
    names = [re.match(r"(bf16|f16|f32|e4m3|e5m2)", x) for x in dt.split("_")]
    if len(names) != 3 or not all(names):
        continue
    qt, kvt, ot = (DT[n.group(1)] for n in names)
    m = re.match(r"d(\d+)(?:x(\d+))?$", dims)
    hm = re.match(r"h(\d+):(\d+)$", heads)
    if not m or not hm:
        continue
    dqk = int(m.group(1))
    dvo = int(m.group(2) or dqk)
    paged = int(fmt.startswith("paged"))
    if paged and (f[1] == "table" or "device_table" in line):
        paged = 2
    cfg = (paged, mask, window, softcap, pos, qt, kvt, ot, dqk, dvo,
           int(hm.group(1)), int(hm.group(2)))
    if cfg not in seen:
        seen.add(cfg)
        print(*cfg)
