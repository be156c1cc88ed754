"""What a probe measured, per group of prompts: tau and the acceptance rate at each draft depth, and what
the shape of those numbers says.

Per-step acceptance arrives as SGLang's `spec_correct_drafts_histogram` (meta_info since SGLang 0.5.x):
entry k counts the verify steps that accepted exactly k drafted tokens, the bonus token aside. The
acceptance rate at depth d is then the share of steps that reached depth d among those that reached d - 1,
so each depth is judged only on the steps that got that far.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdeploy.doctor.findings import Finding

# Below this many verify steps a rate says little; such depths and groups are not judged.
MIN_STEPS = 8
# A group whose depth-1 acceptance is below this misses from the first drafted token.
POOR_FIRST = 0.3
# Good at depth 1 (at least GOOD_FIRST) but below COLLAPSE x that rate at depth 2 or 3: it collapses.
GOOD_FIRST = 0.35
COLLAPSE = 0.5
# Best group tau over worst group tau at or above this: acceptance depends on what is asked.
SPREAD = 1.5
# Measured tau below this share of the published one deserves a look.
SHORTFALL = 0.7


def histogram_from_accept_lengths(accept_lengths: list[int]) -> list[int]:
    """Accept lengths (bonus token included) -> counts of steps by drafted tokens accepted."""
    counts = [0] * max(accept_lengths, default=0)
    for n in accept_lengths:
        counts[n - 1] += 1
    return counts


def add_histograms(a: list[int], b: list[int]) -> list[int]:
    longer, shorter = (a, b) if len(a) >= len(b) else (b, a)
    return [x + (shorter[i] if i < len(shorter) else 0) for i, x in enumerate(longer)]


def depth_rates(histogram: list[int], drafted: int | None = None) -> list[tuple[int, float, int]]:
    """(depth, acceptance rate, steps that reached depth - 1) from depth 1 to `drafted` (the draft depth of
    every step, where known), else to the deepest accepted draft (the histogram cannot say more)."""
    deepest = drafted or max(len(histogram) - 1, 1)
    reached = [sum(histogram[d:]) for d in range(deepest + 1)]
    return [(d, reached[d] / reached[d - 1], reached[d - 1]) for d in range(1, deepest + 1) if reached[d - 1]]


@dataclass
class GroupMeasure:
    """One group of probe prompts (e.g. `code/en`, `chat/zh thinking`) and what its requests measured."""

    group: str
    drafted: int | None = None  # tokens drafted per step (the block's masks), where known
    prompts: int = 0
    completion_tokens: int = 0
    verify_steps: int = 0
    histogram: list[int] | None = field(default_factory=list)  # None: the server does not report it

    def add(
        self, completion_tokens: int, verify_steps: int, histogram: list[int] | None, prompts: int = 1
    ) -> None:
        self.prompts += prompts
        self.completion_tokens += completion_tokens
        self.verify_steps += verify_steps
        if histogram is None or self.histogram is None:
            self.histogram = None
        else:
            self.histogram = add_histograms(self.histogram, histogram)

    @property
    def tau(self) -> float | None:
        """Tokens per verify step, bonus included: from the histogram where there is one (the steps' own
        counts), else completion tokens / verify steps as SGLang's spec_accept_length counts it."""
        if self.histogram and sum(self.histogram):
            return 1 + sum(k * n for k, n in enumerate(self.histogram)) / sum(self.histogram)
        return self.completion_tokens / self.verify_steps if self.verify_steps else None

    @property
    def steps(self) -> int:
        return sum(self.histogram) if self.histogram else self.verify_steps

    def rates(self) -> list[tuple[int, float, int]]:
        return depth_rates(self.histogram, self.drafted) if self.histogram else []


def pooled(groups: list[GroupMeasure]) -> GroupMeasure:
    total = GroupMeasure("all", groups[0].drafted if groups else None)
    for g in groups:
        total.add(g.completion_tokens, g.verify_steps, g.histogram, g.prompts)
    return total


def curve_text(rates: list[tuple[int, float, int]], depths: int = 8) -> str:
    return ", ".join(f"d{d} {rate:.0%}" for d, rate, _ in rates[:depths]) or "no steps"


def probe_findings(groups: list[GroupMeasure], expected: tuple[float, str] | None) -> list[Finding]:
    """Findings from the probe: the depth curve of the best group (the drafter's home ground), the spread
    between groups (domain, language, thinking), and measured against published tau."""
    judged = [g for g in groups if g.steps >= MIN_STEPS and g.tau is not None]
    if not judged:
        return [
            Finding(
                "warning",
                "probe",
                "the probe made too few verify steps to judge acceptance",
                f"{sum(g.steps for g in groups)} verify steps over {len(groups)} groups",
                "raise --max-new-tokens",
            )
        ]
    findings: list[Finding] = []
    best = max(judged, key=lambda g: g.tau or 0.0)
    findings += _curve_findings(best)
    findings += _spread_findings(judged)
    if expected is not None:
        findings += _expected_findings(groups, expected)
    return findings


def _curve_findings(best: GroupMeasure) -> list[Finding]:
    rates = [r for r in best.rates() if r[2] >= MIN_STEPS]
    if not rates:
        return [
            Finding(
                "info",
                "depth-curve",
                "the server reports no per-step acceptance, so the curve by depth is unknown",
                "meta_info has no spec_correct_drafts_histogram",
                "use a server that reports it per request (SGLang 0.5.23 does, and `specdeploy serve`)",
            )
        ]
    first = rates[0][1]
    evidence = f"best group {best.group} (tau {best.tau:.2f}): {curve_text(rates)}"
    if first < POOR_FIRST:
        return [
            Finding(
                "warning",
                "depth-curve",
                f"even on its best prompts the drafter misses from the first drafted token "
                f"({first:.0%} at depth 1): it is fed the wrong inputs",
                evidence,
                "check the drafter's target_layer_ids, hidden size, vocabulary and mask token against the "
                "target (the static checks above), and that the drafter was trained for this target",
            )
        ]
    later = [(d, rate) for d, rate, _ in rates[1:3] if rate < COLLAPSE * first]
    if first >= GOOD_FIRST and later:
        depth, rate = later[0]
        return [
            Finding(
                "warning",
                "depth-curve",
                f"drafts survive depth 1 ({first:.0%}) and collapse by depth {depth} ({rate:.0%}): "
                "positions within the block are off",
                evidence,
                "check the drafter's RoPE (theta, YaRN factor and attention factor) against what it was trained "
                "with, and the block size against the draft tokens the server runs",
            )
        ]
    return [
        Finding("info", "depth-curve", "the acceptance curve by depth has no broken shape", evidence, "-")
    ]


def _spread_findings(judged: list[GroupMeasure]) -> list[Finding]:
    best = max(judged, key=lambda g: g.tau or 0.0)
    worst = min(judged, key=lambda g: g.tau or 0.0)
    evidence = ", ".join(f"{g.group} {g.tau:.2f}" for g in sorted(judged, key=lambda g: -(g.tau or 0.0)))
    findings: list[Finding] = []
    if best.tau and worst.tau and best.tau / worst.tau >= SPREAD:
        findings.append(
            Finding(
                "warning",
                "domain",
                f"acceptance depends on what is asked: tau {best.tau:.2f} on {best.group}, "
                f"{worst.tau:.2f} on {worst.group}",
                f"tau by group: {evidence}",
                "a drafter is only as good as its training data on your traffic: measure with your own prompts "
                "(`specdeploy bench`), or use a drafter trained on this domain and language",
            )
        )
    thinking = _thinking_pairs(judged)
    if thinking:
        on, off = thinking
        if max(on, off) / min(on, off) >= 1.3:
            findings.append(
                Finding(
                    "warning",
                    "thinking",
                    f"thinking changes acceptance: tau {on:.2f} with thinking, {off:.2f} without",
                    f"tau by group: {evidence}",
                    "serve with the thinking setting the drafter was trained for (per request: "
                    "chat_template_kwargs), or use a drafter trained on the other kind of output",
                )
            )
    return findings


def _thinking_pairs(judged: list[GroupMeasure]) -> tuple[float, float] | None:
    on = pooled([g for g in judged if g.group.endswith(" thinking")])
    off = pooled([g for g in judged if g.group.endswith(" no-thinking")])
    return (on.tau, off.tau) if on.tau and off.tau else None


def _expected_findings(groups: list[GroupMeasure], expected: tuple[float, str]) -> list[Finding]:
    """Published tau is measured on the drafter's home ground: compare it with the probe's best group."""
    tau, source = expected
    judged = [g for g in groups if g.steps >= MIN_STEPS and g.tau is not None]
    if not judged:
        return []
    best = max(judged, key=lambda g: g.tau or 0.0)
    measured = best.tau or 0.0
    evidence = f"measured {measured:.2f} on {best.group} (the best group); published {tau:.2f} ({source})"
    if measured < SHORTFALL * tau:
        return [
            Finding(
                "warning",
                "expected-tau",
                f"tau {measured:.2f} even on the best prompts, far below the published {tau:.2f}",
                evidence,
                "look at the errors and warnings above; the published figure was measured on its own prompts "
                "and settings, so confirm with those before retraining anything",
            )
        ]
    return [
        Finding("info", "expected-tau", f"tau {measured:.2f} against the published {tau:.2f}", evidence, "-")
    ]
