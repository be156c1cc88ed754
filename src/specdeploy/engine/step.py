"""One decoding step over static buffers, for every running sequence at once: draft, tree, verify, accept, commit.

Every mode is the same step. The drafter runs once over [root, MASK x (B-1)] (dflash, ddtree); the tree is
empty (ar), the drafter's chain (dflash) or its best `budget` prefixes (ddtree); the target verifies
[root + nodes] in one forward under the ancestor mask; the walk finds the accepted path and the bonus token;
the commit moves the path's cache entries into place and appends its target features to the row's pending
features, which the drafter takes in (its cache's keys/values) before it next drafts. An AR step of a drafting
runner (DDTree's budget 0) runs no drafter work: its one feature per row waits among the pending ones, so a
run of AR steps costs what a pure AR runner's steps cost, and drafting resumes with the drafter's cache exactly
as if it had drafted all along.

Sequences live in rows of the static caches and buffers; rows 0..active-1 decode, and a finished row is
refilled by the last one (so the running rows stay a prefix and every stage runs on views). Each stage is
fixed-shape device work with no host synchronisation, replayed as a CUDA graph on a GPU (one graph per
stage, row bucket, attention window and tree budget); the host reads the committed tokens once per
step. Rows may sample with different settings: greedy rows take the argmax, sampling rows their own draws.

With graphs, the running rows are padded up to a bucket (1, 2, 4, 8, then multiples of 8, as SGLang's graph
batch sizes) so that a few graphs serve every running count; a padded row is dead for the step: it writes
only the scratch slot and commits nothing, so a free row, or the row being prefilled, is untouched. A prompt's
first chunk is padded alike to a bucket of tokens (`prefill_buckets`) and replayed as a graph: padding writes
only the scratch slot and leaves recurrent state alone (`ForwardBatch.valid`). An eager prefill costs a launch
per operation: on an H200 `benchmarks/zoo_pair_speed.py` gave 6.1-6.5 ms of prefill per request for tiny-code
and 16.6-18.0 for tiny-hybrid eagerly (e069240), 1.05-1.21 and 2.09-2.23 captured (8a8314d)
(`benchmarks/results/h200-2026-12-04-prefill-graphs`).

A prompt is prefilled in the spare row (the last); its admission (the settings `begin` staged, its first token,
the move into the next free row) and a finished row's release (the last running row moved into it) are
captured stages too, one per attention window, whose inputs the host sets in a copy or two: launched
operation by operation, requests joining and leaving took about 40% of the engine process's time at 64
requests of tiny-code on an H200, the row moves alone 16-18% (`benchmarks/results/h200-2026-12-04-engine-process`).

Targets with recurrent layers take the same step: their layers follow each token's root path on the device
and the commit replays each row's accepted path (`recurrent_state`), so they batch and capture alike.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specdeploy.engine import ops
from specdeploy.engine.cache import StaticCache, round_up
from specdeploy.engine.forward_batch import ForwardBatch, append_batch
from specdeploy.engine.graphs import StageGraphs
from specdeploy.engine.sampling import (
    RowSampling,
    SamplingParams,
    UniformStream,
    accept_sampled_chain,
    row_sampling_probs,
    sample,
)
from specdeploy.engine.tree import (
    Acceptance,
    TreeBatch,
    best_first_tree,
    chain_tree,
    expected_accept_lengths,
    node_scores,
    root_paths,
    top_k,
    walk,
)
from specdeploy.errors import SpecdeployError

TIMED_STAGES = ("draft", "tree", "verify", "commit")  # accept is timed as part of commit
# Pending target features a row may hold, in drafter blocks: a run of AR steps longer than this (less the
# last drafting step's accepted path) takes them in during an AR step. Bounds the `ctx` buffer at
# rows x PENDING_BLOCKS x block x (feature layers x hidden) values: 40 KiB a position for a Qwen3-8B drafter
# (5 layers x 4096, bf16), so 160 MiB at 64 rows and blocks of 16.
PENDING_BLOCKS = 4
# steps (AR ones included) per acceptance prediction: predicting on every step made auto's step 13% slower than a fixed
# budget-64 step (tiny-code on an H200, 0.716 against 0.633 ms); every fourth still left auto's step 0.03 ms
# (5%) above it in a server, and the policy's running means (EWMA) barely move between steps
PREDICT_EVERY = 16
# the first drafting steps all predict: the policy's calibration (realised over predicted drafts) then rests on
# this many steps from the start, not on three steps 16 apart
PREDICT_WARMUP = 16
DEFAULT_PREFILL_TOKENS = 2048  # prompt tokens per prefill chunk; one chunk of this size costs about one step
SMALLEST_PREFILL_BUCKET = 16


def prefill_buckets(limit: int) -> list[int]:
    """Token counts a fixed-shape prefill chunk is padded to, for chunks of up to `limit` tokens: powers of two
    from 16 to 256, then multiples of 128 (below 256 tokens a prefill costs its launches more than its
    tokens; above, padding adds less than half)."""
    buckets = [SMALLEST_PREFILL_BUCKET]
    while buckets[-1] < limit:
        buckets.append(buckets[-1] * 2 if buckets[-1] < 256 else buckets[-1] + 128)
    return buckets


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


@dataclass
class TreeBuffers:
    """What one tree size's stages hand each other, for every row."""

    tree: TreeBatch
    target_tokens: torch.Tensor  # [rows, N+1] the target's token after each index
    features: torch.Tensor | None  # [rows, N+1, K*H] target features for the drafter
    logits: torch.Tensor | None = None  # [rows, N+1, V] while some row samples
    # Chains only (their structure never changes): per count of step rows, the recurrent layers' root paths and
    # what the layers derive from them (`ForwardBatch.shared`), made by the first step of that count
    chain_paths: dict[int, tuple[torch.Tensor, dict]] | None = None
    # DDTree trees for recurrent layers: [rows, N+1, D] root paths, written by the tree stage with the tree
    paths: torch.Tensor | None = None


@dataclass
class Pending:
    """A sequence being prefilled."""

    prompt_ids: list[int]
    params: SamplingParams
    done: int = 0  # prompt tokens already in the cache


@dataclass
class Row:
    """Host-side state of one running sequence."""

    prefix: int  # committed positions in the cache: the root's position
    prompt_len: int
    params: SamplingParams
    context: int = 0  # committed positions whose target features the drafter has not taken in (pending)


class StepRunner:
    def __init__(
        self,
        target: torch.nn.Module,
        drafter: torch.nn.Module | None,
        mode: str,
        budget: int | None,
        rows: int = 1,
        cuda_graphs: bool = True,
        fixed_shapes: bool | None = None,
        prefill_tokens: int = DEFAULT_PREFILL_TOKENS,
    ) -> None:
        """`fixed_shapes`: run each step on a bucket of rows and each prompt's first chunk on a bucket of tokens
        (default: when CUDA graphs are on); `prefill_tokens`: the longest chunk `prefill` is given."""
        if rows < 1:
            raise SpecdeployError(f"a runner needs at least one row, got {rows}")
        self.target, self.drafter, self.mode = target, drafter, mode
        weight = target.embed_tokens.weight
        self.device, self.dtype = weight.device, weight.dtype
        # read by `window` at every step (device.type is slow to read)
        self.on_gpu = self.device.type == "cuda"
        self.rows = rows
        self.block = drafter.block_size if drafter is not None else 1
        self.pending_limit = PENDING_BLOCKS * self.block
        self.depth_limit = self.block - 1
        self.budget = budget
        self.feature_layers = list(drafter.target_layer_ids) if drafter is not None else []
        self.graphs = StageGraphs(cuda_graphs and self.device.type == "cuda")
        self.fixed_shapes = self.graphs.enabled if fixed_shapes is None else fixed_shapes
        self.prefill_tokens = prefill_tokens
        self.cache: StaticCache | None = None
        self.draft_cache: StaticCache | None = None
        self.timer: StageTimes | None = None
        self._events: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self.running: list[Row] = []
        self._pending: Pending | None = None
        self._trees: dict[int, TreeBuffers] = {}
        self._dead_roots: torch.Tensor | None = None  # dead rows' roots (`_distinct_dead_roots`)
        self.sampling_ready = False  # a row has sampled: every tree size keeps verify logits
        self.curve_budgets: list[int] = []  # budgets whose expected acceptance DDTree steps predict
        self.predict_every = PREDICT_EVERY
        # steps (AR ones included) since the last that predicted: a drafting step predicts once there have been
        # predict_every, so the first drafting step does, and so does the first after a run of AR steps (else
        # an exploring step would rarely predict, and a calibration learnt on few steps could keep AR chosen)
        self.steps_since_prediction = PREDICT_EVERY
        self.predictions_made = 0
        self.expected: list[list[float]] | None = None  # the last step's if it predicted: per row, per budget
        # the last step's, if it predicted: host copies of its trees' node scores, accepted paths and lengths,
        # from which `tree.realised_accept_lengths` tells what each smaller budget would have committed
        self.walked: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # budgets -> (the longest prefix they were read at, the prefix from which they change, `step_windows`)
        self._windows_held: dict[tuple[int, ...], tuple[int, int, tuple[int, ...]]] = {}
        self._allocate()

    @property
    def active(self) -> int:
        return len(self.running)

    def predict_acceptance(self, budgets: list[int], every: int = PREDICT_EVERY) -> None:
        """Make DDTree drafting steps predict, for each row, the tokens it would commit at each of `budgets`
        (`expected_accept_lengths` over the step's own draft), read into `expected` after the step (None after
        the others): the first PREDICT_WARMUP drafting steps, then those with `every` steps or more (AR ones
        included) since the last prediction."""
        if self.mode != "ddtree" or not budgets or min(budgets) < 1:
            raise SpecdeployError(f"acceptance is predicted for DDTree budgets of at least 1, got {budgets}")
        if every < 1:
            raise SpecdeployError(f"predict every 1 or more steps, got {every}")
        self.curve_budgets = sorted(budgets)
        self.predict_every = self.steps_since_prediction = every
        self.expected_buffer = torch.ones(self.rows, len(budgets), device=self.device)
        # on a GPU the prediction comes back through pinned memory, copied before the step's tokens: their one
        # synchronisation brings both (a second `tolist` cost a synchronisation per predicting step)
        self.expected_host = (
            torch.ones(self.rows, len(budgets), pin_memory=True) if self.device.type == "cuda" else None
        )
        self.node_scores = torch.full((self.rows, self.budget + 1), float("-inf"), device=self.device)
        self.walked_host = (
            tuple(
                torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                for t in (self.node_scores, self.acceptance.path, self.acceptance.length)
            )
            if self.device.type == "cuda"
            else None
        )
        self.graphs.clear()  # the tree stage now writes the prediction too

    def tree_size(self, budget: int | None = None) -> int:
        """Draft nodes per step: none (ar, or DDTree's budget 0: an AR step), the block's chain (dflash), or
        the DDTree budget."""
        if self.mode == "ar":
            return 0
        if self.mode == "dflash":
            return self.block - 1
        return budget if budget is not None else self.budget

    # ------------------------------------------------------------------------------------------ setup

    def _allocate(self) -> None:
        rows, depth = self.rows, self.depth_limit
        zeros = torch.zeros(rows, dtype=torch.long, device=self.device)
        self.prefix, self.root, self.prompt_len = zeros.clone(), zeros.clone(), zeros.clone()
        self.row_index = torch.arange(rows, device=self.device)
        # a row move's (source, dest), read by its stage; every pair is kept on the device, so that setting one
        # is a single device copy
        self.row_pairs = torch.stack(torch.meshgrid(self.row_index, self.row_index, indexing="ij"), dim=-1)
        self.move_pair = torch.zeros(2, dtype=torch.long, device=self.device)
        self.live = torch.zeros(rows, dtype=torch.bool, device=self.device)  # the step's running rows
        self._live_shape: tuple[int, int] | None = None  # (rows, running) that `live` holds now
        self.acceptance = Acceptance(
            path=torch.zeros(rows, depth + 1, dtype=torch.long, device=self.device),
            length=zeros.clone(),
            bonus=zeros.clone(),
        )
        self.out = torch.zeros(rows, depth + 2, dtype=torch.long, device=self.device)
        # a prompt's last token's final hidden state, and its logits (the first token's)
        hidden, vocab = self.target.config.hidden_size, self.target.config.vocab_size
        self.prefill_last = torch.zeros(1, hidden, dtype=self.dtype, device=self.device)
        self.prefill_logits = torch.zeros(1, vocab, dtype=self.dtype, device=self.device)
        # the settings of the sequence being prefilled, staged by `begin` (one copy each) for the admit stage:
        # its prompt length, top_k and greedy; its temperature and top_p
        self.admit_ints = torch.zeros(3, dtype=torch.long, device=self.device)
        self.admit_floats = torch.zeros(2, dtype=torch.float32, device=self.device)
        self.path_index = torch.arange(depth + 1, device=self.device)
        self.sampling = RowSampling.of([SamplingParams()] * rows, self.device)
        self.uniforms = torch.zeros(rows, len(UniformStream.PURPOSES), 0, device=self.device)
        if self.drafter is not None:
            vocab = self.target.config.vocab_size
            width = len(self.feature_layers) * self.target.config.hidden_size
            self.block_index = torch.arange(self.block, device=self.device)
            self.block_is_root = self.block_index == 0  # a draft block: the root, then mask tokens
            self.pending_index = torch.arange(self.pending_limit, device=self.device)
            # each row's pending target features (its first ctx_count), oldest first
            self.ctx = torch.zeros(rows, self.pending_limit, width, dtype=self.dtype, device=self.device)
            self.ctx_count = zeros.clone()
            self.draft_logits = torch.zeros(rows, depth, vocab, dtype=torch.float32, device=self.device)
            self.draft_probs: torch.Tensor | None = None

    def _tree_buffers(self, size: int) -> TreeBuffers:
        if size not in self._trees:
            features = None
            if self.drafter is not None:
                width = self.ctx.shape[-1]
                features = torch.zeros(self.rows, size + 1, width, dtype=self.dtype, device=self.device)
            tree = TreeBatch.empty(self.rows, size, self.device)
            chain = size == 0 or self.mode == "dflash"
            if chain:  # only their tokens change from step to step
                tree.copy_(chain_tree(self.root, self.root[:, None].expand(-1, size)))
            paths = None
            if self.target.has_recurrent_layers and not chain:
                shape = (self.rows, size + 1, self.path_width(size))
                paths = torch.zeros(shape, dtype=torch.long, device=self.device)
            self._trees[size] = TreeBuffers(
                chain_paths={} if chain else None,
                paths=paths,
                tree=tree,
                target_tokens=torch.zeros(self.rows, size + 1, dtype=torch.long, device=self.device),
                features=features,
            )
        buffers = self._trees[size]
        if self.sampling_ready and buffers.logits is None:  # a tree size first used after a row sampled
            vocab = self.target.config.vocab_size
            buffers.logits = torch.zeros(self.rows, size + 1, vocab, dtype=self.dtype, device=self.device)
        return buffers

    def path_width(self, size: int) -> int:
        """Path entries (root included) a step with trees of `size` nodes can commit: its depth, at most the
        drafter's block, and the root."""
        return min(size, self.depth_limit) + 1

    @property
    def reserve_margin(self) -> int:
        """Cache slots per row beyond the committed positions: a step's tree or block, and the scratch slot."""
        return max(self.tree_size() + 1, self.block) + 1

    def reserve(self, positions: int) -> None:
        """Make the caches hold `positions` committed positions per row, plus a step's tree and block."""
        budget = self.tree_size()
        needed = positions + self.reserve_margin
        if self.cache is not None and self.cache.capacity >= needed:
            return
        if self.running or self._pending is not None:
            raise SpecdeployError("cannot grow the caches while sequences run: reserve before admitting")
        capacity = round_up(needed, 256 if self.device.type == "cuda" else 64)
        self.cache = self.target.new_cache(self.rows, capacity, tree_tokens=budget + 1)
        if self.drafter is not None:
            self.draft_cache = self.drafter.new_cache(self.rows, capacity)
        self.slot_index = torch.arange(capacity, device=self.device)
        # a prompt fits the cache with room for its first token: so does any chunk of it
        self.prefill_buckets = prefill_buckets(min(self.prefill_tokens, self.cache.usable - 1))
        # a fixed-shape first chunk's real token count, then its tokens: set by one copy
        self.prefill_input = torch.zeros(1 + self.prefill_buckets[-1], dtype=torch.long, device=self.device)
        self.prefill_count, self.prefill_ids = self.prefill_input[0], self.prefill_input[None, 1:]
        self.prefill_index = torch.arange(self.prefill_buckets[-1], device=self.device)
        self.graphs.clear()  # graphs point at the old buffers

    def step_rows(self, active: int) -> int:
        """Rows a step runs on: the running ones, padded up to a bucket with `fixed_shapes`."""
        if not self.fixed_shapes:
            return active
        bucket = 1 << (active - 1).bit_length() if active <= 8 else round_up(active, 8)
        return min(bucket, self.rows)

    def row_buckets(self) -> list[int]:
        """Every row count a step may run on."""
        return sorted({self.step_rows(active) for active in range(1, self.rows + 1)})

    def windows(self, spacing: int = 2) -> list[int]:
        """The attention windows steps use, each at least `spacing` times the one before, and the whole cache's
        (spacing 2: every window a step may use on a GPU)."""
        sizes, used = [], 1
        while used < self.cache.capacity:
            sizes.append(self.window(used))
            used = sizes[-1] * spacing
        return sorted({*sizes, self.window(self.cache.capacity)})

    def catch_up_size(self, pending: int) -> int:
        """Feature rows a step writes to take in `pending` features (the most any running row holds): exactly
        those, or with `fixed_shapes` (what CUDA graphs use) the smallest of `catch_up_sizes` that holds
        them, so that few graphs serve every count."""
        if not self.fixed_shapes or pending == 0:
            return pending
        return next(size for size in self.catch_up_sizes() if size >= pending)

    def catch_up_sizes(self) -> list[int]:
        """The fixed-shape catch-up sizes: the block, doubled while below the pending limit, and the limit."""
        sizes = [self.block]
        while sizes[-1] * 2 < self.pending_limit:
            sizes.append(sizes[-1] * 2)
        return sorted({*sizes, self.pending_limit})

    @torch.inference_mode()
    def dead_step(
        self,
        rows: int,
        budget: int | None = None,
        window: int | None = None,
        catch_up: int | None = None,
        predict: bool = False,
    ) -> None:
        """One greedy step of every stage on `rows` dead rows (no host synchronisation): it writes only scratch
        slots and commits nothing, so it captures graphs (at `window`, default the smallest) or times a step
        of that shape without touching any sequence. `catch_up`: pending feature rows it takes in (default: a
        block for a drafting step, none for an AR step, as in a run of them); `predict`: its tree predicts
        acceptance (as every `predict_every`-th drafting step's does). Only while none runs or prefills."""
        if self.running or self._pending is not None:
            raise SpecdeployError("dead steps run only while no sequence runs or prefills")
        size = self.tree_size(budget)
        window = window or self.window(1)
        if catch_up is None:
            catch_up = self.catch_up_size(self.block) if self.drafter is not None and size > 0 else 0
        self._tree_buffers(size)
        self.live[:rows] = False
        self._live_shape = None
        untimed = lambda name, key, stage, eager=False, protect=(), neutral=None: self._run(  # noqa: E731
            key, stage, eager, protect, neutral
        )
        self._distinct_dead_roots(rows)
        self._stages(rows, size, True, window, window, catch_up, untimed, predict and size > 0)

    def _distinct_dead_roots(self, rows: int) -> None:
        """Give dead rows distinct random roots, as real rows are distinct sequences: an MoE target reads the
        experts its tokens route to, and dead rows that all verified one token timed too few of them (random
        qwen3_moe, 64 experts top 4, 4 rows, CPU: an AR step's dead time 8.0 ms against a real step's 18.3, 18.2
        with distinct roots; `benchmarks/dead_step_moe.py`). Their trees stay what the drafter makes of the
        roots. Drawn once, on the device, so that a timed dead step copies without synchronising."""
        if self._dead_roots is None:
            generator = torch.Generator().manual_seed(0)
            roots = torch.randint(self.target.config.vocab_size, (self.rows,), generator=generator)
            self._dead_roots = roots.to(self.device)
        self.root[:rows].copy_(self._dead_roots[:rows])

    @torch.inference_mode()  # as the stages run when replayed: under autograd, ops decompose differently (a
    # CPU scalar copied to the GPU, which a capture refuses; other kernels, which round differently)
    def capture(self, budgets: list[int | None]) -> int:
        """Capture the greedy step's graphs for every row bucket, attention window and budget now, and the
        prefill's for every chunk bucket and the admission's and row move's for every window, so that no request
        pays for a capture; returns how many graphs were captured (none without CUDA graphs). Only while none runs or prefills."""
        if not self.graphs.enabled:
            return 0
        if self.running or self._pending is not None:
            raise SpecdeployError("graphs are captured only while no sequence runs or prefills")
        before = len(self.graphs.graphs)
        for bucket in self.prefill_buckets:
            self.prefill_count.zero_()  # a chunk of padding alone: it writes only the scratch slot
            self._run_prefill_chunk(bucket)
        spare = self.rows - 1
        self.move_pair.copy_(self.row_pairs[spare, spare])  # a row onto itself: it changes nothing
        for window in self.windows():
            self._run_move(window)
            self._run_admit(window)  # it sets only the spare row, which holds no sequence now
        for rows in self.row_buckets():
            for window in self.windows():
                for budget in budgets:
                    self.dead_step(rows, budget, window)
            if self.curve_budgets:  # the tree stage of a predicting step, at every drafting budget
                for budget in budgets:
                    if self.tree_size(budget) > 0:
                        self.dead_step(rows, budget, predict=True)
            # every catch-up size (a drafting step after AR steps), and the commit of an AR step that catches up
            if self.drafter is not None and 0 in budgets:
                for catch_up in self.catch_up_sizes():
                    self.dead_step(rows, 0, self.window(1), catch_up)
        torch.cuda.synchronize(self.device)
        return len(self.graphs.graphs) - before

    def draft_window(self) -> int:
        """The attention window of the next step's drafter pass (its verify's too, but for trees deeper than a
        block)."""
        return self.window(max(row.prefix for row in self.running) + self.block)

    def step_windows(self, budgets: list[int]) -> tuple[int, ...]:
        """The attention window the next step reads at each of `budgets`: its verify's (the longest running
        row's prefix and its tree) or its drafter pass's, the larger. A dead step at that window costs what the
        step costs; a large tree's verify crosses into a larger window before the drafter's block does. Kept
        while the longest prefix grows within every window (the batch engine asks before each auto step)."""
        used = max(row.prefix for row in self.running)
        key = tuple(budgets)
        held = self._windows_held.get(key)
        if held is not None and held[0] <= used < held[1]:
            return held[2]
        # slots past the prefix each budget's step reads
        reaches = [max(self.block if n > 0 else 1, n + 1) for n in map(self.tree_size, budgets)]
        windows = tuple(self.window(used + reach) for reach in reaches)
        # a window holds while prefix + reach stays within it: windows only grow with the slots used
        until = min(window - reach + 1 for window, reach in zip(windows, reaches, strict=True))
        self._windows_held[key] = (used, until, windows)
        return windows

    def window(self, used: int) -> int:
        """Attention window (cache slots) for `used` slots: few distinct sizes on a GPU, one graph each."""
        if self.on_gpu:
            return min(self.cache.capacity, max(256, 1 << (used - 1).bit_length()))
        return min(self.cache.capacity, round_up(used, 64))

    # ------------------------------------------------------------------------------------ admission

    @property
    def prefill_remaining(self) -> int:
        """Prompt tokens of the sequence being prefilled not yet in the cache (0 when none is)."""
        pending = self._pending
        return 0 if pending is None else len(pending.prompt_ids) - pending.done

    def abandon(self) -> None:
        """Drop the sequence being prefilled (its row stays free)."""
        self._pending = None

    def begin(self, prompt_ids: list[int], params: SamplingParams, uniforms: UniformStream | None) -> None:
        """Start prefilling a new sequence (in chunks, `prefill`) in the spare row, the last one."""
        if self._pending is not None:
            raise SpecdeployError("a sequence is already being prefilled")
        if self.active == self.rows:
            raise SpecdeployError(f"all {self.rows} rows are running")
        count = len(prompt_ids)
        if count + 1 > self.cache.usable:
            raise SpecdeployError(
                f"a prompt of {count} tokens does not fit the cache ({self.cache.usable} slots)"
            )
        row = self.rows - 1
        if self.cache.recurrent is not None:
            self.cache.recurrent.reset_row(row)
        if not params.greedy:
            self._prepare_sampling(uniforms)
            self.uniforms[row, :, : uniforms.table.shape[1]] = uniforms.table
        ints, floats = RowSampling.settings(params)
        self.admit_ints.copy_(torch.tensor([count, *ints]))
        self.admit_floats.copy_(torch.tensor(floats))
        self._pending = Pending(list(prompt_ids), params)

    @torch.inference_mode()
    def prefill(self, max_tokens: int) -> int | None:
        """Run up to `max_tokens` more prompt tokens of the sequence being prefilled; once the prompt is done,
        return its first token (the sequence then decodes in the next free row), else None."""
        pending, row = self._pending, self.rows - 1
        done = pending.done
        chunk = pending.prompt_ids[done : done + max(1, max_tokens)]
        bucket = next((size for size in self.prefill_buckets if size >= len(chunk)), None)
        if self.fixed_shapes and done == 0 and bucket is not None:
            self.prefill_input[: len(chunk) + 1].copy_(torch.tensor([len(chunk), *chunk]))
            self._run_prefill_chunk(bucket)
        else:  # later chunks (a prompt longer than a chunk) run at their own size
            ids = torch.tensor([chunk], device=self.device)
            positions = torch.arange(done, done + len(chunk), device=self.device)[None]
            batch = append_batch(positions, done, self.cache.capacity, 1, row_start=row)
            hidden, features = self.target.run(ids, batch, self.cache, self.feature_layers)
            if self.drafter is not None:
                self.drafter.write_context(features, positions, positions, self.draft_cache, row_start=row)
            self.prefill_last.copy_(hidden[:, -1])
        pending.done += len(chunk)
        count = len(pending.prompt_ids)
        if pending.done < count:
            return None
        dest = self.active
        self.move_pair.copy_(self.row_pairs[row, dest])
        self._run_admit(self.window(count))
        if self.uniforms.shape[2] and dest != row:
            self.uniforms[dest] = self.uniforms[row]
        if pending.params.greedy:
            first = self.root[dest]
        else:
            probs = row_sampling_probs(self.prefill_logits, self.sampling.rows(1, dest))
            first = sample(probs, self.uniforms[dest, 0, :1])[0]
            self.root[dest] = first
        self._pending = None
        self.running.append(Row(prefix=count, prompt_len=count, params=pending.params))
        return int(first)

    def _run_prefill_chunk(self, bucket: int) -> None:
        """`_prefill_chunk` at `bucket` tokens, replayed as a graph; its warm-up before a capture runs on a
        chunk of padding alone, which changes nothing."""
        self.graphs.run(("prefill", bucket), lambda: self._prefill_chunk(bucket), protect=[self.prefill_count],
                        neutral=self.prefill_count.zero_)  # fmt: skip

    def _prefill_chunk(self, bucket: int) -> None:
        """A prompt's first chunk in the spare row: the first `prefill_count` tokens of `prefill_ids`, padded to
        `bucket`; the last real token's final hidden state goes to `prefill_last`."""
        row, count = self.rows - 1, self.prefill_count
        index = self.prefill_index[:bucket]
        real = index < count
        window = self.window(bucket)
        visible = (self.slot_index[:window][None, :] <= index[:, None])[None]  # causal from slot 0
        slots = torch.where(real, index, self.cache.scratch_slot)[None]
        batch = ForwardBatch(
            index[None], slots, visible, self.cache.capacity, row_start=row, valid=real[None]
        )
        hidden, features = self.target.run(
            self.prefill_ids[:, :bucket], batch, self.cache, self.feature_layers
        )
        if self.drafter is not None:
            draft_slots = torch.where(real, index, self.draft_cache.scratch_slot)[None]
            self.drafter.write_context(features, index[None], draft_slots, self.draft_cache, row_start=row)
        # clamped: a chunk of padding alone (a capture's) has no last token
        self.prefill_last.copy_(hidden[0].index_select(0, (count - 1).clamp(min=0).view(1)))

    def _prepare_sampling(self, uniforms: UniformStream) -> None:
        """Room for a sampling row: verify logits for every tree size, and uniforms as long as the request's."""
        length = uniforms.table.shape[1]
        if self.uniforms.shape[2] < length:
            grown = torch.zeros(self.rows, self.uniforms.shape[1], length, device=self.device)
            grown[:, :, : self.uniforms.shape[2]] = self.uniforms
            self.uniforms = grown
        self.sampling_ready = True
        for size in {self.tree_size(), *self._trees}:
            self._tree_buffers(size)
        if self.mode == "dflash" and self.draft_probs is None:
            vocab = self.target.config.vocab_size
            self.draft_probs = torch.zeros(self.rows, self.depth_limit, vocab, device=self.device)

    def release(self, row: int) -> int | None:
        """Free `row`; the last running row moves into it. Returns that row's old index (None if none moved)."""
        last = self.active - 1
        if not 0 <= row <= last:
            raise SpecdeployError(f"row {row} is not running")
        moved = self.running[last]
        self.running[row] = moved
        self.running.pop()
        if row == last:
            return None
        self._move_row(last, row, moved.prefix)
        return last

    def _move_row(self, source: int, dest: int, length: int) -> None:
        """Copy a sequence's cache entries (its first `length` slots, up to the window that holds them) and
        per-row state to another row, in one stage per window, replayed as a graph on a GPU (launched copy by
        copy, the moves took 16-18% of the engine process's time at 64 requests of tiny-code on an H200)."""
        if source == dest:
            return
        self.move_pair.copy_(self.row_pairs[source, dest])
        self._run_move(self.window(length))
        if self.uniforms.shape[2]:  # not in the stage: it grows with the longest sampling request
            self.uniforms[dest] = self.uniforms[source]

    def _run_admit(self, window: int) -> None:
        # no state to protect from the capture's warm-up: the replay sets again all that it set
        self.graphs.run(("admit", window), lambda: self._admit_stage(window))

    def _admit_stage(self, window: int) -> None:
        """The prompt prefilled in the spare row becomes a sequence: the row takes the settings `begin` staged,
        a greedy first token (the argmax of the last prompt token's logits, kept in `prefill_logits`) and no
        pending features; then it moves to row `move_pair[1]` (`_move_stage`)."""
        spare, ints, floats = self.row_index[-1:], self.admit_ints, self.admit_floats
        logits = ops.linear(self.prefill_last, self.target.lm_head)
        self.prefill_logits.copy_(logits)
        settings = [(self.prefix, ints[:1]), (self.prompt_len, ints[:1]), (self.root, logits.argmax(dim=-1))]
        settings += [(self.sampling.top_k, ints[1:2]), (self.sampling.greedy, ints[2:].bool())]
        settings += [(self.sampling.temperature, floats[:1]), (self.sampling.top_p, floats[1:])]
        if self.drafter is not None:
            settings.append((self.ctx_count, torch.zeros_like(ints[:1])))
        for tensor, value in settings:
            tensor.index_copy_(0, spare, value)
        self._move_stage(window)

    def _run_move(self, window: int) -> None:
        # no state to protect from the capture's warm-up: a copy run twice leaves what it left once
        self.graphs.run(("move", window), lambda: self._move_stage(window))

    def _move_stage(self, window: int) -> None:
        """Row `move_pair[0]`'s first `window` cache slots and per-row state to row `move_pair[1]`."""
        source, dest = self.move_pair[:1], self.move_pair[1:]
        for cache in (self.cache, self.draft_cache):
            if cache is not None:
                cache.copy_row(source, dest, window)
        tensors = [self.prefix, self.root, self.prompt_len, self.out]
        tensors += [self.sampling.temperature, self.sampling.top_k, self.sampling.top_p, self.sampling.greedy]
        if self.drafter is not None:
            tensors += [self.ctx, self.ctx_count]
        for tensor in tensors:
            tensor.index_copy_(0, dest, tensor.index_select(0, source))

    # -------------------------------------------------------------------------------------------- step

    @torch.inference_mode()
    def step(
        self,
        budget: int | None = None,
        while_running: Callable[[], None] | None = None,
        predict: bool = False,
    ) -> list[tuple[list[int], int]]:
        """One draft-verify step of every running row: (committed tokens, tokens verified) per row.

        `budget` picks a DDTree tree size for this step (default: the runner's); `while_running`: host work to
        do once the step is launched, before waiting for it (on a GPU it overlaps the step's kernels);
        `predict`: a drafting step predicts acceptance (`predict_acceptance`) whatever the cadence."""
        started = time.perf_counter()
        active = self.active
        rows = self.step_rows(active)
        if self._live_shape != (rows, active):  # one launch fewer per step while the running rows stay
            torch.lt(self.row_index[:rows], active, out=self.live[:rows])
            self._live_shape = (rows, active)
        size = self.tree_size(budget)
        self._tree_buffers(size)
        prefixes = [row.prefix for row in self.running]
        greedy = all(row.params.greedy for row in self.running)
        draft_window = self.draft_window()
        catch_up = 0
        if self.drafter is not None:
            pending = max(row.context for row in self.running)
            # A drafting step takes in every pending feature first; an AR step only when its own would not fit.
            if size > 0 or pending + 1 > self.pending_limit:
                catch_up = self.catch_up_size(pending)
        verify_window = self.window(max(prefixes) + size + 1)
        every = self.predict_every if self.predictions_made >= PREDICT_WARMUP else 1
        due = predict or self.steps_since_prediction >= every
        predict = bool(self.curve_budgets) and size > 0 and due
        self.steps_since_prediction = 1 if predict else self.steps_since_prediction + 1
        self.predictions_made += predict
        self._stages(rows, size, greedy, draft_window, verify_window, catch_up, self._timed, predict)
        expected, walked = None, None
        if predict:
            expected = self.expected_buffer[:active]
            scores, path = self.node_scores[:active, : size + 1], self.acceptance.path[:active]
            walked = (scores, path, self.acceptance.length[:active])
            if self.expected_host is not None:
                expected = self.expected_host[:active].copy_(expected, non_blocking=True)
                host_scores, host_path, host_length = self.walked_host
                walked = (
                    host_scores[:active, : size + 1].copy_(scores, non_blocking=True),
                    host_path[:active].copy_(path, non_blocking=True),
                    host_length[:active].copy_(walked[2], non_blocking=True),
                )
        if while_running is not None:
            while_running()
        out = self.out[:active].tolist()  # the step's one synchronisation (after the prediction's copies)
        self.expected = None if expected is None else expected.tolist()
        self.walked = None if walked is None else tuple(t.clone() for t in walked)
        results = []
        taken_in = self._takes_in(size, catch_up)
        for state, line in zip(self.running, out, strict=True):
            count = line[0]
            state.prefix += count
            state.context = count if taken_in else state.context + count
            results.append((line[1 : 1 + count], size + 1))
        if self.timer is not None:
            for name, start, end in self._events:  # complete: the step has synchronised
                self.timer.seconds[name] += start.elapsed_time(end) / 1e3
            self._events.clear()
            self.timer.wall += time.perf_counter() - started
            self.timer.steps += 1
        return results

    def _takes_in(self, size: int, catch_up: int) -> bool:
        """Whether a step leaves no feature pending but its own: it drafted (after taking in every pending
        one; with none pending there was nothing to write) or it caught up."""
        return self.drafter is not None and (size > 0 or catch_up > 0)

    def _stages(
        self,
        rows: int,
        size: int,
        greedy: bool,
        draft_window: int,
        verify_window: int,
        catch_up: int,
        run,
        predict: bool = False,
    ) -> None:
        """Every stage of a step on `rows` rows, each through `run` (`_timed`, or untimed for dead steps), so
        that real and dead steps use the same graph keys. `catch_up`: pending feature rows to take in first;
        `predict`: the tree stage predicts acceptance too."""
        if catch_up:
            run("draft", ("context", rows, catch_up), lambda: self._write_context(rows, catch_up))
        if self.drafter is not None and size > 0:
            run("draft", ("draft", rows, draft_window), lambda: self._draft(rows, draft_window))
        if size > 0:
            chain_sampling = not greedy and self.mode == "dflash"
            run("tree", ("tree", rows, size, predict), lambda: self._build_tree(rows, size, greedy, predict),
                eager=chain_sampling)  # fmt: skip
        run("verify", ("verify", rows, verify_window, size, greedy),
            lambda: self._verify(rows, verify_window, size, greedy))  # fmt: skip
        run("commit", ("accept", rows, size), lambda: self._accept(rows, size, greedy), eager=not greedy)
        taken_in = self._takes_in(size, catch_up)
        run("commit", ("commit", rows, size, taken_in), lambda: self._commit(rows, size, taken_in),
            protect=self._commit_state(), neutral=self._neutral)  # fmt: skip

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

    def _uniforms(self, rows: int, purpose: str, offsets: torch.Tensor) -> torch.Tensor:
        """Each row's uniforms at output positions prefix - prompt + offsets ([rows, K] offsets)."""
        base = (self.prefix[:rows] - self.prompt_len[:rows])[:, None]
        table = self.uniforms[:rows, UniformStream.PURPOSES.index(purpose)]
        # greedy rows have no uniforms of their own (their draws are discarded): keep their index in range
        index = (base + offsets).expand(rows, -1).clamp(max=table.shape[1] - 1)
        return table.gather(1, index)

    def _live_slots(self, rows: int, slots: torch.Tensor, cache: StaticCache) -> torch.Tensor:
        """`slots` [rows, T] of the running rows; a padded (dead) row writes only the scratch slot."""
        return torch.where(self.live[:rows, None], slots, cache.scratch_slot)

    def _write_context(self, rows: int, count: int) -> None:
        """Take in the pending target features (the positions just before each row's prefix) in one pass: their
        keys/values go into the drafter's cache, as a prefill of them would write. `count`: feature rows
        written, at least every row's pending count; rows past a row's own count, and dead rows, write only
        the scratch slot. The count stays pending on the device: the step's commit resets it."""
        pending = self.ctx_count[:rows]
        index = self.pending_index[:count]
        positions = (self.prefix[:rows] - pending)[:, None] + index
        written = self.live[:rows, None] & (index < pending[:, None])
        slots = torch.where(written, positions, self.draft_cache.scratch_slot)
        self.drafter.write_context(self.ctx[:rows, :count], positions, slots, self.draft_cache)

    def _draft(self, rows: int, window: int) -> None:
        drafter, block = self.drafter, self.block_index
        prefix = self.prefix[:rows]
        positions = prefix[:, None] + block
        slots = self._live_slots(rows, positions, self.draft_cache)
        ids = torch.where(self.block_is_root, self.root[:rows, None], drafter.mask_token_id)
        noise = self.target.embed_tokens(ids)
        if drafter.input_embedding_scale != 1.0:
            noise = noise * drafter.input_embedding_scale
        visible = self.slot_index[:window] < (prefix + self.block)[:, None]
        batch = ForwardBatch(
            positions, slots, visible[:, None].expand(-1, self.block, -1), self.cache.capacity
        )
        hidden = drafter.draft(noise, batch, self.draft_cache)
        drafter.compute_logits(hidden[:, 1:], self.target.lm_head, out=self.draft_logits[:rows])

    def _build_tree(self, rows: int, size: int, greedy: bool, predict: bool = False) -> None:
        """This step's trees, written into the buffers of their size (never run for an AR step, whose tree is the
        root alone)."""
        root = self.root[:rows]
        buffers = self._trees[size]
        tree = buffers.tree.rows(rows)
        if self.mode == "ddtree":
            logprobs = torch.log_softmax(self.draft_logits[:rows], dim=-1)
            width = min(max([size, *(self.curve_budgets if predict else [])]), logprobs.shape[-1])
            top = top_k(logprobs, width)  # one selection for the tree and the prediction
            paths = None if buffers.paths is None else buffers.paths[:rows]
            best_first_tree(root, logprobs, size, top, out=tree, paths=paths)
            if predict:
                predicted = expected_accept_lengths(logprobs, self.curve_budgets, top)
                self.expected_buffer[:rows].copy_(predicted)
                node_scores(tree, logprobs, out=self.node_scores[:rows, : size + 1])
            return
        # a DFlash block: a chain, whose structure its buffers were made with
        argmax = self.draft_logits[:rows].argmax(dim=-1)
        if not greedy:  # sampled chains, accepted by rejection sampling (greedy rows: the argmax chain)
            probs = row_sampling_probs(self.draft_logits[:rows], self.sampling.rows(rows))
            self.draft_probs[:rows].copy_(probs)
            drawn = sample(probs, self._uniforms(rows, "draft", self.path_index[1:][None]))
            argmax = torch.where(self.sampling.greedy[:rows, None], argmax, drawn)
        tree.tokens[:, 0].copy_(root)
        tree.tokens[:, 1:].copy_(argmax)

    def _verify(self, rows: int, window: int, size: int, greedy: bool) -> None:
        buffers = self._trees[size]
        tree = buffers.tree.rows(rows)
        tokens = self.root[:rows, None] if size == 0 else tree.tokens  # an AR step verifies its root alone
        prefix = self.prefix[:rows]
        positions = prefix[:, None] + tree.depths
        slots = self._live_slots(rows, prefix[:, None] + self.slot_index[: size + 1], self.cache)
        column = (self.slot_index[:window][None, :] - prefix[:, None])[:, None, :]
        in_tree = tree.ancestors.gather(2, column.clamp(0, size).expand(-1, size + 1, -1))
        visible = (column < 0) | (in_tree & (column <= size))
        batch = ForwardBatch(positions, slots, visible, self.cache.capacity)
        if self.target.has_recurrent_layers:
            batch.tree_paths, batch.shared = self._recurrent_paths(buffers, tree, rows, size, batch.shared)
        hidden, features = self.target.run(tokens, batch, self.cache, self.feature_layers)
        logits = ops.linear(hidden, self.target.lm_head)
        buffers.target_tokens[:rows].copy_(logits.argmax(dim=-1))
        if not greedy:
            buffers.logits[:rows].copy_(logits)
        if features is not None:
            buffers.features[:rows].copy_(features)

    def _recurrent_paths(
        self, buffers: TreeBuffers, tree: TreeBatch, rows: int, size: int, shared: dict
    ) -> tuple[torch.Tensor, dict]:
        """The trees' root paths for recurrent layers, and the dict in which the layers share what they derive
        from them. A DDTree tree's come from its tree stage; a chain's are made once per count of rows and kept
        (on a GPU by the warm-up run that precedes a graph's capture, so the graph only reads them)."""
        if buffers.paths is not None:  # a DDTree tree's, written by its tree stage
            return buffers.paths[:rows], shared
        chains = buffers.chain_paths
        if chains is not None and rows in chains:
            return chains[rows]
        made = (root_paths(tree.ancestors, self.path_width(size)), shared)
        if chains is not None:
            chains[rows] = made
        return made

    def _accept(self, rows: int, size: int, greedy: bool) -> None:
        buffers = self._trees[size]
        tree = buffers.tree.rows(rows)
        argmax = buffers.target_tokens[:rows]
        out = Acceptance(
            self.acceptance.path[:rows], self.acceptance.length[:rows], self.acceptance.bonus[:rows]
        )
        if greedy:
            walk(tree, argmax, self.depth_limit, out)
            return
        settings = self.sampling.rows(rows)
        probs = row_sampling_probs(buffers.logits[:rows], settings)
        if self.mode == "dflash":  # rejection sampling on sampled chains; greedy rows walk the argmax
            sampled = accept_sampled_chain(
                tree,
                self.draft_probs[:rows],
                probs,
                self._uniforms(rows, "accept", self.path_index[1:][None]),
                self._uniforms(rows, "target", self.path_index[None] + 1),
            )
            exact = walk(tree, argmax, self.depth_limit)
            for name in ("path", "length", "bonus"):
                keep_exact = settings.greedy.view(-1, *[1] * (getattr(exact, name).dim() - 1))
                getattr(out, name).copy_(
                    torch.where(keep_exact, getattr(exact, name), getattr(sampled, name))
                )
        else:  # the target's own sample at every node, drawn with its position's uniform
            samples = sample(probs, self._uniforms(rows, "target", tree.depths + 1))
            walk(tree, torch.where(settings.greedy[:, None], argmax, samples), self.depth_limit, out)

    def _commit(self, rows: int, size: int, taken_in: bool) -> None:
        """`taken_in`: the step took in every pending feature (`_takes_in`): the path's replace them, else
        they are appended (an AR step's one feature; the host keeps the count within `pending_limit`)."""
        path, bonus = self.acceptance.path[:rows], self.acceptance.bonus[:rows]
        length = torch.where(self.live[:rows], self.acceptance.length[:rows], 0)  # dead rows commit nothing
        prefix = self.prefix[:rows]
        buffers = self._trees[size]
        if self.mode == "ddtree" and size > 0:  # chains (and AR steps) are verified in place: nothing to move
            self.cache.keep_path(path, length, prefix)
        self.target.commit_tree(self.cache, path, length)
        width = self.path_width(size)
        kernels = ops.step_kernels_for(path)
        if kernels is not None:  # the same in two launches
            ctx_count = None
            if self.drafter is not None:
                ctx_count = self.ctx_count[:rows]
                kernels.keep_features(
                    buffers.features[:rows], self.ctx[:rows], ctx_count, path[:, :width], taken_in
                )
            kernels.commit_rows(path, length, bonus, buffers.tree.tokens[:rows], prefix, self.root[:rows],
                                self.out[:rows], ctx_count, taken_in)  # fmt: skip
            return
        if self.drafter is not None:
            features = buffers.features[:rows]
            kept = features.gather(1, path[:, :width, None].expand(-1, -1, features.shape[-1]))
            start = torch.zeros_like(length) if taken_in else self.ctx_count[:rows]
            # clamped: a dead row's stale count must not index out of the buffer (it commits nothing)
            dest = (start[:, None] + self.path_index[:width]).clamp(max=self.pending_limit - 1)
            self.ctx[:rows].scatter_(1, dest[..., None].expand_as(kept), kept)
            self.ctx_count[:rows].copy_(start + length)
        tokens = buffers.tree.tokens[:rows].gather(1, path)
        out = torch.cat([length[:, None], tokens[:, 1:], torch.zeros_like(tokens[:, :1])], dim=1)
        out.scatter_(1, length[:, None], bonus[:, None])
        self.out[:rows].copy_(out)
        prefix += length
        self.root[:rows].copy_(bonus)

    def _commit_state(self) -> list[torch.Tensor]:
        state = [self.prefix, self.root, self.out, self.acceptance.path, self.acceptance.length]
        if self.drafter is not None:
            state += [self.ctx, self.ctx_count]
        return state

    def _neutral(self) -> None:
        """An acceptance of nothing: the commit's warm-up then moves no cache entry and replays no recurrent
        state (which it could not restore cheaply)."""
        self.acceptance.path.zero_()
        self.acceptance.length.zero_()
