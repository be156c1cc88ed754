"""SGLang command line and environment for a plan, each hardware- or mode-specific choice with its reason."""

from __future__ import annotations

from dataclasses import dataclass

from specdeploy.plan.backends import AttentionChoice
from specdeploy.plan.ddtree import ddtree_facts
from specdeploy.plan.engines import DDTREE_ALGORITHM
from specdeploy.plan.launch_plan import MemoryTable, Reason
from specdeploy.plan.memory import gib
from specdeploy.recipes.schema import (
    DFlashDrafterFacts,
    Eagle3DrafterFacts,
    HardwareProfile,
    ModelFacts,
    Recipe,
)

PCIE_IPC_ALLREDUCE = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
# SGLang disables its custom all-reduce on PCIe boxes with more than two GPUs; the IPC one covers TP 4 and 8.
PCIE_IPC_MIN_TP = 4


@dataclass(frozen=True)
class Serving:
    """Where and how much the server serves: parallelism, limits and address."""

    tp: int
    nnodes: int
    context_length: int
    max_running_requests: int
    host: str
    port: int
    running_why: str | None = None  # how the KV pool sized max_running_requests; None: given or the recipe's
    context_from_recipe: bool = True


@dataclass(frozen=True)
class ServerArgs:
    argv: list[str]
    reasons: list[Reason]


def server_args(
    recipe: Recipe,
    mode: str,
    budget: int | None,
    drafter: ModelFacts | None,
    attention: AttentionChoice,
    serving: Serving,
    memory: MemoryTable,
) -> ServerArgs:
    """The argv after `python -m sglang.launch_server`."""
    target = recipe.target
    tp, nnodes, running = serving.tp, serving.nnodes, serving.max_running_requests
    host, port, context = serving.host, serving.port, serving.context_length
    argv = ["--model-path", target.path]
    if target.revision:
        argv += ["--revision", target.revision]
    argv += ["--tp-size", str(tp)]
    if nnodes > 1:
        argv += ["--nnodes", str(nnodes)]
    argv += ["--host", host, "--port", str(port), "--context-length", str(context)]
    argv += ["--attention-backend", attention.target]
    argv += ["--mem-fraction-static", f"{memory.mem_fraction_static:.2f}"]
    argv += ["--max-running-requests", str(running), "--cuda-graph-max-bs-decode", str(running)]
    reasons = [
        Reason(
            choice=f"--mem-fraction-static {memory.mem_fraction_static:.2f}",
            why=f"weights + KV pool share of each GPU; leaves {gib(memory.headroom)} outside it: "
            f"{gib(memory.cuda_graph_reserve)} for CUDA graphs and {gib(memory.activation_reserve)} for the "
            "runtime and prefill activations (estimates); SGLang 0.5.23 itself would keep "
            f"{gib(memory.sglang_reserve)} at this batch and its {memory.prefill_chunk_tokens}-token prefill chunk",
        ),
        Reason(
            choice=f"--context-length {context}",
            why=(
                f"the recipe's longest request; {target.path} supports {target.context_length}, and every "
                "token of context a request may reach is KV room another request cannot use"
            )
            if serving.context_from_recipe
            else "chosen with --context-length",
        ),
        Reason(
            choice=f"--max-running-requests {running}",
            why=(serving.running_why or ("chosen with --max-running-requests or the recipe's default"))
            + (
                "; set explicitly: under any speculative algorithm SGLang resets it to 48 otherwise "
                "(speculative_hook.py, _handle_dflash)"
                if mode != "ar"
                else "; set explicitly so that the baseline runs at the same concurrency cap as speculative modes"
            ),
        ),
        Reason(
            choice=f"--cuda-graph-max-bs-decode {running}",
            why="capture decode graphs up to the largest batch the server will run; larger batches run eager",
        ),
    ]
    if recipe.trust_remote_code:
        argv.append("--trust-remote-code")
        reasons.append(Reason(choice="--trust-remote-code", why=f"{target.path} ships its own model code"))
    parsers = ["--reasoning-parser", recipe.reasoning_parser] if recipe.reasoning_parser else []
    parsers += ["--tool-call-parser", recipe.tool_call_parser] if recipe.tool_call_parser else []
    if parsers:
        argv += parsers
        reasons.append(
            Reason(
                choice=" ".join(parsers),
                why="split thinking and tool calls out of the text the way the model's chat format marks them",
            )
        )
    argv.append("--enable-metrics")
    reasons.append(Reason(choice="--enable-metrics", why="bench reads /metrics for server-side timings"))
    if isinstance(drafter, DFlashDrafterFacts):
        spec_argv, spec_reasons = _dflash_args(recipe, mode, budget, drafter, attention)
    elif isinstance(drafter, Eagle3DrafterFacts):
        spec_argv, spec_reasons = _eagle3_args(drafter)
    else:
        spec_argv, spec_reasons = [], []
    return ServerArgs(argv=argv + spec_argv, reasons=reasons + spec_reasons)


def _draft_model(drafter: ModelFacts) -> list[str]:
    argv = ["--speculative-draft-model-path", drafter.path]
    if drafter.revision:
        argv += ["--speculative-draft-model-revision", drafter.revision]
    return argv


def _dflash_args(
    recipe: Recipe, mode: str, budget: int | None, drafter: DFlashDrafterFacts, attention: AttentionChoice
) -> tuple[list[str], list[Reason]]:
    algorithm = DDTREE_ALGORITHM if mode == "ddtree" else "DFLASH"
    argv = ["--speculative-algorithm", algorithm, *_draft_model(drafter)]
    argv += ["--speculative-num-draft-tokens", str(drafter.block_size)]
    argv += ["--speculative-draft-attention-backend", str(attention.draft)]
    reasons = [
        Reason(
            choice=f"--speculative-num-draft-tokens {drafter.block_size}",
            why="the drafter's trained block size"
            + (
                ": DDTree builds its tree from one block of this many draft positions"
                if mode == "ddtree"
                # sglang/srt/arg_groups/speculative_hook.py:389-425 (_handle_dflash)
                else ": set explicitly, since SGLang otherwise reads it from the drafter's config and falls "
                "back to 16 when that read fails"
            ),
        )
    ]
    if mode == "ddtree":
        facts = ddtree_facts()
        argv += ["--speculative-ddtree-budget", str(budget)]
        reasons.append(
            Reason(
                choice=f"--speculative-ddtree-budget {budget}",
                why=f"tree nodes verified per step besides the bonus token ({facts.source}); "
                f"<= {drafter.block_size - facts.spine_margin} is a chain like DFlash, more branches",
            )
        )
        if facts.is_full_tree(budget, drafter.block_size):
            page = facts.full_tree_page_size
            argv += ["--page-size", str(page)]
            reasons.append(
                Reason(
                    choice=f"--page-size {page}",
                    why=f"{facts.source} refuses to start a tree on any other page size "
                    f'("DDTREE currently supports only page_size == {page}")',
                )
            )
    elif drafter.draft_window_size:
        # The DDTree build ignores the window (it warns that only DFLASH and EAGLE3 honour it).
        argv += ["--speculative-draft-window-size", str(drafter.draft_window_size)]
        reasons.append(
            Reason(
                choice=f"--speculative-draft-window-size {drafter.draft_window_size}",
                why="the drafter card's sliding window over its context KV: bounds draft memory and cost on long "
                "prompts (SGLang 0.5.23 name of the older --speculative-dflash-draft-window-size)",
            )
        )
    if mode != "ddtree":
        reasons += _dflash_scheduling_reasons(drafter)
    return argv, reasons


def _dflash_scheduling_reasons(drafter: DFlashDrafterFacts) -> list[Reason]:
    """SGLang 0.5.23's DFLASH scheduling and verification options, decided and said even where the plan
    keeps SGLang's default (flags: sglang/srt/arg_groups/fields/schedule.py:193, fields/spec.py:117-124)."""
    return [
        Reason(
            choice="overlap scheduling on (SGLang's default: no --disable-overlap-schedule)",
            # dflash_worker_v2.py:381 runs both ways; speculative_hook.py:66-75 turns it off only on CPU
            why="DFLASH runs SGLang's spec-v2 worker, which schedules the next step on the CPU while the GPU "
            "drafts and verifies this one; the one thing it refuses is a request asking for "
            "return_hidden_states (dflash_utils.py:1108-1110), which bench never sends",
        ),
        Reason(
            choice="no --speculative-use-rejection-sampling, no --speculative-use-block-verification",
            # The refusal at speculative_hook.py:1210-1221 sits in the EAGLE-family handler; only EAGLE workers read
            # the flag (eagle_worker_v2.py, spec_utils.py:209). dflash_worker_v2.py:491-506 warns that block
            # verification does nothing for greedy proposals; sampled verify: dflash_utils.py:906-1012.
            why="SGLang 0.5.23's rejection sampling is an EAGLE-family path: the DFLASH worker never reads the "
            "flag, so it would be accepted and ignored; block verification changes nothing for "
            f"{drafter.path}, which proposes each block greedily: sampled requests are verified token by token "
            "against the target's own distribution (target-only speculative sampling), which is lossless for "
            "greedy proposals",
        ),
    ]


def _eagle3_args(drafter: Eagle3DrafterFacts) -> tuple[list[str], list[Reason]]:
    argv = ["--speculative-algorithm", "EAGLE3", *_draft_model(drafter)]
    argv += ["--speculative-num-steps", str(drafter.num_steps), "--speculative-eagle-topk", str(drafter.topk)]
    argv += ["--speculative-num-draft-tokens", str(drafter.num_draft_tokens)]
    why = "the drafter's published setting (chain drafts: topk 1 keeps every attention backend usable)"
    choice = f"--speculative-num-steps {drafter.num_steps} --speculative-eagle-topk {drafter.topk} " + (
        f"--speculative-num-draft-tokens {drafter.num_draft_tokens}"
    )
    return argv, [Reason(choice=choice, why=why)]


def environment(hardware: HardwareProfile, tp: int, nnodes: int = 1) -> dict[str, str]:
    env: dict[str, str] = {}
    if hardware.interconnect == "pcie" and tp >= PCIE_IPC_MIN_TP:
        env[PCIE_IPC_ALLREDUCE] = "1"
    if nnodes > 1 and hardware.fabric is not None:
        # NCCL and torch's gloo bootstrap otherwise pick the first interface, often a container bridge.
        env["NCCL_SOCKET_IFNAME"] = env["GLOO_SOCKET_IFNAME"] = hardware.fabric.socket_ifname
        if hardware.fabric.ib_hca is not None:
            env["NCCL_IB_HCA"] = hardware.fabric.ib_hca
    return env


def environment_reasons(env: dict[str, str]) -> list[Reason]:
    reasons = []
    if PCIE_IPC_ALLREDUCE in env:
        reasons.append(
            Reason(
                choice=f"{PCIE_IPC_ALLREDUCE}=1",
                why="PCIe-only GPUs with TP > 2: SGLang turns its custom all-reduce off and falls back to NCCL; "
                "0.5.23's opt-in FlashInfer PCIe-IPC all-reduce (bf16 decode) measured TPOT 21.1 -> 13.6 ms at "
                "TP8",
            )
        )
    if "NCCL_SOCKET_IFNAME" in env:
        reasons.append(
            Reason(
                choice=f"NCCL_SOCKET_IFNAME=GLOO_SOCKET_IFNAME={env['NCCL_SOCKET_IFNAME']}",
                why="the node-to-node interface of the hardware profile's fabric: NCCL and gloo otherwise pick "
                "the first interface, often a container bridge the other node cannot reach",
            )
        )
    if "NCCL_IB_HCA" in env:
        reasons.append(
            Reason(
                choice=f"NCCL_IB_HCA={env['NCCL_IB_HCA']}",
                why="the RDMA adapters of the profile's fabric: cross-node all-reduce over InfiniBand/RoCE, "
                "not TCP sockets",
            )
        )
    return reasons
