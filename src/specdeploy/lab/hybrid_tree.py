"""Lab experiments with the reference engine: questions that are cheap to answer here and dear on a GPU box.

`hybrid_tree_experiment` reproduces what a naive engine does to a hybrid target under DDTree: with the
recurrent state run over the flattened tree in index order ("leaky"), a node absorbs its earlier
siblings, verification logits go wrong, acceptance falls as the tree widens and the output stops being
the target's own greedy output. The exact per-node state keeps both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from specdeploy.engine.decode import Decoder, GenerationResult, SamplingParams
from specdeploy.errors import SpecdeployError

TREE_STATES = ("exact", "leaky")


@dataclass
class LabRow:
    mode: str  # dflash or ddtree
    budget: int | None  # ddtree nodes per step
    tree_state: str  # exact or leaky
    tau: float  # tokens committed per verify step over all prompts, bonus included
    verified_per_step: float  # tokens the target verified per step
    steps: int
    equal_to_ar: int  # prompts whose output is token for token the AR output
    prompts: int

    def as_dict(self) -> dict:
        return asdict(self)


def check_hybrid(target: torch.nn.Module) -> None:
    if not hasattr(target, "use_leaky_tree_states"):
        raise SpecdeployError(
            f"{type(target).__name__} has no recurrent layers, so tree verification is exact by construction: "
            "give a hybrid target (Qwen3NextForCausalLM or Qwen3_5ForCausalLM)"
        )


def summarise(
    mode: str,
    budget: int | None,
    tree_state: str,
    results: list[GenerationResult],
    reference: list[list[int]],
) -> LabRow:
    steps = sum(r.num_steps for r in results)
    return LabRow(
        mode=mode,
        budget=budget,
        tree_state=tree_state,
        tau=sum(sum(r.accept_lengths) for r in results) / steps if steps else 0.0,
        verified_per_step=sum(sum(r.verified_lengths) for r in results) / steps if steps else 0.0,
        steps=steps,
        equal_to_ar=sum(r.token_ids == ref for r, ref in zip(results, reference, strict=True)),
        prompts=len(results),
    )


def hybrid_tree_experiment(
    target: torch.nn.Module,
    drafter: torch.nn.Module,
    prompts: list[list[int]],
    budgets: list[int],
    params: SamplingParams,
) -> list[LabRow]:
    """DFlash (a chain: exact either way) and DDTree per budget, with exact and with leaky recurrent state.

    Greedy decoding only: equality with AR is then a token-for-token check.
    """
    check_hybrid(target)
    if not params.greedy:
        raise SpecdeployError("the experiment compares outputs with AR token for token: use temperature 0")
    if not prompts or not budgets or min(budgets) < 1:
        raise SpecdeployError("give at least one prompt and budgets of at least 1 draft node")
    target.use_leaky_tree_states(False)
    reference = [Decoder(target, mode="ar").generate(p, params).token_ids for p in prompts]
    rows = []
    try:
        for mode, budget in [("dflash", None), *(("ddtree", b) for b in budgets)]:
            for tree_state in TREE_STATES:
                target.use_leaky_tree_states(tree_state == "leaky")
                decoder = Decoder(
                    target, drafter, mode, budget
                )  # a new one: captured graphs keep the old order
                results = [decoder.generate(p, params) for p in prompts]
                rows.append(summarise(mode, budget, tree_state, results, reference))
    finally:
        target.use_leaky_tree_states(False)
    return rows


def random_prompts(count: int, length: int, vocab_size: int, avoid: set[int], seed: int) -> list[list[int]]:
    """Seeded random token prompts, for targets without a tokenizer."""
    generator = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([t for t in range(vocab_size) if t not in avoid])
    picks = torch.randint(0, len(allowed), (count, length), generator=generator)
    return allowed[picks].tolist()
