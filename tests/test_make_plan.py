"""make_plan: hardware-specific choices with reasons, memory arithmetic, and the combinations it refuses."""

from __future__ import annotations

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.plan import make_plan
from specdeploy.plan.engines import DDTREE_COMMIT, SGLANG_IMAGE
from specdeploy.plan.launch_plan import SGLANG_LAUNCH
from specdeploy.recipes import load_hardware, load_recipe


def flag(plan, name: str) -> str | None:
    args = plan.argv
    return args[args.index(name) + 1] if name in args else None


def reason_for(plan, prefix: str) -> str:
    return next(reason.why for reason in plan.reasons if reason.choice.startswith(prefix))


def test_kimi_on_rtx_pro_6000_uses_triton_pcie_allreduce_and_explicit_limits():
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")
    assert plan.argv[:3] == list(SGLANG_LAUNCH)
    assert flag(plan, "--tp-size") == "8"
    assert flag(plan, "--attention-backend") == "triton"
    assert flag(plan, "--speculative-draft-attention-backend") == "triton"
    assert "sm_120" in reason_for(plan, "--attention-backend")
    assert plan.env == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert "custom all-reduce" in reason_for(plan, "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")
    # the KV pool at the recipe's working context of 8192 tokens decides, and the graphs capture as many
    running = int(flag(plan, "--max-running-requests"))
    assert running == plan.memory.kv_tokens_fit // 8192
    assert "48" in reason_for(plan, "--max-running-requests")
    assert flag(plan, "--cuda-graph-max-bs-decode") == str(running)
    assert flag(plan, "--speculative-num-draft-tokens") == "8"
    assert flag(plan, "--speculative-draft-window-size") == "4096"
    assert flag(plan, "--reasoning-parser") == flag(plan, "--tool-call-parser") == "kimi_k2"
    assert "--trust-remote-code" in plan.argv
    assert plan.engine.image == SGLANG_IMAGE and "latest" not in SGLANG_IMAGE


def test_kimi_on_b200_uses_trtllm_mla_with_an_fa4_drafter_and_no_pcie_env():
    plan = make_plan("kimi-k2.6", "b200-x8", "dflash")
    assert flag(plan, "--attention-backend") == "trtllm_mla"
    assert flag(plan, "--speculative-draft-attention-backend") == "fa4"
    assert "non-causal" in reason_for(plan, "--speculative-draft-attention-backend")
    assert plan.env == {}


def test_hopper_uses_fa3():
    plan = make_plan("qwen3-8b", "h200-x1", "dflash")
    assert flag(plan, "--attention-backend") == flag(plan, "--speculative-draft-attention-backend") == "fa3"
    assert flag(plan, "--speculative-num-draft-tokens") == "16"


def test_small_model_runs_at_tp1_large_model_over_the_whole_box():
    assert make_plan("qwen3-8b", "h200-x8", "ar").tp == 1
    assert make_plan("kimi-k2.6", "h200-x8", "ar").tp == 8


def test_warnings_name_unpinned_revisions_and_the_gated_drafter():
    warnings = " ".join(make_plan("kimi-k2.6", "b200-x8", "dflash").warnings)
    assert "moonshotai/Kimi-K2.6 has no pinned revision" in warnings
    assert "z-lab/Kimi-K2.6-DFlash has no pinned revision" in warnings
    assert "gated" in warnings and "HF_TOKEN" in warnings


def test_memory_table_adds_up():
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")
    m = plan.memory
    static = int(m.gpu_memory * m.mem_fraction_static)
    assert m.weights_per_gpu + m.drafter_per_gpu + m.recurrent_state_per_gpu + m.kv_budget_per_gpu == static
    assert m.kv_tokens_fit == m.kv_budget_per_gpu // m.kv_bytes_per_token
    # Kimi's MLA latent (70,272 B in bf16, half in the fp8 pool this plan chose) is replicated on every rank;
    # the drafter's 8 KV heads split over TP8.
    assert m.kv_bytes_per_token == 70_272 // 2 + 24_576 // 8
    assert 10e9 < m.kv_budget_per_gpu < 15e9  # the 10-15 GB left per GPU the field reports


def test_hybrid_budgets_recurrent_state_per_running_request():
    few = make_plan("qwen3.6-27b", "h200-x1", "ar", max_running_requests=4).memory
    many = make_plan("qwen3.6-27b", "h200-x1", "ar", max_running_requests=32).memory
    assert many.recurrent_state_per_gpu == 8 * few.recurrent_state_per_gpu > 0


def test_ddtree_pins_the_pr_build_and_forces_triton_for_a_branching_tree():
    plan = make_plan("kimi-k2.6", "b200-x8", "ddtree", budget=32)
    assert flag(plan, "--speculative-algorithm") == "DDTREE"
    assert flag(plan, "--speculative-ddtree-budget") == "32"
    assert flag(plan, "--page-size") == "1"
    assert flag(plan, "--attention-backend") == "triton"
    assert "--speculative-draft-window-size" not in plan.argv
    assert DDTREE_COMMIT in plan.engine.source and plan.engine.build.commit == DDTREE_COMMIT
    assert (
        plan.engine.image.startswith("specdeploy/sglang-ddtree:") and plan.engine.build.base == SGLANG_IMAGE
    )
    assert any("unmerged" in warning for warning in plan.warnings)


def test_ddtree_chain_budget_keeps_the_architecture_backend():
    plan = make_plan("kimi-k2.6", "b200-x8", "ddtree")
    assert plan.budget == 7 and flag(plan, "--attention-backend") == "trtllm_mla"
    assert "--page-size" not in plan.argv  # the page-size check guards full trees only


def test_ddtree_on_a_hybrid_warns_about_recurrent_state():
    plan = make_plan("qwen3.6-27b", "rtx-pro-6000-x8", "ddtree", budget=64)
    assert any("recurrent" in warning and "budget 64" in warning for warning in plan.warnings)


def test_eagle3_uses_the_comparison_drafter():
    plan = make_plan("kimi-k2.6", "h200-x8", "eagle3")
    assert flag(plan, "--speculative-algorithm") == "EAGLE3"
    assert flag(plan, "--speculative-draft-model-path") == "lightseekorg/kimi-k2.6-eagle3"
    assert (flag(plan, "--speculative-num-steps"), flag(plan, "--speculative-eagle-topk")) == ("3", "1")


def test_ar_mode_has_no_drafter():
    plan = make_plan("qwen3-8b", "h200-x1", "ar")
    assert "--speculative-algorithm" not in plan.argv and plan.drafter is None


def test_reference_engine_plan_for_a_zoo_pair():
    plan = make_plan("tiny-code", "cpu", "ddtree", budget=8)
    assert plan.argv[:2] == ["specdeploy", "serve"]
    assert plan.engine.name == "reference" and plan.engine.image is None
    assert flag(plan, "--draft") == "zoo:tiny-code-draft" and flag(plan, "--budget") == "8"
    assert plan.memory.mem_fraction_static is None
    assert not any("pinned" in warning for warning in plan.warnings)


def test_overrides_reach_the_argv():
    plan = make_plan(
        "qwen3-8b", "h200-x8", "dflash", tp=2, context_length=8192, max_running_requests=8, port=31000
    )
    assert (flag(plan, "--tp-size"), flag(plan, "--context-length")) == ("2", "8192")
    assert (flag(plan, "--max-running-requests"), flag(plan, "--port"), plan.port) == ("8", "31000", 31000)


def test_multi_node_spans_tp_over_nodes():
    plan = make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=2)
    assert (plan.tp, flag(plan, "--nnodes"), plan.gpus.nnodes) == (16, "2", 2)


def test_accepts_objects_as_well_as_names():
    plan = make_plan(load_recipe("qwen3-8b"), load_hardware("h200-x1"), "ar")
    assert plan.recipe == "qwen3-8b" and plan.hardware == "h200-x1"


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("kimi-k2.6", "h200-x1", "dflash"), {}, r"does not fit on h200-x1 at TP1.*596\.0 GiB.*TP8"),
        (("kimi-k2.6", "h200-x8", "dflash"), {"tp": 4}, r"does not fit on h200-x8 at TP4.*TP8"),
        (("kimi-k2.6", "h100-x8", "ar"), {}, r"does not fit on h100-x8"),
        (("kimi-k2.6", "b200-x8", "ddtree"), {"budget": 32, "attention_backend": "trtllm_mla"}, "page size"),
        (("qwen3-8b", "h200-x1", "ddtree"), {"budget": 0}, "at least 1"),
        (("qwen3-8b", "h200-x1", "dflash"), {"budget": 8}, "takes none"),
        (("qwen3-8b", "h200-x1", "eagle3"), {}, "no EAGLE3 drafter"),
        (("tiny-code", "rtx-pro-6000-x8", "ar"), {}, "--hardware cpu"),
        (("kimi-k2.6", "cpu", "ar"), {}, "pick an SGLang GPU profile"),
        (("kimi-k2.6", "cuda", "ar"), {}, "cuda is a reference-engine profile"),
        (("qwen3-8b", "h200-x1", "medusa"), {}, "unknown mode"),
        (("qwen3-8b", "h200-x1", "ar"), {"context_length": 10**6}, "outside 1..40960"),
        (("qwen3-8b", "h200-x1", "ar"), {"max_running_requests": 0}, "at least 1"),
        (("qwen3-8b", "h200-x1", "ar"), {"tp": 2}, "outside 1..1"),
        (("tiny-code", "cpu", "ar"), {"tp": 2}, "one device"),
        (("tiny-code", "cpu", "ar"), {"nnodes": 2}, "one process"),
        (("kimi-k2.6", "rtx-pro-6000-x8", "dflash"), {"context_length": 200_000}, "fewer than one request"),
    ],
)
def test_impossible_combinations_say_why(args, kwargs, message):
    with pytest.raises(SpecdeployError, match=message):
        make_plan(*args, **kwargs)


def test_drafter_for_another_target_is_refused():
    recipe = load_recipe("qwen3-8b")
    wrong = recipe.model_copy(update={"dflash": load_recipe("kimi-k2.6").dflash})
    with pytest.raises(SpecdeployError, match="trained for moonshotai/Kimi-K2.6.*Qwen/Qwen3-8B"):
        make_plan(wrong, "h200-x1", "dflash")


def test_unknown_architecture_is_refused():
    ampere = load_hardware("h200-x1").model_copy(update={"compute_capability": "8.0", "name": "a100"})
    with pytest.raises(SpecdeployError, match="compute capability 8.0"):
        make_plan("qwen3-8b", ampere, "ar")


def test_bigger_gpus_run_more_requests_each_with_its_reason():
    """The KV pool sizes the cap: per GPU, B300 (288 GB) > B200 (180 GB) > RTX PRO 6000 (96 GB)."""
    plans = [make_plan("kimi-k2.6", hw, "dflash") for hw in ("rtx-pro-6000-x8", "b200-x8", "b300-x8")]
    running = [int(flag(plan, "--max-running-requests")) for plan in plans]
    assert running[0] < running[1] < running[2] <= 256
    for plan, n in zip(plans, running, strict=True):
        why = reason_for(plan, "--max-running-requests")
        assert f"{n} requests" in why and "8192 tokens" in why
        # the working context, not the full one: each request's 8192 tokens fit beside the others'
        assert n * 8192 <= plan.memory.kv_tokens_fit
        assert f"{plan.memory.full_length_requests} at the full --context-length 32768" in why
    assert "capped at 256" in reason_for(plans[2], "--max-running-requests")
    assert "--context-length 32768" in [reason.choice for reason in plans[0].reasons]


def test_an_explicit_cap_is_kept():
    plan = make_plan("kimi-k2.6", "b200-x8", "dflash", max_running_requests=32)
    assert flag(plan, "--max-running-requests") == "32"


def test_each_drafter_carries_only_its_own_notes():
    eagle3 = make_plan("kimi-k2.6", "b200-x8", "eagle3")
    dflash = make_plan("kimi-k2.6", "b200-x8", "dflash")
    assert not any("YaRN" in w or "z-lab/Kimi-K2.6-DFlash only" in w for w in eagle3.warnings)
    assert any("YaRN" in w for w in dflash.warnings)
    assert any("z-lab/Kimi-K2.6-DFlash only with Kimi K2.6" in w for w in dflash.warnings)


def test_two_nodes_carry_the_fabric_and_warn_when_one_node_holds_the_model():
    plan = make_plan("kimi-k2.6", "b200-x8", "dflash", nnodes=2)
    assert plan.env["NCCL_SOCKET_IFNAME"] == plan.env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert plan.env["NCCL_IB_HCA"] == "mlx5" and plan.gpus.rdma_resource == "rdma/rdma_shared_device_a"
    assert any("fits on one b200-x8 node at TP8" in w and "--nnodes 1" in w for w in plan.warnings)
    # on one node there is no fabric to name
    single = make_plan("kimi-k2.6", "b200-x8", "dflash")
    assert "NCCL_SOCKET_IFNAME" not in single.env and single.gpus.rdma_resource is None


def test_fp8_kv_where_the_pool_binds_and_the_backend_reads_it():
    rtx = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")
    b200 = make_plan("kimi-k2.6", "b200-x8", "dflash")
    assert flag(rtx, "--kv-cache-dtype") == "fp8_e4m3" and flag(b200, "--kv-cache-dtype") is None
    # Kimi's MLA latent (61 x 576 values) in one byte each, plus the bf16 drafter's TP8 share (24576 / 8)
    assert rtx.memory.kv_bytes_per_token == 61 * 576 + 24_576 // 8
    assert b200.memory.kv_bytes_per_token == 61 * 576 * 2 + 24_576 // 8
    why = reason_for(rtx, "--kv-cache-dtype")
    assert "in bf16 it holds 19 requests" in why and "decode_attention.py" in why
    # an explicit cap is the user's: no fp8 is chosen behind it
    assert (
        flag(make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash", max_running_requests=8), "--kv-cache-dtype")
        is None
    )


@pytest.mark.parametrize(("recipe", "hardware"), [("kimi-k2.6", "rtx-pro-6000-x8"), ("qwen3-8b", "h200-x1")])
def test_dflash_plans_say_how_they_schedule_and_verify(recipe, hardware):
    """Overlap scheduling and sampled verification are decided and said, though both keep SGLang's default."""
    plan = make_plan(recipe, hardware, "dflash")
    reasons = {r.choice: r.why for r in plan.reasons}
    overlap = reasons["overlap scheduling on (SGLang's default: no --disable-overlap-schedule)"]
    assert "return_hidden_states" in overlap and "--disable-overlap-schedule" not in plan.argv
    sampling = reasons["no --speculative-use-rejection-sampling, no --speculative-use-block-verification"]
    assert load_recipe(recipe).dflash.path in sampling and "EAGLE-family path" in sampling
    assert not {"--speculative-use-rejection-sampling", "--speculative-use-block-verification"} & set(
        plan.argv
    )


@pytest.mark.parametrize("mode", ["ar", "eagle3", "ddtree"])
def test_only_dflash_plans_carry_the_dflash_scheduling_reasons(mode):
    plan = make_plan("kimi-k2.6", "b200-x8", mode, budget=32 if mode == "ddtree" else None)
    assert not any(r.choice.startswith("overlap scheduling") for r in plan.reasons)
