"""Golden JSON plans of the main cases: any change to argv, env, memory or warnings shows up as a diff.

Regenerate after an intended change with SPECDEPLOY_REGENERATE_GOLDEN=1 and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from specdeploy.plan import make_plan
from specdeploy.plan.render import render_plan

GOLDEN = Path(__file__).parent / "golden"
CASES = {
    "kimi-k2.6_rtx-pro-6000-x8_dflash": ("kimi-k2.6", "rtx-pro-6000-x8", "dflash", None),
    "kimi-k2.6_b200-x8_dflash": ("kimi-k2.6", "b200-x8", "dflash", None),
    "kimi-k2.6_rtx-pro-6000-x8_ddtree-32": ("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", 32),
    "qwen3-8b_h200-x1_ar": ("qwen3-8b", "h200-x1", "ar", None),
    "qwen3-8b_h200-x1_dflash": ("qwen3-8b", "h200-x1", "dflash", None),
    "tiny-code_cpu_dflash": ("tiny-code", "cpu", "dflash", None),
}


@pytest.mark.parametrize("name", CASES)
def test_plan_matches_golden(name):
    recipe, hardware, mode, budget = CASES[name]
    rendered = render_plan(make_plan(recipe, hardware, mode, budget=budget), "json")
    path = GOLDEN / f"{name}.json"
    if os.environ.get("SPECDEPLOY_REGENERATE_GOLDEN") == "1":
        path.write_text(rendered)
    assert path.exists(), f"{path.name} missing: run with SPECDEPLOY_REGENERATE_GOLDEN=1"
    assert json.loads(rendered) == json.loads(path.read_text())
