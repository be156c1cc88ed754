"""`--format compose`: a docker compose file for one node (ipc host, shm, HF cache, health check, GPUs)."""

from __future__ import annotations

import yaml

from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.render.container import (
    HF_CACHE_IN_CONTAINER,
    SHM_SIZE,
    container_shell_command,
    gated_models,
    resource_name,
    startup_seconds,
)


def render_compose(plan: LaunchPlan) -> str:
    if plan.gpus.nnodes > 1:
        raise SpecdeployError(
            f"a compose file runs on one host and this plan spans {plan.gpus.nnodes} nodes: "
            "use --format k8s (or --format sh on every node)"
        )
    gated = gated_models(plan)
    token = f"${{HF_TOKEN:?{gated[0]} is gated: export HF_TOKEN}}" if gated else "${HF_TOKEN:-}"
    service = {
        "image": plan.engine.image,
        "command": ["bash", "-c", container_shell_command(plan)],
        "ipc": "host",
        "shm_size": SHM_SIZE,
        "ports": [f"{plan.port}:{plan.port}"],
        "volumes": [f"${{HF_HOME:-~/.cache/huggingface}}:{HF_CACHE_IN_CONTAINER}"],
        "environment": {"HF_TOKEN": token, **plan.env},
        "healthcheck": {
            "test": ["CMD-SHELL", f"curl -fsS http://localhost:{plan.port}/health || exit 1"],
            "interval": "30s",
            "timeout": "10s",
            "retries": 3,
            "start_period": f"{startup_seconds(plan)}s",
        },
        "deploy": {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": plan.gpus.count, "capabilities": ["gpu"]}]
                }
            }
        },
    }
    header = f"# {plan.summary}\n# specdeploy plan: {plan.recipe} on {plan.hardware}, mode {plan.mode}\n"
    body = yaml.safe_dump({"services": {resource_name(plan): service}}, sort_keys=False, width=10_000)
    return header + body
