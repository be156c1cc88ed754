"""Thinking as an explicit axis: a thinking target is benchmarked with thinking on or off, as asked."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.bench.runner import BenchConfig, run
from specdeploy.bench.runs import load_series
from specdeploy.campaign.matrix import bench_runs, server_configs
from specdeploy.campaign.spec import load_campaign, parse_campaign
from specdeploy.errors import SpecdeployError
from specdeploy.recipes import load_recipe
from specdeploy.recipes.thinking import with_thinking
from specdeploy.report.rows import report_rows

PLAN = StreamPlan(ttft_s=0.001, gap_s=0.001, tokens_per_chunk=2, output_tokens=8)


@pytest.fixture
def kimi_server() -> Iterator[str]:
    thread = ServerThread(FakeServer(PLAN, model="moonshotai/Kimi-K2.6")).start()
    try:
        yield thread.url
    finally:
        thread.stop()


def config(url: str, **extra) -> BenchConfig:
    return BenchConfig(
        url=url, dataset="random", num_prompts=2, warmup=0, max_new_tokens=8, random_input_len=8,
        chat_template=False, **extra,
    )  # fmt: skip


def test_a_kimi_bench_without_a_thinking_setting_is_refused_with_how_to_set_it(kimi_server, tmp_path: Path):
    with pytest.raises(
        SpecdeployError, match=r"kimi-k2.6 is a thinking model.*--thinking off or --thinking on"
    ):
        run(config(kimi_server), tmp_path / "run")
    assert not (tmp_path / "run").exists()  # refused before anything was measured


@pytest.mark.parametrize(("thinking", "sent"), [("off", False), ("on", True)])
def test_the_setting_is_sent_as_kimis_template_reads_it_and_recorded(kimi_server, tmp_path, thinking, sent):
    run(config(kimi_server, thinking=thinking), tmp_path / "run")
    options = json.loads((tmp_path / "run" / "manifest.json").read_text())["options"]
    # Kimi K2.x's chat template reads `thinking` (the recipe's switch), not Qwen's `enable_thinking`
    assert options["chat_template_kwargs"] == {"thinking": sent} and options["thinking"] == thinking


def test_reports_show_the_thinking_setting(kimi_server, tmp_path: Path):
    run(config(kimi_server, thinking="off"), tmp_path / "run")
    (row,) = report_rows(load_series([tmp_path / "run"]))
    assert row.dataset == "random (thinking off)"


def test_kwargs_given_directly_count_as_a_setting_and_contradictions_are_refused():
    kimi = ("kimi-k2.6", load_recipe("kimi-k2.6").thinking)
    assert with_thinking(kimi, None, {"thinking": False}, "") == {"thinking": False}
    with pytest.raises(SpecdeployError, match="contradicts"):
        with_thinking(kimi, "on", {"thinking": False}, "")
    assert with_thinking(None, None, {"x": 1}, "") == {"x": 1}  # not a thinking model: nothing asked


KIMI_CAMPAIGN = {
    "name": "kimi",
    "recipe": "kimi-k2.6",
    "hardware": "b200-x8",
    "modes": ["ar", "dflash"],
    "datasets": ["gsm8k"],
    "concurrency": [1],
}


def test_a_kimi_campaign_without_a_thinking_setting_is_refused_with_how_to_set_it():
    spec = parse_campaign(KIMI_CAMPAIGN, Path("."), "kimi.toml")
    with pytest.raises(
        SpecdeployError, match=r'campaign kimi: kimi-k2.6 is a thinking model.*thinking = \["off"\]'
    ):
        server_configs(spec)


def test_a_campaign_runs_both_settings_labelled_and_pairs_each_with_its_own_baseline(tmp_path: Path):
    spec = parse_campaign({**KIMI_CAMPAIGN, "thinking": ["off", "on"]}, Path("."), "kimi.toml")
    ar, dflash = server_configs(spec)
    runs = bench_runs(spec, dflash, tmp_path)
    assert [(run.label, run.config.thinking) for run in runs] == [
        ("gsm8k-thinking-off", "off"),
        ("gsm8k-thinking-on", "on"),
    ]
    baselines = [Path(run.path) for run in bench_runs(spec, ar, tmp_path)]
    assert [Path(run.config.baseline_run) for run in runs] == baselines


def test_the_shipped_kimi_campaign_runs_both():
    spec = load_campaign(Path(__file__).parents[1] / "examples" / "campaign-kimi-k2.6-rtx-pro-6000.toml")
    assert spec.thinking == ["off", "on"] and "thinking" not in spec.bench.chat_template_kwargs


def test_a_recipe_that_does_not_think_takes_no_thinking_setting():
    spec = parse_campaign(
        {**KIMI_CAMPAIGN, "recipe": "tiny-code", "hardware": "cpu", "thinking": ["off"]}, Path("."), "t.toml"
    )
    with pytest.raises(SpecdeployError, match="declares no thinking switch"):
        server_configs(spec)
