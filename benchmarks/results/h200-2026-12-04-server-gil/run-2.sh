#!/usr/bin/env bash
set -u
R=$OUT; mkdir -p $R
echo "start $(date +%T)" > $R/log.txt
for sw in 5 0.5 0.1; do
  echo "== capacity sw=$sw" >> $R/capacity.txt
  timeout 60 python3 benchmarks/server_capacity.py --concurrency 16,64 --duration 6 --switch-interval-ms $sw --out $R/capacity-sw$sw.json >> $R/capacity.txt 2>&1
done
echo "cap done $(date +%T)" >> $R/log.txt
serve_bench() {  # tag sw budget conc
    tag=$1; sw=$2; budget=$3; conc=$4; port=31000
    python3 -c "import sys; sys.setswitchinterval($sw); sys.argv=['specdeploy','serve']+sys.argv[1:]; from specdeploy.cli import app; app()" \
      --target zoo:tiny-code --mode ddtree --budget $budget --max-running-requests 64 --device cuda --port $port --log-level warning --context-length 1024 > /tmp/srv-$tag.log 2>&1 &
    pid=$!
    for i in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
    python3 -m specdeploy.cli bench --url http://127.0.0.1:$port --dataset humaneval --concurrency $conc --duration 8 --warmup 2 --max-new-tokens 128 --out /tmp/b-$tag > /tmp/bench-$tag.log 2>&1
    echo "== $tag rc=$?" >> $R/server_ab.txt
    grep "target humaneval" /tmp/bench-$tag.log >> $R/server_ab.txt
    python3 - "$tag" >> $R/server_ab.txt <<'PY'
import json,sys
tag=sys.argv[1]
for line in open(f"/tmp/b-{tag}/server_states.jsonl"):
    d=json.loads(line); s=d['internal_states'][0]
    print(tag, d.get('cell'), s['engine_loop']['iterations'], json.dumps(s['engine_loop']['ms_per_iteration']))
PY
    kill $pid; wait $pid 2>/dev/null
}
for sw in 0.005 0.0001; do
  for b in 64 auto; do serve_bench s$sw-$b $sw $b 1,16,64; done
  echo "t $(date +%T)" >> $R/log.txt
done
timeout 100 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 1 --budgets 64 --requests 32 --out $R/trace-c1.json > $R/trace-c1.txt 2>&1
echo "end $(date +%T)" >> $R/log.txt
