#!/usr/bin/env bash
set -u
R=$OUT; mkdir -p $R
serve_bench() {  # tag budget
    tag=$1; budget=$2; port=31000
    python3 -m specdeploy.cli serve --target zoo:tiny-code --mode ddtree --budget $budget --max-running-requests 64 --device cuda --port $port --log-level warning --context-length 2048 > /tmp/srv-$tag.log 2>&1 &
    pid=$!
    for i in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
    python3 -m specdeploy.cli bench --url http://127.0.0.1:$port --dataset humaneval --concurrency 1,16,64 --duration 8 --warmup 2 --max-new-tokens 128 --out $R/b-$tag > /tmp/bench-$tag.log 2>&1
    echo "== $tag rc=$?" >> $R/server_ab.txt
    grep "target humaneval" /tmp/bench-$tag.log >> $R/server_ab.txt
    kill $pid; wait $pid 2>/dev/null
}
serve_bench b64 64
serve_bench auto auto
