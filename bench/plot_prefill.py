#!/usr/bin/env python3
"""Plots prefill token-heads per second against heads, ours (bench_prefill's Google Benchmark
JSON) beside the peer (optional: a run's log from scripts/peer_chunk_kda.py, whose last JSON line
is its summary, or a stored JSON document of the same form such as
bench/baselines/peer_prefill.json, drawn as stored figures), one line per sequence length at B = 1.
Usage: plot_prefill.py bench.json [peer.log | peer.json] out.png"""
import json
import re
import sys

import benchmark_json
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def ours(path):
    points = {}
    for b in benchmark_json.load(path)["benchmarks"]:
        m = re.match(r"BM_Prefill/T:(\d+)/H:(\d+)/B:1/.*_median$", b["name"])
        if m:
            points.setdefault(int(m[1]), []).append((int(m[2]), b["token_heads_per_s"]))
    return points


def peer(path):
    """The peer's series: {label: {T: [(H, rate)]}}. A run's log gives one series; a stored
    document one per fla version its entries' sources name, so versions are never joined."""
    text = open(path).read()
    try:
        summary, stored = json.loads(text), True
    except json.JSONDecodeError:
        lines = [line for line in text.splitlines() if line.startswith("{")]
        summary, stored = (json.loads(lines[-1]) if lines else {}), False
    series = {}
    for name, r in summary.items():
        m = re.match(r"T=(\d+) H=(\d+) B=1$", name)
        if not m:
            continue
        label = "fla chunk_kda"
        if stored:
            version = re.search(r"fla-core ([0-9.]+)", r.get("source", ""))
            label += f" {version[1] if version else '?'} (stored)"
        series.setdefault(label, {}).setdefault(int(m[1]), []).append((int(m[2]), r["token_heads_per_s"]))
    return series


def main():
    args = sys.argv[1:]
    if len(args) not in (2, 3):
        sys.exit(__doc__)
    series = [("ours", ours(args[0]), "-o")]
    if len(args) == 3:
        series += [(label, points, "--s") for label, points in sorted(peer(args[1]).items())]
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for label, points, style in series:
        for T, pts in sorted(points.items()):
            pts.sort()
            ax.plot([h for h, _ in pts], [r for _, r in pts], style, label=f"{label}, T = {T}")
    ax.set_xlabel("heads (H = HV), B = 1")
    ax.set_ylabel("token-heads per second")
    ax.set_title("KDA prefill on one H200, K = V = 128, bf16")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, never over a point
    fig.tight_layout()
    fig.savefig(args[-1], dpi=120)


if __name__ == "__main__":
    main()
