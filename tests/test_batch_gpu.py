"""Continuous batching on CUDA in fp32 (TF32 off), CUDA graphs on: every request's greedy output equals its
single-request output, whatever runs beside it (test_batch.py checks the same on a CPU)."""

from __future__ import annotations

import pytest
import torch
from decode_helpers import write_pair
from hybrid_helpers import write_drafter, write_target
from test_batch import (
    assert_batched_greedy_equals_single,
    assert_changing_budgets_keep_greedy_outputs,
    assert_padded_first_chunk_writes_what_its_own_size_writes,
    assert_step_predictions_are_the_trees_own,
)
from test_budget_calibration import assert_a_step_tells_what_each_smaller_budget_commits

from specdeploy.engine.loading import load_drafter, load_target
from specdeploy.engine.runtime import load_tokenizer
from specdeploy.zoo.prompts import DEMO_PROMPTS
from specdeploy.zoo.registry import resolve_pair

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
FAMILIES = ["qwen3", "qwen3_moe", "deepseek_v3", "qwen3_next"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    root = tmp_path_factory.mktemp("batch-gpu")
    made = {family: write_pair(root, family) for family in FAMILIES if family != "qwen3_next"}
    made["qwen3_next"] = (write_target("qwen3_next", root / "hybrid"), write_drafter(root / "hybrid-draft"))
    return {
        family: (load_target(t, "cuda", torch.float32), load_drafter(d, "cuda", torch.float32))
        for family, (t, d) in made.items()
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_outputs_under_batching_on_cuda_equal_single_requests(pairs, family):
    assert_batched_greedy_equals_single(*pairs[family])


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3", "qwen3_next"])
def test_padded_row_buckets_on_cuda_keep_every_output(pairs, family):
    """With graphs the steps pad to row buckets by default: 3 running rows pad to 4, over the row being
    prefilled (see test_batch's CPU twin)."""
    assert_batched_greedy_equals_single(
        *pairs[family], max_running=4, order=[0, 1, 3, 2, 4, 5], arrival_gap=0
    )


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3", "qwen3_next"])
def test_budgets_changing_mid_request_with_ar_steps_on_cuda_keep_greedy_outputs(pairs, family):
    """Each step's budget from a cycle with AR steps in it, every stage a CUDA graph (test_batch's CPU twin)."""
    assert_changing_budgets_keep_greedy_outputs(*pairs[family])


def test_hybrid_rows_with_64_node_trees_on_cuda_equal_single_requests(pairs):
    """The recurrent state along trees of 64 nodes, in graphs, rows joining, leaving and padded."""
    assert_batched_greedy_equals_single(*pairs["qwen3_next"], max_running=4, modes=[("ddtree", 64)])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_captured_padded_first_chunk_writes_what_an_eager_chunk_of_its_own_size_writes(pairs, family):
    """The prefill graph (a 9-token prompt at a bucket of 16, Triton kernels) against the eager prefill."""
    assert_padded_first_chunk_writes_what_its_own_size_writes(*pairs[family])


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_each_predicting_step_on_cuda_reads_back_its_own_trees_prediction(pairs, family):
    """The prediction comes back through pinned memory, copied before the step's tokens (test_batch's twin)."""
    assert_step_predictions_are_the_trees_own(*pairs[family])


def test_a_predicting_step_on_cuda_tells_what_each_smaller_budget_would_have_committed():
    """The node scores from the captured tree stage and the accepted path, read back through pinned memory,
    against steps run at each smaller budget (test_budget_calibration's twin, the shipped tiny-code in fp32)."""
    target_dir, draft_dir = resolve_pair("tiny-code")
    tokenize = load_tokenizer(target_dir)
    assert_a_step_tells_what_each_smaller_budget_commits(
        load_target(target_dir, "cuda", torch.float32),
        load_drafter(draft_dir, "cuda", torch.float32),
        [tokenize(text)["input_ids"] for text in DEMO_PROMPTS[:2]],
    )
