"""Checks of the `oom` Python module (python/module.cc): each function answers with plain values,
bad input raises ValueError naming the field, and the numbers agree with the C++ libraries'
contracts. Run by CTest through run_python_check.sh."""
import json
import os

import numpy as np

import oom
from oom import plots as oom_plots

src = os.environ["OOM_SOURCE_DIR"]
records_path = os.path.join(src, "traces", "paper", "paper-calibration.jsonl")

# Specs.
assert "qwen3.6-35b-a3b" in oom.model_names()
m = oom.model("qwen3.6-35b-a3b")
assert m["layers"] == 40 and m["experts"] == 256 and m["total_params"] > m["active_params"] > 0, m
assert oom.hardware("h100-sxm-node")["name"] == "h100-sxm-node"
assert "analytic" in oom.engines()

# Plan search: a plan that fits its budgets, and an infeasible workload as RuntimeError.
w = {"model": "qwen3.6-35b-a3b", "hardware": "h100-sxm-node", "gpus": 4, "global_batch": 32, "seq_len": 4096}
found = oom.search_plan(w)
assert found["predicted_step_s"] > 0 and found["gpu_peak_gib"] <= 80, found
try:
    oom.search_plan(dict(w, gpu_budget_gib=1.0))
    raise AssertionError("a 1 GiB GPU budget cannot fit")
except RuntimeError as e:
    assert "GiB" in str(e), e

# Simulation: stage times as numpy arrays consistent with the step time.
sim = oom.simulate(w, found["plan"])
st = sim["stages_table"]
assert isinstance(st["start_s"], np.ndarray) and len(st["start_s"]) == len(st["name"]) == sim["stages"]
assert np.all(st["end_s"] >= st["start_s"]) and abs(st["end_s"].max() - sim["step_s"]) < 1e-9
chrome = oom.chrome_trace(sim["trace"])
assert any(e["ph"] == "X" for e in chrome["traceEvents"])
# Two alike nodes: one node's stages stand for both unless every_rank; the same step and peaks
# (the published R23 plan: the search's plan above has a Ring-DTP head, whose ring crosses the
# nodes one way, so it gets every rank's stages either way).
two = {"model": "qwen3.6-35b-a3b", "hardware": "h200-sxm-node", "nodes": 2, "gpus": 16, "global_batch": 32, "seq_len": 4096}
with open(os.path.join(src, "experiments", "default", "plan-r23.json")) as f:
    r23 = json.load(f)
assert oom.simulate(two, found["plan"])["ranks_emitted"] == 0
one_node = oom.simulate(two, r23)
every = oom.simulate(two, r23, every_rank=True)
assert one_node["ranks_emitted"] == 8 and every["ranks_emitted"] == 0, (one_node["ranks_emitted"], every["ranks_emitted"])
assert len(every["stages_table"]["name"]) > len(one_node["stages_table"]["name"])
assert abs(one_node["step_s"] - every["step_s"]) <= 1e-9 * every["step_s"] and one_node["gpu_peak_gib"] == every["gpu_peak_gib"]

# Baselines: a step at 4K, out-of-memory with where at 1M.
b = oom.baseline("zero-offload", w)
assert b["fits"] and b["step_s"] > 0, b
long = dict(w, global_batch=4, seq_len=1048576, yarn_factor=4)
b = oom.baseline("fsdp2-offload", long)
assert not b["fits"] and b["step_s"] is None and b["oom"]["space"] == "gpu", b
try:
    oom.baseline("no-such-system", w)
    raise AssertionError("unknown system")
except ValueError as e:
    assert "system" in str(e)
try:
    oom.simulate(dict(w, gpus=0), found["plan"])
    raise AssertionError("gpus 0 is bad input")
except ValueError as e:
    assert "gpus" in str(e), e

# Validation and records.
v = oom.validate(records_path)
assert v["count"] >= 15 and v["median_abs_rel_error"] <= 0.075 and v["baseline_count"] == 3, v["count"]
assert len(oom.records(records_path)) >= 20

# A small study and its plots (PNG bytes).
study = {"name": "py", "baselines": ["megatrain"],
         "sweeps": [{"name": "batch", "models": ["qwen3.6-35b-a3b"], "hardware": ["h100-sxm-node"], "gpus": [4],
                     "global_batch": [16, 32], "seq_len": [4096]}]}
r = oom.whatif(study)
assert len(r["rows"]) == 2 and r["csv"].startswith("sweep,"), r
for kind, text in (("throughput", r["csv"]), ("memory", r["csv"]), ("timeline", json.dumps(sim["trace"]))):
    png = oom.plot_png(kind, text)
    assert png[:8] == b"\x89PNG\r\n\x1a\n", kind
assert oom_plots.sweeps_of(oom_plots.read_rows(r["csv"])) == ["batch"]
print("oom module checks passed")
