"""`--format dockerfile`: the Dockerfile of the image a plan builds (DDTree), which `specdeploy image build` runs."""

from __future__ import annotations

from specdeploy.errors import SpecdeployError
from specdeploy.plan.image import dockerfile
from specdeploy.plan.launch_plan import LaunchPlan


def render_dockerfile(plan: LaunchPlan) -> str:
    if plan.engine.build is None:
        where = f"pulls {plan.engine.image}" if plan.engine.image else "runs without a container"
        raise SpecdeployError(
            f"mode {plan.mode} {where}: nothing to build; --format dockerfile renders the DDTree build "
            "(--mode ddtree)"
        )
    return f"# image {plan.engine.image}\n" + dockerfile(plan.engine.build)
