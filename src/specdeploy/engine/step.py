"""One decoding step over static buffers: draft, tree, verify, accept, commit.

Every mode is the same step. The drafter runs once over [root, MASK x (B-1)] (dflash, ddtree); the tree is
empty (ar), the drafter's chain (dflash) or its best `budget` prefixes (ddtree); the target verifies
[root + nodes] in one forward under the ancestor mask; the walk finds the accepted path and the bonus token;
the commit moves the path's cache entries into place and hands its target features to the drafter. Each
stage is fixed-shape device work with no host synchronisation, replayed as a CUDA graph on a GPU (per
attention window size); the host reads the committed tokens once per step.

Targets with recurrent layers read the tree on the host (their exact per-node states need it), so they run
the same stages eagerly, with one more synchronisation to commit the accepted path's state.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specdeploy.engine.cache import StaticCache, round_up
from specdeploy.engine.forward_batch import ForwardBatch, append_batch
from specdeploy.engine.graphs import StageGraphs
from specdeploy.engine.sampling import (
    SamplingParams,
    UniformStream,
    accept_sampled_chain,
    sample,
    sampling_probs,
)
from specdeploy.engine.tree import Acceptance, TreeBatch, best_first_tree, chain_tree, walk

MODES = ("ar", "dflash", "ddtree")
TIMED_STAGES = ("draft", "tree", "verify", "commit")  # accept is timed as part of commit


@dataclass
class StageTimes:
    """Seconds spent per stage over the steps timed, and the wall time of those steps."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMED_STAGES, 0.0))
    wall: float = 0.0
    steps: int = 0

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step for each stage, and `host`: wall time the device spent on no stage."""
        if not self.steps:
            return {**dict.fromkeys(TIMED_STAGES, 0.0), "host": 0.0}
        stages = {name: 1e3 * s / self.steps for name, s in self.seconds.items()}
        host = max(0.0, 1e3 * self.wall / self.steps - sum(stages.values()))
        return {**stages, "host": host}


class StepRunner:
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None,
        mode: str,
        budget: int | None,
        cuda_graphs: bool = True,
    ) -> None:
        self.target, self.drafter, self.mode = target, drafter, mode
        weight = target.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.block = drafter.block_size if drafter is not None else 1
        self.depth_limit = self.block - 1
        self.tree_size = {"ar": 0, "dflash": self.block - 1, "ddtree": budget or 0}[mode]
        self.budget = budget
        self.feature_layers = list(drafter.target_layer_ids) if drafter is not None else []
        self.host_tree = target.has_recurrent_layers
        self.graphs = StageGraphs(cuda_graphs and self.device.type == "cuda" and not self.host_tree)
        self.cache: StaticCache | None = None
        self.draft_cache: StaticCache | None = None
        self.timer: StageTimes | None = None
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.prefix_host = 0
        self.params = SamplingParams()
        self.uniforms: UniformStream | None = None
        self._allocate()

    # ------------------------------------------------------------------------------------------ setup

    def _allocate(self) -> None:
        b, n, depth = 1, self.tree_size, self.depth_limit
        zeros = torch.zeros(b, dtype=torch.long, device=self.device)
        self.prefix, self.root, self.prompt_len = zeros.clone(), zeros.clone(), zeros.clone()
        self.tree = TreeBatch.empty(b, n, self.device)
        self.target_tokens = torch.zeros(b, n + 1, dtype=torch.long, device=self.device)
        self.acceptance = Acceptance(
            path=torch.zeros(b, depth + 1, dtype=torch.long, device=self.device),
            length=zeros.clone(),
            bonus=zeros.clone(),
        )
        self.out = torch.zeros(b, depth + 2, dtype=torch.long, device=self.device)
        self.tree_index = torch.arange(n + 1, device=self.device)
        self.path_index = torch.arange(depth + 1, device=self.device)
        self.verify_logits: torch.Tensor | None = None  # allocated when a request samples
        self.draft_probs: torch.Tensor | None = None
        if self.drafter is not None:
            vocab = self.target.config.vocab_size
            width = len(self.feature_layers) * self.target.config.hidden_size
            self.block_index = torch.arange(self.block, device=self.device)
            self.ctx = torch.zeros(b, self.block, width, dtype=self.dtype, device=self.device)
            self.ctx_count = zeros.clone()
            self.features = torch.zeros(b, n + 1, width, dtype=self.dtype, device=self.device)
            self.draft_logits = torch.zeros(b, depth, vocab, dtype=torch.float32, device=self.device)

    def reserve(self, positions: int) -> None:
        """Make the caches hold `positions` committed positions plus one step's tree and drafter block."""
        needed = positions + max(self.tree_size + 1, self.block) + 1  # +1: the scratch slot
        if self.cache is not None and self.cache.capacity >= needed:
            return
        capacity = round_up(needed, 256 if self.device.type == "cuda" else 64)
        self.cache = self.target.new_cache(1, capacity)
        if self.drafter is not None:
            self.draft_cache = self.drafter.new_cache(1, capacity)
        self.slot_index = torch.arange(capacity, device=self.device)
        self.graphs.clear()  # graphs point at the old buffers

    def window(self, used: int) -> int:
        """Attention window (cache slots) for `used` slots: few distinct sizes on a GPU, one graph each."""
        if self.device.type == "cuda":
            return min(self.cache.capacity, max(256, 1 << (used - 1).bit_length()))
        return min(self.cache.capacity, round_up(used, 64))

    # ----------------------------------------------------------------------------------------- prefill

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], params: SamplingParams, uniforms: UniformStream | None) -> int:
        """Run the prompt through the target (and its features into the drafter); return the first token."""
        self.params, self.uniforms = params, uniforms
        count = len(prompt_ids)
        for cache in (self.cache, self.draft_cache):
            if cache is not None:
                cache.length = 0
                cache.recurrent.clear()
        if not params.greedy and self.verify_logits is None:
            vocab = self.target.config.vocab_size
            self.verify_logits = torch.zeros(
                1, self.tree_size + 1, vocab, dtype=self.dtype, device=self.device
            )
            if self.mode == "dflash":
                self.draft_probs = torch.zeros(1, self.depth_limit, vocab, device=self.device)
        ids = torch.tensor([prompt_ids], device=self.device)
        positions = torch.arange(count, device=self.device)[None]
        batch = append_batch(positions, 0, self.cache.capacity, 1)
        hidden, features = self.target.run(ids, batch, self.cache, self.feature_layers)
        logits = self.target.lm_head(hidden[:, -1])
        if params.greedy:
            first = logits.argmax(dim=-1)
        else:
            first = sample(sampling_probs(logits, params), uniforms["target"][:1])
        if self.drafter is not None:
            self.drafter.write_context(features, positions, positions, self.draft_cache)
            self.ctx_count.zero_()
        self.prefix.fill_(count)
        self.prompt_len.fill_(count)
        self.root.copy_(first)
        self.prefix_host = count
        self.cache.length = count
        return int(first)

    # -------------------------------------------------------------------------------------------- step

    @torch.inference_mode()
    def step(self) -> tuple[list[int], int]:
        """One draft-verify step; returns the committed tokens (accepted, then the bonus) and tokens verified."""
        started = time.perf_counter()
        prefix = self.prefix_host
        greedy = self.params.greedy
        if self.drafter is not None:
            draft_window = self.window(prefix + self.block)
            self._timed("draft", ("draft", draft_window), lambda: self._draft(draft_window))
        self._timed("tree", ("tree", greedy), self._build_tree, eager=not greedy and self.mode == "dflash")
        verify_window = self.window(prefix + self.tree_size + 1)
        self._timed("verify", ("verify", verify_window, greedy), lambda: self._verify(verify_window))
        self._timed("commit", ("accept", greedy), self._accept, eager=not greedy)
        self._timed("commit", ("commit",), self._commit, protect=self._commit_state(), neutral=self._neutral)
        out = self.out[0].tolist()  # the step's one synchronisation
        count = out[0]
        if self.host_tree:
            path = self.acceptance.path[0, :count].tolist()
            kept = torch.tensor(list(range(prefix)) + [prefix + p for p in path])
            for state in self.cache.recurrent.values():
                state.keep(kept)
        self.prefix_host += count
        self.cache.length = self.prefix_host
        if self.timer is not None:
            for name, start, end in self._events:  # complete: the step has synchronised
                self.timer.seconds[name] += start.elapsed_time(end) / 1e3
            self._events.clear()
            self.timer.wall += time.perf_counter() - started
            self.timer.steps += 1
        return out[1 : 1 + count], self.tree_size + 1

    def _timed(self, name: str, key, stage, eager: bool = False, protect=(), neutral=None) -> None:
        """Run a stage; with a timer, time it by device events read after the step's one synchronisation."""
        if self.timer is None:
            self._run(key, stage, eager, protect, neutral)
            return
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._run(key, stage, eager, protect, neutral)
            end.record()
            self._events.append((name, start, end))
        else:
            started = time.perf_counter()
            self._run(key, stage, eager, protect, neutral)
            self.timer.seconds[name] += time.perf_counter() - started

    def _run(self, key, stage, eager: bool, protect, neutral) -> None:
        if eager:
            stage()
        else:
            self.graphs.run(key, stage, protect, neutral)

    # ------------------------------------------------------------------------------------------ stages

    def _uniforms(self, purpose: str, offsets: torch.Tensor) -> torch.Tensor:
        """The request's uniforms at output positions prefix - prompt + offsets ([B, K] offsets)."""
        base = (self.prefix - self.prompt_len)[:, None]
        return self.uniforms[purpose][base + offsets]

    def _draft(self, window: int) -> None:
        drafter, block = self.drafter, self.block_index
        ctx_slots = (self.prefix - self.ctx_count)[:, None] + block
        drafter.write_context(self.ctx, ctx_slots, ctx_slots, self.draft_cache)
        slots = self.prefix[:, None] + block
        ids = torch.where(block == 0, self.root[:, None], drafter.mask_token_id)
        noise = self.target.embed_tokens(ids)
        if drafter.input_embedding_scale != 1.0:
            noise = noise * drafter.input_embedding_scale
        visible = self.slot_index[:window] < (self.prefix + self.block)[:, None]
        batch = ForwardBatch(slots, slots, visible[:, None].expand(-1, self.block, -1), self.cache.capacity)
        hidden = drafter.draft(noise, batch, self.draft_cache)
        self.draft_logits.copy_(drafter.compute_logits(hidden[:, 1:], self.target.lm_head))

    def _build_tree(self) -> None:
        if self.mode == "ar":
            tree = chain_tree(self.root, self.root[:, None][:, :0])
        elif self.mode == "ddtree":
            logprobs = torch.log_softmax(self.draft_logits, dim=-1)
            tree = best_first_tree(self.root, logprobs, self.tree_size)
        elif self.params.greedy:
            tree = chain_tree(self.root, self.draft_logits.argmax(dim=-1))
        else:  # a sampled chain, accepted by rejection sampling
            probs = sampling_probs(self.draft_logits, self.params)
            self.draft_probs.copy_(probs)
            tree = chain_tree(self.root, sample(probs, self._uniforms("draft", self.path_index[1:][None])))
        self.tree.copy_(tree)

    def _verify(self, window: int) -> None:
        tree, size = self.tree, self.tree_size
        positions = self.prefix[:, None] + tree.depths
        slots = self.prefix[:, None] + self.tree_index
        column = (self.slot_index[:window][None, :] - self.prefix[:, None])[:, None, :]
        in_tree = tree.ancestors.gather(2, column.clamp(0, size).expand(-1, size + 1, -1))
        visible = (column < 0) | (in_tree & (column <= size))
        batch = ForwardBatch(positions, slots, visible, self.cache.capacity)
        if self.host_tree:
            batch.new_visible, batch.committed = tree.ancestors, self.prefix_host
        hidden, features = self.target.run(tree.tokens, batch, self.cache, self.feature_layers)
        logits = self.target.lm_head(hidden)
        if self.params.greedy:
            self.target_tokens.copy_(logits.argmax(dim=-1))
        else:
            self.verify_logits.copy_(logits)
        if features is not None:
            self.features.copy_(features)

    def _accept(self) -> None:
        if self.params.greedy:
            acceptance = walk(self.tree, self.target_tokens, self.depth_limit)
        elif self.mode == "dflash":
            acceptance = accept_sampled_chain(
                self.tree,
                self.draft_probs,
                sampling_probs(self.verify_logits, self.params),
                self._uniforms("accept", self.path_index[1:][None]),
                self._uniforms("target", self.path_index[None] + 1),
            )
        else:  # the target's own sample at every node, drawn with its position's uniform
            probs = sampling_probs(self.verify_logits, self.params)
            samples = sample(probs, self._uniforms("target", self.tree.depths + 1))
            acceptance = walk(self.tree, samples, self.depth_limit)
        self.acceptance.path.copy_(acceptance.path)
        self.acceptance.length.copy_(acceptance.length)
        self.acceptance.bonus.copy_(acceptance.bonus)

    def _commit(self) -> None:
        acceptance = self.acceptance
        if self.mode == "ddtree":  # chains are verified in place: nothing to move
            kept = self.path_index < acceptance.length[:, None]
            scratch = self.cache.scratch_slot
            source = torch.where(kept, self.prefix[:, None] + acceptance.path, scratch)
            dest = torch.where(kept, self.prefix[:, None] + self.path_index, scratch)
            self.cache.move(source, dest)
        if self.drafter is not None:
            width = self.features.shape[-1]
            self.ctx.copy_(self.features.gather(1, acceptance.path[..., None].expand(-1, -1, width)))
            self.ctx_count.copy_(acceptance.length)
        tokens = self.tree.tokens.gather(1, acceptance.path)
        out = torch.cat([acceptance.length[:, None], tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
        out.scatter_(1, acceptance.length[:, None], acceptance.bonus[:, None])
        self.out.copy_(out)
        self.prefix += acceptance.length
        self.root.copy_(acceptance.bonus)

    def _commit_state(self) -> list[torch.Tensor]:
        state = [self.prefix, self.root, self.out, self.acceptance.path, self.acceptance.length]
        if self.drafter is not None:
            state += [self.ctx, self.ctx_count]
        return state

    def _neutral(self) -> None:
        """An acceptance of the root alone: the commit's warm-up then moves no cache entry."""
        self.acceptance.path.zero_()
        self.acceptance.length.fill_(1)
