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
    "megatron-lm": "Megatron-LM",
    "kt-ft": "KT-FT (CPU experts)",
}


def read_rows(csv_text):
    """The rows of a study CSV as dicts of strings."""
    return list(csv.DictReader(io.StringIO(csv_text)))


def baselines_of(rows):
    """Baseline system names present in the CSV columns, in column order."""
    if not rows:
        return []
    return [c[: -len(BASELINE_SUFFIX)] for c in rows[0].keys()
            if c.endswith(BASELINE_SUFFIX) and c != "tokens_per_s" and "published" not in c]


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


def system_label(system):
    """Legend label of a study's OOM system (the CSV's `system` column) or baseline."""
    if system in SYSTEM_LABELS:
        return SYSTEM_LABELS[system]
    kind, _, arg = system.partition(":")
    if system == "search":
        return SYSTEM_LABELS["plan"]
    if kind == "search":
        return f"OOM {'EP' if arg == 'ep' else 'Local'} (configured)"
    if kind == "base":
        return "Base (faster path)" if not arg else f"Base {'EP' if arg == 'ep' else 'Local'}"
    if kind == "ep":
        return f"OOM EP {arg}"
    if kind == "local":
        return f"OOM Local, policy {arg}"
    return system


def oom_systems_of(rows):
    """The OOM systems of a study CSV in order of first appearance ("search" for older CSVs)."""
    seen = []
    for r in rows:
        s = r.get("system") or "search"
        if s not in seen:
            seen.append(s)
    return seen


def setup_text(rows, swept):
    """The fixed part of a sweep's setup for titles: "qwen3.6-35b-a3b, 4x h100-sxm-node, 4K context"."""
    def one(col):
        vals = []
        for r in rows:
            if r[col] not in vals:
                vals.append(r[col])
        return vals
    parts = []
    models = one("model")
    parts.append(models[0] if len(models) == 1 else f"{len(models)} models")
    hw, gpus = one("hardware"), one("gpus")
    if len(hw) == 1 and len(gpus) == 1:
        parts.append(f"{gpus[0]}x {hw[0]}")
    elif len(hw) == 1:
        parts.append(hw[0])
    if swept != "seq_len" and len(one("seq_len")) == 1:
        parts.append(f"{_tokens(int(rows[0]['seq_len']))} context")
    if swept != "global_batch" and len(one("global_batch")) == 1:
        parts.append(f"batch {rows[0]['global_batch']}")
    return ", ".join(parts)


def _tokens(t):
    if t >= 1 << 20 and t % (1 << 20) == 0:
        return f"{t >> 20}M"
    if t >= 1024 and t % 1024 == 0:
        return f"{t >> 10}K"
    return str(t)


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
    """One line per system (OOM systems and baselines), one color per system; setups differ by line
    style. Out of memory (a baseline's OOM, or no OOM plan that fits) is an x at the top edge of the
    plot in the system's color; published points (study CSVs with --published) are hollow stars."""
    column, xlabel, log = sweep_axis(rows)
    categorical = column is None
    if categorical:
        cats = []
        for r in rows:
            if _series_key(r) not in cats:
                cats.append(_series_key(r))
        groups = {"": rows}
    else:
        groups = {}
        for r in rows:
            groups.setdefault(_series_key(r), []).append(r)
    oom_systems = oom_systems_of(rows)
    systems = [("oom", s) for s in oom_systems] + [("baseline", b) for b in baselines_of(rows)]
    markers = ["o", "s", "^", "D", "v", "P", "X", "h"]
    cmap = plt.get_cmap("tab10" if len(systems) <= 10 else "tab20")
    colors = cmap.N
    styles = ["-", "--", ":", "-."]
    plain = value_suffix.lstrip("_")
    labelled, any_oom, oom_rank = set(), False, {}
    for gi, (key, grows) in enumerate(groups.items()):
        for si, (kind, system) in enumerate(systems):
            if kind == "oom":
                srows = [r for r in grows if (r.get("system") or "search") == system]
                col, pub_col = plain, "published_" + plain
                oom_of = lambda r: r.get("status") == "infeasible"  # noqa: E731
            else:
                first = oom_systems[0]
                srows = [r for r in grows if (r.get("system") or "search") == first]
                col, pub_col = system + value_suffix, system + "_published" + value_suffix
                oom_of = lambda r, s=system: bool(r.get(s + "_oom"))  # noqa: E731
            if not srows:
                continue
            xs = [cats.index(_series_key(r)) for r in srows] if categorical else _x_values(srows, column)
            color = cmap(si % colors)
            label = system_label(system) if system not in labelled else None
            ys = [_number(r.get(col)) for r in srows]
            pts = [(x, y) for x, y, r in zip(xs, ys, srows) if y is not None and not oom_of(r)]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[si % len(markers)], color=color,
                        linestyle="none" if categorical else styles[gi % len(styles)], label=label)
                labelled.add(system)
            oom = [x for x, r in zip(xs, srows) if oom_of(r)]
            if oom:
                any_oom = True
                # Staggered just below the top edge so that several systems out of memory stay visible.
                rank = oom_rank.setdefault(system, len(oom_rank))
                ax.scatter(oom, [0.97 - 0.035 * rank] * len(oom), marker="x", s=70, color=color, zorder=6, clip_on=False,
                           transform=ax.get_xaxis_transform(), label=None if system in labelled else label)
                labelled.add(system)
            pubs = [(x, _number(r.get(pub_col))) for x, r in zip(xs, srows)]
            pubs = [(x, y) for x, y in pubs if y is not None]
            if pubs:
                ax.scatter([p[0] for p in pubs], [p[1] for p in pubs], marker="*", s=160, facecolors="none",
                           edgecolors=color, linewidths=1.4, zorder=7,
                           label=f"{system_label(system)}, published" if ("pub", system) not in labelled else None)
                labelled.add(("pub", system))
    if any_oom:
        ax.text(0.99, 0.02, "x at the top edge: out of memory", transform=ax.transAxes, ha="right", va="bottom",
                fontsize=7, color="dimgray")
    if categorical:
        xlabel = "setup (model, hardware, GPUs)"
        ax.set_xticks(range(len(cats)))
        ax.set_xticklabels(cats, fontsize=7, rotation=10)
        ax.set_xlim(-0.5, len(cats) - 0.5)
    elif log:
        ax.set_xscale("log", base=2)
        ticks = sorted({x for x in _x_values(rows, column) if x > 0})
        ax.set_xticks(ticks)
        ax.set_xticklabels([_tokens(int(t)) if column == "seq_len" else f"{t:g}" for t in ticks], fontsize=8)
        ax.minorticks_off()
    ax.set_ylim(bottom=0)
    if any_oom:
        ax.set_ylim(0, ax.get_ylim()[1] * 1.15)  # room for the out-of-memory marks above the data
    if len(groups) > 1:
        for gi, key in enumerate(groups):
            ax.plot([], [], color="gray", linestyle=styles[gi % len(styles)], label=key)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def throughput_png(csv_text, sweep=None, title=None):
    """Throughput (tokens/s) against what the sweep varies, every system of the study."""
    rows = read_rows(csv_text)
    if not rows:
        raise ValueError("the study CSV has no rows")
    names = [sweep] if sweep else sweeps_of(rows)
    fig, axes = plt.subplots(1, len(names), figsize=(7.5 * len(names), 4.5), squeeze=False, constrained_layout=True)
    for ax, name in zip(axes[0], names):
        srows = [r for r in rows if r["sweep"] == name]
        if not srows:
            raise ValueError(f"no rows of sweep {name!r} in the study CSV")
        column, label, _ = sweep_axis(srows)
        what = label.split(" (")[0] if column else "setup"
        _plot_sweep(ax, srows, "_tokens_per_s", "throughput (tokens/s)",
                    title or f"Throughput vs {what}: {setup_text(srows, column)}")
    return _png(fig)


def memory_png(csv_text, title=None):
    """Host memory and GPU peak (GiB) of every system, per sweep."""
    rows = read_rows(csv_text)
    if not rows:
        raise ValueError("the study CSV has no rows")
    names = sweeps_of(rows)
    fig, axes = plt.subplots(2, len(names), figsize=(7.5 * len(names), 8), squeeze=False, constrained_layout=True)
    for i, name in enumerate(names):
        srows = [r for r in rows if r["sweep"] == name]
        column, _, _ = sweep_axis(srows)
        where = setup_text(srows, column)
        _plot_sweep(axes[0][i], srows, "_host_gib", "host memory (GiB)", f"Host memory: {where}")
        _plot_sweep(axes[1][i], srows, "_gpu_peak_gib", "GPU peak (GiB)", f"GPU memory peak: {where}")
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


def ablation_png(csv_text, title=None):
    """A matched component study (oom ablation): per workload, the study's peak (GiB), the GPU
    peak (GiB) and the step time (s) of every variant, the reference first; the change against
    the reference is written on each bar."""
    rows = read_rows(csv_text)
    if not rows:
        raise ValueError("the ablation CSV has no rows")
    workloads = []
    for r in rows:
        if r["workload"] not in workloads:
            workloads.append(r["workload"])
    peak_column = "study_peak_gib"
    fig, axes = plt.subplots(len(workloads), 3, figsize=(16, 3.6 * len(workloads)), squeeze=False, constrained_layout=True)
    for i, w in enumerate(workloads):
        wrows = [r for r in rows if r["workload"] == w]
        names = [r["variant"] for r in wrows]
        for ax, column, label, change in ((axes[i][0], peak_column, "study peak (GiB)", "peak_change"),
                                          (axes[i][1], "gpu_peak_gib", "GPU peak (GiB)", "gpu_peak_change"),
                                          (axes[i][2], "step_s", "step time (s)", "step_change")):
            values = [float(r[column]) for r in wrows]
            colors = ["#888888"] + ["C%d" % (j % 10) for j in range(len(values) - 1)]
            bars = ax.bar(range(len(values)), values, color=colors)
            for j, (b, r) in enumerate(zip(bars, wrows)):
                if j > 0:
                    ax.annotate(f"{100 * float(r[change]):+.1f}%", (b.get_x() + b.get_width() / 2, b.get_height()),
                                ha="center", va="bottom", fontsize=7)
            ax.set_xticks(range(len(values)))
            ax.set_xticklabels(names, rotation=25, ha="right", fontsize=7)
            ax.set_ylabel(label)
            ax.set_title(f"{w}: {label.split(' (')[0]}", fontsize=9)
            ax.grid(True, axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    return _png(fig)


def render(kind, text, sweep="", title=""):
    """Dispatch used by the C++ bridge: kind is 'throughput', 'memory', 'timeline' or 'ablation'."""
    if kind == "ablation":
        return ablation_png(text, title or None)
    if kind == "throughput":
        return throughput_png(text, sweep or None, title or None)
    if kind == "memory":
        return memory_png(text, title or None)
    if kind == "timeline":
        return timeline_png(text, title or None)
    raise ValueError(f"unknown plot kind {kind!r} (throughput, memory, timeline, ablation)")
