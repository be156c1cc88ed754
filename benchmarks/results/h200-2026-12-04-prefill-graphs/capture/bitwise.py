"""One-off (bitwise_bd0f446.txt): a graphed runner against an eager one at the same (padded) shapes, in bf16.

    PYTHONPATH=src python benchmarks/results/h200-2026-12-04-prefill-graphs/capture/bitwise.py

For each case: the prefill graph captured at start-up (`capture`) or at first use (inside `prefill`), the
largest difference of the last prompt token's hidden state and of the target cache's committed slots, then
the first of 12 steps whose committed tokens differ (none: []). The recorded output is bd0f446's, whose
`capture` ran outside inference mode (9ba8bde runs it inside).
"""

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, "tests")
from decode_helpers import write_pair  # noqa: E402
from test_gpu_fastpath import PROMPT  # noqa: E402

from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.engine.sampling import SamplingParams, UniformStream  # noqa: E402
from specdeploy.engine.step import StepRunner  # noqa: E402

CASES = [("qwen3", "dflash", None, 0.8), ("deepseek_v3", "ddtree", 6, 0.0), ("qwen3", "ddtree", 6, 0.0)]


def difference(a: StepRunner, b: StepRunner) -> dict[str, float]:
    slots = min(int(a.prefix[0]), int(b.prefix[0])) or len(PROMPT)
    pairs = zip(*([t for group in r.cache.groups for t in group] for r in (a, b)), strict=True)
    return {
        "last": (a.prefill_last.float() - b.prefill_last.float()).abs().max().item(),
        "cache": max(
            (x[:, :, :slots].float() - y[:, :, :slots].float()).abs().max().item() for x, y in pairs
        ),
    }


def compare(family: str, mode: str, budget: int | None, temperature: float) -> None:
    params = SamplingParams(temperature=temperature, max_new_tokens=40, ignore_eos=True, seed=3)
    target_dir, draft_dir = write_pair(Path(tempfile.mkdtemp()), family)
    target = load_target(target_dir, "cuda", torch.bfloat16)
    drafter = load_drafter(draft_dir, "cuda", torch.bfloat16)

    def runner(graphs: bool, at_start_up: bool) -> StepRunner:
        made = StepRunner(target, drafter, mode, budget, rows=1, cuda_graphs=graphs, fixed_shapes=True)
        made.reserve(256)
        if at_start_up:
            made.capture([budget])
        return made

    for name, at_start_up in (("graph_captured_at_reserve", True), ("graph_lazy", False)):
        eager, graphed = runner(False, False), runner(True, at_start_up)
        for r in (eager, graphed):
            uniforms = None if params.greedy else UniformStream(40 + r.block + 2, 3, r.device)
            r.begin(PROMPT, params, uniforms)
            r.prefill(64)
        print(family, mode, temperature, name, "after prefill", difference(eager, graphed), flush=True)
        differing = []
        for i in range(12):
            a, b = eager.step(), graphed.step()
            if a != b:
                differing = [(i, a, b)]
                break
        print(family, mode, temperature, name, "first differing step", differing, "after",
              difference(eager, graphed), flush=True)  # fmt: skip


for case in CASES:
    compare(*case)
