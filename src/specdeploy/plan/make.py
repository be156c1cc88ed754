"""make_plan: (recipe, hardware, mode, overrides) -> LaunchPlan. Pure: no downloads, no GPUs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdeploy.api_key import API_KEY_ENV
from specdeploy.errors import SpecdeployError
from specdeploy.modes import AUTO_BUDGET, Budget, check_mode
from specdeploy.plan import sglang_args
from specdeploy.plan.backends import choose_attention
from specdeploy.plan.ddtree import ddtree_facts
from specdeploy.plan.engines import reference_engine, sglang_ddtree_build, sglang_release
from specdeploy.plan.headroom import sglang_reserve
from specdeploy.plan.launch_plan import (
    REFERENCE_LAUNCH,
    SGLANG_LAUNCH,
    GpuRequirement,
    LaunchPlan,
    MemoryTable,
    ModelRef,
    Reason,
)
from specdeploy.plan.locking import locked_recipe
from specdeploy.plan.memory import MIB, REFERENCE_DTYPE_FACTOR, Workload, budget_memory, gib
from specdeploy.recipes.loader import load_hardware, load_recipe
from specdeploy.recipes.lock import LockFile
from specdeploy.recipes.schema import HardwareProfile, ModelFacts, Recipe

DEFAULT_PORT = 30000
DEFAULT_HOST = "127.0.0.1"  # launchers for containers and clusters bind 0.0.0.0 themselves
# The paper's best DDTree budgets were 256-512 on dense 8B models; MoE targets activate more experts per node.
LARGE_MOE_BUDGET = 64
# Batches above this gain little decode throughput per GPU and multiply the verify tokens of speculative modes;
# SGLang's own decode CUDA-graph limit on the largest GPUs is 512 (memory_hook.py, handle_gpu_memory_settings).
MAX_DERIVED_RUNNING = 256
# Below this many working-context requests in bf16, the KV pool is what limits the server: store it in fp8.
FP8_KV_BELOW_REQUESTS = 32
FP8_KV_DTYPE = "fp8_e4m3"
# Target attention backends whose SGLang 0.5.23 kernels take an fp8 KV cache, and where that is written.
FP8_KV_BACKENDS = {
    # the MLA decode kernel casts q to the KV buffer's dtype and folds k_scale into the softmax scale
    "triton": "sglang/kernels/ops/attention/decode_attention.py:661 and :1255",
    # the only KV dtypes it accepts are fp8_e4m3, bf16 and auto
    "trtllm_mla": "sglang/srt/arg_groups/overrides.py:1214",
}


@dataclass(frozen=True)
class WorkingContext:
    """Tokens a typical request holds at its longest (prompt + output), and whose figure that is."""

    tokens: int
    source: (
        str  # completes "N requests at ...", e.g. "the working context of the campaign's random workloads"
    )


def make_plan(
    recipe: Recipe | str,
    hardware: HardwareProfile | str,
    mode: str,
    budget: Budget | None = None,
    tp: int | None = None,
    context_length: int | None = None,
    max_running_requests: int | None = None,
    nnodes: int = 1,
    attention_backend: str | None = None,
    port: int = DEFAULT_PORT,
    lock: LockFile | None = None,
    api_key: bool = False,
    working_context: WorkingContext | None = None,
) -> LaunchPlan:
    """Decide everything about one launch; raise SpecdeployError for combinations that cannot work.

    Names are resolved through the shipped recipe data (the only read it does); objects are used as given.
    `lock` pins the checkpoints, the image and the DDTree build (refused when it drifted from the recipe);
    `api_key`: the server requires the key it finds in $SPECDEPLOY_API_KEY at launch.
    `working_context`: what the requests will hold, where the caller knows it (a campaign's random workloads);
    it replaces the recipe's working_context_length in sizing --max-running-requests from the KV pool.
    """
    recipe = load_recipe(recipe) if isinstance(recipe, str) else recipe
    hardware = load_hardware(hardware) if isinstance(hardware, str) else hardware
    _check_request(recipe, hardware, mode, budget, nnodes)
    if lock is not None:
        if recipe.engine == "reference":
            raise SpecdeployError(
                f"{recipe.name} runs models shipped with specdeploy: its version pins them; remove the lock file"
            )
        recipe = locked_recipe(recipe, lock, _models_of(recipe, mode), ddtree=mode == "ddtree")
    drafter = _drafter(recipe, mode)
    context = recipe.default_context_length if context_length is None else context_length
    running = recipe.default_max_running_requests if max_running_requests is None else max_running_requests
    _check_limits(recipe, context, running, port)
    block = recipe.dflash.block_size
    if mode == "ddtree" and budget is None:
        budget = block - 1
    fixed = budget if isinstance(budget, int) else None  # "auto": the reference engine picks per step
    full_tree = fixed is not None and mode == "ddtree" and ddtree_facts().is_full_tree(fixed, block)
    reference = recipe.engine == "reference"
    total_gpus = max(1, hardware.gpu_count) * nnodes

    def workload(tp_size: int, requests: int | None = None) -> Workload:
        n = running if requests is None else requests
        return Workload(
            tp=tp_size,
            context_length=context,
            max_running_requests=n,
            cuda_graph_max_bs=None if reference else n,
            speculative=mode != "ar",
            # Only the SGLang build allocates triton's tree-verify graph buffers (every rank holds them whole).
            tree_buffers=ddtree_facts().tree_buffer_bytes(fixed, n, context)
            if full_tree and not reference
            else 0,
            dtype_factor=REFERENCE_DTYPE_FACTOR if reference and hardware.device == "cpu" else 1,
            kv_fp8=kv_fp8,
        )

    kv_fp8 = False
    tp_size, memory, tp_reason = _choose_tp(recipe, hardware, drafter, total_gpus, tp, workload)
    running_why, kv_reason = None, None
    attention = None if reference else choose_attention(recipe, hardware, mode, full_tree, attention_backend)
    if max_running_requests is None and not reference and recipe.working_context_length is not None:
        working = working_context or WorkingContext(
            recipe.working_context_length, "the recipe's working context"
        )
        running, memory, running_why = _running_from_memory(
            recipe, hardware, drafter, tp_size, context, workload, working
        )
        if running < FP8_KV_BELOW_REQUESTS and attention.target in FP8_KV_BACKENDS:
            bf16_running = running
            kv_fp8 = True
            running, memory, running_why = _running_from_memory(
                recipe, hardware, drafter, tp_size, context, workload, working
            )
            kv_reason = Reason(
                choice=f"--kv-cache-dtype {FP8_KV_DTYPE}",
                why=f"the KV pool binds here: in bf16 it holds {bf16_running} requests of the working context, "
                f"in fp8 {running}; SGLang 0.5.23's {attention.target} kernels read an fp8 KV cache "
                f"({FP8_KV_BACKENDS[attention.target]}); fp8 KV can cost some acceptance: the smoke test reports tau",
            )
    if not reference:
        reserve = sglang_reserve(hardware.memory_mib, tp_size, running, recipe.target.attention == "mla")
        memory = memory.model_copy(
            update={"sglang_reserve": int(reserve.total * MIB), "prefill_chunk_tokens": reserve.chunk_tokens}
        )
    one_node = _one_node_fits(recipe, hardware, drafter, nnodes, tp_size, workload)
    warnings = _warnings(recipe, hardware, mode, fixed, full_tree, drafter, tp_size, total_gpus, nnodes)
    warnings += [one_node] if one_node else []
    warnings += _lock_warnings(recipe, mode, lock)
    warnings += _memory_warnings(memory, context, running)
    warnings += _headroom_warnings(memory, running)
    if reference:
        argv = _reference_argv(recipe, hardware, mode, budget, drafter, port, running, context)
        engine, env, reasons = reference_engine(), {}, [tp_reason]
    else:
        serving = sglang_args.Serving(
            tp_size, nnodes, context, running, DEFAULT_HOST, port, running_why, context_length is None
        )
        args = sglang_args.server_args(recipe, mode, budget, drafter, attention, serving, memory)
        kv_argv = ["--kv-cache-dtype", FP8_KV_DTYPE] if kv_fp8 else []
        argv = [*SGLANG_LAUNCH, *args.argv, *kv_argv]
        env = sglang_args.environment(hardware, tp_size, nnodes)
        reasons = [tp_reason, *attention.reasons, *args.reasons, *([kv_reason] if kv_reason else [])]
        reasons += sglang_args.environment_reasons(env)
        engine = sglang_ddtree_build(lock) if mode == "ddtree" else sglang_release(lock)
    return LaunchPlan(
        recipe=recipe.name,
        hardware=hardware.name,
        mode=mode,
        budget=budget,
        tp=tp_size,
        engine=engine,
        argv=argv,
        env=env,
        host=DEFAULT_HOST,
        port=port,
        models=_model_refs(recipe, drafter, lock),
        gpus=GpuRequirement(
            profile=hardware.name,
            gpu_model=hardware.gpu_model,
            count=hardware.gpu_count,
            memory_bytes_per_gpu=hardware.memory_bytes,
            compute_capability=hardware.compute_capability,
            interconnect=hardware.interconnect,
            nnodes=nnodes,
            rdma_resource=hardware.fabric.rdma_resource if nnodes > 1 and hardware.fabric else None,
        ),
        memory=memory,
        warnings=warnings,
        reasons=reasons,
        summary=_summary(recipe, hardware, mode, budget, tp_size, nnodes),
        api_key_env=API_KEY_ENV if api_key else None,
    )


def _check_request(
    recipe: Recipe, hardware: HardwareProfile, mode: str, budget: Budget | None, nnodes: int
) -> None:
    check_mode(mode, budget)
    if budget == AUTO_BUDGET and recipe.engine != "reference":
        raise SpecdeployError(
            "--budget auto is the reference engine's (a budget chosen every step); SGLang's DDTree build "
            "takes one fixed budget: give a number (a campaign can sweep several)"
        )
    if recipe.engine != hardware.engine:
        if recipe.engine == "reference":
            raise SpecdeployError(
                f"{recipe.name} is a zoo pair served by the reference engine, and {hardware.name} is an SGLang "
                "GPU profile: use --hardware cpu or cuda (or a GPU recipe such as qwen3-8b on this profile)"
            )
        raise SpecdeployError(
            f"{recipe.name} runs on SGLang GPUs, and {hardware.name} is a reference-engine profile: pick an "
            "SGLang GPU profile (`specdeploy recipes` lists them), or a zoo pair such as tiny-code for the "
            "reference engine"
        )
    if nnodes < 1:
        raise SpecdeployError(f"--nnodes must be at least 1, got {nnodes}")
    if nnodes > 1 and recipe.engine == "reference":
        raise SpecdeployError("the reference engine runs in one process: --nnodes > 1 needs an SGLang recipe")
    if nnodes > 1 and hardware.fabric is None:
        raise SpecdeployError(
            f"{hardware.name} names no [fabric] (node-to-node interface and RDMA adapters): add one to the "
            "profile before serving across nodes, or use --nnodes 1"
        )
    for drafter in (recipe.dflash, recipe.eagle3):
        if drafter is not None and drafter.trained_for != recipe.target.path:
            raise SpecdeployError(
                f"recipe {recipe.name} pairs drafter {drafter.path} (trained for {drafter.trained_for}) with "
                f"target {recipe.target.path}: a drafter on the wrong target accepts almost nothing; use the "
                f"drafter trained for {recipe.target.path}"
            )


def _models_of(recipe: Recipe, mode: str) -> list[ModelFacts]:
    drafter = _drafter(recipe, mode)
    return [recipe.target, *([drafter] if drafter is not None else [])]


def _drafter(recipe: Recipe, mode: str) -> ModelFacts | None:
    if mode == "ar":
        return None
    if mode == "eagle3":
        if recipe.eagle3 is None:
            raise SpecdeployError(
                f"{recipe.name} has no EAGLE3 drafter: use --mode dflash or ddtree, or add an [eagle3] table "
                "to the recipe (kimi-k2.6 has one)"
            )
        return recipe.eagle3
    return recipe.dflash


def _check_limits(recipe: Recipe, context: int, running: int, port: int) -> None:
    if not 1 <= context <= recipe.target.context_length:
        raise SpecdeployError(
            f"--context-length {context} is outside 1..{recipe.target.context_length} "
            f"({recipe.target.path} supports {recipe.target.context_length} tokens)"
        )
    if running < 1:
        raise SpecdeployError(f"--max-running-requests must be at least 1, got {running}")
    if not 1 <= port <= 65535:
        raise SpecdeployError(f"port {port} is outside 1..65535")


def _choose_tp(
    recipe: Recipe,
    hardware: HardwareProfile,
    drafter: ModelFacts | None,
    total_gpus: int,
    tp: int | None,
    workload: Callable[..., Workload],
) -> tuple[int, MemoryTable, Reason]:
    if recipe.engine == "reference":
        if tp not in (None, 1):
            raise SpecdeployError("the reference engine runs on one device: drop --tp (or use --tp 1)")
        memory = budget_memory(recipe.target, drafter, hardware, workload(1), recipe.name)
        where = "one CPU process" if hardware.device == "cpu" else "one process on one GPU"
        return 1, memory, Reason(choice="one process", why=f"the reference engine serves from {where}")
    if tp is not None:
        if not 1 <= tp <= total_gpus:
            raise SpecdeployError(f"--tp {tp} is outside 1..{total_gpus} (the GPUs of {hardware.name})")
        memory = budget_memory(recipe.target, drafter, hardware, workload(tp), recipe.name)
        return tp, memory, Reason(choice=f"--tp-size {tp}", why="chosen with --tp")
    try:
        memory = budget_memory(recipe.target, drafter, hardware, workload(1), recipe.name)
        why = "the model fits on one GPU: no all-reduce at all; pass --tp to shard it anyway"
        return 1, memory, Reason(choice="--tp-size 1", why=why)
    except SpecdeployError:
        if total_gpus == 1:
            raise
    memory = budget_memory(recipe.target, drafter, hardware, workload(total_gpus), recipe.name)
    why = (
        f"the model needs more than one GPU, so it is sharded over all {total_gpus}: the memory the weights "
        "leave free becomes KV cache; pass --tp for fewer"
    )
    return total_gpus, memory, Reason(choice=f"--tp-size {total_gpus}", why=why)


def _running_from_memory(
    recipe: Recipe,
    hardware: HardwareProfile,
    drafter: ModelFacts | None,
    tp: int,
    context: int,
    workload: Callable[..., Workload],
    working_context: WorkingContext,
) -> tuple[int, MemoryTable, str]:
    """The most requests of the working context the KV pool holds at once, capped, with its memory table and
    the reason; each request more also grows the CUDA-graph reserve, so it settles downwards."""
    working = min(working_context.tokens, context)
    # The most the pool could hold: with the CUDA graphs of a single request
    largest = budget_memory(recipe.target, drafter, hardware, workload(tp, 1), recipe.name)
    requests = max(1, min(MAX_DERIVED_RUNNING, largest.kv_tokens_fit // working))
    while True:
        memory = budget_memory(recipe.target, drafter, hardware, workload(tp, requests), recipe.name)
        held = memory.kv_tokens_fit // working
        if held >= requests or requests == 1:
            break
        requests = max(1, held)
    cap = f" (capped at {MAX_DERIVED_RUNNING})" if requests == MAX_DERIVED_RUNNING else ""
    why = (
        f"the KV pool holds {memory.kv_tokens_fit:,} tokens per GPU: {requests} requests{cap} at "
        f"{working_context.source}, {working} tokens (prompt + output), beside their CUDA graphs; "
        f"{memory.full_length_requests} at the full --context-length {context}"
    )
    return requests, memory, why


def _one_node_fits(
    recipe: Recipe,
    hardware: HardwareProfile,
    drafter: ModelFacts | None,
    nnodes: int,
    tp: int,
    workload: Callable[..., Workload],
) -> str | None:
    """A warning when a multi-node plan shards across nodes what one node's GPUs hold."""
    if nnodes == 1 or tp <= hardware.gpu_count:
        return None
    try:
        budget_memory(recipe.target, drafter, hardware, workload(hardware.gpu_count), recipe.name)
    except SpecdeployError:
        return None
    return (
        f"{recipe.name} fits on one {hardware.name} node at TP{hardware.gpu_count}: TP{tp} over {nnodes} nodes "
        "sends every all-reduce of every layer across the network and is slower per request; serve "
        f"{nnodes} replicas of the one-node plan (--nnodes 1) behind a load balancer instead"
    )


def _model_refs(recipe: Recipe, drafter: ModelFacts | None, lock: LockFile | None) -> list[ModelRef]:
    def ref(model: ModelFacts, role: str) -> ModelRef:
        locked = lock.model(model.path) if lock is not None else None
        return ModelRef(
            role=role,
            path=model.path,
            revision=model.revision,
            gated=model.gated,
            # what the download really is, once the lock has listed the files
            disk_bytes=locked.total_bytes if locked is not None else model.disk_bytes,
            access_url=model.access_url,
        )

    return [ref(recipe.target, "target"), *([ref(drafter, "drafter")] if drafter else [])]


def _warnings(
    recipe: Recipe,
    hardware: HardwareProfile,
    mode: str,
    budget: int | None,
    full_tree: bool,
    drafter: ModelFacts | None,
    tp: int,
    total_gpus: int,
    nnodes: int,
) -> list[str]:
    warnings: list[str] = []
    for model in (recipe.target, drafter):
        # Zoo models ship inside the package, so the package version pins them.
        if model is not None and model.revision is None and not model.is_zoo:
            warnings.append(
                f"{model.path} has no pinned revision: the server loads whatever `main` is at launch time; "
                f"`specdeploy lock {recipe.name}` pins it (or pin a commit in the recipe)"
            )
        if model is not None and model.gated:
            warnings.append(
                f"{model.path} is gated: request access at {model.access_url} and export HF_TOKEN before `up`"
            )
    if mode == "ddtree" and recipe.engine == "sglang":
        facts = ddtree_facts()
        warnings.append(
            f"DDTree runs an unmerged SGLang build: {facts.source}, built once per host into its own image on "
            "top of the 0.5.23 release (`specdeploy image build`); that commit is the newest the public index "
            "holds and the PR may have moved; only the PR's own flags are checked against it, the rest of the "
            "command line against 0.5.23's parser"
        )
        if not full_tree:
            warnings.append(
                f"budget {budget} <= block size - 1 = {recipe.dflash.block_size - 1}: {facts.source} runs this as "
                '"spine" mode, one chain verified with a causal mask and overlap scheduling off, so it cannot '
                f"beat DFlash: use --mode dflash, or a budget above {recipe.dflash.block_size - 1} for a tree"
            )
        if recipe.target.attention not in facts.tested_upstream.attention:
            warnings.append(
                f"{recipe.target.path} uses {recipe.target.attention.upper()} attention, which {facts.source} never "
                "tested (its runs used GQA targets): the smoke test compares greedy outputs with the AR server's "
                "before a campaign measures it"
            )
        if full_tree and recipe.target.attention == "hybrid":
            warnings.append(
                f"{recipe.target.path} has recurrent (Gated DeltaNet) layers: tree verification must fork their "
                "state per branch; earlier runs on Qwen3.6-27B saw acceptance collapse at budget 64 "
                "(budget 15 was best); sweep small budgets first"
            )
        if full_tree and "MoE" in recipe.description and budget > LARGE_MOE_BUDGET:
            warnings.append(
                f"budget {budget} on a MoE target: every extra verify token activates more experts, and the "
                "best budget for MoE is lower than the paper's 256-512 on dense models"
            )
    if hardware.interconnect == "pcie" and tp > 1:
        warnings.append(
            "PCIe-only GPUs: if NCCL hangs at startup, check IOMMU/ACS settings in the BIOS/kernel; "
            "NCCL_P2P_DISABLE=1 works around it at a large speed cost"
        )
    if tp < total_gpus:
        warnings.append(f"TP{tp} uses {tp} of the {total_gpus} GPUs; the others stay idle")
    if nnodes > 1:
        warnings.append(
            f"tensor parallelism spans {nnodes} nodes: every all-reduce crosses the network; "
            "render with --format k8s (or sh with NODE_RANK and DIST_INIT_ADDR set on each node); the "
            f"profile's fabric names (interface {hardware.fabric.socket_ifname}, RDMA adapters "
            f"{hardware.fabric.ib_hca or 'none'}) are the usual ones: check `ip link` and `ibv_devices` on the nodes"
        )
    unverified = [
        f"{m.path}: {', '.join(m.unverified)}" for m in (recipe.target, drafter) if m and m.unverified
    ]
    unverified += [f"{hardware.name}: {', '.join(hardware.unverified)}"] if hardware.unverified else []
    if unverified:
        warnings.append("the memory table rests on unverified facts: " + "; ".join(unverified))
    warnings += recipe.known_issues
    warnings += drafter.notes if drafter is not None else []  # the drafter that runs, not the recipe's others
    return warnings


def _lock_warnings(recipe: Recipe, mode: str, lock: LockFile | None) -> list[str]:
    if lock is not None or recipe.engine != "sglang" or mode != "ddtree":
        return []
    return [
        "no lock file: the DDTree image's pip dependencies resolve anew at every build and may differ between "
        f"hosts; `specdeploy lock {recipe.name}` pins them (and the base image's digest)"
    ]


def _memory_warnings(memory: MemoryTable, context: int, running: int) -> list[str]:
    if memory.full_length_requests >= running:
        return []
    return [
        f"the KV cache holds {memory.kv_tokens_fit} tokens per GPU ({gib(memory.kv_budget_per_gpu)}): only "
        f"{memory.full_length_requests} of the {running} running requests can reach the full "
        f"--context-length {context} at once; SGLang queues or retracts the rest"
    ]


def _headroom_warnings(memory: MemoryTable, running: int) -> list[str]:
    """A warning when the plan leaves less outside the static pool than SGLang keeps there for itself."""
    if memory.sglang_reserve == 0 or memory.headroom >= memory.sglang_reserve:
        return []
    gpu = memory.gpu_memory
    own = round((gpu - memory.sglang_reserve) / gpu, 3)  # SGLang's own choice (memory_hook.py:324-328)
    held = memory.weights_per_gpu + memory.drafter_per_gpu + memory.recurrent_state_per_gpu
    own_tokens = max(0, int(gpu * own) - held) // memory.kv_bytes_per_token
    return [
        f"--mem-fraction-static {memory.mem_fraction_static:.2f} leaves {gib(memory.headroom)} per GPU outside "
        f"the static pool, less than the {gib(memory.sglang_reserve)} SGLang 0.5.23 keeps there itself at a "
        f"decode batch of {running} and its {memory.prefill_chunk_tokens}-token prefill chunk (memory_hook.py:"
        "305-313: 1.5 MiB of activations per chunk token, and the CUDA graphs): "
        "CUDA-graph capture or a full prefill chunk may run out of memory; if the server log shows CUDA out of "
        f"memory, launch the --format sh rendering with SGLang's own --mem-fraction-static {own:.3f} (a KV pool "
        f"of {own_tokens:,} tokens per GPU instead of {memory.kv_tokens_fit:,}) or a smaller --chunked-prefill-size"
    ]


def _reference_argv(
    recipe: Recipe,
    hardware: HardwareProfile,
    mode: str,
    budget: Budget | None,
    drafter: ModelFacts | None,
    port: int,
    running: int,
    context: int,
) -> list[str]:
    """`specdeploy serve` batches up to `running` requests of up to `context` positions each."""
    argv = [*REFERENCE_LAUNCH, "--target", recipe.target.path, "--mode", mode]
    if hardware.device != "cpu":
        argv += ["--device", hardware.device]
    if context != recipe.target.context_length:  # serve's default is the model's own
        argv += ["--context-length", str(context)]
    argv += ["--max-running-requests", str(running)]
    if drafter is not None:
        argv += ["--draft", drafter.path]
    if budget is not None:
        argv += ["--budget", str(budget)]
    return [*argv, "--host", DEFAULT_HOST, "--port", str(port)]


def _summary(
    recipe: Recipe, hardware: HardwareProfile, mode: str, budget: Budget | None, tp: int, nnodes: int
) -> str:
    nodes = "a budget chosen every step (auto)" if budget == AUTO_BUDGET else f"{budget} nodes"
    how = {
        "ar": "plain autoregressive decoding (the baseline)",
        "dflash": f"DFlash block drafting ({recipe.dflash.block_size} tokens per block, {recipe.dflash.path})",
        "ddtree": f"DDTree draft trees of {nodes} from one DFlash pass ({recipe.dflash.path})",
        "eagle3": f"EAGLE3 drafting ({recipe.eagle3.path})" if recipe.eagle3 else "EAGLE3",
    }[mode]
    where = f"{hardware.description}" + (f", {nnodes} nodes" if nnodes > 1 else "")
    engine = "the reference engine" if recipe.engine == "reference" else f"SGLang at TP{tp}"
    return f"{recipe.target.path} with {how}, served by {engine} on {where}"
