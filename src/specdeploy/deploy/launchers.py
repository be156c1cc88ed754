"""Launchers turn a LaunchPlan into a running server process or container, and stop it again."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel

from specdeploy.api_key import api_key_from_env, redact
from specdeploy.deploy.image_build import build_image
from specdeploy.deploy.processes import ProcessIdentity, identify, leader_alive, stop_group
from specdeploy.deploy.weights import hub_cache_dir, model_location
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import REFERENCE_LAUNCH, LaunchPlan

LauncherName = Literal["docker", "local", "reference"]
LAUNCHERS: tuple[LauncherName, ...] = ("docker", "local", "reference")

LOG_FILE = "server.log"
CONTAINER_HF_CACHE = "/root/.cache/huggingface/hub"
# SGLang's NCCL and data loaders use /dev/shm; Docker's 64 MB default breaks multi-GPU runs.
DOCKER_SHM_SIZE = "32g"
# Names of host variables handed to the container by name only, so that secrets never appear in argv.
DOCKER_PASSTHROUGH_ENV = ("HF_TOKEN",)


class LaunchHandle(BaseModel):
    """How to find a started server again, from this process or a later `specdeploy` command."""

    launcher: LauncherName
    url: str
    log_path: str
    process: ProcessIdentity | None = None  # local and reference launchers: the process group leader
    container_name: str | None = None
    container_id: str | None = None


class Launcher(Protocol):
    name: LauncherName

    def command(self, plan: LaunchPlan, run_dir: Path) -> list[str]: ...

    def start(self, plan: LaunchPlan, run_dir: Path) -> LaunchHandle: ...

    def is_running(self, handle: LaunchHandle) -> bool: ...

    def stop(self, handle: LaunchHandle, grace_s: float) -> None: ...

    def tail(self, handle: LaunchHandle, lines: int) -> list[str]: ...


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with `flag value` set: replaced where present (`--flag v` or `--flag=v`), else appended."""
    out: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == flag:
            index += 2
            continue
        if not arg.startswith(f"{flag}="):
            out.append(arg)
        index += 1
    return [*out, flag, value]


def passed_env(plan: LaunchPlan) -> list[str]:
    """Host variables a container gets by name: the Hub token, and the API key when the plan needs one."""
    return [*DOCKER_PASSTHROUGH_ENV, *([plan.api_key_env] if plan.api_key_env else [])]


def with_api_key(plan: LaunchPlan, argv: list[str]) -> list[str]:
    """SGLang's argv wrapped so that its shell adds `--api-key` from the environment: argv never holds the key.

    `specdeploy serve` reads the variable itself, so reference plans run unchanged.
    """
    if plan.api_key_env is None or plan.engine.name != "sglang":
        return argv
    return ["bash", "-c", f'exec "$@" --api-key "${plan.api_key_env}"', "bash", *argv]


def server_url(plan: LaunchPlan) -> str:
    return f"http://127.0.0.1:{plan.port}"


def tail_file(path: Path, lines: int) -> list[str]:
    if not path.is_file():
        return []
    with path.open(errors="replace") as log:
        return [line.rstrip("\n") for line in deque(log, maxlen=lines)]


class ProcessLauncher:
    """Runs the plan's argv as a local process in its own process group, output to the run's log file."""

    name: LauncherName = "local"

    def command(self, plan: LaunchPlan, run_dir: Path) -> list[str]:
        return with_api_key(plan, list(plan.argv))

    def start(self, plan: LaunchPlan, run_dir: Path) -> LaunchHandle:
        argv = self.command(plan, run_dir)
        log_path = run_dir / LOG_FILE
        run_dir.mkdir(parents=True, exist_ok=True)
        if api_key_from_env():
            # SGLang logs its arguments, the key among them: the log goes through a redacting pipe.
            argv = [sys.executable, "-m", "specdeploy.deploy.log_redactor", str(log_path), "--", *argv]
        with log_path.open("ab") as log:
            try:
                # A new session makes the server a process group leader: stop() signals all its workers.
                process = subprocess.Popen(
                    argv,
                    env={**os.environ, **plan.env},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                raise SpecdeployError(
                    f"cannot start {argv[0]!r}: not found on PATH; activate the environment that has the engine "
                    "installed, or use `--launcher docker`"
                ) from exc
        return LaunchHandle(
            launcher=self.name, url=server_url(plan), log_path=str(log_path), process=identify(process.pid)
        )

    def is_running(self, handle: LaunchHandle) -> bool:
        return handle.process is not None and leader_alive(handle.process)

    def stop(self, handle: LaunchHandle, grace_s: float) -> None:
        """SIGTERM to the whole process group (workers too), SIGKILL after `grace_s` seconds."""
        if handle.process is not None:
            stop_group(handle.process, grace_s)

    def tail(self, handle: LaunchHandle, lines: int) -> list[str]:
        return tail_file(Path(handle.log_path), lines)


class ReferenceLauncher(ProcessLauncher):
    """`specdeploy serve ...` through this very interpreter, so that the reference engine is this install."""

    name: LauncherName = "reference"

    def command(self, plan: LaunchPlan, run_dir: Path) -> list[str]:
        prefix = list(REFERENCE_LAUNCH)
        if plan.engine.name != "reference" or plan.argv[: len(prefix)] != prefix:
            raise SpecdeployError(
                f"the reference launcher runs reference-engine plans (`specdeploy serve ...`), this plan runs "
                f"{plan.engine.name}: use `--launcher docker` or `--launcher local`"
            )
        return [sys.executable, "-m", "specdeploy.cli", *plan.argv[1:]]


def _docker(argv: list[str], timeout_s: float = 120.0) -> str:
    try:
        result = subprocess.run(
            ["docker", *argv], check=True, capture_output=True, text=True, timeout=timeout_s
        )
    except FileNotFoundError as exc:
        raise SpecdeployError("docker is not installed: install Docker, or use `--launcher local`") from exc
    except subprocess.CalledProcessError as exc:
        raise SpecdeployError(f"`docker {shlex.join(argv)}` failed: {exc.stderr.strip()}") from exc
    return result.stdout.strip()


class DockerLauncher:
    """`docker run` of the plan's pinned image with all GPUs, host IPC, a large /dev/shm and the HF cache."""

    name: LauncherName = "docker"

    def container_name(self, run_dir: Path) -> str:
        return f"specdeploy-{run_dir.name}"

    def command(self, plan: LaunchPlan, run_dir: Path) -> list[str]:
        if plan.engine.image is None:
            raise SpecdeployError(
                f"the plan for engine {plan.engine.name} has no container image: use `--launcher local` "
                "or `--launcher reference`"
            )
        # Inside the container the server must listen on all interfaces for the published port to reach it.
        server_argv = with_api_key(plan, with_flag(plan.argv, "--host", "0.0.0.0"))
        volumes = [f"{hub_cache_dir()}:{CONTAINER_HF_CACHE}"]
        volumes += [f"{m.path}:{m.path}:ro" for m in plan.models if model_location(m.path) == "local"]
        return [
            "docker",
            "run",
            "--detach",
            "--name",
            self.container_name(run_dir),
            "--gpus",
            "all",
            "--ipc",
            "host",
            "--shm-size",
            DOCKER_SHM_SIZE,
            "--publish",
            f"{plan.host}:{plan.port}:{plan.port}",  # reachable where the plan says, not on every interface
            *[arg for volume in volumes for arg in ("--volume", volume)],
            *[arg for name in passed_env(plan) for arg in ("--env", name)],
            *[arg for key, value in sorted(plan.env.items()) for arg in ("--env", f"{key}={value}")],
            plan.engine.image,
            *server_argv,
        ]

    def start(self, plan: LaunchPlan, run_dir: Path) -> LaunchHandle:
        command = self.command(plan, run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if plan.engine.build is not None:
            build_image(plan.engine)  # once per host: a later start finds the tag and reuses it
        # Pull first, in the open: images are tens of GB, and `docker run -d` would pull silently.
        elif subprocess.run(["docker", "pull", str(plan.engine.image)], stdout=sys.stderr).returncode != 0:
            raise SpecdeployError(
                f"`docker pull {plan.engine.image}` failed (see above): check the tag and your network/registry login"
            )
        container_id = _docker(command[1:])
        return LaunchHandle(
            launcher=self.name,
            url=server_url(plan),
            log_path=str(run_dir / LOG_FILE),
            container_name=self.container_name(run_dir),
            container_id=container_id,
        )

    def is_running(self, handle: LaunchHandle) -> bool:
        try:
            return (
                _docker(["inspect", "--format", "{{.State.Running}}", str(handle.container_name)]) == "true"
            )
        except SpecdeployError:
            return False

    def stop(self, handle: LaunchHandle, grace_s: float) -> None:
        """`docker stop` (SIGTERM, SIGKILL after the grace period); the log is kept in the run directory."""
        name = str(handle.container_name)
        try:
            _docker(["stop", "--time", str(int(grace_s)), name], timeout_s=grace_s + 60)
            Path(handle.log_path).write_text(_container_log(name, "all") or "")
            _docker(["rm", name])
        except SpecdeployError as exc:
            if "No such container" not in str(exc):
                raise

    def tail(self, handle: LaunchHandle, lines: int) -> list[str]:
        log = _container_log(str(handle.container_name), str(lines))
        if log is None:  # removed already: `stop` saved the log in the run directory
            return tail_file(Path(handle.log_path), lines)
        return log.splitlines()[-lines:]


def _container_log(name: str, tail: str) -> str | None:
    """`docker logs` of a container (the last `tail` lines, or "all"); None if it or docker is gone."""
    try:
        # docker logs replays the container's stderr on its own stderr: merge both, in order.
        result = subprocess.run(
            ["docker", "logs", "--tail", tail, name],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
        )
    except FileNotFoundError:
        return None
    return redact(result.stdout) if result.returncode == 0 else None


def get_launcher(name: str) -> Launcher:
    launchers: dict[str, Launcher] = {
        "docker": DockerLauncher(),
        "local": ProcessLauncher(),
        "reference": ReferenceLauncher(),
    }
    if name not in launchers:
        raise SpecdeployError(f"unknown launcher {name!r}: use one of {', '.join(LAUNCHERS)}")
    return launchers[name]
