"""One diagnosis: resolve what to examine (models, recipe or a running server), run the static checks and
the probe, and rank what they found."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy.doctor.acceptance import GroupMeasure, curve_text, pooled, probe_findings
from specdeploy.doctor.findings import Finding, ranked, report_json
from specdeploy.doctor.pair import PairFiles, static_findings, thinking_switch, zoo_pair_name
from specdeploy.doctor.probe import (
    ProbeRequest,
    local_dir,
    probe_engine,
    probe_requests,
    probe_server,
    server_info,
)
from specdeploy.errors import SpecdeployError
from specdeploy.recipes.schema import Recipe


@dataclass
class Subject:
    """What is examined: model directories on this machine (either may be unknown), and a server or not."""

    target_dir: Path | None
    draft_dir: Path | None
    recipe: Recipe | None = None
    url: str | None = None
    draft_tokens: int | None = None  # a DFlash server's speculative_num_draft_tokens
    notes: list[Finding] = field(default_factory=list)


@dataclass
class Diagnosis:
    findings: list[Finding]
    groups: list[GroupMeasure]
    subject: Subject
    mode: str
    seconds: float

    @property
    def tau(self) -> float | None:
        return pooled(self.groups).tau if self.groups else None

    def as_json(self) -> dict[str, Any]:
        return report_json(
            None if self.tau is None else round(self.tau, 4),
            self.findings,
            groups=[
                {
                    "group": g.group,
                    "prompts": g.prompts,
                    "verify_steps": g.steps,
                    "tau": None if g.tau is None else round(g.tau, 4),
                    "acceptance_by_depth": [round(rate, 4) for _, rate, _ in g.rates()],
                }
                for g in self.groups
            ],
            target=None if self.subject.target_dir is None else str(self.subject.target_dir),
            draft=None if self.subject.draft_dir is None else str(self.subject.draft_dir),
            url=self.subject.url,
            mode=None if self.subject.url else self.mode,
            seconds=round(self.seconds, 2),
        )


def local_subject(
    target: str | None, draft: str | None, recipe: Recipe | None, mode: str, budget: int | None
) -> Subject:
    """Models named on the command line or by the recipe (zoo names resolve to the shipped pairs)."""
    from specdeploy.zoo.registry import resolve_models

    target = target or (recipe.target.path if recipe is not None else None)
    draft = draft or (recipe.dflash.path if recipe is not None else None)
    if target is None:
        raise SpecdeployError("give --target (and --draft), --recipe NAME, or --url of a running server")
    if recipe is not None and not (Path(target).expanduser().exists() or target.startswith("zoo:")):
        note = Finding(
            "info",
            "files",
            f"the models of recipe {recipe.name} are not on this machine: only the recipe was checked",
            f"target {target}, drafter {draft}",
            "pass --target DIR --draft DIR with local copies, or --url of the running server",
        )
        return Subject(None, None, recipe, notes=[note])
    target_dir, draft_dir = resolve_models(target, draft, mode, budget)
    return Subject(target_dir, draft_dir, recipe)


def server_subject(url: str, target: str | None, draft: str | None, recipe: Recipe | None) -> Subject:
    """A running server: its model directories from /server_info when they are on this machine."""
    from specdeploy.zoo.registry import resolve_model_path

    info = asyncio.run(server_info(url))
    target_dir = resolve_model_path(target) if target else local_dir(info.get("model_path"))
    draft_dir = resolve_model_path(draft) if draft else local_dir(info.get("speculative_draft_model_path"))
    algorithm = str(info.get("speculative_algorithm") or "").upper()
    draft_tokens = info.get("speculative_num_draft_tokens") if algorithm == "DFLASH" else None
    notes = []
    if target_dir is None or draft_dir is None:
        notes.append(
            Finding(
                "info",
                "files",
                "the server's model files are not on this machine: the static checks of the pair were skipped",
                f"model_path {info.get('model_path')}, speculative_draft_model_path "
                f"{info.get('speculative_draft_model_path')}",
                "pass --target DIR --draft DIR with local copies of the served models",
            )
        )
    return Subject(target_dir, draft_dir, recipe, url, draft_tokens, notes)


def diagnose(
    subject: Subject,
    mode: str,
    budget: int | None,
    max_new_tokens: int,
    probe: bool,
    tokenizer: str | None = None,
    device: str = "cpu",
    dtype: str = "auto",
    threads: int | None = None,
) -> Diagnosis:
    start = time.perf_counter()
    findings = list(subject.notes)
    pair = None
    if subject.target_dir is not None and subject.draft_dir is not None:
        pair = PairFiles.read(subject.target_dir, subject.draft_dir)
        findings += static_findings(pair, subject.recipe, subject.draft_tokens)
    elif subject.recipe is not None:
        findings += static_findings(PairFiles({}, {}), subject.recipe)
    groups: list[GroupMeasure] = []
    if probe and (subject.url is not None or pair is not None):
        groups, probe_notes = _probe(subject, mode, budget, max_new_tokens, tokenizer, device, dtype, threads)
        findings += probe_notes
        if groups:
            findings += probe_findings(groups, expected_tau(pair, mode, budget))
    return Diagnosis(ranked(findings), groups, subject, mode, time.perf_counter() - start)


def _probe(
    subject: Subject,
    mode: str,
    budget: int | None,
    max_new_tokens: int,
    tokenizer: str | None,
    device: str,
    dtype: str,
    threads: int | None,
) -> tuple[list[GroupMeasure], list[Finding]]:
    if subject.url is not None:
        from specdeploy.bench.payloads import load_template

        template_dir = tokenizer or (str(subject.target_dir) if subject.target_dir is not None else None)
        template = load_template(template_dir) if template_dir else None
        # SGLang's DFlash draft tokens count the block's first (committed) token
        drafted = subject.draft_tokens - 1 if subject.draft_tokens else None
        return probe_server(subject.url, _requests(template, max_new_tokens), template, drafted), []
    from specdeploy.engine.runtime import load_engine

    try:
        engine = load_engine(subject.target_dir, subject.draft_dir, mode, budget, device, dtype, threads)
    except SpecdeployError as exc:
        return [], [
            Finding(
                "error",
                "probe",
                "the reference engine refuses to load this pair, so nothing was measured",
                " ".join(str(exc).split()),
                "fix the errors above first",
            )
        ]
    template = engine.tokenizer
    return probe_engine(engine, _requests(template, max_new_tokens), template), []


def _requests(template: Any, max_new_tokens: int) -> list[ProbeRequest]:
    """The probe's requests through `template`'s chat template, or as plain text where it has none."""
    text = getattr(template, "chat_template", None) or ""
    return list(probe_requests(max_new_tokens, thinking_switch(text), chat_template=bool(text)))


def expected_tau(pair: PairFiles | None, mode: str, budget: int | None) -> tuple[float, str] | None:
    """The tau the drafter's card publishes for this mode (a zoo pair's acceptance table), if any."""
    if pair is None or pair.draft_dir is None:
        return None
    from specdeploy.zoo.table import measured_tau

    card = pair.draft_card()
    tau = measured_tau(card)
    source = f"card of {zoo_pair_name(pair.draft_dir) or pair.draft_dir}, held-out code"
    if mode == "dflash" and tau.dflash is not None:
        return tau.dflash, source
    if mode == "ddtree" and tau.ddtree is not None and tau.ddtree_budget == budget:
        return tau.ddtree, f"{source}, budget {budget}"
    return None


def render_text(diagnosis: Diagnosis) -> str:
    lines = []
    subject = diagnosis.subject
    what = subject.url or (
        f"{subject.target_dir} + {subject.draft_dir}"
        if subject.target_dir is not None
        else f"recipe {subject.recipe.name if subject.recipe else '-'}"
    )
    mode = "" if subject.url else f" ({diagnosis.mode})"  # a server's mode is its own, not --mode's
    lines.append(f"doctor: {what}{mode}, {diagnosis.seconds:.1f} s")
    if diagnosis.groups:
        tau = diagnosis.tau
        lines.append(
            f"tau {tau:.2f} over {pooled(diagnosis.groups).steps} verify steps" if tau else "tau: none"
        )
        width = max(len(g.group) for g in diagnosis.groups)
        for g in diagnosis.groups:
            tau_text = "-" if g.tau is None else f"{g.tau:5.2f}"
            lines.append(
                f"  {g.group:<{width}}  tau {tau_text}  steps {g.steps:4d}  {curve_text(g.rates(), 6)}"
            )
    if not diagnosis.findings:
        lines.append("no findings")
    for f in diagnosis.findings:
        lines.append(f"{f.severity.upper():7} [{f.check}] {f.message}")
        lines.append(f"        evidence: {f.evidence}")
        if f.fix != "-":
            lines.append(f"        fix: {f.fix}")
    return "\n".join(lines)
