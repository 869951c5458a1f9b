"""kdaguard for PyTorch: Kimi Delta Attention kernels behind a contract layer.

Importing this package registers the dispatcher ops ``torch.ops.kdaguard.*`` (decode, prefill,
verify, commit, the record-based record_verify, replay_commit and accept_verify, their ``can_*``
queries, ``prepare``, ``prefill_workspace_bytes``). CPU tensors
run the f64 reference, CUDA tensors the sm_90a kernels on the current stream.
``kdaguard.ops`` is the keyword-argument layer over them; ``kdaguard.fla`` and
``kdaguard.sglang`` speak those projects' call shapes.

A refused call raises ``ContractViolation`` (a ``ValueError`` and a ``RuntimeError``) naming the
rules; a call kdaguard has no kernel for raises ``Unsupported`` (a ``NotImplementedError``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

import torch

__version__ = "0.1.0"

_torch_release = tuple(int(x) for x in re.findall(r"\d+", torch.__version__.split("+")[0])[:2])
if _torch_release < (2, 10):
    raise ImportError(
        f"kdaguard needs torch >= 2.10 (its stable ABI); this is torch {torch.__version__}")

from . import _C  # noqa: E402,F401  (loading the library registers the ops)


class KdaguardError(Exception):
    """Base of every error kdaguard raises."""


class Violation(NamedTuple):
    rule: str
    argument: str
    message: str


class ContractViolation(KdaguardError, ValueError, RuntimeError):
    """The contracts refused the call; nothing was touched.

    ``entry`` is the entry point, ``rules`` the rule ids that fired (catalogue order),
    ``violations`` one (rule, argument, message) per violation.
    """

    def __init__(self, text: str, entry: str, rules: tuple[str, ...],
                 violations: tuple[Violation, ...]):
        super().__init__(text)
        self.entry = entry
        self.rules = rules
        self.violations = violations


class Unsupported(KdaguardError, NotImplementedError, RuntimeError):
    """A call kdaguard has no kernel for here (device, build, dims, or a feature it lacks)."""

    def __init__(self, text: str, entry: str | None = None):
        super().__init__(text)
        self.entry = entry


class LaunchFailed(KdaguardError, RuntimeError):
    """The backend accepted the call and then failed (a CUDA error)."""

    def __init__(self, text: str, entry: str | None = None):
        super().__init__(text)
        self.entry = entry


class DeviceGuardTripped(ContractViolation):
    """The device guard found value-rule violations (read from an error word); the rows that
    broke them were skipped, the others ran."""


_HEADER = re.compile(r"^kdaguard: (\w+) (rejected|unsupported|launch failed)(?: \[([^\]]*)\])?")
_VIOLATION = re.compile(r"^([a-z_]+\.[a-z_]+) \(([^)]*)\): (.*)$")


def error_from_text(text: str) -> KdaguardError | None:
    """The typed error for the text of a kdaguard op's exception, or None for other text."""
    match = _HEADER.match(text)
    if match is None:
        return None
    entry, kind, ids = match.group(1), match.group(2), match.group(3)
    if kind == "rejected":
        violations = tuple(Violation(*m.groups()) for m in
                           (_VIOLATION.match(line) for line in text.splitlines()[1:]) if m)
        rules = tuple(r.strip() for r in ids.split(",")) if ids else ()
        return ContractViolation(text, entry, rules, violations)
    if kind == "unsupported":
        return Unsupported(text, entry)
    return LaunchFailed(text, entry)


class Rule(NamedTuple):
    id: str
    tier: str            # "meta" (shapes, strides, dtypes) or "value" (index values)
    entries: tuple[str, ...]
    bit: int             # its bit in a device guard's error word
    meaning: str


def rules() -> tuple[Rule, ...]:
    """The rule catalogue, read from the library's one rule table (``kdaguard rules``)."""
    table = []
    for line in torch.ops.kdaguard.rule_table().splitlines():
        rule_id, tier, entries, bit, meaning = line.split("\t", 4)
        table.append(Rule(rule_id, tier, tuple(entries.split(",")), int(bit), meaning))
    return tuple(table)


def built_with_cuda() -> bool:
    """Whether this module has the CUDA kernels (it was built with nvcc); without them only CPU
    tensors run, on the f64 reference."""
    return bool(torch.ops.kdaguard.built_with_cuda())


from . import _fake  # noqa: E402,F401
from . import ops  # noqa: E402,F401
from . import fla, sglang  # noqa: E402,F401  (fla itself is imported only by fla.register)

__all__ = [
    "ContractViolation", "DeviceGuardTripped", "KdaguardError", "LaunchFailed", "Rule",
    "Unsupported", "Violation", "built_with_cuda", "error_from_text", "fla", "ops", "rules",
    "sglang",
]
