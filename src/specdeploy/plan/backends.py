"""Attention backends per GPU architecture and mode, each with the reason it was chosen."""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.errors import SpecdeployError
from specdeploy.modes import Mode
from specdeploy.plan.ddtree import ddtree_facts
from specdeploy.plan.launch_plan import Reason
from specdeploy.recipes.schema import HardwareProfile, Recipe

NON_CAUSAL = "the DFlash drafter attends non-causally within its block"


@dataclass(frozen=True)
class AttentionChoice:
    target: str
    draft: str | None  # the DFlash drafter's backend; None when no DFlash drafter runs
    reasons: list[Reason]


@dataclass(frozen=True)
class _Backends:
    target: str
    target_why: str
    draft: str
    draft_why: str


def _architecture_default(recipe: Recipe, hardware: HardwareProfile) -> _Backends:
    major = hardware.sm_major
    if major == 12:
        return _Backends(
            target="triton",
            target_why=f"{hardware.sm} (RTX PRO 6000 class): SGLang's default here and the one backend covering "
            "MLA, GQA and hybrid models; the trtllm, fa3 and fa4 kernels target sm_90/sm_100",
            draft="triton",
            draft_why=f"{NON_CAUSAL}; triton does that on {hardware.sm}",
        )
    if major == 10:
        target = "trtllm_mla" if recipe.target.attention == "mla" else "trtllm_mha"
        return _Backends(
            target=target,
            target_why=f"{hardware.sm} (Blackwell datacenter): SGLang's default and fastest "
            f"{'MLA' if target == 'trtllm_mla' else 'attention'} kernel here",
            draft="fa4",
            draft_why=f"{NON_CAUSAL}, which the trtllm kernels cannot do; fa4 can, as z-lab's Kimi drafter card "
            "recommends",
        )
    if major == 9:
        return _Backends(
            target="fa3",
            target_why=f"{hardware.sm} (Hopper): FlashAttention 3 is SGLang's default for MLA and GQA here",
            draft="fa3",
            draft_why=f"{NON_CAUSAL}; fa3 does that on {hardware.sm}",
        )
    raise SpecdeployError(
        f"no attention backend known for compute capability {hardware.compute_capability} "
        f"({hardware.gpu_model}): specdeploy plans for sm_90 (Hopper), sm_100 and sm_120 (Blackwell)"
    )


def choose_attention(
    recipe: Recipe,
    hardware: HardwareProfile,
    mode: Mode,
    full_tree: bool,
    override: str | None = None,
) -> AttentionChoice:
    """`full_tree`: a DDTree budget above block_size - 1, whose verify step needs a tree mask."""
    chosen = _architecture_default(recipe, hardware)
    target, target_why, draft, draft_why = chosen.target, chosen.target_why, chosen.draft, chosen.draft_why
    if full_tree:
        facts = ddtree_facts()
        refusal = facts.full_tree_refusal(override) if override is not None else None
        if refusal is not None:
            chain = recipe.dflash.block_size - 1
            raise SpecdeployError(
                f"DDTree with a branching tree cannot run on this plan: {refusal}; instead drop "
                f"--attention-backend (the plan then uses {facts.full_tree_backends[0]}), or use --mode dflash "
                f"(a budget <= {chain} is only a chain)"
            )
        target = draft = facts.full_tree_backends[0]
        target_why = (
            f"DDTree's branching tree needs a tree attention mask: {facts.source} runs it on the {target} "
            f"backend only, for prefill and decode (page size {facts.full_tree_page_size})"
        )
        draft_why = f"{NON_CAUSAL}; {draft} does that, and the DDTree build pairs it with a {target} target"
    elif override is not None:
        target, target_why = override, "chosen with --attention-backend"
    reasons = [Reason(choice=f"--attention-backend {target}", why=target_why)]
    if mode not in ("dflash", "ddtree"):
        return AttentionChoice(target=target, draft=None, reasons=reasons)
    reasons.append(Reason(choice=f"--speculative-draft-attention-backend {draft}", why=draft_why))
    return AttentionChoice(target=target, draft=draft, reasons=reasons)
