"""The decoding loops: autoregressive, DFlash chains and DDTree trees, sharing one verify-and-accept step.

Every mode is the same loop. A step drafts a tree (empty for `ar`, one path of block_size-1 tokens for
`dflash`, the best `budget` prefixes for `ddtree`), verifies [root + nodes] in one target forward under an
ancestor mask, walks the accepted path, compacts the target cache to that path and hands the accepted
positions' target features to the drafter. Batch size is 1.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from specdeploy.engine.sampling import SamplingParams, next_token, sampling_probs
from specdeploy.engine.tree import DraftTree, accept_path, best_first_tree, chain_tree
from specdeploy.errors import SpecdeployError

MODES = ("ar", "dflash", "ddtree")

__all__ = ["MODES", "Decoder", "GenerationResult", "SamplingParams", "Step"]


@dataclass
class Step:
    """One engine step: the prefill (which yields the first token) or one draft + verify step."""

    token_ids: list[int]  # tokens committed by this step (several under speculation)
    verified_tokens: int  # tokens the target verified in this step (0 for the prefill step)
    finish_reason: str | None  # None until the last step: "stop" (EOS or stop token, included) or "length"


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str
    num_steps: int  # verify steps (the prefill is not one)
    accept_lengths: list[int]  # tokens committed per verify step, bonus token included
    verified_lengths: list[int]  # tokens the target verified per step (1 + tree size)
    prefill_s: float
    decode_s: float
    step_tokens: list[int] = field(default_factory=list)  # tokens of each step, prefill first

    @property
    def tau(self) -> float:
        return sum(self.accept_lengths) / len(self.accept_lengths) if self.accept_lengths else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        total = self.prefill_s + self.decode_s
        return len(self.token_ids) / total if total > 0 else 0.0


class Decoder:
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None = None,
        mode: str = "ar",
        budget: int | None = None,
    ) -> None:
        if mode not in MODES:
            raise SpecdeployError(f"unknown mode {mode!r}: choose one of {', '.join(MODES)}")
        if mode != "ar" and drafter is None:
            raise SpecdeployError(f"mode {mode!r} needs a DFlash drafter (--draft PATH)")
        if mode == "ddtree" and (budget is None or budget < 1):
            raise SpecdeployError(f"ddtree needs a budget of at least 1 draft node, got {budget}")
        self.target, self.mode, self.budget = target, mode, budget
        self.drafter = drafter if mode != "ar" else None
        self.device = next(target.parameters()).device
        self.feature_layers = list(self.drafter.target_layer_ids) if self.drafter is not None else []

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> GenerationResult:
        steps: list[Step] = []
        start = time.perf_counter()
        prefill_end = start
        for step in self.stream(prompt_ids, params):
            if not steps:
                prefill_end = time.perf_counter()
            steps.append(step)
        end = time.perf_counter()
        verify_steps = steps[1:]
        return GenerationResult(
            token_ids=[t for s in steps for t in s.token_ids],
            finish_reason=steps[-1].finish_reason or "length",
            num_steps=len(verify_steps),
            accept_lengths=[len(s.token_ids) for s in verify_steps],
            verified_lengths=[s.verified_tokens for s in verify_steps],
            prefill_s=prefill_end - start,
            decode_s=end - prefill_end,
            step_tokens=[len(s.token_ids) for s in steps],
        )

    @torch.inference_mode()
    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Step]:
        if not prompt_ids:
            raise SpecdeployError("the prompt is empty: give at least one token")
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= set(self.target.config.eos_token_ids)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            if params.seed is None:
                generator.seed()  # a fresh nondeterministic seed, leaving torch's global RNG alone
            else:
                generator.manual_seed(params.seed)
        remaining = params.max_new_tokens

        def commit(tokens: list[int], verified: int) -> Step:
            nonlocal remaining
            for i, token in enumerate(tokens):
                if token in stop_ids:
                    remaining = 0
                    return Step(tokens[: i + 1], verified, "stop")
            tokens = tokens[:remaining]
            remaining -= len(tokens)
            return Step(tokens, verified, "length" if remaining == 0 else None)

        cache = self.target.new_cache()
        ids = torch.tensor([prompt_ids], device=self.device)
        out = self.target(
            ids,
            torch.arange(len(prompt_ids), device=self.device)[None],
            cache,
            hidden_layer_ids=self.feature_layers,
        )
        root = next_token(out.logits[0, -1], params, generator)
        draft_cache = self.drafter.new_cache() if self.drafter is not None else None
        context = out.hidden  # target features of positions not yet in the drafter's cache
        step = commit([root], 0)
        yield step
        while step.finish_reason is None:
            prefix = cache.length
            tree, draft_probs = self._draft(root, prefix, context, draft_cache, params, generator)
            out = self._verify(root, tree, cache)
            logits = out.logits[0]
            if draft_probs is not None:
                path, bonus = accept_chain(tree, draft_probs, logits, params, generator)
            else:
                path, bonus = accept_path(
                    tree, lambda i, logits=logits: next_token(logits[i], params, generator)
                )
            kept = torch.cat([torch.arange(prefix), prefix + torch.tensor(path)])
            cache.keep(kept)  # the tree's accepted path becomes the committed prefix
            if out.hidden is not None:
                context = out.hidden[:, path]
            accepted = [tree.tokens[i - 1] for i in path[1:]]
            root = bonus
            step = commit(accepted + [bonus], tree.size + 1)
            yield step

    def _draft(
        self,
        root: int,
        prefix: int,
        context: torch.Tensor | None,
        draft_cache,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> tuple[DraftTree, torch.Tensor | None]:
        """Draft from one drafter pass over [root, MASK x (B-1)] at positions prefix..prefix+B-1.

        Returns the tree and, for a sampled DFlash chain, the distributions its tokens were drawn from.
        """
        if self.drafter is None:
            return DraftTree(tokens=[], parents=[], depths=[]), None
        drafter = self.drafter
        block = torch.full((1, drafter.block_size), drafter.mask_token_id, device=self.device)
        block[0, 0] = root
        noise = self.target.embed_tokens(block) * getattr(drafter, "input_embedding_scale", 1.0)
        ctx_len = context.shape[1]
        positions = torch.arange(prefix - ctx_len, prefix + drafter.block_size, device=self.device)[None]
        hidden = drafter(noise, context, positions, draft_cache)
        logits = drafter.compute_logits(hidden[:, 1:], self.target.lm_head)[0]
        if self.mode == "ddtree":
            return best_first_tree(torch.log_softmax(logits.float(), dim=-1), self.budget), None
        if params.greedy:
            return chain_tree(torch.argmax(logits, dim=-1).tolist()), None
        # At T > 0 the chain is sampled from the drafter so that rejection sampling can accept it.
        probs = sampling_probs(logits, params)
        return chain_tree(torch.multinomial(probs, 1, generator=generator)[:, 0].tolist()), probs

    def _verify(self, root: int, tree: DraftTree, cache):
        """One target forward over [root + nodes]: each sees the committed prefix and its own ancestors."""
        prefix = cache.length
        ids = torch.tensor([[root, *tree.tokens]], device=self.device)
        positions = prefix + torch.tensor([[0, *tree.depths]], device=self.device)
        visible_prefix = torch.ones(tree.size + 1, prefix, dtype=torch.bool, device=self.device)
        mask = torch.cat([visible_prefix, tree.ancestor_mask(self.device)], dim=1)[None]
        return self.target(ids, positions, cache, mask, hidden_layer_ids=self.feature_layers)


def accept_chain(
    tree: DraftTree,
    draft_probs: torch.Tensor,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> tuple[list[int], int]:
    """Speculative rejection sampling along a sampled chain: lossless, and accepts more than matching samples.

    Draft token d at depth i (drawn from q_i) is kept with probability min(1, p_i(d) / q_i(d)); the first
    rejection draws the bonus from the residual max(p_i - q_i, 0), and a fully accepted chain draws it from
    the target's distribution after the last node.
    """
    path = [0]
    for node, token in enumerate(tree.tokens, start=1):
        p = sampling_probs(logits[node - 1], params)
        q = draft_probs[node - 1]
        u = torch.rand((), generator=generator, device=p.device)
        if u * q[token] <= p[token]:
            path.append(node)
            continue
        residual = (p - q).clamp(min=0)
        total = residual.sum()
        # p == q on the support up to rounding: the residual vanishes, and sampling p itself is exact.
        residual = residual / total if total > 0 else p
        return path, int(torch.multinomial(residual, 1, generator=generator))
    return path, int(
        torch.multinomial(sampling_probs(logits[len(tree.tokens)], params), 1, generator=generator)
    )
