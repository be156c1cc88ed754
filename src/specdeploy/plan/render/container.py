"""What every container rendering shares: the server argv bound to all interfaces, mounts, secrets."""

from __future__ import annotations

import re
import shlex

from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import LaunchPlan

HF_CACHE_IN_CONTAINER = "/root/.cache/huggingface"
ALL_INTERFACES = "0.0.0.0"
SHM_SIZE = "32g"  # NCCL and the tokenizer workers exchange tensors through /dev/shm
DIST_INIT_PORT = 20000
# Loading the weights dominates start-up: allow a base plus this many seconds per GB before failing health.
STARTUP_BASE_S = 600
STARTUP_S_PER_GB = 2


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with `flag value` replaced, or appended when absent."""
    if flag in argv:
        at = argv.index(flag)
        return [*argv[: at + 1], value, *argv[at + 2 :]]
    return [*argv, flag, value]


def container_argv(plan: LaunchPlan, host: str = ALL_INTERFACES) -> list[str]:
    """The server argv as a container runs it: listening on all interfaces so the port mapping reaches it."""
    if plan.engine.image is None:
        raise SpecdeployError(
            f"the {plan.engine.name} engine runs without a container: render with --format sh "
            "(or use `specdeploy up --launcher reference`)"
        )
    return with_flag(plan.argv, "--host", host)


def published_port(plan: LaunchPlan) -> str:
    """The host side of the port mapping: every interface only when the server demands a key, else loopback
    (what `up` binds), so a rendered script never opens an unauthenticated server to the network."""
    host = "" if plan.api_key_env is not None else f"{plan.host}:"
    return f"{host}{plan.port}:{plan.port}"


def api_key_args(plan: LaunchPlan) -> str:
    """SGLang's `--api-key` taken from the environment by the shell, so the key itself is written nowhere."""
    if plan.api_key_env is None or plan.engine.name != "sglang":
        return ""  # `specdeploy serve` reads the variable itself
    return f' --api-key "${plan.api_key_env}"'


def container_shell_command(plan: LaunchPlan, extra_args: str = "", host: str = ALL_INTERFACES) -> str:
    """One shell line that execs the server (the image holds the build: nothing is installed at start)."""
    return "exec " + shlex.join(container_argv(plan, host)) + extra_args + api_key_args(plan)


def gated_models(plan: LaunchPlan) -> list[str]:
    return [model.path for model in plan.models if model.gated]


def startup_seconds(plan: LaunchPlan) -> int:
    weights_gb = sum(model.disk_bytes for model in plan.models) / 1e9
    return int(STARTUP_BASE_S + STARTUP_S_PER_GB * weights_gb)


def resource_name(plan: LaunchPlan) -> str:
    """A DNS-1123 label for Kubernetes objects and compose services."""
    name = re.sub(r"[^a-z0-9]+", "-", f"{plan.recipe}-{plan.mode}".lower()).strip("-")
    return name[:50]
