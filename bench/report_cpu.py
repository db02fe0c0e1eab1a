"""report_cpu.py — merge bench_cpu's JSON with torch's, add machine and commit,
write the results file and print the markdown table for docs/BENCHMARKS.md.

    python3 bench/report_cpu.py OURS.json '<torch json>' OUT.json
"""
import datetime
import json
import platform
import subprocess
import sys


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ours = json.load(open(sys.argv[1]))
    peer = json.loads(sys.argv[2])
    out_path = sys.argv[3]
    key = lambda c: (c["kind"], c["batch"], c["kv_len"], c["dtype"])
    torch_ms = {key(c): c["ms"] for c in peer["cells"]}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    result = {"date": datetime.date.today().isoformat(), "commit": commit,
              "cpu": cpu_model(), "torch": peer["torch"], **ours}
    bw, peak = ours["read_bandwidth_gbs"], ours["fma_peak_gflops"]
    print(f"{ours['machine']} on {result['cpu']}; measured read bandwidth {bw:.1f} GB/s, "
          f"fp32 FMA peak {peak:.0f} GFLOP/s; torch {peer['torch']}")
    print("| workload | dtype | ours ms | GB/s | % of read BW | GFLOP/s | torch SDPA ms | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for c in ours["cells"]:
        t = torch_ms.get(key(c))
        c["torch_ms"] = t
        ratio = f"{t / c['ms']:.2f}x" if t and c["ms"] else "-"
        print(f"| {c['kind']} {c['batch']} x {c['kv_len']} | {c['dtype']} | {c['ms']:.3f} | "
              f"{c['gbs']:.1f} | {100 * c['gbs'] / bw:.0f}% | {c['gflops']:.1f} | "
              f"{t:.3f} | {ratio} |" if t else "")
    json.dump(result, open(out_path, "w"), indent=2)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
