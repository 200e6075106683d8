"""Draws an autobatch JSON report: measured peak bytes against the micro-batch, with one line
per phase of the step (trials[].phase_peaks: inputs, forward, loss, backward, optimizer-step).

Usage: plot_report.py report.json out.png

Each trial is a point (fits: filled circle, out-of-memory: red cross, size limit: triangle; trials
with 2 micro-batches per step are drawn hollow), with the affine fit (fixed + per-sample x B), the
memory limit, the limit less the margin, and the chosen (safe) micro-batch. Out-of-memory points
are lower bounds: the peak reached before the failing allocation.

A report with a fleet table (--fleet) gets a second panel: each size's safe micro-batch (a bar,
labelled with its plan), sizes that fit nothing at 0 and sizes above what the device could
emulate marked "not measurable"; the trial panel then draws every size's limit.

A find_sharded table along the world size (`json.dump(table.to_dict(), f)`, docs/python.md)
is drawn as two panels over the world sizes: the binding rank's max and safe micro-batch (labelled
with the plan's micro-batch x accumulation steps), and the rank's sharded state (parameter shard,
gradients, optimizer state) in MiB.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

GIB = float(1 << 30)


def main(report_path: str, out_path: str) -> None:
    with open(report_path) as f:
        doc = json.load(f)
    if "world_sizes" in doc:
        sharded_table(doc, out_path)
        return
    trials = doc.get("trials") or []
    if not trials:
        sys.exit(f"plot_report: {report_path} has no trials (status {doc.get('status')})")
    fleet = doc.get("fleet")
    if fleet:
        fig, (ax, bars) = plt.subplots(1, 2, figsize=(14, 5), width_ratios=[3, 2])
        fleet_panel(bars, fleet)
        for row in fleet["rows"]:
            if row["status"] != "not-measurable":
                ax.axhline(row["bytes"] / GIB, color="grey", linestyle=(0, (1, 3)), linewidth=1)
    else:
        fig, ax = plt.subplots(figsize=(8, 5))
    styles = {"fits": ("o", "tab:green"), "out-of-memory": ("x", "tab:red"),
              "size-limit": ("^", "tab:orange")}
    seen = set()
    for t in trials:
        marker, colour = styles[t["outcome"]]
        label = t["outcome"] + (" (2 micro-batches)" if t["micro_batches_per_step"] == 2 else "")
        face = colour if t["micro_batches_per_step"] == 1 or marker == "x" else "none"
        ax.scatter(t["micro_batch_size"], t["peak_bytes"] / GIB, marker=marker, color=colour,
                   facecolors=face, s=50, label=None if label in seen else label, zorder=3)
        seen.add(label)
    batches = [t["micro_batch_size"] for t in trials]
    # One line per phase (the largest over its micro-batches), from the fitting trials of the
    # search's own mode: where the peak is set, and how each phase grows with the batch.
    mode = max((t["micro_batches_per_step"] for t in trials), default=1)
    phases: dict[str, list[tuple[int, float]]] = {}
    for t in sorted(trials, key=lambda t: t["micro_batch_size"]):
        if t["outcome"] != "fits" or t["micro_batches_per_step"] != mode:
            continue
        top: dict[str, int] = {}
        for p in t.get("phase_peaks") or []:
            top[p["phase"]] = max(top.get(p["phase"], 0), p["peak_allocated_bytes"])
        for phase, peak in top.items():
            phases.setdefault(phase, []).append((t["micro_batch_size"], peak / GIB))
    for phase, points in phases.items():
        if len(points) >= 2:
            ax.plot([x for x, _ in points], [y for _, y in points], "-", linewidth=1, alpha=0.7,
                    label=f"{phase} (allocated)")
    fit = doc.get("fit") or {}
    if fit.get("points", 0) >= 2:
        xs = [0, max(batches) * 1.05]
        ys = [(fit["fixed_bytes"] + fit["per_sample_bytes"] * x) / GIB for x in xs]
        ax.plot(xs, ys, "--", color="grey",
                label=f"affine fit: {fit['fixed_bytes'] / GIB:.2f} GiB + "
                      f"{fit['per_sample_bytes'] / (1 << 20):.2f} MiB x B")
    result = doc.get("result") or {}
    limit = result.get("memory_limit_bytes") or doc["device"].get("memory_limit_bytes", 0)
    if limit:
        ax.axhline(limit / GIB, color="black", label=f"limit {limit / GIB:.2f} GiB")
        margin = result.get("margin_bytes", 0)
        if margin:
            ax.axhline((limit - margin) / GIB, color="black", linestyle=":",
                       label=f"limit less margin {(limit - margin) / GIB:.2f} GiB")
    safe = result.get("safe_micro_batch", 0)
    if safe:
        ax.axvline(safe, color="tab:blue", linestyle="-.", label=f"safe micro-batch {safe}")
    model = doc["options"]["model"].split("/")[-1]
    ax.set_title(f"autobatch: {model} on {doc['device']['name']} "
                 f"({doc['options']['precision']}, {doc['options']['optimizer']})")
    ax.set_xlabel("micro-batch size (samples)")
    ax.set_ylabel("peak memory (GiB)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    print(f"plot_report: wrote {out_path}")


def fleet_panel(ax, fleet) -> None:
    """One bar per size of the fleet table: its safe micro-batch and plan."""
    rows = fleet["rows"]
    names = [r["name"] for r in rows]
    safe = [r["safe_micro_batch"] for r in rows]
    ax.bar(range(len(rows)), safe, color="tab:blue")
    for i, r in enumerate(rows):
        if r["status"] == "not-measurable":
            text = "not measurable"
        elif r["safe_micro_batch"] <= 0:
            text = "nothing fits"
        elif r.get("plan"):
            p = r["plan"]
            text = f"{r['safe_micro_batch']}\n{p['micro_batch_size']} x {p['accumulation_steps']}"
        else:
            text = str(r["safe_micro_batch"])
        ax.annotate(text, (i, r["safe_micro_batch"]), ha="center", va="bottom", fontsize=8)
    def size(b):
        return f"{b / GIB:.1f} GiB" if b >= GIB else f"{b / (1 << 20):.0f} MiB"
    ax.set_xticks(range(len(rows)), [f"{n}\n{size(r['bytes'])}" for n, r in zip(names, rows)],
                  fontsize=8)
    ax.set_ylabel("safe micro-batch (samples)")
    ax.set_title(f"fleet: {len(rows)} sizes, {fleet['trials_run']} trials run")
    ax.grid(alpha=0.3, axis="y")


def sharded_table(doc, out_path) -> None:
    """find_sharded's ShardedTable.to_dict(): one column per world size, each row measured."""
    rows = doc["rows"]
    if not rows:
        sys.exit("plot_report: the sharded table has no rows")
    fig, (ax, state) = plt.subplots(1, 2, figsize=(13, 5))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["max_micro_batch"] for r in rows], 0.4, color="tab:grey",
           label="max micro-batch (seen to fit)")
    ax.bar([i + 0.2 for i in x], [r["safe_micro_batch"] for r in rows], 0.4, color="tab:blue",
           label="safe micro-batch (margin)")
    for i, r in enumerate(rows):
        plans = r.get("plan") or {}
        p = plans.get(plans.get("primary", ""), None)
        if p:
            ax.annotate(f"{p['micro_batch_size']} x {p['accumulation_steps']}",
                        (i + 0.2, r["safe_micro_batch"]), ha="center", va="bottom", fontsize=8)
    labels = [f"{r['world_size']}\nrank {r['binding_rank']}" for r in rows]
    world_size_axes(ax, labels, "micro-batch (samples per rank)",
                    "find_sharded: per rank, along the world size (plan: micro-batch x steps)")
    parts = (("parameter_bytes", "parameter shard (padded)"), ("gradient_bytes", "gradients"),
             ("optimizer_state_bytes", "optimizer state"))
    for k, (key, name) in enumerate(parts):
        values = []
        for r in rows:
            rank = next(x for x in r["ranks"] if x["rank"] == r["binding_rank"])
            values.append(rank.get(key, 0) / (1 << 20))
        state.bar([i + (k - 1) * 0.27 for i in x], values, 0.27, label=name)
    world_size_axes(state, labels, "MiB on the rank", "the rank's sharded state")
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    print(f"plot_report: wrote {out_path}")


def world_size_axes(ax, labels, ylabel, title) -> None:
    """A panel with one column per world size: ticks, labels, grid and legend."""
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel("world size (the binding rank)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot_report.py report.json out.png")
    main(sys.argv[1], sys.argv[2])
