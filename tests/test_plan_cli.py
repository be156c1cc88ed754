"""`specdeploy plan` and `specdeploy recipes` from the command line, `--hardware auto` included."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from specdeploy.cli import app
from specdeploy.deploy import hardware as deploy_hardware
from specdeploy.deploy.hardware import DetectedHardware, GpuInfo

runner = CliRunner()


def test_plan_prints_json():
    result = runner.invoke(
        app, ["plan", "qwen3-8b", "--hardware", "h200-x1", "--mode", "ar", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert (doc["recipe"], doc["hardware"], doc["mode"], doc["tp"]) == ("qwen3-8b", "h200-x1", "ar", 1)


def test_plan_passes_the_overrides():
    args = [
        "plan",
        "tiny-code",
        "--hardware",
        "cpu",
        "--mode",
        "ddtree",
        "--budget",
        "12",
        "--format",
        "json",
    ]
    doc = json.loads(runner.invoke(app, [*args, "--context-length", "1024", "--port", "31234"]).output)
    assert doc["budget"] == 12 and doc["port"] == 31234 and "--budget" in doc["argv"]


def test_impossible_plan_is_one_line_and_exit_2():
    command = [sys.executable, "-m", "specdeploy.cli", "plan", "kimi-k2.6", "--hardware", "h200-x1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: kimi-k2.6 does not fit on h200-x1")


def test_recipes_lists_pairs_and_profiles():
    result = runner.invoke(app, ["recipes"])
    assert result.exit_code == 0
    assert "kimi-k2.6" in result.output and "rtx-pro-6000-x8" in result.output and "eagle3" in result.output


def test_hardware_auto_uses_the_detected_machine(monkeypatch):
    gpu = GpuInfo(name="NVIDIA B200", memory_bytes=183_359 << 20, compute_capability="10.0")
    detected = DetectedHardware(
        gpus=[gpu] * 8, interconnect="nvlink", driver_version="580", source="nvidia-smi"
    )
    monkeypatch.setattr(deploy_hardware, "detect_hardware", lambda: detected)
    result = runner.invoke(app, ["plan", "kimi-k2.6", "--hardware", "auto", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["hardware"] == "b200-x8"
