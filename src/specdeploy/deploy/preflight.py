"""Preflight: every check that can fail before weights are downloaded or GPUs are held, each with a remedy."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pydantic import BaseModel

from specdeploy.deploy.hardware import (
    NVIDIA_SMI_MEMORY_USED,
    CommandRunner,
    DetectedHardware,
    parse_memory_used,
    run_command,
)
from specdeploy.deploy.launchers import LauncherName
from specdeploy.deploy.sglang_check import StartupCheck, verdict_line
from specdeploy.deploy.weights import cached_bytes, hub_cache_dir, model_location
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import GpuRequirement, LaunchPlan, ModelRef

if TYPE_CHECKING:
    from huggingface_hub import HfApi


class _FreeSpace(Protocol):
    free: int


DiskUsage = Callable[[Path], _FreeSpace]

# nvidia-smi rounds and reserves a little memory: a profile's nominal size may read a few percent lower.
MEMORY_TOLERANCE = 0.95
# The driver and display stack keep a few hundred MiB on an idle GPU; more means another process.
IDLE_GPU_BYTES = 2**30
# Below this margin over the download size, the disk is "tight" (logs, compile caches, partial files).
DISK_MARGIN = 1.1


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


class CheckResult(BaseModel):
    name: str
    status: Status
    message: str


class PreflightReport(BaseModel):
    checks: list[CheckResult]

    @property
    def failures(self) -> list[CheckResult]:
        return [check for check in self.checks if check.status is Status.FAIL]

    def raise_on_failure(self) -> None:
        if self.failures:
            lines = "; ".join(f"{check.name}: {check.message}" for check in self.failures)
            raise SpecdeployError(f"preflight failed ({len(self.failures)} check(s)): {lines}")


def _ok(name: str, message: str) -> CheckResult:
    return CheckResult(name=name, status=Status.OK, message=message)


def _warn(name: str, message: str) -> CheckResult:
    return CheckResult(name=name, status=Status.WARN, message=message)


def _fail(name: str, message: str) -> CheckResult:
    return CheckResult(name=name, status=Status.FAIL, message=message)


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def check_driver(hardware: DetectedHardware) -> CheckResult:
    if hardware.driver_version is None:
        why = hardware.problem or "no NVIDIA driver answered"
        return _fail(
            "driver", f"{why}; install the NVIDIA driver, or use `--hardware cpu --launcher reference`"
        )
    return _ok("driver", f"NVIDIA driver {hardware.driver_version} (found via {hardware.source})")


def check_gpu_count(required: GpuRequirement, hardware: DetectedHardware) -> CheckResult:
    found = hardware.gpu_count
    if found < required.count:
        return _fail(
            "gpu count",
            f"the plan (profile {required.profile}) needs {required.count} GPUs, this machine has {found}; "
            "plan for this machine with `--hardware auto`, or run on the profile's hardware",
        )
    extra = f" (uses {required.count} of {found})" if found > required.count else ""
    return _ok("gpu count", f"{found} x {hardware.gpu_model}{extra}")


def check_architecture(required: GpuRequirement, hardware: DetectedHardware) -> CheckResult:
    found = hardware.compute_capability
    if found is None:
        return _fail(
            "architecture",
            f"mixed GPU models ({hardware.gpu_model}); use one model per deployment "
            "(restrict with CUDA_VISIBLE_DEVICES)",
        )
    if found != required.compute_capability:
        return _fail(
            "architecture",
            f"the plan was made for compute capability {required.compute_capability} ({required.gpu_model}), "
            f"this machine has {found} ({hardware.gpu_model}); attention backends differ per architecture: "
            "re-plan with `--hardware auto`",
        )
    return _ok("architecture", f"compute capability {found} ({hardware.sm}) as planned")


def check_gpu_memory(required: GpuRequirement, hardware: DetectedHardware) -> CheckResult:
    found = hardware.memory_bytes_per_gpu or 0
    if found < MEMORY_TOLERANCE * required.memory_bytes_per_gpu:
        return _fail(
            "gpu memory",
            f"the plan budgets {_gb(required.memory_bytes_per_gpu)} per GPU, this machine has {_gb(found)}; "
            "the weights or KV cache will not fit: re-plan with `--hardware auto`",
        )
    return _ok("gpu memory", f"{_gb(found)} per GPU (plan budgets {_gb(required.memory_bytes_per_gpu)})")


def check_interconnect(required: GpuRequirement, hardware: DetectedHardware) -> CheckResult:
    if required.count < 2 or hardware.interconnect == required.interconnect:
        return _ok("interconnect", f"{hardware.interconnect} as planned")
    if required.interconnect == "nvlink":
        return _fail(
            "interconnect",
            "the plan assumes NVLink, this machine's GPUs talk over PCIe: tensor-parallel all-reduce will be "
            "much slower and the plan's backend choices do not apply; re-plan with `--hardware auto`",
        )
    return _warn(
        "interconnect",
        f"the plan assumes {required.interconnect}, this machine has {hardware.interconnect}: its PCIe-only "
        "settings are not needed here; re-plan with `--hardware auto` for the best settings",
    )


def check_disk(
    models: list[ModelRef], cache_dir: Path, disk_usage: DiskUsage = shutil.disk_usage
) -> CheckResult:
    hub = [model for model in models if model_location(model.path) == "hub"]
    total = sum(model.disk_bytes for model in hub)
    needed = sum(max(0, model.disk_bytes - cached_bytes(model.path, cache_dir)) for model in hub)
    if not needed:
        return _ok(
            "disk", "no weights to download" if not total else f"all {_gb(total)} of weights are in the cache"
        )
    probe = cache_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the cache dir may not exist yet: measure the disk it will be created on
    free = disk_usage(probe).free
    what = f"the weights need {_gb(needed)} more" + (f" (of {_gb(total)})" if needed < total else "")
    where = f"{free / 1e9:.1f} GB free under {cache_dir}"
    if free < needed:
        return _fail("disk", f"{what}, only {where}; free space, or point HF_HUB_CACHE at a larger disk")
    if free < DISK_MARGIN * needed:
        return _warn("disk", f"{what}, {where}: little room for logs and caches")
    return _ok("disk", f"{what}, {where}")


def check_hf_token(models: list[ModelRef]) -> CheckResult:
    gated = [model.path for model in models if model.gated and model_location(model.path) == "hub"]
    # Imported here: httpx and huggingface_hub cost `specdeploy --help` a good part of a second.
    import huggingface_hub

    if huggingface_hub.get_token():
        return _ok("hf token", "a Hugging Face token is configured (HF_TOKEN or the token file)")
    if gated:
        return _fail(
            "hf token",
            f"{', '.join(gated)} is gated and no Hugging Face token is configured: "
            "create one at https://huggingface.co/settings/tokens, then `export HF_TOKEN=...` or `hf auth login`",
        )
    return _ok("hf token", "no token configured; none needed (no gated repository)")


def check_repo_access(model: ModelRef, api: HfApi) -> CheckResult:
    """401, 403 and 404 each mean something different here; say which, and what to do."""
    from huggingface_hub.errors import HfHubHTTPError, HTTPError

    name = f"access {model.path}"
    page = model.access_url or f"https://huggingface.co/{model.path}"
    try:
        info = api.model_info(model.path, revision=model.revision)
        if model.gated or info.gated:
            # Gated repos show their metadata to everyone; only the auth check says whether files may be read.
            api.auth_check(model.path)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:
            return _fail(
                name,
                f"401 Unauthorized: the Hugging Face token is missing or invalid for {model.path}; "
                "set a valid HF_TOKEN (https://huggingface.co/settings/tokens) or run `hf auth login`",
            )
        if status == 403:
            return _fail(
                name,
                f"403 Forbidden: your account has no access to the gated repo {model.path}; "
                f"request access at {page} (and use a token with read access to gated repos)",
            )
        if status == 404:
            revision = f" at revision {model.revision}" if model.revision else ""
            return _fail(
                name,
                f"404 Not Found: {model.path}{revision} does not exist (a wrong repo id or revision in the recipe) "
                "or is private to another account",
            )
        return _warn(name, f"the Hub answered {status}: access not verified ({exc})")
    except (HTTPError, OSError) as exc:  # connection refused, DNS, timeouts: the Hub did not answer
        return _warn(name, f"could not reach the Hugging Face Hub ({exc}): access not verified")
    pinned = f"revision {model.revision}" if model.revision else "unpinned revision (latest main)"
    return _ok(name, f"readable at {pinned}")


def check_docker(run: CommandRunner) -> CheckResult:
    try:
        runtimes = json.loads(run(["docker", "info", "--format", "{{json .Runtimes}}"]))
    except FileNotFoundError:
        return _fail("docker", "docker is not installed: install Docker, or use `--launcher local`")
    except subprocess.CalledProcessError as exc:
        return _fail(
            "docker",
            f"`docker info` failed ({(exc.stderr or '').strip() or exc.returncode}): start the Docker daemon "
            "and make sure this user may use it (the `docker` group)",
        )
    if "nvidia" not in runtimes:
        return _fail(
            "docker",
            f"Docker has no NVIDIA runtime (runtimes: {', '.join(sorted(runtimes))}): install the NVIDIA "
            "Container Toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker` and restart Docker",
        )
    return _ok("docker", f"Docker with the NVIDIA runtime (runtimes: {', '.join(sorted(runtimes))})")


def check_local_sglang(plan: LaunchPlan, run: CommandRunner) -> CheckResult:
    """The local launcher runs the plan's interpreter: is SGLang installed there, at the planned version?"""
    python = plan.argv[0]
    wanted = plan.engine.version.split("+")[0]  # "0.5.23+pr29907.93e9850e43": the release it builds on
    probe = "import importlib.metadata as m; print(m.version('sglang'))"
    try:
        found = run([python, "-c", probe]).strip()
    except FileNotFoundError:
        return _fail(
            "sglang", f"{python!r} is not on PATH: activate the environment that has SGLang installed"
        )
    except subprocess.CalledProcessError:
        return _fail(
            "sglang",
            f"SGLang is not installed for {python!r}: `pip install '{plan.engine.source}'`, or use `--launcher docker`",
        )
    if found != wanted:
        return _warn(
            "sglang",
            f"the plan was checked against SGLang {wanted}, {python!r} has {found}: flags and defaults may differ; "
            f"`pip install '{plan.engine.source}'` or use `--launcher docker`",
        )
    return _ok("sglang", f"SGLang {found} for {python!r}, as planned")


def check_sglang_startup(plan: LaunchPlan, startup_check: StartupCheck) -> CheckResult:
    """SGLang's own start-up resolution and validation of the plan's argv, before any download or launch."""
    name = "sglang start-up"
    try:
        verdict = startup_check(plan)
    except SpecdeployError as exc:
        # SGLang is importable but its resolution could not run here; the server runs the same check at launch.
        return _warn(name, f"not verified: {exc}")
    if verdict is None:
        return _warn(
            name,
            "skipped: SGLang not importable here (./setup.sh installs it on Python 3.11); the server runs the "
            "same validation when it starts",
        )
    line = verdict_line(plan, verdict)
    if not verdict.accepted:
        return _fail(name, f"{line}; the server would refuse to start: change the plan's overrides or recipe")
    return _ok(name, line)


def check_gpus_idle(plan: LaunchPlan, run: CommandRunner) -> CheckResult:
    """Memory another process holds (often a server from an earlier run) is missing from the plan's budget."""
    try:
        used = parse_memory_used(run(NVIDIA_SMI_MEMORY_USED))
    except (OSError, subprocess.CalledProcessError) as exc:
        return _warn("gpus idle", f"could not read GPU memory use ({exc}): not verified")
    total = plan.gpus.memory_bytes_per_gpu
    # SGLang claims mem_fraction_static of each GPU at start and fails when less than that is free.
    fraction = plan.memory.mem_fraction_static
    busy = {index: bytes_ for index, bytes_ in sorted(used.items()) if index < plan.gpus.count}
    too_full = [i for i, bytes_ in busy.items() if fraction is not None and total - bytes_ < fraction * total]
    holding = [index for index, bytes_ in busy.items() if bytes_ > IDLE_GPU_BYTES]
    listing = ", ".join(f"GPU {index}: {_gb(busy[index])}" for index in holding)
    remedy = "`nvidia-smi` shows which processes; stop them (an earlier deployment? `specdeploy status`)"
    if too_full:
        return _fail(
            "gpus idle",
            f"memory in use ({listing}) leaves less than the plan's {fraction:.0%} free: the server will not "
            f"start; {remedy}",
        )
    if holding:
        return _warn("gpus idle", f"memory in use ({listing}); {remedy}")
    return _ok("gpus idle", f"the {plan.gpus.count} GPUs hold no other work")


def check_api_key(plan: LaunchPlan) -> CheckResult:
    """A plan that requires a key reads it from the environment at launch: it must be there now."""
    if os.environ.get(str(plan.api_key_env)):
        return _ok("api key", f"${plan.api_key_env} is set; the server will require it")
    return _fail(
        "api key",
        f"the plan requires an API key and ${plan.api_key_env} is not set: `export {plan.api_key_env}=...` "
        "(clients send the same variable)",
    )


def check_port(host: str, port: int) -> CheckResult:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Servers bind with SO_REUSEADDR, so a port in TIME_WAIT is free for them: probe the same way.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return _fail(
                "port",
                f"{host}:{port} is not free ({exc.strerror}): another server runs there; "
                "stop it (`specdeploy down`) or pass `--port`",
            )
    return _ok("port", f"{host}:{port} is free")


def run_preflight(
    plan: LaunchPlan,
    hardware: DetectedHardware | None,
    launcher: LauncherName,
    *,
    api: HfApi | None = None,
    cache_dir: Path | None = None,
    disk_usage: DiskUsage = shutil.disk_usage,
    run: CommandRunner = run_command,
    startup_check: StartupCheck | None = None,
) -> PreflightReport:
    """All checks that apply to this plan and launcher; `hardware` is None when the plan needs no GPU.

    `startup_check`: SGLang's own start-up validation of an SGLang plan (`up` passes one; None runs none)."""
    checks: list[CheckResult] = []
    if startup_check is not None and plan.engine.name == "sglang":
        checks.append(check_sglang_startup(plan, startup_check))
    if plan.gpus.gpu_model is not None:
        if hardware is None:
            raise SpecdeployError("preflight of a GPU plan needs the detected hardware")
        checks.append(check_driver(hardware))
        if hardware.gpus:
            checks += [
                check_gpu_count(plan.gpus, hardware),
                check_architecture(plan.gpus, hardware),
                check_gpu_memory(plan.gpus, hardware),
                check_interconnect(plan.gpus, hardware),
                check_gpus_idle(plan, run),
            ]
    hub_models = [model for model in plan.models if model_location(model.path) == "hub"]
    if hub_models:
        checks.append(check_disk(plan.models, cache_dir or hub_cache_dir(), disk_usage))
        checks.append(check_hf_token(plan.models))
        from huggingface_hub import HfApi

        api = api or HfApi()
        checks += [check_repo_access(model, api) for model in hub_models]
    if launcher == "docker":
        checks.append(check_docker(run))
    if launcher == "local" and plan.engine.name == "sglang":
        checks.append(check_local_sglang(plan, run))
    if plan.api_key_env is not None:
        checks.append(check_api_key(plan))
    checks.append(check_port(plan.host, plan.port))
    return PreflightReport(checks=checks)
