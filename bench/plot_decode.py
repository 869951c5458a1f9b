#!/usr/bin/env python3
"""Plots the decode-side kernels' share of the copy bandwidth against the batch B: one line per
benchmark family and configuration of bench_decode's and bench_spec's Google Benchmark JSON
(median aggregates where repetitions ran), and dashed beside them the peer's (bench/peer_fla.py's
JSON, optional) on the same names. Each run's percent of copy is against its own copy ceiling, so
ours and the peer's compare although they ran in different processes.

  plot_decode.py bench_decode.json [bench_spec.json] [--peer peer.json] --out decode.png

Panels: decode; verify and commit (with the peer's verify, the only speculative call it has, also
drawn in grey beside the steps of its T as the least a step costs with it);
and, from bench_spec, whole speculative steps per state dtype: verify + commit, record_verify +
replay_commit and accept_verify, one colour per path and one marker per T. A step's percent of copy
counts the bytes its own path moves (bench_spec.cu), so the three paths' lines show how close each
runs to the bandwidth, and their times relate as their bytes over those percents.

A chunks_per_block other than 0 (the chooser's own pick) is a tuning sweep and is left out.
"""
import argparse
import re
import sys

import benchmark_json
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

BATCH = re.compile(r"/B:(\d+)")


def split_name(name):
    """('BM_Verify/T:4/bf16_state:0', 64) from 'BM_Verify/B:64/T:4/bf16_state:0/...'; None for
    names without a batch or with a forced chunks_per_block."""
    name = re.sub(r"/manual_time$|_median$", "", name)
    m = BATCH.search(name)
    if m is None or re.search(r"/chunks_per_block:(?!0\b)\d+", name):
        return None
    series = BATCH.sub("", name)
    series = re.sub(r"/chunks_per_block:0\b", "", series)
    return series, int(m[1])


def ours(path):
    doc = benchmark_json.load(path)
    runs = doc.get("benchmarks", [])
    have_medians = any(b.get("aggregate_name") == "median" for b in runs)
    points = {}
    for b in runs:
        if b.get("error_occurred") or b.get("pct_copy") is None:
            continue
        if have_medians and b.get("aggregate_name") != "median":
            continue
        key = split_name(b.get("run_name", b["name"]))
        if key:
            points.setdefault(key[0], {})[key[1]] = b["pct_copy"]
    return points


def peer(path):
    doc = benchmark_json.load(path)
    points = {}
    for r in doc.get("results", []):
        key = split_name(r["name"])
        if key and r.get("pct_copy") is not None:
            points.setdefault(key[0], {})[key[1]] = r["pct_copy"]
    return points


STEP_PATHS = {"BM_SpecStepState": "verify+commit", "BM_SpecStepRecords": "record_verify+replay_commit",
              "BM_SpecStepFused": "accept_verify"}
STEP_MARKERS = {"2": "o", "4": "s", "8": "^"}


def step_marker(name, default):
    """The marker of a name's draft length T (STEP_MARKERS), else `default`."""
    T = re.search(r"T:(\d+)", name)
    return STEP_MARKERS.get(T[1] if T else "", default)


def label(series):
    family, *params = series.split("/")
    text = STEP_PATHS.get(family, family.removeprefix("BM_"))
    for p in params:
        k, _, v = p.partition(":")
        text += {"bf16_state": " bf16 state" if v == "1" else " f32 state"}.get(k, f" {k}={v}")
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bench", nargs="+",
                        help="bench_decode's (and bench_spec's) --benchmark_out JSON")
    parser.add_argument("--peer", help="bench/peer_fla.py's --out JSON")
    parser.add_argument("--out", required=True, help="the PNG to write")
    args = parser.parse_args()

    mine = {}
    for path in args.bench:
        mine.update(ours(path))
    if not mine:
        sys.exit(f"plot_decode: no benchmark with a batch and pct_copy in {', '.join(args.bench)}")
    theirs = peer(args.peer) if args.peer else {}

    # Single-token decode; verify and commit; the whole speculative step of each path.
    step = lambda s: s.split("/")[0] in STEP_PATHS
    panels = [("decode", [s for s in sorted(mine) if s.startswith("BM_Decode")]),
              ("verify, commit", [s for s in sorted(mine)
                                  if not s.startswith("BM_Decode") and not step(s)]),
              ("speculative step, f32 state",
               [s for s in sorted(mine) if step(s) and "bf16_state:0" in s]),
              ("speculative step, bf16 state",
               [s for s in sorted(mine) if step(s) and "bf16_state:1" in s])]
    panels = [(title, series) for title, series in panels if series]
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 7.5), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, names) in zip(axes[0], panels):
        for i, series in enumerate(names):
            colour = colours[i % len(colours)]
            style = "o-"
            family = series.split("/")[0]
            if family in STEP_PATHS:
                colour = colours[list(STEP_PATHS).index(family)]
                style = step_marker(series, "o") + "-"
            xs = sorted(mine[series])
            ax.plot(xs, [mine[series][x] for x in xs], style, color=colour, label=label(series))
            if series in theirs:
                px = sorted(theirs[series])
                ax.plot(px, [theirs[series][x] for x in px], "x--", color=colour,
                        label=label(series) + " (fla)")
        # The peer has no commit and no record path: beside the steps, its verify alone (the
        # step's lower bound for fla), once per T of the panel.
        steps_shown = {s.split("/", 1)[1] for s in names if s.split("/")[0] in STEP_PATHS}
        for params in sorted(steps_shown):
            series = "BM_Verify/" + params
            if series in theirs:
                px = sorted(theirs[series])
                ax.plot(px, [theirs[series][x] for x in px],
                        step_marker(params, "x") + ":", color="grey",
                        label=label(series) + " (fla, verify alone)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch B (rows)")
        ax.set_ylabel("% of the same run's copy bandwidth")
        ax.set_ylim(0, 100)
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{title}: state traffic as % of copy")
        # Below the axes: the step panels have a dozen lines over the whole range.
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"plot_decode: {len(mine)} series ({len(theirs)} of the peer) -> {args.out}")


if __name__ == "__main__":
    main()
