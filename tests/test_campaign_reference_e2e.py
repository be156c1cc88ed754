"""A campaign end to end on CPU: the reference launcher, a random tiny pair, a server killed mid-cell.

Three server starts of a tiny model: about 20 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from specdeploy.bench.results import INCOMPLETE_FILE, RunDirectory
from specdeploy.campaign.runner import DeployControl, run_campaign
from specdeploy.campaign.spec import load_campaign
from specdeploy.deploy.deployment import deployment_status, load_deployment
from specdeploy.deploy.leases import LEASES_ENV
from specdeploy.report.commands import write_report
from specdeploy.zoo.random_pair import write_random_pair


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


RECIPE = """
name = "random-pair"
description = "random tiny Qwen3 pair for tests"
engine = "reference"
default_context_length = 512
default_max_running_requests = 2

[target]
path = "{target}"
architecture = "Qwen3ForCausalLM"
parameters = 1_000_000
disk_bytes = 4_000_000
layers = 2
hidden = 64
kv_heads = 2
kv_bytes_per_token = 1_024
quantization = "bf16"
attention = "gqa"
context_length = 512

[dflash]
path = "{draft}"
architecture = "DFlashDraftModel"
parameters = 500_000
disk_bytes = 2_000_000
layers = 1
hidden = 64
kv_heads = 2
kv_bytes_per_token = 512
quantization = "bf16"
block_size = 8
trained_for = "{target}"
"""

CAMPAIGN = """
name = "random-pair-cpu"
recipe = "random-pair.toml"
hardware = "cpu"
launcher = "reference"
modes = ["ar", "ddtree"]
ddtree_budgets = [4]
concurrency = [1, 2]
datasets = ["custom"]
data_dir = "prompts.jsonl"
max_new_tokens = 8
port = {port}
health_timeout_s = 180
smoke = false

[bench]
warmup = 0
"""


def test_campaign_with_the_reference_launcher_survives_a_killed_server(tmp_path: Path) -> None:

    target, draft = write_random_pair(tmp_path / "pair", block_size=8)
    (tmp_path / "random-pair.toml").write_text(RECIPE.format(target=target, draft=draft))
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ("Hello there", "Write a poem", "1+1="))
    )
    campaign_file = tmp_path / "campaign.toml"
    campaign_file.write_text(CAMPAIGN.format(port=free_port()))
    spec = load_campaign(campaign_file)
    out = tmp_path / "campaign"
    killed: list[int] = []

    def kill_tree_server_in_c2(cell: str, done: int, planned: int | None) -> None:
        if cell == "target/custom/ddtree/b4/c2/rep0" and not killed:
            record = json.loads((out / "servers/tp1-ddtree-b4/start-1/deployment.json").read_text())
            killed.append(record["launcher"]["process"]["pid"])
            os.killpg(killed[0], signal.SIGKILL)

    control = DeployControl(
        "reference", spec.health_timeout_s, spec.smoke, out / "servers", Console(stderr=True)
    )
    state = run_campaign(spec, out, control, log=lambda _: None, progress=kill_tree_server_in_c2)

    assert killed
    tree = state.servers["tp1-ddtree-b4"]
    assert tree.status == "complete" and [s.outcome for s in tree.starts] == ["died", "stopped"]
    assert [d.cell for d in tree.deaths] == ["target/custom/ddtree/b4/c2/rep0"]
    assert [s.outcome for s in state.servers["tp1-ar"].starts] == ["stopped"]
    run = RunDirectory(out / "runs/tp1-ddtree-b4/custom")
    assert run.read_manifest().deployment["plan"]["budget"] == 4
    summary = run.read_summary()
    assert sorted(summary.cells) == ["target/custom/ddtree/b4/c1/rep0", "target/custom/ddtree/b4/c2/rep0"]
    for cell in summary.cells.values():
        assert cell.metrics.n_errors == 0 and cell.metrics.tau.mean >= 1.0
        # Tree verification keeps greedy outputs identical to the AR server's.
        assert cell.comparison.n_compared == 3 and cell.comparison.output_match_rate == 1.0
    assert len(run.read_records()) == 6  # the killed attempt's records are only in incomplete.jsonl
    assert (run.path / INCOMPLETE_FILE).read_text().count("ddtree/b4/c2") >= 1

    _, rows = write_report([out], tmp_path / "report.html")
    assert [(r.mode_label, r.concurrency) for r in rows] == [
        ("ar", 1),
        ("ar", 2),
        ("ddtree b4", 1),
        ("ddtree b4", 2),
    ]
    assert all(r.speedup is not None for r in rows if r.mode == "ddtree")


def campaign_with_a_healthy_ar_server(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, int, Path]:
    """A campaign subprocess (long enough to be caught mid-run), once its AR server answers: (process, the
    server's deployment directory, its port, the campaign file). Its leases go under tmp_path."""
    target, draft = write_random_pair(tmp_path / "pair", block_size=8)
    (tmp_path / "random-pair.toml").write_text(RECIPE.format(target=target, draft=draft))
    (tmp_path / "prompts.jsonl").write_text(
        "".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(400))
    )
    port = free_port()
    campaign_file = tmp_path / "campaign.toml"
    campaign_file.write_text(CAMPAIGN.format(port=port).replace("max_new_tokens = 8", "max_new_tokens = 256"))
    out = tmp_path / "campaign"
    command = [sys.executable, "-m", "specdeploy.cli", "campaign", str(campaign_file), "--out", str(out)]
    env = {**os.environ, LEASES_ENV: str(tmp_path / "leases")}
    campaign = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    server_dir = out / "servers/tp1-ar/start-1"
    try:
        deadline = time.monotonic() + 120
        while not (
            (server_dir / "deployment.json").is_file()
            and deployment_status(load_deployment(server_dir))["healthy"]
        ):
            assert campaign.poll() is None and time.monotonic() < deadline, (
                "the AR server never became healthy"
            )
            time.sleep(0.5)
    except BaseException:
        campaign.kill()
        campaign.communicate()
        raise
    return campaign, server_dir, port, campaign_file


def assert_stopped_and_port_free(server_dir: Path, port: int, output: str) -> None:
    """The server is recorded stopped and the port is free for the next campaign's server. The probe binds as
    servers (and preflight) do, with SO_REUSEADDR: a listening server still holds the port against it, while the
    TIME_WAIT of connections the stop cut off mid-request (a SIGTERM's as a kill's) does not."""
    status = deployment_status(load_deployment(server_dir))
    assert not status["alive"] and status["state"] in ("stopped", "failed"), (status, output)
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


def test_a_campaign_stopped_by_sigterm_stops_its_server_and_prints_the_resume_command(tmp_path: Path) -> None:
    """`timeout`, `kill` and batch schedulers send SIGTERM; the server (its own process group) must not
    outlive the campaign and hold the port against the next one."""
    campaign, server_dir, port, campaign_file = campaign_with_a_healthy_ar_server(tmp_path)
    try:
        campaign.send_signal(signal.SIGTERM)
        output, _ = campaign.communicate(timeout=120)
    finally:
        if campaign.poll() is None:
            campaign.kill()
            campaign.communicate()
    assert campaign.returncode == 130, output
    out = tmp_path / "campaign"
    assert f"`specdeploy campaign {campaign_file} --out {out} --resume`" in " ".join(output.split()), output
    assert_stopped_and_port_free(server_dir, port, output)


def wait_until_stopped(server_dir: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    # Stopped and recorded so: the watchdog writes the state once the server's whole group is gone.
    while (status := deployment_status(load_deployment(server_dir)))["alive"] or status["state"] != "stopped":
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_a_campaign_killed_outright_has_its_server_stopped_by_the_watchdog(tmp_path: Path) -> None:
    """SIGKILL runs no handler: the watchdog the campaign started beside itself stops the server."""
    campaign, server_dir, port, _ = campaign_with_a_healthy_ar_server(tmp_path)
    campaign.kill()
    output, _ = campaign.communicate()
    assert wait_until_stopped(server_dir, 60), "the server outlived its killed campaign by a minute"
    assert_stopped_and_port_free(server_dir, port, output)
    # the watchdog drops the lease just after it records the server stopped, never before
    deadline = time.monotonic() + 10
    while list((tmp_path / "leases").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list((tmp_path / "leases").glob("*.json")) == []


def _watchdogs_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"specdeploy.deploy.orphans" in argv and str(pid).encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_the_next_command_stops_a_server_whose_campaign_and_watchdog_were_killed(tmp_path: Path) -> None:
    campaign, server_dir, port, _ = campaign_with_a_healthy_ar_server(tmp_path)
    (watchdog,) = _watchdogs_of(campaign.pid)
    os.kill(watchdog, signal.SIGKILL)
    campaign.kill()
    output, _ = campaign.communicate()
    time.sleep(2)
    assert deployment_status(load_deployment(server_dir))["alive"], "nothing should have stopped it yet"
    env = {**os.environ, LEASES_ENV: str(tmp_path / "leases")}
    # Any command, even one that only prints help.
    done = subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "recipes"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (
        f"stopped a server left running by a killed specdeploy command (pid {campaign.pid}): {server_dir}"
        in (" ".join(done.stderr.split()))
    )
    assert_stopped_and_port_free(server_dir, port, output)
