#!/usr/bin/env python3
"""Plots the long-horizon drift CSV of gpu_drift (kernels/cuda/tests/gpu_drift.cpp): the state's and
the outputs' rms ratio against the f64 recurrence, against the number of steps, one line per
history, state dtype and gate form; the one-call tolerance of each state dtype dash-dotted and, in
grey, each state dtype and gate's rounding floor (the f64 reference's own single-token decodes on a
state of that dtype; the bound is 1.5 times it where that exceeds the tolerance).

    scripts/plot_drift.py drift.csv drift.png
"""
import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="gpu_drift's CSV (KDAGUARD_DRIFT_CSV)")
    parser.add_argument("png", help="the figure to write")
    args = parser.parse_args()

    series = defaultdict(list)
    floors = defaultdict(dict)  # (state dtype, gate) -> steps -> (state, out): one per history
    bounds = {}
    with open(args.csv, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["history"], row["state_dtype"], row["gate"])
            steps = int(row["steps"])
            series[key].append((steps, float(row["state_rms_ratio"]), float(row["out_rms_ratio"])))
            bounds[row["state_dtype"]] = float(row["bound"])
            if "floor_state" in row:
                floors[(row["state_dtype"], row["gate"])][steps] = (float(row["floor_state"]),
                                                                    float(row["floor_out"]))

    colors = {"f32": "tab:blue", "bf16": "tab:red"}
    styles = {"decode": "-", "prefill+decode": "--", "verify+commit": ":"}
    markers = {"softplus": "o", "bounded": "s", "activated": "^"}
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for axis, column, title in ((axes[0], 1, "state"), (axes[1], 2, "outputs (since the last checkpoint)")):
        for (history, dtype, gate), points in sorted(series.items()):
            points.sort()
            axis.plot([p[0] for p in points], [max(p[column], 1e-12) for p in points],
                      color=colors.get(dtype, "black"), linestyle=styles.get(history, "-"),
                      marker=markers.get(gate, "."), markersize=3, linewidth=1,
                      label=f"{history}, {dtype} state, {gate}")
        for (dtype, gate), by_steps in sorted(floors.items()):
            steps = sorted(by_steps)
            axis.plot(steps, [max(by_steps[n][column - 1], 1e-12) for n in steps], color="grey",
                      linestyle=":", marker=markers.get(gate, "."), markersize=2, linewidth=0.8)
        for dtype, bound in bounds.items():
            axis.axhline(bound, color=colors.get(dtype, "black"), linestyle="-.", linewidth=0.8)
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("steps (tokens served)")
        axis.set_title(f"{title}: rms(gpu - f64) / rms(f64)")
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("rms ratio")
    axes[1].legend(fontsize=6, ncol=2, loc="lower right")
    fig.suptitle("kdaguard: long-horizon drift on the GPU against the f64 recurrence (tolerances dash-dotted, rounding floors grey)")
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"plot_drift: {len(series)} series -> {args.png}")


if __name__ == "__main__":
    main()
