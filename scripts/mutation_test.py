#!/usr/bin/env python3
"""Mutation testing of the validators: are the tests strong enough to notice a wrong check?

    scripts/mutation_test.py [options] FILE [FILE ...]
    e.g. scripts/mutation_test.py --sample 400 --seed 7 contracts/src/validate.cpp \\
             contracts/include/kdaguard/contracts/row_rules.h \\
             contracts/include/kdaguard/contracts/value_checks.h

universalmutator (PyPI, 1.14.1; `pip install universalmutator==1.14.1`) writes every operator-level
mutant of each FILE (a changed operator, constant, condition, a deleted statement, ...); a seeded
sample of them is built and judged, one at a time:

  invalid     does not compile (not counted)
  equivalent  object code bit-identical to the unmutated build's (trivially equivalent), or a
              change listed in scripts/mutation_equivalents.txt with the reason it cannot be
              observed
  killed      some oracle test fails, crashes or times out (the first one is named)
  survived    every oracle test passes: a gap in the tests, or an equivalent mutant to review

score = killed / (killed + survived). The oracle is the unit tests, the contracts' properties
(RC_PARAMS with a fixed seed, so a verdict can be replayed) and the corpus replays of the CPU fuzz
targets.

The mutants are built in a copy of the working tree (BUILD/src), never in the working tree
itself; that copy's build (BUILD/build, -O1, no debug info, so identical code gives identical
objects) is incremental: a mutant recompiles only the translation units that include its file
and relinks the oracle's binaries. The report (markdown, one line per mutant) goes to --report
and a JSON summary to --json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EQUIVALENTS = ROOT / "scripts" / "mutation_equivalents.txt"

# The oracle: (target, path in the build, arguments). Run in this order, fastest first; the
# first failure kills the mutant.
ORACLE = [
    ("contracts_unit_tests", "contracts/tests/contracts_unit_tests", []),
    ("contracts_mutations", "properties/contracts_mutations", []),
    ("contracts_accepts_valid", "properties/contracts_accepts_valid", []),
    ("contracts_soundness", "properties/contracts_soundness", []),
    ("contracts_determinism", "properties/contracts_determinism", []),
    ("contracts_messages", "properties/contracts_messages", []),
    ("contracts_edges", "properties/contracts_edges", []),
    ("callio_unit_tests", "tools/tests/callio_unit_tests", []),
    ("kdaguard_cli_tests", "tools/tests/kdaguard_cli_tests", []),
    ("reference_unit_tests", "kernels/reference/tests/reference_unit_tests", []),
    ("fuzz_contracts", "fuzz/fuzz_contracts", ["{src}/corpus/fuzz_contracts"]),
    ("fuzz_check_json", "fuzz/fuzz_check_json", ["{src}/corpus/fuzz_check_json", "{src}/corpus/calls"]),
    ("refusal_untouched", "properties/refusal_untouched", []),
]


@dataclass
class Mutant:
    file: str          # repository-relative path
    number: int        # universalmutator's mutant number for that file
    line: int          # 1-based line of the change
    before: str
    after: str
    outcome: str = ""
    detail: str = ""
    seconds: float = 0.0

    def change(self) -> str:
        return f"{self.before.strip()}  ==>  {self.after.strip()}"


@dataclass
class Equivalents:
    """Reviewed equivalent mutants: `file<TAB>line before<TAB>line after<TAB>reason` (stripped
    lines, so the entry survives edits elsewhere in the file)."""
    entries: dict = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "Equivalents":
        e = cls()
        if path.exists():
            for raw in path.read_text().splitlines():
                if not raw.strip() or raw.startswith("#"):
                    continue
                parts = raw.split("\t")
                if len(parts) != 4:
                    sys.exit(f"mutation_test: {path}: expected 4 tab-separated fields: {raw!r}")
                e.entries[(Path(parts[0]).name, parts[1].strip(), parts[2].strip())] = parts[3].strip()
        return e

    def reason(self, m: Mutant) -> str | None:
        return self.entries.get((Path(m.file).name, m.before.strip(), m.after.strip()))


def run(cmd, cwd=None, timeout=None, env=None, quiet=True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, timeout=timeout, env=env, text=True,
                          stdout=subprocess.PIPE if quiet else None,
                          stderr=subprocess.STDOUT if quiet else None)


def mirror_working_tree(dest: Path) -> None:
    """dest mirrors the working tree's tracked and untracked, not ignored files. Only files whose
    content differs are written (with a fresh mtime), so the copy's build stays incremental."""
    files = run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT).stdout
    for rel in filter(None, files.split("\0")):
        source, target = ROOT / rel, dest / rel
        if not source.is_file():
            continue
        data = source.read_bytes()
        if target.is_file() and target.read_bytes() == data:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        shutil.copymode(source, target)


def configure(src: Path, build: Path) -> None:
    if (build / "CMakeCache.txt").exists():
        return
    args = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DCMAKE_CXX_FLAGS_RELEASE=-O1", "-DKDAGUARD_ENABLE_CUDA=OFF",
            "-DKDAGUARD_BUILD_BENCHMARKS=OFF"]
    if shutil.which("ld.lld"):
        args.append("-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=lld")
    if shutil.which("ccache"):  # the unmutated objects come back from the cache
        args.append("-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")
    r = run(args)
    if r.returncode != 0:
        sys.exit(f"mutation_test: configuring {build} failed:\n{r.stdout}")


def build_oracle(build: Path, oracle, jobs: int, timeout: int) -> tuple[bool, str]:
    try:
        r = run(["cmake", "--build", str(build), "-j", str(jobs), "--target", *[t for t, _, _ in oracle]],
                timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "build timed out"
    return r.returncode == 0, r.stdout


def object_hashes(build: Path) -> dict[str, str]:
    hashes = {}
    for path in build.rglob("*.o"):
        hashes[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def run_oracle(build: Path, src: Path, oracle, rc_params: str, timeout: int) -> str | None:
    """None when every test passes, else what failed first."""
    env = dict(os.environ, RC_PARAMS=rc_params)
    for name, path, args in oracle:
        cmd = [str(build / path), *[a.format(src=src) for a in args]]
        try:
            r = run(cmd, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return f"{name} timed out after {timeout} s"
        if r.returncode != 0:
            failed = re.findall(r"^\[  FAILED  \] (\S+)", r.stdout, re.M)
            what = failed[0] if failed else f"exit {r.returncode}"
            return f"{name}: {what}"
    return None


def generate_mutants(src: Path, files: list[str], work: Path) -> list[Mutant]:
    if shutil.which("mutate") is None:
        sys.exit("mutation_test: universalmutator's `mutate` is not installed "
                 "(pip install universalmutator==1.14.1)")
    mutants: list[Mutant] = []
    for rel in files:
        original = (src / rel).read_text().splitlines(keepends=True)
        out = work / "mutants" / rel.replace("/", "+")
        out.mkdir(parents=True, exist_ok=True)
        # universalmutator picks its rules by language; headers are C++ too.
        staged = out / ("subject" + Path(rel).suffix.replace(".h", ".cpp"))
        staged.write_text("".join(original))
        r = run(["mutate", str(staged), "cpp", "--noCheck", "--mutantDir", str(out)], cwd=out)
        if r.returncode != 0:
            sys.exit(f"mutation_test: mutate failed on {rel}:\n{r.stdout}")
        for path in sorted(out.glob("subject.mutant.*"), key=lambda p: int(p.name.split(".")[2])):
            changed = path.read_text().splitlines(keepends=True)
            if len(changed) != len(original):  # universalmutator edits one line in place
                lines = [i for i in range(min(len(changed), len(original))) if changed[i] != original[i]]
                line = lines[0] if lines else min(len(changed), len(original)) - 1
                after = changed[line] if line < len(changed) else ""
            else:
                diffs = [i for i in range(len(original)) if changed[i] != original[i]]
                if len(diffs) != 1:
                    continue
                line = diffs[0]
                after = changed[line]
            mutants.append(Mutant(rel, int(path.name.split(".")[2]), line + 1, original[line], after))
            mutants[-1].detail = str(path)
    return mutants


def judge(m: Mutant, src: Path, build: Path, baseline: dict, oracle, equivalents: Equivalents,
          args) -> None:
    target = src / m.file
    original = target.read_text()
    mutant_path = Path(m.detail)
    started = time.monotonic()
    try:
        shutil.copyfile(mutant_path, target)
        ok, log = build_oracle(build, oracle, args.jobs, args.build_timeout)
        if not ok:
            m.outcome, m.detail = "invalid", "does not compile"
            return
        if object_hashes(build) == baseline:
            m.outcome, m.detail = "equivalent", "object code identical to the unmutated build"
            return
        failure = run_oracle(build, src, oracle, args.rc_params, args.test_timeout)
        if failure:
            m.outcome, m.detail = "killed", failure
            return
        reason = equivalents.reason(m)
        if reason:
            m.outcome, m.detail = "equivalent", reason
        else:
            m.outcome, m.detail = "survived", "every oracle test passes"
    finally:
        target.write_text(original)
        m.seconds = time.monotonic() - started


def write_report(mutants: list[Mutant], args, total: int, elapsed: float) -> dict:
    counts = {k: sum(1 for m in mutants if m.outcome == k)
              for k in ("killed", "survived", "equivalent", "invalid")}
    judged = counts["killed"] + counts["survived"]
    score = counts["killed"] / judged if judged else 0.0
    lines = [f"## Mutation testing of the validators", "",
             f"Files: {', '.join(args.files)}. {len(mutants)} mutants judged of a sample of {args.sample} (seed {args.seed}) "
             f"of {total} universalmutator 1.14.1 generated; {elapsed / 60:.1f} min, "
             f"{elapsed / max(len(mutants), 1):.1f} s per mutant.", "",
             "| outcome | mutants |", "|---|---|"]
    for k, v in counts.items():
        lines.append(f"| {k} | {v} |")
    lines += ["", f"**Mutation score**: {counts['killed']} of {judged} non-equivalent compiling "
              f"mutants killed: {100 * score:.1f}%.", "",
              "| file:line | change | outcome | why |", "|---|---|---|---|"]
    order = {"survived": 0, "equivalent": 1, "killed": 2, "invalid": 3}
    for m in sorted(mutants, key=lambda m: (order[m.outcome], m.file, m.line)):
        change = m.change().replace("|", "\\|").replace("`", "'")
        lines.append(f"| {Path(m.file).name}:{m.line} | `{change}` | {m.outcome} | "
                     f"{m.detail.replace('|', '/')} |")
    text = "\n".join(lines) + "\n"
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(text)
    summary = {"seed": args.seed, "sampled": len(mutants), "generated": total, **counts,
               "score": score, "seconds": round(elapsed, 1), "files": args.files,
               "mutants": [{"file": m.file, "line": m.line, "number": m.number, "change": m.change(),
                            "outcome": m.outcome, "why": m.detail} for m in mutants]}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="repository-relative files to mutate")
    p.add_argument("--build", default=str(ROOT / "build-mutation"), help="work directory (default build-mutation)")
    p.add_argument("--sample", type=int, default=400, help="mutants to judge (default 400)")
    p.add_argument("--seed", type=int, default=1, help="sampling seed (default 1)")
    p.add_argument("--rc-params", default="max_success=300 seed=20261203",
                   help="RC_PARAMS for the properties (fixed seed: verdicts replay)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--build-timeout", type=int, default=600)
    p.add_argument("--test-timeout", type=int, default=120)
    p.add_argument("--report", help="markdown report (default BUILD/report.md)")
    p.add_argument("--json", help="JSON summary (default BUILD/summary.json)")
    p.add_argument("--max-minutes", type=float, default=0,
                   help="stop judging after this long and report the mutants judged (0: no limit)")
    p.add_argument("--positions", help="judge only these 1-based positions of the seeded sample "
                   "(as the progress lines number them), e.g. to re-judge survivors: 7,19,28")
    p.add_argument("--rejudge", metavar="SUMMARY_JSON",
                   help="judge again the survivors of an earlier run (its --json summary), found by "
                   "their change in the current files, so edits elsewhere in a file do not lose them")
    p.add_argument("--list", action="store_true", help="print the sample and stop")
    args = p.parse_args()
    work = Path(args.build).resolve()
    args.report = args.report or str(work / "report.md")
    args.json = args.json or str(work / "summary.json")
    for f in args.files:
        if not (ROOT / f).is_file():
            sys.exit(f"mutation_test: no such file {f}")

    src, build = work / "src", work / "build"
    mirror_working_tree(src)
    shutil.rmtree(work / "mutants", ignore_errors=True)
    everything = generate_mutants(src, args.files, work)
    sample = random.Random(args.seed).sample(everything, min(args.sample, len(everything)))
    if args.rejudge:
        sample = survivors_of(args.rejudge, everything)
    elif args.positions:
        sample = [sample[int(p) - 1] for p in args.positions.split(",")]
    if args.list:
        for m in sample:
            print(f"{m.file}:{m.line}: {m.change()}")
        return 0

    configure(src, build)
    oracle = [o for o in ORACLE if o[0] in build_targets(build)]
    ok, log = build_oracle(build, oracle, args.jobs, args.build_timeout)
    if not ok:
        sys.exit(f"mutation_test: the unmutated tree does not build:\n{log[-4000:]}")
    failure = run_oracle(build, src, oracle, args.rc_params, args.test_timeout)
    if failure:
        sys.exit(f"mutation_test: the unmutated tree fails its own oracle: {failure}")
    baseline = object_hashes(build)
    equivalents = Equivalents.load(EQUIVALENTS)

    started = time.monotonic()
    print(f"mutation_test: {len(sample)} of {len(everything)} mutants, oracle: "
          f"{', '.join(o[0] for o in oracle)}", flush=True)
    judged = []
    for i, m in enumerate(sample, 1):
        if args.max_minutes and time.monotonic() - started > 60 * args.max_minutes:
            print(f"mutation_test: time is up after {i - 1} mutants", flush=True)
            break
        judged.append(m)
        judge(m, src, build, baseline, oracle, equivalents, args)
        print(f"  [{i}/{len(sample)}] {m.outcome:10} {Path(m.file).name}:{m.line} {m.change()}"
              f"{'  -- ' + m.detail if m.outcome != 'invalid' else ''} ({m.seconds:.0f} s)", flush=True)
    # Leave the copy's build unmutated for the next run.
    build_oracle(build, oracle, args.jobs, args.build_timeout)
    s = write_report(judged, args, len(everything), time.monotonic() - started)
    print(f"mutation_test: killed {s['killed']}, survived {s['survived']}, equivalent "
          f"{s['equivalent']}, invalid {s['invalid']}: score {100 * s['score']:.1f}% "
          f"(report {args.report})")
    return 0


def survivors_of(summary_path: str, everything: list[Mutant]) -> list[Mutant]:
    """The survived mutants of an earlier summary, each matched to the mutant of the current files
    with the same change (the nearest line when the change occurs more than once). A survivor whose
    line no longer exists is reported and left out."""
    summary = json.loads(Path(summary_path).read_text())
    found = []
    for old in summary["mutants"]:
        if old["outcome"] != "survived":
            continue
        same = [m for m in everything if m.file == old["file"] and m.change() == old["change"]]
        if not same:
            print(f"mutation_test: {old['file']}:{old['line']} {old['change']}: that line is gone",
                  flush=True)
            continue
        found.append(min(same, key=lambda m: abs(m.line - old["line"])))
    return found


def build_targets(build: Path) -> set[str]:
    """The targets this build defines (the fuzz replays need FuzzedDataProvider.h, for one)."""
    r = run(["cmake", "--build", str(build), "--target", "help"])
    return {m.group(1) for m in re.finditer(r"^\.\.\. (\S+)", r.stdout, re.M)}


if __name__ == "__main__":
    sys.exit(main())
