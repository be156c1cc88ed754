"""The step's Triton kernels compile for a Hopper GPU (sm_90), on this CPU, with Triton's ahead-of-time compiler.

The interpreter (test_triton_interpreted.py) runs a kernel's Python, so it cannot see what only the compiler
rejects (a loop-carried variable whose shape changes, say). This compiles each kernel to a cubin with Triton's
own ptxas, for the shapes the engine launches.
"""

from __future__ import annotations

import pytest
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from specdeploy.engine import triton_kernels, triton_step

HOPPER = GPUTarget("cuda", 90, 32)
I64 = "*i64"


def compile_for_hopper(fn, signature: dict[str, str], constants: dict[str, object]) -> None:
    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    kernel = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants), target=HOPPER)
    assert kernel.asm["cubin"], fn.__name__


def test_the_walk_and_the_move_compile() -> None:
    walk = dict.fromkeys(("tokens_ptr", "parents_ptr", "depths_ptr"), I64)
    walk |= {
        "valid_ptr": "*i8",
        "ancestors_ptr": "*i8",
        "target_ptr": I64,
        "path_ptr": I64,
        "length_ptr": I64,
    }
    walk |= {"bonus_ptr": I64, "size": "i32", "path_width": "i32", "path_stride": "i32"}
    for nodes in (16, 512):  # an AR step's root alone; a budget-256 tree
        compile_for_hopper(
            triton_step._walk_kernel, walk, {"NODES": nodes, "BLOCK": min(32, nodes), "PATH": 16}
        )
    move = {"cache_ptr": "*bf16", "path_ptr": I64, "length_ptr": I64, "prefix_ptr": I64, "entry": "i32"}
    move |= {"layer_stride": "i64", "row_stride": "i64", "slot_stride": "i64", "path_width": "i32"}
    compile_for_hopper(triton_step._move_kernel, move, {"PATH": 16, "BLOCK": 256})


@pytest.mark.parametrize("taken_in", [True, False])
def test_the_rows_commit_compiles(taken_in: bool) -> None:
    features = {"features_ptr": "*bf16", "ctx_ptr": "*bf16", "ctx_count_ptr": I64, "path_ptr": I64}
    features |= dict.fromkeys(
        ("path_stride", "features_row", "features_node", "ctx_row", "ctx_slot", "dim", "pending_limit"), "i32"
    )
    compile_for_hopper(triton_step._keep_features_kernel, features, {"TAKEN_IN": taken_in, "BLOCK": 1024})
    rows = dict.fromkeys(
        (
            "path_ptr",
            "length_ptr",
            "bonus_ptr",
            "tokens_ptr",
            "prefix_ptr",
            "root_ptr",
            "out_ptr",
            "ctx_count_ptr",
        ),
        I64,
    )
    rows |= {"size": "i32", "path_width": "i32"}
    for context in (True, False):
        compile_for_hopper(
            triton_step._commit_rows_kernel, rows, {"HAS_CONTEXT": context, "TAKEN_IN": taken_in, "OUT": 32}
        )


def test_the_best_first_tree_compiles_at_budget_64() -> None:
    budget, depths = 64, 15
    pair_parent, _, _ = triton_kernels.tree_constants(budget, budget, depths, torch.device("cpu"))
    signature = {
        "top_logp_ptr": "*fp32",
        "top_token_ptr": I64,
        "pair_parent_ptr": "*i32",
        "pair_rank_ptr": "*i32",
    }
    signature |= {
        "count_ptr": "*i32",
        "cand_score_ptr": "*fp32",
        "cand_parent_ptr": "*i32",
        "cand_token_ptr": I64,
    }
    signature |= {
        "chosen_ptr": "*i32",
        "root_ptr": I64,
        "tokens_ptr": I64,
        "parents_ptr": I64,
        "depths_ptr": I64,
    }
    signature |= {"valid_ptr": "*i8", "num_pairs": "i32"}
    constants = {"DEPTHS": depths, "WIDTH": budget, "K": budget, "KP": budget}
    constants |= {"PAIRS": triton.next_power_of_2(pair_parent.numel()), "CANDIDATES": 1024, "NODES": 128}
    compile_for_hopper(triton_kernels._best_first_tree_kernel, signature, constants)
