"""Render a LaunchPlan as text, JSON, a shell script, a compose file, Kubernetes manifests or a Dockerfile."""

from __future__ import annotations

import json
from collections.abc import Callable

from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.render.compose import render_compose
from specdeploy.plan.render.dockerfile import render_dockerfile
from specdeploy.plan.render.k8s import render_k8s
from specdeploy.plan.render.shell import render_shell
from specdeploy.plan.render.text import render_text


def render_json(plan: LaunchPlan) -> str:
    return json.dumps(plan.to_json_dict(), indent=2) + "\n"


RENDERERS: dict[str, Callable[[LaunchPlan], str]] = {
    "text": render_text,
    "json": render_json,
    "sh": render_shell,
    "compose": render_compose,
    "k8s": render_k8s,
    "dockerfile": render_dockerfile,
}


def render_plan(plan: LaunchPlan, fmt: str, width: int | None = None) -> str:
    """`width`: the columns the text format wraps its prose at (the other formats are files, not prose)."""
    if fmt not in RENDERERS:
        raise SpecdeployError(f"unknown format {fmt!r}: choose one of {', '.join(RENDERERS)}")
    if fmt == "text" and width is not None:
        return render_text(plan, width)
    return RENDERERS[fmt](plan)
