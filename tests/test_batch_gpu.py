"""Continuous batching on CUDA in fp32 (TF32 off), CUDA graphs on: every request's greedy output equals its
single-request output, whatever runs beside it (test_batch.py checks the same on a CPU)."""

from __future__ import annotations

import pytest
import torch
from decode_helpers import write_pair
from hybrid_helpers import write_drafter, write_target
from test_batch import LENGTHS, MODES, PROMPTS, run

from specdeploy.engine.batch import BatchEngine
from specdeploy.engine.decode import Decoder, SamplingParams
from specdeploy.engine.loading import load_drafter, load_target

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
    target, drafter = pairs[family]
    for mode, budget in MODES:
        params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in LENGTHS]
        single = [
            Decoder(target, drafter if mode != "ar" else None, mode, budget).generate(p, q).token_ids
            for p, q in zip(PROMPTS, params, strict=True)
        ]
        engine = BatchEngine(target, drafter if mode != "ar" else None, mode, budget, max_running=3,
                             max_context=128, prefill_tokens=4)  # fmt: skip
        schedule = [(i * 2, p, q) for i, (p, q) in enumerate(zip(PROMPTS, params, strict=True))]
        got = run(engine, schedule)
        assert [got["outputs"][i + 1] for i in range(len(PROMPTS))] == single, (mode, budget)
