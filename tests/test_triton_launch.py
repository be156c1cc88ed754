"""Every Triton kernel of the engine is launched with `launch_options()` and starts with `dependent_launch()`.

With programmatic dependent launch on (the default on sm_90 and later) a kernel starts while the one before it
still runs; it keeps the stream's order only if its first instruction waits for that kernel. One kernel launched
with the option but without the wait would read inputs not yet written, so this checks every launch site and every
kernel.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import torch

ENGINE = Path(__file__).resolve().parents[1] / "src" / "specdeploy" / "engine"


def launches_and_kernels(path: Path) -> tuple[dict[str, bool], dict[str, bool]]:
    """Kernel name -> whether every launch passes **launch_options(); kernel name -> whether its body starts
    with dependent_launch() (after any docstring)."""
    tree = ast.parse(path.read_text())
    launched: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            name = ast.unparse(node.func.value)
            passes = any(k.arg is None and ast.unparse(k.value) == "launch_options()" for k in node.keywords)
            launched[name] = launched.get(name, True) and passes
    starts: dict[str, bool] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
            ast.unparse(d) == "triton.jit" for d in node.decorator_list
        ):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            starts[node.name] = ast.unparse(body[0]) == "dependent_launch()"
    return launched, starts


def test_every_kernel_launch_waits_for_the_kernel_before_it_under_pdl() -> None:
    modules = sorted(ENGINE.glob("triton_*.py"))
    assert len(modules) >= 5
    seen = 0
    for path in modules:
        launched, starts = launches_and_kernels(path)
        for name, passes in launched.items():
            assert passes, f"{path.name}: a launch of {name} lacks **launch_options()"
            assert starts.get(name), f"{path.name}: {name} does not start with dependent_launch()"
            seen += 1
    assert seen >= 25  # the engine's kernels, not an empty match


def test_pdl_is_off_without_a_hopper_gpu_when_asked_off_and_under_the_interpreter() -> None:
    code = "from specdeploy.engine import triton_launch as t; print(bool(t.PDL), t.launch_options())"
    env = {k: v for k, v in os.environ.items() if k not in ("SPECDEPLOY_PDL", "TRITON_INTERPRET")}
    runs = {
        "default": env,
        "off": env | {"SPECDEPLOY_PDL": "0"},
        "asked": env | {"SPECDEPLOY_PDL": "1"},
        "interpreted": env | {"SPECDEPLOY_PDL": "1", "TRITON_INTERPRET": "1"},
    }
    out = {
        label: subprocess.run(
            [sys.executable, "-c", code], env=run_env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for label, run_env in runs.items()
    }
    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
    assert out == {
        "default": "True {'launch_pdl': True}" if hopper else "False {}",
        "off": "False {}",
        "asked": "True {'launch_pdl': True}",
        "interpreted": "False {}",
    }
