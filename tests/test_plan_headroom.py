"""The headroom a plan leaves outside SGLang's static pool, against SGLang 0.5.23's own reserve.

The hand-computed figures follow sglang/srt/arg_groups/memory_hook.py:290-328 and reserve_for_graph_mb
(:357-399); test_plan_sglang_check.py holds them against SGLang's own resolution.
"""

from __future__ import annotations

from specdeploy.plan import make_plan
from specdeploy.plan.headroom import prefill_capture_sizes, sglang_reserve

MIB = 1 << 20


def test_kimi_on_rtx_pro_leaves_less_than_sglang_keeps_and_says_so():
    plan = make_plan("kimi-k2.6", "rtx-pro-6000-x8", "dflash")
    # 97,887 MiB per GPU (an 8192-token chunk), TP8, 37 decode graphs, MLA prefill graphs:
    # 8192 x 1.5 + 512 + 8/8 x 1024 + 37 x 2 + 1536 = 15,434 MiB
    assert plan.memory.sglang_reserve == 15_434 * MIB and plan.memory.prefill_chunk_tokens == 8192
    # 0.92 of 97,887 MiB is static; 8% is 7,830.96 MiB, 7.6 GiB
    assert abs(plan.memory.headroom - 7_830.96 * MIB) < MIB
    (warning,) = [w for w in plan.warnings if w.startswith("--mem-fraction-static 0.92 leaves 7.6 GiB")]
    # SGLang's own fraction: round((97,887 - 15,434) / 97,887, 3) = 0.842
    assert (
        "less than the 15.1 GiB SGLang 0.5.23 keeps" in warning and "--mem-fraction-static 0.842" in warning
    )
    assert "decode batch of 37 and its 8192-token prefill chunk" in warning
    reason = next(r.why for r in plan.reasons if r.choice == "--mem-fraction-static 0.92")
    assert "leaves 7.6 GiB outside it" in reason and "would keep 15.1 GiB" in reason


def test_text_target_on_a_large_gpu():
    # Qwen3-8B (GQA) on one H200: 143,771 MiB, TP1, decode batch 64, 58 prefill graph sizes up to 8192
    # (8 of 4-32, 14 of 48-256, 8 of 288-512, 8 of 576-1024, 12 of 1280-4096, 8 of 4608-8192):
    # 12,288 + 512 + 128 + 128 + 58 x 8 = 13,520 MiB
    assert len(prefill_capture_sizes(8192)) == 58
    reserve = sglang_reserve(143_771, tp=1, decode_batch=64, mla=False)
    assert reserve.total == 13_520 and reserve.chunk_tokens == 8192


def test_small_gpu_has_a_smaller_chunk():
    # 40 GiB: a 4096-token chunk (memory_hook.py:118-126); 50 prefill sizes up to 4096
    reserve = sglang_reserve(40 * 1024, tp=2, decode_batch=16, mla=False)
    assert reserve.chunk_tokens == 4096
    assert reserve.total == 4096 * 1.5 + 512 + 256 + 32 + 50 * 8


def test_reference_plans_have_no_sglang_reserve():
    plan = make_plan("tiny-code", "cpu", "dflash")
    assert plan.memory.sglang_reserve == 0
    assert not any("outside the static pool" in w for w in plan.warnings)
