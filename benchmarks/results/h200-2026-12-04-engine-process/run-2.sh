#!/usr/bin/env bash
# One device call: the tiny-code campaign of run-1.sh again (after 16th-step predictions), then DDTree-16 and auto
# servers in turn (b16, auto, auto, b16; the same bench as the campaign's cells, 8 s). Run from the repository
# root with OUT set.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
sed -e 's/ddtree_budgets = \[16, 32, 64, "auto"\]/ddtree_budgets = [16, 64, "auto"]/' -e 's/^duration_s = 8/duration_s = 12/' examples/campaign-cuda-zoo-auto.toml > examples/_auto.toml
sed -e 's#examples/campaign-cuda-zoo-auto.toml#examples/_auto.toml#' -e '/specdeploy project/d' benchmarks/gpu_auto_budget_campaign.sh > /tmp/c.sh
OUT=$R timeout 400 bash /tmp/c.sh tiny-code > $R/campaign.log 2>&1
log campaign
mkdir -p $R/states && for f in runs/cuda-auto/runs/*/*/server_states.jsonl; do cp "$f" "$R/states/$(echo $f | tr / _)"; done
serve_bench() {  # tag budget
    tag=$1; budget=$2; port=31000
    python3 -m specdeploy.cli serve --target zoo:tiny-code --mode ddtree --budget $budget --max-running-requests 64 --device cuda --port $port --log-level warning --context-length 2048 > /tmp/srv-$tag.log 2>&1 &
    pid=$!
    for i in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
    timeout 60 python3 -m specdeploy.cli bench --url http://127.0.0.1:$port --dataset humaneval --concurrency 1,16,64 --duration 8 --warmup 2 --max-new-tokens 128 --out /tmp/b-$tag > /tmp/bench-$tag.log 2>&1
    echo "== $tag rc=$?" >> $R/server_ab.txt
    grep "target humaneval" /tmp/bench-$tag.log >> $R/server_ab.txt
    cp /tmp/b-$tag/server_states.jsonl $R/states/ab-$tag.jsonl 2>/dev/null
    kill $pid; wait $pid 2>/dev/null
    log $tag
}
serve_bench b16-1 16; serve_bench auto-1 auto; serve_bench auto-2 auto; serve_bench b16-2 16
tar czf $R/states.tgz -C $R states && rm -rf $R/states
