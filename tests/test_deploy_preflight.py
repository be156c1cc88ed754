import json
import socket
import subprocess
import threading
from collections import namedtuple
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from deploy_helpers import GB, KIMI_MODELS, make_plan, recorded_nvidia_smi
from huggingface_hub import HfApi, constants

from specdeploy.deploy.hardware import detect_with_nvidia_smi
from specdeploy.deploy.preflight import (
    Status,
    check_disk,
    check_docker,
    check_gpus_idle,
    check_hf_token,
    check_local_sglang,
    check_port,
    check_repo_access,
    run_preflight,
)
from specdeploy.deploy.sglang_check import SglangVerdict
from specdeploy.errors import SpecdeployError
from specdeploy.plan.launch_plan import ModelRef

Usage = namedtuple("Usage", "total used free")


class FakeHub(BaseHTTPRequestHandler):
    """The Hub's model-info and auth-check routes, answering like huggingface.co does for each case."""

    def do_GET(self):
        path = self.path.split("?")[0]
        if path.startswith("/api/models/bad/token"):
            return self._error(401, message="Invalid credentials in Authorization header")
        if path.startswith("/api/models/wrong/repo"):
            return self._error(404, code="RepoNotFound")
        if "/revision/missing" in path:
            return self._error(404, code="RevisionNotFound")
        if path == "/api/models/z-lab/no-access/auth-check":
            return self._error(
                403, code="GatedRepo", message="Access to model z-lab/no-access is restricted."
            )
        repo = path.removeprefix("/api/models/").split("/revision/")[0].removesuffix("/auth-check")
        body = json.dumps(
            {"id": repo, "sha": "0" * 40, "gated": "manual" if repo.startswith("z-lab") else False}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def _error(self, status, code=None, message=None):
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps({"error": message or code}).encode())

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub_api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield HfApi(endpoint=f"http://127.0.0.1:{server.server_port}", token="hf_fake")
    server.shutdown()


def model(path, revision=None, gated=False):
    return ModelRef(role="drafter", path=path, revision=revision, gated=gated, disk_bytes=GB)


def test_repo_access_ok(hub_api):
    result = check_repo_access(model("moonshotai/Kimi-K2.6", revision="abc123"), hub_api)
    assert result.status is Status.OK and "abc123" in result.message


def test_gated_repo_with_access(hub_api):
    assert check_repo_access(model("z-lab/Kimi-K2.6-DFlash", gated=True), hub_api).status is Status.OK


def test_401_bad_token(hub_api):
    result = check_repo_access(model("bad/token"), hub_api)
    assert result.status is Status.FAIL
    assert "401" in result.message and "HF_TOKEN" in result.message


def test_403_gated_repo_shows_request_page(hub_api):
    result = check_repo_access(model("z-lab/no-access", gated=True), hub_api)
    assert result.status is Status.FAIL
    assert "403" in result.message and "https://huggingface.co/z-lab/no-access" in result.message


def test_404_wrong_repo(hub_api):
    result = check_repo_access(model("wrong/repo"), hub_api)
    assert result.status is Status.FAIL and "404" in result.message and "wrong/repo" in result.message


def test_404_wrong_revision(hub_api):
    result = check_repo_access(model("moonshotai/Kimi-K2.6", revision="missing"), hub_api)
    assert result.status is Status.FAIL and "revision missing" in result.message


def test_unreachable_hub_warns():
    api = HfApi(endpoint="http://127.0.0.1:9", token="hf_fake")  # discard port: nothing listens
    result = check_repo_access(model("moonshotai/Kimi-K2.6"), api)
    assert result.status is Status.WARN and "not verified" in result.message


def test_full_disk(tmp_path):
    result = check_disk(KIMI_MODELS, tmp_path, disk_usage=lambda _: Usage(2000 * GB, 1990 * GB, 10 * GB))
    assert result.status is Status.FAIL
    assert (
        "602.0 GB" in result.message and "10.0 GB free" in result.message and "HF_HUB_CACHE" in result.message
    )


def test_weights_already_in_the_cache_need_no_room(tmp_path):
    blobs = tmp_path / "models--z-lab--Kimi-K2.6-DFlash" / "blobs"
    blobs.mkdir(parents=True)

    def blob(name, size):
        with (blobs / name).open("wb") as f:
            f.truncate(size)  # sparse: the size without the disk use

    blob("finished", 1 * GB)
    blob("half.incomplete", 1 * GB)  # an interrupted file is fetched again: it does not count
    drafter = KIMI_MODELS[1].model_copy(update={"disk_bytes": 3 * GB})
    tight = check_disk([drafter], tmp_path, disk_usage=lambda _: Usage(0, 0, 1.5 * GB))
    assert tight.status is Status.FAIL and "need 2.0 GB more (of 3.0 GB), only 1.5 GB free" in tight.message
    assert check_disk([drafter], tmp_path, disk_usage=lambda _: Usage(0, 0, 2.5 * GB)).status is Status.OK
    blob("rest", 2 * GB)
    done = check_disk([drafter], tmp_path, disk_usage=lambda _: Usage(0, 0, 0))
    assert done.status is Status.OK and "all 3.0 GB of weights are in the cache" in done.message


def test_tight_disk_warns_and_cache_dir_may_not_exist_yet(tmp_path):
    seen = []

    def usage(path):
        seen.append(path)
        return Usage(2000 * GB, 1380 * GB, 620 * GB)

    result = check_disk(KIMI_MODELS, tmp_path / "hf" / "hub", disk_usage=usage)
    assert result.status is Status.WARN and seen == [tmp_path]


def test_local_and_zoo_models_need_no_disk(tmp_path):
    models = [model(str(tmp_path)), model("zoo:tiny-qwen3")]
    assert check_disk(models, tmp_path, disk_usage=lambda _: Usage(0, 0, 0)).status is Status.OK


@pytest.fixture
def no_token(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    return tmp_path / "token"


def test_gated_repo_without_token(no_token):
    result = check_hf_token(KIMI_MODELS)
    assert result.status is Status.FAIL and "z-lab/Kimi-K2.6-DFlash" in result.message


def test_token_from_file(no_token):
    no_token.write_text("hf_from_file\n")
    assert check_hf_token(KIMI_MODELS).status is Status.OK


def test_token_from_env(no_token, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_env")
    assert check_hf_token(KIMI_MODELS).status is Status.OK


@pytest.mark.parametrize(
    ("runtimes", "status"),
    [
        ('{"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}', Status.OK),
        ('{"runc": {}}', Status.FAIL),
    ],
)
def test_docker_runtime(runtimes, status):
    result = check_docker(lambda argv: runtimes)
    assert result.status is status
    if status is Status.FAIL:
        assert "nvidia-ctk" in result.message


def test_docker_missing():
    def run(argv):
        raise FileNotFoundError("docker")

    assert "not installed" in check_docker(run).message


def test_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = check_port("127.0.0.1", port)
    assert result.status is Status.FAIL and "--port" in result.message


def statuses(report):
    return {check.name: check.status for check in report.checks}


def machine(name, memory_used="memory-used"):
    """Commands on a recorded machine: nvidia-smi as recorded, docker with the NVIDIA runtime, SGLang 0.5.23."""
    nvidia_smi = recorded_nvidia_smi(name, memory_used)

    def run(argv):
        if argv[0] == "nvidia-smi":
            return nvidia_smi(argv)
        return '{"nvidia": {}, "runc": {}}' if argv[0] == "docker" else "0.5.23\n"

    return run


def test_plan_matches_recorded_machine(hub_api, no_token, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_TOKEN", "hf_env")
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi("rtx-pro-6000-x8"))
    report = run_preflight(
        make_plan("rtx-pro-6000-x8"),
        hardware,
        "docker",
        api=hub_api,
        cache_dir=tmp_path,
        disk_usage=lambda _: Usage(4000 * GB, 0, 4000 * GB),
        run=machine("rtx-pro-6000-x8"),
    )
    assert not report.failures, report.failures
    assert set(statuses(report)) == {
        "driver",
        "gpu count",
        "architecture",
        "gpu memory",
        "interconnect",
        "gpus idle",
        "disk",
        "hf token",
        "access moonshotai/Kimi-K2.6",
        "access z-lab/Kimi-K2.6-DFlash",
        "docker",
        "port",
    }


def test_pcie_plan_on_nvlink_b200():
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi("b200-x8"))
    report = run_preflight(make_plan("rtx-pro-6000-x8", models=[]), hardware, "local", run=machine("b200-x8"))
    result = statuses(report)
    assert result["architecture"] is Status.FAIL and result["interconnect"] is Status.WARN
    assert result["gpu count"] is Status.OK and result["gpu memory"] is Status.OK
    with pytest.raises(SpecdeployError, match="compute capability 12.0"):
        report.raise_on_failure()


def test_nvlink_plan_on_one_h200():
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi("h200-x1"))
    result = statuses(
        run_preflight(make_plan("h200-x8", models=[]), hardware, "local", run=machine("h200-x1"))
    )
    assert result["gpu count"] is Status.FAIL and result["architecture"] is Status.OK


def test_gpu_plan_on_machine_without_driver():
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi("no-gpu"))
    report = run_preflight(make_plan("b200-x8", models=[]), hardware, "local", run=machine("no-gpu"))
    assert [c.name for c in report.failures] == ["driver"]
    assert "--launcher reference" in report.failures[0].message


def test_cpu_plan_skips_gpu_checks():
    report = run_preflight(make_plan("cpu", models=[]), None, "reference")
    assert list(statuses(report)) == ["port"]


def answers(text=None, error=None):
    def run(argv):
        if error:
            raise error
        return text

    return run


@pytest.mark.parametrize(
    ("run", "status", "words"),
    [
        (answers("0.5.23\n"), Status.OK, "SGLang 0.5.23"),
        (answers("0.5.16\n"), Status.WARN, "has 0.5.16"),
        (
            answers(error=subprocess.CalledProcessError(1, "python")),
            Status.FAIL,
            "pip install 'sglang==0.5.23'",
        ),
        (answers(error=FileNotFoundError("python")), Status.FAIL, "not on PATH"),
    ],
)
def test_local_sglang_install(run, status, words):
    result = check_local_sglang(make_plan(), run)
    assert result.status is status and words in result.message


def test_local_sglang_is_checked_only_for_the_local_launcher():
    plan = make_plan("cpu", models=[])

    def names(launcher):
        return [
            check.name for check in run_preflight(plan, None, launcher, run=answers('{"nvidia": {}}')).checks
        ]

    assert names("local") == ["sglang", "port"] and names("docker") == ["docker", "port"]


def test_gpu_held_by_another_process():
    hardware = detect_with_nvidia_smi(recorded_nvidia_smi("rtx-pro-6000-x8"))
    busy = machine("rtx-pro-6000-x8", "memory-used-busy")
    result = next(
        c
        for c in run_preflight(make_plan(models=[]), hardware, "local", run=busy).checks
        if c.name == "gpus idle"
    )
    assert result.status is Status.FAIL
    assert (
        "GPU 0: 74.7 GB" in result.message
        and "90% free" in result.message
        and "specdeploy status" in result.message
    )
    # Without a static memory fraction (the reference engine), held memory is worth a warning only.
    lenient = make_plan(models=[]).model_copy(
        update={"memory": make_plan().memory.model_copy(update={"mem_fraction_static": None})}
    )
    assert check_gpus_idle(lenient, busy).status is Status.WARN


def checked_by(verdict=None, error=None):
    """A stand-in for SGLang's start-up validation: records the plans it saw, answers as told."""
    seen = []

    def check(plan):
        seen.append(plan)
        if error:
            raise error
        return verdict

    check.seen = seen
    return check


# SGLang's own words for a DFLASH plan with pipeline parallelism (speculative_hook.py, _handle_dflash)
REFUSAL = "ValueError: DFLASH speculative decoding only supports pp_size == 1."


@pytest.mark.parametrize(
    ("check", "status", "words"),
    [
        (checked_by(SglangVerdict(accepted=True, message="max_running_requests 37")), Status.OK, "accepted"),
        (checked_by(SglangVerdict(accepted=False, message=REFUSAL)), Status.FAIL, REFUSAL),
        (checked_by(None), Status.WARN, "skipped: SGLang not importable here"),
        (checked_by(error=SpecdeployError("exit 1: no module torch")), Status.WARN, "no module torch"),
    ],
)
def test_sglang_start_up_check(check, status, words):
    plan = make_plan("cpu", models=[])
    report = run_preflight(plan, None, "local", run=answers("0.5.23\n"), startup_check=check)
    result = {c.name: c for c in report.checks}["sglang start-up"]
    assert check.seen == [plan]
    assert result.status is status and words in result.message


def test_sglang_start_up_check_leaves_reference_plans_alone():
    check = checked_by(None)
    report = run_preflight(
        make_plan("cpu", models=[], engine="reference"), None, "reference", startup_check=check
    )
    assert "sglang start-up" not in statuses(report) and check.seen == []
