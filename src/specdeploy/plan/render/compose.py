"""`--format compose`: a docker compose file for one node (ipc host, shm, HF cache, health check, GPUs)."""

from __future__ import annotations

import yaml

from specdeploy.errors import SpecdeployError
from specdeploy.plan.image import dockerfile
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.render.container import (
    HF_CACHE_IN_CONTAINER,
    SHM_SIZE,
    container_shell_command,
    gated_models,
    published_port,
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
    environment = {"HF_TOKEN": token}
    if plan.api_key_env is not None:
        needed = f"the server requires an API key: export {plan.api_key_env}"
        environment[plan.api_key_env] = f"${{{plan.api_key_env}:?{needed}}}"
    service: dict = {"image": plan.engine.image}
    if plan.engine.build is not None:
        # Compose builds the image under this tag once, and reuses it while the tag exists.
        service["build"] = {"context": ".", "dockerfile_inline": dockerfile(plan.engine.build)}
    service |= {
        # $$: the container's shell expands the key from its environment, compose does not paste it in
        "command": ["bash", "-c", container_shell_command(plan).replace("$", "$$")],
        "ipc": "host",
        "shm_size": SHM_SIZE,
        "ports": [published_port(plan)],
        "volumes": [f"${{HF_HOME:-~/.cache/huggingface}}:{HF_CACHE_IN_CONTAINER}"],
        "environment": {**environment, **plan.env},
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
