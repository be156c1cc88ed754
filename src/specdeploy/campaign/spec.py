"""The campaign file: a TOML matrix of server configurations and benchmark cells, validated by pydantic.

Example (the keys this reads; see examples/ for complete files)::

    name = "kimi-k2.6-rtx-pro-6000"
    recipe = "kimi-k2.6"              # shipped recipe name, or a recipe .toml path (relative to this file)
    hardware = "rtx-pro-6000-x8"
    launcher = "docker"               # docker | local | reference (default: reference for CPU recipes)
    modes = ["ar", "dflash", "ddtree"]
    ddtree_budgets = [8, 16, 32]
    tp = [8]                          # tensor-parallel sizes (default: the plan's own choice)
    max_running_requests = 32         # and context_length: every server's (default: the recipe's)
    concurrency = [1, 4, 16, 32]
    datasets = ["gsm8k", "humaneval", "mt-bench"]
    repeats = 1                       # per server start
    rounds = 1                        # starts of every server configuration, in turn with the others
    num_prompts = 80
    max_new_tokens = 512
    thinking = ["off", "on"]          # a thinking recipe's settings, each measured and labelled

    [bench]                           # options for every run (BenchConfig's names)
    temperature = 0.0
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no TOML reader in the standard library
    import tomli as tomllib

from specdeploy.bench.workloads import DATASETS
from specdeploy.deploy.deployment import DEFAULT_HEALTH_TIMEOUT_S
from specdeploy.deploy.launchers import LauncherName
from specdeploy.errors import SpecdeployError
from specdeploy.modes import Budget, Mode
from specdeploy.recipes.thinking import Thinking


class _Strict(BaseModel):
    # A typo in a campaign key must fail before hours of GPU time, not fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class BenchOptions(_Strict):
    """Options every run of the campaign shares; the names and meanings of `specdeploy bench`."""

    warmup: int = Field(2, ge=0)
    temperature: float = Field(0.0, ge=0)
    route: Literal["generate", "chat", "completions"] = "generate"
    chat_template: bool = True
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    tokenizer: str | None = None
    model: str | None = None
    category: str | None = None
    duration_s: float | None = Field(None, gt=0)
    timeout_s: float = Field(600.0, gt=0)
    seed: int = 0
    random_input_len: int = Field(512, ge=1)
    random_output_len: int = Field(256, ge=1)
    random_vocab_size: int = Field(32000, ge=2)
    price_per_gpu_hour: float | None = Field(None, ge=0)  # USD: cells record $ per million tokens


class CampaignSpec(_Strict):
    name: str = Field(min_length=1)
    recipe: str
    hardware: str
    launcher: LauncherName | None = None
    modes: list[Mode] = Field(min_length=1)
    ddtree_budgets: list[Budget] = Field(default_factory=list)  # numbers, or auto (reference engine)
    tp: list[int] = Field(default_factory=list)
    context_length: int | None = Field(None, ge=1)  # every server's (default: the recipe's)
    max_running_requests: int | None = Field(None, ge=1)  # every server's (default: the recipe's)
    concurrency: list[int] = Field(default_factory=list)
    request_rates: list[float] = Field(default_factory=list)
    datasets: list[str] = Field(min_length=1)
    data_dir: str | None = None
    repeats: int = Field(1, ge=1)  # per server start
    # starts of every server configuration, in turn with the others (AR, DDTree-16, ..., then AR again), each
    # measuring `repeats` repeats: two starts of one tiny-model server on an H200 made 17% different throughput
    # at 64 requests, a spread that repeats within one start never see
    rounds: int = Field(1, ge=1)
    num_prompts: int | None = Field(None, ge=1)
    max_new_tokens: int = Field(256, ge=1)
    port: int | None = Field(None, ge=1, le=65535)
    health_timeout_s: float = Field(DEFAULT_HEALTH_TIMEOUT_S, gt=0)
    smoke: bool = True
    api_key: bool = False  # servers require $SPECDEPLOY_API_KEY; bench, smoke and health send it
    # A thinking recipe's settings to measure, each dataset once per setting (required for a thinking recipe)
    thinking: list[Thinking] = Field(default_factory=list)
    bench: BenchOptions = Field(default_factory=BenchOptions)

    @field_validator("modes", "ddtree_budgets", "tp", "concurrency", "request_rates", "datasets", "thinking")
    @classmethod
    def _no_repeats(cls, values: list[Any]) -> list[Any]:
        if len(set(values)) != len(values):
            raise ValueError(f"lists each value twice: {values}")
        return values

    @field_validator("ddtree_budgets", "tp", "concurrency")
    @classmethod
    def _positive(cls, values: list[Any]) -> list[Any]:
        if any(isinstance(v, int) and v < 1 for v in values):
            raise ValueError(f"values must be >= 1, got {values}")
        return values

    @field_validator("request_rates")
    @classmethod
    def _positive_rates(cls, values: list[float]) -> list[float]:
        if any(v <= 0 for v in values):
            raise ValueError(f"rates must be > 0 requests/s, got {values}")
        return values

    @field_validator("datasets")
    @classmethod
    def _known_datasets(cls, values: list[str]) -> list[str]:
        unknown = [v for v in values if v not in DATASETS]
        if unknown:
            raise ValueError(f"unknown dataset(s) {unknown}: choose from {', '.join(DATASETS)}")
        return values

    @model_validator(mode="after")
    def _matrix_is_paired(self) -> CampaignSpec:
        if "ar" not in self.modes:
            raise ValueError(
                "modes must include ar: every speculative cell is paired with the AR run on the same prompts"
            )
        if self.ddtree_budgets and "ddtree" not in self.modes:
            raise ValueError("ddtree_budgets is set but modes has no ddtree")
        return self

    @property
    def budgets(self) -> list[Budget | None]:
        """DDTree budgets to run; None lets the plan choose (block size - 1)."""
        return list(self.ddtree_budgets) or [None]

    @property
    def tp_sizes(self) -> list[int | None]:
        return list(self.tp) or [None]


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors()
    )


def _resolve(value: str | None, base: Path, is_path: bool) -> str | None:
    """A relative path in the file is relative to the file, so a campaign runs from any directory."""
    if value is None or not is_path or Path(value).expanduser().is_absolute():
        return value
    # Absolute, so that a resume from another working directory sees the same campaign.
    return str(base.resolve() / value)


def parse_campaign(data: dict[str, Any], base: Path, source: str) -> CampaignSpec:
    """Validate campaign data; relative recipe, hardware and data paths are taken from `base`."""
    try:
        spec = CampaignSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecdeployError(f"campaign {source} is invalid: {_problems(exc)}") from exc
    return spec.model_copy(
        update={
            "recipe": _resolve(spec.recipe, base, spec.recipe.endswith(".toml")),
            "hardware": _resolve(spec.hardware, base, spec.hardware.endswith(".toml")),
            "data_dir": _resolve(spec.data_dir, base, True),
        }
    )


def load_campaign(path: Path) -> CampaignSpec:
    if not path.is_file():
        raise SpecdeployError(f"campaign file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecdeployError(f"campaign {path} is not valid TOML: {exc}") from exc
    return parse_campaign(data, path.parent, str(path))
