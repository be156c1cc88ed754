#!/usr/bin/env bash
# One CUDA GPU, about 19 minutes: `--budget auto` against fixed budgets and AR under load, and `project`'s
# prediction of an unmeasured budget, with NVML telemetry in every cell. Run from the repository root with
# specdeploy importable (installed, or PYTHONPATH=src) and OUT set to a folder for the results:
#   OUT=out bash benchmarks/gpu_auto_budget_campaign.sh [tiny-code|qwen3-8b|all]
# tiny-code (about 7 minutes a round; the file has two, `rounds = 2`, every server started twice): HumanEval, AR
#   and DDTree 16/32/64/auto at c = 1, 16, 64; report; project budget 32 from 16 and 64.
# qwen3-8b (about 5 minutes): Qwen3-8B's shape with random weights (tau about 1): AR against auto at c = 1, 16, 64.
# Campaigns resume where they stopped: run the script again after an interruption.
set -euo pipefail
: "${OUT:?set OUT to a folder for the results}"
part="${1:-all}"
specdeploy() { python3 -m specdeploy.cli "$@"; }
campaign() {  # a campaign directory already started is resumed
    if [ -f "$2/state.json" ]; then specdeploy campaign "$1" --out "$2" --resume; else specdeploy campaign "$1" --out "$2"; fi
}
if [ "$part" = tiny-code ] || [ "$part" = all ]; then
    campaign examples/campaign-cuda-zoo-auto.toml runs/cuda-auto
    specdeploy report runs/cuda-auto --json > "$OUT/report-tiny-code-auto.json"
    specdeploy project runs/cuda-auto --budgets 32 --fit-budgets 16,64 --json > "$OUT/project-b32-from-b16-b64.json"
fi
if [ "$part" = qwen3-8b ] || [ "$part" = all ]; then
    [ -d runs/random-qwen3-8b ] || specdeploy random-weights runs/random-qwen3-8b --shape qwen3-8b --device cuda
    campaign examples/campaign-cuda-qwen3-8b-random-auto.toml runs/cuda-qwen3-8b-auto
    specdeploy report runs/cuda-qwen3-8b-auto --json > "$OUT/report-qwen3-8b-random-auto.json"
fi
