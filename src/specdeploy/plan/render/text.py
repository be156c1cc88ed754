"""`--format text`: what will run and why, the memory table and the warnings, for a reader new to it all."""

from __future__ import annotations

import shlex
import textwrap

from specdeploy.plan.launch_plan import LaunchPlan
from specdeploy.plan.memory import gib

WIDTH = 100  # where nothing says how wide the terminal is (`specdeploy plan` passes its width)
MEMORY_NOTE_AT = 37  # the memory table's note column: label (2 + 22) + size (10) + 3 spaces


def _wrap(text: str, width: int, indent: str = "  ", first: str | None = None) -> list[str]:
    first = indent if first is None else first
    # URLs and flags must stay whole to be copied.
    wrapped = textwrap.wrap(
        text,
        width,
        initial_indent=first,
        subsequent_indent=indent + "  ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    return wrapped or [first]


def _command_lines(plan: LaunchPlan) -> list[str]:
    """The command one flag (with its value) per line, the way a person would paste it."""
    env = [f"{key}={shlex.quote(value)}" for key, value in sorted(plan.env.items())]
    launcher, args = plan.launcher_prefix, plan.server_args
    groups: list[str] = []
    for arg in args:
        if arg.startswith("--") or not groups:
            groups.append(shlex.quote(arg))
        else:
            groups[-1] += " " + shlex.quote(arg)
    if plan.api_key_env is not None and plan.engine.name == "sglang":
        groups.append(f'--api-key "${plan.api_key_env}"')  # expanded at launch: the key is written nowhere
    head = " ".join([*env, *launcher])
    return ["  " + head + " \\"] + [f"      {group} \\" for group in groups[:-1]] + [f"      {groups[-1]}"]


def _models(plan: LaunchPlan, width: int) -> list[str]:
    lines = []
    for model in plan.models:
        revision = (
            "shipped with specdeploy" if model.path.startswith("zoo:") else model.revision or "NOT PINNED"
        )
        gated = f", gated: request access at {model.access_url}" if model.gated else ""
        lines += _wrap(
            f"{model.path}  (revision {revision}, {gib(model.disk_bytes)} on disk{gated})",
            width,
            indent=" " * 9,
            first=f"  {model.role:<8} ",
        )
    return lines


def _memory(plan: LaunchPlan, width: int) -> list[str]:
    m = plan.memory
    sglang = plan.gpus.gpu_model is not None
    on_gpu = plan.gpus.count > 0  # the reference engine on CUDA names no GPU model
    per = "per GPU" if on_gpu else "host memory"
    if sglang:
        runtime, weights = "CUDA context, NCCL, one prefill chunk", f"TP{plan.tp} shard"
    elif on_gpu:
        runtime, weights = "CUDA context and activations", "bf16 on the GPU"
    else:
        runtime, weights = "Python process and activations", "fp32 on CPU"
    rows = [
        ("target weights", m.weights_per_gpu, weights),
        ("drafter weights", m.drafter_per_gpu, ""),
        ("recurrent state", m.recurrent_state_per_gpu, "Gated DeltaNet state of all running requests"),
        ("CUDA graphs", m.cuda_graph_reserve, "reserve outside the static pool (estimate)"),
        (
            "  tree buffers",
            m.tree_buffers_per_gpu,
            "of which triton tree verify: (budget+1) x batch x context",
        ),
        ("runtime, activations", m.activation_reserve, f"{runtime} (estimate)"),
        ("KV cache", m.kv_budget_per_gpu, f"{m.kv_tokens_fit:,} tokens at {m.kv_bytes_per_token:,} B/token"),
    ]
    lines = [f"Memory ({gib(m.gpu_memory)} {per})"]
    for label, size, note in rows:
        if size or label == "KV cache":
            head = f"  {label:<22}{gib(size):>10}   "
            # The note wraps under its own column; `_wrap` indents continuation lines by 2 more.
            lines += [line.rstrip() for line in _wrap(note, width, " " * (MEMORY_NOTE_AT - 2), first=head)]
    if m.mem_fraction_static is not None:
        lines += _wrap(
            f"--mem-fraction-static {m.mem_fraction_static:.2f}: weights and KV cache share of the GPU", width
        )
        lines += _wrap(
            f"headroom outside it: {gib(m.headroom)}; SGLang 0.5.23 keeps {gib(m.sglang_reserve)} there itself "
            f"(its {m.prefill_chunk_tokens}-token prefill chunk, this decode batch)",
            width,
        )
    lines += _wrap(f"requests that can hold the full context at once: {m.full_length_requests}", width)
    return lines


def render_text(plan: LaunchPlan, width: int = WIDTH) -> str:
    """The plan for a reader, its prose wrapped at `width` columns (commands, URLs and flags stay whole)."""
    engine = plan.engine
    lines = [f"specdeploy plan: {plan.recipe} on {plan.hardware}, mode {plan.mode}", ""]
    lines += ["What will run", *_wrap(plan.summary, width)]
    build = f"{engine.name} {engine.version}"
    lines += _wrap(
        f"engine: {build}"
        + (f", container image {engine.image}" if engine.image else "")
        + f" ({engine.source})",
        width,
    )
    if engine.build is not None:
        build = engine.build
        pins = (
            f"{len(build.constraints)} locked pip pins" if build.constraints else "no lock: pip resolves anew"
        )
        lines += _wrap(
            f"the image is built once per host from PR #{build.pull_request} at {build.commit[:10]} on "
            f"{build.base} ({pins}): `specdeploy image build`, or --format dockerfile",
            width,
        )
    if plan.api_key_env is not None:
        lines += _wrap(f"the server requires an API key, read from ${plan.api_key_env} at launch", width)
    lines += ["", "Models", *_models(plan, width), "", "Command", *_command_lines(plan), ""]
    lines.append("Why these settings")
    for reason in plan.reasons:
        lines += _wrap(f"{reason.choice}: {reason.why}", width, first="  - ", indent="    ")
    lines += ["", *_memory(plan, width), ""]
    if plan.warnings:
        lines.append("Warnings")
        for warning in plan.warnings:
            lines += _wrap(warning, width, first="  ! ", indent="    ")
        lines.append("")
    lines += [
        "Next",
        f"  specdeploy up {plan.recipe} --hardware {plan.hardware} --mode {plan.mode}"
        + (f" --budget {plan.budget}" if plan.budget is not None else ""),
        "    (preflight, download, launch, health, smoke test)",
        "  or render this plan with --format sh | compose | k8s | json"
        + (" | dockerfile" if engine.build is not None else ""),
    ]
    return "\n".join(lines) + "\n"
