"""`specdeploy up tiny-code` -> /generate -> `down`: the plan, the reference launcher and the zoo together."""

import json
from pathlib import Path

import httpx
import pytest
from deploy_helpers import free_port
from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.errors import SpecdeployError

pytestmark = pytest.mark.slow  # starts the reference engine on a trained zoo pair


def test_up_generate_down(tmp_path, monkeypatch):
    from specdeploy.zoo.registry import get_pair  # imported here: it loads transformers

    try:
        get_pair("tiny-code")
    except SpecdeployError:
        pytest.skip("zoo pair tiny-code is not trained (`specdeploy zoo train`)")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    port = free_port()
    up = runner.invoke(app, ["up", "tiny-code", "--hardware", "cpu", "--mode", "dflash", "--port", str(port)])
    try:
        assert up.exit_code == 0, f"{up.output}\n{up.exception}"
        status = json.loads(runner.invoke(app, ["status", "--json"]).output)
        assert status["healthy"] and status["launcher"]["launcher"] == "reference"
        payload = {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 16, "temperature": 0}}
        meta = httpx.post(f"http://127.0.0.1:{port}/generate", json=payload, timeout=120).json()["meta_info"]
        assert meta["completion_tokens"] > 0 and meta["spec_verify_ct"] > 0
        manifest = json.loads((Path(status["run_dir"]) / "manifest.json").read_text())
        assert manifest["plan"]["recipe"] == "tiny-code" and manifest["smoke"]["tau"] is not None
    finally:
        down = runner.invoke(app, ["down"])
    assert down.exit_code == 0 and "stopped" in down.output
