#!/usr/bin/env python3
"""Compares benchmark results (Google Benchmark JSON) with the stored baseline and with the peer.

  compare_baselines.py NEW.json [--baseline OLD.json] [--threshold 0.10]
      One line per benchmark in both files: old and new time, the change, and REGRESSION where the
      new median is slower by more than the threshold (default 10%). Exits 1 on any regression.
      Percent-of-copy figures are compared too, since they carry each run's own ceiling. The
      baseline defaults to the one current baseline of the benchmark binary that wrote NEW.json:
      bench/baselines/<binary>.json (bench_decode.json, bench_prefill.json); older ones live in
      git history.
  compare_baselines.py NEW.json --peer PEER.json
      Our time next to the peer's (bench/peer_fla.py) on the same shapes: speedup = peer / ours.
  compare_baselines.py NEW.json --steps
      bench_spec's speculative steps: per (B, T, state dtype) the time of verify + commit, of
      record_verify + replay_commit and of accept_verify in that run, and the two record paths'
      times over the first (issue 14 asks for <= 0.45x and <= 0.33x at B = 64, T = 4, f32 state).

Uses the median aggregate of each benchmark when repetitions were run, else its single entry.
"""
import argparse
import os
import re
import sys

import benchmark_json

BASELINES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines")


def load_benchmarks(path):
    doc = benchmark_json.load(path)
    medians, singles = {}, {}
    for b in doc.get("benchmarks", []):
        if b.get("error_occurred"):
            continue
        name = b.get("run_name", b["name"])
        entry = {"us": to_us(b["real_time"], b.get("time_unit", "ns")),
                 "pct_copy": b.get("pct_copy"), "TBps": b.get("TBps")}
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                medians[name] = entry
        else:
            singles.setdefault(name, entry)
    singles.update(medians)
    return doc.get("context", {}), singles


def to_us(value, unit):
    return value * {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[unit]


def short(name):
    """BM_Decode/B:64/bf16_state:0/chunks_per_block:0/manual_time -> the peer's key."""
    name = name.replace("/manual_time", "")
    return re.sub(r"/chunks_per_block:0$", "", name)


def compare_baseline(new, old, threshold):
    regressions = 0
    print(f"| benchmark | old us | new us | change | old % copy | new % copy | |")
    print("|---|---|---|---|---|---|---|")
    for name in sorted(set(new) & set(old)):
        n, o = new[name], old[name]
        change = n["us"] / o["us"] - 1.0
        flag = "REGRESSION" if change > threshold else ""
        regressions += bool(flag)
        pct = lambda e: f"{e['pct_copy']:.1f}" if e.get("pct_copy") is not None else ""
        print(f"| {name} | {o['us']:.2f} | {n['us']:.2f} | {change:+.1%} | {pct(o)} | {pct(n)} | {flag} |")
    missing = sorted(set(old) - set(new))
    if missing:
        print(f"\nin the baseline only: {', '.join(missing)}")
    return regressions


def compare_peer(new, peer):
    ours = {short(k): v for k, v in new.items()}
    print(f"| shape | ours us | ours % copy | peer us | peer % copy | speedup |")
    print("|---|---|---|---|---|---|")
    for p in peer["results"]:
        o = ours.get(p["name"])
        if o is None:
            continue
        print(f"| {p['name']} | {o['us']:.2f} | {o['pct_copy']:.1f} | {p['us']:.2f} | "
              f"{p['pct_copy']:.1f} | {p['us'] / o['us']:.2f}x |")


STEP = re.compile(r"^BM_SpecStep(State|Records|Fused)/B:(\d+)/T:(\d+)/bf16_state:(\d)")


def compare_steps(new):
    """One line per step shape of bench_spec, the three paths from the same run."""
    steps = {}
    for name, entry in new.items():
        m = STEP.match(name)
        if m:
            steps.setdefault((int(m[2]), int(m[3]), int(m[4])), {})[m[1]] = entry
    if not steps:
        print("no BM_SpecStep benchmarks in this file")
        return
    print("| B | T | state | verify+commit us (% copy) | records us (% copy) | fused us (% copy) "
          "| records / verify+commit | fused / verify+commit |")
    print("|---|---|---|---|---|---|---|---|")
    for (B, T, bf16), paths in sorted(steps.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        base = paths.get("State")
        cell = lambda e: f"{e['us']:.1f} ({e['pct_copy']:.1f})" if e else ""
        ratio = lambda e: f"{e['us'] / base['us']:.3f}x" if e and base else ""
        print(f"| {B} | {T} | {'bf16' if bf16 else 'f32'} | {cell(base)} | {cell(paths.get('Records'))} "
              f"| {cell(paths.get('Fused'))} | {ratio(paths.get('Records'))} | {ratio(paths.get('Fused'))} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("new")
    parser.add_argument("--baseline", help="default: bench/baselines/<binary of NEW.json>.json")
    parser.add_argument("--no-baseline", action="store_true", help="compare with the peer only")
    parser.add_argument("--peer")
    parser.add_argument("--threshold", type=float, default=0.10)
    parser.add_argument("--steps", action="store_true",
                        help="bench_spec's step paths side by side, with their time ratios")
    args = parser.parse_args()
    context, new = load_benchmarks(args.new)
    status = 0
    if not args.baseline and not args.no_baseline:
        binary = os.path.basename(context.get("executable", ""))
        args.baseline = os.path.join(BASELINES, f"{binary}.json")
        if not binary or not os.path.exists(args.baseline):
            print(f"no baseline for {binary or 'an unnamed binary'} in {BASELINES}", file=sys.stderr)
            return 2
    if args.baseline:
        _, old = load_benchmarks(args.baseline)
        regressions = compare_baseline(new, old, args.threshold)
        print(f"\n{regressions} regression(s) past {args.threshold:.0%}")
        status = 1 if regressions else 0
    if args.steps:
        print()
        compare_steps(new)
    if args.peer:
        peer = benchmark_json.load(args.peer)
        print(f"\nours: copy ceiling {float(context.get('copy_ceiling_TBps', 0)):.3f} TB/s; "
              f"peer run: {peer['copy_TBps']:.3f} TB/s ({peer.get('gpu', '')}, torch {peer.get('torch', '')})")
        compare_peer(new, peer)
    return status


if __name__ == "__main__":
    sys.exit(main())
