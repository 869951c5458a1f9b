#!/usr/bin/env python3
"""Plots prefill token-heads per second against heads, ours (bench_prefill's Google Benchmark
JSON) beside the peer (scripts/peer_chunk_kda.py's JSON line, optional), one line per sequence
length at B = 1. Usage: plot_prefill.py bench.json [peer.json] out.png"""
import json
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def ours(path):
    points = {}
    for b in json.load(open(path))["benchmarks"]:
        m = re.match(r"BM_Prefill/T:(\d+)/H:(\d+)/B:1/.*_median$", b["name"])
        if m:
            points.setdefault(int(m[1]), []).append((int(m[2]), b["token_heads_per_s"]))
    return points


def peer(path):
    points = {}
    with open(path) as f:
        lines = [line for line in f if line.startswith("{")]
    for name, r in (json.loads(lines[-1]).items() if lines else []):
        m = re.match(r"T=(\d+) H=(\d+) B=1$", name)
        if m:
            points.setdefault(int(m[1]), []).append((int(m[2]), r["token_heads_per_s"]))
    return points


def main():
    args = sys.argv[1:]
    if len(args) not in (2, 3):
        sys.exit(__doc__)
    series = [("ours", ours(args[0]), "-o")]
    if len(args) == 3:
        series.append(("fla chunk_kda", peer(args[1]), "--s"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points, style in series:
        for T, pts in sorted(points.items()):
            pts.sort()
            ax.plot([h for h, _ in pts], [r for _, r in pts], style, label=f"{label}, T = {T}")
    ax.set_xlabel("heads (H = HV), B = 1")
    ax.set_ylabel("token-heads per second")
    ax.set_title("KDA prefill on one H200, K = V = 128, bf16")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args[-1], dpi=120)


if __name__ == "__main__":
    main()
