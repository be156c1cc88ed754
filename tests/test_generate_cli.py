"""`specdeploy generate`: JSON output in every mode, and one-line exit-2 errors for bad input."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from specdeploy.cli import main
from specdeploy.engine.loading import load_drafter, save_drafter


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run the real entry point in-process (a subprocess per case costs seconds of imports)."""

    def run(*args: str) -> SimpleNamespace:
        monkeypatch.setattr(sys, "argv", ["specdeploy", *args])
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    return run


def test_generate_json_in_every_mode(random_pair, run_cli):
    target, draft = random_pair
    outputs = {}
    for mode, extra in [
        ("ar", []),
        ("dflash", ["--draft", str(draft)]),
        ("ddtree", ["--draft", str(draft), "--budget", "12"]),
    ]:
        proc = run_cli(
            "generate",
            "--target",
            str(target),
            "--mode",
            mode,
            *extra,
            "--prompt",
            "def add(a, b):",
            "--max-new-tokens",
            "16",
            "--ignore-eos",
            "--json",
        )
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        for key in (
            "mode",
            "budget",
            "token_ids",
            "text",
            "num_steps",
            "accept_lengths",
            "tau",
            "prefill_s",
            "decode_s",
            "output_tokens_per_s",
        ):
            assert key in report
        assert len(report["token_ids"]) == 16 and sum(report["accept_lengths"]) == 15
        outputs[mode] = report["token_ids"]
    assert outputs["ar"] == outputs["dflash"] == outputs["ddtree"]


@pytest.fixture
def wide_drafter(random_pair, tmp_path):
    """The pair's drafter with target_layer_ids beyond the target's depth."""
    drafter = load_drafter(random_pair[1])
    drafter.config["dflash_config"]["target_layer_ids"] = [1, 40]
    save_drafter(drafter, tmp_path / "bad-draft")
    return tmp_path / "bad-draft"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--target", "/does/not/exist", "--prompt", "x"], "does not exist"),
        (["--mode", "ddtree", "--draft", "zoo:none", "--budget", "0", "--prompt", "x"], "at least 1"),
        (["--mode", "dflash", "--prompt", "x"], "--draft"),
        (["--mode", "beam", "--prompt", "x"], "unknown mode"),
        (["--prompt-file", "/does/not/exist.txt"], "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(random_pair, run_cli, args, message):
    if "--target" not in args:
        args = ["--target", str(random_pair[0]), *args]
    proc = run_cli("generate", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], proc.stderr


def test_incompatible_drafter_is_named(random_pair, wide_drafter, run_cli):
    proc = run_cli(
        "generate",
        "--target",
        str(random_pair[0]),
        "--draft",
        str(wide_drafter),
        "--mode",
        "dflash",
        "--prompt",
        "x",
    )
    assert proc.returncode == 2
    assert "target_layer_ids" in proc.stderr or "layer" in proc.stderr, proc.stderr
