#!/usr/bin/env bash
# Issue 21's campaigns at the head, one device call per part, each resumable (run the same line again, on the
# same warm machine, to finish a part its time limit cut): PART=tiny-code is `examples/campaign-cuda-zoo-auto.toml`
# without budget 32 and with 5 s cells (AR, DDTree 16 / 64 / auto at c = 1, 16, 64, two rounds); PART=qwen3-8b is
# `examples/campaign-cuda-qwen3-8b-random-auto.toml` with 12 s cells (AR against auto). Every cell's /server_info
# is kept (states-PART.tgz). Run from the repository root with specdeploy importable and OUT set:
#   OUT=out PART=tiny-code LIMIT=540 bash benchmarks/results/gpu-2026-12-05-auto-head/run.sh
set -u
: "${OUT:?set OUT}" "${PART:?set PART to tiny-code or qwen3-8b}"
R=$OUT; mkdir -p "$R/states"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/machine.txt"
python3 -c "import torch, triton, sys; print('torch', torch.__version__, 'triton', triton.__version__, 'python', sys.version.split()[0])" >> "$R/machine.txt"
if [ "$PART" = tiny-code ]; then
    sed -e 's/ddtree_budgets = \[16, 32, 64, "auto"\]/ddtree_budgets = [16, 64, "auto"]/' -e 's/^duration_s = 8/duration_s = 5/' \
        examples/campaign-cuda-zoo-auto.toml > examples/_auto.toml
    grep -q '^ddtree_budgets = \[16, 64, "auto"\]' examples/_auto.toml || { echo "campaign file changed" >&2; exit 1; }
    sed -e 's#examples/campaign-cuda-zoo-auto.toml#examples/_auto.toml#' -e '/specdeploy project/d' \
        benchmarks/gpu_auto_budget_campaign.sh > /tmp/campaign.sh
    runs=runs/cuda-auto
else
    sed -e 's/^duration_s = 8/duration_s = 12/' examples/campaign-cuda-qwen3-8b-random-auto.toml > examples/_qwen.toml
    sed -e 's#examples/campaign-cuda-qwen3-8b-random-auto.toml#examples/_qwen.toml#' \
        benchmarks/gpu_auto_budget_campaign.sh > /tmp/campaign.sh
    runs=runs/cuda-qwen3-8b-auto
fi
echo "start $(date +%T)" >> "$R/log-$PART.txt"
OUT=$R timeout "${LIMIT:-540}" bash /tmp/campaign.sh "$PART" >> "$R/campaign-$PART.log" 2>&1
rc=$?
echo "end $(date +%T) rc $rc" >> "$R/log-$PART.txt"
for f in "$runs"/runs/*/*/server_states.jsonl; do [ -f "$f" ] && cp "$f" "$R/states/$(echo "$f" | tr / _)"; done
tar czf "$R/states-$PART.tgz" -C "$R" states && rm -rf "$R/states"
