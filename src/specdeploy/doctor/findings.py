"""A doctor's finding (severity, check, message, evidence, fix) and the report that ranks them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]
SEVERITY_RANK: dict[str, int] = {"error": 0, "warning": 1, "info": 2}


@dataclass(frozen=True)
class Finding:
    severity: Severity
    check: str  # a stable name: scripts select findings by it
    message: str  # what is wrong, in one sentence
    evidence: str  # the values that show it
    fix: str  # what to do


def ranked(findings: list[Finding]) -> list[Finding]:
    """Errors first, then warnings, then notes; the order of the checks within each."""
    return sorted(findings, key=lambda f: SEVERITY_RANK[f.severity])


def report_json(tau: float | None, findings: list[Finding], **extra: Any) -> dict[str, Any]:
    """The `--json` object: the measured tau (None without a probe), the ranked findings, then `extra`."""
    return {"tau": tau, "findings": [asdict(f) for f in ranked(findings)], **extra}
