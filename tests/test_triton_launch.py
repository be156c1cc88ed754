"""Every Triton kernel of the engine is launched with `launch_options()` and waits (`dependent_launch()`) before it
reads anything an earlier kernel writes.

With programmatic dependent launch on (the default on sm_90 and later) a kernel starts while the one before it
still runs; it keeps the stream's order only if it waits for that kernel before reading that kernel's outputs. One
kernel launched with the option but without the wait would read inputs not yet written, so this checks every launch
site and every kernel: before its wait a kernel may only compute indices and load weights (`WEIGHTS`: parameters no
kernel writes, and pointers made from them), and stores nothing.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

ENGINE = Path(__file__).resolve().parents[1] / "src" / "specdeploy" / "engine"


# Weight parameters: loaded before the wait, their load overlaps the kernel before (the one-row projection's and the
# router's rows through `_gemv_tile_waiting`, MLA's kv_b_proj halves, one token's shared expert)
WEIGHTS = {"w", "w_ptr", "router_ptr", "up_ptr", "shared13_ptr", "shared2_ptr"}
# helpers that wait once they have loaded from their first arguments (as many as given here, which must then be weights)
WAITING_HELPERS = {"_gemv_tile_waiting": 1, "_two_gemv_tiles_waiting": 2, "_normed_gemv_tile_waiting": 1}


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _scan(statements: list[ast.stmt], weights: set[str]) -> str:
    """ "waited" once a path through `statements` has waited (or ended), "open" while none read or stored anything
    but `weights` yet, "unsafe" once one did before its wait. Assignments from weights add to `weights`."""
    for statement in statements:
        if ast.unparse(statement) == "dependent_launch()" or isinstance(statement, ast.Return):
            return "waited"
        if isinstance(statement, ast.If):
            branches = {_scan(statement.body, weights), _scan(statement.orelse, weights)}
            if "unsafe" in branches:
                return "unsafe"
            if branches == {"waited"}:
                return "waited"
            continue  # a path past the `if` has not waited yet
        for call in _calls(statement):
            name = ast.unparse(call.func)
            if name in WAITING_HELPERS:
                loaded = call.args[: WAITING_HELPERS[name]]
                weighty = len(loaded) == WAITING_HELPERS[name] and all(_names(a) & weights for a in loaded)
                return "waited" if weighty else "unsafe"
            if name.startswith(("tl.store", "tl.atomic")):
                return "unsafe"
            if name == "tl.load":
                pointers = _names(call.args[0])
                if not pointers & weights or any(p.endswith("_ptr") and p not in weights for p in pointers):
                    return "unsafe"
        if isinstance(statement, ast.Assign) and _names(statement.value) & weights:
            weights |= {t.id for t in statement.targets if isinstance(t, ast.Name)}  # a pointer into a weight
    return "open"


def waits_before_reading(statements: list[ast.stmt], weights: set[str]) -> bool:
    """Whether every path through `statements` waits before it loads anything but `weights` (and pointers made
    from them) and before it stores."""
    return _scan(statements, set(weights)) == "waited"


def launches_and_kernels(path: Path) -> tuple[dict[str, bool], dict[str, bool]]:
    """Kernel name -> whether every launch passes **launch_options(); jit function name -> whether it waits before
    it reads what an earlier kernel writes (`waits_before_reading`, after any docstring)."""
    tree = ast.parse(path.read_text())
    launched: dict[str, bool] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            name = ast.unparse(node.func.value)
            passes = any(k.arg is None and ast.unparse(k.value) == "launch_options()" for k in node.keywords)
            launched[name] = launched.get(name, True) and passes
    waits: dict[str, bool] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
            ast.unparse(d) == "triton.jit" for d in node.decorator_list
        ):
            body = node.body[1:] if ast.get_docstring(node) is not None else node.body
            waits[node.name] = waits_before_reading(body, WEIGHTS)
    return launched, waits


def test_every_kernel_launch_waits_for_the_kernel_before_it_under_pdl() -> None:
    modules = sorted(ENGINE.glob("triton_*.py"))
    assert len(modules) >= 5
    seen = 0
    for path in modules:
        launched, waits = launches_and_kernels(path)
        for name, passes in launched.items():
            assert passes, f"{path.name}: a launch of {name} lacks **launch_options()"
            assert waits.get(name), f"{path.name}: {name} may read before it waits (dependent_launch())"
            seen += 1
    assert seen >= 25  # the engine's kernels, not an empty match
    _, helpers = launches_and_kernels(ENGINE / "triton_gemv.py")
    assert all(helpers[name] for name in WAITING_HELPERS)  # each waits, after loading its weights only


def test_the_wait_checker_rejects_reads_and_stores_before_the_wait() -> None:
    # a property of the checker itself, on kernels made for it
    def waits(source: str) -> bool:
        return waits_before_reading(ast.parse(textwrap.dedent(source)).body, WEIGHTS)

    assert waits("i = tl.program_id(0)\nm = tl.load(w_ptr + i)\ndependent_launch()\nv = tl.load(x_ptr + i)")
    assert not waits("i = tl.program_id(0)\nv = tl.load(x_ptr + i)\ndependent_launch()")
    assert not waits("tl.store(out_ptr, 1)\ndependent_launch()")
    assert not waits("m = tl.load(w_ptr + x_ptr)\ndependent_launch()")  # a weight indexed by another input
    assert waits("at = up_ptr + 3\nm = tl.load(at)\ndependent_launch()")
    assert not waits("if a:\n    dependent_launch()\nv = tl.load(x_ptr)")
    assert waits("if a:\n    m = tl.load(up_ptr)\ndependent_launch()\nv = tl.load(x_ptr)")
    assert not waits("if a:\n    m = tl.load(x_ptr)\ndependent_launch()")
    assert waits("if a:\n    dependent_launch()\n    return\ndependent_launch()\nv = tl.load(x_ptr)")
    assert waits("out = _gemv_tile_waiting(w_ptr, k, col, ok, x_ptr, 4, 8)")
    assert not waits("out = _gemv_tile_waiting(x_ptr, k, col, ok, w_ptr, 4, 8)")
    assert waits("g, u = _two_gemv_tiles_waiting(w_ptr, up_ptr + 8, k, col, ok, x_ptr, 4, 8)")
    assert not waits("g, u = _two_gemv_tiles_waiting(w_ptr, x_ptr, k, col, ok, up_ptr, 4, 8)")
    assert not waits("if a:\n    o = _gemv_tile_waiting(w_ptr, k, c, ok, x_ptr, 4, 8)\nv = tl.load(x_ptr)")


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
