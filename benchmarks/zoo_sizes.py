"""What a speculative step costs against an AR step for candidate zoo sizes, on this machine's CPU.

For each candidate (target width/depth/MLP and drafter depth of a zoo pair), writes a checkpoint pair with
random weights (the zoo's own config builders; speed depends on the shapes only), loads it once with one
torch thread, and times greedy requests of `--new-tokens` tokens (EOS ignored) through the engine's
`Decoder`, as `specdeploy profile` does: ms per step = decode time / verify steps. Requests alternate, AR
then a speculative mode, round after round; each mode's ratio to the AR request just before it is kept, and
the table gives the median over `--repeats` rounds, so load that comes and goes on a shared machine hits both
sides of a ratio alike. tau for 1.5x = 1.5 x that ratio: what the mode must accept per step to be 1.5x AR.

    python benchmarks/zoo_sizes.py --pair tiny-code --out zoo-sizes.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from specdeploy.engine.decode import Decoder, SamplingParams  # noqa: E402
from specdeploy.engine.drafter import DFlashDrafter  # noqa: E402
from specdeploy.engine.loading import load_drafter, load_target, save_drafter  # noqa: E402
from specdeploy.engine.runtime import set_cpu_threads  # noqa: E402
from specdeploy.perf.profile import random_prompt  # noqa: E402
from specdeploy.zoo.byte_tokenizer import write_byte_tokenizer  # noqa: E402
from specdeploy.zoo.specs import PairSpec, drafter_config, pair_spec, target_config  # noqa: E402

SPEEDUP = 1.5
# (hidden, layers, intermediate, drafter layers); the first row of each pair is its shape in zoo/specs.py
# (tiny-code's was 320/8/896 with 3 drafter layers before these measurements).
CANDIDATES = {
    "tiny-code": [
        (256, 8, 768, 2),
        (320, 8, 896, 3),
        (320, 8, 896, 2),
        (320, 8, 896, 1),
        (256, 6, 768, 2),
        (256, 6, 768, 1),
        (384, 6, 1024, 2),
        (448, 4, 1280, 2),
    ],
    "tiny-mla": [(256, 6, 768, 2), (256, 6, 768, 1), (256, 4, 768, 1)],
    "tiny-hybrid": [(256, 6, 768, 2), (256, 6, 768, 1), (256, 3, 768, 1)],
}


def candidate_spec(
    base: PairSpec, hidden: int, layers: int, intermediate: int, draft_layers: int
) -> PairSpec:
    return dataclasses.replace(
        base, hidden_size=hidden, num_layers=layers, intermediate_size=intermediate, draft_layers=draft_layers
    )


def write_pair(spec: PairSpec, out: Path) -> dict:
    """Random-weight target (transformers) + drafter (z-lab format) of `spec`; returns their sizes."""
    torch.manual_seed(0)
    cfg = target_config(spec, eos_token_id=0)
    target = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    target.save_pretrained(str(out / "target"))
    write_byte_tokenizer(out / "target")
    drafter = DFlashDrafter(drafter_config(spec, cfg, mask_token_id=1)).to(torch.bfloat16)
    save_drafter(drafter, out / "draft")
    return {
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "draft_parameters": sum(p.numel() for p in drafter.parameters()),
        "bf16_bytes": sum(f.stat().st_size for f in out.rglob("*.safetensors")),
    }


def measure(spec: PairSpec, budgets: list[int], repeats: int, prompt_tokens: int, new_tokens: int) -> dict:
    row: dict = {
        "hidden": spec.hidden_size,
        "layers": spec.num_layers,
        "intermediate": spec.intermediate_size,
        "draft_layers": spec.draft_layers,
    }
    with tempfile.TemporaryDirectory() as tmp:
        row |= write_pair(spec, Path(tmp))
        target, drafter = load_target(Path(tmp) / "target"), load_drafter(Path(tmp) / "draft")
    prompt = random_prompt(target.config.vocab_size, prompt_tokens)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    decoders = {"ar": Decoder(target, None, "ar", None)}
    for mode, budget in [("dflash", None)] + [("ddtree", b) for b in budgets]:
        decoders[mode if budget is None else f"{mode}-{budget}"] = Decoder(target, drafter, mode, budget)
    for decoder in decoders.values():
        decoder.generate(prompt, params)  # first calls pay one-off costs

    def ms_per_step(label: str) -> float:
        result = decoders[label].generate(prompt, params)
        return 1e3 * result.decode_s / result.num_steps

    ar_ms: list[float] = []
    ms: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for _ in range(repeats):
        for label in list(decoders)[1:]:
            ar, step = ms_per_step("ar"), ms_per_step(label)
            ar_ms.append(ar)
            ms.setdefault(label, []).append(step)
            ratios.setdefault(label, []).append(step / ar)
    row["ms_per_step"] = {"ar": round(statistics.median(ar_ms), 2)}
    row["ms_per_step"] |= {label: round(statistics.median(values), 2) for label, values in ms.items()}
    row["ratio_to_ar"] = {label: round(statistics.median(values), 3) for label, values in ratios.items()}
    row["tau_for_1_5x"] = {label: round(SPEEDUP * ratio, 2) for label, ratio in row["ratio_to_ar"].items()}
    return row


def table(rows: list[dict]) -> str:
    labels = [label for label in rows[0]["ms_per_step"] if label != "ar"]
    header = (
        "| target (hidden/layers/MLP) | drafter layers | params target + drafter | bf16 MB | ar ms/step | "
    )
    header += " | ".join(f"{label} ms/step (tau for {SPEEDUP}x)" for label in labels) + " |"
    lines = [header, "|" + " --- |" * (5 + len(labels))]
    for row in rows:
        cells = [
            f"{row['hidden']}/{row['layers']}/{row['intermediate']}",
            str(row["draft_layers"]),
            f"{row['target_parameters'] / 1e6:.2f}M + {row['draft_parameters'] / 1e6:.2f}M",
            f"{row['bf16_bytes'] / 1e6:.1f}",
            f"{row['ms_per_step']['ar']:.2f}",
            *(f"{row['ms_per_step'][label]:.2f} ({row['tau_for_1_5x'][label]:.2f})" for label in labels),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny-code", choices=sorted(CANDIDATES))
    parser.add_argument("--only", help="Candidate rows to measure, by index in CANDIDATES, e.g. 1,4.")
    parser.add_argument("--budgets", default="8,16,32", help="DDTree budgets, comma-separated.")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="Also write the rows as JSON here.")
    args = parser.parse_args()
    set_cpu_threads(1)
    base = pair_spec(args.pair)
    budgets = [int(b) for b in args.budgets.split(",")]
    rows = []
    shapes = CANDIDATES[args.pair]
    if args.only:
        shapes = [shapes[int(i)] for i in args.only.split(",")]
    for shape in shapes:
        rows.append(
            measure(candidate_spec(base, *shape), budgets, args.repeats, args.prompt_tokens, args.new_tokens)
        )
        print(json.dumps(rows[-1]), flush=True)
        if args.out is not None:
            args.out.write_text(json.dumps(rows, indent=1) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
