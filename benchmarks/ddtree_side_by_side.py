"""Side by side on one GPU, one process, the same random weights: liranringel/ddtree and this engine.

The DDTree reference (a checkout you point at with --ddtree-repo; never vendored) runs transformers' target
and its own DFlashDraftModel, timed with its own generate functions (AR is its dflash_generate with block
size 1). The same weights are then saved with save_pretrained, loaded by this engine's loaders and timed
with the engine's decoder (warm-up first: kernels compile, CUDA graphs are captured). Per verify step:
milliseconds, and ratios against the engine's own AR step, the reference's step, and each mode's own
roofline (the bytes its step must read: weights, the routed experts its verified tokens touch, caches; over
the copy bandwidth measured in the same run; `specdeploy.perf.roofline`). For MoE shapes the measured
fraction of experts a verify touches is printed next to independent routing's 1 - (1 - k/E)^n.

    python benchmarks/ddtree_side_by_side.py --ddtree-repo PATH --shape qwen3-8b --out result.json
    python benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3.6-27b --out result.json
    python benchmarks/ddtree_side_by_side.py --engine-only --shape qwen3.6-27b --tiny --device cpu --out r.json

`--tiny` keeps the shape's layer pattern and drafter block at tiny widths; with `--device cpu` it checks the
command line on a laptop (its figures mean nothing).

Results are written after every measurement, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.loading import load_drafter, load_target  # noqa: E402
from specdeploy.perf.profile import profile_decoding, random_prompt  # noqa: E402
from specdeploy.perf.random_models import random_pair  # noqa: E402
from specdeploy.perf.roofline import copy_bandwidth, independent_union  # noqa: E402
from specdeploy.perf.shapes import SHAPES, get_shape, tiny  # noqa: E402


def run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine(commit: str | None, device: torch.device) -> dict:
    import transformers

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # CPU-only installs
        triton_version = None
    cuda = device.type == "cuda"
    return {
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "driver": run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if cuda
        else None,
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "triton": triton_version,
        "specdeploy_commit": commit or run(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
    }


def reference_generate(repo: Path):
    sys.path.insert(0, str(repo))
    from ddtree import ddtree_generate
    from dflash import dflash_generate

    return dflash_generate, ddtree_generate


def reference_models(shape, device: torch.device):
    import transformers
    from model import DFlashDraftModel

    fields = {k: v for k, v in shape.target.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(shape.target["model_type"], **fields)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        target = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
        draft_config = transformers.Qwen3Config(**shape.drafter)
        draft_config._attn_implementation = "sdpa"
        drafter = DFlashDraftModel(draft_config).to(torch.bfloat16).eval()
    return target, drafter


def reference_step(out) -> dict:
    decode = out.time_per_output_token * out.num_output_tokens
    return {
        "ms_per_step": 1e3 * decode / max(out.decode_rounds, 1),
        "steps": out.decode_rounds,
        "tau": sum(out.acceptance_lengths) / max(len(out.acceptance_lengths), 1),
        "stage_ms": {k: 1e3 * v / max(out.decode_rounds, 1) for k, v in out.stage_times.items()},
        "tokens": out.output_ids[0].tolist(),
    }


def run_reference(args, shape, modes, prompt, result: dict, save) -> None:
    """Time the reference on random weights, then save them for this engine's loaders (--workdir)."""
    device = torch.device("cuda")
    mask_id = shape.drafter["dflash_config"]["mask_token_id"]
    block = shape.drafter["block_size"]
    target_dir, draft_dir = args.workdir / "target", args.workdir / "draft"
    dflash_generate, ddtree_generate = reference_generate(args.ddtree_repo)
    target, drafter = reference_models(shape, device)
    ids = torch.tensor([prompt], device=device)
    common = dict(model=drafter, target=target, input_ids=ids, mask_token_id=mask_id, stop_token_ids=None)

    def reference_run(mode: str, budget: int | None, new_tokens: int):
        if mode == "ddtree":
            return ddtree_generate(**common, max_new_tokens=new_tokens, block_size=block, tree_budget=budget)
        return dflash_generate(**common, max_new_tokens=new_tokens, block_size=1 if mode == "ar" else block)

    for mode, budget in modes:
        reference_run(mode, budget, 16)  # warm-up, as the engine gets one
        started = time.perf_counter()
        out = reference_run(mode, budget, args.new_tokens)
        key = mode if budget is None else f"{mode}-{budget}"
        result["reference"][key] = {**reference_step(out), "wall_s": time.perf_counter() - started}
        print(f"reference {key}: {result['reference'][key]['ms_per_step']:.2f} ms/step", flush=True)
        save()
    target.save_pretrained(target_dir)
    drafter.save_pretrained(draft_dir)
    del target, drafter
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ddtree-repo", type=Path, help="a checkout of liranringel/ddtree")
    parser.add_argument(
        "--engine-only",
        action="store_true",
        help="no reference: this engine on random weights built in place",
    )
    parser.add_argument("--shape", default="qwen3-8b", choices=list(SHAPES), help="named real shape")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="the shape's layer pattern at tiny widths (engine only): a smoke run, not a measurement",
    )
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (engine only)")
    parser.add_argument("--modes", default="ar,dflash,ddtree-16,ddtree-64,ddtree-256", help="ar must be one")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/side_by_side"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", help="the specdeploy commit measured (default: git rev-parse HEAD)")
    args = parser.parse_args()
    if args.ddtree_repo is None and not args.engine_only:
        parser.error("give --ddtree-repo PATH, or --engine-only")
    if (args.tiny or args.device != "cuda") and not args.engine_only:
        parser.error("--tiny and --device cpu need --engine-only (the reference runs on CUDA at full size)")
    shape = tiny(get_shape(args.shape)) if args.tiny else get_shape(args.shape)
    modes = [
        (m, int(b) if b else None) for m, _, b in (label.partition("-") for label in args.modes.split(","))
    ]
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    result = {
        "schema": "specdeploy.side_by_side/2",
        "command": " ".join(sys.argv),
        "shape": {"name": shape.name, "description": shape.description, "source": shape.source},
        "machine": machine(args.commit, device),
        "dtype": str(dtype).removeprefix("torch."),
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "reference": {},
        "engine": {},
    }

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    # before the weights take memory; 4 GiB on a GPU, 256 MiB on a CPU (a smoke run)
    copy_bytes = 4 << 30 if device.type == "cuda" else 256 << 20
    result["copy_bandwidth_bytes_per_s"] = copy_bandwidth(device, copy_bytes)
    save()
    torch.manual_seed(0)
    prompt = random_prompt(shape.target["vocab_size"], args.prompt_tokens)
    if args.engine_only:
        ours, our_drafter = random_pair(shape, device, dtype)
    else:
        run_reference(args, shape, modes, prompt, result, save)
        ours = load_target(args.workdir / "target", device, torch.bfloat16)
        our_drafter = load_drafter(args.workdir / "draft", device, torch.bfloat16)
    for mode, budget in modes:
        key = mode if budget is None else f"{mode}-{budget}"
        profile = profile_decoding(
            ours,
            our_drafter if mode != "ar" else None,
            mode,
            budget,
            prompt,
            args.new_tokens,
            result["copy_bandwidth_bytes_per_s"],
        )
        result["engine"][key] = profile.as_dict()
        print(
            f"engine {key}: {profile.ms_per_step:.2f} ms/step, {100 * profile.fraction_of_roofline:.0f}% of its "
            f"roofline ({profile.roofline_ms:.2f} ms) {profile.breakdown_ms}",
            flush=True,
        )
        save()
    raw = shape.target
    summarize(result, raw.get("num_experts_per_tok"), raw.get("n_routed_experts", raw.get("num_experts")))
    save()


def summarize(result: dict, top_k: int | None, experts: int | None) -> None:
    """Ratios: each engine step against the engine's AR step, the reference's same mode and its own roofline;
    for MoE shapes the measured expert union of each mode's verify against independent routing's. Printed
    as a table too."""
    engine, reference = result["engine"], result["reference"]
    ar = engine["ar"]["ms_per_step"]
    rows = {}
    for key, ours in engine.items():
        theirs = reference.get(key, {}).get("ms_per_step")
        tokens = ours["verify_tokens"]
        rows[key] = {
            "engine_ms": ours["ms_per_step"],
            "reference_ms": theirs,
            "vs_engine_ar": ours["ms_per_step"] / ar,
            "speedup_vs_reference": theirs / ours["ms_per_step"] if theirs else None,
            "host_ms": ours["breakdown_ms"]["host"],
            "tree_ms": ours["breakdown_ms"]["tree"],
            "roofline_ms": ours["roofline_ms"],
            "fraction_of_roofline": ours["fraction_of_roofline"],
            "verify_tokens": tokens,
            "expert_union": ours["expert_union"],
            "independent_union": independent_union(top_k, experts, tokens) if experts else None,
        }
    result["summary"] = {"rows": rows}
    print(
        f"{'mode':<12}{'engine ms':>10}{'ref ms':>9}{'x AR':>7}{'vs ref':>8}{'host ms':>9}"
        f"{'roof ms':>9}{'% roof':>8}{'experts':>9}{'1-(1-k/E)^n':>13}"
    )
    for key, row in rows.items():
        ref = f"{row['reference_ms']:.1f}" if row["reference_ms"] else "-"
        speed = f"{row['speedup_vs_reference']:.1f}x" if row["speedup_vs_reference"] else "-"
        union = f"{100 * row['expert_union']:.1f}%" if row["expert_union"] is not None else "-"
        formula = f"{100 * row['independent_union']:.1f}%" if row["independent_union"] is not None else "-"
        print(
            f"{key:<12}{row['engine_ms']:>10.2f}{ref:>9}{row['vs_engine_ar']:>7.2f}{speed:>8}"
            f"{row['host_ms']:>9.3f}{row['roofline_ms']:>9.2f}{100 * row['fraction_of_roofline']:>7.0f}%"
            f"{union:>9}{formula:>13}"
        )


if __name__ == "__main__":
    main()
