#!/usr/bin/env bash
# One device call: the tiny-code campaign of `examples/campaign-cuda-zoo-auto.toml` (AR, DDTree 16/64/auto at
# c = 1, 16, 64, HumanEval, 128 new tokens), without budget 32 and with 5 s cells so that its two rounds (every
# server started twice, in turn) fit the call; every cell's /server_info kept. Run from the repository root with
# OUT set.
set -u
R=$OUT; mkdir -p $R/states
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
sed -e 's/ddtree_budgets = \[16, 32, 64, "auto"\]/ddtree_budgets = [16, 64, "auto"]/' -e 's/^duration_s = 8/duration_s = 5/' examples/campaign-cuda-zoo-auto.toml > examples/_auto.toml
grep -q '^rounds = 2' examples/_auto.toml || { echo "the campaign file no longer has rounds = 2" >> $R/log.txt; exit 1; }
sed -e 's#examples/campaign-cuda-zoo-auto.toml#examples/_auto.toml#' -e '/specdeploy project/d' benchmarks/gpu_auto_budget_campaign.sh > /tmp/c.sh
OUT=$R timeout 540 bash /tmp/c.sh tiny-code > $R/campaign.log 2>&1
log campaign
for f in runs/cuda-auto/runs/*/*/server_states.jsonl; do cp "$f" "$R/states/$(echo $f | tr / _)"; done
tar czf $R/states.tgz -C $R states && rm -rf $R/states
