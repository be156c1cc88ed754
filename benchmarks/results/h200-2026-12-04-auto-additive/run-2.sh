#!/usr/bin/env bash
# One device call: the Qwen3-8B-shape campaign (random weights: AR against auto), then DDTree-64 and auto servers
# in turn, twice, on tiny-code (the same bench as the campaign's cells). Run from the repository root with OUT set.
set -u
R=$OUT; mkdir -p $R
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
OUT=$R timeout 280 bash benchmarks/gpu_auto_budget_campaign.sh qwen3-8b > $R/campaign-qwen3-8b.log 2>&1
log campaign
serve_bench() {  # tag budget
    tag=$1; budget=$2; port=31000
    python3 -m specdeploy.cli serve --target zoo:tiny-code --mode ddtree --budget $budget --max-running-requests 64 --device cuda --port $port --log-level warning --context-length 2048 > /tmp/srv-$tag.log 2>&1 &
    pid=$!
    for i in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
    timeout 60 python3 -m specdeploy.cli bench --url http://127.0.0.1:$port --dataset humaneval --concurrency 1,16,64 --duration 8 --warmup 2 --max-new-tokens 128 --out /tmp/b-$tag > /tmp/bench-$tag.log 2>&1
    echo "== $tag rc=$?" >> $R/server_ab.txt
    grep "target humaneval" /tmp/bench-$tag.log >> $R/server_ab.txt
    kill $pid; wait $pid 2>/dev/null
    log $tag
}
serve_bench b64-1 64; serve_bench auto-1 auto; serve_bench b64-2 64; serve_bench auto-2 auto
