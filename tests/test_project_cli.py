"""`project` and `recommend` on campaign directories: the Kimi K2.6 DFlash/DDTree example run against fake
SGLang servers and projected onto B200s with every assumption printed; `report` shows the model's figure."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.campaign.runner import run_campaign
from specdeploy.campaign.spec import parse_campaign
from specdeploy.cli import app
from specdeploy.deploy.deployment import Deployment
from specdeploy.deploy.launchers import LaunchHandle
from specdeploy.deploy.manifest import DeploymentRecord
from specdeploy.plan.launch_plan import LaunchPlan

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

EXAMPLE = Path(__file__).parent.parent / "examples" / "campaign-kimi-k2.6-rtx-pro-6000.toml"
pytestmark = pytest.mark.slow  # a five-server campaign, about 30 s on a loaded laptop

TOKENS_PER_STEP = {"ar": 1, "dflash": 3, 8: 3, 16: 4, 32: 5}  # what each fake server commits per step


class FakeSglang:
    """A fake SGLang server per start, whose step grows with the tokens it verifies: 4 ms + 0.1 ms each."""

    def __init__(self) -> None:
        self.threads: list[ServerThread] = []

    def start(self, plan: LaunchPlan, deploy_dir: Path) -> Deployment:
        verified = {"ar": 1, "dflash": 8}.get(plan.mode, (plan.budget or 0) + 1)
        per_step = TOKENS_PER_STEP[plan.mode if plan.mode != "ddtree" else plan.budget]
        stream = StreamPlan(
            ttft_s=0.004, gap_s=0.004 + 0.0001 * verified, tokens_per_chunk=per_step, output_tokens=24
        )
        thread = ServerThread(FakeServer(stream)).start()
        self.threads.append(thread)
        handle = LaunchHandle(launcher="docker", url=thread.url, log_path=str(deploy_dir / "server.log"))
        record = DeploymentRecord(
            state="running", recipe=plan.recipe, mode=plan.mode, launcher=handle, updated_at=""
        )
        return Deployment(run_dir=deploy_dir, record=record)

    def stop(self, deployment: Deployment) -> None:
        next(t for t in self.threads if t.url == deployment.url).stop()

    def healthy(self, deployment: Deployment) -> bool:
        return True

    def stop_leftover(self, deploy_dir: Path) -> None:
        """In-process servers die with the process."""


@pytest.fixture(scope="module")
def kimi_campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's matrix with local prompts, fewer cells and short answers (the fake servers' speed)."""
    tmp = tmp_path_factory.mktemp("kimi")
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(3)))
    data: dict[str, Any] = tomllib.loads(EXAMPLE.read_text())
    data.update(datasets=["custom"], data_dir=str(prompts), concurrency=[1, 4], num_prompts=None, smoke=False)
    data["bench"] = {**data["bench"], "warmup": 0, "chat_template": False}
    out = tmp / "campaign"
    run_campaign(parse_campaign(data, EXAMPLE.parent, "test"), out, FakeSglang(), log=lambda *_: None)
    return out


def test_b200_projection_of_the_kimi_campaign_prints_every_assumption(kimi_campaign: Path) -> None:
    result = CliRunner().invoke(
        app, ["project", str(kimi_campaign), "--hardware", "b200-x8", "--budgets", "8,16,24,32"]
    )
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    for expected in (
        "rtx-pro-6000-x8 -> b200-x8",
        "x 0.224 (HBM 1792 -> 8000 GB/s)",  # 1,792 / 8,000
        "routed experts' weights (MoE): memory-bound",
        "61 layers x 2 ring all-reduces",
        "latency 25 -> 8 us",
        "link 64 (pcie) -> 900 (nvlink) GB/s",
        "384 x (1 - (1 - 8/384)^n)",
        "tau depends on the budget and the dataset only",
        "datasheet peaks",
        "ddtree b24",
    ):
        assert expected in text, expected


def test_project_json_rows_carry_the_report_names(kimi_campaign: Path) -> None:
    result = CliRunner().invoke(
        app,
        [
            "project",
            str(kimi_campaign),
            "--budgets",
            "24",
            "--concurrency",
            "2",
            "--json",
            "--price-per-gpu-hour",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    rows = {(r["mode"], r["budget"]): r for r in document["rows"]}
    row = rows[("ddtree", 24)]
    assert row["predicted"] is True and row["concurrency"] == 2
    assert row["interval"]["low"] <= row["output_tok_s"] <= row["interval"]["high"]
    # 8 GPUs x $3/h for the predicted rate: $ per million = 24 / 3600 / tok_s * 1e6
    assert row["usd_per_million_tokens"] == pytest.approx(24 / 3600 / row["output_tok_s"] * 1e6)
    assert {"ar", "dflash", "ddtree"} <= {r["mode"] for r in document["rows"]}


def test_fit_budgets_predict_a_measured_budget_it_left_out(kimi_campaign: Path) -> None:
    result = CliRunner().invoke(
        app, ["project", str(kimi_campaign), "--budgets", "16", "--fit-budgets", "8,32", "--json"]
    )
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.output)["rows"] if r["budget"] == 16 and r["concurrency"] == 1)
    assert row["measured_output_tok_s"] is not None and row["tau_measured"] is False


def test_recommend_and_report(kimi_campaign: Path) -> None:
    result = CliRunner().invoke(app, ["recommend", str(kimi_campaign), "--json"])
    assert result.exit_code == 0, result.output
    choices = json.loads(result.output)["recommendations"]
    assert {c["concurrency"] for c in choices} == {1, 4}
    report = CliRunner().invoke(app, ["report", str(kimi_campaign), "--json"])
    rows = json.loads(report.stdout)["rows"]
    assert all(r["predicted_output_tok_s"] is not None for r in rows)
