#!/usr/bin/env bash
# The server's engine thread and its HTTP event loop share one interpreter lock: does the interval at which
# Python hands that lock between threads (sys.setswitchinterval, 5 ms by default) limit a server on a GPU?
# One DDTree server per interval, each measured by the same bench cells, one after the other:
#   OUT=out bash benchmarks/server_switch_interval_ab.sh [BUDGET] [DEVICE] [INTERVALS...]
# (default: budget 16, cuda, intervals 0.005 and 0.0002). Prints each run's summary and the engine loop's
# ms per iteration (server_states.jsonl); the runs land in $OUT/switch-<interval>.
set -euo pipefail
: "${OUT:?set OUT to a folder for the results}"
budget="${1:-16}"
device="${2:-cuda}"
shift $(( $# < 2 ? $# : 2 ))
intervals=("$@")
[ $# -gt 0 ] || intervals=(0.005 0.0002)
port=30170
for interval in "${intervals[@]}"; do
    python3 -c "import sys; sys.setswitchinterval($interval); sys.argv = sys.argv[:1] + sys.argv[2:]
from specdeploy.cli import main; main()" -- serve --target zoo:tiny-code --draft zoo:tiny-code-draft \
        --mode ddtree --budget "$budget" --device "$device" --context-length 2048 --max-running-requests 64 \
        --port "$port" --log-level warning > "$OUT/server-$interval.log" 2>&1 &
    server=$!
    for _ in $(seq 300); do curl -sf "localhost:$port/health" > /dev/null && break; sleep 1; done
    python3 -m specdeploy.cli bench --url "http://127.0.0.1:$port" --dataset humaneval --concurrency 1,16,64 \
        --duration 8 --max-new-tokens 128 --out "$OUT/switch-$interval" | grep -E "c=|tok/s" || true
    python3 - "$OUT/switch-$interval/server_states.jsonl" "$interval" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    state = json.loads(line)
    loop = state["internal_states"][0]["engine_loop"]
    print(f"switch interval {sys.argv[2]} s, {state['cell']}: {loop['iterations']} iterations,",
          "ms per iteration", loop["ms_per_iteration"])
EOF
    kill "$server"
    wait "$server" || true
    port=$((port + 1))
done
