"""CPU AdamW against the peers a user would pick, in one run, on one working set far past the
last-level cache: PyTorch's torch.optim.AdamW(fused=True) on CPU and DeepSpeed's DeepSpeedCPUAdam
(both from the project's virtual environment), and this project's kernel and a STREAM-like triad
(write-allocate traffic counted) measured by the adamw_bench program in the same run.

    .venv/bin/python tests/bench/adamw_peers.py build/tests/bench/adamw_bench [--params N] [--threads T]

Prints params/s of each, the ratio of ours to the faster peer, and ours as a fraction of the triad
bandwidth (28 B/param). Every optimizer gets the same FP32 parameters, gradients and thread count.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def time_steps(step, steps):
    """Mean seconds per step after one untimed step (first touch, lazy set-up): the statistic
    Google Benchmark reports for the adamw_bench runs."""
    step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t0) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench", help="path of the adamw_bench program")
    ap.add_argument("--params", type=int, default=192 << 20, help="parameters (default 192 Mi: 2.25 GiB of FP32 master and moments)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    import torch

    torch.set_num_threads(a.threads)
    n = a.params
    rates = {}

    def peer(name, make):
        p = torch.nn.Parameter(torch.randn(n))
        p.grad = torch.randn(n) * 1e-2
        opt = make([p])
        rates[name] = n / time_steps(opt.step, a.steps)
        del opt, p

    peer("torch.optim.AdamW(fused=True)", lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01, fused=True))
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        peer("DeepSpeedCPUAdam", lambda ps: DeepSpeedCPUAdam(ps, lr=1e-3, weight_decay=0.01, adamw_mode=True))
    except Exception as e:  # a peer that cannot run is reported, not hidden
        print(f"DeepSpeedCPUAdam could not run: {type(e).__name__}: {e}", file=sys.stderr)
        if os.environ.get("CI") == "true":
            raise

    env = dict(os.environ, OOM_ADAMW_BENCH_PARAMS=str(n))
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "bench.json")
        subprocess.run([a.bench, "--benchmark_filter=BM_CpuAdamW/|BM_Triad/", f"--benchmark_out={result}",
                        "--benchmark_out_format=json", f"--benchmark_min_time={max(1, a.steps)}x"],
                       env=env, capture_output=True, text=True, check=True)
        out = json.load(open(result))
    for b in out["benchmarks"]:
        if b["name"].startswith("BM_CpuAdamW/"):
            rates["oom cpu_adamw_step"] = b["params_per_s"]
        elif b["name"].startswith("BM_Triad/"):
            triad_Bps = b["bytes_per_s"]
    for name, r in rates.items():
        print(f"{name:32s} {r:.3g} params/s")
    ours = rates["oom cpu_adamw_step"]
    peers = {k: v for k, v in rates.items() if k != "oom cpu_adamw_step"}
    best = max(peers, key=peers.get)
    print(f"threads {a.threads}, {n} params ({12 * n / 2**30:.2f} GiB of master and moments)")
    print(f"ours / fastest peer ({best}): {ours / peers[best]:.2f}x")
    print(f"ours moves {28 * ours:.3g} B/s; triad (write-allocate counted) {triad_Bps:.3g} B/s: {28 * ours / triad_Bps:.2f} of the triad")


if __name__ == "__main__":
    main()
