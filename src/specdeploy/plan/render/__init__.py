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


def render_plan(plan: LaunchPlan, fmt: str) -> str:
    if fmt not in RENDERERS:
        raise SpecdeployError(f"unknown format {fmt!r}: choose one of {', '.join(RENDERERS)}")
    return RENDERERS[fmt](plan)
