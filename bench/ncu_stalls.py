#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's source page.

    ncu --set full -k KERNEL -c 1 -o report BINARY ...
    ncu --import report.ncu-rep --page source --print-source sass --csv > report.csv
    bench/ncu_stalls.py report.csv [--top 30]

Prints the warp stall samples per reason over the whole kernel, then the instructions holding the
most samples in address order (so neighbouring hot spots read as one region), each with its two
largest reasons. The CSV's first line names the kernel; the second holds the column names.
"""
from __future__ import annotations

import argparse
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_report(path: str) -> tuple[str, list[str], list[list[str]]]:
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    if len(lines) < 3 or SAMPLES not in lines[1]:
        sys.exit(f"{path}: not a source page export (want the kernel line, then columns with "
                 f"'{SAMPLES}'); export with --page source --print-source sass --csv")
    kernel = lines[0][1] if len(lines[0]) > 1 else lines[0][0]
    return kernel, lines[1], [row for row in lines[2:] if len(row) == len(lines[1])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=30, help="instructions to list (default 30)")
    args = parser.parse_args()

    kernel, header, rows = read_report(args.csv)
    at_samples = header.index(SAMPLES)
    at_source = header.index("Source")
    reasons = [(i, name) for i, name in enumerate(header)
               if name.startswith("stall_") and "Not Issued" not in name]
    total = sum(int(row[at_samples]) for row in rows)
    if total == 0:
        sys.exit(f"{args.csv}: no stall samples (was the report taken with --set full?)")

    print(f"{kernel}\n{len(rows)} instructions, {total} stall samples\n")
    print("| reason | samples | share |\n|---|---|---|")
    by_reason = sorted(((sum(int(row[i]) for row in rows), name) for i, name in reasons),
                       reverse=True)
    for count, name in by_reason:
        if count:
            print(f"| {name.removeprefix('stall_')} | {count} | {100 * count / total:.1f}% |")

    hottest = sorted(range(len(rows)), key=lambda j: -int(rows[j][at_samples]))[:args.top]
    print("\n| index | samples | instruction | largest reasons |\n|---|---|---|---|")
    for j in sorted(hottest):
        row = rows[j]
        top2 = sorted(((int(row[i]), name.removeprefix("stall_")) for i, name in reasons),
                      reverse=True)[:2]
        why = ", ".join(f"{name} {count}" for count, name in top2 if count)
        print(f"| {j} | {row[at_samples]} | `{row[at_source].strip()}` | {why} |")


if __name__ == "__main__":
    main()
