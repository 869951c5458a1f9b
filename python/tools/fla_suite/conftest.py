"""pytest plug-in for running fla's own tests/ops/test_kda.py with kdaguard registered as fla's
KDA backend (scripts/fla_tests.sh copies it next to that file; it is never collected by
kdaguard's own tests).

Strict mode (KDAGUARD_FLA_STRICT=1, the default) makes every call kdaguard cannot run raise its
kdaguard error instead of falling back to fla's Triton, so each case is exactly one of:
  kdaguard pass       it passed and every fla KDA call in it ran on kdaguard
  declined            a kdaguard refusal (rule ids or missing feature) failed it: never a pass
  fla declined        passed because kdaguard declined a call fla itself rejects (fla raised)
  not reached         passed without any fla KDA call reaching kdaguard
  failed              failed for another reason (with kdaguard calls in it: a kdaguard defect)
The table is printed at the end and written to $KDAGUARD_FLA_TABLE when set."""

import collections
import os

import pytest

import kdaguard.fla as kfla

STRICT = os.environ.get("KDAGUARD_FLA_STRICT", "1") == "1"
kfla.register(strict=STRICT, forward_only=True, compat=True)

_cases = []  # (nodeid, class, detail)


def _reason(text):
    first = text.splitlines()[0] if text else ""
    return first[:160]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    if call.when == "setup":
        kfla.events.clear()
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" and not (report.when == "setup" and report.skipped):
        return
    events = list(kfla.events)
    ran = [e for e in events if e[1] == "ran"]
    refused = [e for e in events if e[1] == "refused"]
    declined = [e for e in events if e[1] == "declined"]
    if report.skipped:
        cls, detail = "skipped", str(report.longrepr[-1]) if report.longrepr else ""
    elif report.passed and ran and not refused:
        cls, detail = "kdaguard pass", f"{len(ran)} call(s) on kdaguard"
    elif report.passed and declined and not ran:
        cls, detail = "fla declined", _reason(declined[0][2])
    elif report.passed:
        cls, detail = "not reached", ""
    elif refused:
        cls, detail = "declined", _reason(refused[0][2])
    else:
        cls = "failed"
        detail = f"{len(ran)} kdaguard call(s); " + _reason(str(call.excinfo.value)
                                                              if call.excinfo else "")
    _cases.append((item.nodeid.split("::")[-1], cls, detail))


def pytest_terminal_summary(terminalreporter):
    counts = collections.Counter(c for _, c, _ in _cases)
    lines = [f"kdaguard in fla's test_kda.py (strict={STRICT}): "
             + ", ".join(f"{n} {c}" for c, n in sorted(counts.items())), "",
             "| case | result | detail |", "|---|---|---|"]
    lines += [f"| `{n}` | {c} | {d.replace('|', '/')} |" for n, c, d in _cases]
    by_reason = collections.Counter((c, d) for _, c, d in _cases if c in ("declined", "failed"))
    lines += ["", "| result | reason | cases |", "|---|---|---|"]
    lines += [f"| {c} | {d.replace('|', '/')} | {n} |" for (c, d), n in by_reason.most_common()]
    text = "\n".join(lines) + "\n"
    terminalreporter.write(text)
    path = os.environ.get("KDAGUARD_FLA_TABLE")
    if path:
        with open(path, "w") as f:
            f.write(text)
