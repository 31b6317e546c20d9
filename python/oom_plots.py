"""Plots of OOM studies and traces, rendered with matplotlib's Agg backend to PNG bytes.

The `oom` command embeds this file (python/plot_bridge.cc) for `oom plot` and `oom whatif`; notebooks
import it directly. Inputs are the texts the project writes: a study CSV (experiments/study.h,
`oom whatif`) or a trace JSON (`oom simulate --trace`: Chrome trace events, or traces/trace.h's
own form). Every function returns the PNG file's bytes; the caller writes them (atomically).
Plots carry a title, axis labels with units and a legend. No state is kept between calls.
"""

import csv
import io
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

BASELINE_SUFFIX = "_tokens_per_s"
SYSTEM_LABELS = {
    "plan": "OOM (planned)",
    "fsdp2-offload": "FSDP2 + CPU offload",
    "zero-offload": "ZeRO-3 Offload",
    "megatrain": "MegaTrain",
}


def read_rows(csv_text):
    """The rows of a study CSV as dicts of strings."""
    return list(csv.DictReader(io.StringIO(csv_text)))


def baselines_of(rows):
    """Baseline system names present in the CSV columns, in column order."""
    if not rows:
        return []
    return [c[: -len(BASELINE_SUFFIX)] for c in rows[0].keys()
            if c.endswith(BASELINE_SUFFIX) and c != "tokens_per_s"]


def sweeps_of(rows):
    """Sweep names in order of first appearance."""
    seen = []
    for r in rows:
        if r["sweep"] not in seen:
            seen.append(r["sweep"])
    return seen


def _number(text):
    try:
        return float(text) if text not in ("", None) else None
    except ValueError:
        return None


def sweep_axis(rows):
    """(column, axis label, log scale) of the quantity a sweep varies."""
    for column, label, log in (("global_batch", "global batch (sequences per step)", True),
                               ("seq_len", "context (tokens per sequence)", True),
                               ("host_budget_gib", "host memory budget (GiB)", False),
                               ("gpu_budget_gib", "GPU memory budget (GiB)", False),
                               ("gpus", "GPUs", False)):
        if len({r[column] for r in rows}) > 1:
            return column, label, log
    return None, "case", False


def _series_key(r):
    parts = [r["model"], r["hardware"], "x" + r["gpus"]]
    return " ".join(parts)


def _x_values(rows, column):
    if column is None:
        return list(range(len(rows)))
    return [_number(r[column]) or 0.0 for r in rows]


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _plot_sweep(ax, rows, value_suffix, ylabel, title):
    """Lines for the planned system and each baseline; baselines out of memory are marked at 0."""
    column, xlabel, log = sweep_axis(rows)
    groups = {}
    for r in rows:
        groups.setdefault(_series_key(r), []).append(r)
    many = len(groups) > 1
    systems = ["plan"] + baselines_of(rows)
    markers = ["o", "s", "^", "D", "v", "P"]
    for gi, (key, grows) in enumerate(groups.items()):
        xs = _x_values(grows, column)
        for si, system in enumerate(systems):
            col = value_suffix.lstrip("_") if system == "plan" else system + value_suffix
            ys = [_number(r.get(col)) for r in grows]
            label = SYSTEM_LABELS.get(system, system) + (f" ({key})" if many else "")
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[si % len(markers)],
                        linestyle="-" if gi == 0 else "--", label=label)
            if system != "plan":
                oom = [x for x, r in zip(xs, grows) if r.get(system + "_oom")]
                if oom:
                    ax.scatter(oom, [0] * len(oom), marker="x", s=60, color="red", zorder=5,
                               label=f"{SYSTEM_LABELS.get(system, system)} out of memory" + (f" ({key})" if many else ""))
    if log:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def throughput_png(csv_text, sweep=None, title=None):
    """Throughput (tokens/s) against what the sweep varies, planned system and baselines."""
    rows = read_rows(csv_text)
    if not rows:
        raise ValueError("the study CSV has no rows")
    names = [sweep] if sweep else sweeps_of(rows)
    fig, axes = plt.subplots(1, len(names), figsize=(6.5 * len(names), 4.5), squeeze=False, constrained_layout=True)
    for ax, name in zip(axes[0], names):
        srows = [r for r in rows if r["sweep"] == name]
        if not srows:
            raise ValueError(f"no rows of sweep {name!r} in the study CSV")
        column, label, _ = sweep_axis(srows)
        what = label.split(" (")[0] if column else "case"
        keys = sorted({_series_key(r) for r in srows})
        where = keys[0] if len(keys) == 1 else f"{len(keys)} setups"
        _plot_sweep(ax, srows, "_tokens_per_s", "throughput (tokens/s)",
                    title or f"Throughput vs {what}: {where} (sweep {name})")
    return _png(fig)


def memory_png(csv_text, title=None):
    """Host memory and GPU peak (GiB) of the planned system and the baselines, per sweep."""
    rows = read_rows(csv_text)
    if not rows:
        raise ValueError("the study CSV has no rows")
    names = sweeps_of(rows)
    fig, axes = plt.subplots(2, len(names), figsize=(6.5 * len(names), 8), squeeze=False, constrained_layout=True)
    for i, name in enumerate(names):
        srows = [r for r in rows if r["sweep"] == name]
        _plot_sweep(axes[0][i], srows, "_host_gib", "host memory (GiB)", f"Host memory ({name})")
        _plot_sweep(axes[1][i], srows, "_gpu_peak_gib", "GPU peak (GiB)", f"GPU memory peak ({name})")
    if title:
        fig.suptitle(title)
    return _png(fig)


def trace_stages(trace_text):
    """(resource, start_s, end_s, kind) of every stage of a trace JSON, either form."""
    j = json.loads(trace_text)
    out = []
    if isinstance(j, dict) and "traceEvents" in j:
        threads = {}
        for e in j["traceEvents"]:
            if e.get("ph") == "M" and e.get("name") == "thread_name":
                threads[(e["pid"], e["tid"])] = e["args"]["name"]
        for e in j["traceEvents"]:
            if e.get("ph") == "X":
                res = threads.get((e["pid"], e["tid"]), f"{e['pid']}.{e['tid']}")
                out.append((res, e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6, e.get("cat", "")))
    elif isinstance(j, dict) and "stages" in j:
        for s in j["stages"]:
            out.append((s["resource"], s["start_s"], s["end_s"], s["kind"]))
    else:
        raise ValueError("not a trace: expected Chrome trace events or an object with 'stages'")
    if not out:
        raise ValueError("the trace has no stages")
    return out


def timeline_png(trace_text, title=None, max_resources=24):
    """A Gantt chart of stages per resource (rank 0's streams and executors when there are many)."""
    stages = trace_stages(trace_text)
    resources = sorted({s[0] for s in stages})
    if len(resources) > max_resources:
        keep = [r for r in resources if r.startswith("gpu0.") or r.endswith(".r0")]
        resources = keep or resources[:max_resources]
    row = {r: i for i, r in enumerate(resources)}
    kinds = sorted({s[3] for s in stages if s[0] in row})
    cmap = plt.get_cmap("tab20")
    color = {k: cmap(i % 20) for i, k in enumerate(kinds)}
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(resources) + 2))
    for res, start, end, kind in stages:
        if res in row and end > start:
            ax.barh(row[res], end - start, left=start, height=0.8, color=color[kind], linewidth=0)
    ax.set_yticks(range(len(resources)))
    ax.set_yticklabels(resources, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("time in step (s)")
    ax.set_ylabel("resource (stream or executor)")
    ax.set_title(title or "Step timeline: stages per resource")
    handles = [matplotlib.patches.Patch(color=color[k], label=k) for k in kinds]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="stage kind")
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def render(kind, text, sweep="", title=""):
    """Dispatch used by the C++ bridge: kind is 'throughput', 'memory' or 'timeline'."""
    if kind == "throughput":
        return throughput_png(text, sweep or None, title or None)
    if kind == "memory":
        return memory_png(text, title or None)
    if kind == "timeline":
        return timeline_png(text, title or None)
    raise ValueError(f"unknown plot kind {kind!r} (throughput, memory, timeline)")
