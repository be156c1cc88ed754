"""SGLang's own start-up resolution and validation of a plan, on a machine without its GPUs.

SGLang 0.5.23's `prepare_server_args` only parses: `ServerArgs.__post_init__` is empty
(sglang/srt/server_args.py:241) and launchers call `ServerArgs.resolve_once()` (server_args.py:244), which
runs the `arg_groups` pipeline (sglang/srt/arg_groups/pipeline.py, `run_resolution_pipeline`): the DFLASH
checks (arg_groups/speculative_hook.py:287, `_handle_dflash`), memory defaults, attention backends, parallelism.
This module runs that in a child process, as the plan's hardware profile would see it:

- the GPU: SGLang reads it through torch.cuda (`is_available`, `device_count`, `get_device_capability`,
  `get_device_properties`), `torch.version.cuda` and nvidia-smi (`utils/common.py:802`,
  `get_nvgpu_memory_capacity`); the child answers those from the profile, after SGLang's modules are imported
  as on a CPU (CUDA-only kernels are imported only where a GPU is seen), then clears SGLang's cached probes;
- the models: each checkpoint's config.json, from the recipe (`hf_config`), in a throwaway offline Hugging
  Face cache, so that the argv is checked exactly as written (same `--model-path`, same `--revision`);
- torchvision: SGLang's multimodal config modules import it at module level (multimodal/internvl_utils.py:5,
  configs/deepseek_ocr.py:7); the PyPI wheel built for torch 2.13 is CUDA-linked and fails to load beside
  the CPU torch, so those modules get an inert stand-in (they define image preprocessing, which resolution
  never runs), while transformers, which asks whether torchvision is installed, still sees none.

Run in a child process: the stand-ins and the patched torch.cuda must not leak into the caller.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

from specdeploy.errors import SpecdeployError
from specdeploy.plan.engines import DDTREE_ALGORITHM, DDTREE_FLAGS, SGLANG_VERSION
from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.recipes.schema import HardwareProfile, ModelFacts, Recipe

# The DDTree PR runs DFLASH's argument handling first; 0.5.23 checks the rest of a DDTree argv as DFLASH.
DDTREE_HANDLED_AS = "DFLASH"
CHILD_TIMEOUT_S = 600
CUDA_VERSION = "13.0"  # the release image's CUDA (cu130)


@dataclass(frozen=True)
class SglangVerdict:
    """What SGLang's start-up resolution said of one plan."""

    accepted: bool
    message: str  # SGLang's own error text when refused; what it resolved when accepted


# A plan's verdict, or None where SGLang is not importable here (up's preflight says so and goes on).
StartupCheck = Callable[[LaunchPlan], SglangVerdict | None]


def release_argv(plan: LaunchPlan) -> list[str]:
    """The server argv as SGLang 0.5.23 can check it: a DDTree plan without the PR's own flags, as DFLASH."""
    args = plan.server_args
    kept: list[str] = []
    skip = False
    for at, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in DDTREE_FLAGS:
            skip = True  # each of the PR's flags takes one value
        elif arg == DDTREE_ALGORITHM and at > 0 and args[at - 1] == "--speculative-algorithm":
            kept.append(DDTREE_HANDLED_AS)
        else:
            kept.append(arg)
    return kept


def check_request(plan: LaunchPlan, recipe: Recipe, hardware: HardwareProfile) -> dict:
    """The JSON the child reads for one plan: argv, the GPU as the profile describes it, the configs."""
    if plan.engine.name != "sglang":
        raise SpecdeployError(
            f"{plan.recipe} runs on the reference engine: there is no SGLang start-up to check"
        )
    models: list[ModelFacts] = [recipe.target, *(m for m in (recipe.dflash, recipe.eagle3) if m is not None)]
    used = {ref.path: ref.revision for ref in plan.models}
    configs = {}
    for model in models:
        if model.path not in used:
            continue
        if model.hf_config is None:
            raise SpecdeployError(
                f"recipe {recipe.name} holds no hf_config for {model.path}: SGLang reads the checkpoint's "
                "config.json at start-up; copy the fields it reads into the recipe's hf_config table"
            )
        configs[model.path] = {"revision": used[model.path], "config": model.hf_config}
    major, minor = (int(part) for part in (hardware.compute_capability or "0.0").split("."))
    gpu = {
        "name": hardware.gpu_model,
        "count": hardware.gpu_count,
        "memory_mib": hardware.memory_mib,
        "capability": [major, minor],
    }
    return {"argv": release_argv(plan), "gpu": gpu, "models": configs}


def run_checks(requests: list[dict], python: str = sys.executable) -> list[SglangVerdict]:
    """SGLang's verdict on each request, from one child process (SGLang's import takes seconds)."""
    try:
        done = subprocess.run(
            [python, "-m", "specdeploy.deploy.sglang_resolve"],
            input=json.dumps(requests),
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as exc:
        raise SpecdeployError(
            f"SGLang's start-up validation took over {CHILD_TIMEOUT_S} s and was stopped"
        ) from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(lines) != len(requests):
        raise SpecdeployError(
            f"could not run SGLang {SGLANG_VERSION}'s start-up validation (exit {done.returncode}): "
            f"{done.stderr.strip()[-1500:]}\nsetup.sh installs SGLang and what its resolution imports on "
            "Python 3.11: run ./setup.sh"
        )
    return [SglangVerdict(**json.loads(line)) for line in lines]


def check_plan(plan: LaunchPlan, recipe: Recipe, hardware: HardwareProfile) -> SglangVerdict:
    return run_checks([check_request(plan, recipe, hardware)])[0]


def verdict_line(plan: LaunchPlan, verdict: SglangVerdict) -> str:
    """SGLang's verdict as `plan --check` and `up`'s preflight print it."""
    said = "accepted" if verdict.accepted else "refused"
    scope = " (without the DDTree PR's own flags, as DFLASH)" if plan.mode == "ddtree" else ""
    return f"SGLang {SGLANG_VERSION} start-up validation{scope} {said}: {verdict.message}"


def sglang_importable() -> bool:
    """Whether this interpreter (the one the check's child runs) has SGLang, without importing it."""
    return importlib.util.find_spec("sglang") is not None


def startup_check(recipe: Recipe, hardware: HardwareProfile) -> StartupCheck:
    """`up`'s preflight check of its plan: SGLang's verdict, or None where SGLang is not importable here."""

    def check(plan: LaunchPlan) -> SglangVerdict | None:
        return check_plan(plan, recipe, hardware) if sglang_importable() else None

    return check
