"""DDTree plans follow what SGLang PR #29907 can run: refusals and warnings by backend and budget.

The expectations below are this test's own record of the PR's facts, transcribed from its code at commit
93e9850e43 (python/sglang/srt/arg_groups/speculative_hook.py, speculative/ddtree_worker.py and
speculative/ddtree_info.py, as the project's domain notes give them), not the planner's data: the planner
must agree with them, and so must the data file it reads.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.plan import make_plan
from specdeploy.plan.ddtree import ddtree_facts

PR_COMMIT = "93e9850e430035f8a363fd881a6a0c5436b95108"
# full-tree mode: triton for prefill and decode, resolved page size 1
TREE_BACKENDS = {"triton"}
# MLA backends that resolve their own page size before the PR's check: they fail even with --page-size 1
SNAPS_PAGE_SIZE = {"trtllm_mla": 64, "flashmla": 64, "cutedsl": 64, "cutlass_mla": 128}
# backends whose verify path takes chains only
CHAIN_ONLY = {"fa3", "flashinfer"}
OTHER_BACKENDS = {"fa4", "trtllm_mha"}
KIMI_BLOCK = 8  # z-lab/Kimi-K2.6-DFlash
TREE_CELL_BYTES = 8 + 1  # int64 KV index + uint8 mask per (node, request, context position)


def flag(plan, name):
    return plan.argv[plan.argv.index(name) + 1] if name in plan.argv else None


def expected(backend: str, budget: int) -> str:
    """What the PR does with this backend and budget: "chain", "tree", or why it refuses."""
    if budget <= KIMI_BLOCK - 1:
        return "chain"
    if backend in TREE_BACKENDS:
        return "tree"
    if backend in SNAPS_PAGE_SIZE:
        return f"sets its own page size ({SNAPS_PAGE_SIZE[backend]})"
    if backend in CHAIN_ONLY:
        return "verifies chains only"
    return "no tree-mask path"


BACKENDS = sorted(TREE_BACKENDS | set(SNAPS_PAGE_SIZE) | CHAIN_ONLY | OTHER_BACKENDS)
BUDGETS = [1, KIMI_BLOCK - 1, KIMI_BLOCK, 32]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_refusal_and_warning_matrix(backend: str, budget: int) -> None:
    outcome = expected(backend, budget)
    args = ("kimi-k2.6", "b200-x8", "ddtree")
    if outcome not in ("chain", "tree"):
        with pytest.raises(SpecdeployError) as refused:
            make_plan(*args, budget=budget, attention_backend=backend)
        message = str(refused.value)
        assert outcome in message and PR_COMMIT[:10] in message
        # the alternative: let the plan pick triton, or run DFlash
        assert "drop --attention-backend" in message and "triton" in message and "--mode dflash" in message
        return
    plan = make_plan(*args, budget=budget, attention_backend=backend)
    spine = [w for w in plan.warnings if "spine" in w]
    if outcome == "chain":
        assert flag(plan, "--attention-backend") == backend and "--page-size" not in plan.argv
        assert len(spine) == 1 and "--mode dflash" in spine[0] and plan.memory.tree_buffers_per_gpu == 0
    else:
        assert flag(plan, "--attention-backend") == "triton" and flag(plan, "--page-size") == "1"
        assert flag(plan, "--speculative-draft-attention-backend") == "triton" and not spine


def test_full_tree_without_a_forced_backend_moves_to_triton() -> None:
    plan = make_plan("kimi-k2.6", "b200-x8", "ddtree", budget=32)  # trtllm_mla is the sm_100 default
    assert flag(plan, "--attention-backend") == "triton" and flag(plan, "--page-size") == "1"


def test_the_data_file_records_the_same_facts() -> None:
    facts = ddtree_facts()
    assert facts.commit == PR_COMMIT and facts.pr == 29907
    assert set(facts.full_tree_backends) == TREE_BACKENDS and facts.full_tree_page_size == 1
    assert facts.page_size_snapped == SNAPS_PAGE_SIZE and set(facts.chain_only) == CHAIN_ONLY
    assert facts.tree_buffers.bytes_per_cell == TREE_CELL_BYTES
    assert "mla" not in facts.tested_upstream.attention


def test_triton_tree_buffers_are_counted_in_the_memory_table() -> None:
    context, running = 32768, 32  # the recipe's context; a fixed cap, so that the three plans share it
    tree = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=32, max_running_requests=running).memory
    chain = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=7, max_running_requests=running).memory
    dflash = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash", max_running_requests=running).memory
    assert tree.tree_buffers_per_gpu == (32 + 1) * running * context * TREE_CELL_BYTES
    assert tree.cuda_graph_reserve - dflash.cuda_graph_reserve == tree.tree_buffers_per_gpu
    assert chain.tree_buffers_per_gpu == 0 and chain.cuda_graph_reserve == dflash.cuda_graph_reserve
    longer = make_plan(
        "kimi-k2.6",
        "rtx-pro-6000-x8",
        "ddtree",
        budget=32,
        context_length=65536,
        max_running_requests=running,
    ).memory
    assert longer.tree_buffers_per_gpu == 2 * tree.tree_buffers_per_gpu  # linear in the context
    big = make_plan("kimi-k2.6", "b200-x8", "ddtree", budget=512, max_running_requests=64)
    assert big.memory.tree_buffers_per_gpu == 513 * 64 * context * TREE_CELL_BYTES > 9 * 2**30
    assert make_plan("tiny-code", "cpu", "ddtree", budget=32).memory.tree_buffers_per_gpu == 0


def test_mla_targets_are_marked_untested_upstream() -> None:
    kimi = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "ddtree", budget=32)
    assert any("MLA" in w and "never tested" in w and "smoke test" in w for w in kimi.warnings)
    qwen = make_plan("qwen3-8b", "h200-x1", "ddtree", budget=32)
    assert not any("never tested" in w for w in qwen.warnings)
    assert not any("never tested" in w for w in make_plan("kimi-k2.6", "b200-x8", "dflash").warnings)


def test_refusal_on_the_command_line_is_one_line_and_exit_2() -> None:
    command = [sys.executable, "-m", "specdeploy.cli", "plan", "kimi-k2.6", "--hardware", "b200-x8"]
    command += ["--mode", "ddtree", "--budget", "32", "--attention-backend", "trtllm_mla"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert (
        line.startswith("error: DDTree with a branching tree cannot run")
        and "sets its own page size (64)" in line
    )
