#!/usr/bin/env python3
"""Simulation wall time against GPUs from the cluster benchmarks of tests/bench/sim_bench.cc.

Usage:
  build/tests/bench/sim_bench --benchmark_filter='BM_Cluster' --benchmark_format=json > bench.json
  python3 scripts/plot-bench-scaling.py bench.json -o scaling.png

Reads Google Benchmark's JSON (each run's real time and its `gpus` and `stages` counters) and
draws, per benchmark family (BM_ClusterStep*: expert parallelism; BM_ClusterFsdp2Step*: FSDP2),
the wall time of one simulated step against the GPUs on log-log axes, with the line of linear
growth in the stages through each family's first point. A second benchmark argument of 1 (one
node's stages standing for every node's) makes its own family. Prints the table it plots, with the
growth of time and of stages from the first point. The PNG is written atomically.
"""
import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict

# scripts/ holds tokenize.py, which would shadow the standard module matplotlib imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]


def load_runs(path):
    with open(path) as f:
        data = json.load(f)
    families = defaultdict(list)
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        parts = b["name"].split("/")
        name = parts[0]
        if len(parts) > 2 and parts[2] == "1":
            name += " (one node's stages)"
        elif len(parts) > 2 and parts[2] == "0":
            name += " (every rank's)"
        if "gpus" not in b or "stages" not in b:
            continue
        unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
        families[name].append((int(b["gpus"]), float(b["stages"]), float(b["real_time"]) * unit))
    if not families:
        sys.exit(f"{path}: no benchmark with gpus and stages counters")
    return {k: sorted(v) for k, v in families.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json")
    ap.add_argument("-o", "--output", required=True, help="PNG to write")
    args = ap.parse_args()
    families = load_runs(args.bench_json)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    print(f"{'benchmark':<30} {'GPUs':>5} {'stages':>10} {'wall s':>9} {'time x':>8} {'stages x':>9}")
    for name, runs in families.items():
        gpus = [g for g, _, _ in runs]
        wall = [t for _, _, t in runs]
        g0, s0, t0 = runs[0]
        for g, s, t in runs:
            print(f"{name:<30} {g:>5} {s:>10.0f} {t:>9.3f} {t / t0:>8.1f} {s / s0:>9.1f}")
        (line,) = ax.plot(gpus, wall, "o-", label=name.replace("BM_", ""))
        ax.plot(gpus, [t0 * s / s0 for _, s, _ in runs], ":", color=line.get_color(), alpha=0.6)
    ax.set_xscale("log", base=2)
    ticks = sorted({g for runs in families.values() for g, _, _ in runs})
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(g) for g in ticks])
    ax.minorticks_off()
    ax.set_yscale("log")
    ax.set_xlabel("GPUs (8 per node)")
    ax.set_ylabel("wall time of one simulated step (s, one core)")
    ax.set_title("Simulation cost against cluster size (dotted: linear in the stages)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_dir = os.path.dirname(os.path.abspath(args.output))
    fd, tmp = tempfile.mkstemp(suffix=".png", dir=out_dir)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, args.output)
    except BaseException:
        os.unlink(tmp)
        raise


if __name__ == "__main__":
    main()
