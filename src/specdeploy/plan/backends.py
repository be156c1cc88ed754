"""Attention backends per GPU architecture and mode, each with the reason it was chosen."""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.errors import SpecdeployError
from specdeploy.plan.engines import DDTREE_PR, DDTREE_TREE_BACKENDS
from specdeploy.plan.launch_plan import Mode, Reason
from specdeploy.recipes.schema import HardwareProfile, Recipe


@dataclass(frozen=True)
class AttentionChoice:
    target: str
    draft: str | None  # the DFlash drafter's backend; None when no DFlash drafter runs
    reasons: list[Reason]


def _architecture_default(recipe: Recipe, hardware: HardwareProfile) -> tuple[str, str, str]:
    """(target backend, DFlash draft backend, why) for this GPU generation."""
    major = hardware.sm_major
    mla = recipe.target.attention == "mla"
    if major == 12:
        return (
            "triton",
            "triton",
            f"{hardware.sm} (RTX PRO 6000 class): SGLang's default and the only backend covering MLA, "
            "GQA and the drafter's non-causal attention here; trtllm/fa3/fa4 kernels target sm_90/sm_100",
        )
    if major == 10:
        target = "trtllm_mla" if mla else "trtllm_mha"
        return (
            target,
            "fa4",
            f"{hardware.sm} (Blackwell datacenter): {target} is SGLang's fastest "
            f"{'MLA' if mla else 'attention'} kernel here; the DFlash drafter attends non-causally within "
            "its block, which trtllm kernels cannot do, so it runs on fa4 as the z-lab model card recommends",
        )
    if major == 9:
        return (
            "fa3",
            "fa3",
            f"{hardware.sm} (Hopper): FlashAttention 3 is SGLang's default for MLA and GQA here",
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
    target, draft, why = _architecture_default(recipe, hardware)
    reasons: list[Reason] = []
    if full_tree:
        if override is not None and override not in DDTREE_TREE_BACKENDS:
            raise SpecdeployError(
                f"DDTree verifies a branching tree, and attention backend {override} cannot express its tree "
                f"mask in SGLang PR #{DDTREE_PR} (only {', '.join(DDTREE_TREE_BACKENDS)} can): drop "
                f"--attention-backend, or use a budget <= {recipe.dflash.block_size - 1} (a chain, like DFlash)"
            )
        target = draft = DDTREE_TREE_BACKENDS[0]
        why = (
            f"DDTree's branching tree needs a tree attention mask; SGLang PR #{DDTREE_PR} supports it on "
            f"the {target} backend only (prefill and decode)"
        )
    elif override is not None:
        target = override
        why = "chosen with --attention-backend"
    reasons.append(Reason(choice=f"--attention-backend {target}", why=why))
    if mode in ("dflash", "ddtree"):
        reasons.append(
            Reason(
                choice=f"--speculative-draft-attention-backend {draft}",
                why="the DFlash drafter's block attends non-causally; "
                + (
                    f"{draft} does that, and it is what the DDTree build picks next to a {target} target"
                    if full_tree
                    else f"{draft} supports that on {hardware.sm}"
                ),
            )
        )
        return AttentionChoice(target=target, draft=draft, reasons=reasons)
    return AttentionChoice(target=target, draft=None, reasons=reasons)
