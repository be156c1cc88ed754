#!/usr/bin/env bash
# One device call, the engine in its own process (the server's default since 770c973): the tiny-code campaign (AR,
# DDTree 16 / 64 / auto at c = 1, 16, 64, 12 s cells, as ../h200-2026-12-04-auto-additive/run-3.sh), then
# the engine in a thread against a process of its own, servers in turn. Run from the repository root with OUT set.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" >> $R/machine.txt
sed -e 's/ddtree_budgets = \[16, 32, 64, "auto"\]/ddtree_budgets = [16, 64, "auto"]/' -e 's/^duration_s = 8/duration_s = 12/' examples/campaign-cuda-zoo-auto.toml > examples/_auto.toml
sed -e 's#examples/campaign-cuda-zoo-auto.toml#examples/_auto.toml#' -e '/specdeploy project/d' benchmarks/gpu_auto_budget_campaign.sh > /tmp/c.sh
OUT=$R timeout 420 bash /tmp/c.sh tiny-code > $R/campaign.log 2>&1
log campaign
mkdir -p $R/states && for f in runs/cuda-auto/runs/*/*/server_states.jsonl; do cp "$f" "$R/states/$(echo $f | tr / _)"; done
tar czf $R/states.tgz -C $R states && rm -rf $R/states
timeout 140 python3 benchmarks/engine_process_ab.py --device cuda --budget 64 --concurrency 1,16,64 --max-running-requests 64 --max-new-tokens 128 --rounds 1 --duration 8 --out $R/engine_process_ab.json > $R/engine_process_ab.log 2>&1
log ab
