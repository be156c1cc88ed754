#!/usr/bin/env bash
# One device call: the tiny-code campaign (AR, DDTree 16 / 64 / auto at c = 1, 16, 64) at the final commit, with
# 12 s cells (8 s cells moved the same server by 5-10% between runs). Run from the repository root with OUT set.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
sed -e 's/ddtree_budgets = \[16, 32, 64, "auto"\]/ddtree_budgets = [16, 64, "auto"]/' -e 's/^duration_s = 8/duration_s = 12/' examples/campaign-cuda-zoo-auto.toml > examples/_auto.toml
sed -e 's#examples/campaign-cuda-zoo-auto.toml#examples/_auto.toml#' -e '/specdeploy project/d' benchmarks/gpu_auto_budget_campaign.sh > /tmp/c.sh
OUT=$R timeout 450 bash /tmp/c.sh tiny-code > $R/campaign.log 2>&1
log campaign
mkdir -p $R/states && for f in runs/cuda-auto/runs/*/*/server_states.jsonl; do cp "$f" "$R/states/$(echo $f | tr / _)"; done
tar czf $R/states.tgz -C $R states && rm -rf $R/states
