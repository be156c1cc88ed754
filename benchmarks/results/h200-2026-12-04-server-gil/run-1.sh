#!/usr/bin/env bash
# Engine-only trace, then servers A/B: the delivery of 7d7a773 against one wake-up per iteration, switch intervals
set -u
R=$OUT; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
python3 -c "import sys,torch,triton;print(sys.version.split()[0],torch.__version__,triton.__version__)" >> $R/machine.txt
serve_bench() {  # tag src sw budget
    tag=$1; src=$2; sw=$3; budget=$4; port=31000
    PYTHONPATH=/tmp/site:$src python3 -c "import sys; sys.setswitchinterval($sw); sys.argv=['specdeploy','serve']+sys.argv[1:]; from specdeploy.cli import app; app()" \
      --target zoo:tiny-code --mode ddtree --budget $budget --max-running-requests 64 --device cuda --port $port --log-level warning --context-length 1024 > /tmp/srv-$tag.log 2>&1 &
    pid=$!
    for i in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
    python3 -m specdeploy.cli bench --url http://127.0.0.1:$port --dataset humaneval --concurrency 16,64 --duration 8 --warmup 2 --max-new-tokens 128 --out /tmp/b-$tag > /tmp/bench-$tag.log 2>&1
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
    tail -3 /tmp/srv-$tag.log > /dev/null
}
rm -rf /tmp/oldsrc; cp -r src /tmp/oldsrc; git show 7d7a773:src/specdeploy/server/worker.py > /tmp/oldsrc/specdeploy/server/worker.py  # the delivery before
echo "start $(date +%T)" > $R/server_ab.txt
timeout 170 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 16,64 --budgets 16,64 --requests 128 --out $R/trace.json > $R/trace.txt 2>&1
for b in 64 auto; do
  serve_bench old-5ms-$b /tmp/oldsrc 0.005 $b
  serve_bench new-5ms-$b $PWD/src 0.005 $b
  serve_bench new-0.5ms-$b $PWD/src 0.0005 $b
  serve_bench new-0.1ms-$b $PWD/src 0.0001 $b
  echo "t $(date +%T)" >> $R/server_ab.txt
done
cp /tmp/srv-new-0.1ms-auto.log $R/ 2>/dev/null
