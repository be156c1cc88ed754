"""`--format sh`: a runnable bash script (env exports + docker run, or the reference engine's command)."""

from __future__ import annotations

import shlex

from specdeploy import __version__
from specdeploy.plan.image import dockerfile
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.render.container import (
    ALL_INTERFACES,
    DIST_INIT_PORT,
    HF_CACHE_IN_CONTAINER,
    SHM_SIZE,
    container_shell_command,
    gated_models,
    published_port,
)

# Expanded by the container's shell from the variables passed with `-e`.
MULTI_NODE_ARGS = " --node-rank $NODE_RANK --dist-init-addr $DIST_INIT_ADDR"


def render_shell(plan: LaunchPlan) -> str:
    lines = [
        "#!/usr/bin/env bash",
        f"# {plan.summary}",
        f"# specdeploy {__version__} plan (schema {plan.schema_version}): "
        f"{plan.recipe} on {plan.hardware}, mode {plan.mode}",
        "set -euo pipefail",
    ]
    lines += [f"export {key}={shlex.quote(value)}" for key, value in sorted(plan.env.items())]
    for path in gated_models(plan):
        lines.append(
            f': "${{HF_TOKEN:?{path} is gated: request access on its Hub page, then export HF_TOKEN}}"'
        )
    if plan.api_key_env is not None:
        lines.append(
            f': "${{{plan.api_key_env}:?the server requires an API key: export {plan.api_key_env}}}"'
        )
    if plan.gpus.nnodes > 1:
        lines += [
            f': "${{NODE_RANK:?set NODE_RANK: 0 on the first node .. {plan.gpus.nnodes - 1} on the last}}"',
            f': "${{DIST_INIT_ADDR:?set DIST_INIT_ADDR to HOST:PORT of node 0, e.g. 10.0.0.1:{DIST_INIT_PORT}}}"',
        ]
    if plan.engine.image is None:
        return "\n".join([*lines, "exec " + shlex.join(plan.argv)]) + "\n"
    docker = ["docker run --rm --gpus all --ipc=host", f"--shm-size={SHM_SIZE}"]
    # Multi-node NCCL and the distributed init need the host's interfaces, not a bridge network.
    docker.append("--network=host" if plan.gpus.nnodes > 1 else f"-p {published_port(plan)}")
    docker.append('-v "${HF_HOME:-$HOME/.cache/huggingface}:' + HF_CACHE_IN_CONTAINER + '"')
    if plan.engine.build is not None:
        # Built once per host: later runs find the content-addressed tag and skip the build.
        lines.append(
            f"docker image inspect {plan.engine.image} >/dev/null 2>&1 || docker build -t {plan.engine.image} - <<'DOCKERFILE'"
        )
        lines.append(dockerfile(plan.engine.build) + "DOCKERFILE")
    passed = [
        "HF_TOKEN",
        *([plan.api_key_env] if plan.api_key_env else []),
        *sorted(plan.env),
        *(["NODE_RANK", "DIST_INIT_ADDR"] if plan.gpus.nnodes > 1 else []),
    ]
    docker.append(" ".join(f"-e {name}" for name in passed))
    extra = MULTI_NODE_ARGS if plan.gpus.nnodes > 1 else ""
    # On the host network the server's own address is what the world sees: loopback unless a key guards it.
    host = plan.host if plan.gpus.nnodes > 1 and plan.api_key_env is None else ALL_INTERFACES
    command = container_shell_command(plan, extra, host)
    docker += [str(plan.engine.image), "bash -c " + shlex.quote(command)]
    lines.append("exec " + " \\\n  ".join(docker))
    return "\n".join(lines) + "\n"
