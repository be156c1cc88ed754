#!/usr/bin/env bash
# One device call: the Qwen3-8B-shape campaign alone (12 s cells need about 330 s); its cells'
# /server_info engine_loop (mean running requests, busy share) are kept. The tiny-code campaign is run-2.sh's,
# in a call of its own. Run from the repository root with OUT set.
set -u
R=$OUT; mkdir -p $R/states
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
sed -e 's/^duration_s = 8/duration_s = 12/' examples/campaign-cuda-qwen3-8b-random-auto.toml > examples/_qwen.toml
sed -e 's#examples/campaign-cuda-qwen3-8b-random-auto.toml#examples/_qwen.toml#' benchmarks/gpu_auto_budget_campaign.sh > /tmp/q.sh
OUT=$R timeout 420 bash /tmp/q.sh qwen3-8b > $R/campaign-qwen3-8b.log 2>&1
log qwen
for f in runs/cuda-qwen3-8b-auto/runs/*/*/server_states.jsonl; do cp "$f" "$R/states/$(echo $f | tr / _)"; done
tar czf $R/states.tgz -C $R states && rm -rf $R/states
