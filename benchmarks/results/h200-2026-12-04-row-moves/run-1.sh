#!/usr/bin/env bash
# One device call: the GPU tests of the batch engine (admission and row moves now captured stages); the engine
# alone before and after them (tiny-code, AR / DDTree-16 / auto at 16 and 64 requests; "before" is src with
# `.whl/move.patch`, made by `git diff 9a6c5f4 HEAD -- src/specdeploy/engine` at the commit run, reversed);
# then how far servers of one configuration spread: DDTree-16 servers at 64 streams, started three times as they
# are and three times with the engine process, the server process and the client each on cores of their own
# (taskset), in turn. Run from the repository root with OUT set.
set -u
R=$OUT; ROOT=$PWD; mkdir -p $R/states
log() { echo "$1 $(date +%T)" >> $R/log.txt; }
log start
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/machine.txt
lscpu > $R/lscpu.txt; lscpu -p=CPU,CORE,SOCKET,NODE > $R/cpus.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_batch_gpu.py > $R/tests.log 2>&1
log tests
mkdir -p /tmp/old && cp -r src /tmp/old/ && (cd /tmp/old && patch -s -R -p1 < $ROOT/.whl/move.patch) && log patched
for v in old new; do
    src=$ROOT/src; [ $v = old ] && src=/tmp/old/src
    PYTHONPATH=/tmp/site:$src timeout 110 python3 benchmarks/auto_step_trace.py --device cuda --concurrency 16,64 \
        --budgets 16 --requests 256 --rounds 2 --out $R/engine-$v.json > $R/engine-$v.log 2>&1
    log engine-$v
done
# distinct physical cores, core 0 left to the system: engine | server | client
read E S C < <(python3 - <<'PY'
import os
cores = {}
for line in open(os.environ["OUT"] + "/cpus.txt"):
    if line.startswith("#"):
        continue
    cpu, core = line.split(",")[:2]
    cores.setdefault(int(core), int(cpu))
first = [cores[c] for c in sorted(cores)][1:6]
print(first[0], f"{first[1]},{first[2]}", f"{first[3]},{first[4]}")
PY
)
echo "engine $E server $S client $C" >> $R/log.txt
serve_bench() {  # tag pinned
    tag=$1; port=31000; client=""
    python3 -m specdeploy.cli serve --target zoo:tiny-code --mode ddtree --budget 16 --max-running-requests 64 --device cuda --port $port --log-level warning --context-length 2048 > $R/states/srv-$tag.log 2>&1 &
    pid=$!
    for i in $(seq 180); do curl -sf localhost:$port/health >/dev/null && break; sleep 0.5; done
    if [ $2 = yes ]; then
        engine=$(ps --ppid $pid -o pid=,args= | grep spawn_main | awk '{print $1}' | head -1)
        taskset -a -p -c $S $pid > /dev/null; taskset -a -p -c $E $engine > /dev/null; client="taskset -c $C"
    fi
    timeout 50 $client python3 -m specdeploy.cli bench --url http://127.0.0.1:$port --dataset humaneval --concurrency 64 --duration 6 --warmup 2 --repeats 2 --max-new-tokens 128 --out /tmp/b-$tag --json > $R/states/bench-$tag.json 2>$R/states/bench-$tag.err
    cp /tmp/b-$tag/server_states.jsonl $R/states/states-$tag.jsonl 2>/dev/null
    kill $pid; wait $pid 2>/dev/null
    log $tag
}
for i in 1 2 3; do serve_bench free-$i no; serve_bench pinned-$i yes; done
tar czf $R/states.tgz -C $R states && rm -rf $R/states
log end
