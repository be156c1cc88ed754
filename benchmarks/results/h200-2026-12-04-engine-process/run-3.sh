#!/usr/bin/env bash
# One device call: the Qwen3-8B-shape campaign (random weights, AR against auto, 12 s cells), then where the time
# goes at 64 streams: py-spy profiles of a DDTree-16 and an auto tiny-code server (the server process and its
# engine process) and of the benchmark client, one server at a time. Run from the repository root with OUT set
# and py-spy on PATH.
set -u
R=$OUT; mkdir -p $R/prof
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
sed -e 's/^duration_s = 8/duration_s = 12/' examples/campaign-cuda-qwen3-8b-random-auto.toml > examples/_qwen.toml
sed -e 's#examples/campaign-cuda-qwen3-8b-random-auto.toml#examples/_qwen.toml#' benchmarks/gpu_auto_budget_campaign.sh > /tmp/c.sh
OUT=$R timeout 300 bash /tmp/c.sh qwen3-8b > $R/campaign-qwen3-8b.log 2>&1
log campaign
profile() {  # tag budget
    tag=$1; budget=$2; port=31000
    py-spy record --nonblocking --subprocesses --threads --rate 250 --format raw -o $R/prof/server-$tag.txt -- python3 -m specdeploy.cli serve --target zoo:tiny-code --mode ddtree --budget $budget --max-running-requests 64 --device cuda --port $port --log-level warning --context-length 2048 > $R/prof/srv-$tag.log 2>&1 &
    spy=$!
    for i in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
    timeout 45 py-spy record --nonblocking --rate 250 --format raw -o $R/prof/client-$tag.txt -- python3 -m specdeploy.cli bench --url http://127.0.0.1:$port --dataset humaneval --concurrency 64 --duration 8 --warmup 2 --max-new-tokens 128 --out /tmp/b-$tag > $R/prof/bench-$tag.log 2>&1
    cp /tmp/b-$tag/server_states.jsonl $R/prof/states-$tag.jsonl 2>/dev/null
    pkill -INT -f "specdeploy.cli serve"; sleep 3; pkill -KILL -f "specdeploy.cli serve"
    timeout 20 tail --pid=$spy -f /dev/null
    log $tag
}
profile b16 16; profile auto auto
tar czf $R/prof.tgz -C $R prof && rm -rf $R/prof
