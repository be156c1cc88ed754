#!/usr/bin/env bash
# One device call: GPU tests of the changed paths, the tiny-code campaign (AR, DDTree 16 / 64 / auto), then the
# engines alone. Run from the repository root with specdeploy importable and OUT set.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)" >> $R/machine.txt
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_gpu.py -k "reads_back or budgets_changing" > $R/gpu_tests.log 2>&1
log tests
sed 's/ddtree_budgets = \[16, 32, 64, "auto"\]/ddtree_budgets = [16, 64, "auto"]/' examples/campaign-cuda-zoo-auto.toml > examples/_auto.toml
sed -e 's#examples/campaign-cuda-zoo-auto.toml#examples/_auto.toml#' -e '/specdeploy project/d' benchmarks/gpu_auto_budget_campaign.sh > /tmp/c.sh
OUT=$R timeout 330 bash /tmp/c.sh tiny-code > $R/campaign.log 2>&1
log campaign
mkdir -p $R/states && for f in runs/cuda-auto/runs/*/*/server_states.jsonl; do cp "$f" "$R/states/$(echo $f | tr / _)"; done
tar czf $R/states.tgz -C $R states && rm -rf $R/states
timeout 150 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 1,16,64 --budgets 64 --requests 96 --out $R/trace.json > $R/trace.txt 2>&1
log trace
