"""`specdeploy lock` against a fake Hub and registry on loopback and a fake docker; plans from a lock.

The Hub's answers (commits, sizes, sha256 of each file) and the registry's digest are the oracle: the lock
must hold exactly them, and every plan made from the lock must use them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
from fake_hub import FakeHub, FakeRegistry, HubRepo, running_hub, running_registry, sha256
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.errors import SpecdeployError
from specdeploy.plan import make_plan
from specdeploy.plan.engines import DDTREE_COMMIT, SGLANG_IMAGE
from specdeploy.plan.render import RENDERERS
from specdeploy.recipes.lock import read_lock

runner = CliRunner()
GB = 10**9
TARGET_MAIN = "a" * 40
TARGET_NEXT = "b" * 40
DRAFT_MAIN = "c" * 40
EAGLE_MAIN = "d" * 40
IMAGE_DIGEST = "sha256:" + "12" * 32
PIP_REPORT = {
    "version": "1",
    "install": [
        {
            "metadata": {"name": "sgl-kernel", "version": "0.3.9"},
            "download_info": {"url": "https://x/sgl.whl"},
        },
        {
            "metadata": {"name": "flashinfer-python", "version": "0.4.0"},
            "download_info": {"url": "https://x/f.whl"},
        },
        {
            "metadata": {"name": "sglang", "version": "0.5.9"},
            "download_info": {"url": "file:///opt/sglang-ddtree/python"},
        },
    ],
}


def kimi_hub() -> FakeHub:
    weights = {"config.json": (3_000, False), "model-00001-of-00002.safetensors": (300 * GB, True)}
    weights["model-00002-of-00002.safetensors"] = (295 * GB, True)
    moved = {**weights, "model-00002-of-00002.safetensors": (296 * GB, True)}
    return FakeHub(
        repos={
            "moonshotai/Kimi-K2.6": HubRepo(
                commits={TARGET_MAIN: weights, TARGET_NEXT: moved}, branches={"main": TARGET_MAIN}
            ),
            "z-lab/Kimi-K2.6-DFlash": HubRepo(
                commits={
                    DRAFT_MAIN: {"config.json": (900, False), "model.safetensors": (6_960_000_000, True)}
                },
                branches={"main": DRAFT_MAIN},
                gated=True,
            ),
            "lightseekorg/kimi-k2.6-eagle3": HubRepo(
                commits={EAGLE_MAIN: {"model.safetensors": (3 * GB, True)}}, branches={"main": EAGLE_MAIN}
            ),
        }
    )


@pytest.fixture
def services(tmp_path, monkeypatch, fake_docker):
    """Fake Hub (HF_ENDPOINT), registry and docker; the working directory is an empty tmp dir."""
    hub = kimi_hub()
    registry = FakeRegistry(manifests={"lmsysorg/sglang:v0.5.23-cu130": IMAGE_DIGEST})
    state = fake_docker
    (state / "run-output.txt").write_text("0.5.23\n" + json.dumps(PIP_REPORT))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with running_hub(hub) as hub_url, running_registry(registry) as registry_url:
        monkeypatch.setenv("HF_ENDPOINT", hub_url)
        monkeypatch.setenv("SPECDEPLOY_REGISTRY_URL", registry_url)
        yield {"hub": hub, "registry": registry, "registry_url": registry_url, "state": state, "work": work}


def lock(services, *args: str):
    return runner.invoke(app, ["lock", *args])


def kimi_recipe_copy(directory: Path, target_revision: str | None = None) -> Path:
    text = (resources.files("specdeploy.recipes") / "pairs" / "kimi-k2.6.toml").read_text()
    if target_revision is not None:
        text = text.replace(
            'path = "moonshotai/Kimi-K2.6"\n',
            f'path = "moonshotai/Kimi-K2.6"\nrevision = "{target_revision}"\n',
        )
    path = directory / "kimi.toml"
    path.write_text(text)
    return path


def test_lock_holds_what_the_hub_registry_and_image_report(services):
    result = lock(services, "kimi-k2.6")
    assert result.exit_code == 0, result.output
    written = read_lock(services["work"] / "kimi-k2.6.lock.json")
    target = written.model("moonshotai/Kimi-K2.6")
    assert (target.requested, target.revision) == ("main", TARGET_MAIN)
    hub_files = services["hub"].repos["moonshotai/Kimi-K2.6"].siblings(TARGET_MAIN)
    assert [(f.path, f.size, f.sha256) for f in target.files] == [
        (s["rfilename"], s["size"], s["lfs"]["sha256"] if "lfs" in s else None) for s in hub_files
    ]
    assert target.total_bytes == 595 * GB + 3_000
    assert written.model("model-00001-of-00002.safetensors") is None
    assert written.model("z-lab/Kimi-K2.6-DFlash").files[1].sha256 == sha256(
        f"{DRAFT_MAIN}/model.safetensors"
    )
    assert written.model("lightseekorg/kimi-k2.6-eagle3").revision == EAGLE_MAIN
    assert (written.image.reference, written.image.digest) == (SGLANG_IMAGE, IMAGE_DIGEST)
    # the registry challenged first, and the digest came with the token it handed out
    assert services["registry"].requests[:3] == [
        "HEAD /v2/lmsysorg/sglang/manifests/v0.5.23-cu130",
        "GET /token",
        "HEAD /v2/lmsysorg/sglang/manifests/v0.5.23-cu130",
    ]
    assert written.sglang_version == "0.5.23"
    assert written.ddtree.commit == DDTREE_COMMIT
    assert written.ddtree.constraints == [
        "flashinfer-python==0.4.0",
        "sgl-kernel==0.3.9",
    ]  # not the PR itself
    probe = [json.loads(line) for line in (services["state"] / "calls.jsonl").read_text().splitlines()]
    (run,) = [c for c in probe if c[0] == "run"]
    assert f"lmsysorg/sglang:v0.5.23-cu130@{IMAGE_DIGEST}" in run and DDTREE_COMMIT in run[-1]
    assert "pip install --dry-run" in run[-1]


def test_plans_from_a_lock_are_pinned_and_silent_about_pins(services):
    assert lock(services, "kimi-k2.6").exit_code == 0
    written = read_lock(Path("kimi-k2.6.lock.json"))
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=32, lock=written)
    argv = plan.argv
    assert argv[argv.index("--revision") + 1] == TARGET_MAIN
    assert argv[argv.index("--speculative-draft-model-revision") + 1] == DRAFT_MAIN
    assert not any("pinned" in w or "no lock" in w for w in plan.warnings)
    assert [m.revision for m in plan.models] == [TARGET_MAIN, DRAFT_MAIN]
    assert plan.models[0].disk_bytes == written.model("moonshotai/Kimi-K2.6").total_bytes
    assert plan.engine.build.base == f"{SGLANG_IMAGE}@{IMAGE_DIGEST}"
    dockerfile = RENDERERS["dockerfile"](plan)
    assert f"FROM {SGLANG_IMAGE}@{IMAGE_DIGEST}" in dockerfile
    assert (
        "printf '%s\\n' flashinfer-python==0.4.0 sgl-kernel==0.3.9 >" in dockerfile
        and "--constraint" in dockerfile
    )
    release = make_plan("kimi-k2.6", "b200-x8", "dflash", lock=written)
    assert release.engine.image == f"{SGLANG_IMAGE}@{IMAGE_DIGEST}" and release.engine.build is None
    # a different lock (other pins) gives another content-addressed image tag
    moved = written.model_copy(update={"ddtree": written.ddtree.model_copy(update={"constraints": []})})
    assert (
        make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=32, lock=moved).engine.image
        != plan.engine.image
    )


def test_two_plan_runs_from_one_lock_are_byte_identical(services):
    assert lock(services, "kimi-k2.6").exit_code == 0
    base = ["plan", "kimi-k2.6", "--hardware", "rtx-pro-6000-x8", "--mode", "ddtree", "--budget", "32"]
    for fmt in RENDERERS:
        first, second = (runner.invoke(app, [*base, "--format", fmt]) for _ in range(2))
        assert first.exit_code == 0, first.output
        assert first.stdout_bytes == second.stdout_bytes, fmt
        if fmt != "dockerfile":
            assert TARGET_MAIN in first.output
    # in a separate process as well: nothing in a plan depends on the process or the time
    command = [sys.executable, "-m", "specdeploy.cli", *base, "--format", "json"]
    separate = subprocess.run(command, capture_output=True, check=True, timeout=120).stdout
    assert separate == runner.invoke(app, [*base, "--format", "json"]).stdout_bytes


def test_the_hub_moving_does_not_move_a_locked_plan_until_update_lock(services):
    assert lock(services, "kimi-k2.6").exit_code == 0
    services["hub"].repos["moonshotai/Kimi-K2.6"].branches["main"] = TARGET_NEXT
    base = ["plan", "kimi-k2.6", "--hardware", "b200-x8", "--format", "json"]
    doc = json.loads(runner.invoke(app, base).output)
    assert doc["models"][0]["revision"] == TARGET_MAIN
    moved = runner.invoke(app, [*base, "--update-lock"])
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.output)["models"][0]["revision"] == TARGET_NEXT
    assert read_lock(Path("kimi-k2.6.lock.json")).model("moonshotai/Kimi-K2.6").revision == TARGET_NEXT


def test_lock_does_not_silently_replace_a_lock(services):
    assert lock(services, "kimi-k2.6").exit_code == 0
    again = lock(services, "kimi-k2.6")
    assert isinstance(again.exception, SpecdeployError) and "--update-lock" in str(again.exception)
    assert lock(services, "kimi-k2.6", "--update-lock").exit_code == 0


def test_drift_is_refused_with_the_way_out(services, tmp_path):
    recipe = kimi_recipe_copy(services["work"])
    assert lock(services, str(recipe)).exit_code == 0
    assert (services["work"] / "kimi.lock.json").is_file()  # beside the recipe file
    kimi_recipe_copy(services["work"], target_revision=TARGET_NEXT)  # the recipe now pins another commit
    result = runner.invoke(app, ["plan", str(recipe), "--hardware", "b200-x8"])
    message = str(result.exception)
    assert isinstance(result.exception, SpecdeployError)
    assert (
        f"moonshotai/Kimi-K2.6@{TARGET_NEXT}" in message and "@main" in message and "--update-lock" in message
    )
    fixed = runner.invoke(
        app, ["plan", str(recipe), "--hardware", "b200-x8", "--format", "json", "--update-lock"]
    )
    assert fixed.exit_code == 0, fixed.output
    assert json.loads(fixed.output)["models"][0]["revision"] == TARGET_NEXT


def test_drift_of_the_engine_itself(services, monkeypatch):
    assert lock(services, "kimi-k2.6").exit_code == 0
    written = read_lock(Path("kimi-k2.6.lock.json"))
    older = written.model_copy(update={"ddtree": written.ddtree.model_copy(update={"commit": "e" * 40})})
    with pytest.raises(SpecdeployError, match="DDTree build at eeeeeeeeee"):
        make_plan("kimi-k2.6", "b200-x8", "ddtree", budget=32, lock=older)
    make_plan("kimi-k2.6", "b200-x8", "dflash", lock=older)  # the DDTree pins do not matter to DFlash
    other_image = written.model_copy(update={"image": written.image.model_copy(update={"reference": "x:y"})})
    with pytest.raises(SpecdeployError, match="pins x:y"):
        make_plan("kimi-k2.6", "b200-x8", "dflash", lock=other_image)
    with pytest.raises(SpecdeployError, match="made for recipe kimi-k2.6"):
        make_plan("qwen3-8b", "h200-x1", "dflash", lock=written)


def test_an_image_holding_another_sglang_is_refused(services):
    (services["state"] / "run-output.txt").write_text("0.5.24\n" + json.dumps(PIP_REPORT))
    result = lock(services, "kimi-k2.6")
    assert isinstance(result.exception, SpecdeployError) and "holds SGLang 0.5.24" in str(result.exception)
    assert not Path("kimi-k2.6.lock.json").exists()


def test_unknown_repo_and_damaged_lock_say_what_to_do(services):
    services["hub"].repos.pop("z-lab/Kimi-K2.6-DFlash")
    result = lock(services, "kimi-k2.6")
    assert "404" in str(result.exception) and "check the path and revision" in str(result.exception)
    Path("kimi-k2.6.lock.json").write_text("{not json")
    plan = runner.invoke(app, ["plan", "kimi-k2.6", "--hardware", "b200-x8"])
    assert isinstance(plan.exception, SpecdeployError) and "not valid JSON" in str(plan.exception)


def test_zoo_pairs_have_nothing_to_lock(services):
    result = lock(services, "tiny-code")
    assert isinstance(result.exception, SpecdeployError) and "nothing to lock" in str(result.exception)


def test_a_campaign_is_locked_beside_its_file_and_its_plans_use_it(services):
    example = Path(__file__).parents[1] / "examples" / "campaign-kimi-k2.6-rtx-pro-6000.toml"
    campaign = services["work"] / "campaign.toml"
    shutil.copy(example, campaign)
    assert lock(services, str(campaign)).exit_code == 0
    assert read_lock(services["work"] / "campaign.lock.json").recipe == "kimi-k2.6"
    result = runner.invoke(app, ["campaign", str(campaign), "--dry-run"])
    assert result.exit_code == 0, result.output
    from specdeploy.campaign.matrix import server_configs
    from specdeploy.campaign.spec import load_campaign

    plans = [
        s.plan
        for s in server_configs(load_campaign(campaign), read_lock(services["work"] / "campaign.lock.json"))
    ]
    assert plans and all(p.models[0].revision == TARGET_MAIN for p in plans)
    assert all(not any("no pinned revision" in w for w in p.warnings) for p in plans)
